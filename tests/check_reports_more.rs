//! Each lab's `check(&History) -> Report` run over its recorded fixture: the report agrees
//! with the verdict the run recorded, part by part, and every finding points at events
//! that exist and are of a kind that can prove it. (Labs 8, 6 and 10; the first four labs'
//! reports are tested in `check.rs`.)

use std::path::Path;

use lockslab::check::report::{Finding, Outcome, Report};
use lockslab::events::facts::StoreRecord;
use lockslab::events::{Event, Kind};
use lockslab::reproduce::Recorded;
use lockslab::store::ReadBack;
use serde_json::Value;

/// The fixture `name` as recorded.
fn recorded(name: &str) -> Recorded {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    Recorded::from_jsonl(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The finding called exactly `title`.
fn finding<'a>(report: &'a Report, title: &str) -> &'a Finding {
    report
        .findings
        .iter()
        .find(|f| f.name == title)
        .unwrap_or_else(|| panic!("no finding `{title}` in {report:#?}"))
}

/// The finding points at something, and each event it points at is in `events` and of one
/// of `kinds`: the kinds of event that can prove a finding of its name.
fn proved_by(events: &[Event], finding: &Finding, kinds: &[Kind]) {
    assert!(!finding.events.is_empty(), "{finding:?} points at nothing");
    for &at in &finding.events {
        let Some(event) = events.get(at) else {
            panic!("{}: there is no event {at}", finding.name)
        };
        assert!(
            kinds.contains(&event.kind()),
            "{}: event {at} is a {:?}, which cannot prove it",
            finding.name,
            event.kind()
        );
    }
}

/// A yes/no the verdict recorded about something broken, as an outcome.
fn broken(recorded: Option<bool>) -> Outcome {
    match recorded {
        Some(true) => Outcome::Invalid,
        Some(false) => Outcome::Valid,
        None => Outcome::Unknown,
    }
}

/// The history with the store's read-back of each part added after the part's last event,
/// tagged as the part: what a recording made before the read-back was an event lacks, taken
/// from the verdict as `lockslab check` takes it. `parts` gives each recorded part and says
/// which events belong to it.
fn with_read_backs<'a>(
    events: &[Event],
    parts: impl IntoIterator<Item = (&'a Value, Box<dyn Fn(&Event) -> bool + 'a>)>,
) -> Vec<Event> {
    let mut after: Vec<(usize, Event)> = Vec::new();
    for (record, belongs) in parts {
        let last = events.iter().rposition(belongs).unwrap();
        let read: ReadBack = serde_json::from_value(record.clone()).unwrap();
        let mut event = Event::new("store", StoreRecord::of("", &read), "read back");
        event.part = events[last].part.clone();
        after.push((last, event));
    }
    let mut history = Vec::new();
    for (at, event) in events.iter().enumerate() {
        history.push(event.clone());
        history.extend(
            after
                .iter()
                .filter(|(l, _)| *l == at)
                .map(|(_, e)| e.clone()),
        );
    }
    history
}

mod network {
    use super::*;
    use lockslab::labs::network::check;

    fn title(name: &str, run: &Value) -> String {
        format!(
            "{name} ({}, fencing={})",
            run["scenario"].as_str().unwrap(),
            run["fencing"]
        )
    }

    fn runs(recorded: &Recorded) -> Vec<Value> {
        recorded.verdict.as_ref().unwrap()["runs"]
            .as_array()
            .unwrap()
            .clone()
    }

