//! Child processes: spawn them, freeze them, kill them — and never leave one behind.
//!
//! A lab that leaves a frozen worker behind ruins a workshop, so every child lockslab starts
//! goes through this module:
//!
//! - it asks the kernel to kill the child if lockslab dies (`PR_SET_PDEATHSIG`), and checks
//!   `getppid` right after, because the parent may already have died before the request;
//! - it puts the child in its own process group, so the terminal's Ctrl-C reaches lockslab
//!   only, and lockslab decides how each child ends;
//! - it records the child in a registry, so that one Ctrl-C, SIGTERM or SIGHUP (or a stdout
//!   that nobody reads any more) can resume, end and reap every child that is still alive,
//!   wherever the lab happened to be — whether or not anything can still be printed.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that spawned the child exits, not the process.
//! Spawn children from the main thread (or a thread that lives as long as they do).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// How a registered child is asked to stop.
#[derive(Clone, Debug)]
pub struct StopPlan {
    /// The first signal: SIGKILL for workers, a graceful one for servers.
    pub signal: Signal,
    /// How long to wait for a graceful exit before SIGKILL.
    pub grace: Duration,
}

impl StopPlan {
    pub fn kill() -> StopPlan {
        StopPlan {
            signal: Signal::SIGKILL,
            grace: Duration::ZERO,
        }
    }
}

/// Every live child, by pid. The interrupt handler ends them all.
static LIVE: Mutex<Option<HashMap<i32, StopPlan>>> = Mutex::new(None);

/// A directory to delete, and the function that deletes it.
type DirRemoval = (PathBuf, fn(&Path));

/// Directories to delete once every child is gone (private servers' data).
static DIRS: Mutex<Vec<DirRemoval>> = Mutex::new(Vec::new());

/// Deletes `dir` when the children are stopped on an interrupt or a closed stdout.
pub fn remove_on_cleanup(dir: PathBuf) {
    remove_on_cleanup_with(dir, |dir| {
        let _ = fs::remove_dir_all(dir);
    });
}

/// Like [`remove_on_cleanup`], for a directory that needs more than deleting its files
/// (a Postgres directory names a shared-memory segment to release first).
pub fn remove_on_cleanup_with(dir: PathBuf, remove: fn(&Path)) {
    DIRS.lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((dir, remove));
}

/// The directory was deleted the normal way: nothing left to do for it.
pub fn forget_dir(dir: &Path) {
    DIRS.lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(d, _)| d != dir);
}

type Cleanup = Box<dyn FnOnce() + Send>;

/// A lab's own mess (its rows, tables and keys on a shared server), by registration number.
static CLEANUPS: Mutex<Vec<(u64, Cleanup)>> = Mutex::new(Vec::new());

/// Runs `cleanup` if lockslab is interrupted while the guard lives, after the workers are
/// stopped and before the private servers are. Dropping the guard unregisters it: the lab
/// then cleans up the normal way.
pub fn on_interrupt(cleanup: impl FnOnce() + Send + 'static) -> InterruptCleanup {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    CLEANUPS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((id, Box::new(cleanup)));
    InterruptCleanup { id }
}

pub struct InterruptCleanup {
    id: u64,
}

impl Drop for InterruptCleanup {
    fn drop(&mut self) {
        // Once shutting down, the handler runs it after the workers are dead: a lab that
        // unwinds meanwhile must not take it away (nor clean up while a worker still writes).
        if interrupted() {
            return;
        }
        CLEANUPS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, _)| *id != self.id);
    }
}

fn run_cleanups() {
    let cleanups: Vec<(u64, Cleanup)> = CLEANUPS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .drain(..)
        .collect();
    for (_, cleanup) in cleanups {
        cleanup();
    }
}

