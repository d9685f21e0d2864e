//! Lab 4's play: four lanes (a holder and a waiter on each lock) side by side, struck the
//! same way at the same point of the holder's work.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;

use super::lane::Lane;
use super::observer::{Observer, catch_up};
use super::verdict::{Cell, resource_of, store_line};
use super::{Job, Plan, Scenario, Service};
use crate::connect::{self, Backend};
use crate::events::Kind;
use crate::labs::Stage;
use crate::labs::faults::Hand;
use crate::labs::runner::Run;
use crate::liveness::Liveness;
use crate::output::human;
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec};

#[derive(Clone)]
struct Urls {
    redis: String,
    etcd: String,
    postgres: String,
}

impl Urls {
    fn lock(&self, kind: Service) -> &str {
        match kind.backend() {
            Backend::Redis => &self.redis,
            Backend::Etcd => &self.etcd,
            Backend::Postgres => &self.postgres,
        }
    }
}

/// The holder and waiter scripts of one scenario, on each lock.
struct Roles<'a> {
    plan: &'a Plan,
    urls: &'a Urls,
    run_id: &'a str,
    scenario: Scenario,
}

impl Roles<'_> {
    fn lock_name(&self, kind: Service) -> String {
        let label = self.scenario.name();
        format!(
            "lockslab:{}:etcd-vs-redis:{label}:{}",
            self.run_id,
            kind.name()
        )
    }

    fn script(&self, kind: Service, job: Job) -> HolderScript {
        let plan = self.plan;
        let who = if matches!(job, Job::Waiter) {
            "waiter"
        } else {
            "holder"
        };
        let url = self.urls.lock(kind).to_string();
        let name = self.lock_name(kind);
        HolderScript {
            name: format!("{}:{who}", kind.name()),
            lock: match kind {
                Service::Redis => LockSpec::Redis {
                    url,
                    key: name,
                    ttl_ms: plan.plain_ttl(self.scenario).as_millis() as u64,
                    fence_counter: None,
                    renew: false,
                },
                Service::RedisRenewed => LockSpec::Redis {
                    url,
                    key: name,
                    ttl_ms: plan.lease.as_millis() as u64,
                    fence_counter: None,
                    renew: true,
                },
                Service::Etcd => LockSpec::Etcd {
                    url,
                    name,
                    lease_ttl_ms: plan.lease.as_millis() as u64,
                    token: true,
                },
                Service::Postgres => LockSpec::Postgres {
                    url,
                    name,
                    idle_timeout_ms: plan.pg_timeout.map(|t| t.as_millis() as u64),
                },
            },
            store_url: self.urls.postgres.clone(),
            run_id: self.run_id.into(),
            resource: resource_of(kind, self.scenario),
            wait_ms: plan.longest_wait().as_millis() as u64,
            before_write: match job {
                Job::Holder { work_ms } => BeforeWrite::Work { ms: work_ms },
                Job::Waiter => BeforeWrite::Nothing,
            },
            after_write: match job {
                Job::Holder { .. } => AfterWrite::Release,
                Job::Waiter => AfterWrite::HoldUntilTold,
            },
            fence_rule: Default::default(),
            token_sequence: None,
        }
    }
}

pub(super) fn play(
    plan: &Plan,
    run: &Run,
    scenario: Scenario,
    store: &mut Store,
) -> Result<Vec<Cell>> {
    let urls = &Urls {
        redis: run.url(Backend::Redis).to_string(),
        etcd: run.url(Backend::Etcd).to_string(),
        postgres: run.url(Backend::Postgres).to_string(),
    };
    let mut stage = run.stage();
    stage.timeline.set_lane_width(20);
    stage.tags().scenario = Some(scenario.name().into());
    stage.checkpoint(crate::labs::step::etcd_vs_redis::before(scenario.name()));
    heading(&stage, plan, scenario);
    let mut observer = Observer::connect(&urls.redis, &urls.etcd, &urls.postgres)?;
    let roles = Roles {
        plan,
        urls,
        run_id: &run.id,
        scenario,
    };
    let role = |kind: Service, job: Job| roles.script(kind, job);
    // The strikes and resumes: played by the nemesis's player as their moments come.
    let mut hand = Hand::new(&stage);
    let mut lanes = Vec::new();
    for kind in Service::ALL {
        let work_ms = plan.work.as_millis() as u64;
        let holder_role = role(kind, Job::Holder { work_ms });
        let holder = stage.spawn(&holder_role.name, &WorkerSpec::Holder(holder_role.clone()))?;
        lanes.push(Lane {
            kind,
            holder_name: holder_role.name.clone(),
            waiter_name: role(kind, Job::Waiter).name,
            lock_name: roles.lock_name(kind),
            resource: holder_role.resource.clone(),
            holder,
            waiter: None,
            acquired_at: None,
            struck: None,
            resumed_t: None,
            backend_saw: None,
            told_finish: false,
        });
    }

    // Workers wait up to the longest wait for their lock; the lab gives them 10s more. A lock
    // server that froze would keep a waiter in its lock call that long, in silence: the lab
    // asks the servers itself and stops, naming the one that no longer answers.
    let limit = plan.longest_wait() + Duration::from_secs(10);
    let deadline = Instant::now() + limit;
    let liveness = Liveness::watch(&servers_of(&lanes, urls), connect::COMMAND_TIMEOUT);
    let mut seen = 0;
    while !lanes.iter().all(|lane| lane.done(&stage)) {
        if let Some(line) = liveness.silent() {
            bail!("{line}");
        }
        if Instant::now() > deadline {
            bail!(
                "the {} scenario did not finish within {}",
                scenario.name(),
                human(limit)
            );
        }
        // Show everything that has arrived before the lab acts, so the timeline stays in order.
        stage.next(Duration::from_millis(10));
        catch_up(&mut stage);
        seen = stop_on_failure(&stage, &lanes, urls, seen)?;
        for lane in &mut lanes {
            lane.step(&mut stage, plan, scenario, &role, &mut observer, &mut hand)?;
            lane.reap_exited(&stage);
        }
        if scenario == Scenario::Freeze {
            freeze_bar(&mut stage, &lanes, plan, run.style);
        }
    }
    stage.timeline.clear_bar();
    cells(&mut stage, &mut lanes, (plan, scenario), (store, &run.id))
}

