//! A lock server's clock jumping forward under a client's lock — SIMULATED (redis-server
//! hangs at start under libfaketime): Redis keeps each key's expiry as a time on its own
//! wall clock, so a jump of `J` ms is each key's TTL cut by `J`
//! ([`Nemesis::jump_server_clock`]).
//!
//! ```text
//!  A: acquired r1 ──3ms──▶ nemesis: PTTL of A's key on m3: 795ms; records "m3's clock
//!                          jumps 800ms ahead under A's lock of r1 — simulated: the key's
//!                          TTL cut, as if the server's clock jumped"; A's key, and the
//!                          run's other lock keys there, expire
//! ```
//!
//! A jump is a `clock_step` aimed at a server, timed from a grant (`after` a client's
//! `acquired`): the player's [`ServerClocks`] watch every grant of the run, and the jump
//! plays only if the key of the grant it is aimed at is still its holder's (else the
//! step did not play, and says why). As a real jump expires every key on the server, it
//! also cuts the lock each client last reported taking there — but no key of another run.

use std::collections::HashMap;

use super::clock::Jump;
use super::schedule::Step;
use super::{Nemesis, Note, Record};
use crate::connect::RedisConn;
use crate::events::facts::FaultFacts;
use crate::events::{Event, What};

/// One grant of a lock, as its `acquired` told it.
#[derive(Clone, Debug)]
struct Grant {
    key: String,
    /// The value its holder wrote into the key: whose the key still is.
    owner: Option<String>,
    /// When, on the floor's clock.
    t_ms: u64,
    /// Its client's how-manieth.
    nth: u32,
}

/// The Redis servers whose clocks a play may jump, and the grants it has seen.
#[derive(Default)]
pub struct ServerClocks {
    /// Each server, by name (`redis`, `m3`): its URL, and a connection made before the
    /// clients work (making one takes tens of milliseconds on a busy machine, long enough
    /// for a client to let go of the lock the jump is aimed at).
    servers: HashMap<String, (String, Option<RedisConn>)>,
    /// Each grant, by its client and number (`A`'s 2nd): the one a jump aimed at it cuts.
    grants: HashMap<(String, u32), Grant>,
    /// Each client's last grant: the run's other locks, which a jump cuts too.
    last: HashMap<String, Grant>,
    /// Each lock key a jump expired, by server: the step that did (its place).
    expired_by: HashMap<(String, String), usize>,
}

/// The record a lock key is for (`…:r1`: `r1`).
fn record_of(key: &str) -> &str {
    key.rsplit(':').next().unwrap_or(key)
}

/// What else a jump expired, by record: ` (and r0's lock with it)`.
fn with_it(keys: &[String], pttl_before_ms: &[i64]) -> String {
    let others: Vec<&str> = (keys.iter().zip(pttl_before_ms).skip(1))
        .filter(|(_, left)| **left >= 0)
        .map(|(key, _)| record_of(key))
        .collect();
    match others.as_slice() {
        [] => String::new(),
        [one] => format!(" (and {one}'s lock with it)"),
        many => format!(" (and the locks of {} with it)", many.join(", ")),
    }
}

impl ServerClocks {
    /// A server whose clock may jump, by its name in the history, its URL, and a connection
    /// to it made now.
    pub fn add(&mut self, name: &str, url: &str, connection: RedisConn) {
        let entry = (url.to_string(), Some(connection));
        self.servers.insert(name.into(), entry);
    }

    pub fn has(&self, name: &str) -> bool {
        self.servers.contains_key(name)
    }

    /// Shows the clocks one event of the run: a grant is remembered.
    pub fn see(&mut self, event: &Event) {
        if self.servers.is_empty() {
            return;
        }
        if let What::Acquired(acquired) = &event.what
            && let Some(key) = &acquired.lock
        {
            let grant = Grant {
                key: key.clone(),
                owner: acquired.owner.clone(),
                t_ms: event.t_ms,
                nth: self.last.get(&event.worker).map_or(0, |g| g.nth) + 1,
            };
            (self.grants).insert((event.worker.clone(), grant.nth), grant.clone());
            self.last.insert(event.worker.clone(), grant);
        }
    }

