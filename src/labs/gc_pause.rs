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

use crate::redis_health::KeyLoss;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::leftovers::Leftovers;
use super::{LONGEST_LAB_WAIT, OutputArgs, Stage, duration_in, new_run_id};
use crate::check::{self, LateWrite};
use crate::connect::{self, Backend};
use crate::events::{Event, Kind};
use crate::lock::redis::{RedisLock, Release};
use crate::output::{Style, human, json_line, table};
use crate::servers::{self, Lifetime, PrivateServers, ServerArgs};
use crate::store::{FenceRule, Outcome, ReadBack, Store};
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec, release_of};

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab gc-pause                      both runs, A freezes itself for 1.5 × TTL
  lockslab gc-pause --freeze peer        the lab stops A with kill(pid, SIGSTOP) instead
  lockslab gc-pause --fencing on         only the fenced run
  lockslab gc-pause --ttl 1s --pause 500ms   a pause shorter than the TTL: nothing goes wrong
  lockslab gc-pause --token-restart      Redis restarts while A is frozen: B gets A's token
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
    /// Crash and restart Redis (no persistence) while A is frozen: the token counter starts
    /// over and B draws A's token again. Plays five fenced runs on a private Redis this lab
    /// starts (never on a shared one): the reissued token under >= and under "refuse an
    /// equal token from another holder" in both orders (lessons), then tokens from a
    /// Postgres sequence in the store's database in both orders (the fix)
    #[arg(long, conflicts_with = "fencing")]
    pub token_restart: bool,
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

/// What one run found. Every field comes from a backend's answer: Redis's (who held the
/// lock when) or the store's (which write it decided last, and what it decided).
#[derive(Serialize, Debug, Clone)]
pub struct RunVerdict {
    pub fencing: bool,
    /// The store's rule for fenced writes: `not_lower` (`>=`, its own) or
    /// `higher_or_same_holder` (a lesson: an equal token from another writer refused); null
    /// unfenced.
    pub store_rule: Option<&'static str>,
    /// Where the tokens came from: `redis_incr` (drawn with the lock, on the Redis that
    /// restarts) or `postgres_sequence` (the store's own database); null unfenced.
    pub token_source: Option<&'static str>,
    /// Who the store decided first (`A` or `B`), from its attempts.
    pub first_writer: Option<String>,
    /// Whether the store took B's write (B was granted after A); null when B did not write.
    pub b_write_accepted: Option<bool>,
    /// Redis was crashed and restarted empty between A's and B's acquisitions.
    pub token_restart: bool,
    /// Redis granted B the lock while A still believed it held it (A's release found B's
    /// key, or A's write was decided after B's); null when the evidence cannot order B's grant.
    pub two_holders: Option<bool>,
    /// A's write, in the store's decision order relative to B's accepted write.
    pub late_write: LateWrite,
    /// A's write was decided after B's (the write that can destroy B's result).
    pub stale_write_attempted: bool,
    /// Whether the store took that stale write; null when there was none.
    pub stale_write_accepted: Option<bool>,
    /// A's compare-and-delete found its key gone or taken: Redis had ended A's lease before
    /// A let go.
    pub a_lease_ran_out: bool,
    /// What A heard back for its write; a lost answer is "unknown" and the store decides.
    pub a_heard: Option<Outcome>,
    pub final_value: Option<String>,
    pub final_writer: Option<String>,
    pub final_token: Option<i64>,
    pub stale_token: Option<i64>,
    pub newer_token: Option<i64>,
    /// Every write attempt, in the order the database decided them.
    pub attempts: Vec<crate::store::Attempt>,
}

impl RunVerdict {
    /// The run's column in the table.
    fn title(&self) -> String {
        if !self.token_restart {
            return if self.fencing {
                "with fencing"
            } else {
                "without fencing"
            }
            .into();
        }
        let first = self.first_writer.as_deref().unwrap_or("?");
        match (self.token_source, self.store_rule) {
            (Some("postgres_sequence"), _) => format!("sequence, {first} first"),
            (_, Some("higher_or_same_holder")) => format!("same holder, {first} first"),
            _ => format!(">=, {first} first"),
        }
    }

