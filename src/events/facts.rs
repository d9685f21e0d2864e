//! The facts each kind of event carries, one struct per kind (or per family of kinds that
//! say the same thing: a fault, a finding, a job's fate). Every fact is a typed field; one
//! that does not apply is absent from the JSON rather than `null`.
//!
//! These structs are what `--json` prints, what `lockslab render` and the tests read back,
//! and what `docs/json.schema.json` is generated from (`lockslab schema`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::What;
pub use crate::check::queue::Turn;
use crate::check::redlock::MasterState;
use crate::invoices::{Moment, Tally};
pub use crate::lock::etcd_queue::KeyLife;
use crate::lock::lease_guard::Guard;
use crate::lock::redlock::{Answer, Attempt};
use crate::store::Outcome;

/// One fault, as a schedule names it and the history records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// SIGSTOP: the process stops between two instructions, holding whatever it held.
    Pause,
    /// SIGCONT: the end of a pause.
    Resume,
    /// SIGKILL: the process is gone, its sockets closed by the kernel.
    Kill,
    /// SIGKILL, then the same server started again on the same port.
    Restart,

    // Lab 8 (`network`): faults on one path of the fault proxy (src/proxy), no process hit.
    /// Bytes on the path queue in the proxy until the fault is lifted: a write in flight.
    Hold,
    /// Every chunk on the path arrives late (a fixed time, plus jitter).
    Delay,
    /// The path is cut: its connections reset, new ones refused, or bytes swallowed.
    Cut,
    /// The next request reaches the server and is applied; its reply is lost.
    // Written `drop_reply`; read as that or as `lost-reply`, the name `chaos --faults` and
    // every printed line give it (a schedule written by hand). Reading only: the schema
    // (serialize side) and `json_version` stay as they were.
    #[serde(alias = "lost-reply")]
    DropReply,
    /// The end of a network fault: the path carries bytes again, held ones first.
    Heal,
    /// A worker's wall clock set forward or back (libfaketime in that worker only; the
    /// machine's clock and every monotonic clock untouched).
    ClockStep,
    /// Lab 9: a worker's wall clock set to run slow or fast (libfaketime's speed factor, in
    /// that worker only; the machine's clock and every monotonic clock untouched).
    ClockRate,

    // Hosts (src/hosts): faults of the network between lockslab's own hosts.
    /// Pairs of hosts cut apart: every packet between them dropped, both ways, silently;
    /// the target names the sides (`m1|m2,m3`).
    Partition,
    /// SIGSTOP of whoever leads now (etcd's leader, Redis's primary), for longer than an
    /// election takes, then SIGCONT: the leader that stalls and wakes up deposed.
    LeaderStall,
}

/// Whether a fault's record opens it or closes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Start,
    End,
}

/// Which part of a lab run an event belongs to: the lab's tags, set once per part
/// (`scenario`, `variant`, `fencing`…) and stamped on every event of it, plus `part`, all
/// of them as one label (`fencing=false`), for a picture that draws each part as a band.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Part {
    pub scenario: Option<String>,
    pub variant: Option<String>,
    pub fencing: Option<bool>,
    pub store_rule: Option<String>,
    pub token_source: Option<String>,
    pub approach: Option<String>,
    /// How many workers play this part (lab 7).
    pub workers: Option<u32>,
    pub mode: Option<String>,
    pub part: Option<String>,
}

impl Part {
    pub fn is_empty(&self) -> bool {
        *self == Part::default()
    }

    /// The tags as one label: `scenario=race variant=broken`.
    pub fn label(&self) -> String {
        let mut words = Vec::new();
        let mut add = |key: &str, value: Option<String>| {
            if let Some(value) = value {
                words.push(format!("{key}={value}"));
            }
        };
        add("approach", self.approach.clone());
        add("fencing", self.fencing.map(|f| f.to_string()));
        add("mode", self.mode.clone());
        add("scenario", self.scenario.clone());
        add("store_rule", self.store_rule.clone());
        add("token_source", self.token_source.clone());
        add("variant", self.variant.clone());
        add("workers", self.workers.map(|w| w.to_string()));
        words.join(" ")
    }

