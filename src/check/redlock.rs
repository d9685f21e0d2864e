//! The checkers of lab `redlock`: pure functions from the evidence the servers gave to the
//! facts its verdict states (see [`super`] for the rules every checker follows).
//!
//! The evidence is of three kinds: each client's round (what every master answered, and on
//! the run's clock when the round began and ended — the validity counts on the client's own
//! clock, which is the algorithm's definition of "held"), the masters read back with GET and
//! PTTL, and the store's record of the late writes.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Finding, late_write};
use crate::lock::redlock::{Answer, Reply};
use crate::store::Attempt;

/// One master's state for a key, as it answered GET and PTTL.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, schemars::JsonSchema)]
pub struct MasterState {
    pub master: String,
    pub port: String,
    /// Whose value the key holds (`A`, `B`; `other` for a value no client of this
    /// scenario wrote), null when there is no key.
    pub holder: Option<String>,
    /// -2: no key. Null when the master did not answer.
    pub pttl_ms: Option<i64>,
    pub answered: bool,
    /// Why there is no answer: down, frozen, or what the client library said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// A client's round on the run's clock: what the algorithm says it held, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Round {
    /// A majority granted and validity was left.
    pub held: bool,
    /// When the round began: the validity counts from here.
    pub began: Duration,
    /// When the round's answer was in (a holder holds from here at the latest).
    pub ended: Duration,
    pub validity_ms: i64,
}

impl Round {
    /// When its validity ends, if it has any.
    pub fn valid_until(&self) -> Option<Duration> {
        (self.validity_ms > 0).then(|| self.began + Duration::from_millis(self.validity_ms as u64))
    }
}

/// Did both clients hold a majority's grant at the same moment? Both rounds ran in the
/// lab's one process, on one monotonic clock: B holds from the end of its round, A until
/// its validity ends. B's grant before that end is two holders; at or after it, not.
pub fn two_holders(a: &Round, b: &Round) -> Finding {
    let overlap = a.held && b.held && a.valid_until().is_some_and(|end| b.ended < end);
    if overlap { Finding::Yes } else { Finding::No }
}

/// How long A's validity still had to run when B was granted (0 when it had none left).
pub fn validity_left_ms(a: &Round, b: &Round) -> i64 {
    a.valid_until()
        .map(|end| end.saturating_sub(b.ended).as_millis() as i64)
        .unwrap_or(0)
}

/// Client-pause: was the lock granted twice within validity? A's round had ended by
/// `a_seen` (when the lab saw A's grant), so A's validity ended by `a_seen + validity`.
/// A round of B's that began after that began after A's validity: not twice. One that
/// began earlier cannot be ordered against the end of A's validity from the lab's clock:
/// unknown, never a guess.
pub fn granted_twice_after_pause(
    a_seen: Duration,
    a_validity_ms: i64,
    b_asked: Duration,
) -> Finding {
    let a_validity_ended = a_seen + Duration::from_millis(a_validity_ms.max(0) as u64);
    if b_asked >= a_validity_ended {
        Finding::No
    } else {
        Finding::Unknown
    }
}

/// The masters whose answer shows the key held (by anyone), in order.
pub fn holding(read_back: &[MasterState]) -> Vec<String> {
    read_back
        .iter()
        .filter(|s| s.answered && s.holder.is_some())
        .map(|s| s.master.clone())
        .collect()
}

/// How many masters answered that `client`'s value holds the key.
pub fn held_by(read_back: &[MasterState], client: &str) -> usize {
    read_back
        .iter()
        .filter(|s| s.answered && s.holder.as_deref() == Some(client))
        .count()
}

/// A failed round's release, read back once every master can answer again: released
/// everywhere if none holds the key, not if one does (a request that timed out while the
/// master was frozen still landed once it woke), unknown if a master did not answer.
pub fn released_everywhere(once_thawed: &[MasterState]) -> Finding {
    if !holding(once_thawed).is_empty() {
        Finding::No
    } else if once_thawed.iter().all(|s| s.answered) {
        Finding::Yes
    } else {
        Finding::Unknown
    }
}

