//! `lockslab proxy`: the fault proxy by hand, in front of a learner's own client.
//!
//! ```text
//!  1$ lockslab proxy --to "$LOCKSLAB_REDIS_URL"      # prints the URL to use instead
//!  2$ LOCKSLAB_REDIS_URL=<that URL> lockslab worker   # a worker behind the proxy
//!  3$ lockslab proxy fault 41234 hold                 # its requests wait in the proxy
//!  3$ lockslab proxy fault 41234 heal                 # and go out, in order
//! ```
//!
//! The running proxy listens for faults on a Unix socket named after its port, one line
//! per fault (`up hold`), and answers one line. Ctrl-C stops it: its connections close and
//! the socket file goes.
//!
//! Anyone on the machine can connect to a loopback port, so the proxy is built to outlast
//! its users: the control socket lives in a directory only its own user can enter
//! ([`control_dir`]), never at a name in `/tmp` another user could take first; it relays a
//! bounded number of connections, sized by its file descriptor limit, so that whoever opens
//! hundreds cannot leave it without a descriptor for its control socket; and a failed
//! `accept` on either socket waits and tries again rather than ending the proxy.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::proxy::{Direction, NetFault, Proxy, through, upstream_of};

#[derive(clap::Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "\
Examples, in three terminals (after `lockslab up` and its export lines):
  1$ lockslab proxy --to redis   prints the proxy's port and the URL through it
                               (--to redis: LOCKSLAB_REDIS_URL's, off argv)
  2$ LOCKSLAB_REDIS_URL=<that URL> lockslab worker --work 30s
  3$ lockslab proxy fault <port> hold          the worker's requests wait
  3$ lockslab proxy fault <port> heal          they go out, in order
  3$ lockslab proxy fault <port> reset         its connections are cut
  3$ lockslab proxy fault <port> delay --for 2s --direction both
  3$ lockslab proxy fault <port> drop-reply    the next request is applied,
                                               its answer lost
Ctrl-C stops the proxy; nothing is left behind.

Walkthrough: labs/08-network.md, \"By hand\"."
)]
pub struct ProxyArgs {
    #[command(subcommand)]
    pub fault: Option<ProxyCommand>,
    /// The server: `redis`, `etcd` or `postgres` for the URL in LOCKSLAB_REDIS_URL (…_ETCD_…,
    /// …_POSTGRES_…), which keeps its password off the command line; or a URL or host:port
    #[arg(long, required = true, value_name = "URL")]
    pub to: Option<String>,
    /// Where the proxy listens (a free port when 0): a loopback address unless --expose
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Let --listen be an address other machines reach: anyone who reaches it reaches the
    /// server behind the proxy
    #[arg(long)]
    pub expose: bool,
}

#[derive(clap::Subcommand, Debug)]
pub enum ProxyCommand {
    /// Put a fault on a running proxy, from another terminal
    Fault(FaultArgs),
}

