//! Lab 5's etcd on hosts (issue 44): three members, each on a host of its own, and the
//! clients the lab plays on those hosts. What the two scenarios share — the clients, their
//! store writes, and the servers' answers the lab reads back — is here;
//! [`super::etcd_partition`] and [`super::etcd_stall`] are the stories.
//!
//! Every observation is the servers' own word, asked of each member over its control
//! socket (which no partition cuts): its `status` (whom it names leader, in which term), a
//! lease's TTL, the lock's holder. A client's requests leave from its host through a
//! [`Door`], so a partition cuts them as it would cut a process there.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::hosts_check;
use super::verdict::{Scenario, store_line};
use crate::events::Event;
use crate::events::facts::{
    Acquired, Lost, MemberSaid, RenewalError, RenewalFailed, Waiting, Wrote,
};
use crate::hosts::{Door, HostedEtcd, HostedMember, Hosts};
use crate::labs::Stage;
use crate::lock::etcd::{Acquired as Grant, Beat, EtcdLock, Held, Lease};
use crate::store::Store;
use crate::worker::sentinel_client::Rule;
use colored::Colorize;
use std::time::Instant;

/// How long the lab waits for one member's answer over its socket.
pub(super) const ASK_WITHIN: Duration = Duration::from_millis(800);

/// The lab's lane for what the members say.
pub(super) const LANE: &str = "etcd";

/// A client the lab plays on a host: its lock and its lease live in etcd, its requests
/// leave from the host (through its door), its heartbeat renews the lease from there.
pub(super) struct HostClient {
    pub name: String,
    pub host: String,
    door: Door,
    lock: EtcdLock,
    lease: Option<Lease>,
    beats: Receiver<Beat>,
    pub held: Option<Held>,
}

impl HostClient {
    /// Client `name` on `host`, talking to `member` (on the same host, or across a link).
    pub fn on(
        hosts: &Arc<Hosts>,
        (name, host): (&str, &str),
        member: &HostedMember,
        lock: &str,
    ) -> Result<HostClient> {
        let door = hosts.door(host, member.client_addr)?;
        let lock = EtcdLock::connect(&door.http_url(), lock)
            .with_context(|| format!("{name}'s etcd client on host {host}"))?;
        let (_, beats) = mpsc::channel();
        Ok(HostClient {
            name: name.into(),
            host: host.into(),
            door,
            lock,
            lease: None,
            beats,
            held: None,
        })
    }

    /// Grants its lease (its heartbeat renewing it from now on) and takes the lock,
    /// recording the grant with its token (the key's create revision).
    pub fn take(&mut self, stage: &mut Stage, ttl: Duration) -> Result<Held> {
        let (beat, beats) = mpsc::channel();
        let lease = self.lock.grant_lease(ttl, move |b| {
            let _ = beat.send(b);
        })?;
        self.beats = beats;
        stage.record(Event::new(
            &self.name,
            Waiting {
                lease: Some(format!("{:x}", lease.id)),
                lease_ttl_ms: Some(lease.ttl.as_millis() as u64),
                ..Waiting::default()
            },
            format!(
                "on host {}: lease {:x} ({}s), asks for the lock",
                self.host,
                lease.id,
                lease.ttl.as_secs()
            ),
        ));
        let held = match self.lock.acquire_within(&lease, Duration::from_secs(10))? {
            Grant::Held(held) => held,
            other => bail!("{} did not get the free lock: {other:?}", self.name),
        };
        stage.record(granted(&self.name, &self.lock.name, &held));
        self.lease = Some(lease);
        self.held = Some(held.clone());
        Ok(held)
    }

    pub fn lease_id(&self) -> Option<i64> {
        self.lease.as_ref().map(|l| l.id)
    }

    /// Records what its heartbeat said since last asked: a failed renewal, the lease
    /// given up (its renewals are too many to show each).
    pub fn record_beats(&self, stage: &mut Stage) {
        while let Ok(beat) = self.beats.try_recv() {
            let event = match beat {
                Beat::Failed { timed_out, why } => Event::new(
                    &self.name,
                    RenewalFailed {
                        error: if timed_out {
                            RenewalError::Timeout
                        } else {
                            RenewalError::Cut
                        },
                        why: why.clone(),
                    },
                    format!("keepalive failed: {why}"),
                ),
                Beat::Lost { why } => Event::new(
                    &self.name,
                    Lost::because(why.clone()),
                    format!("its heartbeat gives the lease up: {why}"),
                ),
                _ => continue,
            };
            stage.record(event);
        }
    }

