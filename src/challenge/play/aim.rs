//! `pause` and `delay` aimed at the write itself. The schedule arms a fault at the client's
//! `writing` note (or a moment into its job); the client's proxy reads its Postgres
//! messages and catches the next one that writes the records, and the fault plays then —
//! after anything the client did between its note and its write.
//!
//! ```text
//!  c1  writing · work · "still mine? PTTL > 50" · SELECT 1 · UPDATE records …
//!      armed ──────────────────────────────────────────────────┘ caught: held in the proxy
//!  pause  c1 frozen (SIGSTOP) now, 2–3 TTLs; its UPDATE goes on when it is resumed
//!  delay  the UPDATE held 2–3 TTLs in the proxy; c1 runs on, waiting for its answer
//! ```
//!
//! Aimed at the note, a client that checks its lock just before writing checked after the
//! fault, and a `SELECT 1` first took the delay in the write's place: the check passed for
//! a fault that never reached the write. A GC pause or a slow network does not wait for the
//! check. An aim is for the job its client holds: a pause whose client sends no write
//! within [`patience`], or answers that job first, lands at once; a delay whose client
//! answers first is lifted, and counts as played — the timeline says which happened, and
//! the log whether the fault missed (a `writing` note sent after the write, most often).
//!
//! One of the faults of a run is aimed at the **commit** of that write instead
//! ([`How::at_commit`](crate::nemesis::schedule::How)): the proxy lets the write go and
//! catches the `COMMIT` that ends its transaction (a write outside a transaction commits
//! as it runs, and is caught itself). A client that lets its lock go between its write and
//! its commit — `pg_advisory_unlock` before `COMMIT`, a Redis key deleted before it — lets
//! the next holder read the record without the write, which is not committed yet; that
//! holder's write then waits for the row, and lands computed from the stale read.
//!
//! ```text
//!  c1  writing · UPDATE r0 · unlock · COMMIT ── held 2–3 TTLs ──────────────┐
//!  c2                  lock · reads r0 (without c1's write) · writing · UPDATE (after c1) ◀┘
//! ```
//!
//! Such a fault bit if another client with a job on the record came for it while the
//! commit was held — said `acquired` or `writing` then — or was held off by the faulted
//! client's lock (as a fault at the write is); else nobody tested the window.

use super::*;
use crate::nemesis::Note;
use crate::proxy::Tried;

/// A fault armed on a client's proxy, waiting for its write.
pub(super) struct Aim {
    /// The schedule's action: the player does it when the write comes.
    action: Action,
    fault: Fault,
    armed: Instant,
    /// The job its client held when it was armed: the write aimed at is that job's.
    job: Option<i64>,
    /// A pause's resume, withdrawn from the schedule until the pause lands, and how long
    /// after the pause it is due: the pause lasts as long as the seed drew, from its landing.
    resume: Option<(Action, u64)>,
    /// What the proxy is told to do to the write aimed at, and whether it has been told:
    /// when the aim was taken (the write then comes straight to the fault), or as the
    /// write was let in at the gate (and counted there).
    net: NetFault,
    told: Option<Told>,
    /// Writes of the job to let by before the one aimed at ([`Aimed::skip_for`]), and
    /// which write since the note that one is (1: the next).
    skip: u32,
    nth: u32,
    /// Writes let by since it was armed, because tried they changed nothing (the timeline
    /// names the first).
    let_by: u32,
    /// It follows a fault that held an earlier write of the same job ([`Follow`]): it is
    /// dropped, not played, if the job is answered or no write comes.
    follows: bool,
    /// It follows a newer holder's job past the write the worst order held
    /// ([`Run::follow_the_newer`]).
    newer: bool,
    /// It is aimed at the commit of the job's write, not at the write.
    at_commit: bool,
}

/// A fault that held a write, kept to follow its job: once the held write went out, the
/// job's next write to the records meets the same fault, and so on until the job is
/// answered. The write held may not be the one that counts: a write that tells the try
/// from the real run (a setting the try makes, `now()` against `statement_timestamp()`, a
/// sequence that the rollback does not undo) can change the records only when tried, be
/// held, match nothing for real (a refusal the database saw), and leave the job's real
/// write to come after a check of the lock. Followed, that write is held as well, and the
/// data says whether the check was enough.
#[derive(Clone)]
pub(super) struct Follow {
    /// The schedule's action of the fault followed: each follow-up plays it again.
    action: Action,
    job: i64,
    fault: Fault,
    net: NetFault,
    resume: Option<(Action, u64)>,
    /// It follows a newer holder's job, and has held no write after a fresh `writing` note
    /// yet ([`Run::follow_the_newer`]).
    newer: bool,
}

impl Follow {
    /// The aim that follows the job to its next write — or, `at_commit`, to its next
    /// commit.
    fn aim(self, at_commit: bool) -> Aim {
        Aim {
            action: self.action,
            fault: self.fault,
            armed: Instant::now(),
            job: Some(self.job),
            resume: self.resume,
            net: self.net,
            told: None,
            skip: 0,
            nth: 1,
            let_by: 0,
            follows: true,
            newer: self.newer,
            at_commit,
        }
    }
}

