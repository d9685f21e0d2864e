//! Lab 4 — the same lock on Redis (plain and renewed), etcd and Postgres: kill or freeze
//! the holder, or let its work run long; who recovers, how fast, and who can fence.
//!
//! Each lock gets a holder and a waiter, all eight worker processes at once:
//!
//! ```text
//!  redis:holder   takes the lock, works…  ✖ SIGKILL (or ❄ SIGSTOP … ▶ SIGCONT, writes)
//!  redis:waiter         waits ─────────────────────────▶ takes the lock, writes
//!  (the same on the renewed Redis lock, on etcd and on Postgres, side by side)
//! ```
//!
//! - **Kill**: the holder dies mid-work. How long until the waiter gets the lock is set by
//!   what the backend waits for: the plain Redis lock for the key's TTL, set once; the
//!   renewed one and etcd for one short TTL after the last heartbeat; Postgres for nothing
//!   (the session closed with the process).
//! - **Freeze**: the holder stops mid-work, longer than its TTL or lease, then wakes and
//!   writes to the store of lab 1 with whatever token it has. Redis, renewed or not, hands
//!   the lock on (a heartbeat freezes with its process) and has no token: the stale write
//!   lands. etcd hands the lock on, but the waiter's key revision is higher: the store
//!   refuses the stale write. Postgres keeps the frozen session's lock: no second holder,
//!   but no progress either — unless `--pg-timeout` has the server end the idle session.
//! - **Overrun**: nobody is struck; the work simply takes longer than the plain Redis TTL,
//!   the most common Redis lock bug. The plain key expires under a live holder; the renewed
//!   key, the etcd lease and the session all last as long as the work.
//!
//! The locks are in `src/lock/` (`redis.rs`, `etcd.rs`, `postgres.rs`), one file each, to
//! be read side by side. The verdict comes from the backends (who holds the lock when the
//! frozen holder wakes) and from the store (which writes it accepted), never from what a
//! worker believed.

use crate::redis_health::KeyLoss;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::leftovers::Leftovers;
use super::{LONGEST_LAB_WAIT, OutputArgs, Stage, WorkerHandle, duration_in, new_run_id};
use crate::check::{self, Finding, LateWrite};
use crate::connect::{self, Backend};
use crate::events::{Event, Kind};
use crate::lock::etcd::EtcdLock;
use crate::lock::postgres as pg;
use crate::output::{Style, human, json_line, table};
use crate::servers::{self, ServerArgs};
use crate::store::{ReadBack, Store};
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec, release_of};

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab etcd-vs-redis                     kill, freeze, then overrun, on every lock
  lockslab etcd-vs-redis --kill              only the kill: time until the next holder
  lockslab etcd-vs-redis --freeze            only the freeze: two holders? stale write?
  lockslab etcd-vs-redis --overrun           only the overrun: work longer than the TTL
  lockslab etcd-vs-redis --freeze --pg-timeout 2s
                                             Postgres ends the frozen session after 2s idle
  lockslab etcd-vs-redis --redis-ttl 3s --lease 1s --kill
                                             shorter TTLs, faster handover
  lockslab etcd-vs-redis --json | jq -c 'select(.kind == \"verdict\") | .cells[]'

The locks are in src/lock/redis.rs, etcd.rs and postgres.rs; the walkthrough is
labs/04-etcd-vs-redis.md.", crate::lab_exit_status_help!()))]
pub struct EtcdVsRedisArgs {
    /// Run only the kill scenario (SIGKILL the holder mid-work)
    #[arg(long)]
    pub kill: bool,
    /// Run only the freeze scenario (SIGSTOP the holder past its TTL, then resume it)
    #[arg(long)]
    pub freeze: bool,
    /// Run only the overrun scenario (nobody is struck; the work outlasts the plain Redis TTL)
    #[arg(long)]
    pub overrun: bool,
    /// The plain Redis lock's TTL, set once when the key is set; 100ms to 10m [default: 6s,
    /// and half the work in the overrun scenario]
    #[arg(long, value_parser = duration_in(Duration::ZERO, LONGEST_LAB_WAIT), value_name = "DURATION")]
    pub redis_ttl: Option<Duration>,
    /// etcd: each worker's lease TTL, whole seconds from 1s to 10m; a heartbeat renews it
    /// every TTL/3. The renewed Redis lock uses the same TTL and heartbeat
    #[arg(long, default_value = "2s", value_parser = duration_in(Duration::ZERO, LONGEST_LAB_WAIT),
          value_name = "DURATION")]
    pub lease: Duration,
    /// Postgres: end a session after this long without a command (idle_session_timeout);
    /// off by default, so a frozen holder keeps its lock; 300ms to 10m
    #[arg(long, value_parser = duration_in(Duration::ZERO, LONGEST_LAB_WAIT), value_name = "DURATION")]
    pub pg_timeout: Option<Duration>,
    /// How long the holder's work takes; the lab strikes halfway through it (200ms to 10m)
    #[arg(long, default_value = "2s", value_parser = duration_in(Duration::ZERO, LONGEST_LAB_WAIT),
          value_name = "DURATION")]
    pub work: Duration,
    /// How long the freeze lasts, 100ms to 10m [default: the longest of the TTLs and
    /// timeouts + 1s]
    #[arg(long, value_parser = duration_in(Duration::ZERO, LONGEST_LAB_WAIT), value_name = "DURATION")]
    pub pause: Option<Duration>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// The lock a lane of the lab runs on.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum Service {
    /// ❌ for long or unpredictable work: `SET NX PX ttl`, the TTL set once.
    Redis,
    /// ✅ The same key with a short TTL that a heartbeat re-arms (owner-checked `PEXPIRE`).
    RedisRenewed,
    Etcd,
    Postgres,
}

