//! One run of lab 1's story: A takes the lock and freezes, B takes it once Redis lets it
//! go, A wakes and writes. The nemesis freezes, resumes and (with `--token-restart`)
//! crashes Redis; the lab watches A's key while A is frozen, then reads the store back.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use colored::Colorize;

use super::verdict::{RunVerdict, Setup, store_line};
use super::{Fence, Freeze, Plan};
use crate::connect::{self, Backend};
use crate::events::facts::{self, Expired, Pttl};
use crate::events::{Event, Kind};
use crate::labs::faults::{Faults, Until};
use crate::labs::runner::Run;
use crate::labs::{Stage, WorkerHandle};
use crate::lock::redis::RedisLock;
use crate::nemesis::victims::Server;
use crate::nemesis::{Fault, Nemesis, Note, Victim};
use crate::output::human;
use crate::redis_health::KeyWatch;
use crate::servers::PrivateServers;
use crate::store::{FenceRule, Store};
use crate::worker::WorkerSpec;
use crate::worker::holder::{AfterWrite, BeforeWrite, HolderScript, LockSpec};

/// One run of the story.
pub(super) struct Play<'a> {
    pub(super) plan: &'a Plan,
    /// The lab run: its id, its style and its one clock (every run's events are stamped
    /// from it).
    pub(super) run: &'a Run,
    pub(super) fence: Fence,
}

