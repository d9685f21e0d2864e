//! The worker-to-orchestrator protocol: one JSON object per line on the worker's stdout.
//!
//! A worker says what it does (`acquired`, `wrote`, `released`…) and nothing more; the
//! orchestrator stamps each event with its own monotonic clock on arrival, so that the
//! events of all workers and of the lab itself fall on one timeline. The same stamped
//! events feed the terminal timeline, `--json`, and the tests.

use std::io::{self, BufRead, BufReader, Write};
use std::process::ChildStdout;
use std::sync::mpsc::Sender;
use std::thread;
use std::time::Instant;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strum::EnumDiscriminants;

/// The version of the `--json` shapes documented in docs/json.md; raised whenever a field
/// changes meaning or goes away (new fields do not raise it).
pub const JSON_VERSION: u32 = 5;

pub mod envelope;
pub mod facts;

use facts::*;

/// What happened, with its facts: the one vocabulary every worker, lab, backend probe and
/// the nemesis report in. In JSON the variant is the `kind` field, in snake_case
/// (`What::GaveUp` is `"gave_up"`), and its facts sit beside it in the same object.
///
/// [`Kind`] is the same list without the facts, for asking "which kind?".
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema, EnumDiscriminants)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[strum_discriminants(name(Kind), derive(Hash, Serialize, Deserialize, JsonSchema))]
#[strum_discriminants(serde(rename_all = "snake_case"))]
pub enum What {
    // A worker and its lock.
    /// Started, and asks for the lock (its pid, lease or session with it).
    Waiting(Waiting),
    /// The backend granted the lock.
    Acquired(Acquired),
    /// No lock within the wait.
    GaveUp(GaveUp),
    /// About to stop itself with SIGSTOP.
    Freezing,
    /// Running again: a worker that saw its own clock jump, or the nemesis ending a pause
    /// or a restart.
    Resumed(FaultFacts),
    Working,
    /// Told to finish its work.
    Finished(Finished),
    /// Wrote to the store.
    Wrote(Wrote),
    /// Let go.
    Released(Released),
    /// Its heartbeat or session learned that the lock is gone.
    Lost(Lost),
    /// Between two commands of a non-atomic acquisition (lab 2's SETNX then PEXPIRE).
    Between(Between),
    /// Ready for the next trial (lab 2's race).
    Ready(Ready),
    /// One trial's report (lab 2's race).
    Trial(Trial),
    /// A queue worker claimed a job (lab 3, lab 7).
    Claimed(Claimed),
    /// A queue worker committed a job (lab 3).
    Committed(JobStep),
    /// A queue worker's statement failed after the lab resumed it (lab 3).
    FinishFailed(JobStep),
    /// Failed; the run stops.
    Error,
    /// A line from a worker that was not an event.
    Output,

