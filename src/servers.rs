//! Finding Redis, etcd and Postgres — or starting private throwaway ones.
//!
//! For each backend a lab needs, the first of these that applies wins:
//! 1. the URL given by flag or environment (`--redis-url` / `LOCKSLAB_REDIS_URL`…): it must answer;
//! 2. the servers `lockslab up` left running: while its state file is there they must answer,
//!    and a lab stops with a line saying which one is down rather than mix in another server;
//! 3. the docker-compose.yml defaults, if they answer (skipped with `--private-servers`);
//! 4. a private server started from the binaries on this machine, in a temporary directory,
//!    on a free loopback port, stopped and deleted when the lab ends.
//!
//! Start-up can be interrupted at any moment, by Ctrl-C or SIGKILL: every child (`initdb`
//! too) is registered and dies with lockslab; `lockslab up` records each server as it spawns
//! it, so `down` finds it; and what a killed run could not delete, the next start does.
//!
//! The tests use the same code, so no test depends on a fixed port.

use std::fs;
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::Signal;
use nix::unistd::{Gid, Uid};
use serde::{Deserialize, Serialize};

use crate::connect::{self, Backend};
use crate::identities::SEAT_UIDS;
use crate::procs::{self, StopPlan};
use crate::proxy::guard::{self, Protocol};

mod pg_template;

/// The flags and environment variables that name servers; every lab takes them.
///
/// An empty variable (`LOCKSLAB_ETCD_URL=`) counts as not set, as in most command-line tools.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServerArgs {
    /// Redis to use, e.g. redis://127.0.0.1:6379
    #[arg(long, env = "LOCKSLAB_REDIS_URL", value_name = "URL", global = true,
          value_parser = UrlParser(Backend::Redis), hide_env_values = true)]
    pub redis_url: Option<String>,
    /// etcd to use, e.g. http://127.0.0.1:2379
    #[arg(long, env = "LOCKSLAB_ETCD_URL", value_name = "URL", global = true,
          value_parser = UrlParser(Backend::Etcd), hide_env_values = true)]
    pub etcd_url: Option<String>,
    /// Postgres to use, e.g. postgres://lockslab:lockslab@127.0.0.1:5432/lockslab
    #[arg(long, env = "LOCKSLAB_POSTGRES_URL", value_name = "URL", global = true,
          value_parser = UrlParser(Backend::Postgres), hide_env_values = true)]
    pub postgres_url: Option<String>,
    /// Skip the docker-compose defaults and `lockslab up`: start private servers for this run
    #[arg(long, env = "LOCKSLAB_PRIVATE_SERVERS", global = true, action = clap::ArgAction::SetTrue,
          value_parser = boolish_or_empty)]
    pub private_servers: bool,
}

/// A URL flag's value parser: a malformed URL is a command-line error (exit status 2) that
/// names the flag or the environment variable it came from.
///
/// Not a plain `fn(&str) -> Result<String, String>`: for those, clap's error repeats the
/// rejected value as typed — password included. This one builds the whole message itself
/// and shows the URL redacted.
#[derive(Clone, Copy, Debug)]
struct UrlParser(Backend);

/// The same value parser for a lab's own URL flag (`flag`, with no environment variable):
/// lab 6's `--master`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LabUrlParser(pub(crate) Backend, pub(crate) &'static str);

impl clap::builder::TypedValueParser for LabUrlParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let text = value.to_string_lossy();
        match connect::url_problem(self.0, &text) {
            None if !text.trim().is_empty() => Ok(text.into_owned()),
            problem => {
                let problem = problem.unwrap_or_else(|| "it is empty".to_string());
                let message = format!(
                    "invalid value '{}' for '{}': {problem}\n\nFor more information, try '--help'.\n",
                    connect::redact(&text),
                    self.1
                );
                Err(
                    clap::Error::raw(clap::error::ErrorKind::ValueValidation, message)
                        .with_cmd(cmd),
                )
            }
        }
    }
}

impl clap::builder::TypedValueParser for UrlParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        _arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let backend = self.0;
        let text = value.to_string_lossy();
        if text.trim().is_empty() {
            // An empty variable means "not set"; `ServerArgs::given` skips it.
            return Ok(String::new());
        }
        let Some(problem) = connect::url_problem(backend, &text) else {
            return Ok(text.into_owned());
        };
        // clap does not say where a value came from: the flag, if it is on the command line.
        let on_command_line = std::env::args_os().any(|arg| {
            let arg = arg.to_string_lossy();
            arg == backend.flag() || arg.starts_with(&format!("{}=", backend.flag()))
        });
        let source = if on_command_line {
            backend.flag()
        } else {
            backend.env_var()
        };
        let message = format!(
            "invalid value '{}' for '{source}': {problem}\n\nFor more information, try '--help'.\n",
            connect::redact(&text)
        );
        Err(clap::Error::raw(clap::error::ErrorKind::ValueValidation, message).with_cmd(cmd))
    }
}

/// `LOCKSLAB_PRIVATE_SERVERS`: the usual yes/no words, and empty for "not set".
fn boolish_or_empty(text: &str) -> Result<bool, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "0" | "n" | "no" | "f" | "false" | "off" => Ok(false),
        "1" | "y" | "yes" | "t" | "true" | "on" => Ok(true),
        _ => Err("use 1/0, yes/no, true/false or on/off (empty means not set)".into()),
    }
}

impl ServerArgs {
    pub fn given(&self, backend: Backend) -> Option<&str> {
        match backend {
            Backend::Redis => self.redis_url.as_deref(),
            Backend::Etcd => self.etcd_url.as_deref(),
            Backend::Postgres => self.postgres_url.as_deref(),
        }
        .filter(|url| !url.is_empty())
    }
}

/// Every backend, for the commands that start them all.
pub const ALL: [Backend; 3] = [Backend::Redis, Backend::Etcd, Backend::Postgres];

/// The docker-compose.yml defaults.
pub fn compose_default(backend: Backend) -> &'static str {
    match backend {
        Backend::Redis => "redis://127.0.0.1:6379",
        Backend::Etcd => "http://127.0.0.1:2379",
        Backend::Postgres => "postgres://lockslab:lockslab@127.0.0.1:5432/lockslab",
    }
}

/// Where a server came from, for the line a lab prints about it.
#[derive(Clone, Debug)]
pub enum Origin {
    Given,
    Up,
    Compose,
    Private { started_in: Duration },
}

/// The servers a lab runs against. Private ones stop when this is dropped.
pub struct Servers {
    urls: Vec<(Backend, String, Origin)>,
    /// Held only to be dropped: the private servers live exactly as long as this value.
    _private: Option<PrivateServers>,
    /// The superuser of `lockslab up`'s Postgres, from its state file, when the Postgres is
    /// `up`'s.
    up_admin: Option<String>,
}

impl Servers {
    /// Postgres's superuser, on the labs' database, when lockslab started that Postgres
    /// itself: for this run, or as `lockslab up` (whose state file, this user's alone,
    /// keeps it).
    pub fn postgres_admin_url(&self) -> Option<String> {
        let private = self._private.as_ref().and_then(|p| p.admin_url.as_deref());
        let admin = private.or(self.up_admin.as_deref())?;
        let server = admin.strip_suffix("/postgres").unwrap_or(admin);
        Some(format!("{server}/{PG_ROLE}"))
    }

    pub fn url(&self, backend: Backend) -> &str {
        self.urls
            .iter()
            .find(|(b, _, _)| *b == backend)
            .map(|(_, url, _)| url.as_str())
            .unwrap_or_else(|| panic!("{} was not requested from servers::provide", backend.name()))
    }

    /// One line per server: which one, and where it came from.
    pub fn describe(&self) -> Vec<String> {
        self.urls
            .iter()
            .map(|(backend, url, origin)| {
                let from = match origin {
                    Origin::Given => "given".to_string(),
                    Origin::Up => "from `lockslab up`".to_string(),
                    // docker compose's, or a system service that a package started there.
                    Origin::Compose => "found on its default port".to_string(),
                    Origin::Private { started_in } => {
                        format!("private, started in {}", crate::output::human(*started_in))
                    }
                };
                format!("{:<8} {} ({from})", backend.name(), connect::redact(url))
            })
            .collect()
    }
}

/// Finds or starts each backend in `needs`.
pub fn provide(args: &ServerArgs, needs: &[Backend]) -> Result<Servers> {
    find_or_start(args, needs, true)
}

/// Finds each backend in `needs` without starting private ones: for commands run in
/// several terminals (the hands-on worker), which must all meet on the same servers.
pub fn provide_shared(args: &ServerArgs, needs: &[Backend]) -> Result<Servers> {
    find_or_start(args, needs, false)
}

fn find_or_start(args: &ServerArgs, needs: &[Backend], may_start: bool) -> Result<Servers> {
    let mut urls = Vec::new();
    let mut missing = Vec::new();
    // Read only when a backend is not given: a lab with every URL given ignores `up`.
    let mut up_state: Option<Option<UpState>> = None;
    let mut up_admin = None;
    for &backend in needs {
        if let Some(url) = args.given(backend) {
            connect::note_source(url, given_source(backend));
            connect::probe(backend, url)?;
            urls.push((backend, url.to_string(), Origin::Given));
            continue;
        }
        if !args.private_servers {
            let state = match &up_state {
                Some(state) => state,
                None => up_state.insert(UpState::load()?),
            };
            if let Some(state) = state {
                // `up`'s servers are this machine's configuration: when one is down, say so.
                // Falling through to the compose default would quietly pair, say, `up`'s
                // Postgres with whatever Redis someone else left on port 6379.
                let url = state.answering_url(backend)?;
                connect::note_source(&url, connect::Source::Up);
                if backend == Backend::Postgres {
                    up_admin = state.postgres_admin.clone();
                }
                urls.push((backend, url, Origin::Up));
                continue;
            }
        }
        if !args.private_servers && answers_quickly(backend, compose_default(backend)) {
            connect::note_source(compose_default(backend), connect::Source::Compose);
            urls.push((
                backend,
                compose_default(backend).to_string(),
                Origin::Compose,
            ));
        } else {
            missing.push(backend);
        }
    }
    if let (false, Some(backend)) = (may_start, missing.first()) {
        bail!(
            "no {} to share between terminals: run `lockslab up` and paste the export lines it prints, \
             or give {} (or `docker compose up -d`)",
            backend.name(),
            backend.flag()
        );
    }
    let private = if missing.is_empty() {
        None
    } else {
        let private = PrivateServers::start(&missing, Lifetime::ThisRun)?;
        for (backend, url) in &private.urls {
            connect::note_source(url, connect::Source::Private);
            urls.push((
                *backend,
                url.clone(),
                Origin::Private {
                    started_in: private.started_in,
                },
            ));
        }
        Some(private)
    };
    Ok(Servers {
        urls,
        _private: private,
        up_admin,
    })
}

/// Whether a given URL came from its flag or its environment variable (clap prefers the
/// flag when both are set), so that an error can say which one to change.
fn given_source(backend: Backend) -> connect::Source {
    let flag = backend.flag();
    let on_command_line = std::env::args().any(|arg| {
        arg == flag
            || arg
                .strip_prefix(flag)
                .is_some_and(|rest| rest.starts_with('='))
    });
    if on_command_line {
        connect::Source::Flag
    } else {
        connect::Source::Env
    }
}

fn answers(backend: Backend, url: &str) -> bool {
    connect::probe(backend, url).is_ok()
}

/// A compose default answers only if something listens on its port at all; checking the
/// port first keeps the common case (nothing there) instant.
pub fn answers_quickly(backend: Backend, url: &str) -> bool {
    let port = url
        .rsplit(':')
        .next()
        .and_then(|p| p.split('/').next())
        .and_then(|p| p.parse::<u16>().ok());
    let Some(port) = port else { return false };
    let address = (Ipv4Addr::LOCALHOST, port).into();
    std::net::TcpStream::connect_timeout(&address, Duration::from_millis(300)).is_ok()
        && answers(backend, url)
}

/// Whether private servers die with this run or outlive it (`lockslab up`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Lifetime {
    ThisRun,
    Detached,
}

/// How many times a private server is started, each time on a new port, before giving up.
///
/// A free port is only free when we look: another process may bind it before the server
/// does (busy machines lost 2 starts in 96 this way). The server then exits at once, and a
/// new port almost always works.
const START_TRIES: u32 = 3;

/// How long a private server may take to answer once started.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// The file in a private run's directory that says the run is alive: the run holds an
/// exclusive `flock` on it for as long as it lives, and the kernel drops that lock when the
/// process dies, however it dies. A later run that can take the lock knows the directory's
/// owner is gone. Unlike a pid, a lock can't be fooled by a reused pid or hidden by another
/// pid namespace.
const OWNER_LOCK: &str = "owner.lock";

/// Servers started from local binaries in a directory of their own.
pub struct PrivateServers {
    pub dir: PathBuf,
    pub urls: Vec<(Backend, String)>,
    pub pids: Vec<(Backend, i32)>,
    pub started_in: Duration,
    lifetime: Lifetime,
    /// Holds the data of the servers that run as other users: Postgres's `pg`, and a room's
    /// [`SEATS_DIR`]. `dir` itself, except for `lockslab up` as root when those users can't
    /// enter `dir` (a private `XDG_RUNTIME_DIR`, a `LOCKSLAB_STATE_DIR` made by `mktemp -d`).
    pg_home: PathBuf,
    /// The user Postgres runs as, when lockslab runs as root.
    pg_user: Option<RunAs>,
    /// Set once `lockslab up` has handed its servers over: its directories stay.
    released: bool,
    /// This run's claim on `dir` (see [`OWNER_LOCK`]); released when the process ends.
    _owner: Option<Flock<fs::File>>,
    /// `lockslab up --room`: where the servers listen.
    room: Option<Room>,
    /// The passwords every server of this start demands (see [`Secrets`]).
    secrets: Secrets,
    /// Postgres's superuser URL, once the labs' role is made: for the instructor only.
    admin_url: Option<String>,
    /// Redis started from now on keeps its data: AOF on, `appendfsync always` (chaos's
    /// `restart-aof`); off by default, a private Redis has no persistence.
    redis_aof: bool,
    /// A room's seats' own Redis and etcd servers (see [`PrivateServers::start_seat_servers`]).
    seat_pids: Vec<(Backend, i32)>,
    /// When lockslab runs as root, the user each seat's servers run as, by seat: a uid and a
    /// gid (the same number) in [`SEAT_UIDS`] that no account, group or process has, drawn
    /// afresh for each room. Neither root nor the user Postgres runs as: a seat that takes
    /// over its Redis (a Lua sandbox escape, say) reads its own seat's files and nobody
    /// else's, and cannot signal or trace another seat's servers. Empty when not root: the
    /// servers then run as lockslab's user, as every private server does.
    seat_users: Vec<(Uid, Gid)>,
    /// A room's guard (see [`PrivateServers::start_guard`]), once started.
    guard_pid: Option<i32>,
}

/// Every server lockslab starts demands a secret, on loopback too: any local user can
/// reach a loopback port, and a Postgres that trusts its clients hands them a superuser,
/// which runs shell commands (`COPY … FROM PROGRAM`) as the account that runs Postgres.
///
/// Generated afresh at each start; they live in the servers' URLs (which reach workers
/// through a pipe, never an argument or the environment), in `up`'s 0600 state file, and in
/// 0600 files the servers read at start-up.
#[derive(Clone)]
struct Secrets {
    /// What the labs give: Redis's `default` user, etcd's `root`, Postgres's `lockslab` role
    /// (no superuser, one database of its own).
    password: String,
    /// Postgres's superuser, `lockslab_admin`: used once, to create the labs' role and
    /// database, and kept only in `up`'s state file, for the instructor.
    admin_password: String,
}

