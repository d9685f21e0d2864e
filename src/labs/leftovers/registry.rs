//! The registry of live runs, and the sweep of the dead ones (see [`Registry`]).

use super::Leftovers;
use crate::connect;
use crate::invoices;
use crate::queue::{Mode, Queue};
use crate::store::own_schema;

/// The live runs on shared servers, so that a run killed with SIGKILL — whose cleanup never
/// ran — is swept by the next run on the same servers, or by `lockslab reset`.
///
/// A run that writes to Postgres registers there: it holds a session advisory lock named by
/// its run id on a connection it keeps open, and has a row in `lockslab_live_run`. Postgres
/// releases the lock when that connection ends, which it does when the process dies however
/// it dies; a run in the table whose lock can be taken is dead. A run that writes to Redis
/// only (lab 2) registers in that Redis the same way: it names a connection it keeps open
/// (`CLIENT SETNAME lockslab-run-<id>`) and adds its id to the set `lockslab:live-runs`; a
/// run in the set with no connection of that name in `CLIENT LIST` is dead. (A Redis whose
/// `timeout` closes idle connections would make a live run look dead: keep it at 0, the
/// default, on a shared server.)
///
/// A dead run's Redis keys, etcd keys, store rows, tables, schema and sequences are all
/// named by its run id, and removed by those names: only run ids are read from the registry,
/// never statements or URLs, so a row or member another user wrote can make a run sweep
/// nothing but a dead run's own names.
///
/// The table lives in the connection's own schema ([`own_schema`]), named in every
/// statement: the admin's registry (of the challenge runs it grades) in `lockslab_admin`,
/// the labs' role's in `lockslab`, a seat's in its own. A run whose removal left something
/// behind keeps its row, so that the next run sweeps it again.
pub struct Registry {
    /// The connection holding the run's lock, and its schema (quoted).
    postgres: Option<(connect::PgClient, String)>,
    redis: Option<(String, connect::RedisConn)>,
}

/// The advisory lock a live run holds, from its run id (computed, never read from the table).
const RUN_LOCK: &str = "pg_catalog.hashtextextended('lockslab-run:' || $1::text, 0)";

/// The Redis set of the runs registered in that Redis.
const LIVE_RUNS: &str = "lockslab:live-runs";

/// The name of the connection a live run keeps open to a Redis it registered in.
fn connection_name(run_id: &str) -> String {
    format!("lockslab-run-{run_id}")
}

/// A run id as lockslab makes them: hex, or a room seat's namespace and hex (`ana_3f2a91c0`).
/// Anything else is skipped: a `*` would make a key pattern match everyone's, and a quote
/// would end a name in a statement.
fn well_formed(run_id: &str) -> bool {
    let hex = |part: &str| !part.is_empty() && part.chars().all(|c| c.is_ascii_hexdigit());
    let lower = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    };
    run_id.len() <= 40
        && match run_id.split_once('_') {
            None => hex(run_id) && !run_id.chars().any(|c| c.is_ascii_uppercase()),
            Some((seat, id)) => {
                lower(seat) && hex(id) && !id.chars().any(|c| c.is_ascii_uppercase())
            }
        }
}

/// The statements that drop whatever a run may have created in Postgres besides its store
/// rows, built from its run id: lab 7's schema, lab 3's queue tables, and the fencing token
/// sequences of labs 1, 5 and 6 (all in `schema`, the registry's), and a challenge's
/// records and log, its clients' sessions ended first. Each is `IF EXISTS`: a run makes
/// only some of them.
pub(super) fn what_a_run_creates_in_postgres(run_id: &str, schema: &str) -> String {
    let queue_tables: Vec<String> = Mode::ALL
        .into_iter()
        .map(|mode| Queue::new(run_id, mode))
        .flat_map(|queue| [queue.jobs, queue.processing])
        .map(|table| format!("{schema}.{table}"))
        .collect();
    let sequences = [
        // Lab 1's, one per fenced variation that draws from the store (`--token-restart`).
        format!("lockslab_gc_pause_{run_id}_sequence"),
        format!("lockslab_gc_pause_{run_id}_sequence_a_first"),
        // Lab 5's (`sequence_of` in labs/failover) and lab 6's.
        format!("lockslab_fence_{run_id}"),
        redlock_sequence_of(run_id),
    ]
    .map(|sequence| format!("{schema}.{sequence}"));
    format!(
        "{}; DROP SCHEMA IF EXISTS {}, {} CASCADE; DROP TABLE IF EXISTS {}; \
         DROP SEQUENCE IF EXISTS {}; {}",
        end_challenge_sessions(run_id),
        invoices::schema_of(run_id),
        challenge_schema_of(run_id),
        queue_tables.join(", "),
        sequences.join(", "),
        drop_challenge_role(run_id)
    )
}

