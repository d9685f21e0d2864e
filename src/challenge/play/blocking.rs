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
//! (`pg_locks`), and each record whose row an open transaction holds (the row's `xmax`,
//! or the members of the multixact it names), with the sessions that sent a statement in
//! the last moment — those that kept asking.

use super::*;
use crate::check::challenge::{AroundProxy, PgLockKind, PgLockSeen, Wait};
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

/// The database's clock, and the sessions of the run's database (lockslab's own aside) that
/// sent a statement within [`ASKING_WITHIN_MS`]: those that kept asking.
fn asking_now() -> String {
    format!(
        "SELECT (1000000 * extract(epoch FROM clock_timestamp()))::bigint,
                ARRAY(SELECT a.pid FROM pg_stat_activity a
                       WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
                         AND a.query_start > clock_timestamp()
                                             - interval '{ASKING_WITHIN_MS} milliseconds')"
    )
}

/// Each session of the run's database holding an advisory lock (its record unknown: the
/// key is the client's own), and each record whose row an open transaction has locked or
/// updated: the row's `xmax` is that transaction, and its session holds the transaction's
/// id (`pg_locks` lists no row locks, only the ids of the transactions that hold them).
/// A record whose `xmax` names no such transaction comes back with it, to be read as a
/// multixact ([`multixact_holders`]); a row's `xmax` may also be an old, finished one.
fn postgres_locks_held(records: &str) -> String {
    format!(
        "SELECT l.pid, NULL::text, NULL::text
           FROM pg_locks l JOIN pg_database d ON d.oid = l.database
          WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database()
         UNION ALL
         SELECT l.pid, r.record, NULL
           FROM {records} r
           JOIN pg_locks l ON l.locktype = 'transactionid' AND l.granted
                          AND l.mode = 'ExclusiveLock' AND l.transactionid = r.xmax
         UNION ALL
         SELECT NULL, r.record, r.xmax::text
           FROM {records} r
          WHERE r.xmax::text <> '0'
            AND NOT EXISTS (SELECT 1 FROM pg_locks l
                             WHERE l.locktype = 'transactionid' AND l.transactionid = r.xmax)"
    )
}

/// The sessions holding a row whose `xmax` is a multixact: several transactions locked it,
/// or one locked it and a savepoint of its updated it — lockslab's own try of a held write
/// does that, inside the holder's transaction. Its live members are the holders. An `xmax`
/// that is a plain, finished transaction is no multixact: Postgres refuses to read it as
/// one (an error, taken as no holder), or reads the members of an old multixact of the
/// same number, whose transactions have all ended.
const MULTIXACT_HOLDERS: &str = "
    SELECT l.pid
      FROM pg_get_multixact_members($1::text::xid) m
      JOIN pg_locks l ON l.locktype = 'transactionid' AND l.granted
                     AND l.mode = 'ExclusiveLock' AND l.transactionid = m.xid";

/// How often the sessions of the clients' logins are read.
const SESSIONS_EVERY: Duration = Duration::from_millis(50);

/// The sessions of the clients' logins that no fault proxy opened, as they are read.
#[derive(Default)]
pub(super) struct Around {
    read: Option<Instant>,
    /// Seen once with no proxy's port or session: told if still so at the next reading
    /// (a proxy's connection is listed by Postgres a moment before the proxy reads its
    /// session number, and after its link closed).
    once: BTreeSet<i32>,
    told: BTreeSet<i32>,
}

/// Each session of the run's database logged in as one of `$1`, its port, and the clock.
const SESSIONS_OF_LOGINS: &str = "
    SELECT pid, usename::text, coalesce(client_port, -1),
           (1000000 * extract(epoch FROM clock_timestamp()))::bigint
      FROM pg_stat_activity
     WHERE datname = current_database() AND usename = ANY($1)";

