//! Lab 9 — every defence short of fencing, and the gap each one leaves.
//!
//! A matrix: each lease guard of [`crate::lock::lease_guard`] against each fault, one cell
//! at a time, on a real Redis lock and the real fenced store:
//!
//! ```text
//!  A  takes the lock ── works ── (fault) ── guard: may I still write? ── writes / gives up
//!  B        waits… lock expires ──▶ takes the lock, writes ✓, holds it
//! ```
//!
//! The faults: A stops (SIGSTOP) before its guard's check, or between the check and the
//! write; the nemesis stalls A in short repeated stops while it works; A's write, sent on
//! time, is held in flight by the fault proxy ([`crate::proxy`]) on A's path to the store;
//! A's wall clock is stepped back while it works (libfaketime in A only: the machine's clock, Redis's and every monotonic clock stay true); A simply works longer
//! than its lease. A fault lasts until B has written, or `--overrun` past A's lease at most
//! (so that a guard which keeps the lock from B — renewal, lock-delay — is seen to work);
//! the pause after the check lasts until B has written however long that takes. With the
//! defaults B writes long before the overrun runs out wherever it can, so the order is the
//! story's, not the machine's speed.
//!
//! - [`play`]: one cell;
//! - [`schedule`]: its fault as data, played by the nemesis's one player;
//! - [`verdict`]: the matrix, read back from the store by [`crate::check::lease_guard`].

mod play;
mod schedule;
pub mod verdict;
pub use verdict::{check, replay};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::Result;
use serde::Serialize;

use super::leftovers::Leftovers;
use super::runner::{self, Lab, Run};
use super::stage::History;
use super::{OutputArgs, duration_in};
use crate::connect::Backend;
use crate::lock::lease_guard::Guard;
use crate::output::human;
use crate::servers::ServerArgs;
use crate::store::Store;
use verdict::{CellVerdict, Verdict};

/// Lab 9: lease guards short of fencing (deadlines, margins, asking the lock, pause
/// detection, renewal, lock-delay), each against pauses, wrong wall clocks and long
/// work: the gap each one leaves, and what each costs
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab lease-guard                    every guard against every fault
  lockslab lease-guard --fault pause-after-check
                                          the pause no guard can see
  lockslab lease-guard --guard wall-deadline --guard monotonic-deadline
          --fault clock-back              a wall clock stepped back: one guard
                                          believes it, the other does not
  lockslab lease-guard --guard lock-delay --fault long-work --overrun 2s
                                          an overrun longer than the lock-delay
  lockslab lease-guard --guard pause-detect --guard renew-third --fault stall
                                          short stops: unseen, and not starving
  lockslab lease-guard --guard wall-deadline --fault clock-back
          --clock-step 300ms              just past the margin: a stale write
  lockslab lease-guard --json | jq .      events and verdict as JSON Lines

The default run plays 64 cells in about 15 s, eight side by side (--parallel).

The clock faults need libfaketime (apt-get install faketime); without it the
lab leaves those columns out and says so.", crate::lab_exit_status_help!()))]
pub struct LeaseGuardArgs {
    /// Guards to play, repeatable [default: all]
    #[arg(long, value_enum, value_name = "GUARD")]
    pub guard: Vec<Guard>,
    /// Faults to play, repeatable [default: all]
    #[arg(long, value_enum, value_name = "FAULT")]
    pub fault: Vec<LeaseFault>,
    /// How long the lock lives in Redis (300ms to 10s)
    #[arg(long, default_value = "1s", value_name = "DURATION",
          value_parser = duration_in(Duration::from_millis(300), Duration::from_secs(10)))]
    pub ttl: Duration,
    /// The guards' safety margin, given up to clock drift and slow replies (less than
    /// the TTL)
    #[arg(long, default_value = "200ms", value_name = "DURATION",
          value_parser = duration_in(Duration::ZERO, Duration::from_secs(10)))]
    pub margin: Duration,
    /// How far clock-back steps A's wall clock back (10ms to 1h)
    #[arg(long, default_value = "30s", value_name = "DURATION",
          value_parser = duration_in(Duration::from_millis(10), Duration::from_secs(3600)))]
    pub clock_step: Duration,
    /// How long after its lease A's fault lasts at most, if B has not written first
    #[arg(long, default_value = "500ms", value_name = "DURATION",
          value_parser = duration_in(Duration::ZERO, Duration::from_secs(60)))]
    pub overrun: Duration,
    /// How long the pause faults stop A [default: until B has written, or --overrun past
    /// A's lease]; shorter than the lease, A wakes with time left (where pause detection
    /// flips: at the margin)
    #[arg(long, value_name = "DURATION",
          value_parser = duration_in(Duration::ZERO, Duration::from_secs(60)))]
    pub pause: Option<Duration>,
    /// How long each of the stall's stops lasts (10ms to 10s); A runs 20ms between two; a
    /// stop ends early once B has written
    #[arg(long, default_value = "100ms", value_name = "DURATION",
          value_parser = duration_in(Duration::from_millis(10), Duration::from_secs(10)))]
    pub stall_stop: Duration,
    /// lock-delay's D: how long Redis refuses the lock after a lease ran out (0 to 60s,
    /// Consul's range)
    #[arg(long, default_value = "1s", value_name = "DURATION",
          value_parser = duration_in(Duration::ZERO, Duration::from_secs(60)))]
    pub lock_delay: Duration,
    /// Cells played side by side, each on its own key, resource and workers; each cell's
    /// lines are shown together once it ends, in the table's order (1: one at a time, shown
    /// as they happen; --step plays one at a time)
    #[arg(long, default_value_t = DEFAULT_PARALLEL, value_name = "P",
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub parallel: u32,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// How many cells play side by side by default. A cell spends most of its time waiting
/// (for A's lease to run out, for B to be let in), not computing: on two cores, eight at
/// once play the 64 cells in about a fifth of the time one at a time takes, and no cell's
/// order of events depends on how busy the machine is (each fault ends on B's write).
pub const DEFAULT_PARALLEL: u32 = 8;

