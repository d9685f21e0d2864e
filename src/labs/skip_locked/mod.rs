//! Lab 3 — a job queue in Postgres that needs no lock service: `FOR UPDATE SKIP LOCKED`.
//!
//! Ten worker processes share one jobs table. Each one loops: claim a pending job, work on
//! it, record that it processed it, mark it done. Three ways to claim, side by side below:
//!
//! ```text
//!  naive        SELECT a pending id … UPDATE it to 'running'   two workers read the same id
//!  for-update   … FOR UPDATE             inside a transaction   correct, but one at a time
//!  skip-locked  … FOR UPDATE SKIP LOCKED inside a transaction   correct, and nobody waits
//! ```
//!
//! The row lock taken by `FOR UPDATE` belongs to the claiming transaction, and the
//! transaction belongs to the worker's connection. That is the whole trick: when a worker
//! *process* dies, its kernel closes its socket, Postgres sees the connection end, rolls
//! the transaction back, and the row is free again within milliseconds — no TTL to wait
//! out. When a worker merely *pauses* (SIGSTOP), its socket stays open and so does its
//! lock: nobody else processes its job, and nothing is done twice.
//!
//! The fast release needs a kernel that survives to close the socket. When the worker's
//! whole *machine* dies (power loss, kernel panic) or the network between them breaks, no
//! FIN or RST is ever sent: Postgres sees an open connection that says nothing — exactly
//! the paused worker of round 3, not the killed one of round 2 — and keeps the lock until
//! a timeout notices: TCP keepalives (Linux's defaults declare a silent peer dead after
//! about 2 h 11 min) or `idle_in_transaction_session_timeout`. Keepalives free a dead or
//! unreachable *machine* only: a paused process's kernel is alive and answers their probes,
//! so they never end a frozen worker's session. Only server-side timeouts bound that one —
//! `idle_in_transaction_session_timeout`, `idle_session_timeout`, and `transaction_timeout`
//! from Postgres 17. The first (`--idle-timeout`) is the lab's answer to a paused worker:
//! Postgres ends the session, the sleeper's first statement after waking fails, and still
//! nothing is done twice.
//!
//! A run has up to three rounds per mode, each on a fresh batch of jobs:
//! 1. the queue — every worker drains the batch, no faults; this round's speed is
//!    the mode's jobs/s;
//! 2. the kill — one worker claims a job and is SIGKILLed before it commits;
//! 3. the freeze — one worker claims a job and is SIGSTOPped for `--pause`.
//!
//! Every processing goes into an append-only table with no unique constraint, so a job
//! done twice is visible there. The verdict is read back from that table with SQL.

mod freeze;
mod kill;
mod play;
mod round;
mod verdict;
pub use verdict::{ModeReplayed, check, replay, replay_mode};

use std::time::Duration;

use anyhow::Result;

use super::runner::{self, Lab, Run};
use super::{LONGEST_LAB_WAIT, LONGEST_STEP, OutputArgs, duration_in};
use crate::connect::Backend;
use crate::output::human;
use crate::queue::{Mode, Queue};
use crate::servers::ServerArgs;
use play::Play;
pub use verdict::ModeVerdict;
use verdict::Verdict;

/// Lab 3: a Postgres job queue with FOR UPDATE SKIP LOCKED; kill and freeze a worker
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab skip-locked                        skip-locked mode: the queue, a
                                              kill, a freeze
  lockslab skip-locked --mode naive           SELECT then UPDATE: watch the
                                              duplicates
  lockslab skip-locked --compare              all three modes, one table
  lockslab skip-locked --idle-timeout 500ms   Postgres ends the frozen worker's
                                              session
  lockslab skip-locked --fault none --work 0ms --jobs 5000   just the speed
  lockslab skip-locked --json | jq .          events and verdict as JSON Lines

With --json every event carries t_ms (one clock for the whole run, --compare
included) and mode (skip-locked, naive or for-update): split a --compare stream
on mode.

By hand, with psql in three terminals: see labs/03-skip-locked.md.", crate::lab_exit_status_help!()))]
pub struct SkipLockedArgs {
    /// How workers claim a job
    #[arg(long, value_enum, default_value_t = Mode::SkipLocked, conflicts_with = "compare")]
    pub mode: Mode,
    /// Run all three modes on the same job count and print one table
    #[arg(long)]
    pub compare: bool,
    /// Jobs in the first round's queue, 1 to 100000 (the kill and freeze rounds use
    /// min(jobs, 5 × workers))
    #[arg(long, default_value_t = 200, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub jobs: u32,
    /// Worker processes
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub workers: u32,
    /// Simulated work per job, inside the claim (the transaction, where there is one); at most 1m
    #[arg(long, default_value = "5ms", value_parser = duration_in(Duration::ZERO, LONGEST_STEP),
          value_name = "DURATION")]
    pub work: Duration,
    /// naive mode: the gap between reading a pending id and marking it taken (at most 1m)
    #[arg(long, default_value = "1ms", value_parser = duration_in(Duration::ZERO, LONGEST_STEP),
          value_name = "DURATION")]
    pub window: Duration,
    /// Which faults to inject after the first round
    #[arg(long, value_enum, default_value_t = Fault::Both)]
    pub fault: Fault,
    /// How long the frozen worker stays frozen (100ms to 10m)
    #[arg(long, default_value = "2s",
          value_parser = duration_in(Duration::from_millis(100), LONGEST_LAB_WAIT),
          value_name = "DURATION")]
    pub pause: Duration,
    /// Let Postgres end sessions idle in a transaction this long
    /// (idle_in_transaction_session_timeout); 500ms to 10m
    #[arg(long, value_parser = duration_in(Duration::ZERO, LONGEST_LAB_WAIT), value_name = "DURATION")]
    pub idle_timeout: Option<Duration>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A kill, then a freeze
    Both,
    /// SIGKILL a worker that holds a job
    Kill,
    /// SIGSTOP a worker that holds a job, for --pause
    Freeze,
    /// Only the first round: the queue and its speed
    None,
}

