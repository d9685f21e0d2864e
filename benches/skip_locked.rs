//! Lab 3's speed against a real Postgres: `cargo bench --bench skip_locked`.
//!
//! With no simulated work, 10 workers in skip-locked mode (target: at least 1,000 jobs/s),
//! next to what `pgbench` gets from the same server in the same run, with 10 clients:
//! - a custom script with the queue's own statements (claim with SKIP LOCKED, record,
//!   mark done, commit), run right after each of the lab's rounds on a fresh queue of the
//!   same jobs (10 clients, a tenth each), so that each round's ratio says how close the
//!   lab's workers get to what Postgres can do with this very work under the same load
//!   (the machine is shared, and its load moves within a minute);
//! - its built-in TPC-B-like transaction, and its simple-update variant (at scale 1,
//!   TPC-B-like has every client update the same branches row: a contention test).
//!
//! Then the figures the tests used to assert and no longer do, because they are timings:
//! each mode's jobs/s under `--compare` (for-update should be the slowest: its workers take
//! turns behind one row lock) and how long after the kill the killed worker's job was
//! claimed again (milliseconds: Postgres's rollback, no TTL).
//!
//! Figures are printed, not asserted: the machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "support/pgbench.rs"]
mod pgbench;

use std::path::Path;

use common::*;
use serde_json::Value;

const ROUNDS: usize = 3;
const JOBS: &str = "5000";
const PGBENCH_SECONDS: &str = "5";

/// The queue's statements for pgbench, as the lab's worker sends them for one job
/// (`src/queue.rs`): BEGIN, claim with SKIP LOCKED in the round (CLAIM_SKIP_LOCKED), record
/// with the claim's time (RECORD), mark done (MARK_DONE), COMMIT.
const QUEUE_SCRIPT: &str = "\
BEGIN;
WITH claimed AS (SELECT id FROM bench_jobs WHERE round = 1 AND status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) SELECT id, clock_timestamp() AS at FROM claimed \\gset
INSERT INTO bench_processing (job_id, worker, claimed_at) VALUES (:id, 'pgbench', :at);
UPDATE bench_jobs SET status = 'done', claimed_by = 'pgbench' WHERE id = :id;
COMMIT;
";

fn main() {
    let url = servers().postgres.clone();
    let pgbench = pgbench::find();

    println!(
        "lockslab skip-locked --fault none --work 0ms --jobs {JOBS} (10 workers), {ROUNDS} rounds, \
         each followed by pgbench -c 10 -j 2 -M prepared doing the same {JOBS} jobs with the \
         queue's statements (claim, record, mark done), so that a change in the machine's load \
         reaches both sides of each round's ratio:"
    );
    let mut rates = Vec::new();
    let mut queue_rates = Vec::new();
    let mut ratios = Vec::new();
    let mut duplicates = 0;
    for _ in 0..ROUNDS {
        let verdict = verdict_of(&[
            "skip-locked",
            "--fault",
            "none",
            "--work",
            "0ms",
            "--jobs",
            JOBS,
            "--json",
        ]);
        let mode = &verdict["modes"][0];
        assert_eq!(mode["duplicates"], 0);
        assert_eq!(mode["lost"], 0);
        let rate = mode["jobs_per_s"].as_f64().unwrap();
        rates.push(rate);
        if let Some(pgbench) = &pgbench {
            let (tps, twice) = queue_tps(pgbench, &url);
            queue_rates.push(tps);
            ratios.push(rate / tps);
            duplicates += twice;
        }
    }
    let lab = median(&mut rates.clone());
    println!(
        "  jobs/s        {}   (target ≥ 1000: {})",
        spread(&mut rates, 0),
        if lab >= 1000.0 { "met" } else { "NOT met" }
    );
    if pgbench.is_some() {
        println!(
            "  pgbench tps   {}   (the queue's statements; duplicates: {duplicates})",
            spread(&mut queue_rates, 0)
        );
        println!(
            "  lab / pgbench {}   (each round's ratio)",
            spread(&mut ratios, 2)
        );
    }

    compare_modes();

    let Some(pgbench) = pgbench else {
        println!("pgbench not found (PATH, /usr/lib/postgresql/*/bin): no comparison");
        return;
    };
    println!(
        "pgbench's built-in scripts on the same server, -c 10 -j 2 -T {PGBENCH_SECONDS} (beside \
         the lab's median, measured earlier):"
    );
    let init = pgbench::command(&pgbench, &url, &["-i", "-q", "-s", "1"]).output();
    assert!(
        init.is_ok_and(|out| out.status.success()),
        "pgbench -i failed"
    );
    for (name, builtin, note) in [
        (
            "built-in tpcb-like",
            "tpcb-like",
            "every transaction updates the one branches row of scale 1: a contention test",
        ),
        (
            "built-in simple-update",
            "simple-update",
            "the same without the branches and tellers updates",
        ),
    ] {
        let rate = pgbench_tps(&pgbench, &url, &["-b", builtin]);
        println!(
            "  {name:<24} tps {rate:>8.0}   lab / pgbench = {:.2}   ({note})",
            lab / rate
        );
    }
    let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
    db.batch_execute(
        "DROP TABLE IF EXISTS bench_jobs, bench_processing, pgbench_accounts, pgbench_branches, \
         pgbench_history, pgbench_tellers",
    )
    .unwrap();
}