/// The labs' Postgres role and database: an ordinary role that owns its database and
/// nothing else (no superuser, no `pg_execute_server_program`, no other database).
pub const PG_ROLE: &str = "lockslab";
/// The superuser initdb creates, with a password of its own that the labs never use.
pub const PG_ADMIN: &str = "lockslab_admin";
/// The admin's `search_path`, set on the role: the catalog only (see `provision_postgres`).
pub const ADMIN_SEARCH_PATH: &str = "pg_catalog, pg_temp";
/// The labs' role's `search_path`, set on the role: its own schema, which only it (and the
/// superuser) may create in, then the catalog.
pub const LABS_SEARCH_PATH: &str = "lockslab, pg_catalog, pg_temp";

/// A room's servers (`lockslab up --room ADDR`): they listen on an address the attendees
/// can reach, so each one demands a password — Redis `requirepass`, Postgres SCRAM, etcd
/// auth with a root user. Servers never listen beyond loopback without one.
///
/// Those passwords are the instructor's. Each attendee gets a [`Seat`] instead: a user of
/// their own on each server that reaches their own namespace only.
#[derive(Clone)]
pub struct Room {
    pub addr: std::net::IpAddr,
    pub password: String,
    pub seats: Vec<Seat>,
}

/// One attendee's place in a room: a Redis and an etcd of its own and a Postgres role, with a
/// user on each named like the seat, one password of its own, reaching only the seat's
/// namespace:
///
/// - Redis: a `redis-server` of the seat's own (see [`PrivateServers::start_seat_servers`]),
///   where its user reaches every key and only the commands the labs send;
/// - etcd: an `etcd` of the seat's own, where its user reads and writes the keys under
///   `lockslab:<seat>_` (and takes leases, watches and compacts — on its own server only);
///   it lets in only clients whose certificate the seat's own authority signed (see
///   [`crate::etcd_tls`]);
/// - Postgres: a database `<seat>` of its own, with a schema `<seat>` (its `search_path`)
///   and the schemas its runs create; in the labs' database, rows added to the room's
///   results and nothing else; at most [`PG_CONNECTIONS_PER_LAB`] connections.
///
/// A run with `LOCKSLAB_NAMESPACE=<seat>` has the run id `<seat>_<hex>`, and every lab
/// names its keys `lockslab:<run id>:…`, so everything it writes falls inside.
///
/// When lockslab runs as root, a seat's Redis and etcd run as a user of the seat's own (see
/// [`PrivateServers::seat_users`]), so that a seat that takes over its server holds nothing
/// but that seat's files.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Seat {
    /// The seat's user name on every server, and its namespace: `seat01`, `seat02`…
    pub name: String,
    pub password: String,
    /// The password of `default` on the seat's own Redis and of `root` on its etcd: the
    /// instructor's, kept in the state file. A password of its own, never the room's: the
    /// seat's Redis config holds it in a file its server's user reads, and a seat that took
    /// over its server would hold that file — with the room's password in it, every
    /// server's admin too (a hostile re-attack found exactly that).
    #[serde(default)]
    pub admin_password: String,
    /// Where the seat's own Redis listens (`host:port`), once started.
    #[serde(default)]
    pub redis: Option<String>,
    /// Where the seat's own etcd listens (`host:port`), once started.
    #[serde(default)]
    pub etcd: Option<String>,
    /// The uid its servers run as, when lockslab runs as root (see
    /// [`PrivateServers::seat_users`]).
    #[serde(default)]
    pub uid: Option<u32>,
    /// The attendee's client certificate for the seat's etcd, with the seat's authority
    /// ([`crate::etcd_tls::Bundle::encode`]): its `LOCKSLAB_ETCD_TLS`.
    #[serde(default)]
    pub etcd_tls: Option<String>,
    /// The instructor's certificate for the same etcd (see [`crate::etcd_tls::INSTRUCTOR`]).
    #[serde(default)]
    pub instructor_etcd_tls: Option<String>,
}

impl Seat {
    /// `count` seats, each with a fresh password.
    pub fn generate(count: usize) -> Vec<Seat> {
        (1..=count)
            .map(|n| Seat {
                name: format!("seat{n:02}"),
                password: crate::seed::os_hex(24),
                admin_password: crate::seed::os_hex(24),
                redis: None,
                etcd: None,
                uid: None,
                etcd_tls: None,
                instructor_etcd_tls: None,
            })
            .collect()
    }

    /// The ACL rules of the seat's user on its own Redis: its password, every key (the
    /// server holds nobody else's), and the commands the labs send (strings, lists, expiry,
    /// scripts, transactions, WAIT, INFO for the eviction check, naming a connection and
    /// listing them for the sweep of dead runs) — and `SCRIPT KILL`, so that a seat ends
    /// its own runaway script. No command Redis marks dangerous (FLUSHALL, KEYS, CONFIG,
    /// SAVE, REPLICAOF, MIGRATE, DEBUG, SHUTDOWN…), no functions, no channels.
    fn redis_acl(&self) -> Vec<String> {
        lab_redis_acl(
            &self.password,
            "*",
            &["+script|kill"],
            &["+info", "+client|setname", "+client|list"],
        )
    }

    /// The URL the seat's attendee uses for its own Redis, when it has one.
    pub fn redis_url(&self) -> Option<String> {
        let at = self.redis.as_deref()?;
        Some(format!("redis://{}:{}@{at}", self.name, self.password))
    }

    /// The URL the seat's attendee uses for its own etcd, when it has one: TLS with a client
    /// certificate (see [`crate::etcd_tls`]).
    pub fn etcd_url(&self) -> Option<String> {
        let at = self.etcd.as_deref()?;
        Some(format!("https://{}:{}@{at}", self.name, self.password))
    }

    /// From now on, this process reaches the seat's etcd with the instructor's certificate.
    fn trust_etcd_as_instructor(&self) {
        if let (Some(at), Some(bundle)) = (&self.etcd, &self.instructor_etcd_tls) {
            crate::etcd_tls::trust(at, bundle);
        }
    }

    /// The role and user the seat has on its own etcd: the keys under `lockslab:<seat>_`.
    async fn add_to_etcd(&self, client: &mut etcd_client::Client) -> Result<()> {
        let name = self.name.as_str();
        client.role_add(name).await?;
        let prefix = format!("lockslab:{name}_");
        client
            .role_grant_permission(
                name,
                etcd_client::Permission::read_write(prefix).with_prefix(),
            )
            .await?;
        client.user_add(name, self.password.as_str(), None).await?;
        client.user_grant_role(name, name).await?;
        Ok(())
    }
}

/// The ACL rules of a Redis user that lockslab makes for someone it does not trust (a room
/// seat, a challenge's clients): its password, the keys matching `keys*`, no channels, and
/// the commands a lock sends — strings, lists, expiry, scripts (`EVAL`, `EVALSHA`, `SCRIPT
/// LOAD`/`EXISTS`), transactions, connection commands — plus `granted`; then nothing Redis
/// marks dangerous and no functions, but `let_back`, named after that on purpose (`INFO`
/// and `CLIENT` are in the dangerous category).
pub(crate) fn lab_redis_acl(
    password: &str,
    keys: &str,
    granted: &[&str],
    let_back: &[&str],
) -> Vec<String> {
    let mut rules = vec![
        "reset".to_string(),
        "on".to_string(),
        format!(">{password}"),
        format!("~{keys}"),
        "resetchannels".to_string(),
    ];
    let commands = [
        "-@all",
        "+@read",
        "+@write",
        "+@connection",
        "+@transaction",
        "+eval",
        "+evalsha",
        "+script|load",
        "+script|exists",
    ];
    rules.extend(commands.iter().chain(granted).map(|rule| rule.to_string()));
    rules.extend(["-@dangerous", "-function"].map(String::from));
    rules.extend(let_back.iter().map(|rule| rule.to_string()));
    rules
}

/// A seat's Redis memory: far more than any lab writes, and 30 of them fit a laptop. Its
/// clients' buffers have a cap of the same size (`maxmemory-clients`): `maxmemory` counts
/// data only, and a hostile re-attack grew a seat's Redis to 348 MB by asking for a big
/// value 40 times and never reading the replies.
pub const SEAT_REDIS_MAXMEMORY_MB: u64 = 64;

/// The most replies a seat's Redis keeps waiting for one client to read: a lab's replies
/// are a few bytes; past this the client is disconnected.
const SEAT_REDIS_REPLY_BUFFER: &str = "8mb";

/// A seat's Redis connections. Connections that have not logged in count too, but only the
/// room's guard reaches a seat's Redis, and it lets at most
/// [`crate::proxy::guard::LOGINS_PER_SERVER`] of them through at a time, each for
/// [`crate::proxy::guard::LOGIN_DEADLINE`]; the rest are the seat's own, logged in. The labs
/// need far fewer (50 workers at most). The guard relays each connection on two file
/// descriptors: Redis's default of 10,000 per seat would let one seat's logged-in
/// connections take every descriptor the guard has (20,000 on a common machine), and with
/// it every other seat's way in.
pub const SEAT_REDIS_MAXCLIENTS: u32 = 256;

/// A seat's Redis address space, in bytes. `maxmemory` is checked when a command or a
/// script *starts*: one script that writes in a loop grows past it unchecked (350 MB for a
/// two-million-key loop). Past this limit its allocations fail and that seat's Redis ends
/// (Redis aborts when out of memory), instead of the machine running out, and every
/// seat's servers with it. It starts at about 60 MB.
pub const SEAT_REDIS_ADDRESS_SPACE: u64 = 512 * 1024 * 1024;

/// A seat's etcd database size: far more than any lab writes. Past it etcd raises its
/// `NOSPACE` alarm and takes no more writes — for that seat alone — instead of filling the
/// disk every seat's servers write to (etcd's own default is 2 GiB, 30 times over).
///
/// The price: etcd 3.4 grants leases without a password, and once the alarm is up it checks
/// no permission at all (`auth disable` included). Filling 128 MB with lease grants takes
/// about 1.7 million of them (13,337 filled 1 MB here, in 18 s), and only a holder of the
/// seat's certificate gets to send one (see [`crate::etcd_tls`]): the seat itself, whose
/// lab keys are all that etcd holds.
pub const SEAT_ETCD_QUOTA_BYTES: u64 = 128 * 1024 * 1024;

/// The files of a seat's etcd, in its home, that [`crate::etcd_tls`] makes: the seat's
/// authority's certificate, the server's certificate and its key.
const ETCD_CA_FILE: &str = "ca.pem";
const ETCD_CERT_FILE: &str = "server.pem";
const ETCD_KEY_FILE: &str = "server-key.pem";

/// The directory holding a directory per seat, each with the seat's Redis config, its
/// etcd's data and their logs (see [`PrivateServers::seat_home`]).
const SEATS_DIR: &str = "seats";

/// A seat's Redis config: the seat's admin password on `default`, the seat's user, the
/// limits (see [`PrivateServers::start_seat_servers`]). In a file only the seat's server
/// reads: it holds both passwords.
fn seat_redis_config(seat: &Seat) -> String {
    format!(
        "requirepass {}\nuser {} {}\nmaxmemory {SEAT_REDIS_MAXMEMORY_MB}mb\n\
         maxmemory-policy noeviction\nmaxclients {SEAT_REDIS_MAXCLIENTS}\n\
         client-output-buffer-limit normal {SEAT_REDIS_REPLY_BUFFER} {SEAT_REDIS_REPLY_BUFFER} 0\n\
         maxmemory-clients {SEAT_REDIS_MAXMEMORY_MB}mb\n",
        seat.admin_password,
        seat.name,
        seat.redis_acl().join(" ")
    )
}

/// The most seats a room has: the Postgres connections are sized by it.
pub const MAX_SEATS: usize = 99;

/// The namespace this run's keys, rows and tables go under (`LOCKSLAB_NAMESPACE`, a
/// room seat's name), or None. Lowercase letters and digits only: it becomes part of Redis
/// key patterns, etcd prefixes and Postgres identifiers, where anything else could match or
/// mean more than itself.
pub fn namespace() -> Result<Option<String>> {
    let Some(text) = std::env::var_os("LOCKSLAB_NAMESPACE") else {
        return Ok(None);
    };
    let text = text.to_string_lossy();
    if text.is_empty() {
        return Ok(None);
    }
    let ok = text.len() <= 16
        && text
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if !ok {
        crate::bail_usage!(
            "LOCKSLAB_NAMESPACE \"{}\": use 1 to 16 lowercase letters or digits (a seat's name, \
             as `lockslab seat` prints it)",
            text.escape_debug()
        );
    }
    Ok(Some(text.into_owned()))
}

/// `url` with its user and password replaced (`scheme://user:password@rest`).
pub(crate) fn with_user(url: &str, user: &str, password: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    format!("{scheme}://{user}:{password}@{rest}")
}

/// An etcd without auth lets whoever reaches it add users and roles, who keep their rights
/// once auth is on. lockslab gives each etcd its users where nobody else reaches it (see
/// [`PrivateServers::bootstrap_etcds`]); this reads them back, as root, once the etcd
/// listens on its real address — a second line, and a check of lockslab's own work:
/// anything it did not make, or a seat's role with rights beyond its prefix, stops the
/// start.
pub fn check_no_one_else_got_in(root_url: &str, seats: &[Seat]) -> Result<()> {
    let mut expected: Vec<String> = seats.iter().map(|seat| seat.name.clone()).collect();
    expected.push("root".into());
    expected.sort();
    let (users, roles, seat_rights) = connect::etcd_runtime()?.block_on(async {
        let mut client = connect::etcd(root_url).await?;
        let mut users = client.user_list().await?.users().to_vec();
        let mut roles = client.role_list().await?.roles().to_vec();
        users.sort();
        roles.sort();
        let mut seat_rights = Vec::new();
        for seat in seats {
            let role = client.role_get(seat.name.as_str()).await?;
            seat_rights.push((seat.name.clone(), role.permissions().len()));
        }
        anyhow::Ok((users, roles, seat_rights))
    })?;
    let widened: Vec<&String> = seat_rights
        .iter()
        .filter(|(_, rights)| *rights != 1)
        .map(|(name, _)| name)
        .collect();
    if users != expected || roles != expected || !widened.is_empty() {
        bail!(
            "someone reached etcd before its password was set: it has users {users:?} and \
             roles {roles:?} where lockslab made {expected:?}{}; stopping rather than hand \
             out a server someone else may own (`lockslab down`, then start again; keep the \
             room's address off networks you do not trust)",
            if widened.is_empty() {
                String::new()
            } else {
                format!(", and the roles {widened:?} have rights lockslab did not give")
            }
        );
    }
    Ok(())
}

/// A Postgres `url` with its database replaced by `database` (a query string stays).
pub fn on_database(url: &str, database: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (rest, query) = rest
        .split_once('?')
        .map_or((rest, None), |(r, q)| (r, Some(q)));
    let host_at = rest.rfind('@').map_or(0, |at| at + 1);
    let server = rest[host_at..]
        .find('/')
        .map_or(rest, |slash| &rest[..host_at + slash]);
    match query {
        Some(query) => format!("{scheme}://{server}/{database}?{query}"),
        None => format!("{scheme}://{server}/{database}"),
    }
}