impl Service {
    const ALL: [Service; 4] = [
        Service::Redis,
        Service::RedisRenewed,
        Service::Etcd,
        Service::Postgres,
    ];

    fn name(self) -> &'static str {
        match self {
            Service::Redis => "redis",
            Service::RedisRenewed => "redis-renewed",
            Service::Etcd => "etcd",
            Service::Postgres => "postgres",
        }
    }

    /// The server the lock lives on.
    fn backend(self) -> Backend {
        match self {
            Service::Redis | Service::RedisRenewed => Backend::Redis,
            Service::Etcd => Backend::Etcd,
            Service::Postgres => Backend::Postgres,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    Kill,
    Freeze,
    /// Nobody is struck: the holder's work outlasts the plain Redis key's TTL.
    Overrun,
}

impl Scenario {
    /// The old holder, as the verdict's sentences call it.
    fn late_holder(self) -> &'static str {
        match self {
            Scenario::Freeze => "woken",
            Scenario::Kill | Scenario::Overrun => "old",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Scenario::Kill => "kill",
            Scenario::Freeze => "freeze",
            Scenario::Overrun => "overrun",
        }
    }
}

/// A lane's two workers: the holder works (and is struck halfway), the waiter writes as soon
/// as the lock is its own and then keeps it until told, so that a frozen holder wakes into
/// a lock that is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Job {
    Holder { work_ms: u64 },
    Waiter,
}

/// One cell of the final matrix: one backend in one scenario, as the evidence shows it.
/// Every cell of the printed matrix is a field here, so `--json` can rebuild the matrix.
#[derive(Serialize, Debug, Clone)]
pub struct Cell {
    pub backend: &'static str,
    pub scenario: Scenario,
    /// From the strike (kill or freeze) until the waiter held the lock; in the overrun
    /// scenario, from the holder's grant; null if it never did.
    pub handover_ms: Option<u64>,
    /// The handover the options predict ("≈ 5s", "1.3s–2.5s"), and where that comes from.
    pub expected: String,
    pub expected_why: String,
    /// The backend gave the lock to the waiter while the old holder had not let go of it,
    /// by the backend's own answers; null when they cannot tell.
    pub two_holders: Option<bool>,
    /// The old holder's write, in the store's decision order relative to the waiter's
    /// accepted write: "none", "accepted" or "rejected".
    pub late_write: LateWrite,
    /// Whether the store took a write that came after the waiter's; null when none did.
    pub stale_write_accepted: Option<bool>,
    /// The writes reached the store with a token from the lock.
    pub fencing_token: bool,
    /// The store's record the cell was read from: every write, in decision order.
    pub attempts: Vec<crate::store::Attempt>,
    #[serde(skip)]
    detail: Detail,
}

/// What the matrix prints beside the JSON fields.
#[derive(Debug, Clone, Default)]
struct Detail {
    holder_token: Option<i64>,
    waiter_token: Option<i64>,
}

/// The options every lane of a run shares.
struct Plan {
    run_id: String,
    /// The lab run's one clock: every scenario's events are stamped from here.
    started: Instant,
    /// The plain Redis lock's TTL in the kill and freeze scenarios…
    redis_ttl: Duration,
    /// …and in the overrun scenario.
    overrun_ttl: Duration,
    /// etcd's lease TTL, and the renewed Redis lock's TTL.
    lease: Duration,
    pg_timeout: Option<Duration>,
    work: Duration,
    pause: Duration,
    style: Style,
}

impl Plan {
    fn strike_after(&self) -> Duration {
        self.work / 2
    }

    /// The plain Redis lock's TTL in `scenario`.
    fn plain_ttl(&self, scenario: Scenario) -> Duration {
        match scenario {
            Scenario::Overrun => self.overrun_ttl,
            _ => self.redis_ttl,
        }
    }

    /// A bound on any wait in a run, generous: a worker that waits longer is stuck.
    fn longest_wait(&self) -> Duration {
        self.work
            + self.pause
            + self.redis_ttl.max(self.overrun_ttl)
            + self.lease
            + self.pg_timeout.unwrap_or_default()
            + Duration::from_secs(10)
    }
}

