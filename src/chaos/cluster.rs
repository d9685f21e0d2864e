//! Chaos's leader kill (issue 25): the etcd designs against a cluster of three members
//! (lab 5's, [`crate::cluster::EtcdCluster`]) whose leader a schedule kills.
//!
//! ```text
//!  client A ──▶ m1 (follower) ─┐
//!  client B ──▶ m3 (follower) ─┼─▶ m2 (leader)   ✗ SIGKILL: m1 and m3 elect a new leader,
//!  client C ──▶ m1 (follower) ─┘                   then m2 starts again as a follower
//! ```
//!
//! Each client talks to a member that does not lead when its schedule starts: the kill
//! takes the leader away from under its requests, not the connection itself. A leader kill
//! reaches every history on the cluster, so the schedules that hold one play one at a time
//! (the others play side by side on the single etcd, as before).

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cluster::{ETCD_ELECTION_MS, ETCD_HEARTBEAT_MS, EtcdCluster, etcd_status};
use crate::connect::Backend;
use crate::designs::Design;
use crate::nemesis::Victim;
use crate::nemesis::generate::{ETCD_LEADER, FaultKind};
use crate::nemesis::schedule::Schedule;
use crate::procs::{self, StopPlan};

/// How long the two members left may take to elect a new leader, and the killed one to
/// answer again: far above etcd's election timeout, for a loaded machine.
const WITHIN: Duration = Duration::from_secs(15);

/// The cluster and the thread that starts a killed member again: a child dies with the
/// thread that spawned it ([`crate::procs`]), and the threads that play schedules end with
/// each batch.
pub struct EtcdRing {
    cluster: Mutex<EtcdCluster>,
    keeper: Mutex<mpsc::Sender<Box<dyn FnOnce() + Send>>>,
    /// Held by a schedule with a leader kill for its whole play: one at a time.
    turn: Mutex<()>,
}

impl EtcdRing {
    /// Starts the cluster; call it from a thread that outlives the run.
    pub fn start() -> Result<EtcdRing> {
        let cluster = EtcdCluster::start().context("starting the etcd cluster for leader-kill")?;
        let (keeper, jobs) = mpsc::channel::<Box<dyn FnOnce() + Send>>();
        std::thread::Builder::new()
            .name("chaos-etcd-keeper".into())
            .spawn(move || jobs.into_iter().for_each(|job| job()))?;
        Ok(EtcdRing {
            cluster: Mutex::new(cluster),
            keeper: Mutex::new(keeper),
            turn: Mutex::new(()),
        })
    }

    /// Does this schedule kill or stall the leader (and so play on the cluster, alone)?
    pub fn wanted_by(schedule: &Schedule) -> bool {
        (schedule.steps().iter()).any(|step| {
            matches!(
                FaultKind::of(step),
                Some(FaultKind::LeaderKill | FaultKind::LeaderStall)
            )
        })
    }

    /// The name of the member that leads now (None: none does, or none answers).
    pub fn leader_name(&self) -> Option<String> {
        let cluster = self.cluster();
        let (index, _) = cluster.leader()?;
        Some(cluster.members[index].name.clone())
    }

    /// The member that leads now as the members other than the one running as `pid` say
    /// (a frozen member would keep the question waiting): the words of a stall's end.
    pub fn leader_besides(&self, pid: i32) -> Option<String> {
        let cluster = self.cluster();
        let status = (cluster.members.iter())
            .filter(|m| m.pid.is_some_and(|own| own != pid))
            .find_map(|m| etcd_status(&m.client_url).ok())?;
        let leader = cluster.members.iter().find(|m| m.id == status.leader)?;
        Some(leader.name.clone())
    }

