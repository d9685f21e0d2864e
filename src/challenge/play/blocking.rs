//! Who waits behind whom, asked of Postgres while a fault lasts: a session blocked on a row
//! lock or an advisory lock names the sessions it waits for (`pg_blocking_pids`, as lab 3
//! and lab 7 ask it). A pause or a held write whose client's lock kept another client's
//! job on the same record waiting bit — the lock held them off — though nobody wrote the
//! record meanwhile; the checker ties the sessions to the clients from the log. (A lock in
//! Redis or etcd is read from its key instead: see `outlast`.)

use super::*;
use crate::check::challenge::Wait;
use crate::nemesis::probe::HARD_BLOCKERS;

/// How often the waits are read while a fault lasts.
const EVERY: Duration = Duration::from_millis(25);

/// Every session of the run's database waiting on another's held lock, with the sessions
/// holding it, and the database's clock.
fn waiting() -> String {
    waits_where("cardinality(blockers) > 0")
}

/// The sessions waiting behind a lock one of the faulted client's sessions holds: its
/// connections to Postgres are its proxy's, whose ports (`$1`) Postgres lists as their
/// clients'.
fn behind_its_sessions() -> String {
    waits_where(
        "EXISTS (SELECT 1 FROM pg_stat_activity blocker
                  WHERE blocker.pid = ANY(blockers) AND blocker.client_port = ANY($1::int[]))",
    )
}

/// Each session of the run's database with its [`HARD_BLOCKERS`] and the database's clock,
/// where `condition` holds.
fn waits_where(condition: &str) -> String {
    format!(
        "SELECT pid, blockers, (1000000 * extract(epoch FROM clock_timestamp()))::bigint
           FROM (SELECT waiter.pid, {HARD_BLOCKERS} AS blockers
                   FROM pg_stat_activity waiter
                  WHERE waiter.datname = current_database()) w
          WHERE {condition}"
    )
}

impl Run<'_> {
    /// Whether a session waits in Postgres behind one of the client's at `index`: a newer
    /// holder held off by its row or advisory lock, once its Redis or etcd lock is gone
    /// (`outlast`). The waits seen are kept, as [`Run::read_waits`] keeps its own. (A client
    /// without a proxy: never, its sessions unknown.)
    pub(super) fn waits_behind(&mut self, index: usize) -> Result<bool> {
        let Some(proxy) = &self.seats[index].proxy else {
            return Ok(false);
        };
        let ports: Vec<i32> = proxy.server_ports().into_iter().map(i32::from).collect();
        let rows = self.clock.query(&behind_its_sessions(), &[&ports])?;
        self.waits.extend(rows.iter().map(wait_of));
        Ok(!rows.is_empty())
    }

    /// While a client is frozen or its write held, reads who waits behind whom.
    pub(super) fn read_waits(&mut self) -> Result<()> {
        let faulted = !self.paused().is_empty() || !self.held_writes.is_empty();
        if !faulted || self.waits_read.is_some_and(|at| at.elapsed() < EVERY) {
            return Ok(());
        }
        self.waits_read = Some(Instant::now());
        let rows = self.clock.query(&waiting(), &[])?;
        self.waits.extend(rows.iter().map(wait_of));
        Ok(())
    }
}

/// A row of [`waiting`] or [`behind_its_sessions`]: the waiter, whom it waits for, when.
fn wait_of(row: &postgres::Row) -> Wait {
    Wait {
        waiter: row.get(0),
        blockers: row.get(1),
        at_us: row.get(2),
    }
}
