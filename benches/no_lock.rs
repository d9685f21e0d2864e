//! Lab 7's speed against real servers: `cargo bench --bench no_lock`.
//!
//! Each approach with no faults and no simulated work, 10 workers, 10,000 jobs on 200
//! customers (long enough that the start and the end of the run weigh little; 200 rather
//! than the lab's 20 so that the workers seldom want the same customer at once, as
//! pgbench's clients never do: at 20, redis-lock retried 2,597 times and optimistic 5,678
//! in 10,000 jobs, a cost of contention that pgbench's script does not pay, and that the
//! lab's own `--contention` sweep shows); beside it,
//! `pgbench` on the same server in the same run, running the very statements that
//! approach's worker sends for one job, in the same order and the same transactions. Like
//! for like, as in `benches/skip_locked.rs`: prepared once per connection (`-M prepared`,
//! as the worker's `Desk::new` prepares its statements), 10 clients each on a connection
//! and a thread of its own (`-j 10`, as the lab's 10 worker processes), the lab's 10,000
//! jobs (`-t`, a thousand a client, rather than a fixed time: the lab's figure includes
//! its own start and end), on tables as fresh and unanalysed as the lab's.
//! What pgbench cannot do the same way, and how the script stands in for it:
//! - "invoiced yet?": the lab's workers ask it 16 jobs at a time (`invoices::LOOK_AHEAD`),
//!   and every worker asks it of the whole list, jobs done by the others included; the
//!   script asks it once per job;
//! - the customer: each worker walks the list from a start of its own, so that at any
//!   moment the workers are mostly on different customers; each pgbench client keeps to 20
//!   customers of its own (its id, its id + 10, …), so that its rows are never the others'
//!   at the same moment;
//! - Redis: the Redis approaches take and release the lock there, two round trips pgbench
//!   does not make (it runs only their Postgres part), and redis-fenced's token, drawn by
//!   Redis, is a Postgres sequence's number here.
//!
//! Figures are printed, not asserted: the machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/pgbench.rs"]
mod pgbench;

use std::path::Path;

use common::*;
use serde_json::Value;

const JOBS: &str = "10000";
const KEYS: &str = "200";

const SETUP: &str = "
    DROP TABLE IF EXISTS bench_customers, bench_invoices;
    DROP SEQUENCE IF EXISTS bench_fence;
    CREATE TABLE bench_customers (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0,
                                  version bigint NOT NULL DEFAULT 0,
                                  fence bigint NOT NULL DEFAULT 0);
    CREATE TABLE bench_invoices (customer int NOT NULL, period int NOT NULL,
                                 amount bigint NOT NULL, worker text NOT NULL,
                                 at timestamptz NOT NULL DEFAULT clock_timestamp());
    CREATE INDEX ON bench_invoices (customer, period);
    CREATE SEQUENCE bench_fence;
    INSERT INTO bench_customers (id) SELECT generate_series(0, 199);";

/// idempotency-key's table: its unique index is the lesson (the lab's `UNIQUE_INVOICES`).
const UNIQUE: &str = "DROP INDEX bench_invoices_customer_period_idx;
    CREATE UNIQUE INDEX ON bench_invoices (customer, period);";

/// One job of each approach, for pgbench: one of the client's customers, a period nobody
/// used yet, and the statements of `src/invoices.rs` in the order its worker sends them.
fn script(approach: &str) -> String {
    let head = "\\set c :client_id % 10 + 10 * random(0, 19)\n\\set p random(1, 2000000000)\n\
                SELECT EXISTS (SELECT 1 FROM bench_invoices WHERE customer = :c AND period = :p) AS done \\gset\n";
    // READ_CUSTOMER: the balance, its version and "invoiced?" in one statement.
    let read = "SELECT balance, version, EXISTS (SELECT 1 FROM bench_invoices \
                WHERE customer = :c AND period = :p) AS invoiced FROM bench_customers WHERE id = :c \\gset\n";
    let insert = "INSERT INTO bench_invoices (customer, period, amount, worker) VALUES (:c, :p, 100, 'pgbench');\n";
    let set = "UPDATE bench_customers SET balance = :balance + 100 WHERE id = :c;\n";
    let body = match approach {
        "optimistic" => format!(
            "{read}BEGIN;\nUPDATE bench_customers SET balance = :balance + 100, version = version + 1 \
             WHERE id = :c AND version = :version;\n{insert}COMMIT;\n"
        ),
        "idempotency-key" => {
            "BEGIN;\nINSERT INTO bench_invoices (customer, period, amount, worker) \
             VALUES (:c, :p, 100, 'pgbench') ON CONFLICT (customer, period) DO NOTHING;\n\
             UPDATE bench_customers SET balance = balance + 100 WHERE id = :c;\nCOMMIT;\n"
                .to_string()
        }
        "advisory-xact" => format!(
            "BEGIN;\nSELECT pg_advisory_xact_lock(424242, :c);\n{read}{insert}{set}COMMIT;\n"
        ),
        "advisory-session" => format!(
            "SELECT pg_advisory_lock(424242, :c);\n{read}BEGIN;\n{insert}{set}COMMIT;\n\
             SELECT pg_advisory_unlock(424242, :c);\n"
        ),
        // CLAIM_ROW, then IS_INVOICED, then the invoice and SET_BALANCE.
        "redis-fenced" => format!(
            "BEGIN;\nUPDATE bench_customers SET fence = nextval('bench_fence') WHERE id = :c \
             RETURNING balance \\gset\n\
             SELECT EXISTS (SELECT 1 FROM bench_invoices WHERE customer = :c AND period = :p) \
             AS invoiced \\gset\n{insert}{set}COMMIT;\n"
        ),
        // redis-lock and partitioned: read, then write the computed balance.
        _ => format!("{read}BEGIN;\n{insert}{set}COMMIT;\n"),
    };
    format!("{head}{body}")
}

