//! The fault proxy: a TCP relay between one client and one server, which the nemesis can
//! make slow, stall, cut, or make forget an answer — the network faults that break a lock
//! with no process paused at all.
//!
//! ```text
//!  worker A ──▶ proxy :41234 ──▶ server (Redis, etcd, Postgres, the store)
//!               │  up:   client → server   (requests)
//!               │  down: server → client   (replies)
//! ```
//!
//! Each proxy listens on a loopback port of its own, so a lab aims a fault at one path (A's
//! link to the store) by giving each worker its own proxy. Each direction has its own fault:
//!
//! - **delay** every chunk by a fixed time (plus jitter): a congested or rerouted link;
//! - **hold** every chunk until released: a link that stalls and then delivers it all;
//! - **cut**, as a reset (both sides see the connection die) or a black hole (bytes vanish,
//!   nobody is told — a partition);
//! - **delay the next** request only: one message late, everything else on time — the write
//!   that left while the lease was valid and arrived after it ran out;
//! - **drop the reply** to the next request: the server receives and applies it, and its
//!   answer is lost; the client's connection is then reset, as a broken link would be;
//! - **delay or hold the next write** to one table: a proxy told to watch a Postgres table
//!   ([`Proxy::watch_writes`]) reads the client's messages ([`pg`]) and aims at the one that
//!   writes it, whatever the client sent before (a `SELECT 1`, a check of its lock).
//!
//! Two threads per proxy (one on a one-core machine) each run an event loop (tokio's
//! single-threaded runtime, which the etcd client brings anyway), and connections take turns
//! on them: every connection is two small tasks on one loop, one per direction, so that
//! fifty clients cost fifty pairs of tasks, not a hundred threads taking turns on the CPU.
//! With no fault on, a chunk is written by the task that read it, with no queue in between.
//! Stopping the proxy ends its runtime, which drops every task and closes every socket.

use std::collections::VecDeque;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::runtime::Handle;
use tokio::sync::watch;

mod dry_run;
pub mod guard;
mod pg;
mod sign_in;
mod url;

pub use dry_run::{LOCK_TIMEOUT_MS as TRY_LOCK_TIMEOUT_MS, Probe, Tried};
pub use sign_in::SignIn;
pub use url::{through, upstream_of};

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Client to server: requests.
    Up,
    /// Server to client: replies.
    Down,
}

/// A fault on one direction of the path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "net", rename_all = "snake_case")]
pub enum NetFault {
    /// Every chunk arrives `ms` (plus up to `jitter_ms`) after it was sent.
    Delay { ms: u64, jitter_ms: u64 },
    /// Chunks queue up until the fault is lifted, then go out in order.
    Hold,
    /// Both sides of every connection on the path are reset (RST), new ones too.
    Reset,
    /// Bytes are swallowed and nobody is told: the connection looks open and silent.
    BlackHole,
    /// Only the next chunk is delayed by `ms`; everything after it waits behind it, as TCP
    /// delivers in order (up only).
    DelayNext { ms: u64 },
    /// The next request goes through; the server's reply to it is thrown away and the
    /// client's connection reset (up only: it aims at the reply of the next request).
    DropReply,
    /// Only the next message that writes the watched table ([`Proxy::watch_writes`]) is
    /// delayed by `ms`, and everything after it waits behind it; the messages before it go
    /// on time (up only). It is reported as it is caught ([`Seen::WriteHeld`]).
    DelayWrite { ms: u64 },
    /// The next message that writes the watched table is held — tried first, and let by if it
    /// changes no value, items or job (its try, in `dry_run`) — with everything after it, until the
    /// fault is lifted: on catching it (reported, [`Seen::WriteHeld`]) the fault
    /// becomes a [`NetFault::Hold`] (up only).
    HoldWrite,
    /// [`NetFault::HoldWrite`] that counts any write that changes a row of the watched
    /// table, not only one that carries a job's effect: a claim that sets only `fence` is
    /// held too. Where lockslab holds a newer holder just before its write (the worst
    /// order), it holds it at its claim, if it claims after its read: the older held write
    /// must land before that claim, or the order tests nothing (up only).
    HoldFirstTouch,
    /// [`NetFault::DelayWrite`] aimed at the commit of a write instead ([`pg`]'s notes): the
    /// `COMMIT` that ends a transaction block in which a write of the watched table was
    /// sent, or a write sent outside any block, which commits as it runs. The writes before
    /// it go on time. Reported as it is caught ([`Seen::CommitHeld`]).
    DelayCommit { ms: u64 },
    /// [`NetFault::HoldWrite`] aimed at the commit of a write, as [`NetFault::DelayCommit`].
    HoldCommit,
}

impl NetFault {
    /// Aimed at the commit of a write ([`NetFault::DelayCommit`], [`NetFault::HoldCommit`]).
    fn aims_at_a_commit(self) -> bool {
        matches!(self, NetFault::DelayCommit { .. } | NetFault::HoldCommit)
    }
}

/// What the proxy saw happen to a fault it was given, for the run's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A delayed-next chunk, or a held write, went out, `late_ms` after it came in.
    DelayedSent { late_ms: u64 },
    /// A write aimed at by [`NetFault::DelayWrite`] or [`NetFault::HoldWrite`] came, and
    /// is held; what trying it when it came showed ([`dry_run`]), and the server session
    /// it goes to (its `pg_backend_pid()`), when the proxy read it.
    /// `request`: which of the connection's requests the write is, counted as the server
    /// answers them (its startup the first), so that an answer to it can be told apart.
    WriteHeld {
        tried: Tried,
        session: Option<i32>,
        request: u64,
    },
    /// The commit of a write, aimed at by [`NetFault::DelayCommit`] or
    /// [`NetFault::HoldCommit`], came and is held (with any write of the same request
    /// before it), in the server session `session` when the proxy read it.
    CommitHeld {
        session: Option<i32>,
        /// Which request of the connection the commit is (counted as for a held write).
        request: u64,
    },
    /// A write to the watched table came while writes are watched for a fault, and,
    /// tried, it changed nothing: it went straight on, neither gated nor held.
    WriteChangedNothing,
    /// A write to the watched table could not be tried, or its try told nothing: why. It
    /// goes on as an untried write would.
    WriteUntried { why: String },
    /// The request whose reply is dropped reached the server.
    RequestForwarded { bytes: usize },
    /// Its reply came back and was thrown away; the client's connection was reset.
    ReplyDropped { bytes: usize },
    /// A connection was reset by a cut.
    ConnectionReset,
    /// A write to the watched table came and waits at the gate ([`Proxy::gate_writes`])
    /// until [`Proxy::open_gate`] lets ticket `ticket` in.
    WriteGated { ticket: u64 },
    /// The server ended a transaction of the session `session` for a serialization
    /// failure or a deadlock it found (`why`: its SQLSTATE and message), in its answer to
    /// the connection's `request`th request: whatever that transaction wrote, the database
    /// refused it.
    TransactionAborted {
        session: Option<i32>,
        why: String,
        request: u64,
    },
}

/// One report from the proxy: when, on which path, what.
#[derive(Clone, Debug)]
pub struct Report {
    pub at: Instant,
    pub path: String,
    pub seen: Seen,
}

/// The shared state of one proxy: its faults, its connections, what it saw.
struct Shared {
    path: String,
    upstream: SocketAddr,
    state: Mutex<State>,
    /// Bumped when a fault changes or the proxy stops: the tasks waiting on a fault wake.
    changed: watch::Sender<u64>,
    stopping: AtomicBool,
    /// No fault on either direction and no reply waiting to be dropped: what the tasks
    /// look at first, without the lock. Kept by [`Locked`]'s drop, after every change.
    quiet: AtomicBool,
    /// The connection tasks alive (two per connection).
    tasks: AtomicUsize,
    /// The most connections it relays at once (see [`Proxy::limit_connections`]); one more
    /// is accepted and reset at once.
    most_links: AtomicUsize,
    /// The connections accepted and not yet closed (each counted by a [`Held`]), those
    /// still connecting to the server included.
    held: AtomicUsize,
    /// The Postgres table whose writes the up direction looks for, once told.
    watched: OnceLock<pg::Table>,
    /// Each write caught is tried first, asking the server this way ([`Proxy::try_writes`]).
    trying: OnceLock<Probe>,
    /// Each connection signs in to the server for its client ([`Proxy::sign_in_for`]).
    sign_in: OnceLock<SignIn>,
    /// The server sessions its connections opened, as far as it could read them.
    sessions: Mutex<Sessions>,
}

/// The Postgres sessions a proxy's connections opened, read from the server's
/// `BackendKeyData` (on the connections it reads the protocol of, when it tries writes):
/// so the challenge can tell a change made through the proxy from one made around it, on
/// a connection of the client's own straight to the server, where no fault reaches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sessions {
    pub pids: std::collections::BTreeSet<i32>,
    /// Connections that went encrypted before the server named its session: unread.
    pub encrypted: usize,
}

