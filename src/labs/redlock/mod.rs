//! Lab 6 — Redlock: five Redis masters, a quorum, a validity window, and the debate about it.
//!
//! The lab starts N private Redis masters (five by default: independent processes, no
//! replication, no persistence) and plays four scenarios, each with its own verdict:
//!
//! ```text
//!  minority      two masters down (SIGKILL), then frozen (SIGSTOP): still granted;
//!                three down: not granted, the release sent to every master (a frozen one
//!                may still set the key once thawed)
//!  restart       A holds m1–m3; m3 crashes and restarts empty; B gets m3–m5: two holders.
//!                With m3 kept down longer than the TTL, B is refused
//!  clock-jump    A holds m1–m4; the clocks of m3 and m4 jump (SIMULATED: PEXPIRE);
//!                B gets m3–m5: two holders
//!  client-pause  A freezes past its validity; B takes the lock; A wakes and writes:
//!                unfenced it lands; by its random value compare-and-set at the resource
//!                it is refused if A claimed before its pause, taken if A's claim came
//!                after it; fenced by a Postgres sequence it is refused
//! ```
//!
//! What is real: the masters are real redis-server processes, really killed, frozen and
//! restarted on their ports; the clients' SETs and releases are real, and every verdict is
//! read back from the masters' own answers (their replies, then GET and PTTL on each) and
//! from the fenced store. What is simulated: the clock jump — Debian's redis-server crashes
//! under libfaketime, so the lab does to the key what a forward jump of the master's clock
//! would do to its expiry, shortening its PTTL with PEXPIRE, and says so where it does it.
//!
//! Clients A and B of the first three scenarios are played by the lab itself (nothing
//! freezes them: the faults there are the servers'); the client that pauses is a worker
//! process, since only a separate process can be frozen the way a pause freezes a client.

//!
//! The lab is a folder: this file holds its flags and its plan; [`scene`] the masters, the
//! clients and the faults the scenarios share; one file per scenario; [`verdict`] the
//! verdict and its words. The verdict's facts come from [`crate::check::redlock`].

mod client_pause;
mod clock_jump;
mod minority;
mod partition;
mod restart;
mod scene;
mod schedules;
mod verdict;
pub use verdict::{check, reads_in, replay, rounds_in};

use colored::Colorize;
use std::time::Duration;

use anyhow::Result;

use super::leftovers::{Leftovers, redlock_sequence_of};
use super::runner::{self, Lab, Run};
use super::{OutputArgs, duration_in};
use crate::connect::Backend;
use crate::lock::redlock::{RoundOrder, Settings};
use crate::output::human;
use crate::servers::{LabUrlParser, ServerArgs};
use scene::Scene;
use verdict::Verdict;

/// Lab 6: Redlock on five Redis masters: a minority down, a master restarting empty, a
/// clock jump, a client pause
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab redlock                       all four scenarios on five private
                                         masters
  lockslab redlock restart               one scenario: a master restarting empty
  lockslab redlock partition             real partitions: a client cut from two
                                         masters, the masters split 3/2 — between
                                         two rounds, then in the middle of A's,
                                         once m2 has granted it, once m3 has
                                         (each on a host of its own; not in the
                                         default run)
  lockslab redlock --masters 3           three masters (quorum 2)
  lockslab redlock --instance-timeout 200ms   frozen masters eat more of the
                                              validity
  lockslab redlock minority --round concurrent   two frozen masters cost one
                                                 timeout, not two
  lockslab redlock --json | jq .         events and verdict as JSON Lines
  lockslab redlock --master redis://a:6379 --master redis://b:6379 \\
                   --master redis://c:6379   three masters of yours