impl Aim {
    /// The fault that held this aim's write (or commit) in `job`, kept to follow the job.
    fn follow(&self, job: i64) -> Follow {
        Follow {
            action: self.action.clone(),
            job,
            fault: self.fault,
            net: self.net,
            resume: self.resume.clone(),
            newer: false,
        }
    }

    /// The write aimed at, for the timeline: "write", or "2nd write since its note".
    fn which_write(&self) -> String {
        if self.at_commit {
            return "commit, after its write".into();
        }
        if self.newer {
            return "next write of the same job after the one the worst order held (the fault \
                    follows the newer holder)"
                .into();
        }
        if self.follows {
            return "next write of the same job (the fault follows its job)".into();
        }
        match self.nth {
            0 | 1 => "write".into(),
            2 => "2nd write since its note (as many as in an `ok` job)".into(),
            3 => "3rd write since its note (as many as in an `ok` job)".into(),
            n => format!("{n}th write since its note (as many as in an `ok` job)"),
        }
    }
}

impl Aimed {
    /// Which write of the job a fault aims at, counted from its `writing` note: the one
    /// that changed the record in the jobs answered `ok` so far — the last write after the
    /// note, the most there were in any of them (every client of a run is the same
    /// program). Aimed always at the first, a client could send a write that matches
    /// nothing (`… AND false`) right after its note, take the fault there, and check its
    /// lock just before its real write: the check would never face the fault. Aimed at
    /// the most, a client that sends such a write in some jobs and not others has the
    /// fault land after its check, or miss (the run is then undecided, never passed). A
    /// client with one write per job (a compare-and-set that retries with a new `writing`
    /// note, say) is aimed at its first, as before.
    fn skip_for(seat: &Seat, writes_most_ok: Option<u32>) -> u32 {
        let most = writes_most_ok.unwrap_or(1);
        most.saturating_sub(1)
            .saturating_sub(seat.writes_since_note)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Told {
    WhenAimed,
    AtTheGate,
}

/// The faults aimed at writes: those waiting for their write, and the clients frozen with
/// their write held in their proxy (true once it was let go).
#[derive(Default)]
pub(super) struct Aimed {
    waiting: BTreeMap<String, Aim>,
    frozen: BTreeMap<String, bool>,
    /// The last fault that held each client's write, to follow its job.
    followed: BTreeMap<String, Follow>,
    /// The jobs followed as far as a fault follows one, by client, and why: if another
    /// write of the job comes, it goes untested, and the faults on the job say so.
    followed_no_further: BTreeMap<String, (i64, String)>,
    /// The clients whose commit is held now (frozen with it, or its bytes in the proxy),
    /// and the record their job writes: a client that comes for that record meanwhile
    /// tests the window between the lock let go and the commit ([`Run::came_for_a_held_commit`]).
    commits: BTreeMap<String, String>,
    /// The fault that last held each client's commit, and the request (by session) that
    /// commit was: if the server aborts that commit, the fault follows the job to its next
    /// commit ([`Run::commit_aborted`]).
    commit_follows: BTreeMap<String, (Follow, (i32, u64))>,
}

impl Aimed {
    /// Is a fault armed on `client`, waiting for its write, or has it frozen it there?
    pub(super) fn is_armed(&self, client: &str) -> bool {
        self.waiting.contains_key(client) || self.frozen.contains_key(client)
    }

    /// The fault that last held `client`'s write, if it is kept to follow its job.
    pub(super) fn followed_for(&self, client: &str) -> Option<Follow> {
        self.followed.get(client).cloned()
    }

    /// What of `client`'s the fault on it holds, for the timeline: its commit, or its write.
    pub(super) fn held_what(&self, client: &str) -> &'static str {
        if self.commits.contains_key(client) {
            "commit"
        } else {
            "write"
        }
    }
}

/// The most writes of one job a fault holds, following it ([`Follow`]): enough for a
/// compare-and-set refused once or twice; a client whose writes go on being refused (or
/// that sends write after write, each to take the fault) is not followed for ever.
const MOST_HELD_PER_JOB: usize = 8;

/// How long a pause waits for its client's write after it was armed: the job's work, then
/// a lease. A client still not writing by then was not about to write under that lease.
pub(super) fn patience(lease_ms: u64) -> Duration {
    Duration::from_millis(WORK_MS + lease_ms)
}

impl Run<'_> {
    /// What a fault holds of `client`'s, for the timeline: `c1's held write` (or commit),
    /// or `c1 (frozen, no write caught)` for a pause that caught none (in the work, say).
    pub(super) fn what_is_held(&self, client: &str) -> String {
        if self.held_writes.contains(client) || self.aimed.frozen.contains_key(client) {
            format!("{client}'s held {}", self.aimed.held_what(client))
        } else {
            format!("{client} (frozen, no write caught)")
        }
    }

