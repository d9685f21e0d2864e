//! Lab 7 — the same job done safely without a lock service, under the same freeze and kill.
//!
//! Ten worker processes race through one list of jobs: issue the invoice for (customer,
//! period) and add its amount to the customer's balance ([`crate::invoices`] has the job and
//! the SQL of every approach). In every approach's run the lab freezes four workers, each
//! at another point of a job (SIGSTOP, longer than the Redis lock's TTL), and SIGKILLs `w2`
//! between its two writes ([`points`] has the roster):
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
//! A frozen worker is resumed after the pause only once another worker has met it —
//! Postgres shows a worker session blocked on its transaction (`pg_blocking_pids`), or its
//! job invoiced by another worker — and those who wait on it write before anyone who reads
//! after it wakes (the lab holds the customer's Redis lock until they have: `strike.rs`'s
//! `Door`), so that no cell is a matter of timing or of a quiet machine; a point nobody met
//! within the wait is reported `untested`, never `ok`.
//!
//! Then the tables are read back: invoices per (customer, period) must be exactly one, and
//! every balance must equal the sum of its invoices. The Redis lock without fencing fails
//! from the read on; the one whose token fences only the write fails inside the
//! transaction; every other approach passes every point, at different costs — which the
//! closing tables put side by side.
//!
//! The lab in files: [`points`] (where each worker starts and stops), `play.rs` (one
//! approach's run: tables, workers, the watch loop), `strike.rs` (the freezes, the kill, the
//! resumes, all through the [`crate::nemesis`], and what the lab looks at meanwhile),
//! `judge.rs` (the tables read back and handed to [`crate::check::no_lock`]) and
//! `verdict.rs` (the tables and sentences).

mod door;
mod judge;
mod play;
pub mod points;
mod strike;
mod verdict;
pub use verdict::{check, replay};

use std::time::Duration;

use anyhow::{Context, Result};
use serde::Serialize;

use super::leftovers::Leftovers;
use super::runner::{self, Lab, Run};
use super::step::Checkpoint;
use super::{LONGEST_LAB_WAIT, LONGEST_STEP, OutputArgs, duration_in};
use crate::connect::{self, Backend};
use crate::invoices::{self, Approach, Tables};
use crate::servers::ServerArgs;
use play::Play;
pub use verdict::{ApproachVerdict, Verdict};

/// Lab 7: one job done nine ways, with and without a lock, under the same freezes and kill
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab no-lock                      all nine approaches, freezes and kill
                                        in each
  lockslab no-lock optimistic           one approach
  lockslab no-lock --fault freeze       only the freeze
  lockslab no-lock --keys 2             two customers: heavy contention
  lockslab no-lock --contention         2 to 32 workers on 4 customers, no
                                        faults
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
    /// and show how the retries grow (optimistic, serializable, idempotency-key,
    /// partitioned and advisory-xact, unless an approach is named)
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
    pub(crate) fn name(self) -> &'static str {
        match self {
            Fault::Both => "both",
            Fault::Kill => "kill",
            Fault::Freeze => "freeze",
            Fault::None => "none",
        }
    }
    pub(crate) fn freezes(self) -> bool {
        matches!(self, Fault::Both | Fault::Freeze)
    }
    pub(crate) fn kills(self) -> bool {
        matches!(self, Fault::Both | Fault::Kill)
    }
    /// What `--step` asks before each approach: about the faults this run plays.
    fn question_before_approach(self) -> &'static Checkpoint {
        use super::step::no_lock::*;
        match self {
            Fault::Both => &BEFORE_APPROACH,
            Fault::Kill => &BEFORE_APPROACH_KILL,
            Fault::Freeze => &BEFORE_APPROACH_FREEZE,
            Fault::None => &BEFORE_APPROACH_NONE,
        }
    }
}

/// What `--step` plays when no approach is named: the lock that fails, the database's own
/// check, the key that makes a retry harmless, and the lock made safe by a token — the
/// lab's argument in four approaches, each on one screen or two, within 15 stops.
const STEPPED: [Approach; 4] = [
    Approach::RedisLock,
    Approach::Optimistic,
    Approach::IdempotencyKey,
    Approach::RedisFenced,
];

/// The workers the contention sweep runs, and the approaches it compares by default.
pub(crate) const SWEEP: [u32; 5] = [2, 4, 8, 16, 32];
const SWEPT: [Approach; 5] = [
    Approach::Optimistic,
    Approach::Serializable,
    Approach::IdempotencyKey,
    Approach::Partitioned,
    Approach::AdvisoryXact,
];

/// The lab as the flags ask for it, checked once, before any server is touched.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// Each approach's run, with its number of workers, in order.
    plays: Vec<(Approach, u32)>,
    pub(crate) jobs: u32,
    /// Customers: `--keys`, or 4 for the contention sweep when `--keys` is left at its default.
    pub(crate) keys: u32,
    /// The faults each run plays (none in the contention sweep).
    pub(crate) fault: Fault,
    pub(crate) pause: Duration,
    pub(crate) ttl: Duration,
    pub(crate) work: Duration,
    pub(crate) contention: bool,
    needs: Vec<Backend>,
}

