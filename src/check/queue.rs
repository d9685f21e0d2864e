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

use super::{Finding, LateWrite};
use crate::lock::etcd_queue::KeyLife;
use crate::store::Attempt;

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

// ── Fairness under churn ────────────────────────────────────────────────────────────────

/// A waiter of a queue under churn, in the order it asked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Waiter {
    pub name: String,
    /// Its key under the queue's prefix.
    pub key: String,
    /// It gave up, or was killed, while queued: it is owed nothing.
    pub departed: bool,
}

/// A grant as the waiter reported it: its token, and the etcd revision at which it found
/// no older key (None: it did not say).
#[derive(Clone, Debug, PartialEq)]
pub struct Grant {
    pub waiter: String,
    pub token: i64,
    pub seen_at: Option<i64>,
}

/// A waiter woken by the delete of `gone`, and the key it found ahead when it looked again.
#[derive(Clone, Debug, PartialEq)]
pub struct Wake {
    pub waiter: String,
    pub gone: String,
    pub ahead: Option<String>,
}

/// What the churn part leaves to check: the waiters' reports, and etcd's own history of
/// the queue's keys (or why it could not be read).
#[derive(Clone, Debug)]
pub struct ChurnHistory {
    pub waiters: Vec<Waiter>,
    pub grants: Vec<Grant>,
    pub wakes: Vec<Wake>,
    pub keys: Result<Vec<KeyLife>, String>,
}

impl ChurnHistory {
    /// The waiter whose key `key` is, or the key itself when no waiter reported it.
    pub fn owner(&self, key: &str) -> String {
        self.waiters
            .iter()
            .find(|w| w.key == key)
            .map_or(key.to_string(), |w| w.name.clone())
    }
}

/// A queue under churn, read back. Each finding is `Some(true)`, `Some(false)` or `None`
/// (the evidence does not settle it); `evidence` says why each `false` is false.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ChurnFacts {
    /// Waiters that held, in etcd's order of grants (the revision each found no older key).
    pub served: Vec<String>,
    /// Waiters that gave up or were killed while queued.
    pub departed: Vec<String>,
    /// At every grant, every older key was already deleted, by etcd's own revisions.
    pub one_holder_at_a_time: Option<bool>,
    /// No waiter held twice, and no two grants share a token.
    pub nobody_held_twice: bool,
    /// Every waiter that stayed in line was served, in the order of its key's create revision.
    pub nobody_skipped: bool,
    /// Every waiter whose predecessor vanished from the middle of the line looked again
    /// and found an older key still ahead, rather than take the delete as its turn.
    pub gaps_rechecked: Option<bool>,
    /// The store took one write per holder, in line order, and none from a departed waiter.
    pub store_in_order: bool,
    pub evidence: Vec<String>,
    /// Why etcd's history could not be read, when it could not.
    pub history_unreadable: Option<String>,
}

