//! Who a learner's client runs as, and what it can reach.
//!
//! A client under grading is someone else's code running next to lockslab's own. What
//! lockslab holds — its environment (a server URL given as `LOCKSLAB_POSTGRES_URL` may be
//! an admin's), `lockslab up`'s state file, the private servers' data directories (a
//! `pg_hba.conf` a client could rewrite), lockslab's memory (`/proc/<pid>/mem`), the
//! terminal it runs in — must stay out of its reach, or a client rewrites the log it is
//! graded from, or types commands into the shell of whoever runs lockslab.
//!
//! Always, whatever the case below: a scrubbed environment (only what the protocol hands
//! over on stdin, plus `PATH`, `HOME`, `LANG`, `PYTHONUNBUFFERED` and the reaper's mark),
//! a session of its own with no controlling terminal (`setsid`: no `/dev/tty`, no
//! `TIOCSTI`), and pipes for stdin, stdout and stderr. Then one of three:
//!
//! - **lockslab runs as root** (CI does): each client runs as a user of its own, a uid and
//!   gid that no account, group, subordinate-id range or process has — not `postgres` or
//!   `nobody`, which the private Postgres runs as. One user a client, as one machine a
//!   client: a pause freezes every process of that user, so a helper the client started in
//!   a session of its own (out of reach of its process group) is frozen with it. The kernel then keeps it
//!   out of root's files, lockslab's `/proc` entry and the servers' data. A fresh number
//!   per run rather than a system user made by scripts/setup: nothing to install, and two
//!   runs side by side (a room, a test suite) cannot signal or trace each other's clients.
//! - **not root, with `bwrap`** (Debian's bubblewrap): a sandbox of user, PID and mount
//!   namespaces. The filesystem is read-only; lockslab's state directory, the temp
//!   directories (where private servers keep their data and sockets), the runtime
//!   directory and Postgres's socket directory are empty there; `/proc` shows the
//!   sandbox's processes only, so lockslab's own entry is not there to read.
//! - **neither**: the clients are trusted — the same user, able to read what lockslab can.
//!   The heading says so, and `--isolated` refuses to run.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use nix::unistd::{Gid, Uid};

/// How a run's clients are kept from what lockslab holds.
pub enum Isolation {
    /// lockslab runs as root: each client runs as a uid and gid of its own, which are
    /// nobody else's, with a directory of its own under `home` (deleted with the run) as
    /// `HOME`. The users are drawn as the clients start, by name.
    OwnUser {
        users: std::sync::Mutex<Vec<(String, Uid, Gid)>>,
        home: PathBuf,
    },
    /// Not root: the clients run inside `bwrap`, with `hidden` directories empty.
    Sandbox {
        bwrap: PathBuf,
        hidden: Vec<PathBuf>,
    },
    /// No isolation to be had, and why.
    Trusted { why: String },
}

impl Isolation {
    /// The isolation this machine offers to `program`: checked before any server starts,
    /// so a client its user cannot read is said at once, with what to do.
    pub fn choose(program: &[String]) -> Result<Isolation> {
        if Uid::effective().is_root() {
            readable_by_others(program)?;
            return Ok(Isolation::OwnUser {
                users: std::sync::Mutex::new(Vec::new()),
                home: make_home()?,
            });
        }
        Ok(match sandbox() {
            Ok(bwrap) => Isolation::Sandbox {
                bwrap,
                hidden: hidden_dirs(),
            },
            Err(why) => Isolation::Trusted { why },
        })
    }

    pub fn is_isolated(&self) -> bool {
        !matches!(self, Isolation::Trusted { .. })
    }

    /// Why the clients are not isolated, when they are not.
    pub fn why_not(&self) -> Option<&str> {
        match self {
            Isolation::Trusted { why } => Some(why),
            _ => None,
        }
    }

