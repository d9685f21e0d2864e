//! Who waits behind whom, asked of Postgres while a fault lasts: a session blocked on a row
//! lock or an advisory lock names the sessions it waits for (`pg_blocking_pids`, as lab 3
//! and lab 7 ask it). A pause or a held write whose client's lock kept another client's
//! job on the same record waiting bit — the lock held them off — though nobody wrote the
//! record meanwhile; the checker ties the sessions to the clients from the log. (A lock in
//! Redis or etcd is read from its key instead: see `outlast`.)
//!
//! A client that never waits inside Postgres — `pg_try_advisory_lock` asked again and
//! again, `FOR UPDATE NOWAIT` or `SKIP LOCKED` — shows up in no `pg_blocking_pids`. For it
//! the Postgres locks themselves are read: each advisory lock granted in the run's database
//! (`pg_locks`), and each record whose row lock an open transaction holds (the row's
//! `xmax` is that transaction, and its holder has the transaction's id locked), with the
//! sessions that sent a statement in the last moment — those that kept asking.

use super::*;
use crate::check::challenge::{PgLockSeen, Wait};
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

/// How recently a session must have sent a statement to count as asking while a lock was
/// held: a client that asks again every 20ms is seen, one that sleeps is not.
const ASKING_WITHIN_MS: i64 = 100;

/// Every session of the run's database holding a lock it could have taken without waiting:
/// an advisory lock (its record unknown: the key is the client's own), or a row lock on the
/// records — which record, when the row's `xmax` is the session's open transaction; none
/// when only its `RowShareLock` on the table shows it (`FOR UPDATE`/`FOR SHARE` take one;
/// an `xmax` that a later savepoint's update turned into a multixact names no session).
/// With the database's clock and the other sessions of the database that sent a statement
/// within [`ASKING_WITHIN_MS`].
fn postgres_locks_held(records: &str) -> String {
    format!(
        "WITH held AS (
              SELECT l.pid, 'advisory' AS kind, NULL::text AS record
                FROM pg_locks l JOIN pg_database d ON d.oid = l.database
               WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()
              UNION
              SELECT l.pid, 'row', NULL
                FROM pg_locks l
               WHERE l.locktype = 'relation' AND l.granted AND l.mode = 'RowShareLock'
                 AND l.relation = '{records}'::regclass
              UNION
              SELECT l.pid, 'row', r.record
                FROM {records} r
                JOIN pg_locks l ON l.locktype = 'transactionid' AND l.granted
                               AND l.mode = 'ExclusiveLock' AND l.transactionid = r.xmax)
         SELECT h.pid, h.kind, h.record,
                (1000000 * extract(epoch FROM clock_timestamp()))::bigint,
                ARRAY(SELECT a.pid FROM pg_stat_activity a
                       WHERE a.datname = current_database() AND a.pid <> h.pid
                         AND a.pid <> pg_backend_pid()
                         AND a.query_start > clock_timestamp()
                                             - interval '{ASKING_WITHIN_MS} milliseconds')
           FROM held h"
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
        let rows = (self.clock).query(&postgres_locks_held(&self.setup.init.table), &[])?;
        self.pg_locks.extend(rows.iter().map(|row| PgLockSeen {
            session: row.get(0),
            kind: row.get(1),
            record: row.get(2),
            at_us: row.get(3),
            asking: row.get(4),
        }));
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
