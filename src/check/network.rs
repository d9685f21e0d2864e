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
    /// The holder that stops (the cut, third row): what A's heartbeat said when A asked it
    /// before its second write — Some(true) it had given the lock up; None A never asked.
    pub a_asked_again_lost: Option<bool>,
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
    /// The holder that stops: A, told by its heartbeat that the lock was given up, sent no
    /// second write — the store holds one attempt of A's, not two. Unknown when A never
    /// asked before a second write.
    pub a_next_write_stopped: Finding,
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
        a_next_write_stopped: next_write_stopped(evidence),
    })
}

fn next_write_stopped(evidence: &Evidence) -> Finding {
    let a_writes = evidence
        .attempts
        .iter()
        .filter(|a| a.writer == LATE)
        .count();
    match evidence.a_asked_again_lost {
        None => Finding::Unknown,
        Some(_) if a_writes > 1 => Finding::No,
        Some(true) if a_writes == 1 => Finding::Yes,
        Some(_) => Finding::Unknown,
    }
}

/// A cut's timing on the lab's clock (ms, as the reports arrived), read off the history
/// by the lab (`labs::network::verdict::cut_timing`):
/// A's first renewal that failed, A's heartbeat giving the lock up, the lab's own
/// connection finding A's key gone (lane `redis` or `etcd`), B's grant, A's write answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CutTiming {
    pub renewal_failed_ms: Option<u64>,
    pub gave_up_ms: Option<u64>,
    pub expired_ms: Option<u64>,
    pub b_granted_ms: Option<u64>,
    pub a_wrote_ms: Option<u64>,
}

impl CutTiming {
    /// A's renewal failed no later than its heartbeat gave up, and before B was granted
    /// the lock: A could have known it was cut off before anyone else held the lock.
    /// Unknown when the history lacks one of the three.
    pub fn failed_first(&self) -> Finding {
        match (self.renewal_failed_ms, self.gave_up_ms, self.b_granted_ms) {
            (Some(failed), Some(gave_up), Some(b)) if failed <= gave_up && failed < b => {
                Finding::Yes
            }
            (Some(_), Some(_), Some(_)) => Finding::No,
            _ => Finding::Unknown,
        }
    }
}

/// What A's client does when its `SET NX PX` got no answer (lab 8's lost reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// ✅ Retries with the owner value it sent, and reads the key to learn whose it is.
    SameOwner,
    /// ❌ Retries as a new acquisition, with a new owner value.
    NewOwner,
    /// ❌ Treats "no answer" as "not taken" and goes away.
    GiveUp,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::SameOwner => "same-owner",
            Policy::NewOwner => "new-owner",
            Policy::GiveUp => "give-up",
        }
    }

    pub fn says(self) -> &'static str {
        match self {
            Policy::SameOwner => "A retries with the same owner value",
            Policy::NewOwner => "A retries with a new owner value",
            Policy::GiveUp => "A gives up",
        }
    }
}

/// One lost `SET NX PX`, as Redis and the client answered.
#[derive(Clone, Debug)]
pub struct ReplyEvidence<'a> {
    pub policy: Policy,
    /// The owner value A sent in the request whose answer was lost.
    pub sent_owner: &'a str,
    /// The key's value read back right after the loss (None: no key).
    pub after_loss: Option<&'a str>,
    /// The owner value A believes it holds the lock with at the end (None: A thinks it
    /// holds nothing).
    pub believed: Option<&'a str>,
    /// The key's value read back at the end, before anyone let go.
    pub held_by: Option<&'a str>,
    /// How long a retry with a new value waited for the lock.
    pub waited_ms: Option<u64>,
    /// How long the server kept the key of A's lost request, from A's send until the lab
    /// read it gone or a retry's key took its place (None: not watched). Whatever A did
    /// meanwhile, that key held the lock.
    pub first_key_ms: Option<u64>,
}

/// What one lost `SET NX PX` shows.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ReplyFound {
    pub policy: Policy,
    /// Redis applied the request whose answer was lost (its value was in the key).
    pub applied: bool,
    /// At the end, A's belief and Redis agree: A holds the lock exactly when the key holds
    /// the value A believes is its own.
    pub a_knows: bool,
    /// A waited for a lock that Redis said was A's own.
    pub waited_behind_itself: bool,
    pub waited_ms: Option<u64>,
    /// The key of A's lost request held the lock until it expired, and nobody worked under
    /// it: A no longer counted it its own (it gave up, or waited behind it with a new value).
    pub orphaned: bool,
    pub orphaned_ms: Option<u64>,
}

