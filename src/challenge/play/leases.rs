//! The clients' locks as Redis and etcd hold them, read by lockslab with its own logins: every
//! key under the run's prefix (`lockslab:<run>:`), its value, and how long it has to live (a
//! Redis key's `PTTL`, the TTL of the etcd lease it is attached to).
//!
//! Which key is a client's lock? The servers do not say whose a key is, so lockslab compares
//! what it sees at three moments of the client's job: when the job is handed out, when the
//! client says `acquired`, and when the fault begins. Its lock is a key that was not there
//! (or held another value) when the job went out, was there when the client said
//! `acquired`, and is still there, unchanged, when the fault lands:
//!
//! ```text
//!              job sent          acquired          pause
//!  lock:r0     —                 "9f3c…" 5.0s      "9f3c…" 4.9s   ← set for this job: c1's
//!  lock:r1     "77aa…" 0.4s      "77aa…" 0.4s      —              ← someone else's, let go
//!  token       41                42                42             ← no expiry: a counter
//! ```
//!
//! A key with an expiry is a lease; a counter has none, so keys with an expiry are preferred.
//! Of several, the ones whose name carries the record (`lock:r0` for a job on r0); and of an
//! etcd queue's keys under one name (`lock/r0/<lease>`), the first in line — the lowest create
//! revision holds, the others wait.

use std::collections::BTreeMap;

use anyhow::{Context, Result};

/// One key under the run's prefix, as its server holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Held {
    /// `Redis` or `etcd`.
    pub(super) server: &'static str,
    /// What tells one holder's key from the next: its value (Redis); the revision that last
    /// wrote it and its lease (etcd).
    pub(super) version: String,
    /// How long it has to live (ms); none: it has no expiry.
    pub(super) ttl_ms: Option<i64>,
    /// etcd: the revision that created it (the queue's order); 0 on Redis.
    pub(super) created: i64,
}

/// Every key under the run's prefix, by name.
pub(super) type Keys = BTreeMap<String, Held>;

impl Held {
    /// The same holder's key: written by the same hand, not by a later one.
    fn same(&self, other: &Held) -> bool {
        self.server == other.server && self.version == other.version
    }

    /// Its time to live in words: `4.2s to live`, or `no expiry`.
    pub(super) fn left(&self) -> String {
        match self.ttl_ms {
            Some(ms) => format!("{:.1}s to live", ms.max(0) as f64 / 1000.0),
            None => "no expiry".into(),
        }
    }
}

/// Does `key` name `record`: is the record one of its parts between separators?
fn names(key: &str, record: &str) -> bool {
    key.split(|c: char| !c.is_ascii_alphanumeric())
        .any(|part| part == record)
}

/// The keys of `now` that are the client's lock on `record`: set since its job was handed out
/// (`given`: absent then, or held another value, or set again with a fresh expiry), held
/// unchanged since its `acquired` note (when it sent one), preferring keys with an expiry,
/// then those naming the record, then the first in line of an etcd queue. A key with no
/// expiry counts only if it was created for this job (a counter was there already). A key
/// that names another of the run's records (`others`) and not this one is never its lock:
/// another client's key (or a counter) on that record, made meanwhile.
pub(super) fn its_lock(
    (record, others): (&str, &[String]),
    given: &Keys,
    acquired: Option<&Keys>,
    now: &Keys,
) -> Vec<String> {
    let set_for_the_job = |name: &String, held: &Held| match given.get(name) {
        None => true,
        Some(before) if !before.same(held) => held.ttl_ms.is_some(),
        Some(before) => held.ttl_ms > before.ttl_ms,
    };
    let since_acquired = |name: &String, held: &Held| {
        acquired.is_none_or(|keys| keys.get(name).is_some_and(|then| then.same(held)))
    };
    let another_records =
        |name: &String| !names(name, record) && others.iter().any(|other| names(name, other));
    let mut found: Vec<(&String, &Held)> = (now.iter())
        .filter(|(name, held)| set_for_the_job(name, held) && since_acquired(name, held))
        .filter(|(name, _)| !another_records(name))
        .collect();
    if found.iter().any(|(_, held)| held.ttl_ms.is_some()) {
        found.retain(|(_, held)| held.ttl_ms.is_some());
    }
    if found.iter().any(|(name, _)| names(name, record)) {
        found.retain(|(name, _)| names(name, record));
    }
    // An etcd queue: under one name, the lowest create revision holds the lock.
    let parent = |name: &str| name.rsplit_once('/').map(|(p, _)| p.to_string());
    let first_in_line = |name: &String, held: &Held| {
        held.server != "etcd"
            || parent(name).is_none()
            || !found.iter().any(|(other, them)| {
                them.server == "etcd"
                    && parent(other) == parent(name)
                    && them.created < held.created
            })
    };
    (found.iter())
        .filter(|(name, held)| first_in_line(name, held))
        .map(|(name, _)| (*name).clone())
        .collect()
}