/// How long the stall lets A run between two stops: long enough for a renewal's round
/// trip to a local Redis, short beside every stop but the shortest.
pub(crate) const STALL_RUN: Duration = Duration::from_millis(20);

/// What goes wrong in a cell.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseFault {
    /// A stops (SIGSTOP) after its work, before its guard looks, until B has written (or
    /// --overrun past its lease)
    PauseBeforeCheck,
    /// A's guard says yes; A stops before the write goes out, until B has written
    PauseAfterCheck,
    /// The nemesis stops A (SIGSTOP) and continues it (SIGCONT) over and over while it
    /// works — stops of --stall-stop, 20ms runs between — until B has written (or
    /// --overrun past A's lease)
    Stall,
    /// A's guard says yes and A sends its write at once; the fault proxy on A's path to
    /// the store holds the write in flight until B has written (or --overrun past A's
    /// lease). A is never paused
    DelayedWrite,
    /// A's wall clock is stepped back while it works past its lease (libfaketime, in A
    /// only)
    ClockBack,
    /// No fault at all: A's work simply outlasts its lease
    LongWork,
    /// A's wall clock runs at half speed while it works past its lease (libfaketime, in A
    /// only)
    ClockSlow,
    /// A's wall clock runs three times too fast; A checks halfway through its lease
    /// (libfaketime, in A only)
    ClockFast,
}

impl LeaseFault {
    pub const ALL: [LeaseFault; 8] = [
        LeaseFault::PauseBeforeCheck,
        LeaseFault::PauseAfterCheck,
        LeaseFault::Stall,
        LeaseFault::DelayedWrite,
        LeaseFault::ClockBack,
        LeaseFault::LongWork,
        LeaseFault::ClockSlow,
        LeaseFault::ClockFast,
    ];

    /// A fault that needs libfaketime in A.
    pub fn moves_the_clock(self) -> bool {
        matches!(
            self,
            LeaseFault::ClockBack | LeaseFault::ClockSlow | LeaseFault::ClockFast
        )
    }

    /// The rate A's wall clock runs at, in percent of true time (the rate faults).
    pub fn clock_rate_percent(self) -> Option<u32> {
        match self {
            LeaseFault::ClockSlow => Some(50),
            LeaseFault::ClockFast => Some(300),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LeaseFault::PauseBeforeCheck => "pause-before-check",
            LeaseFault::PauseAfterCheck => "pause-after-check",
            LeaseFault::Stall => "stall",
            LeaseFault::DelayedWrite => "delayed-write",
            LeaseFault::ClockBack => "clock-back",
            LeaseFault::LongWork => "long-work",
            LeaseFault::ClockSlow => "clock-slow",
            LeaseFault::ClockFast => "clock-fast",
        }
    }
}

/// The lab as the flags ask for it, checked once.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) guards: Vec<Guard>,
    pub(crate) faults: Vec<LeaseFault>,
    pub(crate) ttl: Duration,
    pub(crate) margin: Duration,
    pub(crate) clock_step: Duration,
    pub(crate) overrun: Duration,
    pub(crate) pause: Option<Duration>,
    pub(crate) stall_stop: Duration,
    pub(crate) lock_delay: Duration,
    /// Cells played side by side (`--parallel`).
    pub(crate) parallel: usize,
    /// The clock fault was asked for (or defaulted) but this machine has no libfaketime.
    pub(crate) clock_left_out: bool,
}

