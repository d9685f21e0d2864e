//! Lab 5's split brain: nobody crashes. The network between the Redis primary and the
//! rest is cut, both sides keep running, and each believes it is in charge.
//!
//! ```text
//!   primary ── client-a          │ cut │     replica, sentinel-1..3, client-b
//!   A holds the lock, renews it, │     │     Sentinels: the primary is down; promote
//!   writes; the old primary      │     │     the replica; B asks them, takes the lock
//!   answers every write          │     │     on the new primary, writes to the store
//!                         ── heal: Sentinel makes the old primary a replica ──
//!   it syncs from the new primary and drops every write A made since the cut
//! ```
//!
//! Each server runs in a host of its own ([`crate::hosts`]): a network namespace, so the
//! partition really drops packets between them, played by the nemesis's one player from
//! the round's [`Schedule`]. A and B are lockslab's own connections, made from inside their
//! hosts (client-a beside the primary, client-b beside the Sentinels; [`super::split_clients`]),
//! so a cut cuts them too; the lab reads every server over its Unix socket, a line no partition touches, and
//! records each answer ([`What::NodeAnswered`]) — the evidence the verdict is decided
//! from ([`super::split_check`]).
//!
//! Two rounds: a plain one, and one whose primary was started with `min-replicas-to-write
//! 1` and `min-replicas-max-lag` [`MAX_LAG`], which bounds how long an isolated primary
//! accepts writes. Both fence the store with a token from a Postgres sequence.

use std::cell::Cell;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use colored::Colorize;
use redis::Value;

use super::split_check::{self, MIN_REPLICAS, OLD_PRIMARY, PLAIN, REPLICA};
use super::split_clients::{
    ClientA, ClientB, Keys, LOCK_TTL, MASTER_NAME, RENEW_EVERY, WRITE_EVERY,
};
use crate::events::facts::{self, Acquired, NodeAnswered, Wrote};
use crate::events::{Event, Kind};
use crate::hosts::{HOSTED_REDIS_PORT, HostedRedis, Hosts, Watch};
use crate::labs::Stage;
use crate::labs::faults::{self, Faults, Until};
use crate::nemesis::schedule::{Anchor, Schedule, Step};
use crate::nemesis::{Fault, Nemesis};
use crate::output::human;
use crate::store::Store;

/// The hosts: the primary and client A on one side, everyone else on the other.
const HOSTS: [&str; 7] = [
    OLD_PRIMARY,
    "client-a",
    REPLICA,
    "sentinel-1",
    "sentinel-2",
    "sentinel-3",
    "client-b",
];
const SENTINELS: [&str; 3] = ["sentinel-1", "sentinel-2", "sentinel-3"];
/// The partition: this side cut off from every other host.
const A_SIDE: &str = "primary,client-a";

/// Sentinel's timers, short so that a round takes seconds: a primary silent for 1s is down
/// for a Sentinel (its default is 30s); two agreeing make it objectively down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
pub const FAILOVER_TIMEOUT: Duration = Duration::from_secs(5);
const QUORUM: usize = 2;

/// The second round's `min-replicas-max-lag`, in seconds.
pub const MAX_LAG: u64 = 2;

/// The one line the split brain ends with where this machine cannot make hosts.
const NEEDS_HOSTS: &str = "the split brain needs network namespaces of lockslab's own \
     (see `lockslab doctor`), and this machine refused them";

/// Fails with [`NEEDS_HOSTS`] and the kernel's reason where hosts cannot be made here.
pub(super) fn can_make_hosts() -> Result<()> {
    match Hosts::unavailable() {
        None => Ok(()),
        Some(why) => bail!("{NEEDS_HOSTS}: {why}"),
    }
}

