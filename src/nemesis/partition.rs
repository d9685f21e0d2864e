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

use anyhow::{Result, bail};

use super::schedule::Step;
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

/// Does this step name a partition's sides (a partition, or the heal of one written as
/// its sides), rather than one process or proxy path?
pub fn names_sides(step: &Step) -> bool {
    step.fault == Fault::Partition
        || (step.fault == Fault::Heal && step.target.contains(['|', ',']))
}

/// Checks a partition's sides against the run: each names hosts, and a host is named
/// after what runs in it (a worker, a server).
pub fn validate(step: &Step, workers: &[&str], servers: &[&str]) -> Result<()> {
    let sides: Sides = step.target.parse()?;
    let hosts: Vec<&str> = workers.iter().chain(servers).copied().collect();
    sides.pairs(&hosts)?;
    if step.duration_ms.is_some() && step.fault != Fault::Partition {
        bail!(
            "a heal takes no duration_ms ({} at {} ms)",
            step.target,
            step.at_ms
        );
    }
    Ok(())
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
