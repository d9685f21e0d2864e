//! A cell's fault as data: a [`Schedule`] timed from A's `working` (its lock taken), or
//! from the point where A stops itself, and ended once B has written — played by the
//! nemesis's one player, every stop, clock fault and held write an event of the history.
//!
//! ```text
//!  stall              pause A for 100ms after A's working, and again 20ms after each
//!                     time A says it runs again, up to --overrun past its lease;
//!                     resume A once B has written
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
use crate::lock::lease_guard::SAMPLE_EVERY;
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
        LeaseFault::Stall => stall(plan.stall_stop, lasts_ms, runs_again_after(plan).is_some())
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

/// The gap after which A's clock sampler says A runs again, under the stall: half a stop,
/// and no less than three samples' time (a busy machine's scheduling gaps are shorter). A
/// stop too short to tell from those gaps (under 60ms) is timed from A's work alone.
pub(super) fn runs_again_after(plan: &Plan) -> Option<Duration> {
    let at_least = SAMPLE_EVERY * 3;
    (plan.stall_stop >= at_least * 2).then(|| (plan.stall_stop / 2).max(at_least))
}

/// The stall: stops of `stop` from A's work until `lasts_ms`, and the stop B's write finds
/// ended then. With `from_a_running`, each stop after the first comes [`STALL_RUN`] after A
/// said it runs again (its sampler's first sample after the stop before): however busy the
/// machine, A ran between two stops, and no two stops and the run between look like one to
/// pause detection. Such a stop lasts `stop` from its SIGSTOP, however late that went out
/// (the cell plays it so: `Faults::pauses_lasting_from_sigstop`): a stop cut short below
/// the sampler's gap is one A never says it ran again after, and the stall would end
/// there. Without it (stops too short to tell), [`STALL_RUN`] after the SIGCONT, the last
/// stop cut short at `lasts_ms`.
fn stall(stop: Duration, lasts_ms: u64, from_a_running: bool) -> Vec<Step> {
    let (stop_ms, run_ms) = (stop.as_millis() as u64, STALL_RUN.as_millis() as u64);
    let mut steps = Vec::new();
    let mut at_ms = 0;
    while at_ms < lasts_ms {
        let stops = steps.len() as u32;
        let mut pause = match stops {
            0 => step(a_working(), 0, Fault::Pause, "A"),
            _ if from_a_running => step(a_running_again(stops), run_ms, Fault::Pause, "A"),
            _ => step(a_working(), at_ms, Fault::Pause, "A"),
        };
        pause.duration_ms = Some(match from_a_running {
            true => stop_ms,
            false => stop_ms.min(lasts_ms - at_ms),
        });
        steps.push(pause);
        at_ms += stop_ms + run_ms;
    }
    steps.push(step(b_done(), 0, Fault::Resume, "A"));
    steps
}

/// A said for the `nth` time that it runs again after a stop.
fn a_running_again(nth: u32) -> Anchor {
    Anchor::on("A", Kind::Resumed, nth)
}

/// What the timeline says of each of the cell's faults: `schedule` is the cell's (a step
/// timed from B's write ends the fault because B has written).
pub(super) fn words(
    plan: &Plan,
    fault: LeaseFault,
    schedule: Schedule,
) -> impl FnMut(&Cue) -> Note + 'static {
    let (pause, overrun, clock_step) = (plan.pause, plan.overrun, plan.clock_step);
    let from_a_running = runs_again_after(plan).is_some();
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
            (Fault::Resume, LeaseFault::Stall) if from_a_running => format!(
                "SIGCONT after {held}: A runs {} from when it says it runs again",
                human(STALL_RUN)
            ),
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
