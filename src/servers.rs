//! Finding Redis, etcd and Postgres — or starting private throwaway ones.
//!
//! For each backend a lab needs, the first of these that applies wins:
//! 1. the URL given by flag or environment (`--redis-url` / `LOCKSLAB_REDIS_URL`…): it must answer;
//! 2. the servers `lockslab up` left running, if they still answer;
//! 3. the docker-compose.yml defaults, if they answer (skipped with `--private-servers`);
//! 4. a private server started from the binaries on this machine, in a temporary directory,
//!    on a free loopback port, stopped and deleted when the lab ends.
//!
//! The tests use the same code, so no test depends on a fixed port.

use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use crate::connect::{self, Backend};
use crate::procs::{self, StopPlan};

/// The flags and environment variables that name servers; every lab takes them.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServerArgs {
    /// Redis to use, e.g. redis://127.0.0.1:6379
    #[arg(long, env = "LOCKSLAB_REDIS_URL", value_name = "URL", global = true, value_parser = redis_url)]
    pub redis_url: Option<String>,
    /// etcd to use, e.g. http://127.0.0.1:2379
    #[arg(long, env = "LOCKSLAB_ETCD_URL", value_name = "URL", global = true, value_parser = etcd_url)]
    pub etcd_url: Option<String>,
    /// Postgres to use, e.g. postgres://lockslab:lockslab@127.0.0.1:5432/lockslab
    #[arg(long, env = "LOCKSLAB_POSTGRES_URL", value_name = "URL", global = true, value_parser = postgres_url)]
    pub postgres_url: Option<String>,
    /// Skip the docker-compose defaults and `lockslab up`: start private servers for this run
    #[arg(long, env = "LOCKSLAB_PRIVATE_SERVERS", global = true, action = clap::ArgAction::SetTrue,
          value_parser = clap::builder::BoolishValueParser::new())]
    pub private_servers: bool,
}

fn redis_url(text: &str) -> Result<String, String> {
    checked_url(Backend::Redis, text)
}

fn etcd_url(text: &str) -> Result<String, String> {
    checked_url(Backend::Etcd, text)
}

fn postgres_url(text: &str) -> Result<String, String> {
    checked_url(Backend::Postgres, text)
}

/// A URL flag's value parser: a malformed URL is a command-line error (exit status 2) that
/// names the flag and its environment variable.
fn checked_url(backend: Backend, text: &str) -> Result<String, String> {
    match connect::url_problem(backend, text) {
        Some(problem) => Err(format!(
            "{problem} (from {} or {})",
            backend.flag(),
            backend.env_var()
        )),
        None => Ok(text.to_string()),
    }
}

impl ServerArgs {
    fn given(&self, backend: Backend) -> Option<&str> {
        match backend {
            Backend::Redis => self.redis_url.as_deref(),
            Backend::Etcd => self.etcd_url.as_deref(),
            Backend::Postgres => self.postgres_url.as_deref(),
        }
        .filter(|url| !url.is_empty())
    }
}

/// Every backend, for the commands that start them all.
const ALL: [Backend; 3] = [Backend::Redis, Backend::Etcd, Backend::Postgres];

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
}

