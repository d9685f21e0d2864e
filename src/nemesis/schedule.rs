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
//!
//! A step may also be **aimed at the work** rather than the clock: with `after`, its
//! `at_ms` counts from an event of the run — the `nth` time a worker reported that kind
//! of event — so that a fault lands at a point of the job (just after `A` took the lock,
//! between its read and its write):
//!
//! ```json
//! {"at_ms": 5, "after": {"worker": "A", "event": "read_record", "nth": 2},
//!  "fault": "pause", "target": "A", "duration_ms": 900}
//! ```
//!
//! An anchor may name several kinds, the first of which counts — "once W1 has said what it
//! found on waking, `lost` or `acquired`": `"event": ["lost", "acquired"]`.
//!
//! Such a step has no time until its event happens: the [`Player`] watches the run's
//! history ([`Player::observe`]) and times it then. If the event never comes, the step
//! never plays ([`Player::unplayed`] says which, [`Player::left`] also why).

use std::collections::HashSet;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::Fault;
use crate::events::{Event, Kind};

/// One fault of a schedule. A field it does not know is refused, not ignored: a
/// misspelt `duration_ms` would otherwise replay a schedule other than the one written.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    /// When, in milliseconds from the schedule's start — or from `after`'s event.
    pub at_ms: u64,
    /// The event of the run this step is timed from, instead of the schedule's start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Anchor>,
    pub fault: Fault,
    /// What it is aimed at, by the name the history gives it (`A`, `redis`, `m3`).
    pub target: String,
    /// For a pause: how long until the nemesis resumes it. For chaos's failover (a restart
    /// of `redis-primary`): how long its replica lags, frozen and its link cut, before the
    /// primary dies (none: the replica is in step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

/// A point of the work: the `nth` event of this kind from this worker (1: the first).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Anchor {
    pub worker: String,
    pub event: Kinds,
    #[serde(default = "first")]
    pub nth: u32,
}

fn first() -> u32 {
    1
}

/// The kind of event an anchor waits for — or any of several (`"lost"`, or
/// `["lost", "acquired"]`: whichever the worker reports).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Kinds {
    One(Kind),
    Any(Vec<Kind>),
}

impl Kinds {
    fn contains(&self, kind: Kind) -> bool {
        match self {
            Kinds::One(one) => *one == kind,
            Kinds::Any(any) => any.contains(&kind),
        }
    }
}

impl From<Kind> for Kinds {
    fn from(kind: Kind) -> Kinds {
        Kinds::One(kind)
    }
}

impl std::fmt::Display for Kinds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kinds::One(kind) => write!(f, "{kind}"),
            Kinds::Any(kinds) => {
                let names: Vec<String> = kinds.iter().map(Kind::to_string).collect();
                f.write_str(&names.join(" or "))
            }
        }
    }
}

impl Anchor {
    /// The `nth` event of `event`'s kind (or kinds) from `worker`.
    pub fn on(worker: &str, event: impl Into<Kinds>, nth: u32) -> Anchor {
        Anchor {
            worker: worker.into(),
            event: event.into(),
            nth,
        }
    }

    pub fn matches(&self, event: &Event) -> bool {
        event.worker == self.worker && self.event.contains(event.kind())
    }
}

impl Step {
    /// The words a timeline prints for when this step plays.
    pub fn when(&self) -> String {
        match &self.after {
            None => format!("at +{}ms", self.at_ms),
            Some(anchor) => format!(
                "{}ms after {}'s {} #{}",
                self.at_ms, anchor.worker, anchor.event, anchor.nth
            ),
        }
    }
}

