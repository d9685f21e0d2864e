//! Lab 8's `--step` questions for its etcd rows (the cut from etcd, and etcd's lock call
//! whose answer was lost) and for the holder that stops when its heartbeat gives up.

use super::Checkpoint;

pub(super) const CUT_ETCD_UNFENCED: Checkpoint = Checkpoint {
    name: "before the cut from etcd (without fencing)",
    question: "A holds an etcd lock on a lease its keepalive renews. The network cuts A \
               off from etcd, not from the store. When does etcd expire A's lease, and \
               what happens to A's lock key and to B, queued behind it?",
};

pub(super) const CUT_ETCD_FENCED: Checkpoint = Checkpoint {
    name: "before the fenced cut from etcd",
    question: "The same cut; A writes with its lock key's create revision as the token. \
               Whose revision is higher when A's write arrives?",
};

/// Before each part of the lost answer to etcd's lock call.
pub fn before_lost_lock(policy: &str) -> &'static Checkpoint {
    match policy {
        "same-owner" => &LOCK_SAME,
        "new-owner" => &LOCK_NEW,
        "give-up" => &LOCK_GIVE_UP,
        _ => &LOCK_QUEUED,
    }
}

pub(super) const LOCK_SAME: Checkpoint = Checkpoint {
    name: "before the lost lock call (same lease)",
    question: "A calls etcd's lock with its lease; etcd puts A's key and answers, and \
               the answer is lost. A calls again with the same lease. What does etcd do \
               with a key that already exists?",
};
pub(super) const LOCK_NEW: Checkpoint = Checkpoint {
    name: "before the lost lock call (new lease)",
    question: "The same loss; A retries with a new lease. Whose key is ahead of A's new \
               one, and when does it go?",
};
pub(super) const LOCK_GIVE_UP: Checkpoint = Checkpoint {
    name: "before the lost lock call (give up)",
    question: "The same loss; A goes away. What holds the lock, and until when?",
};
pub(super) const LOCK_QUEUED: Checkpoint = Checkpoint {
    name: "before the lost lock call in the queue",
    question: "This time the lock is taken, so A's call waits in etcd's queue when A's \
               client gives up and closes its connection. Is A's waiter key still in the \
               queue afterwards?",
};

/// Before a run of the cut where A stops once its heartbeat gives up.
pub fn before_cut_stops(fenced: bool) -> &'static Checkpoint {
    if fenced {
        &STOPS_FENCED
    } else {
        &STOPS_UNFENCED
    }
}

const STOPS_UNFENCED: Checkpoint = Checkpoint {
    name: "before the cut where A stops (without fencing)",
    question: "This time A asks its heartbeat before each write and stops once it has \
               given the lock up. A's first write leaves while all is well and is held \
               in flight; then the cut. Does the held write land after B's? Does A's \
               second write?",
};

const STOPS_FENCED: Checkpoint = Checkpoint {
    name: "before the fenced cut where A stops",
    question: "The same, with fencing tokens. What refuses the write A's habit could not \
               call back?",
};
