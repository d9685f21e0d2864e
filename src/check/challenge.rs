//! `lockslab challenge`: what a learner's client did to the protected records, read from
//! the database's own log of every change — never from what the client said.
//!
//! Each job says "add `add` to `record`, and append `append` to its items", and the client's
//! write sets the record's `value` and `items` and tags it with the job's id (`job`). A
//! trigger copies every change into an append-only log: the record, the job, the value and
//! the items before and after, numbered in the order the database applied them (one
//! record's changes wait on its row lock, so for one record that is the order they
//! committed). The items make each job's effect visible in the data itself: a lost update
//! erases an entry, a doubled effect leaves one twice. So:
//!
//! - **stale write**: a change whose value after is not its value before plus the job's
//!   `add`, or whose items after are not its items before with the job's `append` at the
//!   end — the client computed it from a read another write had already made stale, and
//!   erased that write's effect (a lost update, seen at the write that lost it: the entries
//!   it erased are named);
//! - **doubled effect**: one job's change in the log twice, or its entry twice in its
//!   record's final items;
//! - **lost**: a job a client answered `ok` for that has no change in the log, or whose
//!   entry is not in its record's final items (the change that erased it is named);
//! - **never done**: a job no client did, though given to one after another;
//! - **untagged**: a change that names no job of the run (the job column not set): the
//!   checker cannot say whose effect it is, and a grader that cannot attribute a change
//!   does not pass it;
//! - **log disagrees**: a record whose value or items are not the last its log shows
//!   (changed with the trigger off).
//!
//! - **stuck lock** (crash): a client killed holding its lock, and the next client that
//!   wanted that record waited longer than the bound for it (seen from the clients' notes).
//!
//! If the challenge's faults never played (the client never reached the moment they aim
//! at), a clean log proves nothing about them: unknown, never a pass. Nor if they played
//! and missed. A pause or a delay **bites** only if the job its client had when it began
//! was still unwritten then, and its held write was refused (the client answered `fail`),
//! or another client's change to the same record committed between the fault and the held
//! write's landing — read from the log's own clock, not from the client's notes. If nobody
//! wrote the record meanwhile, even an unfenced late write was right: the fault tested
//! nothing. Nor does another client's write prove anything for a client that sends no
//! notes: the fault was aimed at its job's arrival, perhaps before its read, and a read
//! after the fault sees that write (only a refusal counts for such a client). A kill bites only if its client held a job it had not answered. A client whose
//! `writing` note comes after its commit is frozen with nothing left to write: that fault
//! missed, and the finding says the note came late.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::report::{self, Outcome};
use crate::proxy::Tried;

mod items;
pub use items::Gone;

/// One job as lockslab handed it out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub id: i64,
    pub record: String,
    pub add: i64,
    /// The entry the job appends to the record's items (`j7`: unique to the job).
    pub append: String,
}

/// One row of the change log, in the database's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Change {
    pub seq: i64,
    pub record: String,
    pub job: Option<i64>,
    pub old_value: i64,
    pub new_value: i64,
    /// The record's items before the change and after it (absent from recordings made
    /// before jobs appended: empty).
    #[serde(default)]
    pub old_items: Vec<String>,
    #[serde(default)]
    pub new_items: Vec<String>,
    /// When the database made the change (its clock, µs since the epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_us: Option<i64>,
    /// The record's `fence` after the change: the token it was made under, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence: Option<i64>,
    /// The Postgres session (backend pid) that made it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
}

/// One UPDATE statement that reached the records, whatever it matched (a statement-level
/// trigger logs it): the session that ran it, when, and how many rows it updated — none
/// for a compare-and-set or a fenced write the database refused. A statement rolled back
/// is not in the log, save one kind: a transaction the server aborted for a serialization
/// failure or a deadlock it found (`aborted`) in its answer to a held write, which the
/// client's fault proxy saw end — at REPEATABLE READ or SERIALIZABLE, how the database
/// refuses an UPDATE of a row changed by a transaction committed after the snapshot. It
/// kept nothing, so it is a statement of no rows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Statement {
    pub pid: i32,
    pub at_us: i64,
    pub rows: i64,
    /// Of those rows, how many it changed in what the log of changes records — value, items
    /// or job. A claim (`SET fence = …`) updates a row and changes none of them; so does a
    /// row set to what it was. None: a recording from before lockslab counted them (or an
    /// abort), read as `rows`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed: Option<i64>,
    /// The server's words (SQLSTATE and message) for the conflict that ended the
    /// transaction, when this is such an abort rather than a logged UPDATE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted: Option<String>,
}

/// One record as the run left it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Final {
    pub record: String,
    pub value: i64,
    pub items: Vec<String>,
}

/// Each record as the run left it.
pub type Finals = Vec<Final>;

/// The database's own records of a challenge run, read back once the clients are done: its
/// log of changes (each with the session that made it), every UPDATE statement that reached
/// the records, and each record's final value and items — the store's read-back, an
/// observation in the run's history (`log_read_back`) like the others the grade weighs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LogBack {
    pub changes: Vec<Change>,
    pub statements: Vec<Statement>,
    pub finals: Finals,
}

/// What the run produced, for the checker.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    pub jobs: Vec<JobSpec>,
    /// Jobs some client answered `ok` for.
    pub acknowledged: BTreeSet<i64>,
    /// The log, in its order, and each record as the run left it. These and the readings
    /// of the servers below come from the run's history (`reproduce::challenge::
    /// lay_readings`), so the verdict's copy of the evidence leaves them out (a recording
    /// from before they were events carries them here).
    #[serde(default, skip_serializing)]
    pub changes: Vec<Change>,
    #[serde(default, skip_serializing)]
    pub finals: Finals,
    /// Faults the challenge meant to play, and those that played.
    pub faults_planned: usize,
    pub faults_played: usize,
    /// The clients' locks as their notes and the run saw them, in time order.
    pub moments: Vec<LockMoment>,
    /// How long a lock whose holder was killed may keep the next client waiting (none: not
    /// checked).
    pub stuck_bound_ms: Option<u64>,
    /// Each pause, delay and kill as it began, to tell whether it bit.
    pub strikes: Vec<Strike>,
    /// Why each fault that never played did not (the note it waited for never came).
    pub unplayed: Vec<String>,
    /// The TTL the faults are built around.
    pub lease_ms: u64,
    /// Every change must carry a fence, greater than every earlier one on its record
    /// (failover: the tokens must only go up, across the promotion).
    pub fences_must_rise: bool,
    /// Each job as it was handed to a client, and how that client answered: whose write a
    /// logged change was, to hold a client's `fail` against the log (none: not checked).
    pub deliveries: Vec<Delivery>,
    /// Every UPDATE statement on the records, rows or none, and the transactions Postgres
    /// aborted for a conflict (statements of no rows), in time order.
    #[serde(default, skip_serializing)]
    pub statements: Vec<Statement>,
    /// Sessions seen waiting on others (`pg_blocking_pids`) while a fault lasted.
    #[serde(default, skip_serializing)]
    pub waits: Vec<Wait>,
    /// Sessions of the clients' logins that no fault proxy opened.
    #[serde(default, skip_serializing)]
    pub sessions_around: Vec<AroundProxy>,
    /// Clients seen waiting behind a faulted client's Redis or etcd lock.
    #[serde(default, skip_serializing)]
    pub key_waits: Vec<KeyWait>,
    /// Postgres locks (advisory, or a record's row lock) seen held while a fault lasted,
    /// with the sessions that kept asking: a lock taken without waiting in Postgres
    /// (`pg_try_advisory_lock`, `NOWAIT`, `SKIP LOCKED`) is never in `waits`.
    #[serde(default, skip_serializing)]
    pub pg_locks: Vec<PgLockSeen>,
    /// The Postgres sessions each client's fault proxy opened (`pause`, `delay`; none: no
    /// proxies, or a session unread): a change made in any other session went around them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_sessions: Option<BTreeMap<String, BTreeSet<i32>>>,
    /// How far off lockslab's times on the database's clock may be (µs): the moments it
    /// read a client's line are its own clock's, put on the database's by one reading of
    /// both, good to half that reading's round trip.
    #[serde(default)]
    pub clock_margin_us: i64,
}

/// A Postgres session of a client's own login that no fault proxy opened (`pg_stat_activity`,
/// read through the run): the client reached Postgres around its proxy, where no pause or
/// delay holds what it sends.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AroundProxy {
    pub pid: i32,
    pub login: String,
    pub at_us: i64,
    /// Not a session seen: the login's password, which only its proxy was given, no longer
    /// signed in after the run — the client changed it (`SET ROLE NONE; ALTER ROLE
    /// CURRENT_USER PASSWORD …`), to open sessions around its proxy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub password_changed: bool,
}

/// A Postgres session seen waiting for others' locks (row or advisory), and when.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Wait {
    pub waiter: i32,
    pub blockers: Vec<i32>,
    pub at_us: i64,
}

/// A Postgres lock a session held, read while a fault lasted: an advisory lock (`pg_locks`;
/// which record it guards is the client's business: unknown), or a record's row, locked or
/// updated by the session's open transaction (the row's `xmax`, or its multixact's members).
/// `asking`: the run's other sessions that had sent a statement within the last 100ms then.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PgLockSeen {
    pub session: i32,
    /// Written `lock`: in the history, an event's `kind` is its own (recordings from before
    /// it was an event wrote `kind`).
    #[serde(rename = "lock", alias = "kind")]
    pub kind: PgLockKind,
    /// The record whose row it is (a row lock).
    pub record: Option<String>,
    pub at_us: i64,
    pub asking: Vec<i32>,
}

/// What kind of Postgres lock a [`PgLockSeen`] is.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum PgLockKind {
    #[default]
    Advisory,
    Row,
}

impl PgLockSeen {
    /// Whether this lock may be what guards `record`: any advisory lock (its key is the
    /// client's own choice), or that record's row.
    pub fn may_guard(&self, record: &str) -> bool {
        self.kind == PgLockKind::Advisory || self.record.as_deref() == Some(record)
    }
}

/// A client seen waiting behind another's Redis or etcd lock while a fault lasted: the key,
/// under the run's prefix, still held what it held when its (frozen, or held) client's fault
/// began, and `waiter` had a job on the same record that it had not written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KeyWait {
    /// The faulted client, its lock's key, and the server that holds it (`Redis`, `etcd`).
    pub holder: String,
    pub key: String,
    pub server: String,
    pub waiter: String,
    /// The waiter's job.
    pub job: i64,
    /// When it was seen (the database's clock, µs since the epoch).
    pub at_us: i64,
}

/// How a client was held off by a faulted client's lock: who waited, how lockslab saw it,
/// and how far into the fault.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldOff {
    pub waiter: String,
    /// `pg_blocking_pids`, or the key that still held the faulted client's value.
    pub seen: String,
    pub after_ms: i64,
}

/// When `strike`'s client answered the job it had when the fault began (never: the end of
/// time).
fn answered_after(strike: &Strike, deliveries: &[Delivery]) -> i64 {
    (deliveries.iter())
        .find(|d| {
            d.client == strike.client
                && Some(d.job) == strike.job
                && d.sent_us <= strike.at_us
                && d.answered_us.is_none_or(|a| strike.at_us <= a)
        })
        .and_then(|d| d.answered_us)
        .unwrap_or(i64::MAX)
}

/// Did `client` hold a job on `record` at `at_us`: which one?
fn holding_on(
    client: &str,
    record: &str,
    at_us: i64,
    jobs: &BTreeMap<i64, &JobSpec>,
    deliveries: &[Delivery],
) -> Option<i64> {
    deliveries
        .iter()
        .find(|d| {
            d.client == client
                && jobs.get(&d.job).is_some_and(|j| j.record == record)
                && d.sent_us <= at_us
                && d.answered_us.is_none_or(|a| at_us <= a)
        })
        .map(|d| d.job)
}

/// Did another client, holding a job on the same record, wait behind a session of
/// `strike`'s client while the fault lasted (until the client answered its job)? Then the
/// frozen client's lock held it off: the fault tested the lock, and the lock held. The
/// client that waited is named.
fn held_off(
    strike: &Strike,
    jobs: &BTreeMap<i64, &JobSpec>,
    sessions: &BTreeMap<String, BTreeSet<i32>>,
    waits: &[Wait],
    deliveries: &[Delivery],
) -> Option<HeldOff> {
    let record = &jobs.get(&strike.job?)?.record;
    let own = sessions.get(&strike.client)?;
    let until = answered_after(strike, deliveries);
    waits.iter().find_map(|wait| {
        if !(strike.at_us..=until).contains(&wait.at_us)
            || !wait.blockers.iter().any(|pid| own.contains(pid))
        {
            return None;
        }
        let (client, _) = sessions
            .iter()
            .find(|(client, pids)| **client != strike.client && pids.contains(&wait.waiter))?;
        holding_on(client, record, wait.at_us, jobs, deliveries)?;
        Some(HeldOff {
            waiter: client.clone(),
            seen: "pg_blocking_pids".into(),
            after_ms: (wait.at_us - strike.at_us) / 1000,
        })
    })
}

/// The same for a Redis or etcd lock: another client, holding a job on the record that the
/// log shows it had not written yet, was seen while the faulted client's key still held its
/// value — and that key still held it when the fault ended ([`Strike::lock_kept`]). A lease
/// that ran out during the fault held them off only while it lived: what came after it
/// decides, not the wait before.
fn held_off_by_key(
    strike: &Strike,
    jobs: &BTreeMap<i64, &JobSpec>,
    key_waits: &[KeyWait],
    deliveries: &[Delivery],
    changes: &[Change],
) -> Option<HeldOff> {
    if !strike.lock_kept {
        return None;
    }
    let record = &jobs.get(&strike.job?)?.record;
    let until = answered_after(strike, deliveries);
    let written_by = |job: i64, at_us: i64| {
        (changes.iter()).any(|c| c.job == Some(job) && c.at_us.is_none_or(|at| at <= at_us))
    };
    key_waits.iter().find_map(|wait| {
        let during = wait.holder == strike.client && (strike.at_us..=until).contains(&wait.at_us);
        let job = holding_on(&wait.waiter, record, wait.at_us, jobs, deliveries)?;
        (during && job == wait.job && !written_by(job, wait.at_us)).then(|| HeldOff {
            waiter: wait.waiter.clone(),
            seen: format!(
                "{}'s key {} ({}) still held its value",
                wait.holder, wait.key, wait.server
            ),
            after_ms: (wait.at_us - strike.at_us) / 1000,
        })
    })
}

