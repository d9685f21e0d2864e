//! One history: the records set up, the clients started, the schedule played from the live
//! history, the records read back and checked.

use std::time::{Duration, Instant};

use anyhow::Result;

use super::failover::{Primary, REDIS_REPLICA, Replica};
use super::lane::{self, Lane};
use super::rows::{forget, prepare, read_back};
use super::unplayed::Unplayed;
use crate::check::chaos::{RecordBack, Report};
use crate::connect::{self, PgClient};
use crate::designs::Design;
use crate::events::Event;
use crate::events::facts::Warning;
use crate::labs::faults::{Faults, Until};
use crate::labs::{Stage, WorkerHandle};
use crate::nemesis::generate::{self, FaultKind, REDIS_PRIMARY, Space};
use crate::nemesis::schedule::{Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note, Victim};
use crate::output::Style;
use crate::worker::WorkerSpec;
use crate::worker::chaos_client::ChaosClient;

/// What every history of a run shares: the design, the servers, the sizes.
pub struct Setup {
    pub design: Design,
    pub run_id: String,
    pub store_url: String,
    /// Where schedules play side by side: each lane its own Redis.
    pub lanes: std::sync::Arc<Vec<Lane>>,
    pub etcd_url: Option<String>,
    /// The etcd cluster whose leader a schedule may kill (issue 25).
    pub etcd_ring: Option<std::sync::Arc<super::cluster::EtcdRing>>,
    /// The Redis primary and replica under Sentinel whose primary a schedule may kill.
    pub sentinel_ring: Option<std::sync::Arc<super::failover::SentinelRing>>,
    pub records: u32,
    pub run_ms: u64,
    pub work_ms: u64,
    pub lease_ms: u64,
    /// The schedules are the one given (`--schedule`): a step that does not play makes its
    /// history unknown (see [`super::unplayed`]).
    pub given: bool,
    /// This machine can make hosts: a schedule may cut a client off ([`super::partition`]).
    pub hosts: bool,
}

/// One history and what the checker made of it.
pub struct Trial {
    /// The history's own run id (its rows' and keys').
    pub run_id: String,
    pub history: Vec<Event>,
    pub report: Report,
    pub ms: u64,
    /// From the schedule's start to the last client's first event: process start-up and
    /// connections, the part of `ms` that is not the clients' work.
    pub startup_ms: u64,
    /// The schedule's steps that did not play, and why.
    pub unplayed: Vec<Unplayed>,
}

/// How long one schedule's clients work: etcd's sessions take longer to start.
pub fn run_ms_of(design: Design) -> u64 {
    if design.uses_etcd() { 2000 } else { 1500 }
}

pub fn client_names(clients: u32) -> Vec<String> {
    (0..clients)
        .map(|i| char::from(b'A' + i as u8).to_string())
        .collect()
}

impl Setup {
    /// The lock's lease for this design: short, so that a pause of a second outlives it.
    pub fn lease_for(design: Design) -> u64 {
        if design.uses_etcd() { 1000 } else { 800 }
    }

