//! The freeze round: a worker claims a job and is stopped with SIGSTOP for `--pause`. Its
//! socket stays open, so its transaction and its row lock stay too: nobody else takes its
//! job — unless Postgres ends the idle session itself (`--idle-timeout`).

use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};
use colored::Colorize;

use super::play::Play;
use super::round::{Round, in_mode, job_read};
use super::verdict::{FreezeNotes, times};
use crate::check::skip_locked::Freeze;
use crate::events::What;
use crate::events::facts::{Expired, FaultFacts, Handover};
use crate::events::{Event, Kind};
use crate::labs::WorkerHandle;
use crate::labs::faults::Faults;
use crate::nemesis::schedule::Schedule;
use crate::nemesis::{Fault, Nemesis, Note};
use crate::output::{count, human};

/// The frozen worker and its job, once claimed and stopped.
struct Frozen {
    index: usize,
    name: String,
    job: i64,
    session: String,
    at: Instant,
}

/// Just before the resume: the others' jobs, and how often the frozen job was processed.
struct BeforeResume {
    others_done: i64,
    frozen_job_done: i64,
    blocked: i64,
}

impl Play<'_> {
    /// Round 3: a worker claims a job and is frozen for `--pause`.
    pub(super) fn freeze_round(
        &self,
        round: &mut Round,
        workers: &mut [WorkerHandle],
        nemesis: &mut Nemesis,
        jobs: u32,
    ) -> Result<FreezeNotes> {
        self.say_freeze(round, jobs);
        round.fill(3, jobs)?;
        // Played now, steps added to the round's schedule as they come: the resume's line
        // and facts are what Postgres says just before it (jobs the others processed, who
        // took the frozen job), read back mid-run.
        let mut faults = Faults::new(&Schedule::default(), &*round.stage);
        let frozen = self.claim_and_freeze(round, workers, nemesis, &mut faults)?;
        for (i, worker) in workers.iter_mut().enumerate() {
            if i != frozen.index && !round.dead.contains(&worker.name) {
                worker.tell("drain 3")?;
            }
        }
        let session_ended = self.watch_the_freeze(round, &frozen, jobs)?;
        let before = self.before_resume(round, &frozen)?;
        let worker = &mut workers[frozen.index];
        self.resume_frozen(round, nemesis, &mut faults, worker, &frozen, &before)?;
        worker.tell("commit")?;
        let outcome = round.stage.wait_for(
            Duration::from_secs(10),
            &format!("{} to finish its job", frozen.name),
            |e| {
                e.worker == frozen.name
                    && (e.kind() == Kind::Committed || e.kind() == Kind::FinishFailed)
                    && in_mode(e, self.mode)
            },
        )?;
        let finish_failed = outcome.kind() == Kind::FinishFailed;
        if finish_failed {
            round.dead.push(frozen.name.clone());
        }
        round.until_done(3, jobs, |_| Ok(()))?;
        let by = round.processed_by(frozen.job)?;
        let mut result = job_read(frozen.job, &by);
        if let What::JobRead(fate) = &mut result.what {
            fate.frozen_job_processed_while_frozen = Some(before.frozen_job_done as u64);
        }
        round.stage.record(result);
        Ok(FreezeNotes {
            evidence: Freeze {
                sleeper: frozen.name,
                by,
                processed_while_frozen: before.frozen_job_done,
                session_ended,
                finish_failed,
            },
            others_done: before.others_done,
            blocked_at_resume: before.blocked,
            jobs,
        })
    }

    fn say_freeze(&self, round: &mut Round, jobs: u32) {
        let label = if self.plan.fault.kills() {
            "Round 3"
        } else {
            "Round 2"
        };
        let heading = format!(
            "{label} — the freeze: {}; w2 claims one and is frozen for {}",
            count(jobs, "new job", "new jobs"),
            human(self.plan.pause)
        );
        round.stage.timeline.say(&heading.bold().to_string());
    }

    /// w2 claims a job and is stopped (SIGSTOP) holding it; its connection stays open.
    fn claim_and_freeze(
        &self,
        round: &mut Round,
        workers: &mut [WorkerHandle],
        nemesis: &mut Nemesis,
        faults: &mut Faults,
    ) -> Result<Frozen> {
        let index = 1;
        let name = workers[index].name.clone();
        workers[index].tell("hold 3")?;
        let job = round
            .stage
            .wait_for(
                Duration::from_secs(10),
                &format!("{name} to claim a job"),
                |e| e.is(&name, Kind::Claimed) && in_mode(e, self.mode),
            )?
            .job()
            .ok_or_else(|| anyhow!("{name} claimed no job id"))?;
        let worker = &mut workers[index];
        let words = Note::new(
            format!(
                "SIGSTOP {name} (pid {}) while it holds job {job}; its connection stays open",
                worker.pid
            ),
            FaultFacts {
                job: Some(job),
                ..FaultFacts::default()
            },
        );
        let stop = (Fault::Pause, name.as_str());
        round
            .stage
            .play_now(faults, nemesis, &mut [worker], stop, words)?;
        let at = Instant::now();
        let session = self.session(&name);
        if self.mode.transactional() {
            // Seen again just before the resume: the same transaction, open for the pause.
            round.show_session(&name, &session)?;
        }
        Ok(Frozen {
            index,
            name,
            job,
            session,
            at,
        })
    }

    /// While frozen: the others carry on (or wait, in for-update mode); with an idle
    /// timeout, Postgres ends the frozen session and the job moves on. Whether it ended the
    /// session.
    fn watch_the_freeze(&self, round: &mut Round, frozen: &Frozen, jobs: u32) -> Result<bool> {
        let (name, job) = (&frozen.name, frozen.job);
        let taken_sql = self
            .queue
            .sql("SELECT worker FROM {processing} WHERE job_id = $1 AND worker <> $2 LIMIT 1");
        let session_sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
        let watch_session = self.plan.idle_timeout.is_some();
        let (mut session_gone, mut taken) = (false, false);
        let pause = self.plan.pause;
        let deadline = frozen.at + pause;
        while Instant::now() < deadline {
            round.pump(Duration::from_millis(20))?;
            round.show_freeze(3, jobs, name, frozen.at, pause)?;
            if watch_session && !session_gone {
                let n: i64 = round.db.query_one(session_sql, &[&frozen.session])?.get(0);
                if n == 0 {
                    session_gone = true;
                    round.stage.record(Event::new(
                        "pg",
                        Expired {
                            ..Expired::default()
                        },
                        format!(
                            "pg_stat_activity no longer lists {name}'s session, {} into \
                             the freeze. A stopped process closes nothing, so Postgres ended it: \
                             idle in its transaction longer than \
                             idle_in_transaction_session_timeout ({}); its row lock on job {job} \
                             went with it",
                            human(frozen.at.elapsed()),
                            human(self.plan.idle_timeout.unwrap_or_default())
                        ),
                    ));
                }
            }
            if !taken && let Some(row) = round.db.query_opt(&taken_sql, &[&job, name])? {
                let by: String = row.get(0);
                round.stage.record(Event::new(
                    "pg",
                    What::TakenOver(Handover {
                        job: Some(job),
                        by: Some(by.clone()),
                        ..Handover::default()
                    }),
                    format!("{by} processed job {job} while {name} was frozen"),
                ));
                taken = true;
            }
        }
        round.stage.timeline.clear_bar();
        Ok(session_gone)
    }

    /// Just before the resume: what did the others do, and who touched the frozen job?
    fn before_resume(&self, round: &mut Round, frozen: &Frozen) -> Result<BeforeResume> {
        let row = round.db.query_one(
            &self.queue.sql(
                "SELECT count(DISTINCT j.id) FILTER (WHERE j.id <> $2),
                        count(*) FILTER (WHERE j.id = $2)
                 FROM {processing} p JOIN {jobs} j ON j.id = p.job_id
                 WHERE j.round = $1",
            ),
            &[&3i32, &frozen.job],
        )?;
        let (others_done, frozen_job_done): (i64, i64) = (row.get(0), row.get(1));
        let blocked =
            round.show_blocked(&self.session(""), &frozen.name, &frozen.session, frozen.job)?;
        round.show_session(&frozen.name, &frozen.session)?;
        Ok(BeforeResume {
            others_done,
            frozen_job_done,
            blocked,
        })
    }

    /// SIGCONT, said with what Postgres showed just before it.
    fn resume_frozen(
        &self,
        round: &mut Round,
        nemesis: &mut Nemesis,
        faults: &mut Faults,
        worker: &mut WorkerHandle,
        frozen: &Frozen,
        before: &BeforeResume,
    ) -> Result<()> {
        let (name, job) = (&frozen.name, frozen.job);
        let words = format!(
            "SIGCONT {name} after {}; meanwhile the others processed {}, and job {job} {}",
            human(frozen.at.elapsed()),
            count(before.others_done, "job", "jobs"),
            if before.frozen_job_done == 0 {
                "not at all".to_string()
            } else {
                times(before.frozen_job_done as usize).to_string()
            }
        );
        let resume = (Fault::Resume, name.as_str());
        round.stage.play_now(
            faults,
            nemesis,
            &mut [worker],
            resume,
            Note::new(
                words,
                FaultFacts {
                    job: Some(job),
                    others_processed: Some(before.others_done as u64),
                    frozen_job_processed: Some(before.frozen_job_done as u64),
                    ..FaultFacts::default()
                },
            ),
        )
    }
}
