//! Lab 3's verdict: one row per claiming mode, read back from the processing table, and the
//! sentences that say what the numbers mean. The decisions behind the sentences (a job
//! reclaimed or lost, a frozen job kept or refused, a queue stalled) are made by the
//! checkers in [`crate::check::skip_locked`]; this file only words them.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::Fault;
use crate::check::Processed;
use crate::check::report::{self, Report};
use crate::check::skip_locked::{self as checks, Around, Freeze, FrozenJob, KillOutcome};
use crate::events::{Event, Kind, What};
use crate::labs::replay::{self, Replayed};
use crate::labs::runner;
use crate::labs::words::Words;
use crate::output::{count, human};
use crate::queue::Mode;

/// One mode's verdict: exactly the fields of the `--json` verdict's `modes` array.
#[derive(Serialize, Clone, Debug)]
pub struct ModeVerdict {
    pub mode: Mode,
    /// Jobs put through the queue, all rounds together.
    pub jobs: i64,
    /// Jobs processed twice or more.
    pub duplicates: i64,
    /// Jobs never processed.
    pub lost: i64,
    /// The first round's speed (no faults): jobs done per second.
    pub jobs_per_s: f64,
    /// From the kill until another worker claimed the killed worker's job; None when there
    /// was no kill, or when the job was never claimed again.
    pub reclaim_ms: Option<f64>,
}

/// One mode's history judged again by the lab's checkers: the processing table's counts
/// (its `pg` line), what became of the killed worker's job and of the frozen one's.
#[derive(Clone, Debug)]
pub struct ModeReplayed {
    pub processed: Processed,
    pub kill: Option<KillOutcome>,
    pub frozen: Option<FrozenJob>,
}

impl ModeReplayed {
    /// The row of the verdict this mode's history decides.
    fn row(&self) -> Value {
        let reclaim_ms = match &self.kill {
            Some(KillOutcome::Reclaimed { after_ms, .. }) => Some(*after_ms),
            _ => None,
        };
        json!({
            "jobs": self.processed.jobs,
            "duplicates": self.processed.duplicates,
            "lost": self.processed.lost,
            "reclaim_ms": reclaim_ms,
        })
    }
}

/// Judges one mode again from its events: the count line the lab read from the processing
/// table, the nemesis's kill and Postgres's word on the killed job (`reclaimed` or
/// `job_lost`), the freeze and the table's final record of the frozen job.
pub fn replay_mode(log: &[Event]) -> Result<ModeReplayed> {
    let find = |kind: Kind| log.iter().find(|e| e.kind() == kind);
    let count =
        find(Kind::TablesRead).context("the processing table's count is not in the history")?;
    let said = count.observed().context("a count without its figures")?;
    let figure = |n: Option<u64>| n.map(|n| n as i64).context("a count without its figures");
    let (once, duplicates, lost) = (
        figure(said.once)?,
        figure(said.duplicates)?,
        figure(said.lost)?,
    );
    let processed = Processed {
        // Every job was processed once, twice or more, or never.
        jobs: once + duplicates + lost,
        once,
        duplicates,
        lost,
    };
    let kill = find(Kind::Killed)
        .and_then(|e| e.fault()?.target.clone())
        .map(|victim| {
            checks::kill_outcome(&checks::Kill {
                first_claim: find(Kind::Reclaimed).and_then(|e| match &e.what {
                    What::Reclaimed(h) => Some((h.by.clone()?, h.reclaim_ms?)),
                    _ => None,
                }),
                row: killed_job_row(log).and_then(|at| match &log[at].what {
                    What::JobRead(fate) => Some((fate.status.clone()?, fate.claimed_by.clone())),
                    _ => None,
                }),
                dead: vec![victim.clone()],
                victim,
            })
        });
    let frozen = match find(Kind::Frozen).and_then(|e| e.fault()?.target.clone()) {
        Some(sleeper) => {
            let Some(What::JobRead(result)) = frozen_job_read(log).map(|at| &log[at].what) else {
                bail!("the frozen job's record is not in the history");
            };
            Some(checks::frozen_job(&Freeze {
                by: result.by.clone().unwrap_or_default(),
                processed_while_frozen: result.frozen_job_processed_while_frozen.unwrap_or(0)
                    as i64,
                session_ended: find(Kind::Expired).is_some(),
                finish_failed: log.iter().any(|e| e.is(&sleeper, Kind::FinishFailed)),
                sleeper,
            }))
        }
        None => None,
    };
    Ok(ModeReplayed {
        processed,
        kill,
        frozen,
    })
}

