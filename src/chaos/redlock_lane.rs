//! Redlock's lanes: five Redis masters of chaos's own per lane, independent processes with
//! no replication (as lab 6 starts them), which the lane's schedules restart one at a time.
//!
//! A restart is one master killed (SIGKILL) and started again on its port: empty, with no
//! persistence (`m3`), or on its append-only file (`m3-aof`). Empty is the case Redlock's
//! "delayed restart" advice is about: a master that forgot a key it granted, back before
//! that key's TTL ran out, may hand the lock to a second client.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};

use super::keeper::Keeper;
use crate::connect::Backend;
use crate::nemesis::Victim;
use crate::nemesis::generate::AOF_SUFFIX;
use crate::servers::{Lifetime, PrivateServers};

/// Masters per lane: lab 6's default, quorum 3.
pub const MASTERS: usize = 5;

/// A lane's Redlock masters (none for the other designs).
#[derive(Default)]
pub struct Masters {
    servers: Vec<Arc<Mutex<PrivateServers>>>,
    /// In the order the algorithm asks them: `m1` first.
    pub urls: Vec<String>,
}

/// A master's name in schedules and timelines: `m1` … `m5`.
pub fn name(i: usize) -> String {
    format!("m{}", i + 1)
}

/// Every master's name, as a restart may aim at it: `m1` … and `m1-aof` ….
pub fn restart_targets() -> Vec<String> {
    (0..MASTERS)
        .flat_map(|i| [name(i), format!("{}{AOF_SUFFIX}", name(i))])
        .collect()
}

impl Masters {
    /// Starts the masters; call it from a thread that outlives the lane (as
    /// [`super::lane::Lane::private_redis`]).
    pub fn start() -> Result<Masters> {
        let mut masters = Masters::default();
        for _ in 0..MASTERS {
            let private = PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun)?;
            let url = private
                .url(Backend::Redis)
                .context("a private Redis master has no URL")?;
            masters.urls.push(url);
            masters.servers.push(Arc::new(Mutex::new(private)));
        }
        Ok(masters)
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// The master a restart's target names (`m3`, `m3-aof`).
    fn index(&self, target: &str) -> Option<usize> {
        let bare = target.strip_suffix(AOF_SUFFIX).unwrap_or(target);
        (0..self.servers.len()).find(|i| name(*i) == bare)
    }

    /// Sets each master's persistence for one schedule, before its clients connect: the
    /// append-only file on for the master a `-aof` restart aims at, off everywhere else.
    /// A change restarts that master, empty: setup, not a fault of the schedule.
    pub fn persist(&self, keeper: &Keeper, restart: Option<&str>) -> Result<()> {
        let keeps = restart
            .filter(|t| t.ends_with(AOF_SUFFIX))
            .and_then(|t| self.index(t));
        for (i, server) in self.servers.iter().enumerate() {
            let want = keeps == Some(i);
            keeper.run_on(server.clone(), move |private| {
                super::keeper::set_persistence(private, want)
            })?;
        }
        Ok(())
    }

    /// The master a restart aims at, as the nemesis sees it.
    pub fn victim<'a>(&self, keeper: &'a Keeper, target: &str) -> Option<MasterVictim<'a>> {
        let i = self.index(target)?;
        Some(MasterVictim {
            keeper,
            server: self.servers[i].clone(),
            label: target.to_string(),
        })
    }
}

/// One master, killed where it stands and started again by the lane's keeper thread.
pub struct MasterVictim<'a> {
    keeper: &'a Keeper,
    server: Arc<Mutex<PrivateServers>>,
    label: String,
}

impl Victim for MasterVictim<'_> {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn pid(&self) -> Option<i32> {
        let private = self.server.lock().unwrap_or_else(|p| p.into_inner());
        private.pid(Backend::Redis)
    }

    fn kill_now(&mut self) {
        if let Some(pid) = self.pid() {
            crate::procs::stop(pid, &crate::procs::StopPlan::kill());
        }
    }

    fn restart_now(&mut self) -> Result<Duration> {
        self.keeper.run_on(self.server.clone(), |private| {
            private.crash_and_restart(Backend::Redis)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_names_a_master_bare_or_with_its_append_only_file() {
        let masters = Masters {
            servers: Vec::new(),
            urls: Vec::new(),
        };
        assert_eq!(masters.index("m1"), None, "no master started");
        let targets = restart_targets();
        assert_eq!(targets.len(), 2 * MASTERS);
        assert_eq!(&targets[..2], ["m1", "m1-aof"]);
    }
}
