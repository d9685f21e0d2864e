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
//! An anchor may also wait for **several events at once**: all of them (`and`: timed from
//! the last to come) or any of them (`or`: from the first), each a worker's `nth` event of
//! a kind — "once A is frozen *and* B has taken the lock". With `within_ms` it gives up at
//! that time on the schedule's clock: the step is then a miss, and the player records it
//! in the history ([`crate::events::What::Missed`]) rather than waiting to the end:
//!
//! ```json
//! {"at_ms": 0, "after": {"worker": "A", "event": "frozen",
//!                        "and": [{"worker": "B", "event": "acquired"}], "within_ms": 8000},
//!  "fault": "resume", "target": "A"}
//! ```
//!
//! Such a step has no time until its event happens: the [`Player`] watches the run's
//! history ([`Player::observe`]) and times it then. If the event never comes, the step
//! never plays ([`Player::unplayed`] says which, [`Player::left`] also why).
//!
//! A fault that needs more than its name says how in [`How`] (which proxy fault a `cut`
//! is, how far a clock steps), beside the step's own fields. And a schedule may hold
//! **probes** ([`Probe`]): at their moment the player asks a backend a question (a key's
//! PTTL, an etcd lease's TTL, the sessions blocking one in Postgres) and records the
//! answer as an event of the history:
//!
//! ```json
//! {"at_ms": 0, "after": {"worker": "A", "event": "frozen"},
//!  "probe": {"ask": "pttl", "key": "lockslab:3f2a91c0:lock"}, "target": "redis"}
//! ```

mod player;
#[cfg(test)]
mod tests;
mod wire;

pub use player::{Due, Item, Player, not_reached};

use std::collections::HashSet;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use super::Fault;
use crate::events::{Event, Kind};
use crate::hosts::Sides;

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

/// A point of the work: the `nth` event of this kind from this worker (1: the first) —
/// and, with `and` or `or`, more points besides it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Anchor {
    pub worker: String,
    pub event: Kinds,
    #[serde(default = "first")]
    pub nth: u32,
    /// More points, all of which must come as well: the step is timed from the last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub and: Vec<Point>,
    /// More points, any of which will do instead: the step is timed from the first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub or: Vec<Point>,
    /// The latest time (ms on the schedule's clock) the step waits for its points: past
    /// it, the step is a miss, recorded as one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within_ms: Option<u64>,
}

/// One more point of an anchor: the `nth` event of a kind (or kinds) from a worker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Point {
    pub worker: String,
    pub event: Kinds,
    #[serde(default = "first")]
    pub nth: u32,
}

impl Point {
    pub fn on(worker: &str, event: impl Into<Kinds>, nth: u32) -> Point {
        Point {
            worker: worker.into(),
            event: event.into(),
            nth,
        }
    }

    pub fn matches(&self, event: &Event) -> bool {
        event.worker == self.worker && self.event.contains(event.kind())
    }
}

impl std::fmt::Display for Point {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}'s {} #{}", self.worker, self.event, self.nth)
    }
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
            and: Vec::new(),
            or: Vec::new(),
            within_ms: None,
        }
    }

    /// This point and `point` too: timed from whichever comes last.
    pub fn and(mut self, point: Point) -> Anchor {
        self.and.push(point);
        self
    }

    /// This point or `point`: timed from whichever comes first.
    pub fn or(mut self, point: Point) -> Anchor {
        self.or.push(point);
        self
    }

    /// Gives up at `ms` on the schedule's clock: then the step is a miss.
    pub fn within(mut self, ms: u64) -> Anchor {
        self.within_ms = Some(ms);
        self
    }

    /// Every point the anchor names, its own first.
    pub fn points(&self) -> Vec<Point> {
        let own = Point::on(&self.worker, self.event.clone(), self.nth);
        let more = self.and.iter().chain(&self.or).cloned();
        std::iter::once(own).chain(more).collect()
    }

    /// Does one point of several do (`or`), rather than all of them?
    pub fn any(&self) -> bool {
        !self.or.is_empty()
    }

    /// The anchor in words: `A's frozen #1 and B's acquired #1`.
    pub fn describe(&self) -> String {
        let join = if self.any() { " or " } else { " and " };
        let points: Vec<String> = self.points().iter().map(Point::to_string).collect();
        points.join(join)
    }
}

