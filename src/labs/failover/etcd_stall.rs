//! Lab 5, etcd on hosts: the leader stalled past its election timeout (issue 44), and the
//! question of etcd-io/etcd#15247.
//!
//! ```text
//!  m1 (leader)  ── SIGSTOP for 7s ──────────────────────── SIGCONT: wakes up deposed
//!  m2 ── A: lease 5s, keepalives through m2   m2, m3 elect a new leader; A's keepalives
//!  m3 ── B: waits for the lock                reach it, A's lease lives there
//! ```
//!
//! Frozen, the old leader's own clock of A's lease ran on: it last saw a keepalive before
//! the stall, so on waking it counts the lease expired. The bug reported as #15247 (and
//! #12528 before it): an old leader whose server has not yet caught up with Raft's news
//! that it was deposed asks to revoke such leases, and Raft, a follower by then, forwards
//! the request to the new leader, which carries it out — a live client loses its lock.
//! etcd's fix (pull request 16822, backported to 3.4 and 3.5) has a member confirm with a
//! majority (a linearizable read) that Raft still names it leader before it revokes; the
//! check precedes the revoke, so it narrows the window and does not close it (read from
//! the fix's code: `ensureLeadership` in etcd's server.go). Whether it happens is a race
//! on waking, so the lab reads back what happened on *this* run, on *this* etcd, and says
//! that.
//!
//! Fenced, nobody is hurt either way: revoked, B gets the lock with a higher revision and
//! the store refuses A's token; alive, A still holds the lock and B waits.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use colored::Colorize;

use super::Play;
use super::etcd_hosts::{self as on_hosts, HostClient, Waiter};
use super::etcd_hosts::{heading, leader_now, watch_majority_elect};
use super::hosts_check::stall::{A, B, ROW};
use super::verdict::Scenario;
use crate::events::Event;
use crate::events::facts::MemberSaid;
use crate::hosts::{HostedEtcd, HostedMember, Hosts};
use crate::labs::Stage;
use crate::labs::faults::{Faults, Until};
use crate::nemesis::schedule::{Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Victim};
use crate::store::Store;

/// A's lease: shorter than the stall, so that the frozen leader counts it expired when it
/// wakes; long enough that A's heartbeat (every TTL/3) rides out the election.
const LEASE: Duration = Duration::from_secs(5);

/// How long the leader stays stopped: past its election timeout and past A's lease.
const STALL: Duration = Duration::from_secs(7);

/// How long the lab watches after the old leader wakes: its lessor looks for expired
/// leases every 500ms, and a revoke it asks for is committed within a few heartbeats.
const WATCH_AFTER_WAKE: Duration = Duration::from_secs(3);

impl Play<'_> {
    /// The scenario: see the module doc. Returns its row, with what was observed.
    pub(super) fn etcd_stall(
        &self,
        stage: &mut Stage,
        hosts: &Arc<Hosts>,
        etcd: &mut HostedEtcd,
        store: &mut Store,
    ) -> Result<Scenario> {
        heading(
            stage,
            "── etcd: the leader stalled past its election timeout ──",
        );
        stage.tags().scenario = Some("etcd-stall".into());
        let (leader, term) = leader_now(stage, etcd)?;
        let version = etcd.on(&leader)?.status(on_hosts::ASK_WITHIN)?.version;
        let others: Vec<String> = (etcd.hosts().into_iter())
            .filter(|h| *h != leader)
            .map(String::from)
            .collect();
        let lock = format!("lockslab:{}:failover:etcd-stall", self.run_id);
        let resource = self.resource(ROW);
        let mut a = HostClient::on(hosts, (A, &others[0]), etcd.on(&others[0])?, &lock)?;
        a.take(stage, LEASE)?;
        let a_lease = a.lease_id().context("A's lease")?;
        a.write(stage, store, self.run_id, &resource, true);

        let schedule = Schedule::new(vec![Step {
            at_ms: 0,
            after: None,
            fault: Fault::LeaderStall,
            target: "etcd".into(),
            duration_ms: Some(STALL.as_millis() as u64),
        }]);
        let mut nemesis = Nemesis::new();
        let named = leader.clone();
        let mut faults =
            Faults::new(&schedule, stage).on_leader("etcd", move || Some(named.clone()));
        let until = Until::acted(Fault::LeaderStall, "etcd", Duration::from_secs(10));
        play(stage, &mut faults, &mut nemesis, etcd, until)?;
        let stalled_at = Instant::now();
        let majority: Vec<&str> = others.iter().map(String::as_str).collect();
        let new_leader = watch_majority_elect(stage, etcd, (&leader, term), &majority, stalled_at)?;
        let election = stalled_at.elapsed();
        let (mut b_held, mut last) = (None, None);
        while stalled_at.elapsed() < STALL {
            a.record_beats(stage);
            on_hosts::watch_lease(stage, etcd.on(&new_leader)?, (A, a_lease), &mut last);
            stage.next(Duration::from_millis(100));
        }
        // Where A's lease stands on the new leader as the old one wakes: alive, renewed
        // by A's keepalives through the new leader all along.
        on_hosts::read_lease(stage, etcd.on(&new_leader)?, (A, a_lease), true);
        play(
            stage,
            &mut faults,
            &mut nemesis,
            etcd,
            Until::done(Duration::from_secs(15)),
        )?;
        let woke_at = Instant::now();
        let watcher = etcd.on(&new_leader)?;
        // B asks once the old leader is awake (a lock call waiting through the stall can
        // time out in the cluster, and asking again is a trap of its own, see
        // `EtcdLock::acquire_within`): it gets the lock only if A's lease is revoked.
        let wait = Duration::from_secs(60);
        let b_member = etcd.on(&others[1])?;
        let b = Waiter::start(
            hosts,
            (B, &others[1]),
            b_member,
            (&lock, LEASE, wait),
            stage,
        )?;
        while woke_at.elapsed() < WATCH_AFTER_WAKE && b_held.is_none() {
            a.record_beats(stage);
            on_hosts::watch_lease(stage, watcher, (A, a_lease), &mut last);
            b_held = b.granted(stage, &lock)?;
            stage.next(Duration::from_millis(100));
        }
        on_hosts::read_status(stage, etcd, etcd.on(&leader)?, false);
        let observed = say_what_was_observed(stage, watcher, (a_lease, last), (&lock, &version));
        if let Some(held) = &b_held {
            b.write((stage, store), (self.run_id, &resource), held, true);
        }
        // A never asked again: it writes with the token it was given before the stall.
        a.write(stage, store, self.run_id, &resource, true);
        drop(b);
        a.let_go();
        let mut row = self.row_read_back(stage, store, (ROW, &resource), (A, B))?;
        row.observed = Some(observed);
        row.election_ms = Some(election.as_millis() as u64);
        Ok(row)
    }
}

