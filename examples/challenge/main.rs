//! Reference clients for `lockslab challenge`, in Rust: the twenty-one of reference.py
//! beside this file. Each is a lock design ([`Design`]) and, for some, a twist that breaks
//! it on purpose ([`Twist`]); [`REFERENCES`] names them, a design's fixed and broken
//! variants side by side.
//!
//! ```text
//! cargo build --example challenge && R=./target/debug/examples/challenge
//! lockslab challenge counter      -- $R none             # fails
//! lockslab challenge counter      -- $R fenced           # passes
//! lockslab challenge pause        -- $R setnx            # fails
//! lockslab challenge pause        -- $R checked          # fails
//! lockslab challenge pause        -- $R fenced           # passes
//! lockslab challenge pause        -- $R claimed          # passes
//! lockslab challenge delay        -- $R setnx            # fails
//! lockslab challenge delay        -- $R checked          # fails
//! lockslab challenge delay        -- $R claimed          # passes
//! lockslab challenge crash        -- $R fenced           # fails
//! lockslab challenge crash        -- $R once             # passes
//! lockslab challenge crash        -- $R long             # fails
//! lockslab challenge pause        -- $R long             # passes
//! lockslab challenge pause        -- $R outlast          # fails
//! lockslab challenge pause        -- $R outlast 30       # unknown
//! lockslab challenge crash        -- $R quiet            # fails
//! lockslab challenge exactly-once -- $R fenced           # fails
//! lockslab challenge exactly-once -- $R once             # passes
//! lockslab challenge failover     -- $R sentinel         # fails
//! lockslab challenge failover     -- $R sequence         # passes
//! lockslab challenge pause        -- $R for-update       # passes
//! lockslab challenge delay        -- $R advisory         # passes
//! lockslab challenge crash        -- $R optimistic       # passes
//! lockslab challenge pause        -- $R optimistic-fail  # never done, often
//! lockslab challenge pause        -- $R late             # unknown
//! lockslab challenge pause        -- $R early            # never passes
//! lockslab challenge pause        -- $R liar             # fails
//! lockslab challenge pause        -- $R lastcheck        # never passes
//! lockslab challenge delay        -- $R lastcheck-select # never passes
//! lockslab challenge pause        -- $R lastcheck-decoy  # never passes
//! lockslab challenge delay        -- $R blind-retry      # never passes
//! lockslab challenge crash        -- $R shuffled         # fails
//! ```
//!
//! Every reference reads the record's `value` and `items`, and writes `value + add` and the
//! items with the job's entry (`append`) at the end, in one `UPDATE`.
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};

/// Every reference by name: a design, and what it does wrong on purpose, if anything.
const REFERENCES: [(&str, Design, Twist); 23] = [
    ("none", Design::NoLock, Twist::Honest),
    ("setnx", Design::Setnx, Twist::Honest),
    ("late", Design::Setnx, Twist::WritingAfterCommit),
    ("early", Design::Setnx, Twist::WritingBeforeRead),
    ("liar", Design::Setnx, Twist::FailWhenSlow),
    (
        "lastcheck",
        Design::Setnx,
        Twist::CheckBeforeWrite(SentFirst::Nothing),
    ),
    (
        "lastcheck-select",
        Design::Setnx,
        Twist::CheckBeforeWrite(SentFirst::Select),
    ),
    (
        "lastcheck-decoy",
        Design::Setnx,
        Twist::CheckBeforeWrite(SentFirst::DecoyWrite),
    ),
    ("checked", Design::Checked, Twist::Honest),
    ("fenced", Design::Fenced, Twist::Honest),
    ("quiet", Design::Fenced, Twist::NoNotes),
    ("claimed", Design::Claimed, Twist::Honest),
    ("once", Design::Once, Twist::Honest),
    ("long", Design::Once, Twist::LongLease { times: 10 }),
    ("outlast", Design::Setnx, Twist::LongLease { times: 10 }),
    ("shuffled", Design::Once, Twist::NotesAfterRelease),
    ("sentinel", Design::Sentinel, Twist::Honest),
    ("sequence", Design::Sequence, Twist::Honest),
    ("for-update", Design::ForUpdate, Twist::Honest),
    ("advisory", Design::Advisory, Twist::Honest),
    (
        "optimistic",
        Design::Optimistic { retry: true },
        Twist::Honest,
    ),
    (
        "optimistic-fail",
        Design::Optimistic { retry: false },
        Twist::Honest,
    ),
    ("blind-retry", Design::BlindRetry, Twist::Honest),
];

