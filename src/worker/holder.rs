//! The lock holder's script: take a lock, work (or be frozen), write to the fenced store, and
//! let go. Lab 1 (`gc-pause`) and lab 4 (`etcd-vs-redis`) both play it, on any of the three
//! backends of `src/lock/`; later labs add their locks as new [`LockSpec`]s.
//!
//! Everything a lab's verdict needs comes back in the events, as the backends answered:
//! the grant (owner and fencing token), what the store said to the write, and what the
//! release found in the lock — the evidence of whether someone else had been given the lock
//! before this holder let go.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use super::await_command;
use crate::connect;
use crate::events::facts::{
    self, FaultFacts, Finished, GaveUp, Lost, RenewalError, Waiting, Wrote,
};
use crate::events::{Emitter, What};
use crate::lock::etcd::{self, Acquired, Beat, EtcdLock};
use crate::lock::postgres::PgLock;
use crate::lock::redis::{OnFailed, OnLost, RedisLock, Release, Renewal, RenewalFailed};
use crate::output::human;
use crate::store::{FenceRule, Store};

/// One holder's script.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct HolderScript {
    /// The worker's lane name (`A`, `etcd:waiter`…), also its name in the store.
    pub name: String,
    pub lock: LockSpec,
    /// The fenced store (Postgres).
    pub store_url: String,
    pub run_id: String,
    /// The store's resource this holder writes.
    pub resource: String,
    /// How long to keep trying for the lock.
    pub wait_ms: u64,
    pub before_write: BeforeWrite,
    pub after_write: AfterWrite,
    /// The store's rule for this holder's fenced writes (lab 1's `--token-restart` plays
    /// the ❌ lesson `HigherOrSameHolder`); by default the store's own, `>=`.
    #[serde(default)]
    pub fence_rule: FenceRule,
    /// ✅ Draw the fencing token from this Postgres sequence in the store's database, after
    /// the grant and while the lock is still ours (checked after the draw), instead of from
    /// a counter on the lock's own server.
    #[serde(default)]
    pub token_sequence: Option<String>,
}

/// Which lock, on which backend.
#[derive(Serialize, Deserialize, Clone, Debug)]
#[serde(tag = "backend", rename_all = "lowercase")]
pub enum LockSpec {
    /// `SET key owner NX PX ttl`; with `fence_counter`, a token drawn in the same script;
    /// with `renew`, a heartbeat re-arms the TTL every TTL/3 while the process runs.
    Redis {
        url: String,
        key: String,
        ttl_ms: u64,
        fence_counter: Option<String>,
        #[serde(default)]
        renew: bool,
    },
    /// A lease of its own with a heartbeat, and etcd's lock on it; the key's create
    /// revision is the token, sent with the write unless `token` is false (lab 8's etcd
    /// row without fencing).
    Etcd {
        url: String,
        name: String,
        lease_ttl_ms: u64,
        #[serde(default = "yes")]
        token: bool,
    },
    /// A session advisory lock; `idle_timeout_ms` lets Postgres end a silent session.
    Postgres {
        url: String,
        name: String,
        idle_timeout_ms: Option<u64>,
    },
}

fn yes() -> bool {
    true
}

impl LockSpec {
    /// The lock's name as its backend knows it.
    pub fn name(&self) -> &str {
        match self {
            LockSpec::Redis { key, .. } => key,
            LockSpec::Etcd { name, .. } | LockSpec::Postgres { name, .. } => name,
        }
    }
}

/// What the holder does between taking the lock and writing.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BeforeWrite {
    /// Write at once.
    Nothing,
    /// Stop this very process with SIGSTOP: the pause hits in the middle of the work, the
    /// way a stop-the-world GC pause does.
    FreezeSelf,
    /// Work until the lab says `finish` (the lab freezes us in the meantime).
    WorkUntilTold,
    /// Work this long, watching the clock: a freeze from outside shows as a jump.
    Work { ms: u64 },
    /// Work until the lab says `finish`, then check that the lock is still ours (Redis:
    /// our owner value in the key, with time left) and write only if it is — the check
    /// that cannot help when the write itself is late (lab 8).
    WorkUntilToldThenCheck,
    /// A renewed Redis lock only: work until the lab says `finish`, then write only if the
    /// heartbeat has not given the lock up; after that write, ask the heartbeat again
    /// before a second one — the holder that stops when its renewals fail (lab 8). It
    /// narrows the window: a write already sent cannot be called back.
    WorkUntilToldStopIfHeartbeatGaveUp,
}

