//! The nemesis: every fault lockslab injects, in one place, as data.
//!
//! A lab does not send signals itself. It names a fault ([`Fault`]) and what it is aimed
//! at (a [`Victim`]: a worker, a server, a cluster member), and the nemesis acts and writes
//! the fault's start — and, for a fault that lasts, its end — into the run's history. So
//! every freeze, kill and restart a learner sees on the timeline was recorded by the code
//! that did it, at the moment it did it, with the same fields every time.
//!
//! The faults, and what each stands for:
//!
//! | fault     | done with                       | stands for                                  |
//! |-----------|---------------------------------|---------------------------------------------|
//! | `pause`   | SIGSTOP to the process group     | a GC pause, a VM migration, a starved CPU   |
//! | `resume`  | SIGCONT                          | the pause ends; the process never noticed   |
//! | `kill`    | SIGKILL, then reaped             | a crash: no cleanup code runs               |
//! | `restart` | SIGKILL, then started again      | a crash and a reboot (with or without data) |
//! | `hold`    | the proxy queues a path's bytes  | a write in flight, late past the lease      |
//! | `delay`   | the proxy delays every chunk     | a congested or rerouted link                |
//! | `cut`     | the proxy resets or swallows     | a partition: one server out of reach        |
//! | `drop_reply` | the proxy loses one answer    | a request applied whose reply never came    |
//! | `heal`    | the proxy clears the path        | the link works again                        |
//! | `pause` + `cut_link` | SIGSTOP, and `CLIENT KILL TYPE replica` on its primary | a replica that lags |
//! | `partition` | each host of a cut pair routes the other into nowhere ([`crate::hosts`]) | servers cut off from each other |
//! | `heal` (of sides) | the cut links carry packets again | the partition ends; hung connections resume |
//! | `leader_stall` | SIGSTOP of whoever leads now, past the election, then SIGCONT | a leader deposed while asleep |
//!
//! Network faults ([`network`]) are aimed at a path of the fault proxy ([`crate::proxy`]):
//! one worker's link to one server, so no other worker and no process is touched.
//!
//! A pause on a *server* freezes it the same way: its kernel still accepts connections and
//! nothing answers them. A [`Schedule`](schedule::Schedule) is a list of faults with their
//! times, which a lab writes by hand or a generator draws from a seed.

pub mod clock;
pub mod generate;
pub mod network;
pub mod partition;
pub mod play;
pub mod probe;
pub mod replication;
pub mod schedule;
pub mod server_clock;
pub mod victims;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use nix::sys::signal::Signal;

use crate::events::facts::FaultFacts;
use crate::events::{Event, What};
use crate::procs;

pub use crate::events::facts::{Fault, Phase};

impl Fault {
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Pause => "pause",
            Fault::Resume => "resume",
            Fault::Kill => "kill",
            Fault::Restart => "restart",
            Fault::Hold => "hold",
            Fault::Delay => "delay",
            Fault::Cut => "cut",
            Fault::DropReply => "drop_reply",
            Fault::Heal => "heal",
            Fault::ClockStep => "clock_step",
            Fault::ClockRate => "clock_rate",
            Fault::Partition => "partition",
            Fault::LeaderStall => "leader_stall",
        }
    }

    /// The history's word for this fault (what the timeline and the pictures draw).
    fn record(self, facts: FaultFacts) -> What {
        match self {
            Fault::Pause | Fault::LeaderStall => What::Frozen(facts),
            Fault::Resume => What::Resumed(facts),
            Fault::Kill | Fault::Restart => What::Killed(facts),
            Fault::Hold | Fault::Delay | Fault::Cut | Fault::DropReply | Fault::Partition => {
                What::NetFault(facts)
            }
            Fault::Heal => What::NetHealed(facts),
            Fault::ClockStep | Fault::ClockRate => What::ClockStepped(facts),
        }
    }
}

