//! An etcd cluster with each member on a host of its own: the members talk Raft over the
//! hosts' links (a partition cuts them apart), clients reach them at the hosts' addresses
//! (from a host, or through a [`super::Door`]), and lockslab asks each one over its Unix
//! socket — the control line no partition touches, so the lab can still read every
//! member's own view while they cannot reach each other.
//!
//! No password: the members listen only on addresses inside lockslab's own namespaces,
//! which no other process on the machine is in, and on sockets in the run's own directory
//! (0700). Authentication would also put every client's log-in through Raft, which a
//! member cut off from its majority cannot do — the lab wants to see its other answers.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::Hosts;
use crate::cluster::{ETCD_ELECTION_MS, ETCD_HEARTBEAT_MS};
use crate::connect::{self, Backend};
use crate::procs;

/// The client port of every hosted member: each host has an address of its own.
pub const CLIENT_PORT: u16 = 2379;
/// The port the members talk Raft on.
pub const PEER_PORT: u16 = 2380;

/// The socket etcd makes in a member's working directory for lockslab's questions (etcd
/// reads `unix://ctl:0` as a file named `ctl:0` there).
const CONTROL_SOCKET: &str = "ctl:0";

/// How long a cluster may take to agree on its first leader.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// One member, on its host.
pub struct HostedMember {
    /// Its host, which is also its name in etcd and in the history.
    pub host: String,
    /// etcd's id for it (what `status` names the leader by).
    pub id: u64,
    child: Option<Child>,
    /// Where a client on a host reaches it.
    pub client_addr: SocketAddr,
    socket: PathBuf,
    log: PathBuf,
}

/// What one member says of the cluster, asked over its socket.
#[derive(Clone, Debug)]
pub struct MemberStatus {
    /// The member it names as leader; 0 when it knows of none.
    pub leader: u64,
    pub raft_term: u64,
    pub version: String,
}

/// Three (or more) members, one per host.
pub struct HostedEtcd {
    pub members: Vec<HostedMember>,
    /// From the first start to an agreed leader.
    pub started_in: Duration,
}

impl Hosts {
    /// Starts one etcd member in each of `hosts` as one cluster (its files under `dir`),
    /// with short timers — a heartbeat every [`ETCD_HEARTBEAT_MS`], an election after
    /// [`ETCD_ELECTION_MS`] of silence — and waits until every member names the same
    /// leader.
    pub fn start_etcd(&self, hosts: &[&str], dir: &Path) -> Result<HostedEtcd> {
        let started = Instant::now();
        let binary = crate::servers::find_binary("etcd", Backend::Etcd)?;
        let mut initial = Vec::new();
        for host in hosts {
            initial.push(format!("{host}=http://{}:{PEER_PORT}", self.addr(host)?));
        }
        let initial = initial.join(",");
        let mut members = Vec::new();
        for host in hosts {
            let addr = self.addr(host)?;
            let home = dir.join(format!("etcd-{host}"));
            std::fs::create_dir_all(&home)?;
            let log = dir.join(format!("etcd-{host}.log"));
            let output = std::fs::File::create(&log)?;
            let client = format!("http://{addr}:{CLIENT_PORT}");
            let peer = format!("http://{addr}:{PEER_PORT}");
            let mut command = Command::new(&binary);
            command
                .current_dir(&home)
                .args(["--name", host, "--data-dir", "data"])
                .args([
                    "--listen-client-urls",
                    &format!("{client},unix://{CONTROL_SOCKET}"),
                ])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer])
                .args(["--initial-advertise-peer-urls", &peer])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "lockslab-hosts"])
                .args(["--heartbeat-interval", &ETCD_HEARTBEAT_MS.to_string()])
                .args(["--election-timeout", &ETCD_ELECTION_MS.to_string()])
                .stdin(Stdio::null())
                .stdout(output.try_clone()?)
                .stderr(output);
            let child = self.start_in(host, &mut command)?;
            members.push(HostedMember {
                host: host.to_string(),
                id: 0,
                child: Some(child),
                client_addr: SocketAddr::new(addr.into(), CLIENT_PORT),
                socket: home.join(CONTROL_SOCKET),
                log,
            });
        }
        let mut cluster = HostedEtcd {
            members,
            started_in: Duration::ZERO,
        };
        cluster.wait_until_ready()?;
        cluster.started_in = started.elapsed();
        Ok(cluster)
    }
}