    /// Jumps the clock of `step`'s server (`index`: its place) by `by_ms`, under the grant
    /// its anchor names; Err: why it did not play.
    pub fn jump(
        &mut self,
        (nemesis, history, now_ms): (&mut Nemesis, &mut impl Record, u64),
        (index, step): (usize, &Step),
        by_ms: u64,
    ) -> Result<(), String> {
        let target = step.target.clone();
        let (holder, nth) = (step.after.as_ref()).map_or(("", 0), |a| (a.worker.as_str(), a.nth));
        let grant = (self.grants.get(&(holder.to_string(), nth)))
            .ok_or_else(|| format!("{holder}'s grant #{nth} was never seen"))?
            .clone();
        let late = now_ms.saturating_sub(grant.t_ms);
        let record = record_of(&grant.key).to_string();
        // The grant's key first (the step's own), then the run's other lock keys: a jump of
        // the server's clock expires every key there, not just the one it was aimed at.
        let mut keys = vec![grant.key.clone()];
        for other in self.last.values() {
            if !keys.contains(&other.key) {
                keys.push(other.key.clone());
            }
        }
        let words = |jump: &Jump| {
            let left = jump.pttl_before_ms[0].max(0) as u64;
            let after = match left.checked_sub(by_ms) {
                Some(ms) if ms > 0 => format!("{ms}ms"),
                _ => "expired".into(),
            };
            Note::new(
                format!(
                    "{target}'s clock jumps {by_ms}ms ahead under {holder}'s lock of {record} \
                     — simulated: the key's TTL cut, as if the server's clock jumped: \
                     {left}ms left → {after}{}",
                    with_it(&keys, &jump.pttl_before_ms)
                ),
                FaultFacts {
                    backend: Some("redis".into()),
                    master: target.starts_with('m').then(|| target.to_string()),
                    ..FaultFacts::default()
                },
            )
        };
        let (url, connected) =
            (self.servers.get_mut(&target)).ok_or_else(|| format!("this run has no {target}"))?;
        // Taken: a connection that fails is made again for the next jump (a restart).
        let mut server = match connected.take() {
            Some(server) => server,
            None => crate::connect::redis(url)
                .map_err(|err| format!("{target} did not answer ({})", err.root_cause()))?,
        };
        let owner = grant.owner.as_deref();
        let jump = nemesis
            .jump_server_clock(history, &mut server, &target, &keys, owner, by_ms, words)
            .map_err(|err| format!("{target} did not answer ({})", err.root_cause()))?;
        if let Some((_, connected)) = self.servers.get_mut(&target) {
            *connected = Some(server);
        }
        if jump.found_its_key() {
            for (key, left) in keys.iter().zip(&jump.pttl_before_ms) {
                if *left >= 0 && *left as u64 <= by_ms {
                    self.expired_by.insert((target.clone(), key.clone()), index);
                }
            }
            return Ok(());
        }
        let why = match self.expired_by.get(&(target.clone(), grant.key.clone())) {
            _ if jump.pttl_before_ms[0] >= 0 => {
                "another client had taken it since (let go, or expired)".to_string()
            }
            Some(earlier) if *earlier != index => {
                format!("step {}'s jump had expired it already", earlier + 1)
            }
            _ if target.starts_with('m') => {
                "let go, expired, or never granted there (Redlock needs only a majority)".into()
            }
            _ => "let go, or expired".into(),
        };
        Err(format!(
            "{holder}'s lock of {record} (grant #{nth}) was not on {target} when its clock was \
             to jump, {late}ms after the grant — {why}: nothing to expire"
        ))
    }
}