/// Reads A's lease and the lock's holder from the new leader once more — after the wake,
/// and after B's grant if any — and records what they show, in a sentence with the
/// version, followed by what etcd's records say of the bug. Returns the sentence.
fn say_what_was_observed(
    stage: &mut Stage,
    watcher: &HostedMember,
    (a_lease, last): (i64, Option<i64>),
    (lock, version): (&str, &str),
) -> String {
    let last = on_hosts::read_lease(stage, watcher, (A, a_lease), true).or(last);
    let holder = on_hosts::read_holder(stage, watcher, lock, true);
    let observed = observation(version, last, holder.as_ref().map(|(k, _)| k.as_str()));
    stage.record(Event::new(
        on_hosts::LANE,
        MemberSaid {
            member: watcher.host.clone(),
            ask: "observed".into(),
            client: Some(A.into()),
            lease: Some(a_lease),
            ttl_s: last,
            version: Some(version.into()),
            ..MemberSaid::default()
        },
        observed.clone(),
    ));
    for line in ISSUE_15247 {
        stage.timeline.say(&format!("  {}", line.dimmed()));
    }
    observed
}

/// What etcd's own records say of the bug, printed under what this run observed: the
/// reader compares the two, the lab does not presume either.
const ISSUE_15247: [&str; 5] = [
    "etcd-io/etcd#15247 (and #12528): a leader that wakes up deposed may",
    "revoke leases whose keepalives went to the new leader. Fixed in 3.4.31",
    "(PR 17465) and 3.5.13 (PR 17425), per etcd's changelogs: a member first",
    "confirms with a majority that it still leads. That check comes before",
    "the revoke, not with it: it narrows the window, it does not close it.",
];

/// Plays `faults` on the members until `until` holds.
fn play(
    stage: &mut Stage,
    faults: &mut Faults,
    nemesis: &mut Nemesis,
    etcd: &mut HostedEtcd,
    until: Until,
) -> Result<()> {
    let mut cast: Vec<&mut dyn Victim> = (etcd.members.iter_mut())
        .map(|m| m as &mut dyn Victim)
        .collect();
    stage.play(faults, nemesis, &mut cast, until)
}

/// What this run saw, in a sentence: the version, and A's lease as last read back.
fn observation(version: &str, lease_left: Option<i64>, holder: Option<&str>) -> String {
    let holder = holder.unwrap_or("nobody");
    match lease_left {
        Some(-1) => format!(
            "observed on etcd {version}: A's lease was REVOKED although its keepalives \
             reached the new leader; the lock is now held by {holder}"
        ),
        Some(left) => format!(
            "observed on etcd {version}: A's lease is still alive ({left}s left) after the \
             old leader woke; the lock is held by {holder}"
        ),
        None => format!(
            "observed on etcd {version}: the majority gave no answer on A's lease after \
             the old leader woke"
        ),
    }
}
