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
];

#[test]
fn every_recorded_event_reads_into_the_typed_history_and_writes_back_unchanged() {
    let mut read = 0;
    for (file, lines) in fixtures() {
        for mut line in lines {
            let event: Event = serde_json::from_value(line.clone())
                .unwrap_or_else(|err| panic!("{file}: {err}: {line}"));
            if let Some((_, now)) = MIGRATED.iter().find(|(old, _)| line["kind"] == *old) {
                line["kind"] = Value::from(*now);
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
    for word in ["\"acquired\"", "\"stale_write_accepted\"", "\"frozen\""] {
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