/// Deletes the registered directories, holding the registry's lock until done.
///
/// The first Ctrl-C's cleanup and the second Ctrl-C's "quit now" both end here, on two
/// threads, and each exits the process right after: the one that comes second waits here
/// instead of exiting in the middle of the other's removal (which left half a directory,
/// its Postgres's shared memory with it).
fn remove_registered_dirs() {
    let mut dirs = DIRS.lock().unwrap_or_else(|p| p.into_inner());
    for (dir, remove) in dirs.drain(..) {
        remove(&dir);
    }
}

fn with_live<T>(f: impl FnOnce(&mut HashMap<i32, StopPlan>) -> T) -> T {
    let mut guard = LIVE.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// Makes `command` a well-behaved child: own process group, dies with lockslab, and takes
/// SIGINT, SIGTERM and SIGHUP again (the thread that spawns it blocks them, and a child
/// inherits its parent's signal mask: a server would ignore the SIGTERM that stops it).
pub fn tie_to_parent(command: &mut Command) {
    let parent = nix::unistd::getpid();
    let unblock = interrupt_signals();
    command.process_group(0);
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: prctl, sigprocmask and getppid are plain system
    // calls, and the error is built from a raw errno without allocating.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            unblock.thread_unblock()?;
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc_esrch()));
            }
            Ok(())
        });
    }
}

/// Spawns a child that is someone else's code (a learner's challenge client), tied to
/// lockslab and registered as [`spawn_registered`] does, but in a session of its own rather
/// than a process group of lockslab's session: it has no controlling terminal, so it can
/// neither open `/dev/tty` nor push keystrokes into the shell of whoever runs lockslab
/// (`TIOCSTI`), and the terminal's signals never reach it. `setsid` also makes it the leader
/// of a new process group (its pid), so the group is signalled as every other child's.
///
/// With `user`, it drops root for that uid and gid (and no supplementary groups) before it
/// runs. The parent-death signal is set after that switch: the kernel clears it whenever a
/// process's credentials change, and a client of a SIGKILLed lockslab would live on.
pub fn spawn_registered_alone(
    command: &mut Command,
    plan: StopPlan,
    user: Option<(nix::unistd::Uid, nix::unistd::Gid)>,
    cgroup: Option<&std::ffi::CStr>,
) -> io::Result<Child> {
    let join = cgroup.map(|procs| procs.to_owned());
    let parent = nix::unistd::getpid();
    let unblock = interrupt_signals();
    // SAFETY: the closure runs in the child between fork and exec, where only
    // async-signal-safe calls are allowed: setsid, prctl, setrlimit, setgroups (with an empty
    // list, nothing allocated), setgid, setuid, sigprocmask and getppid are plain system calls, and
    // errors are built from a raw errno without allocating.
    unsafe {
        command.pre_exec(move || {
            nix::unistd::setsid()?;
            // Into its cgroup while still root (the cgroup's files are root's).
            if let Some(join) = &join {
                write_own_pid(join)?;
            }
            if let Some((uid, gid)) = user {
                // No setuid program it runs gains what its user has not. (Not for a
                // sandbox: `bwrap` may itself be setuid.)
                nix::sys::prctl::set_no_new_privs()?;
                // A user of its own: its fork bomb stops at this many processes, not at the
                // machine's (the hostile tester's client was allowed 96370).
                let most = CLIENT_PROCESSES;
                nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NPROC,
                    most,
                    most,
                )?;
                nix::unistd::setgroups(&[])?;
                nix::unistd::setgid(gid)?;
                nix::unistd::setuid(uid)?;
            }
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            unblock.thread_unblock()?;
            if nix::unistd::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc_esrch()));
            }
            Ok(())
        });
    }
    spawn_untied_registered(command, plan)
}

/// How many processes a client's user may run at once (`RLIMIT_NPROC`): far more than a
/// lock client and its helpers need, far fewer than would starve the machine.
pub const CLIENT_PROCESSES: u64 = 256;

/// Steps to take on the way out before any child is stopped (thawing frozen cgroups: a
/// frozen process does not die of SIGKILL until it is thawed).
static BEFORE_STOPPING: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

