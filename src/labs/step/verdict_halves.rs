//! Stops inside the long verdicts (labs 7, 8 and 10), where their second half begins: no
//! timer runs any more, and each half fits one screen with its question.

use super::Checkpoint;

/// Lab 7: between the verdict's two tables and its sentences, one per approach.
pub const NO_LOCK_REASONS: Checkpoint = Checkpoint {
    name: "before each approach's reasons",
    question: "Where did the failed approaches fail? For each safe one: what does it need \
               from the job or the data that the others do not?",
};

/// Lab 8: between the stale writes' verdicts and the lost answers'.
pub const NETWORK_LOST_REPLIES: Checkpoint = Checkpoint {
    name: "before the verdicts of the lost answers",
    question: "Each request whose answer was lost: had the server done it? Which retry \
               recognised its own earlier work, and which did the work twice?",
};

/// Lab 10: between the queue's table and the verdicts of the churn, expiries and election.
pub const QUEUE_FAULTS: Checkpoint = Checkpoint {
    name: "before the verdicts of the churn, expiries and election",
    question: "When waiters left, froze or led, did anyone skip the line or hold twice? \
               Which writes did the store refuse, and why?",
};
