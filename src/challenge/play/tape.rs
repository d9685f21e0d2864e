//! The run's history as the challenge records it: each event stamped on the run's clock,
//! shown as it comes (a line of the timeline, or one JSON object under `--json`), and kept
//! for the grader. It is the floor the schedule's player reads and writes
//! ([`crate::nemesis::play::Floor`]).

use std::time::Instant;

use crate::events::{Event, What};
use crate::nemesis::Record;
use crate::nemesis::play::Floor;

/// The run's history: stamped on the run's clock and, as it comes, shown.
pub struct Tape {
    pub start: Instant,
    pub json: bool,
    pub events: Vec<Event>,
}

impl Record for Tape {
    fn record(&mut self, mut event: Event) {
        event.t_ms = self.start.elapsed().as_millis() as u64;
        if self.json {
            crate::output::json_line(&event);
        } else if !matches!(
            event.what,
            What::JobSent(_)
                | What::JobAnswered(_)
                | What::Acquired(_)
                | What::Working
                | What::Released(_)
                | What::Run(_)
                | What::PgWaitSeen(_)
                | What::PgLockSeen(_)
                | What::KeyWaitSeen(_)
                | What::LogReadBack(_)
        ) {
            crate::outln!("{:>7}ms  {:<4} {}", event.t_ms, event.worker, event.text);
        }
        self.events.push(event);
    }
}

impl Floor for Tape {
    fn events(&self) -> &[Event] {
        &self.events
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}
