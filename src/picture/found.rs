//! What the run's checker found, as the picture draws it: the findings of its
//! [`Report`] that point at events of one part of the run.
//!
//! The picture applies no rule of its own to the events. A "two holders" band, a stale
//! write, a failure mark and a part's outcome are each a finding of the Report, drawn at
//! the events the finding points at; a finding the Report does not make is not drawn, and
//! a run without a Report (one no lab's checker judges) has none of them.

use std::collections::{BTreeMap, BTreeSet};

use super::drawing::Tone;
use crate::check::report::{Finding, Outcome, Report};
use crate::events::Event;

/// The names of the findings that say whether the lock was held by two at once: the lock
/// labs' `mutual exclusion`, the queue lab's turns and leaders, a chaos hunt's
/// `two-holders`.
const EXCLUSION: &[&str] = &[
    "mutual exclusion",
    "one holder at a time",
    "one leader at a time",
    "two-holders",
];

/// The names of the findings about a late write: the labs' and a hunt's.
const LATE_WRITE: &[&str] = &["stale write", "stale-write"];

/// The names of the findings that judge what the store kept: a late write, each job's
/// processing counted in the tables, a hunt's records.
const STORE: &[&str] = &[
    "stale write",
    "exactly once",
    "stale-write",
    "lost-update",
    "duplicate",
];

/// A finding's name without the part a checker appended (`stale write (run 2)`).
fn named(finding: &Finding, names: &[&str]) -> bool {
    names.iter().any(|name| finding.name.starts_with(name))
}

/// The findings about one part of the run: those pointing at one of its events.
pub struct Found<'a> {
    findings: Vec<&'a Finding>,
    /// The part's events, by their index in the run's history.
    events: BTreeMap<usize, &'a Event>,
}

impl<'a> Found<'a> {
    /// The findings of `report` about the part whose events are `events` (index, event).
    pub fn of(report: Option<&'a Report>, events: &[(usize, &'a Event)]) -> Found<'a> {
        let events: BTreeMap<usize, &Event> = events.iter().copied().collect();
        let findings = report
            .into_iter()
            .flat_map(|r| &r.findings)
            .filter(|f| f.events.iter().any(|i| events.contains_key(i)))
            .collect();
        Found { findings, events }
    }

    /// Did the Report find the lock held by two of `holders` at once? Yes where an invalid
    /// exclusion finding points at an event of one of them (its grant, its release).
    pub fn two_holders(&self, holders: &[&str]) -> bool {
        let of_holder = |i: &usize| {
            self.events.get(i).is_some_and(|e| {
                let target = e.fault().and_then(|f| f.target.as_deref());
                holders.iter().any(|h| e.worker == *h || target == Some(h))
            })
        };
        self.findings.iter().any(|f| {
            f.outcome == Outcome::Invalid && named(f, EXCLUSION) && f.events.iter().any(of_holder)
        })
    }

    /// The late writes the Report judged, by event index: taken (invalid) or refused.
    pub fn late_writes(&self) -> BTreeMap<usize, Outcome> {
        self.findings
            .iter()
            .filter(|f| named(f, LATE_WRITE))
            .filter_map(|f| Some((f.subject?, f.outcome)))
            .collect()
    }

    /// The events the Report points at as the proof of a broken property.
    pub fn broken(&self) -> BTreeSet<usize> {
        self.findings
            .iter()
            .filter(|f| f.outcome == Outcome::Invalid)
            .flat_map(|f| f.events.iter().copied())
            .collect()
    }

    /// The part's outcome, as the Report's findings on the store say it: "late write taken"
    /// (or "broken") where one is invalid; else refused where a late write was refused, held
    /// back where a guard stopped it, "each job once" where the tables counted every job
    /// once. None where the part's
    /// findings judge no late write and no job (its outcome is then its bars and marks).
    pub fn outcome(&self) -> Option<(String, Tone)> {
        let store: Vec<&&Finding> = self.findings.iter().filter(|f| named(f, STORE)).collect();
        if let Some(broken) = store.iter().find(|f| f.outcome == Outcome::Invalid) {
            // The lesson's outcome in a word, not a test's: what broke.
            let word = if named(broken, LATE_WRITE) {
                "late write taken"
            } else {
                "broken"
            };
            return Some((format!("{word} — {}", broken.words), Tone::Bad));
        }
        store.iter().find_map(|f| {
            let word = match f.subject.and_then(|i| self.events.get(&i)) {
                Some(e) if e.kind() == crate::events::Kind::Wrote => "late write refused",
                Some(_) => "held back",
                None if named(f, &["exactly once"]) && f.outcome == Outcome::Valid => {
                    "each job once"
                }
                None => return None,
            };
            Some((format!("{word} — {}", f.words), Tone::Good))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::What;

    fn event(worker: &str) -> Event {
        Event::new(worker, What::Working, "")
    }

    #[test]
    fn only_an_invalid_exclusion_finding_about_a_holder_draws_two_holders() {
        let (a, b, c) = (event("A"), event("B"), event("C"));
        let events = [(0, &a), (1, &b), (2, &c)];
        let report =
            |outcome, name: &str, at: usize| Report::of([Finding::new(name, outcome, "", [at])]);
        let broken = report(Outcome::Invalid, "mutual exclusion (run 1)", 1);
        assert!(Found::of(Some(&broken), &events).two_holders(&["A", "B"]));
        assert!(!Found::of(Some(&broken), &events).two_holders(&["A", "C"]));
        let held = report(Outcome::Valid, "mutual exclusion", 1);
        assert!(!Found::of(Some(&held), &events).two_holders(&["A", "B"]));
        let open = report(Outcome::Unknown, "mutual exclusion", 1);
        assert!(!Found::of(Some(&open), &events).two_holders(&["A", "B"]));
        let other = report(Outcome::Invalid, "stale write", 1);
        assert!(!Found::of(Some(&other), &events).two_holders(&["A", "B"]));
        assert!(!Found::of(None, &events).two_holders(&["A", "B"]));
        // A finding about another part's events says nothing of this one.
        let elsewhere = report(Outcome::Invalid, "mutual exclusion", 7);
        assert!(!Found::of(Some(&elsewhere), &events).two_holders(&["A", "B"]));
    }

    #[test]
    fn a_late_write_is_the_subject_of_a_stale_write_finding() {
        let wrote = Event::new(
            "A",
            crate::events::facts::Wrote::new(crate::store::Outcome::Rejected),
            "",
        );
        let b = event("B");
        let events = [(0, &b), (1, &wrote)];
        let refused = Report::of([
            Finding::new("stale write", Outcome::Valid, "refused it", [0]).about_event(Some(1)),
        ]);
        let found = Found::of(Some(&refused), &events);
        assert_eq!(found.late_writes(), BTreeMap::from([(1, Outcome::Valid)]));
        assert_eq!(
            found.outcome().unwrap().0,
            "late write refused — refused it"
        );
        // The same finding without a subject names no late write, and no outcome.
        let none = Report::of([Finding::new("stale write", Outcome::Valid, "none", [0, 1])]);
        assert!(Found::of(Some(&none), &events).late_writes().is_empty());
        assert_eq!(Found::of(Some(&none), &events).outcome(), None);
        let taken = Report::of([
            Finding::new("stale write", Outcome::Invalid, "took it", [0]).about_event(Some(1)),
        ]);
        let found = Found::of(Some(&taken), &events);
        assert_eq!(
            found.outcome().unwrap(),
            ("late write taken — took it".into(), Tone::Bad)
        );
        assert_eq!(found.broken(), BTreeSet::from([0, 1]));
    }
}
