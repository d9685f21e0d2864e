//! Lab 7 against a real Redis and Postgres: every approach's verdict is read back from the
//! invoices and balances; a freeze lands at every point of a job, the approaches the lab
//! marks ✅ survive it at every point, the two lessons fail where they fail; and nothing of
//! a run — workers, tables, keys — outlives it, Ctrl-C included.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

fn approach<'a>(verdict: &'a Value, name: &str) -> &'a Value {
    verdict["approaches"]
        .as_array()
        .expect("approaches array")
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("no approach {name} in {verdict}"))
}

/// The lab's own event of a kind in one approach's run.
fn event_of<'a>(lines: &'a [Event], name: &str, kind: Kind) -> Option<&'a Event> {
    lines
        .iter()
        .find(|e| e.part.approach.as_deref() == Some(name) && e.kind() == kind)
}

/// The tables' line of one approach's run: what they counted back.
fn tables_line<'a>(lines: &'a [Event], name: &str) -> Option<&'a facts::Observed> {
    event_of(lines, name, Kind::TablesRead).and_then(observed)
}

/// A worker's session as Postgres listed it in one approach's run.
fn session<'a>(lines: &'a [Event], name: &str) -> Option<&'a facts::Session> {
    match &event_of(lines, name, Kind::Session)?.what {
        What::Session(s) => Some(s),
        _ => None,
    }
}

fn schema_exists(run_id: &str) -> bool {
    let mut db = postgres::Client::connect(&servers().postgres, postgres::NoTls).unwrap();
    db.query_one(
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
        &[&format!("lockslab_{run_id}")],
    )
    .unwrap()
    .get(0)
}

fn redis_keys(run_id: &str) -> Vec<String> {
    let mut redis = lockslab::connect::redis(&servers().redis).unwrap();
    redis::cmd("KEYS")
        .arg(format!("lockslab:{run_id}:*"))
        .query(&mut redis)
        .unwrap()
}

fn run_id_of(verdict: &Value) -> String {
    verdict["run_id"].as_str().expect("run_id").to_string()
}

