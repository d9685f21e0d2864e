//! The typed history against what the labs really printed: every event line of every
//! recorded run reads into [`Event`] and writes back as the same JSON (no fact dropped, none
//! invented), the JSON Schema shipped in docs/ is the one the types generate, and every
//! kind is documented. No servers: these run in milliseconds.

use std::fs;
use std::path::Path;

use lockslab::events::{Event, Kind, What, json_schema};
use serde_json::Value;

fn fixtures() -> Vec<(String, Vec<Value>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut runs: Vec<(String, Vec<Value>)> = fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "jsonl"))
        .map(|path| {
            let lines = fs::read_to_string(&path)
                .unwrap()
                .lines()
                .map(|line| serde_json::from_str(line).unwrap())
                // The verdict, and chaos's line per history, are not events.
                .filter(|line: &Value| {
                    !matches!(line["kind"].as_str(), Some("verdict" | "schedule"))
                })
                .collect();
            (path.file_name().unwrap().to_string_lossy().into(), lines)
        })
        .collect();
    runs.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(runs.len() >= 8, "the recorded runs are missing");
    runs
}

/// Numbers compared by value (a recorded `3` and a typed `3.0` are the same fact), and a
/// fact recorded as `null` the same as an absent one: version 2 wrote `"token": null` where
/// version 3 leaves the fact out.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            let present = |map: &serde_json::Map<String, Value>| {
                map.iter().filter(|(_, value)| !value.is_null()).count()
            };
            present(x) == present(y)
                && x.iter()
                    .filter(|(_, value)| !value.is_null())
                    .all(|(key, value)| y.get(key).is_some_and(|other| same(value, other)))
        }
        _ => a == b,
    }
}

/// Kinds that were conclusions, and the observation each now reads as: an older line of
/// one of them writes back as the observation, every fact unchanged.
const MIGRATED: &[(&str, &str)] = &[
    ("counted", "redis_read"),
    ("lapsed", "redis_read"),
    ("kill_result", "job_read"),
    ("freeze_result", "job_read"),
    ("job_lost", "job_read"),
    ("violation", "tables_read"),
    ("exactly_once", "tables_read"),
    ("kept", "wait_answered"),
];

/// The facts every event keeps whatever its kind: an older recording's conclusion with no
/// observation in it ([`lockslab::events::OLD_CONCLUSIONS`]) keeps these as an `output`
/// line, and drops the rest.
const KEPT_OF_A_CONCLUSION: &[&str] = &[
    "t_ms",
    "worker",
    "text",
    "scenario",
    "variant",
    "fencing",
    "store_rule",
    "token_source",
    "approach",
    "workers",
    "mode",
    "part",
];

#[test]
fn every_recorded_event_reads_into_the_typed_history_and_writes_back_unchanged() {
    let mut read = 0;
    for (file, lines) in fixtures() {
        for mut line in lines {
            let event: Event = lockslab::events::read_line(line.clone())
                .unwrap_or_else(|err| panic!("{file}: {err}: {line}"));
            if let Some((_, now)) = MIGRATED.iter().find(|(old, _)| line["kind"] == *old) {
                line["kind"] = Value::from(*now);
            }
            let old_kind = line["kind"].as_str().unwrap_or("");
            if lockslab::events::OLD_CONCLUSIONS.contains(&old_kind)
                && let Value::Object(facts) = &mut line
            {
                facts.retain(|key, _| KEPT_OF_A_CONCLUSION.contains(&key.as_str()));
                facts.insert("kind".into(), "output".into());
            }
            let back = serde_json::to_value(&event).unwrap();
            assert!(
                same(&line, &back),
                "{file}: a fact changed on the way through the types\n was: {line}\n now: {back}"
            );
            read += 1;
        }
    }
    assert!(read > 300, "only {read} events in the recorded runs");
}

