//! Every lab's checkpoints, with the walkthroughs' questions (see [`super::checkpoint`]).

use super::Checkpoint;

// ── The checkpoints of each lab, with the walkthroughs' questions ──

pub mod gc_pause {
    use super::Checkpoint;

    /// Before a run's workers start: no lock is held yet, no timer runs.
    pub fn before_run(fenced: bool) -> &'static Checkpoint {
        if fenced {
            &BEFORE_FENCED
        } else {
            &BEFORE_UNFENCED
        }
    }

    const BEFORE_UNFENCED: Checkpoint = Checkpoint {
        name: "before the freeze (without fencing)",
        question: "A takes the lock, then freezes for longer than its TTL; B waits for the \
                   same lock. Does B get the lock while A is frozen? Whose result is in the \
                   store at the end? Does A's compare-and-delete release help?",
    };

    const BEFORE_FENCED: Checkpoint = Checkpoint {
        name: "before the fenced run",
        question: "The same story, but every acquisition now draws a fencing token and the \
                   store keeps the highest token it accepted. What will the store do with \
                   A's late write? Whose result will it hold?",
    };

    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the verdict",
        question: "Both runs used a correct lock. In which one was B's result lost, and what \
                   refused A's write in the other: the lock, or the store?",
    };
}

pub mod naive {
    use super::Checkpoint;

    /// Before each scenario (by its name: race, no-ttl, setnx-expire, wrong-release).
    pub fn before(scenario: &str) -> &'static Checkpoint {
        match scenario {
            "race" => &RACE,
            "no-ttl" => &NO_TTL,
            "setnx-expire" => &SETNX_EXPIRE,
            "wrong-release" => &WRONG_RELEASE,
            _ => &NEXT,
        }
    }

    const RACE: Checkpoint = Checkpoint {
        name: "before the race",
        question: "Ten workers GET the key and SET it when it is empty. How many of them \
                   will believe they hold the lock at once? And with SET NX?",
    };
    const NO_TTL: Checkpoint = Checkpoint {
        name: "before the kill (no TTL)",
        question: "The holder took the lock with SETNX and no TTL, and is about to be \
                   killed. When does the next worker get the lock?",
    };
    const SETNX_EXPIRE: Checkpoint = Checkpoint {
        name: "before the kill (SETNX then EXPIRE)",
        question: "The holder sets the key, then its TTL, in two commands, and dies in \
                   between. What is left in Redis, and for how long?",
    };
    const WRONG_RELEASE: Checkpoint = Checkpoint {
        name: "before the late release",
        question: "A's lock expires while it works and B takes it. A finishes and releases \
                   with a plain DEL. Whose lock does that DEL delete?",
    };
    const NEXT: Checkpoint = Checkpoint {
        name: "before the next scenario",
        question: "What will break, and what will the fix change?",
    };

    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the counts",
        question: "Which of the four bugs could a test on one laptop catch, and which only \
                   shows when a process dies or stalls?",
    };
}

pub mod skip_locked {
    use super::Checkpoint;

    /// Before each claiming mode (skip-locked, for-update, naive).
    pub fn before(mode: &str) -> &'static Checkpoint {
        match mode {
            "skip-locked" => &SKIP_LOCKED,
            "for-update" => &FOR_UPDATE,
            "naive" => &NO_LOCK,
            _ => &NEXT,
        }
    }

    const SKIP_LOCKED: Checkpoint = Checkpoint {
        name: "before the queue runs (FOR UPDATE SKIP LOCKED)",
        question: "One worker will be killed holding a job, one frozen. Is any job done \
                   twice? When does the killed worker's job come back, and the frozen one's?",
    };
    const FOR_UPDATE: Checkpoint = Checkpoint {
        name: "before the queue runs (FOR UPDATE, no SKIP LOCKED)",
        question: "Without SKIP LOCKED, what do the other workers do while one worker holds \
                   the first job's row lock?",
    };
    const NO_LOCK: Checkpoint = Checkpoint {
        name: "before the queue runs (no lock at all)",
        question: "Workers SELECT the first pending job and then mark it taken. How many \
                   jobs will be processed twice?",
    };
    const NEXT: Checkpoint = Checkpoint {
        name: "before the next mode",
        question: "Is any job done twice? Does a dead worker's job come back?",
    };

    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the verdict",
        question: "What held the frozen worker's job, and what would have freed it?",
    };
}

