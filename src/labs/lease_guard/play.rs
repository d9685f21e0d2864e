//! One cell of lab 9: a guard against a fault. A takes the lock; the fault strikes (the
//! cell's [`schedule`], played by the nemesis's one player); B takes the lock once Redis
//! lets it go and writes; then A's guard decides, and the store is read back.

use std::time::Duration;

use anyhow::Result;
use colored::Colorize;

use super::verdict::{CellVerdict, store_line};
use super::{LeaseFault, Plan, schedule};
use crate::connect::Backend;
use crate::events::facts::GuardDecided;
use crate::events::{Event, Kind, What};
use crate::labs::faults::{Faults, Until};
use crate::labs::runner::Run;
use crate::labs::stage::History;
use crate::labs::{Stage, WorkerHandle};
use crate::lock::lease_guard::Guard;
use crate::nemesis::clock::WorkerClock;
use crate::nemesis::{Fault, Nemesis};
use crate::proxy::{self, Proxy};
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::guarded::{GuardedScript, StopAt};
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec};

pub(super) struct Cell<'a> {
    pub(super) plan: &'a Plan,
    pub(super) run: &'a Run,
    /// Where the cell's events are kept: the run's, or the cell's own while cells play
    /// side by side.
    pub(super) history: History,
    pub(super) fault: LeaseFault,
    pub(super) guard: Guard,
}

/// B has written, or given up.
fn b_done(e: &Event) -> bool {
    e.is("B", Kind::Wrote) || e.is("B", Kind::GaveUp)
}

