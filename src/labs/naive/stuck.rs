//! no-ttl and setnx-expire: A takes the lock and is killed holding it (or between SETNX and
//! PEXPIRE); B tries for `--wait`. The verdict is the key itself, read back: does it still
//! name the dead A (see [`crate::check::naive::dead_owner`])?

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::verdict::{Evidence, StuckEvidence, Tally};
use super::{Play, RedisStep, Scenario, pttl_text, whose};
use crate::check::Finding;
use crate::check::naive as checks;
use crate::connect::RedisConn;
use crate::events::What;
use crate::events::facts::{Observed, Pttl};
use crate::events::{Event, Kind};
use crate::labs::Stage;
use crate::labs::faults::{Faults, Until};
use crate::lock::redis::owner_and_pttl;
use crate::nemesis::schedule::{Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note};
use crate::output::human;
use crate::redis_health::KeyWatch;
use crate::worker::racer::{Acquire, Holder, Release};

/// The stuck runs' one fault: A killed as soon as the lab has read its key's PTTL.
fn kill_a() -> Schedule {
    Schedule::new(vec![Step {
        at_ms: 0,
        after: None,
        fault: Fault::Kill,
        target: "A".into(),
        duration_ms: None,
    }])
}

impl Play<'_> {
    /// A takes the lock and is killed holding it; B tries for `--wait`. Broken: B gives
    /// up and the key still names the dead A, with PTTL -1. Fixed: the key lapses after
    /// its TTL and B gets the lock.
    pub(super) fn stuck(&self, scenario: Scenario, fixed: bool) -> Result<Tally> {
        let args = self.plan;
        let mut stage = self.stage(scenario, fixed);
        let acquire = match (scenario, fixed) {
            (_, true) => Acquire::SetNxPx,
            (Scenario::SetnxExpire, false) => Acquire::SetnxThenExpire,
            _ => Acquire::Setnx,
        };
        let key = self.key(scenario, fixed, "lock");
        let url = self.redis_url.as_str();
        let mut redis = self.redis()?;

        let holder = self.holder(scenario, fixed, acquire, Release::CompareAndDelete);
        let a_script = Holder {
            stop_between: true,
            ..holder.clone()
        };
        // A key deleted, flushed or evicted must not pass for one that lapsed.
        let mut key_watch = KeyWatch::start(url)?;
        let mut a = stage.spawn("A", &self.spec("A", a_script))?;
        // With SETNX-then-PEXPIRE, A stops between the two commands and says so; the
        // lab kills it right there. Otherwise A stops after taking the lock.
        let took = stage.wait_for(Duration::from_secs(10), "A to take the lock", |e| {
            e.worker == "A" && (e.kind() == Kind::Acquired || e.kind() == Kind::Between)
        })?;
        let a_owner = took.owner().map(String::from);
        record_pttl(&mut stage, &mut redis, &key, url)?;
        let where_ = match acquire {
            Acquire::SetnxThenExpire => "between SETNX and PEXPIRE: the PEXPIRE is never sent",
            _ => "while it holds the lock: its release never runs",
        };
        let mut faults = Faults::new(&kill_a(), &stage)
            .saying(|cue| Note::from(format!("SIGKILL to A (pid {}) {where_}", cue.pid)));
        let killed = Until::done(Duration::from_secs(5));
        stage.play(&mut faults, &mut Nemesis::new(), &mut [&mut a], killed)?;
        let killed_at = Instant::now();

        let mut b = stage.spawn("B", &self.spec("B", holder))?;
        let mut watch = Watch {
            redis: &mut redis,
            url,
            key: &key,
            a_owner: a_owner.as_deref(),
            keys: &mut key_watch,
            killed_at,
            gone_at: None,
        };
        let b_result = self.wait_for_b(&mut stage, &mut watch)?;
        let b_owner = b_result.owner().map(String::from);
        let (dead_owner, pttl) = self.read_the_lock_back(&mut stage, &mut watch, b_owner)?;
        if b_result.kind() == Kind::Acquired {
            b.tell("finish")?;
            stage.wait_for(Duration::from_secs(5), "B to release", |e| {
                e.is("B", Kind::Released)
            })?;
        }
        b.finish(Duration::from_secs(5));
        stage.drain();

        let waited_ms = match &b_result.what {
            What::Acquired(got) => got.waited_ms,
            What::GaveUp(gave_up) => gave_up.waited_ms,
            _ => None,
        }
        .unwrap_or(0);
        // From A's kill to B's grant, on the run's clock: B starts after the kill and asks
        // from then, so its own wait is the shorter of the two.
        let killed_t = (stage.log.iter().rev())
            .find(|e| e.worker == "lab" && e.kind() == Kind::Killed)
            .map(|e| e.t_ms);
        let granted_after_kill_ms = killed_t
            .filter(|_| b_result.kind() == Kind::Acquired)
            .map(|killed| b_result.t_ms.saturating_sub(killed));
        let evidence = StuckEvidence {
            next_holder_got_lock: b_result.kind() == Kind::Acquired,
            waited_ms,
            granted_after_kill_ms,
            pttl_ms_after_wait: pttl,
            ttl_ms: args.ttl.as_millis() as u64,
        };
        Ok(Tally::new(dead_owner as u32, 1, Evidence::Stuck(evidence)))
    }

    /// The evidence: who the key names now, and whether it will ever expire — Redis's
    /// answers, recorded. A key that vanished (deleted, flushed, evicted) stops the lab.
    fn read_the_lock_back(
        &self,
        stage: &mut Stage,
        watch: &mut Watch,
        b_owner: Option<String>,
    ) -> Result<(bool, i64)> {
        let (owner, pttl) = owner_and_pttl(watch.redis, watch.key)
            .step(watch.url, "reading the lock back from Redis")?;
        let a_owner = watch.a_owner.map(String::from);
        let dead_owner = checks::dead_owner(owner.as_deref(), watch.a_owner) == Finding::Yes;
        let since_kill = watch.killed_at.elapsed();
        let read = format!(
            "GET → {}, PTTL → {}",
            whose(owner.as_deref(), &[("A", &a_owner), ("B", &b_owner)]),
            pttl_text(pttl)
        );
        if !dead_owner
            && let Some(gone_at) = watch.gone_at
            && let Some(vanished) = watch.keys.gone(gone_at)?
        {
            return Err(vanished.stop_the_lab(stage, "A"));
        }
        let text = if dead_owner {
            let never = if pttl == -1 {
                ", and no expiry will free it"
            } else {
                ""
            };
            let since = human(since_kill);
            format!("{read}: {since} after A died the lock still belongs to it{never}")
        } else {
            let ttl = human(self.plan.ttl);
            format!("{read}: A's key is gone, lapsed with its TTL of {ttl}")
        };
        stage.record(Event::new(
            "redis",
            What::RedisRead(Observed {
                dead_owner: Some(dead_owner),
                key_owner: owner,
                pttl_ms: Some(pttl),
                ..Observed::default()
            }),
            text,
        ));
        Ok((dead_owner, pttl))
    }

    /// B tries for the lock while lockslab watches A's key (its PTTL on the bar, and when
    /// it went): until B takes the lock or gives up.
    fn wait_for_b(&self, stage: &mut Stage, watch: &mut Watch) -> Result<Event> {
        let wait = self.plan.wait;
        let bar = self
            .style
            .progress(wait.as_millis() as u64, "  {msg} [{bar:30}]");
        stage.timeline.attach_bar(bar);
        let deadline = Instant::now() + wait + Duration::from_secs(10);
        let mut last_look = Instant::now() - Duration::from_secs(1);
        let b_result = (|| loop {
            if let Some(event) = stage.next(Duration::from_millis(10)) {
                if event.kind() == Kind::Error {
                    return Err(crate::labs::worker_failed(&event.worker, &event.text));
                }
                if event.worker == "B"
                    && (event.kind() == Kind::Acquired || event.kind() == Kind::GaveUp)
                {
                    if event.kind() == Kind::Acquired {
                        watch.gone_at.get_or_insert_with(Instant::now);
                    }
                    return Ok(event);
                }
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for B to take the lock or give up");
            }
            if last_look.elapsed() >= Duration::from_millis(50) {
                last_look = Instant::now();
                let (owner, pttl) = owner_and_pttl(watch.redis, watch.key)
                    .step(watch.url, "watching A's key's PTTL while B waits")?;
                if owner.is_some() && owner.as_deref() == watch.a_owner {
                    watch.keys.present(last_look, pttl);
                } else {
                    watch.gone_at.get_or_insert(last_look);
                }
                if let Some(bar) = stage.timeline.bar() {
                    bar.set_position(watch.killed_at.elapsed().as_millis() as u64);
                    bar.set_message(format!("B keeps trying; A's key: PTTL {}", pttl_text(pttl)));
                }
            }
        })();
        stage.timeline.clear_bar();
        b_result
    }
}

/// A's key as lockslab watches it while B waits: when it went (None: not seen gone yet),
/// to tell a lapse from a key that vanished.
struct Watch<'w> {
    redis: &'w mut RedisConn,
    url: &'w str,
    key: &'w str,
    a_owner: Option<&'w str>,
    keys: &'w mut KeyWatch,
    killed_at: Instant,
    gone_at: Option<Instant>,
}

/// Redis's own word on A's key just after A took the lock: will it ever expire?
fn record_pttl(stage: &mut Stage, redis: &mut RedisConn, key: &str, url: &str) -> Result<()> {
    let pttl: i64 = redis::cmd("PTTL")
        .arg(key)
        .query(redis)
        .step(url, "reading A's key's PTTL after it took the lock")?;
    stage.record(Event::new(
        "redis",
        Pttl {
            pttl_ms: pttl,
            ..Pttl::default()
        },
        match pttl {
            -1 => "PTTL → -1: the key exists and has no expiry".to_string(),
            -2 => "PTTL → -2: there is no key".to_string(),
            ms => format!("PTTL → {ms}ms: the key will expire by itself"),
        },
    ));
    Ok(())
}
