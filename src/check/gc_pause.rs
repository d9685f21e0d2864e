//! The checkers of lab `gc-pause`: pure functions from the evidence the servers gave to the
//! facts its verdict states (see [`super`] for the rules every checker follows).
//!
//! One run of the lab is two holders of one Redis lock, A (frozen) and B (waiting), and
//! one resource in the fenced store. The evidence is what Redis answered each release, the
//! owner value Redis granted B, and the store's attempts in its decision order.

use super::{Finding, LateWrite, last_accepted_is_final, late_write, two_holders_given_writes};
use crate::lock::redis::Release;
use crate::store::Attempt;

/// The stale holder, frozen while it held the lock.
pub const STALE: &str = "A";
/// The holder Redis granted the lock to next.
pub const NEXT: &str = "B";

/// One run's evidence, as the servers gave it.
#[derive(Clone, Debug)]
pub struct Evidence<'a> {
    /// What A's compare-and-delete found when it let go.
    pub a_release: &'a Release,
    /// The owner value Redis granted B (None: B never got the lock).
    pub b_owner: Option<&'a str>,
    /// What B's compare-and-delete found (None: B never let go).
    pub b_release: Option<&'a Release>,
    /// Every write attempt on the run's resource, in the store's decision order.
    pub attempts: &'a [Attempt],
    /// The writer the resource's row names.
    pub final_writer: Option<&'a str>,
    /// Redis's evidence that A's key was gone before A wrote (the lab saw it expire, or
    /// crashed the Redis holding it, while A was frozen).
    pub a_key_gone_before_write: bool,
    /// On the lab's clock (ms): A's PX ran at least until then, by the PTTL Redis answered
    /// for A's key before the crash (the time the question was sent + the PTTL).
    pub a_lease_until_ms: Option<u64>,
    /// On the lab's clock (ms): B had been granted by then (its grant's report arrived; the
    /// grant itself came earlier, so this is an upper bound).
    pub b_granted_by_ms: Option<u64>,
}

/// What one run shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Findings {
    /// Redis granted B the lock while A still believed it held it.
    pub two_holders: Finding,
    /// A's write in the store's decision order relative to B's accepted write.
    pub late_write: LateWrite,
    /// A's compare-and-delete did not find its own key: Redis had ended A's lease first.
    pub a_lease_ran_out: bool,
    /// The store has a record of A's write at all.
    pub a_write_recorded: bool,
    /// Who the store decided first.
    pub first_writer: Option<String>,
    /// What the store decided for B's (last) write; None when B did not write.
    pub b_write_accepted: Option<bool>,
    /// The tokens of A's and B's last writes.
    pub stale_token: Option<i64>,
    pub newer_token: Option<i64>,
    /// A and B wrote with one and the same token: its source issued it twice.
    pub token_reissued: bool,
    /// Redis granted B while A's PX still ran: B's grant's upper bound falls before the
    /// lower bound of the end of A's lease. Unknown when the bounds overlap or are missing.
    pub b_granted_within_a_lease: Finding,
    /// What the store decided for A's write when A wrote after its key was gone (whatever
    /// the order); None when A's key was not seen gone first, or A never wrote.
    pub a_stale_write_accepted: Option<bool>,
}

/// The store's record disagrees with itself: the row's final writer is not the last accepted
/// attempt. No verdict is read from such a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inconsistent {
    pub final_writer: Option<String>,
}

/// Judges one run from Redis's answers and the store's record.
pub fn judge(evidence: &Evidence) -> Result<Findings, Inconsistent> {
    let attempts = evidence.attempts;
    if !last_accepted_is_final(attempts, evidence.final_writer) {
        return Err(Inconsistent {
            final_writer: evidence.final_writer.map(String::from),
        });
    }
    let late_write = late_write(attempts, STALE, NEXT);
    let stale_token = last_token_of(attempts, STALE);
    let newer_token = last_token_of(attempts, NEXT);
    let within = b_granted_within_a_lease(evidence);
    Ok(Findings {
        two_holders: match within {
            Finding::Yes => Finding::Yes,
            _ => two_holders(evidence, late_write),
        },
        b_granted_within_a_lease: within,
        a_stale_write_accepted: evidence
            .a_key_gone_before_write
            .then(|| last_of(attempts, STALE).map(|a| a.accepted))
            .flatten(),
        late_write,
        a_lease_ran_out: !evidence.a_release.deleted(),
        a_write_recorded: attempts.iter().any(|a| a.writer == STALE),
        first_writer: attempts.first().map(|a| a.writer.clone()),
        b_write_accepted: last_of(attempts, NEXT).map(|a| a.accepted),
        stale_token,
        newer_token,
        token_reissued: stale_token.is_some() && stale_token == newer_token,
    })
}

/// Two holders, by Redis's answers to the releases (see [`super::two_holders`]); where those
/// cannot order B's grant, A's write decided after B's accepted one proves it.
pub fn two_holders(evidence: &Evidence, late: LateWrite) -> Finding {
    two_holders_given_writes(
        super::two_holders(evidence.a_release, evidence.b_owner, evidence.b_release),
        late,
    )
}

