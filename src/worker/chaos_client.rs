//! `lockslab chaos`'s client: read-modify-write jobs on a few shared records, one design's
//! way, until its time is up.
//!
//! Every record is a counter and an append-only log. A job reads the counter, works a
//! little, and writes the counter plus one, appending its job number to the log — so a lost
//! update (two jobs that read the same value, both taken) and a duplicated effect (one job
//! in the log twice) are both visible in the tables afterwards. The store decides every
//! write under the record's row lock, numbers the decision, and records the attempt,
//! accepted or not, with the value the job had read: the checker reads all of it back.
//!
//! The designs, the way the labs name them (lab 7 for the first three and the last two):
//!
//! ```text
//!  ❌ redis-lock          SET NX PX per record, then read and write: a pause past the TTL
//!  ❌ fenced-write-only   the same lock, an INCR token checked at the write only
//!  ✅ redis-fenced        the INCR token claims the record *before* the read (a Redis
//!                         that restarts empty reissues tokens: claims are refused)
//!  ❌ etcd-lease          etcd's lock on the client's lease, no token
//!  ✅ etcd-fenced         the lock key's create revision claims the record before the read
//!  ✅ advisory-xact       pg_advisory_xact_lock in the transaction that reads and writes
//!  ✅ optimistic          no lock: write only if the version read is still the record's
//!  ✅ serializable        no lock: the read and the write in one SERIALIZABLE transaction,
//!                         tried again from a fresh read on SQLSTATE 40001 or 40P01
//!  ❌ redis-renewed       the Redis lock, renewed by a heartbeat thread: frozen with it
//!  ✅ redis-durable-token the Redis lock, a token from a Postgres sequence claims the read
//!  ✅ advisory-session    pg_advisory_lock on the client's session, held until unlock
//!  ✅ skip-locked         no lock service: a free record's row, FOR UPDATE SKIP LOCKED
//!  ✅ idempotency-key     no lock: one log entry per job, the store adds one itself
//!  ✅ partitioned         no lock: client k does only the records with hash mod N = k
//!  ❌ redlock             Redlock on five masters of chaos's own, no token (lab 6)
//!  ✅ redlock-fenced      the same, a token from a Postgres sequence claims the read
//! ```

mod redlock;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use postgres::Transaction;
use serde::{Deserialize, Serialize};

use crate::connect::{self, PgClient};
use crate::events::facts::{Acquired, GaveUp, RecordRead, Released, Wrote};
use crate::events::{Emitter, Kind, What};
use crate::invoices::{ADVISORY_LOCK, ADVISORY_UNLOCK, owner_of};
use crate::lock::etcd::{Acquired as EtcdAcquired, EtcdLock};
use crate::lock::redis::{RedisLock, Release, Renewal};
use crate::nemesis::generate::{FaultKind, Rng};
use crate::store::Outcome;

