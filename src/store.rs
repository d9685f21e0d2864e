//! The protected resource: one value per resource in a Postgres table, guarded by fencing.
//!
//! A lock cannot stop a client that has already passed its check and then paused, so the
//! safety has to live where the data lives. The store accepts a fenced write only if its
//! token is **higher** than the highest token it has accepted for that resource — or equal
//! to it *and sent by the holder that sent it first* — and it decides that inside the
//! database, in the same statement as the write: there is no window between "check" and
//! "write" for a stale writer to slip through.
//!
//! Three details that loose descriptions get wrong:
//! - A holder may write more than once with its token, so an equal token cannot simply be
//!   refused; but "not lower than the highest" (`>=`) is not enough either. A token source
//!   can hand the same number out twice: a Redis `INCR` counter on a server restarted
//!   without persistence, or failed over to a replica that missed the increment. Then two
//!   holders carry one token, and `>=` accepts both. The store knows who sent each token,
//!   so an equal token from a *different* writer is a reissue, and it is refused
//!   ([`FenceRule::HigherOrSameHolder`]; the loose rule is kept as [`FenceRule::NotLower`]
//!   for the labs that show it fail).
//! - It is an ordering, not an equality check: `WHERE token = 7` only works if every writer
//!   knows the previous token; `WHERE stored < new` works with any monotonic source.
//! - No rule in the store can repair a source that goes *backwards* by more than one: if
//!   the counter lost several increments, the rightful new holder carries the lower token
//!   and is the one refused. Tokens must come from a source that survives what the lock
//!   service does not (lab 5).
//!
//! Every attempt, accepted or not, is recorded in an append-only table, so the verdict of a
//! lab is read back from the store, never taken from what a worker believed. Each attempt
//! carries its **decision number**: the resource's own counter, advanced while the write
//! holds the resource's row lock. "Which write came last" is that order — the order in which
//! the database decided — not the order in which requests left the workers or in which a
//! sequence handed out ids before the row lock was taken.

use anyhow::{Context, Result};
use serde::Serialize;

use crate::connect::{self, PgClient};

/// The tables, shared by every run; each row carries its run's id, so runs never mix.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS lockslab_resource (
        run_id   text   NOT NULL,
        resource text   NOT NULL,
        value    text   NOT NULL,
        writer   text   NOT NULL,
        -- the highest fencing token accepted so far; NULL while only unfenced writes happened
        token    bigint,
        -- how many writes the store has decided for this resource (advanced under its row lock)
        decisions bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, resource)
    );
    CREATE TABLE IF NOT EXISTS lockslab_attempt (
        id       bigserial PRIMARY KEY,
        run_id   text    NOT NULL,
        resource text    NOT NULL,
        writer   text    NOT NULL,
        value    text    NOT NULL,
        token    bigint,
        fenced   boolean NOT NULL,
        accepted boolean NOT NULL,
        -- the resource's decision number of this attempt: 1 for the first write decided, 2 next…
        decided  bigint,
        at       timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    -- A server whose tables an older lockslab made gets the new columns, only when missing
    -- (an ALTER would queue behind every run that is writing right now).
    DO $$ BEGIN
        IF NOT EXISTS (SELECT FROM information_schema.columns
                       WHERE table_name = 'lockslab_resource' AND column_name = 'decisions') THEN
            ALTER TABLE lockslab_resource ADD COLUMN decisions bigint NOT NULL DEFAULT 0;
        END IF;
        IF NOT EXISTS (SELECT FROM information_schema.columns
                       WHERE table_name = 'lockslab_attempt' AND column_name = 'decided') THEN
            ALTER TABLE lockslab_attempt ADD COLUMN decided bigint;
        END IF;
    END $$;";

/// ❌ No fencing: the write always lands, whoever sends it and however late.
const UNFENCED_WRITE: &str = "
    INSERT INTO lockslab_resource (run_id, resource, value, writer, token)
    VALUES ($1, $2, $3, $4, NULL)
    ON CONFLICT (run_id, resource) DO UPDATE
        SET value = EXCLUDED.value, writer = EXCLUDED.writer
    RETURNING 1";

/// ❌ Fenced, loosely: accepts any token not lower than the highest accepted one. Right
/// while the token source never repeats itself; a reissued token gets through.
const FENCED_WRITE_NOT_LOWER: &str = "
    INSERT INTO lockslab_resource (run_id, resource, value, writer, token)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (run_id, resource) DO UPDATE
        SET value = EXCLUDED.value, writer = EXCLUDED.writer, token = EXCLUDED.token
        WHERE lockslab_resource.token IS NULL OR lockslab_resource.token <= EXCLUDED.token
    RETURNING 1";

/// ✅ Fenced: the database compares the token with the highest accepted one and writes
/// only if it is higher, or equal and from the writer that holds it (a holder writing
/// again), atomically (`ON CONFLICT … DO UPDATE … WHERE` locks the row and evaluates the
/// condition on its latest version). A refused write returns no row.
const FENCED_WRITE: &str = "
    INSERT INTO lockslab_resource (run_id, resource, value, writer, token)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (run_id, resource) DO UPDATE
        SET value = EXCLUDED.value, writer = EXCLUDED.writer, token = EXCLUDED.token
        WHERE lockslab_resource.token IS NULL
           OR lockslab_resource.token < EXCLUDED.token
           OR (lockslab_resource.token = EXCLUDED.token
               AND lockslab_resource.writer = EXCLUDED.writer)
    RETURNING 1";

/// Which fenced writes the store accepts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FenceRule {
    /// ✅ A higher token, or the same token from the writer that already holds it.
    #[default]
    HigherOrSameHolder,
    /// ❌ Any token not lower than the highest: a reissued token is accepted twice.
    NotLower,
}

