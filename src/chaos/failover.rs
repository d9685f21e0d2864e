//! Chaos's Redis failover (issue 25): the Redis designs against lab 5's primary and
//! replica watched by three Sentinels ([`crate::cluster::SentinelCluster`]), whose primary a
//! schedule kills once its replica has lagged (played by the nemesis's player:
//! [`crate::nemesis::play::Faults::failing_over`]).
//!
//! ```text
//!  client A ─┐  "where is the primary?"
//!  client B ─┼──▶ Sentinels ──▶ primary :p   ✗ SIGKILL after the lag: they agree it is down
//!  client C ─┘                  replica :r   ❄ frozen, its link cut, for the lag (200-700ms);
//!                                            thawed at the kill, then promoted; the clients,
//!                                            asking again after an error, move to it; :p
//!                                            starts again as its replica, empty, before
//!                                            the next schedule
//! ```
//!
//! Replication is asynchronous: a write the primary acknowledged and had not yet sent on
//! is gone from the promoted replica — a lock key, an `INCR` (lab 5). On one machine the
//! replica is never behind by itself, so the schedule makes it lag as lab 5 does: frozen,
//! its link closed from the primary's side, while the primary takes writes; the primary
//! dies, the replica is thawed (no primary left to catch up from) and promoted. The lag
//! stays under the Sentinels' down-after (1s), so they never call the replica down and
//! pass it over. Every client asks the Sentinels where the primary is, and asks again
//! after an error. A failover reaches every history on the cluster, so the schedules that
//! hold one play one at a time (the others play on their lane's Redis, as before).
//!
//! ```text
//!  at_ms               + duration_ms (the lag)          + the Sentinels' time
//!  ❄ replica frozen,   ✗ primary killed (SIGKILL),       ▶ replica promoted: how far
//!    its link cut        replica thawed                    behind it was, in bytes
//!  ───────────── the primary alone takes the writes ──▶ gone with it
//! ```
//!
//! The failover is one step of the schedule (a restart of `redis-primary`, its lag the
//! `duration_ms`), played among the others by the one player: the lag (a pause of the
//! replica that cuts its link), the primary's kill (a restart's start: the Sentinels bring
//! the replica in its place) and the replica's thaw; the promotion, which [`Primary`] sees
//! when the servers say so, ends it.

use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow, bail};

use crate::cluster::{self, MASTER_NAME, SentinelCluster};
use crate::designs::Design;
use crate::events::facts::FaultFacts;
use crate::nemesis::generate::{FaultKind, REDIS_PRIMARY};
use crate::nemesis::schedule::{Schedule, Step};
use crate::nemesis::{Fault, Note, Return, Victim};

/// The schedule's other steps, and its failover (a restart of `redis-primary`).
pub fn split(schedule: &Schedule) -> (Schedule, Schedule) {
    let (failover, rest): (Vec<Step>, Vec<Step>) = (schedule.steps().iter().cloned())
        .partition(|step| FaultKind::of(step) == Some(FaultKind::Failover));
    (Schedule::new(rest), Schedule::new(failover))
}

/// Checks a given schedule's failovers (`--schedule`): a lag (`duration_ms`) under the
/// Sentinels' down-after. Returns the schedule for the usual checks, its failovers' lags
/// left out (only a pause has a duration there).
pub fn validate(schedule: &Schedule) -> Result<Schedule> {
    let (rest, failover) = split(schedule);
    let longest = LONGEST_LAG.as_millis() as u64;
    if let Some(ms) =
        (failover.steps().iter()).find_map(|s| s.duration_ms.filter(|ms| *ms > longest))
    {
        bail!(
            "a failover's replica lags {ms} ms: at most {longest} ms, under the Sentinels' \
             down-after ({} ms) — they call a replica silent that long down, and pass over \
             a replica they hold down when they promote one",
            DOWN_AFTER.as_millis()
        );
    }
    let no_lag = (failover.steps().iter()).map(|step| Step {
        duration_ms: None,
        ..step.clone()
    });
    Ok(Schedule::new(
        rest.steps().iter().cloned().chain(no_lag).collect(),
    ))
}

/// The longest lag of a schedule's failover steps (0: none, or its replica in sync).
pub fn lag_ms(schedule: &Schedule) -> u64 {
    let (_, failover) = split(schedule);
    let lags = failover.steps().iter().filter_map(|step| step.duration_ms);
    lags.max().unwrap_or(0)
}

