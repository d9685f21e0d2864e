//! A worker process as the stage holds it: told commands on its stdin, frozen, resumed,
//! killed, and reaped when dropped.

use std::io::Write;
use std::process::ChildStdin;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::procs::{self, StopPlan};

/// A running worker process. Dropping it resumes, kills and reaps the process.
pub struct WorkerHandle {
    pub name: String,
    pub pid: i32,
    pub(super) stdin: Option<ChildStdin>,
    pub(super) reaped: bool,
    /// Reaped while the run went on (`reap_if_exited`): it had exited by itself.
    pub(super) exited_by_itself: bool,
}

impl WorkerHandle {
    /// Sends the worker a command line on its stdin (`finish`, `release`…).
    pub fn tell(&mut self, command: &str) -> Result<()> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("worker {} no longer listens", self.name))?;
        writeln!(stdin, "{command}")
            .and_then(|_| stdin.flush())
            .with_context(|| format!("telling worker {} to {command}", self.name))
    }

    /// SIGSTOP to the worker's process group: it stops mid-instruction, like a GC pause.
    pub fn freeze(&self) -> Result<()> {
        procs::signal_group(self.pid, Signal::SIGSTOP)
    }

    /// SIGCONT: the worker carries on exactly where it stopped, unaware of the gap.
    pub fn resume(&self) -> Result<()> {
        procs::signal_group(self.pid, Signal::SIGCONT)
    }

    /// SIGKILL, the way a crash ends a client: no cleanup code runs.
    pub fn kill(&mut self) {
        if !self.reaped {
            procs::stop(self.pid, &StopPlan::kill());
            self.reaped = true;
        }
    }

    /// Waits up to `timeout` for the worker to exit by itself; kills it after that.
    pub fn finish(&mut self, timeout: Duration) -> bool {
        self.stdin.take();
        let deadline = Instant::now() + timeout;
        while !self.reaped {
            if self.try_reap() {
                return true;
            }
            if Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        if self.exited_by_itself {
            return true;
        }
        self.kill();
        false
    }

    /// Reaps the worker if it has exited by itself, without waiting: true if it just did.
    fn try_reap(&mut self) -> bool {
        if self.reaped
            || matches!(
                waitpid(Pid::from_raw(self.pid), Some(WaitPidFlag::WNOHANG)),
                Ok(WaitStatus::StillAlive)
            )
        {
            return false;
        }
        self.reaped = true;
        self.exited_by_itself = true;
        procs::forget(self.pid);
        true
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The stage is the run's history: the nemesis records its faults here.
/// A worker is a process the nemesis can pause, resume and kill.
impl crate::nemesis::Victim for WorkerHandle {
    fn label(&self) -> String {
        self.name.clone()
    }

    fn pid(&self) -> Option<i32> {
        (!self.reaped).then_some(self.pid)
    }

    fn kill_now(&mut self) {
        self.kill();
    }

    fn reap_if_exited(&mut self) {
        self.try_reap();
    }
}