/// The same for a Postgres lock taken without waiting in Postgres: while the fault lasted,
/// a session of `strike`'s client held an advisory lock or the record's row lock, another
/// client holding a job on the record kept asking (it sent statements then), and nobody
/// but the faulted client changed the record until it answered. A frozen session keeps
/// what it holds, so the lock held the asker off; a client that ignored the lock and wrote
/// would have changed the record meanwhile, and one that was merely slow was not asking.
fn held_off_by_postgres_lock(
    strike: &Strike,
    jobs: &BTreeMap<i64, &JobSpec>,
    sessions: &BTreeMap<String, BTreeSet<i32>>,
    locks: &[PgLockSeen],
    deliveries: &[Delivery],
    changes: &[Change],
) -> Option<HeldOff> {
    let record = &jobs.get(&strike.job?)?.record;
    let own = sessions.get(&strike.client)?;
    let until = answered_after(strike, deliveries);
    let others_wrote = changes.iter().any(|change| {
        &change.record == record
            && change
                .at_us
                .is_some_and(|at| (strike.at_us..until).contains(&at))
            && makers(change, deliveries)
                .iter()
                .any(|d| d.client != strike.client)
    });
    if others_wrote {
        return None;
    }
    locks.iter().find_map(|seen| {
        let its_lock = own.contains(&seen.session)
            && seen.may_guard(record)
            && (strike.at_us..=until).contains(&seen.at_us);
        if !its_lock {
            return None;
        }
        let (asker, _) = sessions.iter().find(|(client, pids)| {
            **client != strike.client
                && seen.asking.iter().any(|pid| pids.contains(pid))
                && holding_on(client, record, seen.at_us, jobs, deliveries).is_some()
        })?;
        let held = match seen.kind {
            PgLockKind::Advisory => "pg_locks: its session held an advisory lock".to_string(),
            PgLockKind::Row => format!("{record}'s xmax: its open transaction held the row"),
        };
        Some(HeldOff {
            waiter: asker.clone(),
            seen: format!("{held} while {asker} kept asking"),
            after_ms: (seen.at_us - strike.at_us) / 1000,
        })
    })
}

/// Each client's Postgres sessions, as its own changes show them: the pids of the changes
/// that only its deliveries can have made.
fn sessions(changes: &[Change], deliveries: &[Delivery]) -> BTreeMap<String, BTreeSet<i32>> {
    let mut sessions: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    for change in changes {
        let makers = makers(change, deliveries);
        let Some((pid, first)) = change.pid.zip(makers.first()) else {
            continue;
        };
        if makers.iter().all(|d| d.client == first.client) {
            sessions
                .entry(first.client.clone())
                .or_default()
                .insert(pid);
        }
    }
    sessions
}

/// Did the newer holder `strike` was let go before see an UPDATE of its match nothing
/// between the older write and its own (the next on the record)? Its sessions are those
/// of the clients that held its job then, or any no client's changes name.
fn newer_refused(
    strike: &Strike,
    changes: &[Change],
    sessions: &BTreeMap<String, BTreeSet<i32>>,
    statements: &[Statement],
    deliveries: &[Delivery],
) -> bool {
    let (Some(job), Some(newer)) = (strike.job, strike.overtaken_by) else {
        return false;
    };
    // A write that, tried when it was caught, matched nothing refuses nothing; one the
    // server aborted for a conflict it found is refused though its try could tell nothing.
    let weighs = |s: &Statement| match &strike.newer_tried {
        Some(Tried::ChangesNothing) => false,
        Some(Tried::Untried(_)) => s.aborted.is_some(),
        _ => true,
    };
    let Some(older) = changes.iter().find(|c| c.job == Some(job)) else {
        return false;
    };
    let next = changes
        .iter()
        .find(|c| c.record == older.record && c.seq > older.seq);
    let Some((from, to)) = older.at_us.zip(next.and_then(|c| c.at_us)) else {
        return false;
    };
    let anyones = |pid: i32| sessions.values().any(|pids| pids.contains(&pid));
    let newers = |pid: i32, at: i64| {
        deliveries.iter().any(|d| {
            d.job == newer
                && d.sent_us <= at
                && d.answered_us.is_none_or(|a| at <= a)
                && sessions
                    .get(&d.client)
                    .is_some_and(|pids| pids.contains(&pid))
        })
    };
    let held_there = |pid: i32| strike.newer_session.is_none_or(|held| held == pid);
    statements.iter().any(|s| {
        s.rows == 0
            && weighs(s)
            && from < s.at_us
            && s.at_us < to
            && held_there(s.pid)
            && (newers(s.pid, s.at_us) || !anyones(s.pid))
    })
}

/// Did an UPDATE of `strike`'s client reach the records after the fault began, before the
/// client answered its job, and match no row? Its session is one its changes were made in,
/// or one no client's changes name (a client may open a connection per job).
///
/// When its proxy read the session its held write went to, the refusal is read there
/// alone: that session's UPDATEs from the fault on — to the next fault on the client (a
/// fault follows its job) or its answer — are the held write and what came after it on
/// that connection. The first is the held write: it must have changed no value, items or
/// job (matched no row, or set a row to what it was), and so must everything after it —
/// a retry's claim of the row (a new fence) may come before the retry's write is held in
/// turn. An UPDATE that matched nothing on another connection, or after a held write that
/// changed the records, is no refusal of the held write.
fn matched_nothing(
    strike: &Strike,
    sessions: &BTreeMap<String, BTreeSet<i32>>,
    statements: &[Statement],
    deliveries: &[Delivery],
    next_on_client_us: Option<i64>,
    margin_us: i64,
) -> bool {
    if strike.job.is_none() {
        return false;
    }
    if let Some(after) = held_answers(strike, statements, deliveries, next_on_client_us, margin_us)
    {
        let mut after = after.peekable();
        return after.peek().is_some() && after.all(|s| s.changed.unwrap_or(s.rows) == 0);
    }
    let until = answered_by(strike, deliveries, margin_us);
    let own = sessions.get(&strike.client);
    let anyones = |pid: i32| sessions.values().any(|pids| pids.contains(&pid));
    statements.iter().any(|s| {
        s.rows == 0
            && (strike.at_us..=until).contains(&s.at_us)
            && (own.is_some_and(|pids| pids.contains(&s.pid)) || !anyones(s.pid))
    })
}

/// When the client's answer to `strike`'s job came, on the database's clock, as late as a
/// statement before it may seem: the answer was read after the statement ran, and on
/// lockslab's reckoning of the database's clock it may seem a little before it — by the
/// reckoning's margin, and a millisecond for the scheduler.
fn answered_by(strike: &Strike, deliveries: &[Delivery], margin_us: i64) -> i64 {
    answered_after(strike, deliveries).saturating_add(margin_us + 1000)
}

/// The statements of the session `strike`'s held write went to, from the fault to the
/// client's answer or to just before the next fault on the client (a fault follows its
/// job): the held write and what came after it on that connection. None when its proxy
/// read no session.
fn held_answers<'a>(
    strike: &Strike,
    statements: &'a [Statement],
    deliveries: &[Delivery],
    next_on_client_us: Option<i64>,
    margin_us: i64,
) -> Option<impl Iterator<Item = &'a Statement>> {
    let held = strike.held_session?;
    let until = answered_by(strike, deliveries, margin_us);
    let until = next_on_client_us.map_or(until, |next| until.min(next - 1));
    let from = strike.at_us;
    Some(
        statements
            .iter()
            .filter(move |s| s.pid == held && (from..=until).contains(&s.at_us)),
    )
}

/// Did the server itself refuse `strike`'s held write — abort its transaction for a
/// serialization failure or a deadlock it found, in its answer to that write (`aborted`
/// statements are kept for held writes alone)? At REPEATABLE READ such a write aimed at a
/// row a transaction committed after its snapshot changed; SERIALIZABLE may also abort it
/// for what its transaction read, so the caller weighs it only for a write whose try did
/// not show it matching nothing.
fn refused_by_the_server(
    strike: &Strike,
    statements: &[Statement],
    deliveries: &[Delivery],
    next_on_client_us: Option<i64>,
    margin_us: i64,
) -> bool {
    strike.job.is_some()
        && held_answers(strike, statements, deliveries, next_on_client_us, margin_us)
            .is_some_and(|mut after| after.any(|s| s.aborted.is_some()))
}

/// One delivery of a job to a client: when lockslab sent it, and when and how the client
/// answered, on the database's clock — so that a logged change can be laid against the
/// clients that held its job when it committed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivery {
    pub job: i64,
    pub client: String,
    /// When lockslab sent the job (µs since the epoch, the database's clock).
    pub sent_us: i64,
    /// When lockslab read the client's answer (none: it died first, or the run ended).
    pub answered_us: Option<i64>,
    /// `ok` (true) or `fail` (false).
    pub ok: Option<bool>,
    /// The token its `acquired` note named, and when lockslab read that note (µs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_us: Option<i64>,
}

/// The deliveries that may have made `change`: those that held its job when it committed;
/// else the last one sent before it (its client had answered already, and its write was
/// still on its way).
fn makers<'a>(change: &Change, deliveries: &'a [Delivery]) -> Vec<&'a Delivery> {
    makers_within(change, deliveries, 0)
}

/// [`makers`], a delivery counted as holding its job until `slack_us` after its answer (the
/// clock reckoning's margin: an answer is read a little after it was sent).
fn makers_within<'a>(
    change: &Change,
    deliveries: &'a [Delivery],
    slack_us: i64,
) -> Vec<&'a Delivery> {
    let Some((job, at_us)) = change.job.zip(change.at_us) else {
        return vec![];
    };
    let of_job = || deliveries.iter().filter(move |d| d.job == job);
    let holding: Vec<&Delivery> = of_job()
        .filter(|d| d.sent_us <= at_us && d.answered_us.is_none_or(|a| at_us <= a + slack_us))
        .collect();
    if !holding.is_empty() {
        return holding;
    }
    of_job()
        .filter(|d| d.sent_us <= at_us)
        .max_by_key(|d| d.sent_us)
        .into_iter()
        .collect()
}

/// Each change committed after the client that last held its job answered `ok` for it, no
/// delivery of the job open then (beyond the clock reckoning's `margin_us` and a
/// millisecond): the client said the job was done before its write was.
fn written_after_ok(changes: &[Change], deliveries: &[Delivery], margin_us: i64) -> Vec<Problem> {
    let slack_us = margin_us + 1000;
    let mut problems = Vec::new();
    for change in changes {
        let Some((job, at_us)) = change.job.zip(change.at_us) else {
            continue;
        };
        // No delivery held the job then: its maker is the last one answered before.
        let [maker] = makers_within(change, deliveries, slack_us)[..] else {
            continue;
        };
        let Some(answered) = maker.answered_us.filter(|&a| a + slack_us < at_us) else {
            continue;
        };
        if maker.ok != Some(true) {
            continue;
        }
        problems.push(Problem::WrittenAfterOk {
            record: change.record.clone(),
            job,
            client: maker.client.clone(),
            seq: change.seq,
            late_ms: (at_us - answered) / 1000,
        });
    }
    problems
}

/// Each change that only clients who answered `fail` for its job can have made: the client
/// said the write did not happen, and the log shows it did.
fn written_though_failed(changes: &[Change], deliveries: &[Delivery]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for change in changes {
        let makers = makers(change, deliveries);
        if makers.is_empty() || !makers.iter().all(|d| d.ok == Some(false)) {
            continue;
        }
        let (Some(job), Some(maker)) = (change.job, makers.first()) else {
            continue;
        };
        problems.push(Problem::FailedButWritten {
            record: change.record.clone(),
            job,
            client: maker.client.clone(),
            seq: change.seq,
        });
    }
    problems
}

/// A pause, a delay or a kill as it began: whom it hit, the job that client had, and the
/// database's clock at that moment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Strike {
    /// `pause`, `delay` or `kill`.
    pub fault: String,
    pub client: String,
    /// The job the client had, or else the last one it was given (none: not one yet).
    pub job: Option<i64>,
    /// It had answered that job already: it was between jobs.
    pub answered: bool,
    /// The database's clock when the fault began (µs since the epoch).
    pub at_us: i64,
    /// When lockslab read the client's last line before it (its note), on the database's
    /// clock as lockslab reckons it.
    pub note_us: Option<i64>,
    /// The client sends notes (the fault was aimed at its `writing`).
    pub notes: bool,
    /// It had said `released` for that job before the fault.
    pub released: bool,
    /// It answered `fail` for that job after the fault: it says its held write was refused
    /// (a claim: the fault bites through it only if `matched_nothing`).
    pub refused: bool,
    /// An UPDATE from its session reached the records after the fault began, before it
    /// answered, and matched no row: its held write demonstrably ran and changed nothing —
    /// refused by the database (filled in by the checker from the statement log).
    pub matched_nothing: bool,
    /// The held write, tried when it was caught in its own session and rolled back
    /// (`proxy::dry_run`): whether it would have changed the records then. None: no write
    /// was caught.
    pub tried: Option<Tried>,
    /// Why an UPDATE that matched nothing after the fault is no refusal (filled in by the
    /// checker): its held write was not shown to change the records when caught.
    pub unweighed: Option<String>,
    /// The newer holder it was let go before (`overtaken_by`) had an UPDATE match nothing
    /// after this job's write and before its own: it had read before, was refused, and read
    /// again (a compare-and-set's retry), so its write holding this job's entry is no sign
    /// of a note sent before its read (filled in by the checker).
    pub newer_refused: bool,
    /// Its client said it holds no lock: no lock of its can be left stuck.
    pub lockless: bool,
    /// Another client, with a job on the same record, waited behind this client's lock
    /// while the fault lasted (read from Postgres, or from the client's Redis or etcd key;
    /// filled in by the checker): who, and how it was seen.
    pub held_off: Option<HeldOff>,
    /// The Postgres session its held write went to (read by its proxy): the statements of
    /// that session after the fault are the held write's and what followed it, so a
    /// refusal is read there — not from an UPDATE the client sent on another connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_session: Option<i32>,
    /// It followed an earlier fault on the same job to the job's next write (see
    /// `challenge::play::aim`): a write retried after the held one was refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub follows: bool,
    /// The write it held came right after a fresh `writing` note (a write made after a
    /// read). A follow-up that held one with no new note may have held a write made before
    /// the retry's read (a claim, a touch of the row): if a later follow-up of the same job
    /// held the write after the retry's note, and bit, that one tested the retry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub after_note: bool,
    /// The fault it followed bit (filled in by the checker): then this one, on the retry,
    /// misses nothing by finding nobody writing the record meanwhile — the retry read
    /// afresh, and nobody was left to be overtaken.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub followed_bit: bool,
    /// Its lock — a Redis or etcd key under the run's prefix, found when the fault began —
    /// still held its value when the fault ended (see `challenge::play::outlast`).
    pub lock_kept: bool,
    /// The fault ended at the challenge's bound, not because its client's lock was gone
    /// and a newer holder had read: why, in a sentence. Nothing past the bound was tested.
    pub bounded: Option<String>,
    /// The bound was the follow's: the fault followed the job through as many writes as it
    /// follows one, and another write of the job came after them. If a retry made after a
    /// fresh read (`after_note`) was held among them and refused by the database, the job's
    /// retry is tested, and the checker lifts the bound: the write past it is that retry's
    /// code again (a client that drops its guard only from a retry past the bound goes
    /// unseen — the follow has to stop somewhere, and a lease-based retry loses every
    /// round it is held past its lease).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub followed_to_bound: bool,
    /// A pause that landed in the middle of its client's work, not at its write (`pause`'s
    /// third fault): no write was caught, so none was tried. It bites as a pause at the
    /// write does, save that an UPDATE of its client's that matched nothing after it counts
    /// as refused untried: this fault only adds what the data can show — a run passes only
    /// if the faults at the writes bite too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_the_work: bool,
    /// lockslab let its held write go while a newer holder of the record, having read it,
    /// was held just before its own write (the worst order, see `challenge::play::overtake`).
    pub overtaken: bool,
    /// The job of that newer holder, whose write shows whether it had really read first.
    pub overtaken_by: Option<i64>,
    /// The fault plays the natural order when a newer holder of the record comes: that
    /// holder's write goes first, and this one's held write (or frozen work) goes once it has
    /// answered — the stale write arriving last, which only a check in the write refuses.
    /// Whether it bit is the data's rule as for any fault: the newer holder's change committed
    /// before the held write landed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub newer_first: bool,
    /// That newer holder's write, held at its proxy while this one went first: what
    /// trying it then showed (`proxy::dry_run`), before this write landed. Its refusal is
    /// weighed only if, tried then, it would have changed the records: an UPDATE that
    /// matches nothing whenever it runs is no refused compare. None: a recording from
    /// before lockslab held the newer holder's write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newer_tried: Option<Tried>,
    /// The Postgres session that held write went to: its refusal is read there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub newer_session: Option<i32>,
    /// The fault was aimed at the commit of the job's write, not at the write
    /// (`challenge::play::aim`): a lock let go before the commit lets the next holder read
    /// the record without that write. Its own rule decides whether it bit
    /// ([`Strike::commit_missed`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub at_commit: bool,
    /// The commit was caught and held. A fault aimed at the commit that found none to hold
    /// landed where its client was, and is graded as any other (not `at_commit`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub commit_held: bool,
    /// Another client with a job on the record came for it while the commit was held —
    /// said `acquired` or `writing` then — in a sentence: it took the lock (or, with none,
    /// read) in the window the fault stretched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub came_for: Option<String>,
    /// The server aborted the held commit's transaction for a conflict it found, in its
    /// answer to that commit (filled in by the checker): the job's change ran before the
    /// commit and was rolled back with it, so the log has no trace of it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub commit_refused: bool,
}

