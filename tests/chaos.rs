//! `lockslab chaos` against real servers: a seeded run draws the same schedules every time;
//! a pause aimed between a client's read and its write breaks the unfenced Redis lock and
//! not its fenced twin (the token claims the record before the read); Ctrl-C leaves no
//! client, server or row behind.

use crate::common;

use std::collections::HashSet;
use std::process::Stdio;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// A pause of A, 2ms after its second read, for 2s (the lock's TTL is 800ms).
const BETWEEN_READ_AND_WRITE: &str = r#"[{"at_ms":2,"after":{"worker":"A","event":"read_record","nth":2},"fault":"pause","target":"A","duration_ms":2000}]"#;

fn json_lines(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
        .collect()
}

/// The `schedule` lines of a chaos run that must end 0 (no violation, no unknown).
fn schedule_lines(mut command: std::process::Command) -> Vec<Value> {
    let output = command.output().unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    json_lines(&output.stdout)
        .into_iter()
        .filter(|line| line["kind"] == "schedule")
        .collect()
}

/// The first history's line (its events come before it).
fn first_schedule(lines: &[Value]) -> &Value {
    lines
        .iter()
        .find(|line| line["kind"] == "schedule")
        .expect("a schedule line")
}

/// The kinds of the violations a verdict names.
fn violation_kinds(verdict: &Value) -> HashSet<&str> {
    verdict["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["kind"].as_str())
        .collect()
}

fn rows_of(run_id: &str) -> i64 {
    let mut db = postgres::Client::connect(&servers().postgres, postgres::NoTls).unwrap();
    let exists: bool = db
        .query_one(
            "SELECT to_regclass('lockslab_chaos_record') IS NOT NULL",
            &[],
        )
        .unwrap()
        .get(0);
    if !exists {
        return 0;
    }
    let mut rows = 0;
    for table in [
        "lockslab_chaos_record",
        "lockslab_chaos_attempt",
        "lockslab_chaos_log",
    ] {
        let n: i64 = db
            .query_one(
                &format!("SELECT count(*) FROM {table} WHERE run_id LIKE $1"),
                &[&format!("{run_id}%")],
            )
            .unwrap()
            .get(0);
        rows += n;
    }
    rows
}

#[test]
fn a_seeded_run_draws_the_same_schedules_every_time() {
    let run = || {
        let args = [
            "chaos",
            "--design",
            "optimistic",
            "--seed",
            "4242",
            "--schedules",
            "2",
            "--json",
        ];
        schedule_lines(lockslab(&args))
            .into_iter()
            .map(|line| (line["seed"].clone(), line["schedule"].clone()))
            .collect::<Vec<_>>()
    };
    let first = run();
    assert_eq!(first.len(), 2);
    assert_eq!(first, run(), "the same seed, the same schedules");
}

#[test]
fn a_pause_between_read_and_write_breaks_the_redis_lock_and_not_its_fenced_twin() {
    let play = |design: &str| {
        lockslab(&[
            "chaos",
            "--design",
            design,
            "--schedule",
            BETWEEN_READ_AND_WRITE,
            "--no-shrink",
            "--json",
        ])
        .output()
        .unwrap()
    };
    let broken = play("redis-lock");
    let lines = json_lines(&broken.stdout);
    let verdict = lines.last().unwrap();
    assert_eq!(broken.status.code(), Some(1), "{verdict}");
    let kinds = violation_kinds(verdict);
    assert!(
        kinds.contains("stale-write") && kinds.contains("lost-update"),
        "{verdict}"
    );
    // Redis never granted the lock twice: each key ran out before another client took
    // it. The releases that found another's value came after their TTL: no two holders.
    assert!(!kinds.contains("two-holders"), "{verdict}");
    assert!(verdict["replay"].as_str().unwrap().contains("--schedule"));

    let fenced = play("redis-fenced");
    let lines = json_lines(&fenced.stdout);
    let schedule = first_schedule(&lines);
    assert_eq!(fenced.status.code(), Some(0), "{schedule}");
    assert_eq!(schedule["result"], "safe");
    assert!(
        schedule["accepted"].as_u64().unwrap() > 0,
        "the clients did write"
    );
    assert!(
        schedule["attempts"].as_u64() > schedule["accepted"].as_u64(),
        "the paused client's write was refused: {schedule}"
    );
    assert_eq!(
        rows_of(schedule["run_id"].as_str().unwrap()),
        0,
        "rows removed"
    );
}

/// The database's own answer under the pause that breaks the Redis lock: A's read and
/// write share one SERIALIZABLE transaction, so the write computed from A's stale read
/// never commits — Postgres rolls it back (40001) and A reads again. Every attempt the
/// store kept was accepted, and the checker finds nothing. (The same client at READ
/// COMMITTED writes stale on both schedules.)
#[test]
fn a_pause_between_read_and_write_does_not_break_serializable() {
    let (code, schedules, verdict, _) = replay("serializable", BETWEEN_READ_AND_WRITE, "2");
    assert_eq!(code, Some(0), "{verdict}");
    assert_eq!(schedules.len(), 2, "{verdict}");
    for line in &schedules {
        assert_eq!(line["result"], "safe", "{line}");
        assert_eq!(line["unplayed"], 0, "the pause played: {line}");
        assert!(
            line["accepted"].as_u64().unwrap() > 0,
            "the clients did write"
        );
        assert_eq!(rows_of(line["run_id"].as_str().unwrap()), 0, "rows removed");
    }
}

/// Interrupted while a client lies paused for 30s: the run never reaches its own cleanup,
/// so only the interrupt's removes the history's rows.
#[test]
fn ctrl_c_mid_run_leaves_no_client_server_or_row_behind() {
    let mut chaos = lockslab(&[
        "chaos",
        "--design",
        "advisory-xact",
        "--schedule",
        r#"[{"at_ms":300,"fault":"pause","target":"A","duration_ms":30000}]"#,
        "--json",
    ])
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    // The history's rows exist, and A is stopped.
    assert!(eventually(std::time::Duration::from_secs(30), || {
        rows_of("%advisory_xact") > 0
            && children_of(chaos.id())
                .iter()
                .any(|(_, state, _)| *state == 'T')
    }));
    let mut family = HashSet::from([chaos.id() as i32]);
    family_in(&process_table(), &mut family);
    family.remove(&(chaos.id() as i32));
    kill(Pid::from_raw(chaos.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(chaos.wait().unwrap().code(), Some(130));
    assert_gone(&family.into_iter().collect::<Vec<_>>());
    assert_eq!(rows_of("%advisory_xact"), 0, "no row of the run is left");
}

/// A schedule chaos could not play (a pause with no end, or one of years; a client's clock
/// stepped, or a server's jumping at no grant; a step after the run; a delay with no length, a lost reply on a path the design lacks)
/// would pass for a replay of it: each is refused as a usage error,
/// before any server starts.
#[test]
fn a_schedule_chaos_cannot_play_is_refused_up_front() {
    for (schedule, says) in [
        (
            r#"[{"at_ms":0,"fault":"pause","target":"A"}]"#,
            "needs a duration_ms",
        ),
        (
            r#"[{"at_ms":0,"fault":"pause","target":"A","duration_ms":99999999999}]"#,
            "longer than chaos plays",
        ),
        (
            r#"[{"at_ms":99999999,"fault":"kill","target":"A"}]"#,
            "never be played",
        ),
        // A client's wall clock (its leases run on the monotonic clock), a clock rate, a
        // server jump aimed at no grant.
        (
            r#"[{"at_ms":100,"fault":"clock_step","target":"A"}]"#,
            "monotonic clock",
        ),
        (
            r#"[{"at_ms":100,"fault":"clock_rate","target":"A"}]"#,
            "no clock rate",
        ),
        (
            r#"[{"at_ms":100,"fault":"clock_step","target":"redis"}]"#,
            r#""event": "acquired""#,
        ),
        ("{}", "neither a JSON array"),
        // A misspelt fault: the faults chaos plays, not every name the engine knows.
        (
            r#"[{"at_ms":0,"fault":"pauze","target":"A","duration_ms":900}]"#,
            "chaos plays pause, resume, kill",
        ),
        // A network step: a delay with no length, a lost reply on the store, where redis-lock does not
        // ask for its lock (a lab's `A→etcd` is redis-lock's `A→redis`, by the rule of `--schedule`).
        (
            r#"[{"at_ms":0,"fault":"delay","target":"A→store"}]"#,
            "needs a duration_ms",
        ),
        (
            r#"[{"at_ms":0,"fault":"drop_reply","target":"A→store"}]"#,
            "A→redis for redis-lock",
        ),
        // Under a failover the clients reach the primary Sentinel names, not the proxy.
        (
            r#"[{"at_ms":300,"fault":"restart","target":"redis-primary"},{"at_ms":0,"fault":"cut","target":"A→redis","duration_ms":1500}]"#,
            "not through the fault proxy",
        ),
        (
            r#"[{"at_ms":300,"fault":"kill","target":"redis-primary"}]"#,
            "chaos only fails over",
        ),
        (
            r#"[{"at_ms":300,"fault":"restart","target":"redis-primary","duration_ms":1500}]"#,
            "under the Sentinels' down-after",
        ),
        // A fault of no length is no fault: the baseline, which tests nothing.
        (
            r#"[{"at_ms":100,"fault":"pause","target":"A","duration_ms":0}]"#,
            "a pause of 0 ms tests nothing",
        ),
        (
            r#"[{"at_ms":100,"fault":"cut","target":"A→redis","duration_ms":0}]"#,
            "needs a duration_ms of at least 1 (0 ms: no fault at all)",
        ),
        // A server only restarts: a pause of it would never play.
        (
            r#"[{"at_ms":100,"fault":"pause","target":"redis","duration_ms":900}]"#,
            "only a client (A, B, C) can be paused or killed",
        ),
    ] {
        let output = lockslab_offline(&["chaos", "--design", "redis-lock", "--schedule", schedule])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{schedule}: {stderr}");
        assert!(stderr.contains(says), "{schedule}: {stderr}");
    }
}

/// `matrix`'s exit status says whether the labs' claims held, so a course's CI can run it:
/// a ❌ design breaking where the labs say it breaks exits 0 (the lesson), a ✅ one breaking
/// exits 1, a ✅ cell unknown exits 3, a ❌ design's cell unknown exits 0 whatever the fault;
/// `--strict` counts every cell. Crafted parts through
/// `--merge`, the path every matrix's table and status share.
#[test]
fn a_matrix_exits_0_when_every_cell_agrees_with_the_labs() {
    let dir = std::env::temp_dir().join(format!("lockslab-exit-{}", fresh_tag()));
    std::fs::create_dir_all(&dir).unwrap();
    let cell = |design: &str, fault: &str, result: &str| {
        let replay = if result.starts_with("UNSAFE") {
            format!(r#""lockslab chaos --design {design} --schedule '[]'""#)
        } else {
            "null".into()
        };
        format!(
            r#"{{"kind":"cell","design":"{design}","fault":"{fault}","result":"{result}","replay":{replay},"labs_call_it_safe":{}}}"#,
            !["redis-lock", "etcd-lease"].contains(&design)
        )
    };
    let verdict = r#"{"kind":"verdict","lab":"matrix","seed":1,"schedules_per_cell":3,"shard":"1/1","cells":3}"#;
    let status = |name: &str, cells: [String; 3], strict: bool| {
        let file = dir.join(name);
        std::fs::write(&file, [cells.join("\n"), verdict.into()].join("\n")).unwrap();
        let mut args = vec!["matrix", "--merge", file.to_str().unwrap()];
        if strict {
            args.push("--strict");
        }
        let output = lockslab(&args).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout).to_string();
        (output.status.code(), text)
    };
    // The lessons: redis-lock breaks under a pause, etcd-lease under a pause; serializable
    // holds. Every cell as the labs mark it: 0; strict, the violations count: 1.
    let agree = [
        cell("redis-lock", "pause", "UNSAFE stale-write"),
        cell("etcd-lease", "pause", "UNSAFE lost-update"),
        cell("serializable", "pause", "SAFE (3)"),
    ];
    let (code, text) = status("agree.jsonl", agree.clone(), false);
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("No cell the labs expect safe showed a violation"),
        "{text}"
    );
    assert_eq!(status("agree.jsonl", agree, true).0, Some(1), "strict");
    // A ✅ design broken: 1, whatever else agrees.
    let broke = [
        cell("redis-lock", "pause", "UNSAFE stale-write"),
        cell("serializable", "pause", "UNSAFE lost-update"),
        cell("optimistic", "pause", "SAFE (3)"),
    ];
    let (code, text) = status("broke.jsonl", broke, false);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("serializable × pause"), "{text}");
    // A ✅ cell unknown: 3 (never a pass); a ❌ cell unknown only under --strict.
    let unknown = [
        cell("redis-lock", "pause", "UNKNOWN 2/3"),
        cell("serializable", "pause", "UNKNOWN 1/3"),
        cell("optimistic", "pause", "SAFE (3)"),
    ];
    assert_eq!(status("unknown.jsonl", unknown, false).0, Some(3));
    let lesson_unknown = [
        cell("redis-lock", "pause", "UNKNOWN 2/3"),
        cell("serializable", "pause", "SAFE (3)"),
        cell("optimistic", "pause", "SAFE (3)"),
    ];
    assert_eq!(
        status("lesson.jsonl", lesson_unknown.clone(), false).0,
        Some(0)
    );
    assert_eq!(status("lesson.jsonl", lesson_unknown, true).0, Some(3));
    // A ❌ design unknown even under a fault the labs say it survives — as a lost reply or
    // a leader kill leaves a lock-only design's release — is no ✅ cell: 0, not 3, or every
    // full matrix would exit 3. Only --strict counts it.
    let lock_only_unknown = [
        cell("redis-lock", "lost-reply", "UNKNOWN 2/3"),
        cell("etcd-lease", "leader-kill", "UNKNOWN 3/3"),
        cell("serializable", "lost-reply", "SAFE (3)"),
    ];
    let (code, text) = status("lock-only.jsonl", lock_only_unknown.clone(), false);
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(
        status("lock-only.jsonl", lock_only_unknown, true).0,
        Some(3)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The parts of a sharded matrix merge into one table: each part's cells where they
/// belong, the exit status of the whole (a red cell in one part: 1), and a cell a ✅ design
/// lost named as a disagreement with the labs.
#[test]
fn a_sharded_matrix_merges_into_one_table() {
    let dir = std::env::temp_dir().join(format!("lockslab-merge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // An UNSAFE cell carries the command that replays it, as a matrix writes it.
    let cell = |design: &str, fault: &str, result: &str, safe: bool| {
        let replay = if result.starts_with("UNSAFE") {
            format!(r#""lockslab chaos --design {design} --schedule '[]'""#)
        } else {
            "null".into()
        };
        format!(
            r#"{{"kind":"cell","design":"{design}","fault":"{fault}","result":"{result}","replay":{replay},"labs_call_it_safe":{safe}}}"#
        )
    };
    let one = dir.join("one.jsonl");
    let two = dir.join("two.jsonl");
    std::fs::write(
        &one,
        [
            cell("redis-lock", "pause", "UNSAFE stale-write", false),
            cell("optimistic", "kill", "SAFE (3)", true),
            r#"{"kind":"verdict","lab":"matrix","seed":1,"schedules_per_cell":3,"shard":"1/2","cells":2}"#
                .into(),
        ]
        .join("\n"),
    )
    .unwrap();
    std::fs::write(
        &two,
        [
            cell("redis-lock", "kill", "SAFE (3)", false),
            cell("optimistic", "pause", "UNSAFE lost-update", true),
            r#"{"kind":"verdict","lab":"matrix","seed":1,"schedules_per_cell":3,"shard":"2/2","cells":2}"#
                .into(),
        ]
        .join("\n"),
    )
    .unwrap();
    let output = lockslab(&[
        "matrix",
        "--merge",
        one.to_str().unwrap(),
        two.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{text}");
    let row = |design: &str| {
        text.lines()
            .find(|line| line.contains(design))
            .unwrap_or_else(|| panic!("no row for {design}: {text}"))
            .to_string()
    };
    let redis = row("❌ redis-lock");
    assert!(
        redis.find("UNSAFE stale-write") < redis.find("SAFE (3)"),
        "pause before kill: {redis}"
    );
    let optimistic = row("✅ optimistic");
    assert!(
        optimistic.find("UNSAFE lost-update") < optimistic.find("SAFE (3)"),
        "{optimistic}"
    );
    assert!(
        text.contains("Disagrees with the labs: optimistic × pause"),
        "{text}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Given a Redis (here LOCKSLAB_REDIS_URL), chaos plays client faults against it but will
/// not restart it: a schedule that restarts it is refused with a sentence that says why.
#[test]
fn a_restart_of_a_given_redis_is_refused() {
    for (schedule, faults) in [
        (
            r#"[{"at_ms":300,"fault":"restart","target":"redis"}]"#,
            None,
        ),
        (FAILOVER, None),
        (FAILOVER, Some("failover")),
    ] {
        let mut args = vec!["chaos", "--design", "redis-lock"];
        match faults {
            // Drawn, not given: `--faults failover` alone on a given Redis.
            Some(faults) => args.extend(["--faults", faults]),
            None => args.extend(["--schedule", schedule]),
        }
        let output = lockslab_offline(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains("restarts only servers it started"),
            "{stderr}"
        );
    }
}

/// `--html`: the counterexample's history drawn as a page, the faults and the clients'
/// jobs in it, and the checker's findings on it.
#[test]
fn html_draws_the_counterexample() {
    let page = std::env::temp_dir().join(format!("lockslab-chaos-{}.html", std::process::id()));
    let output = lockslab(&[
        "chaos",
        "--design",
        "redis-lock",
        "--schedule",
        BETWEEN_READ_AND_WRITE,
        "--schedules",
        "3",
        "--html",
        page.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<html"), "a page");
    assert!(html.contains("SIGSTOP"), "the pause is drawn");
    assert!(html.contains("reads r"), "the clients' reads are drawn");
    // The checker's findings on the history, placed on its events, are what it marks: the
    // history's outcome, and the write a stale-write finding is about.
    assert!(
        html.contains("late write taken — ") || html.contains("broken — "),
        "the history's finding is drawn"
    );
    assert!(html.contains("STALE write"), "the stale write is marked");
    std::fs::remove_file(&page).unwrap();
}

/// `redis-fenced` under a restart of its Redis at 500ms: without persistence the `INCR`
/// counter starts again at 1 and the store refuses the reissued tokens' claims (attempts
/// the store did not accept); with its AOF (`redis-aof`, appendfsync always) the counter
/// comes back where it was and no claim is refused. Safe both ways.
#[test]
fn a_restart_with_its_data_keeps_the_token_counter_and_a_restart_empty_does_not() {
    let refused = |target: &str| {
        let schedule = format!(r#"[{{"at_ms":500,"fault":"restart","target":"{target}"}}]"#);
        let mut command = lockslab(&[
            "chaos",
            "--design",
            "redis-fenced",
            "--parallel",
            "1",
            "--schedules",
            "1",
            "--json",
            "--schedule",
            &schedule,
        ]);
        // Chaos restarts only a Redis of its own: one per lane, started by this run.
        command.env_remove("LOCKSLAB_REDIS_URL");
        let line = schedule_lines(command).remove(0);
        assert_eq!(line["result"], "safe", "{line}");
        assert_eq!(line["unplayed"], 0, "{line}");
        line["attempts"].as_i64().unwrap() - line["accepted"].as_i64().unwrap()
    };
    assert!(refused("redis") > 0, "an empty Redis reissues tokens");
    assert_eq!(refused("redis-aof"), 0, "the AOF kept the counter");
}

// chaos faults (issue 25): the fault proxy's delay and lost reply.

/// A's write to the store held 2s in the proxy, just after its first read (the lock's TTL
/// is 800ms): A's process runs all along.
const DELAYED_WRITE: &str = r#"[{"at_ms":0,"after":{"worker":"A","event":"read_record","nth":1},"fault":"delay","target":"A→store","duration_ms":2000}]"#;

/// The answer to A's next request to Redis thrown away, set inside A's first write's
/// transaction: the next request is A's release.
const LOST_RELEASE: &str = r#"[{"at_ms":0,"after":{"worker":"A","event":"working","nth":1},"fault":"drop_reply","target":"A→redis"}]"#;

/// Plays a given schedule `times` times against `design` (`--json`), with an HTML page
/// of the history: (exit status, schedule lines, verdict, page).
fn replay(design: &str, schedule: &str, times: &str) -> (Option<i32>, Vec<Value>, Value, String) {
    replay_with(design, schedule, times, false)
}

/// [`replay`]; `own_redis`: on Redis servers chaos starts itself (it kills only those),
/// one lane of them.
fn replay_with(
    design: &str,
    schedule: &str,
    times: &str,
    own_redis: bool,
) -> (Option<i32>, Vec<Value>, Value, String) {
    // Two tests may replay one design at once: each page its own file.
    let page = std::env::temp_dir().join(format!("lockslab-chaosf-{design}-{}.html", fresh_tag()));
    let mut args = vec![
        "chaos",
        "--design",
        design,
        "--schedule",
        schedule,
        "--schedules",
        times,
        "--no-shrink",
        "--json",
        "--html",
        page.to_str().unwrap(),
    ];
    if own_redis {
        args.extend(["--parallel", "1"]);
    }
    let mut command = lockslab(&args);
    if own_redis {
        command.env_remove("LOCKSLAB_REDIS_URL");
    }
    let output = command.output().unwrap();
    let lines = json_lines(&output.stdout);
    // No line at all: what it said on stderr stands in the verdict's place, for the message.
    let verdict = lines.last().cloned().unwrap_or_else(|| {
        let said = String::from_utf8_lossy(&output.stderr);
        Value::String(format!("no JSON line; stderr: {said}"))
    });
    let schedules = lines
        .into_iter()
        .filter(|line| line["kind"] == "schedule")
        .collect();
    let html = std::fs::read_to_string(&page).unwrap_or_default();
    let _ = std::fs::remove_file(&page);
    (output.status.code(), schedules, verdict, html)
}

/// The delay is lab 8's stale write with no pause: the unfenced Redis lock runs out under
/// A's write in flight and the store takes it over a newer one; its fenced twin refuses it.
/// The nemesis recorded the delay's start and end in the history (the page draws them).
#[test]
fn a_delayed_write_breaks_the_redis_lock_and_not_its_fenced_twin() {
    let (code, _, verdict, html) = replay("redis-lock", DELAYED_WRITE, "1");
    assert_eq!(code, Some(1), "{verdict}");
    let kinds: HashSet<&str> = verdict["violations"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["kind"].as_str())
        .collect();
    assert!(kinds.contains("stale-write"), "{verdict}");
    assert!(
        html.contains("delays what A sends the store next by 2000ms") && html.contains("ms late"),
        "the delay's start and end are in the history"
    );

    // Twice: on a busy machine the other clients may be done before A's write arrives.
    let (code, schedules, verdict, _) = replay("redis-fenced", DELAYED_WRITE, "2");
    assert_eq!(code, Some(0), "{verdict}");
    assert!(
        schedules
            .iter()
            .all(|line| line["result"] == "safe" && line["unplayed"] == 0),
        "{schedules:?}"
    );
    assert!(
        schedules
            .iter()
            .any(|line| line["attempts"].as_u64() > line["accepted"].as_u64()),
        "A's late write was refused: {schedules:?}"
    );
}

/// A release that got no answer leaves a design that trusts the lock unknown,
/// never a pass (exit 3 — or 1 if a busy machine starved a client past its TTL, a pause
/// nobody scheduled); the fenced twin, whose store decides, is safe.
#[test]
fn a_lost_reply_to_a_release_is_unknown_for_the_redis_lock_and_safe_for_its_fenced_twin() {
    let (code, schedules, verdict, _) = replay("redis-lock", LOST_RELEASE, "3");
    assert!(matches!(code, Some(1 | 3)), "never a pass: {verdict}");
    assert!(
        schedules.iter().all(|s| s["unplayed"] == 0),
        "{schedules:?}"
    );
    let unknown = |s: &&Value| {
        s["unknowns"].as_array().is_some_and(|u| {
            u.iter()
                .any(|u| u.as_str().unwrap().starts_with("A's lock"))
        })
    };
    assert!(schedules.iter().any(|s| unknown(&s)), "{schedules:?}");
    let (code, schedules, verdict, _) = replay("redis-fenced", LOST_RELEASE, "3");
    assert_eq!(code, Some(0), "{verdict}");
    assert!(
        schedules.iter().all(|s| s["result"] == "safe"),
        "{schedules:?}"
    );
}

/// A cut off from its lock server (and the store) right after its first read, for 2.5
/// leases: what A sends waits in the proxies until the cut heals.
fn cut_after_read(server: &str) -> String {
    format!(
        r#"[{{"at_ms":0,"after":{{"worker":"A","event":"read_record","nth":1}},"fault":"cut","target":"A→{server}","duration_ms":2500}}]"#
    )
}

/// A partition outlives the lease: another client takes the lock, and A's write, sent
/// before the cut healed, lands after — a stale write the unfenced Redis lock lets in and
/// its fenced twin refuses. The history holds the cut's start and end on both paths.
/// `schedule` breaks `unfenced` with a stale write in one play, and `fenced` stays safe
/// through `plays` of it, every step played: the unfenced run's page.
fn breaks_only_the_unfenced(unfenced: &str, fenced: &str, schedule: &str, plays: &str) -> String {
    let (code, _, verdict, html) = replay(unfenced, schedule, "1");
    assert_eq!(code, Some(1), "{verdict}");
    assert!(
        violation_kinds(&verdict).contains("stale-write"),
        "{verdict}"
    );
    let (code, schedules, verdict, _) = replay(fenced, schedule, plays);
    assert_eq!(code, Some(0), "{verdict}");
    assert!(
        schedules
            .iter()
            .all(|line| line["result"] == "safe" && line["unplayed"] == 0),
        "{schedules:?}"
    );
    html
}

#[test]
fn a_cut_breaks_the_redis_lock_and_not_its_fenced_twin() {
    let html =
        breaks_only_the_unfenced("redis-lock", "redis-fenced", &cut_after_read("redis"), "2");
    for said in [
        "cuts A off on A→redis for 2500ms",
        "cuts A off on A→store for 2500ms",
        "the cut on A→redis heals",
        "the cut on A→store heals",
    ] {
        assert!(html.contains(said), "the history says: {said}");
    }
}

/// etcd's keepalive cannot reach etcd through the cut: the lease runs out under A, and
/// etcd-lease lets A's late write in; etcd-fenced's claim refuses it.
#[test]
fn a_cut_breaks_etcd_lease_and_not_etcd_fenced() {
    breaks_only_the_unfenced("etcd-lease", "etcd-fenced", &cut_after_read("etcd"), "1");
}

/// Interrupted while A's write waits 30s in the proxy: lockslab exits 130 and leaves no
/// client behind (a design no other test here plays: the rows are the run's alone), and the proxy, a part of lockslab's own process, is gone with it — its
/// port no longer takes connections.
#[test]
fn ctrl_c_during_a_delay_leaves_no_client_and_no_proxy() {
    let mut chaos = lockslab(&[
        "chaos",
        "--design",
        "skip-locked",
        "--schedule",
        r#"[{"at_ms":0,"after":{"worker":"A","event":"read_record","nth":1},"fault":"delay","target":"A→store","duration_ms":30000}]"#,
        "--json",
    ])
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    // A's connection to the store goes through a loopback port of lockslab's own.
    let proxy_ports = || -> Vec<u16> {
        let listening = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{}/fd", chaos.id()))
            .map(|dir| {
                dir.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                    .filter_map(|link| {
                        let link = link.to_string_lossy().to_string();
                        Some(
                            link.strip_prefix("socket:[")?
                                .strip_suffix(']')?
                                .to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        listening
            .lines()
            .skip(1)
            .filter_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                // State 0A: listening.
                (fields.get(3) == Some(&"0A") && inodes.contains(*fields.get(9)?))
                    .then(|| u16::from_str_radix(fields[1].split(':').nth(1)?, 16).ok())
                    .flatten()
            })
            .collect()
    };
    let mut ports = Vec::new();
    assert!(eventually(std::time::Duration::from_secs(30), || {
        ports = proxy_ports();
        rows_of("%skip_locked") > 0 && !ports.is_empty()
    }));
    let mut family = HashSet::from([chaos.id() as i32]);
    family_in(&process_table(), &mut family);
    family.remove(&(chaos.id() as i32));
    kill(Pid::from_raw(chaos.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(chaos.wait().unwrap().code(), Some(130));
    assert_gone(&family.into_iter().collect::<Vec<_>>());
    for port in ports {
        assert!(
            std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
            "port {port} still listens"
        );
    }
    assert_eq!(rows_of("%skip_locked"), 0, "no row of the run is left");
}

/// Redlock (lab 6) on five masters of chaos's own: a pause between the read and the write
/// breaks it (the stale writer of lab 6's client-pause), and its fenced twin, whose token
/// from a Postgres sequence claims the record before the read, stays safe — with one of
/// its masters restarted empty in the same schedule.
#[test]
fn a_pause_breaks_redlock_and_not_redlock_fenced_with_a_master_restarted_empty() {
    let play = |design: &str, schedule: &str| {
        let mut command = lockslab(&[
            "chaos",
            "--design",
            design,
            "--schedule",
            schedule,
            "--schedules",
            "1",
            "--parallel",
            "1",
            "--no-shrink",
            "--json",
        ]);
        command.env_remove("LOCKSLAB_REDIS_URL");
        command.output().unwrap()
    };
    let broken = play("redlock", BETWEEN_READ_AND_WRITE);
    let lines = json_lines(&broken.stdout);
    let verdict = lines.last().unwrap();
    assert_eq!(broken.status.code(), Some(1), "{verdict}");
    let kinds = violation_kinds(verdict);
    assert!(kinds.contains("stale-write"), "{verdict}");

    let with_restart = format!(
        "[{}, {}]",
        BETWEEN_READ_AND_WRITE.trim_matches(['[', ']']),
        r#"{"at_ms":600,"fault":"restart","target":"m3"}"#
    );
    let fenced = play("redlock-fenced", &with_restart);
    let lines = json_lines(&fenced.stdout);
    let schedule = first_schedule(&lines);
    assert_eq!(fenced.status.code(), Some(0), "{schedule}");
    assert_eq!(schedule["result"], "safe");
    assert_eq!(schedule["unplayed"], 0, "the pause and the restart played");
    // Whether another client claimed A's record during the pause (and A's write was then
    // refused) depends on which records the others picked: not asserted.
    assert!(schedule["accepted"].as_u64() > Some(0), "the clients wrote");
}

// chaos failover (issue 25)

/// etcd's leader killed 600ms into the run: the other two members elect a new one, and the
/// killed member starts again as a follower.
const LEADER_KILL: &str = r#"[{"at_ms":600,"fault":"restart","target":"etcd-leader"}]"#;

/// The same kill, while A lies paused for 4s between its first read and its write (its
/// lease is 1s: even the new leader's extension, the TTL again plus an election timeout,
/// runs out under it).
const LEADER_KILL_UNDER_A_PAUSE: &str = r#"[{"at_ms":2,"after":{"worker":"A","event":"read_record","nth":1},"fault":"pause","target":"A","duration_ms":4000},{"at_ms":600,"fault":"restart","target":"etcd-leader"}]"#;

/// A leader kill alone breaks neither etcd design: no lease runs out for it (the new leader
/// gives every lease its TTL again). `etcd-lease`, which trusts the lock, may read unknown
/// (a release sent during the election got an error, not an answer), never unsafe.
#[test]
fn a_leader_kill_breaks_neither_etcd_design() {
    let (code, schedules, verdict, _) = replay("etcd-fenced", LEADER_KILL, "2");
    assert_eq!(code, Some(0), "{verdict}");
    assert!(
        schedules
            .iter()
            .all(|s| s["result"] == "safe" && s["unplayed"] == 0),
        "{schedules:?}"
    );
    let (code, schedules, verdict, _) = replay("etcd-lease", LEADER_KILL, "2");
    assert!(matches!(code, Some(0 | 3)), "{verdict}");
    assert!(
        schedules
            .iter()
            .all(|s| s["result"] != "unsafe" && s["unplayed"] == 0),
        "{schedules:?}"
    );
}

/// A pause past the lease breaks the unfenced etcd lock with a leader kill in the middle
/// (the election does not save it), and not its fenced twin; the nemesis recorded the kill
/// and the old leader's return in the history (the page draws them). Six plays: in about
/// two in five, the new leader's extension keeps A's lease past the other clients' last
/// job, nobody overtakes A's read, and the play is unknown (measured: 4 unsafe of 6, then
/// 0 of 3); six such plays in a row are about 1 in 200.
#[test]
fn a_pause_across_a_leader_kill_breaks_etcd_lease_and_not_etcd_fenced() {
    let (code, _, verdict, html) = replay("etcd-lease", LEADER_KILL_UNDER_A_PAUSE, "6");
    assert_eq!(code, Some(1), "{verdict}");
    assert!(
        html.contains("(SIGKILL): the other two members elect a new one")
            && html.contains("a new etcd leader elected; the old one back as a follower"),
        "the kill and the return are in the history"
    );
    let (code, schedules, verdict, _) = replay("etcd-fenced", LEADER_KILL_UNDER_A_PAUSE, "1");
    assert_eq!(code, Some(0), "{verdict}");
    assert!(
        schedules.iter().all(|s| s["unplayed"] == 0),
        "{schedules:?}"
    );
}

/// Drawn with `--faults leader-kill`: the same seed, the same schedules; and the run leaves
/// no etcd member behind (each is a child of lockslab, gone once it exits).
#[test]
fn a_seeded_leader_kill_run_repeats_and_leaves_no_etcd_member() {
    let run = || {
        let chaos = lockslab(&[
            "chaos",
            "--design",
            "etcd-fenced",
            "--faults",
            "leader-kill",
            "--seed",
            "77",
            "--schedules",
            "2",
            "--json",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
        let mut members = HashSet::new();
        eventually(std::time::Duration::from_secs(30), || {
            for (pid, _, cmd) in children_of(chaos.id()) {
                if cmd.contains("etcd") {
                    members.insert(pid);
                }
            }
            members.len() >= 3
        });
        let output = chaos.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(0));
        assert!(members.len() >= 3, "a cluster of three: {members:?}");
        for pid in members {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            assert!(
                !String::from_utf8_lossy(&cmdline).contains("etcd"),
                "etcd member {pid} is still there"
            );
        }
        json_lines(&output.stdout)
            .into_iter()
            .filter(|line| line["kind"] == "schedule")
            .map(|line| line["schedule"].clone())
            .collect::<Vec<_>>()
    };
    let first = run();
    assert_eq!(first.len(), 2);
    assert!(
        first.iter().all(|s| s.to_string().contains("etcd-leader")),
        "{first:?}"
    );
    assert_eq!(first, run());
}

/// Interrupted after a leader kill, while A lies paused for 30s: lockslab exits 130 and
/// leaves no client and no etcd member behind (the killed one started again included).
#[test]
fn ctrl_c_after_a_leader_kill_leaves_no_client_and_no_etcd_member() {
    let mut chaos = lockslab(&[
        "chaos",
        "--design",
        "etcd-fenced",
        "--schedule",
        r#"[{"at_ms":300,"fault":"restart","target":"etcd-leader"},{"at_ms":1500,"fault":"pause","target":"A","duration_ms":30000}]"#,
        "--json",
    ])
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    // A is stopped: the kill and the restart are done (they play in order, before it).
    assert!(eventually(std::time::Duration::from_secs(60), || {
        children_of(chaos.id())
            .iter()
            .any(|(_, state, _)| *state == 'T')
    }));
    let mut family = HashSet::from([chaos.id() as i32]);
    family_in(&process_table(), &mut family);
    family.remove(&(chaos.id() as i32));
    let members: Vec<i32> = children_of(chaos.id())
        .into_iter()
        .filter(|(_, _, name)| name.contains("etcd"))
        .map(|(pid, _, _)| pid as i32)
        .collect();
    assert!(members.len() >= 3, "the cluster's members: {members:?}");
    kill(Pid::from_raw(chaos.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(chaos.wait().unwrap().code(), Some(130));
    assert_gone(&family.into_iter().collect::<Vec<_>>());
    for pid in members {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("etcd"),
            "etcd member {pid} is still there"
        );
    }
}

/// Faults that cannot reach the design are refused before any server starts, rather than
/// played as schedules with no fault in them and counted safe.
#[test]
fn faults_that_cannot_reach_the_design_are_refused() {
    for (design, faults) in [
        ("optimistic", "restart"),
        ("redis-lock", "leader-kill"),
        ("redlock", "lost-reply"),
        ("redlock", "cut"),
        ("redlock-fenced", "lost-reply,cut"),
        // No lock of theirs expires on a server's wall clock.
        ("etcd-lease", "clock"),
        ("advisory-session", "clock"),
        ("optimistic", "failover"),
        ("etcd-lease", "failover"),
        ("redlock", "failover"),
    ] {
        let output = lockslab_offline(&["chaos", "--design", design, "--faults", faults])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{design} × {faults}: {said}");
        assert!(said.contains("none of these can reach"), "{said}");
    }
}

/// Writes `schedule` to a file of its own for `--schedule FILE`.
fn schedule_file(name: &str, schedule: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("lockslab-{name}-{}.json", fresh_tag()));
    std::fs::write(&path, schedule).unwrap();
    path
}

/// A given schedule whose steps do not all play did not test the schedule asked: each
/// play is unknown (exit 3), never safe, and names the steps that did not play — by their
/// place as written, the step, and why (A killed before its pause came; C's 500th read,
/// in a run of 1.5 s, never coming) — in its line and under `--json`.
#[test]
fn a_given_schedule_with_a_step_that_never_played_is_unknown_and_names_it() {
    let file = schedule_file(
        "unplayed",
        r#"[{"at_ms": 0, "fault": "kill", "target": "A"},
            {"at_ms": 0, "after": {"worker": "B", "event": "read_record", "nth": 3},
             "fault": "pause", "target": "A", "duration_ms": 900},
            {"at_ms": 0, "after": {"worker": "C", "event": "read_record", "nth": 500},
             "fault": "kill", "target": "C"}]"#,
    );
    let play = |json: bool| {
        let mut args = vec!["chaos", "--design", "optimistic", "--schedules", "1"];
        args.push("--schedule");
        args.push(file.to_str().unwrap());
        if json {
            args.push("--json");
        }
        lockslab(&args).output().unwrap()
    };
    let output = play(true);
    assert_eq!(
        output.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
    let lines = json_lines(&output.stdout);
    let schedule = lines.iter().find(|l| l["kind"] == "schedule").unwrap();
    assert_eq!(schedule["result"], "unknown", "{schedule}");
    let unplayed: Vec<(u64, &str)> = schedule["unplayed_steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["nth"].as_u64().unwrap(), u["why"].as_str().unwrap()))
        .collect();
    assert_eq!(unplayed.len(), 2, "{schedule}");
    assert_eq!(unplayed[0], (2, "A had been killed already"), "{schedule}");
    assert_eq!(unplayed[1].0, 3, "{schedule}");
    assert!(
        unplayed[1].1.starts_with("C's read_record #500 never came"),
        "{schedule}"
    );
    assert_eq!(schedule["unplayed_steps"][1]["step"]["target"], "C");
    assert!(
        schedule["unknowns"][0]
            .as_str()
            .unwrap()
            .starts_with("steps 2, 3 of the given schedule never played"),
        "{schedule}"
    );
    let verdict = lines.last().unwrap();
    assert_eq!(
        (&verdict["unknown"], &verdict["played_in_part"]),
        (&Value::from(1), &Value::from(1)),
        "{verdict}"
    );

    let output = play(false);
    assert_eq!(output.status.code(), Some(3));
    let text = String::from_utf8_lossy(&output.stdout).replace("\n        ", " ");
    assert!(
        text.contains("step 2 never played (pause A 0ms after B's read_record#3 for 900ms): A had been killed already")
            && text.contains("step 3 never played (kill C 0ms after C's read_record#500): C's read_record #500 never came"),
        "{text}"
    );
    let _ = std::fs::remove_file(&file);
}

/// A schedule written by hand may call the lost reply by the name chaos prints it by,
/// `lost-reply`, as well as `drop_reply`: both play the same fault.
#[test]
fn a_schedule_file_may_spell_the_lost_reply_lost_reply() {
    let file = schedule_file(
        "lost-reply",
        &LOST_RELEASE.replace("drop_reply", "lost-reply"),
    );
    assert!(
        std::fs::read_to_string(&file)
            .unwrap()
            .contains("\"lost-reply\"")
    );
    let (code, schedules, verdict, _) = replay("redis-fenced", file.to_str().unwrap(), "1");
    let _ = std::fs::remove_file(&file);
    assert_eq!(code, Some(0), "{verdict}");
    assert_eq!(schedules[0]["schedule"][0]["fault"], "drop_reply");
    assert_eq!(schedules[0]["unplayed"], 0, "the lost reply played");
}

// chaos clock (issue 25)

/// `server`'s clock jumps a lease ahead just after each client's first grant (simulated:
/// the lock keys' TTL cut there).
fn jumps_after_first_grants(servers: &[&str]) -> String {
    let steps: Vec<String> = ["A", "B", "C"]
        .iter()
        .flat_map(|client| {
            servers.iter().map(move |server| {
                format!(
                    r#"{{"at_ms":0,"after":{{"worker":"{client}","event":"acquired","nth":1}},"fault":"clock_step","target":"{server}"}}"#
                )
            })
        })
        .collect();
    format!("[{}]", steps.join(","))
}

/// Redis's clock jumps past the TTL under each first holder: the key expires, another
/// client takes the lock while the first still works — two holders, or a stale write, for
/// the unfenced lock; the fenced twin's claim refuses the older holder. The history says
/// the jump was simulated.
#[test]
fn a_clock_jump_breaks_the_redis_lock_and_not_its_fenced_twin() {
    let schedule = jumps_after_first_grants(&["redis"]);
    let (code, _, verdict, html) = replay("redis-lock", &schedule, "2");
    assert_eq!(code, Some(1), "{verdict}");
    let kinds = violation_kinds(&verdict);
    assert!(
        kinds.contains("two-holders") || kinds.contains("stale-write"),
        "{verdict}"
    );
    assert!(
        html.replace("&#39;", "'")
            .contains("simulated: the key's TTL cut, as if the server's clock jumped"),
        "the history says the jump was simulated"
    );
    // A busy machine can leave all three plays unknown (the jump finds the lock gone): up
    // to three rounds, until one plays whole and safe — and no play may ever be unsafe.
    for round in 1..=3 {
        let (code, schedules, verdict, _) = replay("redis-fenced", &schedule, "3");
        let played_safe = (schedules.iter()).any(|s| s["result"] == "safe" && s["unplayed"] == 0);
        if played_safe || round == 3 {
            never_broken(code, &schedules, &verdict);
            break;
        }
        assert!(
            schedules.iter().all(|s| s["result"] != "unsafe"),
            "{schedules:?}"
        );
    }
}

/// No play of a given schedule broke the design, and at least one played every step and
/// was safe. A jump aimed at a grant finds the lock gone when the machine delays it past
/// the job (tens of milliseconds on a busy machine): that play is unknown, never safe.
fn never_broken(code: Option<i32>, schedules: &[Value], verdict: &Value) {
    assert!(matches!(code, Some(0 | 3)), "{verdict}");
    assert!(
        schedules.iter().all(|s| s["result"] != "unsafe"),
        "{schedules:?}"
    );
    assert!(
        (schedules.iter()).any(|s| s["result"] == "safe" && s["unplayed"] == 0),
        "{schedules:?}"
    );
}

/// Redlock with the clocks of three of its five masters (a bare majority) jumping under
/// each first holder: another client wins those three while the holder still works, as in
/// lab 6's clock jump — unfenced, it breaks (in one of three plays, at least: a history in
/// which no other client wanted that record meanwhile shows nothing); the fenced twin's
/// token refuses the older holder. No client or master of the run is left running.
#[test]
fn a_clock_jump_on_a_bare_majority_of_masters_breaks_redlock_and_not_redlock_fenced() {
    let schedule = jumps_after_first_grants(&["m1", "m2", "m3"]);
    let play = |design: &str| {
        let tag = fresh_tag();
        let mut command = lockslab(&[
            "chaos",
            "--design",
            design,
            "--schedule",
            &schedule,
            "--schedules",
            "3",
            "--parallel",
            "1",
            "--no-shrink",
            "--json",
        ]);
        command
            .env_remove("LOCKSLAB_REDIS_URL")
            .env("LOCKSLAB_TEST_TAG", &tag);
        let output = command.output().unwrap();
        let left = processes_tagged(&tag);
        assert!(left.is_empty(), "left behind: {left:?}");
        let lines = json_lines(&output.stdout);
        (output.status.code(), lines)
    };
    let (code, lines) = play("redlock");
    let verdict = lines.last().unwrap();
    assert_eq!(code, Some(1), "{verdict}");
    let kinds = violation_kinds(verdict);
    assert!(
        kinds.contains("two-holders") || kinds.contains("stale-write"),
        "{verdict}"
    );
    // As above: up to three rounds until one plays whole and safe; never an unsafe play.
    for round in 1..=3 {
        let (code, mut lines) = play("redlock-fenced");
        let verdict = lines.pop().unwrap();
        let played_safe = (lines.iter()).any(|s| s["result"] == "safe" && s["unplayed"] == 0);
        if played_safe || round == 3 {
            never_broken(code, &lines, &verdict);
            break;
        }
        assert!(lines.iter().all(|s| s["result"] != "unsafe"), "{lines:?}");
    }
}

// chaos failover of Redis (issue 25)

/// At 600ms the replica lags (frozen, its link cut) for 400ms while the primary takes the
/// clients' writes; then the primary is killed, the Sentinels promote the replica, and the
/// clients, asking them again after an error, move to it.
const FAILOVER: &str =
    r#"[{"at_ms":600,"fault":"restart","target":"redis-primary","duration_ms":400}]"#;

/// The same failover, while A lies paused for 4s between its first read and its write.
const FAILOVER_UNDER_A_PAUSE: &str = r#"[{"at_ms":2,"after":{"worker":"A","event":"read_record","nth":1},"fault":"pause","target":"A","duration_ms":4000},{"at_ms":600,"fault":"restart","target":"redis-primary","duration_ms":400}]"#;

/// What a lagging failover alone does, measured: the promoted replica lacks what the
/// primary took in the lag — lock keys, and `INCR`s: fenced-write-only's counter goes back
/// and hands out tokens again, which its `not lower` check lets through once the counter
/// is back at a record's highest. But the promotion takes longer than the Sentinels'
/// down-after (1s), so longer than a lease and a job: nobody still holds a lock, or a
/// token, from before the kill when another client gets one from the promoted replica, and
/// the tokens drawn again are used one after the other. So it breaks no design here; the
/// durable token is safe.
#[test]
fn a_lagging_failover_alone_breaks_no_redis_design_here() {
    let (code, schedules, verdict, _) = replay_with("fenced-write-only", FAILOVER, "1", true);
    assert_eq!(code, Some(0), "{verdict}");
    assert!(
        schedules.iter().all(|s| s["unplayed"] == 0),
        "{schedules:?}"
    );
    let (code, schedules, verdict, _) = replay_with("redis-durable-token", FAILOVER, "1", true);
    assert_eq!(code, Some(0), "{verdict}");
    assert!(
        schedules
            .iter()
            .all(|s| s["unplayed"] == 0 && s["accepted"].as_u64() > Some(0)),
        "{schedules:?}"
    );
}

/// A pause across a failover breaks the unfenced Redis lock (A's late write lands over a
/// newer one, granted by the promoted replica), and not the durable token's claim; the
/// nemesis recorded the kill and the promotion in the history (the page draws them).
#[test]
fn a_pause_across_a_failover_breaks_redis_lock_and_not_redis_durable_token() {
    let (code, _, verdict, html) = replay_with("redis-lock", FAILOVER_UNDER_A_PAUSE, "2", true);
    assert_eq!(code, Some(1), "{verdict}");
    // Quotes escaped in the page: "Redis's".
    assert!(
        html.contains("kills Redis&#39;s primary (SIGKILL)"),
        "the kill is in the history"
    );
    assert!(
        html.contains("lags: frozen (SIGSTOP), its link cut (1 closed)"),
        "the lag is in the history"
    );
    assert!(
        html.contains("the replica promoted") && html.contains("bytes short of what the primary"),
        "the promotion is in the history, with how far the replica was behind"
    );
    let (code, schedules, verdict, _) =
        replay_with("redis-durable-token", FAILOVER_UNDER_A_PAUSE, "1", true);
    assert_eq!(code, Some(0), "{verdict}");
    assert!(
        schedules.iter().all(|s| s["unplayed"] == 0),
        "{schedules:?}"
    );
}

/// The Redis servers a run started (the lanes' and the failovers' cluster): every
/// `redis-server` child of `pid`, Sentinels included.
fn redis_children(pid: u32, seen: &mut HashSet<u32>) {
    for (child, _, cmd) in children_of(pid) {
        if cmd.contains("redis") {
            seen.insert(child);
        }
    }
}

fn assert_no_redis_left(pids: &HashSet<u32>) {
    for pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("redis"),
            "Redis server {pid} is still there"
        );
    }
}

/// Drawn with `--faults failover`: the same seed, the same schedules; and the run leaves
/// no Redis server or Sentinel behind (the node started again included).
#[test]
fn a_seeded_failover_run_repeats_and_leaves_no_redis_or_sentinel() {
    let run = || {
        let chaos = lockslab(&[
            "chaos",
            "--design",
            "redis-durable-token",
            "--faults",
            "failover",
            "--seed",
            "77",
            "--schedules",
            "2",
            "--parallel",
            "1",
            "--json",
        ])
        .env_remove("LOCKSLAB_REDIS_URL")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
        let mut servers = HashSet::new();
        // The lanes' Redis and the cluster's primary, replica and three Sentinels.
        eventually(std::time::Duration::from_secs(60), || {
            redis_children(chaos.id(), &mut servers);
            servers.len() >= 5
        });
        let output = chaos.wait_with_output().unwrap();
        assert_eq!(output.status.code(), Some(0));
        assert!(servers.len() >= 5, "a cluster of five: {servers:?}");
        assert_no_redis_left(&servers);
        json_lines(&output.stdout)
            .into_iter()
            .filter(|line| line["kind"] == "schedule")
            .map(|line| line["schedule"].clone())
            .collect::<Vec<_>>()
    };
    let first = run();
    assert_eq!(first.len(), 2);
    assert!(
        first
            .iter()
            .all(|s| s.to_string().contains("redis-primary")),
        "{first:?}"
    );
    assert_eq!(first, run());
}

/// Interrupted after a failover, while A lies paused for 30s: lockslab exits 130 and leaves
/// no client, no Redis and no Sentinel behind.
#[test]
fn ctrl_c_after_a_failover_leaves_no_client_no_redis_and_no_sentinel() {
    let mut chaos = lockslab(&[
        "chaos",
        "--design",
        "redis-fenced",
        "--schedule",
        r#"[{"at_ms":300,"fault":"restart","target":"redis-primary"},{"at_ms":1500,"fault":"pause","target":"A","duration_ms":30000}]"#,
        "--parallel",
        "1",
        "--json",
    ])
    .env_remove("LOCKSLAB_REDIS_URL")
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    // A is stopped: the failover is done (the steps play in order, before the pause).
    assert!(eventually(std::time::Duration::from_secs(60), || {
        children_of(chaos.id())
            .iter()
            .any(|(_, state, _)| *state == 'T')
    }));
    let mut family = HashSet::from([chaos.id() as i32]);
    family_in(&process_table(), &mut family);
    family.remove(&(chaos.id() as i32));
    let mut servers = HashSet::new();
    redis_children(chaos.id(), &mut servers);
    assert!(servers.len() >= 4, "the cluster's nodes: {servers:?}");
    kill(Pid::from_raw(chaos.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(chaos.wait().unwrap().code(), Some(130));
    assert_gone(&family.into_iter().collect::<Vec<_>>());
    assert_no_redis_left(&servers);
}

/// A cell twice with two results (a shard run again, both outputs merged) is refused: the
/// merge would otherwise show whichever came last, and could hide an UNSAFE one.
#[test]
fn a_merge_refuses_a_cell_that_reads_two_ways() {
    let cell = |result: &str| {
        let replay = r#""lockslab chaos --design optimistic --schedule '[]'""#;
        format!(
            r#"{{"kind":"cell","design":"optimistic","fault":"kill","result":"{result}","replay":{replay},"labs_call_it_safe":true}}"#
        )
    };
    let verdict =
        r#"{"kind":"verdict","lab":"matrix","seed":1,"schedules_per_cell":2,"shard":"1/1"}"#;
    let unsafe_one = schedule_file(
        "merge-unsafe",
        &format!("{}\n{verdict}", cell("UNSAFE stale-write")),
    );
    let unknown_one = schedule_file(
        "merge-unknown",
        &format!("{}\n{verdict}", cell("UNKNOWN 1/2")),
    );
    for files in [[&unsafe_one, &unknown_one], [&unknown_one, &unsafe_one]] {
        let output = lockslab_offline(&[
            "matrix",
            "--merge",
            files[0].to_str().unwrap(),
            files[1].to_str().unwrap(),
        ])
        .output()
        .unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{said}");
        assert!(said.contains("optimistic × kill reads"), "{said}");
    }
    // The same cell twice, alike: one cell.
    let output = lockslab_offline(&[
        "matrix",
        "--merge",
        unsafe_one.to_str().unwrap(),
        unsafe_one.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let _ = std::fs::remove_file(unsafe_one);
    let _ = std::fs::remove_file(unknown_one);
}

/// A restart given to a design with no server of chaos's own to restart (the Postgres
/// and no-lock designs) is refused before anything starts, not played as unknown.
#[test]
fn a_restart_given_to_a_design_without_redis_or_etcd_is_refused() {
    let output = lockslab_offline(&[
        "chaos",
        "--design",
        "advisory-xact",
        "--schedule",
        r#"[{"at_ms":100,"fault":"restart","target":"redis"}]"#,
    ])
    .output()
    .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{said}");
    assert!(said.contains("redis"), "{said}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("Postgres"));
}

/// A Ctrl-C while a found violation is being shrunk ends the run as any interrupt does
/// (130, nothing left running), but does not lose the finding: the failing schedule found
/// so far is printed with the command that replays it — after an impatient second Ctrl-C
/// too, which kills what is left at once.
#[test]
fn ctrl_c_while_shrinking_keeps_the_violation_found() {
    for presses in [1, 2] {
        interrupt_a_shrink(presses);
    }
}

fn interrupt_a_shrink(presses: usize) {
    use std::io::{BufRead, Read};
    let mut chaos = lockslab(&[
        "chaos",
        "--design",
        "redis-lock",
        "--faults",
        "pause",
        "--seed",
        "1",
        "--schedules",
        "60",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = std::io::BufReader::new(chaos.stdout.take().unwrap());
    let mut seen = String::new();
    while !seen.contains("Shrinking the failing schedule") {
        let before = seen.len();
        stdout.read_line(&mut seen).unwrap();
        assert!(seen.len() > before, "chaos ended without shrinking: {seen}");
    }
    // Interrupted while a replay's clients work.
    let mut family = HashSet::new();
    assert!(eventually(std::time::Duration::from_secs(60), || {
        family = HashSet::from([chaos.id() as i32]);
        family_in(&process_table(), &mut family);
        family.remove(&(chaos.id() as i32));
        (family.iter()).any(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains("__worker")
        })
    }));
    for _ in 0..presses {
        kill(Pid::from_raw(chaos.id() as i32), Signal::SIGINT).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    stdout.read_to_string(&mut seen).unwrap();
    let mut said = String::new();
    chaos
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut said)
        .unwrap();
    assert_eq!(chaos.wait().unwrap().code(), Some(130), "{said}");
    assert_gone(&family.into_iter().collect::<Vec<_>>());
    assert!(
        said.contains("a violation was found before the interrupt"),
        "{said}"
    );
    assert!(
        said.contains("lockslab chaos --design redis-lock --schedule '[")
            && said.contains("\"fault\":\"pause\""),
        "{said}"
    );
}

/// Issue 40, row 6: chaos on a Redis user that may not send its clients' commands (a room
/// seat's outside its namespace; here an ACL user without EVAL) played every schedule,
/// recorded each write as unknown ("0 writes"), exited 3, and never showed the NOPERM.
/// Now it refuses up front, exit 4, with the refusal in Redis's words.
#[test]
fn chaos_refuses_up_front_a_redis_user_without_its_clients_commands() {
    let admin_url = &servers().redis;
    let mut admin = lockslab::connect::redis(admin_url).unwrap();
    let user = format!("noeval{}", std::process::id());
    ::redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg(&["reset", "on", ">pw", "~*", "+@all", "-eval", "-evalsha"])
        .query::<()>(&mut *admin)
        .unwrap();
    let at = admin_url.rsplit_once('@').unwrap().1;
    let url = format!("redis://{user}:pw@{at}");
    let output = lockslab(&["chaos", "--design", "redis-lock", "--schedules", "1"])
        .env("LOCKSLAB_REDIS_URL", &url)
        .output()
        .unwrap();
    let _ = ::redis::cmd("ACL")
        .arg("DELUSER")
        .arg(&user)
        .query::<i64>(&mut *admin);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    let said = stderr.to_lowercase();
    assert!(said.contains("noperm"), "{stderr}");
    assert!(said.contains("'evalsha'"), "{stderr}");
    assert!(!stderr.contains(":pw@"), "the password is hidden: {stderr}");
}

// A lab's schedule replayed by chaos (the engine issue): `--schedule` takes a lab's own
// `--json` output, and its names are put on chaos's run.

/// Lab 1's `--json` output (its fenced run with a token restart), passed as it is: A
/// paused for 3s once it said it was freezing, and Redis restarted empty then. On chaos's
/// run the pause waits for A's `working` (the same point of the job, as the timeline and
/// the verdict say), and both faults play on chaos's own clients and Redis.
#[test]
fn a_labs_json_output_replays_its_faults_on_chaos() {
    let lab_output = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gc-pause-token-restart.jsonl"
    );
    let mut command = lockslab(&[
        "chaos",
        "--design",
        "redis-lock",
        "--parallel",
        "1",
        "--schedules",
        "1",
        "--no-shrink",
        "--json",
        "--schedule",
        lab_output,
    ]);
    // Chaos restarts only a Redis of its own.
    command.env_remove("LOCKSLAB_REDIS_URL");
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(matches!(output.status.code(), Some(0 | 1)), "{stderr}");
    let lines = json_lines(&output.stdout);
    let verdict = lines.last().unwrap();
    assert_eq!(
        verdict["mapped"][0],
        "step 1: pause A after A's freezing plays as pause A after A's working",
        "{verdict}"
    );
    let line = first_schedule(&lines);
    assert_eq!(line["unplayed"], 0, "{line}");
    let played: Vec<(&str, &str)> = (line["schedule"].as_array().unwrap().iter())
        .map(|s| (s["fault"].as_str().unwrap(), s["target"].as_str().unwrap()))
        .collect();
    assert_eq!(played, [("pause", "A"), ("restart", "redis")], "{line}");
    // The nemesis's own record of each fault, on chaos's timeline.
    let did = |kind: &str, fault: &str, target: &str| {
        (lines.iter()).any(|e| e["kind"] == kind && e["fault"] == fault && e["target"] == target)
    };
    assert!(did("frozen", "pause", "A"), "{stderr}");
    assert!(did("killed", "restart", "redis"), "{stderr}");
}

/// A lab step with no counterpart on chaos's run is refused before anything starts, by
/// one line naming the step and what to write instead: a Redlock master on one Redis, a
/// fourth client among three, an event chaos's clients never report, lab 8's hold.
#[test]
fn a_lab_step_chaos_has_no_counterpart_for_is_refused_by_name() {
    for (schedule, says) in [
        (
            r#"{"kind":"verdict","schedule":[{"at_ms":0,"fault":"restart","target":"m3"}]}"#,
            r#"step 1 (restart m3): m3 is a Redlock master, which redis-lock does not have; write "target": "redis""#,
        ),
        (
            r#"[{"at_ms":0,"fault":"kill","target":"w1"},{"at_ms":0,"fault":"kill","target":"w2"},{"at_ms":0,"fault":"kill","target":"w3"},{"at_ms":0,"fault":"kill","target":"w4"}]"#,
            "step 4 (kill w4): w4 is one client more than chaos's run has (3): pass --clients 4",
        ),
        (
            r#"[{"at_ms":0,"after":{"worker":"W1","event":"queued"},"fault":"kill","target":"W1"}]"#,
            "chaos's clients never report queued",
        ),
        // Lab 8's hold of A's path, until B has written: chaos holds for a time.
        (
            r#"[{"at_ms":0,"fault":"hold","target":"A→store"}]"#,
            r#"step 1 (hold A→store): chaos holds a path for a time, not until an event: write "fault": "delay""#,
        ),
    ] {
        let output = lockslab_offline(&["chaos", "--design", "redis-lock", "--schedule", schedule])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).replace('\n', " ");
        assert_eq!(output.status.code(), Some(2), "{schedule}: {stderr}");
        assert!(stderr.contains(says), "{schedule}: {stderr}");
    }
}

// chaos on hosts (issue 44)

/// A's host cut off from every server (its lock server, the store) right after its first
/// read, for 2.5 leases: the kernel drops what A sends until the partition heals.
fn partition_after_read(sides: &str) -> String {
    format!(
        r#"[{{"at_ms":0,"after":{{"worker":"A","event":"read_record","nth":1}},"fault":"partition","target":"{sides}","duration_ms":2500}}]"#
    )
}

/// A real partition (network namespaces, packets dropped) outlives the lease: another client
/// takes the lock, and A's write, retransmitted by its kernel once the partition heals,
/// lands stale — the unfenced Redis lock lets it in, its fenced twin refuses it. The
/// history holds the cut (with the links it cut) and the heal.
#[test]
fn a_partition_breaks_the_redis_lock_and_not_its_fenced_twin() {
    let html = breaks_only_the_unfenced(
        "redis-lock",
        "redis-fenced",
        &partition_after_read("A"),
        "2",
    );
    for said in [
        "cuts A&#39;s host off from every server it talks to",
        "A–redis",
        "A–store",
        "the partition heals (A)",
    ] {
        assert!(
            html.contains(said) || html.contains(&said.replace("&#39;", "'")),
            "the history says: {said}"
        );
    }
}

/// Redlock's client cut off from every server after its read: its validity runs out as a
/// pause's would, and its write lands stale; the fenced twin's store refuses it.
#[test]
fn a_partition_breaks_redlock_and_not_redlock_fenced() {
    breaks_only_the_unfenced("redlock", "redlock-fenced", &partition_after_read("A"), "1");
}

/// A leader frozen past its election breaks neither etcd design: the other two elect a new
/// leader, which gives every lease its TTL again. `etcd-lease` may read unknown (a release
/// sent to the frozen leader's cluster got no clean answer), never unsafe. The stall and
/// its end are in the history, the frozen member by its name.
#[test]
fn a_leader_stall_breaks_neither_etcd_design() {
    const STALL: &str =
        r#"[{"at_ms":400,"fault":"leader_stall","target":"etcd-leader","duration_ms":2000}]"#;
    let output = lockslab(&["chaos", "--design", "etcd-fenced", "--schedule", STALL])
        .args(["--schedules", "2", "--no-shrink", "--json"])
        .output()
        .unwrap();
    let lines = json_lines(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{lines:?}");
    let schedules: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "schedule").collect();
    assert!(
        schedules
            .iter()
            .all(|s| s["result"] == "safe" && s["unplayed"] == 0),
        "{schedules:?}"
    );
    let frozen: Vec<&Value> = (lines.iter())
        .filter(|l| l["kind"] == "frozen" && l["fault"] == "leader_stall")
        .collect();
    assert_eq!(frozen.len(), 2, "one stall a history: {lines:?}");
    for stall in frozen {
        let member = stall["target"].as_str().unwrap();
        assert!(
            member.starts_with('m') || member.starts_with("etcd"),
            "{stall}"
        );
        let thawed = (lines.iter()).find(|l| {
            l["kind"] == "resumed" && l["target"] == member && l["scenario"] == stall["scenario"]
        });
        let thawed = thawed.expect("the member stalled is the one thawed");
        assert!(thawed["paused_ms"].is_u64(), "{thawed}");
        assert!(
            thawed["text"].as_str().unwrap().contains("leader now"),
            "{thawed}"
        );
    }
    let (code, schedules, verdict, _) = replay("etcd-lease", STALL, "2");
    assert!(matches!(code, Some(0 | 3)), "{verdict}");
    assert!(
        schedules
            .iter()
            .all(|s| s["result"] != "unsafe" && s["unplayed"] == 0),
        "{schedules:?}"
    );
}

/// The processes in a network namespace other than the test's own, among `pids`: the
/// hosts' anchors and holder.
fn in_other_networks(pids: &HashSet<i32>) -> Vec<i32> {
    let own = std::fs::read_link("/proc/self/ns/net").unwrap();
    (pids.iter().copied())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|net| net != own))
        .collect()
}

/// Interrupted (SIGINT) or killed (SIGKILL) while A's host is cut off for 30 s: nothing of
/// the run is left — no client, no host (each a process holding a network namespace).
#[test]
fn ctrl_c_or_sigkill_mid_partition_leaves_no_client_and_no_host() {
    for signal in [Signal::SIGINT, Signal::SIGKILL] {
        let mut chaos = lockslab(&[
            "chaos",
            "--design",
            "optimistic",
            "--schedule",
            r#"[{"at_ms":0,"after":{"worker":"A","event":"read_record","nth":1},"fault":"partition","target":"A","duration_ms":30000}]"#,
            "--json",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
        let mut family = HashSet::new();
        let mut hosts = Vec::new();
        assert!(eventually(std::time::Duration::from_secs(60), || {
            family = HashSet::from([chaos.id() as i32]);
            family_in(&process_table(), &mut family);
            hosts = in_other_networks(&family);
            hosts.len() >= 4
        }));
        family.remove(&(chaos.id() as i32));
        kill(Pid::from_raw(chaos.id() as i32), signal).unwrap();
        let status = chaos.wait().unwrap();
        if signal == Signal::SIGINT {
            assert_eq!(status.code(), Some(130));
        }
        assert!(eventually(std::time::Duration::from_secs(10), || {
            hosts.iter().all(|pid| common::proc_state(*pid).is_none())
        }));
        assert_gone(&family.into_iter().collect::<Vec<_>>());
    }
}
