//! The checkers of lab `failover`: pure functions from the evidence the servers gave to the
//! facts its verdict states (see [`super`] for the rules every checker follows).
//!
//! The evidence of one scenario: what the old primary answered about A's key just before it
//! died, what the new primary answered after the failover (A's key, B's key), what etcd's
//! members answered about the leader and the lock's queue, and the store's record of every
//! write in decision order.

use std::time::Duration;

use super::{Finding, LateWrite, last_accepted_is_final, late_write, two_holders_given_writes};
use crate::store::Attempt;

/// What the two primaries said of one Redis lock around the failover. Times are on the run's
/// one clock, in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedisGrants {
    /// When the old primary answered `GET`/`PTTL` for A's key (it held A's owner value)…
    pub a_read_ms: u64,
    /// …and the `PTTL` it answered: A's lease ran at least until `a_read_ms + a_pttl_ms`.
    pub a_pttl_ms: u64,
    /// The promoted replica answered `EXISTS` 0 for A's key: the failover lost it.
    pub new_primary_forgot: bool,
    /// When the lab read B's key on the new primary, after B said it was granted.
    pub b_read_ms: u64,
    /// The new primary's key held B's owner value: the server granted B the lock.
    pub b_key_seen: bool,
}

/// Did the Redis failover hand one lock to two clients at once?
///
/// Two holders when the new primary had forgotten A's key, answered with B's, and did so
/// while A's lease — as the old primary counted it — was still running. If the new primary
/// still had A's key, `SET NX` could not have granted B; if A's lease had run out, B's
/// grant is lab 1's expiry, not the failover's doing.
pub fn redis_two_holders(grants: &RedisGrants) -> Finding {
    let a_lease_ends = grants.a_read_ms + grants.a_pttl_ms;
    if grants.new_primary_forgot && grants.b_key_seen && grants.b_read_ms < a_lease_ends {
        Finding::Yes
    } else {
        Finding::No
    }
}

/// How B's fencing token compares with A's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenOrder {
    /// B's token is lower: the source went back further than A's token (a lost `INCR`
    /// after earlier holders).
    Lower,
    /// B drew A's token again: the source handed a number out twice.
    Again,
    /// B's token is higher: the source moved forward, as a fencing token must.
    Higher,
}

impl TokenOrder {
    /// B's token was not higher than A's: the source reissued a number.
    pub fn reissued(self) -> bool {
        !matches!(self, TokenOrder::Higher)
    }
}

/// The order of A's and B's tokens; None when either wrote without one.
pub fn token_order(a: Option<i64>, b: Option<i64>) -> Option<TokenOrder> {
    let (a, b) = (a?, b?);
    Some(match b.cmp(&a) {
        std::cmp::Ordering::Less => TokenOrder::Lower,
        std::cmp::Ordering::Equal => TokenOrder::Again,
        std::cmp::Ordering::Greater => TokenOrder::Higher,
    })
}

/// The token of `writer`'s last attempt, if it sent one.
pub fn last_token_of(attempts: &[Attempt], writer: &str) -> Option<i64> {
    attempts
        .iter()
        .rev()
        .find(|a| a.writer == writer)
        .and_then(|a| a.token)
}

/// What the store's record says of one scenario's two writers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Writes {
    /// Two holders: the lock service's answer, settled by the store where A wrote after B.
    pub two_holders: Finding,
    /// A's write, in decision order relative to B's accepted one.
    pub late: LateWrite,
    pub a_token: Option<i64>,
    pub b_token: Option<i64>,
    pub tokens: Option<TokenOrder>,
    /// The store has an attempt of A's at all.
    pub a_wrote: bool,
}

impl Writes {
    /// A's late write was taken: B's result, written under the lock, is lost.
    pub fn lost_update(&self) -> bool {
        self.late == LateWrite::Accepted
    }
}

/// The store's record disagrees with itself: the last accepted attempt is not the final
/// writer. No verdict is read from such a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inconsistent;