    /// One word for `--json`: `own-user`, `sandbox` or `trusted`.
    pub fn kind(&self) -> &'static str {
        match self {
            Isolation::OwnUser { .. } => "own-user",
            Isolation::Sandbox { .. } => "sandbox",
            Isolation::Trusted { .. } => "trusted",
        }
    }

    /// What the heading says of it.
    pub fn describe(&self) -> String {
        match self {
            Isolation::OwnUser { .. } => format!(
                "clients run each as a user of its own, made for the run (lockslab runs as \
                 root), in a session of its own with a scrubbed environment; {}",
                if crate::freezer::available() {
                    "pauses freeze each client's cgroup"
                } else {
                    "pauses are SIGSTOP, which a client can undo (no writable cgroup v1 \
                     freezer here)"
                }
            ),
            Isolation::Sandbox { .. } => "clients run sandboxed (bwrap: user, PID and mount \
                 namespaces; lockslab's state, temp and server directories hidden), each in a \
                 session of its own with a scrubbed environment; pauses are SIGSTOP, which a \
                 client can undo"
                .to_string(),
            Isolation::Trusted { why } => format!(
                "the clients are trusted: they run as you and can read what lockslab can, so \
                 this grade is not tamper-proof ({why}); install bubblewrap (`sudo apt-get \
                 install bubblewrap`) or run as root to isolate them"
            ),
        }
    }

    /// The command that starts `program` as a client: its identity, working directory and
    /// environment (`vars`, and nothing else). The session and the parent-death signal are
    /// [`crate::procs::spawn_registered_alone`]'s.
    pub fn command(
        &self,
        program: &[String],
        vars: &[(&str, OsString)],
        own_home: Option<&Path>,
    ) -> Command {
        let here = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let mut command = match self {
            Isolation::Sandbox { bwrap, hidden } => {
                let mut command = Command::new(bwrap);
                command.args(sandbox_args(hidden, program, &here));
                command.arg("--").args(program);
                command
            }
            _ => {
                let mut command = Command::new(&program[0]);
                command.args(&program[1..]);
                command
            }
        };
        command.env_clear();
        for (name, value) in vars {
            command.env(name, value);
        }
        if let (Isolation::OwnUser { .. }, Some(home)) = (self, own_home) {
            command.env("HOME", home);
            // Where lockslab runs, when its user may enter it (the client's paths count from
            // there); else its home (every path it was given is then absolute, see
            // `readable_by_others`).
            let cwd = if blocked_on_the_way(&here).is_none() {
                here
            } else {
                home.to_path_buf()
            };
            command.current_dir(cwd);
        } else {
            command.current_dir(here);
        }
        command
    }

    /// The clients' home, when lockslab made one for them (root's case).
    pub fn home(&self) -> Option<&Path> {
        match self {
            Isolation::OwnUser { home, .. } => Some(home),
            _ => None,
        }
    }

    /// The identity client `name` takes before it runs, and its home (root's case): a user
    /// drawn for it now, nobody else's, with a directory of its own. Else None.
    pub fn identity(&self, name: &str) -> Result<Option<(Uid, Gid, PathBuf)>> {
        let Isolation::OwnUser { users, home } = self else {
            return Ok(None);
        };
        let mut users = users.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = loop {
            let (uid, gid) = crate::identities::free(crate::identities::CLIENT_UIDS, 1)?[0];
            if !users.iter().any(|(_, taken, _)| *taken == uid) {
                break (uid, gid);
            }
        };
        let (uid, gid) = fresh;
        let own = home.join(name);
        fs::create_dir(&own)
            .and_then(|()| fs::set_permissions(&own, fs::Permissions::from_mode(0o700)))
            .and_then(|()| Ok(nix::unistd::chown(&own, Some(uid), Some(gid))?))
            .with_context(|| format!("giving client {name} its home"))?;
        users.push((name.to_string(), uid, gid));
        Ok(Some((uid, gid, own)))
    }
}

impl Drop for Isolation {
    /// The run's user's home goes with the run (its clients are gone by then).
    fn drop(&mut self) {
        if let Isolation::OwnUser { home, .. } = self {
            let _ = fs::remove_dir_all(&*home);
            crate::procs::forget_dir(home);
        }
    }
}

