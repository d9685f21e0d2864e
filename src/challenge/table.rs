//! The protected records of one run, in a Postgres schema of the run's own: the records
//! the client writes, and the log the database itself keeps of every change to them.
//!
//! The log is written by a trigger, inside the transaction that changes the record: a
//! change that commits is in the log, one that rolls back is not, and nothing the client
//! says can add to it or take from it. The client must not write to the log (a trigger
//! refuses updates and deletes there), nor add or delete records. An update that changes
//! none of `value`, `items` and `job` (a token's claim on `fence` before the read) is not
//! logged: it writes nothing the grade is about. Each logged change carries the record's `fence`
//! after it: the token it was made under (graded by `failover`).

use anyhow::{Context, Result};

use crate::check::challenge::{Change, Final, Finals};
use crate::connect::PgClient;

/// The schema's name for a run (its run id is made of lowercase hex, digits and `_`).
pub fn schema_of(run_id: &str) -> String {
    crate::labs::leftovers::challenge_schema_of(run_id)
}

/// The Postgres role of a run's clients: made for the run, dropped with it.
pub fn client_role_of(run_id: &str) -> String {
    crate::labs::leftovers::challenge_role_of(run_id)
}

/// What drops everything the run made in Postgres: first it ends the clients' sessions
/// (one kept busy holding a lock would outwait the drop), then the schema with the
/// client's own tables, then the clients' role (once its grants went with the schema), if
/// it was made. When this fails, the run stays in the registry and the next run sweeps it.
pub fn drop_sql(run_id: &str) -> String {
    format!(
        "{}; DROP SCHEMA IF EXISTS {} CASCADE; {}",
        crate::labs::leftovers::end_challenge_sessions(run_id),
        schema_of(run_id),
        crate::labs::leftovers::drop_challenge_role(run_id)
    )
}

/// Makes the clients' own role, and grants it what the protocol needs and nothing else: use
/// the run's schema, and create tables of its own there; read the records' five columns and
/// update four of them. Read by column, not the whole table, so that a row's system
/// columns (`xmax`, `ctid`) are refused: the try of a held write, rolled back, leaves its
/// aborted transaction in the row's `xmax`, and a client that reads it would know its write
/// was being held. No right on the log — the trigger writes it as its owner — no superuser,
/// no other role's rights: it cannot end the grader's connection (`pg_terminate_backend`
/// wants the grader's role), nor rewrite the log.
///
/// The role logs in as nobody: each client gets a login of its own ([`client_login`]) that
/// becomes the role as it connects. Postgres shows a session's details — its last
/// statement, when it began, its transaction — only to its own login and to roles that
/// have its privileges, so no client reads another's session: not what lockslab runs in a
/// frozen client's session when it tries its write, nor the state a fault leaves it in.
/// And a client may end only its own sessions.
///
/// Returns the clients' role, and whether what it may create is limited to tables,
/// sequences and indexes (an event trigger, which only a superuser may make). `None` when
/// `db`'s role may not create roles (a Postgres given to lockslab, or `lockslab up`'s
/// role): the clients then share that role with the grader.
pub fn create_client_role(
    db: &mut PgClient,
    schema: &str,
    role: &str,
    url: &str,
) -> Result<Option<ClientRole>> {
    let grader = db.query_one(
        "SELECT rolsuper, rolcreaterole FROM pg_catalog.pg_roles WHERE rolname = current_user",
        &[],
    )?;
    let (superuser, creates_roles): (bool, bool) = (grader.get(0), grader.get(1));
    if !(superuser || creates_roles) {
        return Ok(None);
    }
    db.batch_execute(&format!(
        "CREATE ROLE {role} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION
             NOBYPASSRLS NOINHERIT;
         GRANT USAGE, CREATE ON SCHEMA {schema} TO {role};
         GRANT SELECT (record, value, items, job, fence), UPDATE (value, items, job, fence)
             ON {schema}.records TO {role};"
    ))
    .context("creating the clients' Postgres role")?;
    if superuser {
        db.batch_execute(&clients_make_tables_only(schema, role))
            .context("limiting what the clients' role may create")?;
    }
    let (_, rest) = url
        .split_once("://")
        .context("the Postgres URL has no scheme")?;
    let at = rest.rfind('@').map_or(rest, |i| &rest[i + 1..]);
    Ok(Some(ClientRole {
        role: role.to_string(),
        schema: schema.to_string(),
        at: at.to_string(),
        grader_is_superuser: superuser,
    }))
}

