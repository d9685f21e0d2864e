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

/// How long the play kept its victim stopped: from its SIGSTOP's event to its SIGCONT's.
fn stopped_ms(stage: &Stage) -> u64 {
    let at = |kind: Kind| stage.log.iter().find(|e| e.kind() == kind).unwrap().t_ms;
    at(Kind::Resumed) - at(Kind::Frozen)
}

/// A pause of 100ms sent 150ms late (the lab's loop busy), both its SIGSTOP and its
/// SIGCONT due by the time the play looks: timed from its due moment it lasts next to
/// nothing; lasting from its SIGSTOP, its 100ms. A second pause due while the first is
/// on is not sent, and its resume does not end the first.
#[test]
fn a_pause_sent_late_lasts_its_duration_from_its_sigstop() {
    let late = Duration::from_millis(150);
    let play = |steps: Vec<Step>, from_sigstop: bool| {
        let mut stage = stage();
        let mut sleep = Sleep::start();
        let mut nemesis = Nemesis::new();
        let mut faults = Faults::new(&Schedule::new(steps), &stage);
        if from_sigstop {
            faults = faults.pauses_lasting_from_sigstop("S");
        }
        let mut cast: [&mut dyn Victim; 1] = [&mut sleep];
        std::thread::sleep(late);
        stage
            .play(&mut faults, &mut nemesis, &mut cast, Until::done(LONG))
            .unwrap();
        assert!(nemesis.paused().is_empty());
        assert_eq!(kinds(&stage), vec![Kind::Frozen, Kind::Resumed]);
        stopped_ms(&stage)
    };
    let one = || vec![step(0, Fault::Pause, Some(100))];
    assert!(play(one(), false) < 50, "timed from when it was due");
    assert!(play(one(), true) >= 100, "lasting from its SIGSTOP");
    let two = vec![
        step(0, Fault::Pause, Some(100)),
        step(30, Fault::Pause, Some(100)),
    ];
    assert!(play(two, true) >= 100, "the second pause's resume left out");
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

/// A proxy in front of a listener of the test's own: a path the player can put faults on,
/// and a connection through it.
struct Path {
    proxy: crate::proxy::Proxy,
    _server: std::net::TcpListener,
}

impl Path {
    fn start(name: &str) -> Path {
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = crate::proxy::Proxy::start(name, server.local_addr().unwrap()).unwrap();
        Path {
            proxy,
            _server: server,
        }
    }
}

/// Each network fault's line, as the test's words put it: `fault path (end)`.
fn net_words(cue: &Cue) -> Note {
    let net = cue.net.as_ref().expect("a network fault");
    Note::from(format!(
        "{} {} {:?}",
        cue.action.fault.as_str(),
        net.path,
        net.end
    ))
}

fn net_step(at_ms: u64, fault: Fault, path: &str, duration_ms: Option<u64>) -> Step {
    Step {
        target: path.into(),
        ..step(at_ms, fault, duration_ms)
    }
}

/// Chaos's network faults, played by the one player: a timed cut holds the path it
/// spreads to as well and heals both; a delay ends once the proxy has let the request go;
/// one nothing went through is healed at the run's end and did not play.
#[test]
fn a_cut_spreads_and_a_delay_ends_when_the_proxy_saw_it_through() {
    use crate::nemesis::play::NetEnd;
    use std::io::Write;
    let mut stage = stage();
    let mut nemesis = Nemesis::new();
    let (lock, store, other) = (Path::start("A→x"), Path::start("A→y"), Path::start("B→y"));
    let schedule = Schedule::new(vec![
        net_step(0, Fault::Cut, "A→x", Some(20)),
        net_step(50, Fault::Delay, "A→y", Some(30)),
        net_step(50, Fault::Delay, "B→y", Some(30)),
    ]);
    let mut faults = Faults::new(&schedule, &stage)
        .saying(net_words)
        .on_path(&lock.proxy)
        .on_path(&store.proxy)
        .on_path(&other.proxy)
        .cut_spreads("A→x", "A→y")
        .ending_when_seen();
    let mut sent = false;
    let mut a = std::net::TcpStream::connect(store.proxy.addr()).unwrap();
    let until = Until::holds("A's delay seen through", LONG, |stage, _| {
        stage.log.iter().any(|e| e.text.contains("Seen"))
    });
    let tick = |stage: &mut Stage| {
        // A writes once its delay is on: the proxy lets it go late, and says so.
        if !sent && stage.log.iter().any(|e| e.text.starts_with("delay A→y")) {
            sent = true;
            a.write_all(b"late").unwrap();
        }
        Ok(())
    };
    stage
        .play_ticking(&mut faults, &mut nemesis, &mut [], until, tick)
        .unwrap();
    faults.finish(&mut stage, &mut nemesis);
    let said: Vec<&str> = stage.log.iter().map(|e| e.text.as_str()).collect();
    let timed = format!("{:?}", Some(NetEnd::Timed));
    assert_eq!(
        said[..4],
        [
            "cut A→x None".to_string(),
            "cut A→y None".into(),
            format!("heal A→x {timed}"),
            format!("heal A→y {timed}"),
        ]
    );
    let late = (said.iter()).find(|s| s.starts_with("heal A→y Some(Seen(DelayedSent"));
    assert!(late.is_some(), "{said:?}");
    let over = format!("heal B→y {:?}", Some(NetEnd::RunOver(Fault::Delay)));
    assert_eq!(said.last().copied(), Some(over.as_str()), "{said:?}");
    assert!(nemesis.faulty_paths().is_empty());
    let why: Vec<String> = (faults.unplayed().into_iter())
        .map(|(step, why)| format!("{}: {why}", step.target))
        .collect();
    assert_eq!(
        why,
        ["B→y: it was put on B→y, and B sent nothing more on it before the run ended"]
    );
}

/// A server that comes back by itself after its crash (a primary the Sentinels replace),
/// and says when: on the second time it is asked.
struct Returning {
    sleep: Sleep,
    asked: u32,
}

impl Victim for Returning {
    fn label(&self) -> String {
        "S".into()
    }
    fn pid(&self) -> Option<i32> {
        self.sleep.pid()
    }
    fn kill_now(&mut self) {
        self.sleep.kill_now();
    }
    fn returns_by_itself(&self) -> bool {
        true
    }
    fn has_returned(&mut self) -> anyhow::Result<crate::nemesis::Return> {
        self.asked += 1;
        Ok(match self.asked {
            1 => crate::nemesis::Return::NotYet,
            _ => crate::nemesis::Return::Back {
                took: Duration::from_millis(7),
                note: Box::new(Note::from("back: promoted")),
            },
        })
    }
}

/// The end of a failover, played by the one player: the crash is recorded, the play holds
/// until the victim says it is back, and its return is recorded with how long it took.
#[test]
fn a_crash_that_comes_back_by_itself_is_awaited_and_its_return_recorded() {
    let mut stage = stage();
    let mut nemesis = Nemesis::new();
    let mut victim = Returning {
        sleep: Sleep::start(),
        asked: 0,
    };
    let schedule = Schedule::new(vec![step(0, Fault::Restart, None)]);
    let mut faults = Faults::new(&schedule, &stage);
    let mut cast: [&mut dyn Victim; 1] = [&mut victim];
    let until = Until::holds("the return", LONG, |_, faults| {
        faults.finished() && !faults.holding()
    });
    stage
        .play(&mut faults, &mut nemesis, &mut cast, until)
        .unwrap();
    assert_eq!(kinds(&stage), vec![Kind::Killed, Kind::Resumed]);
    assert_eq!(stage.log[1].text, "back: promoted");
    let What::Resumed(facts) = &stage.log[1].what else {
        unreachable!()
    };
    assert_eq!(facts.restart_ms, Some(7));
    assert_eq!(victim.asked, 2);
}
