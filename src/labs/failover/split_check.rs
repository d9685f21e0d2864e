//! Lab 5's split brain judged from its history: the same function makes the live verdict's
//! rows and `lockslab check`'s, from the servers' answers the run recorded
//! ([`What::NodeAnswered`]), A's writes as the old primary answered them, the partition and
//! its heal as the nemesis did them, and the store's read-back.
//!
//! Four questions per round, each answered from the servers' words or left unknown:
//!
//! - **one primary?** Did two Redis nodes answer `ROLE` with `master` while the hosts were
//!   cut apart?
//! - **one holder?** Did both hold the lock's key, for different owners, over a common
//!   moment? Each answer comes with its PTTL: a key read at `t` with PTTL `p` lives until
//!   `t + p` on that server's word, so two keys overlap when each was read before the
//!   other's ran out.
//! - **acknowledged writes kept?** Of A's writes the old primary answered with a length
//!   after the cut, which does the demoted old primary still hold once it has synced from
//!   the new primary?
//! - **stale write?** Did the store take A's write after B's (its decision order)?

use std::time::Duration;

use colored::Colorize;
use serde::Serialize;
use serde_json::Value;

use crate::check::report::{Finding, Outcome, Report};
use crate::events::facts::NodeAnswered;
use crate::events::{Event, Kind, What};
use crate::labs::replay::{self, Replayed};
use crate::labs::words::Words;
use crate::output::human;
use crate::store::Outcome as WriteOutcome;

/// The rounds' names, as their events' `scenario` tag carries them.
pub const PLAIN: &str = "split-brain";
pub const MIN_REPLICAS: &str = "split-brain-min-replicas";

/// The hosts of the two data nodes, as the history names them.
pub const OLD_PRIMARY: &str = "primary";
pub const REPLICA: &str = "replica";

/// The store's resource a round's two holders write.
pub fn resource_of(round: &str) -> String {
    format!("failover-{round}")
}

/// One round's row of the verdict, every field computed from the round's events.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct SplitRow {
    pub name: String,
    /// Both data nodes answered `ROLE: master` during the cut.
    pub two_primaries: Option<bool>,
    /// Both held the lock's key, for A and for B, over a common moment.
    pub two_holders: Option<bool>,
    /// A's writes the old primary acknowledged after the cut, and when the last one was
    /// acknowledged (ms after the cut).
    pub a_acked_after_cut: u64,
    pub a_last_acked_ms: Option<u64>,
    /// When the old primary first refused one of A's writes after the cut (ms after it).
    pub a_first_refused_ms: Option<u64>,
    /// After the heal, the old primary answered `ROLE: slave`.
    pub old_primary_demoted: Option<bool>,
    /// Of the writes acknowledged after the cut, how many the demoted old primary lacks.
    pub a_acked_lost: Option<u64>,
    /// The store refused A's write (decided after B's); null when A made none.
    pub store_refused_a: Option<bool>,
    pub a_token: Option<i64>,
    pub b_token: Option<i64>,
}

/// What one round's history holds, found once: the positions (in the round's events) of
/// what each finding points at.
struct Round<'h> {
    events: Vec<(usize, &'h Event)>,
    cut: Option<(usize, u64)>,
    healed: Option<(usize, u64)>,
}

