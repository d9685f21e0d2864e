//! A door into a host: a loopback port in lockslab's own network whose every connection
//! is carried on into one host and made from there.
//!
//! lockslab cannot reach a host's addresses (see the module doc of [`super`]), yet a lab
//! plays clients that live on a host — client A on the etcd leader's host — with its own
//! client libraries, which connect by URL. A door gives such a client a URL: each
//! connection to the door's port is answered by a connection that [`Hosts::connect_from`]
//! makes inside the host, and bytes are copied both ways. So the client's traffic leaves
//! from the host, crosses the host's links, and a partition cuts it exactly as it would cut
//! a process running there. (A client talking to a server on its own host goes over that
//! host's loopback: no partition cuts it, as none cuts a process from its own machine.)
//!
//! ```text
//!  lockslab: A's etcd client ──▶ 127.0.0.1:port (the door) ══ host m1 ══▶ 10.77.0.1:2379
//! ```

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{Context, Result};

use super::Hosts;

/// How long the connection into the host may take before the door gives it up.
const CONNECT_PATIENCE: Duration = Duration::from_secs(3);

/// A door open into one host, to one address. Closed (every connection through it too)
/// when dropped.
pub struct Door {
    addr: SocketAddr,
    closing: Arc<AtomicBool>,
    /// Both ends of every connection carried, to shut them when the door closes.
    carried: Arc<Mutex<Vec<TcpStream>>>,
    accepting: Option<JoinHandle<()>>,
}

impl Door {
    /// `http://127.0.0.1:<port>`: what a client that speaks HTTP (etcd's gRPC) connects to.
    pub fn http_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its loopback address, for a client that builds its own URL.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Hosts {
    /// Opens a door into `host` towards `to` (see the module doc).
    pub fn door(self: &Arc<Hosts>, host: &str, to: SocketAddr) -> Result<Door> {
        self.open_door(host, to, false)
    }

    /// [`Hosts::door`], keeping one connection into the host made ahead, handed to the next
    /// client that connects (and made again for the one after): each connection into a
    /// host takes a helper process, which on a busy machine outlasts a client that gives a
    /// server 50 ms to answer (Redlock's per-master timeout) — it would never get through.
    /// The connection made ahead crosses the link as any other: a partition hangs it.
    pub fn door_ready(self: &Arc<Hosts>, host: &str, to: SocketAddr) -> Result<Door> {
        self.open_door(host, to, true)
    }

    fn open_door(self: &Arc<Hosts>, host: &str, to: SocketAddr, ahead: bool) -> Result<Door> {
        self.addr(host)?;
        let listener = TcpListener::bind("127.0.0.1:0").context("opening a door into a host")?;
        let addr = listener.local_addr()?;
        let closing = Arc::new(AtomicBool::new(false));
        let carried = Arc::new(Mutex::new(Vec::new()));
        let made_ahead: Arc<Mutex<Option<TcpStream>>> = Arc::default();
        let (hosts, host) = (Arc::clone(self), host.to_string());
        let (stop, open) = (Arc::clone(&closing), Arc::clone(&carried));
        let make_ahead = {
            let (hosts, host, spare) = (Arc::clone(&hosts), host.clone(), Arc::clone(&made_ahead));
            move || {
                let (hosts, host, spare) = (Arc::clone(&hosts), host.clone(), Arc::clone(&spare));
                thread::spawn(move || {
                    if let Ok(server) = hosts.connect_from(&host, to, CONNECT_PATIENCE) {
                        *spare.lock().unwrap_or_else(|p| p.into_inner()) = Some(server);
                    }
                });
            }
        };
        if ahead {
            make_ahead();
        }
        let accepting = thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                let ready = made_ahead.lock().unwrap_or_else(|p| p.into_inner()).take();
                if ahead {
                    make_ahead();
                }
                // Each connection is made into the host on a thread of its own: one that
                // hangs (its peer is cut off) holds up no other.
                let (hosts, host, open) = (Arc::clone(&hosts), host.clone(), Arc::clone(&open));
                thread::spawn(move || {
                    // A connection that cannot be made into the host is closed: the client
                    // sees it end, as it would see its own connect fail on the host.
                    let server = ready.map_or_else(
                        || hosts.connect_from(&host, to, CONNECT_PATIENCE).ok(),
                        Some,
                    );
                    if let Some(server) = server {
                        carry(client, server, &open);
                    }
                });
            }
        });
        Ok(Door {
            addr,
            closing,
            carried,
            accepting: Some(accepting),
        })
    }
}

