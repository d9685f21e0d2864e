//! `lockslab chaos`: what one history broke, from the store's read-back and the backends'
//! answers in it.
//!
//! Each record is a counter and an append-only log ([`crate::worker::chaos_client`]); the
//! store numbered every write it decided and kept the value each one was computed from. So:
//!
//! - **stale write accepted**: in the store's decision order, an accepted write whose read
//!   is not the value the record held when it was decided — it was computed from a read
//!   another write had already made stale, and it overwrote that write's effect;
//! - **lost update**: the record's final counter against the increments that took effect
//!   (one per log entry), and every increment a client was told was accepted (the `wrote`
//!   events) against the log;
//! - **duplicated effect**: one job in the log twice;
//! - **two holders**, by the lock service's own answers: a release that found another
//!   client's owner value in the key *before this one's TTL could have run out* (counted
//!   from when its `SET` was sent) means the service had granted the lock to that client
//!   while this one still held it — a key lost to a restart, a failover or a server's
//!   clock jump. A release that found its lock gone, or taken again once its TTL could have
//!   run out, cannot say whether someone else held it while this one still worked:
//!   unknown — which counts only for the designs that trust the lock alone, since the
//!   others expect the lock to fail. (The client decides which: [`LostRelease`] carries
//!   another owner only in the first case; Redlock's release is judged the same way,
//!   against its validity.)
//!
//! A record the read-back did not find is unknown too. Unknown is never a pass.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use super::report::{self, Outcome};

/// One attempt the store decided, in its decision order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChaosAttempt {
    pub client: String,
    pub job: i64,
    /// The value the job had read (None: its claim was refused before it read).
    pub read_value: Option<i64>,
    pub value: i64,
    pub token: Option<i64>,
    pub accepted: bool,
    pub decided: i64,
}

/// What the clients heard, from the history: the lab reads it out of the events (this
/// module stays below the events, which borrow its types).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Heard {
    /// (record, job) of every write a client was told was accepted.
    pub acknowledged: Vec<(String, i64)>,
    /// Every release that found the lock no longer the client's own, in order.
    pub lost_releases: Vec<LostRelease>,
}

/// A release that found its lock gone (`found_owner` None: expired) or someone else's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LostRelease {
    pub holder: String,
    pub lock: String,
    pub found_owner: Option<String>,
}

/// One record as read back at the end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RecordBack {
    pub record: String,
    /// None: the record was not found.
    pub final_value: Option<i64>,
    /// The jobs that took effect, in the log's order.
    pub log: Vec<i64>,
    pub attempts: Vec<ChaosAttempt>,
}

/// A broken rule, with the evidence that shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Violation {
    /// The lock service granted `lock` to `other` while `holder` still held it.
    TwoHolders {
        lock: String,
        holder: String,
        other_owner: String,
    },
    /// An accepted write computed from a stale read.
    StaleWrite {
        record: String,
        client: String,
        job: i64,
        decided: i64,
        read_value: i64,
        value_before: i64,
        /// The job whose write it overwrote (None: the record's initial value).
        overwrote: Option<i64>,
    },
    /// Increments that took effect (or were acknowledged) and are not in the counter.
    LostUpdate {
        record: String,
        final_value: i64,
        increments: usize,
        /// Jobs a client was told were accepted that the log does not have.
        acknowledged_missing: Vec<i64>,
    },
    /// One job's effect twice.
    Duplicate {
        record: String,
        job: i64,
        times: usize,
    },
}

impl Violation {
    /// The jobs this violation is about: the ones its timeline needs.
    pub fn jobs(&self) -> Vec<i64> {
        match self {
            Violation::TwoHolders { .. } => Vec::new(),
            Violation::StaleWrite { job, overwrote, .. } => {
                std::iter::once(*job).chain(*overwrote).collect()
            }
            Violation::LostUpdate {
                acknowledged_missing,
                ..
            } => acknowledged_missing.clone(),
            Violation::Duplicate { job, .. } => vec![*job],
        }
    }