impl HostedEtcd {
    fn wait_until_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            if let Some(gone) = self
                .members
                .iter_mut()
                .find_map(|m| m.exited().then_some(m))
            {
                bail!(
                    "the etcd member on host {} exited at start-up; the end of its log: {}",
                    gone.host,
                    crate::servers::log_tail(&gone.log)
                );
            }
            let answers: Vec<Option<(u64, u64)>> = (self.members.iter())
                .map(|m| m.status_and_id(Duration::from_millis(500)).ok())
                .map(|s| s.map(|(status, id)| (status.leader, id)))
                .collect();
            let leaders: Vec<u64> = answers.iter().flatten().map(|(l, _)| *l).collect();
            if leaders.len() == self.members.len()
                && leaders[0] != 0
                && leaders.iter().all(|l| *l == leaders[0])
            {
                for (member, answer) in self.members.iter_mut().zip(answers) {
                    member.id = answer.map_or(0, |(_, id)| id);
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "the etcd members on hosts did not agree on a leader within {}s",
                    READY_WITHIN.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The member whose id is `id`.
    pub fn by_id(&self, id: u64) -> Option<&HostedMember> {
        self.members.iter().find(|m| m.id == id && id != 0)
    }

    /// The member on `host`.
    pub fn on(&self, host: &str) -> Result<&HostedMember> {
        (self.members.iter())
            .find(|m| m.host == host)
            .with_context(|| format!("no etcd member on host {host}"))
    }

    /// The leader, as the first of `askable` members that names one says (by host).
    pub fn leader_among(&self, askable: &[&str]) -> Option<String> {
        (self.members.iter())
            .filter(|m| askable.contains(&m.host.as_str()) && m.child.is_some())
            .find_map(|m| m.status(Duration::from_millis(500)).ok())
            .and_then(|status| self.by_id(status.leader))
            .map(|m| m.host.clone())
    }

    /// The members' hosts.
    pub fn hosts(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.host.as_str()).collect()
    }
}

impl HostedMember {
    /// Its own status, asked over its socket within `within`.
    pub fn status(&self, within: Duration) -> Result<MemberStatus> {
        self.status_and_id(within).map(|(status, _)| status)
    }

    fn status_and_id(&self, within: Duration) -> Result<(MemberStatus, u64)> {
        self.ask(within, |mut client| async move {
            let status = client.status().await?;
            let id = status.header().map_or(0, |h| h.member_id());
            Ok((
                MemberStatus {
                    leader: status.leader(),
                    raft_term: status.raft_term(),
                    version: status.version().to_string(),
                },
                id,
            ))
        })
    }

    /// A lease's TTL left as this member answers it (it asks the leader): whole seconds,
    /// -1 once the lease is gone.
    pub fn lease_ttl(&self, lease: i64, within: Duration) -> Result<i64> {
        self.ask(within, |mut client| async move {
            match client.lease_time_to_live(lease, None).await {
                Ok(answer) => Ok(answer.ttl()),
                Err(err) if err.to_string().contains("lease not found") => Ok(-1),
                Err(err) => Err(err.into()),
            }
        })
    }

    /// Who holds the lock named `lock`, as this member reads it: the oldest key under
    /// `<lock>/` (etcd's lock recipe) and its create revision.
    pub fn holder(&self, lock: &str, within: Duration) -> Result<Option<(String, i64)>> {
        let prefix = format!("{lock}/");
        self.ask(within, |mut client| async move {
            let options = etcd_client::GetOptions::new()
                .with_prefix()
                .with_sort(
                    etcd_client::SortTarget::Create,
                    etcd_client::SortOrder::Ascend,
                )
                .with_limit(1);
            let found = client.get(prefix, Some(options)).await?;
            Ok(found.kvs().first().map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.create_revision(),
                )
            }))
        })
    }

    /// One question over the member's socket, on a runtime of its own, bounded by `within`.
    fn ask<T, F>(
        &self,
        within: Duration,
        question: impl FnOnce(etcd_client::Client) -> F,
    ) -> Result<T>
    where
        F: std::future::Future<Output = Result<T>>,
    {
        let runtime = connect::etcd_runtime()?;
        runtime.block_on(async {
            let asking = async {
                let client = connect::etcd_on_socket_within(&self.socket, within).await?;
                question(client).await
            };
            match tokio::time::timeout(within, asking).await {
                Ok(answer) => answer,
                Err(_) => bail!("no answer within {}ms", within.as_millis()),
            }
        })
    }

    /// Its process, while it runs.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill_now(&mut self) {
        super::kill_started(&mut self.child);
    }

    /// Has its process ended (reaped if so)?
    fn exited(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(Some(_))) => {
                if let Some(child) = self.child.take() {
                    procs::forget(child.id() as i32);
                }
                true
            }
            _ => false,
        }
    }
}

impl Drop for HostedMember {
    fn drop(&mut self) {
        self.kill_now();
    }
}