#[derive(clap::Args, Debug)]
pub struct FaultArgs {
    /// The running proxy's port, as it printed it
    pub port: u16,
    /// What to do to the path
    #[arg(value_enum)]
    pub fault: FaultName,
    /// Which way: requests (up), replies (down), or both [default: both for heal, up for
    /// the others]
    #[arg(long, value_enum)]
    pub direction: Option<Way>,
    /// How long a delay lasts (delay, delay-next), up to 10m [default: 1s]
    #[arg(long = "for", value_name = "DURATION",
          value_parser = crate::flags::duration_in(Duration::ZERO, crate::flags::LONGEST_LAB_WAIT))]
    pub duration: Option<Duration>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultName {
    /// Every chunk late by --for
    Delay,
    /// Only the next request late by --for
    DelayNext,
    /// Everything waits in the proxy until heal
    Hold,
    /// Live connections reset, new ones refused
    Reset,
    /// Bytes swallowed, nobody told
    BlackHole,
    /// The next request goes through, its answer is lost
    DropReply,
    /// Lift the fault; held bytes go out in order
    Heal,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Way {
    Up,
    Down,
    Both,
}

/// `lockslab proxy …`.
pub fn run(args: &ProxyArgs) -> Result<()> {
    match &args.fault {
        Some(ProxyCommand::Fault(fault)) => send_fault(fault),
        None => {
            check_listen(args.listen, args.expose)?;
            serve(args.to.as_deref().unwrap_or_default(), args.listen)
        }
    }
}

/// The proxy relays to a server that may listen on loopback only, password or not: on an
/// address other machines reach it would hand them that server, so only if told.
fn check_listen(listen: SocketAddr, expose: bool) -> Result<()> {
    let ip = listen.ip();
    if ip.is_unspecified() {
        crate::bail_usage!(
            "--listen {listen} means every address of this machine, every network it is on \
             included: give 127.0.0.1:PORT, or the one address others reach it by (see \
             `ip -brief address`) with --expose"
        );
    }
    if !ip.is_loopback() && !expose {
        crate::bail_usage!(
            "--listen {listen}: other machines can reach that address, and through the proxy \
             the server behind it: add --expose if that is what you want, or listen on \
             127.0.0.1"
        );
    }
    Ok(())
}

/// The directory of the proxies' control sockets: `proxy` in lockslab's state directory
/// (`$LOCKSLAB_STATE_DIR`, else `lockslab-<uid>` in `$XDG_RUNTIME_DIR` or the temp
/// directory), mode 0700, so that only this user can reach a socket in it, or put a file
/// where one goes.
pub fn control_dir() -> PathBuf {
    crate::servers::state_dir().join("proxy")
}

/// The control socket of the proxy listening on `port`: in [`control_dir`], or in a
/// directory of a random name of this user's (see [`own_control_dir`]) when it is there.
pub fn control_socket(port: u16) -> PathBuf {
    let name = format!("proxy-{port}.sock");
    let usual = control_dir().join(&name);
    if usual.exists() {
        return usual;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return usual;
    };
    entries
        .flatten()
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .starts_with(&fallback_prefix())
        })
        .map(|entry| entry.path())
        // Only a directory of this user's that nobody else can enter: a socket in it is
        // one of this user's proxies, whoever chose the name.
        .filter(|dir| {
            std::fs::symlink_metadata(dir).is_ok_and(|meta| {
                meta.is_dir()
                    && meta.uid() == nix::unistd::Uid::effective().as_raw()
                    && meta.mode() & 0o077 == 0
            })
        })
        .map(|dir| dir.join(&name))
        .find(|socket| socket.exists())
        .unwrap_or(usual)
}

/// The start of the name of a control directory made when the usual one is taken.
fn fallback_prefix() -> String {
    format!("lockslab-proxy-{}-", nix::unistd::Uid::effective())
}

/// Where this proxy's control socket goes, created if need be: [`control_dir`]; or, when
/// the state directory is in the shared temporary directory and someone else took its
/// name first (`/tmp/lockslab-<uid>` can be made by anyone), a new directory of a random
/// name there, mode 0700, which nobody can take beforehand. `lockslab proxy fault` looks
/// in both.
fn own_control_dir() -> Result<PathBuf> {
    let err = match own_usual_control_dir() {
        Ok(dir) => return Ok(dir),
        Err(err) => err,
    };
    if !crate::servers::state_dir().starts_with(std::env::temp_dir()) {
        return Err(err);
    }
    let dir = tempfile::Builder::new()
        .prefix(&fallback_prefix())
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .context("creating a directory for the proxy's control socket")?
        .keep();
    crate::errln!(
        "warning: {err:#}; this proxy's control socket is in {} instead",
        dir.display()
    );
    Ok(dir)
}

/// Creates [`control_dir`] (and the state directory) if needed, and checks that both are
/// this user's: a directory someone else made, or a symlink, is refused with a message.
fn own_usual_control_dir() -> Result<PathBuf> {
    crate::servers::own_dir(&crate::servers::state_dir())?;
    let dir = control_dir();
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Err(err) if err.kind() != std::io::ErrorKind::AlreadyExists => {
            return Err(err).with_context(|| format!("creating {}", dir.display()));
        }
        _ => {}
    }
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != nix::unistd::Uid::effective().as_raw() {
        bail!(
            "{} is not a directory of yours: remove it, or set LOCKSLAB_STATE_DIR to another place",
            dir.display()
        );
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(dir)
}

