//! Lab 3 against a real Postgres: the verdicts come from the append-only processing table,
//! and the freeze is checked by reading that table ourselves while the worker is stopped.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

fn mode<'a>(verdict: &'a Value, name: &str) -> &'a Value {
    verdict["modes"]
        .as_array()
        .expect("modes array")
        .iter()
        .find(|m| m["mode"] == name)
        .unwrap_or_else(|| panic!("no mode {name} in {verdict}"))
}

fn lab_event(lines: &[Event], kind: Kind) -> &Event {
    lines
        .iter()
        .find(|e| e.kind() == kind)
        .unwrap_or_else(|| panic!("no {kind} event in {lines:#?}"))
}

fn round(lines: &[Event]) -> &facts::RoundFacts {
    let What::Round(round) = &lab_event(lines, Kind::Round).what else {
        unreachable!()
    };
    round
}

fn run_id(lines: &[Event]) -> String {
    round(lines).run_id.clone().expect("run_id")
}

/// A job's record as the processing table says it (who processed it): the first
/// `job_read` that says who (a killed worker's job's row, read when nobody claimed it
/// again, is a `job_read` too, of its status).
fn processed(lines: &[Event]) -> &facts::JobFate {
    lines
        .iter()
        .find_map(|e| match &e.what {
            What::JobRead(f) if f.by.is_some() => Some(f),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no job's record in {lines:#?}"))
}

/// Who processed the job first.
fn first_by(fate: &facts::JobFate) -> Option<&str> {
    fate.by.as_ref()?.first().map(String::as_str)
}

/// Who took a job over, as a `taken_over` or `reclaimed` says it.
fn handover(event: &Event) -> &facts::Handover {
    match &event.what {
        What::TakenOver(h) | What::Reclaimed(h) => h,
        _ => panic!("not a handover: {event:?}"),
    }
}

/// No worker of this run is left: running, stopped or zombie.
fn assert_no_workers_left(run_id: &str) {
    let needle = format!("lockslab-{run_id}-");
    let left = processes_mentioning(&needle);
    assert!(left.is_empty(), "workers left behind: {left:?}");
}

fn tables_left(run_id: &str) -> i64 {
    let mut db = postgres::Client::connect(&servers().postgres, postgres::NoTls).unwrap();
    db.query_one(
        "SELECT count(*) FROM pg_tables WHERE tablename LIKE $1",
        &[&format!("lockslab_{run_id}_%")],
    )
    .unwrap()
    .get(0)
}

#[test]
fn skip_locked_processes_every_job_once_and_a_killed_workers_job_comes_back() {
    let (lines, verdict, output) = run_json(&["skip-locked", "--fault", "kill", "--jobs", "150"]);
    let modes = verdict["modes"].as_array().unwrap();
    assert_eq!(modes.len(), 1, "{verdict}");
    let m = mode(&verdict, "skip-locked");
    let mut fields: Vec<&str> = m.as_object().unwrap().keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "duplicates",
            "jobs",
            "jobs_per_s",
            "lost",
            "mode",
            "reclaim_ms"
        ],
        "exactly the fields the issue names"
    );
    // 150 in the queue round, min(150, 5 × 10 workers) in the kill round.
    assert_eq!(m["jobs"], 200, "{m}");
    assert_eq!(m["duplicates"], 0, "{m}");
    assert_eq!(m["lost"], 0, "{m}");
    assert!(m["jobs_per_s"].as_f64().unwrap() > 0.0, "{m}");

    // Round 1's counts name every worker, including any that processed nothing.
    let per_worker = round(&lines).per_worker.clone().expect("per_worker");
    let mut names: Vec<&str> = per_worker.keys().map(String::as_str).collect();
    names.sort_by_key(|w| w[1..].parse::<u32>().unwrap());
    assert_eq!(
        names,
        ["w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8", "w9", "w10"]
    );
    let total: i64 = per_worker.values().sum();
    assert_eq!(total, 150, "{per_worker:?}");

    // The killed worker's job was claimed again by someone else, and processed exactly once.
    let killed = lab_event(&lines, Kind::Killed);
    let job = killed.fault().unwrap().job.unwrap();
    assert_eq!(
        lines
            .iter()
            .find(|e| e.is("w1", Kind::Claimed))
            .unwrap()
            .job(),
        Some(job)
    );
    // Evidence, not timing (how long the reclaim took is the bench's figure): Postgres's
    // processing table shows another worker's claim of the very job, after the kill.
    let reclaim = m["reclaim_ms"].as_f64().expect("reclaim_ms is a number");
    let reclaimed = handover(lab_event(&lines, Kind::Reclaimed));
    assert_eq!(reclaimed.job, Some(job));
    assert_ne!(reclaimed.by.as_deref(), Some("w1"), "{reclaimed:?}");
    assert_eq!(reclaimed.reclaim_ms, Some(reclaim), "{reclaimed:?}");
    assert!(reclaim >= 0.0, "claimed before the kill: {reclaimed:?}");
    let result = processed(&lines);
    assert_eq!(result.job, Some(job));
    assert_eq!(result.times_processed, Some(1), "{result:?}");
    assert_ne!(
        first_by(result),
        Some("w1"),
        "the dead worker processed nothing"
    );
    assert_eq!(first_by(result), reclaimed.by.as_deref(), "{result:?}");

    // Every event has the promised fields (its worker and kind are what it reads into; its
    // stamp is checked on the line itself, as reading it would default a missing one to 0);
    // the per-job work is not flooding the stream.
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines().rev().skip(1) {
        let line: Value = serde_json::from_str(line).unwrap();
        assert!(line["t_ms"].is_u64(), "{line}");
    }
    assert!(
        lines.len() + 1 < 30,
        "{} events and the verdict for 200 jobs",
        lines.len()
    );
    let run = run_id(&lines);
    assert_no_workers_left(&run);
    assert_eq!(tables_left(&run), 0, "the run's tables are dropped");
}

