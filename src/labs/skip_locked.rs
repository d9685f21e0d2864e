//! Lab 3 — a job queue in Postgres that needs no lock service: `FOR UPDATE SKIP LOCKED`.
//!
//! Ten worker processes share one jobs table. Each one loops: claim a pending job, work on
//! it, record that it processed it, mark it done. Three ways to claim, side by side below:
//!
//! ```text
//!  naive        SELECT a pending id … UPDATE it to 'running'   two workers read the same id
//!  for-update   … FOR UPDATE             inside a transaction   correct, but one at a time
//!  skip-locked  … FOR UPDATE SKIP LOCKED inside a transaction   correct, and nobody waits
//! ```
//!
//! The row lock taken by `FOR UPDATE` belongs to the claiming transaction, and the
//! transaction belongs to the worker's connection. That is the whole trick: when a worker
//! *process* dies, its kernel closes its socket, Postgres sees the connection end, rolls
//! the transaction back, and the row is free again within milliseconds — no TTL to wait
//! out. When a worker merely *pauses* (SIGSTOP), its socket stays open and so does its
//! lock: nobody else processes its job, and nothing is done twice.
//!
//! The fast release needs a kernel that survives to close the socket. When the worker's
//! whole *machine* dies (power loss, kernel panic) or the network between them breaks, no
//! FIN or RST is ever sent: Postgres sees an open connection that says nothing — exactly
//! the paused worker of round 3, not the killed one of round 2 — and keeps the lock until
//! a timeout notices: TCP keepalives (Linux's defaults declare a silent peer dead after
//! about 2 h 11 min) or `idle_in_transaction_session_timeout`. Keepalives free a dead or
//! unreachable *machine* only: a paused process's kernel is alive and answers their probes,
//! so they never end a frozen worker's session. Only server-side timeouts bound that one —
//! `idle_in_transaction_session_timeout`, `idle_session_timeout`, and `transaction_timeout`
//! from Postgres 17. The first (`--idle-timeout`) is the lab's answer to a paused worker:
//! Postgres ends the session, the sleeper's first statement after waking fails, and still
//! nothing is done twice.
//!
//! A run has up to three rounds per mode, each on a fresh batch of jobs:
//! 1. the queue — every worker drains the batch, no faults; this round's speed is
//!    the mode's jobs/s;
//! 2. the kill — one worker claims a job and is SIGKILLed before it commits;
//! 3. the freeze — one worker claims a job and is SIGSTOPped for `--pause`.
//!
//! Every processing goes into an append-only table with no unique constraint, so a job
//! done twice is visible there. The verdict is read back from that table with SQL.

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use colored::Colorize;
use postgres::Client;
use serde::Serialize;
use serde_json::json;

use super::leftovers::Leftovers;
use super::{
    LONGEST_LAB_WAIT, LONGEST_STEP, OutputArgs, Stage, WorkerHandle, duration_in, new_run_id,
};
use crate::check;
use crate::connect::{self, Backend};
use crate::events::{Event, Kind};
use crate::output::{Style, human, json_line, table};
use crate::queue::*;
use crate::servers::{self, ServerArgs};
use crate::worker::WorkerSpec;
use crate::worker::consumer::Role;

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab skip-locked                        skip-locked mode: the queue, a kill, a freeze
  lockslab skip-locked --mode naive           SELECT then UPDATE: watch the duplicates
  lockslab skip-locked --compare              all three modes, one table
  lockslab skip-locked --idle-timeout 500ms   Postgres ends the frozen worker's session
  lockslab skip-locked --fault none --work 0ms --jobs 5000   just the speed
  lockslab skip-locked --json | jq .          events and verdict as JSON Lines

With --json every event carries t_ms (one clock for the whole run, --compare included) and
mode (skip-locked, naive or for-update): split a --compare stream on mode.

