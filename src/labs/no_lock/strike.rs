//! The lab's faults, all through the [`Nemesis`]: a worker frozen where it stopped, the one
//! killed mid-write, the resumes; and what the lab looks at while they last — the frozen
//! worker's Redis lock, its Postgres session, who waits on it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::door::{Door, Met};
use super::play::{Faults, Play, Struck, find};
use super::points::{self, WATCHED};
use crate::check::no_lock::{LockSeen, lock_seen};
use crate::connect::{self, PgClient, RedisConn};
use crate::events::Event;
use crate::events::facts::{Expired, FaultFacts, HolderNow, Session};
use crate::invoices::Approach;
use crate::labs::faults::Hand;
use crate::labs::{Stage, WorkerHandle};
use crate::lock::redis::RedisLock;
use crate::nemesis::{self, Note};
use crate::output::{count, human};

/// `$1` the frozen worker's session, `$2` the prefix of every worker session of this run,
/// `$3` the frozen job, `$4` the frozen worker: the worker sessions that wait on the frozen one, and who else has
/// invoiced its job.
const MET: &str = "
    SELECT (SELECT coalesce(array_agg(other.application_name ORDER BY other.application_name),
                            '{}')
            FROM pg_stat_activity me, pg_stat_activity other
            WHERE me.application_name = $1 AND starts_with(other.application_name, $2)
              AND me.pid = ANY(pg_blocking_pids(other.pid))),
           (SELECT min(i.worker) FROM {invoices} i
              JOIN {jobs} j ON j.customer = i.customer AND j.period = i.period
            WHERE j.id = $3 AND i.worker <> $4)";

/// How long the lab holds a customer's lock for the waiters at most, and the lock's TTL
/// meanwhile (the lab lets go itself; the TTL only bounds a lab that died holding it).
const DOOR_AT_MOST: Duration = Duration::from_secs(10);

/// `$1` the waiters' sessions: how many of them still wait on a lock in Postgres.
const STILL_WAITING: &str = "SELECT count(*) FROM pg_stat_activity
    WHERE application_name = ANY($1) AND wait_event_type = 'Lock'";

