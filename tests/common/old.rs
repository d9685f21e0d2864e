//! The untyped readers of `--json` (each line a `serde_json::Value`, events read by string
//! keys), kept only until every test file reads the typed history through the helpers in
//! `common`.
#![allow(dead_code)]

use std::process::Output;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{decision_order_problem, late_write_in, lockslab};

/// Runs a lab with `--json` and returns its events and its final verdict object.
pub fn run_json(args: &[&str]) -> (Vec<Value>, Value, Output) {
    let mut all = args.to_vec();
    all.push("--json");
    let output = lockslab(&all).output().expect("running lockslab");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "lockslab {all:?} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    let verdict = lines.last().cloned().expect("no output");
    assert_eq!(
        verdict["kind"], "verdict",
        "the last line must be the verdict: {verdict}"
    );
    (lines, verdict, output)
}

/// Events of one kind from one worker.
pub fn events<'a>(lines: &'a [Value], worker: &str, kind: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|e| e["worker"] == worker && e["kind"] == kind)
        .collect()
}

/// Every worker pid a run reported: workers announce themselves with a `waiting` event (with
/// their `pid`), and labs that start many at once list them in a `workers` event (`pids`).
pub fn worker_pids(lines: &[Value]) -> Vec<i32> {
    let mut pids: Vec<i32> = lines
        .iter()
        .filter(|e| e["kind"] == "waiting")
        .filter_map(|e| e["pid"].as_i64())
        .map(|p| p as i32)
        .collect();
    for event in lines.iter().filter(|e| e["kind"] == "workers") {
        pids.extend(
            event["pids"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p.as_i64())
                .map(|p| p as i32),
        );
    }
    pids
}

/// Runs a lab with `--json` and returns how long it took, its events and its verdict.
pub fn timed_json(args: &[&str]) -> (Duration, Vec<Value>, Value) {
    let started = Instant::now();
    let (lines, verdict, _) = run_json(args);
    (started.elapsed(), lines, verdict)
}

/// Every way one run of a lab 1 verdict could contradict the store's record it carries (the
/// attempts in decision order) or the timeline's store line (`store_lines`, that run's
/// events from the `store` lane). Empty when the verdict is true to its evidence.
pub fn gc_pause_disagreements(run: &Value, store_lines: &[&Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let attempts = run["attempts"].as_array().cloned().unwrap_or_default();
    problems.extend(decision_order_problem(&attempts));
    let last_accepted = attempts.iter().rev().find(|a| a["accepted"] == true);
    if last_accepted.map(|a| &a["writer"]) != Some(&run["final_writer"])
        && !(last_accepted.is_none() && run["final_writer"].is_null())
    {
        problems.push("the final writer is not the last accepted attempt".into());
    }
    let expected = late_write_in(&attempts, "A", "B");
    if run["late_write"] != expected {
        problems.push(format!(
            "late_write says {} but the attempts say {expected}",
            run["late_write"]
        ));
    }
    // A's write decided after B's means B held the lock before A let go.
    if matches!(expected, "accepted" | "rejected") && run["two_holders"] == false {
        problems.push("A wrote after B, yet the verdict says no two holders".into());
    }
    let says = match expected {
        "accepted" => Some("stale_write_accepted"),
        "rejected" => Some("stale_write_rejected"),
        _ => None,
    };
    let said: Vec<&str> = store_lines
        .iter()
        .filter_map(|e| e["kind"].as_str())
        .collect();
    if said != says.into_iter().collect::<Vec<_>>() {
        problems.push(format!("the timeline's store line says {said:?}"));
    }
    if store_lines
        .iter()
        .any(|e| e["final_writer"] != run["final_writer"])
    {
        problems.push("the timeline's store line names another final writer".into());
    }
    problems
}

/// Every way one cell of a lab 4 verdict could contradict the store's record it carries,
/// the releases the workers reported, or the timeline's store line for its backend.
pub fn etcd_vs_redis_disagreements(cell: &Value, lines: &[Value]) -> Vec<String> {
    let mut problems = Vec::new();
    let backend = cell["backend"].as_str().unwrap_or("?");
    let (holder, waiter) = (format!("{backend}:holder"), format!("{backend}:waiter"));
    let attempts = cell["attempts"].as_array().cloned().unwrap_or_default();
    problems.extend(decision_order_problem(&attempts));
    let expected = late_write_in(&attempts, &holder, &waiter);
    if cell["late_write"] != expected {
        problems.push(format!(
            "late_write says {} but the attempts say {expected}",
            cell["late_write"]
        ));
    }
    if expected != "none" && cell["two_holders"] != true {
        problems.push("the holder wrote after the waiter, yet not two holders".into());
    }
    let wanted_accepted = match expected {
        "accepted" => Value::Bool(true),
        "rejected" => Value::Bool(false),
        _ => Value::Null,
    };
    if cell["stale_write_accepted"] != wanted_accepted {
        problems.push("stale_write_accepted disagrees with late_write".into());
    }
    // etcd and Postgres queue the waiter: a holder whose release found its lock gone while
    // the waiter got the lock had a second holder beside it.
    let released = |worker: &str| {
        lines
            .iter()
            .find(|e| e["worker"] == worker && e["kind"] == "released")
            .map(|e| e["released"].clone())
    };
    let waiter_got_it = lines
        .iter()
        .any(|e| e["worker"] == waiter.as_str() && e["kind"] == "acquired");
    if cell["scenario"] == "freeze"
        && !backend.starts_with("redis")
        && released(&holder) == Some(Value::Bool(false))
        && waiter_got_it
        && cell["two_holders"] != true
    {
        problems.push("the holder's release found its lock gone, yet not two holders".into());
    }
    let store_said: Vec<&str> = lines
        .iter()
        .filter(|e| {
            e["worker"] == "store" && e["backend"] == backend && e["scenario"] == cell["scenario"]
        })
        .filter_map(|e| e["kind"].as_str())
        .collect();
    let wanted: Vec<&str> = match expected {
        "accepted" => vec!["stale_write_accepted"],
        "rejected" => vec!["stale_write_rejected"],
        _ => vec![],
    };
    if store_said != wanted {
        problems.push(format!("the timeline's store line says {store_said:?}"));
    }
    problems
}

/// The events of one lab run are stamped on one clock: `t_ms` never restarts, across the
/// runs and scenarios of one command too. (Each worker's events are stamped by their own
/// reader thread as they arrive, and the lab prints them when it next reads its channel: on a
/// loaded machine a stamp can land tens of milliseconds behind one the lab stamped itself.
/// A step back under a second is arrival order; a restart drops by more, towards 0.)
pub fn assert_one_clock(lines: &[Value]) {
    let stamps: Vec<u64> = lines
        .iter()
        .filter(|e| e["kind"] != "verdict")
        .filter_map(|e| e["t_ms"].as_u64())
        .collect();
    let mut latest = 0;
    for &t in &stamps {
        assert!(
            t + 1_000 >= latest,
            "one clock for the whole run, but {t} came after {latest}: {stamps:?}"
        );
        latest = latest.max(t);
    }
}
