//! `lockslab worker`: one worker by hand, narrated for a person at a terminal, for the
//! exercises where the learner freezes it with `kill -STOP` and wakes it with `kill -CONT`.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;

use crate::connect::{self, Backend};
use crate::flags;
use crate::lock::redis::{RedisLock, Release};
use crate::output::{Style, human};
use crate::servers::{self, ServerArgs};
use crate::store::{Outcome, Store};

/// Options of the hands-on worker.
#[derive(clap::Args, Debug)]
pub struct HandsOnArgs {
    /// Name of the lock (and of the store's resource); pick your own in a shared workshop
    #[arg(long, default_value = "demo")]
    pub lock: String,
    /// How long the lock lives in Redis unless released (100ms to 1h)
    #[arg(long, default_value = "10s",
          value_parser = flags::duration_in(Duration::from_millis(100), flags::LONGEST_HANDS_ON),
          value_name = "DURATION")]
    pub ttl: Duration,
    /// How long the worker "works" while holding the lock, before it writes (keep it below the
    /// TTL); at most 1h
    #[arg(long, default_value = "8s",
          value_parser = flags::duration_in(Duration::ZERO, flags::LONGEST_HANDS_ON),
          value_name = "DURATION")]
    pub work: Duration,
    /// How long to keep trying when someone else holds the lock (at most 1h)
    #[arg(long, default_value = "30s",
          value_parser = flags::duration_in(Duration::ZERO, flags::LONGEST_HANDS_ON),
          value_name = "DURATION")]
    pub wait: Duration,
    /// Draw a fencing token with the lock and send it with the write
    #[arg(long)]
    pub fencing: bool,
    /// Your name in a shared room: your lock and store row become NAME/LOCK, apart from
    /// everyone else's
    #[arg(long, env = "LOCKSLAB_NAME", value_name = "NAME", value_parser = parse_name)]
    pub name: Option<String>,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// An attendee's name: letters, digits, `-` and `_`, as it becomes part of Redis keys.
fn parse_name(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 40
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(text.to_string())
    } else {
        Err("use 1 to 40 letters, digits, '-' or '_'".into())
    }
}

/// A lock's name is printed on every line the worker says: a control character in it (an
/// escape sequence that recolours the terminal, moves the cursor, retitles the window) would
/// reach the terminal raw. Checked here rather than by clap, whose error would echo it raw.
/// Format characters (Unicode category Cf) are refused too: a bidi override (U+202E) turns
/// the rest of the line around, a zero-width space (U+200B) makes two names look the same.
fn check_lock(lock: &str) -> Result<()> {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    let unprintable = |c: char| c.is_control() || c.general_category() == GeneralCategory::Format;
    if lock.is_empty() || lock.chars().count() > 100 || lock.chars().any(unprintable) {
        crate::bail_usage!(
            "--lock \"{}\": use 1 to 100 characters, none of them a control or format \
             character",
            lock.escape_debug()
        );
    }
    Ok(())
}

/// The lock (and store resource) a hands-on command uses: `demo`, or `ana/demo` for Ana.
///
/// No two (name, lock) pairs meet: a name holds no `/`, so the first `/` ends it (`a` with
/// `b-demo` is `a/b-demo`, `a-b` with `demo` is `a-b/demo`); and a lock without a name that
/// holds a `/` gets one in front, which no name starts with.
pub fn hands_on_name(name: Option<&str>, lock: &str) -> String {
    match name.filter(|n| !n.is_empty()) {
        Some(name) => format!("{name}/{lock}"),
        None if lock.contains('/') => format!("/{lock}"),
        None => lock.to_string(),
    }
}

/// A hands-on Redis key: `lockslab:hands-on:<lock>:<what>`, or inside a room seat's
/// namespace (`lockslab:<seat>_hands-on:…`), the only keys the seat's Redis user reaches.
fn hands_on_key(lock_name: &str, what: &str) -> Result<String> {
    Ok(match servers::namespace()? {
        Some(namespace) => format!("lockslab:{namespace}_hands-on:{lock_name}:{what}"),
        None => format!("lockslab:hands-on:{lock_name}:{what}"),
    })
}