/// Reads a queue under churn from its history and the store's attempts (in decision order).
pub fn churn_facts(history: &ChurnHistory, attempts: &[Attempt]) -> ChurnFacts {
    let mut facts = ChurnFacts {
        departed: history
            .waiters
            .iter()
            .filter(|w| w.departed)
            .map(|w| w.name.clone())
            .collect(),
        ..ChurnFacts::default()
    };
    let mut grants: Vec<&Grant> = history.grants.iter().collect();
    grants.sort_by_key(|g| (g.seen_at, g.token));
    facts.served = grants.iter().map(|g| g.waiter.clone()).collect();
    let owner = |key: &str| history.owner(key);

    // Nobody held twice: one grant per waiter, one waiter per token.
    facts.nobody_held_twice = true;
    for (i, g) in grants.iter().enumerate() {
        for h in &grants[i + 1..] {
            if g.waiter == h.waiter {
                facts.nobody_held_twice = false;
                facts.evidence.push(format!("{} held twice", g.waiter));
            } else if g.token == h.token {
                facts.nobody_held_twice = false;
                facts.evidence.push(format!(
                    "{} and {} both held with token {}",
                    g.waiter, h.waiter, g.token
                ));
            }
        }
    }

    // Nobody skipped: every waiter that stayed was served, in create-revision order.
    facts.nobody_skipped = true;
    for w in history.waiters.iter().filter(|w| !w.departed) {
        if !facts.served.contains(&w.name) {
            facts.nobody_skipped = false;
            facts
                .evidence
                .push(format!("{} stayed in line and never held", w.name));
        }
    }
    for pair in grants.windows(2) {
        if pair[1].token < pair[0].token {
            facts.nobody_skipped = false;
            facts.evidence.push(format!(
                "{} (token {}) held before {} (token {}), which joined earlier",
                pair[0].waiter, pair[0].token, pair[1].waiter, pair[1].token
            ));
        }
    }

    // The store: one accepted write per holder, tokens in line order, nothing refused,
    // nothing from a departed waiter.
    let accepted: Vec<&Attempt> = attempts.iter().filter(|a| a.accepted).collect();
    let writers: Vec<String> = accepted.iter().map(|a| a.writer.clone()).collect();
    let in_order = accepted.windows(2).all(|p| p[0].token < p[1].token);
    facts.store_in_order = writers == facts.served
        && in_order
        && attempts.iter().all(|a| a.accepted)
        && !attempts.iter().any(|a| facts.departed.contains(&a.writer));
    if !facts.store_in_order {
        facts.evidence.push(format!(
            "the store took writes from {} (decision order), the holders were {}; {} refused",
            writers.join(" "),
            facts.served.join(" "),
            attempts.iter().filter(|a| !a.accepted).count()
        ));
    }

    let lives = match &history.keys {
        Ok(lives) => lives,
        Err(why) => {
            facts.history_unreadable = Some(why.clone());
            return facts;
        }
    };

    let (alone, evidence) = held_alone(history, lives);
    facts.one_holder_at_a_time = alone;
    facts.evidence.extend(evidence);

    // The gaps: a departed waiter's key deleted while an older key still lived, with a
    // younger key behind it. That successor (the oldest younger key alive) must have been
    // woken by the delete, looked again, and found an older key still ahead.
    let mut gaps = 0;
    let mut rechecked = true;
    for w in history.waiters.iter().filter(|w| w.departed) {
        let Some(life) = lives.iter().find(|l| l.key == w.key) else {
            continue;
        };
        let Some(gone_at) = life.deleted else {
            continue;
        };
        let alive_at = |l: &&KeyLife| l.created < gone_at && l.deleted.is_none_or(|d| d > gone_at);
        let older_alive = lives
            .iter()
            .filter(alive_at)
            .any(|l| l.created < life.created);
        let successor = lives
            .iter()
            .filter(alive_at)
            .filter(|l| l.created > life.created)
            .min_by_key(|l| l.created);
        let (true, Some(successor)) = (older_alive, successor) else {
            continue;
        };
        gaps += 1;
        let next = owner(&successor.key);
        let looked_again = history.wakes.iter().any(|wake| {
            wake.waiter == next
                && wake.gone == w.key
                && wake.ahead.as_ref().is_some_and(|ahead| {
                    lives
                        .iter()
                        .any(|l| &l.key == ahead && l.created < life.created)
                })
        });
        if !looked_again {
            rechecked = false;
            facts.evidence.push(format!(
                "{next}, behind {}, did not report looking again and finding an older key \
                 ahead when {}'s key went",
                w.name, w.name
            ));
        }
    }
    facts.gaps_rechecked = (gaps > 0).then_some(rechecked);
    facts
}

/// One holder at a time, by etcd's revisions: when a waiter found no older key (its
/// grant's `seen_at`), every older key's delete had already been decided, and its token is
/// its own key's create revision. `None` when a grant or a key is missing from the evidence.
pub fn held_alone(history: &ChurnHistory, lives: &[KeyLife]) -> (Option<bool>, Vec<String>) {
    let owner = |key: &str| history.owner(key);
    let mut evidence = Vec::new();
    let mut alone = Some(true);
    for g in &history.grants {
        let Some(seen_at) = g.seen_at else {
            alone = alone.and(None);
            continue;
        };
        let key = history.waiters.iter().find(|w| w.name == g.waiter);
        match key.and_then(|w| lives.iter().find(|l| l.key == w.key)) {
            Some(own) if own.created == g.token => {}
            Some(own) => {
                alone = Some(false);
                evidence.push(format!(
                    "{}'s token {} is not its key's create revision {}",
                    g.waiter, g.token, own.created
                ));
            }
            None => {
                alone = alone.and(None);
                evidence.push(format!("etcd's history has no key for {}", g.waiter));
            }
        }
        for older in lives.iter().filter(|l| l.created < g.token) {
            if older.deleted.is_none_or(|deleted| deleted > seen_at) {
                alone = Some(false);
                evidence.push(format!(
                    "{} held from revision {seen_at}, while {}'s older key (revision {}) \
                     lived until {}",
                    g.waiter,
                    owner(&older.key),
                    older.created,
                    older
                        .deleted
                        .map_or("the end".to_string(), |d| format!("revision {d}"))
                ));
            }
        }
    }
    (alone, evidence)
}

// ── Leader election ─────────────────────────────────────────────────────────────────────