/// lockslab's own way into the run's Redis and etcd, to read the clients' keys.
pub(super) struct Servers {
    prefix: String,
    redis: Option<crate::connect::RedisConn>,
    etcd: Option<(tokio::runtime::Runtime, etcd_client::Client)>,
}

impl Servers {
    /// Connects with lockslab's logins; a server it cannot reach is left out (its keys are
    /// not read, and no fault waits for them).
    pub(super) fn connect(redis: &str, etcd: &str, prefix: &str) -> Servers {
        let etcd = crate::connect::etcd_runtime().ok().and_then(|runtime| {
            let client = runtime.block_on(crate::connect::etcd(etcd)).ok()?;
            Some((runtime, client))
        });
        Servers {
            prefix: prefix.to_string(),
            redis: crate::connect::redis(redis).ok(),
            etcd,
        }
    }

    /// Every key under the run's prefix, on both servers.
    pub(super) fn all(&mut self) -> Result<Keys> {
        let mut keys = self.redis_keys(None)?;
        keys.extend(self.etcd_keys()?);
        Ok(keys)
    }

    /// The keys named, as they are now (a key gone is left out).
    pub(super) fn these(&mut self, names: &[String]) -> Result<Keys> {
        let mut keys = self.redis_keys(Some(names))?;
        if names.iter().any(|name| !keys.contains_key(name)) {
            let etcd = self.etcd_keys()?;
            keys.extend(etcd.into_iter().filter(|(name, _)| names.contains(name)));
        }
        Ok(keys)
    }

    /// Redis's keys under the prefix (or those named): string values with their `PTTL`; a
    /// key of another type is known by its type alone.
    fn redis_keys(&mut self, only: Option<&[String]>) -> Result<Keys> {
        let Some(redis) = self.redis.as_mut() else {
            return Ok(Keys::new());
        };
        let names: Vec<String> = match only {
            Some(names) => names.to_vec(),
            None => {
                redis::Commands::scan_match::<_, String>(&mut **redis, format!("{}*", self.prefix))
                    .context("Redis: SCAN of the run's keys")?
                    .collect::<Result<_, _>>()
                    .context("Redis: SCAN of the run's keys")?
            }
        };
        if names.is_empty() {
            return Ok(Keys::new());
        }
        let mut pipe = redis::pipe();
        for name in &names {
            pipe.cmd("TYPE").arg(name);
        }
        for name in &names {
            pipe.cmd("PTTL").arg(name);
        }
        let answers: Vec<redis::Value> = pipe
            .query(&mut **redis)
            .context("Redis: TYPE and PTTL of the run's keys")?;
        let (types, pttls) = answers.split_at(names.len().min(answers.len()));
        let found: Vec<(String, i64)> = (types.iter().zip(pttls))
            .map(|(kind, pttl)| {
                let kind = redis::from_redis_value_ref::<String>(kind).unwrap_or_default();
                (kind, redis::from_redis_value_ref::<i64>(pttl).unwrap_or(-2))
            })
            .collect();
        let strings: Vec<&String> = (names.iter().zip(&found))
            .filter(|(_, (kind, _))| kind == "string")
            .map(|(name, _)| name)
            .collect();
        let mut values: Vec<Option<Vec<u8>>> = Vec::new();
        if !strings.is_empty() {
            let mut pipe = redis::pipe();
            for name in &strings {
                pipe.cmd("GET").arg(*name);
            }
            values = pipe
                .query(&mut **redis)
                .context("Redis: GET of the run's keys")?;
        }
        let mut values = strings.into_iter().zip(values).collect::<BTreeMap<_, _>>();
        let mut keys = Keys::new();
        for (name, (kind, pttl)) in names.iter().zip(found) {
            // PTTL: -2 gone, -1 no expiry.
            if kind == "none" || pttl == -2 {
                continue;
            }
            let version = match values.remove(name).flatten() {
                Some(value) => String::from_utf8_lossy(&value).into_owned(),
                None => format!("({kind})"),
            };
            keys.insert(
                name.clone(),
                Held {
                    server: "Redis",
                    version,
                    ttl_ms: (pttl >= 0).then_some(pttl),
                    created: 0,
                },
            );
        }
        Ok(keys)
    }