impl Fault {
    /// The name as typed on the command line.
    fn name(self) -> &'static str {
        match self {
            Fault::Both => "both",
            Fault::Kill => "kill",
            Fault::Freeze => "freeze",
            Fault::None => "none",
        }
    }
    pub(crate) fn kills(self) -> bool {
        matches!(self, Fault::Both | Fault::Kill)
    }
    pub(crate) fn freezes(self) -> bool {
        matches!(self, Fault::Both | Fault::Freeze)
    }
}

/// How long the lab waits after the others start before it kills the victim: long
/// enough to see them carry on (or not, in for-update mode).
const KILL_AFTER: Duration = Duration::from_millis(200);

/// The lab as the flags ask for it, checked once, before any server is touched.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// The claiming modes to play, in order (one, or all three with `--compare`).
    pub(crate) modes: Vec<Mode>,
    pub(crate) jobs: u32,
    pub(crate) workers: u32,
    pub(crate) work: Duration,
    pub(crate) window: Duration,
    pub(crate) fault: Fault,
    pub(crate) pause: Duration,
    pub(crate) idle_timeout: Option<Duration>,
}

impl Plan {
    /// Jobs in the kill and freeze rounds.
    pub(crate) fn fault_jobs(&self) -> u32 {
        self.jobs.min(self.workers * 5)
    }
}

/// `lockslab skip-locked`.
pub fn run(args: &SkipLockedArgs) -> Result<()> {
    let mut plan = plan_from(args)?;
    runner::run(&mut plan, &args.output, &args.servers)
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "skip-locked"
    }

    fn needs(&self) -> Vec<Backend> {
        vec![Backend::Postgres]
    }

    fn intro(&self, _run: &Run) -> Vec<String> {
        vec![format!(
            "A jobs table in Postgres and {} worker processes. Each worker claims a job (takes \
             a pending job and marks it taken, so that no other worker picks it up), works {}, \
             records the processing in an append-only table, and marks the job done.",
            self.workers,
            human(self.work)
        )]
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        // One stage, one clock for every mode: with --compare, t_ms keeps growing across the
        // three, and the `mode` tag tells their events apart.
        let mut stage = run.stage();
        let mut modes = Vec::new();
        for &mode in &self.modes {
            stage.tags().mode = Some(mode.name().into());
            stage.checkpoint(super::step::skip_locked::before(mode.name()));
            let play = Play {
                plan: self,
                mode,
                style: run.style,
                url: run.url(Backend::Postgres),
                queue: Queue::new(&run.id, mode),
                run_id: &run.id,
            };
            modes.push(play.run(&mut stage)?);
        }
        Ok(Verdict {
            modes,
            pause: self.pause,
            fault: self.fault,
        })
    }
}

fn plan_from(args: &SkipLockedArgs) -> Result<Plan> {
    if args.jobs == 0 {
        crate::bail_usage!("--jobs 0: the queue needs at least one job");
    }
    let (needed, why) = match args.fault {
        Fault::Both => (3, "one to kill, one to freeze, one to carry on"),
        Fault::Kill => (2, "one to kill, one to carry on"),
        Fault::Freeze => (2, "one to freeze, one to carry on"),
        Fault::None => (1, "someone has to work the queue"),
    };
    super::enough_workers(args.workers, args.fault.name(), needed, why)?;
    if let Some(idle) = args.idle_timeout {
        if idle < Duration::from_millis(500) {
            crate::bail_usage!(
                "--idle-timeout {}: use at least 500ms; the worker the lab kills holds its job about {} \
                 before the kill, and Postgres must not end its session first",
                human(idle),
                human(KILL_AFTER)
            );
        }
        if args.work * 4 > idle {
            crate::bail_usage!(
                "--idle-timeout {} is too close to --work {}: a worker is idle in its transaction \
                 while it works, and Postgres would end ordinary workers' sessions",
                human(idle),
                human(args.work)
            );
        }
    }
    Ok(Plan {
        modes: if args.compare {
            Mode::ALL.to_vec()
        } else {
            vec![args.mode]
        },
        jobs: args.jobs,
        workers: args.workers,
        work: args.work,
        window: args.window,
        fault: args.fault,
        pause: args.pause,
        idle_timeout: args.idle_timeout,
    })
}

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 3,
    command: "skip-locked",
    shows: "a Postgres job queue: kill and freeze a worker",
    takes: "3s",
    needs: &[Backend::Postgres],
    starts_its_own: None,
    walkthrough: "labs/03-skip-locked.md",
    session: 10,
    stops: 2,
    by_hand: &["psql", "jq"],
};
