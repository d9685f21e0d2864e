//! Lab 8 against real Redis and Postgres, A's store path through the fault proxy: the
//! verdicts are read back from the store, and the history is read as typed events.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::*;
use lockslab::events::facts::{Fault, Phase};
use lockslab::events::{Event, Kind, What};
use lockslab::proxy::Direction;
use lockslab::store::Outcome;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

fn run_of<'a>(verdict: &'a Value, scenario: &str, fencing: bool) -> &'a Value {
    verdict["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|run| run["scenario"] == scenario && run["fencing"] == fencing)
        .unwrap_or_else(|| panic!("no run with fencing={fencing} in {verdict}"))
}

/// The events of one run (fenced or not).
fn history(lines: &[Event], scenario: &str, fenced: bool) -> Vec<Event> {
    lines
        .iter()
        .filter(|e| e.part.scenario.as_deref() == Some(scenario) && e.part.fencing == Some(fenced))
        .cloned()
        .collect()
}

/// The store's attempts a run's verdict carries: (writer, accepted), in decision order.
fn writers(run: &Value) -> Vec<(&str, bool)> {
    run["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["writer"].as_str().unwrap(),
                a["accepted"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// A schedule the verdict carries: each step's fault, target and the event it waits for.
fn played(schedule: &Value) -> Vec<(Fault, String, Option<String>)> {
    let schedule: lockslab::nemesis::schedule::Schedule =
        serde_json::from_value(schedule.clone()).expect("a schedule in the verdict");
    (schedule.steps().iter())
        .map(|s| {
            let after = s.after.as_ref().map(|a| a.describe());
            (s.fault, s.target.clone(), after)
        })
        .collect()
}

fn position(log: &[Event], what: impl Fn(&Event) -> bool) -> usize {
    log.iter()
        .position(what)
        .unwrap_or_else(|| panic!("not in the history: {log:#?}"))
}

#[test]
fn a_checked_write_held_in_flight_lands_unfenced_and_is_refused_fenced() {
    let (lines, verdict, _) =
        run_json(&["network", "--ttl", "500ms", "--scenario", "delayed-write"]);
    for fenced in [false, true] {
        let log = history(&lines, "delayed-write", fenced);
        // A checked its lock just before writing, and Redis said it was still A's.
        let checked = position(&log, |e| e.is("A", Kind::Checked));
        let What::Checked(check) = &log[checked].what else {
            unreachable!()
        };
        assert_eq!(check.still_ours, Some(true), "{check:?}");
        assert!(check.pttl_ms.unwrap() > 0, "{check:?}");
        // The nemesis put the hold on A's path to the store before A wrote, and lifted it
        // only after B's write: A's write was in the proxy all along.
        let hold = position(
            &log,
            |e| matches!(&e.what, What::NetFault(f) if f.fault == Some(Fault::Hold)),
        );
        let heal = position(&log, |e| matches!(&e.what, What::NetHealed(_)));
        let (What::NetFault(start), What::NetHealed(end)) = (&log[hold].what, &log[heal].what)
        else {
            unreachable!()
        };
        assert_eq!(start.target.as_deref(), Some("A→store"));
        assert_eq!(start.direction, Some(Direction::Up));
        assert_eq!(start.phase, Some(Phase::Start));
        assert_eq!(
            (end.fault, end.phase),
            (Some(Fault::Heal), Some(Phase::End))
        );
        assert_eq!(end.process_ran, Some(true), "A ran throughout the hold");
        let b_wrote = position(&log, |e| e.is("B", Kind::Wrote));
        let a_wrote = position(&log, |e| e.is("A", Kind::Wrote));
        assert!(hold < checked && checked < b_wrote && b_wrote < heal && heal < a_wrote);
        // Nobody paused A: no freeze of any kind in the run.
        assert!(
            !log.iter()
                .any(|e| matches!(e.kind(), Kind::Frozen | Kind::Freezing | Kind::Resumed)),
            "no pause in a network lab"
        );

        let run = run_of(&verdict, "delayed-write", fenced);
        assert_eq!(run["a_checked_ours"], true, "{run}");
        assert_eq!(run["a_never_paused"], true, "{run}");
        assert_eq!(run["two_holders"], true, "{run}");
        let attempts = writers(run);
        if fenced {
            assert_eq!(run["late_write"], "rejected", "{run}");
            assert_eq!(run["final_writer"], "B");
            assert_eq!(attempts, vec![("B", true), ("A", false)]);
            let tokens: Vec<i64> = run["attempts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a["token"].as_i64().unwrap())
                .collect();
            assert!(tokens[1] < tokens[0], "A's token is the lower: {tokens:?}");
        } else {
            assert_eq!(run["late_write"], "accepted", "{run}");
            assert_eq!(run["final_writer"], "A", "the late write has the last word");
            assert_eq!(attempts, vec![("B", true), ("A", true)]);
        }
    }
    // The faults both runs played, as data: the hold at once, its heal once B had written.
    let steps = played(&verdict["schedule"]);
    assert_eq!(
        steps,
        vec![
            (Fault::Hold, "A→store".to_string(), None),
            (
                Fault::Heal,
                "A→store".to_string(),
                Some("B's wrote #1".to_string())
            ),
        ],
        "{verdict}"
    );
    assert_one_clock(&lines);
    let pids = worker_pids(&lines);
    assert_eq!(pids.len(), 4, "two workers per run");
    assert_gone(&pids);
    assert_run_left_nothing(run_id_of(&lines).unwrap());
}

#[test]
fn cut_off_from_redis_the_heartbeat_fails_and_the_stale_write_is_fenced() {
    cut_off("cut-off", "A→redis", "redis");
}

/// The etcd row: A's keepalive goes through the proxy, which cuts it; etcd expires A's lease
/// and deletes its key, hands the lock to B (queued in etcd), and A, told nothing, writes.
/// Fenced, A's token (its key's create revision) is lower than B's, and the store refuses it.
#[test]
fn cut_off_from_etcd_the_keepalive_fails_and_the_stale_write_is_fenced() {
    let lines = cut_off("cut-off-etcd", "A→etcd", "etcd");
    let tokens: Vec<i64> = lines
        .iter()
        .filter(|e| e.part.fencing == Some(true) && e.kind() == Kind::Acquired)
        .filter_map(|e| match &e.what {
            What::Acquired(a) => a.token,
            _ => None,
        })
        .collect();
    assert_eq!(tokens.len(), 2, "A's and B's revisions: {tokens:?}");
    assert!(tokens[0] < tokens[1], "A's key came first: {tokens:?}");
    let unfenced_tokens = lines
        .iter()
        .filter(|e| e.part.fencing == Some(false))
        .any(|e| matches!(&e.what, What::Wrote(w) if w.token.is_some()));
    assert!(
        !unfenced_tokens,
        "without fencing no token goes with a write"
    );
}

/// One cut (from Redis or etcd), both fencing settings, read back from the lock's server and
/// the store; returns the history.
fn cut_off(scenario: &str, path: &str, server: &str) -> Vec<Event> {
    let (lines, verdict, _) = run_json(&["network", "--ttl", "500ms", "--scenario", scenario]);
    for fenced in [false, true] {
        let log = history(&lines, scenario, fenced);
        // The cut is on A's path to the lock's server only, recorded before it acts and
        // healed after B wrote.
        let cut = position(
            &log,
            |e| matches!(&e.what, What::NetFault(f) if f.fault == Some(Fault::Cut)),
        );
        let heal = position(&log, |e| matches!(&e.what, What::NetHealed(_)));
        let What::NetFault(start) = &log[cut].what else {
            unreachable!()
        };
        assert_eq!(start.target.as_deref(), Some(path));
        // In the server's order of things: A's renewals gave up, A's key was gone, B was
        // granted, B wrote, the cut healed, A wrote.
        let lost = position(&log, |e| e.is("A", Kind::Lost));
        let gone = position(&log, |e| e.is(server, Kind::Expired));
        let granted = position(&log, |e| e.is("B", Kind::Acquired));
        let b_wrote = position(&log, |e| e.is("B", Kind::Wrote));
        let a_wrote = position(&log, |e| e.is("A", Kind::Wrote));
        assert!(
            cut < lost && gone < granted && granted < b_wrote && b_wrote < heal && heal < a_wrote
        );
        // A's first failed renewal came after the cut, before its give-up and B's grant.
        let failed = position(&log, |e| e.is("A", Kind::RenewalFailed));
        assert!(cut < failed && failed < lost && failed < granted);
        assert!(!log.iter().any(|e| e.kind() == Kind::Frozen), "no pause");

        let run = run_of(&verdict, scenario, fenced);
        assert_eq!(run["two_holders"], true, "{run}");
        assert_eq!(run["a_never_paused"], true, "{run}");
        assert_eq!(run["a_failed_first"], true, "{run}");
        for field in [
            "a_renewal_failed_ms",
            "a_renewal_lost_ms",
            "a_key_expired_ms",
            "b_granted_ms",
            "a_wrote_ms",
        ] {
            assert!(run[field].is_u64(), "{field}: {run}");
        }
        assert_late_write_fenced_or_not(run, fenced);
    }
    assert_gone(&worker_pids(&lines));
    assert_run_left_nothing(run_id_of(&lines).unwrap());
    assert_no_etcd_keys(run_id_of(&lines).unwrap());
    lines
}

/// The third row of the cut: A asks its heartbeat before each write and stops once it gave
/// the lock up. Its first write, sent while the heartbeat held the lock, is held in flight;
/// then the cut. The held write still lands after B's (refused when fenced); A's second
/// write is never sent, as the store's record shows.
#[test]
fn a_holder_that_stops_when_its_heartbeat_gives_up_still_lands_the_write_in_flight() {
    let scenario = "cut-off-stops";
    let (lines, verdict, _) = run_json(&["network", "--ttl", "500ms", "--scenario", scenario]);
    // The faults both runs played, as data: the hold, the cut once A had sent its write,
    // and both heals once B had written and A's heartbeat had given up.
    let both = Some("A's lost #1 and B's wrote #1".to_string());
    assert_eq!(
        played(&verdict["schedule"]),
        vec![
            (Fault::Hold, "A→store".to_string(), None),
            (
                Fault::Cut,
                "A→redis".to_string(),
                Some("A's checked #1".to_string())
            ),
            (Fault::Heal, "A→redis".to_string(), both.clone()),
            (Fault::Heal, "A→store".to_string(), both),
        ],
        "{verdict}"
    );
    assert_eq!(verdict["schedule"][1]["proxy"]["net"], "reset", "{verdict}");
    for fenced in [false, true] {
        let log = history(&lines, scenario, fenced);
        let fault = |fault: Fault, path: &'static str| {
            move |e: &Event| {
                matches!(&e.what, What::NetFault(f)
                    if f.fault == Some(fault) && f.target.as_deref() == Some(path))
            }
        };
        let hold = position(&log, fault(Fault::Hold, "A→store"));
        let cut = position(&log, fault(Fault::Cut, "A→redis"));
        // Both proxies' ports are printed, so that either can be sent a fault by hand.
        let opening = &log[0].text;
        for path in [
            "A→store goes through the fault proxy on 127.0.0.1:",
            "A→redis through another on 127.0.0.1:",
        ] {
            assert!(opening.contains(path), "{path}: {opening}");
        }
        let asks: Vec<(usize, bool)> = log
            .iter()
            .enumerate()
            .filter(|(_, e)| e.worker == "A")
            .filter_map(|(i, e)| match &e.what {
                What::Checked(c) => Some((i, c.heartbeat_lost?)),
                _ => None,
            })
            .collect();
        assert_eq!(
            asks.len(),
            2,
            "A asked before each of its two writes: {asks:?}"
        );
        let (sent, again) = (asks[0], asks[1]);
        assert!(!sent.1, "A's heartbeat held the lock when A sent its write");
        assert!(again.1, "A's heartbeat had given up when A asked again");
        let lost = position(&log, |e| e.is("A", Kind::Lost));
        let gone = position(&log, |e| e.is("redis", Kind::Expired));
        let granted = position(&log, |e| e.is("B", Kind::Acquired));
        let b_wrote = position(&log, |e| e.is("B", Kind::Wrote));
        let a_wrote = position(&log, |e| e.is("A", Kind::Wrote));
        // The write left A before the cut, while the heartbeat still held the lock.
        assert!(hold < sent.0 && sent.0 < cut && cut < lost && cut < gone);
        assert!(gone < granted && granted < b_wrote && b_wrote < a_wrote);
        assert!(lost < again.0 && a_wrote < again.0);
        let failed = position(&log, |e| e.is("A", Kind::RenewalFailed));
        assert!(cut < failed && failed < lost && failed < granted);
        let a_writes = log.iter().filter(|e| e.is("A", Kind::Wrote)).count();
        assert_eq!(a_writes, 1, "A sent no second write");
        assert!(!log.iter().any(|e| e.kind() == Kind::Frozen), "no pause");

        let run = run_of(&verdict, scenario, fenced);
        assert_eq!(run["a_next_write_stopped"], true, "{run}");
        assert_eq!(run["a_failed_first"], true, "{run}");
        assert_eq!(run["a_never_paused"], true, "{run}");
        assert_eq!(run["two_holders"], true, "{run}");
        for field in [
            "a_write_sent_ms",
            "a_renewal_failed_ms",
            "a_renewal_lost_ms",
            "a_key_expired_ms",
            "b_granted_ms",
            "a_wrote_ms",
            "a_asked_again_ms",
        ] {
            assert!(run[field].is_u64(), "{field}: {run}");
        }
        // Read back from the store: one attempt of A's, decided after B's accepted write.
        assert_eq!(writers(run), vec![("B", true), ("A", !fenced)], "{run}");
        assert_late_write_fenced_or_not(run, fenced);
    }
    assert_gone(&worker_pids(&lines));
    assert_run_left_nothing(run_id_of(&lines).unwrap());
}

/// A's late write: taken unfenced (A has the last word), refused fenced (B keeps it).
fn assert_late_write_fenced_or_not(run: &Value, fenced: bool) {
    let (late, last) = if fenced {
        ("rejected", "B")
    } else {
        ("accepted", "A")
    };
    assert_eq!(run["late_write"], late, "{run}");
    assert_eq!(run["final_writer"], last, "{run}");
}

/// No key of the run is left in etcd (a lock key, a waiter's key).
fn assert_no_etcd_keys(run_id: &str) {
    let runtime = lockslab::connect::etcd_runtime().unwrap();
    let left = runtime.block_on(async {
        let mut etcd = etcd_client_of(&servers().etcd).await;
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_keys_only();
        etcd.get(format!("lockslab:{run_id}:"), Some(options))
            .await
            .unwrap()
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect::<Vec<_>>()
    });
    assert!(left.is_empty(), "etcd keys left behind: {left:?}");
}

#[test]
fn ctrl_c_while_a_write_is_held_in_the_proxy_leaves_nothing_behind() {
    let mut lab = lockslab(&[
        "network",
        "--ttl",
        "5s",
        "--fencing",
        "off",
        "--scenario",
        "delayed-write",
        "--json",
    ])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(lab.stdout.take().unwrap()).lines();
    let (mut pids, mut run_id, mut held) = (Vec::new(), String::new(), false);
    for line in lines.by_ref() {
        let Some(event) = event_line(&line.unwrap()) else {
            continue;
        };
        if event.kind() == Kind::Waiting {
            pids.push(event.pid().unwrap());
        }
        if let Some(id) = event.run_id() {
            run_id = id.to_string();
        }
        // A's write is in the proxy once A has checked its lock under the hold.
        if event.is("A", Kind::Checked) {
            held = true;
            break;
        }
    }
    assert!(held, "the lab ended before A's write was held");
    kill(Pid::from_raw(lab.id() as i32), Signal::SIGINT).unwrap();
    let status = lab.wait().unwrap();
    assert_eq!(status.code(), Some(130), "Ctrl-C exits with 130");
    assert_eq!(pids.len(), 1, "only A was started: {pids:?}");
    assert_gone(&pids);
    assert_run_left_nothing(&run_id);
}

/// A recorded run (tests/fixtures/network.jsonl, `lockslab network --json` at the defaults:
/// every story, both fencing settings) replayed with no servers through the lab's own
/// evidence reading and checkers: each run of the delayed write and of the three cuts
/// (Redis, the holder that stops, etcd) comes back as recorded. The lost replies' verdicts
/// rest partly on read-backs the history does not carry (the key's holder at the end); for
/// etcd's lock call the test checks that each part is in the history, and that what it
/// does carry (the read-back after the loss, the new lease's wait) says what the verdict says.
#[test]
fn a_recorded_history_replays_to_its_recorded_verdict() {
    let (lines, recorded) = events_and_verdict(include_str!("fixtures/network.jsonl"));
    let recorded = &recorded;
    let runs = recorded["runs"].as_array().unwrap();
    let scenarios = lockslab::labs::network::verdict::RUN_SCENARIOS;
    assert_eq!(
        runs.len(),
        2 * scenarios.len(),
        "every story, both fencing settings"
    );
    // Each run judged again by the lab's own replay (what `lockslab check` runs): every
    // field of its verdict.
    let replayed = lockslab::labs::network::replay(&lines, recorded).unwrap();
    assert_eq!(replayed.parts.len(), runs.len());
    assert_every_recorded_field_replayed(&replayed);

    // etcd's lost lock call: one part per policy, then the queued call.
    let lost_lock = recorded["lost_lock"].as_array().unwrap();
    let policies: Vec<&str> = lost_lock
        .iter()
        .map(|l| l["policy"].as_str().unwrap())
        .collect();
    assert_eq!(policies, ["same-owner", "new-owner", "give-up"]);
    let part = |name: &str| -> Vec<&Event> {
        let tag = format!("lost-reply:etcd-{name}");
        lines
            .iter()
            .filter(|e| e.part.scenario.as_deref() == Some(tag.as_str()))
            .collect()
    };
    for (found, name) in lost_lock.iter().zip(["same-lease", "new-lease", "give-up"]) {
        let events = part(name);
        // The lab's read-back right after the loss found a key under the lock's name.
        let after_loss = events.iter().find_map(|e| match &e.what {
            What::HolderNow(h) => h.holder.clone(),
            _ => None,
        });
        assert_eq!(after_loss.is_some(), found["applied"], "{name}: {found}");
        let waited = events.iter().find_map(|e| match &e.what {
            What::Acquired(a) if e.worker == "A" => a.waited_ms,
            _ => None,
        });
        assert_eq!(
            waited.map(Value::from).unwrap_or(Value::Null),
            found["waited_ms"],
            "{name}: {found}"
        );
    }
    assert!(
        !part("queued").is_empty(),
        "the queued call is in the history"
    );
    assert!(recorded["lost_lock_queued"].is_object(), "{recorded}");
}

/// A heartbeat whose Redis stops answering (the proxy swallows every byte both ways: no
/// reset, no error) gives the lock up while the lease still runs, counted from its last
/// renewal, instead of waiting out the client's own 5s timeout long past the lease.
#[test]
fn a_heartbeat_cut_off_by_silence_gives_up_before_its_lease_runs_out() {
    use lockslab::lock::redis::{RedisLock, Renewal};
    use lockslab::proxy::{self, NetFault, Proxy};
    use std::time::Duration;

    let redis = &servers().redis;
    let mut proxied = Proxy::start("test→redis", proxy::upstream_of(redis).unwrap()).unwrap();
    let url = proxy::through(redis, proxied.addr()).unwrap();
    let key = format!("lockslab:test-silence:{}", std::process::id());
    // Long enough that the give-up margin (a tenth: 600ms) dwarfs a busy machine's delays.
    let ttl = Duration::from_secs(6);
    let mut lock = RedisLock::new(lockslab::connect::redis(&url).unwrap(), &key, ttl);
    let held = lock.try_acquire().unwrap().expect("a free key");
    let beat = RedisLock::new(lockslab::connect::redis(&url).unwrap(), &key, ttl);
    let (tx, rx) = std::sync::mpsc::channel();
    let renewal = Renewal::start(beat, held, Box::new(move |why| tx.send(why).unwrap()));
    // Let one renewal through (every TTL/3), then go silent.
    std::thread::sleep(Duration::from_millis(2_400));
    proxied.set(Direction::Up, NetFault::BlackHole);
    proxied.set(Direction::Down, NetFault::BlackHole);
    let why = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the heartbeat never gave up");
    renewal.stop();
    proxied.stop();
    // "no renewal for {n}ms of a 6000ms TTL": the heartbeat's own count, on its clock.
    let silent_ms: u64 = why
        .split("no renewal for ")
        .nth(1)
        .and_then(|rest| rest.split("ms").next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{why}"));
    assert!(
        silent_ms < ttl.as_millis() as u64,
        "it gave up {silent_ms}ms after its last renewal, past the {ttl:?} lease: {why}"
    );
    let mut redis = lockslab::connect::redis(redis).unwrap();
    let _: () = ::redis::cmd("DEL").arg(&key).query(&mut *redis).unwrap();
}

/// The heartbeat counts its first lease from the send of the `SET NX PX` that won it, not
/// from the reply: the grant's answer comes back 3s late (half the lease gone on the way),
/// then Redis goes silent. The heartbeat gives the lock up within the lease as Redis counts
/// it (from the send at the latest). Counted from the reply, as before the fix, it would
/// have held on until ~8.4s after the send, 2.4s after Redis let the key go.
#[test]
fn a_heartbeat_counts_its_first_lease_from_the_send_not_from_a_slow_reply() {
    use lockslab::lock::redis::{RedisLock, Renewal};
    use lockslab::proxy::{self, NetFault, Proxy};
    use std::time::{Duration, Instant};

    let redis = &servers().redis;
    let mut proxied = Proxy::start("test→redis", proxy::upstream_of(redis).unwrap()).unwrap();
    let url = proxy::through(redis, proxied.addr()).unwrap();
    let key = format!("lockslab:test-slow-grant:{}", std::process::id());
    let ttl = Duration::from_secs(6);
    let mut lock = RedisLock::new(lockslab::connect::redis(&url).unwrap(), &key, ttl);
    let beat = RedisLock::new(lockslab::connect::redis(&url).unwrap(), &key, ttl);
    proxied.set(
        Direction::Down,
        NetFault::Delay {
            ms: 3_000,
            jitter_ms: 0,
        },
    );
    let sent = Instant::now();
    let held = lock.try_acquire().unwrap().expect("a free key");
    proxied.set(Direction::Up, NetFault::BlackHole);
    proxied.set(Direction::Down, NetFault::BlackHole);
    let (tx, rx) = std::sync::mpsc::channel();
    let renewal = Renewal::start_from(
        beat,
        held,
        sent,
        Box::new(move |why| tx.send((Instant::now(), why)).unwrap()),
    );
    let (gave_up, why) = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the heartbeat never gave up");
    renewal.stop();
    proxied.stop();
    assert!(
        gave_up - sent < ttl,
        "it gave up {:?} after the send, past the {ttl:?} lease Redis counted from it: {why}",
        gave_up - sent
    );
    let mut redis = lockslab::connect::redis(redis).unwrap();
    let _: () = ::redis::cmd("DEL").arg(&key).query(&mut *redis).unwrap();
}

/// A reply lost after the server applied the request: Redis and Postgres read back, and
/// each client policy's outcome from the servers.
#[test]
fn a_lost_reply_was_applied_and_each_policy_ends_as_the_servers_say() {
    let (lines, verdict, _) = run_json(&["network", "--ttl", "500ms", "--scenario", "lost-reply"]);
    // Six requests let through with their answers lost: three SETs, three COMMITs (two
    // payments, one fenced write).
    let dropped: Vec<&Event> = lines
        .iter()
        .filter(|e| matches!(&e.what, What::NetFault(f) if f.fault == Some(Fault::DropReply)))
        .collect();
    assert_eq!(dropped.len(), 6, "{dropped:#?}");
    assert_eq!(
        lines
            .iter()
            .filter(|e| matches!(&e.what, What::NetHealed(f) if f.lasted_ms.is_some()))
            .count(),
        6 + 4,
        "and four etcd lock calls whose answers the proxy swallowed"
    );
    // Each part played its fault and heal from a schedule of its own, carried in order (a
    // part whose schedule came out the same as an earlier one's, to the millisecond, is
    // carried once).
    let mut parts: Vec<Vec<(Fault, String, Option<String>)>> = (verdict["schedules"].as_array())
        .expect("one schedule per part")
        .iter()
        .map(played)
        .collect();
    parts.dedup();
    let lost = |path: &str| {
        vec![
            (Fault::DropReply, path.to_string(), None),
            (Fault::Heal, path.to_string(), None),
        ]
    };
    let swallowed = vec![
        (Fault::Cut, "A→etcd".to_string(), None),
        (Fault::Heal, "A→etcd".to_string(), None),
    ];
    let expected = vec![
        lost("A→redis"),
        lost("A→postgres"),
        lost("A→store"),
        swallowed,
    ];
    assert_eq!(parts, expected, "{verdict}");
    let etcd = (verdict["schedules"].as_array().unwrap().last()).unwrap();
    assert_eq!(etcd[0]["proxy"]["net"], "black_hole", "{verdict}");
    assert_eq!(etcd[0]["direction"], "down", "{verdict}");
    assert_eq!(etcd[1]["direction"], "down", "{verdict}");
    // Right after each lost SET, Redis holds the value A sent.
    let held: Vec<&Event> = lines
        .iter()
        .filter(|e| {
            e.worker == "redis" && matches!(&e.what, What::HolderNow(h) if h.holder.is_some())
        })
        .collect();
    assert_eq!(held.len(), 3, "{held:#?}");

    let sets = verdict["lost_set"].as_array().unwrap();
    let policy = |name: &str| {
        sets.iter()
            .find(|s| s["policy"] == name)
            .unwrap_or_else(|| panic!("no {name} in {verdict}"))
    };
    for set in sets {
        assert_eq!(set["applied"], true, "{set}");
        assert_eq!(set["a_knows"], true, "{set}");
    }
    let same = policy("same-owner");
    assert_eq!(
        (
            same["waited_behind_itself"].as_bool(),
            same["orphaned"].as_bool()
        ),
        (Some(false), Some(false))
    );
    let new = policy("new-owner");
    assert_eq!(new["waited_behind_itself"], true, "{new}");
    assert!(new["waited_ms"].as_u64().unwrap() > 0);
    // The first value held the lock while A waited behind it: nobody worked under it.
    assert_eq!(new["orphaned"], true, "{new}");
    assert!(
        new["orphaned_ms"].as_u64() >= new["waited_ms"].as_u64(),
        "{new}"
    );
    let gave_up = policy("give-up");
    assert_eq!(gave_up["orphaned"], true, "{gave_up}");
    assert!(lines.iter().any(|e| e.is("redis", Kind::Expired)));

    let commits = verdict["lost_commit"].as_array().unwrap();
    let commit = |keyed: bool| {
        commits
            .iter()
            .find(|c| c["idempotency_key"] == keyed)
            .unwrap()
    };
    // The answer lost is the COMMIT's: 12 bytes forwarded ('Q', length, "COMMIT\0"), and
    // nothing else (a statement's Close sent ahead of it once took the drop instead).
    let lost_commits = lines
        .iter()
        .filter(|e| e.text.contains("sent A's COMMIT on"))
        .count();
    assert_eq!(lost_commits, 3);
    assert!(
        lines
            .iter()
            .filter(|e| e.text.contains("sent A's COMMIT on"))
            .all(|e| e.text.contains("COMMIT on (12 bytes)")),
        "another request took the COMMIT's drop"
    );
    for keyed in [false, true] {
        assert_eq!(commit(keyed)["committed"], true, "{}", commit(keyed));
    }
    assert_eq!(
        (
            commit(false)["rows"].as_u64(),
            commit(false)["doubled"].as_bool()
        ),
        (Some(2), Some(true))
    );
    assert_eq!(
        (
            commit(true)["rows"].as_u64(),
            commit(true)["doubled"].as_bool()
        ),
        (Some(1), Some(false))
    );
    // The store's read-backs: one counted a payment twice, one once.
    let counted = |twice: bool| {
        lines.iter().any(|e| {
            e.is("postgres", Kind::TablesRead)
                && observed(e).is_some_and(|o| (o.counted_wrong() > 0) == twice)
        })
    };
    assert!(counted(true) && counted(false));

    // Fencing does not make a retry safe: the fenced write whose answer was lost had been
    // accepted, and its retry with the same token is accepted again (not lower than
    // itself). The store's attempt log holds both, decided one after the other.
    let fenced: Vec<&Event> = lines
        .iter()
        .filter(|e| e.part.scenario.as_deref() == Some("lost-reply:fenced-retry"))
        .collect();
    let outcomes: Vec<(Option<i64>, Outcome)> = fenced
        .iter()
        .filter_map(|e| match &e.what {
            What::Wrote(w) if e.worker == "A" => Some((w.token, w.outcome)),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        [(Some(1), Outcome::Unknown), (Some(1), Outcome::Accepted)],
        "{fenced:#?}"
    );
    let twice = fenced
        .iter()
        .find(|e| {
            e.is("postgres", Kind::TablesRead) && observed(e).is_some_and(|o| o.counted_wrong() > 0)
        })
        .unwrap_or_else(|| panic!("the store took the retry too: {fenced:#?}"));
    assert_eq!(
        observed(twice).and_then(|o| o.duplicates),
        Some(1),
        "{twice:?}"
    );
    assert!(
        twice
            .text
            .contains("2 accepted attempts with token 1 (decisions 1 and 2)"),
        "{twice:?}"
    );
    // The verdict says so too, beside the payments.
    let retry = &verdict["lost_fenced_retry"];
    assert_eq!(
        (
            &retry["token"],
            &retry["committed"],
            &retry["accepted"],
            &retry["doubled"]
        ),
        (&1.into(), &true.into(), &2.into(), &true.into()),
        "{verdict}"
    );
    assert_eq!(retry["decisions"], serde_json::json!([1, 2]), "{retry}");

    // etcd's lock call: applied, its answer swallowed, then each retry as etcd answers it.
    let swallowed = lines
        .iter()
        .filter(|e| {
            matches!(&e.what, What::NetFault(f)
                if f.fault == Some(Fault::Cut) && f.direction == Some(Direction::Down)
                    && f.target.as_deref() == Some("A→etcd"))
        })
        .count();
    assert_eq!(swallowed, 4, "three retries and the queued call");
    let locks = verdict["lost_lock"].as_array().unwrap();
    let lock = |name: &str| locks.iter().find(|s| s["policy"] == name).unwrap();
    for found in locks {
        assert_eq!(found["applied"], true, "{found}");
        assert_eq!(found["a_knows"], true, "{found}");
    }
    assert_eq!(lock("same-owner")["waited_behind_itself"], false);
    assert_eq!(lock("new-owner")["waited_behind_itself"], true);
    assert!(lock("new-owner")["waited_ms"].as_u64().unwrap() > 0);
    assert_eq!(
        lock("new-owner")["orphaned"],
        true,
        "A's first key held it meanwhile"
    );
    assert_eq!(lock("give-up")["orphaned"], true);
    assert!(lines.iter().any(|e| e.is("etcd", Kind::Expired)));
    let queued = &verdict["lost_lock_queued"];
    // The lab's own etcd has auth on, so etcd's lock service cannot delete the cancelled
    // waiter's key (etcd-io/etcd#13330): it outlives its call and connection, and gets the
    // lock when the holder lets go. The verdict says auth was on, which is why.
    assert_eq!(queued["auth"], true, "{queued}");
    assert_eq!(queued["key_left"], true, "{queued}");
    assert_eq!(queued["handed_to_a"], true, "{queued}");

    let run_id = verdict["run_id"].as_str().unwrap();
    assert_run_left_nothing(run_id);
    assert_no_etcd_keys(run_id);
    let mut db = lockslab::connect::postgres(&servers().postgres).unwrap();
    let payments: i64 = db
        .query_one(
            "SELECT count(*) FROM lockslab_network_payment WHERE run_id = $1",
            &[&run_id],
        )
        .unwrap()
        .get(0);
    assert_eq!(payments, 0, "the run's payments are removed");
}

/// A `lockslab proxy --to redis` running (the URL and its password from LOCKSLAB_REDIS_URL,
/// not from argv), where it listens, and the rest of its output (kept open while it runs).
fn proxy_by_hand() -> (
    std::process::Child,
    std::net::SocketAddr,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut proxy = lockslab(&["proxy", "--to", "redis"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(proxy.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    // "proxy 127.0.0.1:PORT → …"
    let addr = first.split_whitespace().nth(1).unwrap().parse().unwrap();
    (proxy, addr, lines)
}

/// `lockslab proxy` by hand: a client behind it, a hold from a second command, then
/// Ctrl-C mid-fault: it exits 130 and leaves no port, no control socket, no child.
#[test]
fn the_proxy_by_hand_takes_faults_from_another_command_and_ctrl_c_leaves_nothing() {
    use lockslab::labs::network::by_hand::control_socket;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::time::Duration;

    let (mut proxy, addr, _output) = proxy_by_hand();
    let socket = control_socket(addr.port());
    assert!(socket.exists());

    let url = lockslab::proxy::through(&servers().redis, addr).unwrap();
    let mut client = lockslab::connect::redis(&url).unwrap();
    let pong: String = ::redis::cmd("PING").query(&mut *client).unwrap();
    assert_eq!(pong, "PONG");

    let fault = |words: &[&str]| {
        let port = addr.port().to_string();
        let mut args = vec!["proxy", "fault", port.as_str()];
        args.extend_from_slice(words);
        let out = lockslab(&args).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(fault(&["hold"]).contains("up hold"));
    // A raw request under the hold: no answer while it lasts.
    let mut raw = TcpStream::connect(addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    raw.write_all(b"PING\r\n").unwrap();
    let mut buffer = [0u8; 64];
    assert!(raw.read(&mut buffer).is_err(), "held: no answer");
    // Ctrl-C mid-fault, the request still held.
    let children = children_of(proxy.id());
    kill(Pid::from_raw(proxy.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(proxy.wait().unwrap().code(), Some(130));
    assert!(
        children.is_empty(),
        "the proxy starts no process: {children:?}"
    );
    assert!(!socket.exists(), "the control socket is removed");
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_err(),
        "nothing listens on the port"
    );
    raw.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    assert!(
        matches!(raw.read(&mut buffer), Ok(0) | Err(_)),
        "the held connection is closed"
    );
}

/// Two proxies on one port number (127.0.0.1:P and [::1]:P) would share one control socket:
/// the second is refused while the first answers on it. Once the first is killed with no
/// chance to clean up, a fault names it gone and removes the stale socket.
#[test]
fn a_second_proxy_on_the_same_port_is_refused_and_a_killed_ones_socket_is_named_stale() {
    use lockslab::labs::network::by_hand::control_socket;

    let (mut first, addr, _output) = proxy_by_hand();
    let port = addr.port().to_string();
    let socket = control_socket(addr.port());

    let listen = format!("[::1]:{port}");
    let second = lockslab(&["proxy", "--to", "redis", "--listen", &listen])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(4), "{text}");
    assert!(text.contains("another `lockslab proxy` on port"), "{text}");
    let fault = lockslab(&["proxy", "fault", &port, "hold"])
        .output()
        .unwrap();
    assert!(
        fault.status.success(),
        "the first still takes faults: {fault:?}"
    );

    kill(Pid::from_raw(first.id() as i32), Signal::SIGKILL).unwrap();
    first.wait().unwrap();
    assert!(socket.exists(), "a killed proxy leaves its socket file");
    let fault = lockslab(&["proxy", "fault", &port, "heal"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&fault.stderr);
    assert_eq!(fault.status.code(), Some(4), "{text}");
    assert!(
        text.contains(&format!(
            "the proxy on port {port} is gone (stale control socket"
        )),
        "{text}"
    );
    assert!(!socket.exists(), "the stale socket is removed");
}

/// The proxy's faults against a real Redis, each read back on a direct connection: a hold
/// released after the client gave up still lands its request; a black hole swallows it for
/// good; a cut mid-request leaves half a command that Redis never runs.
#[test]
fn each_fault_against_a_real_redis_as_redis_reads_back() {
    use lockslab::proxy::{self, NetFault, Proxy};
    use std::io::{Read, Write};
    use std::time::{Duration, Instant};

    let url = &servers().redis;
    let path = Proxy::start("t→redis", proxy::upstream_of(url).unwrap()).unwrap();
    let mut direct = lockslab::connect::redis(url).unwrap();
    let run = format!("lockslab:proxy-test:{}", std::process::id());
    let get = |direct: &mut lockslab::connect::RedisConn, key: &str| -> Option<String> {
        redis::cmd("GET").arg(key).query(&mut **direct).unwrap()
    };
    let raw = || {
        let stream = std::net::TcpStream::connect(path.addr()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        stream
    };
    let password = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.rsplit_once('@'))
        .and_then(|(user, _)| user.split_once(':'))
        .map(|(_, pw)| pw.to_string())
        .unwrap();
    let command = |parts: &[&str]| {
        let mut out = format!("*{}\r\n", parts.len());
        for part in parts {
            out.push_str(&format!("${}\r\n{part}\r\n", part.len()));
        }
        out.into_bytes()
    };
    let auth = |stream: &mut std::net::TcpStream| {
        stream.write_all(&command(&["AUTH", &password])).unwrap();
        let mut ok = [0u8; 5];
        stream.read_exact(&mut ok).unwrap();
        assert_eq!(&ok, b"+OK\r\n");
    };

    // A hold, and a client that gives up and goes: its SET still lands once released.
    let held = format!("{run}:held");
    let mut client = raw();
    auth(&mut client);
    path.set(Direction::Up, NetFault::Hold);
    client.write_all(&command(&["SET", &held, "late"])).unwrap();
    let mut buffer = [0u8; 64];
    assert!(client.read(&mut buffer).is_err(), "no answer in time");
    drop(client);
    assert_eq!(get(&mut direct, &held), None, "still held");
    path.clear(Direction::Up);
    let deadline = Instant::now() + Duration::from_secs(3);
    while get(&mut direct, &held).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(get(&mut direct, &held).as_deref(), Some("late"));

    // A black hole: the SET is swallowed, and healing does not bring it back.
    let lost = format!("{run}:lost");
    let mut client = raw();
    auth(&mut client);
    path.set(Direction::Up, NetFault::BlackHole);
    client.write_all(&command(&["SET", &lost, "x"])).unwrap();
    assert!(client.read(&mut buffer).is_err(), "nothing comes back");
    path.clear(Direction::Up);
    let mut client_ok = raw();
    auth(&mut client_ok);
    assert_eq!(get(&mut direct, &lost), None, "swallowed, not delayed");

    // A cut mid-request: half a SET reached Redis, the rest never does.
    let half = format!("{run}:half");
    let mut client = raw();
    auth(&mut client);
    let full = command(&["SET", &half, "x"]);
    client.write_all(&full[..full.len() / 2]).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    path.set(Direction::Up, NetFault::Reset);
    let rest = client.write_all(&full[full.len() / 2..]);
    let answer = client.read(&mut buffer);
    assert!(
        rest.is_err() || matches!(answer, Ok(0) | Err(_)),
        "{answer:?}"
    );
    path.clear(Direction::Up);
    assert_eq!(
        get(&mut direct, &half),
        None,
        "Redis never ran half a command"
    );

    let _: i64 = redis::cmd("DEL")
        .arg(&held)
        .arg(&lost)
        .arg(&half)
        .query(&mut *direct)
        .unwrap();
}

/// A child killed and reaped when dropped: a failed assertion leaves no proxy running.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `lockslab proxy --to redis --listen ADDR` with `env` changed, as `proxy_by_hand`;
/// `prefix` runs before it (`prlimit …`).
fn proxy_with(
    prefix: &[&str],
    listen: &str,
    env: &[(&str, &std::path::Path)],
) -> (
    Reaped,
    std::net::SocketAddr,
    std::io::Lines<BufReader<std::process::ChildStdout>>,
) {
    let mut command = std::process::Command::new(prefix.first().copied().unwrap_or(BIN));
    if let Some((_, args)) = prefix.split_first() {
        command.args(args).arg(BIN);
    }
    command.args(["proxy", "--to", "redis", "--listen", listen]);
    // The environment `lockslab()` gives: the test's servers.
    for (var, value) in lockslab(&[]).get_envs() {
        match value {
            Some(value) => command.env(var, value),
            None => command.env_remove(var),
        };
    }
    for (var, value) in env {
        command.env(var, value);
    }
    let mut proxy = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(proxy.stdout.take().unwrap()).lines();
    let first = match lines.next() {
        Some(Ok(line)) => line,
        _ => {
            let mut stderr = String::new();
            std::io::Read::read_to_string(&mut proxy.stderr.take().unwrap(), &mut stderr).unwrap();
            panic!("the proxy did not start: {:?}: {stderr}", proxy.wait());
        }
    };
    let addr = first.split_whitespace().nth(1).unwrap().parse().unwrap();
    (Reaped(proxy), addr, lines)
}

/// Issue 40, row 7: another local user opened ~400 connections to a `lockslab proxy`; out of
/// file descriptors, its control socket's `accept` failed and ended the proxy. Now it
/// relays as many connections as its descriptors allow, resets the rest, and its control
/// socket still answers; once they close it serves again.
#[test]
fn a_proxy_out_of_file_descriptors_keeps_serving_and_taking_faults() {
    use std::net::TcpStream;

    let (mut proxy, addr, _output) =
        proxy_with(&["prlimit", "--nofile=64:64", "--"], "127.0.0.1:0", &[]);
    let port = addr.port().to_string();
    // Far more connections than 64 descriptors hold.
    let flood: Vec<TcpStream> = (0..200)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    assert!(flood.len() > 20, "{} connections opened", flood.len());
    let fault = |words: &[&str]| {
        let mut args = vec!["proxy", "fault", port.as_str()];
        args.extend_from_slice(words);
        lockslab(&args).output().unwrap()
    };
    let held = fault(&["hold"]);
    assert!(
        held.status.success(),
        "the control socket under the flood: {held:?}"
    );
    assert!(proxy.0.try_wait().unwrap().is_none(), "the proxy ended");
    let healed = fault(&["heal"]);
    assert!(healed.status.success(), "{healed:?}");
    drop(flood);
    // The flood gone, a client gets through: Redis answers it (that it wants a password
    // first is an answer too). A connection refused while the flood's were still closing
    // is tried again.
    let served = eventually(std::time::Duration::from_secs(30), || {
        let Ok(mut client) = TcpStream::connect(addr) else {
            return false;
        };
        let _ = client.set_read_timeout(Some(std::time::Duration::from_secs(3)));
        let mut answer = [0u8; 64];
        std::io::Write::write_all(&mut client, b"PING\r\n").is_ok()
            && std::io::Read::read(&mut client, &mut answer).is_ok_and(|n| {
                answer[..n].starts_with(b"+PONG") || answer[..n].starts_with(b"-NOAUTH")
            })
    });
    assert!(served, "the proxy serves again once the flood closed");
    assert!(proxy.0.try_wait().unwrap().is_none(), "the proxy ended");
    kill(Pid::from_raw(proxy.0.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(proxy.0.wait().unwrap().code(), Some(130));
}

/// Issue 40, row 7: a file another user put at `/tmp/lockslab-proxy-<port>.sock` kept a
/// proxy from starting. Now the control socket is in a directory of this user's (mode
/// 0700, in the state directory); a stale socket of its own is replaced, and a file it
/// does not own is refused with a message, never removed.
#[test]
fn a_taken_socket_name_does_not_stop_a_proxy_and_a_foreign_file_is_named() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    let tmp = tempfile::tempdir().unwrap();
    let env = [
        ("TMPDIR", tmp.path()),
        ("LOCKSLAB_STATE_DIR", std::path::Path::new("")),
        ("XDG_RUNTIME_DIR", std::path::Path::new("")),
    ];
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    // The old name, taken by "another user": a directory, which no remove_file removes.
    let squat = tmp.path().join(format!("lockslab-proxy-{port}.sock"));
    std::fs::create_dir(&squat).unwrap();
    let root = nix::unistd::Uid::effective().is_root();
    if root {
        nix::unistd::chown(&squat, Some(65534.into()), Some(65534.into())).unwrap();
    }
    let (mut proxy, _, _output) = proxy_with(&[], &listen, &env);
    let dir = tmp
        .path()
        .join(format!("lockslab-{}", nix::unistd::Uid::effective()))
        .join("proxy");
    let socket = dir.join(format!("proxy-{port}.sock"));
    assert!(socket.exists(), "no control socket at {}", socket.display());
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert_eq!(meta.uid(), nix::unistd::Uid::effective().as_raw());
    let fault = lockslab(&["proxy", "fault", &port.to_string(), "hold"])
        .envs(env)
        .output()
        .unwrap();
    assert!(fault.status.success(), "{fault:?}");

    // Killed with no chance to clean up: its socket stays, and the next proxy replaces it.
    kill(Pid::from_raw(proxy.0.id() as i32), Signal::SIGKILL).unwrap();
    proxy.0.wait().unwrap();
    assert!(socket.exists());
    let (mut again, _, _output) = proxy_with(&[], &listen, &env);
    kill(Pid::from_raw(again.0.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(again.0.wait().unwrap().code(), Some(130));
    assert!(!socket.exists(), "removed at the end");

    if root {
        // A file of another user's where the socket goes: refused, named, left alone.
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(&socket, "").unwrap();
        nix::unistd::chown(&socket, Some(65534.into()), Some(65534.into())).unwrap();
        let refused = lockslab(&["proxy", "--to", "redis", "--listen", &listen])
            .envs(env)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(4), "{said}");
        assert!(said.contains("belongs to user 65534"), "{said}");
        assert!(socket.exists(), "another user's file is left alone");

        // The state directory's own name in the temp directory, taken by another user: the
        // proxy warns and puts its socket in a directory of a random name, where a fault
        // from another command finds it.
        let state = dir.parent().unwrap();
        std::fs::remove_dir_all(state).unwrap();
        std::fs::create_dir(state).unwrap();
        nix::unistd::chown(state, Some(65534.into()), Some(65534.into())).unwrap();
        let (mut elsewhere, _, _output) = proxy_with(&[], &listen, &env);
        let fault = lockslab(&["proxy", "fault", &port.to_string(), "hold"])
            .envs(env)
            .output()
            .unwrap();
        assert!(fault.status.success(), "{fault:?}");
        kill(Pid::from_raw(elsewhere.0.id() as i32), Signal::SIGINT).unwrap();
        let said = {
            let mut said = String::new();
            std::io::Read::read_to_string(&mut elsewhere.0.stderr.take().unwrap(), &mut said)
                .unwrap();
            said
        };
        assert_eq!(elsewhere.0.wait().unwrap().code(), Some(130), "{said}");
        assert!(said.contains("is not a directory of yours"), "{said}");
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("lockslab-proxy-")
            })
            .filter(|entry| entry.path().is_dir() && entry.path() != squat)
            .collect();
        assert!(left.is_empty(), "its directory is removed: {left:?}");
    }
}
