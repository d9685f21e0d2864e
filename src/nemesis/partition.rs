//! Faults of the network between hosts ([`crate::hosts`]), and a leader's stall.
//!
//! A **partition** cuts the pairs of hosts its sides separate (`m1|m2,m3`: m1 from m2
//! and m3; `m1`: m1 from everyone): every packet between them is dropped, both ways, and
//! nobody is told — no process is touched, and each side goes on running, sure the other
//! has gone quiet. Its **heal** lets the same pairs talk again: the connections that hung
//! resume, nothing restarts. Like every fault, each is recorded before it is done.
//!
//! A **leader stall** is a pause aimed at whoever leads a cluster at that moment — etcd's
//! leader, Redis's primary — long enough for the others to elect another: the old leader
//! wakes up deposed, and may not know it yet.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::{Fault, Nemesis, Note, Record, Victim};
use crate::events::What;
use crate::hosts::{Hosts, Sides};

impl Nemesis {
    /// Cuts apart the hosts `sides` separates, recording it first; the record's words
    /// end with the links it cuts. Returns them.
    pub fn partition(
        &mut self,
        history: &mut impl Record,
        hosts: &Hosts,
        sides: &Sides,
        note: impl Into<Note>,
    ) -> Result<Vec<(String, String)>> {
        let pairs = hosts.pairs_named(sides)?;
        let mut note = note.into();
        note.words = format!("{} (links cut: {})", note.words, links(&pairs));
        history.record(partition_event(Fault::Partition, sides, note));
        self.net
            .entry(sides.to_string())
            .or_insert_with(Instant::now);
        hosts.partition(sides)
    }

    /// Lets the hosts `sides` separates talk again, recording it first with how long the
    /// partition lasted (`lasted_ms`), which it returns.
    pub fn heal_partition(
        &mut self,
        history: &mut impl Record,
        hosts: &Hosts,
        sides: &Sides,
        note: impl Into<Note>,
    ) -> Result<Duration> {
        let lasted =
            (self.net.remove(&sides.to_string())).map_or(Duration::ZERO, |since| since.elapsed());
        let mut note = note.into();
        note.facts.lasted_ms = Some(lasted.as_millis() as u64);
        history.record(partition_event(Fault::Heal, sides, note));
        hosts.heal_sides(sides)?;
        Ok(lasted)
    }

    /// Pauses `leader`, the one that leads now, recorded as a leader's stall; it ends as
    /// any pause does ([`Nemesis::resume`]).
    pub fn stall(
        &mut self,
        history: &mut impl Record,
        leader: &dyn Victim,
        note: impl Into<Note>,
    ) -> Result<()> {
        self.pause_as(Fault::LeaderStall, history, leader, note.into())
    }
}

/// `m1–m2, m1–m3`.
fn links(pairs: &[(String, String)]) -> String {
    if pairs.is_empty() {
        return "none".into();
    }
    let named: Vec<String> = pairs.iter().map(|(a, b)| format!("{a}–{b}")).collect();
    named.join(", ")
}

/// A partition's record: aimed at its sides (no process).
fn partition_event(fault: Fault, sides: &Sides, note: Note) -> crate::events::Event {
    let mut event = super::fault_event(fault, &sides.to_string(), 0, note);
    if let What::NetFault(facts) | What::NetHealed(facts) = &mut event.what {
        facts.pid = None;
    }
    event
}

#[cfg(test)]
mod tests {
    use super::super::schedule::{Action, Schedule, Step};
    use super::*;

    fn step(fault: Fault, target: &str, duration_ms: Option<u64>) -> Step {
        Step {
            at_ms: 100,
            after: None,
            fault,
            target: target.into(),
            duration_ms,
        }
    }

    fn check(steps: Vec<Step>) -> Result<()> {
        Schedule::new(steps).validate(&["A", "B"], &["m1", "m2", "m3", "etcd"])
    }

    #[test]
    fn a_partition_names_hosts_the_run_has_and_a_stall_a_cluster_for_a_time() {
        check(vec![step(Fault::Partition, "m1|m2,m3", None)]).unwrap();
        check(vec![step(Fault::Partition, "A", Some(500))]).unwrap();
        check(vec![step(Fault::Heal, "m1|m2,m3", None)]).unwrap();
        check(vec![step(Fault::LeaderStall, "etcd", Some(2000))]).unwrap();
        assert!(check(vec![step(Fault::Partition, "m1|m9", None)]).is_err());
        assert!(check(vec![step(Fault::Heal, "m1|m2", Some(5))]).is_err());
        assert!(check(vec![step(Fault::LeaderStall, "etcd", None)]).is_err());
        assert!(check(vec![step(Fault::LeaderStall, "nothing", Some(5))]).is_err());
    }

    #[test]
    fn a_timed_partition_heals_itself_and_a_timed_stall_resumes() {
        let schedule = Schedule::new(vec![
            step(Fault::Partition, "m1", Some(400)),
            step(Fault::LeaderStall, "etcd", Some(900)),
        ]);
        let actions: Vec<(u64, Fault, String)> = (schedule.actions().into_iter())
            .map(|a: Action| (a.at_ms, a.fault, a.target))
            .collect();
        assert_eq!(
            actions,
            [
                (100, Fault::Partition, "m1".into()),
                (100, Fault::LeaderStall, "etcd".into()),
                (500, Fault::Heal, "m1".into()),
                (1000, Fault::Resume, "etcd".into()),
            ]
        );
    }
}
