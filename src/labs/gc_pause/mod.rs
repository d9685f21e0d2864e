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
//! The orchestrator only plays the clock (freeze, resume, "your work is done") through the
//! nemesis; every lock operation and write is made by the workers over their own
//! connections, and the verdict is read back from the store ([`crate::check::gc_pause`]).
//!
//! - [`play`]: one run of the story (A, B, the freeze, the writes);
//! - [`verdict`]: what each run shows, and the table and sentences that say it.

mod play;
pub mod verdict;
pub use verdict::{check, replay};

use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::leftovers::Leftovers;
use super::runner::{self, Lab, Run};
use super::{Fencing, LONGEST_LAB_WAIT, OutputArgs, duration_in};
use crate::connect::{self, Backend};
use crate::events::Kind;
use crate::nemesis::Fault;
use crate::nemesis::schedule::{Anchor, Schedule, Step};
use crate::output::human;
use crate::redis_health::KeyLoss;
use crate::servers::{Lifetime, PrivateServers, ServerArgs};
use crate::store::{FenceRule, Store};
use verdict::Verdict;

/// Lab 1: a lock holder freezes past its TTL; its stale write lands unfenced, is refused fenced
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab gc-pause                      both runs, A freezes itself for 1.5 ×
                                         TTL
  lockslab gc-pause --freeze peer        the lab stops A with kill(pid, SIGSTOP)
                                         instead
  lockslab gc-pause --fencing on         only the fenced run
  lockslab gc-pause --ttl 1s --pause 500ms   a pause shorter than the TTL:
                                             nothing goes wrong
  lockslab gc-pause --token-restart      Redis restarts while A is frozen: B
                                         gets A's token
  lockslab gc-pause --json | jq .        events and verdict as JSON Lines

By hand, in two terminals: `lockslab up`, then `lockslab worker` (see
labs/01-gc-pause.md).", crate::lab_exit_status_help!()))]
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

/// The lab as the flags ask for it. Every flag is checked by its parser (`--ttl` at least
/// 100ms, `--pause` 100ms to 10m, `--token-restart` without `--fencing`), so building the
/// plan cannot fail.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) ttl: Duration,
    pub(crate) pause: Duration,
    pub(crate) freeze: Freeze,
    /// Redis is crashed and restarted while A is frozen (on a private Redis of the lab's own).
    pub(crate) token_restart: bool,
    /// The runs to play, in order.
    runs: Vec<Fence>,
}

impl Plan {
    fn from(args: &GcPauseArgs) -> Plan {
        let runs = match (args.token_restart, args.fencing) {
            (true, _) => RESTART_RUNS.to_vec(),
            (false, Fencing::Off) => vec![Fence::OFF],
            (false, Fencing::On) => vec![Fence::ON],
            (false, Fencing::Both) => vec![Fence::OFF, Fence::ON],
        };
        Plan {
            ttl: args.ttl,
            pause: args.pause.unwrap_or(args.ttl.mul_f64(1.5)),
            freeze: args.freeze,
            token_restart: args.token_restart,
            runs,
        }
    }
}

impl Plan {
    /// The faults of every run, as data: A is paused for `pause` from the moment it is at
    /// work (with `--freeze self`, from the moment it says it stops itself: the pause is
    /// its own, the nemesis adopts it and ends it), and with `--token-restart` Redis
    /// crashes and restarts right after A froze.
    pub(crate) fn faults(&self) -> Schedule {
        let from = Anchor::on(
            "A",
            match self.freeze {
                Freeze::Self_ => Kind::Freezing,
                Freeze::Peer => Kind::Working,
            },
            1,
        );
        let mut steps = vec![Step {
            at_ms: 0,
            after: Some(from.clone()),
            fault: Fault::Pause,
            target: "A".into(),
            duration_ms: Some(self.pause.as_millis() as u64),
        }];
        if self.token_restart {
            steps.push(Step {
                at_ms: 0,
                after: Some(from),
                fault: Fault::Restart,
                target: "redis".into(),
                duration_ms: None,
            });
        }
        Schedule::new(steps)
    }
}

