//! Lab 1's speed, measured against real servers: `cargo bench --bench gc_pause`.
//!
//! Reports (a) how long private Redis, etcd and Postgres take to start together, and
//! (b) `lockslab gc-pause` with defaults: wall time for both runs, and per run the time
//! beyond the pause the lab waits on purpose, and (c) how soon it gives up on a backend
//! that refuses connections and on one that accepts them and never answers. Targets:
//! servers < 5s, both runs < 12s, overhead < 1s per run, refused < 1s, frozen < 10s.
//! Figures are printed, not asserted: the machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

const ROUNDS: usize = 5;

fn main() {
    println!("private servers (Redis + etcd + Postgres), {ROUNDS} starts:");
    let mut starts = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let mut keeper = Command::new(BIN)
            .arg("__serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("__serve");
        let mut line = String::new();
        BufReader::new(keeper.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        starts.push(started.elapsed());
        drop(keeper.stdin.take());
        keeper.wait().unwrap();
    }
    report("  ready", &mut starts);

    servers(); // started once, outside the timings below
    println!("lockslab gc-pause (defaults: --ttl 2s --pause 3s, both runs), {ROUNDS} rounds:");
    let mut walls = Vec::new();
    let mut overheads = Vec::new();
    for _ in 0..ROUNDS {
        let (wall, lines, verdict) = timed_json(&["gc-pause"]);
        walls.push(wall);
        let pause = Duration::from_millis(verdict["pause_ms"].as_u64().unwrap());
        // Both runs share one clock; each event says which run (`fencing`) it belongs to.
        let mut runs: Vec<(bool, u64, u64)> = Vec::new(); // (fencing, first t_ms, last t_ms)
        for event in &lines {
            let (fenced, t) = (event.part.fencing == Some(true), event.t_ms);
            match runs.last_mut() {
                Some(run) if run.0 == fenced => run.2 = t,
                _ => runs.push((fenced, t, t)),
            }
        }
        let run_ends: Vec<u64> = runs.iter().map(|(_, first, last)| last - first).collect();
        for end in run_ends {
            overheads.push(Duration::from_millis(end).saturating_sub(pause));
        }
    }
    report("  both runs, wall clock", &mut walls);
    report("  per run, beyond the pause", &mut overheads);

    println!("lockslab gc-pause giving up on a backend, {ROUNDS} rounds each:");
    let mut refused = Vec::new();
    let mut frozen = Vec::new();
    for _ in 0..ROUNDS {
        // A port nobody listens on: bind one, then close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        refused.push(time_to_fail(
            "LOCKSLAB_REDIS_URL",
            format!("redis://127.0.0.1:{port}"),
        ));
        // Something that accepts connections and never answers, like a frozen server.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        frozen.push(time_to_fail(
            "LOCKSLAB_POSTGRES_URL",
            format!("postgres://lab:secret@127.0.0.1:{port}/db"),
        ));
    }
    report("  Redis refuses connections", &mut refused);
    report("  Postgres accepts and never answers", &mut frozen);
}

/// How long `lockslab gc-pause` takes to exit with 1 when `var` names a bad server.
fn time_to_fail(var: &str, url: String) -> Duration {
    let started = Instant::now();
    let output = lockslab(&["gc-pause"]).env(var, url).output().unwrap();
    let took = started.elapsed();
    if output.status.code() != Some(1) {
        println!("  (it exited with {:?}, not 1)", output.status.code());
    }
    took
}
