//! One result for every checker: an [`Outcome`] that composes, and a [`Report`] whose
//! findings each point at the events that prove them.
//!
//! A checker reads a history (a run's events, the store's read-back among them) and says
//! whether the property it checks held. Three answers, not two: a history can prove a
//! property broken (`invalid`), prove it held (`valid`), or leave it open (`unknown`: a lease
//! that expired before anyone asked who held it, a record the read-back did not find).
//! Unknown is never a pass.
//!
//! Results compose the way Jepsen's checkers compose theirs: one invalid finding makes the
//! whole report invalid; otherwise one unknown makes it unknown; only a report whose every
//! finding is valid is valid. So a lab's report is the merge of its runs' reports, and a
//! run's the merge of its findings, and nobody re-decides at the top what the bottom found.
//!
//! A finding names the events that prove it by their position in the history the checker
//! was given, so a reader (a test, the picture) can go to the evidence instead of trusting
//! the sentence. The positions are plain numbers: this module sits below the events (which
//! borrow checker types), so it does not know what an event is.
//!
//! (Not to be confused with [`super::Finding`], the answer to one yes/no question about the
//! evidence — "two holders?" — which a lab turns into an [`Outcome`] only once it knows
//! whether "yes" is the broken case: [`Outcome::broken_if`].)

use serde::{Deserialize, Serialize};

/// Whether a property held in a history.
///
/// The variants are declared from best to worst, so the merge of two outcomes is the worse
/// of them (`Ord::max`): Jepsen's rule without a table.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The history proves the property held.
    #[default]
    Valid,
    /// The history cannot say: neither proof is in it.
    Unknown,
    /// The history proves the property broken.
    Invalid,
}

impl Outcome {
    /// Two results of one history, merged: any invalid → invalid; else any unknown →
    /// unknown; else valid.
    pub fn merge(self, other: Outcome) -> Outcome {
        self.max(other)
    }

    /// Many results merged; no results at all is valid (nothing was found broken), as in
    /// Jepsen's `compose` — a checker that tested nothing says so with an unknown finding.
    pub fn all(outcomes: impl IntoIterator<Item = Outcome>) -> Outcome {
        outcomes.into_iter().fold(Outcome::Valid, Outcome::merge)
    }

    /// The outcome of a yes/no question whose "yes" is the broken case ("two holders?",
    /// "a stale write accepted?"): yes is invalid, no is valid, unknown stays unknown.
    pub fn broken_if(answer: super::Finding) -> Outcome {
        Outcome::broken_when(answer.as_option())
    }

    /// The outcome of a verdict's "broken?" field (`two_holders`, `stale_write_accepted`):
    /// true is invalid, false is valid, null (the evidence could not say) is unknown.
    pub fn broken_when(broken: Option<bool>) -> Outcome {
        match broken {
            Some(true) => Outcome::Invalid,
            Some(false) => Outcome::Valid,
            None => Outcome::Unknown,
        }
    }

    /// The word `--json` and tests use: `valid`, `invalid`, `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Valid => "valid",
            Outcome::Unknown => "unknown",
            Outcome::Invalid => "invalid",
        }
    }
}

/// One conclusion a checker drew, with the evidence behind it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// What was checked, short (`two holders`, `stale write`), with the part of the run it
    /// is about where a history has several (`two holders (run 2: fencing=true)`).
    pub name: String,
    pub outcome: Outcome,
    /// The conclusion in a sentence.
    pub words: String,
    /// Positions in the checked history of the events that prove it, in history order.
    /// Empty only for an unknown finding whose point is that no event decides it.
    pub events: Vec<usize>,
    /// The one event among `events` the finding is about, where there is one: the late
    /// write a "stale write" finding judged (taken or refused), or the guard's decision that
    /// held it back. The other events are the evidence around it; a reader that marks one
    /// event (the picture) marks this one, and need not work out which write was late.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<usize>,
}

