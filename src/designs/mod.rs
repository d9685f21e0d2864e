//! The lock designs, each written once. Lab 7 (`lockslab no-lock`) and `lockslab chaos` run
//! this same code; what differs between them lives at the callers, behind [`Desk`]: the
//! job and its tables (lab 7's invoices, chaos's counters), which connection a lock is
//! taken on, and what happens at each [`Point`] of a job — lab 7 stops a worker there to
//! freeze it, chaos says an event there for its schedule to aim a fault at.
//!
//! Read a family's file top to bottom, the broken variants beside their fixes:
//!
//! ```text
//!  redis.rs     ❌ redis-lock          SET NX PX, then read and write: a pause past the TTL
//!               ❌ redis-renewed       the same, renewed by a heartbeat frozen with the client
//!               ❌ fenced-write-only   an INCR token, checked at the write only
//!               ✅ redis-fenced        the token claims the record *before* the read
//!               ✅ redis-durable-token the same claim, the token from a Postgres sequence
//!  redlock.rs   ❌ redlock             a majority of five masters (lab 6), no token
//!               ✅ redlock-fenced      the same lock, a sequence's token claims the read
//!  etcd.rs      ❌ etcd-lease          etcd's lock on a lease, no token
//!               ✅ etcd-fenced         the key's create revision claims the read
//!  postgres.rs  ✅ advisory-xact       pg_advisory_xact_lock in the transaction that writes
//!               ✅ advisory-session    pg_advisory_lock on the session that writes
//!               ✅ skip-locked         any record's row no one holds, FOR UPDATE SKIP LOCKED
//!  no_lock.rs   ✅ optimistic          write only if the version read is still the record's
//!               ✅ serializable        read and write in one SERIALIZABLE transaction
//!               ✅ idempotency-key     the store applies a job once, whoever sends it
//!               ✅ partitioned         one owner per record: nothing is shared
//! ```
//!
//! Every design does the same job — read a record, work, write what was read plus the job —
//! and every one is a different answer to one question: what stops a write computed from a
//! read that another write has made stale? The ❌ ones answer "the lock", and a lock is a
//! lease: a holder frozen past it wakes up still believing.

pub mod etcd;
pub mod no_lock;
pub mod postgres;
pub mod redis;
pub mod redlock;

use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::lock::etcd::EtcdLock;
use crate::lock::redis::{Held, RedisLock, Release};
use crate::store::Outcome;

/// A lock design. Lab 7 plays nine of them ([`crate::invoices::Approach`]), chaos all.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Design {
    /// ❌ SET NX PX per record, no token: a pause past the TTL lets a stale write in
    RedisLock,
    /// ❌ The Redis lock plus an INCR token checked at the write only, not at the read
    FencedWriteOnly,
    /// ✅ The Redis lock plus an INCR token that claims the record before reading it (a
    /// Redis that restarts empty reissues tokens: the strict claim refuses them)
    RedisFenced,
    /// ❌ etcd's lock on the client's lease, no token: a pause past the lease
    EtcdLease,
    /// ✅ etcd's lock; its key's create revision claims the record before the read
    EtcdFenced,
    /// ✅ pg_advisory_xact_lock inside the transaction that reads and writes
    AdvisoryXact,
    /// ✅ No lock: write only if the record's version is still the one read; else retry
    Optimistic,
    /// ✅ No lock: read and write in one SERIALIZABLE transaction; on SQLSTATE 40001 or
    /// 40P01, roll back and read again
    Serializable,
    /// ❌ The Redis lock renewed by a heartbeat thread, no token: a pause stops it too
    RedisRenewed,
    /// ✅ The Redis lock; a token from a Postgres sequence claims the record before the read
    RedisDurableToken,
    /// ✅ pg_advisory_lock on the client's session, held until pg_advisory_unlock
    AdvisorySession,
    /// ✅ No lock service: a record no one holds, its row locked FOR UPDATE SKIP LOCKED
    SkipLocked,
    /// ✅ No lock: the job's log entry only if absent; the store adds one to the counter itself
    IdempotencyKey,
    /// ✅ No lock: client k does only the records with hash mod N = k; nothing is shared
    Partitioned,
    /// ❌ Redlock on five masters (lab 6), no token: a pause past its validity, or a master
    /// that restarts empty under a bare majority
    Redlock,
    /// ✅ Redlock; a token from a Postgres sequence claims the record before the read
    RedlockFenced,
}