/// One thing the nemesis does at one moment: a step, or the end of a timed pause.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    pub at_ms: u64,
    pub fault: Fault,
    pub target: String,
    /// The step (its place in the schedule) whose own fault this is; None for the resume
    /// that ends a timed pause.
    pub step: Option<usize>,
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
            if matches!(step.fault, Fault::Pause | Fault::Resume | Fault::Kill) && !is_worker {
                bail!(
                    "only a client ({}) can be paused or killed: '{}' is a server, which \
                     only restarts",
                    workers.join(", "),
                    step.target
                );
            }
            if matches!(step.fault, Fault::ClockStep | Fault::ClockRate) && !is_worker {
                bail!(
                    "only a worker's clock can be stepped (libfaketime crashes redis-server): '{}' is a server",
                    step.target
                );
            }
            if step.duration_ms.is_some() && step.fault != Fault::Pause {
                bail!(
                    "a {} takes no duration_ms: a pause does, and in chaos a delay and a cut \
                     ({} at {} ms)",
                    step.fault.as_str(),
                    step.fault.as_str(),
                    step.at_ms
                );
            }
        }
        for step in &self.steps {
            if let Some(anchor) = &step.after {
                if !workers.contains(&anchor.worker.as_str()) {
                    bail!(
                        "the schedule times a step after '{}', which is not a worker of this run",
                        anchor.worker
                    );
                }
                if anchor.nth == 0 {
                    bail!("an anchor's nth counts from 1 (the first event)");
                }
                if anchor.event == Kinds::Any(Vec::new()) {
                    bail!("an anchor names at least one kind of event");
                }
            }
        }
        // Steps timed from the work have no time yet: only the clock's steps can be checked
        // for order here; the player skips a fault whose victim cannot take it when it is due.
        let mut paused = HashSet::new();
        let mut gone = HashSet::new();
        for action in self.clock_actions() {
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
    /// Steps timed from an event are left out: they have no time until it happens.
    pub fn actions(&self) -> Vec<Action> {
        self.clock_actions()
    }

    fn clock_actions(&self) -> Vec<Action> {
        let mut actions: Vec<Action> = Vec::new();
        for (index, step) in self.steps.iter().enumerate() {
            if step.after.is_none() {
                actions.extend(step.actions_from(index, 0));
            }
        }
        // Stable: a resume due at the same moment as a step written later stays before it.
        actions.sort_by_key(|action| action.at_ms);
        actions
    }

    /// The same schedule without step `index` (for shrinking a failing schedule).
    pub fn without(&self, index: usize) -> Schedule {
        let mut steps = self.steps.clone();
        steps.remove(index);
        Schedule { steps }
    }

    /// The same schedule with step `index` replaced.
    pub fn with_step(&self, index: usize, step: Step) -> Schedule {
        let mut steps = self.steps.clone();
        steps[index] = step;
        Schedule::new(steps)
    }

    /// The schedule with every step aimed at or timed from `worker` left out.
    pub fn without_worker(&self, worker: &str) -> Schedule {
        let steps = self
            .steps
            .iter()
            .filter(|step| {
                step.target != worker && step.after.as_ref().is_none_or(|a| a.worker != worker)
            })
            .cloned()
            .collect();
        Schedule { steps }
    }
}

impl Step {
    /// The action of the schedule's `index`th step, `base_ms` being the moment its time
    /// counts from, and for a timed pause its resume.
    fn actions_from(&self, index: usize, base_ms: u64) -> Vec<Action> {
        let at_ms = base_ms.saturating_add(self.at_ms);
        let mut actions = vec![Action {
            at_ms,
            fault: self.fault,
            target: self.target.clone(),
            step: Some(index),
        }];
        if let (Fault::Pause, Some(duration)) = (self.fault, self.duration_ms) {
            actions.push(Action {
                at_ms: at_ms.saturating_add(duration),
                fault: Fault::Resume,
                target: self.target.clone(),
                step: None,
            });
        }
        actions
    }
}

/// Hands out a schedule's actions as their time comes: the lab's loop shows it every event
/// of the run ([`Player::observe`]) and asks it, on every tick, what is due by now.
pub struct Player {
    /// The schedule's steps, which the actions name by their place.
    steps: Vec<Step>,
    /// Actions with a time, not handed out yet, in time order.
    timed: Vec<Action>,
    /// Steps waiting for their event (by their place), with how many such events were
    /// seen so far.
    waiting: Vec<(usize, u32)>,
    /// When the last action handed out or timed is due.
    last_ms: u64,
}

impl Player {
    pub fn new(schedule: &Schedule) -> Player {
        let timed = schedule.clock_actions();
        let waiting = (schedule.steps.iter().enumerate())
            .filter(|(_, step)| step.after.is_some())
            .map(|(index, _)| (index, 0))
            .collect();
        let last_ms = timed.last().map_or(0, |action| action.at_ms);
        Player {
            steps: schedule.steps.clone(),
            timed,
            waiting,
            last_ms,
        }
    }

    /// Shows the player one event of the run (stamped on the run's clock, `t_ms`): a step
    /// waiting for it gets its time, counted from the event.
    pub fn observe(&mut self, event: &Event) {
        self.observe_at(event, event.t_ms);
    }

