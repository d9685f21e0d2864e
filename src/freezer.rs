//! A client's pause that no signal can end: a freezer cgroup of its own (cgroup v1).
//!
//! SIGSTOP alone is a polite pause. A process may arm a timer (`timer_create`) that sends it
//! SIGCONT every millisecond, and the kernel wakes a stopped process for any SIGCONT, its
//! own included, even one it blocks or ignores: such a client would dodge every pause and
//! pass. A frozen cgroup is not signalled awake;
//! its tasks stay frozen until lockslab thaws it, whatever they arranged before.
//!
//! Only where lockslab runs as root and the v1 freezer is mounted writable
//! (`/sys/fs/cgroup/freezer`); elsewhere a pause is SIGSTOP, and the docs say what that
//! leaves open. Each client joins its own cgroup before its program starts, and everything
//! it starts is born there: the client cannot leave it (the cgroup's files are root's).

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

const ROOT: &str = "/sys/fs/cgroup/freezer";

/// The cgroups made and not yet removed: an interrupt thaws them before it stops anything
/// (a frozen process does not die of SIGKILL until it is thawed).
static MADE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// One client's freezer cgroup, removed when dropped (its processes killed first).
pub struct Freezer {
    dir: PathBuf,
    /// `cgroup.procs`, for the client to join between fork and exec (no allocation there).
    join: CString,
}

impl Freezer {
    /// A cgroup of its own for `name` (its run's id and the client), or None where none can
    /// be made (not root, no v1 freezer).
    pub fn make(name: &str) -> Option<Freezer> {
        if !available() {
            return None;
        }
        let dir = Path::new(ROOT).join(format!("lockslab-{}-{name}", std::process::id()));
        fs::create_dir(&dir).ok()?;
        static THAW_ON_THE_WAY_OUT: std::sync::Once = std::sync::Once::new();
        THAW_ON_THE_WAY_OUT.call_once(|| crate::procs::before_stopping(thaw_all));
        lock().push(dir.clone());
        crate::procs::remove_on_cleanup_with(dir.clone(), remove);
        let join = CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).ok()?;
        Some(Freezer { dir, join })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The file a process writes its pid to, to join (see
    /// [`crate::procs::spawn_registered_alone`]).
    pub fn join_path(&self) -> &std::ffi::CStr {
        &self.join
    }
}

impl Drop for Freezer {
    fn drop(&mut self) {
        remove(&self.dir);
        crate::procs::forget_dir(&self.dir);
    }
}

/// Whether clients get freezer cgroups here: lockslab runs as root and the v1 freezer is
/// mounted.
pub fn available() -> bool {
    nix::unistd::Uid::effective().is_root()
        && Path::new(ROOT).join("tasks").exists()
        // Mounted read-only (as in a container), it could not make a cgroup.
        && nix::unistd::access(ROOT, nix::unistd::AccessFlags::W_OK).is_ok()
}

/// Freezes every task of the cgroup at `dir`; true once the kernel says all are frozen.
pub fn freeze(dir: &Path) -> bool {
    if fs::write(dir.join("freezer.state"), "FROZEN").is_err() {
        return false;
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if state(dir).as_deref() == Some("FROZEN") {
            return true;
        }
        thread::sleep(Duration::from_millis(1));
    }
    false
}

/// Lets the cgroup's tasks run again.
pub fn thaw(dir: &Path) {
    let _ = fs::write(dir.join("freezer.state"), "THAWED");
}

fn state(dir: &Path) -> Option<String> {
    Some(
        fs::read_to_string(dir.join("freezer.state"))
            .ok()?
            .trim()
            .to_string(),
    )
}

/// Thaws every cgroup made: the first step of an interrupt's cleanup.
pub fn thaw_all() {
    for dir in lock().iter() {
        thaw(dir);
    }
}

/// Kills every task of the cgroup at `dir`: frozen first, so that none forks, or signals
/// anything, while the others are killed; thawed, they die.
pub fn kill_everyone(dir: &Path) {
    freeze(dir);
    kill_tasks(dir);
    thaw(dir);
}

/// Thaws the cgroup, kills what is left in it, and removes it (a cgroup with tasks cannot
/// be removed: again for a moment, while they die).
fn remove(dir: &Path) {
    thaw(dir);
    for _ in 0..100 {
        kill_tasks(dir);
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    lock().retain(|made| made != dir);
}

/// SIGKILL to every task now in the cgroup at `dir`.
fn kill_tasks(dir: &Path) {
    let tasks = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in tasks
        .lines()
        .filter_map(|line| line.trim().parse::<i32>().ok())
    {
        let pid = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

fn lock() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    MADE.lock().unwrap_or_else(|p| p.into_inner())
}