impl Cell<'_> {
    pub(super) fn play(&self, store: &mut Store) -> Result<CellVerdict> {
        let (plan, fault) = (self.plan, self.fault);
        let names = self.names();
        let long = plan.ttl + Duration::from_secs(15);
        let mut stage = self.stage();
        let clock = match fault.moves_the_clock() {
            true => Some(WorkerClock::new()?),
            false => None,
        };
        // The delayed write: A's path to the store goes through the fault proxy.
        let postgres_url = self.run.url(Backend::Postgres);
        let store_path = match fault {
            LeaseFault::DelayedWrite => Some(Proxy::start(
                schedule::STORE_PATH,
                proxy::upstream_of(postgres_url)?,
            )?),
            _ => None,
        };
        // The cell's fault, its clock starting before A does: it is timed from A's work.
        let schedule = schedule::of(plan, fault);
        let mut faults =
            Faults::new(&schedule, &stage).saying(schedule::words(plan, fault, schedule.clone()));
        if matches!(
            fault,
            LeaseFault::PauseBeforeCheck | LeaseFault::PauseAfterCheck
        ) {
            faults = faults.self_pausing("A");
        }
        // The stall's next stop waits for A to say it ran again, which A says only of a
        // stop it could notice: a stop sent late (the lab's loop on a busy machine) must
        // not be cut short by as much, or A says nothing and the stall ends after it. Nor
        // may a stop that fell due while A was still stopped (A's sampler saw a gap of the
        // scheduler's, and said so) end the stop that is on.
        if fault == LeaseFault::Stall && schedule::runs_again_after(plan).is_some() {
            faults = faults.pauses_lasting_from_sigstop("A");
        }
        if let Some(clock) = &clock {
            faults = faults.on_clock("A", clock);
        }
        if let Some(path) = &store_path {
            faults = faults.on_path(path);
        }
        let env = clock.as_ref().map(WorkerClock::env).unwrap_or_default();
        let a_script = self.a_script(&names, store_path.as_ref())?;
        let mut a = stage.spawn_with_env("A", &WorkerSpec::Guarded(a_script), &env)?;
        // Declared after A: dropped first, so that a cell that fails resumes A before A's
        // handle kills it.
        let mut nemesis = Nemesis::new();
        let working = stage.wait_for(Duration::from_secs(10), "A to take the lock", |e| {
            e.is("A", Kind::Working)
        })?;
        let told = self.strike(&mut stage, &mut faults, &mut nemesis, &mut a, &working)?;
        let mut b = stage.spawn("B", &WorkerSpec::Holder(self.b_script(&names, long)))?;
        // The fault lasts until B has written, or until `overrun` past A's lease at most;
        // the pause after the check, until B has written however long that takes.
        let fault_ends = match fault {
            LeaseFault::PauseAfterCheck => Duration::MAX,
            _ => Duration::from_millis(working.t_ms) + plan.ttl + plan.overrun,
        };
        let healed = |faults: &Faults| {
            store_path.is_none() || faults.acted(Fault::Heal, schedule::STORE_PATH)
        };
        let over = Until::holds(
            "B to write",
            long * 2 + plan.pause.unwrap_or_default(),
            |stage, faults| {
                let b_wrote = stage.log.iter().any(b_done);
                (b_wrote || stage.elapsed() >= fault_ends) && !faults.holding() && healed(faults)
            },
        );
        stage.play(&mut faults, &mut nemesis, &mut [&mut a], over)?;
        if !told {
            a.tell("finish")?;
        }
        stage.wait_for(long, "A to let go", |e| e.is("A", Kind::Released))?;
        stage.wait_for(long, "B to write", b_done)?;
        b.tell("finish")?;
        stage.wait_for(long, "B to let go", |e| {
            e.is("B", Kind::Released) || e.is("B", Kind::GaveUp)
        })?;
        a.finish(Duration::from_secs(5));
        b.finish(Duration::from_secs(5));
        stage.drain();
        self.judge(&mut stage, store, &names)
    }

    /// The cell's key, fencing counter and resource, by its fault and guard.
    fn names(&self) -> Names {
        let run_id = self.run.id.as_str();
        let (fault, guard) = (self.fault.as_str(), self.guard.as_str());
        Names {
            key: format!("lockslab:{run_id}:lease-guard:{fault}:{guard}:lock"),
            fence_counter: (self.guard == Guard::Fencing)
                .then(|| format!("lockslab:{run_id}:lease-guard:fence")),
            resource: format!("lease-guard-{fault}-{guard}"),
        }
    }

    /// The cell's stage, under its heading (and its `--step` stop, before a fault's first
    /// guard).
    fn stage(&self) -> Stage {
        let (fault, guard) = (self.fault, self.guard);
        let mut stage =
            Stage::on_clock(self.run.style, self.run.started).recorded_in(&self.history);
        stage.timeline.say("");
        stage.timeline.say(
            &format!("── guard {} × fault {} ──", guard.as_str(), fault.as_str())
                .bold()
                .to_string(),
        );
        if self.plan.guards.first() == Some(&guard) {
            stage.checkpoint(crate::labs::step::lease_guard::before(fault.as_str()));
        }
        stage.tags().scenario = Some(fault.as_str().into());
        stage.tags().variant = Some(guard.as_str().into());
        stage
    }

    /// A, the guarded client: it stops itself where a pause fault says, and writes to the
    /// store through the fault proxy when the write is to be held.
    fn a_script(&self, names: &Names, store_path: Option<&Proxy>) -> Result<GuardedScript> {
        let (plan, run) = (self.plan, self.run);
        let postgres_url = run.url(Backend::Postgres);
        let store_url = match store_path {
            Some(path) => proxy::through(postgres_url, path.addr())?,
            None => postgres_url.to_string(),
        };
        Ok(GuardedScript {
            name: "A".into(),
            redis_url: run.url(Backend::Redis).into(),
            key: names.key.clone(),
            ttl_ms: plan.ttl.as_millis() as u64,
            margin_ms: plan.margin.as_millis() as u64,
            guard: self.guard,
            fence_counter: names.fence_counter.clone(),
            store_url,
            run_id: run.id.clone(),
            resource: names.resource.clone(),
            stop_at: match self.fault {
                LeaseFault::PauseBeforeCheck => StopAt::BeforeCheck,
                LeaseFault::PauseAfterCheck => StopAt::AfterCheck,
                _ => StopAt::Nowhere,
            },
            lock_delay_ms: plan.lock_delay.as_millis() as u64,
            say_runs_again_after_ms: (self.fault == LeaseFault::Stall)
                .then(|| schedule::runs_again_after(plan))
                .flatten()
                .map(|gap| gap.as_millis() as u64),
        })
    }

    /// B, the next holder: it waits for the lock, writes, and holds on until told.
    fn b_script(&self, names: &Names, long: Duration) -> HolderScript {
        let run = self.run;
        HolderScript {
            name: "B".into(),
            lock: LockSpec::Redis {
                url: run.url(Backend::Redis).into(),
                key: names.key.clone(),
                ttl_ms: self.plan.ttl.as_millis() as u64,
                fence_counter: names.fence_counter.clone(),
                renew: false,
            },
            store_url: run.url(Backend::Postgres).into(),
            run_id: run.id.clone(),
            resource: names.resource.clone(),
            wait_ms: long.as_millis() as u64,
            before_write: BeforeWrite::Nothing,
            after_write: AfterWrite::HoldUntilTold,
            fence_rule: Default::default(),
            token_sequence: None,
        }
    }

    /// The fault's start, before B is started: the clock moved, A stopped where it stops
    /// itself, the write's path held — each by the schedule's player. Says whether A was
    /// told to finish its work already.
    fn strike(
        &self,
        stage: &mut Stage,
        faults: &mut Faults,
        nemesis: &mut Nemesis,
        a: &mut WorkerHandle,
        working: &Event,
    ) -> Result<bool> {
        let within = Duration::from_secs(10);
        let played = |fault: Fault, target: &str| Until::acted(fault, target, within);
        match self.fault {
            LeaseFault::ClockSlow => {
                stage.play(faults, nemesis, &mut [a], played(Fault::ClockRate, "A"))?;
            }
            LeaseFault::ClockFast => {
                stage.play(faults, nemesis, &mut [a], played(Fault::ClockRate, "A"))?;
                // A looks halfway through its lease: its fast clock says it is over.
                let halfway = Duration::from_millis(working.t_ms) + self.plan.ttl / 2;
                while let Some(left) = halfway.checked_sub(stage.elapsed()) {
                    stage.next(left.min(Duration::from_millis(20)));
                }
                a.tell("finish")?;
                return Ok(true);
            }
            LeaseFault::ClockBack => {
                stage.play(faults, nemesis, &mut [a], played(Fault::ClockStep, "A"))?;
            }
            LeaseFault::PauseBeforeCheck | LeaseFault::PauseAfterCheck => {
                a.tell("finish")?;
                let seen = stage.wait_for(within, "A to stop itself", |e| {
                    e.is("A", Kind::Freezing) || e.is("A", Kind::Released)
                })?;
                if seen.kind() == Kind::Freezing {
                    stage.play(faults, nemesis, &mut [a], played(Fault::Pause, "A"))?;
                }
                return Ok(true);
            }
            LeaseFault::DelayedWrite => {
                let held = played(Fault::Hold, schedule::STORE_PATH);
                stage.play(faults, nemesis, &mut [a], held)?;
                a.tell("finish")?;
                return Ok(true);
            }
            LeaseFault::LongWork | LeaseFault::Stall => {}
        }
        Ok(false)
    }

    /// The store read back and A's decision, checked (a clock fault must have moved A's
    /// wall clock), then the cell's verdict from the history.
    fn judge(&self, stage: &mut Stage, store: &mut Store, names: &Names) -> Result<CellVerdict> {
        let (plan, fault, guard) = (self.plan, self.fault, self.guard);
        let (run_id, resource) = (self.run.id.as_str(), &names.resource);
        let ttl_ms = plan.ttl.as_millis() as u64;
        let read = store.read_back(run_id, resource)?;
        let saw = |worker: &str, kind: Kind| stage.log.iter().find(|e| e.is(worker, kind));
        let decided = saw("A", Kind::GuardDecided);
        let decision: GuardDecided = match decided.map(|e| &e.what) {
            Some(What::GuardDecided(decided)) => decided.clone(),
            _ => anyhow::bail!("A never reported its guard's decision"),
        };
        if fault.moves_the_clock() {
            // A measured its own skew: its wall clock against its monotonic clock since
            // the grant. A step lands whole; a rate moves the clock by its share of A's age,
            // which is at least 50ms either way by the time A decides.
            let step_ms = plan.clock_step.as_millis() as i64;
            let skew = decision.wall_skew_ms;
            let (landed, expected) = match fault {
                LeaseFault::ClockSlow => (skew.is_some_and(|m| m <= -50), "behind"),
                LeaseFault::ClockFast => (skew.is_some_and(|m| m >= 50), "ahead"),
                _ => (
                    skew.is_some_and(|m| (m + step_ms).abs() <= (step_ms / 10).max(5)),
                    "stepped back",
                ),
            };
            if !landed {
                anyhow::bail!(
                    "A's wall clock did not move: at its decision it had moved {} against \
                     its monotonic clock since the grant, not {expected}; libfaketime did \
                     not take effect in A, so this cell would be a guess",
                    skew.map_or("nothing".to_string(), |m| format!("{m}ms"))
                );
            }
        }
        stage.record_read_back(resource, &read);
        let cell = CellVerdict::from_history(fault, guard, ttl_ms, &stage.log)?;
        if let Some(line) = store_line(&cell) {
            stage.conclude(line);
        }
        Ok(cell)
    }
}

/// What a cell's lock, counter and resource are called.
struct Names {
    key: String,
    fence_counter: Option<String>,
    resource: String,
}
