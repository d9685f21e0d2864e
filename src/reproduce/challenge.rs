//! A recorded `lockslab challenge` run graded again by [`crate::check::challenge`]: from the
//! typed events, the jobs, the clients' `ok`s and every reading of the servers — the
//! database's log of changes and statements and each record's final value and items
//! (`log_read_back`), the waits, locks and aborted transactions seen while faults lasted;
//! and from the evidence the verdict carries, the rest the grade weighed — the clients'
//! lock notes, each fault as it began. A run recorded before the verdict carried its evidence is
//! graded on what the history and the change log decide (the problems in the data), and
//! the rest is left as recorded.

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::Value;

use crate::check::challenge::{Change, Evidence, Final, Grade, JobSpec, Problem, check, graded};
use crate::check::report::{Finding, Outcome, Report};
use crate::events::{Event, What};
use crate::labs::replay::{self, Replayed};

/// What the replay decides of a challenge run.
#[derive(Serialize)]
struct Graded {
    jobs: usize,
    acknowledged: usize,
    problems: Vec<Problem>,
}

/// What the replay decides of a challenge run whose verdict carries its evidence: the grade
/// itself, and every field it rests on.
#[derive(Serialize)]
struct GradedWhole {
    jobs: usize,
    acknowledged: usize,
    problems: Vec<Problem>,
    unknown: Vec<String>,
    faults_bit: usize,
    grade: Grade,
}

/// The evidence the verdict carries (none: recorded before it did), with the `ok`s the
/// history holds in place of the verdict's copy. Its jobs are the run's, sent or not (a run
/// cut short by its client sent only some); each job the history sent must be among them.
fn carried(events: &[Event], verdict: &Value) -> Result<Option<Evidence>> {
    let Some(carried) = verdict.get("evidence").filter(|e| !e.is_null()) else {
        return Ok(None);
    };
    let mut evidence: Evidence = serde_json::from_value(carried.clone())
        .context("the verdict's `evidence` is not the grader's")?;
    let (sent, acknowledged) = jobs_and_oks(events)?;
    if let Some(job) = sent.iter().find(|sent| !evidence.jobs.contains(sent)) {
        bail!(
            "job {} was sent as the history says, but the verdict's evidence has it \
             otherwise, or not at all",
            job.id
        );
    }
    evidence.acknowledged = acknowledged;
    let logs = (events.iter())
        .filter(|e| matches!(e.what, What::LogReadBack(_)))
        .count();
    match logs {
        // A recording from before the readings were events carries the log in its evidence.
        0 if carried.get("changes").is_none() => bail!(
            "the history holds no `log_read_back` (the database's log, read back at the end), \
             and the verdict's evidence no copy of it: nothing to grade the run on — was the \
             file cut short or edited?"
        ),
        0 | 1 => {}
        _ => bail!(
            "the history holds {logs} `log_read_back` lines, where a run reads its log back \
             once: was the file edited, or two runs joined?"
        ),
    }
    lay_readings(&mut evidence, events);
    Ok(Some(evidence))
}

/// Lays into `evidence` the readings of the servers that `events` hold: the log read back
/// at the end (`log_read_back`), and, while faults lasted, the waits, the locks held, the
/// clients waiting behind a key and the transactions Postgres aborted. A history without
/// the log read back is a recording from before these were events: its evidence keeps the
/// copies it carries. The live grade lays them the same way.
pub fn lay_readings(evidence: &mut Evidence, events: &[Event]) {
    let log = events.iter().rev().find_map(|event| match &event.what {
        What::LogReadBack(log) => Some(log),
        _ => None,
    });
    let Some(log) = log else {
        return;
    };
    evidence.changes = log.changes.clone();
    evidence.finals = log.finals.clone();
    evidence.statements = log.statements.clone();
    evidence.waits.clear();
    evidence.key_waits.clear();
    evidence.pg_locks.clear();
    evidence.sessions_around.clear();
    for event in events {
        match &event.what {
            What::PgWaitSeen(wait) => evidence.waits.push(wait.clone()),
            What::PgLockSeen(lock) => evidence.pg_locks.push(lock.clone()),
            What::KeyWaitSeen(wait) => evidence.key_waits.push(wait.clone()),
            What::PgAborted(aborted) => evidence.statements.push(aborted.clone()),
            What::SessionAroundProxy(session) => evidence.sessions_around.push(session.clone()),
            _ => {}
        }
    }
    // A stable sort: the log's own order stands among statements of the same moment.
    evidence.statements.sort_by_key(|statement| statement.at_us);
}