impl Design {
    pub const ALL: [Design; 16] = [
        Design::RedisLock,
        Design::RedisRenewed,
        Design::FencedWriteOnly,
        Design::RedisFenced,
        Design::RedisDurableToken,
        Design::Redlock,
        Design::RedlockFenced,
        Design::EtcdLease,
        Design::EtcdFenced,
        Design::AdvisoryXact,
        Design::AdvisorySession,
        Design::SkipLocked,
        Design::Optimistic,
        Design::Serializable,
        Design::IdempotencyKey,
        Design::Partitioned,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Design::RedisLock => "redis-lock",
            Design::FencedWriteOnly => "fenced-write-only",
            Design::RedisFenced => "redis-fenced",
            Design::EtcdLease => "etcd-lease",
            Design::EtcdFenced => "etcd-fenced",
            Design::AdvisoryXact => "advisory-xact",
            Design::Optimistic => "optimistic",
            Design::Serializable => "serializable",
            Design::RedisRenewed => "redis-renewed",
            Design::RedisDurableToken => "redis-durable-token",
            Design::AdvisorySession => "advisory-session",
            Design::SkipLocked => "skip-locked",
            Design::IdempotencyKey => "idempotency-key",
            Design::Partitioned => "partitioned",
            Design::Redlock => "redlock",
            Design::RedlockFenced => "redlock-fenced",
        }
    }

    pub fn uses_redis(self) -> bool {
        matches!(
            self,
            Design::RedisLock
                | Design::RedisRenewed
                | Design::FencedWriteOnly
                | Design::RedisFenced
                | Design::RedisDurableToken
        )
    }

    /// Redlock's designs: five Redis masters of chaos's own per lane, never a given Redis.
    pub fn uses_masters(self) -> bool {
        matches!(self, Design::Redlock | Design::RedlockFenced)
    }

    pub fn uses_etcd(self) -> bool {
        matches!(self, Design::EtcdLease | Design::EtcdFenced)
    }
}

/// Does one job the design's way.
pub fn do_job<D: Desk + ?Sized>(design: Design, desk: &mut D, job: &D::Job) -> Result<Done> {
    match design {
        Design::RedisLock => redis::redis_lock(desk, job),
        Design::RedisRenewed => redis::redis_renewed(desk, job),
        Design::FencedWriteOnly => redis::fenced_write_only(desk, job),
        Design::RedisFenced => redis::redis_fenced(desk, job),
        Design::RedisDurableToken => redis::redis_durable_token(desk, job),
        Design::Redlock => redlock::redlock(desk, job),
        Design::RedlockFenced => redlock::redlock_fenced(desk, job),
        Design::EtcdLease => etcd::etcd_lease(desk, job),
        Design::EtcdFenced => etcd::etcd_fenced(desk, job),
        Design::AdvisoryXact => postgres::advisory_xact(desk, job),
        Design::AdvisorySession => postgres::advisory_session(desk, job),
        Design::SkipLocked => postgres::skip_locked(desk, job),
        Design::Optimistic => no_lock::optimistic(desk, job),
        Design::Serializable => no_lock::serializable(desk, job),
        Design::IdempotencyKey => no_lock::idempotency_key(desk, job),
        Design::Partitioned => no_lock::partitioned(desk, job),
    }
}

// ─── What a design asks of its caller ─────────────────────────────────────────────────

/// A job's record as one read saw it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// What the job adds to (lab 7: the customer's balance; chaos: the counter).
    pub value: i64,
    pub version: i64,
    /// The job is done already (lab 7: invoiced): nothing to write.
    pub done: bool,
    /// The token this read claimed the record with, for a fenced read.
    pub claimed: Option<i64>,
}