    // The lab, and what it saw in the backends.
    /// A run of the lab begins (its id and keys).
    Run(RunFacts),
    /// Workers started.
    Workers(Workers),
    /// A process stopped with SIGSTOP (by the nemesis).
    Frozen(FaultFacts),
    /// A process ended with SIGKILL (by the nemesis).
    Killed(FaultFacts),
    /// A backend ended a lease, a key or a session.
    Expired(Expired),
    /// A lock key went without its TTL (deleted, flushed, evicted, lost in a restart).
    Vanished,
    /// Who the backend says holds the lock now.
    HolderNow(HolderNow),
    /// A frozen worker's job processed by another (lab 3).
    TakenOver(Handover),
    /// A killed worker's job claimed again (lab 3, lab 7).
    Reclaimed(Handover),
    /// A round of jobs done (lab 3, lab 7).
    Round(RoundFacts),
    /// A job's record as Postgres's processing table answered it once its round was over
    /// (lab 3): who processed it, in order, and how often, or its row in the jobs table
    /// (its status and who claimed it) — the evidence lab 3's checker reads to say what
    /// became of a killed or frozen worker's job. (Older recordings wrote the conclusion in
    /// its place, `kill_result`, `freeze_result` or `job_lost`: they read as this.)
    #[serde(alias = "kill_result", alias = "freeze_result", alias = "job_lost")]
    JobRead(JobFate),
    /// A worker's session as Postgres lists it.
    Session(Session),
    /// Sessions blocked behind a frozen worker's row lock, as `pg_blocking_pids` says (lab 3).
    Blocked(Blocked),
    /// A key's remaining time to live as Redis answers it (lab 2).
    Pttl(Pttl),
    /// What Redis answered when lab 2 read its lock back: a key's owner and time to live,
    /// the holders list, each race trial's holders. An observation, not a conclusion:
    /// whether it shows the lock broken is lab 2's checker's finding, which points at it.
    /// (Older recordings wrote the conclusion in its place, `counted` or `lapsed`: they
    /// read as this, their facts unchanged.)
    #[serde(alias = "counted", alias = "lapsed")]
    RedisRead(Observed),
    /// What Postgres's tables counted back once a part's work was done (labs 3, 7, 8): jobs
    /// (payments, a token's writes) processed once, twice or more, never; balances that
    /// differ from their invoices, and which. The observation; whether every job was done
    /// exactly once is the lab's checker's finding, which points at it. (Older recordings
    /// wrote the conclusion in its place, `violation` or `exactly_once`, with these same
    /// figures: they read as this.)
    #[serde(alias = "violation", alias = "exactly_once")]
    TablesRead(Observed),
    /// Lab 5: what Redis's `WAIT` answered a holder that asked a replica to confirm its
    /// lock: how many replicas had the key (one or more; none is the holder's `lost`).
    /// (Older recordings called it `kept`: they read as this.)
    #[serde(alias = "kept")]
    WaitAnswered(Observed),
    Warning(Warning),
    /// The store's record of a resource, read back at the end of a part: the attempts in
    /// decision order and what the resource holds (the evidence of the part's verdict).
    ReadBack(StoreRecord),

    // Lab 8 (`network`).
    /// A network fault began on a path of the fault proxy (by the nemesis).
    NetFault(FaultFacts),
    /// A network fault ended: the path carries bytes again (by the nemesis).
    NetHealed(FaultFacts),
    /// A holder checked, just before writing, that the lock was still its own.
    Checked(Checked),
    // Lab 9 (lease-guard).
    /// A worker's wall clock was stepped (by the nemesis, with libfaketime).
    ClockStepped(FaultFacts),
    /// A holder's lease guard decided whether it may still write.
    GuardDecided(GuardDecided),
    // Lab 10 (queue).
    /// A waiter joined the queue (its key and create revision), or made its first try.
    Queued(Queued),
    /// A watch woke a waiter; it looked again at who is ahead.
    Woke(Woke),
    /// One way of queueing played to the end: every turn and the servers' counts.
    Handovers(Handovers),
    // `lockslab chaos`.
    ReadRecord(RecordRead),
    /// Every record of a history as the store read it back (its counter, its log, its
    /// attempts in decision order): the evidence the history is checked from.
    RecordsReadBack(RecordsBack),
    /// The churn part's queue as etcd's history tells it: each key's create and delete
    /// revisions.
    QueueKeys(QueueKeys),
    // `lockslab challenge` (issue 26).
    /// lockslab gave a job to a learner's client.
    JobSent(ChallengeJob),
    /// A learner's client answered a job: `ok` (done, once) or not (`fail`, with its reason).
    JobAnswered(ChallengeJob),
    /// What the challenge read from the servers while a fault lasted, each reading as it
    /// came: a Postgres session waiting behind others' locks (`pg_blocking_pids`)…
    PgWaitSeen(crate::check::challenge::Wait),
    /// …a Postgres lock held — an advisory lock (`pg_locks`), a row (its `xmax`) — and the
    /// run's other sessions that had just sent a statement…
    PgLockSeen(crate::check::challenge::PgLockSeen),
    /// …a client waiting behind a faulted client's Redis or etcd key.
    KeyWaitSeen(crate::check::challenge::KeyWait),
    /// Postgres aborted a client's transaction for a serialization failure or a deadlock it
    /// found, as the client's fault proxy saw it end: nothing it wrote was kept.
    PgAborted(crate::check::challenge::Statement),
    /// A Postgres session of a client's login that no fault proxy opened.
    SessionAroundProxy(crate::check::challenge::AroundProxy),
    /// The database's logs read back once the challenge's clients were done: every change,
    /// every UPDATE statement on the records, each record's final value and items.
    LogReadBack(crate::check::challenge::LogBack),
    // lab 8 renewal failed (issue 22)
    /// A held lock's renewal failed (a Redis heartbeat's `PEXPIRE`, an etcd keepalive): the
    /// first failure after one that got through, before the holder gives the lock up.
    RenewalFailed(RenewalFailed),

