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
        Backend::Etcd => &["http://"],
        Backend::Postgres => &["postgres://", "postgresql://"],
    };
    let Some(rest) = schemes.iter().find_map(|scheme| url.strip_prefix(scheme)) else {
        return Some(format!(
            "expected a {} URL starting with {}",
            backend.name(),
            schemes.join(" or ")
        ));
    };
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