impl Play<'_> {
    /// The heading of the run on the timeline.
    fn heading(&self, restarting: bool) -> String {
        let fence = self.fence;
        match (fence.fenced, restarting, fence.sequence, fence.rule, fence.a_first) {
            (false, ..) => "── without fencing ──".red().bold(),
            (true, false, ..) => "── with fencing tokens ──".green().bold(),
            (true, true, false, FenceRule::NotLower, _) =>
                "── lesson: tokens from the Redis counter; the store's rule, not lower than the highest (>=) ──"
                    .red()
                    .bold(),
            (true, true, false, FenceRule::HigherOrSameHolder, false) =>
                "── lesson: tokens from the Redis counter; the store refuses an equal token from another holder; B writes first ──"
                    .red()
                    .bold(),
            (true, true, false, FenceRule::HigherOrSameHolder, true) =>
                "── lesson: the same rule; A, the stale holder, writes first ──".red().bold(),
            (true, true, true, _, false) =>
                "── the fix: tokens from a Postgres sequence in the store's database; B writes first ──"
                    .green()
                    .bold(),
            (true, true, true, _, true) =>
                "── the fix: tokens from the store's sequence; A writes first ──".green().bold(),
        }
        .to_string()
    }

    /// One run; `restart`: the private Redis to crash and restart while A is frozen.
    pub(super) fn run(
        &self,
        redis_url: &str,
        postgres_url: &str,
        store: &mut Store,
        restart: Option<&mut PrivateServers>,
    ) -> Result<RunVerdict> {
        let plan = self.plan;
        let restarting = restart.is_some();
        let mut stage = self.run.stage();
        stage.timeline.say("");
        stage.timeline.say(&self.heading(restarting));
        let names = Names::of(self, restarting);
        if let Some(sequence) = &names.sequence {
            store.create_token_sequence(sequence)?;
        }
        let urls = Urls {
            redis: redis_url,
            postgres: postgres_url,
        };
        let mut lock_watch = RedisLock::new(connect::redis(redis_url)?, &names.lock, plan.ttl);
        self.begin(&mut stage, &lock_watch.key, restarting);
        // A key deleted, flushed or evicted must not pass for an expiry (not watched on the
        // private Redis that --token-restart crashes on purpose).
        let key_watch = if restarting {
            None
        } else {
            Some(KeyWatch::start(redis_url)?)
        };
        let a_script = match plan.freeze {
            Freeze::Self_ => BeforeWrite::FreezeSelf,
            Freeze::Peer => BeforeWrite::WorkUntilTold,
        };
        let a_role = self.holder("A", a_script, AfterWrite::Release, &urls, &names);
        let mut a = stage.spawn("A", &WorkerSpec::Holder(a_role))?;
        // Declared after A: dropped first, so that a run that fails resumes A before A's
        // handle kills it.
        let mut nemesis = Nemesis::new();
        let mut faults = self.faults(&stage);
        let a_owner = stage
            .wait_for(Duration::from_secs(10), "A to take the lock", |e| {
                e.is("A", Kind::Acquired)
            })?
            .owner()
            .map(String::from);

        // The pause: A at work (waiting for `finish`) before it is frozen, as a real pause
        // catches a client in the middle of what it does — or A stopping itself.
        let frozen = Until::acted(Fault::Pause, "A", Duration::from_secs(5));
        stage.play(&mut faults, &mut nemesis, &mut [&mut a], frozen)?;
        let frozen_at = Instant::now();
        let crashed = if let Some(private) = restart {
            let mut held = Held {
                stage: &mut stage,
                faults: &mut faults,
                nemesis: &mut nemesis,
                a: &mut a,
            };
            self.crash_redis(&mut held, &mut lock_watch, a_owner.as_deref(), private)?;
            lock_watch = RedisLock::new(connect::redis(redis_url)?, &names.lock, plan.ttl);
            true
        } else {
            false
        };
        // B works until told when A is to write first: A wakes and writes while B holds the
        // lock, as two holders of one reissued token can.
        let b_before = if self.fence.a_first {
            BeforeWrite::WorkUntilTold
        } else {
            BeforeWrite::Nothing
        };
        let b_role = self.holder("B", b_before, AfterWrite::HoldUntilTold, &urls, &names);
        let mut b = stage.spawn("B", &WorkerSpec::Holder(b_role))?;
        if self.fence.a_first {
            stage.wait_for(Duration::from_secs(10), "B to take the lock", |e| {
                e.is("B", Kind::Working)
            })?;
        }
        let mut held = Held {
            stage: &mut stage,
            faults: &mut faults,
            nemesis: &mut nemesis,
            a: &mut a,
        };
        let watch = FrozenWatch {
            lock: &mut lock_watch,
            keys: key_watch,
            a_owner,
            frozen_at,
            expired: crashed,
        };
        self.watch_while_frozen(&mut held, watch)?;
        self.write_in_turn(&mut stage, &mut a, &mut b)?;
        self.read_back(&mut stage, store, &names)
    }

    /// The run's first events: which run it is and what its lock is, after the checkpoint
    /// before it.
    fn begin(&self, stage: &mut Stage, lock_key: &str, restarting: bool) {
        let fence = self.fence;
        stage.tags().fencing = Some(fence.fenced);
        stage.checkpoint(crate::labs::step::gc_pause::before_run(fence.fenced));
        if restarting {
            stage.tags().store_rule = Some(fence.rule.as_str().into());
            stage.tags().token_source = Some(fence.token_source().into());
        }
        stage.record(Event::new(
            "lab",
            facts::RunFacts {
                run_id: Some(self.run.id.clone()),
                lock_key: Some(lock_key.into()),
                ..facts::RunFacts::default()
            },
            format!("run {}: the lock is the Redis key {lock_key}", self.run.id),
        ));
    }

    /// A's or B's part: take the Redis lock, work, write to the store, release.
    fn holder(
        &self,
        name: &str,
        before_write: BeforeWrite,
        after_write: AfterWrite,
        urls: &Urls,
        names: &Names,
    ) -> HolderScript {
        let (plan, fence) = (self.plan, self.fence);
        HolderScript {
            name: name.into(),
            lock: LockSpec::Redis {
                url: urls.redis.into(),
                key: names.lock.clone(),
                ttl_ms: plan.ttl.as_millis() as u64,
                fence_counter: names.counter.clone(),
                // After a restart B renews its lease: whichever order the writes come in, B
                // writes while its own key is alive, so only A is a stale writer.
                renew: names.restarting && name == "B",
            },
            store_url: urls.postgres.into(),
            run_id: self.run.id.clone(),
            resource: names.resource.clone(),
            wait_ms: (plan.ttl + plan.pause + Duration::from_secs(10)).as_millis() as u64,
            before_write,
            after_write,
            fence_rule: fence.rule,
            token_sequence: names.sequence.clone(),
        }
    }

    /// The plan's faults, each said as the lab tells it.
    fn faults(&self, stage: &Stage) -> Faults<'_> {
        let plan = self.plan;
        let pause = human(plan.pause);
        let faults = Faults::new(&plan.faults(), stage).saying(move |cue| {
            let pid = cue.pid;
            Note::from(match (cue.action.fault, plan.freeze, cue.back_after) {
                (Fault::Pause, Freeze::Peer, _) => {
                    format!("sends SIGSTOP to A (pid {pid}): frozen mid-work for {pause}")
                }
                (Fault::Pause, Freeze::Self_, _) => {
                    format!("sees A (pid {pid}) stopped; will resume it in {pause}")
                }
                (Fault::Restart, _, None) => {
                    format!("SIGKILL → Redis (pid {pid}), then starts it again on the same port")
                }
                (Fault::Restart, _, Some(took)) => format!(
                    "Redis back after {}, empty (no persistence): A's key and the token counter are gone",
                    human(took)
                ),
                _ => format!(
                    "sends SIGCONT to A after {}",
                    human(cue.held.unwrap_or_default())
                ),
            })
        });
        match plan.freeze {
            Freeze::Self_ => faults.self_pausing("A"),
            Freeze::Peer => faults,
        }
    }

    /// `--token-restart`: Redis's own word for how long A's lease would still run (the
    /// lower bound the verdict holds B's grant against), then the crash and restart.
    fn crash_redis(
        &self,
        held: &mut Held,
        lock_watch: &mut RedisLock,
        a_owner: Option<&str>,
        private: &mut PrivateServers,
    ) -> Result<()> {
        let asked_at = Instant::now();
        let (owner, pttl) = lock_watch
            .owner_and_pttl()
            .context("reading A's key in Redis before the crash")?;
        if owner.as_deref() == a_owner && pttl >= 0 {
            let asked_ms = asked_at
                .saturating_duration_since(self.run.started)
                .as_millis() as u64;
            let until = asked_ms + pttl as u64;
            held.stage.record(Event::new(
                "redis",
                Pttl {
                    pttl_ms: pttl,
                    lease_lives_until_ms: Some(until),
                },
                format!(
                    "A's key before the crash: PTTL {pttl}ms, so A's lease runs until at least +{:.3}s",
                    until as f64 / 1000.0
                ),
            ));
        }
        let mut redis = Server::new(private, Backend::Redis, "redis");
        let crashed = Until::acted(Fault::Restart, "redis", Duration::from_secs(30));
        let victims: &mut [&mut dyn Victim] = &mut [&mut *held.a, &mut redis];
        held.stage.play(held.faults, held.nemesis, victims, crashed)
    }

    /// While A is frozen, its key in Redis is watched: the countdown, then the expiry,
    /// then the time left until the resume (a long pause must not look like a hang).
    fn watch_while_frozen(&self, held: &mut Held, mut watch: FrozenWatch) -> Result<()> {
        let plan = self.plan;
        let style = self.run.style;
        let stage = &mut *held.stage;
        let bar = style.progress(plan.ttl.as_millis() as u64, "  {msg} [{bar:30}]");
        stage.timeline.attach_bar(bar);
        let mut counting_down = false;
        let resume_at = watch.frozen_at + plan.pause;
        let resumed = Until::done(plan.pause + Duration::from_secs(15));
        let victims: &mut [&mut dyn Victim] = &mut [&mut *held.a];
        stage.play_ticking(held.faults, held.nemesis, victims, resumed, |stage| {
            if watch.expired {
                if !counting_down {
                    counting_down = true;
                    stage.timeline.clear_bar();
                    let bar = style.progress(plan.pause.as_millis() as u64, "  {msg} [{bar:30}]");
                    stage.timeline.attach_bar(bar);
                }
                if let Some(bar) = stage.timeline.bar() {
                    let left = resume_at.saturating_duration_since(Instant::now());
                    bar.set_position(watch.frozen_at.elapsed().as_millis() as u64);
                    bar.set_message(format!("A stays frozen: SIGCONT in {:>6}", human(left)));
                }
                return Ok(());
            }
            let asked_at = Instant::now();
            let (owner, pttl) = watch
                .lock
                .owner_and_pttl()
                .context("watching the lock in Redis")?;
            if owner != watch.a_owner {
                watch.expired = true;
                stage.timeline.clear_bar();
                let vanished = match &watch.keys {
                    Some(keys) => keys.gone(asked_at)?,
                    None => None,
                };
                if let Some(vanished) = vanished {
                    return Err(vanished.stop_the_lab(&mut *stage, "A"));
                }
                stage.record(Event::new(
                    "redis",
                    Expired {
                        ..Expired::default()
                    },
                    "A's key has expired: for Redis the lock is free",
                ));
            } else {
                if let Some(keys) = watch.keys.as_mut() {
                    keys.present(asked_at, pttl);
                }
                if let Some(bar) = stage.timeline.bar() {
                    bar.set_position(pttl.max(0) as u64);
                    bar.set_message(format!("A's lock in Redis: PTTL {pttl:>5}ms"));
                }
            }
            Ok(())
        })?;
        stage.timeline.clear_bar();
        Ok(())
    }

    /// A wakes and writes; B writes before or after it, as the run's order says; both
    /// release and end.
    fn write_in_turn(
        &self,
        stage: &mut Stage,
        a: &mut WorkerHandle,
        b: &mut WorkerHandle,
    ) -> Result<()> {
        let plan = self.plan;
        if plan.freeze == Freeze::Peer {
            a.tell("finish")?;
        }
        let long = plan.ttl + plan.pause + Duration::from_secs(15);
        stage.wait_for(long, "A to write", |e| e.is("A", Kind::Wrote))?;
        stage.wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
        if self.fence.a_first {
            b.tell("finish")?;
        }
        stage.wait_for(long, "B to write", |e| e.is("B", Kind::Wrote))?;
        b.tell("finish")?;
        stage.wait_for(long, "B to release", |e| e.is("B", Kind::Released))?;
        a.finish(Duration::from_secs(5));
        b.finish(Duration::from_secs(5));
        stage.drain();
        Ok(())
    }

    /// The store's rows read back into the history, and the run's verdict from it.
    fn read_back(&self, stage: &mut Stage, store: &mut Store, names: &Names) -> Result<RunVerdict> {
        let read = store.read_back(&self.run.id, &names.resource)?;
        stage.record_read_back(&names.resource, &read);
        if let Some(sequence) = &names.sequence {
            store.drop_token_sequence(sequence)?;
        }
        let fence = self.fence;
        let setup = Setup {
            store_rule: fence.fenced.then_some(fence.rule.as_str()),
            token_source: fence.fenced.then_some(fence.token_source()),
            token_restart: names.restarting,
        };
        let verdict = RunVerdict::from_history(setup, &stage.log)?;
        if let Some(line) = store_line(&verdict) {
            stage.conclude(line);
        }
        Ok(verdict)
    }
}

