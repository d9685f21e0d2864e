//! Lab 1 — a frozen lock holder's stale write, with and without fencing.
//!
//! The story, played by two worker processes and a real Redis lock:
//!
//! ```text
//!  A  takes the lock (TTL 2s)  ──❄ frozen 3s (SIGSTOP) ──────────────▶ resumes, writes ✗
//!  B         tries… tries…   lock expires ──▶ takes the lock, writes ✓
//! ```
//!
//! A's lock is correct (`SET NX PX`, compare-and-delete) and still does not help: A passed
//! its check before it froze, and nothing can reach into a frozen process to stop it. Once
//! A resumes it writes, believing it still holds the lock. Without fencing the store takes
//! that write and B's result is lost. With fencing every acquisition draws a higher token,
//! the store remembers the highest it accepted, and A's lower token is refused.
//!
//! The orchestrator only plays the clock (freeze, resume, "your work is done"); every lock
//! operation and write is made by the workers over their own connections, and the verdict
//! is read back from the store.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{LONGEST_LAB_WAIT, OutputArgs, Stage, duration_in, new_run_id};
use crate::connect::{self, Backend};
use crate::events::{Emitter, Event};
use crate::lock::redis::RedisLock;
use crate::output::{Style, human, json_line, table};
use crate::servers::{self, ServerArgs};
use crate::store::{Outcome, ReadBack, Store};
use crate::worker::{WorkerSpec, await_command};

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab gc-pause                      both runs, A freezes itself for 1.5 × TTL
  lockslab gc-pause --freeze peer        the lab stops A with kill(pid, SIGSTOP) instead
  lockslab gc-pause --fencing on         only the fenced run
  lockslab gc-pause --ttl 1s --pause 500ms   a pause shorter than the TTL: nothing goes wrong
  lockslab gc-pause --json | jq .        events and verdict as JSON Lines

By hand, in two terminals: `lockslab up`, then `lockslab worker` (see labs/01-gc-pause.md).", crate::lab_exit_status_help!()))]
pub struct GcPauseArgs {
    /// How long the lock lives in Redis (100ms to 10m)
    #[arg(long, default_value = "2s", value_parser = parse_ttl, value_name = "DURATION")]
    pub ttl: Duration,
    /// How long A stays frozen, 100ms to 10m [default: 1.5 × TTL]
    #[arg(long, value_parser = duration_in(Duration::from_millis(100), LONGEST_LAB_WAIT),
          value_name = "DURATION")]
    pub pause: Option<Duration>,
    /// Which runs to play: without fencing, with it, or both side by side
    #[arg(long, value_enum, default_value_t = Fencing::Both)]
    pub fencing: Fencing,
    /// Who freezes A: A itself (raise SIGSTOP), or the lab (kill(pid, SIGSTOP))
    #[arg(long, value_enum, default_value_t = Freeze::Self_)]
    pub freeze: Freeze,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// Below 100ms, process start-up and Redis's expiry cycle blur the story.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = duration_in(Duration::ZERO, LONGEST_LAB_WAIT)(text)?;
    if ttl < Duration::from_millis(100) {
        return Err("use at least 100ms: shorter, and process start-up blurs the story".into());
    }
    Ok(ttl)
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    Off,
    On,
    Both,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Freeze {
    /// A raises SIGSTOP on itself in the middle of its work
    #[value(name = "self")]
    #[serde(rename = "self")]
    Self_,
    /// The lab sends SIGSTOP to A, as a hypervisor or a starved cgroup would
    Peer,
}

