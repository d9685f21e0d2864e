//! The queuer's script: join a queue for one lock, wait for a turn, hold, let go (lab 10).
//!
//! Three ways to wait, from [`crate::lock`]: spinning on Redis's `SET NX`, every waiter
//! watching one etcd key (the herd), and the recipe, each waiter watching the one ahead
//! ([`crate::lock::etcd_queue`]). The queuer counts its own requests and wake-ups, and
//! stamps its turn on the machine's monotonic clock so that hand-overs between processes
//! can be measured.

use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::await_command;
use super::racer::monotonic_ns;
use crate::connect;
use crate::events::Emitter;
use crate::events::What;
use crate::events::facts::{self, GaveUp, Lost, Queued, Released, Woke, Wrote};
use crate::lock::etcd::{EtcdLock, Lease};
use crate::lock::etcd_election::Candidate;
use crate::lock::etcd_queue::{EtcdQueue, Place, Step, Turn};
use crate::lock::redis::RedisLock;
use crate::store::Store;

/// How a queuer waits for the lock.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Way {
    /// ❌ Try `SET NX` every few ms until it succeeds (Redis).
    RedisSpin,
    /// ❌ Every waiter watches the one lock key, and all race when it is deleted (etcd).
    EtcdHerd,
    /// ✅ Each waiter's own key, ordered by create revision, watching the one ahead (etcd).
    EtcdRecipe,
}

impl Way {
    pub fn as_str(self) -> &'static str {
        match self {
            Way::RedisSpin => "redis_spin",
            Way::EtcdHerd => "etcd_herd",
            Way::EtcdRecipe => "etcd_recipe",
        }
    }
}

/// How long a spinning Redis waiter sleeps between two tries.
pub const SPIN_EVERY: Duration = Duration::from_millis(10);

/// One queuer's script.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct QueuerScript {
    pub name: String,
    pub way: Way,
    /// The Redis URL (spin) or the etcd URL (herd, recipe).
    pub url: String,
    /// The lock's Redis key, or its etcd prefix.
    pub lock: String,
    /// The etcd lease's TTL, or the Redis key's TTL.
    pub ttl_ms: u64,
    /// How long to hold the lock; None: until told `release`.
    pub hold_ms: Option<u64>,
    /// How long to wait for the lock before giving up.
    pub wait_ms: u64,
    /// Report each wake-up as an event (a short queue, told step by step).
    pub report_wakes: bool,
    /// Write to the fenced store with the token when told `release`, before letting go.
    pub store: Option<StoreTarget>,
    /// Give up while queued when told `give-up` (the recipe: it deletes its key and leaves).
    /// A thread reads stdin for it: such a waiter must hold for `hold_ms`, not until told
    /// `release`, which that thread would take.
    #[serde(default)]
    pub give_up_when_told: bool,
    /// Campaign in etcd's election named `lock` instead of queueing for the lock: lead,
    /// act as leader (write) after `hold_ms` or when told `release`, ask etcd who leads,
    /// and resign when told `resign`.
    #[serde(default)]
    pub election: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct StoreTarget {
    pub url: String,
    pub run_id: String,
    pub resource: String,
}

pub fn run(script: &QueuerScript) -> Result<()> {
    let out = Emitter::new(&script.name);
    match script.way {
        _ if script.election => elect(script, &out),
        Way::RedisSpin => spin(script, &out),
        Way::EtcdHerd | Way::EtcdRecipe => on_etcd(script, &out),
    }
}