/// How a reference keeps two clients' jobs on one record apart, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Design {
    /// No lock: read, add, write. Two clients on one record lose an update.
    NoLock,
    /// Redis `SET NX PX`, released with compare-and-delete: the first lock most people
    /// write. A holder frozen past the TTL still writes what it read, and so does one whose
    /// write the network held past the TTL.
    Setnx,
    /// Setnx + a fencing token (Redis `INCR`) checked only at the write: the `UPDATE` lands
    /// if no newer token has written the row yet. A newer holder that read before the older
    /// one's late write, and writes after it, passes that check too, and the older write is
    /// lost — lockslab plays that very order under `pause` and `delay`.
    Checked,
    /// Setnx + a token checked where the record is read (`SELECT … FOR UPDATE`), in the
    /// transaction that writes it. Its row lock, held across the work, keeps everyone off
    /// the row while its holder is frozen: the next client waits behind it, which lockslab
    /// reads from `pg_blocking_pids` (the lock held it off). A holder killed after its
    /// commit, before its answer, has its job resent: done twice.
    Fenced,
    /// Setnx + a token that claims the row before the read, in a short transaction of its
    /// own; the work holds no row lock, and the write lands only if the row is still
    /// claimed by this token. The token alone keeps a frozen or delayed holder out.
    Claimed,
    /// Fenced + the job recorded as done in the same transaction: a job resent (or
    /// delivered twice) that already took effect is answered `ok` again, with no second
    /// effect.
    Once,
    /// Fenced, on the Redis primary the Sentinels name (`failover`), with a token per record
    /// from `INCR` there. The promoted replica missed the last `INCR`s: its tokens start
    /// again below those written, and the check lets an equal one through.
    Sentinel,
    /// Sentinel, with the token from a Postgres sequence: it never goes back as long as that
    /// Postgres keeps what it commits (`fsync` and `synchronous_commit` on) and is not
    /// failed over to an asynchronous standby (values handed out on the old primary can be
    /// handed out again there). The challenge's private Postgres runs with both off and is
    /// never crashed.
    Sequence,
    /// No Redis lock: the row's own (`SELECT … FOR UPDATE`), held by the one transaction
    /// that reads, works and writes, with a token from a Postgres sequence taken under it
    /// (so fences rise in commit order). A job whose entry is in the items read is done
    /// already: `ok`, no second effect. A dead holder's lock goes with its session.
    ForUpdate,
    /// ForUpdate, with a transaction-scoped advisory lock on the record
    /// (`pg_advisory_xact_lock`) before a plain read.
    Advisory,
    /// No lock at all (`ready` says `"lock": false`): read, work, then a compare-and-set
    /// (`UPDATE … WHERE value and items are as read`). A compare that matched nothing is
    /// read again and retried, with a new `writing` note; or, without `retry`, answered
    /// `fail` — as safe, but not live: a job that loses five compares in a row is never
    /// done (most seeds, three clients).
    Optimistic { retry: bool },
    /// Setnx + a compare-and-set on the row's version (`xmin`), read by an `UPDATE` that
    /// changes nothing but the version (so every read moves it, and a reader who read
    /// before it is refused at its compare). On a refused compare it reads again and writes
    /// *without* the compare — the fallback that looks harmless because it only runs
    /// after a conflict. A pause between that read and that write loses an update:
    /// lockslab holds such a retry until a newer holder's write has landed.
    BlindRetry,
}

impl Design {
    /// A Redis lock (`SET NX PX`) around each job; the others hold Postgres's lock, or none.
    fn locks_in_redis(self) -> bool {
        use Design::*;
        matches!(
            self,
            Setnx | Checked | Fenced | Claimed | Once | Sentinel | Sequence | BlindRetry
        )
    }