/// One worker's script.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Role {
    pub name: String,
    pub redis_url: String,
    pub postgres_url: String,
    pub run_id: String,
    pub lock_key: String,
    /// The fencing counter; None in the unfenced run.
    pub fence_counter: Option<String>,
    pub resource: String,
    pub ttl_ms: u64,
    /// How long to keep trying for the lock.
    pub wait_ms: u64,
    /// What happens between taking the lock and writing.
    pub before_write: BeforeWrite,
    /// Keep the lock after writing until told `finish` (B, so that A wakes into a taken lock).
    pub hold_after_write: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BeforeWrite {
    /// Write at once.
    Nothing,
    /// Stop this very process with SIGSTOP: the pause hits in the middle of the work.
    FreezeSelf,
    /// Work until the lab says `finish` (the lab freezes us in the meantime).
    WorkUntilTold,
}

/// The worker script: take the lock, (be paused), write, release.
pub fn work(role: &Role) -> Result<()> {
    let me = Emitter::new(&role.name);
    let mut store = Store::connect(&role.postgres_url)?;
    let ttl = Duration::from_millis(role.ttl_ms);
    let mut lock = RedisLock::new(connect::redis(&role.redis_url)?, &role.lock_key, ttl);

    me.send(
        me.event("waiting", "tries to take the lock")
            .with("pid", std::process::id()),
    );
    let Some(held) = lock.acquire_within(
        Duration::from_millis(role.wait_ms),
        role.fence_counter.as_deref(),
    )?
    else {
        me.say(
            "gave_up",
            format!("gave up: the lock stayed taken for {}ms", role.wait_ms),
        );
        return Ok(());
    };
    let token_text = held
        .token
        .map(|t| format!(", fencing token {t}"))
        .unwrap_or_default();
    me.send(
        me.event(
            "acquired",
            format!("took the lock (SET NX PX {}){token_text}", role.ttl_ms),
        )
        .with("token", held.token)
        .with("owner", held.owner.clone()),
    );

    match role.before_write {
        BeforeWrite::Nothing => {}
        BeforeWrite::FreezeSelf => {
            me.say(
                "freezing",
                "starts its work… and stops dead (raise SIGSTOP), like a stop-the-world GC pause",
            );
            let frozen_at = Instant::now();
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP)
                .context("raising SIGSTOP")?;
            let gap = frozen_at.elapsed();
            me.send(
                me.event(
                    "resumed",
                    format!(
                        "wakes after {}; it still believes it holds the lock",
                        human(gap)
                    ),
                )
                .with("paused_ms", gap.as_millis() as u64),
            );
        }
        BeforeWrite::WorkUntilTold => {
            me.say("working", "works while holding the lock");
            await_command("finish")?;
            me.say(
                "finished",
                "finishes its work; writes, believing it still holds the lock",
            );
        }
    }

    let value = format!("{}'s result", role.name);
    let outcome = store.write(&role.run_id, &role.resource, &role.name, &value, held.token);
    let kind = match outcome {
        Outcome::Accepted => "accepted",
        Outcome::Rejected => "rejected",
        Outcome::Unknown => "unknown",
    };
    me.send(
        me.event(
            "wrote",
            format!("writes '{value}'{token_text}: the store says {kind}"),
        )
        .with("outcome", outcome.as_str())
        .with("token", held.token)
        .with("value", value),
    );

    if role.hold_after_write {
        await_command("finish")?;
    }
    let released = lock.release(&held)?;
    let text = if released {
        "releases the lock (compare-and-delete deleted its key)"
    } else {
        "tries to release: the key is no longer its own, so compare-and-delete deletes nothing"
    };
    me.send(me.event("released", text).with("deleted", released));
    Ok(())
}

/// What one run found, read back from the store.
#[derive(Serialize, Debug, Clone)]
pub struct RunVerdict {
    pub fencing: bool,
    /// B took the lock while A was frozen: two workers believed they held it.
    pub two_holders: bool,
    /// A wrote after B had written (the write that can destroy B's result).
    pub stale_write_attempted: bool,
    /// Whether the store took that stale write; null when its outcome is unknown.
    pub stale_write_accepted: Option<bool>,
    /// A's compare-and-delete found its key gone: Redis had ended A's lease before A let go.
    pub a_lease_ran_out: bool,
    pub final_value: Option<String>,
    pub final_writer: Option<String>,
    pub final_token: Option<i64>,
    pub stale_token: Option<i64>,
    pub newer_token: Option<i64>,
    pub attempts: Vec<crate::store::Attempt>,
}