/// Makes way for this proxy's control socket: another proxy answering there is refused; a
/// socket of this user's that nobody answers on (a proxy killed before it could remove
/// it) is replaced; anything else — another user's file, or not a socket — is refused
/// with a message, never removed.
fn clear_for_socket(socket: &Path, port: u16) -> Result<()> {
    let meta = match std::fs::symlink_metadata(socket) {
        Ok(meta) => meta,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(err).with_context(|| format!("looking at {}", socket.display())),
    };
    if meta.uid() != nix::unistd::Uid::effective().as_raw() {
        bail!(
            "{} belongs to user {}, not to you: lockslab does not remove it; its owner (or root) \
            may, or give this proxy another port",
            socket.display(),
            meta.uid()
        );
    }
    if !meta.file_type().is_socket() {
        bail!(
            "{} is in the way of this proxy's control socket and is not a socket: remove it, \
            or give this proxy another port",
            socket.display()
        );
    }
    if UnixStream::connect(socket).is_ok() {
        bail!(
            "another `lockslab proxy` on port {port} takes faults at {}: stop it, or give \
            this one another port",
            socket.display()
        );
    }
    std::fs::remove_file(socket).with_context(|| format!("removing {}", socket.display()))
}

/// The control socket's file, removed however `serve` ends.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        // The directory goes with the last proxy's socket; another's keeps it. So does the
        // state directory, if this proxy made it and left nothing else there.
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir(dir);
            if dir == control_dir() {
                crate::servers::release_own_dir(&crate::servers::state_dir());
            }
        }
    }
}

/// File descriptors kept free beyond the relayed connections: the control socket's
/// clients, the accept of a connection refused for being one too many, and what the
/// runtime opens.
const FD_RESERVE: usize = 32;

/// How many connections fit in this process's file descriptors: its soft limit, less
/// those open now and [`FD_RESERVE`], at [`crate::proxy::FDS_PER_CONNECTION`] each. None
/// when `/proc` does not say.
fn connections_within_fd_limit() -> Option<usize> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let soft = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?;
    let soft: usize = if soft == "unlimited" {
        usize::MAX / 2
    } else {
        soft.parse().ok()?
    };
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count();
    Some(soft.saturating_sub(open + FD_RESERVE) / crate::proxy::FDS_PER_CONNECTION)
}

fn serve(to: &str, listen: SocketAddr) -> Result<()> {
    let named = match to {
        "redis" => Some("LOCKSLAB_REDIS_URL"),
        "etcd" => Some("LOCKSLAB_ETCD_URL"),
        "postgres" => Some("LOCKSLAB_POSTGRES_URL"),
        _ => None,
    };
    let from_env;
    let to = match named {
        Some(var) => {
            from_env = std::env::var(var).map_err(|_| {
                anyhow::anyhow!(
                    "--to {to}: {var} is not set; paste `lockslab up`'s export lines first, or give a URL"
                )
            })?;
            from_env.as_str()
        }
        None => to,
    };
    let upstream = if to.contains("://") {
        upstream_of(to)?
    } else {
        upstream_of(&format!("tcp://{to}"))?
    };
    if let Err(err) = std::net::TcpStream::connect_timeout(&upstream, Duration::from_secs(1)) {
        crate::errln!(
            "warning: nothing answers at {upstream} ({err}): until a server listens there, the proxy resets every connection it is given"
        );
    }
    let mut proxy = Proxy::start_on("proxy", listen, upstream)?;
    if let Some(most) = connections_within_fd_limit() {
        proxy.limit_connections(most);
    }
    let port = proxy.addr().port();
    let socket = own_control_dir()?.join(format!("proxy-{port}.sock"));
    clear_for_socket(&socket, port)?;
    let control = UnixListener::bind(&socket)
        .with_context(|| format!("opening the control socket {}", socket.display()))?;
    let file = SocketFile(socket.clone());
    control.set_nonblocking(true)?;
    let removal = {
        let socket = socket.clone();
        crate::procs::on_interrupt(move || drop(SocketFile(socket.clone())))
    };
    crate::outln!("proxy {} → {upstream}, no fault", proxy.addr());
    if to.contains("://") {
        for line in how_to_use(to, named, proxy.addr())? {
            crate::outln!("{line}");
        }
    }
    crate::outln!("faults from another terminal: lockslab proxy fault {port} hold|heal|…");
    crate::outln!("Ctrl-C stops it");
    let started = Instant::now();
    let mut backoff = Duration::ZERO;
    while !crate::procs::interrupted() {
        match control.accept() {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                if let Some(done) = obey(&proxy, stream) {
                    crate::outln!("+{:.3}s  {done}", started.elapsed().as_secs_f64());
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(20));
            }
            // Out of file descriptors (or memory) for a moment: the fault waits in the
            // socket's queue until one is free; the proxy goes on relaying meanwhile.
            Err(err) if crate::proxy::accept_error_passes(&err) => {
                if backoff.is_zero() {
                    crate::errln!("lockslab proxy: the control socket waits: {err}");
                }
                backoff = crate::proxy::accept_backoff(backoff);
                thread::sleep(backoff);
            }
            Err(err) => bail!("the control socket failed: {err}"),
        }
    }
    proxy.stop();
    drop(file);
    drop(removal);
    crate::procs::wait_for_cleanup()
}

