//! Lab 8 — a stale write with no pause at all: the network delays it.
//!
//! ```text
//!  A  takes the lock (TTL 1s) · checks it: still A's, PTTL 600ms · sends its write ──┐
//!     proxy A→store: the write waits in flight ─────────────────────────────────────┼──▶ arrives ✗
//!  B       tries… tries…   A's key expires ──▶ takes the lock, writes ✓              │
//! ```
//!
//! A is never paused. Its process runs throughout; it even checks, just before it writes,
//! that its owner value is still in the key with time to spare. What is late is the write
//! itself: the fault proxy ([`crate::proxy`]) on A's path to the store holds it until the
//! lease has run out and B has taken the lock and written. No check made *before* sending
//! can see what happens to the bytes *after*: without fencing the store takes A's write on
//! top of B's; with fencing it compares tokens when the write arrives and refuses it.
//!
//! The story's schedule says when the hold goes on the path and when it lifts (once B has
//! written); the nemesis's one player plays it and records both. The lab looks at A's
//! process while the write waits, so that the verdict can say A ran throughout. Every
//! story and part plays its faults so, and `--json` carries their schedules.
//!
//! The second story cuts A off from Redis instead, not from the store: A's lock is renewed
//! by a heartbeat, the renewals stop getting through, the lease runs out in Redis, B takes
//! the lock — and A, which nothing told to stop, writes.
//!
//! The third story loses a reply instead: A's `SET NX PX` (then a Postgres `COMMIT`, a fenced
//! write, then etcd's lock call) is applied by the server and its answer thrown away, and
//! the lab reads back what each client policy — retry the same, retry anew, give up — makes
//! of it.
//!
//! - [`delayed`]: one run of the delayed write; [`cut_off`]: one run of the cut;
//! - [`lost_reply`]: the lost `SET NX PX` under three policies; [`lost_commit`]: the lost
//!   `COMMIT`, retried without and with an idempotency key; [`lost_fenced`]: a fenced write
//!   whose answer is lost, retried with the same token; [`lost_lock`]: etcd's lock
//!   call, retried with the same lease, a new one, or not at all, and one lost in the queue;
//! - [`verdict`]: what each run shows, decided by [`crate::check::network`].

pub mod by_hand;
mod cut_off;
mod delayed;
mod lost_commit;
mod lost_fenced;
mod lost_lock;
mod lost_lock_words;
mod lost_reply;
mod scene;
pub mod verdict;
pub use verdict::{check, replay};

use std::time::Duration;

use anyhow::Result;

use super::leftovers::Leftovers;
use super::runner::{self, Lab, Run};
use super::{Fencing, LONGEST_LAB_WAIT, OutputArgs, duration_in};
use crate::connect::Backend;
use crate::output::human;
use crate::servers::ServerArgs;
use crate::store::Store;
use cut_off::LockService;
use verdict::Verdict;

/// Lab 8: no pause at all: the network holds a checked holder's write past its lease
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab network                     every story, fenced and not
  lockslab network --fencing off       only the runs without fencing
  lockslab network --scenario cut-off  A cut off from Redis, not from the store
  lockslab network --scenario cut-off-stops
                                       the same, A stops when its heartbeat
                                       gives up: its write already in flight
  lockslab network --scenario cut-off-etcd
                                       the same, cut off from etcd's keepalive
  lockslab network --scenario lost-reply
                                       SET NX, COMMIT, a fenced write and
                                       etcd's lock call applied, answer lost
  lockslab network --ttl 3s            a longer lease: the write waits longer
  lockslab network --json | jq .       events and verdict as JSON Lines

Walkthrough: labs/08-network.md.", crate::lab_exit_status_help!()))]
pub struct NetworkArgs {
    /// How long the lock lives (200ms to 10m); etcd's lease is this in whole seconds,
    /// rounded up (at least 1s)
    #[arg(long, default_value = "1s", value_parser = parse_ttl, value_name = "DURATION")]
    pub ttl: Duration,
    /// Which runs to play: without fencing, with it, or both side by side
    #[arg(long, value_enum, default_value_t = Fencing::Both)]
    pub fencing: Fencing,
    /// Which stories: the write delayed in flight, A cut off from Redis (a holder that
    /// ignores its heartbeat, or one that stops) or from etcd, a lost reply, or all
    /// [default: all; with --step, delayed-write and cut-off: a 15-minute slot]
    #[arg(long, value_enum)]
    pub scenario: Option<Scenario>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// Below 200ms, process start-up and Redis's expiry cycle blur the story.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = duration_in(Duration::ZERO, LONGEST_LAB_WAIT)(text)?;
    if ttl < Duration::from_millis(200) {
        return Err("use at least 200ms: shorter, and process start-up blurs the story".into());
    }
    Ok(ttl)
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// A checks its lock and sends its write; the proxy holds the write past the lease
    DelayedWrite,
    /// The proxy cuts A off from Redis (a renewed lock) but not from the store
    CutOff,
    /// The same cut, and A stops writing once its heartbeat gives up; its first write is
    /// already in flight (held on its path to the store)
    CutOffStops,
    /// The proxy cuts A off from etcd (a lease kept alive) but not from the store
    CutOffEtcd,
    /// A's SET NX (then a COMMIT, a fenced write retried with its token, then etcd's lock
    /// call) is applied and the proxy loses the answer: what each client policy makes of it
    /// (no fencing runs: the story is the client's)
    LostReply,
    All,
}

