//! Reference clients for `lockslab challenge`, in Rust, broken and fixed side by side (the
//! Python ones, with more modes — `checked`, `long`, `outlast`, `late`, `early`, `quiet` and
//! others — are in reference.py beside this file):
//!
//! ```text
//! cargo build --example challenge
//! lockslab challenge counter      -- ./target/debug/examples/challenge none      # fails
//! lockslab challenge counter      -- ./target/debug/examples/challenge fenced    # passes
//! lockslab challenge pause        -- ./target/debug/examples/challenge setnx     # fails
//! lockslab challenge pause        -- ./target/debug/examples/challenge fenced    # passes
//! lockslab challenge pause        -- ./target/debug/examples/challenge claimed   # passes
//! lockslab challenge delay        -- ./target/debug/examples/challenge setnx     # fails
//! lockslab challenge delay        -- ./target/debug/examples/challenge claimed   # passes
//! lockslab challenge crash        -- ./target/debug/examples/challenge fenced    # fails
//! lockslab challenge crash        -- ./target/debug/examples/challenge once      # passes
//! lockslab challenge exactly-once -- ./target/debug/examples/challenge fenced    # fails
//! lockslab challenge exactly-once -- ./target/debug/examples/challenge once      # passes
//! lockslab challenge failover     -- ./target/debug/examples/challenge sentinel  # fails
//! lockslab challenge failover     -- ./target/debug/examples/challenge sequence  # passes
//! lockslab challenge pause        -- ./target/debug/examples/challenge for-update   # passes
//! lockslab challenge delay        -- ./target/debug/examples/challenge advisory     # passes
//! lockslab challenge crash        -- ./target/debug/examples/challenge optimistic   # passes
//! lockslab challenge pause        -- ./target/debug/examples/challenge optimistic-fail # never done, often
//! ```
//!
//! Every mode reads the record's `value` and `items`, and writes `value + add` and the items
//! with the job's entry (`append`) at the end, in one `UPDATE`.
//!
//! - `none`: no lock: read, add, write. Two clients on one record lose an update.
//! - `setnx`: Redis `SET NX PX`, released with compare-and-delete: the first lock most people
//!   write. A holder frozen past the TTL still writes what it read.
//! - `fenced`: setnx + a fencing token (Redis `INCR`), checked by Postgres where the record
//!   is read (`SELECT … FOR UPDATE`), and written in the same transaction. That
//!   transaction's row lock, held across the work, keeps everyone off the row while its
//!   holder is frozen: the token never meets a newer write to refuse, and the next client
//!   waits behind the frozen one's row (`pg_blocking_pids`): the lock held it off.
//! - `claimed`: setnx + a token that claims the row before the read, in a short transaction
//!   of its own; the work holds no row lock, and the write lands only if the row is still
//!   claimed by this token. The token alone keeps a frozen or delayed holder out.
//! - `once`: fenced + the job recorded as done in the same transaction: a job resent (or
//!   delivered twice) that already took effect is answered `ok` again, with no second
//!   effect.
//! - `sentinel`: fenced, on the Redis primary the Sentinels name (`failover`), with a token
//!   per record from `INCR` there. The promoted replica missed the last `INCR`s: its tokens
//!   start again below those written, and the check lets an equal one through.
//! - `sequence`: sentinel, with the token from a Postgres sequence: it never goes back as long
//!   as that Postgres keeps what it commits (`fsync` and `synchronous_commit` on) and is not
//!   failed over to an asynchronous standby (values handed out on the old primary can be
//!   handed out again there). The challenge's private Postgres runs with `fsync` and
//!   `synchronous_commit` off and is never crashed.
//! - `for-update`: no Redis lock: the row's lock (`SELECT … FOR UPDATE`), held by the one
//!   transaction that reads, works and writes, with a token from a Postgres sequence taken
//!   under it (so fences rise in commit order). A job whose entry is in the items read is
//!   done already: `ok`, no second effect. A frozen holder keeps the others waiting on its
//!   row, and lockslab reads that wait (`pg_blocking_pids`): the lock held them off.
//! - `advisory`: for-update, with a transaction-scoped advisory lock on the record
//!   (`pg_advisory_xact_lock`) before a plain read.
//! - `optimistic`: no lock at all (`ready` says `"lock": false`): read, work, then a
//!   compare-and-set (`UPDATE … WHERE value and items are as read`); a compare that matched
//!   nothing is read again and retried, with a new `writing` note.
//! - `optimistic-fail`: optimistic, answering `fail` on a lost compare instead: as safe, but
//!   a job that loses five compares in a row is never done (most seeds, three clients).
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Deletes the key only if it still holds our value: never someone else's lock.
const RELEASE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                       return redis.call('DEL', KEYS[1]) end return 0";

