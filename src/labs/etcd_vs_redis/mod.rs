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

mod lane;
mod observer;
mod play;
mod verdict;
pub use verdict::{check, replay};

use std::time::Duration;

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::leftovers::Leftovers;
use super::runner::{self, Lab, Run};
use super::{LONGEST_LAB_WAIT, OutputArgs, duration_in};
use crate::connect::Backend;
use crate::output::human;
use crate::redis_health::KeyLoss;
use crate::servers::ServerArgs;
use crate::store::Store;
pub use verdict::Cell;
use verdict::Verdict;

/// Lab 4: kill or freeze the holder on Redis, etcd and Postgres; who recovers, who fences
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab etcd-vs-redis                     kill, freeze, then overrun, on
                                             every lock
  lockslab etcd-vs-redis --kill              only the kill: time until the next
                                             holder
  lockslab etcd-vs-redis --freeze            only the freeze: two holders? stale
                                             write?
  lockslab etcd-vs-redis --overrun           only the overrun: work longer than
                                             the TTL
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
    pub(crate) const ALL: [Service; 4] = [
        Service::Redis,
        Service::RedisRenewed,
        Service::Etcd,
        Service::Postgres,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Service::Redis => "redis",
            Service::RedisRenewed => "redis-renewed",
            Service::Etcd => "etcd",
            Service::Postgres => "postgres",
        }
    }

    /// The server the lock lives on.
    pub(crate) fn backend(self) -> Backend {
        match self {
            Service::Redis | Service::RedisRenewed => Backend::Redis,
            Service::Etcd => Backend::Etcd,
            Service::Postgres => Backend::Postgres,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    Kill,
    Freeze,
    /// Nobody is struck: the holder's work outlasts the plain Redis key's TTL.
    Overrun,
}

impl Scenario {
    /// The old holder, as the verdict's sentences call it.
    pub(crate) fn late_holder(self) -> &'static str {
        match self {
            Scenario::Freeze => "woken",
            Scenario::Kill | Scenario::Overrun => "old",
        }
    }

    pub(crate) fn name(self) -> &'static str {
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
pub(crate) enum Job {
    Holder { work_ms: u64 },
    Waiter,
}

/// The lab as the flags ask for it, checked once: the options every lane of a run shares.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// The scenarios to play, in order.
    scenarios: Vec<Scenario>,
    /// Said under the heading when the flags turned the default run into the overrun alone.
    only_overrun_because: Option<String>,
    /// The plain Redis lock's TTL in the kill and freeze scenarios…
    pub(crate) redis_ttl: Duration,
    /// …and in the overrun scenario.
    pub(crate) overrun_ttl: Duration,
    /// etcd's lease TTL, and the renewed Redis lock's TTL.
    pub(crate) lease: Duration,
    pub(crate) pg_timeout: Option<Duration>,
    pub(crate) work: Duration,
    pub(crate) pause: Duration,
}

impl Plan {
    pub(crate) fn strike_after(&self) -> Duration {
        self.work / 2
    }

    /// The plain Redis lock's TTL in `scenario`.
    pub(crate) fn plain_ttl(&self, scenario: Scenario) -> Duration {
        match scenario {
            Scenario::Overrun => self.overrun_ttl,
            _ => self.redis_ttl,
        }
    }

    /// A bound on any wait in a run, generous: a worker that waits longer is stuck.
    pub(crate) fn longest_wait(&self) -> Duration {
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
    let mut plan = plan_from(args)?;
    runner::run(&mut plan, &args.output, &args.servers)
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "etcd-vs-redis"
    }

    fn needs(&self) -> Vec<Backend> {
        vec![Backend::Redis, Backend::Etcd, Backend::Postgres]
    }

    fn intro(&self, _run: &Run) -> Vec<String> {
        let times_the_work = |ttl: Duration| ttl.as_secs_f64() / self.work.as_secs_f64();
        let mut lines = vec![
            format!(
                "The same lock four ways, each with a holder and a waiter. The holder works {}; the lab strikes after {}.",
                human(self.work),
                human(self.strike_after())
            ),
            format!(
                "  redis          SET NX PX, TTL {} (set once, {:.1}× the work)",
                human(self.redis_ttl),
                times_the_work(self.redis_ttl)
            ),
        ];
        if self.scenarios.contains(&Scenario::Overrun) {
            lines.push(format!(
                "                 in the overrun: TTL {} ({:.1}× the work)",
                human(self.overrun_ttl),
                times_the_work(self.overrun_ttl)
            ));
        }
        lines.push(format!(
            "  redis-renewed  SET NX PX, TTL {}, a heartbeat re-arms it every {} (owner-checked PEXPIRE)",
            human(self.lease),
            human(self.lease / 3)
        ));
        lines.push(format!(
            "  etcd           a lease per worker, TTL {}, heartbeat every {}; token = the lock key's create revision",
            human(self.lease),
            human(self.lease / 3)
        ));
        lines.push(format!(
            "  postgres       pg_advisory_lock on the worker's session; {}",
            match self.pg_timeout {
                Some(t) => format!(
                    "idle_session_timeout {} (a ping every {})",
                    human(t),
                    human(t / 3)
                ),
                None => "no server-side timeout".into(),
            }
        ));
        lines.extend(self.only_overrun_because.clone());
        lines
    }

    /// On Ctrl-C the workers are killed mid-run: their rows, keys and leases would stay on
    /// a server that a whole workshop may share.
    fn leftovers(&self, run: &Run, leftovers: Leftovers) -> Leftovers {
        leftovers
            .store(run.url(Backend::Postgres))
            .redis(run.url(Backend::Redis))
            .etcd(run.url(Backend::Etcd))
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        // A key Redis evicted or flushed must not pass for one that expired.
        let key_loss = KeyLoss::watch(run.url(Backend::Redis))?;
        let mut store = Store::connect(run.url(Backend::Postgres))?;
        store.prepare()?;
        let mut cells = Vec::new();
        for &scenario in &self.scenarios {
            cells.extend(play::play(self, run, scenario, &mut store)?);
        }
        key_loss.check()?;
        Ok(Verdict {
            cells,
            plan: self.clone(),
        })
    }
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
fn scenarios_from(args: &EtcdVsRedisArgs, redis_ttl: Duration) -> Vec<Scenario> {
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
    } else if args.redis_ttl.is_some() && redis_ttl <= args.work {
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
    let scenarios = scenarios_from(args, redis_ttl);
    let only_overrun_because = (!(args.kill || args.freeze || args.overrun)
        && scenarios == [Scenario::Overrun])
        .then(|| {
            format!(
                "--redis-ttl {} does not outlive --work {}: the plain lock will expire under a live holder. That is the overrun scenario, so the lab plays it (--kill and --freeze play the others).",
                typed(redis_ttl),
                typed(args.work)
            )
        });
    Ok(Plan {
        scenarios,
        only_overrun_because,
        redis_ttl,
        overrun_ttl: args.redis_ttl.unwrap_or(args.work / 2),
        lease: args.lease,
        pg_timeout: args.pg_timeout,
        work: args.work,
        pause: args.pause.unwrap_or(longest + Duration::from_secs(1)),
    })
}

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 4,
    command: "etcd-vs-redis",
    shows: "kill or freeze the holder: who hands over, who fences",
    takes: "17s",
    needs: &[Backend::Redis, Backend::Etcd, Backend::Postgres],
    starts_its_own: None,
    walkthrough: "labs/04-etcd-vs-redis.md",
    session: 15,
    stops: 13,
    by_hand: &["psql", "jq"],
};
