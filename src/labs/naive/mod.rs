//! Lab 2 — the naive Redis lock, broken four ways, each bug run beside its fix.
//!
//! ```text
//!  race           W1  GET → nil ─┐ SET ✓  holds          several workers hold the lock,
//!                 W2    GET → nil┴─ SET ✓  holds          each sure it is alone
//!  no-ttl         A   SETNX ✓ ── ✖ SIGKILL                the key stays forever (PTTL -1)
//!  setnx-expire   A   SETNX ✓ ── ✖ SIGKILL ── (PEXPIRE)   the same stuck key
//!  wrong-release  A   SET NX PX ✓ … lease runs out … DEL  A's DEL removes B's lock,
//!                 B                  SET NX PX ✓ ……………    and C gets in while B works
//!                 C                                 SET NX PX ✓
//! ```
//!
//! Each scenario runs twice under the same conditions: once with the broken lock from
//! [`crate::lock::redis`] (the ❌ methods), once with its fix (the ✅ ones). Every lock
//! operation is made by worker processes over their own Redis connections; the lab only
//! plays the clock (kill A now, B may finish) and then reads the evidence back from Redis:
//!
//! - every holder appends `+name` to a list in Redis when it believes it took the lock and
//!   `-name` when it lets go; the entries are the workers' own words, but Redis puts them
//!   in one order, so replaying the list shows who believed they held the lock at the same
//!   time without comparing anyone's clock;
//! - the workers also stamp those moments with `CLOCK_MONOTONIC`, which is one clock for
//!   every process on the machine, so their intervals can be laid side by side; the race
//!   compares the two witnesses trial by trial and says so when they disagree;
//! - `GET` and `PTTL` on the lock key show a stuck lock (a dead owner, no expiry) directly.
//!
//! One file per part of the play: `race.rs` (and `example.rs`, its broken trial step by
//! step), `stuck.rs` (no-ttl and setnx-expire), `wrong_release.rs`; `verdict.rs` holds the
//! table and its sentences. What the evidence proves is decided in [`crate::check::naive`];
//! the kill goes through the [`crate::nemesis`], which records it.

mod example;
mod race;
mod stuck;
mod verdict;
pub use verdict::{check, replay};
mod wrong_release;

use std::time::{Duration, Instant};

use anyhow::Result;
use colored::Colorize;
use serde::{Deserialize, Serialize};

use super::leftovers::Leftovers;
use super::runner::{self, Lab, Run};
use super::stage::History;
use super::{LONGEST_LAB_WAIT, LONGEST_STEP, OutputArgs, Stage, duration_in};
use crate::connect::{self, Backend};
use crate::output::{Style, human};
use crate::redis_health::KeyLoss;
use crate::servers::ServerArgs;
use crate::worker::WorkerSpec;
use crate::worker::racer::{Acquire, Holder, Release, Role, Script, redis_failed, variant_name};
use verdict::Verdict;

/// Lab 2: the naive Redis lock broken every way, each bug beside its fix, with counts
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab naive                          all four scenarios, each broken and
                                          fixed
  lockslab naive race                     only the check-then-set race (10
                                          workers × 200 trials)
  lockslab naive race --window 1ms        1ms between GET and SET: how often
                                          now?
  lockslab naive race --spread 0ms        everyone arrives at once
  lockslab naive race --workers 2 --trials 1000   only two clients: rarer, but
                                                  gone?
  lockslab naive no-ttl --wait 2s         a dead holder with no TTL; give up
                                          after 2s
  lockslab naive wrong-release --ttl 500ms
  lockslab naive --json | jq 'select(.kind == \"verdict\")'

