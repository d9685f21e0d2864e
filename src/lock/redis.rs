//! The single-instance Redis lock.
//!
//! The correct version has three parts, and each exists because of a bug:
//! - acquire with **one** command, `SET key owner NX PX ttl`: "only if absent" and "expire
//!   after ttl" happen together, so no crash can leave a key without an expiry;
//! - the value is a random **owner**, unique to this acquisition, drawn once before its
//!   first try: a retry sends the same value, so it knows its own key if the answer to an
//!   earlier try was lost (lab 8);
//! - release with a Lua script that deletes the key **only if it still holds our owner**,
//!   because a GET followed by a DEL leaves a window in which the key can change hands.
//!
//! Below the correct lock sit the versions people write first (marked ❌), each with the bug
//! it carries and a pointer to the ✅ method that fixes it. Lab 2 (`lockslab naive`) runs
//! them against a real Redis and counts what goes wrong.
//!
//! Even correct, it is a lease: once the TTL passes, Redis hands the lock to someone else,
//! whether or not the first holder is done (or frozen). Protecting data needs a fencing
//! token as well; [`RedisLock::try_acquire_fenced`] hands one out.
//!
//! How long should the TTL be? Two ways, side by side in lab 4 (`lockslab etcd-vs-redis`):
//! - ❌ **set once**, long enough for the work: a TTL picked for the usual day expires under
//!   a live, healthy holder on the day the work runs long — the most common Redis lock bug
//!   (lab 4's overrun scenario) — and a long one keeps everyone waiting after a crash;
//! - ✅ **renewed**: a short TTL that a heartbeat thread re-arms while the holder lives,
//!   with an owner-checked `PEXPIRE` ([`RedisLock::renew`], [`Renewal`]), the way
//!   Redisson's "watchdog" does. A crashed holder's lock goes one short TTL later, as an
//!   etcd lease does; a *frozen* holder's heartbeat is frozen with it, so the lock goes
//!   during a long pause exactly as an etcd lease does.
//!
//! What renewal does not change, and what separates Redis from etcd after all: the owner
//! value is random (no order, no fencing token — draw one from a counter, and see lab 1 for
//! when that counter goes back), Redis replicates asynchronously (a failover can lose an
//! acknowledged `SET` or `INCR`: lab 5), and waiters poll instead of queueing in the server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use redis::Script;

use crate::connect::RedisConn;

use super::random_owner;

/// Deletes the key only if it still holds the caller's owner value. Redis runs a script
/// atomically, so nothing can happen between the GET and the DEL.
const COMPARE_AND_DELETE: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// The same compare-and-delete, telling what it found when the key was not ours: the owner
/// value now in the key (someone else was granted the lock before we let go) or nothing (our
/// lease ran out and nobody has taken the lock since). Redis's own answer, in Redis's order.
/// (A missing key reads as `false` in Lua, and `false` travels back as a nil reply.)
const COMPARE_AND_DELETE_REPORTING: &str = r#"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return {1, false}
end
return {0, current}
"#;

/// Re-arms the key's TTL only if it still holds the caller's owner value: the renewal.
///
/// ❌ A plain `PEXPIRE key ttl` would re-arm whatever is in the key — after our lock expired
/// and someone else took it, it would stretch *their* lock on *our* schedule.
pub const EXTEND_IF_OWNER: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"#;

/// Takes the lock and a fencing token in one atomic step.
///
/// The token must be drawn *with* the lock: a client that ran SET NX, then paused, then
/// ran INCR could draw a token higher than the holder that came after it, and its stale
/// write would then win. Inside one script nothing runs in between.
///
/// The key already holding *our* owner value means an earlier try of this acquisition
/// took the lock and its answer, token and all, was lost on the way back. The script
/// re-arms the key (the lease runs from this try) and draws a new token: higher than the
/// lost one, which nobody can have written with, and lower than any later holder's.
const ACQUIRE_WITH_TOKEN: &str = r#"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    return redis.call('INCR', KEYS[2])
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return redis.call('INCR', KEYS[2])
end
return false
"#;