/// A lock design under test.
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
    // chaos redlock (issue 25)
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

    /// The design relies on the lock alone: two holders at once is its failure. The others
    /// expect the lock to fail now and then and fence (or need no lock at all).
    pub fn trusts_the_lock(self) -> bool {
        matches!(
            self,
            Design::RedisLock | Design::RedisRenewed | Design::EtcdLease | Design::Redlock
        )
    }

    /// What the labs teach of it under this kind of fault — the matrix's expectation, cell
    /// by cell (the row's ✅/❌ is [`Design::labs_call_it_safe`], its mark under a pause).
    ///
    /// - **pause**: a client frozen past its lease breaks every design that trusts the lock
    ///   alone or fences only its write (labs 1, 4, 7): the row's mark.
    /// - **kill**: no design here. A killed client sends nothing more (what it already sent
    ///   may still land); its lease runs out
    ///   (or its session ends, and Postgres lets its advisory lock and row locks go) and the
    ///   next holder starts from what the store holds. A kill costs liveness, not safety.
    /// - **restart** (a Redis with no persistence comes back empty): the lock keys go, so a
    ///   second client takes a lock whose holder is still at work (lab 5's failover tells the
    ///   same of a replica that never got the key): `redis-lock` and `redis-renewed` break.
    ///   So does `fenced-write-only`: its `INCR` counter starts again at 1, and once it
    ///   climbs back to a record's highest token, the write check (not lower) lets the
    ///   reissued token through beside its first holder's.
    ///   `redis-fenced`'s claim is strict (`token < new`, lab 7's `CLAIM_ROW`): a reissued
    ///   token claims a record at most once and a lower one not at all — claims are refused
    ///   until the counter passes the highest (liveness, not safety).
    ///   `redlock`'s restart is one of its five masters, back empty: lab 6's restart-empty
    ///   grants the lock twice when the holder had a bare majority (3 of 5) and one of its
    ///   three forgets the key; `redlock-fenced`'s token still refuses the older holder.
    /// - **restart-aof** (the append-only file: the restarted Redis has every write it
    ///   acknowledged — a killed process loses nothing it wrote to the file, whatever the
    ///   fsync policy, bar the default `everysec`'s write postponed behind a slow disk,
    ///   which chaos's `appendfsync always` rules out — the keys' expiry kept as absolute
    ///   times): no lock and no counter is lost, so none of these designs can break by the
    ///   restart alone.
    /// - **delay** (lab 8's delayed write: the client's next write to the store arrives
    ///   late, its process running all along): a lock that nobody renews runs out under the
    ///   write in flight, and a design that does not fence its read breaks as under a pause
    ///   (`redis-lock`; `redlock`, whose validity is fixed at the grant; `fenced-write-only`,
    ///   its `UPDATE` late inside its transaction). A delay on the path to the store does not
    ///   break `redis-renewed` or `etcd-lease` *here*: the client waits for its write's
    ///   answer while its heartbeat or keepalive, not on the store's path, keeps the lock —
    ///   a pause freezes it with the client, a delay does not. A client that times out its
    ///   write and releases, or a delay on the path to the lock service, would.
    /// - **lost-reply** (the reply to a lock request — or the store's answer, for a design
    ///   whose lock is Postgres — lost, the request applied): the client hears an error and
    ///   gives the job up; a lock it was granted runs out, a session reset gives its locks
    ///   back, and the store's own rows settle every write. No design breaks. A Redis
    ///   design that trusts the lock reads unknown: a compare-and-delete whose answer was
    ///   lost cannot tell "I deleted it" from "it expired". `etcd-lease` mostly reads safe:
    ///   its release is retried on a new connection, and the lease revoke says whether the
    ///   lease lived.
    /// - **cut** (the client cut off from its lock server and the store for 1.25 to 3
    ///   leases; what it sends meanwhile is delivered when the cut heals, as TCP resends
    ///   it): its lease runs out while nothing it sends arrives — no renewal, no keepalive
    ///   — another client takes the lock, and its write lands once the cut heals. It
    ///   breaks what a pause breaks, `redis-renewed` and `etcd-lease` included (a delay
    ///   does not: their renewal stays on a path that works); Redlock's masters are not
    ///   behind the proxy (`-`).
    /// - **clock** (the lock server's clock jumps a lease ahead just after a client took its
    ///   lock — SIMULATED by cutting the TTL of the run's lock keys there, as redis-server
    ///   does not run under libfaketime; for Redlock on one to three of its five masters):
    ///   the key expires under its holder, who works on — a pause past the TTL with no
    ///   pause. It breaks what trusts the Redis lock or fences only its write
    ///   (`redis-lock`; `redis-renewed`, whose heartbeat finds the key gone;
    ///   `fenced-write-only`), and `redlock` once enough of
    ///   the masters that granted it forget the key for another client to win a majority
    ///   (lab 6's clock jump); the fenced twins refuse the stale holder's write. etcd's
    ///   leases run on its leader's monotonic clock, and the Postgres designs have no TTL:
    ///   no clock of theirs to jump (`-`).
    /// - **failover** (the Redis designs' primary killed under Sentinel once its replica
    ///   lagged, frozen and cut off, the replica promoted): what restart breaks, for the
    ///   same reason — a lock key or an `INCR` the replica never got is gone (lab 5). The
    ///   designs without Redis do not meet it (`-`). Measured here, a failover alone rarely
    ///   shows it: the promotion outlasts the Sentinels' down-after (1s), so a lease and a
    ///   job, and no client still holds a lock or a token from before the kill when
    ///   another gets one from the promoted replica (a pause across it does: lab 5's A).
    pub fn labs_call_it_safe_under(self, kind: FaultKind) -> bool {
        match kind {
            FaultKind::Pause => self.labs_call_it_safe(),
            FaultKind::Kill | FaultKind::RestartAof => true,
            FaultKind::Restart => !matches!(
                self,
                Design::RedisLock
                    | Design::RedisRenewed
                    | Design::FencedWriteOnly
                    | Design::Redlock
            ),
            // chaos faults (issue 25)
            // Redlock's validity is fixed when it is granted, as redis-lock's TTL: a write held
            // past it lands stale (lab 8's delayed write). A renewed lock stays held meanwhile.
            FaultKind::Delay => !matches!(
                self,
                Design::RedisLock | Design::FencedWriteOnly | Design::Redlock
            ),
            FaultKind::LostReply => true,
            FaultKind::Cut => self.labs_call_it_safe() || self.uses_masters(),
            // chaos failover (issue 25): etcd extends every lease by the election it took
            // when a new leader takes over, so no lease runs out for the kill; the designs
            // without etcd do not meet it.
            FaultKind::LeaderKill => true,
            // chaos clock (issue 25): as under a pause, where a server's clock times the lock.
            FaultKind::Clock => {
                self.labs_call_it_safe() || !(self.uses_redis() || self.uses_masters())
            }
            // Lab 5: the replica Sentinel promotes lacks what the primary had not sent on —
            // a lock key (two holders: redis-lock, redis-renewed), the last `INCR`s (a token
            // drawn again, which fenced-write-only's `>=` lets through); redis-fenced's
            // strict claim refuses a token drawn again (liveness), and a sequence in
            // Postgres forgets nothing. The designs without Redis do not meet it.
            FaultKind::Failover => !matches!(
                self,
                Design::RedisLock | Design::RedisRenewed | Design::FencedWriteOnly
            ),
        }
    }

    /// The moments of a job its client says, where a fault can be aimed: a design with no
    /// lock never says `acquired` or `released` (skip-locked's row lock ends with its
    /// commit, unsaid), and the idempotency key's client reads nothing before its write
    /// (the store adds one to the counter itself).
    pub fn moments(self) -> Vec<Kind> {
        let mut moments = vec![Kind::ReadRecord, Kind::Working, Kind::Wrote];
        match self {
            Design::IdempotencyKey => moments.retain(|kind| *kind != Kind::ReadRecord),
            Design::Optimistic | Design::Serializable | Design::Partitioned => {}
            Design::SkipLocked => moments.push(Kind::Acquired),
            _ => moments.extend([Kind::Acquired, Kind::Released]),
        }
        moments
    }

    /// What the labs teach of it: ✅ safe under a pause (and so under every fault here).
    pub fn labs_call_it_safe(self) -> bool {
        !matches!(
            self,
            Design::RedisLock
                | Design::RedisRenewed
                | Design::FencedWriteOnly
                | Design::EtcdLease
                | Design::Redlock
        )
    }
}