    /// Judges the run from Redis's answers and the store's record.
    #[allow(clippy::too_many_arguments)]
    fn judge(
        store_rule: Option<&'static str>,
        token_source: Option<&'static str>,
        token_restart: bool,
        a_release: &Release,
        b_owner: Option<&str>,
        b_release: Option<&Release>,
        a_heard: Option<Outcome>,
        read: ReadBack,
    ) -> Result<RunVerdict> {
        if !check::last_accepted_is_final(&read.attempts, read.final_writer.as_deref()) {
            bail!(
                "the store's record disagrees with itself: its final writer is {:?} but its last accepted attempt is not",
                read.final_writer
            );
        }
        let late_write = check::late_write(&read.attempts, "A", "B");
        Ok(RunVerdict {
            fencing: store_rule.is_some(),
            store_rule,
            token_source,
            first_writer: read.attempts.first().map(|a| a.writer.clone()),
            b_write_accepted: read
                .attempts
                .iter()
                .rev()
                .find(|a| a.writer == "B")
                .map(|a| a.accepted),
            token_restart,
            two_holders: check::two_holders_given_writes(
                check::two_holders(a_release, b_owner, b_release),
                late_write,
            )
            .as_option(),
            late_write,
            stale_write_attempted: late_write.attempted(),
            stale_write_accepted: late_write.accepted(),
            a_lease_ran_out: !a_release.deleted(),
            a_heard,
            stale_token: read.last_token_of("A"),
            newer_token: read.last_token_of("B"),
            final_value: read.final_value,
            final_writer: read.final_writer,
            final_token: read.final_token,
            attempts: read.attempts,
        })
    }

    /// What the run shows, in sentences drawn from the same fields as the table: first who
    /// held the lock, then what the store did with A's write.
    fn meaning(&self, ttl: Duration, pause: Duration) -> String {
        let token = |t: Option<i64>| t.map(|t| t.to_string()).unwrap_or("?".into());
        if self.token_restart {
            let (a, b) = (token(self.stale_token), token(self.newer_token));
            let holders = if self.stale_token == self.newer_token {
                format!(
                    "Redis restarted empty while A was frozen: A's key and the token counter were \
                     gone, so B took the lock at once and drew token {b} — A's token, issued twice."
                )
            } else if self.token_source == Some("postgres_sequence") {
                format!(
                    "Redis restarted empty while A was frozen and B took the lock at once, but the \
                     tokens came from the store's sequence, which no Redis restart resets: A {a}, \
                     B {b}."
                )
            } else {
                format!("Redis restarted while A was frozen; A holds token {a}, B drew token {b}.")
            };
            let store = match (self.late_write, self.store_rule, self.b_write_accepted) {
                (LateWrite::Accepted, Some("not_lower"), _) => format!(
                    "The store's rule, not lower than the highest (>=), took A's token {a} after \
                     B's {b}: B's result is lost, fencing and all (a lesson: the source reissued)."
                ),
                (LateWrite::Rejected, Some("higher_or_same_holder"), _) => format!(
                    "Refusing an equal token from another holder refused A's {a}, because B's \
                     came first (a lesson: see the run where A writes first)."
                ),
                (LateWrite::None, Some("higher_or_same_holder"), Some(false)) => format!(
                    "A, the stale holder, wrote first and was accepted; B, granted the lock after \
                     A, came second with the same token {b} and was refused: A's result stands. No \
                     rule at the store can tell two holders of one token apart (a lesson)."
                ),
                (LateWrite::Rejected, _, _) => {
                    format!("The store refused A's token {a} after B's {b}: B's result stands.")
                }
                (LateWrite::None, _, Some(true)) if self.final_writer.as_deref() == Some("B") => {
                    format!(
                        "A's write was decided first; B's token {b} came after it and was \
                         accepted: B's result stands."
                    )
                }
                (LateWrite::Accepted, _, _) => "The store took A's stale write.".to_string(),
                (LateWrite::None, _, _) => "The store decided A's write before B's: no stale \
                                            write this time."
                    .to_string(),
            };
            return format!("{holders} {store}");
        }
        let holders = match (self.two_holders, self.a_lease_ran_out) {
            (Some(true), _) => format!(
                "A's {} lease ran out during its {} pause and Redis gave the lock to B while A still \
                 believed it held it (A's release found B's key).",
                human(ttl),
                human(pause)
            ),
            (Some(false), true) => format!(
                "A's {} lease ran out during its {} pause, but Redis granted B the lock only after \
                 A let go.",
                human(ttl),
                human(pause)
            ),
            (Some(false), false) => format!(
                "A's key outlived its {} pause: A still held the lock when it let go, and B waited.",
                human(pause)
            ),
            (None, _) => "A's lease ran out, and B's key had expired too by the time B let go, \
                          so Redis's answers cannot tell whether B got the lock before A let go."
                .to_string(),
        };
        let store = match self.late_write {
            LateWrite::Accepted => "The store decided A's write after B's and took it: B's result \
                                    is lost, although both workers used a correct lock."
                .to_string(),
            LateWrite::Rejected => format!(
                "The store refused A's token {} because it had accepted token {}: B's result stands.",
                self.stale_token
                    .map(|t| t.to_string())
                    .unwrap_or("?".into()),
                self.newer_token
                    .map(|t| t.to_string())
                    .unwrap_or("?".into()),
            ),
            LateWrite::None if !self.attempts.iter().any(|a| a.writer == "A") => {
                "A's write never took effect: the store has no record of it.".to_string()
            }
            LateWrite::None if self.a_lease_ran_out => {
                "The store decided A's write before any write of B's: no stale write this time — \
                 by luck, not by design."
                    .to_string()
            }
            LateWrite::None => "No stale write: the lock did its job.".to_string(),
        };
        format!("{holders} {store}")
    }
}

