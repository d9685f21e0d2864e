//! Lab 6, `lockslab redlock`: each scenario's verdict against the masters the lab starts
//! itself, the release-everywhere rule on a real Redis, and what a run leaves behind —
//! after a normal end and after Ctrl-C.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use lockslab::check::Finding;
use lockslab::check::redlock::{self as check, MasterState};
use lockslab::lock::redlock::{Master, Redlock, Reply, RoundOrder, Settings};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

fn scenario<'a>(verdict: &'a Value, name: &str) -> &'a Value {
    verdict["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no scenario {name} in {verdict}"))
}

/// The masters a run announced in its `run` event: (port, dir).
fn masters_of(events: &[Event]) -> Vec<(String, String)> {
    let masters = events
        .iter()
        .find_map(|e| match &e.what {
            What::Run(run) => run.masters.as_ref(),
            _ => None,
        })
        .expect("a run event listing the masters");
    masters
        .iter()
        .map(|m| (m.port.clone(), m.dir.clone().unwrap()))
        .collect()
}

/// No redis-server of the run is left (running, stopped or zombie), and no directory.
fn assert_masters_gone(masters: &[(String, String)]) {
    assert!(!masters.is_empty());
    for (port, dir) in masters {
        let left: Vec<_> = process_table()
            .into_iter()
            .filter(|p| p.cmdline.contains(&format!("127.0.0.1:{port}")))
            .collect();
        assert!(
            left.is_empty(),
            "the master on port {port} is still there: {left:?}"
        );
        assert!(
            !std::path::Path::new(dir).exists(),
            "the master's directory {dir} is still there"
        );
    }
}

