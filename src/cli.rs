//! The command line: one subcommand per lab, plus the hands-on worker and server helpers.

use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};
use colored::Colorize;

use crate::hands_on::{self, HandsOnArgs};
use crate::labs::etcd_vs_redis::{self, EtcdVsRedisArgs};
use crate::labs::failover::{self, FailoverArgs};
use crate::labs::gc_pause::{self, GcPauseArgs};
use crate::labs::naive::{self, NaiveArgs};
use crate::labs::skip_locked::{self, SkipLockedArgs};
use crate::servers;
use crate::worker;

/// A bad value or combination of flags found after parsing: reported like clap's own
/// errors, with exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `bail!` for a command-line mistake: returns a [`UsageError`] (exit status 2).
#[macro_export]
macro_rules! bail_usage {
    ($($arg:tt)*) => {
        return Err($crate::cli::UsageError(format!($($arg)*)).into())
    };
}

/// Bad command line: an unknown flag, a malformed value, flags that do not fit together.
pub const EXIT_USAGE: u8 = 2;

/// The lab ran and its verdict was read back (a stale write is the lesson, not a failure).
pub const EXIT_OK: u8 = 0;
/// The lab could not run: a backend did not answer, a server would not start, a worker failed.
pub const EXIT_COULD_NOT_RUN: u8 = 1;

#[derive(Parser, Debug)]
#[command(
    name = "lockslab",
    version,
    about = "Learn distributed locks by breaking them: real workers, real Redis/etcd/Postgres, real SIGSTOP.",
    after_help = "\
Servers: each lab finds Redis, etcd and Postgres by --redis-url/--etcd-url/--postgres-url
(or LOCKSLAB_REDIS_URL…), then `lockslab up`'s servers, then the docker-compose.yml
defaults; if none answers it starts private servers from local binaries and removes them
afterwards.

Exit status:
  0    the lab ran and its verdict was read back from the store
  1    the lab could not run (a backend did not answer, a worker failed)
  2    bad command line (an unknown flag, a malformed duration or URL, flags that clash)
  130  interrupted by Ctrl-C (143 SIGTERM, 129 SIGHUP or the terminal closed); workers and
       servers were stopped
  141  stdout was closed early (`lockslab gc-pause | head`); workers and servers were stopped

Examples:
  lockslab gc-pause             lab 1: a frozen holder's stale write, without and with fencing
  lockslab naive                lab 2: four bugs of the naive Redis lock, each beside its fix
  lockslab skip-locked          lab 3: a Postgres job queue; kill and freeze a worker
  lockslab etcd-vs-redis        lab 4: who hands the lock over how fast, and who can fence
  lockslab up                   keep servers running for the hands-on exercises
  lockslab worker               take the lock by hand and freeze yourself with kill -STOP
  lockslab <lab> --help         options and examples of one lab

Walkthroughs: labs/01-gc-pause.md … labs/04-etcd-vs-redis.md in the repository."
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Lab 1: a lock holder freezes past its TTL; its stale write lands unfenced, is refused fenced
    GcPause(GcPauseArgs),
    /// Lab 2: the naive Redis lock broken every way, each bug beside its fix, with counts
    Naive(NaiveArgs),
    /// Lab 3: a Postgres job queue with FOR UPDATE SKIP LOCKED; kill and freeze a worker
    SkipLocked(SkipLockedArgs),
    /// Lab 4: kill or freeze the holder on Redis, etcd and Postgres; who recovers, who fences
    EtcdVsRedis(EtcdVsRedisArgs),
    /// Lab 5: no pause needed: a Redis failover hands the lock out twice, etcd's Raft does not
    Failover(FailoverArgs),
    /// Hands-on: take the lock, print the PID to freeze, work, write to the store, release
    #[command(after_help = "\
Example, in two terminals (after `lockslab up` and its export lines):
  1$ lockslab worker --fencing            # takes the lock, prints its PID
  2$ kill -STOP <pid>                     # freeze it; wait past the TTL (10s)
  2$ lockslab worker --fencing --work 2s  # takes the lock, writes (accepted), releases
  2$ kill -CONT <pid>                     # the first worker wakes and writes: REJECTED
