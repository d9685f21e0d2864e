//! Lab 9's checkers: what one cell (a guard against a fault) shows, from Redis's answers
//! and the store's record — never from what the holder believed.
//!
//! - **the stale write**: A's write decided after B's accepted write, and whether the store
//!   took it ([`super::late_write`], the store's decision order);
//! - **two holders**: A's compare-and-delete found B's key, or A's write came after B's
//!   ([`super::two_holders`], [`super::two_holders_given_writes`]);
//! - **the guard's abort, and whether it was needed**: Redis's `GET` and `PTTL` asked just
//!   after the guard decided. An abort while the key was still A's, with time left, gave up
//!   work that was in fact safe (what a margin costs).

use serde::Serialize;

use super::{Finding, LateWrite, late_write, two_holders, two_holders_given_writes};
use crate::lock::redis::Release;
use crate::store::Attempt;

/// What the workers heard from the backends in one cell.
#[derive(Clone, Debug)]
pub struct Evidence<'a> {
    /// A's guard's decision, with Redis's answer just after it.
    pub decision: Decided,
    /// What A's compare-and-delete found.
    pub a_release: &'a Release,
    /// The owner value Redis granted B; None when B got no lock.
    pub b_owner: Option<&'a str>,
    pub b_release: Option<&'a Release>,
    /// How long after its check A's write went out (A's monotonic clock); None: no write.
    pub a_after_check_ms: Option<u64>,
    /// The store's attempts, in decision order, and its final writer.
    pub attempts: &'a [Attempt],
    pub final_writer: Option<&'a str>,
}

/// What A's guard decided, and what Redis answered just after (the `guard_decided` event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decided {
    /// The guard let the write go out.
    pub write: bool,
    /// The guard counted what was left of the lease (every guard but none and fencing).
    pub counted: bool,
    /// Redis's `GET`: the key still held A's value.
    pub key_ours: Option<bool>,
    /// Redis's `PTTL` of the key.
    pub pttl_ms: Option<i64>,
}

/// How a cell ended for the data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A's write came after B's and the store took it: B's result is lost.
    StaleAccepted,
    /// A's write came after B's and the store refused it (its token was lower).
    StaleRefused,
    /// A's guard stopped A from writing.
    Aborted,
    /// A wrote, and its write was decided before B's: nothing lost.
    NoStaleWrite,
}

impl Outcome {
    /// Whether B's result survived.
    pub fn safe(self) -> bool {
        self != Outcome::StaleAccepted
    }
}

/// What one cell found.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    pub outcome: Outcome,
    pub late_write: LateWrite,
    /// Redis granted B the lock while A still believed it held it.
    pub two_holders: Finding,
    /// A's guard stopped it while Redis still had A's key with more than `margin` left
    /// (work thrown away that was safe); No for an abort that was needed; Unknown when
    /// there was no abort.
    pub needless_abort: Finding,
    /// The window the stale write went through: the time between a guard's check that
    /// passed and the write, on A's monotonic clock (None for a guard that does not check).
    pub window_ms: Option<u64>,
}

/// The store's own record disagrees with itself (its final writer is not its last
/// accepted attempt): no verdict can be read from it.
#[derive(Debug, PartialEq, Eq)]
pub struct Inconsistent;

pub fn judge(evidence: &Evidence) -> Result<Found, Inconsistent> {
    if !super::last_accepted_is_final(evidence.attempts, evidence.final_writer) {
        return Err(Inconsistent);
    }
    let late = late_write(evidence.attempts, "A", "B");
    let a_wrote = evidence.attempts.iter().any(|a| a.writer == "A");
    let outcome = match late {
        LateWrite::Accepted => Outcome::StaleAccepted,
        LateWrite::Rejected => Outcome::StaleRefused,
        LateWrite::None if !a_wrote => Outcome::Aborted,
        LateWrite::None => Outcome::NoStaleWrite,
    };
    let from_lock = two_holders(evidence.a_release, evidence.b_owner, evidence.b_release);
    let decision = evidence.decision;
    let needless_abort = match (decision.write, decision.key_ours, decision.pttl_ms) {
        (true, ..) => Finding::Unknown,
        (false, Some(true), Some(pttl)) if pttl > 0 => Finding::Yes,
        (false, Some(_), _) => Finding::No,
        (false, None, _) => Finding::Unknown,
    };
    Ok(Found {
        outcome,
        late_write: late,
        two_holders: two_holders_given_writes(from_lock, late),
        needless_abort,
        // A window after a check only where there was a check that counted.
        window_ms: (late.attempted() && decision.counted)
            .then_some(evidence.a_after_check_ms)
            .flatten(),
    })
}

