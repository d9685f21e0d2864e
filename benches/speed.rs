//! Speed where people wait (issue 46): `cargo bench --bench speed [-- PART…]`, PART one of
//! `lease-guard`, `chaos`, `matrix` (default: the first two; `matrix` takes minutes).
//!
//! Each part prints what it measured beside its target, and where the time went; nothing
//! is asserted (the machine is shared, and a timing is not a lesson):
//!
//! - `lease-guard`: the default run (64 cells), wall time, target ≤ 30 s; the same run one
//!   cell at a time (`--parallel 1`) as its peer, and whether the two tables agree cell by
//!   cell. Where a cell's time goes, from its events: start-up (the cell's heading to A at
//!   work: two processes, their connections, the lock), the fault (A at work to B's write:
//!   mostly A's lease running out), and the wind-down (A's guard, A's write, both let go,
//!   the store read back).
//! - `chaos`: schedules a minute on the safe `redis-fenced`, at the default parallelism
//!   (target ≥ 100) and at the old default of 4, 24 schedules, seed 1.
//! - `matrix`: the default matrix (150 cells, 8 schedules a cell), seed 1, wall time, target
//!   ≤ 6 min; where it went: the schedules' own time summed (how many lanes it kept busy),
//!   and the share of it spent starting clients.
//!
//! The proxy's ratio at 50 clients is `cargo bench --bench proxy`'s. The "before" of each
//! part is its peer in the same run (one cell at a time; the old parallelism of 4).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn main() {
    servers(); // the store's Postgres and etcd, started once, outside the timings below
    let parts: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wants = |part: &str| match parts.is_empty() {
        true => part != "matrix",
        false => parts.iter().any(|p| p == part),
    };
    let measures: [(&str, fn()); 3] = [
        ("lease-guard", lease_guard),
        ("chaos", chaos),
        ("matrix", matrix),
    ];
    for (part, measure) in measures {
        if wants(part) {
            measure();
        }
    }
}

