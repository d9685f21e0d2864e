//! Lab 5's etcd on hosts of its own (issue 44): a real etcd cluster, one member per network
//! namespace, a real partition and a real SIGSTOP, the shared test Postgres as the store.
//! Every assertion is on what the members and the store answered. These tests need user
//! namespaces: where the kernel refuses them the lab fails, and so do they — loudly.

use crate::common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::*;
use facts::MemberSaid;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// `lockslab failover --scenario <scenario> --json`, its temporary directories in `tmp`.
fn on_hosts(tmp: &Path, scenario: &str) -> std::process::Child {
    lockslab(&["failover", "--scenario", scenario, "--json"])
        .env("TMPDIR", tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting lockslab failover")
}

/// The whole run: its events and verdict. Fails with the lab's own words if it failed
/// (where namespaces are not allowed, the words say so).
fn run(tmp: &Path, scenario: &str) -> (Vec<Event>, Value) {
    let output = on_hosts(tmp, scenario).wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "lockslab failover --scenario {scenario} failed (a machine without user namespaces cannot run \
         these tests; they are not skipped): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    events_and_verdict(&String::from_utf8_lossy(&output.stdout))
}

/// Every `member_said` of the history, with its event.
fn said(events: &[Event]) -> Vec<(&Event, &MemberSaid)> {
    (events.iter())
        .filter_map(|e| match &e.what {
            What::MemberSaid(s) => Some((e, s)),
            _ => None,
        })
        .collect()
}

fn token_of(events: &[Event], worker: &str) -> i64 {
    (events.iter())
        .find(|e| e.is(worker, Kind::Acquired))
        .and_then(Event::token)
        .unwrap_or_else(|| panic!("{worker} was never granted the lock"))
}

/// The outcome of `worker`'s last write to `resource`.
fn last_write(events: &[Event], worker: &str, resource: &str) -> facts::Wrote {
    (events.iter().rev())
        .find_map(|e| match &e.what {
            What::Wrote(w) if e.worker == worker && w.resource.as_deref() == Some(resource) => {
                Some(w.clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("{worker} never wrote {resource}"))
}

fn row<'a>(verdict: &'a Value, name: &str) -> &'a Value {
    (verdict["scenarios"].as_array().unwrap().iter())
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no row {name}: {verdict}"))
}

#[test]
fn a_leader_cut_off_in_a_minority_cannot_commit_and_the_majority_moves_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (events, verdict) = run(tmp.path(), "etcd-partition");
    let said = said(&events);
    // Before the cut, every member names one leader.
    let (_, first) = said[0];
    let leader = first.leader.clone().expect("a leader before the cut");
    let term = first.raft_term.unwrap();
    // Cut off, the old leader could not commit A's put: it came back with an error.
    let put = (said.iter()).find(|(_, s)| s.ask == "put").unwrap().1;
    assert_eq!(put.member, leader);
    assert!(
        put.error.is_some(),
        "A's put through the cut-off leader: {put:?}"
    );
    // The majority elected another leader, in a later term.
    let elected = (said.iter())
        .find(|(_, s)| {
            s.ask == "status"
                && s.in_majority == Some(true)
                && s.leader.as_ref().is_some_and(|l| *l != leader)
        })
        .expect("the majority names a new leader")
        .1;
    assert!(elected.raft_term.unwrap() > term, "{elected:?}");
    // A's lease ran out on the majority before B was granted the lock there.
    let b_granted = (events.iter())
        .position(|e| e.is("B:cut", Kind::Acquired))
        .expect("B was granted the lock");
    let gone = (said.iter()).position(|(_, s)| {
        s.ask == "lease_ttl" && s.client.as_deref() == Some("A:cut") && s.ttl_s == Some(-1)
    });
    assert!(gone.is_some(), "the majority read A's lease gone");
    assert!(token_of(&events, "B:cut") > token_of(&events, "A:cut"));
    // A, never asking again, wrote after B: taken unfenced, refused fenced.
    let unfenced = last_write(&events, "A:cut", "failover-etcd-partition-unfenced");
    let fenced = last_write(&events, "A:cut", "failover-etcd-partition-fenced");
    assert_eq!(unfenced.outcome, lockslab::store::Outcome::Accepted);
    assert_eq!(fenced.outcome, lockslab::store::Outcome::Rejected);
    assert!(
        (events.iter().skip(b_granted)).any(|e| e.is("A:cut", Kind::Wrote)),
        "A's late writes come after B's grant"
    );
    // Healed, the old leader follows another member.
    let (_, rejoined) = (said.iter())
        .rev()
        .find(|(_, s)| s.ask == "status" && s.member == leader)
        .unwrap();
    assert!(
        rejoined.leader.as_ref().is_some_and(|l| *l != leader),
        "{rejoined:?}"
    );
    let (unfenced, fenced) = (
        row(&verdict, "etcd-partition-unfenced"),
        row(&verdict, "etcd-partition-fenced"),
    );
    assert_eq!(unfenced["stale_write"]["accepted"], true);
    assert_eq!(fenced["stale_write"]["accepted"], false);
    assert_eq!(fenced["final_writer"], "B:cut");
    assert_run_left_nothing(run_id_of(&events).unwrap());
    assert!(std::fs::read_dir(tmp.path()).unwrap().next().is_none());
}

/// What etcd does to a lease whose keepalives went to the new leader while the old one
/// was stopped is the question; the test asks only that the lab read the answer back from
/// the servers and said it, with the version the members report — and that the fenced
/// store kept whoever held the lock last.
#[test]
fn a_stalled_leader_s_effect_on_a_live_lease_is_read_back_and_said() {
    let tmp = tempfile::tempdir().unwrap();
    let (events, verdict) = run(tmp.path(), "etcd-stall");
    let said = said(&events);
    let version = (said.iter())
        .find_map(|(_, s)| s.version.clone())
        .expect("the members' version");
    assert!(!version.is_empty());
    let stalled = events
        .iter()
        .position(|e| e.kind() == Kind::Frozen)
        .expect("the leader was stopped");
    let woke = events
        .iter()
        .position(|e| e.kind() == Kind::Resumed)
        .expect("and resumed");
    assert!(stalled < woke);
    let (observed_at, observed) = (said.iter())
        .find(|(_, s)| s.ask == "observed")
        .map(|(e, s)| (events.iter().position(|x| x == *e).unwrap(), *s))
        .expect("the lab says what it observed");
    assert!(observed_at > woke);
    let ttl = observed.ttl_s.expect("A's lease read back after the wake");
    let text = &events[observed_at].text;
    assert!(text.contains(&version), "{text}");
    assert!(
        text.contains(if ttl < 0 { "REVOKED" } else { "still alive" }),
        "the words follow the read-back ({ttl}): {text}"
    );
    let row = row(&verdict, "etcd-stall");
    assert_eq!(row["observed"].as_str(), Some(text.as_str()));
    // Fenced, the store took no write of A's after B's, whichever way it went.
    assert_ne!(row["stale_write"]["accepted"], true);
    assert_run_left_nothing(run_id_of(&events).unwrap());
}

/// Every descendant of `root` now.
fn family_of(root: i32) -> HashSet<i32> {
    let mut family = HashSet::from([root]);
    family_in(&process_table(), &mut family);
    family.remove(&root);
    family
}

fn alive(pid: i32) -> bool {
    proc_state(pid).is_some_and(|s| s != 'Z')
}

/// Starts the partition scenario and waits for its cut; returns the lab and every process
/// it runs then (the hosts, their members, the helpers).
fn cut_in_progress(tmp: &Path) -> (std::process::Child, HashSet<i32>) {
    let mut child = on_hosts(tmp, "etcd-partition");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut cut = false;
    for line in lines {
        cut = event_line(&line.unwrap()).is_some_and(|e| e.kind() == Kind::NetFault);
        if cut {
            break;
        }
    }
    assert!(
        cut,
        "the lab ended before its partition: {:?}",
        child.wait()
    );
    let family = family_of(child.id() as i32);
    let names: Vec<String> = (process_table().into_iter())
        .filter(|p| family.contains(&p.pid))
        .map(|p| p.name)
        .collect();
    assert_eq!(
        names.iter().filter(|n| *n == "etcd").count(),
        3,
        "a member per host, children of the lab: {names:?}"
    );
    (child, family)
}

#[test]
fn ctrl_c_mid_partition_leaves_no_host_and_no_member() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, family) = cut_in_progress(tmp.path());
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(
        child.wait().unwrap().code(),
        Some(130),
        "Ctrl-C's exit status"
    );
    for pid in family {
        assert!(!alive(pid), "process {pid} outlived the lab");
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_sigkilled_lab_mid_partition_leaves_no_host_and_no_member() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut child, family) = cut_in_progress(tmp.path());
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || family
            .iter()
            .all(|&p| !alive(p))),
        "a host or a member outlived the SIGKILLed lab"
    );
}
