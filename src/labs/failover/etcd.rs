//! Lab 5's etcd part (scenario 3): the leader dies while A holds the lock and B waits in
//! the queue; then a second member dies and the last one, with no majority, grants nothing.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use colored::Colorize;

use super::verdict::{Scenario, store_line};
use super::{ETCD_LEASE, Play};
use crate::check;
use crate::check::failover::{self as checks, Election};
use crate::cluster::{self, EtcdCluster};
use crate::connect;
use crate::events::facts::{GaveUp, HolderNow};
use crate::events::{Event, Kind};
use crate::labs::faults::Hand;
use crate::labs::{Stage, WorkerHandle};
use crate::lock::etcd::EtcdLock;
use crate::nemesis::Fault;
use crate::output::human;
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec, release_of};
use crate::worker::sentinel_client::Rule;

/// The etcd part's members, by their place in the cluster: the leader it kills first, the
/// follower A talks to (killed second), the follower B talks to (left alone after that).
struct Members {
    leader: usize,
    near: usize,
    far: usize,
}

impl Play<'_> {
    /// Scenario 3: the leader dies while A holds the lock; then the majority goes. The
    /// kills are played by hand through the nemesis's player (`hand`), not as a schedule
    /// written up front: the victim is whichever member leads at that moment, as the
    /// cluster reports it, and B's queued key is read first.
    pub(super) fn etcd_leader_killed(
        &self,
        stage: &mut Stage,
        hand: &mut Hand,
        etcd: &mut EtcdCluster,
        store: &mut Store,
    ) -> Result<Vec<Scenario>> {
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            "── etcd: three members, Raft ──".green().bold()
        ));
        stage.tags().scenario = Some("etcd".into());
        let (leader, status) = etcd.leader().context("the etcd cluster names no leader")?;
        let followers: Vec<usize> = (0..etcd.members.len()).filter(|i| *i != leader).collect();
        let at = Members {
            leader,
            near: followers[0],
            far: followers[1],
        };
        stage.record(Event::new(
            "etcd",
            HolderNow {
                raft_term: Some(status.raft_term),
                ..HolderNow::default()
            },
            format!(
                "leader is {} (term {}); A talks to {}, B to {}",
                etcd.members[leader].name,
                status.raft_term,
                etcd.members[at.near].name,
                etcd.members[at.far].name
            ),
        ));
        let resource = self.resource("etcd-leader-killed");
        let (mut a, mut b, a_key, b_queued_at) =
            self.a_holds_b_queues(stage, etcd, &at, &resource)?;

        let killed_at = Instant::now();
        let words = format!("SIGKILLs the leader {}", etcd.members[leader].name);
        hand.play(stage, &mut etcd.members[leader], Fault::Kill, words)?;
        let election = watch_election(stage, etcd, &at, &status, killed_at)?;
        self.a_lease_after_election(
            stage,
            &etcd.members[at.near].url(),
            &a_key,
            killed_at + election,
        )?;
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
        let mut leader_killed =
            judge_leader_killed(stage, store, (self.run_id, &resource), b_queued_at)?;
        leader_killed.election_ms = Some(election.as_millis() as u64);
        if let Some(line) = store_line(&leader_killed) {
            stage.conclude(line);
        }
        let majority_lost = majority_lost(stage, hand, etcd, &at)?;
        Ok(vec![leader_killed, majority_lost])
    }

    /// The etcd lock's name in this run.
    fn etcd_lock(&self) -> String {
        format!("lockslab:{}:failover:etcd", self.run_id)
    }

    /// A takes the lock (through the near follower), then B asks (through the far one)
    /// and its key queues behind A's. Returns both workers, A's key, and the revision B's
    /// key was queued at.
    fn a_holds_b_queues(
        &self,
        stage: &mut Stage,
        etcd: &EtcdCluster,
        at: &Members,
        resource: &str,
    ) -> Result<(WorkerHandle, WorkerHandle, String, i64)> {
        let lock_name = self.etcd_lock();
        let holder = |name: &str, member: usize, before, wait_ms| HolderScript {
            name: name.into(),
            lock: LockSpec::Etcd {
                url: etcd.members[member].url(),
                name: lock_name.clone(),
                lease_ttl_ms: ETCD_LEASE.as_millis() as u64,
                token: true,
            },
            store_url: self.postgres.into(),
            run_id: self.run_id.into(),
            resource: resource.into(),
            wait_ms,
            before_write: before,
            after_write: AfterWrite::Release,
            fence_rule: Default::default(),
            token_sequence: None,
        };
        let a = stage.spawn(
            "A:etcd",
            &WorkerSpec::Holder(holder(
                "A:etcd",
                at.near,
                BeforeWrite::WorkUntilTold,
                10_000,
            )),
        )?;
        let a_key = stage
            .wait_for(Duration::from_secs(10), "A:etcd to take the lock", |e| {
                e.is("A:etcd", Kind::Acquired)
            })?
            .owner()
            .unwrap_or_default()
            .to_string();
        let b = stage.spawn(
            "B:etcd",
            &WorkerSpec::Holder(holder("B:etcd", at.far, BeforeWrite::Nothing, 30_000)),
        )?;
        stage.wait_for(Duration::from_secs(10), "B:etcd to ask", |e| {
            e.is("B:etcd", Kind::Waiting)
        })?;
        // B's lock call has put its key in the queue behind A's: only now is B waiting.
        let url = etcd.members[at.near].url();
        let queued_by = Instant::now() + Duration::from_secs(10);
        while queued_keys(&url, &lock_name)? < 2 {
            if Instant::now() > queued_by {
                bail!("B:etcd's key did not appear in the lock's queue within 10s");
            }
            stage.next(Duration::from_millis(10));
        }
        let b_queued_at = queue_of(&url, &lock_name)?
            .get(1)
            .map(|(_, revision)| *revision)
            .context("B:etcd's key is not in the queue")?;
        stage.record(
            Event::new("etcd", HolderNow { b_queued_revision: Some(b_queued_at), ..HolderNow::default() }, format!(
                    "two keys under the lock: A's holds it, B's (revision {b_queued_at}) waits behind it"
                )),
        );
        Ok((a, b, a_key, b_queued_at))
    }

    /// While there is no leader, no lease expires: only the leader expires leases, and a
    /// member that stops being leader pushes every lease's expiry out to "never". The new
    /// leader then gives every lease its full TTL again, plus an election timeout, counted
    /// from its election. So a lease that merely survived the election proves nothing,
    /// and neither does a key seen soon after that extension: the leader looks for
    /// expired leases only every 500ms, and revokes them through Raft. What proves that
    /// A's keepalives reach the new leader is A's lease itself, as the new leader counts
    /// it: more time left than its reset alone can have left. Records what it found.
    fn a_lease_after_election(
        &self,
        stage: &mut Stage,
        url: &str,
        a_key: &str,
        seen_elected: Instant,
    ) -> Result<()> {
        let lock_name = self.etcd_lock();
        let extension = ETCD_LEASE + Duration::from_millis(cluster::ETCD_ELECTION_MS);
        let a_lease = lease_of(url, a_key)?;
        let mut renewed = None;
        let mut last_left = None;
        while seen_elected.elapsed() < extension + Duration::from_secs(2) {
            let asked_at = Instant::now();
            let left = lease_left(url, a_lease)?;
            last_left = left;
            if let Some(left) = left
                && checks::renewed_after_election(left, asked_at - seen_elected, extension)
            {
                renewed = Some((asked_at - seen_elected, left));
                break;
            }
            stage.next(Duration::from_millis(250));
        }
        let mut watch = EtcdLock::connect(url, &lock_name)?;
        let holder_now = watch.holder_of(&lock_name)?.map(|(key, _)| key);
        let a_survived = holder_now.as_deref() == Some(a_key);
        let text = match (renewed, a_survived) {
            (Some((since, left)), true) => format!(
                "A's lease has {}s left, read {} after the election; the new leader's reset \
                 (TTL + election timeout, {} from its election) can have left at most {}, so \
                 A's keepalive reached the new leader; A's key still holds the lock, B still \
                 waits",
                left.as_secs(),
                human(since),
                human(extension),
                human(extension.saturating_sub(since))
            ),
            (None, _) => format!(
                "A's lease was never above what the new leader's reset alone leaves (last \
                 read: {}); the lock's holder is now {holder_now:?}",
                last_left.map_or("gone".to_string(), |l| format!("{}s left", l.as_secs()))
            ),
            (Some(_), false) => {
                format!("A's lease was renewed, yet the lock's holder is now {holder_now:?}")
            }
        };
        stage.record(Event::new(
            "etcd",
            HolderNow {
                a_key_held: Some(a_survived),
                a_lease_renewed: Some(renewed.is_some()),
                after_election_ms: Some(renewed.map_or(0, |(since, _)| since.as_millis() as u64)),
                a_lease_left_s: Some(renewed.map_or(-1, |(_, left)| left.as_secs() as i64)),
                ..HolderNow::default()
            },
            text,
        ));
        Ok(())
    }
}

