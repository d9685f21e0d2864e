//! Lab 7's job, and nine ways to do it with many workers racing: the SQL is the lesson.
//!
//! **The job.** Issue the invoice for (customer, period) and add its amount to the
//! customer's balance. Done right, every (customer, period) has exactly one invoice, and
//! every balance equals the sum of its customer's invoices. Both rules are checked from the
//! tables afterwards ([`crate::check::no_lock::read_back`]), never from what a worker believed.
//!
//! **The race.** Every worker walks the whole list of jobs (from its own starting point),
//! asks "is this one invoiced yet?" ([`INVOICED_AMONG`], a few jobs ahead in one request)
//! and does the ones that are not. The harm comes from the gap between *deciding* and
//! *writing*: a worker frozen there wakes up believing what it read before the freeze.
//!
//! Read the approaches top to bottom, next to `labs/07-no-lock.md`:
//!
//! ```text
//!  ❌ redis-lock          a Redis lock per customer, then read-modify-write the balance
//!  ❌ fenced-write-only   the same lock, and the row checks a fencing token when it is
//!                         written — fenced the write, not the read it depends on
//!  ✅ optimistic          no lock: UPDATE … WHERE version = <what I read>; 0 rows → retry
//!  ✅ serializable        no lock: read and write in one SERIALIZABLE transaction;
//!                         SQLSTATE 40001 (or 40P01) → roll back, read again
//!  ✅ idempotency-key     no lock: INSERT … ON CONFLICT DO NOTHING; balance += only if inserted
//!  ✅ partitioned         no lock: worker k owns the customers with hash(id) mod N = k
//!  ✅ advisory-xact       pg_advisory_xact_lock inside the transaction that writes
//!  ✅ advisory-session    pg_advisory_lock on the session that writes (held until unlock)
//!  ✅ redis-fenced        the Redis lock, and the token claims the row *before* the read
//! ```
//!
//! The first is the lock most people write, and it is correct only as long as no holder
//! pauses longer than the TTL. The second adds a fencing token and still loses updates: the
//! token is checked at the write, but the value written was computed from a read that no
//! token guarded. Every other row is correct under a freeze at any [`Moment`] of a job, and
//! only one of them uses a lock service at all.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use postgres::Statement;
use postgres::types::ToSql;
use serde::{Deserialize, Serialize};

use crate::connect::PgClient;
use crate::lock::redis::{Held, RETRY_EVERY, RedisLock, Release};

/// How the workers keep the job safe: the lesson of this lab. Declared in the order of
/// [`Approach::ALL`], so that `--help` lists them as the run plays them.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Approach {
    /// ❌ A Redis lock per customer, no fencing: a pause past the TTL lets a stale write in
    RedisLock,
    /// ❌ The Redis lock plus a token the row checks at the write: fenced the write, not the read
    FencedWriteOnly,
    /// Compare-and-set on a version column; zero rows updated means retry
    Optimistic,
    /// Read and write in one SERIALIZABLE transaction; on SQLSTATE 40001 or 40P01, roll
    /// back and read again
    Serializable,
    /// INSERT … ON CONFLICT (customer, period) DO NOTHING; balance changed only if inserted
    IdempotencyKey,
    /// Worker k does only the customers with hash(id) mod N = k: nothing is shared
    Partitioned,
    /// pg_advisory_xact_lock inside the transaction that does the work
    AdvisoryXact,
    /// pg_advisory_lock on the session that does the work, released by pg_advisory_unlock
    AdvisorySession,
    /// The Redis lock plus a token that claims the customer row before reading it
    RedisFenced,
}

impl Approach {
    /// The order of the lab's runs and of its table: the baseline first, its fix last.
    pub const ALL: [Approach; 9] = [
        Approach::RedisLock,
        Approach::FencedWriteOnly,
        Approach::Optimistic,
        Approach::Serializable,
        Approach::IdempotencyKey,
        Approach::Partitioned,
        Approach::AdvisoryXact,
        Approach::AdvisorySession,
        Approach::RedisFenced,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Approach::RedisLock => "redis-lock",
            Approach::Optimistic => "optimistic",
            Approach::Serializable => "serializable",
            Approach::IdempotencyKey => "idempotency-key",
            Approach::Partitioned => "partitioned",
            Approach::AdvisoryXact => "advisory-xact",
            Approach::AdvisorySession => "advisory-session",
            Approach::FencedWriteOnly => "fenced-write-only",
            Approach::RedisFenced => "redis-fenced",
        }
    }

    /// What the approach asks of the problem (or of the system around it).
    pub fn needs(self) -> &'static str {
        match self {
            Approach::RedisLock => "a lock service (and luck: no pause past the TTL)",
            Approach::FencedWriteOnly => "a lock service, a token, and luck: no pause mid-write",
            Approach::RedisFenced => "a lock service, and a row claimed with its token",
            Approach::Optimistic => "a version column on the row it changes; one database",
            Approach::Serializable => {
                "every transaction on these tables SERIALIZABLE; retries under contention"
            }
            Approach::IdempotencyKey => "a natural key for the job (customer, period)",
            Approach::Partitioned => "partitionable work, and a new owner for a dead one",
            Approach::AdvisoryXact | Approach::AdvisorySession => {
                "the work and the lock in one database"
            }
        }
    }

    pub fn uses_redis(self) -> bool {
        matches!(
            self,
            Approach::RedisLock | Approach::FencedWriteOnly | Approach::RedisFenced
        )
    }

    /// The lab marks it ✅: the job comes out right whatever [`Moment`] a freeze lands on,
    /// however long it lasts. The other two are the lessons.
    pub fn safe(self) -> bool {
        !matches!(self, Approach::RedisLock | Approach::FencedWriteOnly)
    }
}

// ─── The tables ───────────────────────────────────────────────────────────────────────
//
// `{jobs}`, `{customers}` and `{invoices}` stand for one run's tables (see `Tables`): they
// live in a schema named after the run, which the run drops when it ends.

