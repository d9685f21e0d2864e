//! What every scenario of lab 6 plays on: the masters, the clients A and B (played by the
//! lab itself), the faults aimed at the masters (through the nemesis) and the read-backs.

use std::time::{Duration, Instant};

use anyhow::Result;
use colored::Colorize;

use super::Plan;
use super::verdict::ClientRound;
use crate::check::Finding;
use crate::check::redlock::{self as check, MasterState, Round};
use crate::connect::{self, Backend};
use crate::events::facts::{self, HolderNow, MasterSeen, Released};
use crate::events::{Event, Kind, What};
use crate::labs::Stage;
use crate::labs::faults::{Faults, Until};
use crate::labs::runner::Run;
use crate::labs::stage::History;
use crate::lock::redlock::{self, Attempt, Master, Redlock, Reply, Settings};
use crate::nemesis::victims::Server;
use crate::nemesis::{Fault, Nemesis, Victim};
use crate::output::{Style, human};
use crate::servers::{Lifetime, PrivateServers};
use crate::worker::redlock_client::{indent, round_text};

/// A read-back of the masters gets this long per master: they are local, and one that
/// does not answer in time is reported as such.
pub(super) const READ_TIMEOUT: Duration = Duration::from_millis(300);

/// The lab's state across scenarios: the masters, one stage, one clock, one nemesis.
pub(super) struct Scene {
    pub(super) settings: Settings,
    /// One private server per master: each can be killed, frozen and restarted alone.
    /// Empty when the masters are the user's (`--master`): those the lab never touches.
    pub(super) private: Vec<PrivateServers>,
    /// Every master's URL, private or given.
    urls: Vec<String>,
    pub(super) stage: Stage,
    /// Every fault on a master or on the paused client goes through it.
    pub(super) nemesis: Nemesis,
    style: Style,
    /// The run's one clock: every scenario's events are stamped from here.
    started: Instant,
    /// The run's history, which every scenario's stage keeps its events in.
    history: History,
    pub(super) run_id: String,
    /// Which client wrote which lock value: read-backs name the client, not the value.
    pub(super) values: Vec<(String, String)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Condition {
    Up,
    Down,
    Frozen,
}

impl Scene {
    /// Starts the plan's masters (or checks that the given ones answer) and says so under
    /// the heading, with the algorithm's arithmetic.
    pub(super) fn start(plan: &Plan, run: &Run) -> Result<Scene> {
        let n = plan.n;
        let given = !plan.given.is_empty();
        let starting = Instant::now();
        let private = if given {
            Vec::new()
        } else {
            start_private_masters(n)?
        };
        let urls: Vec<String> = if given {
            plan.given.clone()
        } else {
            private
                .iter()
                .map(|m| m.url(Backend::Redis).unwrap_or_default())
                .collect()
        };
        let ports: Vec<String> = urls.iter().map(|url| port_of(url)).collect();
        if given {
            check_given_masters(&urls)?;
            say_given_masters(plan, run, &urls);
        } else {
            run.detail(&format!(
                "{n} private Redis masters on ports {} (ready in {})\n  no replication, no persistence",
                ports.join(" "),
                human(starting.elapsed())
            ));
        }
        let settings = plan.settings.clone();
        say_the_arithmetic(run, &settings, n);
        let masters_seen = masters_seen(&private, &urls, &ports);
        let mut scene = Scene {
            settings,
            private,
            urls,
            stage: run.stage(),
            nemesis: Nemesis::new(),
            style: run.style,
            started: run.started,
            history: run.history.clone(),
            run_id: run.id.clone(),
            values: Vec::new(),
        };
        let run_id = &run.id;
        scene.stage.record(Event::new(
            "lab",
            facts::RunFacts {
                run_id: Some(run_id.clone()),
                masters: Some(masters_seen),
                ..facts::RunFacts::default()
            },
            format!("run {run_id}: the lock is the key lockslab:{run_id}:redlock:<scenario>"),
        ));
        Ok(scene)
    }

    pub(super) fn n(&self) -> usize {
        self.urls.len()
    }

    pub(super) fn q(&self) -> usize {
        redlock::quorum(self.n())
    }

    pub(super) fn url(&self, i: usize) -> String {
        self.urls[i].clone()
    }

    pub(super) fn port(&self, i: usize) -> String {
        port_of(&self.urls[i])
    }

    pub(super) fn names(&self, indexes: impl IntoIterator<Item = usize>) -> String {
        indexes.into_iter().map(name).collect::<Vec<_>>().join(", ")
    }