    /// Every word [`Violation::kind`] returns: a matrix cell reads `UNSAFE <kind>`, and
    /// `matrix --merge` takes no other.
    pub const KINDS: [&'static str; 4] = ["two-holders", "stale-write", "lost-update", "duplicate"];

    pub fn kind(&self) -> &'static str {
        match self {
            Violation::TwoHolders { .. } => "two-holders",
            Violation::StaleWrite { .. } => "stale-write",
            Violation::LostUpdate { .. } => "lost-update",
            Violation::Duplicate { .. } => "duplicate",
        }
    }

    /// One line for a terminal.
    pub fn describe(&self) -> String {
        match self {
            Violation::TwoHolders {
                lock,
                holder,
                other_owner,
            } => format!(
                "two holders: {holder}'s release of {lock} found it granted to {} already",
                short(other_owner)
            ),
            Violation::StaleWrite {
                record,
                client,
                job,
                decided,
                read_value,
                value_before,
                ..
            } => format!(
                "stale write accepted: {client}'s job {job} wrote {record} = {} (decision {decided}) \
                 from a read of {read_value}, over {value_before}",
                read_value + 1
            ),
            Violation::LostUpdate {
                record,
                final_value,
                increments,
                acknowledged_missing,
            } => {
                let acked = if acknowledged_missing.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} acknowledged job(s) missing from its log",
                        acknowledged_missing.len()
                    )
                };
                format!(
                    "lost update: {record} ends at {final_value} after {increments} accepted increments{acked}"
                )
            }
            Violation::Duplicate { record, job, times } => {
                format!("duplicated effect: job {job} is in {record}'s log {times} times")
            }
        }
    }
}

fn short(owner: &str) -> String {
    owner.chars().take(8).collect()
}

/// What one history broke, and what it could not decide.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub violations: Vec<Violation>,
    pub unknowns: Vec<String>,
    /// Writes the store accepted, over all records.
    pub accepted: usize,
    pub attempts: usize,
}

/// The one-word result of a history, as `chaos` and the matrix word it: the history's
/// [`Outcome`] (valid, invalid, unknown) under the names their output has always used
/// (`safe`, `unsafe`, `unknown`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Judgement {
    Safe,
    Unsafe,
    Unknown,
}

impl From<Outcome> for Judgement {
    fn from(outcome: Outcome) -> Judgement {
        match outcome {
            Outcome::Valid => Judgement::Safe,
            Outcome::Invalid => Judgement::Unsafe,
            Outcome::Unknown => Judgement::Unknown,
        }
    }
}

impl Report {
    /// What one history broke and left open, as the one result every checker gives: each
    /// violation an invalid finding, each unknown an unknown one, merged by Jepsen's rule.
    /// (The findings name no events yet: this checker reads the store's records and the
    /// clients' releases, not positions in the history.)
    pub fn report(&self) -> report::Report {
        report::Report::of_lists(
            self.violations.iter().map(|v| (v.kind(), v.describe())),
            self.unknowns.iter().cloned(),
        )
    }

    pub fn judgement(&self) -> Judgement {
        self.report().outcome.into()
    }
}

/// Checks one history. `trusts_the_lock`: the design relies on the lock alone, so that two
/// holders (or not knowing whether there were) is its failure.
pub fn check(heard: &Heard, records: &[RecordBack], trusts_the_lock: bool) -> Report {
    let mut report = Report::default();
    for record in records {
        check_record(record, &heard.acknowledged, &mut report);
    }
    if trusts_the_lock {
        two_holders(&heard.lost_releases, &mut report);
    }
    report
}

