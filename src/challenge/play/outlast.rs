//! A lease must not outlive the test. A pause (or a held write) of 2–3 TTLs tests a lock
//! only if the lock is gone before it ends: a client that asks for a lease ten times
//! `lease_ms` would see every fault end while its key still stands, nobody else get the
//! lock, and nothing tested — a long lease rewarded. So when the fault's own time is up and
//! its client's lock is a key lockslab can read (a Redis key with a `PTTL`, a key on an
//! etcd lease, under the run's prefix: see [`super::leases`]), the fault goes on until that
//! key is gone and a newer holder of the record has read it — the worst order
//! ([`super::overtake`]) then lets the held write go — or, if the newer holder waits in
//! Postgres behind the faulted client's session instead, until that wait is seen (the lock
//! held it off), or no other job on the record is left to come. At most
//! [`Challenge::fault_bound`]: past it the fault ends, and the verdict says it ended because
//! of the bound (unknown, never a pass). A key with no expiry is waited out the same way:
//! its lease may be kept where Redis cannot see it (a deadline in its value), and a lock
//! that truly never expires keeps the fault to its bound.
//!
//! ```text
//!  594ms  pauses c2 (SIGSTOP) for 2–3 TTLs at its write, held in its proxy
//!  603ms  c2's lock: lockslab:7b2f…:lock:r0 (Redis, 5.0s to live), set since job 2 went out, …
//!  609ms  c1 (job 4 on r0) waits: lockslab:7b2f…:lock:r0 still holds c2's value
//! 1667ms  c2's key lockslab:7b2f…:lock:r0 still has 3.9s to live: the pause lasts until it is gone
//! 5570ms  c2's key lockslab:7b2f…:lock:r0 is gone: the pause lasts until a newer holder of r0 has read it
//! 5591ms  holds c3's write at its proxy, after its read of r0: c2's write first
//! ```
//!
//! While the fault lasts, lockslab also notes each other client with a job on the record
//! that has not written it, while the key still holds the faulted client's value (`KeyWait`).
//! The grader counts that as the lock holding it off only if the key still held the value
//! when the fault ended: a lease that ran out was waited out, and what came after decides.

use super::leases::{Held, Keys, its_lock};
use super::*;
use crate::challenge::challenges::BOUND_TTLS;
use crate::check::challenge::KeyWait;
use crate::events::facts::{Expired, HolderNow, Pttl};
use crate::flags::flag_duration;
use crate::nemesis::Note;
use crate::nemesis::schedule::How;

/// How often the faulted client's lock is read while the fault lasts.
const EVERY: Duration = Duration::from_millis(25);

/// A fault that lasts until its client's lock is gone.
pub(super) struct Outlast {
    client: String,
    fault: Fault,
    record: String,
    job: i64,
    /// Its strike, among the run's.
    strike: usize,
    /// The client's lock as it was when the fault began.
    lock: Keys,
    began: Instant,
    /// When the fault's own time was up: the schedule's resume (pause), or the held bytes'
    /// delay counted from when they came (delay).
    due: Option<Instant>,
    /// pause: the schedule's resume, held back until the lock is gone.
    resume: Option<Action>,
    /// delay: when the held bytes came, and the proxy began holding them for lockslab.
    came: Option<Instant>,
    /// What the timeline was told already: the lock still there, the lock gone.
    said_alive: bool,
    said_gone: bool,
    /// The waiters already noted, by job.
    seen_waiting: BTreeSet<i64>,
    /// Its client's lock is none lockslab can read in Redis or etcd: a lock in Postgres, if
    /// any (see [`Run::held_off_in_postgres`]).
    keyless: bool,
    /// The timeline was told the fault goes on to its bound, a waiter held off in Postgres.
    said_held: bool,
}

impl Outlast {
    /// The record of the job its client held when the fault began.
    pub(super) fn record(&self) -> &str {
        &self.record
    }

    /// A fault that began as the `strikes`th strike was recorded.
    fn new(
        client: String,
        fault: Fault,
        record: String,
        job: i64,
        strikes: usize,
        lock: Keys,
    ) -> Outlast {
        Outlast {
            client,
            fault,
            record,
            job,
            strike: strikes.saturating_sub(1),
            lock,
            began: Instant::now(),
            due: None,
            resume: None,
            came: None,
            said_alive: false,
            said_gone: false,
            seen_waiting: BTreeSet::new(),
            keyless: false,
            said_held: false,
        }
    }
}

