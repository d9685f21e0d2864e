//! `lockslab chaos`'s speed: `cargo bench --bench chaos`.
//!
//! (a) Schedules a minute against a design the labs call safe (nothing stops the hunt early),
//! one at a time and side by side, with the median schedule's wall time and the part of it
//! spent starting the clients (process start-up, connections, first lock). (b) For every
//! design the labs call unsafe, the time to its first violation, over several seeds.
//! Targets (issue 25): ≥ 100 schedules a minute; a violation in a median < 30 s. Chaos
//! starts its own Redis, one per lane, as a learner's run does. Printed, not asserted: the
//! machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

const SCHEDULES: &str = "24";
const SEEDS: [&str; 5] = ["1", "2", "3", "4", "5"];

fn main() {
    servers(); // the store's Postgres and etcd, started once, outside the timings below
    println!("schedules a minute, redis-fenced (safe), {SCHEDULES} schedules, seed 1:");
    for parallel in ["1", "4", "6"] {
        let lines = chaos(&[
            "--design",
            "redis-fenced",
            "--schedules",
            SCHEDULES,
            "--seed",
            "1",
            "--parallel",
            parallel,
        ]);
        let verdict = lines.last().expect("a verdict");
        let per_minute =
            verdict["schedules"].as_f64().unwrap() * 60.0 / verdict["seconds"].as_f64().unwrap();
        let median = |field: &str| {
            let mut all: Vec<u64> = schedules(&lines)
                .filter_map(|s| s[field].as_u64())
                .collect();
            all.sort_unstable();
            all.get(all.len() / 2).copied().unwrap_or(0)
        };
        println!(
            "  --parallel {parallel}  {per_minute:>6.1} a minute (target ≥ 100)  \
             median schedule {} ms, of which start-up {} ms",
            median("ms"),
            median("startup_ms")
        );
    }

    println!("time to the first violation, {} seeds each:", SEEDS.len());
    for design in [
        "redis-lock",
        "redis-renewed",
        "fenced-write-only",
        "etcd-lease",
    ] {
        let mut found = Vec::new();
        let mut missed = 0;
        for seed in SEEDS {
            let lines = chaos(&[
                "--design",
                design,
                "--schedules",
                "400",
                "--seed",
                seed,
                "--no-shrink",
            ]);
            match lines
                .last()
                .and_then(|v| v["first_violation_after_s"].as_f64())
            {
                Some(seconds) => found.push(seconds),
                None => missed += 1,
            }
        }
        found.sort_by(f64::total_cmp);
        let median = found.get(found.len() / 2).copied().unwrap_or(f64::NAN);
        println!(
            "  {design:<18} median {median:>6.1} s (target < 30 s)  all: {}{}",
            found
                .iter()
                .map(|s| format!("{s:.1}"))
                .collect::<Vec<_>>()
                .join(" "),
            if missed > 0 {
                format!("  ({missed} seed(s) found none in 400)")
            } else {
                String::new()
            }
        );
    }
}

/// `lockslab chaos … --json` with its own Redis lanes (no `LOCKSLAB_REDIS_URL`): its lines.
fn chaos(args: &[&str]) -> Vec<Value> {
    let mut command: Command = lockslab(&["chaos"]);
    command
        .args(args)
        .arg("--json")
        .env_remove("LOCKSLAB_REDIS_URL");
    let output = command.output().expect("running lockslab chaos");
    let code = output.status.code();
    assert!(
        matches!(code, Some(0 | 1 | 3)),
        "chaos {args:?} ended with {code:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect()
}

fn schedules(lines: &[Value]) -> impl Iterator<Item = &Value> {
    lines.iter().filter(|line| line["kind"] == "schedule")
}