    pub(super) fn key(&self, scenario: &str) -> String {
        format!("lockslab:{}:redlock:{scenario}", self.run_id)
    }

    pub(super) fn lock(&self, key: &str) -> Redlock {
        let masters = (0..self.n())
            .map(|i| Master::new(&name(i), &self.url(i)))
            .collect();
        Redlock::new(masters, key, self.settings.clone())
    }

    /// How far into the run `at` is, on the run's one clock.
    pub(super) fn since_start(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.started)
    }

    /// A client's round on the run's clock, for the checkers.
    pub(super) fn round(&self, attempt: &Attempt) -> Round {
        let began = attempt
            .started
            .map_or(Duration::ZERO, |s| self.since_start(s));
        Round {
            held: attempt.held,
            began,
            ended: began + Duration::from_secs_f64(attempt.elapsed_ms.max(0.0) / 1000.0),
            validity_ms: attempt.validity_ms,
        }
    }

    /// Starts a scenario: a stage of its own (its events only, so that waiting for "A
    /// acquired" never finds another scenario's A), on the run's one clock.
    pub(super) fn heading(&mut self, scenario: &str, title: &str) {
        self.stage = Stage::on_clock(self.style, self.started).recorded_in(&self.history);
        self.stage.tags().scenario = Some(scenario.into());
        self.stage.timeline.say("");
        self.stage
            .timeline
            .say(&format!("{}", format!("── {title} ──").bold()));
    }

    pub(super) fn note(&mut self, text: &str) {
        self.stage
            .record(Event::new("lab", facts::RunFacts::default(), text));
    }

    /// One round of `client` on `lock`, shown master by master.
    pub(super) fn acquire(&mut self, client: &str, lock: &mut Redlock) -> Attempt {
        let attempt = lock.try_acquire();
        self.record_round(client, lock, attempt)
    }

    /// One round of `client` on `lock` with each master's grant recorded the moment it is
    /// in ([`What::Granted`]), and `faults` played on it before the next master is asked:
    /// a fault timed from "m2 granted A" lands in the middle of A's round, and the time it
    /// takes is part of the round's elapsed time, as anything that happens during it is.
    pub(super) fn acquire_playing(
        &mut self,
        client: &str,
        lock: &mut Redlock,
        faults: &mut Faults,
    ) -> Result<Attempt> {
        let (key, masters) = (lock.key.clone(), lock.masters.len());
        let quorum = redlock::quorum(masters);
        let Scene { stage, nemesis, .. } = self;
        let (mut granted, mut failed) = (0, None);
        let attempt = lock.try_acquire_seen(|answer| {
            if answer.reply != Reply::Granted || failed.is_some() {
                return;
            }
            granted += 1;
            let facts = facts::Granted {
                lock: key.clone(),
                answer: answer.clone(),
                granted,
                masters,
                quorum,
            };
            stage.record(Event::new(
                client,
                facts,
                format!(
                    "{} granted (OK in {:.1}ms): {granted} of {masters} so far, quorum {quorum}",
                    answer.master, answer.took_ms
                ),
            ));
            let due = Until::nothing_due(Duration::from_secs(30));
            if let Err(why) = stage.play(faults, nemesis, &mut [], due) {
                failed = Some(why);
            }
        });
        match failed {
            Some(why) => Err(why),
            None => Ok(self.record_round(client, lock, attempt)),
        }
    }

    /// Records `client`'s round on `lock`: its grant, or its giving up, with every
    /// master's answer and the arithmetic.
    fn record_round(&mut self, client: &str, lock: &Redlock, attempt: Attempt) -> Attempt {
        self.values
            .push((attempt.value.clone(), client.to_string()));
        let owner = Some(attempt.value.clone());
        let (what, conclusion) = if attempt.held {
            let got = facts::Acquired {
                lock: Some(lock.key.clone()),
                owner,
                attempt: Some(Box::new(attempt.clone())),
                ..Default::default()
            };
            (What::Acquired(got), "holds the lock")
        } else {
            let gave_up = facts::GaveUp {
                owner,
                attempt: Some(Box::new(attempt.clone())),
                ..Default::default()
            };
            (What::GaveUp(gave_up), "does not get the lock")
        };
        self.stage
            .record(Event::new(client, what, round_text(conclusion, &attempt)));
        attempt
    }