/// ❌ Spinning: every waiter asks Redis again and again; the one that asks first after the
/// release wins, whenever it began to wait.
fn spin(script: &QueuerScript, out: &Emitter) -> Result<()> {
    let ttl = Duration::from_millis(script.ttl_ms);
    let mut lock = RedisLock::new(connect::redis(&script.url)?, &script.lock, ttl);
    let counter = format!("{}:token", script.lock);
    let started = std::time::Instant::now();
    let mut requests = 0u64;
    let mut wakeups = 0u64;
    let owner = crate::lock::random_owner();
    let held = loop {
        requests += 1;
        let tried = lock.try_acquire_fenced_as(&counter, &owner)?;
        if requests == 1 {
            out.send(out.event(
                Queued {
                    pid: Some(std::process::id() as i32),
                    ..Queued::default()
                },
                "asks: SET NX (and tries again every 10ms)",
            ));
        }
        if let Some(held) = tried {
            break held;
        }
        if started.elapsed() >= Duration::from_millis(script.wait_ms) {
            return gave_up(out, "no lock within the wait");
        }
        thread::sleep(SPIN_EVERY);
        wakeups += 1;
    };
    let token = held.token.unwrap_or_default();
    acquired(out, &script.lock, token, (requests, wakeups), None);
    hold(script)?;
    write(script, out, token)?;
    requests += 1;
    // Stamped as it lets go, before the release goes out: a hand-over is timed from here.
    let leave_ns = monotonic_ns();
    let released = lock.release(&held)?;
    out.send(out.event(
        Released {
            released: Some(released),
            leave_ns: Some(leave_ns),
            requests: Some(requests),
            ..Released::default()
        },
        format!("releases ({requests} requests in all)"),
    ));
    Ok(())
}

fn on_etcd(script: &QueuerScript, out: &Emitter) -> Result<()> {
    let ttl = Duration::from_millis(script.ttl_ms);
    let wait = Duration::from_millis(script.wait_ms);
    let mut leases = EtcdLock::connect(&script.url, &script.lock)?;
    let lease = leases.grant_lease(ttl, |_| {})?;
    let mut queue = EtcdQueue::connect(&script.url, &script.lock)?;
    if script.give_up_when_told {
        let quit = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        queue.quit = Some(quit.clone());
        thread::spawn(move || {
            // Told, or the lab went away: either way, stop waiting.
            let _ = await_command("give-up");
            quit.store(true, std::sync::atomic::Ordering::SeqCst);
        });
    }
    let pid = Some(std::process::id() as i32);
    let lease_hex = Some(format!("{:x}", lease.id));
    let (turn, place) = match script.way {
        Way::EtcdRecipe => {
            let place = queue.join(&lease)?;
            out.send(out.event(
                Queued {
                    pid,
                    key: Some(place.key.clone()),
                    revision: Some(place.revision),
                    lease: lease_hex,
                    lease_ttl_ms: Some(lease.ttl.as_millis() as u64),
                },
                format!(
                    "joins the queue: key {} at revision {}",
                    place.key, place.revision
                ),
            ));
            let turn = if script.report_wakes {
                wait_reporting(&mut queue, &place, &lease, wait, out)?
            } else {
                queue.wait_turn(&place, &lease, wait)?
            };
            (turn, Some(place))
        }
        _ => {
            let mut asked = false;
            let turn = queue.herd_acquire(&lease, wait, || {
                if !asked {
                    asked = true;
                    out.send(out.event(
                        Queued {
                            pid,
                            lease: lease_hex.clone(),
                            ..Queued::default()
                        },
                        "asks: create the lock key if absent, else watch it",
                    ));
                }
            })?;
            (turn, None)
        }
    };
    let (token, seen_at) = match turn {
        Turn::Holder { token, at } => (token, at),
        Turn::Gone => return lost_place(out, &mut leases, lease, "its queue key is gone"),
        Turn::LeaseLost => {
            let why = lease
                .lost_why()
                .unwrap_or_else(|| "the lease was lost".into());
            return lost_place(out, &mut leases, lease, &why);
        }
        Turn::TimedOut | Turn::Quit => {
            let why = if turn == Turn::Quit {
                "told to stop waiting"
            } else {
                "no lock within the wait"
            };
            // ✅ A waiter that gives up deletes its key: left behind, it would hold its place
            // (and the one behind it) until its lease ran out.
            //
            // It says so *before* the delete: the delete wakes the waiter behind it, whose
            // line must not come first on the timeline (an effect above its cause).
            let Some(place) = &place else {
                let _ = leases.revoke(lease);
                return gave_up(out, why);
            };
            gave_up(out, &format!("{why}; deletes its key and leaves the queue"))?;
            if !queue.leave(place)? {
                out.say(
                    crate::events::What::Output,
                    "its key was already gone from the queue",
                );
            }
            let _ = leases.revoke(lease);
            return Ok(());
        }
    };
    let counts = (queue.requests, queue.wakeups);
    acquired(out, &script.lock, token, counts, Some(seen_at));
    hold(script)?;
    write(script, out, token)?;
    // After its write, a holder that may have been frozen asks whether its key is still
    // there (the expiry part; the herd part's holders are never frozen, and do not pay it).
    let still = match (&place, &script.store) {
        (Some(place), Some(_)) => queue.still_queued(place, lease.id)?,
        _ => true,
    };
    if !still {
        out.send(out.event(
            Lost::because("its key is gone: etcd expired its lease while it was frozen"),
            "learns its key is gone: it is no longer the holder",
        ));
    }
    // Stamped as it lets go, before the release goes out: a hand-over is timed from here.
    let leave_ns = monotonic_ns();
    let released = match &place {
        Some(place) => queue.leave(place)?,
        None => queue.herd_release(lease.id)?,
    };
    let _ = leases.revoke(lease);
    out.send(out.event(
        Released {
            released: Some(released),
            leave_ns: Some(leave_ns),
            requests: Some(queue.requests),
            ..Released::default()
        },
        format!("releases ({} requests in all)", queue.requests),
    ));
    Ok(())
}

