//! The fault proxy's cost with no fault on: `cargo bench --bench proxy`.
//!
//! In the same run, against the same Redis: `redis-benchmark` with 50 clients direct and
//! through the proxy (requests per second, and the ratio: each round's proxied run over its
//! direct run, the median of the rounds; the target is ≥ 0.75×), then one client's `PING`
//! round trip direct and through it (medians, and what the proxy adds; the target is
//! ≤ 50 µs). Direct and proxied rounds alternate, so that a machine busy with
//! something else weighs on both. Figures are printed, not asserted.
//!
//! Two proxies are measured side by side: one event loop (the proxy as it was) and the
//! number the proxy now runs by default (two on two cores or more).
//!
//! The server's password stays off `redis-benchmark`'s command line, where `ps` would show
//! it: redis-benchmark 7.0 reads no password from the environment (only redis-cli reads
//! `REDISCLI_AUTH`), so for the benchmark's length the server has a user of its own that
//! needs no password and may only `SET` and `GET` the benchmark's keys (`key:*`), removed
//! when the benchmark ends.

#[path = "../tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use lockslab::proxy::{self, Proxy};

const ROUNDS: usize = 5;
const REQUESTS: &str = "100000";
const PINGS: usize = 5000;
/// redis-benchmark's user: no password, the benchmark's keys and commands only.
const BENCH_USER: &str = "lockslab-bench";

fn main() {
    let url = &servers().redis;
    let upstream = proxy::upstream_of(url).unwrap();
    let loopback = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let one = Proxy::start_with("bench→redis", loopback, upstream, 1).unwrap();
    let loops = proxy::event_loops();
    let proxied = Proxy::start_with("bench→redis", loopback, upstream, loops).unwrap();
    let through = proxy::through(url, proxied.addr()).unwrap();
    let mut admin = lockslab::connect::redis(url).unwrap();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", BENCH_USER, "reset", "on", "nopass", "~key:*"])
        .arg(&["+set", "+get", "+ping", "+config|get"])
        .query(&mut *admin)
        .unwrap();

    println!("redis-benchmark -c 50 -n {REQUESTS} -t set,get --csv, direct and through the proxy");
    let (mut direct, mut via_one, mut via) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        direct.push(requests_per_second(upstream.port()));
        via_one.push(requests_per_second(one.addr().port()));
        via.push(requests_per_second(proxied.addr().port()));
    }
    // Each round's proxied runs against the direct run just before them: a machine whose
    // other work comes and goes weighs on the three alike, where the median of all the
    // direct runs against that of all the proxied ones can pair a quiet moment with a busy
    // one (three runs in a row on this machine: 0.70×, 0.55×, 1.08× that way).
    let paired = |proxied: &[f64]| {
        let mut ratios: Vec<f64> = proxied.iter().zip(&direct).map(|(p, d)| p / d).collect();
        ratios.sort_by(f64::total_cmp);
        let spread = format!("{:.2}–{:.2}", ratios[0], ratios[ratios.len() - 1]);
        (median_f(&mut ratios), spread)
    };
    let ((one_ratio, one_spread), (ratio, spread)) = (paired(&via_one), paired(&via));
    let direct = median_f(&mut direct);
    let (via_one, via) = (median_f(&mut via_one), median_f(&mut via));
    println!("  direct        {direct:>10.0} req/s (median of {ROUNDS}, SET and GET together)");
    println!("  proxy, 1 loop {via_one:>10.0} req/s  ratio {one_ratio:.2}× (rounds {one_spread})");
    println!(
        "  proxy, {loops} loops{via:>10.0} req/s  ratio {ratio:.2}× (rounds {spread}; target ≥ 0.75×)"
    );
    println!(
        "  (a ratio is the median of the rounds' own, proxied over that round's direct; \
         the medians' ratio, as printed before: {:.2}× and {:.2}×)",
        via_one / direct,
        via / direct
    );

    let _: i64 = redis::cmd("ACL")
        .arg(&["DELUSER", BENCH_USER])
        .query(&mut *admin)
        .unwrap();

    println!("one client, {PINGS} PINGs, direct and through the proxy, alternating");
    let mut a = lockslab::connect::redis(url).unwrap();
    let mut b = lockslab::connect::redis(&through).unwrap();
    let (mut direct, mut via) = (Vec::new(), Vec::new());
    for _ in 0..PINGS {
        direct.push(ping(&mut a));
        via.push(ping(&mut b));
    }
    let (direct, via) = (median(&mut direct), median(&mut via));
    println!(
        "  direct        {:>8.1} µs median round trip",
        micros(direct)
    );
    println!("  through proxy {:>8.1} µs", micros(via));
    println!(
        "  added         {:>8.1} µs (target ≤ 50 µs)",
        micros(via) - micros(direct)
    );
}

fn ping(connection: &mut redis::Connection) -> Duration {
    let sent = Instant::now();
    let _: String = redis::cmd("PING").query(connection).unwrap();
    sent.elapsed()
}

/// SET and GET together, as `redis-benchmark --csv` reports them.
fn requests_per_second(port: u16) -> f64 {
    // `--user` needs `-a`; a user with `nopass` accepts any password, so this one is not one.
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["--user", BENCH_USER, "-a", "unused"])
        .args(["-c", "50", "-n", REQUESTS, "-t", "set,get", "--csv"])
        .output()
        .expect("redis-benchmark (from the redis-tools package)");
    let text = String::from_utf8_lossy(&out.stdout);
    let rates: Vec<f64> = text
        .lines()
        .filter(|line| line.starts_with("\"SET\"") || line.starts_with("\"GET\""))
        .filter_map(|line| line.split(',').nth(1))
        .filter_map(|rps| rps.trim_matches('"').parse().ok())
        .collect();
    assert_eq!(rates.len(), 2, "redis-benchmark said: {text}");
    rates.iter().sum::<f64>() / 2.0
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn median_f(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}
