//! A guarded holder (lab 9): takes a Redis lock, works until told, lets its lease guard
//! ([`crate::lock::lease_guard`]) decide whether it may still write, then writes or
//! gives up. It can stop itself (SIGSTOP) at an exact point: before the guard's check, or
//! between the check and the write.
//!
//! Every decision goes out as an event with what the guard believed and, asked just
//! after, what Redis said of the key: the evidence of whether an abort was needed.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::await_command;
use crate::connect;
use crate::events::facts::{self, FaultFacts, GuardDecided, Waiting, Wrote};
use crate::events::{Emitter, What};
use crate::lock::lease_guard::{self, Guard, Heartbeat, Lease, Sampler, Watch};
use crate::lock::redis::{Held, RedisLock, Release};
use crate::output::human;
use crate::store::{FenceRule, Store};

/// Where the holder stops itself, if anywhere.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopAt {
    Nowhere,
    /// After its work, before its guard looks.
    BeforeCheck,
    /// After its guard said yes, before the write goes out.
    AfterCheck,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct GuardedScript {
    pub name: String,
    pub redis_url: String,
    pub key: String,
    pub ttl_ms: u64,
    pub margin_ms: u64,
    pub guard: Guard,
    /// The fencing counter, for [`Guard::Fencing`].
    pub fence_counter: Option<String>,
    pub store_url: String,
    pub run_id: String,
    pub resource: String,
    pub stop_at: StopAt,
    /// The lock-delay D, for [`Guard::LockDelay`].
    #[serde(default)]
    pub lock_delay_ms: u64,
    /// Say so (an A `resumed` event) each time its clock sampler runs after a gap of at
    /// least this many ms: under lab 9's stall, the proof that A runs again, from which the
    /// nemesis times its next stop. A sampler runs for this even under guards that do not
    /// look at it.
    #[serde(default)]
    pub say_runs_again_after_ms: Option<u64>,
}

pub fn run(script: &GuardedScript) -> Result<()> {
    let me = Emitter::new(&script.name);
    let mut store = Store::connect(&script.store_url)?;
    let ttl = Duration::from_millis(script.ttl_ms);
    // Under lock-delay the key outlives the lease A is promised (and counts) by D.
    let key_lives = match script.guard {
        Guard::LockDelay => {
            lease_guard::lock_delay_lifetime(ttl, Duration::from_millis(script.lock_delay_ms))
        }
        _ => ttl,
    };
    let mut lock = RedisLock::new(connect::redis(&script.redis_url)?, &script.key, key_lives);
    me.say(
        Waiting {
            pid: Some(std::process::id() as i32),
            ..Waiting::default()
        },
        format!(
            "asks for the lock (SET NX PX {}), guarded by: {}",
            key_lives.as_millis(),
            script.guard.as_str()
        ),
    );
    // The lease may start any time after the request leaves: count from here.
    let sent = Instant::now();
    let held = lock
        .acquire_within(Duration::from_secs(5), script.fence_counter.as_deref())?
        .context("the lock was not free within 5s")?;
    let granted = Instant::now();
    let lease = Lease {
        sent,
        granted_wall: SystemTime::now(),
        ttl,
        margin: Duration::from_millis(script.margin_ms),
    };
    me.send(me.event(
        facts::Acquired {
            lock: Some(script.key.clone()),
            token: held.token,
            owner: Some(held.owner.clone()),
            backend: Some("redis".into()),
            ..Default::default()
        },
        match held.token {
            Some(token) => format!("took the lock (TTL {}), fencing token {token}", human(ttl)),
            None => format!("took the lock (TTL {})", human(ttl)),
        },
    ));
    let sampler = match script.say_runs_again_after_ms {
        Some(gap_from_ms) => {
            let name = script.name.clone();
            Some(Sampler::start_telling(
                Duration::from_millis(gap_from_ms),
                move |gap| {
                    let me = Emitter::new(&name);
                    me.send(me.event(
                        What::Resumed(FaultFacts::paused_for(gap)),
                        format!("runs again: its clock sampler saw a {} gap", human(gap)),
                    ));
                },
            ))
        }
        None => (script.guard == Guard::PauseDetect).then(Sampler::start),
    };
    let heartbeat = match script.guard {
        Guard::RenewThird => Some(Heartbeat::start(
            RedisLock::new(connect::redis(&script.redis_url)?, &script.key, ttl),
            held.clone(),
            &lease,
        )),
        _ => None,
    };
    me.say(What::Working, "works while holding the lock");
    await_command("finish")?;

    if script.stop_at == StopAt::BeforeCheck {
        stop_here(
            &me,
            "finishes its work and, before its guard looks, stops dead (SIGSTOP)",
        )?;
    }
    let watch = Watch {
        sampler: sampler
            .as_ref()
            .filter(|_| script.guard == Guard::PauseDetect),
        heartbeat: heartbeat.as_ref(),
    };
    let decision = script.guard.decide(&lease, &mut lock, &held, &watch)?;
    let checked = Instant::now();
    let wall_skew_ms = wall_skew_ms(&lease, granted);
    // Redis's word at the same moment, for the verdict: was an abort needed?
    let (owner, pttl) = lock.owner_and_pttl().context("reading the lock back")?;
    me.send(
        me.event(
            GuardDecided {
                guard: script.guard,
                write: decision.write,
                believed_left_ms: decision.believed_left_ms,
                key_ours: Some(owner.as_deref() == Some(held.owner.as_str())),
                pttl_ms: Some(pttl),
                since_send_ms: sent.elapsed().as_millis() as u64,
                wall_clock_ms: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .ok()
                    .map(|since| since.as_millis() as i64),
                gap_ms: decision.gap_ms,
                wall_skew_ms,
            },
            format!(
                "guard {}: {} → {}",
                script.guard.as_str(),
                decision.why,
                if decision.write { "writes" } else { "gives up" }
            ),
        ),
    );
    if decision.write {
        if script.stop_at == StopAt::AfterCheck {
            stop_here(
                &me,
                "its guard said yes; before the write goes out, it stops dead (SIGSTOP)",
            )?;
        }
        let checked = script.guard.looks().then_some(checked);
        write(script, &me, &mut store, &held, checked)?;
    }
    if let Some(heartbeat) = heartbeat {
        heartbeat.stop();
    }
    release(&me, &mut lock, &held)
}

