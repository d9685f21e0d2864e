//! The worker side: the hidden entry point the labs start, and the hands-on `lockslab worker`.
//!
//! A lab's workers are this binary, re-executed as `lockslab __worker`. The first line on
//! their stdin is their script, as JSON (never an argument: it holds the servers' URLs with
//! their passwords, and anyone can read a command line). They report what they do as
//! events on stdout and take commands (`finish`) on the following lines of stdin, so that
//! the orchestrator decides when the story moves on, while every lock operation and every
//! write is the worker's own, made over its own connections.

use std::io::{self, BufRead};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;
use serde::{Deserialize, Serialize};

use crate::connect::{self, Backend};
use crate::events::Emitter;
use crate::labs::{self, etcd_vs_redis, gc_pause, naive, skip_locked};
use crate::lock::redis::RedisLock;
use crate::output::{Style, human};
use crate::servers::{self, ServerArgs};
use crate::store::{Outcome, Store};

/// Every worker script a lab can start, tagged by lab.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "lab", rename_all = "kebab-case")]
pub enum WorkerSpec {
    GcPause(gc_pause::Role),
    Naive(naive::Role),
    SkipLocked(skip_locked::Role),
    EtcdVsRedis(etcd_vs_redis::Role),
}

/// `lockslab __worker`: reads one worker script from stdin's first line, runs it, and
/// reports failure as an event.
pub fn run_internal() -> ExitCode {
    let mut line = String::new();
    // Stdin's buffer is shared: what follows the script stays there for `await_command`.
    let spec = match io::stdin().lock().read_line(&mut line) {
        Ok(0) => Err("stdin closed before the script arrived".to_string()),
        Ok(_) => serde_json::from_str::<WorkerSpec>(&line).map_err(|err| err.to_string()),
        Err(err) => Err(err.to_string()),
    };
    let spec = match spec {
        Ok(spec) => spec,
        Err(err) => {
            crate::errln!("lockslab worker: bad script on stdin: {err}");
            return ExitCode::from(2);
        }
    };
    let (name, result) = match spec {
        WorkerSpec::GcPause(role) => (role.name.clone(), gc_pause::work(&role)),
        WorkerSpec::Naive(role) => (role.name.clone(), naive::work(&role)),
        WorkerSpec::SkipLocked(role) => (role.name.clone(), skip_locked::work(&role)),
        WorkerSpec::EtcdVsRedis(role) => (role.name.clone(), etcd_vs_redis::work(&role)),
    };
    match result.map_err(connect::explain) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            Emitter::new(&name).say("error", format!("{err:#}"));
            ExitCode::from(1)
        }
    }
}

/// Blocks until the orchestrator sends `expected` on stdin. End of input means the
/// orchestrator is gone, and so should this worker be.
pub fn await_command(expected: &str) -> Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if io::stdin().lock().read_line(&mut line)? == 0 {
            bail!("the lab went away while this worker waited for `{expected}`");
        }
        if line.trim() == expected {
            return Ok(());
        }
    }
}

/// Options of the hands-on worker.
#[derive(clap::Args, Debug)]
pub struct HandsOnArgs {
    /// Name of the lock (and of the store's resource); pick your own in a shared workshop
    #[arg(long, default_value = "demo")]
    pub lock: String,
    /// How long the lock lives in Redis unless released (100ms to 1h)
    #[arg(long, default_value = "10s",
          value_parser = labs::duration_in(Duration::from_millis(100), labs::LONGEST_HANDS_ON),
          value_name = "DURATION")]
    pub ttl: Duration,
    /// How long the worker "works" while holding the lock, before it writes (keep it below the
    /// TTL); at most 1h
    #[arg(long, default_value = "8s",
          value_parser = labs::duration_in(Duration::ZERO, labs::LONGEST_HANDS_ON),
          value_name = "DURATION")]
    pub work: Duration,
    /// How long to keep trying when someone else holds the lock (at most 1h)
    #[arg(long, default_value = "30s",
          value_parser = labs::duration_in(Duration::ZERO, labs::LONGEST_HANDS_ON),
          value_name = "DURATION")]
    pub wait: Duration,
    /// Draw a fencing token with the lock and send it with the write
    #[arg(long)]
    pub fencing: bool,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// `lockslab worker`: one worker, by hand, narrated for a human.
