//! A lab's faults, played as data: the lab writes its [`Schedule`] from its plan ("pause A
//! as soon as A is at work, for 3s"), and [`Stage::play`] plays it from the live history —
//! it shows the schedule's [`Player`] every event the stage logs, hands each action that
//! falls due to the nemesis, and returns once the lab's [`Until`] holds.
//!
//! ```text
//! lab ──> Schedule ──> Faults ──> stage.play(.., Until::done(..)) ──> nemesis ──> history
//!                        ▲                 │ events
//!                        └─── observe ◀────┘
//! ```
//!
//! The lab keeps its words (what the timeline says of each fault: [`Cue`]) and whatever it
//! watches while the faults play (a `tick`, as in [`Stage::run_until`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;

use super::{Feed, Stage};
use crate::events::Kind;
use crate::nemesis::schedule::{Action, Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note, Victim};
use crate::output::human;

/// What the lab is asked to put into words when its schedule acts.
pub struct Cue<'a> {
    pub action: &'a Action,
    /// The victim's process (before a restart: the one that is killed).
    pub pid: i32,
    /// For a resume: how long this play kept the victim paused.
    pub held: Option<Duration>,
    /// For a restart, once the server answers again: how long it was away.
    pub back_after: Option<Duration>,
}

/// A schedule being played on one stage, and the lab's words for its faults.
pub struct Faults<'w> {
    schedule: Schedule,
    feed: Feed,
    /// Actions due but not done yet (a play returns as soon as its `Until` holds).
    pending: VecDeque<Action>,
    paused_at: HashMap<String, Instant>,
    /// Victims that stop themselves: their pause is adopted, not sent.
    self_pausing: HashSet<String>,
    acted: Vec<Action>,
    /// Steps (by their place in the schedule) whose fault came due and was not done, and
    /// why: its victim was gone, or not in the state the fault needs.
    skipped: Vec<(usize, String)>,
    words: Box<dyn FnMut(&Cue) -> Note + 'w>,
}

