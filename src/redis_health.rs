//! Keys a Redis loses without their TTL, which a lock cannot tell from an expiry.
//!
//! A Redis lock's key may go in ways that are not its TTL running out: Redis evicts it when
//! it is over `maxmemory` and its `maxmemory-policy` is an evicting one (`allkeys-*` evicts
//! any key, `volatile-*` only keys with a TTL — a lock key always has one); a `FLUSHALL` or
//! `FLUSHDB` wipes it; a restart without persistence forgets it. To every client the lock
//! is then simply free, as after an expiry, and the next one takes it. A lab that called
//! that an expiry would state a false verdict, so a lab asks [`KeyLoss::watch`] before it
//! plays (which refuses a Redis that evicts) and [`KeyLoss::check`] before its verdict
//! (which refuses to give one when keys went missing meanwhile, and says how).

use anyhow::{Result, bail};

use crate::connect;

/// What a Redis says about how it loses keys, before and after a run.
#[derive(Clone, Debug, Default)]
struct Counters {
    /// `evicted_keys` (INFO stats): keys evicted since the server started.
    evicted: Option<u64>,
    /// `FLUSHALL` and `FLUSHDB` calls since the server started (INFO commandstats).
    flushes: Option<u64>,
    /// `run_id` (INFO server): a new one means the server restarted.
    run_id: Option<String>,
}

/// A Redis watched for keys lost without their TTL during a lab run.
pub struct KeyLoss {
    url: Option<String>,
    before: Counters,
}

impl KeyLoss {
    /// Refuses a Redis that evicts keys, and notes how many it has lost so far.
    pub fn watch(url: &str) -> Result<KeyLoss> {
        let mut conn = connect::redis(url)?;
        refuse_evicting(&mut conn, url)?;
        Ok(KeyLoss {
            url: Some(url.to_string()),
            before: counters(&mut conn),
        })
    }

    /// No watch: for a Redis the lab restarts on purpose (its own private one).
    pub fn off() -> KeyLoss {
        KeyLoss {
            url: None,
            before: Counters::default(),
        }
    }

    /// Fails, naming the cause, when the Redis lost keys during the run without their TTL:
    /// any "expired" the lab saw may have been that, and its verdict would be false.
    pub fn check(&self) -> Result<()> {
        let Some(url) = &self.url else {
            return Ok(());
        };
        let after = counters(&mut connect::redis(url)?);
        let before = &self.before;
        let mut causes = Vec::new();
        if let (Some(was), Some(now)) = (before.evicted, after.evicted)
            && now > was
        {
            causes.push(format!(
                "it evicted {} key(s) to stay under maxmemory (INFO stats evicted_keys {was} → {now})",
                now - was
            ));
        }
        let restarted =
            matches!((&before.run_id, &after.run_id), (Some(was), Some(now)) if was != now);
        if restarted {
            causes.push(
                "it restarted (INFO server run_id changed): what it had not saved is gone".into(),
            );
        } else if let (Some(was), Some(now)) = (before.flushes, after.flushes)
            && now > was
        {
            causes.push(format!(
                "FLUSHALL or FLUSHDB ran {} time(s) (INFO commandstats)",
                now - was
            ));
        }
        if causes.is_empty() {
            return Ok(());
        }
        bail!(
            "Redis {} lost keys during this run without their TTL: {}. A lock key lost that way \
             looks exactly like an expired lease, so an \"expired\" above may not have been one; \
             the lab gives no verdict. Run it again on a Redis that nothing else fills, flushes \
             or restarts meanwhile (`lockslab up` starts one).",
            connect::redact(url),
            causes.join("; ")
        )
    }
}

/// An evicting `maxmemory-policy` under a `maxmemory` limit is refused before the lab plays.
/// With `maxmemory 0` (no limit, the default on 64-bit systems) nothing is evicted whatever
/// the policy; a limit set during the run is still caught by [`KeyLoss::check`]. A server
/// that will not answer CONFIG GET (a managed Redis, a room's restricted user) is let
/// through: the counters after the run still tell.
fn refuse_evicting(conn: &mut connect::RedisConn, url: &str) -> Result<()> {
    let setting = |conn: &mut connect::RedisConn, name: &str| -> Option<String> {
        let pair: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query(&mut **conn)
            .ok()?;
        pair.get(1).cloned()
    };
    let Some(policy) = setting(conn, "maxmemory-policy") else {
        return Ok(());
    };
    let limit = setting(conn, "maxmemory").and_then(|m| m.parse::<u64>().ok());
    if policy == "noeviction" || limit == Some(0) {
        return Ok(());
    }
    bail!(
        "Redis {} evicts keys when it is full (maxmemory-policy {policy}, maxmemory {}): a lock \
         key it evicts would look like an expired lease, and the lab's verdict would be false. \
         Use a Redis that never evicts: `CONFIG SET maxmemory-policy noeviction` (or \
         `maxmemory-policy noeviction` in redis.conf), or no memory limit (`maxmemory 0`); \
         `lockslab up` starts one.",
        connect::redact(url),
        limit.map_or_else(|| "unknown".to_string(), |bytes| bytes.to_string())
    )
}

/// The counters that move when keys go without their TTL; `None` where the server would
/// not say.
fn counters(conn: &mut connect::RedisConn) -> Counters {
    let mut info = |section: &str| -> String {
        redis::cmd("INFO")
            .arg(section)
            .query::<String>(&mut **conn)
            .unwrap_or_default()
    };
    let (stats, server, commands) = (info("stats"), info("server"), info("commandstats"));
    let field = |text: &str, name: &str| -> Option<String> {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(|value| value.trim().to_string())
    };
    // `cmdstat_flushall:calls=2,usec=…`; a command never called has no line (0 calls).
    let calls = |name: &str| -> u64 {
        field(&commands, name)
            .and_then(|v| v.strip_prefix("calls=")?.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    Counters {
        evicted: field(&stats, "evicted_keys").and_then(|v| v.parse().ok()),
        flushes: (!commands.is_empty())
            .then(|| calls("cmdstat_flushall") + calls("cmdstat_flushdb")),
        run_id: field(&server, "run_id"),
    }
}
