//! A history's rows in the store: the records set up before the clients start, read back
//! (with every write attempt, in the store's decision order) for the checker, and removed.

use anyhow::{Context, Result};

use super::unplayed::Unplayed;
use crate::check::chaos::{self, ChaosAttempt, Heard, LostRelease, RecordBack, Report};
use crate::connect::PgClient;
use crate::designs::Design;
use crate::events::facts::RecordsBack;
use crate::events::{Event, What};
use crate::worker::chaos_client;

pub fn prepare(store: &mut PgClient, run_id: &str, records: &[String]) -> Result<()> {
    let mut tx = store.transaction()?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('lockslab schema'))",
        &[],
    )?;
    tx.batch_execute(chaos_client::SCHEMA)
        .context("creating the chaos tables")?;
    for record in records {
        tx.execute(
            "INSERT INTO lockslab_chaos_record (run_id, record) VALUES ($1, $2)",
            &[&run_id, record],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Removes a history's rows once read (best effort on the way out of a failed run).
pub fn forget(store: &mut PgClient, run_id: &str) -> Result<()> {
    for table in [
        "lockslab_chaos_record",
        "lockslab_chaos_attempt",
        "lockslab_chaos_log",
    ] {
        store.execute(
            &format!("DELETE FROM {table} WHERE run_id = $1"),
            &[&run_id],
        )?;
    }
    Ok(())
}

pub fn read_back(
    store: &mut PgClient,
    run_id: &str,
    records: &[String],
) -> Result<Vec<RecordBack>> {
    let mut backs = Vec::new();
    for record in records {
        let final_value: Option<i64> = store
            .query_opt(
                "SELECT value FROM lockslab_chaos_record WHERE run_id = $1 AND record = $2",
                &[&run_id, record],
            )?
            .map(|row| row.get(0));
        let log = store
            .query(
                "SELECT job FROM lockslab_chaos_log WHERE run_id = $1 AND record = $2 ORDER BY seq",
                &[&run_id, record],
            )?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let attempts = store
            .query(
                "SELECT client, job, read_value, value, token, accepted, decided
                 FROM lockslab_chaos_attempt WHERE run_id = $1 AND record = $2 ORDER BY decided",
                &[&run_id, record],
            )?
            .iter()
            .map(|row| ChaosAttempt {
                client: row.get(0),
                job: row.get(1),
                read_value: row.get(2),
                value: row.get(3),
                token: row.get(4),
                accepted: row.get(5),
                decided: row.get(6),
            })
            .collect();
        backs.push(RecordBack {
            record: record.clone(),
            final_value,
            log,
            attempts,
        });
    }
    Ok(backs)
}

/// The store's read-back of every record, as an event of the history: the evidence the
/// history is checked from, kept in it so that `lockslab check` checks it again.
pub fn read_back_event(backs: Vec<RecordBack>, t_ms: u64) -> Event {
    let text = backs
        .iter()
        .map(|b| {
            let value = b.final_value.map_or("not found".into(), |v| v.to_string());
            format!("{} = {value} ({} jobs in its log)", b.record, b.log.len())
        })
        .collect::<Vec<_>>()
        .join("; ");
    let mut event = Event::new(
        "store",
        RecordsBack { records: backs },
        format!("read back: {text}"),
    );
    event.t_ms = t_ms;
    event
}

/// One history checked: [`chaos::check`] over what the clients heard and the store's
/// read-back in it, then what leaves the history unknown — a failover the Sentinels played
/// by themselves (the history says so), steps of the schedule that did not play (`unplayed`,
/// of its `steps`; `given`: the schedule was the learner's own), no write at all. The live
/// run and `lockslab check` both judge a history this way.
pub fn judge(
    history: &[Event],
    design: Design,
    unplayed: &[Unplayed],
    steps: usize,
    given: bool,
) -> Report {
    let backs: Vec<RecordBack> = history
        .iter()
        .filter_map(|e| match &e.what {
            What::RecordsReadBack(back) => Some(back.records.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    let mut report = chaos::check(&heard(history), &backs, design.trusts_the_lock());
    let switched = history
        .iter()
        .any(|e| matches!(&e.what, What::Warning(w) if w.failed_over_by_itself == Some(true)));
    if switched {
        report
            .unknowns
            .push(super::failover::SWITCHED_BY_ITSELF.into());
    }
    if let Some(why) = super::unplayed::unknown(unplayed, steps, given) {
        // First: the line shows the first unknown, and this one says what was tested.
        report.unknowns.insert(0, why);
    }
    if report.attempts == 0 {
        // Nothing was tried (a server that never answered, clients that never got to
        // work): a history with no write says nothing about the design.
        report
            .unknowns
            .push("no client attempted a write: this history tests nothing".into());
    }
    report
}

/// What the clients heard back, out of the history: the writes they were told were
/// accepted, and the releases that found their lock gone or someone else's.
pub fn heard(history: &[Event]) -> Heard {
    let mut heard = Heard::default();
    let mut lock_of: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    for event in history {
        match &event.what {
            What::Acquired(a) => {
                if let Some(lock) = a.lock.as_deref() {
                    lock_of.insert(event.worker.as_str(), lock);
                }
            }
            What::Wrote(w) if w.outcome == crate::store::Outcome::Accepted => {
                if let (Some(record), Some(job)) = (&w.resource, w.job) {
                    heard.acknowledged.push((record.clone(), job));
                }
            }
            What::Released(r) if r.released == Some(false) => {
                heard.lost_releases.push(LostRelease {
                    holder: event.worker.clone(),
                    lock: lock_of
                        .get(event.worker.as_str())
                        .map_or_else(|| "its lock".into(), |lock| lock.to_string()),
                    found_owner: r.found_owner.clone(),
                });
            }
            _ => {}
        }
    }
    heard
}