/// A candidate in etcd's election: campaigns, leads, acts as leader when told, then asks
/// etcd whether it still leads, and resigns.
fn elect(script: &QueuerScript, out: &Emitter) -> Result<()> {
    let mut leases = EtcdLock::connect(&script.url, &script.lock)?;
    let lease = leases.grant_lease(Duration::from_millis(script.ttl_ms), |_| {})?;
    let mut candidate = Candidate::connect(&script.url, &script.lock)?;
    let lease_hex = format!("{:x}", lease.id);
    out.send(out.event(
        Queued {
            pid: Some(std::process::id() as i32),
            // etcd's election puts the candidate's key at `<name>/<lease in hex>`.
            key: Some(format!("{}/{lease_hex}", script.lock)),
            lease: Some(lease_hex.clone()),
            lease_ttl_ms: Some(lease.ttl.as_millis() as u64),
            ..Queued::default()
        },
        format!("campaigns for leader (lease {lease_hex})"),
    ));
    let won = candidate.campaign(&lease, &script.name)?;
    let generation = won.generation;
    out.send(out.event(
        facts::Acquired {
            lock: Some(script.lock.clone()),
            owner: Some(script.name.clone()),
            token: Some(generation),
            enter_ns: Some(monotonic_ns()),
            seen_at: won.at,
            ..facts::Acquired::default()
        },
        format!("elected leader: generation {generation} (its key's create revision)"),
    ));
    hold(script)?;
    // ❌ It acts on what it believes: nothing has told it that it may have been deposed.
    out.say(
        What::Working,
        format!("acts as leader, generation {generation}: writes"),
    );
    write(script, out, generation)?;
    // ✅ Then it asks etcd who leads; it steps down when the lab says so.
    match candidate.leader_now()? {
        Some((key, _)) if key == won.key => {}
        now => {
            let who = now.map_or("nobody leads".into(), |(_, generation)| {
                format!("etcd names generation {generation}")
            });
            out.send(out.event(
                Lost::because("its leader key is gone: etcd expired its lease"),
                format!("asks etcd who leads: {who}. It no longer leads"),
            ));
        }
    }
    await_command("resign")?;
    let leave_ns = monotonic_ns();
    let released = candidate.resign(&won)?;
    let _ = leases.revoke(lease);
    out.send(out.event(
        Released {
            released: Some(released),
            leave_ns: Some(leave_ns),
            ..Released::default()
        },
        if released {
            "resigns"
        } else {
            "resigns: its key was already gone"
        },
    ));
    Ok(())
}