By hand: labs/02-naive.md plays each bug with redis-cli in two terminals.", crate::lab_exit_status_help!()))]
pub struct NaiveArgs {
    /// Run one scenario only [default: all four, in this order]
    #[arg(value_enum)]
    pub scenario: Option<Scenario>,
    /// race: worker processes that race for the lock in every trial
    #[arg(long, default_value_t = 10, value_name = "N",
          value_parser = clap::value_parser!(u32).range(2..=64))]
    pub workers: u32,
    /// race: how many trials, each on a fresh lock
    #[arg(long, default_value_t = 200, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub trials: u32,
    /// race: each worker arrives at a random moment within this span, like real requests
    /// (at most 1m)
    #[arg(long, default_value = "5ms", value_parser = duration_in(Duration::ZERO, LONGEST_STEP),
          value_name = "DURATION")]
    pub spread: Duration,
    /// race: extra time between the GET and the SET (in the fix: before the SET NX); at most 1m
    #[arg(long, default_value = "0ms", value_parser = duration_in(Duration::ZERO, LONGEST_STEP),
          value_name = "DURATION")]
    pub window: Duration,
    /// race: how long a worker that got the lock works before it lets go (at most 1m)
    #[arg(long, default_value = "5ms", value_parser = duration_in(Duration::ZERO, LONGEST_STEP),
          value_name = "DURATION")]
    pub work: Duration,
    /// How long a worker keeps trying for the lock before it gives up: B in no-ttl and
    /// setnx-expire (must be longer than --ttl), A and B in wrong-release; at most 10m
    #[arg(long, default_value = "5s", value_parser = duration_in(Duration::ZERO, LONGEST_LAB_WAIT),
          value_name = "DURATION")]
    pub wait: Duration,
    /// The lock's TTL wherever it has one (all fixes, race, wrong-release); 100ms to 10m
    #[arg(long, default_value = "1s", value_parser = duration_in(Duration::ZERO, LONGEST_LAB_WAIT),
          value_name = "DURATION")]
    pub ttl: Duration,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// GET, then SET: several workers take the lock at once
    Race,
    /// SETNX with no TTL: a killed holder's lock stays forever
    NoTtl,
    /// SETNX, then EXPIRE: a holder killed between the two leaves a stuck lock
    SetnxExpire,
    /// Release by DEL: an expired holder deletes the next holder's lock
    WrongRelease,
}

impl Scenario {
    const ALL: [Scenario; 4] = [
        Scenario::Race,
        Scenario::NoTtl,
        Scenario::SetnxExpire,
        Scenario::WrongRelease,
    ];

    fn name(self) -> &'static str {
        match self {
            Scenario::Race => "race",
            Scenario::NoTtl => "no-ttl",
            Scenario::SetnxExpire => "setnx-expire",
            Scenario::WrongRelease => "wrong-release",
        }
    }

    /// What the broken and the fixed run use, for headings and the verdict.
    fn broken_and_fix(self) -> (&'static str, &'static str) {
        match self {
            Scenario::Race => ("GET, then SET", "SET NX"),
            Scenario::NoTtl => ("SETNX, no TTL", "SET NX PX"),
            Scenario::SetnxExpire => ("SETNX, then PEXPIRE", "SET NX PX"),
            Scenario::WrongRelease => ("release by DEL", "compare-and-delete"),
        }
    }

    /// What a violation is, as counted from the evidence.
    fn counted(self) -> &'static str {
        match self {
            Scenario::Race => "trials with 2+ holders at once",
            Scenario::NoTtl | Scenario::SetnxExpire => "lock still held by a dead worker",
            Scenario::WrongRelease => "holders whose lock was deleted under them",
        }
    }
}

/// `.step(url, "reading …")` on a Redis reply: [`redis_failed`] for the orchestrator's
/// own queries.
trait RedisStep<T> {
    fn step(self, url: &str, step: &str) -> Result<T>;
}

impl<T> RedisStep<T> for redis::RedisResult<T> {
    fn step(self, url: &str, step: &str) -> Result<T> {
        self.map_err(|err| redis_failed(step, url, &err))
    }
}

/// How long past the expected time the lab waits for a worker before calling it stuck:
/// room for starting a process and for a few Redis commands to time out on their own.
const SLACK: Duration = Duration::from_secs(3 * connect::COMMAND_TIMEOUT.as_secs());