/// The state of the faulted client's lock now.
enum Lock {
    /// Its key (the first still there) holds its value; how long it has to live.
    Kept(String, Held),
    Gone,
}

impl Run<'_> {
    /// Snapshots the run's keys for a client whose job is handed out, or who says `acquired`:
    /// its lock is read against them when a fault lands ([`leases::its_lock`]).
    pub(super) fn snapshot_keys(&mut self, client: &str, job: i64, acquired: bool) {
        let Some(keys) = self.leases.as_mut().and_then(|servers| servers.all().ok()) else {
            return;
        };
        let snapshots = if acquired {
            &mut self.keys_acquired
        } else {
            self.keys_acquired.remove(client);
            &mut self.keys_given
        };
        snapshots.insert(client.to_string(), (job, keys));
    }

    /// As a pause or a delay lands on the seat at `index`: finds its client's lock, and from
    /// now on the fault lasts until that lock is gone.
    pub(super) fn find_lock(&mut self, index: usize, fault: Fault) {
        let seat = &self.seats[index];
        let client = seat.client.name.clone();
        let Some(job) = seat.job.map(|(job, _)| job).filter(|&job| job > 0) else {
            return;
        };
        if seat.stage == Stage::Released || !seat.lock {
            return;
        }
        let record = self.spec(job).record.clone();
        let of_job = |snapshots: &HashMap<String, (i64, Keys)>| {
            snapshots
                .get(&client)
                .filter(|(of, _)| *of == job)
                .map(|(_, keys)| keys.clone())
        };
        let (Some(given), acquired) = (of_job(&self.keys_given), of_job(&self.keys_acquired))
        else {
            return;
        };
        let Some(now) = self.leases.as_mut().and_then(|servers| servers.all().ok()) else {
            return;
        };
        let records = self.setup.jobs.iter().map(|j| j.record.clone());
        let records: Vec<String> = records.collect::<BTreeSet<_>>().into_iter().collect();
        let names = its_lock((&record, &records), &given, acquired.as_ref(), &now);
        let lock: Keys = (now.into_iter())
            .filter(|(name, _)| names.contains(name))
            .collect();
        let Some((key, held)) = lock.iter().next() else {
            // No key of its own: its lock, if any, is in Postgres — and held there, it holds
            // off whoever asks for as long as it is held. The fault goes on to its bound if
            // someone is held off, to see whether a waiter gives up and writes.
            self.outlasting.push(Outlast {
                keyless: true,
                ..Outlast::new(client, fault, record, job, self.strikes.len(), lock)
            });
            return;
        };
        let since = if acquired.is_some() {
            format!("set since job {job} went out, and held since {client} said acquired")
        } else {
            format!("set since job {job} went out")
        };
        let more = match lock.len() {
            1 => String::new(),
            n => format!(" (and {} more key{})", n - 1, if n > 2 { "s" } else { "" }),
        };
        let text = format!(
            "{client}'s lock: {key} ({}, {}){more}, {since}",
            held.server,
            held.left()
        );
        self.note_ttl(held, text);
        let strikes = self.strikes.len();
        (self.outlasting).push(Outlast::new(client, fault, record, job, strikes, lock));
    }

    /// A pause's resume, falling due: if the pause waits for its client's lock, its own
    /// time is up, and [`Run::outlast`] ends it when the lock allows. Whether it was taken.
    pub(super) fn resume_when_lock_gone(&mut self, action: &Action) -> bool {
        let waiting = (self.outlasting.iter_mut())
            .find(|o| o.client == action.target && o.fault == Fault::Pause);
        match waiting {
            Some(outlast) => {
                outlast.due.get_or_insert_with(Instant::now);
                outlast.resume.get_or_insert_with(|| action.clone());
                true
            }
            None => false,
        }
    }

    /// Every fault waiting for its client's lock: ends each whose lock is gone and whose
    /// record a newer holder reached, or that reached the bound; notes who waits meanwhile.
    pub(super) fn outlast(&mut self) -> Result<()> {
        if self.outlasting.is_empty() || self.outlast_read.is_some_and(|at| at.elapsed() < EVERY) {
            return Ok(());
        }
        self.outlast_read = Some(Instant::now());
        let bound = self
            .setup
            .challenge
            .fault_bound(Duration::from_millis(self.setup.init.lease_ms));
        let mut i = 0;
        while i < self.outlasting.len() {
            if self.outlast_one(i, bound)? {
                self.outlasting.remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// One fault waiting for its client's lock; true once it is over.
    fn outlast_one(&mut self, i: usize, bound: Duration) -> Result<bool> {
        let (client, fault, job) = {
            let o = &self.outlasting[i];
            (o.client.clone(), o.fault, o.job)
        };
        let Some(index) = self.seats.iter().position(|s| s.client.name == client) else {
            return Ok(true);
        };
        let faulted = match fault {
            Fault::Pause => self.paused().contains(&client),
            _ => self.held_writes.contains(&client),
        };
        let lock = self.lock_now(i);
        let still_its_job = self.seats[index].job.is_some_and(|(held, _)| held == job);
        if !faulted || !still_its_job || !self.seats[index].client.is_running() {
            // Ended otherwise: the worst order let it go, or it was killed (or a delay found
            // no write to hold, and never held anything).
            let o = &self.outlasting[i];
            let held = fault == Fault::Pause || o.came.is_some();
            self.strikes[o.strike].lock_kept = held && matches!(lock, Lock::Kept(..));
            return Ok(true);
        }
        if fault == Fault::Delay && !self.hold_the_bytes(i, index) {
            return Ok(false);
        }
        if let Lock::Kept(key, _) = &lock {
            self.note_waiters(i, key);
        }
        let o = &self.outlasting[i];
        if o.due.is_none_or(|due| due > Instant::now()) {
            return Ok(false);
        }
        if self.strikes[o.strike].at_commit {
            // A fault at the commit stretches the window between a lock let go and the
            // commit: its own 2–3 TTLs do that. Whether the lock outlives them, or a waiter
            // gives up on it, is for the fault at the write, which lasts as long as the lock.
            self.strikes[o.strike].lock_kept = matches!(lock, Lock::Kept(..));
            let resume = self.outlasting[i].resume.take();
            let ends = format!(
                "{}: its 2–3 TTLs at the commit are up (a fault at the commit does not wait \
                 out the lock: the one at the write does)",
                ending(fault, &client)
            );
            self.end_fault(index, (fault, resume), ends)?;
            return Ok(true);
        }
        let past_bound = o.began.elapsed() >= bound;
        let noun = fault_word(fault);
        let (record, strike, keyless) = (o.record.clone(), o.strike, o.keyless);
        if keyless {
            let ends = match self.held_off_in_postgres(i, index, bound)? {
                Some(_) if !past_bound => return Ok(false),
                Some(why) => format!("{}: {why}", ending(fault, &client)),
                None => ending(fault, &client),
            };
            let resume = self.outlasting[i].resume.take();
            self.end_fault(index, (fault, resume), ends)?;
            return Ok(true);
        }
        let nothing_left = format!("no other job on {record} is held or waiting");
        let coming = self.coming_on(&record, &client);
        // A key with no expiry of its own is waited out as one with: its lease may be kept
        // elsewhere (a deadline in its value, taken over by the next holder once past), and
        // "no expiry" is no promise that it never ends. A lock that truly never expires
        // keeps the fault to its bound: unknown, never a pass.
        let why = match lock {
            Lock::Kept(..) if !coming => {
                self.strikes[strike].lock_kept = true;
                nothing_left
            }
            Lock::Kept(key, held) if past_bound => {
                self.strikes[strike].lock_kept = true;
                self.strikes[strike].bounded = Some(format!(
                    "{client}'s key {key} ({}) still held its value, with {}, when the {} \
                     reached {} ({BOUND_TTLS} TTLs): a lease that outlives the fault is not \
                     tested by it (take a lease near lease_ms)",
                    held.server,
                    held.left(),
                    noun,
                    flag_duration(bound)
                ));
                format!("the {} reached its bound of {}", noun, flag_duration(bound))
            }
            Lock::Kept(key, held) => {
                if !self.outlasting[i].said_alive {
                    self.outlasting[i].said_alive = true;
                    let text = format!(
                        "{client}'s key {key} still has {}: the {} lasts until it is gone or \
                         taken over (at most {})",
                        held.left(),
                        noun,
                        flag_duration(bound)
                    );
                    self.note_ttl(&held, text);
                }
                return Ok(false);
            }
            Lock::Gone => {
                if !self.outlasting[i].said_gone {
                    self.outlasting[i].said_gone = true;
                    let key = self.outlasting[i].lock.keys().next().cloned();
                    let text = format!(
                        "{client}'s key {} is gone: the {} lasts until a newer holder of \
                         {record} has read it",
                        key.as_deref().unwrap_or_default(),
                        noun
                    );
                    let facts = Expired {
                        lock: key,
                        ..Expired::default()
                    };
                    self.tape
                        .record(Event::new(crate::nemesis::LANE, What::Expired(facts), text));
                }
                if !coming {
                    nothing_left
                } else if let Some(why) = self.held_off_in_postgres(i, index, bound)? {
                    if !past_bound {
                        return Ok(false);
                    }
                    why
                } else if past_bound {
                    self.strikes[strike].bounded = Some(format!(
                        "{client}'s lock was gone, and no newer holder of {record} had read it \
                         {} ({BOUND_TTLS} TTLs) into the {}",
                        flag_duration(bound),
                        noun
                    ));
                    format!("the {} reached its bound of {}", noun, flag_duration(bound))
                } else {
                    return Ok(false);
                }
            }
        };
        let resume = self.outlasting[i].resume.take();
        let ends = format!("{}: {why}", ending(fault, &client));
        self.end_fault(index, (fault, resume), ends)?;
        Ok(true)
    }

    /// Whether the faulted client's lock holds another client off in Postgres now: a session
    /// waits behind one of its own (`pg_blocking_pids`), or — a lock taken without waiting —
    /// its session holds an advisory lock or the record's row while another client with a
    /// job on the record keeps asking. Then the fault lasts to its bound: a lock in Postgres
    /// has no lease to outlive, but a waiter may give up on it (a `lock_timeout`, a try
    /// given up after a while) and write, and that is what a longer fault tests. The
    /// timeline is told once; at the bound, why the fault ends.
    fn held_off_in_postgres(
        &mut self,
        i: usize,
        index: usize,
        bound: Duration,
    ) -> Result<Option<String>> {
        let (client, record) = (
            self.outlasting[i].client.clone(),
            self.outlasting[i].record.clone(),
        );
        let how = if self.waits_behind(index)? {
            format!("a session waits in Postgres behind {client}'s (pg_blocking_pids)")
        } else if self.asked_while_held(index, &record) {
            format!(
                "{client}'s session holds a lock in Postgres, and another client with a job on \
                 {record} keeps asking"
            )
        } else {
            return Ok(None);
        };
        // Time held off behind a faulted client's lock is the nemesis's, as the faulted
        // client's own is: the others with a job on the record answer within their patience
        // counted from when the fault lets them go.
        let held_off: Vec<usize> = (self.seats.iter().enumerate())
            .filter(|(_, seat)| {
                seat.client.name != client
                    && seat
                        .job
                        .is_some_and(|(job, _)| job > 0 && self.spec(job).record == record)
            })
            .map(|(at, _)| at)
            .collect();
        let now = Instant::now();
        for at in held_off {
            if let Some((_, since)) = self.seats[at].job.as_mut() {
                *since = now;
            }
        }
        let noun = fault_word(self.outlasting[i].fault);
        let bound = flag_duration(bound);
        if !self.outlasting[i].said_held {
            self.outlasting[i].said_held = true;
            let text = format!(
                "{how}: the {noun} lasts to its bound ({bound}), in case the waiter gives up \
                 on the lock and writes"
            );
            self.tape
                .record(Event::new(crate::nemesis::LANE, What::Output, text));
        }
        Ok(Some(format!(
            "the lock held the waiter off for the whole {noun} ({bound})"
        )))
    }

    /// Whether a newer holder of `record` may still come: a job on it waits to be handed
    /// out, or another client holds one.
    fn coming_on(&self, record: &str, client: &str) -> bool {
        self.pending.iter().any(|&j| self.spec(j).record == record)
            || self.seats.iter().any(|s| {
                s.client.name != client
                    && s.client.is_running()
                    && s.job
                        .is_some_and(|(j, _)| j > 0 && self.spec(j).record == record)
            })
    }

    /// The faulted client's lock now: its first key still holding its value, or gone.
    fn lock_now(&mut self, i: usize) -> Lock {
        let o = &self.outlasting[i];
        let names: Vec<String> = o.lock.keys().cloned().collect();
        let Some(now) = self.leases.as_mut().and_then(|s| s.these(&names).ok()) else {
            return Lock::Gone;
        };
        (o.lock.iter())
            .find_map(|(name, then)| {
                let held = now.get(name).filter(|held| held.version == then.version)?;
                Some(Lock::Kept(name.clone(), held.clone()))
            })
            .unwrap_or(Lock::Gone)
    }

    /// delay: once the held bytes came (the proxy's one-shot delay is spent), the proxy holds
    /// them until lockslab lets them go, and their own delay counts from then. False until
    /// they came.
    fn hold_the_bytes(&mut self, i: usize, index: usize) -> bool {
        if self.outlasting[i].came.is_some() {
            return true;
        }
        let Some(proxy) = &self.seats[index].proxy else {
            return false;
        };
        if proxy.fault(Direction::Up).is_some() {
            return false;
        }
        proxy.set(Direction::Up, NetFault::Hold);
        let setup = self.setup;
        let o = &mut self.outlasting[i];
        let ms = Challenge::delay_ms(setup.seed, &o.client, setup.init.lease_ms);
        let now = Instant::now();
        o.came = Some(now);
        o.due = Some(now + Duration::from_millis(ms));
        true
    }

    /// Notes, once each, another client with a job on the record that it has not written,
    /// while the faulted client's key still holds its value.
    fn note_waiters(&mut self, i: usize, key: &str) {
        let o = &self.outlasting[i];
        let waiting: Vec<(String, i64)> = (self.seats.iter())
            .filter(|s| s.client.name != o.client && s.stage < Stage::Writing)
            .filter_map(|s| {
                let (job, _) = s.job.filter(|(job, _)| *job > 0)?;
                (self.spec(job).record == o.record && !o.seen_waiting.contains(&job))
                    .then(|| (s.client.name.clone(), job))
            })
            .collect();
        let server = o.lock.get(key).map_or("Redis", |held| held.server);
        let (holder, record) = (o.client.clone(), o.record.clone());
        for (waiter, job) in waiting {
            self.outlasting[i].seen_waiting.insert(job);
            let at_us = self.db_us(Instant::now());
            self.observe(What::KeyWaitSeen(KeyWait {
                holder: holder.clone(),
                key: key.to_string(),
                server: server.to_string(),
                waiter: waiter.clone(),
                job,
                at_us,
            }));
            let facts = HolderNow {
                holder: Some(holder.clone()),
                backend: Some(server.to_string()),
                key: Some(key.to_string()),
                ..HolderNow::default()
            };
            let text = format!(
                "{waiter} (job {job} on {record}) waits: {key} still holds {holder}'s value"
            );
            self.tape.record(Event::new(
                crate::nemesis::LANE,
                What::HolderNow(facts),
                text,
            ));
        }
    }

    fn note_ttl(&mut self, held: &Held, text: String) {
        let facts = Pttl {
            pttl_ms: held.ttl_ms.unwrap_or(-1),
            lease_lives_until_ms: None,
        };
        self.tape
            .record(Event::new(crate::nemesis::LANE, What::Pttl(facts), text));
    }

    /// Ends a pause (the schedule's resume, held back until now, resumes its client) or a
    /// hold (lets the bytes go), saying why.
    fn end_fault(
        &mut self,
        index: usize,
        (fault, resume): (Fault, Option<Action>),
        text: String,
    ) -> Result<()> {
        if fault == Fault::Pause {
            let client = self.seats[index].client.name.clone();
            match resume {
                Some(resume) => self.play(&resume, text)?,
                None => self.play_now((Fault::Resume, &client, How::default()), move |_| {
                    Note::from(text)
                })?,
            }
            // Its time to answer counts again from now.
            if let Some((_, since)) = self.seats[index].job.as_mut() {
                *since = Instant::now();
            }
        } else if let (Some(proxy), Some(faults)) = (&self.seats[index].proxy, self.faults.as_mut())
        {
            faults.let_go(proxy, Note::from(text), (&mut self.tape, &mut self.nemesis));
            // No longer held: a newer holder's `writing` from now on is not held for it.
            self.held_writes.remove(&self.seats[index].client.name);
        }
        Ok(())
    }
}

/// What ending `fault` on `client` does, for the timeline.
fn ending(fault: Fault, client: &str) -> String {
    match fault {
        Fault::Pause => format!("resumes {client}"),
        _ => format!("lets {client}'s held bytes go"),
    }
}

/// The fault's noun.
fn fault_word(fault: Fault) -> &'static str {
    match fault {
        Fault::Pause => "pause",
        _ => "hold",
    }
}