pub fn hands_on(args: &HandsOnArgs) -> Result<()> {
    let style = Style::detect(false);
    let servers = servers::provide_shared(&args.servers, &[Backend::Redis, Backend::Postgres])?;
    let pid = std::process::id();
    let me = format!("worker {pid}");
    let key = format!("lockslab:hands-on:{}:lock", args.lock);
    let counter = format!("lockslab:hands-on:{}:fence", args.lock);
    let mut store = Store::connect(servers.url(Backend::Postgres))?;
    store.prepare()?;
    let mut lock = RedisLock::new(connect::redis(servers.url(Backend::Redis))?, &key, args.ttl);

    crate::outln!(
        "{me}: taking lock '{}' (TTL {})…",
        args.lock,
        human(args.ttl)
    );
    let fence = args.fencing.then_some(counter.as_str());
    let held = lock.acquire_within(args.wait, fence)?;
    let acquired_at = Instant::now();
    let Some(held) = held else {
        bail!(
            "lock '{}' stayed taken for {}; is a frozen worker holding it? (try again after its TTL)",
            args.lock,
            human(args.wait)
        );
    };
    let token = held
        .token
        .map(|t| format!(", fencing token {t}"))
        .unwrap_or_default();
    crate::outln!(
        "{}",
        format!(
            "{me}: holds lock '{}'{token}; it expires in {} unless released",
            args.lock,
            human(args.ttl)
        )
        .bold()
    );
    crate::outln!();
    crate::outln!("  To play the GC pause, in another terminal:");
    crate::outln!(
        "    {}    freeze me now",
        format!("kill -STOP {pid}").cyan().bold()
    );
    // The second worker must share this one's lock and fencing, or the demo shows nothing.
    let mut second = String::from("lockslab worker --work 2s");
    if args.fencing {
        second.push_str(" --fencing");
    }
    if args.lock != "demo" {
        second.push_str(&format!(" --lock {}", args.lock));
    }
    crate::outln!(
        "    wait more than {}, then run {} until it has written",
        human(args.ttl),
        second.cyan().bold()
    );
    crate::outln!(
        "    {}    wake me up: I finish my work and write, late",
        format!("kill -CONT {pid}").cyan().bold()
    );
    crate::outln!();

    if args.work >= args.ttl {
        crate::outln!(
            "  note: --work {} is not shorter than --ttl {}: the lock expires while I work, pause or not",
            human(args.work),
            human(args.ttl)
        );
    }
    let paused = work_watching_the_clock(acquired_at, args.work, style);
    if paused > Duration::from_millis(500) {
        crate::outln!(
            "{me}: {} — my clock jumped by {} while I worked. My lock may be gone, but I write anyway, as most code would.",
            "I was paused".yellow().bold(),
            human(paused)
        );
    }
    let value = format!("written by {me}");
    let outcome = store.write("hands-on", &args.lock, &me, &value, held.token);
    let verdict = match outcome {
        Outcome::Accepted => "ACCEPTED".green().bold(),
        Outcome::Rejected => "REJECTED (a newer token was already accepted)".red().bold(),
        Outcome::Unknown => "UNKNOWN (no answer from the store)".yellow().bold(),
    };
    crate::outln!("{me}: wrote '{value}'{token}: the store says {verdict}");
    let now = store.read_back("hands-on", &args.lock)?;
    crate::outln!(
        "{me}: the store now holds '{}' (highest token accepted: {})",
        now.final_value.unwrap_or_default(),
        now.final_token
            .map(|t| t.to_string())
            .unwrap_or_else(|| "none".into())
    );
    if lock.release(&held)? {
        crate::outln!("{me}: released the lock");
    } else {
        crate::outln!(
            "{me}: my lock had already expired; compare-and-delete left the current holder's key alone"
        );
    }
    Ok(())
}

/// Works until `work` has passed since `started` (the moment the lock was taken), in small steps, and returns the longest
/// gap between two steps: a frozen process cannot see the freeze, but afterwards it can see
/// that its clock jumped.
fn work_watching_the_clock(started: Instant, work: Duration, style: Style) -> Duration {
    let bar = style.progress(work.as_millis() as u64, "  working [{bar:30}] {msg}");
    let step = Duration::from_millis(100);
    let mut last = started;
    let mut longest_gap = Duration::ZERO;
    while started.elapsed() < work {
        thread::sleep(step.min(work.saturating_sub(started.elapsed())));
        longest_gap = longest_gap.max(last.elapsed().saturating_sub(step));
        last = Instant::now();
        bar.set_position(started.elapsed().as_millis() as u64);
        bar.set_message(format!("{} of {}", human(started.elapsed()), human(work)));
    }
    bar.finish_and_clear();
    longest_gap
}
