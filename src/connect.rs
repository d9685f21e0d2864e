//! Connections with bounded timeouts, and errors that say what to do.
//!
//! A lock client that waits forever on a frozen server is its own outage, so every
//! connection here has a connect timeout and a read timeout measured in seconds — for
//! Postgres a client-side one as well ([`crate::deadline`]), since a frozen server cannot
//! enforce its own `statement_timeout`. When a backend does not answer, the error names it,
//! shows its URL with the password hidden, and says what to do about it.
//!
//! When a server freezes or dies mid-run, every client of it fails at once — the lab's
//! workers, its watchers, its cleanup — each with a different symptom ("connection closed",
//! "Resource temporarily unavailable"). [`explain`] turns those into the one line that
//! names the cause, and this process remembers which servers stopped answering, so that the
//! cleanup after a failure does not wait on the same frozen server once more.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, mpsc};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

use crate::deadline;

/// How long to wait for a TCP connection and the server's first answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one command may take before the backend is called unresponsive.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a private Postgres's setup statement may take.
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
/// The bound for cleanup after a failure: deleting a run's rows is not worth a long wait.
pub const CLEANUP_TIMEOUT: Duration = Duration::from_millis(1500);

/// Where the URL of a server came from: it decides what an error can advise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `--postgres-url` and friends on the command line.
    Flag,
    /// `LOCKSLAB_POSTGRES_URL` and friends.
    Env,
    /// The servers `lockslab up` left running.
    Up,
    /// The docker-compose.yml defaults.
    Compose,
    /// A server lockslab started for this run.
    Private,
}

/// What this process knows about the servers it uses.
struct Known {
    /// Where each URL came from (noted by [`crate::servers`] as it picks them).
    sources: Vec<(String, Source)>,
    /// Every URL this process connected to, by backend: errors that carry no URL get one.
    used: Vec<(Backend, String)>,
    /// Redacted URLs of servers that stopped answering (or went away) during this run.
    gone: Vec<String>,
    /// The first such failure, as the line to show: what every later error echoes.
    first: Option<String>,
}

static KNOWN: Mutex<Known> = Mutex::new(Known {
    sources: Vec::new(),
    used: Vec::new(),
    gone: Vec::new(),
    first: None,
});

