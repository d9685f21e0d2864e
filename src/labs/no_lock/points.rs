//! Lab 7's faults, aimed at every point of a job: four workers frozen past the TTL, each at
//! another [`Moment`] (before its read, after it, between its two writes, before COMMIT),
//! and one killed between its two writes. Each point's verdict is read back from the
//! tables ([`crate::check::no_lock::freezes`]): the frozen worker's job invoiced once, its
//! customer's balance the sum of its invoices.
//!
//! A lock that only fences the write looks right as long as the freeze lands before the
//! write; the points inside the transaction are where it fails.

use anyhow::Result;

use crate::connect::PgClient;
use crate::designs::postgres;
use crate::events::Event;
use crate::events::facts::GaveUp;
use crate::invoices::Moment;

/// The killed worker: always this name, whatever else runs.
pub const KILLED: &str = "w2";
/// The killed worker stops here, where its transaction has written half of the job.
pub const KILLED_AT: Moment = Moment::MidWrite;

/// The frozen workers and where each stops, in the order of a job. `w1` keeps the lab's
/// first freeze (after the read); the lab watches its lock and its session.
pub const FROZEN: [(&str, Moment); 4] = [
    ("w3", Moment::BeforeRead),
    ("w1", Moment::Decided),
    ("w4", Moment::MidWrite),
    ("w5", Moment::BeforeCommit),
];

/// The worker whose lock and session the lab reports on during the freeze.
pub const WATCHED: &str = "w1";

/// The workers placed next to another worker's start (the frozen ones and the killed one):
/// w1 to w5.
pub const VICTIMS: usize = 5;

/// Where a worker stops, if it is one of the struck.
pub fn stop_at(worker: &str, freeze: bool, kill: bool) -> Option<Moment> {
    if kill && worker == KILLED {
        return Some(KILLED_AT);
    }
    if !freeze {
        return None;
    }
    FROZEN
        .iter()
        .find(|(name, _)| *name == worker)
        .map(|&(_, at)| at)
}

/// While a frozen worker holds customer `customer`'s advisory lock: what a worker that
/// should skip rather than queue gets. `pg_try_advisory_xact_lock` answers `false` at once;
/// the waiting form under `SET LOCAL lock_timeout` ends with SQLSTATE 55P03. Both asked on
/// the lab's own connection, in a transaction that is rolled back.
pub fn skip_rather_than_queue(db: &mut PgClient, class: i32, customer: i32) -> Result<Event> {
    const TIMEOUT_MS: u32 = 200;
    let mut tx = db.transaction()?;
    let got: bool = tx
        .query_one(postgres::ADVISORY_XACT_TRY_LOCK, &[&class, &customer])?
        .get(0);
    tx.batch_execute(&format!("SET LOCAL lock_timeout = '{TIMEOUT_MS}ms'"))?;
    let waited = tx.query_one(postgres::ADVISORY_XACT_LOCK, &[&class, &customer]);
    let code = match &waited {
        Ok(_) => None,
        Err(e) => e.code().map(|c| c.code().to_string()),
    };
    drop(tx); // ROLLBACK: had either call got the lock, this lets it go
    let text = match (&got, &code) {
        (false, Some(code)) => format!(
            "a worker that should skip customer {customer}: pg_try_advisory_xact_lock says \
             false at once; pg_advisory_xact_lock under lock_timeout {TIMEOUT_MS}ms fails with \
             {code} instead of queueing"
        ),
        _ => format!(
            "customer {customer}'s advisory lock was free for the lab (try: {got}, wait: {})",
            code.as_deref().unwrap_or("got it")
        ),
    };
    Ok(Event::new(
        "pg",
        GaveUp {
            try_lock: Some(got),
            lock_timeout_ms: Some(TIMEOUT_MS.into()),
            sqlstate: code,
            ..GaveUp::default()
        },
        text,
    ))
}

/// Where each worker starts in the list: `struck` is how many of w1, w2… are struck (five
/// with a freeze, two with only the kill). The others spread evenly; each struck worker is
/// paired with one of them: the other starts on a job and the struck worker on the next, so
/// that the struck job is the very first one another worker comes to after its own. While
/// there are customers enough, no two pairs share a customer: a worker that met another
/// frozen customer first would wait there, and each verdict is its own job's.
pub fn starts(jobs: u32, workers: u32, keys: u32, struck: usize) -> Vec<usize> {
    let jobs = jobs as usize;
    let n = workers as usize;
    let victims = struck.min(n.saturating_sub(1));
    let others = n - victims;
    let mut starts = vec![0; n];
    for k in 0..others {
        starts[victims + k] = k * jobs / others;
    }
    // Job i is customer i mod keys.
    let keys = keys.max(1) as usize;
    let customer = |job: usize| job % jobs % keys;
    let mut used: Vec<usize> = Vec::new();
    for v in 0..victims {
        let base = starts[victims + v % others];
        let fresh = |a: usize| {
            let (mine, next) = (customer(a), customer(a + 1));
            mine != next && !used.contains(&mine) && !used.contains(&next)
        };
        let a = (0..jobs)
            .map(|d| (base + d) % jobs)
            .find(|&a| fresh(a))
            .unwrap_or(base);
        starts[v] = (a + 1) % jobs;
        if v < others {
            starts[victims + v] = a;
        }
        used.extend([customer(a), customer(a + 1)]);
    }
    // The workers paired with nobody start on customers of their own, while there are
    // customers enough: on one customer they would walk the list in lockstep, every job's
    // workers queued behind each other's lock, and the run would measure the queue.
    for k in victims.min(others)..others {
        let base = starts[victims + k];
        if let Some(a) = (base..(base + keys).min(jobs)).find(|&a| !used.contains(&customer(a))) {
            starts[victims + k] = a;
        }
        used.push(customer(starts[victims + k]));
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_struck_worker_starts_right_after_its_pair_on_customers_of_its_own() {
        let starts = starts(200, 10, 20, VICTIMS);
        let mut customers = Vec::new();
        for v in 0..VICTIMS {
            assert_eq!(starts[v], starts[VICTIMS + v] + 1, "{starts:?}");
            customers.extend([starts[v] % 20, starts[VICTIMS + v] % 20]);
        }
        customers.sort_unstable();
        customers.dedup();
        assert_eq!(customers.len(), 2 * VICTIMS, "{starts:?}");
    }

    #[test]
    fn with_nobody_struck_every_worker_starts_on_a_customer_of_its_own() {
        let starts = starts(2000, 10, 20, 0);
        let mut customers: Vec<usize> = starts.iter().map(|s| s % 20).collect();
        customers.sort_unstable();
        customers.dedup();
        assert_eq!(customers.len(), 10, "{starts:?}");
        // Still spread over the list: each within a few jobs of its even share.
        for (k, &s) in starts.iter().enumerate() {
            assert!((k * 200..k * 200 + 20).contains(&s), "{starts:?}");
        }
    }

    #[test]
    fn few_customers_or_workers_still_give_every_worker_a_start() {
        for (jobs, workers, keys, struck) in [(2, 6, 2, 5), (1, 2, 1, 2), (60, 3, 2, 2)] {
            let starts = starts(jobs, workers, keys, struck);
            assert_eq!(starts.len(), workers as usize);
            assert!(starts.iter().all(|&s| s < jobs as usize), "{starts:?}");
        }
    }
}