/// `lockslab check`: each mode judged again from its own events (picked by its `mode` tag)
/// by [`replay_mode`]; the line the lab wrote from the processing table against what the
/// checker makes of its figures.
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let mut replayed = Replayed::default();
    for recorded in replay::list(verdict, "modes")? {
        let mode = replay::text(recorded, "mode")?;
        let log = replay::part_of(events, |e| e.part.mode.as_deref() == Some(mode));
        let found = replay_mode(&log)?;
        replayed.part(format!("mode {mode}"), recorded, found.row());
    }
    Ok(replayed)
}

/// Lab 3's checker: the whole history, every claiming mode in it, judged as one [`Report`].
///
/// Each mode (its events picked by their `mode` tag, as [`replay`] picks them) is judged by
/// [`replay_mode`], the code its row is replayed with, and gives up to three findings:
///
/// - **exactly once**: the processing table's count — every job processed once, none twice,
///   none never;
/// - **killed worker's job** (a round with a kill): Postgres rolled the dead worker's claim
///   back and another worker claimed the job, or the job is stuck behind a dead holder;
/// - **frozen worker's job** (a round with a freeze): the job stayed its worker's, or its
///   late write was refused, or it was processed by someone else — once (fine) or not.
///
/// A mode whose history lacks its count is unknown, with the reason. Each finding's events
/// are positions in `history`.
pub fn check(history: &[Event]) -> Report {
    let mut modes: Vec<&str> = Vec::new();
    for event in history {
        if let Some(mode) = event.part.mode.as_deref()
            && !modes.contains(&mode)
        {
            modes.push(mode);
        }
    }
    Report::compose(modes.into_iter().map(|mode| {
        let (positions, log) =
            replay::part_with_positions(history, |e| e.part.mode.as_deref() == Some(mode));
        // Positions in the mode's own events, moved to positions in the whole history.
        check_mode(&log)
            .placed(&positions)
            .about(&format!("mode {mode}"))
    }))
}

/// One mode's findings; event positions are in `log`.
fn check_mode(log: &[Event]) -> Report {
    let found = match replay_mode(log) {
        Ok(found) => found,
        Err(why) => return Report::evidence_missing(format!("{why:#}")),
    };
    let at = |kind: Kind| log.iter().position(|e| e.kind() == kind);
    let mut report = Report::default();
    let once = checks::every_job_once(&found.processed);
    report.push(report::Finding::new(
        "exactly once",
        if once {
            report::Outcome::Valid
        } else {
            report::Outcome::Invalid
        },
        format!(
            "the processing table: {} jobs, {} processed once, {} twice or more, {} never",
            found.processed.jobs,
            found.processed.once,
            found.processed.duplicates,
            found.processed.lost
        ),
        at(Kind::TablesRead),
    ));
    if let Some(kill) = &found.kill {
        report.push(killed_job(kill, &at, killed_job_row(log)));
    }
    if let Some(frozen) = &found.frozen {
        report.push(frozen_job(frozen, log, &at));
    }
    report
}

/// What became of the job a killed worker held: Postgres's word on it decides.
fn killed_job(
    kill: &KillOutcome,
    at: &dyn Fn(Kind) -> Option<usize>,
    row_at: Option<usize>,
) -> report::Finding {
    let (outcome, words, proof) = match kill {
        KillOutcome::Reclaimed { by, after_ms } => (
            report::Outcome::Valid,
            format!(
                "Postgres rolled the dead worker's claim back: {by} claimed the job {after_ms:.0} ms \
                 after the kill"
            ),
            at(Kind::Reclaimed),
        ),
        KillOutcome::Lost { status, .. } => (
            report::Outcome::Invalid,
            format!("nobody claimed the job again: its row still says `{status}`"),
            row_at,
        ),
        KillOutcome::Unknown => (
            report::Outcome::Unknown,
            "no other worker claimed the job and no row settles it".to_string(),
            None,
        ),
    };
    report::Finding::new(
        "killed worker's job",
        outcome,
        words,
        [at(Kind::Killed), proof].into_iter().flatten(),
    )
}