impl Shared {
    fn wake(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// A connection's two sockets, duplicated so that a cut or a stop from another thread can
/// shut them under the tasks that read them.
struct Link {
    id: u64,
    client: TcpStream,
    server: TcpStream,
}

#[derive(Default)]
struct State {
    up: Option<NetFault>,
    down: Option<NetFault>,
    /// Live connections, to cut or close them.
    links: Vec<Link>,
    next_link: u64,
    reports: Vec<Report>,
    /// The connections whose next reply is dropped: each put here by a `DropReply` once its
    /// request went up, so the reply lost is the answer to that request, on that connection.
    drop_reply_on: Vec<u64>,
    /// A pseudo-random state for jitter (xorshift), seeded per proxy.
    jitter: u64,
    /// How many times each direction was healed (up, down): a chunk queued before the
    /// last heal of its direction goes out at once, whatever delay it was waiting out.
    heals: [u64; 2],
    /// Writes to the watched table wait at the gate until let in ([`Proxy::gate_writes`]).
    gate: bool,
    /// The last ticket handed to a write at the gate, and the last one let in.
    gate_tickets: u64,
    gate_opened: u64,
}

impl State {
    fn fault(&self, direction: Direction) -> Option<NetFault> {
        match direction {
            Direction::Up => self.up,
            Direction::Down => self.down,
        }
    }

    fn set_fault(&mut self, direction: Direction, fault: Option<NetFault>) {
        match direction {
            Direction::Up => self.up = fault,
            Direction::Down => self.down = fault,
        }
    }

    /// Is a fault aimed at the next write to the watched table ([`NetFault::DelayWrite`],
    /// [`NetFault::HoldWrite`])?
    fn write_aimed(&self) -> bool {
        matches!(
            self.up,
            Some(NetFault::DelayWrite { .. } | NetFault::HoldWrite | NetFault::HoldFirstTouch)
        )
    }

    /// Is a fault aimed at the next commit of a write ([`NetFault::DelayCommit`],
    /// [`NetFault::HoldCommit`])?
    fn commit_aimed(&self) -> bool {
        self.up.is_some_and(NetFault::aims_at_a_commit)
    }

    /// Resets both sockets of a connection and forgets it.
    fn cut(&mut self, link: u64) {
        self.links.retain(|l| {
            if l.id == link {
                reset(&l.client);
                reset(&l.server);
            }
            l.id != link
        });
    }
}

fn side(direction: Direction) -> usize {
    match direction {
        Direction::Up => 0,
        Direction::Down => 1,
    }
}

/// A running proxy. Dropping it stops it: its thread ends and its sockets close.
pub struct Proxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    /// One thread per event loop; the first also accepts.
    threads: Vec<JoinHandle<()>>,
}

impl Proxy {
    /// Starts a proxy on a free loopback port in front of `upstream`; `path` names it in
    /// reports (`A→store`).
    pub fn start(path: &str, upstream: SocketAddr) -> Result<Proxy> {
        Proxy::start_on(path, SocketAddr::from(([127, 0, 0, 1], 0)), upstream)
    }

    /// Starts a proxy listening on `listen` (a free port when its port is 0).
    pub fn start_on(path: &str, listen: SocketAddr, upstream: SocketAddr) -> Result<Proxy> {
        Proxy::start_with(path, listen, upstream, event_loops())
    }

    /// Starts a proxy with `loops` event loops (at least one): what the benchmark compares.
    pub fn start_with(
        path: &str,
        listen: SocketAddr,
        upstream: SocketAddr,
        loops: usize,
    ) -> Result<Proxy> {
        let listener = TcpListener::bind(listen)
            .with_context(|| format!("starting the fault proxy on {listen}"))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            path: path.to_string(),
            upstream,
            state: Mutex::new(State {
                jitter: 0x9e37_79b9_7f4a_7c15 ^ u64::from(addr.port()),
                ..State::default()
            }),
            changed: watch::Sender::new(0),
            stopping: AtomicBool::new(false),
            quiet: AtomicBool::new(true),
            tasks: AtomicUsize::new(0),
            most_links: AtomicUsize::new(usize::MAX),
            held: AtomicUsize::new(0),
            watched: OnceLock::new(),
            trying: OnceLock::new(),
            sign_in: OnceLock::new(),
            sessions: Mutex::new(Sessions::default()),
        });
        let mut runtimes = Vec::new();
        for _ in 0..loops.max(1) {
            runtimes.push(
                tokio::runtime::Builder::new_current_thread()
                    .enable_io()
                    .enable_time()
                    .build()
                    .context("starting the fault proxy's event loop")?,
            );
        }
        let loops: Arc<Vec<Handle>> =
            Arc::new(runtimes.iter().map(|r| r.handle().clone()).collect());
        let mut threads = Vec::new();
        let mut listener = Some(listener);
        for (n, runtime) in runtimes.into_iter().enumerate() {
            let (mine, loops, listener) =
                (Arc::clone(&shared), Arc::clone(&loops), listener.take());
            let thread = thread::Builder::new()
                .name(format!("proxy {path} {n}"))
                .spawn(move || {
                    match listener {
                        Some(listener) => runtime.block_on(accept_loop(listener, mine, loops)),
                        None => runtime.block_on(until_stopped(mine)),
                    }
                    // Every connection's tasks are dropped here, and their sockets closed.
                    drop(runtime);
                });
            match thread {
                Ok(thread) => threads.push(thread),
                Err(err) => {
                    Proxy {
                        shared,
                        addr,
                        threads,
                    }
                    .stop();
                    return Err(err).context("starting the fault proxy's thread");
                }
            }
        }
        Ok(Proxy {
            shared,
            addr,
            threads,
        })
    }

    /// Where clients connect instead of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The path's name in reports and in the history (`A→store`).
    pub fn path(&self) -> &str {
        &self.shared.path
    }

    /// Puts a fault on one direction (replacing the one there). A cut acts at once on every
    /// live connection of the path.
    pub fn set(&self, direction: Direction, fault: NetFault) {
        {
            let mut state = self.lock();
            state.set_fault(direction, Some(fault));
            if fault == NetFault::Reset {
                let links = std::mem::take(&mut state.links);
                for link in &links {
                    reset(&link.client);
                    reset(&link.server);
                }
                if !links.is_empty() {
                    let report = self.report(Seen::ConnectionReset);
                    state.reports.push(report);
                }
            }
        }
        self.shared.wake();
    }

    /// Lifts the fault on one direction: held bytes, and bytes still waiting out a delay,
    /// go out at once, in order.
    pub fn clear(&self, direction: Direction) {
        {
            let mut state = self.lock();
            state.set_fault(direction, None);
            state.heals[side(direction)] += 1;
        }
        self.shared.wake();
    }

    /// The fault on one direction now.
    pub fn fault(&self, direction: Direction) -> Option<NetFault> {
        self.lock().fault(direction)
    }

    /// What the proxy saw since the last call, oldest first.
    pub fn reports(&self) -> Vec<Report> {
        std::mem::take(&mut self.lock().reports)
    }

    /// How many client connections are open through it.
    pub fn connections(&self) -> usize {
        self.lock().links.len()
    }

    /// The local ports of its live connections to the server: what the server sees as
    /// their clients' ports (Postgres's `pg_stat_activity.client_port`), to tell which of
    /// the server's sessions are this path's.
    pub fn server_ports(&self) -> Vec<u16> {
        (self.lock().links.iter())
            .filter_map(|link| link.server.local_addr().ok())
            .map(|addr| addr.port())
            .collect()
    }

    /// Reads the Postgres protocol its clients send, on every connection opened from now
    /// on, to find the messages that write `table` (`schema.name`): what
    /// [`NetFault::DelayWrite`] and [`NetFault::HoldWrite`] aim at. Without it they catch
    /// nothing, and every byte goes through.
    pub fn watch_writes(&self, table: &str) {
        let _ = self.shared.watched.set(pg::Table::parse(table));
    }

    /// Signs in to Postgres for each connection made from now on ([`sign_in`]): its
    /// client must give `how.given`, and the server gets `how.real`, which the client never
    /// sees — so the client cannot open a session of that login around the proxy.
    pub fn sign_in_for(&self, how: SignIn) {
        let _ = self.shared.sign_in.set(how);
    }

    /// Tries each write to the watched table as it comes, on the connections made from now
    /// on, before it goes to the gate or to a fault: in the client's session, rolled back
    /// ([`dry_run`]). A write that changes nothing goes straight on
    /// ([`Seen::WriteChangedNothing`]); a held one is reported with what its try showed.
    /// Postgres only: it speaks to the server on the client's connection, and `probe`
    /// reads the rows the write updated from the server's own log.
    pub fn try_writes(&self, probe: Probe) {
        let _ = self.shared.trying.set(probe);
    }

    /// The server sessions its connections opened so far ([`Sessions`]): read on the
    /// connections made after [`Proxy::try_writes`].
    pub fn sessions(&self) -> Sessions {
        (self.shared.sessions.lock())
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Stops every write to the watched table at a gate, from now on, until the one who
    /// watches lets it in ([`Proxy::open_gate`] with the ticket of its
    /// [`Seen::WriteGated`]): the bytes before the write go on, the write and what follows
    /// wait. The challenge lets a write in only once it has read every note its client
    /// wrote before it: a fault aimed at the client's `writing` note is then armed before
    /// the write it aims at goes by, however late the note was read. A write nobody lets
    /// in goes on its own after [`GATE_PATIENCE`].
    pub fn gate_writes(&self) {
        self.lock().gate = true;
        self.shared.wake();
    }

    /// Lets the write holding `ticket` (and any before it) through the gate: it meets the
    /// fault on the path now, as if it had just come.
    pub fn open_gate(&self, ticket: u64) {
        {
            let mut state = self.lock();
            state.gate_opened = state.gate_opened.max(ticket);
        }
        self.shared.wake();
    }

    /// Relays at most `most` connections at once: one more is accepted and reset at once.
    /// A proxy anyone on the machine can connect to would otherwise spend its file
    /// descriptors on whoever opens the most connections ([`FDS_PER_CONNECTION`] each),
    /// and then have none left for its own control socket.
    pub fn limit_connections(&self, most: usize) {
        self.shared.most_links.store(most.max(1), Ordering::SeqCst);
    }

    /// Stops accepting, closes every connection and waits for the proxy's thread.
    pub fn stop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        {
            let mut state = self.lock();
            for link in state.links.drain(..) {
                let _ = link.client.shutdown(Shutdown::Both);
                let _ = link.server.shutdown(Shutdown::Both);
            }
        }
        self.shared.wake();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }

    fn lock(&self) -> Locked<'_> {
        lock(&self.shared)
    }

    fn report(&self, seen: Seen) -> Report {
        Report {
            at: Instant::now(),
            path: self.shared.path.clone(),
            seen,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How many event loops a proxy runs: two where the machine has two cores or more. On a
/// loaded two-core machine one loop is one thread among the client's and the server's,
/// and gets a third of the CPU while it does twice the server's system calls (a read and
/// a write each way for every request); two loops get it a fair share of both cores.
pub fn event_loops() -> usize {
    thread::available_parallelism().map_or(1, |n| n.get().min(2))
}

/// What an event loop that does not accept runs: nothing of its own, until the proxy stops.
async fn until_stopped(shared: Arc<Shared>) {
    let mut changed = shared.changed.subscribe();
    while !shared.stopping.load(Ordering::SeqCst) {
        if changed.changed().await.is_err() {
            return;
        }
    }
}

/// The file descriptors one relayed connection holds: the client's socket, the server's,
/// and a duplicate of each, kept to cut them from another thread.
pub const FDS_PER_CONNECTION: usize = 4;

/// How long an accept that failed for want of a resource waits before the next, at most.
const LONGEST_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Whether an `accept` error is a shortage that passes (file descriptors, memory, buffers)
/// or a connection that went before it was taken: wait and accept again, never stop.
pub fn accept_error_passes(err: &std::io::Error) -> bool {
    use nix::errno::Errno;
    matches!(
        err.raw_os_error().map(Errno::from_raw),
        Some(
            Errno::EMFILE
                | Errno::ENFILE
                | Errno::ENOBUFS
                | Errno::ENOMEM
                | Errno::ECONNABORTED
                | Errno::EINTR
                | Errno::EPROTO
                | Errno::EPERM
        )
    ) || err.kind() == std::io::ErrorKind::WouldBlock
}

/// The next wait after a failed accept: doubled from 10ms, at most
/// [`LONGEST_ACCEPT_BACKOFF`]. The failed connection still waits in the kernel's queue, so
/// accepting again at once would fail again at once, as fast as the CPU allows.
pub fn accept_backoff(last: Duration) -> Duration {
    (last * 2).clamp(Duration::from_millis(10), LONGEST_ACCEPT_BACKOFF)
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, loops: Arc<Vec<Handle>>) {
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let mut changed = shared.changed.subscribe();
    let mut next = 0;
    let mut backoff = Duration::ZERO;
    loop {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let client = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    backoff = Duration::ZERO;
                    client
                }
                Err(_) => {
                    // Out of file descriptors, most often: the connections open now must
                    // close first. Waits, woken early by a stop.
                    backoff = accept_backoff(backoff);
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        _ = changed.changed() => {}
                    }
                    continue;
                }
            },
            _ = changed.changed() => continue,
        };
        let cut = {
            let state = lock(&shared);
            state.up == Some(NetFault::Reset)
                || state.down == Some(NetFault::Reset)
                || shared.held.load(Ordering::SeqCst) >= shared.most_links.load(Ordering::SeqCst)
        };
        if cut {
            let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
            continue;
        }
        // Connections take turns on the event loops; each is registered with the loop
        // that runs its two tasks, so that the loop's own poll wakes them.
        next = (next + 1) % loops.len();
        let Ok(client) = client.into_std() else {
            continue;
        };
        let held = Held::new(&shared);
        loops[next].spawn(connect(client, Arc::clone(&shared), held));
    }
}

