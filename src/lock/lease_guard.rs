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

use anyhow::{Context, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::redis::{Held, RedisLock, Renewal};

/// The check a holder makes before it writes.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Guard {
    /// ❌ No check: the holder writes when its work is done, whatever became of its lease.
    #[value(help = "❌ writes whatever became of its lease")]
    None,
    /// ❌ A deadline on the **wall clock**: `SystemTime::now() + ttl − margin` when the grant
    /// came back, compared with `SystemTime::now()` before the write. The wall clock is not a
    /// stopwatch: NTP steps it, an operator sets it, a VM resumes with it wrong. Stepped back,
    /// it tells the holder it has time it does not have; the margin absorbs a step smaller
    /// than itself plus how late past the lease the check comes, and no more. (It also
    /// counts from the grant's *arrival*, not from the request's send, so it forgets the
    /// time the request spent on the way.)
    #[value(help = "❌ grant's wall-clock time + TTL − margin, against the wall clock now")]
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
    /// ⚠️ **Pause detection**: a thread samples the monotonic clock every
    /// [`SAMPLE_EVERY`] while the holder works, and the check looks for a gap between two
    /// samples wider than the margin (the process was not running: a stop, a GC pause, a
    /// starved container). It sees a pause that ended before the check; it does not see
    /// slow work that never stopped (it knows nothing of the lease), nor a pause after the
    /// check. A busy machine's scheduling gaps look like pauses too: its cost is false
    /// alarms, work thrown away that was safe.
    #[value(help = "⚠️ aborts if the monotonic clock jumped between two samples")]
    PauseDetect,
    /// ⚠️ **Renew at ⅓ of the lease; stop once a renewal is refused or the heartbeat gives
    /// up**: a heartbeat thread
    /// ([`crate::lock::redis::Renewal`]) re-arms the key with an owner-checked `PEXPIRE`
    /// every TTL/3; the check writes only if no renewal was refused and the last one that
    /// got through, counted from its send on the monotonic clock, still covers the write
    /// (less the margin). Work that runs long keeps its lock. A stopped process stops its
    /// heartbeat with it, so the lease runs out during a pause as if there were no
    /// heartbeat — and the pause after the check is as blind as ever. A renewal that merely
    /// fails (a reset, a timeout) stops nothing by itself: the heartbeat tries again until
    /// the lease it last won would run out, and gives up then.
    ///
    /// ❌ Its broken twin, not played: believing the lock held "because the heartbeat is
    /// running". After a stop, the heartbeat and the check wake together; whichever runs
    /// first decides, and a check that only asks "has a renewal failed yet?" often wins the
    /// race and writes. The ✅ check counts from the last renewal that got through instead.
    #[value(
        help = "⚠️ renews every TTL/3; no write once a renewal is refused or the heartbeat gives up"
    )]
    RenewThird,
    /// ⚠️ **Lock-delay at the lock service**, modelled on Consul's (the idea is Chubby's,
    /// §2.4 of its paper: an "imperfect" protection for the servers that cannot check a
    /// sequencer, Chubby's fencing token — fencing where they can): when a holder's lease
    /// runs out or it vanishes, nobody is granted the lock for a further D (Consul's
    /// sessions take 0 to 60s, 15s by default; a clean release has no delay). Redis has no
    /// such thing, so [`lock_delay_lifetime`] keeps the key D past the lease the holder was
    /// promised: the holder counts `ttl`, every other `SET NX` is refused for `ttl + D`,
    /// and a clean compare-and-delete still frees it at once. The holder itself makes no
    /// check. A stale write that lands within D of the lease's end lands before anyone else
    /// holds the lock; one later than that is the `none` row again. Its cost: a lock whose
    /// holder died stands unavailable for D.
    ///
    /// ❌ The broken way to build it in Redis: a tombstone key written by the *releaser*.
    /// A holder that vanished never releases, so the tombstone appears only when no delay
    /// was needed — and a plain `SET NX` from the next client does not look at it anyway.
    #[value(help = "⚠️ Redis refuses the lock for D after the lease (Consul-like)")]
    LockDelay,
    /// ✅ The reference: no guess at all. The token drawn with the lock goes with the
    /// write, and the store refuses a token lower than one it has accepted. The only
    /// guard that stands where the write lands.
    #[value(help = "✅ reference: the store refuses a lower token")]
    Fencing,
}