    /// Fills in what `self` leaves open from `tags` (an event's own facts win).
    pub fn or(self, tags: &Part) -> Part {
        Part {
            scenario: self.scenario.or_else(|| tags.scenario.clone()),
            variant: self.variant.or_else(|| tags.variant.clone()),
            fencing: self.fencing.or(tags.fencing),
            store_rule: self.store_rule.or_else(|| tags.store_rule.clone()),
            token_source: self.token_source.or_else(|| tags.token_source.clone()),
            approach: self.approach.or_else(|| tags.approach.clone()),
            workers: self.workers.or(tags.workers),
            mode: self.mode.or_else(|| tags.mode.clone()),
            part: self.part.or_else(|| tags.part.clone()),
        }
    }
}

/// A worker starts and asks for the lock.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Waiting {
    pub pid: Option<i32>,
    /// The Redis primary it talks to (`host:port`, lab 5).
    pub primary: Option<String>,
    /// Its etcd lease, in hex as etcdctl prints it.
    pub lease: Option<String>,
    pub lease_ttl_ms: Option<u64>,
    /// Its Postgres session's server pid.
    pub backend_pid: Option<i32>,
}

/// The backend granted the lock.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Acquired {
    /// Which lock: its name as the backend knows it (a Redis key, an etcd lock name, a
    /// Postgres advisory lock's name). Two grants of one lock name the same.
    pub lock: Option<String>,
    /// The value the holder wrote into the lock, which proves whose it is.
    pub owner: Option<String>,
    /// A fencing token, where the lock hands one out.
    pub token: Option<i64>,
    pub backend: Option<String>,
    pub primary: Option<String>,
    pub waited_ms: Option<u64>,
    pub tries: Option<u64>,
    /// When it entered its critical section, on the machine's monotonic clock.
    pub enter_ns: Option<u64>,
    /// Redlock: what the algorithm says is left of the lock.
    pub validity_ms: Option<i64>,
    /// Redlock: the whole round, master by master.
    pub attempt: Option<Box<Attempt>>,
    /// Lab 10: how many times a watch woke it while it waited.
    pub wakeups: Option<u64>,
    /// Lab 10: the etcd revision at which it found no older key in the queue.
    pub seen_at: Option<i64>,
}

/// No lock within the wait, or a refusal.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GaveUp {
    pub why: Option<String>,
    pub error: Option<String>,
    pub owner: Option<String>,
    pub token: Option<i64>,
    pub waited_ms: Option<u64>,
    pub tries: Option<u64>,
    pub attempt: Option<Box<Attempt>>,
    /// Lab 7: what `pg_try_advisory_lock` answered.
    pub try_lock: Option<bool>,
    pub lock_timeout_ms: Option<u64>,
    /// The Postgres error code that ended the wait.
    pub sqlstate: Option<String>,
}

/// A fault, as the nemesis records it (or a worker's own resume, with `paused_ms` only).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FaultFacts {
    pub fault: Option<Fault>,
    /// Whom it hit: a worker (`A`), a server (`redis`), a member (`m3`).
    pub target: Option<String>,
    pub pid: Option<i32>,
    pub phase: Option<Phase>,
    /// How long the pause lasted (at its end).
    pub paused_ms: Option<u64>,
    /// How long a restarted server was away (at its end).
    pub restart_ms: Option<u64>,
    /// The lab's own facts about the fault.
    pub backend: Option<String>,
    pub master: Option<String>,
    pub port: Option<u16>,
    /// Replication links the lab cut with the freeze (lab 5).
    pub links_closed: Option<u64>,
    pub job: Option<i64>,
    pub customer: Option<i64>,
    /// Where in its job the worker was stopped (lab 7).
    pub at: Option<Moment>,
    /// Whether another worker met the frozen one before it was resumed (lab 7).
    pub exercised: Option<bool>,
    pub others_done: Option<u64>,
    pub others_processed: Option<u64>,
    /// How many times the frozen worker's job was processed meanwhile (lab 3).
    pub frozen_job_processed: Option<u64>,
    /// Lab 8: which direction of a proxy path the fault is on (`up`: requests).
    pub direction: Option<crate::proxy::Direction>,
    /// Lab 8: how long a network fault lasted (at its end).
    pub lasted_ms: Option<u64>,
    /// Lab 8: the worker behind the path was seen running (never stopped) every time the
    /// lab looked at its process while the fault lasted (at its end).
    pub process_ran: Option<bool>,
    /// Lab 9: how far a worker's wall clock was stepped (ms; negative: back).
    pub clock_step_ms: Option<i64>,
    /// Lab 9: the rate a worker's wall clock now runs at, in percent of true time (50:
    /// half speed, 300: three times as fast).
    pub clock_rate_percent: Option<u32>,
    /// Challenge: how long the proxy held the bytes a delay caught, from their arrival to
    /// their release (at its end; `lasted_ms` counts from when the delay was set).
    pub held_ms: Option<u64>,
}

