//! The protocol between lockslab and a learner's client: one JSON object a line, on the
//! client's stdin (lockslab speaks) and stdout (the client answers). docs/challenge.md
//! has it with a worked example; these types are the one place its shape is written down.
//!
//! ```text
//! lockslab ──> {"type":"init", ...}                 client ──> {"type":"ready","notes":true}
//! lockslab ──> {"type":"job","id":1,"record":"r0","add":3,"append":"j1","work_ms":100}
//!                                                   client ──> {"type":"acquired","job":1,"token":7}
//!                                                   client ──> {"type":"writing","job":1}
//!                                                   client ──> {"type":"released","job":1}
//!                                                   client ──> {"type":"ok","job":1}
//! lockslab closes stdin: no more jobs; the client exits.
//! ```

use serde::{Deserialize, Serialize};

/// What lockslab sends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToClient {
    /// Boxed: it is much the larger, and is sent once.
    Init(Box<Init>),
    Job(Job),
}

/// The first line a client reads: who it is and where everything is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Init {
    /// This client's name (`c1`); a client started to replace a killed one gets a new name.
    pub client: String,
    pub redis_url: String,
    pub etcd_url: String,
    /// Under `delay`, the address of a fault proxy of this client's own, in front of the
    /// same Postgres.
    pub postgres_url: String,
    /// The protected records: `record text PRIMARY KEY, value bigint, items text[], job
    /// bigint, fence bigint`, schema-qualified. A job's write sets `value`, `items` and
    /// `job` in one UPDATE.
    pub table: String,
    /// The run's own Postgres schema: the client may create tables of its own in it;
    /// lockslab drops it at the end.
    pub schema: String,
    /// Every Redis key and etcd key the client makes starts with this (lockslab removes
    /// them at the end).
    pub key_prefix: String,
    /// The lock's time to live this challenge is built around: its faults outlast it.
    pub lease_ms: u64,
    /// Under `failover`, the Sentinels (`host:port`) that know which Redis is the primary
    /// of `master_name`; `redis_url` is then the primary at the start, which dies.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sentinels: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master_name: Option<String>,
    /// The password the Sentinels and both Redis servers demand (failover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis_password: Option<String>,
    /// When `etcd_url` is `https://` (a room seat's etcd): the client certificate it wants,
    /// with its authority, as `LOCKSLAB_ETCD_TLS` holds them (see [`crate::etcd_tls`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_tls: Option<String>,
}

/// One job: add `add` to the `value` of `record`, put `append` at the end of its `items`,
/// and tag the write with the job's id — all in one UPDATE, from one read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: i64,
    pub record: String,
    pub add: i64,
    /// The job's own entry (`j7`, unique to it; the same in both deliveries of a job sent
    /// twice). On every job, not some: a client has one write to get right, and every job
    /// leaves its mark in the data — a lost update erases an entry, a doubled effect leaves
    /// one twice — which the grader and the learner can both read off the record.
    pub append: String,
    /// How long to work between reading the record and writing it (sleep): a real job
    /// computes something there, and that is where a pause hurts.
    pub work_ms: u64,
}

/// What a client may say.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FromClient {
    /// Connected and waiting for jobs. `notes`: it will send `acquired`/`writing`/`released`
    /// (lockslab then aims its faults at those moments; without, at a time into the job).
    Ready {
        #[serde(default)]
        notes: bool,
        /// Whether it takes a lock at all: `false` for a lockless client (a compare-and-set,
        /// say), whose faults then aim at its `writing` and its answer, and for which a lock
        /// left stuck by a dead holder is not a question.
        #[serde(default = "yes", skip_serializing_if = "is_true")]
        lock: bool,
    },
    /// The job is done: its effect is in the table, once.
    Ok { job: i64 },
    /// The job was not done (no effect): lockslab gives it again, to whichever client is
    /// free first — often this one. A claim the log checks: a `fail` whose write committed
    /// is a problem of its own.
    Fail {
        job: i64,
        #[serde(default)]
        reason: Option<String>,
    },
    /// Note: it holds the lock for this job (with its fencing token, if it has one).
    Acquired {
        job: i64,
        #[serde(default)]
        token: Option<i64>,
    },
    /// Note: it has read the record; its write follows, after the job's work.
    Writing { job: i64 },
    /// Note: it let the lock go.
    Released { job: i64 },
}

fn yes() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

impl FromClient {
    /// The job a line is about (none for `ready`).
    pub fn job(&self) -> Option<i64> {
        match self {
            FromClient::Ready { .. } => None,
            FromClient::Ok { job }
            | FromClient::Fail { job, .. }
            | FromClient::Acquired { job, .. }
            | FromClient::Writing { job }
            | FromClient::Released { job } => Some(*job),
        }
    }
}

/// The longest line a client may print: a longer one is a flood, and ends the run.
pub const MAX_LINE: usize = 4096;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_read_and_write_as_docs_challenge_md_shows_them() {
        let job = ToClient::Job(Job {
            id: 1,
            record: "r0".into(),
            add: 3,
            append: "j1".into(),
            work_ms: 100,
        });
        assert_eq!(
            serde_json::to_string(&job).unwrap(),
            r#"{"type":"job","id":1,"record":"r0","add":3,"append":"j1","work_ms":100}"#
        );
        let said: FromClient =
            serde_json::from_str(r#"{"type":"acquired","job":1,"token":7}"#).unwrap();
        assert_eq!(
            said,
            FromClient::Acquired {
                job: 1,
                token: Some(7)
            }
        );
        let ready: FromClient = serde_json::from_str(r#"{"type":"ready"}"#).unwrap();
        assert_eq!(
            ready,
            FromClient::Ready {
                notes: false,
                lock: true
            }
        );
        let lockless: FromClient =
            serde_json::from_str(r#"{"type":"ready","notes":true,"lock":false}"#).unwrap();
        assert_eq!(
            lockless,
            FromClient::Ready {
                notes: true,
                lock: false
            }
        );
        assert!(serde_json::from_str::<FromClient>(r#"{"type":"ok"}"#).is_err());
        assert!(serde_json::from_str::<FromClient>(r#"{"type":"done","job":1}"#).is_err());
    }

    #[test]
    fn only_failovers_init_names_the_sentinels() {
        let mut init = Init {
            client: "c1".into(),
            redis_url: "redis://r".into(),
            etcd_url: "http://e".into(),
            postgres_url: "postgres://p".into(),
            table: "s.records".into(),
            schema: "s".into(),
            key_prefix: "k:".into(),
            lease_ms: 500,
            sentinels: vec![],
            master_name: None,
            redis_password: None,
            etcd_tls: None,
        };
        let line = serde_json::to_string(&ToClient::Init(Box::new(init.clone()))).unwrap();
        assert!(
            line.starts_with(r#"{"type":"init","client":"c1""#),
            "{line}"
        );
        assert!(
            !line.contains("sentinels") && !line.contains("master_name"),
            "{line}"
        );
        // Nothing a client reads tells it the run's seed: the seed deals the faults.
        assert!(!line.contains("seed"), "{line}");
        init.sentinels = vec!["127.0.0.1:26379".into()];
        init.master_name = Some("lockslab".into());
        init.redis_password = Some("pw".into());
        let line = serde_json::to_string(&init).unwrap();
        assert!(
            line.ends_with(
                r#""sentinels":["127.0.0.1:26379"],"master_name":"lockslab","redis_password":"pw"}"#
            ),
            "{line}"
        );
    }
}
