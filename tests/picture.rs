//! The picture of a run (`--html`, `--svg`, `lockslab render`), checked structurally: no
//! browser needed here (scripts/check-pictures opens the pages in a real one).
//!
//! The fixtures are real runs' `--json` output: tests/fixtures/gc-pause.jsonl (both runs,
//! default settings: the unfenced one has two holders and a stale write taken) and
//! tests/fixtures/etcd-vs-redis.jsonl (kill and freeze on all three backends).

use crate::common;

use std::collections::HashSet;

use lockslab::check::report::{Finding, Outcome, Report};
use lockslab::events::Kind;
use lockslab::picture::{self, Recording};
use serde_json::{Value, json};

const GC_PAUSE: &str = include_str!("fixtures/gc-pause.jsonl");
const ETCD_VS_REDIS: &str = include_str!("fixtures/etcd-vs-redis.jsonl");

/// A saved run as `lockslab render` draws it: its events and verdict, and its checker's
/// Report on them.
fn recording(text: &str) -> Recording {
    let mut recording = Recording::from_jsonl(text).expect("the fixture parses");
    recording.report =
        lockslab::reproduce::report_for(&recording.events, recording.verdict.as_ref());
    recording
}

/// `text` (a hand-written history) drawn with a Report of one finding on mutual exclusion,
/// of `outcome`, pointing at event `at`; None: no Report at all.
fn with_exclusion(text: &str, found: Option<(Outcome, usize)>) -> String {
    let mut recording = Recording::from_jsonl(text).expect("the history parses");
    recording.report = found.map(|(outcome, at)| {
        Report::of([Finding::new("mutual exclusion (run 1)", outcome, "", [at])])
    });
    picture::svg(&recording)
}

/// A small well-formedness check: tags nest and close, attributes are quoted, `<` and `&`
/// appear in text and attributes only as markup and entities. Returns the element names.
fn well_formed(xml: &str) -> Result<Vec<String>, String> {
    let mut stack: Vec<String> = Vec::new();
    let mut names = Vec::new();
    let bytes = xml.as_bytes();
    let mut i = 0;
    let check_entities = |text: &str, at: usize| -> Result<(), String> {
        for (offset, _) in text.match_indices('&') {
            let rest = &text[offset..];
            let ok = ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"]
                .iter()
                .any(|e| rest.starts_with(e));
            if !ok {
                return Err(format!("a bare & near byte {}", at + offset));
            }
        }
        if text.contains('>') && text.contains('<') {
            return Err(format!("markup in text near byte {at}"));
        }
        Ok(())
    };
    while i < bytes.len() {
        if bytes[i] != b'<' {
            let end = xml[i..].find('<').map_or(xml.len(), |e| i + e);
            check_entities(&xml[i..end], i)?;
            i = end;
            continue;
        }
        let end = xml[i..]
            .find('>')
            .map(|e| i + e)
            .ok_or(format!("unclosed tag at byte {i}"))?;
        let tag = &xml[i + 1..end];
        if tag.starts_with('?') || tag.starts_with("!DOCTYPE") {
            i = end + 1;
            continue;
        }
        if let Some(name) = tag.strip_prefix('/') {
            let open = stack.pop().ok_or(format!("</{name}> closes nothing"))?;
            if open != name.trim() {
                return Err(format!("<{open}> closed by </{name}>"));
            }
        } else {
            let self_closing = tag.ends_with('/');
            let body = tag.trim_end_matches('/');
            let name: String = body.chars().take_while(|c| !c.is_whitespace()).collect();
            let mut attributes = body[name.len()..].trim();
            while !attributes.is_empty() {
                let eq = attributes
                    .find("=\"")
                    .ok_or(format!("unquoted attribute in <{name}>: {attributes}"))?;
                let value_end = attributes[eq + 2..]
                    .find('"')
                    .ok_or(format!("unterminated attribute in <{name}>"))?;
                let value = &attributes[eq + 2..eq + 2 + value_end];
                if value.contains('<') {
                    return Err(format!("< inside an attribute of <{name}>"));
                }
                check_entities(value, i)?;
                attributes = attributes[eq + 2 + value_end + 1..].trim_start();
            }
            names.push(name.clone());
            if !self_closing {
                stack.push(name);
            }
        }
        i = end + 1;
    }
    match stack.last() {
        Some(open) => Err(format!("<{open}> never closed")),
        None => Ok(names),
    }
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// The part of the drawing between two markers.
fn between<'a>(text: &'a str, from: &str, to: &str) -> &'a str {
    let start = text.find(from).expect("start marker");
    let end = text[start..].find(to).map_or(text.len(), |e| start + e);
    &text[start..end]
}