fn check_record(record: &RecordBack, acknowledged: &[(String, i64)], report: &mut Report) {
    let name = &record.record;
    let Some(final_value) = record.final_value else {
        report
            .unknowns
            .push(format!("{name}: not found when read back"));
        return;
    };
    report.attempts += record.attempts.len();
    let mut attempts = record.attempts.clone();
    attempts.sort_by_key(|a| a.decided);
    let (mut current, mut current_job) = (0, None);
    for attempt in attempts.iter().filter(|a| a.accepted) {
        report.accepted += 1;
        if let Some(read) = attempt.read_value
            && read != current
        {
            report.violations.push(Violation::StaleWrite {
                record: name.clone(),
                client: attempt.client.clone(),
                job: attempt.job,
                decided: attempt.decided,
                read_value: read,
                value_before: current,
                overwrote: current_job,
            });
        }
        current = attempt.value;
        current_job = Some(attempt.job);
    }
    let in_log: HashSet<i64> = record.log.iter().copied().collect();
    let acknowledged_missing: Vec<i64> = acknowledged
        .iter()
        .filter(|(r, job)| r == name && !in_log.contains(job))
        .map(|(_, job)| *job)
        .collect();
    if final_value < record.log.len() as i64 || !acknowledged_missing.is_empty() {
        report.violations.push(Violation::LostUpdate {
            record: name.clone(),
            final_value,
            increments: record.log.len(),
            acknowledged_missing,
        });
    }
    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    for job in &record.log {
        *times.entry(*job).or_default() += 1;
    }
    for (job, times) in times.into_iter().filter(|(_, n)| *n > 1) {
        report.violations.push(Violation::Duplicate {
            record: name.clone(),
            job,
            times,
        });
    }
}