fn known<T>(f: impl FnOnce(&mut Known) -> T) -> T {
    f(&mut KNOWN.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Notes where `url` came from, so that errors about it give advice that fits.
pub fn note_source(url: &str, source: Source) {
    known(|k| k.sources.push((url.to_string(), source)));
}

fn source_of(url: &str) -> Option<Source> {
    known(|k| {
        k.sources
            .iter()
            .rev()
            .find(|(u, _)| u == url)
            .map(|(_, s)| *s)
    })
}

fn note_used(backend: Backend, url: &str) {
    known(|k| {
        if !k.used.iter().any(|(b, u)| *b == backend && u == url) {
            k.used.push((backend, url.to_string()));
        }
    });
}

fn used_url(backend: Backend) -> Option<String> {
    known(|k| {
        k.used
            .iter()
            .rev()
            .find(|(b, _)| *b == backend)
            .map(|(_, u)| u.clone())
    })
}

/// Remembers that the server at `url` failed mid-run, with the line that says so.
fn note_gone(url: &str, line: &str) {
    known(|k| {
        k.gone.push(redact(url));
        k.first.get_or_insert_with(|| line.to_string());
    });
}

/// True when a server at this URL stopped answering earlier in this process (or a worker
/// reported so): cleanup skips it rather than wait for it again.
pub fn gave_up_on(url: &str) -> bool {
    let url = redact(url);
    known(|k| k.gone.contains(&url))
}

/// Whether a line says a server did not answer at all (frozen, or the network ate it) — not
/// one that closed the connection, which a server does on purpose (an idle-session timeout).
pub fn names_a_silent_server(line: &str) -> bool {
    [Backend::Redis, Backend::Etcd, Backend::Postgres]
        .iter()
        .any(|backend| {
            line.find(&format!("{} at ", backend.name()))
                .is_some_and(|start| line[start..].contains(" did not answer"))
        })
}

/// A worker's error line, as the orchestrator received it: if it says that a server did not
/// answer or went away, the orchestrator gives up on that server too, and gets that part of
/// the line back (without the step the worker was on: the server is the cause).
pub fn note_reported(line: &str) -> Option<String> {
    for backend in [Backend::Redis, Backend::Etcd, Backend::Postgres] {
        let Some(start) = line.find(&format!("{} at ", backend.name())) else {
            continue;
        };
        let failure = &line[start..];
        let rest = &failure[backend.name().len() + 4..];
        if let Some((url, _)) = rest
            .split_once(" did not answer")
            .or_else(|| rest.split_once(" closed the connection"))
        {
            known(|k| {
                k.gone.push(url.to_string());
                k.first.get_or_insert_with(|| failure.to_string());
            });
            return Some(failure.to_string());
        }
    }
    None
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Redis,
    Etcd,
    Postgres,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Redis => "Redis",
            Backend::Etcd => "etcd",
            Backend::Postgres => "Postgres",
        }
    }

    pub fn flag(self) -> &'static str {
        match self {
            Backend::Redis => "--redis-url",
            Backend::Etcd => "--etcd-url",
            Backend::Postgres => "--postgres-url",
        }
    }

    pub fn env_var(self) -> &'static str {
        match self {
            Backend::Redis => "LOCKSLAB_REDIS_URL",
            Backend::Etcd => "LOCKSLAB_ETCD_URL",
            Backend::Postgres => "LOCKSLAB_POSTGRES_URL",
        }
    }

    pub fn compose_service(self) -> &'static str {
        match self {
            Backend::Redis => "redis",
            Backend::Etcd => "etcd",
            Backend::Postgres => "postgres",
        }
    }

    /// The one-line error for a backend that did not answer when first asked. Where the
    /// URL came from decides the advice; a worker (which was handed the URL mid-run) gives
    /// none: the server answered the lab a moment ago, so it froze or died since.
    pub fn unreachable(self, url: &str, cause: impl std::fmt::Display) -> anyhow::Error {
        let mut cause = cause.to_string();
        // gRPC's and the drivers' words for a server that took the bytes and said nothing.
        if cause.contains("Timeout expired") || cause.contains("timed out") {
            cause = "no answer within the client's timeout: frozen or overloaded?".into();
        }
        let line = format!(
            "{} at {} did not answer ({cause})",
            self.name(),
            redact(url)
        );
        let advice = match source_of(url) {
            Some(Source::Flag) => format!(
                "start one with `lockslab up` or `docker compose up -d {}`, or leave out {} \
                 to let lockslab start a private one",
                self.compose_service(),
                self.flag()
            ),
            Some(Source::Env) => format!(
                "start one with `lockslab up` or `docker compose up -d {}`, or unset {} \
                 to let lockslab start a private one",
                self.compose_service(),
                self.env_var()
            ),
            Some(Source::Up) => {
                "`lockslab status` shows what `lockslab up` left running; `lockslab down` then \
                 `lockslab up` starts afresh"
                    .to_string()
            }
            Some(Source::Compose) => format!(
                "`docker compose up -d {}` starts it again",
                self.compose_service()
            ),
            Some(Source::Private) => {
                "lockslab started it for this run: did something stop it?".to_string()
            }
            None => {
                note_gone(url, &line);
                return anyhow!(line);
            }
        };
        anyhow!("{line}; {advice}")
    }

    /// The line for a server that stopped answering mid-run (frozen, or swamped).
    pub fn frozen(self, url: &str, within: Duration) -> String {
        format!(
            "{} at {} did not answer within {}s (frozen or overloaded?)",
            self.name(),
            redact(url),
            within.as_secs_f64()
        )
    }

    /// The line for a server that dropped the connection mid-run (killed, restarted).
    pub fn lost(self, url: &str, cause: impl std::fmt::Display) -> String {
        let cause = cause.to_string();
        // Postgres ends an idle session on purpose when a timeout says so (lab 4's
        // --pg-timeout, lab 3's --idle-timeout): the server is fine, the session is over.
        let hint = if cause.contains("idle-session timeout")
            || cause.contains("idle-in-transaction timeout")
        {
            "; the server ended the session on purpose, as its timeout says"
        } else if cause.contains("statement timeout") {
            "; a statement ran longer than its statement_timeout"
        } else {
            match source_of(url) {
                Some(Source::Private) => "; lockslab started it for this run: was it killed?",
                _ => "; did it stop or restart?",
            }
        };
        let cause = if cause.is_empty() || cause == "connection closed" {
            String::new()
        } else {
            format!(" ({cause})")
        };
        format!(
            "{} at {} closed the connection{cause}{hint}",
            self.name(),
            redact(url)
        )
    }
}

