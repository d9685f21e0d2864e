//! The churn part, on the recipe: six in line, two of them leave from the middle.
//!
//! ```text
//!  H   holds ──────────────────────────────────────────── lets go ─▶ W1 holds ─▶ W4 ─▶ W5
//!  W1  queued behind H
//!  W2  queued behind W1 ── gives up: deletes its key
//!  W3  queued behind W2 ── woken: W2 gone, W1 ahead ── ☠ killed: its key lives on
//!  W4  queued behind W3 ─────────────── woken when W3's lease runs out: W1 ahead
//!  W5  queued behind W4
//! ```
//!
//! Each departure wakes the one waiter behind it, which must look again: an older key
//! still holds. The verdict is read from etcd's own history of the keys (every create and
//! delete revision, replayed by a watch from the start of the part) and from the store,
//! where each holder writes once with its token; the waiters' reports say who looked again.

use std::time::Duration;

use anyhow::{Context, Result};

use crate::output::human;

use super::Plan;
use super::verdict_churn::ChurnVerdict;
use crate::connect::Backend;
use crate::events::facts::Woke;
use crate::events::{Event, Kind, What};
use crate::labs::faults::{Faults, Until};
use crate::labs::runner::Run;
use crate::labs::{Stage, WorkerHandle};
use crate::lock::etcd_queue::EtcdQueue;
use crate::nemesis::schedule::{Anchor, Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note, Victim};
use crate::worker::WorkerSpec;
use crate::worker::queuer::QueuerScript;

/// The store's resource the holders write.
const RESOURCE: &str = "queue-churn";
/// The waiter that gives up, and the one the nemesis kills.
pub const GIVES_UP: &str = "W2";
pub const KILLED: &str = "W3";

pub(super) fn play(plan: &Plan, run: &Run) -> Result<ChurnVerdict> {
    let super::scene::Scene {
        mut stage,
        mut store,
        prefix,
    } = super::scene::begin(
        run,
        "churn",
        "── churn: a waiter gives up, one is killed, from the middle of the line ──",
        &crate::labs::step::queue::CHURN,
        "the queue's waiters",
    )?;
    let mut history = EtcdQueue::connect(run.url(Backend::Etcd), &prefix)?;
    let from = history.revision_now()? + 1;
    let long = super::scene::patience(plan);
    let script = |name: &str| QueuerScript {
        give_up_when_told: name == GIVES_UP,
        ..super::scene::recipe_script(
            plan,
            run,
            &prefix,
            RESOURCE,
            name,
            (name != "H").then_some(Duration::from_millis(50)),
        )
    };
    let names = ["H", "W1", "W2", "W3", "W4", "W5"];
    let mut workers: Vec<WorkerHandle> = Vec::new();
    for name in names {
        workers.push(stage.spawn(name, &WorkerSpec::Queuer(script(name)))?);
        wait_unless_lost(
            &mut stage,
            plan,
            long,
            &format!("{name} to join the queue"),
            |e| e.is(name, Kind::Queued),
        )?;
    }
    wait_unless_lost(&mut stage, plan, long, "H to take the lock", |e| {
        e.is("H", Kind::Acquired)
    })?;
    // Declared after the workers: dropped first, so that a failure resumes before it kills.
    let mut nemesis = Nemesis::new();
    let key = |stage: &Stage, name: &str| {
        stage.log.iter().find_map(|e| match &e.what {
            What::Queued(q) if e.worker == name => q.key.clone(),
            _ => None,
        })
    };

    let schedule = faults();
    crate::labs::faults::show(&stage, &schedule);
    let mut faults = Faults::new(&schedule, &stage)
        .saying(|_| Note::from("kills W3 (queued): its key stays until etcd expires its lease"));

    // 1. A waiter gives up: it deletes its own key.
    let gone = key(&stage, GIVES_UP);
    let waiter = worker(&mut workers, GIVES_UP);
    waiter.tell("give-up")?;
    wait_unless_lost(&mut stage, plan, long, "W2 to give up", |e| {
        e.is(GIVES_UP, Kind::GaveUp)
    })?;
    wait_unless_lost(&mut stage, plan, long, "W3 to look again", |e| {
        woken_by(e, KILLED, &gone)
    })?;

    // 2. A waiter is killed (the schedule: once W2's departure woke it); its key stays
    // until its lease runs out.
    let gone = key(&stage, KILLED);
    let w3: &mut dyn Victim = worker(&mut workers, KILLED);
    stage.play(&mut faults, &mut nemesis, &mut [w3], Until::done(long))?;
    wait_unless_lost(&mut stage, plan, long, "W4 to look again", |e| {
        woken_by(e, "W4", &gone)
    })?;

    // 3. The holder lets go: the line is served.
    worker(&mut workers, "H").tell("release")?;
    for name in ["H", "W1", "W4", "W5"] {
        wait_unless_lost(&mut stage, plan, long, &format!("{name} to let go"), |e| {
            e.worker == name && matches!(e.kind(), Kind::Released | Kind::GaveUp | Kind::Lost)
        })?;
    }
    for worker in &mut workers {
        worker.finish(Duration::from_secs(5));
    }
    stage.drain();
    drop(nemesis);

    super::scene::record_keys(&mut stage, &mut history, from);
    let read = store
        .read_back(&run.id, RESOURCE)
        .context("reading the store back")?;
    stage.record_read_back(RESOURCE, &read);
    let mut verdict = ChurnVerdict::from_history(&stage.log)?;
    verdict.schedule = Some(schedule);
    Ok(verdict)
}

/// The part's fault: W3 killed once it was woken — by W2's departure, the only key it
/// watches (the lab checks the wake's facts before it plays the schedule).
fn faults() -> Schedule {
    Schedule::new(vec![Step {
        at_ms: 0,
        after: Some(Anchor::on(KILLED, Kind::Woke, 1)),
        fault: Fault::Kill,
        target: KILLED.into(),
        duration_ms: None,
    }])
}

/// The handle of the worker named `name`.
fn worker<'a>(workers: &'a mut [WorkerHandle], name: &str) -> &'a mut WorkerHandle {
    workers
        .iter_mut()
        .find(|w| w.name == name)
        .expect("every name was spawned")
}

/// [`Stage::wait_for`], unless a worker says first that it lost its place in the queue — even
/// where the caller would take a `lost` as a way to let go. In this part nobody's lease may
/// run out — the killed waiter's runs out after its death, and says nothing — so a `lost`
/// is the machine's doing: its keepalive did not get through
/// within the lease (a busy machine starves it). The part cannot show its lesson then, and
/// says so at once instead of waiting for what will not come.
fn wait_unless_lost(
    stage: &mut Stage,
    plan: &Plan,
    long: Duration,
    what: &str,
    matches: impl Fn(&Event) -> bool,
) -> Result<Event> {
    let event = stage.wait_for(long, what, |e| matches(e) || e.kind() == Kind::Lost)?;
    if event.kind() == Kind::Lost {
        anyhow::bail!(
            "{} lost its place in the queue before the lab did anything to it ({}): its {} \
             etcd lease was not kept alive in time, which on this machine means it is too \
             busy for the churn part's lesson. Run it again when it is quieter, or with a \
             longer lease (--lease 3s).",
            event.worker,
            event.text,
            human(plan.lease)
        );
    }
    Ok(event)
}

/// `waiter` reported that the delete of `gone` woke it.
fn woken_by(event: &Event, waiter: &str, gone: &Option<String>) -> bool {
    match &event.what {
        What::Woke(Woke { gone: woke, .. }) => event.worker == waiter && woke == gone,
        _ => false,
    }
}
