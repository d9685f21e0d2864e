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

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde::Serialize;
use serde_json::json;

use super::leftovers::Leftovers;
use super::{LONGEST_LAB_WAIT, OutputArgs, Stage, duration_in, new_run_id};
use crate::check;
use crate::cluster::{self, EtcdCluster, MASTER_NAME, SentinelCluster};
use crate::connect::{self, Backend};
use crate::events::{Event, Kind};
use crate::lock::etcd::EtcdLock;
use crate::lock::redis::RedisLock;
use crate::output::{Style, human, json_line, table};
use crate::servers::{self, ServerArgs};
use crate::store::{ReadBack, Store};
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec, release_of};
use crate::worker::sentinel_client::{Rule, SentinelClient, StoreWrite, TokenSource};

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab failover                 Redis failover (plain, WAIT, durable), then etcd
  lockslab failover --ttl 30s       a longer lease: B's grant falls even deeper inside A's
  lockslab failover --json | jq .   events and verdict as JSON Lines

lockslab starts its own clusters (Redis primary + replica + 3 Sentinels; 3 etcd members)
on free loopback ports and removes them at the end. The store is the usual Postgres.
By hand: see labs/05-failover.md.", crate::lab_exit_status_help!()))]
pub struct FailoverArgs {
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

/// How two writes of one scenario were decided, and what that says.
#[derive(Serialize, Debug, Clone, Copy)]
pub struct StaleWrite {
    /// A's write was decided after B's accepted write.
    pub attempted: bool,
    /// Whether the store took it; null when there was none.
    pub accepted: Option<bool>,
}

/// One row of the verdict. Every field is read back from a server or from the store.
#[derive(Serialize, Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub backend: &'static str,
    /// Two clients held the lock at once, per the servers' answers.
    pub two_holders: Option<bool>,
    /// B's token was not higher than A's (the source handed a number out again); null
    /// without tokens.
    pub token_reissued: Option<bool>,
    pub stale_write: StaleWrite,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub election_ms: Option<u64>,
    /// The fencing rule the store applied (`not-lower`, `higher-or-same-holder`), if any.
    pub store_rule: Option<Rule>,
    pub a_token: Option<i64>,
    pub b_token: Option<i64>,
    pub final_writer: Option<String>,
    /// `redis-wait`: what the primary answered A's `WAIT 1` (replicas that had its key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas_confirmed: Option<i64>,
    /// etcd with its majority gone: what the client was told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// `redis-min-replicas`: the primary's answer to A's `SET NX` (`NOREPLICAS …`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    pub attempts: Vec<crate::store::Attempt>,
}

impl Scenario {
    fn from_store(
        name: &str,
        backend: &'static str,
        two_holders: Option<bool>,
        rule: Option<Rule>,
        read: ReadBack,
        a: &str,
        b: &str,
    ) -> Result<Scenario> {
        if !check::last_accepted_is_final(&read.attempts, read.final_writer.as_deref()) {
            bail!("the store's record for {name} disagrees with itself");
        }
        let late = check::late_write(&read.attempts, a, b);
        let (a_token, b_token) = (read.last_token_of(a), read.last_token_of(b));
        Ok(Scenario {
            name: name.into(),
            backend,
            two_holders: check::two_holders_given_writes(
                match two_holders {
                    Some(true) => check::Finding::Yes,
                    Some(false) => check::Finding::No,
                    None => check::Finding::Unknown,
                },
                late,
            )
            .as_option(),
            token_reissued: match (a_token, b_token) {
                (Some(a), Some(b)) => Some(b <= a),
                _ => None,
            },
            stale_write: StaleWrite {
                attempted: late.attempted(),
                accepted: late.accepted(),
            },
            failover_ms: None,
            election_ms: None,
            store_rule: rule,
            a_token,
            b_token,
            final_writer: read.final_writer,
            replicas_confirmed: None,
            unavailable: None,
            refused: None,
            attempts: read.attempts,
        })
    }

    /// A row where the lock service granted nothing: no holder, no token, no write.
    fn nothing_granted(name: &str, backend: &'static str) -> Scenario {
        Scenario {
            name: name.into(),
            backend,
            two_holders: Some(false),
            token_reissued: None,
            stale_write: StaleWrite {
                attempted: false,
                accepted: None,
            },
            failover_ms: None,
            election_ms: None,
            store_rule: None,
            a_token: None,
            b_token: None,
            final_writer: None,
            replicas_confirmed: None,
            unavailable: None,
            refused: None,
            attempts: Vec::new(),
        }
    }

