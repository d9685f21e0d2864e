//! The verdicts at the edge, where they used to contradict their own evidence:
//! `cargo bench --bench verdict_sweep`.
//!
//! Runs lab 1 with pauses spread from 0.8× to 1.2× the TTL, each with and without fencing,
//! and lab 4's freeze with the same spread around a 2s Redis TTL, etcd lease and Postgres
//! idle timeout — 50 runs each by default (`LOCKSLAB_SWEEP_RUNS` to change). Every verdict
//! is checked against the store's own record that the same JSON carries (the attempts, in
//! decision order), the releases the workers reported, and the timeline's store lines. It
//! prints how the outcomes split per pause and the number of verdicts that disagree with
//! the record — which must be 0. Not a test: it takes minutes, and the outcome mix depends
//! on the machine's timing. `LOCKSLAB_SWEEP_LABS=gc-pause` (or `etcd-vs-redis`) runs one.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;

use common::*;

const TTL_MS: u64 = 1000;

fn main() {
    let runs: usize = std::env::var("LOCKSLAB_SWEEP_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    let labs = std::env::var("LOCKSLAB_SWEEP_LABS").unwrap_or_default();
    servers();
    let mut disagreements = 0;
    if labs.is_empty() || labs.contains("gc-pause") {
        disagreements += sweep_gc_pause(runs);
    }
    if labs.is_empty() || labs.contains("etcd-vs-redis") {
        disagreements += sweep_etcd_vs_redis(runs);
    }
    println!("verdicts that disagree with the store's record, in all: {disagreements}");
}

/// The `runs` pauses, spread evenly from 0.8× to 1.2× `ttl_ms`.
fn pauses(ttl_ms: u64, runs: usize) -> impl Iterator<Item = u64> {
    (0..runs)
        .map(move |i| ttl_ms * 8 / 10 + (ttl_ms * 4 / 10) * i as u64 / (runs.max(2) - 1) as u64)
}

fn sweep_gc_pause(runs: usize) -> usize {
    println!(
        "lockslab gc-pause --ttl {TTL_MS}ms, {runs} runs with pauses from {}ms to {}ms, both fencings:",
        TTL_MS * 8 / 10,
        TTL_MS * 12 / 10
    );
    let mut outcomes = Outcomes::default();
    let mut disagreements = Vec::new();
    for pause in pauses(TTL_MS, runs) {
        let (lines, verdict, _) = run_json(&[
            "gc-pause",
            "--ttl",
            &format!("{TTL_MS}ms"),
            "--pause",
            &format!("{pause}ms"),
        ]);
        for run in verdict["runs"].as_array().expect("runs") {
            outcomes.count(
                pause,
                format!(
                    "{} two holders {} · late write {}",
                    if run["fencing"] == true {
                        "fenced  "
                    } else {
                        "unfenced"
                    },
                    run["two_holders"],
                    run["late_write"].as_str().unwrap_or("?")
                ),
            );
            for problem in gc_pause_disagreements(run) {
                disagreements.push(format!("pause {pause}ms: {problem}\n    {run}"));
            }
        }
        // The lab's checker, judging the history again, reaches the verdict it printed.
        let replayed = lockslab::labs::gc_pause::replay(&lines, &verdict);
        if !replayed.is_ok_and(|r| lockslab::reproduce::compare::compare(&r).agrees()) {
            disagreements.push(format!(
                "pause {pause}ms: the history does not replay to its verdict"
            ));
        }
    }
    outcomes.print();
    report_disagreements(&disagreements)
}

fn sweep_etcd_vs_redis(runs: usize) -> usize {
    println!(
        "lockslab etcd-vs-redis --freeze, Redis TTL = lease = Postgres idle timeout = {TTL_MS}ms × 2, \
         {runs} runs with pauses from 0.8× to 1.2× that:"
    );
    let edge = TTL_MS * 2;
    let mut outcomes = Outcomes::default();
    let mut disagreements = Vec::new();
    for pause in pauses(edge, runs) {
        let (lines, verdict, _) = run_json(&[
            "etcd-vs-redis",
            "--freeze",
            "--work",
            "600ms",
            "--redis-ttl",
            &format!("{edge}ms"),
            "--lease",
            &format!("{edge}ms"),
            "--pg-timeout",
            &format!("{edge}ms"),
            "--pause",
            &format!("{pause}ms"),
        ]);
        for cell in verdict["cells"].as_array().expect("cells") {
            outcomes.count(
                pause,
                format!(
                    "{:<8} two holders {} · late write {}",
                    cell["backend"].as_str().unwrap_or("?"),
                    cell["two_holders"],
                    cell["late_write"].as_str().unwrap_or("?")
                ),
            );
            for problem in etcd_vs_redis_disagreements(cell, &lines) {
                disagreements.push(format!("pause {pause}ms: {problem}\n    {cell}"));
            }
        }
    }
    outcomes.print();
    report_disagreements(&disagreements)
}

/// How the outcomes split, per 100ms of pause.
#[derive(Default)]
struct Outcomes(BTreeMap<(u64, String), usize>);

impl Outcomes {
    fn count(&mut self, pause: u64, outcome: String) {
        *self.0.entry((pause / 100 * 100, outcome)).or_default() += 1;
    }

    fn print(&self) {
        let mut last_bucket = None;
        for ((bucket, outcome), count) in &self.0 {
            if last_bucket != Some(*bucket) {
                println!("  pause {bucket}–{}ms", bucket + 99);
                last_bucket = Some(*bucket);
            }
            println!("    {count:>3} × {outcome}");
        }
    }
}

fn report_disagreements(disagreements: &[String]) -> usize {
    println!(
        "  verdicts that disagree with the store's record: {}",
        disagreements.len()
    );
    for problem in disagreements {
        println!("    {problem}");
    }
    disagreements.len()
}