impl Strike {
    /// A kill at the client's `released` note is the one that falls after the job's commit
    /// and before its answer, where a job done but not answered is done twice once resent.
    /// If the job's change came only after the kill (done by the client it was resent to),
    /// the client said `released` before it wrote: that kill cut a job short before its
    /// write, as the others do, and the moment it stands for was never tested.
    fn released_before_its_write(&self, job: i64, changes: &[Change]) -> Option<String> {
        if !self.released || self.at_us == 0 {
            return None;
        }
        let landed = (changes.iter()).filter(|c| c.job == Some(job) && c.at_us.is_some());
        let first = landed.min_by_key(|c| c.at_us)?;
        if first.at_us < Some(self.at_us) {
            return None;
        }
        Some(format!(
            "{} {} after it said released for job {job}, but job {job}'s change came after the \
             kill (change #{}): its `released` came before its write, so no kill fell between \
             a commit and its answer",
            self.verb(),
            self.client,
            first.seq
        ))
    }

    /// Why the fault did not bite, or nothing if it did. A kill bites if its client held a
    /// job it had not answered. A pause or a delay bites if the job's write was still to
    /// come when it began, and then was refused (fenced out), or another client's change
    /// to the same record committed before the held write landed: otherwise even an
    /// unfenced late write would have been right, and the fault tested nothing.
    pub fn missed(&self, jobs: &BTreeMap<i64, &JobSpec>, changes: &[Change]) -> Option<String> {
        let (who, verb) = (&self.client, self.verb());
        let Some(job) = self.job.filter(|&job| job > 0) else {
            return Some(format!(
                "{verb} {who} before its first job: no write was held up"
            ));
        };
        if self.fault == "kill" {
            if self.answered {
                return Some(format!(
                    "{verb} {who} between jobs (it had answered job {job}): it held no job"
                ));
            }
            return self.released_before_its_write(job, changes);
        }
        if self.at_commit {
            return self.commit_missed(job, jobs, changes);
        }
        let writes = changes.iter().filter(|c| c.job == Some(job));
        let first = writes.filter_map(|c| Some((c.at_us?, c.seq))).min();
        if let Some((at_us, seq)) = first.filter(|(at_us, _)| *at_us < self.at_us) {
            let late = match self.note_us {
                // The write landed after the note: lockslab, not the client, was late.
                Some(note_us) if self.notes && at_us >= note_us => format!(
                    "lockslab was late, {}ms after {who}'s last note, and the write had \
                     landed {}ms after that note (a busy machine: replay the seed)",
                    (self.at_us - note_us) / 1000,
                    (at_us - note_us) / 1000
                ),
                _ if self.notes => format!(
                    "its `writing` note for job {job} came after its write, not between its \
                     read and its write"
                ),
                _ => format!("the fault came after job {job}'s write"),
            };
            return Some(format!(
                "{verb} {who} {}ms after job {job}'s write had reached the database \
                 (change #{seq}): {late}",
                (self.at_us - at_us) / 1000
            ));
        }
        if self.answered {
            return Some(format!(
                "{verb} {who} between jobs (it had answered job {job}): no write was held up"
            ));
        }
        if self.released {
            return Some(format!(
                "{verb} {who} after it said released for job {job}: it held no lock then"
            ));
        }
        if let Some(bound) = &self.bounded {
            return Some(format!(
                "{verb} {who} holding job {job}, and the fault ended at its bound: {bound}"
            ));
        }
        if self.matched_nothing || self.held_off.is_some() {
            return None;
        }
        if self.followed_to_bound {
            // Its job's chain had its bound lifted (`lift_follow_bounds`): a retry made after
            // a fresh read was refused when held, and the write past the bound is taken as
            // that retry — read after this fault, as every retry reads after the last.
            return None;
        }
        let spec = jobs.get(&job)?;
        if let Some(why) = &self.unweighed {
            return Some(format!("{verb} {who} holding job {job}: {why}"));
        }
        if self.refused {
            return Some(format!(
                "{verb} {who} holding job {job}, and {who} answered fail for it, but no UPDATE \
                 of its session that matched nothing was committed after the fault: a \
                 refusal the database did not see (a check in the client before its write \
                 tests nothing the fault aims at, and a refused UPDATE rolled back leaves no \
                 trace; refuse in the write itself, and commit it)"
            ));
        }
        let (record, own) = (spec.record.as_str(), spec.append.as_str());
        if !self.notes {
            // Aimed only at the job's arrival: the client may not have read the record yet,
            // and a read after the fault sees every write made meanwhile. Another client's
            // write then proves nothing; only a refused write shows the fault was felt.
            return Some(format!(
                "{verb} {who} holding job {job}, but {who} sends no notes: whether it had read \
                 {record} before the fault nobody can tell, so a write by another client \
                 meanwhile proves nothing (say `writing` between your read and your write)"
            ));
        }
        // The job's first write in the log: what its client had read is in it. (A retry
        // held after a fault that bit reads again after its held write only if that write
        // came before its read — a claim, or a touch of the row — and then the order played
        // on it tested nothing: a blind write after that read would go untested.)
        let write = changes.iter().find(|c| c.job == Some(job));
        if let Some(read_late) = write.and_then(|w| self.read_after_the_fault(job, w, own, changes))
        {
            return Some(read_late);
        }
        if self.overtaken {
            // Its write went out between a newer holder's read and that holder's write: an
            // accepted write there is stale, and only a fence at the read refuses it —
            // unless the newer holder had not read yet (its `writing` note came before its
            // read, or it computed its write in SQL with no read): then the next write on
            // the record, the newer holder's, holds this job's entry, and the order tested
            // nothing. (A retry of the newer job by
            // another client, later, read what it should: only the next write counts.)
            let newer = self.overtaken_by.zip(write).and_then(|(newer, older)| {
                let next = (changes.iter()).find(|c| c.record == record && c.seq > older.seq)?;
                (next.job == Some(newer)
                    && next.new_items.iter().any(|e| e == own)
                    && !self.newer_refused)
                    .then_some((newer, next.seq))
            });
            return newer.map(|(newer, seq)| {
                format!(
                    "{verb} {who} and held the newer holder of {record} at its write for job \
                     {newer}, but that holder's write (change #{seq}) holds {own}, job {job}'s \
                     entry: it wrote from {record} as it was after the held write — it read \
                     {record} again before writing, or it computed its write in SQL from the \
                     row as it stood, using no read — so the order tested nothing"
                )
            });
        }
        self.nobody_came_within(job, record, first, changes)
    }

    /// The fault tested nothing if no other client's change to `record` committed from its
    /// start until the job's first write landed (`first`: its time and number).
    fn nobody_came_within(
        &self,
        job: i64,
        record: &str,
        first: Option<(i64, i64)>,
        changes: &[Change],
    ) -> Option<String> {
        let (verb, who) = (self.verb(), &self.client);
        let landed = first.filter(|(at_us, _)| *at_us >= self.at_us);
        let meanwhile = changes.iter().any(|c| {
            c.record == record
                && c.job != Some(job)
                && c.at_us.is_some_and(|at| {
                    at >= self.at_us && landed.is_none_or(|(landed_us, _)| at < landed_us)
                })
        });
        let held = match landed {
            Some((_, seq)) => format!("before job {job}'s write landed (change #{seq})"),
            None => format!("and job {job}'s write never landed"),
        };
        // A retry held after a fault that bit, with nobody writing meanwhile: it read
        // afresh, and nobody was left to overtake it.
        let retried_after_a_bite = self.follows && self.followed_bit;
        (!(meanwhile || retried_after_a_bite)).then(|| {
            format!(
                "{verb} {who} holding job {job}: nobody wrote {record} meanwhile ({held}), \
                 so even an unfenced late write was right"
            )
        })
    }

    /// Why a fault aimed at the commit of job `job`'s write did not bite. Its write ran
    /// before the fault, so the rule at the write (nobody else wrote the record before the
    /// held write landed) does not apply: what the fault tests is the window between the
    /// lock let go and the commit, and it bit only if another client with a job on the
    /// record came for it while the commit was held — said `acquired` or `writing` then, or
    /// was let write just after it by the worst order — or was held off by the faulted
    /// client's lock. A stale read in that window shows in the data (a lost update), and a
    /// lock that held until the commit passes.
    fn commit_missed(
        &self,
        job: i64,
        jobs: &BTreeMap<i64, &JobSpec>,
        changes: &[Change],
    ) -> Option<String> {
        let (who, verb) = (&self.client, self.verb());
        if !self.commit_held {
            return Some(format!(
                "{verb} {who} holding job {job}, aimed at the commit of its write, and no \
                 commit came: {}",
                if self.answered {
                    "it was between jobs"
                } else {
                    "its write, or its `writing` note, came after the fault was due (a note \
                     sent after the commit leaves nothing to hold)"
                }
            ));
        }
        if let Some(bound) = &self.bounded {
            return Some(format!(
                "{verb} {who} at the commit of job {job}'s write, and the fault ended at its \
                 bound: {bound}"
            ));
        }
        // The commit held is the job's write's only if that write had run in its session, and
        // changed the record, before the commit was caught — or the server aborted that
        // commit, and the change with it: one that ran later was committed by another commit, and the one
        // held committed nothing of the job's (a write that matched no row, sent ahead to
        // take the fault).
        // In the held session, when both are known: a change committed unheld on another
        // connection is no change this commit carried.
        let same_session = |c: &Change| self.held_session.zip(c.pid).is_none_or(|(s, p)| s == p);
        let ran_before = |c: &&Change| {
            c.job == Some(job) && c.at_us.is_some_and(|at| at < self.at_us) && same_session(c)
        };
        if self.commit_refused {
            // Excused if the fault, following the job, held its next commit and bit.
            return Some(format!(
                "{verb} {who} at the commit of job {job}'s write, and Postgres aborted that \
                 commit for a conflict it found: the change was rolled back, and no later \
                 commit of the job was held and bit"
            ));
        }
        if !changes.iter().any(|c| ran_before(&c)) {
            let later = changes.iter().find(|c| c.job == Some(job));
            return Some(format!(
                "{verb} {who} at a commit while it held job {job}, but no change of job {job} \
                 had run before that commit: {} — the commit held committed none of its",
                match later {
                    Some(c) => format!("its change (#{}) ran after the commit was caught", c.seq),
                    None => "no change of the job is in the log".to_string(),
                }
            ));
        }
        if self.held_off.is_some() {
            return None;
        }
        let record = jobs
            .get(&job)
            .map_or("its record", |spec| spec.record.as_str());
        if !self.notes {
            return Some(format!(
                "{verb} {who} at the commit of job {job}'s write, but nobody was seen held off \
                 by its lock, and without notes nobody can tell who came for {record} \
                 meanwhile (say `acquired` and `writing`)"
            ));
        }
        if self.overtaken || self.came_for.is_some() {
            // The newer holder came while the write was uncommitted. Whether what it read
            // then was stale is the data's to say: a lost update fails the run, and a lock
            // that held (or a compare refused) leaves the data right.
            return None;
        }
        Some(format!(
            "{verb} {who} at the commit of job {job}'s write: nobody came for {record} while \
             {who}'s commit was held, so the window between its lock let go and its commit \
             was never tested"
        ))
    }

    /// What a client read is in what it wrote: its items, but for its own entry at the end.
    /// An entry there that another job's change committed after the fault began was read
    /// after the fault — the `writing` note came before the read, not between the read and
    /// the write, or the write was computed in SQL from the row as it stood and used no read
    /// — and the fault froze (or held) a client with nothing read to go stale.
    fn read_after_the_fault(
        &self,
        job: i64,
        write: &Change,
        own: &str,
        changes: &[Change],
    ) -> Option<String> {
        let read = write.new_items.iter().filter(|entry| *entry != own);
        // Where an entry first appeared in the record's items: the change that put it there,
        // whatever job that change says it was.
        let committed_at = |entry: &String| {
            let change = changes.iter().find(|c| {
                c.record == write.record
                    && c.new_items.contains(entry)
                    && !c.old_items.contains(entry)
            })?;
            Some((change.at_us?, change.seq))
        };
        let (entry, at_us, seq) = read
            .filter_map(|entry| committed_at(entry).map(|(at, seq)| (entry, at, seq)))
            .find(|(_, at_us, seq)| *at_us > self.at_us && *seq < write.seq)?;
        Some(format!(
            "{} {} holding job {job}, but its write carries {entry}, which change #{seq} \
             committed {}ms after the fault began: it wrote from the record as it was after \
             the fault — its `writing` note came before its read, or it computed the write in \
             SQL from the row as it stood (`SET value = value + …`), using no read — and the \
             grader cannot see a stale read a write never used",
            self.verb(),
            self.client,
            (at_us - self.at_us) / 1000
        ))
    }

    fn verb(&self) -> &'static str {
        match self.fault.as_str() {
            "pause" => "paused",
            "kill" => "killed",
            _ => "delayed",
        }
    }
}

/// One moment of a client's lock on a record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockMoment {
    pub t_ms: u64,
    pub client: String,
    pub record: String,
    pub what: Moment,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Moment {
    /// A job on the record was sent to the client: from now it wants the lock.
    Wants,
    Acquired,
    Released,
    /// The client was killed while it had a job on the record.
    Killed,
}

