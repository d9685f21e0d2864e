//! Lab 5 — no pause needed: the lock service itself forgets a lock.
//!
//! Labs 1–4 break locks by pausing a client. Here nobody pauses. The story, on real
//! clusters that the lab starts:
//!
//! ```text
//!  Redis  A: SET NX on the primary ✓ ── primary SIGKILLed ── Sentinel promotes the replica
//!         B: asks Sentinel, SET NX on the new primary ✓     (which never had A's key)
//!         → two holders; and INCR on the new primary hands out A's token again
//!         A:wait, after its SET NX: WAIT 1 → 0, so it never writes (Redis granted twice still)
//!         A:min-replicas, with min-replicas-to-write 1: NOREPLICAS, no lock granted
//!  etcd   A holds the lock ── the leader SIGKILLed ── a new leader, A's key and lease intact
//!         B keeps waiting, gets a higher revision once A lets go
//! ```
//!
//! Redis replicates asynchronously: the primary answers `OK` before any replica has the
//! write. A write acknowledged to one client can die with the primary; whatever was
//! promoted never heard of it. etcd answers only once a majority of members has the write,
//! so any majority that elects the next leader has it too — and with no majority left it
//! grants nothing: unavailable, not unsafe. (It does not keep a paused holder's lease alive,
//! lab 1; and a request that timed out must be read back.)
//!
//! Every verdict is read back from the servers (which node held which key, each node's own
//! `ROLE`, etcd's `status`) and from the fenced store, never from what a worker believed.

mod etcd;
mod etcd_hosts;
mod etcd_partition;
mod etcd_stall;
mod hosts_check;
mod redis;
mod split_brain;
mod split_check;
mod split_clients;
mod verdict;
pub use etcd_hosts::OnHosts;

/// Lab 5's checker: the Redis and etcd rows ([`verdict::check`]) and the etcd-on-hosts
/// rows ([`hosts_check::check`]), one report.
pub fn check(history: &[crate::events::Event]) -> crate::check::report::Report {
    crate::check::report::Report::compose([verdict::check(history), hosts_check::check(history)])
}

/// `lockslab check`: every row judged again, each by the code that judged it live.
pub fn replay(
    events: &[crate::events::Event],
    recorded: &serde_json::Value,
) -> Result<super::replay::Replayed> {
    let mut replayed = verdict::replay(events, recorded)?;
    hosts_check::replay_rows(events, recorded, &mut replayed)?;
    Ok(replayed)
}

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use colored::Colorize;

use super::leftovers::Leftovers;
use super::runner::{self, Lab, Run};
use super::{LONGEST_LAB_WAIT, OutputArgs, duration_in};
use crate::cluster::{self, MASTER_NAME, SentinelCluster};
use crate::connect::{self, Backend};
use crate::labs::faults::Hand;
use crate::nemesis::Nemesis;
use crate::output::human;
use crate::servers::ServerArgs;
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::sentinel_client::{Rule, SentinelClient, StoreWrite, TokenSource};
use verdict::Verdict;
pub use verdict::{Scenario, StaleWrite};