impl Finding {
    pub fn new(
        name: impl Into<String>,
        outcome: Outcome,
        words: impl Into<String>,
        events: impl IntoIterator<Item = usize>,
    ) -> Finding {
        let mut events: Vec<usize> = events.into_iter().collect();
        events.sort_unstable();
        events.dedup();
        Finding {
            name: name.into(),
            outcome,
            words: words.into(),
            events,
            subject: None,
        }
    }

    /// This finding about one of its events (see [`Finding::subject`]); `None` leaves it
    /// about none. The subject is one of the events that prove the finding.
    pub fn about_event(mut self, subject: Option<usize>) -> Finding {
        if let Some(at) = subject
            && let Err(place) = self.events.binary_search(&at)
        {
            self.events.insert(place, at);
        }
        self.subject = subject;
        self
    }
}

/// What a checker found in one history: the merged [`Outcome`] and every finding.
///
/// Build one with [`Report::push`] or [`Report::compose`], which keep `outcome` the merge of
/// the findings' outcomes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub outcome: Outcome,
    pub findings: Vec<Finding>,
}

impl Report {
    /// A report of these findings.
    pub fn of(findings: impl IntoIterator<Item = Finding>) -> Report {
        let mut report = Report::default();
        for finding in findings {
            report.push(finding);
        }
        report
    }

