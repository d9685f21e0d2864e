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
use crate::labs::Stage;
use crate::lock::redis::RedisLock;
use crate::nemesis::{Held, Nemesis, Note};
use crate::output::human;
use crate::store::Store;
use crate::worker::sentinel_client::TokenSource;

impl Play<'_> {
    /// Scenarios 1, 2 and 4: one failover, five pairs of clients.
    pub(super) fn redis_failover(
        &self,
        stage: &mut Stage,
        nemesis: &mut Nemesis,
        redis: &mut SentinelCluster,
        store: &mut Store,
    ) -> Result<Vec<Scenario>> {
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            "── Redis: primary + replica + 3 Sentinels ──".red().bold()
        ));
        stage.tags().scenario = Some("redis-failover".into());
        let (primary, replica) = (redis.primary.port, redis.replica.port);
        let pairs = self.pairs();
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
                pairs.len()
            ),
        ));

        // The replica falls behind: frozen, and its link closed from the primary's side.
        // (Frozen alone is not enough: its kernel would still take the stream into the
        // socket buffer, and the replica would read A's key from there once thawed.)
        let mut on_primary = cluster::ask(&redis.primary.url()).context("asking the primary")?;
        let mut freeze = Held::default();
        nemesis.pause(&mut freeze, &redis.replica, Note::default())?;
        let cut = cluster::cut_replica_links(&mut on_primary).context("CLIENT KILL TYPE replica");
        for mut event in freeze.0 {
            event.text = match &cut {
                Ok(cut) => format!(
                    "freezes the replica (SIGSTOP) and cuts its link ({cut} closed): \
                     from now on writes live on the primary only"
                ),
                Err(_) => "freezes the replica (SIGSTOP)".into(),
            };
            if let Some(facts) = event.fault_mut() {
                facts.links_closed = Some(*cut.as_ref().unwrap_or(&0) as u64);
            }
            stage.record(event);
        }
        cut?;

        // Earlier holders of the `incr-lost` lock: their increments never reach the replica.
        let lost_counter = match &pairs[2].token {
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

        let mut a_workers = Vec::new();
        for pair in &pairs {
            a_workers
                .push(stage.spawn(&format!("A:{}", pair.label), &self.client("A", pair, redis))?);
        }
        let mut a_owners = Vec::new();
        for pair in &pairs {
            let name = format!("A:{}", pair.label);
            let got = stage.wait_for(
                Duration::from_secs(10),
                &format!("{name} to take the lock"),
                |e| e.is(&name, Kind::Acquired),
            )?;
            a_owners.push(got.owner().unwrap_or_default().to_string());
        }
        // A:wait's `WAIT 1` runs out against the frozen replica before the primary dies.
        let mut confirmed = Vec::new();
        for pair in &pairs {
            let name = format!("A:{}", pair.label);
            confirmed.push(if pair.a_waits {
                let answer = stage.wait_for(
                    Duration::from_secs(10),
                    &format!("{name}'s WAIT to answer"),
                    |e| e.is(&name, Kind::Lost) || e.is(&name, Kind::Kept),
                )?;
                match &answer.what {
                    What::Lost(lost) => lost.replicas_confirmed,
                    What::Kept(kept) => kept.replicas_confirmed,
                    _ => None,
                }
            } else {
                None
            });
        }

        // The primary's own answers just before the crash: A's keys, and no replica.
        let mut a_leases = Vec::new();
        for (pair, owner) in pairs.iter().zip(&a_owners) {
            let (found, pttl) =
                crate::lock::redis::owner_and_pttl(&mut on_primary, &self.key(pair.label))
                    .context("reading A's key on the primary")?;
            if found.as_deref() != Some(owner.as_str()) {
                bail!("the primary does not hold A:{}'s key", pair.label);
            }
            a_leases.push((stage.elapsed(), Duration::from_millis(pttl.max(0) as u64)));
        }
        let replicas = cluster::replication_info(&redis.primary.url())
            .and_then(|info| info_field(&info, "connected_slaves"))
            .unwrap_or_default();
        stage.record(
            Event::new("redis", HolderNow { connected_replicas: Some(replicas.clone()), ..HolderNow::default() }, format!(
                    "primary :{primary} holds all {} of A's keys (PTTL ~{}); connected replicas: {replicas}",
                    pairs.len(),
                    human(a_leases[0].1)
                )),
        );

        let min_replicas = self.min_replicas_refusal(stage, &mut on_primary)?;

        // Played by hand, not as a schedule (labs::faults): the replica's freeze and the cut
        // of its link make one line (`Held`), and the primary is killed once the lab has read
        // A's keys and the min-replicas refusal from it.
        let killed_at = Instant::now();
        nemesis.kill(
            stage,
            &mut redis.primary,
            Note::new(
                format!("SIGKILLs the primary :{primary}"),
                FaultFacts {
                    port: Some(primary),
                    ..FaultFacts::default()
                },
            ),
        )?;
        nemesis.resume(
            stage,
            &redis.replica,
            Note::new(
                format!("thaws the replica :{replica}"),
                FaultFacts {
                    port: Some(replica),
                    ..FaultFacts::default()
                },
            ),
        )?;

        let failover = self.watch_failover(stage, redis, killed_at)?;
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
            .arg(&lost_counter)
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

        let mut b_workers = Vec::new();
        for pair in &pairs {
            b_workers
                .push(stage.spawn(&format!("B:{}", pair.label), &self.client("B", pair, redis))?);
        }
        let mut b_granted = Vec::new();
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
            b_granted.push((stage.elapsed(), found == Some(owner)));
        }

        for b in &mut b_workers {
            b.tell("write")?;
        }
        for pair in &pairs {
            let name = format!("B:{}", pair.label);
            for _ in &pair.writes {
                stage.wait_for(Duration::from_secs(10), &format!("{name} to write"), |e| {
                    e.is(&name, Kind::Wrote)
                })?;
            }
        }
        // A never paused and never heard that its lock is gone: it writes now.
        for a in &mut a_workers {
            a.tell("write")?;
        }
        // Except A:wait, if its WAIT came back short: it writes nothing.
        for (pair, confirmed) in pairs.iter().zip(&confirmed) {
            let name = format!("A:{}", pair.label);
            let wanted = match confirmed {
                Some(n) if *n < 1 => 0,
                _ => pair.writes.len(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while stage
                .log
                .iter()
                .filter(|e| e.is(&name, Kind::Wrote))
                .count()
                < wanted
            {
                if Instant::now() > deadline {
                    bail!("timed out waiting for {name} to write");
                }
                stage.next(Duration::from_millis(50));
            }
        }
        for worker in a_workers.iter_mut().chain(b_workers.iter_mut()) {
            worker.tell("finish")?;
        }
        for worker in a_workers.iter_mut().chain(b_workers.iter_mut()) {
            let name = worker.name.clone();
            stage.wait_for(Duration::from_secs(10), &format!("{name} to let go"), |e| {
                e.is(&name, Kind::Released)
            })?;
            worker.finish(Duration::from_secs(10));
        }
        stage.drain();

        let mut scenarios = Vec::new();
        for (index, pair) in pairs.iter().enumerate() {
            // Two holders, per the servers: the old primary granted A a lease that was still
            // running when the new primary granted B (whose key it answered with).
            let (a_read, a_pttl) = a_leases[index];
            let (b_read, b_key_seen) = b_granted[index];
            let two = checks::redis_two_holders(&RedisGrants {
                a_read_ms: a_read.as_millis() as u64,
                a_pttl_ms: a_pttl.as_millis() as u64,
                new_primary_forgot: forgot[index],
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
                scenario.failover_ms = failover.map(|d| d.as_millis() as u64);
                scenario.replicas_confirmed = confirmed[index];
                if let Some(line) = store_line(&scenario) {
                    stage.record(line);
                }
                scenarios.push(scenario);
            }
        }
        scenarios.push(Scenario {
            failover_ms: failover.map(|d| d.as_millis() as u64),
            refused: Some(min_replicas),
            ..Scenario::nothing_granted("redis-min-replicas", "redis")
        });
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
            "A:min-replicas",
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