/// Ends every session that could keep a challenge run's schema from being dropped: its
/// clients' role's (which may not log in again once this commits), and any other holding a
/// lock on the schema or on something in it. A client that leaves a session holding
/// `LOCK TABLE` on a table of its own, busy in `pg_sleep`, outlives its process (a busy
/// backend does not notice its client is gone): waiting for it made the drop time out, and
/// the role — whose password the client knows — stayed.
///
/// Best effort, like the drops after it: without the right to end those sessions (a role
/// that is neither superuser nor a member of theirs), a warning, and the drop may wait.
pub fn end_challenge_sessions(run_id: &str) -> String {
    let role = challenge_role_of(run_id);
    let schema = challenge_schema_of(run_id);
    format!(
        "DO $$ DECLARE r text; BEGIN \
         PERFORM pg_catalog.pg_terminate_backend(a.pid) FROM pg_catalog.pg_stat_activity a \
         WHERE a.pid <> pg_catalog.pg_backend_pid() AND (a.usename = '{role}' \
           OR pg_catalog.starts_with(a.usename, '{role}_') OR a.pid IN (\
           SELECT l.pid FROM pg_catalog.pg_locks l, pg_catalog.pg_namespace n \
           WHERE n.nspname = '{schema}' AND l.database = (SELECT d.oid \
             FROM pg_catalog.pg_database d WHERE d.datname = pg_catalog.current_database()) \
           AND (l.relation IN (SELECT c.oid FROM pg_catalog.pg_class c \
                               WHERE c.relnamespace = n.oid) \
                OR (l.classid = 'pg_catalog.pg_namespace'::pg_catalog.regclass \
                    AND l.objid = n.oid)))); \
         FOR r IN SELECT rolname FROM pg_catalog.pg_roles \
                   WHERE pg_catalog.starts_with(rolname, '{role}_') AND rolcanlogin LOOP \
         EXECUTE pg_catalog.format('ALTER ROLE %I NOLOGIN', r); END LOOP; \
         EXCEPTION WHEN OTHERS THEN \
         RAISE WARNING 'lockslab: sessions of {role} left: %', SQLERRM; \
         END $$"
    )
}

/// The Postgres role of a `lockslab challenge` run's clients (see `challenge::table`).
pub fn challenge_role_of(run_id: &str) -> String {
    format!("lockslab_client_{run_id}")
}

/// Drops a challenge run's client role if it is there, once the run's schema (which holds
/// its grants and its own tables) is gone, with whatever else the client made it own or
/// be granted outside the schema (a large object, default privileges): `DROP OWNED`, which
/// wants the role's privileges — a role that only may create roles takes them first. A
/// no-op where no such role exists, so a role that may not drop roles can still sweep a
/// run that made none.
///
/// A role that still owns something elsewhere (in another database, which `DROP OWNED`
/// does not reach) stays, with a warning: its failure must not undo the schema's drop in
/// the same batch.
pub fn drop_challenge_role(run_id: &str) -> String {
    let role = challenge_role_of(run_id);
    // Each client's login first (`{role}_c1`…), then the role they become.
    format!(
        "DO $$ DECLARE r text; BEGIN \
         FOR r IN SELECT rolname FROM pg_catalog.pg_roles \
                   WHERE pg_catalog.starts_with(rolname, '{role}_') OR rolname = '{role}' \
                   ORDER BY rolname = '{role}', rolname LOOP \
         IF NOT pg_catalog.pg_has_role(current_user, r, 'MEMBER') THEN \
         EXECUTE pg_catalog.format('GRANT %I TO CURRENT_USER', r); END IF; \
         EXECUTE pg_catalog.format('DROP OWNED BY %I', r); \
         EXECUTE pg_catalog.format('DROP ROLE %I', r); END LOOP; \
         EXCEPTION WHEN OTHERS THEN RAISE WARNING 'lockslab: role {role} left: %', SQLERRM; \
         END $$"
    )
}

/// The Postgres sequence that hands out lab 6's client-pause fencing tokens. Named here,
/// where a dead run's leftovers are known by name, and used by `labs::redlock`.
pub fn redlock_sequence_of(run_id: &str) -> String {
    format!("lockslab_redlock_{run_id}")
}