/// `lockslab etcd-vs-redis`.
pub fn run(args: &EtcdVsRedisArgs) -> Result<()> {
    let plan = plan_from(args)?;
    let style = plan.style;
    let servers = servers::provide(
        &args.servers,
        &[Backend::Redis, Backend::Etcd, Backend::Postgres],
    )?;
    let mut store = Store::connect(servers.url(Backend::Postgres))?;
    store.prepare()?;

    let intro = crate::output::Timeline::new(style);
    intro.say(&crate::output::run_heading("etcd-vs-redis", &plan.run_id));
    for line in servers.describe() {
        intro.say(&format!("  {}", line.dimmed()));
    }
    let scenarios = scenarios_from(args, &plan);
    intro.say(&format!(
        "The same lock four ways, each with a holder and a waiter. The holder works {}; the lab strikes after {}.",
        human(plan.work),
        human(plan.strike_after())
    ));
    let times_the_work = |ttl: Duration| ttl.as_secs_f64() / plan.work.as_secs_f64();
    intro.say(&format!(
        "  redis          SET NX PX, TTL {} (set once, {:.1}× the work)",
        human(plan.redis_ttl),
        times_the_work(plan.redis_ttl)
    ));
    if scenarios.contains(&Scenario::Overrun) {
        intro.say(&format!(
            "                 in the overrun: TTL {} ({:.1}× the work)",
            human(plan.overrun_ttl),
            times_the_work(plan.overrun_ttl)
        ));
    }
    intro.say(&format!(
        "  redis-renewed  SET NX PX, TTL {}, a heartbeat re-arms it every {} (owner-checked PEXPIRE)",
        human(plan.lease),
        human(plan.lease / 3)
    ));
    intro.say(&format!(
        "  etcd           a lease per worker, TTL {}, heartbeat every {}; token = the lock key's create revision",
        human(plan.lease),
        human(plan.lease / 3)
    ));
    intro.say(&format!(
        "  postgres       pg_advisory_lock on the worker's session; {}",
        match plan.pg_timeout {
            Some(t) => format!(
                "idle_session_timeout {} (a ping every {})",
                human(t),
                human(t / 3)
            ),
            None => "no server-side timeout".into(),
        }
    ));

    if !(args.kill || args.freeze || args.overrun) && scenarios == [Scenario::Overrun] {
        intro.say(&format!(
            "--redis-ttl {} does not outlive --work {}: the plain lock will expire under a live holder. That is the overrun scenario, so the lab plays it (--kill and --freeze play the others).",
            typed(plan.redis_ttl),
            typed(plan.work)
        ));
    }
    let urls = Urls {
        redis: servers.url(Backend::Redis).to_string(),
        etcd: servers.url(Backend::Etcd).to_string(),
        postgres: servers.url(Backend::Postgres).to_string(),
    };
    let mut cells = Vec::new();
    // On Ctrl-C the workers are killed mid-run: their rows, keys and leases would stay on
    // a server that a whole workshop may share.
    let key_loss = KeyLoss::watch(&urls.redis)?;
    let leftovers = Leftovers::of_run(&plan.run_id)
        .store(&urls.postgres)
        .redis(&urls.redis)
        .etcd(&urls.etcd)
        .removed_at_the_end();
    let result = (|| -> Result<()> {
        for &scenario in &scenarios {
            cells.extend(play(&plan, scenario, &urls, &mut store)?);
        }
        Ok(())
    })()
    .map_err(connect::explain);
    leftovers.now(&result);
    result?;
    key_loss.check()?;
    super::step::checkpoint(&super::step::etcd_vs_redis::VERDICT);

    if style.json {
        json_line(&json!({
            "kind": "verdict",
            "json_version": super::JSON_VERSION,
            "lab": "etcd-vs-redis",
            "run_id": plan.run_id,
            "cells": cells,
        }));
    } else {
        print_matrix(&cells, &plan);
    }
    Ok(())
}

/// A flag's value as the user most likely typed it: `0s`, `2s`, `1500ms`.
fn typed(value: Duration) -> String {
    if value.subsec_nanos() == 0 {
        format!("{}s", value.as_secs())
    } else {
        human(value)
    }
}

/// The scenarios to play: those asked for, or all three. A `--redis-ttl` that does not
/// outlive the work is the overrun scenario itself (in the kill and freeze the key would run
/// out before the strike), so with no scenario named, that is what plays.
fn scenarios_from(args: &EtcdVsRedisArgs, plan: &Plan) -> Vec<Scenario> {
    let asked: Vec<Scenario> = [
        (args.kill, Scenario::Kill),
        (args.freeze, Scenario::Freeze),
        (args.overrun, Scenario::Overrun),
    ]
    .into_iter()
    .filter_map(|(on, scenario)| on.then_some(scenario))
    .collect();
    if !asked.is_empty() {
        asked
    } else if args.redis_ttl.is_some() && plan.redis_ttl <= plan.work {
        vec![Scenario::Overrun]
    } else {
        vec![Scenario::Kill, Scenario::Freeze, Scenario::Overrun]
    }
}

