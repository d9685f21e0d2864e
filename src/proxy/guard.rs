//! The room's guard: the one process that listens on a room's address, in front of the
//! room's Postgres and each seat's Redis, which listen on loopback only.
//!
//! ```text
//!  attendee ──▶ guard (room address) ──▶ Postgres, a seat's Redis (127.0.0.1)
//!               │ per source address: at most 8 logins at once, 256 unproven in all
//!               │ 5 s from accept to login; past it, the connection is closed
//!               └ proof of a login: read in the server's replies, never the client's
//! ```
//!
//! Why it exists: a server counts a connection that has not logged in yet against its
//! connection limit, as it does a logged-in one. Anyone who reaches the room's address, no
//! password needed, could open a few hundred connections, send nothing (or half a startup
//! packet) and hold them: Postgres keeps each until `authentication_timeout` (a minute by
//! default), Redis forever, and every seat and the instructor were refused. The guard
//! counts, by source address, the connections that have not yet *proven* a login, and
//! gives each a short time to prove one:
//!
//! - a connection from an address that has [`UNPROVEN_PER_ADDRESS`] unproven already is
//!   closed as soon as it is accepted;
//! - the others wait for a turn: at most [`LOGINS_PER_ADDRESS`] from one address, and
//!   [`LOGINS_PER_SERVER`] in all, reach the server at once. A waiting one holds a socket
//!   in the guard and nothing of the server's;
//! - from its accept, a connection has [`LOGIN_DEADLINE`] to wait for its turn and log in:
//!   logged in by then, or closed;
//! - logged in, it is relayed as a plain TCP connection for as long as both ends keep it,
//!   and counts against nothing of the guard's (the servers' own limits hold: a seat's
//!   Postgres role's, a seat's Redis's `maxclients`).
//!
//! A login is read from the server's side, which a client cannot write: Postgres's
//! `AuthenticationOk` (see [`PostgresReplies`]), Redis's `+OK` to `AUTH` or the map a
//! `HELLO … AUTH` answers with (see [`RedisReplies`]). For Postgres the guard also reads the
//! client's startup packet itself before the server sees anything, bounded as Postgres
//! bounds it, and answers a request for encryption with Postgres's own "no": a connection
//! that sends nothing never costs Postgres a process.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Handle;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::pg::{CANCEL_REQUEST, GSSENC_REQUEST, SSL_REQUEST};

/// How long a connection has to log in, from the moment the guard accepts it: its wait for
/// a turn (see [`LOGINS_PER_ADDRESS`]) and its login. A lab's client logs in within
/// milliseconds (Postgres's SCRAM, Redis's `AUTH`), and a lab's burst of 36 connections
/// from one address takes its turns eight at a time: five seconds leave a loaded machine
/// plenty, and make a connection that never logs in cost its address for five seconds,
/// not Postgres's minute or Redis's forever.
pub const LOGIN_DEADLINE: Duration = Duration::from_secs(5);

/// How many connections from one source address may be logging in at once, the server's
/// side open. Eight keeps a lab's burst quick (each login takes milliseconds), and a flood
/// from one address holds eight of the server's slots at most.
pub const LOGINS_PER_ADDRESS: usize = 8;

/// How many connections from one source address may be unproven at once, waiting for a
/// turn or logging in; the next is closed as it is accepted. A lab opens 36 at once at
/// most; 256 leave room for several attendees behind one address (a NAT, or the test
/// suite's loopback), and bound what one address costs the guard: a socket each.
pub const UNPROVEN_PER_ADDRESS: usize = 256;

/// How many connections may be logging in at once on one server, from every address: what
/// Postgres's `max_connections` keeps for logins on top of the seats' limits and the
/// instructor's (see [`crate::servers::room_pg_connections`]). A flood from one address
/// takes [`LOGINS_PER_ADDRESS`] of them; it takes eight addresses to fill them (with 32,
/// ten flooding addresses kept a seat's login waiting 4.8 s of its 5). Each costs
/// Postgres a slot's shared memory, a few hundred kB in all.
pub const LOGINS_PER_SERVER: usize = 64;

