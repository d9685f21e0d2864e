//! Lab 10's checker: the whole history of a run — every way of queueing, the churn, the
//! expiry and the election — judged as one [`Report`].
//!
//! It decides nothing of its own: each part goes through the code its verdict is built
//! with ([`QueueVerdict::new`], [`ChurnVerdict::from_history`],
//! [`ExpiryVerdict::from_history`], [`ElectionVerdict::from_history`]), and this module only
//! says which of their facts is a broken property and which events prove it.

use std::time::Duration;

use super::verdict::{ExpiryVerdict, QueueVerdict};
use super::verdict_churn::{ChurnVerdict, ElectionVerdict};
use crate::check::queue::Woken;
use crate::check::report::{Finding, Outcome, Report};
use crate::events::{Event, Kind, What};
use crate::labs::replay;

/// A part's judge: its findings, with event positions in the part's own events.
type Judge = fn(&[Event]) -> Report;

/// The parts the lab tags with a `scenario` and reads back from the store, each with its
/// judge.
const PARTS: [(&str, Judge); 3] = [("churn", churn), ("expiry", expiry), ("election", election)];

/// Lab 10's checker: each way of queueing (its `handovers` event: every turn and the
/// servers' counts) gives two findings — **first come, first served** (by the backend's
/// tokens) and **tokens grow** (nobody held twice, no token shared); the churn, expiry and
/// election parts (picked by their `scenario` tag) give what the backend's and the store's
/// answers say of them. A part whose history lacks the store's read-back is unknown, with
/// the reason. Each finding's events are positions in `history`.
pub fn check(history: &[Event]) -> Report {
    let ways = history
        .iter()
        .enumerate()
        .filter_map(|(at, event)| match &event.what {
            What::Handovers(queue) => Some(
                way(&QueueVerdict::new(
                    &queue.way,
                    &queue.turns,
                    queue.server.clone(),
                ))
                .shifted(at)
                .about(&format!("queue {}", queue.way)),
            ),
            _ => None,
        });
    let parts = PARTS.iter().filter_map(|(part, judge)| {
        let (positions, log) =
            replay::part_with_positions(history, |e| e.part.scenario.as_deref() == Some(part));
        (!log.is_empty()).then(|| judge(&log).placed(&positions).about(part))
    });
    Report::compose(ways.chain(parts))
}

/// One way of queueing, from its `handovers` event (position 0).
fn way(queue: &QueueVerdict) -> Report {
    let facts = &queue.facts;
    let order: Vec<String> = facts.order_got.iter().map(u32::to_string).collect();
    let order = format!(
        "served, by token, in this order of asking: {}",
        order.join(" ")
    );
    let fairness = if facts.fair {
        Finding::new("first come, first served", Outcome::Valid, order, [0])
    } else {
        let never = match facts.never_served {
            0 => String::new(),
            n => format!("; {n} never served"),
        };
        Finding::new(
            "first come, first served",
            Outcome::Invalid,
            format!("{order} ({} overtakes{never})", facts.overtakes),
            [0],
        )
    };
    let tokens = Finding::new(
        "tokens grow",
        if facts.tokens_grow {
            Outcome::Valid
        } else {
            Outcome::Invalid
        },
        if facts.tokens_grow {
            "each holder's token is higher than the one before: nobody held twice"
        } else {
            "a token did not grow from one holder to the next: a waiter held twice, or two \
             shared a token"
        },
        [0],
    );
    Report::of([fairness, tokens])
}

/// The positions in `log` of the events `pick` takes.
fn positions(log: &[Event], pick: impl Fn(&Event) -> bool) -> Vec<usize> {
    (0..log.len()).filter(|&i| pick(&log[i])).collect()
}

/// A property the part's facts state as `Some(true)` (held), `Some(false)` (broken) or
/// `None` (the evidence does not settle it).
fn held(name: &str, held: Option<bool>, words: String, events: Vec<usize>) -> Finding {
    Finding::new(name, Outcome::broken_when(held.map(|h| !h)), words, events)
}

/// What a broken property's evidence says, or what its holding means.
fn said(held: Option<bool>, meaning: &str, evidence: &[String]) -> String {
    match held {
        Some(true) => meaning.to_string(),
        _ if evidence.is_empty() => format!("not shown: {meaning}"),
        _ => evidence.join("; "),
    }
}

