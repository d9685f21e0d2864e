//! Lab 10 against real Redis, etcd and Postgres: the recipe serves a queue in order with
//! one wake-up per hand-over, as the servers count them; a waiter frozen past its lease
//! drops out and the one behind it waits on the holder; a holder frozen past its lease is
//! fenced off by its create revision. Small queues, no timing assertions.
//!
//! The servers' counters are read before and after each queue, so the tests of this file
//! take turns: two labs on one etcd at once would count each other's requests.

use crate::common;

use std::sync::Mutex;

use common::*;
use lockslab::events::{Event, Kind, What};
use lockslab::store::Outcome;
use serde_json::Value;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn queue<'a>(verdict: &'a Value, way: &str) -> &'a Value {
    verdict["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["way"] == way)
        .unwrap_or_else(|| panic!("no {way} in {verdict}"))
}

/// No worker of this run is left, running, stopped or zombie.
fn assert_no_worker_left(tag: &str) {
    let left = processes_tagged(tag);
    assert!(left.is_empty(), "workers left behind: {left:?}");
}

fn assert_no_etcd_key_left(run_id: &str) {
    let runtime = lockslab::connect::etcd_runtime().unwrap();
    let count = runtime.block_on(async {
        let mut client = etcd_client_of(&servers().etcd).await;
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        client
            .get(format!("lockslab:{run_id}:"), Some(options))
            .await
            .unwrap()
            .count()
    });
    assert_eq!(count, 0, "etcd keys left behind by run {run_id}");
}

#[test]
fn the_recipe_serves_in_order_with_one_watch_event_per_handover() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tag = fresh_tag();
    let (lines, verdict, _) = run_json_tagged(
        &[
            "queue",
            "--only",
            "herd",
            "--waiters",
            "6",
            "--hold",
            "10ms",
        ],
        &tag,
    );
    assert!(verdict.get("expiry").is_none(), "{verdict}");
    let recipe = queue(&verdict, "etcd_recipe");
    let herd = queue(&verdict, "etcd_herd");
    for q in [recipe, herd, queue(&verdict, "redis_spin")] {
        assert_eq!(q["waiters"], 6, "{q}");
        assert_eq!(q["never_served"], 0, "{q}");
        assert_eq!(q["handovers"], 5, "{q}");
        assert_eq!(q["tokens_grow"], true, "{q}");
        // The server counts every request the waiters counted, and maybe more (never fewer).
        let clients = q["client_requests_per_handover"].as_f64().unwrap();
        let server = q["server_requests_per_handover"].as_f64().unwrap();
        assert!(server >= clients, "{q}");
    }
    // First come, first served: the tokens (create revisions) follow the order of asking.
    assert_eq!(recipe["fair"], true, "{recipe}");
    assert_eq!(recipe["order_got"], serde_json::json!([1, 2, 3, 4, 5, 6]));
    // Each release wakes exactly the one waiter behind it, as etcd counts its events.
    assert_eq!(recipe["watch_events_per_handover"], 1.0, "{recipe}");
    assert_eq!(recipe["wakeups_per_handover"], 1.0, "{recipe}");
    // The herd: the first release alone wakes the five waiters.
    let herd_events = herd["watch_events_per_handover"].as_f64().unwrap();
    assert!(herd_events > 1.0, "{herd}");
    assert!(
        herd["wakeups_per_handover"].as_f64().unwrap() > 1.0,
        "{herd}"
    );

    // The turns in the history are the verdict's evidence, typed.
    let handovers: Vec<_> = lines
        .iter()
        .filter_map(|e| match &e.what {
            What::Handovers(h) => Some(h),
            _ => None,
        })
        .collect();
    assert_eq!(handovers.len(), 3);
    for h in &handovers {
        assert_eq!(h.turns.len(), 6);
        assert!(h.turns.iter().all(|t| t.token.is_some()), "{h:?}");
    }
    let run_id = verdict["run_id"].as_str().unwrap();
    assert_run_left_nothing(run_id);
    assert_no_etcd_key_left(run_id);
    assert_no_worker_left(&tag);
}

