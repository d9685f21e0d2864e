//! The checkers of lab `naive`: pure functions from the evidence the servers gave to the
//! facts its verdict states (see [`super`] for the rules every checker follows).
//!
//! The lab's evidence is Redis's: the holders list every holder appends to (`+W3` when it
//! believes it took the lock, `-W3` when it lets go), which Redis keeps in the one order it
//! received the entries; `GET` on the lock key after the story; and what each release's
//! compare-and-delete found. The workers' `CLOCK_MONOTONIC` stamps are a second witness
//! (one clock for every process on the machine), compared with the list, never preferred to it.

use std::collections::HashMap;
use std::time::Duration;

use super::Finding;

// ───────────────────────────── who held the lock together ─────────────────────────────

/// What a holders list says: the most holders at once, and every pair that held the lock at
/// the same time (earlier holder first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Together {
    pub most: usize,
    pub pairs: Vec<(String, String)>,
}

/// Replays a holders list (`+W3`, `-W3`… in the order Redis received them). An entry that is
/// neither is ignored; a `-` for someone not inside changes nothing.
pub fn replay(entries: &[String]) -> Together {
    let mut inside: Vec<String> = Vec::new();
    let mut together = Together::default();
    for entry in entries {
        if let Some(name) = entry.strip_prefix('+') {
            for other in &inside {
                together.pairs.push((other.clone(), name.to_string()));
            }
            inside.push(name.to_string());
            together.most = together.most.max(inside.len());
        } else if let Some(name) = entry.strip_prefix('-') {
            inside.retain(|n| n != name);
        }
    }
    together
}

// ───────────────────────────── race ─────────────────────────────

/// One worker's report of one race trial.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaceReport {
    pub worker: String,
    /// It believed it took the lock (its SET answered OK).
    pub acquired: bool,
    /// Its `CLOCK_MONOTONIC` stamps: before the GET, when the SET's answer arrived, after its
    /// `+` and before its `-` (so the interval contains the list's).
    pub start_ns: Option<i64>,
    pub answer_ns: Option<i64>,
    pub enter_ns: Option<i64>,
    pub leave_ns: Option<i64>,
    /// What its compare-and-delete found: its own value (`true`), or another SET had run over
    /// it (`false`); None if it never held the lock.
    pub released: Option<bool>,
}

/// Did two workers that believed they held the lock hold it at overlapping moments, by their
/// monotonic stamps? A report without both stamps takes no part.
pub fn clocks_overlap(reports: &[RaceReport]) -> bool {
    let mut intervals: Vec<(i64, i64)> = reports
        .iter()
        .filter_map(|r| Some((r.enter_ns?, r.leave_ns?)))
        .collect();
    intervals.sort();
    intervals.windows(2).any(|w| w[1].0 < w[0].1)
}

/// One race trial's evidence: the holders list read back from Redis, and the workers' reports.
#[derive(Clone, Debug, Default)]
pub struct RaceTrial {
    pub holders: Vec<String>,
    pub reports: Vec<RaceReport>,
}

/// One run of the race (broken or fixed), counted from its trials.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RaceCount {
    /// Trials whose holders list shows two or more holders at once.
    pub violations: u32,
    /// Trials whose monotonic intervals overlap.
    pub clock_overlaps: u32,
    /// Trials (numbered from 1) where the two witnesses differ; the count follows the list.
    pub disagreements: Vec<u32>,
    /// Trials in which a compare-and-delete found its worker's own value gone: the release's
    /// view of the same overwrite.
    pub overwritten: u32,
    /// Workers that believed they held the lock, over all trials.
    pub believers: u32,
    pub most_at_once: usize,
    pub holders_per_trial: Vec<usize>,
    /// The first trial that broke (numbered from 1), and who held the lock together in it.
    pub first_broken: Option<(u32, Vec<(String, String)>)>,
}

/// Counts a run of the race: a trial broke when its holders list, in Redis's order, shows two
/// holders at once — never by the stamps, which only witness.
pub fn race(trials: &[RaceTrial]) -> RaceCount {
    let mut count = RaceCount::default();
    for (index, trial) in trials.iter().enumerate() {
        let number = index as u32 + 1;
        let together = replay(&trial.holders);
        count.holders_per_trial.push(together.most);
        count.most_at_once = count.most_at_once.max(together.most);
        count.believers += trial.reports.iter().filter(|r| r.acquired).count() as u32;
        let clock_overlap = clocks_overlap(&trial.reports);
        count.clock_overlaps += clock_overlap as u32;
        if clock_overlap != (together.most >= 2) {
            count.disagreements.push(number);
        }
        if trial.reports.iter().any(|r| r.released == Some(false)) {
            count.overwritten += 1;
        }
        if together.most >= 2 {
            count.violations += 1;
            count.first_broken.get_or_insert((number, together.pairs));
        }
    }
    count
}

