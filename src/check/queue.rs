//! Lab 10's checkers: a queue's fairness, its hand-overs and its cost, and what an expired
//! session left behind.
//!
//! The order in which waiters got the lock is the backend's own: their tokens (an etcd
//! create revision, or a counter Redis increments in the same script as the `SET NX`), not
//! the order in which their events reached the lab. Hand-over times are measured between
//! processes on the machine's monotonic clock, which every process reads alike.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use super::Finding;

/// One waiter's turn at the lock.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Turn {
    pub waiter: String,
    /// Its place in the order of asking (1 = first).
    pub asked: u32,
    pub token: Option<i64>,
    /// Requests it sent, from its first try to its release.
    pub requests: u64,
    /// Times it was woken (a watch event, or a retry after a sleep) before it got the lock.
    pub wakeups: u64,
    /// When it got and let go of the lock, on the machine's monotonic clock.
    pub enter_ns: u64,
    pub leave_ns: u64,
}

/// One way of queueing, read from its turns and the servers' counts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct QueueFacts {
    pub waiters: usize,
    /// Hand-overs: one fewer than the holders.
    pub handovers: usize,
    /// For each holder in the backend's grant order (by token), its place in the order of
    /// asking: `[1, 2, 3…]` is first come, first served.
    pub order_got: Vec<u32>,
    /// Pairs served out of order: a waiter that got the lock before one that asked earlier.
    pub overtakes: usize,
    /// Served in the order they asked.
    pub fair: bool,
    /// Every holder's token is higher than the one before it, and none was handed out
    /// twice: no waiter held twice, none shared a token.
    pub tokens_grow: bool,
    /// Waiters that never got the lock.
    pub never_served: usize,
    pub handover_p50_us: Option<u64>,
    pub handover_p99_us: Option<u64>,
    /// Wake-ups the waiters counted, per hand-over.
    pub wakeups_per_handover: Option<f64>,
    /// Requests the waiters counted themselves, per hand-over.
    pub client_requests_per_handover: Option<f64>,
}

/// Reads one queue: `turns` in the order of asking (a waiter with no token never held).
pub fn queue_facts(turns: &[Turn]) -> QueueFacts {
    let mut served: Vec<&Turn> = turns.iter().filter(|t| t.token.is_some()).collect();
    served.sort_by_key(|t| t.token);
    let order_got: Vec<u32> = served.iter().map(|t| t.asked).collect();
    let overtakes = inversions(&order_got);
    let tokens_grow = served.windows(2).all(|pair| pair[0].token < pair[1].token);
    let mut gaps_us: Vec<u64> = served
        .windows(2)
        .map(|pair| pair[1].enter_ns.saturating_sub(pair[0].leave_ns) / 1000)
        .collect();
    gaps_us.sort_unstable();
    let handovers = served.len().saturating_sub(1);
    let per = |total: u64| (handovers > 0).then(|| total as f64 / handovers as f64);
    QueueFacts {
        waiters: turns.len(),
        handovers,
        fair: overtakes == 0 && served.len() == turns.len(),
        overtakes,
        order_got,
        tokens_grow,
        never_served: turns.len() - served.len(),
        handover_p50_us: percentile(&gaps_us, 50),
        handover_p99_us: percentile(&gaps_us, 99),
        wakeups_per_handover: per(turns.iter().map(|t| t.wakeups).sum()),
        client_requests_per_handover: per(turns.iter().map(|t| t.requests).sum()),
    }
}

/// A figure the server counted for the whole queue, per hand-over.
pub fn per_handover(total: Option<u64>, handovers: usize) -> Option<f64> {
    total
        .filter(|_| handovers > 0)
        .map(|total| total as f64 / handovers as f64)
}

/// How many pairs stand in the wrong order.
fn inversions(order: &[u32]) -> usize {
    let mut count = 0;
    for (i, a) in order.iter().enumerate() {
        count += order[i + 1..].iter().filter(|b| *b < a).count();
    }
    count
}

/// The nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: usize) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

/// What became of a waiter frozen past its lease, from its own reports and the grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Woken {
    /// It reported that its key was gone, and never held the lock.
    LearnedItWasGone,
    /// It took the lock: etcd gave it a place it no longer had — or the freeze was too
    /// short for its lease to run out.
    Held,
    /// It said neither.
    Silent,
}

pub fn woken_waiter(said_lost: bool, acquired: bool) -> Woken {
    match (said_lost, acquired) {
        (_, true) => Woken::Held,
        (true, false) => Woken::LearnedItWasGone,
        (false, false) => Woken::Silent,
    }
}