    /// The records kept for a fault dealt the natural order ([`Run::natural_order_alone`]):
    /// no job on them goes to another client meanwhile. A fault armed at a write keeps its
    /// record until the write comes; a pause in the work, once one newer holder has a job on
    /// the record, keeps it until its client answered — its client decides how to write
    /// after it is resumed, and meets the newer holder's write alone.
    pub(super) fn kept_for_the_natural_order(&self) -> BTreeSet<String> {
        let Some(schedule) = self.schedule.as_ref() else {
            return BTreeSet::new();
        };
        let armed = (self.aimed.waiting.values())
            .filter(|aim| !aim.follows)
            .filter(|aim| (aim.action.step).is_some_and(|step| schedule.how(step).newer_first))
            .filter_map(|aim| aim.job.map(|job| self.spec(job).record.clone()));
        let in_the_work = (self.strikes.iter())
            .filter(|s| s.in_the_work && s.newer_first)
            .filter_map(|s| {
                let seat = self
                    .seats
                    .iter()
                    .find(|seat| seat.client.name == s.client)?;
                let job = s
                    .job
                    .filter(|&job| seat.job.is_some_and(|(held, _)| held == job))?;
                let record = &self.spec(job).record;
                let newer = self.seats.iter().any(|other| {
                    other.client.name != s.client
                        && (other.job).is_some_and(|(j, _)| j > 0 && self.spec(j).record == *record)
                });
                newer.then(|| record.clone())
            });
        armed.chain(in_the_work).collect()
    }

    /// A pause falls due: its client's proxy is told to hold its next write, and the client
    /// is frozen when that write comes ([`Run::hear_proxies`]).
    pub(super) fn aim_pause(&mut self, index: usize, action: &Action) -> Result<()> {
        let name = self.seats[index].client.name.clone();
        let resume = (self.faults.as_mut())
            .and_then(|faults| faults.withdraw(&name, Fault::Resume))
            .map(|resume| {
                let lasts = resume.at_ms.saturating_sub(action.at_ms);
                (resume, lasts)
            });
        let net = if self.at_commit(action) {
            NetFault::HoldCommit
        } else {
            NetFault::HoldWrite
        };
        let aim = self.aim(index, action, net, resume);
        if self.seats[index].proxy.is_none() {
            let text = format!("pauses {name} (SIGSTOP) for 2–3 TTLs");
            return self.land_pause(index, aim, text);
        }
        self.take_aim(index, aim)
    }

    fn aim(
        &self,
        index: usize,
        action: &Action,
        net: NetFault,
        resume: Option<(Action, u64)>,
    ) -> Aim {
        let seat = &self.seats[index];
        let job = seat.job.map(|(job, _)| job).filter(|&job| job > 0);
        let at_commit = matches!(net, NetFault::HoldCommit | NetFault::DelayCommit { .. });
        // A job's writes before the one that counts are in its transaction: the commit
        // after them is the one.
        let skip = if at_commit {
            0
        } else {
            Aimed::skip_for(seat, self.writes_most_ok)
        };
        Aim {
            action: action.clone(),
            fault: action.fault,
            armed: Instant::now(),
            job,
            resume,
            net,
            told: None,
            skip,
            nth: skip + 1,
            let_by: 0,
            follows: false,
            newer: false,
            at_commit,
        }
    }

    /// Is the schedule's `action` aimed at the commit of its client's write
    /// ([`How::at_commit`](crate::nemesis::schedule::How))?
    fn at_commit(&self, action: &Action) -> bool {
        (self.schedule.as_ref())
            .zip(action.step)
            .is_some_and(|(schedule, step)| schedule.how(step).at_commit)
    }

    /// A delay falls due: its client's proxy holds its next write for 2–3 TTLs.
    pub(super) fn aim_delay(&mut self, index: usize, action: &Action) -> Result<()> {
        let setup = self.setup;
        let name = &self.seats[index].client.name;
        let ms = Challenge::delay_ms(setup.seed, name, setup.init.lease_ms);
        let net = if self.at_commit(action) {
            NetFault::DelayCommit { ms }
        } else {
            NetFault::DelayWrite { ms }
        };
        let aim = self.aim(index, action, net, None);
        if self.seats[index].proxy.is_none() {
            return Ok(());
        }
        self.take_aim(index, aim)
    }

    /// The aim waits for its write: the proxy is told now if it is the client's next, or
    /// at the gate once the writes before it went by ([`Run::drained`]).
    fn take_aim(&mut self, index: usize, mut aim: Aim) -> Result<()> {
        if aim.job.is_none() {
            return self.give_up(index, aim);
        }
        let seat = &self.seats[index];
        if aim.skip == 0
            && let Some(proxy) = &seat.proxy
        {
            proxy.set(Direction::Up, aim.net);
            aim.told = Some(Told::WhenAimed);
        }
        self.aimed.waiting.insert(seat.client.name.clone(), aim);
        Ok(())
    }