pub mod etcd_vs_redis {
    use super::Checkpoint;

    /// Before each scenario (kill, freeze, or one added later).
    pub fn before(scenario: &str) -> &'static Checkpoint {
        match scenario {
            "kill" => &KILL,
            "freeze" => &FREEZE,
            "overrun" => &OVERRUN,
            _ => &NEXT,
        }
    }

    const KILL: Checkpoint = Checkpoint {
        name: "before the kill",
        question: "Each holder (Redis with its TTL set once, Redis renewed by a heartbeat, \
                   etcd, Postgres) is killed mid-work. Rank the four: how long until each \
                   waiter holds the lock, and what is each one waiting for?",
    };
    const FREEZE: Checkpoint = Checkpoint {
        name: "before the freeze",
        question: "Each holder is frozen past its TTL or lease, then wakes and writes. On \
                   which backend does the waiter get the lock meanwhile? Whose late write \
                   will the store refuse, and thanks to what?",
    };
    const OVERRUN: Checkpoint = Checkpoint {
        name: "before the overrun",
        question: "Nobody is frozen now: each holder simply works longer than the plain Redis \
                   TTL. Which lock expires under a live holder, and which ones keep it?",
    };
    const NEXT: Checkpoint = Checkpoint {
        name: "before the next scenario",
        question: "Who hands the lock over, how fast, and who can fence the late writer?",
    };

    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the matrix",
        question: "Which backend would you pick for a lock that guards a payment, and which \
                   for one that only saves duplicate work?",
    };
}

pub mod failover {
    use super::Checkpoint;

    pub const REDIS: Checkpoint = Checkpoint {
        name: "before the Redis failover",
        question: "Nobody will pause. A takes five locks on the primary, the primary dies \
                   before its replica has them, and Sentinel promotes the replica. Will B \
                   get the same locks? What will an INCR token do, and can any rule at the store tell A's \
                   token from B's when both got the same one?",
    };
    pub const ETCD: Checkpoint = Checkpoint {
        name: "before the etcd leader is killed",
        question: "A holds an etcd lock, B waits, and the leader dies. Does A keep its lock? \
                   What does B see when two of three members are gone?",
    };
    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the verdict",
        question: "Which rows had two holders with nobody paused, and what would have made \
                   the late write harmless in each?",
    };
}

pub mod redlock {
    use super::Checkpoint;

    /// Before each scenario, by its command-line name.
    pub fn before(scenario: &str) -> &'static Checkpoint {
        match scenario {
            "minority" => &MINORITY,
            "restart" => &RESTART,
            "clock-jump" => &CLOCK_JUMP,
            _ => &CLIENT_PAUSE,
        }
    }

    const MINORITY: Checkpoint = Checkpoint {
        name: "before the minority",
        question: "Two of five masters are killed, then frozen, then a third goes. When is \
                   the lock still granted, and what does a frozen master cost the validity?",
    };
    const RESTART: Checkpoint = Checkpoint {
        name: "before the restart",
        question: "A holds three of five masters; one of them restarts empty. Can B now \
                   collect three too? What if the master stays down longer than the TTL?",
    };
    const CLOCK_JUMP: Checkpoint = Checkpoint {
        name: "before the clock jump",
        question: "Some masters' clocks jump forward (simulated here). What happens to A's \
                   keys there, and can B reach a quorum while A still counts on its validity?",
    };
    const CLIENT_PAUSE: Checkpoint = Checkpoint {
        name: "before the client pause",
        question: "A freezes past its validity, then writes. Which guard refuses it: none, \
                   its random value claimed at the grant, the same value claimed only after \
                   the pause, or a number from a sequence — and why do the two claims differ?",
    };
    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the verdict",
        question: "Which faults did the quorum survive, and which handed the lock out twice?",
    };
    /// When only the client pause ran: no quorum fault was played to ask about.
    pub const VERDICT_CLIENT_PAUSE: Checkpoint = Checkpoint {
        name: "before the verdict",
        question: "Every master behaved, yet A's late write came after B's grant. Which \
                   guard refused it, and why can no count of masters do that?",
    };
}

