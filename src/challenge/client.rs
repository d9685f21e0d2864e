//! One learner's client process: started in a session of its own (so the nemesis can
//! pause and kill all of it, and it has no terminal to type into), as the run's
//! [`Isolation`] says, from a scrubbed environment; fed lines on its stdin, read line by
//! line — each line bounded, so a client that floods its stdout is named, not buffered
//! without end — and what it says is stripped of control characters before anyone sees it.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::poll::{PollFd, PollFlags, PollTimeout};

use super::isolation::Isolation;
use super::protocol::{FromClient, MAX_LINE, ToClient};
use crate::freezer::Freezer;
use crate::nemesis::Victim;
use crate::output::printable;
use crate::procs::{self, StopPlan};

/// What a client's reader thread hands the run.
#[derive(Debug)]
pub enum Heard {
    /// A protocol line, and when its reader thread read it (as soon as it was written).
    Said(String, FromClient, Instant),
    /// A line that is not a protocol message.
    Garbage(String, String),
    /// A line longer than [`MAX_LINE`] bytes.
    Flood(String),
    /// Its stdout closed: it exited (or was killed).
    Closed(String),
    /// Every line it had written when drain `u64` was asked for ([`Client::drain`]) was
    /// handed over before this.
    Drained(String, u64),
}

/// How many of a client's last stderr lines are kept, to quote when it fails.
const LAST_WORDS: usize = 6;

/// The mark every client carries in its environment (`<run id>/<name>`), and everything it
/// starts inherits: how the run finds, and kills, a process a client started in a session
/// of its own (`setsid`), which neither its process group nor the kernel's parent-death
/// signal reaches.
pub const MARK: &str = "LOCKSLAB_CHALLENGE_CLIENT";

pub struct Client {
    pub name: String,
    /// Its value of [`MARK`].
    mark: String,
    child: Option<Child>,
    /// Lines to send, written by a thread of its own: a client that stops reading its
    /// stdin blocks that thread, never the run.
    to: Option<Sender<String>>,
    stderr: Arc<Mutex<VecDeque<String>>>,
    /// Set when its stderr closed: every last word is in.
    stderr_closed: Arc<AtomicBool>,
    drains: Drains,
    /// The uid it alone runs as (lockslab as root): every process of it is this client's.
    user: Option<u32>,
    /// Its freezer cgroup, where it and all it starts are born (lockslab as root).
    freezer: Option<Freezer>,
}

/// How the run asks a client's reader thread for every line written so far: the number of
/// the last drain asked for, and a pipe whose byte wakes the thread.
struct Drains {
    asked: Arc<AtomicU64>,
    wake: OwnedFd,
}

impl Drains {
    /// Asks for the next drain and wakes the reader; returns its number.
    fn ask(&self) -> u64 {
        let number = self.asked.fetch_add(1, Ordering::SeqCst) + 1;
        let _ = nix::unistd::write(&self.wake, &[1]);
        number
    }
}