impl<'h> Round<'h> {
    fn of(history: &'h [Event], name: &str) -> Round<'h> {
        let events: Vec<(usize, &Event)> = (history.iter().enumerate())
            .filter(|(_, e)| e.part.scenario.as_deref() == Some(name))
            .collect();
        let at = |kind: Kind| {
            (events.iter())
                .find(|(_, e)| e.kind() == kind)
                .map(|(i, e)| (*i, e.t_ms))
        };
        Round {
            cut: at(Kind::NetFault),
            healed: at(Kind::NetHealed),
            events,
        }
    }

    /// The answers of `node` recorded between the history's positions `from` and `to`
    /// (both excluded).
    fn answers(&self, node: &str, from: usize, to: usize) -> Vec<(usize, u64, &'h NodeAnswered)> {
        (self.events.iter())
            .filter(|(i, _)| *i > from && *i < to)
            .filter_map(|(i, e)| match &e.what {
                What::NodeAnswered(n) if n.node == node => Some((*i, e.t_ms, n)),
                _ => None,
            })
            .collect()
    }

    fn during_cut(&self, node: &str) -> Vec<(usize, u64, &'h NodeAnswered)> {
        match (self.cut, self.healed) {
            (Some((from, _)), Some((to, _))) => self.answers(node, from, to),
            (Some((from, _)), None) => self.answers(node, from, usize::MAX),
            _ => Vec::new(),
        }
    }

    /// A's writes to the old primary: (position, time, number, outcome).
    fn a_writes(&self) -> Vec<(usize, u64, u64, WriteOutcome)> {
        (self.events.iter())
            .filter_map(|(i, e)| match &e.what {
                What::Wrote(w)
                    if e.worker == "A" && w.resource.as_deref() == Some(WRITES_RESOURCE) =>
                {
                    let number = w.value.as_deref()?.parse().ok()?;
                    Some((*i, e.t_ms, number, w.outcome))
                }
                _ => None,
            })
            .collect()
    }
}

/// The resource A's Redis writes name in the history (the list on the old primary).
pub const WRITES_RESOURCE: &str = "redis:writes";

/// Two masters in one round, during the cut: the first answer of each that said so.
fn two_primaries(round: &Round) -> (Option<bool>, Vec<usize>) {
    let master = |node| {
        (round.during_cut(node).into_iter()).find(|(_, _, n)| n.role.as_deref() == Some("master"))
    };
    let asked = !round.during_cut(REPLICA).is_empty() && !round.during_cut(OLD_PRIMARY).is_empty();
    match (master(OLD_PRIMARY), master(REPLICA)) {
        (Some(old), Some(new)) => (Some(true), vec![old.0, new.0]),
        _ if asked => (Some(false), Vec::new()),
        _ => (None, Vec::new()),
    }
}

/// Both keys alive over a common moment, for two owners, on the servers' own PTTLs.
fn two_holders(round: &Round) -> (Option<bool>, Vec<usize>) {
    let held = |node| -> Vec<(usize, u64, u64, String)> {
        (round.during_cut(node).into_iter())
            .filter_map(|(i, t, n)| {
                let pttl = n.lock_pttl_ms.filter(|p| *p > 0)?;
                Some((i, t, t + pttl as u64, n.lock_owner.clone()?))
            })
            .collect()
    };
    let (old, new) = (held(OLD_PRIMARY), held(REPLICA));
    for a in &old {
        for b in &new {
            // Each read before the other's key ran out: both alive at the later read.
            if a.3 != b.3 && a.1 < b.2 && b.1 < a.2 {
                return (Some(true), vec![a.0, b.0]);
            }
        }
    }
    let asked = !round.during_cut(REPLICA).is_empty();
    (asked.then_some(false), Vec::new())
}

/// What became of A's writes to the old primary after the cut.
struct WritesFate {
    acked: u64,
    last_acked_ms: Option<u64>,
    first_refused_ms: Option<u64>,
    /// The old primary's last answer after the heal said `slave`; its place.
    demoted: Option<bool>,
    read_after_heal: Option<usize>,
    /// The acknowledged writes that answer lacks, by their place in the history.
    lost: Option<Vec<usize>>,
}

fn writes_fate(round: &Round) -> WritesFate {
    let writes = round.a_writes();
    // After the cut in the history's order, not on its millisecond clock: the write the
    // cut was timed from can carry the cut's own millisecond.
    let after_cut = |position: usize| round.cut.is_some_and(|(cut, _)| position > cut);
    let acked: Vec<_> = (writes.iter())
        .filter(|w| after_cut(w.0) && w.3 == WriteOutcome::Accepted)
        .collect();
    let since_cut = |t: u64| t.saturating_sub(round.cut.map_or(0, |(_, at)| at));
    // The old primary's answers after the heal: the last one says where it ended.
    let after_heal = (round.healed)
        .map(|(at, _)| round.answers(OLD_PRIMARY, at, usize::MAX))
        .unwrap_or_default();
    let last = after_heal.last();
    WritesFate {
        acked: acked.len() as u64,
        last_acked_ms: acked.last().map(|w| since_cut(w.1)),
        first_refused_ms: (writes.iter())
            .find(|w| after_cut(w.0) && w.3 == WriteOutcome::Rejected)
            .map(|w| since_cut(w.1)),
        demoted: last.map(|(_, _, n)| n.role.as_deref() == Some("slave")),
        read_after_heal: last.map(|(at, _, _)| *at),
        lost: last.and_then(|(_, _, n)| {
            let held = n.writes_held.as_ref()?;
            Some(
                (acked.iter())
                    .filter(|w| !held.contains(&w.2))
                    .map(|w| w.0)
                    .collect(),
            )
        }),
    }
}

/// What the store's read-back of the round says of A's write.
struct StoreFate {
    read: bool,
    at: Option<usize>,
    /// A's attempt decided after B's accepted one: taken (stale) or refused.
    late_taken: Option<bool>,
    a_token: Option<i64>,
    b_token: Option<i64>,
}

fn store_fate(history: &[Event], round: &Round, name: &str) -> StoreFate {
    let from = round.events.first().map_or(0, |e| e.0);
    let store = replay::read_back_of(&history[from..], Some(&resource_of(name)));
    let token_of = |writer: &str| {
        (store.as_ref()).and_then(|s| s.attempts.iter().find(|a| a.writer == writer)?.token)
    };
    let late_taken = store.as_ref().and_then(|s| {
        let b = s.attempts.iter().find(|a| a.writer == "B" && a.accepted)?;
        let mut after_b = s.attempts.iter().filter(|a| a.decided > b.decided);
        Some(after_b.find(|a| a.writer == "A")?.accepted)
    });
    StoreFate {
        read: store.is_some(),
        at: read_back_at(history, &resource_of(name)),
        late_taken,
        a_token: token_of("A"),
        b_token: token_of("B"),
    }
}

/// The round's row and its findings, from its events; positions are in `history`.
fn judge(history: &[Event], name: &str) -> (SplitRow, Report) {
    let round = Round::of(history, name);
    let (primaries, primaries_at) = two_primaries(&round);
    let (holders, holders_at) = two_holders(&round);
    let writes = writes_fate(&round);
    let store = store_fate(history, &round, name);
    let row = SplitRow {
        name: name.into(),
        two_primaries: primaries,
        two_holders: holders,
        a_acked_after_cut: writes.acked,
        a_last_acked_ms: writes.last_acked_ms,
        a_first_refused_ms: writes.first_refused_ms,
        old_primary_demoted: writes.demoted,
        a_acked_lost: writes.lost.as_ref().map(|l| l.len() as u64),
        store_refused_a: store.late_taken.map(|taken| !taken),
        a_token: store.a_token,
        b_token: store.b_token,
    };
    let with_cut = |mut at: Vec<usize>| {
        at.extend(round.cut.map(|(i, _)| i));
        at
    };
    let findings = [
        Finding::new(
            "one primary",
            Outcome::broken_when(primaries),
            match primaries {
                Some(true) => {
                    "the old primary and the promoted replica both answered ROLE: master during the cut"
                }
                Some(false) => "only one node answered ROLE: master during the cut",
                None => "no node was asked during the cut: the history cannot say",
            },
            with_cut(primaries_at),
        ),
        Finding::new(
            "mutual exclusion",
            Outcome::broken_when(holders),
            match holders {
                Some(true) => {
                    "the old primary held A's key and the new primary B's, each read before the other's PTTL ran out"
                }
                Some(false) => "no two keys for two owners were alive at once on the two primaries",
                None => "the new primary was not asked during the cut: the history cannot say",
            },
            with_cut(holders_at),
        ),
        lost_writes_finding(&writes, round.healed.map(|(i, _)| i)),
        stale_write_finding(&store),
    ];
    (row, Report::of(findings).about(&format!("scenario {name}")))
}

fn lost_writes_finding(writes: &WritesFate, healed_at: Option<usize>) -> Finding {
    let (outcome, words) = match (&writes.lost, writes.demoted) {
        (Some(lost), Some(true)) if !lost.is_empty() => (
            Outcome::Invalid,
            "writes the old primary acknowledged after the cut are gone from it once Sentinel made it a replica",
        ),
        (Some(_), Some(true)) => (
            Outcome::Valid,
            "the demoted old primary holds every write it acknowledged after the cut",
        ),
        _ => (
            Outcome::Unknown,
            "the old primary was not read back as a replica after the heal: the history cannot say",
        ),
    };
    let mut at = writes.lost.clone().unwrap_or_default();
    at.extend(writes.read_after_heal);
    at.extend(healed_at);
    Finding::new("acknowledged writes", outcome, words, at)
}

fn stale_write_finding(store: &StoreFate) -> Finding {
    let (outcome, words) = match store.late_taken {
        Some(true) => (
            Outcome::Invalid,
            "the store decided A's write after B's and took it",
        ),
        Some(false) => (
            Outcome::Valid,
            "the store decided A's write after B's and refused it: A's token is lower",
        ),
        None if store.read => (Outcome::Valid, "the store has no write of A's after B's"),
        None => (
            Outcome::Unknown,
            "the store's read-back is missing from the history",
        ),
    };
    Finding::new("stale write", outcome, words, store.at)
}

/// Where the history holds the store's last read-back of `resource`.
fn read_back_at(history: &[Event], resource: &str) -> Option<usize> {
    history.iter().rposition(
        |e| matches!(&e.what, What::ReadBack(r) if r.resource.as_deref() == Some(resource)),
    )
}

/// The rounds this history played, in order.
fn rounds_in(history: &[Event]) -> Vec<&'static str> {
    [PLAIN, MIN_REPLICAS]
        .into_iter()
        .filter(|name| {
            (history.iter()).any(|e| e.part.scenario.as_deref() == Some(*name) && e.worker == "A")
        })
        .collect()
}

