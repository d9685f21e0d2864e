//! Lab 7 — the same job done safely without a lock service, under the same freeze and kill.
//!
//! Ten worker processes race through one list of jobs: issue the invoice for (customer,
//! period) and add its amount to the customer's balance ([`crate::invoices`] has the job and
//! the SQL of every approach). In every approach's run the lab freezes four workers, each
//! at another point of a job (SIGSTOP, longer than the Redis lock's TTL), and SIGKILLs `w2`
//! between its two writes ([`super::no_lock_points`] has the roster):
//!
//! ```text
//!  w3  ❄ before its read ──────────────────────────────────────────────▶ wakes, reads, writes ?
//!  w1  reads, decides ❄ ───────────────────────────────────────────────▶ wakes, writes ?
//!  w4  reads, decides, writes one row ❄ ───────────────────────────────▶ wakes, writes, commits ?
//!  w5  reads, decides, writes both rows ❄ ─────────────────────────────▶ wakes, commits ?
//!  w2  reads, decides, writes one row ✖ killed before COMMIT
//!  w6…  go on with the list, the frozen and the killed jobs included
//! ```
//!
//! Then the tables are read back: invoices per (customer, period) must be exactly one, and
//! every balance must equal the sum of its invoices. The Redis lock without fencing fails
//! from the read on; the one whose token fences only the write fails inside the
//! transaction; every other approach passes every point, at different costs — which the
//! closing tables put side by side.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use colored::Colorize;
use serde::Serialize;
use serde_json::json;

use super::leftovers::Leftovers;
use super::no_lock_points::{self as points, KILLED, PointVerdict, VICTIMS, WATCHED};
use super::{LONGEST_LAB_WAIT, LONGEST_STEP, OutputArgs, Stage, WorkerHandle, duration_in};
use crate::connect::{self, Backend, PgClient, RedisConn};
use crate::events::{Event, Kind};
use crate::invoices::{self, Approach, Moment, Tables, Tally, Verdict};
use crate::output::{Style, human, json_line, table};
use crate::servers::{self, ServerArgs};
use crate::worker::WorkerSpec;
use crate::worker::invoicer::Role;

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab no-lock                      all eight approaches, freezes and kill in each
  lockslab no-lock optimistic           one approach
  lockslab no-lock --fault freeze       only the freeze
  lockslab no-lock --keys 2             two customers: heavy contention
  lockslab no-lock --contention         2 to 32 workers on 4 customers, no faults
  lockslab no-lock --json | jq .        events and verdict as JSON Lines

By hand, with psql in two terminals: see labs/07-no-lock.md.", crate::lab_exit_status_help!()))]
pub struct NoLockArgs {
    /// Run only this approach
    #[arg(value_enum)]
    pub approach: Option<Approach>,
    /// Worker processes (1 to 50)
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub workers: u32,
    /// Jobs on the list: one invoice each (1 to 100000)
    #[arg(long, default_value_t = 200, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub jobs: u32,
    /// Customers the jobs are spread over: fewer means more contention (1 to 100000)
    #[arg(long, default_value_t = 20, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub keys: u32,
    /// Which faults to inject in each approach's run
    #[arg(long, value_enum, default_value_t = Fault::Both)]
    pub fault: Fault,
    /// How long each frozen worker stays frozen (100ms to 10m); keep it above --ttl
    #[arg(long, default_value = "1500ms",
          value_parser = duration_in(Duration::from_millis(100), LONGEST_LAB_WAIT),
          value_name = "DURATION")]
    pub pause: Duration,
    /// The Redis lock's TTL in the Redis approaches (100ms to 10m)
    #[arg(long, default_value = "500ms",
          value_parser = duration_in(Duration::from_millis(100), LONGEST_LAB_WAIT),
          value_name = "DURATION")]
    pub ttl: Duration,
    /// Simulated work per job, between deciding and writing (at most 1m)
    #[arg(long, default_value = "2ms", value_parser = duration_in(Duration::ZERO, LONGEST_STEP),
          value_name = "DURATION")]
    pub work: Duration,
    /// Sweep the workers (2, 4, 8, 16, 32) on --keys customers (default 4) with no faults,
    /// and show how the retries grow (optimistic, idempotency-key, partitioned and
    /// advisory-xact, unless an approach is named)
    #[arg(long, conflicts_with = "fault")]
    pub contention: bool,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    /// Freeze w1, w3, w4, w5 and kill w2
    Both,
    /// SIGKILL w2 while it writes a job
    Kill,
    /// SIGSTOP w3, w1, w4, w5 at four points of a job: before the read, after it, between
    /// the two writes, before COMMIT
    Freeze,
    /// No faults: the speed
    None,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Both => "both",
            Fault::Kill => "kill",
            Fault::Freeze => "freeze",
            Fault::None => "none",
        }
    }
    fn freeze(self) -> bool {
        matches!(self, Fault::Both | Fault::Freeze)
    }
    fn kill(self) -> bool {
        matches!(self, Fault::Both | Fault::Kill)
    }
}