/// Where in `log` the processing table's record of the frozen worker's job is: the
/// `job_read` of the job the freeze names (a round with a kill reads its job too).
/// Where `log` holds the killed worker's job's row as the jobs table answered it (its
/// status, who claimed it), read when no other worker claimed the job.
fn killed_job_row(log: &[Event]) -> Option<usize> {
    let killed = log.iter().find(|e| e.kind() == Kind::Killed)?.job();
    log.iter().position(|e| {
        matches!(&e.what, What::JobRead(fate)
            if fate.status.is_some() && killed.is_none_or(|job| fate.job == Some(job)))
    })
}

fn frozen_job_read(log: &[Event]) -> Option<usize> {
    let frozen = log.iter().find(|e| e.kind() == Kind::Frozen)?.job();
    log.iter()
        .position(|e| matches!(&e.what, What::JobRead(fate) if frozen.is_none_or(|job| fate.job == Some(job))))
}

/// What became of the job a frozen worker held: the table's final record of it, and the
/// sleeper's own fate after the resume.
fn frozen_job(
    frozen: &FrozenJob,
    log: &[Event],
    at: &dyn Fn(Kind) -> Option<usize>,
) -> report::Finding {
    let mut events = vec![at(Kind::Frozen), frozen_job_read(log)];
    let (outcome, words) = match frozen {
        FrozenJob::Refused { .. } => {
            events.push(log.iter().position(|e| e.kind() == Kind::FinishFailed));
            (
                report::Outcome::Valid,
                "the frozen worker's late write was refused: Postgres had ended its session",
            )
        }
        FrozenJob::Kept => (
            report::Outcome::Valid,
            "nobody touched the frozen worker's job, and it finished the job once",
        ),
        FrozenJob::Moved => {
            // Someone else processed it: harmless once, a duplicate more often than that.
            let times = events[1]
                .and_then(|i| match &log[i].what {
                    What::JobRead(fate) => fate.by.as_ref().map(Vec::len),
                    _ => None,
                })
                .unwrap_or(0);
            if times == 1 {
                (
                    report::Outcome::Valid,
                    "another worker took the frozen worker's job over and processed it once",
                )
            } else {
                (
                    report::Outcome::Invalid,
                    "the frozen worker's job was processed other than once",
                )
            }
        }
    };
    report::Finding::new(
        "frozen worker's job",
        outcome,
        words,
        events.into_iter().flatten(),
    )
}

/// What the freeze round measured, for the sentence under the table.
#[derive(Clone, Debug, Default)]
pub(super) struct FreezeNotes {
    /// The frozen job's record: who processed it, what happened to the sleeper's session.
    pub(super) evidence: Freeze,
    /// Jobs the others processed while it was frozen.
    pub(super) others_done: i64,
    /// Worker sessions blocked behind the frozen one just before the resume (pg_blocking_pids).
    pub(super) blocked_at_resume: i64,
    /// Jobs in the freeze round, the frozen one included.
    pub(super) jobs: u32,
}

/// One mode as it played: its verdict, and the freeze round's notes if there was one.
#[derive(Clone, Debug)]
pub(super) struct Played {
    pub(super) verdict: ModeVerdict,
    pub(super) freeze: Option<FreezeNotes>,
}

/// Every mode of the run.
pub struct Verdict {
    pub(super) modes: Vec<Played>,
    pub(super) pause: Duration,
    pub(super) fault: Fault,
}

impl runner::Verdict for Verdict {
    fn fields(&self) -> Map<String, Value> {
        let modes: Vec<&ModeVerdict> = self.modes.iter().map(|m| &m.verdict).collect();
        let mut fields = Map::new();
        fields.insert(
            "modes".into(),
            serde_json::to_value(modes).unwrap_or_default(),
        );
        fields
    }

    fn words(&self) -> Words {
        verdict_words(self)
    }

    /// Each mode's jobs as the processing table counted them: `skip-locked: each job
    /// once · naive: jobs done twice`.
    fn headline(&self) -> String {
        let modes: Vec<String> = self
            .modes
            .iter()
            .map(|m| {
                let v = &m.verdict;
                let outcome = match (v.duplicates > 0, v.lost > 0) {
                    (false, false) => "each job once",
                    (true, false) => "jobs done twice",
                    (false, true) => "jobs lost",
                    (true, true) => "jobs done twice and lost",
                };
                format!("{}: {outcome}", v.mode.name())
            })
            .collect();
        modes.join(" · ")
    }