pub mod no_lock {
    use super::Checkpoint;

    // Before each approach, one question per `--fault` (the lab picks the one it plays).
    pub const BEFORE_APPROACH: Checkpoint = Checkpoint {
        name: "before the next approach",
        question: "Four workers freeze, each at another point of a job (before the read, \
                   after it, mid-write, before COMMIT); another is killed mid-write. At which \
                   points will this approach invoice a job twice or lose a balance update? \
                   What does it cost?",
    };
    pub const BEFORE_APPROACH_KILL: Checkpoint = Checkpoint {
        name: "before the next approach",
        question: "A worker is killed in the middle of writing a job. Will this approach \
                   lose the job, invoice it twice, or leave a lock behind — and who finishes \
                   it?",
    };
    pub const BEFORE_APPROACH_FREEZE: Checkpoint = Checkpoint {
        name: "before the next approach",
        question: "Four workers freeze, each at another point of a job (before the read, \
                   after it, mid-write, before COMMIT). At which points will this approach \
                   invoice a job twice or lose a balance update?",
    };
    pub const BEFORE_APPROACH_NONE: Checkpoint = Checkpoint {
        name: "before the next approach",
        question: "No faults this time: how many jobs a second will this approach do \
                   against the others, and what does its safety cost?",
    };
    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the verdict",
        question: "Which approaches need a lock service at all, and which one would you \
                   pick for this job?",
    };
    pub use super::super::verdict_halves::NO_LOCK_REASONS as VERDICT_REASONS;
}

pub mod queue {
    use super::Checkpoint;

    /// Before one way of queueing starts its waiters (`redis_spin`, `etcd_herd`, `etcd_recipe`).
    pub fn before_way(way: &str) -> &'static Checkpoint {
        match way {
            "redis_spin" => &SPIN,
            "etcd_herd" => &HERD,
            _ => &RECIPE,
        }
    }
    const SPIN: Checkpoint = Checkpoint {
        name: "before the spinning waiters",
        question: "Each waiter tries SET NX every 10ms. How many requests will Redis answer \
                   per hand-over, and who gets the lock next: the one who asked first?",
    };
    const HERD: Checkpoint = Checkpoint {
        name: "before the herd",
        question: "Every waiter watches the one lock key. When the holder deletes it, how \
                   many waiters does etcd wake, and how many of them get the lock?",
    };
    const RECIPE: Checkpoint = Checkpoint {
        name: "before the recipe",
        question: "Each waiter watches only the key just ahead of it. How many wake-ups per \
                   hand-over now, and in which order will they be served?",
    };
    pub const CHURN: Checkpoint = Checkpoint {
        name: "before the churn",
        question: "Six in line. W2 gives up and deletes its key; W3 is killed and its key \
                   stays until its lease runs out. Who wakes each time, and what must it do \
                   before it believes it holds? In which order are the rest served?",
    };
    pub const EXPIRY: Checkpoint = Checkpoint {
        name: "before the expiries",
        question: "A queued waiter freezes past its lease: what happens to its key, and what \
                   must the waiter behind it do when it wakes? Then the holder freezes: who \
                   holds, and what becomes of the old holder's write?",
    };
    pub const OWNER_TXN: Checkpoint = Checkpoint {
        name: "before the check inside etcd",
        question: "A writes an etcd key with a put guarded by its lock key's create \
                   revision, in one transaction. A's lease ends; B takes the lock and writes. \
                   What does etcd answer A's next guarded put?",
    };
    pub const ELECTION: Checkpoint = Checkpoint {
        name: "before the election",
        question: "L1 leads; L2 campaigns. L1 freezes past its lease. When it wakes, who \
                   does L1 believe leads? What stops its write as leader?",
    };
    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the verdict",
        question: "Which way costs the servers least per hand-over, and which serves the \
                   waiters in the order they asked?",
    };
    pub use super::super::verdict_halves::QUEUE_FAULTS as VERDICT_FAULTS;
}

