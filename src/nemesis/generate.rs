//! Schedules drawn from a seed: the faults `lockslab chaos` tries against a design.
//!
//! The same seed always draws the same schedule (a small generator of our own, SplitMix64,
//! so that no crate update can change what a printed seed replays). A schedule's faults are
//! aimed at the work where they can be: a pause or a kill lands a few milliseconds after a
//! client took its lock or read its record (see [`super::schedule::Anchor`]), or at a time of
//! the run; a server restarts at a time of the run.

use serde::{Deserialize, Serialize};

use super::Fault;
use super::schedule::{Anchor, Kinds, Schedule, Step};
use crate::events::Kind;

/// The kinds of fault a schedule may hold: the columns of `lockslab matrix`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// A client stopped (SIGSTOP) for a while, then resumed: a GC pause
    Pause,
    /// A client killed (SIGKILL) in the middle of its work: a crash
    Kill,
    /// The lock's server killed and started again without persistence: it comes back empty
    Restart,
    /// The lock's server killed and started again with its data: AOF, fsynced at every write
    RestartAof,
    // chaos faults (issue 25)
    /// A client's next write to the store late in the network (the proxy), no process paused
    Delay,
    /// The reply to a client's next lock request lost (the proxy): applied, never answered
    LostReply,
    /// A client cut off from its lock server and from the store (the proxy) for 1.25 to 3
    /// leases: a partition; what it sends meanwhile goes out when the cut heals
    Cut,
    // chaos failover (issue 25)
    /// The etcd cluster's leader killed (SIGKILL); once the other two members have elected
    /// a new one, it is started again and rejoins as a follower
    LeaderKill,
    // chaos clock (issue 25)
    /// The lock server's clock jumps a lease ahead just after a client took its lock
    /// (SIMULATED: the TTL of the run's lock keys there cut): Redis, or one to three of
    /// Redlock's masters
    Clock,
    /// The Redis designs' primary killed (SIGKILL) under Sentinel once its replica lagged
    /// (frozen, its link cut) 200-700ms: the replica promoted without what the primary took
    /// meanwhile; clients ask Sentinel where to go
    Failover,
    // chaos on hosts (issue 44)
    /// A client cut off, on hosts of their own (network namespaces), from its lock server
    /// and the store for 1.25 to 3 leases: packets dropped both ways, its connections hang,
    /// and resume when it heals; for Redlock, from every server or from two or three of its
    /// five masters
    Partition,
    /// The etcd cluster's leader frozen (SIGSTOP) past its election timeout, then resumed:
    /// the other two elect a new one, and the old one wakes up deposed
    LeaderStall,
}

/// The target of a leader kill: whichever member leads the etcd cluster when it lands.
pub const ETCD_LEADER: &str = "etcd-leader";

/// The target of a failover: whichever Redis node the Sentinels name primary when it lands.
pub const REDIS_PRIMARY: &str = "redis-primary";

/// How long a drawn failover's replica lags (frozen, its link cut) while the primary takes
/// writes, before the primary dies: its `duration_ms`. Under chaos's Sentinel down-after
/// (1s), so that the Sentinels never call the frozen replica down and pass it over.
pub const FAILOVER_LAG_MS: (u64, u64) = (200, 700);

/// The name a server restarted with its data goes by in a schedule: `redis-aof` (the same
/// Redis, run with its append-only file on for that schedule).
pub const AOF_SUFFIX: &str = "-aof";

impl FaultKind {
    pub const ALL: [FaultKind; 12] = [
        FaultKind::Pause,
        FaultKind::Kill,
        FaultKind::Restart,
        FaultKind::RestartAof,
        FaultKind::Delay,
        FaultKind::LostReply,
        FaultKind::Cut,
        FaultKind::LeaderKill,
        FaultKind::Clock,
        FaultKind::Failover,
        FaultKind::Partition,
        FaultKind::LeaderStall,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Pause => "pause",
            FaultKind::Kill => "kill",
            FaultKind::Restart => "restart",
            FaultKind::RestartAof => "restart-aof",
            FaultKind::Delay => "delay",
            FaultKind::LostReply => "lost-reply",
            FaultKind::Cut => "cut",
            FaultKind::LeaderKill => "leader-kill",
            FaultKind::Clock => "clock",
            FaultKind::Failover => "failover",
            FaultKind::Partition => "partition",
            FaultKind::LeaderStall => "leader-stall",
        }
    }

    /// Does this kind aim at a client's path through the fault proxy ([`crate::proxy`])?
    pub fn network(self) -> bool {
        matches!(
            self,
            FaultKind::Delay | FaultKind::LostReply | FaultKind::Cut
        )
    }

    /// Does this kind aim at a client's path to its lock server (which Redlock's masters,
    /// not behind the proxy, cannot meet)?
    pub fn on_lock_server(self) -> bool {
        matches!(self, FaultKind::LostReply | FaultKind::Cut)
    }

    /// Is this kind done to a server (a restart, a leader kill, a failover, a server's
    /// clock) rather than to a client or its path?
    pub fn on_a_server(self) -> bool {
        matches!(
            self,
            FaultKind::Restart
                | FaultKind::RestartAof
                | FaultKind::LeaderKill
                | FaultKind::Clock
                | FaultKind::Failover
                | FaultKind::LeaderStall
        )
    }

    /// Does this kind aim at a server (which chaos must have started itself)?
    pub fn restarts(self) -> bool {
        matches!(self, FaultKind::Restart | FaultKind::RestartAof)
    }

    /// Does this kind need hosts of lockslab's own or an etcd cluster (issue 44): a column
    /// the matrix plays only when asked (`--hosts`)?
    pub fn on_hosts(self) -> bool {
        matches!(self, FaultKind::Partition | FaultKind::LeaderStall)
    }

    /// Does this kind kill a Redis server (a restart, or a failover's primary), which chaos
    /// must have started itself — never a Redis it was given?
    pub fn kills_redis(self) -> bool {
        self.restarts() || self == FaultKind::Failover
    }

    /// The kind of a step of a schedule (a restart's target says whether it keeps its data).
    pub fn of(step: &Step) -> Option<FaultKind> {
        match step.fault {
            Fault::Pause => Some(FaultKind::Pause),
            Fault::Kill => Some(FaultKind::Kill),
            Fault::Restart if step.target == ETCD_LEADER => Some(FaultKind::LeaderKill),
            Fault::Restart if step.target == REDIS_PRIMARY => Some(FaultKind::Failover),
            Fault::Restart if step.target.ends_with(AOF_SUFFIX) => Some(FaultKind::RestartAof),
            Fault::Restart => Some(FaultKind::Restart),
            Fault::Delay => Some(FaultKind::Delay),
            Fault::DropReply => Some(FaultKind::LostReply),
            Fault::Cut => Some(FaultKind::Cut),
            Fault::ClockStep => Some(FaultKind::Clock),
            Fault::Partition => Some(FaultKind::Partition),
            Fault::LeaderStall => Some(FaultKind::LeaderStall),
            _ => None,
        }
    }
}

