//! Checkers: the facts a verdict states, computed from evidence the backends gave.
//!
//! A lab's timeline is stamped when events *reach* the orchestrator, and two events from two
//! processes can arrive in either order whatever order they happened in. A verdict that reads
//! "two holders" or "which write came last" off that order is right on the defaults and wrong
//! at the edges — exactly where a pause ends within a few milliseconds of the TTL. So every
//! fact here comes from an answer a backend gave, in the backend's own order:
//!
//! - **who held the lock when**: the lock service's replies — a compare-and-delete that found
//!   someone else's owner value in the key proves Redis granted the lock to them before the
//!   first holder let go;
//! - **which write came last**: the store's decision numbers, taken under the resource's row
//!   lock ([`crate::store`]);
//! - **exactly once**: how many rows each job has in lab 3's append-only processing table.
//!
//! Where the evidence cannot decide, the answer is [`Finding::Unknown`], never a guess.
//! Every function is pure, so each edge is a unit test on a small hand-written history.
//!
//! A lab's checker puts these answers together as one [`report::Report`]: an outcome
//! (valid, invalid, unknown) that composes, and findings that each name the events of the
//! history that prove them.

pub mod challenge;
pub mod chaos;
pub mod etcd_vs_redis;
pub mod failover;
pub mod gc_pause;
pub mod lease_guard;
pub mod naive;
pub mod network;
pub mod no_lock;
pub mod queue;
pub mod redlock;
pub mod report;
pub mod skip_locked;

use serde::Serialize;

use crate::lock::redis::Release;
use crate::store::Attempt;

/// A yes/no fact that the evidence may not settle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finding {
    Yes,
    No,
    Unknown,
}

impl Finding {
    /// `Some(true)`, `Some(false)`, or `None` for unknown: how JSON carries a finding.
    pub fn as_option(self) -> Option<bool> {
        match self {
            Finding::Yes => Some(true),
            Finding::No => Some(false),
            Finding::Unknown => None,
        }
    }
}

/// Did Redis grant the lock to `second` while `first` still believed it held it?
///
/// `first_release` is what `first`'s compare-and-delete found when it let go; `second` is
/// the owner value of the second acquisition (None if it never got the lock) and
/// `second_release` what its own release found.
///
/// - `first` deleted its own key: the key lived from `first`'s grant to its release, and
///   `SET NX` refuses everyone while it exists — no overlap.
/// - `first` found `second`'s value: Redis had granted `second` the lock first — overlap.
/// - `first` found no key: `second` was granted after `first` let go *if* `second`'s own key
///   then lived until `second` released it (it did not exist at `first`'s release, and a
///   key with a fresh owner value cannot reappear). If `second`'s key had expired too, the
///   two releases cannot order the grant: unknown.
pub fn two_holders(
    first_release: &Release,
    second: Option<&str>,
    second_release: Option<&Release>,
) -> Finding {
    let Some(second) = second else {
        return Finding::No;
    };
    match first_release {
        Release::Deleted => Finding::No,
        Release::HeldBy(owner) if owner == second => Finding::Yes,
        // Someone else entirely held the key: still two holders at once.
        Release::HeldBy(_) => Finding::Yes,
        Release::Gone => match second_release {
            Some(Release::Deleted) => Finding::No,
            _ => Finding::Unknown,
        },
    }
}

/// The store's order can settle what the lock's answers leave open. Each holder writes after
/// its grant and lets go after its write, so a write decided after the next holder's
/// accepted write proves the next holder was granted the lock before the late writer let go:
/// two holders, whatever the lock service remembers (lab 5's failover forgets a lock outright).
pub fn two_holders_given_writes(from_lock: Finding, late: LateWrite) -> Finding {
    if late.attempted() {
        Finding::Yes
    } else {
        from_lock
    }
}

/// The same question for a lock service that queues waiters in the server (an etcd lock, a
/// Postgres advisory lock): the server hands the lock to the queued waiter the moment the
/// holder's key or session goes. So if the holder's release found its lock already gone
/// (`holder_kept` false) and the waiter, queued before the holder was struck, got the lock,
/// the server granted it before the holder let go. If the release found the lock still the
/// holder's, the queue granted nothing until then.
pub fn two_holders_queued(holder_kept: bool, waiter_acquired: bool) -> Finding {
    if !holder_kept && waiter_acquired {
        Finding::Yes
    } else {
        Finding::No
    }
}