/// Where the run's servers are.
struct Urls<'u> {
    redis: &'u str,
    postgres: &'u str,
}

/// The names a run's lock, tokens and rows go by: its own, so that runs never meet.
struct Names {
    lock: String,
    /// The Redis counter tokens come from (fenced, not from a sequence).
    counter: Option<String>,
    /// The store's sequence tokens come from (the fix).
    sequence: Option<String>,
    resource: String,
    restarting: bool,
}

impl Names {
    fn of(play: &Play, restarting: bool) -> Names {
        let (run_id, fence) = (play.run.id.as_str(), play.fence);
        let label = fence.label();
        let counter = (fence.fenced && !fence.sequence).then(|| {
            if restarting {
                format!("lockslab:{run_id}:gc-pause:{label}:fence")
            } else {
                format!("lockslab:{run_id}:gc-pause:fence")
            }
        });
        Names {
            lock: format!("lockslab:{run_id}:gc-pause:{label}:lock"),
            counter,
            sequence: fence
                .sequence
                .then(|| format!("lockslab_gc_pause_{run_id}_{}", label.replace('-', "_"))),
            resource: format!("gc-pause-{label}"),
            restarting,
        }
    }
}

/// What plays faults on A while it is frozen.
struct Held<'h, 'f> {
    stage: &'h mut Stage,
    faults: &'h mut Faults<'f>,
    nemesis: &'h mut Nemesis,
    a: &'h mut WorkerHandle,
}

/// What is watched while A is frozen: its key, and whether it is gone yet.
struct FrozenWatch<'w> {
    lock: &'w mut RedisLock,
    keys: Option<KeyWatch>,
    a_owner: Option<String>,
    frozen_at: Instant,
    expired: bool,
}