impl Client {
    /// Starts `program args…` as client `name`, kept from lockslab as `isolation` says; what
    /// it says arrives on `heard`.
    pub fn start(
        program: &[String],
        name: &str,
        run_id: &str,
        heard: &Sender<Heard>,
        isolation: &Isolation,
    ) -> Result<Client> {
        let mark = format!("{run_id}/{name}");
        let identity = isolation.identity(name)?;
        let home = identity.as_ref().map(|(_, _, home)| home.as_path());
        let mut command = isolation.command(program, &environment(&mark), home);
        let user = identity.as_ref().map(|&(uid, gid, _)| (uid, gid));
        // A client of its own user gets a freezer of its own too, where there is one.
        let freezer = user.and_then(|_| Freezer::make(&mark.replace('/', "-")));
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = procs::spawn_registered_alone(
            &mut command,
            StopPlan::kill(),
            user,
            freezer.as_ref().map(|f| f.join_path()),
        )
        .with_context(|| format!("starting the client `{}`", program.join(" ")))?;
        let stdin = child.stdin.take().context("the client's stdin")?;
        let stdout = child.stdout.take().context("the client's stdout")?;
        let stderr = child.stderr.take().context("the client's stderr")?;
        let (to, lines) = channel();
        thread::spawn(move || write_lines(stdin, lines));
        let heard = heard.clone();
        let owner = name.to_string();
        // Close-on-exec: the clients started after this one must not inherit it.
        let (woken, wake) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .context("a pipe to wake the client's reader")?;
        let asked = Arc::new(AtomicU64::new(0));
        let drains = Drains {
            asked: Arc::clone(&asked),
            wake,
        };
        thread::spawn(move || read_lines(owner, stdout, heard, asked, woken));
        let last = Arc::new(Mutex::new(VecDeque::new()));
        let kept = last.clone();
        let stderr_closed = Arc::new(AtomicBool::new(false));
        let closed = stderr_closed.clone();
        thread::spawn(move || {
            keep_last_words(stderr, kept);
            closed.store(true, Ordering::SeqCst);
        });
        Ok(Client {
            name: name.into(),
            mark,
            child: Some(child),
            to: Some(to),
            stderr: last,
            stderr_closed,
            drains,
            user: user.map(|(uid, _)| uid.as_raw()),
            freezer,
        })
    }

    /// Asks its reader for every line the client has written by now: each comes, then
    /// [`Heard::Drained`] with the number returned. What a client wrote before it sent a
    /// write (its `writing` note) is in its stdout pipe by the time the write reaches its
    /// proxy, so a drain asked then hands that note over before the write goes on.
    pub fn drain(&self) -> u64 {
        self.drains.ask()
    }

    pub fn send(&self, message: &ToClient) {
        if let Some(to) = &self.to {
            let _ = to.send(serde_json::to_string(message).unwrap_or_default());
        }
    }

    /// No more jobs: closes its stdin (the protocol's "you may exit now").
    pub fn close(&mut self) {
        self.to = None;
    }

    /// Its exit status, once it exited by itself (reaped then).
    pub fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        let status = child.try_wait().ok()??;
        procs::forget(child.id() as i32);
        self.child = None;
        Some(status.to_string())
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The last lines it wrote on stderr, for a failure message (waiting a moment for its
    /// stderr to close: a crash's traceback comes last).
    pub fn last_words(&self) -> String {
        let until = Instant::now() + Duration::from_millis(500);
        while !self.stderr_closed.load(Ordering::SeqCst) && Instant::now() < until {
            thread::sleep(Duration::from_millis(5));
        }
        let lines = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join(" | ")
    }
}

impl Victim for Client {
    fn label(&self) -> String {
        self.name.clone()
    }

    fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    fn user(&self) -> Option<u32> {
        self.user
    }

    fn freezer(&self) -> Option<std::path::PathBuf> {
        self.freezer.as_ref().map(|f| f.dir().to_path_buf())
    }

    /// SIGKILL to its whole group, then reaped: no cleanup code of the client runs. Then
    /// whatever it started out of its group (marked, see [`MARK`]), even after it exited.
    fn kill_now(&mut self) {
        self.to = None;
        if let Some(freezer) = &self.freezer {
            // Everything it started dies with it, at once: nothing of its can fork, or stop
            // the helper that kills its user's processes, meanwhile.
            crate::freezer::kill_everyone(freezer.dir());
        }
        if let Some(child) = self.child.take() {
            procs::stop(child.id() as i32, &StopPlan::kill());
        }
        sweep(&format!("{MARK}={}", self.mark), false);
        // A process of its user that shed the mark (started with an empty environment).
        procs::kill_every_process_of(&Vec::from_iter(self.user));
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.kill_now();
    }
}

/// A client's whole environment: what the protocol hands over comes on stdin, and nothing
/// of lockslab's own is passed on — its environment may hold a server URL with an admin's
/// password (`LOCKSLAB_POSTGRES_URL`), its state directory, its test tags. Only where to
/// find programs, a home, a language, unbuffered Python output, and the reaper's mark.
fn environment(mark: &str) -> Vec<(&'static str, OsString)> {
    let mut vars = vec![
        (
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()),
        ),
        ("PYTHONUNBUFFERED", "1".into()),
        (MARK, mark.into()),
    ];
    for name in ["HOME", "LANG"] {
        if let Some(value) = std::env::var_os(name) {
            vars.push((name, value));
        }
    }
    vars
}

