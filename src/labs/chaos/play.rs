//! One history: the records set up, the clients started, the schedule played from the live
//! history, the records read back and checked.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use crate::check::chaos::{self, ChaosAttempt, Heard, LostRelease, RecordBack, Report};
use crate::connect::{self, Backend, PgClient};
use crate::events::{Event, What};
use crate::labs::faults::{Faults, Until};
use crate::labs::{Stage, WorkerHandle};
use crate::nemesis::schedule::Schedule;
use crate::nemesis::victims::Server;
use crate::nemesis::{Fault, Nemesis, Note, Victim};
use crate::output::Style;
use crate::servers::{Lifetime, PrivateServers};
use crate::worker::WorkerSpec;
use crate::worker::chaos_client::{self, ChaosClient, Design};

/// What every history of a run shares: the design, the servers, the sizes.
pub struct Setup {
    pub design: Design,
    pub run_id: String,
    pub store_url: String,
    /// Where schedules play side by side: each lane its own Redis.
    pub lanes: Vec<Lane>,
    pub etcd_url: Option<String>,
    pub records: u32,
    pub run_ms: u64,
    pub work_ms: u64,
    pub lease_ms: u64,
}

/// One lane of schedules played side by side: its Redis, restarted by its schedules only
/// (a restart would otherwise land in every history in flight, a fault none of their
/// schedules holds). A given Redis (`--redis-url`) is every lane's, and never restarted.
#[derive(Default)]
pub struct Lane {
    pub redis_url: Option<String>,
    /// Chaos's own Redis, which this lane's schedules may restart.
    pub redis: Option<Mutex<PrivateServers>>,
}

impl Lane {
    pub fn private_redis() -> Result<Lane> {
        let private = PrivateServers::start(&[Backend::Redis], Lifetime::ThisRun)?;
        let url = private
            .url(Backend::Redis)
            .context("the private Redis has no URL")?;
        Ok(Lane {
            redis_url: Some(url),
            redis: Some(Mutex::new(private)),
        })
    }
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
    /// Steps whose event never came: they did not play.
    pub unplayed: usize,
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
        let result = self.play_on(lane, schedule, &names, &records, &run_id, seed, &mut store);
        let forgot = forget(&mut store, &run_id);
        let (history, unplayed, backs) = result?;
        forgot?;
        let mut report = chaos::check(&heard(&history), &backs, self.design.trusts_the_lock());
        if report.attempts == 0 {
            // Nothing was tried (a server that never answered, clients that never got to
            // work): a history with no write says nothing about the design.
            report
                .unknowns
                .push("no client attempted a write: this history tests nothing".into());
        }
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
        lane: &Lane,
        schedule: &Schedule,
        names: &[String],
        records: &[String],
        run_id: &str,
        seed: u64,
        store: &mut PgClient,
    ) -> Result<(Vec<Event>, usize, Vec<RecordBack>)> {
        let start = Instant::now();
        let mut stage = Stage::on_clock(
            Style {
                json: true,
                fancy: false,
            },
            start,
        )
        .quiet();
        let mut workers: Vec<WorkerHandle> = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let script = ChaosClient {
                name: name.clone(),
                index: i as u32,
                design: self.design,
                store_url: self.store_url.clone(),
                redis_url: lane.redis_url.clone(),
                etcd_url: self.etcd_url.clone(),
                run_id: run_id.into(),
                records: records.to_vec(),
                run_ms: self.run_ms,
                work_ms: self.work_ms,
                lease_ms: self.lease_ms,
                wait_ms: 2000,
                seed: crate::nemesis::generate::nth_seed(seed, i as u64 + 1),
                clients: names.len() as u32,
            };
            workers.push(stage.spawn(name, &WorkerSpec::ChaosClient(script))?);
        }
        // Declared after the workers: dropped first, so a failed run resumes them first.
        let mut nemesis = Nemesis::new();
        let mut faults = Faults::new(schedule, &stage).saying(|cue| {
            let name = &cue.action.target;
            Note::from(match (cue.action.fault, cue.back_after) {
                (Fault::Restart, None) => {
                    "crashes Redis (SIGKILL), then starts it again, empty".to_string()
                }
                (Fault::Restart, Some(took)) => {
                    format!("Redis back after {}ms, empty", took.as_millis())
                }
                (Fault::Pause, _) => format!("pauses {name} (SIGSTOP)"),
                (Fault::Resume, _) => format!("resumes {name} (SIGCONT)"),
                _ => format!("kills {name} (SIGKILL)"),
            })
        });
        let longest_pause = schedule
            .steps()
            .iter()
            .filter_map(|s| s.duration_ms)
            .max()
            .unwrap_or(0);
        let within = Duration::from_millis(self.run_ms + longest_pause + 15_000);
        let until = Until::holds("the clients to finish", within, |stage, faults| {
            names.iter().all(|name| stage.has_exited(name)) && !faults.holding()
        })
        .tolerating_errors();
        {
            // The lane's Redis is taken only by a schedule that restarts it: lanes play
            // side by side, each restarting its own.
            let restarts = schedule.steps().iter().any(|s| s.fault == Fault::Restart);
            let mut private = match lane.redis.as_ref() {
                Some(redis) if restarts => Some(redis.lock().unwrap_or_else(|p| p.into_inner())),
                _ => None,
            };
            let mut redis = private
                .as_deref_mut()
                .map(|private| Server::new(private, Backend::Redis, "redis"));
            let mut cast: Vec<&mut dyn Victim> = workers
                .iter_mut()
                .map(|worker| worker as &mut dyn Victim)
                .collect();
            if let Some(redis) = redis.as_mut() {
                cast.push(redis);
            }
            stage.play(&mut faults, &mut nemesis, &mut cast, until)?;
        }
        for worker in &mut workers {
            worker.finish(Duration::from_secs(2));
        }
        stage.drain();
        let mut history = std::mem::take(&mut stage.log);
        history.sort_by_key(|e| e.t_ms);
        let backs = read_back(store, run_id, records)?;
        Ok((history, faults.unplayed().len(), backs))
    }
}