/// One client's script.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ChaosClient {
    pub name: String,
    /// Its place among the clients: its jobs are numbered `(index + 1) * 1000 + n`.
    pub index: u32,
    pub design: Design,
    pub store_url: String,
    pub redis_url: Option<String>,
    pub etcd_url: Option<String>,
    pub run_id: String,
    pub records: Vec<String>,
    /// How long to keep doing jobs.
    pub run_ms: u64,
    /// The work between the read and the write.
    pub work_ms: u64,
    /// The lock's TTL (Redis) or lease (etcd).
    pub lease_ms: u64,
    /// How long to wait for a lock before giving the job up.
    pub wait_ms: u64,
    /// Which records it picks, in which order.
    pub seed: u64,
    /// How many clients there are (`partitioned`: who owns which record).
    #[serde(default)]
    pub clients: u32,
    /// Redlock's masters (`redlock`, `redlock-fenced`), in the order the algorithm asks them.
    #[serde(default)]
    pub masters: Vec<String>,
    /// The Sentinels that name the lock's Redis primary (a schedule with a failover), asked
    /// in order, with the password the primary wants too; none: `redis_url` is the lock's.
    #[serde(default)]
    pub sentinels: Vec<String>,
}

/// The tables, shared by every run; rows carry their run's id.
pub const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS lockslab_chaos_record (
        run_id text NOT NULL, record text NOT NULL,
        value bigint NOT NULL DEFAULT 0, version bigint NOT NULL DEFAULT 0,
        -- the highest token that claimed or wrote the record
        token bigint,
        decisions bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, record));
    CREATE TABLE IF NOT EXISTS lockslab_chaos_attempt (
        run_id text NOT NULL, record text NOT NULL, client text NOT NULL, job bigint NOT NULL,
        read_value bigint, value bigint NOT NULL, token bigint,
        accepted boolean NOT NULL, decided bigint NOT NULL);
    CREATE TABLE IF NOT EXISTS lockslab_chaos_log (
        run_id text NOT NULL, record text NOT NULL, job bigint NOT NULL, seq bigserial);
    -- redis-durable-token's tokens: a sequence survives what an empty Redis forgets
    CREATE SEQUENCE IF NOT EXISTS lockslab_chaos_token;";

/// How many times idempotency-key's client sends a job whose answer it did not get.
const SENDS_OF_A_JOB: usize = 3;

/// How long a write's transaction works with the record's row locked.
const IN_TRANSACTION_MS: u64 = 5;

/// How often a client waiting for a Redis lock asks again (the labs' clients: every
/// 20ms). A job here works 20ms: a lock freed under its holder (a clock jump, a lease run
/// out) is taken before that holder writes whenever another client waits for that record,
/// as a busy service's many waiters would take it — not only on the runs where a waiter's
/// next try happens to fall there.
const RETRY_EVERY: Duration = Duration::from_millis(5);

/// The store's rule for one write.
#[derive(Clone, Copy, Debug)]
enum Rule {
    /// ❌ Always: the lock is trusted to have kept everyone else out.
    Unfenced,
    /// ❌ At the write only: a token not lower than the highest seen is accepted, whatever
    /// the value was computed from.
    TokenNotLower(i64),
    /// ✅ The record is still claimed by this token (claimed before the read).
    ClaimedBy(i64),
    /// ✅ The record's version is still the one read.
    Version(i64),
    /// ✅ The store adds one to whatever the record holds now, once per job (its log
    /// entry is the idempotency key): nothing the client read goes into the write.
    OncePerJob,
    /// A claim a higher token had already beaten: refused, and recorded.
    Refused(i64),
}

/// What a job read.
struct Read {
    value: i64,
    version: i64,
}