/// The clients' own Postgres role (see [`create_client_role`]).
#[derive(Clone, Debug)]
pub struct ClientRole {
    role: String,
    schema: String,
    /// The server and database of the clients' URLs: `host:port/db`.
    at: String,
    /// The grader that made it is a superuser: then an event trigger refuses the role
    /// anything but tables, sequences and indexes, and the grader sees every session.
    grader_is_superuser: bool,
}

impl ClientRole {
    /// Whether an event trigger refuses the role anything but tables, sequences and
    /// indexes (only a superuser may make one).
    pub fn makes_tables_only(&self) -> bool {
        self.grader_is_superuser
    }
}

/// A login of `client`'s own, with a fresh password, that becomes the clients' role as it
/// connects: its tables are the role's, shared with the other clients. Its `search_path` is
/// set on it: the run's schema, then the catalog, `pg_temp` last. A grader that is no
/// superuser is made a member of it, to see its sessions (client port, last statement) and
/// to end them.
///
/// Where the client's Postgres goes through a fault proxy, the proxy signs in with this
/// password and the client is given one of the proxy's own ([`ClientLogin::url_through`]):
/// only lockslab knows the login's, so no session of it can be opened around the proxy.
pub fn client_login(db: &mut PgClient, clients: &ClientRole, client: &str) -> Result<ClientLogin> {
    let ClientRole {
        role, schema, at, ..
    } = clients;
    let login = format!("{role}_{client}");
    let password = crate::seed::os_hex(32);
    db.batch_execute(&format!(
        "CREATE ROLE {login} LOGIN PASSWORD '{password}' NOSUPERUSER NOCREATEDB NOCREATEROLE
             NOREPLICATION NOBYPASSRLS NOINHERIT IN ROLE {role};
         ALTER ROLE {login} SET search_path = {schema}, pg_catalog, pg_temp;
         ALTER ROLE {login} SET role = '{role}';"
    ))
    .with_context(|| format!("creating {client}'s Postgres login"))?;
    if !clients.grader_is_superuser {
        db.batch_execute(&format!("GRANT {login} TO CURRENT_USER"))
            .context("letting the grader see the clients' sessions")?;
    }
    let verifier = match clients.grader_is_superuser {
        true => Some(password_verifier(db, &login)?),
        false => None,
    };
    Ok(ClientLogin {
        login,
        password,
        at: at.clone(),
        verifier,
    })
}

/// What Postgres keeps of `login`'s password (`pg_authid.rolpassword`, a superuser's to
/// read): a salted SCRAM verifier, which a client that changed its password cannot put back.
pub fn password_verifier(db: &mut PgClient, login: &str) -> Result<Option<String>> {
    let row = db
        .query_one(
            "SELECT rolpassword FROM pg_authid WHERE rolname = $1",
            &[&login],
        )
        .with_context(|| format!("reading {login}'s password verifier"))?;
    Ok(row.get(0))
}

/// A client's own Postgres login ([`client_login`]).
pub struct ClientLogin {
    pub login: String,
    /// Its password on the server.
    pub password: String,
    /// `host:port/database`, as the clients' URLs end.
    at: String,
    /// Its password's verifier as made, when the grader may read it (a superuser).
    pub verifier: Option<Option<String>>,
}

impl ClientLogin {
    /// The URL that signs in with the login's own password, straight to the server.
    pub fn url(&self) -> String {
        self.url_with(&self.password)
    }

