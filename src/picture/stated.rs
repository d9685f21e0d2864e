//! What a run's checkers stated, read back from the verdict the run recorded — for a reader
//! that retells a run (the picture) and must not judge it a second time.
//!
//! A verdict is a tree of parts (`runs`, `cells`, `scenarios`, a hunt's `violations`…), each
//! with the facts its lab's checkers settled: `two_holders`, `late_write` (or `stale_write`),
//! the store's `attempts` and `final_writer`. This finds the parts that speak of one part of
//! the history — by the tags every event of it carries and by the workers involved — and
//! says what they settled, or [`Finding::Unknown`] when none of them settles it, or when
//! they disagree. It applies no rule of its own to the events: a fact the verdict does not
//! state stays unknown here.

use serde_json::{Map, Value};

use crate::check::Finding;
use crate::events::facts::Part;
use crate::events::{Event, What};

/// The verdict fields a part tag may go by: lab 9's cells call the scenario `fault` and
/// the variant `guard`, lab 5 and 6 name their scenarios `name`.
const TAG_FIELDS: [(&str, &[&str]); 8] = [
    ("scenario", &["scenario", "fault", "name"]),
    ("variant", &["variant", "guard"]),
    ("fencing", &["fencing"]),
    ("store_rule", &["store_rule"]),
    ("token_source", &["token_source"]),
    ("approach", &["approach", "name"]),
    ("mode", &["mode"]),
    ("workers", &["workers"]),
];

/// One object of the verdict with the objects around it, innermost first: a fact it does
/// not carry itself is looked up outwards (a guarded write's scenario is its parent's).
#[derive(Clone, Debug)]
struct Item<'a> {
    chain: Vec<&'a Map<String, Value>>,
}

impl<'a> Item<'a> {
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.chain.iter().find_map(|object| object.get(key))
    }

    fn own(&self, key: &str) -> Option<&'a Value> {
        self.chain.first().and_then(|object| object.get(key))
    }

    /// The writers of the store's attempts the item carries, in decision order.
    fn attempts(&self) -> Vec<(&'a str, bool, i64)> {
        let mut attempts: Vec<(&str, bool, i64)> = self
            .get("attempts")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| {
                Some((
                    a.get("writer")?.as_str()?,
                    a.get("accepted")?.as_bool()?,
                    a.get("decided").and_then(Value::as_i64).unwrap_or(0),
                ))
            })
            .collect();
        attempts.sort_by_key(|(_, _, decided)| *decided);
        attempts
    }

    /// Whether two holders at once was settled here: a lab's `two_holders` (null: its
    /// checkers could not tell), or a hunt's violation of kind `two-holders`.
    fn two_holders(&self) -> Option<Finding> {
        if self.own("kind").and_then(Value::as_str) == Some("two-holders") {
            return Some(Finding::Yes);
        }
        match self.own("two_holders")? {
            Value::Bool(true) => Some(Finding::Yes),
            Value::Bool(false) => Some(Finding::No),
            _ => Some(Finding::Unknown),
        }
    }

    /// Whether the store decided a late write after the next holder's, and took it: a
    /// lab's `late_write`, `stale_write` or `stale_write_attempted`, or a guarded write's
    /// `attempted` (lab 6). None where the item says nothing of it or says there was none.
    fn late_write_accepted(&self) -> Option<bool> {
        let accepted = |value: &Value| value.get("accepted").and_then(Value::as_bool);
        if let Some(late) = self.own("late_write").and_then(Value::as_str) {
            return match late {
                "accepted" => Some(true),
                "rejected" => Some(false),
                _ => None,
            };
        }
        if let Some(stale) = self.own("stale_write").filter(|s| s.is_object()) {
            return (stale.get("attempted") == Some(&Value::Bool(true)))
                .then(|| accepted(stale))
                .flatten();
        }
        if self.own("stale_write_attempted") == Some(&Value::Bool(true)) {
            return self.own("stale_write_accepted").and_then(Value::as_bool);
        }
        if self.own("attempted") == Some(&Value::Bool(true)) && self.own("resource").is_some() {
            return self.own("accepted").and_then(Value::as_bool);
        }
        None
    }

    /// The writer whose result the store kept: its `final_writer`, else the last accepted
    /// of its attempts.
    fn final_writer(&self) -> Option<&'a str> {
        self.get("final_writer")
            .and_then(Value::as_str)
            .or_else(|| {
                let attempts = self.attempts();
                attempts
                    .iter()
                    .rev()
                    .find(|(_, accepted, _)| *accepted)
                    .map(|(writer, _, _)| *writer)
            })
    }
}

/// A late write the checkers found: whose, to which resource (None: the part's only one),
/// and whether the store took it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LateWriteStated {
    pub writer: String,
    pub resource: Option<String>,
    pub accepted: bool,
}

/// What the checkers stated about one part of a run's history.
#[derive(Debug, Default)]
pub struct Stated<'a> {
    items: Vec<Item<'a>>,
    /// The part's history holds a lab's own "two holders" conclusion (lab 6's masters).
    concluded_two_holders: bool,
}

