//! The checker of lab 5's etcd-on-hosts scenarios (a leader cut off, a leader stalled):
//! what the members answered and what the store decided, judged from the history alone —
//! the same code for the live verdict and for `lockslab check`.
//!
//! - **mutual exclusion**: after B was granted the lock, did any member of the majority
//!   still count A's lease alive? Read from the lease reads the lab asked of the majority
//!   (`member_said`, `lease_ttl`); none after B's grant leaves it unknown. A B that was
//!   never granted cannot be a second holder.
//! - **stale write**, per resource: did the store take A's write after B's? From the
//!   store's read-back, as every lab-5 row is ([`Scenario::from_store`]).
//! - **observation** (the stall): is there a read of A's lease from the majority after the
//!   old leader woke? The answer — alive or revoked — is what the lab reports; either is
//!   valid here, since which one this etcd gives is the question, not a property.

use anyhow::Result;
use serde_json::Value;

use super::verdict::Scenario;
use crate::check::report::{self, Report};
use crate::check::{Finding, LateWrite};
use crate::events::{Event, Kind, What};
use crate::labs::replay::{self, Replayed};

/// The partition's clients and rows, by the names the history gives them: the same two
/// writes of A's, on a resource with fencing and one without.
pub(super) mod partition {
    pub const A: &str = "A:cut";
    pub const B: &str = "B:cut";
    pub const UNFENCED: &str = "etcd-partition-unfenced";
    pub const FENCED: &str = "etcd-partition-fenced";
}

/// The stall's clients and its row.
pub(super) mod stall {
    pub const A: &str = "A:stall";
    pub const B: &str = "B:stall";
    pub const ROW: &str = "etcd-stall";
}

/// Each row these scenarios write: its name, its clients, and the resource it writes.
const ROWS: [(&str, &str, &str); 3] = [
    (partition::UNFENCED, partition::A, partition::B),
    (partition::FENCED, partition::A, partition::B),
    (stall::ROW, stall::A, stall::B),
];

/// The store's resource of a row (as [`super::Play::resource`] names it).
fn resource_of(row: &str) -> String {
    format!("failover-{row}")
}

/// Is `name` one of these scenarios' rows?
fn is_row(name: &str) -> bool {
    ROWS.iter().any(|(row, ..)| *row == name)
}

/// Two holders, by the members' answers: the finding and the events it rests on.
pub(crate) fn exclusion(history: &[Event], a: &str, b: &str) -> (Finding, Vec<usize>) {
    let Some(granted) = history.iter().position(|e| e.is(b, Kind::Acquired)) else {
        let asked = history.iter().position(|e| e.is(b, Kind::Waiting));
        return (Finding::No, asked.into_iter().collect());
    };
    let lease_reads = (history.iter().enumerate()).filter_map(|(i, e)| match &e.what {
        What::MemberSaid(said)
            if said.ask == "lease_ttl"
                && said.client.as_deref() == Some(a)
                && said.in_majority == Some(true) =>
        {
            Some((i, said.ttl_s?))
        }
        _ => None,
    });
    let after: Vec<(usize, i64)> = lease_reads.filter(|(i, _)| *i > granted).collect();
    if let Some((alive, _)) = after.iter().find(|(_, ttl)| *ttl >= 0) {
        return (Finding::Yes, vec![granted, *alive]);
    }
    match after.first() {
        Some((gone, _)) => (Finding::No, vec![granted, *gone]),
        None => (Finding::Unknown, vec![granted]),
    }
}

/// The read of A's lease from the majority after the stalled leader woke, if any.
fn read_after_wake(history: &[Event], a: &str) -> Option<usize> {
    let woke = history.iter().rposition(|e| e.kind() == Kind::Resumed)?;
    (history.iter().enumerate().skip(woke)).find_map(|(i, e)| match &e.what {
        What::MemberSaid(said)
            if said.ask == "lease_ttl"
                && said.client.as_deref() == Some(a)
                && said.ttl_s.is_some() =>
        {
            Some(i)
        }
        _ => None,
    })
}