/// What the holder does after writing.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AfterWrite {
    Release,
    /// Keep the lock until the lab says `finish`, so that a frozen holder wakes into a lock
    /// that someone else holds.
    HoldUntilTold,
}

/// Says that a renewal of the held lock failed (the first of a run of failures): the
/// moment the holder could first have known, before its heartbeat gives the lock up.
fn renewal_failed(me: &Emitter, what: &str, timed_out: bool, why: String) {
    let (error, how) = if timed_out {
        (RenewalError::Timeout, "got no answer in time")
    } else {
        (RenewalError::Cut, "failed")
    };
    let text = format!("{what}: a renewal {how} ({why}); it tries again while the lease lasts");
    me.send(me.event(facts::RenewalFailed { error, why }, text))
}

/// The lock a worker uses, on whichever backend: the three files of `src/lock/`.
enum AnyLock {
    Redis {
        lock: Box<RedisLock>,
        /// Where the lock lives, to connect again if the server restarted under us.
        url: String,
        /// The fencing counter drawn with the lock; None: no token.
        fence_counter: Option<String>,
        held: Option<crate::lock::redis::Held>,
        /// The renewed lock: the heartbeat's own connection, until the lock is held…
        heartbeat_lock: Option<Box<RedisLock>>,
        /// …and then the heartbeat itself.
        renewal: Option<Renewal>,
        on_lost: Option<OnLost>,
        /// Hears the heartbeat's first failed renewal (a `renewal_failed` event).
        on_failed: Option<OnFailed>,
        /// Set once the heartbeat has given the lock up (no renewal got through in time,
        /// or Redis said the key is no longer ours).
        gave_up: Arc<AtomicBool>,
    },
    Etcd {
        lock: Box<EtcdLock>,
        lease: Option<etcd::Lease>,
        held: Option<etcd::Held>,
        /// The key's revision goes with the write as its fencing token.
        token: bool,
    },
    Postgres {
        lock: PgLock,
    },
}

/// What a worker got with the lock.
struct Grant {
    token: Option<i64>,
    /// What identifies this holder in the backend (Redis owner value, etcd key, session pid).
    owner: String,
    how: String,
}