impl Plan {
    fn from(args: &LeaseGuardArgs) -> Result<Plan> {
        if args.margin >= args.ttl {
            crate::bail_usage!(
                "--margin {}: it must be less than the TTL ({})",
                human(args.margin),
                human(args.ttl)
            );
        }
        let mut guards = if args.guard.is_empty() {
            Guard::ALL.to_vec()
        } else {
            args.guard.clone()
        };
        super::first_of_each(&mut guards);
        let mut faults = if args.fault.is_empty() {
            LeaseFault::ALL.to_vec()
        } else {
            args.fault.clone()
        };
        super::first_of_each(&mut faults);
        let mut clock_left_out = false;
        if crate::nemesis::clock::library().is_none()
            && let Some(clock) = faults.iter().find(|f| f.moves_the_clock())
        {
            if !args.fault.is_empty() {
                crate::bail_usage!(
                    "--fault {} moves A's wall clock with libfaketime, which this machine lacks (apt-get install faketime)",
                    clock.as_str()
                );
            }
            faults.retain(|f| !f.moves_the_clock());
            clock_left_out = true;
        }
        Ok(Plan {
            guards,
            faults,
            ttl: args.ttl,
            margin: args.margin,
            clock_step: args.clock_step,
            overrun: args.overrun,
            pause: args.pause,
            stall_stop: args.stall_stop,
            lock_delay: args.lock_delay,
            parallel: args.parallel as usize,
            clock_left_out,
        })
    }
}

/// `lockslab lease-guard`.
pub fn run(args: &LeaseGuardArgs) -> Result<()> {
    let mut plan = Plan::from(args)?;
    runner::run(&mut plan, &args.output, &args.servers)
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "lease-guard"
    }

    fn needs(&self) -> Vec<Backend> {
        vec![Backend::Redis, Backend::Postgres]
    }

    fn intro(&self, _run: &Run) -> Vec<String> {
        let mut lines = vec![format!(
            "{}: each guard against each fault. A holds a Redis lock with a {} TTL (guards keep a {} margin); B takes the lock once Redis lets it go and writes; then A's guard decides whether A may still write.",
            match self.guards.len() * self.faults.len() {
                1 => "1 cell".to_string(),
                cells => format!("{cells} cells"),
            },
            human(self.ttl),
            human(self.margin)
        )];
        lines.push(match self.pause {
            Some(pause) => format!(
                "A fault lasts until B has written, or {} past A's lease at most; each pause lasts {} (--pause).",
                human(self.overrun),
                human(pause)
            ),
            None => format!(
                "A fault lasts until B has written, or {} past A's lease at most; the pause after the check, until B has written.",
                human(self.overrun)
            ),
        });
        let cells = self.guards.len() * self.faults.len();
        if self.parallel > 1 && cells > 1 && !crate::labs::step::stepping() {
            lines.push(format!(
                "Cells play {} side by side, each on its own key and workers, and each is shown whole once it ends, in the table's order: the clock jumps back from one cell to the next (--parallel 1: one at a time).",
                self.parallel.min(cells)
            ));
        }
        if self.guards.contains(&Guard::LockDelay) {
            lines.push(format!(
                "lock-delay: Redis refuses the lock to everyone but A for {} after A's lease (modelled on Consul's lock-delay).",
                human(self.lock_delay)
            ));
        }
        if self.faults.contains(&LeaseFault::Stall) {
            lines.push(format!(
                "stall: the lab's fault player (the nemesis, as Jepsen calls it) stops A for {} (SIGSTOP), lets it run {} (SIGCONT), and again, every stop recorded, until B has written or the overrun is up.",
                human(self.stall_stop),
                human(STALL_RUN)
            ));
        }
        if self.faults.contains(&LeaseFault::DelayedWrite) {
            lines.push(
                "delayed-write: A reaches the store through the fault proxy (lab 8's), which holds A's write in flight; A's process runs throughout."
                    .into(),
            );
        }
        if self.faults.contains(&LeaseFault::ClockBack) {
            lines.push(format!(
                "clock-back steps A's wall clock back {} with libfaketime, in A only: the machine's clock, Redis's clock and A's monotonic clock stay true.",
                human(self.clock_step)
            ));
        }
        if self.faults.iter().any(|f| f.clock_rate_percent().is_some()) {
            lines.push(
                "clock-slow runs A's wall clock at half speed, clock-fast at three times (libfaketime's speed factor, in A only; it scales A's sleeps too); clock-fast's A checks halfway through its lease."
                    .into(),
            );
        }
        if self.clock_left_out {
            lines.push(
                "clock-back, clock-slow and clock-fast left out: this machine has no libfaketime (apt-get install faketime)."
                    .into(),
            );
        }
        lines
    }

    fn leftovers(&self, run: &Run, leftovers: Leftovers) -> Leftovers {
        leftovers
            .store(run.url(Backend::Postgres))
            .redis(run.url(Backend::Redis))
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        let mut store = Store::connect(run.url(Backend::Postgres))?;
        store.prepare()?;
        let order: Vec<(LeaseFault, Guard)> = (self.faults.iter())
            .flat_map(|&fault| self.guards.iter().map(move |&guard| (fault, guard)))
            .collect();
        let plan: &Plan = self;
        let cell = |&(fault, guard): &(LeaseFault, Guard), history: &History| play::Cell {
            plan,
            run,
            history: history.clone(),
            fault,
            guard,
        };
        // `--step` stops before a fault's first cell and waits for Enter: one at a time, as
        // a single cell is, shown as it happens.
        let cells = if plan.parallel.min(order.len()) <= 1 || crate::labs::step::stepping() {
            let mut cells = Vec::new();
            for each in &order {
                cells.push(if self.told_in_one_line(each.1, run.style.json) {
                    let (verdict, _lines) =
                        crate::output::held_back(|| cell(each, &run.history).play(&mut store));
                    let verdict = verdict?;
                    crate::prose!("  guard {:<18} {}", each.1.as_str(), verdict.word());
                    verdict
                } else {
                    cell(each, &run.history).play(&mut store)?
                });
            }
            cells
        } else {
            side_by_side(&order, plan.parallel, run, |each, history, store| {
                cell(each, history).play(store)
            })?
        };
        Ok(Verdict {
            cells,
            plan: self.clone(),
        })
    }
}