/// A broken rule, with its evidence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Problem {
    StaleWrite {
        record: String,
        job: i64,
        seq: i64,
        old_value: i64,
        new_value: i64,
        add: i64,
        /// The job's entry, and what the change did to the items where it is not the items
        /// before with that entry at the end: the entries before that it dropped (erased),
        /// and those after that were not before (added). Both empty: the items were right.
        #[serde(default)]
        append: String,
        #[serde(default)]
        erased: Vec<String>,
        #[serde(default)]
        added: Vec<String>,
    },
    /// A job whose change is in the log `times` times, or whose entry its record's final
    /// items hold `in_items` times: more than once either way.
    Doubled {
        job: i64,
        times: usize,
        #[serde(default)]
        record: String,
        #[serde(default)]
        append: String,
        #[serde(default)]
        in_items: usize,
    },
    /// Answered `ok`, and no change of it in the log (`gone` none), or its entry not in its
    /// record's final items.
    Lost {
        job: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gone: Option<Gone>,
    },
    NeverDone {
        job: i64,
    },
    Untagged {
        record: String,
        seq: i64,
        job: Option<i64>,
    },
    LogDisagrees {
        record: String,
        value: i64,
        logged: i64,
        #[serde(default)]
        items: Vec<String>,
        #[serde(default)]
        logged_items: Vec<String>,
    },
    StuckLock {
        record: String,
        dead: String,
        waiter: String,
        waited_ms: u64,
        bound_ms: u64,
    },
    /// A change whose fence equals the greatest an earlier change of its record had.
    TokenReused(Tokens),
    /// A change whose fence is smaller than an earlier change's on its record.
    TokenWentBack(Tokens),
    /// A change that carries no fence, where every change must.
    Unfenced {
        record: String,
        job: Option<i64>,
        seq: i64,
    },
    /// A change whose fence is smaller than an earlier change's on its record, where the
    /// clients' notes show the smaller token was taken first: the source did not go back,
    /// the writes committed in another order than their tokens were taken.
    TokenOutOfOrder(Tokens),
    /// A job its client answered `fail` for (the write did not happen, it said), whose
    /// write the log shows committed: the change `seq`, which no client that answered `ok`
    /// can have made.
    FailedButWritten {
        record: String,
        job: i64,
        client: String,
        seq: i64,
    },
    /// A job its client answered `ok` for (its effect is in the table, it said) before its
    /// write committed: the change `seq`, made `late_ms` after that answer, while no
    /// delivery of the job was open. A write sent after the answer is the job's no more to
    /// the challenge — no fault follows it — so it must not land after it.
    WrittenAfterOk {
        record: String,
        job: i64,
        client: String,
        seq: i64,
        late_ms: i64,
    },
}

impl Problem {
    pub fn kind(&self) -> &'static str {
        match self {
            Problem::StaleWrite { .. } => "stale-write",
            Problem::Doubled { .. } => "doubled",
            Problem::Lost { .. } => "lost",
            Problem::NeverDone { .. } => "never-done",
            Problem::Untagged { .. } => "untagged",
            Problem::LogDisagrees { .. } => "log-disagrees",
            Problem::StuckLock { .. } => "stuck-lock",
            Problem::TokenReused(_) => "token-reused",
            Problem::TokenWentBack(_) => "token-went-back",
            Problem::TokenOutOfOrder(_) => "token-out-of-order",
            Problem::Unfenced { .. } => "unfenced",
            Problem::FailedButWritten { .. } => "failed-but-written",
            Problem::WrittenAfterOk { .. } => "written-after-ok",
        }
    }

    /// The job it is about, where it names one.
    pub fn job(&self) -> Option<i64> {
        match self {
            Problem::StaleWrite { job, .. }
            | Problem::Doubled { job, .. }
            | Problem::Lost { job, .. }
            | Problem::NeverDone { job }
            | Problem::FailedButWritten { job, .. }
            | Problem::WrittenAfterOk { job, .. } => Some(*job),
            Problem::Untagged { job, .. } | Problem::Unfenced { job, .. } => *job,
            Problem::TokenReused(tokens)
            | Problem::TokenWentBack(tokens)
            | Problem::TokenOutOfOrder(tokens) => tokens.job,
            Problem::LogDisagrees { .. } | Problem::StuckLock { .. } => None,
        }
    }

    /// Is the logged change `seq` (of `job`) one this finding names? A stale write or an
    /// untagged change names its change; a doubled effect, every change of its job.
    pub fn names_change(&self, seq: Option<i64>, job: Option<i64>) -> bool {
        match self {
            Problem::StaleWrite { seq: named, .. }
            | Problem::Untagged { seq: named, .. }
            | Problem::Unfenced { seq: named, .. }
            | Problem::FailedButWritten { seq: named, .. }
            | Problem::WrittenAfterOk { seq: named, .. } => seq == Some(*named),
            Problem::TokenReused(tokens)
            | Problem::TokenWentBack(tokens)
            | Problem::TokenOutOfOrder(tokens) => {
                seq == Some(tokens.seq) || seq == Some(tokens.earlier_seq)
            }
            Problem::Doubled { job: named, .. } => job == Some(*named),
            _ => false,
        }
    }

    /// One line for a terminal.
    pub fn describe(&self) -> String {
        match self {
            Problem::StaleWrite {
                record,
                job,
                seq,
                old_value,
                new_value,
                add,
                append,
                erased,
                added,
            } => {
                if new_value - old_value == *add {
                    let whose = format!("{record}'s items");
                    match items::fault_words(append, erased, added, &whose) {
                        // Every entry there, in another order.
                        words if words.is_empty() => format!(
                            "stale write: job {job} put {append} elsewhere than at the end of \
                             {whose} (change #{seq})"
                        ),
                        words => format!("stale write: job {job} {words} (change #{seq})"),
                    }
                } else {
                    let items = items::fault_words(append, erased, added, "the items");
                    let items = if items.is_empty() {
                        String::new()
                    } else {
                        format!("; it {items}")
                    };
                    format!(
                        "stale write: job {job} set {record} to {new_value} over {old_value} \
                         (change #{seq}); it adds {add}, so it was computed from a read of {}, \
                         not from the {old_value} the record held{items}",
                        new_value - add
                    )
                }
            }
            Problem::Doubled {
                job,
                times,
                record,
                append,
                in_items,
            } => items::doubled_words(*job, *times, record, append, *in_items),
            Problem::Lost { job, gone: None } => {
                format!("lost: job {job} was answered ok, and the log has no change of it")
            }
            Problem::Lost {
                job,
                gone: Some(gone),
            } => gone.describe(*job),
            Problem::NeverDone { job } => {
                format!("never done: no client did job {job}")
            }
            Problem::Untagged { record, seq, job } => match job {
                None => format!(
                    "untagged change #{seq} of {record}: the write did not set the job column"
                ),
                Some(job) => format!(
                    "untagged change #{seq} of {record}: job {job} is not a job of this run"
                ),
            },
            Problem::LogDisagrees {
                record,
                value,
                logged,
                items,
                logged_items,
            } => {
                if value == logged {
                    format!(
                        "{record}'s items are {}, its log ends at {}: they changed outside \
                         the log",
                        items::list(items),
                        items::list(logged_items)
                    )
                } else {
                    let too = if items == logged_items {
                        ""
                    } else {
                        " (its items too)"
                    };
                    format!(
                        "{record} holds {value}, its log ends at {logged}: it changed outside \
                         the log{too}"
                    )
                }
            }
            Problem::StuckLock {
                record,
                dead,
                waiter,
                waited_ms,
                bound_ms,
            } => format!(
                "stuck lock: {dead} was killed holding the lock of {record}, and {waiter} \
                 waited {waited_ms}ms for it (the bound is {bound_ms}ms)"
            ),
            Problem::TokenReused(tokens) => tokens.describe("token reused", "the same token as"),
            Problem::TokenWentBack(tokens) => {
                tokens.describe("token went back", "a smaller token than")
            }
            Problem::TokenOutOfOrder(tokens) => format!(
                "{}; the token source did not go back: fence {} was taken before fence {}, \
                 and its write committed after — fences must rise in commit order (take the \
                 token after the row lock, in the transaction that writes, or claim the row \
                 with it)",
                tokens.describe("token out of order", "a smaller token than"),
                tokens.fence,
                tokens.earlier_fence
            ),
            Problem::Unfenced { record, job, seq } => format!(
                "unfenced change #{seq} of {record} ({}): the write set no fence, and \
                 this challenge grades every change's token",
                job_name(*job)
            ),
            Problem::FailedButWritten {
                record,
                job,
                client,
                seq,
            } => format!(
                "failed but written: {client} answered fail for job {job}, and its write \
                 committed (change #{seq} of {record}): a `fail` says the job had no effect, \
                 so lockslab gave it out again; answer `fail` only for a write that \
                 cannot land any more (refused, or rolled back)"
            ),
            Problem::WrittenAfterOk {
                record,
                job,
                client,
                seq,
                late_ms,
            } => format!(
                "written after ok: {client} answered ok for job {job}, and its write ran \
                 {late_ms}ms later (change #{seq} of {record}): `ok` says the job's effect \
                 is in the table; answer once its write has committed"
            ),
        }
    }
}

/// A change whose fence did not rise, and the earlier change of the same record whose
/// fence was the greatest before it: the evidence of a token reused or gone back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    pub record: String,
    pub job: Option<i64>,
    pub seq: i64,
    pub fence: i64,
    pub earlier_job: Option<i64>,
    pub earlier_seq: i64,
    pub earlier_fence: i64,
}

impl Tokens {
    fn describe(&self, what: &str, how: &str) -> String {
        format!(
            "{what}: change #{} of {} ({}) has fence {}, {how} change #{} before it ({}, \
             fence {})",
            self.seq,
            self.record,
            job_name(self.job),
            self.fence,
            self.earlier_seq,
            job_name(self.earlier_job),
            self.earlier_fence
        )
    }
}

fn job_name(job: Option<i64>) -> String {
    job.map_or("no job".into(), |job| format!("job {job}"))
}

/// Each change whose fence is missing, or not greater than the greatest fence an earlier
/// change of its record had — with that earlier change as the evidence.
fn fences_that_did_not_rise(changes: &[Change], deliveries: &[Delivery]) -> Vec<Problem> {
    // When each token was taken, from the clients' `acquired` notes.
    let taken = |token: i64| {
        (deliveries.iter())
            .filter(|d| d.token == Some(token))
            .filter_map(|d| d.token_us)
            .min()
    };
    let mut problems = Vec::new();
    let mut highest: BTreeMap<&str, &Change> = BTreeMap::new();
    for change in changes {
        let Some(fence) = change.fence else {
            problems.push(Problem::Unfenced {
                record: change.record.clone(),
                job: change.job,
                seq: change.seq,
            });
            continue;
        };
        let record = change.record.as_str();
        match highest.get(record) {
            Some(earlier) if earlier.fence.is_some_and(|e| fence <= e) => {
                let tokens = Tokens {
                    record: change.record.clone(),
                    job: change.job,
                    seq: change.seq,
                    fence,
                    earlier_job: earlier.job,
                    earlier_seq: earlier.seq,
                    earlier_fence: earlier.fence.unwrap_or_default(),
                };
                let first = taken(fence).zip(taken(tokens.earlier_fence));
                problems.push(if earlier.fence == Some(fence) {
                    Problem::TokenReused(tokens)
                } else if first.is_some_and(|(smaller, greater)| smaller < greater) {
                    Problem::TokenOutOfOrder(tokens)
                } else {
                    Problem::TokenWentBack(tokens)
                });
            }
            _ => {
                highest.insert(record, change);
            }
        }
    }
    problems
}

/// The verdict's one word, and the exit status it maps to: the run's [`Outcome`] in the
/// grader's words (`pass`, `fail`, `unknown`), which its JSON and exit status keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grade {
    Pass,
    Fail,
    /// Nothing failed, and something the run set out to test was not tested: said
    /// `unknown` (JSON) and `UNKNOWN` (terminal), as `chaos` and `matrix` say it — never a
    /// pass.
    #[serde(rename = "unknown", alias = "undecided")]
    Undecided,
}

/// What the checker found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub problems: Vec<Problem>,
    /// What the run could not decide, in sentences (`unknown` in the JSON).
    #[serde(rename = "unknown")]
    pub undecided: Vec<String>,
    /// Changes in the log that took effect as their job meant.
    pub good_changes: usize,
    /// Faults that played and bit (see [`Strike::missed`]).
    pub faults_bit: usize,
    /// What the grade did not weigh, said plainly (no tokens to grade).
    pub notes: Vec<String>,
}

impl Grade {
    /// The word the terminal prints it as.
    pub fn word(self) -> &'static str {
        match self {
            Grade::Pass => "PASS",
            Grade::Fail => "FAIL",
            Grade::Undecided => "UNKNOWN",
        }
    }
}

impl From<Outcome> for Grade {
    fn from(outcome: Outcome) -> Grade {
        match outcome {
            Outcome::Valid => Grade::Pass,
            Outcome::Invalid => Grade::Fail,
            Outcome::Unknown => Grade::Undecided,
        }
    }
}

impl Report {
    /// The run as the one result every checker gives: each problem an invalid finding,
    /// each undecided question an unknown one, merged by Jepsen's rule. (The findings name
    /// no events yet: the grader reads the store's change log, not positions in the history.)
    pub fn report(&self) -> report::Report {
        report::Report::of_lists(
            self.problems.iter().map(|p| (p.kind(), p.describe())),
            self.undecided.iter().cloned(),
        )
    }

    /// The outcome in the grader's words: pass, fail, unknown.
    pub fn grade(&self) -> Grade {
        self.report().outcome.into()
    }
}

/// The run's grade: its evidence checked, or a fail if the client failed (crashed, hung,
/// spoke garbage) — the jobs not done by then were never given a chance, and forty "never
/// done" lines would bury the one that matters.
pub fn graded(evidence: &Evidence, client_failed: bool) -> (Report, Grade) {
    let mut report = check(evidence);
    if !client_failed {
        let grade = report.grade();
        return (report, grade);
    }
    report
        .problems
        .retain(|p| !matches!(p, Problem::NeverDone { .. }));
    (report, Grade::Fail)
}

