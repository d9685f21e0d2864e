//! One run of lab 8's cut: A holds a lock kept alive from A's side — a Redis lock renewed
//! by a heartbeat, or (second row) an etcd lock on a lease renewed by a keepalive — and the
//! proxy on A's path to the lock's server cuts it (every connection reset, new ones
//! refused) while A still reaches the store. The renewals fail, the lease runs out on the
//! server, B takes the lock and writes; the cut heals and A, which never stopped working,
//! writes.
//!
//! The two rows differ in who says the lease is over: Redis's key simply expires a TTL after
//! the last renewal that reached it; etcd expires the lease a TTL after the last keepalive
//! it answered, deletes A's lock key with it, and hands the lock to B, queued behind it.
//! Neither can tell A: A is cut off.

use std::time::Duration;

use anyhow::Result;

use super::Plan;
use super::scene::Scene;
use super::verdict::RunVerdict;
use crate::connect::{self, Backend};
use crate::events::facts::Expired;
use crate::events::{Event, Kind};
use crate::labs::runner::Run;
use crate::lock::etcd::EtcdLock;
use crate::lock::redis::RedisLock;
use crate::proxy::{Direction, NetFault};
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite};

/// Which lock service A is cut off from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LockService {
    Redis,
    Etcd,
}

/// How the lab watches A's lock, on a connection of its own that the proxy does not cut.
enum Watch {
    Redis(Box<RedisLock>),
    Etcd(Box<EtcdLock>),
}

impl Watch {
    /// The lock's holder now, as its server answers: the Redis key's owner value, or the
    /// key under etcd's lock name with the lowest create revision.
    fn holder(&mut self) -> Result<Option<String>> {
        Ok(match self {
            Watch::Redis(lock) => lock.owner_and_pttl()?.0,
            Watch::Etcd(lock) => {
                let name = lock.name.clone();
                lock.holder_of(&name)?.map(|(key, _)| key)
            }
        })
    }
}

/// Plays the cut once, fenced or not, and reads the verdict back.
pub(super) fn play(
    plan: &Plan,
    run: &Run,
    fenced: bool,
    store: &mut Store,
    service: LockService,
) -> Result<RunVerdict> {
    let store_url = run.url(Backend::Postgres);
    let (story, path, server) = match service {
        LockService::Redis => (
            ("cut-off", "cut off from Redis"),
            "A→redis",
            run.url(Backend::Redis),
        ),
        LockService::Etcd => (
            ("cut-off-etcd", "cut off from etcd"),
            "A→etcd",
            run.url(Backend::Etcd),
        ),
    };
    let at = crate::labs::step::network::before_cut(fenced, service == LockService::Etcd);
    let mut scene = Scene::open(plan, run, story, fenced, at, (path, server))?;
    // A's lock goes through the proxy and is renewed; its store connection does not.
    let a_urls = (scene.url_through.as_str(), store_url);
    let a_script = scene.holder(
        "A",
        a_urls,
        true,
        (BeforeWrite::WorkUntilTold, AfterWrite::Release),
    );
    let a = scene.stage.spawn("A", &WorkerSpec::Holder(a_script))?;
    let start = Duration::from_secs(10);
    let stage = &mut scene.stage;
    let a_owner = stage
        .wait_for(start, "A to take the lock", |e| e.is("A", Kind::Acquired))?
        .owner()
        .map(String::from);
    stage.wait_for(start, "A to start working", |e| e.is("A", Kind::Working))?;
    let mut watch = match service {
        LockService::Redis => Watch::Redis(Box::new(RedisLock::new(
            connect::redis(server)?,
            scene.lock_key(),
            plan.ttl,
        ))),
        LockService::Etcd => Watch::Etcd(Box::new(EtcdLock::connect(server, scene.lock_key())?)),
    };
    let (server_name, cut_words, gone_words) = match service {
        LockService::Redis => (
            "redis",
            "the proxy cuts A off from Redis: A's connections reset, new ones refused; A still reaches the store",
            "A's key has expired: no renewal reached Redis, so for Redis the lock is free",
        ),
        LockService::Etcd => (
            "etcd",
            "the proxy cuts A off from etcd: A's connections reset, new ones refused; A still reaches the store",
            "A's lock key is gone: no keepalive reached etcd, so etcd expired A's lease and deleted the key with it",
        ),
    };
    scene.nemesis.net(
        &mut scene.stage,
        &scene.path,
        Direction::Up,
        NetFault::Reset,
        cut_words,
    );
    let b = scene.spawn_b()?;

    // A works on, cut off. The lab watches A's lock on its own connection, which is not cut.
    let mut expired = false;
    let seen = scene.until_b_wrote(&a, |stage| {
        if !expired && watch.holder()? != a_owner {
            expired = true;
            stage.record(Event::new(server_name, Expired::default(), gone_words));
        }
        Ok(())
    })?;
    scene.heal("the cut heals", seen);
    scene.end((a, b), store, true)
}
