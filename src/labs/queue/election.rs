//! The election part: etcd's election service, the recipe kept for a long time.
//!
//! ```text
//!  L1  elected, generation g1 ── ❄ frozen past its lease ──▶ wakes: still "leader", writes ✗
//!                                                             asks etcd: L2 leads
//!  L2  campaigns ─────────────── elected, generation g2 ─▶ writes ✓
//! ```
//!
//! The generation is the leader key's create revision. The store refuses the woken
//! leader's write by it; etcd's history of the candidates' keys says one led at a time.

use std::time::Duration;

use anyhow::{Context, Result};

use super::Plan;
use super::verdict_churn::ElectionVerdict;
use crate::connect::Backend;
use crate::events::Kind;
use crate::labs::faults::{Faults, Until};
use crate::labs::runner::Run;
use crate::lock::etcd_queue::EtcdQueue;
use crate::nemesis::schedule::{Anchor, Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note};
use crate::output::human;
use crate::worker::WorkerSpec;
use crate::worker::queuer::QueuerScript;

/// The store's resource the leaders write.
const RESOURCE: &str = "queue-election";

pub(super) fn play(plan: &Plan, run: &Run) -> Result<ElectionVerdict> {
    let super::scene::Scene {
        mut stage,
        mut store,
        prefix: name,
    } = super::scene::begin(
        run,
        "election",
        "── election: the leader frozen past its lease (etcd's election service) ──",
        &crate::labs::step::queue::ELECTION,
        "the election's candidates",
    )?;
    let mut history = EtcdQueue::connect(run.url(Backend::Etcd), &name)?;
    let from = history.revision_now()? + 1;
    let long = super::scene::patience(plan);
    let script = |who: &str, hold: Option<Duration>| QueuerScript {
        report_wakes: false,
        election: true,
        ..super::scene::recipe_script(plan, run, &name, RESOURCE, who, hold)
    };
    let mut l1 = stage.spawn("L1", &WorkerSpec::Queuer(script("L1", None)))?;
    let l1_queued = stage.wait_for(long, "L1 to campaign", |e| e.is("L1", Kind::Queued))?;
    stage.wait_for(long, "L1 to be elected", |e| e.is("L1", Kind::Acquired))?;
    let mut l2 = stage.spawn(
        "L2",
        &WorkerSpec::Queuer(script("L2", Some(Duration::from_millis(50)))),
    )?;
    // Declared after the workers: dropped first, so that a failure resumes before it kills.
    let mut nemesis = Nemesis::new();
    let granted = super::scene::granted_lease(&l1_queued, plan);
    let freeze = granted + Duration::from_millis(1500);
    let schedule = faults(freeze);
    crate::labs::faults::show(&stage, &schedule);
    let mut faults = Faults::new(&schedule, &stage).saying(|cue| {
        Note::from(match cue.action.fault {
            Fault::Pause => format!(
                "freezes L1 (the leader, {} lease) for {}",
                human(granted),
                human(freeze)
            ),
            _ => "resumes L1: it carries on as leader".to_string(),
        })
    });
    stage.wait_for(long, "L2 to campaign", |e| e.is("L2", Kind::Queued))?;
    let frozen = Until::acted(Fault::Pause, "L1", long);
    stage.play(&mut faults, &mut nemesis, &mut [&mut l1], frozen)?;
    // L1's resume falls due at the end of its freeze, but is played only once L2 was
    // elected and wrote (the freeze outlasts L1's lease by 1.5s, so as a rule L2 is
    // elected before it ends): the deposed leader's write comes after its successor's.
    stage.wait_for(long, "L2 to be elected", |e| e.is("L2", Kind::Acquired))?;
    stage.wait_for(long, "L2 to write", |e| e.is("L2", Kind::Wrote))?;
    let resumed = Until::done(freeze + long);
    stage.play(&mut faults, &mut nemesis, &mut [&mut l1], resumed)?;
    l1.tell("release")?;
    stage.wait_for(long, "L1 to write", |e| e.is("L1", Kind::Wrote))?;
    for (worker, who) in [(&mut l1, "L1"), (&mut l2, "L2")] {
        worker.tell("resign")?;
        stage.wait_for(long, &format!("{who} to resign"), |e| {
            e.is(who, Kind::Released)
        })?;
        worker.finish(Duration::from_secs(5));
    }
    stage.drain();
    drop(nemesis);

    super::scene::record_keys(&mut stage, &mut history, from);
    let read = store
        .read_back(&run.id, RESOURCE)
        .context("reading the store back")?;
    stage.record_read_back(RESOURCE, &read);
    let mut verdict = ElectionVerdict::from_history(&stage.log)?;
    verdict.schedule = Some(schedule);
    Ok(verdict)
}

/// The part's fault: the leader frozen past its lease (the lease etcd granted plus 1.5s)
/// once L2 campaigns behind it.
fn faults(freeze: Duration) -> Schedule {
    Schedule::new(vec![Step {
        at_ms: 0,
        after: Some(Anchor::on("L2", Kind::Queued, 1)),
        fault: Fault::Pause,
        target: "L1".into(),
        duration_ms: Some(freeze.as_millis() as u64),
    }])
}