/// Registers `step` to run first when lockslab is interrupted (once per step: register it
/// once).
pub fn before_stopping(step: fn()) {
    BEFORE_STOPPING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(step);
}

fn run_before_stopping() {
    let steps = BEFORE_STOPPING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    for step in steps {
        step();
    }
}

/// Writes the calling process's pid to `file` (a cgroup's `cgroup.procs`, to join it):
/// for the child between fork and exec, so only plain system calls (open, write, close)
/// and no allocation.
fn write_own_pid(file: &std::ffi::CStr) -> io::Result<()> {
    let fd = nix::fcntl::open(
        file,
        nix::fcntl::OFlag::O_WRONLY,
        nix::sys::stat::Mode::empty(),
    )?;
    let mut digits = [0u8; 12];
    let mut at = digits.len();
    let mut pid = nix::unistd::getpid().as_raw() as u32;
    loop {
        at -= 1;
        digits[at] = b'0' + (pid % 10) as u8;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    nix::unistd::write(&fd, &digits[at..])?;
    Ok(())
}

fn libc_esrch() -> i32 {
    nix::errno::Errno::ESRCH as i32
}

/// Spawns a child tied to lockslab and registers it for cleanup.
///
/// Spawning and registering happen under the registry's lock, and not at all once cleanup
/// has begun: otherwise a child born just as Ctrl-C arrived could miss the cleanup and live
/// on for a moment — long enough to take a lock that the cleanup had just deleted.
pub fn spawn_registered(command: &mut Command, plan: StopPlan) -> io::Result<Child> {
    tie_to_parent(command);
    spawn_untied_registered(command, plan)
}

/// Spawns a child that is not tied to lockslab (`lockslab up`'s servers outlive it) and
/// registers it for cleanup until lockslab exits: an interrupted `up` stops it too. Under the
/// registry's lock, as [`spawn_registered`], for the same reason.
pub fn spawn_untied_registered(command: &mut Command, plan: StopPlan) -> io::Result<Child> {
    with_live(|live| {
        if interrupted() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "lockslab is shutting down",
            ));
        }
        let child = command.spawn()?;
        live.insert(child.id() as i32, plan);
        Ok(child)
    })
}

/// Removes a child from the registry once it is known to be gone and reaped.
pub fn forget(pid: i32) {
    with_live(|live| live.remove(&pid));
}

/// Sends `signal` to the child's whole process group.
pub fn signal_group(pid: i32, signal: Signal) -> Result<()> {
    killpg(Pid::from_raw(pid), signal)
        .with_context(|| format!("sending {signal} to process group {pid}"))
}

/// True while the process is stopped (state `T` in `/proc/<pid>/stat`).
pub fn is_stopped(pid: i32) -> bool {
    process_state(pid) == Some('T')
}

/// The one-letter state of a process (`R`, `S`, `T`, `Z`…), or None when it is gone.
pub fn process_state(pid: i32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state follows the last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.trim_start().chars().next()
}

/// Waits until the process is stopped, or the timeout passes.
pub fn wait_until_stopped(pid: i32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if is_stopped(pid) {
            return true;
        }
        thread::sleep(Duration::from_millis(5));
    }
    false
}

