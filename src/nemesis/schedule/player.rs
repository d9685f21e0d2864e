//! The schedule's clock: which step or probe is due when, from the time and the events of
//! the run. It acts on nothing itself (the nemesis's [`crate::nemesis::play`] does).

use super::{Action, Anchor, Fault, Schedule, Step};
use crate::events::Event;

/// A step or a probe of a schedule, by its place among its kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    Step(usize),
    Probe(usize),
}

/// What falls due, in time order: a fault, a probe to ask, or a step whose anchor did not
/// come within its time (a miss, with why).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Due {
    Fault(Action),
    Probe { at_ms: u64, index: usize },
    Missed { item: Item, why: String },
}

/// An anchored step or probe waiting for its points: how many events of each point came,
/// and when (schedule's clock) each point was reached.
struct Waiting {
    item: Item,
    anchor: Anchor,
    seen: Vec<u32>,
    reached: Vec<Option<u64>>,
}

impl Waiting {
    fn new(item: Item, anchor: &Anchor) -> Waiting {
        let points = anchor.points().len();
        Waiting {
            item,
            anchor: anchor.clone(),
            seen: vec![0; points],
            reached: vec![None; points],
        }
    }

    /// Counts `event` for every point it matches; returns the moment the anchor holds,
    /// once it does (all points reached: the last; `or`: the first).
    fn observe(&mut self, event: &Event, at_ms: u64) -> Option<u64> {
        for (i, point) in self.anchor.points().iter().enumerate() {
            if self.reached[i].is_none() && point.matches(event) {
                self.seen[i] += 1;
                if self.seen[i] >= point.nth {
                    self.reached[i] = Some(at_ms);
                }
            }
        }
        let reached = self.reached.iter().flatten().copied();
        if self.anchor.any() {
            reached.min()
        } else if self.reached.iter().all(Option::is_some) {
            reached.max()
        } else {
            None
        }
    }

    /// Why the anchor never held: its points that did not come, with how many of their
    /// kind did.
    fn never_came(&self) -> String {
        let points = self.anchor.points();
        let missing: Vec<String> = (points.iter().zip(&self.seen))
            .zip(&self.reached)
            .filter(|(_, reached)| reached.is_none())
            .map(|((point, seen), _)| {
                let had = match seen {
                    0 => "none".to_string(),
                    n => n.to_string(),
                };
                format!("{point} never came ({} had reported {had})", point.worker)
            })
            .collect();
        missing.join("; ")
    }
}

/// Hands out a schedule's actions as their time comes: the lab's loop shows it every event
/// of the run ([`Player::observe`]) and asks it, on every tick, what is due by now.
pub struct Player {
    /// The schedule's steps, which the actions name by their place.
    steps: Vec<Step>,
    /// Actions with a time, not handed out yet, in time order.
    timed: Vec<Action>,
    /// Probes with a time (ms, place), not asked yet, in time order.
    probes: Vec<(u64, usize)>,
    /// Each probe's own `at_ms`, by its place: for an anchored one, after its anchor.
    probe_offsets: Vec<u64>,
    /// Steps and probes waiting for their anchor.
    waiting: Vec<Waiting>,
    /// Steps and probes whose anchor did not come within its time, and why.
    missed: Vec<(Item, String)>,
    /// When the last action handed out or timed is due.
    last_ms: u64,
}

