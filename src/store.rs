//! The protected resource: one value per resource in a Postgres table, guarded by fencing.
//!
//! A lock cannot stop a client that has already passed its check and then paused, so the
//! safety has to live where the data lives. The store accepts a fenced write only if its
//! token is **not lower** than the highest token it has accepted for that resource (`>=`:
//! a holder may write more than once with its token), and it decides that inside the
//! database, in the same statement as the write: there is no window between "check" and
//! "write" for a stale writer to slip through.
//!
//! Three details that loose descriptions get wrong:
//! - It is an ordering, not an equality check: `WHERE token = 7` only works if every writer
//!   knows the previous token; `WHERE stored <= new` works with any monotonic source.
//! - The rule is only as good as the token's source. A source that hands a number out twice
//!   — a Redis `INCR` counter on a server restarted without persistence, or failed over to
//!   a replica that missed the increment — gives two holders one token, and `>=` accepts
//!   both ([`FenceRule::NotLower`], played with such a source as a lesson). **No rule at the
//!   store can tell two holders of one reissued token apart**: refusing "an equal token from
//!   another writer" ([`FenceRule::HigherOrSameHolder`], kept only as a lesson) refuses
//!   whichever of the two writes *second* — and if the stale holder writes first, that is
//!   the rightful one. If the counter lost several increments, the new holder even carries
//!   the *lower* token. The fix is the source: one that is ordered and survives what the
//!   lock service does not — a Postgres sequence in the store's own database
//!   ([`Store::next_token`]), an etcd revision, or a token that carries the lock service's
//!   epoch (a restart or failover raises the epoch, so every token after it is higher).
//! - A random lock value has no order. Checked by compare-and-set at the resource
//!   ([`Store::claim`], [`Store::write_if_claimed`]) it refuses a stale writer whose claim
//!   came first and was replaced; but a claim that arrives late (the old holder paused
//!   between its grant and its claim) displaces the new holder's, and the resource cannot
//!   tell (lab 6). A resource that can do that compare-and-set atomically could itself
//!   have been the lock.
//!
//! Every attempt, accepted or not, is recorded in an append-only table, so the verdict of a
//! lab is read back from the store, never taken from what a worker believed. Each attempt
//! carries its **decision number**: the resource's own counter, advanced while the write
//! holds the resource's row lock. "Which write came last" is that order — the order in which
//! the database decided — not the order in which requests left the workers or in which a
//! sequence handed out ids before the row lock was taken.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::connect::{self, PgClient};

/// The tables, shared by every run; each row carries its run's id, so runs never mix.
/// `{schema}` is the connection's own schema (see [`own_schema`]): every statement of the
/// store names it, so no other schema's table of the same name can stand in.
const SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS {schema}.lockslab_resource (
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
    CREATE TABLE IF NOT EXISTS {schema}.lockslab_attempt (
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
    -- Lab 6's compare-and-set by lock value: who claimed the resource last. Every write
    -- guarded by a claim locks this row first, so its decisions are numbered here.
    CREATE TABLE IF NOT EXISTS {schema}.lockslab_claim (
        run_id    text   NOT NULL,
        resource  text   NOT NULL,
        claim     text,
        claimer   text,
        decisions bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, resource)
    );
    -- A server whose tables an older lockslab made gets the new columns, only when missing
    -- (an ALTER would queue behind every run that is writing right now).
    DO $$ BEGIN
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute
                       WHERE attrelid = '{schema}.lockslab_resource'::pg_catalog.regclass
                         AND attname = 'decisions' AND NOT attisdropped) THEN
            ALTER TABLE {schema}.lockslab_resource ADD COLUMN decisions bigint NOT NULL DEFAULT 0;
        END IF;
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_attribute
                       WHERE attrelid = '{schema}.lockslab_attempt'::pg_catalog.regclass
                         AND attname = 'decided' AND NOT attisdropped) THEN
            ALTER TABLE {schema}.lockslab_attempt ADD COLUMN decided bigint;
        END IF;
    END $$;";

/// ❌ No fencing: the write always lands, whoever sends it and however late.
const UNFENCED_WRITE: &str = "
    INSERT INTO {schema}.lockslab_resource (run_id, resource, value, writer, token)
    VALUES ($1, $2, $3, $4, NULL)
    ON CONFLICT (run_id, resource) DO UPDATE
        SET value = EXCLUDED.value, writer = EXCLUDED.writer
    RETURNING 1";

