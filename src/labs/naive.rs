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

use crate::redis_health::KeyLoss;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;
use redis::Connection;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::leftovers::Leftovers;
use super::{
    LONGEST_LAB_WAIT, LONGEST_STEP, OutputArgs, Stage, WorkerHandle, duration_in, new_run_id,
};
use crate::connect::{self, Backend};
use crate::events::{Event, Kind};
use crate::lock::redis::owner_and_pttl;
use crate::output::{Style, human, json_line, table};
use crate::servers::{self, ServerArgs};
use crate::worker::WorkerSpec;
use crate::worker::racer::{Acquire, Holder, Release, Role, Script, redis_failed, variant_name};

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab naive                          all four scenarios, each broken and fixed
  lockslab naive race                     only the check-then-set race (10 workers × 200 trials)
  lockslab naive race --window 1ms        1ms between GET and SET: how often now?
  lockslab naive race --spread 0ms        everyone arrives at once
  lockslab naive race --workers 2 --trials 1000   only two clients: rarer, but gone?
  lockslab naive no-ttl --wait 2s         a dead holder with no TTL; give up after 2s
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

// ───────────────────────────── the verdict ─────────────────────────────

/// One run (broken or fixed) of a scenario, counted from the evidence.
#[derive(Serialize, Debug, Clone)]
pub struct Tally {
    pub violations: u32,
    pub trials: u32,
    /// The evidence behind the count (holders lists, PTTL, waits…).
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

impl Tally {
    fn new(violations: u32, trials: u32) -> Tally {
        Tally {
            violations,
            trials,
            details: Map::new(),
        }
    }

    fn with(mut self, key: &str, value: impl Into<Value>) -> Tally {
        self.details.insert(key.into(), value.into());
        self
    }

    fn detail_u64(&self, key: &str) -> Option<u64> {
        self.details.get(key).and_then(Value::as_u64)
    }
}

#[derive(Serialize, Debug, Clone)]
pub struct ScenarioVerdict {
    #[serde(skip)]
    pub scenario: Scenario,
    pub name: &'static str,
    pub broken: Tally,
    pub fixed: Tally,
    /// One sentence on what the two runs show.
    pub meaning: String,
    /// race: one broken trial, step by step, from the workers' monotonic stamps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub example: Option<Value>,
}

/// Replays a holders list (`+W3`, `-W3`… in the order Redis received them): the most
/// holders at once, and every pair that held the lock at the same time.
fn replay(entries: &[String]) -> (usize, Vec<(String, String)>) {
    let mut inside: Vec<String> = Vec::new();
    let mut most = 0;
    let mut pairs = Vec::new();
    for entry in entries {
        if let Some(name) = entry.strip_prefix('+') {
            for other in &inside {
                pairs.push((other.clone(), name.to_string()));
            }
            inside.push(name.to_string());
            most = most.max(inside.len());
        } else if let Some(name) = entry.strip_prefix('-') {
            inside.retain(|n| n != name);
        }
    }
    (most, pairs)
}

fn lrange(redis: &mut Connection, url: &str, list: &str) -> Result<Vec<String>> {
    redis::cmd("LRANGE")
        .arg(list)
        .arg(0)
        .arg(-1)
        .query(redis)
        .step(url, "reading the holders list back from Redis")
}

// ───────────────────────────── the lab ─────────────────────────────

/// `lockslab naive [scenario]`.
pub fn run(args: &NaiveArgs) -> Result<()> {
    let scenarios = match args.scenario {
        Some(one) => vec![one],
        None => Scenario::ALL.to_vec(),
    };
    check_flags(args, &scenarios)?;
    let style = Style::detect(args.output.json);
    let servers = servers::provide(&args.servers, &[Backend::Redis])?;
    let lab = Lab {
        run_id: new_run_id(),
        started: Instant::now(),
        redis_url: servers.url(Backend::Redis).to_string(),
        style,
        args,
    };
    let intro = crate::output::Timeline::new(style);
    intro.say(&crate::output::run_heading("naive", &lab.run_id));
    for line in servers.describe() {
        intro.say(&format!("  {}", line.dimmed()));
    }
    intro.say("The lock everyone writes first, broken four ways; each bug runs beside its fix.");

    let mut verdicts = Vec::new();
    // The stuck keys above all: without a TTL they would stay in Redis for good.
    let key_loss = KeyLoss::watch(&lab.redis_url)?;
    let leftovers = Leftovers::of_run(&lab.run_id)
        .redis(&lab.redis_url)
        .removed_at_the_end();
    let result = (|| -> Result<()> {
        for scenario in scenarios {
            super::step::checkpoint(super::step::naive::before(scenario.name()));
            let verdict = match scenario {
                Scenario::Race => lab.race()?,
                Scenario::NoTtl | Scenario::SetnxExpire => {
                    let broken = lab.stuck(scenario, false)?;
                    let fixed = lab.stuck(scenario, true)?;
                    lab.verdict(scenario, broken, fixed)
                }
                Scenario::WrongRelease => {
                    let broken = lab.wrong_release(false)?;
                    let fixed = lab.wrong_release(true)?;
                    lab.verdict(scenario, broken, fixed)
                }
            };
            verdicts.push(verdict);
        }
        Ok(())
    })()
    .map_err(connect::explain);
    leftovers.now(&result);
    result?;
    key_loss.check()?;
    super::step::checkpoint(&super::step::naive::VERDICT);

    if style.json {
        json_line(&json!({
            "kind": "verdict",
            "json_version": super::JSON_VERSION,
            "lab": "naive",
            "run_id": lab.run_id,
            "scenarios": verdicts,
        }));
    } else {
        print_verdicts(&verdicts);
    }
    Ok(())
}

/// Flags that do not fit, checked only for the scenarios that will run: `race` does not
/// wait for a stuck lock, and the others do not race.
fn check_flags(args: &NaiveArgs, scenarios: &[Scenario]) -> Result<()> {
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
    Ok(())
}

struct Lab<'a> {
    run_id: String,
    /// The lab run's one clock: every scenario's events are stamped from here.
    started: Instant,
    redis_url: String,
    style: Style,
    args: &'a NaiveArgs,
}