fn plan_from(args: &EtcdVsRedisArgs) -> Result<Plan> {
    if let Some(ttl) = args.redis_ttl
        && ttl < Duration::from_millis(100)
    {
        crate::bail_usage!(
            "--redis-ttl {}: use at least 100ms, or Redis expiry and process start-up blur the story",
            typed(ttl)
        );
    }
    if args.lease < Duration::from_secs(1) || args.lease.subsec_nanos() != 0 {
        crate::bail_usage!(
            "--lease {}: etcd grants leases in whole seconds; use e.g. 1s or 2s",
            typed(args.lease)
        );
    }
    if args.work < Duration::from_millis(200) {
        crate::bail_usage!(
            "--work {}: use at least 200ms, so that the lab can strike in the middle of it",
            typed(args.work)
        );
    }
    if let Some(pause) = args.pause
        && pause < Duration::from_millis(100)
    {
        crate::bail_usage!(
            "--pause {}: use at least 100ms; a freeze shorter than that shows nothing",
            typed(pause)
        );
    }
    if let Some(t) = args.pg_timeout
        && t < Duration::from_millis(300)
    {
        crate::bail_usage!(
            "--pg-timeout {}: use at least 300ms; the holder pings its session every third of it",
            typed(t)
        );
    }
    let redis_ttl = args.redis_ttl.unwrap_or(Duration::from_secs(6));
    let longest = [redis_ttl, args.lease, args.pg_timeout.unwrap_or_default()]
        .into_iter()
        .max()
        .unwrap_or_default();
    Ok(Plan {
        run_id: new_run_id(),
        started: Instant::now(),
        redis_ttl,
        overrun_ttl: args.redis_ttl.unwrap_or(args.work / 2),
        lease: args.lease,
        pg_timeout: args.pg_timeout,
        work: args.work,
        pause: args.pause.unwrap_or(longest + Duration::from_secs(1)),
        style: Style::detect(args.output.json),
    })
}

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

/// One backend's holder and waiter within a scenario.
struct Lane {
    kind: Service,
    holder_name: String,
    waiter_name: String,
    lock_name: String,
    resource: String,
    holder: WorkerHandle,
    waiter: Option<WorkerHandle>,
    acquired_at: Option<Instant>,
    struck: Option<(Instant, u64)>,
    resumed_t: Option<u64>,
    backend_saw: Option<String>,
    told_finish: bool,
}

/// The lab's own view into the backends, to ask who holds a lock.
struct Observer {
    redis: connect::RedisConn,
    etcd: EtcdLock,
    postgres: connect::PgClient,
}

impl Observer {
    /// Who the backend says holds `lock` now (the same identity the workers report).
    fn holder(&mut self, kind: Service, lock: &str) -> Result<Option<String>> {
        Ok(match kind {
            Service::Redis | Service::RedisRenewed => redis::cmd("GET")
                .arg(lock)
                .query(&mut self.redis)
                .context("Redis: GET")?,
            Service::Etcd => self.etcd.holder_of(lock)?.map(|(key, _)| key),
            Service::Postgres => pg::holder_and_waiters(&mut self.postgres, lock)?
                .0
                .map(|pid| pid.to_string()),
        })
    }
}