/// The verdict's rows, from the history.
pub fn rows(history: &[Event]) -> Vec<SplitRow> {
    (rounds_in(history).into_iter())
        .map(|name| judge(history, name).0)
        .collect()
}

/// The split brain's part of lab 5's checker: every round's findings.
pub fn check(history: &[Event]) -> Report {
    Report::compose((rounds_in(history).into_iter()).map(|name| judge(history, name).1))
}

/// `lockslab check`: each recorded round against the one its events give now.
pub fn replay(events: &[Event], recorded: &[Value], replayed: &mut Replayed) {
    for row in recorded {
        let Some(name) = row["name"].as_str() else {
            continue;
        };
        let (again, _) = judge(events, name);
        replayed.part(name, row, again);
    }
}

/// A round in the run's one-line headline.
pub fn headline(row: &SplitRow) -> String {
    let lost = match row.a_acked_lost {
        Some(lost) => format!("{lost} acknowledged writes lost"),
        None => "writes unknown".into(),
    };
    format!(
        "{}: {}, {lost}",
        row.name,
        crate::room::holders_word(row.two_holders)
    )
}

/// The split brain's table, a sentence per round, and what the settings do and do not buy.
pub fn words(words: &mut Words, rows: &[SplitRow]) {
    let yes_no = |v: Option<bool>| match v {
        Some(true) => "YES".red().bold().to_string(),
        Some(false) => "no".green().to_string(),
        None => "-".to_string(),
    };
    let ms = |v: Option<u64>| {
        v.map_or("-".into(), |ms| {
            format!("+{}", human(Duration::from_millis(ms)))
        })
    };
    let table: Vec<Vec<String>> = (rows.iter())
        .map(|r| {
            let lost = match r.a_acked_lost {
                Some(0) => "none".green().to_string(),
                Some(n) => format!("{n} of {}", r.a_acked_after_cut)
                    .red()
                    .bold()
                    .to_string(),
                None => "-".into(),
            };
            let store = match r.store_refused_a {
                Some(true) => "refused A".green().to_string(),
                Some(false) => "TOOK A's".red().bold().to_string(),
                None => "-".into(),
            };
            vec![
                r.name.clone(),
                yes_no(r.two_primaries),
                yes_no(r.two_holders),
                r.a_acked_after_cut.to_string(),
                ms(r.a_last_acked_ms),
                lost,
                store,
            ]
        })
        .collect();
    let header = [
        "split brain",
        "2 primaries",
        "2 holders",
        "A acked after cut",
        "last ack",
        "lost on heal",
        "store",
    ];
    words
        .blank()
        .heading("Split brain")
        .table(&header, table)
        .blank();
    for row in rows {
        words.about(row.name.clone(), meaning(row));
    }
    words.blank();
    for line in [
        "Once a quorum of Sentinels call the primary down, one of them, elected",
        "by a majority of all the Sentinels, promotes a replica; nothing tells",
        "the old primary, which goes on acknowledging its clients. When the",
        "Sentinels see it again they make it a replica of the new primary, and",
        "it replaces its data with the new primary's: what it acknowledged since",
        "the cut is gone. min-replicas-to-write 1 makes it refuse writes once no",
        "replica has reported for over min-replicas-max-lag seconds (they report",
        "every second): the window shrinks to those seconds, it does not close.",
        "The token from Postgres is drawn after each grant, so B's is higher and",
        "the store refuses A whatever either Redis says.",
    ] {
        words.aside(line);
    }
}