    /// Starts a plain put through its member, bounded at `within`, on a thread of its
    /// own (the lab watches the election meanwhile): whether the member can commit. The
    /// client's own request timeout is a second longer, so that the lab's bound is the one
    /// that ends a put with no answer, and the line says so in the lab's words rather than
    /// as the transport's timeout error.
    pub fn start_put(&self, key: &str, within: Duration) -> JoinHandle<Option<String>> {
        let (url, key) = (self.door.http_url(), key.to_string());
        std::thread::spawn(move || {
            let answer = crate::connect::etcd_runtime().and_then(|runtime| {
                runtime.block_on(async {
                    let slack = within + Duration::from_secs(1);
                    let mut client = crate::connect::etcd_within(&url, slack).await?;
                    let put = client.put(key, "A was here", None);
                    match tokio::time::timeout(within, put).await {
                        Ok(done) => done.map(drop).map_err(anyhow::Error::from),
                        Err(_) => bail!("no answer within {}ms", within.as_millis()),
                    }
                })
            });
            answer.err().map(|err| format!("{err:#}"))
        })
    }

    /// Records the answer of the put [`HostClient::start_put`] sent through `member`.
    pub fn record_put(&self, stage: &mut Stage, member: &str, put: JoinHandle<Option<String>>) {
        let error = put
            .join()
            .unwrap_or_else(|_| Some("the put's thread panicked".into()));
        let text = match &error {
            Some(error) => format!("{}'s put through {member}: {error}", self.name),
            None => format!("{}'s put through {member} was committed", self.name),
        };
        stage.record(Event::new(
            LANE,
            MemberSaid {
                member: member.into(),
                ask: "put".into(),
                client: Some(self.name.clone()),
                error,
                ..MemberSaid::default()
            },
            text,
        ));
    }

    /// Writes `value` to the store's `resource`, with its token or none, and records the
    /// store's answer. It does not ask etcd first: a client that believes it still holds
    /// the lock.
    pub fn write(
        &self,
        stage: &mut Stage,
        store: &mut Store,
        run_id: &str,
        resource: &str,
        fenced: bool,
    ) {
        let token = self.held.as_ref().map(|h| h.token).filter(|_| fenced);
        let value = format!("{} was here", self.name);
        let outcome = store.write(run_id, resource, &self.name, &value, token);
        stage.record(wrote(&self.name, resource, token, outcome));
    }

    /// Lets go: revokes its lease (its key goes with it), if etcd answers.
    pub fn let_go(&mut self) {
        if let (Some(lease), Some(held)) = (self.lease.take(), self.held.as_ref()) {
            let _ = self.lock.release(lease, held);
        }
    }
}

/// The grant of the lock to `name`, as the history records it.
pub(super) fn granted(name: &str, lock: &str, held: &Held) -> Event {
    Event::new(
        name,
        Acquired {
            lock: Some(lock.into()),
            owner: Some(held.key.clone()),
            token: Some(held.token),
            backend: Some("etcd".into()),
            ..Acquired::default()
        },
        format!("holds the lock: key {}, token {}", held.key, held.token),
    )
}

/// A store write and its answer, as the history records it.
pub(super) fn wrote(
    name: &str,
    resource: &str,
    token: Option<i64>,
    outcome: crate::store::Outcome,
) -> Event {
    let fenced = token.map_or("unfenced".to_string(), |t| format!("token {t}"));
    Event::new(
        name,
        Wrote {
            token,
            resource: Some(resource.into()),
            ..Wrote::new(outcome)
        },
        format!("writes {resource} ({fenced}): {}", outcome.as_str()),
    )
}