/// Checks one run's evidence.
pub fn check(evidence: &Evidence) -> Report {
    let mut report = Report::default();
    let jobs: BTreeMap<i64, &JobSpec> = evidence.jobs.iter().map(|j| (j.id, j)).collect();
    let mut changes = evidence.changes.clone();
    changes.sort_by_key(|c| c.seq);
    let mut times: BTreeMap<i64, usize> = BTreeMap::new();
    for change in &changes {
        let Some(job) = change.job.and_then(|id| jobs.get(&id)) else {
            report.problems.push(Problem::Untagged {
                record: change.record.clone(),
                seq: change.seq,
                job: change.job,
            });
            continue;
        };
        *times.entry(job.id).or_default() += 1;
        let items = items::fault(change, &job.append);
        if change.new_value != change.old_value + job.add
            || change.record != job.record
            || items.is_some()
        {
            let (erased, added) = items.unwrap_or_default();
            report.problems.push(Problem::StaleWrite {
                record: change.record.clone(),
                job: job.id,
                seq: change.seq,
                old_value: change.old_value,
                new_value: change.new_value,
                add: job.add,
                append: job.append.clone(),
                erased,
                added,
            });
        } else {
            report.good_changes += 1;
        }
    }
    let held = |job: &JobSpec| items::held(&evidence.finals, &job.record, &job.append);
    for job in &evidence.jobs {
        let n = times.get(&job.id).copied().unwrap_or(0);
        if n > 1 || held(job) > 1 {
            report.problems.push(Problem::Doubled {
                job: job.id,
                times: n,
                record: job.record.clone(),
                append: job.append.clone(),
                in_items: held(job),
            });
        }
    }
    for job in &evidence.jobs {
        let changed = times.contains_key(&job.id);
        let acknowledged = evidence.acknowledged.contains(&job.id);
        if acknowledged && !changed {
            report.problems.push(Problem::Lost {
                job: job.id,
                gone: None,
            });
        } else if acknowledged && held(job) == 0 {
            report.problems.push(Problem::Lost {
                job: job.id,
                gone: Some(Gone::of(job, &changes)),
            });
        } else if !acknowledged && !changed {
            report.problems.push(Problem::NeverDone { job: job.id });
        }
    }
    for Final {
        record,
        value,
        items,
    } in &evidence.finals
    {
        let last = changes.iter().rev().find(|c| &c.record == record);
        let logged = last.map_or(0, |c| c.new_value);
        let logged_items = last.map(|c| c.new_items.clone()).unwrap_or_default();
        if logged != *value || logged_items != *items {
            report.problems.push(Problem::LogDisagrees {
                record: record.clone(),
                value: *value,
                logged,
                items: items.clone(),
                logged_items,
            });
        }
    }
    if evidence.fences_must_rise {
        if changes.iter().all(|c| c.fence.is_none()) {
            // A client with no fence at all: nothing here went back or repeated.
            report.notes.push(
                "no tokens to grade: no change carried a fence, so only the data is graded \
                 here (a lock without a fence is pause's and delay's question)"
                    .into(),
            );
        } else {
            report
                .problems
                .extend(fences_that_did_not_rise(&changes, &evidence.deliveries));
        }
    }
    let false_fails = written_though_failed(&changes, &evidence.deliveries);
    // A `fail` whose write committed is no refusal: the fault did not bite through it.
    let lied: BTreeSet<(String, i64)> = (false_fails.iter())
        .filter_map(|p| match p {
            Problem::FailedButWritten { client, job, .. } => Some((client.clone(), *job)),
            _ => None,
        })
        .collect();
    report.problems.extend(false_fails);
    report.problems.extend(written_after_ok(
        &changes,
        &evidence.deliveries,
        evidence.clock_margin_us,
    ));
    if let Some(bound_ms) = evidence.stuck_bound_ms {
        report
            .problems
            .extend(stuck_locks(&evidence.moments, bound_ms));
        // A dead holder's lock is seen from its `acquired` and the next holder's: a client
        // that sends no notes cannot show whether it left its lock stuck past the bound.
        let silent = (evidence.strikes.iter()).find(|s| {
            s.fault == "kill" && !s.notes && !s.lockless && !s.answered && s.job.is_some()
        });
        if let Some(strike) = silent {
            report.undecided.push(format!(
                "a lock left by a dead holder is read from the clients' `acquired` notes, and \
                 {} sends none: whether its lock kept the next client waiting past {bound_ms}ms \
                 is unchecked (say `ready` with notes, and `acquired` when you hold the lock)",
                strike.client
            ));
        }
    }
    let sessions = sessions(&changes, &evidence.deliveries);
    // Whose lock held whom off: every session a client's proxy opened is that client's, its
    // lock connection too (one that never changed a record).
    let mut every_session = sessions.clone();
    for (client, opened) in evidence.proxy_sessions.iter().flatten() {
        every_session
            .entry(client.clone())
            .or_default()
            .extend(opened);
    }
    let strikes = evidence.strikes.iter().map(|strike| {
        let mut strike = strike.clone();
        let job = strike.job.unwrap_or_default();
        strike.refused &= !lied.contains(&(strike.client.clone(), job));
        strike.newer_refused = newer_refused(
            &strike,
            &changes,
            &sessions,
            &evidence.statements,
            &evidence.deliveries,
        );
        if strike.fault != "kill" {
            strike.held_off = held_off(
                &strike,
                &jobs,
                &every_session,
                &evidence.waits,
                &evidence.deliveries,
            )
            .or_else(|| {
                held_off_by_key(
                    &strike,
                    &jobs,
                    &evidence.key_waits,
                    &evidence.deliveries,
                    &changes,
                )
            })
            .or_else(|| {
                held_off_by_postgres_lock(
                    &strike,
                    &jobs,
                    &every_session,
                    &evidence.pg_locks,
                    &evidence.deliveries,
                    &changes,
                )
            });
        }
        let next_on_client_us = (evidence.strikes.iter())
            .filter(|s| s.client == strike.client && s.at_us > strike.at_us)
            .map(|s| s.at_us)
            .min();
        strike.commit_refused = strike.at_commit
            && held_answers(
                &strike,
                &evidence.statements,
                &evidence.deliveries,
                next_on_client_us,
                evidence.clock_margin_us,
            )
            .is_some_and(|mut answers| answers.any(|s| s.aborted.is_some()));
        let zero_rows = strike.fault != "kill"
            && matched_nothing(
                &strike,
                &sessions,
                &evidence.statements,
                &evidence.deliveries,
                next_on_client_us,
                evidence.clock_margin_us,
            );
        // Matching nothing after the fault is a refusal only for a write that, tried when
        // it was caught, would have changed the records: a write that matches nothing
        // whenever it runs (`… AND false`) refuses nothing.
        // A pause in the work caught no write to try: an UPDATE of its client's that matched
        // nothing after it is a refusal all the same, since this fault only adds what the
        // data can show — the faults aimed at the writes must bite too.
        // A write the server refused for a conflict it found is weighed though it could
        // not be tried — never one that, tried, matched nothing: SERIALIZABLE can abort a
        // write that matches nothing for what its transaction read.
        let weighable = strike.in_the_work
            || strike.tried.as_ref().is_some_and(Tried::writes)
            || !matches!(strike.tried, Some(Tried::ChangesNothing))
                && refused_by_the_server(
                    &strike,
                    &evidence.statements,
                    &evidence.deliveries,
                    next_on_client_us,
                    evidence.clock_margin_us,
                );
        strike.matched_nothing = zero_rows && weighable;
        if zero_rows && !strike.matched_nothing {
            strike.unweighed = Some(match &strike.tried {
                Some(Tried::Untried(why)) => format!(
                    "an UPDATE of its session matched nothing after the fault, but its held \
                     write was not tried when it was caught ({why}): whether it would have \
                     changed the records then is unknown, so its 0 rows prove nothing"
                ),
                Some(Tried::ChangesNothing) => "an UPDATE of its session matched nothing \
                     after the fault, but its held write, tried when it was caught, would have \
                     changed nothing then either: its 0 rows refuse nothing"
                    .to_string(),
                _ => "an UPDATE of its session matched nothing after the fault, but no write \
                      of its was caught and tried: what it would have changed is unknown, so \
                      its 0 rows prove nothing"
                    .to_string(),
            });
        }
        strike
    });
    let mut strikes: Vec<Strike> = strikes.collect();
    report.notes.extend(lift_follow_bounds(&mut strikes));
    for strike in &strikes {
        let Some(held) = strike
            .held_off
            .as_ref()
            .filter(|_| strike.bounded.is_none())
        else {
            continue;
        };
        if !strike.answered {
            report.notes.push(format!(
                "the {} of {} bit: {}, with a job on the same record, waited behind {}'s lock \
                 ({}, {}ms into the fault) — the lock held it off",
                strike.fault, strike.client, held.waiter, strike.client, held.seen, held.after_ms
            ));
        }
    }
    if let Some(by_client) = &evidence.proxy_sessions {
        report.undecided.extend(around_the_proxy(
            &changes,
            &evidence.statements,
            &evidence.sessions_around,
            by_client,
        ));
    }
    let mut bit_last: BTreeMap<(String, Option<i64>), bool> = BTreeMap::new();
    let mut graded: Vec<(&Strike, Option<String>)> = Vec::new();
    for strike in &strikes {
        let mut weighed = strike.clone();
        let chain = (strike.client.clone(), strike.job);
        weighed.followed_bit = strike.follows && bit_last.get(&chain) == Some(&true);
        let miss = weighed.missed(&jobs, &changes);
        bit_last.insert(chain, miss.is_none());
        graded.push((strike, miss));
    }
    // A later fault on the same client's same job, of the kind `tests_it`, that bit.
    let bit_later = |at: usize, tests_it: fn(&Strike) -> bool| {
        let (strike, _) = graded[at];
        (graded[at + 1..].iter()).any(|(later, miss)| {
            tests_it(later)
                && miss.is_none()
                && later.client == strike.client
                && later.job == strike.job
        })
    };
    let missed: Vec<String> = (0..graded.len())
        .filter_map(|at| {
            let (strike, miss) = &graded[at];
            // A follow-up that held a write with no new `writing` note, and missed, is
            // excused when a later follow-up of the same job held the write after the
            // retry's note and bit: that write, made after the retry's read, is the one the
            // retry is tested by. A held commit the server aborted is excused when the
            // fault, following the job, held a later commit of it and bit: that commit is
            // the one the window is tested by.
            let excused = (strike.follows
                && !strike.after_note
                && bit_later(at, |later| later.follows && later.after_note))
                || (strike.commit_refused
                    && bit_later(at, |later| later.at_commit && later.commit_held));
            miss.clone().filter(|_| !excused)
        })
        .collect();
    report.faults_bit = evidence.faults_played.saturating_sub(missed.len());
    // A fault that follows its job plays again and counts as played, so the count alone can
    // reach the plan while a planned fault never played: the faults that never played are
    // named, whatever the count.
    if evidence.faults_played < evidence.faults_planned || !evidence.unplayed.is_empty() {
        let never = evidence.unplayed.len().max(
            evidence
                .faults_planned
                .saturating_sub(evidence.faults_played),
        );
        report.undecided.push(format!(
            "{never} of {} planned faults never played: the run ended before their moment \
             came (the next lines say which)",
            evidence.faults_planned
        ));
        report.undecided.extend(evidence.unplayed.iter().cloned());
    }
    if !missed.is_empty() {
        report.undecided.push(format!(
            "{} of {} faults that played missed what they aim at (each line below says how)",
            missed.len(),
            evidence.faults_played
        ));
        report.undecided.extend(missed);
    }
    report
}

/// Lifts the follow's bound from each job whose retry was tested: among its followed writes,
/// one made after a fresh `writing` note was held and refused by the database
/// ([`Strike::followed_to_bound`]). A line for each such job says so.
fn lift_follow_bounds(strikes: &mut [Strike]) -> Vec<String> {
    let mut said = Vec::new();
    let lifted: BTreeSet<(String, i64)> = (strikes.iter())
        .filter(|s| s.followed_to_bound)
        .filter_map(|s| Some((s.client.clone(), s.job?)))
        .filter(|(client, job)| {
            strikes.iter().any(|s| {
                &s.client == client
                    && s.job == Some(*job)
                    && s.follows
                    && s.after_note
                    && s.matched_nothing
            })
        })
        .collect();
    for (client, job) in lifted {
        let chain = (strikes.iter_mut())
            .filter(|s| s.client == client && s.job == Some(job) && s.followed_to_bound);
        let mut writes = 0;
        for strike in chain {
            strike.bounded = None;
            writes += 1;
        }
        said.push(format!(
            "the faults on {client}'s job {job} followed it as far as they follow a job \
            ({writes} held): its retries after a fresh read were refused when held, so the \
            write that landed past that is taken as the same retry"
        ));
    }
    said
}

/// The UPDATEs of the records made in sessions that no client's fault proxy opened: a
/// client that connects to Postgres around its proxy (the server's port is no secret to
/// it) writes where no pause or delay can hold its writes, and the fault lands on whatever
/// it still sends through the proxy. What the faults tested is then unknown: one line
/// saying so, naming the first such change (or statement).
fn around_the_proxy(
    changes: &[Change],
    statements: &[Statement],
    sessions: &[AroundProxy],
    by_client: &BTreeMap<String, BTreeSet<i32>>,
) -> Option<String> {
    let proxied = |pid: i32| by_client.values().any(|pids| pids.contains(&pid));
    let change = changes
        .iter()
        .find(|c| c.pid.is_some_and(|pid| !proxied(pid)));
    let statement = statements.iter().find(|s| !proxied(s.pid));
    let around: Vec<String> = (sessions.iter())
        .filter(|s| !proxied(s.pid))
        .map(|s| match s.password_changed {
            true => format!("{} (its password changed: ALTER ROLE … PASSWORD)", s.login),
            false => format!("{} (session {})", s.login, s.pid),
        })
        .collect();
    if let (None, None, false) = (change, statement, around.is_empty()) {
        return Some(format!(
            "Postgres sessions of the clients' own logins were opened around their fault \
             proxies — {}: what a client sends there meets no pause or delay (a helper \
             writing a table of its own to cancel a write, say), so what the faults tested \
             is unknown (connect only with the `postgres_url` that `init` gives)",
            around.join(", ")
        ));
    }
    let what = match (change, statement) {
        (Some(change), _) => format!(
            "change #{} ({}) was made in Postgres session {}",
            change.seq,
            job_name(change.job),
            change.pid.unwrap_or_default()
        ),
        (None, Some(statement)) => format!(
            "an UPDATE of the records ({} rows) ran in Postgres session {}",
            statement.rows, statement.pid
        ),
        (None, None) => return None,
    };
    Some(format!(
        "{what}, which no client's fault proxy opened: a client reached the records around \
         its proxy, where no pause or delay can hold its writes, so what the faults tested \
         is unknown (connect with the `postgres_url` that `init` gives)"
    ))
}