    /// Says it holds no lock at all: `crash` aims at its `writing` and its answer, and asks
    /// nothing of a lock left stuck.
    fn lockless(self) -> bool {
        matches!(self, Design::NoLock | Design::Optimistic { .. })
    }

    /// What it needs in the run's schema before it says `ready` (`{schema}` in it).
    fn shared(self) -> Option<&'static str> {
        match self {
            Design::Sequence | Design::ForUpdate | Design::Advisory => {
                Some("CREATE SEQUENCE IF NOT EXISTS {schema}.tokens")
            }
            Design::Once => {
                Some("CREATE TABLE IF NOT EXISTS {schema}.done (job bigint PRIMARY KEY)")
            }
            _ => None,
        }
    }
}

/// What a reference does on top of its design, to show what the grader makes of it. Every
/// twist but `Honest` makes a client that must not pass where its design would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Twist {
    /// The design as it is.
    Honest,
    /// `writing` said only after the write committed (a lie, or a bug): a fault aimed at the
    /// note finds nothing left to hold up. It missed, and the run is unknown, never a pass:
    /// the grader reads when the write landed, not when the note came.
    WritingAfterCommit,
    /// `writing` said before the read: a fault aimed there lands before anything was read.
    /// The items each write carries show the read came after the fault: the run is unknown
    /// or fails, never a pass.
    WritingBeforeRead,
    /// `fail` answered for a job that took longer than one `lease_ms` — "perhaps it did not
    /// land" — though its write committed (the lease is 3.5 `lease_ms`, so it does land);
    /// given the job again, it finds its entry there and answers `ok` without writing. A
    /// `fail` is a claim the log checks: the change the client said did not happen fails
    /// the run, and is never a refusal that made a fault bite.
    FailWhenSlow,
    /// Asks "is the key still mine, with more than 50ms left?" after the work, just before
    /// the write, and answers `fail` when not (lab 9's guard, marked ⚠️ there). The answer
    /// is stale the moment it comes: a pause or a held write aimed at the write itself
    /// lands after the check, which dodges nothing. Never a pass, whatever it sends to
    /// Postgres before the check ([`SentFirst`]).
    CheckBeforeWrite(SentFirst),
    /// No notes at all (`ready` with `"notes": false`): lockslab aims its faults at the jobs
    /// and the answers instead. `crash` kills it as its answer comes, the answer dies with
    /// it, and the resent job is done twice.
    NoNotes,
    /// A lease of `times` `lease_ms` (ten, or the number after the mode), "so that it never
    /// expires mid-job": the lock of a holder killed holding it keeps everyone waiting its
    /// whole lease — a stuck lock. Nor does it outlast a pause or a held write: lockslab
    /// waits the key out (at most 12 TTLs) and lets a newer holder read, so the held write
    /// of a lock with nothing else behind it is stale; a fenced read's row lock holds the
    /// newer holder off instead, and passes. A lease past the bound is unknown, the bound
    /// named: what the fault cannot outlast, it did not test.
    LongLease { times: u64 },
    /// A lease of ten `lease_ms`, with `acquired` and `writing` said only after `released`:
    /// notes out of order hide the lock a dead holder left stuck. The client misbehaves, and
    /// is named so.
    NotesAfterRelease,
}

/// What a [`Twist::CheckBeforeWrite`] client sends to Postgres after its work, before its
/// check: each is a way to make a fault aimed at "the next thing after the note" land
/// before the check instead of after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SentFirst {
    Nothing,
    /// A harmless `SELECT 1`: a delay that held whatever bytes came first after the note
    /// held that, and the check then saw the lock gone. Held at the write itself instead.
    Select,
    /// Writes to the records that match no row (`… AND false`), one more each job than
    /// any job of the run before (a counter in Redis), so more than any `ok` job sent: a
    /// fault aimed at the first write after
    /// the note, or at the Nth, would land on one, and the check would come after. lockslab
    /// tries each write first, lets those that match nothing by, and catches the real one.
    DecoyWrite,
}

impl Twist {
    /// The lease it asks for, given the challenge's.
    fn lease_ms(self, lease_ms: u64) -> u64 {
        match self {
            Twist::LongLease { times } => times * lease_ms,
            Twist::NotesAfterRelease => 10 * lease_ms,
            Twist::FailWhenSlow => 7 * lease_ms / 2,
            _ => lease_ms,
        }
    }
}