/// What the store checks before it takes a write. The store enforces it, on its own row,
/// in the write's own transaction: a check the client made earlier proves nothing by then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Guard {
    /// ❌ Nothing: the lock (or the partition, or the transaction) is trusted to have kept
    /// everyone else out.
    None,
    /// ✅ The record's version is still the one read.
    Version(i64),
    /// ❌ on its own: no higher token has written the record. Checked at the write, it
    /// says nothing of the read the value was computed from.
    NotLower(i64),
    /// ✅ The record is still claimed by this token, claimed before the read.
    ClaimedBy(i64),
    /// ✅ The job applied at most once: the store adds it to what the record holds *now*,
    /// and refuses a job it has applied before (the idempotency key).
    OncePerJob,
}

impl Guard {
    /// The token the write carries, for the fenced guards.
    pub fn token(self) -> Option<i64> {
        match self {
            Guard::NotLower(token) | Guard::ClaimedBy(token) => Some(token),
            _ => None,
        }
    }
}

/// A transaction's isolation level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isolation {
    ReadCommitted,
    /// ✅ serializable: see [`no_lock::serializable`].
    Serializable,
}

impl Isolation {
    pub fn begin(self) -> &'static str {
        match self {
            Isolation::ReadCommitted => "BEGIN",
            Isolation::Serializable => "BEGIN ISOLATION LEVEL SERIALIZABLE",
        }
    }
}

/// Which lock a job holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    Redis,
    Redlock,
    Etcd,
    /// `pg_advisory_xact_lock`: ends with the transaction.
    AdvisoryXact,
    /// `pg_advisory_lock`: held by the session until unlocked.
    AdvisorySession,
    /// A row locked `FOR UPDATE SKIP LOCKED`.
    Row,
}

/// A lock a job took.
#[derive(Clone, Debug)]
pub struct Holding {
    pub service: Service,
    /// The lock's key, as the caller names it ([`Desk::lock_name`]).
    pub name: String,
    pub owner: Option<String>,
    pub token: Option<i64>,
    /// The requests it took (a Redis lock tried again until it was free).
    pub tries: u32,
}

impl Holding {
    fn new(service: Service, name: String) -> Holding {
        Holding {
            service,
            name,
            owner: None,
            token: None,
            tries: 1,
        }
    }
}

/// What letting go of a lock found.
pub enum LetGo<'a> {
    /// A compare-and-delete's answer, for the lock taken as `held`, `ttl` long.
    Redis {
        answer: &'a Result<Release>,
        held: &'a Held,
        ttl: Duration,
    },
    /// Every master's answer, and whether the lock's validity still ran.
    Redlock {
        answers: &'a [crate::lock::redlock::Answer],
        within_validity: bool,
    },
    /// The lease was still ours when we let go.
    Etcd(bool),
    /// The transaction committed (or rolled back), and its lock ended with it.
    WithTransaction(bool),
    /// `pg_advisory_unlock`'s answer: the session still held it.
    Unlocked(bool),
}

/// Why a design tries a job again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retry {
    /// The version it read was no longer the record's.
    Version,
    /// Postgres rolled the transaction back, with this SQLSTATE (40001 or 40P01).
    RolledBack(String),
}

