//! A lane: where schedules play side by side, each lane with a Redis of its own (and, for
//! Redlock, five masters), restarted by its own schedules only, through its keeper thread.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

use super::keeper::Keeper;
use super::redlock_lane::Masters;
use crate::connect::Backend;
use crate::nemesis::Victim;
use crate::servers::{Lifetime, PrivateServers};

/// One lane of schedules played side by side: its Redis, restarted by its schedules only
/// (a restart would otherwise land in every history in flight, a fault none of their
/// schedules holds). A given Redis (`--redis-url`) is every lane's, and never restarted.
#[derive(Default)]
pub struct Lane {
    pub redis_url: Option<String>,
    /// Chaos's own Redis, which this lane's schedules may restart.
    pub redis: Option<Arc<Mutex<PrivateServers>>>,
    /// The thread that starts this lane's servers again (see [`super::keeper`]).
    pub keeper: Option<Keeper>,
    /// Redlock's masters, chaos's own (see [`super::redlock_lane`]).
    pub masters: Masters,
}

impl Lane {
    /// A lane on a Redis chaos was given: never restarted.
    pub fn given(url: &str) -> Lane {
        Lane {
            redis_url: Some(url.to_string()),
            ..Lane::default()
        }
    }

    /// A lane with a Redis of its own; call it from a thread that outlives the lane.
    pub fn private_redis() -> Result<Lane> {
        let private = PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun)?;
        let url = private
            .url(Backend::Redis)
            .context("the private Redis has no URL")?;
        Ok(Lane {
            redis_url: Some(url),
            redis: Some(Arc::new(Mutex::new(private))),
            keeper: Some(Keeper::start()?),
            ..Lane::default()
        })
    }

    /// Runs `f` on the lane's Redis from its keeper thread, and waits for its answer.
    fn on_keeper<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut PrivateServers) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let Some(redis) = self.redis.clone() else {
            anyhow::bail!("this lane's Redis is not chaos's own");
        };
        self.keeper()?.run_on(redis, f)
    }

    /// The lane's keeper thread (a lane on a given Redis has none, unless it has masters).
    pub fn keeper(&self) -> Result<&Keeper> {
        self.keeper
            .as_ref()
            .context("this lane has no keeper thread")
    }

    /// The lane's Redis as a schedule's restart aims at it, named `label`.
    pub fn redis_victim(&self, label: &str) -> LaneRedis<'_> {
        LaneRedis {
            lane: self,
            label: label.to_string(),
        }
    }

    fn redis_pid(&self) -> Option<i32> {
        let redis = self.redis.as_ref()?;
        let private = redis.lock().unwrap_or_else(|p| p.into_inner());
        private.pid(Backend::Redis)
    }
}

/// A lane's Redis as the nemesis sees it: killed where it stands, restarted by the keeper.
pub struct LaneRedis<'a> {
    lane: &'a Lane,
    label: String,
}

impl Victim for LaneRedis<'_> {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn pid(&self) -> Option<i32> {
        self.lane.redis_pid()
    }

    fn kill_now(&mut self) {
        if let Some(pid) = self.pid() {
            crate::procs::stop(pid, &crate::procs::StopPlan::kill());
        }
    }

    fn restart_now(&mut self) -> Result<Duration> {
        self.lane
            .on_keeper(|private| private.crash_and_restart(Backend::Redis))
    }
}

/// Sets a lane's Redis to keep its data across a crash, or not: `--appendonly yes
/// --appendfsync always` (Redis appends every write to its append-only file and fsyncs
/// the file each time it appends), or no persistence at all. A change restarts it,
/// empty, before the schedule's clients start: the switch is setup, not a fault of the schedule.
pub fn persist(lane: &Lane, keeps_data: bool) -> Result<()> {
    lane.on_keeper(move |private| super::keeper::set_persistence(private, keeps_data))
}

/// Gives each of `parallel` lanes (more lanes if needed: one Redis given to chaos is every
/// lane's) five masters of its own, and the keeper thread that restarts them. Call it from
/// a thread that outlives the lanes.
pub fn add_masters(lanes: &mut Vec<Lane>, parallel: u32) -> Result<()> {
    while lanes.len() < parallel.max(1) as usize {
        let url = lanes.first().and_then(|l| l.redis_url.clone());
        lanes.push(url.map_or_else(Lane::default, |url| Lane::given(&url)));
    }
    for lane in lanes.iter_mut() {
        if lane.keeper.is_none() {
            lane.keeper = Some(Keeper::start()?);
        }
        lane.masters = Masters::start()?;
    }
    Ok(())
}