/// Ends one child the way its plan says, and reaps it.
///
/// The child is resumed first: a stopped process does not act on SIGTERM until it is
/// continued, and a stopped process group left behind is exactly the mess we refuse to leave.
pub fn stop(pid: i32, plan: &StopPlan) {
    let group = Pid::from_raw(pid);
    // A server's own children may live in sessions of their own (Postgres's backends do),
    // out of the group's reach: a frozen one would outlive its server, stopped. Found now,
    // while they are still its children; resumed, and killed once it is gone.
    let own_children = descendants(pid);
    for &child in &own_children {
        let _ = kill(Pid::from_raw(child), Signal::SIGCONT);
    }
    if plan.signal == Signal::SIGKILL {
        // SIGKILL ends even a stopped process; the SIGCONT that follows makes sure nothing
        // in the group stays stopped, without letting a frozen worker run a single step.
        let _ = killpg(group, Signal::SIGKILL);
        let _ = killpg(group, Signal::SIGCONT);
    } else {
        let _ = killpg(group, Signal::SIGCONT);
        let _ = kill(group, plan.signal);
    }
    let deadline = Instant::now() + plan.grace;
    loop {
        match waitpid(group, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                thread::sleep(Duration::from_millis(10))
            }
            Ok(WaitStatus::StillAlive) => {
                FrozenFamily::freeze(pid).kill();
                break;
            }
            // Exited and reaped now, or reaped earlier (ECHILD), or not our child.
            _ => break,
        }
    }
    // Whatever else lived in the group (a server's helpers) goes too, and so do its
    // children in other sessions.
    let _ = killpg(group, Signal::SIGKILL);
    for &child in &own_children {
        let _ = kill(Pid::from_raw(child), Signal::SIGKILL);
    }
    forget(pid);
}

/// Kills every process that runs as one of `uids`, whatever its name, directory or parent:
/// for users that belong to lockslab alone (a room's seats', a challenge client's), whose
/// processes are all servers it started or what those started. Again until none is left
/// (one may fork while the others are killed), up to a point.
pub fn kill_every_process_of(uids: &[u32]) {
    for &uid in uids {
        for _ in 0..50 {
            if signal_as(uid, Signal::SIGKILL) != Signalled::Some {
                break;
            }
            thread::sleep(Duration::from_millis(2));
        }
    }
}

/// Sends `signal` to every process of `uid` (a user lockslab made for one client) at once:
/// a pause freezes them all, and a resume lets them all go. False if it could not be sent
/// (each helper that was to send it stopped or killed by the user's own processes).
pub fn signal_every_process_of(uid: u32, signal: Signal) -> bool {
    signal_as(uid, signal) != Signalled::Failed
}

#[derive(PartialEq, Eq)]
enum Signalled {
    Some,
    None,
    Failed,
}

/// `kill(-1, signal)` sent by a process that is `uid` and nothing else: the kernel delivers
/// it to every process that user may signal (those whose real or saved uid is `uid`) in one
/// pass, so neither a process that forks and exits over and over, nor one whose main
/// thread has exited while others run (`/proc` shows it a zombie), slips between two
/// readings of `/proc` as a scan would. Only lockslab's own users may be given: as root
/// it can become any of them.
fn signal_as(uid: u32, signal: Signal) -> Signalled {
    // Once the helper is `uid`, the user's processes may signal it too: one that stops it
    // (a client looping `kill(-1, SIGSTOP)`, woken by our SIGCONT) would leave lockslab
    // waiting for it for ever. A helper that is stopped, killed or slow is killed, and the
    // signal sent again by a new one.
    for _ in 0..5 {
        if let Some(signalled) = signal_as_once(uid, signal) {
            return signalled;
        }
    }
    Signalled::Failed
}