/// The points of a job, in order: where a caller stops a worker (lab 7) or says an event
/// for a fault to aim at (chaos). [`Point::MidWrite`] comes from the store's write itself.
pub enum Point<'a> {
    /// The job's lock is held.
    Locked(&'a Holding),
    /// About to read the record; nothing written.
    BeforeRead,
    /// Read (None: the design reads nothing), and decided to do the job; nothing written.
    Decided(Option<&'a Seen>),
    /// Inside the write's transaction, its rows half-written or locked, not committed.
    MidWrite,
    /// The write's rows all written; COMMIT not sent.
    BeforeCommit,
    /// How the write ended (`error`: why its answer is unknown).
    Wrote {
        seen: Option<&'a Seen>,
        guard: Guard,
        outcome: Outcome,
        error: Option<&'a anyhow::Error>,
    },
    /// The claim found a token as high or higher: nothing read, nothing written.
    ClaimRefused(i64),
    /// The job is tried again from a fresh read.
    Retry(Retry),
    /// The lock let go of.
    Released(&'a Holding, LetGo<'a>),
}

/// How a job ended for the client that tried it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Done {
    /// This client wrote it.
    Written,
    /// Found done before any attempt: nothing to do.
    AlreadyDone,
    /// Attempted, and the store said somebody else had done it.
    NoOp,
    /// Refused for this token: at the claim (`claim`) or at the write.
    Refused { token: i64, claim: bool },
    /// Sent, and no answer came: it may or may not have landed.
    Unknown,
    /// No lock within the wait (or, skip-locked, every record's row held).
    NotTaken,
    /// Tried again as often as the caller allows ([`Desk::retries`]), and dropped.
    Dropped(Retry),
}

/// What a design needs from the caller: the job's store, the lock services, and the
/// points. Each caller names its own tables and keys; the designs name none.
pub trait Desk {
    type Job;

    // The store: one statement each, on the store's connection.
    fn begin(&mut self, isolation: Isolation) -> Result<()>;
    fn commit(&mut self) -> Result<()>;
    fn rollback(&mut self) -> Result<()>;
    /// The job's record now (in the transaction under way, if any).
    fn read(&mut self, job: &Self::Job) -> Result<Seen>;
    /// Claims the job's record for `token` and reads it: None when the record has seen a
    /// token as high or higher. Strictly higher: a token that a restarted counter hands out
    /// again must not claim a record a second time (two holders of one token would both
    /// pass a `<=`).
    fn claim(&mut self, job: &Self::Job, token: i64) -> Result<Option<Seen>>;
    /// Writes the job from `seen` in the transaction under way, if `guard` lets it; false:
    /// refused, nothing of the job written. Says [`Point::MidWrite`] part-way.
    fn write(&mut self, job: &Self::Job, seen: Option<&Seen>, guard: Guard) -> Result<bool>;
    /// The work between deciding and writing (computing an invoice, rendering a PDF).
    fn work(&mut self);
    /// How often `optimistic` and `serializable` try one job before they drop it.
    fn retries(&self) -> u32;
    /// A new store connection after one that may be gone (idempotency-key sends again).
    fn reconnect(&mut self) -> Result<()> {
        Ok(())
    }