impl Step {
    /// The words a timeline prints for when this step plays.
    pub fn when(&self) -> String {
        match &self.after {
            None => format!("at +{}ms", self.at_ms),
            Some(anchor) => format!("{}ms after {}", self.at_ms, anchor.describe()),
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

/// How a fault is done, where its name does not say it all. Each field belongs to some
/// faults only; a fault without it is done its usual way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct How {
    /// A network fault: what the proxy does on the path (a `cut` that resets, or
    /// swallows bytes, or holds them). None: a `cut` holds, a `hold` holds, a `delay`
    /// delays the next chunk by `duration_ms`, a `drop_reply` loses one answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<crate::proxy::NetFault>,
    /// A network fault or its heal: which way on the path (None: `up`, the requests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<crate::proxy::Direction>,
    /// A `clock_step`: by how much (ms; negative: back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_ms: Option<i64>,
    /// A `clock_rate`: the worker's clock's speed, in percent of true time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_percent: Option<u32>,
    /// A `pause` of a replica: its replication link closed too, from its primary's side,
    /// so that it lags ([`super::replication`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_link: bool,
    /// A `pause` or a `delay` that its anchor only arms: it plays where the target's next
    /// write to the watched records reaches the target's proxy, after the anchor — frozen
    /// there, or that write held (the challenge's faults, `challenge::play::aim`). A
    /// player with no proxy in front of the target plays it at the anchor.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub at_write: bool,
    /// An `at_write` fault that plays at the commit of that write instead: the `COMMIT`
    /// that ends the transaction the write was sent in reaches the proxy, and is frozen
    /// there or held. A client that lets its lock go after its write and before its commit
    /// has the next holder read the record without that write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub at_commit: bool,
    /// A fault that holds a client's write (or freezes it in its work) plays the natural
    /// order when a newer holder of the record comes: that holder writes first, and the held
    /// write goes once it has answered — a stale write arriving last, where it erases the
    /// newer one unless the write itself refuses it. Otherwise the worst order plays: the
    /// held write lands between the newer holder's read and its write.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub newer_first: bool,
}

impl How {
    pub fn is_plain(&self) -> bool {
        *self == How::default()
    }
}

/// A question to a backend, asked at a moment of the schedule: its answer goes into the
/// history as an observation ([`crate::events::What::Probed`]), like a worker's event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probe {
    pub at_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<Anchor>,
    /// What is asked.
    pub probe: super::probe::Question,
    /// Whom: the backend, by the name the history gives it (`redis`, `etcd`, `postgres`).
    pub target: String,
}

/// Faults in the order they happen, and the probes asked among them. In JSON, one array:
/// a probe is the entry with a `probe` field.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    steps: Vec<Step>,
    /// How each step is done, by the step's place.
    hows: Vec<How>,
    probes: Vec<Probe>,
}

impl Schedule {
    /// A schedule of these steps, sorted by time (steps at the same time keep their order).
    pub fn new(steps: Vec<Step>) -> Schedule {
        Schedule::done_so(steps.into_iter().map(|s| (s, How::default())).collect())
    }

    /// A schedule of these steps, each with how it is done, sorted by time.
    pub fn done_so(mut steps: Vec<(Step, How)>) -> Schedule {
        steps.sort_by_key(|(step, _)| step.at_ms);
        let (steps, hows) = steps.into_iter().unzip();
        Schedule {
            steps,
            hows,
            probes: Vec::new(),
        }
    }

    /// Puts `step` last, whatever its time: a step added while the schedule plays must not
    /// move the steps already there, whose places the player's pending actions name.
    pub fn push_last(&mut self, step: Step, how: How) {
        self.steps.push(step);
        self.hows.push(how);
    }

    /// The same schedule, asking these probes too.
    pub fn probing(mut self, probes: Vec<Probe>) -> Schedule {
        self.probes.extend(probes);
        self.probes.sort_by_key(|probe| probe.at_ms);
        self
    }