    fn meaning(&self) -> String {
        let tokens = match (self.a_token, self.b_token) {
            (Some(a), Some(b)) if b < a => format!("B's token {b} is lower than A's {a}"),
            (Some(a), Some(b)) if b == a => format!("B drew A's token {a} again"),
            (Some(a), Some(b)) => format!("B's token {b} is higher than A's {a}"),
            _ => "no tokens".into(),
        };
        if let Some(answer) = &self.refused {
            return format!(
                "the primary refused A's SET ({answer}): no replica in reach, so no lock \
                 was granted for the failover to lose"
            );
        }
        if let Some(error) = &self.unavailable {
            return format!(
                "no majority: etcd granted nothing ({error}) — unavailable, not unsafe"
            );
        }
        let a_wrote = self.attempts.iter().any(|a| a.writer.starts_with("A:"));
        if let Some(confirmed) = self.replicas_confirmed {
            let holders = if self.two_holders == Some(true) {
                "two holders all the same"
            } else {
                "one holder"
            };
            let a = if a_wrote {
                "A wrote anyway"
            } else {
                "A wrote nothing"
            };
            let b = match self.final_writer.as_deref() {
                Some(writer) => format!("{writer}'s result stands"),
                None => "the store holds nothing".into(),
            };
            return format!("{holders}; A's WAIT 1 answered {confirmed}, {a}; {b}");
        }
        let store = match (self.stale_write.attempted, self.stale_write.accepted) {
            (true, Some(true)) => "A's late write ACCEPTED, B's result lost",
            (true, _) => "A's late write rejected",
            _ => "no late write",
        };
        let holders = match self.two_holders {
            Some(true) => "two holders",
            Some(false) => "one holder at a time",
            None => "holders unknown",
        };
        format!("{holders}; {tokens}; {store}")
    }
}

/// `lockslab failover`.
pub fn run(args: &FailoverArgs) -> Result<()> {
    if args.sentinel_url.is_some() || args.etcd_endpoints.is_some() {
        crate::bail_usage!(
            "--sentinel-url and --etcd-endpoints are not supported yet: every scenario of this lab \
             SIGKILLs a server (the Redis primary, etcd members), which needs the clusters lockslab \
             starts on this machine; run `lockslab failover` without them"
        );
    }
    let style = Style::detect(args.output.json);
    let servers = servers::provide(&args.servers, &[Backend::Postgres])?;
    let postgres = servers.url(Backend::Postgres).to_string();
    let run_id = new_run_id();
    let mut store = Store::connect(&postgres)?;
    store.prepare()?;

    let intro = crate::output::Timeline::new(style);
    intro.say(&crate::output::run_heading("failover", &run_id));
    for line in servers.describe() {
        intro.say(&format!("  {}", line.dimmed()));
    }
    if args.servers.redis_url.is_some() || args.servers.etcd_url.is_some() {
        intro.say(&format!(
            "  {}",
            "(the Redis and etcd URLs given are not used: this lab kills servers, so it \
             starts clusters of its own)"
                .dimmed()
        ));
    }
    let (mut redis, mut etcd) = cluster::start_both()?;
    intro.say(&format!(
        "  {}",
        format!(
            "Redis    primary :{} replica :{} Sentinels :{} :{} :{} (ready in {})",
            redis.primary.port,
            redis.replica.port,
            redis.sentinels[0].port,
            redis.sentinels[1].port,
            redis.sentinels[2].port,
            human(redis.started_in)
        )
        .dimmed()
    ));
    intro.say(&format!(
        "  {}",
        format!(
            "etcd     {} (ready in {})",
            etcd.members
                .iter()
                .map(|m| format!("{} {}", m.name, m.client_url.trim_start_matches("http://")))
                .collect::<Vec<_>>()
                .join(", "),
            human(etcd.started_in)
        )
        .dimmed()
    ));

    let sequence = format!("lockslab_fence_{run_id}");
    let leftovers = Leftovers::of_run(&run_id)
        .store(&postgres)
        .sql(&postgres, &format!("DROP SEQUENCE IF EXISTS {sequence}"))
        .removed_at_the_end();
    let started = Instant::now();
    let mut scenarios = Vec::new();
    let result = (|| -> Result<()> {
        store_sequence(&postgres, &sequence)?;
        let mut stage = Stage::on_clock(style, started);
        stage.timeline.set_lane_width(16);
        let play = Play {
            run_id: &run_id,
            postgres: &postgres,
            sequence: &sequence,
            ttl: args.ttl,
        };
        stage.checkpoint(&super::step::failover::REDIS);
        scenarios.extend(play.redis_failover(&mut stage, &mut redis, &mut store)?);
        redis.stop();
        stage.checkpoint(&super::step::failover::ETCD);
        scenarios.extend(play.etcd_leader_killed(&mut stage, &mut etcd, &mut store)?);
        Ok(())
    })()
    .map_err(connect::explain);
    leftovers.now(&result);
    result?;
    super::step::checkpoint(&super::step::failover::VERDICT);

    if style.json {
        json_line(&json!({
            "kind": "verdict",
            "json_version": super::JSON_VERSION,
            "lab": "failover",
            "run_id": run_id,
            "ttl_ms": args.ttl.as_millis() as u64,
            "scenarios": scenarios,
        }));
    } else {
        print_verdict(&scenarios);
    }
    Ok(())
}

