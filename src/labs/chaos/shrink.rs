//! Shrinking: a failing schedule made smaller — a fault fewer, a pause shorter, a fault
//! aimed at an earlier job, a client fewer — for as long as the smaller one still fails.
//! Timing varies from run to run, so each candidate is played up to `replays` times, and
//! one failure keeps it.

use anyhow::Result;
use colored::Colorize;

use std::sync::atomic::Ordering;

use super::play::{Setup, Trial};
use super::side_by_side::{self, Job};
use crate::check::chaos::Judgement;
use crate::nemesis::generate::nth_seed;
use crate::nemesis::schedule::{Schedule, Step};
use crate::output::Style;

/// At most this many histories are played while shrinking.
const BUDGET: u32 = 24;

/// The smaller schedules to try next, smallest change last.
fn candidates(schedule: &Schedule, clients: u32) -> Vec<(Schedule, u32)> {
    let mut out = Vec::new();
    // Never down to no fault at all: a design that fails with none failed on a machine that
    // starved its clients past the lease — a pause nobody scheduled, which no replay repeats.
    if schedule.steps().len() > 1 {
        for index in 0..schedule.steps().len() {
            out.push((schedule.without(index), clients));
        }
    }
    if clients > 2 {
        let last = super::play::client_names(clients).pop().unwrap_or_default();
        out.push((super::net::without_client(schedule, &last), clients - 1));
    }
    for (index, step) in schedule.steps().iter().enumerate() {
        if let Some(ms) = step.duration_ms.filter(|ms| *ms >= 200) {
            let shorter = Step {
                duration_ms: Some(ms * 2 / 3),
                ..step.clone()
            };
            out.push((schedule.with_step(index, shorter), clients));
        }
        if let Some(anchor) = step.after.as_ref().filter(|a| a.nth > 1) {
            let mut earlier = step.clone();
            if let Some(a) = earlier.after.as_mut() {
                a.nth = anchor.nth - 1;
            }
            out.push((schedule.with_step(index, earlier), clients));
        }
    }
    out
}

/// Shrinks `schedule` (which failed as `trial`); returns the smallest that still failed,
/// its clients, and the history in which it failed.
#[allow(clippy::too_many_arguments)]
pub fn shrink(
    setup: &Setup,
    style: Style,
    schedule: &Schedule,
    clients: u32,
    seed: u64,
    replays: u32,
    parallel: u32,
    trial: Trial,
) -> Result<(Schedule, u32, Trial)> {
    let mut best = (schedule.clone(), clients, trial);
    let played = std::sync::atomic::AtomicU32::new(0);
    if !style.json {
        crate::outln!();
        crate::outln!("{}", "Shrinking the failing schedule…".bold());
    }
    'smaller: loop {
        for (candidate, clients) in candidates(&best.0, best.1) {
            if played.load(Ordering::Acquire) >= BUDGET || crate::procs::interrupted() {
                break 'smaller;
            }
            // The candidate's replays side by side; the first to fail keeps it.
            let next = |nth: u64| {
                if nth >= u64::from(replays) {
                    return None;
                }
                let n = played.fetch_add(1, Ordering::AcqRel) + 1;
                (n <= BUDGET).then(|| {
                    let index = 1_000 + u64::from(n);
                    Job {
                        index,
                        seed: nth_seed(seed, index),
                        schedule: candidate.clone(),
                        clients,
                    }
                })
            };
            let replayed = side_by_side::play(setup, parallel.min(replays), true, next, |_| {})?;
            if let Some(failed) = replayed
                .into_iter()
                .find(|p| p.trial.report.judgement() == Judgement::Unsafe)
            {
                if !style.json {
                    crate::outln!(
                        "  still fails with {} fault(s), {clients} clients",
                        candidate.steps().len()
                    );
                }
                best = (candidate, clients, failed.trial);
                continue 'smaller;
            }
        }
        break;
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nemesis::Fault;

    #[test]
    fn candidates_drop_a_fault_a_client_and_shorten_a_pause() {
        let pause = Step {
            at_ms: 10,
            after: None,
            fault: Fault::Pause,
            target: "A".into(),
            duration_ms: Some(900),
        };
        let kill = Step {
            at_ms: 50,
            after: None,
            fault: Fault::Kill,
            target: "C".into(),
            duration_ms: None,
        };
        let schedule = Schedule::new(vec![pause, kill]);
        let all = candidates(&schedule, 3);
        assert_eq!(all[0].0.steps().len(), 1);
        assert_eq!(
            all[2],
            (Schedule::new(vec![schedule.steps()[0].clone()]), 2)
        );
        assert_eq!(all[3].0.steps()[0].duration_ms, Some(600));
        assert_eq!(all.len(), 4);
    }

    /// A client fewer takes the faults on its paths with it: a replay line naming a path of
    /// a client the run does not have would be refused.
    #[test]
    fn a_client_fewer_takes_its_network_faults_with_it() {
        let lost = Step {
            at_ms: 300,
            after: None,
            fault: Fault::DropReply,
            target: "C→redis".into(),
            duration_ms: None,
        };
        let delay = Step {
            at_ms: 0,
            after: None,
            fault: Fault::Delay,
            target: "A→store".into(),
            duration_ms: Some(900),
        };
        let schedule = Schedule::new(vec![lost, delay.clone()]);
        let fewer = candidates(&schedule, 3)
            .into_iter()
            .find(|(_, clients)| *clients == 2)
            .unwrap();
        assert_eq!(fewer.0, Schedule::new(vec![delay]));
    }
}