/// A client that waits for the lock on a thread of its own (its lock call blocks until
/// the holder's key is gone), and then holds it until told to let go.
pub(super) struct Waiter {
    pub name: String,
    got: Receiver<Result<Held, String>>,
    let_go: Sender<()>,
    thread: Option<JoinHandle<()>>,
    /// Closed on drop before the thread is joined: a lock call still waiting then fails
    /// at once, instead of waiting out its time.
    door: Option<Door>,
    /// Was it granted the lock (then it lets go through its door before that closes)?
    holds: std::cell::Cell<bool>,
}

impl Waiter {
    /// Starts `name` on `host` asking `member` for `lock`, with a lease of `ttl`, waiting
    /// at most `wait`.
    pub fn start(
        hosts: &Arc<Hosts>,
        (name, host): (&str, &str),
        member: &HostedMember,
        (lock, ttl, wait): (&str, Duration, Duration),
        stage: &mut Stage,
    ) -> Result<Waiter> {
        let door = hosts.door(host, member.client_addr)?;
        let (url, lock) = (door.http_url(), lock.to_string());
        let (tell, got) = mpsc::channel();
        let (let_go, told) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let taken = (|| -> Result<(EtcdLock, Lease, Result<Held, String>)> {
                let mut client = EtcdLock::connect(&url, &lock)?;
                let lease = client.grant_lease(ttl, |_| {})?;
                let grant = match client.acquire_within(&lease, wait)? {
                    Grant::Held(held) => Ok(held),
                    other => Err(format!("{other:?}")),
                };
                Ok((client, lease, grant))
            })();
            match taken {
                Ok((mut client, lease, grant)) => {
                    let held = grant.clone().ok();
                    let _ = tell.send(grant);
                    let _ = told.recv_timeout(Duration::from_secs(120));
                    if let Some(held) = held {
                        let _ = client.release(lease, &held);
                    }
                }
                Err(err) => {
                    let _ = tell.send(Err(format!("{err:#}")));
                }
            }
        });
        stage.record(Event::new(
            name,
            Waiting::default(),
            format!(
                "on host {host}: asks {} for the lock, and waits",
                member.host
            ),
        ));
        Ok(Waiter {
            name: name.into(),
            got,
            let_go,
            thread: Some(thread),
            door: Some(door),
            holds: std::cell::Cell::new(false),
        })
    }

    /// Its grant, if it has come (recorded then); an error if its wait ended without one.
    pub fn granted(&self, stage: &mut Stage, lock: &str) -> Result<Option<Held>> {
        match self.got.try_recv() {
            Ok(Ok(held)) => {
                self.holds.set(true);
                stage.record(granted(&self.name, lock, &held));
                Ok(Some(held))
            }
            Ok(Err(why)) => bail!("{} got no lock: {why}", self.name),
            Err(_) => Ok(None),
        }
    }

    /// Writes the store as its grant allows (with its token when `fenced`).
    pub fn write(
        &self,
        (stage, store): (&mut Stage, &mut Store),
        (run_id, resource): (&str, &str),
        held: &Held,
        fenced: bool,
    ) {
        let token = fenced.then_some(held.token);
        let value = format!("{} was here", self.name);
        let outcome = store.write(run_id, resource, &self.name, &value, token);
        stage.record(wrote(&self.name, resource, token, outcome));
    }
}