/// The first line lockslab sends (what these references use of it).
#[derive(Clone, Deserialize)]
struct Init {
    client: String,
    redis_url: String,
    postgres_url: String,
    table: String,
    schema: String,
    key_prefix: String,
    lease_ms: u64,
    /// Under `failover`: the Sentinels that name the primary.
    #[serde(default)]
    sentinels: Vec<String>,
    master_name: Option<String>,
    redis_password: Option<String>,
}

#[derive(Deserialize)]
struct Job {
    id: i64,
    record: String,
    add: i64,
    append: String,
    work_ms: u64,
}

impl Job {
    /// What its write sets: the value read plus `add`, and the items read with the job's
    /// entry at the end.
    fn written(&self, value: i64, mut items: Vec<String>) -> (i64, Vec<String>) {
        items.push(self.append.clone());
        (value + self.add, items)
    }

    /// The job's work, between its read and its write.
    fn work(&self) {
        std::thread::sleep(Duration::from_millis(self.work_ms));
    }
}

/// How a job is answered.
#[derive(Debug, PartialEq, Eq)]
enum Answer {
    Ok,
    Fail(&'static str),
}

const REFUSED: Answer = Answer::Fail("fenced out: a newer holder wrote");

/// What the client says on stdout, one line each, flushed at once: lockslab reads a note
/// before it pauses or kills us.
struct Stdout {
    twist: Twist,
    /// `NotesAfterRelease`: the notes of the job at hand, said after its `released`.
    held: Vec<Value>,
}

impl Stdout {
    fn say(&mut self, message: Value) {
        let kind = message["type"].as_str().unwrap_or_default();
        let note = matches!(kind, "acquired" | "writing" | "released");
        match self.twist {
            Twist::NoNotes if note => return,
            Twist::NotesAfterRelease if note && kind != "released" => {
                self.held.push(message);
                return;
            }
            _ => {}
        }
        let mut out = std::io::stdout().lock();
        for line in std::iter::once(message).chain(self.held.drain(..)) {
            writeln!(out, "{line}").unwrap();
        }
        out.flush().unwrap();
    }

    fn note(&mut self, kind: &str, job: i64) {
        self.say(json!({"type": kind, "job": job}));
    }

    fn answer(&mut self, job: i64, answer: Answer) {
        self.say(match answer {
            Answer::Ok => json!({"type": "ok", "job": job}),
            Answer::Fail(reason) => json!({"type": "fail", "job": job, "reason": reason}),
        });
    }
}

/// Deletes the key only if it still holds our value: never someone else's lock.
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                       return redis.call('DEL', KEYS[1]) end return 0";

/// A Redis lock held: its key, the value only we put there, and the token taken with it.
struct Lock {
    key: String,
    owner: String,
    token: Option<i64>,
}

/// The lock's Redis: `redis_url`, or under `failover` the server the Sentinels name as the
/// primary, asked again after every error.
struct Redis {
    init: Init,
    connection: Option<redis::Connection>,
}

fn open(url: &str) -> redis::RedisResult<redis::Connection> {
    let connection =
        redis::Client::open(url)?.get_connection_with_timeout(Duration::from_millis(500))?;
    connection.set_read_timeout(Some(Duration::from_millis(500)))?;
    Ok(connection)
}

impl Redis {
    fn connect(&self) -> Option<redis::Connection> {
        if self.init.sentinels.is_empty() {
            return open(&self.init.redis_url).ok();
        }
        let password = self.init.redis_password.as_deref()?;
        for sentinel in &self.init.sentinels {
            let Ok(mut asked) = open(&format!("redis://default:{password}@{sentinel}")) else {
                continue;
            };
            let Ok(primary) = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(self.init.master_name.as_deref()?)
                .query::<Option<(String, u16)>>(&mut asked)
            else {
                continue; // this Sentinel did not answer: ask the next
            };
            if let Some((host, port)) = primary {
                return open(&format!("redis://default:{password}@{host}:{port}")).ok();
            }
        }
        None
    }