/// Lab 5: no pause needed: a Redis failover hands the lock out twice, etcd's Raft does not
#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab failover                 Redis failover (plain, WAIT, durable), then
                                    etcd
  lockslab failover --ttl 30s       a longer lease: B's grant falls even deeper
                                    inside A's
  lockslab failover --scenario split-brain
                                    the primary partitioned from its Sentinels
                                    (on hosts of lockslab's own): two primaries,
                                    then with min-replicas-to-write 1
  lockslab failover --scenario all  both stories, one after the other
  lockslab failover --json | jq .   events and verdict as JSON Lines
  lockslab failover --scenario etcd-partition
                                    etcd's leader cut off in a minority
                                    (each member on a host of its own)
  lockslab failover --scenario etcd-stall
                                    etcd's leader stopped past its election
                                    timeout: is a live lease revoked? (#15247)

lockslab starts its own clusters (Redis primary + replica + 3 Sentinels;
3 etcd members) on free loopback ports, each with a password of its own,
and removes them at the end: --redis-url and --etcd-url are not used by
this lab. The split brain runs each Redis and Sentinel in a network
namespace of its own (no root needed where the kernel allows user
namespaces; `lockslab doctor` says whether this machine can partition). The store is the usual Postgres.
By hand: see labs/05-failover.md.", crate::lab_exit_status_help!()))]
pub struct FailoverArgs {
    /// Which story: a crash (the Redis primary and the etcd leader SIGKILLed), the split
    /// brain (the Redis primary cut off from its Sentinels by a network partition), all
    /// three; or etcd's leader cut off or stalled on hosts of its own (network namespaces)
    #[arg(long, value_enum, default_value_t = Scenarios::Crash)]
    pub scenario: Scenarios,
    /// How long each Redis lock of the crash lives (5s to 10m): long, so that B's grant
    /// falls inside A's (the split brain's lock lives 3s, renewed every second)
    #[arg(long, default_value = "10s", value_parser = parse_ttl, value_name = "DURATION")]
    pub ttl: Duration,
    /// A Sentinel of your own cluster (not supported yet: the lab SIGKILLs the primary)
    #[arg(long, value_name = "URL")]
    pub sentinel_url: Option<String>,
    /// etcd endpoints of your own cluster (not supported yet: the lab SIGKILLs members)
    #[arg(long, value_name = "URL,URL,…")]
    pub etcd_endpoints: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// The lab's stories, as `--scenario` names them.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenarios {
    /// The Redis primary SIGKILLed (plain, WAIT, min-replicas, fenced), then the etcd leader
    Crash,
    /// The Redis primary and its client cut off from the replica, the Sentinels and B:
    /// two primaries; then the same with min-replicas-to-write 1
    SplitBrain,
    /// Both, the crash first
    All,
    /// etcd's leader cut off in a minority by a real partition, then healed (hosts)
    EtcdPartition,
    /// etcd's leader stopped (SIGSTOP) past its election timeout: etcd #15247 (hosts)
    EtcdStall,
    /// Both etcd scenarios, one after the other, on one cluster (hosts)
    Etcd,
}

impl Scenarios {
    fn crash(self) -> bool {
        matches!(self, Scenarios::Crash | Scenarios::All)
    }

    fn split_brain(self) -> bool {
        matches!(self, Scenarios::SplitBrain | Scenarios::All)
    }

    /// The etcd scenarios on hosts, played alone.
    fn on_hosts(self) -> Option<OnHosts> {
        match self {
            Scenarios::EtcdPartition => Some(OnHosts::EtcdPartition),
            Scenarios::EtcdStall => Some(OnHosts::EtcdStall),
            Scenarios::Etcd => Some(OnHosts::Etcd),
            _ => None,
        }
    }
}

fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = duration_in(Duration::ZERO, LONGEST_LAB_WAIT)(text)?;
    if ttl < Duration::from_secs(5) {
        return Err(
            "use at least 5s: Sentinel takes about 2s to name the new primary, and \
                    a lock that ends before B asks would show lab 1's expiry, not a failover"
                .into(),
        );
    }
    Ok(ttl)
}

/// How long A:wait's `WAIT 1` waits for the replica to confirm its key.
const WAIT_TIMEOUT: Duration = Duration::from_millis(500);

/// The etcd lease of lab 5's holders, renewed every 2s by their heartbeat. Longer than an
/// election takes even on a busy machine (0.5–3s seen): etcd expires no lease while there
/// is no leader, but nothing is renewed either, and a holder that cannot know which of the
/// two happened gives its lease up once it can no longer vouch for it.
const ETCD_LEASE: Duration = Duration::from_secs(6);

/// The lab as the flags ask for it, checked once, before any server is touched.
pub(crate) struct Plan {
    ttl: Duration,
    scenarios: Scenarios,
    /// `--redis-url`/`--etcd-url` were given: said under the heading, since they go unused.
    urls_ignored: bool,
}

impl Plan {
    fn from_args(args: &FailoverArgs) -> Result<Plan> {
        if args.sentinel_url.is_some() || args.etcd_endpoints.is_some() {
            crate::bail_usage!(
                "--sentinel-url and --etcd-endpoints are not supported yet: every scenario of this lab \
                 SIGKILLs a server (the Redis primary, etcd members), which needs the clusters lockslab \
                 starts on this machine; run `lockslab failover` without them"
            );
        }
        Ok(Plan {
            ttl: args.ttl,
            scenarios: args.scenario,
            urls_ignored: args.servers.redis_url.is_some() || args.servers.etcd_url.is_some(),
        })
    }
}

/// `lockslab failover`.
pub fn run(args: &FailoverArgs) -> Result<()> {
    let mut plan = Plan::from_args(args)?;
    runner::run(&mut plan, &args.output, &args.servers)
}

/// The durable token source's name: a sequence in the store's own database, one per run.
fn sequence_of(run_id: &str) -> String {
    format!("lockslab_fence_{run_id}")
}

/// The split brain's token source: a sequence in the store's own schema, one per run.
fn split_sequence_of(run_id: &str) -> String {
    format!("lockslab_split_{run_id}")
}

impl Lab for Plan {
    type Verdict = Verdict;

    fn name(&self) -> &'static str {
        "failover"
    }

    /// Only the store: the lab kills servers, so it starts its Redis and etcd clusters itself.
    fn needs(&self) -> Vec<Backend> {
        vec![Backend::Postgres]
    }

    fn intro(&self, _run: &Run) -> Vec<String> {
        self.urls_ignored
            .then(|| {
                format!(
                    "  {}",
                    "(the Redis and etcd URLs given are not used: this lab kills servers, so it \
                     starts clusters of its own)"
                        .dimmed()
                )
            })
            .into_iter()
            .collect()
    }

    fn leftovers(&self, run: &Run, leftovers: Leftovers) -> Leftovers {
        let postgres = run.url(Backend::Postgres);
        let split = split_sequence_of(&run.id);
        leftovers.store(postgres).sql(
            postgres,
            &format!(
                "DROP SEQUENCE IF EXISTS {}; DROP SEQUENCE IF EXISTS {split}",
                sequence_of(&run.id)
            ),
        )
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        // Before anything runs: `all` must not play the crash and then find it cannot split.
        if self.scenarios.split_brain() {
            split_brain::can_make_hosts()?;
        }
        let postgres = run.url(Backend::Postgres).to_string();
        let mut store = Store::connect(&postgres)?;
        store.prepare()?;
        if let Some(which) = self.scenarios.on_hosts() {
            return self.play_on_hosts(run, &postgres, &mut store, which);
        }
        let mut verdict = Verdict {
            ttl: self.ttl,
            scenarios: Vec::new(),
            split_brain: Vec::new(),
        };
        if self.scenarios.crash() {
            verdict.scenarios = self.play_crash(run, &postgres, &mut store)?;
        }
        if self.scenarios.split_brain() {
            if !self.scenarios.crash() {
                run.started = Instant::now();
            }
            let mut stage = run.stage();
            stage.timeline.set_lane_width(16);
            let names = (run.id.as_str(), split_sequence_of(&run.id));
            split_brain::play(&mut stage, &mut store, (names.0, &names.1))?;
            verdict.split_brain = split_brain::rows(&stage);
        }
        Ok(verdict)
    }
}