/// What etcd's lock call, queued behind another holder, left behind once its connection
/// went (lab 8's lost reply, its etcd half), read back from etcd.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QueuedFound {
    /// The lab's etcd client logs in as a user (its URL names one), so auth is on: etcd's
    /// lock service then cannot delete a cancelled waiter's key (etcd-io/etcd#13330).
    pub auth: bool,
    /// A's waiter key was still under the lock's name after A's connection closed.
    pub key_left: bool,
    /// When the lab let go, etcd handed the lock to A's key, a client that had gone.
    pub handed_to_a: bool,
}

pub fn lost_set(evidence: &ReplyEvidence) -> ReplyFound {
    let applied = evidence.after_loss == Some(evidence.sent_owner);
    let a_knows = match evidence.believed {
        Some(value) => evidence.held_by == Some(value),
        None => evidence.held_by.is_none(),
    };
    ReplyFound {
        policy: evidence.policy,
        applied,
        a_knows,
        waited_behind_itself: applied
            && evidence.policy == Policy::NewOwner
            && evidence.waited_ms.is_some(),
        waited_ms: evidence.waited_ms,
        // Read from what the server held, not from the policy: the key was A's first
        // request's, and A ended up believing in another value or in none.
        orphaned: applied
            && evidence.believed != Some(evidence.sent_owner)
            && evidence.first_key_ms.is_some(),
        orphaned_ms: evidence.first_key_ms,
    }
}

/// One payment whose `COMMIT` answer was lost, then retried, read back from Postgres.
#[derive(Clone, Debug)]
pub struct PaymentEvidence {
    /// The retry carried the first attempt's idempotency key.
    pub keyed: bool,
    /// Rows of the payment right after the loss (1: the COMMIT happened).
    pub after_loss: u64,
    /// Rows at the end, after the retry, and the sum paid.
    pub rows: u64,
    pub total: i64,
}

/// What one lost `COMMIT` shows.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PaymentFound {
    pub idempotency_key: bool,
    /// The COMMIT whose answer was lost had committed.
    pub committed: bool,
    pub rows: u64,
    pub total: i64,
    /// The retry made the payment a second time.
    pub doubled: bool,
}

pub fn lost_commit(evidence: &PaymentEvidence) -> PaymentFound {
    PaymentFound {
        idempotency_key: evidence.keyed,
        committed: evidence.after_loss > 0,
        rows: evidence.rows,
        total: evidence.total,
        doubled: evidence.rows > 1,
    }
}

/// A fenced write whose `COMMIT` answer was lost, then retried with the same token, read
/// back from the store's attempt log.
#[derive(Clone, Debug)]
pub struct FencedRetryEvidence {
    pub token: i64,
    /// Accepted attempts with the token right after the loss (1: the write happened).
    pub after_loss: u64,
    /// Accepted attempts with the token after the retry, and their decision numbers.
    pub decisions: Vec<i64>,
}

/// What the fenced write's lost answer shows.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct FencedRetryFound {
    pub token: i64,
    /// The write whose answer was lost had been accepted.
    pub committed: bool,
    /// Accepted attempts with the token at the end, and the store's decision numbers.
    pub accepted: u64,
    pub decisions: Vec<i64>,
    /// The retry was accepted too: one write applied twice under one token, which a token
    /// not lower than the highest accepted cannot refuse.
    pub doubled: bool,
}

