//! One run of lab 8's cut: A holds a Redis lock renewed by a heartbeat; the proxy on A's
//! path to Redis cuts it (every connection reset, new ones refused) while A still reaches
//! the store. The heartbeat's renewals fail, the lease runs out in Redis, B takes the lock
//! and writes; the cut heals and A, which never stopped working, writes.

use std::time::Duration;

use anyhow::Result;

use super::Plan;
use super::scene::Scene;
use super::verdict::RunVerdict;
use crate::connect::{self, Backend};
use crate::events::facts::Expired;
use crate::events::{Event, Kind};
use crate::labs::runner::Run;
use crate::lock::redis::RedisLock;
use crate::proxy::{Direction, NetFault};
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite};

/// Plays the cut once, fenced or not, and reads the verdict back.
pub(super) fn play(plan: &Plan, run: &Run, fenced: bool, store: &mut Store) -> Result<RunVerdict> {
    let (redis_url, store_url) = (run.url(Backend::Redis), run.url(Backend::Postgres));
    let at = crate::labs::step::network::before_cut(fenced);
    let story = ("cut-off", "cut off from Redis");
    let mut scene = Scene::open(plan, run, story, fenced, at, ("A→redis", redis_url))?;
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
    let mut watch = RedisLock::new(connect::redis(redis_url)?, scene.lock_key(), plan.ttl);

    scene.nemesis.net(
        &mut scene.stage,
        &scene.path,
        Direction::Up,
        NetFault::Reset,
        "the proxy cuts A off from Redis: A's connections reset, new ones refused; A still reaches the store",
    );
    let b = scene.spawn_b()?;

    // A works on, cut off. The lab watches A's key on its own connection, which is not cut.
    let mut expired = false;
    let seen = scene.until_b_wrote(&a, |stage| {
        if !expired && watch.owner_and_pttl()?.0 != a_owner {
            expired = true;
            stage.record(Event::new(
                "redis",
                Expired::default(),
                "A's key has expired: no renewal reached Redis, so for Redis the lock is free",
            ));
        }
        Ok(())
    })?;
    scene.heal("the cut heals", seen);
    scene.end((a, b), store, true)
}
