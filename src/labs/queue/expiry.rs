//! The expiry part, on the recipe: three workers in line, H (holds), W1, W2.
//!
//! ```text
//!  H   holds ─────────────────────────────── ❄ frozen past its lease ──▶ wakes, writes ✗
//!  W1  queued ─ ❄ frozen past its lease ─▶ wakes: "my key is gone", leaves
//!  W2  queued behind W1 ── woken: W1 gone, H still ahead ── woken: H gone ─▶ holds, writes ✓
//! ```
//!
//! The nemesis freezes and resumes, as the part's schedule says ([`faults`]); every lock
//! step and write is the workers' own; the store's read-back says which writes it took.

use std::time::Duration;

use anyhow::{Context, Result};

use super::Plan;
use super::verdict::ExpiryVerdict;
use crate::events::Kind;
use crate::labs::Stage;
use crate::labs::faults::{Faults, Until};
use crate::labs::runner::Run;
use crate::nemesis::schedule::{Anchor, Kinds, Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note};
use crate::output::human;
use crate::worker::WorkerSpec;

/// The store's resource the three write.
const RESOURCE: &str = "queue-expiry";

pub(super) fn play(plan: &Plan, run: &Run) -> Result<ExpiryVerdict> {
    let super::scene::Scene {
        mut stage,
        mut store,
        prefix,
    } = super::scene::begin(
        run,
        "expiry",
        "── expiry: a waiter, then the holder, frozen past their leases (the recipe) ──",
        &crate::labs::step::queue::EXPIRY,
        "the queue's waiters",
    )?;
    let long = super::scene::patience(plan);
    let script = |name: &str, hold: Option<Duration>| {
        super::scene::recipe_script(plan, run, &prefix, RESOURCE, name, hold)
    };
    let mut h = stage.spawn("H", &WorkerSpec::Queuer(script("H", None)))?;
    stage.wait_for(long, "H to take the lock", |e| e.is("H", Kind::Acquired))?;
    let hold = Some(Duration::from_millis(100));
    let mut w1 = stage.spawn("W1", &WorkerSpec::Queuer(script("W1", hold)))?;
    let w1_queued = stage.wait_for(long, "W1 to queue", |e| e.is("W1", Kind::Queued))?;
    let mut w2 = stage.spawn("W2", &WorkerSpec::Queuer(script("W2", hold)))?;
    // Declared after the workers: dropped first, so that a failure resumes before it kills.
    let mut nemesis = Nemesis::new();
    let granted = super::scene::granted_lease(&w1_queued, plan);
    let freeze = granted + Duration::from_millis(1500);
    let schedule = faults(freeze);
    crate::labs::faults::show(&stage, &schedule);
    let mut faults = Faults::new(&schedule, &stage).saying(|cue| {
        Note::from(match (cue.action.fault, cue.action.target.as_str()) {
            (Fault::Pause, "W1") => format!(
                "freezes W1 (queued, {} lease) for {}",
                human(granted),
                human(freeze)
            ),
            (Fault::Pause, _) => format!("freezes H (the holder) for {}", human(freeze)),
            (_, "W1") => "resumes W1".to_string(),
            _ => "resumes H: it carries on with its work".to_string(),
        })
    });
    stage.wait_for(long, "W2 to queue", |e| e.is("W2", Kind::Queued))?;
    let let_go = |stage: &Stage, faults: &Faults| {
        faults.finished()
            && stage.log.iter().any(|e| {
                e.worker == "W2" && matches!(e.kind(), Kind::Released | Kind::GaveUp | Kind::Lost)
            })
    };
    let until = Until::holds("W2 to let go", freeze * 2 + long * 2, let_go);
    stage.play(&mut faults, &mut nemesis, &mut [&mut w1, &mut h], until)?;
    h.tell("release")?;
    stage.wait_for(long, "H to let go", |e| e.is("H", Kind::Released))?;
    for worker in [&mut h, &mut w1, &mut w2] {
        worker.finish(Duration::from_secs(5));
    }
    stage.drain();
    drop(nemesis);

    let read = store
        .read_back(&run.id, RESOURCE)
        .context("reading the store back")?;
    stage.record_read_back(RESOURCE, &read);
    let mut verdict = ExpiryVerdict::from_history(&stage.log, granted, freeze)?;
    verdict.schedule = Some(schedule);
    Ok(verdict)
}

/// The part's faults: W1 frozen past its lease once W2 queued behind it; the holder frozen
/// past its lease once W1 has said what it found on waking (`lost`, or `acquired` if its
/// turn came while it slept) — each freeze the lease etcd granted plus 1.5s.
fn faults(freeze: Duration) -> Schedule {
    let freeze_for = |target: &str, after: Anchor| Step {
        at_ms: 0,
        after: Some(after),
        fault: Fault::Pause,
        target: target.into(),
        duration_ms: Some(freeze.as_millis() as u64),
    };
    let woke = Kinds::Any(vec![Kind::Lost, Kind::Acquired]);
    Schedule::new(vec![
        freeze_for("W1", Anchor::on("W2", Kind::Queued, 1)),
        freeze_for("H", Anchor::on("W1", woke, 1)),
    ])
}