    /// What the proxies saw: a write caught (the fault aimed at it plays), a held write
    /// gone out (its fault ends). Then the aims whose write will not come are given up, and
    /// the writes of frozen clients that were resumed go on.
    pub(super) fn hear_proxies(&mut self) -> Result<()> {
        for index in 0..self.seats.len() {
            let Some(proxy) = &self.seats[index].proxy else {
                continue;
            };
            for report in proxy.reports() {
                if let Seen::WriteHeld {
                    session, request, ..
                } = report.seen
                {
                    if let Some(session) = session {
                        self.held_requests.insert((session, request));
                    }
                    // A write held anew: any write of its let go by the worst order went out
                    // before it, reported or not.
                    let name = &self.seats[index].client.name;
                    self.newer_let_go.remove(name);
                }
                match report.seen {
                    Seen::WriteHeld { tried, session, .. } if self.newer_write_awaited(index) => {
                        self.newer_write_held(index, tried, session)?;
                    }
                    Seen::WriteHeld { tried, session, .. } => {
                        self.write_caught(index, tried, session)?;
                    }
                    Seen::CommitHeld { session, request } => {
                        // The server's abort of the held commit's transaction, in its
                        // answer to the commit, is told as a statement of no rows.
                        self.held_requests.extend(session.map(|s| (s, request)));
                        self.commit_caught(index, session.map(|s| (s, request)))?;
                    }
                    Seen::WriteChangedNothing => self.write_let_by(index),
                    Seen::WriteUntried { why } => self.write_untried(index, why),
                    Seen::WriteGated { ticket } => self.write_at_gate(index, ticket),
                    Seen::DelayedSent { late_ms } => self.write_sent(index, late_ms),
                    Seen::TransactionAborted {
                        session,
                        why,
                        request,
                    } => {
                        let held = session.map(|session| (session, request));
                        self.transaction_aborted(index, held, why, report.at);
                    }
                    _ => {}
                }
            }
        }
        self.no_write_came()?;
        self.let_frozen_writes_go();
        Ok(())
    }

    /// Postgres aborted a transaction of this client's for a conflict it found (its proxy
    /// saw it end), in its answer to the request `held` (the session, and which request of
    /// its connection). If that request is a write lockslab held, or any request of the job
    /// a pause in the work struck, the abort is the refusal of that write: kept as a
    /// statement of no rows in that session, for the checker to weigh beside the log's. A
    /// conflict found in any other request — a statement the client sent after its held
    /// write had gone through, on a table of its own, say — is the client's transaction
    /// failing, not the held write refused: said, and not kept.
    fn transaction_aborted(
        &mut self,
        index: usize,
        held: Option<(i32, u64)>,
        why: String,
        at: Instant,
    ) {
        let name = self.seats[index].client.name.clone();
        let refused = held.filter(|held| {
            self.held_requests.contains(held) || self.paused_in_the_work_of_this_job(index)
        });
        let Some((pid, request)) = refused else {
            let text = format!(
                "Postgres aborted {name}'s transaction ({why}), though not in its answer to a \
                 held write: no refusal of one"
            );
            self.note(&name, What::Output, text);
            return;
        };
        self.commit_aborted(index, (pid, request));
        let text =
            format!("Postgres aborted {name}'s transaction ({why}): nothing it wrote was kept");
        let aborted = Statement {
            pid,
            at_us: self.db_us(at),
            rows: 0,
            changed: None,
            aborted: Some(why),
        };
        self.note(&name, What::PgAborted(aborted), text);
    }

    /// The server aborted a client's held commit (`held`: its session and request) for a
    /// conflict it found: the change it was to commit was rolled back, and the window
    /// between the lock let go and the commit that counts is still to test. The fault
    /// follows the job to its next commit, held the same way. (A decoy transaction made to
    /// fail at its `COMMIT` would otherwise take the fault in the real commit's place.)
    fn commit_aborted(&mut self, index: usize, held: (i32, u64)) {
        let name = self.seats[index].client.name.clone();
        let Some((follow, request)) = self.aimed.commit_follows.remove(&name) else {
            return;
        };
        let holds = self.seats[index].job.map(|(job, _)| job);
        if request != held || holds != Some(follow.job) || self.aimed.is_armed(&name) {
            return;
        }
        let (job, fault) = (follow.job, follow.fault);
        let aim = follow.aim(true);
        let text = format!(
            "Postgres aborted {name}'s held commit: its {} follows job {job} to its next commit",
            fault.as_str()
        );
        self.note(crate::nemesis::LANE, What::Output, text);
        if let Err(e) = self.take_aim(index, aim) {
            let text = format!("the fault could not follow {name}'s job {job}: {e}");
            self.note(crate::nemesis::LANE, What::Output, text);
        }
    }

    /// The client's last fault was a pause in the middle of the work of the job it holds
    /// now: the transaction the server aborts next is the one the pause made stale (no write
    /// of it was caught, so none was held).
    fn paused_in_the_work_of_this_job(&self, index: usize) -> bool {
        let seat = &self.seats[index];
        let job = seat.job.map(|(job, _)| job);
        (self.strikes.iter().rev())
            .find(|s| s.client == seat.client.name)
            .is_some_and(|s| s.in_the_work && job.is_some() && s.job == job)
    }