    // The nemesis's observations (issue 43).
    /// A backend's answer to a schedule's probe, asked at its moment ([`crate::nemesis::probe`]).
    Probed(Probed),
    /// A schedule's step whose events did not come within its time: it did not play.
    Missed(Missed),

    // Lab 5's split brain.
    /// A Redis node's or a Sentinel's own answers, asked over lockslab's control line while
    /// the hosts are cut apart or after: what it says it is, whom it follows, the lock's key
    /// there, the writes it holds.
    NodeAnswered(NodeAnswered),
    // etcd on hosts of its own (issue 44).
    /// What one etcd member answered when the lab asked it directly (its status, a lease's
    /// TTL, the lock's holder), or what a client's request to it came back with.
    MemberSaid(MemberSaid),
    // Lab 6: a round watched master by master (issue 44).
    /// One Redis master said OK to a Redlock client's `SET`, seen the moment it came in,
    /// before the client asked the next master: a point in the middle of a round that a
    /// fault can be timed from ("once m2 has granted A").
    Granted(Granted),
}

impl std::fmt::Display for Kind {
    /// The word `--json` carries (`gave_up`), for messages that name an event.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(word)) => f.write_str(&word),
            _ => write!(f, "{self:?}"),
        }
    }
}

/// The JSON Schema of one event line of `--json`, generated from [`Event`] itself, so it
/// cannot drift from what the labs print (docs/json.schema.json is this, pretty-printed).
/// It describes what `--json` *writes* (serde's serialize side): a field that is always
/// written is required, even where reading one back would default it.
pub fn json_schema() -> String {
    let generator = schemars::generate::SchemaSettings::default()
        .for_serialize()
        .into_generator();
    let schema = generator.into_root_schema_for::<Event>();
    serde_json::to_string_pretty(&schema).expect("a schema is plain JSON")
}

/// The kinds an older lockslab wrote into the history that were conclusions carrying no
/// observation of their own: the store took (or refused) a stale write, two Redlock
/// majorities at once. Today the history holds only what they were concluded from — the
/// store's read-back, the masters' answers — and the checkers conclude again from that.
pub const OLD_CONCLUSIONS: [&str; 3] = [
    "stale_write_accepted",
    "stale_write_rejected",
    "two_holders",
];

/// One event line of a saved run, read as an [`Event`]. A line of a kind in
/// [`OLD_CONCLUSIONS`] reads as an `output` line that keeps its time, lane, sentence and
/// part: the file still loads, every other event keeps its place, and no checker takes the
/// old conclusion for evidence.
pub fn read_line(line: serde_json::Value) -> serde_json::Result<Event> {
    let kind = line.get("kind").and_then(serde_json::Value::as_str);
    if !kind.is_some_and(|kind| OLD_CONCLUSIONS.contains(&kind)) {
        return serde_json::from_value(line);
    }
    let text = |field: &str| line.get(field).and_then(serde_json::Value::as_str);
    Ok(Event {
        t_ms: line
            .get("t_ms")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0),
        worker: text("worker").unwrap_or_default().to_string(),
        text: text("text").unwrap_or_default().to_string(),
        what: What::Output,
        part: serde_json::from_value(line.clone())?,
    })
}

