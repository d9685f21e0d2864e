//! No lock at all: the database decides. Each of these is correct under a freeze at any
//! point of a job, for as long as it lasts — and none of them needs a lock service.

use anyhow::Result;

use super::{Desk, Done, Guard, Isolation, Point, Retry};
use super::{read_work_write, write_alone};
use crate::store::Outcome;

/// How many times idempotency-key sends a job whose answer it did not get.
const SENDS_OF_A_JOB: usize = 3;

/// ✅ optimistic: no lock. Read the record *and its version*, compute, then write only if
/// the version is still the one read ([`Guard::Version`]). A client that froze in between
/// finds a newer version (somebody wrote the record meanwhile), is refused, reads again —
/// and now sees the job done, or the value it must add to. A client frozen inside its
/// write holds the row: the others' writes wait, then find the version moved and read
/// again. Under contention the retries pile up; that is its cost.
pub fn optimistic<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    for attempt in 0..d.retries() {
        // Each point stops a lab 7 worker once, on whichever attempt gets there first: a
        // worker whose first tries all lose still meets its fault.
        d.at(job, Point::BeforeRead)?;
        let seen = d.read(job)?;
        if seen.done {
            return Ok(found_done(attempt));
        }
        d.at(job, Point::Decided(Some(&seen)))?;
        d.work();
        match write_alone(d, job, Some(&seen), Guard::Version(seen.version))? {
            Outcome::Accepted => return Ok(Done::Written),
            Outcome::Unknown => return Ok(Done::Unknown),
            Outcome::Rejected => d.at(job, Point::Retry(Retry::Version))?,
        }
    }
    Ok(Done::Dropped(Retry::Version))
}

/// ✅ serializable: no lock at all. The read-modify-write of `redis-lock` — read, decide,
/// write — in **one** `SERIALIZABLE` transaction, tried again from a fresh read whenever
/// Postgres rolls it back.
///
/// Why no lock is needed: two clients that race on one record each read what the other
/// writes, so each transaction has a read-write dependency on the other: a cycle, which
/// no serial order allows. Postgres's Serializable Snapshot Isolation tracks those
/// dependencies — every read takes a predicate lock (SIRead) that blocks nobody and only
/// records what was read. It does not search for whole cycles: it rolls back (SQLSTATE
/// 40001, `serialization_failure`) a transaction in a *dangerous pattern* of dependencies
/// — one in and one out among concurrent transactions — that *could* close one
/// (PostgreSQL 15 docs, 13.2.3 "Serializable Isolation Level", 13.4.1), at a write, at
/// COMMIT, or, when the other commits first, at the loser's next statement. That catches
/// every real cycle and some that are not (false positives, besides those of its coarse
/// predicate locks). A sleeper frozen anywhere wakes into a transaction whose snapshot is
/// stale, and Postgres will not let it commit anything computed from it: it rolls back,
/// reads again, and finds the job done. A deadlock (40P01) is retried the same way, as the
/// docs advise (13.5 "Serialization Failure Handling").
///
/// What it costs: retries — every loser redoes its read, and under contention the losers
/// pile up; a frozen transaction holds its row lock once it has written, as any writer
/// does. And the guarantee is only among SERIALIZABLE transactions: one writer at READ
/// COMMITTED (a script, a migration, an admin's psql) is not tracked, and its writes can
/// make the others' reads stale unseen. Nor does it reach a hot standby (which refuses
/// SERIALIZABLE) or a logical replica: a read there can see a state no serial order of the
/// primary produced (13.4.1).
///
/// What these jobs demonstrate is no more than `REPEATABLE READ` gives: every path that
/// writes writes the record's row, and the first-updater rule ("could not serialize access
/// due to concurrent update") fails the second writer of a row with the same 40001. What
/// only SERIALIZABLE catches is write skew — two rows, each transaction reads both and
/// writes a different one — where no row is written twice.
pub fn serializable<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    for attempt in 0..d.retries() {
        match serializable_attempt(d, job, attempt) {
            Err(err) if must_retry(&err) => {
                // The transaction is aborted (or, after a failed COMMIT, over): end it and
                // start again from a fresh read.
                d.rollback()?;
                let code = sqlstate(&err).unwrap_or("40001").to_string();
                d.at(job, Point::Retry(Retry::RolledBack(code)))?;
            }
            done => return done,
        }
    }
    Ok(Done::Dropped(Retry::RolledBack("40001".into())))
}

