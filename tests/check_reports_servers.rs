//! The reports of the labs that break a lock by its server — lab 9 (lease guards), lab 5
//! (failover), lab 4 (etcd vs Redis) — read from their recorded fixtures: each finding
//! agrees with the verdict the lab printed live, and points at events that can prove it.
//!
//! These fixtures were recorded before the store's read-back was an event of the history.
//! Their history alone cannot say what the store decided, so each lab's report over it is
//! unknown, never a pass. `lockslab check` takes the read-back from the verdict instead;
//! the tests do the same, putting it back into the history as the event a newer run
//! records, and then judge.

use lockslab::check::report::{Finding, Outcome, Report};
use lockslab::events::facts::StoreRecord;
use lockslab::events::{Event, Kind};
use lockslab::reproduce::Recorded;
use lockslab::store::ReadBack;
use serde_json::Value;

fn recorded(name: &str) -> Recorded {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Recorded::from_jsonl(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The verdict's list `field` (its cells, runs…).
fn parts(recorded: &Recorded, field: &str) -> Vec<Value> {
    recorded.verdict.as_ref().unwrap()[field]
        .as_array()
        .unwrap()
        .clone()
}

/// The one finding called exactly `title`.
fn finding<'a>(report: &'a Report, title: &str) -> &'a Finding {
    let mut found = report.findings.iter().filter(|f| f.name == title);
    let first = found
        .next()
        .unwrap_or_else(|| panic!("no finding `{title}` in {:#?}", report.findings));
    assert!(found.next().is_none(), "two findings `{title}`");
    first
}

/// "broken?" as the verdict recorded it (null: it could not say), as an outcome.
fn outcome_of(broken: Option<bool>) -> Outcome {
    Outcome::broken_when(broken)
}

/// `finding` points at something, and only at events of `history` of the given kinds.
fn proves_with(history: &[Event], finding: &Finding, kinds: &[Kind]) {
    assert!(!finding.events.is_empty(), "{finding:?} points at nothing");
    for &at in &finding.events {
        let kind = history
            .get(at)
            .unwrap_or_else(|| panic!("{}: no event {at}", finding.name))
            .kind();
        assert!(
            kinds.contains(&kind),
            "{}: event {at} is a {kind:?}, which proves nothing here",
            finding.name
        );
    }
}

/// The mutual-exclusion finding `title` answers as the verdict did (`two_holders` of
/// `recorded`), and points only at `kinds`.
fn exclusion_agrees(
    history: &[Event],
    report: &Report,
    title: &str,
    recorded: &Value,
    kinds: &[Kind],
) {
    let exclusion = finding(report, title);
    assert_eq!(
        exclusion.outcome,
        outcome_of(recorded["two_holders"].as_bool()),
        "{exclusion:?}"
    );
    proves_with(history, exclusion, kinds);
}

/// The stale-write finding `title` says the store took the late write exactly when the
/// verdict did (`taken`), rests on the store's read-back, and points only at `kinds`.
fn stale_write_agrees(
    history: &[Event],
    report: &Report,
    title: &str,
    taken: bool,
    kinds: &[Kind],
) {
    let stale = finding(report, title);
    assert_eq!(stale.outcome, outcome_of(Some(taken)), "{stale:?}");
    // The store's decision order decides, never what a worker believed.
    assert!(
        stale
            .events
            .iter()
            .any(|&at| history[at].kind() == Kind::ReadBack),
        "{stale:?}"
    );
    proves_with(history, stale, kinds);
}

/// `events` with the store's read-back of each part put back in, as a run records it now:
/// one `read_back` event of the part's resource (`resource_of`) after the part's last event
/// (`belongs` says which events are the part's), tagged as that event is and carrying the
/// record the verdict kept in the part (its attempts and final writer).
fn with_read_backs(
    events: &[Event],
    parts: &[&Value],
    belongs: impl Fn(&Value, &Event) -> bool,
    resource_of: impl Fn(&Value) -> String,
) -> Vec<Event> {
    let mut history = events.to_vec();
    for &part in parts {
        let last = history
            .iter()
            .rposition(|e| belongs(part, e))
            .unwrap_or_else(|| panic!("no event of {part}"));
        let read: ReadBack = serde_json::from_value(part.clone()).unwrap();
        let record = StoreRecord::of(&resource_of(part), &read);
        let mut read_back = Event::new("store", record, "read back");
        read_back.part = history[last].part.clone();
        history.insert(last + 1, read_back);
    }
    history
}

