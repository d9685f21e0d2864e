//! The shared player, played on `sleep` processes: no servers, no workers.

use super::*;
use crate::events::{Event, What};
use crate::nemesis::Note;
use crate::nemesis::schedule::{Anchor, Step};
use crate::output::Style;
use crate::procs;

/// A `sleep` the tests pause and kill: a victim without servers.
struct Sleep(Option<std::process::Child>);

impl Sleep {
    fn start() -> Sleep {
        let mut command = std::process::Command::new("sleep");
        command.arg("30");
        procs::tie_to_parent(&mut command);
        Sleep(Some(
            procs::spawn_registered(&mut command, procs::StopPlan::kill()).unwrap(),
        ))
    }
}

impl Victim for Sleep {
    fn label(&self) -> String {
        "S".into()
    }
    fn pid(&self) -> Option<i32> {
        self.0.as_ref().map(|child| child.id() as i32)
    }
    fn kill_now(&mut self) {
        if let Some(child) = self.0.take() {
            procs::stop(child.id() as i32, &procs::StopPlan::kill());
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        self.kill_now();
    }
}

fn step(at_ms: u64, fault: Fault, duration_ms: Option<u64>) -> Step {
    Step {
        at_ms,
        after: None,
        fault,
        target: "S".into(),
        duration_ms,
    }
}

fn stage() -> Stage {
    Stage::new(Style {
        json: true,
        fancy: false,
    })
    .quiet()
}

fn kinds(stage: &Stage) -> Vec<Kind> {
    stage.log.iter().map(Event::kind).collect()
}

const LONG: Duration = Duration::from_secs(10);

#[test]
fn a_timed_pause_is_played_and_ended_by_the_nemesis() {
    let mut stage = stage();
    let mut sleep = Sleep::start();
    let mut nemesis = Nemesis::new();
    let schedule = Schedule::new(vec![step(10, Fault::Pause, Some(20))]);
    let mut faults = Faults::new(&schedule, &stage);
    let mut cast: [&mut dyn Victim; 1] = [&mut sleep];
    stage
        .play(&mut faults, &mut nemesis, &mut cast, Until::done(LONG))
        .unwrap();
    assert_eq!(kinds(&stage), vec![Kind::Frozen, Kind::Resumed]);
    assert!(faults.finished());
    assert!(nemesis.paused().is_empty());
    assert_ne!(procs::process_state(sleep.pid().unwrap()), Some('T'));
}

#[test]
fn a_step_aimed_at_the_work_plays_after_its_nth_event() {
    let mut stage = stage();
    let mut sleep = Sleep::start();
    let mut nemesis = Nemesis::new();
    let kill = Step {
        after: Some(Anchor::on("S", Kind::Working, 2)),
        ..step(0, Fault::Kill, None)
    };
    let mut faults = Faults::new(&Schedule::new(vec![kill]), &stage);
    let mut cast: [&mut dyn Victim; 1] = [&mut sleep];
    let mut said = 0;
    let tick = |stage: &mut Stage| {
        if said < 3 {
            said += 1;
            stage.record(Event::new("S", What::Working, "at work"));
        }
        Ok(())
    };
    let until = Until::done(LONG);
    stage
        .play_ticking(&mut faults, &mut nemesis, &mut cast, until, tick)
        .unwrap();
    let seen = kinds(&stage);
    let killed = seen.iter().position(|k| *k == Kind::Killed).unwrap();
    let working_before = seen[..killed].iter().filter(|k| **k == Kind::Working);
    assert_eq!(working_before.count(), 2, "{seen:?}");
    assert_eq!(sleep.pid(), None, "killed");
}

#[test]
fn a_play_can_stop_between_two_actions_due_at_once() {
    let mut stage = stage();
    let mut sleep = Sleep::start();
    let pid = sleep.pid().unwrap();
    let mut nemesis = Nemesis::new();
    let schedule = Schedule::new(vec![
        step(0, Fault::Pause, None),
        step(0, Fault::Kill, None),
    ]);
    let mut faults = Faults::new(&schedule, &stage)
        .saying(|cue| Note::from(format!("{} pid {}", cue.action.fault.as_str(), cue.pid)));
    let mut cast: [&mut dyn Victim; 1] = [&mut sleep];
    let paused = Until::acted(Fault::Pause, "S", LONG);
    stage
        .play(&mut faults, &mut nemesis, &mut cast, paused)
        .unwrap();
    assert_eq!(kinds(&stage), vec![Kind::Frozen]);
    assert_eq!(procs::process_state(pid), Some('T'));
    assert_eq!(stage.log[0].text, format!("pause pid {pid}"));
    stage
        .play(&mut faults, &mut nemesis, &mut cast, Until::done(LONG))
        .unwrap();
    assert_eq!(kinds(&stage), vec![Kind::Frozen, Kind::Killed]);
    assert_eq!(procs::process_state(pid), None);
}

#[test]
fn a_victim_that_stops_itself_has_its_pause_adopted() {
    let mut stage = stage();
    let mut sleep = Sleep::start();
    let pid = sleep.pid().unwrap();
    procs::signal_group(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let mut nemesis = Nemesis::new();
    let schedule = Schedule::new(vec![step(0, Fault::Pause, Some(10))]);
    let mut faults = Faults::new(&schedule, &stage).self_pausing("S");
    let mut cast: [&mut dyn Victim; 1] = [&mut sleep];
    stage
        .play(&mut faults, &mut nemesis, &mut cast, Until::done(LONG))
        .unwrap();
    assert_eq!(kinds(&stage), vec![Kind::Frozen, Kind::Resumed]);
    assert_ne!(procs::process_state(pid), Some('T'));
}

#[test]
fn what_cannot_be_played_is_skipped_or_refused() {
    let mut stage = stage();
    let mut nemesis = Nemesis::new();
    let gone = Step {
        target: "nobody".into(),
        ..step(0, Fault::Kill, None)
    };
    let resume = step(0, Fault::Resume, None);
    let mut faults = Faults::new(&Schedule::new(vec![gone, resume]), &stage);
    let mut sleep = Sleep::start();
    let mut cast: [&mut dyn Victim; 1] = [&mut sleep];
    stage
        .play(&mut faults, &mut nemesis, &mut cast, Until::done(LONG))
        .unwrap();
    assert!(stage.log.is_empty(), "{:?}", kinds(&stage));
    // Each step skipped is named, with why.
    let said: Vec<String> = (faults.unplayed().iter())
        .map(|(step, why)| format!("{} {}: {why}", step.fault.as_str(), step.target))
        .collect();
    assert_eq!(
        said,
        [
            "kill nobody: this run has nothing named nobody",
            "resume S: S was not paused"
        ]
    );
    // A network fault is the same player's: aimed at a path the run has no proxy on, it
    // is skipped, with why.
    let cut = Schedule::new(vec![step(0, Fault::Cut, None)]);
    let mut faults = Faults::new(&cut, &stage);
    stage
        .play(&mut faults, &mut nemesis, &mut cast, Until::done(LONG))
        .unwrap();
    let why: Vec<String> = faults.unplayed().into_iter().map(|(_, why)| why).collect();
    assert_eq!(why, ["this run has no proxy on S"]);
    let never = Until::holds("never", Duration::from_millis(20), |_, _| false);
    let err = stage
        .play(&mut faults, &mut nemesis, &mut cast, never)
        .unwrap_err();
    assert!(format!("{err}").contains("waiting for never"), "{err}");
    // A pause after a kill, and a kill whose time never came before the play ended.
    let after_kill = Schedule::new(vec![
        step(0, Fault::Kill, None),
        step(5, Fault::Pause, Some(10)),
        step(60_000, Fault::Kill, None),
    ]);
    let mut sleep = Sleep::start();
    let mut cast: [&mut dyn Victim; 1] = [&mut sleep];
    let mut faults = Faults::new(&after_kill, &stage);
    let paused_or_gone = Until::holds("the pause's turn", LONG, |_, faults| {
        !faults.skipped().is_empty()
    });
    stage
        .play(&mut faults, &mut nemesis, &mut cast, paused_or_gone)
        .unwrap();
    let why: Vec<String> = (faults.unplayed().into_iter())
        .map(|(_, why)| why)
        .collect();
    assert_eq!(why.len(), 2, "{why:?}");
    assert_eq!(why[0], "S had been killed already");
    assert!(why[1].starts_with("it was due at +60000ms"), "{why:?}");
}

#[test]
fn the_schedule_reads_in_short_lines() {
    let anchored = Step {
        after: Some(Anchor::on("A", Kind::Working, 1)),
        target: "A".into(),
        ..step(0, Fault::Pause, Some(3000))
    };
    let lines = lines(&Schedule::new(vec![anchored]));
    assert_eq!(lines[1], "  pause A for 3.000s, 0ms after A's working #1");
    assert!(lines.iter().all(|line| line.chars().count() <= 80));
}