struct Client<'a> {
    script: &'a ChaosClient,
    me: Emitter,
    store: PgClient,
    redis: Option<RedisLock>,
    /// Where `redis` is connected: the lock's Redis, or the primary Sentinel named.
    redis_at: Option<String>,
    redlock: Option<crate::lock::redlock::Redlock>,
}

pub fn run(script: &ChaosClient) -> Result<()> {
    let me = Emitter::new(&script.name);
    let store = connect::postgres(&script.store_url)?;
    let mut client = Client {
        script,
        me,
        store,
        redis: None,
        redis_at: None,
        redlock: None,
    };
    let mut rng = Rng::new(script.seed);
    let until = Instant::now() + Duration::from_millis(script.run_ms);
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let job = (i64::from(script.index) + 1) * 1000 + n;
        let record = match script.design {
            Design::Partitioned => {
                let mine: Vec<&String> = script
                    .records
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| owner_of(*i as i32, script.clients) == script.index)
                    .map(|(_, record)| record)
                    .collect();
                if mine.is_empty() {
                    // More clients than records: this one owns none and waits its time out.
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                (*rng.pick(&mine)).clone()
            }
            _ => rng.pick(&script.records).clone(),
        };
        if let Err(err) = client.job(job, &record) {
            // A server restarted, a session ended: a real client logs it and goes on.
            client.me.say(
                GaveUp {
                    error: Some(format!("{err:#}")),
                    ..GaveUp::default()
                },
                format!("job {job} on {record} failed: {err:#}"),
            );
            client.redis = None;
            if client.store.is_closed() {
                client.store = connect::postgres(&script.store_url)?;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(rng.between(0, 10)));
    }
    Ok(())
}