impl<'w> Faults<'w> {
    /// The schedule, its clock starting now on `stage`'s clock; every event the stage
    /// logs from now on is shown to its player.
    pub fn new(schedule: &Schedule, stage: &Stage) -> Faults<'w> {
        Faults {
            schedule: schedule.clone(),
            feed: Feed::new(schedule, stage),
            pending: VecDeque::new(),
            paused_at: HashMap::new(),
            self_pausing: HashSet::new(),
            acted: Vec::new(),
            skipped: Vec::new(),
            words: Box::new(|cue| Note::from(plain_words(cue))),
        }
    }

    /// The lab's words for each fault, instead of the plain ones.
    pub fn saying(mut self, words: impl FnMut(&Cue) -> Note + 'w) -> Faults<'w> {
        self.words = Box::new(words);
        self
    }

    /// `victim` sends itself SIGSTOP at a point of its work (a worker that freezes itself):
    /// a pause due for it is adopted (checked, recorded, ended by the nemesis), not sent.
    pub fn self_pausing(mut self, victim: &str) -> Faults<'w> {
        self.self_pausing.insert(victim.into());
        self
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Every action was handed out and done (or skipped).
    pub fn finished(&self) -> bool {
        self.feed.player().done() && self.pending.is_empty()
    }

    /// Does this play hold a victim paused (a pause it started and has not ended)?
    pub fn holding(&self) -> bool {
        !self.paused_at.is_empty()
    }

    /// Has this play done `fault` to `target`?
    pub fn acted(&self, fault: Fault, target: &str) -> bool {
        self.acted
            .iter()
            .any(|a| a.fault == fault && a.target == target)
    }

    /// Once the play is over: the steps that did not play, in the schedule's order, and
    /// why — their event or their time never came, or their victim could not take them.
    pub fn unplayed(&self) -> Vec<(&Step, String)> {
        let mut left = self.feed.player().left();
        left.extend(
            (self.pending.iter())
                .filter_map(|a| Some((a.step?, crate::nemesis::schedule::not_reached(a.at_ms)))),
        );
        left.extend(self.skipped.iter().cloned());
        left.sort_by_key(|(index, _)| *index);
        (left.into_iter())
            .filter_map(|(index, why)| Some((self.schedule.steps().get(index)?, why)))
            .collect()
    }

    /// A fault that came due and was not done: its step did not play (a resume that ends
    /// a timed pause is not a step of its own).
    fn skip(&mut self, action: &Action, why: String) -> Result<()> {
        if let Some(index) = action.step {
            self.skipped.push((index, why));
        }
        Ok(())
    }

    /// Shows the player what the stage logged since it last looked, then queues what is due.
    fn catch_up(&mut self, stage: &Stage) {
        self.pending.extend(self.feed.due(stage, |_| {}).0);
    }

    /// Does one action, if its victim can take it now: a fault aimed at a victim not in
    /// the cast, gone, or not in the state it needs (a resume of what is not paused) is
    /// skipped, as the schedule says.
    fn act(
        &mut self,
        action: Action,
        stage: &mut Stage,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
    ) -> Result<()> {
        let target = action.target.clone();
        let gone = |faults: &Faults| match faults.acted(Fault::Kill, &target) {
            true => format!("{target} had been killed already"),
            false => format!("{target} had already exited"),
        };
        let Some(victim) = cast.iter_mut().find(|v| v.label() == action.target) else {
            return self.skip(&action, format!("this run has nothing named {target}"));
        };
        let Some(pid) = victim.pid() else {
            let why = gone(self);
            return self.skip(&action, why);
        };
        // A worker that has finished its work and exited is gone even while it waits to be
        // reaped (a zombie: state Z or X): a signal to it does nothing, and it never stops.
        if matches!(crate::procs::process_state(pid), None | Some('Z' | 'X')) {
            let why = gone(self);
            return self.skip(&action, why);
        }
        let paused = nemesis.paused().contains(&action.target);
        let cue = |held, back_after| Cue {
            action: &action,
            pid,
            held,
            back_after,
        };
        match action.fault {
            Fault::Pause if !paused => {
                let note = (self.words)(&cue(None, None));
                if self.self_pausing.contains(&target) {
                    nemesis.adopt_pause(stage, &**victim, note)?;
                } else {
                    nemesis.pause(stage, &**victim, note)?;
                }
                self.paused_at.insert(target, Instant::now());
            }
            Fault::Resume if paused => {
                let held = self.paused_at.remove(&target).map(|at| at.elapsed());
                let note = (self.words)(&cue(held, None));
                nemesis.resume(stage, &**victim, note)?;
            }
            Fault::Kill => {
                let note = (self.words)(&cue(None, None));
                nemesis.kill(stage, &mut **victim, note)?;
                self.paused_at.remove(&target);
            }
            Fault::Restart => {
                let note = (self.words)(&cue(None, None));
                let words = &mut self.words;
                nemesis.restart(stage, &mut **victim, note, |took| {
                    words(&cue(None, Some(took)))
                })?;
                self.paused_at.remove(&target);
            }
            Fault::Pause => return self.skip(&action, format!("{target} was paused already")),
            Fault::Resume => return self.skip(&action, format!("{target} was not paused")),
            other => bail!(
                "a lab's schedule plays pauses, kills and restarts; {} belongs to the network \
                 and clock labs' own players",
                other.as_str()
            ),
        }
        self.acted.push(action);
        Ok(())
    }
}

/// A lab's condition on its stage and its faults.
type Condition<'u> = Box<dyn FnMut(&Stage, &Faults) -> bool + 'u>;

/// When a play returns: a condition on the stage and the faults, within a time limit.
pub struct Until<'u> {
    what: String,
    within: Duration,
    /// A worker's error ends the play with it (it will not do what the play waits for).
    fails_on_error: bool,
    holds: Condition<'u>,
}