/// Each release's answer: found another owner's value (two holders), or found the lock
/// gone (unknown: it expired, and whether someone held it meanwhile is not said).
fn two_holders(releases: &[LostRelease], report: &mut Report) {
    for release in releases {
        let LostRelease {
            holder,
            lock,
            found_owner,
        } = release;
        match found_owner {
            Some(other) => report.violations.push(Violation::TwoHolders {
                lock: lock.clone(),
                holder: holder.clone(),
                other_owner: other.clone(),
            }),
            None => report.unknowns.push(format!(
                "{holder}'s lock {lock} had expired before it let go (or its release got no \
                 answer): whether another client held it meanwhile, the lock service does not say"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(client: &str, job: i64, read: i64, accepted: bool, decided: i64) -> ChaosAttempt {
        ChaosAttempt {
            client: client.into(),
            job,
            read_value: Some(read),
            value: read + 1,
            token: None,
            accepted,
            decided,
        }
    }

    fn record(final_value: i64, log: &[i64], attempts: Vec<ChaosAttempt>) -> RecordBack {
        RecordBack {
            record: "r0".into(),
            final_value: Some(final_value),
            log: log.to_vec(),
            attempts,
        }
    }

    fn acked(jobs: &[i64]) -> Heard {
        Heard {
            acknowledged: jobs.iter().map(|job| ("r0".to_string(), *job)).collect(),
            lost_releases: Vec::new(),
        }
    }

    fn lost(found: Option<&str>) -> Heard {
        Heard {
            acknowledged: Vec::new(),
            lost_releases: vec![LostRelease {
                holder: "A".into(),
                lock: "lock:r0".into(),
                found_owner: found.map(String::from),
            }],
        }
    }

    #[test]
    fn a_clean_run_is_safe() {
        let back = record(
            2,
            &[1, 2],
            vec![attempt("A", 1, 0, true, 1), attempt("B", 2, 1, true, 2)],
        );
        let report = check(&acked(&[1, 2]), &[back], true);
        assert_eq!(report.judgement(), Judgement::Safe, "{report:?}");
        assert_eq!((report.accepted, report.attempts), (2, 2));
    }

    #[test]
    fn two_writes_from_one_read_are_a_stale_write_and_a_lost_update() {
        // A and B both read 0; both accepted: the counter says 1 after two increments.
        let back = record(
            1,
            &[1, 2],
            vec![attempt("A", 1, 0, true, 1), attempt("B", 2, 0, true, 2)],
        );
        let report = check(&Heard::default(), &[back], false);
        assert_eq!(report.judgement(), Judgement::Unsafe);
        let kinds: Vec<&str> = report.violations.iter().map(Violation::kind).collect();
        assert_eq!(kinds, vec!["stale-write", "lost-update"]);
        assert!(report.violations[0].describe().contains("B's job 2"));
    }

    #[test]
    fn a_stale_write_refused_is_no_violation() {
        let back = record(
            1,
            &[1],
            vec![attempt("A", 1, 0, true, 1), attempt("B", 2, 0, false, 2)],
        );
        assert_eq!(
            check(&Heard::default(), &[back], false).judgement(),
            Judgement::Safe
        );
    }

    #[test]
    fn an_acknowledged_write_missing_from_the_log_is_a_lost_update() {
        let back = record(1, &[1], vec![attempt("A", 1, 0, true, 1)]);
        let report = check(&acked(&[1, 7]), &[back], false);
        assert_eq!(
            report.violations,
            vec![Violation::LostUpdate {
                record: "r0".into(),
                final_value: 1,
                increments: 1,
                acknowledged_missing: vec![7]
            }]
        );
    }

    #[test]
    fn a_write_whose_reply_was_lost_is_settled_by_the_log() {
        // B heard nothing back; the log has its job: it took effect, and nothing is lost.
        let back = record(
            2,
            &[1, 2],
            vec![attempt("A", 1, 0, true, 1), attempt("B", 2, 1, true, 2)],
        );
        assert_eq!(
            check(&acked(&[1]), &[back], false).judgement(),
            Judgement::Safe
        );
    }

    #[test]
    fn one_job_twice_in_the_log_is_a_duplicated_effect() {
        let back = record(
            2,
            &[1, 1],
            vec![attempt("A", 1, 0, true, 1), attempt("A", 1, 1, true, 2)],
        );
        let report = check(&Heard::default(), &[back], false);
        assert_eq!(
            report.violations,
            vec![Violation::Duplicate {
                record: "r0".into(),
                job: 1,
                times: 2
            }]
        );
    }

    #[test]
    fn a_release_that_found_another_owner_is_two_holders_for_a_design_that_trusts_the_lock() {
        let history = lost(Some("b0b0b0b0cafe"));
        let trusting = check(&history, &[], true);
        assert_eq!(trusting.violations[0].kind(), "two-holders");
        assert!(trusting.violations[0].describe().contains("lock:r0"));
        // A fenced design expects the lock to fail: the store's rows decide.
        assert_eq!(check(&history, &[], false).judgement(), Judgement::Safe);
    }

    #[test]
    fn a_lock_found_expired_is_unknown_never_a_pass() {
        let report = check(&lost(None), &[], true);
        assert_eq!(report.judgement(), Judgement::Unknown);
        assert!(report.unknowns[0].contains("expired"));
    }

    #[test]
    fn a_record_not_found_is_unknown_and_a_violation_outranks_an_unknown() {
        let missing = RecordBack {
            final_value: None,
            ..record(0, &[], vec![])
        };
        assert_eq!(
            check(&Heard::default(), std::slice::from_ref(&missing), false).judgement(),
            Judgement::Unknown
        );
        let broken = record(
            1,
            &[1, 2],
            vec![attempt("A", 1, 0, true, 1), attempt("B", 2, 0, true, 2)],
        );
        let report = check(&Heard::default(), &[missing, broken], false);
        assert_eq!(report.judgement(), Judgement::Unsafe);
        // The same, as the one result type: one finding per violation and per unknown.
        let merged = report.report();
        assert_eq!(merged.outcome, Outcome::Invalid);
        assert_eq!(
            merged.with(Outcome::Invalid).count(),
            report.violations.len()
        );
        assert_eq!(merged.with(Outcome::Unknown).count(), 1);
    }
}
