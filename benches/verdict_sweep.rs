//! The verdicts at the edge, where they used to contradict their own evidence:
//! `cargo bench --bench verdict_sweep`.
//!
//! Runs lab 1 with pauses spread from 0.8× to 1.2× the TTL (50 runs by default,
//! `LOCKSLAB_SWEEP_RUNS` to change), each with and without fencing, and checks every verdict
//! against the store's own record that the same JSON carries (the attempts, in decision
//! order) and against the timeline's store line. It prints how the outcomes split per pause
//! and the number of verdicts that disagree with the record — which must be 0. Not a test:
//! it takes minutes, and the outcome mix depends on the machine's timing.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;

use serde_json::Value;

use common::*;

const TTL_MS: u64 = 1000;

fn main() {
    let runs: usize = std::env::var("LOCKSLAB_SWEEP_RUNS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50);
    servers();
    println!(
        "lockslab gc-pause --ttl {TTL_MS}ms, {runs} runs with pauses from {}ms to {}ms, both fencings:",
        TTL_MS * 8 / 10,
        TTL_MS * 12 / 10
    );
    let mut outcomes: BTreeMap<(u64, String), usize> = BTreeMap::new();
    let mut disagreements = Vec::new();
    for i in 0..runs {
        let pause = TTL_MS * 8 / 10 + (TTL_MS * 4 / 10) * i as u64 / (runs.max(2) - 1) as u64;
        let (lines, verdict, _) = run_json(&[
            "gc-pause",
            "--ttl",
            &format!("{TTL_MS}ms"),
            "--pause",
            &format!("{pause}ms"),
        ]);
        for run in verdict["runs"].as_array().expect("runs") {
            let bucket = pause / 50 * 50;
            let outcome = format!(
                "{} two holders {} · late write {}",
                if run["fencing"] == true {
                    "fenced  "
                } else {
                    "unfenced"
                },
                run["two_holders"],
                run["late_write"].as_str().unwrap_or("?")
            );
            *outcomes.entry((bucket, outcome)).or_default() += 1;
            let store_lines: Vec<&Value> = lines
                .iter()
                .filter(|e| e["worker"] == "store" && e["fencing"] == run["fencing"])
                .collect();
            for problem in gc_pause_disagreements(run, &store_lines) {
                disagreements.push(format!("pause {pause}ms: {problem}\n    {run}"));
            }
        }
    }
    let mut last_bucket = None;
    for ((bucket, outcome), count) in &outcomes {
        if last_bucket != Some(*bucket) {
            println!("  pause {bucket}–{}ms", bucket + 49);
            last_bucket = Some(*bucket);
        }
        println!("    {count:>3} × {outcome}");
    }
    println!(
        "verdicts that disagree with the store's record: {}",
        disagreements.len()
    );
    for problem in &disagreements {
        println!("  {problem}");
    }
}