/// What a schedule may be drawn from.
#[derive(Clone, Debug)]
pub struct Space {
    /// The clients' names (`A`, `B`, `C`).
    pub clients: Vec<String>,
    pub kinds: Vec<FaultKind>,
    /// The servers that may restart (`redis`); none: no restart is drawn. A `restart-aof`
    /// aims at the same server by its name with [`AOF_SUFFIX`] (`redis-aof`).
    pub restartable: Vec<String>,
    /// How long the clients work, in ms: times are drawn inside it.
    pub span_ms: u64,
    /// The shortest and the longest pause.
    pub pause_ms: (u64, u64),
    /// The shortest and the longest cut (1.25 to 3 leases: long enough for the lease to
    /// run out while the client cannot renew it).
    pub cut_ms: (u64, u64),
    /// At most this many faults (at least one is drawn).
    pub max_faults: usize,
    /// The server a client asks for its lock (`redis`, `etcd`, or `store` for the designs
    /// whose lock, or check, is Postgres's): where a lost reply is aimed (`A→redis`).
    pub lock_server: String,
    /// The lock's etcd is a cluster of three whose leader a schedule may kill.
    pub etcd_cluster: bool,
    /// The lock's Redis is a primary and a replica under Sentinel, whose primary a
    /// schedule may kill (a failover).
    pub redis_failover: bool,
    /// The moments of its work a client of the design says (`acquired`, `read_record`,
    /// `working`, …): a fault is aimed only at one of them. A design with no lock never
    /// says `acquired`, and a fault aimed there would never land.
    pub moments: Vec<Kind>,
    /// The servers whose clock a `clock` fault jumps: where the design's lock keys expire
    /// (`redis`, or Redlock's `m1`…`m5`); none (etcd, Postgres): no clock fault is drawn.
    pub jumping: Vec<String>,
    /// The hosts of the servers a partition may cut a client off from (`redis` and
    /// `store`; Redlock's `m1`…`m5` and `store`); none: this machine cannot make hosts,
    /// and no partition is drawn.
    pub partitioned: Vec<String>,
    /// How long a leader's stall lasts (past the cluster's election timeout); None: no
    /// cluster here to stall the leader of.
    pub stall_ms: Option<(u64, u64)>,
}

/// The name of a client's path to a server through the fault proxy (`A→store`).
pub fn path(client: &str, server: &str) -> String {
    format!("{client}{PATH_ARROW}{server}")
}

/// What joins a client to a server in a path's name.
pub const PATH_ARROW: char = '→';

/// The store: every client's writes go there (a delay aims at that path).
pub const STORE: &str = "store";

/// SplitMix64: a tiny generator whose output is fixed forever by its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo + 1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.next_u64() as usize % items.len()]
    }
}

/// The seed of the `index`th schedule of a run started with `seed`: schedules of one run
/// differ, and each can be replayed alone.
pub fn nth_seed(seed: u64, index: u64) -> u64 {
    Rng::new(seed ^ index.wrapping_mul(0xA24B_AED4_963E_E407)).next_u64()
}