/// Reads one scenario's facts from the store's record (`attempts` in decision order) and the
/// lock service's own answer on two holders.
pub fn writes(
    from_lock: Finding,
    attempts: &[Attempt],
    final_writer: Option<&str>,
    a: &str,
    b: &str,
) -> Result<Writes, Inconsistent> {
    if !last_accepted_is_final(attempts, final_writer) {
        return Err(Inconsistent);
    }
    let late = late_write(attempts, a, b);
    let (a_token, b_token) = (last_token_of(attempts, a), last_token_of(attempts, b));
    Ok(Writes {
        two_holders: two_holders_given_writes(from_lock, late),
        late,
        a_token,
        b_token,
        tokens: token_order(a_token, b_token),
        a_wrote: attempts.iter().any(|attempt| attempt.writer == a),
    })
}

/// The verdict's "late write" column: what became of A's write after the failover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LateWriteSeen {
    /// Decided after B's accepted write, and taken.
    Accepted,
    /// Decided after B's accepted write, and refused.
    Rejected,
    /// A asked the server whether its lock was safe (`WAIT`, `min-replicas-to-write`),
    /// learned it was not, and wrote nothing.
    NotMade,
    /// No write of A's came after B's.
    None,
}

/// `a_checked`: A asked the server before using its lock (its `WAIT` answer, or the
/// primary's refusal of its `SET NX`, is on record).
pub fn late_write_seen(late: LateWrite, a_checked: bool, a_wrote: bool) -> LateWriteSeen {
    match late {
        LateWrite::Accepted => LateWriteSeen::Accepted,
        LateWrite::Rejected => LateWriteSeen::Rejected,
        LateWrite::None if a_checked && !a_wrote => LateWriteSeen::NotMade,
        LateWrite::None => LateWriteSeen::None,
    }
}

/// Where an etcd election stands, from one member's `status` after the leader was killed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Election {
    /// No leader named, or still the dead one.
    NotYet,
    /// A new leader is named, but the member has not yet applied an entry of its term:
    /// `status` still reports the old term (it reports the applied entry's term).
    LeaderNamed,
    /// A new leader, and the member reports a higher term: the new leader's first entry
    /// (an empty one of its own term) is applied.
    Elected,
}

pub fn election(old_leader: u64, old_term: u64, leader_now: u64, term_now: u64) -> Election {
    if leader_now == 0 || leader_now == old_leader {
        Election::NotYet
    } else if term_now > old_term {
        Election::Elected
    } else {
        Election::LeaderNamed
    }
}

/// Did B keep its place in etcd's queue through the election? Its key's create revision
/// is its token: the same revision as when it queued means the same key.
pub fn kept_place(queued_revision: i64, granted_token: i64) -> bool {
    queued_revision == granted_token
}