/// Copies bytes both ways between `a` and `b`, each way on a thread of its own, until
/// either side closes.
fn carry(a: TcpStream, b: TcpStream, open: &Mutex<Vec<TcpStream>>) {
    let _ = a.set_nodelay(true);
    let _ = b.set_nodelay(true);
    let ends = [a.try_clone(), b.try_clone(), a.try_clone(), b.try_clone()];
    let [Ok(a2), Ok(b2), Ok(a3), Ok(b3)] = ends else {
        return;
    };
    open.lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .extend([a3, b3]);
    thread::spawn(move || copy(a, b));
    thread::spawn(move || copy(b2, a2));
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buffer = [0u8; 16 * 1024];
    loop {
        match from.read(&mut buffer) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

/// A door the other way: a port at one host's address whose every connection is carried
/// on to a server in lockslab's own network. A server lockslab runs as it always does
/// (chaos's Redis, its etcd, the store) is so reached by clients on hosts at an address of
/// a host of its own, across that host's links: a partition cuts them from it as from a
/// server started in the host. (lockslab itself still reaches the server directly.)
///
/// ```text
///  client on host A ══ A–redis link ══▶ 10.77.0.4:6379 (the relay, host redis) ──▶ 127.0.0.1:port
/// ```
pub struct Relay {
    /// A second handle on the listening socket: shut down, it wakes the accepting thread.
    listening: TcpListener,
    closing: Arc<AtomicBool>,
    carried: Arc<Mutex<Vec<TcpStream>>>,
    accepting: Option<JoinHandle<()>>,
}

impl Hosts {
    /// Opens a relay at `host`'s address on `port` to the server at `to` (see [`Relay`]).
    pub fn relay(&self, host: &str, port: u16, to: SocketAddr) -> Result<Relay> {
        let listener = self.listen_in(host, port)?;
        let listening = listener.try_clone()?;
        let closing = Arc::new(AtomicBool::new(false));
        let carried = Arc::new(Mutex::new(Vec::new()));
        let (stop, open) = (Arc::clone(&closing), Arc::clone(&carried));
        let accepting = thread::spawn(move || {
            for client in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                if let Ok(server) = TcpStream::connect_timeout(&to, CONNECT_PATIENCE) {
                    carry(client, server, &open);
                }
            }
        });
        Ok(Relay {
            listening,
            closing,
            carried,
            accepting: Some(accepting),
        })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        // A listening socket shut down makes accept fail at once (Linux): the thread sees
        // it is closing.
        let fd = std::os::fd::AsRawFd::as_raw_fd(&self.listening);
        let _ = nix::sys::socket::shutdown(fd, nix::sys::socket::Shutdown::Both);
        if let Some(thread) = self.accepting.take() {
            let _ = thread.join();
        }
        close_all(&self.carried);
    }
}

/// Shuts every connection a door or relay carried.
fn close_all(carried: &Mutex<Vec<TcpStream>>) {
    let mut carried = carried.lock().unwrap_or_else(|p| p.into_inner());
    for stream in carried.drain(..) {
        let _ = stream.shutdown(Shutdown::Both);
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees it is closing.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
        if let Some(thread) = self.accepting.take() {
            let _ = thread.join();
        }
        close_all(&self.carried);
    }
}