    /// The URL for a client whose proxy signs in for it: the password is `given`, which
    /// the proxy checks and the server would refuse.
    pub fn url_with(&self, given: &str) -> String {
        format!("postgres://{}:{given}@{}", self.login, self.at)
    }
}

/// The kinds of object a client may make in the run's schema: tables and sequences of its
/// own (a list of jobs done, a counter), their indexes and who may use them, and nothing
/// that runs SQL of its own accord. A view, a rule or a trigger could write the records under another name,
/// and a function could hide a write inside `SELECT f()`: the proxy must see each write to
/// aim a fault at it, and could not. A function could also carry a side effect (a session
/// advisory lock) through the rollback of a write lockslab tries.
const CLIENTS_MAY_CREATE: &str = "'CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', \
    'CREATE SEQUENCE', 'CREATE INDEX', 'ALTER TABLE', 'ALTER SEQUENCE', 'ALTER INDEX', \
    'DROP TABLE', 'DROP SEQUENCE', 'DROP INDEX', 'GRANT', 'REVOKE', 'COMMENT', \
    'ALTER DEFAULT PRIVILEGES'";

/// What a client could read the tries of held writes off, taken from every role but the
/// grader's — under `pause` and `delay`, on a Postgres lockslab started for the run only,
/// whose database is its own.
/// A try runs in the client's own session and is rolled back: its transaction shows in
/// `pg_locks` while it runs, ends as an aborted xid (`txid_status`, `pg_xact_status`), is
/// counted in `pg_stat_database.xact_rollback`, and shows in the session's `pg_stat_activity`
/// row (its query, its `backend_xid`). A client that turns careful only when it sees one of
/// those behaves well under lockslab and blind in production. (The row's `xmax` is kept
/// from the clients by their column grants, [`create_client_role`].)
pub const HIDE_THE_TRIES: &str = r"
    DO $$
    DECLARE
        hidden record;
    BEGIN
        -- Every statistics function: per-backend activity, transaction and tuple counters
        -- (an update rolled back still counts in n_tup_upd), and what the views below show.
        FOR hidden IN
            SELECT p.oid::regprocedure AS function FROM pg_catalog.pg_proc p
            WHERE p.pronamespace = 'pg_catalog'::regnamespace
              AND (p.proname LIKE 'pg\_stat\_get\_%'
                   -- Functions that run SQL given as text, built where no word shows.
                   OR p.proname LIKE '%\_to\_xml%' OR p.proname = 'ts_stat'
                   OR p.proname IN ('txid_status', 'pg_xact_status', 'pg_lock_status',
                                    'pg_current_snapshot', 'txid_current_snapshot'))
        LOOP
            EXECUTE pg_catalog.format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC',
                                      hidden.function);
        END LOOP;
        FOR hidden IN
            SELECT c.oid::regclass AS view FROM pg_catalog.pg_class c
            WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'v'
              AND (c.relname LIKE 'pg\_stat%' OR c.relname = 'pg_locks')
        LOOP
            EXECUTE pg_catalog.format('REVOKE SELECT ON %s FROM PUBLIC', hidden.view);
        END LOOP;
    END $$;";

/// An event trigger (Postgres runs it before every DDL command of the database) that refuses
/// the clients' role anything but [`CLIENTS_MAY_CREATE`]. Only a superuser may make one;
/// it goes with the schema, as its function does.
fn clients_make_tables_only(schema: &str, role: &str) -> String {
    format!(
        "CREATE FUNCTION {schema}.clients_make_tables_only() RETURNS event_trigger
             LANGUAGE plpgsql SET search_path = pg_catalog AS $$
         BEGIN
             IF pg_catalog.starts_with(session_user, '{role}_')
                AND tg_tag NOT IN ({CLIENTS_MAY_CREATE}) THEN
                 RAISE EXCEPTION 'lockslab challenge: % is not allowed; a client may create \
tables, sequences and indexes in its schema, and writes the records with statements of its \
own that name them, so that lockslab can hold each write', tg_tag;
             END IF;
         END $$;
         CREATE EVENT TRIGGER {schema}_clients_make_tables_only ON ddl_command_start
             EXECUTE FUNCTION {schema}.clients_make_tables_only();"
    )
}