    #[test]
    fn network_report_agrees_with_each_recorded_run_and_points_at_its_proof() {
        let recorded = recorded("network.jsonl");
        let runs = runs(&recorded);
        let history = with_read_backs(
            &recorded.events,
            runs.iter().map(|run| {
                let scenario = run["scenario"].as_str().unwrap().to_string();
                let fenced = run["fencing"].as_bool();
                let belongs: Box<dyn Fn(&Event) -> bool> = Box::new(move |e: &Event| {
                    e.part.scenario.as_deref() == Some(&*scenario) && e.part.fencing == fenced
                });
                (run, belongs)
            }),
        );
        let report = check(&history);
        for run in &runs {
            let exclusion = finding(&report, &title("mutual exclusion", run));
            assert_eq!(exclusion.outcome, broken(run["two_holders"].as_bool()));
            proved_by(
                &history,
                exclusion,
                &[Kind::Released, Kind::Acquired, Kind::ReadBack],
            );
            let stale = finding(&report, &title("stale write", run));
            assert_eq!(stale.outcome, broken(Some(run["late_write"] == "accepted")));
            proved_by(&history, stale, &[Kind::Wrote, Kind::ReadBack]);
            assert!(
                stale
                    .events
                    .iter()
                    .any(|&at| history[at].kind() == Kind::ReadBack),
                "the store's decision order proves {stale:?}"
            );
            if run["scenario"] == "cut-off-stops" {
                let stopped = finding(&report, &title("next write stopped", run));
                let went_on = run["a_next_write_stopped"]
                    .as_bool()
                    .map(|stopped| !stopped);
                assert_eq!(stopped.outcome, broken(went_on));
                proved_by(&history, stopped, &[Kind::Checked, Kind::ReadBack]);
            }
        }
        // Without fencing the stale write lands; with it, the store refuses it.
        assert_eq!(report.outcome, Outcome::Invalid);
        assert!(report.with(Outcome::Valid).count() >= runs.len() / 2);
        assert_eq!(finding(&report, "lost replies").outcome, Outcome::Unknown);
    }

    #[test]
    fn a_network_history_without_the_store_read_back_is_unknown_never_a_pass() {
        // Recorded before the read-back was an event: the history alone cannot say what
        // the store decided.
        let recorded = recorded("network.jsonl");
        let report = check(&recorded.events);
        assert_eq!(report.outcome, Outcome::Unknown, "{report:#?}");
        let runs = runs(&recorded);
        for run in &runs {
            let open = finding(&report, &title("evidence", run));
            assert!(open.words.contains("read-back"), "{open:?}");
        }
        assert_eq!(report.with(Outcome::Valid).count(), 0);
    }
}

mod redlock {
    use super::*;
    use lockslab::labs::redlock::check;

    #[test]
    fn redlock_report_agrees_with_each_recorded_scenario_and_points_at_the_masters_answers() {
        let recorded = recorded("redlock.jsonl");
        let report = check(&recorded.events);
        let events = &recorded.events;
        let scenarios = recorded.verdict.as_ref().unwrap()["scenarios"]
            .as_array()
            .unwrap()
            .clone();
        let mut judged = 0;
        for scenario in &scenarios {
            let name = scenario["name"].as_str().unwrap();
            match name {
                "restart-empty" | "restart-delayed" | "clock-jump" | "client-pause" => {
                    let exclusion = finding(&report, &format!("mutual exclusion ({name})"));
                    assert_eq!(exclusion.outcome, broken(scenario["two_holders"].as_bool()));
                    // The clients' rounds as the masters answered them, and the masters.
                    let kinds = [Kind::Acquired, Kind::GaveUp, Kind::HolderNow];
                    proved_by(events, exclusion, &kinds);
                    judged += 1;
                }
                "majority-down" => {
                    let released = finding(&report, "released everywhere (majority-down)");
                    let left = !scenario["set_once_thawed"].as_array().unwrap().is_empty();
                    assert_eq!(released.outcome, broken(Some(left)), "{released:?}");
                    proved_by(events, released, &[Kind::HolderNow]);
                    judged += 1;
                }
                _ => {}
            }
        }
        assert_eq!(judged, 5, "every scenario the masters' answers decide");
        // The store's read-back is not in the history: never a pass.
        let stale = finding(&report, "stale write (client-pause)");
        assert_eq!(stale.outcome, Outcome::Unknown);
        assert_eq!(
            report.outcome,
            Outcome::Invalid,
            "a restart without delay breaks it"
        );
    }
}

/// Lab 6's partition scenario with the split landing in the middle of A's round
/// (`redlock partition --json`, tests/fixtures/redlock-partition-mid-round.jsonl): the
/// report judges each mid-round part from its rounds and the masters' read-back, and a
/// read-back edited to show A's value still on m1 after its failed round turns the
/// finding, and the replayed verdict, against the run.
mod redlock_mid_round {
    use super::*;
    use lockslab::events::What;
    use lockslab::labs::redlock::{check, replay};