By hand, with psql in three terminals: see labs/03-skip-locked.md.", crate::lab_exit_status_help!()))]
pub struct SkipLockedArgs {
    /// How workers claim a job
    #[arg(long, value_enum, default_value_t = Mode::SkipLocked, conflicts_with = "compare")]
    pub mode: Mode,
    /// Run all three modes on the same job count and print one table
    #[arg(long)]
    pub compare: bool,
    /// Jobs in the first round's queue, 1 to 100000 (the kill and freeze rounds use
    /// min(jobs, 5 × workers))
    #[arg(long, default_value_t = 200, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub jobs: u32,
    /// Worker processes
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub workers: u32,
    /// Simulated work per job, inside the claim (the transaction, where there is one); at most 1m
    #[arg(long, default_value = "5ms", value_parser = duration_in(Duration::ZERO, LONGEST_STEP),
          value_name = "DURATION")]
    pub work: Duration,
    /// naive mode: the gap between reading a pending id and marking it taken (at most 1m)
    #[arg(long, default_value = "1ms", value_parser = duration_in(Duration::ZERO, LONGEST_STEP),
          value_name = "DURATION")]
    pub window: Duration,
    /// Which faults to inject after the first round
    #[arg(long, value_enum, default_value_t = Fault::Both)]
    pub fault: Fault,
    /// How long the frozen worker stays frozen (100ms to 10m)
    #[arg(long, default_value = "2s",
          value_parser = duration_in(Duration::from_millis(100), LONGEST_LAB_WAIT),
          value_name = "DURATION")]
    pub pause: Duration,
    /// Let Postgres end sessions idle in a transaction this long
    /// (idle_in_transaction_session_timeout); 500ms to 10m
    #[arg(long, value_parser = duration_in(Duration::ZERO, LONGEST_LAB_WAIT), value_name = "DURATION")]
    pub idle_timeout: Option<Duration>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A kill, then a freeze
    Both,
    /// SIGKILL a worker that holds a job
    Kill,
    /// SIGSTOP a worker that holds a job, for --pause
    Freeze,
    /// Only the first round: the queue and its speed
    None,
}

impl Fault {
    /// The name as typed on the command line.
    fn name(self) -> &'static str {
        match self {
            Fault::Both => "both",
            Fault::Kill => "kill",
            Fault::Freeze => "freeze",
            Fault::None => "none",
        }
    }
    fn kill(self) -> bool {
        matches!(self, Fault::Both | Fault::Kill)
    }
    fn freeze(self) -> bool {
        matches!(self, Fault::Both | Fault::Freeze)
    }
}

// ─── The orchestrator ─────────────────────────────────────────────────────────────────

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

/// What the lab learned along the way, for the sentences under the verdict table.
#[derive(Default)]
struct Notes {
    frozen_job_taken_while_frozen: Option<i64>,
    others_done_while_frozen: i64,
    /// Worker sessions blocked behind the frozen one just before the resume (pg_blocking_pids).
    blocked_at_resume: i64,
    /// Jobs in the freeze round, the frozen one included.
    freeze_jobs: u32,
    session_ended: bool,
    finish_failed: bool,
    /// The frozen worker's name, and who processed its job in the end (the processing
    /// table, read after the round): the facts the freeze sentence must agree with.
    frozen_worker: String,
    frozen_job_by: Vec<String>,
}

/// How long the lab waits after the others start before it kills the victim: long
/// enough to see them carry on (or not, in for-update mode).
const KILL_AFTER: Duration = Duration::from_millis(200);

pub fn run(args: &SkipLockedArgs) -> Result<()> {
    check_args(args)?;
    let style = Style::detect(args.output.json);
    let servers = servers::provide(&args.servers, &[Backend::Postgres])?;
    let url = servers.url(Backend::Postgres).to_string();
    let run_id = new_run_id();

    let intro = crate::output::Timeline::new(style);
    intro.say(&crate::output::run_heading("skip-locked", &run_id));
    for line in servers.describe() {
        intro.say(&format!("  {}", line.dimmed()));
    }
    intro.say(&format!(
        "A jobs table in Postgres and {} worker processes. Each worker claims a job, works {}, \
         records the processing in an append-only table, and marks the job done.",
        args.workers,
        human(args.work)
    ));

    let modes: Vec<Mode> = if args.compare {
        Mode::ALL.to_vec()
    } else {
        vec![args.mode]
    };
    // One stage, one clock for every mode: with --compare, t_ms keeps growing across the
    // three, and the `mode` tag tells their events apart.
    let mut stage = Stage::new(style);
    let mut verdicts = Vec::new();
    let mut notes = Vec::new();
    for mode in modes {
        stage.tag("mode", mode.name());
        stage.checkpoint(super::step::skip_locked::before(mode.name()));
        let play = Play {
            args,
            mode,
            style,
            url: &url,
            queue: Queue::new(&run_id, mode),
            run_id: &run_id,
        };
        let (verdict, note) = play.run(&mut stage)?;
        verdicts.push(verdict);
        notes.push(note);
    }
    super::step::checkpoint(&super::step::skip_locked::VERDICT);

    if style.json {
        json_line(&json!({
            "kind": "verdict",
            "json_version": super::JSON_VERSION,
            "lab": "skip-locked",
            "run_id": run_id,
            "modes": verdicts,
        }));
    } else {
        print_verdict(args, &verdicts, &notes);
    }
    Ok(())
}

