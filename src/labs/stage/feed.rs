//! A schedule's player fed from a stage's log: the nemesis's [`Cursor`] on a stage.

use super::Stage;
use crate::events::Event;
use crate::nemesis::play::Cursor;
use crate::nemesis::schedule::{Action, Player, Schedule, Step};

/// A schedule's [`Player`] shown a stage's events as they are logged (the schedule's
/// clock starts when the feed is made). For a play of its own beside the nemesis's
/// player (chaos's network, clock and lag players).
pub struct Feed(Cursor);

impl Feed {
    pub fn new(schedule: &Schedule, stage: &Stage) -> Feed {
        Feed(Cursor::new(schedule, stage))
    }

    /// Shows the player the events logged since it last looked (each also to `each`, in
    /// order), and hands out what fell due, with the time now on the schedule's clock.
    pub fn due(&mut self, stage: &Stage, each: impl FnMut(&Event)) -> (Vec<Action>, u64) {
        self.0.due(stage, each)
    }

    /// How many of the stage's events the player has been shown.
    pub fn seen(&self) -> usize {
        self.0.seen()
    }

    pub fn player(&self) -> &Player {
        self.0.player()
    }

    /// Once the play is over: the steps of `steps` that never played, and why.
    pub fn unplayed(&self, steps: &[Step], also: Vec<(usize, String)>) -> Vec<(Step, String)> {
        self.0.unplayed(steps, also)
    }
}