/// Each lock whose holder was killed holding it: how long the next client to take it had
/// waited — from its job on the record, or from the kill if it wanted it before.
fn stuck_locks(moments: &[LockMoment], bound_ms: u64) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (i, kill) in moments.iter().enumerate() {
        if kill.what != Moment::Killed {
            continue;
        }
        let held = moments[..i]
            .iter()
            .rev()
            .find(|m| m.client == kill.client && m.record == kill.record)
            .is_some_and(|m| m.what == Moment::Acquired);
        if !held {
            continue;
        }
        let later = &moments[i + 1..];
        let Some(next) = later
            .iter()
            .find(|m| m.record == kill.record && m.what == Moment::Acquired)
        else {
            continue;
        };
        let wanted = moments
            .iter()
            .filter(|m| m.client == next.client && m.record == kill.record)
            .filter(|m| m.what == Moment::Wants && m.t_ms <= next.t_ms)
            .map(|m| m.t_ms)
            .next_back()
            .unwrap_or(kill.t_ms);
        let waited_ms = next.t_ms.saturating_sub(wanted.max(kill.t_ms));
        if waited_ms > bound_ms {
            problems.push(Problem::StuckLock {
                record: kill.record.clone(),
                dead: kill.client.clone(),
                waiter: next.client.clone(),
                waited_ms,
                bound_ms,
            });
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: i64, record: &str, add: i64) -> JobSpec {
        JobSpec {
            id,
            record: record.into(),
            add,
            append: format!("j{id}"),
        }
    }

    pub(super) fn change(seq: i64, record: &str, job: Option<i64>, old: i64, new: i64) -> Change {
        Change {
            seq,
            record: record.into(),
            job,
            old_value: old,
            new_value: new,
            at_us: Some(seq * 1_000_000),
            fence: None,
            old_items: vec![],
            new_items: vec![],
            pid: None,
        }
    }

    /// Each change's items as a client that reads and writes them right leaves them: the
    /// record's items before, and those with its job's entry (`j<id>`) at the end; and each
    /// record's final items as its last change left them.
    pub(super) fn fill_items(run: &mut Evidence) {
        let mut items: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for change in &mut run.changes {
            let now = items.entry(change.record.clone()).or_default();
            change.old_items = now.clone();
            now.extend(change.job.map(|job| format!("j{job}")));
            change.new_items = now.clone();
        }
        for last in &mut run.finals {
            last.items = items.get(&last.record).cloned().unwrap_or_default();
        }
    }

    pub(super) fn evidence(
        changes: Vec<Change>,
        acked: &[i64],
        finals: &[(&str, i64)],
    ) -> Evidence {
        let mut run = Evidence {
            jobs: vec![job(1, "r0", 3), job(2, "r0", 5), job(3, "r1", 2)],
            acknowledged: acked.iter().copied().collect(),
            changes,
            finals: finals
                .iter()
                .map(|(record, value)| Final {
                    record: record.to_string(),
                    value: *value,
                    items: vec![],
                })
                .collect(),
            faults_planned: 1,
            faults_played: 1,
            ..Evidence::default()
        };
        fill_items(&mut run);
        run
    }

    /// Jobs 1 and 2 on r0, 3 on r1, each written once as meant.
    pub(super) fn clean_run() -> Evidence {
        evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r0", Some(2), 3, 8),
                change(3, "r1", Some(3), 0, 2),
            ],
            &[1, 2, 3],
            &[("r0", 8), ("r1", 2)],
        )
    }

    fn moment(t_ms: u64, client: &str, what: Moment) -> LockMoment {
        LockMoment {
            t_ms,
            client: client.into(),
            record: "r0".into(),
            what,
        }
    }

    #[test]
    fn a_lock_whose_dead_holder_keeps_the_next_client_waiting_past_the_bound_is_stuck() {
        use Moment::*;
        let mut run = clean_run();
        // c1 dies holding r0 at 100ms; c2 wanted r0 from 50ms, took it at 700ms.
        run.moments = vec![
            moment(0, "c1", Wants),
            moment(10, "c1", Acquired),
            moment(50, "c2", Wants),
            moment(100, "c1", Killed),
            moment(700, "c2", Acquired),
        ];
        run.stuck_bound_ms = Some(2000);
        assert_eq!(check(&run).grade(), Grade::Pass, "600ms is within 2s");
        run.stuck_bound_ms = Some(500);
        let report = check(&run);
        assert_eq!(report.problems.len(), 1, "{report:?}");
        let line = report.problems[0].describe();
        assert!(
            line.contains("c1 was killed") && line.contains("c2 waited 600ms"),
            "{line}"
        );
        // Killed after it released: no lock of its was left, however long c2 waited after.
        run.moments.insert(3, moment(90, "c1", Released));
        assert_eq!(check(&run).grade(), Grade::Pass);
        // A client that wanted it only later waited from its own job, not from the kill.
        run.moments.remove(3);
        run.moments[2].t_ms = 650;
        run.moments.swap(2, 3);
        assert_eq!(check(&run).grade(), Grade::Pass, "50ms of waiting");
    }

    fn fenced(seq: i64, record: &str, job: i64, old: i64, new: i64, fence: i64) -> Change {
        Change {
            fence: Some(fence),
            ..change(seq, record, Some(job), old, new)
        }
    }

    #[test]
    fn under_failover_a_fence_that_does_not_rise_on_its_record_fails_with_both_changes() {
        let mut run = clean_run();
        run.fences_must_rise = true;
        let kinds = |run: &Evidence| -> Vec<&'static str> {
            check(run).problems.iter().map(|p| p.kind()).collect()
        };
        // No fence at all: no tokens to grade, said plainly; the data alone decides.
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Pass, "{report:?}");
        assert!(
            report.notes[0].starts_with("no tokens to grade"),
            "{report:?}"
        );
        // Some fenced, some not: those without fail.
        run.changes[1].fence = Some(3);
        assert_eq!(kinds(&run), vec!["unfenced"; 2]);
        let line = check(&run).problems[0].describe();
        assert!(
            line.starts_with("unfenced change #1 of r0 (job 1)"),
            "{line}"
        );
        run.changes[1].fence = None;
        // Tokens 4, 7 on r0 and 5 on r1: each record's rise, though r1's 5 < r0's 7.
        run.changes = vec![
            fenced(1, "r0", 1, 0, 3, 4),
            fenced(2, "r0", 2, 3, 8, 7),
            fenced(3, "r1", 3, 0, 2, 5),
        ];
        fill_items(&mut run);
        assert_eq!(check(&run).grade(), Grade::Pass);
        // After the promotion the counter starts again below: 7, then 6, then 7.
        run.jobs.extend([job(4, "r0", 1), job(5, "r0", 1)]);
        run.acknowledged.extend([4, 5]);
        run.changes
            .extend([fenced(4, "r0", 4, 8, 9, 6), fenced(5, "r0", 5, 9, 10, 7)]);
        run.finals[0].value = 10;
        fill_items(&mut run);
        let report = check(&run);
        assert_eq!(kinds(&run), vec!["token-went-back", "token-reused"]);
        let back = report.problems[0].describe();
        assert!(
            back.contains(
                "change #4 of r0 (job 4) has fence 6, a smaller token than \
                           change #2 before it (job 2, fence 7)"
            ),
            "{back}"
        );
        let reused = report.problems[1].describe();
        assert!(reused.starts_with("token reused: change #5"), "{reused}");
        assert!(reused.contains("the same token as change #2"), "{reused}");
        assert!(report.problems[0].names_change(Some(2), Some(2)));
        // The JSON names the same kind as the terminal, with both changes.
        let json = serde_json::to_value(&report.problems[1]).unwrap();
        assert_eq!(json["kind"], "token-reused");
        assert_eq!(
            (json["seq"].as_i64(), json["earlier_seq"].as_i64()),
            (Some(5), Some(2))
        );
        // The notes show token 6 was taken before token 7, and committed after it: the
        // source never went back — the writes committed out of the tokens' order.
        let took = |job, token, at_us| Delivery {
            job,
            client: "c1".into(),
            token: Some(token),
            token_us: Some(at_us),
            ..Delivery::default()
        };
        run.deliveries = vec![took(2, 7, 2_000), took(4, 6, 1_000)];
        let out_of_order = check(&run).problems[0].clone();
        assert_eq!(out_of_order.kind(), "token-out-of-order");
        let line = out_of_order.describe();
        assert!(
            line.contains("the token source did not go back")
                && line.contains("fences must rise in commit order"),
            "{line}"
        );
        // Taken after it: the source went back.
        run.deliveries = vec![took(2, 7, 1_000), took(4, 6, 2_000)];
        assert_eq!(check(&run).problems[0].kind(), "token-went-back");
        run.deliveries.clear();
        // Other challenges do not grade the fences.
        run.fences_must_rise = false;
        assert_eq!(check(&run).grade(), Grade::Pass);
    }

    #[test]
    fn a_clean_log_passes() {
        let clean = evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r1", Some(3), 0, 2),
                change(3, "r0", Some(2), 3, 8),
            ],
            &[1, 2, 3],
            &[("r0", 8), ("r1", 2)],
        );
        let report = check(&clean);
        assert_eq!(report.grade(), Grade::Pass, "{report:?}");
        assert_eq!(report.good_changes, 3);
    }

    #[test]
    fn a_write_computed_from_a_stale_read_is_a_stale_write_with_what_it_erased() {
        // Job 1 read 0 and was paused; job 2 wrote 5; job 1's 3 landed over it.
        let stale = evidence(
            vec![
                change(1, "r0", Some(2), 0, 5),
                change(2, "r0", Some(1), 5, 3),
                change(3, "r1", Some(3), 0, 2),
            ],
            &[1, 2, 3],
            &[("r0", 3), ("r1", 2)],
        );
        let report = check(&stale);
        assert_eq!(report.grade(), Grade::Fail);
        assert_eq!(report.problems.len(), 1, "{report:?}");
        let line = report.problems[0].describe();
        assert!(
            line.contains("read of 0") && line.contains("not from the 5"),
            "{line}"
        );
    }

    #[test]
    fn a_job_applied_twice_is_doubled_and_an_acknowledged_job_without_a_change_is_lost() {
        let doubled = evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r0", Some(1), 3, 6),
                change(3, "r0", Some(2), 6, 11),
            ],
            &[1, 2, 3],
            &[("r0", 11), ("r1", 0)],
        );
        let kinds: Vec<&str> = check(&doubled).problems.iter().map(|p| p.kind()).collect();
        assert_eq!(kinds, vec!["doubled", "lost"], "job 3 acked, never written");
    }

    #[test]
    fn a_job_nobody_did_is_never_done_and_an_untagged_change_fails() {
        let untagged = evidence(
            vec![change(1, "r0", None, 0, 3), change(2, "r0", Some(99), 3, 8)],
            &[],
            &[("r0", 8), ("r1", 0)],
        );
        let kinds: Vec<&str> = check(&untagged).problems.iter().map(|p| p.kind()).collect();
        assert_eq!(
            kinds,
            vec![
                "untagged",
                "untagged",
                "never-done",
                "never-done",
                "never-done"
            ]
        );
    }

    #[test]
    fn a_record_changed_outside_the_log_and_faults_that_never_played_are_named() {
        let mut outside = evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r0", Some(2), 3, 8),
                change(3, "r1", Some(3), 0, 2),
            ],
            &[1, 2, 3],
            &[("r0", 9), ("r1", 2)],
        );
        assert_eq!(check(&outside).problems[0].kind(), "log-disagrees");
        outside.finals[0].value = 8;
        outside.faults_played = 0;
        let report = check(&outside);
        assert_eq!(
            report.grade(),
            Grade::Undecided,
            "a clean log under no fault"
        );
    }

    /// The held write's refusal, logged by the database a fraction of a millisecond after
    /// lockslab read the client's answer on its reckoning of the database's clock (a busy
    /// machine, in CI): the answer came after the statement, so the refusal counts within
    /// the reckoning's margin and a millisecond — and not past it.
    #[test]
    fn a_refusal_logged_just_after_the_answer_on_lockslabs_reckoning_still_counts() {
        let mut run = clean_run();
        run.lease_ms = 500;
        run.clock_margin_us = 400;
        run.deliveries = vec![Delivery {
            job: 2,
            client: "c1".into(),
            sent_us: 100_000,
            answered_us: Some(1_000_000),
            ok: Some(false),
            ..Delivery::default()
        }];
        run.strikes = vec![Strike {
            fault: "pause".into(),
            client: "c1".into(),
            job: Some(2),
            at_us: 500_000,
            notes: true,
            tried: Some(Tried::Changes),
            held_session: Some(7),
            ..Strike::default()
        }];
        let refused_at = |at_us| {
            vec![Statement {
                pid: 7,
                at_us,
                rows: 0,
                ..Statement::default()
            }]
        };
        run.statements = refused_at(1_000_231);
        assert_eq!(check(&run).faults_bit, 1, "{:?}", check(&run));
        run.statements = refused_at(1_000_000 + 400 + 1000 + 1);
        assert_eq!(check(&run).faults_bit, 0, "{:?}", check(&run));
    }

    /// The hostile tester's refusals from elsewhere: an UPDATE that matched nothing sent on
    /// another connection while the held write, let go, changed the records, counted as the
    /// held write's refusal; and writes made around the proxies (straight to the server's
    /// port) were graded as if a fault could have reached them.
    #[test]
    fn a_refusal_is_read_in_the_held_writes_session_and_writes_around_the_proxies_are_unknown() {
        let mut run = clean_run();
        run.lease_ms = 500;
        run.changes[0].pid = Some(5);
        run.deliveries = vec![Delivery {
            job: 1,
            client: "c2".into(),
            sent_us: 200_000,
            answered_us: Some(1_100_000),
            ok: Some(true),
            ..Delivery::default()
        }];
        let held = Strike {
            fault: "delay".into(),
            client: "c1".into(),
            job: Some(2),
            at_us: 500_000,
            notes: true,
            tried: Some(Tried::Changes),
            held_session: Some(7),
            ..Strike::default()
        };
        run.strikes = vec![held];
        let statement = |pid, at_us, rows| Statement {
            pid,
            at_us,
            rows,
            changed: None,
            aborted: None,
        };
        // The held write (session 7) changed a row; 0 rows came from session 6.
        run.statements = vec![statement(6, 900_000, 0), statement(7, 950_000, 1)];
        assert_eq!(check(&run).faults_bit, 0, "{:?}", check(&run));
        // The held write's own session matched nothing: refused.
        run.statements = vec![statement(7, 900_000, 0)];
        assert_eq!(
            (check(&run).grade(), check(&run).faults_bit),
            (Grade::Pass, 1)
        );
        // Refused, then the retry claims the row (a new fence: a row updated, no value,
        // items or job changed) before its own write is held in turn: still refused.
        let counted = |pid, at_us, rows, changed| Statement {
            changed: Some(changed),
            ..statement(pid, at_us, rows)
        };
        run.statements = vec![counted(7, 900_000, 0, 0), counted(7, 950_000, 1, 0)];
        assert_eq!(check(&run).faults_bit, 1, "{:?}", check(&run));
        // But a held write that ran and changed the value is no refusal, whatever follows.
        run.statements = vec![counted(7, 900_000, 1, 1), counted(7, 950_000, 0, 0)];
        assert_eq!(check(&run).faults_bit, 0, "{:?}", check(&run));
        run.statements = vec![statement(7, 900_000, 0)];
        // Job 2's change was made in session 8, which neither proxy opened.
        run.changes[1].pid = Some(8);
        let proxies = [("c1", 7), ("c2", 5)].map(|(c, pid)| (c.to_string(), BTreeSet::from([pid])));
        run.proxy_sessions = Some(proxies.into_iter().collect());
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Undecided, "{report:?}");
        assert!(
            report.undecided.join("\n").contains(
                "change #2 (job 2) was made in Postgres session 8, which no client's fault \
                 proxy opened"
            ),
            "{report:?}"
        );
    }

    /// A fault follows job 2 to its retry. The retry's first held write came with no new
    /// `writing` note — a claim of the row, made before the retry's read — so it tested
    /// nothing (the write that landed carries j1, committed after it began). The next
    /// follow-up held the write after the retry's note, and bit: the retry was tested by
    /// that one, and the first is excused. Without that later bite, it stays a miss.
    #[test]
    fn a_follow_up_held_before_the_retrys_read_is_excused_once_the_write_after_its_note_bit() {
        let mut run = clean_run();
        run.lease_ms = 500;
        let strike = |at_us: i64, follows: bool, after_note: bool, overtaken: bool| Strike {
            fault: "pause".into(),
            client: "c1".into(),
            job: Some(2),
            at_us,
            notes: true,
            tried: Some(Tried::Changes),
            follows,
            after_note,
            overtaken,
            ..Strike::default()
        };
        run.faults_planned = 1;
        run.faults_played = 3;
        run.strikes = vec![
            strike(1_500_000, false, false, true),
            strike(500_000, true, false, false),
            strike(1_600_000, true, true, true),
        ];
        let report = check(&run);
        assert_eq!(
            (report.grade(), report.faults_bit),
            (Grade::Pass, 3),
            "{report:?}"
        );
        run.strikes[2].after_note = false;
        let report = check(&run);
        assert_eq!(report.faults_bit, 2, "{report:?}");
        assert!(
            report
                .undecided
                .join("")
                .contains("its `writing` note came before its read"),
            "{report:?}"
        );
    }

    /// A fault at the commit: its job's write ran before it (the rule at the write would
    /// call it late), and it bit only if another client came for the record while the
    /// commit was held, or was held off by the lock.
    #[test]
    fn a_fault_at_the_commit_bites_only_if_another_client_came_for_the_record_meanwhile() {
        let mut run = clean_run();
        run.lease_ms = 500;
        let strike = Strike {
            fault: "delay".into(),
            client: "c1".into(),
            job: Some(2),
            at_us: 2_500_000,
            notes: true,
            released: true,
            at_commit: true,
            commit_held: true,
            ..Strike::default()
        };
        run.strikes = vec![strike.clone()];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
        let said = report.undecided.join("\n");
        assert!(
            said.contains("nobody came for r0 while c1's commit was held"),
            "{said}"
        );
        let came = Strike {
            came_for: Some("c2 (job 3 on r0) said `acquired` while c1's commit was held".into()),
            ..strike.clone()
        };
        run.strikes = vec![came];
        let report = check(&run);
        assert_eq!(
            (report.grade(), report.faults_bit),
            (Grade::Pass, 1),
            "{report:?}"
        );
        // The server aborted the held commit for a conflict it found: the job's change ran
        // before it and was rolled back (the log keeps no trace). Alone, it tested nothing
        // (a decoy made to fail at its COMMIT would take the fault so); the fault follows the
        // job to its next commit, and if that one was held and bit, the first is excused.
        let refused = Strike {
            at_us: 1_500_000,
            held_session: Some(7),
            came_for: Some("c2 (job 3 on r0) said `acquired` while c1's commit was held".into()),
            ..strike.clone()
        };
        run.strikes = vec![refused.clone()];
        let abort = Statement {
            pid: 7,
            at_us: 1_600_000,
            rows: 0,
            changed: None,
            aborted: Some("40001: could not serialize access".into()),
        };
        run.statements = vec![abort];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
        assert!(
            (report.undecided.join("")).contains("Postgres aborted that commit"),
            "{report:?}"
        );
        let next = Strike {
            at_us: 2_500_000,
            came_for: Some("c2 (job 3 on r0) said `writing` while c1's commit was held".into()),
            ..strike.clone()
        };
        run.strikes = vec![refused, next];
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Pass, "{report:?}");
        assert!(report.undecided.is_empty(), "{report:?}");
        run.statements.clear();
        // The commit held came before the job's write ran (at 2s): it committed a decoy —
        // a write that matched nothing, sent ahead to take the fault — not the job's change.
        let decoy = Strike {
            at_us: 1_500_000,
            came_for: Some("c2 (job 3 on r0) said `acquired` while c1's commit was held".into()),
            ..strike.clone()
        };
        run.strikes = vec![decoy];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
        assert!(
            (report.undecided.join("")).contains("its change (#2) ran after the commit was caught"),
            "{report:?}"
        );
        // No commit came to hold: missed, whoever came.
        let none = Strike {
            commit_held: false,
            came_for: Some("c2 (job 3 on r0) said `writing` while c1's commit was held".into()),
            ..strike
        };
        run.strikes = vec![none];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
        assert!(report.undecided.join("").contains("no commit came"));
    }

    #[test]
    fn a_pause_or_delay_bites_only_if_another_write_to_its_record_came_before_the_held_one() {
        let mut run = clean_run();
        run.lease_ms = 500;
        // Its held write, tried when it was caught, updated a row.
        let strike = |job: Option<i64>, at_us: i64| Strike {
            fault: "pause".into(),
            client: "c1".into(),
            job,
            at_us,
            notes: true,
            tried: Some(Tried::Changes),
            ..Strike::default()
        };
        // Job 2's write is change #2 at 2s; job 1 wrote r0 at 1s, between the fault and it,
        // and job 2's write holds j1: its client read r0 after the fault began (its
        // `writing` note came before its read), so nothing it had read could go stale.
        run.strikes = vec![strike(Some(2), 500_000)];
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Undecided, "{report:?}");
        assert_eq!(report.faults_bit, 0);
        let said = report.undecided.join("\n");
        assert!(
            said.contains("paused c1 holding job 2, but its write carries j1, which change #1 committed 500ms after the fault began"),
            "{said}"
        );
        // Read after the fault, or computed in SQL without a read: either may be true, and
        // the message says both.
        assert!(
            said.contains("or it computed the write in SQL from the row as it stood"),
            "{said}"
        );
        // The client answered `fail` for it: a claim, and no statement of its matched
        // nothing after the fault — a refusal the database never saw does not bite.
        let mut refused = strike(Some(2), 500_000);
        refused.refused = true;
        run.strikes = vec![refused];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
        assert!(
            report
                .undecided
                .join("")
                .contains("a refusal the database did not see"),
            "{report:?}"
        );
        // An UPDATE that matched nothing at 0.9s, from a session another client's change
        // was made in: not c1's.
        run.changes[0].pid = Some(5);
        run.deliveries = vec![Delivery {
            job: 1,
            client: "c2".into(),
            sent_us: 200_000,
            answered_us: Some(1_100_000),
            ok: Some(true),
            ..Delivery::default()
        }];
        let refusal = |pid, at_us| Statement {
            pid,
            at_us,
            rows: 0,
            ..Statement::default()
        };
        run.statements = vec![refusal(5, 900_000)];
        assert_eq!(check(&run).faults_bit, 0);
        // From c1's own session (or one no client's change names): its held write ran and
        // changed nothing — refused by the database, and the write that followed at 2s read
        // afresh (a compare-and-set's retry), not a note sent before the read. It bit,
        // whether or not the client answered `fail`.
        run.statements = vec![refusal(6, 900_000)];
        assert_eq!(
            (check(&run).grade(), check(&run).faults_bit),
            (Grade::Pass, 1)
        );
        // The same 0 rows from a held write that was not tried (or matched nothing when it
        // was caught, `… AND false`): no refusal, nothing bit.
        let untried = Some(Tried::Untried(
            "the batch holds more than one request".into(),
        ));
        for tried in [untried, None] {
            let mut unweighed = run.clone();
            unweighed.strikes[0].tried = tried;
            let report = check(&unweighed);
            assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
            assert!(
                format!("{report:?}").contains("0 rows prove nothing"),
                "{report:?}"
            );
            // But the server itself aborted that held write's transaction for a conflict it
            // found (40001, in its answer to the write): refused, though it was never tried.
            unweighed.strikes[0].held_session = Some(6);
            unweighed.statements = vec![Statement {
                aborted: Some("40001: could not serialize access".into()),
                ..refusal(6, 900_000)
            }];
            let report = check(&unweighed);
            assert_eq!((report.grade(), report.faults_bit), (Grade::Pass, 1));
            unweighed.statements = vec![refusal(6, 900_000)];
            assert_eq!(
                check(&unweighed).faults_bit,
                0,
                "a plain 0 rows still proves nothing"
            );
        }
        {
            // Tried as it was caught, it matched nothing (`… AND false`): an abort of its
            // transaction after the fault (SERIALIZABLE, for what it read) refuses nothing.
            let mut decoy = run.clone();
            decoy.strikes[0].tried = Some(Tried::ChangesNothing);
            decoy.strikes[0].held_session = Some(6);
            decoy.statements = vec![Statement {
                aborted: Some("40001: could not serialize access".into()),
                ..refusal(6, 900_000)
            }];
            assert_eq!(check(&decoy).faults_bit, 0);
        }
        run.strikes = vec![strike(Some(2), 500_000)];
        assert_eq!(
            (check(&run).grade(), check(&run).faults_bit),
            (Grade::Pass, 1)
        );
        // A statement before the fault is no refusal of the held write.
        run.statements = vec![refusal(6, 400_000)];
        assert_eq!(check(&run).faults_bit, 0);
        run.statements = vec![];
        // Held as long, but nobody wrote r0 from 1.5s until job 2's write: even an unfenced
        // late write was right, so it missed, and a run whose faults all missed is undecided.
        run.strikes = vec![strike(Some(2), 1_500_000)];
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Undecided, "{report:?}");
        assert_eq!(report.faults_bit, 0);
        let said = report.undecided.join("\n");
        assert!(
            said.contains("nobody wrote r0 meanwhile") && said.contains("change #2"),
            "{said}"
        );
        // Job 1 wrote r1 meanwhile instead: another record, so still missed.
        run.changes[0].record = "r1".into();
        assert_eq!(check(&run).faults_bit, 0);
        run.changes[0].record = "r0".into();
        // The held write refused (the database matched nothing): fenced out, it bit.
        let mut refused = strike(Some(2), 1_500_000);
        refused.refused = true;
        run.strikes = vec![refused];
        run.statements = vec![refusal(6, 1_700_000)];
        assert_eq!(check(&run).grade(), Grade::Pass);
        run.statements = vec![];
        // Let go between a newer holder's read and its write (the worst order): it bit,
        // though nobody wrote r0 before it landed.
        let mut overtaken = strike(Some(2), 1_500_000);
        overtaken.overtaken = true;
        run.strikes = vec![overtaken];
        assert_eq!(check(&run).faults_bit, 1);
        // Job 1's write let go first, job 2's held at its write; but job 2's write holds j1:
        // that client read r0 again after job 1's write, and the order tested nothing.
        let mut early = strike(Some(1), 500_000);
        (early.overtaken, early.overtaken_by) = (true, Some(2));
        run.strikes = vec![early];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
        assert!(
            report
                .undecided
                .join("")
                .contains("it read r0 again before writing, or it computed its write in SQL"),
            "{report:?}"
        );
        // Unless an UPDATE of the newer holder's matched nothing between the two writes: it
        // had read before j1 landed, its compare was refused, and it read again — it bit.
        // (c1 answered job 1 at 1.1s: a statement after that is not its own refusal.)
        run.deliveries[0].client = "c1".into();
        run.statements = vec![refusal(8, 1_500_000)];
        assert_eq!(check(&run).faults_bit, 1);
        // But its held write, tried before job 1's landed, would have changed nothing
        // then either: that UPDATE was no refused compare, and the order tested nothing.
        run.strikes[0].newer_tried = Some(Tried::ChangesNothing);
        assert_eq!(check(&run).faults_bit, 0);
        run.strikes[0].newer_tried = Some(Tried::Changes);
        assert_eq!(check(&run).faults_bit, 1);
        // Refused in another session than its held write went to: not that write's refusal.
        run.strikes[0].newer_session = Some(99);
        assert_eq!(check(&run).faults_bit, 0);
        run.strikes[0].newer_session = None;
        run.strikes[0].newer_tried = None;
        run.statements = vec![refusal(8, 2_500_000)];
        assert_eq!(
            check(&run).faults_bit,
            0,
            "after its own write: not its refusal"
        );
        run.statements = vec![];
        // Frozen after its write: its `writing` note came late. Never a pass.
        run.strikes = vec![strike(Some(2), 2_500_000)];
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Undecided, "{report:?}");
        let said = report.undecided.join("\n");
        assert!(
            said.contains("500ms after job 2's write") && said.contains("change #2"),
            "{said}"
        );
        assert!(said.contains("`writing` note for job 2 came after its write"));
        // Its note came before its write, and lockslab played the fault too late: its own
        // delay, said so; still no pass.
        let mut late = strike(Some(2), 2_500_000);
        late.note_us = Some(1_900_000);
        run.strikes = vec![late];
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Undecided);
        let said = report.undecided.join("\n");
        assert!(
            said.contains("lockslab was late, 600ms after c1's last note"),
            "{said}"
        );
        // The same pause on a client that sends no notes: it may not have read r0 yet (a
        // client that waits before reading passed this way), so job 1's write meanwhile
        // proves nothing; a refusal still does.
        let mut silent = strike(Some(2), 500_000);
        silent.notes = false;
        run.strikes = vec![silent.clone()];
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Undecided, "{report:?}");
        assert!(
            report.undecided.join("").contains("c1 sends no notes"),
            "{report:?}"
        );
        silent.refused = true;
        run.strikes = vec![silent];
        assert_eq!(check(&run).grade(), Grade::Undecided);
        run.statements = vec![refusal(6, 900_000)];
        assert_eq!(check(&run).grade(), Grade::Pass);
        run.statements = vec![];
        // Before any job, between jobs, or after it let its lock go: nothing held.
        run.strikes = vec![strike(None, 1_000_000)];
        assert_eq!(check(&run).grade(), Grade::Undecided);
        let mut answered = strike(Some(3), 1_000_000);
        answered.answered = true;
        run.strikes = vec![answered];
        assert!(check(&run).undecided.join("").contains("between jobs"));
        let mut released = strike(Some(2), 500_000);
        released.released = true;
        run.strikes = vec![released];
        assert!(check(&run).undecided.join("").contains("said released"));
        // A stale write is a failure whatever the faults did.
        run.strikes = vec![strike(Some(2), 2_500_000)];
        run.changes[1].new_value = 9;
        run.finals[0].value = 9;
        assert_eq!(check(&run).grade(), Grade::Fail);
    }

    fn delivery(job: i64, client: &str, sent_s: f64, answered_s: f64, ok: bool) -> Delivery {
        Delivery {
            job,
            client: client.into(),
            sent_us: (sent_s * 1e6) as i64,
            answered_us: Some((answered_s * 1e6) as i64),
            ok: Some(ok),
            ..Delivery::default()
        }
    }

    /// A `fail` is a claim, held against the log: job 2's one change (#2, at 2s) committed
    /// while c1 held job 2, and c1 answered fail — the write it said did not happen did.
    /// It is a finding of its own, and no refusal: the pause on c1 did not bite through it.
    #[test]
    fn a_fail_answered_for_a_write_that_committed_is_a_finding_and_no_refusal() {
        let mut run = clean_run();
        run.deliveries = vec![
            delivery(1, "c2", 0.5, 1.2, true),
            delivery(2, "c1", 0.6, 2.4, false),
            delivery(2, "c3", 2.5, 2.6, true),
            delivery(3, "c2", 1.3, 3.1, true),
        ];
        run.strikes = vec![Strike {
            fault: "pause".into(),
            client: "c1".into(),
            job: Some(2),
            at_us: 1_500_000,
            notes: true,
            refused: true,
            tried: Some(Tried::Changes),
            ..Strike::default()
        }];
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Fail, "{report:?}");
        let kinds: Vec<&str> = report.problems.iter().map(|p| p.kind()).collect();
        assert_eq!(kinds, vec!["failed-but-written"]);
        let line = report.problems[0].describe();
        assert!(
            line.contains("c1 answered fail for job 2, and its write committed (change #2 of r0)"),
            "{line}"
        );
        assert!(report.problems[0].names_change(Some(2), Some(2)));
        assert_eq!(report.faults_bit, 0, "the lie is no refusal");
        // Its write landed after it answered (on its way still): still its own.
        run.deliveries[1].answered_us = Some(1_900_000);
        assert_eq!(check(&run).problems.len(), 1);
        // The change fell in c3's delivery instead, answered ok: c1's fail was true, and an
        // UPDATE of its matched nothing after the fault.
        run.deliveries[1].answered_us = Some(1_700_000);
        run.deliveries[2].sent_us = 1_800_000;
        run.statements = vec![Statement {
            pid: 9,
            at_us: 1_600_000,
            rows: 0,
            ..Statement::default()
        }];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Pass, 1));
        // Two deliveries of job 2 at once (exactly-once), one answered ok: either may have
        // written it, so no client is blamed.
        run.deliveries[2] = delivery(2, "c3", 0.7, 2.2, true);
        run.deliveries[1].answered_us = Some(2_400_000);
        assert!(check(&run).problems.is_empty());
    }

    /// A fault that follows a job to its retry may hold a write made before the retry's
    /// read (a claim of the row, or a touch of it): the retry then reads after the held
    /// write, and the order played on that write tested nothing — a blind write after the
    /// read would go untested (`blind-retry` passed a pause seed when this was taken for a
    /// bite). It stays a miss, the run unknown, even after the fault it follows bit.
    #[test]
    fn a_retry_that_read_after_its_held_write_tested_nothing_even_after_a_bite() {
        let jobs = [job(1, "r0", 3), job(2, "r0", 5)];
        let jobs: BTreeMap<i64, &JobSpec> = jobs.iter().map(|j| (j.id, j)).collect();
        let mut run = evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r0", Some(2), 3, 8),
            ],
            &[1, 2],
            &[("r0", 8)],
        );
        fill_items(&mut run);
        let retry = Strike {
            fault: "pause".into(),
            client: "c2".into(),
            job: Some(2),
            at_us: 500_000,
            notes: true,
            follows: true,
            followed_bit: true,
            ..Strike::default()
        };
        let why = retry.missed(&jobs, &run.changes).unwrap_or_default();
        assert!(
            why.contains("its `writing` note came before its read"),
            "{why}"
        );
    }

    /// An `ok` is a claim as well: job 2's one change (#2, at 2s) committed half a second
    /// after c1 answered ok for it, with no delivery of job 2 open then. A write made after
    /// the answer meets no fault (none follows a job past it), so it must not land after it.
    #[test]
    fn an_ok_answered_before_its_write_committed_is_a_finding() {
        let mut run = clean_run();
        run.deliveries = vec![
            delivery(1, "c2", 0.5, 1.2, true),
            delivery(2, "c1", 0.6, 1.5, true),
            delivery(3, "c2", 1.3, 3.1, true),
        ];
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Fail, "{report:?}");
        let kinds: Vec<&str> = report.problems.iter().map(|p| p.kind()).collect();
        assert_eq!(kinds, vec!["written-after-ok"]);
        let line = report.problems[0].describe();
        assert!(
            line.contains(
                "c1 answered ok for job 2, and its write ran 500ms later (change #2 of r0)"
            ),
            "{line}"
        );
        assert!(report.problems[0].names_change(Some(2), Some(2)));
        // Within the clock reckoning's margin and a millisecond of the answer: its own write,
        // read a little late on lockslab's clock.
        run.clock_margin_us = 400_000;
        assert_eq!(check(&run).problems.len(), 1);
        run.clock_margin_us = 499_000;
        assert!(check(&run).problems.is_empty());
        run.clock_margin_us = 0;
        // Sent again meanwhile, to c3, who held it when the change came: c3's write.
        run.deliveries.push(delivery(2, "c3", 1.8, 2.2, true));
        assert!(check(&run).problems.is_empty());
    }

    /// Three jobs on r0, each written once as meant (at 1s, 2s, 3s, by sessions 12, 11, 12):
    /// c1 holds job 2 from 1.2s to 2.2s and is paused at 1.5s; c2 holds job 3 from 1.3s and
    /// writes it at 3s. Nobody wrote r0 while c1 was frozen.
    fn paused_while_c2_wanted_r0() -> Evidence {
        let mut run = clean_run();
        (run.changes[0].pid, run.changes[1].pid) = (Some(12), Some(11));
        run.changes[2].pid = Some(12);
        run.deliveries = vec![
            delivery(1, "c2", 0.5, 1.1, true),
            delivery(2, "c1", 1.2, 2.2, true),
            delivery(3, "c2", 1.3, 3.1, true),
        ];
        run.jobs[2].record = "r0".into();
        run.changes[2].record = "r0".into();
        run.changes[2].old_value = 8;
        run.changes[2].new_value = 10;
        run.finals[0].value = 10;
        run.finals[1].value = 0;
        fill_items(&mut run);
        run.strikes = vec![Strike {
            fault: "pause".into(),
            client: "c1".into(),
            job: Some(2),
            at_us: 1_500_000,
            notes: true,
            ..Strike::default()
        }];
        run
    }

    /// `SELECT … FOR UPDATE` across the work: nobody can write r0 while c1 is frozen, so
    /// nobody did — but c2, with a job on r0, waited behind c1's session (pg_blocking_pids):
    /// the row lock held it off, and the pause bit.
    #[test]
    fn a_pause_bites_when_another_clients_job_on_the_record_waited_behind_the_frozen_lock() {
        let mut run = paused_while_c2_wanted_r0();
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Undecided, "{report:?}");
        assert!(
            report
                .undecided
                .join("")
                .contains("nobody wrote r0 meanwhile")
        );
        let wait = |waiter, blocker, at_us| Wait {
            waiter,
            blockers: vec![blocker],
            at_us,
        };
        run.waits = vec![wait(12, 11, 1_800_000)];
        let report = check(&run);
        assert_eq!(
            (report.grade(), report.faults_bit),
            (Grade::Pass, 1),
            "{report:?}"
        );
        assert!(
            report
                .notes
                .join("")
                .contains("c2, with a job on the same record, waited behind c1's lock")
        );
        // Behind another session, or after c1 answered, or c2 holding no job on r0 then: no.
        run.waits = vec![wait(12, 13, 1_800_000)];
        assert_eq!(check(&run).faults_bit, 0);
        run.waits = vec![wait(12, 11, 2_300_000)];
        assert_eq!(check(&run).faults_bit, 0);
        run.waits = vec![wait(12, 11, 1_200_000)];
        assert_eq!(check(&run).faults_bit, 0, "before the fault");
    }

    /// A job followed to the bound: its writes past it are untested (unknown) unless one of
    /// its followed retries made after a fresh read was held and refused by the database.
    #[test]
    fn the_follow_bound_is_lifted_only_for_a_job_whose_retry_after_a_read_was_refused() {
        let strike = |follows, after_note, matched_nothing| Strike {
            fault: "pause".into(),
            client: "c1".into(),
            job: Some(2),
            follows,
            after_note,
            matched_nothing,
            bounded: Some("followed as far as it follows".into()),
            followed_to_bound: true,
            ..Strike::default()
        };
        // Refused, but no retry after a read among them (the first write, and a claim).
        let mut chain = vec![strike(false, true, true), strike(true, false, true)];
        assert!(lift_follow_bounds(&mut chain).is_empty());
        assert!(chain.iter().all(|s| s.bounded.is_some()));
        // A retry after a read, held, that went through: no.
        chain.push(strike(true, true, false));
        assert!(lift_follow_bounds(&mut chain).is_empty());
        // One that was refused: lifted, for this job's bounded strikes only.
        chain.push(strike(true, true, true));
        let mut other = strike(true, true, false);
        other.job = Some(3);
        chain.push(other);
        let said = lift_follow_bounds(&mut chain);
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(said[0].contains("c1's job 2") && said[0].contains("(4 held)"));
        assert!(chain[..4].iter().all(|s| s.bounded.is_none()));
        assert!(chain[4].bounded.is_some());
    }

    /// A lock taken without waiting in Postgres (`pg_try_advisory_lock` polled, `FOR
    /// UPDATE NOWAIT`): nobody ever shows in pg_blocking_pids. c1's session (11) was seen
    /// holding the lock while c2's (12), with a job on r0, kept asking: held off, the pause
    /// bit. Not if c2 was not asking, if the row lock is another record's, if the lock was
    /// seen before the fault, or if another client changed r0 while it lasted.
    #[test]
    fn a_lock_taken_without_waiting_held_them_off_if_the_others_kept_asking_and_wrote_nothing() {
        let mut run = paused_while_c2_wanted_r0();
        let seen = |kind, record: Option<&str>, at_us, asking: Vec<i32>| PgLockSeen {
            session: 11,
            kind,
            record: record.map(Into::into),
            at_us,
            asking,
        };
        for lock in [
            seen(PgLockKind::Advisory, None, 1_700_000, vec![12]),
            seen(PgLockKind::Row, Some("r0"), 1_700_000, vec![12, 13]),
        ] {
            run.pg_locks = vec![lock];
            let report = check(&run);
            assert_eq!(
                (report.grade(), report.faults_bit),
                (Grade::Pass, 1),
                "{report:?}"
            );
            assert!(report.notes.join("").contains("while c2 kept asking"));
        }
        for lock in [
            seen(PgLockKind::Advisory, None, 1_700_000, vec![13]),
            seen(PgLockKind::Row, Some("r1"), 1_700_000, vec![12]),
            seen(PgLockKind::Row, None, 1_700_000, vec![12]),
            seen(PgLockKind::Advisory, None, 1_400_000, vec![12]),
        ] {
            run.pg_locks = vec![lock.clone()];
            assert_eq!(check(&run).faults_bit, 0, "{lock:?}");
        }
        // c2 wrote r0 while c1 was frozen (its job 3 at 1.8s): the lock held nobody off
        // (what the write did decides the pause, not the lock seen held).
        run.pg_locks = vec![seen(PgLockKind::Advisory, None, 1_700_000, vec![12])];
        run.changes[2].at_us = Some(1_800_000);
        let report = check(&run);
        assert!(!report.notes.join("").contains("kept asking"), "{report:?}");
    }

    /// A Redis (or etcd) lock: c2, with job 3 on r0 not yet written, was seen while c1's
    /// key still held c1's value. That held c2 off only if the key still held it when the
    /// fault ended: a lease that ran out during the fault was waited out, and what came
    /// after decides (here nobody wrote r0 meanwhile, so the pause missed).
    #[test]
    fn a_redis_lock_held_them_off_only_if_it_still_stood_when_the_fault_ended() {
        let mut run = paused_while_c2_wanted_r0();
        let seen = |holder: &str, job, at_us| KeyWait {
            holder: holder.into(),
            key: "lockslab:x:lock:r0".into(),
            server: "Redis".into(),
            waiter: "c2".into(),
            job,
            at_us,
        };
        run.key_waits = vec![seen("c1", 3, 1_600_000)];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
        run.strikes[0].lock_kept = true;
        let report = check(&run);
        assert_eq!(
            (report.grade(), report.faults_bit),
            (Grade::Pass, 1),
            "{report:?}"
        );
        let said = report.notes.join("");
        assert!(
            said.contains("c2, with a job on the same record, waited behind c1's lock (c1's key lockslab:x:lock:r0 (Redis) still held its value, 100ms into the fault) — the lock held it off"),
            "{said}"
        );
        // Another holder's key; seen after c1 answered; or c2 holding another job then.
        for wait in [
            seen("c3", 3, 1_600_000),
            seen("c1", 3, 2_300_000),
            seen("c1", 1, 1_600_000),
        ] {
            run.key_waits = vec![wait];
            assert_eq!(check(&run).faults_bit, 0, "{:?}", run.key_waits);
        }
        // Job 3 already in the log when c2 was seen: it was not waiting to write.
        run.key_waits = vec![seen("c1", 3, 1_600_000)];
        run.changes[2].at_us = Some(1_450_000);
        assert_eq!(check(&run).faults_bit, 0);
    }

    /// A lease longer than the fault's bound: the pause ended with the key still standing.
    /// That is what the fault could not test — unknown, with the bound named — whatever held
    /// anyone off meanwhile; a stale write still fails.
    #[test]
    fn a_fault_that_ended_at_its_bound_is_unknown_never_a_pass() {
        let mut run = paused_while_c2_wanted_r0();
        run.strikes[0].lock_kept = true;
        run.strikes[0].bounded = Some("c1's key lockslab:x:lock:r0 still held its value".into());
        run.key_waits = vec![KeyWait {
            holder: "c1".into(),
            waiter: "c2".into(),
            job: 3,
            at_us: 1_600_000,
            ..KeyWait::default()
        }];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
        let said = report.undecided.join("\n");
        assert!(
            said.contains("paused c1 holding job 2, and the fault ended at its bound: c1's key"),
            "{said}"
        );
        assert!(report.notes.is_empty(), "{report:?}");
        run.changes[1].new_value = 9;
        assert_eq!(check(&run).grade(), Grade::Fail);
    }

    #[test]
    fn a_kill_bites_only_if_its_client_held_a_job_it_had_not_answered() {
        let mut run = clean_run();
        let kill = |job: Option<i64>, answered: bool| Strike {
            fault: "kill".into(),
            client: "c2".into(),
            job,
            answered,
            ..Strike::default()
        };
        run.strikes = vec![kill(Some(2), false)];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Pass, 1));
        // Killed after its `ok`, waiting for its next job: nothing was cut short.
        run.strikes = vec![kill(Some(2), true)];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 0));
        let said = report.undecided.join("\n");
        assert!(said.contains("killed c2 between jobs"), "{said}");
        assert!(said.contains("missed what they aim at"), "{said}");
        run.strikes = vec![kill(None, false)];
        assert!(
            check(&run)
                .undecided
                .join("")
                .contains("before its first job")
        );
        // Under crash's stuck-lock bound, a kill that bit on a client with no notes leaves
        // the bound unchecked (its lock is seen only from its notes): never a pass.
        run.stuck_bound_ms = Some(2000);
        run.strikes = vec![kill(Some(2), false)];
        let report = check(&run);
        assert_eq!((report.grade(), report.faults_bit), (Grade::Undecided, 1));
        assert!(
            report.undecided.join("").contains("c2 sends none"),
            "{report:?}"
        );
        run.strikes[0].notes = true;
        assert_eq!(check(&run).grade(), Grade::Pass);
        // A client that holds no lock leaves none stuck: the bound is not its question.
        (run.strikes[0].notes, run.strikes[0].lockless) = (false, true);
        assert_eq!(check(&run).grade(), Grade::Pass);
    }

    /// A kill at `released` stands for the one between a job's commit and its answer. A
    /// client that says `released` before it writes (the hostile tester's `crashlie`) is
    /// killed before its write there instead, and the moment is never tested: missed.
    #[test]
    fn a_kill_at_a_released_note_that_came_before_the_write_missed() {
        let mut run = clean_run();
        // Job 2's change is #2, committed at 2s.
        let kill_at = |at_us: i64| Strike {
            fault: "kill".into(),
            client: "c2".into(),
            job: Some(2),
            notes: true,
            released: true,
            at_us,
            ..Strike::default()
        };
        run.strikes = vec![kill_at(2_500_000)];
        assert_eq!(check(&run).grade(), Grade::Pass, "killed after the commit");
        run.strikes = vec![kill_at(1_500_000)];
        let report = check(&run);
        assert_eq!(report.grade(), Grade::Undecided);
        let said = report.undecided.join("\n");
        assert!(
            said.contains("its `released` came before its write"),
            "{said}"
        );
        // Killed mid-job at another note: a kill before the write is what it aims at.
        run.strikes[0].released = false;
        assert_eq!(check(&run).grade(), Grade::Pass);
    }
}