/// The order Redis ran a broken trial's SETs in, from what each release found, beside the
/// order their answers were stamped in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SetOrder {
    /// The worker whose value was still in the key at its release: Redis ran no SET over it.
    pub survivor: Option<String>,
    /// A worker whose value Redis overwrote although its SET's answer was stamped after the
    /// survivor's: the stamps time the answers, not the commands.
    pub overwritten_though_stamped_later: Option<String>,
}

/// Reads the SET order off the releases of `shown` (one trial's holders, in the order shown).
pub fn set_order(shown: &[&RaceReport]) -> SetOrder {
    let survivor = shown.iter().find(|r| r.released == Some(true));
    let overwritten = survivor.and_then(|kept| {
        shown
            .iter()
            .find(|other| other.released == Some(false) && other.answer_ns > kept.answer_ns)
    });
    SetOrder {
        survivor: survivor.map(|r| r.worker.clone()),
        overwritten_though_stamped_later: overwritten.map(|r| r.worker.clone()),
    }
}

// ───────────────────────────── no-ttl and setnx-expire ─────────────────────────────

/// Does the lock key, read back after the next worker's wait, still name the worker that
/// was killed holding it? `dead` is the owner value the killed worker reported (None if it
/// never said): then a key that holds some value cannot be told apart.
pub fn dead_owner(key_owner: Option<&str>, dead: Option<&str>) -> Finding {
    match (key_owner, dead) {
        (None, _) => Finding::No,
        (Some(owner), Some(dead)) if owner == dead => Finding::Yes,
        (Some(_), Some(_)) => Finding::No,
        (Some(_), None) => Finding::Unknown,
    }
}

// ───────────────────────────── wrong-release ─────────────────────────────

/// After the first holder let go, does the key still hold the next holder's value? If not,
/// the release deleted a lock that was not its own (or the next holder's lease lapsed).
/// `holder` is the next holder's owner value (None if it never got the lock: nothing to lose).
pub fn lock_lost_under(key_owner: Option<&str>, holder: Option<&str>) -> Finding {
    match holder {
        None => Finding::No,
        Some(holder) if key_owner == Some(holder) => Finding::No,
        Some(_) => Finding::Yes,
    }
}

/// A newcomer granted the lock while the earlier holder still works: `GET` answers the
/// newcomer's own value.
pub fn newcomer_holds(key_owner: Option<&str>, newcomer: Option<&str>) -> bool {
    newcomer.is_some() && key_owner == newcomer
}

/// Why two holders overlapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The earlier holder's lease had run out when the later one entered: lab 1's problem
    /// (the TTL), the same with or without the fix.
    LeaseExpired,
    /// The earlier holder's lease still ran: someone deleted a live lock.
    LockDeleted,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::LeaseExpired => "lease expired",
            Cause::LockDeleted => "lock deleted by another worker",
        }
    }
}

/// Two holders at once, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    pub first: String,
    pub second: String,
    /// From the first holder's entry to the second's, on their monotonic stamps.
    pub gap: Option<Duration>,
    pub cause: Cause,
}

/// Each pair the holders list shows together, with its cause: the second entered a full TTL
/// or more after the first (by `entered_ns`, the workers' `CLOCK_MONOTONIC` stamps at their
/// grants) — the first lease had run out — or sooner, so the first lease still ran. A pair
/// without both stamps is counted as a deleted lock, as the lab always has; the workers
/// always stamp their grants.
pub fn overlaps(
    pairs: &[(String, String)],
    entered_ns: &HashMap<String, u64>,
    ttl: Duration,
) -> Vec<Overlap> {
    let ttl_ns = ttl.as_nanos() as u64;
    pairs
        .iter()
        .map(|(first, second)| {
            let gap = entered_ns
                .get(second)
                .zip(entered_ns.get(first))
                .map(|(s, f)| s.saturating_sub(*f));
            Overlap {
                first: first.clone(),
                second: second.clone(),
                gap: gap.map(Duration::from_nanos),
                cause: if gap.is_some_and(|gap| gap >= ttl_ns) {
                    Cause::LeaseExpired
                } else {
                    Cause::LockDeleted
                },
            }
        })
        .collect()
}

