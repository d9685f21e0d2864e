//! Lab 5's Redis part (scenarios 1, 2 and 4): one failover, five pairs of clients. The
//! replica is frozen and cut off, A takes five locks on the primary, the primary dies, the
//! Sentinels promote the replica, B takes the same five locks there, and both write.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use colored::Colorize;

use super::Play;
use super::verdict::{Scenario, store_line};
use crate::check::failover::{self as checks, RedisGrants};
use crate::cluster::{self, MASTER_NAME, SentinelCluster};
use crate::connect;
use crate::events::What;
use crate::events::facts::{self, Expired, FaultFacts, GaveUp, HolderNow};
use crate::events::{Event, Kind};
use crate::labs::faults::{self, Cue, Faults, Until};
use crate::labs::{Stage, WorkerHandle};
use crate::lock::redis::RedisLock;
use crate::nemesis::schedule::{Anchor, How, Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note, Victim};
use crate::output::human;
use crate::store::Store;
use crate::worker::sentinel_client::TokenSource;

/// The history's names of the two data nodes (their [`crate::cluster::RedisNode`] roles).
const PRIMARY: &str = "primary";
const REPLICA: &str = "replica";

/// The worker whose refused `SET NX` is the last thing the lab asks the primary.
const MIN_REPLICAS: &str = "A:min-replicas";

/// Lab 5's Redis faults, as data. The replica lags from the start: frozen, and its link
/// closed from the primary's side (frozen alone, its kernel would still take the stream
/// into the socket buffer, and it would read A's keys from there once thawed). The primary
/// dies, and the replica is thawed, once the primary refused A:min-replicas — the lab has
/// read A's keys and that refusal from it by then.
pub(super) fn redis_schedule() -> Schedule {
    let refused = || Some(Anchor::on(MIN_REPLICAS, Kind::GaveUp, 1));
    let step = |after, fault, target: &str| Step {
        at_ms: 0,
        after,
        fault,
        target: target.into(),
        duration_ms: None,
    };
    let lag = How {
        cut_link: true,
        ..How::default()
    };
    Schedule::done_so(vec![
        (step(None, Fault::Pause, REPLICA), lag),
        (step(refused(), Fault::Kill, PRIMARY), How::default()),
        (step(refused(), Fault::Resume, REPLICA), How::default()),
    ])
}

/// What the timeline says of each of the schedule's faults.
fn redis_words(cue: &Cue, primary: u16, replica: u16) -> Note {
    let port = |port| FaultFacts {
        port: Some(port),
        ..FaultFacts::default()
    };
    match (cue.action.fault, cue.links_closed) {
        (Fault::Pause, Some(cut)) => Note::from(format!(
            "freezes the replica (SIGSTOP) and cuts its link ({cut} closed): from now on \
             writes live on the primary only"
        )),
        (Fault::Pause, None) => Note::from("freezes the replica (SIGSTOP)"),
        (Fault::Kill, _) => Note::new(format!("SIGKILLs the primary :{primary}"), port(primary)),
        _ => Note::new(format!("thaws the replica :{replica}"), port(replica)),
    }
}

/// Plays the schedule's faults on the cluster's two data nodes until `until` holds.
fn play_on(
    redis: &mut SentinelCluster,
    stage: &mut Stage,
    (faults, nemesis): (&mut Faults, &mut Nemesis),
    until: Until,
) -> Result<()> {
    let cast: &mut [&mut dyn Victim] = &mut [&mut redis.replica, &mut redis.primary];
    stage.play(faults, nemesis, cast, until)
}

/// A's side before the primary dies: its clients, what A:wait's `WAIT` confirmed, and the
/// primary's own answer for each of A's keys (when read, its PTTL).
struct ASide {
    workers: Vec<WorkerHandle>,
    confirmed: Vec<Option<i64>>,
    leases: Vec<(Duration, Duration)>,
}

/// What the new primary answered for B: whether it had forgotten A's key, and when B's
/// grant was read back (with whether its key held B's owner).
struct BSide {
    workers: Vec<WorkerHandle>,
    forgot: Vec<bool>,
    granted: Vec<(Duration, bool)>,
    failover: Option<Duration>,
}