impl<'a> Stated<'a> {
    /// The verdict's items about the part whose events are `part` (all carry its tags).
    pub fn of(verdict: Option<&'a Value>, part: &[&Event]) -> Stated<'a> {
        let mut all = Vec::new();
        if let Some(Value::Object(top)) = verdict {
            collect(top, &mut Vec::new(), &mut all);
        }
        let tags = part.first().map(|e| tags_of(&e.part)).unwrap_or_default();
        // An item with a field of the tag's own name must agree with it. A tag no item
        // carries under any of its names cannot choose among them (lab 5's `redis-failover`
        // part holds five scenarios, named otherwise); one some item carries must agree.
        let telling: Vec<&(&str, Value)> = tags
            .iter()
            .filter(|tag| all.iter().any(|item| carries(item, tag)))
            .collect();
        let items = all
            .into_iter()
            .filter(|item| {
                tags.iter()
                    .all(|(name, value)| item.get(name).is_none_or(|v| v == value))
                    && telling.iter().all(|tag| carries(item, tag))
            })
            .collect();
        let concluded_two_holders = part.iter().any(|e| matches!(e.what, What::TwoHolders(_)));
        Stated {
            items,
            concluded_two_holders,
        }
    }

    /// Did the checkers find `holders` holding one lock at once? Yes or No only where every
    /// item about them that settles it says so.
    pub fn two_holders(&self, holders: &[&str]) -> Finding {
        if self.concluded_two_holders {
            return Finding::Yes;
        }
        // An item with the store's attempts speaks of their writers (lab 5's scenarios each
        // of one pair); one without speaks of the whole part.
        let about = |item: &Item| {
            let writers: Vec<&str> = item.attempts().iter().map(|(w, _, _)| *w).collect();
            let named = item.own("holder").and_then(Value::as_str);
            (item.get("attempts").is_none() || holders.iter().all(|h| writers.contains(h)))
                && named.is_none_or(|named| holders.contains(&named))
        };
        let said: Vec<Finding> = self
            .items
            .iter()
            .filter(|item| about(item))
            .filter_map(Item::two_holders)
            .collect();
        match said.first() {
            Some(&first) if said.iter().all(|&f| f == first) => first,
            _ => Finding::Unknown,
        }
    }

    /// The late writes the checkers found. The writer is the one the store's record names:
    /// a late write taken is the final writer; one refused is the other writer, when
    /// exactly one other wrote (`writers_of(resource)`: who wrote to it in this part).
    pub fn late_writes(
        &self,
        writers_of: impl Fn(Option<&str>) -> Vec<String>,
    ) -> Vec<LateWriteStated> {
        let mut found: Vec<LateWriteStated> = Vec::new();
        for item in &self.items {
            let Some(accepted) = item.late_write_accepted() else {
                continue;
            };
            let resource = item.get("resource").and_then(Value::as_str);
            let Some(kept) = item.final_writer() else {
                continue;
            };
            let writer = if accepted {
                Some(kept.to_string())
            } else {
                let mut others: Vec<String> = item
                    .attempts()
                    .iter()
                    .map(|(w, _, _)| w.to_string())
                    .collect();
                if others.is_empty() {
                    others = writers_of(resource);
                }
                others.retain(|w| w != kept);
                others.dedup();
                (others.len() == 1).then(|| others.remove(0))
            };
            let Some(writer) = writer else { continue };
            let stated = LateWriteStated {
                writer,
                resource: resource.map(str::to_string),
                accepted,
            };
            if !found.contains(&stated) {
                found.push(stated);
            }
        }
        found
    }
}

/// Every object of the verdict that settles a fact, with the objects around it.
fn collect<'a>(
    object: &'a Map<String, Value>,
    outer: &mut Vec<&'a Map<String, Value>>,
    into: &mut Vec<Item<'a>>,
) {
    let mut chain = vec![object];
    chain.extend(outer.iter().rev());
    let item = Item { chain };
    if item.two_holders().is_some() || item.late_write_accepted().is_some() {
        into.push(item);
    }
    outer.push(object);
    for value in object.values() {
        let objects: Vec<&Map<String, Value>> = match value {
            Value::Object(inner) => vec![inner],
            Value::Array(list) => list.iter().filter_map(Value::as_object).collect(),
            _ => Vec::new(),
        };
        for inner in objects {
            collect(inner, outer, into);
        }
    }
    outer.pop();
}