impl RunVerdict {
    /// Judges the run from what the store recorded, in the order the database saw it.
    fn from_store(
        fencing: bool,
        two_holders: bool,
        a_lease_ran_out: bool,
        a_outcome: Option<Outcome>,
        read: ReadBack,
    ) -> RunVerdict {
        let b_index = read
            .attempts
            .iter()
            .position(|a| a.writer == "B" && a.accepted);
        let a_index = read.attempts.iter().position(|a| a.writer == "A");
        let stale_write_attempted = match (a_index, b_index) {
            (Some(a), Some(b)) => a > b,
            // A's write is not in the store: it may have been lost on the way, so if A never
            // heard back, nobody knows; the store does not show a stale write either way.
            _ => false,
        };
        let stale_write_accepted = match a_index {
            Some(a) if stale_write_attempted => Some(read.attempts[a].accepted),
            None if a_outcome == Some(Outcome::Unknown) => None,
            _ => Some(false),
        };
        RunVerdict {
            fencing,
            two_holders,
            a_lease_ran_out,
            stale_write_attempted,
            stale_write_accepted,
            stale_token: a_index.and_then(|a| read.attempts[a].token),
            newer_token: b_index.and_then(|b| read.attempts[b].token),
            final_value: read.final_value,
            final_writer: read.final_writer,
            final_token: read.final_token,
            attempts: read.attempts,
        }
    }

    /// One sentence on what the run shows.
    fn meaning(&self, ttl: Duration, pause: Duration) -> String {
        if !self.two_holders && self.a_lease_ran_out {
            return format!(
                "A's {} lease ran out during its {} pause (its release found the key gone), but B had not \
                 taken the lock yet: no stale write this time — by luck, not by design.",
                human(ttl),
                human(pause)
            );
        }
        if !self.two_holders {
            return format!(
                "The pause ({}) did not outlast the TTL ({}): A still held the lock when it woke, \
                 B waited for A's release, and no stale write happened.",
                human(pause),
                human(ttl)
            );
        }
        match (self.fencing, self.stale_write_accepted) {
            (false, Some(true)) => "the store took A's late write: B's result is lost, \
                                    although both workers used a correct lock."
                .into(),
            (true, Some(false)) => format!(
                "the store refused A's token {} because it had accepted token {}: B's result stands.",
                self.stale_token
                    .map(|t| t.to_string())
                    .unwrap_or("?".into()),
                self.newer_token
                    .map(|t| t.to_string())
                    .unwrap_or("?".into()),
            ),
            (_, None) => {
                "A's late write got no answer: the store's final value is the only truth.".into()
            }
            _ if !self.stale_write_attempted => {
                "B took the lock during A's pause, but A's write reached the store before B's."
                    .into()
            }
            _ => "The store's answer differs from what the lab expected; see the attempts above."
                .into(),
        }
    }
}