/// The URL (or Postgres key=value string) with every password replaced by `***`: the one
/// form in which a server's address may appear in an error, a log line or a verdict.
///
/// Passwords are hidden in three places: the userinfo (`user:PW@host`), query parameters
/// (`?password=PW`) and libpq's key=value strings (`host=h password=PW`). A password may hold
/// `/`, `:` or `@` unencoded, so the userinfo is taken to end at the *last* `@`: when a path
/// or query holds an `@` too, this hides more than needed, never less. Text that does not
/// parse as a URL at all (`postgresql:/u:PW@h`) is treated the same way: everything from the
/// first `:` to the last `@` is hidden.
pub fn redact(url: &str) -> String {
    hide_password_parameters(&hide_userinfo_password(url))
}

/// `scheme://user:PW@rest` → `scheme://user:***@rest`.
fn hide_userinfo_password(url: &str) -> String {
    let (scheme, rest) = match url.find("://") {
        Some(end) => url.split_at(end + 3),
        None => ("", url),
    };
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!("{scheme}{}:***{}", &userinfo[..colon], &rest[at..]),
        None => url.to_string(),
    }
}

/// `…password=PW&…` or `… password = 'P W' …` → `password=***`, whatever the case of the key.
fn hide_password_parameters(text: &str) -> String {
    const KEY: &str = "password";
    let lower = text.to_ascii_lowercase();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut search = 0;
    while let Some(found) = lower[search..].find(KEY) {
        let key_end = search + found + KEY.len();
        search = key_end;
        let after_key = text[key_end..].trim_start();
        let Some(value) = after_key.strip_prefix('=') else {
            continue;
        };
        let value = value.trim_start();
        let value_start = text.len() - value.len();
        let value_len = if let Some(quoted) = value.strip_prefix('\'') {
            // libpq quotes a value holding spaces; \' and \\ are escapes inside it.
            let mut chars = quoted.char_indices();
            let mut len = value.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '\'' => {
                        len = i + 2;
                        break;
                    }
                    _ => {}
                }
            }
            len
        } else {
            value
                .find(|c: char| c == '&' || c == '#' || c.is_whitespace())
                .unwrap_or(value.len())
        };
        out.push_str(&text[copied..value_start]);
        out.push_str("***");
        copied = value_start + value_len;
        search = copied;
    }
    out.push_str(&text[copied..]);
    out
}

/// What is wrong with a URL's shape, if anything: checked before anything connects, so
/// that a typo is a bad command line (exit status 2), not a server that "did not answer".
///
/// The scheme must fit the backend, and every host must be named, with a port from 1 to
/// 65535 if one is given. The problem quotes no part of the URL (a misparsed password could
/// be that part): the caller shows the whole URL, redacted.
pub fn url_problem(backend: Backend, url: &str) -> Option<String> {
    let schemes: &[&str] = match backend {
        Backend::Redis => &["redis://"],
        Backend::Etcd => &["http://", "https://"],
        Backend::Postgres => &["postgres://", "postgresql://"],
    };
    let Some(rest) = schemes.iter().find_map(|scheme| url.strip_prefix(scheme)) else {
        return Some(format!(
            "expected a {} URL starting with {}",
            backend.name(),
            schemes.join(" or ")
        ));
    };
    // The clients end the userinfo at its first '@', while `redact` (to hide all of a
    // password) ends it at the last: a raw '@' in a password would send the client to
    // another host than the one shown. Say how to write it instead.
    let userinfo_end = rest[..rest.find(['?', '#']).unwrap_or(rest.len())].rfind('@');
    if let Some(end) = userinfo_end
        && rest[..end].contains('@')
    {
        return Some("the user or password holds a raw '@': write it as %40".into());
    }
    // As in `redact`: the userinfo ends at the last '@', whatever its password holds.
    let after_userinfo = rest.rfind('@').map_or(rest, |at| &rest[at + 1..]);
    let hosts = &after_userinfo[..after_userinfo
        .find(['/', '?', '#'])
        .unwrap_or(after_userinfo.len())];
    // Only Postgres URLs may list several hosts (`h1:5432,h2:5433`).
    let hosts: Vec<&str> = match backend {
        Backend::Postgres => hosts.split(',').collect(),
        _ => vec![hosts],
    };
    for host_port in hosts {
        let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
            // An IPv6 address: [::1]:6379
            let Some((host, after)) = bracketed.split_once(']') else {
                return Some("an IPv6 host has no closing ']'".into());
            };
            match after {
                "" => (host, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (host, Some(port)),
                    None => {
                        return Some(
                            "an IPv6 host is followed by something other than :port".into(),
                        );
                    }
                },
            }
        } else {
            match host_port.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (host_port, None),
            }
        };
        if host.is_empty() {
            return Some("the URL names no host".into());
        }
        if let Some(port) = port
            && !matches!(port.parse::<u16>(), Ok(p) if p > 0)
        {
            return Some("its port is not a number from 1 to 65535".into());
        }
    }
    None
}