/// `lockslab gc-pause`.
pub fn run(args: &GcPauseArgs) -> Result<()> {
    let ttl = args.ttl;
    let pause = args.pause.unwrap_or(ttl.mul_f64(1.5));
    let style = Style::detect(args.output.json);
    let needs: &[Backend] = if args.token_restart {
        &[Backend::Postgres]
    } else {
        &[Backend::Redis, Backend::Postgres]
    };
    let servers = servers::provide(&args.servers, needs)?;
    let run_id = new_run_id();
    let mut store = Store::connect(servers.url(Backend::Postgres))?;
    store.prepare()?;

    let intro = crate::output::Timeline::new(style);
    intro.say(&crate::output::run_heading("gc-pause", &run_id));
    for line in servers.describe() {
        intro.say(&format!("  {}", line.dimmed()));
    }
    intro.say(&format!(
        "Two workers, A and B, share one Redis lock with a {} TTL. A takes it, then freezes for {}{}.",
        human(ttl),
        human(pause),
        if pause > ttl { " — longer than the TTL" } else { " — no longer than the TTL" }
    ));

    let runs: &[Fence] = match (args.token_restart, args.fencing) {
        (true, _) => &RESTART_RUNS,
        (false, Fencing::Off) => &[Fence::OFF],
        (false, Fencing::On) => &[Fence::ON],
        (false, Fencing::Both) => &[Fence::OFF, Fence::ON],
    };
    // The token-restart variation crashes its Redis: never a server someone else started.
    let mut own_redis = if args.token_restart {
        let private = PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun)?;
        let url = private
            .url(Backend::Redis)
            .context("the private Redis has no URL")?;
        intro.say(&format!(
            "  {}",
            format!(
                "redis    {} (private, started for --token-restart, which crashes it: the lab never restarts a server it did not start)",
                connect::redact(&url)
            )
            .dimmed()
        ));
        Some((private, url))
    } else {
        None
    };
    let redis_url = match &own_redis {
        Some((_, url)) => url.clone(),
        None => servers.url(Backend::Redis).to_string(),
    };
    if args.token_restart {
        intro.say(
            "While A is frozen, the lab crashes that Redis and starts it again on the same port, without persistence: the lock key and the token counter are gone. Five fenced runs. Lessons, with the token drawn from that Redis: the store's rule (>=); then refusing an equal token from another holder, with B writing first and with A writing first. The fix, with the token drawn from a Postgres sequence in the store's database, B first and A first.",
        );
    }
    let mut verdicts = Vec::new();
    let key_loss = if args.token_restart {
        KeyLoss::off()
    } else {
        KeyLoss::watch(&redis_url)?
    };
    let leftovers = Leftovers::of_run(&run_id)
        .store(servers.url(Backend::Postgres))
        .redis(&redis_url)
        .removed_at_the_end();
    let started = Instant::now();
    let result = (|| -> Result<()> {
        for &fence in runs {
            let play = Play {
                run_id: &run_id,
                started,
                ttl,
                pause,
                freeze: args.freeze,
                fence,
                style,
            };
            verdicts.push(play.run(
                &redis_url,
                servers.url(Backend::Postgres),
                &mut store,
                own_redis.as_mut().map(|(private, _)| private),
            )?);
        }
        Ok(())
    })()
    .map_err(connect::explain);
    leftovers.now(&result);
    result?;
    key_loss.check()?;
    super::step::checkpoint(&super::step::gc_pause::VERDICT);

    if style.json {
        json_line(&json!({
            "kind": "verdict",
            "json_version": super::JSON_VERSION,
            "lab": "gc-pause",
            "run_id": run_id,
            "ttl_ms": ttl.as_millis() as u64,
            "pause_ms": pause.as_millis() as u64,
            "freeze": args.freeze,
            "token_restart": args.token_restart,
            "runs": verdicts,
        }));
    } else {
        print_verdicts(&verdicts, ttl, pause);
    }
    Ok(())
}