/// Draws one schedule from `seed`. Each client takes at most one fault (a killed client
/// takes no other; two pauses of one client could overlap); a server restarts at most once,
/// with its data or without (its persistence is set for the whole schedule), or fails over
/// once.
pub fn draw(seed: u64, space: &Space) -> Schedule {
    let mut rng = Rng::new(seed);
    let mut kinds: Vec<FaultKind> = space.kinds.clone();
    if space.restartable.is_empty() {
        kinds.retain(|kind| !kind.restarts());
    }
    if !space.etcd_cluster {
        kinds.retain(|kind| *kind != FaultKind::LeaderKill);
    }
    if space.jumping.is_empty() {
        kinds.retain(|kind| *kind != FaultKind::Clock);
    }
    if !space.redis_failover {
        kinds.retain(|kind| *kind != FaultKind::Failover);
    }
    if space.partitioned.is_empty() {
        kinds.retain(|kind| *kind != FaultKind::Partition);
    }
    if space.stall_ms.is_none() {
        kinds.retain(|kind| *kind != FaultKind::LeaderStall);
    }
    if kinds.is_empty() || space.clients.is_empty() {
        return Schedule::default();
    }
    let mut free: Vec<String> = space.clients.clone();
    let mut restarted = false;
    let mut leader_killed = false;
    let mut failed_over = false;
    let mut stalled = false;
    let mut partitioned = false;
    let mut steps = Vec::new();
    let count = rng.between(1, space.max_faults.max(1) as u64);
    for _ in 0..count {
        let kind = *rng.pick(&kinds);
        match kind {
            FaultKind::Restart | FaultKind::RestartAof if !restarted => {
                restarted = true;
                let at_ms = rng.between(space.span_ms / 10, space.span_ms * 7 / 10);
                let server = rng.pick(&space.restartable).clone();
                steps.push(Step {
                    at_ms,
                    after: None,
                    fault: Fault::Restart,
                    target: if kind == FaultKind::RestartAof {
                        format!("{server}{AOF_SUFFIX}")
                    } else {
                        server
                    },
                    duration_ms: None,
                });
            }
            FaultKind::Restart | FaultKind::RestartAof => {}
            // One leader kill a schedule, at a time of the run: the leader is not any
            // client's, and its election ends before the next kill could matter.
            FaultKind::LeaderKill if !leader_killed => {
                leader_killed = true;
                steps.push(Step {
                    at_ms: rng.between(space.span_ms / 10, space.span_ms * 6 / 10),
                    after: None,
                    fault: Fault::Restart,
                    target: ETCD_LEADER.into(),
                    duration_ms: None,
                });
            }
            FaultKind::LeaderKill => {}
            // One failover a schedule, at a time of the run, as a leader kill; none beside a
            // restart (the clients of a failover use the Sentinels' Redis, not the lane's).
            FaultKind::Failover if !restarted => {
                (restarted, failed_over) = (true, true);
                steps.push(Step {
                    at_ms: rng.between(space.span_ms / 10, space.span_ms * 6 / 10),
                    after: None,
                    fault: Fault::Restart,
                    target: REDIS_PRIMARY.into(),
                    duration_ms: Some(failover_lag_ms(seed)),
                });
            }
            FaultKind::Failover => {}
            // One stall a schedule, at a time of the run, as a leader kill; none beside a
            // kill of the same leader.
            FaultKind::LeaderStall if !stalled && !leader_killed => {
                stalled = true;
                let (lo, hi) = space.stall_ms.unwrap_or_default();
                steps.push(Step {
                    at_ms: rng.between(space.span_ms / 10, space.span_ms * 6 / 10),
                    after: None,
                    fault: Fault::LeaderStall,
                    target: ETCD_LEADER.into(),
                    duration_ms: Some(rng.between(lo, hi)),
                });
            }
            FaultKind::LeaderStall => {}
            FaultKind::Partition => {
                if free.is_empty() {
                    continue;
                }
                partitioned = true;
                let client = free.remove(rng.next_u64() as usize % free.len());
                steps.push(partition_step(&mut rng, &client, space));
            }
            FaultKind::Delay | FaultKind::LostReply | FaultKind::Cut => {
                if free.is_empty() {
                    continue;
                }
                let client = free.remove(rng.next_u64() as usize % free.len());
                steps.push(network_step(&mut rng, kind, &client, space));
            }
            FaultKind::Clock => {
                if free.is_empty() {
                    continue;
                }
                let client = free.remove(rng.next_u64() as usize % free.len());
                steps.extend(clock_steps(&mut rng, &client, space));
            }
            FaultKind::Pause | FaultKind::Kill => {
                if free.is_empty() {
                    continue;
                }
                let target = free.remove(rng.next_u64() as usize % free.len());
                let (at_ms, after) = aim(&mut rng, &target, space);
                let (fault, duration_ms) = if kind == FaultKind::Pause {
                    let (lo, hi) = space.pause_ms;
                    (Fault::Pause, Some(rng.between(lo, hi)))
                } else {
                    (Fault::Kill, None)
                };
                steps.push(Step {
                    at_ms,
                    after,
                    fault,
                    target,
                    duration_ms,
                });
            }
        }
    }
    if leader_killed {
        // A stall drawn before the kill: the kill is the leader's fault of this schedule.
        steps.retain(|step| step.fault != Fault::LeaderStall);
    }
    if partitioned && (leader_killed || stalled || failed_over) {
        // A cluster's schedule plays on its members, which are not on hosts.
        steps.retain(|step| step.fault != Fault::Partition);
    } else if partitioned {
        // A partitioned schedule's clients reach their servers through the hosts, not
        // through the fault proxy: a fault on a proxy's path would find nothing to hold.
        steps.retain(|step| !FaultKind::of(step).is_some_and(FaultKind::network));
    }
    if failed_over {
        // The clients find the primary through Sentinel, straight, not through the proxy:
        // a fault on their path to the lock server would find nothing to hold.
        steps.retain(|step| !FaultKind::of(step).is_some_and(|kind| kind.on_lock_server()));
    }
    Schedule::new(steps)
}

/// How long a failover's replica lags before its primary dies (see [`FAILOVER_LAG_MS`]),
/// drawn from the schedule's seed on a stream of its own: the other steps' draws stay what
/// they always were.
fn failover_lag_ms(seed: u64) -> u64 {
    let (lo, hi) = FAILOVER_LAG_MS;
    Rng::new(seed ^ 0x6C61_6767_696E_6721).between(lo, hi)
}