impl Guard {
    pub const ALL: [Guard; 8] = [
        Guard::None,
        Guard::WallDeadline,
        Guard::MonotonicDeadline,
        Guard::CheckOwner,
        Guard::PauseDetect,
        Guard::RenewThird,
        Guard::LockDelay,
        Guard::Fencing,
    ];

    /// Its name on the command line, in `--json` and on the verdict's table.
    pub fn as_str(self) -> &'static str {
        match self {
            Guard::None => "none",
            Guard::WallDeadline => "wall-deadline",
            Guard::MonotonicDeadline => "monotonic-deadline",
            Guard::CheckOwner => "check-owner",
            Guard::PauseDetect => "pause-detect",
            Guard::RenewThird => "renew-third",
            Guard::LockDelay => "lock-delay",
            Guard::Fencing => "fencing",
        }
    }

    /// The holder looks before it writes (none, lock-delay and fencing write blind).
    pub fn looks(self) -> bool {
        !matches!(self, Guard::None | Guard::LockDelay | Guard::Fencing)
    }
}

/// ✅ Lock-delay, as far as plain Redis can play it: how long the key must live so that
/// nobody else is granted the lock until `delay` after the holder's `ttl` ran out. Every
/// other client's `SET NX` meets the key; the holder's own compare-and-delete removes it
/// (a clean release, which in Consul carries no delay either).
pub fn lock_delay_lifetime(ttl: Duration, delay: Duration) -> Duration {
    ttl + delay
}

/// How often [`Sampler`] reads the monotonic clock.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// Pause detection's eyes: a thread that reads the monotonic clock every [`SAMPLE_EVERY`]
/// and keeps the widest gap between two readings. A stopped process stops this thread
/// too, and that is the point: when it runs again, the clock has moved on by the pause.
pub struct Sampler {
    samples: Arc<Mutex<Samples>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

struct Samples {
    last: Instant,
    widest: Duration,
}

impl Sampler {
    pub fn start() -> Sampler {
        Sampler::start_telling(Duration::MAX, |_| {})
    }

