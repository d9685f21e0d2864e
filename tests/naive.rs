//! Lab 2 against a real Redis: every bug shows, every fix holds, counted from the evidence.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// Short TTL and wait so the deterministic scenarios take about two seconds each.
const FAST: [&str; 4] = ["--ttl", "300ms", "--wait", "1200ms"];

fn scenario<'a>(verdict: &'a Value, name: &str) -> &'a Value {
    verdict["scenarios"]
        .as_array()
        .expect("scenarios array")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no scenario {name} in {verdict}"))
}

/// Runs `lockslab naive <args> --json`; every event must say which scenario and which run
/// (broken or fixed) it belongs to, since each run's clock starts again at zero.
fn naive(args: &[&str]) -> (Vec<Event>, Value) {
    let mut all = vec!["naive"];
    all.extend_from_slice(args);
    let (lines, verdict, _) = run_json(&all);
    let names = ["race", "no-ttl", "setnx-expire", "wrong-release"];
    let chosen = args.iter().find(|a| names.contains(a));
    for event in &lines {
        let scenario = event.part.scenario.as_deref();
        assert!(
            scenario.is_some_and(|s| names.contains(&s)),
            "no scenario on {event:?}"
        );
        if let Some(chosen) = chosen {
            assert_eq!(scenario, Some(*chosen), "{event:?}");
        }
        assert!(
            matches!(event.part.variant.as_deref(), Some("broken" | "fixed")),
            "no variant on {event:?}"
        );
    }
    for variant in ["broken", "fixed"] {
        assert!(
            lines
                .iter()
                .any(|e| e.part.variant.as_deref() == Some(variant)),
            "no {variant} events"
        );
    }
    (lines, verdict)
}

fn counts(run: &Value) -> (u64, u64) {
    (
        run["violations"].as_u64().unwrap(),
        run["trials"].as_u64().unwrap(),
    )
}

#[test]
fn a_dead_holder_without_ttl_blocks_the_lock_for_good_and_set_nx_px_frees_it() {
    for round in 0..2 {
        let (lines, verdict) = naive(&[&["no-ttl"][..], &FAST].concat());
        let run = scenario(&verdict, "no-ttl");
        assert_eq!(counts(&run["broken"]), (1, 1), "round {round}: {run}");
        assert_eq!(run["broken"]["pttl_ms_after_wait"], -1, "{run}");
        assert_eq!(run["broken"]["next_holder_got_lock"], false, "{run}");
        assert_eq!(counts(&run["fixed"]), (0, 1), "round {round}: {run}");
        assert_eq!(run["fixed"]["next_holder_got_lock"], true, "{run}");
        // B got the lock once A's key lapsed: not at once (its first tries found the key
        // taken), before its wait ran out, and the key read back is B's. How long B waited
        // is a figure for `cargo bench --bench naive`, not an assertion.
        let b_took = events(&lines, "B", Kind::Acquired);
        assert!(
            acquired(b_took[0]).unwrap().tries.unwrap() > 1,
            "{:?}",
            b_took[0]
        );
        let read_back = lines
            .iter()
            .filter(|e| e.worker == "redis" && e.part.variant.as_deref() == Some("fixed"))
            .filter_map(observed)
            .find(|o| o.key_owner.is_some())
            .unwrap();
        assert_eq!(read_back.dead_owner, Some(false), "{read_back:?}");
        assert_eq!(
            read_back.key_owner.as_deref(),
            b_took[0].owner(),
            "{read_back:?}"
        );

        // The story on the timeline: A was killed holding the lock, B gave up, then (fixed) got it.
        let killed = lines.iter().filter(|e| e.is("lab", Kind::Killed)).count();
        assert_eq!(killed, 2, "A is killed in both runs");
        assert_eq!(events(&lines, "B", Kind::GaveUp).len(), 1);
        assert_eq!(events(&lines, "B", Kind::Acquired).len(), 1);
        assert_gone(&worker_pids(&lines));
    }
}