impl Servers {
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
                    Origin::Compose => "docker-compose default".to_string(),
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
    let up_state = if args.private_servers {
        None
    } else {
        UpState::load().ok()
    };
    for &backend in needs {
        if let Some(url) = args.given(backend) {
            connect::note_source(url, given_source(backend));
            connect::probe(backend, url)?;
            urls.push((backend, url.to_string(), Origin::Given));
        } else if let Some(url) = up_state
            .as_ref()
            .and_then(|s| s.url(backend))
            .filter(|u| answers(backend, u))
        {
            connect::note_source(url, connect::Source::Up);
            urls.push((backend, url.to_string(), Origin::Up));
        } else if !args.private_servers && answers_quickly(backend, compose_default(backend)) {
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
fn answers_quickly(backend: Backend, url: &str) -> bool {
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

/// Servers started from local binaries in a directory of their own.
pub struct PrivateServers {
    pub dir: PathBuf,
    pub urls: Vec<(Backend, String)>,
    pub pids: Vec<(Backend, i32)>,
    pub started_in: Duration,
    lifetime: Lifetime,
    /// Keeps the temporary directory until the servers are stopped.
    _temp: Option<tempfile::TempDir>,
}

impl PrivateServers {
    /// Starts the given backends and waits until each answers.
    ///
    /// Processes are spawned from this (the calling) thread, so that their parent-death
    /// signal is tied to a thread that outlives them; only the waiting runs in parallel.
    pub fn start(backends: &[Backend], lifetime: Lifetime) -> Result<PrivateServers> {
        let started = Instant::now();
        let (dir, temp) = match lifetime {
            Lifetime::ThisRun => {
                let temp = tempfile::Builder::new()
                    .prefix("lockslab-")
                    .tempdir()
                    .context("creating a temporary directory")?;
                procs::remove_on_cleanup(temp.path().to_path_buf());
                (temp.path().to_path_buf(), Some(temp))
            }
            Lifetime::Detached => {
                let dir = state_dir();
                fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
                (dir, None)
            }
        };
        // The private Postgres may run as another user, who must be able to enter the directory.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o711))?;
        let mut servers = PrivateServers {
            dir,
            urls: Vec::new(),
            pids: Vec::new(),
            started_in: Duration::ZERO,
            lifetime,
            _temp: temp,
        };
        let result = servers.start_each(backends);
        if let Err(err) = result {
            servers.stop();
            return Err(err);
        }
        servers.started_in = started.elapsed();
        Ok(servers)
    }

    fn start_each(&mut self, backends: &[Backend]) -> Result<()> {
        // Redis and etcd start while initdb prepares Postgres's data directory.
        for &backend in backends.iter().filter(|b| **b != Backend::Postgres) {
            self.launch(backend)?;
        }
        if backends.contains(&Backend::Postgres) {
            self.launch(Backend::Postgres)?;
        }
        let waits: Vec<_> = self
            .urls
            .iter()
            .cloned()
            .map(|(backend, url)| thread::spawn(move || wait_until_answering(backend, &url)))
            .collect();
        for wait in waits {
            wait.join()
                .map_err(|_| anyhow!("a readiness check panicked"))??;
        }
        Ok(())
    }

    fn launch(&mut self, backend: Backend) -> Result<()> {
        let port = free_port()?;
        let log = self.dir.join(format!("{}.log", backend.compose_service()));
        let (mut command, url, stop_signal) = match backend {
            Backend::Redis => {
                let mut command = Command::new(find_binary("redis-server", backend)?);
                command.args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]);
                command.arg("--dir").arg(&self.dir);
                (
                    command,
                    format!("redis://127.0.0.1:{port}"),
                    Signal::SIGTERM,
                )
            }
            Backend::Etcd => {
                let peer_port = free_port()?;
                let client = format!("http://127.0.0.1:{port}");
                let peer = format!("http://127.0.0.1:{peer_port}");
                let mut command = Command::new(find_binary("etcd", backend)?);
                command
                    .args(["--name", "lockslab", "--data-dir"])
                    .arg(self.dir.join("etcd"))
                    .args([
                        "--listen-client-urls",
                        &client,
                        "--advertise-client-urls",
                        &client,
                    ])
                    .args([
                        "--listen-peer-urls",
                        &peer,
                        "--initial-advertise-peer-urls",
                        &peer,
                    ])
                    .args(["--initial-cluster", &format!("lockslab={peer}")])
                    // A one-member cluster elects itself; short timers make that take milliseconds.
                    .args(["--heartbeat-interval", "50", "--election-timeout", "300"]);
                (command, client, Signal::SIGTERM)
            }
            Backend::Postgres => {
                let data = self.dir.join("pg");
                let owner = unprivileged_owner()?;
                fs::create_dir_all(&data)?;
                if let Some((uid, gid)) = owner {
                    nix::unistd::chown(&data, Some(uid), Some(gid))
                        .context("handing the Postgres directory to its user")?;
                }
                let mut initdb = Command::new(find_binary("initdb", backend)?);
                initdb
                    .arg("-D")
                    .arg(&data)
                    .args([
                        "-U",
                        "lockslab",
                        "--auth=trust",
                        "--no-sync",
                        "-E",
                        "UTF8",
                        "--no-instructions",
                    ])
                    .current_dir(&data)
                    .stdout(Stdio::null())
                    .stderr(fs::File::create(self.dir.join("initdb.log"))?);
                as_user(&mut initdb, owner);
                let status = initdb.status().context("running initdb")?;
                if !status.success() {
                    bail!(
                        "initdb failed ({status}); see {}",
                        self.dir.join("initdb.log").display()
                    );
                }
                let mut command = Command::new(find_binary("postgres", backend)?);
                command
                    .arg("-D")
                    .arg(&data)
                    .args(["-p", &port.to_string(), "-c", "listen_addresses=127.0.0.1"])
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
                    .args(["-c", "max_connections=200"])
                    .current_dir(&data);
                as_user(&mut command, owner);
                // SIGINT is Postgres's fast shutdown: it does not wait for clients to leave.
                (
                    command,
                    format!("postgres://lockslab@127.0.0.1:{port}/postgres"),
                    Signal::SIGINT,
                )
            }
        };
        let log = fs::File::create(&log)?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let plan = StopPlan {
            signal: stop_signal,
            grace: Duration::from_secs(5),
        };
        let pid = match self.lifetime {
            Lifetime::ThisRun => procs::spawn_registered(&mut command, plan)
                .with_context(|| format!("starting a private {}", backend.name()))?
                .id() as i32,
            Lifetime::Detached => {
                // Outlives this command: its own session, no parent-death signal.
                // SAFETY: setsid is async-signal-safe and touches nothing but this process.
                unsafe {
                    command.pre_exec(|| nix::unistd::setsid().map(drop).map_err(Into::into));
                }
                let child = command
                    .spawn()
                    .with_context(|| format!("starting a private {}", backend.name()))?;
                let pid = child.id() as i32;
                // Reaped by init once `lockslab up` exits; until then, registered so that a
                // failed `up` does not leave it behind.
                procs::register(pid, plan);
                pid
            }
        };
        self.urls.push((backend, url));
        self.pids.push((backend, pid));
        Ok(())
    }

    pub fn url(&self, backend: Backend) -> Option<String> {
        self.urls
            .iter()
            .find(|(b, _)| *b == backend)
            .map(|(_, url)| url.clone())
    }

    /// Stops every server and deletes the directory (of a temporary run).
    pub fn stop(&mut self) {
        for (backend, pid) in self.pids.drain(..) {
            let signal = if backend == Backend::Postgres {
                Signal::SIGINT
            } else {
                Signal::SIGTERM
            };
            procs::stop(
                pid,
                &StopPlan {
                    signal,
                    grace: Duration::from_secs(5),
                },
            );
        }
        if self.lifetime == Lifetime::ThisRun {
            let _ = fs::remove_dir_all(&self.dir);
            procs::forget_dir(&self.dir);
        }
    }

    /// After a successful `lockslab up`: the servers are no longer this process's to stop.
    fn release_detached(&mut self) {
        for (_, pid) in self.pids.drain(..) {
            procs::forget(pid);
        }
    }
}

impl Drop for PrivateServers {
    fn drop(&mut self) {
        self.stop();
    }
}

fn wait_until_answering(backend: Backend, url: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match connect::probe(backend, url) {
            Ok(()) => return Ok(()),
            Err(err) if Instant::now() > deadline => {
                return Err(err.context(format!("the private {} did not start", backend.name())));
            }
            Err(_) => thread::sleep(Duration::from_millis(25)),
        }
    }
}

/// A port nobody listens on right now. Another process could take it before the server
/// binds it; then the server fails to start and says so in its log.
fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free loopback port")?;
    Ok(listener.local_addr()?.port())
}