    fn checkpoint(&self) -> Option<&'static crate::labs::step::Checkpoint> {
        Some(&crate::labs::step::skip_locked::VERDICT)
    }
}

/// The verdict's words: a row per mode, then a sentence on each mode.
fn verdict_words(verdict: &Verdict) -> Words {
    let header = [
        "mode",
        "jobs",
        "processed twice+",
        "lost",
        "jobs/s (round 1)",
        "kill → reclaimed",
    ];
    let count = |n: i64| {
        if n == 0 {
            "0".green().to_string()
        } else {
            n.to_string().red().bold().to_string()
        }
    };
    let rows: Vec<Vec<String>> = verdict
        .modes
        .iter()
        .map(|m| &m.verdict)
        .map(|v| {
            vec![
                v.mode.name().to_string(),
                v.jobs.to_string(),
                count(v.duplicates),
                count(v.lost),
                format!("{:.0}", v.jobs_per_s),
                match (v.reclaim_ms, verdict.fault.kills()) {
                    (Some(ms), _) => format!("{ms:.1}ms"),
                    (None, true) => "never".red().bold().to_string(),
                    (None, false) => "-".to_string(),
                },
            ]
        })
        .collect();
    let mut words = Words::titled_table(
        "Verdict (read back from the processing table)",
        &header,
        rows,
    );
    let fastest = verdict
        .modes
        .iter()
        .map(|m| m.verdict.jobs_per_s)
        .fold(0.0_f64, f64::max);
    for played in &verdict.modes {
        words.about(
            played.verdict.mode.name(),
            meaning(verdict.pause, played, fastest),
        );
    }
    words
}

/// One sentence (or two) on what a mode's numbers mean.
fn meaning(pause: Duration, played: &Played, fastest: f64) -> String {
    let v = &played.verdict;
    let mut parts = Vec::new();
    if v.duplicates == 0 && v.lost == 0 {
        parts.push("every job was processed exactly once.".to_string());
    }
    if v.duplicates > 0 {
        parts.push(format!(
            "{} processed twice or more: workers read the same pending id before any of \
             them marked it.",
            count(v.duplicates, "job was", "jobs were")
        ));
    }
    if v.lost > 0 {
        parts.push(format!(
            "{} never processed: the killed worker's 'running' mark outlives it, and \
             only a timeout (a lease, with its TTL guess) could hand it back.",
            count(v.lost, "job was", "jobs were")
        ));
    }
    if let Some(ms) = v.reclaim_ms {
        parts.push(format!(
            "The killed worker's job was claimed again {ms:.1}ms after the kill: Postgres rolled \
             its transaction back when the connection closed{}.",
            reclaim_how(v.mode)
        ));
    }
    if v.mode == Mode::ForUpdate && checks::noticeably_slower(v.jobs_per_s, fastest) {
        parts.push(format!(
            "At {:.0} jobs/s against {:.0}: the workers queue behind one row lock, one at a time.",
            v.jobs_per_s, fastest
        ));
    }
    if let Some(freeze) = &played.freeze {
        parts.push(freeze_sentence(pause, v.mode, freeze));
    }
    parts.join(" ")
}

/// What became of the frozen worker's job, as [`checks::frozen_job`] decided it.
fn freeze_sentence(pause: Duration, mode: Mode, note: &FreezeNotes) -> String {
    let freeze = &note.evidence;
    let by = &freeze.by;
    match checks::frozen_job(freeze) {
        FrozenJob::Refused { during_freeze } => {
            let when = if during_freeze {
                "during the freeze"
            } else {
                "around the resume (its idle timeout ran out within moments of the pause)"
            };
            format!(
                "Postgres ended the frozen worker's session {when}; its first statement after \
                 waking (the INSERT) failed, and the job was {}{}",
                processed(by),
                if by.len() == 1 {
                    ": still nothing twice."
                } else {
                    "."
                }
            )
        }
        FrozenJob::Kept if mode.transactional() => format!(
            "The frozen worker kept its job for the whole {} pause, and finished it once; {}",
            human(pause),
            around_the_freeze(note)
        ),
        FrozenJob::Kept => "The frozen worker's job stayed 'running' until it woke: no \
                            transaction, no timeout, nothing would have freed it."
            .to_string(),
        FrozenJob::Moved => format!(
            "The frozen worker's job was {} (while {} was frozen: {}).",
            processed(by),
            freeze.sleeper,
            count(freeze.processed_while_frozen, "time", "times")
        ),
    }
}

