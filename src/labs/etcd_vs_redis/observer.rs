//! What lab 4 watches its lanes with: its own connection to each backend, to ask who
//! holds a lock, and the stage's events caught up before the lab records its own.

use std::time::Duration;

use anyhow::{Context, Result};

use super::Service;
use crate::connect;
use crate::labs::Stage;
use crate::lock::etcd::EtcdLock;
use crate::lock::postgres as pg;

/// The lab's own view into the backends, to ask who holds a lock.
pub(super) struct Observer {
    redis: connect::RedisConn,
    etcd: EtcdLock,
    postgres: connect::PgClient,
}

impl Observer {
    /// The lab's own connections, one to each backend the lanes lock on.
    pub(super) fn connect(redis: &str, etcd: &str, postgres: &str) -> Result<Observer> {
        Ok(Observer {
            redis: connect::redis(redis)?,
            etcd: EtcdLock::connect(etcd, "")?,
            postgres: connect::postgres(postgres)?,
        })
    }

    /// Who the backend says holds `lock` now (the same identity the workers report).
    pub(super) fn holder(&mut self, kind: Service, lock: &str) -> Result<Option<String>> {
        Ok(match kind {
            Service::Redis | Service::RedisRenewed => redis::cmd("GET")
                .arg(lock)
                .query(&mut self.redis)
                .context("Redis: GET")?,
            Service::Etcd => self.etcd.holder_of(lock)?.map(|(key, _)| key),
            Service::Postgres => pg::holder_and_waiters(&mut self.postgres, lock)?
                .0
                .map(|pid| pid.to_string()),
        })
    }
}

/// Shows the events that have already arrived, so that what the lab records next comes after them.
///
/// `Stage::next` answers None both when nothing is waiting and when it consumed a worker's
/// end of stream; there is at most one of those per worker (eight per scenario), so nine
/// Nones in a row mean the queue is empty.
pub(super) fn catch_up(stage: &mut Stage) {
    let mut nones = 0;
    while nones < 2 * Service::ALL.len() + 1 {
        match stage.next(Duration::ZERO) {
            Some(_) => nones = 0,
            None => nones += 1,
        }
    }
}