impl AnyLock {
    /// Connects to the lock's backend. etcd's lease is granted here, so that its heartbeat
    /// runs from the start; a heartbeat or session that learns the lock is gone says so at
    /// once with a `lost` event.
    fn open(name: &str, spec: &LockSpec) -> Result<AnyLock> {
        let lost = |what: &'static str| {
            let me = Emitter::new(name);
            move |why: String| {
                me.send(me.event(
                    Lost::because(why.clone()),
                    format!("{what}: {why} — the lock is lost"),
                ))
            }
        };
        Ok(match spec {
            LockSpec::Redis {
                url,
                key,
                ttl_ms,
                fence_counter,
                renew,
            } => {
                let ttl = Duration::from_millis(*ttl_ms);
                let heartbeat_lock = if *renew {
                    Some(Box::new(RedisLock::new(connect::redis(url)?, key, ttl)))
                } else {
                    None
                };
                let gave_up = Arc::new(AtomicBool::new(false));
                let on_lost: Option<OnLost> = renew.then(|| {
                    let (say, flag) = (lost("heartbeat"), gave_up.clone());
                    Box::new(move |why: String| {
                        flag.store(true, Ordering::SeqCst);
                        say(why)
                    }) as OnLost
                });
                let on_failed: Option<OnFailed> = renew.then(|| {
                    let me = Emitter::new(name);
                    Box::new(move |failed: RenewalFailed| {
                        renewal_failed(&me, "heartbeat", failed.timed_out, failed.why)
                    }) as OnFailed
                });
                AnyLock::Redis {
                    lock: Box::new(RedisLock::new(connect::redis(url)?, key, ttl)),
                    url: url.clone(),
                    fence_counter: fence_counter.clone(),
                    held: None,
                    heartbeat_lock,
                    renewal: None,
                    on_lost,
                    on_failed,
                    gave_up,
                }
            }
            LockSpec::Etcd {
                url,
                name: lock_name,
                lease_ttl_ms,
                token,
            } => {
                let mut lock = EtcdLock::connect(url, lock_name)?;
                let on_lost = lost("heartbeat");
                let me = Emitter::new(name);
                let lease = lock.grant_lease(
                    Duration::from_millis(*lease_ttl_ms),
                    move |beat| match beat {
                        Beat::Failed { timed_out, why } => {
                            renewal_failed(&me, "keepalive", timed_out, why)
                        }
                        Beat::Lost { why } => on_lost(why),
                        Beat::Renewed { .. } => {}
                    },
                )?;
                AnyLock::Etcd {
                    lock: Box::new(lock),
                    lease: Some(lease),
                    held: None,
                    token: *token,
                }
            }
            LockSpec::Postgres {
                url,
                name: lock_name,
                idle_timeout_ms,
            } => AnyLock::Postgres {
                lock: PgLock::connect(
                    url,
                    lock_name,
                    idle_timeout_ms.map(Duration::from_millis),
                    lost("session"),
                )?,
            },
        })
    }

    /// Which backend grants this lock, as the `backend` fact of `acquired`: a picture of the
    /// run draws each backend's lock on a lane of its own.
    fn backend(&self) -> &'static str {
        match self {
            AnyLock::Redis { .. } => "redis",
            AnyLock::Etcd { .. } => "etcd",
            AnyLock::Postgres { .. } => "postgres",
        }
    }

    /// Facts for the `waiting` event: what this worker brings to the lock.
    fn describe(&self) -> (String, Waiting) {
        let mut facts = Waiting::default();
        let text = match self {
            AnyLock::Redis {
                lock,
                heartbeat_lock,
                ..
            } => {
                let renewed = if heartbeat_lock.is_some() {
                    format!(
                        "; once held, a heartbeat renews it every {}",
                        human(lock.ttl / 3)
                    )
                } else {
                    String::new()
                };
                format!(
                    "tries to take the lock (SET NX PX {} every 20ms){renewed}",
                    lock.ttl.as_millis()
                )
            }
            AnyLock::Etcd { lease, .. } => {
                let lease = lease.as_ref().expect("granted in open");
                facts.lease = Some(format!("{:x}", lease.id));
                facts.lease_ttl_ms = Some(lease.ttl.as_millis() as u64);
                format!(
                    "granted its own lease {:x} (TTL {}, heartbeat every {}); calls lock with it",
                    lease.id,
                    human(lease.ttl),
                    human(lease.ttl / 3)
                )
            }
            AnyLock::Postgres { lock } => {
                facts.backend_pid = Some(lock.backend_pid);
                format!(
                    "calls pg_advisory_lock on its session (server pid {}) and queues",
                    lock.backend_pid
                )
            }
        };
        (text, facts)
    }

    /// The lock still holds `owner` (Redis: the key holds our value and has time left).
    fn still_ours(&mut self, owner: &str) -> Result<bool> {
        Ok(self.check(owner)?.0)
    }

    /// Whether the lock still holds `owner`, and the key's PTTL as Redis answered it.
    fn check(&mut self, owner: &str) -> Result<(bool, i64)> {
        match self {
            AnyLock::Redis { lock, .. } => {
                let (now, pttl) = lock.owner_and_pttl().context("reading the lock back")?;
                Ok((now.as_deref() == Some(owner) && pttl > 0, pttl))
            }
            _ => bail!("a holder checks its lock before writing only on Redis here"),
        }
    }

    /// The renewed Redis lock's heartbeat has given the lock up (false for any other lock).
    fn heartbeat_gave_up(&self) -> bool {
        match self {
            AnyLock::Redis { gave_up, .. } => gave_up.load(Ordering::SeqCst),
            _ => false,
        }
    }

    /// Takes the lock within `wait`. `Ok(Err(why))`: no lock, and why the worker gives up.
    fn acquire(&mut self, wait: Duration) -> Result<Result<Grant, String>> {
        let timed_out = || Err(format!("no lock within {}", human(wait)));
        match self {
            AnyLock::Redis {
                lock,
                fence_counter,
                held,
                heartbeat_lock,
                renewal,
                on_lost,
                on_failed,
                ..
            } => {
                // Tried here rather than with `acquire_within`, to know when the winning
                // `SET NX PX` went out: the heartbeat counts the first lease from that send.
                // One owner value for every try of this acquisition (see `try_acquire_as`).
                let deadline = Instant::now() + wait;
                let owner = crate::lock::random_owner();
                let (got, sent) = loop {
                    let sent = Instant::now();
                    let got = match fence_counter.as_deref() {
                        Some(counter) => lock.try_acquire_fenced_as(counter, &owner)?,
                        None => lock.try_acquire_as(&owner)?,
                    };
                    match got {
                        Some(got) => break (got, sent),
                        None if Instant::now() >= deadline => return Ok(timed_out()),
                        None => std::thread::sleep(crate::lock::redis::RETRY_EVERY),
                    }
                };
                let set = match heartbeat_lock.take() {
                    Some(heartbeat) => {
                        let on_lost = on_lost.take().expect("set with the heartbeat's lock");
                        let on_failed = on_failed.take().expect("set with the heartbeat's lock");
                        *renewal = Some(Renewal::start_reporting(
                            *heartbeat,
                            got.clone(),
                            sent,
                            on_failed,
                            on_lost,
                        ));
                        format!(
                            "SET NX PX {}, renewed every {}",
                            lock.ttl.as_millis(),
                            human(lock.ttl / 3)
                        )
                    }
                    None => format!("SET NX PX {}", lock.ttl.as_millis()),
                };
                let how = match got.token {
                    Some(token) => format!("took the lock ({set}), fencing token {token}"),
                    None => format!(
                        "took the lock ({set}; owner {}…, a random value: no fencing token)",
                        &got.owner[..8]
                    ),
                };
                let grant = Grant {
                    token: got.token,
                    owner: got.owner.clone(),
                    how,
                };
                *held = Some(got);
                Ok(Ok(grant))
            }
            AnyLock::Etcd {
                lock,
                lease,
                held,
                token,
            } => {
                let lease_ref = lease.as_ref().expect("granted in open");
                Ok(match lock.acquire_within(lease_ref, wait)? {
                    Acquired::Held(got) => {
                        let used = if *token {
                            "= fencing token"
                        } else {
                            "(not sent with the write: no fencing)"
                        };
                        let grant = Grant {
                            token: token.then_some(got.token),
                            owner: got.key.clone(),
                            how: format!(
                                "etcd lock returned key {}; read back: it exists on our lease (so the lease lives), create revision {} {used}",
                                short_key(&got.key),
                                got.token
                            ),
                        };
                        *held = Some(got);
                        Ok(grant)
                    }
                    Acquired::TimedOut => timed_out(),
                    Acquired::LeaseLost { why } => Err(format!(
                        "its lease was lost while it waited ({why}); its queued key went with it"
                    )),
                    Acquired::NotALock { why } => Err(format!(
                        "the lock call returned, but the read-back says it is not a lock: {why}"
                    )),
                })
            }
            AnyLock::Postgres { lock } => {
                if !lock.acquire_within(wait)? {
                    return Ok(timed_out());
                }
                Ok(Ok(Grant {
                    token: None,
                    owner: lock.backend_pid.to_string(),
                    how: format!(
                        "pg_advisory_lock returned: its session (server pid {}) holds the lock; no fencing token",
                        lock.backend_pid
                    ),
                }))
            }
        }
    }

    /// Releases (or gives back the lease of a waiter that got nothing). Says whether the lock
    /// was still this worker's when it let go — the backend's answer, which the verdict uses —
    /// with, on Redis, the owner value found in a key that was no longer ours, and a sentence.
    fn release(self) -> Result<Released> {
        let said = |kept: bool, found_owner: Option<String>, text: &str| Released {
            kept,
            found_owner,
            text: text.to_string(),
        };
        match self {
            AnyLock::Redis {
                mut lock,
                url,
                held: Some(held),
                renewal,
                ..
            } => {
                // Stop renewing first, so that no renewal lands after the delete.
                if let Some(renewal) = renewal {
                    renewal.stop();
                }
                let found = match lock.release_reporting(&held) {
                    Ok(found) => found,
                    // A Redis that restarted while we held the lock closed our connection:
                    // ask again on a new one (compare-and-delete is safe to repeat).
                    Err(_) => {
                        let mut again = RedisLock::new(connect::redis(&url)?, &lock.key, lock.ttl);
                        again.release_reporting(&held)?
                    }
                };
                Ok(match found {
                    Release::Deleted => said(
                        true,
                        None,
                        "releases the lock (compare-and-delete deleted its key)",
                    ),
                    Release::HeldBy(owner) => said(
                        false,
                        Some(owner),
                        "tries to release: the key holds another owner now, so compare-and-delete deletes nothing",
                    ),
                    Release::Gone => said(
                        false,
                        None,
                        "tries to release: its key is gone (expired, or lost with a restart), so compare-and-delete deletes nothing",
                    ),
                })
            }
            AnyLock::Etcd {
                mut lock,
                lease: Some(lease),
                held: Some(held),
                ..
            } => Ok(if lock.release(lease, &held)? {
                said(
                    true,
                    None,
                    "releases: unlock deleted its key, the lease is revoked",
                )
            } else {
                said(
                    false,
                    None,
                    "tries to release: its lease had already expired, and its key with it",
                )
            }),
            AnyLock::Etcd {
                mut lock,
                lease: Some(lease),
                ..
            } => {
                lock.revoke(lease)?;
                Ok(said(false, None, "revokes its lease"))
            }
            AnyLock::Postgres { mut lock } => Ok(match lock.release() {
                Ok(true) => said(true, None, "releases: pg_advisory_unlock returned true"),
                Ok(false) => said(
                    false,
                    None,
                    "tries to release: its session no longer held the lock",
                ),
                Err(err) => Released {
                    kept: false,
                    found_owner: None,
                    text: format!(
                        "cannot release: its session is gone ({err:#}), and the lock went with it"
                    ),
                },
            }),
            _ => Ok(said(false, None, "had nothing to release")),
        }
    }
}