impl FaultFacts {
    /// A worker's own word that it was stopped for `gap` (it saw its clock jump).
    pub fn paused_for(gap: std::time::Duration) -> FaultFacts {
        FaultFacts {
            paused_ms: Some(gap.as_millis() as u64),
            ..FaultFacts::default()
        }
    }
}

/// Told to finish: what the worker counted.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Finished {
    pub tally: Option<Tally>,
    pub latencies_us: Option<Vec<u64>>,
}

/// A write to the store, and what the store answered.
#[skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Wrote {
    pub outcome: Outcome,
    pub token: Option<i64>,
    pub value: Option<String>,
    pub resource: Option<String>,
    pub job: Option<i64>,
    pub customer: Option<i64>,
    /// Lab 9: how long after its guard's check the write went out, on the writer's
    /// monotonic clock — the window no guard sees.
    pub after_check_ms: Option<u64>,
}

impl Wrote {
    pub fn new(outcome: Outcome) -> Wrote {
        Wrote {
            outcome,
            token: None,
            value: None,
            resource: None,
            job: None,
            customer: None,
            after_check_ms: None,
        }
    }
}

/// Let go of the lock.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Released {
    /// The lock was still its own when it let go.
    pub released: Option<bool>,
    /// Whose value the key held when a safe release looked (Redis).
    pub found_owner: Option<String>,
    /// It gave the lock up without a release (it no longer trusted it).
    pub abandoned: Option<bool>,
    /// A plain DEL deleted a key (whoever's it was).
    pub deleted: Option<bool>,
    pub leave_ns: Option<u64>,
    /// Lab 10: requests it sent from its first try to this release, the release included.
    pub requests: Option<u64>,
    /// Redlock: each master's answer to the release.
    pub answers: Option<Vec<Answer>>,
}

#[skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Lost {
    pub why: String,
    /// Lab 5: replicas that confirmed the lock's key within a WAIT.
    pub replicas_confirmed: Option<i64>,
}

impl Lost {
    pub fn because(why: impl Into<String>) -> Lost {
        Lost {
            why: why.into(),
            replicas_confirmed: None,
        }
    }
}

#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Between {
    pub lock: Option<String>,
    pub owner: Option<String>,
    pub backend: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Ready {
    pub pid: i32,
}

/// One trial of lab 2's race, on the machine's monotonic clock.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Trial {
    pub trial: u32,
    pub start_ns: u64,
    pub answer_ns: u64,
    pub acquired: bool,
    pub enter_ns: Option<u64>,
    pub leave_ns: Option<u64>,
    pub released: Option<bool>,
}

/// A queue or invoicing worker claimed a job.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Claimed {
    pub job: Option<i64>,
    pub pid: Option<i32>,
    pub backend: Option<String>,
    pub customer: Option<i64>,
    pub period: Option<i64>,
    /// Where in its job the worker now stands (lab 7).
    pub moment: Option<Moment>,
    pub lock_key: Option<String>,
    pub owner: Option<String>,
    pub token: Option<i64>,
}