/// One helper's try at [`signal_as`]; None if it did not get to say how it went.
fn signal_as_once(uid: u32, signal: Signal) -> Option<Signalled> {
    let id = nix::unistd::Uid::from_raw(uid);
    let gid = nix::unistd::Gid::from_raw(uid);
    // SAFETY: the child of a fork in a threaded process may make only async-signal-safe
    // calls: setsid, setgroups with an empty list, setresgid, setresuid, kill and _exit are
    // plain system calls, and nothing is allocated.
    let child = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let code = (|| {
                // A session of its own first: SIGCONT may be sent to any process of the
                // sender's session, whoever owns it, so from lockslab's session a
                // `kill(-1, SIGCONT)` would wake every frozen process there (a lab's
                // worker mid-pause included), not only the user's.
                nix::unistd::setsid().ok()?;
                nix::unistd::setgroups(&[]).ok()?;
                nix::unistd::setresgid(gid, gid, gid).ok()?;
                nix::unistd::setresuid(id, id, id).ok()?;
                Some(match kill(Pid::from_raw(-1), signal) {
                    Ok(()) => 0,
                    Err(nix::errno::Errno::ESRCH) => 1,
                    Err(_) => 2,
                })
            })()
            .unwrap_or(2);
            // SAFETY: _exit ends the child at once, running nothing of the parent's.
            unsafe { nix::libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
        Err(_) => return Some(Signalled::Failed),
    };
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut nap = Duration::from_micros(50);
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG | WaitPidFlag::WUNTRACED)) {
            Ok(WaitStatus::Exited(_, 0)) => return Some(Signalled::Some),
            Ok(WaitStatus::Exited(_, 1)) => return Some(Signalled::None),
            Ok(WaitStatus::Exited(..)) | Err(_) => return Some(Signalled::Failed),
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(5));
            }
            // Stopped or killed by the user's processes, or stuck: gone, and tried again.
            _ => {
                let _ = kill(child, Signal::SIGKILL);
                let _ = waitpid(child, None);
                return None;
            }
        }
    }
}

/// Every process below `pid` (children, their children…), read from /proc.
pub(crate) fn descendants(pid: i32) -> Vec<i32> {
    descendants_but(pid, &std::collections::BTreeSet::new())
}

/// Every process below `pid` but those below the `spared` ones (and those themselves), from
/// one reading of the process table: a process forked between two readings (a Postgres
/// backend, say, under a spared postmaster) would be under no spared process in the first
/// and below `pid` in the second.
pub(crate) fn descendants_but(pid: i32, spared: &std::collections::BTreeSet<i32>) -> Vec<i32> {
    descendants_in(&parents_and_groups(), pid, spared)
}

/// Every process with its parent and its process group, `(pid, ppid, pgid)`, from one
/// reading of /proc.
fn parents_and_groups() -> Vec<(i32, i32, i32)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|process| {
            let stat = std::fs::read_to_string(format!("/proc/{process}/stat")).ok()?;
            // `pid (comm) state ppid pgrp …`: the comm may hold spaces and parentheses.
            let mut after = stat.rsplit_once(')')?.1.split_whitespace().skip(1);
            let ppid = after.next()?.parse().ok()?;
            let pgid = after.next()?.parse().ok()?;
            Some((process, ppid, pgid))
        })
        .collect()
}

/// Every process below `pid` but those below the `spared` ones (and those themselves), in
/// one reading of the table of [`parents_and_groups`].
fn descendants_in(
    table: &[(i32, i32, i32)],
    pid: i32,
    spared: &std::collections::BTreeSet<i32>,
) -> Vec<i32> {
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for &(child, ppid, _) in table {
            if ppid == parent && !spared.contains(&child) && !found.contains(&child) {
                found.push(child);
                frontier.push(child);
            }
        }
    }
    found
}

/// Ends every registered child: used on Ctrl-C, SIGTERM and SIGHUP (through [`shut_down`]).
///
/// Each child leaves the registry only once it is stopped, so that a second Ctrl-C in the
/// middle still finds, and kills, whatever is left.
pub fn stop_all() {
    run_before_stopping();
    let live: Vec<(i32, StopPlan)> = with_live(|live| {
        // Under the registry's lock: no child can be spawned after this snapshot.
        INTERRUPTED.store(true, Ordering::SeqCst);
        live.iter()
            .map(|(pid, plan)| (*pid, plan.clone()))
            .collect()
    });
    // Workers first (instant), then servers (graceful, may take a moment).
    let (workers, servers): (Vec<_>, Vec<_>) = live
        .into_iter()
        .partition(|(_, plan)| plan.signal == Signal::SIGKILL);
    for (pid, plan) in &workers {
        stop(*pid, plan);
    }
    run_cleanups();
    // All at once: an etcd takes over a second to stop, and a room has one per seat.
    thread::scope(|scope| {
        for (pid, plan) in &servers {
            scope.spawn(move || stop(*pid, plan));
        }
    });
    remove_registered_dirs();
    reap_stray_children();
}

