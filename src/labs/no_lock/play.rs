//! One approach's run: its tables, its workers, and the loop that watches them go through
//! the list while the faults land ([`super::strike`]), until every live worker is done.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use colored::Colorize;

use super::door::{Door, Met};
use super::points::{self, KILLED, VICTIMS, WATCHED};
use super::{ApproachVerdict, Fault, Plan};
use crate::check::no_lock::Strike;
use crate::connect::{self, PgClient, RedisConn};
use crate::events::What;
use crate::events::facts::{Handover, Workers};
use crate::events::{Event, Kind};
use crate::invoices::{self, Approach, Moment, Tables, Tally};
use crate::labs::faults::Hand;
use crate::labs::{Stage, WorkerHandle};
use crate::worker::WorkerSpec;
use crate::worker::invoicer::Role;

/// One approach's run, on its own tables and workers.
pub(super) struct Play<'a> {
    pub(super) plan: &'a Plan,
    pub(super) approach: Approach,
    pub(super) workers: u32,
    pub(super) run_id: &'a str,
    pub(super) pg_url: &'a str,
    pub(super) redis_url: Option<&'a str>,
    pub(super) tables: Tables,
}

/// What the lab saw of its faults while the run played.
#[derive(Default)]
pub(super) struct Faults {
    /// Every frozen worker, in the order they stopped.
    pub(super) frozen: Vec<Struck>,
    pub(super) killed: Option<Struck>,
    /// When the first frozen worker was resumed, on the database's clock.
    pub(super) resumed_at: Option<SystemTime>,
    pub(super) expired_seen: bool,
    pub(super) taken_seen: bool,
    /// The customers' Redis locks the lab holds while waiters write (see [`Door`]).
    pub(super) doors: Vec<Door>,
}

impl Faults {
    pub(super) fn watched(&self) -> Option<&Struck> {
        self.frozen.iter().find(|f| f.strike.worker == WATCHED)
    }
}

/// How long past its pause a frozen worker may wait for another worker to meet it, before
/// it is resumed anyway and its point reported as not exercised.
pub(super) const EXERCISE_WAIT: Duration = Duration::from_secs(10);

/// Who is told `start` when: the struck workers one by one, then the others together.
struct Starts {
    struck: Vec<String>,
    others: Vec<String>,
}

/// The run as it plays: who is to start next, the faults so far, the workers done.
struct Watching {
    order: Starts,
    /// The struck worker started last, until it stops (or 10 s pass).
    pending: Option<(String, Instant)>,
    faults: Faults,
    finished: HashMap<String, Tally>,
    latencies: Vec<u64>,
    dead: Vec<String>,
}

impl Watching {
    /// Once the struck worker started last has stopped (or finished, or 10 s passed), the
    /// next struck worker starts; after the last of them, all the others at once.
    fn start_next(&mut self, workers: &mut [WorkerHandle]) -> Result<()> {
        if let Some((name, since)) = &self.pending
            && (self.faults.frozen.iter().any(|f| &f.strike.worker == name)
                || self.faults.killed.is_some() && name == KILLED
                || self.finished.contains_key(name)
                || since.elapsed() > Duration::from_secs(10))
        {
            self.pending = None;
        }
        if self.pending.is_some() {
            return Ok(());
        }
        if let Some(name) = self.order.struck.pop() {
            find(workers, &name)?.tell("start")?;
            self.pending = Some((name, Instant::now()));
        } else {
            for name in self.order.others.drain(..) {
                find(workers, &name)?.tell("start")?;
            }
        }
        Ok(())
    }

    /// Has every live worker finished? A worker that exited before it did ends the run
    /// with its error.
    fn all_finished(&self, stage: &mut Stage, workers: &[WorkerHandle]) -> Result<bool> {
        let live: Vec<&WorkerHandle> = (workers.iter())
            .filter(|w| !self.dead.contains(&w.name))
            .collect();
        if live.iter().all(|w| self.finished.contains_key(&w.name)) {
            return Ok(true);
        }
        let gone = live
            .iter()
            .find(|w| stage.has_exited(&w.name) && !self.finished.contains_key(&w.name));
        if let Some(gone) = gone {
            stage.drain();
            if let Some(failed) = stage.log.iter().find(|e| e.kind() == Kind::Error) {
                return Err(crate::labs::worker_failed(&failed.worker, &failed.text));
            }
            bail!("worker {} exited before it finished the list", gone.name);
        }
        Ok(false)
    }
}