/// How many unproven connections the guard holds in all, from every address: its sockets
/// must stay well within its file descriptors (raised to the hard limit at start, 20,000
/// on a common machine), with the logged-in connections it relays (two each).
pub const UNPROVEN_IN_ALL: usize = 4096;

/// Postgres's own bound on a startup packet (`MAX_STARTUP_PACKET_LENGTH`): a longer claim
/// is a lie, and the connection is closed before the guard waits for the bytes it claims.
const LONGEST_STARTUP: usize = 10_000;

/// How many requests for encryption may come before the startup packet: a GSSAPI one then
/// an SSL one is what libpq sends at most.
const MOST_ENCRYPTION_REQUESTS: usize = 2;

/// The process name the guard takes (`comm`), by which `lockslab down` finds it.
pub const PROCESS_NAME: &str = "lockslab-guard";

/// The protocol a door speaks, which says what proves a login.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Postgres,
    Redis,
}

impl Protocol {
    pub fn word(self) -> &'static str {
        match self {
            Protocol::Postgres => "postgres",
            Protocol::Redis => "redis",
        }
    }

    fn from_word(word: &str) -> Option<Protocol> {
        match word {
            "postgres" => Some(Protocol::Postgres),
            "redis" => Some(Protocol::Redis),
            _ => None,
        }
    }
}

/// One door of the guard: a listening socket on the room's address (inherited from
/// `lockslab up`, which bound it) and the server behind it.
pub struct Door {
    pub protocol: Protocol,
    pub listener: std::net::TcpListener,
    pub server: SocketAddr,
}

impl Door {
    /// The command-line word that hands a door to the guard's process: `PROTOCOL:FD:SERVER`,
    /// the listening socket passed as an inherited file descriptor.
    pub fn argument(protocol: Protocol, fd: i32, server: SocketAddr) -> String {
        format!("{}:{fd}:{server}", protocol.word())
    }

    /// Takes back a door from [`Door::argument`].
    ///
    /// # Safety
    ///
    /// The descriptor must be a listening TCP socket this process owns and nothing else uses.
    pub unsafe fn from_argument(word: &str) -> Result<Door> {
        use std::os::fd::FromRawFd;
        let mut parts = word.splitn(3, ':');
        let (Some(protocol), Some(fd), Some(server)) = (parts.next(), parts.next(), parts.next())
        else {
            bail!("a door is PROTOCOL:FD:SERVER, not {word}");
        };
        let protocol = Protocol::from_word(protocol)
            .with_context(|| format!("no protocol {protocol} in door {word}"))?;
        let fd: i32 = fd.parse().with_context(|| format!("door {word}"))?;
        let server = server.parse().with_context(|| format!("door {word}"))?;
        // SAFETY: the caller vouches for the descriptor.
        let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
        listener.set_nonblocking(true)?;
        Ok(Door {
            protocol,
            listener,
            server,
        })
    }
}

/// The counts the guard keeps, for every door at once: per source address, what it has
/// unproven and its turns.
#[derive(Default)]
struct Ledger {
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    addresses: HashMap<IpAddr, Address>,
    /// Unproven connections from every address.
    in_all: usize,
}

struct Address {
    unproven: usize,
    turns: Arc<Semaphore>,
}

/// One connection not yet logged in, counted against its address and the guard's total
/// until it is dropped (logged in, or closed).
struct Unproven {
    ledger: Arc<Ledger>,
    from: IpAddr,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Counts a new connection from `from`, with its address's turns; None when its address
    /// or the guard has all the unproven connections it may.
    fn admit(self: &Arc<Self>, from: IpAddr) -> Option<(Unproven, Arc<Semaphore>)> {
        let mut counts = self.lock();
        if counts.in_all >= UNPROVEN_IN_ALL {
            return None;
        }
        let address = counts.addresses.entry(from).or_insert_with(|| Address {
            unproven: 0,
            turns: Arc::new(Semaphore::new(LOGINS_PER_ADDRESS)),
        });
        if address.unproven >= UNPROVEN_PER_ADDRESS {
            return None;
        }
        address.unproven += 1;
        let turns = Arc::clone(&address.turns);
        counts.in_all += 1;
        Some((
            Unproven {
                ledger: Arc::clone(self),
                from,
            },
            turns,
        ))
    }