/// A queue worker's step with a job (lab 3).
#[skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobStep {
    pub job: i64,
    pub pid: Option<i32>,
}

/// A run begins.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunFacts {
    pub run_id: Option<String>,
    pub lock_key: Option<String>,
    /// Lab 5: the primary's and the replica's ports.
    pub primary: Option<u16>,
    pub replica: Option<u16>,
    /// Lab 6: the masters it runs on.
    pub masters: Option<Vec<MasterSeen>>,
}

/// A Redlock master as the lab started it (or was given it).
#[skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MasterSeen {
    pub master: String,
    pub port: String,
    pub pid: Option<i32>,
    pub dir: Option<String>,
    /// A master lockslab did not start: its address, password redacted.
    pub url: Option<String>,
}

#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Workers {
    pub pids: Vec<i32>,
    pub run_id: Option<String>,
    pub invoices_table: Option<String>,
}

/// A backend ended a lease, a key or a session.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Expired {
    /// Which lock's key or lease it was, where the lab knows.
    pub lock: Option<String>,
    pub master: Option<String>,
    /// The expiry was brought about by the lab, standing in for a clock jump (lab 6).
    pub simulated: Option<bool>,
    pub jump_ms: Option<u64>,
    pub pttl_before_ms: Option<i64>,
    pub pttl_after_ms: Option<i64>,
}

/// One Redis server's answers in lab 5's split brain, read together: an observation the
/// checker decides from ([`crate::check::split_brain`]), never a conclusion.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NodeAnswered {
    /// The host it runs in (`primary`, `replica`, `sentinel-1`): its name for the whole run,
    /// whatever its role becomes.
    pub node: String,
    /// The first word of its `ROLE`: `master`, `slave` or `sentinel`.
    pub role: Option<String>,
    /// Whom it follows: a replica's primary (`ROLE`), or the primary a Sentinel names
    /// (`SENTINEL get-master-addr-by-name`), as `address:port`.
    pub primary: Option<String>,
    /// A replica's `master_link_status` (`up`, `down`).
    pub link: Option<String>,
    /// A primary's `connected_slaves` (`INFO replication`), and how many seconds ago its
    /// first replica last acknowledged (`lag=`): what `min-replicas-max-lag` is held against.
    pub connected_replicas: Option<u64>,
    pub replica_lag_s: Option<u64>,
    /// The lock's key there: its value (the holder's owner value) and PTTL in ms (-2: no
    /// key), read in one `MULTI`.
    pub lock_owner: Option<String>,
    pub lock_pttl_ms: Option<i64>,
    /// The numbers of A's writes its copy of the list holds (`LRANGE`).
    pub writes_held: Option<Vec<u64>>,
}

/// Who the backend says holds the lock now, and what it says of its own state.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HolderNow {
    pub holder: Option<String>,
    pub backend: Option<String>,
    pub key: Option<String>,
    /// Lab 6: each master's GET and PTTL.
    pub masters: Option<Vec<MasterState>>,
    /// Lab 5: `INFO replication`'s replica lines.
    pub connected_replicas: Option<String>,
    pub failover_ms: Option<u64>,
    /// Lab 5 (etcd): the Raft term before and after an election, and how long it took.
    pub raft_term: Option<u64>,
    pub old_raft_term: Option<u64>,
    pub election_ms: Option<u64>,
    pub b_queued_revision: Option<i64>,
    pub b_token: Option<i64>,
    pub b_kept_place: Option<bool>,
    pub a_key_held: Option<bool>,
    pub a_lease_renewed: Option<bool>,
    pub after_election_ms: Option<u64>,
    pub a_lease_left_s: Option<i64>,
}

/// Who took over a job (lab 3's frozen worker's, lab 3 and 7's killed worker's).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Handover {
    pub job: Option<i64>,
    pub by: Option<String>,
    /// Lab 7: the process that came back for the job.
    pub pid: Option<i32>,
    pub reclaim_ms: Option<f64>,
}

