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

/// One thing that happened, as a worker or the lab reports it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    /// Milliseconds since the lab started, stamped by the orchestrator on arrival.
    #[serde(default)]
    pub t_ms: u64,
    /// Who: a worker's name (`A`, `B`…) or the lab's own lane (`redis`, `lab`).
    pub worker: String,
    /// What, as a stable machine-readable word: `acquired`, `wrote`, `frozen`…
    pub kind: String,
    /// What, in a sentence for the timeline.
    pub text: String,
    /// The event's facts (`token`, `accepted`, `pid`…), flattened into the JSON object.
    #[serde(flatten)]
    pub data: Map<String, Value>,
}

impl Event {
    pub fn new(worker: &str, kind: &str, text: impl Into<String>) -> Event {
        Event {
            t_ms: 0,
            worker: worker.into(),
            kind: kind.into(),
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

    pub fn is(&self, worker: &str, kind: &str) -> bool {
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

    pub fn event(&self, kind: &str, text: impl Into<String>) -> Event {
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
    pub fn say(&self, kind: &str, text: impl Into<String>) {
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
    },
}

/// The orchestrator side: a thread that reads a worker's events, stamps them and forwards them.
pub fn forward(worker: String, stdout: ChildStdout, start: Instant, to: Sender<Incoming>) {
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
                    let mut event = Event::new(&worker, "output", line);
                    event.t_ms = start.elapsed().as_millis() as u64;
                    event
                }
            };
            if to.send(Incoming::Event(event)).is_err() {
                return;
            }
        }
        let _ = to.send(Incoming::Closed { worker });
    });
}
