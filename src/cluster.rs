//! Private clusters for lab 5: a Redis primary with one replica watched by three
//! Sentinels, and a three-member etcd cluster — real ones, started from the binaries on this
//! machine, on free loopback ports.
//!
//! They are owned like [`crate::servers`]'s private servers: one directory per cluster
//! (`lockslab-*` in the temp dir, claimed by an owner lock), every process a registered
//! child that dies with lockslab, everything stopped and deleted when the cluster is
//! dropped, on Ctrl-C, SIGTERM and SIGHUP; and what a SIGKILLed run leaves, the next start
//! of any private server sweeps.
//!
//! Every node demands a password, generated per cluster and handed to the servers in 0600
//! files in a directory only this user can enter (never on a command line): any local user
//! can reach a loopback port. The lab's clients get it inside their URLs, through their
//! script pipe.
//!
//! A cluster is ready only when it could do its job: the replica in sync, every Sentinel
//! knowing the replica and both other Sentinels (they find each other through the
//! primary's hello channel, every 2s), and the etcd members agreeing on a leader.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::fcntl::Flock;
use nix::sys::signal::Signal;

use crate::connect::Backend;
use crate::procs::{self, StopPlan};
use crate::servers::{
    find_binary, free_port, log_tail, new_run_dir, remove_server_dir, write_secret,
};

/// How long a whole cluster may take to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(25);

/// The name the Sentinels know the primary by.
pub const MASTER_NAME: &str = "lockslab";

/// Sentinel's timers, short so that a failover takes about a second: a primary that has not
/// answered for `DOWN_AFTER` (Sentinel's default is 30s) is down for that Sentinel; two Sentinels agreeing make it
/// objectively down, and they elect one of themselves to promote the replica.
pub const DOWN_AFTER: Duration = Duration::from_millis(500);
const FAILOVER_TIMEOUT: Duration = Duration::from_secs(3);

/// etcd's timers: a heartbeat every 50ms; a follower calls an election after its election
/// timeout of silence, which Raft draws at random between 500ms and twice that.
pub const ETCD_HEARTBEAT_MS: u64 = 50;
pub const ETCD_ELECTION_MS: u64 = 500;

/// One directory, claimed for as long as this process lives, deleted on drop and on
/// interrupt (after the processes working in it are stopped).
pub(crate) struct RunDir {
    pub(crate) path: PathBuf,
    _owner: Flock<fs::File>,
}

impl RunDir {
    pub(crate) fn new() -> Result<RunDir> {
        let root = std::env::temp_dir();
        crate::servers::sweep_dead_runs(&root);
        let (path, owner) = new_run_dir(&root)?;
        procs::remove_on_cleanup_with(path.clone(), remove_server_dir);
        Ok(RunDir {
            path,
            _owner: owner,
        })
    }
}

impl RunDir {
    /// The directory (lab 5's etcd on hosts keeps its members' files there).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        remove_server_dir(&self.path);
        procs::forget_dir(&self.path);
    }
}

/// A 0700 directory inside the cluster's (which others may enter, 0711), for the files
/// that hold the password: Sentinel rewrites its configuration file with the mode 0644.
pub(crate) fn private_dir(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let private = dir.join("private");
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .with_context(|| format!("creating {}", private.display()))?;
    Ok(private)
}

fn server_stop_plan() -> StopPlan {
    StopPlan {
        signal: Signal::SIGTERM,
        grace: Duration::from_secs(5),
    }
}

/// Starts one server process in `dir`, logging to `dir/<log>`: a registered child, in its
/// own process group, tied to lockslab's life. Spawned from the calling thread (see
/// [`crate::procs`]: the parent-death signal follows the spawning thread).
fn spawn_in(dir: &Path, log: &str, command: &mut Command) -> Result<i32> {
    let log = fs::File::create(dir.join(log))?;
    command
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let child = procs::spawn_registered(command, server_stop_plan())?;
    Ok(child.id() as i32)
}

fn alive(pid: i32) -> bool {
    procs::process_state(pid).is_some_and(|state| state != 'Z')
}

