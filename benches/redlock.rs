//! Lab 6's speed, measured against real servers: `cargo bench --bench redlock`.
//!
//! Reports (a) five private Redis masters started one after another, as the lab does;
//! (b) one Redlock acquire + release cycle on those five local masters, asked one after
//! another and all at once, each as a ratio to a single-instance `SET NX PX` +
//! compare-and-delete cycle measured in the same run (one after another, about 5× is
//! expected: five round trips instead of one, each way; all at once, about 1–2× where the
//! round trip is the wire's latency rather than CPU time); beside them a Redlock on one
//! master (its bookkeeping beyond the round trips) and on five databases of one master,
//! both orders (five round trips, one server process to wake: what is left is the cost of
//! switching between five server processes). Each line also gives the CPU time a cycle
//! costs, this thread's and the servers' (`INFO cpu`), and its ratio to the single
//! instance's: the work five masters do, asked in either order. A round asked all at once
//! can be no shorter than that work spread over the machine's cores (the `floor` column;
//! on a shared machine fewer cores are free, and the real floor is higher). Below them, the
//! floor measured rather than computed: the same round trips with no lock logic (`SET` then
//! `DEL` on one server, and on the five masters one after another and all at once), whose
//! ratios to the single instance's cycle say how low each Redlock ratio can go on this
//! machine, in this run; each target is printed beside its Redlock's and its floor's. (c) `lockslab
//! redlock` with defaults, wall clock, and in each run the validity two frozen masters cost
//! against two down ones, then the same with `--round concurrent`. Targets: masters < 1s, the lab < 30s. Figures are
//! printed, not asserted: the machine is shared.
//!
//! `LOCKSLAB_BENCH_CYCLES=200` runs fewer cycles while iterating (default 2000), and
//! `LOCKSLAB_BENCH_CYCLES_ONLY=1` stops after the cycles.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use common::*;
use lockslab::connect::Backend;
use lockslab::lock::redis::RedisLock;
use lockslab::lock::redlock::{Master, Redlock, RoundOrder, Settings};
use lockslab::servers::{Lifetime, PrivateServers};

const ROUNDS: usize = 5;
const CYCLES: usize = 2000;
const BLOCKS: usize = 10;