/// The workers the contention sweep runs, and the approaches it compares by default.
const SWEEP: [u32; 5] = [2, 4, 8, 16, 32];
const SWEPT: [Approach; 4] = [
    Approach::Optimistic,
    Approach::IdempotencyKey,
    Approach::Partitioned,
    Approach::AdvisoryXact,
];

/// One approach's verdict: the `--json` verdict's `approaches` entries.
#[derive(Serialize, Clone, Debug)]
pub struct ApproachVerdict {
    pub name: &'static str,
    pub workers: u32,
    /// Jobs with two invoices or more.
    pub duplicates: i64,
    /// Customers whose balance is not the sum of their invoices.
    pub lost_updates: i64,
    /// Jobs with no invoice.
    pub lost_jobs: i64,
    /// The lab marks it ✅: right whatever point of a job a freeze lands on.
    pub safe: bool,
    /// From the first invoice to the moment the last job got its first one, on the
    /// database's clock. Under a fault this is the time to finish, freezes included.
    pub finished_in_s: f64,
    /// Jobs over `finished_in_s`: a throughput only when no fault was played.
    pub jobs_per_s: Option<f64>,
    /// Attempts that did nothing: version conflicts, ON CONFLICT no-ops, refused tokens,
    /// and lock spins (`lock_retries`).
    pub retries: u64,
    pub conflicts: u64,
    pub no_ops: u64,
    pub rejected: u64,
    /// Redis lock attempts that found the lock taken (waiting, not wasted writes).
    pub lock_retries: u64,
    /// Releases that found the lease already ended by Redis.
    pub leases_lost: u64,
    /// Requests to Postgres and Redis per job, over the workers that finished.
    pub round_trips_per_job: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Every frozen worker's job came out right (null: no freeze).
    pub correct_under_freeze: Option<bool>,
    /// Each freeze, by the point of the job it landed on.
    pub freezes: Vec<PointVerdict>,
    /// The killed job came out right and no job was lost (null: no kill).
    pub correct_under_kill: Option<bool>,
    /// w1's job (frozen after its read).
    pub frozen_job: Option<i32>,
    pub killed_job: Option<i32>,
    /// Jobs whose first invoice came only after the first frozen worker was resumed.
    pub waited_for_the_freeze: Option<i64>,
    pub needs: &'static str,
}

pub fn run(args: &NoLockArgs) -> Result<()> {
    check_args(args)?;
    let style = Style::detect(args.output.json);
    let approaches: Vec<Approach> = match args.approach {
        Some(one) => vec![one],
        // The sweep is about contention on the database: four approaches, no Redis.
        None if args.contention => SWEPT.to_vec(),
        None => Approach::ALL.to_vec(),
    };
    let needs: Vec<Backend> = if approaches.iter().any(|a| a.uses_redis()) {
        vec![Backend::Redis, Backend::Postgres]
    } else {
        vec![Backend::Postgres]
    };
    let servers = servers::provide(&args.servers, &needs)?;
    let pg_url = servers.url(Backend::Postgres).to_string();
    let redis_url = needs
        .contains(&Backend::Redis)
        .then(|| servers.url(Backend::Redis).to_string());
    let run_id = super::new_run_id();

    let intro = crate::output::Timeline::new(style);
    intro.say(&crate::output::run_heading("no-lock", &run_id));
    for line in servers.describe() {
        intro.say(&format!("  {}", line.dimmed()));
    }
    let keys = if args.contention && args.keys == 20 {
        4
    } else {
        args.keys
    };
    intro.say(&format!(
        "{} jobs: invoice (customer, period) once, add it to the balance once; {} customers.",
        args.jobs, keys
    ));

    let schema = invoices::schema_of(&run_id);
    let mut leftovers =
        Leftovers::of_run(&run_id).sql(&pg_url, &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
    if let Some(url) = &redis_url {
        leftovers = leftovers.redis(url);
    }
    let removal = leftovers.removed_at_the_end();
    let mut verdicts = Vec::new();
    let result = (|| -> Result<()> {
        let mut db = connect::postgres(&pg_url)?;
        db.batch_execute(&format!("CREATE SCHEMA {schema}"))
            .with_context(|| format!("creating the schema {schema}"))?;
        let mut stage = Stage::new(style);
        let plays: Vec<(Approach, u32)> = if args.contention {
            SWEEP
                .iter()
                .flat_map(|&w| approaches.iter().map(move |&a| (a, w)))
                .collect()
        } else {
            approaches.iter().map(|&a| (a, args.workers)).collect()
        };
        for (approach, workers) in plays {
            let play = Play {
                args,
                approach,
                workers,
                keys,
                fault: if args.contention {
                    Fault::None
                } else {
                    args.fault
                },
                run_id: &run_id,
                pg_url: &pg_url,
                redis_url: redis_url.as_deref(),
                tables: if args.contention {
                    let mut tables = Tables::new(&run_id, approach);
                    tables.approach = format!("{}_w{workers}", tables.approach);
                    tables
                } else {
                    Tables::new(&run_id, approach)
                },
            };
            stage.checkpoint(&super::step::no_lock::BEFORE_APPROACH);
            verdicts.push(play.run(&mut stage, &mut db, &schema)?);
        }
        Ok(())
    })()
    .map_err(connect::explain);
    removal.now(&result);
    result?;
    super::step::checkpoint(&super::step::no_lock::VERDICT);

    if style.json {
        json_line(&json!({
            "kind": "verdict",
            "json_version": super::JSON_VERSION,
            "lab": "no-lock",
            "run_id": run_id,
            "jobs": args.jobs,
            "keys": keys,
            "fault": if args.contention { Fault::None } else { args.fault },
            "pause_ms": args.pause.as_millis() as u64,
            "ttl_ms": args.ttl.as_millis() as u64,
            "contention": args.contention,
            "approaches": verdicts,
        }));
    } else if args.contention {
        print_sweep(&verdicts);
    } else {
        print_verdict(args, &verdicts);
    }
    Ok(())
}

fn check_args(args: &NoLockArgs) -> Result<()> {
    if args.contention {
        return Ok(());
    }
    let (needed, why) = match args.fault {
        Fault::Both => (6, "four to freeze, one to kill, one to carry on"),
        Fault::Kill => (2, "one to kill, one to carry on"),
        Fault::Freeze => (5, "four to freeze, one to carry on"),
        Fault::None => (1, "someone has to do the jobs"),
    };
    if args.workers < needed {
        crate::bail_usage!(
            "--workers {}: --fault {} needs at least {needed} ({why})",
            args.workers,
            args.fault.name()
        );
    }
    if args.workers > 50 {
        crate::bail_usage!("--workers {}: at most 50", args.workers);
    }
    if args.fault == Fault::Both && (args.keys < 2 || args.jobs < 2) {
        crate::bail_usage!(
            "--keys {} --jobs {}: --fault both needs two customers and two jobs (the frozen \
             and the killed jobs must not all be the same customer's)",
            args.keys,
            args.jobs
        );
    }
    Ok(())
}

/// One approach's run, on its own tables and workers.
struct Play<'a> {
    args: &'a NoLockArgs,
    approach: Approach,
    workers: u32,
    keys: u32,
    fault: Fault,
    run_id: &'a str,
    pg_url: &'a str,
    redis_url: Option<&'a str>,
    tables: Tables,
}

