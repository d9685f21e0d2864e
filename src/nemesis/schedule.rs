//! A schedule: which faults, aimed at what, and when — as data a lab writes by hand, a
//! generator draws from a seed, and `--json` can carry so a run can be replayed.
//!
//! ```json
//! [{"at_ms": 200, "fault": "pause", "target": "A", "duration_ms": 3000},
//!  {"at_ms": 900, "fault": "restart", "target": "redis"}]
//! ```
//!
//! A pause with a duration ends by itself: the schedule turns it into two actions, the
//! pause and its resume. A pause without one lasts until the lab resumes it.

use std::collections::HashSet;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::Fault;

/// One fault of a schedule.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// When, in milliseconds from the schedule's start.
    pub at_ms: u64,
    pub fault: Fault,
    /// What it is aimed at, by the name the history gives it (`A`, `redis`, `m3`).
    pub target: String,
    /// For a pause: how long until the nemesis resumes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// One thing the nemesis does at one moment: a step, or the end of a timed pause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    pub at_ms: u64,
    pub fault: Fault,
    pub target: String,
}

/// Faults in the order they happen.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Schedule {
    steps: Vec<Step>,
}

impl Schedule {
    /// A schedule of these steps, sorted by time (steps at the same time keep their order).
    pub fn new(mut steps: Vec<Step>) -> Schedule {
        steps.sort_by_key(|step| step.at_ms);
        Schedule { steps }
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// Checks the schedule against what the run has to aim at, once, before anything
    /// starts: every target exists, only servers restart, and no victim is paused twice
    /// or acted on while a timed pause holds it.
    pub fn validate(&self, workers: &[&str], servers: &[&str]) -> Result<()> {
        for step in &self.steps {
            let is_worker = workers.contains(&step.target.as_str());
            let is_server = servers.contains(&step.target.as_str());
            if !is_worker && !is_server {
                bail!(
                    "the schedule aims {} at '{}', which this run does not have (it has {})",
                    step.fault.as_str(),
                    step.target,
                    workers
                        .iter()
                        .chain(servers)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            if step.fault == Fault::Restart && !is_server {
                bail!("only a server can restart: '{}' is a worker", step.target);
            }
            if matches!(step.fault, Fault::ClockStep | Fault::ClockRate) && !is_worker {
                bail!(
                    "only a worker's clock can be stepped (libfaketime crashes redis-server): '{}' is a server",
                    step.target
                );
            }
            if step.duration_ms.is_some() && step.fault != Fault::Pause {
                bail!(
                    "only a pause has a duration ({} at {} ms)",
                    step.fault.as_str(),
                    step.at_ms
                );
            }
        }
        let mut paused = HashSet::new();
        let mut gone = HashSet::new();
        for action in self.actions() {
            let target = action.target.clone();
            if gone.contains(&target) {
                bail!(
                    "the schedule aims {} at '{target}' at {} ms, after it was killed",
                    action.fault.as_str(),
                    action.at_ms
                );
            }
            match action.fault {
                Fault::Pause if !paused.insert(target.clone()) => {
                    bail!("'{target}' is paused twice (at {} ms)", action.at_ms)
                }
                Fault::Resume if !paused.remove(&target) => {
                    bail!(
                        "'{target}' is resumed at {} ms without a pause",
                        action.at_ms
                    )
                }
                Fault::Kill if workers.contains(&target.as_str()) => {
                    paused.remove(&target);
                    gone.insert(target);
                }
                Fault::Kill | Fault::Restart => {
                    paused.remove(&target);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Every action in time order, each timed pause followed (at its end) by its resume.
    pub fn actions(&self) -> Vec<Action> {
        let mut actions: Vec<Action> = Vec::new();
        for step in &self.steps {
            actions.push(Action {
                at_ms: step.at_ms,
                fault: step.fault,
                target: step.target.clone(),
            });
            if let (Fault::Pause, Some(duration)) = (step.fault, step.duration_ms) {
                actions.push(Action {
                    at_ms: step.at_ms.saturating_add(duration),
                    fault: Fault::Resume,
                    target: step.target.clone(),
                });
            }
        }
        // Stable: a resume due at the same moment as a step written later stays before it.
        actions.sort_by_key(|action| action.at_ms);
        actions
    }
}

/// Hands out a schedule's actions as their time comes: the lab's loop asks it, on every
/// tick, what is due by now.
pub struct Player {
    actions: Vec<Action>,
    next: usize,
}

impl Player {
    pub fn new(schedule: &Schedule) -> Player {
        Player {
            actions: schedule.actions(),
            next: 0,
        }
    }

    /// The actions due at or before `elapsed_ms` that were not handed out yet, in order.
    pub fn due(&mut self, elapsed_ms: u64) -> Vec<Action> {
        let start = self.next;
        while self
            .actions
            .get(self.next)
            .is_some_and(|action| action.at_ms <= elapsed_ms)
        {
            self.next += 1;
        }
        self.actions[start..self.next].to_vec()
    }

    pub fn done(&self) -> bool {
        self.next == self.actions.len()
    }

    /// When the last action is due.
    pub fn ends_at_ms(&self) -> u64 {
        self.actions.last().map_or(0, |action| action.at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(at_ms: u64, fault: Fault, target: &str, duration_ms: Option<u64>) -> Step {
        Step {
            at_ms,
            fault,
            target: target.into(),
            duration_ms,
        }
    }

    #[test]
    fn a_schedule_reads_and_writes_the_json_it_documents() {
        let text = r#"[{"at_ms":200,"fault":"pause","target":"A","duration_ms":3000},
                       {"at_ms":900,"fault":"restart","target":"redis"}]"#;
        let schedule: Schedule = serde_json::from_str(text).unwrap();
        assert_eq!(
            schedule.steps(),
            &[
                step(200, Fault::Pause, "A", Some(3000)),
                step(900, Fault::Restart, "redis", None)
            ]
        );
        let again: Schedule =
            serde_json::from_str(&serde_json::to_string(&schedule).unwrap()).unwrap();
        assert_eq!(again, schedule);
    }

    #[test]
    fn a_timed_pause_becomes_a_pause_and_its_resume_in_time_order() {
        let schedule = Schedule::new(vec![
            step(900, Fault::Restart, "redis", None),
            step(200, Fault::Pause, "A", Some(3000)),
        ]);
        let actions = schedule.actions();
        let actions: Vec<(u64, Fault, &str)> = actions
            .iter()
            .map(|a| (a.at_ms, a.fault, a.target.as_str()))
            .collect();
        assert_eq!(
            actions,
            vec![
                (200, Fault::Pause, "A"),
                (900, Fault::Restart, "redis"),
                (3200, Fault::Resume, "A"),
            ]
        );
    }

    #[test]
    fn the_player_hands_out_each_action_once_when_it_is_due() {
        let schedule = Schedule::new(vec![
            step(100, Fault::Pause, "A", Some(50)),
            step(120, Fault::Kill, "B", None),
        ]);
        let mut player = Player::new(&schedule);
        assert!(player.due(99).is_empty());
        assert_eq!(player.due(100).len(), 1);
        assert!(player.due(100).is_empty(), "handed out once");
        let late: Vec<Fault> = player.due(1_000).iter().map(|a| a.fault).collect();
        assert_eq!(late, vec![Fault::Kill, Fault::Resume]);
        assert!(player.done());
        assert_eq!(player.ends_at_ms(), 150);
    }

    #[test]
    fn validation_names_what_is_wrong() {
        let workers = ["A", "B"];
        let servers = ["redis"];
        let check = |steps| Schedule::new(steps).validate(&workers, &servers);
        let message = |steps| format!("{:#}", check(steps).unwrap_err());

        assert!(check(vec![step(0, Fault::Pause, "A", Some(10))]).is_ok());
        assert!(message(vec![step(0, Fault::Kill, "C", None)]).contains("'C'"));
        assert!(message(vec![step(0, Fault::Restart, "A", None)]).contains("only a server"));
        assert!(
            message(vec![step(0, Fault::ClockStep, "redis", None)])
                .contains("only a worker's clock")
        );
        assert!(check(vec![step(0, Fault::ClockStep, "A", None)]).is_ok());
        assert!(message(vec![step(0, Fault::Kill, "A", Some(5))]).contains("only a pause"));
        assert!(
            message(vec![
                step(0, Fault::Pause, "A", Some(100)),
                step(50, Fault::Pause, "A", None)
            ])
            .contains("paused twice")
        );
        assert!(message(vec![step(0, Fault::Resume, "A", None)]).contains("without a pause"));
        assert!(
            message(vec![
                step(0, Fault::Kill, "A", None),
                step(10, Fault::Pause, "A", None)
            ])
            .contains("after it was killed")
        );
        // A server comes back after a kill only by a restart; pausing it after a restart is fine.
        assert!(
            check(vec![
                step(0, Fault::Restart, "redis", None),
                step(10, Fault::Pause, "redis", Some(5))
            ])
            .is_ok()
        );
    }
}