    /// Runs `call`, again on a new connection while the primary is dead and no replica is
    /// promoted yet (at most 10 s).
    fn run<T>(&mut self, call: impl Fn(&mut redis::Connection) -> redis::RedisResult<T>) -> T {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.connection.is_none() {
                self.connection = self.connect();
            }
            if let Some(connection) = self.connection.as_mut() {
                match call(connection) {
                    Ok(answer) => return answer,
                    Err(err) if Instant::now() > deadline => panic!("Redis: {err}"),
                    Err(_) => self.connection = None,
                }
            } else if Instant::now() > deadline {
                panic!("no Redis primary within 10s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `SET NX PX` until it is ours (at most 10 s).
    fn lock(&mut self, key: String, owner: String, lease_ms: u64) -> Option<Lock> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let set: Option<String> = self.run(|connection| {
                redis::cmd("SET")
                    .arg(&key)
                    .arg(&owner)
                    .arg("NX")
                    .arg("PX")
                    .arg(lease_ms)
                    .query(connection)
            });
            if set.is_some() {
                return Some(Lock {
                    key,
                    owner,
                    token: None,
                });
            }
            if Instant::now() > deadline {
                return None;
            }
            // As the Python reference: asked again every 20 ms, not spinning a core.
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn unlock(&mut self, lock: &Lock) {
        let release = redis::Script::new(RELEASE);
        let _: i64 =
            self.run(|connection| release.key(&lock.key).arg(&lock.owner).invoke(connection));
    }

    /// `CheckBeforeWrite`'s guard: the key still holds our value, with more than
    /// `margin_ms` of its lease left. True when asked; nobody can say for how long.
    fn still_ours(&mut self, lock: &Lock, margin_ms: i64) -> bool {
        let (holder, left): (Option<String>, i64) = self.run(|connection| {
            redis::pipe()
                .get(&lock.key)
                .pttl(&lock.key)
                .query(connection)
        });
        holder.as_deref() == Some(lock.owner.as_str()) && left > margin_ms
    }
}

/// One client: its reference, its connections, and what it says.
struct Client {
    design: Design,
    twist: Twist,
    init: Init,
    db: postgres::Client,
    redis: Redis,
    out: Stdout,
}

impl Client {
    fn connect(design: Design, twist: Twist, init: Init) -> Client {
        let mut db = postgres::Client::connect(&init.postgres_url, postgres::NoTls).unwrap();
        if let Some(create) = design.shared() {
            // Every client creates it; the first one wins.
            let mut tx = db.transaction().unwrap();
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext($1))",
                &[&init.schema],
            )
            .unwrap();
            tx.batch_execute(&create.replace("{schema}", &init.schema))
                .unwrap();
            tx.commit().unwrap();
        }
        Client {
            design,
            twist,
            redis: Redis {
                init: init.clone(),
                connection: None,
            },
            init,
            db,
            out: Stdout {
                twist,
                held: Vec::new(),
            },
        }
    }

    /// One job, from its lock (if Redis's) to its answer.
    fn serve(&mut self, job: &Job) -> Answer {
        if self.twist == Twist::FailWhenSlow && self.entry_there(job) {
            return Answer::Ok; // given again after a `fail` whose write had landed
        }
        let began = Instant::now();
        let lock = if self.design.locks_in_redis() {
            let Some(lock) = self.lock(job) else {
                return Answer::Fail("no lock within 10s");
            };
            self.out
                .say(json!({"type": "acquired", "job": job.id, "token": lock.token}));
            Some(lock)
        } else {
            None
        };
        let answer = match self.design {
            Design::ForUpdate | Design::Advisory => self.work_in_postgres(job),
            Design::Optimistic { retry } => self.work_optimistic(job, retry),
            Design::BlindRetry => self.work_blind_retry(job),
            Design::Claimed => self.work_claimed(job, lock.as_ref()),
            Design::Checked => self.work_checked(job, lock.as_ref()),
            _ => self.work_in_one_transaction(job, lock.as_ref()),
        };
        if let Some(lock) = lock {
            self.redis.unlock(&lock);
            self.out.note("released", job.id);
        }
        let slow = began.elapsed() > Duration::from_millis(self.init.lease_ms);
        if self.twist == Twist::FailWhenSlow && answer == Answer::Ok && slow {
            return Answer::Fail("it took too long: perhaps it did not land");
        }
        answer
    }

    /// The record's Redis lock, and the fencing token taken once it is ours.
    fn lock(&mut self, job: &Job) -> Option<Lock> {
        let key = format!("{}lock:{}", self.init.key_prefix, job.record);
        let owner = format!("{}:{}:{:?}", self.init.client, job.id, Instant::now());
        let lease_ms = self.twist.lease_ms(self.init.lease_ms);
        let lock = self.redis.lock(key, owner, lease_ms)?;
        let prefix = &self.init.key_prefix;
        let counter = match self.design {
            Design::Checked | Design::Fenced | Design::Claimed | Design::Once => {
                format!("{prefix}token")
            }
            Design::Sentinel => format!("{prefix}token:{}", job.record),
            Design::Sequence => {
                let next = format!("SELECT nextval('{}.tokens')", self.init.schema);
                let token = self.db.query_one(&next, &[]).unwrap().get(0);
                return Some(Lock {
                    token: Some(token),
                    ..lock
                });
            }
            _ => return Some(lock),
        };
        let token = self
            .redis
            .run(|connection| redis::cmd("INCR").arg(&counter).query(connection));
        Some(Lock {
            token: Some(token),
            ..lock
        })
    }

    /// One transaction: read, work, write, under a Redis lock or none. With a token, the
    /// read is fenced: the row locked, and the job refused if a newer holder wrote it.
    fn work_in_one_transaction(&mut self, job: &Job, lock: Option<&Lock>) -> Answer {
        let (table, token) = (&self.init.table, lock.and_then(|lock| lock.token));
        let mut tx = self.db.transaction().unwrap();
        if self.twist == Twist::WritingBeforeRead {
            self.out.note("writing", job.id); // the lie: nothing read yet
        }
        let row = match token {
            // The row lock is held until the commit, across the work: while this client is
            // frozen nobody else can write the row, so it is the row lock, not the token,
            // that keeps a stale write out (see `Design::Claimed`).
            Some(token) => {
                let read =
                    format!("SELECT value, items, fence FROM {table} WHERE record = $1 FOR UPDATE");
                let row = tx.query_one(&read, &[&job.record]).unwrap();
                if row
                    .get::<_, Option<i64>>(2)
                    .is_some_and(|fence| fence > token)
                {
                    return REFUSED;
                }
                row
            }
            None => {
                let read = format!("SELECT value, items FROM {table} WHERE record = $1");
                tx.query_one(&read, &[&job.record]).unwrap()
            }
        };
        if self.design == Design::Once {
            let done = format!(
                "INSERT INTO {}.done VALUES ($1) ON CONFLICT DO NOTHING",
                self.init.schema
            );
            if tx.execute(&done, &[&job.id]).unwrap() == 0 {
                return Answer::Ok; // done before, by a client that died before answering
            }
        }
        if !matches!(
            self.twist,
            Twist::WritingBeforeRead | Twist::WritingAfterCommit
        ) {
            self.out.note("writing", job.id);
        }
        job.work();
        if let Twist::CheckBeforeWrite(first) = self.twist {
            match first {
                SentFirst::Nothing => {}
                SentFirst::Select => tx.batch_execute("SELECT 1").unwrap(),
                SentFirst::DecoyWrite => {
                    let decoy =
                        format!("UPDATE {table} SET value = value WHERE record = $1 AND false");
                    // Counted across the run's clients: more than any job answered before.
                    let key = format!("{}decoys", self.init.key_prefix);
                    let decoys: u32 = self.redis.run(|c| redis::cmd("INCR").arg(&key).query(c));
                    for _ in 0..decoys {
                        tx.execute(&decoy, &[&job.record]).unwrap();
                    }
                }
            }
            let lock = lock.expect("a guard needs a lock to check");
            if !self.redis.still_ours(lock, 50) {
                return Answer::Fail("my lock is gone or nearly: not written");
            }
        }
        let (value, items) = job.written(row.get(0), row.get(1));
        let write = format!(
            "UPDATE {table} SET value = $1, items = $2, job = $3, fence = $4 WHERE record = $5"
        );
        tx.execute(&write, &[&value, &items, &job.id, &token, &job.record])
            .unwrap();
        tx.commit().unwrap();
        if self.twist == Twist::WritingAfterCommit {
            self.out.note("writing", job.id); // the lie: the write has landed already
        }
        Answer::Ok
    }

    /// `Checked`: read, work, then write only if no newer token wrote first — a check at the
    /// write alone, with no row lock across the work.
    fn work_checked(&mut self, job: &Job, lock: Option<&Lock>) -> Answer {
        let (table, token) = (&self.init.table, lock.and_then(|lock| lock.token));
        let read = format!("SELECT value, items FROM {table} WHERE record = $1");
        let row = self.db.query_one(&read, &[&job.record]).unwrap();
        self.out.note("writing", job.id);
        job.work();
        let (value, items) = job.written(row.get(0), row.get(1));
        let write = format!(
            "UPDATE {table} SET value = $1, items = $2, job = $3, fence = $4 \
             WHERE record = $5 AND (fence IS NULL OR fence <= $4)"
        );
        let rows = self
            .db
            .execute(&write, &[&value, &items, &job.id, &token, &job.record]);
        if rows.unwrap() == 1 {
            Answer::Ok
        } else {
            REFUSED
        }
    }

    /// `Claimed`: claim the row with the token (reading it), work holding no row lock, then
    /// write only if the row is still claimed by this token.
    fn work_claimed(&mut self, job: &Job, lock: Option<&Lock>) -> Answer {
        let (table, token) = (&self.init.table, lock.and_then(|lock| lock.token));
        let claim = format!(
            "UPDATE {table} SET fence = $1 WHERE record = $2 AND (fence IS NULL OR fence < $1) \
             RETURNING value, items"
        );
        let Some(row) = self.db.query_opt(&claim, &[&token, &job.record]).unwrap() else {
            return REFUSED; // a newer holder claimed it already
        };
        self.out.note("writing", job.id);
        job.work();
        let (value, items) = job.written(row.get(0), row.get(1));
        let write = format!(
            "UPDATE {table} SET value = $1, items = $2, job = $3 WHERE record = $4 AND fence = $5"
        );
        let rows = self
            .db
            .execute(&write, &[&value, &items, &job.id, &job.record, &token]);
        if rows.unwrap() == 1 {
            Answer::Ok
        } else {
            REFUSED
        }
    }

    /// `ForUpdate`, `Advisory`: the lock is Postgres's, held by the transaction that reads,
    /// works and writes; the token comes from a sequence, under the lock.
    fn work_in_postgres(&mut self, job: &Job) -> Answer {
        let (table, schema) = (&self.init.table, &self.init.schema);
        let mut tx = self.db.transaction().unwrap();
        let read = if self.design == Design::Advisory {
            let name = format!("{table}/{}", job.record);
            tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&name])
                .unwrap();
            format!("SELECT value, items FROM {table} WHERE record = $1")
        } else {
            format!("SELECT value, items FROM {table} WHERE record = $1 FOR UPDATE")
        };
        let row = tx.query_one(&read, &[&job.record]).unwrap();
        let next = format!("SELECT nextval('{schema}.tokens')");
        let token: i64 = tx.query_one(&next, &[]).unwrap().get(0);
        self.out
            .say(json!({"type": "acquired", "job": job.id, "token": token}));
        let items: Vec<String> = row.get(1);
        if !items.contains(&job.append) {
            // Else done already, by an earlier delivery: no second effect.
            self.out.note("writing", job.id);
            job.work();
            let (value, items) = job.written(row.get(0), items);
            let write = format!(
                "UPDATE {table} SET value = $1, items = $2, job = $3, fence = $4 WHERE record = $5"
            );
            tx.execute(&write, &[&value, &items, &job.id, &token, &job.record])
                .unwrap();
        }
        tx.commit().unwrap();
        self.out.note("released", job.id); // the commit let the lock go
        Answer::Ok
    }