#[test]
fn an_expired_waiter_drops_out_and_an_expired_holder_is_fenced_by_its_revision() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tag = fresh_tag();
    let (lines, verdict, _) = run_json_tagged(&["queue", "--only", "expiry"], &tag);
    assert!(
        verdict["queues"].as_array().unwrap().is_empty(),
        "{verdict}"
    );
    let expiry = &verdict["expiry"];
    assert_eq!(expiry["frozen_waiter"], "learned_it_was_gone", "{expiry}");
    assert_eq!(expiry["skipped_the_gap"], true, "{expiry}");
    assert_eq!(expiry["late_write"], "rejected", "{expiry}");
    assert_eq!(expiry["holder_learned"], true, "{expiry}");
    let (h, w2) = (
        expiry["holder_token"].as_i64().unwrap(),
        expiry["next_token"].as_i64().unwrap(),
    );
    assert!(w2 > h, "{expiry}");
    // The store took W2's write and kept it: H's came after, with the lower token.
    assert_eq!(expiry["store"]["final_writer"], "W2", "{expiry}");
    // The part's faults are its schedule: H frozen once W1 said what it found on waking.
    let steps = expiry["schedule"].as_array().expect("the part's schedule");
    assert_eq!(steps.len(), 2, "{expiry}");
    assert_eq!(steps[0]["target"], "W1", "{expiry}");
    assert_eq!(steps[1]["target"], "H", "{expiry}");
    assert_eq!(
        steps[1]["after"]["event"],
        serde_json::json!(["lost", "acquired"]),
        "{expiry}"
    );
    assert_eq!(steps[1]["duration_ms"], expiry["freeze_ms"], "{expiry}");

    let log = lines.clone();
    let at = |found: &dyn Fn(&Event) -> bool| log.iter().position(found).unwrap();
    let w1_woke = at(&|e| e.is("W1", Kind::Lost));
    let h_frozen = at(&|e| matches!(&e.what, What::Frozen(f) if f.target.as_deref() == Some("H")));
    assert!(w1_woke < h_frozen, "H frozen only after W1 woke");
    let h_key = log
        .iter()
        .find_map(|e| match &e.what {
            What::Queued(q) if e.worker == "H" => q.key.clone(),
            _ => None,
        })
        .expect("H queued");
    // W2 was woken by W1's delete and found H still ahead: it did not take the lock then.
    let woke: Vec<_> = log
        .iter()
        .filter_map(|e| match &e.what {
            What::Woke(w) if e.worker == "W2" => Some(w.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(woke.len(), 2, "{woke:?}");
    assert_eq!(woke[0].ahead.as_deref(), Some(h_key.as_str()), "{woke:?}");
    assert_eq!(woke[1].gone.as_deref(), Some(h_key.as_str()), "{woke:?}");
    assert_eq!(woke[1].ahead, None, "{woke:?}");
    assert!(
        !log.iter()
            .any(|e| e.worker == "W1" && matches!(e.what, What::Acquired(_))),
        "W1 never holds"
    );
    assert_one_clock(&lines);
    let run_id = verdict["run_id"].as_str().unwrap();
    assert_run_left_nothing(run_id);
    assert_no_etcd_key_left(run_id);
    assert_no_worker_left(&tag);
}

#[test]
fn waiters_leaving_the_middle_of_the_line_are_skipped_over_and_the_rest_served_in_line() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tag = fresh_tag();
    let (lines, verdict, _) = run_json_tagged(&["queue", "--only", "churn"], &tag);
    assert!(verdict.get("expiry").is_none(), "{verdict}");
    let churn = &verdict["churn"];
    assert_eq!(
        churn["departed"],
        serde_json::json!(["W2", "W3"]),
        "{churn}"
    );
    assert_eq!(
        churn["served"],
        serde_json::json!(["H", "W1", "W4", "W5"]),
        "{churn}"
    );
    for finding in [
        "one_holder_at_a_time",
        "nobody_held_twice",
        "nobody_skipped",
        "gaps_rechecked",
        "store_in_order",
    ] {
        assert_eq!(churn[finding], true, "{finding}: {churn}");
    }
    // etcd's own history, as recorded: six keys, each deleted by the end.
    let keys = lines
        .iter()
        .find_map(|e| match &e.what {
            What::QueueKeys(k) => Some(k.keys.clone()),
            _ => None,
        })
        .expect("the history of the keys");
    assert_eq!(keys.len(), 6, "{keys:?}");
    assert!(keys.iter().all(|k| k.deleted.is_some()), "{keys:?}");
    // The nemesis killed W3, as the part's schedule says: once it was woken; W2 gave up on
    // its own; neither wrote.
    assert_eq!(
        churn["schedule"],
        serde_json::json!([{"at_ms": 0, "after": {"worker": "W3", "event": "woke", "nth": 1},
                            "fault": "kill", "target": "W3"}]),
        "{churn}"
    );
    let killed = lines.iter().position(|e| {
        matches!(&e.what,
        What::Killed(f) if f.target.as_deref() == Some("W3"))
    });
    let woke = lines.iter().position(|e| e.is("W3", Kind::Woke));
    assert!(woke.is_some() && killed > woke, "W3 killed once woken");
    // Cause before effect (issue 45): W2 says it gives up, then deletes its key, which
    // wakes W3 — the record never has W3 woken first.
    let gave_up = lines.iter().position(|e| e.is("W2", Kind::GaveUp));
    assert!(
        gave_up.is_some() && gave_up < woke,
        "W2 gives up before W3 is woken"
    );
    assert!(
        !lines.iter().any(|e| e.text.contains("(1 wake-ups")),
        "one wake-up, not 1 wake-ups"
    );
    assert!(
        !lines
            .iter()
            .any(|e| matches!(e.what, What::Wrote(_)) && ["W2", "W3"].contains(&e.worker.as_str()))
    );
    let run_id = verdict["run_id"].as_str().unwrap();
    assert_run_left_nothing(run_id);
    assert_no_etcd_key_left(run_id);
    assert_no_worker_left(&tag);
}

#[test]
fn a_leader_frozen_past_its_lease_still_believes_it_leads_and_its_generation_is_refused() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tag = fresh_tag();
    let (lines, verdict, _) = run_json_tagged(&["queue", "--only", "election"], &tag);
    assert!(verdict.get("churn").is_none(), "{verdict}");
    let election = &verdict["election"];
    assert_eq!(
        election["leaders"],
        serde_json::json!(["L1", "L2"]),
        "{election}"
    );
    assert_eq!(election["generations_grow"], true, "{election}");
    assert_eq!(election["one_leader_at_a_time"], true, "{election}");
    assert_eq!(election["deposed_acted"], true, "{election}");
    assert_eq!(election["late_write"], "rejected", "{election}");
    assert_eq!(election["deposed_learned"], true, "{election}");
    assert_eq!(election["store"]["final_writer"], "L2", "{election}");
    // The schedule froze L1 once L2 campaigned; the lab resumed it only after L2 wrote.
    let steps = election["schedule"]
        .as_array()
        .expect("the part's schedule");
    assert_eq!(steps.len(), 1, "{election}");
    assert_eq!(steps[0]["after"]["worker"], "L2", "{election}");
    assert_eq!(steps[0]["target"], "L1", "{election}");
    let at = |found: &dyn Fn(&Event) -> bool| lines.iter().position(found).unwrap();
    let l2_wrote = at(&|e| e.is("L2", Kind::Wrote));
    let l1_resumed =
        at(&|e| matches!(&e.what, What::Resumed(f) if f.target.as_deref() == Some("L1")));
    assert!(l2_wrote < l1_resumed, "L1 resumed after L2 wrote");
    // L1's refused write carried its own generation, lower than L2's.
    let generations: Vec<i64> = election["generations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_i64().unwrap())
        .collect();
    let l1_wrote = lines
        .iter()
        .find_map(|e| match &e.what {
            What::Wrote(w) if e.worker == "L1" => w.token,
            _ => None,
        })
        .expect("L1 wrote");
    assert_eq!(l1_wrote, generations[0]);
    assert!(generations[0] < generations[1]);
    let run_id = verdict["run_id"].as_str().unwrap();
    assert_run_left_nothing(run_id);
    assert_no_etcd_key_left(run_id);
    assert_no_worker_left(&tag);
}

/// Fencing inside etcd: a put guarded by the lock key's create revision, in one
/// transaction. A's guarded put is taken while it holds the lock, B's after A's lease
/// ended, and A's late one refused; the key, read back from etcd, holds B's write. (An
/// unguarded put would have taken A's late write: `a_late` would be true.)
#[test]
fn a_put_guarded_by_the_lock_key_is_refused_once_the_holders_lease_is_gone() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tag = fresh_tag();
    let (lines, verdict, _) = run_json_tagged(&["queue", "--only", "owner-txn"], &tag);
    assert!(verdict.get("election").is_none(), "{verdict}");
    let found = &verdict["owner_txn"];
    assert_eq!(
        (&found["a_while_holding"], &found["b"], &found["a_late"]),
        (&true.into(), &true.into(), &false.into()),
        "{found}"
    );
    assert_eq!(found["value"], "B", "{found}");
    assert!(
        found["a_token"].as_i64().unwrap() < found["b_token"].as_i64().unwrap(),
        "{found}"
    );
    // A's two guarded puts carried its own token; etcd's answers are the events'.
    let a_puts: Vec<(Option<i64>, Outcome)> = lines
        .iter()
        .filter_map(|e| match &e.what {
            What::Wrote(w) if e.worker == "A" => Some((w.token, w.outcome)),
            _ => None,
        })
        .collect();
    let a_token = found["a_token"].as_i64();
    assert_eq!(
        a_puts,
        [(a_token, Outcome::Accepted), (a_token, Outcome::Rejected)],
        "{lines:#?}"
    );
    let run_id = verdict["run_id"].as_str().unwrap();
    assert_no_etcd_key_left(run_id);
}

