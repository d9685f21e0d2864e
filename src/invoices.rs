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
//! The approaches are [`crate::designs`]' code, the same that `lockslab chaos` runs; this
//! file is lab 7's side of it: the tables, the job, and the SQL that puts each design's
//! guard on lab 7's rows. Read them top to bottom, next to `labs/07-no-lock.md`:
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
use std::time::Duration;

use anyhow::{Context, Result, bail};
use postgres::Statement;
use postgres::types::ToSql;
use serde::{Deserialize, Serialize};

use crate::connect::PgClient;
use crate::designs::postgres::{ADVISORY_LOCK, ADVISORY_UNLOCK, ADVISORY_XACT_LOCK};
use crate::designs::{self, Design, Done, Guard, Isolation, LetGo, Point, Retry, Seen, Service};
use crate::lock::redis::{RedisLock, Release};

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

    /// The design this approach runs: the code of [`crate::designs`], shared with chaos.
    pub fn design(self) -> Design {
        match self {
            Approach::RedisLock => Design::RedisLock,
            Approach::FencedWriteOnly => Design::FencedWriteOnly,
            Approach::Optimistic => Design::Optimistic,
            Approach::Serializable => Design::Serializable,
            Approach::IdempotencyKey => Design::IdempotencyKey,
            Approach::Partitioned => Design::Partitioned,
            Approach::AdvisoryXact => Design::AdvisoryXact,
            Approach::AdvisorySession => Design::AdvisorySession,
            Approach::RedisFenced => Design::RedisFenced,
        }
    }

    pub fn name(self) -> &'static str {
        self.design().name()
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

// ─── The guarded writes: the designs' guards, on lab 7's rows ─────────────────────────

/// ✅ optimistic ([`Guard::Version`]): the same computed balance, written only if the row
/// is still the version the worker read. Zero rows updated means someone else wrote in
/// between: read again.
pub const SET_BALANCE_IF_VERSION: &str =
    "UPDATE {customers} SET balance = $2, version = version + 1 WHERE id = $1 AND version = $3";

/// ❌ fenced-write-only ([`Guard::NotLower`]): the same computed balance, written only if
/// no holder with a higher token has written this customer. It refuses a holder that
/// *decided* while frozen — but not one frozen after this UPDATE and before its COMMIT: the
/// next holder reads the old balance (the sleeper has not committed), its own UPDATE waits
/// on the sleeper's row lock, and when the sleeper commits, `fence <= $3` still holds for
/// the higher token. The write goes through with a balance computed from a read no token
/// guarded: the sleeper's addition is lost. Fenced the write, not the read.
pub const SET_BALANCE_IF_FENCE: &str =
    "UPDATE {customers} SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3";

/// ✅ redis-fenced ([`Desk::claim`]): claims the row with the token and reads the balance
/// *in the same statement*. A holder with a token no higher than one the row has seen
/// claims nothing; a claim that waited behind a frozen writer's row lock reads only once
/// that writer has committed or rolled back.
pub const CLAIM_ROW: &str = "
    UPDATE {customers} SET fence = $2 WHERE id = $1 AND fence < $2 RETURNING balance, version";

/// ✅ redis-fenced ([`Guard::ClaimedBy`]): the balance computed from the claimed read,
/// written only if no higher token has claimed the row since.
pub const SET_BALANCE_IF_CLAIMED: &str =
    "UPDATE {customers} SET balance = $2 WHERE id = $1 AND fence = $3";

/// ✅ idempotency-key ([`Guard::OncePerJob`]): one invoice per (customer, period), decided
/// by the unique index. Zero rows inserted is a no-op: somebody already did this job.
pub const INSERT_INVOICE_ONCE: &str = "
    INSERT INTO {invoices} (customer, period, amount, worker) VALUES ($1, $2, $3, $4)
    ON CONFLICT (customer, period) DO NOTHING";

/// ✅ idempotency-key: the database adds the amount to whatever the balance is *now*, in
/// the transaction whose insert happened. No value read earlier is written back.
pub const ADD_TO_BALANCE: &str = "UPDATE {customers} SET balance = balance + $2 WHERE id = $1";