/// The most Postgres connections one run of any lab holds at once: `no-lock --contention`'s
/// 32 workers, its orchestrator and the store (34 seen). Measured with
/// `scripts/peak-connections`, which samples `pg_stat_activity` during each lab's run.
pub const PG_CONNECTIONS_PER_LAB: i64 = 36;

/// The most a run of any lab at its defaults holds (13 seen: etcd-vs-redis, failover).
pub const PG_CONNECTIONS_AT_DEFAULTS: i64 = 14;

/// How many attendees a room's servers are sized for, unless `--seats` says otherwise.
pub const ROOM_ATTENDEES: i64 = 30;

/// What a room's Postgres keeps for the labs' role (the instructor's) and the superuser
/// slots, beyond the seats' limits: `psql`, the by-hand exercises, the instructor's own labs.
pub const ROOM_PG_INSTRUCTOR_CONNECTIONS: i64 = 40;

/// A room's Postgres connections: every attendee running the hungriest lab at once, the
/// instructor's share, and the logins in progress. Each seat's role is limited to one lab
/// run's worth ([`PG_CONNECTIONS_PER_LAB`]); a connection that is still logging in holds a
/// slot before any role's limit is checked, and the room's guard lets at most
/// [`crate::proxy::guard::LOGINS_PER_SERVER`] log in at once, whoever sends them. So even
/// every seat at its limit, with the guard's logins all taken by a flood, leaves the
/// instructor's [`ROOM_PG_INSTRUCTOR_CONNECTIONS`].
pub const fn room_pg_connections(seats: i64) -> i64 {
    seats * PG_CONNECTIONS_PER_LAB
        + ROOM_PG_INSTRUCTOR_CONNECTIONS
        + crate::proxy::guard::LOGINS_PER_SERVER as i64
}

/// A room's Postgres's own login deadline (`authentication_timeout`, a minute by default):
/// the second layer behind the guard's [`crate::proxy::guard::LOGIN_DEADLINE`], which
/// fires first. It ends a login that reached Postgres by another way than the guard (a
/// local user, on loopback) ten seconds in.
pub const ROOM_PG_AUTHENTICATION_TIMEOUT_S: u64 = 10;

/// Where an etcd listens while lockslab gives it its users (see
/// [`PrivateServers::bootstrap_etcds`]): a Unix socket in its home, which etcd names as it
/// would a host and port (`unix://boot:0` is the file `boot:0` in its working directory).
const ETCD_BOOT_SOCKET: &str = "boot:0";

/// Where an etcd listens for the other members of its cluster: a Unix socket in its home.
///
/// A cluster of one has no other members, but etcd listens for them all the same, and its
/// peer port asks for no password: on 127.0.0.1 it let any process of the machine keep any
/// lease alive (`POST /leases`), read the keys attached to one (`/leases/internal`), list
/// the members, and send raft messages. A socket in a directory that only the etcd's user
/// (and root) may enter lets nobody else in.
const ETCD_PEER_SOCKET: &str = "peer:0";

/// An etcd to give its users before it listens anywhere (see
/// [`PrivateServers::bootstrap_etcds`]).
struct EtcdBoot {
    /// Its working directory, 0700: its data (`data`) and its sockets.
    home: PathBuf,
    log: PathBuf,
    /// The user it runs as (a seat's, when lockslab runs as root); else lockslab's.
    owner: Option<(Uid, Gid)>,
    /// The seat it is for, whose user it gets besides `root`.
    seat: Option<Seat>,
}

impl EtcdBoot {
    fn what(&self) -> String {
        match &self.seat {
            Some(seat) => format!("the etcd of {}", seat.name),
            None => "the private etcd".to_string(),
        }
    }

    /// Waits until the etcd started as `pid` answers on its socket, then gives it its users
    /// and turns auth on.
    fn give_users(&self, pid: i32, root_password: &str) -> Result<()> {
        let socket = self.home.join(ETCD_BOOT_SOCKET);
        let runtime = connect::etcd_runtime()?;
        let answering = wait_until(pid, || {
            runtime.block_on(connect::etcd_on_socket(&socket)).is_ok()
        });
        if let Err(failure) = answering {
            bail!(
                "{} did not start ({}); the end of its log: {}",
                self.what(),
                failure.words(),
                log_tail(&self.log)
            );
        }
        runtime
            .block_on(async {
                let mut client = connect::etcd_on_socket(&socket).await?;
                if let Some(seat) = &self.seat {
                    seat.add_to_etcd(&mut client).await?;
                }
                // A seat's etcd has a root of its own (see `Seat::admin_password`).
                let root_password = self
                    .seat
                    .as_ref()
                    .map_or(root_password, |seat| seat.admin_password.as_str());
                client.user_add("root", root_password, None).await?;
                // The root role exists from the start in some versions, not in others.
                let _ = client.role_add("root").await;
                client.user_grant_role("root", "root").await?;
                client.auth_enable().await?;
                anyhow::Ok(())
            })
            .with_context(|| format!("turning on authentication in {}", self.what()))
    }
}

impl PrivateServers {
    /// Starts the given backends and waits until each answers.
    ///
    /// Processes are spawned from this (the calling) thread, so that their parent-death
    /// signal is tied to a thread that outlives them; only the waiting runs in parallel.
    pub fn start(backends: &[Backend], lifetime: Lifetime) -> Result<PrivateServers> {
        Self::start_with(backends, lifetime, None)
    }

    /// [`PrivateServers::start`], listening on a room's address with passwords on.
    pub fn start_with(
        backends: &[Backend],
        lifetime: Lifetime,
        mut room: Option<Room>,
    ) -> Result<PrivateServers> {
        let started = Instant::now();
        let pg_user = unprivileged_owner()?;
        let seat_users = match &mut room {
            Some(room) if Uid::effective().is_root() => {
                let users = crate::identities::free(SEAT_UIDS, room.seats.len())?;
                for (seat, (uid, _)) in room.seats.iter_mut().zip(&users) {
                    seat.uid = Some(uid.as_raw());
                }
                users
            }
            _ => Vec::new(),
        };
        let (dir, owner) = match lifetime {
            Lifetime::ThisRun => {
                let root = std::env::temp_dir();
                sweep_dead_runs(&root);
                let (dir, owner) = new_run_dir(&root)?;
                procs::remove_on_cleanup_with(dir.clone(), remove_server_dir);
                (dir, Some(owner))
            }
            Lifetime::Detached => {
                let dir = state_dir();
                own_dir(&dir)?;
                procs::remove_on_cleanup_with(dir.clone(), clear_state_dir_quietly);
                (dir, None)
            }
        };
        let mut servers = PrivateServers {
            pg_home: dir.clone(),
            dir,
            urls: Vec::new(),
            pids: Vec::new(),
            started_in: Duration::ZERO,
            lifetime,
            pg_user,
            released: false,
            _owner: owner,
            secrets: Secrets {
                password: room
                    .as_ref()
                    .map_or_else(|| crate::seed::os_hex(24), |room| room.password.clone()),
                admin_password: crate::seed::os_hex(24),
            },
            room,
            admin_url: None,
            redis_aof: false,
            seat_pids: Vec::new(),
            seat_users,
            guard_pid: None,
        };
        let result = servers
            .start_each(backends)
            .and_then(|()| servers.check_etcd_users())
            .and_then(|()| servers.provision_postgres())
            .and_then(|()| servers.start_seats())
            .and_then(|()| servers.start_guard());
        if let Err(err) = result {
            servers.stop();
            return Err(err);
        }
        servers.started_in = started.elapsed();
        Ok(servers)
    }

    fn start_each(&mut self, backends: &[Backend]) -> Result<()> {
        if self.lifetime == Lifetime::Detached {
            // Before anything starts: whatever happens next, `down` finds this record.
            self.record(true)?;
        }
        let wants_postgres = backends.contains(&Backend::Postgres);
        if wants_postgres {
            self.choose_pg_home()?;
        }
        // Redis and etcd start while initdb prepares Postgres's data directory.
        let initdb = if wants_postgres {
            Some(self.start_initdb()?)
        } else {
            None
        };
        let others = backends
            .iter()
            .filter(|b| **b != Backend::Postgres)
            .try_for_each(|backend| self.launch(*backend));
        if let Some(initdb) = initdb {
            if others.is_err() {
                // Not left writing into a directory about to be deleted.
                procs::stop(initdb.pid(), &initdb_stop_plan());
            } else {
                self.finish_initdb(initdb)?;
                self.launch(Backend::Postgres)?;
            }
        }
        others?;
        for try_number in 1.. {
            let waits: Vec<_> = self
                .urls
                .iter()
                .zip(&self.pids)
                .map(|((backend, url), (_, pid))| {
                    let (backend, url, pid) = (*backend, url.clone(), *pid);
                    thread::spawn(move || (backend, wait_until_answering(backend, &url, pid)))
                })
                .collect();
            let mut exited = Vec::new();
            for wait in waits {
                let (backend, outcome) = wait
                    .join()
                    .map_err(|_| anyhow!("a readiness check panicked"))?;
                match outcome {
                    Ok(()) => {}
                    Err(StartFailure::Exited) if try_number < START_TRIES => exited.push(backend),
                    Err(failure) => return Err(self.start_error(backend, failure, try_number)),
                }
            }
            if exited.is_empty() {
                return Ok(());
            }
            // Retried from this thread, for the parent-death signal (see `start`).
            for backend in exited {
                self.stop_one(backend);
                self.launch(backend)?;
            }
        }
        unreachable!("the loop returns")
    }

    /// One line for a server that would not start, with the end of its log: the log is
    /// deleted with the directory, so this line is the only place anyone can read it.
    fn start_error(&self, backend: Backend, failure: StartFailure, tries: u32) -> anyhow::Error {
        let url = self.url(backend).unwrap_or_default();
        let what = match failure {
            StartFailure::Exited if tries > 1 => {
                format!("exited at start-up, {tries} times on {tries} different ports")
            }
            StartFailure::Exited => "exited at start-up".to_string(),
            StartFailure::Silent => format!(
                "did not answer within {}s (overloaded machine?)",
                START_TIMEOUT.as_secs()
            ),
        };
        let log = self.dir.join(format!("{}.log", backend.compose_service()));
        anyhow!(
            "the private {} ({}) {what}{}; the end of its log: {}",
            backend.name(),
            connect::redact(&url),
            full_disk_note(&self.dir),
            log_tail(&log)
        )
    }

    /// Puts the data of the servers that run as other users where those users can reach it.
    ///
    /// As root, Postgres runs as another user, and so do a room's seats' servers (see
    /// [`PrivateServers::seat_users`]); each must be able to enter every directory on the way
    /// to its data. A temporary directory is made so (0711); a real `XDG_RUNTIME_DIR` is not
    /// (0700, and it must stay so). For `lockslab up` the data then goes to a directory of its
    /// own under the temp root, recorded in the state file.
    fn choose_pg_home(&mut self) -> Result<()> {
        let Some(user) = &self.pg_user else {
            return Ok(());
        };
        // A seat's user has no account and no group: it enters what everyone may.
        let seat_user = self.seat_users.first().map(|&(uid, gid)| RunAs {
            name: String::new(),
            uid,
            gid,
        });
        let who = |user: &RunAs| {
            if user.name.is_empty() {
                format!(
                    "the seats' servers run as users of their own (uids from {})",
                    SEAT_UIDS.start
                )
            } else {
                format!(
                    "Postgres runs as user `{}` (it refuses to run as root)",
                    user.name
                )
            }
        };
        let blocked_on_way_to = |dir: &Path| {
            std::iter::once(user)
                .chain(seat_user.as_ref())
                .find_map(|user| Some((who(user), user.blocked_on_way_to(dir)?)))
        };
        let Some((who_first, (blocked, mode))) = blocked_on_way_to(&self.dir) else {
            return Ok(());
        };
        let why = format!(
            "{who_first}, and that user cannot enter {} (mode {mode:o})",
            blocked.display()
        );
        if self.lifetime == Lifetime::ThisRun {
            bail!("{why}: set TMPDIR to a directory it can enter, e.g. TMPDIR=/tmp");
        }
        let home = tempfile::Builder::new()
            .prefix("lockslab-up-")
            .tempdir()
            .context("creating a directory for `lockslab up`'s Postgres")?
            .keep();
        procs::remove_on_cleanup_with(home.clone(), remove_server_dir);
        self.pg_home = home;
        fs::set_permissions(&self.pg_home, fs::Permissions::from_mode(0o711))?;
        self.record(true)?;
        if let Some((_, (blocked, mode))) = blocked_on_way_to(&self.pg_home) {
            bail!(
                "{why}, nor {} (mode {mode:o}): set LOCKSLAB_STATE_DIR or TMPDIR to a directory it can enter, e.g. /tmp",
                blocked.display()
            );
        }
        Ok(())
    }

    fn pg_data(&self) -> PathBuf {
        self.pg_home.join("pg")
    }

    /// Starts making the private Postgres's cluster, as a registered child tied to this
    /// process like every other: an interrupt stops it, and lockslab's death kills it.
    ///
    /// From a copy of the template a fresh `initdb` left (see [`pg_template`]) when there is
    /// one: the child then only gives the copy its superuser password. Otherwise `initdb`
    /// itself (SIGTERM: it finishes its step and removes what it wrote, and its own
    /// `postgres` child ends normally, releasing its shared memory; lockslab's death leaves
    /// that child end-of-input, and it ends normally too). Either way [`Self::finish_initdb`]
    /// waits for it.
    fn start_initdb(&mut self) -> Result<ClusterStep> {
        let data = self.pg_data();
        let owner = self.pg_user.as_ref().map(|u| (u.uid, u.gid));
        let initdb_binary = find_binary("initdb", Backend::Postgres)?;
        if let Some(template) = pg_template::find(&initdb_binary) {
            match pg_template::copy_tree(&template, &data, owner, false) {
                Ok(()) => {
                    return self
                        .start_password_setter()
                        .map(ClusterStep::SettingPassword);
                }
                // A template that cannot be copied is only a slower start.
                Err(_) => remove_copy(&data),
            }
        }
        fs::create_dir_all(&data)?;
        if let Some((uid, gid)) = owner {
            nix::unistd::chown(&data, Some(uid), Some(gid))
                .context("handing the Postgres directory to its user")?;
        }
        let mut initdb = Command::new(&initdb_binary);
        // initdb demands a superuser password for password authentication. This one is
        // thrown away: the cluster becomes a template for later starts, and each start (this
        // one too) gives the superuser a password of its own before any server runs on it.
        // In a file only its user can read, never on a command line (`ps` shows those to
        // everyone); deleted once initdb is done. Every connection, over TCP or the Unix
        // socket, must give a password.
        let file = self.pg_home.join("admin-password");
        write_secret(&file, &crate::seed::os_hex(24))?;
        if let Some((uid, gid)) = owner {
            nix::unistd::chown(&file, Some(uid), Some(gid))?;
        }
        initdb
            .arg("-D")
            .arg(&data)
            .arg("--auth=scram-sha-256")
            .arg(format!("--pwfile={}", file.display()));
        initdb
            .args([
                "-U",
                PG_ADMIN,
                "--no-sync",
                "-E",
                "UTF8",
                "--no-instructions",
            ])
            .current_dir(&data)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // Kept in memory, not in a file: on a full disk the file would stay empty, and
            // the one line that says why would be lost.
            .stderr(Stdio::piped());
        as_user(&mut initdb, owner);
        procs::spawn_registered(&mut initdb, initdb_stop_plan())
            .context("running initdb")
            .map(|child| ClusterStep::Initdb(child, initdb_binary))
    }

