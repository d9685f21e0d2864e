//! The queue consumer's script (lab 3, `skip-locked`): claim a job the way its mode says,
//! work, record the processing, mark the job done — on the lab's command, one round at a time.

use std::io::{self, BufRead};
use std::time::{Duration, SystemTime};

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::connect;
use crate::events::facts::{Claimed, JobStep};
use crate::events::{Emitter, Event, What};
use crate::queue::*;

/// How long a worker that found nothing claimable sleeps before it asks again. In
/// skip-locked mode a killed worker's job is claimed again by the next poll, so lab 3's
/// reclaim time includes up to this much; a `FOR UPDATE` waiter is woken by Postgres itself.
pub const IDLE_POLL: Duration = Duration::from_millis(10);

/// One worker's script. It takes commands on stdin, one per line:
/// `drain <round>` (process that round's jobs until none is pending), `hold <round>`
/// (claim one job, report it, and wait for `commit` before finishing it), and end of
/// input to exit.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Role {
    pub name: String,
    pub postgres_url: String,
    pub mode: Mode,
    pub queue: Queue,
    /// `application_name` of the session, so the lab can find it in `pg_stat_activity`.
    pub session: String,
    pub work_ms: u64,
    pub window_ms: u64,
    pub idle_timeout_ms: Option<u64>,
    /// Longer than any lock wait the lab causes (a for-update worker waits out a freeze).
    pub statement_timeout_ms: u64,
}

/// A claimed job: its id and when the claim happened (the database's clock).
struct Claim {
    job: i64,
    claimed_at: SystemTime,
}

struct Statements {
    claim: postgres::Statement,
    naive_mark: postgres::Statement,
    record: postgres::Statement,
    mark_done: postgres::Statement,
    any_pending: postgres::Statement,
}

pub fn run(role: &Role) -> Result<()> {
    let me = Emitter::new(&role.name);
    let mut db = connect::postgres(&role.postgres_url)?;
    db.batch_execute(&format!(
        "SET application_name = '{}'; SET statement_timeout = {}",
        role.session, role.statement_timeout_ms
    ))?;
    if let Some(ms) = role.idle_timeout_ms {
        db.batch_execute(&format!("SET idle_in_transaction_session_timeout = {ms}"))?;
    }
    let q = &role.queue;
    let claim_sql = match role.mode {
        Mode::SkipLocked => CLAIM_SKIP_LOCKED,
        Mode::ForUpdate => CLAIM_FOR_UPDATE,
        Mode::Naive => NAIVE_PICK,
    };
    let statements = Statements {
        claim: db.prepare(&q.sql(claim_sql))?,
        naive_mark: db.prepare(&q.sql(NAIVE_MARK))?,
        record: db.prepare(&q.sql(RECORD))?,
        mark_done: db.prepare(&q.sql(MARK_DONE))?,
        any_pending: db.prepare(&q.sql(ANY_PENDING))?,
    };
    let mut worker = Worker {
        role,
        me,
        db,
        st: statements,
    };

    let stdin = io::stdin();
    let mut lines = stdin.lock().lines();
    while let Some(line) = lines.next() {
        let line = line?;
        let mut words = line.split_whitespace();
        let command = words.next().unwrap_or("");
        let round: i32 = words.next().and_then(|w| w.parse().ok()).unwrap_or(0);
        match command {
            "drain" => worker.drain(round)?,
            "hold" => {
                if !worker.hold(round, &mut lines)? {
                    return Ok(()); // Postgres ended the session: nothing left to do
                }
            }
            "" => {}
            other => bail!("unknown command {other:?}"),
        }
    }
    Ok(())
}

struct Worker<'a> {
    role: &'a Role,
    me: Emitter,
    db: connect::PgClient,
    st: Statements,
}