/// A round's sentence, every number from its row.
fn meaning(row: &SplitRow) -> String {
    let primaries = match row.two_primaries {
        Some(true) => "both nodes answered ROLE master during the cut",
        Some(false) => "one primary at a time",
        None => "roles not read during the cut",
    };
    let window = match (row.a_last_acked_ms, row.a_first_refused_ms) {
        (Some(last), Some(refused)) => format!(
            "the old primary acknowledged {} of A's writes after the cut, the last {}ms after \
             it, and refused from {}ms",
            row.a_acked_after_cut, last, refused
        ),
        (Some(last), None) => format!(
            "the old primary acknowledged {} of A's writes after the cut, the last {}ms after it",
            row.a_acked_after_cut, last
        ),
        (None, Some(refused)) => {
            format!("the old primary refused A's writes from {refused}ms after the cut")
        }
        (None, None) => "A made no write after the cut".into(),
    };
    let heal = match (row.old_primary_demoted, row.a_acked_lost) {
        (Some(true), Some(lost)) => {
            format!(
                "demoted on heal, it kept {} of them",
                row.a_acked_after_cut - lost
            )
        }
        _ => "its state after the heal was not read".into(),
    };
    let tokens = match (row.a_token, row.b_token) {
        (Some(a), Some(b)) => format!("tokens A {a}, B {b}"),
        _ => "no tokens".into(),
    };
    format!("{primaries}; {window}; {heal}; {tokens}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::facts::FaultFacts;

    /// An event of the plain round at `t_ms`.
    fn at(t_ms: u64, worker: &str, what: What) -> Event {
        let mut event = Event::new(worker, what, "");
        event.t_ms = t_ms;
        event.part.scenario = Some(PLAIN.into());
        event
    }

    /// A data node's answer: master, holding `owner`'s key with `pttl_ms` left.
    fn holds(t_ms: u64, node: &str, owner: &str, pttl_ms: i64) -> Event {
        let answered = NodeAnswered {
            node: node.into(),
            role: Some("master".into()),
            lock_owner: Some(owner.into()),
            lock_pttl_ms: Some(pttl_ms),
            ..NodeAnswered::default()
        };
        at(t_ms, node, What::NodeAnswered(answered))
    }

    fn holders(old_key: (u64, i64), new_read_at: u64) -> Option<bool> {
        let history = [
            at(
                0,
                "A",
                What::Wrote(crate::events::facts::Wrote::new(WriteOutcome::Accepted)),
            ),
            at(10, "lab", What::NetFault(FaultFacts::default())),
            holds(old_key.0, OLD_PRIMARY, "A-1", old_key.1),
            holds(new_read_at, REPLICA, "B-1", 3000),
        ];
        rows(&history)[0].two_holders
    }

    /// A key read at `t` with PTTL `p` lives until `t + p` on its server's word: B's key
    /// read after that proves nothing about overlap, read before it proves two holders.
    #[test]
    fn two_holders_need_both_keys_alive_at_the_later_read() {
        assert_eq!(holders((100, 50), 149), Some(true));
        assert_eq!(holders((100, 50), 150), Some(false));
        assert_eq!(holders((100, 50), 400), Some(false));
        // A key with no time left (-2: none) holds nothing.
        assert_eq!(holders((100, -2), 101), Some(false));
    }
}