impl Run<'_> {
    /// `pause`, `delay`: reads the sessions of the clients' own logins, and tells each that
    /// no fault proxy opened ([`What::SessionAroundProxy`]) — a client reaching Postgres
    /// around its proxy, where no fault holds what it sends. Read every
    /// [`SESSIONS_EVERY`]: a session that connects, writes and leaves in between is not
    /// seen (a change or an UPDATE of the records made there still is, from the log).
    pub(super) fn read_sessions_around(&mut self) -> Result<()> {
        let due = self
            .around
            .read
            .is_none_or(|at| at.elapsed() >= SESSIONS_EVERY);
        if self.client_logins.is_empty() || !self.setup.challenge.proxied() || !due {
            return Ok(());
        }
        self.around.read = Some(Instant::now());
        let rows = self
            .clock
            .query(SESSIONS_OF_LOGINS, &[&self.client_logins])?;
        let proxies = || self.seats.iter().filter_map(|seat| seat.proxy.as_ref());
        let pids: BTreeSet<i32> = proxies().flat_map(|p| p.sessions().pids).collect();
        let ports: BTreeSet<i32> = proxies()
            .flat_map(|p| p.server_ports())
            .map(i32::from)
            .collect();
        let mut stray = BTreeSet::new();
        for row in rows {
            let (pid, login, port, at_us): (i32, String, i32, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            if pids.contains(&pid) || ports.contains(&port) {
                continue;
            }
            stray.insert(pid);
            if self.around.once.contains(&pid) && self.around.told.insert(pid) {
                let text = format!(
                    "{login} opened Postgres session {pid} around its fault proxy: what it \
                     sends there meets no fault"
                );
                let session = AroundProxy {
                    pid,
                    login,
                    at_us,
                    password_changed: false,
                };
                self.note(
                    crate::nemesis::LANE,
                    What::SessionAroundProxy(session),
                    text,
                );
            }
        }
        self.around.once = stray;
        Ok(())
    }

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
        for wait in rows.iter().map(wait_of) {
            self.observe(What::PgWaitSeen(wait));
        }
        Ok(!rows.is_empty())
    }

    /// Whether, in the latest reading of the Postgres locks ([`Run::read_waits`]), a session
    /// of the client at `index` held an advisory lock or `record`'s row while a session of
    /// another client holding a job on `record` had just sent a statement (it kept asking).
    /// The sessions are those the clients' proxies opened, as each proxy read them.
    pub(super) fn asked_while_held(&self, index: usize, record: &str) -> bool {
        let sessions_of = |seat: &Seat| -> BTreeSet<i32> {
            (seat.proxy.iter())
                .flat_map(|proxy| proxy.sessions().pids)
                .collect()
        };
        let own = sessions_of(&self.seats[index]);
        let others: BTreeSet<i32> = (self.seats.iter().enumerate())
            .filter(|(at, seat)| {
                *at != index
                    && seat
                        .job
                        .is_some_and(|(job, _)| job > 0 && self.spec(job).record == record)
            })
            .flat_map(|(_, seat)| sessions_of(seat))
            .collect();
        self.latest_pg_locks().any(|seen| {
            own.contains(&seen.session)
                && seen.may_guard(record)
                && seen.asking.iter().any(|pid| others.contains(pid))
        })
    }

    /// While a client is frozen or its write held, reads who waits behind whom.
    pub(super) fn read_waits(&mut self) -> Result<()> {
        let faulted = !self.paused().is_empty() || !self.held_writes.is_empty();
        if !faulted || self.waits_read.is_some_and(|at| at.elapsed() < EVERY) {
            return Ok(());
        }
        self.waits_read = Some(Instant::now());
        let rows = self.clock.query(&waiting(), &[])?;
        for wait in rows.iter().map(wait_of) {
            self.observe(What::PgWaitSeen(wait));
        }
        let now = self.clock.query_one(&asking_now(), &[])?;
        let (at_us, asking): (i64, Vec<i32>) = (now.get(0), now.get(1));
        let seen = |session, kind, record| PgLockSeen {
            session,
            kind,
            record,
            at_us,
            asking: asking
                .iter()
                .copied()
                .filter(|&pid| pid != session)
                .collect(),
        };
        let rows = (self.clock).query(&postgres_locks_held(&self.setup.init.table), &[])?;
        let mut held = Vec::new();
        for row in rows {
            let (session, record, xmax): (Option<i32>, Option<String>, Option<String>) =
                (row.get(0), row.get(1), row.get(2));
            match (session, xmax) {
                (Some(session), _) if record.is_none() => {
                    held.push(seen(session, PgLockKind::Advisory, None))
                }
                (Some(session), _) => held.push(seen(session, PgLockKind::Row, record)),
                (None, Some(xmax)) => {
                    let holders = self.clock.query(MULTIXACT_HOLDERS, &[&xmax]);
                    for holder in holders.into_iter().flatten() {
                        held.push(seen(holder.get(0), PgLockKind::Row, record.clone()));
                    }
                }
                (None, None) => {}
            }
        }
        for lock in held {
            self.observe(What::PgLockSeen(lock));
        }
        Ok(())
    }

    /// The Postgres locks of the latest reading ([`Run::read_waits`]), from the run's
    /// history: read from its end, as this is asked on every tick while a fault lasts.
    /// Readings are kept in time order, so the latest are the last ones of one moment.
    fn latest_pg_locks(&self) -> impl Iterator<Item = &PgLockSeen> {
        let mut seen = (self.tape.events.iter().rev()).filter_map(|event| match &event.what {
            What::PgLockSeen(seen) => Some(seen),
            _ => None,
        });
        let first = seen.next();
        let latest = first.map(|seen| seen.at_us);
        first
            .into_iter()
            .chain(seen.take_while(move |seen| Some(seen.at_us) == latest))
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
