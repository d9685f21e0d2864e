//! `lockslab chaos`'s speed and its shrinking: `cargo bench --bench chaos [-- PART…]`,
//! PART one of `speed`, `hunt`, `shrink`, `safe` (default: the first three; `safe` is long).
//!
//! (a) Schedules a minute against a design the labs call safe (nothing stops the hunt early),
//! one at a time and side by side, with the median schedule's wall time and the part of it
//! spent starting the clients (process start-up, connections, first lock). (b) For every
//! design the labs call unsafe, the time to its first violation, over several seeds.
//! (c) For every design the labs call unsafe, over several seeds: the first violation shrunk
//! (default `--replays 3`), how many faults are left, and that schedule replayed 10 times —
//! how many of the 10 break the design. (d) For the designs the labs call safe (or those in
//! `CHAOS_BENCH_SAFE`, comma-separated), `CHAOS_BENCH_SCHEDULES` (1000) schedules each:
//! violations and unknowns. `CHAOS_BENCH_UNSAFE` names the designs of (b) and (c).
//! Targets (issue 25): ≥ 100 schedules a minute; a violation in a median < 30 s; ≥ 90 % of
//! shrunk schedules with ≤ 2 faults; a shrunk schedule replayed 10 times fails ≥ 8 times;
//! 0 violations in 1,000 schedules of a safe design. Chaos starts its own Redis, one per
//! lane, as a learner's run does. Printed, not asserted: the machine is shared.
//! `CHAOS_BENCH_BIN=path/to/lockslab` measures another build (e.g. main's, for a before).

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::*;
use serde_json::Value;

const SCHEDULES: &str = "24";
const SEEDS: [&str; 5] = ["1", "2", "3", "4", "5"];
const UNSAFE: [&str; 5] = [
    "redis-lock",
    "redis-renewed",
    "fenced-write-only",
    "etcd-lease",
    "redlock",
];
const SAFE: [&str; 10] = [
    "redis-fenced",
    "redis-durable-token",
    "redlock-fenced",
    "etcd-fenced",
    "advisory-xact",
    "advisory-session",
    "skip-locked",
    "optimistic",
    "idempotency-key",
    "partitioned",
];

fn main() {
    servers(); // the store's Postgres and etcd, started once, outside the timings below
    let parts: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |part: &str| {
        if parts.is_empty() {
            part != "safe"
        } else {
            parts.iter().any(|p| p == part)
        }
    };
    if wants("speed") {
        speed();
    }
    if wants("hunt") {
        hunt();
    }
    if wants("shrink") {
        shrink();
    }
    if wants("safe") {
        safe();
    }
}

fn speed() {
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
}

fn hunt() {
    println!("time to the first violation, {} seeds each:", SEEDS.len());
    for design in designs("CHAOS_BENCH_UNSAFE", &UNSAFE) {
        let design = design.as_str();
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

/// (c): each unsafe design's first violation, shrunk, then its replay 10 times.
fn shrink() {
    let seeds = ["1", "2", "3"];
    println!(
        "shrunk counterexamples ({} seeds each), each replayed 10 times:",
        seeds.len()
    );
    let (mut shrunk, mut small, mut steady) = (0, 0, 0);
    for design in designs("CHAOS_BENCH_UNSAFE", &UNSAFE) {
        let design = design.as_str();
        for seed in seeds {
            let lines = chaos(&["--design", design, "--schedules", "400", "--seed", seed]);
            let verdict = lines.last().expect("a verdict");
            let Some(schedule) = verdict["shrunk"].as_array() else {
                println!("  {design:<18} seed {seed}: no violation in 400 schedules");
                continue;
            };
            let clients = verdict["clients"].as_u64().unwrap_or(3).to_string();
            let json = serde_json::to_string(schedule).unwrap();
            let replays = chaos(&[
                "--design",
                design,
                "--clients",
                &clients,
                "--schedule",
                &json,
                "--schedules",
                "10",
            ]);
            let failed = schedules(&replays)
                .filter(|s| s["result"] == "unsafe")
                .count();
            shrunk += 1;
            small += usize::from(schedule.len() <= 2);
            steady += usize::from(failed >= 8);
            println!(
                "  {design:<18} seed {seed}: {} fault(s), {clients} clients, replayed: \
                 {failed}/10 unsafe  {json}",
                schedule.len()
            );
        }
    }
    let share = |n: usize| 100.0 * n as f64 / shrunk.max(1) as f64;
    println!(
        "  {small}/{shrunk} shrunk to ≤ 2 faults ({:.0} %, target ≥ 90 %); \
         {steady}/{shrunk} replayed ≥ 8/10 ({:.0} %, target: every one)",
        share(small),
        share(steady)
    );
}

/// (d): the safe designs, many schedules each, every fault kind.
fn safe() {
    let n = std::env::var("CHAOS_BENCH_SCHEDULES").unwrap_or_else(|_| "1000".into());
    let designs = designs("CHAOS_BENCH_SAFE", &SAFE);
    println!("safe designs, {n} schedules each, every fault kind, seed 1:");
    for design in &designs {
        let lines = chaos(&["--design", design, "--schedules", &n, "--seed", "1"]);
        let verdict = lines.last().expect("a verdict");
        println!(
            "  {design:<20} {} schedules: {} unsafe, {} unknown, {:.0} s",
            verdict["schedules"],
            verdict["unsafe"],
            verdict["inconclusive"],
            verdict["seconds"].as_f64().unwrap_or(0.0)
        );
    }
}

/// The designs named in the environment variable `var` (comma-separated), else `all`.
fn designs(var: &str, all: &[&str]) -> Vec<String> {
    match std::env::var(var) {
        Ok(list) => list.split(',').map(String::from).collect(),
        Err(_) => all.iter().map(|d| d.to_string()).collect(),
    }
}

/// `lockslab chaos … --json` with its own Redis lanes (no `LOCKSLAB_REDIS_URL`): its lines.
fn chaos(args: &[&str]) -> Vec<Value> {
    let mut command: Command = lockslab(&["chaos"]);
    if let Ok(bin) = std::env::var("CHAOS_BENCH_BIN") {
        let mut other = Command::new(bin);
        other.args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => other.env(key, value),
                None => other.env_remove(key),
            };
        }
        command = other;
    }
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
