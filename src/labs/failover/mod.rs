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
this lab. The store is the usual Postgres.
By hand: see labs/05-failover.md.", crate::lab_exit_status_help!()))]
pub struct FailoverArgs {
    /// Play one etcd scenario on hosts of its own (network namespaces) instead of the
    /// usual run [default: Redis failover, then etcd's leader killed]
    #[arg(long = "scenario", value_enum, value_name = "SCENARIO")]
    pub on_hosts: Option<OnHosts>,
    /// How long each Redis lock lives (5s to 10m): long, so that B's grant falls inside A's
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
    /// An etcd scenario on hosts, played alone.
    on_hosts: Option<OnHosts>,
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
            on_hosts: args.on_hosts,
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
        leftovers.store(postgres).sql(
            postgres,
            &format!("DROP SEQUENCE IF EXISTS {}", sequence_of(&run.id)),
        )
    }

    fn play(&mut self, run: &mut Run) -> Result<Verdict> {
        let postgres = run.url(Backend::Postgres).to_string();
        let mut store = Store::connect(&postgres)?;
        store.prepare()?;
        if let Some(which) = self.on_hosts {
            return self.play_on_hosts(run, &postgres, &mut store, which);
        }
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
        store_sequence(&postgres, &sequence)?;
        let mut stage = run.stage();
        stage.timeline.set_lane_width(16);
        let play = Play {
            run_id: &run.id,
            postgres: &postgres,
            sequence: &sequence,
            ttl: self.ttl,
        };
        // Dropped on every way out of here, it resumes whatever it left paused.
        let mut nemesis = Nemesis::new();
        stage.checkpoint(&super::step::failover::REDIS);
        let mut scenarios =
            play.redis_failover(&mut stage, &mut nemesis, &mut redis, &mut store)?;
        redis.stop();
        stage.checkpoint(&super::step::failover::ETCD);
        // The etcd part's kills: played by the nemesis's player as their moments come.
        let mut hand = Hand::new(&stage);
        scenarios.extend(play.etcd_leader_killed(&mut stage, &mut hand, &mut etcd, &mut store)?);
        Ok(Verdict {
            ttl: self.ttl,
            scenarios,
        })
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
    takes: "16s",
    needs: &[Backend::Redis, Backend::Etcd, Backend::Postgres],
    starts_its_own: Some("own Redis+etcd"),
    walkthrough: "labs/05-failover.md",
    session: 15,
    stops: 3,
    by_hand: &["redis-server", "redis-cli", "etcdctl", "jq"],
};