/// How one run fences A's and B's writes.
#[derive(Clone, Copy)]
struct Fence {
    fenced: bool,
    /// The store's rule for the fenced writes.
    rule: FenceRule,
    /// ✅ Tokens from a Postgres sequence in the store's database, not the Redis counter.
    sequence: bool,
    /// A writes first: B works until A has written (only with a restart, where both hold
    /// the lock at once).
    a_first: bool,
}

impl Fence {
    const OFF: Fence = Fence {
        fenced: false,
        rule: FenceRule::NotLower,
        sequence: false,
        a_first: false,
    };
    const ON: Fence = Fence {
        fenced: true,
        ..Fence::OFF
    };

    /// The run's name in its Redis keys and its store resource.
    fn label(self) -> &'static str {
        match (self.fenced, self.sequence, self.rule, self.a_first) {
            (false, ..) => "unfenced",
            (true, false, FenceRule::NotLower, false) => "fenced",
            (true, false, FenceRule::NotLower, true) => "fenced-a-first",
            (true, false, FenceRule::HigherOrSameHolder, false) => "same-holder",
            (true, false, FenceRule::HigherOrSameHolder, true) => "same-holder-a-first",
            (true, true, _, false) => "sequence",
            (true, true, _, true) => "sequence-a-first",
        }
    }
}

/// `--token-restart`: the reissued token under the store's rule and under the ❌ lesson
/// rule in both orders, then ✅ tokens from the store's sequence in both orders.
const RESTART_RUNS: [Fence; 5] = [
    Fence::ON,
    Fence {
        rule: FenceRule::HigherOrSameHolder,
        ..Fence::ON
    },
    Fence {
        rule: FenceRule::HigherOrSameHolder,
        a_first: true,
        ..Fence::ON
    },
    Fence {
        sequence: true,
        ..Fence::ON
    },
    Fence {
        sequence: true,
        a_first: true,
        ..Fence::ON
    },
];