    const FIXTURE: &str = "redlock-partition-mid-round.jsonl";
    const BEFORE: &str = "partition-split-before-quorum";

    #[test]
    fn a_split_in_the_middle_of_a_round_is_judged_from_the_masters_answers() {
        let recorded = recorded(FIXTURE);
        let events = &recorded.events;
        let report = check(events);
        for part in [BEFORE, "partition-split-after-quorum"] {
            let exclusion = finding(&report, &format!("mutual exclusion ({part})"));
            assert_eq!(exclusion.outcome, Outcome::Valid, "{exclusion:?}");
            proved_by(
                events,
                exclusion,
                &[Kind::Acquired, Kind::GaveUp, Kind::HolderNow],
            );
            let released = finding(&report, &format!("failed round released ({part})"));
            assert_eq!(released.outcome, Outcome::Valid, "{released:?}");
            proved_by(events, released, &[Kind::GaveUp, Kind::HolderNow]);
        }
        let verdict = recorded.verdict.as_ref().unwrap();
        let replayed = replay(events, verdict).unwrap();
        let before = replayed.parts.iter().find(|p| p.name == BEFORE).unwrap();
        assert_eq!(before.replayed["left_after_release"], serde_json::json!([]));

        // The same history, with m1 answering A's value in the read-back.
        let mut edited = events.clone();
        let read = (edited.iter_mut())
            .find(|e| e.part.scenario.as_deref() == Some(BEFORE) && e.kind() == Kind::HolderNow)
            .unwrap();
        let What::HolderNow(holder) = &mut read.what else {
            unreachable!()
        };
        holder.masters.as_mut().unwrap()[0].holder = Some("A".into());
        let report = check(&edited);
        let released = finding(&report, &format!("failed round released ({BEFORE})"));
        assert_eq!(released.outcome, Outcome::Invalid, "{released:?}");
        assert!(released.words.contains("m1"), "{released:?}");
        let replayed = replay(&edited, verdict).unwrap();
        let before = replayed.parts.iter().find(|p| p.name == BEFORE).unwrap();
        assert_eq!(
            before.replayed["left_after_release"],
            serde_json::json!(["m1"])
        );
    }
}

/// Lab 10 (`queue`): every way of queueing, the churn, the expiry and the election.
mod queue {
    use super::*;
    use lockslab::events::What;
    use lockslab::labs::queue::check;

    /// `lockslab queue --json` with the defaults, recorded once the store's read-back was an
    /// event of the history.
    const FIXTURE: &str = "queue-read-back.jsonl";

