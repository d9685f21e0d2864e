//! Schedules played side by side on the same servers: each history has its own run id,
//! which names its rows, its Redis keys, its etcd and advisory locks — nothing of one
//! schedule is seen by another. Each lane (a thread here) restarts only its own Redis (see
//! [`super::Lane`]).
//!
//! Histories finish in any order; they are handed back in the order they were drawn, so
//! that a seeded run prints the same lines in the same order every time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use anyhow::Result;

use super::play::{Setup, Trial};
use crate::check::chaos::Judgement;
use crate::nemesis::schedule::Schedule;

/// One schedule to play.
#[derive(Clone, Debug)]
pub struct Job {
    /// Names the history's rows and keys (`<run id>_<index>`).
    pub index: u64,
    /// The clients' seed (which records they pick).
    pub seed: u64,
    pub schedule: Schedule,
    pub clients: u32,
}

/// A schedule played, and what the checker made of its history.
pub struct Played {
    pub job: Job,
    pub trial: Trial,
    /// When its history was checked.
    pub done: Instant,
}

/// Plays `next(0)`, `next(1)`, … until it says `None` (or Ctrl-C), `parallel` at a time;
/// with `stop_at_first`, draws no more once a history is unsafe (those in flight finish).
/// `each` sees every played schedule, in the order drawn, as soon as those before it are in.
pub fn play(
    setup: &Setup,
    parallel: u32,
    stop_at_first: bool,
    next: impl Fn(u64) -> Option<Job> + Sync,
    mut each: impl FnMut(&Played),
) -> Result<Vec<Played>> {
    let taken = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<(u64, Result<Played>)>();
    let mut played = Vec::new();
    let mut failed = None;
    std::thread::scope(|scope| {
        for lane in 0..parallel.max(1) as usize {
            let (tx, taken, stop, next) = (tx.clone(), &taken, &stop, &next);
            scope.spawn(move || {
                while !stop.load(Ordering::Acquire) && !crate::procs::interrupted() {
                    let nth = taken.fetch_add(1, Ordering::AcqRel);
                    let Some(job) = next(nth) else { break };
                    let outcome = setup
                        .play(&job.schedule, job.clients, job.index, job.seed, lane)
                        .map(|trial| Played {
                            job,
                            trial,
                            done: Instant::now(),
                        });
                    let unsafe_ = outcome
                        .as_ref()
                        .map_or(true, |p| p.trial.report.judgement() == Judgement::Unsafe);
                    if unsafe_ && (stop_at_first || outcome.is_err()) {
                        stop.store(true, Ordering::Release);
                    }
                    if tx.send((nth, outcome)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        let mut waiting = BTreeMap::new();
        let mut shown = 0;
        for (nth, outcome) in rx {
            match outcome {
                Ok(done) => {
                    waiting.insert(nth, done);
                }
                Err(err) => {
                    failed.get_or_insert(err);
                }
            }
            while let Some(done) = waiting.remove(&shown) {
                each(&done);
                played.push(done);
                shown += 1;
            }
        }
        // Past a failed history: the rest, still in order.
        for (_, done) in std::mem::take(&mut waiting) {
            each(&done);
            played.push(done);
        }
    });
    match failed {
        Some(err) => Err(err),
        None => Ok(played),
    }
}

/// How many of the histories played had a step that did not play.
pub fn in_part(played: &[Played]) -> usize {
    let in_part = played.iter().filter(|p| !p.trial.unplayed.is_empty());
    in_part.count()
}