fn write_lines(mut stdin: ChildStdin, lines: Receiver<String>) {
    for line in lines {
        if writeln!(stdin, "{line}")
            .and_then(|_| stdin.flush())
            .is_err()
        {
            return;
        }
    }
}

/// Reads the client's stdout as lines, at most [`MAX_LINE`] bytes a line, and answers the
/// run's drains ([`Client::drain`]) in order with the lines: a drain is answered once
/// everything in the pipe when it was asked for was read and handed over.
fn read_lines(
    name: String,
    mut stdout: ChildStdout,
    heard: Sender<Heard>,
    asked: Arc<AtomicU64>,
    woken: OwnedFd,
) {
    let nonblocking = |fd: BorrowedFd| {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )
    };
    if nonblocking(stdout.as_fd()).is_err() || nonblocking(woken.as_fd()).is_err() {
        let _ = heard.send(Heard::Closed(name));
        return;
    }
    let mut pending = Vec::new();
    let mut answered = 0;
    // The run's end of the wake pipe closes with the client's handle; from then on only
    // the client's stdout is waited on (a closed pipe would wake `poll` without end).
    let mut wakes = true;
    loop {
        let mut fds = [
            PollFd::new(stdout.as_fd(), PollFlags::POLLIN),
            PollFd::new(woken.as_fd(), PollFlags::POLLIN),
        ];
        let watched = if wakes { &mut fds[..] } else { &mut fds[..1] };
        if let Err(err) = nix::poll::poll(watched, PollTimeout::NONE)
            && err != nix::errno::Errno::EINTR
        {
            let _ = heard.send(Heard::Closed(name));
            return;
        }
        // The drain asked for is read before the pipe: all the client wrote before it was
        // asked for is then read below.
        let wanted = asked.load(Ordering::SeqCst);
        let mut sink = [0u8; 64];
        while wakes {
            match nix::unistd::read(woken.as_fd(), &mut sink) {
                Ok(0) => wakes = false,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let open = read_available(&mut stdout, &mut pending);
        if !hand_over_lines(&name, &mut pending, !open, &heard) {
            return;
        }
        if !open {
            let _ = heard.send(Heard::Closed(name));
            return;
        }
        if wanted > answered {
            answered = wanted;
            if heard.send(Heard::Drained(name.clone(), wanted)).is_err() {
                return;
            }
        }
    }
}

/// Reads what the pipe holds now onto `pending`; false once it is closed.
fn read_available(stdout: &mut ChildStdout, pending: &mut Vec<u8>) -> bool {
    let mut buffer = [0u8; 8192];
    loop {
        match stdout.read(&mut buffer) {
            Ok(0) => return false,
            Ok(n) => pending.extend_from_slice(&buffer[..n]),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

/// Hands each whole line of `pending` over (and, at the end of the stream, the last one
/// without its newline); false when the client flooded (a line past [`MAX_LINE`] bytes)
/// or nobody listens.
fn hand_over_lines(name: &str, pending: &mut Vec<u8>, ended: bool, heard: &Sender<Heard>) -> bool {
    loop {
        let line = match pending.iter().position(|&b| b == b'\n') {
            Some(end) if end <= MAX_LINE => pending.drain(..=end).collect::<Vec<u8>>(),
            Some(_) => return flooded(name, heard),
            None if pending.len() > MAX_LINE => return flooded(name, heard),
            None if ended && !pending.is_empty() => std::mem::take(pending),
            None => return true,
        };
        let text = String::from_utf8_lossy(&line).trim().to_string();
        if text.is_empty() {
            continue;
        }
        let message = match serde_json::from_str::<FromClient>(&text) {
            Ok(FromClient::Fail { job, reason }) => {
                let reason = reason.map(|r| printable(&r));
                Heard::Said(
                    name.into(),
                    FromClient::Fail { job, reason },
                    Instant::now(),
                )
            }
            Ok(said) => Heard::Said(name.into(), said, Instant::now()),
            Err(_) => Heard::Garbage(name.into(), printable(&text)),
        };
        if heard.send(message).is_err() {
            return false;
        }
    }
}

fn flooded(name: &str, heard: &Sender<Heard>) -> bool {
    let _ = heard.send(Heard::Flood(name.into()));
    false
}

fn keep_last_words(stderr: impl Read, kept: Arc<Mutex<VecDeque<String>>>) {
    let mut reader = BufReader::new(stderr);
    loop {
        let mut line = Vec::new();
        match (&mut reader).take(512).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = printable(&String::from_utf8_lossy(&line))
                    .trim()
                    .to_string();
                if text.is_empty() || is_backtrace_hint(&text) {
                    continue;
                }
                let mut kept = kept.lock().unwrap_or_else(|p| p.into_inner());
                kept.push_back(text);
                while kept.len() > LAST_WORDS {
                    kept.pop_front();
                }
            }
        }
    }
}

/// Rust's "note: run with `RUST_BACKTRACE=1` …" after a panic: advice a learner cannot take
/// (a client starts from a scrubbed environment, which lockslab's own variables do not
/// reach), and a line that would push the panic's message out of the few kept.
fn is_backtrace_hint(line: &str) -> bool {
    line.starts_with("note: run with `RUST_BACKTRACE")
}

/// SIGKILLs every process of this user whose environment holds `entry` (`prefix`: an
/// entry that starts with it), in rounds until none is left (one may fork while swept).
/// Processes it may not read are not its clients': another user's.
pub fn sweep(entry: &str, prefix: bool) {
    let me = std::process::id();
    for _ in 0..5 {
        let mut found = false;
        let Ok(dir) = std::fs::read_dir("/proc") else {
            return;
        };
        for proc in dir.flatten() {
            let Some(pid) = proc
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(environ) = std::fs::read(proc.path().join("environ")) else {
                continue;
            };
            let marked = environ.split(|&b| b == 0).any(|var| {
                if prefix {
                    var.starts_with(entry.as_bytes())
                } else {
                    var == entry.as_bytes()
                }
            });
            if marked && pid != me {
                found = true;
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        if !found {
            return;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Kills the run's marked processes once lockslab is gone without sweeping — SIGKILL,
/// which leaves it no time: a shell of its own (its own process group,
/// no parent-death signal, not marked) that waits for end of file on its stdin, which only
/// lockslab holds open, then thaws the run's freezer cgroups (a frozen client does not die
/// of SIGKILL until thawed), sweeps as [`sweep`] does, kills what is left in those cgroups
/// and removes them, and deletes the clients' home (as root, see [`Isolation`]) once they
/// are gone.
pub struct Watchdog(Option<Child>);

const WATCHDOG: &str = r#"while read -r _; do :; done
for g in /sys/fs/cgroup/freezer/lockslab-*-"$1"-*; do
  [ -d "$g" ] && echo THAWED > "$g/freezer.state"
done
for round in 1 2 3; do
  for d in /proc/[0-9]*; do
    if tr '\0' '\n' < "$d/environ" 2>/dev/null | grep -q "^$0=$1/"; then
      kill -9 "${d#/proc/}" 2>/dev/null
    fi
  done
  for g in /sys/fs/cgroup/freezer/lockslab-*-"$1"-*; do
    [ -d "$g" ] || continue
    for p in $(cat "$g/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
    rmdir "$g" 2>/dev/null
  done
  sleep 0.1
done
[ -n "$2" ] && rm -rf -- "$2""#;

impl Watchdog {
    pub fn start(run_id: &str, home: Option<&std::path::Path>) -> Result<Watchdog> {
        let child = Command::new("sh")
            .args(["-c", WATCHDOG, MARK, run_id])
            .arg(home.map(|h| h.as_os_str()).unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_remove(MARK)
            .process_group(0)
            .spawn()
            .context("starting the challenge's watchdog (sh)")?;
        Ok(Watchdog(Some(child)))
    }
}

impl Drop for Watchdog {
    /// Ended and reaped: lockslab is still here, and sweeps itself (each client's drop).
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A client did something that ends the run (the challenge is failed, with this sentence).
#[derive(Debug)]
pub struct ClientFailed(pub String);

impl std::fmt::Display for ClientFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ClientFailed {}

pub fn failed(sentence: String) -> anyhow::Error {
    ClientFailed(sentence).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::printable;

    /// A drain is answered after every line the client had written when it was asked
    /// for, though none of them was read yet, and its last line without a newline too at
    /// the end; a line past the bound is a flood.
    #[test]
    fn a_drain_is_answered_after_every_line_written_before_it() {
        let mut child = Command::new("sh")
            .args(["-c", r#"printf '{"type":"ok","job":1}\n{"type":"writing","job":2}\n{"type":'; sleep 1; printf '"ok","job":2}'"#])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (heard_to, heard) = channel();
        let (woken, wake) = nix::unistd::pipe().unwrap();
        let asked = Arc::new(AtomicU64::new(0));
        let drains = Drains {
            asked: Arc::clone(&asked),
            wake,
        };
        // The lines are in the pipe before the reader starts: nothing was read yet.
        thread::sleep(Duration::from_millis(300));
        let reader = thread::spawn(move || read_lines("c1".into(), stdout, heard_to, asked, woken));
        let number = drains.ask();
        let mut said = Vec::new();
        loop {
            match heard.recv_timeout(Duration::from_secs(5)).unwrap() {
                Heard::Said(_, message, _) => said.push(serde_json::to_string(&message).unwrap()),
                Heard::Drained(_, n) => {
                    assert_eq!(n, number);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(said.len(), 2, "{said:?}");
        assert!(said[1].contains("writing"), "{said:?}");
        // The run lets go of the client's handle (its end of the wake pipe) before the
        // client is done: the reader still hands over the rest and its close.
        drop(drains);
        let last = heard.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(
            matches!(last, Heard::Said(_, FromClient::Ok { job: 2 }, _)),
            "{last:?}"
        );
        let closed = heard.recv_timeout(Duration::from_secs(5)).unwrap();
        assert!(matches!(closed, Heard::Closed(_)), "{closed:?}");
        reader.join().unwrap();
        child.wait().unwrap();
        let mut pending = vec![b'x'; MAX_LINE + 1];
        let (flood_to, flood) = channel();
        assert!(!hand_over_lines("c1", &mut pending, false, &flood_to));
        assert!(matches!(flood.try_recv(), Ok(Heard::Flood(_))));
    }

    /// What a client prints reaches the screen with no way to recolour it, move the cursor,
    /// clear it, retitle the window or turn a line around: a client cannot paint a verdict.
    #[test]
    fn a_clients_words_lose_every_escape_and_control_character() {
        let painted = "\u{1b}[2J\u{1b}[H\u{1b}[1;32mPASS\u{1b}[0m \u{9b}31mred\u{1b}]0;title\u{7}\
                       after\u{1b}]8;;http://x\u{1b}\\link\u{1b}(B\tend\r\u{202e}sdrawkcab\u{8}";
        assert_eq!(printable(painted), "PASS redafterlink endsdrawkcab");
        assert_eq!(
            printable("Traceback: boom — ünïcode"),
            "Traceback: boom — ünïcode"
        );
    }
}