impl Drop for Waiter {
    /// Tells it to let go and waits for its thread: one that holds the lock releases it
    /// first; one still waiting has its door closed under it.
    fn drop(&mut self) {
        let _ = self.let_go.send(());
        if !self.holds.get() {
            self.door.take();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Asks `member` its status and records the answer (`in_majority`: its side now).
pub(super) fn read_status(
    stage: &mut Stage,
    etcd: &HostedEtcd,
    member: &HostedMember,
    in_majority: bool,
) -> Option<crate::hosts::HostedMemberStatus> {
    let answer = member.status(ASK_WITHIN);
    let (said, text) = match &answer {
        Ok(status) => {
            let leader = etcd.by_id(status.leader).map(|m| m.host.clone());
            let text = format!(
                "{} says: leader {}, term {}",
                member.host,
                leader.as_deref().unwrap_or("none"),
                status.raft_term
            );
            let said = MemberSaid {
                leader,
                raft_term: Some(status.raft_term),
                version: Some(status.version.clone()),
                ..MemberSaid::default()
            };
            (said, text)
        }
        Err(err) => {
            let error = format!("{err:#}");
            let text = format!("{} gives no status: {error}", member.host);
            let said = MemberSaid {
                error: Some(error),
                ..MemberSaid::default()
            };
            (said, text)
        }
    };
    stage.record(Event::new(
        LANE,
        MemberSaid {
            member: member.host.clone(),
            ask: "status".into(),
            in_majority: Some(in_majority),
            ..said
        },
        text,
    ));
    answer.ok()
}

/// [`read_lease`] as the lab watches a lease: the first answer is recorded, then only the
/// answers of its last seconds and its end (a lease that a heartbeat renews reads 3, 4,
/// 3, 4… — the history keeps what matters, not each renewal). Returns the answer.
pub(super) fn watch_lease(
    stage: &mut Stage,
    member: &HostedMember,
    (client, lease): (&str, i64),
    last: &mut Option<i64>,
) -> Option<i64> {
    let now = member.lease_ttl(lease, ASK_WITHIN).ok();
    let worth_keeping = match (*last, now) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(before), Some(ttl)) => ttl != before && ttl <= 1,
    };
    if worth_keeping {
        *last = read_lease(stage, member, (client, lease), true).or(now);
    }
    now
}

/// Asks `member` how long `client`'s lease has left (it asks its leader), and records it.
pub(super) fn read_lease(
    stage: &mut Stage,
    member: &HostedMember,
    (client, lease): (&str, i64),
    in_majority: bool,
) -> Option<i64> {
    let answer = member.lease_ttl(lease, ASK_WITHIN);
    let text = match &answer {
        Ok(-1) => format!("{}: {client}'s lease {lease:x} is gone", member.host),
        Ok(ttl) => format!(
            "{}: {client}'s lease {lease:x} has {ttl}s left",
            member.host
        ),
        Err(err) => format!("{}: no answer on {client}'s lease ({err:#})", member.host),
    };
    stage.record(Event::new(
        LANE,
        MemberSaid {
            member: member.host.clone(),
            ask: "lease_ttl".into(),
            in_majority: Some(in_majority),
            client: Some(client.into()),
            lease: Some(lease),
            ttl_s: answer.as_ref().ok().copied(),
            error: answer.as_ref().err().map(|e| format!("{e:#}")),
            ..MemberSaid::default()
        },
        text,
    ));
    answer.ok()
}

/// Asks `member` who holds `lock`, and records it.
pub(super) fn read_holder(
    stage: &mut Stage,
    member: &HostedMember,
    lock: &str,
    in_majority: bool,
) -> Option<(String, i64)> {
    let answer = member.holder(lock, ASK_WITHIN);
    let text = match &answer {
        Ok(Some((key, revision))) => {
            format!(
                "{}: the lock is held by {key} (revision {revision})",
                member.host
            )
        }
        Ok(None) => format!("{}: nobody holds the lock", member.host),
        Err(err) => format!("{}: no answer on the lock ({err:#})", member.host),
    };
    let found = answer.as_ref().ok().cloned().flatten();
    stage.record(Event::new(
        LANE,
        MemberSaid {
            member: member.host.clone(),
            ask: "holder".into(),
            in_majority: Some(in_majority),
            holder_key: found.as_ref().map(|(k, _)| k.clone()),
            holder_revision: found.as_ref().map(|(_, r)| *r),
            error: answer.as_ref().err().map(|e| format!("{e:#}")),
            ..MemberSaid::default()
        },
        text,
    ));
    found
}

/// The etcd scenarios that need hosts, chosen on the command line.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnHosts {
    /// etcd's leader cut off in a minority by a real partition, then healed
    EtcdPartition,
    /// etcd's leader stopped (SIGSTOP) past its election timeout: etcd #15247
    EtcdStall,
    /// Both, one after the other, on one cluster
    Etcd,
}

impl OnHosts {
    fn partition(self) -> bool {
        matches!(self, OnHosts::EtcdPartition | OnHosts::Etcd)
    }

    fn stall(self) -> bool {
        matches!(self, OnHosts::EtcdStall | OnHosts::Etcd)
    }
}

