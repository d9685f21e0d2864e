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

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
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
    /// Where the proxy listens (a free port when 0)
    #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
    pub listen: SocketAddr,
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
    /// Which way: requests (up), replies (down), or both
    #[arg(long, value_enum, default_value_t = Way::Up)]
    pub direction: Way,
    /// How long a delay lasts (delay, delay-next), up to 10m
    #[arg(long = "for", default_value = "1s", value_name = "DURATION",
          value_parser = crate::flags::duration_in(Duration::ZERO, crate::flags::LONGEST_LAB_WAIT))]
    pub duration: Duration,
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
        None => serve(args.to.as_deref().unwrap_or_default(), args.listen),
    }
}

/// The control socket of the proxy listening on `port`.
pub fn control_socket(port: u16) -> PathBuf {
    std::env::temp_dir().join(format!("lockslab-proxy-{port}.sock"))
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
    let mut proxy = Proxy::start_on("proxy", listen, upstream)?;
    let port = proxy.addr().port();
    let socket = control_socket(port);
    let _ = std::fs::remove_file(&socket);
    let control = UnixListener::bind(&socket)
        .with_context(|| format!("opening the control socket {}", socket.display()))?;
    control.set_nonblocking(true)?;
    let removal = {
        let socket = socket.clone();
        crate::procs::on_interrupt(move || {
            let _ = std::fs::remove_file(&socket);
        })
    };
    crate::outln!("proxy {} → {upstream}, no fault", proxy.addr());
    if to.contains("://") {
        crate::outln!("use this URL instead: {}", through(to, proxy.addr())?);
    }
    crate::outln!("faults from another terminal: lockslab proxy fault {port} hold|heal|…");
    crate::outln!("Ctrl-C stops it");
    let started = Instant::now();
    while !crate::procs::interrupted() {
        match control.accept() {
            Ok((stream, _)) => {
                if let Some(done) = obey(&proxy, stream) {
                    crate::outln!("+{:.3}s  {done}", started.elapsed().as_secs_f64());
                }
            }
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                thread::sleep(Duration::from_millis(20));
            }
            Err(err) => bail!("the control socket failed: {err}"),
        }
    }
    proxy.stop();
    let _ = std::fs::remove_file(&socket);
    drop(removal);
    crate::procs::wait_for_cleanup()
}

/// Reads one fault line, applies it, answers, and says what it did.
fn obey(proxy: &Proxy, stream: UnixStream) -> Option<String> {
    stream.set_nonblocking(false).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).ok()?;
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

fn send_fault(args: &FaultArgs) -> Result<()> {
    let socket = control_socket(args.port);
    let mut stream = UnixStream::connect(&socket).with_context(|| {
        format!(
            "no proxy on port {} (no control socket {}): is `lockslab proxy` running?",
            args.port,
            socket.display()
        )
    })?;
    let way = match args.direction {
        Way::Up => "up",
        Way::Down => "down",
        Way::Both => "both",
    };
    let name = clap::ValueEnum::to_possible_value(&args.fault)
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    match args.fault {
        FaultName::Delay | FaultName::DelayNext => {
            writeln!(stream, "{way} {name} {}", args.duration.as_millis())?
        }
        _ => writeln!(stream, "{way} {name}")?,
    }
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