/// Finds a server binary on PATH, or (Postgres) under the usual Debian/Ubuntu locations.
fn find_binary(name: &str, backend: Backend) -> Result<PathBuf> {
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

/// Postgres refuses to run as root: as root, run it as the `postgres` user (or `nobody`).
fn unprivileged_owner() -> Result<Option<(nix::unistd::Uid, nix::unistd::Gid)>> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        if let Ok(Some(user)) = nix::unistd::User::from_name(name) {
            return Ok(Some((user.uid, user.gid)));
        }
    }
    bail!("Postgres will not run as root, and there is no `postgres` or `nobody` user to run it as")
}

fn as_user(command: &mut Command, owner: Option<(nix::unistd::Uid, nix::unistd::Gid)>) {
    if let Some((uid, gid)) = owner {
        command.uid(uid.as_raw()).gid(gid.as_raw());
    }
}

/// Where `lockslab up` keeps its servers: `$LOCKSLAB_STATE_DIR`, else a per-user directory.
pub fn state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("LOCKSLAB_STATE_DIR") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("lockslab-{}", nix::unistd::Uid::effective()))
}

/// What `lockslab up` left running, saved in the state directory.
#[derive(Serialize, Deserialize, Debug)]
pub struct UpState {
    pub redis: Option<String>,
    pub etcd: Option<String>,
    pub postgres: Option<String>,
    pub pids: Vec<i32>,
    pub dir: PathBuf,
}

