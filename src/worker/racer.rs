//! The racer's and the naive holder's scripts (lab 2, `naive`): the locks people write
//! first, run by real processes. A racer races for a fresh lock on every trial the lab
//! calls; a holder takes one lock, holds it until told, and lets go — with the broken
//! acquisition or release of `src/lock/redis.rs` or its fix.

use std::io::{self, BufRead};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use nix::time::{ClockId, clock_gettime};
use redis::Connection;
use serde::{Deserialize, Serialize};

use super::await_command;
use crate::connect::{self};
use crate::events::Emitter;
use crate::events::facts::{self, Between, GaveUp, Ready, Trial, Waiting};
use crate::lock::redis::{Held, RETRY_EVERY, RedisLock};
use crate::output::human;

/// A failed Redis command as one line: the step the lab was on, which Redis, and why.
///
/// A `RedisError`'s message already contains its I/O cause, which is also its `source()`,
/// so printing the error with its chain would say the cause twice; this builds the
/// message from text instead.
pub fn redis_failed(step: &str, url: &str, err: &redis::RedisError) -> anyhow::Error {
    if let Some(line) = connect::redis_failure(url, err) {
        anyhow!("{step}: {line}")
    } else {
        anyhow!(
            "{step}: Redis at {} answered with an error: {err}",
            connect::redact(url)
        )
    }
}

/// The same for an error that came up through other code (a worker's lock call): the
/// contexts above the `RedisError` name the step.
pub fn flatten_redis_error(err: anyhow::Error, url: &str) -> anyhow::Error {
    let Some(cause) = err
        .chain()
        .find_map(|e| e.downcast_ref::<redis::RedisError>())
    else {
        return err;
    };
    let steps: Vec<String> = err
        .chain()
        .take_while(|e| !e.is::<redis::RedisError>())
        .map(ToString::to_string)
        .collect();
    let step = if steps.is_empty() {
        "a Redis command".to_string()
    } else {
        steps.join(": ")
    };
    redis_failed(&step, url, cause)
}

/// The name of a run, in keys, trial commands and `--json` events.
pub fn variant_name(fixed: bool) -> &'static str {
    if fixed { "fixed" } else { "broken" }
}

/// One worker's script.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Role {
    pub name: String,
    pub redis_url: String,
    pub script: Script,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "script", rename_all = "snake_case")]
pub enum Script {
    /// Races for a fresh lock whenever the lab says `trial <n> <broken|fixed>`.
    Racer {
        /// Keys of trial n are `<prefix>:<variant>:<n>:lock` and `…:holders`.
        prefix: String,
        spread_us: u64,
        window_us: u64,
        work_ms: u64,
        ttl_ms: u64,
    },
    /// Takes one lock, holds it until told `finish`, releases it.
    Holder(Holder),
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Holder {
    pub key: String,
    /// The list of `+name` / `-name` entries the holders write: who believed they held the
    /// lock, in the order Redis received the entries.
    pub holders: String,
    pub acquire: Acquire,
    pub release: Release,
    pub ttl_ms: u64,
    /// How long to keep trying; zero means one try.
    pub wait_ms: u64,
    /// With SETNX-then-PEXPIRE: stop between the two commands until told `expire`.
    pub stop_between: bool,
}

/// How a holder takes the lock.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Acquire {
    /// ❌ [`RedisLock::try_acquire_setnx`]
    Setnx,
    /// ❌ [`RedisLock::try_acquire_setnx_then_expire`]
    SetnxThenExpire,
    /// ✅ [`RedisLock::try_acquire`]
    SetNxPx,
}

/// How a holder lets go.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Release {
    /// ❌ [`RedisLock::release_by_del`]
    Del,
    /// ✅ [`RedisLock::release`]
    CompareAndDelete,
}