/// Creates the schema, the records (each at 0), the log and its triggers.
pub fn create(db: &mut PgClient, schema: &str, records: &[String]) -> Result<()> {
    let sql = format!(
        "CREATE SCHEMA {schema};
         CREATE TABLE {schema}.records (
             record text PRIMARY KEY,
             value bigint NOT NULL DEFAULT 0,
             items text[] NOT NULL DEFAULT '{{}}',
             job bigint,
             fence bigint);
         CREATE TABLE {schema}.changes (
             seq bigserial PRIMARY KEY,
             record text NOT NULL,
             job bigint,
             old_value bigint NOT NULL,
             new_value bigint NOT NULL,
             old_items text[] NOT NULL,
             new_items text[] NOT NULL,
             fence bigint,
             at timestamptz NOT NULL DEFAULT clock_timestamp());
         CREATE FUNCTION {schema}.log_change() RETURNS trigger LANGUAGE plpgsql
             SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
         BEGIN
             INSERT INTO {schema}.changes
                 (record, job, old_value, new_value, old_items, new_items, fence)
             VALUES (NEW.record, NEW.job, OLD.value, NEW.value, OLD.items, NEW.items,
                 NEW.fence);
             RETURN NEW;
         END $$;
         CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql
             SET search_path = pg_catalog, pg_temp AS $$
         BEGIN
             RAISE EXCEPTION 'lockslab challenge: % on %.% is not allowed (update a record''s value, items and job)',
                 TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME;
         END $$;
         CREATE TRIGGER log_change AFTER UPDATE ON {schema}.records
             FOR EACH ROW
             WHEN (OLD.value IS DISTINCT FROM NEW.value OR OLD.items IS DISTINCT FROM NEW.items
                 OR OLD.job IS DISTINCT FROM NEW.job)
             EXECUTE FUNCTION {schema}.log_change();
         CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON {schema}.changes
             FOR EACH ROW EXECUTE FUNCTION {schema}.refuse();
         CREATE FUNCTION {schema}.sent_by_the_client() RETURNS trigger LANGUAGE plpgsql
             SET search_path = pg_catalog, pg_temp AS $$
         DECLARE
             callers text;
         BEGIN
             -- This function's own line, and one more for each caller: a statement run from
             -- inside a function or a DO block has callers.
             GET DIAGNOSTICS callers = PG_CONTEXT;
             IF position(chr(10) IN callers) > 0 THEN
                 RAISE EXCEPTION 'lockslab challenge: the records are written only by a \
statement the client sends itself, not from inside a function or a DO block: lockslab must \
see each write to hold it';
             END IF;
             RETURN NULL;
         END $$;
         CREATE TRIGGER sent_by_the_client BEFORE UPDATE ON {schema}.records
             FOR EACH STATEMENT EXECUTE FUNCTION {schema}.sent_by_the_client();"
    );
    let mut tx = db.transaction()?;
    tx.batch_execute(&sql)
        .context("creating the challenge's tables")?;
    for record in records {
        tx.execute(
            &format!("INSERT INTO {schema}.records (record) VALUES ($1)"),
            &[record],
        )?;
    }
    tx.batch_execute(&format!(
        "CREATE TRIGGER fixed_records BEFORE INSERT OR DELETE ON {schema}.records
             FOR EACH ROW EXECUTE FUNCTION {schema}.refuse();"
    ))?;
    tx.commit()?;
    Ok(())
}

/// A timestamptz as microseconds since the epoch, in SQL.
fn epoch_us(timestamp: &str) -> String {
    format!("(1000000 * extract(epoch FROM {timestamp}))::bigint")
}