/// What became of one job, read from the processing table (lab 3).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct JobFate {
    pub job: Option<i64>,
    /// Who processed it, in order.
    pub by: Option<Vec<String>>,
    pub times_processed: Option<u64>,
    pub status: Option<String>,
    pub claimed_by: Option<String>,
    pub frozen_job_processed_while_frozen: Option<u64>,
}

/// A round of jobs done.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RoundFacts {
    pub round: Option<u32>,
    pub jobs: Option<u64>,
    pub seconds: Option<f64>,
    pub jobs_per_s: Option<f64>,
    pub per_worker: Option<BTreeMap<String, i64>>,
    pub run_id: Option<String>,
    pub jobs_table: Option<String>,
    pub processing_table: Option<String>,
    /// Lab 7: optimistic retries.
    pub retries: Option<u64>,
}

/// A worker's session as Postgres lists it.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Session {
    pub session_of: Option<String>,
    pub state: Option<String>,
    /// How many sessions wait on it.
    pub waiting: Option<i64>,
}

/// Sessions blocked behind a frozen worker's row lock (`pg_blocking_pids`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Blocked {
    pub waiting: i64,
    pub waiting_directly: i64,
}

/// A key's remaining time to live, as Redis answers PTTL.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Pttl {
    pub pttl_ms: i64,
    /// When the lease runs out, on the run's clock.
    pub lease_lives_until_ms: Option<u64>,
}

/// What a backend answered when a lab read something back: Redis's key and holders (lab
/// 2), the tables' counts (labs 3, 7, 8), a `WAIT`'s replicas (lab 5). Figures only; the
/// checkers conclude from them.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Observed {
    pub violations: Option<u64>,
    pub trials: Option<u64>,
    /// Lab 2's race: trials whose holders overlapped on the clock, trials whose counter
    /// lost an update, and how many believed they held the lock, trial by trial.
    pub clock_overlaps: Option<u64>,
    pub overwritten_trials: Option<u64>,
    pub holders_per_trial: Option<Vec<u64>>,
    /// Lab 2: a dead holder's value against the key's, and the key's PTTL.
    pub dead_owner: Option<bool>,
    pub key_owner: Option<String>,
    pub pttl_ms: Option<i64>,
    /// Lab 2: who believed they held the lock at once.
    pub holders: Option<Vec<String>>,
    /// Labs 3 and 7: jobs processed more than once, lost, and lost updates.
    pub once: Option<u64>,
    pub duplicates: Option<u64>,
    pub lost: Option<u64>,
    pub lost_jobs: Option<u64>,
    pub lost_updates: Option<u64>,
    pub bad_jobs: Option<Vec<i64>>,
    pub bad_customers: Option<Vec<i64>>,
    /// Lab 5: replicas that confirmed a WAIT.
    pub replicas_confirmed: Option<i64>,
    /// Lab 6: what A's validity had left when B got the lock, and on which master.
    pub a_validity_left_ms: Option<i64>,
    pub master: Option<String>,
}

impl Observed {
    /// What the tables counted as gone wrong, all told: jobs (payments, a token's writes)
    /// processed twice or more, jobs never processed, balances that differ from their
    /// invoices. Zero is every job exactly once — the checkers' rule, which reads this.
    pub fn counted_wrong(&self) -> u64 {
        [
            self.duplicates,
            self.lost,
            self.lost_jobs,
            self.lost_updates,
        ]
        .into_iter()
        .flatten()
        .sum()
    }
}

#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Warning {
    /// The lab itself was paused this long (its timings around it are skewed).
    pub lab_paused_ms: Option<u64>,
    pub at_ms: Option<u64>,
    /// Lab 2: trials where the holders list and the counter disagree.
    pub disagreeing_trials: Option<Vec<u64>>,
    /// `lockslab chaos`: the Sentinels failed the primary over by themselves during the
    /// history, a failover its schedule does not hold.
    pub failed_over_by_itself: Option<bool>,
}

// Lab 9 (lease-guard).

