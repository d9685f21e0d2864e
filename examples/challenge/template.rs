//! A client for `lockslab challenge`: speaks the protocol, takes NO lock yet.
//!
//! cargo new my-client && cd my-client
//! cargo add serde_json postgres redis
//! (put this file in src/main.rs), cargo build --release, then:
//! lockslab challenge counter -- ./target/release/my-client
//!
//! Protocol (docs/challenge.md): one JSON object a line. stdin brings `init`,
//! then `job`s; stdout answers `ready`, then `ok` (or `fail`) for each job.
//! Log on stderr: stdout is for the protocol.
use std::io::{BufRead, Write};

use serde_json::{Value, json};

fn say(message: Value) {
    // One line, flushed at once: lockslab reads it before it pauses or kills you.
    let mut out = std::io::stdout().lock();
    writeln!(out, "{message}").unwrap();
    out.flush().unwrap();
}

fn main() {
    let mut lines = std::io::stdin().lock().lines();
    let init: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let mut db =
        postgres::Client::connect(init["postgres_url"].as_str().unwrap(), postgres::NoTls).unwrap();
    // For your lock; every key starts with init["key_prefix"]. Under `failover` the
    // redis_url primary dies mid-run: ask the Sentinels in init["sentinels"] ("host:port"
    // strings) for the primary of init["master_name"] (SENTINEL get-master-addr-by-name;
    // they and the Redis servers demand init["redis_password"]), and ask them again when your
    // connection fails.
    let _redis = redis::Client::open(init["redis_url"].as_str().unwrap()).unwrap();
    let table = init["table"].as_str().unwrap().to_string();
    say(json!({"type": "ready", "notes": true}));

    // lockslab closes stdin when there are no more jobs.
    for line in lines {
        let job: Value = serde_json::from_str(&line.unwrap()).unwrap();
        let (id, record, add, append) = (
            job["id"].as_i64().unwrap(),
            job["record"].as_str().unwrap(),
            job["add"].as_i64().unwrap(),
            job["append"].as_str().unwrap(),
        );
        // TODO: take a lock here, and say {"type": "acquired", "job": id, "token": ...}
        let mut tx = db.transaction().unwrap();
        let row = tx
            .query_one(
                &format!("SELECT value, items FROM {table} WHERE record = $1"),
                &[&record],
            )
            .unwrap();
        let (value, mut items): (i64, Vec<String>) = (row.get(0), row.get(1));
        say(json!({"type": "writing", "job": id}));
        // The job's work, between read and write.
        let work = job["work_ms"].as_u64().unwrap_or(0);
        std::thread::sleep(std::time::Duration::from_millis(work));
        // What was read, plus the job's add, with its entry at the end of the items.
        items.push(append.to_string());
        tx.execute(
            &format!("UPDATE {table} SET value = $1, items = $2, job = $3 WHERE record = $4"),
            &[&(value + add), &items, &id, &record],
        )
        .unwrap();
        tx.commit().unwrap();
        // TODO: release the lock, and say {"type": "released", "job": id}
        say(json!({"type": "ok", "job": id}));
    }
}