mod lease_guard {
    use super::*;
    use lockslab::labs::lease_guard::check;

    fn in_cell(cell: &Value, event: &Event) -> bool {
        event.part.scenario.as_deref() == cell["fault"].as_str()
            && event.part.variant.as_deref() == cell["guard"].as_str()
    }

    fn title(name: &str, cell: &Value) -> String {
        format!(
            "{name} ({} × {})",
            cell["guard"].as_str().unwrap(),
            cell["fault"].as_str().unwrap()
        )
    }

    #[test]
    fn lease_guard_history_without_the_read_back_is_unknown_in_every_cell() {
        let recorded = recorded("lease-guard.jsonl");
        let cells = parts(&recorded, "cells");
        let report = check(&recorded.events);
        assert_eq!(report.outcome, Outcome::Unknown, "{report:#?}");
        for cell in &cells {
            let open = finding(&report, &title("evidence", cell));
            assert_eq!(open.outcome, Outcome::Unknown);
            assert!(open.words.contains("read-back"), "{open:?}");
        }
        assert_eq!(
            report.findings.len(),
            cells.len(),
            "nothing but the open cells"
        );
    }

    #[test]
    fn lease_guard_report_agrees_with_each_recorded_cell_and_points_at_its_proof() {
        let recorded = recorded("lease-guard.jsonl");
        let cells = parts(&recorded, "cells");
        let all: Vec<&Value> = cells.iter().collect();
        let history = with_read_backs(&recorded.events, &all, in_cell, |_| String::new());
        let report = check(&history);
        for cell in &cells {
            let taken = cell["outcome"] == "stale_accepted";
            stale_write_agrees(
                &history,
                &report,
                &title("stale write", cell),
                taken,
                &[Kind::ReadBack, Kind::Wrote, Kind::GuardDecided],
            );
            exclusion_agrees(
                &history,
                &report,
                &title("mutual exclusion", cell),
                cell,
                &[Kind::Released, Kind::Acquired, Kind::ReadBack],
            );
        }
        assert_eq!(report.findings.len(), 2 * cells.len());
        // Some guards let the stale write through, fencing never: the matrix is invalid.
        assert_eq!(report.outcome, Outcome::Invalid);
        assert!(
            report
                .with(Outcome::Valid)
                .any(|f| f.name.starts_with("stale write (fencing")),
            "fencing kept B's result somewhere"
        );
    }
}

mod failover {
    use super::*;
    use lockslab::labs::failover::check;

    /// The scenarios whose holders wrote: the ones the report judges.
    fn writing(scenarios: &[Value]) -> impl Iterator<Item = &Value> {
        scenarios
            .iter()
            .filter(|s| !s["attempts"].as_array().unwrap().is_empty())
    }

    fn title(name: &str, scenario: &Value) -> String {
        format!("{name} (scenario {})", scenario["name"].as_str().unwrap())
    }

    #[test]
    fn failover_history_without_the_read_back_is_unknown_in_every_scenario() {
        let recorded = recorded("failover.jsonl");
        let scenarios = parts(&recorded, "scenarios");
        let report = check(&recorded.events);
        assert_eq!(report.outcome, Outcome::Unknown, "{report:#?}");
        for scenario in writing(&scenarios) {
            let open = finding(&report, &title("evidence", scenario));
            assert!(open.words.contains("read-back"), "{open:?}");
        }
        assert_eq!(report.findings.len(), writing(&scenarios).count());
    }