/// What became of a write that may have come after its writer's lease ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LateWrite {
    /// It was decided before the next holder's accepted write, or the store has no record
    /// of it at all (attempt and write commit together, so it never took effect): either way
    /// it destroyed nothing.
    None,
    /// Decided after the next holder's accepted write, and taken: the next holder's result is lost.
    Accepted,
    /// Decided after the next holder's accepted write, and refused (a lower fencing token).
    Rejected,
}

impl LateWrite {
    pub fn as_str(self) -> &'static str {
        match self {
            LateWrite::None => "none",
            LateWrite::Accepted => "accepted",
            LateWrite::Rejected => "rejected",
        }
    }

    /// Whether the store took the late write; None when there was none.
    pub fn accepted(self) -> Option<bool> {
        match self {
            LateWrite::Accepted => Some(true),
            LateWrite::Rejected => Some(false),
            LateWrite::None => None,
        }
    }

    /// A stale write reached the store after the next holder's (accepted or not).
    pub fn attempted(self) -> bool {
        matches!(self, LateWrite::Accepted | LateWrite::Rejected)
    }
}

/// Did `late`'s write come after `next`'s accepted write, in the store's decision order, and
/// what did the store decide? `attempts` must be in decision order (as
/// [`crate::store::Store::read_back`] returns them).
pub fn late_write(attempts: &[Attempt], late: &str, next: &str) -> LateWrite {
    let next_accepted = attempts.iter().find(|a| a.writer == next && a.accepted);
    let late_attempts: Vec<&Attempt> = attempts.iter().filter(|a| a.writer == late).collect();
    let Some(last_late) = late_attempts.last() else {
        return LateWrite::None;
    };
    match next_accepted {
        Some(next) if last_late.decided > next.decided => {
            if last_late.accepted {
                LateWrite::Accepted
            } else {
                LateWrite::Rejected
            }
        }
        _ => LateWrite::None,
    }
}

/// A queue's jobs, by how many times the processing table says each was processed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Processed {
    pub jobs: i64,
    pub once: i64,
    /// Processed twice or more: a claim that let two workers in.
    pub duplicates: i64,
    /// Never processed: a claim that outlived its worker.
    pub lost: i64,
}

/// Counts exactly-once from each job's number of processings (lab 3's append-only table).
pub fn exactly_once(times_processed: &[i64]) -> Processed {
    let count = |keep: fn(i64) -> bool| times_processed.iter().filter(|&&n| keep(n)).count() as i64;
    Processed {
        jobs: times_processed.len() as i64,
        once: count(|n| n == 1),
        duplicates: count(|n| n >= 2),
        lost: count(|n| n == 0),
    }
}