By default the masters are private to the run: the lab kills, freezes and
restarts them, which it must never do to a server someone else uses (a given
--redis-url is not used here). With --master it uses yours and plays only
clock-jump and client-pause (minority and restart kill and restart masters); the
run's keys lockslab:<run id>:* are removed from yours at the end. The clock jump
is SIMULATED with PEXPIRE (redis-server cannot run under libfaketime). By hand,
with redis-cli against five ports: see labs/06-redlock.md.", crate::lab_exit_status_help!()))]
pub struct RedlockArgs {
    /// Play one scenario only [default: the first four, in this order]
    #[arg(value_enum)]
    pub scenario: Option<Scenario>,
    /// How many Redis masters to start: odd, 3 to 9
    #[arg(long, default_value_t = 5, value_parser = parse_masters, value_name = "N",
          conflicts_with = "master")]
    pub masters: usize,
    /// An existing Redis master to use instead of private ones; repeat it (3 to 9, odd)
    #[arg(long = "master", value_name = "URL",
          value_parser = LabUrlParser(Backend::Redis, "--master"))]
    pub master: Vec<String>,
    /// The lock's TTL on every master (200ms to 1m)
    #[arg(long, default_value = "2s", value_name = "DURATION",
          value_parser = duration_in(Duration::from_millis(200), Duration::from_secs(60)))]
    pub ttl: Duration,
    /// The clock drift allowed, as a fraction of the TTL (0 to 0.5); 2ms are added to it.
    /// 0.01 and 2ms are the reference implementations' choice, not part of the algorithm
    #[arg(long, default_value_t = 0.01, value_parser = parse_drift_factor, value_name = "FRACTION")]
    pub drift_factor: f64,
    /// The longest random delay before a client tries again (0 to 10s)
    #[arg(long, default_value = "200ms", value_name = "DURATION",
          value_parser = duration_in(Duration::ZERO, Duration::from_secs(10)))]
    pub retry: Duration,
    /// How long one master may take to answer before it counts as no (5ms to 1s)
    #[arg(long, default_value = "50ms", value_name = "DURATION",
          value_parser = duration_in(Duration::from_millis(5), Duration::from_secs(1)))]
    pub instance_timeout: Duration,
    /// How each client asks the masters: one after another, or all at once
    #[arg(long, value_enum, default_value_t = RoundOrder::Sequential, value_name = "ROUND")]
    pub round: RoundOrder,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

fn parse_masters(text: &str) -> Result<usize, String> {
    let n: usize = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number"))?;
    if !(3..=9).contains(&n) || n.is_multiple_of(2) {
        return Err(
            "use an odd number from 3 to 9 (an even one adds a master and no safety)".into(),
        );
    }
    Ok(n)
}

fn parse_drift_factor(text: &str) -> Result<f64, String> {
    let factor: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number (e.g. 0.01)"))?;
    if !(0.0..=0.5).contains(&factor) {
        return Err(
            "use a fraction from 0 to 0.5 (0.01 is the reference implementations' default)".into(),
        );
    }
    Ok(factor)
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// A minority of masters down or frozen, then a majority down
    Minority,
    /// A master restarting empty; then kept down longer than the TTL
    Restart,
    /// Clocks jumping forward on some masters (simulated with PEXPIRE)
    ClockJump,
    /// The client pauses past its validity; its random value compare-and-set vs a token
    ClientPause,
    /// A client cut from two masters, then the masters split 3/2 between two clients —
    /// before A's round, then in its middle (once m2 has granted A, once m3 has): real
    /// partitions, each master and client on a host of its own (not in the default run)
    Partition,
}

impl Scenario {
    /// It kills, freezes or restarts masters: only masters the lab started itself will do.
    fn needs_own_masters(&self) -> bool {
        matches!(
            self,
            Scenario::Minority | Scenario::Restart | Scenario::Partition
        )
    }

    /// Its name on the command line.
    fn command_name(&self) -> &'static str {
        match self {
            Scenario::Minority => "minority",
            Scenario::Restart => "restart",
            Scenario::ClockJump => "clock-jump",
            Scenario::ClientPause => "client-pause",
            Scenario::Partition => "partition",
        }
    }
}

const ALL: [Scenario; 4] = [
    Scenario::Minority,
    Scenario::Restart,
    Scenario::ClockJump,
    Scenario::ClientPause,
];

/// The lab as the flags ask for it, checked once, before any server is touched.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) settings: Settings,
    /// The masters named with `--master`; empty when the lab starts its own.
    pub(crate) given: Vec<String>,
    /// How many masters: the given ones, or `--masters`.
    pub(crate) n: usize,
    /// The scenarios to play, in order.
    pub(crate) scenarios: Vec<Scenario>,
    /// Those asked for that need masters of the lab's own, with `--master` given.
    pub(crate) skipped: Vec<Scenario>,
    /// A Redis URL was given (`--redis-url`, `LOCKSLAB_REDIS_URL`, a room's), which Redlock
    /// cannot use: it needs several independent masters (`--master`).
    pub(crate) redis_url_ignored: bool,
}

impl Plan {
    fn needs_store(&self) -> bool {
        self.scenarios.contains(&Scenario::ClientPause)
    }
}

