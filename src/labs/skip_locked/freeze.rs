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

impl Play<'_> {
    /// Round 3: a worker claims a job and is frozen for `--pause`.
    pub(super) fn freeze_round(
        &self,
        round: &mut Round,
        workers: &mut [WorkerHandle],
        nemesis: &mut Nemesis,
        jobs: u32,
    ) -> Result<FreezeNotes> {
        let pause = self.plan.pause;
        let label = if self.plan.fault.kills() {
            "Round 3"
        } else {
            "Round 2"
        };
        round.stage.timeline.say(&format!(
            "{}",
            format!(
                "{label} — the freeze: {}; w2 claims one and is frozen for {}",
                count(jobs, "new job", "new jobs"),
                human(pause)
            )
            .bold()
        ));
        round.fill(3, jobs)?;
        let frozen_index = 1;
        let frozen_name = workers[frozen_index].name.clone();
        workers[frozen_index].tell("hold 3")?;
        let job = round
            .stage
            .wait_for(
                Duration::from_secs(10),
                &format!("{frozen_name} to claim a job"),
                |e| e.is(&frozen_name, Kind::Claimed) && in_mode(e, self.mode),
            )?
            .job()
            .ok_or_else(|| anyhow!("{frozen_name} claimed no job id"))?;
        // Played now, steps added to the round's schedule as they come: the resume's line
        // and facts are what Postgres says just before it (jobs the others processed, who
        // took the frozen job), read back mid-run.
        let mut faults = Faults::new(&Schedule::default(), &*round.stage);
        let frozen = &mut workers[frozen_index];
        let words = Note::new(
            format!(
                "SIGSTOP {frozen_name} (pid {}) while it holds job {job}; its connection stays open",
                frozen.pid
            ),
            FaultFacts {
                job: Some(job),
                ..FaultFacts::default()
            },
        );
        let stop = (Fault::Pause, frozen_name.as_str());
        round
            .stage
            .play_now(&mut faults, nemesis, &mut [frozen], stop, words)?;
        let frozen_at = Instant::now();
        let session = self.session(&frozen_name);
        if self.mode.transactional() {
            // Seen again just before the resume: the same transaction, open for the pause.
            round.show_session(&frozen_name, &session)?;
        }
        for (i, worker) in workers.iter_mut().enumerate() {
            if i != frozen_index && !round.dead.contains(&worker.name) {
                worker.tell("drain 3")?;
            }
        }

        // While frozen: the others carry on (or wait, in for-update mode); with an idle
        // timeout, Postgres ends the frozen session and the job moves on.
        let taken_sql = self
            .queue
            .sql("SELECT worker FROM {processing} WHERE job_id = $1 AND worker <> $2 LIMIT 1");
        let session_sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1";
        let watch_session = self.plan.idle_timeout.is_some();
        let mut session_gone = false;
        let mut taken_by: Option<String> = None;
        let deadline = frozen_at + pause;
        while Instant::now() < deadline {
            round.pump(Duration::from_millis(20))?;
            round.show_freeze(3, jobs, &frozen_name, frozen_at, pause)?;
            if watch_session && !session_gone {
                let n: i64 = round.db.query_one(session_sql, &[&session])?.get(0);
                if n == 0 {
                    session_gone = true;
                    round.stage.record(Event::new(
                        "pg",
                        Expired {
                            ..Expired::default()
                        },
                        format!(
                            "pg_stat_activity no longer lists {frozen_name}'s session, {} into \
                             the freeze. A stopped process closes nothing, so Postgres ended it: \
                             idle in its transaction longer than \
                             idle_in_transaction_session_timeout ({}); its row lock on job {job} \
                             went with it",
                            human(frozen_at.elapsed()),
                            human(self.plan.idle_timeout.unwrap_or_default())
                        ),
                    ));
                }
            }
            if taken_by.is_none()
                && let Some(row) = round.db.query_opt(&taken_sql, &[&job, &frozen_name])?
            {
                let by: String = row.get(0);
                round.stage.record(Event::new(
                    "pg",
                    What::TakenOver(Handover {
                        job: Some(job),
                        by: Some(by.clone()),
                        ..Handover::default()
                    }),
                    format!("{by} processed job {job} while {frozen_name} was frozen"),
                ));
                taken_by = Some(by);
            }
        }
        round.stage.timeline.clear_bar();

        // Just before the resume: what did the others do, and who touched the frozen job?
        let row = round.db.query_one(
            &self.queue.sql(
                "SELECT count(DISTINCT j.id) FILTER (WHERE j.id <> $2),
                        count(*) FILTER (WHERE j.id = $2)
                 FROM {processing} p JOIN {jobs} j ON j.id = p.job_id
                 WHERE j.round = $1",
            ),
            &[&3i32, &job],
        )?;
        let (others_done, frozen_job_done): (i64, i64) = (row.get(0), row.get(1));
        let blocked = round.show_blocked(&self.session(""), &frozen_name, &session, job)?;
        round.show_session(&frozen_name, &session)?;
        let frozen = &mut workers[frozen_index];
        let words = format!(
            "SIGCONT {frozen_name} after {}; meanwhile the others processed {}, and job {job} {}",
            human(frozen_at.elapsed()),
            count(others_done, "job", "jobs"),
            if frozen_job_done == 0 {
                "not at all".to_string()
            } else {
                times(frozen_job_done as usize).to_string()
            }
        );
        let resume = (Fault::Resume, frozen_name.as_str());
        round.stage.play_now(
            &mut faults,
            nemesis,
            &mut [&mut *frozen],
            resume,
            Note::new(
                words,
                FaultFacts {
                    job: Some(job),
                    others_processed: Some(others_done as u64),
                    frozen_job_processed: Some(frozen_job_done as u64),
                    ..FaultFacts::default()
                },
            ),
        )?;
        frozen.tell("commit")?;
        let outcome = round.stage.wait_for(
            Duration::from_secs(10),
            &format!("{frozen_name} to finish its job"),
            |e| {
                e.worker == frozen_name
                    && (e.kind() == Kind::Committed || e.kind() == Kind::FinishFailed)
                    && in_mode(e, self.mode)
            },
        )?;
        let finish_failed = outcome.kind() == Kind::FinishFailed;
        if finish_failed {
            round.dead.push(frozen_name.clone());
        }
        round.until_done(3, jobs, |_| Ok(()))?;
        let by = round.processed_by(job)?;
        let mut result = job_read(job, &by);
        if let What::JobRead(fate) = &mut result.what {
            fate.frozen_job_processed_while_frozen = Some(frozen_job_done as u64);
        }
        round.stage.record(result);
        Ok(FreezeNotes {
            evidence: Freeze {
                sleeper: frozen_name,
                by,
                processed_while_frozen: frozen_job_done,
                session_ended: session_gone,
                finish_failed,
            },
            others_done,
            blocked_at_resume: blocked,
            jobs,
        })
    }
}