    #[test]
    fn queue_report_agrees_with_each_recorded_part_and_points_at_its_proof() {
        let recorded = recorded(FIXTURE);
        let verdict = recorded.verdict.as_ref().unwrap();
        let events = &recorded.events;
        let report = check(events);
        for queue in verdict["queues"].as_array().unwrap() {
            let way = queue["way"].as_str().unwrap();
            let fair = finding(&report, &format!("first come, first served (queue {way})"));
            assert_eq!(fair.outcome, broken(queue["fair"].as_bool().map(|f| !f)));
            proved_by(events, fair, &[Kind::Handovers]);
            let tokens = finding(&report, &format!("tokens grow (queue {way})"));
            assert_eq!(
                tokens.outcome,
                broken(queue["tokens_grow"].as_bool().map(|t| !t))
            );
        }
        let churn = &verdict["churn"];
        for (name, field) in [
            ("one holder at a time", "one_holder_at_a_time"),
            ("nobody held twice", "nobody_held_twice"),
            ("nobody skipped", "nobody_skipped"),
            ("store in order", "store_in_order"),
            ("gaps rechecked", "gaps_rechecked"),
        ] {
            let found = finding(&report, &format!("{name} (churn)"));
            assert_eq!(found.outcome, broken(churn[field].as_bool().map(|h| !h)));
        }
        proved_by(
            events,
            finding(&report, "one holder at a time (churn)"),
            &[Kind::Acquired, Kind::QueueKeys],
        );
        proved_by(
            events,
            finding(&report, "store in order (churn)"),
            &[Kind::Acquired, Kind::ReadBack],
        );
        let expiry = &verdict["expiry"];
        let frozen = finding(&report, "frozen waiter (expiry)");
        assert_eq!(
            frozen.outcome == Outcome::Valid,
            expiry["frozen_waiter"] == "learned_it_was_gone"
        );
        proved_by(events, frozen, &[Kind::Lost, Kind::Acquired]);
        let gap = finding(&report, "gap skipped (expiry)");
        assert_eq!(
            gap.outcome,
            broken(expiry["skipped_the_gap"].as_bool().map(|s| !s))
        );
        proved_by(events, gap, &[Kind::Woke, Kind::Acquired]);
        let election = &verdict["election"];
        assert_eq!(
            finding(&report, "one leader at a time (election)").outcome,
            broken(election["one_leader_at_a_time"].as_bool().map(|o| !o))
        );
        for (part, recorded) in [("expiry", expiry), ("election", election)] {
            let stale = finding(&report, &format!("stale write ({part})"));
            let taken = recorded["late_write"] == "accepted";
            assert_eq!(stale.outcome, broken(Some(taken)), "{stale:?}");
            proved_by(events, stale, &[Kind::ReadBack, Kind::Wrote]);
            // The store's decision order is the proof.
            assert!(
                stale
                    .events
                    .iter()
                    .any(|&at| events[at].kind() == Kind::ReadBack)
            );
        }
        // The spinning waiters on Redis are served out of order: the lab as a whole breaks
        // first come, first served, and nothing else.
        assert_eq!(report.outcome, Outcome::Invalid);
        assert!(
            report
                .with(Outcome::Invalid)
                .all(|f| f.name.starts_with("first come, first served")),
            "{report:#?}"
        );
    }

    #[test]
    fn a_late_write_the_store_took_or_a_token_handed_out_twice_is_invalid() {
        let recorded = recorded(FIXTURE);
        let mut events = recorded.events.clone();
        // The expiry's read-back says the store took H's late write after W2's.
        let expiry_read = events
            .iter()
            .position(|e| {
                e.kind() == Kind::ReadBack && e.part.scenario.as_deref() == Some("expiry")
            })
            .unwrap();
        let What::ReadBack(record) = &mut events[expiry_read].what else {
            unreachable!()
        };
        let late = record
            .attempts
            .iter_mut()
            .find(|a| a.writer == "H")
            .unwrap();
        late.accepted = true;
        // The recipe's last waiter served with the token of the one before it.
        let recipe = events
            .iter()
            .position(|e| matches!(&e.what, What::Handovers(h) if h.way == "etcd_recipe"))
            .unwrap();
        let What::Handovers(queue) = &mut events[recipe].what else {
            unreachable!()
        };
        let mut tokens: Vec<i64> = queue.turns.iter().filter_map(|t| t.token).collect();
        tokens.sort_unstable();
        let last = queue.turns.iter_mut().max_by_key(|t| t.token).unwrap();
        last.token = Some(tokens[tokens.len() - 2]);
        let report = check(&events);
        let stale = finding(&report, "stale write (expiry)");
        assert_eq!(stale.outcome, Outcome::Invalid, "{stale:?}");
        assert!(stale.events.contains(&expiry_read));
        let tokens = finding(&report, "tokens grow (queue etcd_recipe)");
        assert_eq!(tokens.outcome, Outcome::Invalid);
        assert_eq!(tokens.events, [recipe]);
        assert_eq!(
            finding(&report, "stale write (election)").outcome,
            Outcome::Valid,
            "the other parts are judged on their own evidence"
        );
    }

    #[test]
    fn a_queue_history_without_the_store_read_back_is_unknown_never_a_pass() {
        // Recorded before the read-back was an event: the ways are judged from their
        // turns, the parts the store decides are left open.
        let recorded = recorded("queue.jsonl");
        let report = check(&recorded.events);
        for part in ["churn", "expiry", "election"] {
            let open = finding(&report, &format!("evidence ({part})"));
            assert_eq!(open.outcome, Outcome::Unknown);
            assert!(open.words.contains("read-back"), "{open:?}");
        }
        assert_eq!(
            report
                .findings
                .iter()
                .filter(|f| f.name.starts_with("tokens grow"))
                .count(),
            3
        );
    }
}