/// The longest --spread or --window: each trial lasts about that long, twice per trial.
const LONGEST_RACE_DELAY: Duration = Duration::from_secs(60);

/// The lab as the flags ask for it, checked once, before any server is touched.
#[derive(Clone, Debug)]
struct Plan {
    /// The scenarios to play, in order.
    scenarios: Vec<Scenario>,
    workers: u32,
    trials: u32,
    spread: Duration,
    window: Duration,
    work: Duration,
    wait: Duration,
    ttl: Duration,
}

/// `lockslab naive [scenario]`.
pub fn run(args: &NaiveArgs) -> Result<()> {
    let mut plan = plan_from(args)?;
    runner::run(&mut plan, &args.output, &args.servers)
}

/// The plan, with the flags that do not fit refused — only for the scenarios that will run:
/// `race` does not wait for a stuck lock, and the others do not race.
fn plan_from(args: &NaiveArgs) -> Result<Plan> {
    let scenarios = match args.scenario {
        Some(one) => vec![one],
        None => Scenario::ALL.to_vec(),
    };
    if args.ttl < Duration::from_millis(100) {
        crate::bail_usage!(
            "--ttl {}: use at least 100ms, or process start-up blurs the story",
            short(args.ttl)
        );
    }
    if scenarios.contains(&Scenario::Race) {
        for (flag, value) in [("--spread", args.spread), ("--window", args.window)] {
            if value > LONGEST_RACE_DELAY {
                crate::bail_usage!(
                    "{flag} {} is too long for race: use at most {} (each of the {} trials, run twice, lasts about that long)",
                    human(value),
                    human(LONGEST_RACE_DELAY),
                    args.trials
                );
            }
        }
        if args.work + args.window >= args.ttl {
            crate::bail_usage!(
                "--work {} plus --window {} must stay below --ttl {} for race: a winner's lock must not expire while it works",
                short(args.work),
                short(args.window),
                human(args.ttl)
            );
        }
    }
    let waits_for_lapse = scenarios
        .iter()
        .any(|s| matches!(s, Scenario::NoTtl | Scenario::SetnxExpire));
    if waits_for_lapse && args.wait <= args.ttl {
        crate::bail_usage!(
            "--wait {} must be longer than --ttl {} for no-ttl and setnx-expire: otherwise their fixed runs give up before the lock can lapse",
            short(args.wait),
            human(args.ttl)
        );
    }
    Ok(Plan {
        scenarios,
        workers: args.workers,
        trials: args.trials,
        spread: args.spread,
        window: args.window,
        work: args.work,
        wait: args.wait,
        ttl: args.ttl,
    })
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "naive"
    }

    fn needs(&self) -> Vec<Backend> {
        vec![Backend::Redis]
    }

    fn intro(&self, _run: &Run) -> Vec<String> {
        vec![
            "The lock everyone writes first, broken four ways; each bug runs beside its fix."
                .into(),
        ]
    }

    /// The stuck keys above all: without a TTL they would stay in Redis for good.
    fn leftovers(&self, run: &Run, leftovers: Leftovers) -> Leftovers {
        leftovers.redis(run.url(Backend::Redis))
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        // A key Redis evicted or flushed must not pass for one that lapsed.
        let key_loss = KeyLoss::watch(run.url(Backend::Redis))?;
        let play = Play {
            run_id: run.id.clone(),
            started: run.started,
            redis_url: run.url(Backend::Redis).to_string(),
            style: run.style,
            history: run.history.clone(),
            plan: self,
        };
        let mut scenarios = Vec::new();
        for &scenario in &self.scenarios {
            super::step::checkpoint(super::step::naive::before(scenario.name()));
            scenarios.push(match scenario {
                Scenario::Race => play.race()?,
                Scenario::NoTtl | Scenario::SetnxExpire => {
                    let broken = play.stuck(scenario, false)?;
                    let fixed = play.stuck(scenario, true)?;
                    verdict::scenario(scenario, broken, fixed, self)
                }
                Scenario::WrongRelease => {
                    let broken = play.wrong_release(false)?;
                    let fixed = play.wrong_release(true)?;
                    verdict::scenario(scenario, broken, fixed, self)
                }
            });
        }
        key_loss.check()?;
        Ok(Verdict { scenarios })
    }
}