fn cycles() -> usize {
    std::env::var("LOCKSLAB_BENCH_CYCLES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CYCLES)
}

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
    let redlock = |urls: &[String], round: RoundOrder| {
        Redlock::new(
            urls.iter()
                .enumerate()
                .map(|(i, url)| Master::new(&format!("m{}", i + 1), url))
                .collect(),
            &format!("lockslab:bench:redlock:{round:?}"),
            Settings {
                ttl,
                drift_factor: 0.01,
                // Longer than the lab's 50ms: on a loaded machine a live master's answer
                // can take that long, and the cycles measure answers, not give-ups.
                instance_timeout: Duration::from_millis(500),
                retry_delay_max: Duration::from_millis(200),
                round,
            },
        )
    };
    // Five round trips to one server process, to tell the round trips' own cost from the
    // cost of waking five processes in turn.
    let databases: Vec<String> = (1..=5).map(|db| format!("{}/{db}", urls[0])).collect();
    let lock = |urls: &[String], round| Variant::Lock(redlock(urls, round));
    let mut locks = [
        ("Redlock on 1", lock(&urls[..1], RoundOrder::Sequential)),
        (
            "Redlock on 5 databases of 1",
            lock(&databases, RoundOrder::Sequential),
        ),
        (
            "5 databases of 1, all at once",
            lock(&databases, RoundOrder::Concurrent),
        ),
        (
            "Redlock on 5, one after another",
            lock(&urls, RoundOrder::Sequential),
        ),
        (
            "Redlock on 5, all at once",
            lock(&urls, RoundOrder::Concurrent),
        ),
        // The floor: the same round trips with no lock at all (no value drawn, no script,
        // no timeouts, no counting), which no Redlock can beat on this machine.
        ("floor: SET + DEL on 1", Variant::plain(&urls[..1], false)),
        (
            "floor: on 5, one after another",
            Variant::plain(&urls, false),
        ),
        ("floor: on 5, all at once", Variant::plain(&urls, true)),
    ];
    // Warm-up: connections opened, scripts cached.
    for _ in 0..50 {
        let held = single.try_acquire().unwrap().unwrap();
        single.release(&held).unwrap();
        for (_, variant) in &mut locks {
            variant.cycle();
        }
    }
    // The machine is shared and its load drifts: the cycles run in blocks, each variant's
    // block right after the single instance's, and each ratio is the median of the blocks'
    // ratios (a burst of load then slows both sides of a ratio, not one).
    let cycles = cycles();
    let per_block = (cycles / BLOCKS).max(1);
    println!(
        "{} acquire + release cycles each, in the same run ({BLOCKS} interleaved blocks; \
         median per cycle, median of the blocks' ratios):",
        per_block * BLOCKS
    );
    let mut single_us = Vec::new();
    let mut lock_us: Vec<Vec<f64>> = vec![Vec::new(); locks.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); locks.len()];
    let mut single_cpu = Vec::new();
    let mut single_own = Vec::new();
    let mut lock_cpu: Vec<Vec<f64>> = vec![Vec::new(); locks.len()];
    let mut lock_own: Vec<Vec<f64>> = vec![Vec::new(); locks.len()];
    let mut cpu_ratios: Vec<Vec<f64>> = vec![Vec::new(); locks.len()];
    let mut not_held = vec![0; locks.len()];
    let mut cpu = Cpu::new(&urls);
    for _ in 0..BLOCKS {
        for (i, (_, variant)) in locks.iter_mut().enumerate() {
            let before = cpu.used_us();
            let started = Instant::now();
            for _ in 0..per_block {
                let held = single.try_acquire().unwrap().expect("free");
                assert!(single.release(&held).unwrap());
            }
            let one = started.elapsed().as_secs_f64() * 1e6 / per_block as f64;
            let between = cpu.used_us();
            let one_cpu = (between.0 + between.1 - before.0 - before.1) / per_block as f64;
            single_us.push(one);
            single_cpu.push(one_cpu);
            single_own.push((between.0 - before.0) / per_block as f64);
            let started = Instant::now();
            for _ in 0..per_block {
                not_held[i] += usize::from(!variant.cycle());
            }
            let took = started.elapsed().as_secs_f64() * 1e6 / per_block as f64;
            let after = cpu.used_us();
            let took_cpu = (after.0 + after.1 - between.0 - between.1) / per_block as f64;
            lock_own[i].push((after.0 - between.0) / per_block as f64);
            lock_us[i].push(took);
            ratios[i].push(took / one);
            lock_cpu[i].push(took_cpu);
            cpu_ratios[i].push(took_cpu / one_cpu);
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let single_wall = median(&mut single_us);
    let wall_ratios: Vec<f64> = ratios.iter_mut().map(|r| median(r)).collect();
    println!(
        "  {:<32} {:>9} {:>7} {:>10} {:>7} {:>10} {:>7}",
        "", "wall", "ratio", "CPU", "ratio", "client", "floor"
    );
    println!(
        "  {:<32} {:>7.1}µs {:>7} {:>8.1}µs {:>7} {:>8.1}µs",
        "single instance",
        single_wall,
        "",
        median(&mut single_cpu),
        "",
        median(&mut single_own)
    );
    for (i, (name, _)) in locks.iter().enumerate() {
        let cpu_us = median(&mut lock_cpu[i]);
        println!(
            "  {name:<32} {:>7.1}µs {:>6.1}× {:>8.1}µs {:>6.1}× {:>8.1}µs {:>6.1}×{}",
            median(&mut lock_us[i]),
            wall_ratios[i],
            cpu_us,
            median(&mut cpu_ratios[i]),
            median(&mut lock_own[i]),
            cpu_us / cores as f64 / single_wall,
            match not_held[i] {
                0 => String::new(),
                n => format!("   ({n} rounds not held)"),
            }
        );
    }
    println!(
        "  (CPU: this thread's and the five servers' CPU time per cycle, client: this \
         thread's alone; floor: the CPU spread over all {cores} cores, as a ratio to the \
         single instance's wall time — on this machine no cycle can be shorter, however it \
         asks, and only on an idle one does it get all {cores})"
    );
    // The targets against what the machine allows, in this run: a Redlock round on five
    // masters cannot be quicker than the plain round trips it is made of.
    let ratio_of = |name: &str| {
        let at = locks.iter().position(|(n, _)| *n == name);
        at.map_or(f64::NAN, |at| wall_ratios[at])
    };
    for (target, redlock, floor) in [
        (
            5.5,
            "Redlock on 5, one after another",
            "floor: on 5, one after another",
        ),
        (2.0, "Redlock on 5, all at once", "floor: on 5, all at once"),
    ] {
        let (got, least) = (ratio_of(redlock), ratio_of(floor));
        println!(
            "  {redlock}: {got:.1}×, target ≤ {target}×: {}; plain round trips with no lock \
             logic take {least:.1}×{}",
            if got <= target { "met" } else { "NOT met" },
            if least > target {
                " — the target is below this machine's floor"
            } else {
                ""
            }
        );
    }
    drop(masters);
    if std::env::var_os("LOCKSLAB_BENCH_CYCLES_ONLY").is_some() {
        return;
    }

    servers(); // the store's Postgres, started once, outside the timings below
    println!("lockslab redlock (defaults: 5 masters, --ttl 2s, all four scenarios), 3 rounds:");
    let mut walls = Vec::new();
    let mut validities = Vec::new();
    for _ in 0..3 {
        let (wall, _, verdict) = timed_json(&["redlock"]);
        walls.push(wall);
        validities.push(minority_validities(&verdict));
    }
    report("  wall clock", &mut walls);
    // What two frozen masters cost the validity (two per-instance timeouts, 50ms each, are
    // expected one after another; one timeout all at once), next to two down ones that
    // refuse at once.
    for (down, frozen) in validities {
        println!(
            "  validity with 2 down {down:>5}ms   with 2 frozen {frozen:>5}ms   cost {:>4}ms",
            down - frozen
        );
    }
    println!("lockslab redlock minority --round concurrent, 3 rounds:");
    for _ in 0..3 {
        let (_, _, verdict) = timed_json(&["redlock", "minority", "--round", "concurrent"]);
        let (down, frozen) = minority_validities(&verdict);
        println!(
            "  validity with 2 down {down:>5}ms   with 2 frozen {frozen:>5}ms   cost {:>4}ms",
            down - frozen
        );
    }
}

/// One variant's acquire + release cycle: a Redlock, or its floor.
enum Variant {
    Lock(Redlock),
    /// `SET` then `DEL` of one key on every connection, one master after another or all
    /// at once (every request written before any answer is read), and nothing else.
    Plain {
        connections: Vec<redis::Connection>,
        at_once: bool,
    },
}

impl Variant {
    fn plain(urls: &[String], at_once: bool) -> Variant {
        let connections = urls
            .iter()
            .map(|url| {
                redis::Client::open(url.as_str())
                    .unwrap()
                    .get_connection()
                    .unwrap()
            })
            .collect();
        Variant::Plain {
            connections,
            at_once,
        }
    }

    /// One cycle; false when a Redlock round did not hold the lock.
    fn cycle(&mut self) -> bool {
        match self {
            Variant::Lock(lock) => {
                let round = lock.try_acquire();
                lock.release(&round.value);
                round.held
            }
            Variant::Plain {
                connections,
                at_once,
            } => {
                for request in [&*PLAIN_SET, &*PLAIN_DEL] {
                    if *at_once {
                        for c in connections.iter_mut() {
                            c.send_packed_command(request).unwrap();
                        }
                        for c in connections.iter_mut() {
                            c.recv_response().unwrap();
                        }
                    } else {
                        for c in connections.iter_mut() {
                            c.send_packed_command(request).unwrap();
                            c.recv_response().unwrap();
                        }
                    }
                }
                true
            }
        }
    }
}

static PLAIN_SET: LazyLock<Vec<u8>> = LazyLock::new(|| {
    redis::cmd("SET")
        .arg("lockslab:bench:plain")
        .arg("x")
        .get_packed_command()
});
static PLAIN_DEL: LazyLock<Vec<u8>> = LazyLock::new(|| {
    redis::cmd("DEL")
        .arg("lockslab:bench:plain")
        .get_packed_command()
});

/// CPU time used so far, in µs: this thread's (the kernel's `schedstat`, in ns) and every
/// master's (`INFO cpu`: the server's user + system time), read on connections of its own.
struct Cpu {
    servers: Vec<redis::Connection>,
}

impl Cpu {
    fn new(urls: &[String]) -> Cpu {
        Cpu {
            servers: urls
                .iter()
                .map(|url| {
                    redis::Client::open(url.as_str())
                        .unwrap()
                        .get_connection()
                        .unwrap()
                })
                .collect(),
        }
    }

    /// (this thread's, the servers'), in µs.
    fn used_us(&mut self) -> (f64, f64) {
        let own = std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
            .map_or(0.0, |ns| ns / 1000.0);
        let servers: f64 = self
            .servers
            .iter_mut()
            .map(|server| {
                let info: String = redis::cmd("INFO").arg("cpu").query(server).unwrap();
                info.lines()
                    .filter_map(|line| {
                        let (name, value) = line.trim().split_once(':')?;
                        matches!(name, "used_cpu_sys" | "used_cpu_user")
                            .then(|| value.parse::<f64>().ok())?
                    })
                    .sum::<f64>()
                    * 1e6
            })
            .sum();
        (own, servers)
    }
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The validity left with two masters down, and with two frozen.
fn minority_validities(verdict: &serde_json::Value) -> (i64, i64) {
    let validity = |name: &str| {
        verdict["scenarios"]
            .as_array()
            .and_then(|all| all.iter().find(|s| s["name"] == name))
            .and_then(|s| s["validity_ms"].as_i64())
            .unwrap_or_default()
    };
    (validity("minority-down"), validity("minority-frozen"))
}