/// `lockslab gc-pause`.
pub fn run(args: &GcPauseArgs) -> Result<()> {
    let ttl = args.ttl;
    let pause = args.pause.unwrap_or(ttl.mul_f64(1.5));
    let style = Style::detect(args.output.json);
    let servers = servers::provide(&args.servers, &[Backend::Redis, Backend::Postgres])?;
    let run_id = new_run_id();
    let mut store = Store::connect(servers.url(Backend::Postgres))?;
    store.prepare()?;

    let intro = crate::output::Timeline::new(style);
    intro.say(&format!("{} run {run_id}", "lockslab gc-pause".bold()));
    for line in servers.describe() {
        intro.say(&format!("  {}", line.dimmed()));
    }
    intro.say(&format!(
        "Two workers, A and B, share one Redis lock with a {} TTL. A takes it, then freezes for {}{}.",
        human(ttl),
        human(pause),
        if pause > ttl { " — longer than the TTL" } else { " — no longer than the TTL" }
    ));

    let fencing_runs: &[bool] = match args.fencing {
        Fencing::Off => &[false],
        Fencing::On => &[true],
        Fencing::Both => &[false, true],
    };
    let mut verdicts = Vec::new();
    let _on_interrupt = crate::procs::on_interrupt({
        let run_id = run_id.clone();
        let redis_url = servers.url(Backend::Redis).to_string();
        let postgres_url = servers.url(Backend::Postgres).to_string();
        move || {
            if let Ok(mut store) = Store::connect_for_cleanup(&postgres_url) {
                let _ = store.forget_run(&run_id);
            }
            super::forget_redis_keys(&redis_url, &run_id);
        }
    });
    let result = (|| -> Result<()> {
        for &fenced in fencing_runs {
            let play = Play {
                run_id: &run_id,
                ttl,
                pause,
                freeze: args.freeze,
                fenced,
                style,
            };
            verdicts.push(play.run(
                servers.url(Backend::Redis),
                servers.url(Backend::Postgres),
                &mut store,
            )?);
        }
        Ok(())
    })()
    .map_err(connect::explain);
    cleanup(&run_id, servers.url(Backend::Redis), &mut store);
    result?;

    if style.json {
        json_line(&json!({
            "kind": "verdict",
            "lab": "gc-pause",
            "run_id": run_id,
            "ttl_ms": ttl.as_millis() as u64,
            "pause_ms": pause.as_millis() as u64,
            "freeze": args.freeze,
            "runs": verdicts,
        }));
    } else {
        print_verdicts(&verdicts, ttl, pause);
    }
    Ok(())
}

/// Deletes the run's keys and rows; the verdict has been read by then.
fn cleanup(run_id: &str, redis_url: &str, store: &mut Store) {
    let _ = store.forget_run(run_id);
    super::forget_redis_keys(redis_url, run_id);
}

/// One run of the story.
struct Play<'a> {
    run_id: &'a str,
    ttl: Duration,
    pause: Duration,
    freeze: Freeze,
    fenced: bool,
    style: Style,
}

