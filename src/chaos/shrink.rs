//! Shrinking: a failing schedule made smaller — a fault fewer, a pause aimed between a
//! read and its write (or inside the write's transaction), a pause shorter, a fault aimed
//! at an earlier job, a client fewer — for as long as the smaller one still fails.
//!
//! Timing varies from run to run, so each candidate is played `replays` times and kept only
//! if it failed in at least four in five of them (3 of 3 by default). A majority is not
//! enough: a candidate that breaks the design one time in two — a clock jump with one
//! client fewer to take the freed lock in the holder's last milliseconds — passes 2 of 3
//! half the time, and its replay command then fails as often as it works. And a pause timed by the clock is
//! re-aimed at the work: just after the client read its record, it fails whenever another
//! job writes that record before the pause ends; at a time, only when the time happens to
//! fall between a read and a write.

use anyhow::Result;
use colored::Colorize;

use std::sync::atomic::Ordering;

use super::play::{Setup, Trial};
use super::side_by_side::{self, Job};
use crate::check::chaos::Judgement;
use crate::events::Kind;
use crate::nemesis::Fault;
use crate::nemesis::generate::nth_seed;
use crate::nemesis::schedule::{Anchor, Schedule, Step};
use crate::output::{Style, count};

/// How often etcd's leader revokes the leases whose TTL ran out (its lessor's loop).
const ETCD_EXPIRY_CHECK_MS: u64 = 500;

/// At most this many histories are played while shrinking.
const BUDGET: u32 = 30;

/// Does a candidate that failed `failed` of `played` replays still fail? In four of five
/// at least: every one of three, eight of ten.
pub fn still_fails(failed: usize, played: usize) -> bool {
    played > 0 && failed * 5 >= played * 4
}