#[test]
fn every_scenario_reads_its_verdict_from_the_masters_and_the_store() {
    let (lines, verdict, _) = run_json(&["redlock"]);
    assert_one_clock(&lines);
    assert_eq!(verdict["lab"], "redlock");
    assert_eq!(verdict["masters"], 5);
    assert_eq!(verdict["quorum"], 3);
    let q = 3;

    // 1. A minority down: granted; frozen: granted, with less validity; a majority down:
    // not granted, and no master that answered keeps the failed round's key.
    let down = scenario(&verdict, "minority-down");
    assert_eq!(down["granted"], true, "{down}");
    let frozen = scenario(&verdict, "minority-frozen");
    assert_eq!(frozen["granted"], true, "{frozen}");
    // The deciding round is the last: on a busy machine a master the lab left alone may miss
    // the per-instance timeout, and A tries again (the meaning says so).
    let last_round = |s: &Value| s["rounds"].as_array().unwrap().last().unwrap().clone();
    let frozen_answers = last_round(frozen)["answers"].as_array().unwrap().clone();
    assert_eq!(
        frozen_answers
            .iter()
            .filter(|a| a["reply"] == "no_answer")
            .count(),
        2,
        "the two frozen masters count as no: {frozen}"
    );
    // A frozen master costs the whole per-instance timeout (the client gives up on it: the
    // client library's timeout); a down one refuses at once. How much validity that costs
    // is a timing, printed by benches/redlock.rs.
    let silent_why = |s: &Value| -> Vec<String> {
        last_round(s)["answers"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["reply"] == "no_answer")
            .map(|a| a["why"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        silent_why(frozen),
        ["no answer in time", "no answer in time"],
        "{frozen}"
    );
    let down_why = silent_why(down);
    assert_eq!(down_why.len(), 2, "{down}");
    assert!(
        down_why.iter().all(|why| why != "no answer in time"),
        "a down master does not make the client wait: {down}"
    );
    // The verdict names the round's length as the timeline's arithmetic does: rounded up.
    let elapsed = last_round(frozen)["elapsed_ms"].as_f64().unwrap().ceil();
    assert!(
        frozen["meaning"]
            .as_str()
            .unwrap()
            .contains(&format!("Of the round's {elapsed}ms")),
        "{frozen}"
    );
    let majority = scenario(&verdict, "majority-down");
    assert_eq!(majority["granted"], false, "{majority}");
    assert_eq!(majority["left_after_release"], Value::Array(vec![]));
    // "Released everywhere" only when no thawed master set the key after all.
    let thawed_set_it = !majority["set_once_thawed"].as_array().unwrap().is_empty();
    assert_eq!(
        majority["meaning"]
            .as_str()
            .unwrap()
            .contains("not released everywhere"),
        thawed_set_it,
        "{majority}"
    );
    let released = majority["rounds"][0]["released"].as_array().unwrap();
    assert_eq!(released.len(), 5, "released on all five masters");
    for state in majority["read_back"].as_array().unwrap() {
        if state["answered"] == true {
            assert!(
                state["holder"].is_null(),
                "a key left after release: {state}"
            );
        }
    }

    // 2. A master restarting empty: two holders, read back from the masters themselves.
    let restart = scenario(&verdict, "restart-empty");
    assert_eq!(restart["two_holders"], true, "{restart}");
    let holders = |s: &Value, who: &str| {
        s["read_back"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["holder"] == who && m["pttl_ms"].as_i64() > Some(0))
            .count()
    };
    assert!(
        holders(restart, "B") >= q,
        "B's value on a majority: {restart}"
    );
    assert!(
        holders(restart, "A") >= 1,
        "A's value still alive elsewhere: {restart}"
    );
    let delayed = scenario(&verdict, "restart-delayed");
    assert_eq!(delayed["granted"], false, "{delayed}");
    assert_eq!(delayed["two_holders"], false, "{delayed}");
    // Its faults are its schedule, played by the one player: the masters A does not get
    // are down during its round; after it the crashing one goes down first and comes back
    // only longer than the TTL (2s) after A's round, as a step, not a sleep.
    let a_round = serde_json::json!({"worker": "A", "event": ["acquired", "gave_up"], "nth": 1});
    let step = |at_ms: u64, after: Option<&Value>, fault: &str, target: &str| {
        let mut step = serde_json::json!({"at_ms": at_ms, "fault": fault, "target": target});
        if let Some(after) = after {
            step["after"] = after.clone();
        }
        step
    };
    assert_eq!(
        delayed["schedule"],
        Value::Array(vec![
            step(0, None, "kill", "m4"),
            step(0, None, "kill", "m5"),
            step(0, Some(&a_round), "kill", "m3"),
            step(0, Some(&a_round), "restart", "m4"),
            step(0, Some(&a_round), "restart", "m5"),
            step(2200, Some(&a_round), "restart", "m3"),
        ]),
        "{delayed}"
    );
    // Every part that struck a master carries its schedule, and the run's --json carries
    // them all, in the order played.
    let played: Vec<&Value> = verdict["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["schedule"])
        .collect();
    assert!(played.iter().all(|s| s.is_array()), "{verdict}");
    assert_eq!(
        verdict["schedules"]
            .as_array()
            .unwrap()
            .iter()
            .collect::<Vec<_>>(),
        played
    );

    // 3. The clock jump: simulated, said so, and two holders.
    let jump = scenario(&verdict, "clock-jump");
    assert_eq!(jump["two_holders"], true, "{jump}");
    assert!(jump["simulated"].as_str().unwrap().contains("PEXPIRE"));
    let simulated: Vec<&Event> = lines
        .iter()
        .filter(|e| matches!(&e.what, What::Expired(x) if x.simulated == Some(true)))
        .collect();
    assert_eq!(simulated.len(), 2, "two masters jump");
    assert!(simulated.iter().all(|e| e.text.contains("SIMULATED")));
    assert!(holders(jump, "B") >= q && holders(jump, "A") >= 1, "{jump}");

    // 4. The client pause: B was granted only after A's validity ended (never twice within
    // validity), yet A wrote late — a stale writer. Resource by resource, read back from the
    // store: unfenced it is taken; by value claimed at the grant (antirez) it is refused;
    // by value claimed after the pause (Kleppmann) it is taken and B's result is gone; by
    // the sequence it is refused.
    let pause = scenario(&verdict, "client-pause");
    assert_eq!(pause["two_holders"], false, "{pause}");
    assert_eq!(pause["stale_write"]["accepted"], true, "{pause}");
    // Its faults are its schedule: A's own pause adopted, its resume once B made its four
    // writes — and the history shows the resume after the last of them.
    assert_eq!(
        pause["schedule"],
        serde_json::json!([
            {"at_ms": 0, "after": {"worker": "A", "event": "freezing", "nth": 1},
             "fault": "pause", "target": "A"},
            {"at_ms": 0, "after": {"worker": "B", "event": "wrote", "nth": 4},
             "fault": "resume", "target": "A"}
        ]),
        "{pause}"
    );
    let in_pause = |e: &&Event| e.part.scenario.as_deref() == Some("client-pause");
    let b_last_wrote = lines
        .iter()
        .filter(in_pause)
        .filter(|e| e.is("B", Kind::Wrote))
        .nth(3)
        .map(|e| e.t_ms);
    let a_resumed = lines
        .iter()
        .filter(in_pause)
        .find(|e| matches!(&e.what, What::Resumed(f) if f.target.as_deref() == Some("A")))
        .map(|e| e.t_ms);
    assert!(
        b_last_wrote.is_some() && a_resumed >= b_last_wrote,
        "A resumed after B's writes"
    );
    let guarded = |guard: &str| -> &Value {
        pause["guarded_writes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["guard"] == guard)
            .unwrap_or_else(|| panic!("no {guard} row: {pause}"))
    };
    for (guard, taken, kept) in [
        ("unfenced", true, "A"),
        ("claim", false, "B"),
        ("late_claim", true, "A"),
        ("sequence", false, "B"),
    ] {
        let row = guarded(guard);
        assert_eq!(row["attempted"], true, "{row}");
        assert_eq!(row["accepted"], taken, "{row}");
        assert_eq!(row["final_writer"], kept, "{row}");
    }
    let sequence = guarded("sequence");
    assert!(
        sequence["a_token"].as_i64() < sequence["b_token"].as_i64(),
        "{sequence}"
    );
    let text = pause["meaning"].as_str().unwrap();
    assert!(
        text.contains("never granted twice within validity"),
        "{text}"
    );
    assert!(!text.contains("coin"), "{text}");

    // Nothing left: workers, masters, their directories, the store's rows.
    assert_gone(&worker_pids(&lines));
    assert_masters_gone(&masters_of(&lines));
    assert_run_left_nothing(verdict["run_id"].as_str().unwrap());
}

/// A real run's `--json` (tests/fixtures/redlock.jsonl, the default run on five private
/// masters), replayed through the lab's checkers with no servers by the lab's own replay
/// (what `lockslab check` runs): the facts its verdict states follow from the evidence the
/// run recorded.
#[test]
fn a_recorded_run_replays_through_the_checkers() {
    use lockslab::labs::redlock::{reads_in, replay, rounds_in};

    let (lines, verdict) = events_and_verdict(include_str!("fixtures/redlock.jsonl"));
    let verdict = &verdict;
    let q = verdict["quorum"].as_u64().unwrap() as usize;
    let replayed = replay(&lines, verdict).unwrap();
    assert_replays(&replayed);
    let part = |name: &str| {
        &replayed
            .parts
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .replayed
    };

    // majority-down: what was left after the release, what the thawed masters set.
    let majority = scenario(verdict, "majority-down");
    let majority_found = part("majority-down");
    assert_eq!(
        majority_found["left_after_release"],
        majority["left_after_release"]
    );
    assert_eq!(
        majority_found["set_once_thawed"],
        majority["set_once_thawed"]
    );
    let [_, woke] = &reads_in(&lines, "majority-down")[..] else {
        panic!("two read-backs of majority-down")
    };
    let meaning = majority["meaning"].as_str().unwrap();
    assert_eq!(
        meaning.contains("not released everywhere"),
        check::released_everywhere(woke) == Finding::No,
        "{meaning}"
    );
    assert_eq!(
        meaning.contains("released everywhere."),
        check::released_everywhere(woke) == Finding::Yes,
        "{meaning}"
    );

    // Two holders, A's round then B's: restart-empty, restart-delayed, clock-jump.
    let mut pairs = rounds_in(&lines, "restart");
    pairs.extend(rounds_in(&lines, "clock-jump"));
    assert_eq!(pairs.len(), 6, "{pairs:?}");
    for name in ["restart-empty", "restart-delayed", "clock-jump"] {
        assert_eq!(
            part(name)["two_holders"],
            scenario(verdict, name)["two_holders"],
            "{name}"
        );
    }
    // …and where the verdict says two holders, the masters' own answers agree: B's value
    // on a majority, A's still alive on another.
    for name in ["restart-empty", "clock-jump"] {
        let read: Vec<MasterState> =
            serde_json::from_value(scenario(verdict, name)["read_back"].clone()).unwrap();
        assert!(check::held_by(&read, "B") >= q, "{name}: {read:?}");
        assert!(check::held_by(&read, "A") >= 1, "{name}: {read:?}");
    }
    let delayed = scenario(verdict, "restart-delayed");
    let [_, rejoined] = &reads_in(&lines, "restart-delayed")[..] else {
        panic!("two read-backs of restart-delayed")
    };
    assert_eq!(
        delayed["meaning"]
            .as_str()
            .unwrap()
            .contains("no master held A's key any more"),
        check::held_by(rejoined, "A") == 0
    );

    // client-pause: B's round began after A's validity had ended (A seen at its grant).
    assert_eq!(part("client-pause")["two_holders"], false);
    assert_eq!(
        scenario(verdict, "client-pause")["two_holders"],
        false,
        "{verdict}"
    );
}

#[test]
fn a_failed_round_is_released_on_every_master() {
    a_failed_round_is_released_on_every_master_when(RoundOrder::Sequential);
}

#[test]
fn a_failed_concurrent_round_is_released_on_every_master() {
    a_failed_round_is_released_on_every_master_when(RoundOrder::Concurrent);
}

fn a_failed_round_is_released_on_every_master_when(round: RoundOrder) {
    // Three "masters" on the test binary's Redis (databases 1–3: separate keyspaces) and a
    // fourth that is down (nothing listens there): enough for the rule, no server faulted.
    let redis = &servers().redis;
    let key = format!("lockslab:test-{}:redlock:{round:?}", std::process::id());
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        format!("redis://127.0.0.1:{port}")
    };
    let urls = [
        format!("{redis}/1"),
        format!("{redis}/2"),
        format!("{redis}/3"),
        dead,
        format!("{redis}/4"),
    ];
    // Someone else holds the key on databases 2, 3 and 4: our round can get only db 1.
    for db in [2, 3, 4] {
        let mut c = lockslab::connect::redis(&format!("{redis}/{db}")).unwrap();
        redis::cmd("SET")
            .arg(&key)
            .arg("someone-else")
            .arg("PX")
            .arg(10_000)
            .query::<()>(&mut c)
            .unwrap();
    }
    let mut lock = redlock_on(&urls, &key, Duration::from_secs(5), 200, round);
    let attempt = lock.try_acquire();
    assert!(!attempt.held, "{attempt:?}");
    assert_eq!(attempt.granted, 1);
    assert!(matches!(attempt.answers[3].reply, Reply::NoAnswer { .. }));
    assert_eq!(attempt.released.len(), 5, "released on all five");
    assert_eq!(attempt.released[0].reply, Reply::Deleted);
    for db in 1..=4 {
        let mut c = lockslab::connect::redis(&format!("{redis}/{db}")).unwrap();
        let value: Option<String> = redis::cmd("GET").arg(&key).query(&mut c).unwrap();
        assert_ne!(
            value.as_deref(),
            Some(attempt.value.as_str()),
            "db {db} kept our key"
        );
        if db > 1 {
            assert_eq!(
                value.as_deref(),
                Some("someone-else"),
                "another's key is left alone"
            );
            redis::cmd("DEL").arg(&key).query::<()>(&mut c).unwrap();
        }
    }
}

#[test]
fn a_release_finds_its_script_again_after_a_script_flush() {
    // The release names its script by digest (EVALSHA); a master that no longer knows it
    // (restarted empty, or SCRIPT FLUSH) answers NOSCRIPT and must be sent the text.
    let redis = &servers().redis;
    let urls = [
        format!("{redis}/8"),
        format!("{redis}/9"),
        format!("{redis}/10"),
    ];
    let mut admin = lockslab::connect::redis(redis).unwrap();
    for round in [RoundOrder::Sequential, RoundOrder::Concurrent] {
        let key = format!("lockslab:test-{}:flush:{round:?}", std::process::id());
        let mut lock = redlock_on(&urls, &key, Duration::from_secs(10), 300, round);
        for _ in 0..2 {
            let attempt = lock.try_acquire();
            assert!(attempt.held, "{round:?}: {attempt:?}");
            redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query::<()>(&mut admin)
                .unwrap();
            let released = lock.release(&attempt.value);
            assert!(
                released.iter().all(|a| a.reply == Reply::Deleted),
                "{round:?}: {released:?}"
            );
        }
        for url in &urls {
            let mut c = lockslab::connect::redis(url).unwrap();
            let left: Option<String> = redis::cmd("GET").arg(&key).query(&mut c).unwrap();
            assert_eq!(left, None, "{round:?}: {url} kept the key");
        }
    }
}

/// Ctrl-C at `moment` (the first event it matches): exit 130, and no master, worker or
/// directory left.
/// A Redlock on `urls`, named m1, m2…, with `timeout_ms` per master.
fn redlock_on(
    urls: &[String],
    key: &str,
    ttl: Duration,
    timeout_ms: u64,
    round: RoundOrder,
) -> Redlock {
    let masters = urls
        .iter()
        .enumerate()
        .map(|(i, url)| Master::new(&format!("m{}", i + 1), url))
        .collect();
    let settings = Settings {
        ttl,
        drift_factor: 0.01,
        instance_timeout: Duration::from_millis(timeout_ms),
        retry_delay_max: Duration::from_millis(10),
        round,
    };
    Redlock::new(masters, key, settings)
}

/// A master that accepts connections and never answers, as a frozen one does: the kernel
/// completes the handshake, nobody reads.
fn silent_master() -> (std::net::TcpListener, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    (listener, url)
}

#[test]
fn a_concurrent_round_asks_every_master_before_a_silent_one_gives_up() {
    let redis = &servers().redis;
    let (_m1, silent1) = silent_master();
    let (_m2, silent2) = silent_master();
    let urls = [
        silent1,
        silent2,
        format!("{redis}/5"),
        format!("{redis}/6"),
        format!("{redis}/7"),
    ];
    for round in [RoundOrder::Sequential, RoundOrder::Concurrent] {
        let key = format!("lockslab:test-{}:silent:{round:?}", std::process::id());
        let mut lock = redlock_on(&urls, &key, Duration::from_secs(10), 300, round);
        // Twice: the second round finds the live masters' connections open.
        for _ in 0..2 {
            let attempt = lock.try_acquire();
            // The same rule either way: three of five granted, the silent two counted as no.
            assert!(attempt.held, "{round:?}: {attempt:?}");
            assert_eq!(attempt.granted, 3, "{round:?}");
            for silent in &attempt.answers[..2] {
                assert!(matches!(silent.reply, Reply::NoAnswer { .. }), "{silent:?}");
            }
            // When the first silent master was given up on, had the live ones answered yet?
            let given_up = attempt.answers[0].sent_ms + attempt.answers[0].took_ms;
            let answered_before = attempt.answers[2..]
                .iter()
                .filter(|a| a.sent_ms + a.took_ms < given_up)
                .count();
            match round {
                RoundOrder::Sequential => {
                    assert_eq!(answered_before, 0, "one after another: {attempt:?}")
                }
                RoundOrder::Concurrent => {
                    assert_eq!(answered_before, 3, "all at once: {attempt:?}")
                }
            }
            let released = lock.release(&attempt.value);
            let deleted = released
                .iter()
                .filter(|a| a.reply == Reply::Deleted)
                .count();
            assert_eq!(deleted, 3, "{round:?}: {released:?}");
        }
    }
}

fn interrupt_at(args: &[&str], moment: impl Fn(&Event) -> bool) {
    let mut all = args.to_vec();
    all.push("--json");
    let mut lab = lockslab(&all).stdout(Stdio::piped()).spawn().unwrap();
    let mut seen = Vec::new();
    let started = Instant::now();
    for line in BufReader::new(lab.stdout.take().unwrap()).lines() {
        let Some(event) = event_line(&line.unwrap()) else {
            continue;
        };
        let hit = moment(&event);
        seen.push(event);
        if hit {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "never reached the moment"
        );
    }
    kill(Pid::from_raw(lab.id() as i32), Signal::SIGINT).unwrap();
    let status = lab.wait().unwrap();
    assert_eq!(status.code(), Some(130), "Ctrl-C exits with 130");
    let masters = masters_of(&seen);
    assert!(
        eventually(Duration::from_secs(5), || {
            masters.iter().all(|(port, dir)| {
                !std::path::Path::new(dir).exists()
                    && !process_table()
                        .iter()
                        .any(|p| p.cmdline.contains(&format!("127.0.0.1:{port}")))
            })
        }),
        "masters or their directories left after Ctrl-C"
    );
    assert_masters_gone(&masters);
    let workers = worker_pids(&seen);
    if !workers.is_empty() {
        assert_gone(&workers);
    }
    let run_id = run_id_of(&seen).unwrap().to_string();
    assert_run_left_nothing(&run_id);
}

#[test]
fn ctrl_c_while_two_masters_are_frozen_leaves_nothing() {
    interrupt_at(&["redlock", "minority"], |e| {
        e.kind() == Kind::Frozen && e.fault().unwrap().master.as_deref() == Some("m5")
    });
}

#[test]
fn ctrl_c_while_the_client_is_frozen_leaves_nothing() {
    interrupt_at(&["redlock", "client-pause", "--ttl", "5s"], |e| {
        e.is("lab", Kind::Frozen)
    });
}

#[test]
fn bad_flags_name_the_flag() {
    for (args, flag) in [
        (vec!["redlock", "--masters", "4"], "--masters"),
        (vec!["redlock", "--drift-factor", "2"], "--drift-factor"),
        (
            vec!["redlock", "--ttl", "500ms", "--instance-timeout", "100ms"],
            "--instance-timeout",
        ),
    ] {
        let output = lockslab_offline(&args).output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
    }
    // The limit it says is the one it checks: timeout × masters below half the TTL.
    let output = lockslab_offline(&["redlock", "--ttl", "500ms", "--instance-timeout", "100ms"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("500ms must stay below half of --ttl 500ms (below 250ms)"),
        "{stderr}"
    );
}

/// Three Redis servers of the test's own, started apart from the test binary's shared ones:
/// they stand for masters a user already runs.
fn users_masters() -> Vec<lockslab::servers::PrivateServers> {
    use lockslab::connect::Backend;
    use lockslab::servers::{Lifetime, PrivateServers};
    (0..3)
        .map(|_| PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun).unwrap())
        .collect()
}

fn urls_of(masters: &[lockslab::servers::PrivateServers]) -> Vec<String> {
    masters
        .iter()
        .map(|m| m.url(lockslab::connect::Backend::Redis).unwrap())
        .collect()
}

fn with_masters<'a>(args: &[&'a str], urls: &'a [String]) -> Vec<&'a str> {
    let mut all = args.to_vec();
    for url in urls {
        all.extend(["--master", url.as_str()]);
    }
    all
}

/// Every key of run `run_id` still on `url`.
fn run_keys_on(url: &str, run_id: &str) -> Vec<String> {
    let mut c = lockslab::connect::redis(url).unwrap();
    redis::cmd("KEYS")
        .arg(format!("lockslab:{run_id}:*"))
        .query(&mut c)
        .unwrap()
}

#[test]
fn given_masters_play_what_needs_no_process_and_keep_no_key() {
    let masters = users_masters();
    let urls = urls_of(&masters);
    let (lines, verdict, _) = run_json(&with_masters(&["redlock"], &urls));
    assert_eq!(verdict["masters"], 3);
    assert_eq!(verdict["masters_given"], true);
    assert_eq!(verdict["quorum"], 2);
    let names: Vec<&str> = verdict["scenarios"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["clock-jump", "client-pause"], "{verdict}");
    let skipped: Vec<&str> = verdict["skipped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(skipped, ["minority", "restart"]);

    // The same lessons as on private masters, read back from the user's.
    let jump = scenario(&verdict, "clock-jump");
    assert_eq!(jump["two_holders"], true, "{jump}");
    let pause = scenario(&verdict, "client-pause");
    assert_eq!(pause["stale_write"]["accepted"], true, "{pause}");
    let sequence = pause["guarded_writes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["guard"] == "sequence")
        .unwrap();
    assert_eq!(sequence["accepted"], false, "{pause}");
    // The lab neither killed nor froze a master of the user's.
    assert!(
        !lines.iter().any(|e| e.worker == "lab"
            && e.fault()
                .is_some_and(|f| f.master.is_some() && f.pid.is_some())),
        "the lab touched a given master's process"
    );
    let run_id = verdict["run_id"].as_str().unwrap();
    for url in &urls {
        assert_eq!(run_keys_on(url, run_id), Vec::<String>::new(), "on {url}");
    }
    assert_run_left_nothing(run_id);

    // On screen: a row for each skipped scenario, and the reason.
    let human = run_human(&with_masters(&["redlock"], &urls));
    for row in ["minority", "restart"] {
        assert!(
            human
                .lines()
                .any(|l| l.trim_start().starts_with(row) && l.contains("skipped")),
            "no skipped row for {row}:\n{human}"
        );
    }
    assert!(
        human.contains("needs masters lockslab starts itself"),
        "{human}"
    );
    assert!(!human.contains("Redis URL given is not used"), "{human}");
    let output = lockslab(&with_masters(&["redlock", "restart"], &urls))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("restart") && stderr.contains("starts itself"),
        "{stderr}"
    );
}

/// A Redis URL from the environment (a room's, a team's) cannot serve as five masters: the
/// lab says up front that it starts its own rather than ignore the URL silently.
#[test]
fn a_redis_url_it_cannot_use_is_named_up_front() {
    let human = run_human(&["redlock", "client-pause"]);
    let intro: Vec<&str> = human.lines().take(4).collect();
    assert!(
        intro
            .iter()
            .any(|l| l.contains("Redis URL given is not used")),
        "{human}"
    );
}

#[test]
fn ctrl_c_on_given_masters_removes_the_run_keys() {
    let masters = users_masters();
    let urls = urls_of(&masters);
    let mut all = with_masters(&["redlock", "client-pause", "--ttl", "20s"], &urls);
    all.push("--json");
    let mut lab = lockslab(&all).stdout(Stdio::piped()).spawn().unwrap();
    let mut seen = Vec::new();
    for line in BufReader::new(lab.stdout.take().unwrap()).lines() {
        let Some(event) = event_line(&line.unwrap()) else {
            continue;
        };
        let frozen = event.is("lab", Kind::Frozen);
        seen.push(event);
        if frozen {
            break;
        }
    }
    let run_id = run_id_of(&seen).unwrap().to_string();
    // A froze holding the lock: its key is on the masters, with most of 20s to live.
    let holding = urls
        .iter()
        .filter(|url| !run_keys_on(url, &run_id).is_empty())
        .count();
    assert!(holding >= 2, "A's key is on {holding} of 3 masters");
    kill(Pid::from_raw(lab.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(lab.wait().unwrap().code(), Some(130));
    assert_gone(&worker_pids(&seen));
    for url in &urls {
        assert_eq!(run_keys_on(url, &run_id), Vec::<String>::new(), "on {url}");
    }
    assert_run_left_nothing(&run_id);
}

#[test]
fn given_masters_must_be_odd_and_well_formed() {
    let two = [
        "redis://127.0.0.1:1".to_string(),
        "redis://127.0.0.1:2".to_string(),
    ];
    let output = lockslab_offline(&with_masters(&["redlock"], &two))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--master given 2 times"));

    let output = lockslab_offline(&["redlock", "--master", "http://u:sekrit@h:1"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("'--master'"), "{stderr}");
    assert!(!stderr.contains("sekrit"), "the password shows: {stderr}");

    // Three that do not answer: one line naming the master, exit 4.
    let dead: Vec<String> = (0..3)
        .map(|_| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!(
                "redis://:sekrit@127.0.0.1:{}",
                listener.local_addr().unwrap().port()
            )
        })
        .collect();
    let output = lockslab_offline(&with_masters(&["redlock", "clock-jump"], &dead))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(4));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("m1") && !stderr.contains("sekrit"),
        "{stderr}"
    );
}