impl Plan {
    /// The crash: the Redis primary SIGKILLed, then the etcd leader.
    fn play_crash(
        &mut self,
        run: &mut Run,
        postgres: &str,
        store: &mut Store,
    ) -> Result<Vec<Scenario>> {
        let (mut redis, mut etcd) = cluster::start_both()?;
        run.detail(&format!(
            "Redis    primary :{} replica :{} Sentinels :{} :{} :{} (ready in {})",
            redis.primary.port,
            redis.replica.port,
            redis.sentinels[0].port,
            redis.sentinels[1].port,
            redis.sentinels[2].port,
            human(redis.started_in)
        ));
        run.detail(&format!(
            "etcd     {} (ready in {})",
            etcd.members
                .iter()
                .map(|m| format!("{} {}", m.name, m.client_url.trim_start_matches("http://")))
                .collect::<Vec<_>>()
                .join(", "),
            human(etcd.started_in)
        ));
        // The story's clock starts once both clusters are up: their start-up is not part of
        // it (and takes seconds on a busy machine).
        run.started = Instant::now();
        let sequence = sequence_of(&run.id);
        store_sequence(postgres, &sequence)?;
        let mut stage = run.stage();
        stage.timeline.set_lane_width(16);
        let play = Play {
            run_id: &run.id,
            postgres,
            sequence: &sequence,
            ttl: self.ttl,
        };
        // Dropped on every way out of here, it resumes whatever it left paused.
        let mut nemesis = Nemesis::new();
        stage.checkpoint(&super::step::failover::REDIS);
        let mut scenarios = play.redis_failover(&mut stage, &mut nemesis, &mut redis, store)?;
        redis.stop();
        stage.checkpoint(&super::step::failover::ETCD);
        // The etcd part's kills: played by the nemesis's player as their moments come.
        let mut hand = Hand::new(&stage);
        scenarios.extend(play.etcd_leader_killed(&mut stage, &mut hand, &mut etcd, store)?);
        Ok(scenarios)
    }
}