pub mod network {
    use super::Checkpoint;

    /// Before a run's workers start: no lock is held yet, no timer runs.
    pub fn before_run(fenced: bool) -> &'static Checkpoint {
        if fenced {
            &BEFORE_FENCED
        } else {
            &BEFORE_UNFENCED
        }
    }

    const BEFORE_UNFENCED: Checkpoint = Checkpoint {
        name: "before the delayed write (without fencing)",
        question: "A takes the lock, checks that it still holds it with time to spare, and \
                   sends its write. Nobody pauses A. The network holds the write until A's \
                   lease has run out and B has written. Whose result is in the store at the \
                   end? Would checking the lock once more have helped?",
    };

    const BEFORE_FENCED: Checkpoint = Checkpoint {
        name: "before the fenced run",
        question: "The same delay, but every acquisition draws a fencing token and the store \
                   keeps the highest it accepted. When A's write finally arrives, what does \
                   the store compare, and what does it decide?",
    };

    /// Before a run of the cut (from Redis, or from etcd): no lock is held yet.
    pub fn before_cut(fenced: bool, etcd: bool) -> &'static Checkpoint {
        match (etcd, fenced) {
            (false, false) => &CUT_UNFENCED,
            (false, true) => &CUT_FENCED,
            (true, false) => &super::super::network_etcd::CUT_ETCD_UNFENCED,
            (true, true) => &super::super::network_etcd::CUT_ETCD_FENCED,
        }
    }

    const CUT_UNFENCED: Checkpoint = Checkpoint {
        name: "before the cut (without fencing)",
        question: "A holds a Redis lock renewed by a heartbeat. The network cuts A off from \
                   Redis, not from the store. What happens to the renewals, and to the lease \
                   in Redis? Who writes last?",
    };

    const CUT_FENCED: Checkpoint = Checkpoint {
        name: "before the fenced cut",
        question: "The same cut, with fencing tokens. A never learns in time that its lease \
                   ended. What stops its write?",
    };

    /// Before each policy of the lost reply to `SET NX PX`.
    pub fn before_lost_reply(policy: &str) -> &'static Checkpoint {
        match policy {
            "same-owner" => &LOST_SAME,
            "new-owner" => &LOST_NEW,
            _ => &LOST_GIVE_UP,
        }
    }

    const LOST_SAME: Checkpoint = Checkpoint {
        name: "before the lost reply (same owner value)",
        question: "A's SET NX PX reaches Redis and is applied; the answer is lost. A retries \
                   with the owner value it sent. What does SET NX answer, and how can A tell \
                   the lock is its own?",
    };
    const LOST_NEW: Checkpoint = Checkpoint {
        name: "before the lost reply (new owner value)",
        question: "The same loss; A retries as a new acquisition, with a new owner value. \
                   Who is A waiting for, and how long?",
    };
    const LOST_GIVE_UP: Checkpoint = Checkpoint {
        name: "before the lost reply (give up)",
        question: "The same loss; A treats no answer as no lock and goes away. What is left \
                   in Redis, and for how long?",
    };

    pub use super::super::network_etcd::{before_cut_stops, before_lost_lock};

    /// Before a `COMMIT` whose answer is lost, retried without or with a key.
    pub fn before_lost_commit(keyed: bool) -> &'static Checkpoint {
        if keyed { &COMMIT_KEYED } else { &COMMIT_PLAIN }
    }

    const COMMIT_PLAIN: Checkpoint = Checkpoint {
        name: "before the lost COMMIT",
        question: "A pays 10 in a transaction; its COMMIT reaches Postgres and the answer is \
                   lost. A retries the payment as it was. How much has A paid?",
    };
    const COMMIT_KEYED: Checkpoint = Checkpoint {
        name: "before the lost COMMIT, with an idempotency key",
        question: "The same loss, but the payment carries a key that a unique index guards. \
                   What does the retry do?",
    };

    /// Before a fenced write whose answer is lost, retried with the same token.
    pub const LOST_FENCED_WRITE: Checkpoint = Checkpoint {
        name: "before the lost fenced write",
        question: "A writes with its fencing token; the store accepts it and the answer is \
                   lost. A retries with the same token. Does the token stop the second copy?",
    };

    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the verdict",
        question: "A was never paused and checked its lock before writing. Which evidence \
                   shows the write was stale anyway, and which part of the system stopped it?",
    };
    pub use super::super::verdict_halves::NETWORK_LOST_REPLIES as VERDICT_LOST_REPLIES;
}