#[test]
fn the_svg_of_a_real_run_is_well_formed_xml() {
    let svg = picture::svg(&recording(GC_PAUSE));
    let names = well_formed(&svg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names.first().map(String::as_str), Some("svg"));
    assert!(svg.starts_with("<?xml"));
    let svg = picture::svg(&recording(ETCD_VS_REDIS));
    well_formed(&svg).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_checker_refuses_broken_xml() {
    assert!(well_formed("<svg><g></svg>").is_err());
    assert!(well_formed("<svg><text>A & B</text></svg>").is_err());
    assert!(well_formed("<svg a=b></svg>").is_err());
    assert!(well_formed("<svg><g/></svg>").is_ok());
}

#[test]
fn every_event_is_one_mark_and_every_grant_one_bar() {
    let run = recording(GC_PAUSE);
    let svg = picture::svg(&run);
    assert_eq!(count(&svg, "<g class=\"ev "), run.events.len());
    let indices: HashSet<String> = svg
        .match_indices("data-i=\"")
        .map(|(at, _)| {
            svg[at + 8..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect()
        })
        .collect();
    assert_eq!(indices.len(), run.events.len(), "one mark per event index");
    let grants = run
        .events
        .iter()
        .filter(|e| e.kind() == Kind::Acquired)
        .count();
    assert_eq!(grants, 4, "A and B in each of the two runs");
    assert_eq!(count(&svg, "<g class=\"bar\""), grants);
}

#[test]
fn each_run_is_a_part_with_a_lock_lane_and_a_lane_per_worker() {
    let svg = picture::svg(&recording(GC_PAUSE));
    assert_eq!(count(&svg, "<g class=\"part\""), 2);
    for part in ["fencing=false", "fencing=true"] {
        let drawn = between(&svg, &format!("data-part=\"{part}\""), "<g class=\"part\"");
        assert!(drawn.contains("class=\"lane lane-lock\" data-lane=\"redis\""));
        for worker in ["A", "B"] {
            assert!(
                drawn.contains(&format!(
                    "class=\"lane lane-worker\" data-lane=\"{worker}\""
                )),
                "{part}: no lane for {worker}"
            );
        }
        assert_eq!(count(drawn, "<g class=\"freeze\""), 1, "{part}: A's freeze");
    }
}

#[test]
fn the_two_holders_of_the_unfenced_run_are_drawn_as_an_overlap() {
    let svg = picture::svg(&recording(GC_PAUSE));
    let unfenced = between(
        &svg,
        "data-part=\"fencing=false\"",
        "data-part=\"fencing=true\"",
    );
    assert!(unfenced.contains("<g class=\"overlap\""));
    // A's lock had expired on Redis when B was granted: the label says so (A only believed
    // it still held it), as chaos's text verdict counts two holders from Redis's grants.
    assert!(unfenced.contains("two holders: A (lock ended) and B"));
    // A's key bar ends where Redis said it expired; its hatched tail runs on to its release.
    assert!(unfenced.contains("<g class=\"believed\" data-holder=\"A\""));
}

#[test]
fn no_overlap_when_the_first_holder_lets_go_before_the_next_is_granted() {
    let history = [
        json!({"t_ms": 0, "worker": "A", "kind": "acquired", "text": "", "backend": "redis"}),
        json!({"t_ms": 500, "worker": "A", "kind": "released", "text": "", "released": true}),
        json!({"t_ms": 600, "worker": "B", "kind": "acquired", "text": "", "backend": "redis"}),
        json!({"t_ms": 900, "worker": "B", "kind": "released", "text": "", "released": true}),
    ];
    let text: String = history.iter().map(|e| format!("{e}\n")).collect();
    let svg = picture::svg(&recording(&text));
    assert_eq!(count(&svg, "<g class=\"bar\""), 2);
    assert!(!svg.contains("<g class=\"overlap\""), "{svg}");
    assert!(!svg.contains("<g class=\"believed\""));

    // The same with B granted before A lets go, and a Report that found two holders.
    let mut overlapping = history.to_vec();
    overlapping[2]["t_ms"] = json!(400);
    overlapping.swap(1, 2);
    let text: String = overlapping.iter().map(|e| format!("{e}\n")).collect();
    let svg = with_exclusion(&text, Some((Outcome::Invalid, 1)));
    assert!(svg.contains("two holders: A (lock ended) and B"), "{svg}");
}

#[test]
fn two_holders_is_drawn_only_where_the_report_found_it() {
    // B's grant reached the lab before A's release: the arrival-stamped spans overlap. Whether
    // Redis granted twice is what the checker decides from its answers, not the picture.
    let history = [
        json!({"t_ms": 0, "worker": "A", "kind": "acquired", "text": "", "backend": "redis"}),
        json!({"t_ms": 400, "worker": "B", "kind": "acquired", "text": "", "backend": "redis"}),
        json!({"t_ms": 500, "worker": "A", "kind": "released", "text": "", "released": true}),
        json!({"t_ms": 900, "worker": "B", "kind": "released", "text": "", "released": true}),
    ];
    let text: String = history.iter().map(|e| format!("{e}\n")).collect();
    let found = with_exclusion(&text, Some((Outcome::Invalid, 1)));
    assert!(
        found.contains("two holders: A (lock ended) and B"),
        "{found}"
    );
    for (report, what) in [
        (Some((Outcome::Valid, 1)), "found none"),
        (Some((Outcome::Unknown, 1)), "could not tell"),
        (None, "is missing"),
    ] {
        let svg = with_exclusion(&text, report);
        assert!(
            !svg.contains("<g class=\"overlap\"") && !svg.contains("two holders"),
            "the Report {what}, yet the picture draws two holders: {svg}"
        );
        // The spans themselves are drawn as observed: both grants, both bars.
        assert_eq!(count(&svg, "<g class=\"bar\""), 2);
    }
}

#[test]
fn a_write_is_stale_only_where_the_report_found_it_late() {
    // Lab 1's unfenced run, its Report edited to say the store decided no late write and
    // nobody held the lock twice: A's write still comes after B's grant in arrival order.
    let mut edited = recording(GC_PAUSE);
    let report = edited.report.as_mut().expect("lab 1's checker judges it");
    let mut unfenced_findings = 0;
    for finding in &mut report.findings {
        if finding.name.contains("fencing=false") {
            finding.outcome = Outcome::Valid;
            finding.subject = None;
            unfenced_findings += 1;
        }
    }
    assert_eq!(unfenced_findings, 2, "two holders and the stale write");
    let svg = picture::svg(&edited);
    let unfenced = between(
        &svg,
        "data-part=\"fencing=false\"",
        "data-part=\"fencing=true\"",
    );
    assert!(!unfenced.contains("STALE write"), "{unfenced}");
    assert!(!unfenced.contains("<g class=\"overlap\""), "{unfenced}");
    assert!(unfenced.contains("write, no token: accepted"));
    // The fenced run's findings are untouched: its late write and two holders stay drawn.
    let fenced = between(&svg, "data-part=\"fencing=true\"", "</svg>");
    assert!(fenced.contains("STALE write, token 1: REJECTED"));
    assert!(fenced.contains("<g class=\"overlap\""));
}

#[test]
fn the_stale_write_is_highlighted_with_the_stores_answer() {
    let svg = picture::svg(&recording(GC_PAUSE));
    let unfenced = between(
        &svg,
        "data-part=\"fencing=false\"",
        "data-part=\"fencing=true\"",
    );
    let fenced = between(&svg, "data-part=\"fencing=true\"", "</svg>");
    assert!(unfenced.contains("STALE write, no token: ACCEPTED"));
    assert!(fenced.contains("STALE write, token 1: REJECTED"));
    // B's writes were made under its own lock: plain.
    assert!(unfenced.contains("write, no token: accepted"));
    assert!(fenced.contains("write, token 2: accepted"));
}

#[test]
fn etcd_vs_redis_draws_three_locks_kills_and_freezes() {
    let svg = picture::svg(&recording(ETCD_VS_REDIS));
    let kill = between(
        &svg,
        "data-part=\"scenario=kill\"",
        "data-part=\"scenario=freeze\"",
    );
    let freeze = between(&svg, "data-part=\"scenario=freeze\"", "</svg>");
    for backend in ["redis", "etcd", "postgres"] {
        let lane = format!("class=\"lane lane-lock\" data-lane=\"{backend}\"");
        assert!(kill.contains(&lane) && freeze.contains(&lane), "{backend}");
    }
    assert_eq!(count(kill, "<g class=\"ev k-killed"), 3);
    assert_eq!(count(freeze, "<g class=\"freeze\""), 3);
    // The frozen holders lost their lease or key to the waiter on etcd and Redis, not on
    // Postgres (the session lives on).
    assert!(freeze.contains("two holders: redis:holder (lock ended) and redis:waiter"));
    assert!(freeze.contains("two holders: etcd:holder (lock ended) and etcd:waiter"));
    assert!(!freeze.contains("two holders: postgres:holder"));
}

#[test]
fn pictures_make_no_external_reference() {
    for run in [recording(GC_PAUSE), recording(ETCD_VS_REDIS)] {
        for text in [picture::svg(&run), picture::html(&run)] {
            let without_namespace = text.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
            for banned in [
                "http://",
                "https://",
                "src=",
                "href=",
                "@import",
                "<link",
                "@font-face",
                "//cdn",
            ] {
                assert!(!without_namespace.contains(banned), "found {banned}");
            }
            assert!(text.len() < 200_000, "{} bytes", text.len());
        }
    }
}

#[test]
fn the_page_holds_the_drawing_the_verdict_and_the_hover_script() {
    let run = recording(GC_PAUSE);
    let html = picture::html(&run);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(count(&html, "<svg "), 1);
    assert_eq!(count(&html, "<g class=\"ev "), run.events.len());
    assert!(html.contains("<th>no fencing</th>") && html.contains("<th>fenced</th>"));
    assert!(html.contains("<td>late_write</td><td>accepted</td><td>rejected</td>"));
    assert!(html.contains("<div id=\"tip\""));
    assert!(html.contains("data-tip"));
}

#[test]
fn the_same_run_always_gives_the_same_bytes() {
    let first = picture::html(&recording(ETCD_VS_REDIS));
    let second = picture::html(&recording(ETCD_VS_REDIS));
    assert_eq!(first, second);
    assert_eq!(
        picture::svg(&recording(GC_PAUSE)),
        picture::svg(&recording(GC_PAUSE))
    );
}

#[test]
fn render_writes_the_file_the_library_draws() {
    let dir = tempfile::tempdir().unwrap();
    let input = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gc-pause.jsonl");
    for name in ["run.svg", "run.html"] {
        let out = dir.path().join(name);
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_lockslab"))
            .args(["render", input, "-o"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(status.status.success(), "{status:?}");
        let written = std::fs::read_to_string(&out).unwrap();
        let expected = if name.ends_with(".svg") {
            picture::svg(&recording(GC_PAUSE))
        } else {
            picture::html(&recording(GC_PAUSE))
        };
        assert_eq!(written, expected);
    }
}

#[test]
fn render_refuses_what_it_cannot_draw_with_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let input = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gc-pause.jsonl");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                input.into(),
                "-o".into(),
                dir.path().join("x.png").display().to_string(),
            ],
            ".html or .svg",
        ),
        (
            vec![
                "/no/such/run.jsonl".into(),
                "-o".into(),
                dir.path().join("x.svg").display().to_string(),
            ],
            "cannot read",
        ),
        (
            vec![input.into(), "-o".into(), "/no/such/dir/x.svg".into()],
            "no directory",
        ),
    ];
    for (args, says) in cases {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_lockslab"))
            .arg("render")
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

#[test]
fn a_lab_refuses_a_picture_it_could_not_write_before_it_plays() {
    let output = common::lockslab_offline(&["gc-pause", "--html", "/no/such/dir/run.html"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let output = common::lockslab_offline(&["gc-pause", "--svg", "run.html"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--svg run.html"));
}

#[test]
fn a_lab_run_draws_its_own_picture_from_the_json_it_prints() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("run.html");
    let svg = dir.path().join("run.svg");
    let (html_arg, svg_arg) = (html.display().to_string(), svg.display().to_string());
    let args = [
        "gc-pause",
        "--ttl",
        "300ms",
        "--pause",
        "600ms",
        "--fencing",
        "off",
        "--html",
        &html_arg,
        "--svg",
        &svg_arg,
    ];
    let (lines, verdict, output) = common::run_json(&args);
    assert!(String::from_utf8_lossy(&output.stderr).contains("picture: "));
    // The picture drawn live is the picture of the JSON the run printed.
    let printed = String::from_utf8_lossy(&output.stdout);
    let mut from_json = recording(&printed);
    let live_svg = std::fs::read_to_string(&svg).unwrap();
    well_formed(&live_svg).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        count(&live_svg, "<g class=\"ev "),
        lines.len(),
        "every event but the verdict"
    );
    let command = live_svg
        .split("class=\"settings\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .unwrap_or_default()
        .replace("&#39;", "'");
    from_json.command = Some(command);
    assert_eq!(live_svg, picture::svg(&from_json));
    let page = std::fs::read_to_string(&html).unwrap();
    if verdict["runs"][0]["two_holders"] == Value::Bool(true) {
        assert!(page.contains("<g class=\"overlap\""));
    }
    // The verdict is drawn in the lab's own words (as a terminal shows them), not as a raw
    // field table: `render` of the saved JSON draws the same page.
    let words = verdict["text"].as_array().expect("the verdict's words");
    assert!(
        words
            .iter()
            .any(|l| l.as_str().unwrap().contains("stale write")),
        "{verdict}"
    );
    assert!(page.contains("<pre>Verdict"), "the page draws the words");
    // (A field of the verdict's runs that its words never name.)
    assert!(
        !page.contains("stale_write_attempted"),
        "no raw field table"
    );
    // Every event carries the part it belongs to, and every grant its backend.
    assert!(
        lines
            .iter()
            .all(|e| e.part.part.as_deref() == Some("fencing=false"))
    );
    let grant = common::events(&lines, "A", Kind::Acquired)[0];
    assert_eq!(
        common::acquired(grant).unwrap().backend.as_deref(),
        Some("redis")
    );
}

/// Runs `lockslab render INPUT -o OUTPUT`, killed if it has not ended after a minute (a
/// hang guard, not a timing check: a refusal comes at once).
fn render_bounded(input: &std::path::Path, output: &std::path::Path) -> std::process::Output {
    use std::io::Read;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lockslab"))
        .arg("render")
        .arg(input)
        .arg("-o")
        .arg(output)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("render {} did not end within a minute", input.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    child
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut stdout)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_end(&mut stderr)
        .unwrap();
    std::process::Output {
        status,
        stdout,
        stderr,
    }
}

fn event_line(t_ms: u64, worker: &str, kind: &str, extra: &str) -> String {
    format!(r#"{{"t_ms":{t_ms},"worker":"{worker}","kind":"{kind}","text":"x"{extra}}}"#)
}

#[test]
fn render_refuses_input_it_cannot_draw_at_once_with_exit_4() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.svg");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    // A time near 2^64 (the grid once wrapped and grew without end).
    let absurd = write(
        "absurd.jsonl",
        &(event_line(0, "A", "acquired", "")
            + "\n"
            + &event_line(18_446_744_073_709_551_000, "A", "released", "")
            + "\n"),
    );
    // More lanes than a page holds (20,000 workers once took 6.9 GB).
    let lanes: String = (0..lockslab::picture::MOST_LANES + 1)
        .map(|i| event_line(i as u64, &format!("w{i}"), "waiting", "") + "\n")
        .collect();
    let many_lanes = write("lanes.jsonl", &lanes);
    // A verdict from a lockslab with a newer shape.
    let newer = write(
        "newer.jsonl",
        &(event_line(0, "A", "acquired", "")
            + "\n"
            + r#"{"kind":"verdict","json_version":99,"lab":"gc-pause","run_id":"x"}"#
            + "\n"),
    );
    // Two runs in one file, with their verdicts, and two runs without (interrupted ones).
    let twice = write("twice.jsonl", &format!("{GC_PAUSE}{GC_PAUSE}"));
    let two_ids = write(
        "two-ids.jsonl",
        &(event_line(0, "lab", "run", r#","run_id":"aaaa""#)
            + "\n"
            + &event_line(5, "lab", "run", r#","run_id":"bbbb""#)
            + "\n"),
    );
    // Bigger than any run: a sparse file, so the test writes nothing.
    let huge = dir.path().join("huge.jsonl");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(lockslab::picture::MOST_BYTES + 1)
        .unwrap();
    // Not a regular file: endless, or waiting for a writer that never comes.
    let fifo = dir.path().join("fifo.jsonl");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // Times no lab stamps: a float far past any run, and one before the run began.
    let float = write(
        "float.jsonl",
        &(event_line(0, "A", "acquired", "")
            + "\n"
            + r#"{"t_ms":1e300,"worker":"A","kind":"released","text":"x"}"#
            + "\n"),
    );
    let negative = write(
        "negative.jsonl",
        &(r#"{"t_ms":-5,"worker":"A","kind":"acquired","text":"x"}"#.to_string() + "\n"),
    );
    // A line that is no event at all: the file is wrong, not the command line.
    let not_json = write("notes.txt", "hello\n");
    // `lockslab chaos --json`: many runs summed up, no one timeline.
    let chaos = write(
        "chaos.jsonl",
        "{\"kind\":\"schedule\",\"index\":0,\"result\":\"safe\",\"run_id\":\"x\"}\n",
    );
    let cases: Vec<(std::path::PathBuf, &str)> = vec![
        (absurd, "t_ms 18446744073709551000"),
        (float, "event 2 is stamped t_ms 1e+300"),
        (negative, "event 1 is stamped t_ms -5"),
        (not_json, "line 1 is not JSON"),
        (chaos, "no one timeline to draw"),
        (
            many_lanes,
            "lanes (workers and backends): a picture draws at most 64",
        ),
        (newer, "written by a newer lockslab (json_version 99"),
        (twice, "more than one run"),
        (two_ids, "belongs to run bbbb, line 1 to run aaaa"),
        (huge, "render reads at most 32 MB"),
        ("/dev/zero".into(), "is not a regular file"),
        (fifo, "is not a regular file"),
    ];
    for (input, says) in cases {
        let output = render_bounded(&input, &out);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(4),
            "{}: {stderr}",
            input.display()
        );
        assert!(
            common::one_line(&stderr).contains(says),
            "{}: {stderr}",
            input.display()
        );
        assert!(!out.exists(), "{}: no picture is written", input.display());
        assert!(!stderr.contains("--help"), "{}: {stderr}", input.display());
    }
}

#[test]
fn every_character_of_a_picture_is_allowed_in_xml() {
    // U+FFFE, U+FFFF and C0 controls are not XML characters; a run's text may carry them
    // (a worker's stray output line, a lock name typed by hand).
    let nasty = "a\u{1}b\u{1b}[31mc\u{FFFE}d\u{FFFF}e\u{7}\r";
    let event = json!({"t_ms": 1, "worker": nasty, "kind": "output", "text": nasty,
                       "part": nasty, nasty: nasty});
    let verdict = json!({"kind": "verdict", "lab": nasty, "run_id": nasty, "note": nasty});
    let text = format!("{event}\n{verdict}\n");
    let recording = recording(&text);
    for (name, xml) in [
        ("svg", picture::svg(&recording)),
        ("html", picture::html(&recording)),
    ] {
        let bad: Vec<char> = xml
            .chars()
            .filter(|&c| {
                let code = c as u32;
                (code < 0x20 && c != '\n' && c != '\t' && c != '\r')
                    || c == '\u{FFFE}'
                    || c == '\u{FFFF}'
            })
            .collect();
        assert!(bad.is_empty(), "{name} carries {bad:?}");
    }
    well_formed(&picture::svg(&recording)).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn a_large_run_is_drawn_and_its_bars_still_cut_by_the_backend() {
    // Many holders in turn on one lock, each write after its own grant: reading it is linear
    // (it was quadratic: 10^5 events took minutes). The drawing must still be right.
    let mut text = String::new();
    let holders = 20_000;
    for i in 0..holders {
        let worker = format!("w{}", i % 40);
        let t = i * 10;
        text.push_str(&event_line(t, &worker, "acquired", r#","backend":"redis""#));
        text.push('\n');
        text.push_str(&event_line(
            t + 5,
            &worker,
            "wrote",
            r#","outcome":"accepted","token":1"#,
        ));
        text.push('\n');
        text.push_str(&event_line(
            t + 8,
            &worker,
            "released",
            r#","released":true"#,
        ));
        text.push('\n');
    }
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big.jsonl");
    std::fs::write(&input, &text).unwrap();
    let out = dir.path().join("big.svg");
    let output = render_bounded(&input, &out);
    assert!(output.status.success(), "{output:?}");
    let svg = std::fs::read_to_string(&out).unwrap();
    assert_eq!(count(&svg, "<g class=\"bar\""), holders as usize);
    // Each holder wrote and let go before the next grant: none is stale, no two holders.
    assert_eq!(count(&svg, "STALE"), 0);
    assert_eq!(count(&svg, "<g class=\"overlap\""), 0);
}

#[test]
fn a_lab_refuses_a_picture_in_a_place_it_cannot_write_before_it_plays() {
    // /proc takes no new files, not even from root; the directory exists, the name is fine.
    for flag in ["--html", "--svg"] {
        let target = if flag == "--html" {
            "/proc/run.html"
        } else {
            "/proc/run.svg"
        };
        let output = common::lockslab_offline(&["gc-pause", flag, target])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("cannot write in /proc"), "{stderr}");
        assert!(output.stdout.is_empty(), "the lab did not play: {output:?}");
    }
}

#[test]
fn a_write_that_fails_midway_leaves_the_old_picture_whole() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.svg");
    std::fs::write(&out, "the old picture").unwrap();
    let input = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gc-pause.jsonl");
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_lockslab"));
    command.args(["render", input, "-o"]).arg(&out);
    // A disk that fills during the write: files may grow to 20 KB (past the 16 KB the check
    // before writes, short of the 25 KB picture), then writes fail (EFBIG).
    unsafe {
        command.pre_exec(|| {
            use nix::libc;
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let limit = libc::rlimit {
                rlim_cur: 20_000,
                rlim_max: 20_000,
            };
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("writing the picture"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "the old picture");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
}

/// A tmpfs of 256 KiB, filled up: a full disk, unmounted when dropped.
struct FullDisk(tempfile::TempDir);

impl FullDisk {
    /// None when this user may not mount (the test needs root).
    fn mount() -> Option<FullDisk> {
        if !nix::unistd::geteuid().is_root() {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(mounted.success(), "root could not mount a tmpfs");
        let disk = FullDisk(dir);
        let mut filler = std::fs::File::create(disk.0.path().join("filler")).unwrap();
        let full = (0..64).any(|_| std::io::Write::write_all(&mut filler, &[1u8; 16384]).is_err());
        assert!(full, "the tmpfs never filled up");
        Some(disk)
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_lab_refuses_a_picture_on_a_full_disk_before_it_plays() {
    let Some(disk) = FullDisk::mount() else {
        return; // not root: no tmpfs of its own to fill
    };
    for name in ["run.html", "run.svg"] {
        let target = disk.0.path().join(name).display().to_string();
        let flag = if name.ends_with(".svg") {
            "--svg"
        } else {
            "--html"
        };
        let output = common::lockslab(&["gc-pause", flag, &target])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(4), "{stderr}");
        assert!(stderr.contains("cannot write 16 KB in"), "{stderr}");
        assert!(output.stdout.is_empty(), "the lab did not play: {output:?}");
    }
}

// Labs 5, 6 and 7, drawn from real runs of this lockslab (tests/fixtures/pictures/: the
// defaults, `--json`): what each picture must show, checked against the typed history.

const FAILOVER: &str = include_str!("fixtures/pictures/failover.jsonl");
const REDLOCK: &str = include_str!("fixtures/pictures/redlock.jsonl");
const NO_LOCK: &str = include_str!("fixtures/pictures/no-lock.jsonl");

/// Every mark's label in an SVG: the mark's x, the label's absolute x and baseline, its text.
fn labels(svg: &str) -> Vec<(f64, f64, f64, String)> {
    let number = |text: &str, after: &str| -> Option<f64> {
        let start = text.find(after)? + after.len();
        let end = start + text[start..].find(['"', ',', ')'])?;
        text[start..end].parse().ok()
    };
    let mut found = Vec::new();
    // Labels are drawn after every mark of their lane, each in a group at its mark.
    for chunk in svg.split("<g class=\"mark-label\" ").skip(1) {
        let chunk = &chunk[..chunk.find("</g>").unwrap_or(chunk.len())];
        let Some(x) = number(chunk, "translate(") else {
            continue;
        };
        let after_title = chunk;
        let y = number(chunk, ",").unwrap_or(0.0);
        let Some(at) = after_title.find("<text class=\"lbl\"") else {
            continue;
        };
        let text = &after_title[at..];
        let (Some(dx), Some(dy)) = (number(text, " x=\""), number(text, " y=\"")) else {
            continue;
        };
        let body = &text
            [text.find('>').expect("text opens") + 1..text.find("</text>").expect("text closes")];
        found.push((x, x + dx, y + dy, body.to_string()));
    }
    found
}

/// No two labels on one baseline cover each other, and each sits right beside its mark
/// (just right of it, or just left), never far along the lane.
fn assert_labels_apart_and_beside(svg: &str) {
    let labels = labels(svg);
    assert!(!labels.is_empty(), "no labels found");
    let width = |text: &str| text.chars().count() as f64 * 6.3;
    for (i, (mark_x, from, y, text)) in labels.iter().enumerate() {
        let to = from + width(text);
        let right = (from - (mark_x + 9.0)).abs() < 0.2;
        // A bold label (a stale write, a kill) is laid out at its bold width, 7.4 a char.
        let bold_to = from + text.chars().count() as f64 * 7.4;
        let left = (to - (mark_x - 9.0)).abs() < 0.2 || (bold_to - (mark_x - 9.0)).abs() < 0.2;
        assert!(
            right || left,
            "{text:?} at {from} is not beside its mark at {mark_x}"
        );
        for (_, other_from, other_y, other) in &labels[i + 1..] {
            let other_to = other_from + width(other);
            let apart =
                (y - other_y).abs() > 1.0 || to <= *other_from + 0.1 || *from >= other_to - 0.1;
            assert!(apart, "{text:?} and {other:?} overlap at y {y}");
        }
    }
}

fn lock_of(event: &lockslab::events::Event) -> Option<String> {
    event.lock().map(str::to_string)
}

#[test]
fn lab_5_draws_one_lane_per_lock_and_two_holders_only_within_one() {
    let recording = recording(FAILOVER);
    let picture = picture::Picture::of(&recording);
    let redis = picture
        .parts
        .iter()
        .find(|p| p.label == "scenario=redis-failover")
        .expect("the Redis part");
    // As many lock lanes as locks the backends granted in the part.
    let granted: HashSet<String> = recording
        .events
        .iter()
        .filter(|e| e.kind() == Kind::Acquired && e.part.part.as_deref() == Some(&redis.label))
        .filter_map(lock_of)
        .collect();
    let lock_lanes: Vec<_> = redis
        .lanes
        .iter()
        .filter(|l| l.kind == picture::LaneKind::Lock)
        .collect();
    assert_eq!(lock_lanes.len(), granted.len(), "one lane per lock");
    assert!(granted.len() >= 5, "the run grants five locks: {granted:?}");
    // Two holders only between two grants of the same lock: A:x and B:x.
    let mut bands = 0;
    for lane in &lock_lanes {
        for overlap in &lane.overlaps {
            bands += 1;
            let pairs: HashSet<&str> = overlap
                .holders
                .iter()
                .map(|h| h.split_once(':').map_or(h.as_str(), |(_, pair)| pair))
                .collect();
            assert_eq!(
                pairs.len(),
                1,
                "two holders across two locks: {:?}",
                overlap.holders
            );
            let holders_of_lane: HashSet<&str> =
                lane.bars.iter().map(|b| b.holder.as_str()).collect();
            assert!(
                overlap
                    .holders
                    .iter()
                    .all(|h| holders_of_lane.contains(h.as_str()))
            );
        }
    }
    assert!(bands >= 1, "the failover hands at least one lock out twice");
    // "Stale" exactly on the late writes: a write made after another worker was granted
    // the writer's lock.
    for lane in &redis.lanes {
        for mark in lane
            .marks
            .iter()
            .filter(|m| m.shape == picture::Shape::Write)
        {
            let event = &recording.events[mark.index];
            let writer = event.worker.as_str();
            let own = recording.events[..mark.index]
                .iter()
                .rev()
                .find(|e| e.kind() == Kind::Acquired && e.worker == writer)
                .expect("a write follows its grant");
            let late = recording.events[..mark.index].iter().any(|e| {
                e.kind() == Kind::Acquired
                    && e.worker != writer
                    && lock_of(e) == lock_of(own)
                    && e.t_ms >= own.t_ms
            });
            let label = mark.label.as_deref().unwrap_or("");
            assert_eq!(label.starts_with("STALE"), late, "{writer}: {label}");
        }
    }
    assert_labels_apart_and_beside(&picture::svg(&recording));
}

#[test]
fn lab_6_draws_two_holders_only_in_the_scenarios_its_verdict_found_them() {
    // In the client-pause scenario A froze past its validity and B was granted after it had
    // ended: the verdict says the lock was never granted twice within validity. A's
    // hatched tail (believed held until its release) still overlaps B's bar.
    let recording = recording(REDLOCK);
    let picture = picture::Picture::of(&recording);
    let quorum = |label: &str| {
        let part = picture
            .parts
            .iter()
            .find(|p| p.label == label)
            .expect(label);
        part.lanes
            .iter()
            .find(|l| l.name == "redlock")
            .expect("the quorum lane")
    };
    let paused = quorum("scenario=client-pause");
    let bar = |holder: &str| {
        paused
            .bars
            .iter()
            .find(|b| b.holder == holder)
            .expect(holder)
    };
    assert!(
        bar("B").from < bar("A").believed_to,
        "the fixture's spans overlap, as this test needs"
    );
    assert!(
        paused.overlaps.is_empty(),
        "two holders drawn where the verdict found none: {:?}",
        paused.overlaps
    );
    // Where the verdict found two majorities at once, they are drawn.
    for label in ["scenario=restart", "scenario=clock-jump"] {
        assert_eq!(quorum(label).overlaps.len(), 1, "{label}");
    }
}

#[test]
fn lab_6_draws_a_lane_per_master_and_each_majority_on_them() {
    let recording = recording(REDLOCK);
    let picture = picture::Picture::of(&recording);
    let mut majorities_at_once = 0;
    for part in &picture.parts {
        let rounds: Vec<(usize, &lockslab::events::Event)> = recording
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.kind() == Kind::Acquired && e.part.part.as_deref() == Some(&part.label)
            })
            .collect();
        if rounds.is_empty() {
            continue;
        }
        let names: Vec<&str> = part.lanes.iter().map(|l| l.name.as_str()).collect();
        for master in ["m1", "m2", "m3", "m4", "m5"] {
            assert!(
                names.contains(&master),
                "{}: no lane for {master}: {names:?}",
                part.label
            );
        }
        // Each round that held: one bar on each master that granted, at the round's time.
        for (_, round) in &rounds {
            let value = serde_json::to_value(round).expect("an event serializes");
            let granted: Vec<&str> = value["attempt"]["answers"]
                .as_array()
                .expect("a round's answers")
                .iter()
                .filter(|a| a["reply"] == "granted")
                .filter_map(|a| a["master"].as_str())
                .collect();
            for lane in part.lanes.iter().filter(|l| l.name.starts_with('m')) {
                let has = lane
                    .bars
                    .iter()
                    .any(|b| b.from == round.t_ms && b.holder == round.worker);
                assert_eq!(
                    has,
                    granted.contains(&lane.name.as_str()),
                    "{}: {} on {}",
                    part.label,
                    round.worker,
                    lane.name
                );
            }
        }
        let quorum = part
            .lanes
            .iter()
            .find(|l| l.name == "redlock")
            .expect("the quorum lane");
        majorities_at_once += quorum.overlaps.len();
        // A kill of a master is drawn on that master's lane, not the lab's.
        for lane in &part.lanes {
            for mark in lane
                .marks
                .iter()
                .filter(|m| m.shape == picture::Shape::Kill)
            {
                let event = &recording.events[mark.index];
                if let Some(target) = event.fault().and_then(|f| f.target.as_deref()) {
                    assert_eq!(lane.name, target);
                }
            }
        }
    }
    assert!(
        majorities_at_once >= 2,
        "restart-empty and clock-jump grant twice"
    );
    // The store's answers, each naming the guard it met, were once events of the history
    // (the checker's conclusion): an older recording's are plain lines now, each still
    // drawn on the store's lane with its sentence in the hover text.
    let svg = picture::svg(&recording);
    let store_lines: Vec<&lockslab::events::Event> = recording
        .events
        .iter()
        .filter(|e| e.worker == "store" && e.kind() == Kind::Output)
        .collect();
    assert!(!store_lines.is_empty(), "the older recording's store lines");
    for event in store_lines {
        let drawn = picture
            .parts
            .iter()
            .flat_map(|part| &part.lanes)
            .filter(|lane| lane.name == "store")
            .flat_map(|lane| &lane.marks)
            .any(|mark| mark.tip.contains(&event.text));
        assert!(drawn, "not drawn: {}", event.text);
    }
    assert_labels_apart_and_beside(&svg);
}

#[test]
fn lab_7_shows_each_approachs_outcome_and_fits_a_page() {
    let recording = recording(NO_LOCK);
    let picture = picture::Picture::of(&recording);
    assert_eq!(picture.parts.len(), 8, "eight approaches");
    for part in &picture.parts {
        // What the tables counted back: a job twice or never, a balance off, is broken.
        let read_back = recording
            .events
            .iter()
            .filter(|e| e.part.part.as_deref() == Some(&part.label))
            .find_map(|e| match e.kind() {
                Kind::TablesRead => Some(match e.observed()?.counted_wrong() {
                    0 => "each job once",
                    _ => "broken",
                }),
                _ => None,
            })
            .expect("each approach is read back");
        let (outcome, _) = part.outcome.as_ref().expect("an outcome");
        assert!(outcome.starts_with(read_back), "{}: {outcome}", part.label);
        // A lock lane only where a lock was granted.
        let grants = recording.events.iter().any(|e| {
            e.part.part.as_deref() == Some(&part.label)
                && matches!(e.kind(), Kind::Acquired | Kind::Between)
        });
        let lock_lanes = part
            .lanes
            .iter()
            .filter(|l| l.kind == picture::LaneKind::Lock)
            .count();
        assert!(
            grants || lock_lanes == 0,
            "{}: a lock lane with no lock",
            part.label
        );
    }
    // Refusals and no-ops are marked on the workers whose tally has them.
    let refused = picture
        .parts
        .iter()
        .flat_map(|p| &p.lanes)
        .flat_map(|l| &l.marks)
        .filter(|m| {
            m.label
                .as_deref()
                .is_some_and(|l| l.contains("refused") || l.contains("no-ops"))
        })
        .count();
    assert!(refused > 0, "no refused or no-op marks");
    let svg = picture::svg(&recording);
    let height: f64 = between(&svg, "<svg ", ">")
        .split("height=\"")
        .nth(1)
        .and_then(|h| h.split('"').next())
        .and_then(|h| h.parse().ok())
        .expect("the drawing's height");
    let drawing_only = between(&svg, "<svg ", "Verdict</text>");
    assert!(height > 0.0 && drawing_only.contains("class=\"outcomes\""));
    let html = picture::html(&recording);
    let drawing: f64 = between(&html, "<svg ", ">")
        .split("height=\"")
        .nth(1)
        .and_then(|h| h.split('"').next())
        .and_then(|h| h.parse().ok())
        .expect("the page's drawing height");
    assert!(drawing <= 2400.0, "the drawing is {drawing}px tall");
    assert_labels_apart_and_beside(&svg);
}

#[test]
fn every_two_holders_label_stays_inside_the_drawing() {
    for fixture in [ETCD_VS_REDIS, FAILOVER, REDLOCK, GC_PAUSE] {
        let svg = picture::svg(&recording(fixture));
        let mut seen = 0;
        for chunk in svg.split("<g class=\"overlap\">").skip(1) {
            let text = &chunk[chunk.find("<text").expect("a label")..];
            let x: f64 = between(text, " x=\"", "\" y=")[" x=\"".len()..]
                .parse()
                .expect("a number");
            let label = &text[text.find('>').unwrap() + 1..text.find("</text>").unwrap()];
            let width = label.chars().count() as f64 * 6.3;
            assert!(
                x >= 0.0 && x + width <= 1280.0 - 12.0 + 0.1,
                "{label:?} runs out of the drawing at x {x}"
            );
            seen += 1;
        }
        assert!(seen > 0, "a fixture with two holders");
    }
}

const QUEUE: &str = include_str!("fixtures/queue.jsonl");

/// Lab 10: each way of queueing shows, beside its heading, whether the waiters were served
/// in the order they asked and what a hand-over cost, from the waiters' own turns.
#[test]
fn lab_10_shows_each_queues_order_and_cost() {
    let recording = recording(QUEUE);
    let picture = picture::Picture::of(&recording);
    let svg = picture::svg(&recording);
    let mut queues = 0;
    for event in &recording.events {
        let lockslab::events::What::Handovers(queue) = &event.what else {
            continue;
        };
        queues += 1;
        let label = event.part.part.as_deref().expect("a part");
        let part = picture
            .parts
            .iter()
            .find(|p| p.label == label)
            .expect("the queue's part");
        let (outcome, tone) = part.outcome.as_ref().expect("an outcome");
        let mut served: Vec<_> = queue.turns.iter().filter(|t| t.token.is_some()).collect();
        served.sort_by_key(|t| t.token);
        let fair = served.len() == queue.turns.len()
            && served.windows(2).all(|pair| pair[0].asked < pair[1].asked);
        let handovers = served.len() as f64 - 1.0;
        let wakeups: u64 = queue.turns.iter().map(|t| t.wakeups).sum();
        assert_eq!(
            outcome.starts_with("served in order —"),
            fair,
            "{label}: {outcome}"
        );
        assert_eq!(*tone == picture::Tone::Bad, !fair, "{label}: {tone:?}");
        assert!(
            outcome.contains(&format!("{:.1} wake-ups", wakeups as f64 / handovers)),
            "{label}: {outcome}"
        );
        assert!(
            svg.contains(&outcome.replace('>', "&gt;")),
            "{label}: not drawn"
        );
    }
    assert_eq!(queues, 3, "spinning, herd and recipe");
    // The spinning waiters and the herd are served out of order; the recipe is fair. (The
    // parts after them, expiry and election, say how their late writes came out.)
    let queue_parts: Vec<&str> = recording
        .events
        .iter()
        .filter(|e| e.kind() == Kind::Handovers)
        .filter_map(|e| e.part.part.as_deref())
        .collect();
    let fair: Vec<bool> = picture
        .parts
        .iter()
        .filter(|p| queue_parts.contains(&p.label.as_str()))
        .filter_map(|p| p.outcome.as_ref())
        .map(|(o, _)| o.starts_with("served in order"))
        .collect();
    assert_eq!(fair, [false, false, true]);
    // The line of outcomes above the drawing tells the three queues apart.
    let line = between(&svg, "class=\"outcomes\"", "</text>");
    for way in ["herd redis_spin", "herd etcd_herd", "herd etcd_recipe"] {
        assert!(line.contains(way), "{way}: {line}");
    }
}

const LEASE_GUARD: &str = include_str!("fixtures/lease-guard.jsonl");

/// Lab 9 (and lab 1): each part says how its late write came out, as its verdict records it
/// (the picture draws it from the checker's Report): the store took it (late write taken), the store
/// refused it, or the writer's guard held it back; the outcomes above the drawing stay
/// inside its width.
#[test]
fn lab_9_shows_how_each_parts_late_write_came_out() {
    for fixture in [LEASE_GUARD, GC_PAUSE] {
        let recording = recording(fixture);
        let picture = picture::Picture::of(&recording);
        let verdict = recording.verdict.as_ref().expect("a verdict");
        for part in &picture.parts {
            let tags = &recording
                .events
                .iter()
                .find(|e| e.part.part.as_deref() == Some(&part.label))
                .expect("a part has events")
                .part;
            // Lab 9's cell of this fault and guard, or lab 1's run of this fencing.
            let recorded = match verdict["lab"].as_str() {
                Some("lease-guard") => verdict["cells"].as_array().unwrap().iter().find(|c| {
                    c["fault"].as_str() == tags.scenario.as_deref()
                        && c["guard"].as_str() == tags.variant.as_deref()
                }),
                _ => verdict["runs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|r| r["fencing"].as_bool() == tags.fencing),
            }
            .unwrap_or_else(|| panic!("{}: no verdict item", part.label));
            let came_out = recorded["outcome"]
                .as_str()
                .or(recorded["late_write"].as_str());
            let expected = match came_out {
                Some("stale_accepted" | "accepted") => Some("late write taken"),
                Some("stale_refused" | "rejected") => Some("late write refused"),
                Some("aborted") => Some("held back"),
                _ => None,
            };
            let got = part.outcome.as_ref().map(|(text, _)| text.as_str());
            match expected {
                Some(word) => assert!(
                    got.is_some_and(|t| t.starts_with(word)),
                    "{}: {got:?}, expected {word}",
                    part.label
                ),
                None => assert_eq!(got, None, "{}", part.label),
            }
        }
        let svg = picture::svg(&recording);
        for line in svg.split("class=\"outcomes\"").skip(1) {
            let text = between(line, ">", "</text>");
            let shown: usize = text
                .split('>')
                .map(|piece| piece.split('<').next().unwrap_or("").chars().count())
                .sum();
            assert!(shown as f64 * 7.8 <= 1280.0, "too wide: {text}");
        }
    }
    // Lab 1's two runs are named by what tells them apart.
    let svg = picture::svg(&recording(GC_PAUSE));
    let line = between(&svg, "class=\"outcomes\"", "</text>");
    assert!(
        line.contains("no fencing:</tspan>") && line.contains("fenced:</tspan>"),
        "{line}"
    );
}

/// Lab 10's herd queues: each waiter's turn is a bar on the lock lane, as long as the turn
/// the waiter measured, and the part lasts as long as the queue did (not the one instant
/// the lab reported it at).
#[test]
fn lab_10_herd_queues_draw_every_turn_as_long_as_it_was() {
    let recording = recording(QUEUE);
    let picture = picture::Picture::of(&recording);
    let mut queues = 0;
    for event in &recording.events {
        let lockslab::events::What::Handovers(queue) = &event.what else {
            continue;
        };
        queues += 1;
        let label = event.part.part.as_deref().expect("a part");
        let part = picture.parts.iter().find(|p| p.label == label).unwrap();
        let lane = part
            .lanes
            .iter()
            .find(|l| l.kind == picture::LaneKind::Lock)
            .unwrap_or_else(|| panic!("{label}: no lock lane"));
        assert_eq!(
            lane.bars.len(),
            queue.turns.len(),
            "{label}: a bar per turn"
        );
        for turn in &queue.turns {
            let bar = lane.bars.iter().find(|b| b.holder == turn.waiter).unwrap();
            let measured = (turn.leave_ns - turn.enter_ns) as f64 / 1e6;
            let drawn = (bar.held_to - bar.from) as f64;
            assert!(
                (drawn - measured).abs() <= 1.0,
                "{label} {}: {drawn} vs {measured}",
                turn.waiter
            );
        }
        let first = queue.turns.iter().map(|t| t.enter_ns).min().unwrap();
        let last = queue.turns.iter().map(|t| t.leave_ns).max().unwrap();
        let queue_ms = (last - first) / 1_000_000;
        assert!(
            part.end - part.start >= queue_ms,
            "{label}: drawn {}ms long, the queue took {queue_ms}ms",
            part.end - part.start
        );
    }
    assert_eq!(queues, 3);
}

/// Lab 10: a long outcome wraps onto more lines of the heading, whole, never cut short.
#[test]
fn lab_10_long_outcomes_wrap_whole() {
    let recording = recording(QUEUE);
    let picture = picture::Picture::of(&recording);
    let svg = picture::svg(&recording);
    let mut wrapped = 0;
    for chunk in svg.split("<text class=\"outcome\"").skip(1) {
        let chunk = &chunk[..chunk.find("</text>").unwrap()];
        let lines: Vec<&str> = chunk
            .split("<tspan")
            .skip(1)
            .map(|t| &t[t.find('>').unwrap() + 1..t.find("</tspan>").unwrap()])
            .collect();
        assert!(!lines.concat().contains('…'), "cut: {lines:?}");
        let whole = lines.join(" ").replace("&#39;", "'");
        assert!(
            picture
                .parts
                .iter()
                .filter_map(|p| p.outcome.as_ref())
                .any(|(o, _)| *o == whole),
            "{whole:?} is not an outcome, whole"
        );
        wrapped += usize::from(lines.len() > 1);
    }
    assert!(
        wrapped >= 1,
        "the redis_spin outcome is longer than one line"
    );
    assert_labels_apart_and_beside(&svg);
}

/// Lab 10: a wait's name ("on W1", "on the lock") never runs into a freeze's label on its
/// lane, nor into a mark's label on the lane's foot.
#[test]
fn lab_10_wait_names_keep_clear_of_freeze_labels() {
    let recording = recording(QUEUE);
    let svg = picture::svg(&recording);
    let texts = |class: &str, size: f64| -> Vec<(f64, f64, f64)> {
        svg.split(&format!("<g class=\"{class}\">"))
            .skip(1)
            .filter_map(|chunk| {
                let text = &chunk[chunk.find("<text class=\"lbl\"")?..];
                let attr = |name: &str| -> f64 {
                    let at = text.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
                    text[at..at + text[at..].find('"').unwrap()]
                        .parse()
                        .unwrap()
                };
                let body = &text[text.find('>')? + 1..text.find("</text>")?];
                let width = body.chars().count() as f64 * size;
                Some((attr("x"), attr("x") + width, attr("y")))
            })
            .filter(|(from, to, _)| to > from)
            .collect()
    };
    let waits = texts("wait", 4.8);
    let freezes = texts("freeze", 6.3);
    assert!(!waits.is_empty() && !freezes.is_empty());
    for (from, to, y) in &waits {
        for (a, b, fy) in &freezes {
            let apart = (y - fy).abs() > 6.0 || to <= a || from >= b;
            assert!(
                apart,
                "a wait's name at {from}..{to} runs into a freeze's at {a}..{b}"
            );
        }
    }
}

/// Recorded before jobs appended (no `append`, no items): a verdict of then still draws.
const CHALLENGE: &str = include_str!("fixtures/challenge.jsonl");

/// Lab 11: a challenge's clients hold the lock of their job's record (a bar from `acquired`
/// to `released`), their `working` is the write, the writes the findings name are drawn as
/// the wrong ones, and the verdict is PASS/FAIL with the checker's own finding lines over
/// the change log, the changes a finding names marked. The legend shows what is drawn.
#[test]
fn a_challenge_draws_its_clients_locks_writes_and_findings() {
    let recording = recording(CHALLENGE);
    let picture = picture::Picture::of(&recording);
    let lanes: Vec<&picture::Lane> = picture.parts.iter().flat_map(|p| &p.lanes).collect();
    let kinds = |kind: Kind| recording.events.iter().filter(|e| e.kind() == kind).count();
    let bars: usize = lanes.iter().map(|l| l.bars.len()).sum();
    assert_eq!(bars, kinds(Kind::Acquired), "a bar per grant");
    let locks: Vec<&str> = lanes
        .iter()
        .filter(|l| l.kind == picture::LaneKind::Lock)
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(locks, ["r0", "r1"]);
    let writes: Vec<&picture::Mark> = lanes
        .iter()
        .flat_map(|l| &l.marks)
        .filter(|m| m.shape == picture::Shape::Write)
        .collect();
    assert_eq!(writes.len(), kinds(Kind::Working), "a write per working");
    let wrong: Vec<&str> = writes
        .iter()
        .filter(|m| m.tone == picture::Tone::Bad)
        .filter_map(|m| m.label.as_deref())
        .collect();
    assert_eq!(
        wrong,
        [
            "write job 2: see the findings",
            "write job 5: see the findings"
        ]
    );
    let html = picture::html(&recording);
    let verdict = between(&html, "<section class=\"verdict\">", "</section>");
    assert!(
        verdict.contains("<pre class=\"findings\">challenge pause: the client did not pass — 2 stale writes\n  - stale write: job 2 set r0 to 3 over 8 (change #3)"),
        "{verdict}"
    );
    assert!(verdict.contains("  - stale write: job 5 set r0 to 11 over 78 (change #24)"));
    // The header says the grade and the findings in words, not the verdict's fields; the
    // lab's pauses are labelled by their kind and client.
    let drawing = between(&html, "<svg ", "Verdict</text>");
    assert!(drawing.contains("challenge pause, seed 1: the client did not pass — 2 stale writes"));
    assert!(!drawing.contains("grade fail") && !drawing.contains("faults planned"));
    assert!(
        drawing.contains(">pause c"),
        "no pause labelled by its client"
    );
    let named: Vec<&str> = verdict
        .split("<tr class=\"named\"><td>")
        .skip(1)
        .map(|row| &row[..row.find('<').unwrap()])
        .collect();
    assert_eq!(named, ["#3", "#24"]);
    let svg = picture::svg(&recording);
    let legend = between(&svg, "class=\"legend\"", "</g>\n");
    for shown in [
        "granted",
        "released",
        "write",
        "write a finding names",
        "frozen (SIGSTOP)",
    ] {
        assert!(
            legend.contains(&format!(">{shown}<")),
            "{shown} missing: {legend}"
        );
    }
    for unseen in ["killed", "expired", "stale write refused", "bytes held"] {
        assert!(
            !legend.contains(unseen),
            "{unseen} in the legend of a pause challenge"
        );
    }
}

/// Lab 11's `delay`: the proxy holding a client's bytes (`net_fault` to `net_healed` on
/// its path `c1→postgres`) is a band on that client's lane, not two dots on the lab's.
#[test]
fn a_challenges_held_write_is_a_band_on_its_clients_lane() {
    let fault = r#"{"t_ms":2740,"worker":"lab","text":"holds c1's next bytes to Postgres 900ms (proxy)","kind":"net_fault","fault":"delay","target":"c1→postgres","phase":"start","direction":"up"}"#;
    let heal = r#"{"t_ms":3640,"worker":"lab","text":"c1's bytes go on","kind":"net_healed","fault":"heal","target":"c1→postgres","phase":"end","direction":"up","lasted_ms":900}"#;
    let mut lines: Vec<&str> = CHALLENGE.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("\"t_ms\":2745"))
        .unwrap();
    lines.insert(at, fault);
    let at = lines
        .iter()
        .position(|l| l.contains("\"t_ms\":3655") || l.contains("\"t_ms\":37"))
        .unwrap();
    lines.insert(at, heal);
    let recording = recording(&lines.join("\n"));
    let picture = picture::Picture::of(&recording);
    let lanes: Vec<&picture::Lane> = picture.parts.iter().flat_map(|p| &p.lanes).collect();
    let c1 = lanes.iter().find(|l| l.name == "c1").unwrap();
    assert_eq!(
        c1.held.iter().map(|s| (s.from, s.to)).collect::<Vec<_>>(),
        [(2740, 3640)]
    );
    assert!(c1.marks.iter().any(|m| m.kind == "net_fault"));
    assert!(c1.marks.iter().any(|m| m.kind == "net_healed"));
    let lab = lanes.iter().find(|l| l.name == "lab").unwrap();
    assert!(lab.marks.iter().all(|m| !m.kind.starts_with("net_")));
    let svg = picture::svg(&recording);
    assert!(svg.contains("bytes delayed 0.900s"));
    assert!(between(&svg, "class=\"legend\"", "</g>\n").contains("proxy fault on a path"));
}

/// Lab 2 recorded once its read-backs were observations (`redis_read`): the picture draws a
/// failure exactly at the answers the checker's invalid findings point at, and decides none
/// itself — without the checker's proof the same answers are not failures.
#[test]
fn lab_2s_failures_are_where_the_checkers_findings_point() {
    let text = include_str!("fixtures/naive-redis-read.jsonl");
    let mut recording = Recording::from_jsonl(text).expect("the fixture parses");
    let violations = |recording: &Recording| {
        let svg = picture::svg(recording);
        labels(&svg)
            .iter()
            .filter(|(_, _, _, text)| text == "violation")
            .count()
    };
    assert_eq!(
        violations(&recording),
        0,
        "no Report given, no failure drawn"
    );
    recording.report =
        lockslab::reproduce::report_for(&recording.events, recording.verdict.as_ref());
    let report = lockslab::labs::check("naive", &recording.events).unwrap();
    let invalid = report
        .with(lockslab::check::report::Outcome::Invalid)
        .count();
    assert!(invalid > 0, "the broken variants break");
    assert_eq!(violations(&recording), invalid);
    // `lockslab render` hands the picture the same Report.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run.svg");
    let input = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/naive-redis-read.jsonl"
    );
    let status = render_bounded(std::path::Path::new(input), &out);
    assert!(status.status.success(), "{status:?}");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        picture::svg(&recording)
    );
}

/// A challenge its grader judges again (recorded with today's items): a write is drawn as
/// a wrong one exactly where the run's Report has an invalid finding at its job's events —
/// the jobs the grader's recorded problems name.
#[test]
fn a_challenges_wrong_writes_are_the_jobs_its_report_points_at() {
    let recording = recording(include_str!("fixtures/challenge-items.jsonl"));
    assert!(recording.report.is_some(), "the grader judges it again");
    let verdict = recording.verdict.as_ref().unwrap();
    let named: HashSet<i64> = verdict["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["job"].as_i64())
        .collect();
    let picture = picture::Picture::of(&recording);
    let mut writes = 0;
    for mark in picture
        .parts
        .iter()
        .flat_map(|p| &p.lanes)
        .flat_map(|l| &l.marks)
        .filter(|m| m.shape == picture::Shape::Write)
    {
        let label = mark.label.as_deref().unwrap_or("");
        let job: i64 = label
            .strip_prefix("write job ")
            .and_then(|rest| rest.split(':').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a write names its job: {label}"));
        let wrong = mark.tone == picture::Tone::Bad;
        assert_eq!(wrong, named.contains(&job), "{label}");
        writes += 1;
    }
    assert!(writes > 0 && !named.is_empty());
}