/// The schema of a `lockslab challenge` run: its records and their log. Named here, where
/// a dead run's leftovers are known by name, and used by `challenge::table`.
pub fn challenge_schema_of(run_id: &str) -> String {
    format!("lockslab_challenge_{run_id}")
}

impl Registry {
    /// Sweeps the dead runs, then enters `leftovers`' run: in the Postgres it writes to, or
    /// else in its first Redis. Best effort: a server that refuses (a restricted role, a
    /// Redis without `CLIENT`) only loses the sweep.
    pub(super) fn enter(leftovers: &Leftovers) -> Option<Registry> {
        sweep(leftovers);
        let run_id = &leftovers.run_id;
        if let Some(url) = leftovers.postgres() {
            let mut client = connect::postgres(url).ok()?;
            let schema = create_live_run_table(&mut client).ok()?;
            client
                .execute(
                    &format!("SELECT pg_catalog.pg_advisory_lock({RUN_LOCK})"),
                    &[run_id],
                )
                .ok()?;
            client
                .execute(
                    &format!(
                        "INSERT INTO {schema}.lockslab_live_run (run_id) VALUES ($1) \
                         ON CONFLICT DO NOTHING"
                    ),
                    &[run_id],
                )
                .ok()?;
            return Some(Registry {
                postgres: Some((client, schema)),
                redis: None,
            });
        }
        let url = leftovers.redis.first()?;
        let mut redis = connect::redis(url).ok()?;
        redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(connection_name(run_id))
            .query::<()>(&mut *redis)
            .ok()?;
        redis::cmd("SADD")
            .arg(LIVE_RUNS)
            .arg(run_id)
            .query::<i64>(&mut *redis)
            .ok()?;
        Some(Registry {
            postgres: None,
            redis: Some((url.clone(), redis)),
        })
    }

    /// The run is over and its leftovers removed: out of the registry, its lock released.
    /// (A run whose removal left something drops its `Registry` without leaving: its lock
    /// goes with the connection, and the next run finds it dead and sweeps it.)
    pub(super) fn leave(self, run_id: &str) {
        if let Some((mut client, schema)) = self.postgres {
            let _ = client.execute(
                &format!("DELETE FROM {schema}.lockslab_live_run WHERE run_id = $1"),
                &[&run_id],
            );
        }
        if let Some((_, mut redis)) = self.redis {
            let _ = redis::cmd("SREM")
                .arg(LIVE_RUNS)
                .arg(run_id)
                .query::<i64>(&mut *redis);
        }
    }
}

/// Makes the registry's table in the connection's own schema if missing; returns that
/// schema, quoted.
fn create_live_run_table(client: &mut connect::PgClient) -> anyhow::Result<String> {
    let schema = own_schema(client)?;
    client.batch_execute(&format!(
        "CREATE TABLE IF NOT EXISTS {schema}.lockslab_live_run (
             run_id text PRIMARY KEY,
             started timestamptz NOT NULL DEFAULT pg_catalog.now())"
    ))?;
    Ok(schema)
}

/// Removes what each dead run registered on the servers `mine` names left there. Returns
/// how many dead runs were swept clean.
fn sweep(mine: &Leftovers) -> usize {
    let mut swept = 0;
    if let Some(url) = mine.postgres() {
        swept += sweep_postgres(url, mine).unwrap_or(0);
    }
    for url in &mine.redis {
        swept += sweep_redis(url, mine).unwrap_or(0);
    }
    swept
}