/// The clients' homes: a directory in the temp directory that each may pass through to its
/// own (made as it starts), deleted with the run (and on Ctrl-C). A place each may write,
/// and be, when lockslab's own is not.
fn make_home() -> Result<PathBuf> {
    let home = tempfile::Builder::new()
        .prefix("lockslab-client-")
        .tempdir()
        .context("creating the clients' home directory")?
        .keep();
    crate::procs::remove_on_cleanup(home.clone());
    let handed = fs::set_permissions(&home, fs::Permissions::from_mode(0o711));
    let blocked = home.parent().and_then(blocked_on_the_way);
    if handed.is_err() || blocked.is_some() {
        let _ = fs::remove_dir_all(&home);
        crate::procs::forget_dir(&home);
    }
    handed.context("opening the clients' homes to them")?;
    if let Some((blocked, mode)) = blocked {
        bail!(
            "the clients' home {} is behind {} (mode {mode:o}), which their user may not \
             enter: set TMPDIR to a directory every user may enter, e.g. TMPDIR=/tmp",
            home.display(),
            blocked.display()
        );
    }
    Ok(home)
}

/// The first directory on the way to `path` (or `path` itself, if a directory) that a user
/// with no group of its own and no file of its own — a run's client user — may not pass
/// through: only the "others" bits of each mode count for it. None when all let it in.
fn blocked_on_the_way(path: &Path) -> Option<(PathBuf, u32)> {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut steps: Vec<&Path> = absolute.ancestors().collect();
    steps.reverse();
    for step in steps {
        let Ok(meta) = fs::metadata(step) else {
            continue;
        };
        if meta.is_dir() && meta.permissions().mode() & 0o001 == 0 {
            return Some((step.to_path_buf(), meta.permissions().mode() & 0o7777));
        }
    }
    None
}

/// As root, the client's files must be the run's user's to read (and the program's to run):
/// said here, before any server starts, with what to do.
fn readable_by_others(program: &[String]) -> Result<()> {
    let here = std::env::current_dir().unwrap_or_default();
    let files = super::named_files(program);
    let relative = files.iter().any(|f| !Path::new(f).is_absolute());
    let again = rerun_line(std::env::args().skip(1));
    let why = |what: &str| {
        format!(
            "as root, lockslab runs the clients as a user of their own (no account, no group): \
             {what}. {}, or run lockslab as an ordinary user",
            move_the_client(program, &here, &again)
        )
    };
    if relative && let Some((blocked, mode)) = blocked_on_the_way(&here) {
        bail!(
            "{}",
            why(&format!(
                "that user cannot enter {} (mode {mode:o}), on the way to {}, where the \
                 client's paths count from",
                blocked.display(),
                here.display()
            ))
        );
    }
    for (i, file) in files.iter().enumerate() {
        let path = here.join(file);
        if let Some((blocked, mode)) = path.parent().and_then(blocked_on_the_way) {
            bail!(
                "{}",
                why(&format!(
                    "that user cannot enter {} (mode {mode:o}), on the way to {file}",
                    blocked.display()
                ))
            );
        }
        let Ok(meta) = fs::metadata(&path) else {
            continue; // said by the check for a missing file
        };
        let is_program = i == 0 && program[0].contains('/');
        let needs = if is_program { 0o005 } else { 0o004 };
        if meta.permissions().mode() & needs != needs {
            let may = if is_program { "read and run" } else { "read" };
            bail!(
                "{}",
                why(&format!(
                    "that user may not {may} {file} (mode {:o})",
                    meta.permissions().mode() & 0o7777
                ))
            );
        }
    }
    Ok(())
}