#[test]
fn a_holder_killed_between_setnx_and_expire_leaves_a_stuck_lock() {
    for round in 0..2 {
        let (lines, verdict) = naive(&[&["setnx-expire"][..], &FAST].concat());
        let run = scenario(&verdict, "setnx-expire");
        assert_eq!(counts(&run["broken"]), (1, 1), "round {round}: {run}");
        assert_eq!(run["broken"]["pttl_ms_after_wait"], -1, "{run}");
        assert_eq!(counts(&run["fixed"]), (0, 1), "round {round}: {run}");
        assert_eq!(run["fixed"]["next_holder_got_lock"], true, "{run}");

        // A stopped between the two commands and was killed there, before any `acquired`.
        let between = events(&lines, "A", Kind::Between);
        assert_eq!(between.len(), 1, "only the broken run has a gap to stop in");
        let pttl_seen = lines
            .iter()
            .find_map(|e| match &e.what {
                What::Pttl(p) if e.worker == "redis" => Some(p),
                _ => None,
            })
            .unwrap();
        assert_eq!(
            pttl_seen.pttl_ms, -1,
            "no expiry right after SETNX: {pttl_seen:?}"
        );
        let a_acquired: Vec<_> = events(&lines, "A", Kind::Acquired);
        assert_eq!(a_acquired.len(), 1, "A acquires only in the fixed run");
        assert!(a_acquired[0].text.contains("SET NX PX"));
        assert_gone(&worker_pids(&lines));
    }
}