    // The lock services.
    fn lock_name(&self, job: &Self::Job) -> String;
    fn lock_wait(&self) -> Duration;
    fn lease(&self) -> Duration;
    /// Runs one of [`postgres`]'s advisory-lock statements with the job's two keys.
    fn advisory(&mut self, sql: &'static str, job: &Self::Job) -> Result<::postgres::Row>;
    fn redis(&mut self) -> Result<&mut RedisLock>;
    /// The Redis counter a fenced lock draws its token from.
    fn redis_counter(&self, job: &Self::Job) -> String;
    /// Another connection to the lock's Redis, for a heartbeat.
    fn heartbeat(&mut self, _name: &str) -> Result<RedisLock> {
        anyhow::bail!("no heartbeat here")
    }
    /// A token from a sequence in the store: no restart of a lock server hands it out again.
    fn sequence_token(&mut self) -> Result<i64> {
        anyhow::bail!("no token sequence here")
    }
    fn etcd(&mut self, _name: &str) -> Result<EtcdLock> {
        anyhow::bail!("no etcd here")
    }
    fn redlock(&mut self, _name: &str) -> Result<&mut crate::lock::redlock::Redlock> {
        anyhow::bail!("no Redlock masters here")
    }
    /// In the transaction under way: locks the row of a record no other transaction holds
    /// (`FOR UPDATE SKIP LOCKED`) and gives the job on it; None: every row is held.
    fn free_row(&mut self, _job: &Self::Job) -> Result<Option<Self::Job>> {
        anyhow::bail!("no skip-locked rows here")
    }

    /// A point of the job.
    fn at(&mut self, job: &Self::Job, point: Point) -> Result<()>;
}

// ─── The steps the designs share ──────────────────────────────────────────────────────

/// The job's middle, when something else keeps the others out (a lock, a partition): read,
/// decide, work, write in a transaction of its own. Exactly as safe as that something.
pub fn read_work_write<D: Desk + ?Sized>(d: &mut D, job: &D::Job, guard: Guard) -> Result<Done> {
    d.at(job, Point::BeforeRead)?;
    let seen = d.read(job)?;
    if seen.done {
        return Ok(Done::AlreadyDone);
    }
    d.at(job, Point::Decided(Some(&seen)))?;
    d.work();
    let outcome = write_alone(d, job, Some(&seen), guard)?;
    Ok(done_by(outcome, guard))
}

/// ✅ The fenced read: the token claims the record *before* the read, in the same
/// statement, so that a holder whose lock ran out under it — and whose token a newer holder
/// has beaten — reads nothing, and a write that follows needs the claim to be still its own.
pub fn claim_read_work_write<D: Desk + ?Sized>(
    d: &mut D,
    job: &D::Job,
    token: i64,
) -> Result<Done> {
    d.at(job, Point::BeforeRead)?;
    let Some(seen) = d.claim(job, token)? else {
        d.at(job, Point::ClaimRefused(token))?;
        return Ok(Done::Refused { token, claim: true });
    };
    if seen.done {
        return Ok(Done::AlreadyDone);
    }
    d.at(job, Point::Decided(Some(&seen)))?;
    d.work();
    let guard = Guard::ClaimedBy(token);
    let outcome = write_alone(d, job, Some(&seen), guard)?;
    Ok(done_by(outcome, guard))
}

/// The write in a transaction of its own: begin, write under `guard`, commit. An error on
/// the way leaves the write's fate unknown (the store's rows tell).
pub fn write_alone<D: Desk + ?Sized>(
    d: &mut D,
    job: &D::Job,
    seen: Option<&Seen>,
    guard: Guard,
) -> Result<Outcome> {
    let decided = d
        .begin(Isolation::ReadCommitted)
        .and_then(|()| d.write(job, seen, guard));
    match decided {
        Ok(accepted) => commit_and_say(d, job, seen, guard, accepted),
        Err(err) => {
            let _ = d.rollback();
            say_wrote(d, job, seen, guard, Err(err))
        }
    }
}

/// Ends the write's transaction and says how it went: accepted or refused once COMMIT
/// answers, unknown when it does not.
pub fn commit_and_say<D: Desk + ?Sized>(
    d: &mut D,
    job: &D::Job,
    seen: Option<&Seen>,
    guard: Guard,
    accepted: bool,
) -> Result<Outcome> {
    if accepted {
        d.at(job, Point::BeforeCommit)?;
    }
    let committed = d.commit().map(|()| accepted);
    say_wrote(d, job, seen, guard, committed)
}

fn say_wrote<D: Desk + ?Sized>(
    d: &mut D,
    job: &D::Job,
    seen: Option<&Seen>,
    guard: Guard,
    decided: Result<bool>,
) -> Result<Outcome> {
    let (outcome, error) = match decided {
        Ok(true) => (Outcome::Accepted, None),
        Ok(false) => (Outcome::Rejected, None),
        Err(err) => (Outcome::Unknown, Some(err)),
    };
    let point = Point::Wrote {
        seen,
        guard,
        outcome,
        error: error.as_ref(),
    };
    d.at(job, point)?;
    Ok(outcome)
}

/// What a write's outcome means for the job, under `guard`.
fn done_by(outcome: Outcome, guard: Guard) -> Done {
    match (outcome, guard.token()) {
        (Outcome::Accepted, _) => Done::Written,
        (Outcome::Unknown, _) => Done::Unknown,
        (Outcome::Rejected, Some(token)) => Done::Refused {
            token,
            claim: false,
        },
        (Outcome::Rejected, None) => Done::NoOp,
    }
}