/// The job list, the customers, and the invoices. `version` is the optimistic approach's,
/// `fence` the fenced approach's; the others leave them alone. `at` is stamped by the
/// database when the invoice row is written: the lab's clock for jobs/s.
pub const CREATE_TABLES: &str = "
    CREATE TABLE {jobs} (
        id       int    PRIMARY KEY,
        customer int    NOT NULL,
        period   int    NOT NULL,
        amount   bigint NOT NULL
    );
    CREATE TABLE {customers} (
        id      int    PRIMARY KEY,
        balance bigint NOT NULL DEFAULT 0,
        version bigint NOT NULL DEFAULT 0,
        fence   bigint NOT NULL DEFAULT 0
    );
    CREATE TABLE {invoices} (
        customer int         NOT NULL,
        period   int         NOT NULL,
        amount   bigint      NOT NULL,
        worker   text        NOT NULL,
        at       timestamptz NOT NULL DEFAULT clock_timestamp()
    )";

/// Every approach but one indexes invoices by (customer, period) **without** `UNIQUE`: a
/// constraint would turn a duplicate into an error and hide what the approach did. Here a
/// duplicate stays in the table, and the verdict counts it.
pub const INDEX_INVOICES: &str = "CREATE INDEX ON {invoices} (customer, period)";

/// ✅ The idempotency key *is* the unique index: the database refuses a second invoice for
/// the same (customer, period), whoever sends it, however late.
pub const UNIQUE_INVOICES: &str = "CREATE UNIQUE INDEX ON {invoices} (customer, period)";

/// `$1` jobs spread over `$2` customers: job i is customer i mod keys, period i / keys, so
/// consecutive jobs belong to different customers.
pub const FILL_JOBS: &str = "
    INSERT INTO {jobs} (id, customer, period, amount)
        SELECT g, g % $2, g / $2, 100 + (g * 37) % 900 FROM generate_series(0, $1 - 1) g";
pub const FILL_CUSTOMERS: &str = "INSERT INTO {customers} (id) SELECT generate_series(0, $1 - 1)";

/// The job list, as each worker reads it once at the start.
pub const READ_JOBS: &str = "SELECT id, customer, period, amount FROM {jobs} ORDER BY id";

// ─── The statements every approach shares ─────────────────────────────────────────────

/// "Is this one invoiced yet?": every worker asks before it does a job. A read is only a
/// hint — by the time the worker writes, the answer may have changed. Each approach below
/// is a different answer to that.
pub const IS_INVOICED: &str =
    "SELECT EXISTS (SELECT 1 FROM {invoices} WHERE customer = $1 AND period = $2)";

/// The same question for the next few jobs of the walk at once (customers `$1`, periods
/// `$2`), one answer per job in their order: one round trip where [`IS_INVOICED`] takes one
/// per job. Staler for the last jobs of the batch, which changes nothing: the answer was
/// only a hint anyway, and every approach decides again where it writes.
pub const INVOICED_AMONG: &str = "
    SELECT EXISTS (SELECT 1 FROM {invoices} i WHERE i.customer = j.customer AND i.period = j.period)
    FROM unnest($1::int[], $2::int[]) WITH ORDINALITY AS j(customer, period, n)
    ORDER BY j.n";

/// How many jobs ahead a worker asks "invoiced yet?" in one request.
pub const LOOK_AHEAD: usize = 16;

/// The customer's balance and version, and whether the job is invoiced, in **one**
/// statement, so that all three describe the same moment.
pub const READ_CUSTOMER: &str = "
    SELECT balance, version,
           EXISTS (SELECT 1 FROM {invoices} WHERE customer = $1 AND period = $2)
    FROM {customers} WHERE id = $1";

pub const INSERT_INVOICE: &str =
    "INSERT INTO {invoices} (customer, period, amount, worker) VALUES ($1, $2, $3, $4)";

/// ❌ on its own: writes a balance the *worker* computed from what it read. Correct only if
/// nobody else wrote the row since that read — which is what the lock is supposed to
/// guarantee, and what a holder frozen past its TTL no longer has.
pub const SET_BALANCE: &str = "UPDATE {customers} SET balance = $2 WHERE id = $1";

// ─── The approaches ───────────────────────────────────────────────────────────────────

/// ✅ optimistic: the same computed balance, written only if the row is still the version
/// the worker read. Zero rows updated means someone else wrote in between: read again.
pub const SET_BALANCE_IF_VERSION: &str =
    "UPDATE {customers} SET balance = $2, version = version + 1 WHERE id = $1 AND version = $3";

/// ❌ fenced-write-only: the same computed balance, written only if no holder with a higher
/// token has written this customer. It refuses a holder that *decided* while frozen — but
/// not one frozen after this UPDATE and before its COMMIT: the next holder reads the old
/// balance (the sleeper has not committed), its own UPDATE waits on the sleeper's row lock,
/// and when the sleeper commits, `fence <= $3` still holds for the higher token. The write
/// goes through with a balance computed from a read no token guarded: the sleeper's
/// addition is lost. Fenced the write, not the read.
pub const SET_BALANCE_IF_FENCE: &str =
    "UPDATE {customers} SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3";

/// ✅ redis-fenced: the first statement of the transaction claims the row with the token and
/// reads the balance *in the same statement*. The claim takes the row lock, so everything
/// read after it is what the last holder committed; a holder whose claim waited behind a
/// frozen one reads only once the frozen one has committed or rolled back, and a holder
/// with a lower token than the row has seen claims nothing.
pub const CLAIM_ROW: &str =
    "UPDATE {customers} SET fence = $2 WHERE id = $1 AND fence < $2 RETURNING balance";

/// ✅ serializable: the transaction the read and both writes share. Postgres runs it under
/// Serializable Snapshot Isolation: every read takes a predicate lock (SIRead) that blocks
/// nobody and only records what was read; a write to something another serializable
/// transaction read makes a read-write dependency. Postgres does not look for whole cycles
/// of them: it rolls back (SQLSTATE 40001) a transaction in a *dangerous pattern* of
/// dependencies — one with a dependency in and a dependency out among concurrent
/// transactions — that *could* be part of a cycle (PostgreSQL 15 docs, 13.2.3
/// "Serializable Isolation Level", 13.4.1). So some rollbacks are false positives: from
/// that pattern test itself, and from predicate locks coarser than the rows read.
pub const BEGIN_SERIALIZABLE: &str = "BEGIN ISOLATION LEVEL SERIALIZABLE";

