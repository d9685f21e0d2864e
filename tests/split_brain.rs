//! Lab 5's split brain (`lockslab failover --scenario split-brain`): real Redis servers and
//! real Sentinels, each in a network namespace of its own, cut apart by the nemesis. The
//! facts are read from the history the run recorded — each server's own answers — not
//! from the verdict the lab drew from them. Every test needs user namespaces: where the
//! kernel refuses them it fails saying so (a partition test skipped is one never run).

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use lockslab::events::facts::NodeAnswered;
use lockslab::events::{Event, Kind, What};
use lockslab::store::Outcome;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use crate::common::*;

const PLAIN: &str = "split-brain";
const MIN_REPLICAS: &str = "split-brain-min-replicas";

/// Fails loudly where this machine cannot make hosts.
fn hosts_or_fail() {
    if let Some(why) = lockslab::hosts::Hosts::unavailable() {
        panic!(
            "this machine cannot make hosts, so the split brain cannot run here (not \
             skipped: a partition untested is a partition unknown): {why}"
        );
    }
}

/// `lockslab failover --scenario split-brain --json`, its temporary files in `tmp`.
fn split_brain_in(tmp: &Path) -> Child {
    lockslab(&["failover", "--scenario", "split-brain", "--json"])
        .env("TMPDIR", tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting lockslab failover --scenario split-brain")
}

/// Reads the run's lines until the partition is in place (every server it starts is up
/// by then); returns the lines read.
fn until_the_cut(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> Vec<String> {
    let mut read = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let cut = event_line(&line).is_some_and(|e| e.kind() == Kind::NetFault);
        read.push(line);
        if cut {
            return read;
        }
    }
    panic!("the run ended before its partition: {read:?}");
}

/// Everything lockslab started, and the network namespaces they live in.
struct Started {
    family: HashSet<i32>,
    networks: HashSet<String>,
}

impl Started {
    fn now(root: i32) -> Started {
        let mut family = HashSet::from([root]);
        family_in(&process_table(), &mut family);
        family.remove(&root);
        let own = std::fs::read_link("/proc/self/ns/net").ok();
        let networks = (family.iter())
            .filter_map(|pid| std::fs::read_link(format!("/proc/{pid}/ns/net")).ok())
            .filter(|net| Some(net) != own.as_ref())
            .map(|net| net.display().to_string())
            .collect();
        Started { family, networks }
    }

    /// Every server of the run is among them, each in a network of its own. (A Redis
    /// names itself by its address in its process title: `redis-server 10.77.0.4:26379
    /// [sentinel]`.)
    fn holds_the_servers(&self) {
        let commands: Vec<String> = (self.family.iter())
            .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok())
            .filter(|command| command.contains("redis-server"))
            .collect();
        let sentinels = commands.iter().filter(|c| c.contains(":26379")).count();
        assert_eq!(sentinels, 3, "{commands:?}");
        assert_eq!(
            commands.len(),
            5,
            "a primary, a replica, 3 Sentinels: {commands:?}"
        );
        assert!(self.networks.len() >= 5, "{:?}", self.networks);
    }

    /// Nothing of it is left: no process, none stopped or a zombie, and no process
    /// anywhere in one of its networks.
    fn all_gone(&self) {
        let dead = |pid: &i32| matches!(proc_state(*pid), None | Some('Z'));
        let gone = eventually(Duration::from_secs(15), || {
            self.family.iter().all(dead) && self.still_in_networks().is_empty()
        });
        assert!(
            gone,
            "left behind: {:?}, in the hosts' networks: {:?}",
            (self.family.iter())
                .filter(|pid| !dead(pid))
                .map(|pid| (pid, proc_state(*pid)))
                .collect::<Vec<_>>(),
            self.still_in_networks()
        );
    }

    fn still_in_networks(&self) -> Vec<String> {
        (std::fs::read_dir("/proc").unwrap().flatten())
            .filter_map(|entry| std::fs::read_link(entry.path().join("ns/net")).ok())
            .map(|link| link.display().to_string())
            .filter(|net| self.networks.contains(net))
            .collect()
    }
}

/// One round's events, in order, with their place in the history.
fn round<'a>(events: &'a [Event], name: &str) -> Vec<(usize, &'a Event)> {
    (events.iter().enumerate())
        .filter(|(_, e)| e.part.scenario.as_deref() == Some(name))
        .collect()
}

fn position(round: &[(usize, &Event)], kind: Kind) -> usize {
    (round.iter())
        .find(|(_, e)| e.kind() == kind)
        .unwrap_or_else(|| panic!("no {kind} in the round"))
        .0
}

/// What `node` answered between two places of the history.
fn answers<'a>(
    round: &[(usize, &'a Event)],
    node: &str,
    after: usize,
    before: usize,
) -> Vec<&'a NodeAnswered> {
    (round.iter())
        .filter(|(i, _)| *i > after && *i < before)
        .filter_map(|(_, e)| match &e.what {
            What::NodeAnswered(n) if n.node == node => Some(n),
            _ => None,
        })
        .collect()
}

