//! Lab 5's speed: `cargo bench --bench failover`.
//!
//! Reports (a) how long lockslab's private clusters take to be ready together — Redis
//! primary + replica + 3 Sentinels (replica in sync, every Sentinel knowing the replica and
//! both peers) and three etcd members agreeing on a leader — and (b) `lockslab failover`
//! with defaults, wall clock, with the failover and election times it measured.
//! Targets: clusters < 5s, the whole lab < 30s. Printed, not asserted: the machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;

const ROUNDS: usize = 3;

fn main() {
    println!("private clusters (Redis + replica + 3 Sentinels, 3 etcd members), {ROUNDS} starts:");
    let mut starts = Vec::new();
    let mut redis_alone = Vec::new();
    let mut etcd_alone = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let (redis, etcd) = lockslab::cluster::start_both().expect("starting the clusters");
        starts.push(started.elapsed());
        redis_alone.push(redis.started_in);
        etcd_alone.push(etcd.started_in);
    }
    report("  both ready", &mut starts);
    report("  Redis + Sentinels, from spawn", &mut redis_alone);
    report("  etcd, from spawn", &mut etcd_alone);

    servers(); // the store's Postgres, started once, outside the timings below
    println!("lockslab failover (defaults), {ROUNDS} rounds:");
    let mut walls = Vec::new();
    let mut failovers = Vec::new();
    let mut elections = Vec::new();
    for _ in 0..ROUNDS {
        let (wall, _, verdict) = timed_json(&["failover"]);
        walls.push(wall);
        for scenario in verdict["scenarios"].as_array().unwrap() {
            if scenario["name"] == "redis-unfenced" {
                failovers.push(Duration::from_millis(
                    scenario["failover_ms"].as_u64().unwrap(),
                ));
            }
            if let Some(ms) = scenario["election_ms"].as_u64() {
                elections.push(Duration::from_millis(ms));
            }
        }
    }
    report("  whole lab, wall clock", &mut walls);
    report("  Redis failover (kill → ROLE master)", &mut failovers);
    report("  etcd election (kill → new leader)", &mut elections);
}