    /// Gives the superuser of the cluster in [`Self::pg_data`] this start's password, with
    /// Postgres in single-user mode: no port, no socket, nobody else connected. The password
    /// goes through its stdin, never a command line, and no log line quotes the statement.
    fn start_password_setter(&self) -> Result<Child> {
        let data = self.pg_data();
        let mut command = Command::new(find_binary("postgres", Backend::Postgres)?);
        command
            .arg("--single")
            .arg("-D")
            .arg(&data)
            .args([
                "-c",
                "log_min_error_statement=panic",
                "-c",
                "password_encryption=scram-sha-256",
                "-c",
                "fsync=off",
                "-c",
                "dynamic_shared_memory_type=mmap",
                "postgres",
            ])
            .current_dir(&data)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_user(&mut command, self.pg_user.as_ref().map(|u| (u.uid, u.gid)));
        let mut setter = procs::spawn_registered(&mut command, initdb_stop_plan())
            .context("running postgres --single to set the superuser's password")?;
        let statement = format!(
            "ALTER ROLE {PG_ADMIN} PASSWORD '{}'\n",
            self.secrets.admin_password
        );
        // Dropped once written: end of input ends the single-user session.
        let written = setter
            .stdin
            .take()
            .map(|mut stdin| stdin.write_all(statement.as_bytes()));
        if let Some(Err(err)) = written {
            procs::stop(setter.id() as i32, &initdb_stop_plan());
            return Err(err).context("giving the private Postgres its superuser's password");
        }
        Ok(setter)
    }

    /// Waits for the step [`Self::start_initdb`] began. After a fresh `initdb`, keeps its
    /// cluster as the template and then gives it this start's superuser password.
    fn finish_initdb(&mut self, step: ClusterStep) -> Result<()> {
        let setter = match step {
            ClusterStep::Initdb(initdb, binary) => {
                let done = wait_for_cluster_step(initdb, "initdb", &self.pg_home);
                let _ = fs::remove_file(self.pg_home.join("admin-password"));
                done?;
                pg_template::keep(&binary, &self.pg_data());
                self.start_password_setter()?
            }
            ClusterStep::SettingPassword(setter) => setter,
        };
        wait_for_cluster_step(
            setter,
            "setting the Postgres superuser's password",
            &self.pg_home,
        )?;
        if self.room.is_some() {
            // initdb lets in loopback clients only; a room's attendees come from the LAN,
            // and every one of them must give the password.
            let mut hba = fs::OpenOptions::new()
                .append(true)
                .open(self.pg_data().join("pg_hba.conf"))
                .context("opening pg_hba.conf")?;
            writeln!(hba, "host all all 0.0.0.0/0 scram-sha-256")?;
            writeln!(hba, "host all all ::/0 scram-sha-256")?;
        }
        Ok(())
    }

    fn launch(&mut self, backend: Backend) -> Result<()> {
        self.launch_on(backend, free_port_on(self.host_for(backend))?)
    }

