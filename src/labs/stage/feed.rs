//! A schedule's player fed from a stage's log.

use super::Stage;
use crate::events::Event;
use crate::nemesis::schedule::{Action, Player, Schedule, Step};

/// A schedule's [`Player`] shown a stage's events as they are logged. The schedule's clock
/// starts when the feed is made (the stage's clock ran before: a lab's setup, its workers'
/// start), so an event's time is counted from there.
pub struct Feed {
    player: Player,
    /// The stage's time (ms) at which the schedule's clock starts.
    origin_ms: u64,
    /// How many of the stage's logged events the player has been shown.
    seen: usize,
}

impl Feed {
    pub fn new(schedule: &Schedule, stage: &Stage) -> Feed {
        Feed {
            player: Player::new(schedule),
            origin_ms: stage.elapsed().as_millis() as u64,
            seen: stage.log.len(),
        }
    }

    /// Shows the player the events logged since it last looked (each also to `each`, in
    /// order), and hands out what fell due, with the time now on the schedule's clock.
    pub fn due(&mut self, stage: &Stage, mut each: impl FnMut(&Event)) -> (Vec<Action>, u64) {
        for event in &stage.log[self.seen.min(stage.log.len())..] {
            let at = event.t_ms.saturating_sub(self.origin_ms);
            self.player.observe_at(event, at);
            each(event);
        }
        self.seen = stage.log.len();
        let now = (stage.elapsed().as_millis() as u64).saturating_sub(self.origin_ms);
        (self.player.due(now), now)
    }

    /// How many of the stage's events the player has been shown.
    pub fn seen(&self) -> usize {
        self.seen
    }

    pub fn player(&self) -> &Player {
        &self.player
    }

    /// Once the play is over: the steps of `steps` that never played, in the schedule's
    /// order, and why — those whose event or time never came, and `also` (by their place:
    /// the ones the player came to and could not do).
    pub fn unplayed(&self, steps: &[Step], also: Vec<(usize, String)>) -> Vec<(Step, String)> {
        let mut left = self.player.left();
        left.extend(also);
        left.sort_by_key(|(index, _)| *index);
        (left.into_iter())
            .filter_map(|(index, why)| Some((steps.get(index)?.clone(), why)))
            .collect()
    }
}