/// The dead runs registered in the Postgres at `url`.
fn sweep_postgres(url: &str, mine: &Leftovers) -> anyhow::Result<usize> {
    if connect::gave_up_on(url) {
        return Ok(0);
    }
    let mut client = connect::postgres(url)?;
    let schema = create_live_run_table(&mut client)?;
    let has_store = client
        .query_one(
            "SELECT pg_catalog.to_regclass($1 || '.lockslab_resource') IS NOT NULL
                AND pg_catalog.to_regclass($1 || '.lockslab_attempt') IS NOT NULL
                AND pg_catalog.to_regclass($1 || '.lockslab_claim') IS NOT NULL",
            &[&schema],
        )?
        .get::<_, bool>(0);
    let mut swept = 0;
    let live_runs = format!("SELECT run_id FROM {schema}.lockslab_live_run");
    for row in client.query(&live_runs, &[])? {
        let run_id: String = row.get(0);
        if !well_formed(&run_id) || run_id == mine.run_id {
            continue;
        }
        let dead = client
            .query_one(
                &format!("SELECT pg_catalog.pg_try_advisory_lock({RUN_LOCK})"),
                &[&run_id],
            )
            .is_ok_and(|row| row.get::<_, bool>(0));
        if !dead {
            continue;
        }
        // Still registered now that its lock is ours? The list was read before: a run that
        // left cleanly since (its row deleted, its lock let go) is no dead run, and may be
        // creating what its next part needs under the same name — it waits for this lock
        // before it registers again.
        let still_registered = client
            .query_opt(
                &format!("SELECT 1 FROM {schema}.lockslab_live_run WHERE run_id = $1"),
                &[&run_id],
            )
            .is_ok_and(|row| row.is_some());
        if !still_registered {
            let _ = client.execute(
                &format!("SELECT pg_catalog.pg_advisory_unlock({RUN_LOCK})"),
                &[&run_id],
            );
            continue;
        }
        if mine
            .of_dead_run(&run_id, Some((url, &schema, has_store)))
            .remove()
            .is_empty()
        {
            let _ = client.execute(
                &format!("DELETE FROM {schema}.lockslab_live_run WHERE run_id = $1"),
                &[&run_id],
            );
            swept += 1;
        }
        let _ = client.execute(
            &format!("SELECT pg_catalog.pg_advisory_unlock({RUN_LOCK})"),
            &[&run_id],
        );
    }
    Ok(swept)
}

/// The dead runs registered in the Redis at `url`.
fn sweep_redis(url: &str, mine: &Leftovers) -> anyhow::Result<usize> {
    if connect::gave_up_on(url) {
        return Ok(0);
    }
    let mut redis = connect::redis(url)?;
    let registered: Vec<String> = redis::cmd("SMEMBERS").arg(LIVE_RUNS).query(&mut *redis)?;
    if registered.is_empty() {
        return Ok(0);
    }
    // Read after the members: a run names its connection before it joins the set.
    let clients: String = redis::cmd("CLIENT").arg("LIST").query(&mut *redis)?;
    let live: std::collections::HashSet<&str> = clients
        .lines()
        .flat_map(|line| line.split(' '))
        .filter_map(|field| field.strip_prefix("name="))
        .collect();
    let mut swept = 0;
    for run_id in registered {
        if !well_formed(&run_id)
            || run_id == mine.run_id
            || live.contains(connection_name(&run_id).as_str())
        {
            continue;
        }
        let dead_run = Leftovers {
            redis: vec![url.to_string()],
            ..mine.of_dead_run(&run_id, None)
        };
        if dead_run.remove().is_empty() {
            let _ = redis::cmd("SREM")
                .arg(LIVE_RUNS)
                .arg(&run_id)
                .query::<i64>(&mut *redis);
            swept += 1;
        }
    }
    Ok(swept)
}

/// `lockslab reset`'s sweep: what dead runs registered on these servers left there.
/// Returns how many dead runs were swept clean.
pub fn sweep_dead_runs(redis_url: &str, postgres_url: &str) -> usize {
    sweep(&Leftovers::of_run("").store(postgres_url).redis(redis_url))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_run_ids_as_lockslab_makes_them_are_swept() {
        for id in ["3f2a91c0", "ana_3f2a91c0", "seat7_0b"] {
            assert!(well_formed(id), "{id}");
        }
        for id in [
            "",
            "*",
            "3f2a*",
            "x'; DROP TABLE t; --",
            "ana_",
            "_3f",
            "Ana_3f",
            "ana_xyz",
            "a_b_c1",
        ] {
            assert!(!well_formed(id), "{id}");
        }
    }

    #[test]
    fn a_dead_runs_statements_name_only_its_own_objects() {
        let sql = what_a_run_creates_in_postgres("ana_3f2a", "ana");
        assert!(
            sql.contains(
                "; DROP SCHEMA IF EXISTS lockslab_ana_3f2a, lockslab_challenge_ana_3f2a CASCADE;"
            ),
            "{sql}"
        );
        // The client role's sessions end before anything is dropped.
        assert!(
            sql.find("pg_terminate_backend") < sql.find("DROP SCHEMA"),
            "{sql}"
        );
        assert!(
            sql.contains("ana.lockslab_ana_3f2a_skip_locked_jobs"),
            "{sql}"
        );
        assert!(sql.contains("ana.lockslab_fence_ana_3f2a"), "{sql}");
    }
}
