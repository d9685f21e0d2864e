//! The one player: a [`Schedule`] played from the live history, every fault of every kind
//! done by the [`Nemesis`] and every probe asked of its backend.
//!
//! ```text
//! Schedule ──> Faults ──(due)──> nemesis: pause/resume/kill/restart  (a victim in the cast)
//!                │                        lag: pause + cut its link  (a replica, its primary)
//!                ▲                        cut/hold/delay/drop/heal   (a proxy path)
//!                │                        clock_step/clock_rate      (a worker's clock)
//!                │               probe:   pttl/lease_ttl/blocking    (a backend)
//!                │               miss:    an anchor that did not come in time
//!                └──── observe ◀──── every event the floor logs (the run's history)
//! ```
//!
//! A lab registers what its schedule aims at — its proxy paths, its workers' clocks, the
//! backends it may ask — and hands the processes (workers, servers, cluster members) to
//! each play (`cast`, which it borrows mutably only for as long as a play lasts). The lab
//! keeps its words: what the timeline says of each fault ([`Cue`]).
//!
//! Everything the player does is an event of the history: a fault's start and end, a
//! probe's answer ([`crate::events::What::Probed`]), a step that missed its moment
//! ([`crate::events::What::Missed`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

mod hosts;

use super::clock::WorkerClock;
use super::probe::{self, Ask};
use super::replication::Link;
use super::schedule::{Action, Due, Item, Player, Schedule, Step};
use super::{Fault, Held, Nemesis, Note, Record, Victim};
use crate::events::facts::FaultFacts;
use crate::events::facts::Missed;
use crate::events::{Event, What};
use crate::hosts::Hosts;
use crate::output::human;
use crate::proxy::{Direction, NetFault, Proxy};

/// Where a play happens: a history the player reads (every event logged so far, in
/// order) and writes (through [`Record`]), on a clock.
pub trait Floor: Record {
    fn events(&self) -> &[Event];
    /// The floor's clock, in ms: the events' `t_ms` count from the same start.
    fn now_ms(&self) -> u64;
    /// Schedule `play` (a number of its own) is being played here, as it stands now (a
    /// run keeps the latest of each for its `--json`).
    fn playing(&mut self, play: u64, schedule: &Schedule) {
        let _ = (play, schedule);
    }
}

/// A schedule's [`Player`] fed from a floor's events as they are logged. The schedule's
/// clock starts when the cursor is made (the floor's clock ran before: a lab's setup, its
/// workers' start), so an event's time is counted from there.
pub struct Cursor {
    player: Player,
    /// The floor's time (ms) at which the schedule's clock starts.
    origin_ms: u64,
    /// How many of the floor's events the player has been shown.
    seen: usize,
}

impl Cursor {
    pub fn new(schedule: &Schedule, floor: &impl Floor) -> Cursor {
        Cursor {
            player: Player::new(schedule),
            origin_ms: floor.now_ms(),
            seen: floor.events().len(),
        }
    }

    /// Shows the player the events logged since it last looked (each also to `each`), and
    /// hands out what fell due, with the time now on the schedule's clock.
    pub fn due_all(&mut self, floor: &impl Floor, mut each: impl FnMut(&Event)) -> (Vec<Due>, u64) {
        let now = self.look(floor, &mut each);
        (self.player.due_all(now), now)
    }

    /// [`Cursor::due_all`], the faults only (a play that has no probes nor time limits).
    pub fn due(&mut self, floor: &impl Floor, mut each: impl FnMut(&Event)) -> (Vec<Action>, u64) {
        let now = self.look(floor, &mut each);
        (self.player.due(now), now)
    }

    fn look(&mut self, floor: &impl Floor, each: &mut impl FnMut(&Event)) -> u64 {
        let events = floor.events();
        for event in &events[self.seen.min(events.len())..] {
            let at = event.t_ms.saturating_sub(self.origin_ms);
            self.player.observe_at(event, at);
            each(event);
        }
        self.seen = events.len();
        floor.now_ms().saturating_sub(self.origin_ms)
    }