/// A fault on one client's path through the proxy, aimed at its work:
/// - a **delay** of its next write to the store, set just after it read its record (the
///   write's transaction starts late) or inside that transaction, its row locked (the
///   `UPDATE` arrives late): the stale write of lab 8, with no process paused — as long as
///   the pauses drawn, so that it outlives the lease as often;
/// - a **lost reply** to its next request to its lock server: set inside its write's
///   transaction (the next request is its release — for a design whose lock is the store's,
///   the write itself), as its write or release is answered (its next job's lock), or at a
///   time of the run;
/// - a **cut** of its path to its lock server (the store's path too, see
///   `chaos::net`), for 1.25 to 3 leases, landing where a pause does: after its grant,
///   after its read, inside its write, or at a time of the run.
fn network_step(rng: &mut Rng, kind: FaultKind, client: &str, space: &Space) -> Step {
    if kind == FaultKind::Cut {
        let (at_ms, after) = aim(rng, client, space);
        let (lo, hi) = space.cut_ms;
        return Step {
            at_ms,
            after,
            fault: Fault::Cut,
            target: path(client, &space.lock_server),
            duration_ms: Some(rng.between(lo, hi)),
        };
    }
    if kind == FaultKind::Delay {
        let nth = rng.between(1, 3) as u32;
        let (mut event, at_ms) = if rng.between(0, 1) == 0 {
            (Kind::ReadRecord, rng.between(0, 5))
        } else {
            (Kind::Working, rng.between(0, 3))
        };
        if !space.moments.contains(&event) {
            // No read before the write (the idempotency key's store adds one itself).
            event = Kind::Working;
        }
        let (lo, hi) = space.pause_ms;
        return Step {
            at_ms,
            after: Some(Anchor::on(client, event, nth)),
            fault: Fault::Delay,
            target: path(client, STORE),
            duration_ms: Some(rng.between(lo, hi)),
        };
    }
    let (at_ms, after) = match rng.between(0, 2) {
        0 => {
            let nth = rng.between(1, 3) as u32;
            (0, Some(Anchor::on(client, Kind::Working, nth)))
        }
        1 => {
            let nth = rng.between(1, 4) as u32;
            let either = Kinds::Any(vec![Kind::Wrote, Kind::Released]);
            (0, Some(Anchor::on(client, either, nth)))
        }
        _ => (
            rng.between(space.span_ms / 20, space.span_ms * 7 / 10),
            None,
        ),
    };
    Step {
        at_ms,
        after,
        fault: Fault::DropReply,
        target: path(client, &space.lock_server),
        duration_ms: None,
    }
}

/// A partition that cuts `client`'s host off, aimed where a pause lands (after its grant,
/// after its read, inside its write, or at a time), for as long as a cut: from every other
/// host (its lock server and the store: what it sends meanwhile goes out when it heals);
/// or, where the lock is on several servers (Redlock's masters), from two or three of them
/// only, half the time — the store and the other masters still in reach.
fn partition_step(rng: &mut Rng, client: &str, space: &Space) -> Step {
    let (at_ms, after) = aim(rng, client, space);
    let (lo, hi) = space.cut_ms;
    let duration_ms = Some(rng.between(lo, hi));
    let mut masters: Vec<&String> = (space.partitioned.iter())
        .filter(|host| host.as_str() != STORE)
        .collect();
    let target = if masters.len() > 3 && rng.between(0, 1) == 1 {
        let mut cut = Vec::new();
        for _ in 0..rng.between(2, 3) {
            cut.push(
                masters
                    .remove(rng.next_u64() as usize % masters.len())
                    .as_str(),
            );
        }
        format!("{client}|{}", cut.join(","))
    } else {
        client.to_string()
    };
    Step {
        at_ms,
        after,
        fault: Fault::Partition,
        target,
        duration_ms,
    }
}

/// A jump of the lock server's clock, a few milliseconds after `client` took its lock (its
/// first, second or third): on the design's Redis, or on one to three of Redlock's masters
/// drawn from the five, each its own step, all at the same moment. With every master up, a
/// holder has its key on all five: one or two clocks jumping leave it a majority, three
/// take it away (a holder granted by a bare majority loses it to one, Kleppmann's case).
fn clock_steps(rng: &mut Rng, client: &str, space: &Space) -> Vec<Step> {
    let nth = rng.between(1, 3) as u32;
    let at_ms = rng.between(0, 5);
    let mut servers = space.jumping.clone();
    let count = if servers.len() > 1 {
        rng.between(1, 3) as usize
    } else {
        1
    };
    let mut steps = Vec::new();
    while steps.len() < count && !servers.is_empty() {
        let server = servers.remove(rng.next_u64() as usize % servers.len());
        steps.push(Step {
            at_ms,
            after: Some(Anchor::on(client, Kind::Acquired, nth)),
            fault: Fault::ClockStep,
            target: server,
            duration_ms: None,
        });
    }
    steps
}

/// Where a client's fault lands: just after it took its lock, just after it read its
/// record (before its write), inside its write's transaction, or at a time of the run.
/// A moment the design does not have (no lock to take, no read before the write) turns
/// into a time of the run, drawn afresh.
fn aim(rng: &mut Rng, client: &str, space: &Space) -> (u64, Option<Anchor>) {
    let span_ms = space.span_ms;
    let aimed = aim_at_any(rng, client, span_ms);
    match &aimed.1 {
        Some(Anchor {
            event: Kinds::One(kind),
            ..
        }) if !space.moments.contains(kind) => (rng.between(span_ms / 20, span_ms * 7 / 10), None),
        _ => aimed,
    }
}

