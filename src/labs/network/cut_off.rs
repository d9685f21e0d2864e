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
use super::scene::{HOLD_WORDS, Scene, net_step, resets};
use super::verdict::RunVerdict;
use crate::connect::{self, Backend};
use crate::events::facts::Expired;
use crate::events::{Event, Kind};
use crate::labs::faults::{Faults, Until};
use crate::labs::runner::Run;
use crate::lock::etcd::EtcdLock;
use crate::lock::redis::RedisLock;
use crate::nemesis::schedule::{Anchor, How, Point, Schedule};
use crate::nemesis::{Fault, Note};
use crate::proxy::{self, Proxy};
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
    let to_server = Proxy::start(path, proxy::upstream_of(server)?)?;
    let mut scene = Scene::open(plan, run, story, fenced, at, (&to_server, server, &[]))?;
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
    // The cut at once, healed once B has written.
    let schedule = Schedule::done_so(vec![
        net_step(Fault::Cut, path, None, resets()),
        net_step(
            Fault::Heal,
            path,
            Some(Anchor::on("B", Kind::Wrote, 1)),
            How::default(),
        ),
    ]);
    let mut faults = scene.faults(&schedule, &[&to_server], |cue, looks| {
        match cue.action.fault {
            Fault::Cut => Note::from(cut_words),
            _ => looks.healed("the cut heals"),
        }
    });
    scene.play(
        &mut faults,
        Until::acted(Fault::Cut, path, Duration::from_secs(5)),
    )?;
    let b = scene.spawn_b()?;

    // A works on, cut off. The lab watches A's lock on its own connection, which is not cut.
    let gone = (server_name, gone_words);
    play_watching(&mut scene, (&mut faults, &a), &mut watch, a_owner, gone)?;
    scene.end((a, b), store, true)
}

/// Plays the rest of the story's faults (see [`Scene::play_out`]), recording, the first
/// time the lab's own connection finds the lock no longer A's, that the lease is gone.
fn play_watching(
    scene: &mut Scene,
    (faults, a): (&mut Faults, &crate::labs::WorkerHandle),
    watch: &mut Watch,
    a_owner: Option<String>,
    (server_name, gone_words): (&str, &str),
) -> Result<()> {
    let mut expired = false;
    scene.play_out(faults, a, |stage| {
        if !expired && watch.holder()? != a_owner {
            expired = true;
            stage.record(Event::new(server_name, Expired::default(), gone_words));
        }
        Ok(())
    })
}

/// The third row's faults: A's first write held on its way to the store; the cut from
/// Redis once A has sent it; and, once B has written and A's heartbeat has given up, the
/// cut healed first (so that A's release reaches Redis), then the write let go. The write
/// stays held until the heartbeat has given up, so that A's question before its second
/// write comes after the heartbeat's answer.
fn stopping_schedule() -> Schedule {
    let sent = Anchor::on("A", Kind::Checked, 1);
    let both = Anchor::on("A", Kind::Lost, 1).and(Point::on("B", Kind::Wrote, 1));
    Schedule::done_so(vec![
        net_step(Fault::Hold, "A→store", None, How::default()),
        net_step(Fault::Cut, "A→redis", Some(sent), resets()),
        net_step(Fault::Heal, "A→redis", Some(both.clone()), How::default()),
        net_step(Fault::Heal, "A→store", Some(both), How::default()),
    ])
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
    let to_store = Proxy::start("A→store", proxy::upstream_of(store_url)?)?;
    let to_redis = Proxy::start("A→redis", proxy::upstream_of(redis_url)?)?;
    let proxies = (&to_store, store_url, &[&to_redis][..]);
    let mut scene = Scene::open(plan, run, story, fenced, at, proxies)?;
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
    let paths = [&to_store, &to_redis];
    let mut faults = scene.faults(&stopping_schedule(), &paths, |cue, looks| {
        match (cue.action.fault, cue.action.target.as_str()) {
            (Fault::Hold, _) => Note::from(HOLD_WORDS),
            (Fault::Cut, _) => Note::from(
                "the proxy cuts A off from Redis: A's connections reset, new ones refused; A's write is already in flight to the store",
            ),
            (_, "A→redis") => Note::from("the cut heals, after B wrote"),
            _ => looks.healed("the proxy lets A's write go once A's heartbeat has given up"),
        }
    });
    scene.hold_a_write(&mut faults, &mut a)?;
    // A's write is in flight, sent while its heartbeat held the lock: now the cut.
    scene.play(
        &mut faults,
        Until::acted(Fault::Cut, "A→redis", Duration::from_secs(5)),
    )?;
    let b = scene.spawn_b()?;
    let gone_words = "A's key has expired: no renewal reached Redis, so for Redis the lock is free";
    let gone = ("redis", gone_words);
    play_watching(&mut scene, (&mut faults, &a), &mut watch, a_owner, gone)?;
    scene.end((a, b), store, false)
}
