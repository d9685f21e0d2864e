//! Connections with bounded timeouts, and errors that say what to do.
//!
//! A lock client that waits forever on a frozen server is its own outage, so every
//! connection here has a connect timeout and a read timeout measured in seconds. When a
//! backend does not answer, the error names it, shows its URL with the password hidden,
//! and says how to get one running.

use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};

/// How long to wait for a TCP connection and the server's first answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one command may take before the backend is called unresponsive.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(5);

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

    /// The one-line error for a backend that did not answer.
    pub fn unreachable(self, url: &str, cause: impl std::fmt::Display) -> anyhow::Error {
        anyhow!(
            "{} at {} did not answer ({cause}); start one with `lockslab up` or `docker compose up -d {}`, \
             or leave out {} to let lockslab start a private one",
            self.name(),
            redact(url),
            self.compose_service(),
            self.flag()
        )
    }
}

/// The URL with any password replaced by `***`.
pub fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!(
            "{}://{}:***{}",
            &url[..scheme_end],
            &userinfo[..colon],
            &rest[at..]
        ),
        None => url.to_string(),
    }
}

/// What is wrong with a URL's shape, if anything: checked before anything connects.
pub fn url_problem(backend: Backend, url: &str) -> Option<String> {
    let schemes: &[&str] = match backend {
        Backend::Redis => &["redis://"],
        Backend::Etcd => &["http://"],
        Backend::Postgres => &["postgres://", "postgresql://"],
    };
    if !schemes.iter().any(|scheme| url.starts_with(scheme)) {
        return Some(format!(
            "expected a {} URL starting with {}",
            backend.name(),
            schemes.join(" or ")
        ));
    }
    let host = url.split("://").nth(1).unwrap_or("");
    if host.is_empty() || host.starts_with('/') {
        return Some("the URL names no host".into());
    }
    None
}

/// A Redis connection whose every command gives up after [`COMMAND_TIMEOUT`].
pub fn redis(url: &str) -> Result<redis::Connection> {
    let client = redis::Client::open(url)
        .map_err(|err| anyhow!("{} {}: {err}", Backend::Redis.flag(), redact(url)))?;
    let mut connection = client
        .get_connection_with_timeout(CONNECT_TIMEOUT)
        .map_err(|err| Backend::Redis.unreachable(url, redis_cause(&err)))?;
    connection
        .set_read_timeout(Some(COMMAND_TIMEOUT))
        .context("setting the Redis read timeout")?;
    connection
        .set_write_timeout(Some(COMMAND_TIMEOUT))
        .context("setting the Redis write timeout")?;
    redis::cmd("PING")
        .query::<String>(&mut connection)
        .map_err(|err| Backend::Redis.unreachable(url, redis_cause(&err)))?;
    Ok(connection)
}

/// Says "timed out" plainly for a server that accepts connections and never answers.
pub fn redis_cause(err: &redis::RedisError) -> String {
    if err.is_timeout() {
        "it accepted the connection but gave no answer in time: frozen or overloaded?".into()
    } else {
        err.to_string()
    }
}

/// A Postgres client, connected within [`CONNECT_TIMEOUT`].
///
/// The postgres crate bounds only the TCP connect; a frozen server accepts the connection
/// and then never answers the handshake. So the whole connect runs on a helper thread and
/// we stop waiting for it after the timeout. Every statement also carries a server-side
/// `statement_timeout`.
pub fn postgres(url: &str) -> Result<postgres::Client> {
    let mut config: postgres::Config = url
        .parse()
        .map_err(|err| anyhow!("{} {}: {err}", Backend::Postgres.flag(), redact(url)))?;
    config
        .connect_timeout(CONNECT_TIMEOUT)
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .options(&format!(
            "-c statement_timeout={}",
            COMMAND_TIMEOUT.as_millis()
        ))
        .application_name("lockslab");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(config.connect(postgres::NoTls));
    });
    match rx.recv_timeout(CONNECT_TIMEOUT + Duration::from_millis(500)) {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(err)) => Err(Backend::Postgres.unreachable(url, pg_cause(&err))),
        Err(_) => Err(Backend::Postgres.unreachable(
            url,
            format!("no answer within {}s", CONNECT_TIMEOUT.as_secs()),
        )),
    }
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

/// An etcd client with connect and request timeouts, on the caller's runtime.
pub async fn etcd(url: &str) -> Result<etcd_client::Client> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(COMMAND_TIMEOUT);
    let mut client = etcd_client::Client::connect([url], Some(options))
        .await
        .map_err(|err| Backend::Etcd.unreachable(url, err))?;
    client
        .status()
        .await
        .map_err(|err| Backend::Etcd.unreachable(url, err))?;
    Ok(client)
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
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("postgres://lab:secret@127.0.0.1:5432/db"),
            "postgres://lab:***@127.0.0.1:5432/db"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("postgres://lab@host/db"), "postgres://lab@host/db");
    }

    #[test]
    fn url_problem_says_what_is_expected() {
        let problem = url_problem(Backend::Redis, "http://x").unwrap();
        assert!(problem.contains("redis://"), "{problem}");
        assert!(url_problem(Backend::Postgres, "postgresql://u@h/db").is_none());
        assert!(url_problem(Backend::Etcd, "http:///x").is_some());
    }
}
