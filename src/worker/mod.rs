//! The worker side: the hidden entry point the labs start, and the hands-on `lockslab worker`.
//!
//! A lab's workers are this binary, re-executed as `lockslab __worker`. The first line on
//! their stdin is their script, as JSON (never an argument: it holds the servers' URLs with
//! their passwords, and anyone can read a command line). They report what they do as
//! events on stdout and take commands (`finish`) on the following lines of stdin, so that
//! the orchestrator decides when the story moves on, while every lock operation and every
//! write is the worker's own, made over its own connections.

pub mod chaos_client;
pub mod consumer;
pub mod guarded;
pub mod holder;
pub mod invoicer;
pub mod queuer;
pub mod racer;
pub mod redlock_client;
pub mod sentinel_client;

use std::io::{self, BufRead};

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::events::{Emitter, What};

/// Every worker script, by what the worker does (not by which lab starts it): a lab picks
/// a script and fills it in. None of them knows the labs.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "worker", rename_all = "kebab-case")]
pub enum WorkerSpec {
    /// Take a lock, work or be frozen, write to the fenced store, let go (labs 1 and 4).
    Holder(holder::HolderScript),
    /// Race for a fresh lock on every trial, or hold one naive lock (lab 2).
    Racer(racer::Role),
    /// Claim and process jobs from the queue, round by round (lab 3).
    Consumer(consumer::Role),
    /// Find the primary through Sentinel, take the lock there, write when told (lab 5).
    SentinelClient(sentinel_client::SentinelClient),
    /// Take a Redlock on N masters, freeze, wake, write three ways, release (lab 6).
    RedlockClient(redlock_client::RedlockClientScript),
    /// Walk the job list and invoice what is not done yet, one approach's way (lab 7).
    Invoicer(invoicer::Role),
    /// Take a Redis lock, let a lease guard decide whether to write, stop where told (lab 9).
    Guarded(guarded::GuardedScript),
    /// Join a queue for one lock, one of three ways; hold, let go (lab 10).
    Queuer(queuer::QueuerScript),
    /// Read-modify-write jobs on shared records, one lock design's way (`lockslab chaos`).
    ChaosClient(chaos_client::ChaosClient),
}

/// `lockslab __worker`: reads one worker script from stdin's first line, runs it, and
/// reports failure as an event.
pub fn run_internal() -> crate::exit::Exit {
    crate::seed::start_from_environment();
    let mut line = String::new();
    // Stdin's buffer is shared: what follows the script stays there for `await_command`.
    let spec = match io::stdin().lock().read_line(&mut line) {
        Ok(0) => Err("stdin closed before the script arrived".to_string()),
        Ok(_) => serde_json::from_str::<WorkerSpec>(&line).map_err(|err| err.to_string()),
        Err(err) => Err(err.to_string()),
    };
    let spec = match spec {
        Ok(spec) => spec,
        Err(err) => {
            crate::errln!("lockslab worker: bad script on stdin: {err}");
            return crate::exit::Exit::Usage;
        }
    };
    let (name, result) = match spec {
        WorkerSpec::Holder(script) => (script.name.clone(), holder::run(&script)),
        WorkerSpec::Racer(role) => (role.name.clone(), racer::run(&role)),
        WorkerSpec::Consumer(role) => (role.name.clone(), consumer::run(&role)),
        WorkerSpec::SentinelClient(script) => (script.name.clone(), sentinel_client::run(&script)),
        WorkerSpec::RedlockClient(script) => (script.name.clone(), redlock_client::run(&script)),
        WorkerSpec::Invoicer(role) => (role.name.clone(), invoicer::run(&role)),
        WorkerSpec::Guarded(script) => (script.name.clone(), guarded::run(&script)),
        WorkerSpec::Queuer(script) => (script.name.clone(), queuer::run(&script)),
        WorkerSpec::ChaosClient(script) => (script.name.clone(), chaos_client::run(&script)),
    };
    match result.map_err(crate::connect::explain) {
        Ok(()) => crate::exit::Exit::Done,
        Err(err) => {
            Emitter::new(&name).say(What::Error, format!("{err:#}"));
            crate::exit::Exit::CouldNotRun
        }
    }
}

/// Blocks until the orchestrator sends `expected` on stdin. End of input means the
/// orchestrator is gone, and so should this worker be.
pub fn await_command(expected: &str) -> Result<()> {
    let mut line = String::new();
    loop {
        line.clear();
        if io::stdin().lock().read_line(&mut line)? == 0 {
            bail!("the lab went away while this worker waited for `{expected}`");
        }
        if line.trim() == expected {
            return Ok(());
        }
    }
}