/// A Redis connection: it derefs to the `redis::Connection` it wraps (and so works
/// wherever one does), and a [`deadline::Guard`] watches its socket.
pub struct RedisConn {
    connection: redis::Connection,
    guard: Option<deadline::Guard>,
}

impl Deref for RedisConn {
    type Target = redis::Connection;
    fn deref(&self) -> &redis::Connection {
        &self.connection
    }
}

impl DerefMut for RedisConn {
    fn deref_mut(&mut self) -> &mut redis::Connection {
        &mut self.connection
    }
}

impl RedisConn {
    /// True once the guard gave up on the server (its errors mean "frozen", whatever they say).
    pub fn gave_up(&self) -> bool {
        self.guard.as_ref().is_some_and(deadline::Guard::fired)
    }
}

/// A Redis connection whose every command gives up after [`COMMAND_TIMEOUT`].
///
/// redis-rs's read timeout applies to each reply, so a pipeline or a MULTI block to a
/// frozen server would wait once per reply; the guard bounds the whole call, and the read
/// timeout (a little longer) is only the fallback where there is no guard.
pub fn redis(url: &str) -> Result<RedisConn> {
    let client = redis::Client::open(url)
        .map_err(|err| anyhow!("{} {}: {err}", Backend::Redis.flag(), redact(url)))?;
    note_used(Backend::Redis, url);
    if gave_up_on(url) {
        return Err(anyhow!(Backend::Redis.frozen(url, COMMAND_TIMEOUT)));
    }
    let mut connection = client
        .get_connection_with_timeout(CONNECT_TIMEOUT)
        .map_err(|err| Backend::Redis.unreachable(url, redis_cause(&err)))?;
    // The first answer is part of connecting: a frozen server accepts and then says nothing.
    connection
        .set_read_timeout(Some(CONNECT_TIMEOUT))
        .context("setting the Redis read timeout")?;
    connection
        .set_write_timeout(Some(COMMAND_TIMEOUT))
        .context("setting the Redis write timeout")?;
    redis::cmd("PING")
        .query::<String>(&mut connection)
        .map_err(|err| Backend::Redis.unreachable(url, redis_cause(&err)))?;
    connection
        .set_read_timeout(Some(COMMAND_TIMEOUT + Duration::from_secs(1)))
        .context("setting the Redis read timeout")?;
    // `addr=127.0.0.1:50312`: our own address, as the server sees it (Redis 6.2+).
    let port = redis::cmd("CLIENT")
        .arg("INFO")
        .query::<String>(&mut connection)
        .ok()
        .and_then(|info| {
            let addr = info
                .split(' ')
                .find_map(|field| field.strip_prefix("addr="))?;
            addr.rsplit(':').next()?.parse::<u16>().ok()
        });
    let guard = port.and_then(|port| {
        let line = Backend::Redis.frozen(url, COMMAND_TIMEOUT);
        let url = url.to_string();
        deadline::Guard::watch(port, deadline::Probe::REDIS, COMMAND_TIMEOUT, move || {
            note_gone(&url, &line)
        })
    });
    Ok(RedisConn { connection, guard })
}

/// Says "timed out" plainly for a server that accepts connections and never answers.
///
/// redis-rs reports a socket read timeout as the raw `EAGAIN` ("Resource temporarily
/// unavailable"), which `is_timeout` counts as a timeout.
pub fn redis_cause(err: &redis::RedisError) -> String {
    if err.is_timeout() {
        "it accepted the connection but gave no answer in time: frozen or overloaded?".into()
    } else {
        err.to_string()
    }
}

/// A Postgres client whose calls cannot hang on a frozen server: it derefs to the
/// `postgres::Client` it wraps, and a [`deadline::Guard`] watches its socket.
pub struct PgClient {
    /// Declared first, so dropped first: dropping a `postgres::Client` says goodbye to the
    /// server and waits for it, and the guard bounds that wait too.
    client: postgres::Client,
    guard: Option<deadline::Guard>,
    url: String,
}

impl Drop for PgClient {
    fn drop(&mut self) {
        // A goodbye is not worth a long wait, and none at all to a server that is gone.
        match &self.guard {
            Some(guard) if gave_up_on(&self.url) => guard.abandon(),
            _ => self.bound(CLEANUP_TIMEOUT),
        }
    }
}