/// A's writes to the old primary after the cut: (number, outcome, the server's words).
fn writes_after_cut(round: &[(usize, &Event)], cut: usize) -> Vec<(u64, Outcome, String)> {
    (round.iter())
        .filter(|(i, e)| *i > cut && e.worker == "A")
        .filter_map(|(_, e)| match &e.what {
            What::Wrote(w) if w.resource.as_deref() == Some("redis:writes") => {
                Some((w.value.as_deref()?.parse().ok()?, w.outcome, e.text.clone()))
            }
            _ => None,
        })
        .collect()
}

/// The round's facts, from the servers' answers in its history: two primaries while cut
/// apart (and, without min-replicas, two holders), the old primary demoted after the heal,
/// and every write it acknowledged after the cut gone from it. Returns A's writes after the
/// cut.
fn two_primaries_then_writes_lost(events: &[Event], name: &str) -> Vec<(u64, Outcome, String)> {
    let round = round(events, name);
    let (cut, healed) = (
        position(&round, Kind::NetFault),
        position(&round, Kind::NetHealed),
    );
    let old = answers(&round, "primary", cut, healed);
    let new = answers(&round, "replica", cut, healed);
    assert!(
        old.iter().any(|n| n.role.as_deref() == Some("master")),
        "{name}: {old:?}"
    );
    assert!(
        new.iter().any(|n| n.role.as_deref() == Some("master")),
        "{name}: {new:?}"
    );
    // The new primary holds B's key (B took the lock there).
    let holder = |n: &&NodeAnswered| {
        (n.lock_pttl_ms.is_some_and(|p| p > 0))
            .then(|| n.lock_owner.clone().unwrap_or_default()[..1].to_string())
    };
    assert!(new.iter().filter_map(holder).any(|h| h == "B"), "{new:?}");
    if name == PLAIN {
        // A renews its key on the old primary all along: it still holds it there.
        assert!(old.iter().filter_map(holder).any(|h| h == "A"), "{old:?}");
    }
    // A Sentinel names the promoted replica during the cut (the one B asked), and all
    // three do once it is over.
    let names_replica = |sentinel: &str, after: usize, before: usize| {
        (answers(&round, sentinel, after, before).iter()).any(|s| {
            s.primary
                .as_deref()
                .is_some_and(|a| a.starts_with("10.77.0.3:"))
        })
    };
    let sentinels = ["sentinel-1", "sentinel-2", "sentinel-3"];
    assert!(sentinels.iter().any(|s| names_replica(s, cut, healed)));
    assert!(
        sentinels
            .iter()
            .all(|s| names_replica(s, healed, usize::MAX))
    );

    let after = answers(&round, "primary", healed, usize::MAX);
    let last = after
        .last()
        .unwrap_or_else(|| panic!("{name}: not read after the heal"));
    assert_eq!(last.role.as_deref(), Some("slave"), "{last:?}");
    let held = last.writes_held.clone().unwrap();
    let writes = writes_after_cut(&round, cut);
    let acked: Vec<u64> = (writes.iter())
        .filter(|w| w.1 == Outcome::Accepted)
        .map(|w| w.0)
        .collect();
    assert!(
        !acked.is_empty(),
        "{name}: the old primary acknowledged nothing"
    );
    let kept: Vec<&u64> = acked.iter().filter(|n| held.contains(n)).collect();
    assert!(
        kept.is_empty(),
        "{name}: the demoted old primary still holds writes it acknowledged after the cut: \
         {kept:?}"
    );
    assert!(!held.is_empty(), "the writes from before the cut are kept");
    writes
}