/// Counts one accepted connection as held until its last task ends (see [`Shared::held`]).
struct Held(Arc<Shared>);

impl Held {
    fn new(shared: &Arc<Shared>) -> Arc<Held> {
        shared.held.fetch_add(1, Ordering::SeqCst);
        Arc::new(Held(Arc::clone(shared)))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.held.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Opens the server's side of a new connection and starts its two tasks.
async fn connect(client: TcpStream, shared: Arc<Shared>, held: Arc<Held>) {
    let Ok(client) = tokio::net::TcpStream::from_std(client) else {
        return;
    };
    let server = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect(shared.upstream),
    )
    .await;
    let Ok(Ok(mut server)) = server else {
        let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
        return;
    };
    let mut client = client;
    let startup = match shared.sign_in.get() {
        Some(how) => match sign_in::sign_in(how, &mut client, &mut server).await {
            Some(startup) => Some(startup),
            None => return,
        },
        None => None,
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(client), Ok(server)) = (dup(client), dup(server)) else {
        return;
    };
    let ((client, client_dup), (server, server_dup)) = (client, server);
    let link = {
        let mut state = lock(&shared);
        // Under the lock `stop` drains the links with: a connection accepted while the
        // proxy was stopping is closed here, or it would outlive the proxy.
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        state.next_link += 1;
        let id = state.next_link;
        state.links.push(Link {
            id,
            client: client_dup,
            server: server_dup,
        });
        id
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let mut up = Pump::new(&shared, Direction::Up, link, client_read, server_write);
    up.reader = (shared.watched.get()).map(|table| {
        let mut reader = pg::Frontend::new(table.clone());
        // Signed in already: the reader starts after the startup packet.
        reader.read(startup.as_deref().unwrap_or_default());
        reader
    });
    let mut down = Pump::new(&shared, Direction::Down, link, server_read, client_write);
    if up.reader.is_some() && shared.trying.get().is_some() {
        let conversation = Arc::new(dry_run::Conversation::default());
        if startup.is_some() {
            conversation.signed_in();
        }
        up.conversation = Some(Arc::clone(&conversation));
        down.conversation = Some(conversation);
    }
    up._held = Some(Arc::clone(&held));
    down._held = Some(held);
    tokio::spawn(up.run());
    tokio::spawn(down.run());
}

/// A tokio stream and a duplicate of its socket, for cutting it from another thread.
fn dup(stream: tokio::net::TcpStream) -> std::io::Result<(tokio::net::TcpStream, TcpStream)> {
    let std = stream.into_std()?;
    let copy = std.try_clone()?;
    Ok((tokio::net::TcpStream::from_std(std)?, copy))
}

fn lock(shared: &Shared) -> Locked<'_> {
    Locked {
        state: shared
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
        quiet: &shared.quiet,
    }
}

/// The proxy's state, locked; on unlocking it says whether the path is quiet now.
struct Locked<'a> {
    state: std::sync::MutexGuard<'a, State>,
    quiet: &'a AtomicBool,
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let quiet = self.state.up.is_none()
            && self.state.down.is_none()
            && !self.state.gate
            && self.state.drop_reply_on.is_empty();
        self.quiet.store(quiet, Ordering::SeqCst);
    }
}

/// Closes a socket with a reset rather than a goodbye: the peer's next read fails with
/// "connection reset", as when a middlebox or a rebooted host drops the connection.
fn reset(stream: &TcpStream) {
    let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
    let _ = stream.shutdown(Shutdown::Both);
}

/// One chunk waiting to go out: when it may, its bytes, when it came in if a delay-next is
/// reported on it, and the direction's heal count when it was queued.
struct Queued {
    due: Instant,
    chunk: Vec<u8>,
    marked: Option<Instant>,
    healed: u64,
}

/// How many bytes a direction of one connection queues before it stops reading: past it
/// the kernel's buffers fill and the sender is held, as on a stalled network, instead of
/// the proxy growing by whatever the sender sends.
const QUEUE_CAP: usize = 1024 * 1024;

/// How long a write waits at the gate for the one who watches to let it in, before it goes
/// on by itself (the watcher stuck or gone): a write is held no longer than this.
pub const GATE_PATIENCE: Duration = Duration::from_secs(2);

/// A write waiting at the gate: its ticket, its bytes and all that came after them, and
/// since when.
struct Gated {
    ticket: u64,
    bytes: Vec<u8>,
    since: Instant,
    /// The bytes hold the commit of a write too (the write's own, or a `COMMIT` after it):
    /// a fault aimed at the commit by the time they are let in holds them all.
    commits: bool,
}

/// One direction of one connection: reads, and forwards what it reads — at once when the
/// path is clear, through its queue when a fault holds bytes back. It keeps reading while
/// chunks wait (up to [`QUEUE_CAP`] bytes), so that each waits its own delay, not the sum
/// of those ahead of it.
struct Pump {
    shared: Arc<Shared>,
    direction: Direction,
    /// The connection it belongs to (the up pump forgets it when the client goes).
    link: u64,
    from: OwnedReadHalf,
    to: OwnedWriteHalf,
    queue: VecDeque<Queued>,
    /// The bytes in `queue`.
    queued: usize,
    _alive: Alive,
    /// The connection's place among those held, given back when both pumps end.
    _held: Option<Arc<Held>>,
    /// The Postgres messages read so far, when the proxy watches a table's writes (up only).
    reader: Option<pg::Frontend>,
    /// The connection's requests and answers, when the proxy watches a table's writes: the
    /// down pump reads the answers, the up pump tries a caught write ([`dry_run`]).
    conversation: Option<Arc<dry_run::Conversation>>,
    /// The server's session for this connection is known (or cannot be: encrypted).
    session_told: bool,
    /// The requests read from the client that the server answers with a `ReadyForQuery`:
    /// its startup, each `Query` and each `Sync`.
    asked: u64,
    /// What trying the write caught last showed, told when its fault catches it.
    tried: Option<Tried>,
    /// Which request of the connection the write caught last is (see [`Seen::WriteHeld`]).
    caught_request: u64,
    /// The first bytes of a message not judged yet, kept back while a write is aimed at:
    /// it may be the write.
    unjudged: Vec<u8>,
    /// A write waiting at the gate (up only): nothing more is read until it is let in.
    gated: Option<Gated>,
}