    /// `Optimistic`: read, work, compare-and-set; a lost compare is read again and retried,
    /// or answered `fail`. Each `UPDATE` commits, refused or not: the statement log then
    /// shows the refusal.
    fn work_optimistic(&mut self, job: &Job, retry: bool) -> Answer {
        let table = &self.init.table;
        loop {
            let read = format!("SELECT value, items FROM {table} WHERE record = $1");
            let row = self.db.query_one(&read, &[&job.record]).unwrap();
            let (was_value, was_items): (i64, Vec<String>) = (row.get(0), row.get(1));
            if was_items.contains(&job.append) {
                return Answer::Ok; // done already, by an earlier delivery
            }
            self.out.note("writing", job.id);
            job.work();
            let (value, items) = job.written(was_value, was_items.clone());
            let write = format!(
                "UPDATE {table} SET value = $1, items = $2, job = $3 \
                 WHERE record = $4 AND value = $5 AND items = $6"
            );
            let rows = self.db.execute(
                &write,
                &[&value, &items, &job.id, &job.record, &was_value, &was_items],
            );
            if rows.unwrap() == 1 {
                return Answer::Ok;
            }
            if !retry {
                return Answer::Fail("lost the compare: the record changed since my read");
            }
        }
    }

    /// `BlindRetry`: a compare on the version read, then, if refused, a write with none.
    fn work_blind_retry(&mut self, job: &Job) -> Answer {
        let table = &self.init.table;
        let touch = format!(
            "UPDATE {table} SET fence = fence WHERE record = $1 \
             RETURNING value, items, xmin::text"
        );
        let row = self.db.query_one(&touch, &[&job.record]).unwrap();
        let (was_value, was_items, version): (i64, Vec<String>, String) =
            (row.get(0), row.get(1), row.get(2));
        if was_items.contains(&job.append) {
            return Answer::Ok;
        }
        self.out.note("writing", job.id);
        job.work();
        let (value, items) = job.written(was_value, was_items);
        let compare = format!(
            "UPDATE {table} SET value = $1, items = $2, job = $3 \
             WHERE record = $4 AND xmin::text = $5"
        );
        let args: [&(dyn postgres::types::ToSql + Sync); 5] =
            [&value, &items, &job.id, &job.record, &version];
        if self.db.execute(&compare, &args).unwrap() == 1 {
            return Answer::Ok;
        }
        // The bug: read again, and write what was read plus the job, with no compare.
        let row = self.db.query_one(&touch, &[&job.record]).unwrap();
        let (was_value, was_items): (i64, Vec<String>) = (row.get(0), row.get(1));
        self.out.note("writing", job.id);
        let (value, items) = job.written(was_value, was_items);
        let blind =
            format!("UPDATE {table} SET value = $1, items = $2, job = $3 WHERE record = $4");
        self.db
            .execute(&blind, &[&value, &items, &job.id, &job.record])
            .unwrap();
        Answer::Ok
    }