fn say(message: Value) {
    // One line, flushed at once: lockslab reads it before it pauses or kills us.
    let mut out = std::io::stdout().lock();
    writeln!(out, "{message}").unwrap();
    out.flush().unwrap();
}

struct Lock {
    key: String,
    owner: String,
    token: Option<i64>,
}

/// The lock's Redis: `redis_url`, or under `failover` the server the Sentinels name as the
/// primary, asked again after every error.
struct Redis {
    init: Value,
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
        let Some(sentinels) = self.init["sentinels"].as_array() else {
            return open(self.init["redis_url"].as_str()?).ok();
        };
        let password = self.init["redis_password"].as_str()?;
        for sentinel in sentinels.iter().filter_map(Value::as_str) {
            let Ok(mut asked) = open(&format!("redis://default:{password}@{sentinel}")) else {
                continue;
            };
            let Ok(primary) = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(self.init["master_name"].as_str()?)
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
}

/// `SET NX PX` until it is ours (at most 10 s).
fn acquire(redis: &mut Redis, prefix: &str, record: &str, owner: String, ttl: u64) -> Option<Lock> {
    let key = format!("{prefix}lock:{record}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let set: Option<String> = redis.run(|connection| {
            redis::cmd("SET")
                .arg(&key)
                .arg(&owner)
                .arg("NX")
                .arg("PX")
                .arg(ttl)
                .query(connection)
        });
        if set.is_some() {
            break;
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Some(Lock {
        key,
        owner,
        token: None,
    })
}

/// The fencing token of a lock just taken, by mode.
fn token(mode: &str, redis: &mut Redis, db: &mut postgres::Client, record: &str) -> Option<i64> {
    let prefix = redis.init["key_prefix"].as_str().unwrap().to_string();
    let counter = match mode {
        "fenced" | "claimed" | "once" => format!("{prefix}token"),
        "sentinel" => format!("{prefix}token:{record}"),
        "sequence" => {
            let schema = redis.init["schema"].as_str().unwrap();
            let sql = format!("SELECT nextval('{schema}.tokens')");
            return Some(db.query_one(&sql, &[]).unwrap().get(0));
        }
        _ => return None,
    };
    Some(redis.run(|connection| redis::cmd("INCR").arg(&counter).query(connection)))
}

/// What a job's write sets: the value read plus `add`, and the items read with the job's
/// entry (`append`) at the end.
fn written(job: &Value, value: i64, mut items: Vec<String>) -> (i64, Vec<String>) {
    items.push(job["append"].as_str().unwrap().to_string());
    (value + job["add"].as_i64().unwrap(), items)
}

/// `claimed`: claim the row with the token (reading it), work holding no row lock, then
/// write only if the row is still claimed by this token. False if a newer holder claimed it.
fn work_claimed(db: &mut postgres::Client, table: &str, job: &Value, token: i64) -> bool {
    let (id, record) = (job["id"].as_i64().unwrap(), job["record"].as_str().unwrap());
    let claim = format!(
        "UPDATE {table} SET fence = $1 WHERE record = $2 AND (fence IS NULL OR fence < $1) \
         RETURNING value, items"
    );
    let Some(row) = db.query_opt(&claim, &[&token, &record]).unwrap() else {
        return false;
    };
    let (value, items) = written(job, row.get(0), row.get(1));
    say(json!({"type": "writing", "job": id}));
    std::thread::sleep(Duration::from_millis(job["work_ms"].as_u64().unwrap_or(0)));
    let write = format!(
        "UPDATE {table} SET value = $1, items = $2, job = $3 WHERE record = $4 AND fence = $5"
    );
    db.execute(&write, &[&value, &items, &id, &record, &token])
        .unwrap()
        == 1
}

/// `for-update`, `advisory`: the lock is Postgres's, held by the transaction that reads,
/// works and writes; the token comes from a sequence, under the lock.
fn work_in_postgres(db: &mut postgres::Client, init: &Value, mode: &str, job: &Value) -> bool {
    let (table, schema) = (
        init["table"].as_str().unwrap(),
        init["schema"].as_str().unwrap(),
    );
    let (id, record) = (job["id"].as_i64().unwrap(), job["record"].as_str().unwrap());
    let mut tx = db.transaction().unwrap();
    let read = if mode == "advisory" {
        let name = format!("{table}/{record}");
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&name])
            .unwrap();
        format!("SELECT value, items FROM {table} WHERE record = $1")
    } else {
        format!("SELECT value, items FROM {table} WHERE record = $1 FOR UPDATE")
    };
    let row = tx.query_one(&read, &[&record]).unwrap();
    let token: i64 = tx
        .query_one(&format!("SELECT nextval('{schema}.tokens')"), &[])
        .unwrap()
        .get(0);
    say(json!({"type": "acquired", "job": id, "token": token}));
    let items: Vec<String> = row.get(1);
    if !items
        .iter()
        .any(|e| Some(e.as_str()) == job["append"].as_str())
    {
        let (value, items) = written(job, row.get(0), items);
        say(json!({"type": "writing", "job": id}));
        std::thread::sleep(Duration::from_millis(job["work_ms"].as_u64().unwrap_or(0)));
        let write = format!(
            "UPDATE {table} SET value = $1, items = $2, job = $3, fence = $4 WHERE record = $5"
        );
        tx.execute(&write, &[&value, &items, &id, &token, &record])
            .unwrap();
    }
    tx.commit().unwrap();
    say(json!({"type": "released", "job": id}));
    true
}