/// How far the wall clock moved against the monotonic clock since the grant (both read
/// there): zero on a true clock, the step or the rate's share under a clock fault.
fn wall_skew_ms(lease: &Lease, granted: Instant) -> Option<i64> {
    let monotonic = granted.elapsed().as_millis() as i64;
    let wall = match SystemTime::now().duration_since(lease.granted_wall) {
        Ok(ahead) => ahead.as_millis() as i64,
        Err(behind) => -(behind.duration().as_millis() as i64),
    };
    Some(wall - monotonic)
}

/// Stops this very process with SIGSTOP, and says how long it was gone when it wakes.
fn stop_here(me: &Emitter, words: &str) -> Result<()> {
    me.say(What::Freezing, words);
    let frozen_at = Instant::now();
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP).context("raising SIGSTOP")?;
    let gap = frozen_at.elapsed();
    me.send(me.event(
        What::Resumed(FaultFacts::paused_for(gap)),
        format!("wakes after {}", human(gap)),
    ));
    Ok(())
}

fn write(
    script: &GuardedScript,
    me: &Emitter,
    store: &mut Store,
    held: &Held,
    checked: Option<Instant>,
) -> Result<()> {
    let value = format!("{}'s result", script.name);
    let after_check = checked.map(|checked| checked.elapsed());
    let outcome = store.write_under(
        FenceRule::NotLower,
        &script.run_id,
        &script.resource,
        &script.name,
        &value,
        held.token,
    );
    me.send(me.event(
        Wrote {
            token: held.token,
            value: Some(value.clone()),
            after_check_ms: after_check.map(|gap| gap.as_millis() as u64),
            ..Wrote::new(outcome)
        },
        format!(
            "writes '{value}'{}: the store says {}",
            after_check
                .map(|gap| format!(" {} after its guard's check", human(gap)))
                .unwrap_or_default(),
            outcome.as_str()
        ),
    ));
    Ok(())
}

fn release(me: &Emitter, lock: &mut RedisLock, held: &Held) -> Result<()> {
    let found = lock.release_reporting(held)?;
    let (kept, found_owner, text) = match found {
        Release::Deleted => (true, None, "releases the lock (its key was still its own)"),
        Release::HeldBy(owner) => (
            false,
            Some(owner),
            "tries to release: the key holds another owner now",
        ),
        Release::Gone => (false, None, "tries to release: its key is gone"),
    };
    me.send(me.event(
        facts::Released {
            released: Some(kept),
            found_owner,
            ..Default::default()
        },
        text,
    ));
    Ok(())
}
