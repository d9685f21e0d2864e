//! Probes: a schedule's questions to a backend, asked at a moment of the run, whose
//! answers go into the history as observations ([`What::Probed`]) — the servers' own word,
//! beside the workers' events and the faults, for a checker to read.
//!
//! | ask             | backend  | asks                                             |
//! |-----------------|----------|--------------------------------------------------|
//! | `pttl`          | Redis    | a key's value (its owner) and PTTL               |
//! | `lease_ttl`     | etcd     | a lease's TTL left (whole seconds, rounded down) |
//! | `blocking_pids` | Postgres | the sessions a session waits behind              |

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::events::facts::Probed;
use crate::events::{Event, What};

/// The sessions that hold, granted, a lock that session `waiter.pid` waits for.
/// `pg_blocking_pids` alone also names "soft" blockers: sessions merely queued ahead for the
/// same lock, which hold nothing — a frozen client waiting in that queue would be credited
/// with holding the others off. A blocker here must hold the very lock the waiter asks for.
pub const HARD_BLOCKERS: &str = "
    ARRAY(SELECT DISTINCT held.pid
            FROM pg_locks wanted
            JOIN pg_locks held
              ON held.granted AND held.pid <> wanted.pid
             AND held.locktype = wanted.locktype
             AND held.database IS NOT DISTINCT FROM wanted.database
             AND held.relation IS NOT DISTINCT FROM wanted.relation
             AND held.page IS NOT DISTINCT FROM wanted.page
             AND held.tuple IS NOT DISTINCT FROM wanted.tuple
             AND held.virtualxid IS NOT DISTINCT FROM wanted.virtualxid
             AND held.transactionid IS NOT DISTINCT FROM wanted.transactionid
             AND held.classid IS NOT DISTINCT FROM wanted.classid
             AND held.objid IS NOT DISTINCT FROM wanted.objid
             AND held.objsubid IS NOT DISTINCT FROM wanted.objsubid
           WHERE wanted.pid = waiter.pid AND NOT wanted.granted
             AND held.pid = ANY(pg_blocking_pids(waiter.pid)))";

/// What a probe asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "ask", rename_all = "snake_case", deny_unknown_fields)]
pub enum Question {
    /// A Redis key's value and PTTL (ms; -2: no such key, -1: no TTL).
    Pttl { key: String },
    /// An etcd lease's TTL left, in whole seconds (-1: expired or unknown).
    LeaseTtl { lease: i64 },
    /// The Postgres sessions that the session named `application_name` waits behind: those
    /// holding the lock it asks for ([`HARD_BLOCKERS`], from `pg_blocking_pids`).
    BlockingPids { application_name: String },
}

impl Question {
    /// The history's name for the question.
    pub fn name(&self) -> &'static str {
        match self {
            Question::Pttl { .. } => "pttl",
            Question::LeaseTtl { .. } => "lease_ttl",
            Question::BlockingPids { .. } => "blocking_pids",
        }
    }

    /// The question in a few words, for the timeline.
    pub fn words(&self) -> String {
        match self {
            Question::Pttl { key } => format!("PTTL of {key}"),
            Question::LeaseTtl { lease } => format!("TTL of lease {lease:x}"),
            Question::BlockingPids { application_name } => {
                format!("whom {application_name}'s session waits behind")
            }
        }
    }
}

/// A backend a probe can be aimed at: it answers the questions it knows.
pub trait Ask {
    /// Its name in the history (`redis`, `etcd`, `postgres`).
    fn label(&self) -> String;
    /// The answer to `question`, as the facts of an observation; an error for a question
    /// this backend does not answer, or when it did not answer.
    fn ask(&mut self, question: &Question) -> Result<Probed>;
}

/// A Redis server, by a connection of the probe's own.
pub struct RedisProbe {
    pub label: String,
    pub connection: crate::connect::RedisConn,
}

impl Ask for RedisProbe {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn ask(&mut self, question: &Question) -> Result<Probed> {
        let Question::Pttl { key } = question else {
            anyhow::bail!("{} answers pttl, not {}", self.label, question.name());
        };
        let (owner, pttl_ms): (Option<String>, i64) = redis::pipe()
            .cmd("GET")
            .arg(key)
            .cmd("PTTL")
            .arg(key)
            .query(&mut *self.connection)
            .with_context(|| format!("{}: PTTL of {key}", self.label))?;
        Ok(Probed {
            key: Some(key.clone()),
            owner,
            pttl_ms: Some(pttl_ms),
            ..Probed::default()
        })
    }
}

/// An etcd cluster, by a client of the probe's own.
pub struct EtcdProbe {
    pub label: String,
    pub client: crate::lock::etcd::EtcdLock,
}

impl Ask for EtcdProbe {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn ask(&mut self, question: &Question) -> Result<Probed> {
        let Question::LeaseTtl { lease } = question else {
            anyhow::bail!("{} answers lease_ttl, not {}", self.label, question.name());
        };
        Ok(Probed {
            lease: Some(*lease),
            ttl_s: Some(self.client.lease_ttl(*lease)?),
            ..Probed::default()
        })
    }
}

/// A Postgres server, by a session of the probe's own.
pub struct PostgresProbe {
    pub label: String,
    pub client: crate::connect::PgClient,
}

impl Ask for PostgresProbe {
    fn label(&self) -> String {
        self.label.clone()
    }

    fn ask(&mut self, question: &Question) -> Result<Probed> {
        let Question::BlockingPids { application_name } = question else {
            anyhow::bail!(
                "{} answers blocking_pids, not {}",
                self.label,
                question.name()
            );
        };
        let row = self
            .client
            .query_opt(
                &format!(
                    "SELECT waiter.pid, {HARD_BLOCKERS} FROM pg_stat_activity waiter \
                     WHERE waiter.application_name = $1 LIMIT 1"
                ),
                &[application_name],
            )
            .with_context(|| format!("{}: pg_blocking_pids", self.label))?;
        Ok(Probed {
            session: Some(application_name.clone()),
            pid: row.as_ref().map(|row| row.get(0)),
            blocking_pids: Some(row.map_or_else(Vec::new, |row| row.get(1))),
            ..Probed::default()
        })
    }
}

/// The history's record of an answer: in the backend's lane, the question's name and
/// the backend beside the answer's facts.
pub fn answer_event(backend: &str, question: &Question, mut answer: Probed) -> Event {
    answer.target = Some(backend.into());
    answer.ask = Some(question.name().into());
    let text = format!("{}: {}", question.words(), answer.words());
    Event::new(backend, What::Probed(answer), text)
}