/// A Redis process of the cluster: the primary, the replica or a Sentinel.
#[derive(Clone, Debug)]
pub struct RedisNode {
    pub role: &'static str,
    pub port: u16,
    /// None once the lab has killed it.
    pub pid: Option<i32>,
    /// The cluster's password, which every node demands (`requirepass`).
    pub password: String,
}

impl RedisNode {
    /// Its URL, with the cluster's password.
    pub fn url(&self) -> String {
        format!("redis://default:{}@127.0.0.1:{}", self.password, self.port)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

/// A short-bounded connection to a node of ours (its URL, password included), for the lab's
/// own questions. Bounded tightly: a frozen or dead node must cost the lab a second, not a
/// minute.
pub fn ask(url: &str) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(url)?;
    let connection = client.get_connection_with_timeout(Duration::from_millis(500))?;
    connection.set_read_timeout(Some(Duration::from_secs(1)))?;
    connection.set_write_timeout(Some(Duration::from_secs(1)))?;
    Ok(connection)
}

/// Closes every replica's link, from the primary's side (`CLIENT KILL TYPE replica`): the
/// number closed. With the replica frozen, what the primary writes from then on lives on
/// the primary only (frozen alone, its kernel would still take the stream into the socket
/// buffer, and the replica would read it from there once thawed).
pub fn cut_replica_links(on_primary: &mut redis::Connection) -> redis::RedisResult<i64> {
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(on_primary)
}

/// What the server itself says it is: `master`, `slave` or `sentinel` (its `ROLE` answer).
pub fn role_of(url: &str) -> Option<String> {
    let mut connection = ask(url).ok()?;
    let reply: Vec<redis::Value> = redis::cmd("ROLE").query(&mut connection).ok()?;
    redis::from_redis_value(reply.into_iter().next()?).ok()
}

/// The address a Sentinel gives for the primary (`SENTINEL get-master-addr-by-name`).
pub fn master_addr_from(sentinel_url: &str, master: &str) -> Option<String> {
    let mut connection = ask(sentinel_url).ok()?;
    let addr: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(master)
        .query(&mut connection)
        .ok()?;
    addr.map(|(host, port)| format!("{host}:{port}"))
}

/// Redis primary + replica + three Sentinels.
pub struct SentinelCluster {
    pub primary: RedisNode,
    pub replica: RedisNode,
    pub sentinels: Vec<RedisNode>,
    /// What every node of it demands, Sentinels included.
    pub password: String,
    started: Instant,
    /// From the first spawn to ready.
    pub started_in: Duration,
    /// Declared last: dropped after the processes are stopped.
    dir: RunDir,
}

/// Starts a cluster, and starts it again on other ports when a member found its port taken.
/// Ports are picked free ([`free_port`]) but bound only when the member starts: another
/// process can take one in between. A failed try's cluster is dropped, which stops its
/// members and deletes its directory.
fn start_on_fresh_ports<C>(start: impl Fn() -> Result<C>) -> Result<C> {
    const TRIES: u32 = 3;
    let mut tries = 0;
    loop {
        tries += 1;
        match start() {
            Err(e) if tries < TRIES && port_was_taken(&e) => {}
            done => return done,
        }
    }
}

/// Did a member exit because its port was taken? Both servers say so in their log, which
/// the start-up error quotes: etcd "bind: address already in use", Redis "Address already in
/// use".
fn port_was_taken(error: &anyhow::Error) -> bool {
    format!("{error:#}")
        .to_lowercase()
        .contains("address already in use")
}

impl SentinelCluster {
    pub fn start() -> Result<SentinelCluster> {
        SentinelCluster::start_with(DOWN_AFTER)
    }

    /// A cluster whose Sentinels call the primary down after `down_after` of silence.
    pub fn start_with(down_after: Duration) -> Result<SentinelCluster> {
        start_on_fresh_ports(|| {
            let mut cluster = SentinelCluster::spawn(down_after)?;
            cluster.wait_until_ready()?;
            Ok(cluster)
        })
    }