    /// How many of the floor's events the player has been shown.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// The time now on the schedule's clock.
    pub fn now_ms(&self, floor: &impl Floor) -> u64 {
        floor.now_ms().saturating_sub(self.origin_ms)
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

/// What the lab is asked to put into words when its schedule acts.
pub struct Cue<'a> {
    pub action: &'a Action,
    /// The victim's process (before a restart: the one that is killed); 0 for a path.
    pub pid: i32,
    /// For a resume: how long this play kept the victim paused.
    pub held: Option<Duration>,
    /// For a restart, once the server answers again: how long it was away.
    pub back_after: Option<Duration>,
    /// How the step is done (a cut's proxy fault, a clock's step).
    pub how: &'a super::schedule::How,
    /// For a replica's lag (a pause that cuts its link): how many links the cut closed
    /// (None: the cut failed).
    pub links_closed: Option<u64>,
}

/// A schedule being played, what it aims at besides processes, and the lab's words.
pub struct Faults<'w> {
    schedule: Schedule,
    cursor: Cursor,
    /// Faults, probes and misses due but not done yet (a play returns as soon as its
    /// condition holds).
    pending: VecDeque<Due>,
    paused_at: HashMap<String, Instant>,
    /// Victims that stop themselves: their pause is adopted, not sent.
    self_pausing: HashSet<String>,
    acted: Vec<Action>,
    /// Steps (by their place in the schedule) whose fault came due and was not done, and
    /// why: its victim was gone, or not in the state the fault needs.
    skipped: Vec<(usize, String)>,
    words: Box<dyn FnMut(&Cue) -> Note + 'w>,
    /// The proxy paths network faults aim at, by their name (`A→redis`).
    paths: Vec<&'w Proxy>,
    /// The workers' clocks clock faults aim at, by the worker's name.
    clocks: Vec<(String, &'w WorkerClock)>,
    /// The backends probes ask, by their name in the history.
    askers: Vec<Box<dyn Ask + 'w>>,
    /// The replicas whose link a lagging pause cuts, with their primary.
    links: Vec<Link<'w>>,
    /// Was the floor told that this schedule plays there (since it last grew)?
    announced: bool,
    /// This play's number among the process's plays, for the floor.
    id: u64,
    /// The words of the step added by [`Faults::now`], for it alone.
    words_now: Option<Words<'w>>,
    /// The hosts partitions cut apart and heal.
    hosts: Option<&'w Hosts>,
    /// Who leads each cluster a leader's stall may be aimed at, asked when it is due.
    leaders: Vec<(String, Leader<'w>)>,
    /// Each cluster's leader stalled by this play and not resumed yet, by cluster.
    stalled: HashMap<String, String>,
}

/// Names the victim that leads a cluster now (None: none does).
type Leader<'w> = Box<dyn Fn() -> Option<String> + 'w>;

/// The words of one fault, made from its cue.
type Words<'w> = Box<dyn FnOnce(&Cue) -> Note + 'w>;

/// Numbers the plays, so a floor can tell a schedule that grew from another.
static PLAYS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl<'w> Faults<'w> {
    /// The schedule, its clock starting now on `floor`'s clock; every event the floor
    /// logs from now on is shown to its player.
    pub fn new(schedule: &Schedule, floor: &impl Floor) -> Faults<'w> {
        Faults {
            schedule: schedule.clone(),
            cursor: Cursor::new(schedule, floor),
            pending: VecDeque::new(),
            paused_at: HashMap::new(),
            self_pausing: HashSet::new(),
            acted: Vec::new(),
            skipped: Vec::new(),
            words: Box::new(|cue| Note::from(plain_words(cue))),
            paths: Vec::new(),
            clocks: Vec::new(),
            askers: Vec::new(),
            links: Vec::new(),
            announced: false,
            id: PLAYS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            words_now: None,
            hosts: None,
            leaders: Vec::new(),
            stalled: HashMap::new(),
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

    /// Network faults aimed at `proxy`'s path are played on it.
    pub fn on_path(mut self, proxy: &'w Proxy) -> Faults<'w> {
        self.paths.push(proxy);
        self
    }

    /// Partitions (and their heals) are played on `hosts`.
    pub fn on_hosts(mut self, hosts: &'w Hosts) -> Faults<'w> {
        self.hosts = Some(hosts);
        self
    }

    /// A leader's stall aimed at `cluster` stalls the victim `leader` names when it is due.
    pub fn on_leader(
        mut self,
        cluster: &str,
        leader: impl Fn() -> Option<String> + 'w,
    ) -> Faults<'w> {
        self.leaders.push((cluster.into(), Box::new(leader)));
        self
    }

    /// Clock faults aimed at `worker` are played on `clock` (the one it was started with).
    pub fn on_clock(mut self, worker: &str, clock: &'w WorkerClock) -> Faults<'w> {
        self.clocks.push((worker.into(), clock));
        self
    }

    /// Probes aimed at `backend`'s name are asked of it.
    pub fn asking(mut self, backend: impl Ask + 'w) -> Faults<'w> {
        self.askers.push(Box::new(backend));
        self
    }

    /// A pause of `replica` that cuts its link (`how.cut_link`) closes it on the primary
    /// `primary_url` names at that moment ([`super::replication`]).
    pub fn on_replica(
        mut self,
        replica: &str,
        primary_url: impl Fn() -> String + 'w,
    ) -> Faults<'w> {
        self.links.push(Link::new(replica, primary_url));
        self
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Every action was handed out and done (or skipped).
    pub fn finished(&self) -> bool {
        self.cursor.player().done() && self.pending.is_empty()
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

    /// How many of the floor's events the player has been shown.
    pub fn seen(&self) -> usize {
        self.cursor.seen()
    }

    /// The steps (by their place) that came due and were not done so far, and why.
    pub fn skipped(&self) -> &[(usize, String)] {
        &self.skipped
    }

    /// Shows the player what the floor logged since it last looked, then queues what is
    /// due.
    pub fn catch_up(&mut self, floor: &mut impl Floor) {
        if !self.announced {
            self.announced = true;
            floor.playing(self.id, &self.schedule);
        }
        self.pending.extend(self.cursor.due_all(floor, |_| {}).0);
    }

    /// Adds a step to the schedule, due now, with its words: a fault whose moment and
    /// words only the lab knows when it comes (what Postgres counted just before it). The
    /// schedule grows into the faults as played, times and all, which `--json` carries.
    /// The next play does it.
    pub fn now(&mut self, floor: &impl Floor, fault: Fault, target: &str, words: Note) {
        let how = super::schedule::How::default();
        self.now_done_so(floor, (fault, target, how), move |_| words);
    }

    /// [`Faults::now`], done as `how` says, with words made from the fault's cue once it
    /// is done (a lag's words say how many links its cut closed).
    pub fn now_done_so(
        &mut self,
        floor: &impl Floor,
        (fault, target, how): (Fault, &str, super::schedule::How),
        words: impl FnOnce(&Cue) -> Note + 'w,
    ) {
        let step = Step {
            at_ms: self.cursor.now_ms(floor),
            after: None,
            fault,
            target: target.into(),
            duration_ms: None,
        };
        let index = self.schedule.steps().len();
        let added = Schedule::done_so(vec![(step.clone(), how)]);
        self.schedule = self.schedule.and(&added);
        self.pending.extend(
            step.actions_from(index, step.at_ms)
                .into_iter()
                .map(Due::Fault),
        );
        self.words_now = Some(Box::new(words));
        self.announced = false;
    }

    /// How many faults this play has done.
    pub fn done_count(&self) -> usize {
        self.acted.len()
    }

    /// The words for `cue`: the lab's, or those given with the step added now.
    fn say(&mut self, cue: &Cue) -> Note {
        match self.words_now.take() {
            Some(words) if cue.back_after.is_none() => words(cue),
            _ => (self.words)(cue),
        }
    }

    /// The next thing due, if any (faults, probes and misses, in time order).
    pub fn next_due(&mut self) -> Option<Due> {
        self.pending.pop_front()
    }

    /// Once the play is over: the steps that did not play, in the schedule's order, and
    /// why — their event or their time never came, or their victim could not take them.
    pub fn unplayed(&self) -> Vec<(&Step, String)> {
        let mut left = self.cursor.player().left();
        left.extend((self.pending.iter()).filter_map(|due| match due {
            Due::Fault(a) => Some((a.step?, super::schedule::not_reached(a.at_ms))),
            _ => None,
        }));
        left.extend(self.skipped.iter().cloned());
        left.sort_by_key(|(index, _)| *index);
        left.dedup_by_key(|(index, _)| *index);
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

    /// Does one thing due: a fault (if its target can take it now), a probe, or the
    /// record of a miss. A fault aimed at a target the play does not have, gone, or not in
    /// the state it needs (a resume of what is not paused) is skipped, as the schedule says.
    pub fn act(
        &mut self,
        due: Due,
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
    ) -> Result<()> {
        match due {
            Due::Missed { item, why } => {
                self.miss(item, why, floor);
                Ok(())
            }
            Due::Probe { index, .. } => self.ask(index, floor),
            Due::Fault(action) if self.is_partition(&action) => {
                self.partition(action, floor, nemesis)
            }
            Due::Fault(action) if self.is_stall(&action) => {
                self.stall(action, floor, nemesis, cast)
            }
            Due::Fault(action) if is_network(action.fault) => self.net(action, floor, nemesis),
            Due::Fault(action) => self.on_process(action, floor, nemesis, cast),
        }
    }

    /// Records a step or probe whose anchor did not come in time.
    fn miss(&mut self, item: Item, why: String, floor: &mut impl Floor) {
        let (fault, target, after) = match item {
            Item::Step(index) => {
                let step = &self.schedule.steps()[index];
                self.skipped.push((index, why.clone()));
                (Some(step.fault), step.target.clone(), step.after.clone())
            }
            Item::Probe(index) => {
                let probe = &self.schedule.probes()[index];
                (None, probe.target.clone(), probe.after.clone())
            }
        };
        let missed = Missed {
            fault,
            target: Some(target.clone()),
            waited_for: after.as_ref().map(|a| a.describe()),
            within_ms: after.as_ref().and_then(|a| a.within_ms),
        };
        let what = match fault {
            Some(fault) => format!("{} {target}", fault.as_str()),
            None => format!("the probe of {target}"),
        };
        let text = format!("{what} did not play: {why}");
        floor.record(Event::new(super::LANE, What::Missed(missed), text));
    }

    /// Asks a probe's backend its question and records the answer (or that none came).
    fn ask(&mut self, index: usize, floor: &mut impl Floor) -> Result<()> {
        let probe = self.schedule.probes()[index].clone();
        let Some(asker) = self.askers.iter_mut().find(|a| a.label() == probe.target) else {
            bail!(
                "the schedule asks {} of '{}', which this run cannot ask",
                probe.probe.name(),
                probe.target
            );
        };
        let event = match asker.ask(&probe.probe) {
            Ok(answer) => probe::answer_event(&probe.target, &probe.probe, answer),
            Err(err) => {
                let mut event =
                    probe::answer_event(&probe.target, &probe.probe, Default::default());
                event.text = format!("{}: no answer ({:#})", probe.probe.words(), err);
                event
            }
        };
        floor.record(event);
        Ok(())
    }

    /// A fault on a proxy path: put on (as the schedule's `how` says, or the fault's usual
    /// way), or healed. A cut or hold with a duration heals itself that much later.
    fn net(&mut self, action: Action, floor: &mut impl Floor, nemesis: &mut Nemesis) -> Result<()> {
        let Some(proxy) = self
            .paths
            .iter()
            .copied()
            .find(|p| p.path() == action.target)
        else {
            let why = format!("this run has no proxy on {}", action.target);
            return self.skip(&action, why);
        };
        let how = action
            .step
            .map(|i| self.schedule.how(i).clone())
            .unwrap_or_default();
        let direction = how.direction.unwrap_or(Direction::Up);
        let cue = Cue {
            action: &action,
            pid: 0,
            held: None,
            back_after: None,
            how: &how,
            links_closed: None,
        };
        let note = self.say(&cue);
        if action.fault == Fault::Heal {
            nemesis.heal_net(floor, proxy, direction, note);
        } else {
            let duration_ms = (action.step)
                .and_then(|i| self.schedule.steps()[i].duration_ms)
                .unwrap_or(0);
            let put = how.proxy.unwrap_or(match action.fault {
                Fault::Delay => NetFault::DelayNext { ms: duration_ms },
                Fault::DropReply => NetFault::DropReply,
                _ => NetFault::Hold,
            });
            nemesis.net_as(floor, proxy, direction, (put, action.fault), note);
        }
        self.acted.push(action);
        Ok(())
    }

    /// A fault on a process (a worker, a server, a cluster member) or on a worker's clock.
    fn on_process(
        &mut self,
        action: Action,
        floor: &mut impl Floor,
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
        if action.fault == Fault::Restart && self.down(&target) {
            return self.start_again(action, floor, nemesis, &mut **victim);
        }
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
        let how = action
            .step
            .map(|i| self.schedule.how(i).clone())
            .unwrap_or_default();
        let cue = |held, back_after| Cue {
            action: &action,
            pid,
            held,
            back_after,
            how: &how,
            links_closed: None,
        };
        match action.fault {
            Fault::Pause if !paused && how.cut_link => {
                return self.lag(action, floor, nemesis, &**victim);
            }
            Fault::Pause if !paused => {
                let note = self.say(&cue(None, None));
                if self.self_pausing.contains(&target) {
                    nemesis.adopt_pause(floor, &**victim, note)?;
                } else {
                    nemesis.pause(floor, &**victim, note)?;
                }
                self.paused_at.insert(target, Instant::now());
            }
            Fault::Resume if paused => {
                let held = self.paused_at.remove(&target).map(|at| at.elapsed());
                let note = self.say(&cue(held, None));
                nemesis.resume(floor, &**victim, note)?;
            }
            Fault::Kill => {
                let note = self.say(&cue(None, None));
                nemesis.kill(floor, &mut **victim, note)?;
                self.paused_at.remove(&target);
            }
            Fault::Restart if victim.returns_by_itself() => {
                let note = self.say(&cue(None, None));
                nemesis.crash(floor, &mut **victim, note)?;
                self.paused_at.remove(&target);
            }
            Fault::Restart => {
                let note = self.say(&cue(None, None));
                let words = &mut self.words;
                nemesis.restart(floor, &mut **victim, note, |took| {
                    words(&cue(None, Some(took)))
                })?;
                self.paused_at.remove(&target);
            }
            Fault::ClockStep | Fault::ClockRate => {
                let Some(&(_, clock)) = self.clocks.iter().find(|(w, _)| *w == target) else {
                    return self.skip(
                        &action,
                        format!("{target}'s clock is not one lockslab can step"),
                    );
                };
                let note = self.say(&cue(None, None));
                match (action.fault, how.by_ms, how.rate_percent) {
                    (Fault::ClockStep, Some(by_ms), _) => {
                        nemesis.step_clock(floor, &**victim, clock, by_ms, note)?
                    }
                    (Fault::ClockRate, _, Some(percent)) => {
                        nemesis.set_clock_rate(floor, &**victim, clock, percent, note)?
                    }
                    (fault, ..) => bail!(
                        "a {} on {target} says by how much (by_ms, rate_percent)",
                        fault.as_str()
                    ),
                }
            }
            Fault::Pause => return self.skip(&action, format!("{target} was paused already")),
            Fault::Resume => return self.skip(&action, format!("{target} was not paused")),
            other => bail!("{} is not a fault of a process", other.as_str()),
        }
        self.acted.push(action);
        Ok(())
    }
}

/// A replica's lag ([`super::replication`]): a pause that also closes its link.
impl Faults<'_> {
    /// Freezes the replica, cuts its link on its primary, then records both as one fault:
    /// the lab's words for it know how many links the cut closed. A cut that failed is
    /// recorded (the freeze happened) and then returned as the error.
    fn lag(
        &mut self,
        action: Action,
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
        victim: &dyn Victim,
    ) -> Result<()> {
        let target = action.target.clone();
        let Some(link) = self.links.iter().find(|l| l.replica == target) else {
            return self.skip(&action, format!("this run knows no primary of {target}"));
        };
        let mut freeze = Held::default();
        nemesis.pause(&mut freeze, victim, Note::default())?;
        self.paused_at.insert(target, Instant::now());
        let cut = link.cut();
        let how = (action.step)
            .map(|i| self.schedule.how(i).clone())
            .unwrap_or_default();
        let cue = Cue {
            action: &action,
            pid: victim.pid().unwrap_or_default(),
            held: None,
            back_after: None,
            how: &how,
            links_closed: cut.as_ref().ok().copied(),
        };
        let note = self.say(&cue);
        for mut event in freeze.0 {
            event.text = note.words.clone();
            if let Some(facts) = event.fault_mut() {
                *facts = FaultFacts {
                    fault: facts.fault,
                    target: facts.target.take(),
                    pid: facts.pid,
                    phase: facts.phase,
                    links_closed: cut.as_ref().ok().copied(),
                    ..note.facts.clone()
                };
            }
            floor.record(event);
        }
        cut?;
        self.acted.push(action);
        Ok(())
    }
}

impl Faults<'_> {
    /// Is `target` down: killed by this play, and not started again since?
    fn down(&self, target: &str) -> bool {
        (self.acted.iter().rev())
            .find(|a| a.target == target && matches!(a.fault, Fault::Kill | Fault::Restart))
            .is_some_and(|a| a.fault == Fault::Kill)
    }

    /// A restart of a server this play killed (a master kept down a while, then brought
    /// back): it is only started again, and only its return is recorded — its crash is
    /// on the timeline already, as the kill.
    fn start_again(
        &mut self,
        action: Action,
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
        victim: &mut dyn Victim,
    ) -> Result<()> {
        let how = (action.step)
            .map(|i| self.schedule.how(i).clone())
            .unwrap_or_default();
        let words = &mut self.words;
        nemesis.start_again(floor, victim, |took| {
            words(&Cue {
                action: &action,
                pid: 0,
                held: None,
                back_after: Some(took),
                how: &how,
                links_closed: None,
            })
        })?;
        self.acted.push(action);
        Ok(())
    }
}

/// A fault the proxy plays on a path.
fn is_network(fault: Fault) -> bool {
    matches!(
        fault,
        Fault::Hold | Fault::Delay | Fault::Cut | Fault::DropReply | Fault::Heal
    )
}

/// The words of a fault when the lab gives none.
fn plain_words(cue: &Cue) -> String {
    let target = &cue.action.target;
    match (cue.action.fault, cue.back_after) {
        (Fault::Pause, _) if cue.how.cut_link => format!(
            "pauses {target} (SIGSTOP) and cuts its replication link ({} closed)",
            cue.links_closed.map_or("none".into(), |n| n.to_string())
        ),
        (Fault::Pause, _) => format!("pauses {target} (SIGSTOP)"),
        (Fault::Resume, _) => format!("resumes {target} (SIGCONT)"),
        (Fault::Kill, _) => format!("kills {target} (SIGKILL)"),
        (Fault::Restart, None) => format!("crashes {target} (SIGKILL), then starts it again"),
        (Fault::Restart, Some(took)) => format!("{target} back after {}", human(took)),
        (Fault::Partition, _) => format!("partitions the hosts: {target}"),
        (Fault::Heal, _) if target.contains(['|', ',']) => format!("heals the partition {target}"),
        (Fault::LeaderStall, _) => {
            format!("stalls {target}'s leader (SIGSTOP, past its election timeout)")
        }
        (other, _) => format!("{} {target}", other.as_str()),
    }
}
