//! The player's part for a play whose moments are partly the lab's to pick: the challenge.
//! Its schedule anchors a pause on a client's `writing` note, yet the pause lands as that
//! client's write reaches its proxy; a resume waits until the client's lock is gone; a
//! kill aimed at an answer lands before lockslab reads it. So the lab takes what falls due
//! ([`Faults::take_due`]), holds a step back or hands it back later ([`Faults::withdraw`],
//! [`Faults::add`]), and has it done by the player when its moment comes, in its own words
//! ([`Faults::act_saying`]) — or adds a step at the moment it sees ([`Faults::play_now`]).
//! Either way the nemesis does the fault and the schedule that `--json` carries holds it.

use std::time::Duration;

use anyhow::Result;

use super::{Cue, Faults, Floor};
use crate::events::Event;
use crate::nemesis::schedule::{Action, Due, How};
use crate::nemesis::{Fault, Nemesis, Note, Victim};
use crate::proxy::{Direction, Proxy};

impl<'w> Faults<'w> {
    /// Shows the player what the floor logged since it last looked, and takes out
    /// everything due by now: the lab decides when each is done.
    pub fn take_due(&mut self, floor: &mut impl Floor) -> Vec<Due> {
        self.catch_up(floor);
        self.pending.drain(..).collect()
    }

    /// Shows the player an event the floor has not logged yet (a client's answer, before
    /// lockslab reads it): a step anchored on it falls due at once. When the floor logs it,
    /// it is not counted a second time.
    pub fn foresee(&mut self, floor: &mut impl Floor, event: &Event) {
        self.catch_up(floor);
        let at = self.schedule_ms(event.t_ms);
        self.cursor.player.observe_at(event, at);
        (self.cursor.foreseen).push((event.worker.clone(), event.kind()));
    }

    /// Takes back the first timed `fault` on `target` not handed out yet: a pause's resume,
    /// while the pause waits for the moment it aims at. Hand it back with [`Faults::add`].
    pub fn withdraw(&mut self, target: &str, fault: Fault) -> Option<Action> {
        self.cursor.player.withdraw(target, fault)
    }

    /// Hands an action to the player, due at its `at_ms` on the schedule's clock.
    pub fn add(&mut self, action: Action) {
        self.cursor.player.add(action);
    }

    /// A moment of the floor's clock (an event's `t_ms`) on the schedule's clock.
    pub fn schedule_ms(&self, t_ms: u64) -> u64 {
        t_ms.saturating_sub(self.cursor.origin_ms)
    }

    /// The time now on the schedule's clock.
    pub fn now_ms(&self, floor: &impl Floor) -> u64 {
        self.cursor.now_ms(floor)
    }

    /// Does `due` now (see [`Faults::act`]), in the lab's words.
    pub fn act_saying(
        &mut self,
        due: Due,
        words: Note,
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
    ) -> Result<()> {
        self.words_now = Some(Box::new(move |_| words));
        let done = self.act(due, floor, nemesis, cast);
        // A fault skipped said nothing: its words are not left for the next one.
        self.words_now = None;
        done
    }

    /// Adds a step due now (see [`Faults::now_done_so`]) and plays it at once, with words
    /// made from its cue: a fault whose moment the lab saw come (a newer holder held after
    /// its read; a replica frozen once so many jobs are answered).
    pub fn play_now(
        &mut self,
        (floor, nemesis, cast): (&mut impl Floor, &mut Nemesis, &mut [&mut dyn Victim]),
        (fault, target, how): (Fault, &str, How),
        words: impl FnOnce(&Cue) -> Note + 'w,
    ) -> Result<()> {
        let before = self.pending.len();
        self.now_done_so(floor, (fault, target, how), words);
        let added: Vec<Due> = self.pending.drain(before..).collect();
        for due in added {
            self.act(due, floor, nemesis, cast)?;
        }
        self.words_now = None;
        Ok(())
    }

    /// The victims this play holds paused (paused by it, not resumed yet), by name.
    pub fn paused(&self) -> Vec<String> {
        let mut paused: Vec<String> = self.paused_at.keys().cloned().collect();
        paused.sort();
        paused
    }

    /// A network step whose fault the proxy put on by itself, told beforehand to catch a
    /// write (a delay armed at a client's note): the write is caught now, and the step
    /// plays — recorded now, on `proxy`'s path.
    pub fn caught(
        &mut self,
        action: Action,
        proxy: &Proxy,
        words: Note,
        (floor, nemesis): (&mut impl Floor, &mut Nemesis),
    ) {
        nemesis.net_caught(floor, proxy, Direction::Up, action.fault, words);
        self.acted.push(action);
    }