impl Play<'_> {
    /// Scenarios 1, 2 and 4: one failover, five pairs of clients. Its faults are
    /// [`redis_schedule`], played by the nemesis's player as their moments come.
    pub(super) fn redis_failover(
        &self,
        stage: &mut Stage,
        nemesis: &mut Nemesis,
        redis: &mut SentinelCluster,
        store: &mut Store,
    ) -> Result<Vec<Scenario>> {
        self.redis_heading(stage, redis);
        let schedule = redis_schedule();
        faults::show(stage, &schedule);
        let (primary, replica, primary_url) =
            (redis.primary.port, redis.replica.port, redis.primary.url());
        let mut faults = Faults::new(&schedule, stage)
            .saying(|cue| redis_words(cue, primary, replica))
            .on_replica(REPLICA, move || primary_url.clone());
        let within = Duration::from_secs(10);
        let replica_lags = Until::acted(Fault::Pause, REPLICA, within);
        play_on(redis, stage, (&mut faults, nemesis), replica_lags)?;
        let lost_counter = self.earlier_holders(stage, redis)?;
        let mut a = self.a_takes_its_locks(stage, redis)?;
        let mut on_primary = cluster::ask(&redis.primary.url()).context("asking the primary")?;
        a.leases = self.primary_holds_a(stage, redis, &mut on_primary)?;
        let min_replicas = self.min_replicas_refusal(stage, &mut on_primary)?;
        let killed_at = Instant::now();
        play_on(redis, stage, (&mut faults, nemesis), Until::done(within))?;
        let failover = self.watch_failover(stage, redis, killed_at)?;
        let mut b = self.b_takes_its_locks(stage, redis, &lost_counter)?;
        b.failover = failover;
        self.both_write(stage, &mut a, &mut b)?;
        let mut scenarios = self.redis_scenarios(stage, store, &a, &b)?;
        scenarios.push(Scenario {
            failover_ms: failover.map(|d| d.as_millis() as u64),
            refused: Some(min_replicas),
            ..Scenario::nothing_granted("redis-min-replicas", "redis")
        });
        Ok(scenarios)
    }

    /// The part's heading, and the run's facts: which node is which.
    fn redis_heading(&self, stage: &mut Stage, redis: &SentinelCluster) {
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            "── Redis: primary + replica + 3 Sentinels ──".red().bold()
        ));
        stage.tags().scenario = Some("redis-failover".into());
        let (primary, replica) = (redis.primary.port, redis.replica.port);
        stage.record(Event::new(
            "lab",
            facts::RunFacts {
                run_id: Some(self.run_id.into()),
                primary: Some(primary),
                replica: Some(replica),
                ..facts::RunFacts::default()
            },
            format!(
                "run {}: {} locks on the primary :{primary}, replicated to :{replica}",
                self.run_id,
                self.pairs().len()
            ),
        ));
    }

    /// Two earlier holders of the `incr-lost` lock, on the lagging primary: their
    /// increments never reach the replica. Returns that lock's counter key.
    fn earlier_holders(&self, stage: &mut Stage, redis: &SentinelCluster) -> Result<String> {
        let lost_counter = match &self.pairs()[2].token {
            TokenSource::RedisCounter { key } => key.clone(),
            _ => unreachable!("pair 2 counts in Redis"),
        };
        let mut earlier = RedisLock::new(
            connect::redis(&redis.primary.url())?,
            &self.key("incr-lost"),
            self.ttl,
        );
        for _ in 0..2 {
            let held = earlier
                .try_acquire_fenced(&lost_counter)?
                .context("an earlier holder could not take the free lock")?;
            earlier.release(&held)?;
        }
        stage.record(Event::new(
            "lab",
            facts::RunFacts::default(),
            "plays two earlier holders of the incr-lost lock (tokens 1, 2) on the primary",
        ));
        Ok(lost_counter)
    }

    /// A's five clients take their locks on the primary; A:wait's `WAIT 1` runs out
    /// against the frozen replica before the primary dies.
    fn a_takes_its_locks(&self, stage: &mut Stage, redis: &SentinelCluster) -> Result<ASide> {
        let pairs = self.pairs();
        let mut workers = Vec::new();
        for pair in &pairs {
            workers
                .push(stage.spawn(&format!("A:{}", pair.label), &self.client("A", pair, redis))?);
        }
        for pair in &pairs {
            let name = format!("A:{}", pair.label);
            stage.wait_for(
                Duration::from_secs(10),
                &format!("{name} to take the lock"),
                |e| e.is(&name, Kind::Acquired),
            )?;
        }
        let mut confirmed = Vec::new();
        for pair in &pairs {
            let name = format!("A:{}", pair.label);
            confirmed.push(if pair.a_waits {
                let answer = stage.wait_for(
                    Duration::from_secs(10),
                    &format!("{name}'s WAIT to answer"),
                    |e| e.is(&name, Kind::Lost) || e.is(&name, Kind::WaitAnswered),
                )?;
                match &answer.what {
                    What::Lost(lost) => lost.replicas_confirmed,
                    What::WaitAnswered(kept) => kept.replicas_confirmed,
                    _ => None,
                }
            } else {
                None
            });
        }
        Ok(ASide {
            workers,
            confirmed,
            leases: Vec::new(),
        })
    }

    /// The primary's own answers just before the crash: A's keys (each read's time and
    /// PTTL), and no replica.
    fn primary_holds_a(
        &self,
        stage: &mut Stage,
        redis: &SentinelCluster,
        on_primary: &mut redis::Connection,
    ) -> Result<Vec<(Duration, Duration)>> {
        let pairs = self.pairs();
        let mut leases = Vec::new();
        for pair in &pairs {
            let name = format!("A:{}", pair.label);
            let owner = stage.saw(&name, Kind::Acquired).and_then(|e| e.owner());
            let owner = owner.unwrap_or_default().to_string();
            let (found, pttl) =
                crate::lock::redis::owner_and_pttl(on_primary, &self.key(pair.label))
                    .context("reading A's key on the primary")?;
            if found.as_deref() != Some(owner.as_str()) {
                bail!("the primary does not hold A:{}'s key", pair.label);
            }
            leases.push((stage.elapsed(), Duration::from_millis(pttl.max(0) as u64)));
        }
        let replicas = cluster::replication_info(&redis.primary.url())
            .and_then(|info| info_field(&info, "connected_slaves"))
            .unwrap_or_default();
        let primary = redis.primary.port;
        stage.record(Event::new(
            "redis",
            HolderNow {
                connected_replicas: Some(replicas.clone()),
                ..HolderNow::default()
            },
            format!(
                "primary :{primary} holds all {} of A's keys (PTTL ~{}); connected replicas: \
                 {replicas}",
                pairs.len(),
                human(leases[0].1)
            ),
        ));
        Ok(leases)
    }

    /// The promoted replica's answers (A's keys forgotten, the `incr-lost` counter), then
    /// B's five clients take their locks there, each grant read back from it.
    fn b_takes_its_locks(
        &self,
        stage: &mut Stage,
        redis: &SentinelCluster,
        lost_counter: &str,
    ) -> Result<BSide> {
        let pairs = self.pairs();
        let replica = redis.replica.port;
        let mut on_new_primary =
            cluster::ask(&redis.replica.url()).context("asking the new primary")?;
        let mut forgot = Vec::new();
        for pair in &pairs {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(self.key(pair.label))
                .query(&mut on_new_primary)?;
            forgot.push(exists == 0);
        }
        let counter_now: Option<i64> = redis::cmd("GET")
            .arg(lost_counter)
            .query(&mut on_new_primary)?;
        stage.record(Event::new(
            "redis",
            Expired {
                ..Expired::default()
            },
            format!(
                "new primary :{replica} has {} of A's {} keys; incr-lost counter: {}",
                forgot.iter().filter(|f| !**f).count(),
                pairs.len(),
                counter_now.map_or("none".into(), |c| c.to_string())
            ),
        ));
        let mut workers = Vec::new();
        for pair in &pairs {
            workers
                .push(stage.spawn(&format!("B:{}", pair.label), &self.client("B", pair, redis))?);
        }
        let mut granted = Vec::new();
        for pair in &pairs {
            let name = format!("B:{}", pair.label);
            let got = stage.wait_for(
                Duration::from_secs(10),
                &format!("{name} to take the lock"),
                |e| e.is(&name, Kind::Acquired),
            )?;
            let owner = got.owner().unwrap_or_default().to_string();
            let found: Option<String> = redis::cmd("GET")
                .arg(self.key(pair.label))
                .query(&mut on_new_primary)?;
            granted.push((stage.elapsed(), found == Some(owner)));
        }
        Ok(BSide {
            workers,
            forgot,
            granted,
            failover: None,
        })
    }

    /// B writes, then A, which never paused and never heard that its lock is gone — but
    /// A:wait, whose `WAIT` came back short, writes nothing. Then every client lets go.
    fn both_write(&self, stage: &mut Stage, a: &mut ASide, b: &mut BSide) -> Result<()> {
        let pairs = self.pairs();
        for worker in &mut b.workers {
            worker.tell("write")?;
        }
        // Every one of B's writes, not its first: a client with two resources (B:incr writes
        // not-lower, then same-holder) would otherwise have A told to write while B's second
        // write is still to come, and on a busy machine A's lands first — no late write.
        for pair in &pairs {
            wait_for_writes(stage, &format!("B:{}", pair.label), pair.writes.len())?;
        }
        for worker in &mut a.workers {
            worker.tell("write")?;
        }
        for (pair, confirmed) in pairs.iter().zip(&a.confirmed) {
            let wanted = match confirmed {
                Some(n) if *n < 1 => 0,
                _ => pair.writes.len(),
            };
            wait_for_writes(stage, &format!("A:{}", pair.label), wanted)?;
        }
        for worker in a.workers.iter_mut().chain(b.workers.iter_mut()) {
            worker.tell("finish")?;
        }
        for worker in a.workers.iter_mut().chain(b.workers.iter_mut()) {
            let name = worker.name.clone();
            stage.wait_for(Duration::from_secs(10), &format!("{name} to let go"), |e| {
                e.is(&name, Kind::Released)
            })?;
            worker.finish(Duration::from_secs(10));
        }
        stage.drain();
        Ok(())
    }

    /// Each pair's scenarios, from the servers' answers and the store's read-back.
    fn redis_scenarios(
        &self,
        stage: &mut Stage,
        store: &mut Store,
        a: &ASide,
        b: &BSide,
    ) -> Result<Vec<Scenario>> {
        let mut scenarios = Vec::new();
        for (index, pair) in self.pairs().iter().enumerate() {
            // Two holders, per the servers: the old primary granted A a lease that was still
            // running when the new primary granted B (whose key it answered with).
            let (a_read, a_pttl) = a.leases[index];
            let (b_read, b_key_seen) = b.granted[index];
            let two = checks::redis_two_holders(&RedisGrants {
                a_read_ms: a_read.as_millis() as u64,
                a_pttl_ms: a_pttl.as_millis() as u64,
                new_primary_forgot: b.forgot[index],
                b_read_ms: b_read.as_millis() as u64,
                b_key_seen,
            });
            for (name, rule) in &pair.writes {
                let resource = self.resource(name);
                let read = store.read_back(self.run_id, &resource)?;
                stage.record_read_back(&resource, &read);
                let mut scenario = Scenario::from_store(
                    name,
                    if pair.label == "durable" {
                        "redis+postgres"
                    } else {
                        "redis"
                    },
                    two,
                    (pair.token != TokenSource::None).then_some(*rule),
                    read,
                    &format!("A:{}", pair.label),
                    &format!("B:{}", pair.label),
                )?;
                scenario.failover_ms = b.failover.map(|d| d.as_millis() as u64);
                scenario.replicas_confirmed = a.confirmed[index];
                if let Some(line) = store_line(&scenario) {
                    stage.conclude(line);
                }
                scenarios.push(scenario);
            }
        }
        Ok(scenarios)
    }

    /// `min-replicas-to-write 1` on the primary, for one more lock: A's `SET NX` on the same
    /// primary, with the replica gone, is refused (`NOREPLICAS`). The primary counts a
    /// replica as good while its last acknowledgement is at most `min-replicas-max-lag`
    /// seconds old (10 by default); this replica's link is closed, so none counts at once.
    /// The setting goes back to 0 at once, so that the other locks' story is unchanged.
    fn min_replicas_refusal(
        &self,
        stage: &mut Stage,
        on_primary: &mut redis::Connection,
    ) -> Result<String> {
        let set = |connection: &mut redis::Connection, value: &str| {
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("min-replicas-to-write")
                .arg(value)
                .query::<()>(connection)
                .context("CONFIG SET min-replicas-to-write")
        };
        set(on_primary, "1")?;
        let answer: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(self.key("min-replicas"))
            .arg("A")
            .arg("NX")
            .arg("PX")
            .arg(self.ttl.as_millis() as u64)
            .query(on_primary);
        set(on_primary, "0")?;
        let refusal = match answer {
            Err(err) if err.code() == Some("NOREPLICAS") => {
                format!("NOREPLICAS {}", err.detail().unwrap_or_default())
            }
            Err(err) => return Err(err).context("A:min-replicas's SET NX"),
            Ok(_) => {
                bail!("the primary granted a lock with min-replicas-to-write 1 and no replica")
            }
        };
        stage.record(Event::new(
            MIN_REPLICAS,
            GaveUp {
                why: Some(refusal.clone()),
                ..GaveUp::default()
            },
            format!("with min-replicas-to-write 1, SET NX PX on the primary answers: {refusal}"),
        ));
        Ok(refusal)
    }

    /// Watches until the replica answers `ROLE` with master: the failover time. Records
    /// when the Sentinels first name it too.
    fn watch_failover(
        &self,
        stage: &mut Stage,
        redis: &SentinelCluster,
        killed_at: Instant,
    ) -> Result<Option<Duration>> {
        let replica = redis.replica.clone();
        let sentinel = redis.sentinels[0].url();
        let deadline = killed_at + Duration::from_secs(20);
        let mut sentinel_switched = false;
        let mut promoted = None;
        while Instant::now() < deadline {
            if !sentinel_switched
                && cluster::master_addr_from(&sentinel, MASTER_NAME).as_deref()
                    == Some(replica.addr().as_str())
            {
                sentinel_switched = true;
                stage.record(Event::new(
                    "sentinel",
                    HolderNow {
                        ..HolderNow::default()
                    },
                    format!(
                        "names {} as the primary, {} after the kill",
                        replica.addr(),
                        human(killed_at.elapsed())
                    ),
                ));
            }
            if promoted.is_none() && cluster::role_of(&replica.url()).as_deref() == Some("master") {
                let took = killed_at.elapsed();
                stage.record(Event::new(
                    "redis",
                    HolderNow {
                        failover_ms: Some(took.as_millis() as u64),
                        ..HolderNow::default()
                    },
                    format!(
                        ":{} answers ROLE: master — failover took {}",
                        replica.port,
                        human(took)
                    ),
                ));
                promoted = Some(took);
            }
            // B finds the primary the way clients do, through Sentinel: wait for both.
            if promoted.is_some() && sentinel_switched {
                return Ok(promoted);
            }
            stage.next(Duration::from_millis(10));
        }
        bail!("Sentinel did not promote the replica within 20s of the primary's death")
    }
}

pub(super) fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .map(|value| value.trim().to_string())
}

/// Waits until the history holds `wanted` writes of `name` (10 s at most). Counted in the
/// log: [`Stage::wait_for`] returns the first match it finds there, so waiting for it once
/// a write would see the first write again and again.
fn wait_for_writes(stage: &mut Stage, name: &str, wanted: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while (stage.log.iter())
        .filter(|e| e.is(name, Kind::Wrote))
        .count()
        < wanted
    {
        if Instant::now() > deadline {
            bail!("timed out waiting for {name} to write");
        }
        stage.next(Duration::from_millis(50));
    }
    Ok(())
}
