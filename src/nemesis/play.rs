//! The one player: a [`Schedule`] played from the live history, every fault of every kind
//! done by the [`Nemesis`] and every probe asked of its backend.
//!
//! ```text
//! Schedule ──> Faults ──(due)──> nemesis: pause/resume/kill/restart  (a victim in the cast)
//!                │                        lag: pause + cut its link  (a replica, its primary)
//!                │                        failover: lag, kill, thaw  (primary and replica)
//!                ▲                        cut/hold/delay/drop/heal   (a proxy path, or two)
//!                │                        clock_step/clock_rate      (a worker's clock)
//!                │                        clock_step, simulated      (a Redis server's keys)
//!                │               probe:   pttl/lease_ttl/blocking    (a backend)
//!                │               miss:    an anchor that did not come in time
//!                │      (watch)  heal:    a delay or lost reply the proxy saw through
//!                │               back:    a crashed victim that came back by itself
//!                └──── observe ◀──── every event the floor logs (the run's history)
//! ```
//!
//! A lab registers what its schedule aims at — its proxy paths (and which paths a cut
//! holds together), its workers' clocks, the servers whose clocks jump, the backends it
//! may ask, a failover's primary and replica — and hands the processes (workers, servers,
//! cluster members) to each play (`cast`, which it borrows mutably only for as long as a
//! play lasts). The lab keeps its words: what the timeline says of each fault ([`Cue`]).
//! Between the faults due, [`Faults::watch`] ends what the proxy saw through and records a
//! return; once the play is over, [`Faults::finish`] heals what is still on a path.
//!
//! Everything the player does is an event of the history: a fault's start and end, a
//! probe's answer ([`crate::events::What::Probed`]), a step that missed its moment
//! ([`crate::events::What::Missed`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

mod by_hand;
mod hosts;

use super::clock::WorkerClock;
use super::probe::{self, Ask};
use super::replication::Link;
use super::schedule::{Action, Due, How, Item, Player, Schedule, Step};
use super::server_clock::ServerClocks;
use super::{Fault, Held, Nemesis, Note, Record, Return, Victim};
use crate::events::facts::FaultFacts;
use crate::events::facts::Missed;
use crate::events::{Event, What};
use crate::hosts::Hosts;
use crate::output::human;
use crate::proxy::{Direction, NetFault, Proxy, Seen};

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
struct Cursor {
    player: Player,
    /// The floor's time (ms) at which the schedule's clock starts.
    origin_ms: u64,
    /// How many of the floor's events the player has been shown.
    seen: usize,
    /// Events shown to the player before the floor logged them ([`Faults::foresee`]), by
    /// worker and kind: each is not shown again when it is logged.
    foreseen: Vec<(String, crate::events::Kind)>,
}

impl Cursor {
    fn new(schedule: &Schedule, floor: &impl Floor) -> Cursor {
        Cursor {
            player: Player::new(schedule),
            origin_ms: floor.now_ms(),
            seen: floor.events().len(),
            foreseen: Vec::new(),
        }
    }

    /// Shows the player the events logged since it last looked (each also to `each`), and
    /// hands out what fell due, with the time now on the schedule's clock.
    fn due_all(&mut self, floor: &impl Floor, mut each: impl FnMut(&Event)) -> (Vec<Due>, u64) {
        let now = self.look(floor, &mut each);
        (self.player.due_all(now), now)
    }

    fn look(&mut self, floor: &impl Floor, each: &mut impl FnMut(&Event)) -> u64 {
        let events = floor.events();
        for event in &events[self.seen.min(events.len())..] {
            let key = (event.worker.clone(), event.kind());
            match self.foreseen.iter().position(|seen| *seen == key) {
                Some(at) => {
                    self.foreseen.remove(at);
                }
                None => {
                    let at = event.t_ms.saturating_sub(self.origin_ms);
                    self.player.observe_at(event, at);
                }
            }
            each(event);
        }
        self.seen = events.len();
        floor.now_ms().saturating_sub(self.origin_ms)
    }

