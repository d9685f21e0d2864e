//! The Postgres lock: a session advisory lock.
//!
//! Read it next to [`super::redis`] and [`super::etcd`]. There is no TTL and no lease here:
//! `pg_advisory_lock(key)` belongs to the database *session* (the connection) that took it,
//! until `pg_advisory_unlock(key)` or until the session ends. So:
//!
//! - a client **process** that dies loses the lock at once: its kernel closes the socket, the
//!   server ends the session, and the next waiter in the lock queue gets the lock — no timer.
//!   A whole client **machine** that dies (power, kernel panic, network cut) sends nothing:
//!   to the server it looks exactly like the frozen client below, and only TCP keepalives
//!   (about two hours with Linux defaults) or a server-side timeout end the session;
//! - a client that **freezes** keeps it for as long as it is frozen: its connection is open,
//!   its kernel still acknowledges TCP traffic (keepalive probes included), and the server
//!   has no reason to end the session. Nobody else gets in — safe — and nobody gets work
//!   done either — not live;
//! - and it has **no fencing token**: the lock is a yes/no, with no number that grows
//!   from holder to holder.
//!
//! A server-side timeout can end a frozen client's session (see [`PgLock::connect`]), which
//! turns the lock back into a lease — with the same stale-write problem as the others.

use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use postgres::Client;
use postgres::error::SqlState;

use crate::connect::{self, PgClient};

/// One lock on one session. The advisory key is derived from the lock's name.
pub struct PgLock {
    session: Arc<Mutex<PgClient>>,
    pub name: String,
    /// The server's process id for our session: what `pg_locks` shows and
    /// `pg_terminate_backend` takes.
    pub backend_pid: i32,
    pinger: Option<Pinger>,
}

impl PgLock {
    /// Opens the lock's own session.
    ///
    /// With `idle_timeout`, the session asks the server to end it after that long without a
    /// command from us: `idle_session_timeout` (Postgres 14+). That is the setting that
    /// applies here, because a session advisory lock is held *outside* a transaction;
    /// `idle_in_transaction_session_timeout` only ends sessions idle inside an open one.
    /// TCP keepalives would not help: a frozen process's kernel answers them.
    ///
    /// A working holder must then keep its session from looking idle, so a pinger sends a
    /// `SELECT 1` every third of the timeout — a heartbeat, as etcd's lease needs, and
    /// frozen with the process the same way. `on_lost` hears when a ping fails.
    pub fn connect(
        url: &str,
        name: &str,
        idle_timeout: Option<Duration>,
        on_lost: impl FnOnce(String) + Send + 'static,
    ) -> Result<PgLock> {
        let mut client = connect::postgres(url)?;
        if let Some(timeout) = idle_timeout {
            client
                .batch_execute(&format!(
                    "SET idle_session_timeout = {}",
                    timeout.as_millis().max(1)
                ))
                .map_err(|err| {
                    anyhow!(
                        "--pg-timeout: Postgres refused idle_session_timeout ({}); it needs Postgres 14 or later",
                        connect::pg_cause(&err)
                    )
                })?;
        }
        let backend_pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .context("Postgres: pg_backend_pid()")?
            .get(0);
        let session = Arc::new(Mutex::new(client));
        let pinger = idle_timeout.map(|t| Pinger::start(session.clone(), t / 3, on_lost));
        Ok(PgLock {
            session,
            name: name.to_string(),
            backend_pid,
            pinger,
        })
    }

    /// Takes the lock, waiting in the server's lock queue at most `wait`; false on timeout.
    ///
    /// `pg_advisory_lock` blocks inside the server, and the server wakes the first waiter
    /// the moment the holder's session lets go — that is why the handover is immediate.
    /// `lock_timeout` bounds the wait (the statement timeout is raised above it, or it
    /// would cut the wait short with a different error).
    pub fn acquire_within(&mut self, wait: Duration) -> Result<bool> {
        let mut session = self.lock_session();
        let wait_ms = wait.as_millis().max(1);
        session
            .batch_execute(&format!(
                "SET lock_timeout = {wait_ms}; SET statement_timeout = {}",
                wait_ms + connect::COMMAND_TIMEOUT.as_millis()
            ))
            .context("Postgres: setting the lock wait")?;
        let taken = match session.execute(
            "SELECT pg_advisory_lock(hashtextextended($1, 0))",
            &[&self.name],
        ) {
            Ok(_) => true,
            Err(err) if err.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => false,
            Err(err) => return Err(anyhow::Error::new(err).context("Postgres: pg_advisory_lock")),
        };
        session
            .batch_execute("RESET lock_timeout; RESET statement_timeout")
            .context("Postgres: resetting the lock wait")?;
        Ok(taken)
    }

    /// Releases: true if this session held the lock and let it go. An error means the
    /// session itself is gone (ended by the server): the lock went with it.
    pub fn release(&mut self) -> Result<bool> {
        if let Some(pinger) = self.pinger.take() {
            pinger.stop();
        }
        let row = self
            .lock_session()
            .query_one(
                "SELECT pg_advisory_unlock(hashtextextended($1, 0))",
                &[&self.name],
            )
            .map_err(|err| anyhow!("{}", connect::pg_cause(&err)))?;
        Ok(row.get(0))
    }

    fn lock_session(&self) -> std::sync::MutexGuard<'_, PgClient> {
        self.session
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Which session holds the advisory lock `name` right now, as the server's `pg_locks` says
/// (the backend pid), and how many sessions wait for it. Read over any connection.
pub fn holder_and_waiters(client: &mut Client, name: &str) -> Result<(Option<i32>, i64)> {
    // A bigint advisory key shows in pg_locks split in two: high half in classid, low half
    // in objid, with objsubid 1.
    let row = client
        .query_one(
            "WITH k AS (SELECT hashtextextended($1, 0) AS key)
             SELECT (SELECT pid FROM pg_locks, k WHERE locktype = 'advisory' AND granted
                       AND objsubid = 1
                       AND classid::bigint = ((k.key >> 32) & 4294967295)
                       AND objid::bigint = (k.key & 4294967295) LIMIT 1),
                    (SELECT count(*) FROM pg_locks, k WHERE locktype = 'advisory' AND NOT granted
                       AND objsubid = 1
                       AND classid::bigint = ((k.key >> 32) & 4294967295)
                       AND objid::bigint = (k.key & 4294967295))",
            &[&name],
        )
        .context("Postgres: reading pg_locks")?;
    Ok((row.get(0), row.get(1)))
}

/// Keeps a session from looking idle to `idle_session_timeout`.
struct Pinger {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Pinger {
    fn start(
        session: Arc<Mutex<PgClient>>,
        every: Duration,
        on_lost: impl FnOnce(String) + Send + 'static,
    ) -> Pinger {
        use std::sync::atomic::Ordering;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_flag = stop.clone();
        let thread = thread::spawn(move || {
            let mut last = Instant::now();
            loop {
                // As etcd's heartbeat: a stop while a ping is overdue (the process was just
                // paused) makes that ping first, so that a lost session is always reported.
                let overdue = last.elapsed() >= every;
                if stop_flag.load(Ordering::SeqCst) && !overdue {
                    return;
                }
                if !overdue {
                    thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let result = session
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .simple_query("SELECT 1");
                last = Instant::now();
                if let Err(err) = result {
                    on_lost(connect::pg_failure(&err));
                    return;
                }
            }
        });
        Pinger {
            stop,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.halt();
    }
}