    fn spawn(down_after: Duration) -> Result<SentinelCluster> {
        let started = Instant::now();
        let dir = RunDir::new()?;
        let binary = find_binary("redis-server", Backend::Redis)?;
        let password = crate::seed::os_hex(24);
        let private = private_dir(&dir.path)?;
        // The data nodes demand the password and give it to each other (the replica to its
        // primary, and after a failover the other way round).
        let auth_conf = private.join("redis-auth.conf");
        write_secret(
            &auth_conf,
            &format!("requirepass {password}\nmasterauth {password}\n"),
        )?;
        let node = |role| -> Result<RedisNode> {
            Ok(RedisNode {
                role,
                port: free_port()?,
                pid: None,
                password: password.clone(),
            })
        };
        let mut cluster = SentinelCluster {
            primary: node("primary")?,
            replica: node("replica")?,
            sentinels: vec![node("sentinel")?, node("sentinel")?, node("sentinel")?],
            password: password.clone(),
            started,
            started_in: Duration::ZERO,
            dir,
        };
        let data_node =
            |node: &RedisNode, dbfile: &str| data_node(&binary, &auth_conf, node, dbfile);
        let mut primary = data_node(&cluster.primary, "primary.rdb");
        cluster.primary.pid = Some(spawn_in(&cluster.dir.path, "primary.log", &mut primary)?);
        let mut replica = data_node(&cluster.replica, "replica.rdb");
        replica.args([
            "--replicaof",
            "127.0.0.1",
            &cluster.primary.port.to_string(),
        ]);
        cluster.replica.pid = Some(spawn_in(&cluster.dir.path, "replica.log", &mut replica)?);
        // Sentinels learn the replicas from the primary's INFO, asked at once and then only
        // every 10s: they start once the replica is there to be seen.
        cluster.wait_for(|cluster| {
            replication_info(&cluster.replica.url())
                .is_some_and(|info| info.contains("master_link_status:up"))
        })?;
        for index in 0..cluster.sentinels.len() {
            let port = cluster.sentinels[index].port;
            // Sentinel rewrites its configuration file as it learns: one writable file each.
            // `requirepass`: clients must give the password, and this Sentinel gives it to
            // the other Sentinels; `auth-pass`: what it gives the primary and the replica.
            let conf = private.join(format!("sentinel-{port}.conf"));
            write_secret(
                &conf,
                &format!(
                    "port {port}\nbind 127.0.0.1\ndir {dir}\nrequirepass {password}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {primary} 2\n\
                     sentinel auth-pass {MASTER_NAME} {password}\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {down}\n\
                     sentinel failover-timeout {MASTER_NAME} {failover}\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir = cluster.dir.path.display(),
                    primary = cluster.primary.port,
                    down = down_after.as_millis(),
                    failover = FAILOVER_TIMEOUT.as_millis(),
                ),
            )?;
            let mut sentinel = Command::new(&binary);
            sentinel.arg(&conf).arg("--sentinel");
            cluster.sentinels[index].pid = Some(spawn_in(
                &cluster.dir.path,
                &format!("sentinel-{port}.log"),
                &mut sentinel,
            )?);
        }
        Ok(cluster)
    }

    /// After Sentinel promoted the replica: the promoted one is the primary now, and the
    /// old primary (killed) the replica that has yet to come back.
    pub fn promoted(&mut self) {
        std::mem::swap(&mut self.primary, &mut self.replica);
        self.primary.role = "primary";
        self.replica.role = "replica";
    }

    /// Starts the killed replica (the old primary, see [`SentinelCluster::promoted`]) again
    /// on its port, a replica of the primary from its start: it comes back empty (no
    /// persistence) and syncs from the primary. Spawned from the calling thread, whose end
    /// ends it (see [`crate::procs`]).
    pub fn start_replica_again(&mut self) -> Result<()> {
        if self.replica.pid.is_some() {
            bail!(
                "the Redis replica :{} is running already",
                self.replica.port
            );
        }
        let binary = find_binary("redis-server", Backend::Redis)?;
        let auth_conf = self.dir.path.join("private").join("redis-auth.conf");
        let dbfile = format!("node-{}.rdb", self.replica.port);
        let mut command = data_node(&binary, &auth_conf, &self.replica, &dbfile);
        command.args(["--replicaof", "127.0.0.1", &self.primary.port.to_string()]);
        let log = format!("replica-{}.log", self.replica.port);
        self.replica.pid = Some(spawn_in(&self.dir.path, &log, &mut command)?);
        Ok(())
    }