/// ✅ idempotency-key: one invoice per (customer, period), decided by the unique index.
/// Zero rows inserted is a no-op: somebody already did this job.
pub const INSERT_INVOICE_ONCE: &str = "
    INSERT INTO {invoices} (customer, period, amount, worker) VALUES ($1, $2, $3, $4)
    ON CONFLICT (customer, period) DO NOTHING";

/// ✅ idempotency-key: the database adds the amount to whatever the balance is *now*, in
/// the transaction whose insert happened. No value read earlier is written back.
pub const ADD_TO_BALANCE: &str = "UPDATE {customers} SET balance = balance + $2 WHERE id = $1";

/// ✅ advisory-xact: waits for the lock on (run, customer); it is released by COMMIT or
/// ROLLBACK — and a closed connection is a ROLLBACK.
pub const ADVISORY_XACT_LOCK: &str = "SELECT pg_advisory_xact_lock($1, $2)";

/// A worker that should *skip* a customer whose lock is taken, rather than queue behind a
/// frozen holder: `false` at once instead of a wait. (`SET LOCAL lock_timeout` bounds the
/// waiting form instead: the wait ends with an error, SQLSTATE 55P03.)
pub const ADVISORY_XACT_TRY_LOCK: &str = "SELECT pg_try_advisory_xact_lock($1, $2)";

/// ✅ advisory-session: the same lock, held by the session until it says so.
pub const ADVISORY_LOCK: &str = "SELECT pg_advisory_lock($1, $2)";
pub const ADVISORY_UNLOCK: &str = "SELECT pg_advisory_unlock($1, $2)";

/// Every statement a worker prepares once, at the start (one round trip each later).
const PREPARED: [&str; 15] = [
    IS_INVOICED,
    INVOICED_AMONG,
    CLAIM_ROW,
    READ_CUSTOMER,
    INSERT_INVOICE,
    SET_BALANCE,
    SET_BALANCE_IF_VERSION,
    SET_BALANCE_IF_FENCE,
    INSERT_INVOICE_ONCE,
    ADD_TO_BALANCE,
    ADVISORY_XACT_LOCK,
    ADVISORY_LOCK,
    ADVISORY_UNLOCK,
    READ_JOBS,
    "SELECT 1",
];

// ─── One worker's desk: the connections, the counts, and each approach as a function ──

/// One job from the list.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Job {
    pub id: i32,
    pub customer: i32,
    pub period: i32,
    pub amount: i64,
}

/// The moments a lab can stop a worker at, in the middle of one job: every approach passes
/// each of them, in this order (an approach with no read passes the first two together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Moment {
    /// It holds its lock, if it takes one, and has not read the customer yet.
    BeforeRead,
    /// It has read what it needs and decided to do the job; it has written nothing of it.
    Decided,
    /// Its transaction has written one of the job's two rows, not the other.
    MidWrite,
    /// Its transaction has written both rows and has not sent COMMIT.
    BeforeCommit,
}

impl Moment {
    pub const ALL: [Moment; 4] = [
        Moment::BeforeRead,
        Moment::Decided,
        Moment::MidWrite,
        Moment::BeforeCommit,
    ];

    /// A column heading.
    pub fn label(self) -> &'static str {
        match self {
            Moment::BeforeRead => "before read",
            Moment::Decided => "after read",
            Moment::MidWrite => "mid-write",
            Moment::BeforeCommit => "before commit",
        }
    }

    /// A table's column: the word `--json` carries for it (a freeze's `at`), so that the
    /// table and the JSON name a point the same way.
    pub fn column(self) -> &'static str {
        match self {
            Moment::BeforeRead => "before-read",
            Moment::Decided => "decided",
            Moment::MidWrite => "mid-write",
            Moment::BeforeCommit => "before-commit",
        }
    }

    /// What the worker has done when it stops there.
    pub fn what(self) -> &'static str {
        match self {
            Moment::BeforeRead => "is about to read the customer and has written nothing",
            Moment::Decided => "decided to invoice it and has written nothing yet",
            Moment::MidWrite => "has written one of its two rows, not the other, uncommitted",
            Moment::BeforeCommit => "has written both rows and not sent COMMIT",
        }
    }
}

/// What one stop looked like, for the lab: the job, and the Redis lock held, if any.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StopInfo {
    pub lock_key: Option<String>,
    pub owner: Option<String>,
    pub token: Option<i64>,
}

/// Where a worker may be stopped: the worker script decides what a stop does.
pub trait Gate {
    fn at(&mut self, moment: Moment, job: &Job, info: StopInfo) -> Result<()>;
}

/// How a job ended for the worker that tried it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This worker wrote the invoice and the balance.
    Invoiced,
    /// Found invoiced before any attempt: nothing to do.
    AlreadyDone,
    /// Attempted, and the database said somebody else had done it (a conflicting insert,
    /// or an optimistic retry that then found the invoice).
    NoOp,
    /// Attempted with this fencing token, lower than one the row had taken: refused.
    Rejected { token: i64 },
}

/// What one worker counted; summed by the lab.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Tally {
    pub invoiced: u64,
    pub already_done: u64,
    /// Optimistic writes that found another version, and serializable transactions Postgres
    /// rolled back (SQLSTATE 40001 or 40P01): each one is a retry from a fresh read.
    pub conflicts: u64,
    /// Attempts the database turned into nothing (ON CONFLICT, or a retry that found it done).
    pub no_ops: u64,
    /// Fenced writes refused for a lower token.
    pub rejected: u64,
    /// Redis `SET NX` attempts that found the lock taken.
    pub lock_retries: u64,
    /// Releases whose compare-and-delete found the key gone or someone else's: Redis ended
    /// this holder's lease before it let go.
    pub leases_lost: u64,
    /// Requests sent to Postgres and Redis (a blocking lock wait counts once).
    pub round_trips: u64,
}