/// Every statement a worker prepares once, at the start (one round trip each later).
const PREPARED: [&str; 16] = [
    IS_INVOICED,
    INVOICED_AMONG,
    CLAIM_ROW,
    READ_CUSTOMER,
    INSERT_INVOICE,
    SET_BALANCE,
    SET_BALANCE_IF_VERSION,
    SET_BALANCE_IF_FENCE,
    SET_BALANCE_IF_CLAIMED,
    INSERT_INVOICE_ONCE,
    ADD_TO_BALANCE,
    ADVISORY_XACT_LOCK,
    ADVISORY_LOCK,
    ADVISORY_UNLOCK,
    READ_JOBS,
    "SELECT 1",
];

// ─── One worker's desk: the connections, the counts, and the points ───────────────────

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

/// A worker's connections and what it needs to do a job: the [`designs::Desk`] of lab 7.
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
    /// Where the lab may stop this worker.
    pub gate: Box<dyn Gate>,
    /// The Redis lock held now, for a stop to report.
    holding: StopInfo,
    /// The last look-ahead: where in the walk it starts, and its answers.
    ahead: (usize, Vec<bool>),
}

/// A worker no lab stops.
struct NeverStop;

impl Gate for NeverStop {
    fn at(&mut self, _: Moment, _: &Job, _: StopInfo) -> Result<()> {
        Ok(())
    }
}

