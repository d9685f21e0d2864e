//! A cell's fault as data: a [`Schedule`] timed from A's `working` (its lock taken), or
//! from the point where A stops itself, and ended once B has written — played by the
//! nemesis's one player, every stop, clock fault and held write an event of the history.
//!
//! ```text
//!  stall              pause A for 100ms at +0, +120ms, +240ms… after A's working,
//!                     up to --overrun past its lease; resume A once B has written
//!  pause-before-check pause A where it stops itself; resume it once B has written,
//!                     or --overrun past its lease
//!  delayed-write      hold A→store after A's working; heal once B has written, or
//!                     --overrun past its lease
//!  clock-back         clock_step A by −30s after A's working
//! ```

use std::time::Duration;

use super::{LeaseFault, Plan, STALL_RUN};
use crate::events::Kind;
use crate::labs::faults::Cue;
use crate::nemesis::schedule::{Anchor, How, Kinds, Schedule, Step};
use crate::nemesis::{Fault, Note};
use crate::output::human;

/// The proxy path the delayed write is held on: A's link to the store.
pub(super) const STORE_PATH: &str = "A→store";

/// A took the lock and works.
fn a_working() -> Anchor {
    Anchor::on("A", Kind::Working, 1)
}

/// B has written, or given up: the fault has done what it is there for.
fn b_done() -> Anchor {
    Anchor::on("B", Kinds::Any(vec![Kind::Wrote, Kind::GaveUp]), 1)
}

fn step(after: Anchor, at_ms: u64, fault: Fault, target: &str) -> Step {
    Step {
        at_ms,
        after: Some(after),
        fault,
        target: target.into(),
        duration_ms: None,
    }
}

/// The cell's fault, timed from A's work and ended by B's write (or `--overrun` past A's
/// lease): what the nemesis does to A, its clock, or its path to the store.
pub(super) fn of(plan: &Plan, fault: LeaseFault) -> Schedule {
    let plain = |step: Step| (step, How::default());
    // How long after A's grant its fault lasts at most, B not having written.
    let lasts_ms = (plan.ttl + plan.overrun).as_millis() as u64;
    let steps: Vec<(Step, How)> = match fault {
        LeaseFault::ClockSlow | LeaseFault::ClockFast => vec![(
            step(a_working(), 0, Fault::ClockRate, "A"),
            How {
                rate_percent: fault.clock_rate_percent(),
                ..How::default()
            },
        )],
        LeaseFault::ClockBack => vec![(
            step(a_working(), 0, Fault::ClockStep, "A"),
            How {
                by_ms: Some(-(plan.clock_step.as_millis() as i64)),
                ..How::default()
            },
        )],
        LeaseFault::PauseBeforeCheck | LeaseFault::PauseAfterCheck => {
            let stops_itself = Anchor::on("A", Kind::Freezing, 1);
            let mut pause = step(stops_itself, 0, Fault::Pause, "A");
            pause.duration_ms = plan.pause.map(|pause| pause.as_millis() as u64);
            let mut steps = vec![pause, step(b_done(), 0, Fault::Resume, "A")];
            // Before the check, a pause lasts --overrun past the lease at most; after it,
            // until B has written however long that takes.
            if fault == LeaseFault::PauseBeforeCheck && plan.pause.is_none() {
                steps.push(step(a_working(), lasts_ms, Fault::Resume, "A"));
            }
            steps.into_iter().map(plain).collect()
        }
        LeaseFault::Stall => stall(plan.stall_stop, lasts_ms)
            .into_iter()
            .map(plain)
            .collect(),
        LeaseFault::DelayedWrite => [
            step(a_working(), 0, Fault::Hold, STORE_PATH),
            step(b_done(), 0, Fault::Heal, STORE_PATH),
            step(a_working(), lasts_ms, Fault::Heal, STORE_PATH),
        ]
        .into_iter()
        .map(plain)
        .collect(),
        LeaseFault::LongWork => Vec::new(),
    };
    Schedule::done_so(steps)
}

/// The stall: stops of `stop` with [`STALL_RUN`] between, from A's work until `lasts_ms`
/// (the last one cut short there), and the stop B's write finds ended then.
fn stall(stop: Duration, lasts_ms: u64) -> Vec<Step> {
    let (stop_ms, run_ms) = (stop.as_millis() as u64, STALL_RUN.as_millis() as u64);
    let mut steps = Vec::new();
    let mut at_ms = 0;
    while at_ms < lasts_ms {
        let mut pause = step(a_working(), at_ms, Fault::Pause, "A");
        pause.duration_ms = Some(stop_ms.min(lasts_ms - at_ms));
        steps.push(pause);
        at_ms += stop_ms + run_ms;
    }
    steps.push(step(b_done(), 0, Fault::Resume, "A"));
    steps
}

/// What the timeline says of each of the cell's faults: `schedule` is the cell's (a step
/// timed from B's write ends the fault because B has written).
pub(super) fn words(
    plan: &Plan,
    fault: LeaseFault,
    schedule: Schedule,
) -> impl FnMut(&Cue) -> Note + 'static {
    let (pause, overrun, clock_step) = (plan.pause, plan.overrun, plan.clock_step);
    let mut stops = 0;
    move |cue| {
        let step = cue.action.step.and_then(|i| schedule.steps().get(i));
        let after_b = step
            .and_then(|s| s.after.as_ref())
            .is_some_and(|a| a.worker == "B");
        let how = if after_b {
            "once B has written"
        } else {
            "B has not written yet"
        };
        let pid = cue.pid;
        let held = human(cue.held.unwrap_or_default());
        let untouched = "(libfaketime in A only; its monotonic clock and Redis's clock stay true)";
        Note::from(match (cue.action.fault, fault) {
            (Fault::ClockRate, _) => format!(
                "runs A's wall clock at {}% of true time {untouched}",
                cue.how.rate_percent.unwrap_or(100)
            ),
            (Fault::ClockStep, _) => {
                format!(
                    "steps A's wall clock back {} {untouched}",
                    human(clock_step)
                )
            }
            (Fault::Pause, LeaseFault::Stall) => {
                stops += 1;
                let up_to = Duration::from_millis(step.and_then(|s| s.duration_ms).unwrap_or(0));
                format!(
                    "stalls A (pid {pid}): SIGSTOP, up to {} (stop {stops})",
                    human(up_to)
                )
            }
            (Fault::Resume, LeaseFault::Stall) if after_b => {
                format!("SIGCONT after {held} (B had written)")
            }
            (Fault::Resume, LeaseFault::Stall) => {
                format!("SIGCONT after {held}: A runs for {}", human(STALL_RUN))
            }
            (Fault::Pause, _) => match (pause, fault) {
                (Some(pause), _) => format!(
                    "sees A (pid {pid}) stopped; resumes it after {} (--pause), or once B has written",
                    human(pause)
                ),
                (None, LeaseFault::PauseBeforeCheck) => format!(
                    "sees A (pid {pid}) stopped; resumes it once B has written, or {} past its lease",
                    human(overrun)
                ),
                _ => format!("sees A (pid {pid}) stopped; resumes it once B has written"),
            },
            (Fault::Resume, _) => format!("sends SIGCONT to A ({how})"),
            (Fault::Heal, _) => format!("the proxy lets A's write go, if A sent one ({how})"),
            (Fault::Hold, _) => "the proxy on A→store holds what A sends next: once A's guard \
                                 says yes, A's write leaves A and waits in flight"
                .to_string(),
            (other, _) => format!("{} {}", other.as_str(), cue.action.target),
        })
    }
}
