//! Lab 7's speed against real servers: `cargo bench --bench no_lock`.
//!
//! Each approach with no faults and no simulated work, 10 workers, 2000 jobs on 20
//! customers; beside it, `pgbench` on the same server in the same run, 10 clients, running
//! that approach's own statements for one job (the "invoiced yet?" check included). The
//! ratio says how close the lab's workers get to what Postgres does with the same SQL. The
//! lab's workers also ask "invoiced yet?" for every job the others did (16 jobs to a
//! request: `invoices::LOOK_AHEAD`), and the Redis approaches talk to Redis too; pgbench
//! runs only their Postgres part, one "invoiced yet?" per job.
//!
//! Figures are printed, not asserted: the machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

const JOBS: &str = "2000";
const PGBENCH_SECONDS: &str = "3";

const SETUP: &str = "
    DROP TABLE IF EXISTS bench_customers, bench_invoices;
    CREATE TABLE bench_customers (id int PRIMARY KEY, balance bigint NOT NULL DEFAULT 0,
                                  version bigint NOT NULL DEFAULT 0,
                                  fence bigint NOT NULL DEFAULT 0);
    CREATE TABLE bench_invoices (customer int NOT NULL, period int NOT NULL,
                                 amount bigint NOT NULL, worker text NOT NULL,
                                 at timestamptz NOT NULL DEFAULT clock_timestamp());
    CREATE UNIQUE INDEX ON bench_invoices (customer, period);
    INSERT INTO bench_customers (id) SELECT generate_series(0, 19);";

/// One job of each approach, for pgbench: a random customer, a period nobody used yet.
fn script(approach: &str) -> String {
    let head = "\\set c random(0, 19)\n\\set p random(1, 2000000000)\n\
                SELECT EXISTS (SELECT 1 FROM bench_invoices WHERE customer = :c AND period = :p) AS done \\gset\n";
    let read = "SELECT balance, version FROM bench_customers WHERE id = :c \\gset\n";
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
        "redis-fenced" => format!(
            "{read}\\set token random(1, 2000000000)\nBEGIN;\nUPDATE bench_customers SET \
             balance = :balance + 100, fence = :token WHERE id = :c AND fence <= :token;\n\
             {insert}COMMIT;\n"
        ),
        // redis-lock and partitioned: read, then write the computed balance.
        _ => format!("{read}BEGIN;\n{insert}{set}COMMIT;\n"),
    };
    format!("{head}{body}")
}

fn main() {
    let url = servers().postgres.clone();
    let pgbench = find_pgbench();
    if pgbench.is_none() {
        println!("pgbench not found (PATH, /usr/lib/postgresql/*/bin): lab figures only");
    }
    println!(
        "lockslab no-lock <approach> --fault none --work 0ms --jobs {JOBS} (10 workers, 20 \
         customers) beside pgbench -c 10 -j 2 -T {PGBENCH_SECONDS} -M prepared:"
    );
    println!(
        "  {:<18} {:>8} {:>8} {:>8} {:>10}",
        "approach", "jobs/s", "trips", "retries", "pgbench tps"
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
            "no-lock", approach, "--fault", "none", "--work", "0ms", "--jobs", JOBS,
        ]);
        let a: &Value = &verdict["approaches"][0];
        assert_eq!(a["duplicates"], 0, "{a}");
        assert_eq!(a["lost_updates"], 0, "{a}");
        let lab = a["jobs_per_s"].as_f64().unwrap_or(0.0);
        let tps = pgbench.as_ref().map(|pgbench| {
            db.batch_execute(SETUP).unwrap();
            let file = tempfile::NamedTempFile::new().unwrap();
            std::fs::write(file.path(), script(approach)).unwrap();
            pgbench_tps(pgbench, &url, file.path())
        });
        println!(
            "  {approach:<18} {lab:>8.0} {:>8.1} {:>8} {:>10}   {}",
            a["round_trips_per_job"].as_f64().unwrap_or(0.0),
            a["retries"].as_u64().unwrap_or(0),
            tps.map_or("-".into(), |t| format!("{t:.0}")),
            tps.map_or(String::new(), |t| format!("lab / pgbench = {:.2}", lab / t)),
        );
    }
    db.batch_execute("DROP TABLE IF EXISTS bench_customers, bench_invoices")
        .unwrap();
}

fn find_pgbench() -> Option<PathBuf> {
    if Command::new("pgbench").arg("--version").output().is_ok() {
        return Some("pgbench".into());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|dir| dir.path().join("bin/pgbench"))
        .filter(|path| path.exists())
        .collect();
    found.sort();
    found.pop()
}

/// pgbench's `tps = …` for `script`, 10 clients on 2 threads, no vacuum.
fn pgbench_tps(pgbench: &Path, url: &str, script: &Path) -> f64 {
    let output = Command::new(pgbench)
        .args([
            "-c",
            "10",
            "-j",
            "2",
            "-n",
            "-M",
            "prepared",
            "-T",
            PGBENCH_SECONDS,
        ])
        .arg("-f")
        .arg(script)
        .arg(url)
        .output()
        .expect("running pgbench");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out.lines()
        .find_map(|line| {
            let rest = line.trim().strip_prefix("tps = ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no tps in pgbench's output:\n{out}"))
}