/// One thing that happened, as a worker or the lab reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Event {
    /// Milliseconds since the lab started, stamped by the orchestrator on arrival. (A
    /// worker's line has none until then: it reads as 0; every line `--json` prints has it.)
    #[serde(default)]
    pub t_ms: u64,
    /// Who: a worker's name (`A`, `B`…) or the lab's own lane (`redis`, `lab`).
    pub worker: String,
    /// What happened, in a sentence for the timeline.
    pub text: String,
    /// What happened, as the one vocabulary says it (`kind`), with its facts.
    #[serde(flatten)]
    pub what: What,
    /// Which part of the lab run this event belongs to (the scenario, the approach…).
    #[serde(flatten)]
    pub part: Part,
}

impl Event {
    pub fn new(worker: &str, what: impl Into<What>, text: impl Into<String>) -> Event {
        Event {
            t_ms: 0,
            worker: worker.into(),
            text: text.into(),
            what: what.into(),
            part: Part::default(),
        }
    }

    pub fn kind(&self) -> Kind {
        Kind::from(&self.what)
    }

    pub fn is(&self, worker: &str, kind: Kind) -> bool {
        self.worker == worker && self.kind() == kind
    }

    /// The lock's owner value this event names, if it names one (a grant, a hand-over).
    pub fn owner(&self) -> Option<&str> {
        match &self.what {
            What::Acquired(a) => a.owner.as_deref(),
            What::Between(b) => b.owner.as_deref(),
            What::Claimed(c) => c.owner.as_deref(),
            What::GaveUp(g) => g.owner.as_deref(),
            _ => None,
        }
    }

    /// The backend this event names: the lock's (a grant), or the one a fault or a probe is
    /// about.
    pub fn backend(&self) -> Option<&str> {
        match &self.what {
            What::Acquired(a) => a.backend.as_deref(),
            What::Between(b) => b.backend.as_deref(),
            What::Claimed(c) => c.backend.as_deref(),
            What::Frozen(f) | What::Killed(f) | What::Resumed(f) => f.backend.as_deref(),
            What::HolderNow(h) => h.backend.as_deref(),
            _ => None,
        }
    }

    /// The run id a `run`, `workers` or `round` event announces.
    pub fn run_id(&self) -> Option<&str> {
        match &self.what {
            What::Run(r) => r.run_id.as_deref(),
            What::Workers(w) => w.run_id.as_deref(),
            What::Round(r) => r.run_id.as_deref(),
            _ => None,
        }
    }

    /// How long the lab itself was not running, on its own warning.
    pub fn lab_paused_ms(&self) -> Option<u64> {
        match &self.what {
            What::Warning(w) => w.lab_paused_ms,
            _ => None,
        }
    }

    /// Which lock a grant, a claim or an expiry is about, by the name its backend knows.
    pub fn lock(&self) -> Option<&str> {
        match &self.what {
            What::Acquired(a) => a.lock.as_deref(),
            What::Between(b) => b.lock.as_deref(),
            What::Claimed(c) => c.lock_key.as_deref(),
            What::Expired(e) => e.lock.as_deref(),
            _ => None,
        }
    }

    /// Whether a release found the lock still its own.
    pub fn released(&self) -> Option<bool> {
        match &self.what {
            What::Released(r) => r.released,
            _ => None,
        }
    }

    /// The fencing token this event carries, if it carries one.
    pub fn token(&self) -> Option<i64> {
        match &self.what {
            What::Acquired(a) => a.token,
            What::Wrote(w) => w.token,
            What::Claimed(c) => c.token,
            What::GaveUp(g) => g.token,
            _ => None,
        }
    }