    /// [`Player::observe`], the event happening at `at_ms` on the schedule's clock (a lab
    /// whose schedule starts after its run's clock did: `t_ms` minus the schedule's start).
    pub fn observe_at(&mut self, event: &Event, at_ms: u64) {
        let mut now_timed = Vec::new();
        let steps = &self.steps;
        self.waiting.retain_mut(|(index, seen)| {
            let step = &steps[*index];
            let Some(anchor) = &step.after else {
                return false;
            };
            if !anchor.matches(event) {
                return true;
            }
            *seen += 1;
            if *seen < anchor.nth {
                return true;
            }
            now_timed.extend(step.actions_from(*index, at_ms));
            false
        });
        // Each after every action due no later: the order of the schedule is kept on ties.
        for action in now_timed {
            self.add(action);
        }
    }

    /// The actions due at or before `elapsed_ms` that were not handed out yet, in order.
    pub fn due(&mut self, elapsed_ms: u64) -> Vec<Action> {
        let due = self.timed.partition_point(|a| a.at_ms <= elapsed_ms);
        self.timed.drain(..due).collect()
    }

    /// Takes back the first timed action of `fault` on `target` not handed out yet: a
    /// pause's resume, while the pause waits for the moment it aims at. Hand it back with
    /// [`Player::add`], at its new time.
    pub fn withdraw(&mut self, target: &str, fault: Fault) -> Option<Action> {
        let at = (self.timed.iter()).position(|a| a.target == target && a.fault == fault)?;
        Some(self.timed.remove(at))
    }

    /// Adds an action, due at its `at_ms` (after every action due no later).
    pub fn add(&mut self, action: Action) {
        self.last_ms = self.last_ms.max(action.at_ms);
        let at = self.timed.partition_point(|a| a.at_ms <= action.at_ms);
        self.timed.insert(at, action);
    }

    /// Every action with a time was handed out, and no step waits for its event.
    pub fn done(&self) -> bool {
        self.timed.is_empty() && self.waiting.is_empty()
    }

    /// The steps whose event has not come (yet).
    pub fn unplayed(&self) -> Vec<&Step> {
        self.waiting.iter().map(|(i, _)| &self.steps[*i]).collect()
    }

    /// When the last action known so far is due.
    pub fn ends_at_ms(&self) -> u64 {
        self.last_ms
    }

    /// Once the run is over: the steps that did not play by the player's doing (by their
    /// place in the schedule), and why — their event never came, or their time did not.
    pub fn left(&self) -> Vec<(usize, String)> {
        let mut left: Vec<(usize, String)> = self
            .waiting
            .iter()
            .filter_map(|&(index, seen)| {
                let anchor = self.steps[index].after.as_ref()?;
                Some((index, never_came(anchor, seen)))
            })
            .collect();
        left.extend(
            (self.timed.iter())
                .filter_map(|action| Some((action.step?, not_reached(action.at_ms)))),
        );
        left.sort_by_key(|(index, _)| *index);
        left
    }
}

/// Why a step timed from `anchor` never played, `seen` of its events having come.
fn never_came(anchor: &Anchor, seen: u32) -> String {
    let had = match seen {
        0 => "none".to_string(),
        n => n.to_string(),
    };
    format!(
        "{}'s {} #{} never came ({} had reported {had})",
        anchor.worker, anchor.event, anchor.nth, anchor.worker
    )
}

