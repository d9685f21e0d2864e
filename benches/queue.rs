//! Lab 10's three ways of queueing, measured by the servers: `cargo bench --bench queue`.
//!
//! The herd part alone (`lockslab queue --only herd`) with 20 and with 200 waiters, each
//! holding 20 ms: per way, the requests and watch events the server counted per hand-over,
//! the wake-ups the waiters counted, and the hand-over times (p50, p99) on the machine's
//! monotonic clock. Figures are printed, not asserted: the machine is shared.

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;

fn main() {
    for waiters in ["20", "200"] {
        let (_, verdict, _) = run_json(&["queue", "--only", "herd", "--waiters", waiters]);
        println!("lockslab queue --only herd --waiters {waiters}");
        println!(
            "  {:<12} {:>17} {:>18} {:>17} {:>10} {:>10} {:>6}",
            "way", "server req/hand", "watch events/hand", "wake-ups/hand", "p50", "p99", "fair"
        );
        for q in verdict["queues"].as_array().unwrap() {
            let ratio = |field: &str| {
                q[field]
                    .as_f64()
                    .map_or("—".to_string(), |v| format!("{v:.1}"))
            };
            let ms = |field: &str| {
                q[field]
                    .as_u64()
                    .map_or("?".to_string(), |us| format!("{:.1}ms", us as f64 / 1000.0))
            };
            println!(
                "  {:<12} {:>17} {:>18} {:>17} {:>10} {:>10} {:>6}",
                q["way"].as_str().unwrap(),
                ratio("server_requests_per_handover"),
                ratio("watch_events_per_handover"),
                ratio("wakeups_per_handover"),
                ms("handover_p50_us"),
                ms("handover_p99_us"),
                q["fair"],
            );
        }
    }
}