/// The database's clock now, in µs since the epoch: the moment a fault began, on the same
/// clock as the log's changes.
pub fn clock_us(db: &mut PgClient) -> Result<i64> {
    let row = db.query_one(
        &format!("SELECT {}", epoch_us("pg_catalog.clock_timestamp()")),
        &[],
    )?;
    Ok(row.get(0))
}

/// A client's items read back as a plain list of text, whatever it wrote there: a NULL
/// entry (an `append` it never had) shows as `NULL`, and an array of arrays is flattened —
/// the checker then says the items are not what the job meant, where reading them as
/// they are would fail.
fn flat_items(column: &str) -> String {
    format!(
        "ARRAY(SELECT coalesce(entry, 'NULL') FROM pg_catalog.unnest({column}) WITH ORDINALITY \
         AS each(entry, n) ORDER BY n)"
    )
}

/// The log, in the database's order, and each record's final value and items.
pub fn read_back(db: &mut PgClient, schema: &str) -> Result<(Vec<Change>, Finals)> {
    let changes = db
        .query(
            &format!(
                "SELECT seq, record, job, old_value, new_value, {}, fence, {}, {} \
                 FROM {schema}.changes ORDER BY seq",
                epoch_us("at"),
                flat_items("old_items"),
                flat_items("new_items")
            ),
            &[],
        )
        .context("reading the change log back")?
        .iter()
        .map(|row| Change {
            seq: row.get(0),
            record: row.get(1),
            job: row.get(2),
            old_value: row.get(3),
            new_value: row.get(4),
            at_us: Some(row.get(5)),
            fence: row.get(6),
            old_items: row.get(7),
            new_items: row.get(8),
            pid: None,
        })
        .collect();
    let finals = db
        .query(
            &format!(
                "SELECT record, value, {} FROM {schema}.records ORDER BY record",
                flat_items("items")
            ),
            &[],
        )?
        .iter()
        .map(|row| Final {
            record: row.get(0),
            value: row.get(1),
            items: row.get(2),
        })
        .collect();
    Ok((changes, finals))
}

/// Adds to a run's schema the evidence of statements, beside the log of changes: each
/// change's session (backend pid), and every `UPDATE` that reaches the records, rows or
/// none, with its session, its time, how many rows it updated and in how many of them it
/// changed what the log of changes records (value, items, job: a job's effect; a claim's
/// new fence is none) — a statement-level trigger fires on a statement that matched
/// nothing, where a row trigger does not. So a compare-and-set or a fenced write refused
/// after a fault is seen to have run and changed nothing. Written as the owner (`SECURITY
/// DEFINER`, its `search_path` pinned): the clients' role has no right on it. A statement rolled back leaves no trace here.
pub fn create_statement_log(db: &mut PgClient, schema: &str) -> Result<()> {
    db.batch_execute(&format!(
        "ALTER TABLE {schema}.changes
             ADD COLUMN pid integer NOT NULL DEFAULT pg_catalog.pg_backend_pid();
         CREATE TABLE {schema}.statements (
             seq bigserial PRIMARY KEY,
             pid integer NOT NULL,
             rows bigint NOT NULL,
             changed bigint NOT NULL,
             touched bigint NOT NULL,
             at timestamptz NOT NULL DEFAULT pg_catalog.clock_timestamp());
         CREATE FUNCTION {schema}.log_statement() RETURNS trigger LANGUAGE plpgsql
             SECURITY DEFINER SET search_path = pg_catalog AS $$
         BEGIN
             INSERT INTO {schema}.statements (pid, rows, changed, touched)
                 SELECT pg_catalog.pg_backend_pid(), pg_catalog.count(*),
                        pg_catalog.count(*) FILTER (WHERE (o.value, o.items, o.job)
                            IS DISTINCT FROM (n.value, n.items, n.job)),
                        pg_catalog.count(*) FILTER (WHERE o IS DISTINCT FROM n)
                 FROM touched n JOIN untouched o USING (record);
             RETURN NULL;
         END $$;
         CREATE TRIGGER log_statement AFTER UPDATE ON {schema}.records
             REFERENCING OLD TABLE AS untouched NEW TABLE AS touched
             FOR EACH STATEMENT EXECUTE FUNCTION {schema}.log_statement();
         CREATE TRIGGER append_only BEFORE UPDATE OR DELETE ON {schema}.statements
             FOR EACH ROW EXECUTE FUNCTION {schema}.refuse();
         CREATE TABLE {schema}.tries (
             pid integer NOT NULL,
             nonce text NOT NULL,
             mark bigint NOT NULL);
         CREATE FUNCTION {schema}.try_begins(nonce text) RETURNS void LANGUAGE sql
             SECURITY DEFINER SET search_path = pg_catalog AS
             $$ INSERT INTO {schema}.tries
                    SELECT pg_catalog.pg_backend_pid(), nonce, coalesce(max(seq), 0)
                    FROM {schema}.statements $$;
         CREATE FUNCTION {schema}.try_changed(nonce text) RETURNS bigint
             LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS
             $$ SELECT (SELECT coalesce(sum(s.changed), 0)::bigint FROM {schema}.statements s
                        WHERE s.seq > t.mark AND s.pid = t.pid)
                FROM {schema}.tries t
                WHERE t.pid = pg_catalog.pg_backend_pid() AND t.nonce = try_changed.nonce $$;
         CREATE FUNCTION {schema}.try_touched(nonce text) RETURNS bigint
             LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog AS
             $$ SELECT (SELECT coalesce(sum(s.touched), 0)::bigint FROM {schema}.statements s
                        WHERE s.seq > t.mark AND s.pid = t.pid)
                FROM {schema}.tries t
                WHERE t.pid = pg_catalog.pg_backend_pid() AND t.nonce = try_touched.nonce $$;"
    ))
    .context("creating the log of statements")
}