/// The split brain, both rounds, on hosts made for it.
pub(super) fn play(
    stage: &mut Stage,
    store: &mut Store,
    (run_id, sequence): (&str, &str),
) -> Result<()> {
    let hosts = Hosts::new(&HOSTS).context(NEEDS_HOSTS)?;
    let dir = crate::cluster::RunDir::new()?;
    let private = crate::cluster::private_dir(&dir.path)?;
    store.create_token_sequence(sequence)?;
    for (name, max_lag) in [(PLAIN, None), (MIN_REPLICAS, Some(MAX_LAG))] {
        let round = RoundPlan {
            name,
            max_lag,
            run_id,
            sequence,
            password: crate::seed::os_hex(24),
        };
        round.play(stage, store, &hosts, &private)?;
    }
    store.drop_token_sequence(sequence)?;
    Ok(())
}

/// One round: its name (the `scenario` its events carry), and whether its primary limits
/// writes to when a replica is in reach.
struct RoundPlan<'a> {
    name: &'static str,
    max_lag: Option<u64>,
    run_id: &'a str,
    sequence: &'a str,
    password: String,
}

/// The round's servers, each in its host.
struct Servers {
    primary: HostedRedis,
    replica: HostedRedis,
    sentinels: Vec<HostedRedis>,
}