/// A worker's connections and what it needs to do a job.
pub struct Desk {
    pub db: PgClient,
    statements: Vec<(&'static str, Statement)>,
    pub redis: Option<RedisLock>,
    pub tables: Tables,
    pub worker: String,
    /// Simulated work between deciding and writing.
    pub work: Duration,
    /// How long a worker waits for a Redis lock before it gives up (and fails).
    pub lock_wait: Duration,
    /// The run's advisory-lock class: advisory locks are server-wide, so the first key
    /// names the run and the approach, the second the customer.
    pub lock_class: i32,
    pub fence_counter: String,
    pub redis_key_prefix: String,
    pub tally: Tally,
    /// The last look-ahead: where in the walk it starts, and its answers.
    ahead: (usize, Vec<bool>),
}

impl Desk {
    pub fn new(mut db: PgClient, tables: Tables, worker: &str) -> Result<Desk> {
        let mut statements = Vec::new();
        for template in PREPARED {
            let statement = db
                .prepare(&tables.sql(template))
                .with_context(|| format!("preparing {}", template.trim()))?;
            statements.push((template, statement));
        }
        Ok(Desk {
            db,
            statements,
            redis: None,
            tables,
            worker: worker.to_string(),
            work: Duration::ZERO,
            lock_wait: Duration::from_secs(30),
            lock_class: 0,
            fence_counter: String::new(),
            redis_key_prefix: String::new(),
            tally: Tally::default(),
            ahead: (0, Vec::new()),
        })
    }

    fn statement(&self, template: &str) -> Result<Statement> {
        self.statements
            .iter()
            .find(|(t, _)| *t == template)
            .map(|(_, s)| s.clone())
            .with_context(|| format!("no prepared statement for {}", template.trim()))
    }