Without --fencing on both, the late write is ACCEPTED and overwrites the second one's.")]
    Worker(HandsOnArgs),
    /// Start private Redis, etcd and Postgres and keep them running between commands
    Up,
    /// Stop the servers `lockslab up` started and delete their data
    Down,
    /// Show the servers `lockslab up` started and whether they answer
    Status,
    /// A lab's worker process (started by the labs themselves); its script is the first
    /// line on stdin, never an argument, since it holds the servers' passwords
    #[command(name = "__worker", hide = true)]
    InternalWorker,
    /// Private servers for as long as stdin stays open: prints their URLs as one JSON line
    /// (used by the test suite, which must never depend on fixed ports)
    #[command(name = "__serve", hide = true)]
    Serve,
}

/// Parses the command line and runs it; errors are printed once, by `main`.
pub fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    if let Command::InternalWorker = &cli.command {
        return Ok(worker::run_internal());
    }
    crate::procs::install_interrupt_handler()?;
    match cli.command {
        Command::GcPause(args) => gc_pause::run(&args)?,
        Command::Naive(args) => naive::run(&args)?,
        Command::SkipLocked(args) => skip_locked::run(&args)?,
        Command::EtcdVsRedis(args) => etcd_vs_redis::run(&args)?,
        Command::Failover(args) => failover::run(&args)?,
        Command::Worker(args) => hands_on::hands_on(&args)?,
        Command::Up => up()?,
        Command::Down => {
            if servers::down()? {
                crate::outln!("stopped the servers `lockslab up` started");
            } else {
                crate::outln!("no servers from `lockslab up` to stop");
            }
        }
        Command::Status => status()?,
        Command::Serve => servers::serve_until_stdin_closes()?,
        Command::InternalWorker => unreachable!("handled above"),
    }
    Ok(ExitCode::from(EXIT_OK))
}

fn up() -> Result<()> {
    let state = servers::up()?;
    crate::outln!(
        "{}",
        "Private servers are running (until `lockslab down`):".bold()
    );
    crate::outln!("  Redis     {}", state.redis.as_deref().unwrap_or("-"));
    crate::outln!("  etcd      {}", state.etcd.as_deref().unwrap_or("-"));
    crate::outln!("  Postgres  {}", state.postgres.as_deref().unwrap_or("-"));
    crate::outln!(
        "Labs here find them by themselves. In another terminal, or for redis-cli/psql, paste:"
    );
    for line in state.exports() {
        crate::outln!("  {line}");
    }
    Ok(())
}

/// Lists `up`'s servers; exits 1 (with one line saying what to do) when one does not answer,
/// so that scripts can rely on `lockslab status && …`.
fn status() -> Result<()> {
    let Some((state, health)) = servers::status()? else {
        crate::outln!(
            "no servers from `lockslab up`; labs will use docker-compose defaults or private servers"
        );
        return Ok(());
    };
    for (backend, answers) in &health {
        let url = state.url(*backend).unwrap_or("-");
        let mark = if *answers {
            "up".green().bold()
        } else {
            "not answering".red().bold()
        };
        crate::outln!("  {:<9} {url}  {mark}", backend.name());
    }
    for line in state.exports() {
        crate::outln!("  {line}");
    }
    if state.starting {
        anyhow::bail!(
            "`lockslab up` has not finished starting its servers (still running, or interrupted): \
             run `lockslab up` again, or `lockslab down`"
        );
    }
    let down: Vec<&str> = health
        .iter()
        .filter(|(_, answers)| !answers)
        .map(|(backend, _)| backend.name())
        .collect();
    if !down.is_empty() {
        anyhow::bail!(
            "{} of `lockslab up` not answering: run `lockslab up` to restart, or `lockslab down`",
            down.join(" and ")
        );
    }
    Ok(())
}