    #[test]
    fn failover_report_agrees_with_each_recorded_scenario_and_points_at_its_proof() {
        let recorded = recorded("failover.jsonl");
        let scenarios = parts(&recorded, "scenarios");
        // Each scenario's read-back, after the last event: one event per resource.
        let writing_now: Vec<&Value> = writing(&scenarios).collect();
        let history = with_read_backs(
            &recorded.events,
            &writing_now,
            |_, _| true,
            |scenario| format!("failover-{}", scenario["name"].as_str().unwrap()),
        );
        let report = check(&history);
        for scenario in writing(&scenarios) {
            let taken = scenario["stale_write"]["accepted"] == Value::Bool(true);
            stale_write_agrees(
                &history,
                &report,
                &title("stale write", scenario),
                taken,
                &[Kind::ReadBack, Kind::Wrote, Kind::Lost],
            );
            let exclusion = finding(&report, &title("mutual exclusion", scenario));
            let recorded_two = outcome_of(scenario["two_holders"].as_bool());
            if exclusion.outcome == Outcome::Unknown {
                // Redis's answer rests on the PTTLs read live, which no event carries; never
                // a pass, and only where the store's order did not settle it.
                assert_eq!(scenario["backend"], "redis", "{exclusion:?}");
                assert_eq!(scenario["stale_write"]["attempted"], false, "{exclusion:?}");
                assert!(exclusion.events.len() == 2, "{exclusion:?}");
            } else {
                assert_eq!(exclusion.outcome, recorded_two, "{exclusion:?}");
            }
            proves_with(
                &history,
                exclusion,
                &[Kind::Acquired, Kind::Released, Kind::ReadBack],
            );
        }
        assert_eq!(report.findings.len(), 2 * writing(&scenarios).count());
        // Unfenced and Redis-INCR-fenced writes got through the failover: invalid.
        assert_eq!(report.outcome, Outcome::Invalid);
        let etcd = finding(&report, "mutual exclusion (scenario etcd-leader-killed)");
        assert_eq!(etcd.outcome, Outcome::Valid, "etcd kept A's lock: {etcd:?}");
    }
}

mod etcd_vs_redis {
    use super::*;
    use lockslab::labs::etcd_vs_redis::check;

    fn title(name: &str, cell: &Value) -> String {
        format!(
            "{name} ({} × {})",
            cell["backend"].as_str().unwrap(),
            cell["scenario"].as_str().unwrap()
        )
    }

    fn in_scenario(cell: &Value, event: &Event) -> bool {
        event.part.scenario.as_deref() == cell["scenario"].as_str()
    }

    #[test]
    fn etcd_vs_redis_history_without_the_read_back_is_unknown_in_every_cell() {
        let recorded = recorded("etcd-vs-redis.jsonl");
        let cells = parts(&recorded, "cells");
        let report = check(&recorded.events);
        assert_eq!(report.outcome, Outcome::Unknown, "{report:#?}");
        for cell in &cells {
            let open = finding(&report, &title("evidence", cell));
            assert!(open.words.contains("read-back"), "{open:?}");
        }
        assert_eq!(report.findings.len(), cells.len());
    }

    #[test]
    fn etcd_vs_redis_report_agrees_with_each_recorded_cell_and_points_at_its_proof() {
        let recorded = recorded("etcd-vs-redis.jsonl");
        let cells = parts(&recorded, "cells");
        let all: Vec<&Value> = cells.iter().collect();
        let history = with_read_backs(&recorded.events, &all, in_scenario, |cell| {
            format!(
                "etcd-vs-redis-{}-{}",
                cell["scenario"].as_str().unwrap(),
                cell["backend"].as_str().unwrap()
            )
        });
        let report = check(&history);
        for cell in &cells {
            let taken = cell["stale_write_accepted"] == Value::Bool(true);
            stale_write_agrees(
                &history,
                &report,
                &title("stale write", cell),
                taken,
                &[Kind::ReadBack, Kind::Wrote],
            );
            exclusion_agrees(
                &history,
                &report,
                &title("mutual exclusion", cell),
                cell,
                &[
                    Kind::Acquired,
                    Kind::Released,
                    Kind::Killed,
                    Kind::Frozen,
                    Kind::HolderNow,
                    Kind::ReadBack,
                ],
            );
        }
        assert_eq!(report.findings.len(), 2 * cells.len());
        // The frozen Redis holder's write got through: the matrix is invalid.
        assert_eq!(report.outcome, Outcome::Invalid);
    }
}
