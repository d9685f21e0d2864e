//! Hosts: machines of lockslab's own on one laptop, so that a partition can cut one
//! server off from another — with no Docker, no root and no firewall.
//!
//! A host is a Linux network namespace: its own interfaces, addresses and routes. Every
//! host lives in one user namespace lockslab makes for the run, which is what lets an
//! ordinary user create them (the kernel gives the namespace's creator every network
//! capability *inside* it, and none outside):
//!
//! ```text
//!  lockslab (your user, your network)
//!   ├─ holder: sleep, in a new user namespace (and a network of its own, unused)
//!   ├─ host m1: sleep, in that user namespace and a new network namespace ── 10.77.0.1
//!   ├─ host m2: …                                                          ── 10.77.0.2
//!   └─ host m3: …                                                          ── 10.77.0.3
//!
//!        m1 ──to2────to1── m2        one veth link per pair of hosts; each host's
//!         │                 │        address sits on its loopback, and a route per peer
//!        to3               to3       sends that peer's traffic over their own link only
//!         │                 │
//!        to1 ──── m3 ─────to2
//! ```
//!
//! **A partition** cuts pairs: each host of a cut pair routes its peer's address into its
//! own loopback, where the packet arrives addressed to someone else and is dropped without
//! a word (a host does not forward). Both ways, nobody is told: no reset, no
//! "unreachable" — an established connection hangs, and a new one times out. **Heal**
//! points the routes back over the link, and TCP's own retransmissions resume the same
//! connections: nothing restarts. Two ways that look simpler are not silent: a link set
//! down takes its host's routes with it ("Network is unreachable" at once), and a queue
//! that drops every packet (`tc … pfifo limit 0`) drops it *in the sender's kernel*,
//! which TCP counts as a local failure and gives the connection up after ~10 s, where a
//! real partition leaves it waiting for many minutes.
//!
//! **Who runs where.** A process started with [`Hosts::start_in`] joins a host's network
//! (servers, workers, challenge clients): its traffic to another host crosses their link,
//! and a partition cuts it. lockslab itself stays in your network and cannot reach a host's
//! addresses at all; it talks to a server in a host over the server's Unix socket, a file
//! both see, which no partition touches — the lab's own control line, as the control
//! node of a test cluster has a network of its own. So a lab still probes, seeds and
//! grades while its servers are cut off from each other.
//!
//! **Nothing outlives lockslab.** The holder, every host's anchor and every process
//! started in a host get SIGKILL from the kernel when lockslab dies, however it dies
//! (parent-death signal), and are registered for Ctrl-C's cleanup; a namespace with no
//! process left in it is gone, and its links with it. Addresses are lockslab's own, inside
//! namespaces nobody else is in: nothing is ever sent outside them.

mod door;
mod etcd;
mod redis;
mod sides;