/// Numbers the decision just made. Both writes above leave the resource's row locked by
/// this transaction — an accepted write because it changed the row, a refused one because
/// `ON CONFLICT DO UPDATE` locks the conflicting row before it evaluates `WHERE` — so no
/// other write to the resource is decided between the write and this number.
const NUMBER_THE_DECISION: &str = "
    UPDATE lockslab_resource SET decisions = decisions + 1
    WHERE run_id = $1 AND resource = $2
    RETURNING decisions";

const RECORD_THE_ATTEMPT: &str = "
    INSERT INTO lockslab_attempt (run_id, resource, writer, value, token, fenced, accepted, decided)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// What the store said about one write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Accepted,
    Rejected,
    /// The write was sent but no answer came back (timeout, lost connection): it may or
    /// may not have landed. Only reading the store back tells.
    Unknown,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Rejected => "rejected",
            Outcome::Unknown => "unknown",
        }
    }
}

/// One recorded write attempt. Read back in decision order.
#[derive(Clone, Debug, Serialize)]
pub struct Attempt {
    pub writer: String,
    pub value: String,
    pub token: Option<i64>,
    pub fenced: bool,
    pub accepted: bool,
    /// Its place in the order the database decided the resource's writes (1, 2, …).
    pub decided: i64,
}

/// The resource as read back at the end of a run.
#[derive(Clone, Debug, Serialize)]
pub struct ReadBack {
    pub final_value: Option<String>,
    pub final_writer: Option<String>,
    pub final_token: Option<i64>,
    pub attempts: Vec<Attempt>,
}

impl ReadBack {
    /// The token of `writer`'s last attempt, if it sent one.
    pub fn last_token_of(&self, writer: &str) -> Option<i64> {
        self.attempts
            .iter()
            .rev()
            .find(|a| a.writer == writer)
            .and_then(|a| a.token)
    }
}

pub struct Store {
    client: PgClient,
    url: String,
}

impl Store {
    pub fn connect(url: &str) -> Result<Store> {
        Ok(Store {
            client: connect::postgres(url)?,
            url: url.to_string(),
        })
    }

    /// A store connection for cleanup (after an interrupt or a failure): short bounds, and
    /// none at all if this server already stopped answering.
    pub fn connect_for_cleanup(url: &str) -> Result<Store> {
        Ok(Store {
            client: connect::postgres_for_cleanup(url)?,
            url: url.to_string(),
        })
    }