impl Plan {
    pub(crate) fn from_args(args: &NoLockArgs) -> Result<Plan> {
        check_args(args)?;
        let approaches: Vec<Approach> = match args.approach {
            Some(one) => vec![one],
            // The sweep is about contention on the database: five approaches, no Redis.
            None if args.contention => SWEPT.to_vec(),
            None if crate::labs::step::stepping() => STEPPED.to_vec(),
            None => Approach::ALL.to_vec(),
        };
        let needs = if approaches.iter().any(|a| a.uses_redis()) {
            vec![Backend::Redis, Backend::Postgres]
        } else {
            vec![Backend::Postgres]
        };
        let plays: Vec<(Approach, u32)> = if args.contention {
            SWEEP
                .iter()
                .flat_map(|&w| approaches.iter().map(move |&a| (a, w)))
                .collect()
        } else {
            approaches.iter().map(|&a| (a, args.workers)).collect()
        };
        Ok(Plan {
            plays,
            jobs: args.jobs,
            keys: if args.contention && args.keys == 20 {
                4
            } else {
                args.keys
            },
            fault: if args.contention {
                Fault::None
            } else {
                args.fault
            },
            pause: args.pause,
            ttl: args.ttl,
            work: args.work,
            contention: args.contention,
            needs,
        })
    }
}

/// `lockslab no-lock`.
pub fn run(args: &NoLockArgs) -> Result<()> {
    let mut plan = Plan::from_args(args)?;
    runner::run(&mut plan, &args.output, &args.servers)
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "no-lock"
    }

    fn needs(&self) -> Vec<Backend> {
        self.needs.clone()
    }

    fn intro(&self, _run: &Run) -> Vec<String> {
        let mut intro = vec![format!(
            "{} jobs: invoice (customer, period) once, add it to the balance once; {} customers.",
            self.jobs, self.keys
        )];
        let played: Vec<Approach> = self.plays.iter().map(|&(a, _)| a).collect();
        if played == STEPPED {
            let names: Vec<&str> = STEPPED.iter().map(|a| a.name()).collect();
            intro.push(format!(
                "--step plays four of the nine approaches, a 15-minute slot: {}. Name one to \
                 play it alone (`lockslab no-lock serializable --step`); without --step, all \
                 nine.",
                names.join(", ")
            ));
        }
        intro
    }

    /// The run's schema holds every approach's tables; its Redis keys every lock and counter.
    fn leftovers(&self, run: &Run, leftovers: Leftovers) -> Leftovers {
        let schema = invoices::schema_of(&run.id);
        let leftovers = leftovers.sql(
            run.url(Backend::Postgres),
            &format!("DROP SCHEMA IF EXISTS {schema} CASCADE"),
        );
        if self.needs.contains(&Backend::Redis) {
            leftovers.redis(run.url(Backend::Redis))
        } else {
            leftovers
        }
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        let pg_url = run.url(Backend::Postgres).to_string();
        let redis_url = self
            .needs
            .contains(&Backend::Redis)
            .then(|| run.url(Backend::Redis).to_string());
        let schema = invoices::schema_of(&run.id);
        let mut db = connect::postgres(&pg_url)?;
        db.batch_execute(&format!("CREATE SCHEMA {schema}"))
            .with_context(|| format!("creating the schema {schema}"))?;
        let mut stage = run.stage();
        let mut approaches = Vec::new();
        for &(approach, workers) in &self.plays {
            let mut tables = Tables::new(&run.id, approach);
            if self.contention {
                tables.approach = format!("{}_w{workers}", tables.approach);
            }
            let play = Play {
                plan: self,
                approach,
                workers,
                run_id: &run.id,
                pg_url: &pg_url,
                redis_url: redis_url.as_deref(),
                tables,
            };
            super::step::checkpoint_before(self.fault.question_before_approach(), approach.name());
            approaches.push(play.run(&mut stage, &mut db, &schema)?);
        }
        Ok(Verdict {
            jobs: self.jobs,
            keys: self.keys,
            fault: self.fault,
            pause: self.pause,
            ttl: self.ttl,
            contention: self.contention,
            approaches,
        })
    }
}

/// Every usage check, once: the workers each fault needs, and customers enough for both.
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
    super::enough_workers(args.workers, args.fault.name(), needed, why)?;
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

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 7,
    command: "no-lock",
    shows: "the same job with no lock: optimistic writes, idempotency",
    takes: "24s",
    needs: &[Backend::Redis, Backend::Postgres],
    starts_its_own: None,
    walkthrough: "labs/07-no-lock.md",
    session: 15,
    stops: 11,
    by_hand: &["psql"],
};