/// The store's rule, `>=`: accepts any token not lower than the highest accepted one (a
/// holder may write twice with its token). ✅ with tokens from an ordered source that never
/// hands a number out twice; ❌ with a source that does (lab 1's `--token-restart`, lab 5):
/// the stale holder's copy of a reissued token gets through.
pub(crate) const FENCED_WRITE_NOT_LOWER: &str = "
    INSERT INTO {schema}.lockslab_resource (run_id, resource, value, writer, token)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (run_id, resource) DO UPDATE
        SET value = EXCLUDED.value, writer = EXCLUDED.writer, token = EXCLUDED.token
        WHERE lockslab_resource.token IS NULL OR lockslab_resource.token <= EXCLUDED.token
    RETURNING 1";

/// ❌ A lesson, not a fix: higher, or equal and from the writer that sent it first. It
/// looks as if it catches a reissued token, but it only refuses whichever holder of the
/// token writes *second*: when the stale holder writes first, the rightful one is refused.
/// (`ON CONFLICT … DO UPDATE … WHERE` locks the row and evaluates the condition on its
/// latest version; a refused write returns no row.)
const FENCED_WRITE_SAME_HOLDER: &str = "
    INSERT INTO {schema}.lockslab_resource (run_id, resource, value, writer, token)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (run_id, resource) DO UPDATE
        SET value = EXCLUDED.value, writer = EXCLUDED.writer, token = EXCLUDED.token
        WHERE lockslab_resource.token IS NULL
           OR lockslab_resource.token < EXCLUDED.token
           OR (lockslab_resource.token = EXCLUDED.token
               AND lockslab_resource.writer = EXCLUDED.writer)
    RETURNING 1";

/// Which fenced writes the store accepts. Neither rule repairs a token source that hands a
/// number out twice; the fix is the source (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FenceRule {
    /// `>=`, the store's rule: right with an ordered source that never reissues a token.
    #[default]
    NotLower,
    /// ❌ Lesson only: an equal token from another writer is refused — whoever writes
    /// second, stale or rightful.
    HigherOrSameHolder,
}

impl FenceRule {
    /// Its name in `--json`.
    pub fn as_str(self) -> &'static str {
        match self {
            FenceRule::NotLower => "not_lower",
            FenceRule::HigherOrSameHolder => "higher_or_same_holder",
        }
    }
}

/// Lab 6's claim by lock value (antirez's compare-and-set): the resource remembers the
/// random value of the last client that claimed it. It has no order: a late claim from an
/// old holder replaces a newer one just the same.
const CLAIM: &str = "
    INSERT INTO {schema}.lockslab_claim (run_id, resource, claim, claimer)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (run_id, resource) DO UPDATE
        SET claim = EXCLUDED.claim, claimer = EXCLUDED.claimer";

/// Makes the claim row if missing, then locks it and reads it: the write is decided under
/// that lock, so no claim can change between the compare and the set.
const MAKE_THE_CLAIM_ROW: &str = "
    INSERT INTO {schema}.lockslab_claim (run_id, resource) VALUES ($1, $2)
    ON CONFLICT (run_id, resource) DO NOTHING";
const LOCK_THE_CLAIM: &str = "
    SELECT claim FROM {schema}.lockslab_claim WHERE run_id = $1 AND resource = $2 FOR UPDATE";

const NUMBER_THE_CLAIMED_DECISION: &str = "
    UPDATE {schema}.lockslab_claim SET decisions = decisions + 1
    WHERE run_id = $1 AND resource = $2
    RETURNING decisions";

/// Numbers the decision just made. Both writes above leave the resource's row locked by
/// this transaction — an accepted write because it changed the row, a refused one because
/// `ON CONFLICT DO UPDATE` locks the conflicting row before it evaluates `WHERE` — so no
/// other write to the resource is decided between the write and this number.
pub(crate) const NUMBER_THE_DECISION: &str = "
    UPDATE {schema}.lockslab_resource SET decisions = decisions + 1
    WHERE run_id = $1 AND resource = $2
    RETURNING decisions";

pub(crate) const RECORD_THE_ATTEMPT: &str = "
    INSERT INTO {schema}.lockslab_attempt (run_id, resource, writer, value, token, fenced, accepted, decided)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";

/// What the store said about one write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Attempt {
    pub writer: String,
    pub value: String,
    pub token: Option<i64>,
    pub fenced: bool,
    pub accepted: bool,
    /// Its place in the order the database decided the resource's writes (1, 2, …).
    pub decided: i64,
}