    pub(super) fn release(&mut self, client: &str, lock: &mut Redlock, attempt: &Attempt) {
        let answers = lock.release(&attempt.value);
        let deleted = answers.iter().filter(|a| a.reply == Reply::Deleted).count();
        let lines: Vec<String> = answers.iter().map(redlock::answer_line).collect();
        self.stage.record(Event::new(
            client,
            Released {
                answers: Some(answers.clone()),
                ..Released::default()
            },
            format!(
                "releases on all {} masters (deleted on {deleted}):\n{}",
                answers.len(),
                indent(&lines)
            ),
        ));
    }

    /// Plays `faults` on the masters until `until` holds: each fault aimed at `m3` goes to
    /// the third master, if it is the lab's own (with `--master` none is: nothing is aimed
    /// at them).
    pub(super) fn play(&mut self, faults: &mut Faults, until: Until) -> Result<()> {
        let Scene {
            private,
            stage,
            nemesis,
            ..
        } = self;
        let mut masters: Vec<Server> = (private.iter_mut().enumerate())
            .map(|(i, server)| Server::new(server, Backend::Redis, &name(i)))
            .collect();
        let mut cast: Vec<&mut dyn Victim> = (masters.iter_mut())
            .map(|master| master as &mut dyn Victim)
            .collect();
        stage.play(faults, nemesis, &mut cast, until)
    }

    /// What the part's faults have done to master `i` so far, by its history: a read-back
    /// does not wait on a master the lab froze or killed itself.
    fn condition(&self, i: usize) -> Condition {
        let master = name(i);
        let last = (self.stage.log.iter().rev())
            .find(|e| e.fault().and_then(|f| f.target.as_deref()) == Some(master.as_str()));
        match last.map(|e| &e.what) {
            Some(What::Killed(_)) => Condition::Down,
            Some(What::Frozen(_)) => Condition::Frozen,
            _ => Condition::Up,
        }
    }

    /// How long master `name` was down the last time the lab killed it, by the history:
    /// from its kill to its return.
    pub(super) fn down_for(&self, master: &str) -> Option<Duration> {
        let log = &self.stage.log;
        let on = |e: &Event, fault| {
            (e.fault()).is_some_and(|f| f.target.as_deref() == Some(master) && f.fault == fault)
        };
        let killed = log.iter().rposition(|e| on(e, Some(Fault::Kill)))?;
        let back = log[killed..]
            .iter()
            .find(|e| on(e, Some(Fault::Restart)) && e.kind() == Kind::Resumed)?;
        Some(Duration::from_millis(back.t_ms - log[killed].t_ms))
    }

    /// GET and PTTL of `key` on every master: who holds it where, by the masters' answers.
    pub(super) fn read_back(&mut self, key: &str, heading: &str) -> Vec<MasterState> {
        let mut states = Vec::new();
        for i in 0..self.n() {
            let mut master = Master::new(&name(i), &self.url(i));
            let asked = match self.condition(i) {
                Condition::Up => master.read(key, READ_TIMEOUT),
                Condition::Down => Err("down (killed by the lab)".to_string()),
                Condition::Frozen => Err("frozen by the lab: not asked".to_string()),
            };
            let port = master.port().to_string();
            states.push(self.state_of(&master.name, port, asked));
        }
        self.record_masters(key, heading, &states);
        states
    }

    /// One master's answer to a read-back (its GET and PTTL, or why none came), with the
    /// value named by the client that wrote it.
    pub(super) fn state_of(
        &self,
        master: &str,
        port: String,
        asked: Result<(Option<String>, i64), String>,
    ) -> MasterState {
        let (holder, pttl_ms, why) = match asked {
            Ok((value, pttl)) => (value.map(|v| self.client_of(&v)), Some(pttl), None),
            Err(why) => (None, None, Some(why)),
        };
        MasterState {
            master: master.into(),
            port,
            holder,
            pttl_ms,
            answered: why.is_none(),
            why,
        }
    }

    /// Records the masters' answers on `key` (a read-back), under `heading`.
    pub(super) fn record_masters(&mut self, key: &str, heading: &str, states: &[MasterState]) {
        let lines: Vec<String> = states.iter().map(super::verdict::state_line).collect();
        self.stage.record(Event::new(
            "masters",
            HolderNow {
                key: Some(key.into()),
                masters: Some(states.to_vec()),
                ..HolderNow::default()
            },
            format!("{heading}:\n{}", indent(&lines)),
        ));
    }

    pub(super) fn client_of(&self, value: &str) -> String {
        self.values
            .iter()
            .find(|(v, _)| v == value)
            .map(|(_, client)| client.clone())
            .unwrap_or_else(|| "other".to_string())
    }