/// Why an action due at `at_ms` on the schedule's clock never played.
pub fn not_reached(at_ms: u64) -> String {
    format!("it was due at +{at_ms}ms, and the run was over before")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(at_ms: u64, fault: Fault, target: &str, duration_ms: Option<u64>) -> Step {
        Step {
            at_ms,
            after: None,
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

    /// A lost reply reads by the name chaos prints (`lost-reply`) as well as by the one
    /// the JSON writes (`drop_reply`), and writes back as `drop_reply` (the history's word).
    #[test]
    fn a_lost_reply_reads_by_either_name_and_writes_as_drop_reply() {
        for name in ["lost-reply", "drop_reply"] {
            let text = format!(r#"[{{"at_ms":300,"fault":"{name}","target":"A→redis"}}]"#);
            let schedule: Schedule = serde_json::from_str(&text).unwrap();
            assert_eq!(schedule.steps()[0].fault, Fault::DropReply, "{name}");
            let written = serde_json::to_string(&schedule).unwrap();
            assert!(written.contains(r#""fault":"drop_reply""#), "{written}");
        }
        assert!(
            serde_json::from_str::<Schedule>(r#"[{"at_ms":0,"fault":"lost_reply","target":"A"}]"#)
                .is_err()
        );
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
        assert!(message(vec![step(0, Fault::Kill, "A", Some(5))]).contains("takes no duration_ms"));
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
        // A server is never paused nor killed: it only restarts.
        let server_paused = message(vec![step(100, Fault::Pause, "redis", Some(900))]);
        assert!(server_paused.contains("only a client"), "{server_paused}");
        assert!(server_paused.contains("(A, B)"), "{server_paused}");
        assert!(message(vec![step(0, Fault::Kill, "redis", None)]).contains("only a client"));
    }

    fn after(
        worker: &str,
        event: impl Into<Kinds>,
        nth: u32,
        at_ms: u64,
        fault: Fault,
        target: &str,
    ) -> Step {
        Step {
            after: Some(Anchor::on(worker, event, nth)),
            ..step(at_ms, fault, target, None)
        }
    }

    fn event(worker: &str, what: crate::events::What, t_ms: u64) -> Event {
        let mut event = Event::new(worker, what, "");
        event.t_ms = t_ms;
        event
    }

    #[test]
    fn an_anchored_step_reads_and_writes_json_and_nth_defaults_to_the_first() {
        let text = r#"[{"at_ms":5,"after":{"worker":"A","event":"acquired"},
                        "fault":"pause","target":"A","duration_ms":900}]"#;
        let schedule: Schedule = serde_json::from_str(text).unwrap();
        let anchored = Step {
            duration_ms: Some(900),
            ..after("A", Kind::Acquired, 1, 5, Fault::Pause, "A")
        };
        assert_eq!(schedule.steps(), &[anchored]);
        let again: Schedule =
            serde_json::from_str(&serde_json::to_string(&schedule).unwrap()).unwrap();
        assert_eq!(again, schedule);
        assert!(schedule.actions().is_empty(), "no time before its event");
    }

    #[test]
    fn an_anchored_step_is_timed_from_the_nth_matching_event_and_its_resume_follows() {
        use crate::events::What;
        let mut pause = after("A", Kind::Acquired, 2, 10, Fault::Pause, "A");
        pause.duration_ms = Some(100);
        let schedule = Schedule::new(vec![pause, step(50, Fault::Kill, "B", None)]);
        let mut player = Player::new(&schedule);
        assert!(!player.done());
        player.observe(&event("B", What::Acquired(Default::default()), 20));
        player.observe(&event("A", What::Working, 25));
        player.observe(&event("A", What::Acquired(Default::default()), 30));
        assert_eq!(
            player.unplayed().len(),
            1,
            "A's first grant is not the second"
        );
        let kill: Vec<Fault> = player.due(60).iter().map(|a| a.fault).collect();
        assert_eq!(kill, vec![Fault::Kill]);
        player.observe(&event("A", What::Acquired(Default::default()), 70));
        assert!(player.unplayed().is_empty());
        assert!(player.due(79).is_empty());
        let pause = player.due(80);
        assert_eq!((pause[0].fault, pause[0].at_ms), (Fault::Pause, 80));
        assert_eq!(player.ends_at_ms(), 180);
        let resume = player.due(10_000);
        assert_eq!((resume[0].fault, resume[0].at_ms), (Fault::Resume, 180));
        assert!(player.done());
    }

    #[test]
    fn a_resume_withdrawn_while_its_pause_waits_is_due_when_added_back() {
        let pause = step(10, Fault::Pause, "A", Some(100));
        let schedule = Schedule::new(vec![pause, step(50, Fault::Kill, "B", None)]);
        let mut player = Player::new(&schedule);
        assert_eq!(player.due(10)[0].fault, Fault::Pause);
        let resume = player
            .withdraw("A", Fault::Resume)
            .expect("the pause's resume");
        assert_eq!(resume.at_ms, 110);
        assert!(player.withdraw("A", Fault::Resume).is_none(), "only one");
        assert_eq!(player.due(200)[0].fault, Fault::Kill, "the rest stays");
        // The pause landed at 230: its resume is due its 100ms later.
        player.add(Action {
            at_ms: 330,
            ..resume
        });
        assert_eq!(player.ends_at_ms(), 330);
        assert!(player.due(329).is_empty());
        assert_eq!(player.due(330)[0].fault, Fault::Resume);
        assert!(player.done());
    }

    /// Once the run is over, the player names each step it never handed out by its place
    /// in the schedule as written, and why: its event never came (and how many of its kind
    /// did), or its time came after the run; a timed pause's resume is not a step.
    #[test]
    fn the_player_says_which_steps_never_played_and_why() {
        use crate::events::What;
        let pause = step(10, Fault::Pause, "B", Some(5_000));
        let schedule: Schedule = serde_json::from_value(serde_json::json!([
            {"at_ms": 900, "fault": "kill", "target": "C"},
            {"at_ms": 0, "after": {"worker": "A", "event": "read_record", "nth": 3},
             "fault": "kill", "target": "A"},
            serde_json::to_value(&pause).unwrap(),
        ]))
        .unwrap();
        let mut player = Player::new(&schedule);
        let read = || What::ReadRecord(Default::default());
        player.observe(&event("A", read(), 5));
        player.observe(&event("A", read(), 6));
        let handed: Vec<Option<usize>> = player.due(100).iter().map(|a| a.step).collect();
        assert_eq!(handed, vec![Some(2)], "the pause, by its place as written");
        assert_eq!(
            player.left(),
            vec![
                (
                    0,
                    "it was due at +900ms, and the run was over before".to_string()
                ),
                (
                    1,
                    "A's read_record #3 never came (A had reported 2)".to_string()
                ),
            ],
            "the pause's resume, still due, is not a step of its own"
        );
        let untouched = Player::new(&Schedule::new(vec![after(
            "B",
            Kind::Acquired,
            1,
            0,
            Fault::Kill,
            "B",
        )]));
        assert_eq!(
            untouched.left()[0].1,
            "B's acquired #1 never came (B had reported none)"
        );
    }

    #[test]
    fn anchors_are_checked_and_a_schedule_shrinks_by_step_and_by_worker() {
        let bad = Schedule::new(vec![after("C", Kind::Acquired, 1, 0, Fault::Kill, "A")]);
        let message = format!("{:#}", bad.validate(&["A", "B"], &[]).unwrap_err());
        assert!(message.contains("'C'"), "{message}");
        let zeroth = Schedule::new(vec![after("A", Kind::Acquired, 0, 0, Fault::Kill, "A")]);
        assert!(zeroth.validate(&["A"], &[]).is_err());
        let schedule = Schedule::new(vec![
            after("B", Kind::Acquired, 1, 0, Fault::Pause, "A"),
            step(10, Fault::Kill, "B", None),
            step(20, Fault::Restart, "redis", None),
        ]);
        assert_eq!(schedule.without(0).steps().len(), 2);
        let no_b = schedule.without_worker("B");
        assert_eq!(no_b.steps(), &[step(20, Fault::Restart, "redis", None)]);
    }

    #[test]
    fn an_anchor_on_several_kinds_is_timed_from_whichever_comes_first() {
        use crate::events::What;
        let text = r#"[{"at_ms":0,"after":{"worker":"W1","event":["lost","acquired"]},
                        "fault":"pause","target":"H","duration_ms":50}]"#;
        let schedule: Schedule = serde_json::from_str(text).unwrap();
        let either = Kinds::Any(vec![Kind::Lost, Kind::Acquired]);
        assert_eq!(
            schedule.steps()[0].after,
            Some(Anchor::on("W1", either.clone(), 1))
        );
        assert_eq!(
            serde_json::to_value(&schedule).unwrap()[0]["after"]["event"],
            serde_json::json!(["lost", "acquired"])
        );
        assert_eq!(
            schedule.steps()[0].when(),
            "0ms after W1's lost or acquired #1"
        );
        assert!(schedule.validate(&["H", "W1"], &[]).is_ok());
        let none = Schedule::new(vec![after(
            "W1",
            Kinds::Any(vec![]),
            1,
            0,
            Fault::Kill,
            "H",
        )]);
        assert!(none.validate(&["H", "W1"], &[]).is_err());

        let mut player = Player::new(&schedule);
        player.observe(&event("W1", What::Working, 10));
        player.observe(&event("H", What::Acquired(Default::default()), 20));
        assert_eq!(player.unplayed().len(), 1, "neither kind from W1 yet");
        player.observe(&event("W1", What::Acquired(Default::default()), 30));
        let pause = player.due(30);
        assert_eq!((pause[0].fault, pause[0].at_ms), (Fault::Pause, 30));
        player.observe(&event("W1", What::Acquired(Default::default()), 40));
        assert_eq!(player.due(10_000).len(), 1, "only the resume: counted once");
        assert!(player.done());
    }

    #[test]
    fn a_single_kind_still_reads_and_writes_as_a_plain_string() {
        let anchor = Anchor::on("A", Kind::Working, 1);
        let json = serde_json::to_value(&anchor).unwrap();
        assert_eq!(json["event"], "working");
        let back: Anchor = serde_json::from_value(json).unwrap();
        assert_eq!(back, anchor);
    }
}