/// Watches for the new leader after the kill; records it with its term, and returns how
/// long the election took as seen from here.
///
/// etcd's `status` reports the term of the last entry the member has *applied*, not the
/// term Raft is in: right after an election it still shows the old term. A new leader's
/// first act is to commit an empty entry of its own term, so wait until a member has
/// applied that (the term reported rises) before naming the term.
fn watch_election(
    stage: &mut Stage,
    etcd: &EtcdCluster,
    at: &Members,
    before: &cluster::MemberStatus,
    killed_at: Instant,
) -> Result<Duration> {
    let old_leader = etcd.members[at.leader].id;
    let mut named = None;
    while killed_at.elapsed() < Duration::from_secs(15) {
        let stands = cluster::etcd_status(&etcd.members[at.near].client_url)
            .ok()
            .map(|now| {
                let stands =
                    checks::election(old_leader, before.raft_term, now.leader, now.raft_term);
                (now, stands)
            });
        if let Some((now, stands)) = stands
            && stands != Election::NotYet
        {
            let took = *named.get_or_insert_with(|| killed_at.elapsed());
            if stands == Election::Elected {
                let name = etcd
                    .members
                    .iter()
                    .find(|m| m.id == now.leader)
                    .map_or("?".to_string(), |m| m.name.clone());
                stage.record(Event::new(
                    "etcd",
                    HolderNow {
                        election_ms: Some(took.as_millis() as u64),
                        raft_term: Some(now.raft_term),
                        old_raft_term: Some(before.raft_term),
                        ..HolderNow::default()
                    },
                    format!(
                        "{name} is the new leader, {} after the kill; term {} (was {})",
                        human(took),
                        now.raft_term,
                        before.raft_term
                    ),
                ));
                return Ok(took);
            }
        }
        stage.next(Duration::from_millis(10));
    }
    bail!("etcd elected no new leader within 15s")
}