/// One run of the story.
struct Play<'a> {
    /// The lab run's one clock: both runs' events are stamped from here.
    started: Instant,
    run_id: &'a str,
    ttl: Duration,
    pause: Duration,
    freeze: Freeze,
    fence: Fence,
    style: Style,
}

impl Play<'_> {
    /// One run; `restart`: the private Redis to crash and restart while A is frozen.
    fn run(
        &self,
        redis_url: &str,
        postgres_url: &str,
        store: &mut Store,
        mut restart: Option<&mut PrivateServers>,
    ) -> Result<RunVerdict> {
        let fence = self.fence;
        let label = fence.label();
        let mut stage = Stage::on_clock(self.style, self.started);
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            match (fence.fenced, restart.is_some(), fence.sequence, fence.rule, fence.a_first) {
                (false, ..) => "── without fencing ──".red().bold(),
                (true, false, ..) => "── with fencing tokens ──".green().bold(),
                (true, true, false, FenceRule::NotLower, _) =>
                    "── lesson: tokens from the Redis counter; the store's rule, not lower than the highest (>=) ──"
                        .red()
                        .bold(),
                (true, true, false, FenceRule::HigherOrSameHolder, false) =>
                    "── lesson: tokens from the Redis counter; the store refuses an equal token from another holder; B writes first ──"
                        .red()
                        .bold(),
                (true, true, false, FenceRule::HigherOrSameHolder, true) =>
                    "── lesson: the same rule; A, the stale holder, writes first ──".red().bold(),
                (true, true, true, _, false) =>
                    "── the fix: tokens from a Postgres sequence in the store's database; B writes first ──"
                        .green()
                        .bold(),
                (true, true, true, _, true) =>
                    "── the fix: tokens from the store's sequence; A writes first ──".green().bold(),
            }
        ));
        let lock_key = format!("lockslab:{}:gc-pause:{label}:lock", self.run_id);
        let restarting = restart.is_some();
        let sequence = fence.sequence.then(|| {
            format!(
                "lockslab_gc_pause_{}_{}",
                self.run_id,
                label.replace('-', "_")
            )
        });
        if let Some(sequence) = &sequence {
            store.create_token_sequence(sequence)?;
        }
        let role = |name: &str, before_write, after_write| HolderScript {
            name: name.into(),
            lock: LockSpec::Redis {
                url: redis_url.into(),
                key: lock_key.clone(),
                ttl_ms: self.ttl.as_millis() as u64,
                fence_counter: (fence.fenced && !fence.sequence).then(|| {
                    if restarting {
                        format!("lockslab:{}:gc-pause:{label}:fence", self.run_id)
                    } else {
                        format!("lockslab:{}:gc-pause:fence", self.run_id)
                    }
                }),
                renew: false,
            },
            store_url: postgres_url.into(),
            run_id: self.run_id.into(),
            resource: format!("gc-pause-{label}"),
            wait_ms: (self.ttl + self.pause + Duration::from_secs(10)).as_millis() as u64,
            before_write,
            after_write,
            fence_rule: fence.rule,
            token_sequence: sequence.clone(),
        };
        let a_script = match self.freeze {
            Freeze::Self_ => BeforeWrite::FreezeSelf,
            Freeze::Peer => BeforeWrite::WorkUntilTold,
        };
        let mut lock_watch = RedisLock::new(connect::redis(redis_url)?, &lock_key, self.ttl);

        // Every event of this run says which run it belongs to (both share one clock).
        stage.tag("fencing", fence.fenced);
        stage.checkpoint(super::step::gc_pause::before_run(fence.fenced));
        if restart.is_some() {
            stage.tag("store_rule", fence.rule.as_str());
            stage.tag("token_source", token_source(fence));
        }
        stage.record(
            Event::new(
                "lab",
                Kind::Run,
                format!(
                    "run {}: the lock is the Redis key {}",
                    self.run_id, lock_watch.key
                ),
            )
            .with("run_id", self.run_id)
            .with("lock_key", lock_watch.key.clone()),
        );
        let mut a = stage.spawn(
            "A",
            &WorkerSpec::Holder(role("A", a_script, AfterWrite::Release)),
        )?;
        let a_owner = stage
            .wait_for(Duration::from_secs(10), "A to take the lock", |e| {
                e.is("A", Kind::Acquired)
            })?
            .get_str("owner")
            .map(String::from);

        match self.freeze {
            Freeze::Peer => {
                // A is at work (waiting for `finish`) before it is frozen, as a real pause
                // catches a client in the middle of what it does.
                stage.wait_for(Duration::from_secs(5), "A to start working", |e| {
                    e.is("A", Kind::Working)
                })?;
                a.freeze()?;
                if !crate::procs::wait_until_stopped(a.pid, Duration::from_secs(2)) {
                    bail!("worker A (pid {}) did not stop after SIGSTOP", a.pid);
                }
                stage.record(
                    Event::new(
                        "lab",
                        Kind::Frozen,
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
                    e.is("A", Kind::Freezing)
                })?;
                if !crate::procs::wait_until_stopped(a.pid, Duration::from_secs(2)) {
                    bail!("worker A (pid {}) said it would stop but did not", a.pid);
                }
                stage.record(
                    Event::new(
                        "lab",
                        Kind::Frozen,
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
        let mut expired = false;
        if let Some(private) = restart.as_deref_mut() {
            let pid = private.pid(Backend::Redis).unwrap_or_default();
            stage.record(Event::new(
                "lab",
                Kind::Killed,
                format!("SIGKILL → Redis (pid {pid}), then starts it again on the same port"),
            ));
            let took = private.crash_and_restart(Backend::Redis)?;
            stage.record(Event::new(
                "redis",
                Kind::Expired,
                format!(
                    "back after {}, empty (no persistence): A's key and the token counter are gone",
                    human(took)
                ),
            ));
            lock_watch = RedisLock::new(connect::redis(redis_url)?, &lock_key, self.ttl);
            expired = true;
        }
        // B works until told when A is to write first: A wakes and writes while B holds the
        // lock, as two holders of one reissued token can.
        let b_before = if fence.a_first {
            BeforeWrite::WorkUntilTold
        } else {
            BeforeWrite::Nothing
        };
        let mut b = stage.spawn(
            "B",
            &WorkerSpec::Holder(role("B", b_before, AfterWrite::HoldUntilTold)),
        )?;
        if fence.a_first {
            stage.wait_for(Duration::from_secs(10), "B to take the lock", |e| {
                e.is("B", Kind::Working)
            })?;
        }

        // While A is frozen, watch its key in Redis: the countdown, then the expiry, then
        // the time left until the resume (a long pause must not look like a hang).
        let bar = self
            .style
            .progress(self.ttl.as_millis() as u64, "  {msg} [{bar:30}]");
        stage.timeline.attach_bar(bar);
        let mut counting_down = false;
        let resume_at = frozen_at + self.pause;
        stage.run_until(resume_at, |stage| {
            if expired {
                if !counting_down {
                    counting_down = true;
                    stage.timeline.clear_bar();
                    let bar = self
                        .style
                        .progress(self.pause.as_millis() as u64, "  {msg} [{bar:30}]");
                    stage.timeline.attach_bar(bar);
                }
                if let Some(bar) = stage.timeline.bar() {
                    let left = resume_at.saturating_duration_since(Instant::now());
                    bar.set_position(frozen_at.elapsed().as_millis() as u64);
                    bar.set_message(format!("A stays frozen: SIGCONT in {:>6}", human(left)));
                }
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
                    Kind::Expired,
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
            Kind::Resumed,
            format!("sends SIGCONT to A after {}", human(frozen_at.elapsed())),
        ));
        if self.freeze == Freeze::Peer {
            a.tell("finish")?;
        }
        let long = self.ttl + self.pause + Duration::from_secs(15);
        let a_wrote = stage.wait_for(long, "A to write", |e| e.is("A", Kind::Wrote))?;
        stage.wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
        if fence.a_first {
            b.tell("finish")?;
        }
        stage.wait_for(long, "B to write", |e| e.is("B", Kind::Wrote))?;
        b.tell("finish")?;
        stage.wait_for(long, "B to release", |e| e.is("B", Kind::Released))?;
        a.finish(Duration::from_secs(5));
        b.finish(Duration::from_secs(5));
        stage.drain();

        let a_heard = match a_wrote.get_str("outcome") {
            Some("accepted") => Some(Outcome::Accepted),
            Some("rejected") => Some(Outcome::Rejected),
            Some(_) => Some(Outcome::Unknown),
            None => None,
        };
        let a_release = stage
            .saw("A", Kind::Released)
            .and_then(release_of)
            .context("A's release did not say what Redis answered")?;
        let b_owner = stage
            .saw("B", Kind::Acquired)
            .and_then(|e| e.get_str("owner"))
            .map(String::from);
        let b_release = stage.saw("B", Kind::Released).and_then(release_of);
        let read = store.read_back(self.run_id, &format!("gc-pause-{label}"))?;
        if let Some(sequence) = &sequence {
            store.drop_token_sequence(sequence)?;
        }
        let verdict = RunVerdict::judge(
            fence.fenced.then_some(fence.rule.as_str()),
            fence.fenced.then_some(token_source(fence)),
            restart.is_some(),
            &a_release,
            b_owner.as_deref(),
            b_release.as_ref(),
            a_heard,
            read,
        )?;
        let holds = verdict.final_writer.as_deref().unwrap_or("nobody");
        let store_line = match verdict.late_write {
            LateWrite::Accepted => Some((
                Kind::StaleWriteAccepted,
                format!(
                    "decided A's stale write after B's and took it: it holds {holds}'s result, B's is lost"
                ),
            )),
            LateWrite::Rejected => Some((
                Kind::StaleWriteRejected,
                format!(
                    "decided A's stale write after B's and refused it: it holds {holds}'s result"
                ),
            )),
            _ => None,
        };
        if let Some((kind, text)) = store_line {
            stage.record(Event::new("store", kind, text).with("final_writer", holds));
        }
        Ok(verdict)
    }
}

fn token_source(fence: Fence) -> &'static str {
    if fence.sequence {
        "postgres_sequence"
    } else {
        "redis_incr"
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
    let titles: Vec<String> = verdicts.iter().map(|v| v.title()).collect();
    let header: Vec<&str> = std::iter::once("evidence")
        .chain(titles.iter().map(String::as_str))
        .collect();
    let stale = |v: &RunVerdict| match v.late_write {
        LateWrite::Accepted => "ACCEPTED".red().bold().to_string(),
        LateWrite::Rejected => "rejected".green().bold().to_string(),
        other => other.as_str().to_string(),
    };
    let row = |name: &str, cell: &dyn Fn(&RunVerdict) -> String| {
        std::iter::once(name.to_string())
            .chain(verdicts.iter().map(cell))
            .collect::<Vec<_>>()
    };
    let mut rows = vec![
        row(
            "two holders at once (Redis's answers)",
            &|v| match v.two_holders {
                Some(b) => yes_no(b),
                None => "unknown".yellow().to_string(),
            },
        ),
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
        row("attempts in decision order", &|v| {
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
    if verdicts.iter().any(|v| v.token_restart) {
        rows.insert(
            2,
            row("B's write (store)", &|v| match v.b_write_accepted {
                Some(true) => "accepted".to_string(),
                Some(false) => "REFUSED".red().bold().to_string(),
                None => "none".to_string(),
            }),
        );
    }
    crate::outln!();
    crate::prose!("{}", "Verdict".bold());
    crate::prose!("{}", table(&header, &rows));
    crate::outln!();
    for verdict in verdicts {
        crate::prose!(
            "  {} {}",
            format!("{}:", verdict.title()).bold(),
            verdict.meaning(ttl, pause)
        );
    }
}
