//! One lane of lab 4: a holder and a waiter on one lock, and what the lab does to them as
//! the holder's work goes on.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::observer::{Observer, catch_up};
use super::verdict::{Cell, judge_cell};
use super::{Job, Plan, Scenario, Service};
use crate::connect;
use crate::events::facts::{FaultFacts, HolderNow};
use crate::events::{Event, Kind, What};
use crate::labs::faults::Hand;
use crate::labs::{Stage, WorkerHandle};
use crate::nemesis::{Fault, Note};
use crate::output::human;
use crate::worker::WorkerSpec;
use crate::worker::holder::HolderScript;

/// One backend's holder and waiter within a scenario.
pub(super) struct Lane {
    pub(super) kind: Service,
    pub(super) holder_name: String,
    pub(super) waiter_name: String,
    pub(super) lock_name: String,
    pub(super) resource: String,
    pub(super) holder: WorkerHandle,
    pub(super) waiter: Option<WorkerHandle>,
    pub(super) acquired_at: Option<Instant>,
    pub(super) struck: Option<(Instant, u64)>,
    pub(super) resumed_t: Option<u64>,
    pub(super) backend_saw: Option<String>,
    pub(super) told_finish: bool,
}

impl Lane {
    /// What a fault aimed at this lane's holder says besides the fault: which backend.
    fn fault_facts(&self) -> FaultFacts {
        FaultFacts {
            backend: Some(self.kind.name().into()),
            ..FaultFacts::default()
        }
    }

    /// Reaps the workers that have exited (their event stream ended), so that none stays a
    /// zombie until the scenario ends. A killed holder was reaped by `kill` already.
    pub(super) fn reap_exited(&mut self, stage: &Stage) {
        if stage.has_exited(&self.holder_name) {
            self.holder.finish(Duration::from_secs(1));
        }
        if let Some(waiter) = self.waiter.as_mut()
            && stage.has_exited(&self.waiter_name)
        {
            waiter.finish(Duration::from_secs(1));
        }
    }

    pub(super) fn done(&self, stage: &Stage) -> bool {
        let holder_gone = self.struck.is_some() && stage.has_exited(&self.holder_name);
        let waiter_gone = self.waiter.is_some() && stage.has_exited(&self.waiter_name);
        holder_gone && waiter_gone
    }

    /// Moves the lane on by what its workers did so far: starts the waiter once the holder
    /// has the lock, strikes the holder mid-work, asks who holds the lock at the end of a
    /// freeze and resumes the holder, and lets the waiter finish once it has written.
    ///
    /// The faults are played by hand through the nemesis's player (`hand`), not as a
    /// schedule written up front: the strike waits for the waiter to be waiting (a
    /// condition on the run), and the resume follows the backend's answer to who holds the
    /// lock, asked just before it. Each is a step added to the scenario's schedule as it
    /// comes, which `--json` carries.
    pub(super) fn step(
        &mut self,
        stage: &mut Stage,
        plan: &Plan,
        scenario: Scenario,
        role: &dyn Fn(Service, Job) -> HolderScript,
        observer: &mut Observer,
        hand: &mut Hand,
    ) -> Result<()> {
        let Some(acquired_at) = self.acquired_at else {
            return self.start_waiter(stage, role);
        };
        let Some((struck_at, _)) = self.struck else {
            return self.strike_when_due(stage, plan, scenario, acquired_at, hand);
        };
        if scenario == Scenario::Freeze && self.resumed_t.is_none() {
            if Instant::now() < struck_at + plan.pause {
                return Ok(());
            }
            return self.ask_then_resume(stage, struck_at, observer, hand);
        }
        // The old holder is gone and the waiter has written: let it finish.
        let holder_gone = stage.has_exited(&self.holder_name);
        let waiter_ready = stage.saw(&self.waiter_name, Kind::Wrote).is_some();
        if holder_gone && waiter_ready && !self.told_finish {
            self.told_finish = true;
            if let Some(waiter) = self.waiter.as_mut() {
                waiter.tell("finish")?;
            }
        }
        Ok(())
    }

    /// Once the holder has the lock: notes when, and starts the waiter.
    fn start_waiter(
        &mut self,
        stage: &mut Stage,
        role: &dyn Fn(Service, Job) -> HolderScript,
    ) -> Result<()> {
        let Some(acquired) = stage.saw(&self.holder_name, Kind::Acquired) else {
            return Ok(());
        };
        let ago = stage
            .elapsed()
            .saturating_sub(Duration::from_millis(acquired.t_ms));
        self.acquired_at = Some(Instant::now() - ago);
        let waiter_role = role(self.kind, Job::Waiter);
        self.waiter =
            Some(stage.spawn(&waiter_role.name, &WorkerSpec::Holder(waiter_role.clone()))?);
        Ok(())
    }