    fn nodes(&self) -> impl Iterator<Item = &RedisNode> {
        [&self.primary, &self.replica]
            .into_iter()
            .chain(self.sentinels.iter())
    }

    fn wait_until_ready(&mut self) -> Result<()> {
        self.wait_for(|cluster| {
            let replica_in_sync = replication_info(&cluster.replica.url())
                .is_some_and(|info| info.contains("master_link_status:up"));
            replica_in_sync
                && cluster.sentinels.iter().all(|s| {
                    sentinel_count(&s.url(), "sentinels") == Some(cluster.sentinels.len() - 1)
                        && sentinel_count(&s.url(), "replicas") == Some(1)
                })
        })?;
        self.started_in = self.started.elapsed();
        Ok(())
    }

    /// Polls `ready` until it holds; fails when a node exits or time runs out.
    fn wait_for(&self, ready: impl Fn(&SentinelCluster) -> bool) -> Result<()> {
        let deadline = self.started + READY_TIMEOUT;
        loop {
            if let Some(dead) = self.nodes().find(|n| n.pid.is_some_and(|pid| !alive(pid))) {
                bail!(
                    "the private Redis {} on port {} exited at start-up; the end of its log: {}",
                    dead.role,
                    dead.port,
                    log_tail(&self.log_of(dead))
                );
            }
            if ready(self) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the private Redis cluster was not ready within {}s (the replica in sync, every \
                     Sentinel knowing the replica and the other Sentinels); overloaded machine?",
                    READY_TIMEOUT.as_secs()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_of(&self, node: &RedisNode) -> PathBuf {
        let name = match node.role {
            "sentinel" => format!("sentinel-{}.log", node.port),
            role => format!("{role}.log"),
        };
        self.dir.path.join(name)
    }

    /// The cluster's directory (deleted when the cluster stops).
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisNode::url).collect()
    }

    /// SIGKILL, as a crash or a power cut would end it: no goodbye to anyone.
    pub fn kill(node: &mut RedisNode) {
        if let Some(pid) = node.pid.take() {
            procs::stop(pid, &StopPlan::kill());
        }
    }

    pub fn freeze(node: &RedisNode) -> Result<()> {
        let pid = node.pid.context("that node is not running")?;
        procs::signal_group(pid, Signal::SIGSTOP)?;
        if !procs::wait_until_stopped(pid, Duration::from_secs(2)) {
            bail!("the Redis {} (pid {pid}) did not stop", node.role);
        }
        Ok(())
    }

    pub fn thaw(node: &RedisNode) -> Result<()> {
        let pid = node.pid.context("that node is not running")?;
        procs::signal_group(pid, Signal::SIGCONT)
    }