fn aim_at_any(rng: &mut Rng, client: &str, span_ms: u64) -> (u64, Option<Anchor>) {
    let anchored = |event: Kind, nth, at_ms| (at_ms, Some(Anchor::on(client, event, nth)));
    match rng.between(0, 3) {
        0 => {
            let nth = rng.between(1, 3) as u32;
            let at = rng.between(0, 20);
            anchored(Kind::Acquired, nth, at)
        }
        1 => {
            let nth = rng.between(1, 3) as u32;
            let at = rng.between(0, 5);
            anchored(Kind::ReadRecord, nth, at)
        }
        2 => {
            // Inside the write's transaction, its row locked (the `working` event).
            let nth = rng.between(1, 3) as u32;
            let at = rng.between(0, 3);
            anchored(Kind::Working, nth, at)
        }
        _ => (rng.between(span_ms / 20, span_ms * 7 / 10), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space() -> Space {
        Space {
            clients: vec!["A".into(), "B".into(), "C".into()],
            kinds: FaultKind::ALL.to_vec(),
            restartable: vec!["redis".into()],
            span_ms: 3000,
            pause_ms: (300, 1500),
            cut_ms: (1000, 2400),
            max_faults: 3,
            lock_server: "redis".into(),
            etcd_cluster: false,
            redis_failover: false,
            moments: vec![
                Kind::Acquired,
                Kind::ReadRecord,
                Kind::Working,
                Kind::Wrote,
                Kind::Released,
            ],
            jumping: Vec::new(),
            partitioned: Vec::new(),
            stall_ms: None,
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_schedule_and_other_seeds_differ() {
        let one = draw(42, &space());
        assert_eq!(one, draw(42, &space()));
        let others: Vec<Schedule> = (0..20).map(|i| draw(nth_seed(42, i), &space())).collect();
        assert!(others.iter().any(|s| *s != one));
        // The generator's output is part of the replay contract: pinned.
        assert_eq!(Rng::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn drawn_schedules_are_valid_and_stay_in_their_space() {
        let mut space = space();
        space.kinds.retain(|kind| !kind.network());
        for index in 0..300 {
            let schedule = draw(nth_seed(7, index), &space);
            assert!(!schedule.is_empty());
            schedule
                .validate(&["A", "B", "C"], &["redis", "redis-aof"])
                .unwrap();
            let restarts = schedule
                .steps()
                .iter()
                .filter(|s| s.fault == Fault::Restart);
            assert!(
                restarts.count() <= 1,
                "one restart, with its data or without"
            );
            let mut targets: Vec<&str> = schedule
                .steps()
                .iter()
                .filter(|s| s.fault != Fault::Restart)
                .map(|s| s.target.as_str())
                .collect();
            let all = targets.len();
            targets.dedup();
            targets.sort();
            targets.dedup();
            assert_eq!(targets.len(), all, "one fault per client");
            for step in schedule.steps() {
                if let Some(ms) = step.duration_ms {
                    assert!((300..=1500).contains(&ms));
                }
                if step.after.is_none() {
                    assert!(step.at_ms <= 3000);
                }
            }
        }
    }

    /// A design with no lock says no `acquired`, and the idempotency key's client no
    /// `read_record`: a fault aimed at either would wait for a moment that never comes.
    #[test]
    fn faults_aim_only_at_moments_the_design_has() {
        for missing in [
            vec![Kind::Acquired, Kind::Released],
            vec![Kind::Acquired, Kind::Released, Kind::ReadRecord],
        ] {
            let mut space = space();
            space.moments.retain(|kind| !missing.contains(kind));
            let mut timed = 0;
            for index in 0..300 {
                for step in draw(nth_seed(5, index), &space).steps() {
                    match &step.after {
                        Some(Anchor {
                            event: Kinds::One(kind),
                            ..
                        }) => {
                            assert!(space.moments.contains(kind), "{step:?}")
                        }
                        Some(_) => {}
                        None => timed += 1,
                    }
                }
            }
            assert!(timed > 0);
        }
        // A design with every moment draws what it always drew: seeds keep their schedules.
        let full = space();
        let mut lockless = space();
        lockless.moments.retain(|kind| *kind != Kind::Acquired);
        let same = (0..100)
            .filter(|index| {
                draw(nth_seed(9, *index), &full) == draw(nth_seed(9, *index), &lockless)
            })
            .count();
        assert!((1..100).contains(&same), "{same} of 100 alike");
    }

    #[test]
    fn faults_land_after_a_grant_after_a_read_inside_a_write_and_at_times() {
        let mut seen = std::collections::HashSet::new();
        for index in 0..200 {
            for step in draw(nth_seed(3, index), &space()).steps() {
                seen.insert(step.after.as_ref().map(|a| a.event.to_string()));
            }
        }
        for point in [
            Some(Kind::Acquired),
            Some(Kind::ReadRecord),
            Some(Kind::Working),
            None,
        ] {
            let point = point.map(|kind| kind.to_string());
            assert!(seen.contains(&point), "{point:?} never drawn");
        }
    }

    #[test]
    fn only_the_kinds_asked_for_are_drawn() {
        let mut only_kills = space();
        only_kills.kinds = vec![FaultKind::Kill];
        for index in 0..50 {
            let schedule = draw(index, &only_kills);
            assert!(schedule.steps().iter().all(|s| s.fault == Fault::Kill));
        }
        let mut no_server = space();
        no_server.kinds = vec![FaultKind::Restart, FaultKind::RestartAof];
        no_server.restartable.clear();
        assert!(draw(1, &no_server).is_empty());
    }

    #[test]
    fn a_restart_with_its_data_aims_at_the_servers_aof_name_and_reads_back_as_its_kind() {
        let mut kept = space();
        kept.kinds = vec![FaultKind::RestartAof];
        let mut empty = space();
        empty.kinds = vec![FaultKind::Restart];
        for index in 0..20 {
            let schedule = draw(index, &kept);
            let step = &schedule.steps()[0];
            assert_eq!(
                (step.fault, step.target.as_str()),
                (Fault::Restart, "redis-aof")
            );
            assert_eq!(FaultKind::of(step), Some(FaultKind::RestartAof));
            let schedule = draw(index, &empty);
            assert_eq!(
                FaultKind::of(&schedule.steps()[0]),
                Some(FaultKind::Restart)
            );
        }
    }

    /// The client a step is aimed at, or whose path it is aimed at (`A→store`: A).
    fn client_of(step: &Step) -> &str {
        step.target.split(PATH_ARROW).next().unwrap_or_default()
    }

    #[test]
    fn network_faults_are_drawn_from_the_seed_the_same_every_time_on_the_clients_paths() {
        let mut net = space();
        net.kinds = vec![FaultKind::Delay, FaultKind::LostReply];
        net.lock_server = "etcd".into();
        let mut all = space();
        all.kinds = FaultKind::ALL.to_vec();
        let (mut delays, mut losses) = (0, 0);
        for index in 0..200 {
            let seed = nth_seed(11, index);
            // Reproducible, with the new kinds alone and mixed with the others.
            assert_eq!(draw(seed, &net), draw(seed, &net));
            assert_eq!(draw(seed, &all), draw(seed, &all));
            let schedule = draw(seed, &net);
            let mut clients: Vec<&str> = schedule.steps().iter().map(client_of).collect();
            let n = clients.len();
            clients.sort();
            clients.dedup();
            assert_eq!(clients.len(), n, "one fault per client: {schedule:?}");
            for step in schedule.steps() {
                let client = client_of(step);
                match step.fault {
                    Fault::Delay => {
                        delays += 1;
                        assert_eq!(step.target, path(client, STORE));
                        assert!((300..=1500).contains(&step.duration_ms.unwrap()));
                        let anchor = step.after.as_ref().expect("aimed at the work");
                        assert_eq!(anchor.worker, client);
                        assert!(matches!(
                            anchor.event,
                            crate::nemesis::schedule::Kinds::One(Kind::ReadRecord | Kind::Working)
                        ));
                    }
                    Fault::DropReply => {
                        losses += 1;
                        assert_eq!(step.target, path(client, "etcd"));
                        assert_eq!(step.duration_ms, None);
                    }
                    other => panic!("{other:?} drawn, not asked for"),
                }
                assert_eq!(FaultKind::of(step).map(FaultKind::network), Some(true));
            }
        }
        assert!(
            delays > 50 && losses > 50,
            "{delays} delays, {losses} losses"
        );
        // Pinned: a printed seed replays the same network fault forever.
        let mut only_delay = net.clone();
        only_delay.kinds = vec![FaultKind::Delay];
        assert_eq!(
            serde_json::to_string(&draw(5, &only_delay)).unwrap(),
            PINNED_DELAY_OF_SEED_5
        );
    }

    const PINNED_DELAY_OF_SEED_5: &str = concat!(
        r#"[{"at_ms":0,"after":{"worker":"C","event":"working","nth":3},"fault":"delay","#,
        r#""target":"C→store","duration_ms":1090},"#,
        r#"{"at_ms":0,"after":{"worker":"A","event":"working","nth":3},"fault":"delay","#,
        r#""target":"A→store","duration_ms":1401},"#,
        r#"{"at_ms":3,"after":{"worker":"B","event":"working","nth":2},"fault":"delay","#,
        r#""target":"B→store","duration_ms":1130}]"#
    );

    #[test]
    fn a_cut_is_drawn_on_a_clients_path_to_its_lock_server_for_longer_than_a_lease() {
        let mut cuts_only = space();
        cuts_only.kinds = vec![FaultKind::Cut];
        cuts_only.lock_server = "etcd".into();
        let (mut anchored, mut timed) = (0, 0);
        for index in 0..200 {
            let seed = nth_seed(17, index);
            let schedule = draw(seed, &cuts_only);
            assert_eq!(schedule, draw(seed, &cuts_only), "reproducible");
            assert!(!schedule.is_empty());
            let mut clients: Vec<&str> = schedule.steps().iter().map(client_of).collect();
            let n = clients.len();
            clients.sort();
            clients.dedup();
            assert_eq!(clients.len(), n, "one fault per client: {schedule:?}");
            for step in schedule.steps() {
                assert_eq!(step.fault, Fault::Cut);
                assert_eq!(step.target, path(client_of(step), "etcd"));
                assert!((1000..=2400).contains(&step.duration_ms.unwrap()));
                assert_eq!(FaultKind::of(step), Some(FaultKind::Cut));
                match &step.after {
                    Some(anchor) => {
                        assert_eq!(anchor.worker, client_of(step));
                        anchored += 1;
                    }
                    None => {
                        assert!(step.at_ms <= 3000);
                        timed += 1;
                    }
                }
            }
        }
        assert!(
            anchored > 50 && timed > 20,
            "{anchored} anchored, {timed} timed"
        );
        // Pinned: a printed seed replays the same cut forever.
        assert_eq!(
            serde_json::to_string(&draw(5, &cuts_only)).unwrap(),
            PINNED_CUT_OF_SEED_5
        );
    }

    const PINNED_CUT_OF_SEED_5: &str = concat!(
        r#"[{"at_ms":4,"after":{"worker":"C","event":"read_record","nth":2},"fault":"cut","#,
        r#""target":"C→etcd","duration_ms":1279},"#,
        r#"{"at_ms":404,"fault":"cut","target":"A→etcd","duration_ms":2087},"#,
        r#"{"at_ms":994,"fault":"cut","target":"B→etcd","duration_ms":1725}]"#
    );

    #[test]
    fn a_leader_kill_is_drawn_from_the_seed_once_a_schedule_only_on_a_cluster() {
        let mut on_cluster = space();
        on_cluster.kinds = vec![FaultKind::Pause, FaultKind::LeaderKill];
        on_cluster.etcd_cluster = true;
        let mut kills = 0;
        for index in 0..200 {
            let seed = nth_seed(13, index);
            let schedule = draw(seed, &on_cluster);
            assert_eq!(schedule, draw(seed, &on_cluster), "reproducible");
            let leader: Vec<&Step> = schedule
                .steps()
                .iter()
                .filter(|s| FaultKind::of(s) == Some(FaultKind::LeaderKill))
                .collect();
            assert!(leader.len() <= 1, "{schedule:?}");
            for step in leader {
                kills += 1;
                assert_eq!(
                    (step.fault, step.target.as_str()),
                    (Fault::Restart, ETCD_LEADER)
                );
                assert!(step.after.is_none() && (300..=1800).contains(&step.at_ms));
            }
            schedule.validate(&["A", "B", "C"], &[ETCD_LEADER]).unwrap();
        }
        assert!(kills > 50, "{kills} leader kills in 200 schedules");
        // Without a cluster, none is drawn.
        let mut single = on_cluster.clone();
        single.etcd_cluster = false;
        single.kinds = vec![FaultKind::LeaderKill];
        assert!(draw(3, &single).is_empty());
        // Pinned: a printed seed replays the same kill forever.
        let mut only = on_cluster.clone();
        only.kinds = vec![FaultKind::LeaderKill];
        assert_eq!(
            serde_json::to_string(&draw(5, &only)).unwrap(),
            PINNED_LEADER_KILL_OF_SEED_5
        );
    }

    const PINNED_LEADER_KILL_OF_SEED_5: &str =
        r#"[{"at_ms":388,"fault":"restart","target":"etcd-leader"}]"#;

    // chaos clock (issue 25)

    /// A clock jump is drawn on the server the design's lock keys expire on, aimed just
    /// after a client's grant: one server for Redis, one to three distinct masters of
    /// Redlock's five (all at the same moment); and where there is none to jump (etcd,
    /// Postgres), none is drawn and every seed draws what it drew before `clock` existed.
    #[test]
    fn a_clock_jump_is_drawn_on_the_lock_servers_just_after_a_grant() {
        let mut redis = space();
        redis.kinds = vec![FaultKind::Clock];
        redis.jumping = vec!["redis".into()];
        let mut masters = redis.clone();
        masters.jumping = (1..=5).map(|i| format!("m{i}")).collect();
        let mut sizes = std::collections::BTreeSet::new();
        for index in 0..200 {
            let seed = nth_seed(19, index);
            for space in [&redis, &masters] {
                let schedule = draw(seed, space);
                assert_eq!(schedule, draw(seed, space), "reproducible");
                assert!(!schedule.is_empty());
                let mut by_client: std::collections::HashMap<&str, Vec<&Step>> =
                    std::collections::HashMap::new();
                for step in schedule.steps() {
                    assert_eq!(step.fault, Fault::ClockStep);
                    assert_eq!(FaultKind::of(step), Some(FaultKind::Clock));
                    assert!(space.jumping.contains(&step.target), "{step:?}");
                    assert_eq!(step.duration_ms, None);
                    assert!(step.at_ms <= 5);
                    let anchor = step.after.as_ref().expect("aimed at a grant");
                    assert_eq!(anchor.event, Kinds::One(Kind::Acquired));
                    by_client
                        .entry(anchor.worker.as_str())
                        .or_default()
                        .push(step);
                }
                for jumps in by_client.values() {
                    let mut targets: Vec<&str> = jumps.iter().map(|s| s.target.as_str()).collect();
                    targets.sort();
                    targets.dedup();
                    assert_eq!(targets.len(), jumps.len(), "each server once: {jumps:?}");
                    assert!(jumps.iter().all(|s| s.after == jumps[0].after));
                    if space.jumping.len() == 1 {
                        assert_eq!(jumps.len(), 1);
                    } else {
                        sizes.insert(jumps.len());
                    }
                }
            }
        }
        assert_eq!(sizes, [1, 2, 3].into(), "one to three masters");
        // No server to jump: the kind is left out, and every seed draws what it drew.
        let mut without = space();
        without.kinds.retain(|kind| *kind != FaultKind::Clock);
        let with = space();
        assert!(with.kinds.contains(&FaultKind::Clock) && with.jumping.is_empty());
        for index in 0..100 {
            let seed = nth_seed(23, index);
            assert_eq!(draw(seed, &with), draw(seed, &without));
        }
        // Pinned: a printed seed replays the same jumps forever.
        assert_eq!(
            serde_json::to_string(&draw(5, &masters)).unwrap(),
            PINNED_CLOCK_OF_SEED_5
        );
    }

    const PINNED_CLOCK_OF_SEED_5: &str = concat!(
        r#"[{"at_ms":1,"after":{"worker":"C","event":"acquired","nth":3},"fault":"clock_step","#,
        r#""target":"m5"},"#,
        r#"{"at_ms":1,"after":{"worker":"C","event":"acquired","nth":3},"fault":"clock_step","#,
        r#""target":"m4"},"#,
        r#"{"at_ms":3,"after":{"worker":"A","event":"acquired","nth":3},"fault":"clock_step","#,
        r#""target":"m2"},"#,
        r#"{"at_ms":4,"after":{"worker":"B","event":"acquired","nth":1},"fault":"clock_step","#,
        r#""target":"m3"}]"#
    );
    #[test]
    fn a_failover_is_drawn_from_the_seed_once_a_schedule_only_under_sentinel() {
        let mut under_sentinel = space();
        under_sentinel.redis_failover = true;
        let (mut failovers, mut with_others) = (0, 0);
        for index in 0..300 {
            let seed = nth_seed(19, index);
            let schedule = draw(seed, &under_sentinel);
            assert_eq!(schedule, draw(seed, &under_sentinel), "reproducible");
            let kinds: Vec<FaultKind> = schedule.steps().iter().filter_map(FaultKind::of).collect();
            let n = kinds.iter().filter(|k| **k == FaultKind::Failover).count();
            assert!(n <= 1, "{schedule:?}");
            if n == 1 {
                failovers += 1;
                with_others += usize::from(kinds.len() > 1);
                // No restart beside it, and nothing on the clients' path to the lock server:
                // they reach the primary through Sentinel, not through the proxy.
                assert!(
                    kinds.iter().all(|k| !k.restarts() && !k.on_lock_server()),
                    "{schedule:?}"
                );
                let step = (schedule.steps().iter())
                    .find(|s| FaultKind::of(s) == Some(FaultKind::Failover))
                    .unwrap();
                assert_eq!(
                    (step.fault, step.target.as_str()),
                    (Fault::Restart, REDIS_PRIMARY)
                );
                assert!(step.after.is_none() && (300..=1800).contains(&step.at_ms));
                let (lo, hi) = FAILOVER_LAG_MS;
                assert!((lo..=hi).contains(&step.duration_ms.unwrap()), "{step:?}");
            }
        }
        assert!(failovers > 30 && with_others > 10, "{failovers} failovers");
        // Without a cluster none is drawn, and the other kinds draw what they always drew.
        let mut only = under_sentinel.clone();
        only.kinds = vec![FaultKind::Failover];
        only.redis_failover = false;
        assert!(draw(3, &only).is_empty());
        for index in 0..100 {
            let seed = nth_seed(23, index);
            assert_eq!(
                draw(seed, &space()),
                draw(seed, &{
                    let mut no_failover = under_sentinel.clone();
                    no_failover.kinds.retain(|k| *k != FaultKind::Failover);
                    no_failover
                })
            );
        }
        // Pinned: a printed seed replays the same failover forever.
        only.redis_failover = true;
        assert_eq!(
            serde_json::to_string(&draw(5, &only)).unwrap(),
            PINNED_FAILOVER_OF_SEED_5
        );
    }

    // chaos on hosts (issue 44)

    /// A partition cuts one client's host off, aimed where a pause lands, for as long as a
    /// cut: from every server, or (Redlock) from two or three masters; never beside a
    /// fault of the proxy, whose paths its clients do not take. Without hosts none is
    /// drawn, and every seed draws what it drew before partitions existed.
    #[test]
    fn a_partition_cuts_one_clients_host_off_for_longer_than_a_lease() {
        let mut masters = space();
        masters.kinds = vec![FaultKind::Partition, FaultKind::Cut, FaultKind::Pause];
        masters.partitioned = (1..=5)
            .map(|i| format!("m{i}"))
            .chain([STORE.into()])
            .collect();
        let (mut whole, mut some) = (0, 0);
        for index in 0..300 {
            let seed = nth_seed(29, index);
            let schedule = draw(seed, &masters);
            assert_eq!(schedule, draw(seed, &masters), "reproducible");
            let cut_off = (schedule.steps().iter()).filter(|s| s.fault == Fault::Partition);
            for step in cut_off.clone() {
                let sides: crate::hosts::Sides = step.target.parse().unwrap();
                let named: Vec<&str> = sides.named().collect();
                assert!(["A", "B", "C"].contains(&named[0]), "{step:?}");
                match named.len() {
                    1 => whole += 1,
                    3 | 4 => some += 1,
                    _ => panic!("{step:?}"),
                }
                assert!(named[1..].iter().all(|m| m.starts_with('m')), "{step:?}");
                assert!((1000..=2400).contains(&step.duration_ms.unwrap()));
                assert_eq!(FaultKind::of(step), Some(FaultKind::Partition));
            }
            if cut_off.count() > 0 {
                assert!(schedule.steps().iter().all(|s| s.fault != Fault::Cut));
            }
            let servers: Vec<&str> = masters.partitioned.iter().map(String::as_str).collect();
            let cuts = (schedule.steps().iter()).filter(|s| s.fault == Fault::Partition);
            let cuts = Schedule::new(cuts.cloned().collect());
            cuts.validate(&["A", "B", "C"], &servers).unwrap();
        }
        assert!(
            whole > 30 && some > 30,
            "{whole} whole, {some} from some masters"
        );
        let mut with = space();
        assert!(with.kinds.contains(&FaultKind::Partition) && with.partitioned.is_empty());
        let mut without = space();
        without.kinds.retain(|k| *k != FaultKind::Partition);
        for index in 0..100 {
            let seed = nth_seed(31, index);
            assert_eq!(draw(seed, &with), draw(seed, &without));
        }
        // Pinned: a printed seed replays the same partition forever.
        with.kinds = vec![FaultKind::Partition];
        with.partitioned = vec!["redis".into(), STORE.into()];
        assert_eq!(
            serde_json::to_string(&draw(5, &with)).unwrap(),
            PINNED_PARTITION_OF_SEED_5
        );
    }

    const PINNED_PARTITION_OF_SEED_5: &str = concat!(
        r#"[{"at_ms":4,"after":{"worker":"C","event":"read_record","nth":2},"#,
        r#""fault":"partition","target":"C","duration_ms":1279},"#,
        r#"{"at_ms":404,"fault":"partition","target":"A","duration_ms":2087},"#,
        r#"{"at_ms":994,"fault":"partition","target":"B","duration_ms":1725}]"#
    );

    /// A leader's stall, once a schedule, at a time of the run, for as long as the space
    /// says; none beside a leader's kill, none without a cluster.
    #[test]
    fn a_leader_stall_is_drawn_once_a_schedule_only_on_a_cluster() {
        let mut on_cluster = space();
        on_cluster.kinds = vec![
            FaultKind::LeaderStall,
            FaultKind::LeaderKill,
            FaultKind::Pause,
        ];
        on_cluster.etcd_cluster = true;
        on_cluster.stall_ms = Some((1000, 3000));
        let mut stalls = 0;
        for index in 0..200 {
            let seed = nth_seed(37, index);
            let schedule = draw(seed, &on_cluster);
            let kinds: Vec<FaultKind> = schedule.steps().iter().filter_map(FaultKind::of).collect();
            let n = kinds
                .iter()
                .filter(|k| **k == FaultKind::LeaderStall)
                .count();
            assert!(n <= 1, "{schedule:?}");
            if n == 1 {
                stalls += 1;
                assert!(!kinds.contains(&FaultKind::LeaderKill), "{schedule:?}");
                let step = (schedule.steps().iter())
                    .find(|s| s.fault == Fault::LeaderStall)
                    .unwrap();
                assert_eq!(step.target, ETCD_LEADER);
                assert!((1000..=3000).contains(&step.duration_ms.unwrap()));
            }
            schedule.validate(&["A", "B", "C"], &[ETCD_LEADER]).unwrap();
        }
        assert!(stalls > 30, "{stalls} stalls");
        let mut single = on_cluster.clone();
        single.stall_ms = None;
        single.kinds = vec![FaultKind::LeaderStall];
        assert!(draw(3, &single).is_empty());
        let mut only = on_cluster;
        only.kinds = vec![FaultKind::LeaderStall];
        assert_eq!(
            serde_json::to_string(&draw(5, &only)).unwrap(),
            PINNED_STALL_OF_SEED_5
        );
    }

    const PINNED_STALL_OF_SEED_5: &str =
        r#"[{"at_ms":388,"fault":"leader_stall","target":"etcd-leader","duration_ms":1989}]"#;

    /// Its lag (`duration_ms`, drawn on a stream of its own) is all that changed when the
    /// replica began to lag: the time is the one drawn before.
    const PINNED_FAILOVER_OF_SEED_5: &str =
        r#"[{"at_ms":388,"fault":"restart","target":"redis-primary","duration_ms":216}]"#;
}