fn main() {
    let url = servers().postgres.clone();
    let pgbench = pgbench::find();
    if pgbench.is_none() {
        println!("pgbench not found (PATH, /usr/lib/postgresql/*/bin): lab figures only");
    }
    println!(
        "lockslab no-lock <approach> --fault none --work 0ms --jobs {JOBS} --keys {KEYS} (10 \
         workers) beside pgbench -c 10 -j 10 -M prepared -t {} (the same {JOBS} jobs); trips: \
         round trips a job, the lab's (Postgres and Redis, every worker's look-ahead included) \
         and pgbench's (its script's statements):",
        JOBS.parse::<u32>().unwrap() / 10
    );
    println!(
        "  {:<18} {:>8} {:>8} {:>11} {:>8} {:>8}",
        "approach", "jobs/s", "trips", "pgbench tps", "trips", "retries"
    );
    let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    for approach in [
        "redis-lock",
        "optimistic",
        "idempotency-key",
        "partitioned",
        "advisory-xact",
        "advisory-session",
        "redis-fenced",
    ] {
        let (_, verdict, _) = run_json(&[
            "no-lock", approach, "--fault", "none", "--work", "0ms", "--jobs", JOBS, "--keys", KEYS,
        ]);
        let a: &Value = &verdict["approaches"][0];
        assert_eq!(a["duplicates"], 0, "{a}");
        assert_eq!(a["lost_updates"], 0, "{a}");
        let lab = a["jobs_per_s"].as_f64().unwrap_or(0.0);
        let tps = pgbench.as_ref().map(|pgbench| {
            db.batch_execute(SETUP).unwrap();
            if approach == "idempotency-key" {
                db.batch_execute(UNIQUE).unwrap();
            }
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), script(approach)).unwrap();
            pgbench_tps(pgbench, &url, file.path())
        });
        println!(
            "  {approach:<18} {lab:>8.0} {:>8.1} {:>11} {:>8} {:>8}   {}",
            a["round_trips_per_job"].as_f64().unwrap_or(0.0),
            tps.map_or("-".into(), |t| format!("{t:.0}")),
            statements(&script(approach)),
            a["retries"].as_u64().unwrap_or(0),
            tps.map_or(String::new(), |t| format!("lab / pgbench = {:.2}", lab / t)),
        );
    }
    db.batch_execute(
        "DROP TABLE IF EXISTS bench_customers, bench_invoices; \
         DROP SEQUENCE IF EXISTS bench_fence",
    )
    .unwrap();
}

/// pgbench's tps for `script`: 10 clients, each one connection on a thread of its own (as
/// the lab's 10 worker processes), prepared statements, no vacuum, the lab's 10,000 jobs
/// (a thousand a client).
fn pgbench_tps(pgbench: &Path, url: &str, script: &Path) -> f64 {
    let script = script.to_str().expect("a UTF-8 temporary path");
    let per_client = (JOBS.parse::<u32>().unwrap() / 10).to_string();
    let args = [
        "-c",
        "10",
        "-j",
        "10",
        "-n",
        "-M",
        "prepared",
        "-t",
        &per_client,
        "-f",
        script,
    ];
    pgbench::tps(&mut pgbench::command(pgbench, url, &args))
}

/// Round trips a job of `script` makes: one per SQL statement (pgbench sends each alone
/// and waits for its answer); the `\set` lines stay in pgbench.
fn statements(script: &str) -> usize {
    script
        .lines()
        .filter(|line| !line.is_empty() && !line.starts_with('\\'))
        .count()
}
