//! What a run leaves on the servers, and its removal: when the run ends, however it ends,
//! and on Ctrl-C, SIGTERM or SIGHUP alike.
//!
//! A whole workshop may share one set of servers, so a run must take its rows, keys, leases
//! and tables with it. Every lab names what it leaves once, with [`Leftovers`], and the same
//! removal runs at the end and from the interrupt handler; a server that stopped answering
//! during the run is skipped rather than waited for again.

mod registry;

use crate::connect;
use crate::procs::{self, InterruptCleanup};
use crate::store::Store;
use registry::{Registry, what_a_run_creates_in_postgres};
pub use registry::{
    challenge_role_of, challenge_schema_of, drop_challenge_role, end_challenge_sessions,
    redlock_sequence_of, sweep_dead_runs,
};

/// The places a run writes to, named by its run id.
#[derive(Clone, Debug, Default)]
pub struct Leftovers {
    run_id: String,
    /// The fenced store: the run's rows in `lockslab_resource` and `lockslab_attempt`.
    store: Option<String>,
    /// Redis: every key `lockslab:<run id>:*`, on each server named (lab 6 writes to several).
    redis: Vec<String>,
    /// etcd: every key under `lockslab:<run id>:`, and the leases they hang on.
    etcd: Option<String>,
    /// Postgres statements that drop what the run created (lab 3's tables).
    sql: Vec<(String, String)>,
}

impl Leftovers {
    pub fn of_run(run_id: &str) -> Leftovers {
        Leftovers {
            run_id: run_id.to_string(),
            ..Leftovers::default()
        }
    }

    pub fn store(mut self, postgres_url: &str) -> Leftovers {
        self.store = Some(postgres_url.to_string());
        self
    }

    pub fn redis(mut self, redis_url: &str) -> Leftovers {
        self.redis.push(redis_url.to_string());
        self
    }

    pub fn etcd(mut self, etcd_url: &str) -> Leftovers {
        self.etcd = Some(etcd_url.to_string());
        self
    }

    /// Runs `statements` on `postgres_url` to remove what the run created there.
    pub fn sql(mut self, postgres_url: &str, statements: &str) -> Leftovers {
        self.sql
            .push((postgres_url.to_string(), statements.to_string()));
        self
    }

    /// Removes them on an interrupt from now on, and when the returned guard is dropped.
    /// First sweeps what dead runs left on these servers, and enters this run among the
    /// live ones (see [`Registry`]).
    pub fn removed_at_the_end(self) -> Removal {
        let registry = Registry::enter(&self);
        let on_interrupt = procs::on_interrupt({
            let leftovers = self.clone();
            move || {
                leftovers.remove();
            }
        });
        Removal {
            leftovers: Some(self),
            registry,
            _on_interrupt: on_interrupt,
        }
    }

    /// The Postgres the run writes to: its store's, or the one its statements run on.
    fn postgres(&self) -> Option<&str> {
        self.store
            .as_deref()
            .or_else(|| self.sql.first().map(|(url, _)| url.as_str()))
    }

    /// What the dead run `run_id` may have left on the servers `self` names, rebuilt from
    /// its id alone. `postgres` is where it was registered, and the registry's schema
    /// there: its tables, sequences and store rows are there (the rows only where the
    /// store's tables exist).
    fn of_dead_run(&self, run_id: &str, postgres: Option<(&str, &str, bool)>) -> Leftovers {
        Leftovers {
            run_id: run_id.to_string(),
            store: postgres
                .filter(|&(_, _, has_store)| has_store)
                .map(|(url, _, _)| url.to_string()),
            redis: self.redis.clone(),
            etcd: self.etcd.clone(),
            sql: postgres
                .map(|(url, schema, _)| {
                    (
                        url.to_string(),
                        what_a_run_creates_in_postgres(run_id, schema),
                    )
                })
                .into_iter()
                .collect(),
        }
    }