    /// How many of the floor's events the player has been shown.
    fn seen(&self) -> usize {
        self.seen
    }

    /// The time now on the schedule's clock.
    fn now_ms(&self, floor: &impl Floor) -> u64 {
        floor.now_ms().saturating_sub(self.origin_ms)
    }

    fn player(&self) -> &Player {
        &self.player
    }

    fn player_mut(&mut self) -> &mut Player {
        &mut self.player
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
    /// For a network fault: the path it is put on or healed now (a cut holds several).
    pub net: Option<NetCue<'a>>,
}

impl<'a> Cue<'a> {
    /// The cue of `action` done as `how` says, with nothing more to tell.
    fn of(action: &'a Action, how: &'a How) -> Cue<'a> {
        Cue {
            action,
            pid: 0,
            held: None,
            back_after: None,
            how,
            links_closed: None,
            net: None,
        }
    }
}

/// A network fault's path, and for its heal, why it ends.
pub struct NetCue<'a> {
    pub path: &'a str,
    pub end: Option<NetEnd>,
}

/// Why a network fault ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetEnd {
    /// Its time is up (a timed cut), or the schedule heals it.
    Timed,
    /// The proxy saw it through: the delayed request went out, the reply was lost.
    Seen(Seen),
    /// The run is over with this fault still on the path.
    RunOver(Fault),
}

/// A delay or a lost reply put on a path, which ends once the proxy has seen it through.
struct Armed {
    step: usize,
    path: String,
    fault: Fault,
    done: bool,
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
    /// Victims whose timed pause lasts its duration from its SIGSTOP, not from its due
    /// moment ([`Faults::pauses_lasting_from_sigstop`]).
    pauses_from_sigstop: HashSet<String>,
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
    /// A cut aimed at the first path holds the second as well (a client's path to its
    /// lock server, and its path to the store).
    cut_spreads: Vec<(String, String)>,
    /// A delay and a lost reply end when the proxy has seen them through.
    ends_when_seen: bool,
    armed: Vec<Armed>,
    /// The Redis servers whose clocks a `clock_step` aimed at them jumps.
    server_clocks: ServerClocks,
    /// How far a server's clock jumps when the step does not say.
    server_jump_ms: u64,
    /// Failovers: a restart of the primary whose step has a duration lags the replica
    /// that long first (primary, replica).
    failovers: Vec<(String, String)>,
    /// The failover steps (by place) whose lag is done: their restart is the kill.
    lagged: HashSet<usize>,
    /// Victims crashed that come back by themselves and say when.
    returning: Vec<String>,
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
            pauses_from_sigstop: HashSet::new(),
            acted: Vec::new(),
            skipped: Vec::new(),
            words: Box::new(|cue| Note::from(plain_words(cue))),
            paths: Vec::new(),
            clocks: Vec::new(),
            askers: Vec::new(),
            links: Vec::new(),
            cut_spreads: Vec::new(),
            ends_when_seen: false,
            armed: Vec::new(),
            server_clocks: ServerClocks::default(),
            server_jump_ms: 0,
            failovers: Vec::new(),
            lagged: HashSet::new(),
            returning: Vec::new(),
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

    /// A timed pause of `victim` lasts its whole duration from the moment its SIGSTOP went
    /// out, not from the moment it fell due. On a busy machine the lab's loop may send a
    /// pause late (its anchor's event read late, the lab itself not scheduled), and a
    /// resume kept at its due moment cuts the pause short by as much — to nothing once
    /// the lateness reaches the duration. For a victim that must notice each pause (lab
    /// 9's stall waits for A to say it ran again before the next stop) a pause cut short
    /// is a pause missed, and the faults after it never come. A pause that falls due while
    /// the victim is still stopped is not sent, and its resume goes with it: it would end
    /// the pause that is on short.
    pub fn pauses_lasting_from_sigstop(mut self, victim: &str) -> Faults<'w> {
        self.pauses_from_sigstop.insert(victim.into());
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