    /// A write came to its proxy's gate: lockslab reads every note its client wrote before
    /// the write ([`Client::drain`]) and plays what falls due at them, and only then lets
    /// the write in ([`Run::drained`]). A `writing` note read late — the client wrote it,
    /// then its write, and the write reached the proxy first — still arms its fault before
    /// the write goes by.
    pub(super) fn write_at_gate(&mut self, index: usize, ticket: u64) {
        let client = &self.seats[index].client;
        let drain = client.drain();
        self.gates.insert(client.name.clone(), (drain, ticket));
    }

    /// `name`'s notes up to drain `drain` are read (and what fell due at them played): its
    /// write waiting at the gate goes on, to meet whatever fault is aimed at it now.
    pub(super) fn drained(&mut self, name: &str, drain: u64) {
        let Some(&(asked, ticket)) = self.gates.get(name) else {
            return;
        };
        if asked > drain {
            return;
        }
        self.gates.remove(name);
        let Some(seat) = self.seats.iter_mut().find(|s| s.client.name == name) else {
            return;
        };
        seat.writes_since_note += 1;
        let holds = seat.job.map(|(job, _)| job);
        self.untested_write(name, holds);
        let Some(seat) = self.seats.iter_mut().find(|s| s.client.name == name) else {
            return;
        };
        let Some(proxy) = seat.proxy.as_ref() else {
            return;
        };
        if let Some(aim) = (self.aimed.waiting.get_mut(name)).filter(|aim| aim.job == holds) {
            if aim.skip > 0 {
                aim.skip -= 1;
            } else if aim.told.is_none() {
                proxy.set(Direction::Up, aim.net);
                aim.told = Some(Told::AtTheGate);
            }
        }
        proxy.open_gate(ticket);
    }

    /// A write of `holds` came where no fault follows its job any more: the faults on that
    /// job end at their bound (they followed it as far as one follows a job).
    fn untested_write(&mut self, name: &str, holds: Option<i64>) {
        let Some((job, why)) = self.aimed.followed_no_further.remove(name) else {
            return;
        };
        if holds != Some(job) {
            return;
        }
        let chain = (self.strikes.iter_mut())
            .filter(|s| s.client == name && s.job == Some(job) && s.fault != "kill");
        for strike in chain {
            strike.bounded = Some(why.clone());
            strike.followed_to_bound = true;
        }
    }

    /// A write that, tried, changed nothing went by: if a fault waits for this client's
    /// write, the timeline says it let this one go (it is no write that counts).
    fn write_let_by(&mut self, index: usize) {
        let name = &self.seats[index].client.name;
        let Some(aim) = self.aimed.waiting.get_mut(name) else {
            return;
        };
        aim.let_by += 1;
        if aim.let_by > 1 {
            return;
        }
        let text = format!(
            "{name} sent a write that, tried in its session and rolled back, changed nothing: \
             let by, the {} waits for a write that changes a value, items or job",
            aim.fault.as_str()
        );
        let event = crate::events::Event::new(crate::nemesis::LANE, What::Output, text);
        self.tape.record(event);
    }

    /// A write that could not be tried: the timeline says so, the first time for each
    /// client, since a refusal of such a write cannot be weighed.
    fn write_untried(&mut self, index: usize, why: String) {
        let name = self.seats[index].client.name.clone();
        if !self.untried.insert(name.clone()) {
            return;
        }
        let text = format!(
            "{name} sent a write that could not be tried in its session ({why}): if a fault \
             holds such a write, its matching nothing is no refusal"
        );
        let event = crate::events::Event::new(crate::nemesis::LANE, What::Output, text);
        self.tape.record(event);
    }

    fn write_caught(&mut self, index: usize, tried: Tried, session: Option<i32>) -> Result<()> {
        let name = self.seats[index].client.name.clone();
        let Some(mut aim) = self.aimed.waiting.remove(&name) else {
            return Ok(());
        };
        if aim.at_commit {
            // Aimed at the commit, and caught with the write itself: a write outside a block
            // (it commits as it runs) or sent with its `COMMIT`. The write had not run, so no
            // lock could be let go between it and its commit: this is a fault at the write,
            // graded and followed as one.
            aim.at_commit = false;
            aim.net = match aim.net {
                NetFault::HoldCommit => NetFault::HoldWrite,
                NetFault::DelayCommit { ms } => NetFault::DelayWrite { ms },
                net => net,
            };
        }
        let (follows, newer, job) = (aim.follows, aim.newer, aim.job);
        let result = self.write_caught_aimed(index, aim);
        // Held right after a fresh `writing` note: a write made after a read. One held with
        // no new note since the last held write may come before the retry's read (a claim
        // of the row, a touch of it): the order that tests a retry waits for the next.
        let fresh = self.seats[index].writes_since_note <= 1;
        if let Some(strike) = (self.strikes.iter_mut().rev()).find(|s| s.client == name) {
            strike.tried = Some(tried);
            strike.held_session = session;
            strike.follows = follows;
            strike.after_note = fresh;
        }
        result?;
        if let Some(job) = job.filter(|_| newer) {
            if fresh {
                self.retries_to_hold.insert((name.clone(), job));
            } else if let Some(follow) = self.aimed.followed.get_mut(&name) {
                follow.newer = true;
            }
        }
        if follows && !newer {
            self.followed_into_the_worst_order(&name, fresh)?;
        }
        Ok(())
    }