impl PgClient {
    /// Shortens the client-side bound from now on: for cleanup after a failure.
    pub fn bound(&self, bound: Duration) {
        if let Some(guard) = &self.guard {
            guard.set_bound(bound);
        }
    }
}

impl Deref for PgClient {
    type Target = postgres::Client;
    fn deref(&self) -> &postgres::Client {
        &self.client
    }
}

impl DerefMut for PgClient {
    fn deref_mut(&mut self) -> &mut postgres::Client {
        &mut self.client
    }
}

/// A Postgres client, connected within [`CONNECT_TIMEOUT`], each call bounded by
/// [`COMMAND_TIMEOUT`] on both sides: `statement_timeout` in the server for a slow
/// statement, and a [`deadline::Guard`] in this process for a server that does not run.
pub fn postgres(url: &str) -> Result<PgClient> {
    postgres_within(url, COMMAND_TIMEOUT)
}

/// A Postgres client for a private server's one-off setup (`CREATE DATABASE` copies a
/// template: seconds on a loaded machine, where a lab's statements take milliseconds).
pub fn postgres_for_setup(url: &str) -> Result<PgClient> {
    postgres_within(url, SETUP_TIMEOUT)
}

/// A Postgres client for cleanup: a short bound, and none at all if this server already
/// stopped answering during this run.
pub fn postgres_for_cleanup(url: &str) -> Result<PgClient> {
    if gave_up_on(url) {
        return Err(anyhow!(Backend::Postgres.frozen(url, COMMAND_TIMEOUT)));
    }
    postgres_within(url, CLEANUP_TIMEOUT)
}

/// The postgres crate bounds only the TCP connect; a frozen server accepts the connection
/// and then never answers the handshake. So the whole connect runs on a helper thread and
/// we stop waiting for it after the timeout. It ends by asking the server which port we
/// connect from (`inet_client_port()`): that is how the guard finds our socket among the
/// process's file descriptors, whatever other threads connect at the same time.
fn postgres_within(url: &str, bound: Duration) -> Result<PgClient> {
    let mut config: postgres::Config = url
        .parse()
        .map_err(|err| anyhow!("{} {}: {err}", Backend::Postgres.flag(), redact(url)))?;
    note_used(Backend::Postgres, url);
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .options(&format!(
            "-c statement_timeout={}",
            bound.max(COMMAND_TIMEOUT).as_millis()
        ))
        .application_name("lockslab");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let connected = config.connect(postgres::NoTls).and_then(|mut client| {
            // A fresh session has prepared one statement: this one. More, and it is not
            // fresh: a pooler handed us a server session another client used.
            let row = client.query_one(
                "SELECT pg_catalog.inet_client_port(), (SELECT pg_catalog.count(*) \
                 FROM pg_catalog.pg_prepared_statements WHERE NOT from_sql)",
                &[],
            )?;
            let (port, prepared): (Option<i32>, i64) = (row.get(0), row.get(1));
            Ok((client, port, prepared))
        });
        let _ = tx.send(connected);
    });
    match rx.recv_timeout(CONNECT_TIMEOUT + Duration::from_millis(500)) {
        Ok(Ok((_, _, prepared))) if prepared > 1 => Err(anyhow!(transaction_pooler(
            url,
            "the server session it was handed held another client's prepared statements"
        ))),
        Ok(Err(err)) if is_pooled_statement_clash(&err) => {
            Err(anyhow!(transaction_pooler(url, &pg_cause(&err))))
        }
        Ok(Ok((client, port, _))) => {
            let guard = port
                .and_then(|port| u16::try_from(port).ok())
                .and_then(|port| {
                    let line = Backend::Postgres.frozen(url, bound);
                    let url = url.to_string();
                    deadline::Guard::watch(port, deadline::Probe::POSTGRES, bound, move || {
                        note_gone(&url, &line)
                    })
                });
            Ok(PgClient {
                client,
                guard,
                url: url.to_string(),
            })
        }
        Ok(Err(err)) => Err(Backend::Postgres.unreachable(url, pg_cause(&err))),
        Err(_) => Err(Backend::Postgres.unreachable(
            url,
            format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
        )),
    }
}

/// Whether `err` is what a pooler in transaction mode (pgbouncer's `pool_mode =
/// transaction`) does to a client's prepared statements: its transactions run on whichever
/// server session is free, so a statement prepared on one is missing on the next
/// (`prepared statement "s1" does not exist`), or one another client left there clashes
/// with its own (`prepared statement "s0" already exists`).
pub fn is_pooled_statement_clash(err: &postgres::Error) -> bool {
    use postgres::error::SqlState;
    err.as_db_error().is_some_and(|db| {
        (db.code() == &SqlState::DUPLICATE_PSTATEMENT
            || db.code() == &SqlState::INVALID_SQL_STATEMENT_NAME)
            && db.message().contains("prepared statement")
    })
}