/// Each freeze of one approach's run: (point, correct), in the order of a job.
fn freezes(a: &Value) -> Vec<(String, bool)> {
    a["freezes"]
        .as_array()
        .unwrap_or_else(|| panic!("no freezes in {a}"))
        .iter()
        .map(|p| {
            (
                p["at"].as_str().unwrap().to_string(),
                p["correct"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Each freeze's cell, as the verdict's table shows it: "ok", "FAILED", or "untested" (no
/// other worker met the frozen one before its SIGCONT, and the tables say it came out right).
fn cells(a: &Value) -> Vec<&'static str> {
    a["freezes"]
        .as_array()
        .unwrap()
        .iter()
        .map(
            |p| match (p["correct"].as_bool(), p["exercised"].as_bool()) {
                (Some(false), _) => "FAILED",
                (Some(true), Some(true)) => "ok",
                (Some(true), Some(false)) => "untested",
                _ => panic!("a freeze without correct and exercised: {p}"),
            },
        )
        .collect()
}

const POINTS: [&str; 4] = ["before-read", "decided", "mid-write", "before-commit"];

#[test]
fn every_safe_approach_survives_a_freeze_at_every_point_and_the_lessons_fail_where_they_fail() {
    let (lines, verdict, _) = run_json(&[
        "no-lock", "--jobs", "100", "--pause", "1s", "--ttl", "300ms",
    ]);
    let names: Vec<&str> = verdict["approaches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "redis-lock",
            "fenced-write-only",
            "optimistic",
            "serializable",
            "idempotency-key",
            "partitioned",
            "advisory-xact",
            "advisory-session",
            "redis-fenced"
        ]
    );
    for field in [
        "name",
        "duplicates",
        "lost_updates",
        "lost_jobs",
        "jobs_per_s",
        "retries",
        "p50_ms",
        "p99_ms",
    ] {
        for name in &names {
            assert!(
                approach(&verdict, name).get(field).is_some(),
                "{name} has no {field}"
            );
        }
    }

    // The sweep: four workers frozen past the TTL (1s on a 300ms lease), one at each point
    // of a job. Every point reached in every approach's run, and each judged from the
    // tables: the frozen job's invoices and its customer's balance.
    for name in &names {
        let a = approach(&verdict, name);
        let at: Vec<String> = freezes(a).into_iter().map(|(at, _)| at).collect();
        assert_eq!(at, POINTS, "{name}: {a}");
        if a["safe"] == true {
            assert!(
                freezes(a).iter().all(|(_, correct)| *correct),
                "{name} is marked safe: {a}"
            );
        }
        let bad = tables_line(&lines, name).expect("the tables' line");
        for point in a["freezes"].as_array().unwrap() {
            let names = |list: &Option<Vec<i64>>, key: &str| {
                let list = list.as_ref().unwrap();
                point[key].as_i64().is_some_and(|n| list.contains(&n))
            };
            let named = names(&bad.bad_jobs, "job") || names(&bad.bad_customers, "customer");
            assert_eq!(
                named,
                point["correct"] == false,
                "{name}: a point is wrong exactly when the tables name its job or customer: {point} {bad:?}"
            );
        }
    }
    let safe: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| approach(&verdict, name)["safe"] == true)
        .collect();
    assert_eq!(safe, &names[2..], "all but the two lessons are marked safe");
    // Before each SIGCONT the lab waited until another worker had met the frozen one (it
    // waits on its locks, or it did the frozen job); a point nobody met is "untested", never
    // "ok". So each lesson fails exactly where the walkthrough says, or says it was not put
    // to the test — no cell is a matter of timing.
    let allowed = |name: &str, want: [&str; 4]| {
        let got = cells(approach(&verdict, name));
        for (point, (got, want)) in POINTS.iter().zip(got.iter().zip(want)) {
            assert!(
                *got == want || *got == "untested",
                "{name} at {point}: {got}, the walkthrough says {want}: {:?}",
                approach(&verdict, name)["freezes"]
            );
        }
    };
    // Unfenced: the sleeper finds the job done if it has not read yet; wrong from the read on.
    allowed("redis-lock", ["ok", "FAILED", "FAILED", "FAILED"]);
    // Fenced the write, not the read: a stale *decision* is refused at its write; a freeze
    // inside the transaction is not — the holder queued on the sleeper's row read before it.
    allowed("fenced-write-only", ["ok", "ok", "FAILED", "FAILED"]);
    for name in &names[2..] {
        allowed(name, ["ok"; 4]);
    }
    let untested: Vec<(&str, Vec<&str>)> = names
        .iter()
        .map(|name| (*name, cells(approach(&verdict, name))))
        .filter(|(_, cells)| cells.contains(&"untested"))
        .collect();
    assert!(
        untested.is_empty(),
        "on an idle machine every point is met within the wait: {untested:?}"
    );

    // The baseline: the frozen worker's job comes out wrong, and the tables say how.
    let baseline = approach(&verdict, "redis-lock");
    assert_eq!(baseline["correct_under_freeze"], false, "{baseline}");
    assert!(
        baseline["duplicates"].as_i64().unwrap() + baseline["lost_updates"].as_i64().unwrap() > 0,
        "{baseline}"
    );
    let frozen_job = baseline["frozen_job"].as_i64().unwrap();
    let tables_said = tables_line(&lines, "redis-lock").expect("the tables' line");
    assert!(tables_said.counted_wrong() > 0, "{tables_said:?}");
    assert!(
        tables_said.bad_jobs.as_ref().unwrap().contains(&frozen_job)
            || !tables_said.bad_customers.as_ref().unwrap().is_empty(),
        "{tables_said:?}"
    );
    assert!(
        event_of(&lines, "redis-lock", Kind::Expired).is_some(),
        "Redis ended w1's lease during the freeze"
    );
    // A kill is not what breaks it: the killed transaction rolls back, the lock lapses.
    assert_eq!(baseline["correct_under_kill"], true, "{baseline}");

    for name in &names[2..] {
        let a = approach(&verdict, name);
        assert_eq!(
            (&a["duplicates"], &a["lost_updates"], &a["lost_jobs"]),
            (&0.into(), &0.into(), &0.into()),
            "{a}"
        );
        assert_eq!(a["correct_under_freeze"], true, "{a}");
        assert_eq!(a["correct_under_kill"], true, "{a}");
        assert!(a["jobs_per_s"].as_f64().unwrap() > 0.0, "{a}");
    }

    // Each way of staying correct under the freeze leaves its own trace.
    let count = |name: &str, field: &str| approach(&verdict, name)[field].as_i64().unwrap();
    assert!(
        count("optimistic", "conflicts") >= 1,
        "w1's stale version conflicts"
    );
    assert!(
        count("serializable", "conflicts") >= 1,
        "w1's stale snapshot is rolled back and read again"
    );
    assert!(
        count("idempotency-key", "no_ops") >= 1,
        "w1's late insert is a no-op"
    );
    assert!(
        count("fenced-write-only", "rejected") >= 1,
        "w1's lower token is refused at its write"
    );
    assert!(
        count("redis-fenced", "rejected") >= 1,
        "w3's lower token claims nothing"
    );
    assert!(
        count("redis-lock", "lock_retries") >= 1
            && count("redis-lock", "retries") >= count("redis-lock", "lock_retries"),
        "retries include the lock spins"
    );
    assert!(
        count("partitioned", "waited_for_the_freeze") >= 1,
        "w1's partition waits for it"
    );
    let held = session(&lines, "advisory-xact").expect("w1's session");
    assert_eq!(
        held.state.as_deref(),
        Some("idle in transaction"),
        "{held:?}"
    );
    // A worker that should skip rather than queue: the try-lock says no at once, and the
    // waiting form under lock_timeout gives up with lock_not_available.
    for name in ["advisory-xact", "advisory-session"] {
        let skip = event_of(&lines, name, Kind::GaveUp).expect("the skip probe");
        let What::GaveUp(probe) = &skip.what else {
            unreachable!()
        };
        assert_eq!(
            (probe.try_lock, probe.sqlstate.as_deref()),
            (Some(false), Some("55P03")),
            "{skip:?}"
        );
    }
    assert!(
        held.waiting.unwrap() >= 1,
        "others wait for the frozen session's advisory lock: {held:?}"
    );
    let held = session(&lines, "advisory-session").expect("w1's session");
    assert_eq!(
        held.state.as_deref(),
        Some("idle"),
        "a session lock is held outside a transaction"
    );
    // The partitioned run gives the dead owner's partition to a new one.
    assert!(event_of(&lines, "partitioned", Kind::Reclaimed).is_some());

    assert_one_clock(&lines);
    let pids = worker_pids(&lines);
    assert!(pids.len() >= 80, "ten workers per approach: {pids:?}");
    assert_gone(&pids);
    let run_id = run_id_of(&verdict);
    assert!(!schema_exists(&run_id), "the run's schema is dropped");
    assert!(
        redis_keys(&run_id).is_empty(),
        "the run's Redis keys are gone"
    );
}

/// The database's own answer: the read and both writes in one SERIALIZABLE transaction,
/// retried on 40001/40P01. A freeze at every point of a job, met by another worker before
/// the SIGCONT, and the kill: every job once, every balance right — and the price, in
/// transactions Postgres rolled back. (Run at READ COMMITTED instead, the same code
/// invoices jobs twice at every point.)
#[test]
fn serializable_survives_a_freeze_at_every_point_and_pays_in_retries() {
    let (lines, verdict, _) =
        run_json(&["no-lock", "serializable", "--jobs", "100", "--pause", "1s"]);
    let a = approach(&verdict, "serializable");
    assert_eq!(a["safe"], true, "{a}");
    let at: Vec<String> = freezes(a).into_iter().map(|(at, _)| at).collect();
    assert_eq!(at, POINTS, "{a}");
    assert_eq!(cells(a), ["ok"; 4], "every point met and right: {a}");
    assert_eq!(a["correct_under_kill"], true, "{a}");
    assert_eq!(
        (&a["duplicates"], &a["lost_updates"], &a["lost_jobs"]),
        (&0.into(), &0.into(), &0.into()),
        "{a}"
    );
    let conflicts = a["conflicts"].as_u64().unwrap();
    assert!(conflicts >= 1, "the stale sleepers are rolled back: {a}");
    assert!(a["retries"].as_u64().unwrap() >= conflicts, "{a}");
    assert_eq!(a["lock_retries"], 0, "no lock at all: {a}");
    let said = verdict["text"].to_string();
    assert!(
        said.contains("40001"),
        "the verdict shows the retries: {said}"
    );
    assert_eq!(
        tables_line(&lines, "serializable").map(|t| t.bad_jobs.clone()),
        Some(Some(vec![])),
        "the tables name no job"
    );
    assert_gone(&worker_pids(&lines));
}

#[test]
fn human_output_fits_a_projector_and_names_the_failure() {
    let text = run_human(&[
        "no-lock",
        "redis-lock",
        "--jobs",
        "60",
        "--pause",
        "800ms",
        "--ttl",
        "200ms",
    ]);
    let verdict = text
        .split("Verdict")
        .nth(1)
        .unwrap_or_else(|| panic!("no verdict in:\n{text}"));
    for line in verdict.lines() {
        assert!(
            line.chars().count() <= 80,
            "{} columns: {line}",
            line.chars().count()
        );
    }
    for expected in ["FAILED", "SIGSTOP w1", "SIGKILL w2", "invoiced twice"] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn optimistic_retries_grow_with_the_workers() {
    let (_, verdict, _) = run_json(&["no-lock", "optimistic", "--contention", "--jobs", "60"]);
    let runs = verdict["approaches"].as_array().unwrap();
    let workers: Vec<i64> = runs
        .iter()
        .map(|r| r["workers"].as_i64().unwrap())
        .collect();
    assert_eq!(workers, [2, 4, 8, 16, 32]);
    for run in runs {
        assert_eq!(
            (&run["duplicates"], &run["lost_updates"], &run["lost_jobs"]),
            (&0.into(), &0.into(), &0.into()),
            "{run}"
        );
    }
    assert!(
        runs[4]["retries"].as_i64().unwrap() > runs[0]["retries"].as_i64().unwrap(),
        "32 workers on 4 customers conflict more than 2: {verdict}"
    );
    assert!(!schema_exists(&run_id_of(&verdict)));
}

#[test]
fn ctrl_c_while_a_worker_is_frozen_leaves_no_worker_table_or_key() {
    let mut lab = lockslab(&["no-lock", "redis-lock", "--pause", "20s", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = Vec::new();
    let mut stdout = BufReader::new(lab.stdout.take().unwrap()).lines();
    let frozen = loop {
        let line = stdout
            .next()
            .expect("the lab ended before the freeze")
            .unwrap();
        let event = event_line(&line).expect("an event before the verdict");
        lines.push(event.clone());
        if event.kind() == Kind::Frozen {
            break event.fault().unwrap().pid.unwrap();
        }
    };
    assert!(eventually(std::time::Duration::from_secs(2), || {
        proc_state(frozen) == Some('T')
    }));
    let run_id = common::run_id_of(&lines)
        .expect("the workers line names the run")
        .to_string();
    assert!(schema_exists(&run_id), "the tables exist while it runs");
    kill(Pid::from_raw(lab.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(lab.wait().unwrap().code(), Some(130));
    assert_eq!(proc_state(frozen), None, "the frozen worker is gone");
    assert_gone(&worker_pids(&lines));
    assert!(!schema_exists(&run_id), "the run's schema is dropped");
    assert!(
        redis_keys(&run_id).is_empty(),
        "the run's Redis keys are gone"
    );
}

#[test]
fn bad_flags_name_the_flag() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["no-lock", "--workers", "2"],
            "--fault both needs at least 6",
        ),
        (&["no-lock", "--workers", "51"], "--workers 51"),
        (&["no-lock", "--keys", "1"], "--keys 1"),
        (&["no-lock", "pessimistic"], "pessimistic"),
    ];
    for (args, expected) in cases {
        let output = lockslab_offline(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A real run's `--json` (`no-lock --jobs 20`, all eight approaches), replayed through the
/// lab's checkers with no server by the lab's own replay (what `lockslab check` runs): the
/// freezes and the kill the lab recorded, and the tables' line it read back, give every
/// approach's verdict again.
#[test]
fn a_recorded_run_replayed_through_the_checkers_gives_its_verdict_again() {
    let (lines, verdict) = events_and_verdict(include_str!("fixtures/no-lock.jsonl"));
    let replayed = lockslab::labs::no_lock::replay(&lines, &verdict).unwrap();
    assert_replays(&replayed);
    assert_eq!(replayed.parts.len(), 8, "every approach");
    let mut failed_somewhere = Vec::new();
    for part in &replayed.parts {
        let name = part.recorded["name"].as_str().unwrap();
        for field in ["freezes", "correct_under_freeze", "correct_under_kill"] {
            assert_eq!(
                part.replayed[field], part.recorded[field],
                "{name}: {field}"
            );
        }
        // The figures the history's tables line holds are the verdict's.
        for field in ["duplicates", "lost_jobs", "lost_updates"] {
            assert_eq!(
                part.replayed[field], part.recorded[field],
                "{name}: {field}"
            );
        }
        if part.recorded["safe"] == true {
            assert_eq!(part.replayed["correct_under_freeze"], true, "{name}");
        }
        let points = part.replayed["freezes"].as_array().unwrap();
        if points.iter().any(|p| p["correct"] == false) {
            failed_somewhere.push(name);
        }
    }
    assert_eq!(failed_somewhere, ["redis-lock", "fenced-write-only"]);
}

/// While the lab runs: each Postgres backend that waits directly on a frozen worker of
/// `run_id`'s `approach` at one of `frozen` (session names end in `-w4`, `-w5`) is stopped
/// once, for `stall`, the way a busy machine may leave a woken backend unscheduled. Returns
/// how many it stopped. Every stopped backend is continued before this returns.
fn stall_the_waiters(
    run_id: &str,
    approach: &str,
    frozen: &[&str],
    stall: std::time::Duration,
    done: &std::sync::atomic::AtomicBool,
) -> usize {
    use std::sync::atomic::Ordering;
    use std::time::Instant;
    let mut db = postgres::Client::connect(&servers().postgres, postgres::NoTls).unwrap();
    let frozen: Vec<String> = frozen
        .iter()
        .map(|w| format!("lockslab-{run_id}-{approach}-{w}"))
        .collect();
    let mut stopped: Vec<(i32, Instant)> = Vec::new();
    let mut seen: Vec<i32> = Vec::new();
    while !done.load(Ordering::Relaxed) || !stopped.is_empty() {
        if !done.load(Ordering::Relaxed) {
            let waiters = db
                .query(
                    "SELECT other.pid FROM pg_stat_activity me, pg_stat_activity other
                     WHERE me.application_name = ANY($1)
                       AND me.pid = ANY(pg_blocking_pids(other.pid))",
                    &[&frozen],
                )
                .unwrap();
            for row in waiters {
                let pid: i32 = row.get(0);
                if !seen.contains(&pid) {
                    seen.push(pid);
                    kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
                    stopped.push((pid, Instant::now()));
                }
            }
        }
        stopped.retain(|&(pid, since)| {
            let due = since.elapsed() >= stall || done.load(Ordering::Relaxed);
            if due {
                kill(Pid::from_raw(pid), Signal::SIGCONT).unwrap();
            }
            !due
        });
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    seen.len()
}

/// The lesson inside the transaction does not rest on a quiet machine. A worker frozen
/// mid-write or before COMMIT is met by a newer holder that read before the COMMIT and
/// queues on the row; on a busy machine that holder's backend may wake late, and a newcomer
/// that read *after* the COMMIT would write first, raise the fence and get the stale write
/// refused: `ok` or `untested` where the walkthrough promises FAILED. Here the test itself
/// stops each such backend for longer than the TTL — the lab must still arrange the worst
/// order from what Postgres shows (it holds the customer's lock until the waiters wrote).
#[test]
fn fenced_write_only_fails_inside_the_transaction_even_when_its_waiters_wake_late() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let design = "fenced-write-only";
    let mut lab = lockslab(&[
        "no-lock", design, "--fault", "freeze", "--jobs", "100", "--pause", "1s", "--ttl", "300ms",
        "--json",
    ])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = BufReader::new(lab.stdout.take().unwrap()).lines();
    let mut lines: Vec<String> = Vec::new();
    let run_id = loop {
        let line = stdout.next().expect("the lab ended early").unwrap();
        lines.push(line.clone());
        if let Some(id) = event_line(&line).as_ref().and_then(|e| e.run_id()) {
            break id.to_string();
        }
    };
    let done = AtomicBool::new(false);
    let stalled = std::thread::scope(|scope| {
        let staller = scope.spawn(|| {
            stall_the_waiters(
                &run_id,
                design,
                &["w4", "w5"],
                std::time::Duration::from_millis(1500),
                &done,
            )
        });
        lines.extend(stdout.map(|line| line.unwrap()));
        done.store(true, Ordering::Relaxed);
        staller.join().unwrap()
    });
    assert!(lab.wait().unwrap().success());
    let (_, verdict) = events_and_verdict(&lines.join("\n"));
    assert!(
        stalled > 0,
        "no backend waited on w4 or w5 to stall: {verdict}"
    );
    let a = approach(&verdict, design);
    assert_eq!(
        cells(a)[2..],
        ["FAILED", "FAILED"],
        "mid-write and before-commit, with the waiters' backends {stalled} times stalled: {}",
        a["freezes"]
    );
}