/// A part's tags as (name, value) pairs.
fn tags_of(part: &Part) -> Vec<(&'static str, Value)> {
    let text = |name, value: &Option<String>| value.clone().map(|v| (name, Value::String(v)));
    [
        text("scenario", &part.scenario),
        text("variant", &part.variant),
        part.fencing.map(|f| ("fencing", Value::Bool(f))),
        text("store_rule", &part.store_rule),
        text("token_source", &part.token_source),
        text("approach", &part.approach),
        text("mode", &part.mode),
        part.workers.map(|w| ("workers", Value::from(w))),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Whether `item` (or an object around it) has the tag's value in a field the tag goes by.
fn carries(item: &Item, (name, value): &(&str, Value)) -> bool {
    let fields = TAG_FIELDS
        .iter()
        .find(|(tag, _)| tag == name)
        .map_or(&[][..], |(_, fields)| *fields);
    fields.iter().any(|field| item.get(field) == Some(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tagged(scenario: &str) -> Event {
        let mut event = Event::new("A", What::Working, "at work");
        event.part.scenario = Some(scenario.into());
        event
    }

    /// What `verdict` states about a part tagged `scenario`.
    fn stated<'a>(verdict: Option<&'a Value>, scenario: &str) -> Stated<'a> {
        let event = tagged(scenario);
        Stated::of(verdict, &[&event])
    }

    fn attempt(writer: &str, accepted: bool, decided: i64) -> Value {
        json!({"writer": writer, "accepted": accepted, "decided": decided})
    }

    #[test]
    fn a_part_is_judged_by_the_items_its_tags_name() {
        let verdict = json!({"cells": [
            {"scenario": "kill", "two_holders": false},
            {"scenario": "freeze", "two_holders": true},
        ]});
        assert_eq!(
            stated(Some(&verdict), "freeze").two_holders(&["A", "B"]),
            Finding::Yes
        );
        assert_eq!(
            stated(Some(&verdict), "kill").two_holders(&["A", "B"]),
            Finding::No
        );
    }

    #[test]
    fn items_that_disagree_or_say_nothing_leave_it_unknown() {
        // A tag no item carries chooses nothing: both items speak of the part, and disagree.
        let verdict = json!({"scenarios": [
            {"name": "one", "two_holders": false},
            {"name": "two", "two_holders": true},
        ]});
        let both = stated(Some(&verdict), "both");
        assert_eq!(both.two_holders(&["A", "B"]), Finding::Unknown);
        assert_eq!(
            stated(None, "both").two_holders(&["A", "B"]),
            Finding::Unknown
        );
        let null = json!({"runs": [{"two_holders": null}]});
        assert_eq!(
            stated(Some(&null), "both").two_holders(&["A", "B"]),
            Finding::Unknown
        );
    }

    #[test]
    fn an_item_of_another_scenario_is_not_about_a_part_no_item_names() {
        // Lab 8: the lost-reply parts have no run of their own; the runs of other scenarios
        // found late writes, which are not this part's.
        let verdict = json!({"runs": [
            {"scenario": "cut-off", "late_write": "accepted", "final_writer": "A"},
        ]});
        let lost_reply = stated(Some(&verdict), "lost-reply");
        assert_eq!(lost_reply.late_writes(|_| Vec::new()), Vec::new());
    }

    #[test]
    fn the_store_attempts_say_which_pair_an_item_is_about() {
        // Lab 5: one part, several pairs, each scenario with its own writers.
        let verdict = json!({"scenarios": [
            {"name": "unfenced", "two_holders": true,
             "attempts": [attempt("B:u", true, 1), attempt("A:u", true, 2)]},
            {"name": "etcd", "two_holders": false, "attempts": []},
        ]});
        let failover = stated(Some(&verdict), "failover");
        assert_eq!(failover.two_holders(&["A:u", "B:u"]), Finding::Yes);
        assert_eq!(failover.two_holders(&["A:e", "B:e"]), Finding::Unknown);
    }

    #[test]
    fn a_late_write_names_its_writer_by_the_stores_record() {
        let verdict = json!({"runs": [
            {"fencing": false, "late_write": "accepted", "final_writer": "A"},
            {"fencing": true, "late_write": "rejected",
             "attempts": [attempt("B", true, 1), attempt("A", false, 2)]},
            {"fencing": true, "late_write": "none", "final_writer": "B"},
        ]});
        let late = |fencing: bool| {
            let mut event = Event::new("A", What::Working, "at work");
            event.part.fencing = Some(fencing);
            Stated::of(Some(&verdict), &[&event]).late_writes(|_| Vec::new())
        };
        let taken = LateWriteStated {
            writer: "A".into(),
            resource: None,
            accepted: true,
        };
        assert_eq!(late(false), vec![taken]);
        let refused = LateWriteStated {
            writer: "A".into(),
            resource: None,
            accepted: false,
        };
        assert_eq!(late(true), vec![refused]);
    }

    #[test]
    fn a_guarded_write_takes_its_scenario_from_around_it() {
        // Lab 6: the guarded writes sit inside their scenario, and name no attempts: the
        // refused one's writer is the other writer of its resource.
        let verdict = json!({"scenarios": [{"name": "client-pause", "guarded_writes": [
            {"resource": "r1", "attempted": true, "accepted": true, "final_writer": "A"},
            {"resource": "r2", "attempted": true, "accepted": false, "final_writer": "B"},
        ]}]});
        let found = stated(Some(&verdict), "client-pause")
            .late_writes(|_| vec!["A".to_string(), "B".to_string()]);
        let writers: Vec<(&str, Option<&str>, bool)> = found
            .iter()
            .map(|l| (l.writer.as_str(), l.resource.as_deref(), l.accepted))
            .collect();
        assert_eq!(
            writers,
            vec![("A", Some("r1"), true), ("A", Some("r2"), false)]
        );
    }
}