/// Something the nemesis can aim at: a process it may stop, continue and kill, and — for
/// a server it started — start again.
pub trait Victim {
    /// The name the history gives it: a worker's (`A`), a server's (`redis`), a member's (`m3`).
    fn label(&self) -> String;
    /// Its process, while it has one.
    fn pid(&self) -> Option<i32>;
    /// A uid whose every process is the victim's (a challenge client's own user): a pause
    /// freezes them all, not only its process group — a helper it started in a session of
    /// its own is part of the same machine.
    fn user(&self) -> Option<u32> {
        None
    }
    /// A freezer cgroup holding every process of the victim ([`crate::freezer`]): a pause
    /// freezes it, which no signal the victim arranged (a timer's SIGCONT) can end.
    fn freezer(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// Ends the process as a crash would and reaps it.
    fn kill_now(&mut self);
    /// Kills it and starts it again in the same place; returns how long it was away.
    fn restart_now(&mut self) -> Result<Duration> {
        bail!("{} cannot be restarted", self.label())
    }
    /// Does it come back by itself after a crash — or another takes its place, as a
    /// replica the Sentinels promote does a killed primary's? Then a restart only kills
    /// it ([`Nemesis::crash`]), and whoever watches it records its return.
    fn returns_by_itself(&self) -> bool {
        false
    }
    /// Reaps its process if it has exited by itself, so that no zombie waits for the end
    /// of the run (then `pid` is None).
    fn reap_if_exited(&mut self) {}
    /// Called just before the player does `fault` to it: a victim that must look at its
    /// servers first does so here (who is primary now, how far its stream went).
    fn before(&mut self, fault: Fault) {
        let _ = fault;
    }
    /// After a crash it comes back from ([`Victim::returns_by_itself`]): is it back? The
    /// player asks until it is, and records its return; a victim that does not say
    /// (`Unwatched`) is watched by its lab.
    fn has_returned(&mut self) -> Result<Return> {
        Ok(Return::Unwatched)
    }
}

/// What a victim that comes back by itself says of its return.
pub enum Return {
    /// It does not say: whoever watches it records its return.
    Unwatched,
    NotYet,
    /// Back after `took`, in the victim's own words (what it saw as it came back).
    Back {
        took: Duration,
        note: Box<Note>,
    },
}

/// What the history says of a fault besides its name and target: the line the timeline
/// shows, and any fact the lab adds (`backend`, `master`); the nemesis fills in the fault,
/// its target, the pid and the phase.
#[derive(Clone, Debug, Default)]
pub struct Note {
    pub words: String,
    pub facts: FaultFacts,
}

impl Note {
    pub fn new(words: impl Into<String>, facts: FaultFacts) -> Note {
        Note {
            words: words.into(),
            facts,
        }
    }
}

impl From<String> for Note {
    fn from(words: String) -> Note {
        Note::new(words, FaultFacts::default())
    }
}

impl From<&str> for Note {
    fn from(words: &str) -> Note {
        Note::from(words.to_string())
    }
}

/// Where the nemesis writes what it did: the run's history (a lab's [`crate::labs::Stage`]).
pub trait Record {
    fn record(&mut self, event: Event);
}

/// Holds what the nemesis records until the caller knows the rest of its line (a
/// replica's freeze and the cut of its link are one line, with the number of links the cut
/// closed, known only after the freeze), then passes it on.
#[derive(Default)]
pub struct Held(pub Vec<Event>);

impl Record for Held {
    fn record(&mut self, event: Event) {
        self.0.push(event);
    }
}

/// A fault the nemesis started and has not ended: a pause not yet resumed.
#[derive(Clone, Debug)]
struct Active {
    label: String,
    since: Instant,
    /// The victim's own user, all of whose processes were frozen with it.
    user: Option<u32>,
    /// Its freezer cgroup, frozen.
    freezer: Option<std::path::PathBuf>,
}

/// The one place faults are done. It remembers every pause it started, so that a lab
/// which ends early (an error, Ctrl-C) can still resume everything with [`Nemesis::heal`]
/// — a frozen process left behind ruins a workshop.
#[derive(Default)]
pub struct Nemesis {
    paused: HashMap<i32, Active>,
    /// Network faults on, by proxy path, with when each began.
    net: HashMap<String, Instant>,
}

/// How long a SIGSTOP may take to land. A signal is acted on when its process next gets a
/// CPU: on a machine loaded many times over its cores (a 1,000-schedule chaos run beside
/// two builds, niced), 2 s was seen to pass first.
const STOP_PATIENCE: Duration = Duration::from_secs(10);

/// Who acts, on the timeline: the nemesis's events stand in the lab's own lane.
pub const LANE: &str = "lab";

impl Nemesis {
    pub fn new() -> Nemesis {
        Nemesis::default()
    }

