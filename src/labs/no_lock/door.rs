//! What the lab's faults meet and hold, as types both the run ([`super::play`]) and the
//! faults ([`super::strike`]) name: how another worker met a frozen one, and the customer's
//! lock the lab holds for the waiters.

use std::time::Instant;

use crate::lock::redis::{Held, RedisLock};

/// How another worker met a frozen one before its SIGCONT: what makes its point a test.
pub(super) enum Met {
    /// The workers whose sessions wait on the frozen worker's locks (`pg_blocking_pids`).
    Waiting(Vec<String>),
    /// The frozen job, invoiced (and committed) by this other worker.
    DoneBy(String),
    /// Partitioned: only the frozen worker may do its customers' jobs; nobody is to come.
    Owner,
}

/// The worst order, held from events: a frozen worker that others wait on is resumed only
/// while the lab itself holds its customer's Redis lock, and the lab lets go once those
/// waiters — who all read before the frozen worker's COMMIT — no longer wait on a lock,
/// that is, once each has written. Nobody can take the lock, read after the COMMIT and
/// write first: left to the scheduler, a busy machine lets such a newcomer in while the
/// waiters are still waking up, and a write fenced only at the write is then refused for
/// its lower token — the lesson would come out `ok` (or `untested`) by luck. The lab is one
/// more client here, one that holds the lock and does nothing: every worker that gets the
/// lock before it also reads before the COMMIT, and only adds a stale reader to the queue.
pub(super) struct Door {
    pub(super) customer: i32,
    /// The frozen worker others waited on.
    pub(super) of: String,
    /// The waiters' sessions, as `pg_stat_activity` names them.
    pub(super) sessions: Vec<String>,
    pub(super) lock: RedisLock,
    pub(super) held: Held,
    /// Let go by then whatever the waiters do: the waiters are real processes, and one may
    /// wait on something else for good.
    pub(super) until: Instant,
}