impl Client<'_> {
    fn job(&mut self, job: i64, record: &str) -> Result<()> {
        match self.script.design {
            Design::RedisLock
            | Design::RedisRenewed
            | Design::FencedWriteOnly
            | Design::RedisFenced
            | Design::RedisDurableToken => self.redis_job(job, record),
            Design::EtcdLease | Design::EtcdFenced => self.etcd_job(job, record),
            Design::Redlock | Design::RedlockFenced => self.redlock_job(job, record),
            Design::AdvisoryXact => self.advisory_job(job, record),
            Design::AdvisorySession => self.advisory_session_job(job, record),
            Design::SkipLocked => self.skip_locked_job(job),
            Design::Optimistic => self.optimistic_job(job, record),
            Design::Serializable => self.serializable_job(job, record),
            Design::IdempotencyKey => self.once_per_job(job, record),
            // Nothing shared: the record is this client's alone, read and written plainly.
            Design::Partitioned => self.read_work_write(job, record, Rule::Unfenced),
        }
    }

    /// The idempotency key at work: a write whose answer never came may have committed or
    /// not, and the client cannot tell which — so it sends the same job again, on a new
    /// connection, until the store answers. A second copy of a job that had landed finds
    /// its log entry (the key) and changes nothing: once, however often it is sent.
    fn once_per_job(&mut self, job: i64, record: &str) -> Result<()> {
        for _ in 0..SENDS_OF_A_JOB {
            if self.write(job, record, -1, Rule::OncePerJob) != Outcome::Unknown {
                return Ok(());
            }
            if self.store.is_closed() {
                self.store = connect::postgres(&self.script.store_url)?;
            }
        }
        Ok(())
    }

    fn lock_name(&self, record: &str) -> String {
        format!("lockslab:{}:chaos:{record}", self.script.run_id)
    }

    fn redis_job(&mut self, job: i64, record: &str) -> Result<()> {
        let design = self.script.design;
        let key = self.lock_name(record);
        if self.redis.is_none() {
            // Under Sentinel, where the primary is now: asked again after every error.
            let url = match self.script.sentinels.as_slice() {
                [] => self.script.redis_url.clone().context("no Redis URL")?,
                sentinels => primary_url(sentinels)?,
            };
            let ttl = Duration::from_millis(self.script.lease_ms);
            let mut lock = RedisLock::new(connect::redis(&url)?, &key, ttl);
            lock.retry_every = RETRY_EVERY;
            self.redis = Some(lock);
            self.redis_at = Some(url);
        }
        let lock = self.redis.as_mut().expect("connected above");
        lock.key = key.clone();
        let counter = format!("{key}:token");
        let incr_token = matches!(design, Design::FencedWriteOnly | Design::RedisFenced);
        let wait = Duration::from_millis(self.script.wait_ms);
        let Some(mut held) = lock.acquire_within(wait, incr_token.then_some(counter.as_str()))?
        else {
            return self.gave_up(job, record);
        };
        if design == Design::RedisDurableToken {
            // The token from a sequence in Postgres: an empty Redis, restarted, forgets its
            // INCR counter (and hands out token 1 again); the sequence remembers.
            let row = self
                .store
                .query_one("SELECT nextval('lockslab_chaos_token')", &[])?;
            held.token = Some(row.get(0));
        }
        self.acquired(&key, Some(&held.owner), held.token, "redis", job, record);
        // The heartbeat renews the key every TTL/3 on a connection of its own — and is
        // frozen with the rest of the process by a pause.
        let renewal = if design == Design::RedisRenewed {
            let url = self.redis_at.as_deref().context("no Redis URL")?;
            let ttl = Duration::from_millis(self.script.lease_ms);
            let heartbeat = RedisLock::new(connect::redis(url)?, &key, ttl);
            Some(Renewal::start(heartbeat, held.clone(), Box::new(|_| {})))
        } else {
            None
        };
        let rule = match (design, held.token) {
            (Design::FencedWriteOnly, Some(token)) => Rule::TokenNotLower(token),
            (Design::RedisFenced | Design::RedisDurableToken, Some(token)) => {
                Rule::ClaimedBy(token)
            }
            _ => Rule::Unfenced,
        };
        let done = self.read_work_write(job, record, rule);
        if let Some(renewal) = renewal {
            renewal.stop();
        }
        done?;
        let lock = self.redis.as_mut().expect("connected above");
        let ttl = Duration::from_millis(self.script.lease_ms);
        let answer = lock.release_reporting(&held);
        // Another client's value in the key proves two holders only while ours could not
        // have expired by itself (less a drift allowance, as Redlock's): a key that ran out
        // and was taken again is the lock working as designed — the store's rows judge the
        // late holder's write. Redlock's release is judged the same way.
        let within_ttl = held.asked_at.elapsed() + crate::lock::redlock::drift(ttl, 0.01) < ttl;
        let (released, found_owner) = match answer {
            Ok(Release::Deleted) => (true, None),
            Ok(Release::HeldBy(owner)) if within_ttl => (false, Some(owner)),
            Ok(Release::HeldBy(_) | Release::Gone) => (false, None),
            // Redis did not answer (it was restarting): whether the lock was still ours, or
            // someone else's meanwhile, is not known. Said as a release that found nothing
            // of its own, which the checker counts as unknown — never as a pass.
            Err(err) => {
                self.me.say(
                    Released {
                        released: Some(false),
                        ..Released::default()
                    },
                    format!(
                        "could not let go of {record}'s lock ({}): whether it was still its own is unknown",
                        err.root_cause()
                    ),
                );
                return Ok(());
            }
        };
        self.released(record, released, found_owner);
        Ok(())
    }

    fn etcd_job(&mut self, job: i64, record: &str) -> Result<()> {
        let url = self.script.etcd_url.as_deref().context("no etcd URL")?;
        let name = self.lock_name(record);
        let mut lock = EtcdLock::connect(url, &name)?;
        let lease = lock.grant_lease(Duration::from_millis(self.script.lease_ms), |_| {})?;
        let wait = Duration::from_millis(self.script.wait_ms);
        let held = match lock.acquire_within(&lease, wait)? {
            EtcdAcquired::Held(held) => held,
            _ => {
                let _ = lock.revoke(lease);
                return self.gave_up(job, record);
            }
        };
        self.acquired(&name, None, Some(held.token), "etcd", job, record);
        let rule = match self.script.design {
            Design::EtcdFenced => Rule::ClaimedBy(held.token),
            _ => Rule::Unfenced,
        };
        let done = self.read_work_write(job, record, rule);
        let released = lock.release(lease, &held)?;
        self.released(record, released, None);
        done
    }

    fn advisory_job(&mut self, job: i64, record: &str) -> Result<()> {
        let name = self.lock_name(record);
        let (script, me) = (self.script, &self.me);
        let mut tx = self.store.transaction()?;
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&name])?;
        me.say(
            Acquired {
                lock: Some(name.clone()),
                backend: Some("postgres".into()),
                ..Acquired::default()
            },
            format!("job {job}: holds the advisory lock of {record} (in its transaction)"),
        );
        let read = read(&mut tx, script, record, None)?.context("the record is missing")?;
        say_read(me, job, record, &read, None);
        std::thread::sleep(Duration::from_millis(script.work_ms));
        let accepted = decide(&mut tx, script, job, record, read.value, Rule::Unfenced)?;
        let outcome = match tx.commit() {
            Ok(()) if accepted => Outcome::Accepted,
            Ok(()) => Outcome::Rejected,
            Err(_) => Outcome::Unknown,
        };
        say_wrote(me, job, record, read.value + 1, None, outcome);
        me.say(
            Released {
                released: Some(outcome != Outcome::Unknown),
                ..Released::default()
            },
            format!("job {job}: the transaction ended, and the advisory lock with it"),
        );
        Ok(())
    }

    /// The advisory lock on the session: held across the read's and the write's
    /// transactions until unlocked — or until the session ends (a killed client's
    /// connection closes, and Postgres lets the lock go). A paused client keeps it.
    fn advisory_session_job(&mut self, job: i64, record: &str) -> Result<()> {
        let (space, key) = self.advisory_keys(record);
        self.store.execute(ADVISORY_LOCK, &[&space, &key])?;
        let name = self.lock_name(record);
        self.acquired(&name, None, None, "postgres", job, record);
        let done = self.read_work_write(job, record, Rule::Unfenced);
        let unlocked: bool = self
            .store
            .query_one(ADVISORY_UNLOCK, &[&space, &key])?
            .get(0);
        self.released(record, unlocked, None);
        done
    }

    /// The advisory lock's two keys: the run (hashed) and the record's place.
    fn advisory_keys(&self, record: &str) -> (i32, i32) {
        let run = self.script.run_id.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        let place = self.script.records.iter().position(|r| r == record);
        (run as i32, place.unwrap_or_default() as i32)
    }

    /// Any record no other transaction holds: its row locked for the whole job, the read and
    /// the write in the same transaction. A job that finds every record taken skips its turn.
    fn skip_locked_job(&mut self, job: i64) -> Result<()> {
        let (script, me) = (self.script, &self.me);
        let mut tx = self.store.transaction()?;
        let Some(row) = tx.query_opt(
            "SELECT record FROM lockslab_chaos_record WHERE run_id = $1
             ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED",
            &[&script.run_id],
        )?
        else {
            drop(tx);
            // SKIP LOCKED waits for nothing: every row was held by another job just now.
            me.say(
                GaveUp {
                    why: Some("every record's row was locked (SKIP LOCKED)".into()),
                    ..GaveUp::default()
                },
                format!("job {job}: every record's row is locked by another job: skipped"),
            );
            return Ok(());
        };
        let record: String = row.get(0);
        me.say(
            Acquired {
                lock: Some(format!("row {record}")),
                backend: Some("postgres".into()),
                ..Acquired::default()
            },
            format!("job {job}: locks {record}'s row (FOR UPDATE SKIP LOCKED)"),
        );
        let read = read(&mut tx, script, &record, None)?.context("the record is missing")?;
        say_read(me, job, &record, &read, None);
        std::thread::sleep(Duration::from_millis(script.work_ms));
        let accepted = decide(&mut tx, script, job, &record, read.value, Rule::Unfenced)?;
        let outcome = match tx.commit() {
            Ok(()) if accepted => Outcome::Accepted,
            Ok(()) => Outcome::Rejected,
            Err(_) => Outcome::Unknown,
        };
        say_wrote(me, job, &record, read.value + 1, None, outcome);
        Ok(())
    }

    fn optimistic_job(&mut self, job: i64, record: &str) -> Result<()> {
        for _ in 0..RETRIES {
            let mut tx = self.store.transaction()?;
            let read = read(&mut tx, self.script, record, None)?.context("no record")?;
            tx.commit()?;
            say_read(&self.me, job, record, &read, None);
            std::thread::sleep(Duration::from_millis(self.script.work_ms));
            let outcome = self.write(job, record, read.value, Rule::Version(read.version));
            if outcome != Outcome::Rejected {
                return Ok(());
            }
        }
        self.dropped(job, record, "its version check failed");
        Ok(())
    }

    /// A job that lost [`RETRIES`] races in a row is dropped, as a real client's retry
    /// budget drops it — and said so, so that the history shows a job that never landed
    /// rather than one that silently vanished.
    fn dropped(&self, job: i64, record: &str, why: &str) {
        self.me.say(
            GaveUp {
                why: Some(format!("{why} {RETRIES} times in a row: job dropped")),
                tries: Some(u64::from(RETRIES)),
                ..GaveUp::default()
            },
            format!("job {job} on {record}: {why} {RETRIES} times in a row: dropped, not done"),
        );
    }

    /// The database's own answer, no lock: the read, the work and the write in one
    /// SERIALIZABLE transaction ([`crate::invoices`] has the lab 7 version and why it
    /// holds). A job whose read another write made stale is rolled back by Postgres at
    /// its write: the row it locks `FOR UPDATE` is the row it read, updated since its
    /// snapshot, and that is 40001 by snapshot isolation's concurrent-update rule — which
    /// `REPEATABLE READ` has too, so this design shows no more than that level would (run
    /// at that level by hand, `matrix --design serializable --schedules 12 --seed 1` read
    /// SAFE in every column too). Write skew — two rows, each transaction reads both and
    /// writes a different one — is what only SERIALIZABLE refuses, and it is not here. (A
    /// 40001 at COMMIT is SSI's own: a pattern of read-write dependencies that *could* be
    /// part of a cycle — Postgres does not search for cycles, and some of these are false
    /// positives.) Either way the client reads again, on a fresh snapshot, and a paused
    /// client wakes into a transaction Postgres will not let commit. The guarantee holds
    /// only among SERIALIZABLE transactions: every job on these records runs at that level
    /// (the store's other writers in chaos are other designs' runs, on other rows).
    fn serializable_job(&mut self, job: i64, record: &str) -> Result<()> {
        for _ in 0..RETRIES {
            match self.serializable_try(job, record) {
                Err(err) if crate::invoices::must_retry(&err) => {
                    let code = err
                        .downcast_ref::<postgres::Error>()
                        .and_then(postgres::Error::code)
                        .map_or("40001", |code| code.code())
                        .to_string();
                    self.me.say(
                        Wrote {
                            resource: Some(record.into()),
                            job: Some(job),
                            ..Wrote::new(Outcome::Rejected)
                        },
                        format!("job {job}: rolled back by Postgres ({code}): reads again"),
                    );
                }
                done => return done,
            }
        }
        self.dropped(job, record, "Postgres rolled it back");
        Ok(())
    }

    /// One try of [`Client::serializable_job`].
    fn serializable_try(&mut self, job: i64, record: &str) -> Result<()> {
        let (script, me) = (self.script, &self.me);
        let mut tx = self
            .store
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::Serializable)
            .start()?;
        let read = read(&mut tx, script, record, None)?.context("no record")?;
        say_read(me, job, record, &read, None);
        std::thread::sleep(Duration::from_millis(script.work_ms));
        let accepted = decide(&mut tx, script, job, record, read.value, Rule::Unfenced)?;
        let outcome = match tx.commit().map_err(anyhow::Error::from) {
            Ok(()) if accepted => Outcome::Accepted,
            Ok(()) => Outcome::Rejected,
            // Refused at COMMIT: nothing of it committed, and the caller reads again.
            Err(err) if crate::invoices::must_retry(&err) => return Err(err),
            Err(_) => Outcome::Unknown,
        };
        say_wrote(me, job, record, read.value + 1, None, outcome);
        Ok(())
    }

    /// The job's middle, under a lock: read (claiming the record first if the design
    /// fences the read), work, write.
    fn read_work_write(&mut self, job: i64, record: &str, rule: Rule) -> Result<()> {
        let claim = match rule {
            Rule::ClaimedBy(token) => Some(token),
            _ => None,
        };
        let mut tx = self.store.transaction()?;
        let read = read(&mut tx, self.script, record, claim)?;
        tx.commit()?;
        let Some(read) = read else {
            // A higher token claimed the record: this job's lock is stale. Refused, recorded.
            let mut tx = self.store.transaction()?;
            let token = claim.unwrap_or_default();
            decide(&mut tx, self.script, job, record, -1, Rule::Refused(token))?;
            tx.commit()?;
            say_wrote(&self.me, job, record, 0, claim, Outcome::Rejected);
            return Ok(());
        };
        say_read(&self.me, job, record, &read, claim);
        std::thread::sleep(Duration::from_millis(self.script.work_ms));
        self.write(job, record, read.value, rule);
        Ok(())
    }

    fn write(&mut self, job: i64, record: &str, read_value: i64, rule: Rule) -> Outcome {
        let script = self.script;
        let decided = (|| -> Result<bool> {
            let mut tx = self.store.transaction()?;
            let accepted = decide(&mut tx, script, job, record, read_value, rule)?;
            tx.commit()?;
            Ok(accepted)
        })();
        let outcome = match decided {
            Ok(true) => Outcome::Accepted,
            Ok(false) => Outcome::Rejected,
            Err(_) => Outcome::Unknown,
        };
        let token = match rule {
            Rule::TokenNotLower(t) | Rule::ClaimedBy(t) | Rule::Refused(t) => Some(t),
            _ => None,
        };
        // OncePerJob's client read nothing: the store added one to what the record held.
        let value = (read_value >= 0).then_some(read_value + 1);
        say_wrote(&self.me, job, record, value, token, outcome);
        outcome
    }

    fn acquired(
        &self,
        lock: &str,
        owner: Option<&str>,
        token: Option<i64>,
        backend: &str,
        job: i64,
        record: &str,
    ) {
        let with = token.map_or(String::new(), |t| format!(", token {t}"));
        self.me.say(
            Acquired {
                lock: Some(lock.into()),
                owner: owner.map(String::from),
                token,
                backend: Some(backend.into()),
                ..Acquired::default()
            },
            format!("job {job}: takes the {backend} lock of {record}{with}"),
        );
    }

    fn released(&self, record: &str, released: bool, found_owner: Option<String>) {
        let words = match (&found_owner, released) {
            (_, true) => format!("lets go of {record}'s lock, still its own"),
            (Some(_), false) => format!("lets go of {record}'s lock: someone else holds it now"),
            (None, false) => format!("lets go of {record}'s lock: it had already expired"),
        };
        self.me.say(
            Released {
                released: Some(released),
                found_owner,
                ..Released::default()
            },
            words,
        );
    }

    fn gave_up(&self, job: i64, record: &str) -> Result<()> {
        self.me.say(
            GaveUp {
                why: Some("no lock within the wait".into()),
                waited_ms: Some(self.script.wait_ms),
                ..GaveUp::default()
            },
            format!("job {job}: no lock on {record} within the wait"),
        );
        Ok(())
    }
}

