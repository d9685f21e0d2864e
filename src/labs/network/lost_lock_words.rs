//! What the etcd half of the lost reply shows: its table and its sentences.

use std::time::Duration;

use crate::check::network::{Policy, QueuedFound, ReplyFound};
use crate::labs::words::Words;
use crate::output::human;

/// The column of a policy, as the etcd half calls it.
fn label(policy: Policy) -> &'static str {
    match policy {
        Policy::SameOwner => "same-lease",
        Policy::NewOwner => "new-lease",
        Policy::GiveUp => "give-up",
    }
}

/// The etcd half's table and what it means.
pub(super) fn say(words: &mut Words, locks: &[ReplyFound], queued: Option<&QueuedFound>) {
    if locks.is_empty() {
        return;
    }
    let columns: Vec<&str> = locks.iter().map(|s| label(s.policy)).collect();
    super::lost_reply::say_reply_table(
        words,
        "Verdict: a lost reply to etcd's lock",
        [
            "lock call applied (etcd read back)",
            "A's belief = etcd's holder at end",
        ],
        &columns,
        locks,
    );
    words.blank();
    for lock in locks {
        words.about(label(lock.policy), meaning(lock));
    }
    if let Some(queued) = queued {
        let left = match (queued.key_left, queued.auth) {
            (true, true) => {
                "A's waiter key stayed in etcd's queue after A's call and connection were gone: etcd's lock service deletes a cancelled waiter's key, but it sends that delete without a user, and with auth on (as here) etcd refuses it (etcd-io/etcd#13330)"
            }
            (true, false) => {
                "A's waiter key stayed in etcd's queue after A's call and connection were gone"
            }
            (false, _) => {
                "etcd deleted A's waiter key when A's call went away: nothing was left in the queue"
            }
        };
        let handed = if queued.handed_to_a {
            "; when the lab let go, etcd gave the lock to that key, for a client that had gone, until its lease ends."
        } else {
            "; when the lab let go, the lock did not pass to A."
        };
        let cleanup = if queued.auth {
            " Without auth etcd deletes the key; either way that cleanup is best-effort: a client whose lock call failed should revoke its own lease."
        } else {
            " That cleanup is best-effort: a client whose lock call failed should revoke its own lease."
        };
        words.about("queued", format!("{left}{handed}{cleanup}"));
    }
}

fn meaning(found: &ReplyFound) -> String {
    let applied = if found.applied {
        "etcd had put A's key and given it the lock; only the answer was lost."
    } else {
        "etcd had not given A's key the lock: this run does not show a lost reply."
    };
    let then = match found.policy {
        Policy::SameOwner if found.a_knows => {
            "Retrying with the same lease, A got the same key back: the lock was its own, since the first call.".to_string()
        }
        Policy::SameOwner => "Retrying with the same lease did not give A its first key back.".into(),
        Policy::NewOwner if found.waited_behind_itself => format!(
            "Retrying with a new lease, A waited {} behind its own first key, until that lease ran out; that key held the lock, nobody working under it, for {}.",
            found.waited_ms.map_or("?".into(), |ms| human(Duration::from_millis(ms))),
            found.orphaned_ms.map_or("?".into(), |ms| human(Duration::from_millis(ms)))
        ),
        Policy::NewOwner => "A's retry with a new lease did not have to wait for itself.".into(),
        Policy::GiveUp if found.orphaned => format!(
            "A gave up; its key held the lock, nobody working under it, for {}, until its lease expired.",
            found.orphaned_ms.map_or("?".into(), |ms| human(Duration::from_millis(ms)))
        ),
        Policy::GiveUp => "A gave up and nothing was left behind.".into(),
    };
    format!("{applied} {then}")
}
