//! Chaos's Redis failover (issue 25): the Redis designs against lab 5's primary and
//! replica watched by three Sentinels ([`crate::cluster::SentinelCluster`]), whose primary a
//! schedule kills.
//!
//! ```text
//!  client A ─┐  "where is the primary?"
//!  client B ─┼──▶ Sentinels ──▶ primary :p   ✗ SIGKILL: the Sentinels agree it is down
//!  client C ─┘                  replica :r   ◀── promoted; the clients, asking again
//!                                               after an error, move to it; :p starts
//!                                               again as its replica, empty, before the
//!                                               next schedule
//! ```
//!
//! Replication is asynchronous: a write the primary acknowledged and had not yet sent
//! on is gone from the promoted replica — a lock key, an `INCR` (lab 5). Every client asks
//! the Sentinels where the primary is, and asks again after an error. A failover reaches
//! every history on the cluster, so the schedules that hold one play one at a time (the
//! others play on their lane's Redis, as before).

use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use crate::cluster::{self, MASTER_NAME, SentinelCluster};
use crate::nemesis::Victim;
use crate::nemesis::generate::{FaultKind, REDIS_PRIMARY};
use crate::nemesis::schedule::Schedule;
use crate::worker::chaos_client::Design;

/// How long the Sentinels may take to promote the replica, and the cluster to be whole
/// again (the old primary back and in sync): far above Sentinel's timers (a primary is
/// down after a second; a Sentinel that led a failover waits twice its 3s failover timeout
/// before it leads another), for a loaded machine.
const WITHIN: Duration = Duration::from_secs(20);

/// How long a primary may stay silent before a Sentinel calls it down: twice lab 5's, which
/// on a loaded machine (a full sync's fork, a busy core) called a healthy primary down now
/// and then and failed over by itself — a failover no schedule held.
const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// How long the cluster must stay whole before a schedule plays on it.
const SETTLED: Duration = Duration::from_millis(1500);

/// Why a history is unknown when the Sentinels failed over once more by themselves.
pub const SWITCHED_BY_ITSELF: &str = "the Sentinels failed the primary over once more by \
    themselves (a primary slow to answer): this history played a failover its schedule does \
    not hold";

/// How much longer the clients of a schedule with a failover work: the Sentinels take a
/// second or two to promote the replica, and the history must hold jobs on the promoted
/// one (the moments after the move are where a lost key or counter shows).
pub const MORE_WORK_MS: u64 = 3000;

/// The cluster and the thread that starts a killed node again: a child dies with the
/// thread that spawned it ([`crate::procs`]), and the threads that play schedules end with
/// each batch.
pub struct SentinelRing {
    cluster: Arc<Mutex<SentinelCluster>>,
    keeper: Mutex<mpsc::Sender<Box<dyn FnOnce() + Send>>>,
    /// Held by a schedule with a failover for its whole play: one at a time.
    turn: Mutex<()>,
    /// How far the last promoted replica was behind the primary it replaced, in bytes of
    /// the replication stream (see [`SentinelRing::fail_over`]), when both answered.
    behind: Mutex<Option<u64>>,
    /// The Sentinels failed over by themselves since the turn began, seen as a failover
    /// was about to kill the primary (see [`SentinelRing::switched_during_turn`]).
    unasked: std::sync::atomic::AtomicBool,
}

impl SentinelRing {
    /// Starts the cluster; call it from a thread that outlives the run.
    pub fn start() -> Result<Arc<SentinelRing>> {
        let cluster = SentinelCluster::start_with(DOWN_AFTER)
            .map_err(|err| err.context("starting the Redis cluster for failover"))?;
        let (keeper, jobs) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new()
            .name("chaos-sentinel-keeper".into())
            .spawn(move || jobs.into_iter().for_each(|job| job()))?;
        Ok(Arc::new(SentinelRing {
            cluster: Arc::new(Mutex::new(cluster)),
            keeper: Mutex::new(keeper),
            turn: Mutex::new(()),
            behind: Mutex::new(None),
            unasked: Default::default(),
        }))
    }

    /// Does this schedule fail the primary over (and so play on the cluster, alone)?
    pub fn wanted_by(schedule: &Schedule) -> bool {
        schedule
            .steps()
            .iter()
            .any(|step| FaultKind::of(step) == Some(FaultKind::Failover))
    }