#[test]
fn releasing_by_del_lets_a_third_holder_in_and_compare_and_delete_does_not() {
    for round in 0..2 {
        let (lines, verdict) = naive(&[&["wrong-release"][..], &FAST].concat());
        let run = scenario(&verdict, "wrong-release");
        assert_eq!(counts(&run["broken"]), (1, 1), "round {round}: {run}");
        assert_eq!(counts(&run["fixed"]), (0, 1), "round {round}: {run}");

        // The holder entries the workers wrote, in the order Redis received them.
        let list = |r: &Value| -> Vec<String> {
            r["holders_list"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            list(&run["broken"]),
            ["+A", "+B", "-A", "+C", "-B", "-C"],
            "{run}"
        );
        assert_eq!(list(&run["fixed"]), ["+A", "+B", "-A", "-B"], "{run}");
        let causes: Vec<(String, String)> = run["broken"]["overlaps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    format!("{}{}", o["holders"][0], o["holders"][1]).replace('"', ""),
                    o["cause"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        assert_eq!(
            causes,
            [
                ("AB".to_string(), "lease expired".to_string()),
                (
                    "BC".to_string(),
                    "lock deleted by another worker".to_string()
                )
            ]
        );

        // A's release: DEL deleted a key (B's); compare-and-delete deleted nothing.
        let a_released = events(&lines, "A", Kind::Released);
        assert_eq!(a_released.len(), 2);
        assert_eq!(released(a_released[0]).unwrap().deleted, Some(true));
        assert_eq!(released(a_released[1]).unwrap().deleted, Some(false));
        assert_eq!(
            events(&lines, "C", Kind::Acquired).len(),
            1,
            "C gets in once"
        );
        assert_eq!(
            events(&lines, "C", Kind::GaveUp).len(),
            1,
            "and is turned away once"
        );
        // Redis's answer, not a conclusion: GET found C's owner value while B still worked.
        let c_owner = events(&lines, "C", Kind::Acquired)[0]
            .owner()
            .map(str::to_string);
        assert!(c_owner.is_some(), "C's grant names its owner value");
        assert!(
            lines
                .iter()
                .any(|e| e.is("redis", Kind::RedisRead)
                    && e.observed().unwrap().key_owner == c_owner),
            "GET showed C's value while B still worked"
        );
        assert_gone(&worker_pids(&lines));
    }
}

#[test]
fn check_then_set_breaks_most_trials_with_a_window_and_set_nx_none() {
    let (lines, verdict) = naive(&[
        "race",
        "--workers",
        "6",
        "--trials",
        "30",
        "--window",
        "2ms",
    ]);
    let run = scenario(&verdict, "race");
    let (broken, trials) = counts(&run["broken"]);
    assert_eq!(trials, 30);
    assert!(broken > 15, "only {broken}/30 trials broke: {run}");
    assert_eq!(counts(&run["fixed"]), (0, 30), "{run}");
    assert_eq!(run["fixed"]["clock_overlaps"], 0, "{run}");
    assert_eq!(run["fixed"]["most_at_once"], 1, "{run}");
    // Two holders in Redis's list always means overlapping monotonic intervals too.
    assert!(run["broken"]["clock_overlaps"].as_u64().unwrap() >= broken);

    // The verdict's count is what the per-trial holders lists say.
    for variant in ["broken", "fixed"] {
        let summary = lines
            .iter()
            .find(|e| e.worker == "redis" && e.part.variant.as_deref() == Some(variant))
            .and_then(observed)
            .unwrap();
        let per_trial = summary.holders_per_trial.as_ref().unwrap();
        assert_eq!(per_trial.len(), 30);
        let broke = per_trial.iter().filter(|&&h| h >= 2).count() as u64;
        assert_eq!(broke, run[variant]["violations"].as_u64().unwrap());
        // Every overwritten holder learns it at release: compare-and-delete finds its value
        // gone. So at least as many trials show that as the holders lists count.
        assert!(summary.overwritten_trials.unwrap() >= broke, "{summary:?}");
    }

    // The example is a real broken trial: two SETs answered OK before either worker let go.
    let example = &run["example"];
    let steps = example["steps"].as_array().unwrap();
    let sets = steps.iter().filter(|s| s["step"] == "set").count();
    assert!(sets >= 2, "{example}");
    let second_set = steps.iter().filter(|s| s["step"] == "set").nth(1).unwrap()["t_us"]
        .as_i64()
        .unwrap();
    let first_done = steps.iter().find(|s| s["step"] == "done").unwrap()["t_us"]
        .as_i64()
        .unwrap();
    assert!(second_set < first_done, "{example}");
    assert_gone(&worker_pids(&lines));
}

#[test]
fn printed_counts_match_the_json_verdict() {
    let args = [&["wrong-release"][..], &FAST].concat();
    let (lines, verdict) = naive(&args);
    // Both variants of the scenario on the run's one clock.
    assert_one_clock(&lines);
    let text = run_human(&[&["naive"][..], &args].concat());
    let run = scenario(&verdict, "wrong-release");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("wrong-release"))
        .unwrap_or_else(|| panic!("no verdict row in:\n{text}"));
    let (b, bt) = counts(&run["broken"]);
    let (f, ft) = counts(&run["fixed"]);
    let printed: Vec<&str> = row.split_whitespace().filter(|w| w.contains('/')).collect();
    assert_eq!(printed, [format!("{b}/{bt}"), format!("{f}/{ft}")], "{row}");

    // The race table row shows the same numbers as the race's own summary lines.
    let output = lockslab(&["naive", "race", "--trials", "20", "--workers", "4"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("race "))
        .unwrap();
    let broken = row
        .split_whitespace()
        .find(|w| w.ends_with("/20"))
        .unwrap()
        .trim_end_matches("/20");
    let summary = text
        .lines()
        .find(|l| l.contains("20 trials with GET-then-SET"))
        .unwrap();
    if broken == "0" {
        assert!(summary.contains("never two holders"), "{summary}");
    } else {
        assert!(
            summary.contains(&format!("in {broken} (")),
            "{row}\n{summary}"
        );
    }
}

#[test]
fn human_output_shows_the_timelines_table_and_example_without_colours() {
    let text = run_human(&[&["naive", "setnx-expire"][..], &FAST].concat());
    for expected in [
        "setnx-expire: broken, SETNX, then PEXPIRE",
        "setnx-expire: fixed, SET NX PX",
        "PTTL → -1",
        "GET → A's value, PTTL → -1 (no expiry)",
        "between SETNX and PEXPIRE",
        "Verdict",
        "lock still held by a dead worker",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }

    let text = run_human(&["naive", "race", "--trials", "10", "--window", "2ms"]);
    assert!(text.contains("One trial that broke"), "{text}");
    assert!(text.contains("SET → OK"), "{text}");
}

#[test]
fn ctrl_c_while_b_waits_for_a_stuck_lock_leaves_nothing_behind() {
    let mut lab = lockslab(&["naive", "no-ttl", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(lab.stdout.take().unwrap()).lines();
    let mut pids = Vec::new();
    let started = Instant::now();
    for line in lines.by_ref() {
        let Some(event) = event_line(&line.unwrap()) else {
            continue;
        };
        if let What::Waiting(waiting) = &event.what {
            pids.push(waiting.pid.unwrap());
            if event.worker == "B" {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "B never started"
        );
    }
    kill(Pid::from_raw(lab.id() as i32), Signal::SIGINT).unwrap();
    let status = lab.wait().unwrap();
    assert_eq!(status.code(), Some(130), "Ctrl-C exits with 130");
    assert_gone(&pids);
}

#[test]
fn bad_flags_name_the_flag() {
    // Each is a command-line error (exit 2) that names every flag involved.
    for (args, flags) in [
        (
            &["--wait", "500ms", "--ttl", "1s"][..],
            &["--wait", "--ttl"][..],
        ),
        (&["no-ttl", "--wait", "0s"], &["--wait", "--ttl"]),
        (&["--ttl", "50ms"], &["--ttl"]),
        (&["race", "--work", "2s"], &["--work", "--ttl"]),
        (&["race", "--spread", "1h"], &["--spread"]),
        (&["race", "--window", "2m"], &["--window"]),
    ] {
        let output = lockslab_offline(&[&["naive"][..], args].concat())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        for flag in flags {
            assert!(stderr.contains(flag), "{args:?}: {stderr}");
        }
    }

    // Only what the chosen scenario uses is checked: race never waits for a lapse, so a
    // --ttl above the default --wait is fine for it.
    let (_, verdict) = naive(&["race", "--ttl", "10s", "--trials", "3", "--workers", "2"]);
    assert_eq!(counts(&scenario(&verdict, "race")["fixed"]).1, 3);

    let output = lockslab_offline(&["naive", "racy"]).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        stderr.contains("race") && stderr.contains("wrong-release"),
        "{stderr}"
    );

    let output = lockslab_offline(&["naive", "--workers", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr.contains("--workers"), "{stderr}");

    let output = lockslab_offline(&["naive", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("Examples") && text.contains("--window"),
        "{text}"
    );
}

/// A real run's `--json` (tests/fixtures/naive.jsonl: every scenario, `--ttl 300ms --wait
/// 1200ms --trials 20 --workers 4 --window 1ms`) replayed through the lab's checkers with no
/// servers, by the lab's own replay (what `lockslab check` runs): the facts they decide
/// from the recorded evidence are the verdict's.
#[test]
fn a_recorded_run_replays_through_the_checkers_to_its_verdict() {
    let (lines, verdict) = events_and_verdict(include_str!("fixtures/naive.jsonl"));
    let replayed = lockslab::labs::naive::replay(&lines, &verdict).unwrap();
    assert_replays(&replayed);
    assert!(
        replayed.not_replayed.is_empty(),
        "{:?}",
        replayed.not_replayed
    );
    let part = |name: &str| {
        replayed
            .parts
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no part {name}"))
    };
    let violations = |name: &str| part(name).replayed["violations"].as_u64().unwrap();
    // no-ttl and setnx-expire: the key read back after B's wait named the killed A in the
    // broken runs only.
    for name in ["no-ttl", "setnx-expire"] {
        assert_eq!(violations(&format!("{name} (broken)")), 1, "{name}");
        assert_eq!(violations(&format!("{name} (fixed)")), 0, "{name}");
    }
    // wrong-release: the holders list and the workers' grant stamps, against the TTL: the
    // causes the verdict recorded, in order.
    for variant in ["broken", "fixed"] {
        let wrong = part(&format!("wrong-release ({variant})"));
        let causes = |overlaps: &Value| -> Vec<String> {
            overlaps
                .as_array()
                .unwrap()
                .iter()
                .map(|o| o["cause"].as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(
            causes(&wrong.replayed["overlaps"]),
            causes(&wrong.recorded["overlaps"]),
            "{variant}"
        );
    }
    assert_eq!(violations("wrong-release (broken)"), 1);
    // race: the verdict's count is the trials whose holders list shows two at once.
    assert_eq!(
        violations("race (broken)"),
        scenario(&verdict, "race")["broken"]["violations"]
    );
    assert_eq!(violations("race (fixed)"), 0);
}
