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
//! - **stuck lock** (crash): a client killed holding its lock, and the next client that
//!   wanted that record waited longer than the bound for it (seen from the clients' notes).
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
    /// The clients' locks as their notes and the run saw them, in time order.
    pub moments: Vec<LockMoment>,
    /// How long a lock whose holder was killed may keep the next client waiting (none: not
    /// checked).
    pub stuck_bound_ms: Option<u64>,
}

/// One moment of a client's lock on a record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LockMoment {
    pub t_ms: u64,
    pub client: String,
    pub record: String,
    pub what: Moment,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Moment {
    /// A job on the record was sent to the client: from now it wants the lock.
    Wants,
    Acquired,
    Released,
    /// The client was killed while it had a job on the record.
    Killed,
}

/// A broken rule, with its evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
    StuckLock {
        record: String,
        dead: String,
        waiter: String,
        waited_ms: u64,
        bound_ms: u64,
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
            Problem::StuckLock { .. } => "stuck-lock",
        }
    }

    /// The job it is about, where it names one.
    pub fn job(&self) -> Option<i64> {
        match self {
            Problem::StaleWrite { job, .. }
            | Problem::Doubled { job, .. }
            | Problem::Lost { job }
            | Problem::NeverDone { job } => Some(*job),
            Problem::Untagged { job, .. } => *job,
            Problem::LogDisagrees { .. } | Problem::StuckLock { .. } => None,
        }
    }

    /// Is the logged change `seq` (of `job`) one this finding names? A stale write or an
    /// untagged change names its change; a doubled effect, every change of its job.
    pub fn names_change(&self, seq: Option<i64>, job: Option<i64>) -> bool {
        match self {
            Problem::StaleWrite { seq: named, .. } | Problem::Untagged { seq: named, .. } => {
                seq == Some(*named)
            }
            Problem::Doubled { job: named, .. } => job == Some(*named),
            _ => false,
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
            Problem::StuckLock {
                record,
                dead,
                waiter,
                waited_ms,
                bound_ms,
            } => format!(
                "stuck lock: {dead} was killed holding the lock of {record}, and {waiter} \
                 waited {waited_ms}ms for it (the bound is {bound_ms}ms)"
            ),
        }
    }
}

/// The verdict's one word, and the exit status it maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

impl Grade {
    /// The word the terminal prints it as.
    pub fn word(self) -> &'static str {
        match self {
            Grade::Pass => "PASS",
            Grade::Fail => "FAIL",
            Grade::Undecided => "UNDECIDED",
        }
    }
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
    if let Some(bound_ms) = evidence.stuck_bound_ms {
        report
            .problems
            .extend(stuck_locks(&evidence.moments, bound_ms));
    }
    if evidence.faults_played < evidence.faults_planned {
        report.undecided.push(format!(
            "{} of {} faults played: the client never reached the moment the others aim at",
            evidence.faults_played, evidence.faults_planned
        ));
    }
    report
}

/// Each lock whose holder was killed holding it: how long the next client to take it had
/// waited — from its job on the record, or from the kill if it wanted it before.
fn stuck_locks(moments: &[LockMoment], bound_ms: u64) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (i, kill) in moments.iter().enumerate() {
        if kill.what != Moment::Killed {
            continue;
        }
        let held = moments[..i]
            .iter()
            .rev()
            .find(|m| m.client == kill.client && m.record == kill.record)
            .is_some_and(|m| m.what == Moment::Acquired);
        if !held {
            continue;
        }
        let later = &moments[i + 1..];
        let Some(next) = later
            .iter()
            .find(|m| m.record == kill.record && m.what == Moment::Acquired)
        else {
            continue;
        };
        let wanted = moments
            .iter()
            .filter(|m| m.client == next.client && m.record == kill.record)
            .filter(|m| m.what == Moment::Wants && m.t_ms <= next.t_ms)
            .map(|m| m.t_ms)
            .next_back()
            .unwrap_or(kill.t_ms);
        let waited_ms = next.t_ms.saturating_sub(wanted.max(kill.t_ms));
        if waited_ms > bound_ms {
            problems.push(Problem::StuckLock {
                record: kill.record.clone(),
                dead: kill.client.clone(),
                waiter: next.client.clone(),
                waited_ms,
                bound_ms,
            });
        }
    }
    problems
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
            ..Evidence::default()
        }
    }

    fn moment(t_ms: u64, client: &str, what: Moment) -> LockMoment {
        LockMoment {
            t_ms,
            client: client.into(),
            record: "r0".into(),
            what,
        }
    }

    #[test]
    fn a_lock_whose_dead_holder_keeps_the_next_client_waiting_past_the_bound_is_stuck() {
        use Moment::*;
        let mut run = evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r0", Some(2), 3, 8),
                change(3, "r1", Some(3), 0, 2),
            ],
            &[1, 2, 3],
            &[("r0", 8), ("r1", 2)],
        );
        // c1 dies holding r0 at 100ms; c2 wanted r0 from 50ms, took it at 700ms.
        run.moments = vec![
            moment(0, "c1", Wants),
            moment(10, "c1", Acquired),
            moment(50, "c2", Wants),
            moment(100, "c1", Killed),
            moment(700, "c2", Acquired),
        ];
        run.stuck_bound_ms = Some(2000);
        assert_eq!(check(&run).grade(), Grade::Pass, "600ms is within 2s");
        run.stuck_bound_ms = Some(500);
        let report = check(&run);
        assert_eq!(report.problems.len(), 1, "{report:?}");
        let line = report.problems[0].describe();
        assert!(
            line.contains("c1 was killed") && line.contains("c2 waited 600ms"),
            "{line}"
        );
        // Killed after it released: no lock of its was left, however long c2 waited after.
        run.moments.insert(3, moment(90, "c1", Released));
        assert_eq!(check(&run).grade(), Grade::Pass);
        // A client that wanted it only later waited from its own job, not from the kill.
        run.moments.remove(3);
        run.moments[2].t_ms = 650;
        run.moments.swap(2, 3);
        assert_eq!(check(&run).grade(), Grade::Pass, "50ms of waiting");
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