pub use door::{Door, Relay};
pub use etcd::{HostedEtcd, HostedMember, MemberStatus as HostedMemberStatus};
pub use redis::{HostedRedis, PORT as HOSTED_REDIS_PORT, SENTINEL_PORT, Watch};
pub use sides::Sides;

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::io::{IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sched::CloneFlags;
use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use crate::procs::{self, StopPlan};

/// The addresses hosts get: the `n`th host (from 1) is `10.77.0.n`. Private, and only
/// inside lockslab's own namespaces, where nothing else lives.
const FIRST_ADDRESS: [u8; 3] = [10, 77, 0];

/// One host: a network namespace, held open by a process that only sleeps in it.
struct Host {
    name: String,
    addr: Ipv4Addr,
    anchor: Child,
    /// The host's network namespace, for processes to join.
    net: OwnedFd,
}

/// The run's hosts, joined pairwise, and which pairs are cut now.
pub struct Hosts {
    tools: Tools,
    holder: Child,
    /// The user namespace every host lives in: joined first, so that joining a host's
    /// network is allowed without root.
    user: OwnedFd,
    hosts: Vec<Host>,
    /// Pairs of hosts (by place, smaller first) whose link drops everything now. Behind a
    /// lock, as `started`: a play holds the hosts shared while it cuts and heals.
    cut: Mutex<BTreeSet<(usize, usize)>>,
    /// Processes started in a host, killed when the hosts go.
    started: Mutex<Vec<i32>>,
}

impl Hosts {
    /// Makes one host per name, every two joined by a link of their own, each host able
    /// to reach every other at its address. Fails, saying why, where the kernel allows no
    /// user namespaces (or `ip` is missing).
    ///
    /// Make them on a thread that lives as long as they do (the main thread): the kernel
    /// sends the parent-death signal when the *thread* that spawned a process ends.
    pub fn new(names: &[&str]) -> Result<Hosts> {
        if names.len() > 250 {
            bail!("at most 250 hosts ({} asked)", names.len());
        }
        for (i, name) in names.iter().enumerate() {
            if name.is_empty() || names[..i].contains(name) {
                bail!("host names are distinct and not empty: {names:?}");
            }
        }
        let tools = Tools::find()?;
        let holder = spawn_holder()?;
        let user = open_namespace(holder.id() as i32, "user")?;
        let mut hosts = Hosts {
            tools,
            holder,
            user,
            hosts: Vec::new(),
            cut: Mutex::default(),
            started: Mutex::default(),
        };
        for (i, name) in names.iter().enumerate() {
            let anchor = hosts.spawn_anchor()?;
            let net = open_namespace(anchor.id() as i32, "net")?;
            let [a, b, c] = FIRST_ADDRESS;
            hosts.hosts.push(Host {
                name: name.to_string(),
                addr: Ipv4Addr::new(a, b, c, i as u8 + 1),
                anchor,
                net,
            });
        }
        hosts.wire()?;
        Ok(hosts)
    }

    /// Can this machine make hosts? None if so, else why not (for `lockslab doctor`, and
    /// for the one line a part that needs them prints when it skips).
    pub fn unavailable() -> Option<String> {
        match Hosts::new(&["a", "b"]) {
            Ok(_) => None,
            Err(err) => Some(format!("{err:#}")),
        }
    }

    pub fn names(&self) -> Vec<&str> {
        self.hosts.iter().map(|h| h.name.as_str()).collect()
    }

    /// The address `host` is reached at from the other hosts.
    pub fn addr(&self, host: &str) -> Result<Ipv4Addr> {
        Ok(self.hosts[self.index(host)?].addr)
    }

    /// Makes `command` run in `host`'s network when it is spawned (after it the caller
    /// may still add its own setup; spawn it through [`procs`] so it dies with lockslab).
    pub fn place(&self, command: &mut Command, host: &str) -> Result<()> {
        let net = self.hosts[self.index(host)?].net.as_raw_fd();
        let user = self.user.as_raw_fd();
        // SAFETY: between fork and exec only plain system calls run (setns), on
        // descriptors this process holds open until the spawn returns; the error is a raw
        // errno, nothing allocated.
        unsafe {
            command.pre_exec(move || {
                join(user, CloneFlags::CLONE_NEWUSER)?;
                join(net, CloneFlags::CLONE_NEWNET)
            });
        }
        Ok(())
    }

    /// Starts `command` in `host`: tied to lockslab (parent-death signal, registered for
    /// cleanup), and killed when these hosts go.
    pub fn start_in(&self, host: &str, command: &mut Command) -> Result<Child> {
        self.place(command, host)?;
        // The parent-death signal is set after joining (tie_to_parent's step comes later):
        // it survives the join, but set last there is no doubt about it.
        let child = procs::spawn_registered(command, StopPlan::kill())
            .with_context(|| format!("starting {:?} in host {host}", command.get_program()))?;
        lock(&self.started).push(child.id() as i32);
        Ok(child)
    }

    /// A TCP connection to `to`, made from inside `host`: it crosses the host's links and
    /// a partition cuts it, though it is lockslab's own socket. (A socket belongs to the
    /// network it was made in, wherever it goes after: a short-lived helper joins the host,
    /// connects, and hands the socket back over a Unix socket pair.) A connection that
    /// takes longer than `patience` fails as timed out.
    pub fn connect_from(
        &self,
        host: &str,
        to: SocketAddr,
        patience: Duration,
    ) -> Result<TcpStream> {
        let socket = self.socket_in(host, &format!("connecting to {to}"), move || {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            // Only an errno crosses back from here: a timeout is given one.
            socket
                .connect_timeout(&to.into(), patience)
                .map_err(|err| match err.kind() {
                    std::io::ErrorKind::TimedOut => {
                        std::io::Error::from_raw_os_error(nix::errno::Errno::ETIMEDOUT as i32)
                    }
                    _ => err,
                })?;
            Ok(socket)
        })?;
        Ok(socket.into())
    }

    /// A socket listening at `host`'s address on `port`, made inside `host` (as
    /// [`Hosts::connect_from`] makes its connections): the other hosts reach it across
    /// their links, and lockslab accepts on it.
    pub fn listen_in(&self, host: &str, port: u16) -> Result<TcpListener> {
        let at = SocketAddr::new(self.addr(host)?.into(), port);
        let socket = self.socket_in(host, &format!("listening at {at}"), move || {
            let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
            socket.set_reuse_address(true)?;
            socket.bind(&at.into())?;
            socket.listen(128)?;
            Ok(socket)
        })?;
        Ok(socket.into())
    }

    /// A socket `make` makes inside `host`'s network, handed back to lockslab: a helper
    /// process joins the host, makes it, and sends it over a Unix socket pair (`doing`
    /// says what for, in an error).
    fn socket_in(
        &self,
        host: &str,
        doing: &str,
        make: impl Fn() -> std::io::Result<socket2::Socket> + Send + Sync + 'static,
    ) -> Result<socket2::Socket> {
        let (ours, theirs) = UnixStream::pair()?;
        let theirs_fd = theirs.as_raw_fd();
        let mut command = Command::new("true");
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        self.place(&mut command, host)?;
        // SAFETY: after fork, the helper only makes a socket and sends it (system calls;
        // glibc's malloc is usable in a fork's child, for nix's buffer).
        unsafe {
            command.pre_exec(move || {
                let socket = make()?;
                let fds = [socket.as_raw_fd()];
                let rights = [ControlMessage::ScmRights(&fds)];
                let byte = [IoSlice::new(b"s")];
                sendmsg::<()>(theirs_fd, &byte, &rights, MsgFlags::empty(), None)?;
                Ok(())
            });
        }
        let status = command
            .status()
            .with_context(|| format!("{doing} from host {host}"))?;
        drop(theirs);
        if !status.success() {
            bail!("the helper {doing} in host {host} failed ({status})");
        }
        let mut byte = [0u8; 1];
        let mut iov = [IoSliceMut::new(&mut byte)];
        let mut space = nix::cmsg_space!(RawFd);
        let message = recvmsg::<()>(
            ours.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )?;
        for control in message.cmsgs()? {
            if let ControlMessageOwned::ScmRights(fds) = control
                && let Some(&fd) = fds.first()
            {
                // SAFETY: the kernel just gave this process the descriptor; nobody else owns it.
                return Ok(unsafe { socket2::Socket::from_raw_fd(fd) });
            }
        }
        bail!("the helper {doing} in host {host} sent no socket")
    }

    /// Cuts every pair `sides` separates, both ways, silently (pairs cut already stay
    /// cut). Returns the pairs this cut, by name.
    pub fn partition(&self, sides: &Sides) -> Result<Vec<(String, String)>> {
        let pairs = self.pairs_of(sides)?;
        let mut cut = lock(&self.cut);
        let new: Vec<(usize, usize)> = (pairs.into_iter())
            .filter(|pair| !cut.contains(pair))
            .collect();
        self.set_routes(&new, Route::Nowhere)?;
        cut.extend(new.iter().copied());
        Ok(self.named(&new))
    }

    /// Lets the pairs `sides` separates talk again (those cut); returns them, by name.
    pub fn heal_sides(&self, sides: &Sides) -> Result<Vec<(String, String)>> {
        let pairs = self.pairs_of(sides)?;
        self.heal_pairs(|pair| pairs.contains(pair))
    }

    /// Lets every cut pair talk again; returns them, by name.
    pub fn heal(&self) -> Result<Vec<(String, String)>> {
        self.heal_pairs(|_| true)
    }

    fn heal_pairs(
        &self,
        chosen: impl Fn(&(usize, usize)) -> bool,
    ) -> Result<Vec<(String, String)>> {
        let mut cut = lock(&self.cut);
        let healed: Vec<(usize, usize)> = cut.iter().copied().filter(|p| chosen(p)).collect();
        self.set_routes(&healed, Route::OverTheLink)?;
        cut.retain(|pair| !healed.contains(pair));
        Ok(self.named(&healed))
    }

    /// The pairs cut now, by name.
    pub fn cut_pairs(&self) -> Vec<(String, String)> {
        self.named(&lock(&self.cut).iter().copied().collect::<Vec<_>>())
    }

    /// The pairs `sides` would cut, by name (for the history, before they are cut).
    pub fn pairs_named(&self, sides: &Sides) -> Result<Vec<(String, String)>> {
        sides.pairs(&self.names())
    }

    /// Every process that holds these hosts up (the holder, each host's anchor) and every
    /// one started in them: what must be gone once lockslab is.
    pub fn pids(&self) -> Vec<i32> {
        let anchors = self.hosts.iter().map(|h| h.anchor.id() as i32);
        (std::iter::once(self.holder.id() as i32))
            .chain(anchors)
            .chain(lock(&self.started).iter().copied())
            .collect()
    }

    fn index(&self, host: &str) -> Result<usize> {
        match self.hosts.iter().position(|h| h.name == host) {
            Some(place) => Ok(place),
            None => bail!(
                "there is no host '{host}' (the hosts: {})",
                self.names().join(", ")
            ),
        }
    }

    fn pairs_of(&self, sides: &Sides) -> Result<Vec<(usize, usize)>> {
        let names = self.names();
        let pairs = sides.pairs(&names)?;
        let mut places = Vec::new();
        for (a, b) in &pairs {
            let (a, b) = (self.index(a)?, self.index(b)?);
            places.push((a.min(b), a.max(b)));
        }
        Ok(places)
    }

    fn named(&self, pairs: &[(usize, usize)]) -> Vec<(String, String)> {
        (pairs.iter())
            .map(|&(a, b)| (self.hosts[a].name.clone(), self.hosts[b].name.clone()))
            .collect()
    }

    /// A process that sleeps in a new network namespace inside the hosts' user namespace:
    /// the namespace lives as long as it does.
    fn spawn_anchor(&self) -> Result<Child> {
        let user = self.user.as_raw_fd();
        let mut command = sleeper();
        // SAFETY: setns and unshare are plain system calls; see `place`.
        unsafe {
            command.pre_exec(move || {
                join(user, CloneFlags::CLONE_NEWUSER)?;
                nix::sched::unshare(CloneFlags::CLONE_NEWNET).map_err(Into::into)
            });
        }
        procs::spawn_registered(&mut command, StopPlan::kill()).context("making a host")
    }

    /// Brings up every host's loopback with its address, then one link per pair with a
    /// route over it to the peer's address.
    fn wire(&self) -> Result<()> {
        for (i, host) in self.hosts.iter().enumerate() {
            let mut lines = vec![
                "link set lo up".to_string(),
                format!("addr add {}/32 dev lo", host.addr),
            ];
            // Each pair's link is made by its first host, its far end put in the second.
            for (j, peer) in self.hosts.iter().enumerate().skip(i + 1) {
                lines.push(format!(
                    "link add {} type veth peer name {} netns {}",
                    link_name(j),
                    link_name(i),
                    peer.anchor.id()
                ));
            }
            self.run_in(i, &self.tools.ip, &lines)?;
        }
        for (i, host) in self.hosts.iter().enumerate() {
            let mut lines = Vec::new();
            for (j, peer) in self.hosts.iter().enumerate().filter(|(j, _)| *j != i) {
                lines.push(format!("link set {} up", link_name(j)));
                lines.push(Route::OverTheLink.command(host.addr, j, peer.addr));
            }
            self.run_in(i, &self.tools.ip, &lines)?;
        }
        Ok(())
    }

    /// Points each host of each pair at the other the way `route` says.
    fn set_routes(&self, pairs: &[(usize, usize)], route: Route) -> Result<()> {
        for (i, host) in self.hosts.iter().enumerate() {
            let lines: Vec<String> = (pairs.iter())
                .filter_map(|&(a, b)| match (a == i, b == i) {
                    (true, _) => Some(b),
                    (_, true) => Some(a),
                    _ => None,
                })
                .map(|peer| route.command(host.addr, peer, self.hosts[peer].addr))
                .collect();
            if !lines.is_empty() {
                self.run_in(i, &self.tools.ip, &lines)?;
            }
        }
        Ok(())
    }

    /// Runs `tool -batch -` in host `place`, the lines on its standard input.
    fn run_in(&self, place: usize, tool: &Path, lines: &[String]) -> Result<()> {
        let host = &self.hosts[place];
        let mut command = Command::new(tool);
        command
            .args(["-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        self.place(&mut command, &host.name)?;
        let tool = tool.display();
        let mut child = procs::spawn_registered(&mut command, StopPlan::kill())
            .with_context(|| format!("running {tool} in host {}", host.name))?;
        let pid = child.id() as i32;
        let mut stdin = child.stdin.take().expect("piped");
        stdin.write_all(lines.join("\n").as_bytes())?;
        drop(stdin);
        let output = child.wait_with_output()?;
        procs::forget(pid);
        if !output.status.success() {
            bail!(
                "{tool} in host {} refused {:?}: {}",
                host.name,
                lines,
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(())
    }
}

/// How a host sends to one peer: over their link, or nowhere.
#[derive(Clone, Copy)]
enum Route {
    OverTheLink,
    /// Into the host's own loopback: the packet comes back in addressed to someone else,
    /// and a host that does not forward drops it without a word (no ICMP). The sender's
    /// send succeeded, so its TCP waits and retransmits as over a dead network.
    Nowhere,
}

impl Route {
    /// The `ip` line that points `own`'s host at peer number `peer`, at `to`.
    fn command(self, own: Ipv4Addr, peer: usize, to: Ipv4Addr) -> String {
        let via = match self {
            Route::OverTheLink => link_name(peer),
            Route::Nowhere => "lo".to_string(),
        };
        format!("route replace {to}/32 dev {via} src {own}")
    }
}

impl Drop for Hosts {
    /// Kills what was started in the hosts, then the hosts; their links go with them.
    fn drop(&mut self) {
        for pid in lock(&self.started).drain(..) {
            procs::stop(pid, &StopPlan::kill());
        }
        let anchors = self.hosts.iter_mut().map(|h| &mut h.anchor);
        for child in anchors.chain(std::iter::once(&mut self.holder)) {
            let _ = child.kill();
            let _ = child.wait();
            procs::forget(child.id() as i32);
        }
    }
}

/// Host `place`'s end of its link to host `peer` is called `to<peer's place>` in it
/// (`to0`, `to1`…): an interface's name has 15 characters at most, a host's may be longer.
fn link_name(peer: usize) -> String {
    format!("to{peer}")
}

/// iproute2's `ip`, which makes the links and points the routes.
struct Tools {
    ip: PathBuf,
}

impl Tools {
    /// Finds them on PATH or in the system's sbin directories, which a user's PATH on
    /// Debian leaves out though anyone may run them.
    fn find() -> Result<Tools> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let dirs: Vec<PathBuf> = (std::env::split_paths(&path))
            .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
            .collect();
        let find = |name: &str| {
            (dirs.iter().map(|dir| dir.join(name)))
                .find(|candidate| candidate.is_file())
                .with_context(|| {
                    format!(
                        "hosts need `{name}` (Debian: apt-get install iproute2) for their links"
                    )
                })
        };
        Ok(Tools { ip: find("ip")? })
    }
}

/// Kills a process started in a host (SIGKILL), reaps it and forgets it, if it still runs:
/// how a hosted server goes.
fn kill_started(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
        procs::forget(child.id() as i32);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn sleeper() -> Command {
    let mut command = Command::new("sleep");
    command
        .arg("infinity")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

/// The holder: a process in a new user namespace (and a new network namespace, so that
/// it owns one: a user namespace alone may be made but not hold networks for others
/// without it). Its user and group ids are mapped once it runs: yours to root inside, so
/// that `ip` runs there with every network capability — or, as root, every id to
/// itself.
fn spawn_holder() -> Result<Child> {
    let mut command = sleeper();
    // SAFETY: unshare is a plain system call; see `Hosts::place`.
    unsafe {
        command.pre_exec(|| {
            nix::sched::unshare(CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWNET)
                .map_err(Into::into)
        });
    }
    let mut holder = procs::spawn_registered(&mut command, StopPlan::kill()).context(
        "this kernel refused a user namespace (kernel.unprivileged_userns_clone, \
         user.max_user_namespaces, or an AppArmor rule forbids them): no hosts",
    )?;
    if let Err(err) = map_ids(holder.id() as i32) {
        let _ = holder.kill();
        let _ = holder.wait();
        return Err(err);
    }
    Ok(holder)
}

/// Writes the holder's user and group id maps, from outside, as its parent.
fn map_ids(pid: i32) -> Result<()> {
    let proc = format!("/proc/{pid}");
    let write = |file: &str, text: &str| -> Result<()> {
        let path = format!("{proc}/{file}");
        let mut opened = File::options().write(true).open(&path)?;
        opened
            .write_all(text.as_bytes())
            .with_context(|| format!("writing {text:?} to {path}"))
    };
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    if uid == 0 {
        write("uid_map", "0 0 4294967295")?;
        write("gid_map", "0 0 4294967295")
    } else {
        // Without root, a process may map only its own ids, and its group only once it has
        // given up setgroups in the namespace (so it cannot shed a group to gain access).
        write("uid_map", &format!("0 {uid} 1"))?;
        write("setgroups", "deny")?;
        write("gid_map", &format!("0 {gid} 1"))
    }
}

/// A namespace of a process spawned into it (spawn returns once the process has
/// exec'd, so its pre-exec steps, which entered the namespace, are done).
fn open_namespace(pid: i32, kind: &str) -> Result<OwnedFd> {
    let path = format!("/proc/{pid}/ns/{kind}");
    let opened = File::open(&path).with_context(|| format!("opening {path}"))?;
    Ok(opened.into())
}

/// setns on a raw descriptor, its error as an io::Error (inside pre_exec).
fn join(fd: i32, kind: CloneFlags) -> std::io::Result<()> {
    // SAFETY: the descriptor is one of `Hosts`' own, open for as long as a spawn lasts.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    nix::sched::setns(fd, kind).map_err(Into::into)
}
