//! Lab 4's speed, measured against real servers: `cargo bench --bench etcd_vs_redis`.
//!
//! Runs `lockslab etcd-vs-redis` with defaults (kill, then freeze; Redis TTL 6s, etcd lease
//! 2s, work 2s, pause 7s) a few times with the servers already up, and prints the wall time
//! (target: under 40s) and each cell's measured handover. Figures are printed, not asserted:
//! the machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;

const ROUNDS: usize = 3;

fn main() {
    servers(); // started once, outside the timings
    println!("lockslab etcd-vs-redis (defaults, both scenarios), {ROUNDS} rounds:");
    let mut walls = Vec::new();
    let mut handovers: BTreeMap<String, Vec<Option<u64>>> = BTreeMap::new();
    for _ in 0..ROUNDS {
        let (wall, _, verdict) = timed_json(&["etcd-vs-redis"]);
        walls.push(wall);
        for cell in verdict["cells"].as_array().unwrap() {
            handovers
                .entry(format!(
                    "{}/{}",
                    cell["backend"].as_str().unwrap(),
                    cell["scenario"].as_str().unwrap()
                ))
                .or_default()
                .push(cell["handover_ms"].as_u64());
        }
    }
    walls.sort();
    let secs = |d: Duration| d.as_secs_f64();
    println!(
        "  wall clock (target < 40s)    min {:>6.2}s  median {:>6.2}s  max {:>6.2}s",
        secs(walls[0]),
        secs(walls[walls.len() / 2]),
        secs(walls[walls.len() - 1])
    );
    println!("  handover per cell (ms, each round):");
    for (cell, times) in handovers {
        let times: Vec<String> = times
            .iter()
            .map(|t| t.map(|ms| ms.to_string()).unwrap_or("nobody".into()))
            .collect();
        println!("    {cell:<18} {}", times.join("  "));
    }
}