/// A holder's guard decided whether it may still write (lab 9).
#[skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct GuardDecided {
    pub guard: Guard,
    /// The guard let the write go out.
    pub write: bool,
    /// How much of the lease the guard believed was left (ms, negative once past); absent
    /// for a guard that does not count.
    pub believed_left_ms: Option<i64>,
    /// Redis's answer just after the decision: the key still held this holder's value…
    pub key_ours: Option<bool>,
    /// …and its PTTL then (-2: no key).
    pub pttl_ms: Option<i64>,
    /// Time since the request for the lock was sent, on the holder's monotonic clock.
    pub since_send_ms: u64,
    /// The holder's wall clock at the decision (ms since 1970): the lab checks that a
    /// clock fault really moved it.
    pub wall_clock_ms: Option<i64>,
    /// The widest gap pause detection saw between two samples of the monotonic clock.
    pub gap_ms: Option<u64>,
    /// How far the holder's wall clock moved against its monotonic clock since the grant
    /// (negative: it fell behind): the skew a clock fault gave it, measured in the holder.
    pub wall_skew_ms: Option<i64>,
}

impl GuardDecided {
    /// What the checker reads of the decision.
    pub fn decided(&self) -> crate::check::lease_guard::Decided {
        crate::check::lease_guard::Decided {
            write: self.write,
            counted: self.guard.looks(),
            key_ours: self.key_ours,
            pttl_ms: self.pttl_ms,
        }
    }
}
/// A backend's answer to a schedule's probe: the question's facts and the answer's.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Probed {
    /// The backend asked (`redis`, `etcd`, `postgres`).
    pub target: Option<String>,
    /// The question: `pttl`, `lease_ttl`, `blocking_pids`.
    pub ask: Option<String>,
    /// `pttl`: the key, its value (the holder's owner value) and its PTTL (ms; -2 no key,
    /// -1 no TTL).
    pub key: Option<String>,
    pub owner: Option<String>,
    pub pttl_ms: Option<i64>,
    /// `lease_ttl`: the lease and its TTL left (whole seconds; -1 expired or unknown).
    pub lease: Option<i64>,
    pub ttl_s: Option<i64>,
    /// `blocking_pids`: the session asked about (its application_name), its backend pid
    /// (none: no such session) and the pids it waits behind.
    pub session: Option<String>,
    pub pid: Option<i32>,
    pub blocking_pids: Option<Vec<i32>>,
}

impl Probed {
    /// The answer in a few words, for the timeline.
    pub fn words(&self) -> String {
        match (self.pttl_ms, self.ttl_s, &self.blocking_pids) {
            (Some(pttl), ..) => format!(
                "{pttl}ms, held by {}",
                self.owner.as_deref().unwrap_or("no one")
            ),
            (_, Some(ttl), _) => format!("{ttl}s"),
            (.., Some(pids)) if self.pid.is_none() => "no such session".into(),
            (.., Some(pids)) if pids.is_empty() => "nobody".into(),
            (.., Some(pids)) => format!("{pids:?}"),
            _ => "no answer".into(),
        }
    }
}

/// A schedule's step or probe whose events did not come by its `within_ms`.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Missed {
    /// The fault it would have done (none: a probe) and its target.
    pub fault: Option<Fault>,
    pub target: Option<String>,
    /// The events it waited for, in words, and the time it gave up at (schedule's clock).
    pub waited_for: Option<String>,
    pub within_ms: Option<u64>,
}

macro_rules! one_kind {
    ($($facts:ident),*) => {
        $(impl From<$facts> for What {
            fn from(facts: $facts) -> What {
                What::$facts(facts)
            }
        })*
    };
}

one_kind!(
    Waiting,
    Acquired,
    GaveUp,
    Finished,
    Wrote,
    Released,
    Lost,
    Between,
    Ready,
    Trial,
    Claimed,
    Workers,
    Expired,
    HolderNow,
    Session,
    Blocked,
    Pttl,
    Warning,
    GuardDecided,
    Probed,
    Missed
);

impl From<RunFacts> for What {
    fn from(facts: RunFacts) -> What {
        What::Run(facts)
    }
}