pub mod lease_guard {
    use super::Checkpoint;

    /// Before the first cell of each fault (by its name).
    pub fn before(fault: &str) -> &'static Checkpoint {
        match fault {
            "pause-before-check" => &PAUSE_BEFORE,
            "pause-after-check" => &PAUSE_AFTER,
            "stall" => &STALL,
            "delayed-write" => &DELAYED_WRITE,
            "clock-back" => &CLOCK_BACK,
            "clock-slow" => &CLOCK_SLOW,
            "clock-fast" => &CLOCK_FAST,
            _ => &LONG_WORK,
        }
    }

    const PAUSE_BEFORE: Checkpoint = Checkpoint {
        name: "before the pause before the check",
        question: "A stops after its work, before its guard looks. Which guards will notice \
                   when it wakes, and on which clock?",
    };
    const PAUSE_AFTER: Checkpoint = Checkpoint {
        name: "before the pause after the check",
        question: "A's guard says yes, then A stops before the write, until B has written. \
                   Can any guard in A see this pause? Does a lock-delay help?",
    };
    const STALL: Checkpoint = Checkpoint {
        name: "before the stall",
        question: "A is stopped and continued over and over, each stop shorter than the \
                   margin. Does pause detection see it? Does A's heartbeat keep the lock?",
    };
    const DELAYED_WRITE: Checkpoint = Checkpoint {
        name: "before the delayed write",
        question: "A's guard says yes and A sends its write at once; the network holds it. \
                   A never stops: which guard can see a late packet?",
    };
    const CLOCK_BACK: Checkpoint = Checkpoint {
        name: "before the clock steps back",
        question: "A's wall clock is stepped back while it works. Which deadline believes it \
                   still has time?",
    };
    const CLOCK_SLOW: Checkpoint = Checkpoint {
        name: "before the slow clock",
        question: "A's wall clock runs at half speed while it works past its lease. Which \
                   guard believes its lease lasts longer than it does?",
    };
    const CLOCK_FAST: Checkpoint = Checkpoint {
        name: "before the fast clock",
        question: "A's wall clock runs three times too fast, and A looks halfway through its \
                   lease. Is anything lost, or only work?",
    };
    const LONG_WORK: Checkpoint = Checkpoint {
        name: "before the long work",
        question: "No fault: A's work just outlasts its lease. Which guard lets its write \
                   through, and which keeps the lock from B meanwhile?",
    };

    pub const VERDICT: Checkpoint = Checkpoint {
        name: "before the verdict",
        question: "Which column did no guard close, and what closed it in the last row?",
    };
}