/// When the lock changed hands, on the lab's clock (ms since the run began).
#[derive(Clone, Copy, Debug)]
pub struct Handover {
    /// Redis granted A the lock (its `SET NX PX` came back).
    pub a_granted_ms: u64,
    /// The lease A was promised.
    pub ttl_ms: u64,
    /// A's heartbeat re-armed its key: its lease ended when it let go, not at `ttl`.
    pub a_renewed: bool,
    /// A's compare-and-delete found its own key and deleted it, at this time.
    pub a_deleted_ms: Option<u64>,
    /// B first asked for the lock (its first `SET NX`).
    pub b_asked_ms: Option<u64>,
    /// Redis granted B the lock.
    pub b_granted_ms: Option<u64>,
}

/// A cost: how long the lock stood unavailable — nobody held a live lease and nobody else
/// could be granted one — from the end of A's lease, or B's first request if B came later
/// (a B slow to start was not kept out), to B's grant (which includes B's polling, up to
/// [`crate::lock::redis::RETRY_EVERY`]). A's lease ends at its grant plus
/// the TTL, or, when its heartbeat kept it, when A deleted its key. None when B got no
/// lock, or A renewed and never deleted its key (the lab cannot see when the last renewal
/// ran out).
pub fn unavailable_ms(handover: &Handover) -> Option<u64> {
    let b_granted = handover.b_granted_ms?;
    let lease_end = if handover.a_renewed {
        handover.a_deleted_ms?
    } else {
        handover.a_granted_ms + handover.ttl_ms
    };
    let from = lease_end.max(handover.b_asked_ms.unwrap_or(0));
    Some(b_granted.saturating_sub(from))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(writer: &str, accepted: bool, decided: i64) -> Attempt {
        Attempt {
            writer: writer.into(),
            value: format!("{writer}'s result"),
            token: None,
            fenced: false,
            accepted,
            decided,
        }
    }

    fn decided(write: bool, key_ours: bool, pttl_ms: i64) -> Decided {
        Decided {
            write,
            counted: true,
            key_ours: Some(key_ours),
            pttl_ms: Some(pttl_ms),
        }
    }

    fn judge_with(
        decision: Decided,
        a_release: Release,
        attempts: &[Attempt],
        final_writer: Option<&str>,
    ) -> Result<Found, Inconsistent> {
        judge(&Evidence {
            decision,
            a_release: &a_release,
            b_owner: Some("b"),
            b_release: Some(&Release::Deleted),
            a_after_check_ms: Some(1500),
            attempts,
            final_writer,
        })
    }

    #[test]
    fn a_write_after_bs_that_the_store_took_is_a_stale_write_through_a_window() {
        let attempts = [attempt("B", true, 1), attempt("A", true, 2)];
        let found = judge_with(
            decided(true, true, 800),
            Release::HeldBy("b".into()),
            &attempts,
            Some("A"),
        )
        .unwrap();
        assert_eq!(found.outcome, Outcome::StaleAccepted);
        assert_eq!(found.two_holders, Finding::Yes);
        assert_eq!(found.window_ms, Some(1500));
        assert_eq!(found.needless_abort, Finding::Unknown);
    }

    #[test]
    fn a_refused_stale_write_is_safe() {
        let attempts = [attempt("B", true, 1), attempt("A", false, 2)];
        let found = judge_with(
            decided(true, false, 500),
            Release::HeldBy("b".into()),
            &attempts,
            Some("B"),
        )
        .unwrap();
        assert_eq!(found.outcome, Outcome::StaleRefused);
        assert!(found.outcome.safe());
    }

    #[test]
    fn an_abort_with_bs_key_in_place_was_needed() {
        let attempts = [attempt("B", true, 1)];
        let found = judge_with(
            decided(false, false, 700),
            Release::HeldBy("b".into()),
            &attempts,
            Some("B"),
        )
        .unwrap();
        assert_eq!(found.outcome, Outcome::Aborted);
        assert_eq!(found.needless_abort, Finding::No);
        assert_eq!(found.window_ms, None);
    }

    #[test]
    fn an_abort_while_the_key_was_still_as_own_threw_safe_work_away() {
        let found = judge_with(decided(false, true, 150), Release::Deleted, &[], None).unwrap();
        assert_eq!(found.outcome, Outcome::Aborted);
        assert_eq!(found.needless_abort, Finding::Yes);
        assert_eq!(found.two_holders, Finding::No);
    }

    #[test]
    fn an_abort_at_the_last_millisecond_of_the_key_is_not_needless() {
        // PTTL 0 or -2 (gone): the lease had nothing left to use.
        let found = judge_with(decided(false, true, 0), Release::Gone, &[], None).unwrap();
        assert_eq!(found.needless_abort, Finding::No);
    }

    #[test]
    fn as_write_decided_before_bs_is_no_stale_write() {
        let attempts = [attempt("A", true, 1), attempt("B", true, 2)];
        let found = judge_with(
            decided(true, true, 900),
            Release::Deleted,
            &attempts,
            Some("B"),
        )
        .unwrap();
        assert_eq!(found.outcome, Outcome::NoStaleWrite);
        assert_eq!(found.window_ms, None);
    }

    #[test]
    fn a_guard_that_does_not_count_has_no_window_after_a_check() {
        let attempts = [attempt("B", true, 1), attempt("A", true, 2)];
        let unguarded = Decided {
            counted: false,
            ..decided(true, false, 900)
        };
        let found =
            judge_with(unguarded, Release::HeldBy("b".into()), &attempts, Some("A")).unwrap();
        assert_eq!(found.outcome, Outcome::StaleAccepted);
        assert_eq!(found.window_ms, None);
    }

    fn handover(a_renewed: bool, a_deleted_ms: Option<u64>, b_granted: u64) -> Handover {
        Handover {
            a_granted_ms: 1_000,
            ttl_ms: 1_000,
            a_renewed,
            a_deleted_ms,
            b_asked_ms: Some(1_100),
            b_granted_ms: Some(b_granted),
        }
    }

    #[test]
    fn a_b_that_asked_late_was_not_kept_out_before_it_asked() {
        // A's lease ended at 2000; B, slow to start, first asked at 2370 and was granted at
        // once: the lock stood free, nobody was kept out.
        let late = Handover {
            b_asked_ms: Some(2_370),
            ..handover(false, None, 2_375)
        };
        assert_eq!(unavailable_ms(&late), Some(5));
    }

    #[test]
    fn the_lock_stands_unavailable_from_the_end_of_as_lease_to_bs_grant() {
        // Lock-delay: A's lease ended at 2000, B was let in at 2500 (A deleted its key).
        assert_eq!(
            unavailable_ms(&handover(false, Some(2_490), 2_500)),
            Some(500)
        );
        // No delay: B's grant at the lease's end, or a poll later.
        assert_eq!(unavailable_ms(&handover(false, None, 2_015)), Some(15));
        // A grant before the lease's end (A let go early) costs nothing.
        assert_eq!(
            unavailable_ms(&handover(false, Some(1_500), 1_510)),
            Some(0)
        );
    }

    #[test]
    fn a_renewed_lease_ends_when_its_holder_lets_go_or_is_unknown() {
        assert_eq!(
            unavailable_ms(&handover(true, Some(2_600), 2_620)),
            Some(20)
        );
        assert_eq!(unavailable_ms(&handover(true, None, 2_620)), None);
        let no_b = Handover {
            b_granted_ms: None,
            ..handover(false, None, 0)
        };
        assert_eq!(unavailable_ms(&no_b), None);
    }

    #[test]
    fn a_store_whose_final_writer_is_not_its_last_accepted_is_refused() {
        let attempts = [attempt("B", true, 1), attempt("A", true, 2)];
        assert_eq!(
            judge_with(
                decided(true, true, 1),
                Release::Deleted,
                &attempts,
                Some("B")
            ),
            Err(Inconsistent)
        );
    }
}