    /// Where the seats' servers listen: loopback, or a room's address.
    fn host(&self) -> std::net::IpAddr {
        self.room
            .as_ref()
            .map_or(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), |room| room.addr)
    }

    /// Where the instructor's own server of `backend` listens: loopback, always. In a room
    /// Postgres is reached from the room's address (it holds the seats' databases and the
    /// room's results), but through the room's guard (see [`PrivateServers::start_guard`]);
    /// the instructor's Redis and etcd serve no seat — each seat has its own — so they are
    /// out of reach of everyone in the room. That matters most for etcd: 3.4 asks no
    /// password to compact, nor for lease calls (see [`SEAT_ETCD_QUOTA_BYTES`]).
    fn host_for(&self, _backend: Backend) -> std::net::IpAddr {
        std::net::IpAddr::V4(Ipv4Addr::LOCALHOST)
    }

    fn launch_on(&mut self, backend: Backend, port: u16) -> Result<()> {
        let log = self.dir.join(format!("{}.log", backend.compose_service()));
        let host = self.host_for(backend);
        let at = std::net::SocketAddr::new(host, port).to_string();
        let host = host.to_string();
        let password = self.secrets.password.clone();
        let (mut command, url, stop_signal) = match backend {
            Backend::Redis => {
                // In a config file only we can read, not on the command line.
                let conf = self.dir.join("redis-auth.conf");
                write_secret(&conf, &format!("requirepass {password}\n"))?;
                let command = self.redis_command(&conf, &at, &self.dir)?;
                (
                    command,
                    // `default:` spelled out: Debian 12's `redis-cli -u` sends a URL's
                    // password alone only with a user name before it.
                    format!("redis://default:{password}@{at}"),
                    Signal::SIGTERM,
                )
            }
            Backend::Etcd => {
                let home = self.dir.join("etcd");
                if !home.join("data").exists() {
                    make_dir(&home, 0o700, None)?;
                    self.bootstrap_etcds(&[EtcdBoot {
                        home: home.clone(),
                        log: log.clone(),
                        owner: None,
                        seat: None,
                    }])?;
                }
                let command = self.etcd_command(&home, &format!("http://{at}"))?;
                (
                    command,
                    format!("http://root:{password}@{at}"),
                    Signal::SIGTERM,
                )
            }
            Backend::Postgres => {
                let data = self.pg_data();
                let mut command = Command::new(find_binary("postgres", backend)?);
                command
                    .arg("-D")
                    .arg(&data)
                    .args(["-p", &port.to_string(), "-c"])
                    .arg(format!("listen_addresses={host}"))
                    .arg("-c")
                    .arg(format!("unix_socket_directories={}", data.display()))
                    // A throwaway server: durability off, room for a workshop's connections.
                    .args([
                        "-c",
                        "fsync=off",
                        "-c",
                        "synchronous_commit=off",
                        "-c",
                        "full_page_writes=off",
                    ])
                    .arg("-c")
                    .arg(format!(
                        "max_connections={}",
                        if let Some(room) = &self.room {
                            room_pg_connections(room.seats.len() as i64)
                        } else {
                            200
                        }
                    ))
                    // Dynamic shared memory in the data directory rather than /dev/shm: if
                    // the server is killed, it goes with the directory.
                    .args(["-c", "dynamic_shared_memory_type=mmap"]);
                if self.room.is_some() {
                    command.arg("-c").arg(format!(
                        "authentication_timeout={ROOM_PG_AUTHENTICATION_TIMEOUT_S}s"
                    ));
                }
                as_user(&mut command, self.pg_user.as_ref().map(|u| (u.uid, u.gid)));
                // SIGINT is Postgres's fast shutdown: it does not wait for clients to leave.
                (
                    command,
                    // The superuser's URL until `provision_postgres` has made the labs'
                    // role; from then on the labs' URL replaces it.
                    format!(
                        "postgres://{PG_ADMIN}:{}@{at}/postgres",
                        self.secrets.admin_password
                    ),
                    Signal::SIGINT,
                )
            }
        };
        // Every server works in its own directory: `down` and the sweep recognise a server
        // by its working directory (Redis rewrites its command line; the others name it).
        let workdir = match backend {
            Backend::Postgres => self.pg_data(),
            Backend::Etcd => self.dir.join("etcd"),
            Backend::Redis => self.dir.clone(),
        };
        let plan = StopPlan {
            signal: stop_signal,
            grace: Duration::from_secs(5),
        };
        let pid = self.spawn_server(&mut command, &workdir, &log, plan, backend.name(), None)?;
        // Known as ours before the first readiness probe: a probe refused while the server
        // is still starting must not mark its URL as a server that went away.
        connect::note_source(
            &url,
            match self.lifetime {
                Lifetime::ThisRun => connect::Source::Private,
                Lifetime::Detached => connect::Source::Up,
            },
        );
        self.urls.push((backend, url));
        self.pids.push((backend, pid));
        if self.lifetime == Lifetime::Detached {
            // Before waiting for it: a `lockslab up` killed now leaves a server `down` finds.
            self.record(true)?;
        }
        Ok(())
    }

    /// A `redis-server` command: its password in `conf`, listening on this start's host at
    /// `port`, persisting nothing unless [`PrivateServers::set_redis_aof`] says so.
    fn redis_command(&self, conf: &Path, at: &str, dir: &Path) -> Result<Command> {
        let at: std::net::SocketAddr = at.parse()?;
        let mut command = Command::new(find_binary("redis-server", Backend::Redis)?);
        command.arg(conf);
        command.args([
            "--port",
            &at.port().to_string(),
            "--bind",
            &at.ip().to_string(),
            "--save",
            "",
            "--appendonly",
            if self.redis_aof { "yes" } else { "no" },
        ]);
        if self.redis_aof {
            command.args(["--appendfsync", "always"]);
        }
        command.arg("--dir").arg(dir);
        Ok(command)
    }

    /// Spawns a server working in `workdir`, its output in `log`: tied to this run, or (for
    /// `lockslab up`) in a session of its own that outlives it; as `owner` (who then owns
    /// the log too), when given. Returns its pid.
    fn spawn_server(
        &self,
        command: &mut Command,
        workdir: &Path,
        log: &Path,
        plan: StopPlan,
        what: &str,
        owner: Option<(Uid, Gid)>,
    ) -> Result<i32> {
        // 0600: a server's log quotes the statements it refused, a seat's among them.
        let log = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(log)?;
        log.set_permissions(fs::Permissions::from_mode(0o600))?;
        if let Some((uid, gid)) = owner {
            nix::unistd::fchown(&log, Some(uid), Some(gid))?;
        }
        as_user(command, owner);
        command
            .current_dir(workdir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        Ok(match self.lifetime {
            Lifetime::ThisRun => procs::spawn_registered(command, plan)
                .with_context(|| format!("starting a private {what}"))?
                .id() as i32,
            Lifetime::Detached => {
                // Outlives this command: its own session, no parent-death signal, and the
                // signals `lockslab down` stops it with unblocked (this thread blocks them).
                let unblock = procs::interrupt_signals();
                // SAFETY: setsid and sigprocmask are async-signal-safe and touch nothing but
                // this process.
                unsafe {
                    command.pre_exec(move || {
                        unblock.thread_unblock()?;
                        nix::unistd::setsid().map(drop).map_err(Into::into)
                    });
                }
                // Reaped by init once `lockslab up` exits; until then, registered so that a
                // failed or interrupted `up` does not leave it behind.
                procs::spawn_untied_registered(command, plan)
                    .with_context(|| format!("starting a private {what}"))?
                    .id() as i32
            }
        })
    }

    /// Postgres: as the superuser, creates the labs' role and its database, and closes the
    /// other databases to everyone but the superuser. From then on the server is named by
    /// the labs' URL.
    ///
    /// Every role lockslab itself uses gets a `search_path` fixed on the role, naming only
    /// schemas no other role can create or write in (the advice after CVE-2018-1058):
    /// without it, the admin's default `"$user", public` found whatever another role put in
    /// a schema called `lockslab_admin`, and a trigger there ran as superuser. `pg_temp`
    /// comes last, named: left out, it would be searched first for tables.
    /// - the admin: `pg_catalog, pg_temp`, and a schema `lockslab_admin` of its own in the
    ///   labs' database for the tables it keeps (the registry of the runs it grades);
    /// - the labs' role: its own schema `lockslab`, made here so that nobody else can.
    fn provision_postgres(&mut self) -> Result<()> {
        let Some(index) = self.urls.iter().position(|(b, _)| *b == Backend::Postgres) else {
            return Ok(());
        };
        let admin = self.urls[index].1.clone();
        let password = &self.secrets.password;
        let mut client = connect::postgres_for_setup(&admin)?;
        // CREATE DATABASE cannot run inside a transaction block: one statement at a time.
        for statement in [
            format!(
                "CREATE ROLE {PG_ROLE} LOGIN PASSWORD '{password}' \
                 NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS"
            ),
            format!("ALTER ROLE {PG_ADMIN} SET search_path = {ADMIN_SEARCH_PATH}"),
            format!("ALTER ROLE {PG_ROLE} SET search_path = {LABS_SEARCH_PATH}"),
            format!("CREATE DATABASE {PG_ROLE} OWNER {PG_ROLE}"),
            "REVOKE ALL ON DATABASE postgres FROM PUBLIC".to_string(),
            "REVOKE ALL ON DATABASE template1 FROM PUBLIC".to_string(),
        ] {
            client
                .batch_execute(&statement)
                .context("creating the labs' role in the private Postgres")?;
        }
        let at = admin.rsplit_once('@').map_or("", |(_, at)| at);
        let at = at.strip_suffix("/postgres").unwrap_or(at).to_string();
        let admin_in_labs_db = format!(
            "postgres://{PG_ADMIN}:{}@{at}/{PG_ROLE}",
            self.secrets.admin_password
        );
        connect::postgres_for_setup(&admin_in_labs_db)?
            .batch_execute(&format!(
                "CREATE SCHEMA {PG_ROLE} AUTHORIZATION {PG_ROLE};
                 CREATE SCHEMA {PG_ADMIN} AUTHORIZATION {PG_ADMIN};
                 REVOKE ALL ON SCHEMA public FROM PUBLIC;"
            ))
            .context("creating the labs' schemas in the private Postgres")?;
        drop(client);
        self.admin_url = Some(admin.clone());
        let url = format!("postgres://{PG_ROLE}:{password}@{at}/{PG_ROLE}");
        connect::note_source(
            &url,
            match self.lifetime {
                Lifetime::ThisRun => connect::Source::Private,
                Lifetime::Detached => connect::Source::Up,
            },
        );
        self.urls[index].1 = url;
        if self.lifetime == Lifetime::Detached {
            self.record(true)?;
        }
        Ok(())
    }

    /// A room's seats in Postgres: a role each, with a database of its own named like it
    /// (and in it a schema named like it, its `search_path`), where the store's and the
    /// labs' tables land, and where it may create whatever its runs need (lab 7 and the
    /// challenge make a schema per run). In the labs' database a seat creates nothing: it
    /// may only add rows to the room's results. Each seat has a connection limit of one lab
    /// run ([`PG_CONNECTIONS_PER_LAB`]).
    ///
    /// Why a database per seat rather than a schema per seat in a shared one: a seat's runs
    /// need to create schemas, and `CREATE ON DATABASE` lets a seat name a schema anything —
    /// `lockslab`, `lockslab_admin`, a name that shadows one another role searches. In a
    /// database of its own a seat may do that harmlessly, as no other role lockslab uses
    /// ever runs a statement there (the admin creates it from the `postgres` database, and
    /// the seat makes its schema itself). It also keeps a seat's table names out of the
    /// other seats' catalogs. The cost, one `CREATE DATABASE` per seat at `up`, is paid once.
    ///
    /// `admin_url` is the superuser's URL, on the `postgres` database.
    fn seat_postgres_roles(room: &Room, admin_url: &str) -> Result<()> {
        let mut admin = connect::postgres_for_setup(admin_url)?;
        let mut statements = room_results_sql(PG_ROLE);
        for seat in &room.seats {
            let (name, password) = (&seat.name, &seat.password);
            for statement in [
                format!(
                    "CREATE ROLE {name} LOGIN PASSWORD '{password}' \
                     NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS \
                     CONNECTION LIMIT {PG_CONNECTIONS_PER_LAB}"
                ),
                format!("ALTER ROLE {name} SET search_path = {name}, pg_catalog, pg_temp"),
                format!("CREATE DATABASE {name} OWNER {name}"),
                format!("REVOKE ALL ON DATABASE {name} FROM PUBLIC"),
            ] {
                admin
                    .batch_execute(&statement)
                    .with_context(|| format!("creating the room's seat {name} in Postgres"))?;
            }
            connect::postgres_for_setup(&on_database(&with_user(admin_url, name, password), name))?
                .batch_execute(&format!("CREATE SCHEMA {name}"))
                .with_context(|| format!("creating the schema of seat {name} in Postgres"))?;
            statements.extend(room_results_grants_sql(name));
        }
        connect::postgres_for_setup(&on_database(admin_url, PG_ROLE))?
            .batch_execute(&statements.join(";\n"))
            .context("granting the room's seats their results in Postgres")
    }

    /// A room's seats: their roles and databases in Postgres (see
    /// [`PrivateServers::seat_postgres_roles`]), and meanwhile their own servers. A
    /// `CREATE DATABASE` per seat is the longest part of a room's start (about five seconds
    /// for thirty seats): the servers start in its shadow.
    fn start_seats(&mut self) -> Result<()> {
        let Some(room) = self.room.clone() else {
            return Ok(());
        };
        let admin = self.admin_url.clone();
        thread::scope(|scope| {
            let databases = scope.spawn(|| match &admin {
                Some(admin) => Self::seat_postgres_roles(&room, admin),
                None => Ok(()),
            });
            let servers = self.start_seat_servers();
            let databases = databases
                .join()
                .unwrap_or_else(|_| Err(anyhow!("creating the seats in Postgres panicked")));
            servers.and(databases)
        })
    }

    /// A seat's own servers: a `redis-server` and an `etcd` per seat, started with the room,
    /// listening on the room's address on ports of their own, stopped with the room.
    ///
    /// Why not one Redis with an ACL user per seat: Redis runs every command, and every Lua
    /// script, on one thread. The labs need `EVAL` (the lock's compare-and-delete), and a
    /// script that never ends (`EVAL "while true do end" 0`) holds that thread: every other
    /// client gets `BUSY` until someone with `SCRIPT KILL` stops it — and it can be sent again
    /// at once. No ACL rule can let a seat run scripts and forbid slow ones. One server per
    /// seat confines the damage to the seat that did it (who may `SCRIPT KILL` its own), and
    /// makes the other questions moot: `SCAN` lists only the seat's own keys, and chaos's and
    /// every lab's keys need no pattern to fall inside. A few MB of memory and a port per seat
    /// are the price.
    ///
    /// Why not one etcd with a user per seat, limited to the seat's key prefix: etcd's
    /// permissions cover keys, not the server. Any user may compact the history, which
    /// cancels every watch that starts from an older revision — and the labs watch that way;
    /// and etcd 3.4 lets any user list every lease and keep any of them alive
    /// (CVE-2023-32082), so one seat could keep another's lock from ever expiring. On an etcd
    /// of its own a seat compacts its own history and sees its own leases. About 25 MB of
    /// memory per seat is the price.
    ///
    /// What a password would not stop: etcd 3.4 (Debian 12's) asks none at all for a
    /// compaction or a lease call (grant, list, time-to-live with the key names,
    /// keep-alive), nor for `auth disable` once its `NOSPACE` alarm is up — which lease
    /// grants alone can raise. So a seat's etcd speaks TLS and ends every handshake without
    /// a client certificate of that seat's authority (see [`crate::etcd_tls`]): whoever
    /// else reaches its port gets no further.
    ///
    /// Each demands a password: the seat's user (see [`Seat::redis_acl`],
    /// [`Seat::add_to_etcd`]), and the instructor's — Redis's `default` user and etcd's `root`,
    /// with the seat's own admin password ([`Seat::admin_password`], not the room's). Limits keep one seat from spending the machine's memory and
    /// disk: [`SEAT_REDIS_MAXMEMORY_MB`] with no eviction (a lock server must never drop a key to
    /// make room), [`SEAT_REDIS_ADDRESS_SPACE`] for what a script writes past it, and
    /// [`SEAT_ETCD_QUOTA_BYTES`].
    fn start_seat_servers(&mut self) -> Result<()> {
        let Some(room) = self.room.clone() else {
            return Ok(());
        };
        let backends: Vec<Backend> = [Backend::Redis, Backend::Etcd]
            .into_iter()
            .filter(|backend| self.url(*backend).is_some())
            .collect();
        // As root, each seat's user passes through it to the seat's own directory.
        let mode = if self.seat_users.is_empty() {
            0o700
        } else {
            0o711
        };
        make_dir(&self.pg_home.join(SEATS_DIR), mode, None)?;
        let mut boots = Vec::new();
        for (index, seat) in room.seats.iter().enumerate() {
            let home = self.seat_home(index);
            let owner = self.seat_users.get(index).copied();
            make_dir(&home, 0o700, owner)?;
            make_dir(&home.join("etcd"), 0o700, owner)?;
            if backends.contains(&Backend::Etcd) {
                self.certify_seat_etcd(index, &home.join("etcd"), owner)?;
            }
            boots.push(EtcdBoot {
                home: home.join("etcd"),
                log: home.join("etcd.log"),
                owner,
                seat: Some(seat.clone()),
            });
        }
        if backends.contains(&Backend::Etcd) {
            self.bootstrap_etcds(&boots)?;
        }
        self.start_for_each_seat(&backends)?;
        if !backends.contains(&Backend::Etcd) {
            return Ok(());
        }
        let checks: Vec<_> = (0..room.seats.len())
            .map(|index| {
                let root = self.seat_url(
                    Backend::Etcd,
                    index,
                    "root",
                    &room.seats[index].admin_password,
                );
                let seat = room.seats[index].clone();
                thread::spawn(move || check_no_one_else_got_in(&root, &[seat]))
            })
            .collect();
        for check in checks {
            check
                .join()
                .map_err(|_| anyhow!("a check of a seat's etcd panicked"))??;
        }
        Ok(())
    }

    /// Signs the certificates of the etcd of the room's seat number `index` (see
    /// [`crate::etcd_tls`]): the server's go to files in `etcd_home` for the seat's user, the
    /// attendee's and the instructor's to the seat (and so to the state file).
    fn certify_seat_etcd(
        &mut self,
        index: usize,
        etcd_home: &Path,
        owner: Option<(Uid, Gid)>,
    ) -> Result<()> {
        let Some(room) = &mut self.room else {
            bail!("seats come with a room");
        };
        let seat = &mut room.seats[index];
        let signed = crate::etcd_tls::SeatCertificates::generate(&seat.name, room.addr)
            .with_context(|| format!("signing the certificates of {}'s etcd", seat.name))?;
        for (file, pem) in [
            (ETCD_CA_FILE, &signed.server.ca),
            (ETCD_CERT_FILE, &signed.server.cert),
            (ETCD_KEY_FILE, &signed.server.key),
        ] {
            let path = etcd_home.join(file);
            write_secret(&path, pem)?;
            hand_over(&path, owner)?;
        }
        seat.etcd_tls = Some(signed.seat.encode());
        seat.instructor_etcd_tls = Some(signed.instructor.encode());
        Ok(())
    }

    /// A room's guard: the one process on the room's address in front of Postgres and each
    /// seat's Redis, which listen on loopback only (see [`crate::proxy::guard`]). lockslab
    /// binds each door's socket here, on a port the kernel chooses, and hands it to the
    /// guard's process as an open file descriptor: no other process can take the port in
    /// between, and connections queue from this moment. From then on the URLs of Postgres
    /// (the instructor's too) and of each seat's Redis name the guard's doors.
    ///
    /// The seats' etcds stay on the room's address without it: each ends a connection
    /// without the seat's certificate at its TLS handshake (see [`crate::etcd_tls`]).
    fn start_guard(&mut self) -> Result<()> {
        let Some(room) = self.room.clone() else {
            return Ok(());
        };
        let mut doors: Vec<(Protocol, std::net::TcpListener, std::net::SocketAddr)> = Vec::new();
        let bind = || {
            std::net::TcpListener::bind((room.addr, 0))
                .with_context(|| format!("listening on the room's address {}", room.addr))
        };
        let postgres = self.url(Backend::Postgres);
        if let Some(url) = &postgres {
            doors.push((Protocol::Postgres, bind()?, crate::proxy::upstream_of(url)?));
        }
        for seat in &room.seats {
            if let Some(inner) = &seat.redis {
                doors.push((Protocol::Redis, bind()?, inner.parse()?));
            }
        }
        let fds: Vec<i32> = doors.iter().map(|(_, l, _)| l.as_raw_fd()).collect();
        let mut command = Command::new(std::env::current_exe()?);
        command.arg("__guard");
        for ((protocol, _, server), fd) in doors.iter().zip(&fds) {
            command.arg(guard::Door::argument(*protocol, *fd, *server));
        }
        // SAFETY: fcntl is async-signal-safe; it only lets the child keep these sockets.
        unsafe {
            command.pre_exec(move || {
                for fd in &fds {
                    if nix::libc::fcntl(*fd, nix::libc::F_SETFD, 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        let log = self.dir.join(GUARD_LOG);
        let pid = self.spawn_server(
            &mut command,
            &self.dir.clone(),
            &log,
            guard_stop_plan(),
            "guard",
            None,
        )?;
        self.guard_pid = Some(pid);
        let mut public = doors
            .iter()
            .map(|(_, listener, _)| listener.local_addr().map(|at| at.to_string()));
        if let Some(url) = postgres {
            let at = public.next().context("the guard's Postgres door")??;
            let inner = crate::proxy::upstream_of(&url)?.to_string();
            let through = |url: &str| url.replacen(&format!("@{inner}/"), &format!("@{at}/"), 1);
            self.admin_url = self.admin_url.as_deref().map(through);
            for (backend, url) in &mut self.urls {
                if *backend == Backend::Postgres {
                    *url = through(url);
                    connect::note_source(url, connect::Source::Up);
                }
            }
        }
        let room = self.room.as_mut().context("a guard comes with a room")?;
        for seat in room.seats.iter_mut().filter(|seat| seat.redis.is_some()) {
            seat.redis = Some(public.next().context("a seat's Redis door")??);
            connect::note_source(&seat.redis_url().unwrap_or_default(), connect::Source::Up);
        }
        // The sockets are the guard's now.
        drop(doors);
        if self.lifetime == Lifetime::Detached {
            self.record(true)?;
        }
        // Through the guard, as every seat comes: it answers once it runs.
        if let Some(url) = self.url(Backend::Postgres)
            && let Err(failure) = wait_until_answering(Backend::Postgres, &url, pid)
        {
            bail!(
                "the room's guard did not start ({}); the end of its log: {}",
                failure.words(),
                log_tail(&log)
            );
        }
        Ok(())
    }

    /// The directory of the room's seat number `index`: its Redis config, its etcd's data
    /// (`etcd`), their logs. 0700, and the seat's user's when lockslab runs as root.
    fn seat_home(&self, index: usize) -> PathBuf {
        let name = self
            .room
            .as_ref()
            .and_then(|room| room.seats.get(index))
            .map_or("seat", |seat| seat.name.as_str());
        self.pg_home.join(SEATS_DIR).join(name)
    }

    /// Starts each seat's server of each of `backends`, waits for them all at once (thirty
    /// seats start in the time of one), and starts again, on a new port, those that exited
    /// at start-up (see [`START_TRIES`]).
    fn start_for_each_seat(&mut self, backends: &[Backend]) -> Result<()> {
        let seats = self.room.as_ref().map_or(0, |room| room.seats.len());
        let mut waiting: Vec<(Backend, usize)> = backends
            .iter()
            .flat_map(|&backend| (0..seats).map(move |index| (backend, index)))
            .collect();
        for try_number in 1..=START_TRIES {
            let mut launched = Vec::new();
            for &(backend, index) in &waiting {
                launched.push((backend, index, self.launch_for_seat(backend, index)?));
            }
            let waits: Vec<_> = launched
                .into_iter()
                .map(|(backend, index, pid)| {
                    let url = self.seat_attendee_url(backend, index);
                    thread::spawn(move || {
                        let outcome = wait_until_answering(backend, &url, pid);
                        (backend, index, pid, outcome)
                    })
                })
                .collect();
            waiting.clear();
            for wait in waits {
                let (backend, index, pid, outcome) = wait
                    .join()
                    .map_err(|_| anyhow!("a readiness check panicked"))?;
                let Err(failure) = outcome else {
                    continue;
                };
                self.seat_pids.retain(|(_, p)| *p != pid);
                procs::stop(pid, &stop_plan(backend));
                if try_number == START_TRIES || matches!(failure, StartFailure::Silent) {
                    let log = self
                        .seat_home(index)
                        .join(format!("{}.log", backend.compose_service()));
                    bail!(
                        "the {} of seat{:02} did not start ({}); the end of its log: {}",
                        backend.name(),
                        index + 1,
                        failure.words(),
                        log_tail(&log)
                    );
                }
                waiting.push((backend, index));
            }
            if waiting.is_empty() {
                break;
            }
        }
        if self.lifetime == Lifetime::Detached {
            self.record(true)?;
        }
        Ok(())
    }

    /// Starts the `backend` server of the room's seat number `index` on a free port, as the
    /// seat's user when there is one; returns its pid. Its Redis listens on loopback, for
    /// the room's guard to stand in front of (see [`PrivateServers::start_guard`]); its
    /// etcd on the room's address, where it lets in no one without the seat's certificate.
    fn launch_for_seat(&mut self, backend: Backend, index: usize) -> Result<i32> {
        let host = match backend {
            Backend::Redis => std::net::IpAddr::V4(Ipv4Addr::LOCALHOST),
            _ => self.host(),
        };
        let at = std::net::SocketAddr::new(host, free_port_on(host)?).to_string();
        let home = self.seat_home(index);
        let owner = self.seat_users.get(index).copied();
        let Some(room) = &mut self.room else {
            bail!("seats come with a room");
        };
        let seat = &mut room.seats[index];
        match backend {
            Backend::Redis => seat.redis = Some(at.clone()),
            _ => seat.etcd = Some(at.clone()),
        }
        seat.trust_etcd_as_instructor();
        let seat = seat.clone();
        let (mut command, workdir) = match backend {
            Backend::Redis => {
                let conf = home.join("redis.conf");
                write_secret(&conf, &seat_redis_config(&seat))?;
                hand_over(&conf, owner)?;
                let mut command = self.redis_command(&conf, &at, &home)?;
                // SAFETY: setrlimit is async-signal-safe and changes nothing but the child.
                unsafe {
                    command.pre_exec(|| {
                        let limit = nix::libc::rlimit {
                            rlim_cur: SEAT_REDIS_ADDRESS_SPACE,
                            rlim_max: SEAT_REDIS_ADDRESS_SPACE,
                        };
                        if nix::libc::setrlimit(nix::libc::RLIMIT_AS, &limit) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                        Ok(())
                    });
                }
                (command, home.clone())
            }
            Backend::Etcd => {
                let mut command =
                    self.etcd_command(&home.join("etcd"), &format!("https://{at}"))?;
                command.args(["--quota-backend-bytes", &SEAT_ETCD_QUOTA_BYTES.to_string()]);
                // Relative to its working directory, the seat's etcd home.
                command
                    .args(["--client-cert-auth", "--trusted-ca-file", ETCD_CA_FILE])
                    .args(["--cert-file", ETCD_CERT_FILE, "--key-file", ETCD_KEY_FILE]);
                (command, home.join("etcd"))
            }
            Backend::Postgres => bail!("a seat's Postgres is a database of the room's"),
        };
        let log = home.join(format!("{}.log", backend.compose_service()));
        let what = format!("{} for {}", backend.name(), seat.name);
        let pid = self.spawn_server(
            &mut command,
            &workdir,
            &log,
            stop_plan(backend),
            &what,
            owner,
        )?;
        self.seat_pids.push((backend, pid));
        connect::note_source(&self.seat_attendee_url(backend, index), connect::Source::Up);
        if self.lifetime == Lifetime::Detached {
            // Before waiting for it: a `lockslab up` killed now leaves a server `down` finds.
            self.record(true)?;
        }
        Ok(pid)
    }

    /// The URL of a seat's own `backend` server, as its attendee uses it.
    fn seat_attendee_url(&self, backend: Backend, index: usize) -> String {
        let seat = self.room.as_ref().and_then(|room| room.seats.get(index));
        match backend {
            Backend::Redis => seat.and_then(Seat::redis_url),
            _ => seat.and_then(Seat::etcd_url),
        }
        .unwrap_or_default()
    }

    /// The URL of a seat's own `backend` server as `user` with `password`.
    fn seat_url(&self, backend: Backend, index: usize, user: &str, password: &str) -> String {
        with_user(&self.seat_attendee_url(backend, index), user, password)
    }

    /// An `etcd` command for a cluster of one, run in `home`: its data in `home/data`, its
    /// clients served at `client` (a URL), its peers at [`ETCD_PEER_SOCKET`].
    fn etcd_command(&self, home: &Path, client: &str) -> Result<Command> {
        let peer = format!("unix://{ETCD_PEER_SOCKET}");
        let mut command = Command::new(find_binary("etcd", Backend::Etcd)?);
        command
            .args(["--name", "lockslab", "--data-dir"])
            .arg(home.join("data"))
            .args([
                "--listen-client-urls",
                client,
                "--advertise-client-urls",
                client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("lockslab={peer}")])
            // A one-member cluster elects itself; short timers make that take milliseconds.
            .args(["--heartbeat-interval", "50", "--election-timeout", "300"])
            // Auth is always on (see `Secrets`), and etcd checks the password with bcrypt at
            // each client's log-in: at the default cost 10 that is tens of milliseconds of CPU
            // per worker. The password is 96 random bits, which no cost factor needs to slow
            // down guessing of.
            .args(["--bcrypt-cost", "4"]);
        // etcd makes its sockets (and files) with the umask: for its own user only.
        // SAFETY: umask is async-signal-safe and changes nothing but the child.
        unsafe {
            command.pre_exec(|| {
                nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
                Ok(())
            });
        }
        Ok(command)
    }

    /// Starts each fresh etcd of `boots` listening on a Unix socket in its home and nowhere
    /// else, gives it `root` with this start's password (and its seat's user), turns auth on,
    /// and kills it. Started again on its real address, with the same data, it demands a
    /// password from its first request.
    ///
    /// etcd can only be given users once it runs. Started on its real address, it served
    /// whoever came, with no password, until `auth enable` (a second or so for a room): time
    /// for someone on the room's network, or another local user, to add a user of their own
    /// that keeps its rights afterwards. The socket is in a directory only the etcd's user
    /// (and root) may enter. The second start costs about half a second, paid by every seat
    /// at once.
    ///
    /// Killed rather than stopped (SIGTERM takes over a second): etcd syncs each change to
    /// its write-ahead log before answering it, so an `auth enable` answered is kept.
    fn bootstrap_etcds(&self, boots: &[EtcdBoot]) -> Result<()> {
        let mut pids = Vec::new();
        let given = (|| {
            for boot in boots {
                let socket = boot.home.join(ETCD_BOOT_SOCKET);
                // A socket's path is at most 107 bytes (`sun_path`).
                if socket.as_os_str().len() > 107 {
                    bail!(
                        "{} is too long a path for a Unix socket: set LOCKSLAB_STATE_DIR or \
                         TMPDIR to a shorter one",
                        socket.display()
                    );
                }
                let client = format!("unix://{ETCD_BOOT_SOCKET}");
                let mut command = self.etcd_command(&boot.home, &client)?;
                pids.push(self.spawn_server(
                    &mut command,
                    &boot.home,
                    &boot.log,
                    StopPlan::kill(),
                    &boot.what(),
                    boot.owner,
                )?);
            }
            let password = self.secrets.password.as_str();
            thread::scope(|scope| {
                let givers: Vec<_> = boots
                    .iter()
                    .zip(&pids)
                    .map(|(boot, &pid)| scope.spawn(move || boot.give_users(pid, password)))
                    .collect();
                givers.into_iter().try_for_each(|giver| {
                    giver
                        .join()
                        .unwrap_or_else(|_| Err(anyhow!("giving an etcd its users panicked")))
                })
            })
        })();
        for (boot, pid) in boots.iter().zip(pids) {
            procs::stop(pid, &StopPlan::kill());
            let _ = fs::remove_file(boot.home.join(ETCD_BOOT_SOCKET));
        }
        given
    }

    /// The main etcd's users, read back once it listens on its real address (see
    /// [`check_no_one_else_got_in`]): `root` alone.
    fn check_etcd_users(&self) -> Result<()> {
        match self.url(Backend::Etcd) {
            Some(root) => check_no_one_else_got_in(&root, &[]),
            None => Ok(()),
        }
    }

    /// Stops one server (before starting it again on another port).
    fn stop_one(&mut self, backend: Backend) {
        if let Some(index) = self.pids.iter().position(|(b, _)| *b == backend) {
            let (_, pid) = self.pids.remove(index);
            self.urls.remove(index);
            procs::stop(pid, &stop_plan(backend));
        }
    }

    /// The process id of a private server: for the labs that freeze or kill a server.
    pub fn pid(&self, backend: Backend) -> Option<i32> {
        self.pids
            .iter()
            .find(|(b, _)| *b == backend)
            .map(|(_, pid)| *pid)
    }

    /// Freezes a private server with SIGSTOP: its kernel still accepts connections, and
    /// nothing answers them (a server paused by its VM, or swapping).
    pub fn freeze(&self, backend: Backend) -> Result<()> {
        let pid = self.pid(backend).context("no such private server")?;
        procs::signal_group(pid, Signal::SIGSTOP)
    }

    /// Resumes a server frozen by [`PrivateServers::freeze`].
    pub fn thaw(&self, backend: Backend) -> Result<()> {
        let pid = self.pid(backend).context("no such private server")?;
        procs::signal_group(pid, Signal::SIGCONT)
    }

    /// Kills a private server with SIGKILL, as a crash would, and starts it again on the
    /// same port with the same settings; returns when it answers. A private Redis has no
    /// persistence (`--save ""`, no AOF): it comes back empty, every key and counter gone.
    pub fn crash_and_restart(&mut self, backend: Backend) -> Result<Duration> {
        let url = self.url(backend).context("no such private server")?;
        let port: u16 = url
            .rsplit(':')
            .next()
            .and_then(|tail| tail.split('/').next())
            .and_then(|port| port.parse().ok())
            .with_context(|| format!("no port in {}", connect::redact(&url)))?;
        let started = Instant::now();
        if let Some(index) = self.pids.iter().position(|(b, _)| *b == backend) {
            let (_, pid) = self.pids.remove(index);
            self.urls.remove(index);
            procs::stop(pid, &StopPlan::kill());
        }
        self.launch_on(backend, port)?;
        // Same port, same data, same users: the URL the labs were given still holds.
        if let Some(entry) = self.urls.iter_mut().find(|(b, _)| *b == backend) {
            entry.1 = url.clone();
        }
        let pid = self
            .pid(backend)
            .context("the restarted server has no pid")?;
        wait_until_answering(backend, &url, pid)
            .map_err(|failure| self.start_error(backend, failure, 1))?;
        Ok(started.elapsed())
    }

    /// Whether a private Redis started (or restarted) from now on keeps its data in an
    /// append-only file, fsynced at every write (`--appendonly yes --appendfsync always`).
    pub fn set_redis_aof(&mut self, on: bool) {
        self.redis_aof = on;
    }

    pub fn redis_aof(&self) -> bool {
        self.redis_aof
    }

    pub fn url(&self, backend: Backend) -> Option<String> {
        self.urls
            .iter()
            .find(|(b, _)| *b == backend)
            .map(|(_, url)| url.clone())
    }

    /// What `lockslab up` has started so far, as its state file says it.
    fn up_state(&self, starting: bool) -> UpState {
        let url = |backend| self.url(backend);
        UpState {
            redis: url(Backend::Redis),
            etcd: url(Backend::Etcd),
            postgres: url(Backend::Postgres),
            pids: self
                .pids
                .iter()
                .chain(&self.seat_pids)
                .map(|(_, pid)| *pid)
                .chain(self.guard_pid)
                .collect(),
            dir: self.dir.clone(),
            pg_home: (self.pg_home != self.dir).then(|| self.pg_home.clone()),
            starting,
            room: self.room.as_ref().map(|room| room.addr.to_string()),
            postgres_admin: self.admin_url.clone(),
            seats: self
                .room
                .as_ref()
                .map(|room| room.seats.clone())
                .unwrap_or_default(),
        }
    }

    fn record(&self, starting: bool) -> Result<()> {
        self.up_state(starting).save()
    }

    /// Stops every server and, unless `lockslab up` handed them over, deletes their data.
    ///
    /// All at once: an etcd takes over a second to stop, and a room has one per seat.
    pub fn stop(&mut self) {
        let servers: Vec<(Backend, i32)> = self
            .seat_pids
            .drain(..)
            .chain(self.pids.drain(..))
            .collect();
        let guard = self.guard_pid.take();
        thread::scope(|scope| {
            if let Some(pid) = guard {
                scope.spawn(move || procs::stop(pid, &guard_stop_plan()));
            }
            for (backend, pid) in servers {
                scope.spawn(move || procs::stop(pid, &stop_plan(backend)));
            }
        });
        if self.released {
            return;
        }
        match self.lifetime {
            Lifetime::ThisRun => remove_server_dir(&self.dir),
            Lifetime::Detached => {
                clear_state_dir_quietly(&self.dir);
                if self.pg_home != self.dir {
                    remove_server_dir(&self.pg_home);
                }
            }
        }
        procs::forget_dir(&self.dir);
        procs::forget_dir(&self.pg_home);
    }

    /// After a successful `lockslab up`: the servers are no longer this process's to stop.
    fn release_detached(&mut self) -> Result<()> {
        self.record(false)?;
        for (_, pid) in self.pids.drain(..) {
            procs::forget(pid);
        }
        for (_, pid) in self.seat_pids.drain(..) {
            procs::forget(pid);
        }
        if let Some(pid) = self.guard_pid.take() {
            procs::forget(pid);
        }
        self.released = true;
        procs::forget_dir(&self.dir);
        procs::forget_dir(&self.pg_home);
        Ok(())
    }
}

impl Drop for PrivateServers {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A new file only this user can read, holding a secret a server reads at start-up.
pub(crate) fn write_secret(path: &Path, text: &str) -> Result<()> {
    let _ = fs::remove_file(path);
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))
}

/// Creates the directory `dir` (it must not exist yet) with `mode`, for `owner` when given.
fn make_dir(dir: &Path, mode: u32, owner: Option<(Uid, Gid)>) -> Result<()> {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(dir)
        .and_then(|()| fs::set_permissions(dir, fs::Permissions::from_mode(mode)))
        .with_context(|| format!("creating {}", dir.display()))?;
    hand_over(dir, owner)
}

/// Gives `path` (never what a symlink there points to) to `owner`, when given.
fn hand_over(path: &Path, owner: Option<(Uid, Gid)>) -> Result<()> {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::lchown(path, Some(uid.as_raw()), Some(gid.as_raw()))
            .with_context(|| format!("handing {} to uid {uid}", path.display()))?;
    }
    Ok(())
}

fn stop_plan(backend: Backend) -> StopPlan {
    StopPlan {
        // SIGINT is Postgres's fast shutdown; the others shut down on SIGTERM.
        signal: if backend == Backend::Postgres {
            Signal::SIGINT
        } else {
            Signal::SIGTERM
        },
        grace: Duration::from_secs(5),
    }
}

/// initdb stops cleanly on SIGTERM at the end of its current step, which takes a second or
/// two on a busy machine; SIGKILL would leave its `postgres` child's shared memory behind.
/// The room's guard ends at SIGTERM; it holds nothing to write out.
fn guard_stop_plan() -> StopPlan {
    StopPlan {
        signal: Signal::SIGTERM,
        grace: Duration::from_secs(2),
    }
}

fn initdb_stop_plan() -> StopPlan {
    StopPlan {
        signal: Signal::SIGTERM,
        grace: Duration::from_secs(15),
    }
}

/// What [`PrivateServers::start_initdb`] began: `initdb` (with the binary, whose result
/// becomes the template), or the single-user Postgres that gives a copy its password.
enum ClusterStep {
    Initdb(Child, PathBuf),
    SettingPassword(Child),
}

impl ClusterStep {
    fn pid(&self) -> i32 {
        match self {
            ClusterStep::Initdb(child, _) | ClusterStep::SettingPassword(child) => {
                child.id() as i32
            }
        }
    }
}

/// Waits for one child that makes the private Postgres's cluster (`initdb`, or the
/// password's setter) and fails with the end of what it wrote when it did not succeed. The
/// single-user Postgres exits 0 after a failed statement: its `ERROR` line is the failure.
fn wait_for_cluster_step(mut child: Child, what: &str, pg_home: &Path) -> Result<()> {
    let mut output = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        // Until the child (and any `postgres` it runs) closes it: it ends with them.
        let _ = std::io::Read::read_to_string(&mut stderr, &mut output);
    }
    let status = child.wait().with_context(|| format!("waiting for {what}"));
    procs::forget(child.id() as i32);
    let status = status?;
    let refused = output
        .lines()
        .any(|line| line.contains("ERROR:") || line.contains("FATAL:"));
    if !status.success() || refused {
        bail!(
            "{what} failed ({status}){}; the end of its output: {}",
            full_disk_note(pg_home),
            text_tail(&output)
        );
    }
    Ok(())
}

/// Removes what a copy of the template cut short left, so that `initdb` finds no directory.
fn remove_copy(data: &Path) {
    let _ = fs::remove_dir_all(data);
}

/// Why a private server did not start.
enum StartFailure {
    /// It exited: most often it lost its port to another process. Worth another port.
    Exited,
    /// It runs but does not answer.
    Silent,
}

impl StartFailure {
    fn words(&self) -> &'static str {
        match self {
            StartFailure::Exited => "it exited",
            StartFailure::Silent => "it did not answer",
        }
    }
}

fn wait_until_answering(
    backend: Backend,
    url: &str,
    pid: i32,
) -> std::result::Result<(), StartFailure> {
    wait_until(pid, || connect::probe(backend, url).is_ok())
}

/// Waits until the server started as `pid` `answers`.
fn wait_until(pid: i32, answers: impl Fn() -> bool) -> std::result::Result<(), StartFailure> {
    let deadline = Instant::now() + START_TIMEOUT;
    let gone = || procs::process_state(pid).is_none_or(|state| state == 'Z');
    loop {
        let answered = answers();
        // Whoever answered must be our server, not someone who took the port from it.
        if gone() {
            return Err(StartFailure::Exited);
        }
        if answered {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(StartFailure::Silent);
        }
        thread::sleep(Duration::from_millis(25));
    }
}

/// `: no space left on …` when the file system holding `path` is full (of blocks or of
/// inodes): the cause a server's own log cannot tell, since it could not be written.
fn full_disk_note(path: &Path) -> String {
    match nix::sys::statvfs::statvfs(path) {
        Ok(fs) if fs.blocks_available() == 0 || fs.files_available() == 0 => {
            format!(": no space left on the file system of {}", path.display())
        }
        _ => String::new(),
    }
}

/// The last lines of a server's log, on one line.
pub(crate) fn log_tail(path: &Path) -> String {
    text_tail(&fs::read_to_string(path).unwrap_or_default())
}

/// The last lines of a text, on one line.
fn text_tail(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return "(empty)".to_string();
    }
    lines[lines.len().saturating_sub(3)..]
        .iter()
        .map(|line| line.chars().take(240).collect::<String>())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A port nobody listens on right now. Another process could take it before the server
/// binds it; then the server exits, and [`START_TRIES`] gives it another port.
pub(crate) fn free_port() -> Result<u16> {
    free_port_on(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// A port nobody listens on at `host` right now (see [`free_port`]), and one this process
/// has not handed out before: servers launched together, before any of them binds, would
/// otherwise be given the same port now and then. A room's seats are told apart by their
/// address, so two seats on one port would each be reached with the other's certificate.
fn free_port_on(host: std::net::IpAddr) -> Result<u16> {
    static HANDED_OUT: std::sync::Mutex<Vec<(std::net::IpAddr, u16)>> =
        std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // A kernel hands out ephemeral ports in turn, so a repeat is rare: a few tries find a new one.
    for _ in 0..64 {
        let listener = TcpListener::bind((host, 0))
            .with_context(|| format!("finding a free port on {host} (is it this machine's?)"))?;
        let port = listener.local_addr()?.port();
        if !handed_out.contains(&(host, port)) {
            handed_out.push((host, port));
            return Ok(port);
        }
    }
    bail!("found no port on {host} that this run had not already given to a server")
}

/// Finds a server binary on PATH, or (Postgres) under the usual Debian/Ubuntu locations.
pub fn find_binary(name: &str, backend: Backend) -> Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let mut postgres_dirs: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path().join("bin").join(name))
                .collect()
        })
        .unwrap_or_default();
    postgres_dirs.sort_by(|a, b| b.cmp(a)); // newest version first
    postgres_dirs.push(PathBuf::from("/usr/local/pgsql/bin").join(name));
    let candidates = on_path.into_iter().chain(if backend == Backend::Postgres {
        postgres_dirs
    } else {
        Vec::new()
    });
    for candidate in candidates {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    let package = match backend {
        Backend::Redis => "redis-server",
        Backend::Etcd => "etcd-server",
        Backend::Postgres => "postgresql",
    };
    bail!(
        "no {} server to start: `{name}` is not installed. Install it (`sudo apt-get install {package}`), \
         or give {} a running server, or `docker compose up -d {}`",
        backend.name(),
        backend.flag(),
        backend.compose_service()
    )
}

