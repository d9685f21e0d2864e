//! Lab 2's speed, measured against real servers: `cargo bench --bench naive`.
//!
//! Reports `lockslab naive` with defaults (all four scenarios, 10 workers × 200 race
//! trials): wall time, against servers started once beforehand; the race's own time per
//! run (both runs share 10 worker processes); how much of the wall time is waiting on
//! purpose (the `--wait` of no-ttl and setnx-expire, and the TTLs that must lapse); and
//! the rest: spawning workers, talking to Redis, printing. Also how long B waited for a
//! killed A's key to lapse in the fixed no-ttl and setnx-expire runs (about the TTL): the
//! figure tests/naive.rs used to assert within a window.
//! Target: the whole lab under 30s. Figures are printed, not asserted: the machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use common::*;

const ROUNDS: usize = 3;

fn main() {
    servers(); // started once, outside the timings below
    println!(
        "lockslab naive (defaults: all scenarios, --workers 10 --trials 200), {ROUNDS} rounds:"
    );
    let mut walls = Vec::new();
    let mut races = Vec::new();
    let mut per_trial = Vec::new();
    let mut rates = Vec::new();
    let mut waits = Vec::new();
    let mut overheads = Vec::new();
    let mut lapses = Vec::new();
    for _ in 0..ROUNDS {
        let (wall, _, verdict) = timed_json(&["naive"]);
        walls.push(wall);
        let race = verdict["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "race")
            .unwrap();
        for variant in ["broken", "fixed"] {
            let took = Duration::from_millis(race[variant]["took_ms"].as_u64().unwrap());
            let trials = race[variant]["trials"].as_u64().unwrap() as u32;
            races.push(took);
            per_trial.push(took / trials);
        }
        rates.push(race["broken"]["rate"].as_f64().unwrap());
        // The waits the story needs: B's waits in no-ttl and setnx-expire (the full --wait
        // broken, about a TTL fixed) and the TTL A's lease runs out in, twice, in wrong-release.
        let mut waiting = Duration::ZERO;
        let mut ttl = Duration::ZERO;
        for scenario in verdict["scenarios"].as_array().unwrap() {
            for variant in ["broken", "fixed"] {
                if let Some(ms) = scenario[variant]["waited_ms"].as_u64() {
                    waiting += Duration::from_millis(ms);
                    if variant == "fixed" {
                        lapses.push(Duration::from_millis(ms));
                    }
                    ttl = Duration::from_millis(scenario[variant]["ttl_ms"].as_u64().unwrap());
                }
            }
        }
        waiting += ttl * 2;
        waits.push(waiting);
        overheads.push(
            walls
                .last()
                .unwrap()
                .saturating_sub(waiting + races[races.len() - 2] + races[races.len() - 1]),
        );
    }
    report("  whole lab, wall clock", &mut walls);
    report("  race, one run of 200 trials", &mut races);
    report("  race, per trial", &mut per_trial);
    report("  waiting on purpose (--wait, TTLs)", &mut waits);
    report("  the rest (spawns, Redis, output)", &mut overheads);
    report("  B's wait for A's key to lapse (TTL 1s)", &mut lapses);
    println!(
        "  race rate with defaults (GET-then-SET, --window 0ms): {}",
        rates
            .iter()
            .map(|r| format!("{:.1}%", r * 100.0))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