/// What a release found.
struct Released {
    /// The lock was still this worker's when it let go.
    kept: bool,
    /// Redis only: the owner value found in a key that was no longer ours.
    found_owner: Option<String>,
    text: String,
}

/// The script: take the lock, (work or be frozen), write, release.
pub fn run(script: &HolderScript) -> Result<()> {
    let me = Emitter::new(&script.name);
    let mut store = Store::connect(&script.store_url)?;
    let mut lock = AnyLock::open(&script.name, &script.lock)?;
    let (text, facts) = lock.describe();
    me.say(
        Waiting {
            pid: Some(std::process::id() as i32),
            ..facts
        },
        text,
    );

    let mut grant = match lock.acquire(Duration::from_millis(script.wait_ms))? {
        Ok(grant) => grant,
        Err(why) => {
            me.send(me.event(
                GaveUp {
                    why: Some(why.clone()),
                    ..GaveUp::default()
                },
                format!("gives up: {why}"),
            ));
            me.say(facts::Released::default(), lock.release()?.text);
            return Ok(());
        }
    };
    if let Some(sequence) = &script.token_sequence {
        // Drawn after the grant, the token only orders this holder after the one before if
        // the lock was still ours once it was drawn: a holder paused between the two could
        // draw after the next one.
        let token = store.next_token(sequence)?;
        if !lock.still_ours(&grant.owner)? {
            me.say(facts::Released::default(), lock.release()?.text);
            bail!("its lock ran out before it drew its fencing token");
        }
        grant.token = Some(token);
        if let LockSpec::Redis { ttl_ms, .. } = &script.lock {
            grant.how = format!(
                "took the lock (SET NX PX {ttl_ms}), fencing token {token} from the store's sequence"
            );
        }
    }
    let owner = grant.owner.clone();
    me.send(me.event(
        facts::Acquired {
            lock: Some(script.lock.name().to_string()),
            token: grant.token,
            owner: Some(grant.owner),
            backend: Some(lock.backend().into()),
            ..Default::default()
        },
        grant.how,
    ));

    match script.before_write {
        BeforeWrite::Nothing => {}
        BeforeWrite::FreezeSelf => {
            me.say(
                What::Freezing,
                "starts its work… and stops dead (raise SIGSTOP), like a stop-the-world GC pause",
            );
            let frozen_at = Instant::now();
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP)
                .context("raising SIGSTOP")?;
            let gap = frozen_at.elapsed();
            me.send(me.event(
                What::Resumed(FaultFacts::paused_for(gap)),
                format!(
                    "wakes after {}; it carries on without asking whether it still holds the lock",
                    human(gap)
                ),
            ));
        }
        BeforeWrite::WorkUntilTold => {
            me.say(What::Working, "works while holding the lock");
            await_command("finish")?;
            me.say(
                Finished::default(),
                "finishes its work; writes without asking whether it still holds the lock",
            );
        }
        BeforeWrite::Work { ms } => {
            let work = Duration::from_millis(ms);
            me.say(What::Working, format!("works for {}", human(work)));
            let gap = work_watching_the_clock(work);
            if gap > Duration::from_millis(300) {
                me.send(
                    me.event(
                        What::Resumed(FaultFacts::paused_for(gap)),
                        format!(
                            "wakes: its clock jumped by {}; it finishes its work and writes without asking whether it still holds the lock",
                            human(gap)
                        ),
                    ),
                );
            }
        }
        BeforeWrite::WorkUntilToldThenCheck => {
            me.say(What::Working, "works while holding the lock");
            await_command("finish")?;
            let (still_ours, pttl) = lock.check(&owner)?;
            let facts = facts::Checked {
                still_ours: Some(still_ours),
                pttl_ms: Some(pttl),
                ..facts::Checked::default()
            };
            if !still_ours {
                me.say(
                    facts,
                    "finishes, checks the lock before writing: it is no longer its own, so it does not write",
                );
                me.say(facts::Released::default(), lock.release()?.text);
                return Ok(());
            }
            me.say(
                facts,
                format!(
                    "finishes, checks the lock before writing: its owner value is still there, PTTL {pttl}ms left — it sends its write"
                ),
            );
        }
        BeforeWrite::WorkUntilToldStopIfHeartbeatGaveUp => {
            me.say(What::Working, "works while holding the lock");
            await_command("finish")?;
            if !ask_heartbeat(&me, &lock, "finishes its first piece of work") {
                me.say(facts::Released::default(), lock.release()?.text);
                return Ok(());
            }
        }
    }

    write(
        &me,
        &mut store,
        script,
        grant.token,
        format!("{}'s result", script.name),
    );
    if script.before_write == BeforeWrite::WorkUntilToldStopIfHeartbeatGaveUp
        && ask_heartbeat(&me, &lock, "has a second write to make")
    {
        write(
            &me,
            &mut store,
            script,
            grant.token,
            format!("{}'s second result", script.name),
        );
    }

    if script.after_write == AfterWrite::HoldUntilTold {
        await_command("finish")?;
    }
    let released = lock.release()?;
    me.send(me.event(
        facts::Released {
            released: Some(released.kept),
            found_owner: released.found_owner,
            ..Default::default()
        },
        released.text,
    ));
    Ok(())
}