#[test]
fn an_unknown_fact_or_kind_does_not_pass_silently() {
    let kind: Result<Event, _> =
        serde_json::from_str(r#"{"t_ms":1,"worker":"A","text":"","kind":"teleported"}"#);
    assert!(kind.is_err(), "an unknown kind must not read as an event");
    let fact = r#"{"t_ms":1,"worker":"A","text":"","kind":"acquired","tokn":5}"#;
    let event: Event = serde_json::from_str(fact).unwrap();
    let back = serde_json::to_value(&event).unwrap();
    assert!(
        !same(&serde_json::from_str(fact).unwrap(), &back),
        "a misspelt fact is dropped, and the round trip above would catch it"
    );
}

#[test]
fn the_facts_are_typed_fields_a_reader_matches_on() {
    let line = r#"{"t_ms":7,"worker":"A","text":"took it","kind":"acquired","token":34,"owner":"A-1","backend":"redis","fencing":true}"#;
    let event: Event = serde_json::from_str(line).unwrap();
    assert_eq!(event.kind(), Kind::Acquired);
    let What::Acquired(got) = &event.what else {
        panic!("not an acquisition: {event:?}")
    };
    assert_eq!((got.token, got.owner.as_deref()), (Some(34), Some("A-1")));
    assert_eq!(event.part.fencing, Some(true));
}

#[test]
fn the_shipped_json_schema_is_the_one_the_types_generate() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/json.schema.json");
    let shipped = fs::read_to_string(&path).unwrap_or_default();
    let generated = json_schema() + "\n";
    if shipped != generated {
        fs::write(&path, &generated).unwrap();
        panic!(
            "docs/json.schema.json was out of date with src/events/: rewritten from \
             `lockslab schema`; commit it"
        );
    }
    let schema: Value = serde_json::from_str(&generated).unwrap();
    let kinds = schema.to_string();
    for word in ["\"acquired\"", "\"read_back\"", "\"frozen\""] {
        assert!(kinds.contains(word), "the schema has no {word}");
    }
}

#[test]
fn every_kind_is_named_in_the_json_docs() {
    let docs =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/json.md")).unwrap();
    let schema: Value = serde_json::from_str(&json_schema()).unwrap();
    let mut missing = Vec::new();
    for variant in schema["oneOf"].as_array().unwrap() {
        let word = variant["properties"]["kind"]["const"]
            .as_str()
            .or_else(|| variant["properties"]["kind"]["enum"][0].as_str())
            .unwrap_or_else(|| panic!("a variant without its kind: {variant}"));
        if !docs.contains(&format!("`{word}`")) {
            missing.push(word.to_string());
        }
    }
    assert!(missing.is_empty(), "docs/json.md never names {missing:?}");
}

/// Lab 2's read-back was once written as the conclusion drawn from it (`counted`, `lapsed`);
/// it is now the observation (`redis_read`), and an older recording's lines read as that,
/// their facts unchanged — so the checker still finds its evidence in them.
#[test]
fn an_older_recordings_conclusion_reads_as_the_observation_it_summarised() {
    for old in ["counted", "lapsed"] {
        let line = format!(
            r#"{{"t_ms":5,"worker":"redis","text":"read","kind":"{old}","key_owner":"A-1","pttl_ms":-2}}"#
        );
        let event: Event = serde_json::from_str(&line).unwrap();
        assert_eq!(event.kind(), Kind::RedisRead, "{old}");
        let observed = event.observed().unwrap();
        assert_eq!(observed.key_owner.as_deref(), Some("A-1"));
        assert_eq!(observed.pttl_ms, Some(-2));
        // Written back, it is today's word.
        assert!(
            serde_json::to_string(&event)
                .unwrap()
                .contains(r#""kind":"redis_read""#)
        );
    }
}

/// The conclusions an older lockslab wrote into its histories: those that carried their
/// observation's figures read as that observation (`violation` and `exactly_once` as the
/// tables' counts, `job_lost` as the job's row, `kept` as the `WAIT`'s answer); those that
/// carried none (a stale write taken or refused, two holders) read as the line they printed,
/// so that no checker can take them for evidence. None of them is a kind today.
#[test]
fn an_older_recordings_conclusions_read_as_observations_or_plain_lines() {
    let read = |kind: &str, facts: &str| -> Event {
        let line = format!(
            r#"{{"t_ms":9,"worker":"w","text":"said","kind":"{kind}","fencing":true{facts}}}"#
        );
        lockslab::events::read_line(serde_json::from_str(&line).unwrap()).unwrap()
    };
    for (old, now) in [
        ("violation", Kind::TablesRead),
        ("exactly_once", Kind::TablesRead),
    ] {
        let event = read(old, r#","duplicates":2"#);
        assert_eq!(event.kind(), now, "{old}");
        assert_eq!(event.observed().unwrap().counted_wrong(), 2);
    }
    let row = read("job_lost", r#","job":61,"status":"running""#);
    assert!(matches!(&row.what, What::JobRead(f) if f.status.as_deref() == Some("running")));
    assert_eq!(
        read("kept", r#","replicas_confirmed":1"#).kind(),
        Kind::WaitAnswered
    );
    for old in lockslab::events::OLD_CONCLUSIONS {
        let event = read(old, r#","final_writer":"A""#);
        assert_eq!(event.kind(), Kind::Output, "{old}");
        assert_eq!((event.t_ms, event.text.as_str()), (9, "said"));
        assert_eq!(event.part.fencing, Some(true), "its part kept");
        // Today's reader of a typed line refuses the old word outright.
        let line = format!(r#"{{"t_ms":1,"worker":"w","text":"","kind":"{old}"}}"#);
        assert!(
            serde_json::from_str::<Event>(&line).is_err(),
            "{old} is a kind again"
        );
    }
}