fn client_failed(verdict: &Value) -> bool {
    verdict.get("client_failure").is_some_and(|f| !f.is_null())
}

pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let challenge = verdict["challenge"].as_str().unwrap_or("challenge");
    if let Some(evidence) = carried(events, verdict)? {
        let (report, grade) = graded(&evidence, client_failed(verdict));
        let mut replayed = Replayed::default();
        let whole = GradedWhole {
            jobs: evidence.jobs.len(),
            acknowledged: evidence.acknowledged.len(),
            problems: report.problems,
            unknown: report.undecided,
            faults_bit: report.faults_bit,
            grade,
        };
        replayed.part(format!("challenge {challenge}"), verdict, whole);
        return Ok(replayed);
    }
    let evidence = evidence_of_the_data(events, verdict)?;
    let report = check(&evidence);
    let mut replayed = Replayed::default();
    let graded = Graded {
        jobs: evidence.jobs.len(),
        acknowledged: evidence.acknowledged.len(),
        problems: report.problems.clone(),
    };
    let part = replayed.part(format!("challenge {challenge}"), verdict, graded);
    // A grade of FAIL is decided by the problems alone; PASS or UNKNOWN also weighs what
    // the history does not carry.
    if !report.problems.is_empty() {
        part.replayed.insert("grade".into(), "fail".into());
    }
    replayed.not_replayed.push(BEYOND_THE_DATA.into());
    Ok(replayed)
}

/// What the live grade weighs that the `--json` does not carry.
const BEYOND_THE_DATA: &str = "what the grade weighs besides the data (the clients' lock \
     notes, the statements, which faults bit): the --json does not carry that evidence, so \
     `unknown`, `faults_bit` and a grade without problems are as recorded";

/// The grader over a challenge's `--json`, as one [`Report`]: each problem it finds in the
/// data an invalid finding at the events of its job (the job sent, the client's answers);
/// each question the grade leaves open an unknown one. With the evidence the verdict
/// carries, a run with neither is a valid finding; a run recorded without it gets an unknown
/// finding for what the grade weighs besides the data — never a pass from the history alone.
pub fn report(events: &[Event], verdict: &Value) -> Result<Report> {
    let whole = carried(events, verdict)?;
    let graded = match &whole {
        Some(evidence) => graded(evidence, client_failed(verdict)).0,
        None => check(&evidence_of_the_data(events, verdict)?),
    };
    let of_job = |job: Option<i64>| {
        (0..events.len()).filter(move |&i| {
            matches!(&events[i].what, What::JobSent(j) | What::JobAnswered(j)
                if Some(j.job) == job)
        })
    };
    let mut report = Report::of(graded.problems.iter().map(|problem| {
        Finding::new(
            problem.kind(),
            Outcome::Invalid,
            problem.describe(),
            of_job(problem.job()),
        )
    }));
    for why in &graded.undecided {
        report.push(Finding::new("unknown", Outcome::Unknown, why, []));
    }
    if whole.is_some() && graded.problems.is_empty() && graded.undecided.is_empty() {
        report.push(Finding::new(
            "graded",
            Outcome::Valid,
            "every job's effect is in the data once, and every fault that played bit",
            [],
        ));
    } else if whole.is_none() && graded.problems.is_empty() {
        report.push(Finding::new(
            "beyond the data",
            Outcome::Unknown,
            BEYOND_THE_DATA,
            [],
        ));
    }
    Ok(report)
}

/// The jobs the history sent (first deliveries, by id) and those a client answered `ok`.
fn jobs_and_oks(events: &[Event]) -> Result<(Vec<JobSpec>, BTreeSet<i64>)> {
    let sent = events.iter().filter_map(|e| match &e.what {
        What::JobSent(job) => Some(job),
        _ => None,
    });
    if sent.clone().next().is_some() && sent.clone().all(|job| job.append.is_none()) {
        bail!(
            "it was recorded before a challenge's jobs appended to their record's items, and \
             this lockslab's grader weighs those items: it would grade every change as one \
             that appended nothing. Record the challenge again with this lockslab to check it"
        );
    }
    let (mut jobs, mut acknowledged) = (Vec::new(), BTreeSet::new());
    for event in events {
        match &event.what {
            What::JobSent(job) if job.resent.is_none() => jobs.push(JobSpec {
                id: job.job,
                record: job
                    .record
                    .clone()
                    .context("a job sent without its record")?,
                add: job.add.context("a job sent without what it adds")?,
                append: job.append.clone().unwrap_or_default(),
            }),
            What::JobAnswered(job) if job.ok == Some(true) => {
                acknowledged.insert(job.job);
            }
            _ => {}
        }
    }
    jobs.sort_by_key(|j| j.id);
    Ok((jobs, acknowledged))
}