/// Did the waiter behind the expired one skip the gap properly? It was woken by the
/// expired key's delete; looking again it must have found the holder still ahead, and
/// only taken the lock once the holder's key was gone too (its token is higher).
pub fn skipped_the_gap(
    woke_behind_holder: bool,
    next_token: Option<i64>,
    holder_token: i64,
) -> Finding {
    match next_token {
        Some(token) if woke_behind_holder && token > holder_token => Finding::Yes,
        Some(_) => Finding::No,
        None if woke_behind_holder => Finding::Unknown,
        None => Finding::No,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(asked: u32, token: Option<i64>, enter_ms: u64, leave_ms: u64) -> Turn {
        Turn {
            waiter: format!("w{asked:02}"),
            asked,
            token,
            requests: 4,
            wakeups: 1,
            enter_ns: enter_ms * 1_000_000,
            leave_ns: leave_ms * 1_000_000,
        }
    }

    #[test]
    fn first_come_first_served_is_fair() {
        let turns = [
            turn(1, Some(10), 0, 100),
            turn(2, Some(11), 101, 120),
            turn(3, Some(12), 123, 140),
        ];
        let facts = queue_facts(&turns);
        assert!(facts.fair);
        assert_eq!(facts.order_got, vec![1, 2, 3]);
        assert_eq!(facts.overtakes, 0);
        assert_eq!(facts.handovers, 2);
        assert_eq!(facts.handover_p50_us, Some(1000));
        assert_eq!(facts.handover_p99_us, Some(3000));
        assert_eq!(facts.wakeups_per_handover, Some(1.5));
        assert!(facts.tokens_grow);
    }

    #[test]
    fn the_grant_order_is_the_tokens_not_the_order_events_arrived() {
        // Waiter 3 got token 11: it was served second, though its turn is listed last.
        let turns = [
            turn(1, Some(10), 0, 100),
            turn(2, Some(12), 121, 140),
            turn(3, Some(11), 101, 120),
        ];
        let facts = queue_facts(&turns);
        assert_eq!(facts.order_got, vec![1, 3, 2]);
        assert_eq!(facts.overtakes, 1);
        assert!(!facts.fair);
    }

    #[test]
    fn a_waiter_never_served_makes_the_queue_unfair_and_is_counted() {
        let turns = [turn(1, Some(10), 0, 100), turn(2, None, 0, 0)];
        let facts = queue_facts(&turns);
        assert_eq!(facts.never_served, 1);
        assert!(!facts.fair);
        assert_eq!(facts.handovers, 0);
        assert_eq!(facts.wakeups_per_handover, None);
        assert_eq!(facts.handover_p50_us, None);
    }

    #[test]
    fn a_token_handed_out_twice_is_caught() {
        let turns = [turn(1, Some(10), 0, 100), turn(2, Some(10), 101, 120)];
        assert!(!queue_facts(&turns).tokens_grow);
    }

    #[test]
    fn a_grant_stamped_before_the_release_counts_as_no_wait_not_as_a_huge_one() {
        // Stamps on one clock by two processes: never negative, never wrapped around.
        let turns = [turn(1, Some(10), 0, 100), turn(2, Some(11), 99, 120)];
        assert_eq!(queue_facts(&turns).handover_p99_us, Some(0));
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<u64> = (1..=20).collect();
        assert_eq!(percentile(&values, 50), Some(10));
        assert_eq!(percentile(&values, 99), Some(20));
        assert_eq!(percentile(&[7], 99), Some(7));
    }

    #[test]
    fn per_handover_needs_a_count_and_a_handover() {
        assert_eq!(per_handover(Some(40), 20), Some(2.0));
        assert_eq!(per_handover(None, 20), None);
        assert_eq!(per_handover(Some(40), 0), None);
    }

    #[test]
    fn a_woken_waiter_that_took_the_lock_is_never_read_as_having_learned() {
        assert_eq!(woken_waiter(true, true), Woken::Held);
        assert_eq!(woken_waiter(true, false), Woken::LearnedItWasGone);
        assert_eq!(woken_waiter(false, false), Woken::Silent);
    }

    #[test]
    fn skipping_the_gap_needs_the_look_again_and_a_higher_token() {
        assert_eq!(skipped_the_gap(true, Some(50), 40), Finding::Yes);
        assert_eq!(skipped_the_gap(false, Some(50), 40), Finding::No);
        assert_eq!(skipped_the_gap(true, Some(30), 40), Finding::No);
        assert_eq!(skipped_the_gap(true, None, 40), Finding::Unknown);
    }
}