fn play(plan: &Plan, scenario: Scenario, urls: &Urls, store: &mut Store) -> Result<Vec<Cell>> {
    let mut stage = Stage::on_clock(plan.style, plan.started);
    stage.timeline.set_lane_width(20);
    stage.tag("scenario", scenario.name());
    stage.checkpoint(super::step::etcd_vs_redis::before(scenario.name()));
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
    let mut observer = Observer {
        redis: connect::redis(&urls.redis)?,
        etcd: EtcdLock::connect(&urls.etcd, "")?,
        postgres: connect::postgres(&urls.postgres)?,
    };
    let label = scenario.name();
    let lock_name = |kind: Service| {
        format!(
            "lockslab:{}:etcd-vs-redis:{label}:{}",
            plan.run_id,
            kind.name()
        )
    };
    let role = |kind: Service, job: Job| {
        let who = if matches!(job, Job::Waiter) {
            "waiter"
        } else {
            "holder"
        };
        let url = urls.lock(kind).to_string();
        let name = lock_name(kind);
        HolderScript {
            name: format!("{}:{who}", kind.name()),
            lock: match kind {
                Service::Redis => LockSpec::Redis {
                    url,
                    key: name,
                    ttl_ms: plan.plain_ttl(scenario).as_millis() as u64,
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
                },
                Service::Postgres => LockSpec::Postgres {
                    url,
                    name,
                    idle_timeout_ms: plan.pg_timeout.map(|t| t.as_millis() as u64),
                },
            },
            store_url: urls.postgres.clone(),
            run_id: plan.run_id.clone(),
            resource: format!("etcd-vs-redis-{label}-{}", kind.name()),
            wait_ms: plan.longest_wait().as_millis() as u64,
            before_write: match job {
                Job::Holder { work_ms } => BeforeWrite::Work { ms: work_ms },
                Job::Waiter => BeforeWrite::Nothing,
            },
            after_write: match job {
                Job::Holder { .. } => AfterWrite::Release,
                Job::Waiter => AfterWrite::HoldUntilTold,
            },
            loose_fencing: false,
        }
    };

    let mut lanes = Vec::new();
    for kind in Service::ALL {
        let holder_role = role(
            kind,
            Job::Holder {
                work_ms: plan.work.as_millis() as u64,
            },
        );
        let holder = stage.spawn(&holder_role.name, &WorkerSpec::Holder(holder_role.clone()))?;
        lanes.push(Lane {
            kind,
            holder_name: holder_role.name.clone(),
            waiter_name: role(kind, Job::Waiter).name,
            lock_name: lock_name(kind),
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

    // Workers wait up to the longest wait for their lock; the lab gives them 10s more.
    let limit = plan.longest_wait() + Duration::from_secs(10);
    let deadline = Instant::now() + limit;
    let mut seen = 0;
    while !lanes.iter().all(|lane| lane.done(&stage)) {
        if Instant::now() > deadline {
            bail!(
                "the {label} scenario did not finish within {}",
                human(limit)
            );
        }
        // Show everything that has arrived before the lab acts, so the timeline stays in order.
        stage.next(Duration::from_millis(10));
        catch_up(&mut stage);
        // A worker that failed, or gave up on the lock, ends the scenario with its own reason.
        for event in stage.log.iter().skip(seen) {
            match event.kind {
                Kind::Error => return Err(super::worker_failed(&event.worker, &event.text)),
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
        seen = stage.log.len();
        for lane in &lanes {
            for name in [&lane.holder_name, &lane.waiter_name] {
                if stage.has_exited(name) && stage.saw(name, Kind::Acquired).is_none() {
                    bail!(
                        "worker {name} exited before it took the lock (its error, if any, is above)"
                    );
                }
            }
        }
        for lane in &mut lanes {
            lane.step(&mut stage, plan, scenario, &role, &mut observer)?;
            lane.reap_exited(&stage);
        }
        if scenario == Scenario::Freeze {
            freeze_bar(&mut stage, &lanes, plan);
        }
    }
    stage.timeline.clear_bar();
    for lane in &mut lanes {
        lane.holder.finish(Duration::from_secs(5));
        if let Some(waiter) = lane.waiter.as_mut() {
            waiter.finish(Duration::from_secs(5));
        }
    }
    stage.drain();

    let mut cells = Vec::new();
    for lane in &lanes {
        let read = store.read_back(&plan.run_id, &lane.resource)?;
        let cell = lane.verdict(&stage, plan, scenario, read);
        let store_line = match cell.late_write {
            LateWrite::Accepted => Some((
                Kind::StaleWriteAccepted,
                format!(
                    "{}: the store decided the {} holder's write after the waiter's, and took it",
                    lane.kind.name(),
                    scenario.late_holder()
                ),
            )),
            LateWrite::Rejected => Some((
                Kind::StaleWriteRejected,
                format!(
                    "{}: the store refused the {} holder's token {} (it had accepted {})",
                    lane.kind.name(),
                    scenario.late_holder(),
                    token_text(cell.detail.holder_token),
                    token_text(cell.detail.waiter_token)
                ),
            )),
            _ => None,
        };
        if let Some((kind, text)) = store_line {
            stage.record(Event::new("store", kind, text).with("backend", lane.kind.name()));
        }
        cells.push(cell);
    }
    Ok(cells)
}

/// Shows the events that have already arrived, so that what the lab records next comes after them.
///
/// `Stage::next` answers None both when nothing is waiting and when it consumed a worker's
/// end of stream; there is at most one of those per worker (eight per scenario), so nine
/// Nones in a row mean the queue is empty.
fn catch_up(stage: &mut Stage) {
    let mut nones = 0;
    while nones < 2 * Service::ALL.len() + 1 {
        match stage.next(Duration::ZERO) {
            Some(_) => nones = 0,
            None => nones += 1,
        }
    }
}

/// While holders are frozen, a bar (on a terminal only) counts the pause of the first one.
fn freeze_bar(stage: &mut Stage, lanes: &[Lane], plan: &Plan) {
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
        let bar = plan
            .style
            .progress(plan.pause.as_millis() as u64, "  {msg} [{bar:30}]");
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

fn token_text(token: Option<i64>) -> String {
    token.map(|t| t.to_string()).unwrap_or("none".into())
}

impl Lane {
    /// Reaps the workers that have exited (their event stream ended), so that none stays a
    /// zombie until the scenario ends. A killed holder was reaped by `kill` already.
    fn reap_exited(&mut self, stage: &Stage) {
        if stage.has_exited(&self.holder_name) {
            self.holder.finish(Duration::from_secs(1));
        }
        if let Some(waiter) = self.waiter.as_mut()
            && stage.has_exited(&self.waiter_name)
        {
            waiter.finish(Duration::from_secs(1));
        }
    }

    fn done(&self, stage: &Stage) -> bool {
        let holder_gone = self.struck.is_some() && stage.has_exited(&self.holder_name);
        let waiter_gone = self.waiter.is_some() && stage.has_exited(&self.waiter_name);
        holder_gone && waiter_gone
    }

    fn step(
        &mut self,
        stage: &mut Stage,
        plan: &Plan,
        scenario: Scenario,
        role: &dyn Fn(Service, Job) -> HolderScript,
        observer: &mut Observer,
    ) -> Result<()> {
        // 1. The holder has the lock: start the waiter.
        if self.waiter.is_none() {
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
            return Ok(());
        }
        let acquired_at = self.acquired_at.expect("set with the waiter");

        // 2. Overrun: no strike; times count from the holder's grant.
        if self.struck.is_none() && scenario == Scenario::Overrun {
            let acquired_t = stage
                .saw(&self.holder_name, Kind::Acquired)
                .map(|e| e.t_ms)
                .unwrap_or_default();
            self.struck = Some((acquired_at, acquired_t));
            return Ok(());
        }

        // 2. Halfway through the holder's work, once the waiter is waiting: strike.
        if self.struck.is_none() {
            if Instant::now() < acquired_at + plan.strike_after() {
                return Ok(());
            }
            if stage.saw(&self.waiter_name, Kind::Waiting).is_none() {
                // Not a usage error: the same flags work on a machine that is less busy. But a
                // waiter stuck on a frozen server is late too, and will say so within its own
                // connect and command timeouts: give it that long to name the server.
                if Instant::now() > acquired_at + plan.work.mul_f64(0.9) {
                    let grace = connect::CONNECT_TIMEOUT + connect::COMMAND_TIMEOUT;
                    let waiter = self.waiter_name.clone();
                    let _ = stage.wait_for(grace, "the waiter", |e| {
                        e.is(&waiter, Kind::Waiting) || e.is(&waiter, Kind::Error)
                    });
                    if let Some(failed) = stage.log.iter().find(|e| e.kind == Kind::Error) {
                        return Err(super::worker_failed(&failed.worker, &failed.text));
                    }
                    bail!(
                        "{} was still starting when {} finished its {} of work, so there was nothing \
                         to measure (is the machine very busy?); run it again, or give a longer --work",
                        self.waiter_name,
                        self.holder_name,
                        human(plan.work)
                    );
                }
                return Ok(());
            }
            // The lab stamps its action *before* sending the signal, so that nothing the
            // signal causes (the waiter's acquisition) can carry an earlier time.
            let pid = self.holder.pid;
            let (kind, text) = match scenario {
                Scenario::Kill => (
                    Kind::Killed,
                    format!(
                        "SIGKILL → {} (pid {pid}) mid-work: no release, no goodbye",
                        self.holder_name
                    ),
                ),
                Scenario::Freeze => (
                    Kind::Frozen,
                    format!(
                        "SIGSTOP → {} (pid {pid}) mid-work, for {}",
                        self.holder_name,
                        human(plan.pause)
                    ),
                ),
                Scenario::Overrun => unreachable!("nobody is struck in the overrun"),
            };
            catch_up(stage);
            stage.record(
                Event::new("lab", kind, text)
                    .with("target", self.holder_name.clone())
                    .with("backend", self.kind.name()),
            );
            self.struck = Some((Instant::now(), last_t(stage)));
            match scenario {
                Scenario::Kill => self.holder.kill(),
                Scenario::Overrun => {}
                Scenario::Freeze => {
                    self.holder.freeze()?;
                    if !crate::procs::wait_until_stopped(pid, Duration::from_secs(2)) {
                        bail!(
                            "worker {} (pid {pid}) did not stop after SIGSTOP",
                            self.holder_name
                        );
                    }
                }
            }
            return Ok(());
        }
        let (struck_at, _) = self.struck.expect("checked above");

        // 3. Freeze: at the end of the pause, ask the backend who holds the lock, then resume.
        if scenario == Scenario::Freeze && self.resumed_t.is_none() {
            if Instant::now() < struck_at + plan.pause {
                return Ok(());
            }
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
            stage.record(
                Event::new(
                    self.kind.name(),
                    Kind::HolderNow,
                    format!(
                        "asked before the resume, {} says the lock {text}",
                        self.kind.name()
                    ),
                )
                .with("holder", who)
                .with("backend", self.kind.name()),
            );
            self.backend_saw = Some(who.to_string());
            catch_up(stage);
            stage.record(
                Event::new(
                    "lab",
                    Kind::Resumed,
                    format!(
                        "SIGCONT → {} after {}",
                        self.holder_name,
                        human(struck_at.elapsed())
                    ),
                )
                .with("target", self.holder_name.clone())
                .with("backend", self.kind.name()),
            );
            self.resumed_t = Some(last_t(stage));
            self.holder.resume()?;
            return Ok(());
        }

        // 4. The old holder is gone and the waiter has written: let it finish.
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

    /// The cell, from the store's attempts and the backends' answers: who the backend said
    /// held the lock just before the resume, and what each release found.
    fn verdict(&self, stage: &Stage, plan: &Plan, scenario: Scenario, read: ReadBack) -> Cell {
        let strike_t = self.struck.map(|(_, t)| t).unwrap_or_default();
        let waiter_acquired = stage.saw(&self.waiter_name, Kind::Acquired);
        let late_write = check::late_write(&read.attempts, &self.holder_name, &self.waiter_name);
        let handover_ms = waiter_acquired.map(|e| e.t_ms.saturating_sub(strike_t));
        let two_holders = match scenario {
            // A killed holder holds nothing; a waiter that got in before the kill would be a
            // broken lock, and would show here. Its grant reached the lab before the lab even
            // sent SIGKILL, so it happened before the kill: arrival order can only prove this.
            Scenario::Kill => {
                if waiter_acquired.is_some_and(|e| e.t_ms < strike_t) {
                    Finding::Yes
                } else {
                    Finding::No
                }
            }
            // Asked just before the resume, the backend named the waiter: the frozen holder
            // could not have let go.
            Scenario::Freeze if self.backend_saw.as_deref() == Some("waiter") => Finding::Yes,
            Scenario::Freeze | Scenario::Overrun => {
                let release = |worker: &str| stage.saw(worker, Kind::Released);
                let holder_kept = release(&self.holder_name)
                    .and_then(|e| e.get_bool("released"))
                    .unwrap_or(false);
                match self.kind {
                    Service::Redis | Service::RedisRenewed => {
                        match release(&self.holder_name).and_then(release_of) {
                            Some(holder) => check::two_holders(
                                &holder,
                                waiter_acquired.and_then(|e| e.get_str("owner")),
                                release(&self.waiter_name).and_then(release_of).as_ref(),
                            ),
                            None => Finding::Unknown,
                        }
                    }
                    // etcd and Postgres queue the waiter in the server, which grants it the
                    // lock the moment the holder's key or session goes.
                    Service::Etcd | Service::Postgres => {
                        check::two_holders_queued(holder_kept, waiter_acquired.is_some())
                    }
                }
            }
        };
        let fencing_token =
            !read.attempts.is_empty() && read.attempts.iter().all(|a| a.token.is_some());
        let (expected, expected_why) = self.expected(stage, plan, scenario);
        Cell {
            backend: self.kind.name(),
            scenario,
            handover_ms,
            expected,
            expected_why,
            two_holders: check::two_holders_given_writes(two_holders, late_write).as_option(),
            late_write,
            stale_write_accepted: late_write.accepted(),
            fencing_token,
            detail: Detail {
                holder_token: read.last_token_of(&self.holder_name),
                waiter_token: read.last_token_of(&self.waiter_name),
            },
            attempts: read.attempts,
        }
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
            .and_then(|e| e.get_i64("lease_ttl_ms"))
            .map(|ms| Duration::from_millis(ms as u64))
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
fn last_t(stage: &Stage) -> u64 {
    stage.log.last().map(|e| e.t_ms).unwrap_or_default()
}

/// The backend identity a worker reported with its lock.
fn owner_of(stage: &Stage, worker: &str) -> Option<String> {
    stage
        .saw(worker, Kind::Acquired)
        .and_then(|e| e.data.get("owner"))
        .and_then(|v| v.as_str())
        .map(String::from)
}

impl Cell {
    /// One sentence on what the cell shows, from its evidence.
    fn meaning(&self, plan: &Plan) -> String {
        let handover = self
            .handover_ms
            .map(|ms| human(Duration::from_millis(ms)))
            .unwrap_or("never".into());
        let expected = format!(" (expected {}: {})", self.expected, self.expected_why);
        let renewed_every = human(plan.lease / 3);
        let why_handover = match (self.backend, self.scenario) {
            ("redis", _) => "Redis gave the lock away only when the key's TTL ran out".to_string(),
            ("redis-renewed", scenario) => format!(
                "the heartbeat (a PEXPIRE every {renewed_every}) {} with the process, and the short TTL ran out",
                if scenario == Scenario::Kill { "died" } else { "froze" }
            ),
            ("etcd", _) => {
                "the heartbeat stopped and etcd expired the lease, deleting the lock key".into()
            }
            ("postgres", Scenario::Kill) => {
                "the dead process's socket closed, the server ended its session, and the queued waiter got the lock at once".into()
            }
            ("postgres", _) if plan.pg_timeout.is_some() => {
                "idle_session_timeout ended the frozen client's session, and its lock with it".into()
            }
            _ => "the frozen client's session stayed open, so it kept the lock for the whole pause".into(),
        };
        let carried = if self.fencing_token {
            format!(
                "its write carried token {}.",
                token_text(self.detail.waiter_token)
            )
        } else {
            "its write carried no token.".into()
        };
        match self.scenario {
            Scenario::Kill if self.two_holders == Some(true) => format!(
                "the key's TTL ran out before the kill, under a live holder: the waiter held the lock first — two holders. {}",
                late_write_sentence(self)
            ),
            Scenario::Kill => format!(
                "{why_handover}: the waiter held it {handover} after the kill{expected}; {carried}"
            ),
            Scenario::Overrun if self.two_holders == Some(true) => format!(
                "the key's TTL ({}, set once) ran out while its holder was still working ({}), \
                 live and never paused: the waiter got the lock {handover} after the holder's \
                 grant{expected} — two holders. {}",
                human(plan.overrun_ttl),
                human(plan.work),
                late_write_sentence(self)
            ),
            Scenario::Overrun => {
                let kept = match self.backend {
                    "redis" => "the key's TTL outlived the work".to_string(),
                    "redis-renewed" => format!(
                        "the heartbeat re-armed the key every {renewed_every} while the holder worked"
                    ),
                    "etcd" => "the heartbeat renewed the lease while the holder worked".into(),
                    _ => "the session stayed open while the holder worked".into(),
                };
                format!(
                    "{kept}: the waiter got the lock {handover} after the holder's grant{expected}, \
                     once the holder had finished and let go — no second holder."
                )
            }
            Scenario::Freeze if self.two_holders.is_none() => format!(
                "{why_handover}; the waiter got the lock after {handover}{expected}, but both keys \
                 had expired by the time their holders let go, so Redis's answers cannot tell \
                 whether it did before the holder let go. {}",
                late_write_sentence(self)
            ),
            Scenario::Freeze if self.two_holders == Some(false) => {
                let why_not = match self.backend {
                    "redis" => format!(
                        "the {} pause ended before the key's TTL ran out, so the holder woke still holding the lock",
                        human(plan.pause)
                    ),
                    "redis-renewed" => format!(
                        "the {} pause ended before the key, renewed until the freeze, ran out",
                        human(plan.pause)
                    ),
                    "etcd" => format!(
                        "the {} pause ended before etcd expired the lease",
                        human(plan.pause)
                    ),
                    _ if plan.pg_timeout.is_some() => format!(
                        "the {} pause ended before idle_session_timeout ended the session",
                        human(plan.pause)
                    ),
                    _ => why_handover.clone(),
                };
                format!(
                    "{why_not}: no second holder (safe), but no progress either — the waiter got the lock after {handover}{expected}, only once the holder woke and let go."
                )
            }
            Scenario::Freeze => format!(
                "{why_handover}; after {handover}{expected} the waiter held it before the holder \
                 (frozen, or just woken) had let go — two holders. {}",
                late_write_sentence(self)
            ),
        }
    }
}

/// What the store did with the old holder's write, from its decision order.
fn late_write_sentence(cell: &Cell) -> String {
    let who = cell.scenario.late_holder();
    match cell.late_write {
        LateWrite::Accepted if !cell.fencing_token => format!(
            "The {who} holder, with no token to check, had its stale write accepted over the waiter's."
        ),
        LateWrite::Accepted => format!("The store took the {who} holder's stale write."),
        LateWrite::Rejected => format!(
            "The store refused the {who} holder's token {} because it had accepted the waiter's {}.",
            token_text(cell.detail.holder_token),
            token_text(cell.detail.waiter_token)
        ),
        LateWrite::None => format!(
            "The {who} holder's write was decided before the waiter's, so it destroyed nothing — \
             by luck, not by design."
        ),
    }
}

fn print_matrix(cells: &[Cell], plan: &Plan) {
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let header = [
        "backend",
        "scenario",
        "next holder",
        "expected",
        "two holders",
        "stale write",
        "token",
    ];
    let rows: Vec<Vec<String>> = cells
        .iter()
        .map(|cell| {
            let scenario = cell.scenario.name();
            let two = match cell.two_holders {
                Some(true) => "YES".red().bold().to_string(),
                Some(false) => "no".to_string(),
                None => "unknown".yellow().to_string(),
            };
            let stale = match cell.late_write {
                LateWrite::Accepted => "ACCEPTED".red().bold().to_string(),
                LateWrite::Rejected => "rejected".green().bold().to_string(),
                other => other.as_str().to_string(),
            };
            vec![
                cell.backend.to_string(),
                scenario.to_string(),
                cell.handover_ms
                    .map(|ms| human(Duration::from_millis(ms)))
                    .unwrap_or("nobody".into()),
                cell.expected.clone(),
                two,
                stale,
                yes_no(cell.fencing_token),
            ]
        })
        .collect();
    crate::outln!();
    crate::prose!("{}", "Verdict (from the backends and the store)".bold());
    crate::prose!("{}", table(&header, &rows));
    crate::outln!();
    for cell in cells {
        let scenario = cell.scenario.name();
        crate::prose!(
            "  {} {}",
            format!("{} / {scenario}:", cell.backend).bold(),
            cell.meaning(plan)
        );
    }
    crate::outln!();
    crate::prose!(
        "  {} a short renewed TTL (Redis or etcd) or a session gets the next holder \
         in fast after a crash, and lasts as long as the work; a TTL set once must \
         choose between the two. None of them keeps a paused holder out: only a token \
         the store checks keeps its write out. etcd's revision is such a token, and \
         Raft keeps what etcd acknowledged through a failover; a Redis owner value is \
         random, and Redis replicates asynchronously (lab 5).",
        "In short:".bold()
    );
}