/// How long the Sentinels may take to promote the replica, and the cluster to be whole
/// again (the old primary back and in sync): far above Sentinel's timers (a primary is
/// down after a second; a Sentinel that led a failover waits twice its 3s failover timeout
/// before it leads another), for a loaded machine.
pub(super) const WITHIN: Duration = Duration::from_secs(20);

/// How long a primary may stay silent before a Sentinel calls it down: twice lab 5's, which
/// on a loaded machine (a full sync's fork, a busy core) called a healthy primary down now
/// and then and failed over by itself — a failover no schedule held.
pub(super) const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// The longest a given schedule's replica may lag (`duration_ms`): under [`DOWN_AFTER`], so
/// that the Sentinels never call it down and pass it over (drawn lags are shorter still,
/// [`crate::nemesis::generate::FAILOVER_LAG_MS`]).
pub(super) const LONGEST_LAG: Duration = Duration::from_millis(900);

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

    /// The Sentinels failed over by themselves before this failover began (their primary
    /// is the one to lag and kill; the history is unknown all the same).
    pub(super) fn see_unasked(&self) {
        if self.switched_by_itself() {
            self.unasked
                .store(true, std::sync::atomic::Ordering::Release);
            self.cluster().promoted();
        }
    }

    /// The primary's URL now (after a failover by themselves: the promoted node's).
    pub(super) fn primary_url(&self) -> String {
        self.cluster().primary.url()
    }

    /// The ports of the primary and the replica now.
    pub(super) fn ports(&self) -> (u16, u16) {
        let cluster = self.cluster();
        (cluster.primary.port, cluster.replica.port)
    }

    /// Just before the primary dies: how far its replication stream went (what it had
    /// written), read from its own `INFO`. A failover without a lag looks here whether the
    /// Sentinels failed over by themselves first (a lag looked as it began).
    pub(super) fn written_before_kill(&self, lag_ms: u64) -> Option<u64> {
        if lag_ms == 0 {
            self.see_unasked();
        }
        offset_of(&self.primary_url(), "master_repl_offset")
    }

    /// Has the replica taken over — it says it is the primary, and a Sentinel names it? Then
    /// the cluster's roles swap, and this returns how far the replica was behind what the
    /// primary had `written`, in bytes of the replication stream, when both answered.
    pub(super) fn took_over(&self, written: Option<u64>) -> Option<Option<u64>> {
        let (url, addr, sentinels) = {
            let cluster = self.cluster();
            let replica = &cluster.replica;
            (replica.url(), replica.addr(), cluster.sentinel_urls())
        };
        let named = sentinels.iter().any(|sentinel| {
            cluster::master_addr_from(sentinel, MASTER_NAME).as_deref() == Some(addr.as_str())
        });
        if !named || cluster::role_of(&url).as_deref() != Some("master") {
            return None;
        }
        // Promoted, the replica keeps the old stream's id "valid up to" one past the last
        // byte of it it had received.
        let received = offset_of(&url, "second_repl_offset").map(|o| o.saturating_sub(1));
        self.cluster().promoted();
        Some(written.zip(received).map(|(w, r)| w.saturating_sub(r)))
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

/// The history's line for the failover's end: how long the promotion took, and how far
/// the promoted replica was behind, from both servers' own offsets.
fn promoted_words(took: Duration, behind: Option<u64>) -> String {
    let short = match behind {
        Some(0) => ", with every byte the primary had written by its kill".into(),
        Some(bytes) => format!(
            ", {bytes} bytes short of what the primary had written by its kill: what it \
             took in the lag is gone"
        ),
        None => String::new(),
    };
    format!(
        "the replica promoted {}ms after the kill{short} (the old primary starts again, as \
         its replica, before the next schedule)",
        took.as_millis()
    )
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

/// The name the history gives the failover's replica, which a lag freezes.
pub const REDIS_REPLICA: &str = "redis-replica";

/// The cluster's replica as the nemesis sees it: frozen and thawed by a lag.
pub(super) struct Replica<'a>(pub(super) &'a SentinelRing);

impl Victim for Replica<'_> {
    fn label(&self) -> String {
        REDIS_REPLICA.into()
    }

    /// Before its lag: did the Sentinels fail over by themselves first? Then the node to
    /// freeze is the other one.
    fn before(&mut self, fault: Fault) {
        if fault == Fault::Pause {
            self.0.see_unasked();
        }
    }

    fn pid(&self) -> Option<i32> {
        self.0.cluster().replica.pid
    }

    fn kill_now(&mut self) {
        SentinelCluster::kill(&mut self.0.cluster().replica);
    }
}