/// How many times `optimistic` and `serializable` try one job before the worker fails.
const MOST_RETRIES: u32 = 10_000;

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
            gate: Box::new(NeverStop),
            holding: StopInfo::default(),
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

    fn query_opt(
        &mut self,
        template: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<postgres::Row>> {
        let statement = self.statement(template)?;
        self.tally.round_trips += 1;
        Ok(self.db.query_opt(&statement, params)?)
    }

    fn query_one(
        &mut self,
        template: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<postgres::Row> {
        self.query_opt(template, params)?
            .with_context(|| format!("no row from {}", template.trim()))
    }

    /// The invoice row of `job`, in the transaction under way (INSERT_INVOICE).
    fn insert_invoice(&mut self, job: &Job) -> Result<u64> {
        let worker = self.worker.clone();
        self.execute(
            INSERT_INVOICE,
            &[&job.customer, &job.period, &job.amount, &worker],
        )
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

    /// Does one job the way `approach` says ([`crate::designs`]), stopping at the gate's
    /// moments, unless the walk's "invoiced yet?" said it is done (`invoiced`, from
    /// [`Desk::invoiced_yet`]).
    pub fn do_job(&mut self, approach: Approach, job: &Job, invoiced: bool) -> Result<Done> {
        if invoiced {
            self.tally.already_done += 1;
            return Ok(Done::AlreadyDone);
        }
        let done = designs::do_job(approach.design(), self, job)?;
        match &done {
            Done::Written => self.tally.invoiced += 1,
            Done::AlreadyDone => self.tally.already_done += 1,
            Done::NoOp => self.tally.no_ops += 1,
            Done::Refused { .. } => self.tally.rejected += 1,
            Done::Unknown => bail!("job {}: its write got no answer", job.id),
            Done::NotTaken => bail!(
                "waited {:?} for the Redis lock {} and gave up",
                self.lock_wait,
                designs::Desk::lock_name(self, job)
            ),
            Done::Dropped(retry) => bail!(
                "gave up on customer {} after {MOST_RETRIES} {}",
                job.customer,
                match retry {
                    Retry::Version => "version conflicts",
                    Retry::RolledBack(_) => "serialization failures",
                }
            ),
        }
        Ok(done)
    }
}

impl designs::Desk for Desk {
    type Job = Job;

    fn begin(&mut self, isolation: Isolation) -> Result<()> {
        self.say(isolation.begin())
    }

    fn commit(&mut self) -> Result<()> {
        self.say("COMMIT")
    }

    fn rollback(&mut self) -> Result<()> {
        self.say("ROLLBACK")
    }

    /// The customer's balance and version, and whether the job is invoiced, in one
    /// statement ([`READ_CUSTOMER`]).
    fn read(&mut self, job: &Job) -> Result<Seen> {
        let row = self.query_one(READ_CUSTOMER, &[&job.customer, &job.period])?;
        Ok(Seen {
            value: row.get(0),
            version: row.get(1),
            done: row.get(2),
            claimed: None,
        })
    }

    /// [`CLAIM_ROW`]; then, in a statement of its own (a snapshot taken after the claim
    /// waited, if it did), whether the job is invoiced.
    fn claim(&mut self, job: &Job, token: i64) -> Result<Option<Seen>> {
        let Some(row) = self.query_opt(CLAIM_ROW, &[&job.customer, &token])? else {
            return Ok(None);
        };
        let done = self
            .query_one(IS_INVOICED, &[&job.customer, &job.period])?
            .get(0);
        Ok(Some(Seen {
            value: row.get(0),
            version: row.get(1),
            done,
            claimed: Some(token),
        }))
    }

    /// The job's two rows, the invoice and the balance, with the guard's statement first:
    /// [`Moment::MidWrite`] is between them.
    fn write(&mut self, job: &Job, seen: Option<&Seen>, guard: Guard) -> Result<bool> {
        let balance = seen.map_or(0, |seen| seen.value) + job.amount;
        let (first, second) = match guard {
            Guard::None => {
                self.insert_invoice(job)?;
                self.at(job, Point::MidWrite)?;
                self.execute(SET_BALANCE, &[&job.customer, &balance])?;
                return Ok(true);
            }
            Guard::OncePerJob => {
                let worker = self.worker.clone();
                let params: [&(dyn ToSql + Sync); 4] =
                    [&job.customer, &job.period, &job.amount, &worker];
                if self.execute(INSERT_INVOICE_ONCE, &params)? == 0 {
                    return Ok(false);
                }
                self.at(job, Point::MidWrite)?;
                self.execute(ADD_TO_BALANCE, &[&job.customer, &job.amount])?;
                return Ok(true);
            }
            Guard::Version(version) => (SET_BALANCE_IF_VERSION, version),
            Guard::NotLower(token) => (SET_BALANCE_IF_FENCE, token),
            Guard::ClaimedBy(token) => (SET_BALANCE_IF_CLAIMED, token),
        };
        if self.execute(first, &[&job.customer, &balance, &second])? == 0 {
            return Ok(false);
        }
        self.at(job, Point::MidWrite)?;
        self.insert_invoice(job)?;
        Ok(true)
    }

    /// The work itself (computing the invoice, rendering a PDF…): here a sleep.
    fn work(&mut self) {
        if !self.work.is_zero() {
            thread::sleep(self.work);
        }
    }

    fn retries(&self) -> u32 {
        MOST_RETRIES
    }

    fn lock_name(&self, job: &Job) -> String {
        format!("{}{}", self.redis_key_prefix, job.customer)
    }

    fn lock_wait(&self) -> Duration {
        self.lock_wait
    }

    fn lease(&self) -> Duration {
        self.redis.as_ref().map_or(Duration::ZERO, |lock| lock.ttl)
    }

    fn advisory(&mut self, sql: &'static str, job: &Job) -> Result<postgres::Row> {
        let class = self.lock_class;
        self.query_one(sql, &[&class, &job.customer])
    }

    fn redis(&mut self) -> Result<&mut RedisLock> {
        self.redis.as_mut().context("no Redis connection")
    }

    /// One counter for every customer: the tokens of the whole run are ordered.
    fn redis_counter(&self, _: &Job) -> String {
        self.fence_counter.clone()
    }

    /// The lab's stops, and its counts: requests, lock spins, leases lost, retries.
    fn at(&mut self, job: &Job, point: Point) -> Result<()> {
        let moment = match point {
            Point::BeforeRead => Moment::BeforeRead,
            Point::Decided(_) => Moment::Decided,
            Point::MidWrite => Moment::MidWrite,
            Point::BeforeCommit => Moment::BeforeCommit,
            Point::Locked(holding) if holding.service == Service::Redis => {
                self.tally.round_trips += u64::from(holding.tries);
                self.tally.lock_retries += u64::from(holding.tries - 1);
                self.holding = StopInfo {
                    lock_key: Some(holding.name.clone()),
                    owner: holding.owner.clone(),
                    token: holding.token,
                };
                return Ok(());
            }
            Point::Released(_, let_go) => {
                self.holding = StopInfo::default();
                if let LetGo::Redis { answer, .. } = let_go {
                    self.tally.round_trips += 1;
                    match answer {
                        Ok(Release::Deleted) => {}
                        Ok(_) => self.tally.leases_lost += 1,
                        Err(err) => bail!("letting go of the Redis lock: {err:#}"),
                    }
                }
                return Ok(());
            }
            Point::Retry(_) => {
                self.tally.conflicts += 1;
                return Ok(());
            }
            Point::Wrote {
                error: Some(err), ..
            } => bail!("job {}: {err:#}", job.id),
            _ => return Ok(()),
        };
        self.gate.at(moment, job, self.holding.clone())
    }
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
