//! One mode of lab 3 on its own tables and workers: the queue round, then the faults the
//! plan asks for (a kill, a freeze), then the processing table's count.

use std::time::Duration;

use anyhow::{Context, Result};
use colored::Colorize;
use postgres::Client;

use super::Plan;
use super::round::Round;
use super::verdict::{ModeVerdict, Played};
use crate::check;
use crate::connect;
use crate::events::facts::Observed;
use crate::events::{Event, What};
use crate::labs::leftovers::Leftovers;
use crate::labs::{Stage, WorkerHandle};
use crate::nemesis::Nemesis;
use crate::output::{Style, count};
use crate::queue::{CREATE_JOBS, CREATE_PROCESSING, Mode, Queue, TIMES_PROCESSED};
use crate::worker::WorkerSpec;
use crate::worker::consumer::Role;

/// One mode, all its rounds, on its own tables and workers.
pub(super) struct Play<'a> {
    pub(super) plan: &'a Plan,
    pub(super) mode: Mode,
    pub(super) style: Style,
    pub(super) url: &'a str,
    pub(super) queue: Queue,
    pub(super) run_id: &'a str,
}

impl Play<'_> {
    pub(super) fn run(&self, stage: &mut Stage) -> Result<Played> {
        let mut db = connect::postgres(self.url)?;
        let create = format!(
            "{}; {}",
            self.queue.sql(CREATE_JOBS),
            self.queue.sql(CREATE_PROCESSING)
        );
        db.batch_execute(&create)
            .with_context(|| format!("creating the tables {}", self.queue.jobs))?;
        let drop_tables = format!(
            "DROP TABLE IF EXISTS {}, {}",
            self.queue.jobs, self.queue.processing
        );
        let leftovers = Leftovers::of_run(self.run_id)
            .sql(self.url, &drop_tables)
            .removed_at_the_end();
        let result = self.rounds(&mut db, stage).map_err(connect::explain);
        // The verdict has been read by now (or the run failed): the tables go either way.
        drop(db);
        leftovers.now(&result);
        result
    }

    fn rounds(&self, db: &mut Client, stage: &mut Stage) -> Result<Played> {
        let args = self.plan;
        self.say_heading(stage);
        let mut workers = self.spawn_workers(stage)?;
        let mut round = Round {
            stage,
            work: args.work,
            run_id: self.run_id,
            db,
            queue: &self.queue,
            style: self.style,
            workers: args.workers,
            dead: Vec::new(),
            next_id: 1,
        };
        // Every fault of this mode goes through here; declared after the workers, it is
        // dropped before them, so a worker paused when the mode fails is resumed first.
        let mut nemesis = Nemesis::new();
        let jobs_per_s = self.queue_round(&mut round, &mut workers)?;
        let fault_jobs = args.fault_jobs();
        let mut reclaim_ms = None;
        if args.fault.kills() {
            reclaim_ms = self.kill_round(&mut round, &mut workers, &mut nemesis, fault_jobs)?;
        }
        let mut freeze = None;
        if args.fault.freezes() {
            freeze = Some(self.freeze_round(&mut round, &mut workers, &mut nemesis, fault_jobs)?);
        }
        for worker in &mut workers {
            worker.finish(Duration::from_secs(5));
        }
        round.stage.drain();
        round.check_errors()?;
        let verdict = self.read_back(&mut round, jobs_per_s, reclaim_ms)?;
        Ok(Played { verdict, freeze })
    }

    /// The mode's heading: green for SKIP LOCKED, red for the naive claim, yellow for
    /// FOR UPDATE's waits.
    fn say_heading(&self, stage: &mut Stage) {
        stage.timeline.say("");
        let heading = format!("── {} ──", self.mode.name());
        let heading = match self.mode {
            Mode::SkipLocked => heading.green().bold(),
            Mode::Naive => heading.red().bold(),
            Mode::ForUpdate => heading.yellow().bold(),
        };
        stage.timeline.say(&heading.to_string());
    }

    fn spawn_workers(&self, stage: &mut Stage) -> Result<Vec<WorkerHandle>> {
        let args = self.plan;
        let mut workers = Vec::new();
        for i in 1..=args.workers {
            let name = format!("w{i}");
            let role = Role {
                name: name.clone(),
                postgres_url: self.url.to_string(),
                mode: self.mode,
                queue: self.queue.clone(),
                session: self.session(&name),
                work_ms: args.work.as_millis() as u64,
                window_ms: args.window.as_millis() as u64,
                idle_timeout_ms: args.idle_timeout.map(|d| d.as_millis() as u64),
                statement_timeout_ms: (args.pause + Duration::from_secs(30)).as_millis() as u64,
            };
            workers.push(stage.spawn(&name, &WorkerSpec::Consumer(role))?);
        }
        Ok(workers)
    }

    /// Round 1: the queue, no faults; its speed in jobs a second.
    fn queue_round(&self, round: &mut Round, workers: &mut [WorkerHandle]) -> Result<f64> {
        let args = self.plan;
        let heading = format!(
            "Round 1 — the queue: {}, {}, no faults",
            count(args.jobs, "job", "jobs"),
            count(args.workers, "worker", "workers")
        );
        round.stage.timeline.say(&heading.bold().to_string());
        round.fill(1, args.jobs)?;
        for worker in workers.iter_mut() {
            worker.tell("drain 1")?;
        }
        round.until_done(1, args.jobs, |_| Ok(()))?;
        round.summarise_speed(1)
    }

    /// The processing table read back: how often each job was processed.
    fn read_back(
        &self,
        round: &mut Round,
        jobs_per_s: f64,
        reclaim_ms: Option<f64>,
    ) -> Result<ModeVerdict> {
        let times: Vec<i64> = round
            .db
            .query(&self.queue.sql(TIMES_PROCESSED), &[])?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let processed = check::exactly_once(&times);
        let verdict = ModeVerdict {
            mode: self.mode,
            jobs: processed.jobs,
            duplicates: processed.duplicates,
            lost: processed.lost,
            jobs_per_s,
            reclaim_ms,
        };
        let once = processed.once;
        let evidence = Observed {
            once: Some(once as u64),
            duplicates: Some(verdict.duplicates as u64),
            lost: Some(verdict.lost as u64),
            ..Observed::default()
        };
        round.stage.record(Event::new(
            "pg",
            What::TablesRead(evidence),
            format!(
                "the processing table says: {}, {once} exactly once, {} twice or more, {} never",
                count(verdict.jobs, "job", "jobs"),
                verdict.duplicates,
                verdict.lost
            ),
        ));
        Ok(verdict)
    }

    pub(super) fn session(&self, worker: &str) -> String {
        format!("lockslab-{}-{}-{worker}", self.run_id, self.mode.name())
    }
}