/// The unprivileged user Postgres runs as when lockslab runs as root.
struct RunAs {
    name: String,
    uid: Uid,
    gid: Gid,
}

impl RunAs {
    /// The first directory on the way to `dir` (or `dir` itself) that this user may not
    /// pass through, with its mode; None when every one lets it in.
    fn blocked_on_way_to(&self, dir: &Path) -> Option<(PathBuf, u32)> {
        let groups = std::ffi::CString::new(self.name.clone())
            .ok()
            .and_then(|name| nix::unistd::getgrouplist(&name, self.gid).ok())
            .unwrap_or_else(|| vec![self.gid]);
        let absolute = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
        for step in absolute.ancestors() {
            let Ok(meta) = fs::metadata(step) else {
                continue; // not made yet: we make it, enterable
            };
            let mode = meta.mode();
            let may_enter = if meta.uid() == self.uid.as_raw() {
                mode & 0o100 != 0
            } else if groups.iter().any(|g| g.as_raw() == meta.gid()) {
                mode & 0o010 != 0
            } else {
                mode & 0o001 != 0
            };
            if !may_enter {
                return Some((step.to_path_buf(), mode & 0o7777));
            }
        }
        None
    }
}

/// Postgres refuses to run as root: as root, run it as the `postgres` user (or `nobody`).
fn unprivileged_owner() -> Result<Option<RunAs>> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        if let Ok(Some(user)) = nix::unistd::User::from_name(name) {
            return Ok(Some(RunAs {
                name: name.to_string(),
                uid: user.uid,
                gid: user.gid,
            }));
        }
    }
    bail!("Postgres will not run as root, and there is no `postgres` or `nobody` user to run it as")
}