/// The store's record of a round: B's write taken, then A's refused.
fn store_refused_a(events: &[Event], name: &str) {
    let resource = format!("failover-{name}");
    let record = (events.iter().rev())
        .find_map(|e| match &e.what {
            What::ReadBack(r) if r.resource.as_deref() == Some(&resource) => Some(r),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no read-back of {resource}"));
    let said: Vec<(&str, bool)> = (record.attempts.iter())
        .map(|a| (a.writer.as_str(), a.accepted))
        .collect();
    assert_eq!(said, [("B", true), ("A", false)], "{name}");
}

#[test]
fn the_split_brain_shows_two_primaries_and_loses_the_old_primarys_writes() {
    hosts_or_fail();
    let tmp = tempfile::tempdir().unwrap();
    let mut child = split_brain_in(tmp.path());
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut read = until_the_cut(&mut lines);
    let started = Started::now(child.id() as i32);
    started.holds_the_servers();
    read.extend(lines.map(Result::unwrap));
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    started.all_gone();
    // The servers' files (configurations with the password, sockets, logs) went with them.
    let left: Vec<_> = (std::fs::read_dir(tmp.path()).unwrap().flatten())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("lockslab-"))
        .collect();
    assert!(left.is_empty(), "left in the temp dir: {left:?}");
    let stdout = read.join("\n") + "\n";
    let (events, verdict) = events_and_verdict(&stdout);

    let plain = two_primaries_then_writes_lost(&events, PLAIN);
    assert!(
        plain
            .iter()
            .all(|w| w.1 == Outcome::Accepted || w.1 == Outcome::Unknown),
        "without min-replicas the old primary refuses nothing: {plain:?}"
    );
    // With min-replicas-to-write 1 the old primary acknowledges for a while, then refuses
    // with NOREPLICAS, and acknowledges nothing after its first refusal.
    let limited = two_primaries_then_writes_lost(&events, MIN_REPLICAS);
    let first_refusal = (limited.iter())
        .position(|w| w.1 == Outcome::Rejected)
        .unwrap_or_else(|| panic!("the old primary never refused: {limited:?}"));
    assert!(
        limited[first_refusal].2.contains("NOREPLICAS"),
        "{limited:?}"
    );
    assert!(
        !limited[first_refusal..]
            .iter()
            .any(|w| w.1 == Outcome::Accepted),
        "{limited:?}"
    );
    for name in [PLAIN, MIN_REPLICAS] {
        store_refused_a(&events, name);
    }

    // The verdict says what the history shows, and `lockslab check` reproduces it.
    let rows = verdict["split_brain"].as_array().unwrap();
    let row = |name: &str| rows.iter().find(|r| r["name"] == name).unwrap().clone();
    assert_eq!(row(PLAIN)["two_holders"], true);
    for r in [row(PLAIN), row(MIN_REPLICAS)] {
        assert_eq!(r["two_primaries"], true, "{r}");
        assert!(r["two_holders"].is_boolean(), "{r}");
        assert_eq!(r["old_primary_demoted"], true, "{r}");
        assert_eq!(r["a_acked_lost"], r["a_acked_after_cut"], "{r}");
        assert_eq!(r["store_refused_a"], true, "{r}");
    }
    assert_eq!(row(PLAIN)["a_first_refused_ms"], Value::Null);
    assert!(row(MIN_REPLICAS)["a_first_refused_ms"].is_u64());
    let saved = tmp.path().join("run.jsonl");
    std::fs::write(&saved, &stdout).unwrap();
    let check = lockslab_offline(&["check", saved.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

#[test]
fn the_split_brain_leaves_nothing_after_ctrl_c_or_sigkill() {
    hosts_or_fail();
    for signal in [Signal::SIGINT, Signal::SIGKILL] {
        let tmp = tempfile::tempdir().unwrap();
        let mut child = split_brain_in(tmp.path());
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        until_the_cut(&mut lines);
        let started = Started::now(child.id() as i32);
        started.holds_the_servers();
        kill(Pid::from_raw(child.id() as i32), signal).unwrap();
        // Read to the end: a closed pipe would end it another way (141).
        lines.for_each(drop);
        let status = child.wait().unwrap();
        if signal == Signal::SIGINT {
            assert_eq!(status.code(), Some(130), "{signal}");
        }
        started.all_gone();
    }
}

/// The lab's checker on a recorded run (tests/fixtures/failover-split-brain.jsonl): each
/// finding decided from the servers' recorded answers, and unknown — never a pass — once
/// the answer that decides it is taken out of the history.
#[test]
fn the_checker_decides_from_the_recorded_answers_and_is_unknown_without_them() {
    use lockslab::check::report::Outcome as Found;
    let (events, _) = events_and_verdict(include_str!("fixtures/failover-split-brain.jsonl"));
    let outcome = |events: &[Event], finding: &str| {
        let report = lockslab::labs::failover::check(events);
        (report.findings.iter())
            .find(|f| f.name == format!("{finding} (scenario {PLAIN})"))
            .unwrap_or_else(|| panic!("no {finding}: {report:?}"))
            .outcome
    };
    assert_eq!(outcome(&events, "one primary"), Found::Invalid);
    assert_eq!(outcome(&events, "mutual exclusion"), Found::Invalid);
    assert_eq!(outcome(&events, "acknowledged writes"), Found::Invalid);
    assert_eq!(outcome(&events, "stale write"), Found::Valid);

    // Without the old primary's answers after the heal, nobody knows what it kept.
    let round = round(&events, PLAIN);
    let healed = position(&round, Kind::NetHealed);
    let without: Vec<Event> = (events.iter().enumerate())
        .filter(|(i, e)| !(*i > healed && e.worker == "primary"))
        .map(|(_, e)| e.clone())
        .collect();
    assert_eq!(outcome(&without, "acknowledged writes"), Found::Unknown);
    // Without the new primary's answers during the cut, neither two primaries nor two
    // holders can be told.
    let without: Vec<Event> = (events.iter().enumerate())
        .filter(|(i, e)| !(*i < healed && e.worker == "replica"))
        .map(|(_, e)| e.clone())
        .collect();
    assert_eq!(outcome(&without, "one primary"), Found::Unknown);
    assert_eq!(outcome(&without, "mutual exclusion"), Found::Unknown);
}