    /// Best effort, bounded: each server gets a short cleanup timeout, and one given up on
    /// during the run gets none. Returns one line for each place something was left.
    pub fn remove(&self) -> Vec<String> {
        let mut left = Vec::new();
        let mut note = |what: String, result: anyhow::Result<()>| {
            if let Err(err) = result {
                left.push(format!("{what} are still there: {err:#}"));
            }
        };
        if let Some(url) = &self.store
            && !connect::gave_up_on(url)
        {
            let forget = || Store::connect_for_cleanup(url)?.forget_run(&self.run_id);
            note(
                format!("this run's rows in the store at {}", connect::redact(url)),
                forget(),
            );
        }
        for (url, statements) in &self.sql {
            if !connect::gave_up_on(url) {
                let drop = || -> anyhow::Result<()> {
                    connect::postgres_for_cleanup(url)?.batch_execute(statements)?;
                    Ok(())
                };
                note(
                    format!("this run's tables in Postgres at {}", connect::redact(url)),
                    drop(),
                );
            }
        }
        for url in self.redis.iter().filter(|url| !connect::gave_up_on(url)) {
            note(
                format!(
                    "this run's keys lockslab:{}:* in Redis at {}",
                    self.run_id,
                    connect::redact(url)
                ),
                forget_redis_keys(url, &self.run_id),
            );
        }
        if let Some(url) = &self.etcd
            && !connect::gave_up_on(url)
        {
            note(
                format!(
                    "this run's keys lockslab:{}: in etcd at {}",
                    self.run_id,
                    connect::redact(url)
                ),
                forget_etcd_keys(url, &self.run_id),
            );
        }
        left
    }
}

/// Removes a run's leftovers at [`Removal::now`], or when dropped (an early return).
pub struct Removal {
    leftovers: Option<Leftovers>,
    registry: Option<Registry>,
    _on_interrupt: InterruptCleanup,
}

impl Removal {
    /// Removes them now that the run is over, and — when the run itself went well — says
    /// on stderr what stayed (after a failure, the failure is the one line worth reading).
    /// After an interrupt it leaves them to the handler, which removes them once every
    /// worker is dead: removed any earlier, a worker still running could write them again.
    pub fn now<T>(mut self, run: &anyhow::Result<T>) {
        if procs::interrupted() {
            return;
        }
        if let Some(leftovers) = self.leftovers.take() {
            let left = leftovers.remove();
            // Left something: stays registered (its lock goes with the connection), so
            // that the next run sweeps it.
            if let Some(registry) = self.registry.take()
                && left.is_empty()
            {
                registry.leave(&leftovers.run_id);
            }
            if run.is_ok() {
                for line in left {
                    crate::errln!("lockslab: {line}");
                }
            }
        }
    }
}

impl Drop for Removal {
    fn drop(&mut self) {
        if let Some(leftovers) = self.leftovers.take()
            && !procs::interrupted()
        {
            let left = leftovers.remove();
            if let Some(registry) = self.registry.take()
                && left.is_empty()
            {
                registry.leave(&leftovers.run_id);
            }
        }
    }
}

/// Deletes every Redis key of a run (`lockslab:<run id>:*`). SCAN, not KEYS: on a server a
/// whole workshop shares, KEYS would stall everyone while it walks the keyspace.
fn forget_redis_keys(redis_url: &str, run_id: &str) -> anyhow::Result<()> {
    let mut redis = connect::redis(redis_url)?;
    let keys: Vec<String> =
        redis::Commands::scan_match(&mut *redis, format!("lockslab:{run_id}:*"))?
            .collect::<redis::RedisResult<_>>()?;
    for chunk in keys.chunks(500) {
        redis::cmd("DEL").arg(chunk).query::<i64>(&mut *redis)?;
    }
    Ok(())
}

/// Deletes a run's etcd keys together with the leases they hang on. After a normal run those
/// leases are revoked or expired already; after Ctrl-C a killed worker's lease would live on
/// for its whole TTL, and its key with it.
fn forget_etcd_keys(etcd_url: &str, run_id: &str) -> anyhow::Result<()> {
    connect::etcd_runtime()?.block_on(async {
        let mut client = connect::etcd(etcd_url).await?;
        let prefix = format!("lockslab:{run_id}:");
        let options = etcd_client::GetOptions::new().with_prefix();
        let found = client.get(prefix.as_str(), Some(options)).await?;
        let leases: std::collections::BTreeSet<i64> = found
            .kvs()
            .iter()
            .map(|kv| kv.lease())
            .filter(|&lease| lease != 0)
            .collect();
        for lease in leases {
            // A lease that expired meanwhile is already gone: nothing to report.
            let _ = client.lease_revoke(lease).await;
        }
        let options = etcd_client::DeleteOptions::new().with_prefix();
        client.delete(prefix.as_str(), Some(options)).await?;
        Ok(())
    })
}
