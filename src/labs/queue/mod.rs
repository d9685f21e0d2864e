//! Lab 10 — the lock services' own recipe: a fair queue, a watch on your predecessor
//! instead of a herd, the create revision as a fencing token, and a session that expires.
//!
//! ```text
//!  the herd:   release ──▶ wake ALL waiters ──▶ all race ──▶ one wins, the rest sleep again
//!  the recipe: release ──▶ wake the ONE behind ──▶ it looks again ──▶ it holds (or waits on)
//! ```
//!
//! Two parts, each played by worker processes on real servers (the lock code is in
//! [`crate::lock::etcd_queue`], beside etcd's own lock call in [`crate::lock::etcd`]):
//!
//! - [`herd`]: N waiters on one lock, three ways — spinning on Redis's `SET NX`, every
//!   waiter watching one etcd key, and the recipe. The servers count what each way cost
//!   ([`counters`]); the tokens say in which order the waiters were served.
//! - [`churn`]: one waiter gives up and one is killed from the middle of the line; each
//!   waiter behind a departure looks again, and etcd's own history of the keys says that
//!   one held at a time, in line, nobody skipped.
//! - [`expiry`]: a waiter frozen past its lease drops out of the queue, the one behind it
//!   looks again and waits on the holder; then the holder is frozen past its lease, the next
//!   in line takes over, and the store refuses the woken holder's write by its token.
//!
//! - [`election`]: etcd's election service; the leader is frozen past its lease, another is
//!   elected with a higher generation (its key's create revision), and the store refuses
//!   the woken leader's write by it.
//!
//! - [`owner_txn`] (only with `--only owner-txn`): the check inside etcd — a put guarded
//!   by the lock key's create revision in one transaction, refused once the holder's
//!   lease is gone; what it costs, and what it cannot reach (a resource outside etcd).
//!
//! [`verdict`] and [`verdict_churn`] read them through [`crate::check::queue`].

mod check;
mod churn;
pub mod counters;
mod election;
mod expiry;
mod herd;
mod owner_txn;
mod scene;
pub mod verdict;
pub use check::check;
pub use verdict::replay;
pub mod verdict_churn;

use std::time::Duration;

use anyhow::Result;

use super::leftovers::Leftovers;
use super::runner::{self, Lab, Run};
use super::{OutputArgs, duration_in};
use crate::connect::Backend;
use crate::output::human;
use crate::servers::ServerArgs;
use crate::worker::queuer::Way;
use verdict::Verdict;

/// Lab 10: the lock services' queue recipe on etcd: no herd, first come first served,
/// waiters leaving the line, a session that expires, a leader that was paused
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab queue                       both parts: 20 waiters three ways, then
                                       the expiries
  lockslab queue --waiters 200         the herd with 200 waiters (slower)
  lockslab queue --only herd --way etcd-recipe --way etcd-herd
                                       two of the three ways
  lockslab queue --only churn          waiters leave the middle of the line
  lockslab queue --only expiry         only the frozen waiter and holder
  lockslab queue --only election       a leader frozen past its lease
  lockslab queue --only owner-txn      the check inside etcd: a put guarded
                                       by the lock key, in one transaction
  lockslab queue --json | jq .         events and verdict as JSON Lines

See labs/10-queue.md.", crate::lab_exit_status_help!()))]
pub struct QueueArgs {
    /// How many waiters queue for the lock in the herd part (2 to 200) [default: 20]
    #[arg(long, value_parser = clap::value_parser!(u32).range(2..=200))]
    pub waiters: Option<u32>,
    /// How long each waiter holds the lock once it has it (0 to 1s)
    #[arg(long, default_value = "20ms", value_name = "DURATION",
          value_parser = duration_in(Duration::ZERO, Duration::from_secs(1)))]
    pub hold: Duration,
    /// The ways to queue in the herd part (repeat the flag) [default: all three]
    #[arg(long, value_enum)]
    pub way: Vec<Way>,
    /// Play one part only
    #[arg(long, value_enum)]
    pub only: Option<Part>,
    /// The etcd lease of the churn, expiry and election parts' workers (1s to 10s): each freeze
    /// lasts this plus 1.5s, so that the lease runs out
    #[arg(long, default_value = "1s", value_name = "DURATION",
          value_parser = duration_in(Duration::from_secs(1), Duration::from_secs(10)))]
    pub lease: Duration,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// N waiters, three ways: wake-ups, requests, hand-over times, fairness
    Herd,
    /// Waiters give up or are killed from the middle of the line
    Churn,
    /// A waiter, then the holder, frozen past their leases
    Expiry,
    /// etcd's election: the leader frozen past its lease, a generation that fences
    Election,
    /// Fencing inside etcd: a put guarded by the lock key's create revision, in one
    /// transaction (played only when asked for)
    OwnerTxn,
}

