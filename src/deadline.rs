//! A client-side deadline for connections: a frozen server cannot enforce its own.
//!
//! `statement_timeout` is enforced by the server. A server that is frozen (SIGSTOP, a VM
//! paused, a machine swapping itself to death) enforces nothing, and its kernel still
//! accepts our bytes, so the client waits forever: the sync `postgres` crate has no read
//! timeout, and we cannot wrap its socket (it owns the stream, and a TLS connector is only
//! asked for one when the server agrees to TLS). So each connection gets a [`Guard`]: a small
//! watchdog thread that looks at the connection's socket from the outside and, when the
//! server has stopped answering, `shutdown(2)`s the socket. The call blocked on it then
//! returns an error, which [`crate::connect`] reports as "did not answer within Ns".
//!
//! Three things make that safe for a lab whose workers are themselves frozen on purpose:
//!
//! - **Only time this process ran counts.** The watchdog counts its own ticks instead of
//!   reading a clock: CLOCK_MONOTONIC keeps running while a process is stopped, so a clock
//!   would see a worker frozen for 5s mid-call as a server that took 5s to answer, and kill
//!   the call the moment the worker resumes — falsifying the very lab that froze it. A
//!   stopped process's watchdog does not tick (a stop costs at most one tick).
//! - **An answer that arrived is an answer.** "Waiting" is read from the kernel's own
//!   counters (`TCP_INFO`: data segments out and in): a request went out and nothing has
//!   come back since. Whatever the server sent while we were stopped is counted on arrival,
//!   and the socket is checked for unread bytes once more before it is shut.
//! - **A long wait is not a frozen server.** Some statements wait on purpose (a worker
//!   queued on a lock held by a frozen peer), and only the server knows why. So before
//!   shutting anything, the watchdog asks the server on a fresh connection whether it answers
//!   at all ([`Probe`]: Postgres's 8-byte SSLRequest, Redis's PING, to which even a busy
//!   server replies at once). A live server is left to its own `statement_timeout`; a server that answers
//!   nobody is frozen, dead or hopelessly overloaded, and waiting longer helps no one.
//!
//! The bound is split between the two: `bound × 3/5` of unanswered waiting, then a probe
//! with `bound × 2/5` to answer. Connections made over a Unix socket get no guard.
//!
//! Redis connections get one too, for a different reason: redis-rs has a read timeout,
//! but applies it to each reply, so a pipeline of 200 replies to a frozen server would take
//! 200 timeouts. Once the guard shuts the socket, every remaining read fails at once.

use std::io::{ErrorKind, Read, Write};
use std::mem::ManuallyDrop;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// One watchdog tick: also the resolution of the bound.
const TICK: Duration = Duration::from_millis(100);

/// After a probe found the server alive, the next one waits this many times longer (up to
/// [`MAX_PATIENCE_TICKS`]): a statement may wait on a lock for minutes.
const BACKOFF: u32 = 2;
const MAX_PATIENCE_TICKS: u32 = 300;