    /// Pauses the victim with SIGSTOP and waits until the kernel says it is stopped.
    ///
    /// The fault is recorded *before* the signal goes out, like every fault here: nothing
    /// the fault causes (another worker taking the lock) may stand above it on the timeline.
    pub fn pause(
        &mut self,
        history: &mut impl Record,
        victim: &dyn Victim,
        note: impl Into<Note>,
    ) -> Result<()> {
        self.pause_as(Fault::Pause, history, victim, note.into())
    }

    /// [`Nemesis::pause`], recorded as `fault` (a leader's stall is a pause of whoever
    /// leads).
    fn pause_as(
        &mut self,
        fault: Fault,
        history: &mut impl Record,
        victim: &dyn Victim,
        note: Note,
    ) -> Result<()> {
        let pid = alive_pid(victim)?;
        history.record(fault_event(fault, &victim.label(), pid, note));
        self.paused.insert(pid, Active::now(victim));
        let freezer = victim.freezer();
        // Frozen first, whether or not it stays stopped (a SIGCONT of its own wakes it): a
        // frozen process can neither fork nor stop the helper that stops its user.
        if let Some(freezer) = &freezer
            && !crate::freezer::freeze(freezer)
        {
            bail!("{} (pid {pid}) did not freeze within 5s", victim.label());
        }
        procs::signal_group(pid, Signal::SIGSTOP)?;
        let user_stopped =
            (victim.user()).is_none_or(|uid| procs::signal_every_process_of(uid, Signal::SIGSTOP));
        if freezer.is_some() {
            return Ok(());
        }
        if !user_stopped {
            bail!(
                "{} (pid {pid}): not every process of its user could be stopped",
                victim.label()
            );
        }
        if !procs::wait_until_stopped(pid, STOP_PATIENCE) {
            bail!(
                "{} (pid {pid}) did not stop within {}s of SIGSTOP (state {:?})",
                victim.label(),
                STOP_PATIENCE.as_secs(),
                procs::process_state(pid)
            );
        }
        Ok(())
    }

    /// Records a pause the victim gave itself (a worker that sent itself SIGSTOP at an
    /// exact point of its work): the nemesis checks that it is stopped and takes over
    /// its end, as if it had started it.
    pub fn adopt_pause(
        &mut self,
        history: &mut impl Record,
        victim: &dyn Victim,
        note: impl Into<Note>,
    ) -> Result<()> {
        let pid = alive_pid(victim)?;
        if !procs::wait_until_stopped(pid, STOP_PATIENCE) {
            bail!(
                "{} (pid {pid}) said it would stop but did not",
                victim.label()
            );
        }
        self.paused.insert(pid, Active::now(victim));
        history.record(fault_event(Fault::Pause, &victim.label(), pid, note));
        Ok(())
    }

    /// Resumes a paused victim with SIGCONT and records the end of its pause, with how long
    /// it lasted (`paused_ms`), which it returns.
    pub fn resume(
        &mut self,
        history: &mut impl Record,
        victim: &dyn Victim,
        note: impl Into<Note>,
    ) -> Result<Duration> {
        let pid = alive_pid(victim)?;
        let active = self.paused.remove(&pid);
        let lasted = (active.as_ref()).map_or(Duration::ZERO, |active| active.since.elapsed());
        let mut end = fault_event(Fault::Resume, &victim.label(), pid, note);
        if let What::Resumed(facts) = &mut end.what {
            facts.paused_ms = Some(lasted.as_millis() as u64);
        }
        history.record(end);
        procs::signal_group(pid, Signal::SIGCONT)?;
        if let Some(active) = active {
            active.let_go();
        }
        Ok(lasted)
    }

    /// Kills the victim with SIGKILL and reaps it (a paused victim is resumed as it dies,
    /// so nothing stays stopped).
    pub fn kill(
        &mut self,
        history: &mut impl Record,
        victim: &mut dyn Victim,
        note: impl Into<Note>,
    ) -> Result<()> {
        self.kill_as(Fault::Kill, history, victim, note.into())
    }

    /// Records `fault` (a kill, or a restart's start), then kills the victim and reaps it.
    fn kill_as(
        &mut self,
        fault: Fault,
        history: &mut impl Record,
        victim: &mut dyn Victim,
        note: Note,
    ) -> Result<()> {
        let pid = alive_pid(victim)?;
        history.record(fault_event(fault, &victim.label(), pid, note));
        self.paused.remove(&pid);
        victim.kill_now();
        Ok(())
    }