/// The lab as the flags ask for it (every flag checked by its parser).
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) waiters: u32,
    pub(crate) hold: Duration,
    /// The herd part's ways, in order; empty: no herd part.
    pub(crate) ways: Vec<Way>,
    pub(crate) churn: bool,
    pub(crate) expiry: bool,
    pub(crate) election: bool,
    /// The check inside etcd ([`owner_txn`]): only with `--only owner-txn`.
    pub(crate) owner_txn: bool,
    pub(crate) lease: Duration,
}

impl Plan {
    fn from(args: &QueueArgs) -> Result<Plan> {
        if let Some(only) = args.only.filter(|only| *only != Part::Herd)
            && (args.waiters.is_some() || !args.way.is_empty())
        {
            let only = clap::ValueEnum::to_possible_value(&only)
                .map(|v| v.get_name().to_string())
                .unwrap_or_default();
            crate::bail_usage!(
                "--waiters and --way shape the herd part, which --only {only} leaves out"
            );
        }
        let mut ways = if args.way.is_empty() {
            vec![Way::RedisSpin, Way::EtcdHerd, Way::EtcdRecipe]
        } else {
            args.way.clone()
        };
        super::first_of_each(&mut ways);
        Ok(Plan {
            waiters: args.waiters.unwrap_or(20),
            hold: args.hold,
            ways: if args.only.is_none_or(|only| only == Part::Herd) {
                ways
            } else {
                Vec::new()
            },
            churn: args.only.is_none_or(|only| only == Part::Churn),
            expiry: args.only.is_none_or(|only| only == Part::Expiry),
            election: args.only.is_none_or(|only| only == Part::Election),
            owner_txn: args.only == Some(Part::OwnerTxn),
            lease: args.lease,
        })
    }
}

/// `lockslab queue`.
pub fn run(args: &QueueArgs) -> Result<()> {
    let mut plan = Plan::from(args)?;
    runner::run(&mut plan, &args.output, &args.servers)
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "queue"
    }

    fn needs(&self) -> Vec<Backend> {
        let mut needs = vec![Backend::Etcd];
        if self.ways.contains(&Way::RedisSpin) {
            needs.push(Backend::Redis);
        }
        if self.expiry || self.churn || self.election {
            needs.push(Backend::Postgres);
        }
        needs
    }

    fn intro(&self, _run: &Run) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.ways.is_empty() {
            lines.push(format!(
                "The herd: {} waiters queue for one lock, each holding it {} once it has it, \
                 {} way{}. The servers count the requests and wake-ups; the tokens say who \
                 was served when.",
                self.waiters,
                human(self.hold),
                self.ways.len(),
                if self.ways.len() == 1 { "" } else { "s" },
            ));
        }
        if self.churn {
            lines.push(
                "Churn: on the recipe, six in line; one waiter gives up and one is killed \
                 from the middle of the line. etcd's own history of the keys says who held \
                 when."
                    .into(),
            );
        }
        if self.expiry {
            lines.push(format!(
                "Expiry: on the recipe, with {} leases asked (etcd may grant more: the lab \
                 freezes for what it granted), a queued waiter and then the holder are frozen \
                 past their leases.",
                human(self.lease)
            ));
        }
        if self.election {
            lines.push(
                "Election: on etcd's election service, the leader is frozen past its lease \
                 while another candidate waits."
                    .into(),
            );
        }
        if self.owner_txn {
            lines.push(
                "The check inside etcd: A and then B write a key in etcd with a put guarded \
                 by their lock key's create revision, one transaction each; A's lease ends \
                 between them."
                    .into(),
            );
        }
        lines
    }

    fn leftovers(&self, run: &Run, leftovers: Leftovers) -> Leftovers {
        let mut leftovers = leftovers.etcd(run.url(Backend::Etcd));
        if self.ways.contains(&Way::RedisSpin) {
            leftovers = leftovers.redis(run.url(Backend::Redis));
        }
        if self.expiry || self.churn || self.election {
            leftovers = leftovers.store(run.url(Backend::Postgres));
        }
        leftovers
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        let mut queues = Vec::new();
        for &way in &self.ways {
            queues.push(herd::play(self, run, way)?);
        }
        let churn = if self.churn {
            Some(churn::play(self, run)?)
        } else {
            None
        };
        let expiry = if self.expiry {
            Some(expiry::play(self, run)?)
        } else {
            None
        };
        let election = if self.election {
            Some(election::play(self, run)?)
        } else {
            None
        };
        let owner_txn = if self.owner_txn {
            Some(owner_txn::play(self, run)?)
        } else {
            None
        };
        Ok(Verdict {
            plan: self.clone(),
            queues,
            churn,
            expiry,
            election,
            owner_txn,
        })
    }
}

/// The key prefix (etcd) or key (Redis) of one part of a run.
pub(crate) fn lock_name(run_id: &str, part: &str) -> String {
    format!("lockslab:{run_id}:queue:{part}")
}

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 10,
    command: "queue",
    shows: "etcd's queue recipe: no herd, fair order, churn, election",
    takes: "14s",
    needs: &[Backend::Redis, Backend::Etcd, Backend::Postgres],
    starts_its_own: None,
    walkthrough: "labs/10-queue.md",
    session: 10,
    stops: 10,
    by_hand: &["jq"],
};
