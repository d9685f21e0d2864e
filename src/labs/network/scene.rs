//! What both stories of lab 8 share: the stage on one path of A's through a proxy (the
//! story starts the proxy), the two holders' scripts, the story's schedule played by the
//! nemesis's one player while the lab watches A's process, and the ending — the workers
//! let go, the store read back.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use anyhow::Result;
use colored::Colorize;

use super::Plan;
use super::verdict::{RunVerdict, store_line};
use crate::connect::Backend;
use crate::events::facts::{self, FaultFacts};
use crate::events::{Event, Kind};
use crate::labs::faults::{Cue, Faults, Until};
use crate::labs::runner::Run;
use crate::labs::{Stage, WorkerHandle, step};
use crate::nemesis::schedule::{Anchor, How, Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note};
use crate::procs;
use crate::proxy::{self, NetFault, Proxy};
use crate::store::{FenceRule, Store};
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec};

/// One run of a story: its stage, the proxy on A's path, and the names of its lock and
/// resource.
pub(super) struct Scene<'a> {
    pub(super) plan: &'a Plan,
    pub(super) run: &'a Run,
    pub(super) scenario: &'static str,
    pub(super) fenced: bool,
    pub(super) stage: Stage,
    /// Plays the story's faults, from its schedule, through the one player.
    nemesis: Nemesis,
    /// A's URL for the server its proxy stands before (`A→store`, `A→redis`).
    pub(super) url_through: String,
    /// What the lab has seen of A's process so far while the faults play: shared with the
    /// words of the heal, which say it.
    looks: Rc<Cell<Looks>>,
    /// The lock is etcd's (each holder's own lease kept alive by a keepalive, and etcd's
    /// lock called with it), not Redis's: the scenes whose proxy is on A's path to etcd.
    pub(super) on_etcd: bool,
    lock_key: String,
    resource: String,
}

impl<'a> Scene<'a> {
    /// Sets the stage (heading, tags, `--step` stop) for A's path through `proxy` to the
    /// server at `server_url`; `also` are the story's other proxies on A's paths. The
    /// first line names every proxy's address, so that each of A's connections can be told
    /// apart (`ss -tn`, a packet capture) while the story plays and the walkthrough's
    /// "a second proxy" has a port to point at.
    pub(super) fn open(
        plan: &'a Plan,
        run: &'a Run,
        (scenario, heading): (&'static str, &str),
        fenced: bool,
        at: &step::Checkpoint,
        (proxy, server_url, also): (&Proxy, &str, &[&Proxy]),
    ) -> Result<Scene<'a>> {
        let label = if fenced { "fenced" } else { "unfenced" };
        let mut stage = run.stage();
        stage.timeline.say("");
        let heading = if fenced {
            format!("── {heading}, with fencing tokens ──")
                .green()
                .bold()
        } else {
            format!("── {heading}, without fencing ──").red().bold()
        };
        stage.timeline.say(&heading.to_string());
        stage.tags().scenario = Some(scenario.into());
        stage.tags().fencing = Some(fenced);
        stage.checkpoint(at);
        let run_id = run.id.as_str();
        let lock_key = format!("lockslab:{run_id}:network:{scenario}:{label}:lock");
        let path = proxy.path();
        let on_etcd = path.ends_with("etcd");
        let lock_is = if on_etcd {
            "etcd's lock named"
        } else {
            "the Redis key"
        };
        let url_through = proxy::through(server_url, proxy.addr())?;
        let mut paths = format!(
            "the path {path} goes through the fault proxy on {}",
            proxy.addr()
        );
        for other in also {
            paths += &format!(", and {} through another on {}", other.path(), other.addr());
        }
        stage.record(Event::new(
            "lab",
            facts::RunFacts {
                run_id: Some(run_id.into()),
                lock_key: Some(lock_key.clone()),
                ..facts::RunFacts::default()
            },
            format!("run {run_id}: the lock is {lock_is} {lock_key}; {paths}"),
        ));
        Ok(Scene {
            plan,
            run,
            scenario,
            fenced,
            stage,
            nemesis: Nemesis::new(),
            url_through,
            looks: Rc::default(),
            on_etcd,
            lock_key,
            resource: format!("network-{scenario}-{label}"),
        })
    }

