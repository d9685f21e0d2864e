//! `lockslab check`: every recorded run in tests/fixtures gives its verdict again offline,
//! judged from its history alone by the labs' own checkers; a copy edited after the run does
//! not, and says where. No servers: `check` asks none, so neither does this file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_lockslab");

/// Recorded before a challenge's jobs appended to their record's items: today's grader
/// weighs those items, so it cannot judge this run again (the picture tests keep it to
/// show that a verdict of then still draws).
const BEFORE_ITEMS: &str = "challenge.jsonl";

fn check(path: &Path) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(BIN)
        .arg("check")
        .arg(path)
        .env("NO_COLOR", "1")
        .env("COLUMNS", "1000")
        .output()
        .expect("running lockslab check");
    (
        status.code(),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// Every complete recorded run: tests/fixtures/*.jsonl and tests/fixtures/pictures/*.jsonl.
fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut files: Vec<PathBuf> = [root.clone(), root.join("pictures")]
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).unwrap())
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "jsonl"))
        .collect();
    files.sort();
    files
}

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
    .unwrap()
}

/// `text` saved in a directory of its own, to be checked.
fn saved(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.jsonl");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// `text` with its lines passed through `edit` (a line it returns None for is dropped).
fn edited(text: &str, edit: impl Fn(&str) -> Option<String>) -> String {
    let lines: Vec<String> = text.lines().filter_map(edit).collect();
    lines.join("\n") + "\n"
}

/// `text` with `from` written `to` in its lines of kind `kind` (once per line).
fn replaced(text: &str, kind: &str, from: &str, to: &str) -> String {
    let marker = format!("\"kind\":\"{kind}\"");
    edited(text, |line| {
        Some(match line.contains(&marker) {
            true => line.replacen(from, to, 1),
            false => line.to_string(),
        })
    })
}

#[test]
fn every_recorded_run_reproduces_its_verdict_offline() {
    let started = std::time::Instant::now();
    let files = fixtures();
    assert!(
        files.len() >= 16,
        "the recorded runs are missing: {files:?}"
    );
    for path in &files {
        let (code, stdout, stderr) = check(path);
        let name = path.file_name().unwrap().to_string_lossy();
        if name == BEFORE_ITEMS {
            assert_eq!(code, Some(4), "{name}: {stdout}{stderr}");
            assert!(
                stderr.contains("before a challenge's jobs appended"),
                "{stderr}"
            );
            continue;
        }
        assert_eq!(code, Some(0), "{name} did not reproduce:\n{stdout}{stderr}");
        assert!(stdout.contains("Reproduced:"), "{name}: {stdout}");
        let (fields, report) = stdout.split_once("\nReport:").expect("a Report section");
        assert!(!fields.contains('✗'), "{name}: {stdout}");
        said_its_report(&name, path, report);
    }
    // Offline and quick: the whole sweep is a few processes reading files.
    println!(
        "{} recorded runs checked in {:?}",
        files.len(),
        started.elapsed()
    );
}

/// `check`'s Report section (`report`, after `Report:`) is the checker's [`Report`] on the
/// recorded history: its outcome, and every finding with its outcome, its sentence and the
/// file's numbers of the events it points at. Every lab's history decides every part — an
/// older recording's read-back is taken from its verdict — so no part is left unknown for
/// want of evidence; a chaos hunt's is each history's findings, a challenge's its grader's
/// problems at the events of their jobs.
fn said_its_report(name: &str, path: &Path, report: &str) {
    use lockslab::reproduce::{Recorded, judge, replay};
    let recorded = Recorded::from_jsonl(&std::fs::read_to_string(path).unwrap()).unwrap();
    let judged = judge(&recorded, &replay(&recorded).unwrap())
        .unwrap_or_else(|why| panic!("{name}: no Report: {why}\n{report}"));
    let report_of = &judged.report;
    assert!(
        report.starts_with(&format!(" {} —", report_of.outcome.as_str())),
        "{name}: {report}"
    );
    assert!(!report_of.findings.is_empty(), "{name}: no finding");
    for finding in &report_of.findings {
        let line = format!(
            "{} {}: {}.",
            finding.name,
            finding.outcome.as_str(),
            finding.words
        );
        assert!(
            report.contains(&line),
            "{name}: no line `{line}` in\n{report}"
        );
        assert!(
            finding.name != "evidence" && !finding.name.starts_with("evidence ("),
            "{name}: the history left a part undecided: {finding:?}"
        );
        // The first event it points at, by its number in the file (from 1).
        if let Some(&first) = finding.events.first()
            && let Some(n) = judged.in_file[first]
        {
            let event = &recorded.events[n];
            let named = format!("#{} {} {}", n + 1, event.worker, event.kind());
            assert!(report.contains(&named), "{name}: `{named}` not said");
        }
    }
}

/// An older recording wrote the checker's conclusion into its history as a store line
/// (`stale_write_accepted`). It is no evidence: turned into the other conclusion, the run
/// still gives its verdict, judged from the store's record — while that record turned (the
/// test below) does not.
#[test]
fn a_store_line_turned_the_other_way_changes_no_verdict() {
    let flipped = replaced(
        &fixture("gc-pause.jsonl"),
        "stale_write_accepted",
        "stale_write_accepted",
        "stale_write_rejected",
    );
    assert_ne!(flipped, fixture("gc-pause.jsonl"));
    let (_dir, path) = saved(&flipped);
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(!stdout.contains("store line"), "{stdout}");
    assert!(stdout.contains("Reproduced:"), "{stdout}");
}

#[test]
fn a_read_back_that_says_the_store_refused_gives_another_verdict() {
    // The store's read-back is an event of the history now: the replay judges from it. Its
    // first run's last attempt turned from accepted to refused (and the resource's writer
    // with it) reads as a store that refused the stale write; the verdict says it took it.
    let text = fixture("gc-pause-token-restart.jsonl");
    let done = std::cell::Cell::new(false);
    let turned = edited(&text, |line| {
        if line.contains("\"kind\":\"read_back\"") && !done.replace(true) {
            let mut event: serde_json::Value = serde_json::from_str(line).unwrap();
            let attempts = event["attempts"].as_array_mut().unwrap();
            let last = attempts.last_mut().unwrap();
            last["accepted"] = (!last["accepted"].as_bool().unwrap()).into();
            let writer = attempts
                .iter()
                .rev()
                .find(|a| a["accepted"] == true)
                .map(|a| a["writer"].clone())
                .unwrap_or_default();
            event["final_writer"] = writer;
            return Some(event.to_string());
        }
        Some(line.to_string())
    });
    assert_ne!(turned, text);
    let (_dir, path) = saved(&turned);
    let (code, stdout, _) = check(&path);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("✗ late_write: recorded"), "{stdout}");
    assert!(stdout.contains("✗ final_writer: recorded"), "{stdout}");
}

