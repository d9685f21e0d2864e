//! Who waits behind whom, asked of Postgres while a fault lasts: a session blocked on a row
//! lock or an advisory lock names the sessions it waits for (`pg_blocking_pids`, as lab 3
//! and lab 7 ask it). A pause or a held write whose client's lock kept another client's
//! job on the same record waiting bit — the lock held them off — though nobody wrote the
//! record meanwhile; the checker ties the sessions to the clients from the log.

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

impl Run<'_> {
    /// While a client is frozen or its write held, reads who waits behind whom.
    pub(super) fn read_waits(&mut self) -> Result<()> {
        let faulted = !self.nemesis.paused().is_empty() || !self.held_writes.is_empty();
        if !faulted || self.waits_read.is_some_and(|at| at.elapsed() < EVERY) {
            return Ok(());
        }
        self.waits_read = Some(Instant::now());
        for row in self.clock.query(WAITING, &[])? {
            let blockers: Vec<i32> = row.get(1);
            self.waits.push(Wait {
                waiter: row.get(0),
                blockers,
                at_us: row.get(2),
            });
        }
        Ok(())
    }
}