    /// The lock's server: Redis, or etcd.
    pub(super) fn lock_server(&self) -> &'a str {
        if self.on_etcd {
            self.run.url(Backend::Etcd)
        } else {
            self.run.url(Backend::Redis)
        }
    }

    /// The Redis key of the run's lock (etcd: the lock's name).
    pub(super) fn lock_key(&self) -> &str {
        &self.lock_key
    }

    /// A holder's script on the scene's lock and resource, with its own URLs (the first is
    /// the lock's server: Redis, or etcd).
    pub(super) fn holder(
        &self,
        name: &str,
        (redis_url, store_url): (&str, &str),
        renew: bool,
        (before_write, after_write): (BeforeWrite, AfterWrite),
    ) -> HolderScript {
        let run_id = self.run.id.as_str();
        let lock = if self.on_etcd {
            LockSpec::Etcd {
                url: redis_url.into(),
                name: self.lock_key.clone(),
                lease_ttl_ms: self.plan.ttl.as_millis() as u64,
                token: self.fenced,
            }
        } else {
            LockSpec::Redis {
                url: redis_url.into(),
                key: self.lock_key.clone(),
                ttl_ms: self.plan.ttl.as_millis() as u64,
                fence_counter: self
                    .fenced
                    .then(|| format!("lockslab:{run_id}:network:fence")),
                renew,
            }
        };
        HolderScript {
            name: name.into(),
            lock,
            store_url: store_url.into(),
            run_id: run_id.into(),
            resource: self.resource.clone(),
            wait_ms: (self.plan.ttl * 3 + Duration::from_secs(10)).as_millis() as u64,
            before_write,
            after_write,
            fence_rule: FenceRule::NotLower,
            token_sequence: None,
        }
    }

    /// Starts A with `script` and waits until it holds the lock and works; returns A and
    /// the owner value (etcd: the key) it was granted.
    pub(super) fn start_a(
        &mut self,
        script: HolderScript,
    ) -> Result<(WorkerHandle, Option<String>)> {
        let a = self.stage.spawn("A", &WorkerSpec::Holder(script))?;
        let start = Duration::from_secs(10);
        let owner = self
            .stage
            .wait_for(start, "A to take the lock", |e| e.is("A", Kind::Acquired))?
            .owner()
            .map(String::from);
        self.stage
            .wait_for(start, "A to start working", |e| e.is("A", Kind::Working))?;
        Ok((a, owner))
    }

    /// The story's faults: `schedule`, its clock starting now, played on `paths` with the
    /// lab's `words` for each fault (given what the lab has seen of A's process so far).
    pub(super) fn faults<'p>(
        &self,
        schedule: &Schedule,
        paths: &[&'p Proxy],
        words: impl Fn(&Cue, Looks) -> Note + 'p,
    ) -> Faults<'p> {
        let looks = Rc::clone(&self.looks);
        let faults = Faults::new(schedule, &self.stage).saying(move |cue| words(cue, looks.get()));
        (paths.iter()).fold(faults, |faults, path| faults.on_path(path))
    }

    /// Plays the story's faults until the hold on `A→store` is on, tells A to finish its
    /// work, and waits for A's `checked` (A's question before it sends its write into the
    /// hold).
    pub(super) fn hold_a_write(
        &mut self,
        faults: &mut Faults,
        a: &mut WorkerHandle,
    ) -> Result<Event> {
        self.play(
            faults,
            Until::acted(Fault::Hold, "A→store", Duration::from_secs(5)),
        )?;
        a.tell("finish")?;
        self.stage
            .wait_for(Duration::from_secs(10), "A's check before its write", |e| {
                e.is("A", Kind::Checked)
            })
    }

    /// Plays the story's faults until `until` holds.
    pub(super) fn play(&mut self, faults: &mut Faults, until: Until) -> Result<()> {
        self.stage.play(faults, &mut self.nemesis, &mut [], until)
    }

    /// Plays the rest of the story's faults (its heals come once B has written), calling
    /// `tick` (before each event is shown) and looking at A's process each time: it must be
    /// running, or asleep in a read, never stopped.
    pub(super) fn play_out(
        &mut self,
        faults: &mut Faults,
        a: &WorkerHandle,
        mut tick: impl FnMut(&mut Stage) -> Result<()>,
    ) -> Result<()> {
        let within = self.plan.ttl * 4 + Duration::from_secs(25);
        let looks = Rc::clone(&self.looks);
        let done = Until::done(within);
        (self.stage).play_ticking(faults, &mut self.nemesis, &mut [], done, |stage| {
            looks.set(looks.get().took(procs::process_state(a.pid) == Some('T')));
            tick(stage)
        })
    }

    /// Starts B, on direct paths to the lock's server and the store: it waits for the
    /// lock, writes at once, and keeps the lock until told.
    pub(super) fn spawn_b(&mut self) -> Result<WorkerHandle> {
        let urls = (self.lock_server(), self.run.url(Backend::Postgres));
        let script = self.holder(
            "B",
            urls,
            false,
            (BeforeWrite::Nothing, AfterWrite::HoldUntilTold),
        );
        self.stage.spawn("B", &WorkerSpec::Holder(script))
    }

    /// Lets A write and both let go, then reads the store back into the run's verdict.
    pub(super) fn end(
        mut self,
        (mut a, mut b): (WorkerHandle, WorkerHandle),
        store: &mut Store,
        a_told: bool,
    ) -> Result<RunVerdict> {
        if a_told {
            a.tell("finish")?;
        }
        let stage = &mut self.stage;
        let long = self.plan.ttl + Duration::from_secs(15);
        stage.wait_for(long, "A's write to be answered", |e| e.is("A", Kind::Wrote))?;
        stage.wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
        b.tell("finish")?;
        stage.wait_for(long, "B to release", |e| e.is("B", Kind::Released))?;
        a.finish(Duration::from_secs(5));
        b.finish(Duration::from_secs(5));
        stage.drain();
        let read = store.read_back(&self.run.id, &self.resource)?;
        stage.record_read_back(&self.resource, &read);
        let verdict = RunVerdict::from_history(self.scenario, self.fenced, &stage.log)?;
        if let Some(line) = store_line(&verdict) {
            stage.conclude(line);
        }
        Ok(verdict)
    }
}