fn as_user(command: &mut Command, owner: Option<(Uid, Gid)>) {
    if let Some((uid, gid)) = owner {
        command.uid(uid.as_raw()).gid(gid.as_raw());
    }
}

/// A fresh directory for one run's private servers under `root`, claimed by [`OWNER_LOCK`].
pub(crate) fn new_run_dir(root: &Path) -> Result<(PathBuf, Flock<fs::File>)> {
    let dir = tempfile::Builder::new()
        .prefix("lockslab-")
        .tempdir_in(root)
        .with_context(|| format!("creating a temporary directory in {}", root.display()))?
        .keep();
    let claim = || -> Result<Flock<fs::File>> {
        // The private Postgres may run as another user, who must be able to enter it.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o711))?;
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dir.join(OWNER_LOCK))?;
        let mut lock = Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| errno)?;
        // Written after the lock is taken: a sweep that finds the pid and gets the lock knows
        // the owner is dead; an empty file is a run still being born.
        writeln!(lock, "{}", std::process::id())?;
        Ok(lock)
    };
    claim().map(|lock| (dir.clone(), lock)).map_err(|err| {
        let _ = fs::remove_dir_all(&dir);
        err.context(format!("preparing {}", dir.display()))
    })
}

/// Removes what killed runs left under `root`: each dead run's directory (about 39 MB of
/// Postgres data) and the shared-memory segment its Postgres could not release.
///
/// A SIGKILL gives lockslab no chance to clean up; its servers die with it (parent-death
/// signal) but their data stays. So every start of private servers looks for the leftovers
/// of earlier runs. It is careful on a shared machine: only `lockslab-*` directories owned
/// by this user, only when their [`OWNER_LOCK`] is free (the run that made it is gone), and
/// only when no process still works inside them.
pub(crate) fn sweep_dead_runs(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    let me = Uid::effective().as_raw();
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with("lockslab-") {
            continue;
        }
        let dir = entry.path();
        let ours = fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == me);
        if !ours {
            continue;
        }
        // A run writes its lock and pid within microseconds of making its directory, so
        // one that has shown neither for a minute was killed in between.
        let stale = |path: &Path| {
            fs::symlink_metadata(path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > Duration::from_secs(60)))
        };
        let Ok(file) = fs::File::open(dir.join(OWNER_LOCK)) else {
            // Not a run directory (`lockslab up`'s, another version's) — unless it is an
            // empty one that a run killed at birth left: `remove_dir` takes only an empty one.
            if stale(&dir) {
                let _ = fs::remove_dir(&dir);
            }
            continue;
        };
        let Ok(lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue; // its run is alive
        };
        let owner_written = lock.metadata().is_ok_and(|m| m.len() > 0 && m.uid() == me);
        let killed_at_birth = !owner_written && stale(&dir.join(OWNER_LOCK));
        if (owner_written || killed_at_birth) && processes_in(std::slice::from_ref(&dir)).is_empty()
        {
            remove_server_dir(&dir);
        }
    }
}

/// Deletes a private servers' directory, after releasing the shared memory its Postgres
/// left if it was killed.
///
/// The directory is the only record of that segment (`pg/postmaster.pid` names it), so it
/// stays while a live process still holds the segment: the next start's sweep removes both
/// once that process is gone. [`OWNER_LOCK`] goes last, so that a removal cut short (a
/// SIGKILL, the process exiting) leaves a directory the sweep still recognises as a run's.
pub(crate) fn remove_server_dir(dir: &Path) {
    if !release_shared_memory(&dir.join("pg")) {
        return;
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten().filter(|e| e.file_name() != OWNER_LOCK) {
            let path = entry.path();
            let _ = if path.is_dir() && !path.is_symlink() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
        }
    }
    let _ = fs::remove_dir_all(dir);
}

/// How long a release waits for a dying Postgres to let go of its segment. A second Ctrl-C
/// SIGKILLs initdb's process group, `postgres` child included, and removes the directory
/// right after: for a moment the killed `postgres` is still alive and attached.
const RELEASE_WAIT: Duration = Duration::from_secs(3);

/// Releases the System V shared-memory segment of a dead Postgres; false when a live
/// process still uses it (then it is left alone, and so must the file that names it be).
///
/// Postgres keeps one small segment while it runs and removes it when it shuts down; when
/// it is killed, the segment stays — it belongs to no file, so deleting the data directory
/// does not free it. The data directory's lock file names it (line 7 of `postmaster.pid`:
/// key and id; initdb's own `postgres` writes one too), which lets us release exactly that
/// segment: only if its key still matches and no live process uses it (nobody attached, or
/// its creator — the postmaster — gone).
fn release_shared_memory(pg_data: &Path) -> bool {
    let Ok(text) = fs::read_to_string(pg_data.join("postmaster.pid")) else {
        return true;
    };
    let mut fields = text.lines().nth(6).unwrap_or_default().split_whitespace();
    let key = fields.next().and_then(|k| k.parse::<i64>().ok());
    let id = fields.next().and_then(|i| i.parse::<i32>().ok());
    let (Some(key), Some(id)) = (key, id) else {
        return true;
    };
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        // SAFETY: shmid_ds is plain old data, for which all zeroes is a valid value.
        let mut info: nix::libc::shmid_ds = unsafe { std::mem::zeroed() };
        // SAFETY: IPC_STAT only writes into `info`, a valid, exclusively borrowed shmid_ds.
        if unsafe { nix::libc::shmctl(id, nix::libc::IPC_STAT, &mut info) } != 0 {
            return true; // already gone
        }
        if i64::from(info.shm_perm.__key) != key {
            return true; // the id now names someone else's segment
        }
        let creator_alive = procs::process_state(info.shm_cpid).is_some_and(|state| state != 'Z');
        if info.shm_nattch == 0 || !creator_alive {
            // SAFETY: IPC_RMID takes no buffer; it marks the segment for removal once detached.
            unsafe {
                nix::libc::shmctl(id, nix::libc::IPC_RMID, std::ptr::null_mut());
            }
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Processes that work inside one of `dirs` (their working directory, or a path in their
/// command line): (pid, parent pid, command name).
fn processes_in(dirs: &[PathBuf]) -> Vec<(i32, i32, String)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let inside = |path: &Path| dirs.iter().any(|dir| path.starts_with(dir));
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid == std::process::id() as i32 {
            continue;
        }
        let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        let cwd = fs::read_link(entry.path().join("cwd")).unwrap_or_default();
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let in_args = cmdline
            .split(|b| *b == 0)
            .any(|arg| inside(Path::new(std::ffi::OsStr::from_bytes(arg))));
        if inside(&cwd) || in_args {
            let ppid = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
            found.push((pid, ppid, stat[open + 1..close].to_string()));
        }
    }
    found
}

/// Where `lockslab up` keeps its servers: `$LOCKSLAB_STATE_DIR`, else a per-user directory.
pub fn state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOCKSLAB_STATE_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    // Only a runtime directory that exists: lockslab creates nothing but its own directory.
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("lockslab-{}", Uid::effective()))
}

/// Creates `dir` if needed and checks it is a directory of this user's (in a shared /tmp,
/// `lockslab-0` could be anyone's, or a symlink to somewhere else).
///
/// Only `dir` itself is created, never a missing parent; and only a directory created here
/// has its mode set (an existing one keeps the mode its owner chose).
pub(crate) fn own_dir(dir: &Path) -> Result<()> {
    let created = match fs::create_dir(dir) {
        Ok(()) => true,
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => bail!(
            "{} does not exist, and lockslab creates only its own directory in it: \
             create it, or set LOCKSLAB_STATE_DIR to a directory inside one that exists",
            dir.parent().unwrap_or(dir).display()
        ),
        Err(err) => return Err(err).with_context(|| format!("creating {}", dir.display())),
    };
    let meta = fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != Uid::effective().as_raw() {
        bail!(
            "{} is not a directory of yours: remove it, or set LOCKSLAB_STATE_DIR to another place",
            dir.display()
        );
    }
    if created {
        // The private Postgres may run as another user, who must be able to enter it.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o711))?;
        fs::write(dir.join(MADE_HERE), b"")
            .with_context(|| format!("writing into {}", dir.display()))?;
    }
    Ok(())
}

/// Removes `dir` if lockslab made it ([`own_dir`]) and nothing but its mark is left in it:
/// a `lockslab proxy` that made the state directory for its control socket leaves none
/// behind, and a directory that holds `up`'s servers, or one the user made, is kept.
pub(crate) fn release_own_dir(dir: &Path) {
    let only_the_mark = fs::read_dir(dir)
        .is_ok_and(|mut entries| entries.all(|e| e.is_ok_and(|e| e.file_name() == MADE_HERE)));
    if only_the_mark && fs::remove_file(dir.join(MADE_HERE)).is_ok() {
        let _ = fs::remove_dir(dir);
    }
}

/// In a state directory lockslab created itself: `down` removes the directory too. A
/// directory the user made (LOCKSLAB_STATE_DIR) is emptied of lockslab's files and kept.
const MADE_HERE: &str = ".made-by-lockslab";

/// What `lockslab up` started, saved in the state directory. Written before the first
/// server starts and again as each one is spawned, so that `down` finds everything even
/// when `up` was killed half-way.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct UpState {
    pub redis: Option<String>,
    pub etcd: Option<String>,
    pub postgres: Option<String>,
    pub pids: Vec<i32>,
    pub dir: PathBuf,
    /// Where Postgres's data lives when not in `dir` (see `choose_pg_home`).
    #[serde(default)]
    pub pg_home: Option<PathBuf>,
    /// True until every server answered: `up` is still starting, or was interrupted.
    #[serde(default)]
    pub starting: bool,
    /// `lockslab up --room ADDR`: the address the servers listen on, with passwords on.
    #[serde(default)]
    pub room: Option<String>,
    /// Postgres's superuser (see [`PG_ADMIN`]): never printed, never handed to a lab's
    /// workers; kept here (a file only this user reads) for whoever started the servers,
    /// and for `lockslab challenge`'s grader, which owns the records and makes the clients'
    /// role with it.
    #[serde(default)]
    pub postgres_admin: Option<String>,
    /// A room's seats (see [`Seat`]): what `lockslab seat` prints, one attendee's at a time.
    #[serde(default)]
    pub seats: Vec<Seat>,
}

/// The entries `lockslab up` makes in its state directory: `down` removes these and no
/// others, in case the directory was shared with something else.
const STATE_ENTRIES: [&str; 17] = [
    "servers.json",
    "servers.json.tmp",
    GUARD_LOG,
    "redis.log",
    "etcd.log",
    "postgres.log",
    "initdb.log",
    "etcd",
    "pg",
    "dump.rdb",
    "redis-room.conf",
    "redis-auth.conf",
    "room-password",
    "admin-password",
    SEATS_FILE,
    SEATS_DIR,
    // Where earlier versions kept the seats' Redis configs.
    "seat-redis",
];