/// What to send a server on a fresh connection to see whether it answers at all.
#[derive(Clone, Copy)]
pub struct Probe(&'static [u8]);

impl Probe {
    /// Postgres's SSLRequest (length 8, code 1234.5679): any server answers with one byte.
    pub const POSTGRES: Probe = Probe(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
    /// An inline PING: a Redis server answers `+PONG`.
    pub const REDIS: Probe = Probe(b"PING\r\n");
}

/// The watchdog of one connection. It holds a duplicate of the connection's socket (so the
/// number it looks at can never come to mean another file), and dropping it stops it.
pub struct Guard {
    shared: Arc<Shared>,
    /// Dropped to stop the watchdog at once: it waits for its next tick on this channel,
    /// so a connection closes without waiting up to a tick for its guard.
    stop: Option<mpsc::Sender<()>>,
    /// Another duplicate, for [`Guard::abandon`].
    socket: Option<TcpStream>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    stop: AtomicBool,
    fired: AtomicBool,
    /// The bound in ticks; lowered for cleanup, where waiting is not worth it.
    bound_ticks: AtomicU32,
}

impl Guard {
    /// Starts watching the TCP socket whose local port is `local_port` (as the server saw
    /// it: `inet_client_port()`). None when there is no such socket (a Unix socket, a
    /// proxy in between) or the kernel does not tell what the watchdog needs. `on_fire`
    /// runs once, just before the socket is shut.
    pub fn watch(
        local_port: u16,
        probe: Probe,
        bound: Duration,
        on_fire: impl FnOnce() + Send + 'static,
    ) -> Option<Guard> {
        let (socket, peer) = find_socket(local_port)?;
        let first = traffic(socket.as_raw_fd())?;
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            fired: AtomicBool::new(false),
            bound_ticks: AtomicU32::new(ticks(bound)),
        });
        let watched = shared.clone();
        let spare = socket.try_clone().ok();
        let (stop, stopped) = mpsc::channel();
        let thread = thread::Builder::new()
            .name("pg-deadline".into())
            .spawn(move || {
                if watch(socket.as_raw_fd(), peer, probe, first, &watched, &stopped) {
                    on_fire();
                    // Shuts the socket itself, not only our duplicate: the blocked call returns.
                    let _ = socket.shutdown(Shutdown::Both);
                }
            })
            .ok()?;
        Some(Guard {
            shared,
            stop: Some(stop),
            socket: spare,
            thread: Some(thread),
        })
    }

    /// True once the watchdog has given up on the server and shut the connection.
    pub fn fired(&self) -> bool {
        self.shared.fired.load(Ordering::SeqCst)
    }

    /// Shuts the connection now: its server is known not to answer, waiting would only
    /// confirm it (the goodbye of a connection being dropped, for one).
    pub fn abandon(&self) {
        if let Some(socket) = &self.socket {
            let _ = socket.shutdown(Shutdown::Both);
        }
    }

    /// Changes the bound from now on (cleanup after a failure uses a short one).
    pub fn set_bound(&self, bound: Duration) {
        self.shared
            .bound_ticks
            .store(ticks(bound), Ordering::SeqCst);
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn ticks(bound: Duration) -> u32 {
    (bound.as_millis() / TICK.as_millis()).max(2) as u32
}

/// A duplicate of the TCP socket with this local port, and the server's address.
fn find_socket(local_port: u16) -> Option<(TcpStream, SocketAddr)> {
    for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
        let Ok(fd) = entry.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy().starts_with("socket:"));
        if !is_socket {
            continue;
        }
        // SAFETY: the number was open a moment ago; at worst it was closed since, and then
        // the calls below fail. ManuallyDrop keeps this view from closing what it is not.
        let view = ManuallyDrop::new(unsafe { TcpStream::from_raw_fd(fd) });
        if !view
            .local_addr()
            .is_ok_and(|local| local.port() == local_port)
        {
            continue;
        }
        // SAFETY: as above; the duplicate is checked again, in case the number changed hands.
        let socket = TcpStream::from(
            unsafe { BorrowedFd::borrow_raw(fd) }
                .try_clone_to_owned()
                .ok()?,
        );
        if let (Ok(local), Ok(peer)) = (socket.local_addr(), socket.peer_addr())
            && local.port() == local_port
        {
            return Some((socket, peer));
        }
    }
    None
}

/// Data segments sent and received on the socket so far, as the kernel counts them.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Traffic {
    out: u32,
    r#in: u32,
}

fn traffic(fd: RawFd) -> Option<Traffic> {
    use nix::libc;
    // SAFETY: tcp_info is plain old data; zeroed is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` and `len` are valid for writes and `len` says how big `info` is.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    let needed = std::mem::offset_of!(libc::tcp_info, tcpi_data_segs_out) + 4;
    (rc == 0 && len as usize >= needed).then_some(Traffic {
        out: info.tcpi_data_segs_out,
        r#in: info.tcpi_data_segs_in,
    })
}