    /// A cut aimed at `path` holds `also` as well, put on and healed with it (a client cut
    /// off from its lock server is cut off from the store too).
    pub fn cut_spreads(mut self, path: &str, also: &str) -> Faults<'w> {
        self.cut_spreads.push((path.into(), also.into()));
        self
    }

    /// A delay or a lost reply on a path ends when the proxy has seen it through (the
    /// request went out late, the answer was lost) — see [`Faults::watch`]; one nothing
    /// went through before [`Faults::finish`] did not play.
    pub fn ending_when_seen(mut self) -> Faults<'w> {
        self.ends_when_seen = true;
        self
    }

    /// A `clock_step` aimed at `server` (a Redis, by its name in the history) jumps its
    /// clock under the grant its anchor names, by `how.by_ms` or else `by_ms`
    /// ([`super::server_clock`]). `connection` is made now, before the clients work.
    pub fn on_server_clock(
        mut self,
        server: &str,
        url: &str,
        connection: crate::connect::RedisConn,
        by_ms: u64,
    ) -> Faults<'w> {
        self.server_clocks.add(server, url, connection);
        self.server_jump_ms = by_ms;
        self
    }

    /// A restart of `primary` with a duration is a failover: `replica` lags that long
    /// first (a pause that cuts its link, [`Faults::on_replica`]), then the primary dies
    /// and the replica is thawed at once.
    pub fn failing_over(mut self, primary: &str, replica: &str) -> Faults<'w> {
        self.failovers.push((primary.into(), replica.into()));
        self
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Every action was handed out and done (or skipped).
    pub fn finished(&self) -> bool {
        self.cursor.player().done() && self.pending.is_empty()
    }

    /// Does this play hold a victim paused (a pause it started and has not ended), or wait
    /// for one it crashed to come back?
    pub fn holding(&self) -> bool {
        !self.paused_at.is_empty() || !self.returning.is_empty()
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

    /// Did the events shown so far make something due that is not done yet?
    pub fn due(&self) -> bool {
        !self.pending.is_empty()
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
        let clocks = &mut self.server_clocks;
        self.pending
            .extend(self.cursor.due_all(floor, |event| clocks.see(event)).0);
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
        self.schedule.push_last(step.clone(), how);
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
    /// way), or healed. A cut or hold with a duration heals itself that much later; a cut
    /// holds the paths it spreads to as well ([`Faults::cut_spreads`]), each its own line.
    fn net(&mut self, action: Action, floor: &mut impl Floor, nemesis: &mut Nemesis) -> Result<()> {
        let Some(proxy) = self.proxy(&action.target) else {
            let why = format!("this run has no proxy on {}", action.target);
            return self.skip(&action, why);
        };
        let how = action
            .step
            .map(|i| self.schedule.how(i).clone())
            .unwrap_or_default();
        let direction = how.direction.unwrap_or(Direction::Up);
        let mut on = vec![proxy];
        if matches!(action.fault, Fault::Cut | Fault::Heal) {
            let spread = (self.cut_spreads.iter()).filter(|(path, _)| *path == action.target);
            for (_, also) in spread {
                if let Some(also) = self.proxy(also)
                    && !on.iter().any(|p| p.path() == also.path())
                {
                    on.push(also);
                }
            }
        }
        let duration_ms = (action.step)
            .and_then(|i| self.schedule.steps()[i].duration_ms)
            .unwrap_or(0);
        let put = how.proxy.unwrap_or(match action.fault {
            Fault::Delay => NetFault::DelayNext { ms: duration_ms },
            Fault::DropReply => NetFault::DropReply,
            _ => NetFault::Hold,
        });
        for proxy in on {
            let end = (action.fault == Fault::Heal).then_some(NetEnd::Timed);
            let cue = Cue {
                net: Some(NetCue {
                    path: proxy.path(),
                    end,
                }),
                ..Cue::of(&action, &how)
            };
            let note = self.say(&cue);
            if action.fault == Fault::Heal {
                nemesis.heal_net(floor, proxy, direction, note);
            } else {
                nemesis.net_as(floor, proxy, direction, (put, action.fault), note);
            }
        }
        let seen_through = matches!(action.fault, Fault::Delay | Fault::DropReply);
        if let Some(step) = action.step.filter(|_| self.ends_when_seen && seen_through) {
            self.armed.push(Armed {
                step,
                path: action.target.clone(),
                fault: action.fault,
                done: false,
            });
        }
        self.acted.push(action);
        Ok(())
    }

    /// The proxy on the path named `path`, if this play has one.
    fn proxy(&self, path: &str) -> Option<&'w Proxy> {
        self.paths.iter().copied().find(|p| p.path() == path)
    }

    /// Between the faults due: ends each fault the proxy has seen through (with
    /// [`Faults::ending_when_seen`]), with what it saw, and records the return of a victim
    /// crashed that has come back by itself. A play calls it as it waits (a tick).
    pub fn watch(
        &mut self,
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
    ) -> Result<()> {
        if self.ends_when_seen {
            for proxy in self.paths.clone() {
                for report in proxy.reports() {
                    self.heal_seen(floor, nemesis, proxy, report.seen);
                }
            }
        }
        let mut still = Vec::new();
        for target in std::mem::take(&mut self.returning) {
            let Some(victim) = cast.iter_mut().find(|v| v.label() == target) else {
                continue;
            };
            match victim.has_returned()? {
                Return::Unwatched => {}
                Return::NotYet => still.push(target),
                Return::Back { took, note } => {
                    let pid = victim.pid().unwrap_or_default();
                    floor.record(super::restarted_event(&target, pid, took, *note));
                }
            }
        }
        self.returning = still;
        Ok(())
    }

    /// A delayed request gone out, or a reply lost: the fault that did it is done, and its
    /// path heals (if a fault is still on it).
    fn heal_seen(
        &mut self,
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
        proxy: &Proxy,
        seen: Seen,
    ) {
        let path = proxy.path();
        let through = match seen {
            Seen::DelayedSent { .. } => Fault::Delay,
            Seen::ReplyDropped { .. } => Fault::DropReply,
            _ => return,
        };
        for armed in &mut self.armed {
            armed.done |= armed.fault == through && armed.path == path;
        }
        if nemesis.faulty_paths().iter().any(|p| p == path) {
            let heal = self.heal_action(path);
            let how = How::default();
            let cue = Cue {
                net: Some(NetCue {
                    path,
                    end: Some(NetEnd::Seen(seen)),
                }),
                ..Cue::of(&heal, &how)
            };
            let note = self.say(&cue);
            nemesis.heal_net(floor, proxy, Direction::Up, note);
        }
    }

    /// The heal of `path` now, which no step of the schedule asked for.
    fn heal_action(&self, path: &str) -> Action {
        Action {
            at_ms: 0,
            fault: Fault::Heal,
            target: path.into(),
            step: None,
        }
    }

    /// Once the play is over: ends what the proxy saw through since the last look, then
    /// every fault still on a path (`NetEnd::RunOver`, with the fault it was); a delay or
    /// lost reply nothing went through did not play. Call it before [`Faults::unplayed`].
    pub fn finish(&mut self, floor: &mut impl Floor, nemesis: &mut Nemesis) {
        if self.ends_when_seen {
            for proxy in self.paths.clone() {
                for report in proxy.reports() {
                    self.heal_seen(floor, nemesis, proxy, report.seen);
                }
            }
        }
        for path in nemesis.faulty_paths() {
            let Some(proxy) = self.proxy(&path) else {
                continue;
            };
            // The fault on it: the last one this play put on the path (or a cut spread
            // to it).
            let on = (self.acted.iter().rev())
                .find(|a| {
                    a.fault != Fault::Heal
                        && (a.target == path
                            || (self.cut_spreads.iter())
                                .any(|(cut, also)| *cut == a.target && *also == path))
                })
                .map_or(Fault::Hold, |a| a.fault);
            let heal = self.heal_action(&path);
            let how = How::default();
            let cue = Cue {
                net: Some(NetCue {
                    path: &path,
                    end: Some(NetEnd::RunOver(on)),
                }),
                ..Cue::of(&heal, &how)
            };
            let note = self.say(&cue);
            nemesis.heal_net(floor, proxy, Direction::Up, note);
        }
        for armed in std::mem::take(&mut self.armed) {
            if !armed.done {
                let client = armed.path.split(super::generate::PATH_ARROW).next();
                let why = format!(
                    "it was put on {}, and {} sent nothing more on it before the run ended",
                    armed.path,
                    client.unwrap_or_default()
                );
                self.skipped.push((armed.step, why));
            }
        }
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
        if action.fault == Fault::ClockStep && self.server_clocks.has(&target) {
            return self.jump_server_clock(action, floor, nemesis);
        }
        if let Some(lag) = self.lag_first(&action) {
            return self.fail_over(action, lag, floor, nemesis, cast);
        }
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
        victim.before(action.fault);
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
            net: None,
        };
        match action.fault {
            Fault::Pause if !paused && how.cut_link => {
                return self.lag(action, &how, floor, nemesis, &**victim);
            }
            Fault::Pause if !paused => {
                let note = self.say(&cue(None, None));
                if self.self_pausing.contains(&target) {
                    nemesis.adopt_pause(floor, &**victim, note)?;
                } else {
                    nemesis.pause(floor, &**victim, note)?;
                    if self.pauses_from_sigstop.contains(&target) {
                        self.end_pause_its_duration_from_now(&action, floor);
                    }
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
                // One that says when it is back is asked until it is (see `watch`).
                if !matches!(victim.has_returned()?, Return::Unwatched) {
                    self.returning.push(target.clone());
                }
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
            Fault::Pause => {
                if self.pauses_from_sigstop.contains(&target) {
                    self.drop_end_of_pause_not_sent(&action);
                }
                return self.skip(&action, format!("{target} was paused already"));
            }
            Fault::Resume => return self.skip(&action, format!("{target} was not paused")),
            other => bail!("{} is not a fault of a process", other.as_str()),
        }
        self.acted.push(action);
        Ok(())
    }
}

impl Faults<'_> {
    /// The resume that ends `pause` (a step with a duration), as the schedule made it:
    /// due the duration after the pause was.
    fn end_of(&self, pause: &Action) -> Option<(Action, u64)> {
        let duration_ms = self.schedule.steps()[pause.step?].duration_ms?;
        let end = Action {
            at_ms: pause.at_ms.saturating_add(duration_ms),
            fault: Fault::Resume,
            target: pause.target.clone(),
            step: None,
        };
        Some((end, duration_ms))
    }

    /// Takes back `action` wherever it waits: in the player still, or handed out already
    /// (with the pause it ends, when the pause was sent as late as its duration).
    fn take_back(&mut self, action: &Action) -> Option<Action> {
        let handed_out = (self.pending.iter())
            .position(|due| matches!(due, Due::Fault(a) if a == action))
            .and_then(|at| self.pending.remove(at));
        match handed_out {
            Some(Due::Fault(action)) => Some(action),
            _ => self.cursor.player_mut().withdraw_action(action),
        }
    }

    /// `pause` went out just now: its resume is due its duration from now.
    fn end_pause_its_duration_from_now(&mut self, pause: &Action, floor: &impl Floor) {
        let Some((end, duration_ms)) = self.end_of(pause) else {
            return;
        };
        if let Some(end) = self.take_back(&end) {
            let at_ms = self.cursor.now_ms(floor) + duration_ms;
            self.cursor.player_mut().add(Action { at_ms, ..end });
        }
    }

    /// `pause` was not sent (its victim was stopped already, by an earlier pause that
    /// came late): its resume goes with it, or it would end the earlier pause short.
    fn drop_end_of_pause_not_sent(&mut self, pause: &Action) {
        if let Some((end, _)) = self.end_of(pause) {
            self.take_back(&end);
        }
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
        how: &How,
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
        let cue = Cue {
            action: &action,
            pid: victim.pid().unwrap_or_default(),
            held: None,
            back_after: None,
            how,
            links_closed: cut.as_ref().ok().copied(),
            net: None,
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

/// A failover ([`Faults::failing_over`]) and a server's clock jump
/// ([`Faults::on_server_clock`]).
impl Faults<'_> {
    /// A failover's restart whose replica is to lag first, not yet lagged: the replica's
    /// name and how long it lags.
    fn lag_first(&self, action: &Action) -> Option<(String, u64)> {
        let index = action.step.filter(|i| !self.lagged.contains(i))?;
        let (_, replica) = (self.failovers.iter())
            .find(|(primary, _)| action.fault == Fault::Restart && *primary == action.target)?;
        let lag_ms = self.schedule.steps()[index]
            .duration_ms
            .filter(|ms| *ms > 0)?;
        Some((replica.clone(), lag_ms))
    }

    /// The start of a failover with a lag: the replica frozen and its link cut now; the
    /// primary's kill and the replica's thaw due `lag_ms` later, in that order (the kill
    /// is the step's own restart, played again once its lag is done). A failover whose
    /// replica is not running ends the play: nothing would fail over.
    fn fail_over(
        &mut self,
        action: Action,
        (replica, lag_ms): (String, u64),
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
        cast: &mut [&mut dyn Victim],
    ) -> Result<()> {
        let Some(index) = action.step else {
            return Ok(());
        };
        let Some(victim) = cast.iter_mut().find(|v| v.label() == replica) else {
            bail!("the failover has no {replica} to make lag");
        };
        victim.before(Fault::Pause);
        if victim.pid().is_none() {
            bail!("the failover could not pause {replica}: it is not running");
        }
        let lag = Action {
            fault: Fault::Pause,
            target: replica.clone(),
            ..action.clone()
        };
        let how = How {
            cut_link: true,
            ..How::default()
        };
        let skipped = self.skipped.len();
        self.lag(lag, &how, floor, nemesis, &**victim)?;
        if let Some((_, why)) = self.skipped.get(skipped) {
            bail!("the failover could not make {replica} lag: {why}");
        }
        self.lagged.insert(index);
        let at_ms = self.cursor.now_ms(floor) + lag_ms;
        let player = self.cursor.player_mut();
        player.add(Action { at_ms, ..action });
        player.add(Action {
            at_ms,
            fault: Fault::Resume,
            target: replica,
            step: None,
        });
        Ok(())
    }

    /// Jumps the clock of a Redis server under the grant the step is timed from; a jump
    /// that came too late (the key gone, or another's) did not play.
    fn jump_server_clock(
        &mut self,
        action: Action,
        floor: &mut impl Floor,
        nemesis: &mut Nemesis,
    ) -> Result<()> {
        let Some(index) = action.step else {
            return Ok(());
        };
        let step = self.schedule.steps()[index].clone();
        let by_ms = match self.schedule.how(index).by_ms {
            Some(ms) if ms > 0 => ms as u64,
            _ => self.server_jump_ms,
        };
        let now_ms = floor.now_ms();
        let jumped = (self.server_clocks).jump((nemesis, floor, now_ms), (index, &step), by_ms);
        match jumped {
            Ok(()) => {
                self.acted.push(action);
                Ok(())
            }
            Err(why) => self.skip(&action, why),
        }
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
                back_after: Some(took),
                ..Cue::of(&action, &how)
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