/// B granted before A's PX ran out, from the times Redis's answers reached the lab: B's
/// grant came no later than its report (`b_granted_by_ms`), A's key would have lived at
/// least until `a_lease_until_ms`. Only "yes" is proved by these bounds; overlapping ones
/// prove nothing either way.
pub fn b_granted_within_a_lease(evidence: &Evidence) -> Finding {
    match (evidence.b_granted_by_ms, evidence.a_lease_until_ms) {
        (Some(granted_by), Some(until)) if granted_by < until => Finding::Yes,
        (None, _) => Finding::No,
        _ => Finding::Unknown,
    }
}

fn last_of<'a>(attempts: &'a [Attempt], writer: &str) -> Option<&'a Attempt> {
    attempts.iter().rev().find(|a| a.writer == writer)
}

fn last_token_of(attempts: &[Attempt], writer: &str) -> Option<i64> {
    last_of(attempts, writer).and_then(|a| a.token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::attempt;

    fn final_of(attempts: &[Attempt]) -> Option<&str> {
        attempts
            .iter()
            .rev()
            .find(|a| a.accepted)
            .map(|a| a.writer.as_str())
    }

    fn judged(a: Release, b: Option<(&str, Release)>, attempts: &[Attempt]) -> Findings {
        judge(&Evidence {
            a_release: &a,
            b_owner: b.as_ref().map(|(owner, _)| *owner),
            b_release: b.as_ref().map(|(_, release)| release),
            attempts,
            final_writer: final_of(attempts),
            a_key_gone_before_write: !matches!(a, Release::Deleted),
            a_lease_until_ms: None,
            b_granted_by_ms: None,
        })
        .unwrap()
    }

    #[test]
    fn unfenced_the_stale_write_lands_and_b_is_lost() {
        let attempts = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        let found = judged(
            Release::HeldBy("b".into()),
            Some(("b", Release::Deleted)),
            &attempts,
        );
        assert_eq!(found.two_holders, Finding::Yes);
        assert_eq!(found.late_write, LateWrite::Accepted);
        assert!(found.a_lease_ran_out && found.a_write_recorded);
        assert_eq!(found.first_writer.as_deref(), Some("B"));
        assert_eq!(found.b_write_accepted, Some(true));
        assert!(!found.token_reissued, "no tokens, nothing reissued");
    }

    #[test]
    fn fenced_the_lower_token_is_refused() {
        let attempts = [
            attempt(1, "B", Some(2), true),
            attempt(2, "A", Some(1), false),
        ];
        let found = judged(
            Release::HeldBy("b".into()),
            Some(("b", Release::Deleted)),
            &attempts,
        );
        assert_eq!(found.two_holders, Finding::Yes);
        assert_eq!(found.late_write, LateWrite::Rejected);
        assert_eq!((found.stale_token, found.newer_token), (Some(1), Some(2)));
        assert!(!found.token_reissued);
    }

    #[test]
    fn a_pause_shorter_than_the_ttl_breaks_nothing() {
        // A deleted its own key: its lease lasted until it let go, and B wrote after it.
        let attempts = [attempt(1, "A", None, true), attempt(2, "B", None, true)];
        let found = judged(Release::Deleted, Some(("b", Release::Deleted)), &attempts);
        assert_eq!(found.two_holders, Finding::No);
        assert_eq!(found.late_write, LateWrite::None);
        assert!(!found.a_lease_ran_out);
        assert_eq!(found.first_writer.as_deref(), Some("A"));
    }

    #[test]
    fn at_the_ttl_edge_a_lease_that_ran_out_before_b_was_granted_is_one_holder() {
        // A's key expired, nobody held it when A let go, and B's own key lived until B's
        // release: B was granted after A let go. A wrote first: no stale write, by luck.
        let attempts = [attempt(1, "A", None, true), attempt(2, "B", None, true)];
        let found = judged(Release::Gone, Some(("b", Release::Deleted)), &attempts);
        assert_eq!(found.two_holders, Finding::No);
        assert_eq!(found.late_write, LateWrite::None);
        assert!(found.a_lease_ran_out);
    }

    #[test]
    fn two_expired_keys_leave_two_holders_unknown_unless_the_store_orders_the_writes() {
        let a_first = [attempt(1, "A", None, true), attempt(2, "B", None, true)];
        let found = judged(Release::Gone, Some(("b", Release::Gone)), &a_first);
        assert_eq!(found.two_holders, Finding::Unknown);
        let b_first = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        let found = judged(Release::Gone, Some(("b", Release::Gone)), &b_first);
        assert_eq!(
            found.two_holders,
            Finding::Yes,
            "A's write after B's settles it"
        );
    }

    #[test]
    fn a_write_the_store_never_recorded_destroyed_nothing() {
        let attempts = [attempt(1, "B", Some(2), true)];
        let found = judged(
            Release::HeldBy("b".into()),
            Some(("b", Release::Deleted)),
            &attempts,
        );
        assert_eq!(found.late_write, LateWrite::None);
        assert!(!found.a_write_recorded);
        assert_eq!(found.stale_token, None);
    }

    #[test]
    fn b_never_granted_is_one_holder_and_no_b_write() {
        let attempts = [attempt(1, "A", None, true)];
        let found = judged(Release::Gone, None, &attempts);
        assert_eq!(found.two_holders, Finding::No);
        assert_eq!(found.b_write_accepted, None);
    }

    #[test]
    fn a_reissued_token_passes_not_lower_after_b() {
        // --token-restart: Redis came back empty, B drew A's token 1 again.
        let attempts = [
            attempt(1, "B", Some(1), true),
            attempt(2, "A", Some(1), true),
        ];
        let found = judged(Release::Gone, Some(("b", Release::Gone)), &attempts);
        assert!(found.token_reissued);
        assert_eq!(found.late_write, LateWrite::Accepted);
        assert_eq!(found.two_holders, Finding::Yes);
    }

    #[test]
    fn refusing_an_equal_token_from_another_holder_refuses_whoever_writes_second() {
        let b_first = [
            attempt(1, "B", Some(1), true),
            attempt(2, "A", Some(1), false),
        ];
        let found = judged(Release::Gone, Some(("b", Release::Gone)), &b_first);
        assert_eq!(found.late_write, LateWrite::Rejected);
        assert_eq!(found.b_write_accepted, Some(true));
        // A first: A's write is not late, and B — granted after A — is the one refused.
        let a_first = [
            attempt(1, "A", Some(1), true),
            attempt(2, "B", Some(1), false),
        ];
        let found = judged(Release::Gone, Some(("b", Release::Gone)), &a_first);
        assert_eq!(found.late_write, LateWrite::None);
        assert_eq!(found.b_write_accepted, Some(false));
        assert_eq!(found.first_writer.as_deref(), Some("A"));
        assert_eq!(found.two_holders, Finding::Unknown, "both keys were gone");
        assert!(found.token_reissued);
    }

    #[test]
    fn b_granted_before_a_lease_could_end_is_two_holders_whoever_writes_first() {
        // --token-restart, A first: A's PX (PTTL read before the crash) ran until 2050 ms,
        // B's grant was reported at 1140 ms; A wrote after its key was gone, and was taken.
        let a_first = [
            attempt(1, "A", Some(1), true),
            attempt(2, "B", Some(1), false),
        ];
        let evidence = |b_granted_by_ms| Evidence {
            a_release: &Release::Gone,
            b_owner: Some("b"),
            b_release: Some(&Release::Gone),
            attempts: &a_first,
            final_writer: Some("A"),
            a_key_gone_before_write: true,
            a_lease_until_ms: Some(2050),
            b_granted_by_ms,
        };
        let found = judge(&evidence(Some(1140))).unwrap();
        assert_eq!(found.b_granted_within_a_lease, Finding::Yes);
        assert_eq!(found.two_holders, Finding::Yes);
        assert_eq!(found.late_write, LateWrite::None, "A's write came first");
        assert_eq!(found.a_stale_write_accepted, Some(true), "but it was stale");
        // A report that came after A's lease could end proves nothing either way.
        let found = judge(&evidence(Some(2100))).unwrap();
        assert_eq!(found.b_granted_within_a_lease, Finding::Unknown);
        assert_eq!(found.two_holders, Finding::Unknown);
    }

    #[test]
    fn sequence_tokens_are_never_reissued_and_keep_b_in_both_orders() {
        let a_first = [
            attempt(1, "A", Some(1), true),
            attempt(2, "B", Some(2), true),
        ];
        let found = judged(Release::Gone, Some(("b", Release::Gone)), &a_first);
        assert!(!found.token_reissued);
        assert_eq!(found.late_write, LateWrite::None);
        assert_eq!(found.b_write_accepted, Some(true));
        let b_first = [
            attempt(1, "B", Some(2), true),
            attempt(2, "A", Some(1), false),
        ];
        let found = judged(Release::Gone, Some(("b", Release::Gone)), &b_first);
        assert_eq!(found.late_write, LateWrite::Rejected);
    }

    #[test]
    fn b_writing_twice_is_judged_by_its_last_write() {
        let attempts = [
            attempt(1, "B", Some(1), false),
            attempt(2, "B", Some(3), true),
        ];
        let found = judged(Release::Deleted, Some(("b", Release::Deleted)), &attempts);
        assert_eq!(found.b_write_accepted, Some(true));
        assert_eq!(found.newer_token, Some(3));
    }

    #[test]
    fn a_store_whose_row_is_not_its_last_accepted_attempt_gives_no_verdict() {
        let attempts = [
            attempt(1, "B", Some(2), true),
            attempt(2, "A", Some(1), false),
        ];
        let err = judge(&Evidence {
            a_release: &Release::Gone,
            b_owner: Some("b"),
            b_release: Some(&Release::Deleted),
            attempts: &attempts,
            final_writer: Some("A"),
            a_key_gone_before_write: true,
            a_lease_until_ms: None,
            b_granted_by_ms: None,
        })
        .unwrap_err();
        assert_eq!(err.final_writer.as_deref(), Some("A"));
    }
}