    /// Halfway through the holder's work, once the waiter is waiting: strikes the holder
    /// (kill or freeze). In the overrun nobody is struck: times count from the grant.
    fn strike_when_due(
        &mut self,
        stage: &mut Stage,
        plan: &Plan,
        scenario: Scenario,
        acquired_at: Instant,
        hand: &mut Hand,
    ) -> Result<()> {
        if scenario == Scenario::Overrun {
            let acquired_t = stage
                .saw(&self.holder_name, Kind::Acquired)
                .map(|e| e.t_ms)
                .unwrap_or_default();
            self.struck = Some((acquired_at, acquired_t));
            return Ok(());
        }
        if Instant::now() < acquired_at + plan.strike_after() {
            return Ok(());
        }
        if stage.saw(&self.waiter_name, Kind::Waiting).is_none() {
            return self.waiter_late(stage, plan, acquired_at);
        }
        // The nemesis records the strike before it sends the signal, so that nothing the
        // signal causes (the waiter's acquisition) can carry an earlier time.
        catch_up(stage);
        let (pid, name) = (self.holder.pid, &self.holder_name);
        let (fault, words) = match scenario {
            Scenario::Kill => (
                Fault::Kill,
                format!("SIGKILL → {name} (pid {pid}) mid-work: no release, no goodbye"),
            ),
            Scenario::Freeze => (
                Fault::Pause,
                format!(
                    "SIGSTOP → {name} (pid {pid}) mid-work, for {}",
                    human(plan.pause)
                ),
            ),
            Scenario::Overrun => unreachable!("nobody is struck in the overrun"),
        };
        let note = Note::new(words, self.fault_facts());
        hand.play(stage, &mut self.holder, fault, note)?;
        self.struck = Some((Instant::now(), last_t(stage)));
        Ok(())
    }

    /// The waiter is not waiting yet when the strike is due. Not a usage error: the same
    /// flags work on a machine that is less busy. But a waiter stuck on a frozen server is
    /// late too, and will say so within its own connect and command timeouts: near the end
    /// of the holder's work, give it that long to name the server, then stop.
    fn waiter_late(&self, stage: &mut Stage, plan: &Plan, acquired_at: Instant) -> Result<()> {
        if Instant::now() <= acquired_at + plan.work.mul_f64(0.9) {
            return Ok(());
        }
        let grace = connect::CONNECT_TIMEOUT + connect::COMMAND_TIMEOUT;
        let waiter = self.waiter_name.clone();
        let _ = stage.wait_for(grace, "the waiter", |e| {
            e.is(&waiter, Kind::Waiting) || e.is(&waiter, Kind::Error)
        });
        if let Some(failed) = stage.log.iter().find(|e| e.kind() == Kind::Error) {
            return Err(crate::labs::worker_failed(&failed.worker, &failed.text));
        }
        bail!(
            "{} was still starting when {} finished its {} of work, so there was nothing \
             to measure (is the machine very busy?); run it again, or give a longer --work",
            self.waiter_name,
            self.holder_name,
            human(plan.work)
        );
    }

    /// At the end of the freeze: asks the backend who holds the lock, records its answer,
    /// then resumes the holder.
    fn ask_then_resume(
        &mut self,
        stage: &mut Stage,
        struck_at: Instant,
        observer: &mut Observer,
        hand: &mut Hand,
    ) -> Result<()> {
        let holder = observer.holder(self.kind, &self.lock_name)?;
        // Events that arrived during the question come first, and may name the owner.
        catch_up(stage);
        let holder_owner = owner_of(stage, &self.holder_name);
        let waiter_owner = owner_of(stage, &self.waiter_name);
        let (who, text) = match &holder {
            Some(h) if Some(h) == holder_owner.as_ref() => {
                ("holder", "still belongs to the frozen holder".to_string())
            }
            Some(h) if Some(h) == waiter_owner.as_ref() => (
                "waiter",
                "belongs to the waiter: the frozen holder lost it without knowing".to_string(),
            ),
            Some(h) => ("other", format!("belongs to someone else ({h})")),
            None => ("nobody", "is free".to_string()),
        };
        stage.record(Event::new(
            self.kind.name(),
            HolderNow {
                holder: Some(who.into()),
                backend: Some(self.kind.name().into()),
                ..HolderNow::default()
            },
            format!(
                "asked before the resume, {} says the lock {text}",
                self.kind.name()
            ),
        ));
        self.backend_saw = Some(who.to_string());
        catch_up(stage);
        let words = format!(
            "SIGCONT → {} after {}",
            self.holder_name,
            human(struck_at.elapsed())
        );
        let note = Note::new(words, self.fault_facts());
        hand.play(stage, &mut self.holder, Fault::Resume, note)?;
        self.resumed_t = Some(last_t(stage));
        Ok(())
    }

