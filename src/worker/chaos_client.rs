//! `lockslab chaos`'s client: read-modify-write jobs on a few shared records, one design's
//! way ([`crate::designs`], the code lab 7 runs too), until its time is up.
//!
//! Every record is a counter and an append-only log. A job reads the counter, works a
//! little, and writes the counter plus one, appending its job number to the log — so a lost
//! update (two jobs that read the same value, both taken) and a duplicated effect (one job
//! in the log twice) are both visible in the tables afterwards. The store decides every
//! write under the record's row lock, numbers the decision, and records the attempt,
//! accepted or not, with the value the job had read: the checker reads all of it back.
//!
//! What is chaos's own here: the job and its tables ([`SCHEMA`]), the lock services' keys
//! and connections, and the events the client says at each [`Point`] of a job — the
//! moments a schedule aims its faults at ([`Design::moments`]).

mod redlock;

use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::connect::{self, PgClient};
use crate::designs::no_lock::owner_of;
use crate::designs::{self, Design, Done, Guard, Isolation, LetGo, Point, Retry, Seen, Service};
use crate::events::facts::{Acquired, GaveUp, RecordRead, Released, Wrote};
use crate::events::{Emitter, Kind, What};
use crate::lock::etcd::EtcdLock;
use crate::lock::redis::{RedisLock, Release};
use crate::nemesis::generate::{FaultKind, Rng};
use crate::store::Outcome;