/// `lockslab gc-pause`.
pub fn run(args: &GcPauseArgs) -> Result<()> {
    let mut plan = Plan::from(args);
    runner::run(&mut plan, &args.output, &args.servers)
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "gc-pause"
    }

    /// The token-restart variation crashes its Redis, so it brings its own.
    fn needs(&self) -> Vec<Backend> {
        if self.token_restart {
            vec![Backend::Postgres]
        } else {
            vec![Backend::Redis, Backend::Postgres]
        }
    }

    fn intro(&self, _run: &Run) -> Vec<String> {
        vec![format!(
            "Two workers, A and B, share one Redis lock with a {} TTL. A takes it, then freezes for {}{}.",
            human(self.ttl),
            human(self.pause),
            if self.pause > self.ttl {
                " — longer than the TTL"
            } else {
                " — no longer than the TTL"
            }
        )]
    }

    /// The private Redis of `--token-restart` goes whole at the end of the run, its keys
    /// with it; a shared one keeps only what the run left.
    fn leftovers(&self, run: &Run, leftovers: Leftovers) -> Leftovers {
        let leftovers = leftovers.store(run.url(Backend::Postgres));
        if self.token_restart {
            leftovers
        } else {
            leftovers.redis(run.url(Backend::Redis))
        }
    }

    fn schedule(&self) -> Option<Schedule> {
        Some(self.faults())
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        let mut store = Store::connect(run.url(Backend::Postgres))?;
        store.prepare()?;
        // The token-restart variation crashes its Redis: never a server someone else started.
        let mut own_redis = if self.token_restart {
            let private = PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun)?;
            let url = private
                .url(Backend::Redis)
                .context("the private Redis has no URL")?;
            run.detail(&format!(
                "redis    {} (private, started for --token-restart, which crashes it: the lab never restarts a server it did not start)",
                connect::redact(&url)
            ));
            run.say(
                "While A is frozen, the lab crashes that Redis and starts it again on the same port, without persistence: the lock key and the token counter are gone. Five fenced runs. Lessons, with the token drawn from that Redis: the store's rule (>=); then refusing an equal token from another holder, with B writing first and with A writing first. The fix, with the token drawn from a Postgres sequence in the store's database, B first and A first.",
            );
            Some((private, url))
        } else {
            None
        };
        let redis_url = match &own_redis {
            Some((_, url)) => url.clone(),
            None => run.url(Backend::Redis).to_string(),
        };
        // A key Redis evicted or flushed must not pass for one that expired.
        let key_loss = if self.token_restart {
            KeyLoss::off()
        } else {
            KeyLoss::watch(&redis_url)?
        };
        let postgres_url = run.url(Backend::Postgres).to_string();
        let mut runs = Vec::new();
        for &fence in &self.runs {
            let play = play::Play {
                plan: self,
                run,
                fence,
            };
            runs.push(play.run(
                &redis_url,
                &postgres_url,
                &mut store,
                own_redis.as_mut().map(|(private, _)| private),
            )?);
        }
        key_loss.check()?;
        Ok(Verdict {
            runs,
            plan: self.clone(),
        })
    }
}

/// How one run fences A's and B's writes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fence {
    pub(crate) fenced: bool,
    /// The store's rule for the fenced writes.
    pub(crate) rule: FenceRule,
    /// ✅ Tokens from a Postgres sequence in the store's database, not the Redis counter.
    pub(crate) sequence: bool,
    /// A writes first: B works until A has written (only with a restart, where both hold
    /// the lock at once).
    pub(crate) a_first: bool,
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
    pub(crate) fn label(self) -> &'static str {
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

    /// Where the run's tokens come from, as `--json` names it.
    pub(crate) fn token_source(self) -> &'static str {
        if self.sequence {
            "postgres_sequence"
        } else {
            "redis_incr"
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

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 1,
    command: "gc-pause",
    shows: "frozen past its TTL, A writes late: fencing refuses it",
    takes: "6s",
    needs: &[Backend::Redis, Backend::Postgres],
    starts_its_own: None,
    walkthrough: "labs/01-gc-pause.md",
    session: 15,
    stops: 3,
    by_hand: &["redis-cli", "jq"],
};