impl Lab<'_> {
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
        let mut stage = Stage::on_clock(self.style, self.started);
        stage.tag("scenario", scenario.name());
        stage.tag("variant", variant_name(fixed));
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
            ttl_ms: self.args.ttl.as_millis() as u64,
            wait_ms: self.args.wait.as_millis() as u64,
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

    // ── race ──

    /// Both runs of the race on the same worker processes, then the verdict.
    fn race(&self) -> Result<ScenarioVerdict> {
        let args = self.args;
        // One stage, one clock for both runs. The start-up below is the broken run's
        // (it comes first); `race_run` switches the tag when the fixed run begins.
        let mut stage = Stage::on_clock(self.style, self.started);
        stage.tag("scenario", Scenario::Race.name());
        stage.tag("variant", variant_name(false));
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            "── race: GET-then-SET (broken) vs SET NX (fixed) ──".bold()
        ));
        let prefix = self.race_prefix();
        let mut workers = Vec::new();
        for i in 1..=args.workers {
            let name = format!("W{i}");
            let role = Role {
                name: name.clone(),
                redis_url: self.redis_url.clone(),
                script: Script::Racer {
                    prefix: prefix.clone(),
                    spread_us: args.spread.as_micros() as u64,
                    window_us: args.window.as_micros() as u64,
                    work_ms: args.work.as_millis() as u64,
                    ttl_ms: args.ttl.as_millis() as u64,
                },
            };
            workers.push(stage.spawn(&name, &WorkerSpec::Racer(role))?);
        }
        let mut pids = Vec::new();
        collect(&mut stage, &workers, Kind::Ready, SLACK, |event| {
            pids.push(event.get_i64("pid").unwrap_or(0));
            Ok(())
        })?;
        stage.record(
            Event::new(
                "lab",
                Kind::Workers,
                format!(
                    "starts {} worker processes; in every trial each tries once for a fresh lock, \
                     arriving within {} (window {}, work {})",
                    args.workers,
                    short(args.spread),
                    short(args.window),
                    short(args.work)
                ),
            )
            .with("pids", pids),
        );

        let broken = self.race_run(&mut stage, &mut workers, false)?;
        let fixed = self.race_run(&mut stage, &mut workers, true)?;
        for worker in &mut workers {
            let _ = worker.tell("quit");
        }
        for worker in &mut workers {
            worker.finish(Duration::from_secs(5));
        }
        stage.drain();

        if let Some(example) = &broken.example {
            print_example(&stage, example);
        }
        let mut verdict = self.verdict(Scenario::Race, broken.tally, fixed.tally);
        verdict.example = broken.example;
        Ok(verdict)
    }

    fn race_run(
        &self,
        stage: &mut Stage,
        workers: &mut [WorkerHandle],
        fixed: bool,
    ) -> Result<RaceRun> {
        let args = self.args;
        let variant = variant_name(fixed);
        stage.tag("variant", variant);
        let bar = self.style.progress(
            args.trials as u64,
            &format!("  {variant:>6} trials [{{bar:30}}] {{pos}}/{{len}}"),
        );
        stage.timeline.attach_bar(bar);
        // A trial lasts at most the latest arrival, the window and the work, plus a few
        // Redis round trips; the slack lets a worker whose Redis stopped answering report
        // that itself (its commands time out after COMMAND_TIMEOUT).
        let trial_timeout = args.spread + args.window + args.work + SLACK;
        let started = Instant::now();
        let reports = (|| -> Result<Vec<Vec<Event>>> {
            let mut reports = Vec::with_capacity(args.trials as usize);
            for trial in 1..=args.trials {
                for worker in workers.iter_mut() {
                    worker.tell(&format!("trial {trial} {variant}"))?;
                }
                let mut these = Vec::with_capacity(workers.len());
                collect(stage, workers, Kind::Trial, trial_timeout, |event| {
                    if event.get_i64("trial") != Some(trial as i64) {
                        bail!("worker {} answered for the wrong trial", event.worker);
                    }
                    these.push(event.clone());
                    Ok(())
                })?;
                reports.push(these);
                if let Some(bar) = stage.timeline.bar() {
                    bar.inc(1);
                }
            }
            Ok(reports)
        })();
        // Cleared on the error path too, so the error is not printed under a stale bar.
        stage.timeline.clear_bar();
        let reports = reports?;
        let took = started.elapsed();

        // The verdict: each trial's holders list, the entries the workers wrote to Redis,
        // read back in Redis's order.
        let mut redis = self.redis()?;
        let mut pipe = redis::pipe();
        for trial in 1..=args.trials {
            pipe.cmd("LRANGE")
                .arg(format!("{}:{variant}:{trial}:holders", self.race_prefix()))
                .arg(0)
                .arg(-1);
        }
        let lists: Vec<Vec<String>> = pipe
            .query(&mut redis)
            .step(&self.redis_url, "reading the holders lists back from Redis")?;

        let mut violations = 0;
        let mut clock_overlaps = 0;
        // Trials where the two witnesses differ: the holders list, and the intervals
        // stamped with CLOCK_MONOTONIC (which contain the list's: a worker stamps before
        // its `+` and after its `-`).
        let mut disagreements = Vec::new();
        // Trials in which a compare-and-delete found its worker's own value gone: the
        // release's view of the same overwrite.
        let mut overwritten = 0;
        let mut believers_total = 0;
        let mut most_at_once = 0;
        let mut holders_per_trial = Vec::with_capacity(lists.len());
        let mut example = None;
        for (index, (list, these)) in lists.iter().zip(&reports).enumerate() {
            let (most, pairs) = replay(list);
            holders_per_trial.push(most);
            most_at_once = most_at_once.max(most);
            believers_total += these
                .iter()
                .filter(|e| e.get_bool("acquired") == Some(true))
                .count();
            let clock_overlap = intervals_overlap(these);
            if clock_overlap {
                clock_overlaps += 1;
            }
            if clock_overlap != (most >= 2) {
                disagreements.push(index as u32 + 1);
            }
            if these.iter().any(|e| e.get_bool("released") == Some(false)) {
                overwritten += 1;
            }
            if most >= 2 {
                violations += 1;
                if example.is_none() {
                    example = Some(race_example(index as u32 + 1, these, &pairs));
                }
            }
        }
        let trials = args.trials;
        let rate = violations as f64 / trials as f64;
        let lock = if fixed { "SET NX" } else { "GET-then-SET" };
        let mut text = if violations == 0 {
            format!(
                "{trials} trials with {lock} in {}: never two holders at once",
                human(took)
            )
        } else {
            format!(
                "{trials} trials with {lock} in {}: two or more holders at once in {violations} ({:.1}%), up to {most_at_once} together",
                human(took),
                rate * 100.0
            )
        };
        if overwritten > 0 {
            text.push_str(&format!(
                "; in {overwritten} a worker's compare-and-delete found its own value gone"
            ));
        }
        let kind = if violations > 0 {
            Kind::Violation
        } else {
            Kind::Counted
        };
        stage.record(
            Event::new("redis", kind, text)
                .with("variant", variant)
                .with("violations", violations)
                .with("trials", trials)
                .with("clock_overlaps", clock_overlaps)
                .with("overwritten_trials", overwritten)
                .with("holders_per_trial", holders_per_trial.clone()),
        );
        if !disagreements.is_empty() {
            let shown: Vec<String> = disagreements.iter().take(5).map(u32::to_string).collect();
            stage.record(
                Event::new(
                    "lab",
                    Kind::Warning,
                    format!(
                        "in {} trial(s) (#{}{}) the CLOCK_MONOTONIC stamps and the holders list disagree on \
                         whether two workers held the lock at once; the count follows the holders list",
                        disagreements.len(),
                        shown.join(", #"),
                        if disagreements.len() > 5 { ", …" } else { "" }
                    ),
                )
                .with("disagreeing_trials", disagreements),
            );
        }
        let tally = Tally::new(violations, trials)
            .with("rate", (rate * 1000.0).round() / 1000.0)
            .with("clock_overlaps", clock_overlaps)
            .with("most_at_once", most_at_once)
            .with("believers", believers_total)
            .with("took_ms", took.as_millis() as u64);
        Ok(RaceRun { tally, example })
    }

    fn race_prefix(&self) -> String {
        format!("lockslab:{}:naive:race", self.run_id)
    }

    // ── no-ttl and setnx-expire ──

    /// A takes the lock and is killed holding it; B tries for `--wait`. Broken: B gives
    /// up and the key still names the dead A, with PTTL -1. Fixed: the key lapses after
    /// its TTL and B gets the lock.
    fn stuck(&self, scenario: Scenario, fixed: bool) -> Result<Tally> {
        let args = self.args;
        let mut stage = self.stage(scenario, fixed);
        let acquire = match (scenario, fixed) {
            (_, true) => Acquire::SetNxPx,
            (Scenario::SetnxExpire, false) => Acquire::SetnxThenExpire,
            _ => Acquire::Setnx,
        };
        let key = self.key(scenario, fixed, "lock");
        let url = self.redis_url.as_str();
        let mut redis = self.redis()?;

        let holder = self.holder(scenario, fixed, acquire, Release::CompareAndDelete);
        let a_script = Holder {
            stop_between: true,
            ..holder.clone()
        };
        let mut a = stage.spawn("A", &self.spec("A", a_script))?;
        // With SETNX-then-PEXPIRE, A stops between the two commands and says so; the
        // lab kills it right there. Otherwise A stops after taking the lock.
        let took = stage.wait_for(Duration::from_secs(10), "A to take the lock", |e| {
            e.worker == "A" && (e.kind == Kind::Acquired || e.kind == Kind::Between)
        })?;
        let a_owner = took.get_str("owner").map(String::from);
        let pttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query(&mut redis)
            .step(url, "reading A's key's PTTL after it took the lock")?;
        stage.record(
            Event::new(
                "redis",
                Kind::Pttl,
                match pttl {
                    -1 => "PTTL → -1: the key exists and has no expiry".to_string(),
                    -2 => "PTTL → -2: there is no key".to_string(),
                    ms => format!("PTTL → {ms}ms: the key will expire by itself"),
                },
            )
            .with("pttl_ms", pttl),
        );
        a.kill();
        let killed_at = Instant::now();
        let where_ = match acquire {
            Acquire::SetnxThenExpire => "between SETNX and PEXPIRE: the PEXPIRE is never sent",
            _ => "while it holds the lock: its release never runs",
        };
        stage.record(
            Event::new(
                "lab",
                Kind::Killed,
                format!("SIGKILL to A (pid {}) {where_}", a.pid),
            )
            .with("pid", a.pid),
        );

        let mut b = stage.spawn("B", &self.spec("B", holder))?;
        let bar = self
            .style
            .progress(args.wait.as_millis() as u64, "  {msg} [{bar:30}]");
        stage.timeline.attach_bar(bar);
        let deadline = Instant::now() + args.wait + Duration::from_secs(10);
        let mut last_look = Instant::now() - Duration::from_secs(1);
        let b_result = (|| loop {
            if let Some(event) = stage.next(Duration::from_millis(10)) {
                if event.kind == Kind::Error {
                    return Err(super::worker_failed(&event.worker, &event.text));
                }
                if event.worker == "B"
                    && (event.kind == Kind::Acquired || event.kind == Kind::GaveUp)
                {
                    return Ok(event);
                }
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for B to take the lock or give up");
            }
            if last_look.elapsed() >= Duration::from_millis(50) {
                last_look = Instant::now();
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query(&mut redis)
                    .step(url, "watching A's key's PTTL while B waits")?;
                if let Some(bar) = stage.timeline.bar() {
                    bar.set_position(killed_at.elapsed().as_millis() as u64);
                    bar.set_message(format!("B keeps trying; A's key: PTTL {}", pttl_text(pttl)));
                }
            }
        })();
        stage.timeline.clear_bar();
        let b_result = b_result?;
        let b_owner = b_result.get_str("owner").map(String::from);

        // The evidence: who the key names now, and whether it will ever expire.
        let (owner, pttl) =
            owner_and_pttl(&mut redis, &key).step(url, "reading the lock back from Redis")?;
        let dead_owner = owner.is_some() && owner == a_owner;
        let since_kill = killed_at.elapsed();
        let read = format!(
            "GET → {}, PTTL → {}",
            whose(owner.as_deref(), &[("A", &a_owner), ("B", &b_owner)]),
            pttl_text(pttl)
        );
        let text = if dead_owner {
            format!(
                "{read}: {} after A died the lock still belongs to it{}",
                human(since_kill),
                if pttl == -1 {
                    ", and no expiry will free it"
                } else {
                    ""
                }
            )
        } else {
            format!(
                "{read}: A's key is gone, lapsed with its TTL of {}",
                human(args.ttl)
            )
        };
        stage.record(
            Event::new(
                "redis",
                if dead_owner {
                    Kind::Violation
                } else {
                    Kind::Lapsed
                },
                text,
            )
            .with("dead_owner", dead_owner)
            .with("pttl_ms", pttl),
        );
        if b_result.kind == Kind::Acquired {
            b.tell("finish")?;
            stage.wait_for(Duration::from_secs(5), "B to release", |e| {
                e.is("B", Kind::Released)
            })?;
        }
        b.finish(Duration::from_secs(5));
        stage.drain();

        let waited_ms = b_result.get_i64("waited_ms").unwrap_or(0);
        Ok(Tally::new(dead_owner as u32, 1)
            .with("next_holder_got_lock", b_result.kind == Kind::Acquired)
            .with("waited_ms", waited_ms)
            .with("pttl_ms_after_wait", pttl)
            .with("ttl_ms", args.ttl.as_millis() as u64))
    }

    // ── wrong-release ──

    /// A's lease runs out while it works; B takes the lock; A releases; C tries once.
    fn wrong_release(&self, fixed: bool) -> Result<Tally> {
        let args = self.args;
        let scenario = Scenario::WrongRelease;
        let mut stage = self.stage(scenario, fixed);
        let release = if fixed {
            Release::CompareAndDelete
        } else {
            Release::Del
        };
        let key = self.key(scenario, fixed, "lock");
        let holders = self.key(scenario, fixed, "holders");
        let url = self.redis_url.as_str();
        let mut redis = self.redis()?;
        let long = args.ttl + Duration::from_secs(10);
        let holder = self.holder(scenario, fixed, Acquire::SetNxPx, release);
        let spec = |name: &str, wait: Duration| {
            self.spec(
                name,
                Holder {
                    wait_ms: wait.as_millis() as u64,
                    ..holder.clone()
                },
            )
        };

        let mut a = stage.spawn("A", &spec("A", args.wait))?;
        let a_took = stage.wait_for(long, "A to take the lock", |e| e.is("A", Kind::Acquired))?;
        let a_owner = a_took.get_str("owner").map(String::from);

        // A works on; watch its key in Redis until the lease runs out.
        let bar = self
            .style
            .progress(args.ttl.as_millis() as u64, "  {msg} [{bar:30}]");
        stage.timeline.attach_bar(bar);
        let deadline = Instant::now() + long;
        let lapsed = (|| loop {
            stage.next(Duration::from_millis(10));
            let (owner, pttl) = owner_and_pttl(&mut redis, &key)
                .step(url, "watching A's key in Redis while A works")?;
            if owner != a_owner {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("A's key did not expire within {}", human(long));
            }
            if let Some(bar) = stage.timeline.bar() {
                bar.set_position(args.ttl.as_millis() as u64 - pttl.max(0) as u64);
                bar.set_message(format!("A works; its key: PTTL {}", pttl_text(pttl)));
            }
        })();
        stage.timeline.clear_bar();
        lapsed?;
        stage.record(Event::new(
            "redis",
            Kind::Expired,
            format!(
                "A's key expired (TTL {}) while A still works: for Redis the lock is free",
                human(args.ttl)
            ),
        ));

        let mut b = stage.spawn("B", &spec("B", args.wait))?;
        let b_took = stage.wait_for(long, "B to take the lock", |e| e.is("B", Kind::Acquired))?;
        let b_owner = b_took.get_str("owner").map(String::from);

        a.tell("finish")?;
        stage.wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
        let owner: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query(&mut redis)
            .step(url, "reading the lock after A's release")?;
        let b_lost_lock = owner != b_owner;
        let read = whose(owner.as_deref(), &[("A", &a_owner), ("B", &b_owner)]);
        stage.record(Event::new(
            "redis",
            if b_lost_lock {
                Kind::Violation
            } else {
                Kind::Kept
            },
            if b_lost_lock {
                format!("GET → {read}: A's DEL removed B's lock, and B is still working")
            } else {
                format!("GET → {read}: A's release left B's lock alone; B keeps it")
            },
        ));

        // C tries once, as any newcomer would.
        let mut c = stage.spawn("C", &spec("C", Duration::ZERO))?;
        let c_result = stage.wait_for(long, "C to try the lock", |e| {
            e.worker == "C" && (e.kind == Kind::Acquired || e.kind == Kind::GaveUp)
        })?;
        if c_result.kind == Kind::Acquired {
            let owner: Option<String> = redis::cmd("GET")
                .arg(&key)
                .query(&mut redis)
                .step(url, "reading the lock after C took it")?;
            let c_owner = c_result.get_str("owner");
            if owner.as_deref() == c_owner {
                stage.record(Event::new(
                    "redis",
                    Kind::TwoHolders,
                    "GET → C's value while B still works and believes it holds the lock: two holders, B and C",
                ));
            }
        }

        b.tell("finish")?;
        stage.wait_for(long, "B to release", |e| e.is("B", Kind::Released))?;
        if c_result.kind == Kind::Acquired {
            c.tell("finish")?;
            stage.wait_for(long, "C to release", |e| e.is("C", Kind::Released))?;
        }
        for worker in [&mut a, &mut b, &mut c] {
            worker.finish(Duration::from_secs(5));
        }
        stage.drain();

        // The verdict: who held the lock together, from the entries the workers wrote to
        // Redis, in Redis's order; and, by the workers' monotonic stamps, whether the earlier holder's lease had run out by then. A pair
        // whose first lease had run out is lab 1's problem (the TTL), the same in both runs;
        // a pair whose first lease still ran means someone deleted a live lock.
        let list = lrange(&mut redis, url, &holders)?;
        let (_, pairs) = replay(&list);
        let entered: HashMap<String, u64> = stage
            .log
            .iter()
            .filter(|e| e.kind == Kind::Acquired)
            .filter_map(|e| Some((e.worker.clone(), e.get_i64("enter_ns")? as u64)))
            .collect();
        let ttl_ns = args.ttl.as_nanos() as u64;
        let mut violations = 0;
        let mut overlaps = Vec::new();
        for (first, second) in &pairs {
            let gap = entered
                .get(second)
                .zip(entered.get(first))
                .map(|(s, f)| s.saturating_sub(*f));
            let lease_ran_out = gap.is_some_and(|gap| gap >= ttl_ns);
            if !lease_ran_out {
                violations += 1;
            }
            overlaps.push(json!({
                "holders": [first, second],
                "second_entered_after_ms": gap.map(|g| g / 1_000_000),
                "cause": if lease_ran_out { "lease expired" } else { "lock deleted by another worker" },
            }));
        }
        let pairs_text = overlaps
            .iter()
            .map(|o| {
                format!(
                    "{} and {} ({})",
                    o["holders"][0].as_str().unwrap_or("?"),
                    o["holders"][1].as_str().unwrap_or("?"),
                    o["cause"].as_str().unwrap_or("?")
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        stage.record(
            Event::new(
                "redis",
                if violations > 0 {
                    Kind::Violation
                } else {
                    Kind::Counted
                },
                format!(
                    "holders list [{}]: held at the same time: {pairs_text}",
                    list.join(" ")
                ),
            )
            .with("holders", list.clone())
            .with("violations", violations),
        );
        Ok(Tally::new(violations, 1)
            .with("holders_list", list)
            .with("overlaps", overlaps)
            .with("c_got_lock", c_result.kind == Kind::Acquired))
    }

    fn verdict(&self, scenario: Scenario, broken: Tally, fixed: Tally) -> ScenarioVerdict {
        let meaning = meaning(scenario, &broken, &fixed, self.args);
        ScenarioVerdict {
            scenario,
            name: scenario.name(),
            broken,
            fixed,
            meaning,
            example: None,
        }
    }
}

struct RaceRun {
    tally: Tally,
    example: Option<Value>,
}

/// Takes one unshown event of `kind` from every worker, failing with a clear message
/// if a worker fails, exits, or stays silent for `timeout`.
fn collect(
    stage: &mut Stage,
    workers: &[WorkerHandle],
    kind: Kind,
    timeout: Duration,
    mut take: impl FnMut(&Event) -> Result<()>,
) -> Result<()> {
    let mut waiting: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        if let Some(event) = stage.next_silent(Duration::from_millis(100)) {
            if event.kind == Kind::Error {
                return Err(super::worker_failed(&event.worker, &event.text));
            }
            if event.kind == kind {
                waiting.retain(|w| *w != event.worker);
                take(&event)?;
            }
        }
        if let Some(gone) = waiting.iter().find(|w| stage.has_exited(w)) {
            bail!("worker {gone} exited before reporting `{kind}`");
        }
        if Instant::now() > deadline {
            bail!(
                "no `{kind}` from {} within {}",
                waiting.join(", "),
                human(timeout)
            );
        }
    }
    Ok(())
}

/// Did two workers that believed they held the lock hold it at overlapping moments, by
/// their monotonic clocks?
fn intervals_overlap(reports: &[Event]) -> bool {
    let mut intervals: Vec<(i64, i64)> = reports
        .iter()
        .filter_map(|e| Some((e.get_i64("enter_ns")?, e.get_i64("leave_ns")?)))
        .collect();
    intervals.sort();
    intervals.windows(2).any(|w| w[1].0 < w[0].1)
}

/// One broken trial, step by step, from the workers' monotonic stamps: the first (up to)
/// three workers that held the lock together.
///
/// The stamps are client-side: a SET's stamp is when its answer *arrived*, not when Redis
/// ran it, so two SETs a few microseconds apart can be stamped in the opposite order. The
/// order Redis ran them in is told by what each release found — a value still in the key
/// had no SET run over it; a value gone had — and each step says that, so no line draws a
/// conclusion from the stamps that Redis's own answer contradicts.
fn race_example(trial: u32, reports: &[Event], pairs: &[(String, String)]) -> Value {
    let mut shown: Vec<&str> = Vec::new();
    // Only asked "is this worker in it?", so repeats do no harm.
    let together: Vec<&str> = pairs
        .iter()
        .flat_map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    let mut by_entry: Vec<&Event> = reports
        .iter()
        .filter(|e| together.contains(&e.worker.as_str()))
        .collect();
    by_entry.sort_by_key(|e| e.get_i64("answer_ns"));
    for event in by_entry.iter().take(3) {
        shown.push(&event.worker);
    }
    let holders = by_entry.len();
    let mut steps: Vec<(i64, String, String, String)> = Vec::new();
    for event in &by_entry {
        if !shown.contains(&event.worker.as_str()) {
            continue;
        }
        let worker = event.worker.clone();
        if let Some(t) = event.get_i64("start_ns") {
            steps.push((
                t,
                worker.clone(),
                "get".into(),
                "GET: no holder, the lock looks free".into(),
            ));
        }
        if let Some(t) = event.get_i64("answer_ns") {
            let text = match event.get_bool("released") {
                Some(true) => {
                    "SET → OK: believes it holds the lock (Redis ran no other SET over it: \
                     its value was still in the key at its release)"
                }
                Some(false) => {
                    "SET → OK: believes it holds the lock (Redis later ran another SET over it)"
                }
                None => "SET → OK: believes it holds the lock",
            };
            steps.push((t, worker.clone(), "set".into(), text.into()));
        }
        if let Some(t) = event.get_i64("leave_ns") {
            let text = if event.get_bool("released") == Some(true) {
                "done: compare-and-delete finds its own value and deletes the key"
            } else {
                // The key then holds another worker's value, or none if that worker has
                // already released: either way, this worker's own value is gone.
                "done: compare-and-delete finds its own value gone (another worker's SET overwrote it): deletes nothing"
            };
            steps.push((t, worker, "done".into(), text.into()));
        }
    }
    steps.sort_by_key(|s| s.0);
    let origin = steps.first().map(|s| s.0).unwrap_or(0);
    // Redis ran the surviving SET after the overwritten ones; say so when the stamps put it first.
    let set_stamp = |event: &&Event| event.get_i64("answer_ns");
    let in_example: Vec<&&Event> = by_entry
        .iter()
        .filter(|e| shown.contains(&e.worker.as_str()))
        .collect();
    let survivor = in_example
        .iter()
        .find(|e| e.get_bool("released") == Some(true));
    let overwritten_though_stamped_later = survivor.and_then(|kept| {
        in_example
            .iter()
            .find(|other| {
                other.get_bool("released") == Some(false) && set_stamp(other) > set_stamp(kept)
            })
            .map(|other| other.worker.clone())
    });
    json!({
        "trial": trial,
        "holders": holders,
        "survivor": survivor.map(|e| e.worker.clone()),
        "overwritten_though_stamped_later": overwritten_though_stamped_later,
        "steps": steps.iter().map(|(t, worker, step, text)| json!({
            "t_us": (t - origin) / 1000,
            "worker": worker,
            "step": step,
            "text": text,
        })).collect::<Vec<_>>(),
    })
}

fn print_example(stage: &Stage, example: &Value) {
    let timeline = &stage.timeline;
    timeline.say("");
    timeline.say(&format!(
        "  One trial that broke (#{}), on the workers' CLOCK_MONOTONIC stamps (client-side: \
         when each answer arrived, not when Redis ran the command):",
        example["trial"]
    ));
    for step in example["steps"].as_array().into_iter().flatten() {
        let ms = step["t_us"].as_i64().unwrap_or(0) as f64 / 1000.0;
        timeline.say(&format!(
            "  {:>10}  {:<4} {}",
            format!("{ms:.3}ms").dimmed(),
            step["worker"].as_str().unwrap_or("?").bold(),
            step["text"].as_str().unwrap_or("")
        ));
    }
    if let (Some(kept), Some(other)) = (
        example["survivor"].as_str(),
        example["overwritten_though_stamped_later"].as_str(),
    ) {
        timeline.say(&format!(
            "  {}",
            format!(
                "By the stamps {kept}'s SET came before {other}'s, yet Redis ran a SET over \
                 {other}'s value and none over {kept}'s: stamps time the answers, Redis's \
                 answers tell what it ran."
            )
            .dimmed()
        ));
    }
    let holders = example["holders"].as_u64().unwrap_or(0);
    if holders > 3 {
        timeline.say(&format!(
            "  {}",
            format!(
                "…and {} more workers held the lock in this trial at the same time",
                holders - 3
            )
            .dimmed()
        ));
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

/// One sentence on what a scenario's two runs show.
fn meaning(scenario: Scenario, broken: &Tally, fixed: &Tally, args: &NaiveArgs) -> String {
    let waited = |t: &Tally| {
        t.detail_u64("waited_ms")
            .map(|ms| human(Duration::from_millis(ms)))
            .unwrap_or_default()
    };
    let fixed_ok = fixed.violations == 0;
    match scenario {
        Scenario::Race => {
            let head = if broken.violations == 0 {
                format!(
                    "GET-then-SET got lucky this time: no trial broke (try a --window above {})",
                    short(args.window)
                )
            } else {
                format!(
                    "GET-then-SET let two or more workers hold the lock at once in {} of {} trials (up to {} together)",
                    broken.violations,
                    broken.trials,
                    broken.detail_u64("most_at_once").unwrap_or(0)
                )
            };
            let tail = if fixed_ok {
                "SET NX let exactly one in, every time"
            } else {
                "SET NX broke too, which it should not: look at the holders lists"
            };
            format!("{head}; {tail}.")
        }
        Scenario::NoTtl | Scenario::SetnxExpire => {
            let how = if scenario == Scenario::NoTtl {
                "A died holding a key with no TTL"
            } else {
                "A died between SETNX and PEXPIRE"
            };
            let head = if broken.violations > 0 {
                format!(
                    "{how}: after {} the key still named it, with PTTL {}: no expiry will ever remove it (only a DEL, a FLUSHALL, eviction under an allkeys-* policy, or a restart without persistence)",
                    human(args.wait),
                    broken
                        .details
                        .get("pttl_ms_after_wait")
                        .and_then(Value::as_i64)
                        .map(pttl_text)
                        .unwrap_or_default()
                )
            } else {
                format!("{how}, yet the lock came free, which the bug should not allow")
            };
            let tail = if fixed_ok {
                format!(
                    "with SET NX PX the lock lapsed with its TTL ({}) and B got it after {}",
                    human(args.ttl),
                    waited(fixed)
                )
            } else {
                "with SET NX PX, B still did not get the lock: look at the timeline".into()
            };
            format!("{head}; {tail}.")
        }
        Scenario::WrongRelease => {
            let head = if broken.violations > 0 {
                "A's DEL removed B's live lock and C took it while B still worked: two holders"
            } else {
                "A's DEL did not let anyone in this time"
            };
            let tail = if fixed_ok {
                "with compare-and-delete A's release deleted nothing (the script returned 0), B kept the lock and C was turned away"
            } else {
                "compare-and-delete still let someone in: look at the holders list"
            };
            format!("{head}; {tail}.")
        }
    }
}

fn print_verdicts(verdicts: &[ScenarioVerdict]) {
    let count = |t: &Tally, broken: bool| {
        let text = if t.trials > 1 {
            format!(
                "{}/{} ({:.1}%)",
                t.violations,
                t.trials,
                t.violations as f64 * 100.0 / t.trials as f64
            )
        } else {
            format!("{}/{}", t.violations, t.trials)
        };
        match (t.violations > 0, broken) {
            (true, _) => text.red().bold().to_string(),
            (false, false) => text.green().bold().to_string(),
            (false, true) => text,
        }
    };
    let rows: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            let (broken, fix) = v.scenario.broken_and_fix();
            vec![
                v.name.to_string(),
                v.scenario.counted().to_string(),
                broken.to_string(),
                count(&v.broken, true),
                fix.to_string(),
                count(&v.fixed, false),
            ]
        })
        .collect();
    crate::outln!();
    crate::prose!("{}", "Verdict (from Redis: the holder entries the workers wrote, in Redis's order; GET and PTTL)".bold());
    crate::prose!(
        "{}",
        table(
            &[
                "scenario",
                "violation counted",
                "broken lock",
                "count",
                "fixed lock",
                "count"
            ],
            &rows
        )
    );
    crate::outln!();
    for verdict in verdicts {
        crate::prose!(
            "  {} {}",
            format!("{}:", verdict.name).bold(),
            verdict.meaning
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn racer(name: &str, set_stamp: i64, kept_its_value: bool) -> Event {
        Event::new(name, Kind::Trial, "")
            .with("acquired", true)
            .with("start_ns", set_stamp - 1_000)
            .with("answer_ns", set_stamp)
            .with("leave_ns", set_stamp + 5_000_000)
            .with("released", kept_its_value)
    }

    /// Issue 10, item 3: W2's SET is stamped first, yet its value is the one Redis kept
    /// (Redis ran W1's SET before it). The example must not read as if W2's came first in
    /// Redis: each SET says what Redis's answers prove, and the contradiction is named.
    #[test]
    fn the_example_follows_redis_not_the_client_stamps() {
        let reports = [racer("W1", 2_000_000, false), racer("W2", 1_000_000, true)];
        let pairs = [("W1".to_string(), "W2".to_string())];
        let example = race_example(7, &reports, &pairs);
        assert_eq!(example["survivor"], "W2", "{example}");
        assert_eq!(
            example["overwritten_though_stamped_later"], "W1",
            "{example}"
        );
        let set_of = |worker: &str| {
            example["steps"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["worker"] == worker && s["step"] == "set")
                .map(|s| s["text"].as_str().unwrap().to_string())
                .unwrap()
        };
        assert!(set_of("W2").contains("no other SET over it"), "{example}");
        assert!(set_of("W1").contains("another SET over it"), "{example}");
    }
}