/// Writes `value` to the store under the holder's token, and says what the store answered.
fn write(
    me: &Emitter,
    store: &mut Store,
    script: &HolderScript,
    token: Option<i64>,
    value: String,
) {
    let outcome = store.write_under(
        script.fence_rule,
        &script.run_id,
        &script.resource,
        &script.name,
        &value,
        token,
    );
    let token_text = token
        .map(|t| format!(", fencing token {t}"))
        .unwrap_or_default();
    me.send(me.event(
        Wrote {
            token,
            value: Some(value.clone()),
            ..Wrote::new(outcome)
        },
        format!(
            "writes '{value}'{token_text}: the store says {}",
            outcome.as_str()
        ),
    ));
}

/// ✅ (narrows, does not close) Before a write, asks the renewed lock's heartbeat whether it
/// gave the lock up, and says so with a `checked` event (`heartbeat_lost`). True: write.
/// Nothing it learns here can recall a write already sent.
fn ask_heartbeat(me: &Emitter, lock: &AnyLock, doing: &str) -> bool {
    let lost = lock.heartbeat_gave_up();
    let facts = facts::Checked {
        heartbeat_lost: Some(lost),
        ..facts::Checked::default()
    };
    if lost {
        me.say(
            facts,
            format!("{doing}; asks its heartbeat first: it has given the lock up, so it stops and does not write"),
        );
    } else {
        me.say(
            facts,
            format!("{doing}; asks its heartbeat first: it has not given the lock up — it sends its write"),
        );
    }
    !lost
}

