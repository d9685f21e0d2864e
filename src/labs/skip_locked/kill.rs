//! The kill round: a worker claims a job and is killed before it commits. Its kernel closes
//! its socket, Postgres rolls its transaction back, and the row is free again — unless the
//! claim was a plain `UPDATE … 'running'` (naive), which nothing ever undoes.

use std::time::SystemTime;

use anyhow::{Result, anyhow};
use colored::Colorize;

use super::KILL_AFTER;
use super::play::Play;
use super::round::{Round, in_mode, job_read, round1};
use super::verdict::reclaim_how;
use crate::check::skip_locked::{self as checks, Kill, KillOutcome};
use crate::events::What;
use crate::events::facts::{FaultFacts, Handover, JobFate};
use crate::events::{Event, Kind};
use crate::labs::WorkerHandle;
use crate::labs::faults::Faults;
use crate::nemesis::schedule::Schedule;
use crate::nemesis::{Fault, Nemesis, Note};
use crate::output::count;

impl Play<'_> {
    /// Round 2: a worker claims a job and is killed before it commits. Returns how long
    /// after the kill another worker claimed the job, if one did.
    pub(super) fn kill_round(
        &self,
        round: &mut Round,
        workers: &mut [WorkerHandle],
        nemesis: &mut Nemesis,
        jobs: u32,
    ) -> Result<Option<f64>> {
        let heading = format!(
            "Round 2 — the kill: {}; w1 claims one and dies before it commits",
            count(jobs, "new job", "new jobs")
        );
        round.stage.timeline.say(&heading.bold().to_string());
        round.fill(2, jobs)?;
        let (victim, others) = workers.split_first_mut().expect("at least 2 workers");
        victim.tell("hold 2")?;
        let job = round
            .stage
            .wait_for(
                std::time::Duration::from_secs(10),
                "w1 to claim a job",
                |e| e.is("w1", Kind::Claimed) && in_mode(e, self.mode),
            )?
            .job()
            .ok_or_else(|| anyhow!("w1 claimed no job id"))?;
        for worker in others.iter_mut() {
            worker.tell("drain 2")?;
        }
        round.pump_for(KILL_AFTER, 2, jobs)?;
        let kill_at = self.kill(round, nemesis, victim, job)?;
        round.dead.push(victim.name.clone());
        let mut evidence = Kill {
            victim: victim.name.clone(),
            ..Kill::default()
        };
        self.watch_for_the_reclaim(round, &mut evidence, job, kill_at, jobs)?;
        let by = round.processed_by(job)?;
        evidence.dead = round.dead.clone();
        let outcome = self.outcome(round, &mut evidence, job, by.len())?;
        round.stage.record(job_read(job, &by));
        Ok(match outcome {
            KillOutcome::Reclaimed { after_ms, .. } => Some(round1(after_ms)),
            _ => None,
        })
    }

    /// Played now, a step added to the round's schedule as it comes: the kill's line
    /// carries what Postgres counts just before it, and the reclaim is timed from
    /// Postgres's own clock read at that moment (returned).
    fn kill(
        &self,
        round: &mut Round,
        nemesis: &mut Nemesis,
        victim: &mut WorkerHandle,
        job: i64,
    ) -> Result<SystemTime> {
        let (done_before_kill, _) = round.counts(2)?;
        round.show_blocked(&self.session(""), "w1", &self.session("w1"), job)?;
        let kill_at: SystemTime = round.db.query_one("SELECT clock_timestamp()", &[])?.get(0);
        let how = if self.mode.transactional() {
            "its transaction is open, the job is claimed but not done"
        } else {
            "its job is marked 'running', not done"
        };
        let words = format!(
            "SIGKILL w1 (pid {}) while it holds job {job}: {how}; the others have done {} meanwhile",
            victim.pid,
            count(done_before_kill, "job", "jobs")
        );
        let name = victim.name.clone();
        let mut faults = Faults::new(&Schedule::default(), &*round.stage);
        round.stage.play_now(
            &mut faults,
            nemesis,
            &mut [victim],
            (Fault::Kill, &name),
            Note::new(
                words,
                FaultFacts {
                    others_done: Some(done_before_kill as u64),
                    job: Some(job),
                    ..FaultFacts::default()
                },
            ),
        )?;
        Ok(kill_at)
    }

    /// Watches for the job coming back, until the round is over: its first processing in
    /// the table, and how long after the kill Postgres stamped its claim.
    fn watch_for_the_reclaim(
        &self,
        round: &mut Round,
        evidence: &mut Kill,
        job: i64,
        kill_at: SystemTime,
        jobs: u32,
    ) -> Result<()> {
        let reclaim_sql = self.queue.sql(
            "SELECT worker, extract(epoch FROM claimed_at - $2::timestamptz)::float8 * 1000
             FROM {processing} WHERE job_id = $1 ORDER BY claimed_at LIMIT 1",
        );
        round.until_done(2, jobs, |round| {
            if evidence.first_claim.is_some() {
                return Ok(());
            }
            let Some(row) = round.db.query_opt(&reclaim_sql, &[&job, &kill_at])? else {
                return Ok(());
            };
            evidence.first_claim = Some((row.get(0), row.get(1)));
            if let KillOutcome::Reclaimed { by, after_ms } = checks::kill_outcome(evidence) {
                round.stage.record(Event::new(
                    "pg",
                    What::Reclaimed(Handover {
                        job: Some(job),
                        by: Some(by.clone()),
                        reclaim_ms: Some(round1(after_ms)),
                        ..Handover::default()
                    }),
                    format!(
                        "{by} claimed job {job} {after_ms:.1}ms after the kill: Postgres \
                         rolled back w1's transaction when its connection closed (no TTL \
                         involved){}",
                        reclaim_how(self.mode)
                    ),
                ));
            }
            Ok(())
        })
    }

    /// The kill's outcome: reclaimed, or — the job's row read back — lost, said so.
    fn outcome(
        &self,
        round: &mut Round,
        evidence: &mut Kill,
        job: i64,
        times_processed: usize,
    ) -> Result<KillOutcome> {
        if !matches!(
            checks::kill_outcome(evidence),
            KillOutcome::Reclaimed { .. }
        ) {
            let row = round.db.query_one(
                &self
                    .queue
                    .sql("SELECT status, claimed_by FROM {jobs} WHERE id = $1"),
                &[&job],
            )?;
            evidence.row = Some((row.get(0), row.get(1)));
        }
        let outcome = checks::kill_outcome(evidence);
        // The row, as the jobs table answered it, is the evidence: recorded whenever it was
        // read; the story's words say what the checker makes of it.
        if let Some((status, holder)) = &evidence.row {
            let name = holder.as_deref().unwrap_or("nobody");
            let said = format!("its row says status '{status}', claimed_by {name}");
            let text = match &outcome {
                KillOutcome::Lost { holder_dead, .. } => {
                    let why = if *holder_dead {
                        format!("{name} is dead, and nothing will ever hand the job back — lost")
                    } else {
                        "nothing handed it back — lost".to_string()
                    };
                    format!("job {job} was never claimed again: {said}; {why}")
                }
                _ => format!("job {job} was never claimed again: {said}"),
            };
            round.stage.record(Event::new(
                "pg",
                What::JobRead(JobFate {
                    job: Some(job),
                    status: Some(status.clone()),
                    claimed_by: holder.clone(),
                    times_processed: Some(times_processed as u64),
                    ..JobFate::default()
                }),
                text,
            ));
        }
        Ok(outcome)
    }
}