    /// The commit aimed at came: the fault plays on it as on a write, and its strike says
    /// so. It follows nothing after: once committed, the job's write is in the log.
    fn commit_caught(&mut self, index: usize, held: Option<(i32, u64)>) -> Result<()> {
        let session = held.map(|(session, _)| session);
        let name = self.seats[index].client.name.clone();
        let Some(aim) = self.aimed.waiting.remove(&name) else {
            return Ok(());
        };
        // A fault kept from an earlier job of this client's is no fault of this job's.
        self.aimed.followed.remove(&name);
        self.aimed.commit_follows.remove(&name);
        if let Some(job) = aim.job {
            let record = self.spec(job).record.clone();
            self.aimed.commits.insert(name.clone(), record);
            if let Some(held) = held {
                let follow = aim.follow(job);
                self.aimed
                    .commit_follows
                    .insert(name.clone(), (follow, held));
            }
        }
        self.write_caught_aimed(index, aim)?;
        if let Some(strike) = (self.strikes.iter_mut().rev()).find(|s| s.client == name) {
            strike.held_session = session;
            strike.at_commit = true;
            strike.commit_held = true;
        }
        Ok(())
    }

    /// A client said `acquired` or `writing` for `job`: each other client whose commit is
    /// held for the same record has that window tested — the newer holder came for the
    /// record before the older's write was committed — and its fault bit.
    pub(super) fn came_for_a_held_commit(&mut self, name: &str, job: i64, note: &str) {
        let record = self.spec(job).record.clone();
        let held = (self.aimed.commits.iter())
            .filter(|(older, held)| *older != name && **held == record)
            .map(|(older, _)| older.clone());
        for older in held.collect::<Vec<_>>() {
            let strike = (self.strikes.iter_mut().rev())
                .find(|s| s.client == older && s.at_commit && s.commit_held);
            if let Some(strike) = strike.filter(|s| s.came_for.is_none()) {
                strike.came_for = Some(format!(
                    "{name} (job {job} on {record}) said `{note}` while {older}'s commit was held"
                ));
            }
        }
    }

    fn write_caught_aimed(&mut self, index: usize, aim: Aim) -> Result<()> {
        let name = self.seats[index].client.name.clone();
        if let Some(job) = aim.job.filter(|_| !aim.at_commit) {
            self.aimed.followed.insert(name.clone(), aim.follow(job));
        }
        if aim.told == Some(Told::WhenAimed) && !aim.at_commit {
            // It came straight to the fault, not by the gate, where writes are counted (a
            // commit is no write: its write was counted at the gate).
            self.seats[index].writes_since_note += 1;
        }
        let which = aim.which_write();
        if aim.fault == Fault::Pause {
            self.aimed.frozen.insert(name.clone(), false);
            let text =
                format!("pauses {name} (SIGSTOP) for 2–3 TTLs at its {which}, held in its proxy");
            return self.land_pause(index, aim, text);
        }
        let setup = self.setup;
        let ms = Challenge::delay_ms(setup.seed, &name, setup.init.lease_ms);
        let text = if aim.at_commit {
            format!("delays {name}'s commit, after its write, by {ms}ms, held in its proxy")
        } else {
            format!("delays {name}'s {which} by {ms}ms, held in its proxy")
        };
        let action = aim.action.clone();
        if let (Some(proxy), Some(faults)) = (&self.seats[index].proxy, self.faults.as_mut()) {
            let on = (&mut self.tape, &mut self.nemesis);
            faults.caught(aim.action, proxy, Note::from(text), on);
        }
        self.faults_played += 1;
        self.strike("delay", index, &action)?;
        self.held_writes.insert(name);
        Ok(())
    }