    /// `FailWhenSlow`: the job's entry is in its record already.
    fn entry_there(&mut self, job: &Job) -> bool {
        let there = format!(
            "SELECT $1 = ANY(items) FROM {} WHERE record = $2",
            self.init.table
        );
        self.db
            .query_one(&there, &[&job.append, &job.record])
            .unwrap()
            .get(0)
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "none".into());
    let Some(&(_, design, mut twist)) = REFERENCES.iter().find(|(known, ..)| *known == name) else {
        let known: Vec<&str> = REFERENCES.iter().map(|(known, ..)| *known).collect();
        panic!("unknown mode {name}: one of {}", known.join(", "));
    };
    // `outlast 30`: a long lease of that many lease_ms.
    if let (Twist::LongLease { .. }, Some(times)) = (twist, args.next()) {
        let times = times.parse().expect("a long lease's length, in lease_ms");
        twist = Twist::LongLease { times };
    }
    let mut lines = std::io::stdin().lock().lines();
    let init: Init = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let mut client = Client::connect(design, twist, init);
    client.out.say(json!({
        "type": "ready",
        "notes": twist != Twist::NoNotes,
        "lock": !design.lockless(),
    }));
    // lockslab closes stdin when there are no more jobs.
    for line in lines {
        let job: Job = serde_json::from_str(&line.unwrap()).unwrap();
        let answer = client.serve(&job);
        client.out.answer(job.id, answer);
    }
}
