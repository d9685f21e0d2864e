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
//!
//! The third row ([`play_stopping`]) gives A the ✅ habit the first two lack: before each
//! write it asks its heartbeat whether it has given the lock up, and stops if so. Its write
//! is sent while the lease is fine, into a hold on A's path to the store; then the cut.
//! The heartbeat gives up, the lease runs out, B writes; the held write still lands. The
//! habit stops A's *next* write, not the one already in flight: it narrows the window and
//! does not close it.

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
use crate::proxy::{self, Direction, NetFault, Proxy};
use crate::store::Store;
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
    let (a, a_owner) = scene.start_a(a_script)?;
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
    let seen = watch_until_b_wrote(
        &mut scene,
        &a,
        &mut watch,
        a_owner,
        (server_name, gone_words),
    )?;
    scene.heal("the cut heals", seen);
    scene.end((a, b), store, true)
}

/// Shows events until B has written (see [`Scene::until_b_wrote`]), recording, the first
/// time the lab's own connection finds the lock no longer A's, that the lease is gone.
fn watch_until_b_wrote(
    scene: &mut Scene,
    a: &crate::labs::WorkerHandle,
    watch: &mut Watch,
    a_owner: Option<String>,
    (server_name, gone_words): (&str, &str),
) -> Result<(bool, u64)> {
    let mut expired = false;
    scene.until_b_wrote(a, |stage| {
        if !expired && watch.holder()? != a_owner {
            expired = true;
            stage.record(Event::new(server_name, Expired::default(), gone_words));
        }
        Ok(())
    })
}

/// The third row: A's renewed Redis lock, and A stops writing once its heartbeat gives the
/// lock up. The lab holds A's first write in flight (proxy on `A→store`), then cuts A off
/// from Redis (a second proxy, on `A→redis`).
pub(super) fn play_stopping(
    plan: &Plan,
    run: &Run,
    fenced: bool,
    store: &mut Store,
) -> Result<RunVerdict> {
    let (redis_url, store_url) = (run.url(Backend::Redis), run.url(Backend::Postgres));
    let at = crate::labs::step::network::before_cut_stops(fenced);
    let story = ("cut-off-stops", "cut off from Redis, a holder that stops");
    let mut scene = Scene::open(plan, run, story, fenced, at, ("A→store", store_url))?;
    let to_redis = Proxy::start("A→redis", proxy::upstream_of(redis_url)?)?;
    let redis_through = proxy::through(redis_url, to_redis.addr())?;
    let a_script = scene.holder(
        "A",
        (redis_through.as_str(), scene.url_through.as_str()),
        true,
        (
            BeforeWrite::WorkUntilToldStopIfHeartbeatGaveUp,
            AfterWrite::Release,
        ),
    );
    let (mut a, a_owner) = scene.start_a(a_script)?;
    let mut watch = Watch::Redis(Box::new(RedisLock::new(
        connect::redis(redis_url)?,
        scene.lock_key(),
        plan.ttl,
    )));
    scene.hold_a_write(&mut a)?;
    // A's write is in flight, sent while its heartbeat held the lock: now the cut.
    scene.nemesis.net(
        &mut scene.stage,
        &to_redis,
        Direction::Up,
        NetFault::Reset,
        "the proxy cuts A off from Redis: A's connections reset, new ones refused; A's write is already in flight to the store",
    );
    let b = scene.spawn_b()?;
    let gone_words = "A's key has expired: no renewal reached Redis, so for Redis the lock is free";
    let seen = watch_until_b_wrote(&mut scene, &a, &mut watch, a_owner, ("redis", gone_words))?;
    // The write stays held until A's heartbeat has given up as well, so that A's question
    // before its second write comes after the heartbeat's answer.
    let wait = plan.ttl + Duration::from_secs(10);
    scene
        .stage
        .wait_for(wait, "A's heartbeat to give up", |e| e.is("A", Kind::Lost))?;
    // The cut heals first, so that A's release reaches Redis; then A's write goes on.
    scene.nemesis.heal_net(
        &mut scene.stage,
        &to_redis,
        Direction::Up,
        "the cut heals, after B wrote",
    );
    scene.heal(
        "the proxy lets A's write go once A's heartbeat has given up",
        seen,
    );
    scene.end((a, b), store, false)
}
