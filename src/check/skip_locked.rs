//! The checkers of lab `skip-locked`: pure functions from the evidence the servers gave to the
//! facts its verdict states (see [`super`] for the rules every checker follows).
//!
//! The evidence is what Postgres answered: the append-only processing table (who processed
//! which job, in which order), the jobs table's row for a job nobody took again,
//! `pg_stat_activity` (whether the frozen worker's session still existed) and
//! `pg_blocking_pids` (who waited behind its row lock). What a worker believed never counts.

use super::Processed;

/// Every job processed exactly once: none twice, none never (the processing table's counts).
pub fn every_job_once(processed: &Processed) -> bool {
    processed.duplicates == 0 && processed.lost == 0
}

// ─── The kill: a worker dies holding a job ───────────────────────────────────────────

/// What Postgres said of the killed worker's job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Kill {
    /// The worker the lab killed while it held the job.
    pub victim: String,
    /// The job's first processing in the processing table (by its claim time): who, and how
    /// many milliseconds after the kill by Postgres's own clock.
    pub first_claim: Option<(String, f64)>,
    /// The job's row once the round was over — status and `claimed_by` — read when nobody
    /// claimed it again.
    pub row: Option<(String, Option<String>)>,
    /// The workers gone by the end of the round.
    pub dead: Vec<String>,
}

/// What became of the killed worker's job.
#[derive(Clone, Debug, PartialEq)]
pub enum KillOutcome {
    /// Another worker claimed it: Postgres had rolled the victim's claim back.
    Reclaimed { by: String, after_ms: f64 },
    /// Nobody claimed it and nobody will: its row still says it is taken (or was never
    /// done). `holder_dead` when the row names a worker that is gone.
    Lost {
        status: String,
        holder: Option<String>,
        holder_dead: bool,
    },
    /// The evidence does not settle it (no claim by another worker, and no row read, or a
    /// row that says done with no processing to show for it).
    Unknown,
}

/// Decides [`KillOutcome`]: a claim by anyone but the victim is a reclaim; otherwise the
/// job's row, if it is not done, says who still holds it.
pub fn kill_outcome(kill: &Kill) -> KillOutcome {
    if let Some((by, after_ms)) = &kill.first_claim
        && *by != kill.victim
    {
        return KillOutcome::Reclaimed {
            by: by.clone(),
            after_ms: *after_ms,
        };
    }
    match &kill.row {
        Some((status, holder)) if status != "done" => KillOutcome::Lost {
            status: status.clone(),
            holder: holder.clone(),
            holder_dead: holder.as_ref().is_some_and(|h| kill.dead.contains(h)),
        },
        _ => KillOutcome::Unknown,
    }
}

// ─── The freeze: a worker stops holding a job ────────────────────────────────────────

/// What Postgres said of the frozen worker's job and session.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Freeze {
    /// The worker the lab froze while it held the job.
    pub sleeper: String,
    /// Who processed the job, in the processing table's order, once the round was over.
    pub by: Vec<String>,
    /// How many processings of the job the table held just before the resume.
    pub processed_while_frozen: i64,
    /// `pg_stat_activity` stopped listing the sleeper's session before the resume.
    pub session_ended: bool,
    /// The sleeper's first statement after waking failed: its session was gone.
    pub finish_failed: bool,
}

/// What became of the frozen worker's job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrozenJob {
    /// The sleeper's late write was refused: Postgres had ended its session (idle in its
    /// transaction too long) — during the freeze, or around the resume when the timeout ran
    /// out within moments of the pause.
    Refused { during_freeze: bool },
    /// Nobody touched the job while its worker was frozen, and the worker finished it once.
    Kept,
    /// Anything else: someone else processed it, or it was processed other than once.
    Moved,
}

/// Decides [`FrozenJob`] from the table's final record and the sleeper's own fate after the
/// resume — never from the state at the resume alone: a session timeout just longer than
/// the pause ends the session *after* the resume, and the job then moves on although
/// nothing moved while it was frozen.
pub fn frozen_job(freeze: &Freeze) -> FrozenJob {
    if freeze.finish_failed {
        FrozenJob::Refused {
            during_freeze: freeze.session_ended,
        }
    } else if freeze.by == [freeze.sleeper.as_str()] && freeze.processed_while_frozen == 0 {
        FrozenJob::Kept
    } else {
        FrozenJob::Moved
    }
}