/// Where to put the client so a run's own user may read it, as commands to paste, and the
/// line to run afterwards. The client is its script (`python3 /root/client.py`), else the
/// program itself. Its directory is copied when it holds more files like it (a module
/// beside the script); the file alone when it stands by itself, or when its directory is
/// a home or a shared one (copying a whole home would hand its secrets to everyone).
fn move_the_client(program: &[String], here: &Path, again: &[String]) -> String {
    const TO: &str = "/srv/client";
    let at = program
        .iter()
        .skip(1)
        .position(|arg| super::SCRIPTS.iter().any(|ext| arg.ends_with(ext)))
        .map_or(0, |i| i + 1);
    let client = std::path::absolute(here.join(&program[at])).unwrap_or_default();
    let (Some(dir), Some(name)) = (client.parent(), client.file_name()) else {
        return format!("Put the client where every user may read it (e.g. under {TO})");
    };
    let shared = [
        std::env::var_os("HOME").map(PathBuf::from),
        Some(PathBuf::from("/root")),
        Some(PathBuf::from("/tmp")),
        Some(std::env::temp_dir()),
    ];
    let more_like_it = client.extension().is_some()
        && fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|entry| {
                entry.path() != client && entry.path().extension() == client.extension()
            })
        });
    let whole_dir = more_like_it
        && dir.parent().is_some()
        && !shared.iter().flatten().any(|place| place == dir);
    let word = |path: &Path| crate::output::shell_word(&path.to_string_lossy());
    let copy = if whole_dir {
        format!("cp -r {}/. {TO}", word(dir))
    } else {
        format!("cp {} {TO}/", word(&client))
    };
    let moved = Path::new(TO).join(name).to_string_lossy().into_owned();
    let line: Vec<String> = again
        .iter()
        .chain(
            program
                .iter()
                .enumerate()
                .map(|(i, w)| if i == at { &moved } else { w }),
        )
        .map(|w| crate::output::shell_word(w))
        .collect();
    format!(
        "Put the client where every user may read it: `mkdir -p {TO} && {copy} && chmod -R \
         a+rX {TO}`, then run `cd {TO} && {}`",
        line.join(" ")
    )
}

/// The words of this command line before its `--` (`lockslab challenge counter --seed 7 --`),
/// for the line that runs it again with the client moved.
fn rerun_line(args: impl Iterator<Item = String>) -> Vec<String> {
    let mut line = vec!["lockslab".to_string()];
    for arg in args {
        line.push(arg.clone());
        if arg == "--" {
            return line;
        }
    }
    vec![
        "lockslab".into(),
        "challenge".into(),
        "NAME".into(),
        "--".into(),
    ]
}

