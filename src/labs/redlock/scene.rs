//! What every scenario of lab 6 plays on: the masters, the clients A and B (played by the
//! lab itself), the faults aimed at the masters (through the nemesis) and the read-backs.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use colored::Colorize;

use super::Plan;
use super::verdict::ClientRound;
use crate::check::Finding;
use crate::check::redlock::{self as check, MasterState, Round};
use crate::connect::{self, Backend};
use crate::events::Event;
use crate::events::What;
use crate::events::facts::Observed;
use crate::events::facts::{self, FaultFacts, HolderNow, MasterSeen, Phase, Released};
use crate::labs::Stage;
use crate::labs::runner::Run;
use crate::labs::stage::History;
use crate::lock::redlock::{self, Attempt, Master, Redlock, Reply, Settings};
use crate::nemesis::victims::Server;
use crate::nemesis::{Nemesis, Note, Record};
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
    /// What the lab has done to each master, so that a read-back does not wait on one it
    /// froze or killed itself.
    condition: Vec<Condition>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Condition {
    Up,
    Down,
    Frozen,
}

/// The history a restart of a master the lab killed earlier writes to. The nemesis records
/// a restart's crash and its return; this master crashed when the lab killed it (that kill
/// is on the timeline already), so only its return is kept.
struct Rejoin<'a>(&'a mut Stage);

impl Record for Rejoin<'_> {
    fn record(&mut self, event: Event) {
        if event.fault().and_then(|f| f.phase) == Some(Phase::End) {
            self.0.record(event);
        }
    }
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
            condition: vec![Condition::Up; n],
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
                "releases on all {} masters ({deleted} still held its value):\n{}",
                answers.len(),
                indent(&lines)
            ),
        ));
    }

    /// Master `i` as the nemesis's victim, with the stage it records to and the nemesis.
    fn aim(&mut self, i: usize) -> Result<(Server<'_>, &mut Stage, &mut Nemesis)> {
        let Scene {
            private,
            stage,
            nemesis,
            ..
        } = self;
        let server = private
            .get_mut(i)
            .context("the lab kills, freezes and restarts only masters it started itself")?;
        Ok((
            Server::new(server, Backend::Redis, &name(i)),
            stage,
            nemesis,
        ))
    }

    fn pid(&mut self, i: usize) -> Result<i32> {
        use crate::nemesis::Victim;
        let (victim, _, _) = self.aim(i)?;
        victim.pid().context("a master has no pid")
    }

    /// SIGKILL to one master: down, its port refuses connections until it is restarted.
    pub(super) fn kill(&mut self, i: usize) -> Result<()> {
        let pid = self.pid(i)?;
        let port = port_of(&self.url(i));
        let (mut victim, stage, nemesis) = self.aim(i)?;
        let note = Note::new(
            format!("SIGKILL {} (pid {pid}, port {port}): down", name(i)),
            FaultFacts {
                master: Some(name(i)),
                ..FaultFacts::default()
            },
        );
        nemesis.kill(stage, &mut victim, note)?;
        self.condition[i] = Condition::Down;
        Ok(())
    }

    /// Starts a master the lab killed again, on the same port. Without persistence it
    /// comes back empty.
    pub(super) fn restart(&mut self, i: usize) -> Result<()> {
        let port = port_of(&self.url(i));
        let (mut victim, stage, nemesis) = self.aim(i)?;
        nemesis.restart(&mut Rejoin(stage), &mut victim, Note::default(), |took| {
            back(i, &port, took)
        })?;
        self.condition[i] = Condition::Up;
        Ok(())
    }

    /// A live master crashes (SIGKILL) and is started again at once, EMPTY.
    pub(super) fn crash(&mut self, i: usize) -> Result<()> {
        let pid = self.pid(i)?;
        let port = port_of(&self.url(i));
        let (mut victim, stage, nemesis) = self.aim(i)?;
        let note = Note::new(
            format!("SIGKILL {} (pid {pid}, port {port}): crashes", name(i)),
            FaultFacts {
                master: Some(name(i)),
                ..FaultFacts::default()
            },
        );
        nemesis.restart(stage, &mut victim, note, |took| back(i, &port, took))?;
        self.condition[i] = Condition::Up;
        Ok(())
    }

    pub(super) fn freeze(&mut self, i: usize) -> Result<()> {
        let pid = self.pid(i)?;
        let (victim, stage, nemesis) = self.aim(i)?;
        let note = Note::new(
            format!(
                "SIGSTOP {} (pid {pid}): accepts connections, answers nothing",
                name(i)
            ),
            FaultFacts {
                master: Some(name(i)),
                ..FaultFacts::default()
            },
        );
        nemesis.pause(stage, &victim, note)?;
        self.condition[i] = Condition::Frozen;
        Ok(())
    }

    pub(super) fn thaw(&mut self, i: usize) -> Result<()> {
        let (victim, stage, nemesis) = self.aim(i)?;
        let note = Note::new(
            format!("SIGCONT {}: it serves what queued up meanwhile", name(i)),
            FaultFacts {
                master: Some(name(i)),
                ..FaultFacts::default()
            },
        );
        nemesis.resume(stage, &victim, note)?;
        self.condition[i] = Condition::Up;
        Ok(())
    }

    /// GET and PTTL of `key` on every master: who holds it where, by the masters' answers.
    pub(super) fn read_back(&mut self, key: &str, heading: &str) -> Vec<MasterState> {
        let mut states = Vec::new();
        for i in 0..self.n() {
            let mut master = Master::new(&name(i), &self.url(i));
            let asked = match self.condition[i] {
                Condition::Up => master.read(key, READ_TIMEOUT),
                Condition::Down => Err("down (killed by the lab)".to_string()),
                Condition::Frozen => Err("frozen by the lab: not asked".to_string()),
            };
            let (holder, pttl_ms, why) = match asked {
                Ok((value, pttl)) => (value.map(|v| self.client_of(&v)), Some(pttl), None),
                Err(why) => (None, None, Some(why)),
            };
            states.push(MasterState {
                master: master.name.clone(),
                port: master.port().to_string(),
                holder,
                pttl_ms,
                answered: why.is_none(),
                why,
            });
        }
        let lines: Vec<String> = states.iter().map(super::verdict::state_line).collect();
        self.stage.record(Event::new(
            "masters",
            HolderNow {
                key: Some(key.into()),
                masters: Some(states.clone()),
                ..HolderNow::default()
            },
            format!("{heading}:\n{}", indent(&lines)),
        ));
        states
    }

    fn client_of(&self, value: &str) -> String {
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
            self.stage.record(Event::new(
                "masters",
                What::TwoHolders(Observed {
                    a_validity_left_ms: Some(left),
                    ..Observed::default()
                }),
                format!("TWO HOLDERS: B holds a majority, A's validity has {left}ms to run"),
            ));
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

/// The line for a master that is back after a restart.
fn back(i: usize, port: &str, took: Duration) -> Note {
    Note::new(
        format!(
            "{} back on :{port} in {}, EMPTY (no persistence)",
            name(i),
            human(took)
        ),
        FaultFacts {
            master: Some(name(i)),
            ..FaultFacts::default()
        },
    )
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