/// What the other workers did while one was frozen holding a job, from what was measured:
/// jobs they processed, and sessions `pg_blocking_pids` showed blocked behind it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Around {
    /// The frozen job was the round's only one: the others had nothing to do.
    OnlyJob,
    /// The others processed nothing, and none was blocked at the resume.
    Idle,
    /// The round's only job, and `blocked` sessions waited for its row lock: no queue to
    /// stall, but the others did not pass over it.
    OnlyJobBlocked { blocked: i64 },
    /// The whole queue stood still behind the row lock.
    Stalled { blocked: i64 },
    /// The others carried on around it.
    CarriedOn { done: i64 },
    /// The others processed some jobs, and some sessions were blocked behind it at the resume.
    Both { done: i64, blocked: i64 },
}

/// Decides [`Around`]: `done` jobs the others processed during the freeze, `blocked`
/// sessions waiting behind the frozen one at the resume, `jobs` in the round.
pub fn around_the_freeze(done: i64, blocked: i64, jobs: u32) -> Around {
    let lone = jobs <= 1;
    match (done, blocked) {
        (0, 0) if lone => Around::OnlyJob,
        (0, 0) => Around::Idle,
        (0, _) if lone => Around::OnlyJobBlocked { blocked },
        (0, _) => Around::Stalled { blocked },
        (_, 0) => Around::CarriedOn { done },
        (_, _) => Around::Both { done, blocked },
    }
}

// ─── Speed ───────────────────────────────────────────────────────────────────────────