fn check_args(args: &SkipLockedArgs) -> Result<()> {
    if args.jobs == 0 {
        crate::bail_usage!("--jobs 0: the queue needs at least one job");
    }
    let (needed, why) = match args.fault {
        Fault::Both => (3, "one to kill, one to freeze, one to carry on"),
        Fault::Kill => (2, "one to kill, one to carry on"),
        Fault::Freeze => (2, "one to freeze, one to carry on"),
        Fault::None => (1, "someone has to work the queue"),
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
    if let Some(idle) = args.idle_timeout {
        if idle < Duration::from_millis(500) {
            crate::bail_usage!(
                "--idle-timeout {}: use at least 500ms; the worker the lab kills holds its job about {} \
                 before the kill, and Postgres must not end its session first",
                human(idle),
                human(KILL_AFTER)
            );
        }
        if args.work * 4 > idle {
            crate::bail_usage!(
                "--idle-timeout {} is too close to --work {}: a worker is idle in its transaction \
                 while it works, and Postgres would end ordinary workers' sessions",
                human(idle),
                human(args.work)
            );
        }
    }
    Ok(())
}

/// One mode, all its rounds, on its own tables and workers.
struct Play<'a> {
    args: &'a SkipLockedArgs,
    mode: Mode,
    style: Style,
    url: &'a str,
    queue: Queue,
    run_id: &'a str,
}