/// The scripts above with their SHA1 digests, computed once: each call sends `EVALSHA`
/// (and the text only to a server that answers `NOSCRIPT`).
static ACQUIRE_WITH_TOKEN_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_WITH_TOKEN));
static COMPARE_AND_DELETE_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(COMPARE_AND_DELETE));
static COMPARE_AND_DELETE_REPORTING_SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(COMPARE_AND_DELETE_REPORTING));
static EXTEND_IF_OWNER_SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_IF_OWNER));

/// How often a waiting client tries again.
pub const RETRY_EVERY: Duration = Duration::from_millis(20);

/// One acquisition of the lock.
#[derive(Clone, Debug)]
pub struct Held {
    /// The random value stored in the key: proof of ownership for the release.
    pub owner: String,
    /// The fencing token drawn with the lock, when fencing is on.
    pub token: Option<i64>,
    /// When the command that set the key was sent. Redis starts the key's TTL when it runs
    /// that command, later: until `asked_at + ttl` the key cannot have expired by itself.
    pub asked_at: Instant,
}

/// What a release found in Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// The key still held our owner value, and is deleted: our lease lasted until we let go.
    Deleted,
    /// The key held someone else's owner value: Redis had granted them the lock before we
    /// let go, while we still believed we held it.
    HeldBy(String),
    /// No key: our lease ran out and nobody held the lock at the moment we let go.
    Gone,
}

impl Release {
    pub fn deleted(&self) -> bool {
        *self == Release::Deleted
    }
}

pub struct RedisLock {
    connection: RedisConn,
    pub key: String,
    pub ttl: Duration,
    /// How long [`RedisLock::acquire_within`] sleeps between tries ([`RETRY_EVERY`]).
    pub retry_every: Duration,
}

impl RedisLock {
    pub fn new(connection: RedisConn, key: &str, ttl: Duration) -> RedisLock {
        RedisLock {
            connection,
            key: key.to_string(),
            ttl,
            retry_every: RETRY_EVERY,
        }
    }

    /// ✅ One try of a new acquisition: a fresh owner value, then [`RedisLock::try_acquire_as`].
    /// None when someone else holds the lock. To try again for the same acquisition, keep
    /// the value and call `try_acquire_as` with it, as [`RedisLock::acquire_within`] does.
    pub fn try_acquire(&mut self) -> Result<Option<Held>> {
        self.try_acquire_as(&random_owner())
    }

    /// ✅ One try with `owner`, the value drawn once for this acquisition, before its first
    /// try: `SET key owner NX PX ttl GET`, one atomic command that also answers with the
    /// value it found (NX and GET together: Redis 7.0). Nothing: the key was free, and is
    /// ours. Our own value: an earlier try of this acquisition took the lock and its answer
    /// was lost (lab 8, step 6) — the lock is ours, and the owner-checked renewal re-arms it,
    /// so that its lease runs from this try. Anyone else's: not ours.
    ///
    /// A lost answer is a transport error on this connection, and [`RedisLock::acquire_within`]
    /// returns that error rather than retrying (its connection is gone): finding its own value
    /// is for a caller that reconnects and tries again with the same value, as lab 8's
    /// same-owner retry does. Until the key expires, a caller that gives up instead leaves it
    /// held with nobody working (lab 8's give-up policy).
    ///
    /// ❌ A new value on every try cannot tell its own lost `SET` from someone else's lock,
    /// and waits a whole TTL behind itself: lab 8's `new-owner` retry, played on purpose in
    /// `src/labs/network/lost_reply.rs` beside the same-owner one. A new value per try also
    /// makes the owner values depend on timing (how many tries a waiter needed), which
    /// `--seed` cannot replay.
    pub fn try_acquire_as(&mut self, owner: &str) -> Result<Option<Held>> {
        let asked_at = Instant::now();
        let found: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg(owner)
            .arg("NX")
            .arg("PX")
            .arg(self.ttl_ms())
            .arg("GET")
            .query(&mut self.connection)
            .context("SET NX PX GET (NX with GET needs Redis 7.0 or later)")?;
        let held = |asked_at| Held {
            owner: owner.to_string(),
            token: None,
            asked_at,
        };
        match found {
            None => Ok(Some(held(asked_at))),
            Some(value) if value == owner => {
                let rearmed_at = Instant::now();
                let rearmed = self.renew(&held(rearmed_at))?;
                Ok(rearmed.then(|| held(rearmed_at)))
            }
            Some(_) => Ok(None),
        }
    }