/// The durable token source: a sequence in the store's own database.
fn store_sequence(postgres: &str, name: &str) -> Result<()> {
    connect::postgres(postgres)?
        .batch_execute(&format!("CREATE SEQUENCE IF NOT EXISTS {name}"))
        .context("creating the token sequence in the store's database")
}

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
                writes: vec![("redis-unfenced".into(), Rule::HigherOrSameHolder)],
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
                writes: vec![("redis-incr-lost".into(), Rule::HigherOrSameHolder)],
                a_waits: false,
            },
            Pair {
                label: "durable",
                token: TokenSource::PostgresSequence {
                    name: self.sequence.to_string(),
                },
                writes: vec![("durable-token".into(), Rule::HigherOrSameHolder)],
                a_waits: false,
            },
            Pair {
                label: "wait",
                token: TokenSource::None,
                writes: vec![("redis-wait".into(), Rule::HigherOrSameHolder)],
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

    /// Scenarios 1, 2 and 4: one failover, five pairs of clients.
    fn redis_failover(
        &self,
        stage: &mut Stage,
        redis: &mut SentinelCluster,
        store: &mut Store,
    ) -> Result<Vec<Scenario>> {
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            "── Redis: primary + replica + 3 Sentinels ──".red().bold()
        ));
        stage.tag("scenario", "redis-failover");
        let (primary, replica) = (redis.primary.port, redis.replica.port);
        let pairs = self.pairs();
        stage.record(
            Event::new(
                "lab",
                Kind::Run,
                format!(
                    "run {}: {} locks on the primary :{primary}, replicated to :{replica}",
                    self.run_id,
                    pairs.len()
                ),
            )
            .with("run_id", self.run_id)
            .with("primary", primary)
            .with("replica", replica),
        );

        // The replica falls behind: frozen, and its link closed from the primary's side.
        // (Frozen alone is not enough: its kernel would still take the stream into the
        // socket buffer, and the replica would read A's key from there once thawed.)
        SentinelCluster::freeze(&redis.replica)?;
        let mut on_primary = cluster::ask(primary).context("asking the primary")?;
        let cut: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .query(&mut on_primary)
            .context("CLIENT KILL TYPE replica")?;
        stage.record(
            Event::new(
                "lab",
                Kind::Frozen,
                format!(
                    "freezes the replica (SIGSTOP) and cuts its link ({cut} closed): \
                     from now on writes live on the primary only"
                ),
            )
            .with("pid", redis.replica.pid.unwrap_or(0))
            .with("links_closed", cut),
        );

        // Earlier holders of the `incr-lost` lock: their increments never reach the replica.
        let lost_counter = match &pairs[2].token {
            TokenSource::RedisCounter { key } => key.clone(),
            _ => unreachable!("pair 2 counts in Redis"),
        };
        let mut earlier = RedisLock::new(
            connect::redis(&redis.primary.url())?,
            &self.key("incr-lost"),
            self.ttl,
        );
        for _ in 0..2 {
            let held = earlier
                .try_acquire_fenced(&lost_counter)?
                .context("an earlier holder could not take the free lock")?;
            earlier.release(&held)?;
        }
        stage.record(Event::new(
            "lab",
            Kind::Run,
            "plays two earlier holders of the incr-lost lock (tokens 1, 2) on the primary",
        ));

        let mut a_workers = Vec::new();
        for pair in &pairs {
            a_workers
                .push(stage.spawn(&format!("A:{}", pair.label), &self.client("A", pair, redis))?);
        }
        let mut a_owners = Vec::new();
        for pair in &pairs {
            let name = format!("A:{}", pair.label);
            let got = stage.wait_for(
                Duration::from_secs(10),
                &format!("{name} to take the lock"),
                |e| e.is(&name, Kind::Acquired),
            )?;
            a_owners.push(got.get_str("owner").unwrap_or_default().to_string());
        }
        // A:wait's `WAIT 1` runs out against the frozen replica before the primary dies.
        let mut confirmed = Vec::new();
        for pair in &pairs {
            let name = format!("A:{}", pair.label);
            confirmed.push(if pair.a_waits {
                let answer = stage.wait_for(
                    Duration::from_secs(10),
                    &format!("{name}'s WAIT to answer"),
                    |e| e.is(&name, Kind::Lost) || e.is(&name, Kind::Kept),
                )?;
                answer.get_i64("replicas_confirmed")
            } else {
                None
            });
        }

        // The primary's own answers just before the crash: A's keys, and no replica.
        let mut a_leases = Vec::new();
        for (pair, owner) in pairs.iter().zip(&a_owners) {
            let (found, pttl) =
                crate::lock::redis::owner_and_pttl(&mut on_primary, &self.key(pair.label))
                    .context("reading A's key on the primary")?;
            if found.as_deref() != Some(owner.as_str()) {
                bail!("the primary does not hold A:{}'s key", pair.label);
            }
            a_leases.push((Instant::now(), Duration::from_millis(pttl.max(0) as u64)));
        }
        let replicas = cluster::replication_info(primary)
            .and_then(|info| info_field(&info, "connected_slaves"))
            .unwrap_or_default();
        stage.record(
            Event::new(
                "redis",
                Kind::HolderNow,
                format!(
                    "primary :{primary} holds all {} of A's keys (PTTL ~{}); connected replicas: {replicas}",
                    pairs.len(),
                    human(a_leases[0].1)
                ),
            )
            .with("connected_replicas", replicas.clone()),
        );

        let min_replicas = self.min_replicas_refusal(stage, &mut on_primary)?;

        let killed_at = Instant::now();
        SentinelCluster::kill(&mut redis.primary);
        SentinelCluster::thaw(&redis.replica)?;
        stage.record(
            Event::new(
                "lab",
                Kind::Killed,
                format!("SIGKILLs the primary :{primary}; thaws the replica :{replica}"),
            )
            .with("port", primary),
        );

        let failover = self.watch_failover(stage, redis, killed_at)?;
        let mut on_new_primary = cluster::ask(replica).context("asking the new primary")?;
        let mut forgot = Vec::new();
        for pair in &pairs {
            let exists: i64 = redis::cmd("EXISTS")
                .arg(self.key(pair.label))
                .query(&mut on_new_primary)?;
            forgot.push(exists == 0);
        }
        let counter_now: Option<i64> = redis::cmd("GET")
            .arg(&lost_counter)
            .query(&mut on_new_primary)?;
        stage.record(Event::new(
            "redis",
            Kind::Expired,
            format!(
                "new primary :{replica} has {} of A's {} keys; incr-lost counter: {}",
                forgot.iter().filter(|f| !**f).count(),
                pairs.len(),
                counter_now.map_or("none".into(), |c| c.to_string())
            ),
        ));

        let mut b_workers = Vec::new();
        for pair in &pairs {
            b_workers
                .push(stage.spawn(&format!("B:{}", pair.label), &self.client("B", pair, redis))?);
        }
        let mut b_granted = Vec::new();
        for pair in &pairs {
            let name = format!("B:{}", pair.label);
            let got = stage.wait_for(
                Duration::from_secs(10),
                &format!("{name} to take the lock"),
                |e| e.is(&name, Kind::Acquired),
            )?;
            let owner = got.get_str("owner").unwrap_or_default().to_string();
            let found: Option<String> = redis::cmd("GET")
                .arg(self.key(pair.label))
                .query(&mut on_new_primary)?;
            b_granted.push((Instant::now(), found == Some(owner)));
        }

        for b in &mut b_workers {
            b.tell("write")?;
        }
        for pair in &pairs {
            let name = format!("B:{}", pair.label);
            for _ in &pair.writes {
                stage.wait_for(Duration::from_secs(10), &format!("{name} to write"), |e| {
                    e.is(&name, Kind::Wrote)
                })?;
            }
        }
        // A never paused and never heard that its lock is gone: it writes now.
        for a in &mut a_workers {
            a.tell("write")?;
        }
        // Except A:wait, if its WAIT came back short: it writes nothing.
        for (pair, confirmed) in pairs.iter().zip(&confirmed) {
            let name = format!("A:{}", pair.label);
            let wanted = match confirmed {
                Some(n) if *n < 1 => 0,
                _ => pair.writes.len(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while stage
                .log
                .iter()
                .filter(|e| e.is(&name, Kind::Wrote))
                .count()
                < wanted
            {
                if Instant::now() > deadline {
                    bail!("timed out waiting for {name} to write");
                }
                stage.next(Duration::from_millis(50));
            }
        }
        for worker in a_workers.iter_mut().chain(b_workers.iter_mut()) {
            worker.tell("finish")?;
        }
        for worker in a_workers.iter_mut().chain(b_workers.iter_mut()) {
            let name = worker.name.clone();
            stage.wait_for(Duration::from_secs(10), &format!("{name} to let go"), |e| {
                e.is(&name, Kind::Released)
            })?;
            worker.finish(Duration::from_secs(10));
        }
        stage.drain();

        let mut scenarios = Vec::new();
        for (index, pair) in pairs.iter().enumerate() {
            // Two holders, per the servers: the old primary granted A a lease that was still
            // running when the new primary granted B (whose key it answered with).
            let (read_at, pttl) = a_leases[index];
            let (granted_at, b_key_seen) = b_granted[index];
            let two = forgot[index] && b_key_seen && granted_at < read_at + pttl;
            for (name, rule) in &pair.writes {
                let read = store.read_back(self.run_id, &self.resource(name))?;
                let mut scenario = Scenario::from_store(
                    name,
                    if pair.label == "durable" {
                        "redis+postgres"
                    } else {
                        "redis"
                    },
                    Some(two),
                    (pair.token != TokenSource::None).then_some(*rule),
                    read,
                    &format!("A:{}", pair.label),
                    &format!("B:{}", pair.label),
                )?;
                scenario.failover_ms = failover.map(|d| d.as_millis() as u64);
                scenario.replicas_confirmed = confirmed[index];
                self.store_line(stage, &scenario);
                scenarios.push(scenario);
            }
        }
        scenarios.push(Scenario {
            failover_ms: failover.map(|d| d.as_millis() as u64),
            refused: Some(min_replicas),
            ..Scenario::nothing_granted("redis-min-replicas", "redis")
        });
        Ok(scenarios)
    }

    /// `min-replicas-to-write 1` on the primary, for one more lock: A's `SET NX` on the same
    /// primary, with the replica gone, is refused (`NOREPLICAS`). The primary counts a
    /// replica as good while its last acknowledgement is at most `min-replicas-max-lag`
    /// seconds old (10 by default); this replica's link is closed, so none counts at once.
    /// The setting goes back to 0 at once, so that the other locks' story is unchanged.
    fn min_replicas_refusal(
        &self,
        stage: &mut Stage,
        on_primary: &mut redis::Connection,
    ) -> Result<String> {
        let set = |connection: &mut redis::Connection, value: &str| {
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("min-replicas-to-write")
                .arg(value)
                .query::<()>(connection)
                .context("CONFIG SET min-replicas-to-write")
        };
        set(on_primary, "1")?;
        let answer: redis::RedisResult<Option<String>> = redis::cmd("SET")
            .arg(self.key("min-replicas"))
            .arg("A")
            .arg("NX")
            .arg("PX")
            .arg(self.ttl.as_millis() as u64)
            .query(on_primary);
        set(on_primary, "0")?;
        let refusal = match answer {
            Err(err) if err.code() == Some("NOREPLICAS") => {
                format!("NOREPLICAS {}", err.detail().unwrap_or_default())
            }
            Err(err) => return Err(err).context("A:min-replicas's SET NX"),
            Ok(_) => {
                bail!("the primary granted a lock with min-replicas-to-write 1 and no replica")
            }
        };
        stage.record(
            Event::new(
                "A:min-replicas",
                Kind::GaveUp,
                format!(
                    "with min-replicas-to-write 1, SET NX PX on the primary answers: {refusal}"
                ),
            )
            .with("why", refusal.clone()),
        );
        Ok(refusal)
    }

    /// Watches until the replica answers `ROLE` with master: the failover time. Records
    /// when the Sentinels first name it too.
    fn watch_failover(
        &self,
        stage: &mut Stage,
        redis: &SentinelCluster,
        killed_at: Instant,
    ) -> Result<Option<Duration>> {
        let replica = redis.replica.clone();
        let sentinel = redis.sentinels[0].port;
        let deadline = killed_at + Duration::from_secs(20);
        let mut sentinel_switched = false;
        let mut promoted = None;
        while Instant::now() < deadline {
            if !sentinel_switched
                && cluster::master_addr_from(sentinel, MASTER_NAME).as_deref()
                    == Some(replica.addr().as_str())
            {
                sentinel_switched = true;
                stage.record(Event::new(
                    "sentinel",
                    Kind::HolderNow,
                    format!(
                        "names {} as the primary, {} after the kill",
                        replica.addr(),
                        human(killed_at.elapsed())
                    ),
                ));
            }
            if promoted.is_none() && cluster::role_of(replica.port).as_deref() == Some("master") {
                let took = killed_at.elapsed();
                stage.record(
                    Event::new(
                        "redis",
                        Kind::HolderNow,
                        format!(
                            ":{} answers ROLE: master — failover took {}",
                            replica.port,
                            human(took)
                        ),
                    )
                    .with("failover_ms", took.as_millis() as u64),
                );
                promoted = Some(took);
            }
            // B finds the primary the way clients do, through Sentinel: wait for both.
            if promoted.is_some() && sentinel_switched {
                return Ok(promoted);
            }
            stage.next(Duration::from_millis(10));
        }
        bail!("Sentinel did not promote the replica within 20s of the primary's death")
    }

    fn store_line(&self, stage: &mut Stage, scenario: &Scenario) {
        let holds = scenario.final_writer.as_deref().unwrap_or("nobody");
        let kind = match scenario.stale_write.accepted {
            Some(true) => Kind::StaleWriteAccepted,
            Some(false) => Kind::StaleWriteRejected,
            None => return,
        };
        stage.record(
            Event::new(
                "store",
                kind,
                format!(
                    "{}: A's write decided after B's: {}; holds {holds}'s result",
                    scenario.name,
                    if kind == Kind::StaleWriteAccepted {
                        "taken"
                    } else {
                        "refused"
                    }
                ),
            )
            .with("resource", scenario.name.clone())
            .with("final_writer", holds),
        );
    }

    /// Scenario 3: the leader dies while A holds the lock; then the majority goes.
    fn etcd_leader_killed(
        &self,
        stage: &mut Stage,
        etcd: &mut EtcdCluster,
        store: &mut Store,
    ) -> Result<Vec<Scenario>> {
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            "── etcd: three members, Raft ──".green().bold()
        ));
        stage.tag("scenario", "etcd");
        let (leader, status) = etcd.leader().context("the etcd cluster names no leader")?;
        let followers: Vec<usize> = (0..etcd.members.len()).filter(|i| *i != leader).collect();
        let (near, far) = (followers[0], followers[1]);
        let lock_name = format!("lockslab:{}:failover:etcd", self.run_id);
        let resource = self.resource("etcd-leader-killed");
        stage.record(
            Event::new(
                "etcd",
                Kind::HolderNow,
                format!(
                    "leader is {} (term {}); A talks to {}, B to {}",
                    etcd.members[leader].name,
                    status.raft_term,
                    etcd.members[near].name,
                    etcd.members[far].name
                ),
            )
            .with("raft_term", status.raft_term),
        );
        let holder = |name: &str, member: usize, before, wait_ms| HolderScript {
            name: name.into(),
            lock: LockSpec::Etcd {
                url: etcd.members[member].client_url.clone(),
                name: lock_name.clone(),
                lease_ttl_ms: ETCD_LEASE.as_millis() as u64,
            },
            store_url: self.postgres.into(),
            run_id: self.run_id.into(),
            resource: resource.clone(),
            wait_ms,
            before_write: before,
            after_write: AfterWrite::Release,
            fence_rule: Default::default(),
            token_sequence: None,
        };
        let mut a = stage.spawn(
            "A:etcd",
            &WorkerSpec::Holder(holder("A:etcd", near, BeforeWrite::WorkUntilTold, 10_000)),
        )?;
        let a_key = stage
            .wait_for(Duration::from_secs(10), "A:etcd to take the lock", |e| {
                e.is("A:etcd", Kind::Acquired)
            })?
            .get_str("owner")
            .unwrap_or_default()
            .to_string();
        let mut b = stage.spawn(
            "B:etcd",
            &WorkerSpec::Holder(holder("B:etcd", far, BeforeWrite::Nothing, 30_000)),
        )?;
        stage.wait_for(Duration::from_secs(10), "B:etcd to ask", |e| {
            e.is("B:etcd", Kind::Waiting)
        })?;
        // B's lock call has put its key in the queue behind A's: only now is B waiting.
        let queued_by = Instant::now() + Duration::from_secs(10);
        while queued_keys(&etcd.members[near].client_url, &lock_name)? < 2 {
            if Instant::now() > queued_by {
                bail!("B:etcd's key did not appear in the lock's queue within 10s");
            }
            stage.next(Duration::from_millis(10));
        }
        let b_queued_at = queue_of(&etcd.members[near].client_url, &lock_name)?
            .get(1)
            .map(|(_, revision)| *revision)
            .context("B:etcd's key is not in the queue")?;
        stage.record(
            Event::new(
                "etcd",
                Kind::HolderNow,
                format!(
                    "two keys under the lock: A's holds it, B's (revision {b_queued_at}) waits behind it"
                ),
            )
            .with("b_queued_revision", b_queued_at),
        );

        let killed_at = Instant::now();
        etcd.kill(leader)?;
        stage.record(Event::new(
            "lab",
            Kind::Killed,
            format!("SIGKILLs the leader {}", etcd.members[leader].name),
        ));
        let old_leader = etcd.members[leader].id;
        // etcd's `status` reports the term of the last entry the member has *applied*, not
        // the term Raft is in: right after an election it still shows the old term. A new
        // leader's first act is to commit an empty entry of its own term, so wait until a
        // member has applied that (the term reported rises) before naming the term.
        let mut named = None;
        let mut election = None;
        while killed_at.elapsed() < Duration::from_secs(15) {
            if let Ok(now) = cluster::etcd_status(&etcd.members[near].client_url)
                && now.leader != 0
                && now.leader != old_leader
            {
                let took = *named.get_or_insert_with(|| killed_at.elapsed());
                if now.raft_term > status.raft_term {
                    let name = etcd
                        .members
                        .iter()
                        .find(|m| m.id == now.leader)
                        .map_or("?".to_string(), |m| m.name.clone());
                    stage.record(
                        Event::new(
                            "etcd",
                            Kind::HolderNow,
                            format!(
                                "{name} is the new leader, {} after the kill; term {} (was {})",
                                human(took),
                                now.raft_term,
                                status.raft_term
                            ),
                        )
                        .with("election_ms", took.as_millis() as u64)
                        .with("raft_term", now.raft_term)
                        .with("old_raft_term", status.raft_term),
                    );
                    election = Some(took);
                    break;
                }
            }
            stage.next(Duration::from_millis(10));
        }
        let election = election.context("etcd elected no new leader within 15s")?;

        // While there is no leader, no lease expires: only the leader expires leases, and a
        // member that stops being leader pushes every lease's expiry out to "never". The new
        // leader then gives every lease its full TTL again, plus an election timeout, counted
        // from its election. So a lease that merely survived the election proves nothing:
        // A's key is looked at only once that extension has run out (the new leader was
        // elected before we saw it, so its extension ends before this), and it can then be
        // there only if A's keepalives reached the new leader.
        let extension = ETCD_LEASE + Duration::from_millis(cluster::ETCD_ELECTION_MS);
        let look_at = killed_at + election + extension + Duration::from_millis(500);
        stage.run_until(look_at, |_| Ok(()))?;
        let mut watch = EtcdLock::connect(&etcd.members[near].client_url, &lock_name)?;
        let holder_now = watch.holder_of(&lock_name)?.map(|(key, _)| key);
        let a_survived = holder_now.as_deref() == Some(a_key.as_str());
        stage.record(
            Event::new(
                "etcd",
                Kind::HolderNow,
                if a_survived {
                    format!(
                        "A's key still holds the lock, {} after the election: past the {} \
                         (TTL + election timeout) the new leader gave every lease, so A's \
                         keepalives reached it; B still waits",
                        human(look_at - (killed_at + election)),
                        human(extension)
                    )
                } else {
                    format!("the lock's holder is now {holder_now:?}")
                },
            )
            .with("a_key_held", a_survived)
            .with(
                "after_election_ms",
                (look_at - (killed_at + election)).as_millis() as u64,
            ),
        );
        a.tell("finish")?;
        for (worker, what) in [("A:etcd", Kind::Released), ("B:etcd", Kind::Released)] {
            stage.wait_for(
                Duration::from_secs(15),
                &format!("{worker} to let go"),
                |e| e.is(worker, what),
            )?;
        }
        a.finish(Duration::from_secs(5));
        b.finish(Duration::from_secs(5));
        stage.drain();
        let a_kept = stage
            .saw("A:etcd", Kind::Released)
            .and_then(release_of)
            .is_some_and(|r| r.deleted());
        let b_got = stage.saw("B:etcd", Kind::Acquired).is_some();
        if let Some(b_token) = stage
            .saw("B:etcd", Kind::Acquired)
            .and_then(|e| e.get_i64("token"))
        {
            stage.record(
                Event::new(
                    "etcd",
                    Kind::HolderNow,
                    if b_token == b_queued_at {
                        format!(
                            "B held its place in the queue: its key kept revision {b_queued_at}"
                        )
                    } else {
                        format!(
                            "B lost its place in the queue: the leader change dropped its lock \
                             call, etcd deleted its key (revision {b_queued_at}) and B queued a \
                             new one (revision {b_token})"
                        )
                    },
                )
                .with("b_queued_revision", b_queued_at)
                .with("b_token", b_token)
                .with("b_kept_place", b_token == b_queued_at),
            );
        }
        let read = store.read_back(self.run_id, &resource)?;
        let mut leader_killed = Scenario::from_store(
            "etcd-leader-killed",
            "etcd",
            check::two_holders_queued(a_kept, b_got).as_option(),
            Some(Rule::HigherOrSameHolder),
            read,
            "A:etcd",
            "B:etcd",
        )?;
        leader_killed.election_ms = Some(election.as_millis() as u64);
        self.store_line(stage, &leader_killed);

        // Now the majority: two of three members dead, whoever is leader.
        etcd.kill(near)?;
        stage.record(Event::new(
            "lab",
            Kind::Killed,
            format!(
                "SIGKILLs {} too: one member of three is left",
                etcd.members[near].name
            ),
        ));
        let Some(refusal) = try_to_lock_without_majority(&etcd.members[far].client_url)? else {
            bail!("etcd granted a lease with one member of three: that cannot be");
        };
        stage.record(
            Event::new(
                "etcd",
                Kind::GaveUp,
                format!("C asks {} for a lease: {refusal}", etcd.members[far].name),
            )
            .with("error", refusal.clone()),
        );
        let majority_lost = Scenario {
            unavailable: Some(refusal),
            ..Scenario::nothing_granted("etcd-majority-lost", "etcd")
        };
        Ok(vec![leader_killed, majority_lost])
    }
}