impl Play<'_> {
    fn run(&self, stage: &mut Stage) -> Result<(ModeVerdict, Notes)> {
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

    fn rounds(&self, db: &mut Client, stage: &mut Stage) -> Result<(ModeVerdict, Notes)> {
        let args = self.args;
        stage.timeline.say("");
        let heading = format!("── {} ──", self.mode.name());
        stage.timeline.say(&format!(
            "{}",
            match self.mode {
                Mode::SkipLocked => heading.green().bold(),
                Mode::Naive => heading.red().bold(),
                Mode::ForUpdate => heading.yellow().bold(),
            }
        ));

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
        let mut notes = Notes::default();

        // Round 1: the queue, no faults.
        round.stage.timeline.say(&format!(
            "{}",
            format!(
                "Round 1 — the queue: {}, {}, no faults",
                plural(args.jobs.into(), "job", "jobs"),
                plural(args.workers.into(), "worker", "workers")
            )
            .bold()
        ));
        round.fill(1, args.jobs)?;
        for worker in &mut workers {
            worker.tell("drain 1")?;
        }
        round.until_done(1, args.jobs, |_| Ok(()))?;
        let jobs_per_s = round.summarise_speed(1)?;

        let fault_jobs = args.jobs.min(args.workers * 5);
        let mut reclaim_ms = None;
        if args.fault.kill() {
            reclaim_ms = self.kill_round(&mut round, &mut workers, fault_jobs)?;
        }
        if args.fault.freeze() {
            self.freeze_round(&mut round, &mut workers, fault_jobs, &mut notes)?;
        }

        for worker in &mut workers {
            worker.finish(Duration::from_secs(5));
        }
        round.stage.drain();
        round.check_errors()?;

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
        round.stage.record(
            Event::new(
                "pg",
                if verdict.duplicates > 0 || verdict.lost > 0 {
                    Kind::Violation
                } else {
                    Kind::ExactlyOnce
                },
                format!(
                    "the processing table says: {}, {once} exactly once, {} twice or more, {} never",
                    plural(verdict.jobs, "job", "jobs"),
                    verdict.duplicates,
                    verdict.lost
                ),
            )
            .with("once", once)
            .with("duplicates", verdict.duplicates)
            .with("lost", verdict.lost),
        );
        Ok((verdict, notes))
    }

    fn session(&self, worker: &str) -> String {
        format!("lockslab-{}-{}-{worker}", self.run_id, self.mode.name())
    }

    /// Round 2: a worker claims a job and is killed before it commits.
    fn kill_round(
        &self,
        round: &mut Round,
        workers: &mut [WorkerHandle],
        jobs: u32,
    ) -> Result<Option<f64>> {
        round.stage.timeline.say(&format!(
            "{}",
            format!(
                "Round 2 — the kill: {}; w1 claims one and dies before it commits",
                plural(jobs.into(), "new job", "new jobs")
            )
            .bold()
        ));
        round.fill(2, jobs)?;
        let (victim, others) = workers.split_first_mut().expect("at least 3 workers");
        victim.tell("hold 2")?;
        let job = round
            .stage
            .wait_for(Duration::from_secs(10), "w1 to claim a job", |e| {
                e.is("w1", Kind::Claimed) && in_mode(e, self.mode)
            })?
            .get_i64("job")
            .ok_or_else(|| anyhow!("w1 claimed no job id"))?;
        for worker in others.iter_mut() {
            worker.tell("drain 2")?;
        }
        round.pump_for(KILL_AFTER, 2, jobs)?;
        let (done_before_kill, _) = round.counts(2)?;
        round.show_blocked(&self.session(""), "w1", &self.session("w1"), job)?;

        let kill_at: SystemTime = round.db.query_one("SELECT clock_timestamp()", &[])?.get(0);
        victim.kill();
        round.dead.push(victim.name.clone());
        let how = if self.mode.transactional() {
            "its transaction is open, the job is claimed but not done"
        } else {
            "its job is marked 'running', not done"
        };
        round.stage.record(
            Event::new(
                "lab",
                Kind::Killed,
                format!(
                    "SIGKILL w1 (pid {}) while it holds job {job}: {how}; the others have done \
                     {} meanwhile",
                    victim.pid,
                    plural(done_before_kill, "job", "jobs")
                ),
            )
            .with("pid", victim.pid)
            .with("others_done", done_before_kill)
            .with("job", job),
        );

        // Watch for the job coming back, until the round is over.
        let reclaim_sql = self.queue.sql(
            "SELECT worker, extract(epoch FROM claimed_at - $2::timestamptz)::float8 * 1000
             FROM {processing} WHERE job_id = $1 ORDER BY claimed_at LIMIT 1",
        );
        let mut reclaim: Option<(String, f64)> = None;
        round.until_done(2, jobs, |round| {
            if reclaim.is_none()
                && let Some(row) = round.db.query_opt(&reclaim_sql, &[&job, &kill_at])?
            {
                let (by, ms): (String, f64) = (row.get(0), row.get(1));
                round.stage.record(
                    Event::new(
                        "pg",
                        Kind::Reclaimed,
                        format!(
                            "{by} claimed job {job} {ms:.1}ms after the kill: Postgres rolled back \
                                 w1's transaction when its connection closed (no TTL involved){}",
                            reclaim_how(self.mode)
                        ),
                    )
                    .with("job", job)
                    .with("by", by.clone())
                    .with("reclaim_ms", round1(ms)),
                );
                reclaim = Some((by, ms));
            }
            Ok(())
        })?;

        let by = round.processed_by(job)?;
        if reclaim.is_none() {
            let row = round.db.query_one(
                &self
                    .queue
                    .sql("SELECT status, claimed_by FROM {jobs} WHERE id = $1"),
                &[&job],
            )?;
            let (status, claimed_by): (String, Option<String>) = (row.get(0), row.get(1));
            let holder = claimed_by.as_deref().unwrap_or("nobody");
            let why = if round.dead.iter().any(|w| w == holder) {
                format!("{holder} is dead, and nothing will ever hand the job back — lost")
            } else {
                "nothing handed it back — lost".to_string()
            };
            round.stage.record(
                Event::new(
                    "pg",
                    Kind::JobLost,
                    format!(
                        "job {job} was never claimed again: its row says status '{status}', \
                         claimed_by {holder}; {why}"
                    ),
                )
                .with("job", job)
                .with("status", status.as_str())
                .with("claimed_by", claimed_by.clone())
                .with("times_processed", by.len()),
            );
        }
        round.stage.record(
            Event::new(
                "lab",
                Kind::KillResult,
                format!("job {job} was {}", processed(&by)),
            )
            .with("job", job)
            .with("times_processed", by.len())
            .with("by", by.clone()),
        );
        Ok(reclaim.map(|(_, ms)| round1(ms)))
    }

    /// Round 3: a worker claims a job and is frozen for `--pause`.
    fn freeze_round(
        &self,
        round: &mut Round,
        workers: &mut [WorkerHandle],
        jobs: u32,
        notes: &mut Notes,
    ) -> Result<()> {
        let pause = self.args.pause;
        let label = if self.args.fault.kill() {
            "Round 3"
        } else {
            "Round 2"
        };
        round.stage.timeline.say(&format!(
            "{}",
            format!(
                "{label} — the freeze: {}; w2 claims one and is frozen for {}",
                plural(jobs.into(), "new job", "new jobs"),
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
            .get_i64("job")
            .ok_or_else(|| anyhow!("{frozen_name} claimed no job id"))?;
        let frozen = &workers[frozen_index];
        frozen.freeze()?;
        if !crate::procs::wait_until_stopped(frozen.pid, Duration::from_secs(2)) {
            bail!(
                "worker {frozen_name} (pid {}) did not stop after SIGSTOP",
                frozen.pid
            );
        }
        let frozen_at = Instant::now();
        round.stage.record(
            Event::new(
                "lab",
                Kind::Frozen,
                format!(
                    "SIGSTOP {frozen_name} (pid {}) while it holds job {job}; its connection stays open",
                    frozen.pid
                ),
            )
            .with("pid", frozen.pid)
            .with("job", job),
        );
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
        let watch_session = self.args.idle_timeout.is_some();
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
                        Kind::Expired,
                        format!(
                            "pg_stat_activity no longer lists {frozen_name}'s session, {} into \
                             the freeze. A stopped process closes nothing, so Postgres ended it: \
                             idle in its transaction longer than \
                             idle_in_transaction_session_timeout ({}); its row lock on job {job} \
                             went with it",
                            human(frozen_at.elapsed()),
                            human(self.args.idle_timeout.unwrap_or_default())
                        ),
                    ));
                }
            }
            if taken_by.is_none()
                && let Some(row) = round.db.query_opt(&taken_sql, &[&job, &frozen_name])?
            {
                let by: String = row.get(0);
                round.stage.record(
                    Event::new(
                        "pg",
                        Kind::TakenOver,
                        format!("{by} processed job {job} while {frozen_name} was frozen"),
                    )
                    .with("job", job)
                    .with("by", by.clone()),
                );
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
        frozen.resume()?;
        round.stage.record(
            Event::new(
                "lab",
                Kind::Resumed,
                format!(
                    "SIGCONT {frozen_name} after {}; meanwhile the others processed {}, and \
                     job {job} {}",
                    human(frozen_at.elapsed()),
                    plural(others_done, "job", "jobs"),
                    if frozen_job_done == 0 {
                        "not at all".to_string()
                    } else {
                        times(frozen_job_done as usize).to_string()
                    }
                ),
            )
            .with("job", job)
            .with("others_processed", others_done)
            .with("frozen_job_processed", frozen_job_done),
        );
        frozen.tell("commit")?;
        let outcome = round.stage.wait_for(
            Duration::from_secs(10),
            &format!("{frozen_name} to finish its job"),
            |e| {
                e.worker == frozen_name
                    && (e.kind == Kind::Committed || e.kind == Kind::FinishFailed)
                    && in_mode(e, self.mode)
            },
        )?;
        if outcome.kind == Kind::FinishFailed {
            round.dead.push(frozen_name.clone());
            notes.finish_failed = true;
        }
        round.until_done(3, jobs, |_| Ok(()))?;
        let by = round.processed_by(job)?;
        round.stage.record(
            Event::new(
                "lab",
                Kind::FreezeResult,
                format!("job {job} was {}", processed(&by)),
            )
            .with("job", job)
            .with("times_processed", by.len())
            .with("by", by.clone())
            .with("frozen_job_processed_while_frozen", frozen_job_done),
        );
        notes.frozen_job_taken_while_frozen = Some(frozen_job_done);
        notes.frozen_worker = frozen_name.clone();
        notes.frozen_job_by = by;
        notes.others_done_while_frozen = others_done;
        notes.blocked_at_resume = blocked;
        notes.freeze_jobs = jobs;
        notes.session_ended = session_gone;
        Ok(())
    }
}

