//! `lockslab challenge`: what a learner's client did to the protected records, read from
//! the database's own log of every change — never from what the client said.
//!
//! Each job says "add `add` to `record`", and the client's write sets the record's `value`
//! and tags it with the job's id (`job`). A trigger copies every change into an append-only
//! log: the record, the job, the value before and the value after, numbered in the order
//! the database applied them (one record's changes wait on its row lock, so for one record
//! that is the order they committed). So:
//!
//! - **stale write**: a change whose value after is not its value before plus the job's
//!   `add` — the client computed it from a read another write had already made stale, and
//!   erased that write's effect (a lost update, seen at the write that lost it);
//! - **doubled effect**: one job's change in the log twice;
//! - **lost**: a job a client answered `ok` for that has no change in the log;
//! - **never done**: a job no client did, though given to one after another;
//! - **untagged**: a change that names no job of the run (the job column not set): the
//!   checker cannot say whose effect it is, and a grader that cannot attribute a change
//!   does not pass it;
//! - **log disagrees**: a record whose value is not the last value its log shows (changed
//!   with the trigger off).
//!
//! If the challenge's faults never played (the client never reached the moment they aim
//! at), a clean log proves nothing about them: undecided, never a pass.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One job as lockslab handed it out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JobSpec {
    pub id: i64,
    pub record: String,
    pub add: i64,
}

/// One row of the change log, in the database's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub seq: i64,
    pub record: String,
    pub job: Option<i64>,
    pub old_value: i64,
    pub new_value: i64,
}

/// Each record's value at the end.
pub type Finals = Vec<(String, i64)>;

/// What the run produced, for the checker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Evidence {
    pub jobs: Vec<JobSpec>,
    /// Jobs some client answered `ok` for.
    pub acknowledged: BTreeSet<i64>,
    /// The log, in its order.
    pub changes: Vec<Change>,
    pub finals: Finals,
    /// Faults the challenge meant to play, and those that played.
    pub faults_planned: usize,
    pub faults_played: usize,
}

/// A broken rule, with its evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Problem {
    StaleWrite {
        record: String,
        job: i64,
        seq: i64,
        old_value: i64,
        new_value: i64,
        add: i64,
    },
    Doubled {
        job: i64,
        times: usize,
    },
    Lost {
        job: i64,
    },
    NeverDone {
        job: i64,
    },
    Untagged {
        record: String,
        seq: i64,
        job: Option<i64>,
    },
    LogDisagrees {
        record: String,
        value: i64,
        logged: i64,
    },
}

impl Problem {
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::StaleWrite { .. } => "stale-write",
            Problem::Doubled { .. } => "doubled",
            Problem::Lost { .. } => "lost",
            Problem::NeverDone { .. } => "never-done",
            Problem::Untagged { .. } => "untagged",
            Problem::LogDisagrees { .. } => "log-disagrees",
        }
    }

    /// One line for a terminal.
    pub fn describe(&self) -> String {
        match self {
            Problem::StaleWrite {
                record,
                job,
                seq,
                old_value,
                new_value,
                add,
            } => format!(
                "stale write: job {job} set {record} to {new_value} over {old_value} \
                 (change #{seq}); it adds {add}, so it was computed from a read of {}, \
                 not from the {old_value} the record held",
                new_value - add
            ),
            Problem::Doubled { job, times } => {
                format!("doubled effect: job {job} changed its record {times} times")
            }
            Problem::Lost { job } => {
                format!("lost: job {job} was answered ok, and the log has no change of it")
            }
            Problem::NeverDone { job } => {
                format!("never done: no client did job {job}")
            }
            Problem::Untagged { record, seq, job } => match job {
                None => format!(
                    "untagged change #{seq} of {record}: the write did not set the job column"
                ),
                Some(job) => format!(
                    "untagged change #{seq} of {record}: job {job} is not a job of this run"
                ),
            },
            Problem::LogDisagrees {
                record,
                value,
                logged,
            } => format!(
                "{record} holds {value}, its log ends at {logged}: it changed outside the log"
            ),
        }
    }
}

/// The verdict's one word, and the exit status it maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Grade {
    Pass,
    Fail,
    Undecided,
}

/// What the checker found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub problems: Vec<Problem>,
    pub undecided: Vec<String>,
    /// Changes in the log that took effect as their job meant.
    pub good_changes: usize,
}

impl Report {
    pub fn grade(&self) -> Grade {
        if !self.problems.is_empty() {
            Grade::Fail
        } else if !self.undecided.is_empty() {
            Grade::Undecided
        } else {
            Grade::Pass
        }
    }
}