impl Play<'_> {
    fn run(&self, redis_url: &str, postgres_url: &str, store: &mut Store) -> Result<RunVerdict> {
        let label = if self.fenced { "fenced" } else { "unfenced" };
        let mut stage = Stage::new(self.style);
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            if self.fenced {
                "── with fencing tokens ──".green().bold()
            } else {
                "── without fencing ──".red().bold()
            }
        ));
        let role = |name: &str, before_write, hold_after_write| Role {
            name: name.into(),
            redis_url: redis_url.into(),
            postgres_url: postgres_url.into(),
            run_id: self.run_id.into(),
            lock_key: format!("lockslab:{}:gc-pause:{label}:lock", self.run_id),
            fence_counter: self
                .fenced
                .then(|| format!("lockslab:{}:gc-pause:fence", self.run_id)),
            resource: format!("gc-pause-{label}"),
            ttl_ms: self.ttl.as_millis() as u64,
            wait_ms: (self.ttl + self.pause + Duration::from_secs(10)).as_millis() as u64,
            before_write,
            hold_after_write,
        };
        let a_script = match self.freeze {
            Freeze::Self_ => BeforeWrite::FreezeSelf,
            Freeze::Peer => BeforeWrite::WorkUntilTold,
        };
        let mut lock_watch = RedisLock::new(
            connect::redis(redis_url)?,
            &role("lab", BeforeWrite::Nothing, false).lock_key,
            self.ttl,
        );

        // Every event of this run says which run it belongs to: t_ms restarts per run.
        stage.tag("fencing", self.fenced);
        stage.record(
            Event::new(
                "lab",
                "run",
                format!(
                    "run {}: the lock is the Redis key {}",
                    self.run_id, lock_watch.key
                ),
            )
            .with("run_id", self.run_id)
            .with("lock_key", lock_watch.key.clone()),
        );
        let mut a = stage.spawn("A", &WorkerSpec::GcPause(role("A", a_script, false)))?;
        let a_owner = stage
            .wait_for(Duration::from_secs(10), "A to take the lock", |e| {
                e.is("A", "acquired")
            })?
            .get_str("owner")
            .map(String::from);

        match self.freeze {
            Freeze::Peer => {
                // A is at work (waiting for `finish`) before it is frozen, as a real pause
                // catches a client in the middle of what it does.
                stage.wait_for(Duration::from_secs(5), "A to start working", |e| {
                    e.is("A", "working")
                })?;
                a.freeze()?;
                if !crate::procs::wait_until_stopped(a.pid, Duration::from_secs(2)) {
                    bail!("worker A (pid {}) did not stop after SIGSTOP", a.pid);
                }
                stage.record(
                    Event::new(
                        "lab",
                        "frozen",
                        format!(
                            "sends SIGSTOP to A (pid {}): frozen mid-work for {}",
                            a.pid,
                            human(self.pause)
                        ),
                    )
                    .with("pid", a.pid),
                );
            }
            Freeze::Self_ => {
                stage.wait_for(Duration::from_secs(5), "A to freeze itself", |e| {
                    e.is("A", "freezing")
                })?;
                if !crate::procs::wait_until_stopped(a.pid, Duration::from_secs(2)) {
                    bail!("worker A (pid {}) said it would stop but did not", a.pid);
                }
                stage.record(
                    Event::new(
                        "lab",
                        "frozen",
                        format!(
                            "sees A (pid {}) stopped; will resume it in {}",
                            a.pid,
                            human(self.pause)
                        ),
                    )
                    .with("pid", a.pid),
                );
            }
        }
        let frozen_at = Instant::now();
        let mut b = stage.spawn(
            "B",
            &WorkerSpec::GcPause(role("B", BeforeWrite::Nothing, true)),
        )?;

        // While A is frozen, watch its key in Redis: the countdown, then the expiry.
        let bar = self
            .style
            .progress(self.ttl.as_millis() as u64, "  {msg} [{bar:30}]");
        stage.timeline.attach_bar(bar);
        let mut expired = false;
        stage.run_until(frozen_at + self.pause, |stage| {
            if expired {
                return Ok(());
            }
            let (owner, pttl) = lock_watch
                .owner_and_pttl()
                .context("watching the lock in Redis")?;
            if owner != a_owner {
                expired = true;
                stage.timeline.clear_bar();
                stage.record(Event::new(
                    "redis",
                    "expired",
                    "A's key has expired: for Redis the lock is free",
                ));
            } else if let Some(bar) = stage.timeline.bar() {
                bar.set_position(pttl.max(0) as u64);
                bar.set_message(format!("A's lock in Redis: PTTL {pttl:>5}ms"));
            }
            Ok(())
        })?;
        stage.timeline.clear_bar();

        a.resume()?;
        stage.record(Event::new(
            "lab",
            "resumed",
            format!("sends SIGCONT to A after {}", human(frozen_at.elapsed())),
        ));
        if self.freeze == Freeze::Peer {
            a.tell("finish")?;
        }
        let long = self.ttl + self.pause + Duration::from_secs(15);
        let a_wrote = stage.wait_for(long, "A to write", |e| e.is("A", "wrote"))?;
        stage.wait_for(long, "A to release", |e| e.is("A", "released"))?;
        stage.wait_for(long, "B to write", |e| e.is("B", "wrote"))?;
        b.tell("finish")?;
        stage.wait_for(long, "B to release", |e| e.is("B", "released"))?;
        a.finish(Duration::from_secs(5));
        b.finish(Duration::from_secs(5));
        stage.drain();

        let b_took_lock_during_pause = stage
            .saw("B", "acquired")
            .zip(stage.log.iter().find(|e| e.is("lab", "resumed")))
            .is_some_and(|(acquired, resumed)| acquired.t_ms <= resumed.t_ms);
        let a_outcome = match a_wrote.get_str("outcome") {
            Some("accepted") => Some(Outcome::Accepted),
            Some("rejected") => Some(Outcome::Rejected),
            Some(_) => Some(Outcome::Unknown),
            None => None,
        };
        let read = store.read_back(self.run_id, &format!("gc-pause-{label}"))?;
        // A's release is a compare-and-delete: 0 deleted means Redis had already ended A's lease.
        let a_lease_ran_out = stage
            .saw("A", "released")
            .and_then(|e| e.get_bool("deleted"))
            == Some(false);
        let verdict = RunVerdict::from_store(
            self.fenced,
            b_took_lock_during_pause,
            a_lease_ran_out,
            a_outcome,
            read,
        );
        if verdict.stale_write_attempted {
            let (kind, text) = match verdict.stale_write_accepted {
                Some(true) => (
                    "stale_write_accepted",
                    "the store holds A's stale result: B's write is lost",
                ),
                Some(false) => (
                    "stale_write_rejected",
                    "the store rejected A's stale write: B's result stands",
                ),
                None => (
                    "stale_write_unknown",
                    "A's stale write has an unknown outcome",
                ),
            };
            stage.record(Event::new("store", kind, text));
        }
        Ok(verdict)
    }
}

