//! Lab 6's faults as data. Each part of a scenario is a [`Schedule`] of faults aimed at
//! masters (`m1`…), timed from the part's start or from A's round — the lab's own client,
//! whose `acquired` or `gave_up` is an event of the history like a worker's — and played
//! by the nemesis's one player ([`Scene::play_until`]). The lab keeps its words for each
//! fault ([`master_words`]) and what it does between two faults (a client's round).
//!
//! ```text
//!  restart-empty   kill m4, m5 at +0 │ A's round │ restart m4, m5, m3 right after it
//! ```

use std::time::Duration;

use anyhow::Result;

use super::scene::{Scene, name};
use crate::events::Kind;
use crate::events::facts::FaultFacts;
use crate::labs::faults::{Cue, Faults, Until};
use crate::nemesis::schedule::{Anchor, Kinds, Schedule, Step};
use crate::nemesis::{Fault, Note};
use crate::output::human;

/// A's round ended: it holds the lock, or it gave up.
fn a_round() -> Anchor {
    Anchor::on("A", Kinds::Any(vec![Kind::Acquired, Kind::GaveUp]), 1)
}

/// `fault` on each of `masters`, as soon as the part starts.
pub(super) fn at_start(fault: Fault, masters: &[usize]) -> Vec<Step> {
    steps(fault, masters, None, 0)
}

/// `fault` on each of `masters`, `at_ms` after A's round.
pub(super) fn after_a(fault: Fault, masters: &[usize], at_ms: u64) -> Vec<Step> {
    steps(fault, masters, Some(a_round()), at_ms)
}

fn steps(fault: Fault, masters: &[usize], after: Option<Anchor>, at_ms: u64) -> Vec<Step> {
    (masters.iter())
        .map(|&i| Step {
            at_ms,
            after: after.clone(),
            fault,
            target: name(i),
            duration_ms: None,
        })
        .collect()
}

/// What the timeline says of a fault on a master, by the master's name and port.
fn master_words(ports: Vec<(String, String)>) -> impl FnMut(&Cue) -> Note {
    move |cue| {
        let master = &cue.action.target;
        let port = (ports.iter())
            .find(|(name, _)| name == master)
            .map_or("?", |(_, port)| port.as_str());
        let pid = cue.pid;
        let words = match (cue.action.fault, cue.back_after) {
            (_, Some(took)) => format!(
                "{master} back on :{port} in {}, EMPTY (no persistence)",
                human(took)
            ),
            (Fault::Kill, _) => format!("SIGKILL {master} (pid {pid}, port {port}): down"),
            (Fault::Restart, _) => format!("SIGKILL {master} (pid {pid}, port {port}): crashes"),
            (Fault::Pause, _) => {
                format!("SIGSTOP {master} (pid {pid}): accepts connections, answers nothing")
            }
            (Fault::Resume, _) => format!("SIGCONT {master}: it serves what queued up meanwhile"),
            (other, _) => format!("{} {master}", other.as_str()),
        };
        let facts = FaultFacts {
            master: Some(master.clone()),
            ..FaultFacts::default()
        };
        Note::new(words, facts)
    }
}

impl Scene {
    /// A part's faults, their clock starting now, in the lab's words (shown under its
    /// heading with `--step`; in `--json` with the history's other schedules).
    pub(super) fn faults(&self, schedule: &Schedule) -> Faults<'static> {
        crate::labs::faults::show(&self.stage, schedule);
        let ports = (0..self.n()).map(|i| (name(i), self.port(i))).collect();
        Faults::new(schedule, &self.stage).saying(master_words(ports))
    }

    /// Plays `faults` until `fault` was done to each of `masters` (what falls due with it
    /// waits for the next play).
    pub(super) fn play_until(
        &mut self,
        faults: &mut Faults,
        fault: Fault,
        masters: &[usize],
    ) -> Result<()> {
        let targets: Vec<String> = masters.iter().map(|&i| name(i)).collect();
        let what = format!("the {} of {}", fault.as_str(), targets.join(", "));
        // A restart may wait out a TTL (restart-delayed) before a slow start.
        let within = self.settings.ttl + Duration::from_secs(30);
        let done = Until::holds(&what, within, move |_, faults| {
            targets.iter().all(|target| faults.acted(fault, target))
        });
        self.play(faults, done)
    }
}