impl From<RoundFacts> for What {
    fn from(facts: RoundFacts) -> What {
        What::Round(facts)
    }
}

/// Lab 8: what a holder found when it checked, just before writing, that the lock was still
/// its own (Redis: its owner value in the key, and the key's PTTL).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Checked {
    pub still_ours: Option<bool>,
    pub pttl_ms: Option<i64>,
    /// Lab 8, the holder that stops: its heartbeat had given the lock up when it asked.
    pub heartbeat_lost: Option<bool>,
}

one_kind!(Checked);
// Lab 10 (queue).

/// A waiter took its place in the queue (or made its first try for the lock).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Queued {
    pub pid: Option<i32>,
    /// Its key in etcd (the recipe's `<prefix>/<lease>`).
    pub key: Option<String>,
    /// Its key's create revision: its place in line, and its token once it holds.
    pub revision: Option<i64>,
    /// Its etcd lease, in hex as etcdctl prints it.
    pub lease: Option<String>,
    /// The lease's TTL as etcd granted it (etcd may grant more than asked).
    pub lease_ttl_ms: Option<u64>,
}

/// A watch woke a waiter: the key it watched is gone, and what it saw when it looked again.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Woke {
    /// The key whose delete woke it.
    pub gone: Option<String>,
    /// The key now ahead of it, if one is (it waits on).
    pub ahead: Option<String>,
}

/// One way of queueing played with N waiters: each waiter's turn, and what the servers
/// counted for the whole queue.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Handovers {
    /// `redis_spin`, `etcd_herd` or `etcd_recipe`.
    pub way: String,
    /// Every waiter, in the order they asked.
    pub turns: Vec<Turn>,
    /// The servers' own counters, read before and after the queue.
    pub server: ServerCount,
}

/// What a server counted itself over one queue, as deltas of its own counters.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ServerCount {
    /// Requests the server handled: Redis `INFO commandstats` calls, or etcd's gRPC KV
    /// requests and watches opened (`/metrics`). None where the server would not say.
    pub requests: Option<u64>,
    /// etcd: watch events it sent (`etcd_debugging_mvcc_events_total`).
    pub watch_events: Option<u64>,
    /// Where the figures come from, in a few words.
    pub source: String,
}

one_kind!(Queued, Woke, Handovers);

/// `lockslab chaos`: a client read its record, the read its next write is computed from.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RecordRead {
    pub record: Option<String>,
    /// The counter it read.
    pub value: Option<i64>,
    /// The record's version it read (the optimistic design writes only if it is unchanged).
    pub version: Option<i64>,
    /// The token its read was fenced with, where the design fences the read.
    pub token: Option<i64>,
    pub job: Option<i64>,
}
/// Lab 10: the keys that lived under a queue's prefix, read back from etcd's own history of
/// changes at the end of a part (the churn part's evidence).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct QueueKeys {
    pub prefix: String,
    /// The revision the history was read from (before the first waiter joined).
    pub from_revision: i64,
    /// Every key, in the order etcd created them.
    pub keys: Vec<KeyLife>,
    /// Why the history could not be read (etcd compacted it), when it could not.
    pub unreadable: Option<String>,
}

one_kind!(QueueKeys);

/// The store's record of one resource, read back when a part has ended: every write attempt
/// in the order the database decided them, and what the resource holds. The evidence a
/// part's verdict is judged from, kept in the history so that `lockslab check` can judge
/// it again from the run's `--json` alone.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct StoreRecord {
    pub resource: Option<String>,
    pub final_value: Option<String>,
    pub final_writer: Option<String>,
    /// The highest fencing token the resource accepted (none while only unfenced writes
    /// happened).
    pub final_token: Option<i64>,
    /// Every attempt, accepted or refused, in decision order.
    pub attempts: Vec<crate::store::Attempt>,
}

impl StoreRecord {
    pub fn of(resource: &str, read: &crate::store::ReadBack) -> StoreRecord {
        StoreRecord {
            resource: Some(resource.into()),
            final_value: read.final_value.clone(),
            final_writer: read.final_writer.clone(),
            final_token: read.final_token,
            attempts: read.attempts.clone(),
        }
    }