/// The scenario's heading, and what it holds fixed.
fn heading(stage: &Stage, plan: &Plan, scenario: Scenario) {
    stage.timeline.say("");
    stage.timeline.say(&format!(
        "{}",
        match scenario {
            Scenario::Kill =>
                "── kill: SIGKILL each holder mid-work; how long until the waiter holds the lock? ──",
            Scenario::Freeze => "── freeze: SIGSTOP each holder, resume it, let it write ──",
            Scenario::Overrun =>
                "── overrun: nobody is struck; each holder simply works, longer than the plain TTL ──",
        }
        .bold()
    ));
    if scenario == Scenario::Overrun {
        stage.timeline.say(&format!(
            "   each holder works {}; the plain Redis key lives {}; times count from the holder's grant",
            human(plan.work),
            human(plan.overrun_ttl)
        ));
    }
    if scenario == Scenario::Freeze {
        stage.timeline.say(&format!(
            "   each holder stays frozen for {}",
            human(plan.pause)
        ));
    }
}

/// Each server the lanes lock on, once.
fn servers_of(lanes: &[Lane], urls: &Urls) -> Vec<(Backend, String)> {
    let mut servers: Vec<(Backend, String)> = Vec::new();
    for lane in lanes {
        let backend = lane.kind.backend();
        if !servers.iter().any(|(b, _)| *b == backend) {
            servers.push((backend, urls.lock(lane.kind).to_string()));
        }
    }
    servers
}

/// A worker that failed, gave up on the lock, or exited without it ends the scenario with
/// its own reason. Looks at the events from `seen` on; returns how many it has seen.
fn stop_on_failure(stage: &Stage, lanes: &[Lane], urls: &Urls, seen: usize) -> Result<usize> {
    for event in stage.log.iter().skip(seen) {
        match event.kind() {
            Kind::Error => return Err(crate::labs::worker_failed(&event.worker, &event.text)),
            // A heartbeat that got no answer at all: the lock's server froze or went
            // away, and the waiter on it will wait out its whole wait in silence.
            // Nothing can be measured on that lane: stop, naming the server.
            Kind::Lost if connect::names_a_silent_server(&event.text) => {
                return Err(crate::labs::worker_failed(&event.worker, &event.text));
            }
            Kind::GaveUp => {
                // A lock call outlasted its own wait: say which server it waited on.
                let on = lanes
                    .iter()
                    .find(|lane| {
                        lane.waiter_name == event.worker || lane.holder_name == event.worker
                    })
                    .map(|lane| {
                        format!(
                            "{} at {}: ",
                            lane.kind.name(),
                            connect::redact(urls.lock(lane.kind))
                        )
                    })
                    .unwrap_or_default();
                bail!("{on}worker {} {}", event.worker, event.text)
            }
            _ => {}
        }
    }
    for lane in lanes {
        for name in [&lane.holder_name, &lane.waiter_name] {
            if stage.has_exited(name) && stage.saw(name, Kind::Acquired).is_none() {
                bail!("worker {name} exited before it took the lock (its error, if any, is above)");
            }
        }
    }
    Ok(stage.log.len())
}

/// Once every lane is done: the workers reaped, each lane's store read back, its cell.
fn cells(
    stage: &mut Stage,
    lanes: &mut [Lane],
    (plan, scenario): (&Plan, Scenario),
    (store, run_id): (&mut Store, &str),
) -> Result<Vec<Cell>> {
    for lane in lanes.iter_mut() {
        lane.holder.finish(Duration::from_secs(5));
        if let Some(waiter) = lane.waiter.as_mut() {
            waiter.finish(Duration::from_secs(5));
        }
    }
    stage.drain();
    let mut cells = Vec::new();
    for lane in lanes.iter() {
        let read = store.read_back(run_id, &lane.resource)?;
        stage.record_read_back(&lane.resource, &read);
        let cell = lane.verdict(stage, plan, scenario)?;
        if let Some(line) = store_line(&cell) {
            stage.conclude(line);
        }
        cells.push(cell);
    }
    Ok(cells)
}

/// While holders are frozen, a bar (on a terminal only) counts the pause of the first one.
fn freeze_bar(stage: &mut Stage, lanes: &[Lane], plan: &Plan, style: crate::output::Style) {
    let frozen: Vec<&Lane> = lanes
        .iter()
        .filter(|lane| lane.struck.is_some() && lane.resumed_t.is_none())
        .collect();
    let Some(first) = frozen
        .iter()
        .filter_map(|lane| lane.struck)
        .min_by_key(|s| s.0)
    else {
        stage.timeline.clear_bar();
        return;
    };
    if stage.timeline.bar().is_none() {
        let bar = style.progress(plan.pause.as_millis() as u64, "  {msg} [{bar:30}]");
        stage.timeline.attach_bar(bar);
    }
    if let Some(bar) = stage.timeline.bar() {
        let elapsed = first.0.elapsed().min(plan.pause);
        bar.set_position(elapsed.as_millis() as u64);
        bar.set_message(format!(
            "holders frozen: {} — {} of {}",
            frozen.len(),
            human(elapsed),
            human(plan.pause)
        ));
    }
}