/// The recipe's wait, told wake-up by wake-up: [`EtcdQueue::wait_turn`] one step at a time.
fn wait_reporting(
    queue: &mut EtcdQueue,
    place: &Place,
    lease: &Lease,
    wait: Duration,
    out: &Emitter,
) -> Result<Turn> {
    let give_up = tokio::time::Instant::now() + wait;
    loop {
        match queue.wait_step(place, lease, give_up)? {
            Step::Over(turn) => return Ok(turn),
            Step::Woke { gone, ahead } => {
                let text = match &ahead {
                    Some(ahead) => {
                        format!("woken: {gone} is gone; looks again: {ahead} is ahead, waits on it")
                    }
                    None => format!("woken: {gone} is gone; looks again: nobody is ahead"),
                };
                out.send(out.event(
                    Woke {
                        gone: Some(gone),
                        ahead,
                    },
                    text,
                ));
            }
        }
    }
}

/// Reports the grant: its token, what the wait cost (requests, wake-ups), and the etcd
/// revision at which the waiter found no older key (the recipe's grant, in etcd's order).
fn acquired(out: &Emitter, lock: &str, token: i64, counts: (u64, u64), seen_at: Option<i64>) {
    let (requests, wakeups) = counts;
    out.send(out.event(
        facts::Acquired {
            lock: Some(lock.to_string()),
            token: Some(token),
            tries: Some(requests),
            wakeups: Some(wakeups),
            enter_ns: Some(monotonic_ns()),
            seen_at,
            ..facts::Acquired::default()
        },
        format!(
            "holds the lock, token {token} ({}, {})",
            crate::output::count(wakeups, "wake-up", "wake-ups"),
            crate::output::count(requests, "request", "requests")
        ),
    ));
}

/// Holds for the script's time, or until the lab says `release`.
fn hold(script: &QueuerScript) -> Result<()> {
    match script.hold_ms {
        Some(ms) => {
            thread::sleep(Duration::from_millis(ms));
            Ok(())
        }
        None => await_command("release"),
    }
}

/// Writes the holder's name to the store with its token, when the script has a store.
fn write(script: &QueuerScript, out: &Emitter, token: i64) -> Result<()> {
    let Some(target) = &script.store else {
        return Ok(());
    };
    let mut store = Store::connect(&target.url).context("connecting to the store")?;
    let outcome = store.write(
        &target.run_id,
        &target.resource,
        &script.name,
        &script.name,
        Some(token),
    );
    out.send(out.event(
        Wrote {
            token: Some(token),
            value: Some(script.name.clone()),
            resource: Some(target.resource.clone()),
            ..Wrote::new(outcome)
        },
        format!("writes with token {token}: {}", outcome.as_str()),
    ));
    Ok(())
}

fn gave_up(out: &Emitter, why: &str) -> Result<()> {
    out.send(out.event(
        GaveUp {
            why: Some(why.into()),
            ..GaveUp::default()
        },
        format!("gives up: {why}"),
    ));
    Ok(())
}

/// A waiter that learned it is no longer in the queue: it says so and leaves, acting on
/// nothing it believed before.
fn lost_place(out: &Emitter, leases: &mut EtcdLock, lease: Lease, why: &str) -> Result<()> {
    out.send(out.event(
        Lost::because(why),
        format!("learns it is no longer in the queue ({why}); gives up its place"),
    ));
    let _ = leases.revoke(lease);
    Ok(())
}
