//! A history's rows in the store: the records set up before the clients start, read back
//! (with every write attempt, in the store's decision order) for the checker, and removed.

use anyhow::{Context, Result};

use crate::check::chaos::{ChaosAttempt, Heard, LostRelease, RecordBack};
use crate::connect::PgClient;
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