/// This machine's `CLOCK_MONOTONIC` in nanoseconds: one clock shared by every process here,
/// so stamps taken by different workers can be compared.
pub fn monotonic_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// A random pause in [0, limit): when this worker arrives in a trial.
fn random_below(limit: Duration) -> Duration {
    let mut bytes = [0u8; 8];
    if limit.is_zero() || crate::seed::fill(&mut bytes).is_err() {
        return Duration::ZERO;
    }
    let micros = limit.as_micros().max(1) as u64;
    Duration::from_micros(u64::from_le_bytes(bytes) % micros)
}

/// Appends `entry` to a holders list; the list expires on its own if the lab is interrupted.
fn note_holder(redis: &mut Connection, list: &str, entry: String) -> Result<()> {
    redis::pipe()
        .cmd("RPUSH")
        .arg(list)
        .arg(entry)
        .ignore()
        .cmd("EXPIRE")
        .arg(list)
        .arg(600)
        .ignore()
        .query::<()>(redis)
        .context("noting the holder in Redis")
}

/// The worker script.
pub fn run(role: &Role) -> Result<()> {
    let me = Emitter::new(&role.name);
    let result = match &role.script {
        Script::Racer {
            prefix,
            spread_us,
            window_us,
            work_ms,
            ttl_ms,
        } => race(
            &me,
            &role.redis_url,
            prefix,
            Duration::from_micros(*spread_us),
            Duration::from_micros(*window_us),
            Duration::from_millis(*work_ms),
            Duration::from_millis(*ttl_ms),
        ),
        Script::Holder(holder) => hold(&me, &role.redis_url, holder),
    };
    result.map_err(|err| flatten_redis_error(err, &role.redis_url))
}

/// A racer: one attempt per `trial` command, reported as one (unshown) `trial` event.
fn race(
    me: &Emitter,
    redis_url: &str,
    prefix: &str,
    spread: Duration,
    window: Duration,
    work: Duration,
    ttl: Duration,
) -> Result<()> {
    let mut lock = RedisLock::new(connect::redis(redis_url)?, "", ttl);
    let mut notes = connect::redis(redis_url)?;
    me.send(me.event(
        Ready {
            pid: std::process::id() as i32,
        },
        "ready to race",
    ));
    for line in io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let (trial, fixed) = match words.as_slice() {
            ["trial", n, variant] => (n.parse::<u32>()?, *variant == "fixed"),
            ["quit"] => break,
            _ => bail!("unknown command {line:?}"),
        };
        let variant = variant_name(fixed);
        lock.key = format!("{prefix}:{variant}:{trial}:lock");
        let holders = format!("{prefix}:{variant}:{trial}:holders");

        thread::sleep(random_below(spread));
        let start_ns = monotonic_ns();
        let held = if fixed {
            // The same delay as the broken run's window, but before the one command:
            // there is no gap inside the acquisition for it to widen.
            thread::sleep(window);
            lock.try_acquire()?
        } else {
            lock.try_acquire_get_then_set(window)?
        };
        let mut report = Trial {
            trial,
            start_ns,
            answer_ns: monotonic_ns(),
            acquired: held.is_some(),
            ..Trial::default()
        };
        if let Some(held) = held {
            let enter_ns = monotonic_ns();
            note_holder(&mut notes, &holders, format!("+{}", me.name()))?;
            thread::sleep(work);
            note_holder(&mut notes, &holders, format!("-{}", me.name()))?;
            let leave_ns = monotonic_ns();
            let released = lock.release(&held)?;
            report.enter_ns = Some(enter_ns);
            report.leave_ns = Some(leave_ns);
            report.released = Some(released);
        }
        let mut report = me.event(report, "");
        report.part.variant = Some(variant.to_string());
        me.send(report);
    }
    Ok(())
}

