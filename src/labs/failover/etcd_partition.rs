//! Lab 5, etcd on hosts: the leader cut off in a minority (issue 44).
//!
//! ```text
//!  m1 (leader) ─┬─ A: lease, lock, token t_A          m2
//!               │                                     m3
//!  ═════════════ partition: m1 | m2, m3 ═══════════════════════════════════════════
//!  m1: A's put times out (no majority to commit it);   m2, m3: elect a new leader;
//!      A's keepalives fail, A never asks again             B asks m2, waits behind A;
//!                                                          A's lease runs out there;
//!                                                          B gets the lock, token t_B
//!  A writes the store anyway: unfenced it lands, fenced by t_A < t_B it is refused
//!  ═════════════ heal ═══════════════════════════════════════════════════════════════
//!  m1 rejoins as a follower of the new leader
//! ```
//!
//! Every fact is read from the members (their status, A's lease, the lock's holder, a
//! put's answer) and from the store; the partition is a step of the nemesis's schedule.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::Play;
use super::etcd_hosts::watch_majority_elect;
use super::etcd_hosts::{self as on_hosts, HostClient, Waiter, heading, leader_now};
use super::hosts_check::partition::{A, B, FENCED, UNFENCED};
use super::verdict::Scenario;
use crate::hosts::{HostedEtcd, Hosts};
use crate::labs::Stage;
use crate::labs::faults::Faults;
use crate::nemesis::schedule::Schedule;
use crate::nemesis::{Fault, Nemesis};
use crate::store::Store;

/// A's and B's lease: short, so that the majority's expiry comes within seconds of the
/// election (etcd's new leader gives every lease its full TTL again, plus an election
/// timeout).
pub(super) const LEASE: Duration = Duration::from_secs(3);

/// How long A's put through the cut-off leader may take before the lab calls it timed out.
const PUT_WITHIN: Duration = Duration::from_secs(2);

impl Play<'_> {
    /// The scenario: see the module doc. Returns its two rows.
    pub(super) fn etcd_partition(
        &self,
        stage: &mut Stage,
        hosts: &Arc<Hosts>,
        etcd: &HostedEtcd,
        store: &mut Store,
    ) -> Result<Vec<Scenario>> {
        heading(stage, "── etcd: the leader cut off in a minority ──");
        stage.tags().scenario = Some("etcd-partition".into());
        let (leader, term) = leader_now(stage, etcd)?;
        let majority: Vec<&str> = etcd.hosts().into_iter().filter(|h| *h != leader).collect();
        let lock = format!("lockslab:{}:failover:etcd-partition", self.run_id);
        let (unfenced, fenced) = (self.resource(UNFENCED), self.resource(FENCED));

        let mut a = HostClient::on(hosts, (A, &leader), etcd.on(&leader)?, &lock)?;
        a.take(stage, LEASE)?;
        let a_lease = a.lease_id().context("A's lease")?;
        a.write(stage, store, self.run_id, &unfenced, false);
        a.write(stage, store, self.run_id, &fenced, true);

        // The cut: a step of the player's schedule, played now.
        let mut nemesis = Nemesis::new();
        let mut faults = Faults::new(&Schedule::default(), stage).on_hosts(hosts);
        let words = format!(
            "cuts the leader's host {leader} off from {}: a minority of one",
            majority.join(" and ")
        );
        stage.play_now(
            &mut faults,
            &mut nemesis,
            &mut [],
            (Fault::Partition, &leader),
            words,
        )?;
        let cut_at = Instant::now();
        let put = a.start_put(&format!("{lock}-a-put"), PUT_WITHIN);
        let new_leader = watch_majority_elect(stage, etcd, (&leader, term), &majority, cut_at)?;
        let election = cut_at.elapsed();
        on_hosts::read_status(stage, etcd, etcd.on(&leader)?, false);
        let watcher = etcd.on(&new_leader)?;
        // B asks the majority once it has a leader: a lock call left waiting through an
        // election can come back "request timed out", and asking again is a trap of its
        // own (see `EtcdLock::acquire_within`). A's key is still there: B waits behind it.
        let b_member = etcd.on(majority[0])?;
        let wait = Duration::from_secs(30);
        let b = Waiter::start(
            hosts,
            (B, majority[0]),
            b_member,
            (&lock, LEASE, wait),
            stage,
        )?;
        a.record_put(stage, &leader, put);
        let mut last = None;
        let b_held = loop {
            a.record_beats(stage);
            on_hosts::watch_lease(stage, watcher, (A, a_lease), &mut last);
            if let Some(held) = b.granted(stage, &lock)? {
                break held;
            }
            if cut_at.elapsed() > Duration::from_secs(30) {
                bail!("B got no lock within 30s of the cut");
            }
            stage.next(Duration::from_millis(100));
        };
        // Read right after B's grant: where A's lease stands on the majority now.
        on_hosts::read_lease(stage, watcher, (A, a_lease), true);
        on_hosts::read_holder(stage, watcher, &lock, true);
        b.write((stage, store), (self.run_id, &unfenced), &b_held, false);
        b.write((stage, store), (self.run_id, &fenced), &b_held, true);
        // A never asked again: it writes as if it still held the lock.
        a.record_beats(stage);
        a.write(stage, store, self.run_id, &unfenced, false);
        a.write(stage, store, self.run_id, &fenced, true);

        let words = format!("heals the partition: {leader} reaches the others again");
        stage.play_now(
            &mut faults,
            &mut nemesis,
            &mut [],
            (Fault::Heal, &leader),
            words,
        )?;
        watch_rejoin(stage, etcd, (&leader, term), &new_leader)?;
        drop(b);
        a.let_go();
        let mut rows = Vec::new();
        for (name, resource) in [(UNFENCED, &unfenced), (FENCED, &fenced)] {
            let mut row = self.row_read_back(stage, store, (name, resource), (A, B))?;
            row.election_ms = Some(election.as_millis() as u64);
            rows.push(row);
        }
        Ok(rows)
    }
}

/// Asks the old leader until it names another member as leader and has applied entries
/// of a later term than its own (`status` reports the term of the last entry a member
/// applied): it rejoined as a follower and caught up. (Not necessarily with `new` leading:
/// etcd 3.4 runs no pre-vote by default, so the old leader, which kept calling elections
/// alone, comes back with a higher term and makes the majority elect again — among the
/// members whose log is complete, never itself.)
fn watch_rejoin(
    stage: &mut Stage,
    etcd: &HostedEtcd,
    (old, term): (&str, u64),
    new: &str,
) -> Result<()> {
    let member = etcd.on(old)?;
    let since = Instant::now();
    while since.elapsed() < Duration::from_secs(20) {
        let follows = (member.status(on_hosts::ASK_WITHIN).ok()).and_then(|s| {
            let leader = etcd.by_id(s.leader)?;
            Some(leader.host != old && s.raft_term > term)
        });
        if follows == Some(true) {
            on_hosts::read_status(stage, etcd, member, true);
            return Ok(());
        }
        stage.next(Duration::from_millis(20));
    }
    bail!("{old} did not follow another leader within 20s of the heal (the new one was {new})")
}