/// A recorded run (tests/fixtures/queue.jsonl, the defaults) replayed with no servers by
/// the lab's own replay (what `lockslab check` runs): its `handovers` events, and the
/// churn, expiry and election parts' events with the store's record, go through the lab's
/// checkers, which must reach the verdict recorded with them, every field of it.
#[test]
fn a_recorded_history_replays_to_its_recorded_verdict() {
    let (log, recorded) = events_and_verdict(include_str!("fixtures/queue.jsonl"));
    let recorded = &recorded;
    let replayed = lockslab::labs::queue::replay(&log, recorded).unwrap();
    let names: Vec<&str> = replayed.parts.iter().map(|p| p.name.as_str()).collect();
    let ways = names.iter().filter(|n| n.starts_with("queue ")).count();
    assert_eq!(ways, 3);
    for part in ["churn", "expiry", "election"] {
        assert!(names.contains(&part), "{names:?}");
    }
    for part in &replayed.parts {
        assert_eq!(
            &Value::Object(part.replayed.clone()),
            &part.recorded,
            "{}",
            part.name
        );
    }
    let churn = &recorded["churn"];
    assert_eq!(churn["one_holder_at_a_time"], true, "{churn}");
    let election = &recorded["election"];
    assert_eq!(election["late_write"], "rejected", "{election}");
}

