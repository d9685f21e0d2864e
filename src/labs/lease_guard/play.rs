//! One cell of lab 9: a guard against a fault. A takes the lock; the fault strikes; B
//! takes the lock once Redis lets it go and writes; then A's guard decides, and the store
//! is read back.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use colored::Colorize;

use super::verdict::{CellVerdict, store_line};
use super::{LeaseFault, Plan};
use crate::connect::Backend;
use crate::events::facts::GuardDecided;
use crate::events::{Event, Kind, What};
use crate::labs::Stage;
use crate::labs::runner::Run;
use crate::lock::lease_guard::Guard;
use crate::nemesis::Nemesis;
use crate::nemesis::clock::WorkerClock;
use crate::output::human;
use crate::proxy::{self, Direction, NetFault, Proxy};
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::guarded::{GuardedScript, StopAt};
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec};

/// Shows incoming events for `span`, or until one of them is `until`.
fn run_for(stage: &mut Stage, span: Duration, until: impl Fn(&Event) -> bool) {
    let end = stage.elapsed() + span;
    while let Some(left) = end.checked_sub(stage.elapsed()) {
        if stage.next(left).is_some_and(|e| until(&e)) {
            return;
        }
    }
}

pub(super) struct Cell<'a> {
    pub(super) plan: &'a Plan,
    pub(super) run: &'a Run,
    pub(super) fault: LeaseFault,
    pub(super) guard: Guard,
}