#[test]
fn a_chaos_history_whose_read_back_lost_an_increment_is_not_reproduced() {
    // tests/fixtures/chaos.jsonl: `chaos --design redis-lock --schedules 4 --no-shrink`,
    // its third history safe. Its record's counter read back one lower than its log says.
    let text = fixture("chaos.jsonl");
    let tag = "\"scenario\":\"schedule-2\"";
    let lowered = edited(&text, |line| {
        if !(line.contains("\"kind\":\"records_read_back\"") && line.contains(tag)) {
            return Some(line.to_string());
        }
        let mut event: serde_json::Value = serde_json::from_str(line).unwrap();
        let value = &mut event["records"][0]["final_value"];
        *value = (value.as_i64().unwrap() - 1).into();
        Some(event.to_string())
    });
    assert_ne!(lowered, text);
    let (_dir, path) = saved(&lowered);
    let (code, stdout, _) = check(&path);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("✗ result: recorded safe, replayed unsafe")
            && stdout.contains("✗ unsafe: recorded 3, replayed 4"),
        "{stdout}"
    );
}

#[test]
fn a_verdict_field_changed_after_the_run_is_listed_with_both_values() {
    // The redis freeze cell's handover, 5002ms, written as 50ms.
    let changed = replaced(
        &fixture("etcd-vs-redis.jsonl"),
        "verdict",
        "\"handover_ms\":5002",
        "\"handover_ms\":50",
    );
    let (_dir, path) = saved(&changed);
    let (code, stdout, _) = check(&path);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stdout.contains("redis × freeze  ✗ 1 of")
            && stdout.contains("✗ handover_ms: recorded 50, replayed 5002"),
        "{stdout}"
    );
}