    /// Kills the victim and starts it again in the same place. The crash is recorded when
    /// it happens (`note`); the return once the victim answers again, with the line `back`
    /// makes of how long it was away (`restart_ms`), which it returns.
    pub fn restart(
        &mut self,
        history: &mut impl Record,
        victim: &mut dyn Victim,
        note: impl Into<Note>,
        back: impl FnOnce(Duration) -> Note,
    ) -> Result<Duration> {
        let pid = alive_pid(victim)?;
        history.record(fault_event(Fault::Restart, &victim.label(), pid, note));
        self.paused.remove(&pid);
        let took = victim.restart_now()?;
        let new_pid = victim.pid().unwrap_or_default();
        history.record(restarted_event(&victim.label(), new_pid, took, back(took)));
        Ok(took)
    }

    /// Starts again a victim that was killed earlier and stayed down (a server kept down
    /// a while): only its return is recorded, with the line `back` makes of how long the
    /// start took (`restart_ms`) — its crash is the kill, recorded when it happened.
    pub fn start_again(
        &mut self,
        history: &mut impl Record,
        victim: &mut dyn Victim,
        back: impl FnOnce(Duration) -> Note,
    ) -> Result<Duration> {
        let took = victim.restart_now()?;
        let pid = victim.pid().unwrap_or_default();
        history.record(restarted_event(&victim.label(), pid, took, back(took)));
        Ok(took)
    }

    /// The start of a restart whose end the nemesis does not wait for: the victim is
    /// killed, and comes back by itself ([`Victim::returns_by_itself`]: a Sentinel
    /// failover); whoever sees it back records the end ([`restarted_event`]).
    pub fn crash(
        &mut self,
        history: &mut impl Record,
        victim: &mut dyn Victim,
        note: impl Into<Note>,
    ) -> Result<()> {
        self.kill_as(Fault::Restart, history, victim, note.into())
    }

    /// The victims this nemesis paused and has not resumed, by label.
    pub fn paused(&self) -> Vec<String> {
        let mut labels: Vec<String> = self.paused.values().map(|a| a.label.clone()).collect();
        labels.sort();
        labels
    }

    /// Resumes everything still paused, without recording: for the way out of a lab that
    /// failed or was interrupted, so that no process is left stopped.
    pub fn heal(&mut self) {
        for (pid, active) in self.paused.drain() {
            let _ = procs::signal_group(pid, Signal::SIGCONT);
            active.let_go();
        }
    }
}

impl Active {
    fn now(victim: &dyn Victim) -> Active {
        Active {
            label: victim.label(),
            since: Instant::now(),
            user: victim.user(),
            freezer: victim.freezer(),
        }
    }