    /// A sampler that also calls `ran_again` with the gap whenever a gap of at least
    /// `gap_from` ends: the first sample after a stop, the proof that the process runs again
    /// (lab 9's stall times its next stop from it, not from a guess at the scheduler).
    pub fn start_telling(
        gap_from: Duration,
        ran_again: impl Fn(Duration) + Send + 'static,
    ) -> Sampler {
        let samples = Arc::new(Mutex::new(Samples {
            last: Instant::now(),
            widest: Duration::ZERO,
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, stopping) = (samples.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !stopping.load(Ordering::SeqCst) {
                std::thread::sleep(SAMPLE_EVERY);
                let now = Instant::now();
                let gap = {
                    let mut samples = shared.lock().unwrap_or_else(|e| e.into_inner());
                    let gap = now - samples.last;
                    samples.widest = samples.widest.max(gap);
                    samples.last = now;
                    gap
                };
                if gap >= gap_from {
                    ran_again(gap);
                }
            }
        });
        Sampler {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// The widest gap so far, counting the one still open since the last sample: after a
    /// stop, the check may run before the sampler's thread has had its turn.
    pub fn widest_gap(&self) -> Duration {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.widest.max(samples.last.elapsed())
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The renewing guard's heartbeat: [`Renewal`], and the word it leaves when it gives the
/// lock up.
pub struct Heartbeat {
    renewal: Renewal,
    lost: Arc<Mutex<Option<String>>>,
}

impl Heartbeat {
    /// Starts renewing `held` every TTL/3 on `lock`, a connection of the heartbeat's own,
    /// its first lease counted from `lease.sent` (as the guard's own check counts it).
    pub fn start(lock: RedisLock, held: Held, lease: &Lease) -> Heartbeat {
        let lost = Arc::new(Mutex::new(None));
        let said = lost.clone();
        let renewal = Renewal::start_from(
            lock,
            held,
            lease.sent,
            Box::new(move |why| *said.lock().unwrap_or_else(|e| e.into_inner()) = Some(why)),
        );
        Heartbeat { renewal, lost }
    }

    /// Stops renewing (before the release, so that no renewal races the delete).
    pub fn stop(self) {
        self.renewal.stop();
    }
}

/// What the guards that watch while the holder works have seen.
#[derive(Default)]
pub struct Watch<'a> {
    pub sampler: Option<&'a Sampler>,
    pub heartbeat: Option<&'a Heartbeat>,
}

fn ms_left(deadline: Instant) -> i64 {
    let now = Instant::now();
    if now < deadline {
        (deadline - now).as_millis() as i64
    } else {
        -((now - deadline).as_millis() as i64)
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
    /// The widest gap pause detection saw between two clock samples (ms).
    pub gap_ms: Option<u64>,
}

impl Guard {
    /// May the holder write now? `lock` and `held` are asked only by [`Guard::CheckOwner`].
    pub fn decide(
        self,
        lease: &Lease,
        lock: &mut RedisLock,
        held: &Held,
        watch: &Watch,
    ) -> Result<Decision> {
        let margin_ms = lease.margin.as_millis() as i64;
        Ok(match self {
            Guard::None => Decision::blind("no guard: writes"),
            Guard::Fencing => {
                Decision::blind("no guess: writes with its token and lets the store decide")
            }
            Guard::LockDelay => Decision::blind(
                "no check in A: Redis keeps the lock from others for the lock-delay after A's lease",
            ),
            Guard::PauseDetect => {
                let sampler = watch.sampler.context("pause detection needs its sampler")?;
                let gap = sampler.widest_gap();
                let gap_ms = gap.as_millis() as u64;
                let paused = gap > lease.margin;
                Decision {
                    write: !paused,
                    believed_left_ms: None,
                    why: if paused {
                        format!(
                            "the monotonic clock jumped {gap_ms}ms between two samples (over the {margin_ms}ms margin): it was paused"
                        )
                    } else {
                        format!(
                            "no gap over the {margin_ms}ms margin between clock samples (widest {gap_ms}ms)"
                        )
                    },
                    gap_ms: Some(gap_ms),
                }
            }
            Guard::RenewThird => {
                let heartbeat = watch.heartbeat.context("renewal needs its heartbeat")?;
                let lost = heartbeat
                    .lost
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                // Before the first renewal, the lease counts from the grant's send.
                let renewed = heartbeat.renewal.last_renewed().unwrap_or(lease.sent);
                let left_ms = ms_left(renewed + lease.ttl.saturating_sub(lease.margin));
                match lost {
                    Some(why) => Decision {
                        write: false,
                        believed_left_ms: Some(left_ms.min(-1)),
                        why: format!("the heartbeat gave the lock up ({why})"),
                        gap_ms: None,
                    },
                    None => Decision {
                        write: left_ms > 0,
                        believed_left_ms: Some(left_ms),
                        why: format!(
                            "the last renewal that got through, counted from its send, minus the {margin_ms}ms margin, leaves {left_ms}ms"
                        ),
                        gap_ms: None,
                    },
                }
            }
            Guard::WallDeadline => {
                let deadline = lease.granted_wall + lease.ttl.saturating_sub(lease.margin);
                let left_ms = match deadline.duration_since(SystemTime::now()) {
                    Ok(left) => left.as_millis() as i64,
                    Err(past) => -(past.duration().as_millis() as i64),
                };
                Decision {
                    write: left_ms > 0,
                    believed_left_ms: Some(left_ms),
                    why: format!(
                        "the wall clock, minus the {margin_ms}ms margin, says {left_ms}ms of the lease are left"
                    ),
                    gap_ms: None,
                }
            }
            Guard::MonotonicDeadline => {
                let left_ms = ms_left(lease.sent + lease.ttl.saturating_sub(lease.margin));
                Decision {
                    write: left_ms > 0,
                    believed_left_ms: Some(left_ms),
                    why: format!(
                        "the monotonic clock, counted from the send, minus the {margin_ms}ms margin, says {left_ms}ms are left"
                    ),
                    gap_ms: None,
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
                    gap_ms: None,
                }
            }
        })
    }
}

impl Decision {
    /// A guard that writes without looking.
    fn blind(why: &str) -> Decision {
        Decision {
            write: true,
            believed_left_ms: None,
            why: why.into(),
            gap_ms: None,
        }
    }
}