/// `lockslab worker`: one worker, by hand, narrated for a human.
pub fn hands_on(args: &HandsOnArgs) -> Result<()> {
    check_lock(&args.lock)?;
    let lock_name = hands_on_name(args.name.as_deref(), &args.lock);
    let style = Style::detect(false);
    let servers = servers::provide_shared(&args.servers, &[Backend::Redis, Backend::Postgres])?;
    let pid = std::process::id();
    let me = format!("worker {pid}");
    let key = hands_on_key(&lock_name, "lock")?;
    let counter = hands_on_key(&lock_name, "fence")?;
    let mut store = Store::connect(servers.url(Backend::Postgres))?;
    store.prepare()?;
    let mut lock = RedisLock::new(connect::redis(servers.url(Backend::Redis))?, &key, args.ttl);

    crate::prose!(
        "{me}: taking lock '{}' (TTL {})…",
        lock_name,
        human(args.ttl)
    );
    let fence = args.fencing.then_some(counter.as_str());
    let held = lock.acquire_within(args.wait, fence)?;
    let acquired_at = Instant::now();
    let Some(held) = held else {
        bail!(
            "lock '{}' stayed taken for {}; is a frozen worker holding it? (try again after its TTL)",
            lock_name,
            human(args.wait)
        );
    };
    let token = held
        .token
        .map(|t| format!(", fencing token {t}"))
        .unwrap_or_default();
    crate::prose!(
        "{}",
        format!(
            "{me}: holds lock '{}'{token}; it expires in {} unless released",
            lock_name,
            human(args.ttl)
        )
        .bold()
    );
    crate::outln!();
    crate::prose!("  To play the GC pause, in another terminal:");
    crate::prose!(
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
    if let Some(name) = &args.name {
        second.push_str(&format!(" --name {name}"));
    }
    crate::prose!(
        "    wait more than {}, then run {} until it has written",
        human(args.ttl),
        second.cyan().bold()
    );
    crate::prose!(
        "    {}    wake me up: I finish my work and write, late",
        format!("kill -CONT {pid}").cyan().bold()
    );
    crate::outln!();

    if args.work >= args.ttl {
        crate::prose!(
            "  note: --work {} is not shorter than --ttl {}: the lock expires while I work, pause or not",
            human(args.work),
            human(args.ttl)
        );
    }
    let paused = work_watching_the_clock(acquired_at, args.work, style);
    if paused > Duration::from_millis(500) {
        crate::prose!(
            "{me}: {} — my clock jumped by {} while I worked. My lock may be gone, but I write anyway, as most code would.",
            "I was paused".yellow().bold(),
            human(paused)
        );
    }
    let value = format!("written by {me}");
    let outcome = store.write("hands-on", &lock_name, &me, &value, held.token);
    // The labs' colours: red for a late write that landed, green for one that fencing kept
    // out. An on-time write is just accepted.
    let late = paused > Duration::from_millis(500);
    let verdict = match outcome {
        Outcome::Accepted if late => "ACCEPTED (a late write, taken)".red().bold(),
        Outcome::Accepted => "ACCEPTED".bold(),
        Outcome::Rejected => "REJECTED (a newer token was already accepted)"
            .green()
            .bold(),
        Outcome::Unknown => "UNKNOWN (no answer from the store)".yellow().bold(),
    };
    crate::prose!("{me}: wrote '{value}'{token}: the store says {verdict}");
    let now = store.read_back("hands-on", &lock_name)?;
    let fencing = match (held.token, now.final_token) {
        (Some(_), Some(highest)) => format!("highest token accepted: {highest}"),
        (Some(_), None) => "highest token accepted: none".to_string(),
        // An unfenced write leaves the row's token as earlier fenced writes set it; that
        // number says nothing about this write, which the store did not check.
        (None, _) => "sent without a token: the store checked nothing".to_string(),
    };
    crate::prose!(
        "{me}: the store now holds '{}' ({fencing})",
        now.final_value.unwrap_or_default(),
    );
    let released = lock.release_reporting(&held).map_err(|err| {
        if no_answer(&err) {
            anyhow::anyhow!(
                "{me}: Redis gave no answer to my release (compare-and-delete) in time: the \
                 network between us is silent (a black hole drops every byte, both ways). My \
                 key stays until its TTL runs out, {} after I took it; nothing else is lost",
                human(args.ttl)
            )
        } else {
            err
        }
    })?;
    match released {
        Release::Deleted => crate::prose!("{me}: released the lock"),
        Release::HeldBy(_) => crate::prose!(
            "{me}: the key holds another worker's value now (my lock expired and someone took \
             it): compare-and-delete left it alone"
        ),
        Release::Gone => crate::prose!(
            "{me}: my key was gone already (it expired or was deleted): nothing to release"
        ),
    }
    Ok(())
}

/// Whether `err` is a server that said nothing in time: a socket's read timeout, which the
/// Redis client reports as the raw `EAGAIN` ("Resource temporarily unavailable (os error
/// 11)") — words for the kernel, not for a learner.
fn no_answer(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<redis::RedisError>()
            .is_some_and(redis::RedisError::is_timeout)
            || cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            })
    })
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