impl Play<'_> {
    /// Before resuming `who`, whom `waiters` wait on: take its customer's Redis lock, so
    /// that the next write to that customer is a waiter's ([`Door`]). True when the run may
    /// resume `who` now (the lock is the lab's, or the approach takes no Redis lock); false
    /// while another worker holds it — that one read before the COMMIT too, and the lab
    /// asks again on its next turn.
    pub(super) fn hold_door(
        &self,
        stage: &mut Stage,
        faults: &mut Faults,
        who: &str,
        waiters: &[String],
    ) -> Result<bool> {
        let Some(url) = self.redis_url.filter(|_| self.approach.uses_redis()) else {
            return Ok(true);
        };
        let Some(frozen) = faults.frozen.iter().find(|f| f.strike.worker == who) else {
            bail!("no frozen worker {who}");
        };
        let Some(key) = frozen.lock_key.clone() else {
            return Ok(true);
        };
        let customer = frozen.strike.customer;
        let mut lock = RedisLock::new(connect::redis(url)?, &key, DOOR_AT_MOST);
        let Some(held) = lock.try_acquire_as(&format!("lab-holds-for-{}", waiters.join("-")))?
        else {
            return Ok(false);
        };
        stage.record(Event::new(
            "lab",
            HolderNow {
                holder: Some("lab".into()),
                backend: Some("redis".into()),
                key: Some(key),
                ..HolderNow::default()
            },
            format!(
                "takes customer {customer}'s Redis lock itself until {} {} written: nobody \
                 reads after {who}'s COMMIT and writes first (the worst order)",
                waiters.join(", "),
                if waiters.len() == 1 { "has" } else { "have" }
            ),
        ));
        faults.doors.push(Door {
            customer,
            of: who.to_string(),
            sessions: waiters.iter().map(|w| self.session(w)).collect(),
            lock,
            held,
            until: Instant::now() + DOOR_AT_MOST,
        });
        Ok(true)
    }

    /// Lets go of each customer's lock the lab holds once its frozen worker is resumed and
    /// none of the waiters waits on a lock any more: each has written (or given up).
    pub(super) fn open_doors(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        faults: &mut Faults,
    ) -> Result<()> {
        let mut k = 0;
        while k < faults.doors.len() {
            let door = &faults.doors[k];
            let resumed = faults
                .frozen
                .iter()
                .any(|f| f.strike.worker == door.of && f.resumed);
            let waiting: i64 = db.query_one(STILL_WAITING, &[&door.sessions])?.get(0);
            let timed_out = Instant::now() >= door.until;
            if !(resumed && waiting == 0 || timed_out) {
                k += 1;
                continue;
            }
            let mut door = faults.doors.remove(k);
            door.lock.release(&door.held)?;
            stage.record(Event::new(
                "lab",
                HolderNow {
                    backend: Some("redis".into()),
                    key: Some(door.lock.key.clone()),
                    ..HolderNow::default()
                },
                if timed_out {
                    format!(
                        "lets go of customer {}'s Redis lock after {}: a waiter still waits",
                        door.customer,
                        human(DOOR_AT_MOST)
                    )
                } else {
                    format!(
                        "lets go of customer {}'s Redis lock: the workers that waited on {} \
                         have written",
                        door.customer, door.of
                    )
                },
            ));
        }
        Ok(())
    }

    /// A worker stopped at its point of a job and waits for `go`: SIGSTOP it there, then
    /// leave `go` in its pipe, for when it wakes. While w1 sleeps on an advisory lock, ask
    /// Postgres what a worker that should skip rather than queue would get.
    pub(super) fn freeze(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        hand: &mut Hand,
        worker: &mut WorkerHandle,
        struck: &Struck,
    ) -> Result<()> {
        let strike = &struck.strike;
        let note = Note::new(
            format!(
                "SIGSTOP {} (pid {}) at job {}, {}; resumes after {}{}",
                worker.name,
                worker.pid,
                strike.job,
                strike.at.label(),
                human(self.plan.pause),
                if self.exercise_wait().is_zero() {
                    ""
                } else {
                    ", once another worker meets it"
                }
            ),
            FaultFacts {
                job: Some(strike.job.into()),
                customer: Some(strike.customer.into()),
                at: Some(strike.at),
                ..FaultFacts::default()
            },
        );
        hand.play(stage, worker, nemesis::Fault::Pause, note)?;
        worker.tell("go")?;
        if strike.worker == WATCHED
            && matches!(
                self.approach,
                Approach::AdvisoryXact | Approach::AdvisorySession
            )
        {
            let class = self.role(WATCHED, 0, 0, None).lock_class;
            stage.record(points::skip_rather_than_queue(db, class, strike.customer)?);
        }
        Ok(())
    }

    /// SIGKILL w2 between its two writes: its transaction is never committed.
    pub(super) fn kill(
        &self,
        stage: &mut Stage,
        hand: &mut Hand,
        worker: &mut WorkerHandle,
        struck: &Struck,
    ) -> Result<()> {
        let strike = &struck.strike;
        let note = Note::new(
            format!(
                "SIGKILL {} (pid {}) in the middle of job {}: its transaction is not committed",
                worker.name, worker.pid, strike.job
            ),
            FaultFacts {
                job: Some(strike.job.into()),
                customer: Some(strike.customer.into()),
                ..FaultFacts::default()
            },
        );
        hand.play(stage, worker, nemesis::Fault::Kill, note)
    }

    // The strikes are played by the nemesis's player as steps added when they come (a
    // `Hand`): a frozen worker is resumed once Postgres says another worker met it — a
    // condition read back mid-run (`met`), not a time or an event.

    /// Has another worker met the frozen `who` yet — so that its point is a test, not a
    /// matter of timing? Asked of Postgres: a worker session that `pg_blocking_pids` says
    /// waits on `who`'s session (a row, an invoice key or an advisory lock it holds), or the
    /// frozen job invoiced by another worker (committed: the lab's session sees it).
    pub(super) fn met(&self, db: &mut PgClient, faults: &Faults, who: &str) -> Result<Option<Met>> {
        if self.approach == Approach::Partitioned {
            return Ok(Some(Met::Owner));
        }
        let Some(frozen) = faults.frozen.iter().find(|f| f.strike.worker == who) else {
            bail!("no frozen worker {who}");
        };
        let row = db.query_one(
            &self.tables.sql(MET),
            &[
                &self.session(who),
                &self.session(""),
                &frozen.strike.job,
                &who,
            ],
        )?;
        let (waiting, done_by): (Vec<String>, Option<String>) = (row.get(0), row.get(1));
        let prefix = self.session("");
        let waiting: Vec<String> = (waiting.iter())
            .map(|session| session[prefix.len().min(session.len())..].to_string())
            .collect();
        Ok(match done_by {
            _ if !waiting.is_empty() => Some(Met::Waiting(waiting)),
            Some(other) => Some(Met::DoneBy(other)),
            None => None,
        })
    }

    /// Just before w1's resume: what Postgres says about its session and who waits on a
    /// lock. Then SIGCONT, for w1 and each of the other frozen workers, saying how another
    /// worker met it — or that nobody did, and its point is not exercised.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn resume(
        &self,
        stage: &mut Stage,
        db: &mut PgClient,
        hand: &mut Hand,
        workers: &mut [WorkerHandle],
        faults: &mut Faults,
        who: &str,
        met: Option<Met>,
    ) -> Result<()> {
        if who == WATCHED {
            self.report_session(stage, db)?;
        }
        let Some(frozen) = faults.frozen.iter_mut().find(|f| f.strike.worker == who) else {
            bail!("no frozen worker {who}");
        };
        let job = frozen.strike.job;
        let how = match &met {
            Some(Met::Waiting(who)) => format!(
                "{} on its locks: {}",
                count(
                    who.len() as i64,
                    "worker session waits",
                    "worker sessions wait"
                ),
                who.join(", ")
            ),
            Some(Met::DoneBy(other)) => format!("{other} has invoiced job {job}"),
            Some(Met::Owner) => "nobody else may do its customers' jobs".to_string(),
            None if self.exercise_wait().is_zero() => format!(
                "a pause within its lease: nobody came to job {job} or waited on {who}: \
                 this point is not exercised"
            ),
            None => format!(
                "nobody came to job {job} or waited on {who} within {} more: this point is \
                 not exercised",
                human(self.exercise_wait())
            ),
        };
        let worker = find(workers, who)?;
        hand.play(
            stage,
            worker,
            nemesis::Fault::Resume,
            Note::new(
                format!(
                    "SIGCONT {who} after {} ({how}): it carries on from where it stopped",
                    human(frozen.at.elapsed())
                ),
                FaultFacts {
                    exercised: Some(met.is_some()),
                    ..FaultFacts::default()
                },
            ),
        )?;
        frozen.resumed = true;
        frozen.strike.exercised = met.is_some();
        if let Some(Met::Waiting(who)) = met {
            frozen.waiters = who;
        }
        if faults.resumed_at.is_none() {
            faults.resumed_at = Some(db.query_one("SELECT clock_timestamp()", &[])?.get(0));
        }
        Ok(())
    }

    /// During the freeze: the frozen worker's Redis lock as Redis sees it.
    pub(super) fn watch_lock(
        &self,
        stage: &mut Stage,
        conn: &mut RedisConn,
        faults: &mut Faults,
    ) -> Result<()> {
        let Some(frozen) = faults.watched() else {
            return Ok(());
        };
        let (Some(key), Some(owner)) = (frozen.lock_key.clone(), frozen.owner.clone()) else {
            return Ok(());
        };
        let customer = frozen.strike.customer;
        let (now, _) = crate::lock::redis::owner_and_pttl(conn, &key)
            .context("watching w1's lock in Redis")?;
        let seen = lock_seen(now.as_deref(), &owner);
        if seen != LockSeen::Held && !faults.expired_seen {
            faults.expired_seen = true;
            stage.record(Event::new(
                "redis",
                Expired {
                    ..Expired::default()
                },
                format!("w1's lock on customer {customer} has expired: for Redis the lock is free"),
            ));
        }
        if seen == LockSeen::Taken && !faults.taken_seen {
            faults.taken_seen = true;
            stage.record(Event::new(
                "redis",
                HolderNow {
                    ..HolderNow::default()
                },
                format!("another worker holds customer {customer}'s lock now, while w1 is frozen"),
            ));
        }
        Ok(())
    }

    fn report_session(&self, stage: &mut Stage, db: &mut PgClient) -> Result<()> {
        let row = db.query_opt(
            "SELECT state FROM pg_stat_activity WHERE application_name = $1",
            &[&self.session(WATCHED)],
        )?;
        let state: Option<String> = row.and_then(|r| r.get(0));
        let waiting = db.query(
            "SELECT coalesce(wait_event, '?') FROM pg_stat_activity
             WHERE starts_with(application_name, $1) AND wait_event_type = 'Lock'",
            &[&self.session("")],
        )?;
        let mut why: BTreeMap<String, i64> = BTreeMap::new();
        for row in waiting {
            *why.entry(row.get(0)).or_default() += 1;
        }
        let waits: i64 = why.values().sum();
        let text = match (state.as_deref(), waits) {
            (Some(state), 0) => {
                format!("pg_stat_activity: w1's session is '{state}'; nobody waits for it")
            }
            (Some(state), n) => format!(
                "pg_stat_activity: w1's session is '{state}'; {} wait on a lock ({})",
                count(n, "worker session", "worker sessions"),
                why.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            (None, _) => "pg_stat_activity: w1 has no session".to_string(),
        };
        stage.record(Event::new(
            "pg",
            Session {
                state,
                waiting: Some(waits),
                ..Session::default()
            },
            text,
        ));
        Ok(())
    }
}
