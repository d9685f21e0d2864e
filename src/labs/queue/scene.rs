//! What the churn, expiry and election parts each begin and end with: a heading and its
//! step question, the part's tag, the store made ready and a line naming the part's keys;
//! at the end, etcd's own history of those keys, recorded as evidence.

use anyhow::Result;
use colored::Colorize;

use super::lock_name;
use crate::connect::Backend;
use crate::events::Event;
use crate::events::facts::{QueueKeys, RunFacts};
use crate::labs::Stage;
use crate::labs::runner::Run;
use crate::labs::step::Checkpoint;
use crate::lock::etcd_queue::EtcdQueue;
use crate::store::Store;

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
