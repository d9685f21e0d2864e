//! The job queue of lab 3 (`skip-locked`): its tables, the three ways to claim a job, and
//! the statements a worker runs. The SQL is the lesson, so it sits here in one place, read
//! by the workers that run it and by the lab that judges what they did.

use serde::{Deserialize, Serialize};

/// How a worker claims a job: the lesson of this lab.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// FOR UPDATE SKIP LOCKED in a transaction: correct, and workers never wait on each other
    SkipLocked,
    /// SELECT a pending job, then UPDATE it, with no row lock: duplicates
    Naive,
    /// FOR UPDATE without SKIP LOCKED: correct, but workers queue behind one row lock
    ForUpdate,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::SkipLocked, Mode::Naive, Mode::ForUpdate];

    pub fn name(self) -> &'static str {
        match self {
            Mode::SkipLocked => "skip-locked",
            Mode::Naive => "naive",
            Mode::ForUpdate => "for-update",
        }
    }

    /// Whether the claim lives inside a transaction that Postgres can roll back.
    pub fn transactional(self) -> bool {
        self != Mode::Naive
    }
}

// ─── The queue's SQL ──────────────────────────────────────────────────────────────────
//
// `{jobs}` and `{processing}` stand for the run's two tables (see `Queue`). Every claim
// picks the lowest pending id of a round, so that all workers want the same row at the
// same moment: the harshest contention, and the clearest difference between the modes.

/// The jobs: `pending`, then `done`. The naive mode also writes `running` (and who) in
/// between, because without a transaction that is the only way it can say "taken".
pub const CREATE_JOBS: &str = "
    CREATE TABLE {jobs} (
        id         bigint  PRIMARY KEY,
        round      int     NOT NULL,
        status     text    NOT NULL DEFAULT 'pending',
        claimed_by text
    );
    CREATE INDEX ON {jobs} (round, id) WHERE status = 'pending'";

/// One row per processing, append-only. There is deliberately **no** `UNIQUE (job_id)`:
/// a constraint would turn a double processing into an error and hide it; here it stays
/// visible, and the verdict counts it.
pub const CREATE_PROCESSING: &str = "
    CREATE TABLE {processing} (
        job_id     bigint      NOT NULL,
        worker     text        NOT NULL,
        claimed_at timestamptz NOT NULL,
        done_at    timestamptz NOT NULL DEFAULT clock_timestamp()
    )";

/// ✅ skip-locked. Inside a transaction, lock the first pending row **that nobody else has
/// locked**, skipping the locked ones instead of waiting for them. Two workers can never
/// get the same row, and none ever waits for another. The lock lasts until COMMIT or
/// ROLLBACK — and a closed connection is a ROLLBACK — so a killed worker's job is free
/// again at once (its kernel closes the socket), while a paused worker, or one on a machine
/// that vanished without closing anything, keeps its job for as long as Postgres believes
/// its connection lives.
///
/// (The CTE makes `clock_timestamp()` run after the row is locked, not before.)
pub const CLAIM_SKIP_LOCKED: &str = "
    WITH claimed AS (
        SELECT id FROM {jobs}
        WHERE round = $1 AND status = 'pending'
        ORDER BY id
        LIMIT 1
        FOR UPDATE SKIP LOCKED
    )
    SELECT id, clock_timestamp() FROM claimed";

/// ⚠️ for-update. The same claim without SKIP LOCKED: still correct — the row lock makes
/// the others wait, and when the holder commits, Postgres re-checks `status = 'pending'`
/// on the waiters' behalf and moves them on to the next row. But everyone wants the first
/// pending row, so everyone waits for whoever holds it: the workers take turns, the
/// throughput is one worker's, and one frozen worker stalls the whole queue.
pub const CLAIM_FOR_UPDATE: &str = "
    WITH claimed AS (
        SELECT id FROM {jobs}
        WHERE round = $1 AND status = 'pending'
        ORDER BY id
        LIMIT 1
        FOR UPDATE
    )
    SELECT id, clock_timestamp() FROM claimed";

/// ❌ naive, step 1: read the first pending id. No lock: any number of workers read the
/// same id in the same instant…
pub const NAIVE_PICK: &str = "
    SELECT id FROM {jobs}
    WHERE round = $1 AND status = 'pending'
    ORDER BY id
    LIMIT 1";

/// ❌ naive, step 2: …and each of them marks it taken, because this UPDATE does not check
/// that the row is still pending (that check-then-act gap is the race). Every worker that
/// read the id now processes the job. Adding `AND status = 'pending'` and looking at the
/// row count would close this race — but the claim would still not be tied to anything
/// alive: committed outside a transaction, `running` stays `running` if the worker dies,
/// and the job is lost unless something resets it after a timeout — a lease, with all the
/// TTL guessing of a Redis lock, and a paused worker waking up to redo a job that was
/// handed to someone else.
pub const NAIVE_MARK: &str = "
    UPDATE {jobs} SET status = 'running', claimed_by = $2
    WHERE id = $1
    RETURNING clock_timestamp()";

/// Every mode records a processing, then marks the job done (in the claim's transaction,
/// where there is one: both happen, or neither).
pub const RECORD: &str =
    "INSERT INTO {processing} (job_id, worker, claimed_at) VALUES ($1, $2, $3)";
pub const MARK_DONE: &str = "UPDATE {jobs} SET status = 'done', claimed_by = $2 WHERE id = $1";

/// Is anything left to claim in this round? A plain read ignores row locks, so it also
/// sees the pending jobs that other workers hold right now.
pub const ANY_PENDING: &str =
    "SELECT EXISTS (SELECT 1 FROM {jobs} WHERE round = $1 AND status = 'pending')";

/// The evidence for the verdict: how many times each job was processed, read from the
/// append-only table ([`crate::check::exactly_once`] counts what that means).
pub const TIMES_PROCESSED: &str = "
    SELECT count(p.job_id)
    FROM {jobs} j LEFT JOIN {processing} p ON p.job_id = j.id
    GROUP BY j.id";

/// The run's two tables, named with the run id and the mode, so that runs sharing a
/// server never see each other's jobs.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Queue {
    pub jobs: String,
    pub processing: String,
}

impl Queue {
    pub fn new(run_id: &str, mode: Mode) -> Queue {
        let mode = mode.name().replace('-', "_");
        Queue {
            jobs: format!("lockslab_{run_id}_{mode}_jobs"),
            processing: format!("lockslab_{run_id}_{mode}_processing"),
        }
    }

    pub fn sql(&self, template: &str) -> String {
        template
            .replace("{jobs}", &self.jobs)
            .replace("{processing}", &self.processing)
    }
}