/// Checks one run's evidence.
pub fn check(evidence: &Evidence) -> Report {
    let mut report = Report::default();
    let jobs: BTreeMap<i64, &JobSpec> = evidence.jobs.iter().map(|j| (j.id, j)).collect();
    let mut changes = evidence.changes.clone();
    changes.sort_by_key(|c| c.seq);
    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    for change in &changes {
        let Some(job) = change.job.and_then(|id| jobs.get(&id)) else {
            report.problems.push(Problem::Untagged {
                record: change.record.clone(),
                seq: change.seq,
                job: change.job,
            });
            continue;
        };
        *times.entry(job.id).or_default() += 1;
        if change.new_value != change.old_value + job.add || change.record != job.record {
            report.problems.push(Problem::StaleWrite {
                record: change.record.clone(),
                job: job.id,
                seq: change.seq,
                old_value: change.old_value,
                new_value: change.new_value,
                add: job.add,
            });
        } else {
            report.good_changes += 1;
        }
    }
    for (&job, &n) in times.iter().filter(|(_, n)| **n > 1) {
        report.problems.push(Problem::Doubled { job, times: n });
    }
    for job in &evidence.jobs {
        let changed = times.contains_key(&job.id);
        if evidence.acknowledged.contains(&job.id) && !changed {
            report.problems.push(Problem::Lost { job: job.id });
        } else if !evidence.acknowledged.contains(&job.id) && !changed {
            report.problems.push(Problem::NeverDone { job: job.id });
        }
    }
    for (record, value) in &evidence.finals {
        let logged = changes
            .iter()
            .rev()
            .find(|c| &c.record == record)
            .map_or(0, |c| c.new_value);
        if logged != *value {
            report.problems.push(Problem::LogDisagrees {
                record: record.clone(),
                value: *value,
                logged,
            });
        }
    }
    if evidence.faults_played < evidence.faults_planned {
        report.undecided.push(format!(
            "{} of {} faults played: the client never reached the moment the others aim at",
            evidence.faults_played, evidence.faults_planned
        ));
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, record: &str, add: i64) -> JobSpec {
        JobSpec {
            id,
            record: record.into(),
            add,
        }
    }

    fn change(seq: i64, record: &str, job: Option<i64>, old: i64, new: i64) -> Change {
        Change {
            seq,
            record: record.into(),
            job,
            old_value: old,
            new_value: new,
        }
    }

    fn evidence(changes: Vec<Change>, acked: &[i64], finals: &[(&str, i64)]) -> Evidence {
        Evidence {
            jobs: vec![job(1, "r0", 3), job(2, "r0", 5), job(3, "r1", 2)],
            acknowledged: acked.iter().copied().collect(),
            changes,
            finals: finals.iter().map(|(r, v)| (r.to_string(), *v)).collect(),
            faults_planned: 1,
            faults_played: 1,
        }
    }

    #[test]
    fn a_clean_log_passes() {
        let clean = evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r1", Some(3), 0, 2),
                change(3, "r0", Some(2), 3, 8),
            ],
            &[1, 2, 3],
            &[("r0", 8), ("r1", 2)],
        );
        let report = check(&clean);
        assert_eq!(report.grade(), Grade::Pass, "{report:?}");
        assert_eq!(report.good_changes, 3);
    }

    #[test]
    fn a_write_computed_from_a_stale_read_is_a_stale_write_with_what_it_erased() {
        // Job 1 read 0 and was paused; job 2 wrote 5; job 1's 3 landed over it.
        let stale = evidence(
            vec![
                change(1, "r0", Some(2), 0, 5),
                change(2, "r0", Some(1), 5, 3),
                change(3, "r1", Some(3), 0, 2),
            ],
            &[1, 2, 3],
            &[("r0", 3), ("r1", 2)],
        );
        let report = check(&stale);
        assert_eq!(report.grade(), Grade::Fail);
        assert_eq!(report.problems.len(), 1, "{report:?}");
        let line = report.problems[0].describe();
        assert!(
            line.contains("read of 0") && line.contains("not from the 5"),
            "{line}"
        );
    }

    #[test]
    fn a_job_applied_twice_is_doubled_and_an_acknowledged_job_without_a_change_is_lost() {
        let doubled = evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r0", Some(1), 3, 6),
                change(3, "r0", Some(2), 6, 11),
            ],
            &[1, 2, 3],
            &[("r0", 11), ("r1", 0)],
        );
        let kinds: Vec<&str> = check(&doubled).problems.iter().map(|p| p.kind()).collect();
        assert_eq!(kinds, vec!["doubled", "lost"], "job 3 acked, never written");
    }

    #[test]
    fn a_job_nobody_did_is_never_done_and_an_untagged_change_fails() {
        let untagged = evidence(
            vec![change(1, "r0", None, 0, 3), change(2, "r0", Some(99), 3, 8)],
            &[],
            &[("r0", 8), ("r1", 0)],
        );
        let kinds: Vec<&str> = check(&untagged).problems.iter().map(|p| p.kind()).collect();
        assert_eq!(
            kinds,
            vec![
                "untagged",
                "untagged",
                "never-done",
                "never-done",
                "never-done"
            ]
        );
    }

    #[test]
    fn a_record_changed_outside_the_log_and_faults_that_never_played_are_named() {
        let mut outside = evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r0", Some(2), 3, 8),
                change(3, "r1", Some(3), 0, 2),
            ],
            &[1, 2, 3],
            &[("r0", 9), ("r1", 2)],
        );
        assert_eq!(check(&outside).problems[0].kind(), "log-disagrees");
        outside.finals[0].1 = 8;
        outside.faults_played = 0;
        let report = check(&outside);
        assert_eq!(
            report.grade(),
            Grade::Undecided,
            "a clean log under no fault"
        );
    }
}
