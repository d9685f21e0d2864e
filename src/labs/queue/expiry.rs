//! The expiry part, on the recipe: three workers in line, H (holds), W1, W2.
//!
//! ```text
//!  H   holds ─────────────────────────────── ❄ frozen past its lease ──▶ wakes, writes ✗
//!  W1  queued ─ ❄ frozen past its lease ─▶ wakes: "my key is gone", leaves
//!  W2  queued behind W1 ── woken: W1 gone, H still ahead ── woken: H gone ─▶ holds, writes ✓
//! ```
//!
//! The nemesis freezes and resumes; every lock step and write is the workers' own; the
//! store's read-back says which writes it took.

use std::time::Duration;

use anyhow::{Context, Result};

use super::Plan;
use super::verdict::ExpiryVerdict;
use crate::check::late_write;
use crate::events::Kind;
use crate::labs::runner::Run;
use crate::nemesis::Nemesis;
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
    stage.wait_for(long, "W2 to queue", |e| e.is("W2", Kind::Queued))?;
    // Declared after the workers: dropped first, so that a failure resumes before it kills.
    let mut nemesis = Nemesis::new();
    let granted = super::scene::granted_lease(&w1_queued, plan);
    let freeze = granted + Duration::from_millis(1500);

    // Played by hand, not as a schedule (labs::faults): the freezes last the lease etcd
    // granted (from W1's `queued` event), and H freezes once W1 has said what it found on
    // waking — `lost` or `acquired`, where a schedule's anchor names one kind.
    // 1. A queued waiter frozen past its lease.
    nemesis.pause(
        &mut stage,
        &w1,
        format!(
            "freezes W1 (queued, {} lease) for {}",
            human(granted),
            human(freeze)
        ),
    )?;
    stage.run_until(std::time::Instant::now() + freeze, |_| Ok(()))?;
    nemesis.resume(&mut stage, &w1, "resumes W1")?;
    stage.wait_for(long, "W1 to learn it left the queue", |e| {
        e.worker == "W1" && matches!(e.kind(), Kind::Lost | Kind::Acquired)
    })?;

    // 2. The holder frozen past its lease.
    nemesis.pause(
        &mut stage,
        &h,
        format!("freezes H (the holder) for {}", human(freeze)),
    )?;
    stage.run_until(std::time::Instant::now() + freeze, |_| Ok(()))?;
    nemesis.resume(&mut stage, &h, "resumes H: it carries on with its work")?;
    stage.wait_for(long, "W2 to let go", |e| {
        e.worker == "W2" && matches!(e.kind(), Kind::Released | Kind::GaveUp | Kind::Lost)
    })?;
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
    let late = late_write(&read.attempts, "H", "W2");
    Ok(ExpiryVerdict::from_log(
        &stage.log, late, read, granted, freeze,
    ))
}
