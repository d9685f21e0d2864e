//! Lab 6's speed, measured against real servers: `cargo bench --bench redlock`.
//!
//! Reports (a) five private Redis masters started one after another, as the lab does;
//! (b) one Redlock acquire + release cycle on those five local masters, as a ratio to a
//! single-instance `SET NX PX` + compare-and-delete cycle measured in the same run (about
//! 5× is expected: five round trips instead of one, each way); (c) `lockslab redlock` with
//! defaults, wall clock, and in each run the validity two frozen masters cost against two
//! down ones (it was a test's assertion; a timing belongs here). Targets: masters < 1s,
//! the lab < 30s. Figures are printed, not asserted: the machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use lockslab::connect::Backend;
use lockslab::lock::redis::RedisLock;
use lockslab::lock::redlock::{Master, Redlock, Settings};
use lockslab::servers::{Lifetime, PrivateServers};

const ROUNDS: usize = 5;
const CYCLES: usize = 2000;

fn main() {
    println!("five private Redis masters, started one after another, {ROUNDS} times:");
    let mut starts = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let masters: Vec<PrivateServers> = (0..5)
            .map(|_| PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun).unwrap())
            .collect();
        starts.push(started.elapsed());
        drop(masters);
    }
    report("  all five answering", &mut starts);

    let masters: Vec<PrivateServers> = (0..5)
        .map(|_| PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun).unwrap())
        .collect();
    let urls: Vec<String> = masters
        .iter()
        .map(|m| m.url(Backend::Redis).unwrap())
        .collect();
    let ttl = Duration::from_secs(10);
    let mut single = RedisLock::new(
        lockslab::connect::redis(&urls[0]).unwrap(),
        "lockslab:bench:single",
        ttl,
    );
    let mut redlock = Redlock::new(
        urls.iter()
            .enumerate()
            .map(|(i, url)| Master::new(&format!("m{}", i + 1), url))
            .collect(),
        "lockslab:bench:redlock",
        Settings {
            ttl,
            drift_factor: 0.01,
            instance_timeout: Duration::from_millis(50),
            retry_delay_max: Duration::from_millis(200),
        },
    );
    // Warm-up: connections opened, scripts cached.
    for _ in 0..50 {
        let held = single.try_acquire().unwrap().unwrap();
        single.release(&held).unwrap();
        let round = redlock.try_acquire();
        redlock.release(&round.value);
    }
    println!("{CYCLES} acquire + release cycles each, in the same run:");
    let started = Instant::now();
    for _ in 0..CYCLES {
        let held = single.try_acquire().unwrap().expect("free");
        assert!(single.release(&held).unwrap());
    }
    let one = started.elapsed() / CYCLES as u32;
    let started = Instant::now();
    for _ in 0..CYCLES {
        let round = redlock.try_acquire();
        assert!(round.held, "{round:?}");
        redlock.release(&round.value);
    }
    let five = started.elapsed() / CYCLES as u32;
    println!(
        "  single instance {:>8.1}µs   Redlock on 5 {:>8.1}µs   ratio {:.1}×",
        one.as_secs_f64() * 1e6,
        five.as_secs_f64() * 1e6,
        five.as_secs_f64() / one.as_secs_f64()
    );
    drop(masters);

    servers(); // the store's Postgres, started once, outside the timings below
    println!("lockslab redlock (defaults: 5 masters, --ttl 2s, all four scenarios), 3 rounds:");
    let mut walls = Vec::new();
    let mut validities = Vec::new();
    for _ in 0..3 {
        let (wall, _, verdict) = timed_json(&["redlock"]);
        walls.push(wall);
        let validity = |name: &str| {
            verdict["scenarios"]
                .as_array()
                .and_then(|all| all.iter().find(|s| s["name"] == name))
                .and_then(|s| s["validity_ms"].as_i64())
                .unwrap_or_default()
        };
        validities.push((validity("minority-down"), validity("minority-frozen")));
    }
    report("  wall clock", &mut walls);
    // What two frozen masters cost the validity (two per-instance timeouts, 50ms each, are
    // expected), next to two down ones that refuse at once.
    for (down, frozen) in validities {
        println!(
            "  validity with 2 down {down:>5}ms   with 2 frozen {frozen:>5}ms   cost {:>4}ms",
            down - frozen
        );
    }
}