    /// Runs a statement and returns the rows it changed (one round trip).
    fn execute(&mut self, template: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64> {
        let statement = self.statement(template)?;
        self.tally.round_trips += 1;
        Ok(self.db.execute(&statement, params)?)
    }

    /// The invoice row of `job`, in the transaction under way (INSERT_INVOICE).
    fn insert_invoice(&mut self, job: &Job) -> Result<u64> {
        let worker = self.worker.clone();
        self.execute(
            INSERT_INVOICE,
            &[&job.customer, &job.period, &job.amount, &worker],
        )
    }

    fn query_one(
        &mut self,
        template: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<postgres::Row> {
        let statement = self.statement(template)?;
        self.tally.round_trips += 1;
        Ok(self.db.query_one(&statement, params)?)
    }

    /// BEGIN, COMMIT, ROLLBACK (one round trip each).
    fn say(&mut self, command: &str) -> Result<()> {
        self.tally.round_trips += 1;
        Ok(self.db.batch_execute(command)?)
    }

    /// Reads the job list.
    pub fn jobs(&mut self) -> Result<Vec<Job>> {
        let statement = self.statement(READ_JOBS)?;
        Ok(self
            .db
            .query(&statement, &[])?
            .iter()
            .map(|row| Job {
                id: row.get(0),
                customer: row.get(1),
                period: row.get(2),
                amount: row.get(3),
            })
            .collect())
    }

    /// "Is `walk[i]` invoiced yet?": answered from the last look-ahead, or asked for it and
    /// the [`LOOK_AHEAD`] jobs after it in one round trip ([`INVOICED_AMONG`]).
    pub fn invoiced_yet(&mut self, walk: &[Job], i: usize) -> Result<bool> {
        let (from, answers) = &self.ahead;
        if let Some(&answer) = i.checked_sub(*from).and_then(|k| answers.get(k)) {
            return Ok(answer);
        }
        let jobs = &walk[i..(i + LOOK_AHEAD).min(walk.len())];
        let customers: Vec<i32> = jobs.iter().map(|job| job.customer).collect();
        let periods: Vec<i32> = jobs.iter().map(|job| job.period).collect();
        let statement = self.statement(INVOICED_AMONG)?;
        self.tally.round_trips += 1;
        let rows = self.db.query(&statement, &[&customers, &periods])?;
        self.ahead = (i, rows.iter().map(|row| row.get(0)).collect());
        Ok(self.ahead.1.first().copied().unwrap_or(false))
    }

    /// Does one job the way `approach` says, stopping at `gate`'s moments, unless the walk's
    /// "invoiced yet?" said it is done (`invoiced`, from [`Desk::invoiced_yet`]).
    pub fn do_job(
        &mut self,
        approach: Approach,
        job: &Job,
        invoiced: bool,
        gate: &mut dyn Gate,
    ) -> Result<Outcome> {
        if invoiced {
            self.tally.already_done += 1;
            return Ok(Outcome::AlreadyDone);
        }
        let outcome = match approach {
            Approach::RedisLock => self.with_redis_lock(job, gate)?,
            Approach::FencedWriteOnly => self.with_redis_lock_and_fenced_write(job, gate)?,
            Approach::RedisFenced => self.with_redis_lock_and_claim(job, gate)?,
            Approach::Optimistic => self.optimistic(job, gate)?,
            Approach::Serializable => self.serializable(job, gate)?,
            Approach::IdempotencyKey => self.idempotency_key(job, gate)?,
            Approach::Partitioned => self.as_the_only_owner(job, gate)?,
            Approach::AdvisoryXact => self.with_advisory_xact_lock(job, gate)?,
            Approach::AdvisorySession => self.with_advisory_session_lock(job, gate)?,
        };
        match outcome {
            Outcome::Invoiced => self.tally.invoiced += 1,
            Outcome::AlreadyDone => self.tally.already_done += 1,
            Outcome::NoOp => self.tally.no_ops += 1,
            Outcome::Rejected { .. } => self.tally.rejected += 1,
        }
        Ok(outcome)
    }

    fn is_invoiced(&mut self, job: &Job) -> Result<bool> {
        Ok(self
            .query_one(IS_INVOICED, &[&job.customer, &job.period])?
            .get(0))
    }

    /// The customer's (balance, version, invoiced?) at one moment.
    fn read_customer(&mut self, job: &Job) -> Result<(i64, i64, bool)> {
        let row = self.query_one(READ_CUSTOMER, &[&job.customer, &job.period])?;
        Ok((row.get(0), row.get(1), row.get(2)))
    }

    /// The work itself (computing the invoice, rendering a PDF…): here a sleep.
    fn work(&self) {
        if !self.work.is_zero() {
            thread::sleep(self.work);
        }
    }

    /// ❌ redis-lock: take the customer's Redis lock, read, decide, write, let go.
    ///
    /// Inside the lock everything looks safe: the worker checks that the job is not done,
    /// reads the balance, computes the new one and writes both in one transaction. But the
    /// lock is a lease. A worker frozen after its read (a GC pause, a VM migration) wakes up
    /// past the TTL, when another worker has already taken the lock, invoiced this very job
    /// and added other invoices to the balance. Nothing stops the sleeper: it inserts a
    /// second invoice and writes its stale balance over the others' work — a duplicate and a
    /// lost update, with a correct lock. Frozen before its COMMIT it does the same harm the
    /// other way round: the next holder read before that COMMIT, waits on the row, and then
    /// writes its own stale balance over the sleeper's.
    ///
    /// Fix: [`Desk::with_redis_lock_and_claim`] — or no lock at all, below.
    fn with_redis_lock(&mut self, job: &Job, gate: &mut dyn Gate) -> Result<Outcome> {
        let held = self.take_redis_lock(job, false)?;
        gate.at(Moment::BeforeRead, job, self.stop_info(&held))?;
        let (balance, _, invoiced) = self.read_customer(job)?;
        if invoiced {
            self.let_go(&held)?;
            return Ok(Outcome::AlreadyDone);
        }
        gate.at(Moment::Decided, job, self.stop_info(&held))?;
        self.work();
        self.say("BEGIN")?;
        self.insert_invoice(job)?;
        gate.at(Moment::MidWrite, job, self.stop_info(&held))?;
        self.execute(SET_BALANCE, &[&job.customer, &(balance + job.amount)])?;
        gate.at(Moment::BeforeCommit, job, self.stop_info(&held))?;
        self.say("COMMIT")?;
        self.let_go(&held)?;
        Ok(Outcome::Invoiced)
    }

    /// ❌ fenced-write-only: the same lock, a fencing token drawn with it, and the customer
    /// row takes the write only if it has seen no higher token ([`SET_BALANCE_IF_FENCE`]).
    ///
    /// It refuses a holder frozen *before* its write: by then a higher token has written the
    /// row. It does not survive a holder frozen *inside* its transaction, after the fenced
    /// UPDATE: the next holder's read cannot see the uncommitted write, its fenced UPDATE
    /// waits for the sleeper's row lock and then passes (its token is higher), and it writes
    /// a balance computed from the read before — the sleeper's amount is gone, and if both
    /// did the same job it is invoiced twice. The token fenced the write, not the read.
    ///
    /// Fix: [`Desk::with_redis_lock_and_claim`].
    fn with_redis_lock_and_fenced_write(
        &mut self,
        job: &Job,
        gate: &mut dyn Gate,
    ) -> Result<Outcome> {
        let held = self.take_redis_lock(job, true)?;
        let token = held.token.context("a fenced lock without a token")?;
        gate.at(Moment::BeforeRead, job, self.stop_info(&held))?;
        let (balance, _, invoiced) = self.read_customer(job)?;
        if invoiced {
            self.let_go(&held)?;
            return Ok(Outcome::AlreadyDone);
        }
        gate.at(Moment::Decided, job, self.stop_info(&held))?;
        self.work();
        self.say("BEGIN")?;
        let taken = self.execute(
            SET_BALANCE_IF_FENCE,
            &[&job.customer, &(balance + job.amount), &token],
        )?;
        if taken == 0 {
            self.say("ROLLBACK")?;
            self.let_go(&held)?;
            return Ok(Outcome::Rejected { token });
        }
        gate.at(Moment::MidWrite, job, self.stop_info(&held))?;
        self.insert_invoice(job)?;
        gate.at(Moment::BeforeCommit, job, self.stop_info(&held))?;
        self.say("COMMIT")?;
        self.let_go(&held)?;
        Ok(Outcome::Invoiced)
    }

    /// ✅ redis-fenced: the same lock and token, and the token guards the *read*: the
    /// transaction's first statement claims the customer row with it and reads the balance
    /// ([`CLAIM_ROW`]); only then does the worker ask whether the job is done.
    ///
    /// A holder frozen before its claim wakes up to a row that a higher token has claimed:
    /// it claims nothing and writes nothing. A holder frozen after its claim holds the row
    /// lock: the next holder's claim waits for it — safe, not live, like the advisory locks
    /// — and, once the sleeper has committed, reads what the sleeper wrote and finds the
    /// invoice. The lock still keeps workers off each other's jobs; the row decides.
    fn with_redis_lock_and_claim(&mut self, job: &Job, gate: &mut dyn Gate) -> Result<Outcome> {
        let held = self.take_redis_lock(job, true)?;
        let token = held.token.context("a fenced lock without a token")?;
        gate.at(Moment::BeforeRead, job, self.stop_info(&held))?;
        self.say("BEGIN")?;
        let claim = self.statement(CLAIM_ROW)?;
        self.tally.round_trips += 1;
        let Some(row) = self.db.query_opt(&claim, &[&job.customer, &token])? else {
            self.say("ROLLBACK")?;
            self.let_go(&held)?;
            return Ok(Outcome::Rejected { token });
        };
        let balance: i64 = row.get(0);
        if self.is_invoiced(job)? {
            self.say("ROLLBACK")?;
            self.let_go(&held)?;
            return Ok(Outcome::AlreadyDone);
        }
        gate.at(Moment::Decided, job, self.stop_info(&held))?;
        self.work();
        self.insert_invoice(job)?;
        gate.at(Moment::MidWrite, job, self.stop_info(&held))?;
        self.execute(SET_BALANCE, &[&job.customer, &(balance + job.amount)])?;
        gate.at(Moment::BeforeCommit, job, self.stop_info(&held))?;
        self.say("COMMIT")?;
        self.let_go(&held)?;
        Ok(Outcome::Invoiced)
    }

    /// ✅ optimistic: no lock. Read the balance *and its version*, compute, then write only
    /// if the version is still the one read. A worker that froze in between finds a newer
    /// version (somebody invoiced this customer meanwhile), updates zero rows, reads again —
    /// and now sees the invoice: nothing to do. A worker frozen after its UPDATE holds the
    /// row: the others' UPDATEs wait, then find the version moved and read again. Under
    /// contention the retries pile up; that is its cost, counted in `conflicts`.
    fn optimistic(&mut self, job: &Job, gate: &mut dyn Gate) -> Result<Outcome> {
        const MOST_RETRIES: u32 = 10_000;
        for attempt in 0..MOST_RETRIES {
            // Each moment stops a worker once (the gate's rule), on whichever attempt gets
            // there first: a worker whose first tries all lose still meets its kill.
            gate.at(Moment::BeforeRead, job, StopInfo::default())?;
            let (balance, version, invoiced) = self.read_customer(job)?;
            if invoiced {
                return Ok(if attempt == 0 {
                    Outcome::AlreadyDone
                } else {
                    Outcome::NoOp
                });
            }
            gate.at(Moment::Decided, job, StopInfo::default())?;
            self.work();
            self.say("BEGIN")?;
            let written = self.execute(
                SET_BALANCE_IF_VERSION,
                &[&job.customer, &(balance + job.amount), &version],
            )?;
            if written == 0 {
                self.say("ROLLBACK")?;
                self.tally.conflicts += 1;
                continue;
            }
            gate.at(Moment::MidWrite, job, StopInfo::default())?;
            self.insert_invoice(job)?;
            gate.at(Moment::BeforeCommit, job, StopInfo::default())?;
            self.say("COMMIT")?;
            return Ok(Outcome::Invoiced);
        }
        bail!(
            "gave up on customer {} after {MOST_RETRIES} version conflicts",
            job.customer
        )
    }

    /// ✅ serializable: no lock at all. The read-modify-write of `redis-lock` — read the
    /// balance and whether the job is invoiced, insert the invoice, write the computed
    /// balance — in **one** `SERIALIZABLE` transaction, tried again from a fresh read
    /// whenever Postgres rolls it back.
    ///
    /// Why no lock is needed: two workers that race on one job each read what the other
    /// writes (the invoice that is not there yet, the customer's row), so each transaction
    /// has a read-write dependency on the other: a cycle, which no serial order allows.
    /// Postgres's Serializable Snapshot Isolation tracks those dependencies — it does not
    /// search for cycles; it fails a transaction caught in a pattern of dependencies that
    /// *could* close one, which catches every real cycle and some that are not (false
    /// positives, besides those of its coarse predicate locks) — with SQLSTATE 40001
    /// (`serialization_failure`): at a write, at COMMIT, or, when the other commits
    /// first, at the loser's next statement. (Here both write the customer's row as well, so the loser often meets
    /// the first-updater rule instead, "could not serialize access due to concurrent
    /// update": the same SQLSTATE.) A sleeper frozen anywhere wakes into a transaction
    /// whose snapshot is stale, and Postgres will not let it commit anything computed from
    /// it: it rolls back, reads again, and finds the job done. A deadlock (40P01) is
    /// retried the same way, as the docs advise (PostgreSQL 15, 13.5 "Serialization
    /// Failure Handling").
    ///
    /// What it costs: retries — every loser redoes its read, and under contention the
    /// losers pile up (counted in `conflicts`); a frozen transaction holds its row lock
    /// once it has written, as any writer does. And the guarantee is only among
    /// SERIALIZABLE transactions: one writer at READ COMMITTED (a script, a migration, an
    /// admin's psql) is not tracked, and its writes can make the others' reads stale
    /// unseen. Nor does it reach a hot standby (which refuses SERIALIZABLE) or a logical
    /// replica: a read there can see a state no serial order of the primary produced
    /// (PostgreSQL 15, 13.4.1).
    ///
    /// What this job demonstrates is no more than `REPEATABLE READ` gives: every path that
    /// invoices writes the customer's row, and the first-updater rule fails the second
    /// writer of a row with the same 40001. What only SERIALIZABLE catches is write skew —
    /// two rows, each transaction reads both and writes a different one — where no row is
    /// written twice.
    fn serializable(&mut self, job: &Job, gate: &mut dyn Gate) -> Result<Outcome> {
        const MOST_RETRIES: u32 = 10_000;
        for attempt in 0..MOST_RETRIES {
            match self.serializable_attempt(job, attempt, gate) {
                Err(err) if must_retry(&err) => {
                    // The transaction is aborted (or, after a failed COMMIT, over): end it
                    // and start again from a fresh read.
                    self.say("ROLLBACK")?;
                    self.tally.conflicts += 1;
                }
                done => return done,
            }
        }
        bail!(
            "gave up on customer {} after {MOST_RETRIES} serialization failures",
            job.customer
        )
    }

    /// One try of [`Desk::serializable`]: read, decide, write both rows, commit.
    fn serializable_attempt(
        &mut self,
        job: &Job,
        attempt: u32,
        gate: &mut dyn Gate,
    ) -> Result<Outcome> {
        self.say(BEGIN_SERIALIZABLE)?;
        // The snapshot is taken by the transaction's first statement: the read below.
        gate.at(Moment::BeforeRead, job, StopInfo::default())?;
        let (balance, _, invoiced) = self.read_customer(job)?;
        if invoiced {
            self.say("COMMIT")?;
            return Ok(if attempt == 0 {
                Outcome::AlreadyDone
            } else {
                Outcome::NoOp
            });
        }
        gate.at(Moment::Decided, job, StopInfo::default())?;
        self.work();
        self.insert_invoice(job)?;
        gate.at(Moment::MidWrite, job, StopInfo::default())?;
        self.execute(SET_BALANCE, &[&job.customer, &(balance + job.amount)])?;
        gate.at(Moment::BeforeCommit, job, StopInfo::default())?;
        self.say("COMMIT")?;
        Ok(Outcome::Invoiced)
    }

    /// ✅ idempotency-key: no lock, no read. Insert the invoice with ON CONFLICT DO NOTHING;
    /// only if a row went in, add the amount to the balance — in the same transaction, and
    /// with `balance + amount` computed by the database, not from an earlier read. A worker
    /// that froze before its insert wakes up, inserts nothing, and changes nothing; one
    /// frozen after it makes the same insert of the others wait, and then do nothing.
    fn idempotency_key(&mut self, job: &Job, gate: &mut dyn Gate) -> Result<Outcome> {
        // Nothing is read: "before the read" and "after it" are the same moment.
        gate.at(Moment::BeforeRead, job, StopInfo::default())?;
        gate.at(Moment::Decided, job, StopInfo::default())?;
        self.work();
        self.say("BEGIN")?;
        let inserted = self.execute(
            INSERT_INVOICE_ONCE,
            &[
                &job.customer,
                &job.period,
                &job.amount,
                &self.worker.clone(),
            ],
        )?;
        if inserted == 0 {
            self.say("COMMIT")?;
            return Ok(Outcome::NoOp);
        }
        gate.at(Moment::MidWrite, job, StopInfo::default())?;
        self.execute(ADD_TO_BALANCE, &[&job.customer, &job.amount])?;
        gate.at(Moment::BeforeCommit, job, StopInfo::default())?;
        self.say("COMMIT")?;
        Ok(Outcome::Invoiced)
    }

    /// ✅ partitioned: exactly the ❌ read-modify-write of `redis-lock`, without any lock —
    /// and correct, because only this worker ever writes these customers (the worker script
    /// skips the others' jobs). A frozen owner corrupts nothing; its customers simply wait.
    /// A dead owner needs a new one, and only once it is certainly dead: handing a partition
    /// over while its owner may still wake up brings back every problem of a lease.
    fn as_the_only_owner(&mut self, job: &Job, gate: &mut dyn Gate) -> Result<Outcome> {
        gate.at(Moment::BeforeRead, job, StopInfo::default())?;
        let (balance, _, invoiced) = self.read_customer(job)?;
        if invoiced {
            return Ok(Outcome::AlreadyDone);
        }
        self.write_what_was_read(job, balance, gate)
    }

    /// The read-modify-write's second half, shared by the approaches whose exclusion comes
    /// from elsewhere (a partition, an advisory lock): decide, insert, set, commit.
    fn write_what_was_read(
        &mut self,
        job: &Job,
        balance: i64,
        gate: &mut dyn Gate,
    ) -> Result<Outcome> {
        gate.at(Moment::Decided, job, StopInfo::default())?;
        self.work();
        self.say("BEGIN")?;
        self.insert_invoice(job)?;
        gate.at(Moment::MidWrite, job, StopInfo::default())?;
        self.execute(SET_BALANCE, &[&job.customer, &(balance + job.amount)])?;
        gate.at(Moment::BeforeCommit, job, StopInfo::default())?;
        self.say("COMMIT")?;
        Ok(Outcome::Invoiced)
    }

    /// ✅ advisory-xact: the same read-modify-write, under `pg_advisory_xact_lock` taken
    /// *inside* the transaction that writes — the robust form of the database's own lock.
    /// The lock and the writes live and die together: COMMIT, ROLLBACK or a closed
    /// connection ends both, so no code path can forget to unlock, and a pooler that hands
    /// the connection to someone else between transactions cannot take the lock along. A
    /// frozen worker keeps its connection, so it keeps the lock, and every worker that needs
    /// this customer waits — safe, not live. Only a server-side timeout bounds that
    /// (`idle_in_transaction_session_timeout`), and then the sleeper's COMMIT fails. A
    /// worker that would rather skip a busy customer than queue behind a frozen one asks
    /// [`ADVISORY_XACT_TRY_LOCK`], or bounds the wait with `SET LOCAL lock_timeout`.
    fn with_advisory_xact_lock(&mut self, job: &Job, gate: &mut dyn Gate) -> Result<Outcome> {
        let class = self.lock_class;
        self.say("BEGIN")?;
        self.execute(ADVISORY_XACT_LOCK, &[&class, &job.customer])?;
        gate.at(Moment::BeforeRead, job, StopInfo::default())?;
        let (balance, _, invoiced) = self.read_customer(job)?;
        if invoiced {
            self.say("COMMIT")?;
            return Ok(Outcome::AlreadyDone);
        }
        gate.at(Moment::Decided, job, StopInfo::default())?;
        self.work();
        self.insert_invoice(job)?;
        gate.at(Moment::MidWrite, job, StopInfo::default())?;
        self.execute(SET_BALANCE, &[&job.customer, &(balance + job.amount)])?;
        gate.at(Moment::BeforeCommit, job, StopInfo::default())?;
        self.say("COMMIT")?;
        Ok(Outcome::Invoiced)
    }

    /// ✅ advisory-session: `pg_advisory_lock` belongs to the session, not a transaction, so
    /// it outlives COMMIT and ROLLBACK and must be released by hand. Correct here because
    /// the writes go through the session that holds the lock, and that session lives exactly
    /// as long as this worker: while it is frozen nobody else gets in, and if Postgres ends
    /// the session (`idle_session_timeout`: the session is idle *outside* a transaction, so
    /// the in-transaction timeout never fires) its writes fail with it.
    ///
    /// What breaks it is anything that parts the lock from the writes: a pooler in
    /// transaction mode (PgBouncer's `pool_mode = transaction`) runs the unlock, or the next
    /// write, on another server session; a driver that silently reconnects carries on
    /// writing on a session that never held the lock (the old one's lock died with it); and
    /// an error path that skips the unlock leaves a pooled session holding it for as long as
    /// the session lives. [`Desk::with_advisory_xact_lock`] has none of these problems.
    fn with_advisory_session_lock(&mut self, job: &Job, gate: &mut dyn Gate) -> Result<Outcome> {
        let class = self.lock_class;
        self.execute(ADVISORY_LOCK, &[&class, &job.customer])?;
        let outcome = self.under_session_lock(job, gate);
        // Released on every path, errors included (an error here ends the worker anyway).
        self.execute(ADVISORY_UNLOCK, &[&class, &job.customer])?;
        outcome
    }

    fn under_session_lock(&mut self, job: &Job, gate: &mut dyn Gate) -> Result<Outcome> {
        gate.at(Moment::BeforeRead, job, StopInfo::default())?;
        let (balance, _, invoiced) = self.read_customer(job)?;
        if invoiced {
            return Ok(Outcome::AlreadyDone);
        }
        self.write_what_was_read(job, balance, gate)
    }

    /// Takes the customer's Redis lock (`SET NX PX`, with a token when `fenced`), trying
    /// again after 1ms, then twice as long each time up to [`RETRY_EVERY`], for at most
    /// `lock_wait`. A holder keeps a customer's lock for a job's few round trips, a
    /// millisecond or two: a waiter that always slept the full 20ms would leave the
    /// customer idle ten times longer than it was held.
    fn take_redis_lock(&mut self, job: &Job, fenced: bool) -> Result<Held> {
        let key = format!("{}{}", self.redis_key_prefix, job.customer);
        let counter = self.fence_counter.clone();
        let lock = self.redis.as_mut().context("no Redis connection")?;
        lock.key = key;
        let deadline = Instant::now() + self.lock_wait;
        let mut pause = Duration::from_millis(1);
        // One owner value for every try of this acquisition (see `try_acquire_as`).
        let owner = crate::lock::random_owner();
        loop {
            self.tally.round_trips += 1;
            let held = if fenced {
                lock.try_acquire_fenced_as(&counter, &owner)?
            } else {
                lock.try_acquire_as(&owner)?
            };
            if let Some(held) = held {
                return Ok(held);
            }
            if Instant::now() >= deadline {
                bail!(
                    "waited {:?} for the Redis lock {} and gave up",
                    self.lock_wait,
                    lock.key
                );
            }
            self.tally.lock_retries += 1;
            thread::sleep(pause);
            pause = (pause * 2).min(RETRY_EVERY);
        }
    }

    /// Compare-and-delete; counts a lease that Redis had ended before we let go.
    fn let_go(&mut self, held: &Held) -> Result<()> {
        let lock = self.redis.as_mut().context("no Redis connection")?;
        self.tally.round_trips += 1;
        if lock.release_reporting(held)? != Release::Deleted {
            self.tally.leases_lost += 1;
        }
        Ok(())
    }

    fn stop_info(&self, held: &Held) -> StopInfo {
        StopInfo {
            lock_key: self.redis.as_ref().map(|lock| lock.key.clone()),
            owner: Some(held.owner.clone()),
            token: held.token,
        }
    }
}

/// A serializable transaction Postgres rolled back, to be tried again from a fresh read:
/// SQLSTATE 40001 (`serialization_failure`) or 40P01 (`deadlock_detected`).
pub fn must_retry(err: &anyhow::Error) -> bool {
    use postgres::error::SqlState;
    err.downcast_ref::<postgres::Error>()
        .and_then(postgres::Error::code)
        .is_some_and(|code| {
            *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED
        })
}

/// Which of `owners` workers owns a customer: hash(key) mod N. With small integer keys the
/// key is its own hash; a string key would go through a real hash first.
pub fn owner_of(customer: i32, owners: u32) -> u32 {
    customer.unsigned_abs() % owners.max(1)
}

/// One run's three tables, in the run's own schema.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tables {
    pub schema: String,
    pub approach: String,
}

impl Tables {
    pub fn new(run_id: &str, approach: Approach) -> Tables {
        Tables {
            schema: schema_of(run_id),
            approach: approach.name().replace('-', "_"),
        }
    }