    /// ✅ The same acquisition, plus a fencing token from the counter `counter_key`,
    /// drawn atomically with the lock; a fresh owner value, as [`RedisLock::try_acquire`].
    pub fn try_acquire_fenced(&mut self, counter_key: &str) -> Result<Option<Held>> {
        self.try_acquire_fenced_as(counter_key, &random_owner())
    }

    /// ✅ [`RedisLock::try_acquire_as`] with a fencing token: a retry that finds its own
    /// value in the key holds the lock, with a new token (see [`ACQUIRE_WITH_TOKEN`]).
    pub fn try_acquire_fenced_as(
        &mut self,
        counter_key: &str,
        owner: &str,
    ) -> Result<Option<Held>> {
        let asked_at = Instant::now();
        let token: Option<i64> = ACQUIRE_WITH_TOKEN_SCRIPT
            .key(&self.key)
            .key(counter_key)
            .arg(owner)
            .arg(self.ttl_ms())
            .invoke(&mut self.connection)
            .context("acquiring with a fencing token")?;
        Ok(token.map(|token| Held {
            owner: owner.to_string(),
            token: Some(token),
            asked_at,
        }))
    }

    /// Tries until the lock is ours or `wait` has passed. A bounded wait: a client that
    /// waits forever for a lock turns a stuck holder into a stuck application.
    ///
    /// The owner value is drawn once, before the first try: every try of this acquisition
    /// sends the same one (see [`RedisLock::try_acquire_as`]).
    pub fn acquire_within(
        &mut self,
        wait: Duration,
        fence_counter: Option<&str>,
    ) -> Result<Option<Held>> {
        let first = self.retry_every;
        Ok(self.acquire_backing_off(wait, fence_counter, first)?.0)
    }

    /// [`RedisLock::acquire_within`], trying again after `first_pause`, then twice as long
    /// each time up to `retry_every`; also says how many tries it took. A holder that keeps
    /// the lock for a millisecond or two is waited for a millisecond or two, not 20.
    pub fn acquire_backing_off(
        &mut self,
        wait: Duration,
        fence_counter: Option<&str>,
        first_pause: Duration,
    ) -> Result<(Option<Held>, u32)> {
        let deadline = Instant::now() + wait;
        let owner = random_owner();
        let mut pause = first_pause.min(self.retry_every);
        let mut tries = 0;
        loop {
            tries += 1;
            let held = match fence_counter {
                Some(counter) => self.try_acquire_fenced_as(counter, &owner)?,
                None => self.try_acquire_as(&owner)?,
            };
            if held.is_some() || Instant::now() >= deadline {
                return Ok((held, tries));
            }
            thread::sleep(pause);
            pause = (pause * 2).min(self.retry_every);
        }
    }

    /// ✅ Compare-and-delete: true if our key was deleted, false if it was no longer ours
    /// (it expired, and perhaps someone else holds it now).
    pub fn release(&mut self, held: &Held) -> Result<bool> {
        let deleted: i64 = COMPARE_AND_DELETE_SCRIPT
            .key(&self.key)
            .arg(&held.owner)
            .invoke(&mut self.connection)
            .context("releasing with compare-and-delete")?;
        Ok(deleted == 1)
    }

    /// ✅ Compare-and-delete that also says what it found: the labs' evidence of whether
    /// Redis handed the lock to someone else before this holder let go.
    pub fn release_reporting(&mut self, held: &Held) -> Result<Release> {
        let (deleted, current): (i64, Option<String>) = COMPARE_AND_DELETE_REPORTING_SCRIPT
            .key(&self.key)
            .arg(&held.owner)
            .invoke(&mut self.connection)
            .context("releasing with compare-and-delete")?;
        Ok(match (deleted, current) {
            (1, _) => Release::Deleted,
            (_, Some(owner)) => Release::HeldBy(owner),
            (_, None) => Release::Gone,
        })
    }