pub fn lost_fenced_retry(evidence: &FencedRetryEvidence) -> FencedRetryFound {
    let accepted = evidence.decisions.len() as u64;
    FencedRetryFound {
        token: evidence.token,
        committed: evidence.after_loss > 0,
        accepted,
        decisions: evidence.decisions.clone(),
        doubled: accepted > 1,
    }
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
            a_asked_again_lost: None,
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

    #[test]
    fn a_holder_that_stops_sends_no_second_write_but_its_first_still_lands() {
        let attempts = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        let mut seen = evidence(&attempts, Some("A"));
        assert_eq!(judge(&seen).unwrap().a_next_write_stopped, Finding::Unknown);
        seen.a_asked_again_lost = Some(true);
        let found = judge(&seen).unwrap();
        assert_eq!(found.a_next_write_stopped, Finding::Yes);
        assert_eq!(
            found.late_write,
            LateWrite::Accepted,
            "the one in flight landed"
        );
        // A heartbeat that had not given up lets the second write go: the store has two.
        let two = [
            attempt(1, "B", None, true),
            attempt(2, "A", None, true),
            attempt(3, "A", None, true),
        ];
        let mut seen = evidence(&two, Some("A"));
        seen.a_asked_again_lost = Some(false);
        assert_eq!(judge(&seen).unwrap().a_next_write_stopped, Finding::No);
        // Said it stopped, yet the store holds no write of A's: nothing to read it from.
        let none = [attempt(1, "B", None, true)];
        let mut seen = evidence(&none, Some("B"));
        seen.a_asked_again_lost = Some(true);
        assert_eq!(judge(&seen).unwrap().a_next_write_stopped, Finding::Unknown);
    }

    fn reply(policy: Policy) -> ReplyEvidence<'static> {
        ReplyEvidence {
            policy,
            sent_owner: "a1",
            after_loss: Some("a1"),
            believed: Some("a1"),
            held_by: Some("a1"),
            waited_ms: None,
            first_key_ms: None,
        }
    }

    #[test]
    fn a_retry_with_the_same_owner_finds_the_lock_its_own() {
        let found = lost_set(&reply(Policy::SameOwner));
        assert!(found.applied);
        assert!(found.a_knows);
        assert!(!found.waited_behind_itself);
        assert!(!found.orphaned);
        // However long the key lived, it was A's, and A held it.
        let mut seen = reply(Policy::SameOwner);
        seen.first_key_ms = Some(1000);
        assert!(!lost_set(&seen).orphaned);
    }

    #[test]
    fn a_retry_with_a_new_owner_waits_behind_its_own_applied_set() {
        let mut seen = reply(Policy::NewOwner);
        seen.believed = Some("a2");
        seen.held_by = Some("a2");
        seen.waited_ms = Some(990);
        seen.first_key_ms = Some(1000);
        let found = lost_set(&seen);
        assert!(found.waited_behind_itself);
        assert!(found.a_knows);
        // A's first key held the lock all that time, and nobody worked under it: A was
        // waiting behind it.
        assert!(found.orphaned);
        assert_eq!(found.orphaned_ms, Some(1000));
        // Had the first SET not landed, the wait was behind someone else.
        seen.after_loss = Some("b1");
        assert!(!lost_set(&seen).waited_behind_itself);
    }

    #[test]
    fn giving_up_on_an_applied_set_leaves_a_lock_nobody_holds() {
        let mut seen = reply(Policy::GiveUp);
        seen.believed = None;
        seen.held_by = None;
        seen.first_key_ms = Some(1000);
        let found = lost_set(&seen);
        assert!(found.orphaned);
        assert!(found.a_knows, "at the end the key is gone");
        // Read back while the key still held A's value, A's belief was wrong.
        seen.held_by = Some("a1");
        assert!(!lost_set(&seen).a_knows);
        seen.after_loss = None;
        assert!(!lost_set(&seen).orphaned, "nothing was applied");
    }

    #[test]
    fn a_lost_commit_retried_without_a_key_pays_twice_and_with_one_once() {
        let plain = lost_commit(&PaymentEvidence {
            keyed: false,
            after_loss: 1,
            rows: 2,
            total: 20,
        });
        assert!(plain.committed && plain.doubled);
        let keyed = lost_commit(&PaymentEvidence {
            keyed: true,
            after_loss: 1,
            rows: 1,
            total: 10,
        });
        assert!(keyed.committed && !keyed.doubled);
        let never = lost_commit(&PaymentEvidence {
            keyed: false,
            after_loss: 0,
            rows: 1,
            total: 10,
        });
        assert!(!never.committed && !never.doubled);
    }

    #[test]
    fn a_lost_fenced_write_retried_with_its_token_is_applied_twice() {
        let twice = lost_fenced_retry(&FencedRetryEvidence {
            token: 1,
            after_loss: 1,
            decisions: vec![1, 2],
        });
        assert!(twice.committed && twice.doubled && twice.accepted == 2);
        // The first write never landed: the retry is the only one.
        let once = lost_fenced_retry(&FencedRetryEvidence {
            token: 1,
            after_loss: 0,
            decisions: vec![1],
        });
        assert!(!once.committed && !once.doubled);
    }

    fn timing(failed: Option<u64>, gave_up: u64, b_granted: u64) -> CutTiming {
        CutTiming {
            renewal_failed_ms: failed,
            gave_up_ms: Some(gave_up),
            b_granted_ms: Some(b_granted),
            ..CutTiming::default()
        }
    }

    #[test]
    fn a_renewal_that_failed_before_bs_grant_failed_first() {
        assert_eq!(
            timing(Some(1_200), 1_900, 2_050).failed_first(),
            Finding::Yes
        );
        // A loaded machine: the retries outlast the lease, B is granted before the give-up.
        assert_eq!(
            timing(Some(1_200), 2_100, 2_050).failed_first(),
            Finding::Yes
        );
    }

    #[test]
    fn a_failure_heard_after_bs_grant_or_after_the_give_up_is_not_first() {
        assert_eq!(
            timing(Some(2_050), 2_100, 2_050).failed_first(),
            Finding::No
        );
        assert_eq!(
            timing(Some(1_950), 1_900, 2_050).failed_first(),
            Finding::No
        );
    }

    #[test]
    fn a_cut_without_a_failed_renewal_is_unknown() {
        assert_eq!(timing(None, 1_900, 2_050).failed_first(), Finding::Unknown);
        assert_eq!(CutTiming::default().failed_first(), Finding::Unknown);
    }
}
