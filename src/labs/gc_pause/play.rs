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
use crate::lock::redis::RedisLock;
use crate::nemesis::victims::Server;
use crate::nemesis::{Fault, Nemesis, Note};
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
        let (plan, fence) = (self.plan, self.fence);
        let run_id = self.run.id.as_str();
        let label = fence.label();
        let mut stage = self.run.stage();
        stage.timeline.say("");
        stage.timeline.say(&self.heading(restart.is_some()));
        let lock_key = format!("lockslab:{run_id}:gc-pause:{label}:lock");
        let restarting = restart.is_some();
        let sequence = fence
            .sequence
            .then(|| format!("lockslab_gc_pause_{run_id}_{}", label.replace('-', "_")));
        if let Some(sequence) = &sequence {
            store.create_token_sequence(sequence)?;
        }
        let role = |name: &str, before_write, after_write| HolderScript {
            name: name.into(),
            lock: LockSpec::Redis {
                url: redis_url.into(),
                key: lock_key.clone(),
                ttl_ms: plan.ttl.as_millis() as u64,
                fence_counter: (fence.fenced && !fence.sequence).then(|| {
                    if restarting {
                        format!("lockslab:{run_id}:gc-pause:{label}:fence")
                    } else {
                        format!("lockslab:{run_id}:gc-pause:fence")
                    }
                }),
                // After a restart B renews its lease: whichever order the writes come in, B
                // writes while its own key is alive, so only A is a stale writer.
                renew: restarting && name == "B",
            },
            store_url: postgres_url.into(),
            run_id: run_id.into(),
            resource: format!("gc-pause-{label}"),
            wait_ms: (plan.ttl + plan.pause + Duration::from_secs(10)).as_millis() as u64,
            before_write,
            after_write,
            fence_rule: fence.rule,
            token_sequence: sequence.clone(),
        };
        let a_script = match plan.freeze {
            Freeze::Self_ => BeforeWrite::FreezeSelf,
            Freeze::Peer => BeforeWrite::WorkUntilTold,
        };
        let mut lock_watch = RedisLock::new(connect::redis(redis_url)?, &lock_key, plan.ttl);

        // Every event of this run says which run it belongs to (both share one clock).
        stage.tags().fencing = Some(fence.fenced);
        stage.checkpoint(crate::labs::step::gc_pause::before_run(fence.fenced));
        if restarting {
            stage.tags().store_rule = Some(fence.rule.as_str().into());
            stage.tags().token_source = Some(fence.token_source().into());
        }
        stage.record(Event::new(
            "lab",
            facts::RunFacts {
                run_id: Some(run_id.into()),
                lock_key: Some(lock_watch.key.clone()),
                ..facts::RunFacts::default()
            },
            format!("run {run_id}: the lock is the Redis key {}", lock_watch.key),
        ));
        // A key deleted, flushed or evicted must not pass for an expiry (not watched on the
        // private Redis that --token-restart crashes on purpose).
        let mut key_watch = if restarting {
            None
        } else {
            Some(KeyWatch::start(redis_url)?)
        };
        let mut a = stage.spawn(
            "A",
            &WorkerSpec::Holder(role("A", a_script, AfterWrite::Release)),
        )?;
        // Declared after A: dropped first, so that a run that fails resumes A before A's
        // handle kills it.
        let mut nemesis = Nemesis::new();
        let pause = human(plan.pause);
        let faults = Faults::new(&plan.faults(), &stage).saying(|cue| {
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
        let mut faults = match plan.freeze {
            Freeze::Self_ => faults.self_pausing("A"),
            Freeze::Peer => faults,
        };
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
        let mut expired = false;
        if let Some(private) = restart {
            // Redis's own word for how long A's lease would still run: the lower bound the
            // verdict holds B's grant against.
            let asked_at = Instant::now();
            let (owner, pttl) = lock_watch
                .owner_and_pttl()
                .context("reading A's key in Redis before the crash")?;
            if owner == a_owner && pttl >= 0 {
                let asked_ms = asked_at
                    .saturating_duration_since(self.run.started)
                    .as_millis() as u64;
                let until = asked_ms + pttl as u64;
                stage.record(
                    Event::new("redis", Pttl { pttl_ms: pttl, lease_lives_until_ms: Some(until) }, format!(
                            "A's key before the crash: PTTL {pttl}ms, so A's lease runs until at least +{:.3}s",
                            until as f64 / 1000.0
                        )),
                );
            }
            let mut redis = Server::new(private, Backend::Redis, "redis");
            let crashed = Until::acted(Fault::Restart, "redis", Duration::from_secs(30));
            stage.play(
                &mut faults,
                &mut nemesis,
                &mut [&mut a, &mut redis],
                crashed,
            )?;
            lock_watch = RedisLock::new(connect::redis(redis_url)?, &lock_key, plan.ttl);
            expired = true;
        }
        // B works until told when A is to write first: A wakes and writes while B holds the
        // lock, as two holders of one reissued token can.
        let b_before = if fence.a_first {
            BeforeWrite::WorkUntilTold
        } else {
            BeforeWrite::Nothing
        };
        let mut b = stage.spawn(
            "B",
            &WorkerSpec::Holder(role("B", b_before, AfterWrite::HoldUntilTold)),
        )?;
        if fence.a_first {
            stage.wait_for(Duration::from_secs(10), "B to take the lock", |e| {
                e.is("B", Kind::Working)
            })?;
        }

        // While A is frozen, watch its key in Redis: the countdown, then the expiry, then
        // the time left until the resume (a long pause must not look like a hang).
        let style = self.run.style;
        let bar = style.progress(plan.ttl.as_millis() as u64, "  {msg} [{bar:30}]");
        stage.timeline.attach_bar(bar);
        let mut counting_down = false;
        let resume_at = frozen_at + plan.pause;
        let resumed = Until::done(plan.pause + Duration::from_secs(15));
        stage.play_ticking(&mut faults, &mut nemesis, &mut [&mut a], resumed, |stage| {
            if expired {
                if !counting_down {
                    counting_down = true;
                    stage.timeline.clear_bar();
                    let bar = style.progress(plan.pause.as_millis() as u64, "  {msg} [{bar:30}]");
                    stage.timeline.attach_bar(bar);
                }
                if let Some(bar) = stage.timeline.bar() {
                    let left = resume_at.saturating_duration_since(Instant::now());
                    bar.set_position(frozen_at.elapsed().as_millis() as u64);
                    bar.set_message(format!("A stays frozen: SIGCONT in {:>6}", human(left)));
                }
                return Ok(());
            }
            let asked_at = Instant::now();
            let (owner, pttl) = lock_watch
                .owner_and_pttl()
                .context("watching the lock in Redis")?;
            if owner != a_owner {
                expired = true;
                stage.timeline.clear_bar();
                let vanished = match &key_watch {
                    Some(watch) => watch.gone(asked_at)?,
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
                if let Some(watch) = key_watch.as_mut() {
                    watch.present(asked_at, pttl);
                }
                if let Some(bar) = stage.timeline.bar() {
                    bar.set_position(pttl.max(0) as u64);
                    bar.set_message(format!("A's lock in Redis: PTTL {pttl:>5}ms"));
                }
            }
            Ok(())
        })?;
        stage.timeline.clear_bar();
        if plan.freeze == Freeze::Peer {
            a.tell("finish")?;
        }
        let long = plan.ttl + plan.pause + Duration::from_secs(15);
        stage.wait_for(long, "A to write", |e| e.is("A", Kind::Wrote))?;
        stage.wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
        if fence.a_first {
            b.tell("finish")?;
        }
        stage.wait_for(long, "B to write", |e| e.is("B", Kind::Wrote))?;
        b.tell("finish")?;
        stage.wait_for(long, "B to release", |e| e.is("B", Kind::Released))?;
        a.finish(Duration::from_secs(5));
        b.finish(Duration::from_secs(5));
        stage.drain();

        let resource = format!("gc-pause-{label}");
        let read = store.read_back(run_id, &resource)?;
        stage.record_read_back(&resource, &read);
        if let Some(sequence) = &sequence {
            store.drop_token_sequence(sequence)?;
        }
        let setup = Setup {
            store_rule: fence.fenced.then_some(fence.rule.as_str()),
            token_source: fence.fenced.then_some(fence.token_source()),
            token_restart: restarting,
        };
        let verdict = RunVerdict::from_history(setup, &stage.log)?;
        if let Some(line) = store_line(&verdict) {
            stage.record(line);
        }
        Ok(verdict)
    }
}