/// An election with a paused leader, read back.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ElectionFacts {
    /// The leaders, in the order etcd elected them, with their generations.
    pub leaders: Vec<String>,
    pub generations: Vec<i64>,
    /// Each leader's generation is higher than the one before it.
    pub generations_grow: bool,
    /// By etcd's history of the candidates' keys: each leader was elected after every
    /// older key was deleted.
    pub one_leader_at_a_time: Option<bool>,
    /// The paused leader, woken, acted as leader (wrote with its old generation).
    pub deposed_acted: bool,
    /// Its write, decided after the new leader's: `rejected`, `accepted` or `none`.
    pub late_write: &'static str,
    /// It asked etcd and learned it no longer leads.
    pub deposed_learned: bool,
    pub evidence: Vec<String>,
    pub history_unreadable: Option<String>,
}

/// Reads an election: the candidates' grants and keys (as for a queue), what the paused
/// leader did when it woke, and what the store decided of its write.
pub fn election_facts(
    history: &ChurnHistory,
    deposed_acted: bool,
    deposed_learned: bool,
    late: LateWrite,
) -> ElectionFacts {
    let mut grants: Vec<&Grant> = history.grants.iter().collect();
    grants.sort_by_key(|g| (g.seen_at, g.token));
    let generations: Vec<i64> = grants.iter().map(|g| g.token).collect();
    let mut facts = ElectionFacts {
        leaders: grants.iter().map(|g| g.waiter.clone()).collect(),
        generations_grow: generations.windows(2).all(|p| p[0] < p[1]),
        generations,
        deposed_acted,
        late_write: late.as_str(),
        deposed_learned,
        ..ElectionFacts::default()
    };
    match &history.keys {
        Ok(lives) => {
            let (alone, evidence) = held_alone(history, lives);
            facts.one_leader_at_a_time = alone;
            facts.evidence = evidence;
        }
        Err(why) => facts.history_unreadable = Some(why.clone()),
    }
    facts
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
    // A queue under churn: H holds; W1 waits; W2 gives up (its key deleted at 15) and
    // W3 is killed (its lease expires at 18), both from the middle of the line; W4 waits.
    fn churned() -> ChurnHistory {
        let waiter = |name: &str, key: &str, departed: bool| Waiter {
            name: name.into(),
            key: key.into(),
            departed,
        };
        let life = |key: &str, created: i64, deleted: Option<i64>| KeyLife {
            key: key.into(),
            created,
            deleted,
        };
        let wake = |waiter: &str, gone: &str, ahead: Option<&str>| Wake {
            waiter: waiter.into(),
            gone: gone.into(),
            ahead: ahead.map(str::to_string),
        };
        ChurnHistory {
            waiters: vec![
                waiter("H", "q/h", false),
                waiter("W1", "q/1", false),
                waiter("W2", "q/2", true),
                waiter("W3", "q/3", true),
                waiter("W4", "q/4", false),
            ],
            grants: vec![grant("H", 10, 10), grant("W1", 11, 20), grant("W4", 14, 23)],
            wakes: vec![
                wake("W3", "q/2", Some("q/1")),
                wake("W4", "q/3", Some("q/1")),
                wake("W1", "q/h", None),
                wake("W4", "q/1", None),
            ],
            keys: Ok(vec![
                life("q/h", 10, Some(20)),
                life("q/1", 11, Some(23)),
                life("q/2", 12, Some(15)),
                life("q/3", 13, Some(18)),
                life("q/4", 14, Some(26)),
            ]),
        }
    }

    fn grant(waiter: &str, token: i64, seen_at: i64) -> Grant {
        Grant {
            waiter: waiter.into(),
            token,
            seen_at: Some(seen_at),
        }
    }

    fn wrote(writer: &str, token: i64, accepted: bool, decided: i64) -> Attempt {
        Attempt {
            writer: writer.into(),
            value: writer.into(),
            token: Some(token),
            fenced: true,
            accepted,
            decided,
        }
    }

    fn in_line() -> Vec<Attempt> {
        vec![
            wrote("H", 10, true, 1),
            wrote("W1", 11, true, 2),
            wrote("W4", 14, true, 3),
        ]
    }

    #[test]
    fn a_churned_queue_served_in_line_passes_every_check() {
        let facts = churn_facts(&churned(), &in_line());
        assert_eq!(facts.served, ["H", "W1", "W4"]);
        assert_eq!(facts.departed, ["W2", "W3"]);
        assert_eq!(
            facts.one_holder_at_a_time,
            Some(true),
            "{:?}",
            facts.evidence
        );
        assert!(facts.nobody_held_twice);
        assert!(facts.nobody_skipped);
        assert_eq!(facts.gaps_rechecked, Some(true));
        assert!(facts.store_in_order);
        assert!(facts.evidence.is_empty(), "{:?}", facts.evidence);
    }

    #[test]
    fn a_successor_that_takes_the_delete_as_its_turn_is_caught_by_the_revisions() {
        // W3, woken by W2's delete at 15, held at once: H and W1 still had their keys.
        let mut history = churned();
        history.wakes.retain(|w| w.waiter != "W3");
        history.grants.push(grant("W3", 13, 15));
        let attempts = vec![
            wrote("W3", 13, true, 1),
            wrote("H", 10, false, 2),
            wrote("W1", 11, false, 3),
            wrote("W4", 14, true, 4),
        ];
        let facts = churn_facts(&history, &attempts);
        assert_eq!(facts.one_holder_at_a_time, Some(false));
        assert_eq!(facts.gaps_rechecked, Some(false));
        assert!(!facts.nobody_skipped, "W3 went before W1");
        assert!(!facts.store_in_order);
        assert!(
            facts
                .evidence
                .iter()
                .any(|e| e.contains("W3 held from revision 15") && e.contains("H's older key")),
            "{:?}",
            facts.evidence
        );
    }

    #[test]
    fn an_older_key_deleted_at_the_grants_own_revision_is_gone_one_after_is_not() {
        let mut history = churned();
        history.grants[1] = grant("W1", 11, 20); // H deleted at 20: gone at 20
        assert_eq!(
            churn_facts(&history, &in_line()).one_holder_at_a_time,
            Some(true)
        );
        history.grants[1] = grant("W1", 11, 19);
        assert_eq!(
            churn_facts(&history, &in_line()).one_holder_at_a_time,
            Some(false)
        );
    }

    #[test]
    fn a_waiter_that_stayed_and_never_held_was_skipped() {
        let mut history = churned();
        history.grants.retain(|g| g.waiter != "W4");
        let facts = churn_facts(&history, &in_line()[..2]);
        assert!(!facts.nobody_skipped);
        assert!(facts.store_in_order, "the store agrees with who held");
        assert!(facts.evidence.iter().any(|e| e.contains("W4 stayed")));
    }

    #[test]
    fn a_waiter_granted_twice_or_a_token_shared_is_held_twice() {
        let mut history = churned();
        history.grants.push(grant("W1", 11, 27));
        assert!(!churn_facts(&history, &in_line()).nobody_held_twice);
        let mut history = churned();
        history.grants.push(grant("W3", 14, 27));
        assert!(!churn_facts(&history, &in_line()).nobody_held_twice);
    }

    #[test]
    fn a_compacted_history_leaves_the_revision_checks_unknown_not_passed() {
        let mut history = churned();
        history.keys = Err("etcd compacted its history".into());
        let facts = churn_facts(&history, &in_line());
        assert_eq!(facts.one_holder_at_a_time, None);
        assert_eq!(facts.gaps_rechecked, None);
        assert!(facts.history_unreadable.is_some());
        assert!(facts.nobody_skipped && facts.store_in_order);
    }

    #[test]
    fn a_waiter_leaving_the_end_of_the_line_or_the_front_leaves_no_gap_to_check() {
        let mut history = churned();
        // Nobody else departed from the middle; W4 leaves the end of the line.
        for w in &mut history.waiters {
            w.departed = w.name == "W4";
        }
        history.grants.retain(|g| g.waiter != "W4");
        let facts = churn_facts(&history, &in_line()[..2]);
        assert_eq!(facts.gaps_rechecked, None);
    }

    #[test]
    fn a_departed_waiters_write_breaks_the_store_check() {
        let mut attempts = in_line();
        attempts.push(wrote("W2", 12, false, 4));
        assert!(!churn_facts(&churned(), &attempts).store_in_order);
    }
    #[test]
    fn an_election_with_a_deposed_leader_refused_by_generation() {
        let mut history = churned();
        history.waiters.truncate(2);
        history.waiters[1].key = "q/1".into();
        history.grants = vec![grant("H", 10, 10), grant("W1", 11, 20)];
        let facts = election_facts(&history, true, true, LateWrite::Rejected);
        assert_eq!(facts.leaders, ["H", "W1"]);
        assert!(facts.generations_grow);
        assert_eq!(
            facts.one_leader_at_a_time,
            Some(true),
            "{:?}",
            facts.evidence
        );
        assert_eq!(facts.late_write, "rejected");
        // A second leader elected while the first's key still lived: two leaders.
        history.grants[1] = grant("W1", 11, 19);
        let facts = election_facts(&history, true, true, LateWrite::Rejected);
        assert_eq!(facts.one_leader_at_a_time, Some(false));
        history.keys = Err("compacted".into());
        let facts = election_facts(&history, true, false, LateWrite::Accepted);
        assert_eq!(facts.one_leader_at_a_time, None);
        assert_eq!(facts.late_write, "accepted");
    }
}