/// What the lab saw of its faults while the run played.
#[derive(Default)]
struct Faults {
    /// Every frozen worker, in the order they stopped.
    frozen: Vec<Struck>,
    killed: Option<Struck>,
    /// When the first frozen worker was resumed, on the database's clock.
    resumed_at: Option<SystemTime>,
    expired_seen: bool,
    taken_seen: bool,
}

impl Faults {
    fn watched(&self) -> Option<&Struck> {
        self.frozen.iter().find(|f| f.worker == WATCHED)
    }
}

/// Who is told `start` when: the struck workers one by one, then the others together.
struct Starts {
    struck: Vec<String>,
    others: Vec<String>,
}

struct Struck {
    worker: String,
    moment: Moment,
    resumed: bool,
    job: i32,
    customer: i32,
    at: Instant,
    lock_key: Option<String>,
    owner: Option<String>,
}

impl Play<'_> {
    fn session(&self, worker: &str) -> String {
        format!(
            "lockslab-{}-{}-{}",
            self.run_id,
            self.approach.name(),
            worker
        )
    }

    fn role(&self, name: &str, index: u32, start_at: usize, stop_at: Option<Moment>) -> Role {
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
            work_ms: self.args.work.as_millis() as u64,
            ttl_ms: self.args.ttl.as_millis() as u64,
            lock_wait_ms: (self.args.ttl + self.args.pause + Duration::from_secs(30)).as_millis()
                as u64,
            statement_timeout_ms: (self.args.pause + Duration::from_secs(30)).as_millis() as u64,
            lock_class: (run_bits.rotate_left(3) ^ (self.workers << 4) ^ approach_index) as i32,
            redis_key_prefix: format!("{prefix}customer:"),
            fence_counter: format!("{prefix}fence"),
        }
    }

    fn run(&self, stage: &mut Stage, db: &mut PgClient, schema: &str) -> Result<ApproachVerdict> {
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
            &[&(self.args.jobs as i32), &(self.keys as i32)],
        )?;
        db.execute(&t.sql(invoices::FILL_CUSTOMERS), &[&(self.keys as i32)])?;

        stage.tag("approach", name);
        stage.tag("workers", self.workers);
        stage.timeline.say("");
        let heading = if self.args.contention {
            format!("── {name}, {} workers ──", self.workers)
        } else {
            format!("── {name} ──")
        };
        stage.timeline.say(&format!(
            "{}",
            if !self.approach.safe() {
                heading.red().bold()
            } else {
                heading.green().bold()
            }
        ));

        let struck = match self.fault {
            Fault::Both | Fault::Freeze => VICTIMS,
            Fault::Kill => 2,
            Fault::None => 0,
        };
        let starts = points::starts(self.args.jobs, self.workers, self.keys, struck);
        let mut workers: Vec<WorkerHandle> = Vec::new();
        for i in 0..self.workers {
            let worker_name = format!("w{}", i + 1);
            let stop_at = points::stop_at(&worker_name, self.fault.freeze(), self.fault.kill());
            let role = self.role(&worker_name, i, starts[i as usize], stop_at);
            workers.push(stage.spawn(&worker_name, &WorkerSpec::Invoicer(role))?);
        }
        let mut ready = 0;
        let wait_ready = Instant::now() + Duration::from_secs(30);
        while ready < workers.len() {
            let left = wait_ready
                .checked_duration_since(Instant::now())
                .ok_or_else(|| anyhow!("timed out waiting for the workers to connect"))?;
            if let Some(event) = stage.next_silent(left.min(Duration::from_millis(50))) {
                match event.kind {
                    Kind::Ready => ready += 1,
                    Kind::Error => return Err(super::worker_failed(&event.worker, &event.text)),
                    _ => {}
                }
            }
        }
        let pids: Vec<i32> = workers.iter().map(|w| w.pid).collect();
        stage.record(
            Event::new(
                "lab",
                Kind::Workers,
                format!(
                    "{} workers go through {} jobs; tables {}",
                    self.workers,
                    self.args.jobs,
                    t.name("*")
                ),
            )
            .with("pids", pids)
            .with("run_id", self.run_id)
            .with("invoices_table", t.name("invoices")),
        );
        // The struck workers go first, one at a time, each to its stop on its first job; the
        // others start once all of them have stopped, so that nobody takes a struck job
        // first, and the struck job is the first one each paired worker comes to after its own.
        let (struck, others): (Vec<&WorkerHandle>, Vec<&WorkerHandle>) =
            workers.iter().partition(|w| {
                points::stop_at(&w.name, self.fault.freeze(), self.fault.kill()).is_some()
            });
        let names = |ws: Vec<&WorkerHandle>| ws.iter().map(|w| w.name.clone()).collect();
        let order = Starts {
            struck: names(struck),
            others: names(others),
        };

        let (faults, tallies, latencies) = self.watch(stage, db, &mut workers, order)?;
        for worker in &mut workers {
            worker.finish(Duration::from_secs(5));
        }
        stage.drain();
        self.judge(stage, db, faults, tallies, latencies)
    }

    /// Plays the faults as the workers reach them, until every live worker has finished.
    fn watch(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        workers: &mut Vec<WorkerHandle>,
        mut order: Starts,
    ) -> Result<(Faults, Vec<Tally>, Vec<u64>)> {
        order.struck.reverse();
        // The struck worker started last, until it stops (or 10 s pass).
        let mut pending: Option<(String, Instant)> = None;
        let pause = self.args.pause;
        let mut faults = Faults::default();
        let mut finished: HashMap<String, Tally> = HashMap::new();
        let mut latencies = Vec::new();
        let mut dead: Vec<String> = Vec::new();
        let mut redis_watch: Option<RedisConn> = match (self.approach.uses_redis(), self.redis_url)
        {
            (true, Some(url)) if self.fault.freeze() => Some(connect::redis(url)?),
            _ => None,
        };
        let deadline = Instant::now() + pause + Duration::from_secs(120);
        loop {
            if Instant::now() > deadline {
                bail!(
                    "timed out waiting for the workers of {}",
                    self.approach.name()
                );
            }
            if let Some(event) = stage.next(Duration::from_millis(10)) {
                match (event.kind, event.worker.as_str()) {
                    (Kind::Error, who) => return Err(super::worker_failed(who, &event.text)),
                    (Kind::Claimed, who)
                        if who != KILLED
                            && points::stop_at(who, self.fault.freeze(), false).is_some() =>
                    {
                        let struck = struck(&event)?;
                        let worker = find(workers, who)?;
                        worker.freeze()?;
                        if !crate::procs::wait_until_stopped(worker.pid, Duration::from_secs(2)) {
                            bail!(
                                "worker {who} (pid {}) did not stop after SIGSTOP",
                                worker.pid
                            );
                        }
                        worker.tell("go")?;
                        stage.record(
                            Event::new(
                                "lab",
                                Kind::Frozen,
                                format!(
                                    "SIGSTOP {who} (pid {}) at job {}, {}; resumes in {}",
                                    worker.pid,
                                    struck.job,
                                    struck.moment.label(),
                                    human(pause)
                                ),
                            )
                            .with("pid", worker.pid)
                            .with("job", struck.job)
                            .with("customer", struck.customer)
                            .with("at", serde_json::to_value(struck.moment)?),
                        );
                        if self.fault.freeze()
                            && who == WATCHED
                            && matches!(
                                self.approach,
                                Approach::AdvisoryXact | Approach::AdvisorySession
                            )
                        {
                            let class = self.role(WATCHED, 0, 0, None).lock_class;
                            stage.record(points::skip_rather_than_queue(
                                db,
                                class,
                                struck.customer,
                            )?);
                        }
                        faults.frozen.push(struck);
                    }
                    (Kind::Claimed, KILLED) if self.fault.kill() => {
                        let worker = find(workers, KILLED)?;
                        worker.kill();
                        dead.push(KILLED.into());
                        let struck = struck(&event)?;
                        stage.record(
                            Event::new(
                                "lab",
                                Kind::Killed,
                                format!(
                                    "SIGKILL w2 (pid {}) in the middle of job {}: its \
                                     transaction is not committed",
                                    worker.pid, struck.job
                                ),
                            )
                            .with("pid", worker.pid)
                            .with("job", struck.job)
                            .with("customer", struck.customer),
                        );
                        faults.killed = Some(struck);
                        if self.approach == Approach::Partitioned {
                            self.replace_owner(stage, workers)?;
                        }
                    }
                    (Kind::Finished, who) => {
                        let tally: Tally = serde_json::from_value(
                            event.data.get("tally").cloned().unwrap_or_default(),
                        )
                        .with_context(|| format!("{who}'s counts"))?;
                        if let Some(list) = event.data.get("latencies_us") {
                            latencies.extend(serde_json::from_value::<Vec<u64>>(list.clone())?);
                        }
                        finished.insert(who.to_string(), tally);
                    }
                    _ => {}
                }
            }
            if let Some((name, since)) = &pending
                && (faults.frozen.iter().any(|f| &f.worker == name)
                    || faults.killed.is_some() && name == KILLED
                    || finished.contains_key(name)
                    || since.elapsed() > Duration::from_secs(10))
            {
                pending = None;
            }
            if pending.is_none() {
                if let Some(name) = order.struck.pop() {
                    find(workers, &name)?.tell("start")?;
                    pending = Some((name, Instant::now()));
                } else {
                    for name in order.others.drain(..) {
                        find(workers, &name)?.tell("start")?;
                    }
                }
            }
            let due: Vec<String> = faults
                .frozen
                .iter()
                .filter(|f| !f.resumed && f.at.elapsed() >= pause)
                .map(|f| f.worker.clone())
                .collect();
            for who in due {
                self.resume(stage, db, workers, &mut faults, &who)?;
            }
            if faults.watched().is_some_and(|f| !f.resumed)
                && let Some(conn) = redis_watch.as_mut()
            {
                self.watch_lock(stage, conn, &mut faults)?;
            }
            let live: Vec<&WorkerHandle> =
                workers.iter().filter(|w| !dead.contains(&w.name)).collect();
            if live.iter().all(|w| finished.contains_key(&w.name)) {
                break;
            }
            if let Some(gone) = live
                .iter()
                .find(|w| stage.has_exited(&w.name) && !finished.contains_key(&w.name))
            {
                stage.drain();
                if let Some(failed) = stage.log.iter().find(|e| e.kind == Kind::Error) {
                    return Err(super::worker_failed(&failed.worker, &failed.text));
                }
                bail!("worker {} exited before it finished the list", gone.name);
            }
        }
        Ok((faults, finished.into_values().collect(), latencies))
    }

    /// Partitioned: a supervisor starts a new owner for the killed worker's partition —
    /// only now that the old one is dead for certain (killed and reaped).
    fn replace_owner(&self, stage: &mut Stage, workers: &mut Vec<WorkerHandle>) -> Result<()> {
        let name = "w2r";
        let mut role = self.role(name, 1, 0, None);
        role.session = self.session(name);
        let mut worker = stage.spawn(name, &WorkerSpec::Invoicer(role))?;
        worker.tell("start")?;
        stage.record(
            Event::new(
                "lab",
                Kind::Reclaimed,
                format!(
                    "w2 is dead and reaped: starts w2r (pid {}) as the new owner of w2's \
                     partition",
                    worker.pid
                ),
            )
            .with("pid", worker.pid),
        );
        workers.push(worker);
        Ok(())
    }

    /// During the freeze: the frozen worker's Redis lock as Redis sees it.
    fn watch_lock(
        &self,
        stage: &mut Stage,
        conn: &mut RedisConn,
        faults: &mut Faults,
    ) -> Result<()> {
        let Some(frozen) = faults.watched() else {
            return Ok(());
        };
        let (Some(key), Some(owner)) = (frozen.lock_key.clone(), frozen.owner.clone()) else {
            return Ok(());
        };
        let customer = frozen.customer;
        let (now, _) = crate::lock::redis::owner_and_pttl(conn, &key)
            .context("watching w1's lock in Redis")?;
        if now.as_ref() != Some(&owner) && !faults.expired_seen {
            faults.expired_seen = true;
            stage.record(Event::new(
                "redis",
                Kind::Expired,
                format!("w1's lock on customer {customer} has expired: for Redis the lock is free"),
            ));
        }
        if now.is_some() && now.as_ref() != Some(&owner) && !faults.taken_seen {
            faults.taken_seen = true;
            stage.record(Event::new(
                "redis",
                Kind::HolderNow,
                format!("another worker holds customer {customer}'s lock now, while w1 is frozen"),
            ));
        }
        Ok(())
    }

    /// Just before w1's resume: what Postgres says about its session and who waits on a
    /// lock. Then SIGCONT, for w1 and each of the other frozen workers.
    fn resume(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        workers: &mut [WorkerHandle],
        faults: &mut Faults,
        who: &str,
    ) -> Result<()> {
        if who == WATCHED {
            self.report_session(stage, db)?;
        }
        let worker = find(workers, who)?;
        worker.resume()?;
        if faults.resumed_at.is_none() {
            faults.resumed_at = Some(db.query_one("SELECT clock_timestamp()", &[])?.get(0));
        }
        let Some(frozen) = faults.frozen.iter_mut().find(|f| f.worker == who) else {
            bail!("no frozen worker {who}");
        };
        frozen.resumed = true;
        stage.record(Event::new(
            "lab",
            Kind::Resumed,
            format!(
                "SIGCONT {who} after {}: it carries on from where it stopped",
                human(frozen.at.elapsed())
            ),
        ));
        Ok(())
    }

    fn report_session(&self, stage: &mut Stage, db: &mut PgClient) -> Result<()> {
        let row = db.query_opt(
            "SELECT state FROM pg_stat_activity WHERE application_name = $1",
            &[&self.session(WATCHED)],
        )?;
        let state: Option<String> = row.and_then(|r| r.get(0));
        let waiting = db.query(
            "SELECT coalesce(wait_event, '?') FROM pg_stat_activity
             WHERE starts_with(application_name, $1) AND wait_event_type = 'Lock'",
            &[&self.session("")],
        )?;
        let mut why: BTreeMap<String, i64> = BTreeMap::new();
        for row in waiting {
            *why.entry(row.get(0)).or_default() += 1;
        }
        let waits: i64 = why.values().sum();
        let text = match (state.as_deref(), waits) {
            (Some(state), 0) => {
                format!("pg_stat_activity: w1's session is '{state}'; nobody waits for it")
            }
            (Some(state), n) => format!(
                "pg_stat_activity: w1's session is '{state}'; {} wait on a lock ({})",
                plural(n, "worker session", "worker sessions"),
                why.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            (None, _) => "pg_stat_activity: w1 has no session".to_string(),
        };
        stage.record(
            Event::new("pg", Kind::Session, text)
                .with("state", state)
                .with("waiting", waits),
        );
        Ok(())
    }

    /// Reads the tables back and states the verdict.
    fn judge(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        faults: Faults,
        tallies: Vec<Tally>,
        mut latencies: Vec<u64>,
    ) -> Result<ApproachVerdict> {
        let t = &self.tables;
        let per_job: Vec<(i32, i64)> = db
            .query(&t.sql(invoices::INVOICES_PER_JOB), &[])?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let per_customer: Vec<(i32, i64, i64)> = db
            .query(&t.sql(invoices::BALANCE_VS_INVOICES), &[])?
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        let span: f64 = db
            .query_one(&t.sql(invoices::SPAN_OF_FIRST_INVOICES), &[])?
            .get(0);
        let verdict = Verdict::judge(&per_job, &per_customer);
        let waited = match faults.resumed_at {
            Some(at) => Some(
                db.query_one(
                    &t.sql(
                        "SELECT count(*) FROM (SELECT min(at) AS first FROM {invoices}
                         GROUP BY customer, period) f WHERE first > $1",
                    ),
                    &[&at],
                )?
                .get::<_, i64>(0),
            ),
            None => None,
        };

        let sum = |f: fn(&Tally) -> u64| tallies.iter().map(f).sum::<u64>();
        let (conflicts, no_ops, rejected) =
            (sum(|t| t.conflicts), sum(|t| t.no_ops), sum(|t| t.rejected));
        let round_trips = sum(|t| t.round_trips);
        let lock_retries = sum(|t| t.lock_retries);
        latencies.sort_unstable();
        let jobs = verdict.jobs;
        let struck: Vec<(String, Moment, i32, i32)> = faults
            .frozen
            .iter()
            .map(|f| (f.worker.clone(), f.moment, f.job, f.customer))
            .collect();
        let freezes = points::judge(&struck, &verdict);
        let result = ApproachVerdict {
            name: self.approach.name(),
            workers: self.workers,
            duplicates: verdict.duplicates,
            lost_updates: verdict.lost_updates,
            lost_jobs: verdict.lost_jobs,
            safe: self.approach.safe(),
            finished_in_s: (span * 1000.0).round() / 1000.0,
            jobs_per_s: (span > 0.0).then(|| round1(jobs as f64 / span)),
            retries: conflicts + no_ops + rejected + lock_retries,
            conflicts,
            no_ops,
            rejected,
            lock_retries,
            leases_lost: sum(|t| t.leases_lost),
            round_trips_per_job: (jobs > 0).then(|| round1(round_trips as f64 / jobs as f64)),
            p50_ms: invoices::percentile(&latencies, 50.0).map(round1),
            p99_ms: invoices::percentile(&latencies, 99.0).map(round1),
            correct_under_freeze: (!freezes.is_empty()).then(|| freezes.iter().all(|p| p.correct)),
            freezes,
            correct_under_kill: faults
                .killed
                .as_ref()
                .map(|k| verdict.job_is_right(k.job, k.customer) && verdict.lost_jobs == 0),
            frozen_job: faults.watched().map(|f| f.job),
            killed_job: faults.killed.as_ref().map(|k| k.job),
            waited_for_the_freeze: waited,
            needs: self.approach.needs(),
        };
        for (who, at) in points::FROZEN {
            if self.fault.freeze() && !faults.frozen.iter().any(|f| f.worker == who) {
                stage.record(Event::new(
                    "lab",
                    Kind::Warning,
                    format!(
                        "{who} finished without reaching a job to freeze at ({}): no freeze \
                         there in this run",
                        at.label()
                    ),
                ));
            }
        }
        if self.fault.kill() && faults.killed.is_none() {
            stage.record(Event::new(
                "lab",
                Kind::Warning,
                "w2 finished without reaching a job to kill it in: no kill in this run",
            ));
        }
        stage.record(
            Event::new(
                "pg",
                if verdict.correct() {
                    Kind::ExactlyOnce
                } else {
                    Kind::Violation
                },
                format!(
                    "the tables say: {} jobs, {} invoiced twice or more, {} never; \
                     {} of {} balances differ from their invoices",
                    verdict.jobs,
                    verdict.duplicates,
                    verdict.lost_jobs,
                    verdict.lost_updates,
                    per_customer.len()
                ),
            )
            .with("duplicates", verdict.duplicates)
            .with("lost_jobs", verdict.lost_jobs)
            .with("lost_updates", verdict.lost_updates)
            .with("bad_jobs", verdict.bad_jobs.clone())
            .with("bad_customers", verdict.bad_customers.clone()),
        );
        let mut cost = format!(
            "{} retries (conflicts {conflicts}, no-ops {no_ops}, refused {rejected}, lock \
             spins {lock_retries}), {} round trips per job",
            result.retries,
            result
                .round_trips_per_job
                .map_or("?".into(), |r| format!("{r:.1}")),
        );
        if let Some(waited) = waited {
            cost.push_str(&format!(
                "; {} first invoiced after the first SIGCONT",
                plural(waited, "job", "jobs")
            ));
        }
        stage.record(Event::new("lab", Kind::Round, cost).with("retries", result.retries));
        Ok(result)
    }
}