    /// The record as the checkers take it.
    pub fn read_back(&self) -> crate::store::ReadBack {
        crate::store::ReadBack {
            final_value: self.final_value.clone(),
            final_writer: self.final_writer.clone(),
            final_token: self.final_token,
            attempts: self.attempts.clone(),
        }
    }
}

/// `lockslab chaos`: every record of one history as the store read it back once the clients
/// were done — its counter, its log of jobs, every attempt in decision order. The evidence
/// the history is checked from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RecordsBack {
    pub records: Vec<crate::check::chaos::RecordBack>,
}

impl From<RecordsBack> for What {
    fn from(back: RecordsBack) -> What {
        What::RecordsReadBack(back)
    }
}

impl From<StoreRecord> for What {
    fn from(record: StoreRecord) -> What {
        What::ReadBack(record)
    }
}

/// `lockslab challenge`: one job given to a learner's client, or its answer.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ChallengeJob {
    pub job: i64,
    pub record: Option<String>,
    /// What the job adds to the record's value.
    pub add: Option<i64>,
    /// What the job appends to the record's items (its own entry, `j7`).
    pub append: Option<String>,
    /// The answer: true `ok`, false `fail`.
    pub ok: Option<bool>,
    /// A `fail`'s reason, as the client gave it.
    pub reason: Option<String>,
    /// Given again: its first client was killed, or answered `fail`.
    pub resent: Option<bool>,
    /// Challenge exactly-once: a second delivery of a job already sent, on purpose (with
    /// `resent`).
    pub duplicate: Option<bool>,
}

/// Lab 8 (issue 22): a held lock's renewal that failed, the first after one that got
/// through; the holder still counts the lease it last won and tries again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RenewalFailed {
    pub error: RenewalError,
    /// The client's error, whole.
    pub why: String,
}

/// How a renewal failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RenewalError {
    /// An error came back: the connection was reset, refused or closed.
    Cut,
    /// No answer came within the time the holder allowed.
    Timeout,
}

one_kind!(RenewalFailed);
one_kind!(NodeAnswered);

/// One etcd member's answer to the lab, asked over the member's own control socket (which
/// no partition cuts), or the answer a client's request through that member got: the
/// servers' word on who leads, whether a lease lives and who holds the lock.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MemberSaid {
    /// The member asked (its host's name: `m1`…).
    pub member: String,
    /// What was asked: `status`, `lease_ttl`, `holder`, or a client's `put`.
    pub ask: String,
    /// Is the member on the majority's side of the partition now (or, with no partition,
    /// one of the members that were not stalled)?
    pub in_majority: Option<bool>,
    /// The client whose lease or request this is (`A:cut`).
    pub client: Option<String>,
    /// `status`: the member it names as leader (None: it knows of none), the Raft term,
    /// and the server's version.
    pub leader: Option<String>,
    pub raft_term: Option<u64>,
    pub version: Option<String>,
    /// `lease_ttl`: the lease and the TTL left (whole seconds; -1: expired, not found).
    pub lease: Option<i64>,
    pub ttl_s: Option<i64>,
    /// `holder`: the key that holds the lock (the oldest under its prefix) and its create
    /// revision; None: nobody holds it.
    pub holder_key: Option<String>,
    pub holder_revision: Option<i64>,
    /// The error the request came back with (a timeout, `leader changed`…).
    pub error: Option<String>,
}

one_kind!(MemberSaid);

/// One master's grant in the middle of a Redlock round (lab 6): which master, its answer
/// as the client timed it, and how far the round had come.
#[skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Granted {
    /// The key the client asked for.
    pub lock: String,
    /// The master's answer: its name, its port, when the `SET` was sent and how long the
    /// OK took, from the start of the round.
    pub answer: Answer,
    /// Masters that had granted this round so far, this one included, of how many, and
    /// how many make a quorum.
    pub granted: usize,
    pub masters: usize,
    pub quorum: usize,
}

one_kind!(Granted);