/// The one line for a Postgres behind a pooler in transaction mode: not a server that "did
/// not answer", and nothing a lab can run on — its prepared statements and its session
/// advisory locks (lab 7, chaos's `advisory-session`) need a server session of their own
/// for as long as the connection lasts; in transaction mode they would part from it
/// between two transactions, and a verdict drawn from such a run would be about the pooler.
pub fn transaction_pooler(url: &str, sign: &str) -> String {
    format!(
        "Postgres at {} is behind a pooler in transaction mode ({sign}): lockslab needs a \
         session per connection (prepared statements, session advisory locks); give it the \
         Postgres itself, or a pool in session mode (pgbouncer's pool_mode = session)",
        redact(url)
    )
}

/// The most telling part of a Postgres error (the server's message, or the I/O cause).
pub fn pg_cause(err: &postgres::Error) -> String {
    if let Some(db) = err.as_db_error() {
        return db.message().to_string();
    }
    match std::error::Error::source(err) {
        Some(source) => source.to_string(),
        None => err.to_string(),
    }
}

/// What a Postgres error says, as one line: the server-failure line when the server froze
/// or went away, else the server's own message (or the I/O cause).
pub fn pg_failure(err: &postgres::Error) -> String {
    server_failure(err).unwrap_or_else(|| pg_cause(err))
}

/// The line for a Redis error that says its server froze or went away (and notes that
/// server as given up on); None for an answer from a working server.
pub fn redis_failure(url: &str, err: &redis::RedisError) -> Option<String> {
    let line = if err.is_timeout() || gave_up_on(url) {
        Backend::Redis.frozen(url, COMMAND_TIMEOUT)
    } else if err.is_connection_dropped() || err.is_io_error() {
        Backend::Redis.lost(url, redis_cause(err))
    } else {
        return None;
    };
    note_gone(url, &line);
    Some(line)
}

/// Turns a failure caused by a server that froze or went away into the one line that says
/// so. Every lab passes its errors (and every worker its own) through here.
///
/// The first such failure this process saw wins: after it, the other clients of the same
/// server fail too, each with its own symptom, and those are echoes, not causes. Errors
/// that are not about a server (a usage error, a server's own refusal) pass unchanged.
pub fn explain(err: anyhow::Error) -> anyhow::Error {
    let Some(line) = err.chain().find_map(server_failure) else {
        return err;
    };
    let first = known(|k| k.first.get_or_insert(line).clone());
    anyhow!(first)
}

/// The line for one error from a client library, if it says that its server froze or went
/// away (and notes that server as given up on).
fn server_failure(cause: &(dyn std::error::Error + 'static)) -> Option<String> {
    if let Some(err) = cause.downcast_ref::<postgres::Error>() {
        let url = used_url(Backend::Postgres)?;
        if gave_up_on(&url) {
            return Some(Backend::Postgres.frozen(&url, COMMAND_TIMEOUT));
        }
        if is_pooled_statement_clash(err) {
            return Some(transaction_pooler(&url, &pg_cause(err)));
        }
        // Class 08 is "connection exception", class 57 "operator intervention" (the server
        // shutting down, or its backend killed) — except 57014, a statement cancelled by its
        // own statement_timeout: the server answered that. Other errors are the lab's business.
        let gone = match err.code() {
            Some(code) => {
                let code = code.code();
                code.starts_with("08") || (code.starts_with("57") && code != "57014")
            }
            None => {
                err.is_closed()
                    || std::error::Error::source(err)
                        .is_some_and(|source| source.is::<std::io::Error>())
            }
        };
        return gone.then(|| {
            let line = Backend::Postgres.lost(&url, pg_cause(err));
            note_gone(&url, &line);
            line
        });
    }
    if let Some(err) = cause.downcast_ref::<redis::RedisError>() {
        return redis_failure(&used_url(Backend::Redis)?, err);
    }
    if let Some(err) = cause.downcast_ref::<etcd_client::Error>() {
        let url = used_url(Backend::Etcd)?;
        let text = err.to_string();
        let line = if text.contains("Timeout expired")
            || text.contains("DeadlineExceeded")
            || text.contains("deadline has elapsed")
        {
            Backend::Etcd.frozen(&url, COMMAND_TIMEOUT)
        } else if matches!(
            err,
            etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_)
        ) || text.to_lowercase().contains("unavailable")
            || text.contains("transport error")
            || text.contains("tcp connect error")
            // A call in flight when the server died: gRPC says "cancelled", hyper says why.
            || text.contains("connection closed")
        {
            Backend::Etcd.lost(&url, etcd_cause(err))
        } else {
            return None;
        };
        note_gone(&url, &line);
        return Some(line);
    }
    None
}

