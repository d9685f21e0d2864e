//! The ground a hunt plays on: the servers every schedule shares, and the lanes.

use std::time::Duration;

use anyhow::{Result, bail};

use super::lane::{self, Lane};
use super::play::{self, Setup};
use super::{cluster, failover};
use crate::connect::Backend;
use crate::designs::Design;
use crate::servers::{self, ServerArgs, Servers};

/// Servers for a set of designs: the store (Postgres), etcd if one needs it, and Redis —
/// one of chaos's own per lane of schedules played side by side (private: a restart is a
/// fault it may aim at one lane's Redis without touching the others), or the one given by
/// `--redis-url`, which chaos never restarts (server faults only on servers it started).
pub struct Ground {
    pub servers: Servers,
    /// Shared by every setup taken from it: the matrix plays all its designs' cells at once.
    pub lanes: std::sync::Arc<Vec<Lane>>,
    /// The Redis was given: client faults only.
    pub redis_given: bool,
    pub run_id: String,
    /// The etcd cluster of the leader kills (issue 25), when a run may draw one.
    pub etcd_ring: Option<std::sync::Arc<cluster::EtcdRing>>,
    /// The Redis primary and replica under Sentinel of the failovers, when a run may draw
    /// one.
    pub sentinel_ring: Option<std::sync::Arc<failover::SentinelRing>>,
    /// Partitions may be drawn: they were asked for, and this machine can make hosts
    /// ([`Ground::allow_partitions`]).
    pub hosts: bool,
}

impl Ground {
    pub fn start(args: &ServerArgs, designs: &[Design], parallel: u32) -> Result<Ground> {
        let mut needs = vec![Backend::Postgres];
        if designs.iter().any(|d| d.uses_etcd()) {
            needs.push(Backend::Etcd);
        }
        let given = args.given(Backend::Redis).map(String::from);
        let uses_redis = designs.iter().any(|d| d.uses_redis());
        if uses_redis && given.is_some() {
            needs.push(Backend::Redis);
        }
        let servers = servers::provide(args, &needs)?;
        let mut lanes = match (&given, uses_redis) {
            (_, false) => vec![Lane::default()],
            (Some(_), true) => vec![Lane::given(servers.url(Backend::Redis))],
            (None, true) => (0..parallel.max(1))
                .map(|_| Lane::private_redis())
                .collect::<Result<_>>()?,
        };
        if designs.iter().any(|d| d.uses_masters()) {
            lane::add_masters(&mut lanes, parallel)?;
        }
        let ground = Ground {
            servers,
            lanes: lanes.into(),
            redis_given: given.is_some() && uses_redis,
            run_id: crate::labs::new_run_id(),
            etcd_ring: None,
            sentinel_ring: None,
            hosts: false,
        };
        ground.check_permissions(designs)?;
        Ok(ground)
    }

    /// Before any schedule plays: the clients' own commands, on a key named like theirs
    /// (`lockslab:<run id>:chaos:…`), on a given Redis and on etcd, as the users their URLs
    /// name. A user that may not send them — a room seat's outside its namespace, an ACL
    /// without `EVAL` — would otherwise fail every client's every write, each recorded as
    /// an unknown outcome: "0 writes", exit 3, and the server's refusal never shown. Here
    /// it stops the run (exit 4) with the refusal in its words.
    fn check_permissions(&self, designs: &[Design]) -> Result<()> {
        let key = format!("lockslab:{}:chaos:permissions", self.run_id);
        if self.redis_given {
            let url = self.servers.url(Backend::Redis);
            let counter = format!("{key}:token");
            let checked = crate::connect::redis(url).and_then(|conn| {
                let mut lock =
                    crate::lock::redis::RedisLock::new(conn, &key, Duration::from_secs(10));
                let held = lock.acquire_within(Duration::ZERO, Some(&counter))?;
                if let Some(held) = held {
                    lock.release(&held)?;
                }
                Ok(())
            });
            if let Err(err) = checked {
                bail!(
                    "the Redis at {} refused the commands chaos's clients send (SET NX PX, \
                     INCR, EVALSHA, SCRIPT LOAD) on {key}: {}. Its user needs them on keys \
                     lockslab:<run id>:* (a room seat's lines give that on the seat's own \
                     Redis)",
                    crate::connect::redact(url),
                    crate::connect::explain(err).root_cause()
                );
            }
            if let Ok(mut conn) = crate::connect::redis(url) {
                let _ = redis::cmd("DEL").arg(&counter).query::<i64>(&mut *conn);
            }
        }
        if designs.iter().any(|d| d.uses_etcd()) {
            let url = self.servers.url(Backend::Etcd);
            let checked = crate::connect::etcd_runtime().and_then(|runtime| {
                runtime.block_on(async {
                    let mut client = crate::connect::etcd(url).await?;
                    client.put(key.as_str(), "chaos", None).await?;
                    client.delete(key.as_str(), None).await?;
                    anyhow::Ok(())
                })
            });
            if let Err(err) = checked {
                bail!(
                    "etcd at {} refused chaos's clients a write and a delete of {key}: {}. \
                     Its user needs read and write on the keys under lockslab:<run id>: (a \
                     room seat's has them under lockslab:<seat>_)",
                    crate::connect::redact(url),
                    crate::connect::explain(err).root_cause()
                );
            }
        }
        Ok(())
    }

    /// Lets schedules cut clients off on hosts when `kinds` asks for partitions and this
    /// machine can make hosts; where it cannot, returns the one line that says why they are
    /// not played.
    pub fn allow_partitions(
        &mut self,
        kinds: &[crate::nemesis::generate::FaultKind],
    ) -> Option<String> {
        if !kinds.contains(&crate::nemesis::generate::FaultKind::Partition) {
            return None;
        }
        match crate::hosts::Hosts::unavailable() {
            None => {
                self.hosts = true;
                None
            }
            Some(why) => Some(format!(
                "partition: not played — this machine cannot make hosts (network \
                 namespaces): {why}"
            )),
        }
    }

    /// A setup for one design, borrowing the lanes' Redis servers for its restarts;
    /// `given`: its schedules are the one given (see [`Setup::given`]).
    pub fn setup(&mut self, design: Design, given: bool) -> Setup {
        let etcd_url = design
            .uses_etcd()
            .then(|| self.servers.url(Backend::Etcd).to_string());
        Setup {
            design,
            run_id: format!("{}_{}", self.run_id, design.name().replace('-', "_")),
            store_url: self.servers.url(Backend::Postgres).to_string(),
            lanes: self.lanes.clone(),
            etcd_url,
            etcd_ring: self.etcd_ring.clone().filter(|_| design.uses_etcd()),
            sentinel_ring: self.sentinel_ring.clone().filter(|_| design.uses_redis()),
            records: 2,
            run_ms: play::run_ms_of(design),
            work_ms: 20,
            lease_ms: Setup::lease_for(design),
            given,
            hosts: self.hosts,
        }
    }

    /// Takes the lanes back from a setup.
    pub fn give_back(&mut self, setup: Setup) {
        self.lanes = setup.lanes;
    }
}