/// The lab as the flags ask for it (every flag checked by its parser).
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) ttl: Duration,
    /// The runs to play, in order: which story, fenced or not.
    runs: Vec<(Scenario, bool)>,
}

impl Plan {
    fn from(args: &NetworkArgs) -> Plan {
        Plan {
            ttl: args.ttl,
            runs: {
                let fencing = args.fencing.runs();
                let stepped_default = args.scenario.is_none() && crate::labs::step::stepping();
                let scenarios = match args.scenario.unwrap_or(Scenario::All) {
                    // `--step`'s slot: the two stories of the lab's title. The others are
                    // slots of their own (the README's plan names them).
                    Scenario::All if stepped_default => {
                        vec![Scenario::DelayedWrite, Scenario::CutOff]
                    }
                    Scenario::All => vec![
                        Scenario::DelayedWrite,
                        Scenario::CutOff,
                        Scenario::CutOffStops,
                        Scenario::CutOffEtcd,
                        Scenario::LostReply,
                    ],
                    one => vec![one],
                };
                scenarios
                    .into_iter()
                    .flat_map(|s| match s {
                        Scenario::LostReply => vec![(s, false)],
                        _ => fencing.iter().map(|&f| (s, f)).collect(),
                    })
                    .collect()
            },
        }
    }

    /// The paragraphs before the runs: one per kind of story played, in the order played.
    fn paragraphs(&self) -> Vec<String> {
        let plays = |scenario| self.runs.iter().any(|&(s, _)| s == scenario);
        let lost = plays(Scenario::LostReply);
        let (delayed, cut_etcd) = (plays(Scenario::DelayedWrite), plays(Scenario::CutOffEtcd));
        let cut = plays(Scenario::CutOff);
        let stops = plays(Scenario::CutOffStops);
        let mut intro = Vec::new();
        if crate::labs::step::stepping() && delayed && cut && !stops && !cut_etcd && !lost {
            intro.push(
                "--step plays the delayed write and the cut from Redis, a 15-minute slot; the \
                 other stories are slots of their own: `--scenario cut-off-stops`, \
                 `cut-off-etcd`, `lost-reply` (or `all`)."
                    .to_string(),
            );
        }
        if delayed || cut {
            let fault = match (delayed, cut) {
                (true, true) => {
                    "holds A's checked write in flight until A's lease has run out and B has written, or cuts A off from Redis while A can still reach the store"
                }
                (true, false) => {
                    "holds A's checked write to the store in flight until A's lease has run out and B has written"
                }
                _ => "cuts A off from Redis while A can still reach the store",
            };
            intro.push(format!(
                "Two workers, A and B, share one Redis lock with a {} TTL, and nobody is paused. A reaches the store, or Redis, through a fault proxy: the proxy {fault}.",
                human(self.ttl)
            ));
        }
        if stops {
            intro.push(format!(
                "In the story where A stops, A and B share a Redis lock with a {} TTL that A's heartbeat renews, and A asks its heartbeat before each write: once it has given the lock up, A stops. The proxy holds A's first write in flight on its way to the store, then cuts A off from Redis.",
                human(self.ttl)
            ));
        }
        if cut_etcd {
            intro.push(
                format!("In the etcd story, A and B share an etcd lock: each asks for a lease of {} (the TTL rounded up to etcd's whole seconds; etcd raises it to its minimum, about 1.5 election timeouts: 1s on lockslab's own etcd, 2s on a default one, and each worker says what it was granted) that its keepalive renews, and A's keepalive goes through a fault proxy, which cuts A off from etcd while A can still reach the store.", human(Duration::from_secs(self.ttl.as_secs_f64().ceil().max(1.0) as u64))),
            );
        }
        if lost {
            intro.push(format!(
                "A client, A, in the lab's own process, reaches Redis, Postgres and etcd through a fault proxy that lets its request through and loses the answer: a SET NX PX with a {} TTL, a COMMIT, a write fenced with a token, then a call to etcd's lock. The lab reads back from the servers what happened, and what each way of retrying makes of it.",
                human(self.ttl)
            ));
        }
        intro
    }
}

