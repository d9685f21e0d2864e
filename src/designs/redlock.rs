//! Redlock ([`crate::lock::redlock`], lab 6): one lock on five independent Redis masters,
//! held while a majority granted it and its validity runs.

use std::time::Instant;

use anyhow::Result;

use super::{Desk, Done, Guard, Holding, LetGo, Point, Service};
use super::{claim_read_work_write, read_work_write};

/// ❌ redlock: a majority of five masters, no token. A client frozen past its validity
/// wakes and writes (lab 6's client pause); a master that restarts empty under a bare
/// majority (3 of 5) grants the lock to a second client while the first still works.
pub fn redlock<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    under_redlock(d, job, false)
}

/// ✅ redlock-fenced: the same lock; a token from a sequence in the store claims the record
/// before the read (lab 6's "token from a Postgres sequence"): whatever the masters
/// forget, a late holder's write is refused.
pub fn redlock_fenced<D: Desk + ?Sized>(d: &mut D, job: &D::Job) -> Result<Done> {
    under_redlock(d, job, true)
}

fn under_redlock<D: Desk + ?Sized>(d: &mut D, job: &D::Job, fenced: bool) -> Result<Done> {
    let name = d.lock_name(job);
    let wait = d.lock_wait();
    let rounds = d.redlock(&name)?.acquire_within(wait);
    let Some(held) = rounds.into_iter().last().filter(|a| a.held) else {
        return Ok(Done::NotTaken);
    };
    let token = if fenced {
        Some(d.sequence_token()?)
    } else {
        None
    };
    let holding = Holding {
        owner: Some(held.value.clone()),
        token,
        ..Holding::new(Service::Redlock, name.clone())
    };
    d.at(job, Point::Locked(&holding))?;
    let done = match token {
        Some(token) => claim_read_work_write(d, job, token)?,
        None => read_work_write(d, job, Guard::None)?,
    };
    let answers = d.redlock(&name)?.release(&held.value);
    // Taken after the round: another value on a majority proves two holders only if every
    // answer that showed it came back while this client's validity still ran.
    let within_validity = held.valid_until().is_some_and(|end| Instant::now() < end);
    let let_go = LetGo::Redlock {
        answers: &answers,
        within_validity,
    };
    d.at(job, Point::Released(&holding, let_go))?;
    Ok(done)
}