/// Does a lease's remaining TTL, as the new leader reports it, prove that the holder's
/// keepalive reached that leader?
///
/// A new leader resets every lease to its full TTL plus an election timeout, counted from
/// its election (`extension`); from then on only a renewal raises it again. `since` is
/// counted from when the lab *saw* the new leader, which is after the election, so the
/// reset alone leaves at most `extension - since`: anything above that is a renewal. etcd
/// reports the TTL in whole seconds rounded down, which only makes the test stricter.
pub fn renewed_after_election(left: Duration, since: Duration, extension: Duration) -> bool {
    left + since > extension
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::attempt;

    fn grants() -> RedisGrants {
        RedisGrants {
            a_read_ms: 650,
            a_pttl_ms: 9_450,
            new_primary_forgot: true,
            b_read_ms: 2_600,
            b_key_seen: true,
        }
    }

    #[test]
    fn only_a_lease_above_the_new_leaders_reset_proves_a_renewal() {
        let extension = Duration::from_millis(6_500);
        // Right after the election the reset alone leaves nearly all of it: no proof.
        assert!(!renewed_after_election(
            Duration::from_secs(6),
            Duration::from_millis(200),
            extension
        ));
        // 3s later the reset would leave at most 3.5s: 5s left means a renewal since.
        assert!(renewed_after_election(
            Duration::from_secs(5),
            Duration::from_secs(3),
            extension
        ));
        assert!(!renewed_after_election(
            Duration::from_secs(3),
            Duration::from_secs(3),
            extension
        ));
    }

    #[test]
    fn a_failover_that_forgot_a_running_lease_and_granted_b_is_two_holders() {
        assert_eq!(redis_two_holders(&grants()), Finding::Yes);
    }

    #[test]
    fn a_new_primary_that_kept_as_key_or_never_named_b_is_one_holder() {
        let kept = RedisGrants {
            new_primary_forgot: false,
            ..grants()
        };
        assert_eq!(redis_two_holders(&kept), Finding::No);
        let not_b = RedisGrants {
            b_key_seen: false,
            ..grants()
        };
        assert_eq!(redis_two_holders(&not_b), Finding::No);
    }

    #[test]
    fn b_granted_once_as_lease_ran_out_is_an_expiry_not_two_holders() {
        let late = RedisGrants {
            b_read_ms: 650 + 9_450,
            ..grants()
        };
        assert_eq!(redis_two_holders(&late), Finding::No);
        let just_inside = RedisGrants {
            b_read_ms: 650 + 9_449,
            ..grants()
        };
        assert_eq!(redis_two_holders(&just_inside), Finding::Yes);
    }

    #[test]
    fn tokens_are_ordered_and_only_a_higher_one_is_fresh() {
        assert_eq!(token_order(Some(1), Some(1)), Some(TokenOrder::Again));
        assert_eq!(token_order(Some(3), Some(1)), Some(TokenOrder::Lower));
        assert_eq!(token_order(Some(7), Some(8)), Some(TokenOrder::Higher));
        assert_eq!(token_order(None, Some(1)), None);
        assert_eq!(token_order(Some(1), None), None);
        assert!(TokenOrder::Again.reissued());
        assert!(TokenOrder::Lower.reissued());
        assert!(!TokenOrder::Higher.reissued());
    }

    #[test]
    fn unfenced_a_writes_last_and_the_store_takes_it() {
        // redis-unfenced: no tokens, A's write decided after B's: B's result lost.
        let attempts = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        let w = writes(Finding::Yes, &attempts, Some("A"), "A", "B").unwrap();
        assert_eq!(w.late, LateWrite::Accepted);
        assert!(w.lost_update());
        assert_eq!(w.tokens, None);
        assert_eq!(w.two_holders, Finding::Yes);
    }

    #[test]
    fn a_reissued_token_gets_past_not_lower_but_not_past_same_holder() {
        // redis-incr-not-lower: B drew A's token again; `>=` takes A's late write.
        let not_lower = [
            attempt(1, "B", Some(1), true),
            attempt(2, "A", Some(1), true),
        ];
        let w = writes(Finding::Yes, &not_lower, Some("A"), "A", "B").unwrap();
        assert_eq!(w.tokens, Some(TokenOrder::Again));
        assert_eq!(w.late, LateWrite::Accepted);
        // redis-incr-same-holder: an equal token from another writer is refused.
        let same_holder = [
            attempt(1, "B", Some(1), true),
            attempt(2, "A", Some(1), false),
        ];
        let w = writes(Finding::Yes, &same_holder, Some("B"), "A", "B").unwrap();
        assert_eq!(w.late, LateWrite::Rejected);
        assert!(!w.lost_update());
    }

    #[test]
    fn a_counter_that_went_back_hands_b_a_lower_token_and_as_write_lands() {
        // redis-incr-lost: earlier holders drew 1 and 2 on the old primary only; A drew 3,
        // B draws 1 from the promoted replica.
        let attempts = [
            attempt(1, "B", Some(1), true),
            attempt(2, "A", Some(3), true),
        ];
        let w = writes(Finding::Yes, &attempts, Some("A"), "A", "B").unwrap();
        assert_eq!(w.tokens, Some(TokenOrder::Lower));
        assert!(w.tokens.unwrap().reissued());
        assert_eq!(w.late, LateWrite::Accepted);
    }

    #[test]
    fn a_durable_token_is_higher_and_the_store_refuses_the_late_write() {
        let attempts = [
            attempt(1, "B", Some(2), true),
            attempt(2, "A", Some(1), false),
        ];
        let w = writes(Finding::Yes, &attempts, Some("B"), "A", "B").unwrap();
        assert_eq!(w.tokens, Some(TokenOrder::Higher));
        assert_eq!(w.late, LateWrite::Rejected);
    }

    #[test]
    fn a_that_refused_to_write_made_no_late_write_though_redis_granted_twice() {
        // redis-wait: WAIT answered 0, A wrote nothing; only B's write is on record.
        let attempts = [attempt(1, "B", None, true)];
        let w = writes(Finding::Yes, &attempts, Some("B"), "A", "B").unwrap();
        assert_eq!(w.late, LateWrite::None);
        assert!(!w.a_wrote);
        assert_eq!(w.two_holders, Finding::Yes, "the lock's answer stands");
        assert_eq!(
            late_write_seen(w.late, true, w.a_wrote),
            LateWriteSeen::NotMade
        );
        assert_eq!(
            late_write_seen(w.late, false, w.a_wrote),
            LateWriteSeen::None
        );
    }

    #[test]
    fn the_column_shows_what_the_store_decided() {
        assert_eq!(
            late_write_seen(LateWrite::Accepted, false, true),
            LateWriteSeen::Accepted
        );
        assert_eq!(
            late_write_seen(LateWrite::Rejected, true, true),
            LateWriteSeen::Rejected
        );
        // A checked, was told it was safe, and wrote before B: nothing late, and made.
        assert_eq!(
            late_write_seen(LateWrite::None, true, true),
            LateWriteSeen::None
        );
    }

    #[test]
    fn a_write_decided_after_b_settles_two_holders_the_lock_could_not() {
        let attempts = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        let w = writes(Finding::Unknown, &attempts, Some("A"), "A", "B").unwrap();
        assert_eq!(w.two_holders, Finding::Yes);
        let in_order = [
            attempt(1, "A", Some(7), true),
            attempt(2, "B", Some(9), true),
        ];
        let w = writes(Finding::No, &in_order, Some("B"), "A", "B").unwrap();
        assert_eq!(w.two_holders, Finding::No);
        assert_eq!(w.late, LateWrite::None);
    }

    #[test]
    fn nothing_granted_leaves_an_empty_record_and_no_finding_but_the_locks() {
        // redis-min-replicas, etcd-majority-lost: no attempts at all.
        let w = writes(Finding::No, &[], None, "A", "B").unwrap();
        assert_eq!(w.two_holders, Finding::No);
        assert_eq!(w.late, LateWrite::None);
        assert_eq!((w.a_token, w.b_token, w.tokens), (None, None, None));
        assert!(!w.a_wrote);
    }

    #[test]
    fn a_record_that_disagrees_with_itself_gives_no_verdict() {
        let attempts = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        assert_eq!(
            writes(Finding::Yes, &attempts, Some("B"), "A", "B"),
            Err(Inconsistent)
        );
    }

    #[test]
    fn the_last_attempt_carries_the_writers_token() {
        // A writer with two resources' worth of attempts: its last one counts.
        let attempts = [
            attempt(1, "A", Some(1), true),
            attempt(2, "B", Some(2), true),
            attempt(3, "A", Some(4), false),
        ];
        assert_eq!(last_token_of(&attempts, "A"), Some(4));
        assert_eq!(last_token_of(&attempts, "B"), Some(2));
        assert_eq!(last_token_of(&attempts, "C"), None);
    }

    #[test]
    fn the_term_named_is_the_new_leaders_not_the_applied_entrys() {
        // Right after the election, `status` names the new leader but reports the term of
        // the last applied entry: still the old one.
        assert_eq!(election(11, 2, 0, 2), Election::NotYet);
        assert_eq!(election(11, 2, 11, 2), Election::NotYet);
        assert_eq!(election(11, 2, 12, 2), Election::LeaderNamed);
        assert_eq!(election(11, 2, 12, 3), Election::Elected);
    }

    #[test]
    fn b_kept_its_place_only_if_its_key_kept_its_revision() {
        assert!(kept_place(42, 42));
        assert!(!kept_place(42, 45));
    }
}
