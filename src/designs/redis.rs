//! The Redis lock designs: `SET key owner NX PX ttl` per record ([`crate::lock::redis`]),
//! then the job. The lock is a lease; what each design adds decides whether a holder that
//! outlived it can still do harm.

use std::time::Duration;

use anyhow::{Context, Result};

use super::{Desk, Done, Guard, Holding, LetGo, Point, Service};
use super::{claim_read_work_write, read_work_write};
use crate::lock::redis::{Held, Renewal};

/// A waiter's first pause; each next one twice as long, up to the lock's `retry_every`. A
/// holder keeps a record's lock for a job's few round trips: a waiter that always slept
/// the full pause would leave the record idle longer than it was held.
const FIRST_PAUSE: Duration = Duration::from_millis(1);

/// ❌ redis-lock: take the record's Redis lock, read, decide, write, let go.
///
/// Inside the lock everything looks safe: the client checks that the job is not done,
/// reads the value, computes the new one and writes it in one transaction. But the lock is
/// a lease. A client frozen after its read (a GC pause, a VM migration) wakes up past the
/// TTL, when another client has already taken the lock, done this very job and written
/// the record again. Nothing stops the sleeper: it writes its stale value over the
/// others' work — a duplicate and a lost update, with a correct lock. Frozen before its
/// COMMIT it does the same harm the other way round: the next holder read before that
/// COMMIT, waits on the row, and then writes its own stale value over the sleeper's.
///
/// Fix: [`redis_fenced`] — or no lock at all ([`super::no_lock`]).
pub fn redis_lock<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    under_redis_lock(d, job, Token::None, |d, job, _| {
        read_work_write(d, job, Guard::None)
    })
}

/// ❌ redis-renewed: the same lock, renewed every TTL/3 by a heartbeat thread on a
/// connection of its own, no token. The heartbeat is a thread of the client's process: a
/// pause freezes it with the client, and the key runs out as if never renewed (lab 4).
pub fn redis_renewed<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    under_redis_lock(d, job, Token::None, |d, job, held| {
        let heartbeat = d.heartbeat(&d.lock_name(job))?;
        let renewal = Renewal::start(heartbeat, held.clone(), Box::new(|_| {}));
        let done = read_work_write(d, job, Guard::None);
        renewal.stop();
        done
    })
}

/// ❌ fenced-write-only: the same lock, a fencing token drawn with it (`INCR`), and the
/// record takes the write only if it has seen no higher token ([`Guard::NotLower`]).
///
/// It refuses a holder frozen *before* its write: by then a higher token has written the
/// record. It does not survive a holder frozen *inside* its write's transaction, the row
/// written and locked: the next holder's read cannot see the uncommitted write, its own
/// write waits for the sleeper's row lock and then passes (its token is higher), and it
/// writes a value computed from the read before — the sleeper's work is gone. The token
/// fenced the write, not the read. And a Redis restarted empty starts its counter again:
/// once it climbs back to a record's highest token, `not lower` lets a reissued token
/// through beside its first holder.
///
/// Fix: [`redis_fenced`].
pub fn fenced_write_only<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    under_redis_lock(d, job, Token::FromRedis, |d, job, held| {
        let token = held.token.context("a fenced lock without a token")?;
        read_work_write(d, job, Guard::NotLower(token))
    })
}

/// ✅ redis-fenced: the same lock and token, and the token guards the *read*: one
/// statement claims the record with it and reads it ([`Desk::claim`]); the write then
/// needs the claim to be still its own ([`Guard::ClaimedBy`]).
///
/// A holder frozen before its claim wakes up to a record that a higher token has claimed:
/// it claims nothing and writes nothing. A holder frozen after its claim finds, when it
/// writes, that a higher token claimed the record meanwhile: refused. A holder frozen
/// inside its write's transaction holds the row: the next holder's claim waits for it,
/// and reads what the sleeper committed. The claim is strict (a higher token only), so a
/// Redis that restarts empty and hands tokens out again gets refusals, not lost data. The
/// lock still keeps clients off each other's jobs; the record decides.
pub fn redis_fenced<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    under_redis_lock(d, job, Token::FromRedis, |d, job, held| {
        let token = held.token.context("a fenced lock without a token")?;
        claim_read_work_write(d, job, token)
    })
}

/// ✅ redis-durable-token: [`redis_fenced`] with its token from a sequence in the store.
/// An empty Redis, restarted, forgets its `INCR` counter and hands token 1 out again; the
/// sequence remembers, so not even a refusal follows.
pub fn redis_durable_token<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    under_redis_lock(d, job, Token::FromSequence, |d, job, held| {
        let token = held.token.context("a fenced lock without a token")?;
        claim_read_work_write(d, job, token)
    })
}

/// Where a fenced lock's token comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Token {
    None,
    /// `INCR` on a counter in the lock's Redis, atomically with the `SET`.
    FromRedis,
    /// [`Desk::sequence_token`], once the lock is held.
    FromSequence,
}

/// Takes the job's Redis lock within the caller's wait, does `body` under it, lets go
/// (compare-and-delete, saying what it found). An error in `body` leaves the lock to
/// expire.
fn under_redis_lock<D: Desk + ?Sized>(
    d: &mut D,
    job: &D::Job,
    token: Token,
    body: impl FnOnce(&mut D, &D::Job, &Held) -> Result<Done>,
) -> Result<Done> {
    let name = d.lock_name(job);
    let counter = (token == Token::FromRedis).then(|| d.redis_counter(job));
    let wait = d.lock_wait();
    let lock = d.redis()?;
    lock.key = name.clone();
    let (held, tries) = lock.acquire_backing_off(wait, counter.as_deref(), FIRST_PAUSE)?;
    let Some(mut held) = held else {
        return Ok(Done::NotTaken);
    };
    if token == Token::FromSequence {
        held.token = Some(d.sequence_token()?);
    }
    let holding = Holding {
        owner: Some(held.owner.clone()),
        token: held.token,
        tries,
        ..Holding::new(Service::Redis, name)
    };
    d.at(job, Point::Locked(&holding))?;
    let done = body(d, job, &held)?;
    let lock = d.redis()?;
    let ttl = lock.ttl;
    let answer = lock.release_reporting(&held);
    let let_go = LetGo::Redis {
        answer: &answer,
        held: &held,
        ttl,
    };
    d.at(job, Point::Released(&holding, let_go))?;
    Ok(done)
}