/// An etcd error without the gRPC wrapping, when there is a plainer message inside.
fn etcd_cause(err: &etcd_client::Error) -> String {
    match err {
        etcd_client::Error::GRpcStatus(status) if !status.message().is_empty() => {
            status.message().to_string()
        }
        other => other.to_string(),
    }
}

/// An etcd client with connect and request timeouts, on the caller's runtime.
///
/// A URL with a user (`http://root:PASSWORD@host:2379`, what `lockslab up --room` prints)
/// authenticates as that user: etcd URLs carry no credentials of their own, so lockslab
/// takes them out of the URL and hands them to the client. An `https://` URL (a room seat's
/// etcd) also wants a client certificate: see [`crate::etcd_tls::for_endpoint`].
pub async fn etcd(url: &str) -> Result<etcd_client::Client> {
    note_used(Backend::Etcd, url);
    let mut client = etcd_within(url, COMMAND_TIMEOUT).await?;
    client
        .status()
        .await
        .map_err(|err| Backend::Etcd.unreachable(url, err))?;
    Ok(client)
}

/// An etcd client whose requests may take up to `timeout`, logged in as the URL's user if it
/// names one (a room's etcd has auth on).
pub async fn etcd_within(url: &str, timeout: Duration) -> Result<etcd_client::Client> {
    let (endpoint, user) = etcd_credentials(url);
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(timeout);
    if let Some((name, password)) = user {
        options = options.with_user(name, password);
    }
    if let Some(host_port) = endpoint.strip_prefix("https://") {
        let bundle = crate::etcd_tls::for_endpoint(host_port)?;
        options = options.with_tls(bundle.client_options());
    }
    etcd_client::Client::connect([endpoint.as_str()], Some(options))
        .await
        .map_err(|err| Backend::Etcd.unreachable(url, err))
}

/// An etcd client with no user, over the Unix socket at `socket`: for an etcd lockslab has
/// just started where only this user reaches it, to give it its users before it listens
/// anywhere else (see `servers::PrivateServers::bootstrap_etcds`).
pub async fn etcd_on_socket(socket: &std::path::Path) -> Result<etcd_client::Client> {
    let mut client = etcd_on_socket_within(socket, COMMAND_TIMEOUT).await?;
    client
        .status()
        .await
        .map_err(|err| Backend::Etcd.unreachable(&format!("unix://{}", socket.display()), err))?;
    Ok(client)
}

/// An etcd client with no user over the Unix socket at `socket`, its requests bounded by
/// `timeout`, not checked with a first request: for a member that may be cut off from its
/// cluster, where a request that needs the leader is expected to time out.
pub async fn etcd_on_socket_within(
    socket: &std::path::Path,
    timeout: Duration,
) -> Result<etcd_client::Client> {
    let url = format!("unix://{}", socket.display());
    let channel = tonic::transport::Endpoint::from_shared(url.clone())
        .map_err(|err| Backend::Etcd.unreachable(&url, err))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(timeout)
        .connect()
        .await
        .map_err(|err| Backend::Etcd.unreachable(&url, err))?;
    Ok(etcd_client::Client::from_channel(etcd_client::Channel::Tonic(channel), None).await?)
}

/// The encoded bundle for an `https://` etcd URL, when this process has one.
pub fn etcd_tls_line(url: &str) -> Option<String> {
    let (endpoint, _) = etcd_credentials(url);
    let host_port = endpoint.strip_prefix("https://")?;
    crate::etcd_tls::for_endpoint(host_port)
        .ok()
        .map(|bundle| bundle.encode())
}

/// Splits `http://user:password@host:port` (or `https://…`) into the endpoint and the
/// user's credentials (percent-escapes decoded); a URL without a user comes back as it is.
pub fn etcd_credentials(url: &str) -> (String, Option<(String, String)>) {
    let Some((scheme, rest)) = ["http://", "https://"]
        .iter()
        .find_map(|scheme| Some((*scheme, url.strip_prefix(scheme)?)))
    else {
        return (url.to_string(), None);
    };
    let Some(at) = rest.rfind('@') else {
        return (url.to_string(), None);
    };
    let (name, password) = rest[..at].split_once(':').unwrap_or((&rest[..at], ""));
    (
        format!("{scheme}{}", &rest[at + 1..]),
        Some((percent_decode(name), percent_decode(password))),
    )
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A small single-threaded runtime for the etcd client, which is async-only.
pub fn etcd_runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the etcd client runtime")
}