impl Player {
    pub fn new(schedule: &Schedule) -> Player {
        let timed = schedule.clock_actions();
        let mut waiting: Vec<Waiting> = (schedule.steps.iter().enumerate())
            .filter_map(|(i, step)| Some(Waiting::new(Item::Step(i), step.after.as_ref()?)))
            .collect();
        let mut probes = Vec::new();
        for (index, probe) in schedule.probes.iter().enumerate() {
            match &probe.after {
                Some(anchor) => waiting.push(Waiting::new(Item::Probe(index), anchor)),
                None => probes.push((probe.at_ms, index)),
            }
        }
        probes.sort_by_key(|(at_ms, _)| *at_ms);
        let last_ms = timed.last().map_or(0, |action| action.at_ms);
        Player {
            steps: schedule.steps.clone(),
            timed,
            probes,
            probe_offsets: schedule.probes.iter().map(|p| p.at_ms).collect(),
            waiting,
            missed: Vec::new(),
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
        let mut held = Vec::new();
        self.waiting
            .retain_mut(|waiting| match waiting.observe(event, at_ms) {
                Some(base_ms) => {
                    held.push((waiting.item, base_ms));
                    false
                }
                None => true,
            });
        // Each after every action due no later: the order of the schedule is kept on ties.
        for (item, base_ms) in held {
            match item {
                Item::Step(index) => {
                    for action in self.steps[index].actions_from(index, base_ms) {
                        self.add(action);
                    }
                }
                Item::Probe(index) => self.probe_at(index, base_ms),
            }
        }
    }

    /// The probe of place `index`, its anchor having held at `base_ms`: asked `at_ms`
    /// after.
    fn probe_at(&mut self, index: usize, base_ms: u64) {
        let at_ms = base_ms.saturating_add(self.probe_offsets.get(index).copied().unwrap_or(0));
        self.last_ms = self.last_ms.max(at_ms);
        let at = self.probes.partition_point(|(due, _)| *due <= at_ms);
        self.probes.insert(at, (at_ms, index));
    }

    /// The actions due at or before `elapsed_ms` that were not handed out yet, in order.
    pub fn due(&mut self, elapsed_ms: u64) -> Vec<Action> {
        let due = self.timed.partition_point(|a| a.at_ms <= elapsed_ms);
        self.timed.drain(..due).collect()
    }

    /// Everything due at or before `elapsed_ms`: the faults, the probes (a probe before a
    /// fault due at the same moment: look, then act), and the anchors whose time is up.
    pub fn due_all(&mut self, elapsed_ms: u64) -> Vec<Due> {
        let mut due: Vec<Due> = Vec::new();
        self.waiting
            .retain(|waiting| match waiting.anchor.within_ms {
                Some(within_ms) if within_ms <= elapsed_ms => {
                    let why = format!(
                        "{} by +{within_ms}ms: {}",
                        if waiting.anchor.any() {
                            "none of its events came"
                        } else {
                            "its events did not all come"
                        },
                        waiting.never_came()
                    );
                    self.missed.push((waiting.item, why.clone()));
                    due.push(Due::Missed {
                        item: waiting.item,
                        why,
                    });
                    false
                }
                _ => true,
            });
        let probes = self
            .probes
            .partition_point(|(at_ms, _)| *at_ms <= elapsed_ms);
        let mut timed: Vec<(u64, Due)> = (self.probes.drain(..probes))
            .map(|(at_ms, index)| (at_ms, Due::Probe { at_ms, index }))
            .collect();
        timed.extend((self.due(elapsed_ms).into_iter()).map(|a| (a.at_ms, Due::Fault(a))));
        // Stable: the probes were put first.
        timed.sort_by_key(|(at_ms, _)| *at_ms);
        due.extend(timed.into_iter().map(|(_, due)| due));
        due
    }

    /// Takes back the first timed action of `fault` on `target` not handed out yet: a
    /// pause's resume, while the pause waits for the moment it aims at. Hand it back with
    /// [`Player::add`], at its new time.
    pub fn withdraw(&mut self, target: &str, fault: Fault) -> Option<Action> {
        let at = (self.timed.iter()).position(|a| a.target == target && a.fault == fault)?;
        Some(self.timed.remove(at))
    }

    /// Takes back `action` if it was not handed out yet (a timed pause's own resume,
    /// which no other action equals: it names no step, and its time is the pause's).
    pub fn withdraw_action(&mut self, action: &Action) -> Option<Action> {
        let at = self.timed.iter().position(|a| a == action)?;
        Some(self.timed.remove(at))
    }

    /// Adds an action, due at its `at_ms` (after every action due no later).
    pub fn add(&mut self, action: Action) {
        self.last_ms = self.last_ms.max(action.at_ms);
        let at = self.timed.partition_point(|a| a.at_ms <= action.at_ms);
        self.timed.insert(at, action);
    }

    /// Every action and probe with a time was handed out, and nothing waits for its event.
    pub fn done(&self) -> bool {
        self.timed.is_empty() && self.probes.is_empty() && self.waiting.is_empty()
    }

    /// The steps whose event has not come (yet).
    pub fn unplayed(&self) -> Vec<&Step> {
        (self.waiting.iter())
            .filter_map(|w| match w.item {
                Item::Step(index) => Some(&self.steps[index]),
                Item::Probe(_) => None,
            })
            .collect()
    }

    /// When the last action known so far is due.
    pub fn ends_at_ms(&self) -> u64 {
        self.last_ms
    }

    /// Once the run is over: the steps that did not play by the player's doing (by their
    /// place in the schedule), and why — their event never came (or not in time), or
    /// their time did not.
    pub fn left(&self) -> Vec<(usize, String)> {
        let mut left: Vec<(usize, String)> = (self.waiting.iter())
            .filter_map(|waiting| match waiting.item {
                Item::Step(index) => Some((index, waiting.never_came())),
                Item::Probe(_) => None,
            })
            .collect();
        left.extend((self.missed.iter()).filter_map(|(item, why)| match item {
            Item::Step(index) => Some((*index, why.clone())),
            Item::Probe(_) => None,
        }));
        left.extend(
            (self.timed.iter())
                .filter_map(|action| Some((action.step?, not_reached(action.at_ms)))),
        );
        left.sort_by_key(|(index, _)| *index);
        left
    }
}

/// Why an action due at `at_ms` on the schedule's clock never played.
pub fn not_reached(at_ms: u64) -> String {
    format!("it was due at +{at_ms}ms, and the run was over before")
}