    /// How many connections from `from` are unproven now.
    #[cfg(test)]
    fn unproven(&self, from: IpAddr) -> usize {
        self.lock().addresses.get(&from).map_or(0, |a| a.unproven)
    }
}

impl Drop for Unproven {
    fn drop(&mut self) {
        let mut counts = self.ledger.lock();
        counts.in_all -= 1;
        if let Some(address) = counts.addresses.get_mut(&self.from) {
            address.unproven -= 1;
            // An address with nothing unproven is forgotten: the map holds at most
            // UNPROVEN_IN_ALL addresses, however many come and go.
            if address.unproven == 0 {
                counts.addresses.remove(&self.from);
            }
        }
    }
}

/// A door as its connections see it.
struct Behind {
    protocol: Protocol,
    server: SocketAddr,
    /// [`LOGINS_PER_SERVER`].
    logins: Arc<Semaphore>,
}

/// Runs the guard until it is killed (`lockslab down` sends SIGTERM).
pub fn run(doors: Vec<Door>) -> Result<()> {
    raise_descriptor_limit();
    let ledger = Arc::new(Ledger::default());
    let mut runtimes = Vec::new();
    for _ in 0..super::event_loops() {
        runtimes.push(
            tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
                .context("starting the guard's event loop")?,
        );
    }
    let loops: Arc<Vec<Handle>> = Arc::new(runtimes.iter().map(|r| r.handle().clone()).collect());
    let mut runtimes = runtimes.into_iter();
    let first = runtimes.next().context("the guard has no event loop")?;
    // The other loops only run the connections handed to them.
    for runtime in runtimes {
        std::thread::Builder::new()
            .name("guard".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))?;
    }
    first.block_on(async move {
        let mut accepting = Vec::new();
        for door in doors {
            let behind = Arc::new(Behind {
                protocol: door.protocol,
                server: door.server,
                logins: Arc::new(Semaphore::new(LOGINS_PER_SERVER)),
            });
            let listener = tokio::net::TcpListener::from_std(door.listener)?;
            accepting.push(tokio::spawn(accept_loop(
                listener,
                behind,
                Arc::clone(&ledger),
                Arc::clone(&loops),
            )));
        }
        for task in accepting {
            let _ = task.await;
        }
        anyhow::Ok(())
    })
}