    /// A held write went out: a delay's ends on the timeline where it landed; a frozen
    /// client's went as it was resumed.
    fn write_sent(&mut self, index: usize, late_ms: u64) {
        let name = self.seats[index].client.name.clone();
        if self.newer_let_go.remove(&name) {
            // The worst order's hold of a newer holder's write: its end is on the timeline.
            return;
        }
        if self.aimed.frozen.remove(&name).is_some() {
            self.aimed.commits.remove(&name);
            self.follow(index);
            return;
        }
        let Some(proxy) = &self.seats[index].proxy else {
            return;
        };
        // Let go early by the worst order (`overtake`), it is no longer among the held.
        let early = !self.held_writes.remove(&name);
        let what = self.aimed.held_what(&name);
        self.aimed.commits.remove(&name);
        // `held_ms` is the number the line says; `lasted_ms` (the nemesis's) counts from
        // when the write was caught.
        let text = if late_ms == 0 {
            format!("{name}'s {what} reaches Postgres at once: nothing was held")
        } else if early {
            format!("{name}'s {what}, let go early, reaches Postgres after {late_ms}ms held")
        } else {
            format!("{name}'s {what} reaches Postgres, held {late_ms}ms in the proxy")
        };
        let facts = crate::events::facts::FaultFacts {
            held_ms: Some(late_ms),
            ..Default::default()
        };
        let note = Note::new(text, facts);
        if let Some(faults) = self.faults.as_mut() {
            faults.let_go(proxy, note, (&mut self.tape, &mut self.nemesis));
        }
        self.follow(index);
    }

    /// A held write went out while its client still holds the job: the same fault waits
    /// for the job's next write ([`Follow`]). Told to the proxy at the gate, as the write
    /// comes; dropped if the job is answered first.
    fn follow(&mut self, index: usize) {
        let name = self.seats[index].client.name.clone();
        let Some(follow) = self.aimed.followed.get(&name).cloned() else {
            return;
        };
        let holds = self.seats[index].job.map(|(job, _)| job);
        if holds != Some(follow.job) || self.aimed.waiting.contains_key(&name) {
            return;
        }
        let chain = (self.strikes.iter_mut())
            .filter(|s| s.client == name && s.job == Some(follow.job) && s.fault != "kill");
        let chain: Vec<&mut Strike> = chain.collect();
        if chain.len() >= MOST_HELD_PER_JOB {
            // Followed no further: should the job send another write, it goes untested, and
            // none of the faults on the job can say it was tested (the run is unknown, never
            // a pass) — [`Run::untested_write`].
            let why = format!(
                "the fault followed job {} through {} of its writes, the most it follows, and \
                 its writes after those went untested",
                follow.job,
                chain.len()
            );
            self.aimed
                .followed_no_further
                .insert(name, (follow.job, why));
            return;
        }
        self.aimed.waiting.insert(name, follow.aim(false));
    }

    /// The newer holder of a worst order, its held write let go: if its job sends another
    /// write after that one, the fault that held the older holder's write (`follow`) follows
    /// it there. A newer holder whose write was refused (a compare-and-set: the older write
    /// landed after its read) reads again and writes again, and that write must meet a newer
    /// write too: held, the next holder to read the record writes first
    /// ([`Run::newer_writes_first`]). Followed only past one write, a client that guards its
    /// first write and drops the guard on the retry would never have the retry tested.
    /// Dropped, unplayed, if the job is answered with no other write.
    pub(super) fn follow_the_newer(&mut self, follow: Follow, newer: &str, job: i64) -> Result<()> {
        let Some(index) = self.seats.iter().position(|s| s.client.name == newer) else {
            return Ok(());
        };
        if self.aimed.is_armed(newer) || self.seats[index].proxy.is_none() {
            return Ok(());
        }
        let aimed_at = |action: Action| Action {
            target: newer.to_string(),
            ..action
        };
        let net = match follow.net {
            NetFault::DelayWrite { .. } => {
                let setup = self.setup;
                let ms = Challenge::delay_ms(setup.seed, newer, setup.init.lease_ms);
                NetFault::DelayWrite { ms }
            }
            net => net,
        };
        let followed = Follow {
            action: aimed_at(follow.action),
            job,
            resume: follow
                .resume
                .map(|(resume, lasts)| (aimed_at(resume), lasts)),
            net,
            newer: true,
            ..follow
        };
        self.take_aim(index, followed.aim(false))
    }

    /// The aims whose write will not come: their client answered the job aimed at (or
    /// died), or, for a pause, sent no write within its patience. The aim is lifted.
    fn no_write_came(&mut self) -> Result<()> {
        let patience = patience(self.setup.init.lease_ms);
        let seats = &self.seats;
        let over: Vec<(usize, String)> = (self.aimed.waiting.iter())
            .filter_map(|(name, aim)| {
                let index = seats.iter().position(|s| s.client.name == *name)?;
                let holds = seats[index].job.map(|(job, _)| job) == aim.job;
                // A fault that follows its job waits for the job's next write however long it
                // takes: a client that re-takes its lock first must not outwait it.
                let late =
                    aim.fault == Fault::Pause && !aim.follows && aim.armed.elapsed() > patience;
                (!holds || late).then(|| (index, name.clone()))
            })
            .collect();
        for (index, name) in over {
            let Some(aim) = self.aimed.waiting.remove(&name) else {
                continue;
            };
            let seat = &self.seats[index];
            if let Some(proxy) = &seat.proxy {
                proxy.clear(Direction::Up);
            }
            if aim.follows {
                // The job went on without another write: nothing left to follow.
                self.aimed.followed.remove(&name);
                continue;
            }
            let answered = seat.job.map(|(job, _)| job) != aim.job;
            if answered && aim.let_by > 0 && !aim.at_commit {
                self.wait_for_the_next_note(&name, aim);
                continue;
            }
            if seat.client.is_running() {
                self.give_up(index, aim)?;
            }
        }
        Ok(())
    }