    /// etcd's keys under the prefix, each with the remaining TTL of its lease (whole seconds,
    /// as etcd answers: a lease with 0.9s left reads 0s).
    fn etcd_keys(&mut self) -> Result<Keys> {
        let Some((runtime, client)) = self.etcd.as_mut() else {
            return Ok(Keys::new());
        };
        let prefix = self.prefix.clone();
        runtime.block_on(async {
            let options = etcd_client::GetOptions::new().with_prefix();
            let found = client
                .get(prefix, Some(options))
                .await
                .context("etcd: the run's keys")?;
            let mut ttls: BTreeMap<i64, i64> = BTreeMap::new();
            let mut keys = Keys::new();
            for kv in found.kvs() {
                let lease = kv.lease();
                let ttl_ms = if lease == 0 {
                    None
                } else {
                    let ttl = match ttls.get(&lease) {
                        Some(&ttl) => ttl,
                        None => {
                            let answer = client.lease_time_to_live(lease, None).await;
                            let ttl = answer.context("etcd: a lease's time to live")?.ttl();
                            *ttls.entry(lease).or_insert(ttl)
                        }
                    };
                    if ttl < 0 {
                        continue; // expired: the key goes with it
                    }
                    Some(ttl * 1000)
                };
                keys.insert(
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    Held {
                        server: "etcd",
                        version: format!("rev {} lease {lease:x}", kv.mod_revision()),
                        ttl_ms,
                        created: kv.create_revision(),
                    },
                );
            }
            Ok(keys)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis(value: &str, ttl_ms: Option<i64>) -> Held {
        Held {
            server: "Redis",
            version: value.into(),
            ttl_ms,
            created: 0,
        }
    }

    fn etcd(revision: i64, ttl_ms: i64) -> Held {
        Held {
            server: "etcd",
            version: format!("rev {revision}"),
            ttl_ms: Some(ttl_ms),
            created: revision,
        }
    }

    fn keys(list: &[(&str, Held)]) -> Keys {
        list.iter()
            .map(|(name, held)| (name.to_string(), held.clone()))
            .collect()
    }

    /// The table of the module's doc: the key set for the job and held since `acquired` is
    /// the lock; another client's lock let go meanwhile, and a counter, are not.
    #[test]
    fn the_lock_is_the_key_set_for_the_job_and_held_since_acquired() {
        let given = keys(&[
            ("p:lock:r1", redis("77aa", Some(400))),
            ("p:token", redis("41", None)),
        ]);
        let acquired = keys(&[
            ("p:lock:r0", redis("9f3c", Some(5000))),
            ("p:lock:r1", redis("77aa", Some(390))),
            ("p:token", redis("42", None)),
        ]);
        let now = keys(&[
            ("p:lock:r0", redis("9f3c", Some(4900))),
            ("p:token", redis("42", None)),
        ]);
        assert_eq!(
            its_lock(("r0", &others()), &given, Some(&acquired), &now),
            ["p:lock:r0"]
        );
        // Another client's key taken after the `acquired` note, on the other record: not it.
        let mut later = now.clone();
        later.insert("p:lock:r1".into(), redis("c3c3", Some(500)));
        assert_eq!(
            its_lock(("r0", &others()), &given, Some(&acquired), &later),
            ["p:lock:r0"]
        );
        // Without notes: whatever was set since the job went out, the record's name first.
        assert_eq!(
            its_lock(("r0", &others()), &given, None, &later),
            ["p:lock:r0"]
        );
        // Set again with the same value (a client that names itself): its fresh expiry says so.
        let again = keys(&[("p:lock", redis("c1", Some(100)))]);
        let now = keys(&[("p:lock", redis("c1", Some(4900)))]);
        assert_eq!(its_lock(("r0", &others()), &again, None, &now), ["p:lock"]);
        // A key with no expiry is a lock only if it was created for the job: a counter that
        // went up is not.
        let given = keys(&[("p:token", redis("41", None))]);
        let now = keys(&[
            ("p:token", redis("42", None)),
            ("p:held", redis("c1", None)),
        ]);
        assert_eq!(its_lock(("r0", &others()), &given, None, &now), ["p:held"]);
        // Gone, or taken by someone else since its `acquired`: no lock of its.
        let acquired = keys(&[("p:lock:r0", redis("9f3c", Some(500)))]);
        let now = keys(&[("p:lock:r0", redis("0b0b", Some(500)))]);
        assert!(its_lock(("r0", &others()), &Keys::new(), Some(&acquired), &now).is_empty());
        // A counter of the other record's, made meanwhile (by any client): not r0's lock.
        let now = keys(&[("p:token:r1", redis("1", None))]);
        assert!(its_lock(("r0", &others()), &Keys::new(), None, &now).is_empty());
    }

    /// The run's records, as a run has them.
    fn others() -> Vec<String> {
        vec!["r0".into(), "r1".into()]
    }

    /// etcd's lock recipe: every contender puts a key under the lock's name with its own
    /// lease; the lowest create revision holds, the others wait in line.
    #[test]
    fn of_an_etcd_queue_the_lock_is_the_first_in_line() {
        let now = keys(&[
            ("p/lock/r0/694d1", etcd(12, 2000)),
            ("p/lock/r0/694d7", etcd(15, 2000)),
        ]);
        assert_eq!(
            its_lock(("r0", &others()), &Keys::new(), Some(&now), &now),
            ["p/lock/r0/694d1"]
        );
        assert!(names("p/lock/r0/694d1", "r0") && !names("p:lock:r01", "r0"));
    }
}