/// The guard's file descriptors, raised to the hard limit: it holds a socket for each
/// connection it waits on, two for each it relays.
fn raise_descriptor_limit() {
    let mut limit = nix::libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit write and read the struct given, nothing else.
    unsafe {
        if nix::libc::getrlimit(nix::libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            nix::libc::setrlimit(nix::libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// Names this process [`PROCESS_NAME`], for `lockslab down` to find.
pub fn take_process_name() {
    let name = std::ffi::CString::new(PROCESS_NAME).expect("no NUL in the name");
    // SAFETY: PR_SET_NAME reads a NUL-ended string of at most 16 bytes.
    unsafe {
        nix::libc::prctl(
            nix::libc::PR_SET_NAME,
            name.as_ptr() as nix::libc::c_ulong,
            0,
            0,
            0,
        );
    }
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    behind: Arc<Behind>,
    ledger: Arc<Ledger>,
    loops: Arc<Vec<Handle>>,
) {
    let mut next = 0;
    let mut backoff = Duration::ZERO;
    loop {
        let (client, from) = match listener.accept().await {
            Ok(accepted) => {
                backoff = Duration::ZERO;
                accepted
            }
            Err(err) if super::accept_error_passes(&err) => {
                // Out of file descriptors, most often: the connections open now must close
                // first.
                backoff = super::accept_backoff(backoff);
                tokio::time::sleep(backoff).await;
                continue;
            }
            Err(_) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some((unproven, turns)) = ledger.admit(from.ip()) else {
            // Closed at once, with a reset: nothing lingers in the guard or the kernel.
            let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
            continue;
        };
        let Ok(client) = client.into_std() else {
            continue;
        };
        next = (next + 1) % loops.len();
        loops[next].spawn(guard_one(client, Arc::clone(&behind), unproven, turns));
    }
}

/// One connection: its turn, its login within the deadline, then a plain relay.
async fn guard_one(
    client: std::net::TcpStream,
    behind: Arc<Behind>,
    unproven: Unproven,
    turns: Arc<Semaphore>,
) {
    let Ok(mut client) = TcpStream::from_std(client) else {
        return;
    };
    let login = tokio::time::timeout(LOGIN_DEADLINE, async {
        let turn = take_turn(turns, &behind.logins).await?;
        let server = log_in(&mut client, &behind).await?;
        Some((turn, server))
    })
    .await;
    let Ok(Some((turn, mut server))) = login else {
        // Past the deadline, or refused: both sides close as this returns.
        return;
    };
    drop(turn);
    drop(unproven);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
}

/// A turn of the connection's address, then one of the server's: in this order, so that
/// an address waiting for its own turns holds none of the server's.
async fn take_turn(
    address: Arc<Semaphore>,
    server: &Arc<Semaphore>,
) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
    let mine = address.acquire_owned().await.ok()?;
    let servers = Arc::clone(server).acquire_owned().await.ok()?;
    Some((mine, servers))
}

/// Relays a connection until the server's replies prove a login; returns the server's
/// side then. None when either side closes first.
async fn log_in(client: &mut TcpStream, behind: &Behind) -> Option<TcpStream> {
    let startup = match behind.protocol {
        Protocol::Postgres => read_startup(client).await?,
        Protocol::Redis => Vec::new(),
    };
    let mut server = TcpStream::connect(behind.server).await.ok()?;
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    server.write_all(&startup).await.ok()?;
    let mut replies = Replies::new(behind.protocol);
    let mut up = vec![0u8; 16 * 1024];
    let mut down = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            read = client.read(&mut up) => {
                let n = read.ok().filter(|n| *n > 0)?;
                server.write_all(&up[..n]).await.ok()?;
            }
            read = server.read(&mut down) => {
                let n = read.ok().filter(|n| *n > 0)?;
                let proven = replies.read(&down[..n]);
                client.write_all(&down[..n]).await.ok()?;
                if proven {
                    return Some(server);
                }
            }
        }
    }
}

/// Reads a Postgres client's startup packet (or cancel request) whole, and returns it to
/// be sent on; answers each request for encryption with `N`, as a Postgres without TLS does.
/// None for a packet no Postgres would take: a length under 8 or over Postgres's own bound,
/// or more requests for encryption than a client makes.
async fn read_startup(client: &mut TcpStream) -> Option<Vec<u8>> {
    for _ in 0..=MOST_ENCRYPTION_REQUESTS {
        let mut head = [0u8; 8];
        client.read_exact(&mut head).await.ok()?;
        let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        if !(8..=LONGEST_STARTUP).contains(&length) {
            return None;
        }
        if length == 8 && (code == SSL_REQUEST || code == GSSENC_REQUEST) {
            client.write_all(b"N").await.ok()?;
            continue;
        }
        if code == CANCEL_REQUEST && length != 16 {
            return None;
        }
        let mut packet = head.to_vec();
        packet.resize(length, 0);
        client.read_exact(&mut packet[8..]).await.ok()?;
        return Some(packet);
    }
    None
}

/// What proves a login, read in the server's replies as they pass.
enum Replies {
    Postgres(PostgresReplies),
    Redis(RedisReplies),
}

impl Replies {
    fn new(protocol: Protocol) -> Replies {
        match protocol {
            Protocol::Postgres => Replies::Postgres(PostgresReplies::default()),
            Protocol::Redis => Replies::Redis(RedisReplies::default()),
        }
    }

    /// Reads the next bytes; true once a login is proven.
    fn read(&mut self, bytes: &[u8]) -> bool {
        match self {
            Replies::Postgres(replies) => replies.read(bytes),
            Replies::Redis(replies) => replies.read(bytes),
        }
    }
}

/// Postgres's messages to a client logging in: `[type][length][body]`, the length counting
/// itself. The login is proven by `AuthenticationOk`: type `R`, length 8, a body of four
/// zero bytes — sent only once the password checked out. Whatever the client sent, the
/// server wrote these bytes, so a client cannot fake one; and since the guard answers the
/// encryption requests itself, the server's first byte is always a message's type.
#[derive(Default)]
pub struct PostgresReplies {
    /// The header of the message being read, as far as it came.
    head: Vec<u8>,
    /// Bytes of the current message's body still to pass.
    body_left: usize,
    /// The body of an `R` of length 8, as far as it came.
    auth: Vec<u8>,
    proven: bool,
}

impl PostgresReplies {
    /// Reads the next bytes; true once `AuthenticationOk` came.
    pub fn read(&mut self, mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() && !self.proven {
            if self.head.len() < 5 {
                let take = (5 - self.head.len()).min(bytes.len());
                self.head.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.head.len() == 5 {
                    let length = u32::from_be_bytes([
                        self.head[1],
                        self.head[2],
                        self.head[3],
                        self.head[4],
                    ]);
                    // A length under 4 is no message; nothing after it can be read as one.
                    self.body_left = (length as usize).saturating_sub(4);
                    if length < 4 {
                        self.body_left = usize::MAX;
                    }
                    self.auth.clear();
                }
                continue;
            }
            let take = self.body_left.min(bytes.len());
            if self.head[0] == b'R' && self.head[1..5] == 8u32.to_be_bytes() {
                self.auth.extend_from_slice(&bytes[..take]);
            }
            self.body_left -= take;
            bytes = &bytes[take..];
            if self.body_left == 0 {
                if self.head[0] == b'R' && self.auth == [0, 0, 0, 0] {
                    self.proven = true;
                }
                self.head.clear();
            }
        }
        self.proven
    }
}

/// Redis's replies to a client logging in. A server that demands a password answers an
/// unauthenticated client's commands with errors (`-NOAUTH`, `-WRONGPASS`), and only four
/// commands otherwise: `AUTH` (`+OK`), `HELLO … AUTH` (a map, `%` in RESP3, `*` in RESP2),
/// `QUIT` (`+OK`, then it closes) and `RESET` (`+RESET`, still unauthenticated). So the
/// login is proven by a `+OK` or by a reply that is neither an error nor a simple string;
/// a client cannot fake either, as the server wrote them, and an error's text (which may
/// quote the client) is skipped to its end, never read as a reply.
#[derive(Default)]
pub struct RedisReplies {
    /// The simple string or error being read: its first bytes, kept to tell `+OK`.
    line: Vec<u8>,
    /// Inside a simple string or an error, until its `\n`.
    in_line: bool,
    proven: bool,
}

impl RedisReplies {
    /// Reads the next bytes; true once a login is proven.
    pub fn read(&mut self, bytes: &[u8]) -> bool {
        for &byte in bytes {
            if self.proven {
                break;
            }
            if !self.in_line {
                match byte {
                    b'+' | b'-' => {
                        self.in_line = true;
                        self.line.clear();
                        self.line.push(byte);
                    }
                    _ => self.proven = true,
                }
                continue;
            }
            if byte == b'\n' {
                self.in_line = false;
                if self.line == b"+OK\r" {
                    self.proven = true;
                }
            } else if self.line.len() < 8 {
                self.line.push(byte);
            }
        }
        self.proven
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        super::super::pg::wire::message(kind, body)
    }

    /// Every way of cutting `stream` in two pieces, read piece by piece: whether it proves.
    fn proves_cut_anywhere(stream: &[u8], read: impl Fn(&[&[u8]]) -> bool) -> Vec<bool> {
        (0..=stream.len())
            .map(|cut| read(&[&stream[..cut], &stream[cut..]]))
            .collect()
    }

    fn postgres(pieces: &[&[u8]]) -> bool {
        let mut replies = PostgresReplies::default();
        pieces.iter().any(|piece| replies.read(piece))
    }

    fn redis(pieces: &[&[u8]]) -> bool {
        let mut replies = RedisReplies::default();
        pieces.iter().any(|piece| replies.read(piece))
    }

    #[test]
    fn postgres_is_logged_in_at_authentication_ok_cut_anywhere_and_not_before() {
        // SCRAM: SASL (10) with its mechanism, SASLContinue (11), SASLFinal (12), then Ok.
        let before = [
            message(
                b'R',
                &[&10u32.to_be_bytes()[..], b"SCRAM-SHA-256\0\0"].concat(),
            ),
            message(
                b'R',
                &[&11u32.to_be_bytes()[..], b"r=abc,s=def,i=4096"].concat(),
            ),
            message(b'R', &[&12u32.to_be_bytes()[..], b"v=xyz"].concat()),
        ]
        .concat();
        let ok = message(b'R', &0u32.to_be_bytes());
        assert!(!postgres(&[&before]));
        let whole = [before.clone(), ok].concat();
        assert!(proves_cut_anywhere(&whole, postgres).iter().all(|p| *p));
        // Byte by byte, too.
        let mut replies = PostgresReplies::default();
        let proven: Vec<bool> = whole.iter().map(|b| replies.read(&[*b])).collect();
        assert_eq!(proven.iter().position(|p| *p), Some(whole.len() - 1));
    }

    #[test]
    fn a_postgres_error_quoting_the_client_proves_nothing() {
        // The client chose the user name, which the error quotes: bytes shaped like an
        // AuthenticationOk inside it are text in a message's body, not a message.
        let quoted = [
            b"SFATAL\0Mrole \"".as_slice(),
            b"R\0\0\0\x08\0\0\0\0",
            b"\"\0\0",
        ]
        .concat();
        let error = message(b'E', &quoted);
        assert!(proves_cut_anywhere(&error, postgres).iter().all(|p| !*p));
        // A length under 4 leaves nothing readable after it.
        let broken = [b"E\0\0\0\x02".as_slice(), &message(b'R', &[0; 4])].concat();
        assert!(!postgres(&[&broken]));
        // An AuthenticationOk-like type with another length is not one.
        assert!(!postgres(&[&message(b'R', &[0; 8])]));
    }

    #[test]
    fn redis_is_logged_in_at_ok_or_a_hello_map_and_not_by_errors_or_reset() {
        let refused = b"-NOAUTH Authentication required.\r\n-WRONGPASS invalid username-password pair or user is disabled.\r\n+RESET\r\n";
        assert!(!redis(&[refused]));
        for proof in [
            b"+OK\r\n".as_slice(),
            b"%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n",
            b"*14\r\n$6\r\nserver\r\n",
        ] {
            let stream = [refused.as_slice(), proof].concat();
            assert!(proves_cut_anywhere(&stream, redis).iter().all(|p| *p));
        }
        // An error whose text the client chose (an unknown command's name) stays an error:
        // Redis puts no line break in an error's text.
        let quoted = b"-ERR unknown command '+OK *1 %7', with args beginning with: \r\n";
        assert!(!redis(&[quoted]));
        // `+OKAY` is not `+OK`.
        assert!(!redis(&[b"+OKAY\r\n"]));
    }

    #[test]
    fn an_address_past_its_unproven_is_refused_and_forgotten_once_proven() {
        let ledger = Arc::new(Ledger::default());
        let flood: IpAddr = [127, 0, 0, 9].into();
        let other: IpAddr = [127, 0, 0, 1].into();
        let held: Vec<_> = (0..UNPROVEN_PER_ADDRESS)
            .map(|_| ledger.admit(flood).expect("within the limit"))
            .collect();
        assert!(ledger.admit(flood).is_none());
        assert!(ledger.admit(other).is_some(), "another address is let in");
        drop(held);
        assert_eq!(ledger.unproven(flood), 0);
        let counts = ledger.lock();
        assert!(counts.addresses.is_empty(), "every address forgotten");
        assert_eq!(counts.in_all, 0);
    }
}