/// One run of the lab as it plays: the plan, and what the runner set up for it.
struct Play<'a> {
    run_id: String,
    /// The lab run's one clock: every scenario's events are stamped from here.
    started: Instant,
    redis_url: String,
    style: Style,
    /// The run's history, which every scenario's stage keeps its events in.
    history: History,
    plan: &'a Plan,
}

impl Play<'_> {
    fn key(&self, scenario: Scenario, fixed: bool, what: &str) -> String {
        let variant = variant_name(fixed);
        format!(
            "lockslab:{}:naive:{}:{variant}:{what}",
            self.run_id,
            scenario.name()
        )
    }

    fn redis(&self) -> Result<connect::RedisConn> {
        connect::redis(&self.redis_url)
    }

    /// A fresh stage, on the run's one clock, under a heading naming the lock in play.
    /// Every event it shows carries `scenario` and `variant`, for `--json` readers.
    fn stage(&self, scenario: Scenario, fixed: bool) -> Stage {
        let mut stage = Stage::on_clock(self.style, self.started).recorded_in(&self.history);
        stage.tags().scenario = Some(scenario.name().into());
        stage.tags().variant = Some(variant_name(fixed).into());
        let (broken, fix) = scenario.broken_and_fix();
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            if fixed {
                format!("── {}: fixed, {fix} ──", scenario.name())
                    .green()
                    .bold()
            } else {
                format!("── {}: broken, {broken} ──", scenario.name())
                    .red()
                    .bold()
            }
        ));
        stage
    }

    /// A holder's script on this run's keys; it tries for `--wait` and does not stop
    /// between SETNX and PEXPIRE unless told to.
    fn holder(
        &self,
        scenario: Scenario,
        fixed: bool,
        acquire: Acquire,
        release: Release,
    ) -> Holder {
        Holder {
            key: self.key(scenario, fixed, "lock"),
            holders: self.key(scenario, fixed, "holders"),
            acquire,
            release,
            ttl_ms: self.plan.ttl.as_millis() as u64,
            wait_ms: self.plan.wait.as_millis() as u64,
            stop_between: false,
        }
    }

    fn spec(&self, name: &str, holder: Holder) -> WorkerSpec {
        WorkerSpec::Racer(Role {
            name: name.into(),
            redis_url: self.redis_url.clone(),
            script: Script::Holder(holder),
        })
    }
}

/// PTTL's answer as a learner reads it: -1 and -2 are not durations.
fn pttl_text(pttl: i64) -> String {
    match pttl {
        -1 => "-1 (no expiry)".into(),
        -2 => "-2 (no key)".into(),
        ms => format!("{ms}ms"),
    }
}

/// A value read with GET, named by the worker whose owner value it is.
fn whose(value: Option<&str>, owners: &[(&str, &Option<String>)]) -> String {
    let Some(value) = value else {
        return "(nil)".into();
    };
    owners
        .iter()
        .find(|(_, owner)| owner.as_deref() == Some(value))
        .map(|(name, _)| format!("{name}'s value"))
        .unwrap_or_else(|| format!("{value:?}, nobody's here"))
}

/// A duration as a learner reads it, down to microseconds for the race's small ones.
fn short(duration: Duration) -> String {
    if !duration.is_zero() && duration < Duration::from_millis(1) {
        format!("{}µs", duration.as_micros())
    } else {
        human(duration)
    }
}

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 2,
    command: "naive",
    shows: "the naive Redis lock broken four ways, each beside its fix",
    takes: "18s",
    needs: &[Backend::Redis],
    starts_its_own: None,
    walkthrough: "labs/02-naive.md",
    session: 10,
    stops: 7,
    by_hand: &["redis-cli", "jq"],
};