impl UpState {
    fn file() -> PathBuf {
        state_dir().join("servers.json")
    }

    pub fn load() -> Result<UpState> {
        let text = fs::read_to_string(Self::file())?;
        Ok(serde_json::from_str(&text)?)
    }

    pub fn url(&self, backend: Backend) -> Option<&str> {
        match backend {
            Backend::Redis => self.redis.as_deref(),
            Backend::Etcd => self.etcd.as_deref(),
            Backend::Postgres => self.postgres.as_deref(),
        }
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
}

/// `lockslab up`: start all three servers and leave them running.
pub fn up() -> Result<UpState> {
    if let Ok(state) = UpState::load() {
        if ALL
            .iter()
            .all(|b| state.url(*b).is_some_and(|url| answers(*b, url)))
        {
            return Ok(state);
        }
        down()?;
    }
    let mut servers = PrivateServers::start(&ALL, Lifetime::Detached)?;
    let url = |backend| servers.url(backend);
    let state = UpState {
        redis: url(Backend::Redis),
        etcd: url(Backend::Etcd),
        postgres: url(Backend::Postgres),
        pids: servers.pids.iter().map(|(_, pid)| *pid).collect(),
        dir: servers.dir.clone(),
    };
    fs::write(UpState::file(), serde_json::to_string_pretty(&state)?)?;
    servers.release_detached();
    Ok(state)
}

/// `lockslab down`: stop what `lockslab up` started and delete its directory.
pub fn down() -> Result<bool> {
    let Ok(state) = UpState::load() else {
        return Ok(false);
    };
    for pid in &state.pids {
        if is_server_process(*pid) {
            let signal = if process_name(*pid).as_deref() == Some("postgres") {
                Signal::SIGINT
            } else {
                Signal::SIGTERM
            };
            stop_unrelated(*pid, signal);
        }
    }
    remove_state_dir(&state.dir)?;
    Ok(true)
}

fn remove_state_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

fn process_name(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim().to_string())
}

/// Guards against a recycled pid: only signal what still looks like one of our servers.
fn is_server_process(pid: i32) -> bool {
    matches!(
        process_name(pid).as_deref(),
        Some("redis-server" | "etcd" | "postgres")
    )
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
            break;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Each backend `lockslab up` started, and whether it answers now.
pub type Health = Vec<(Backend, bool)>;

/// `lockslab status`: each server `up` started, and whether it answers.
pub fn status() -> Result<Option<(UpState, Health)>> {
    let Ok(state) = UpState::load() else {
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