    /// Plays one schedule with `clients` clients on `lane`; `index` namespaces its rows
    /// and keys.
    pub fn play(
        &self,
        schedule: &Schedule,
        clients: u32,
        index: u64,
        seed: u64,
        lane: usize,
    ) -> Result<Trial> {
        let lane = &self.lanes[lane % self.lanes.len().max(1)];
        let started = Instant::now();
        let run_id = format!("{}_{index}", self.run_id);
        let names = client_names(clients);
        let records: Vec<String> = (0..self.records).map(|i| format!("r{i}")).collect();
        let mut store = connect::postgres(&self.store_url)?;
        // Ctrl-C: once the clients are dead, the history's rows go too.
        let _on_interrupt = crate::procs::on_interrupt({
            let (url, run_id) = (self.store_url.clone(), run_id.clone());
            move || {
                if let Ok(mut store) = connect::postgres_for_cleanup(&url) {
                    let _ = forget(&mut store, &run_id);
                }
            }
        });
        prepare(&mut store, &run_id, &records)?;
        // A leader kill plays on the cluster, its schedule alone there (see `cluster`).
        let ring = self
            .etcd_ring
            .as_deref()
            .filter(|_| super::cluster::EtcdRing::wanted_by(schedule));
        let turn = ring.map(|ring| ring.take_turn(names.len())).transpose()?;
        let on = turn
            .as_ref()
            .map(|(_, urls)| (ring.unwrap(), urls.as_slice()));
        // A failover plays on the Sentinels' primary and replica, alone there (`failover`).
        let sentinels = (self.sentinel_ring.as_deref())
            .filter(|_| super::failover::SentinelRing::wanted_by(schedule));
        let sentinel_turn = sentinels.map(|ring| ring.take_turn()).transpose()?;
        let lane_of = (
            lane,
            sentinel_turn
                .as_ref()
                .map(|(_, urls)| (sentinels.unwrap(), urls.as_slice())),
        );
        let result = self.play_on(
            lane_of, on, schedule, &names, &records, &run_id, seed, &mut store,
        );
        let switched = sentinels.is_some_and(|ring| ring.switched_during_turn());
        drop((turn, sentinel_turn));
        let forgot = forget(&mut store, &run_id);
        let (mut history, unplayed, backs) = result?;
        forgot?;
        // The evidence joins the history: the store's read-back, and a failover the
        // Sentinels played by themselves.
        let last_t = history.last().map_or(0, |e| e.t_ms);
        history.push(super::rows::read_back_event(backs, last_t));
        if switched {
            let mut event = Event::new(
                "sentinel",
                Warning {
                    failed_over_by_itself: Some(true),
                    ..Warning::default()
                },
                super::failover::SWITCHED_BY_ITSELF,
            );
            event.t_ms = last_t;
            history.push(event);
        }
        let steps = schedule.steps().len();
        let report = super::rows::judge(&history, self.design, &unplayed, steps, self.given);
        let startup_ms = names
            .iter()
            .filter_map(|name| history.iter().find(|e| e.worker == *name))
            .map(|e| e.t_ms)
            .max()
            .unwrap_or(0);
        Ok(Trial {
            run_id,
            history,
            report,
            ms: started.elapsed().as_millis() as u64,
            startup_ms,
            unplayed,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn play_on(
        &self,
        (lane, sentinels): (&Lane, Option<(&super::failover::SentinelRing, &[String])>),
        ring: Option<(&super::cluster::EtcdRing, &[String])>,
        schedule: &Schedule,
        names: &[String],
        records: &[String],
        run_id: &str,
        seed: u64,
        store: &mut PgClient,
    ) -> Result<(Vec<Event>, Vec<Unplayed>, Vec<RecordBack>)> {
        let start = Instant::now();
        let mut stage = Stage::on_clock(
            Style {
                json: true,
                fancy: false,
            },
            start,
        )
        .quiet();
        // Lanes play side by side, each restarting only its own Redis. Its persistence is
        // set for the whole schedule, before any client connects (see `persist`): on only
        // for a schedule that restarts it with its data — an fsync at every write slows
        // every command, which would tell on the other schedules' timing.
        let restart =
            (schedule.steps().iter()).find(|s| FaultKind::of(s).is_some_and(FaultKind::restarts));
        let etcd_of = |i: usize| ring.map_or(self.etcd_url.as_deref(), |(_, urls)| Some(&urls[i]));
        let keeps_data = restart.is_some_and(|s| FaultKind::of(s) == Some(FaultKind::RestartAof));
        if lane.redis.is_some() {
            lane::persist(lane, keeps_data)?;
        }
        if !lane.masters.is_empty() {
            (lane.masters).persist(lane.keeper()?, restart.map(|s| s.target.as_str()))?;
        }
        // The network faults' paths: a proxy for each path the schedule aims at (see `net`).
        let (_, net) = super::net::split(schedule);
        let paths = super::net::Paths::start(
            &net,
            &[
                (
                    crate::nemesis::generate::STORE,
                    Some(self.store_url.as_str()),
                ),
                ("redis", lane.redis_url.as_deref()),
                ("etcd", etcd_of(0)),
            ],
        )?;
        // A partition's hosts: each client on one, each server behind a relay on one.
        let network = self.network_for(schedule, lane, names)?;
        let via = |name: &str, server: &str, url: &str| match &network {
            Some(network) => network.url(name, server, url),
            None => paths.url(name, server, url),
        };
        let through = |name: &str, server: &str, url: Option<&str>| {
            url.map(|url| via(name, server, url)).transpose()
        };
        // A failover's clients work on past its lag and the promotion (see `failover`).
        let more_ms = super::failover::MORE_WORK_MS + super::failover::lag_ms(schedule);
        let run_ms = self.run_ms + sentinels.map_or(0, |_| more_ms);
        let mut workers: Vec<WorkerHandle> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let script = ChaosClient {
                name: name.clone(),
                index: i as u32,
                design: self.design,
                store_url: via(name, crate::nemesis::generate::STORE, &self.store_url)?,
                redis_url: through(name, "redis", lane.redis_url.as_deref())?,
                etcd_url: through(name, "etcd", etcd_of(i))?,
                run_id: run_id.into(),
                records: records.to_vec(),
                run_ms,
                work_ms: self.work_ms,
                lease_ms: self.lease_ms,
                wait_ms: 2000,
                seed: crate::nemesis::generate::nth_seed(seed, i as u64 + 1),
                clients: names.len() as u32,
                masters: (lane.masters.urls.iter().enumerate())
                    .map(|(m, url)| via(name, &super::redlock_lane::name(m), url))
                    .collect::<Result<_>>()?,
                sentinels: sentinels.map_or_else(Vec::new, |(_, urls)| urls.to_vec()),
            };
            workers.push(stage.spawn(name, &WorkerSpec::ChaosClient(script))?);
        }
        // Declared after the workers: dropped first, so a failed run resumes them first.
        let mut nemesis = Nemesis::new();
        // Every fault of the schedule, of every kind, is played by the one player: on the
        // processes and servers of the cast, on the proxies' paths (`net`), on the lock
        // servers' clocks (`clock`), and the failover on the Sentinels' nodes (`failover`).
        let ring_of = sentinels.map(|(ring, _)| ring);
        let lag_ms = super::failover::lag_ms(schedule);
        let mut faults = Faults::new(schedule, &stage).saying(|cue| {
            let name = &cue.action.target;
            if let Some(words) = super::net::words(cue, schedule) {
                return Note::from(words);
            }
            if let Some(words) = super::partition::words(cue) {
                return Note::from(words);
            }
            if let Some(note) = ring_of.and_then(|ring| super::failover::words(ring, cue, lag_ms)) {
                return note;
            }
            Note::from(match (cue.action.fault, cue.back_after) {
                (Fault::Restart, None) if name == generate::ETCD_LEADER => {
                    "kills etcd's leader (SIGKILL): the other two members elect a new one"
                        .to_string()
                }
                (Fault::Restart, Some(took)) if name == generate::ETCD_LEADER => format!(
                    "a new etcd leader elected; the old one back as a follower after {}ms",
                    took.as_millis()
                ),
                (Fault::Restart, None) if keeps_data => {
                    "crashes Redis (SIGKILL), then starts it again on its AOF".to_string()
                }
                (Fault::Restart, None) => {
                    "crashes Redis (SIGKILL), then starts it again, empty".to_string()
                }
                (Fault::Restart, Some(took)) if keeps_data => format!(
                    "Redis back after {}ms, with every write it acknowledged",
                    took.as_millis()
                ),
                (Fault::Restart, Some(took)) => {
                    format!("Redis back after {}ms, empty", took.as_millis())
                }
                (Fault::LeaderStall, _) => {
                    let ms = (cue.action.step)
                        .and_then(|i| schedule.steps().get(i)?.duration_ms)
                        .unwrap_or_default();
                    format!(
                        "freezes etcd's leader (SIGSTOP) for {ms}ms, past its election \
                         timeout ({}ms)",
                        crate::cluster::ETCD_ELECTION_MS
                    )
                }
                (Fault::Resume, _) if name == generate::ETCD_LEADER => {
                    let now = ring.and_then(|(ring, _)| ring.leader_besides(cue.pid));
                    format!(
                        "thaws etcd's old leader (SIGCONT); the others name {} leader now",
                        now.as_deref().unwrap_or("no member")
                    )
                }
                (Fault::Pause, _) => format!("pauses {name} (SIGSTOP)"),
                (Fault::Resume, _) => format!("resumes {name} (SIGCONT)"),
                _ => format!("kills {name} (SIGKILL)"),
            })
        });
        faults = super::clock::on(paths.on(faults), schedule, lane, self.lease_ms)?;
        if let Some(network) = &network {
            faults = faults.on_hosts(network.hosts());
        }
        if let Some((ring, _)) = ring {
            faults = faults.on_leader(generate::ETCD_LEADER, move || ring.leader_name());
        }
        if let Some(ring) = ring_of {
            faults = (faults.on_replica(REDIS_REPLICA, move || ring.primary_url()))
                .failing_over(REDIS_PRIMARY, REDIS_REPLICA);
        }
        let longest_pause = (schedule.steps().iter())
            .filter_map(|s| s.duration_ms)
            .max();
        let within = Duration::from_millis(run_ms + longest_pause.unwrap_or(0) + 15_000);
        let until = Until::holds("the clients to finish", within, |stage, faults| {
            let exited = names.iter().all(|name| stage.has_exited(name));
            exited && !faults.holding()
        })
        .tolerating_errors();
        {
            let mut redis = match (restart, lane.redis.is_some()) {
                (Some(step), true) => Some(lane.redis_victim(&step.target)),
                _ => None,
            };
            let mut cast: Vec<&mut dyn Victim> = workers
                .iter_mut()
                .map(|worker| worker as &mut dyn Victim)
                .collect();
            if let Some(redis) = redis.as_mut() {
                cast.push(redis);
            }
            let mut master = restart.and_then(|step| {
                let keeper = lane.keeper.as_ref()?;
                lane.masters.victim(keeper, &step.target)
            });
            if let Some(master) = master.as_mut() {
                cast.push(master);
            }
            let mut leader = ring.map(|(ring, _)| super::cluster::Leader(ring));
            if let Some(leader) = leader.as_mut() {
                cast.push(leader);
            }
            let mut members = ring.map_or_else(Vec::new, |(ring, _)| ring.members());
            for member in &mut members {
                cast.push(member);
            }
            let mut replica = ring_of.map(Replica);
            let mut primary = ring_of.map(|ring| Primary::new(ring, lag_ms));
            if let (Some(replica), Some(primary)) = (replica.as_mut(), primary.as_mut()) {
                cast.push(replica);
                cast.push(primary);
            }
            stage.play(&mut faults, &mut nemesis, &mut cast, until)?;
        }
        faults.finish(&mut stage, &mut nemesis);
        let left: Vec<(Step, String)> = (faults.unplayed().into_iter())
            .map(|(step, why)| (step.clone(), why))
            .collect();
        for worker in &mut workers {
            worker.finish(Duration::from_secs(2));
        }
        stage.drain();
        let mut history = std::mem::take(&mut stage.log);
        history.sort_by_key(|e| e.t_ms);
        let backs = read_back(store, run_id, records)?;
        Ok((history, super::unplayed::place(schedule, left), backs))
    }
}

impl Setup {
    /// The hosts of a schedule that cuts a client off ([`super::partition`]): one per
    /// client, and one per server the design's clients talk to (the store, its lock
    /// server, or Redlock's masters); None for any other schedule.
    fn network_for(
        &self,
        schedule: &Schedule,
        lane: &Lane,
        clients: &[String],
    ) -> Result<Option<super::partition::Network>> {
        if !super::partition::wanted_by(schedule) {
            return Ok(None);
        }
        let servers =
            partitioned_servers(self.design, lane, self.etcd_url.as_deref(), &self.store_url);
        super::partition::Network::start(clients, &servers).map(Some)
    }
}

/// The servers a partition may cut a design's client off from, by their hosts' names, with
/// the URL each is found at.
fn partitioned_servers(
    design: Design,
    lane: &Lane,
    etcd_url: Option<&str>,
    store_url: &str,
) -> Vec<(String, String)> {
    let mut servers = vec![(generate::STORE.to_string(), store_url.to_string())];
    if design.uses_redis()
        && let Some(url) = &lane.redis_url
    {
        servers.push(("redis".into(), url.clone()));
    }
    if design.uses_etcd()
        && let Some(url) = etcd_url
    {
        servers.push(("etcd".into(), url.to_string()));
    }
    if design.uses_masters() {
        for (m, url) in lane.masters.urls.iter().enumerate() {
            servers.push((super::redlock_lane::name(m), url.clone()));
        }
    }
    servers
}

/// The hosts a partition may cut a design's client off from (see [`partitioned_servers`]).
pub fn partition_hosts(design: Design) -> Vec<String> {
    let mut hosts = vec![generate::STORE.to_string()];
    if design.uses_redis() {
        hosts.push("redis".into());
    } else if design.uses_etcd() {
        hosts.push("etcd".into());
    } else if design.uses_masters() {
        hosts.extend((0..super::redlock_lane::MASTERS).map(super::redlock_lane::name));
    }
    hosts
}

/// The faults a design can meet: a restart only where there is a server of chaos's own.
pub fn space(setup: &Setup, clients: u32, kinds: &[FaultKind]) -> Space {
    let lease = setup.lease_ms;
    // Partitioned: client k owns record k (mod the clients); with fewer records than
    // clients the others have no work, and a fault aimed at their work would never land.
    let working = match setup.design {
        Design::Partitioned => clients.min(setup.records.max(1)),
        _ => clients,
    };
    Space {
        clients: client_names(working),
        kinds: kinds
            .iter()
            .copied()
            .filter(|kind| !(kind.on_lock_server() && setup.design.uses_masters()))
            .collect(),
        restartable: if setup.lanes.iter().all(|l| l.redis.is_some()) && setup.design.uses_redis() {
            vec!["redis".into()]
        } else if setup.design.uses_masters() {
            (0..super::redlock_lane::MASTERS)
                .map(super::redlock_lane::name)
                .collect()
        } else {
            Vec::new()
        },
        span_ms: setup.run_ms,
        pause_ms: (lease / 2, lease * 3),
        cut_ms: (lease * 5 / 4, lease * 3),
        max_faults: 3,
        lock_server: super::net::lock_server(setup.design).into(),
        etcd_cluster: setup.etcd_ring.is_some(),
        redis_failover: setup.sentinel_ring.is_some(),
        moments: setup.design.moments(),
        jumping: super::clock::servers(setup.design),
        partitioned: match setup.hosts {
            true => partition_hosts(setup.design),
            false => Vec::new(),
        },
        stall_ms: setup.etcd_ring.as_ref().map(|_| super::cluster::STALL_MS),
    }
}