    /// This schedule's steps, then `other`'s, in time order (each keeps how it is done).
    pub fn and(&self, other: &Schedule) -> Schedule {
        let pairs = |s: &Schedule| {
            s.steps
                .iter()
                .cloned()
                .zip(s.hows.iter().cloned())
                .collect::<Vec<_>>()
        };
        let mut steps = pairs(self);
        steps.extend(pairs(other));
        let probes = (self.probes.iter()).chain(&other.probes).cloned().collect();
        Schedule::done_so(steps).probing(probes)
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// How step `index` is done.
    pub fn how(&self, index: usize) -> &How {
        const PLAIN: How = How {
            proxy: None,
            direction: None,
            by_ms: None,
            rate_percent: None,
            cut_link: false,
            at_write: false,
            at_commit: false,
            newer_first: false,
        };
        self.hows.get(index).unwrap_or(&PLAIN)
    }

    pub fn probes(&self) -> &[Probe] {
        &self.probes
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty() && self.probes.is_empty()
    }

    /// Checks the schedule against what the run has to aim at, once, before anything
    /// starts: every target exists, only servers restart, and no victim is paused twice
    /// or acted on while a timed pause holds it.
    pub fn validate(&self, workers: &[&str], servers: &[&str]) -> Result<()> {
        for step in &self.steps {
            let is_worker = workers.contains(&step.target.as_str());
            let is_server = servers.contains(&step.target.as_str());
            if names_sides(step) {
                validate_sides(step, workers, servers)?;
                continue;
            }
            if step.fault == Fault::LeaderStall && (!is_server || step.duration_ms.is_none()) {
                bail!(
                    "a leader_stall is aimed at a cluster this run has ({}), with how long \
                    (duration_ms: past its election timeout): not '{}'{}",
                    servers.join(", "),
                    step.target,
                    if step.duration_ms.is_none() {
                        " without duration_ms"
                    } else {
                        ""
                    }
                );
            }
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
            if step.duration_ms.is_some()
                && !matches!(step.fault, Fault::Pause | Fault::LeaderStall)
            {
                bail!(
                    "a {} takes no duration_ms: a pause does, and in chaos a delay and a cut \
                     ({} at {} ms)",
                    step.fault.as_str(),
                    step.fault.as_str(),
                    step.at_ms
                );
            }
        }
        let anchors = (self.steps.iter().filter_map(|s| s.after.as_ref()))
            .chain(self.probes.iter().filter_map(|p| p.after.as_ref()));
        for anchor in anchors {
            anchor.validate(workers)?;
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
                Fault::Pause | Fault::LeaderStall if !paused.insert(target.clone()) => {
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
        let mut shorter = self.clone();
        shorter.steps.remove(index);
        if index < shorter.hows.len() {
            shorter.hows.remove(index);
        }
        shorter
    }

    /// The same schedule with step `index` replaced.
    pub fn with_step(&self, index: usize, step: Step) -> Schedule {
        let mut steps: Vec<(Step, How)> = (0..self.steps.len())
            .map(|i| (self.steps[i].clone(), self.how(i).clone()))
            .collect();
        steps[index].0 = step;
        Schedule::done_so(steps).probing(self.probes.clone())
    }

    /// The schedule with every step and probe aimed at or timed from `worker` left out.
    pub fn without_worker(&self, worker: &str) -> Schedule {
        let names = |after: &Option<Anchor>| {
            after
                .as_ref()
                .is_some_and(|a| a.points().iter().any(|p| p.worker == worker))
        };
        let steps = (0..self.steps.len())
            .filter(|&i| self.steps[i].target != worker && !names(&self.steps[i].after))
            .map(|i| (self.steps[i].clone(), self.how(i).clone()))
            .collect();
        let probes = (self.probes.iter())
            .filter(|probe| !names(&probe.after))
            .cloned()
            .collect();
        Schedule::done_so(steps).probing(probes)
    }
}

impl Anchor {
    /// Checks the anchor against the run's workers: each point names one, counts from 1
    /// and names a kind; `and` and `or` are not mixed.
    fn validate(&self, workers: &[&str]) -> Result<()> {
        if !self.and.is_empty() && !self.or.is_empty() {
            bail!(
                "an anchor waits for all of its points (and) or any of them (or), not both: {}",
                self.describe()
            );
        }
        for point in self.points() {
            if !workers.contains(&point.worker.as_str()) {
                bail!(
                    "the schedule times a step after '{}', which is not a worker of this run",
                    point.worker
                );
            }
            if point.nth == 0 {
                bail!("an anchor's nth counts from 1 (the first event)");
            }
            if point.event == Kinds::Any(Vec::new()) {
                bail!("an anchor names at least one kind of event");
            }
        }
        Ok(())
    }
}

impl Step {
    /// The action of the schedule's `index`th step, `base_ms` being the moment its time
    /// counts from, and for a timed pause its resume.
    pub(crate) fn actions_from(&self, index: usize, base_ms: u64) -> Vec<Action> {
        let at_ms = base_ms.saturating_add(self.at_ms);
        let mut actions = vec![Action {
            at_ms,
            fault: self.fault,
            target: self.target.clone(),
            step: Some(index),
        }];
        // A timed pause ends with its resume; a timed cut or hold with its heal.
        let end = match self.fault {
            Fault::Pause | Fault::LeaderStall => Some(Fault::Resume),
            Fault::Cut | Fault::Hold | Fault::Partition => Some(Fault::Heal),
            _ => None,
        };
        if let (Some(end), Some(duration)) = (end, self.duration_ms) {
            actions.push(Action {
                at_ms: at_ms.saturating_add(duration),
                fault: end,
                target: self.target.clone(),
                step: None,
            });
        }
        actions
    }
}

/// Does this step name a partition's sides (a partition, or the heal of one written as
/// its sides), rather than one process or proxy path?
fn names_sides(step: &Step) -> bool {
    step.fault == Fault::Partition
        || (step.fault == Fault::Heal && step.target.contains(['|', ',']))
}

/// Checks a partition's sides against the run: each names hosts, and a host is named
/// after what runs in it (a worker, a server).
fn validate_sides(step: &Step, workers: &[&str], servers: &[&str]) -> Result<()> {
    let sides: Sides = step.target.parse()?;
    let hosts: Vec<&str> = workers.iter().chain(servers).copied().collect();
    sides.pairs(&hosts)?;
    if step.duration_ms.is_some() && step.fault != Fault::Partition {
        bail!(
            "a heal takes no duration_ms ({} at {} ms)",
            step.target,
            step.at_ms
        );
    }
    Ok(())
}