/// Watches until stopped (false) or until the server is found not answering (true).
fn watch(
    fd: RawFd,
    peer: SocketAddr,
    probe: Probe,
    mut last: Traffic,
    shared: &Shared,
    stopped: &mpsc::Receiver<()>,
) -> bool {
    let mut waiting = false;
    let mut waited = 0u32;
    let mut patience_factor = 1u32;
    loop {
        // One tick — counted only when this process ran through it, so a SIGSTOP does not
        // age the call — or the guard's end, at once.
        if stopped.recv_timeout(TICK) != Err(mpsc::RecvTimeoutError::Timeout)
            || shared.stop.load(Ordering::SeqCst)
        {
            return false;
        }
        let Some(now) = traffic(fd) else {
            return false;
        };
        if now.out != last.out {
            // A request went out (perhaps just after an answer came in): wait for its answer.
            waiting = true;
            waited = 0;
            patience_factor = 1;
        } else if now.r#in != last.r#in {
            waiting = false;
            patience_factor = 1;
        } else if waiting {
            waited += 1;
        }
        last = now;
        let bound = shared.bound_ticks.load(Ordering::SeqCst);
        let patience = (bound * 3 / 5).saturating_mul(patience_factor);
        if !waiting || waited < patience.min(MAX_PATIENCE_TICKS) {
            continue;
        }
        if something_to_read(fd)
            || server_answers(peer, probe, bound - bound * 3 / 5, shared) != Answer::Silence
            || shared.stop.load(Ordering::SeqCst)
        {
            // Alive: the statement waits for a reason of the server's (a lock, a big sort)
            // and `statement_timeout` bounds it. Or dead, refusing connections: then our
            // own connection is reset or closed, and the call fails by itself. Either way,
            // look again later, less often.
            waited = 0;
            patience_factor = patience_factor.saturating_mul(BACKOFF);
            continue;
        }
        if traffic(fd).is_none_or(|after| after != last) || something_to_read(fd) {
            continue;
        }
        if shared.stop.load(Ordering::SeqCst) {
            return false;
        }
        shared.fired.store(true, Ordering::SeqCst);
        return true;
    }
}

/// Bytes from the server wait unread in the socket (the caller has not run since), or the
/// server closed its end: either way, the caller will hear from the socket by itself.
fn something_to_read(fd: RawFd) -> bool {
    use nix::libc;
    let mut byte = 0u8;
    // SAFETY: reads at most one byte into `byte`; MSG_PEEK leaves it in the socket for its
    // owner, MSG_DONTWAIT returns at once whether or not the socket is non-blocking.
    let n = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n >= 0
}

/// What a probe heard.
#[derive(PartialEq, Eq)]
enum Answer {
    /// An answer, or the server closing the probe: it runs.
    Spoke,
    /// Connection refused (or another error): nobody listens; it is gone, not frozen.
    Refused,
    /// Connected (the kernel accepts for a stopped process), then nothing.
    Silence,
}

/// Does the server answer a new connection's probe within `ticks` of our own run time?
fn server_answers(peer: SocketAddr, probe: Probe, ticks: u32, shared: &Shared) -> Answer {
    let Probe(request) = probe;
    let Ok(mut probe) = TcpStream::connect_timeout(&peer, TICK * ticks) else {
        return Answer::Refused;
    };
    if probe.set_read_timeout(Some(TICK)).is_err() || probe.write_all(request).is_err() {
        return Answer::Refused;
    }
    let mut byte = [0u8; 1];
    for _ in 0..ticks {
        if shared.stop.load(Ordering::SeqCst) {
            return Answer::Spoke;
        }
        match probe.read(&mut byte) {
            Ok(_) => return Answer::Spoke,
            Err(err)
                if matches!(
                    err.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(_) => return Answer::Refused,
        }
    }
    Answer::Silence
}
