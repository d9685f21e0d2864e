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
use crate::labs::Stage;
use crate::labs::faults::Hand;
use crate::lock::etcd::EtcdLock;
use crate::nemesis::Fault;
use crate::output::human;
use crate::store::Store;
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec, release_of};
use crate::worker::sentinel_client::Rule;

impl Play<'_> {
    /// Scenario 3: the leader dies while A holds the lock; then the majority goes.
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
        let (near, far) = (followers[0], followers[1]);
        let lock_name = format!("lockslab:{}:failover:etcd", self.run_id);
        let resource = self.resource("etcd-leader-killed");
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
                etcd.members[near].name,
                etcd.members[far].name
            ),
        ));
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
            .owner()
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
        while queued_keys(&etcd.members[near].url(), &lock_name)? < 2 {
            if Instant::now() > queued_by {
                bail!("B:etcd's key did not appear in the lock's queue within 10s");
            }
            stage.next(Duration::from_millis(10));
        }
        let b_queued_at = queue_of(&etcd.members[near].url(), &lock_name)?
            .get(1)
            .map(|(_, revision)| *revision)
            .context("B:etcd's key is not in the queue")?;
        stage.record(
            Event::new("etcd", HolderNow { b_queued_revision: Some(b_queued_at), ..HolderNow::default() }, format!(
                    "two keys under the lock: A's holds it, B's (revision {b_queued_at}) waits behind it"
                )),
        );

        // Played by hand, not as a schedule (labs::faults): the victim is whichever member
        // leads at this moment, as the cluster reports it, and B's queued key is read first.
        let killed_at = Instant::now();
        let words = format!("SIGKILLs the leader {}", etcd.members[leader].name);
        hand.play(stage, &mut etcd.members[leader], Fault::Kill, words)?;
        let old_leader = etcd.members[leader].id;
        // etcd's `status` reports the term of the last entry the member has *applied*, not
        // the term Raft is in: right after an election it still shows the old term. A new
        // leader's first act is to commit an empty entry of its own term, so wait until a
        // member has applied that (the term reported rises) before naming the term.
        let mut named = None;
        let mut election = None;
        while killed_at.elapsed() < Duration::from_secs(15) {
            let stands = cluster::etcd_status(&etcd.members[near].client_url)
                .ok()
                .map(|now| {
                    let stands =
                        checks::election(old_leader, status.raft_term, now.leader, now.raft_term);
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
                            old_raft_term: Some(status.raft_term),
                            ..HolderNow::default()
                        },
                        format!(
                            "{name} is the new leader, {} after the kill; term {} (was {})",
                            human(took),
                            now.raft_term,
                            status.raft_term
                        ),
                    ));
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
        // from its election. So a lease that merely survived the election proves nothing,
        // and neither does a key seen soon after that extension: the leader looks for
        // expired leases only every 500ms, and revokes them through Raft. What proves that
        // A's keepalives reach the new leader is A's lease itself, as the new leader counts
        // it: more time left than its reset alone can have left.
        let seen_elected = killed_at + election;
        let extension = ETCD_LEASE + Duration::from_millis(cluster::ETCD_ELECTION_MS);
        let url = etcd.members[near].url();
        let a_lease = lease_of(&url, &a_key)?;
        let mut renewed = None;
        let mut last_left = None;
        while seen_elected.elapsed() < extension + Duration::from_secs(2) {
            let asked_at = Instant::now();
            let left = lease_left(&url, a_lease)?;
            last_left = left;
            if let Some(left) = left
                && checks::renewed_after_election(left, asked_at - seen_elected, extension)
            {
                renewed = Some((asked_at - seen_elected, left));
                break;
            }
            stage.next(Duration::from_millis(250));
        }
        let mut watch = EtcdLock::connect(&url, &lock_name)?;
        let holder_now = watch.holder_of(&lock_name)?.map(|(key, _)| key);
        let a_survived = holder_now.as_deref() == Some(a_key.as_str());
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
        let read = store.read_back(self.run_id, &resource)?;
        stage.record_read_back(&resource, &read);
        let mut leader_killed = Scenario::from_store(
            "etcd-leader-killed",
            "etcd",
            check::two_holders_queued(a_kept, b_got),
            Some(Rule::NotLower),
            read,
            "A:etcd",
            "B:etcd",
        )?;
        leader_killed.election_ms = Some(election.as_millis() as u64);
        if let Some(line) = store_line(&leader_killed) {
            stage.record(line);
        }

        // Now the majority: two of three members dead, whoever is leader. C logs in first,
        // while a majority can still carry its log-in (etcd's auth goes through Raft).
        let c = client_c(&etcd.members[far].url())?;
        let words = format!(
            "SIGKILLs {} too: one member of three is left",
            etcd.members[near].name
        );
        hand.play(stage, &mut etcd.members[near], Fault::Kill, words)?;
        let Some(refusal) = try_to_lock_without_majority(c)? else {
            bail!("etcd granted a lease with one member of three: that cannot be");
        };
        stage.record(Event::new(
            "etcd",
            GaveUp {
                error: Some(refusal.clone()),
                ..GaveUp::default()
            },
            format!("C asks {} for a lease: {refusal}", etcd.members[far].name),
        ));
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