/// `optimistic`: read, work, compare-and-set; a lost compare is read again and retried
/// (or answered `fail`, `optimistic-fail`). Each UPDATE commits, refused or not: the
/// statement log then shows the refusal.
fn work_optimistic(db: &mut postgres::Client, table: &str, job: &Value, retry: bool) -> bool {
    let (id, record) = (job["id"].as_i64().unwrap(), job["record"].as_str().unwrap());
    loop {
        let read = format!("SELECT value, items FROM {table} WHERE record = $1");
        let row = db.query_one(&read, &[&record]).unwrap();
        let (was_value, was_items): (i64, Vec<String>) = (row.get(0), row.get(1));
        if was_items
            .iter()
            .any(|e| Some(e.as_str()) == job["append"].as_str())
        {
            return true; // done already, by an earlier delivery
        }
        let (value, items) = written(job, was_value, was_items.clone());
        say(json!({"type": "writing", "job": id}));
        std::thread::sleep(Duration::from_millis(job["work_ms"].as_u64().unwrap_or(0)));
        let write = format!(
            "UPDATE {table} SET value = $1, items = $2, job = $3 \
             WHERE record = $4 AND value = $5 AND items = $6"
        );
        let rows = db
            .execute(
                &write,
                &[&value, &items, &id, &record, &was_value, &was_items],
            )
            .unwrap();
        if rows == 1 {
            return true;
        }
        if !retry {
            return false;
        }
    }
}

