//! A lab's faults, played as data: the lab writes its [`Schedule`] from its plan ("pause A
//! as soon as A is at work, for 3s"), and [`Stage::play`] plays it from the live history —
//! the nemesis's one player ([`Faults`], in [`crate::nemesis::play`]) is shown every event
//! the stage logs and does each fault and probe that falls due; the play returns once the
//! lab's [`Until`] holds.
//!
//! ```text
//! lab ──> Schedule ──> Faults ──> stage.play(.., Until::done(..)) ──> nemesis ──> history
//!                        ▲                 │ events
//!                        └─── observe ◀────┘
//! ```
//!
//! The lab keeps its words (what the timeline says of each fault: [`Cue`]) and whatever it
//! watches while the faults play (a `tick`, as in [`Stage::run_until`]).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;

use super::Stage;
use crate::events::Kind;
use crate::nemesis::schedule::{How, Schedule};
use crate::nemesis::{Fault, Nemesis, Victim};
use crate::output::human;
use crate::proxy::Proxy;

pub use crate::nemesis::play::{Cue, Faults};

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

    /// Once what the events logged so far made due was done — at once if they made
    /// nothing due: for a lab that plays its faults between two steps of its own work (a
    /// fault timed from a master's answer, before the client asks the next one), never
    /// waiting for a fault to come.
    pub fn nothing_due(within: Duration) -> Until<'u> {
        Until::holds("the faults due now", within, |_, faults| !faults.due())
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
            let looked = faults.seen();
            faults.catch_up(self);
            let new_events = &self.log[looked.min(self.log.len())..];
            if let Some(failed) = new_events.iter().find(|e| e.kind() == Kind::Error)
                && until.fails_on_error
            {
                return Err(super::worker_failed(&failed.worker, &failed.text));
            }
            while !(until.holds)(self, faults) {
                let Some(due) = faults.next_due() else {
                    break;
                };
                faults.act(due, self, nemesis, cast)?;
            }
            faults.watch(self, nemesis, cast)?;
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

impl Stage {
    /// Plays one fault now, with `words`, as a step added to `faults`'s schedule (see
    /// [`Faults::now`]): for a fault whose moment and words the lab reads from the run
    /// just before it. Returns once it was done (or skipped).
    pub fn play_now(
        &mut self,
        faults: &mut Faults,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
        (fault, target): (Fault, &str),
        words: impl Into<crate::nemesis::Note>,
    ) -> Result<()> {
        let how = (fault, target, How::default());
        self.play_now_done_so(faults, nemesis, cast, how, words)
    }

    /// [`Stage::play_now`], done as `how` says (see [`Faults::now_done_so`]).
    pub fn play_now_done_so(
        &mut self,
        faults: &mut Faults,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
        (fault, target, how): (Fault, &str, How),
        words: impl Into<crate::nemesis::Note>,
    ) -> Result<()> {
        let (done, skipped) = (faults.done_count(), faults.skipped().len());
        let note = words.into();
        faults.now_done_so(self, (fault, target, how), move |_| note);
        let what = format!("the {} of {target}", fault.as_str());
        let played = Until::holds(&what, Duration::from_secs(30), |_, faults| {
            faults.done_count() > done || faults.skipped().len() > skipped
        });
        self.play(faults, nemesis, cast, played)
    }
}

/// The nemesis of a play whose faults come when the lab says so (a moment read from a
/// server, not a time or an event), and the schedule that grows as they come: each fault
/// is a step added at its moment ([`Faults::now`]) and played by the nemesis's player.
pub struct Hand<'w> {
    faults: Faults<'w>,
    /// Declared last: dropped after the play, resuming whatever it left paused.
    nemesis: Nemesis,
}

impl<'w> Hand<'w> {
    /// An empty schedule, its clock starting now on `stage`'s.
    pub fn new(stage: &Stage) -> Hand<'w> {
        Hand {
            faults: Faults::new(&Schedule::default(), stage),
            nemesis: Nemesis::new(),
        }
    }

    /// Network faults aimed at `proxy`'s path are played on it.
    pub fn on_path(mut self, proxy: &'w Proxy) -> Hand<'w> {
        self.faults = self.faults.on_path(proxy);
        self
    }

    /// Plays `fault` on the path named `path` now, done as `how` says, with `words`.
    pub fn net(
        &mut self,
        stage: &mut Stage,
        (fault, path, how): (Fault, &str, How),
        words: impl Into<crate::nemesis::Note>,
    ) -> Result<()> {
        let (faults, nemesis) = (&mut self.faults, &mut self.nemesis);
        stage.play_now_done_so(faults, nemesis, &mut [], (fault, path, how), words)
    }

    /// Plays `fault` on `victim` now, with `words`.
    pub fn play(
        &mut self,
        stage: &mut Stage,
        victim: &mut dyn Victim,
        fault: Fault,
        words: impl Into<crate::nemesis::Note>,
    ) -> Result<()> {
        let target = victim.label();
        let (faults, nemesis) = (&mut self.faults, &mut self.nemesis);
        stage.play_now(faults, nemesis, &mut [victim], (fault, &target), words)
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