/// Issue 45: on the terminal a waiter's line names the waiters whose keys it speaks of
/// (`woken: W2's key is gone; … W1's key is ahead`), not 40-character etcd keys; the
/// keys stay in `--json`.
#[test]
fn a_woken_waiters_line_names_the_waiters_not_their_keys() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let text = run_human(&["queue", "--only", "churn"]);
    let woken: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("woken:"))
        .collect();
    assert!(!woken.is_empty(), "{text}");
    assert!(
        woken.iter().all(|line| line.contains("'s key is gone")),
        "{text}"
    );
    assert!(text.contains("W2's key is gone"), "{text}");
}

/// A busy machine can starve a waiter's keepalive past its lease: etcd drops it from the
/// line before the lab did anything, and the churn part cannot show its lesson. The lab must
/// say so, at once, and why — not time out waiting for a wake that will never come, nor
/// print a verdict of a line it did not play. Here the test starves W1 itself: it stops W1
/// for 4 s (its lease is 1 s) once the whole line has joined.
#[test]
fn a_waiter_that_loses_its_lease_to_the_machine_is_named_and_the_part_says_why() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let tag = fresh_tag();
    let mut lab = lockslab(&["queue", "--only", "churn", "--json"])
        .env("LOCKSLAB_TEST_TAG", &tag)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(lab.stdout.take().unwrap());
    let mut w1 = None;
    let mut seen = Vec::new();
    for line in stdout.lines() {
        let line = line.unwrap();
        seen.push(line.clone());
        let Some(event) = event_line(&line) else {
            break;
        };
        if let What::Queued(queued) = &event.what {
            if event.worker == "W1" {
                w1 = queued.pid;
            }
            if event.worker == "W5" {
                let w1 = Pid::from_raw(w1.expect("W1 joined before W5"));
                kill(w1, Signal::SIGSTOP).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(4000));
                kill(w1, Signal::SIGCONT).unwrap();
            }
        }
    }
    let output = lab.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}\n{}", seen.join("\n"));
    assert!(
        stderr.contains("W1 lost its place in the queue before the lab did anything to it")
            && stderr.contains("too busy"),
        "{stderr}"
    );
    assert_no_worker_left(&tag);
}