    /// Creates the tables if they are missing. Concurrent `CREATE TABLE IF NOT EXISTS` can
    /// still collide in the catalog, so creators queue on an advisory lock.
    pub fn prepare(&mut self) -> Result<()> {
        let mut tx = self.client.transaction()?;
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtext('lockslab schema'))",
            &[],
        )?;
        tx.batch_execute(SCHEMA)
            .context("creating the store's tables")?;
        tx.commit()?;
        Ok(())
    }

    /// Writes `value` to the resource, fenced by `token` when there is one, and records the
    /// attempt with its decision number, all in one transaction.
    pub fn write(
        &mut self,
        run_id: &str,
        resource: &str,
        writer: &str,
        value: &str,
        token: Option<i64>,
    ) -> Outcome {
        self.write_under(FenceRule::default(), run_id, resource, writer, value, token)
    }

    /// [`Store::write`], with the fenced writes decided by `rule`.
    pub fn write_under(
        &mut self,
        rule: FenceRule,
        run_id: &str,
        resource: &str,
        writer: &str,
        value: &str,
        token: Option<i64>,
    ) -> Outcome {
        let fenced_write = match rule {
            FenceRule::HigherOrSameHolder => FENCED_WRITE,
            FenceRule::NotLower => FENCED_WRITE_NOT_LOWER,
        };
        let decide = |client: &mut postgres::Client| -> Result<bool, postgres::Error> {
            let mut tx = client.transaction()?;
            let accepted = match token {
                None => tx.query_opt(UNFENCED_WRITE, &[&run_id, &resource, &value, &writer])?,
                Some(token) => {
                    tx.query_opt(fenced_write, &[&run_id, &resource, &value, &writer, &token])?
                }
            }
            .is_some();
            let decided: i64 = tx
                .query_one(NUMBER_THE_DECISION, &[&run_id, &resource])?
                .get(0);
            tx.execute(
                RECORD_THE_ATTEMPT,
                &[
                    &run_id,
                    &resource,
                    &writer,
                    &value,
                    &token,
                    &token.is_some(),
                    &accepted,
                    &decided,
                ],
            )?;
            tx.commit()?;
            Ok(accepted)
        };
        match decide(&mut self.client) {
            Ok(true) => Outcome::Accepted,
            Ok(false) => Outcome::Rejected,
            // The commit may or may not have happened before the answer was lost.
            Err(_) => Outcome::Unknown,
        }
    }

    pub fn read_back(&mut self, run_id: &str, resource: &str) -> Result<ReadBack> {
        let current = self.client.query_opt(
            "SELECT value, writer, token FROM lockslab_resource WHERE run_id = $1 AND resource = $2",
            &[&run_id, &resource],
        )?;
        let attempts = self
            .client
            .query(
                "SELECT writer, value, token, fenced, accepted, decided FROM lockslab_attempt
                 WHERE run_id = $1 AND resource = $2 ORDER BY decided",
                &[&run_id, &resource],
            )?
            .iter()
            .map(|row| Attempt {
                writer: row.get(0),
                value: row.get(1),
                token: row.get(2),
                fenced: row.get(3),
                accepted: row.get(4),
                decided: row.get(5),
            })
            .collect();
        Ok(ReadBack {
            final_value: current.as_ref().map(|row| row.get(0)),
            final_writer: current.as_ref().map(|row| row.get(1)),
            final_token: current.as_ref().and_then(|row| row.get(2)),
            attempts,
        })
    }

    /// Deletes a run's rows once its verdict has been read. Cleanup is best effort: after a
    /// failure it waits only briefly, and not at all for a server that stopped answering.
    pub fn forget_run(&mut self, run_id: &str) -> Result<()> {
        if connect::gave_up_on(&self.url) {
            return Ok(());
        }
        self.client.bound(connect::CLEANUP_TIMEOUT);
        self.client.execute(
            "DELETE FROM lockslab_resource WHERE run_id = $1",
            &[&run_id],
        )?;
        self.client
            .execute("DELETE FROM lockslab_attempt WHERE run_id = $1", &[&run_id])?;
        Ok(())
    }
}