    /// ✅ Renews our lock for another full TTL, if it is still ours (see [`EXTEND_IF_OWNER`]).
    /// False: the key expired or belongs to someone else — the lock is lost, and only a new
    /// acquisition can take it back.
    pub fn renew(&mut self, held: &Held) -> Result<bool> {
        let renewed: i64 = EXTEND_IF_OWNER_SCRIPT
            .key(&self.key)
            .arg(&held.owner)
            .arg(self.ttl_ms())
            .invoke(&mut self.connection)
            .context("renewing with an owner-checked PEXPIRE")?;
        Ok(renewed == 1)
    }

    /// `WAIT replicas timeout` on the lock's own connection: how many replicas have
    /// acknowledged every write this connection made so far (the `SET NX` included).
    /// It reports on replication; it undoes nothing on the primary when the answer is short.
    pub fn wait_for_replicas(&mut self, replicas: i64, timeout: Duration) -> Result<i64> {
        redis::cmd("WAIT")
            .arg(replicas)
            .arg(timeout.as_millis() as u64)
            .query(&mut self.connection)
            .context("WAIT")
    }

    /// The key's remaining time to live in milliseconds, as Redis sees it:
    /// -2 when the key is gone, -1 when it exists with no expiry.
    pub fn pttl(&mut self) -> Result<i64> {
        redis::cmd("PTTL")
            .arg(&self.key)
            .query(&mut self.connection)
            .context("PTTL")
    }

    /// Who holds the lock now and for how much longer, in one round trip.
    pub fn owner_and_pttl(&mut self) -> redis::RedisResult<(Option<String>, i64)> {
        owner_and_pttl(&mut self.connection, &self.key)
    }

    fn ttl_ms(&self) -> u64 {
        self.ttl.as_millis().max(1) as u64
    }
}

// The naive lock, broken four ways. Each ❌ method is one real mistake on its own, with the
// rest of the lock done right, so that lab 2 can show one bug at a time beside its fix.
impl RedisLock {
    /// ❌ Check-then-set: `GET` the key, and if nobody holds the lock, `SET` it.
    ///
    /// Two commands, and Redis serves other clients in between. Every client whose GET
    /// lands before the first SET sees a free lock; each then SETs its own owner over the
    /// one before and returns "acquired": several holders at once, each sure it is alone.
    /// `window` is extra time between the GET and the SET (a slow network, a busy client),
    /// so the race shows on a quiet machine too. The key does get a TTL here: this variant
    /// has exactly one bug.
    ///
    /// Fix: [`RedisLock::try_acquire`], where `SET NX` asks and takes in one command.
    pub fn try_acquire_get_then_set(&mut self, window: Duration) -> Result<Option<Held>> {
        let current: Option<String> = redis::cmd("GET")
            .arg(&self.key)
            .query(&mut self.connection)
            .context("GET")?;
        if current.is_some() {
            return Ok(None);
        }
        if !window.is_zero() {
            thread::sleep(window);
        }
        let owner = random_owner();
        let asked_at = Instant::now();
        redis::cmd("SET")
            .arg(&self.key)
            .arg(&owner)
            .arg("PX")
            .arg(self.ttl_ms())
            .query::<()>(&mut self.connection)
            .context("SET")?;
        Ok(Some(Held {
            owner,
            token: None,
            asked_at,
        }))
    }

    /// ❌ `SETNX key owner`: atomic, but with no expiry.
    ///
    /// The race is gone — SETNX asks and takes in one command — but the key never expires.
    /// A holder that dies before releasing (SIGKILL, the OOM killer, a lost machine) leaves
    /// the key behind for good: `PTTL` answers -1, and every other client waits forever.
    ///
    /// Fix: [`RedisLock::try_acquire`], `SET NX PX ttl`: a dead holder's lock lapses.
    pub fn try_acquire_setnx(&mut self) -> Result<Option<Held>> {
        let owner = random_owner();
        let asked_at = Instant::now();
        let created: bool = redis::cmd("SETNX")
            .arg(&self.key)
            .arg(&owner)
            .query(&mut self.connection)
            .context("SETNX")?;
        Ok(created.then_some(Held {
            owner,
            token: None,
            asked_at,
        }))
    }

