//! The database's own locks: the lock lives where the data does, so it cannot outlive the
//! session (or the transaction) that writes.

use anyhow::Result;

use super::{Desk, Done, Guard, Holding, Isolation, LetGo, Point, Service};
use super::{commit_and_say, read_work_write};
use crate::store::Outcome;

/// ✅ advisory-xact: waits for the lock on (`$1`, `$2`); it is released by COMMIT or
/// ROLLBACK — and a closed connection is a ROLLBACK.
pub const ADVISORY_XACT_LOCK: &str = "SELECT pg_advisory_xact_lock($1, $2)";

/// A client that should *skip* a record whose lock is taken, rather than queue behind a
/// frozen holder: `false` at once instead of a wait. (`SET LOCAL lock_timeout` bounds the
/// waiting form instead: the wait ends with an error, SQLSTATE 55P03.)
pub const ADVISORY_XACT_TRY_LOCK: &str = "SELECT pg_try_advisory_xact_lock($1, $2)";

/// ✅ advisory-session: the same lock, held by the session until it says so.
pub const ADVISORY_LOCK: &str = "SELECT pg_advisory_lock($1, $2)";
pub const ADVISORY_UNLOCK: &str = "SELECT pg_advisory_unlock($1, $2)";

/// ✅ advisory-xact: the read-modify-write under `pg_advisory_xact_lock`, taken *inside*
/// the transaction that reads and writes — the robust form of the database's own lock.
/// The lock and the writes live and die together: COMMIT, ROLLBACK or a closed connection
/// ends both, so no code path can forget to unlock, and a pooler that hands the connection
/// to someone else between transactions cannot take the lock along. A frozen client keeps
/// its connection, so it keeps the lock, and every client that needs this record waits —
/// safe, not live. Only a server-side timeout bounds that
/// (`idle_in_transaction_session_timeout`), and then the sleeper's COMMIT fails. A client
/// that would rather skip a busy record than queue behind a frozen one asks
/// [`ADVISORY_XACT_TRY_LOCK`], or bounds the wait with `SET LOCAL lock_timeout`.
pub fn advisory_xact<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    d.begin(Isolation::ReadCommitted)?;
    d.advisory(ADVISORY_XACT_LOCK, job)?;
    let holding = Holding::new(Service::AdvisoryXact, d.lock_name(job));
    d.at(job, Point::Locked(&holding))?;
    let done = in_the_locked_transaction(d, job)?;
    let ended = done != Done::Unknown;
    d.at(
        job,
        Point::Released(&holding, LetGo::WithTransaction(ended)),
    )?;
    Ok(done)
}

/// ✅ advisory-session: `pg_advisory_lock` belongs to the session, not a transaction, so
/// it outlives COMMIT and ROLLBACK and must be released by hand. Correct here because the
/// writes go through the session that holds the lock, and that session lives exactly as
/// long as the client: while it is frozen nobody else gets in, and if Postgres ends the
/// session (`idle_session_timeout`: the session is idle *outside* a transaction, so the
/// in-transaction timeout never fires) its writes fail with it; a killed client's
/// connection closes, and Postgres lets the lock go.
///
/// What breaks it is anything that parts the lock from the writes: a pooler in
/// transaction mode (PgBouncer's `pool_mode = transaction`) runs the unlock, or the next
/// write, on another server session; a driver that silently reconnects carries on writing
/// on a session that never held the lock (the old one's lock died with it); and an error
/// path that skips the unlock leaves a pooled session holding it for as long as the
/// session lives. [`advisory_xact`] has none of these problems.
pub fn advisory_session<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    d.advisory(ADVISORY_LOCK, job)?;
    let holding = Holding::new(Service::AdvisorySession, d.lock_name(job));
    d.at(job, Point::Locked(&holding))?;
    let done = read_work_write(d, job, Guard::None);
    // Released on every path, errors included.
    let unlocked: bool = d.advisory(ADVISORY_UNLOCK, job)?.get(0);
    d.at(job, Point::Released(&holding, LetGo::Unlocked(unlocked)))?;
    done
}

/// ✅ skip-locked (lab 3): no lock service. The job takes the row of any record no other
/// transaction holds, `FOR UPDATE SKIP LOCKED`, and reads and writes it in that same
/// transaction: the row lock is the lock, and it ends with the transaction. A job that
/// finds every row held waits for nothing: it skips its turn.
pub fn skip_locked<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    d.begin(Isolation::ReadCommitted)?;
    let Some(job) = d.free_row(job)? else {
        d.rollback()?;
        return Ok(Done::NotTaken);
    };
    let holding = Holding::new(Service::Row, d.lock_name(&job));
    d.at(&job, Point::Locked(&holding))?;
    in_the_locked_transaction(d, &job)
}

/// Read, decide, work and write in the transaction under way, which holds the lock.
fn in_the_locked_transaction<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    d.at(job, Point::BeforeRead)?;
    let seen = d.read(job)?;
    if seen.done {
        d.commit()?;
        return Ok(Done::AlreadyDone);
    }
    d.at(job, Point::Decided(Some(&seen)))?;
    d.work();
    let accepted = d.write(job, Some(&seen), Guard::None)?;
    Ok(
        match commit_and_say(d, job, Some(&seen), Guard::None, accepted)? {
            Outcome::Accepted => Done::Written,
            Outcome::Rejected => Done::NoOp,
            Outcome::Unknown => Done::Unknown,
        },
    )
}