/// The violations wrong-release counts: holders whose live lock was deleted under them.
pub fn deleted_live_locks(overlaps: &[Overlap]) -> u32 {
    overlaps
        .iter()
        .filter(|o| o.cause == Cause::LockDeleted)
        .count() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    fn pair(a: &str, b: &str) -> (String, String) {
        (a.into(), b.into())
    }

    fn report(worker: &str, interval: Option<(i64, i64)>, released: Option<bool>) -> RaceReport {
        RaceReport {
            worker: worker.into(),
            acquired: interval.is_some(),
            answer_ns: interval.map(|(enter, _)| enter - 10),
            enter_ns: interval.map(|(enter, _)| enter),
            leave_ns: interval.map(|(_, leave)| leave),
            released,
            ..RaceReport::default()
        }
    }

    #[test]
    fn a_list_in_turn_has_one_holder_at_a_time() {
        let together = replay(&list(&["+A", "-A", "+B", "-B"]));
        assert_eq!(together.most, 1);
        assert!(together.pairs.is_empty());
        assert_eq!(replay(&[]), Together::default());
    }

    #[test]
    fn entries_between_a_plus_and_its_minus_are_together() {
        // wrong-release, broken: A's lease ran out, B entered, A's DEL let C in under B.
        let together = replay(&list(&["+A", "+B", "-A", "+C", "-B", "-C"]));
        assert_eq!(together.most, 2);
        assert_eq!(together.pairs, [pair("A", "B"), pair("B", "C")]);
        let three = replay(&list(&["+W1", "+W2", "+W3", "-W2", "-W1", "-W3"]));
        assert_eq!(three.most, 3);
        assert_eq!(three.pairs.len(), 3);
    }

    #[test]
    fn a_stray_minus_or_entry_changes_nothing() {
        let together = replay(&list(&["-B", "+A", "junk", "-B", "+C"]));
        assert_eq!(together.pairs, [pair("A", "C")]);
    }

    #[test]
    fn monotonic_intervals_overlap_only_when_one_starts_before_the_other_ends() {
        let apart = [
            report("W1", Some((0, 100)), Some(true)),
            report("W2", Some((100, 200)), Some(true)),
        ];
        assert!(!clocks_overlap(&apart), "touching is not overlapping");
        let overlapping = [
            report("W2", Some((50, 200)), Some(true)),
            report("W1", Some((0, 100)), Some(false)),
        ];
        assert!(clocks_overlap(&overlapping));
        let one_unstamped = [
            report("W1", Some((0, 100)), Some(true)),
            report("W2", None, None),
        ];
        assert!(!clocks_overlap(&one_unstamped));
    }

    #[test]
    fn the_race_counts_by_the_list_and_names_where_the_stamps_disagree() {
        let trials = [
            // 1: clean, both witnesses agree.
            RaceTrial {
                holders: list(&["+W1", "-W1", "+W2", "-W2"]),
                reports: vec![
                    report("W1", Some((0, 10)), Some(true)),
                    report("W2", Some((20, 30)), Some(true)),
                ],
            },
            // 2: broken by both witnesses; W1's release found its value gone.
            RaceTrial {
                holders: list(&["+W1", "+W2", "-W1", "-W2"]),
                reports: vec![
                    report("W1", Some((0, 30)), Some(false)),
                    report("W2", Some((10, 40)), Some(true)),
                ],
            },
            // 3: the stamps overlap, the list does not: the list decides, the trial is named.
            RaceTrial {
                holders: list(&["+W1", "-W1", "+W2", "-W2"]),
                reports: vec![
                    report("W1", Some((0, 30)), Some(true)),
                    report("W2", Some((10, 40)), Some(true)),
                ],
            },
            // 4: one worker lost the race outright.
            RaceTrial {
                holders: list(&["+W2", "-W2"]),
                reports: vec![
                    report("W1", None, None),
                    report("W2", Some((0, 5)), Some(true)),
                ],
            },
        ];
        let count = race(&trials);
        assert_eq!(count.violations, 1);
        assert_eq!(count.clock_overlaps, 2);
        assert_eq!(count.disagreements, [3]);
        assert_eq!(count.overwritten, 1);
        assert_eq!(count.believers, 7);
        assert_eq!(count.most_at_once, 2);
        assert_eq!(count.holders_per_trial, [1, 2, 1, 1]);
        assert_eq!(count.first_broken, Some((2, vec![pair("W1", "W2")])));
    }

    #[test]
    fn a_race_with_no_trials_counts_nothing() {
        assert_eq!(race(&[]), RaceCount::default());
    }

    /// Issue 10, item 3: W2's SET is stamped first, yet its value is the one Redis kept.
    #[test]
    fn the_set_order_follows_the_releases_not_the_stamps() {
        let mut w1 = report("W1", Some((2_000, 9_000)), Some(false));
        let w2 = report("W2", Some((1_000, 9_000)), Some(true));
        let order = set_order(&[&w1, &w2]);
        assert_eq!(order.survivor.as_deref(), Some("W2"));
        assert_eq!(
            order.overwritten_though_stamped_later.as_deref(),
            Some("W1")
        );
        // Stamped in Redis's order: nothing to point out.
        w1.answer_ns = Some(500);
        let order = set_order(&[&w1, &w2]);
        assert_eq!(order.overwritten_though_stamped_later, None);
        // Nobody kept its value (a third SET, not shown, ran last): no survivor to compare.
        let w2_gone = report("W2", Some((1_000, 9_000)), Some(false));
        assert_eq!(set_order(&[&w1, &w2_gone]), SetOrder::default());
    }

    #[test]
    fn a_key_naming_the_dead_worker_is_a_stuck_lock() {
        assert_eq!(dead_owner(Some("a1"), Some("a1")), Finding::Yes);
        // The fix: A's key lapsed and B took the lock.
        assert_eq!(dead_owner(Some("b1"), Some("a1")), Finding::No);
        // Lapsed and nobody took it.
        assert_eq!(dead_owner(None, Some("a1")), Finding::No);
        // A never said its owner value: a key with some value cannot be told apart.
        assert_eq!(dead_owner(Some("b1"), None), Finding::Unknown);
        assert_eq!(dead_owner(None, None), Finding::No);
    }

    #[test]
    fn a_key_without_the_next_holders_value_was_lost_under_it() {
        // Broken: A's DEL removed B's key.
        assert_eq!(lock_lost_under(None, Some("b1")), Finding::Yes);
        // Fixed: compare-and-delete left B's key alone.
        assert_eq!(lock_lost_under(Some("b1"), Some("b1")), Finding::No);
        assert_eq!(lock_lost_under(Some("c1"), Some("b1")), Finding::Yes);
        assert_eq!(lock_lost_under(None, None), Finding::No);
    }

    #[test]
    fn a_newcomer_holds_the_lock_only_if_get_answers_its_own_value() {
        assert!(newcomer_holds(Some("c1"), Some("c1")));
        assert!(!newcomer_holds(Some("b1"), Some("c1")));
        assert!(
            !newcomer_holds(None, None),
            "no value on either side proves nothing"
        );
    }

    #[test]
    fn an_overlap_a_full_ttl_after_the_first_grant_is_the_lease_not_the_release() {
        let ttl = Duration::from_millis(300);
        let ms = |ms: u64| ms * 1_000_000;
        let entered: HashMap<String, u64> = [("A", ms(0)), ("B", ms(310)), ("C", ms(320))]
            .into_iter()
            .map(|(w, t)| (w.to_string(), t))
            .collect();
        // The broken run of wrong-release, as tests/naive.rs asserts it.
        let found = overlaps(&[pair("A", "B"), pair("B", "C")], &entered, ttl);
        let causes: Vec<Cause> = found.iter().map(|o| o.cause).collect();
        assert_eq!(causes, [Cause::LeaseExpired, Cause::LockDeleted]);
        assert_eq!(found[0].gap, Some(Duration::from_millis(310)));
        assert_eq!(deleted_live_locks(&found), 1);
        // Exactly one TTL apart: the first lease had run out.
        let edge: HashMap<String, u64> = [("A".to_string(), 0), ("B".to_string(), ms(300))].into();
        assert_eq!(
            overlaps(&[pair("A", "B")], &edge, ttl)[0].cause,
            Cause::LeaseExpired
        );
        // A second holder without a stamp is counted, not excused.
        let unstamped = overlaps(&[pair("A", "D")], &entered, ttl);
        assert_eq!(unstamped[0].cause, Cause::LockDeleted);
        assert_eq!(unstamped[0].gap, None);
        // The fixed run: only the lapsed pair, nothing counted.
        assert_eq!(deleted_live_locks(&found[..1]), 0);
        assert_eq!(deleted_live_locks(&[]), 0);
    }
}