fn find<'a>(workers: &'a mut [WorkerHandle], name: &str) -> Result<&'a mut WorkerHandle> {
    workers
        .iter_mut()
        .find(|w| w.name == name)
        .ok_or_else(|| anyhow!("no worker {name}"))
}

fn struck(event: &Event) -> Result<Struck> {
    let moment = event
        .data
        .get("moment")
        .cloned()
        .context("a stop without its moment")?;
    Ok(Struck {
        worker: event.worker.clone(),
        moment: serde_json::from_value(moment)?,
        resumed: false,
        job: event.get_i64("job").context("a stop without its job")? as i32,
        customer: event
            .get_i64("customer")
            .context("a stop without its customer")? as i32,
        at: Instant::now(),
        lock_key: event.get_str("lock_key").map(String::from),
        owner: event.get_str("owner").map(String::from),
    })
}

fn plural(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn ms(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    })
}

fn print_verdict(args: &NoLockArgs, verdicts: &[ApproachVerdict]) {
    crate::outln!();
    crate::outln!(
        "{}",
        "Verdict (read back from the invoices and balances)".bold()
    );
    let rows: Vec<(&str, &[PointVerdict], Option<bool>)> = verdicts
        .iter()
        .map(|v| (v.name, v.freezes.as_slice(), v.correct_under_kill))
        .collect();
    points::print_points(&rows, args.pause, args.ttl);
    crate::outln!();
    let header = [
        "approach",
        "done in",
        "trips",
        "retries",
        "of them spins",
        "p50/p99 ms",
    ];
    let rows: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            vec![
                v.name.to_string(),
                format!("{:.2}s", v.finished_in_s),
                v.round_trips_per_job
                    .map_or("-".into(), |r| format!("{r:.1}")),
                v.retries.to_string(),
                v.lock_retries.to_string(),
                format!("{}/{}", ms(v.p50_ms), ms(v.p99_ms)),
            ]
        })
        .collect();
    crate::outln!("{}", table(&header, &rows));
    crate::outln!(
        "{}",
        "  done in: first invoice to the last job's first invoice, freezes included (the\n  \
         time to finish, not a throughput); trips: requests per job; retries: attempts\n  \
         that did nothing: conflicts, no-ops, refused tokens, and lock spins"
            .dimmed()
    );
    crate::outln!();
    for v in verdicts {
        let text = format!("{}: {}", v.name, meaning(args, v));
        let wrapped = crate::output::wrap(&text, 76).join("\n");
        let (first, rest) = wrapped.split_at(v.name.len() + 1);
        crate::outln!("  {}{}", first.bold(), rest.replace('\n', "\n  "));
    }
    crate::outln!();
    crate::outln!(
        "  A lock for efficiency keeps workers from doing the same work twice; when it\n  \
         fails, work is wasted. A lock for correctness must never fail — and a lease\n  \
         fails whenever a holder pauses past its TTL. Correctness belongs in the data\n  \
         itself, checked where the read happens and not only at the write: a version, a\n  \
         unique key, a row claimed with a token, or a single owner."
    );
}