/// One try of [`serializable`]: read, decide, write, commit.
fn serializable_attempt<D: Desk + ?Sized>(d: &mut D, job: &D::Job, attempt: u32) -> Result<Done> {
    d.begin(Isolation::Serializable)?;
    // The snapshot is taken by the transaction's first statement: the read below.
    d.at(job, Point::BeforeRead)?;
    let seen = d.read(job)?;
    if seen.done {
        d.commit()?;
        return Ok(found_done(attempt));
    }
    d.at(job, Point::Decided(Some(&seen)))?;
    d.work();
    d.write(job, Some(&seen), Guard::None)?;
    d.at(job, Point::BeforeCommit)?;
    let outcome = match d.commit() {
        Ok(()) => Outcome::Accepted,
        // Refused at COMMIT: nothing of it committed, and the caller reads again.
        Err(err) if must_retry(&err) => return Err(err),
        Err(err) => {
            let point = Point::Wrote {
                seen: Some(&seen),
                guard: Guard::None,
                outcome: Outcome::Unknown,
                error: Some(&err),
            };
            d.at(job, point)?;
            return Ok(Done::Unknown);
        }
    };
    let point = Point::Wrote {
        seen: Some(&seen),
        guard: Guard::None,
        outcome,
        error: None,
    };
    d.at(job, point)?;
    Ok(Done::Written)
}

/// ✅ idempotency-key: no lock, no read. The store applies the job only if it has not
/// applied it before (the job's key, unique in the store), and adds it to what the record
/// holds *now*, in the same transaction — nothing the client read earlier is written back.
/// A client that froze before its write wakes up, is refused, and changes nothing; one
/// frozen inside it makes the same write of the others wait, and then do nothing.
///
/// The key is also what makes a lost answer harmless: a write whose answer never came may
/// have committed or not, and the client cannot tell which — so it sends the same job
/// again, on a new connection, until the store answers. Once, however often it is sent.
pub fn idempotency_key<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    // Nothing is read: "before the read" and "after it" are the same moment.
    d.at(job, Point::BeforeRead)?;
    d.at(job, Point::Decided(None))?;
    d.work();
    for _ in 0..SENDS_OF_A_JOB {
        match write_alone(d, job, None, Guard::OncePerJob)? {
            Outcome::Accepted => return Ok(Done::Written),
            Outcome::Rejected => return Ok(Done::NoOp),
            Outcome::Unknown => d.reconnect()?,
        }
    }
    Ok(Done::Unknown)
}

/// ✅ partitioned: exactly the ❌ read-modify-write of `redis-lock`, without any lock — and
/// correct, because only this client ever writes these records (the caller gives it only
/// its own: [`owner_of`]). A frozen owner corrupts nothing; its records simply wait. A
/// dead owner needs a new one, and only once it is certainly dead: handing a partition over
/// while its owner may still wake up brings back every problem of a lease.
pub fn partitioned<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    read_work_write(d, job, Guard::None)
}

/// Which of `owners` clients owns a record: hash(key) mod N. With small integer keys the
/// key is its own hash; a string key would go through a real hash first.
pub fn owner_of(key: i32, owners: u32) -> u32 {
    key.unsigned_abs() % owners.max(1)
}

/// A serializable transaction Postgres rolled back, to be tried again from a fresh read:
/// SQLSTATE 40001 (`serialization_failure`) or 40P01 (`deadlock_detected`).
pub fn must_retry(err: &anyhow::Error) -> bool {
    matches!(sqlstate(err), Some("40001" | "40P01"))
}

fn sqlstate(err: &anyhow::Error) -> Option<&str> {
    err.downcast_ref::<postgres::Error>()
        .and_then(postgres::Error::code)
        .map(|code| code.code())
}

/// A job found done on the first read was done by someone else; found done after a retry,
/// this client's attempt came to nothing.
fn found_done(attempt: u32) -> Done {
    if attempt == 0 {
        Done::AlreadyDone
    } else {
        Done::NoOp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_owner_gets_some_records() {
        let mut owned = [0; 10];
        for key in 0..20 {
            owned[owner_of(key, 10) as usize] += 1;
        }
        assert!(owned.iter().all(|&n| n > 0), "{owned:?}");
    }
}