impl Plan {
    /// Under `--step`, a fault's story is told in full once, by its first guard's cell;
    /// every other guard's cell against it plays the same way (its events are in the
    /// history, `--json` and the picture) and shows one line, its outcome: seven more
    /// timelines that differ in one line would bury the question.
    /// `--json` prints every event of every cell: JSON Lines have no screens to spare.
    fn told_in_one_line(&self, guard: Guard, json: bool) -> bool {
        crate::labs::step::stepping() && !json && self.guards.first() != Some(&guard)
    }
}

/// Plays `order`'s cells `parallel` at a time, each lane with its own connection to the
/// store, and hands them back in `order`'s. Each cell's lines and events are kept apart
/// while it plays, then printed and added to the run's history whole, cell after cell in
/// `order`, as soon as every cell before it is in: the timeline reads as one at a time
/// would, only its clock (the run's) overlaps from one cell to the next.
fn side_by_side<Each: Sync>(
    order: &[Each],
    parallel: usize,
    run: &Run,
    play: impl Fn(&Each, &History, &mut Store) -> Result<CellVerdict> + Sync,
) -> Result<Vec<CellVerdict>> {
    let taken = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(usize, Result<CellVerdict>, Vec<String>, History)>();
    let mut cells = Vec::new();
    let mut failed = None;
    std::thread::scope(|scope| {
        for _ in 0..parallel.min(order.len()) {
            let (tx, taken, stop, play) = (tx.clone(), &taken, &stop, &play);
            scope.spawn(move || {
                let mut store = match Store::connect(run.url(Backend::Postgres)) {
                    Ok(store) => store,
                    Err(err) => {
                        stop.store(true, Ordering::Release);
                        let _ = tx.send((usize::MAX, Err(err), Vec::new(), History::default()));
                        return;
                    }
                };
                while !stop.load(Ordering::Acquire) && !crate::procs::interrupted() {
                    let nth = taken.fetch_add(1, Ordering::AcqRel);
                    let Some(each) = order.get(nth) else { break };
                    let history = History::default();
                    let (outcome, lines) =
                        crate::output::held_back(|| play(each, &history, &mut store));
                    if outcome.is_err() {
                        stop.store(true, Ordering::Release);
                    }
                    if tx.send((nth, outcome, lines, history)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut waiting = BTreeMap::new();
        let mut shown = 0;
        for (nth, outcome, lines, history) in rx {
            waiting.insert(nth, (outcome, lines, history));
            while let Some((outcome, lines, history)) = waiting.remove(&shown) {
                crate::output::print_held(&lines);
                run.history.append(&history);
                match outcome {
                    Ok(cell) => cells.push(cell),
                    Err(err) => {
                        failed.get_or_insert(err);
                    }
                }
                shown += 1;
            }
        }
        // Past a failed cell: what the others printed, still in order.
        for (_, (outcome, lines, history)) in std::mem::take(&mut waiting) {
            crate::output::print_held(&lines);
            run.history.append(&history);
            if let Err(err) = outcome {
                failed.get_or_insert(err);
            }
        }
    });
    match failed {
        Some(err) => Err(err),
        None => Ok(cells),
    }
}

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 9,
    command: "lease-guard",
    shows: "lease guards short of fencing, and the gap each leaves",
    takes: "10s",
    needs: &[Backend::Redis, Backend::Postgres],
    starts_its_own: None,
    walkthrough: "labs/09-lease-guard.md",
    session: 15,
    stops: 11,
    by_hand: &["libfaketime"],
};