    /// The cell: its facts from the scenario's history ([`judge_cell`]), and the handover
    /// the options predict.
    pub(super) fn verdict(&self, stage: &Stage, plan: &Plan, scenario: Scenario) -> Result<Cell> {
        let mut cell = judge_cell(self.kind, scenario, &stage.log)?;
        (cell.expected, cell.expected_why) = self.expected(stage, plan, scenario);
        Ok(cell)
    }

    /// The handover the options predict: a short figure, and where it comes from.
    fn expected(&self, stage: &Stage, plan: &Plan, scenario: Scenario) -> (String, String) {
        let held = match (self.struck, stage.saw(&self.holder_name, Kind::Acquired)) {
            (Some((_, strike)), Some(acquired)) => {
                Duration::from_millis(strike.saturating_sub(acquired.t_ms))
            }
            _ => Duration::ZERO,
        };
        let lease = stage
            .saw(&self.holder_name, Kind::Waiting)
            .and_then(|e| match &e.what {
                What::Waiting(waiting) => waiting.lease_ttl_ms,
                _ => None,
            })
            .map(Duration::from_millis)
            .unwrap_or(plan.lease);
        let ttl = plan.plain_ttl(scenario);
        if scenario == Scenario::Overrun {
            return match self.kind {
                Service::Redis if ttl < plan.work => (
                    format!("≈ {}", human(ttl)),
                    format!(
                        "the TTL, set once, runs out before the {} of work",
                        human(plan.work)
                    ),
                ),
                _ => (
                    format!("≈ {}", human(plan.work)),
                    "the work, then the holder's release".into(),
                ),
            };
        }
        // The earliest moment the backend could free a frozen holder's lock by itself.
        let earliest = match (self.kind, plan.pg_timeout) {
            (Service::Redis, _) => ttl.saturating_sub(held),
            (Service::RedisRenewed | Service::Etcd, _) => lease * 2 / 3,
            (Service::Postgres, Some(t)) => t * 2 / 3,
            (Service::Postgres, None) => Duration::MAX,
        };
        if scenario == Scenario::Freeze && plan.pause < earliest {
            return (
                format!("> {}", human(plan.pause)),
                "the pause ends first; the holder wakes and releases".into(),
            );
        }
        match self.kind {
            Service::Redis => (
                format!("≈ {}", human(ttl.saturating_sub(held))),
                format!("TTL {} − {} held", human(ttl), human(held)),
            ),
            // Redis drops an expired key the moment anyone touches it, and the waiter's
            // SET NX touches it every 20ms: no sweep to wait for, unlike etcd.
            Service::RedisRenewed => (
                format!("{}–{}", human(lease * 2 / 3), human(lease)),
                "⅔–1 TTL after the last renewal".into(),
            ),
            Service::Etcd => (
                format!(
                    "{}–{}",
                    human(lease * 2 / 3),
                    human(lease + Duration::from_millis(500))
                ),
                "⅔–1 lease TTL, + etcd's 0.5s expiry sweep".into(),
            ),
            Service::Postgres => match (scenario, plan.pg_timeout) {
                (Scenario::Kill, _) => {
                    ("at once".into(), "the session ends with the process".into())
                }
                (_, Some(t)) => (
                    format!("{}–{}", human(t * 2 / 3), human(t)),
                    "⅔–1 idle_session_timeout".into(),
                ),
                (_, None) => unreachable!("returned above"),
            },
        }
    }
}

/// The time stamp of the event just recorded.
pub(super) fn last_t(stage: &Stage) -> u64 {
    stage.log.last().map(|e| e.t_ms).unwrap_or_default()
}

/// The backend identity a worker reported with its lock.
fn owner_of(stage: &Stage, worker: &str) -> Option<String> {
    stage
        .saw(worker, Kind::Acquired)
        .and_then(|e| e.owner())
        .map(String::from)
}
