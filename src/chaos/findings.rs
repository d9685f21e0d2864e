//! A chaos history's findings placed on its events: the one [`Report`] every checker
//! gives, each finding pointing at the events that prove it — so that `lockslab check`
//! states a hunt's findings the way it states a lab's, and a hunt's picture draws them.

use crate::check::chaos::{self, Violation};
use crate::check::report::{Finding, Outcome, Report};
use crate::events::{Event, Kind, What};
use crate::store::Outcome as Answer;

/// What [`super::rows::judge`] found in `history` (`judged`), as a Report on its events:
/// each violation an invalid finding at the events that show it — the release that found
/// another holder's value and that holder's grant; the stale write, the write it overwrote
/// and the store's read-back; the read-back and the writes it lost or holds twice — each
/// open question an unknown one, and a history that broke nothing one valid finding at the
/// read-back it was judged from.
pub fn placed(history: &[Event], judged: &chaos::Report) -> Report {
    let read_back = history
        .iter()
        .rposition(|e| e.kind() == Kind::RecordsReadBack);
    // The write of `job` the store accepted (by `client`, where it matters).
    let accepted = |client: Option<&str>, job: i64| {
        history.iter().position(|e| {
            client.is_none_or(|c| e.worker == c)
                && matches!(&e.what, What::Wrote(w)
                    if w.job == Some(job) && w.outcome == Answer::Accepted)
        })
    };
    let mut findings: Vec<Finding> = judged
        .violations
        .iter()
        .map(|violation| {
            let (events, subject) = match violation {
                Violation::TwoHolders {
                    holder,
                    other_owner,
                    ..
                } => {
                    let other = Some(other_owner.as_str());
                    let release = history.iter().position(|e| {
                        e.worker == *holder
                            && matches!(&e.what, What::Released(r) if r.found_owner.as_deref() == other)
                    });
                    let grant = history
                        .iter()
                        .position(|e| e.kind() == Kind::Acquired && e.owner() == other);
                    (vec![release, grant], None)
                }
                Violation::StaleWrite {
                    client,
                    job,
                    overwrote,
                    ..
                } => {
                    let late = accepted(Some(client), *job);
                    let overwritten = overwrote.and_then(|job| accepted(None, job));
                    (vec![late, overwritten, read_back], late)
                }
                Violation::LostUpdate {
                    acknowledged_missing,
                    ..
                } => {
                    let missing = acknowledged_missing.iter().map(|&job| accepted(None, job));
                    (missing.chain([read_back]).collect(), None)
                }
                Violation::Duplicate { job, .. } => (vec![accepted(None, *job), read_back], None),
            };
            Finding::new(
                violation.kind(),
                Outcome::Invalid,
                violation.describe(),
                events.into_iter().flatten(),
            )
            .about_event(subject)
        })
        .collect();
    findings.extend(
        judged
            .unknowns
            .iter()
            .map(|why| Finding::new("unknown", Outcome::Unknown, why, [])),
    );
    if findings.is_empty() {
        findings.push(Finding::new(
            "safe",
            Outcome::Valid,
            format!(
                "the store's records: {} of {} attempted writes accepted, none from a stale \
                 read, none lost, none twice; no release found another holder",
                judged.accepted, judged.attempts
            ),
            read_back,
        ));
    }
    Report::of(findings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::facts::{Acquired, RecordsBack, Released};

    fn history() -> Vec<Event> {
        let grant = Acquired {
            owner: Some("c-1".into()),
            ..Acquired::default()
        };
        let release = Released {
            released: Some(false),
            found_owner: Some("c-1".into()),
            ..Released::default()
        };
        vec![
            Event::new("A", Acquired::default(), "took it"),
            Event::new("C", grant, "took it too"),
            Event::new("A", release, "found C's value"),
            Event::new("store", RecordsBack::default(), "read back"),
        ]
    }

    #[test]
    fn two_holders_points_at_the_release_and_the_other_grant() {
        let judged = chaos::Report {
            violations: vec![Violation::TwoHolders {
                lock: "r1".into(),
                holder: "A".into(),
                other_owner: "c-1".into(),
            }],
            ..chaos::Report::default()
        };
        let report = placed(&history(), &judged);
        assert_eq!(report.outcome, Outcome::Invalid);
        assert_eq!(report.findings[0].name, "two-holders");
        assert_eq!(report.findings[0].events, vec![1, 2]);
    }

    #[test]
    fn a_history_that_broke_nothing_is_valid_at_its_read_back() {
        let judged = chaos::Report {
            accepted: 3,
            attempts: 3,
            ..chaos::Report::default()
        };
        let report = placed(&history(), &judged);
        assert_eq!(report.outcome, Outcome::Valid);
        assert_eq!(report.findings[0].events, vec![3]);
        // An open question is never a pass, and adds no valid finding.
        let open = chaos::Report {
            unknowns: vec!["expired".into()],
            ..judged
        };
        let report = placed(&history(), &open);
        assert_eq!(report.outcome, Outcome::Unknown);
        assert_eq!(report.findings.len(), 1);
    }
}
