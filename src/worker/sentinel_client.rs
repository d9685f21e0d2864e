//! A client of a replicated Redis lock (lab 5): it asks Sentinel where the primary is,
//! takes the lock there with `SET NX PX` and a fencing token from the source its script
//! names, writes to the fenced store when the lab says `write`, and lets go on `finish`.
//!
//! It never pauses. Whatever goes wrong in lab 5 goes wrong in the lock service: the
//! primary that granted the lock dies before its replica has the key, and the replica that
//! replaces it has never heard of this client.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::await_command;
use crate::cluster;
use crate::connect;
use crate::events::facts::{self, GaveUp, Lost, Observed, Waiting, Wrote};
use crate::events::{Emitter, What};
use crate::lock::redis::{Held, RETRY_EVERY, RedisLock, Release};
use crate::store::{FenceRule, Store};

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct SentinelClient {
    /// Lane name (`A:unfenced`…), also its name in the store.
    pub name: String,
    /// Sentinel addresses (`redis://default:PASSWORD@host:port`), asked in order; the
    /// primary they name is reached with the same password.
    pub sentinels: Vec<String>,
    /// The name the Sentinels know the primary by.
    pub master: String,
    pub key: String,
    pub ttl_ms: u64,
    pub token: TokenSource,
    pub store_url: String,
    pub run_id: String,
    /// The store resources it writes, each under its own fencing rule.
    pub writes: Vec<StoreWrite>,
    /// How long to keep trying for the lock.
    pub wait_ms: u64,
    /// ✅ (as far as it goes) `WAIT 1 <ms>` right after taking the lock: with no replica
    /// confirming the key, the client refuses to act on it. None: it trusts the `OK`.
    #[serde(default)]
    pub confirm_with_wait_ms: Option<u64>,
}

/// Where the fencing token comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum TokenSource {
    /// No token: the store cannot tell holders apart.
    None,
    /// ❌ `INCR` on the lock's own Redis, in the script that takes the lock: it lives
    /// exactly as long as what the primary replicated before it died.
    RedisCounter { key: String },
    /// ✅ `nextval` of a Postgres sequence in the store's own database, drawn once the lock
    /// is held: it survives whatever happens to Redis.
    PostgresSequence { name: String },
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StoreWrite {
    pub resource: String,
    pub rule: Rule,
}

/// The store's fencing rule for a write (see [`FenceRule`]).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Rule {
    /// The store's own rule, `>=`: accept any token not lower than the highest accepted. It
    /// keeps out a lower token; a token drawn twice gets past it.
    NotLower,
    /// ❌ A lesson only: accept a higher token, or the same token from the writer that
    /// holds it. With two holders of one reissued token it refuses whichever writes second,
    /// stale or not: no rule at the store can tell them apart.
    HigherOrSameHolder,
}

impl Rule {
    fn fence_rule(self) -> FenceRule {
        match self {
            Rule::NotLower => FenceRule::NotLower,
            Rule::HigherOrSameHolder => FenceRule::HigherOrSameHolder,
        }
    }
}

/// Asks each Sentinel in turn for the primary's address, as Sentinel clients do.
pub fn primary_from_sentinels(sentinels: &[String], master: &str) -> Result<String> {
    for url in sentinels {
        if let Some(addr) = cluster::master_addr_from(url, master) {
            return Ok(addr);
        }
    }
    bail!(
        "no Sentinel of {} answered with an address for `{master}`",
        sentinels.join(", ")
    )
}

/// The primary's URL: the Sentinels' user and password (the cluster's), at the address
/// they name now.
pub fn primary_url(sentinels: &[String], primary: &str) -> String {
    match sentinels.first().and_then(|url| url.rsplit_once('@')) {
        Some((user, _)) => format!("{user}@{primary}"),
        None => format!("redis://{primary}"),
    }
}