/// Options of `lockslab reset`.
#[derive(clap::Args, Debug)]
pub struct ResetArgs {
    /// The lock to clear
    #[arg(long, default_value = "demo")]
    pub lock: String,
    /// Whose: the same name `lockslab worker` was given
    #[arg(long, env = "LOCKSLAB_NAME", value_name = "NAME", value_parser = parse_name)]
    pub name: Option<String>,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// `lockslab reset`: deletes one name's lock key and fencing counter in Redis and its row
/// and attempts in the store, so that the next exercise starts from token 1 and an empty
/// store. Nothing of any other name is touched; what labs killed with SIGKILL left on these
/// servers is swept too (see `labs::leftovers`).
pub fn reset(args: &ResetArgs) -> Result<()> {
    check_lock(&args.lock)?;

    // `--name` wins over LOCKSLAB_NAME: someone whose shell says who they are clears only
    // their own state. (A guard against slips: attendees share the room's credentials.)
    if let (Some(given), Ok(own)) = (&args.name, std::env::var("LOCKSLAB_NAME"))
        && !own.is_empty()
        && *given != own
    {
        anyhow::bail!(
            "LOCKSLAB_NAME says you are '{own}': `lockslab reset` clears only your own lock \
             (leave out --name '{given}')"
        );
    }
    let lock_name = hands_on_name(args.name.as_deref(), &args.lock);
    let servers = servers::provide_shared(&args.servers, &[Backend::Redis, Backend::Postgres])?;
    let mut redis = connect::redis(servers.url(Backend::Redis))?;
    let keys = [
        hands_on_key(&lock_name, "lock")?,
        hands_on_key(&lock_name, "fence")?,
    ];
    let deleted: i64 = redis::cmd("DEL").arg(&keys).query(&mut *redis)?;
    let mut store = Store::connect(servers.url(Backend::Postgres))?;
    store.prepare()?;
    let mut db = connect::postgres(servers.url(Backend::Postgres))?;
    let rows = db.execute(
        "DELETE FROM lockslab_resource WHERE run_id = 'hands-on' AND resource = $1",
        &[&lock_name],
    )?;
    let attempts = db.execute(
        "DELETE FROM lockslab_attempt WHERE run_id = 'hands-on' AND resource = $1",
        &[&lock_name],
    )?;
    crate::prose!(
        "reset '{lock_name}': {deleted} Redis key(s), {rows} store row(s), {attempts} attempt(s) removed"
    );
    let swept = crate::labs::leftovers::sweep_dead_runs(
        servers.url(Backend::Redis),
        servers.url(Backend::Postgres),
    );
    if swept > 0 {
        crate::prose!("swept what {swept} killed lab run(s) left on these servers");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::no_answer;

    #[test]
    fn a_read_timeout_is_a_server_that_gave_no_answer_not_os_error_11() {
        let timed_out = std::io::Error::from(std::io::ErrorKind::WouldBlock);
        let err = anyhow::Error::from(timed_out).context("releasing with compare-and-delete");
        assert!(no_answer(&err));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!no_answer(&anyhow::Error::from(refused)));
    }
}