    /// Lets what `proxy` holds on its path go (a caught write's delay is over, or the lab
    /// lets it go early), recorded as the fault's end; returns how long it lasted.
    pub fn let_go(
        &mut self,
        proxy: &Proxy,
        words: Note,
        (floor, nemesis): (&mut impl Floor, &mut Nemesis),
    ) -> Duration {
        nemesis.heal_net(floor, proxy, Direction::Up, words)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::What;
    use crate::events::facts::ChallengeJob;
    use crate::events::{Event, Kind};
    use crate::nemesis::Record;
    use crate::nemesis::schedule::{Anchor, Schedule, Step};

    /// A floor whose clock the test sets.
    #[derive(Default)]
    struct Log {
        events: Vec<Event>,
        now_ms: u64,
    }

    impl Record for Log {
        fn record(&mut self, mut event: Event) {
            event.t_ms = self.now_ms;
            self.events.push(event);
        }
    }

    impl Floor for Log {
        fn events(&self) -> &[Event] {
            &self.events
        }
        fn now_ms(&self) -> u64 {
            self.now_ms
        }
    }

    fn answer(worker: &str, t_ms: u64) -> Event {
        let mut event = Event::new(worker, What::JobAnswered(ChallengeJob::default()), "");
        event.t_ms = t_ms;
        event
    }

    fn kill_at_answer(nth: u32) -> Step {
        Step {
            at_ms: 0,
            after: Some(Anchor::on("A", Kind::JobAnswered, nth)),
            fault: Fault::Kill,
            target: format!("A{nth}"),
            duration_ms: None,
        }
    }

    fn targets(due: &[Due]) -> Vec<String> {
        (due.iter())
            .filter_map(|due| match due {
                Due::Fault(action) => Some(action.target.clone()),
                _ => None,
            })
            .collect()
    }

    /// An answer shown to the player before it is read (a kill aimed at it lands first)
    /// counts once: logged afterwards, it is not the next answer.
    #[test]
    fn an_event_foreseen_is_counted_once() {
        let mut log = Log::default();
        let schedule = Schedule::new(vec![kill_at_answer(1), kill_at_answer(2)]);
        let mut faults = Faults::new(&schedule, &log);
        log.now_ms = 10;
        faults.foresee(&mut log, &answer("A", 10));
        assert_eq!(targets(&faults.take_due(&mut log)), ["A1"]);
        log.record(answer("A", 0));
        assert!(
            faults.take_due(&mut log).is_empty(),
            "the same answer again"
        );
        log.now_ms = 20;
        log.record(answer("A", 0));
        assert_eq!(targets(&faults.take_due(&mut log)), ["A2"]);
    }

    /// A step added now, while a later step waits for its time, goes last: the waiting
    /// step keeps its place, and each action names the step it belongs to.
    #[test]
    fn a_step_added_now_does_not_move_a_later_step() {
        let mut log = Log::default();
        let later = Step {
            at_ms: 500,
            after: None,
            fault: Fault::Kill,
            target: "B".into(),
            duration_ms: None,
        };
        let mut faults = Faults::new(&Schedule::new(vec![later]), &log);
        log.now_ms = 100;
        assert!(faults.take_due(&mut log).is_empty(), "B's time is later");
        faults.now(&log, Fault::Kill, "A", Note::default());
        log.now_ms = 600;
        let due = faults.take_due(&mut log);
        assert_eq!(targets(&due), ["A", "B"]);
        let steps = faults.schedule().steps();
        for due in &due {
            if let Due::Fault(action) = due {
                let step = &steps[action.step.expect("a step's own fault")];
                assert_eq!(step.target, action.target, "{steps:?}");
            }
        }
    }

    /// A timed pause's resume taken back while the pause waits for its moment, and handed
    /// back at a later time, falls due then and not before.
    #[test]
    fn a_resume_withdrawn_falls_due_when_handed_back() {
        let mut log = Log::default();
        let pause = Step {
            at_ms: 0,
            after: None,
            fault: Fault::Pause,
            target: "A".into(),
            duration_ms: Some(50),
        };
        let mut faults = Faults::new(&Schedule::new(vec![pause]), &log);
        let due = faults.take_due(&mut log);
        assert_eq!(targets(&due), ["A"]);
        let resume = faults
            .withdraw("A", Fault::Resume)
            .expect("the pause's resume");
        assert_eq!(resume.at_ms, 50);
        log.now_ms = 60;
        assert!(faults.take_due(&mut log).is_empty(), "withdrawn");
        faults.add(Action {
            at_ms: faults.now_ms(&log) + 50,
            ..resume
        });
        log.now_ms = 100;
        assert!(faults.take_due(&mut log).is_empty(), "not yet");
        log.now_ms = 110;
        let due = faults.take_due(&mut log);
        assert!(
            matches!(&due[..], [Due::Fault(a)] if a.fault == Fault::Resume),
            "{due:?}"
        );
    }
}