/// The lines that tell a learner which URL to use through the proxy, its password never on
/// the screen: masked, with a shell line that builds it from the variable `var` holds it in.
fn how_to_use(to: &str, var: Option<&str>, proxy: SocketAddr) -> Result<Vec<String>> {
    let url = through(to, proxy)?;
    let shown = crate::connect::redact(&url);
    if shown == url {
        return Ok(vec![format!("use this URL instead: {url}")]);
    }
    let mut lines = vec![format!("use this URL instead (password elided): {shown}")];
    match (var, shown.split_once("***@")) {
        (Some(var), Some((_, after))) => {
            lines.push("set it in a shell with the same export lines:".into());
            lines.push(format!("  export {var}=\"${{{var}%%@*}}@{after}\""));
        }
        _ => lines.push("(the password is the one in the URL you gave)".into()),
    }
    Ok(lines)
}

/// Reads one fault line, applies it, answers, and says what it did.
fn obey(proxy: &Proxy, stream: UnixStream) -> Option<String> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).ok()?;
    if line.trim().is_empty() {
        // Another proxy checking whether this one is alive.
        return None;
    }
    let answer = apply(proxy, line.trim());
    let mut stream = stream;
    let _ = writeln!(stream, "{answer}");
    Some(answer)
}

/// `up hold`, `both delay 500`, `up heal`…: the control socket's one-line language.
fn apply(proxy: &Proxy, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let directions = match words.first().copied() {
        Some("up") => vec![Direction::Up],
        Some("down") => vec![Direction::Down],
        Some("both") => vec![Direction::Up, Direction::Down],
        _ => return format!("error: not a fault line: {line}"),
    };
    let ms = words.get(2).and_then(|ms| ms.parse().ok()).unwrap_or(1000);
    let fault = match words.get(1).copied() {
        Some("heal") => None,
        Some("delay") => Some(NetFault::Delay { ms, jitter_ms: 0 }),
        Some("delay-next") => Some(NetFault::DelayNext { ms }),
        Some("hold") => Some(NetFault::Hold),
        Some("reset") => Some(NetFault::Reset),
        Some("black-hole") => Some(NetFault::BlackHole),
        Some("drop-reply") => Some(NetFault::DropReply),
        _ => return format!("error: no such fault: {line}"),
    };
    if matches!(
        fault,
        Some(NetFault::DelayNext { .. } | NetFault::DropReply)
    ) && directions != [Direction::Up]
    {
        return "error: delay-next and drop-reply aim at the next request: --direction up".into();
    }
    for &direction in &directions {
        match fault {
            Some(fault) => proxy.set(direction, fault),
            None => proxy.clear(direction),
        }
    }
    let unit = if words.len() > 2 { "ms" } else { "" };
    format!(
        "{line}{unit}: done ({} connection(s) open)",
        proxy.connections()
    )
}

