//! The chaos client's Redlock: the project's Redlock ([`crate::lock::redlock`], lab 6) on
//! the lane's five masters of chaos's own, and how its release is judged. The designs
//! themselves (`redlock`, `redlock-fenced`) are [`crate::designs::redlock`].

use std::time::Duration;

use anyhow::Result;

use super::Client;
use crate::lock::redlock::{self, Master, Redlock, Reply, RoundOrder, Settings};

/// Each master gets this long to answer before it counts as "no": five of them, one after
/// another, stay well inside half the lease (lab 6's rule for its own flags).
const INSTANCE_TIMEOUT_MS: u64 = 50;
/// A failed round waits a random delay up to this before the next: short beside a job's
/// 20ms of work, so that a majority freed under its holder is won before it writes (see
/// the Redis clients' `RETRY_EVERY`).
const RETRY_DELAY_MAX_MS: u64 = 10;

impl Client<'_> {
    /// The lane's Redlock, made on first use, its key set to `key`.
    pub(super) fn redlock_on(&mut self, key: &str) -> Result<&mut Redlock> {
        if self.redlock.is_none() {
            anyhow::ensure!(!self.script.masters.is_empty(), "no Redlock masters");
            let masters = (self.script.masters.iter().enumerate())
                .map(|(i, url)| Master::new(&format!("m{}", i + 1), url))
                .collect();
            let settings = Settings {
                ttl: Duration::from_millis(self.script.lease_ms),
                drift_factor: 0.01,
                instance_timeout: Duration::from_millis(INSTANCE_TIMEOUT_MS),
                retry_delay_max: Duration::from_millis(RETRY_DELAY_MAX_MS),
                round: RoundOrder::Sequential,
            };
            self.redlock = Some(Redlock::new(masters, key, settings));
        }
        let lock = self.redlock.as_mut().expect("made above");
        lock.key = key.to_string();
        Ok(lock)
    }
}

/// What a release on every master says of the lock: still ours where a majority deleted
/// our key; granted to another where a majority held one other value *while this client's
/// validity still ran* (lab 6's "granted twice within validity"); else not known (the keys
/// expired, a master was down, or the release came after the validity, when another grant
/// is the lock working as designed), which the checker counts as unknown, never as a pass.
/// Work done past the validity is judged by the store's rows, not here.
pub(super) fn judge_release(
    answers: &[redlock::Answer],
    within_validity: bool,
) -> (bool, Option<String>) {
    let quorum = redlock::quorum(answers.len());
    let deleted = answers.iter().filter(|a| a.reply == Reply::Deleted).count();
    if deleted >= quorum {
        return (true, None);
    }
    if !within_validity {
        return (false, None);
    }
    let mut found: Vec<&str> = answers
        .iter()
        .filter_map(|a| match &a.reply {
            Reply::NotOurs { found: Some(v) } => Some(v.as_str()),
            _ => None,
        })
        .collect();
    found.sort_unstable();
    let other = found
        .chunk_by(|a, b| a == b)
        .find(|same| same.len() >= quorum)
        .map(|same| same[0].to_string());
    (false, other)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(reply: Reply) -> redlock::Answer {
        redlock::Answer {
            master: "m".into(),
            port: "1".into(),
            reply,
            sent_ms: 0.0,
            took_ms: 0.0,
        }
    }

    #[test]
    fn a_release_is_judged_by_a_majority_of_the_masters() {
        let theirs = || {
            answer(Reply::NotOurs {
                found: Some("b".into()),
            })
        };
        let gone = || answer(Reply::NotOurs { found: None });
        let deleted = || answer(Reply::Deleted);
        // One master restarted empty: four still had our key.
        let restarted = [deleted(), deleted(), gone(), deleted(), deleted()];
        assert_eq!(judge_release(&restarted, true), (true, None));
        // A master forgot our key and B took three while our validity ran: two holders.
        let taken = [theirs(), theirs(), gone(), theirs(), gone()];
        assert_eq!(judge_release(&taken, true), (false, Some("b".into())));
        // The same, found after our validity ended: B's grant was legitimate; not known
        // whether we overran it (the store's rows say whether a write did).
        assert_eq!(judge_release(&taken, false), (false, None));
        // Expired everywhere, or B's on two only: not known.
        assert_eq!(
            judge_release(&[gone(), gone(), gone()], true),
            (false, None)
        );
        let split = [theirs(), theirs(), gone(), gone(), deleted()];
        assert_eq!(judge_release(&split, true), (false, None));
    }
}