    /// B's round on `key` after A's: its lock, its attempt, the masters read back right
    /// after it, and whether both held a majority's grant at that moment (said on screen).
    pub(super) fn b_asks(
        &mut self,
        key: &str,
        a: &Attempt,
    ) -> (Redlock, Attempt, Vec<MasterState>, bool) {
        let mut b_lock = self.lock(key);
        let b = self.acquire("B", &mut b_lock);
        let read = self.read_back(key, "the masters, right after B's round");
        let (a_round, b_round) = (self.round(a), self.round(&b));
        let two = check::two_holders(&a_round, &b_round) == Finding::Yes;
        if two {
            let left = check::validity_left_ms(&a_round, &b_round);
            // Said, not recorded: the checker concludes it again from the rounds and the
            // masters' answers the history holds.
            self.stage.conclude(crate::labs::Conclusion {
                lane: "masters",
                text: format!("TWO HOLDERS: B holds a majority, A's validity has {left}ms to run"),
                broken: true,
            });
        }
        (b_lock, b, read, two)
    }
}

/// Master `i`'s name: `m1`…
pub(super) fn name(i: usize) -> String {
    format!("m{}", i + 1)
}

fn port_of(url: &str) -> String {
    Master::new("", url).port().to_string()
}

pub(super) fn round(client: &str, attempt: &Attempt) -> ClientRound {
    ClientRound {
        client: client.to_string(),
        attempt: attempt.clone(),
    }
}

/// `n` private Redis masters, started from this (the main) thread one after another: each
/// server's parent-death signal is tied to the thread that starts it, which must outlive it.
fn start_private_masters(n: usize) -> Result<Vec<PrivateServers>> {
    (0..n)
        .map(|_| PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun))
        .collect()
}

/// Each of the user's masters (`--master`) must answer PING before the run touches it.
fn check_given_masters(urls: &[String]) -> Result<()> {
    for (i, url) in urls.iter().enumerate() {
        let mut master = Master::new(&name(i), url);
        master
            .command::<String>(&redis::cmd("PING"), Duration::from_secs(2))
            .map_err(|why| {
                anyhow::anyhow!(
                    "Redis master {} at {} did not answer PING: {why}; check that --master URL",
                    name(i),
                    connect::redact(url)
                )
            })?;
    }
    Ok(())
}

/// Under the heading: the user's masters (their passwords hidden), what the run leaves on
/// them, and the scenarios that need masters of lockslab's own.
fn say_given_masters(plan: &Plan, run: &Run, urls: &[String]) {
    let shown: Vec<String> = urls.iter().map(|url| connect::redact(url)).collect();
    run.detail(&format!(
        "{} Redis masters of yours (--master): {}\n  the run's keys lockslab:{}:* are removed from them at the end",
        plan.n,
        shown.join(" "),
        run.id
    ));
    for scenario in &plan.skipped {
        run.say(&format!(
            "  skipped: {} needs masters lockslab starts itself (it kills, freezes\n  and restarts them); run it without --master",
            scenario.command_name()
        ));
    }
}

/// The algorithm's arithmetic, with this run's numbers: the quorum, the validity, the drift.
fn say_the_arithmetic(run: &Run, settings: &Settings, n: usize) {
    let q = redlock::quorum(n);
    let drift = redlock::drift(settings.ttl, settings.drift_factor);
    run.say(&format!(
        "Redlock: held when {q} of {n} masters grant SET NX PX {} and validity > 0,\n\
         validity = TTL − elapsed − drift (drift = {} × TTL + 2ms = {}ms);\n\
         each master gets {} to answer. The default drift factor 0.01 and the 2ms\n\
         are the reference implementations' choice, not part of the algorithm.",
        settings.ttl.as_millis(),
        settings.drift_factor,
        drift.as_millis(),
        human(settings.instance_timeout)
    ));
}

/// Each master as the run's first event names it: its port, and its pid and folder when
/// lockslab started it, or its URL (password hidden) when it is the user's.
fn masters_seen(private: &[PrivateServers], urls: &[String], ports: &[String]) -> Vec<MasterSeen> {
    (0..urls.len())
        .map(|i| MasterSeen {
            master: name(i),
            port: ports[i].to_string(),
            pid: private.get(i).and_then(|server| server.pid(Backend::Redis)),
            dir: private
                .get(i)
                .map(|server| server.dir.display().to_string()),
            url: private.get(i).is_none().then(|| connect::redact(&urls[i])),
        })
        .collect()
}