impl Worker<'_> {
    /// Tells the lab what this worker does with a job: one line on its stdout.
    fn say(&self, step: fn(JobStep) -> What, text: String, job: i64) {
        let pid = Some(std::process::id() as i32);
        self.send(self.me.event(step(JobStep { job, pid }), text));
    }

    /// Sends an event marked with this worker's queue mode.
    fn send(&self, mut event: Event) {
        event.part.mode = Some(self.role.mode.name().into());
        self.me.send(event);
    }

    /// Claims one job and says so, waits for the lab's `commit`, then finishes the job.
    /// False when that failed because Postgres had ended the session meanwhile.
    fn hold(
        &mut self,
        round: i32,
        commands: &mut impl Iterator<Item = io::Result<String>>,
    ) -> Result<bool> {
        let Some(claim) = self.claim(round)? else {
            bail!("was told to hold a job of round {round}, but none was pending");
        };
        let how = match self.role.mode {
            Mode::Naive => "SELECT, then UPDATE to 'running'; no transaction holds it",
            Mode::ForUpdate => "FOR UPDATE; its transaction stays open",
            Mode::SkipLocked => "FOR UPDATE SKIP LOCKED; its transaction stays open",
        };
        let job = claim.job;
        // Only an open transaction's row lock is a lock Postgres holds for the worker (the
        // `backend` fact a picture draws as a lock); the naive queue's claim is just a status.
        let backend = match self.role.mode {
            Mode::Naive => None,
            Mode::ForUpdate | Mode::SkipLocked => Some("postgres".into()),
        };
        self.send(self.me.event(
            Claimed {
                job: Some(job),
                pid: Some(std::process::id() as i32),
                backend,
                ..Claimed::default()
            },
            format!("claims job {job} ({how}) and works on it…"),
        ));

        // Frozen or killed here, by the lab, while it holds the job.
        match commands.next() {
            Some(Ok(line)) if line.trim() == "commit" => {}
            _ => bail!("the lab went away while this worker held job {job}"),
        }

        match self.finish(&claim) {
            Ok(()) => {
                self.say(
                    What::Committed,
                    format!("finishes job {job}: recorded and committed"),
                    job,
                );
                Ok(true)
            }
            Err(err) => {
                let why = connect::pg_cause(&err);
                self.say(
                    What::FinishFailed,
                    format!(
                        "wakes, and its first statement (the INSERT recording job {job}) fails: \
                         Postgres says \"{why}\" — nothing recorded"
                    ),
                    job,
                );
                Ok(false)
            }
        }
    }

    /// Claims, works, records, commits — until the round has no pending job left. A worker
    /// that finds nothing claimable polls again every [`IDLE_POLL`].
    fn drain(&mut self, round: i32) -> Result<()> {
        loop {
            match self.claim(round)? {
                Some(claim) => self.finish(&claim)?,
                None => {
                    // Nothing claimable. Pending jobs may still exist, held by others
                    // (skip-locked skips them): they come back if their holder dies.
                    let row = self.db.query_one(&self.st.any_pending, &[&round])?;
                    if !row.get::<_, bool>(0) {
                        return Ok(());
                    }
                    std::thread::sleep(IDLE_POLL);
                }
            }
        }
    }

    /// Claims one job. In the transactional modes this opens a transaction that stays open
    /// until [`Worker::finish`] commits it (or the connection dies).
    fn claim(&mut self, round: i32) -> Result<Option<Claim>> {
        if self.role.mode.transactional() {
            self.db.batch_execute("BEGIN")?;
            let row = self.db.query_opt(&self.st.claim, &[&round])?;
            match row {
                Some(row) => Ok(Some(Claim {
                    job: row.get(0),
                    claimed_at: row.get(1),
                })),
                None => {
                    self.db.batch_execute("ROLLBACK")?;
                    Ok(None)
                }
            }
        } else {
            let Some(row) = self.db.query_opt(&self.st.claim, &[&round])? else {
                return Ok(None);
            };
            let job: i64 = row.get(0);
            if self.role.window_ms > 0 {
                std::thread::sleep(Duration::from_millis(self.role.window_ms));
            }
            let marked = self
                .db
                .query_one(&self.st.naive_mark, &[&job, &self.role.name])?;
            Ok(Some(Claim {
                job,
                claimed_at: marked.get(0),
            }))
        }
    }

    /// Works, records the processing, marks the job done, and commits.
    fn finish(&mut self, claim: &Claim) -> Result<(), postgres::Error> {
        if self.role.work_ms > 0 {
            std::thread::sleep(Duration::from_millis(self.role.work_ms));
        }
        let name = &self.role.name;
        self.db
            .execute(&self.st.record, &[&claim.job, name, &claim.claimed_at])?;
        self.db.execute(&self.st.mark_done, &[&claim.job, name])?;
        if self.role.mode.transactional() {
            self.db.batch_execute("COMMIT")?;
        }
        Ok(())
    }
}