/// The grader's evidence out of a recorded run: the jobs and the clients' `ok`s from the
/// history, the change log and the faults from the verdict.
fn evidence_of_the_data(events: &[Event], verdict: &Value) -> Result<Evidence> {
    let (jobs, acknowledged) = jobs_and_oks(events)?;
    let mut evidence = Evidence {
        jobs,
        acknowledged,
        ..Evidence::default()
    };
    evidence.changes = serde_json::from_value::<Vec<Change>>(verdict["changes"].clone())
        .context("the verdict carries no log of changes (`changes`)")?;
    let mut records: Vec<&str> = evidence.jobs.iter().map(|j| j.record.as_str()).collect();
    records.sort_unstable();
    records.dedup();
    for record in records {
        let last = evidence.changes.iter().rev().find(|c| c.record == record);
        evidence.finals.push(Final {
            record: record.into(),
            value: last.map_or(0, |c| c.new_value),
            items: last.map(|c| c.new_items.clone()).unwrap_or_default(),
        });
    }
    evidence.faults_planned = replay::number(verdict, "faults_planned")? as usize;
    evidence.faults_played = replay::number(verdict, "faults_played")? as usize;
    Ok(evidence)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The readings of the servers travel in the history: written as `--json` lines and
    /// read back, they lay into the evidence what the live grade weighed — an aborted
    /// transaction among the statements in time order, a lock's kind beside the event's.
    #[test]
    fn the_servers_readings_in_a_history_are_the_evidence_the_grade_weighs() {
        use crate::check::challenge::{Final, LogBack, PgLockKind, PgLockSeen, Statement, Wait};
        let statement = |pid, at_us, rows, aborted: Option<&str>| Statement {
            pid,
            at_us,
            rows,
            changed: None,
            aborted: aborted.map(str::to_string),
        };
        let log = LogBack {
            changes: Vec::new(),
            statements: vec![statement(7, 100, 1, None), statement(8, 300, 0, None)],
            finals: vec![Final {
                record: "r0".into(),
                value: 3,
                items: vec!["j1".into()],
            }],
        };
        let lock = PgLockSeen {
            session: 7,
            kind: PgLockKind::Row,
            record: Some("r0".into()),
            at_us: 150,
            asking: vec![8],
        };
        let wait = Wait {
            waiter: 8,
            blockers: vec![7],
            at_us: 160,
        };
        let aborted = statement(8, 200, 0, Some("40001: could not serialize access"));
        let history = [
            Event::new("lab", What::PgLockSeen(lock.clone()), ""),
            Event::new("lab", What::PgWaitSeen(wait.clone()), ""),
            Event::new("c2", What::PgAborted(aborted.clone()), "aborted"),
            Event::new("store", What::LogReadBack(log.clone()), ""),
        ];
        let lines: Vec<String> = (history.iter())
            .map(|event| serde_json::to_string(event).unwrap())
            .collect();
        assert!(
            lines[0].contains(r#""kind":"pg_lock_seen""#),
            "{}",
            lines[0]
        );
        assert!(lines[0].contains(r#""lock":"row""#), "{}", lines[0]);
        let read: Vec<Event> = (lines.iter())
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        let mut evidence = Evidence::default();
        lay_readings(&mut evidence, &read);
        assert_eq!(evidence.finals, log.finals);
        assert_eq!(evidence.pg_locks, vec![lock]);
        assert_eq!(evidence.waits, vec![wait]);
        assert_eq!(
            evidence.statements,
            vec![
                log.statements[0].clone(),
                aborted,
                log.statements[1].clone()
            ]
        );
        // The verdict's copy leaves the readings to the history.
        let carried = serde_json::to_value(&evidence).unwrap();
        for field in [
            "changes",
            "finals",
            "statements",
            "waits",
            "key_waits",
            "pg_locks",
        ] {
            assert!(carried.get(field).is_none(), "{field} in {carried}");
        }
        // A recording from before the readings were events keeps the evidence's copies.
        let mut older = evidence.clone();
        lay_readings(&mut older, &read[..3]);
        assert_eq!(older, evidence);
    }
}