#[test]
fn a_run_cut_short_says_what_to_do() {
    let cut = edited(&fixture("gc-pause.jsonl"), |line| {
        (!line.contains("\"kind\":\"verdict\"")).then(|| line.to_string())
    });
    let (_dir, path) = saved(&cut);
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, Some(4), "{stdout}{stderr}");
    assert!(
        stderr.contains("no verdict line: was it cut short? run the lab again with --json"),
        "{stderr}"
    );
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn what_it_cannot_replay_it_says_and_names_what_it_can() {
    let cases: [(&str, &str); 5] = [
        ("not json\n", "line 1 is not JSON"),
        (
            "{\"kind\":\"verdict\",\"lab\":\"teleport\",\"json_version\":4}\n",
            "`teleport` is not a lab `check` replays",
        ),
        (
            "{\"kind\":\"schedule\",\"index\":0}\n{\"kind\":\"verdict\",\"lab\":\"chaos\",\"design\":\"redis-lock\"}\n",
            "schedule 0's history is not in the file",
        ),
        (
            "{\"kind\":\"cell\"}\n{\"kind\":\"verdict\",\"lab\":\"matrix\",\"json_version\":4}\n",
            "not the histories behind it",
        ),
        (
            "{\"kind\":\"verdict\",\"lab\":\"gc-pause\",\"json_version\":99}\n",
            "written by a newer lockslab",
        ),
    ];
    for (text, expected) in cases {
        let (_dir, path) = saved(text);
        let (code, _, stderr) = check(&path);
        assert_eq!(code, Some(4), "{text}: {stderr}");
        assert!(stderr.contains(expected), "{text}: {stderr}");
    }
    let (_dir, path) = saved("{\"kind\":\"verdict\",\"lab\":\"teleport\"}\n");
    let (_, _, stderr) = check(&path);
    assert!(
        stderr.contains("gc-pause") && stderr.contains("challenge"),
        "{stderr}"
    );
}

#[test]
fn stdin_is_read_with_a_dash_and_help_shows_examples() {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .args(["check", "-"])
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(fixture("skip-locked.jsonl").as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&output.stdout).contains("Reproduced:"));

    let help = Command::new(BIN)
        .args(["check", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("Examples:") && help.contains("lockslab check run.jsonl"),
        "{help}"
    );
}

/// A lab's checker over a recorded history: the [`Report`]'s outcome for each run agrees
/// with the verdict the run recorded, and every finding points at events that exist and are
/// of a kind that can prove it.
mod reports {
    use lockslab::check::report::{Outcome, Report};
    use lockslab::events::{Event, Kind};
    use lockslab::reproduce::Recorded;
    use serde_json::Value;