    /// ❌ `SETNX`, then `PEXPIRE`: the expiry added by a second command.
    ///
    /// It looks like the fix for [`RedisLock::try_acquire_setnx`], and it works until the
    /// client dies between the two commands: then the key stays with no expiry, exactly as
    /// if it had never been given one. `between` runs in that gap — lab 2 kills the worker
    /// there; in production the gap is a crash, a network timeout or a deploy.
    ///
    /// Fix: [`RedisLock::try_acquire`], `SET NX PX ttl`: one command, no gap to die in.
    pub fn try_acquire_setnx_then_expire(
        &mut self,
        between: impl FnOnce(&Held) -> Result<()>,
    ) -> Result<Option<Held>> {
        let Some(held) = self.try_acquire_setnx()? else {
            return Ok(None);
        };
        between(&held)?;
        redis::cmd("PEXPIRE")
            .arg(&self.key)
            .arg(self.ttl_ms())
            .query::<()>(&mut self.connection)
            .context("PEXPIRE")?;
        Ok(Some(held))
    }

    /// ❌ Release with a plain `DEL key`, without asking whose key it is.
    ///
    /// If our lock expired while we worked, the key may now belong to the next holder, and
    /// DEL removes *their* lock; a third client then takes it while they still work. Returns
    /// true if a key was deleted — whoever it belonged to.
    ///
    /// Fix: [`RedisLock::release`], compare-and-delete in one Lua script. (GET, compare in
    /// the client, then DEL is no fix: the key can change hands between the GET and the DEL.)
    pub fn release_by_del(&mut self) -> Result<bool> {
        let deleted: i64 = redis::cmd("DEL")
            .arg(&self.key)
            .query(&mut self.connection)
            .context("DEL")?;
        Ok(deleted == 1)
    }
}

/// The lock as Redis sees it: the owner value in `key` (if any) and its PTTL (-2: no key,
/// -1: no expiry), read together in MULTI/EXEC so that both describe the same moment.
pub fn owner_and_pttl(
    connection: &mut redis::Connection,
    key: &str,
) -> redis::RedisResult<(Option<String>, i64)> {
    redis::pipe()
        .atomic()
        .cmd("GET")
        .arg(key)
        .cmd("PTTL")
        .arg(key)
        .query(connection)
}

/// ✅ The renewed lock's heartbeat: a thread that re-arms our key every TTL/3 with
/// [`RedisLock::renew`], on a connection of its own, until dropped.
///
/// Its own thread and connection, because the holder's main thread is busy with the work.
/// And that is also its limit: SIGSTOP stops every thread of the process, so a frozen
/// holder's heartbeat is frozen with it, its key runs out, and someone else gets the lock —
/// exactly what happens to an etcd lease. Renewal makes a *dead* holder's lock go fast and a
/// *live* holder's lock stay; it cannot tell a paused holder from a dead one.
pub struct Renewal {
    stop: Arc<AtomicBool>,
    /// When the last renewal that got through was sent (None before the first).
    renewed: Arc<std::sync::Mutex<Option<Instant>>>,
    thread: Option<JoinHandle<()>>,
}

/// What the heartbeat reports when it gives the lock up.
pub type OnLost = Box<dyn FnOnce(String) + Send>;

/// What the heartbeat reports when a renewal fails while the lock may still be ours: the
/// first failure after a renewal that got through (not each retry), and whether it was a
/// timeout (no answer in time) rather than an error (a reset, a refused connection).
pub type OnFailed = Box<dyn FnMut(RenewalFailed) + Send>;

/// A renewal that failed: [`OnFailed`]'s news.
#[derive(Clone, Debug)]
pub struct RenewalFailed {
    pub timed_out: bool,
    pub why: String,
}

impl RenewalFailed {
    fn of(err: &anyhow::Error) -> RenewalFailed {
        let timed_out = err.chain().any(|cause| {
            cause
                .downcast_ref::<redis::RedisError>()
                .is_some_and(|e| e.is_timeout())
                || cause.downcast_ref::<std::io::Error>().is_some_and(|e| {
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                    )
                })
        });
        RenewalFailed {
            timed_out,
            why: super::causes(err),
        }
    }
}