/// The last sweep before an interrupted lockslab exits: reaps every child that is already
/// dead, and kills and reaps any of its own workers (`lockslab __worker`) still running.
///
/// The registry should have had them all. This is for one it somehow did not: a CI run saw
/// a worker outlive an interrupted shrink by a moment, killed by its parent-death signal and
/// left a zombie for init. A worker never outlives lockslab; a server `lockslab up` keeps
/// (a child too) is left alone.
fn reap_stray_children() {
    let own = std::process::id() as i32;
    for child in children_of(own) {
        let is_worker = fs::read(format!("/proc/{child}/cmdline"))
            .is_ok_and(|line| line.split(|b| *b == 0).any(|arg| arg == b"__worker"));
        let pid = Pid::from_raw(child);
        if is_worker {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = kill(pid, Signal::SIGCONT);
            let _ = waitpid(pid, None);
        } else if process_state(child) == Some('Z') {
            let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// The processes whose parent is `pid`, read from /proc.
fn children_of(pid: i32) -> Vec<i32> {
    (parents_and_groups().into_iter())
        .filter(|&(_, ppid, _)| ppid == pid)
        .map(|(child, _, _)| child)
        .collect()
}

/// Kills every registered child at once, without waiting: the second Ctrl-C.
fn kill_all_now() {
    run_before_stopping();
    let live: Vec<(i32, StopPlan)> = with_live(|live| {
        INTERRUPTED.store(true, Ordering::SeqCst);
        live.drain().collect()
    });
    for (pid, _) in live {
        FrozenFamily::freeze(pid).kill();
    }
    remove_registered_dirs();
    reap_stray_children();
}

/// The `/dev/shm/PostgreSQL.*` files process `pid` has mapped (none once it is gone, or if
/// its maps cannot be read).
pub fn postgres_segments_mapped_by(pid: i32) -> Vec<std::path::PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    maps.lines()
        // `range perms offset dev inode path`: the path is the sixth field.
        .filter_map(|line| line.split_whitespace().nth(5))
        .filter(|path| is_postgres_segment(Path::new(path)))
        .map(std::path::PathBuf::from)
        .collect()
}

/// The `/dev/shm/PostgreSQL.*` files process `pid` holds open: a segment between its
/// `shm_open` and its `mmap` is only that.
fn postgres_segments_open_in(pid: i32) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    (entries.flatten())
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter(|path| is_postgres_segment(path))
        .collect()
}

fn is_postgres_segment(path: &Path) -> bool {
    path.to_str()
        .is_some_and(|path| path.starts_with("/dev/shm/PostgreSQL."))
}

/// One of lockslab's children and every process of its group or below it, stopped, with the
/// POSIX shared-memory segments (`/dev/shm/PostgreSQL.*`) they hold: what a SIGKILL of that
/// child is about to leave behind.
///
/// A Postgres cleans its segments up as it exits, but not when SIGKILL ends it: they stay in
/// `/dev/shm` until the machine restarts. lockslab's servers keep theirs in their data
/// directory (`dynamic_shared_memory_type=mmap`), which goes with the directory; the
/// `postgres` that `initdb` runs cannot be told so, and a second Ctrl-C kills it. These
/// names were held by our own children, now dead, so no one else uses them.
///
/// Everything is stopped before it is looked at: a process still running could create a
/// segment between the look and the kill (a CI run once left one that way). Found by group
/// as well as by parent, for `initdb`'s `postgres` outlives an `initdb` that a first Ctrl-C
/// ended, and stays in its group. A segment mapped by nobody and open in nobody (one
/// unmapped a moment before its `shm_unlink`) is not seen.
struct FrozenFamily {
    group: Pid,
    members: Vec<i32>,
    segments: Vec<std::path::PathBuf>,
}

impl FrozenFamily {
    fn freeze(pid: i32) -> FrozenFamily {
        let group = Pid::from_raw(pid);
        let _ = killpg(group, Signal::SIGSTOP);
        let mut members = vec![pid];
        // Until a reading finds nobody new: a process may have forked before it stopped.
        loop {
            let table = parents_and_groups();
            let in_group = (table.iter())
                .filter(|&&(_, _, pgid)| pgid == pid)
                .map(|&(process, _, _)| process);
            let below = descendants_in(&table, pid, &std::collections::BTreeSet::new());
            let known = members.len();
            for process in in_group.chain(below) {
                if !members.contains(&process) {
                    let _ = kill(Pid::from_raw(process), Signal::SIGSTOP);
                    members.push(process);
                }
            }
            if members.len() == known {
                break;
            }
        }
        let mut segments: Vec<std::path::PathBuf> = Vec::new();
        for &process in &members {
            let open = postgres_segments_open_in(process);
            for path in open.into_iter().chain(postgres_segments_mapped_by(process)) {
                if !segments.contains(&path) {
                    segments.push(path);
                }
            }
        }
        FrozenFamily {
            group,
            members,
            segments,
        }
    }

    /// SIGKILLs all of them (then SIGCONT: nothing stays stopped), reaps the child, and
    /// removes the segments they held.
    fn kill(self) {
        let _ = killpg(self.group, Signal::SIGKILL);
        for &process in &self.members {
            let _ = kill(Pid::from_raw(process), Signal::SIGKILL);
        }
        let _ = killpg(self.group, Signal::SIGCONT);
        let _ = waitpid(self.group, None);
        for path in self.segments {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Set once lockslab is shutting down early: the lab's output stops there.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Set by the first [`shut_down`]: there is only one cleanup, and one exit status.
static SHUTTING_DOWN: AtomicBool = AtomicBool::new(false);

/// True once an interrupt (or a closed stdout) has started the cleanup.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Blocks while the cleanup that an interrupt started finishes; that cleanup exits.
pub fn wait_for_cleanup() -> ! {
    loop {
        thread::park();
    }
}

/// Ends lockslab early: stops every worker and private server, runs the labs' cleanups,
/// then prints `last_words` (if any) and exits with `status`.
///
/// A signal and a failed write to stdout can arrive together (a terminal that hangs up does
/// both), on different threads: the first caller cleans up and picks the status, a later
/// one waits for it to exit. Nothing is printed before the cleanup is done, and whether the
/// printing works changes nothing.
/// One line on stderr, whatever becomes of it (the same as `errln!`, which this module
/// sits below: the output layer calls [`shut_down`] when stdout fails).
fn say(text: &str) {
    use std::io::Write;
    let _ = writeln!(io::stderr().lock(), "{text}");
}

/// What to say if lockslab is interrupted now, once its workers and servers are stopped:
/// a finding an interrupt would otherwise take with it (chaos's failing schedule, while it
/// is being shrunk).
static LAST_WORDS: Mutex<Option<String>> = Mutex::new(None);

/// Prints what [`say_if_interrupted`] kept, once: the first shutdown or an impatient
/// second Ctrl-C, whichever gets there first.
fn say_last_words(kept: Option<String>) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if let Some(text) = kept
        && !SAID.swap(true, Ordering::SeqCst)
    {
        say(&text);
    }
}

/// Sets (or, with `None`, clears) what an interrupt prints after its cleanup.
/// Once an interrupt began, what it will say is fixed: a lab unwinding meanwhile (its
/// workers dying under it) must not take it back.
pub fn say_if_interrupted(words: Option<String>) {
    if interrupted() {
        return;
    }
    *LAST_WORDS.lock().unwrap_or_else(|p| p.into_inner()) = words;
}

pub fn shut_down(status: crate::exit::Exit, last_words: Option<String>) -> ! {
    // First, so that `main` never returns on its own once a shutdown has begun, and what
    // the workers say while they die is not shown.
    INTERRUPTED.store(true, Ordering::SeqCst);
    if SHUTTING_DOWN.swap(true, Ordering::SeqCst) {
        wait_for_cleanup();
    }
    let kept = LAST_WORDS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    stop_all();
    say_last_words(kept);
    if let Some(text) = last_words {
        say(&text);
    }
    std::process::exit(status.code());
}

/// Installs the handler for Ctrl-C, SIGTERM and SIGHUP.
///
/// The first signal stops every worker and private server and exits with 128+signal; a
/// second Ctrl-C or SIGTERM while that is under way kills what is left and exits at once.
/// A second SIGHUP does not: one hang-up often brings two (the shell forwards its own, and
/// the kernel signals the foreground job when the shell exits), and nobody is there to be
/// impatient.
///
/// The handler thread prints nothing itself: its message goes out from a thread of its own,
/// after the cleanup has started, because stderr may be a closed pipe, a full disk, a
/// terminal that just hung up, or a pipe nobody reads — and none of that may stop the
/// cleanup or the next signal.
///
/// Only the handler thread receives these signals: every other thread blocks them. A signal
/// delivered to a thread in the middle of a socket read that has a timeout (every Redis
/// connection here has one) makes the read fail with EINTR, whatever `SA_RESTART` says —
/// and a lab would take that for a server that went away, and skip its cleanup there.
/// Must be called before any other thread starts: threads inherit the mask of their creator.
pub fn install_interrupt_handler() -> Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("installing the Ctrl-C handler")?;
    thread::Builder::new()
        .name("interrupts".into())
        .spawn(move || {
            let mut first = true;
            for signal in signals.forever() {
                let status = crate::exit::Exit::Signalled(signal);
                if first {
                    first = false;
                    let cleanup = thread::Builder::new().name("cleanup".into()).spawn(move || {
                        let _ = interrupt_signals().thread_block();
                        shut_down(status, None)
                    });
                    if cleanup.is_err() {
                        shut_down(status, None); // no thread to be had: clean up right here
                    }
                    let _ = thread::Builder::new().spawn(|| {
                        say("\nlockslab: interrupted; stopping workers and servers (again to quit now)")
                    });
                } else if signal != SIGHUP {
                    kill_all_now();
                    // A finding kept for the interrupt is not lost to impatience.
                    say_last_words(LAST_WORDS.lock().unwrap_or_else(|p| p.into_inner()).clone());
                    std::process::exit(status.code());
                }
            }
        })
        .context("starting the Ctrl-C handler")?;
    interrupt_signals()
        .thread_block()
        .context("leaving Ctrl-C to its handler thread")?;
    Ok(())
}

/// The signals that end lockslab early.
pub fn interrupt_signals() -> nix::sys::signal::SigSet {
    let mut set = nix::sys::signal::SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(signal);
    }
    set
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    /// The reaper's sparing: a spared process and everything below it are left out, from
    /// the same reading of the process table that finds the rest.
    #[test]
    fn what_is_below_a_spared_process_is_spared_with_it() {
        let mut parent = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let pid = parent.id() as i32;
        let deadline = Instant::now() + Duration::from_secs(10);
        while descendants(pid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let grandchild = descendants(pid)[0];
        let me = std::process::id() as i32;
        let all = descendants(me);
        let below = descendants_but(me, &BTreeSet::from([pid]));
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(grandchild),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = parent.kill();
        let _ = parent.wait();
        assert!(all.contains(&pid) && all.contains(&grandchild), "{all:?}");
        assert!(!below.contains(&pid), "{below:?}");
        assert!(!below.contains(&grandchild), "{below:?}");
    }
}