/// The smaller schedules to try next, smallest change last. A pause is shortened, but not
/// below `shortest_pause_ms`: one shorter than the lease breaks a design only when the
/// machine starves the client for the rest — a pause nobody scheduled, which few replays
/// repeat.
fn candidates(schedule: &Schedule, clients: u32, shortest_pause_ms: u64) -> Vec<(Schedule, u32)> {
    let mut out = Vec::new();
    // Never down to no fault at all: a design that fails with none failed on a machine that
    // starved its clients past the lease — a pause nobody scheduled, which no replay repeats.
    if schedule.steps().len() > 1 {
        // A clock jump on several of Redlock's masters at once goes as one first.
        out.extend(super::clock::without_each_jump(schedule).map(|s| (s, clients)));
        for index in 0..schedule.steps().len() {
            out.push((schedule.without(index), clients));
        }
    }
    // A pause re-aimed at its client's first job: just after its read (where an unfenced
    // write goes stale), then inside its write's transaction, the row locked (where a
    // write fenced only at the write goes stale).
    for point in [Kind::ReadRecord, Kind::Working] {
        for (index, step) in schedule.steps().iter().enumerate() {
            // Once at either point, never moved to the other: both fail, and shrinking
            // would swing between them until its budget ran out.
            let there = step.after.as_ref().is_some_and(|a| {
                a.nth == 1
                    && (a.event == Kind::ReadRecord.into() || a.event == Kind::Working.into())
            });
            if step.fault == Fault::Pause && !there {
                let aimed = Step {
                    at_ms: 0,
                    after: Some(Anchor::on(&step.target, point, 1)),
                    ..step.clone()
                };
                out.push((schedule.with_step(index, aimed), clients));
            }
        }
    }
    // Not below three clients under a clock jump: the lock it frees is taken by whoever
    // wants that record next, and with one client fewer the schedule breaks the design only
    // when the one left happens to — a candidate that passes three replays by luck.
    let jumps = schedule.steps().iter().any(|s| s.fault == Fault::ClockStep);
    if clients > 2 && !jumps {
        let last = super::play::client_names(clients).pop().unwrap_or_default();
        out.push((super::net::without_client(schedule, &last), clients - 1));
    }
    for (index, step) in schedule.steps().iter().enumerate() {
        if let Some(ms) = step.duration_ms.filter(|ms| *ms >= 200) {
            let shorter = (ms * 2 / 3).max(shortest_pause_ms);
            if shorter < ms {
                let shorter = Step {
                    duration_ms: Some(shorter),
                    ..step.clone()
                };
                out.push((schedule.with_step(index, shorter), clients));
            }
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
/// its clients, and the history in which it failed. Until the caller has printed it, an
/// interrupt prints it (the caller clears that with `say_if_interrupted(None)`).
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
    keep_if_interrupted(setup, &best.0, best.1, false);
    let played = std::sync::atomic::AtomicU32::new(0);
    if !style.json {
        crate::outln!();
        crate::outln!("{}", "Shrinking the failing schedule…".bold());
    }
    'smaller: loop {
        // A quarter over the lease: the lease counts from the grant, the pause from later.
        // etcd's leader looks for expired leases every 500 ms, so a lease there outlives
        // its TTL by up to that much: a cut or pause at the bare floor often heals first.
        let etcd_lag_ms = if setup.design.uses_etcd() {
            ETCD_EXPIRY_CHECK_MS
        } else {
            0
        };
        let shortest_pause_ms = setup.lease_ms * 5 / 4 + etcd_lag_ms;
        for (candidate, clients) in candidates(&best.0, best.1, shortest_pause_ms) {
            // A candidate is judged on all its replays or not at all: cut short by the
            // budget, "2 of 2" would keep what "2 of 3" does not.
            if played.load(Ordering::Acquire) + replays > BUDGET || crate::procs::interrupted() {
                break 'smaller;
            }
            // The candidate's replays side by side; four failures in five keep it.
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
            let replayed = side_by_side::play(setup, parallel.min(replays), false, next, |_| {})?;
            let played_n = replayed.len();
            // A failure in which a step of the candidate never played is a smaller
            // schedule's (tried on its own): it does not count for this one.
            let (mut failures, in_part): (Vec<_>, Vec<_>) = replayed
                .into_iter()
                .filter(|p| p.trial.report.judgement() == Judgement::Unsafe)
                .partition(|p| p.trial.unplayed.is_empty());
            let faults = count(candidate.steps().len() as u64, "fault", "faults");
            let clients_word = count(clients, "client", "clients");
            let left_out = match in_part.len() {
                0 => String::new(),
                n => format!("; {n} more where a step never played, not counted"),
            };
            if played_n < replays as usize {
                break 'smaller;
            }
            if still_fails(failures.len(), played_n) {
                let failed = failures.swap_remove(0);
                if !style.json {
                    let steps: Vec<String> = candidate
                        .steps()
                        .iter()
                        .map(super::step_words::step_words)
                        .collect();
                    crate::prose!(
                        "  still fails with {faults}, {clients_word} ({} of {played_n} \
                         replays{left_out}): {}",
                        failures.len() + 1,
                        steps.join("; ")
                    );
                }
                best = (candidate, clients, failed.trial);
                keep_if_interrupted(setup, &best.0, best.1, true);
                continue 'smaller;
            }
            if still_fails(failures.len() + in_part.len(), played_n) && !style.json {
                crate::prose!(
                    "  not kept: {faults}, {clients_word} failed in {} of \
                     {played_n} replays, but only {} with every step played",
                    failures.len() + in_part.len(),
                    failures.len()
                );
            }
        }
        break;
    }
    Ok(best)
}

/// A Ctrl-C while shrinking must not lose the violation already found: the interrupt
/// prints the smallest failing schedule so far, and how to replay it.
fn keep_if_interrupted(setup: &Setup, schedule: &Schedule, clients: u32, shrunk: bool) {
    let how = if shrunk {
        "the smallest so far"
    } else {
        "not shrunk yet"
    };
    let replay = super::show::replay_lines(setup.design, clients, schedule);
    crate::procs::say_if_interrupted(Some(format!(
        "lockslab: a violation was found before the interrupt; its schedule ({how}, {}):\n  {}",
        count(schedule.steps().len() as u64, "fault", "faults"),
        replay.join("\n  ")
    )));
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
        let all = candidates(&schedule, 3, 0);
        assert_eq!(all[0].0.steps().len(), 1);
        // The pause, timed by the clock, re-aimed just after A's first read.
        let aimed = &all[2].0.steps()[0];
        assert_eq!(aimed.fault, Fault::Pause);
        assert_eq!(aimed.after, Some(Anchor::on("A", Kind::ReadRecord, 1)));
        assert_eq!(aimed.duration_ms, Some(900));
        // … and inside its first write's transaction.
        let aimed = &all[3].0.steps()[0];
        assert_eq!(aimed.after, Some(Anchor::on("A", Kind::Working, 1)));
        assert_eq!(
            all[4],
            (Schedule::new(vec![schedule.steps()[0].clone()]), 2)
        );
        assert_eq!(all[5].0.steps()[0].duration_ms, Some(600));
        assert_eq!(all.len(), 6);
        // Once aimed at the read, or inside the write's transaction, it is not re-aimed
        // again: not at the same point, nor back and forth between the two.
        for aimed in [&all[2].0, &all[3].0] {
            let again = candidates(aimed, 2, 0);
            assert!(again.iter().all(|(c, _)| c != aimed), "{again:?}");
            let moved = again.iter().filter(|(c, _)| {
                let pause = c.steps().iter().find(|s| s.fault == Fault::Pause);
                pause.is_some_and(|p| {
                    p.after != aimed.steps()[0].after && p.duration_ms == Some(900)
                })
            });
            assert_eq!(moved.count(), 0, "{again:?}");
        }
        // Never shorter than the floor: 900 ms down to 800, not 600; 800 no further.
        let floored = candidates(&schedule, 2, 800);
        let pauses: Vec<Option<u64>> = floored
            .iter()
            .filter_map(|(c, _)| c.steps().iter().find(|s| s.fault == Fault::Pause))
            .map(|s| s.duration_ms)
            .collect();
        assert!(pauses.contains(&Some(800)) && !pauses.contains(&Some(600)));
        let at_floor = schedule.with_step(
            0,
            Step {
                duration_ms: Some(800),
                ..schedule.steps()[0].clone()
            },
        );
        assert!(
            candidates(&at_floor, 2, 800)
                .iter()
                .flat_map(|(c, _)| c.steps().iter().filter(|s| s.fault == Fault::Pause))
                .all(|s| s.duration_ms >= Some(800)),
            "no pause below the floor"
        );
    }

    #[test]
    fn a_candidate_is_kept_only_if_it_failed_in_four_of_five_replays() {
        assert!(still_fails(3, 3));
        assert!(
            !still_fails(2, 3),
            "a coin that came up twice of three is not kept"
        );
        assert!(!still_fails(1, 3));
        assert!(still_fails(8, 10));
        assert!(!still_fails(7, 10));
        assert!(!still_fails(1, 2));
        assert!(still_fails(1, 1));
        assert!(!still_fails(0, 0));
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
        let fewer = candidates(&schedule, 3, 0)
            .into_iter()
            .find(|(_, clients)| *clients == 2)
            .unwrap();
        assert_eq!(fewer.0, Schedule::new(vec![delay]));
    }

    /// Under a clock jump a schedule keeps its three clients: the freed lock needs a taker.
    #[test]
    fn a_clock_jump_keeps_every_client() {
        let jump = Step {
            at_ms: 2,
            after: Some(Anchor::on("B", Kind::Acquired, 2)),
            fault: Fault::ClockStep,
            target: "redis".into(),
            duration_ms: None,
        };
        let schedule = Schedule::new(vec![jump]);
        let all = candidates(&schedule, 3, 0);
        assert!(!all.is_empty(), "an earlier grant is still tried");
        assert!(all.iter().all(|(_, clients)| *clients == 3), "{all:?}");
    }

    /// A cut shrinks as a pause does: shorter, never below the floor; a client fewer takes
    /// it with it.
    #[test]
    fn a_cut_is_shortened_to_the_floor_and_goes_with_its_client() {
        let cut = Step {
            at_ms: 0,
            after: None,
            fault: Fault::Cut,
            target: "C→etcd".into(),
            duration_ms: Some(2400),
        };
        let schedule = Schedule::new(vec![cut]);
        let shorter: Vec<u64> = candidates(&schedule, 3, 1000)
            .iter()
            .flat_map(|(s, _)| s.steps().iter().filter_map(|s| s.duration_ms))
            .filter(|ms| *ms < 2400)
            .collect();
        assert!(!shorter.is_empty(), "a cut is shortened");
        assert!(shorter.iter().all(|ms| *ms >= 1000), "{shorter:?}");
        let fewer = candidates(&schedule, 3, 1000)
            .into_iter()
            .find(|(_, clients)| *clients == 2)
            .unwrap();
        assert!(fewer.0.is_empty());
    }
}