fn print_verdicts(verdicts: &[RunVerdict], ttl: Duration, pause: Duration) {
    let yes_no = |b: bool| {
        if b {
            "yes".to_string()
        } else {
            "no".to_string()
        }
    };
    let header: Vec<&str> = std::iter::once("evidence")
        .chain(verdicts.iter().map(|v| {
            if v.fencing {
                "with fencing"
            } else {
                "without fencing"
            }
        }))
        .collect();
    let stale = |v: &RunVerdict| match (v.stale_write_attempted, v.stale_write_accepted) {
        (false, _) => "none".to_string(),
        (true, Some(true)) => "ACCEPTED".red().bold().to_string(),
        (true, Some(false)) => "rejected".green().bold().to_string(),
        (true, None) => "unknown".yellow().to_string(),
    };
    let row = |name: &str, cell: &dyn Fn(&RunVerdict) -> String| {
        std::iter::once(name.to_string())
            .chain(verdicts.iter().map(cell))
            .collect::<Vec<_>>()
    };
    let rows = vec![
        row("two holders at once (lock events)", &|v| {
            yes_no(v.two_holders)
        }),
        row("A's late write (store)", &stale),
        row("last accepted writer (store)", &|v| {
            v.final_writer.clone().unwrap_or("nobody".into())
        }),
        row("final value (store)", &|v| {
            v.final_value
                .clone()
                .map(|s| format!("'{s}'"))
                .unwrap_or("none".into())
        }),
        row("highest token accepted (store)", &|v| {
            v.final_token
                .map(|t| t.to_string())
                .unwrap_or("none".into())
        }),
        row("attempts in store order", &|v| {
            v.attempts
                .iter()
                .map(|a| {
                    let token = a.token.map(|t| t.to_string()).unwrap_or("-".into());
                    format!(
                        "{}:{token}→{}",
                        a.writer,
                        if a.accepted { "ok" } else { "no" }
                    )
                })
                .collect::<Vec<_>>()
                .join(" ")
        }),
    ];
    crate::outln!();
    crate::outln!("{}", "Verdict".bold());
    crate::outln!("{}", table(&header, &rows));
    crate::outln!();
    for verdict in verdicts {
        let label = if verdict.fencing {
            "with fencing:"
        } else {
            "without fencing:"
        };
        crate::outln!("  {} {}", label.bold(), verdict.meaning(ttl, pause));
    }
}