/// What a holder's `released` event says Redis found, for the checkers.
pub fn release_of(event: &crate::events::Event) -> Option<Release> {
    let What::Released(facts) = &event.what else {
        return None;
    };
    Some(match (facts.released?, facts.found_owner.as_deref()) {
        (true, _) => Release::Deleted,
        (false, Some(owner)) => Release::HeldBy(owner.to_string()),
        (false, None) => Release::Gone,
    })
}

/// Works for `work` in small steps and returns the longest gap between two steps: a frozen
/// process cannot see its freeze, but afterwards it can see that its clock jumped.
fn work_watching_the_clock(work: Duration) -> Duration {
    let started = Instant::now();
    let step = Duration::from_millis(20);
    let mut last = started;
    let mut longest = Duration::ZERO;
    while started.elapsed() < work {
        std::thread::sleep(step.min(work.saturating_sub(started.elapsed())));
        longest = longest.max(last.elapsed().saturating_sub(step));
        last = Instant::now();
    }
    longest
}

/// The tail of an etcd lock key, for the timeline: `…:<scenario>:<lease>`.
fn short_key(key: &str) -> String {
    match key.rsplitn(3, ':').collect::<Vec<_>>().as_slice() {
        [tail, scenario, _] => format!("…:{scenario}:{tail}"),
        _ => key.to_string(),
    }
}