/// What the labs teach of each design, and the events its client says: chaos's side of
/// [`Design`].
impl Design {
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
            // chaos on hosts (issue 44): a partition that cuts a client off from its lock
            // server and the store is a cut the kernel plays (what it sent lands late once it
            // heals): what breaks under a pause breaks here, Redlock too (cut off from
            // everything after its grant, its write lands past its validity).
            FaultKind::Partition => self.labs_call_it_safe(),
            // A leader's stall, as its kill: the new leader extends every lease by the
            // election it took, and the old one wakes up a follower.
            FaultKind::LeaderStall => true,
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

/// How long a write's transaction works with the record's row locked.
const IN_TRANSACTION_MS: u64 = 5;

/// How often a client waiting for a Redis lock asks again, at most (the labs' clients:
/// every 20ms). A job here works 20ms: a lock freed under its holder (a clock jump, a lease
/// run out) is taken before that holder writes whenever another client waits for that
/// record, as a busy service's many waiters would take it — not only on the runs where a
/// waiter's next try happens to fall there.
const RETRY_EVERY: Duration = Duration::from_millis(5);

/// How many times `optimistic` and `serializable` try one job before they drop it.
const RETRIES: u32 = 20;

/// One job: its number, and the record it works on.
pub struct ChaosJob {
    pub id: i64,
    pub record: String,
}

/// The store's rule for one write: a design's guard, or a claim already refused.
#[derive(Clone, Copy, Debug)]
enum Rule {
    Guarded(Guard),
    /// A claim a higher token had already beaten: refused, and recorded.
    Refused(i64),
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
    let until = std::time::Instant::now() + Duration::from_millis(script.run_ms);
    let mut n = 0;
    while std::time::Instant::now() < until {
        n += 1;
        let id = (i64::from(script.index) + 1) * 1000 + n;
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
        let job = ChaosJob { id, record };
        match designs::do_job(script.design, &mut client, &job) {
            Ok(Done::NotTaken) => client.not_taken(&job),
            Ok(Done::Dropped(retry)) => client.dropped(&job, &retry),
            Ok(_) => {}
            Err(err) => {
                // A server restarted, a session ended: a real client logs it and goes on.
                client.me.say(
                    GaveUp {
                        error: Some(format!("{err:#}")),
                        ..GaveUp::default()
                    },
                    format!("job {id} on {} failed: {err:#}", job.record),
                );
                client.redis = None;
                if client.store.is_closed() {
                    client.store = connect::postgres(&script.store_url)?;
                } else {
                    // A transaction the error left open ends here.
                    let _ = client.store.batch_execute("ROLLBACK");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        std::thread::sleep(Duration::from_millis(rng.between(0, 10)));
    }
    Ok(())
}

impl designs::Desk for Client<'_> {
    type Job = ChaosJob;

    fn begin(&mut self, isolation: Isolation) -> Result<()> {
        Ok(self.store.batch_execute(isolation.begin())?)
    }

    fn commit(&mut self) -> Result<()> {
        Ok(self.store.batch_execute("COMMIT")?)
    }

    fn rollback(&mut self) -> Result<()> {
        Ok(self.store.batch_execute("ROLLBACK")?)
    }

    fn read(&mut self, job: &ChaosJob) -> Result<Seen> {
        let row = self
            .store
            .query_opt(
                "SELECT value, version FROM lockslab_chaos_record
                 WHERE run_id = $1 AND record = $2",
                &[&self.script.run_id, &job.record],
            )?
            .context("the record is missing")?;
        Ok(Seen {
            value: row.get(0),
            version: row.get(1),
            ..Seen::default()
        })
    }

    fn claim(&mut self, job: &ChaosJob, token: i64) -> Result<Option<Seen>> {
        let row = self.store.query_opt(
            "UPDATE lockslab_chaos_record SET token = $3
             WHERE run_id = $1 AND record = $2 AND (token IS NULL OR token < $3)
             RETURNING value, version",
            &[&self.script.run_id, &job.record, &token],
        )?;
        Ok(row.map(|row| Seen {
            value: row.get(0),
            version: row.get(1),
            claimed: Some(token),
            ..Seen::default()
        }))
    }

    fn write(&mut self, job: &ChaosJob, seen: Option<&Seen>, guard: Guard) -> Result<bool> {
        let read = seen.map(|seen| seen.value);
        self.decide(job, read, Rule::Guarded(guard))
    }

    fn work(&mut self) {
        std::thread::sleep(Duration::from_millis(self.script.work_ms));
    }

    fn retries(&self) -> u32 {
        RETRIES
    }

    fn reconnect(&mut self) -> Result<()> {
        if self.store.is_closed() {
            self.store = connect::postgres(&self.script.store_url)?;
        }
        Ok(())
    }

    fn lock_name(&self, job: &ChaosJob) -> String {
        format!("lockslab:{}:chaos:{}", self.script.run_id, job.record)
    }

    fn lock_wait(&self) -> Duration {
        Duration::from_millis(self.script.wait_ms)
    }

    fn lease(&self) -> Duration {
        Duration::from_millis(self.script.lease_ms)
    }

    /// The advisory lock's two keys: the run (hashed) and the record's place.
    fn advisory(&mut self, sql: &'static str, job: &ChaosJob) -> Result<postgres::Row> {
        let run = self.script.run_id.bytes().fold(0x811c_9dc5u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        let place = self.script.records.iter().position(|r| *r == job.record);
        let (space, key) = (run as i32, place.unwrap_or_default() as i32);
        Ok(self.store.query_one(sql, &[&space, &key])?)
    }

    fn redis(&mut self) -> Result<&mut RedisLock> {
        if self.redis.is_none() {
            // Under Sentinel, where the primary is now: asked again after every error.
            let url = match self.script.sentinels.as_slice() {
                [] => self.script.redis_url.clone().context("no Redis URL")?,
                sentinels => primary_url(sentinels)?,
            };
            let mut lock = RedisLock::new(connect::redis(&url)?, "", self.lease());
            lock.retry_every = RETRY_EVERY;
            self.redis = Some(lock);
            self.redis_at = Some(url);
        }
        Ok(self.redis.as_mut().expect("connected above"))
    }

    /// A counter per record, in the lock's Redis.
    fn redis_counter(&self, job: &ChaosJob) -> String {
        format!("{}:token", self.lock_name(job))
    }

    fn heartbeat(&mut self, name: &str) -> Result<RedisLock> {
        let url = self.redis_at.as_deref().context("no Redis URL")?;
        Ok(RedisLock::new(connect::redis(url)?, name, self.lease()))
    }

    fn sequence_token(&mut self) -> Result<i64> {
        let row = self
            .store
            .query_one("SELECT nextval('lockslab_chaos_token')", &[])?;
        Ok(row.get(0))
    }

    fn etcd(&mut self, name: &str) -> Result<EtcdLock> {
        let url = self.script.etcd_url.as_deref().context("no etcd URL")?;
        EtcdLock::connect(url, name)
    }

    fn redlock(&mut self, name: &str) -> Result<&mut crate::lock::redlock::Redlock> {
        self.redlock_on(name)
    }

    fn free_row(&mut self, job: &ChaosJob) -> Result<Option<ChaosJob>> {
        let row = self.store.query_opt(
            "SELECT record FROM lockslab_chaos_record WHERE run_id = $1
             ORDER BY random() LIMIT 1 FOR UPDATE SKIP LOCKED",
            &[&self.script.run_id],
        )?;
        Ok(row.map(|row| ChaosJob {
            id: job.id,
            record: row.get(0),
        }))
    }

    /// The events a schedule aims at, and the store's record of a refused claim.
    fn at(&mut self, job: &ChaosJob, point: Point) -> Result<()> {
        let (id, record) = (job.id, job.record.as_str());
        match point {
            Point::Locked(holding) => self.acquired(job, holding),
            Point::Decided(Some(seen)) => say_read(&self.me, job, seen),
            Point::MidWrite => {
                // The write's own work, inside its transaction, the record's row locked: a
                // pause timed from this event lands where lab 7's fenced-write-only loses
                // an update.
                self.me.say(
                    What::Working,
                    format!("job {id}: in its write transaction, {record}'s row locked"),
                );
                std::thread::sleep(Duration::from_millis(IN_TRANSACTION_MS));
            }
            Point::Wrote {
                seen,
                guard,
                outcome,
                ..
            } => {
                // The idempotency key's client read nothing: the store added one to what
                // the record held.
                let value = seen.map(|seen| seen.value + 1);
                say_wrote(&self.me, job, value, guard.token(), outcome);
            }
            Point::ClaimRefused(token) => {
                // A higher token claimed the record: this job's lock is stale. Refused,
                // recorded.
                self.begin(Isolation::ReadCommitted)?;
                self.decide(job, None, Rule::Refused(token))?;
                self.commit()?;
                say_wrote(&self.me, job, Some(0), Some(token), Outcome::Rejected);
            }
            Point::Retry(Retry::RolledBack(code)) => self.me.say(
                Wrote {
                    resource: Some(record.into()),
                    job: Some(id),
                    ..Wrote::new(Outcome::Rejected)
                },
                format!("job {id}: rolled back by Postgres ({code}): reads again"),
            ),
            Point::Released(_, let_go) => self.let_go(job, let_go),
            _ => {}
        }
        Ok(())
    }
}

impl Client<'_> {
    /// Decides one write under the record's row lock, numbers the decision and records the
    /// attempt (accepted or not) with the value it was computed from (`read`; None: the
    /// client read nothing).
    fn decide(&mut self, job: &ChaosJob, read: Option<i64>, rule: Rule) -> Result<bool> {
        let (run_id, record, id) = (&self.script.run_id.clone(), job.record.as_str(), job.id);
        let row = self.store.query_one(
            "SELECT version, token, value FROM lockslab_chaos_record
             WHERE run_id = $1 AND record = $2 FOR UPDATE",
            &[run_id, &record],
        )?;
        let (version, stored): (i64, Option<i64>) = (row.get(0), row.get(1));
        // Said by every write, the idempotency key's too (it read nothing, but its write
        // holds the row lock all the same): the moment `working` faults aim at.
        designs::Desk::at(self, job, Point::MidWrite)?;
        let (accepted, token) = match rule {
            Rule::Guarded(Guard::None) => (true, None),
            Rule::Guarded(Guard::NotLower(t)) => (stored.is_none_or(|s| s <= t), Some(t)),
            Rule::Guarded(Guard::ClaimedBy(t)) => (stored == Some(t), Some(t)),
            Rule::Guarded(Guard::Version(v)) => (version == v, None),
            Rule::Guarded(Guard::OncePerJob) => {
                let logged: bool = self
                    .store
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM lockslab_chaos_log
                         WHERE run_id = $1 AND record = $2 AND job = $3)",
                        &[run_id, &record, &id],
                    )?
                    .get(0);
                (!logged, None)
            }
            Rule::Refused(t) => (false, Some(t)),
        };
        // OncePerJob: the store's own read, under the row lock, is what it adds one to.
        let base = match rule {
            Rule::Guarded(Guard::OncePerJob) => row.get(2),
            _ => read.unwrap_or(-1),
        };
        let value = base + 1;
        if accepted {
            self.store.execute(
                "UPDATE lockslab_chaos_record
                 SET value = $3, version = version + 1, token = COALESCE($4, token)
                 WHERE run_id = $1 AND record = $2",
                &[run_id, &record, &value, &token],
            )?;
            self.store.execute(
                "INSERT INTO lockslab_chaos_log (run_id, record, job) VALUES ($1, $2, $3)",
                &[run_id, &record, &id],
            )?;
        }
        let decided: i64 = self
            .store
            .query_one(
                "UPDATE lockslab_chaos_record SET decisions = decisions + 1
                 WHERE run_id = $1 AND record = $2 RETURNING decisions",
                &[run_id, &record],
            )?
            .get(0);
        let read_value = (base >= 0).then_some(base);
        self.store.execute(
            "INSERT INTO lockslab_chaos_attempt
             (run_id, record, client, job, read_value, value, token, accepted, decided)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                run_id,
                &record,
                &self.script.name,
                &id,
                &read_value,
                &value,
                &token,
                &accepted,
                &decided,
            ],
        )?;
        Ok(accepted)
    }

