//! The invoicer's script (lab 7, `no-lock`): walk the job list from a starting point and do
//! every job not done yet, the way [`crate::invoices`] says for the run's approach.
//!
//! The worker connects, reads the list and says `ready`, then waits for `start`, so that
//! every worker begins at the same moment. A worker the lab means to freeze or kill stops at
//! its first job's [`Moment`]: it says `claimed` and waits for `go` on stdin, and the lab
//! freezes it (or kills it) there. At the end it says `finished`, with its counts and the
//! latency of every job it invoiced.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use crate::connect;
use crate::designs::Done;
use crate::designs::no_lock::owner_of;
use crate::events::Emitter;
use crate::events::facts::{Claimed, Finished, Ready, Wrote};
use crate::invoices::{Approach, Desk, Gate, Job, Moment, StopInfo, Tables};
use crate::lock::redis::RedisLock;
use crate::store;

#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Role {
    pub name: String,
    pub approach: Approach,
    pub postgres_url: String,
    pub redis_url: Option<String>,
    pub tables: Tables,
    /// `application_name` of the session, so the lab can find it in `pg_stat_activity`.
    pub session: String,
    /// Where in the job list this worker starts (it wraps around to the start).
    pub start_at: usize,
    /// Partitioned: (this worker's partition, how many partitions).
    pub partition: Option<(u32, u32)>,
    /// Where to stop once for the lab, at the first job that gets that far.
    pub stop_at: Option<Moment>,
    pub work_ms: u64,
    pub ttl_ms: u64,
    pub lock_wait_ms: u64,
    pub statement_timeout_ms: u64,
    pub lock_class: i32,
    pub redis_key_prefix: String,
    pub fence_counter: String,
}

/// Stops once, at the role's moment: says `claimed`, then waits for the lab's `go`.
struct StopOnce {
    me: Emitter,
    at: Option<Moment>,
}

impl Gate for StopOnce {
    fn at(&mut self, moment: Moment, job: &Job, info: StopInfo) -> Result<()> {
        if self.at != Some(moment) {
            return Ok(());
        }
        self.at = None;
        let what = moment.what();
        let lock = match (&info.lock_key, info.token) {
            (Some(_), Some(token)) => format!(" (holds the Redis lock, token {token})"),
            (Some(_), None) => " (holds the Redis lock)".to_string(),
            _ => String::new(),
        };
        let event = self.me.event(
            Claimed {
                job: Some(job.id.into()),
                customer: Some(job.customer.into()),
                period: Some(job.period.into()),
                moment: Some(moment),
                lock_key: info.lock_key,
                owner: info.owner,
                token: info.token,
                pid: Some(std::process::id() as i32),
                ..Claimed::default()
            },
            format!(
                "job {} (customer {}, period {}): {what}{lock}",
                job.id, job.customer, job.period
            ),
        );
        self.me.send(event);
        super::await_command("go")
    }
}

pub fn run(role: &Role) -> Result<()> {
    let me = Emitter::new(&role.name);
    let mut db = connect::postgres(&role.postgres_url)?;
    db.batch_execute(&format!(
        "SET application_name = '{}'; SET statement_timeout = {}",
        role.session, role.statement_timeout_ms
    ))?;
    let mut desk = Desk::new(db, role.tables.clone(), &role.name)?;
    desk.work = Duration::from_millis(role.work_ms);
    desk.lock_wait = Duration::from_millis(role.lock_wait_ms);
    desk.lock_class = role.lock_class;
    desk.redis_key_prefix = role.redis_key_prefix.clone();
    desk.fence_counter = role.fence_counter.clone();
    if let Some(url) = &role.redis_url {
        desk.redis = Some(RedisLock::new(
            connect::redis(url)?,
            "",
            Duration::from_millis(role.ttl_ms),
        ));
    }
    let jobs = desk.jobs()?;
    me.send(me.event(
        Ready {
            pid: std::process::id() as i32,
        },
        format!("ready: {} jobs on the list", jobs.len()),
    ));
    super::await_command("start")?;

    desk.gate = Box::new(StopOnce {
        me: Emitter::new(&role.name),
        at: role.stop_at,
    });
    let mut latencies_us = Vec::new();
    let start = role.start_at.min(jobs.len());
    let walk: Vec<Job> = jobs[start..]
        .iter()
        .chain(&jobs[..start])
        .filter(|job| {
            role.partition
                .is_none_or(|(mine, of)| owner_of(job.customer, of) == mine)
        })
        .copied()
        .collect();
    for (i, job) in walk.iter().enumerate() {
        let invoiced = desk.invoiced_yet(&walk, i)?;
        let began = Instant::now();
        match desk.do_job(role.approach, job, invoiced)? {
            Done::Written => latencies_us.push(began.elapsed().as_micros() as u64),
            Done::Refused { token, claim } => me.send(me.event(
                Wrote {
                    job: Some(job.id.into()),
                    customer: Some(job.customer.into()),
                    token: Some(token),
                    ..Wrote::new(store::Outcome::Rejected)
                },
                refused(token, claim),
            )),
            _ => {}
        }
    }
    let tally = &desk.tally;
    me.send(me.event(
        Finished {
            tally: Some(tally.clone()),
            latencies_us: Some(latencies_us),
        },
        format!(
            "done with the list: invoiced {}, found {} done",
            tally.invoiced, tally.already_done
        ),
    ));
    Ok(())
}

/// A worker's line when the row refused its token: at the claim, or at the write.
fn refused(token: i64, claim: bool) -> String {
    if claim {
        format!("claim with token {token} found a higher fence: nothing written")
    } else {
        format!("write with token {token} found a higher fence: nothing written")
    }
}