/// The keys under an etcd lock's prefix, oldest first, with their create revisions.
fn queue_of(url: &str, lock: &str) -> Result<Vec<(String, i64)>> {
    connect::etcd_runtime()?.block_on(async {
        let mut client = connect::etcd(url).await?;
        let options = etcd_client::GetOptions::new().with_prefix().with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        );
        let found = client.get(format!("{lock}/"), Some(options)).await?;
        Ok(found
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.create_revision(),
                )
            })
            .collect())
    })
}

/// How many keys wait under an etcd lock's prefix (the holder's and the waiters').
fn queued_keys(url: &str, lock: &str) -> Result<i64> {
    connect::etcd_runtime()?.block_on(async {
        let mut client = connect::etcd(url).await?;
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        let found = client.get(format!("{lock}/"), Some(options)).await?;
        Ok(found.count())
    })
}

/// Client C's attempt on a member that lost its majority: a lease grant, bounded at 3s.
/// Returns what etcd (or the client's timeout) answered, or None if it was granted.
fn try_to_lock_without_majority(url: &str) -> Result<Option<String>> {
    let runtime = connect::etcd_runtime()?;
    runtime.block_on(async {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(1))
            .with_timeout(Duration::from_secs(3));
        let mut client = etcd_client::Client::connect([url], Some(options)).await?;
        Ok(match client.lease_grant(5, None).await {
            Ok(_) => None,
            Err(err) if err.to_string().contains("Timeout expired") => {
                Some("no answer within 3s: the member cannot reach a majority".to_string())
            }
            Err(etcd_client::Error::GRpcStatus(status)) => Some(status.message().to_string()),
            Err(err) => Some(err.to_string()),
        })
    })
}

fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .map(|value| value.trim().to_string())
}

fn print_verdict(scenarios: &[Scenario]) {
    let yes_no = |v: Option<bool>| match v {
        Some(true) => "YES".red().bold().to_string(),
        Some(false) => "no".green().to_string(),
        None => "-".to_string(),
    };
    let rows: Vec<Vec<String>> = scenarios
        .iter()
        .map(|s| {
            let a_wrote = s.attempts.iter().any(|a| a.writer.starts_with("A:"));
            let stale = match (s.stale_write.attempted, s.stale_write.accepted) {
                (true, Some(true)) => "ACCEPTED".red().bold().to_string(),
                (true, _) => "rejected".green().to_string(),
                _ if (s.replicas_confirmed.is_some() || s.refused.is_some()) && !a_wrote => {
                    "not made".green().to_string()
                }
                _ => "none".to_string(),
            };
            let tokens = match (s.a_token, s.b_token) {
                (Some(a), Some(b)) if b == a => format!("{a}→{b} {}", "again".red().bold()),
                (Some(a), Some(b)) if b < a => format!("{a}→{b} {}", "lower".red().bold()),
                (Some(a), Some(b)) => format!("{a}→{b}"),
                _ => "-".into(),
            };
            let time = s
                .failover_ms
                .map(|ms| format!("{} failover", human(Duration::from_millis(ms))))
                .or(s
                    .election_ms
                    .map(|ms| format!("{} election", human(Duration::from_millis(ms)))))
                .unwrap_or_else(|| "unavailable".into());
            vec![s.name.clone(), yes_no(s.two_holders), tokens, stale, time]
        })
        .collect();
    crate::outln!();
    crate::prose!("{}", "Verdict".bold());
    crate::prose!(
        "{}",
        table(
            &["scenario", "2 holders", "tokens A→B", "late write", "time"],
            &rows
        )
    );
    crate::outln!();
    for scenario in scenarios {
        crate::prose!(
            "  {} {}",
            format!("{}:", scenario.name).bold(),
            scenario.meaning()
        );
    }
    if scenarios.iter().any(|s| s.replicas_confirmed == Some(0)) {
        crate::outln!();
        for line in [
            "WAIT buys detection: A learned that its lock lived on the primary only",
            "and wrote nothing. It is not consensus: the primary had granted the",
            "lock anyway (two holders) and WAIT rolls nothing back. An answer of 1",
            "makes the lock's survival more likely, not certain: Sentinel may",
            "promote a replica that never acknowledged and pass over the one that",
            "did. Nor does it order writes: it hands out no token.",
        ] {
            crate::outln!("  {}", line.dimmed());
        }
    }
    if scenarios.iter().any(|s| s.refused.is_some()) {
        crate::outln!();
        for line in [
            "min-replicas-to-write 1 turns the lost lock into a refused one, and",
            "leaves two gaps. A replica counts as good until its last",
            "acknowledgement is min-replicas-max-lag seconds old (10 by default):",
            "a lock granted inside that window can still die with the primary. And",
            "an old primary cut off from the Sentinels, but not from the clients",
            "beside it, keeps granting locks for that long after it loses its",
            "replica, while the Sentinels promote another. Set on every node, it",
            "also refuses writes on a promoted replica that has no replica yet.",
        ] {
            crate::outln!("  {}", line.dimmed());
        }
    }
}