/// A mode noticeably slower than the fastest (under 80 % of its jobs/s in the fault-free
/// round): for `for-update`, the sign of workers queueing behind one row lock.
pub fn noticeably_slower(jobs_per_s: f64, fastest: f64) -> bool {
    fastest > 0.0 && jobs_per_s < fastest * 0.8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn processed(duplicates: i64, lost: i64) -> Processed {
        Processed {
            jobs: 10,
            once: 10 - duplicates - lost,
            duplicates,
            lost,
        }
    }

    #[test]
    fn once_means_no_duplicate_and_nothing_lost() {
        assert!(every_job_once(&processed(0, 0)));
        assert!(!every_job_once(&processed(1, 0)));
        assert!(!every_job_once(&processed(0, 1)));
    }

    fn kill(first_claim: Option<(&str, f64)>, row: Option<(&str, Option<&str>)>) -> Kill {
        Kill {
            victim: "w1".into(),
            first_claim: first_claim.map(|(by, ms)| (by.into(), ms)),
            row: row.map(|(status, holder)| (status.into(), holder.map(Into::into))),
            dead: vec!["w1".into()],
        }
    }

    #[test]
    fn a_killed_workers_job_claimed_by_another_was_reclaimed() {
        // skip-locked and for-update: Postgres rolled w1's transaction back, w3 took the job.
        assert_eq!(
            kill_outcome(&kill(Some(("w3", 5.5)), None)),
            KillOutcome::Reclaimed {
                by: "w3".into(),
                after_ms: 5.5
            }
        );
    }

    #[test]
    fn a_naive_job_marked_running_by_the_dead_worker_is_lost() {
        // naive: nobody claimed it again; the row says 'running', claimed_by w1, who is gone.
        assert_eq!(
            kill_outcome(&kill(None, Some(("running", Some("w1"))))),
            KillOutcome::Lost {
                status: "running".into(),
                holder: Some("w1".into()),
                holder_dead: true
            }
        );
        let by_a_live_one = kill_outcome(&kill(None, Some(("running", Some("w4")))));
        assert!(matches!(
            by_a_live_one,
            KillOutcome::Lost {
                holder_dead: false,
                ..
            }
        ));
        let pending = kill_outcome(&kill(None, Some(("pending", None))));
        assert!(matches!(
            pending,
            KillOutcome::Lost {
                holder: None,
                holder_dead: false,
                ..
            }
        ));
    }

    #[test]
    fn a_kill_the_evidence_cannot_settle_is_unknown() {
        // The victim's own processing is no reclaim; with no row read, nothing is decided.
        assert_eq!(
            kill_outcome(&kill(Some(("w1", 0.1)), None)),
            KillOutcome::Unknown
        );
        assert_eq!(kill_outcome(&kill(None, None)), KillOutcome::Unknown);
        // Done, yet nobody's processing was seen: the tables disagree, so no guess.
        assert_eq!(
            kill_outcome(&kill(None, Some(("done", Some("w3"))))),
            KillOutcome::Unknown
        );
    }

    fn freeze(by: &[&str], while_frozen: i64, session_ended: bool, failed: bool) -> Freeze {
        Freeze {
            sleeper: "w2".into(),
            by: by.iter().map(|w| w.to_string()).collect(),
            processed_while_frozen: while_frozen,
            session_ended,
            finish_failed: failed,
        }
    }

    #[test]
    fn a_job_finished_once_by_its_frozen_worker_was_kept() {
        assert_eq!(
            frozen_job(&freeze(&["w2"], 0, false, false)),
            FrozenJob::Kept
        );
    }

    #[test]
    fn a_session_ended_at_the_resume_is_not_a_job_kept() {
        // Issue 10, item 4: an idle timeout just above the pause. Nothing moved while w2 was
        // frozen (0 processings, the session still listed), then Postgres ended the session
        // as it woke, its INSERT failed, and w4 did the job.
        assert_eq!(
            frozen_job(&freeze(&["w4"], 0, false, true)),
            FrozenJob::Refused {
                during_freeze: false
            }
        );
        assert_eq!(
            frozen_job(&freeze(&["w4"], 1, true, true)),
            FrozenJob::Refused {
                during_freeze: true
            }
        );
    }

    #[test]
    fn a_job_someone_else_touched_was_not_kept() {
        assert_eq!(
            frozen_job(&freeze(&["w5", "w2"], 1, false, false)),
            FrozenJob::Moved
        );
        assert_eq!(
            frozen_job(&freeze(&["w5"], 1, false, false)),
            FrozenJob::Moved
        );
        assert_eq!(frozen_job(&freeze(&[], 0, false, false)), FrozenJob::Moved);
        // Finished by its own worker, but processed by another during the freeze and then
        // (impossibly for a row lock) no more: still not "kept".
        assert_eq!(
            frozen_job(&freeze(&["w2"], 1, false, false)),
            FrozenJob::Moved
        );
        assert_eq!(
            frozen_job(&freeze(&["w2", "w2"], 0, false, false)),
            FrozenJob::Moved
        );
    }

    #[test]
    fn one_job_blocked_on_is_not_a_whole_queue_stalled() {
        // Issue 11: with one job there is no queue to stall, whatever the blocked count.
        assert_eq!(
            around_the_freeze(0, 9, 1),
            Around::OnlyJobBlocked { blocked: 9 }
        );
        assert_eq!(around_the_freeze(0, 9, 50), Around::Stalled { blocked: 9 });
        assert_eq!(around_the_freeze(0, 0, 1), Around::OnlyJob);
        assert_eq!(around_the_freeze(0, 0, 50), Around::Idle);
    }

    #[test]
    fn work_done_around_the_freeze_is_carrying_on() {
        assert_eq!(around_the_freeze(49, 0, 50), Around::CarriedOn { done: 49 });
        assert_eq!(
            around_the_freeze(3, 2, 50),
            Around::Both {
                done: 3,
                blocked: 2
            }
        );
    }

    #[test]
    fn slower_means_under_four_fifths_of_the_fastest() {
        assert!(noticeably_slower(100.0, 300.0));
        assert!(!noticeably_slower(250.0, 300.0));
        assert!(!noticeably_slower(300.0, 300.0));
        assert!(!noticeably_slower(0.0, 0.0), "no speed measured: no claim");
    }
}
