//! Reference clients for `lockslab challenge`, in Rust, broken and fixed side by side (the
//! Python ones, with more modes, are in reference.py beside this file):
//!
//! ```text
//! cargo build --example challenge
//! lockslab challenge counter -- ./target/debug/examples/challenge none     # fails
//! lockslab challenge counter -- ./target/debug/examples/challenge fenced   # passes
//! lockslab challenge pause   -- ./target/debug/examples/challenge setnx    # fails
//! lockslab challenge pause   -- ./target/debug/examples/challenge fenced   # passes
//! ```
//!
//! - `none`: no lock: read, add, write. Two clients on one record lose an update.
//! - `setnx`: Redis `SET NX PX`, released with compare-and-delete: the first lock most people
//!   write. A holder frozen past the TTL still writes what it read.
//! - `fenced`: setnx + a fencing token (Redis `INCR`), checked by Postgres where the record
//!   is read (`SELECT … FOR UPDATE`), and written in the same transaction.
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

/// `SET NX PX` until it is ours (at most 10 s), and a token for `fenced`.
fn acquire(
    redis: &mut redis::Connection,
    prefix: &str,
    record: &str,
    owner: String,
    ttl: u64,
    fenced: bool,
) -> Option<Lock> {
    let key = format!("{prefix}lock:{record}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let set: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&owner)
            .arg("NX")
            .arg("PX")
            .arg(ttl)
            .query(redis)
            .unwrap();
        if set.is_some() {
            break;
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let token = fenced.then(|| {
        redis::cmd("INCR")
            .arg(format!("{prefix}token"))
            .query::<i64>(redis)
            .unwrap()
    });
    Some(Lock { key, owner, token })
}

/// One transaction: read, work, write. False if a newer holder's token is on the row.
fn work(db: &mut postgres::Client, table: &str, job: &Value, token: Option<i64>) -> bool {
    let (id, record, add) = (
        job["id"].as_i64().unwrap(),
        job["record"].as_str().unwrap(),
        job["add"].as_i64().unwrap(),
    );
    let mut tx = db.transaction().unwrap();
    let value: i64 = match token {
        // Fence the read: lock the row, and refuse if a newer holder wrote it.
        Some(token) => {
            let row = tx
                .query_one(
                    &format!("SELECT value, fence FROM {table} WHERE record = $1 FOR UPDATE"),
                    &[&record],
                )
                .unwrap();
            let fence: Option<i64> = row.get(1);
            if fence.is_some_and(|fence| fence > token) {
                return false;
            }
            row.get(0)
        }
        None => tx
            .query_one(
                &format!("SELECT value FROM {table} WHERE record = $1"),
                &[&record],
            )
            .unwrap()
            .get(0),
    };
    say(json!({"type": "writing", "job": id}));
    // The job's work, between read and write.
    std::thread::sleep(Duration::from_millis(job["work_ms"].as_u64().unwrap_or(0)));
    tx.execute(
        &format!("UPDATE {table} SET value = $1, job = $2, fence = $3 WHERE record = $4"),
        &[&(value + add), &id, &token, &record],
    )
    .unwrap();
    tx.commit().unwrap();
    true
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "none".into());
    assert!(
        ["none", "setnx", "fenced"].contains(&mode.as_str()),
        "unknown mode {mode}"
    );
    let mut lines = std::io::stdin().lock().lines();
    let init: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let mut db =
        postgres::Client::connect(init["postgres_url"].as_str().unwrap(), postgres::NoTls).unwrap();
    let mut redis = redis::Client::open(init["redis_url"].as_str().unwrap())
        .unwrap()
        .get_connection()
        .unwrap();
    let table = init["table"].as_str().unwrap().to_string();
    let prefix = init["key_prefix"].as_str().unwrap().to_string();
    let client = init["client"].as_str().unwrap().to_string();
    let ttl = init["lease_ms"].as_u64().unwrap();
    say(json!({"type": "ready", "notes": true}));

    // lockslab closes stdin when there are no more jobs.
    for line in lines {
        let job: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let id = job["id"].as_i64().unwrap();
        let record = job["record"].as_str().unwrap();
        let lock = if mode == "none" {
            None
        } else {
            let owner = format!("{client}:{id}:{:?}", Instant::now());
            match acquire(&mut redis, &prefix, record, owner, ttl, mode == "fenced") {
                Some(lock) => Some(lock),
                None => {
                    say(json!({"type": "fail", "job": id, "reason": "no lock within 10s"}));
                    continue;
                }
            }
        };
        if let Some(lock) = &lock {
            say(json!({"type": "acquired", "job": id, "token": lock.token}));
        }
        let done = work(&mut db, &table, &job, lock.as_ref().and_then(|l| l.token));
        if let Some(lock) = lock {
            let _: i64 = redis::Script::new(RELEASE)
                .key(&lock.key)
                .arg(&lock.owner)
                .invoke(&mut redis)
                .unwrap();
            say(json!({"type": "released", "job": id}));
        }
        if done {
            say(json!({"type": "ok", "job": id}));
        } else {
            say(json!({"type": "fail", "job": id, "reason": "fenced out: a newer holder wrote"}));
        }
    }
}