/// The leader-killed scenario, once A and B have let go: whether B kept its place in the
/// queue (recorded), and the store's read-back.
fn judge_leader_killed(
    stage: &mut Stage,
    store: &mut Store,
    (run_id, resource): (&str, &str),
    b_queued_at: i64,
) -> Result<Scenario> {
    let a_kept = stage
        .saw("A:etcd", Kind::Released)
        .and_then(release_of)
        .is_some_and(|r| r.deleted());
    let b_got = stage.saw("B:etcd", Kind::Acquired).is_some();
    if let Some(b_token) = stage.saw("B:etcd", Kind::Acquired).and_then(|e| e.token()) {
        stage.record(Event::new(
            "etcd",
            HolderNow {
                b_queued_revision: Some(b_queued_at),
                b_token: Some(b_token),
                b_kept_place: Some(checks::kept_place(b_queued_at, b_token)),
                ..HolderNow::default()
            },
            if checks::kept_place(b_queued_at, b_token) {
                format!("B held its place in the queue: its key kept revision {b_queued_at}")
            } else {
                format!(
                    "B lost its place in the queue: the leader change dropped its lock \
                         call, etcd deleted its key (revision {b_queued_at}) and B queued a \
                         new one (revision {b_token})"
                )
            },
        ));
    }
    let read = store.read_back(run_id, resource)?;
    stage.record_read_back(resource, &read);
    Scenario::from_store(
        "etcd-leader-killed",
        "etcd",
        check::two_holders_queued(a_kept, b_got),
        Some(Rule::NotLower),
        read,
        "A:etcd",
        "B:etcd",
    )
}