/// How many times `optimistic` and `serializable` try one job before they drop it.
const RETRIES: u32 = 20;

/// The primary's URL, as the Sentinels name it now.
fn primary_url(sentinels: &[String]) -> Result<String> {
    use super::sentinel_client::{primary_from_sentinels, primary_url};
    let primary = primary_from_sentinels(sentinels, crate::cluster::MASTER_NAME)?;
    Ok(primary_url(sentinels, &primary))
}

/// Reads the record; with `claim`, first claims it for that token (refused, None, when the
/// same or a higher token claimed it already) — the read fenced in the same statement.
/// Strictly higher: a token that a restarted counter hands out again must not claim a
/// record a second time (two holders of one token would both pass an `<=`).
fn read(
    tx: &mut Transaction,
    script: &ChaosClient,
    record: &str,
    claim: Option<i64>,
) -> Result<Option<Read>> {
    let row = match claim {
        Some(token) => tx.query_opt(
            "UPDATE lockslab_chaos_record SET token = $3
             WHERE run_id = $1 AND record = $2 AND (token IS NULL OR token < $3)
             RETURNING value, version",
            &[&script.run_id, &record, &token],
        )?,
        None => tx.query_opt(
            "SELECT value, version FROM lockslab_chaos_record WHERE run_id = $1 AND record = $2",
            &[&script.run_id, &record],
        )?,
    };
    Ok(row.map(|row| Read {
        value: row.get(0),
        version: row.get(1),
    }))
}