/// The control line for a fault: `heal` lifts both directions unless told one, so that a
/// fault on the replies is not left behind; every other fault aims at the requests.
fn line_of(args: &FaultArgs) -> String {
    let way = match args.direction {
        Some(Way::Up) => "up",
        Some(Way::Down) => "down",
        Some(Way::Both) => "both",
        None if args.fault == FaultName::Heal => "both",
        None => "up",
    };
    let name = clap::ValueEnum::to_possible_value(&args.fault)
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    match args.fault {
        FaultName::Delay | FaultName::DelayNext => {
            let duration = args.duration.unwrap_or(Duration::from_secs(1));
            format!("{way} {name} {}", duration.as_millis())
        }
        _ => format!("{way} {name}"),
    }
}

fn send_fault(args: &FaultArgs) -> Result<()> {
    if args.duration.is_some() && !matches!(args.fault, FaultName::Delay | FaultName::DelayNext) {
        crate::bail_usage!("--for is how long a delay lasts: only delay and delay-next take it");
    }
    let socket = control_socket(args.port);
    let mut stream = match UnixStream::connect(&socket) {
        Ok(stream) => stream,
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
            // The file outlived its proxy (killed with no chance to remove it).
            let _ = std::fs::remove_file(&socket);
            bail!(
                "the proxy on port {} is gone (stale control socket {}, now removed): start \
                 `lockslab proxy` again",
                args.port,
                socket.display()
            );
        }
        Err(err) => {
            return Err(err).with_context(|| {
                format!(
                    "no proxy on port {} (no control socket {}): is `lockslab proxy` running?",
                    args.port,
                    socket.display()
                )
            });
        }
    };
    writeln!(stream, "{}", line_of(args))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut answer = String::new();
    if let Err(err) = BufReader::new(&stream).read_line(&mut answer) {
        bail!(
            "the proxy on port {} did not answer within 5s ({err}): if it is stopped, the fault \
             will still apply when it runs again; `lockslab proxy fault {} heal` lifts it",
            args.port,
            args.port
        );
    }
    let answer = answer.trim();
    if let Some(error) = answer.strip_prefix("error: ") {
        bail!("{error}");
    }
    crate::outln!("{answer}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(fault: FaultName, direction: Option<Way>) -> FaultArgs {
        FaultArgs {
            port: 1,
            fault,
            direction,
            duration: Some(Duration::from_millis(500)),
        }
    }

    #[test]
    fn the_url_to_use_never_shows_its_password() {
        let proxy: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        let lines = how_to_use(
            "redis://default:s3cret@127.0.0.1:6379/0",
            Some("LOCKSLAB_REDIS_URL"),
            proxy,
        )
        .unwrap();
        assert!(lines.iter().all(|l| !l.contains("s3cret")), "{lines:?}");
        assert_eq!(
            lines,
            vec![
                "use this URL instead (password elided): redis://default:***@127.0.0.1:41234/0",
                "set it in a shell with the same export lines:",
                "  export LOCKSLAB_REDIS_URL=\"${LOCKSLAB_REDIS_URL%%@*}@127.0.0.1:41234/0\"",
            ]
        );
        let given = how_to_use("postgres://u:pw@localhost/db", None, proxy).unwrap();
        assert!(given.iter().all(|l| !l.contains("pw@")), "{given:?}");
        assert_eq!(
            how_to_use("http://127.0.0.1:2379", Some("LOCKSLAB_ETCD_URL"), proxy).unwrap(),
            vec!["use this URL instead: http://127.0.0.1:41234"]
        );
    }

    #[test]
    fn heal_lifts_both_directions_unless_told_one_and_faults_aim_up() {
        assert_eq!(line_of(&args(FaultName::Heal, None)), "both heal");
        assert_eq!(
            line_of(&args(FaultName::Heal, Some(Way::Down))),
            "down heal"
        );
        assert_eq!(line_of(&args(FaultName::Hold, None)), "up hold");
        assert_eq!(
            line_of(&args(FaultName::Delay, Some(Way::Both))),
            "both delay 500"
        );
    }
}