/// The room's guard's log, in the state directory.
const GUARD_LOG: &str = "guard.log";

/// Every seat's lines, in the state directory (mode 0600), for the instructor to hand out.
pub const SEATS_FILE: &str = "room-seats.txt";

impl UpState {
    fn file() -> PathBuf {
        state_dir().join("servers.json")
    }

    /// The state `lockslab up` left, or None when it left none.
    pub fn load() -> Result<Option<UpState>> {
        let file = Self::file();
        let text = match fs::read_to_string(&file) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err).with_context(|| format!("reading {}", file.display())),
        };
        let state: UpState = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a state file of `lockslab up`: run `lockslab down`",
                file.display()
            )
        })?;
        for seat in &state.seats {
            seat.trust_etcd_as_instructor();
        }
        Ok(Some(state))
    }

    /// Written to a temporary file and renamed: a reader never sees half a file. Readable
    /// by this user only: a room's URLs carry its password.
    fn save(&self) -> Result<()> {
        let file = Self::file();
        let temporary = file.with_extension("json.tmp");
        let _ = fs::remove_file(&temporary);
        let text = serde_json::to_string_pretty(self)?;
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temporary)
            .and_then(|mut out| out.write_all(text.as_bytes()))
            .and_then(|()| fs::rename(&temporary, &file))
            .with_context(|| format!("writing {}", file.display()))
    }

    pub fn url(&self, backend: Backend) -> Option<&str> {
        match backend {
            Backend::Redis => self.redis.as_deref(),
            Backend::Etcd => self.etcd.as_deref(),
            Backend::Postgres => self.postgres.as_deref(),
        }
    }

    /// The URL of `up`'s server for `backend` if it answers; else an error that says which
    /// one is down and how to go on.
    pub fn answering_url(&self, backend: Backend) -> Result<String> {
        match self.url(backend) {
            _ if self.starting => bail!(
                "`lockslab up` has not finished starting its servers (still running, or interrupted): \
                 run `lockslab up` again, or `lockslab down` to stop using them"
            ),
            Some(url) if answers(backend, url) => Ok(url.to_string()),
            url => bail!(
                "the {} that `lockslab up` started ({}) does not answer: run `lockslab up` to restart it, \
                 or `lockslab down` to stop using `up`'s servers",
                backend.name(),
                connect::redact(url.unwrap_or("-"))
            ),
        }
    }

    /// Every directory with data of `up`'s servers.
    fn dirs(&self) -> Vec<PathBuf> {
        std::iter::once(self.dir.clone())
            .chain(self.pg_home.clone())
            .collect()
    }

    /// The lines to paste into a shell so that every command uses these servers.
    pub fn exports(&self) -> Vec<String> {
        [
            (Backend::Redis, "LOCKSLAB_REDIS_URL"),
            (Backend::Etcd, "LOCKSLAB_ETCD_URL"),
            (Backend::Postgres, "LOCKSLAB_POSTGRES_URL"),
        ]
        .iter()
        .filter_map(|(backend, var)| self.url(*backend).map(|url| format!("export {var}={url}")))
        .collect()
    }

    /// The seat called `which` (`seat07`, or just `7`).
    pub fn seat(&self, which: &str) -> Result<&Seat> {
        let wanted = which
            .parse::<usize>()
            .map_or_else(|_| which.to_string(), |n| format!("seat{n:02}"));
        self.seats
            .iter()
            .find(|seat| seat.name == wanted)
            .with_context(|| match (self.seats.first(), self.seats.last()) {
                (Some(first), Some(last)) => format!(
                    "no seat {which} in this room: its seats are {} to {}",
                    first.name, last.name
                ),
                _ => "no room is running: `lockslab up --room ADDR --seats N` starts one".into(),
            })
    }

    /// The lines one attendee pastes: the seat's own URLs, never the instructor's users,
    /// and its namespace.
    pub fn seat_exports(&self, seat: &Seat) -> Vec<String> {
        let mut lines: Vec<String> = [
            (Backend::Redis, "LOCKSLAB_REDIS_URL"),
            (Backend::Etcd, "LOCKSLAB_ETCD_URL"),
            (Backend::Postgres, "LOCKSLAB_POSTGRES_URL"),
        ]
        .iter()
        .filter_map(|(backend, var)| {
            let url = match (backend, seat.redis_url(), seat.etcd_url()) {
                // Its own Redis and etcd (see `PrivateServers::start_seat_servers`).
                (Backend::Redis, Some(own), _) | (Backend::Etcd, _, Some(own)) => own,
                // Its own database (see `seat_postgres_roles`).
                (Backend::Postgres, _, _) => on_database(
                    &with_user(self.url(*backend)?, &seat.name, &seat.password),
                    &seat.name,
                ),
                _ => with_user(self.url(*backend)?, &seat.name, &seat.password),
            };
            Some(format!("export {var}={url}"))
        })
        .collect();
        if let Some(bundle) = &seat.etcd_tls {
            lines.push(format!("export {}={bundle}", crate::etcd_tls::ENV));
        }
        lines.push(format!("export LOCKSLAB_NAMESPACE={}", seat.name));
        lines.push(format!("export LOCKSLAB_NAME={}", seat.name));
        lines
    }

    /// Writes every seat's lines to [`SEATS_FILE`], readable by this user only.
    fn write_seats_file(&self) -> Result<PathBuf> {
        let mut text = String::new();
        for seat in &self.seats {
            text.push_str(&format!("# {}\n", seat.name));
            for line in self.seat_exports(seat) {
                text.push_str(&line);
                text.push('\n');
            }
            text.push('\n');
        }
        let file = state_dir().join(SEATS_FILE);
        write_secret(&file, &text)?;
        Ok(file)
    }
}

/// `lockslab up`: start all three servers and leave them running.
///
/// Restartable after anything: when the state is incomplete (an interrupted `up`) or a
/// server does not answer, whatever is there is stopped and removed first, and all three
/// start afresh — on new ports, with empty data. That silently breaks every terminal where
/// the old `export` lines were pasted, so it says so, loudly, naming what was dead.
pub fn up() -> Result<UpState> {
    let previous = UpState::load().ok().flatten();
    if let Some(state) = &previous
        && !state.starting
        && ALL
            .iter()
            .all(|b| state.url(*b).is_some_and(|url| answers(*b, url)))
    {
        return Ok(state.clone());
    }
    if let Some(state) = &previous {
        let dead: Vec<String> = ALL
            .iter()
            .filter_map(|b| {
                let url = state.url(*b)?;
                (!answers(*b, url)).then(|| format!("{} ({})", b.name(), connect::redact(url)))
            })
            .collect();
        let why = if state.starting || dead.is_empty() {
            "the last `lockslab up` did not finish".to_string()
        } else {
            format!("{} stopped answering", dead.join(", "))
        };
        crate::errln!(
            "lockslab up: {why}. Restarting ALL THREE servers, on NEW ports and with empty data: \
             the export lines pasted earlier now point at nothing. Paste the new ones below into \
             every terminal."
        );
    }
    down()?;
    let mut servers = PrivateServers::start(&ALL, Lifetime::Detached)?;
    servers.release_detached()?;
    Ok(servers.up_state(false))
}

/// `lockslab up --room ADDR`: servers for a whole room, listening on `addr` with a fresh
/// password each (see [`Room`]). Servers `up` started before are stopped first, unless
/// they are this room's already and answer.
pub fn up_room(addr: std::net::IpAddr, seats: usize) -> Result<UpState> {
    if addr.is_unspecified() {
        bail!(
            "--room {addr} means every address of this machine, every network it is on included: \
             give the one address the room reaches it by (see `ip -brief address`)"
        );
    }
    if let Ok(Some(state)) = UpState::load()
        && !state.starting
        && ALL
            .iter()
            .all(|b| state.url(*b).is_some_and(|url| answers(*b, url)))
    {
        match state.room.as_deref() {
            Some(room) if room == addr.to_string() && state.seats.len() == seats => {
                return Ok(state);
            }
            // More or fewer seats would mean new passwords for every seat.
            Some(room) if room == addr.to_string() => bail!(
                "a room of {} seat{} is already running on {room}, not {seats}: `lockslab \
                 down` stops it (every attendee's export lines then point at nothing), then \
                 `lockslab up --room {addr} --seats {seats}`",
                state.seats.len(),
                if state.seats.len() == 1 { "" } else { "s" }
            ),
            // Replacing it would change every port and password: every attendee's pasted
            // lines would point at nothing.
            Some(room) => bail!(
                "a room is already running on {room}: `lockslab down` stops it (every attendee's \
                 export lines then point at nothing), then `lockslab up --room {addr}`"
            ),
            None => {}
        }
    }
    down()?;
    let room = Room {
        addr,
        password: crate::seed::os_hex(24),
        seats: Seat::generate(seats),
    };
    let mut servers = PrivateServers::start_with(&ALL, Lifetime::Detached, Some(room))?;
    let state = servers.up_state(false);
    state.write_seats_file()?;
    servers.release_detached()?;
    Ok(state)
}

/// `lockslab down`: stop what `lockslab up` started and delete its data. True when there
/// was something to stop or delete.
///
/// Servers are found by where they work — a directory of `up`'s — and by name, not by the
/// pids in the state file alone: that covers a server spawned just before `up` was killed,
/// and never signals a process that merely inherited a recorded pid.
pub fn down() -> Result<bool> {
    let dir = state_dir();
    let state = UpState::load().ok().flatten();
    let dirs = state
        .as_ref()
        .map(UpState::dirs)
        .unwrap_or_else(|| vec![dir.clone()]);
    let servers: Vec<(i32, i32, String)> = processes_in(&dirs)
        .into_iter()
        .filter(|(_, _, name)| {
            matches!(
                name.as_str(),
                "redis-server" | "etcd" | "postgres" | "initdb" | guard::PROCESS_NAME
            )
        })
        .collect();
    let leftovers = STATE_ENTRIES
        .iter()
        .any(|entry| dir.join(entry).symlink_metadata().is_ok());
    if state.is_none() && servers.is_empty() && !leftovers {
        return Ok(false);
    }
    // Only the top of each process tree: Postgres's backends follow their postmaster.
    let tops: Vec<_> = servers
        .iter()
        .filter(|(_, ppid, _)| !servers.iter().any(|(pid, _, _)| pid == ppid))
        .collect();
    // All at once: an etcd takes over a second to stop, and a room has one per seat.
    thread::scope(|scope| {
        for (pid, _, name) in tops {
            let signal = if name == "postgres" {
                Signal::SIGINT
            } else {
                Signal::SIGTERM
            };
            scope.spawn(move || stop_unrelated(*pid, signal));
        }
    });
    // Whatever still runs as a seat's user was started by a seat that took over its server.
    let seat_uids: Vec<u32> = state
        .iter()
        .flat_map(|state| &state.seats)
        .filter_map(|seat| seat.uid)
        .collect();
    procs::kill_every_process_of(&seat_uids);
    for home in dirs.iter().filter(|d| **d != dir) {
        remove_server_dir(home);
    }
    clear_state_dir(&dir)?;
    Ok(true)
}

/// Deletes what `up` made in its state directory, and the directory once empty.
fn clear_state_dir(dir: &Path) -> Result<()> {
    if !release_shared_memory(&dir.join("pg")) {
        bail!(
            "a Postgres still uses {}: stop it, then run `lockslab down` again",
            dir.join("pg").display()
        );
    }
    for entry in STATE_ENTRIES {
        let path = dir.join(entry);
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        if meta.is_dir() {
            fs::remove_dir_all(&path)
        } else {
            fs::remove_file(&path)
        }
        .with_context(|| format!("removing {}", path.display()))?;
    }
    if fs::remove_file(dir.join(MADE_HERE)).is_ok() {
        let _ = fs::remove_dir(dir);
    }
    Ok(())
}

fn clear_state_dir_quietly(dir: &Path) {
    let _ = clear_state_dir(dir);
}

/// Stops a process that is not our child (started by an earlier `lockslab up`): signal,
/// then poll until it is gone, SIGKILL after the grace period. Init reaps it.
fn stop_unrelated(pid: i32, signal: Signal) {
    let target = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(target, Signal::SIGCONT);
    let _ = nix::sys::signal::kill(target, signal);
    let deadline = Instant::now() + Duration::from_secs(5);
    while procs::process_state(pid).is_some_and(|state| state != 'Z') {
        if Instant::now() > deadline {
            let _ = nix::sys::signal::killpg(target, Signal::SIGKILL);
            let _ = nix::sys::signal::kill(target, Signal::SIGKILL);
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Each backend `lockslab up` started, and whether it answers now.
pub type Health = Vec<(Backend, bool)>;

/// `lockslab status`: each server `up` started, and whether it answers.
pub fn status() -> Result<Option<(UpState, Health)>> {
    let Some(state) = UpState::load()? else {
        return Ok(None);
    };
    let health = ALL
        .iter()
        .filter_map(|b| state.url(*b).map(|url| (*b, answers(*b, url))))
        .collect();
    Ok(Some((state, health)))
}

/// `lockslab __serve`: private servers that live until stdin closes.
///
/// The test suite starts one of these per test binary and keeps its stdin open; when the
/// tests end, however they end, the pipe closes and the servers are stopped and deleted.
/// The servers' pids are printed too, for tests that freeze or kill a server of their own.
pub fn serve_until_stdin_closes() -> Result<()> {
    let servers = PrivateServers::start(&ALL, Lifetime::ThisRun)?;
    let url = |backend| servers.url(backend);
    let pid = |backend| {
        servers
            .pids
            .iter()
            .find(|(b, _)| *b == backend)
            .map(|(_, pid)| *pid)
    };
    crate::output::json_line(&serde_json::json!({
        "redis": url(Backend::Redis),
        "etcd": url(Backend::Etcd),
        "postgres": url(Backend::Postgres),
        "postgres_admin": servers.admin_url,
        "started_ms": servers.started_in.as_millis() as u64,
        "pids": {
            "redis": pid(Backend::Redis),
            "etcd": pid(Backend::Etcd),
            "postgres": pid(Backend::Postgres),
        },
    }));
    let mut sink = Vec::new();
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut sink);
    drop(servers);
    Ok(())
}

/// A room's results table (what `lockslab results` reads), in the labs' database's `public` schema.
pub const ROOM_RESULTS: &str = "public.lockslab_room_results";

/// What a room's Postgres runs once, as its superuser, before the seats are created.
pub fn room_results_sql(labs_role: &str) -> Vec<String> {
    vec![
        format!(
            "CREATE TABLE {ROOM_RESULTS} (\
               seat name NOT NULL DEFAULT current_user, \
               lab text NOT NULL, \
               run_id text NOT NULL, \
               at timestamptz NOT NULL DEFAULT now(), \
               headline text NOT NULL, \
               verdict jsonb NOT NULL)"
        ),
        format!("GRANT SELECT, DELETE ON {ROOM_RESULTS} TO {labs_role}"),
    ]
}

/// A seat's right to record its own runs, and nothing more.
pub fn room_results_grants_sql(seat: &str) -> Vec<String> {
    vec![
        format!("GRANT USAGE ON SCHEMA public TO {seat}"),
        format!("GRANT INSERT (lab, run_id, headline, verdict) ON {ROOM_RESULTS} TO {seat}"),
    ]
}