impl Cell<'_> {
    pub(super) fn play(&self, store: &mut Store) -> Result<CellVerdict> {
        let (plan, fault, guard) = (self.plan, self.fault, self.guard);
        let run_id = self.run.id.as_str();
        let redis_url = self.run.url(Backend::Redis);
        let postgres_url = self.run.url(Backend::Postgres);
        let name = format!("{}:{}", fault.as_str(), guard.as_str());
        let key = format!("lockslab:{run_id}:lease-guard:{name}:lock");
        let fence_counter =
            (guard == Guard::Fencing).then(|| format!("lockslab:{run_id}:lease-guard:fence"));
        let resource = format!("lease-guard-{}-{}", fault.as_str(), guard.as_str());
        let ttl_ms = plan.ttl.as_millis() as u64;
        let long = plan.ttl + Duration::from_secs(15);

        let mut stage = self.run.stage();
        stage.timeline.say("");
        stage.timeline.say(
            &format!("── guard {} × fault {} ──", guard.as_str(), fault.as_str())
                .bold()
                .to_string(),
        );
        if plan.guards.first() == Some(&guard) {
            stage.checkpoint(crate::labs::step::lease_guard::before(fault.as_str()));
        }
        stage.tags().scenario = Some(fault.as_str().into());
        stage.tags().variant = Some(guard.as_str().into());

        let clock = match fault.moves_the_clock() {
            true => Some(WorkerClock::new()?),
            false => None,
        };
        let stop_at = match fault {
            LeaseFault::PauseBeforeCheck => StopAt::BeforeCheck,
            LeaseFault::PauseAfterCheck => StopAt::AfterCheck,
            _ => StopAt::Nowhere,
        };
        // The delayed write: A's path to the store goes through the fault proxy.
        let store_path = match fault {
            LeaseFault::DelayedWrite => {
                Some(Proxy::start("A→store", proxy::upstream_of(postgres_url)?)?)
            }
            _ => None,
        };
        let a_store_url = match &store_path {
            Some(path) => proxy::through(postgres_url, path.addr())?,
            None => postgres_url.to_string(),
        };
        let a_script = GuardedScript {
            name: "A".into(),
            redis_url: redis_url.into(),
            key: key.clone(),
            ttl_ms,
            margin_ms: plan.margin.as_millis() as u64,
            guard,
            fence_counter: fence_counter.clone(),
            store_url: a_store_url,
            run_id: run_id.into(),
            resource: resource.clone(),
            stop_at,
            lock_delay_ms: plan.lock_delay.as_millis() as u64,
        };
        let env = clock.as_ref().map(WorkerClock::env).unwrap_or_default();
        let mut a = stage.spawn_with_env("A", &WorkerSpec::Guarded(a_script), &env)?;
        // Declared after A: dropped first, so that a cell that fails resumes A before A's
        // handle kills it.
        let mut nemesis = Nemesis::new();
        let working = stage.wait_for(Duration::from_secs(10), "A to take the lock", |e| {
            e.is("A", Kind::Working)
        })?;
        // The fault lasts until B has written, or until `overrun` past A's lease at most;
        // the pause after the check, until B has written however long that takes.
        let mut fault_ends = match fault {
            LeaseFault::PauseAfterCheck => Duration::MAX,
            _ => Duration::from_millis(working.t_ms) + plan.ttl + plan.overrun,
        };

        let mut paused = false;
        let mut told = false;
        match fault {
            LeaseFault::ClockSlow | LeaseFault::ClockFast => {
                let percent = fault.clock_rate_percent().unwrap_or(100);
                let words = format!(
                    "runs A's wall clock at {percent}% of true time (libfaketime in A only; its monotonic clock and Redis's clock stay true)"
                );
                let clock = clock.as_ref().context("the clock fault has its clock")?;
                nemesis.set_clock_rate(&mut stage, &a, clock, percent, words)?;
                if fault == LeaseFault::ClockFast {
                    // A looks halfway through its lease: its fast clock says it is over.
                    let halfway = Duration::from_millis(working.t_ms) + plan.ttl / 2;
                    while let Some(left) = halfway.checked_sub(stage.elapsed()) {
                        stage.next(left.min(Duration::from_millis(20)));
                    }
                    a.tell("finish")?;
                    told = true;
                }
            }
            LeaseFault::ClockBack => {
                let step_ms = plan.clock_step.as_millis() as i64;
                let words = format!(
                    "steps A's wall clock back {} (libfaketime in A only; its monotonic clock and Redis's clock stay true)",
                    human(plan.clock_step)
                );
                let clock = clock.as_ref().context("the clock fault has its clock")?;
                nemesis.step_clock(&mut stage, &a, clock, -step_ms, words)?;
            }
            LeaseFault::PauseBeforeCheck | LeaseFault::PauseAfterCheck => {
                a.tell("finish")?;
                let seen = stage.wait_for(Duration::from_secs(10), "A to stop itself", |e| {
                    e.is("A", Kind::Freezing) || e.is("A", Kind::Released)
                })?;
                if seen.kind() == Kind::Freezing {
                    let words = match (plan.pause, fault) {
                        (Some(pause), _) => format!(
                            "sees A (pid {}) stopped; resumes it after {} (--pause), or once B has written",
                            a.pid,
                            human(pause)
                        ),
                        (None, LeaseFault::PauseBeforeCheck) => format!(
                            "sees A (pid {}) stopped; resumes it once B has written, or {} past its lease",
                            a.pid,
                            human(plan.overrun)
                        ),
                        _ => format!(
                            "sees A (pid {}) stopped; resumes it once B has written",
                            a.pid
                        ),
                    };
                    nemesis.adopt_pause(&mut stage, &a, words)?;
                    paused = true;
                    if let Some(pause) = plan.pause {
                        fault_ends = stage.elapsed() + pause;
                    }
                }
            }
            LeaseFault::DelayedWrite => {
                let path = store_path
                    .as_ref()
                    .context("the delayed write has its proxy")?;
                nemesis.net(
                    &mut stage,
                    path,
                    Direction::Up,
                    NetFault::Hold,
                    "the proxy on A→store holds what A sends next: once A's guard says yes, A's write leaves A and waits in flight",
                );
                a.tell("finish")?;
                told = true;
            }
            LeaseFault::LongWork | LeaseFault::Stall => {}
        }

        let b_script = HolderScript {
            name: "B".into(),
            lock: LockSpec::Redis {
                url: redis_url.into(),
                key: key.clone(),
                ttl_ms,
                fence_counter,
                renew: false,
            },
            store_url: postgres_url.into(),
            run_id: run_id.into(),
            resource: resource.clone(),
            wait_ms: long.as_millis() as u64,
            before_write: BeforeWrite::Nothing,
            after_write: AfterWrite::HoldUntilTold,
            fence_rule: Default::default(),
            token_sequence: None,
        };
        let mut b = stage.spawn("B", &WorkerSpec::Holder(b_script))?;
        let b_done = |e: &Event| e.is("B", Kind::Wrote) || e.is("B", Kind::GaveUp);
        let mut stops = 0;
        while let Some(left) = fault_ends.checked_sub(stage.elapsed())
            && !stage.log.iter().any(b_done)
        {
            if fault == LeaseFault::Stall {
                stops += 1;
                let stop = plan.stall_stop.min(left);
                // Counted as the nemesis counts the stop it records, from just before it.
                let stopped = Instant::now();
                nemesis.pause(
                    &mut stage,
                    &a,
                    format!(
                        "stalls A (pid {}): SIGSTOP, up to {} (stop {stops})",
                        a.pid,
                        human(stop)
                    ),
                )?;
                run_for(&mut stage, stop, b_done);
                let lasted = human(stopped.elapsed());
                let note = if stage.log.iter().any(b_done) {
                    format!("SIGCONT after {lasted} (B had written)")
                } else {
                    format!(
                        "SIGCONT after {lasted}: A runs for {}",
                        human(super::STALL_RUN)
                    )
                };
                nemesis.resume(&mut stage, &a, note)?;
                run_for(&mut stage, super::STALL_RUN, |_| false);
            } else if left > long {
                stage.wait_for(long, "B to write", b_done)?;
            } else {
                stage.next(left.min(Duration::from_millis(50)));
            }
        }
        let b_first = stage.log.iter().any(b_done);
        let how = if b_first {
            "once B has written"
        } else {
            "B has not written yet"
        };
        if let Some(path) = &store_path {
            nemesis.heal_net(
                &mut stage,
                path,
                Direction::Up,
                format!("the proxy lets A's write go, if A sent one ({how})"),
            );
        }
        if paused {
            nemesis.resume(&mut stage, &a, format!("sends SIGCONT to A ({how})"))?;
        } else if !told
            && fault != LeaseFault::PauseAfterCheck
            && fault != LeaseFault::PauseBeforeCheck
        {
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

        let read = store.read_back(run_id, &resource)?;
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
        stage.record_read_back(&resource, &read);
        let cell = CellVerdict::from_history(fault, guard, ttl_ms, &stage.log)?;
        if let Some(line) = store_line(&cell) {
            stage.record(line);
        }
        Ok(cell)
    }
}