/// How a client's proxy asks, trying a caught write, in how many rows of the records it
/// changed a value, items or job — a job's effect. A row updated to what it was changed
/// nothing; nor did a claim's new fence, nor any write that only guards the one to come: so
/// the fault waits for the write that carries the effect, and a client cannot keep it on a
/// guard of its own sent first (a claim its database clock refuses once late, say) while an
/// unguarded write follows. Counted from the statement log, for the
/// client's own session only (so another client's writes meanwhile are not counted),
/// through the functions above (`try_touched` counts a claim too, for the worst order's
/// hold on a newer holder) — the clients' role may run them and read nothing else
/// of the log. Each try is named by a nonce of the proxy's that the client never sees: the
/// log's end it starts from lives in a table the client cannot write, so the held write
/// cannot move it (a setting could be set from inside the write itself, the hostile
/// tester's `set_config` built by `concat` and run by `query_to_xml`).
pub fn try_probe(schema: &str) -> crate::proxy::Probe {
    crate::proxy::Probe {
        begins: format!("{schema}.try_begins"),
        changed: format!("{schema}.try_changed"),
        touched: format!("{schema}.try_touched"),
    }
}

/// The statement log, and each change's session written into `changes`.
pub fn read_statements(
    db: &mut PgClient,
    schema: &str,
    changes: &mut [Change],
) -> Result<Vec<crate::check::challenge::Statement>> {
    let pids: std::collections::BTreeMap<i64, i32> = db
        .query(&format!("SELECT seq, pid FROM {schema}.changes"), &[])?
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    for change in changes {
        change.pid = pids.get(&change.seq).copied();
    }
    let statements = db
        .query(
            &format!(
                "SELECT pid, {}, rows, changed FROM {schema}.statements ORDER BY seq",
                epoch_us("at")
            ),
            &[],
        )
        .context("reading the statement log back")?
        .iter()
        .map(|row| crate::check::challenge::Statement {
            pid: row.get(0),
            at_us: row.get(1),
            rows: row.get(2),
            changed: Some(row.get(3)),
            aborted: None,
        })
        .collect();
    Ok(statements)
}