    /// Every member as the nemesis sees it, by its name: a leader's stall freezes whichever
    /// leads when it lands, and its end thaws that same one, though another leads by then.
    pub fn members(&self) -> Vec<Member<'_>> {
        (0..self.cluster().members.len())
            .map(|index| Member { ring: self, index })
            .collect()
    }

    /// Waits for the cluster to be this schedule's alone, with a leader and every member
    /// up; returns the turn and each client's URL (a member that does not lead, in turn).
    pub fn take_turn(&self, clients: usize) -> Result<(MutexGuard<'_, ()>, Vec<String>)> {
        let turn = self.turn.lock().unwrap_or_else(|p| p.into_inner());
        let cluster = self.cluster();
        let deadline = Instant::now() + WITHIN;
        let leader = loop {
            let all_up = cluster.members.iter().all(|m| m.pid.is_some());
            match cluster.leader() {
                Some((index, _)) if all_up => break index,
                _ if Instant::now() > deadline => {
                    bail!("the etcd cluster has no leader with every member up")
                }
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        let followers: Vec<String> = (0..cluster.members.len())
            .filter(|i| *i != leader)
            .map(|i| cluster.members[i].url())
            .collect();
        let urls = (0..clients)
            .map(|i| followers[i % followers.len()].clone())
            .collect();
        Ok((turn, urls))
    }

    fn cluster(&self) -> MutexGuard<'_, EtcdCluster> {
        self.cluster.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Kills the leader, waits for the others to elect one, starts the killed member again
    /// (from the keeper thread) and waits for it to answer: how long it was away.
    fn kill_leader_and_restart(&self) -> Result<Duration> {
        let started = Instant::now();
        let (index, old) = {
            let mut cluster = self.cluster();
            let (index, _) = cluster.leader().context("the etcd cluster has no leader")?;
            cluster.kill(index)?;
            (index, cluster.members[index].name.clone())
        };
        loop {
            if self.cluster().leader().is_some_and(|(at, _)| at != index) {
                break;
            }
            if started.elapsed() > WITHIN {
                bail!(
                    "no new etcd leader within {}s of {old}'s kill",
                    WITHIN.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let command = self.member_command(index)?;
        let (answer, answered) = mpsc::channel();
        self.keeper
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Box::new(move || {
                let _ = answer.send(spawn(command));
            }))
            .map_err(|_| anyhow::anyhow!("the etcd keeper thread is gone"))?;
        let pid = answered
            .recv()
            .map_err(|_| anyhow::anyhow!("the etcd keeper thread is gone"))??;
        let client_url = {
            let mut cluster = self.cluster();
            cluster.members[index].pid = Some(pid);
            cluster.members[index].client_url.clone()
        };
        while etcd_status(&client_url).is_err() {
            if started.elapsed() > WITHIN {
                bail!("the etcd member {old} did not answer again once restarted");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(started.elapsed())
    }

    /// The command that starts a member again on its data directory: etcd reads who it is
    /// and its peers from there (the `--initial-*` flags count only for a new member).
    fn member_command(&self, index: usize) -> Result<Command> {
        let cluster = self.cluster();
        let member = &cluster.members[index];
        let mut command = Command::new(crate::servers::find_binary("etcd", Backend::Etcd)?);
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(cluster.dir().join(format!("{}.log", member.name)))?;
        command
            .current_dir(cluster.dir())
            .args(["--name", &member.name, "--data-dir"])
            .arg(cluster.dir().join(&member.name))
            .args(["--listen-client-urls", &member.client_url])
            .args(["--advertise-client-urls", &member.client_url])
            .args(["--listen-peer-urls", &member.peer_url])
            .args(["--initial-advertise-peer-urls", &member.peer_url])
            .args(["--heartbeat-interval", &ETCD_HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ETCD_ELECTION_MS.to_string()])
            .args(["--bcrypt-cost", "4"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        Ok(command)
    }
}

fn spawn(mut command: Command) -> Result<i32> {
    let plan = StopPlan {
        signal: nix::sys::signal::Signal::SIGTERM,
        grace: Duration::from_secs(5),
    };
    let child = procs::spawn_registered(&mut command, plan)?;
    Ok(child.id() as i32)
}

/// The cluster's leader as the nemesis sees it: a leader kill is a restart of whichever
/// member leads when it lands.
pub struct Leader<'a>(pub &'a EtcdRing);

impl Victim for Leader<'_> {
    fn label(&self) -> String {
        ETCD_LEADER.into()
    }

    fn pid(&self) -> Option<i32> {
        let cluster = self.0.cluster();
        let (index, _) = cluster.leader()?;
        cluster.members[index].pid
    }

    fn kill_now(&mut self) {
        let mut cluster = self.0.cluster();
        if let Some((index, _)) = cluster.leader() {
            let _ = cluster.kill(index);
        }
    }

    fn restart_now(&mut self) -> Result<Duration> {
        self.0.kill_leader_and_restart()
    }
}

/// How long a drawn leader's stall lasts: past the cluster's election timeout
/// ([`ETCD_ELECTION_MS`]) twice at least, so that the others elect a new leader while it
/// sleeps, and up to three of the etcd designs' leases.
pub const STALL_MS: (u64, u64) = (2 * ETCD_ELECTION_MS, 3000);

/// One member of the cluster, by its place: frozen and thawed by a leader's stall.
pub struct Member<'a> {
    ring: &'a EtcdRing,
    index: usize,
}

impl Victim for Member<'_> {
    fn label(&self) -> String {
        self.ring.cluster().members[self.index].name.clone()
    }

    fn pid(&self) -> Option<i32> {
        self.ring.cluster().members[self.index].pid
    }

    fn kill_now(&mut self) {
        let _ = self.ring.cluster().kill(self.index);
    }
}

/// The cluster a run needs: when it may draw a leader kill for a design on etcd.
pub fn ring_for(designs: &[Design], kinds: &[FaultKind]) -> Result<Option<Arc<EtcdRing>>> {
    let wanted = (kinds.contains(&FaultKind::LeaderKill)
        || kinds.contains(&FaultKind::LeaderStall))
        && designs.iter().any(|d| d.uses_etcd());
    Ok(if wanted {
        Some(Arc::new(EtcdRing::start()?))
    } else {
        None
    })
}