impl RoundPlan<'_> {
    fn key(&self, what: &str) -> String {
        format!("lockslab:{}:split:{}:{what}", self.run_id, self.name)
    }

    /// The round's faults: the cut once A has made five writes, the heal 1.5s after B's
    /// write to the store (the lab reads both primaries in between).
    fn schedule() -> Schedule {
        let step = |after, at_ms, fault| Step {
            at_ms,
            after: Some(after),
            fault,
            target: A_SIDE.into(),
            duration_ms: None,
        };
        Schedule::new(vec![
            step(Anchor::on("A", Kind::Wrote, 5), 0, Fault::Partition),
            step(Anchor::on("B", Kind::Wrote, 1), 1500, Fault::Heal),
        ])
    }

    fn play(
        &self,
        stage: &mut Stage,
        store: &mut Store,
        hosts: &Hosts,
        dir: &std::path::Path,
    ) -> Result<()> {
        self.heading(stage);
        let servers = self.start(hosts, dir)?;
        stage.record(Event::new(
            "lab",
            facts::RunFacts {
                run_id: Some(self.run_id.into()),
                ..facts::RunFacts::default()
            },
            format!(
                "hosts {}: primary {}, replica {}, Sentinels {} (quorum {QUORUM}, \
                 down-after {}, failover-timeout {}){}",
                HOSTS.len(),
                hosts.addr(OLD_PRIMARY)?,
                hosts.addr(REPLICA)?,
                SENTINELS.len(),
                human(DOWN_AFTER),
                human(FAILOVER_TIMEOUT),
                self.max_lag.map_or(String::new(), |lag| format!(
                    "; the primary: min-replicas-to-write 1, min-replicas-max-lag {lag}"
                )),
            ),
        ));
        let a = self.a_takes_the_lock(stage, store, hosts)?;
        let schedule = RoundPlan::schedule();
        faults::show(stage, &schedule);
        let mut faults = Faults::new(&schedule, stage).on_hosts(hosts);
        let done = Cell::new(false);
        let mut round = Round {
            plan: self,
            hosts,
            servers: &servers,
            store,
            a,
            b: ClientB::default(),
            phase: Phase::Before,
            looked: stage.log.len(),
            done: &done,
            next_look: Instant::now(),
        };
        let mut nemesis = Nemesis::new();
        stage.play_ticking(
            &mut faults,
            &mut nemesis,
            &mut [],
            Until::holds(
                "Sentinel to demote the old primary after the heal",
                Duration::from_secs(90),
                |_, _| done.get(),
            ),
            |stage| round.tick(stage),
        )?;
        let read = round
            .store
            .read_back(self.run_id, &split_check::resource_of(self.name))?;
        stage.record_read_back(&split_check::resource_of(self.name), &read);
        Ok(())
    }

    /// A takes the lock, and its token from the store's sequence.
    fn a_takes_the_lock(
        &self,
        stage: &mut Stage,
        store: &mut Store,
        hosts: &Hosts,
    ) -> Result<ClientA> {
        let keys = Keys {
            lock: self.key("lock"),
            writes: self.key("writes"),
        };
        let mut a = ClientA::take_lock(hosts, &self.password, keys)?;
        a.token = store.next_token(self.sequence)?;
        let (primary, token) = (a.primary, a.token);
        stage.record(Event::new(
            "A",
            Acquired {
                lock: Some(self.key("lock")),
                owner: Some(a.owner.clone()),
                token: Some(token),
                backend: Some("redis".into()),
                primary: Some(primary.to_string()),
                ..Acquired::default()
            },
            format!(
                "Sentinel names {primary} the primary; SET NX PX {} there ✓, token {token} \
                 (Postgres sequence); renews every {}, writes every {}",
                human(LOCK_TTL),
                human(RENEW_EVERY),
                human(WRITE_EVERY)
            ),
        ));
        Ok(a)
    }

    fn heading(&self, stage: &mut Stage) {
        stage.timeline.say("");
        let title = match self.max_lag {
            None => "── Redis split brain: the primary cut off from the Sentinels ──".to_string(),
            Some(lag) => format!(
                "── The same, the primary with min-replicas-to-write 1, min-replicas-max-lag {lag} ──"
            ),
        };
        stage.timeline.say(&format!("{}", title.red().bold()));
        stage.tags().scenario = Some(self.name.into());
    }

    /// The primary, its replica and three Sentinels, each in its host; ready once every
    /// Sentinel knows the replica and the two other Sentinels.
    fn start(&self, hosts: &Hosts, dir: &std::path::Path) -> Result<Servers> {
        let limit = self.max_lag.map_or(String::new(), |lag| {
            format!("min-replicas-to-write 1\nmin-replicas-max-lag {lag}\n")
        });
        let password = &self.password;
        let primary = hosts.start_redis_with(OLD_PRIMARY, dir, password, &limit)?;
        let follow = format!(
            "replicaof {} {HOSTED_REDIS_PORT}\n",
            hosts.addr(OLD_PRIMARY)?
        );
        let replica = hosts.start_redis_with(REPLICA, dir, password, &follow)?;
        let watch = Watch {
            name: MASTER_NAME.into(),
            primary_host: OLD_PRIMARY.into(),
            quorum: QUORUM,
            down_after: DOWN_AFTER,
            failover_timeout: FAILOVER_TIMEOUT,
        };
        let sentinels = (SENTINELS.iter())
            .map(|host| hosts.start_sentinel(host, dir, password, &watch))
            .collect::<Result<Vec<_>>>()?;
        let servers = Servers {
            primary,
            replica,
            sentinels,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !servers.ready() {
            if Instant::now() > deadline {
                bail!(
                    "the hosted Sentinels did not all find the replica and each other within 30s"
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(servers)
    }
}

impl Servers {
    fn ready(&self) -> bool {
        let synced = crate::cluster::replication_info(&self.replica.control_url())
            .is_some_and(|info| info.contains("master_link_status:up"));
        synced
            && self.sentinels.iter().all(|s| {
                let url = s.control_url();
                crate::cluster::sentinel_count(&url, "sentinels") == Some(SENTINELS.len() - 1)
                    && crate::cluster::sentinel_count(&url, "replicas") == Some(1)
            })
    }
}

/// Where the round is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// A works; the cut comes after its fifth write.
    Before,
    /// Cut: B tries for the lock through the Sentinels on its side.
    Cut,
    /// B holds it and wrote; the heal is due.
    Split,
    /// Healed: the lab watches the old primary until Sentinel has made it a replica.
    Healed,
}

/// One round being played: ticked by the stage while the faults play.
struct Round<'r> {
    plan: &'r RoundPlan<'r>,
    hosts: &'r Hosts,
    servers: &'r Servers,
    store: &'r mut Store,
    a: ClientA,
    b: ClientB,
    phase: Phase,
    /// How much of the stage's log the round has looked at for the partition's events.
    looked: usize,
    done: &'r Cell<bool>,
    next_look: Instant,
}

impl Round<'_> {
    fn tick(&mut self, stage: &mut Stage) -> Result<()> {
        if self.done.get() {
            return Ok(());
        }
        let new = &stage.log[self.looked..];
        let cut = new.iter().any(|e| e.kind() == Kind::NetFault);
        let healed = new.iter().any(|e| e.kind() == Kind::NetHealed);
        self.looked = stage.log.len();
        if cut && self.phase == Phase::Before {
            self.phase = Phase::Cut;
        }
        if healed && self.phase == Phase::Split {
            self.phase = Phase::Healed;
        }
        self.a.work(stage);
        match self.phase {
            Phase::Before | Phase::Split => {}
            Phase::Cut => self.b_tries(stage)?,
            Phase::Healed => self.watch_demotion(stage)?,
        }
        Ok(())
    }

    /// B's try; once B holds the lock: its token, its store write, every server's answers
    /// (two primaries, two holders), then A's store write with its own token.
    fn b_tries(&mut self, stage: &mut Stage) -> Result<()> {
        let key_lock = self.plan.key("lock");
        let tried = self
            .b
            .try_lock(self.hosts, &self.plan.password, &key_lock)?;
        let Some((primary, owner)) = tried else {
            return Ok(());
        };
        let token = self.store.next_token(self.plan.sequence)?;
        stage.record(Event::new(
            "B",
            Acquired {
                lock: Some(key_lock),
                owner: Some(owner),
                token: Some(token),
                backend: Some("redis".into()),
                primary: Some(primary.to_string()),
                ..Acquired::default()
            },
            format!(
                "a Sentinel names {primary} the primary, ROLE there: master; SET NX PX ✓, \
                 token {token}"
            ),
        ));
        self.store_write(stage, "B", token);
        self.read_every_server(stage)?;
        self.store_write(stage, "A", self.a.token);
        self.phase = Phase::Split;
        Ok(())
    }

    /// A fenced write to the store, recorded with the store's answer.
    fn store_write(&mut self, stage: &mut Stage, writer: &str, token: i64) {
        let resource = split_check::resource_of(self.plan.name);
        let value = format!("{writer}'s result");
        let outcome = self
            .store
            .write(self.plan.run_id, &resource, writer, &value, Some(token));
        stage.record(Event::new(
            writer,
            Wrote {
                token: Some(token),
                value: Some(value),
                resource: Some(resource),
                ..Wrote::new(outcome)
            },
            format!(
                "{writer} writes to the store with token {token}: {}",
                outcome.as_str()
            ),
        ));
    }

    /// Every server's answers, each recorded as one observation.
    fn read_every_server(&mut self, stage: &mut Stage) -> Result<()> {
        let servers = self.servers;
        for node in [&servers.primary, &servers.replica] {
            let answered = self.read_data_node(node)?;
            let text = self.words_of(&answered);
            stage.record(Event::new(&answered.node.clone(), answered, text));
        }
        for sentinel in &servers.sentinels {
            let answered = read_sentinel(sentinel)?;
            let text = self.words_of(&answered);
            stage.record(Event::new(&answered.node.clone(), answered, text));
        }
        Ok(())
    }

    fn read_data_node(&self, node: &HostedRedis) -> Result<NodeAnswered> {
        let mut control = node.control()?;
        let role: Vec<Value> = redis::cmd("ROLE").query(&mut control)?;
        let info: String = redis::cmd("INFO").arg("replication").query(&mut control)?;
        let (owner, pttl) =
            crate::lock::redis::owner_and_pttl(&mut control, &self.plan.key("lock"))?;
        let writes: Vec<u64> = redis::cmd("LRANGE")
            .arg(self.plan.key("writes"))
            .arg(0)
            .arg(-1)
            .query(&mut control)?;
        let field = |name: &str| super::redis::info_field(&info, name);
        let word = |value: Option<&Value>| match value {
            Some(Value::BulkString(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            Some(Value::Int(n)) => Some(n.to_string()),
            _ => None,
        };
        let role_word = word(role.first());
        let primary = (role_word.as_deref() == Some("slave"))
            .then(|| Some(format!("{}:{}", word(role.get(1))?, word(role.get(2))?)))
            .flatten();
        let lag = field("slave0").and_then(|line| {
            let lag = line.split(',').find_map(|part| part.strip_prefix("lag="))?;
            lag.parse().ok()
        });
        Ok(NodeAnswered {
            node: node.host.clone(),
            role: role_word,
            primary,
            link: field("master_link_status"),
            connected_replicas: field("connected_slaves").and_then(|n| n.parse().ok()),
            replica_lag_s: lag,
            lock_owner: owner,
            lock_pttl_ms: Some(pttl),
            writes_held: Some(writes),
        })
    }

    /// A server's answers in a line: what it is, whom it follows, the lock there, the
    /// writes it holds (how many of A's since the cut).
    fn words_of(&self, answered: &NodeAnswered) -> String {
        let name = |addr: &str| {
            let ip = addr.split(':').next().unwrap_or_default();
            (HOSTS.iter())
                .find(|h| self.hosts.addr(h).is_ok_and(|a| a.to_string() == ip))
                .map_or(addr.to_string(), |h| format!("{addr} ({h})"))
        };
        let role = answered.role.as_deref().unwrap_or("?");
        if role == "sentinel" {
            return format!(
                "SENTINEL get-master-addr-by-name: {}",
                answered.primary.as_deref().map_or("none".into(), name)
            );
        }
        let mut words = format!("ROLE {role}");
        if let Some(primary) = &answered.primary {
            words += &format!(
                " of {}, link {}",
                name(primary),
                answered.link.as_deref().unwrap_or("?")
            );
        }
        if let Some(n) = answered.connected_replicas {
            words += &format!(", {n} replica(s) connected");
            if let Some(lag) = answered.replica_lag_s {
                words += &format!(" (last ack {lag}s ago)");
            }
        }
        let holder = |owner: &str| owner.split('-').next().unwrap_or(owner).to_string();
        words += &match (&answered.lock_owner, answered.lock_pttl_ms) {
            (Some(owner), Some(pttl)) => format!("; lock: {}'s, PTTL {pttl}ms", holder(owner)),
            _ => "; lock: no key".into(),
        };
        if let Some(held) = &answered.writes_held {
            words += &format!("; holds {} of A's writes", held.len());
        }
        words
    }

    /// After the heal: the old primary's role, every 250ms, until it is a replica in sync;
    /// then every server's answers once more, and the round is over.
    fn watch_demotion(&mut self, stage: &mut Stage) -> Result<()> {
        if Instant::now() < self.next_look {
            return Ok(());
        }
        self.next_look = Instant::now() + Duration::from_millis(250);
        let info = crate::cluster::replication_info(&self.servers.primary.control_url())
            .unwrap_or_default();
        if info.contains("role:slave") && info.contains("master_link_status:up") {
            self.read_every_server(stage)?;
            self.done.set(true);
        }
        Ok(())
    }
}

/// A Sentinel's answers: its role and the primary it names.
fn read_sentinel(sentinel: &HostedRedis) -> Result<NodeAnswered> {
    let mut control = sentinel.control()?;
    let named: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(MASTER_NAME)
        .query(&mut control)?;
    Ok(NodeAnswered {
        node: sentinel.host.clone(),
        role: Some("sentinel".into()),
        primary: named.map(|(ip, port)| format!("{ip}:{port}")),
        ..NodeAnswered::default()
    })
}

/// The verdict's rows, from the stage's history.
pub(super) fn rows(stage: &Stage) -> Vec<split_check::SplitRow> {
    split_check::rows(&stage.log)
}