impl super::Play<'_> {
    /// The row of `name`, read back from the store's `resource`; two holders as the
    /// members' answers in the history say ([`hosts_check::exclusion`]).
    pub(super) fn row_read_back(
        &self,
        stage: &mut Stage,
        store: &mut Store,
        (name, resource): (&str, &str),
        (a, b): (&str, &str),
    ) -> Result<Scenario> {
        let read = store.read_back(self.run_id, resource)?;
        stage.record_read_back(resource, &read);
        let (two_holders, _) = hosts_check::exclusion(&stage.log, a, b);
        let rule = resource.ends_with("fenced") && !resource.ends_with("unfenced");
        let row = Scenario::from_store(
            name,
            "etcd",
            two_holders,
            rule.then_some(Rule::NotLower),
            read,
            a,
            b,
        )?;
        if let Some(line) = store_line(&row) {
            stage.conclude(line);
        }
        Ok(row)
    }

    /// Makes three hosts, starts an etcd member on each, and plays `which` on them.
    /// Fails, saying why, where this machine cannot make hosts.
    pub(super) fn on_hosts(
        &self,
        stage: &mut Stage,
        store: &mut Store,
        which: OnHosts,
    ) -> Result<Vec<super::verdict::Scenario>> {
        let hosts = Hosts::new(&["m1", "m2", "m3"]).context(
            "these scenarios put each etcd member on a host of its own (a network namespace), \
             which this machine does not allow (`lockslab doctor` says why)",
        )?;
        let hosts = Arc::new(hosts);
        // Claimed for this run, removed at the end and on Ctrl-C, swept after a SIGKILL.
        let dir = crate::cluster::RunDir::new()?;
        let mut etcd = hosts.start_etcd(&["m1", "m2", "m3"], dir.path())?;
        stage.record(Event::new(
            "lab",
            crate::events::facts::RunFacts {
                run_id: Some(self.run_id.into()),
                ..Default::default()
            },
            format!(
                "run {}: etcd on hosts m1 {}, m2 {}, m3 {} (heartbeat {}ms, election \
                 timeout {}ms; ready in {})",
                self.run_id,
                etcd.members[0].client_addr,
                etcd.members[1].client_addr,
                etcd.members[2].client_addr,
                crate::cluster::ETCD_HEARTBEAT_MS,
                crate::cluster::ETCD_ELECTION_MS,
                crate::output::human(etcd.started_in)
            ),
        ));
        let mut rows = Vec::new();
        if which.partition() {
            rows.extend(self.etcd_partition(stage, &hosts, &etcd, store)?);
        }
        if which.stall() {
            rows.push(self.etcd_stall(stage, &hosts, &mut etcd, store)?);
        }
        drop(etcd);
        drop(hosts);
        Ok(rows)
    }
}

pub(super) fn heading(stage: &mut Stage, title: &str) {
    stage.timeline.say("");
    stage.timeline.say(&format!("{}", title.green().bold()));
}

/// Every member's status, recorded; returns the leader they name (its host) and the term.
pub(super) fn leader_now(stage: &mut Stage, etcd: &HostedEtcd) -> Result<(String, u64)> {
    let mut named = None;
    for member in &etcd.members {
        if let Some(status) = read_status(stage, etcd, member, true) {
            named = named.or(etcd
                .by_id(status.leader)
                .map(|m| (m.host.clone(), status.raft_term)));
        }
    }
    named.context("no etcd member names a leader")
}

/// Asks the majority's members until one names a leader other than `old` in a later term;
/// records that answer, and returns the new leader's host.
pub(super) fn watch_majority_elect(
    stage: &mut Stage,
    etcd: &HostedEtcd,
    (old, term): (&str, u64),
    majority: &[&str],
    since: Instant,
) -> Result<String> {
    while since.elapsed() < Duration::from_secs(20) {
        for host in majority {
            let member = etcd.on(host)?;
            let Ok(status) = member.status(ASK_WITHIN) else {
                continue;
            };
            let named = etcd.by_id(status.leader).map(|m| m.host.clone());
            if let Some(new) = named.filter(|n| n != old)
                && status.raft_term > term
            {
                read_status(stage, etcd, member, true);
                return Ok(new);
            }
        }
        stage.next(Duration::from_millis(20));
    }
    bail!("the majority elected no new leader within 20s")
}