    /// The findings named `name` in `report`, in order (one per run).
    fn named<'a>(report: &'a Report, name: &str) -> Vec<&'a lockslab::check::report::Finding> {
        let prefix = format!("{name} (");
        report
            .findings
            .iter()
            .filter(|f| f.name.starts_with(&prefix))
            .collect()
    }

    /// Every event a finding named `name` points at exists in `recorded` and is one of the
    /// `kinds` given with that name: the kinds of event that can prove such a finding.
    fn points_at(recorded: &Recorded, report: &Report, proofs: &[(&str, &[Kind])]) {
        for (name, kinds) in proofs {
            for finding in named(report, name) {
                assert!(!finding.events.is_empty(), "{finding:?} points at nothing");
                for &at in &finding.events {
                    let event = recorded
                        .events
                        .get(at)
                        .unwrap_or_else(|| panic!("{finding:?}: no event {at}"));
                    assert!(
                        kinds.contains(&event.kind()),
                        "{}: event {at} is a {:?}, which proves nothing here",
                        finding.name,
                        event.kind()
                    );
                }
            }
        }
    }

    /// The fixture `name` read back, its history judged by `check`, and its verdict's list
    /// `parts` (the runs or modes the findings are about, in order).
    fn judged(
        name: &str,
        check: fn(&[Event]) -> Report,
        parts: &str,
    ) -> (Recorded, Report, Vec<Value>) {
        let recorded = Recorded::from_jsonl(&super::fixture(name)).unwrap();
        let report = check(&recorded.events);
        let parts = recorded.verdict.as_ref().unwrap()[parts]
            .as_array()
            .unwrap()
            .clone();
        (recorded, report, parts)
    }

    fn outcome_of(flag: Option<bool>) -> Outcome {
        match flag {
            Some(true) => Outcome::Invalid,
            Some(false) => Outcome::Valid,
            None => Outcome::Unknown,
        }
    }

    #[test]
    fn gc_pause_report_agrees_with_each_recorded_run_and_points_at_its_proof() {
        let (recorded, report, runs) = judged(
            "gc-pause-token-restart.jsonl",
            lockslab::labs::gc_pause::verdict::check,
            "runs",
        );
        let exclusion = named(&report, "mutual exclusion");
        let stale = named(&report, "stale write");
        assert_eq!((exclusion.len(), stale.len()), (runs.len(), runs.len()));
        for ((run, exclusion), stale) in runs.iter().zip(exclusion).zip(stale) {
            assert_eq!(
                exclusion.outcome,
                outcome_of(run["two_holders"].as_bool()),
                "{exclusion:?}"
            );
            let stale_taken = run["late_write"] == "accepted"
                || run["a_stale_write_accepted"] == Value::Bool(true);
            assert_eq!(stale.outcome, outcome_of(Some(stale_taken)), "{stale:?}");
            // The store's decision order is the proof of every stale-write finding.
            assert!(
                stale
                    .events
                    .iter()
                    .any(|&at| recorded.events[at].kind() == Kind::ReadBack),
                "{stale:?}"
            );
        }
        points_at(
            &recorded,
            &report,
            &[
                (
                    "mutual exclusion",
                    &[Kind::Released, Kind::Acquired, Kind::Pttl, Kind::ReadBack],
                ),
                ("stale write", &[Kind::ReadBack, Kind::Wrote]),
            ],
        );
        // Some runs refused the stale write, some took it: the lab as a whole is invalid.
        assert_eq!(report.outcome, Outcome::Invalid);
        assert!(report.with(Outcome::Valid).count() > 0);
    }

    #[test]
    fn a_history_without_the_store_read_back_is_unknown_never_a_pass() {
        // Recorded before the read-back was an event: its history alone cannot say what
        // the store decided (`lockslab check` takes it from the verdict instead).
        let (_, report, runs) = judged(
            "gc-pause.jsonl",
            lockslab::labs::gc_pause::verdict::check,
            "runs",
        );
        assert_eq!(report.outcome, Outcome::Unknown, "{report:?}");
        let open = named(&report, "evidence");
        assert_eq!(open.len(), runs.len());
        assert!(
            open.iter().all(|f| f.words.contains("read-back")),
            "{open:?}"
        );
    }

    #[test]
    fn naive_report_agrees_with_each_recorded_run_and_points_at_redis_answers() {
        let (recorded, report, scenarios) =
            judged("naive.jsonl", lockslab::labs::naive::check, "scenarios");
        for scenario in &scenarios {
            let name = scenario["name"].as_str().unwrap();
            for variant in ["broken", "fixed"] {
                let title = format!("mutual exclusion ({name}, {variant})");
                let finding = report.findings.iter().find(|f| f.name == title).unwrap();
                let broken = scenario[variant]["violations"].as_u64().unwrap() > 0;
                assert_eq!(finding.outcome, outcome_of(Some(broken)), "{finding:?}");
                // Redis's own answer decides, not what a worker believed.
                let [at] = finding.events[..] else {
                    panic!("{finding:?} points at no single answer")
                };
                let event = &recorded.events[at];
                assert!(
                    event.worker == "redis" && event.observed().is_some(),
                    "{title}: event {at} is {event:?}"
                );
            }
        }
        assert_eq!(report.findings.len(), 2 * scenarios.len());
        assert_eq!(report.outcome, Outcome::Invalid, "the broken lock breaks");
    }

    #[test]
    fn no_lock_report_agrees_with_each_recorded_approach_and_points_at_its_proof() {
        let (recorded, report, approaches) = judged(
            "no-lock.jsonl",
            lockslab::labs::no_lock::check,
            "approaches",
        );
        let find = |name: &str, approach: &str| {
            let title = format!("{name} (approach {approach})");
            report.findings.iter().find(|f| f.name == title).cloned()
        };
        for approach in &approaches {
            let name = approach["name"].as_str().unwrap();
            let once = find("exactly once", name).unwrap();
            let clean = approach["duplicates"] == 0
                && approach["lost_jobs"] == 0
                && approach["lost_updates"] == 0;
            assert_eq!(once.outcome, outcome_of(Some(!clean)), "{once:?}");
            for (finding, field) in [
                ("under freeze", "correct_under_freeze"),
                ("under kill", "correct_under_kill"),
            ] {
                let right = approach[field].as_bool();
                match find(finding, name) {
                    Some(found) => {
                        assert_eq!(found.outcome, outcome_of(right.map(|r| !r)), "{found:?}")
                    }
                    None => assert!(right.is_none(), "{name}: no {finding} finding"),
                }
            }
        }
        points_at(
            &recorded,
            &report,
            &[
                ("exactly once", &[Kind::TablesRead]),
                ("under freeze", &[Kind::Frozen, Kind::TablesRead]),
                ("under kill", &[Kind::Killed, Kind::TablesRead]),
            ],
        );
        assert_eq!(report.outcome, Outcome::Invalid);
    }

    #[test]
    fn skip_locked_report_agrees_with_each_recorded_mode_and_points_at_its_proof() {
        let (recorded, report, modes) = judged(
            "skip-locked.jsonl",
            lockslab::labs::skip_locked::check,
            "modes",
        );
        let once = named(&report, "exactly once");
        let killed = named(&report, "killed worker's job");
        assert_eq!((once.len(), killed.len()), (modes.len(), modes.len()));
        for ((mode, once), killed) in modes.iter().zip(once).zip(killed) {
            assert!(once.name.contains(mode["mode"].as_str().unwrap()));
            let clean = mode["duplicates"] == 0 && mode["lost"] == 0;
            let expected = if clean {
                Outcome::Valid
            } else {
                Outcome::Invalid
            };
            assert_eq!(once.outcome, expected, "{once:?}");
            // A reclaim time is recorded exactly when another worker claimed the job.
            assert_eq!(
                killed.outcome == Outcome::Valid,
                !mode["reclaim_ms"].is_null(),
                "{killed:?}"
            );
        }
        points_at(
            &recorded,
            &report,
            &[
                ("exactly once", &[Kind::TablesRead]),
                (
                    "killed worker's job",
                    &[Kind::Killed, Kind::Reclaimed, Kind::JobRead],
                ),
                (
                    "frozen worker's job",
                    &[Kind::Frozen, Kind::JobRead, Kind::FinishFailed],
                ),
            ],
        );
        assert_eq!(report.outcome, Outcome::Invalid, "the naive claim breaks");
    }
}