/// The churn part: etcd's revisions, the waiters' reports, the store's decisions.
fn churn(log: &[Event]) -> Report {
    let verdict = match ChurnVerdict::from_history(log) {
        Ok(verdict) => verdict,
        Err(why) => return Report::evidence_missing(format!("{why:#}")),
    };
    let facts = &verdict.facts;
    let kinds = |kinds: &[Kind]| positions(log, |e| kinds.contains(&e.kind()));
    let grants_and_keys = kinds(&[Kind::Acquired, Kind::QueueKeys]);
    let mut report = Report::of([
        held(
            "one holder at a time",
            facts.one_holder_at_a_time,
            match &facts.history_unreadable {
                Some(why) => format!("etcd's history of the keys could not be read: {why}"),
                None => said(
                    facts.one_holder_at_a_time,
                    "at every grant, every older key was already deleted",
                    &facts.evidence,
                ),
            },
            grants_and_keys.clone(),
        ),
        held(
            "nobody held twice",
            Some(facts.nobody_held_twice),
            said(
                Some(facts.nobody_held_twice),
                "one grant per waiter, one waiter per token",
                &facts.evidence,
            ),
            kinds(&[Kind::Acquired]),
        ),
        held(
            "nobody skipped",
            Some(facts.nobody_skipped),
            said(
                Some(facts.nobody_skipped),
                "every waiter that stayed in line was served, in line order",
                &facts.evidence,
            ),
            kinds(&[Kind::Queued, Kind::Acquired, Kind::GaveUp, Kind::Killed]),
        ),
        held(
            "store in order",
            Some(facts.store_in_order),
            said(
                Some(facts.store_in_order),
                "the store took one write per holder, in line order, none from a departed \
                 waiter",
                &facts.evidence,
            ),
            kinds(&[Kind::Acquired, Kind::ReadBack]),
        ),
    ]);
    // No gap to recheck (nobody left from the middle) is nothing to report; a history that
    // could not be read leaves the gaps open.
    if facts.gaps_rechecked.is_some() || facts.history_unreadable.is_some() {
        report.push(held(
            "gaps rechecked",
            facts.gaps_rechecked,
            said(
                facts.gaps_rechecked,
                "each waiter behind a departure looked again and found an older key ahead",
                &facts.evidence,
            ),
            kinds(&[Kind::Woke, Kind::QueueKeys]),
        ));
    }
    report
}

/// The store's finding on a woken holder's late write (`late` as the verdict says it:
/// `accepted`, `rejected`, `none`): its writes and the store's read-back prove it.
fn stale_write(late: &str, writer: &str, log: &[Event]) -> Finding {
    let (outcome, words) = match late {
        "accepted" => (
            Outcome::Invalid,
            format!("the store took {writer}'s late write, after the next holder's"),
        ),
        "rejected" => (
            Outcome::Valid,
            format!("the store refused {writer}'s late write by its token"),
        ),
        _ => (
            Outcome::Valid,
            format!("no write of {writer}'s was decided after the next holder's"),
        ),
    };
    let events = positions(log, |e| {
        e.kind() == Kind::ReadBack || e.is(writer, Kind::Wrote)
    });
    let late = matches!(late, "accepted" | "rejected")
        .then(|| log.iter().rposition(|e| e.is(writer, Kind::Wrote)))
        .flatten();
    Finding::new("stale write", outcome, words, events).about_event(late)
}

/// The expiry part: what the frozen waiter and the one behind it reported, and what the
/// store decided of the woken holder's write.
fn expiry(log: &[Event]) -> Report {
    // The lease and the freeze only shape the verdict's sentences, not its facts.
    let verdict = match ExpiryVerdict::from_history(log, Duration::ZERO, Duration::ZERO) {
        Ok(verdict) => verdict,
        Err(why) => return Report::evidence_missing(format!("{why:#}")),
    };
    let (outcome, words) = match verdict.frozen_waiter {
        Woken::LearnedItWasGone => (
            Outcome::Valid,
            "W1, frozen past its lease, woke to find its key gone and never held",
        ),
        Woken::Held => (
            Outcome::Invalid,
            "W1, frozen past its lease, took the lock when it woke",
        ),
        Woken::Silent => (
            Outcome::Unknown,
            "W1, frozen past its lease, said nothing of its place when it woke",
        ),
    };
    let frozen_waiter = Finding::new(
        "frozen waiter",
        outcome,
        words,
        positions(log, |e| {
            e.is("W1", Kind::Lost) || e.is("W1", Kind::Acquired)
        }),
    );
    let gap = held(
        "gap skipped",
        verdict.skipped_the_gap,
        match verdict.skipped_the_gap {
            Some(true) => format!(
                "W2 looked again after W1's key went, waited on H and held with token {} \
                 (H's was {})",
                verdict.next_token.unwrap_or_default(),
                verdict.holder_token
            ),
            Some(false) => "W2 did not wait on H after W1's key went".into(),
            None => "W2 looked again after W1's key went, but never held".into(),
        },
        positions(log, |e| {
            e.is("W2", Kind::Woke) || e.is("W2", Kind::Acquired) || e.is("H", Kind::Acquired)
        }),
    );
    Report::of([
        frozen_waiter,
        gap,
        stale_write(verdict.late_write, "H", log),
    ])
}

/// The election part: etcd's revisions of the candidates' keys, their generations, and
/// what the store decided of the deposed leader's write.
fn election(log: &[Event]) -> Report {
    let verdict = match ElectionVerdict::from_history(log) {
        Ok(verdict) => verdict,
        Err(why) => return Report::evidence_missing(format!("{why:#}")),
    };
    let facts = &verdict.facts;
    let grants = positions(log, |e| e.kind() == Kind::Acquired);
    let grants_and_keys = positions(log, |e| {
        matches!(e.kind(), Kind::Acquired | Kind::QueueKeys)
    });
    Report::of([
        held(
            "one leader at a time",
            facts.one_leader_at_a_time,
            match &facts.history_unreadable {
                Some(why) => format!("etcd's history of the keys could not be read: {why}"),
                None => said(
                    facts.one_leader_at_a_time,
                    "each leader was elected after every older key was deleted",
                    &facts.evidence,
                ),
            },
            grants_and_keys,
        ),
        held(
            "generations grow",
            Some(facts.generations_grow),
            format!(
                "the leaders' generations, in etcd's order: {:?}",
                facts.generations
            ),
            grants,
        ),
        stale_write(facts.late_write, "L1", log),
    ])
}