/// `bwrap`, when it is installed and this kernel lets an ordinary user make the namespaces
/// it needs (some distributions turn unprivileged user namespaces off); else why not.
pub fn sandbox() -> std::result::Result<PathBuf, String> {
    let Some(bwrap) = find_on_path("bwrap") else {
        return Err("bwrap is not installed".into());
    };
    let probe = Command::new(&bwrap)
        .args(["--unshare-user", "--unshare-pid", "--die-with-parent"])
        .args([
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "true",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output();
    match probe {
        Ok(output) if output.status.success() => Ok(bwrap),
        Ok(output) => {
            let said = String::from_utf8_lossy(&output.stderr);
            let line = said.lines().last().unwrap_or("no reason given").trim();
            Err(format!("bwrap cannot make a sandbox here: {line}"))
        }
        Err(err) => Err(format!("bwrap did not run: {err}")),
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            fs::metadata(candidate)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The directories a sandboxed client finds empty: lockslab's state directory (`up`'s
/// state file, its servers), the temp directories (every private server's data and socket,
/// the challenge's own files), the runtime directory (the session's sockets) and the
/// system Postgres's socket directory (a peer login as you).
fn hidden_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![
        crate::servers::state_dir(),
        std::env::temp_dir(),
        PathBuf::from("/tmp"),
        PathBuf::from("/var/tmp"),
        PathBuf::from("/run/postgresql"),
        PathBuf::from("/var/run/postgresql"),
    ];
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        dirs.push(PathBuf::from(runtime));
    }
    let mut kept: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        // Only directories that are there (bwrap would make the others), once each, by
        // their real path (a symlink such as /var/run would be followed anyway).
        let Ok(real) = fs::canonicalize(&dir) else {
            continue;
        };
        if real.is_dir() && !kept.contains(&real) && real != Path::new("/") {
            kept.push(real);
        }
    }
    kept
}

/// bwrap's arguments: the namespaces; a read-only view of the filesystem with fresh
/// `/dev` and `/proc`; the hidden directories as empty tmpfs; then, read-only again, the
/// client's own files that were inside one of them (a script in /tmp: its directory,
/// unless that is a hidden one itself, then the file alone); and its working directory.
fn sandbox_args(hidden: &[PathBuf], program: &[String], here: &Path) -> Vec<OsString> {
    let mut args: Vec<OsString> = [
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
    ]
    .map(OsString::from)
    .into();
    // Deepest last: a hidden directory inside another (the state directory in /tmp)
    // would otherwise be mounted over by its parent's tmpfs, which hides it anyway.
    let mut sorted = hidden.to_vec();
    sorted.sort_by_key(|d| d.components().count());
    for dir in &sorted {
        args.extend(["--tmpfs".into(), dir.clone().into_os_string()]);
    }
    let inside = |path: &Path| sorted.iter().any(|d| path.starts_with(d));
    let mut shown: Vec<PathBuf> = Vec::new();
    for file in super::named_files(program) {
        let Ok(real) = fs::canonicalize(here.join(&file)) else {
            continue;
        };
        if !inside(&real) {
            continue;
        }
        let dir = real.parent().map(Path::to_path_buf).unwrap_or_default();
        // Its directory, for the files beside it (a module it imports) — but never a
        // hidden directory itself, nor one that holds one.
        let unsafe_dir = sorted.iter().any(|d| d.starts_with(&dir));
        let show = if unsafe_dir { real } else { dir };
        if !shown.iter().any(|s| show.starts_with(s)) {
            args.extend([
                "--ro-bind".into(),
                show.clone().into_os_string(),
                show.clone().into_os_string(),
            ]);
            shown.push(show);
        }
    }
    if inside(here) && !sorted.iter().any(|d| d == here) {
        // Where the client's paths count from: there, if empty.
        args.extend(["--dir".into(), here.as_os_str().to_os_string()]);
    }
    args.extend(["--chdir".into(), here.as_os_str().to_os_string()]);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_closed_to_others_blocks_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        fs::create_dir_all(&inner).unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(dir.path().join("a"), fs::Permissions::from_mode(0o750)).unwrap();
        let (blocked, mode) = blocked_on_the_way(&inner).unwrap();
        assert_eq!(blocked, dir.path().join("a"));
        assert_eq!(mode, 0o750);
        fs::set_permissions(dir.path().join("a"), fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(blocked_on_the_way(&inner), None);
    }

    #[test]
    fn a_script_in_a_hidden_directory_is_shown_alone_and_one_beside_others_with_them() {
        let hidden = vec![PathBuf::from("/tmp")];
        let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
        let script = dir.path().join("client.py");
        fs::write(&script, "").unwrap();
        let program = vec!["python3".to_string(), script.display().to_string()];
        let args = sandbox_args(&hidden, &program, Path::new("/"));
        let words: Vec<String> = args.iter().map(|a| a.to_string_lossy().into()).collect();
        let shown = dir.path().display().to_string();
        assert!(
            words.windows(3).any(|w| w == ["--ro-bind", &shown, &shown]),
            "{words:?}"
        );
        assert!(
            words.windows(2).any(|w| w == ["--tmpfs", "/tmp"]),
            "{words:?}"
        );
        let loose = tempfile::Builder::new()
            .suffix(".py")
            .tempfile_in("/tmp")
            .unwrap();
        let path = loose.path().display().to_string();
        let program = vec!["python3".to_string(), path.clone()];
        let words: Vec<String> = sandbox_args(&hidden, &program, Path::new("/tmp"))
            .iter()
            .map(|a| a.to_string_lossy().into())
            .collect();
        assert!(
            words.windows(3).any(|w| w == ["--ro-bind", &path, &path]),
            "{words:?}"
        );
        assert!(
            !words.iter().any(|w| w == "--dir"),
            "/tmp is there: {words:?}"
        );
    }
}