/// A holder: take the lock (trying for up to `wait`), hold it until told `finish`, release.
fn hold(me: &Emitter, redis_url: &str, script: &Holder) -> Result<()> {
    let Holder {
        key,
        holders,
        acquire,
        release,
        stop_between,
        ..
    } = script;
    let (acquire, release, stop_between) = (*acquire, *release, *stop_between);
    let ttl = Duration::from_millis(script.ttl_ms);
    let wait = Duration::from_millis(script.wait_ms);
    let mut lock = RedisLock::new(connect::redis(redis_url)?, key, ttl);
    let mut notes = connect::redis(redis_url)?;
    me.send(me.event(
        Waiting {
            pid: Some(std::process::id() as i32),
            ..Waiting::default()
        },
        "tries to take the lock",
    ));
    let ttl_ms = ttl.as_millis();
    let started = Instant::now();
    let mut tries = 0u32;
    // One owner value for this whole acquisition, sent by every try (see `try_acquire_as`).
    let owner = crate::lock::random_owner();
    let held = loop {
        tries += 1;
        let held = match acquire {
            Acquire::Setnx => lock.try_acquire_setnx()?,
            Acquire::SetNxPx => lock.try_acquire_as(&owner)?,
            Acquire::SetnxThenExpire => lock.try_acquire_setnx_then_expire(|held: &Held| {
                if stop_between {
                    me.send(
                        me.event(
                            Between {
                                lock: Some(key.to_string()),
                                owner: Some(held.owner.clone()),
                                backend: Some("redis".into()),
                            },
                            "SETNX answered 1: it holds the lock, with no expiry yet; PEXPIRE comes next",
                        ),
                    );
                    await_command("expire")?;
                }
                Ok(())
            })?,
        };
        if held.is_some() || started.elapsed() >= wait {
            break held;
        }
        thread::sleep(RETRY_EVERY);
    };
    let waited = started.elapsed();
    let Some(held) = held else {
        let text = if tries == 1 {
            "tries once: the lock is taken, so it goes away".to_string()
        } else {
            format!(
                "gives up after {tries} tries in {}: the lock stayed taken",
                human(waited)
            )
        };
        me.send(me.event(
            GaveUp {
                waited_ms: Some(waited.as_millis() as u64),
                tries: Some(tries.into()),
                ..GaveUp::default()
            },
            text,
        ));
        return Ok(());
    };
    let how = match acquire {
        Acquire::Setnx => "SETNX; the key has no expiry".to_string(),
        Acquire::SetnxThenExpire => format!("SETNX, then PEXPIRE {ttl_ms}"),
        Acquire::SetNxPx => format!("SET NX PX {ttl_ms}"),
    };
    let after = if tries > 1 {
        format!(" after waiting {} ({tries} tries)", human(waited))
    } else {
        String::new()
    };
    let enter_ns = monotonic_ns();
    note_holder(&mut notes, holders, format!("+{}", me.name()))?;
    me.send(me.event(
        facts::Acquired {
            lock: Some(key.to_string()),
            owner: Some(held.owner.clone()),
            backend: Some("redis".into()),
            waited_ms: Some(waited.as_millis() as u64),
            tries: Some(tries.into()),
            enter_ns: Some(enter_ns),
            ..Default::default()
        },
        format!("took the lock ({how}){after}; works while holding it"),
    ));

    await_command("finish")?;
    note_holder(&mut notes, holders, format!("-{}", me.name()))?;
    let leave_ns = monotonic_ns();
    let deleted = match release {
        Release::Del => lock.release_by_del()?,
        Release::CompareAndDelete => lock.release(&held)?,
    };
    let text = match (release, deleted) {
        (Release::Del, true) => {
            "finishes and releases with DEL (no owner check): a key was deleted"
        }
        (Release::Del, false) => "finishes and releases with DEL: there was no key left to delete",
        (Release::CompareAndDelete, true) => {
            "finishes and releases with compare-and-delete: its own key is deleted"
        }
        (Release::CompareAndDelete, false) => {
            "finishes; compare-and-delete finds another owner's value and returns 0: nothing deleted"
        }
    };
    me.send(me.event(
        facts::Released {
            deleted: Some(deleted),
            leave_ns: Some(leave_ns),
            ..Default::default()
        },
        text,
    ));
    Ok(())
}