/// Now the majority: two of three members dead, whoever is leader. C logs in first,
/// while a majority can still carry its log-in (etcd's auth goes through Raft).
fn majority_lost(
    stage: &mut Stage,
    hand: &mut Hand,
    etcd: &mut EtcdCluster,
    at: &Members,
) -> Result<Scenario> {
    let c = client_c(&etcd.members[at.far].url())?;
    let words = format!(
        "SIGKILLs {} too: one member of three is left",
        etcd.members[at.near].name
    );
    hand.play(stage, &mut etcd.members[at.near], Fault::Kill, words)?;
    let Some(refusal) = try_to_lock_without_majority(c)? else {
        bail!("etcd granted a lease with one member of three: that cannot be");
    };
    stage.record(Event::new(
        "etcd",
        GaveUp {
            error: Some(refusal.clone()),
            ..GaveUp::default()
        },
        format!(
            "C asks {} for a lease: {refusal}",
            etcd.members[at.far].name
        ),
    ));
    Ok(Scenario {
        unavailable: Some(refusal),
        ..Scenario::nothing_granted("etcd-majority-lost", "etcd")
    })
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

/// The lease an etcd key is attached to.
fn lease_of(url: &str, key: &str) -> Result<i64> {
    connect::etcd_runtime()?.block_on(async {
        let mut client = connect::etcd(url).await?;
        let found = client.get(key, None).await?;
        found
            .kvs()
            .first()
            .map(|kv| kv.lease())
            .with_context(|| format!("the key {key} is gone"))
    })
}

/// A lease's remaining TTL as the leader counts it (whole seconds, rounded down), or None
/// once it has expired.
fn lease_left(url: &str, lease: i64) -> Result<Option<Duration>> {
    connect::etcd_runtime()?.block_on(async {
        let mut client = connect::etcd(url).await?;
        match client.lease_time_to_live(lease, None).await {
            Ok(found) => Ok(u64::try_from(found.ttl()).ok().map(Duration::from_secs)),
            Err(err) if err.to_string().contains("lease not found") => Ok(None),
            Err(err) => Err(err.into()),
        }
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

/// Client C, logged in (the URL's user), its requests bounded at 3s; with the runtime it
/// lives on.
fn client_c(url: &str) -> Result<(tokio::runtime::Runtime, etcd_client::Client)> {
    let runtime = connect::etcd_runtime()?;
    let client = runtime.block_on(connect::etcd_within(url, Duration::from_secs(3)))?;
    Ok((runtime, client))
}

/// Client C's attempt on a member that lost its majority: a lease grant, bounded at 3s.
/// Returns what etcd (or the client's timeout) answered, or None if it was granted.
fn try_to_lock_without_majority(
    (runtime, mut client): (tokio::runtime::Runtime, etcd_client::Client),
) -> Result<Option<String>> {
    runtime.block_on(async {
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