/// The store's own consistency: the last accepted attempt, in decision order, is the writer
/// the resource's row names. A verdict is read back only from a store that passes this.
pub fn last_accepted_is_final(attempts: &[Attempt], final_writer: Option<&str>) -> bool {
    attempts
        .iter()
        .rev()
        .find(|a| a.accepted)
        .map(|a| a.writer.as_str())
        == final_writer
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One store attempt, for the checkers' tests (each lab's too).
    pub(super) fn attempt(
        decided: i64,
        writer: &str,
        token: Option<i64>,
        accepted: bool,
    ) -> Attempt {
        Attempt {
            writer: writer.into(),
            value: format!("{writer}'s result"),
            token,
            fenced: token.is_some(),
            accepted,
            decided,
        }
    }

    #[test]
    fn a_release_that_deleted_its_own_key_rules_out_a_second_holder() {
        let b_release = Release::Deleted;
        assert_eq!(
            two_holders(&Release::Deleted, Some("b"), Some(&b_release)),
            Finding::No
        );
    }

    #[test]
    fn a_release_that_found_the_next_owner_proves_two_holders() {
        // Lab 1 at pause ≈ TTL: B's "acquired" reached the orchestrator after A's "resumed",
        // yet Redis had granted B the lock before A let go. Redis's answer decides.
        let a_release = Release::HeldBy("b".into());
        assert_eq!(
            two_holders(&a_release, Some("b"), Some(&Release::Deleted)),
            Finding::Yes
        );
    }

    #[test]
    fn a_lease_that_ran_out_with_nobody_waiting_is_not_two_holders() {
        assert_eq!(
            two_holders(&Release::Gone, Some("b"), Some(&Release::Deleted)),
            Finding::No
        );
    }

    #[test]
    fn two_expired_keys_cannot_order_the_grant() {
        assert_eq!(
            two_holders(&Release::Gone, Some("b"), Some(&Release::Gone)),
            Finding::Unknown
        );
        assert_eq!(
            two_holders(&Release::Gone, Some("b"), None),
            Finding::Unknown
        );
    }

    #[test]
    fn nobody_else_granted_is_not_two_holders() {
        assert_eq!(two_holders(&Release::Gone, None, None), Finding::No);
    }

    #[test]
    fn a_queued_waiter_granted_before_the_holder_let_go_is_a_second_holder() {
        // Lab 4 at a pause between ⅔ and 1 lease TTL: the keepalive answered TTL 0, the
        // holder wrote and then found its lease gone at release; the waiter's "acquired"
        // reached the lab after the resume. etcd's answers decide, not arrival order.
        assert_eq!(two_holders_queued(false, true), Finding::Yes);
        assert_eq!(two_holders_queued(true, true), Finding::No);
        assert_eq!(two_holders_queued(false, false), Finding::No);
    }

    #[test]
    fn a_write_decided_after_the_next_holders_is_late() {
        let unfenced = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        assert_eq!(late_write(&unfenced, "A", "B"), LateWrite::Accepted);
        let fenced = [
            attempt(1, "B", Some(2), true),
            attempt(2, "A", Some(1), false),
        ];
        assert_eq!(late_write(&fenced, "A", "B"), LateWrite::Rejected);
    }

    #[test]
    fn decision_order_not_list_order_decides() {
        // Listed out of order (as an id drawn before the row lock would list them): the
        // decision numbers still say A's write was decided last.
        let attempts = [attempt(2, "A", None, true), attempt(1, "B", None, true)];
        assert_eq!(late_write(&attempts, "A", "B"), LateWrite::Accepted);
    }

    #[test]
    fn a_write_decided_before_the_next_holders_destroyed_nothing() {
        let attempts = [attempt(1, "A", None, true), attempt(2, "B", None, true)];
        assert_eq!(late_write(&attempts, "A", "B"), LateWrite::None);
        assert!(last_accepted_is_final(&attempts, Some("B")));
    }

    #[test]
    fn a_write_the_store_never_recorded_destroyed_nothing() {
        let attempts = [attempt(1, "B", Some(2), true)];
        assert_eq!(late_write(&attempts, "A", "B"), LateWrite::None);
    }

    #[test]
    fn a_late_write_settles_what_expired_keys_leave_open() {
        // Lab 4, Redis, both keys expired before their releases: the releases cannot order
        // the grant, but the holder's write decided after the waiter's can.
        assert_eq!(
            two_holders_given_writes(Finding::Unknown, LateWrite::Accepted),
            Finding::Yes
        );
        assert_eq!(
            two_holders_given_writes(Finding::Unknown, LateWrite::None),
            Finding::Unknown
        );
        assert_eq!(
            two_holders_given_writes(Finding::No, LateWrite::None),
            Finding::No
        );
    }

    #[test]
    fn without_a_next_write_nothing_is_late() {
        let attempts = [attempt(1, "A", None, true)];
        assert_eq!(late_write(&attempts, "A", "B"), LateWrite::None);
    }

    #[test]
    fn exactly_once_counts_twice_and_never_apart() {
        let processed = exactly_once(&[1, 1, 2, 0, 3, 1]);
        assert_eq!(
            processed,
            Processed {
                jobs: 6,
                once: 3,
                duplicates: 2,
                lost: 1
            }
        );
        assert_eq!(exactly_once(&[]).jobs, 0);
    }

    #[test]
    fn the_final_writer_must_be_the_last_accepted() {
        let attempts = [
            attempt(1, "B", Some(2), true),
            attempt(2, "A", Some(1), false),
        ];
        assert!(last_accepted_is_final(&attempts, Some("B")));
        assert!(!last_accepted_is_final(&attempts, Some("A")));
        assert!(last_accepted_is_final(&[], None));
    }
}