    fn acquired(&self, job: &ChaosJob, holding: &designs::Holding) {
        let (id, record) = (job.id, &job.record);
        let (lock, backend, words) = match holding.service {
            Service::AdvisoryXact => (
                holding.name.clone(),
                "postgres",
                format!("job {id}: holds the advisory lock of {record} (in its transaction)"),
            ),
            Service::Row => (
                format!("row {record}"),
                "postgres",
                format!("job {id}: locks {record}'s row (FOR UPDATE SKIP LOCKED)"),
            ),
            service => {
                let backend = match service {
                    Service::Redis => "redis",
                    Service::Redlock => "redlock",
                    Service::Etcd => "etcd",
                    _ => "postgres",
                };
                let with = holding
                    .token
                    .map_or(String::new(), |t| format!(", token {t}"));
                let words = format!("job {id}: takes the {backend} lock of {record}{with}");
                (holding.name.clone(), backend, words)
            }
        };
        let (owner, token) = match holding.service {
            Service::AdvisoryXact | Service::Row => (None, None),
            _ => (holding.owner.clone(), holding.token),
        };
        self.me.say(
            Acquired {
                lock: Some(lock),
                owner,
                token,
                backend: Some(backend.into()),
                ..Acquired::default()
            },
            words,
        );
    }