/// What to do after a chunk came in.
enum Next {
    Go,
    Stop,
}

/// Where a fault sends a chunk.
enum Way {
    Now,
    Queue(Queued),
    Swallow,
    Cut,
}

/// Counts a pump alive until it ends or its runtime drops it.
struct Alive(Arc<Shared>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.tasks.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Pump {
    fn new(
        shared: &Arc<Shared>,
        direction: Direction,
        link: u64,
        from: OwnedReadHalf,
        to: OwnedWriteHalf,
    ) -> Pump {
        shared.tasks.fetch_add(1, Ordering::SeqCst);
        Pump {
            shared: Arc::clone(shared),
            direction,
            link,
            from,
            to,
            queue: VecDeque::new(),
            queued: 0,
            _alive: Alive(Arc::clone(shared)),
            _held: None,
            reader: None,
            conversation: None,
            // The startup packet is answered with a ReadyForQuery too, once logged in.
            asked: 1,
            tried: None,
            caught_request: 0,
            session_told: false,
            unjudged: Vec::new(),
            gated: None,
        }
    }

    async fn run(mut self) {
        let mut changed = self.shared.changed.subscribe();
        let mut buffer = vec![0u8; 16 * 1024];
        let mut reading = true;
        loop {
            if let Some(gated) = self.gated.take() {
                self.wait_at_gate(&gated, &mut changed).await;
                if let Next::Stop = self.through_gate(gated.bytes, gated.commits).await {
                    break;
                }
                continue;
            }
            if self.queue.is_empty() {
                if !reading {
                    break;
                }
                match self.from.read(&mut buffer).await {
                    Ok(0) | Err(_) => {
                        reading = false;
                        if let Next::Stop = self.flush_unjudged().await {
                            break;
                        }
                    }
                    Ok(n) => {
                        if let Next::Stop = self.came(&buffer[..n]).await {
                            break;
                        }
                    }
                }
                continue;
            }
            // Chunks wait: read on (reading is cancel-safe) while the queue has room, or send
            // the first once it may go. The write happens outside the select, so that none
            // is cut in half.
            let room = self.queued < QUEUE_CAP;
            let ready = tokio::select! {
                read = self.from.read(&mut buffer), if reading && room => Some(read),
                () = front_ready(&self.shared, self.direction, &self.queue, &mut changed) => None,
            };
            match ready {
                Some(Ok(0) | Err(_)) => {
                    reading = false;
                    if let Next::Stop = self.flush_unjudged().await {
                        break;
                    }
                }
                Some(Ok(n)) => {
                    if let Next::Stop = self.came(&buffer[..n]).await {
                        break;
                    }
                }
                None => {
                    if !self.send_front().await {
                        break;
                    }
                }
            }
        }
        if !reading && self.queue.is_empty() {
            // The reader's side ended and all it read went out: pass the close on.
            let _ = self.to.shutdown().await;
        }
        if self.direction == Direction::Up {
            let mut state = lock(&self.shared);
            state.links.retain(|l| l.id != self.link);
            state.drop_reply_on.retain(|&link| link != self.link);
        }
    }

    /// Writes the first queued chunk; false ends the pump.
    async fn send_front(&mut self) -> bool {
        let Some(front) = self.queue.pop_front() else {
            return true;
        };
        self.queued -= front.chunk.len();
        if self.to.write_all(&front.chunk).await.is_err() {
            return false;
        }
        if let Some(came) = front.marked {
            lock(&self.shared).reports.push(Report {
                at: Instant::now(),
                path: self.shared.path.clone(),
                seen: Seen::DelayedSent {
                    late_ms: came.elapsed().as_millis() as u64,
                },
            });
        }
        true
    }

    /// Sends one chunk on its way: whole, or, while a write is aimed at and the proxy reads
    /// the Postgres protocol, held from the first byte of the write on. A message not yet
    /// read whole waits here meanwhile, as it may be the write.
    async fn came(&mut self, chunk: &[u8]) -> Next {
        if self.direction == Direction::Down
            && let Some(conversation) = &self.conversation
        {
            // The answers to a try are the proxy's own: they never reach the client.
            let from = conversation.heard(chunk);
            let aborted = conversation.aborted();
            if !aborted.is_empty() {
                let session = conversation.backend().0;
                let mut state = lock(&self.shared);
                for (why, request) in aborted {
                    state.reports.push(Report {
                        at: Instant::now(),
                        path: self.shared.path.clone(),
                        seen: Seen::TransactionAborted {
                            session,
                            why,
                            request,
                        },
                    });
                }
            }
            if !self.session_told {
                let (pid, encrypted) = conversation.backend();
                if pid.is_some() || encrypted {
                    self.session_told = true;
                    let mut sessions =
                        (self.shared.sessions.lock()).unwrap_or_else(|p| p.into_inner());
                    sessions.pids.extend(pid);
                    sessions.encrypted += usize::from(pid.is_none());
                }
            }
            if from >= chunk.len() {
                return Next::Go;
            }
            return self.relay(&chunk[from..]).await;
        }
        let Some(reader) = self.reader.as_mut() else {
            return self.relay(chunk).await;
        };
        let judged = reader.read(chunk);
        let answered_later = |m: &&pg::Message| matches!(m.kind, b'Q' | b'S');
        self.asked += judged.iter().filter(answered_later).count() as u64;
        let write = judged.iter().find(|m| m.writes).map(|m| m.start);
        let commit = judged.iter().find(|m| m.commits).map(|m| m.start);
        let (unjudged, end) = (reader.unjudged_from(), reader.offset());
        let (aimed, commit_aimed, gating) = if self.shared.quiet.load(Ordering::SeqCst) {
            (false, false, false)
        } else {
            let state = lock(&self.shared);
            (state.write_aimed(), state.commit_aimed(), state.gate)
        };
        if !aimed && !commit_aimed && !gating && self.unjudged.is_empty() {
            return self.relay(chunk).await;
        }
        let mut bytes = std::mem::take(&mut self.unjudged);
        bytes.extend_from_slice(chunk);
        if !aimed && !commit_aimed && !gating {
            return self.relay(&bytes).await;
        }
        // Where these bytes begin in the stream: the write may have begun before them, in
        // bytes that went before the aim was set.
        let from = end - bytes.len() as u64;
        let at = |offset: u64| offset.saturating_sub(from) as usize;
        if commit_aimed && let Some(commit) = commit {
            if write == Some(commit) {
                // A write that commits as it runs (outside a block): tried as any write is,
                // and let by, its commit with it, if it changes nothing.
                return self.commit_of_its_own(bytes, at(commit), &judged).await;
            }
            let from_commit = judged.iter().filter(|m| m.start >= commit);
            let asked_before = self.asked - from_commit.filter(answered_later).count() as u64;
            let nothing = (self.conversation.as_ref())
                .is_some_and(|c| c.commit_commits_nothing(asked_before));
            if write.is_none() && nothing {
                // The commit of a block that changed no row, as the server answered it (an
                // `UPDATE … AND false` sent to take the fault, or a compare that lost): a
                // commit of nothing, let by; the fault waits for one that commits a change.
                return self.relay(&bytes).await;
            }
            // Held from the commit, or from a write sent in the same bytes before it: the
            // server runs them together, at its own speed — whatever runs between them (an
            // unlock, say) leaves a gap the fault does not stretch. Neither is tried.
            let held = write.map_or(commit, |write| write.min(commit));
            let from_held = judged.iter().filter(|m| m.start >= held);
            self.caught_request = self.asked - from_held.filter(answered_later).count() as u64 + 1;
            let rest = bytes.split_off(at(held));
            if !bytes.is_empty()
                && let Next::Stop = self.relay(&bytes).await
            {
                return Next::Stop;
            }
            if write.is_some() {
                self.tried = Some(Tried::Untried("sent with its commit".into()));
            }
            return self.hold_write(rest, write.is_none()).await;
        }
        if let Some(write) = write {
            let rest = bytes.split_off(at(write));
            if !bytes.is_empty()
                && let Next::Stop = self.relay(&bytes).await
            {
                return Next::Stop;
            }
            let in_rest = judged.iter().filter(|m| m.start >= write);
            let asked_before = self.asked - in_rest.filter(answered_later).count() as u64;
            let tried = match self.try_or_let_by(&rest, asked_before).await {
                Ok(tried) => tried,
                Err(next) => return next,
            };
            if let Some(conversation) = &self.conversation {
                conversation.writes_in(asked_before + 1);
            }
            if let Tried::Untried(why) = &tried
                && self.conversation.is_some()
            {
                let seen = Seen::WriteUntried { why: why.clone() };
                lock(&self.shared).reports.push(Report {
                    at: Instant::now(),
                    path: self.shared.path.clone(),
                    seen,
                });
            }
            self.tried = Some(tried);
            self.caught_request = asked_before + 1;
            if aimed {
                return self.hold_write(rest, false).await;
            }
            if !gating {
                return self.relay(&rest).await;
            }
            let commits = commit.is_some_and(|commit| commit >= write);
            return self.stop_at_gate(rest, commits);
        }
        let keep = unjudged.map_or(bytes.len(), at);
        self.unjudged = bytes.split_off(keep);
        if bytes.is_empty() {
            return Next::Go;
        }
        self.relay(&bytes).await
    }

    /// A fault is aimed at the commit, and the write at `write` (in `bytes`) commits as it
    /// runs: the bytes before it go on, and it is tried first ([`Pump::try_write`]). One that
    /// changes nothing is let by (reported as [`Seen::WriteChangedNothing`]); else it is held
    /// as the commit.
    async fn commit_of_its_own(
        &mut self,
        mut bytes: Vec<u8>,
        write: usize,
        judged: &[pg::Message],
    ) -> Next {
        let rest = bytes.split_off(write);
        if !bytes.is_empty()
            && let Next::Stop = self.relay(&bytes).await
        {
            return Next::Stop;
        }
        let answered_later = |m: &&pg::Message| matches!(m.kind, b'Q' | b'S');
        let start = judged.iter().find(|m| m.commits).map_or(0, |m| m.start);
        let in_rest = judged.iter().filter(|m| m.start >= start);
        let asked_before = self.asked - in_rest.filter(answered_later).count() as u64;
        match self.try_or_let_by(&rest, asked_before).await {
            Ok(tried) => {
                self.tried = Some(tried);
                self.caught_request = asked_before + 1;
                self.hold_write(rest, false).await
            }
            Err(next) => next,
        }
    }

    /// Tries the write `rest` begins with ([`Pump::try_write`]): one that changes nothing
    /// goes straight on (reported as [`Seen::WriteChangedNothing`]; `Err` holds what sending
    /// it said); else what the try showed.
    async fn try_or_let_by(&mut self, rest: &[u8], asked_before: u64) -> Result<Tried, Next> {
        let tried = self.try_write(rest, asked_before).await;
        let claims_held = lock(&self.shared).up == Some(NetFault::HoldFirstTouch);
        let changes = match tried {
            Tried::ChangesNothing => false,
            Tried::Claims => claims_held,
            _ => true,
        };
        if changes {
            return Ok(tried);
        }
        lock(&self.shared).reports.push(Report {
            at: Instant::now(),
            path: self.shared.path.clone(),
            seen: Seen::WriteChangedNothing,
        });
        Err(self.relay(rest).await)
    }

    /// A write came to the gate: it waits there, with everything after it, and the one who
    /// watches is told its ticket.
    fn stop_at_gate(&mut self, bytes: Vec<u8>, commits: bool) -> Next {
        let now = Instant::now();
        let mut state = lock(&self.shared);
        state.gate_tickets += 1;
        let ticket = state.gate_tickets;
        state.reports.push(Report {
            at: now,
            path: self.shared.path.clone(),
            seen: Seen::WriteGated { ticket },
        });
        self.gated = Some(Gated {
            ticket,
            bytes,
            since: now,
            commits,
        });
        Next::Go
    }

    /// Returns once `gated` is let in, the gate is taken away, the proxy stops, or the write
    /// waited [`GATE_PATIENCE`]. Cancel-safe: it only waits.
    async fn wait_at_gate(&self, gated: &Gated, changed: &mut watch::Receiver<u64>) {
        let give_up = gated.since + GATE_PATIENCE;
        loop {
            changed.borrow_and_update();
            {
                let state = lock(&self.shared);
                if state.gate_opened >= gated.ticket || !state.gate {
                    return;
                }
            }
            if self.shared.stopping.load(Ordering::SeqCst) {
                return;
            }
            tokio::select! {
                changed = changed.changed() => if changed.is_err() { return },
                () = tokio::time::sleep_until(give_up.into()) => return,
            }
        }
    }

    /// A write let in at the gate meets the path's fault now: caught if a fault is aimed
    /// at it by now — or, if they hold its commit too, a fault aimed at the commit — else
    /// sent on (a later write in the same bytes is not stopped again).
    async fn through_gate(&mut self, bytes: Vec<u8>, commits: bool) -> Next {
        let (write_aimed, commit_aimed) = {
            let state = lock(&self.shared);
            (state.write_aimed(), state.commit_aimed())
        };
        if write_aimed || (commit_aimed && commits) {
            return self.hold_write(bytes, false).await;
        }
        self.relay(&bytes).await
    }

    /// Holds a write that was aimed at, and what comes after it: the aim is spent (a hold
    /// becomes a plain [`NetFault::Hold`], lifted with the fault), and reported — as a held
    /// write ([`Seen::WriteHeld`]) when `bytes` begin with the write, even under a fault
    /// aimed at the commit (a write outside a block, or sent with its `COMMIT`: the write
    /// and its commit wait together, and the write had not run); as a held commit
    /// ([`Seen::CommitHeld`]) when the write ran before, and the `COMMIT` alone waits.
    async fn hold_write(&mut self, bytes: Vec<u8>, commit_alone: bool) -> Next {
        let now = Instant::now();
        let held = {
            let mut state = lock(&self.shared);
            let fault = state.up;
            let due = match fault {
                Some(NetFault::DelayWrite { ms } | NetFault::DelayCommit { ms }) => {
                    state.up = None;
                    Some(now + Duration::from_millis(ms))
                }
                Some(NetFault::HoldWrite | NetFault::HoldFirstTouch | NetFault::HoldCommit) => {
                    state.up = Some(NetFault::Hold);
                    Some(now)
                }
                // Lifted since it was looked at: the write goes as any bytes would.
                _ => None,
            };
            if due.is_some() {
                let path = self.shared.path.clone();
                let session = (self.conversation.as_ref()).and_then(|c| c.backend().0);
                let seen = if commit_alone && fault.is_some_and(NetFault::aims_at_a_commit) {
                    Seen::CommitHeld {
                        session,
                        request: self.caught_request,
                    }
                } else {
                    let tried = self.tried.take();
                    let tried = tried.unwrap_or_else(|| Tried::Untried("not tried".into()));
                    let request = self.caught_request;
                    Seen::WriteHeld {
                        tried,
                        session,
                        request,
                    }
                };
                state.reports.push(Report {
                    at: now,
                    path,
                    seen,
                });
            }
            due.map(|due| (due, state.heals[side(Direction::Up)]))
        };
        let Some((due, healed)) = held else {
            return self.relay(&bytes).await;
        };
        self.queued += bytes.len();
        self.queue.push_back(Queued {
            due,
            chunk: bytes,
            marked: Some(now),
            healed,
        });
        Next::Go
    }

    /// Tries the write caught, with what came in its bytes, in the client's session and
    /// rolls it back ([`dry_run`]), once every request before it was answered.
    async fn try_write(&mut self, held: &[u8], asked_before: u64) -> Tried {
        let untried = |why: &str| Tried::Untried(why.to_string());
        let (Some(conversation), Some(probe)) = (&self.conversation, self.shared.trying.get())
        else {
            return untried("the proxy does not read this connection");
        };
        let conversation = Arc::clone(conversation);
        if let Some(why) = pg::why_not_try(held) {
            return untried(why);
        }
        if !self.queue.is_empty() {
            return untried("bytes sent before it still wait in the proxy");
        }
        let Some(status) = conversation.idle(asked_before).await else {
            return untried("the requests sent before it were not answered within a second");
        };
        if status == b'E' {
            return untried("the client's transaction had failed already");
        }
        let result = conversation.listen(status);
        let bytes = dry_run::around(probe, status, held);
        if self.to.write_all(&bytes).await.is_err() {
            return untried("the server's side of the connection closed");
        }
        match tokio::time::timeout(dry_run::PATIENCE, result).await {
            Ok(Ok(tried)) => tried,
            _ => {
                // The answers may still come, and the client must never read them.
                lock(&self.shared).cut(self.link);
                untried("the try was not answered in time: the connection was cut")
            }
        }
    }

    /// The client closed: the start of a message it never finished goes on, as it came.
    async fn flush_unjudged(&mut self) -> Next {
        if self.unjudged.is_empty() {
            return Next::Go;
        }
        let rest = std::mem::take(&mut self.unjudged);
        self.relay(&rest).await
    }

    /// Sends bytes on their way according to the direction's fault.
    async fn relay(&mut self, chunk: &[u8]) -> Next {
        // The no-fault path: nothing queued ahead, the proxy quiet: no lock taken at all.
        if self.queue.is_empty() && self.shared.quiet.load(Ordering::SeqCst) {
            return self.write_now(chunk).await;
        }
        match self.decide(chunk) {
            Way::Now => self.write_now(chunk).await,
            Way::Queue(queued) => {
                self.queued += queued.chunk.len();
                self.queue.push_back(queued);
                Next::Go
            }
            Way::Swallow => Next::Go,
            Way::Cut => Next::Stop,
        }
    }

    /// What the direction's fault makes of a chunk that just came in.
    fn decide(&mut self, chunk: &[u8]) -> Way {
        let now = Instant::now();
        let mut state = lock(&self.shared);
        let fault = state.fault(self.direction);
        if self.direction == Direction::Down && state.drop_reply_on.contains(&self.link) {
            state.drop_reply_on.retain(|&link| link != self.link);
            let bytes = chunk.len();
            state.reports.push(Report {
                at: now,
                path: self.shared.path.clone(),
                seen: Seen::ReplyDropped { bytes },
            });
            state.cut(self.link);
            return Way::Cut;
        }
        let due = match fault {
            // A write or a commit aimed at is caught in `came`: other bytes go on time,
            // behind any queued before them.
            None
            | Some(
                NetFault::DelayWrite { .. }
                | NetFault::HoldWrite
                | NetFault::HoldFirstTouch
                | NetFault::DelayCommit { .. }
                | NetFault::HoldCommit,
            ) => {
                if self.queue.is_empty() {
                    return Way::Now;
                }
                now
            }
            Some(NetFault::Delay { ms, jitter_ms }) => {
                let extra = if jitter_ms == 0 {
                    0
                } else {
                    state.jitter ^= state.jitter << 13;
                    state.jitter ^= state.jitter >> 7;
                    state.jitter ^= state.jitter << 17;
                    state.jitter % (jitter_ms + 1)
                };
                now + Duration::from_millis(ms + extra)
            }
            Some(NetFault::DelayNext { ms }) => {
                state.set_fault(self.direction, None);
                now + Duration::from_millis(ms)
            }
            Some(NetFault::DropReply) => {
                state.up = None;
                state.drop_reply_on.push(self.link);
                state.reports.push(Report {
                    at: now,
                    path: self.shared.path.clone(),
                    seen: Seen::RequestForwarded { bytes: chunk.len() },
                });
                now
            }
            Some(NetFault::BlackHole) => return Way::Swallow,
            Some(NetFault::Reset) => {
                state.cut(self.link);
                return Way::Cut;
            }
            // Held chunks wait in the queue until the hold is lifted.
            Some(NetFault::Hold) => now,
        };
        Way::Queue(Queued {
            due,
            chunk: chunk.to_vec(),
            marked: matches!(fault, Some(NetFault::DelayNext { .. })).then_some(now),
            healed: state.heals[side(self.direction)],
        })
    }

    async fn write_now(&mut self, chunk: &[u8]) -> Next {
        match self.to.write_all(chunk).await {
            Ok(()) => Next::Go,
            Err(_) => Next::Stop,
        }
    }
}

/// Returns once the first queued chunk may go: its time has come and its direction is not
/// held, or the direction was healed since it was queued. Cancel-safe: it only waits.
async fn front_ready(
    shared: &Shared,
    direction: Direction,
    queue: &VecDeque<Queued>,
    changed: &mut watch::Receiver<u64>,
) {
    let Some(front) = queue.front() else {
        return;
    };
    loop {
        changed.borrow_and_update();
        let (held, flushed) = {
            let state = lock(shared);
            (
                state.fault(direction) == Some(NetFault::Hold),
                state.heals[side(direction)] > front.healed,
            )
        };
        if flushed || (!held && Instant::now() >= front.due) {
            return;
        }
        if held {
            if changed.changed().await.is_err() {
                return std::future::pending().await;
            }
        } else {
            tokio::select! {
                _ = changed.changed() => {}
                () = tokio::time::sleep_until(front.due.into()) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::sync::Condvar;

    /// An upstream that answers every chunk with the same bytes and counts what it got.
    struct Echo {
        addr: SocketAddr,
        received: Arc<Mutex<Vec<u8>>>,
    }

    impl Echo {
        fn start() -> Echo {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            let received = Arc::new(Mutex::new(Vec::new()));
            let log = Arc::clone(&received);
            thread::spawn(move || {
                for stream in listener.incoming() {
                    let Ok(mut stream) = stream else { return };
                    let log = Arc::clone(&log);
                    thread::spawn(move || {
                        let mut buffer = [0u8; 4096];
                        while let Ok(n) = stream.read(&mut buffer) {
                            if n == 0 {
                                return;
                            }
                            log.lock().unwrap().extend_from_slice(&buffer[..n]);
                            if stream.write_all(&buffer[..n]).is_err() {
                                return;
                            }
                        }
                    });
                }
            });
            Echo { addr, received }
        }

        fn got(&self) -> Vec<u8> {
            self.received.lock().unwrap().clone()
        }
    }

    fn client(proxy: &Proxy) -> TcpStream {
        let stream = TcpStream::connect(proxy.addr()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        stream
    }

    fn ask(stream: &mut TcpStream, message: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(message)?;
        let mut answer = vec![0u8; message.len()];
        stream.read_exact(&mut answer)?;
        Ok(answer)
    }

    /// What the server sees as a connection's client port is one of the proxy's server
    /// ports: how a Postgres session is told to be a client's (`pg_stat_activity`).
    #[test]
    fn its_server_ports_are_the_ports_the_server_sees() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let upstream = listener.local_addr().unwrap();
        let (seen, peer) = std::sync::mpsc::channel();
        thread::spawn(move || {
            let (stream, from) = listener.accept().unwrap();
            seen.send(from.port()).unwrap();
            thread::sleep(Duration::from_secs(3));
            drop(stream);
        });
        let proxy = Proxy::start("t", upstream).unwrap();
        assert!(proxy.server_ports().is_empty());
        let _stream = client(&proxy);
        let port = peer.recv_timeout(Duration::from_secs(3)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(3);
        while proxy.server_ports().is_empty() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(proxy.server_ports(), vec![port]);
    }

    #[test]
    fn with_no_fault_bytes_go_through_both_ways() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        assert_eq!(ask(&mut stream, b"ping").unwrap(), b"ping");
        assert_eq!(proxy.connections(), 1);
        drop(stream);
        let deadline = Instant::now() + Duration::from_secs(2);
        while proxy.connections() > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(proxy.connections(), 0, "a closed connection is forgotten");
    }

    #[test]
    fn a_delay_makes_every_request_late_by_at_least_its_time() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        proxy.set(
            Direction::Up,
            NetFault::Delay {
                ms: 150,
                jitter_ms: 0,
            },
        );
        let sent = Instant::now();
        assert_eq!(ask(&mut stream, b"a").unwrap(), b"a");
        assert!(sent.elapsed() >= Duration::from_millis(150));
        proxy.clear(Direction::Up);
        assert_eq!(ask(&mut stream, b"b").unwrap(), b"b");
    }

    #[test]
    fn delay_next_delays_one_message_and_keeps_the_order() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        proxy.set(Direction::Up, NetFault::DelayNext { ms: 200 });
        stream.write_all(b"late").unwrap();
        thread::sleep(Duration::from_millis(50));
        assert!(
            echo.got().is_empty(),
            "the first message is still on its way"
        );
        assert_eq!(
            proxy.fault(Direction::Up),
            None,
            "the fault was spent on it"
        );
        stream.write_all(b"next").unwrap();
        let mut answer = [0u8; 8];
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(
            &answer, b"latenext",
            "TCP order: the next waits behind the late one"
        );
        let reports = proxy.reports();
        assert!(
            matches!(reports[..], [Report { seen: Seen::DelayedSent { late_ms }, .. }] if late_ms >= 200),
            "{reports:?}"
        );
    }

    /// A proxy watching `s.records`, a client through it that has started its session, and
    /// the bytes the server got so far.
    fn watching(echo: &Echo) -> (Proxy, TcpStream, Vec<u8>) {
        let proxy = Proxy::start("t", echo.addr).unwrap();
        proxy.watch_writes("s.records");
        let mut stream = client(&proxy);
        let start = pg::wire::startup();
        assert_eq!(ask(&mut stream, &start).unwrap(), start);
        (proxy, stream, start)
    }

    /// Waits until the server got `bytes` in all, and a little more for anything beyond.
    fn got_only(echo: &Echo, bytes: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(3);
        while echo.got().len() < bytes.len() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        thread::sleep(Duration::from_millis(100));
        assert_eq!(echo.got(), bytes);
    }

    #[test]
    fn a_held_write_waits_for_the_lift_from_its_first_byte_and_what_came_before_goes_on() {
        use pg::wire::query;
        let echo = Echo::start();
        let (proxy, mut stream, mut sent) = watching(&echo);
        proxy.set(Direction::Up, NetFault::HoldWrite);
        let check = query("SELECT 1; SELECT * FROM records FOR UPDATE");
        assert_eq!(ask(&mut stream, &check).unwrap(), check, "a read goes on");
        sent.extend(&check);
        // The write comes a few bytes at a time, then a statement after it.
        let write = query("UPDATE s.records SET value = 2 -- held");
        for piece in write.chunks(3) {
            stream.write_all(piece).unwrap();
            thread::sleep(Duration::from_millis(2));
        }
        stream.write_all(&query("COMMIT")).unwrap();
        got_only(&echo, &sent);
        let seen: Vec<Seen> = proxy.reports().into_iter().map(|r| r.seen).collect();
        assert!(matches!(seen[..], [Seen::WriteHeld { .. }]), "{seen:?}");
        assert_eq!(proxy.fault(Direction::Up), Some(NetFault::Hold));
        proxy.clear(Direction::Up);
        sent.extend(write.iter().chain(&query("COMMIT")));
        got_only(&echo, &sent);
        let seen: Vec<Seen> = proxy.reports().into_iter().map(|r| r.seen).collect();
        assert!(matches!(seen[..], [Seen::DelayedSent { .. }]), "{seen:?}");
    }

    /// A fault aimed at the commit lets the write go and holds the `COMMIT` that ends its
    /// block — not one that ends a block with no write — and, sent in one query with a
    /// write, holds the query.
    #[test]
    fn a_held_commit_waits_for_the_lift_and_the_write_before_it_goes_on() {
        use pg::wire::query;
        let echo = Echo::start();
        let (proxy, mut stream, mut sent) = watching(&echo);
        proxy.set(Direction::Up, NetFault::HoldCommit);
        for sql in [
            "BEGIN",
            "SELECT value FROM s.records",
            "COMMIT",
            "BEGIN",
            "UPDATE s.records SET value = 2",
            "SELECT pg_advisory_unlock(7)",
        ] {
            let message = query(sql);
            assert_eq!(
                ask(&mut stream, &message).unwrap(),
                message,
                "{sql} goes on"
            );
            sent.extend(&message);
        }
        let commit = query("COMMIT");
        stream.write_all(&commit).unwrap();
        got_only(&echo, &sent);
        let seen: Vec<Seen> = proxy.reports().into_iter().map(|r| r.seen).collect();
        assert!(matches!(seen[..], [Seen::CommitHeld { .. }]), "{seen:?}");
        assert_eq!(proxy.fault(Direction::Up), Some(NetFault::Hold));
        proxy.clear(Direction::Up);
        sent.extend(&commit);
        got_only(&echo, &sent);
        let mut answer = vec![0u8; commit.len()];
        stream.read_exact(&mut answer).unwrap();
        // In one query with its write and the unlock: the whole query waits, reported as a
        // held write (the write had not run: it waits with its commit).
        proxy.set(Direction::Up, NetFault::DelayCommit { ms: 300 });
        let batch =
            query("BEGIN; UPDATE s.records SET value = 3; SELECT pg_advisory_unlock(7); COMMIT");
        assert_eq!(ask(&mut stream, &batch).unwrap(), batch);
        let seen: Vec<Seen> = proxy.reports().into_iter().map(|r| r.seen).collect();
        assert!(
            matches!(
                seen[..],
                [
                    Seen::DelayedSent { .. },
                    Seen::WriteHeld { .. },
                    Seen::DelayedSent { .. }
                ]
            ),
            "{seen:?}"
        );
    }

    /// The gate: a write waits (reads before it go on) until it is let in; a fault aimed
    /// meanwhile catches it as it goes through; a write nobody lets in goes on by itself.
    #[test]
    fn a_write_at_the_gate_waits_to_be_let_in_and_meets_the_fault_aimed_meanwhile() {
        use pg::wire::query;
        let echo = Echo::start();
        let (proxy, mut stream, mut sent) = watching(&echo);
        proxy.gate_writes();
        let read = query("SELECT 1");
        assert_eq!(ask(&mut stream, &read).unwrap(), read, "a read goes on");
        sent.extend(&read);
        let write = query("UPDATE s.records SET value = 2");
        stream.write_all(&write).unwrap();
        got_only(&echo, &sent);
        let seen: Vec<Seen> = proxy.reports().into_iter().map(|r| r.seen).collect();
        assert_eq!(seen, vec![Seen::WriteGated { ticket: 1 }]);
        // Aimed at while it waits: let in, it is held by the aim, not sent.
        proxy.set(Direction::Up, NetFault::HoldWrite);
        proxy.open_gate(1);
        got_only(&echo, &sent);
        let seen: Vec<Seen> = proxy.reports().into_iter().map(|r| r.seen).collect();
        assert!(matches!(seen[..], [Seen::WriteHeld { .. }]), "{seen:?}");
        proxy.clear(Direction::Up);
        sent.extend(&write);
        got_only(&echo, &sent);
        let _ = proxy.reports();
        // Nobody aims nor lets the next one in: it goes on after the gate's patience.
        let second = query("UPDATE s.records SET value = 3");
        let came = Instant::now();
        stream.write_all(&second).unwrap();
        sent.extend(&second);
        let deadline = came + GATE_PATIENCE + Duration::from_secs(3);
        while echo.got().len() < sent.len() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(echo.got(), sent);
        assert!(
            came.elapsed() >= GATE_PATIENCE,
            "it waited at the gate first"
        );
        let seen: Vec<Seen> = proxy.reports().into_iter().map(|r| r.seen).collect();
        assert_eq!(seen, vec![Seen::WriteGated { ticket: 2 }]);
    }

    #[test]
    fn a_delayed_write_is_late_and_a_select_sent_before_it_is_not_held_in_its_place() {
        use pg::wire::query;
        let echo = Echo::start();
        let (proxy, mut stream, _) = watching(&echo);
        proxy.set(Direction::Up, NetFault::DelayWrite { ms: 300 });
        let select = query("SELECT 1");
        assert_eq!(ask(&mut stream, &select).unwrap(), select, "on its way");
        assert!(proxy.reports().is_empty(), "nothing caught yet");
        let write = query("update \"records\" set value = 2");
        assert_eq!(
            ask(&mut stream, &write).unwrap(),
            write,
            "late, then through"
        );
        let seen: Vec<Seen> = proxy.reports().into_iter().map(|r| r.seen).collect();
        assert!(
            matches!(seen[..], [Seen::WriteHeld { .. }, Seen::DelayedSent { late_ms }] if late_ms >= 300),
            "{seen:?}"
        );
        assert_eq!(proxy.fault(Direction::Up), None, "spent on the write");
    }

    #[test]
    fn a_statement_prepared_before_the_aim_is_held_where_it_is_bound() {
        use pg::wire::{bind, execute, parse, sync};
        let echo = Echo::start();
        let (proxy, mut stream, mut sent) = watching(&echo);
        let prepare = [parse("s1", "UPDATE records SET value = $1"), sync()].concat();
        assert_eq!(ask(&mut stream, &prepare).unwrap(), prepare);
        sent.extend(&prepare);
        proxy.set(Direction::Up, NetFault::HoldWrite);
        let read = [parse("", "SELECT 1"), bind("", ""), execute("")].concat();
        let write = [bind("", "s1"), execute(""), sync()].concat();
        stream.write_all(&[read.clone(), write].concat()).unwrap();
        sent.extend(&read);
        got_only(&echo, &sent);
        assert_eq!(proxy.fault(Direction::Up), Some(NetFault::Hold));
    }

    #[test]
    fn a_proxy_not_told_the_table_lets_every_write_through() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        proxy.set(Direction::Up, NetFault::HoldWrite);
        let bytes = [
            pg::wire::startup(),
            pg::wire::query("UPDATE records SET value = 1"),
        ];
        let bytes = bytes.concat();
        assert_eq!(ask(&mut stream, &bytes).unwrap(), bytes);
        assert!(proxy.reports().is_empty());
    }

    #[test]
    fn healing_a_delay_sends_what_is_already_waiting_at_once() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        proxy.set(
            Direction::Up,
            NetFault::Delay {
                ms: 60_000,
                jitter_ms: 0,
            },
        );
        stream.write_all(b"late").unwrap();
        thread::sleep(Duration::from_millis(50));
        assert!(echo.got().is_empty(), "waiting out its delay");
        proxy.clear(Direction::Up);
        let mut answer = [0u8; 4];
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"late", "sent when healed, not a minute later");
    }

    #[test]
    fn a_hold_queues_until_lifted_then_delivers_in_order() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        proxy.set(Direction::Up, NetFault::Hold);
        stream.write_all(b"one").unwrap();
        stream.write_all(b"two").unwrap();
        thread::sleep(Duration::from_millis(100));
        assert!(echo.got().is_empty(), "held");
        proxy.clear(Direction::Up);
        let mut answer = [0u8; 6];
        stream.read_exact(&mut answer).unwrap();
        assert_eq!(&answer, b"onetwo");
    }

    #[test]
    fn a_black_hole_swallows_requests_and_the_client_hears_nothing() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        stream
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        proxy.set(Direction::Up, NetFault::BlackHole);
        let err = ask(&mut stream, b"lost").unwrap_err();
        assert!(
            matches!(
                err.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "{err:?}"
        );
        assert!(echo.got().is_empty());
    }

    #[test]
    fn a_reset_cuts_live_connections_and_refuses_new_ones() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        assert_eq!(ask(&mut stream, b"x").unwrap(), b"x");
        proxy.set(Direction::Up, NetFault::Reset);
        assert!(
            ask(&mut stream, b"y").is_err(),
            "the live connection is cut"
        );
        // A new one is cut too: reset as it is accepted, which may reach the client while
        // it is still connecting (on loopback the reset can beat `connect`'s return).
        let cut = match TcpStream::connect(proxy.addr()) {
            Err(_) => true,
            Ok(mut again) => {
                let _ = again.set_read_timeout(Some(Duration::from_secs(3)));
                ask(&mut again, b"z").is_err()
            }
        };
        assert!(cut, "a new one is cut too");
        proxy.clear(Direction::Up);
        let mut healed = client(&proxy);
        assert_eq!(ask(&mut healed, b"ok").unwrap(), b"ok");
    }

    #[test]
    fn a_dropped_reply_was_applied_by_the_server_and_never_reaches_the_client() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        proxy.set(Direction::Up, NetFault::DropReply);
        assert!(ask(&mut stream, b"SET").is_err(), "no answer, then a reset");
        assert_eq!(echo.got(), b"SET", "the server got the request");
        let seen: Vec<Seen> = proxy.reports().into_iter().map(|r| r.seen).collect();
        assert_eq!(
            seen,
            vec![
                Seen::RequestForwarded { bytes: 3 },
                Seen::ReplyDropped { bytes: 3 }
            ]
        );
        let mut again = client(&proxy);
        assert_eq!(
            ask(&mut again, b"GET").unwrap(),
            b"GET",
            "only one reply is lost"
        );
    }

    /// An upstream that echoes at once, except a message starting with `w`, whose echo
    /// waits until `release` is called.
    fn gated_echo() -> (SocketAddr, Arc<(Mutex<bool>, Condvar)>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let shared = Arc::clone(&gate);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let gate = Arc::clone(&shared);
                thread::spawn(move || {
                    let mut buffer = [0u8; 4096];
                    while let Ok(n) = stream.read(&mut buffer) {
                        if n == 0 {
                            return;
                        }
                        if buffer[0] == b'w' {
                            let (open, wake) = &*gate;
                            let mut open = open.lock().unwrap();
                            while !*open {
                                open = wake.wait(open).unwrap();
                            }
                        }
                        if stream.write_all(&buffer[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        (addr, gate)
    }

    #[test]
    fn a_dropped_reply_is_the_answer_on_the_connection_that_asked_not_the_next_on_the_proxy() {
        let (upstream, gate) = gated_echo();
        let proxy = Proxy::start("t", upstream).unwrap();
        let mut asker = client(&proxy);
        let mut other = client(&proxy);
        assert_eq!(ask(&mut other, b"hi").unwrap(), b"hi");
        proxy.set(Direction::Up, NetFault::DropReply);
        // The asker's request goes up; its answer waits in the server.
        asker.write_all(b"wait").unwrap();
        let deadline = Instant::now() + Duration::from_secs(3);
        while proxy.fault(Direction::Up).is_some() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(proxy.fault(Direction::Up), None, "the request went up");
        // Another client's answer comes first: it is not the one to lose.
        assert_eq!(ask(&mut other, b"ok").unwrap(), b"ok", "not this reply");
        let (open, wake) = &*gate;
        *open.lock().unwrap() = true;
        wake.notify_all();
        let mut answer = [0u8; 4];
        assert!(
            asker.read_exact(&mut answer).is_err(),
            "the asker's is lost"
        );
        assert_eq!(ask(&mut other, b"on").unwrap(), b"on", "and only that one");
    }

    fn tasks(proxy: &Proxy) -> usize {
        proxy.shared.tasks.load(Ordering::SeqCst)
    }

    #[test]
    fn the_tasks_of_closed_connections_end() {
        let echo = Echo::start();
        let proxy = Proxy::start("t", echo.addr).unwrap();
        for _ in 0..5 {
            let mut stream = client(&proxy);
            assert_eq!(ask(&mut stream, b"x").unwrap(), b"x");
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while tasks(&proxy) > 0 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(tasks(&proxy), 0, "every closed connection's tasks ended");
        let mut stream = client(&proxy);
        assert_eq!(ask(&mut stream, b"y").unwrap(), b"y");
        assert_eq!(tasks(&proxy), 2, "the live connection's two");
    }

    /// A proxy in front of a server that reads and never answers, and that server's side.
    fn silent_server() -> (Proxy, TcpStream, TcpStream) {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = Proxy::start("t", server.local_addr().unwrap()).unwrap();
        let client = client(&proxy);
        let (accepted, _) = server.accept().unwrap();
        accepted
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        (proxy, client, accepted)
    }

    #[test]
    fn a_cut_mid_request_resets_both_sides_with_half_a_request_delivered() {
        let (proxy, mut client, mut server) = silent_server();
        // Half a request: the server has it and waits for the rest.
        client.write_all(b"*3\r\n$3\r\nSET").unwrap();
        let mut buffer = [0u8; 64];
        let n = server.read(&mut buffer).unwrap();
        assert_eq!(&buffer[..n], b"*3\r\n$3\r\nSET");
        proxy.set(Direction::Up, NetFault::Reset);
        assert!(
            matches!(server.read(&mut buffer), Ok(0) | Err(_)),
            "the server's side is cut"
        );
        let rest = client.write_all(b"\r\n$1\r\nk\r\n$1\r\nv\r\n");
        let answer = client.read(&mut buffer);
        assert!(
            rest.is_err() || matches!(answer, Ok(0) | Err(_)),
            "the client's side is cut: {answer:?}"
        );
    }

    #[test]
    fn a_hold_released_after_the_client_gave_up_still_delivers_its_request() {
        let (proxy, mut client, mut server) = silent_server();
        proxy.set(Direction::Up, NetFault::Hold);
        client.write_all(b"late").unwrap();
        // The client gives up waiting and closes its connection.
        client
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut buffer = [0u8; 16];
        assert!(client.read(&mut buffer).is_err(), "no answer in time");
        drop(client);
        server
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        assert!(server.read(&mut buffer).is_err(), "still held");
        proxy.clear(Direction::Up);
        server
            .set_read_timeout(Some(Duration::from_secs(3)))
            .unwrap();
        let n = server.read(&mut buffer).unwrap();
        assert_eq!(
            &buffer[..n],
            b"late",
            "giving up did not recall the request: it lands once the hold lifts"
        );
        assert_eq!(server.read(&mut buffer).unwrap(), 0, "then the close");
    }

    /// Writes a repeating pattern without blocking until the socket stays full for a
    /// second (or `most` bytes went), and returns how many went.
    fn write_until_held(stream: &mut TcpStream, most: usize) -> usize {
        stream.set_nonblocking(true).unwrap();
        let chunk: Vec<u8> = (0..64 * 1024).map(|n| (n % 251) as u8).collect();
        let (mut sent, mut stalls) = (0, 0);
        while sent < most && stalls < 20 {
            match stream.write(&chunk[sent % chunk.len()..]) {
                Ok(n) => {
                    sent += n;
                    stalls = 0;
                }
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                    stalls += 1;
                    thread::sleep(Duration::from_millis(50));
                }
                Err(err) => panic!("{err}"),
            }
        }
        stream.set_nonblocking(false).unwrap();
        sent
    }

    #[test]
    fn a_hold_queues_a_bounded_amount_and_the_fast_sender_is_held_by_tcp_then_all_arrives() {
        let (proxy, mut client, mut server) = silent_server();
        proxy.set(Direction::Up, NetFault::Hold);
        let most = 256 * 1024 * 1024;
        let sent = write_until_held(&mut client, most);
        // The proxy's queue (1 MiB), plus what the kernel buffers on the client's socket
        // and the proxy's (a few MiB each at most on Linux): far below what was offered.
        assert!(
            sent < 64 * 1024 * 1024,
            "the sender was never held: {sent} bytes taken in"
        );
        let mut buffer = [0u8; 64];
        server
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        assert!(server.read(&mut buffer).is_err(), "still held");
        proxy.clear(Direction::Up);
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut got = vec![0u8; sent];
        server.read_exact(&mut got).unwrap();
        assert!(
            got.iter()
                .enumerate()
                .all(|(n, &b)| b == ((n % (64 * 1024)) % 251) as u8),
            "every byte the sender got in arrives, in order, once the hold lifts"
        );
    }

    #[test]
    fn stopping_mid_fault_ends_every_thread_and_connection() {
        let echo = Echo::start();
        let mut proxy = Proxy::start("t", echo.addr).unwrap();
        let mut stream = client(&proxy);
        proxy.set(Direction::Up, NetFault::Hold);
        stream.write_all(b"held").unwrap();
        let stopped = Instant::now();
        proxy.stop();
        assert!(stopped.elapsed() < Duration::from_secs(2));
        assert!(proxy.threads.is_empty(), "its threads were joined");
        assert_eq!(tasks(&proxy), 0, "its runtime dropped every task");
        let mut buffer = [0u8; 4];
        assert!(matches!(stream.read(&mut buffer), Ok(0) | Err(_)), "closed");
        assert!(TcpStream::connect_timeout(&proxy.addr(), Duration::from_millis(200)).is_err());
    }

    #[test]
    fn past_its_limit_a_connection_is_reset_and_a_closed_one_makes_room() {
        let echo = Echo::start();
        let proxy = Proxy::start("limit", echo.addr).unwrap();
        proxy.limit_connections(2);
        let mut first = client(&proxy);
        let mut second = client(&proxy);
        assert_eq!(ask(&mut first, b"1").unwrap(), b"1");
        assert_eq!(ask(&mut second, b"2").unwrap(), b"2");
        let mut third = client(&proxy);
        assert!(
            !matches!(ask(&mut third, b"3"), Ok(answer) if answer == b"3"),
            "a third connection was relayed"
        );
        drop(first);
        let deadline = Instant::now() + Duration::from_secs(10);
        let served = loop {
            let mut next = client(&proxy);
            if matches!(ask(&mut next, b"4"), Ok(answer) if answer == b"4") {
                break true;
            }
            if Instant::now() > deadline {
                break false;
            }
            thread::sleep(Duration::from_millis(20));
        };
        assert!(served, "a closed connection made room for another");
    }

    #[test]
    fn a_failed_accept_waits_longer_each_time_up_to_a_second() {
        let mut wait = Duration::ZERO;
        let mut waits = Vec::new();
        for _ in 0..10 {
            wait = accept_backoff(wait);
            waits.push(wait);
        }
        assert_eq!(waits[0], Duration::from_millis(10));
        assert_eq!(waits[1], Duration::from_millis(20));
        assert_eq!(*waits.last().unwrap(), LONGEST_ACCEPT_BACKOFF);
        let emfile = std::io::Error::from_raw_os_error(nix::errno::Errno::EMFILE as i32);
        assert!(accept_error_passes(&emfile));
        let bad = std::io::Error::from_raw_os_error(nix::errno::Errno::EBADF as i32);
        assert!(!accept_error_passes(&bad));
    }
}
