//! The servers a fault can be aimed at. (A worker is a victim too: see
//! [`crate::labs::WorkerHandle`].)

use std::time::Duration;

use anyhow::Result;

use super::Victim;
use crate::cluster::{EtcdMember, RedisNode, SentinelCluster};
use crate::connect::Backend;
use crate::procs::{self, StopPlan};
use crate::servers::PrivateServers;

/// One of the private servers lockslab started for this run (`redis`, `postgres`…). Only
/// a private server can be restarted: lockslab knows how it was started.
pub struct Server<'a> {
    pub servers: &'a mut PrivateServers,
    pub backend: Backend,
    /// Its name in the history: `redis`, or a Redlock master's `m3`.
    pub label: String,
}

impl<'a> Server<'a> {
    pub fn new(servers: &'a mut PrivateServers, backend: Backend, label: &str) -> Server<'a> {
        Server {
            servers,
            backend,
            label: label.into(),
        }
    }
}

impl Victim for Server<'_> {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn pid(&self) -> Option<i32> {
        self.servers.pid(self.backend)
    }

    fn kill_now(&mut self) {
        if let Some(pid) = self.pid() {
            procs::stop(pid, &StopPlan::kill());
        }
    }

    /// A private Redis has no persistence: it comes back empty.
    fn restart_now(&mut self) -> Result<Duration> {
        self.servers.crash_and_restart(self.backend)
    }
}

/// A node of lab 5's Sentinel-managed Redis (the primary, the replica, a Sentinel).
impl Victim for RedisNode {
    fn label(&self) -> String {
        self.role.to_string()
    }

    fn pid(&self) -> Option<i32> {
        self.pid
    }

    fn kill_now(&mut self) {
        SentinelCluster::kill(self);
    }
}

/// One member of lab 5's etcd cluster.
impl Victim for EtcdMember {
    fn label(&self) -> String {
        self.name.clone()
    }

    fn pid(&self) -> Option<i32> {
        self.pid
    }

    fn kill_now(&mut self) {
        if let Some(pid) = self.pid.take() {
            procs::stop(pid, &StopPlan::kill());
        }
    }
}

/// A Redis on a host of its own ([`crate::hosts`]): a partition cuts it off, a stall
/// freezes it.
impl Victim for crate::hosts::HostedRedis {
    fn label(&self) -> String {
        self.host.clone()
    }

    fn pid(&self) -> Option<i32> {
        crate::hosts::HostedRedis::pid(self)
    }

    fn kill_now(&mut self) {
        crate::hosts::HostedRedis::kill_now(self)
    }
}

/// An etcd member on a host of its own: a partition cuts it off, a stall freezes it.
impl Victim for crate::hosts::HostedMember {
    fn label(&self) -> String {
        self.host.clone()
    }

    fn pid(&self) -> Option<i32> {
        crate::hosts::HostedMember::pid(self)
    }

    fn kill_now(&mut self) {
        crate::hosts::HostedMember::kill_now(self)
    }
}