impl Renewal {
    /// [`Renewal::start_from`] with the lease counted from now: for a caller that does not
    /// know when its `SET NX PX` went out. Late by the grant's trip back, which the margin
    /// must then cover.
    pub fn start(lock: RedisLock, held: Held, on_lost: OnLost) -> Renewal {
        Renewal::start_from(lock, held, Instant::now(), on_lost)
    }

    /// Starts renewing `held` on `lock` (a connection of the heartbeat's own), its first
    /// lease counted from `sent`, when the `SET NX PX` that won it went out: Redis started
    /// the TTL somewhere between that send and the reply, so only the send is a moment the
    /// lease cannot have begun before. Counted from the reply instead, a grant whose answer
    /// came back slowly would make the heartbeat believe in a lease that Redis had already
    /// let go. `on_lost` hears, once, why the lock is gone: Redis answered that the key is
    /// no longer ours, or no renewal got through before the last one ran out.
    pub fn start_from(lock: RedisLock, held: Held, sent: Instant, on_lost: OnLost) -> Renewal {
        Renewal::start_reporting(lock, held, sent, Box::new(|_| {}), on_lost)
    }

    /// [`Renewal::start_from`], and `on_failed` hears the first failed renewal of each run
    /// of failures. That moment, not the give-up, is when the holder could first have
    /// known: the heartbeat retries until the lease it last won runs out, so on a slow
    /// machine its give-up may come after the server has already let the key go.
    pub fn start_reporting(
        mut lock: RedisLock,
        held: Held,
        sent: Instant,
        mut on_failed: OnFailed,
        on_lost: OnLost,
    ) -> Renewal {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_flag = stop.clone();
        let last = Arc::new(std::sync::Mutex::new(None));
        let renewed_at = last.clone();
        let thread = thread::spawn(move || {
            let every = lock.ttl / 3;
            let margin = (lock.ttl / 10).max(Duration::from_millis(50));
            let mut renewed = sent;
            let mut next_try = renewed + every;
            let mut failing = false;
            while !stop_flag.load(Ordering::SeqCst) {
                if Instant::now() < next_try {
                    thread::sleep(Duration::from_millis(10));
                    continue;
                }
                let tried = Instant::now();
                // A reset fails at once, but a server that stops answering (a partition, a
                // frozen process) gives no error at all: the call would wait out the
                // client's own timeout, long past the lease. Bound it by the lease left.
                let left = lock.ttl.saturating_sub(renewed.elapsed() + margin);
                let bound = Some(left.max(Duration::from_millis(1)));
                let _ = lock.connection.set_read_timeout(bound);
                let _ = lock.connection.set_write_timeout(bound);
                match lock.renew(&held) {
                    Ok(true) => {
                        renewed = tried;
                        failing = false;
                        *renewed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(tried);
                        next_try = tried + every;
                    }
                    // The key is gone or someone else's: Redis's own word, the end at once.
                    Ok(false) => {
                        if !stop_flag.load(Ordering::SeqCst) {
                            on_lost(format!(
                                "PEXPIRE found the key no longer ours, {}ms after the last renewal",
                                renewed.elapsed().as_millis()
                            ));
                        }
                        return;
                    }
                    // One failed renewal is not a loss: the key lives a full TTL after the
                    // last one that got through. Past that (less a margin), give it up.
                    Err(err) => {
                        if !failing && !stop_flag.load(Ordering::SeqCst) {
                            failing = true;
                            on_failed(RenewalFailed::of(&err));
                        }
                        if renewed.elapsed() + margin >= lock.ttl {
                            on_lost(format!(
                                "no renewal for {}ms of a {}ms TTL (last try: {})",
                                renewed.elapsed().as_millis(),
                                lock.ttl.as_millis(),
                                super::causes(&err)
                            ));
                            return;
                        }
                        next_try = Instant::now() + Duration::from_millis(100);
                    }
                }
            }
        });
        Renewal {
            stop,
            renewed: last,
            thread: Some(thread),
        }
    }

    /// When the last renewal that got through was sent, on the monotonic clock; None
    /// before the first.
    pub fn last_renewed(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stops renewing (before a release, so that no renewal races the delete).
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.halt();
    }
}