/// Probes a backend once: Ok when it answers.
pub fn probe(backend: Backend, url: &str) -> Result<()> {
    match backend {
        Backend::Redis => redis(url).map(drop),
        Backend::Postgres => postgres(url).map(drop),
        Backend::Etcd => etcd_runtime()?.block_on(etcd(url)).map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_urls_carry_their_user_to_the_client() {
        assert_eq!(
            etcd_credentials("http://root:p%40ss@10.0.0.5:2379"),
            (
                "http://10.0.0.5:2379".to_string(),
                Some(("root".to_string(), "p@ss".to_string()))
            )
        );
        assert_eq!(
            etcd_credentials("https://seat01:pw@10.0.0.5:2379").0,
            "https://10.0.0.5:2379"
        );
        assert_eq!(
            etcd_credentials("http://127.0.0.1:2379"),
            ("http://127.0.0.1:2379".to_string(), None)
        );
    }

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("postgres://lab:secret@127.0.0.1:5432/db"),
            "postgres://lab:***@127.0.0.1:5432/db"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("postgres://lab@host/db"), "postgres://lab@host/db");
        assert_eq!(redact("http://:PW@h:2379"), "http://:***@h:2379");
    }

    #[test]
    fn redact_hides_passwords_holding_url_delimiters() {
        for (url, shown) in [
            (
                "postgres://u:S3cret/PW@h:5432/db",
                "postgres://u:***@h:5432/db",
            ),
            ("postgres://u:a:b@c@h/db", "postgres://u:***@h/db"),
            ("redis://u:p?w@h:6379", "redis://u:***@h:6379"),
        ] {
            assert_eq!(redact(url), shown);
        }
    }

    #[test]
    fn redact_hides_password_parameters_and_conninfo() {
        assert_eq!(
            redact("postgres://u@h/db?sslmode=disable&password=PW&x=1"),
            "postgres://u@h/db?sslmode=disable&password=***&x=1"
        );
        assert_eq!(
            redact("host=h Password = PW user=u"),
            "host=h Password = *** user=u"
        );
        assert_eq!(
            redact("host=h password='P W\\'x' user=u"),
            "host=h password=*** user=u"
        );
    }

    #[test]
    fn redact_hides_userinfo_of_what_is_not_a_url() {
        for text in ["postgresql:/u:PW@h/db", "u:PW@h", "mysql://u:PW@h/db"] {
            let shown = redact(text);
            assert!(!shown.contains("PW"), "{text} → {shown}");
            assert!(shown.ends_with("@h/db") || shown.ends_with("@h"), "{shown}");
        }
    }

    #[test]
    fn url_problem_says_what_is_expected() {
        let problem = url_problem(Backend::Redis, "http://x").unwrap();
        assert!(problem.contains("redis://"), "{problem}");
        assert!(url_problem(Backend::Postgres, "postgresql://u@h/db").is_none());
        assert!(url_problem(Backend::Etcd, "http:///x").is_some());
    }

    #[test]
    fn url_problem_checks_ports() {
        for (backend, url) in [
            (Backend::Redis, "redis://127.0.0.1:notaport"),
            (Backend::Redis, "redis://127.0.0.1:99999"),
            (Backend::Redis, "redis://127.0.0.1:0"),
            (Backend::Etcd, "http://127.0.0.1:notaport"),
            (Backend::Postgres, "postgres://u:pw@127.0.0.1:notaport/db"),
            (Backend::Postgres, "postgres://u@h1:5432,h2:x/db"),
            (Backend::Redis, "redis://:pw@:6379"),
        ] {
            assert!(url_problem(backend, url).is_some(), "{url} passed");
        }
        for (backend, url) in [
            (Backend::Redis, "redis://127.0.0.1:6379/0"),
            (Backend::Redis, "redis://[::1]:6379"),
            (Backend::Etcd, "http://localhost:2379"),
            (Backend::Etcd, "http://localhost"),
            (
                Backend::Postgres,
                "postgres://u:S3cret/PW@127.0.0.1:5432/db",
            ),
            (
                Backend::Postgres,
                "postgres://u@h1:5432,h2:5433/db?sslmode=disable",
            ),
        ] {
            assert_eq!(url_problem(backend, url), None, "{url}");
        }
    }
}