impl Attempt {
    /// The attempts as a table cell says them, in their order: `B:2→ok A:1→no` (writer,
    /// token or `-`, accepted or not).
    pub fn words(attempts: &[Attempt]) -> String {
        let word = |a: &Attempt| {
            let token = a.token.map_or("-".into(), |t| t.to_string());
            let ok = if a.accepted { "ok" } else { "no" };
            format!("{}:{token}→{ok}", a.writer)
        };
        attempts.iter().map(word).collect::<Vec<_>>().join(" ")
    }
}

/// The resource as read back at the end of a run.
#[derive(Clone, Debug, Serialize, Deserialize)]
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

/// The schema lockslab keeps its own tables in on this connection, quoted as an identifier:
/// the schema named like the connection's role, if that role owns it (`lockslab` for the
/// labs' role, `lockslab_admin` for the admin, `seat07` for a room's seat — each made by
/// `lockslab up` or a private server's setup), else the first schema of the role's
/// `search_path` (a Postgres given to lockslab, set up as its owner chose).
///
/// A schema of that name made by another role is passed over: that is how a room's seat
/// once put a table with a trigger in the admin's way (`"$user"` in the default path).
pub fn own_schema(client: &mut postgres::Client) -> Result<String> {
    let schema: Option<String> = client
        .query_one(
            "SELECT pg_catalog.quote_ident(coalesce(
                 (SELECT n.nspname FROM pg_catalog.pg_namespace n
                  JOIN pg_catalog.pg_roles r ON r.oid = n.nspowner
                  WHERE n.nspname = current_user AND r.rolname = current_user),
                 pg_catalog.current_schema()))",
            &[],
        )
        .context("finding the schema for lockslab's tables")?
        .get(0);
    schema.context(
        "no schema for lockslab's tables: the role has no schema of its own and its \
         search_path names none that exists (CREATE SCHEMA, or ALTER ROLE … SET search_path)",
    )
}

pub struct Store {
    client: PgClient,
    url: String,
    /// [`own_schema`] of this connection, quoted: it prefixes every table and sequence.
    schema: String,
}

impl Store {
    pub fn connect(url: &str) -> Result<Store> {
        Self::on(connect::postgres(url)?, url)
    }

    /// A store connection for cleanup (after an interrupt or a failure): short bounds, and
    /// none at all if this server already stopped answering.
    pub fn connect_for_cleanup(url: &str) -> Result<Store> {
        Self::on(connect::postgres_for_cleanup(url)?, url)
    }

    fn on(mut client: PgClient, url: &str) -> Result<Store> {
        let schema = own_schema(&mut client)?;
        Ok(Store {
            client,
            url: url.to_string(),
            schema,
        })
    }

    /// `statement` with its tables in this connection's schema.
    pub(crate) fn sql(&self, statement: &str) -> String {
        statement.replace("{schema}", &self.schema)
    }

    /// `sequence`, qualified by this connection's schema.
    fn sequence(&self, sequence: &str) -> String {
        format!("{}.{sequence}", self.schema)
    }