    /// The job this event is about (labs 3 and 7).
    pub fn job(&self) -> Option<i64> {
        match &self.what {
            What::Claimed(c) => c.job,
            What::Committed(s) | What::FinishFailed(s) => Some(s.job),
            What::Wrote(w) => w.job,
            What::TakenOver(h) | What::Reclaimed(h) => h.job,
            What::JobRead(f) => f.job,
            What::Frozen(f) | What::Killed(f) | What::Resumed(f) => f.job,
            _ => None,
        }
    }

    /// The process this event names: the worker's own, or the one a fault hit.
    pub fn pid(&self) -> Option<i32> {
        match &self.what {
            What::Waiting(w) => w.pid,
            What::Queued(q) => q.pid,
            What::Ready(r) => Some(r.pid),
            What::Claimed(c) => c.pid,
            What::Committed(s) | What::FinishFailed(s) => s.pid,
            What::Frozen(f) | What::Killed(f) | What::Resumed(f) => f.pid,
            What::Reclaimed(f) => f.pid,
            _ => None,
        }
    }

    pub fn fault_mut(&mut self) -> Option<&mut FaultFacts> {
        match &mut self.what {
            What::Frozen(f) | What::Killed(f) | What::Resumed(f) | What::ClockStepped(f) => Some(f),
            _ => None,
        }
    }

    /// What a backend answered, if this is a read-back that counts (Redis's answers in lab
    /// 2, the tables' counts, a `WAIT`'s replicas).
    pub fn observed(&self) -> Option<&Observed> {
        match &self.what {
            What::RedisRead(o) | What::TablesRead(o) | What::WaitAnswered(o) => Some(o),
            _ => None,
        }
    }

    /// The fault facts of a nemesis event (or a worker's own resume).
    pub fn fault(&self) -> Option<&FaultFacts> {
        match &self.what {
            What::Frozen(f) | What::Killed(f) | What::Resumed(f) | What::ClockStepped(f) => Some(f),
            _ => None,
        }
    }
}

/// The worker side: writes events to stdout, one line each, flushed at once so that the
/// orchestrator sees an event before the worker is frozen or killed.
pub struct Emitter {
    worker: String,
}

impl Emitter {
    pub fn new(worker: &str) -> Emitter {
        Emitter {
            worker: worker.into(),
        }
    }

    pub fn name(&self) -> &str {
        &self.worker
    }

    pub fn event(&self, what: impl Into<What>, text: impl Into<String>) -> Event {
        Event::new(&self.worker, what, text)
    }

    pub fn send(&self, event: Event) {
        let mut out = io::stdout().lock();
        // A closed pipe means the orchestrator is gone; the worker is about to be killed anyway.
        let _ = serde_json::to_writer(&mut out, &event);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }

    /// Shorthand for an event with no facts.
    pub fn say(&self, what: impl Into<What>, text: impl Into<String>) {
        self.send(self.event(what, text));
    }
}

/// What arrives on the orchestrator's channel.
#[derive(Debug)]
pub enum Incoming {
    Event(Box<Event>),
    /// The worker closed its stdout: it exited, or was killed.
    Closed {
        worker: String,
        /// Which process it was: a later worker may carry the same name.
        pid: i32,
    },
}

/// The orchestrator side: a thread that reads a worker's events, stamps them and forwards them.
pub fn forward(
    worker: String,
    pid: i32,
    stdout: ChildStdout,
    start: Instant,
    to: Sender<Incoming>,
) {
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let event = match serde_json::from_str::<Event>(&line) {
                Ok(mut event) => {
                    event.t_ms = crate::run_clock::since(start).as_millis() as u64;
                    event
                }
                // Anything that is not an event is still worth showing, never worth a crash.
                Err(_) => {
                    let mut event = Event::new(&worker, What::Output, line);
                    event.t_ms = crate::run_clock::since(start).as_millis() as u64;
                    event
                }
            };
            if to.send(Incoming::Event(Box::new(event))).is_err() {
                return;
            }
        }
        let _ = to.send(Incoming::Closed { worker, pid });
    });
}