/// Waits until `count` workers said they are ready (30 s at most).
fn wait_until_ready(stage: &mut Stage, count: usize) -> Result<()> {
    let mut ready = 0;
    let wait_ready = Instant::now() + Duration::from_secs(30);
    while ready < count {
        let left = wait_ready
            .checked_duration_since(Instant::now())
            .ok_or_else(|| anyhow!("timed out waiting for the workers to connect"))?;
        if let Some(event) = stage.next_silent(left.min(Duration::from_millis(50))) {
            match event.kind() {
                Kind::Ready => ready += 1,
                Kind::Error => {
                    return Err(crate::labs::worker_failed(&event.worker, &event.text));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// A worker the lab struck: where (the checkers' evidence), since when, and the Redis lock
/// it held, if any.
pub(super) struct Struck {
    pub(super) strike: Strike,
    pub(super) resumed: bool,
    pub(super) at: Instant,
    pub(super) lock_key: Option<String>,
    pub(super) owner: Option<String>,
    /// The workers that waited on its locks when it was resumed: they read before its
    /// COMMIT (see [`Play::worst_order_missed`]).
    pub(super) waiters: Vec<String>,
}

impl Struck {
    /// From the worker's own report of where it stopped.
    pub(super) fn from(event: &Event) -> Result<Struck> {
        let What::Claimed(claimed) = &event.what else {
            bail!("{} stopped without saying where", event.worker);
        };
        Ok(Struck {
            strike: Strike {
                worker: event.worker.clone(),
                at: claimed.moment.context("a stop without its moment")?,
                job: claimed.job.context("a stop without its job")? as i32,
                customer: claimed.customer.context("a stop without its customer")? as i32,
                exercised: false,
            },
            resumed: false,
            at: Instant::now(),
            lock_key: claimed.lock_key.clone(),
            owner: claimed.owner.clone(),
            waiters: Vec::new(),
        })
    }
}

impl Play<'_> {
    pub(super) fn session(&self, worker: &str) -> String {
        format!(
            "lockslab-{}-{}-{}",
            self.run_id,
            self.approach.name(),
            worker
        )
    }

    /// How long past its pause a frozen worker waits for another worker to meet it. No
    /// wait when the pause is within a Redis lease: waiting would stretch the freeze past
    /// the TTL, and the run would no longer be the one asked for.
    pub(super) fn exercise_wait(&self) -> Duration {
        if self.approach.uses_redis() && self.plan.pause <= self.plan.ttl {
            Duration::ZERO
        } else {
            EXERCISE_WAIT
        }
    }

    pub(super) fn role(
        &self,
        name: &str,
        index: u32,
        start_at: usize,
        stop_at: Option<Moment>,
    ) -> Role {
        let prefix = format!(
            "lockslab:{}:no-lock:{}:{}:",
            self.run_id,
            self.workers,
            self.approach.name()
        );
        let run_bits = u32::from_str_radix(self.run_id, 16).unwrap_or(7);
        let approach_index = Approach::ALL
            .iter()
            .position(|&a| a == self.approach)
            .unwrap_or(0) as u32;
        Role {
            name: name.to_string(),
            approach: self.approach,
            postgres_url: self.pg_url.to_string(),
            redis_url: self
                .approach
                .uses_redis()
                .then(|| self.redis_url.unwrap_or_default().to_string()),
            tables: self.tables.clone(),
            session: self.session(name),
            start_at,
            partition: (self.approach == Approach::Partitioned).then_some((index, self.workers)),
            stop_at,
            work_ms: self.plan.work.as_millis() as u64,
            ttl_ms: self.plan.ttl.as_millis() as u64,
            lock_wait_ms: (self.plan.ttl + self.plan.pause + Duration::from_secs(30)).as_millis()
                as u64,
            statement_timeout_ms: (self.plan.pause + Duration::from_secs(30)).as_millis() as u64,
            lock_class: (run_bits.rotate_left(3) ^ (self.workers << 4) ^ approach_index) as i32,
            redis_key_prefix: format!("{prefix}customer:"),
            fence_counter: format!("{prefix}fence"),
        }
    }

    pub(super) fn run(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        schema: &str,
    ) -> Result<ApproachVerdict> {
        self.make_tables(db, schema)?;
        self.say_heading(stage);
        let (mut workers, order) = self.spawn_workers(stage)?;
        let mut hand = Hand::new(stage);
        let (faults, tallies, latencies) = self.watch(stage, db, &mut hand, &mut workers, order)?;
        for worker in &mut workers {
            worker.finish(Duration::from_secs(5));
        }
        stage.drain();
        self.judge(stage, db, faults, tallies, latencies)
    }

    /// The approach's own jobs, invoices and customers tables, filled.
    fn make_tables(&self, db: &mut PgClient, schema: &str) -> Result<()> {
        let name = self.approach.name();
        let t = &self.tables;
        db.batch_execute(&t.sql(invoices::CREATE_TABLES))
            .with_context(|| format!("creating {name}'s tables in {schema}"))?;
        db.batch_execute(&t.sql(if self.approach == Approach::IdempotencyKey {
            invoices::UNIQUE_INVOICES
        } else {
            invoices::INDEX_INVOICES
        }))?;
        db.execute(
            &t.sql(invoices::FILL_JOBS),
            &[&(self.plan.jobs as i32), &(self.plan.keys as i32)],
        )?;
        db.execute(
            &t.sql(invoices::FILL_CUSTOMERS),
            &[&(self.plan.keys as i32)],
        )?;
        Ok(())
    }

    /// The approach's heading: red for a lesson, green for a safe approach.
    fn say_heading(&self, stage: &mut Stage) {
        let name = self.approach.name();
        stage.tags().approach = Some(name.into());
        stage.tags().workers = Some(self.workers);
        stage.timeline.say("");
        let heading = if self.plan.contention {
            format!("── {name}, {} workers ──", self.workers)
        } else {
            format!("── {name} ──")
        };
        let heading = if self.approach.safe() {
            heading.green().bold()
        } else {
            heading.red().bold()
        };
        stage.timeline.say(&heading.to_string());
    }

    /// Starts the workers and waits until each has connected. The struck workers go
    /// first, one at a time, each to its stop on its first job; the others start once all
    /// of them have stopped, so that nobody takes a struck job first, and the struck job is
    /// the first one each paired worker comes to after its own.
    fn spawn_workers(&self, stage: &mut Stage) -> Result<(Vec<WorkerHandle>, Starts)> {
        let fault = self.plan.fault;
        let struck = match fault {
            Fault::Both | Fault::Freeze => VICTIMS,
            Fault::Kill => 2,
            Fault::None => 0,
        };
        let starts = points::starts(self.plan.jobs, self.workers, self.plan.keys, struck);
        let mut workers: Vec<WorkerHandle> = Vec::new();
        for i in 0..self.workers {
            let name = format!("w{}", i + 1);
            let stop_at = points::stop_at(&name, fault.freezes(), fault.kills());
            let role = self.role(&name, i, starts[i as usize], stop_at);
            workers.push(stage.spawn(&name, &WorkerSpec::Invoicer(role))?);
        }
        wait_until_ready(stage, workers.len())?;
        let t = &self.tables;
        stage.record(Event::new(
            "lab",
            Workers {
                pids: workers.iter().map(|w| w.pid).collect(),
                run_id: Some(self.run_id.into()),
                invoices_table: Some(t.name("invoices")),
            },
            format!(
                "{} workers go through {} jobs; tables {}",
                self.workers,
                self.plan.jobs,
                t.name("*")
            ),
        ));
        let (struck, others): (Vec<&WorkerHandle>, Vec<&WorkerHandle>) = workers
            .iter()
            .partition(|w| points::stop_at(&w.name, fault.freezes(), fault.kills()).is_some());
        let names = |ws: Vec<&WorkerHandle>| ws.iter().map(|w| w.name.clone()).collect();
        let order = Starts {
            struck: names(struck),
            others: names(others),
        };
        Ok((workers, order))
    }

    /// Plays the faults as the workers reach them, until every live worker has finished.
    fn watch(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        hand: &mut Hand,
        workers: &mut Vec<WorkerHandle>,
        mut order: Starts,
    ) -> Result<(Faults, Vec<Tally>, Vec<u64>)> {
        order.struck.reverse();
        let fault = self.plan.fault;
        let mut watching = Watching {
            order,
            pending: None,
            faults: Faults::default(),
            finished: HashMap::new(),
            latencies: Vec::new(),
            dead: Vec::new(),
        };
        let mut redis_watch: Option<RedisConn> = match (self.approach.uses_redis(), self.redis_url)
        {
            (true, Some(url)) if fault.freezes() => Some(connect::redis(url)?),
            _ => None,
        };
        let deadline = Instant::now() + self.plan.pause + Duration::from_secs(120);
        loop {
            if Instant::now() > deadline {
                bail!(
                    "timed out waiting for the workers of {}",
                    self.approach.name()
                );
            }
            if let Some(event) = stage.next(Duration::from_millis(10)) {
                self.heard(stage, db, hand, workers, &mut watching, &event)?;
            }
            watching.start_next(workers)?;
            self.resume_due(stage, db, hand, workers, &mut watching.faults)?;
            self.open_doors(stage, db, &mut watching.faults)?;
            if watching.faults.watched().is_some_and(|f| !f.resumed)
                && let Some(conn) = redis_watch.as_mut()
            {
                self.watch_lock(stage, conn, &mut watching.faults)?;
            }
            if watching.all_finished(stage, workers)? {
                break;
            }
        }
        let Watching {
            faults,
            finished,
            latencies,
            ..
        } = watching;
        Ok((faults, finished.into_values().collect(), latencies))
    }

    /// A worker's event while the run plays: a worker at its stop is frozen or killed
    /// there; a finished worker's counts are kept.
    fn heard(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        hand: &mut Hand,
        workers: &mut Vec<WorkerHandle>,
        watching: &mut Watching,
        event: &Event,
    ) -> Result<()> {
        let fault = self.plan.fault;
        match (event.kind(), event.worker.as_str()) {
            (Kind::Error, who) => Err(crate::labs::worker_failed(who, &event.text)),
            (Kind::Claimed, who)
                if who != KILLED && points::stop_at(who, fault.freezes(), false).is_some() =>
            {
                let struck = Struck::from(event)?;
                self.freeze(stage, db, hand, find(workers, who)?, &struck)?;
                watching.faults.frozen.push(struck);
                Ok(())
            }
            (Kind::Claimed, KILLED) if fault.kills() => {
                let struck = Struck::from(event)?;
                self.kill(stage, hand, find(workers, KILLED)?, &struck)?;
                watching.dead.push(KILLED.into());
                watching.faults.killed = Some(struck);
                if self.approach == Approach::Partitioned {
                    self.replace_owner(stage, workers)?;
                }
                Ok(())
            }
            (Kind::Finished, who) => {
                let What::Finished(said) = &event.what else {
                    unreachable!("a finished event")
                };
                let tally: Tally = said
                    .tally
                    .clone()
                    .with_context(|| format!("{who}'s counts"))?;
                (watching.latencies).extend(said.latencies_us.iter().flatten());
                watching.finished.insert(who.to_string(), tally);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Past its pause, a frozen worker is resumed once another worker has met it (waits
    /// on its locks, or has done its job), or once that wait runs out. Workers waiting on
    /// it are let write first: the lab holds the customer's Redis lock meanwhile ([`Door`]).
    fn resume_due(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        hand: &mut Hand,
        workers: &mut [WorkerHandle],
        faults: &mut Faults,
    ) -> Result<()> {
        let pause = self.plan.pause;
        let due: Vec<(String, bool)> = faults
            .frozen
            .iter()
            .filter(|f| !f.resumed && f.at.elapsed() >= pause)
            .map(|f| {
                (
                    f.strike.worker.clone(),
                    f.at.elapsed() >= pause + self.exercise_wait(),
                )
            })
            .collect();
        for (who, waited_enough) in due {
            let met = self.met(db, faults, &who)?;
            if let Some(Met::Waiting(waiters)) = &met
                && !waited_enough
                && !self.hold_door(stage, faults, &who, waiters)?
            {
                continue;
            }
            if met.is_some() || waited_enough {
                self.resume(stage, db, hand, workers, faults, &who, met)?;
            }
        }
        Ok(())
    }

    /// Partitioned: a supervisor starts a new owner for the killed worker's partition —
    /// only now that the old one is dead for certain (killed and reaped).
    fn replace_owner(&self, stage: &mut Stage, workers: &mut Vec<WorkerHandle>) -> Result<()> {
        let name = "w2r";
        let mut role = self.role(name, 1, 0, None);
        role.session = self.session(name);
        let mut worker = stage.spawn(name, &WorkerSpec::Invoicer(role))?;
        worker.tell("start")?;
        stage.record(Event::new(
            "lab",
            What::Reclaimed(Handover {
                pid: Some(worker.pid),
                ..Handover::default()
            }),
            format!(
                "w2 is dead and reaped: starts w2r (pid {}) as the new owner of w2's \
                     partition",
                worker.pid
            ),
        ));
        workers.push(worker);
        Ok(())
    }
}

pub(super) fn find<'a>(
    workers: &'a mut [WorkerHandle],
    name: &str,
) -> Result<&'a mut WorkerHandle> {
    workers
        .iter_mut()
        .find(|w| w.name == name)
        .ok_or_else(|| anyhow!("no worker {name}"))
}