pub fn run(script: &SentinelClient) -> Result<()> {
    let me = Emitter::new(&script.name);
    let primary = primary_from_sentinels(&script.sentinels, &script.master)?;
    let primary_url = primary_url(&script.sentinels, &primary);
    let mut lock = RedisLock::new(
        connect::redis(&primary_url)?,
        &script.key,
        Duration::from_millis(script.ttl_ms),
    );
    let mut store = Store::connect(&script.store_url)?;
    let mut sequences = match script.token {
        TokenSource::PostgresSequence { .. } => Some(connect::postgres(&script.store_url)?),
        _ => None,
    };
    me.send(me.event(
        Waiting {
            pid: Some(std::process::id() as i32),
            primary: Some(primary.clone()),
            ..Waiting::default()
        },
        format!("asks Sentinel: the primary is {primary}; SET NX PX there"),
    ));

    let deadline = Instant::now() + Duration::from_millis(script.wait_ms);
    // One owner value for every try of this acquisition (see `RedisLock::try_acquire_as`).
    let owner = crate::lock::random_owner();
    let held = loop {
        if let Some(held) = take(&mut lock, &owner, &script.token, sequences.as_mut())? {
            break held;
        }
        if Instant::now() >= deadline {
            me.say(GaveUp::default(), "gives up: the lock stayed taken");
            return Ok(());
        }
        std::thread::sleep(RETRY_EVERY);
    };
    let token_text = match (&script.token, held.token) {
        (TokenSource::RedisCounter { .. }, Some(t)) => format!(", token {t} (Redis INCR)"),
        (TokenSource::PostgresSequence { .. }, Some(t)) => {
            format!(", token {t} (Postgres sequence)")
        }
        _ => ", no token".to_string(),
    };
    me.send(me.event(
        facts::Acquired {
            lock: Some(script.key.clone()),
            token: held.token,
            owner: Some(held.owner.clone()),
            primary: Some(primary.clone()),
            ..Default::default()
        },
        format!("{primary} granted the lock{token_text}"),
    ));

    // `WAIT` cannot take the key back from the primary: the lock stays granted there, and
    // the client's only remedy is not to use it.
    let mut refused = false;
    if let Some(timeout_ms) = script.confirm_with_wait_ms {
        let confirmed = lock.wait_for_replicas(1, Duration::from_millis(timeout_ms))?;
        refused = confirmed < 1;
        let replicas_confirmed = Some(confirmed as i64);
        let event = if refused {
            me.event(
                Lost {
                    replicas_confirmed,
                    ..Lost::because("no replica confirmed the lock within the WAIT")
                },
                format!(
                    "WAIT 1 {timeout_ms} answers {confirmed}: no replica has the key; \
                     refuses to write"
                ),
            )
        } else {
            me.event(
                What::WaitAnswered(Observed {
                    replicas_confirmed,
                    ..Observed::default()
                }),
                format!("WAIT 1 {timeout_ms} answers {confirmed}: a replica has the key"),
            )
        };
        me.send(event);
    }

    await_command("write")?;
    for write in script.writes.iter().filter(|_| !refused) {
        let value = format!("{}'s result", script.name);
        let outcome = store.write_under(
            write.rule.fence_rule(),
            &script.run_id,
            &write.resource,
            &script.name,
            &value,
            held.token,
        );
        me.send(me.event(
            Wrote {
                token: held.token,
                resource: Some(write.resource.clone()),
                ..Wrote::new(outcome)
            },
            format!(
                "writes to {}: the store says {}",
                write.resource,
                outcome.as_str()
            ),
        ));
    }

    await_command("finish")?;
    if refused {
        me.send(me.event(
            facts::Released {
                released: Some(false),
                abandoned: Some(true),
                ..Default::default()
            },
            "abandons the lock it never confirmed: wrote nothing, leaves the key to its TTL",
        ));
        return Ok(());
    }
    let (released, found_owner, text) = match lock.release_reporting(&held) {
        Ok(Release::Deleted) => (
            true,
            None,
            "releases: compare-and-delete deleted its key".into(),
        ),
        Ok(Release::HeldBy(owner)) => (
            false,
            Some(owner),
            "tries to release: the key holds another owner".into(),
        ),
        Ok(Release::Gone) => (false, None, "tries to release: its key is not there".into()),
        Err(err) => (
            false,
            None,
            format!(
                "cannot release: {primary}, which granted the lock, no longer answers ({})",
                in_plain_words(&err)
            ),
        ),
    };
    me.send(me.event(
        facts::Released {
            released: Some(released),
            found_owner,
            ..Default::default()
        },
        text,
    ));
    Ok(())
}

/// A client error as a learner reads it: what happened to the connection, not the
/// library's wording (`unexpected end of file`).
fn in_plain_words(err: &anyhow::Error) -> String {
    let raw = err.root_cause().to_string();
    let lower = raw.to_lowercase();
    if lower.contains("end of file") || lower.contains("broken pipe") || lower.contains("reset") {
        "its connection closed: the server is down".into()
    } else if lower.contains("refused") {
        "nothing listens on its port any more".into()
    } else if lower.contains("timed out") || lower.contains("timeout") {
        "no answer in time".into()
    } else {
        raw
    }
}

/// One attempt at the lock, with the token drawn from the script's source.
fn take(
    lock: &mut RedisLock,
    owner: &str,
    token: &TokenSource,
    sequences: Option<&mut connect::PgClient>,
) -> Result<Option<Held>> {
    match token {
        TokenSource::None => lock.try_acquire_as(owner),
        TokenSource::RedisCounter { key } => lock.try_acquire_fenced_as(key, owner),
        TokenSource::PostgresSequence { name } => {
            let Some(mut held) = lock.try_acquire_as(owner)? else {
                return Ok(None);
            };
            let postgres = sequences.context("no Postgres connection for the sequence")?;
            let token: i64 = postgres
                .query_one("SELECT nextval($1::text::regclass)", &[name])
                .context("drawing a token from the Postgres sequence")?
                .get(0);
            held.token = Some(token);
            Ok(Some(held))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_is_spelled_in_json_as_lab_1_spells_it() {
        for rule in [Rule::NotLower, Rule::HigherOrSameHolder] {
            assert_eq!(
                serde_json::to_value(rule).unwrap(),
                serde_json::Value::from(rule.fence_rule().as_str())
            );
        }
    }
}