    /// A report from a checker that lists what broke (each with its kind and a sentence)
    /// and what it left open (a sentence each), without pointing at events: each broken
    /// thing an invalid finding, each open question an unknown one.
    pub fn of_lists(
        broken: impl IntoIterator<Item = (&'static str, String)>,
        open: impl IntoIterator<Item = String>,
    ) -> Report {
        let broken = broken
            .into_iter()
            .map(|(kind, words)| Finding::new(kind, Outcome::Invalid, words, []));
        let open = open
            .into_iter()
            .map(|why| Finding::new("unknown", Outcome::Unknown, why, []));
        Report::of(broken.chain(open))
    }

    /// The report on a part whose history lacks what decides it (a read-back, an answer):
    /// one unknown `evidence` finding saying what is missing, and no event, since none
    /// decides it — never a pass.
    pub fn evidence_missing(why: impl Into<String>) -> Report {
        Report::of([Finding::new("evidence", Outcome::Unknown, why, [])])
    }

    /// A lock lab's two findings on one part: was the lock held by two at once (the
    /// verdict's `two_holders`, with its words and the events that settle it), and did the
    /// store take a stale write (its outcome, words and events).
    /// `late` is the late write the stale-write finding is about, if there was one.
    pub fn exclusion_and_stale_write(
        two_holders: Option<bool>,
        exclusion: (impl Into<String>, impl IntoIterator<Item = usize>),
        stale: (Outcome, impl Into<String>, impl IntoIterator<Item = usize>),
        late: Option<usize>,
    ) -> Report {
        let (exclusion_words, exclusion_events) = exclusion;
        let (stale_outcome, stale_words, stale_events) = stale;
        Report::of([
            Finding::new(
                "mutual exclusion",
                Outcome::broken_when(two_holders),
                exclusion_words,
                exclusion_events,
            ),
            Finding::new("stale write", stale_outcome, stale_words, stale_events).about_event(late),
        ])
    }

    pub fn push(&mut self, finding: Finding) {
        self.outcome = self.outcome.merge(finding.outcome);
        self.findings.push(finding);
    }

    /// Several checkers' reports on one history, as one: every finding kept, the outcomes
    /// merged.
    pub fn compose(reports: impl IntoIterator<Item = Report>) -> Report {
        Report::of(reports.into_iter().flat_map(|r| r.findings))
    }

    /// This report with every event position moved by `offset`: a checker that read a
    /// slice of the history (one run of several) points into the whole of it.
    pub fn shifted(mut self, offset: usize) -> Report {
        for finding in &mut self.findings {
            for event in finding.events.iter_mut().chain(&mut finding.subject) {
                *event += offset;
            }
        }
        self
    }

    /// This report with each event position `i` replaced by `positions[i]`: a checker that
    /// read a part picked out of the history (its events at `positions`) points into the
    /// whole of it.
    pub fn placed(mut self, positions: &[usize]) -> Report {
        for finding in &mut self.findings {
            for event in finding.events.iter_mut().chain(&mut finding.subject) {
                *event = positions[*event];
            }
        }
        self
    }

    /// This report with `part` named in each finding's name (`two holders (run 2)`).
    pub fn about(mut self, part: &str) -> Report {
        for finding in &mut self.findings {
            finding.name = format!("{} ({part})", finding.name);
        }
        self
    }

    /// The findings with this outcome.
    pub fn with(&self, outcome: Outcome) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.outcome == outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Outcome::{Invalid, Unknown, Valid};

    #[test]
    fn any_invalid_is_invalid_else_any_unknown_is_unknown() {
        for (a, b, merged) in [
            (Valid, Valid, Valid),
            (Valid, Unknown, Unknown),
            (Unknown, Valid, Unknown),
            (Unknown, Unknown, Unknown),
            (Valid, Invalid, Invalid),
            (Invalid, Unknown, Invalid),
            (Unknown, Invalid, Invalid),
        ] {
            assert_eq!(a.merge(b), merged, "{a:?} with {b:?}");
        }
        assert_eq!(Outcome::all([]), Valid, "nothing found broken");
        assert_eq!(Outcome::all([Valid, Unknown, Valid]), Unknown);
    }

    #[test]
    fn a_yes_to_a_question_about_breakage_is_invalid() {
        use crate::check::Finding as Answer;
        assert_eq!(Outcome::broken_if(Answer::Yes), Invalid);
        assert_eq!(Outcome::broken_if(Answer::No), Valid);
        assert_eq!(Outcome::broken_if(Answer::Unknown), Unknown);
        assert_eq!(Outcome::broken_when(Some(true)), Invalid);
        assert_eq!(Outcome::broken_when(Some(false)), Valid);
        assert_eq!(Outcome::broken_when(None), Unknown);
        let open = Report::evidence_missing("no read-back");
        assert_eq!(open.outcome, Unknown, "missing evidence is never a pass");
        assert_eq!(open.findings[0].name, "evidence");
    }

    #[test]
    fn a_report_is_the_merge_of_its_findings_and_composes() {
        let held = Finding::new("mutual exclusion", Valid, "one holder", [3, 1, 3]);
        assert_eq!(held.events, vec![1, 3], "in history order, once each");
        let open = Finding::new("two holders", Unknown, "both keys expired", []);
        let broken = Finding::new("stale write", Invalid, "A's write after B's", [7]);
        let first = Report::of([held.clone(), open]);
        assert_eq!(first.outcome, Unknown);
        let second = Report::of([broken]).shifted(10).about("run 2");
        assert_eq!(second.findings[0].events, vec![17]);
        assert_eq!(second.findings[0].name, "stale write (run 2)");
        let whole = Report::compose([first, second]);
        assert_eq!(whole.outcome, Invalid);
        assert_eq!(whole.findings.len(), 3);
        assert_eq!(whole.with(Invalid).count(), 1);
        assert_eq!(Report::compose([]).outcome, Valid);
        assert_eq!(Report::of([held]).outcome, Valid);
    }

    #[test]
    fn a_part_s_report_points_into_the_whole_history() {
        // The part's events 0 and 1 stood at 4 and 9 in the history.
        let part = Report::of([Finding::new("stale write", Invalid, "taken", [1, 0])]);
        assert_eq!(part.placed(&[4, 9]).findings[0].events, vec![4, 9]);
        let open = Report::evidence_missing("no read-back");
        assert_eq!(open.outcome, Unknown);
        assert_eq!(open.findings[0].name, "evidence");
        assert!(open.findings[0].events.is_empty());
    }
}