fn prepare(store: &mut PgClient, run_id: &str, records: &[String]) -> Result<()> {
    let mut tx = store.transaction()?;
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('lockslab schema'))",
        &[],
    )?;
    tx.batch_execute(chaos_client::SCHEMA)
        .context("creating the chaos tables")?;
    for record in records {
        tx.execute(
            "INSERT INTO lockslab_chaos_record (run_id, record) VALUES ($1, $2)",
            &[&run_id, record],
        )?;
    }
    tx.commit()?;
    Ok(())
}

/// Removes a history's rows once read (best effort on the way out of a failed run).
pub fn forget(store: &mut PgClient, run_id: &str) -> Result<()> {
    for table in [
        "lockslab_chaos_record",
        "lockslab_chaos_attempt",
        "lockslab_chaos_log",
    ] {
        store.execute(
            &format!("DELETE FROM {table} WHERE run_id = $1"),
            &[&run_id],
        )?;
    }
    Ok(())
}

fn read_back(store: &mut PgClient, run_id: &str, records: &[String]) -> Result<Vec<RecordBack>> {
    let mut backs = Vec::new();
    for record in records {
        let final_value: Option<i64> = store
            .query_opt(
                "SELECT value FROM lockslab_chaos_record WHERE run_id = $1 AND record = $2",
                &[&run_id, record],
            )?
            .map(|row| row.get(0));
        let log = store
            .query(
                "SELECT job FROM lockslab_chaos_log WHERE run_id = $1 AND record = $2 ORDER BY seq",
                &[&run_id, record],
            )?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let attempts = store
            .query(
                "SELECT client, job, read_value, value, token, accepted, decided
                 FROM lockslab_chaos_attempt WHERE run_id = $1 AND record = $2 ORDER BY decided",
                &[&run_id, record],
            )?
            .iter()
            .map(|row| ChaosAttempt {
                client: row.get(0),
                job: row.get(1),
                read_value: row.get(2),
                value: row.get(3),
                token: row.get(4),
                accepted: row.get(5),
                decided: row.get(6),
            })
            .collect();
        backs.push(RecordBack {
            record: record.clone(),
            final_value,
            log,
            attempts,
        });
    }
    Ok(backs)
}

/// What the clients heard back, out of the history: the writes they were told were
/// accepted, and the releases that found their lock gone or someone else's.
fn heard(history: &[Event]) -> Heard {
    let mut heard = Heard::default();
    let mut lock_of: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    for event in history {
        match &event.what {
            What::Acquired(a) => {
                if let Some(lock) = a.lock.as_deref() {
                    lock_of.insert(event.worker.as_str(), lock);
                }
            }
            What::Wrote(w) if w.outcome == crate::store::Outcome::Accepted => {
                if let (Some(record), Some(job)) = (&w.resource, w.job) {
                    heard.acknowledged.push((record.clone(), job));
                }
            }
            What::Released(r) if r.released == Some(false) => {
                heard.lost_releases.push(LostRelease {
                    holder: event.worker.clone(),
                    lock: lock_of
                        .get(event.worker.as_str())
                        .map_or_else(|| "its lock".into(), |lock| lock.to_string()),
                    found_owner: r.found_owner.clone(),
                });
            }
            _ => {}
        }
    }
    heard
}