    /// What letting go found, said as the checker reads it: another holder only where the
    /// lock service proves it.
    fn let_go(&self, job: &ChaosJob, let_go: LetGo) {
        let record = &job.record;
        let (released, found_owner) = match let_go {
            LetGo::Redis { answer, held, ttl } => {
                // Another client's value in the key proves two holders only while ours
                // could not have expired by itself (less a drift allowance, as Redlock's):
                // a key that ran out and was taken again is the lock working as designed —
                // the store's rows judge the late holder's write. Redlock's release is
                // judged the same way.
                let within_ttl =
                    held.asked_at.elapsed() + crate::lock::redlock::drift(ttl, 0.01) < ttl;
                match answer {
                    Ok(Release::Deleted) => (true, None),
                    Ok(Release::HeldBy(owner)) if within_ttl => (false, Some(owner.clone())),
                    Ok(Release::HeldBy(_) | Release::Gone) => (false, None),
                    // Redis did not answer (it was restarting): whether the lock was still
                    // ours, or someone else's meanwhile, is not known. Said as a release
                    // that found nothing of its own, which the checker counts as unknown —
                    // never as a pass.
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
                        return;
                    }
                }
            }
            LetGo::Redlock {
                answers,
                within_validity,
            } => redlock::judge_release(answers, within_validity),
            LetGo::Etcd(released) | LetGo::Unlocked(released) => (released, None),
            LetGo::WithTransaction(ended) => {
                self.me.say(
                    Released {
                        released: Some(ended),
                        ..Released::default()
                    },
                    format!(
                        "job {}: the transaction ended, and the advisory lock with it",
                        job.id
                    ),
                );
                return;
            }
        };
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