/// The cluster's primary as the nemesis sees it: a failover's restart kills it, and the
/// Sentinels put the replica in its place ([`Victim::returns_by_itself`]); it says when
/// they have, and how far behind the promoted replica was.
pub(super) struct Primary<'a> {
    ring: &'a SentinelRing,
    /// How long the replica lagged before the kill (0: in sync).
    lag_ms: u64,
    /// How far the primary's stream went just before its kill.
    written: Option<u64>,
    killed_at: Option<Instant>,
    /// When the servers were last asked whether the replica took over.
    asked: Option<Instant>,
}

impl<'a> Primary<'a> {
    pub(super) fn new(ring: &'a SentinelRing, lag_ms: u64) -> Primary<'a> {
        Primary {
            ring,
            lag_ms,
            written: None,
            killed_at: None,
            asked: None,
        }
    }
}

impl Victim for Primary<'_> {
    fn label(&self) -> String {
        REDIS_PRIMARY.into()
    }

    fn pid(&self) -> Option<i32> {
        self.ring.cluster().primary.pid
    }

    /// Just before the kill: how far its stream went.
    fn before(&mut self, fault: Fault) {
        if fault == Fault::Restart {
            self.written = self.ring.written_before_kill(self.lag_ms);
        }
    }

    fn kill_now(&mut self) {
        SentinelCluster::kill(&mut self.ring.cluster().primary);
        self.killed_at = Some(Instant::now());
    }

    fn returns_by_itself(&self) -> bool {
        true
    }

    /// The replica promoted in its place: the failover's end. The Sentinels and the
    /// replica are asked every 20ms at most.
    fn has_returned(&mut self) -> Result<Return> {
        let Some(at) = self.killed_at else {
            return Ok(Return::Unwatched);
        };
        if (self.asked).is_some_and(|asked| asked.elapsed() < Duration::from_millis(20)) {
            return Ok(Return::NotYet);
        }
        self.asked = Some(Instant::now());
        if let Some(behind) = self.ring.took_over(self.written) {
            self.killed_at = None;
            let took = at.elapsed();
            let note = Box::new(Note::new(
                promoted_words(took, behind),
                FaultFacts::default(),
            ));
            return Ok(Return::Back { took, note });
        }
        if at.elapsed() > WITHIN {
            bail!(
                "the Sentinels did not promote the replica within {}s of the primary's kill \
                 (a busy machine? run again)",
                WITHIN.as_secs()
            );
        }
        Ok(Return::NotYet)
    }
}

/// The history's words for a failover's faults, from the step's lag: the replica's lag
/// (with how many links its cut closed), the primary's kill, the replica's thaw.
pub(super) fn words(
    ring: &SentinelRing,
    cue: &crate::nemesis::play::Cue,
    lag_ms: u64,
) -> Option<Note> {
    let (primary, replica) = ring.ports();
    let target = cue.action.target.as_str();
    let (words, port) = match cue.action.fault {
        Fault::Pause if target == REDIS_REPLICA => {
            (lag_words(replica, cue.links_closed, lag_ms), replica)
        }
        Fault::Restart if target == REDIS_PRIMARY && cue.back_after.is_none() => {
            (kill_words(lag_ms), primary)
        }
        Fault::Resume if target == REDIS_REPLICA => (thaw_words(replica), replica),
        _ => return None,
    };
    Some(Note::new(words, on_port(port)))
}

/// The history's words for a failover's three faults: the replica's lag (with how many
/// links its cut closed), the primary's kill, the replica's thaw.
fn lag_words(replica: u16, closed: Option<u64>, lag_ms: u64) -> String {
    let closed = closed.unwrap_or(0);
    format!(
        "the replica :{replica} lags: frozen (SIGSTOP), its link cut ({closed} closed) — \
         what the primary takes meanwhile it never gets; the primary dies in {lag_ms}ms"
    )
}

fn kill_words(lag_ms: u64) -> String {
    match lag_ms {
        0 => "kills Redis's primary (SIGKILL), its replica in sync: the Sentinels are to \
              promote it"
            .to_string(),
        _ => format!(
            "kills Redis's primary (SIGKILL) after {lag_ms}ms of lag: the Sentinels are to \
             promote its replica"
        ),
    }
}

fn thaw_words(replica: u16) -> String {
    format!(
        "thaws the replica :{replica}: its primary is dead, nothing can send it what it \
         missed"
    )
}

/// What a failover's fault says besides its words: the node's port.
fn on_port(port: u16) -> FaultFacts {
    FaultFacts {
        port: Some(port),
        ..FaultFacts::default()
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