impl Plan {
    /// An etcd scenario on hosts ([`etcd_hosts`]), alone: no Redis, no other etcd.
    fn play_on_hosts(
        &self,
        run: &mut Run,
        postgres: &str,
        store: &mut Store,
        which: OnHosts,
    ) -> Result<Verdict> {
        run.started = Instant::now();
        let mut stage = run.stage();
        stage.timeline.set_lane_width(16);
        let play = Play {
            run_id: &run.id,
            postgres,
            sequence: "",
            ttl: self.ttl,
        };
        let scenarios = play.on_hosts(&mut stage, store, which)?;
        Ok(Verdict {
            ttl: self.ttl,
            scenarios,
            split_brain: Vec::new(),
        })
    }
}

/// The durable token source: a sequence in the store's own database.
fn store_sequence(postgres: &str, name: &str) -> Result<()> {
    connect::postgres(postgres)?
        .batch_execute(&format!("CREATE SEQUENCE IF NOT EXISTS {name}"))
        .context("creating the token sequence in the store's database")
}

/// What every scenario of one run shares: its names and its store.
struct Play<'a> {
    run_id: &'a str,
    postgres: &'a str,
    sequence: &'a str,
    ttl: Duration,
}

/// One pair of Redis clients, A and B, with its own lock, token source and store writes.
struct Pair {
    /// `unfenced`, `incr`, `incr-lost`, `durable`, `wait`.
    label: &'static str,
    token: TokenSource,
    writes: Vec<(String, Rule)>,
    /// A checks its lock with `WAIT 1` and refuses to use it unconfirmed. B does not: the
    /// promoted replica has no replica of its own, so `WAIT 1` would refuse every client.
    a_waits: bool,
}

impl Play<'_> {
    fn key(&self, label: &str) -> String {
        format!("lockslab:{}:failover:{label}:lock", self.run_id)
    }

    fn resource(&self, name: &str) -> String {
        format!("failover-{name}")
    }

    fn pairs(&self) -> Vec<Pair> {
        let counter = |label: &str| TokenSource::RedisCounter {
            key: format!("lockslab:{}:failover:{label}:fence", self.run_id),
        };
        vec![
            Pair {
                label: "unfenced",
                token: TokenSource::None,
                writes: vec![("redis-unfenced".into(), Rule::NotLower)],
                a_waits: false,
            },
            Pair {
                label: "incr",
                token: counter("incr"),
                writes: vec![
                    ("redis-incr-not-lower".into(), Rule::NotLower),
                    ("redis-incr-same-holder".into(), Rule::HigherOrSameHolder),
                ],
                a_waits: false,
            },
            Pair {
                label: "incr-lost",
                token: counter("incr-lost"),
                writes: vec![("redis-incr-lost".into(), Rule::NotLower)],
                a_waits: false,
            },
            Pair {
                label: "durable",
                token: TokenSource::PostgresSequence {
                    name: self.sequence.to_string(),
                },
                writes: vec![("durable-token".into(), Rule::NotLower)],
                a_waits: false,
            },
            Pair {
                label: "wait",
                token: TokenSource::None,
                writes: vec![("redis-wait".into(), Rule::NotLower)],
                a_waits: true,
            },
        ]
    }

    fn client(&self, who: &str, pair: &Pair, redis: &SentinelCluster) -> WorkerSpec {
        WorkerSpec::SentinelClient(SentinelClient {
            name: format!("{who}:{}", pair.label),
            sentinels: redis.sentinel_urls(),
            master: MASTER_NAME.into(),
            key: self.key(pair.label),
            ttl_ms: self.ttl.as_millis() as u64,
            token: pair.token.clone(),
            store_url: self.postgres.into(),
            run_id: self.run_id.into(),
            writes: pair
                .writes
                .iter()
                .map(|(name, rule)| StoreWrite {
                    resource: self.resource(name),
                    rule: *rule,
                })
                .collect(),
            wait_ms: 20_000,
            confirm_with_wait_ms: (who == "A" && pair.a_waits)
                .then_some(WAIT_TIMEOUT.as_millis() as u64),
        })
    }
}

/// The lab's row in the menu and `lockslab list`.
pub const MENU: super::LabRow = super::LabRow {
    number: 5,
    command: "failover",
    shows: "Redis failover hands the lock out twice; etcd does not",
    takes: "11s",
    needs: &[Backend::Redis, Backend::Etcd, Backend::Postgres],
    starts_its_own: Some("own Redis+etcd"),
    walkthrough: "labs/05-failover.md",
    session: 15,
    stops: 8,
    by_hand: &["redis-server", "redis-cli", "etcdctl", "jq"],
};