/// How much of a round went on waiting for masters that never answered (down masters
/// refuse at once; frozen ones cost the whole per-instance timeout): the time covered by
/// at least one such wait. Asked one after another the waits add up; asked all at once
/// they overlap, and two frozen masters cost one timeout.
pub fn waited_on_silent_ms(answers: &[Answer]) -> f64 {
    let mut waits: Vec<(f64, f64)> = answers
        .iter()
        .filter(|a| matches!(a.reply, Reply::NoAnswer { .. }))
        .map(|a| (a.sent_ms, a.sent_ms + a.took_ms))
        .collect();
    waits.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut covered = 0.0;
    let mut until = f64::MIN;
    for (from, to) in waits {
        covered += (to - from.max(until)).max(0.0);
        until = until.max(to);
    }
    covered
}

/// What a stale write came to in one resource of the store.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct StaleWrite {
    /// A's write was decided after B's accepted write.
    pub attempted: bool,
    /// Whether the store took it; null when there was none.
    pub accepted: Option<bool>,
    pub a_token: Option<i64>,
    pub b_token: Option<i64>,
}

/// `late`'s write to one resource, by the store's decision order (see [`late_write`]), with
/// each writer's last token. `attempts` in decision order, as the store reads them back.
pub fn stale_write(attempts: &[Attempt], late: &str, next: &str) -> StaleWrite {
    let found = late_write(attempts, late, next);
    let last_token_of = |writer: &str| {
        attempts
            .iter()
            .rev()
            .find(|a| a.writer == writer)
            .and_then(|a| a.token)
    };
    StaleWrite {
        attempted: found.attempted(),
        accepted: found.accepted(),
        a_token: last_token_of(late),
        b_token: last_token_of(next),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::tests::attempt;

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn round(held: bool, began: u64, ended: u64, validity_ms: i64) -> Round {
        Round {
            held,
            began: ms(began),
            ended: ms(ended),
            validity_ms,
        }
    }

    fn state(master: &str, holder: Option<&str>, answered: bool) -> MasterState {
        MasterState {
            master: master.into(),
            port: "6379".into(),
            holder: holder.map(String::from),
            pttl_ms: answered.then_some(if holder.is_some() { 1500 } else { -2 }),
            answered,
            why: (!answered).then(|| "frozen by the lab: not asked".into()),
        }
    }

    fn answer(reply: Reply, took_ms: f64) -> Answer {
        Answer {
            master: "m1".into(),
            port: "6379".into(),
            reply,
            sent_ms: 0.0,
            took_ms,
        }
    }

    #[test]
    fn b_granted_while_as_validity_runs_is_two_holders() {
        // restart-empty and clock-jump: A holds 1,940ms of validity from t=100; B's round
        // ends at t=300, long before.
        let a = round(true, 100, 110, 1940);
        let b = round(true, 280, 300, 1950);
        assert_eq!(two_holders(&a, &b), Finding::Yes);
        assert_eq!(validity_left_ms(&a, &b), 1740);
    }

    #[test]
    fn a_refused_b_or_a_lapsed_a_is_not_two_holders() {
        // restart-delayed: B refused while A's validity runs.
        let a = round(true, 100, 110, 1940);
        assert_eq!(two_holders(&a, &round(false, 280, 300, 0)), Finding::No);
        // A never held (no majority, or no validity left).
        let b = round(true, 280, 300, 1950);
        assert_eq!(two_holders(&round(false, 100, 110, 1940), &b), Finding::No);
        assert_eq!(two_holders(&round(true, 100, 110, 0), &b), Finding::No);
        assert_eq!(validity_left_ms(&round(true, 100, 110, 0), &b), 0);
    }

    #[test]
    fn a_grant_at_the_very_end_of_as_validity_is_not_two_holders() {
        let a = round(true, 0, 10, 300);
        assert_eq!(two_holders(&a, &round(true, 250, 300, 1950)), Finding::No);
        assert_eq!(two_holders(&a, &round(true, 250, 299, 1950)), Finding::Yes);
        assert_eq!(validity_left_ms(&a, &round(true, 250, 300, 1950)), 0);
    }

    #[test]
    fn after_a_pause_only_a_round_begun_past_as_validity_is_not_twice() {
        // client-pause: A seen at 1,000 with 1,950ms validity; its validity ended by 2,950.
        assert_eq!(
            granted_twice_after_pause(ms(1000), 1950, ms(4000)),
            Finding::No
        );
        assert_eq!(
            granted_twice_after_pause(ms(1000), 1950, ms(2950)),
            Finding::No
        );
        // Earlier, the lab's clock cannot say: unknown, not "granted twice".
        assert_eq!(
            granted_twice_after_pause(ms(1000), 1950, ms(2949)),
            Finding::Unknown
        );
        // A negative validity counts as none.
        assert_eq!(
            granted_twice_after_pause(ms(1000), -5, ms(1000)),
            Finding::No
        );
    }

    #[test]
    fn only_masters_that_answered_with_a_key_hold_it() {
        // majority-down, right after the release: m1–m2 answered with no key, m3 is down,
        // m4–m5 are frozen: nothing left, as far as anyone answered.
        let after = [
            state("m1", None, true),
            state("m2", None, true),
            state("m3", None, false),
            state("m4", None, false),
            state("m5", None, false),
        ];
        assert_eq!(holding(&after), Vec::<String>::new());
        let mixed = [
            state("m1", Some("A"), true),
            state("m2", Some("B"), true),
            state("m3", Some("B"), true),
            state("m4", None, false),
        ];
        assert_eq!(holding(&mixed), ["m1", "m2", "m3"]);
        assert_eq!(held_by(&mixed, "B"), 2);
        assert_eq!(held_by(&mixed, "A"), 1);
        assert_eq!(held_by(&mixed, "other"), 0);
    }

    #[test]
    fn a_thawed_master_that_set_the_key_means_not_released_everywhere() {
        let clean = [state("m1", None, true), state("m4", None, true)];
        assert_eq!(released_everywhere(&clean), Finding::Yes);
        let late = [state("m1", None, true), state("m4", Some("A"), true)];
        assert_eq!(released_everywhere(&late), Finding::No);
        assert_eq!(holding(&late), ["m4"]);
        // A master that still does not answer leaves it open, unless another holds it.
        let silent = [state("m1", None, true), state("m4", None, false)];
        assert_eq!(released_everywhere(&silent), Finding::Unknown);
        let both = [state("m1", Some("A"), true), state("m4", None, false)];
        assert_eq!(released_everywhere(&both), Finding::No);
    }

    #[test]
    fn only_silent_masters_count_as_waiting() {
        // minority-frozen: two frozen masters each cost the 50ms timeout; the answers and a
        // refusal cost what they took, and are not waiting on a silent master.
        let silent = |sent_ms, took_ms| Answer {
            sent_ms,
            ..answer(
                Reply::NoAnswer {
                    why: "timed out".into(),
                },
                took_ms,
            )
        };
        // One after another: the second frozen master is asked once the first gave up.
        let one_after_another = [
            answer(Reply::Granted, 0.4),
            Answer {
                sent_ms: 0.4,
                ..answer(Reply::Refused, 0.3)
            },
            silent(0.7, 50.2),
            silent(50.9, 50.1),
        ];
        assert!((waited_on_silent_ms(&one_after_another) - 100.3).abs() < 1e-9);
        assert_eq!(waited_on_silent_ms(&one_after_another[..2]), 0.0);
        // All at once: the two waits overlap, from 0.2ms to 50.4ms.
        let at_once = [
            answer(Reply::Granted, 0.4),
            silent(0.2, 50.2),
            silent(0.3, 50.1),
        ];
        assert!((waited_on_silent_ms(&at_once) - 50.2).abs() < 1e-9);
    }

    #[test]
    fn each_guard_reads_its_own_stale_write_from_the_store() {
        // Unfenced and late-claimed: A's write decided after B's, and taken.
        let taken = [attempt(1, "B", None, true), attempt(2, "A", None, true)];
        let row = stale_write(&taken, "A", "B");
        assert_eq!(
            row,
            StaleWrite {
                attempted: true,
                accepted: Some(true),
                a_token: None,
                b_token: None
            }
        );
        // By the sequence: token 1 < 2, refused.
        let fenced = [
            attempt(1, "B", Some(2), true),
            attempt(2, "A", Some(1), false),
        ];
        let row = stale_write(&fenced, "A", "B");
        assert_eq!((row.attempted, row.accepted), (true, Some(false)));
        assert!(row.a_token < row.b_token);
        // A's write before B's, or none at all: no stale write.
        let early = [attempt(1, "A", None, true), attempt(2, "B", None, true)];
        assert_eq!(stale_write(&early, "A", "B").accepted, None);
        let none = [attempt(1, "B", Some(2), true)];
        let row = stale_write(&none, "A", "B");
        assert!(!row.attempted);
        assert_eq!((row.a_token, row.b_token), (None, Some(2)));
    }
}
