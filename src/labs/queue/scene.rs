//! What the churn, expiry and election parts each begin and end with: a heading and its
//! step question, the part's tag, the store made ready and a line naming the part's keys;
//! at the end, etcd's own history of those keys, recorded as evidence.

use std::time::Duration;

use anyhow::Result;
use colored::Colorize;

use super::{Plan, lock_name};
use crate::connect::Backend;
use crate::events::facts::{QueueKeys, RunFacts};
use crate::events::{Event, What};
use crate::labs::Stage;
use crate::labs::runner::Run;
use crate::labs::step::Checkpoint;
use crate::lock::etcd_queue::EtcdQueue;
use crate::store::Store;
use crate::worker::queuer::{QueuerScript, StoreTarget, Way};

/// A part begun: its stage, the store, and its keys' etcd prefix.
pub(super) struct Scene {
    pub stage: Stage,
    pub store: Store,
    pub prefix: String,
}

/// Begins the part `part` (`churn`, `expiry`, `election`): `keys` names what its keys are.
pub(super) fn begin(
    run: &Run,
    part: &str,
    heading: &str,
    checkpoint: &Checkpoint,
    keys: &str,
) -> Result<Scene> {
    let mut stage = run.stage();
    stage.timeline.say("");
    stage.timeline.say(&heading.bold().to_string());
    stage.checkpoint(checkpoint);
    stage.tags().scenario = Some(part.into());
    let mut store = Store::connect(run.url(Backend::Postgres))?;
    store.prepare()?;
    let prefix = lock_name(&run.id, part);
    stage.record(Event::new(
        "lab",
        RunFacts {
            run_id: Some(run.id.clone()),
            lock_key: Some(prefix.clone()),
            ..RunFacts::default()
        },
        format!("run {}: {keys} are the etcd keys under {prefix}/", run.id),
    ));
    Ok(Scene {
        stage,
        store,
        prefix,
    })
}

/// How long a part waits for any one step of its workers: a few leases, and then some.
pub(super) fn patience(plan: &Plan) -> Duration {
    plan.lease * 4 + Duration::from_secs(20)
}

/// A worker of the recipe under `prefix`, on the part's lease, writing its token to the
/// store's `resource`: what every part's workers share (a part changes what differs).
pub(super) fn recipe_script(
    plan: &Plan,
    run: &Run,
    prefix: &str,
    resource: &str,
    name: &str,
    hold: Option<Duration>,
) -> QueuerScript {
    QueuerScript {
        name: name.into(),
        way: Way::EtcdRecipe,
        url: run.url(Backend::Etcd).into(),
        lock: prefix.into(),
        ttl_ms: plan.lease.as_millis() as u64,
        hold_ms: hold.map(|hold| hold.as_millis() as u64),
        wait_ms: patience(plan).as_millis() as u64,
        report_wakes: true,
        store: Some(StoreTarget {
            url: run.url(Backend::Postgres).into(),
            run_id: run.id.clone(),
            resource: resource.into(),
        }),
        give_up_when_told: false,
        election: false,
    }
}

/// The lease etcd granted, as a worker's `queued` event says (etcd may grant more than
/// asked); what was asked when the event does not say.
pub(super) fn granted_lease(queued: &Event, plan: &Plan) -> Duration {
    match &queued.what {
        What::Queued(q) => q.lease_ttl_ms.map(Duration::from_millis),
        _ => None,
    }
    .unwrap_or(plan.lease)
}

/// Reads etcd's history of the keys under `prefix` since revision `from` and records it
/// (or why it could not be read) as the part's `queue_keys` event.
pub(super) fn record_keys(stage: &mut Stage, history: &mut EtcdQueue, from: i64) {
    let keys = history.key_lives(from);
    let text = match &keys {
        Ok(keys) => format!(
            "etcd's history from revision {from}: {} keys, each with its create and delete \
             revision",
            keys.len()
        ),
        Err(why) => format!("etcd's history could not be read: {why:#}"),
    };
    stage.record(Event::new(
        "lab",
        QueueKeys {
            prefix: history.prefix.clone(),
            from_revision: from,
            unreadable: keys.as_ref().err().map(|why| format!("{why:#}")),
            keys: keys.unwrap_or_default(),
        },
        text,
    ));
}