fn plan_from(args: &RedlockArgs) -> Result<Plan> {
    let given = !args.master.is_empty();
    let n = if given {
        args.master.len()
    } else {
        args.masters
    };
    if given && (!(3..=9).contains(&n) || n.is_multiple_of(2)) {
        crate::bail_usage!(
            "--master given {n} times: name an odd number of masters from 3 to 9 (an even one adds a master and no safety)"
        );
    }
    if args.instance_timeout * (n as u32) * 2 >= args.ttl {
        crate::bail_usage!(
            "--instance-timeout {} × {n} masters = {} must stay below half of --ttl {} (below {}): use a shorter timeout or a longer TTL",
            human(args.instance_timeout),
            human(args.instance_timeout * (n as u32)),
            human(args.ttl),
            human(args.ttl / 2)
        );
    }
    let wanted: Vec<Scenario> = match args.scenario {
        Some(one) => vec![one],
        None => ALL.to_vec(),
    };
    let (skipped, scenarios): (Vec<Scenario>, Vec<Scenario>) = wanted
        .into_iter()
        .partition(|s| given && s.needs_own_masters());
    if scenarios.is_empty() {
        crate::bail_usage!(
            "{}: it needs masters lockslab starts itself (it kills, freezes and restarts them); run it without --master",
            skipped[0].command_name()
        );
    }
    Ok(Plan {
        settings: Settings {
            ttl: args.ttl,
            drift_factor: args.drift_factor,
            instance_timeout: args.instance_timeout,
            retry_delay_max: args.retry,
            round: args.round,
        },
        given: args.master.clone(),
        n,
        scenarios,
        skipped,
        redis_url_ignored: !given && args.servers.redis_url.is_some(),
    })
}

/// `lockslab redlock`.
pub fn run(args: &RedlockArgs) -> Result<()> {
    let mut plan = plan_from(args)?;
    runner::run(&mut plan, &args.output, &args.servers)
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "redlock"
    }

    /// The masters are the lab's own (or `--master`): only client-pause's store is asked for.
    fn needs(&self) -> Vec<Backend> {
        if self.needs_store() {
            vec![Backend::Postgres]
        } else {
            Vec::new()
        }
    }

    /// Only a word on a Redis URL it does not use: the lines under the heading describe
    /// the masters, which [`Scene::start`] starts (or checks) first, in [`Lab::play`].
    fn intro(&self, _run: &Run) -> Vec<String> {
        self.redis_url_ignored
            .then(|| {
                format!(
                    "  {}",
                    "(the Redis URL given is not used: Redlock needs independent masters, and \
                     this lab kills and restarts them, so it starts its own; --master names \
                     yours)"
                        .dimmed()
                )
            })
            .into_iter()
            .collect()
    }

    /// The run's keys on masters of the user's, and client-pause's rows and sequence.
    fn leftovers(&self, run: &Run, mut leftovers: Leftovers) -> Leftovers {
        for url in &self.given {
            leftovers = leftovers.redis(url);
        }
        if self.needs_store() {
            let url = run.url(Backend::Postgres);
            leftovers = leftovers.store(url).sql(
                url,
                &format!("DROP SEQUENCE IF EXISTS {}", redlock_sequence_of(&run.id)),
            );
        }
        leftovers
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        let mut scene = Scene::start(self, run)?;
        let mut scenarios = Vec::new();
        for scenario in &self.scenarios {
            super::step::checkpoint(super::step::redlock::before(scenario.command_name()));
            match scenario {
                Scenario::Minority => scenarios.extend(scene.play_minority()?),
                Scenario::Restart => scenarios.extend(scene.play_restart()?),
                Scenario::ClockJump => scenarios.push(scene.play_clock_jump()?),
                Scenario::Partition => scenarios.extend(scene.play_partition()?),
                Scenario::ClientPause => {
                    let store = run.url(Backend::Postgres).to_string();
                    let sequence = redlock_sequence_of(&run.id);
                    scenarios.push(scene.play_client_pause(&store, &sequence)?);
                }
            }
        }
        Ok(Verdict {
            plan: self.clone(),
            scenarios,
        })
    }
}

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 6,
    command: "redlock",
    shows: "Redlock on five masters: quorum, validity, no fencing",
    takes: "6s",
    needs: &[Backend::Redis, Backend::Postgres],
    starts_its_own: Some("own 5 Redis"),
    walkthrough: "labs/06-redlock.md",
    session: 15,
    stops: 13,
    by_hand: &["redis-server", "redis-cli"],
};