impl<'u> Until<'u> {
    /// Once every action of the schedule was done.
    pub fn done(within: Duration) -> Until<'u> {
        Until::holds("the schedule to play", within, |_, faults| {
            faults.finished()
        })
    }

    /// As soon as `fault` was done to `target` (the actions due with it wait for the next
    /// play): for a lab that does something of its own at that point.
    pub fn acted(fault: Fault, target: &str, within: Duration) -> Until<'u> {
        let target = target.to_string();
        Until::holds(
            &format!("the {} of {target}", fault.as_str()),
            within,
            move |_, faults| faults.acted(fault, &target),
        )
    }

    /// Once the lab's own condition holds (`what` names it if it never does).
    pub fn holds(
        what: &str,
        within: Duration,
        holds: impl FnMut(&Stage, &Faults) -> bool + 'u,
    ) -> Until<'u> {
        Until {
            what: what.into(),
            within,
            fails_on_error: true,
            holds: Box::new(holds),
        }
    }

    /// Plays on when a worker fails (a chaos client's failure is part of its history).
    pub fn tolerating_errors(mut self) -> Until<'u> {
        self.fails_on_error = false;
        self
    }
}

impl Stage {
    /// Plays `faults` on this stage until `until` holds: every event the stage logs goes
    /// to the schedule's player, every action due goes to the nemesis, aimed at the victim
    /// of `cast` that bears its target's name.
    pub fn play(
        &mut self,
        faults: &mut Faults,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
        until: Until,
    ) -> Result<()> {
        self.play_ticking(faults, nemesis, cast, until, |_| Ok(()))
    }

    /// [`Stage::play`], calling `tick` about every 5ms the way [`Stage::run_until`] does
    /// (a lab watching its lock in the backend while the faults play).
    pub fn play_ticking(
        &mut self,
        faults: &mut Faults,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
        mut until: Until,
        mut tick: impl FnMut(&mut Stage) -> Result<()>,
    ) -> Result<()> {
        let deadline = Instant::now() + until.within;
        loop {
            let looked = faults.feed.seen();
            faults.catch_up(self);
            let new_events = &self.log[looked.min(self.log.len())..];
            if let Some(failed) = new_events.iter().find(|e| e.kind() == Kind::Error)
                && until.fails_on_error
            {
                return Err(super::worker_failed(&failed.worker, &failed.text));
            }
            while !(until.holds)(self, faults) {
                let Some(action) = faults.pending.pop_front() else {
                    break;
                };
                faults.act(action, self, nemesis, cast)?;
            }
            if (until.holds)(self, faults) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "timed out after {} waiting for {}",
                    human(until.within),
                    until.what
                );
            }
            self.pump(Duration::from_millis(5), &mut tick)?;
            for victim in cast.iter_mut() {
                victim.reap_if_exited();
            }
        }
    }
}

/// The words of a fault when the lab gives none.
fn plain_words(cue: &Cue) -> String {
    let target = &cue.action.target;
    match (cue.action.fault, cue.back_after) {
        (Fault::Pause, _) => format!("pauses {target} (SIGSTOP)"),
        (Fault::Resume, _) => format!("resumes {target} (SIGCONT)"),
        (Fault::Kill, _) => format!("kills {target} (SIGKILL)"),
        (Fault::Restart, None) => format!("crashes {target} (SIGKILL), then starts it again"),
        (Fault::Restart, Some(took)) => format!("{target} back after {}", human(took)),
        (other, _) => format!("{} {target}", other.as_str()),
    }
}

/// The schedule in a few short lines, for a lab's intro and its `--step` stops: "the
/// faults this run plays".
pub fn lines(schedule: &Schedule) -> Vec<String> {
    let mut lines = vec!["The faults this run plays (its schedule, also in --json):".to_string()];
    for step in schedule.steps() {
        let lasting = step
            .duration_ms
            .map(|ms| format!(" for {}", human(Duration::from_millis(ms))))
            .unwrap_or_default();
        lines.push(format!(
            "  {} {}{lasting}, {}",
            step.fault.as_str(),
            step.target,
            step.when()
        ));
    }
    lines
}

/// Under `--step`, a part's schedule under its heading: [`lines`], dimmed (a lab whose
/// parts play different faults; the runner shows a whole run's under the intro).
pub fn show(stage: &Stage, schedule: &Schedule) {
    if super::step::stepping() {
        for line in lines(schedule) {
            stage.timeline.say(&format!("  {}", line.dimmed()));
        }
    }
}

#[cfg(test)]
mod tests;
