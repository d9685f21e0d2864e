//! The checkers of lab `network`: pure functions from the evidence the servers and the
//! proxy gave to the facts its verdict states (see [`super`] for the rules).
//!
//! The delayed write: A holds a Redis lock, checks it (its owner value is in the key, with
//! a PTTL left), sends its write — and the proxy holds that write on A's path to the store.
//! The evidence is A's check as Redis answered it, what the lab saw of A's process while
//! the write was held, the releases as Redis answered them, and the store's attempts in its
//! decision order. That A's write arrived late is not read off a clock: the store decided
//! it after B's write, and B could only write once Redis had granted it the lock.

use super::{Finding, LateWrite, last_accepted_is_final, late_write, two_holders_given_writes};
use crate::lock::redis::Release;
use crate::store::Attempt;

/// The holder whose write is late.
pub const LATE: &str = "A";
/// The holder Redis granted the lock to next.
pub const NEXT: &str = "B";

/// One run's evidence.
#[derive(Clone, Debug)]
pub struct Evidence<'a> {
    /// A's check just before it sent its write: its owner value was still in the key, and
    /// the PTTL Redis answered (None: A made no check).
    pub a_check: Option<(bool, i64)>,
    /// What the lab saw of A's process while its write was held: Some(true) running every
    /// time it looked, Some(false) stopped at least once, None not looked at.
    pub a_process_ran: Option<bool>,
    /// A freeze or a kill of A recorded in the run's history.
    pub a_struck: bool,
    /// What A's compare-and-delete found when it let go.
    pub a_release: Option<&'a Release>,
    /// The owner value Redis granted B (None: B never got the lock).
    pub b_owner: Option<&'a str>,
    pub b_release: Option<&'a Release>,
    /// Every write attempt on the run's resource, in the store's decision order.
    pub attempts: &'a [Attempt],
    pub final_writer: Option<&'a str>,
}

/// What one run shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Findings {
    /// A's own check said the lock was its own, with time left, just before it wrote.
    pub a_checked_ours: Finding,
    /// A was never paused: no freeze of A in the history, and its process seen running
    /// throughout the hold.
    pub a_never_paused: Finding,
    /// Redis granted B the lock while A still believed it held it.
    pub two_holders: Finding,
    /// A's write in the store's decision order relative to B's accepted write.
    pub late_write: LateWrite,
}

/// The store's record disagrees with itself (its row's writer is not the last accepted
/// attempt): no verdict is read from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inconsistent;

pub fn judge(evidence: &Evidence) -> Result<Findings, Inconsistent> {
    if !last_accepted_is_final(evidence.attempts, evidence.final_writer) {
        return Err(Inconsistent);
    }
    let late = late_write(evidence.attempts, LATE, NEXT);
    let from_lock = match evidence.a_release {
        Some(release) => super::two_holders(release, evidence.b_owner, evidence.b_release),
        None => Finding::Unknown,
    };
    Ok(Findings {
        a_checked_ours: match evidence.a_check {
            Some((true, pttl)) if pttl > 0 => Finding::Yes,
            Some(_) => Finding::No,
            None => Finding::Unknown,
        },
        a_never_paused: match (evidence.a_struck, evidence.a_process_ran) {
            (true, _) | (false, Some(false)) => Finding::No,
            (false, Some(true)) => Finding::Yes,
            (false, None) => Finding::Unknown,
        },
        two_holders: two_holders_given_writes(from_lock, late),
        late_write: late,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::attempt;

    fn evidence<'a>(attempts: &'a [Attempt], final_writer: Option<&'a str>) -> Evidence<'a> {
        Evidence {
            a_check: Some((true, 420)),
            a_process_ran: Some(true),
            a_struck: false,
            a_release: None,
            b_owner: Some("b-owner"),
            b_release: None,
            attempts,
            final_writer,
        }
    }

    #[test]
    fn unfenced_the_late_write_lands_on_top_of_bs() {
        let attempts = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        let found = judge(&evidence(&attempts, Some("A"))).unwrap();
        assert_eq!(found.late_write, LateWrite::Accepted);
        assert_eq!(found.two_holders, Finding::Yes);
        assert_eq!(found.a_checked_ours, Finding::Yes);
        assert_eq!(found.a_never_paused, Finding::Yes);
    }

    #[test]
    fn fenced_the_late_write_is_refused() {
        let attempts = [
            attempt(1, "B", Some(8), true),
            attempt(2, "A", Some(7), false),
        ];
        let found = judge(&evidence(&attempts, Some("B"))).unwrap();
        assert_eq!(found.late_write, LateWrite::Rejected);
        assert_eq!(found.two_holders, Finding::Yes);
    }

    #[test]
    fn a_write_that_arrived_first_is_no_late_write() {
        let attempts = [attempt(1, "A", None, true), attempt(2, "B", None, true)];
        let seen = evidence(&attempts, Some("B"));
        let found = judge(&seen).unwrap();
        assert_eq!(found.late_write, LateWrite::None);
        // With no release to read, nothing orders B's grant against A's hold.
        assert_eq!(found.two_holders, Finding::Unknown);
    }

    #[test]
    fn a_freeze_or_a_stopped_process_is_a_pause_and_no_look_is_unknown() {
        let attempts = [attempt(1, "B", None, true)];
        let mut seen = evidence(&attempts, Some("B"));
        seen.a_struck = true;
        assert_eq!(judge(&seen).unwrap().a_never_paused, Finding::No);
        seen.a_struck = false;
        seen.a_process_ran = Some(false);
        assert_eq!(judge(&seen).unwrap().a_never_paused, Finding::No);
        seen.a_process_ran = None;
        assert_eq!(judge(&seen).unwrap().a_never_paused, Finding::Unknown);
    }

    #[test]
    fn a_check_that_found_the_lock_gone_or_expiring_is_not_ours() {
        let attempts = [attempt(1, "B", None, true)];
        let mut seen = evidence(&attempts, Some("B"));
        seen.a_check = Some((false, -2));
        let found = judge(&seen).unwrap();
        assert_eq!(found.a_checked_ours, Finding::No);
        seen.a_check = None;
        assert_eq!(judge(&seen).unwrap().a_checked_ours, Finding::Unknown);
    }

    #[test]
    fn a_store_that_disagrees_with_itself_gives_no_verdict() {
        let attempts = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        assert_eq!(judge(&evidence(&attempts, Some("B"))), Err(Inconsistent));
    }
}
