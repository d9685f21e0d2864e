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

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The version of the `--json` shapes documented in docs/json.md; raised whenever a field
/// changes meaning or goes away (new fields do not raise it).
pub const JSON_VERSION: u32 = 2;

/// What happened: the one vocabulary every worker, lab and backend probe reports in.
/// In JSON it is the `kind` field, in snake_case (`Kind::GaveUp` is `"gave_up"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    // A worker and its lock.
    /// Started, and asks for the lock (its pid, lease or session with it).
    Waiting,
    /// The backend granted the lock (`owner`, `token`).
    Acquired,
    /// No lock within the wait (`why`).
    GaveUp,
    /// About to stop itself with SIGSTOP.
    Freezing,
    /// Running again after a freeze (`paused_ms` when it saw its own clock jump).
    Resumed,
    Working,
    /// Told to finish its work.
    Finished,
    /// Wrote to the store (`outcome`, `token`, `value`).
    Wrote,
    /// Let go (`released`: the lock was still its own; `found_owner` on Redis).
    Released,
    /// Its heartbeat or session learned that the lock is gone (`why`).
    Lost,
    /// Between two commands of a non-atomic acquisition (lab 2's SETNX then PEXPIRE).
    Between,
    /// Ready for the next trial (lab 2's race).
    Ready,
    /// One trial's report (lab 2's race).
    Trial,
    /// A queue worker claimed a job (lab 3).
    Claimed,
    /// A queue worker committed a job (lab 3).
    Committed,
    /// A queue worker's statement failed after the lab resumed it (lab 3).
    FinishFailed,
    /// Failed; the run stops.
    Error,
    /// A line from a worker that was not an event.
    Output,

    // The lab, and what it saw in the backends.
    /// A run of the lab begins (its id and keys).
    Run,
    /// Workers started (lab 2).
    Workers,
    /// A worker stopped with SIGSTOP.
    Frozen,
    /// A worker ended with SIGKILL.
    Killed,
    /// A backend ended a lease, a key or a session.
    Expired,
    /// A lock key went without its TTL (deleted, flushed, evicted, lost in a restart).
    Vanished,
    /// Who the backend says holds the lock now.
    HolderNow,
    /// A frozen worker's job processed by another (lab 3).
    TakenOver,
    /// A killed worker's job claimed again (lab 3).
    Reclaimed,
    /// A round of jobs done (lab 3).
    Round,
    /// What became of the frozen or killed worker's job (lab 3).
    FreezeResult,
    KillResult,
    /// A worker's session as Postgres lists it (lab 3).
    Session,
    /// Sessions blocked behind a frozen worker's row lock, as `pg_blocking_pids` says (lab 3).
    Blocked,
    /// A killed worker's job that nothing will hand back (lab 3).
    JobLost,
    /// A key's remaining time to live as Redis answers it (lab 2).
    Pttl,
    /// Two holders at once, as the evidence shows (lab 2).
    TwoHolders,
    /// A broken lock's failure counted (lab 2).
    Violation,
    /// A broken lock that did not fail this time (lab 2).
    Counted,
    /// Every job processed exactly once (lab 3).
    ExactlyOnce,
    /// A dead holder's lock lapsed with its TTL (lab 2).
    Lapsed,
    /// A holder kept its lock to the end (lab 2).
    Kept,
    Warning,
    /// The store decided an old holder's write after the next holder's, and took it.
    StaleWriteAccepted,
    /// The store decided an old holder's write after the next holder's, and refused it.
    StaleWriteRejected,
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

/// One thing that happened, as a worker or the lab reports it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    /// Milliseconds since the lab started, stamped by the orchestrator on arrival.
    #[serde(default)]
    pub t_ms: u64,
    /// Who: a worker's name (`A`, `B`…) or the lab's own lane (`redis`, `lab`).
    pub worker: String,
    /// What, from the one vocabulary: `acquired`, `wrote`, `frozen`…
    pub kind: Kind,
    /// What, in a sentence for the timeline.
    pub text: String,
    /// The event's facts (`token`, `accepted`, `pid`…), flattened into the JSON object.
    #[serde(flatten)]
    pub data: Map<String, Value>,
}

impl Event {
    pub fn new(worker: &str, kind: Kind, text: impl Into<String>) -> Event {
        Event {
            t_ms: 0,
            worker: worker.into(),
            kind,
            text: text.into(),
            data: Map::new(),
        }
    }

    /// Adds a fact: `Event::new(..).with("token", 34)`.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Event {
        self.data.insert(key.into(), value.into());
        self
    }

    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.data.get(key).and_then(Value::as_i64)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.data.get(key).and_then(Value::as_str)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.data.get(key).and_then(Value::as_bool)
    }

    pub fn is(&self, worker: &str, kind: Kind) -> bool {
        self.worker == worker && self.kind == kind
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

    pub fn event(&self, kind: Kind, text: impl Into<String>) -> Event {
        Event::new(&self.worker, kind, text)
    }

    pub fn send(&self, event: Event) {
        let mut out = io::stdout().lock();
        // A closed pipe means the orchestrator is gone; the worker is about to be killed anyway.
        let _ = serde_json::to_writer(&mut out, &event);
        let _ = out.write_all(b"\n");
        let _ = out.flush();
    }

    /// Shorthand for an event with no facts.
    pub fn say(&self, kind: Kind, text: impl Into<String>) {
        self.send(self.event(kind, text));
    }
}

/// What arrives on the orchestrator's channel.
#[derive(Debug)]
pub enum Incoming {
    Event(Event),
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
                    event.t_ms = start.elapsed().as_millis() as u64;
                    event
                }
                // Anything that is not an event is still worth showing, never worth a crash.
                Err(_) => {
                    let mut event = Event::new(&worker, Kind::Output, line);
                    event.t_ms = start.elapsed().as_millis() as u64;
                    event
                }
            };
            if to.send(Incoming::Event(event)).is_err() {
                return;
            }
        }
        let _ = to.send(Incoming::Closed { worker, pid });
    });
}