/// What the lab saw of A's process while the faults played: how many times it looked
/// (in `/proc`), and how many of those found A stopped (state T).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Looks {
    looks: u64,
    stopped: u64,
}

impl Looks {
    fn took(self, stopped: bool) -> Looks {
        Looks {
            looks: self.looks + 1,
            stopped: self.stopped + u64::from(stopped),
        }
    }

    /// The words of a heal that comes after B wrote, with what the lab saw of A's process
    /// while the fault lasted.
    pub(super) fn healed(self, what: &str) -> Note {
        let ran = self.looks > 0 && self.stopped == 0;
        let words = if ran {
            format!(
                "{what}, after B wrote; A's process was never stopped in the {} looks the lab took at it",
                self.looks
            )
        } else {
            format!("{what}, after B wrote; A's process was seen stopped (state T)")
        };
        let facts = FaultFacts {
            process_ran: Some(ran),
            ..FaultFacts::default()
        };
        Note::new(words, facts)
    }
}

/// The hold on A's path to the store, in the timeline's words.
pub(super) const HOLD_WORDS: &str =
    "the proxy on A→store holds what A sends next: A's write will leave A and wait in flight";

/// A step of a story's schedule: `fault` on `path`, done as `how` says, as soon as
/// `after` (an event of the run) comes, or at once.
pub(super) fn net_step(fault: Fault, path: &str, after: Option<Anchor>, how: How) -> (Step, How) {
    let step = Step {
        at_ms: 0,
        after,
        fault,
        target: path.into(),
        duration_ms: None,
    };
    (step, how)
}

/// A cut that resets A's connections on a path and refuses new ones.
pub(super) fn resets() -> How {
    How {
        proxy: Some(NetFault::Reset),
        ..How::default()
    }
}