    /// Creates the tables if they are missing. Concurrent `CREATE TABLE IF NOT EXISTS` can
    /// still collide in the catalog, so creators queue on an advisory lock.
    pub fn prepare(&mut self) -> Result<()> {
        let schema = self.sql(SCHEMA);
        let mut tx = self.client.transaction()?;
        tx.execute(
            "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('lockslab schema'))",
            &[],
        )?;
        tx.batch_execute(&schema)
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
        let fenced_write = self.sql(match rule {
            FenceRule::HigherOrSameHolder => FENCED_WRITE_SAME_HOLDER,
            FenceRule::NotLower => FENCED_WRITE_NOT_LOWER,
        });
        let unfenced_write = self.sql(UNFENCED_WRITE);
        let number_the_decision = self.sql(NUMBER_THE_DECISION);
        let record_the_attempt = self.sql(RECORD_THE_ATTEMPT);
        let decide = |client: &mut postgres::Client| -> Result<bool, postgres::Error> {
            let mut tx = client.transaction()?;
            let accepted = match token {
                None => tx.query_opt(&unfenced_write, &[&run_id, &resource, &value, &writer])?,
                Some(token) => tx.query_opt(
                    &fenced_write,
                    &[&run_id, &resource, &value, &writer, &token],
                )?,
            }
            .is_some();
            let decided: i64 = tx
                .query_one(&number_the_decision, &[&run_id, &resource])?
                .get(0);
            tx.execute(
                &record_the_attempt,
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

    /// Claims the resource for the client whose random lock value is `lock_value`: the
    /// first half of antirez's compare-and-set. Returns false when the answer was lost.
    pub fn claim(&mut self, run_id: &str, resource: &str, writer: &str, lock_value: &str) -> bool {
        let claim = self.sql(CLAIM);
        self.client
            .execute(&claim, &[&run_id, &resource, &lock_value, &writer])
            .is_ok()
    }

    /// The second half: writes `value` only if the resource's claim is still `lock_value`,
    /// compared and set under the claim row's lock, and records the attempt (fenced, with
    /// no token) with its decision number.
    pub fn write_if_claimed(
        &mut self,
        run_id: &str,
        resource: &str,
        writer: &str,
        value: &str,
        lock_value: &str,
    ) -> Outcome {
        let make_the_claim_row = self.sql(MAKE_THE_CLAIM_ROW);
        let lock_the_claim = self.sql(LOCK_THE_CLAIM);
        let unfenced_write = self.sql(UNFENCED_WRITE);
        let number_the_claimed_decision = self.sql(NUMBER_THE_CLAIMED_DECISION);
        let record_the_attempt = self.sql(RECORD_THE_ATTEMPT);
        let decide = |client: &mut postgres::Client| -> Result<bool, postgres::Error> {
            let mut tx = client.transaction()?;
            tx.execute(&make_the_claim_row, &[&run_id, &resource])?;
            let claim: Option<String> =
                tx.query_one(&lock_the_claim, &[&run_id, &resource])?.get(0);
            let accepted = claim.as_deref() == Some(lock_value);
            if accepted {
                tx.query_opt(&unfenced_write, &[&run_id, &resource, &value, &writer])?;
            }
            let decided: i64 = tx
                .query_one(&number_the_claimed_decision, &[&run_id, &resource])?
                .get(0);
            let no_token: Option<i64> = None;
            tx.execute(
                &record_the_attempt,
                &[
                    &run_id, &resource, &writer, &value, &no_token, &true, &accepted, &decided,
                ],
            )?;
            tx.commit()?;
            Ok(accepted)
        };
        match decide(&mut self.client) {
            Ok(true) => Outcome::Accepted,
            Ok(false) => Outcome::Rejected,
            Err(_) => Outcome::Unknown,
        }
    }

    /// Makes `sequence`, a token source in the store's own schema, if it is missing.
    pub fn create_token_sequence(&mut self, sequence: &str) -> Result<()> {
        let sequence = self.sequence(sequence);
        self.client
            .batch_execute(&format!("CREATE SEQUENCE IF NOT EXISTS {sequence}"))
            .context("creating the fencing token sequence")
    }

    /// Draws a fencing token from `sequence`: ordered (every draw is higher than every draw
    /// before it) and durable (a sequence does not go back when Postgres restarts), so it
    /// never hands a number out twice, whatever happens to the lock service.
    pub fn next_token(&mut self, sequence: &str) -> Result<i64> {
        let sequence = self.sequence(sequence);
        Ok(self
            .client
            .query_one(
                "SELECT pg_catalog.nextval($1::text::pg_catalog.regclass)",
                &[&sequence],
            )
            .context("drawing a fencing token from the Postgres sequence")?
            .get(0))
    }

    /// Removes a sequence made by [`Store::create_token_sequence`].
    pub fn drop_token_sequence(&mut self, sequence: &str) -> Result<()> {
        let sequence = self.sequence(sequence);
        self.client
            .batch_execute(&format!("DROP SEQUENCE IF EXISTS {sequence}"))
            .context("dropping the fencing token sequence")
    }

    pub fn read_back(&mut self, run_id: &str, resource: &str) -> Result<ReadBack> {
        let current_sql = self.sql(
            "SELECT value, writer, token FROM {schema}.lockslab_resource \
             WHERE run_id = $1 AND resource = $2",
        );
        let attempts_sql = self.sql(
            "SELECT writer, value, token, fenced, accepted, decided \
             FROM {schema}.lockslab_attempt \
             WHERE run_id = $1 AND resource = $2 ORDER BY decided",
        );
        let current = self.client.query_opt(&current_sql, &[&run_id, &resource])?;
        let attempts = self
            .client
            .query(&attempts_sql, &[&run_id, &resource])?
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
        for table in ["lockslab_resource", "lockslab_attempt", "lockslab_claim"] {
            let delete = format!("DELETE FROM {}.{table} WHERE run_id = $1", self.schema);
            self.client.execute(&delete, &[&run_id])?;
        }
        Ok(())
    }
}