/// tests/fixtures/chaos-partition.jsonl: `chaos --design redis-lock --faults partition
/// --schedules 3 --seed 2 --no-shrink --parallel 3 --json` (issue 44). Each history holds
/// its partitions as the player did them — a client's host cut off, the links it cut, its
/// heal with how long it lasted — and the checker, judging again from the history alone,
/// finds what the run found: the client cut off writes stale once healed.
#[test]
fn a_chaos_partition_run_holds_its_cuts_and_heals_and_is_judged_again_the_same() {
    let text = fixture("chaos-partition.jsonl");
    let lines: Vec<serde_json::Value> = (text.lines())
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let of = |kind: &'static str| lines.iter().filter(move |l| l["kind"] == kind);
    for schedule in of("schedule") {
        let scenario = format!("schedule-{}", schedule["index"]);
        let steps = schedule["schedule"].as_array().unwrap();
        assert!(
            steps.iter().all(|s| s["fault"] == "partition"),
            "{schedule}"
        );
        let faults = |kind: &'static str| {
            of(kind)
                .filter(|e| e["scenario"] == scenario.as_str())
                .count()
        };
        assert!(
            faults("net_fault") >= 1 && faults("net_healed") >= 1,
            "{scenario}"
        );
        assert_eq!(schedule["result"], "unsafe", "{schedule}");
    }
    let cut = of("net_fault").next().unwrap();
    assert_eq!(cut["fault"], "partition");
    assert!(
        cut["text"].as_str().unwrap().contains("links cut:"),
        "{cut}"
    );
    let healed = of("net_healed").next().unwrap();
    assert!(healed["lasted_ms"].as_u64().unwrap() > 0, "{healed}");
    let (_dir, path) = saved(&text);
    let (code, stdout, stderr) = check(&path);
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    let (fields, report) = stdout.split_once("\nReport:").expect("a Report section");
    assert!(
        fields.contains("Reproduced:") && !fields.contains('✗'),
        "{stdout}"
    );
    assert!(report.contains("✗ stale-write (schedule 0)"), "{report}");
}