/// The orchestrator's view of one mode's queue while its rounds play.
struct Round<'a> {
    stage: &'a mut Stage,
    work: Duration,
    run_id: &'a str,
    db: &'a mut Client,
    queue: &'a Queue,
    style: Style,
    /// How many workers the mode started (w1…wN).
    workers: u32,
    /// Workers that are gone: a naive job they marked 'running' stays that way.
    dead: Vec<String>,
    next_id: i64,
}

impl Round<'_> {
    fn fill(&mut self, round: i32, jobs: u32) -> Result<()> {
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
    fn pump(&mut self, duration: Duration) -> Result<()> {
        let deadline = Instant::now() + duration;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if let Some(event) = self.stage.next(left)
                && event.kind == Kind::Error
            {
                return Err(super::worker_failed(&event.worker, &event.text));
            }
        }
        Ok(())
    }

    fn pump_for(&mut self, duration: Duration, round: i32, jobs: u32) -> Result<()> {
        let deadline = Instant::now() + duration;
        while Instant::now() < deadline {
            self.pump(Duration::from_millis(20))?;
            self.show_progress(round, jobs)?;
        }
        Ok(())
    }

    fn check_errors(&self) -> Result<()> {
        if let Some(event) = self.stage.log.iter().find(|e| e.kind == Kind::Error) {
            return Err(super::worker_failed(&event.worker, &event.text));
        }
        Ok(())
    }

    /// (jobs done, jobs still to do) in a round. A naive job marked 'running' by a dead
    /// worker is not "to do": nobody will ever touch it again.
    fn counts(&mut self, round: i32) -> Result<(i64, i64)> {
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

    fn show_progress(&mut self, round: i32, jobs: u32) -> Result<(i64, i64)> {
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
    fn show_freeze(
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
    fn until_done(
        &mut self,
        round: i32,
        jobs: u32,
        mut watch: impl FnMut(&mut Round) -> Result<()>,
    ) -> Result<()> {
        // Generous: even one worker at a time (for-update) gets through in this time.
        let limit = Duration::from_secs(60) + (self.work + Duration::from_millis(5)) * jobs;
        let started = Instant::now();
        loop {
            self.pump(Duration::from_millis(10))?;
            watch(self)?;
            let (_, left) = self.show_progress(round, jobs)?;
            if left == 0 {
                break;
            }
            if started.elapsed() > limit {
                bail!(
                    "round {round} did not finish within {}: {} still to do",
                    human(limit),
                    plural(left, "job", "jobs")
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
    fn summarise_speed(&mut self, round: i32) -> Result<f64> {
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
        self.stage.record(
            Event::new(
                "lab",
                Kind::Round,
                format!(
                    "{} done in {}: {jobs_per_s:.0} jobs/s · per worker: {}",
                    plural(jobs, "job", "jobs"),
                    human(Duration::from_secs_f64(seconds)),
                    listing.join(" · ")
                ),
            )
            .with("round", round)
            .with("jobs", jobs)
            .with("seconds", seconds)
            .with("jobs_per_s", jobs_per_s)
            .with("per_worker", serde_json::to_value(&per_worker)?)
            .with("run_id", self.run_id)
            .with("jobs_table", self.queue.jobs.as_str())
            .with("processing_table", self.queue.processing.as_str()),
        );
        Ok(jobs_per_s)
    }

    /// Who processed the job, in order (from the processing table).
    fn processed_by(&mut self, job: i64) -> Result<Vec<String>> {
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
    fn blocked_by(&mut self, prefix: &str, holder: &str) -> Result<(i64, i64)> {
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
    fn show_blocked(&mut self, prefix: &str, holder: &str, session: &str, job: i64) -> Result<i64> {
        let (direct, all) = self.blocked_by(prefix, session)?;
        if all > 0 {
            self.stage.record(
                Event::new(
                    "pg",
                    Kind::Blocked,
                    format!(
                        "pg_blocking_pids: {} blocked behind {holder}'s session, which holds \
                         job {job}'s row lock ({direct} waiting for it directly, {} queued \
                         behind another waiter)",
                        plural(all, "worker session is", "worker sessions are"),
                        all - direct
                    ),
                )
                .with("waiting", all)
                .with("waiting_directly", direct),
            );
        }
        Ok(all)
    }

    /// What Postgres itself says about a worker's session.
    fn show_session(&mut self, worker: &str, session: &str) -> Result<()> {
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
        self.stage
            .record(Event::new("pg", Kind::Session, text).with("session_of", worker));
        Ok(())
    }
}

/// Whether an event belongs to this mode's play (the stage's log holds every mode's events).
fn in_mode(event: &Event, mode: Mode) -> bool {
    event.data.get("mode").and_then(|m| m.as_str()) == Some(mode.name())
}

/// "1 worker session is", "3 worker sessions are": the count and the right form.
fn plural(n: i64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// What the other workers did while one was frozen holding a job, from what was measured:
/// jobs they processed, and sessions `pg_blocking_pids` showed blocked behind it.
/// What became of the frozen worker's job, from the processing table's final record (who
/// processed it, how often) and the sleeper's own fate after the resume — never from the
/// state at the resume alone: a session timeout just longer than the pause ends the session
/// *after* the resume, and the job then moves on although nothing moved while it was frozen.
fn freeze_sentence(pause: Duration, mode: Mode, note: &Notes, taken_while_frozen: i64) -> String {
    let sleeper = note.frozen_worker.as_str();
    let by = &note.frozen_job_by;
    let once = by.len() == 1;
    if note.finish_failed {
        let when = if note.session_ended {
            "during the freeze"
        } else {
            "around the resume (its idle timeout ran out within moments of the pause)"
        };
        return format!(
            "Postgres ended the frozen worker's session {when}; its first statement after waking \
             (the INSERT) failed, and the job was {}{}",
            processed(by),
            if once { ": still nothing twice." } else { "." }
        );
    }
    if once && by[0] == sleeper && taken_while_frozen == 0 {
        return if mode.transactional() {
            format!(
                "The frozen worker kept its job for the whole {} pause, and finished it once; {}",
                human(pause),
                around_the_freeze(note)
            )
        } else {
            "The frozen worker's job stayed 'running' until it woke: no transaction, no timeout, \
             nothing would have freed it."
                .to_string()
        };
    }
    format!(
        "The frozen worker's job was {} (while {sleeper} was frozen: {}).",
        processed(by),
        plural(taken_while_frozen, "time", "times")
    )
}

/// What the reclaim time measures besides Postgres's rollback, which differs by mode.
fn reclaim_how(mode: Mode) -> String {
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

fn around_the_freeze(note: &Notes) -> String {
    let (done, blocked) = (note.others_done_while_frozen, note.blocked_at_resume);
    match (done, blocked) {
        (0, 0) if note.freeze_jobs <= 1 => {
            "it was the round's only job, so the others had nothing to do.".to_string()
        }
        (0, 0) => "the others processed nothing meanwhile, and none was blocked on its lock \
                   at the resume."
            .to_string(),
        (0, _) if note.freeze_jobs <= 1 => format!(
            "it was the round's only job, so there was no queue to stall; but without SKIP \
             LOCKED the others did not pass over it: at the resume {} waiting for its row lock.",
            plural(blocked, "worker session was", "worker sessions were")
        ),
        (0, _) => format!(
            "the whole queue stood still behind its row lock: the others processed nothing, \
             and at the resume {} blocked behind it.",
            plural(blocked, "worker session was", "worker sessions were")
        ),
        (_, 0) => format!(
            "the others carried on around it ({}).",
            plural(done, "job", "jobs")
        ),
        (_, _) => format!(
            "the others processed {}, and at the resume {} blocked behind it.",
            plural(done, "job", "jobs"),
            plural(blocked, "worker session was", "worker sessions were")
        ),
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// "processed exactly once by w3", "never processed".
fn processed(by: &[String]) -> String {
    if by.is_empty() {
        "never processed".to_string()
    } else {
        format!("processed {} by {}", times(by.len()), by.join(", "))
    }
}

fn times(n: usize) -> &'static str {
    match n {
        0 => "0 times",
        1 => "exactly once",
        2 => "TWICE",
        _ => "three times or more",
    }
}

fn print_verdict(args: &SkipLockedArgs, verdicts: &[ModeVerdict], notes: &[Notes]) {
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
    let rows: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            vec![
                v.mode.name().to_string(),
                v.jobs.to_string(),
                count(v.duplicates),
                count(v.lost),
                format!("{:.0}", v.jobs_per_s),
                match (v.reclaim_ms, args.fault.kill()) {
                    (Some(ms), _) => format!("{ms:.1}ms"),
                    (None, true) => "never".red().bold().to_string(),
                    (None, false) => "-".to_string(),
                },
            ]
        })
        .collect();
    crate::outln!();
    crate::prose!("{}", "Verdict (read back from the processing table)".bold());
    crate::prose!("{}", table(&header, &rows));
    crate::outln!();
    let fastest = verdicts
        .iter()
        .map(|v| v.jobs_per_s)
        .fold(0.0_f64, f64::max);
    for (verdict, note) in verdicts.iter().zip(notes) {
        crate::prose!(
            "  {} {}",
            format!("{}:", verdict.mode.name()).bold(),
            meaning(args, verdict, note, fastest)
        );
    }
}

/// One sentence (or two) on what a mode's numbers mean.
fn meaning(args: &SkipLockedArgs, v: &ModeVerdict, note: &Notes, fastest: f64) -> String {
    let mut parts = Vec::new();
    if v.duplicates == 0 && v.lost == 0 {
        parts.push("every job was processed exactly once.".to_string());
    }
    if v.duplicates > 0 {
        parts.push(format!(
            "{} processed twice or more: workers read the same pending id before any of \
             them marked it.",
            plural(v.duplicates, "job was", "jobs were")
        ));
    }
    if v.lost > 0 {
        parts.push(format!(
            "{} never processed: the killed worker's 'running' mark outlives it, and \
             only a timeout (a lease, with its TTL guess) could hand it back.",
            plural(v.lost, "job was", "jobs were")
        ));
    }
    if let Some(ms) = v.reclaim_ms {
        parts.push(format!(
            "The killed worker's job was claimed again {ms:.1}ms after the kill: Postgres rolled \
             its transaction back when the connection closed{}.",
            reclaim_how(v.mode)
        ));
    }
    if v.mode == Mode::ForUpdate && fastest > 0.0 && v.jobs_per_s < fastest * 0.8 {
        parts.push(format!(
            "At {:.0} jobs/s against {:.0}: the workers queue behind one row lock, one at a time.",
            v.jobs_per_s, fastest
        ));
    }
    if let Some(taken_while_frozen) = note.frozen_job_taken_while_frozen {
        parts.push(freeze_sentence(
            args.pause,
            v.mode,
            note,
            taken_while_frozen,
        ));
    }
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 10, item 4: with an idle timeout just above the pause, nothing moves while the
    /// worker is frozen, then Postgres ends its session as it wakes, its INSERT fails and
    /// another worker does the job. The sentence must say that, not "kept its job".
    #[test]
    fn a_session_ended_at_the_resume_is_not_a_job_kept() {
        let note = Notes {
            frozen_worker: "w1".into(),
            frozen_job_by: vec!["w4".into()],
            finish_failed: true,
            session_ended: false,
            ..Notes::default()
        };
        let sentence = freeze_sentence(Duration::from_secs(2), Mode::SkipLocked, &note, 0);
        assert!(!sentence.contains("kept its job"), "{sentence}");
        assert!(sentence.contains("failed"), "{sentence}");
        assert!(sentence.contains("w4"), "{sentence}");
    }

    #[test]
    fn a_job_finished_by_its_frozen_worker_was_kept() {
        let note = Notes {
            frozen_worker: "w1".into(),
            frozen_job_by: vec!["w1".into()],
            freeze_jobs: 1,
            ..Notes::default()
        };
        let sentence = freeze_sentence(Duration::from_secs(2), Mode::SkipLocked, &note, 0);
        assert!(sentence.contains("kept its job"), "{sentence}");
    }

    /// Issue 11: with one job there is no queue to stall, whatever the blocked count.
    #[test]
    fn one_job_blocked_on_is_not_a_whole_queue_stalled() {
        let note = Notes {
            freeze_jobs: 1,
            blocked_at_resume: 9,
            ..Notes::default()
        };
        let sentence = around_the_freeze(&note);
        assert!(!sentence.contains("whole queue"), "{sentence}");
        assert!(sentence.contains("only job"), "{sentence}");
        let many = Notes {
            freeze_jobs: 50,
            ..note
        };
        assert!(around_the_freeze(&many).contains("whole queue"));
    }
}