/// What one approach's numbers mean, in sentences drawn from the same fields as the tables.
fn meaning(args: &NoLockArgs, v: &ApproachVerdict) -> String {
    let mut parts = Vec::new();
    if v.duplicates == 0 && v.lost_updates == 0 && v.lost_jobs == 0 {
        parts.push("every job invoiced once, every balance right.".to_string());
    } else {
        parts.push(format!(
            "{} invoiced twice or more, {} with a wrong balance, {} never invoiced.",
            plural(v.duplicates, "job", "jobs"),
            plural(v.lost_updates, "customer", "customers"),
            plural(v.lost_jobs, "job", "jobs"),
        ));
    }
    let failed: Vec<&str> = v
        .freezes
        .iter()
        .filter(|p| !p.correct)
        .map(|p| p.at.label())
        .collect();
    if !failed.is_empty() {
        let lesson = if v.name == "fenced-write-only" {
            "the token fenced the write, not the read: the next holder read before the \
             sleeper's COMMIT, waited on its row, and its higher token let it write"
        } else {
            "the sleeper, or the holder after it, wrote what it had read before the freeze"
        };
        parts.push(format!(
            "Frozen {} on a {} lease, it failed {}: {lesson}.",
            human(args.pause),
            human(args.ttl),
            failed.join(", ")
        ));
    }
    match v.name {
        "optimistic" if v.conflicts > 0 => parts.push(format!(
            "{} version conflicts, each a re-read.",
            v.conflicts
        )),
        "idempotency-key" if v.no_ops > 0 => parts.push(format!(
            "{} found the invoice there and did nothing.",
            plural(v.no_ops as i64, "insert", "inserts")
        )),
        "redis-fenced" | "fenced-write-only" if v.rejected > 0 => parts.push(format!(
            "{} by the row's token check.",
            plural(
                v.rejected as i64,
                "stale holder refused",
                "stale holders refused"
            )
        )),
        _ => {}
    }
    if let Some(waited) = v.waited_for_the_freeze
        && waited > 0
    {
        parts.push(format!(
            "{} got their first invoice only after the first SIGCONT.",
            plural(waited, "job", "jobs")
        ));
    }
    parts.push(format!("Needs: {}.", v.needs));
    parts.join(" ")
}