/// pgbench on the queue's statements, on a fresh, vacuumed queue of the lab's size: its tps, and how many jobs
/// it processed more than once.
fn queue_tps(pgbench: &Path, url: &str) -> (f64, i64) {
    let mut db = postgres::Client::connect(url, postgres::NoTls).unwrap();
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS bench_jobs, bench_processing;
         CREATE TABLE bench_jobs (id bigint PRIMARY KEY, round int NOT NULL DEFAULT 1,
                                  status text NOT NULL DEFAULT 'pending', claimed_by text);
         CREATE INDEX ON bench_jobs (round, id) WHERE status = 'pending';
         CREATE TABLE bench_processing (job_id bigint NOT NULL, worker text NOT NULL,
                                        claimed_at timestamptz NOT NULL,
                                        done_at timestamptz NOT NULL DEFAULT clock_timestamp());
         INSERT INTO bench_jobs (id) SELECT generate_series(1, {JOBS});",
    ))
    .unwrap();
    db.batch_execute("VACUUM ANALYZE bench_jobs").unwrap();
    let script = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(script.path(), QUEUE_SCRIPT).unwrap();
    // As many jobs as the lab's round, each of the 10 clients a tenth of them: every claim
    // finds a job, and the index the claims walk is as long as the lab's.
    let per_client = (JOBS.parse::<u32>().unwrap() / 10).to_string();
    let tps = pgbench::tps(&mut pgbench::command(
        pgbench,
        url,
        &[
            "-c",
            "10",
            "-j",
            "2",
            "-n",
            "-t",
            &per_client,
            "-M",
            "prepared",
            "-f",
            script.path().to_str().unwrap(),
        ],
    ));
    let duplicates: i64 = db
        .query_one(
            "SELECT count(*) FROM (SELECT job_id FROM bench_processing GROUP BY job_id HAVING count(*) > 1) d",
            &[],
        )
        .unwrap()
        .get(0);
    (tps, duplicates)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `min … median … max` of some figures, with `decimals` digits after the point.
fn spread(values: &mut [f64], decimals: usize) -> String {
    let middle = median(values);
    format!(
        "min {:>8.decimals$}  median {:>8.decimals$}  max {:>8.decimals$}",
        values[0],
        middle,
        values[values.len() - 1]
    )
}

fn compare_modes() {
    println!("lockslab skip-locked --compare --jobs 200 --pause 300ms, {ROUNDS} rounds:");
    let mut figures: Vec<(String, Vec<f64>, Vec<f64>)> = Vec::new();
    let mut for_update_slowest = 0;
    for _ in 0..ROUNDS {
        let verdict = verdict_of(&[
            "skip-locked",
            "--compare",
            "--jobs",
            "200",
            "--pause",
            "300ms",
            "--json",
        ]);
        let modes = verdict["modes"].as_array().unwrap();
        let rate = |m: &Value| m["jobs_per_s"].as_f64().unwrap_or(0.0);
        let slowest = modes.iter().min_by(|a, b| rate(a).total_cmp(&rate(b)));
        if slowest.is_some_and(|m| m["mode"] == "for-update") {
            for_update_slowest += 1;
        }
        for m in modes {
            let name = m["mode"].as_str().unwrap().to_string();
            let at = match figures.iter().position(|(n, ..)| *n == name) {
                Some(at) => at,
                None => {
                    figures.push((name, Vec::new(), Vec::new()));
                    figures.len() - 1
                }
            };
            figures[at].1.push(rate(m));
            if let Some(ms) = m["reclaim_ms"].as_f64() {
                figures[at].2.push(ms);
            }
        }
    }
    let spread = |values: &mut Vec<f64>, unit: &str| {
        if values.is_empty() {
            return "never".to_string();
        }
        values.sort_by(f64::total_cmp);
        format!(
            "{:.1}{unit} / {:.1}{unit} / {:.1}{unit}",
            values[0],
            values[values.len() / 2],
            values[values.len() - 1]
        )
    };
    for (name, rates, reclaims) in &mut figures {
        println!(
            "  {name:<12} jobs/s {:<28} kill → reclaimed {}",
            spread(rates, ""),
            spread(reclaims, "ms")
        );
    }
    println!("  for-update the slowest in {for_update_slowest} of {ROUNDS} runs");
}

/// Runs the lab with `args` (which include --json) and returns its verdict line.
fn verdict_of(args: &[&str]) -> Value {
    let output = lockslab(args).output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

/// pgbench with the lab's shape (10 clients, 2 threads, no vacuum, PGBENCH_SECONDS long)
/// plus `what` to run: its transactions per second.
fn pgbench_tps(pgbench: &Path, url: &str, what: &[&str]) -> f64 {
    let mut args = vec!["-c", "10", "-j", "2", "-n", "-T", PGBENCH_SECONDS];
    args.extend(what);
    pgbench::tps(&mut pgbench::command(pgbench, url, &args))
}