    /// Stops every process and deletes the directory.
    pub fn stop(&mut self) {
        let pids: Vec<i32> = [&mut self.primary, &mut self.replica]
            .into_iter()
            .chain(self.sentinels.iter_mut())
            .filter_map(|node| node.pid.take())
            .collect();
        for pid in pids {
            procs::stop(pid, &server_stop_plan());
        }
    }
}

impl Drop for SentinelCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The command that runs a data node (the primary or the replica) of a Sentinel cluster.
fn data_node(binary: &Path, auth_conf: &Path, node: &RedisNode, dbfile: &str) -> Command {
    let mut command = Command::new(binary);
    command
        .arg(auth_conf)
        .args(["--port", &node.port.to_string(), "--bind", "127.0.0.1"])
        // No persistence: what a node knows is in its memory only.
        .args(["--save", "", "--appendonly", "no", "--dbfilename", dbfile])
        // A replica syncs over the socket, without a file on disk.
        .args(["--repl-diskless-sync", "yes"])
        .args(["--repl-diskless-sync-delay", "0"]);
    command
}

/// `INFO replication` of a node, when it answers.
pub fn replication_info(url: &str) -> Option<String> {
    let mut connection = ask(url).ok()?;
    redis::cmd("INFO")
        .arg("replication")
        .query(&mut connection)
        .ok()
}

/// How many healthy peers (`sentinels`) or replicas (`replicas`) a Sentinel knows.
pub fn sentinel_count(url: &str, what: &str) -> Option<usize> {
    let mut connection = ask(url).ok()?;
    let entries: Vec<Vec<String>> = redis::cmd("SENTINEL")
        .arg(what)
        .arg(MASTER_NAME)
        .query(&mut connection)
        .ok()?;
    Some(
        entries
            .iter()
            .filter(|fields| {
                let flags = fields
                    .iter()
                    .position(|f| f == "flags")
                    .and_then(|i| fields.get(i + 1));
                flags.is_some_and(|f| !f.contains("s_down") && !f.contains("disconnected"))
            })
            .count(),
    )
}

/// One member of the etcd cluster.
#[derive(Clone, Debug)]
pub struct EtcdMember {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    /// The cluster's root password: auth is on once the cluster is ready.
    pub password: String,
    /// etcd's id for this member (what `status` names the leader by).
    pub id: u64,
    /// None once the lab has killed it.
    pub pid: Option<i32>,
}

impl EtcdMember {
    /// Its client URL with the root user and password, as [`crate::connect::etcd`] reads it.
    pub fn url(&self) -> String {
        self.client_url
            .replacen("http://", &format!("http://root:{}@", self.password), 1)
    }
}

/// Three etcd members forming one Raft cluster.
pub struct EtcdCluster {
    pub members: Vec<EtcdMember>,
    started: Instant,
    /// From the first spawn to an agreed leader.
    pub started_in: Duration,
    dir: RunDir,
}

/// What one member says of the cluster: its own id, the leader's id and the Raft term.
#[derive(Clone, Copy, Debug)]
pub struct MemberStatus {
    pub member_id: u64,
    pub leader: u64,
    pub raft_term: u64,
}

/// Asks one member for its status, within a second. No password: etcd answers `status` to
/// anyone (it holds no key), and logging in would go through Raft, which stalls while
/// there is no leader.
pub fn etcd_status(client_url: &str) -> Result<MemberStatus> {
    let runtime = crate::connect::etcd_runtime()?;
    runtime.block_on(async {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(500))
            .with_timeout(Duration::from_secs(1));
        let mut client = etcd_client::Client::connect([client_url], Some(options)).await?;
        let status = client.status().await?;
        let member_id = status.header().map(|h| h.member_id()).unwrap_or(0);
        Ok(MemberStatus {
            member_id,
            leader: status.leader(),
            raft_term: status.raft_term(),
        })
    })
}

impl EtcdCluster {
    pub fn start() -> Result<EtcdCluster> {
        start_on_fresh_ports(|| {
            let mut cluster = EtcdCluster::spawn()?;
            cluster.wait_until_ready()?;
            Ok(cluster)
        })
    }

    fn spawn() -> Result<EtcdCluster> {
        let started = Instant::now();
        let dir = RunDir::new()?;
        let binary = find_binary("etcd", Backend::Etcd)?;
        let password = crate::seed::os_hex(24);
        let mut members = Vec::new();
        for name in ["m1", "m2", "m3"] {
            members.push(EtcdMember {
                name: name.to_string(),
                client_url: format!("http://127.0.0.1:{}", free_port()?),
                peer_url: format!("http://127.0.0.1:{}", free_port()?),
                password: password.clone(),
                id: 0,
                pid: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            members,
            started,
            started_in: Duration::ZERO,
            dir,
        };
        for member in &mut cluster.members {
            let mut command = Command::new(&binary);
            command
                .args(["--name", &member.name, "--data-dir"])
                .arg(cluster.dir.path.join(&member.name))
                .args(["--listen-client-urls", &member.client_url])
                .args(["--advertise-client-urls", &member.client_url])
                .args(["--listen-peer-urls", &member.peer_url])
                .args(["--initial-advertise-peer-urls", &member.peer_url])
                .args(["--initial-cluster", &initial_cluster])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "lockslab"])
                .args(["--heartbeat-interval", &ETCD_HEARTBEAT_MS.to_string()])
                .args(["--election-timeout", &ETCD_ELECTION_MS.to_string()])
                // Each client's log-in is checked with bcrypt; cost 4 keeps it to a
                // millisecond. The password is 96 random bits: no cost factor is needed.
                .args(["--bcrypt-cost", "4"]);
            member.pid = Some(spawn_in(
                &cluster.dir.path,
                &format!("{}.log", member.name),
                &mut command,
            )?);
        }
        Ok(cluster)
    }