/// `lockslab ARGS --json`, on this bench's servers (or on its own, for chaos and the
/// matrix: they start a Redis per lane as a learner's run does): its wall time and lines.
fn timed(args: &[&str], own_redis: bool) -> (Duration, String) {
    let mut command: Command = lockslab(args);
    command.arg("--json");
    if own_redis {
        command.env_remove("LOCKSLAB_REDIS_URL");
    }
    let started = Instant::now();
    let output = command.output().expect("running lockslab");
    let took = started.elapsed();
    assert!(
        matches!(output.status.code(), Some(0 | 1 | 3)),
        "lockslab {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    (took, String::from_utf8_lossy(&output.stdout).into_owned())
}

fn lease_guard() {
    println!("lease-guard, the default 8 guards × 8 faults:");
    let mut tables = Vec::new();
    for (name, args) in [
        ("default", vec!["lease-guard"]),
        ("--parallel 1", vec!["lease-guard", "--parallel", "1"]),
    ] {
        let (took, stdout) = timed(&args, false);
        let (events, verdict) = events_and_verdict(&stdout);
        let target = match name {
            "default" => "  (target ≤ 30 s)",
            _ => "  (one cell at a time, the peer)",
        };
        println!("  {name:<13} {:>6.1} s{target}", took.as_secs_f64());
        where_cells_wait(&events, took);
        tables.push(outcomes(&verdict));
    }
    let differ: Vec<&String> = (tables[0].iter())
        .filter(|(cell, outcome)| tables[1].get(*cell) != Some(outcome))
        .map(|(cell, _)| cell)
        .collect();
    println!(
        "  cells whose outcome differs between the two: {} {differ:?} (target: none)",
        differ.len()
    );
}

/// Each cell's outcome, by `guard × fault`.
fn outcomes(verdict: &Value) -> BTreeMap<String, String> {
    (verdict["cells"].as_array().into_iter().flatten())
        .map(|cell| {
            (
                format!("{} × {}", cell["guard"], cell["fault"]).replace('"', ""),
                cell["outcome"].to_string(),
            )
        })
        .collect()
}

/// Where the cells' time went, summed over the cells, from their events.
fn where_cells_wait(events: &[Event], wall: Duration) {
    let mut cells: BTreeMap<(String, String), Vec<&Event>> = BTreeMap::new();
    for event in events {
        if let (Some(fault), Some(guard)) = (&event.part.scenario, &event.part.variant) {
            cells
                .entry((fault.clone(), guard.clone()))
                .or_default()
                .push(event);
        }
    }
    let (mut start_up, mut fault, mut wind_down) = (0u64, 0u64, 0u64);
    for cell in cells.values() {
        let first = cell.iter().map(|e| e.t_ms).min().unwrap_or(0);
        let last = cell.iter().map(|e| e.t_ms).max().unwrap_or(first);
        let at = |worker: &str, kinds: &[Kind]| {
            (cell.iter())
                .find(|e| e.worker == worker && kinds.contains(&e.kind()))
                .map(|e| e.t_ms)
        };
        let working = at("A", &[Kind::Working]).unwrap_or(first);
        let b_done = at("B", &[Kind::Wrote, Kind::GaveUp]).unwrap_or(working);
        start_up += working - first;
        fault += b_done.saturating_sub(working);
        wind_down += last.saturating_sub(b_done.max(working));
    }
    let total = (start_up + fault + wind_down).max(1);
    let share = |ms: u64| 100.0 * ms as f64 / total as f64;
    println!(
        "                {} cells, {:.1} s of cell time ({:.1} cells at once): start-up {:.0} %, \
         the fault (A at work until B wrote: mostly A's lease) {:.0} %, wind-down {:.0} %",
        cells.len(),
        total as f64 / 1000.0,
        total as f64 / 1000.0 / wall.as_secs_f64(),
        share(start_up),
        share(fault),
        share(wind_down)
    );
}

fn chaos() {
    println!("chaos, schedules a minute, redis-fenced (safe), 24 schedules, seed 1:");
    for (name, parallel) in [("default", None), ("--parallel 4", Some("4"))] {
        let mut args = vec![
            "chaos",
            "--design",
            "redis-fenced",
            "--schedules",
            "24",
            "--seed",
            "1",
        ];
        args.extend(parallel.map(|p| ["--parallel", p]).into_iter().flatten());
        let (_, stdout) = timed(&args, true);
        let verdict: Value = (stdout.lines().rev())
            .find_map(|line| serde_json::from_str(line).ok())
            .expect("a verdict");
        let per_minute =
            verdict["schedules"].as_f64().unwrap() * 60.0 / verdict["seconds"].as_f64().unwrap();
        let target = match parallel {
            None => "(target ≥ 100)",
            Some(_) => "(the old default)",
        };
        println!("  {name:<13} {per_minute:>6.1} a minute {target}");
    }
}

fn matrix() {
    println!("matrix, the default (every design × every fault, 8 schedules a cell), seed 1:");
    let (took, stdout) = timed(&["matrix", "--seed", "1"], true);
    let verdict: Value = (stdout.lines().rev())
        .find_map(|line| serde_json::from_str::<Value>(line).ok())
        .expect("a verdict");
    let cells = stdout
        .lines()
        .filter(|l| l.contains("\"kind\":\"cell\""))
        .count();
    println!(
        "  default       {:>6.1} s = {:.1} min (target ≤ 6 min), {cells} cells",
        took.as_secs_f64(),
        took.as_secs_f64() / 60.0
    );
    let (Some(played), Some(busy), Some(start_up)) = (
        verdict["schedules_played"].as_u64(),
        verdict["schedule_seconds"].as_f64(),
        verdict["startup_seconds"].as_f64(),
    ) else {
        println!("  (this build's verdict does not say where the time went)");
        return;
    };
    println!(
        "                {played} schedules, {busy:.0} s of schedule time ({:.1} lanes busy of \
         {}): start-up {:.0} %, the clients' work and the faults {:.0} %",
        busy / took.as_secs_f64(),
        verdict["parallel"],
        100.0 * start_up / busy.max(1e-9),
        100.0 * (busy - start_up) / busy.max(1e-9)
    );
}