    pub fn name(&self, table: &str) -> String {
        format!("{}.{}_{table}", self.schema, self.approach)
    }

    pub fn sql(&self, template: &str) -> String {
        template
            .replace("{jobs}", &self.name("jobs"))
            .replace("{customers}", &self.name("customers"))
            .replace("{invoices}", &self.name("invoices"))
    }
}

/// The schema that holds every table of a run; dropping it removes them all.
pub fn schema_of(run_id: &str) -> String {
    format!("lockslab_{run_id}")
}

// ─── The verdict, read back from the tables ───────────────────────────────────────────

/// How many invoices each job has: exactly one is right.
pub const INVOICES_PER_JOB: &str = "
    SELECT j.id, count(i.customer)
    FROM {jobs} j LEFT JOIN {invoices} i ON i.customer = j.customer AND i.period = j.period
    GROUP BY j.id ORDER BY j.id";

/// Each customer's balance beside the sum of its invoices: they must be equal.
pub const BALANCE_VS_INVOICES: &str = "
    SELECT c.id, c.balance, coalesce(sum(i.amount), 0)::bigint
    FROM {customers} c LEFT JOIN {invoices} i ON i.customer = c.id
    GROUP BY c.id ORDER BY c.id";

/// From the first invoice to the moment the last job got its first one, on the database's
/// clock (a duplicate written later does not make the jobs any more done).
pub const SPAN_OF_FIRST_INVOICES: &str = "
    SELECT coalesce(extract(epoch FROM max(first) - min(first))::float8, 0)
    FROM (SELECT min(at) AS first FROM {invoices} GROUP BY customer, period) f";

/// The p-th percentile (0–100) of some latencies, by nearest rank; None when there are none.
pub fn percentile(sorted_us: &[u64], p: f64) -> Option<f64> {
    if sorted_us.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * sorted_us.len() as f64).ceil().max(1.0) as usize;
    Some(sorted_us[rank.min(sorted_us.len()) - 1] as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let us: Vec<u64> = (1..=100).map(|ms| ms * 1000).collect();
        assert_eq!(percentile(&us, 50.0), Some(50.0));
        assert_eq!(percentile(&us, 99.0), Some(99.0));
        assert_eq!(percentile(&[7000], 99.0), Some(7.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn every_owner_gets_some_customers() {
        let mut owned = [0; 10];
        for customer in 0..20 {
            owned[owner_of(customer, 10) as usize] += 1;
        }
        assert!(owned.iter().all(|&n| n > 0), "{owned:?}");
    }

    #[test]
    fn help_lists_the_approaches_in_the_order_the_lab_plays_them() {
        use clap::ValueEnum;
        assert_eq!(Approach::value_variants(), Approach::ALL);
    }

    #[test]
    fn a_points_column_is_its_json_word() {
        for moment in Moment::ALL {
            assert_eq!(serde_json::to_value(moment).unwrap(), moment.column());
        }
    }

    #[test]
    fn tables_live_in_the_runs_schema() {
        let tables = Tables::new("ab12cd34", Approach::IdempotencyKey);
        assert_eq!(
            tables.sql("SELECT * FROM {invoices}"),
            "SELECT * FROM lockslab_ab12cd34.idempotency_key_invoices"
        );
    }
}