    /// No lock within the wait, or (skip-locked) no free row: the job skips its turn.
    fn not_taken(&self, job: &ChaosJob) {
        let (id, record) = (job.id, &job.record);
        if self.script.design == Design::SkipLocked {
            // SKIP LOCKED waits for nothing: every row was held by another job just now.
            self.me.say(
                GaveUp {
                    why: Some("every record's row was locked (SKIP LOCKED)".into()),
                    ..GaveUp::default()
                },
                format!("job {id}: every record's row is locked by another job: skipped"),
            );
            return;
        }
        self.me.say(
            GaveUp {
                why: Some("no lock within the wait".into()),
                waited_ms: Some(self.script.wait_ms),
                ..GaveUp::default()
            },
            format!("job {id}: no lock on {record} within the wait"),
        );
    }

    /// A job that lost [`RETRIES`] races in a row is dropped, as a real client's retry
    /// budget drops it — and said so, so that the history shows a job that never landed
    /// rather than one that silently vanished.
    fn dropped(&self, job: &ChaosJob, retry: &Retry) {
        let why = match retry {
            Retry::Version => "its version check failed",
            Retry::RolledBack(_) => "Postgres rolled it back",
        };
        self.me.say(
            GaveUp {
                why: Some(format!("{why} {RETRIES} times in a row: job dropped")),
                tries: Some(u64::from(RETRIES)),
                ..GaveUp::default()
            },
            format!(
                "job {} on {}: {why} {RETRIES} times in a row: dropped, not done",
                job.id, job.record
            ),
        );
    }
}

/// The primary's URL, as the Sentinels name it now.
fn primary_url(sentinels: &[String]) -> Result<String> {
    use super::sentinel_client::{primary_from_sentinels, primary_url};
    let primary = primary_from_sentinels(sentinels, crate::cluster::MASTER_NAME)?;
    Ok(primary_url(sentinels, &primary))
}

fn say_read(me: &Emitter, job: &ChaosJob, seen: &Seen) {
    let (id, record) = (job.id, &job.record);
    let fenced = seen
        .claimed
        .map_or(String::new(), |t| format!(" (claimed with token {t})"));
    me.say(
        What::ReadRecord(RecordRead {
            record: Some(record.clone()),
            value: Some(seen.value),
            version: Some(seen.version),
            token: seen.claimed,
            job: Some(id),
        }),
        format!("job {id}: reads {record} = {}{fenced}", seen.value),
    );
}

fn say_wrote(
    me: &Emitter,
    job: &ChaosJob,
    value: Option<i64>,
    token: Option<i64>,
    outcome: Outcome,
) {
    let (id, record) = (job.id, &job.record);
    let words = value.map_or(format!("adds one to {record} (once per job)"), |value| {
        format!("writes {record} = {value}")
    });
    me.say(
        Wrote {
            outcome,
            token,
            value: value.map(|v| v.to_string()),
            resource: Some(record.clone()),
            job: Some(id),
            customer: None,
            after_check_ms: None,
        },
        format!("job {id}: {words}: {}", outcome.as_str()),
    );
}