/// `lockslab network`.
pub fn run(args: &NetworkArgs) -> Result<()> {
    let mut plan = Plan::from(args);
    runner::run(&mut plan, &args.output, &args.servers)
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "network"
    }

    fn needs(&self) -> Vec<Backend> {
        let mut needs = vec![Backend::Redis, Backend::Postgres];
        if self
            .runs
            .iter()
            .any(|&(s, _)| matches!(s, Scenario::CutOffEtcd | Scenario::LostReply))
        {
            needs.push(Backend::Etcd);
        }
        needs
    }

    fn intro(&self, _run: &Run) -> Vec<String> {
        self.paragraphs()
    }

    fn leftovers(&self, run: &Run, leftovers: Leftovers) -> Leftovers {
        let mut leftovers = leftovers
            .store(run.url(Backend::Postgres))
            .redis(run.url(Backend::Redis));
        if self
            .runs
            .iter()
            .any(|&(s, _)| matches!(s, Scenario::CutOffEtcd | Scenario::LostReply))
        {
            leftovers = leftovers.etcd(run.url(Backend::Etcd));
        }
        if self.runs.iter().any(|&(s, _)| s == Scenario::LostReply) {
            leftovers.sql(run.url(Backend::Postgres), &lost_commit::forget(&run.id))
        } else {
            leftovers
        }
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        let mut store = Store::connect(run.url(Backend::Postgres))?;
        store.prepare()?;
        let mut verdict = Verdict {
            runs: Vec::new(),
            lost_set: Vec::new(),
            lost_commit: Vec::new(),
            lost_fenced_retry: None,
            lost_lock: Vec::new(),
            lost_lock_queued: None,
            ttl: self.ttl,
        };
        for &(scenario, fenced) in &self.runs {
            match scenario {
                Scenario::LostReply => {
                    // Redis's three policies, Postgres's `COMMIT` without and with a key, a
                    // fenced write retried with its token, then etcd's lock call.
                    verdict.lost_set = lost_reply::play(self, run)?;
                    verdict.lost_commit = [false, true]
                        .into_iter()
                        .map(|keyed| lost_commit::play(run, keyed))
                        .collect::<Result<_>>()?;
                    verdict.lost_fenced_retry = Some(lost_fenced::play(run)?);
                    (verdict.lost_lock, verdict.lost_lock_queued) = lost_lock::play(self, run)?;
                }
                Scenario::CutOff => verdict.runs.push(cut_off::play(
                    self,
                    run,
                    fenced,
                    &mut store,
                    LockService::Redis,
                )?),
                Scenario::CutOffStops => verdict
                    .runs
                    .push(cut_off::play_stopping(self, run, fenced, &mut store)?),
                Scenario::CutOffEtcd => verdict.runs.push(cut_off::play(
                    self,
                    run,
                    fenced,
                    &mut store,
                    LockService::Etcd,
                )?),
                _ => verdict
                    .runs
                    .push(delayed::play(self, run, fenced, &mut store)?),
            }
        }
        Ok(verdict)
    }
}

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 8,
    command: "network",
    shows: "no pause: a checked write held in flight past the lease",
    takes: "20s",
    needs: &[Backend::Redis, Backend::Etcd, Backend::Postgres],
    starts_its_own: None,
    walkthrough: "labs/08-network.md",
    session: 15,
    stops: 6,
    by_hand: &[],
};

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(scenario: Scenario) -> Plan {
        Plan {
            ttl: Duration::from_secs(1),
            runs: vec![(scenario, false)],
        }
    }

    #[test]
    fn the_etcd_story_stands_alone_and_follows_the_redis_one() {
        let alone = plan(Scenario::CutOffEtcd).paragraphs();
        assert_eq!(alone.len(), 1);
        assert!(alone[0].starts_with("In the etcd story"), "{alone:?}");
        let all = Plan {
            ttl: Duration::from_secs(1),
            runs: vec![(Scenario::CutOff, false), (Scenario::CutOffEtcd, false)],
        }
        .paragraphs();
        assert!(all[0].contains("one Redis lock"), "{all:?}");
        assert!(all[1].starts_with("In the etcd story"), "{all:?}");
        assert!(!all.concat().contains("second row"));
    }
}