/// These scenarios' findings, for every row whose client A is in the history.
pub fn check(history: &[Event]) -> Report {
    let played = ROWS
        .iter()
        .filter(|(_, a, _)| history.iter().any(|e| e.worker == *a));
    let mut reports: Vec<Report> = played
        .map(|&(row, a, b)| check_row(history, row, (a, b)).about(&format!("scenario {row}")))
        .collect();
    if history.iter().any(|e| e.worker == stall::A) {
        let found = read_after_wake(history, stall::A);
        let finding = match found {
            Some(at) => report::Finding::new(
                "observation",
                report::Outcome::Valid,
                "A's lease was read back from the majority after the old leader woke: \
                 what this etcd did is on record",
                [at],
            ),
            None => report::Finding::new(
                "observation",
                report::Outcome::Unknown,
                "no read of A's lease after the old leader woke: this run cannot say \
                 what this etcd does",
                [],
            ),
        };
        reports.push(Report::of([finding]).about(&format!("scenario {}", stall::ROW)));
    }
    Report::compose(reports)
}

fn check_row(history: &[Event], row: &str, (a, b): (&str, &str)) -> Report {
    let resource = resource_of(row);
    let Some(read_at) = history.iter().rposition(|e| {
        matches!(&e.what, What::ReadBack(r) if r.resource.as_deref() == Some(resource.as_str()))
    }) else {
        return Report::evidence_missing(format!(
            "the store's read-back of {resource} is missing from the history"
        ));
    };
    let read = replay::read_back_of(&history[read_at..], Some(&resource))
        .expect("the read-back just found");
    let (two_holders, exclusion_events) = exclusion(history, a, b);
    let found = match Scenario::from_store(row, "etcd", two_holders, None, read, a, b) {
        Ok(found) => found,
        Err(why) => return Report::evidence_missing(format!("{why:#}")),
    };
    // The store's order settles what the members' answers leave open: A, never having
    // let go, wrote after B's grant — two clients acted as holder, whatever etcd granted.
    let exclusion_words = match (found.late.attempted(), two_holders) {
        (true, Finding::No) => {
            "the majority read A's lease gone once B was granted — etcd granted the lock \
             once at a time — but A, never asking again, wrote after B's grant: two clients \
             acted as holder"
        }
        (true, _) => "A wrote after B's grant without having let go: two holders",
        (false, Finding::Yes) => {
            "the majority still counted A's lease alive after it granted B: two holders"
        }
        (false, Finding::No) if history.iter().any(|e| e.is(b, Kind::Acquired)) => {
            "the majority read A's lease gone once B was granted, and A wrote nothing \
             after: one holder at a time"
        }
        (false, Finding::No) => "B was never granted the lock: A was its only holder",
        (false, Finding::Unknown) => {
            "no read of A's lease from the majority after B's grant: unknown"
        }
    };
    let (outcome, stale_words) = match found.late {
        LateWrite::Accepted | LateWrite::Rejected => super::verdict::late_write_decided(found.late),
        LateWrite::None => (
            report::Outcome::Valid,
            "no write of A's was decided after B's: nothing was lost",
        ),
    };
    let writes = (history.iter().enumerate())
        .filter(|(_, e)| {
            e.kind() == Kind::Wrote
                && matches!(&e.what, What::Wrote(w) if w.resource.as_deref() == Some(&resource))
        })
        .map(|(i, _)| i);
    let writes: Vec<usize> = writes.collect();
    let late = (writes.iter().rev())
        .find(|&&i| history[i].worker == a)
        .copied()
        .filter(|_| found.late.attempted());
    Report::exclusion_and_stale_write(
        found.two_holders,
        (exclusion_words, exclusion_events),
        (outcome, stale_words, std::iter::once(read_at).chain(writes)),
        late,
    )
}

/// `lockslab check`: each of these scenarios' rows in the recorded verdict judged again.
pub(super) fn replay_rows(
    events: &[Event],
    verdict: &Value,
    replayed: &mut Replayed,
) -> Result<()> {
    for recorded in replay::list(verdict, "scenarios")? {
        if is_row(replay::text(recorded, "name")?) {
            replay_row(events, recorded, replayed)?;
        }
    }
    Ok(())
}

/// `lockslab check`: a row of these scenarios judged again from the history, as the live
/// run judged it.
fn replay_row(events: &[Event], recorded: &Value, replayed: &mut Replayed) -> Result<()> {
    let name = replay::text(recorded, "name")?;
    let Some(&(_, a, b)) = ROWS.iter().find(|(row, ..)| *row == name) else {
        return Ok(());
    };
    let resource = resource_of(name);
    let read = replayed.read_back_or_recorded(events, Some(&resource), recorded, None)?;
    let (two_holders, _) = exclusion(events, a, b);
    let found = Scenario::from_store(name, "etcd", two_holders, None, read, a, b)?;
    super::verdict::replay_part(recorded, &found, replayed);
    Ok(())
}