    /// Waits for the cluster to be this schedule's alone and whole — the node the last
    /// failover killed started again, the replica in sync with the primary, every Sentinel
    /// naming that primary and knowing the replica up, for [`SETTLED`] on end — and returns
    /// the turn and the Sentinels' URLs (the clients' way to the primary).
    ///
    /// The killed node comes back here, between histories, not in the one that killed it:
    /// its full sync (a fork on the primary) slowed a busy machine's primary enough now and
    /// then that the Sentinels called it down and failed over once more, a failover no
    /// schedule held.
    pub fn take_turn(&self) -> Result<(MutexGuard<'_, ()>, Vec<String>)> {
        let turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        self.unasked
            .store(false, std::sync::atomic::Ordering::Release);
        if self.cluster().replica.pid.is_none() {
            self.start_replica_again()?;
        }
        let deadline = Instant::now() + WITHIN;
        let mut whole_since: Option<Instant> = None;
        loop {
            let (lacking, sentinels) = {
                let switched = self.switched_by_itself();
                let mut cluster = self.cluster();
                if switched {
                    // The Sentinels failed over by themselves (see `DOWN_AFTER`): their
                    // primary is the cluster's.
                    cluster.promoted();
                }
                (lacking(&cluster), cluster.sentinel_urls())
            };
            let Some(lacking) = lacking else {
                let since = *whole_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= SETTLED {
                    return Ok((turn, sentinels));
                }
                std::thread::sleep(Duration::from_millis(50));
                continue;
            };
            whole_since = None;
            if Instant::now() > deadline {
                bail!(
                    "the Redis cluster of the failovers was not whole again within {}s: \
                     {lacking}; overloaded machine?",
                    WITHIN.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Do the Sentinels name the replica primary, unasked — a failover by themselves,
    /// which no schedule holds? (Every Sentinel that answers names it.)
    pub fn switched_by_itself(&self) -> bool {
        let (sentinels, replica) = {
            let cluster = self.cluster.lock().unwrap_or_else(|p| p.into_inner());
            (cluster.sentinel_urls(), cluster.replica.addr())
        };
        let named: Vec<String> = (sentinels.iter())
            .filter_map(|url| cluster::master_addr_from(url, MASTER_NAME))
            .collect();
        !named.is_empty() && named.iter().all(|addr| *addr == replica)
    }

    /// Did the Sentinels fail over by themselves during this turn's history: seen before
    /// its failover killed the primary, or at its end?
    pub fn switched_during_turn(&self) -> bool {
        self.unasked.load(std::sync::atomic::Ordering::Acquire) || self.switched_by_itself()
    }

    fn cluster(&self) -> MutexGuard<'_, SentinelCluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Kills the primary and waits until the replica says it is the primary and a Sentinel
    /// names it: how long the cluster had no primary.
    fn fail_over(&self) -> Result<Duration> {
        if self.switched_by_itself() {
            // Their primary is the one to kill; the history is unknown all the same.
            self.unasked
                .store(true, std::sync::atomic::Ordering::Release);
            self.cluster().promoted();
        }
        // The primary's replication offset, asked just before the kill: at least what it
        // had written (and acknowledged) by then.
        let written = offset_of(&self.cluster().primary.url(), "master_repl_offset");
        let started = Instant::now();
        let (old, new_url, new_addr) = {
            let mut cluster = self.cluster();
            SentinelCluster::kill(&mut cluster.primary);
            (
                cluster.primary.port,
                cluster.replica.url(),
                cluster.replica.addr(),
            )
        };
        let sentinels = self.cluster().sentinel_urls();
        loop {
            let named = sentinels.iter().any(|url| {
                cluster::master_addr_from(url, MASTER_NAME).as_deref() == Some(new_addr.as_str())
            });
            if named && cluster::role_of(&new_url).as_deref() == Some("master") {
                break;
            }
            if started.elapsed() > WITHIN {
                bail!(
                    "the Sentinels did not promote the replica within {}s of the primary \
                     :{old}'s kill (a busy machine? run again)",
                    WITHIN.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = started.elapsed();
        // Promoted, the replica keeps the old stream's id "valid up to" one past the last
        // byte of it it had received.
        let received = offset_of(&new_url, "second_repl_offset").map(|o| o.saturating_sub(1));
        *self.behind.lock().unwrap_or_else(|p| p.into_inner()) =
            written.zip(received).map(|(w, r)| w.saturating_sub(r));
        self.cluster().promoted();
        Ok(took)
    }

    /// Starts the killed node again as the primary's replica, from the keeper thread.
    fn start_replica_again(&self) -> Result<()> {
        let (answer, answered) = mpsc::channel();
        let cluster = Arc::clone(&self.cluster);
        self.keeper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Box::new(move || {
                let mut cluster = cluster.lock().unwrap_or_else(|p| p.into_inner());
                let _ = answer.send(cluster.start_replica_again());
            }))
            .map_err(|_| anyhow!("the Redis cluster's keeper thread is gone"))?;
        answered
            .recv()
            .map_err(|_| anyhow!("the Redis cluster's keeper thread is gone"))?
    }
}

/// One number of a node's `INFO replication`.
fn offset_of(url: &str, field: &str) -> Option<u64> {
    let info = cluster::replication_info(url)?;
    let line = info
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))?;
    line.trim().parse().ok()
}

impl SentinelRing {
    /// The history's line for the failover's end: how long the promotion took, and how far
    /// the promoted replica was behind, from both servers' own offsets.
    pub fn promoted_words(&self, took: Duration) -> String {
        let behind = *self.behind.lock().unwrap_or_else(|p| p.into_inner());
        let short = match behind {
            Some(0) => ", with every byte the primary had written just before the kill",
            Some(_) => ", short of what the primary had written: acknowledged writes gone",
            None => "",
        };
        let bytes = behind
            .filter(|b| *b > 0)
            .map_or(String::new(), |b| format!(" ({b} bytes)"));
        format!(
            "the replica promoted {}ms after the kill{short}{bytes} (the old primary starts \
             again, as its replica, before the next schedule)",
            took.as_millis()
        )
    }
}

/// What the cluster lacks to be whole, if anything: both data nodes running, the
/// replica's link to the primary up, every Sentinel naming the primary and seeing the
/// replica up.
fn lacking(cluster: &SentinelCluster) -> Option<String> {
    let (primary, replica) = (&cluster.primary, &cluster.replica);
    if primary.pid.is_none() || replica.pid.is_none() {
        return Some("a node is not running".into());
    }
    let synced = cluster::replication_info(&replica.url())
        .is_some_and(|info| info.contains("master_link_status:up"));
    if !synced {
        return Some(format!(
            "the replica :{} is not in sync with the primary :{}",
            replica.port, primary.port
        ));
    }
    for sentinel in &cluster.sentinels {
        let named = cluster::master_addr_from(&sentinel.url(), MASTER_NAME);
        if named.as_deref() != Some(primary.addr().as_str()) {
            return Some(format!(
                "the Sentinel :{} names {} primary, not :{}",
                sentinel.port,
                named.as_deref().unwrap_or("no node"),
                primary.port
            ));
        }
        let replicas = cluster::sentinel_count(&sentinel.url(), "replicas");
        if replicas != Some(1) {
            return Some(format!(
                "the Sentinel :{} sees {} replica(s) up, not 1",
                sentinel.port,
                replicas.map_or("no".into(), |n| n.to_string())
            ));
        }
    }
    None
}

/// The cluster's primary as the nemesis sees it: a failover is a restart of whichever node
/// is the primary when it lands, which comes back as the replica before the next schedule.
pub struct Primary<'a>(pub &'a SentinelRing);

impl Victim for Primary<'_> {
    fn label(&self) -> String {
        REDIS_PRIMARY.into()
    }

    fn pid(&self) -> Option<i32> {
        self.0.cluster().primary.pid
    }

    fn kill_now(&mut self) {
        SentinelCluster::kill(&mut self.0.cluster().primary);
    }

    fn restart_now(&mut self) -> Result<Duration> {
        self.0.fail_over()
    }
}

/// The cluster a run needs: when it may draw a failover for a Redis design, on Redis
/// servers of chaos's own (never a given one).
pub fn ring_for(
    designs: &[Design],
    kinds: &[FaultKind],
    redis_given: bool,
) -> Result<Option<Arc<SentinelRing>>> {
    let wanted = kinds.contains(&FaultKind::Failover)
        && designs.iter().any(|d| d.uses_redis())
        && !redis_given;
    wanted.then(SentinelRing::start).transpose()
}