/// One transaction: read, work, write. False if a newer holder's token is on the row.
fn work(
    db: &mut postgres::Client,
    init: &Value,
    mode: &str,
    job: &Value,
    token: Option<i64>,
) -> bool {
    let table = init["table"].as_str().unwrap();
    if mode == "for-update" || mode == "advisory" {
        return work_in_postgres(db, init, mode, job);
    }
    if mode.starts_with("optimistic") {
        return work_optimistic(db, table, job, mode == "optimistic");
    }
    if let ("claimed", Some(token)) = (mode, token) {
        return work_claimed(db, table, job, token);
    }
    let (id, record) = (job["id"].as_i64().unwrap(), job["record"].as_str().unwrap());
    let mut tx = db.transaction().unwrap();
    let row = match token {
        // Fence the read: lock the row, and refuse if a newer holder wrote it.
        Some(token) => {
            let row = tx
                .query_one(
                    &format!(
                        "SELECT value, items, fence FROM {table} WHERE record = $1 FOR UPDATE"
                    ),
                    &[&record],
                )
                .unwrap();
            let fence: Option<i64> = row.get(2);
            if fence.is_some_and(|fence| fence > token) {
                return false;
            }
            row
        }
        None => tx
            .query_one(
                &format!("SELECT value, items FROM {table} WHERE record = $1"),
                &[&record],
            )
            .unwrap(),
    };
    let (value, items) = written(job, row.get(0), row.get(1));
    if mode == "once" {
        // Done before, by a client that died before answering: ok again, no second effect.
        let done = format!(
            "INSERT INTO {}.done VALUES ($1) ON CONFLICT DO NOTHING",
            init["schema"].as_str().unwrap()
        );
        if tx.execute(&done, &[&id]).unwrap() == 0 {
            return true;
        }
    }
    say(json!({"type": "writing", "job": id}));
    // The job's work, between read and write.
    std::thread::sleep(Duration::from_millis(job["work_ms"].as_u64().unwrap_or(0)));
    tx.execute(
        &format!(
            "UPDATE {table} SET value = $1, items = $2, job = $3, fence = $4 WHERE record = $5"
        ),
        &[&value, &items, &id, &token, &record],
    )
    .unwrap();
    tx.commit().unwrap();
    true
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "none".into());
    assert!(
        [
            "none",
            "setnx",
            "fenced",
            "claimed",
            "once",
            "sentinel",
            "sequence",
            "for-update",
            "advisory",
            "optimistic",
            "optimistic-fail"
        ]
        .contains(&mode.as_str()),
        "unknown mode {mode}"
    );
    let mut lines = std::io::stdin().lock().lines();
    let init: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let mut db =
        postgres::Client::connect(init["postgres_url"].as_str().unwrap(), postgres::NoTls).unwrap();
    let shared = match mode.as_str() {
        "sequence" | "for-update" | "advisory" => Some("SEQUENCE IF NOT EXISTS {schema}.tokens"),
        "once" => Some("TABLE IF NOT EXISTS {schema}.done (job bigint PRIMARY KEY)"),
        _ => None,
    };
    if let Some(what) = shared {
        // Every client creates it; the first one wins.
        let schema = init["schema"].as_str().unwrap();
        let mut tx = db.transaction().unwrap();
        tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&schema])
            .unwrap();
        tx.batch_execute(&format!("CREATE {}", what.replace("{schema}", schema)))
            .unwrap();
        tx.commit().unwrap();
    }
    let mut redis = Redis {
        init: init.clone(),
        connection: None,
    };
    let prefix = init["key_prefix"].as_str().unwrap().to_string();
    let client = init["client"].as_str().unwrap().to_string();
    let ttl = init["lease_ms"].as_u64().unwrap();
    let lockless = mode == "none" || mode.starts_with("optimistic");
    say(json!({"type": "ready", "notes": true, "lock": !lockless}));

    // lockslab closes stdin when there are no more jobs.
    for line in lines {
        let job: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let id = job["id"].as_i64().unwrap();
        let record = job["record"].as_str().unwrap();
        let own_lock = lockless || mode == "for-update" || mode == "advisory";
        let lock = if own_lock {
            None
        } else {
            let owner = format!("{client}:{id}:{:?}", Instant::now());
            match acquire(&mut redis, &prefix, record, owner, ttl) {
                Some(lock) => Some(Lock {
                    token: token(&mode, &mut redis, &mut db, record),
                    ..lock
                }),
                None => {
                    say(json!({"type": "fail", "job": id, "reason": "no lock within 10s"}));
                    continue;
                }
            }
        };
        if let Some(lock) = &lock {
            say(json!({"type": "acquired", "job": id, "token": lock.token}));
        }
        let done = work(
            &mut db,
            &init,
            &mode,
            &job,
            lock.as_ref().and_then(|l| l.token),
        );
        if let Some(lock) = lock {
            let release = redis::Script::new(RELEASE);
            let _: i64 =
                redis.run(|connection| release.key(&lock.key).arg(&lock.owner).invoke(connection));
            say(json!({"type": "released", "job": id}));
        }
        if done {
            say(json!({"type": "ok", "job": id}));
        } else {
            say(json!({"type": "fail", "job": id, "reason": "fenced out: a newer holder wrote"}));
        }
    }
}
