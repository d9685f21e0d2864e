//! A keeper: the thread that starts a lane's private servers again when a schedule
//! restarts one, and sets their persistence before a schedule plays.
//!
//! A child dies with the *thread* that spawned it (`PR_SET_PDEATHSIG`, see
//! [`crate::procs`]), and the threads that play schedules end with each batch: a Redis they
//! restarted would die with them, under the next cell's clients. A keeper lives as long as
//! its lane, so what it starts does too.

use std::sync::{Arc, Mutex, mpsc};

use anyhow::{Context, Result};

use crate::connect::Backend;
use crate::servers::PrivateServers;

/// One piece of work for the keeper thread.
type Job = Box<dyn FnOnce() + Send>;

/// The keeper thread of one lane, reached through its queue of jobs.
pub struct Keeper(mpsc::Sender<Job>);

impl Keeper {
    /// Starts a keeper thread; call it from a thread that outlives the lane.
    pub fn start() -> Result<Keeper> {
        let (keeper, jobs) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("chaos-lane-keeper".into())
            .spawn(move || jobs.into_iter().for_each(|job| job()))?;
        Ok(Keeper(keeper))
    }

    /// Runs `f` on `server` from the keeper thread, and waits for its answer.
    pub fn run_on<T: Send + 'static>(
        &self,
        server: Arc<Mutex<PrivateServers>>,
        f: impl FnOnce(&mut PrivateServers) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let (answer, answered) = mpsc::channel();
        self.0
            .send(Box::new(move || {
                let mut private = server.lock().unwrap_or_else(|p| p.into_inner());
                let _ = answer.send(f(&mut private));
            }))
            .map_err(|_| anyhow::anyhow!("the lane's keeper thread is gone"))?;
        answered
            .recv()
            .map_err(|_| anyhow::anyhow!("the lane's keeper thread is gone"))?
    }
}

/// Turns a private Redis's append-only file on or off, restarting it if that changes.
pub fn set_persistence(private: &mut PrivateServers, keeps_data: bool) -> Result<()> {
    if private.redis_aof() != keeps_data {
        private.set_redis_aof(keeps_data);
        private
            .crash_and_restart(Backend::Redis)
            .context("restarting a private Redis with its new persistence")?;
    }
    Ok(())
}
