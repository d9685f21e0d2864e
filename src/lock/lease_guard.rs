//! Lease guards: the checks a holder of a Redis lock ([`super::redis`]) makes before it
//! writes, short of fencing — and the gap each one leaves. Lab 9 (`lockslab lease-guard`)
//! plays every guard against every fault and reads the store back.
//!
//! A lease is a promise with a clock in it: "the lock is yours for `ttl`, counted by the
//! lock service". The holder has to guess, on its own clocks, when that promise runs out.
//! Every guard below is a way of guessing; the question each answers is "may I still
//! write?". None can answer it for the moment of the write itself: a holder paused
//! *after* its check and *before* its write (a GC pause, a page fault, a slow network)
//! writes with a lease that ran out in between. Only the resource can refuse that write,
//! which is what a fencing token is for ([`Guard::Fencing`], the reference).
//!
//! ```text
//!  grant ── work ─────────── check ──❄ pause ❄── write      the check passed; the write is stale
//!  |<─────── ttl ──────────>|
//! ```

use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::redis::{Held, RedisLock};

/// The check a holder makes before it writes.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Guard {
    /// ❌ No check: the holder writes when its work is done, whatever became of its lease.
    #[value(help = "❌ writes whatever became of its lease")]
    None,
    /// ❌ A deadline on the **wall clock**: `SystemTime::now() + ttl` when the grant came back,
    /// compared with `SystemTime::now()` before the write. The wall clock is not a stopwatch:
    /// NTP steps it, an operator sets it, a VM resumes with it wrong. Stepped back, it tells the
    /// holder it has time it does not have. (It also counts from the grant's *arrival*, not
    /// from the request's send, so it forgets the time the request spent on the way.)
    #[value(help = "❌ grant's wall-clock time + TTL, against the wall clock now")]
    WallDeadline,
    /// ⚠️ A deadline on the **monotonic clock**, counted from when the request was *sent*
    /// (the lease may have started any time after that), minus a safety margin for the
    /// difference between the holder's and the lock service's clock rates. A monotonic
    /// clock never goes back and keeps counting while the process is stopped, so a pause
    /// before the check shows. What it cannot see: a pause after the check, and on Linux
    /// a suspended machine (`CLOCK_MONOTONIC` stops during a suspend; `CLOCK_BOOTTIME`
    /// does not).
    #[value(help = "⚠️ the request's send + TTL − margin, on the monotonic clock")]
    MonotonicDeadline,
    /// ⚠️ Ask the lock service: is the key still ours (`GET`), with more than the margin
    /// left (`PTTL`)? The service's own answer, on the service's clock — still only true
    /// when the answer was given, and a round trip old when it arrives.
    #[value(help = "⚠️ asks Redis: the key still ours, PTTL above the margin?")]
    CheckOwner,
    /// ✅ The reference: no guess at all. The token drawn with the lock goes with the
    /// write, and the store refuses a token lower than one it has accepted. The only
    /// guard that stands where the write lands.
    #[value(help = "✅ the reference: the store refuses a lower token")]
    Fencing,
}

impl Guard {
    pub const ALL: [Guard; 5] = [
        Guard::None,
        Guard::WallDeadline,
        Guard::MonotonicDeadline,
        Guard::CheckOwner,
        Guard::Fencing,
    ];

    /// Its name on the command line, in `--json` and on the verdict's table.
    pub fn as_str(self) -> &'static str {
        match self {
            Guard::None => "none",
            Guard::WallDeadline => "wall-deadline",
            Guard::MonotonicDeadline => "monotonic-deadline",
            Guard::CheckOwner => "check-owner",
            Guard::Fencing => "fencing",
        }
    }
}

/// A lease as the holder sees it: when it asked, on both its clocks.
#[derive(Clone, Copy, Debug)]
pub struct Lease {
    /// The monotonic clock just before the `SET NX PX` went out.
    pub sent: Instant,
    /// The wall clock when the grant came back (what the ❌ wall deadline counts from).
    pub granted_wall: SystemTime,
    pub ttl: Duration,
    /// How much of the lease the guards give up to clock drift and slow replies.
    pub margin: Duration,
}

/// What a guard decided, and what it believed.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub write: bool,
    /// How much of the lease the guard believed was left (ms, negative once past); None for
    /// a guard that does not count (none, fencing).
    pub believed_left_ms: Option<i64>,
    /// Why, in a sentence for the timeline.
    pub why: String,
}

impl Guard {
    /// May the holder write now? `lock` and `held` are asked only by [`Guard::CheckOwner`].
    pub fn decide(self, lease: &Lease, lock: &mut RedisLock, held: &Held) -> Result<Decision> {
        let margin_ms = lease.margin.as_millis() as i64;
        Ok(match self {
            Guard::None => Decision {
                write: true,
                believed_left_ms: None,
                why: "no guard: writes".into(),
            },
            Guard::Fencing => Decision {
                write: true,
                believed_left_ms: None,
                why: "no guess: writes with its token and lets the store decide".into(),
            },
            Guard::WallDeadline => {
                let deadline = lease.granted_wall + lease.ttl;
                let left_ms = match deadline.duration_since(SystemTime::now()) {
                    Ok(left) => left.as_millis() as i64,
                    Err(past) => -(past.duration().as_millis() as i64),
                };
                Decision {
                    write: left_ms > 0,
                    believed_left_ms: Some(left_ms),
                    why: format!("the wall clock says {left_ms}ms of the lease are left"),
                }
            }
            Guard::MonotonicDeadline => {
                let deadline = lease.sent + lease.ttl.saturating_sub(lease.margin);
                let now = Instant::now();
                let left_ms = if now < deadline {
                    (deadline - now).as_millis() as i64
                } else {
                    -((now - deadline).as_millis() as i64)
                };
                Decision {
                    write: left_ms > 0,
                    believed_left_ms: Some(left_ms),
                    why: format!(
                        "the monotonic clock, counted from the send, minus the {margin_ms}ms margin, says {left_ms}ms are left"
                    ),
                }
            }
            Guard::CheckOwner => {
                let (owner, pttl) = lock.owner_and_pttl()?;
                let ours = owner.as_deref() == Some(held.owner.as_str());
                let left_ms = if ours { pttl - margin_ms } else { -1 };
                Decision {
                    write: ours && left_ms > 0,
                    believed_left_ms: Some(left_ms),
                    why: if ours {
                        format!(
                            "Redis says the key is still ours, PTTL {pttl}ms ({left_ms}ms past the margin)"
                        )
                    } else {
                        "Redis says the key is no longer ours".into()
                    },
                }
            }
        })
    }
}
