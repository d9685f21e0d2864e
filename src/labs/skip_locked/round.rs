//! The orchestrator's view of one mode's queue while its rounds play: the jobs it puts in,
//! the progress it shows, and what it asks Postgres (the processing table, who waits on
//! whom, what a session is doing).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use postgres::Client;

use super::verdict::processed;
use crate::events::What;
use crate::events::facts::RoundFacts;
use crate::events::facts::{Blocked, JobFate, Session};
use crate::events::{Event, Kind};
use crate::labs::Stage;
use crate::output::{Style, count, human};
use crate::queue::{Mode, Queue};

/// The orchestrator's view of one mode's queue while its rounds play.
pub(super) struct Round<'a> {
    pub(super) stage: &'a mut Stage,
    pub(super) work: Duration,
    pub(super) run_id: &'a str,
    pub(super) db: &'a mut Client,
    pub(super) queue: &'a Queue,
    pub(super) style: Style,
    /// How many workers the mode started (w1…wN).
    pub(super) workers: u32,
    /// Workers that are gone: a naive job they marked 'running' stays that way.
    pub(super) dead: Vec<String>,
    pub(super) next_id: i64,
}

impl Round<'_> {
    pub(super) fn fill(&mut self, round: i32, jobs: u32) -> Result<()> {
        let first = self.next_id;
        let last = first + jobs as i64 - 1;
        self.db.execute(
            &self.queue.sql(
                "INSERT INTO {jobs} (id, round) SELECT g, $3 FROM generate_series($1::bigint, $2::bigint) g",
            ),
            &[&first, &last, &round],
        )?;
        self.next_id = last + 1;
        Ok(())
    }

    /// Takes worker events for `duration`, failing on a worker's error.
    pub(super) fn pump(&mut self, duration: Duration) -> Result<()> {
        let deadline = Instant::now() + duration;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if let Some(event) = self.stage.next(left)
                && event.kind() == Kind::Error
            {
                return Err(crate::labs::worker_failed(&event.worker, &event.text));
            }
        }
        Ok(())
    }

    pub(super) fn pump_for(&mut self, duration: Duration, round: i32, jobs: u32) -> Result<()> {
        let deadline = Instant::now() + duration;
        while Instant::now() < deadline {
            self.pump(Duration::from_millis(20))?;
            self.show_progress(round, jobs)?;
        }
        Ok(())
    }

    pub(super) fn check_errors(&self) -> Result<()> {
        if let Some(event) = self.stage.log.iter().find(|e| e.kind() == Kind::Error) {
            return Err(crate::labs::worker_failed(&event.worker, &event.text));
        }
        Ok(())
    }

    /// (jobs done, jobs still to do) in a round. A naive job marked 'running' by a dead
    /// worker is not "to do": nobody will ever touch it again.
    pub(super) fn counts(&mut self, round: i32) -> Result<(i64, i64)> {
        let row = self.db.query_one(
            &self.queue.sql(
                "SELECT count(*) FILTER (WHERE status = 'done'),
                        count(*) FILTER (WHERE status <> 'done'
                                         AND NOT (status = 'running' AND claimed_by = ANY($2)))
                 FROM {jobs} WHERE round = $1",
            ),
            &[&round, &self.dead],
        )?;
        Ok((row.get(0), row.get(1)))
    }

    pub(super) fn show_progress(&mut self, round: i32, jobs: u32) -> Result<(i64, i64)> {
        let (done, left) = self.counts(round)?;
        if self.stage.timeline.bar().is_none() {
            let bar = self
                .style
                .progress(jobs as u64, "  {bar:30} {pos}/{len} jobs done  {msg}");
            self.stage.timeline.attach_bar(bar);
        }
        if let Some(bar) = self.stage.timeline.bar() {
            bar.set_position(done as u64);
            let seconds = bar.elapsed().as_secs_f64();
            if seconds > 0.05 {
                bar.set_message(format!("{:.0} jobs/s", done as f64 / seconds));
            }
        }
        Ok((done, left))
    }

    /// During a freeze: a countdown of the pause, with the round's jobs done beside it.
    pub(super) fn show_freeze(
        &mut self,
        round: i32,
        jobs: u32,
        frozen: &str,
        frozen_at: Instant,
        pause: Duration,
    ) -> Result<()> {
        let (done, _) = self.counts(round)?;
        if self.stage.timeline.bar().is_none() {
            let bar = self
                .style
                .progress(pause.as_millis() as u64, "  ❄ {bar:30} {msg}");
            self.stage.timeline.attach_bar(bar);
        }
        if let Some(bar) = self.stage.timeline.bar() {
            let elapsed = frozen_at.elapsed().min(pause);
            bar.set_position(elapsed.as_millis() as u64);
            bar.set_message(format!(
                "{frozen} frozen, {:.1}s to go · {done}/{jobs} jobs done",
                (pause - elapsed).as_secs_f64()
            ));
        }
        Ok(())
    }

    /// Shows progress until every job of the round is done (or can never be), calling
    /// `watch` about every 10ms.
    pub(super) fn until_done(
        &mut self,
        round: i32,
        jobs: u32,
        mut watch: impl FnMut(&mut Round) -> Result<()>,
    ) -> Result<()> {
        // Generous: even one worker at a time (for-update) gets through in this time.
        let limit = Duration::from_secs(60) + (self.work + Duration::from_millis(5)) * jobs;
        let started = Instant::now();
        loop {
            // The count below is a query on the queue's own table: asked every 10ms, it took a
            // share of the 2 cores the workers were measured on. The speed is read from the
            // rows' own times, so asking less often changes only how soon the bar moves.
            self.pump(Duration::from_millis(50))?;
            watch(self)?;
            let (_, left) = self.show_progress(round, jobs)?;
            if left == 0 {
                break;
            }
            if started.elapsed() > limit {
                bail!(
                    "round {round} did not finish within {}: {} still to do",
                    human(limit),
                    count(left, "job", "jobs")
                );
            }
        }
        watch(self)?;
        self.stage.timeline.clear_bar();
        Ok(())
    }

    /// Reads the round's speed and per-worker counts from the processing table. The speed
    /// runs from the first claim to the last `done_at`, which the processing INSERT stamps
    /// just before the job is marked done and committed.
    pub(super) fn summarise_speed(&mut self, round: i32) -> Result<f64> {
        let row = self.db.query_one(
            &self.queue.sql(
                "SELECT count(DISTINCT p.job_id),
                        coalesce(extract(epoch FROM max(p.done_at) - min(p.claimed_at))::float8, 0)
                 FROM {processing} p JOIN {jobs} j ON j.id = p.job_id
                 WHERE j.round = $1",
            ),
            &[&round],
        )?;
        let (jobs, seconds): (i64, f64) = (row.get(0), row.get(1));
        let jobs_per_s = if seconds > 0.0 {
            round1(jobs as f64 / seconds)
        } else {
            0.0
        };
        // Every worker, including those that processed nothing: a 0 is what starvation
        // looks like (for-update), and leaving it out would hide it.
        let names: Vec<String> = (1..=self.workers).map(|i| format!("w{i}")).collect();
        let mut per_worker: BTreeMap<String, i64> = names.iter().map(|w| (w.clone(), 0)).collect();
        let rows = self.db.query(
            &self.queue.sql(
                "SELECT p.worker, count(*) FROM {processing} p JOIN {jobs} j ON j.id = p.job_id
                 WHERE j.round = $1 GROUP BY p.worker",
            ),
            &[&round],
        )?;
        for row in rows {
            per_worker.insert(row.get(0), row.get(1));
        }
        let listing: Vec<String> = names
            .iter()
            .map(|w| format!("{w} {}", per_worker[w]))
            .collect();
        self.stage.record(Event::new(
            "lab",
            RoundFacts {
                round: Some(round as u32),
                jobs: Some(jobs as u64),
                seconds: Some(seconds),
                jobs_per_s: Some(jobs_per_s),
                per_worker: Some(per_worker.clone()),
                run_id: Some(self.run_id.into()),
                jobs_table: Some(self.queue.jobs.as_str().into()),
                processing_table: Some(self.queue.processing.as_str().into()),
                ..RoundFacts::default()
            },
            format!(
                "{} done in {}: {jobs_per_s:.0} jobs/s · per worker: {}",
                count(jobs, "job", "jobs"),
                human(Duration::from_secs_f64(seconds)),
                listing.join(" · ")
            ),
        ));
        Ok(jobs_per_s)
    }

    /// Who processed the job, in order (from the processing table).
    pub(super) fn processed_by(&mut self, job: i64) -> Result<Vec<String>> {
        Ok(self
            .db
            .query(
                &self
                    .queue
                    .sql("SELECT worker FROM {processing} WHERE job_id = $1 ORDER BY done_at"),
                &[&job],
            )?
            .iter()
            .map(|row| row.get(0))
            .collect())
    }

    /// How many of this mode's worker sessions (names starting with `prefix`) are blocked
    /// by the session named `holder`, as `pg_blocking_pids` reports it: (directly, in all).
    ///
    /// Only the first waiter on a row waits for the holder itself; the next ones queue for
    /// the row's tuple lock, which that first waiter holds. So the chain is followed: a
    /// session blocked by a session blocked by the holder waits for the holder too.
    pub(super) fn blocked_by(&mut self, prefix: &str, holder: &str) -> Result<(i64, i64)> {
        let row = self.db.query_one(
            "WITH RECURSIVE
                 holder AS (SELECT pid FROM pg_stat_activity WHERE application_name = $2),
                 blocked AS (
                     SELECT pid, pg_blocking_pids(pid) AS by FROM pg_stat_activity
                     WHERE starts_with(application_name, $1) AND pid NOT IN (SELECT pid FROM holder)
                 ),
                 chain (pid, direct) AS (
                     SELECT b.pid, true FROM blocked b, holder h WHERE h.pid = ANY(b.by)
                     UNION
                     SELECT b.pid, false FROM blocked b JOIN chain c ON c.pid = ANY(b.by)
                 )
             SELECT count(DISTINCT pid) FILTER (WHERE direct), count(DISTINCT pid) FROM chain",
            &[&prefix, &holder],
        )?;
        Ok((row.get(0), row.get(1)))
    }

    /// Shows the sessions blocked behind `holder`'s row lock, if any, and returns how many.
    pub(super) fn show_blocked(
        &mut self,
        prefix: &str,
        holder: &str,
        session: &str,
        job: i64,
    ) -> Result<i64> {
        let (direct, all) = self.blocked_by(prefix, session)?;
        if all > 0 {
            self.stage.record(Event::new(
                "pg",
                Blocked {
                    waiting: all,
                    waiting_directly: direct,
                },
                format!(
                    "pg_blocking_pids: {} blocked behind {holder}'s session, which holds \
                         job {job}'s row lock ({direct} waiting for it directly, {} queued \
                         behind another waiter)",
                    count(all, "worker session is", "worker sessions are"),
                    all - direct
                ),
            ));
        }
        Ok(all)
    }

    /// What Postgres itself says about a worker's session.
    pub(super) fn show_session(&mut self, worker: &str, session: &str) -> Result<()> {
        let row = self.db.query_opt(
            "SELECT state,
                    extract(epoch FROM clock_timestamp() - xact_start)::float8 * 1000
             FROM pg_stat_activity WHERE application_name = $1",
            &[&session],
        )?;
        let text = match row {
            Some(row) => {
                let state: Option<String> = row.get(0);
                let open_ms: Option<f64> = row.get(1);
                match (state.as_deref(), open_ms) {
                    (Some(state), Some(ms)) => format!(
                        "pg_stat_activity: {worker}'s session is '{state}', its transaction open for {}",
                        human(Duration::from_millis(ms.max(0.0) as u64))
                    ),
                    (Some(state), None) => format!(
                        "pg_stat_activity: {worker}'s session is '{state}', with no transaction open"
                    ),
                    _ => format!("pg_stat_activity: {worker}'s session has no state"),
                }
            }
            None => format!("pg_stat_activity: {worker} has no session"),
        };
        self.stage.record(Event::new(
            "pg",
            Session {
                session_of: Some(worker.into()),
                ..Session::default()
            },
            text,
        ));
        Ok(())
    }
}

/// What became of the job a fault hit (`kind`: the kill's or the freeze's result), from the
/// processing table: who processed it, in order.
pub(super) fn job_read(job: i64, by: &[String]) -> Event {
    let fate = JobFate {
        job: Some(job),
        times_processed: Some(by.len() as u64),
        by: Some(by.to_vec()),
        ..JobFate::default()
    };
    Event::new(
        "lab",
        What::JobRead(fate),
        format!("job {job} was {}", processed(by)),
    )
}

/// Whether an event belongs to this mode's play (the stage's log holds every mode's events).
pub(super) fn in_mode(event: &Event, mode: Mode) -> bool {
    event.part.mode.as_deref() == Some(mode.name())
}

pub(super) fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