/// Decides one write under the record's row lock, numbers the decision and records the
/// attempt (accepted or not) with the value it was computed from.
fn decide(
    tx: &mut Transaction,
    script: &ChaosClient,
    job: i64,
    record: &str,
    read_value: i64,
    rule: Rule,
) -> Result<bool> {
    let run_id = &script.run_id;
    let row = tx.query_one(
        "SELECT version, token, value FROM lockslab_chaos_record
         WHERE run_id = $1 AND record = $2 FOR UPDATE",
        &[run_id, &record],
    )?;
    let (version, stored): (i64, Option<i64>) = (row.get(0), row.get(1));
    // OncePerJob: the store's own read, under the row lock, is what it adds one to.
    let read_value = match rule {
        Rule::OncePerJob => row.get(2),
        _ => read_value,
    };
    if read_value >= 0 {
        // The write's own work, inside its transaction, the record's row locked: a pause
        // timed from this event lands where lab 7's fenced-write-only loses an update.
        Emitter::new(&script.name).say(
            What::Working,
            format!("job {job}: in its write transaction, {record}'s row locked"),
        );
        std::thread::sleep(Duration::from_millis(IN_TRANSACTION_MS));
    }
    let (accepted, token) = match rule {
        Rule::Unfenced => (true, None),
        Rule::TokenNotLower(t) => (stored.is_none_or(|s| s <= t), Some(t)),
        Rule::ClaimedBy(t) => (stored == Some(t), Some(t)),
        Rule::Refused(t) => (false, Some(t)),
        Rule::Version(v) => (version == v, None),
        Rule::OncePerJob => {
            let logged: bool = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM lockslab_chaos_log
                     WHERE run_id = $1 AND record = $2 AND job = $3)",
                    &[run_id, &record, &job],
                )?
                .get(0);
            (!logged, None)
        }
    };
    let value = read_value + 1;
    if accepted {
        tx.execute(
            "UPDATE lockslab_chaos_record
             SET value = $3, version = version + 1, token = COALESCE($4, token)
             WHERE run_id = $1 AND record = $2",
            &[run_id, &record, &value, &token],
        )?;
        tx.execute(
            "INSERT INTO lockslab_chaos_log (run_id, record, job) VALUES ($1, $2, $3)",
            &[run_id, &record, &job],
        )?;
    }
    let decided: i64 = tx
        .query_one(
            "UPDATE lockslab_chaos_record SET decisions = decisions + 1
             WHERE run_id = $1 AND record = $2 RETURNING decisions",
            &[run_id, &record],
        )?
        .get(0);
    let read_value = (read_value >= 0).then_some(read_value);
    tx.execute(
        "INSERT INTO lockslab_chaos_attempt
         (run_id, record, client, job, read_value, value, token, accepted, decided)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            run_id,
            &record,
            &script.name,
            &job,
            &read_value,
            &value,
            &token,
            &accepted,
            &decided,
        ],
    )?;
    Ok(accepted)
}

fn say_read(me: &Emitter, job: i64, record: &str, read: &Read, token: Option<i64>) {
    let fenced = token.map_or(String::new(), |t| format!(" (claimed with token {t})"));
    me.say(
        What::ReadRecord(RecordRead {
            record: Some(record.into()),
            value: Some(read.value),
            version: Some(read.version),
            token,
            job: Some(job),
        }),
        format!("job {job}: reads {record} = {}{fenced}", read.value),
    );
}

fn say_wrote(
    me: &Emitter,
    job: i64,
    record: &str,
    value: impl Into<Option<i64>>,
    token: Option<i64>,
    outcome: Outcome,
) {
    let value = value.into();
    let words = value.map_or(format!("adds one to {record} (once per job)"), |value| {
        format!("writes {record} = {value}")
    });
    me.say(
        Wrote {
            outcome,
            token,
            value: value.map(|v| v.to_string()),
            resource: Some(record.into()),
            job: Some(job),
            customer: None,
            after_check_ms: None,
        },
        format!("job {job}: {words}: {}", outcome.as_str()),
    );
}