    /// The job aimed at was answered, and every write it sent while the fault waited had
    /// been refused already — tried, it changed nothing, and went by: the database turned
    /// it away before any fault could hold it (a claim taken over by a newer holder, say),
    /// so nothing was there to test. The fault waits for the client's next note of the kind
    /// it is anchored on, as one that waited for another fault to end does.
    fn wait_for_the_next_note(&mut self, name: &str, aim: Aim) {
        let job = aim.job.unwrap_or_default();
        let text = format!(
            "{name} answered job {job}, and its writes of it changed nothing when tried (refused \
             before the {} could hold one): the {} waits for its next `writing` note",
            aim.fault.as_str(),
            aim.fault.as_str()
        );
        self.note(crate::nemesis::LANE, What::Output, text);
        let resume = aim.resume.map(|(resume, lasts)| Action {
            at_ms: aim.action.at_ms + lasts,
            ..resume
        });
        let postponed = Postponed {
            action: aim.action,
            resume,
        };
        self.postponed.insert(name.to_string(), postponed);
    }

    /// A fault whose write will not come plays now, and the timeline says why: a pause
    /// freezes its client where it is; a delay, with nothing to hold, is over at once.
    /// Whether it missed is the log's to tell.
    fn give_up(&mut self, index: usize, aim: Aim) -> Result<()> {
        let seat = &self.seats[index];
        let name = seat.client.name.clone();
        // Aimed at the commit, a client that sent its write and no commit after it is
        // frozen with the write in: the timeline says so.
        let what = if aim.at_commit && seat.writes_since_note > 0 {
            "no commit of its write"
        } else {
            "no write"
        };
        let why = match (aim.job, seat.job.map(|(job, _)| job)) {
            (None, _) => format!("{what}, between jobs"),
            (Some(job), held) if held != Some(job) => format!("{what}, job {job} done"),
            _ => format!(
                "{what} within {}",
                crate::output::human(patience(self.setup.init.lease_ms))
            ),
        };
        // Graded as any fault that landed where its client was: a pause freezes it there
        // (with its transaction open, perhaps, and its lock held), a delay holds nothing.
        if aim.fault == Fault::Pause {
            let text = format!("pauses {name} (SIGSTOP) for 2–3 TTLs: {why}");
            return self.land_pause(index, aim, text);
        }
        let text = format!("delay of {name} holds nothing: {why}");
        let event = crate::events::Event::new(crate::nemesis::LANE, What::Output, text);
        self.tape.record(event);
        self.faults_played += 1;
        self.strike("delay", index, &aim.action)
    }

    /// The pause lands: the client frozen, and its resume due as long after as drawn.
    fn land_pause(&mut self, index: usize, aim: Aim, text: String) -> Result<()> {
        self.freeze(index, &aim.action, text)?;
        if let (Some((resume, lasts)), Some(faults)) = (aim.resume, self.faults.as_mut()) {
            let now = faults.now_ms(&self.tape);
            faults.add(Action {
                at_ms: now + lasts,
                ..resume
            });
        }
        Ok(())
    }

    /// Freezes a client for its pause. If lockslab holds it already after its read (the
    /// worst order, as the newer holder), the pause takes that hold over.
    fn freeze(&mut self, index: usize, action: &Action, text: String) -> Result<()> {
        let name = &self.seats[index].client.name;
        if !self.paused().contains(name) {
            self.play(action, text)?;
        }
        self.faults_played += 1;
        self.strike("pause", index, action)
    }

    /// The writes held for frozen clients go on once their clients run again: resumed at
    /// the pause's end, or early by the worst order.
    pub(super) fn let_frozen_writes_go(&mut self) {
        let paused = self.paused();
        for (name, gone) in &mut self.aimed.frozen {
            if *gone || paused.contains(name) {
                continue;
            }
            *gone = true;
            let seat = self.seats.iter().find(|s| s.client.name == *name);
            if let Some(proxy) = seat.and_then(|s| s.proxy.as_ref()) {
                proxy.clear(Direction::Up);
            }
        }
    }

    /// Why a fault aimed at `target`'s write never played: armed, it waited for a write
    /// that did not come before the run ended.
    pub(super) fn never_written(&self, target: &str, fault: Fault) -> Option<String> {
        let aim = self
            .aimed
            .waiting
            .get(target)
            .filter(|a| a.fault == fault && !a.follows)?;
        let what = if aim.at_commit {
            "the commit of its write to the records"
        } else {
            "its write to the records"
        };
        Some(format!(
            "the {} of {target} was aimed at {what}, and none came through its proxy before \
             the run ended, {} later",
            fault.as_str(),
            crate::output::human(aim.armed.elapsed())
        ))
    }
}