fn print_sweep(verdicts: &[ApproachVerdict]) {
    let mut names: Vec<&str> = Vec::new();
    for v in verdicts {
        if !names.contains(&v.name) {
            names.push(v.name);
        }
    }
    let columns: Vec<String> = SWEEP.iter().map(|w| format!("{w} w")).collect();
    let header: Vec<&str> = std::iter::once("approach")
        .chain(columns.iter().map(String::as_str))
        .collect();
    let grid = |cell: &dyn Fn(&ApproachVerdict) -> String| -> Vec<Vec<String>> {
        names
            .iter()
            .map(|name| {
                std::iter::once(name.to_string())
                    .chain(SWEEP.iter().map(|&w| {
                        verdicts
                            .iter()
                            .find(|v| v.workers == w && v.name == *name)
                            .map_or("-".into(), cell)
                    }))
                    .collect()
            })
            .collect()
    };
    crate::outln!();
    crate::outln!(
        "{}",
        "Retries (attempts that wrote nothing) as the workers grow".bold()
    );
    crate::outln!("{}", table(&header, &grid(&|v| v.retries.to_string())));
    crate::outln!();
    crate::outln!("{}", "Jobs per second".bold());
    crate::outln!(
        "{}",
        table(
            &header,
            &grid(&|v| v.jobs_per_s.map_or("-".into(), |r| format!("{r:.0}")))
        )
    );
    let wrong: Vec<&ApproachVerdict> = verdicts
        .iter()
        .filter(|v| v.duplicates + v.lost_updates + v.lost_jobs > 0)
        .collect();
    crate::outln!();
    if wrong.is_empty() {
        crate::outln!("  Every run invoiced every job once, with every balance right.");
    } else {
        for v in wrong {
            crate::outln!(
                "  {} with {} workers: {} duplicates, {} wrong balances, {} lost jobs.",
                v.name,
                v.workers,
                v.duplicates,
                v.lost_updates,
                v.lost_jobs
            );
        }
    }
}