/// What the others did while one worker was frozen, as [`checks::around_the_freeze`] decided it.
fn around_the_freeze(note: &FreezeNotes) -> String {
    let sessions = |n| count(n, "worker session was", "worker sessions were");
    match checks::around_the_freeze(note.others_done, note.blocked_at_resume, note.jobs) {
        Around::OnlyJob => {
            "it was the round's only job, so the others had nothing to do.".to_string()
        }
        Around::Idle => "the others processed nothing meanwhile, and none was blocked on its \
                         lock at the resume."
            .to_string(),
        Around::OnlyJobBlocked { blocked } => format!(
            "it was the round's only job, so there was no queue to stall; but without SKIP \
             LOCKED the others did not pass over it: at the resume {} waiting for its row lock.",
            sessions(blocked)
        ),
        Around::Stalled { blocked } => format!(
            "the whole queue stood still behind its row lock: the others processed nothing, \
             and at the resume {} blocked behind it.",
            sessions(blocked)
        ),
        Around::CarriedOn { done } => format!(
            "the others carried on around it ({}).",
            count(done, "job", "jobs")
        ),
        Around::Both { done, blocked } => format!(
            "the others processed {}, and at the resume {} blocked behind it.",
            count(done, "job", "jobs"),
            sessions(blocked)
        ),
    }
}

/// What the reclaim time measures besides Postgres's rollback, which differs by mode.
pub(super) fn reclaim_how(mode: Mode) -> String {
    match mode {
        Mode::SkipLocked => format!(
            ", and the next worker to poll took it (idle workers poll every {}, so up to that much of the time is their sleep)",
            human(crate::worker::consumer::IDLE_POLL)
        ),
        Mode::ForUpdate => {
            ", and woke the worker already waiting on its row (no polling in this number)".into()
        }
        Mode::Naive => String::new(),
    }
}

/// "processed exactly once by w3", "never processed".
pub(super) fn processed(by: &[String]) -> String {
    if by.is_empty() {
        "never processed".to_string()
    } else {
        format!("processed {} by {}", times(by.len()), by.join(", "))
    }
}

pub(super) fn times(n: usize) -> &'static str {
    match n {
        0 => "0 times",
        1 => "exactly once",
        2 => "TWICE",
        _ => "three times or more",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(by: &[&str], finish_failed: bool, jobs: u32, blocked: i64) -> FreezeNotes {
        FreezeNotes {
            evidence: Freeze {
                sleeper: "w1".into(),
                by: by.iter().map(|w| w.to_string()).collect(),
                finish_failed,
                ..Freeze::default()
            },
            jobs,
            blocked_at_resume: blocked,
            ..FreezeNotes::default()
        }
    }

    /// Issue 10, item 4: with an idle timeout just above the pause, nothing moves while the
    /// worker is frozen, then Postgres ends its session as it wakes, its INSERT fails and
    /// another worker does the job. The sentence must say that, not "kept its job".
    #[test]
    fn a_session_ended_at_the_resume_is_not_a_job_kept() {
        let sentence = freeze_sentence(
            Duration::from_secs(2),
            Mode::SkipLocked,
            &note(&["w4"], true, 50, 0),
        );
        assert!(!sentence.contains("kept its job"), "{sentence}");
        assert!(sentence.contains("failed"), "{sentence}");
        assert!(sentence.contains("w4"), "{sentence}");
    }

    #[test]
    fn a_job_finished_by_its_frozen_worker_was_kept() {
        let sentence = freeze_sentence(
            Duration::from_secs(2),
            Mode::SkipLocked,
            &note(&["w1"], false, 1, 0),
        );
        assert!(sentence.contains("kept its job"), "{sentence}");
    }

    /// Issue 11: with one job there is no queue to stall, whatever the blocked count.
    #[test]
    fn one_job_blocked_on_is_not_a_whole_queue_stalled() {
        let sentence = around_the_freeze(&note(&[], false, 1, 9));
        assert!(!sentence.contains("whole queue"), "{sentence}");
        assert!(sentence.contains("only job"), "{sentence}");
        assert!(around_the_freeze(&note(&[], false, 50, 9)).contains("whole queue"));
    }
}
