//! lockslab as its clients' child subreaper: a process a client started and left behind
//! — double-forked, in a session of its own (`setsid`), its environment cleared (`env -i`)
//! so that no mark finds it — is reparented to lockslab rather than to init, stays below
//! it in the process tree, and is killed with the run: at its end, and on Ctrl-C.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use crate::procs::{self, InterruptCleanup};

/// While it lives, lockslab is a child subreaper; dropped, it kills every process below
/// lockslab that was not there when it started (the servers, the watchdog), and reaps them.
pub struct Reaper {
    keep: BTreeSet<i32>,
    _on_interrupt: InterruptCleanup,
}

impl Reaper {
    /// Starts adopting orphans. Whatever is below lockslab now (its servers and the
    /// watchdog, started before any client) is spared at the end.
    pub fn start() -> Result<Reaper> {
        nix::sys::prctl::set_child_subreaper(true)
            .context("making lockslab its clients' subreaper (prctl)")?;
        let keep: BTreeSet<i32> = procs::descendants(std::process::id() as i32)
            .into_iter()
            .collect();
        let spared = keep.clone();
        Ok(Reaper {
            keep,
            _on_interrupt: procs::on_interrupt(move || kill_all_but(&spared)),
        })
    }
}

impl Drop for Reaper {
    fn drop(&mut self) {
        kill_all_but(&self.keep);
        let _ = nix::sys::prctl::set_child_subreaper(false);
    }
}

/// SIGKILLs every process below lockslab but `keep` (and what is below those), in rounds
/// until none is left — one may fork while it is swept, and its orphans come to lockslab —
/// reaping each that became lockslab's child.
fn kill_all_but(keep: &BTreeSet<i32>) {
    let me = std::process::id() as i32;
    let until = Instant::now() + Duration::from_secs(2);
    loop {
        // One reading of the process table: reading the spared ones' children first and
        // lockslab's afterwards SIGKILLed a Postgres backend forked in between, and
        // crashed the run's Postgres (12 runs in 1,200).
        let left = procs::descendants_but(me, keep);
        for &pid in &left {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        for &pid in &left {
            // Only lockslab's own children can be reaped here; for the others it says
            // ECHILD, and they come back as its children in the next round.
            let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
        }
        if left.is_empty() || Instant::now() > until {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