    /// The rest of a resume, after SIGCONT to its group: every process of its user, and
    /// its cgroup thawed.
    fn let_go(&self) {
        if let Some(uid) = self.user {
            procs::signal_every_process_of(uid, Signal::SIGCONT);
        }
        if let Some(freezer) = &self.freezer {
            crate::freezer::thaw(freezer);
        }
    }
}

impl Drop for Nemesis {
    fn drop(&mut self) {
        self.heal();
    }
}

fn alive_pid(victim: &dyn Victim) -> Result<i32> {
    match victim.pid() {
        Some(pid) => Ok(pid),
        None => bail!(
            "{} has no running process to aim a fault at",
            victim.label()
        ),
    }
}

/// The history's record of a restart's end: the victim answers again (kind `resumed`,
/// phase `end`) after `took` (`restart_ms`).
pub fn restarted_event(target: &str, pid: i32, took: Duration, mut back: Note) -> Event {
    back.facts.restart_ms = Some(took.as_millis() as u64);
    let mut end = fault_event(Fault::Restart, target, pid, back);
    end.what = match end.what {
        What::Killed(mut facts) => {
            facts.phase = Some(Phase::End);
            What::Resumed(facts)
        }
        other => other,
    };
    end
}

/// The history's record of one fault: in the lab's lane, with the fault's name, its target,
/// the pid it hit and whether it starts or ends the fault, then the lab's own facts.
pub fn fault_event(fault: Fault, target: &str, pid: i32, note: impl Into<Note>) -> Event {
    let note = note.into();
    let phase = if matches!(fault, Fault::Resume | Fault::Heal) {
        Phase::End
    } else {
        Phase::Start
    };
    let facts = FaultFacts {
        fault: Some(fault),
        target: Some(target.into()),
        pid: Some(pid),
        phase: Some(phase),
        ..note.facts
    };
    Event::new(LANE, fault.record(facts), note.words)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Kind;
    use std::process::Command;

    struct Sleeper {
        child: Option<std::process::Child>,
    }

    impl Sleeper {
        fn start() -> Sleeper {
            let mut command = Command::new("sleep");
            command.arg("30");
            procs::tie_to_parent(&mut command);
            let child = procs::spawn_registered(&mut command, procs::StopPlan::kill()).unwrap();
            Sleeper { child: Some(child) }
        }
    }

    impl Victim for Sleeper {
        fn label(&self) -> String {
            "S".into()
        }
        fn pid(&self) -> Option<i32> {
            self.child.as_ref().map(|c| c.id() as i32)
        }
        fn kill_now(&mut self) {
            if let Some(child) = self.child.take() {
                procs::stop(child.id() as i32, &procs::StopPlan::kill());
            }
        }
    }

    impl Drop for Sleeper {
        fn drop(&mut self) {
            self.kill_now();
        }
    }

    #[derive(Default)]
    struct Log(Vec<Event>);

    impl Record for Log {
        fn record(&mut self, event: Event) {
            self.0.push(event);
        }
    }

    #[test]
    fn a_pause_is_recorded_at_its_start_and_its_end_with_how_long_it_lasted() {
        let mut log = Log::default();
        let mut nemesis = Nemesis::new();
        let sleeper = Sleeper::start();
        let pid = sleeper.pid().unwrap();
        nemesis.pause(&mut log, &sleeper, "freeze S").unwrap();
        assert_eq!(procs::process_state(pid), Some('T'));
        assert_eq!(nemesis.paused(), vec!["S".to_string()]);
        std::thread::sleep(Duration::from_millis(30));
        let lasted = nemesis.resume(&mut log, &sleeper, "thaw S").unwrap();
        assert!(lasted >= Duration::from_millis(30));
        assert_ne!(procs::process_state(pid), Some('T'));
        assert!(nemesis.paused().is_empty());
        let kinds: Vec<Kind> = log.0.iter().map(|e| e.kind()).collect();
        assert_eq!(kinds, vec![Kind::Frozen, Kind::Resumed]);
        let (start, end) = (log.0[0].fault().unwrap(), log.0[1].fault().unwrap());
        assert_eq!(start.fault, Some(Fault::Pause));
        assert_eq!(start.phase, Some(Phase::Start));
        assert_eq!(end.phase, Some(Phase::End));
        assert_eq!(end.target.as_deref(), Some("S"));
        assert!(end.paused_ms.unwrap() >= 30);
    }

    #[test]
    fn dropping_the_nemesis_resumes_what_it_left_paused() {
        let mut log = Log::default();
        let sleeper = Sleeper::start();
        let pid = sleeper.pid().unwrap();
        {
            let mut nemesis = Nemesis::new();
            nemesis.pause(&mut log, &sleeper, "freeze S").unwrap();
            assert_eq!(procs::process_state(pid), Some('T'));
        }
        assert_ne!(procs::process_state(pid), Some('T'));
        assert_eq!(log.0.len(), 1, "healing on the way out records nothing");
    }

    #[test]
    fn a_kill_ends_a_paused_victim_and_leaves_no_zombie() {
        let mut log = Log::default();
        let mut nemesis = Nemesis::new();
        let mut sleeper = Sleeper::start();
        let pid = sleeper.pid().unwrap();
        nemesis.pause(&mut log, &sleeper, "freeze S").unwrap();
        nemesis.kill(&mut log, &mut sleeper, "kill S").unwrap();
        assert_eq!(procs::process_state(pid), None, "killed and reaped");
        assert!(nemesis.paused().is_empty());
        let last = log.0.last().unwrap().fault().unwrap();
        assert_eq!(last.fault, Some(Fault::Kill));
        let err = nemesis.kill(&mut log, &mut sleeper, "again").unwrap_err();
        assert!(format!("{err}").contains("no running process"), "{err}");
    }

    #[test]
    fn a_victim_that_cannot_restart_says_so() {
        let mut log = Log::default();
        let mut nemesis = Nemesis::new();
        let mut sleeper = Sleeper::start();
        let err = nemesis
            .restart(&mut log, &mut sleeper, "restart S", |_| Note::default())
            .unwrap_err();
        assert!(format!("{err}").contains("cannot be restarted"), "{err}");
    }
}