#[test]
fn naive_mode_processes_jobs_twice_and_loses_the_killed_workers_job() {
    let (lines, verdict, _) = run_json(&["skip-locked", "--mode", "naive", "--fault", "kill"]);
    let m = mode(&verdict, "naive");
    assert!(
        m["duplicates"].as_i64().unwrap() > 0,
        "10 workers reading the same pending id must collide: {m}"
    );
    // The victim's 'running' mark outlives it: nobody ever takes that job again.
    assert_eq!(m["lost"], 1, "{m}");
    assert!(m["reclaim_ms"].is_null(), "{m}");
    let result = processed(&lines);
    assert_eq!(result.times_processed, Some(0), "{result:?}");
    assert_no_workers_left(&run_id(&lines));
}

/// While the worker is stopped, we read the processing table ourselves: its job must not
/// appear, while the other workers' jobs do. Then it resumes and finishes the job once.
#[test]
fn a_frozen_worker_keeps_its_job_until_it_resumes() {
    // Connected before the lab starts: the reads below must all fall inside the freeze, and
    // a connection made after it began would eat into it on a busy machine.
    let mut db = postgres::Client::connect(&servers().postgres, postgres::NoTls).unwrap();
    let mut lab = lockslab(&[
        "skip-locked",
        "--fault",
        "freeze",
        "--pause",
        "2s",
        "--json",
    ])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = BufReader::new(lab.stdout.take().unwrap()).lines();
    let mut lines = Vec::new();
    let started = Instant::now();
    let (processing, frozen) = loop {
        let line = stdout
            .next()
            .expect("the lab ended before the freeze")
            .unwrap();
        let event = event_line(&line).expect("an event before the verdict");
        lines.push(event.clone());
        if event.is("lab", Kind::Frozen) {
            break (round(&lines).processing_table.clone().unwrap(), event);
        }
        assert!(started.elapsed() < Duration::from_secs(30), "no freeze");
    };
    let job = frozen.fault().unwrap().job.unwrap();
    let pid = frozen.fault().unwrap().pid.unwrap();
    // The nemesis records a fault as it starts it, before the signal: wait for the kernel.
    assert!(
        eventually(Duration::from_secs(2), || proc_state(pid) == Some('T')),
        "w2 is stopped"
    );

    let count = |db: &mut postgres::Client, sql: &str| -> i64 {
        db.query_one(&sql.replace("{p}", &processing), &[&job])
            .unwrap()
            .get(0)
    };
    let before = count(&mut db, "SELECT count(*) FROM {p} WHERE job_id > $1");
    // The others carry on around the frozen worker…
    assert!(
        eventually(Duration::from_secs(5), || {
            count(&mut db, "SELECT count(*) FROM {p} WHERE job_id > $1") > before
        }),
        "the other workers processed jobs during the freeze"
    );
    // …and nobody else touches its job for as long as it stays frozen (nor after).
    while proc_state(pid) == Some('T') {
        assert_eq!(
            count(
                &mut db,
                "SELECT count(*) FROM {p} WHERE job_id = $1 AND worker <> 'w2'"
            ),
            0,
            "job {job} was processed while its worker was frozen"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let rest: Vec<String> = stdout.map(Result::unwrap).collect();
    let (more, verdict) = events_and_verdict(&rest.join("\n"));
    lines.extend(more);
    let verdict = &verdict;
    assert!(lab.wait().unwrap().success());
    let resumed = lab_event(&lines, Kind::Resumed).fault().unwrap();
    assert_eq!(resumed.frozen_job_processed, Some(0), "{resumed:?}");
    assert!(resumed.others_processed.unwrap() > 0, "{resumed:?}");
    let committed = lab_event(&lines, Kind::Committed);
    assert_eq!(
        (committed.worker.as_str(), committed.job()),
        ("w2", Some(job))
    );
    let result = processed(&lines);
    assert_eq!(result.times_processed, Some(1), "{result:?}");
    assert_eq!(first_by(result), Some("w2"), "{result:?}");
    assert_eq!(mode(verdict, "skip-locked")["duplicates"], 0);
    assert_eq!(mode(verdict, "skip-locked")["lost"], 0);
    assert!(
        mode(verdict, "skip-locked")["reclaim_ms"].is_null(),
        "no kill"
    );
    assert_no_workers_left(&run_id(&lines));
}

#[test]
fn with_an_idle_timeout_postgres_hands_the_frozen_job_on_and_the_sleepers_insert_fails() {
    let (lines, verdict, _) = run_json(&[
        "skip-locked",
        "--fault",
        "freeze",
        "--pause",
        "1500ms",
        "--idle-timeout",
        "500ms",
        "--jobs",
        "60",
    ]);
    let frozen_job = lab_event(&lines, Kind::Frozen)
        .fault()
        .unwrap()
        .job
        .unwrap();
    let failed = lab_event(&lines, Kind::FinishFailed);
    assert_eq!(failed.worker, "w2");
    assert_eq!(failed.job(), Some(frozen_job));
    assert!(failed.text.contains("idle-in-transaction"), "{failed:?}");
    let taken = handover(lab_event(&lines, Kind::TakenOver));
    assert_ne!(taken.by.as_deref(), Some("w2"));
    let result = processed(&lines);
    assert_eq!(result.times_processed, Some(1), "{result:?}");
    assert_ne!(first_by(result), Some("w2"), "{result:?}");
    let m = mode(&verdict, "skip-locked");
    assert_eq!(
        (&m["duplicates"], &m["lost"]),
        (&0.into(), &0.into()),
        "{m}"
    );
    assert_no_workers_left(&run_id(&lines));
}

#[test]
fn compare_runs_three_modes_and_for_update_workers_wait_on_one_row_lock() {
    let (lines, verdict, _) = run_json(&[
        "skip-locked",
        "--compare",
        "--jobs",
        "100",
        "--pause",
        "300ms",
    ]);
    let names: Vec<&str> = verdict["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mode"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["skip-locked", "naive", "for-update"]);
    let (skip, naive, for_update) = (
        mode(&verdict, "skip-locked"),
        mode(&verdict, "naive"),
        mode(&verdict, "for-update"),
    );
    for m in [skip, naive, for_update] {
        assert_eq!(m["jobs"], 200, "100 + 50 + 50: {m}");
    }
    assert_eq!(skip["duplicates"], 0);
    assert_eq!(for_update["duplicates"], 0);
    assert_eq!(for_update["lost"], 0);
    assert!(naive["duplicates"].as_i64().unwrap() > 0, "{naive}");
    assert!(skip["reclaim_ms"].is_number() && for_update["reclaim_ms"].is_number());
    assert!(naive["reclaim_ms"].is_null());
    // (That for-update is the slowest is a timing: `cargo bench --bench skip_locked` prints
    // the three modes' jobs/s. The evidence that its workers take turns is below.)
    // Every event says which mode it belongs to, and the modes share one clock: each mode's
    // events come after all of the previous mode's.
    let events = &lines;
    let mut last_of_previous = 0;
    for name in names {
        let of_mode: Vec<u64> = events
            .iter()
            .filter(|e| e.part.mode.as_deref() == Some(name))
            .map(|e| e.t_ms)
            .collect();
        assert!(
            of_mode.iter().all(|&t| t >= last_of_previous),
            "{name}'s t_ms restarted"
        );
        last_of_previous = *of_mode.iter().max().expect("events of every mode");
    }
    assert!(
        events.iter().all(|e| e.part.mode.is_some()),
        "every event has its mode"
    );
    // In for-update mode the frozen worker's row lock stalls everyone, and Postgres shows it.
    assert!(
        lines
            .iter()
            .any(|e| e.kind() == Kind::Blocked && e.part.mode.as_deref() == Some("for-update")),
        "pg_stat_activity shows workers waiting on the frozen worker's lock"
    );
    assert_no_workers_left(&run_id(&lines));
}

#[test]
fn human_output_tells_the_story_and_the_verdict() {
    let text = run_human(&["skip-locked", "--jobs", "60", "--pause", "300ms"]);
    for expected in [
        "Round 1",
        "SIGKILL w1",
        "after the kill",
        "SIGSTOP w2",
        "idle in transaction",
        "Verdict",
        "exactly once",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

/// With a single job in the freeze round, nobody else processing anything is not a stalled
/// queue: the sentence follows what pg_blocking_pids measured, not the missing work.
#[test]
fn a_lone_frozen_job_is_not_called_a_stalled_queue() {
    let text = run_human(&[
        "skip-locked",
        "--fault",
        "freeze",
        "--jobs",
        "1",
        "--pause",
        "300ms",
    ]);
    assert!(text.contains("the round's only job"), "{text}");
    assert!(!text.contains("stood still"), "{text}");
    // "1 jobs" as two words; "171 jobs/s" must not count.
    let words: Vec<&str> = text.split_whitespace().collect();
    assert!(
        !words.windows(2).any(|pair| pair == ["1", "jobs"]),
        "plurals: {text}"
    );
}

#[test]
fn ctrl_c_while_a_worker_is_frozen_leaves_nothing_behind() {
    let mut lab = lockslab(&[
        "skip-locked",
        "--fault",
        "freeze",
        "--pause",
        "20s",
        "--json",
    ])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = Vec::new();
    let mut stdout = BufReader::new(lab.stdout.take().unwrap()).lines();
    let pid = loop {
        let event = event_line(&stdout.next().unwrap().unwrap()).expect("an event");
        lines.push(event.clone());
        if event.kind() == Kind::Frozen {
            break event.fault().unwrap().pid.unwrap();
        }
    };
    assert!(eventually(Duration::from_secs(2), || proc_state(pid) == Some('T')));
    kill(Pid::from_raw(lab.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(lab.wait().unwrap().code(), Some(130));
    assert_eq!(
        proc_state(pid),
        None,
        "the frozen worker is gone, not a zombie"
    );
    assert_no_workers_left(&run_id(&lines));
}

#[test]
fn bad_flags_name_the_flag() {
    let cases: [(&[&str], &str); 5] = [
        (
            &["skip-locked", "--idle-timeout", "100ms"],
            "--idle-timeout",
        ),
        (&["skip-locked", "--workers", "2"], "--workers"),
        // The fault as it is typed, not as Rust spells it.
        (
            &["skip-locked", "--workers", "2"],
            "--fault both needs at least 3",
        ),
        (
            &["skip-locked", "--workers", "0", "--fault", "none"],
            "--fault none needs at least 1 (someone has to work the queue)",
        ),
        (
            &["skip-locked", "--mode", "naive", "--compare"],
            "--compare",
        ),
    ];
    for (args, flag) in cases {
        let output = lockslab_offline(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?} is a command-line error"
        );
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

// ─── Replays: recorded `--json` runs through the lab's checkers, no servers ──────────────

/// `lockslab skip-locked --compare --jobs 60 --pause 300ms --json`: all three modes, a kill
/// and a freeze in each.
const COMPARE: &str = include_str!("fixtures/skip-locked.jsonl");
/// `lockslab skip-locked --fault freeze --pause 1500ms --idle-timeout 500ms --jobs 60 --json`.
const IDLE_TIMEOUT: &str = include_str!("fixtures/skip-locked-idle-timeout.jsonl");

use lockslab::check::skip_locked as checks;

/// A recorded run replayed by the lab's own replay (what `lockslab check` runs): every mode's
/// verdict follows from its history by the lab's checkers — the counts, the reclaim, the
/// line the lab wrote from the processing table; and what became of the killed and the
/// frozen job, for the stories below.
fn check_replay(
    jsonl: &str,
) -> Vec<(
    String,
    Option<checks::KillOutcome>,
    Option<checks::FrozenJob>,
)> {
    let (events, verdict) = events_and_verdict(jsonl);
    let replayed = lockslab::labs::skip_locked::replay(&events, &verdict).unwrap();
    assert_replays(&replayed);
    let mut seen = Vec::new();
    for m in verdict["modes"].as_array().unwrap() {
        let name = m["mode"].as_str().unwrap();
        let events: Vec<Event> = events
            .iter()
            .filter(|e| e.part.mode.as_deref() == Some(name))
            .cloned()
            .collect();
        let found = lockslab::labs::skip_locked::replay_mode(&events).unwrap();
        assert_eq!(
            (found.processed.duplicates, found.processed.lost),
            (
                m["duplicates"].as_i64().unwrap(),
                m["lost"].as_i64().unwrap()
            )
        );
        // The checker's exactly-once, from the table's figures, is the verdict's.
        assert_eq!(
            checks::every_job_once(&found.processed),
            m["duplicates"] == 0 && m["lost"] == 0,
            "{name}"
        );
        match &found.kill {
            Some(checks::KillOutcome::Reclaimed { after_ms, .. }) => {
                assert_eq!(m["reclaim_ms"].as_f64(), Some(*after_ms), "{name}")
            }
            _ => assert!(m["reclaim_ms"].is_null(), "{name}"),
        }
        seen.push((name.to_string(), found.kill, found.frozen));
    }
    seen
}

#[test]
fn a_recorded_compare_run_replays_through_the_checkers() {
    let seen = check_replay(COMPARE);
    let names: Vec<&str> = seen.iter().map(|(name, ..)| name.as_str()).collect();
    assert_eq!(names, ["skip-locked", "naive", "for-update"]);
    for (name, kill, freeze) in &seen {
        match name.as_str() {
            // A transaction's claim dies with its connection: someone else takes the job.
            "skip-locked" | "for-update" => assert!(
                matches!(kill, Some(checks::KillOutcome::Reclaimed { by, .. }) if by != "w1"),
                "{name}: {kill:?}"
            ),
            // A 'running' mark outlives its worker.
            _ => assert!(
                matches!(
                    kill,
                    Some(checks::KillOutcome::Lost {
                        holder_dead: true,
                        ..
                    })
                ),
                "{name}: {kill:?}"
            ),
        }
        assert_eq!(*freeze, Some(checks::FrozenJob::Kept), "{name}");
    }
}

#[test]
fn a_recorded_idle_timeout_run_replays_as_a_refused_late_write() {
    let seen = check_replay(IDLE_TIMEOUT);
    assert_eq!(seen.len(), 1);
    let (_, kill, freeze) = &seen[0];
    assert_eq!(*kill, None, "--fault freeze: no kill");
    assert_eq!(
        *freeze,
        Some(checks::FrozenJob::Refused {
            during_freeze: true
        })
    );
}