    fn wait_until_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(dead) = self
                .members
                .iter()
                .find(|m| m.pid.is_some_and(|pid| !alive(pid)))
            {
                bail!(
                    "the private etcd member {} exited at start-up; the end of its log: {}",
                    dead.name,
                    log_tail(&self.dir.path.join(format!("{}.log", dead.name)))
                );
            }
            let statuses: Vec<Option<MemberStatus>> = self
                .members
                .iter()
                .map(|m| etcd_status(&m.client_url).ok())
                .collect();
            let leaders: Vec<u64> = statuses.iter().flatten().map(|s| s.leader).collect();
            if leaders.len() == self.members.len()
                && leaders[0] != 0
                && leaders.iter().all(|l| *l == leaders[0])
            {
                for (member, status) in self.members.iter_mut().zip(statuses) {
                    member.id = status.map(|s| s.member_id).unwrap_or(0);
                }
                self.enable_auth()?;
                self.started_in = self.started.elapsed();
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the private etcd cluster did not agree on a leader within {}s; overloaded machine?",
                    READY_TIMEOUT.as_secs()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Adds the root user with the cluster's password and turns auth on: from then on a
    /// client without it can neither read nor write a key.
    fn enable_auth(&self) -> Result<()> {
        let member = &self.members[0];
        crate::connect::etcd_runtime()?
            .block_on(async {
                let mut client =
                    etcd_client::Client::connect([member.client_url.as_str()], None).await?;
                client
                    .user_add("root", member.password.as_str(), None)
                    .await?;
                // The root role exists from the start in some versions, not in others.
                let _ = client.role_add("root").await;
                client.user_grant_role("root", "root").await?;
                client.auth_enable().await?;
                anyhow::Ok(())
            })
            .context("turning on authentication in the private etcd cluster")
    }

    /// The cluster's directory (deleted when the cluster stops).
    pub fn dir(&self) -> &Path {
        &self.dir.path
    }

    /// The leader, as the first live member that answers says it: (index, status).
    pub fn leader(&self) -> Option<(usize, MemberStatus)> {
        self.members
            .iter()
            .filter(|m| m.pid.is_some())
            .find_map(|m| etcd_status(&m.client_url).ok())
            .filter(|status| status.leader != 0)
            .and_then(|status| {
                let index = self.members.iter().position(|m| m.id == status.leader)?;
                Some((index, status))
            })
    }

    /// SIGKILL one member.
    pub fn kill(&mut self, index: usize) -> Result<()> {
        let member = self
            .members
            .get_mut(index)
            .ok_or_else(|| anyhow!("no etcd member {index}"))?;
        if let Some(pid) = member.pid.take() {
            procs::stop(pid, &StopPlan::kill());
        }
        Ok(())
    }

    pub fn stop(&mut self) {
        for member in &mut self.members {
            if let Some(pid) = member.pid.take() {
                procs::stop(pid, &server_stop_plan());
            }
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Both clusters, started side by side: etcd's members elect a leader while the Sentinels
/// find each other. Processes are spawned from this thread (their parent-death signal
/// follows it); only the waiting runs in parallel. A member that found its port taken starts
/// both again on fresh ports, as each cluster's own `start` does.
pub fn start_both() -> Result<(SentinelCluster, EtcdCluster)> {
    start_on_fresh_ports(|| {
        let mut redis = SentinelCluster::spawn(DOWN_AFTER)?;
        let mut etcd = EtcdCluster::spawn()?;
        let (redis_ready, etcd_ready) = thread::scope(|scope| {
            let redis_ready = scope.spawn(|| redis.wait_until_ready());
            let etcd_ready = scope.spawn(|| etcd.wait_until_ready());
            (redis_ready.join(), etcd_ready.join())
        });
        let panicked = || anyhow!("a readiness check panicked");
        redis_ready.map_err(|_| panicked())??;
        etcd_ready.map_err(|_| panicked())??;
        Ok((redis, etcd))
    })
}
