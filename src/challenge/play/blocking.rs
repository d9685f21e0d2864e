//! Who waits behind whom, asked of Postgres while a fault lasts: a session blocked on a row
//! lock or an advisory lock names the sessions it waits for (`pg_blocking_pids`, as lab 3
//! and lab 7 ask it). A pause or a held write whose client's lock kept another client's
//! job on the same record waiting bit — the lock held them off — though nobody wrote the
//! record meanwhile; the checker ties the sessions to the clients from the log. (A lock in
//! Redis or etcd is read from its key instead: see `outlast`.)

use super::*;
use crate::check::challenge::Wait;

/// How often the waits are read while a fault lasts.
const EVERY: Duration = Duration::from_millis(25);

/// Every session of the run's database waiting on another, with the sessions it waits on,
/// and the database's clock.
const WAITING: &str = "
    SELECT pid, pg_blocking_pids(pid),
           (1000000 * extract(epoch FROM clock_timestamp()))::bigint
      FROM pg_stat_activity
     WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0";

/// The sessions waiting behind one that has not moved since `$1` (µs since the epoch, the
/// database's clock) — a faulted client's, frozen or with its write held since then — as
/// [`WAITING`] lists them.
const BEHIND_A_STILL_SESSION: &str = "
    SELECT waiter.pid, pg_blocking_pids(waiter.pid),
           (1000000 * extract(epoch FROM clock_timestamp()))::bigint
      FROM pg_stat_activity waiter
     WHERE waiter.datname = current_database()
       AND EXISTS (SELECT 1 FROM pg_stat_activity blocker
                    WHERE blocker.pid = ANY(pg_blocking_pids(waiter.pid))
                      AND blocker.state_change < to_timestamp($1::bigint / 1000000.0))";

impl Run<'_> {
    /// Whether a session waits in Postgres behind one still since `since_us`: a newer holder
    /// held off by the faulted client's row or advisory lock, once its Redis or etcd lock
    /// is gone (`outlast`). The waits seen are kept, as [`Run::read_waits`] keeps its own.
    pub(super) fn waits_behind_a_still_session(&mut self, since_us: i64) -> Result<bool> {
        let rows = self.clock.query(BEHIND_A_STILL_SESSION, &[&since_us])?;
        self.waits.extend(rows.iter().map(wait_of));
        Ok(!rows.is_empty())
    }

    /// While a client is frozen or its write held, reads who waits behind whom.
    pub(super) fn read_waits(&mut self) -> Result<()> {
        let faulted = !self.nemesis.paused().is_empty() || !self.held_writes.is_empty();
        if !faulted || self.waits_read.is_some_and(|at| at.elapsed() < EVERY) {
            return Ok(());
        }
        self.waits_read = Some(Instant::now());
        let rows = self.clock.query(WAITING, &[])?;
        self.waits.extend(rows.iter().map(wait_of));
        Ok(())
    }
}

/// A row of [`WAITING`] or [`BEHIND_A_STILL_SESSION`]: the waiter, whom it waits for, when.
fn wait_of(row: &postgres::Row) -> Wait {
    Wait {
        waiter: row.get(0),
        blockers: row.get(1),
        at_us: row.get(2),
    }
}
