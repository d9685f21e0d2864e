//! One run of a challenge: the clients started and told where everything is, the jobs
//! handed out one at a time to whichever client is free, the schedule's faults played
//! from the live history, a killed client's job given to another — and every wait
//! bounded, so a client that hangs, crashes, floods or talks nonsense is named and ended.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::challenges::Challenge;
use super::client::{Client, ClientFailed, Heard, failed};
use super::protocol::{FromClient, Init, Job, ToClient};
use crate::check::challenge::{Delivery, JobSpec, LockMoment, Moment, Statement, Strike};
use crate::events::facts::{Acquired, ChallengeJob, Released};
use crate::events::{Event, What};
use crate::nemesis::play::Faults;
use crate::nemesis::schedule::{Action, Schedule};
use crate::nemesis::{Fault, Nemesis, Record};
use crate::proxy::{Direction, NetFault, Proxy, Seen};
use tape::Tape;

/// How many of the clients' lines one pass of the run reads before it looks at the clock.
const LINES_A_PASS: usize = 256;

mod aim;
mod blocking;
mod failover;
mod faults;
mod leases;
mod outlast;
mod overtake;
mod tape;

pub use super::challenges::WORK_MS;
/// How many times one job is given out before lockslab gives up on it.
const TRIES: u32 = 5;

/// The most jobs a run adds for held writes that have no newer holder ([`Run::spare`]).
const MOST_SPARES: usize = 8;

/// The most jobs a run adds for faults still to play when the seed's jobs ran out
/// ([`Run::spare_for_a_fault_to_come`]).
const MOST_SPARES_TO_COME: usize = 6;

/// How many of its client's notes a natural-order fault waits for a record to itself
/// ([`Run::natural_order_alone`]).
const NATURAL_WAITS: u32 = 8;

/// What a run needs to know.
pub struct Setup {
    pub challenge: Challenge,
    pub program: Vec<String>,
    pub clients: usize,
    pub seed: u64,
    /// `init` as every client gets it, but for its name.
    pub init: Init,
    pub jobs: Vec<JobSpec>,
    pub json: bool,
    /// How long a client may take to say `ready`, and to answer a job (time paused by the
    /// nemesis does not count).
    pub patience: Duration,
    pub run_id: String,
    /// lockslab's own way into Postgres, as the records' owner (not the clients' role).
    pub grader_url: String,
    /// lockslab's own logins to Redis and etcd, which read every key of the run's (the
    /// clients' locks among them).
    pub admin_redis: String,
    pub admin_etcd: String,
    /// The command that replays the run, one shell word each.
    pub replay: Vec<String>,
    /// The clients' own Postgres role, each client logging in as its own login of it
    /// (none: they share the grader's role).
    pub client_role: Option<super::table::ClientRole>,
    /// Who the clients run as, and what they can reach.
    pub isolation: super::isolation::Isolation,
}

/// What a run left: its history and what the clients answered; or the client's failure.
pub struct Played {
    pub acknowledged: BTreeSet<i64>,
    pub schedule: Schedule,
    pub faults_planned: usize,
    pub faults_played: usize,
    /// What a client did that ended the run (crashed, hung, garbage, flood).
    pub client_failure: Option<String>,
    /// The run's typed history, for `--html`.
    pub events: Vec<Event>,
    /// When the run's clock began (each event's `t_ms` counts from it).
    pub started: Instant,
    pub moments: Vec<LockMoment>,
    /// Each pause and delay as it began, to tell afterwards whether it bit.
    pub strikes: Vec<Strike>,
    /// Why each fault of the schedule that never played did not.
    pub unplayed: Vec<String>,
    /// Each job as it was handed out, and how it was answered.
    pub deliveries: Vec<Delivery>,
    /// The Postgres sessions each client's fault proxy opened (`pause`, `delay`); none
    /// when the clients had no proxies, or one could not read a session's number.
    pub proxy_sessions: Option<BTreeMap<String, BTreeSet<i32>>>,
    /// The jobs handed out: the seed's, then any spares the run added ([`Run::spare`]).
    pub jobs: Vec<JobSpec>,
    /// How far off lockslab's reckoning of the database's clock may be, µs.
    pub clock_margin_us: i64,
}

/// How far a client's notes for the job it holds have come: `acquired`, `writing` and
/// `released` come in that order (a `writing` may repeat, for a retry of the write; so may
/// an `acquired` before the first `writing`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Stage {
    #[default]
    Given,
    Acquired,
    Writing,
    Released,
}

struct Seat {
    client: Client,
    /// Its own way to Postgres, when the challenge plays network faults.
    proxy: Option<Proxy>,
    ready: bool,
    notes: bool,
    /// It takes a lock (`ready` did not say `"lock": false`).
    lock: bool,
    /// The job it has, and since when it has been waited for.
    job: Option<(i64, Instant)>,
    /// The last job it was given.
    last_job: Option<i64>,
    /// When its last protocol line was read.
    heard_at: Option<Instant>,
    /// Its notes so far for the job it holds.
    stage: Stage,
    /// Its writes to the records since its last `writing` note (or since it was given the
    /// job it holds, before any): which of them a fault aims at ([`aim::Aimed`]).
    writes_since_note: u32,
}

struct Run<'a> {
    setup: &'a Setup,
    tape: Tape,
    heard: Receiver<Heard>,
    heard_to: std::sync::mpsc::Sender<Heard>,
    seats: Vec<Seat>,
    pending: VecDeque<i64>,
    /// The seed's jobs, then the spares added for held writes ([`Run::spare`]).
    jobs: Vec<JobSpec>,
    tries: HashMap<i64, u32>,
    /// Jobs to deliver twice (exactly-once), and the second copies now in `pending`.
    duplicates: BTreeSet<i64>,
    copies: BTreeSet<i64>,
    acknowledged: BTreeSet<i64>,
    given_up: BTreeSet<i64>,
    killed: BTreeSet<String>,
    /// Does every fault, handed it by `faults` (and its drop resumes what is left paused).
    nemesis: Nemesis,
    /// The schedule drawn from the seed, once every client is ready.
    schedule: Option<Schedule>,
    /// The one player: it plays the drawn schedule from the run's history, and the faults
    /// whose moment the run picks as steps added when they come.
    faults: Option<Faults<'static>>,
    /// How many of the history's events were looked at for a postponed fault's note.
    looked: usize,
    faults_played: usize,
    /// The faults played, by target and kind, to name those that never did.
    played: Vec<(String, Fault)>,
    moments: Vec<LockMoment>,
    strikes: Vec<Strike>,
    /// The clients whose next write the proxy holds (delay), until it goes out.
    held_writes: BTreeSet<String>,
    /// Faults that wait for another client's to end (`one_fault_at_a_time`), by client.
    postponed: BTreeMap<String, Postponed>,
    /// The pauses and delays aimed at a client's write, until it comes.
    aimed: aim::Aimed,
    /// The writes waiting at their proxy's gate, by client: the drain of its notes asked
    /// for, and the gate's ticket (see [`aim::Run::write_at_gate`]).
    gates: BTreeMap<String, (u64, u64)>,
    /// The clients that sent a write the proxy could not try (named once on the timeline).
    untried: BTreeSet<String>,
    /// The last `writing` note not yet looked at, and the worst order being played.
    writing: Option<(String, i64)>,
    /// The most writes that came after the `writing` note in a job answered `ok`: the
    /// last of them changed the record ([`aim::Aimed`]).
    writes_most_ok: Option<u32>,
    overtaking: Option<overtake::Overtake>,
    /// Newer holders whose write, held by the worst order, was let go and has not gone
    /// out yet: its going out is no fault's end.
    newer_let_go: BTreeSet<String>,
    retry_held: Option<overtake::RetryHeld>,
    /// The jobs (by client) whose retry was held once for a newer holder's write.
    retries_held: BTreeSet<(String, i64)>,
    /// The jobs (by client) whose held write met the natural order once: a retry of theirs
    /// that the fault follows meets the worst order instead, or a compare-and-set, refused by
    /// every newer write it is made to wait for, would lose every round.
    naturals_played: BTreeSet<(String, i64)>,
    /// The jobs added for faults still to play ([`Run::spare_for_a_fault_to_come`]).
    spares_to_come: usize,
    /// How many notes each client's natural-order fault has waited for a record to itself
    /// ([`Run::natural_order_alone`]).
    natural_waits: BTreeMap<String, u32>,
    /// The writes held by a fault that followed a newer holder's job past the worst order
    /// ([`Run::follow_the_newer`]), by client and job: the next holder to read the record
    /// writes before them.
    retries_to_hold: BTreeSet<(String, i64)>,
    /// The failover challenge's Redis, and how far its failover has gone.
    failover: Option<failover::Failover<'a>>,
    /// Each job as it was handed out, and how it was answered.
    deliveries: Vec<Delivery>,
    /// When the waits and locks in Postgres were last read (each reading is an event).
    waits_read: Option<Instant>,
    /// The writes lockslab held, as their proxies named them: the session, and which
    /// request of its connection each was (a conflict the server found in its answer to
    /// one is that write refused).
    held_requests: BTreeSet<(i32, u64)>,
    /// lockslab's reading of the run's Redis and etcd keys (`pause`, `delay`): each
    /// client's last snapshot when its job went out and when it said `acquired` (with the
    /// job), the faults that last until their client's lock is gone, and who waited
    /// behind such a lock meanwhile.
    leases: Option<leases::Servers>,
    keys_given: HashMap<String, (i64, leases::Keys)>,
    keys_acquired: HashMap<String, (i64, leases::Keys)>,
    outlasting: Vec<outlast::Outlast>,
    outlast_read: Option<Instant>,
    /// lockslab's own connection to Postgres: the database's clock when a fault begins.
    clock: crate::connect::PgClient,
    /// Each client's Postgres password, hidden wherever a client's words are shown.
    client_passwords: Vec<String>,
    /// The clients' own Postgres logins: a session of one that no proxy opened is told
    /// ([`blocking::Around`]).
    client_logins: Vec<String>,
    /// The logins whose proxies sign in for them, with the URL of their real password and
    /// its verifier as made (when the grader may read it).
    signed_in_for: Vec<(String, String, Option<Option<String>>)>,
    around: blocking::Around,
    /// A moment of lockslab's clock and the database's clock then (µs): to put the
    /// clients' notes on the database's clock.
    clock_base: (Instant, i64),
    /// How far off `clock_base` may be, µs.
    clock_margin_us: i64,
}

/// A note's name, as the client says it.
fn stage_word(stage: Stage) -> &'static str {
    match stage {
        Stage::Given => "job",
        Stage::Acquired => "acquired",
        Stage::Writing => "writing",
        Stage::Released => "released",
    }
}

/// The lines Postgres adds after an error's message (where it happened, a hint, a caret
/// under the statement): the message itself says more.
fn postgres_afterword(line: &str) -> bool {
    let line = line.trim();
    ["CONTEXT:", "DETAIL:", "HINT:", "LINE ", "^"]
        .iter()
        .any(|start| line.starts_with(start))
}

/// The servers' passwords (from the URLs in `init`), to be hidden from what a client says.
fn passwords(init: &Init) -> Vec<String> {
    [&init.redis_url, &init.etcd_url, &init.postgres_url]
        .iter()
        .filter_map(|url| {
            let rest = url.split_once("://")?.1;
            let userinfo = &rest[..rest.rfind('@')?];
            let password = userinfo.split_once(':')?.1;
            (!password.is_empty()).then(|| password.to_string())
        })
        .chain(init.redis_password.clone())
        .collect()
}

/// Plays a run; `redis` is the failover challenge's Sentinel cluster, whose primary it
/// kills mid-run.
pub fn play(setup: &Setup, redis: Option<&mut crate::cluster::SentinelCluster>) -> Result<Played> {
    let (heard_to, heard) = channel();
    let watchdog = super::client::Watchdog::start(&setup.run_id, setup.isolation.home())?;
    // After the watchdog and the servers, before any client: those are spared at the end.
    let reaper = super::reaper::Reaper::start()?;
    let start = Instant::now();
    let mut run = Run {
        setup,
        tape: Tape {
            start,
            json: setup.json,
            events: Vec::new(),
        },
        heard,
        heard_to,
        seats: Vec::new(),
        pending: setup.jobs.iter().map(|j| j.id).collect(),
        jobs: setup.jobs.clone(),
        tries: HashMap::new(),
        duplicates: setup.challenge.duplicates(setup.seed, setup.jobs.len()),
        copies: BTreeSet::new(),
        acknowledged: BTreeSet::new(),
        given_up: BTreeSet::new(),
        killed: BTreeSet::new(),
        nemesis: Nemesis::new(),
        schedule: None,
        faults: None,
        looked: 0,
        faults_played: 0,
        played: Vec::new(),
        moments: Vec::new(),
        strikes: Vec::new(),
        deliveries: Vec::new(),
        waits_read: None,
        client_logins: Vec::new(),
        signed_in_for: Vec::new(),
        around: Default::default(),
        held_requests: BTreeSet::new(),
        leases: matches!(setup.challenge, Challenge::Pause | Challenge::Delay).then(|| {
            leases::Servers::connect(
                &setup.admin_redis,
                &setup.admin_etcd,
                &setup.init.key_prefix,
            )
        }),
        keys_given: HashMap::new(),
        keys_acquired: HashMap::new(),
        outlasting: Vec::new(),
        outlast_read: None,
        held_writes: BTreeSet::new(),
        gates: BTreeMap::new(),
        untried: BTreeSet::new(),
        postponed: BTreeMap::new(),
        aimed: aim::Aimed::default(),
        writing: None,
        writes_most_ok: None,
        overtaking: None,
        newer_let_go: BTreeSet::new(),
        retry_held: None,
        retries_held: BTreeSet::new(),
        naturals_played: BTreeSet::new(),
        spares_to_come: 0,
        natural_waits: BTreeMap::new(),
        retries_to_hold: BTreeSet::new(),
        failover: redis
            .zip(setup.challenge.failover_after(setup.seed))
            .map(|(redis, after)| failover::Failover::new(redis, after)),
        clock: crate::connect::postgres(&setup.grader_url)?,
        client_passwords: Vec::new(),
        clock_base: (start, 0),
        clock_margin_us: 0,
    };
    (run.clock_base, run.clock_margin_us) = clock_base(&mut run.clock)?;
    let facts = crate::events::facts::RunFacts {
        run_id: Some(setup.run_id.clone()),
        ..Default::default()
    };
    let text = format!("run {}", setup.run_id);
    run.tape
        .record(Event::new(crate::nemesis::LANE, What::Run(facts), text));
    if let Some(failover) = &run.failover {
        run.tape.record(failover.started());
    }
    for i in 1..=setup.clients {
        run.start_client(&format!("c{i}"))?;
    }
    let failure = run.drive().err();
    let schedule_planned = run.schedule_len() + usize::from(run.failover.is_some());
    // However it ended: resume what is paused (a nemesis dropped resumes what it left
    // paused), then no more jobs; whoever does not exit when its stdin closes is killed
    // (and every client is reaped) — at once after a failure, within 3s after a run that
    // went to its end.
    drop(std::mem::take(&mut run.nemesis));
    for seat in &mut run.seats {
        seat.client.close();
    }
    let grace = if failure.is_some() { 0 } else { 3 };
    let until = Instant::now() + Duration::from_secs(grace);
    while run.seats.iter_mut().any(|s| s.client.is_running()) && Instant::now() < until {
        for seat in &mut run.seats {
            seat.client.exited();
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let proxy_sessions = proxy_sessions(&run.seats);
    // Every client killed and reaped, then whatever they started out of their groups.
    run.seats.clear();
    super::client::sweep(&format!("{}={}/", super::client::MARK, setup.run_id), true);
    run.passwords_kept();
    // Then whatever they started that carries no mark: it came to lockslab, the reaper.
    drop(reaper);
    let failure = match failure {
        Some(err) if err.downcast_ref::<ClientFailed>().is_some() => Some(format!("{err}")),
        Some(err) => return Err(err),
        None => None,
    };
    drop(watchdog);
    let drawn = run.schedule.take().unwrap_or_default();
    let mut unplayed = run.unplayed(&drawn);
    // The schedule as played: the drawn steps and those the run added as they came.
    let schedule = run.faults.as_ref().map_or(drawn, |f| f.schedule().clone());
    let answered = run.acknowledged.len();
    unplayed.extend(run.failover.as_ref().and_then(|f| f.unplayed(answered)));
    Ok(Played {
        acknowledged: run.acknowledged.clone(),
        schedule,
        faults_planned: schedule_planned,
        faults_played: run.faults_played,
        client_failure: failure,
        events: std::mem::take(&mut run.tape.events),
        started: run.tape.start,
        moments: std::mem::take(&mut run.moments),
        strikes: std::mem::take(&mut run.strikes),
        unplayed,
        deliveries: std::mem::take(&mut run.deliveries),
        proxy_sessions,
        jobs: std::mem::take(&mut run.jobs),
        clock_margin_us: run.clock_margin_us,
    })
}

/// The sessions each client's proxy opened, by client; none if a client had no proxy or
/// a connection of its went encrypted before its session could be read.
fn proxy_sessions(seats: &[Seat]) -> Option<BTreeMap<String, BTreeSet<i32>>> {
    let mut by_client = BTreeMap::new();
    for seat in seats {
        let sessions = seat.proxy.as_ref()?.sessions();
        if sessions.encrypted > 0 {
            return None;
        }
        by_client.insert(seat.client.name.clone(), sessions.pids);
    }
    (!by_client.is_empty()).then_some(by_client)
}

/// The database's clock against lockslab's: the reading of five whose round trip was the
/// shortest, taken as read halfway through it. The log's changes are stamped by the
/// database and the answers by lockslab; on a loaded machine one reading's round trip can
/// take a hundred milliseconds, and an answer read a moment after a commit would seem to
/// come before it (then a `fail` from a second delivery of the same job was blamed for the
/// first delivery's write).
/// A moment of lockslab's clock and the database's clock then, and how far off that
/// pairing may be (half the shortest of five round trips, µs).
fn clock_base(db: &mut crate::connect::PgClient) -> Result<((Instant, i64), i64)> {
    let mut best: Option<(Duration, Instant, i64)> = None;
    for _ in 0..5 {
        let asked = Instant::now();
        let db_us = crate::challenge::table::clock_us(db)?;
        let round_trip = asked.elapsed();
        if best.is_none_or(|(shortest, _, _)| round_trip < shortest) {
            best = Some((round_trip, asked + round_trip / 2, db_us));
        }
    }
    let (round_trip, at, db_us) = best.expect("five readings");
    Ok(((at, db_us), (round_trip / 2).as_micros() as i64))
}

/// A pause or delay that waits for another client's fault to end, with the resume that
/// ends it (a pause's), taken back from the player meanwhile.
pub(super) struct Postponed {
    pub(super) action: Action,
    pub(super) resume: Option<Action>,
}

impl Run<'_> {
    /// Is `name`'s write held now: its client frozen (`paused`, as the nemesis lists them)
    /// or its bytes kept in its proxy (a delay)?
    fn write_held(&self, paused: &[String], name: &str) -> bool {
        paused.iter().any(|p| p == name) || self.held_writes.contains(name)
    }

    /// `text` (what a client printed) with every password of the run hidden — the servers',
    /// and each client's own Postgres login's: a client that logs its URLs must not put them
    /// on the projector (nor in `--json`).
    fn masked(&self, text: &str) -> String {
        let servers = passwords(&self.setup.init);
        (servers.iter().chain(&self.client_passwords)).fold(text.to_string(), |text, password| {
            text.replace(password, "***")
        })
    }

    fn schedule_len(&self) -> usize {
        self.schedule.as_ref().map_or(0, |s| s.steps().len())
    }

    fn start_client(&mut self, name: &str) -> Result<()> {
        let mut init = Init {
            client: name.into(),
            ..self.setup.init.clone()
        };
        let login = match &self.setup.client_role {
            Some(role) => Some(super::table::client_login(&mut self.clock, role, name)?),
            None => None,
        };
        if let Some(login) = &login {
            init.postgres_url = login.url();
            self.client_passwords.push(login.password.clone());
            self.client_logins.push(login.login.clone());
        }
        let proxy = if self.setup.challenge.proxied() {
            let upstream = crate::proxy::upstream_of(&init.postgres_url)?;
            let proxy = Proxy::start(&format!("{name}→postgres"), upstream)?;
            proxy.watch_writes(&init.table);
            proxy.gate_writes();
            proxy.try_writes(super::table::try_probe(&self.setup.init.schema));
            if let Some(login) = &login {
                // The client is given a password of the proxy's: it signs in through it.
                let given = crate::seed::os_hex(32);
                proxy.sign_in_for(crate::proxy::SignIn {
                    login: login.login.clone(),
                    given: given.clone(),
                    real: login.password.clone(),
                });
                init.postgres_url = login.url_with(&given);
                (self.signed_in_for).push((
                    login.login.clone(),
                    login.url(),
                    login.verifier.clone(),
                ));
                self.client_passwords.push(given);
            }
            init.postgres_url = crate::proxy::through(&init.postgres_url, proxy.addr())?;
            Some(proxy)
        } else {
            None
        };
        let client = Client::start(
            &self.setup.program,
            name,
            &self.setup.run_id,
            &self.heard_to,
            &self.setup.isolation,
        )?;
        client.send(&ToClient::Init(Box::new(init)));
        self.seats.push(Seat {
            client,
            proxy,
            ready: false,
            notes: false,
            lock: true,
            job: Some((0, Instant::now())),
            last_job: None,
            heard_at: None,
            stage: Stage::Given,
            writes_since_note: 0,
        });
        Ok(())
    }

    /// After the clients are gone: is each login whose proxy signed in for it still behind
    /// the password only lockslab knew? A login may change its own password (`SET ROLE NONE;
    /// ALTER ROLE CURRENT_USER PASSWORD …`), and then open sessions around its proxy: one
    /// that came and went between two readings of the sessions would go unseen. The change
    /// cannot be undone without the old password, so it is found here, and the run is
    /// unknown ([`What::SessionAroundProxy`]). A superuser grader compares the password's
    /// verifier with the one made; another signs in with the password, and anything but
    /// getting in counts as changed (a verifier Postgres takes and the sign-in refuses, or
    /// every connection slot taken, must not pass for kept).
    fn passwords_kept(&mut self) {
        for (login, url, verifier) in std::mem::take(&mut self.signed_in_for) {
            let changed = match verifier {
                Some(made) => {
                    super::table::password_verifier(&mut self.clock, &login).ok() != Some(made)
                }
                None => {
                    let url = format!("{url}?connect_timeout=5");
                    postgres::Client::connect(&url, postgres::NoTls).is_err()
                }
            };
            if changed {
                let at_us = self.db_us(Instant::now());
                let text = format!(
                    "{login}'s password was changed during the run (only its fault proxy had \
                     it), or could not be checked: its client could open sessions around the \
                     proxy"
                );
                let session = crate::check::challenge::AroundProxy {
                    pid: 0,
                    login,
                    at_us,
                    password_changed: true,
                };
                self.note(
                    crate::nemesis::LANE,
                    What::SessionAroundProxy(session),
                    text,
                );
            }
        }
    }

    fn seat(&mut self, name: &str) -> Option<&mut Seat> {
        self.seats.iter_mut().find(|s| s.client.name == name)
    }

    /// A moment of lockslab's clock on the database's clock (µs since the epoch).
    fn db_us(&self, at: Instant) -> i64 {
        let (base, base_us) = self.clock_base;
        if at >= base {
            base_us + at.duration_since(base).as_micros() as i64
        } else {
            base_us - base.duration_since(at).as_micros() as i64
        }
    }

    /// The client's answer to its delivery of `job`: when lockslab read it, and which.
    fn answered(&mut self, name: &str, job: i64, ok: bool, at: Instant) {
        let at_us = self.db_us(at);
        let delivery = (self.deliveries.iter_mut().rev())
            .find(|d| d.client == name && d.job == job && d.answered_us.is_none());
        if let Some(delivery) = delivery {
            delivery.answered_us = Some(at_us);
            delivery.ok = Some(ok);
        }
    }

    fn spec(&self, job: i64) -> &JobSpec {
        &self.jobs[(job - 1) as usize]
    }

    /// A moment of `client`'s lock on the record of `job`, for the stuck-lock bound.
    fn moment(&mut self, client: &str, job: i64, what: Moment) {
        if job < 1 || job as usize > self.jobs.len() {
            return;
        }
        self.moments.push(LockMoment {
            t_ms: self.tape.start.elapsed().as_millis() as u64,
            client: client.into(),
            record: self.spec(job).record.clone(),
            what,
        });
    }

    /// Records an event in a client's lane: the schedule's player sees it in the history
    /// (an answer was shown to it before it was read: `killed_as_it_answers`).
    fn note(&mut self, worker: &str, what: What, text: String) {
        self.tape.record(Event::new(worker, what, text));
    }

    /// Keeps a reading of the servers in the history, off the timeline: the grader weighs
    /// it (`lockslab check` too), the learner reads the lines that say what it meant.
    fn observe(&mut self, what: What) {
        self.note(crate::nemesis::LANE, what, String::new());
    }

    /// Shows the schedule's player a client's answer before lockslab reads it, and plays
    /// what falls due: a kill aimed at the answer lands first, and the answer dies unread
    /// with the client — its job done, never answered, and sent again. Whether it did.
    fn killed_as_it_answers(&mut self, name: &str, job: i64) -> Result<bool> {
        // An answer for a job it does not hold is said() to fail the client, not counted.
        let holds = (self.seats.iter()).any(|s| {
            s.client.name == name && s.ready && s.job.is_some_and(|(held, _)| held == job)
        });
        let Some(faults) = self.faults.as_mut().filter(|_| holds) else {
            return Ok(false);
        };
        let answer = ChallengeJob {
            job,
            ..ChallengeJob::default()
        };
        let mut event = Event::new(name, What::JobAnswered(answer), String::new());
        event.t_ms = self.tape.start.elapsed().as_millis() as u64;
        faults.foresee(&mut self.tape, &event);
        let struck = self.strikes.len();
        self.play_due()?;
        if self.killed.contains(name) {
            let text =
                format!("its answer to job {job} dies unread with it: the job is sent again");
            self.tape.record(Event::new(name, What::Output, text));
            return Ok(true);
        }
        // Any other fault that fell due here found the answer already written: the client
        // was between jobs, not holding one (a `fail` then is no refusal).
        for strike in &mut self.strikes[struck..] {
            if strike.client == name {
                strike.answered = true;
            }
        }
        Ok(false)
    }

    fn drive(&mut self) -> Result<()> {
        // The faults may last their bounds, on top of the run's own time.
        let ttl = Duration::from_millis(self.setup.init.lease_ms);
        let within = Duration::from_secs(120) + self.setup.challenge.longest_wait(ttl);
        let give_up = Instant::now() + within;
        loop {
            if crate::procs::interrupted() {
                bail!("interrupted");
            }
            if Instant::now() > give_up {
                bail!(
                    "the run did not end within {}",
                    crate::output::human(within)
                );
            }
            // A fault due on a note is played before the client's next line is read: an
            // answer still in the pipe when the client is killed dies with it, as a reply
            // in flight dies with the machine that sent it.
            // At most a few hundred lines a pass: a client that floods its stdout with valid
            // notes must not keep the deadlines below from ever being looked at.
            for _ in 0..LINES_A_PASS {
                let Ok(heard) = self.heard.recv_timeout(Duration::from_millis(2)) else {
                    break;
                };
                self.hear(heard)?;
                self.play_due()?;
                self.overtake()?;
            }
            self.end_overtake()?;
            self.let_the_retry_go()?;
            self.check_deadlines()?;
            self.hear_proxies()?;
            self.read_waits()?;
            self.read_sessions_around()?;
            self.outlast()?;
            if self.faults.is_none() && self.seats.iter().all(|s| s.ready) {
                self.start_schedule()?;
            }
            self.play_due()?;
            self.play_failover()?;
            self.hand_out();
            let busy = self.seats.iter().any(|s| s.job.is_some() && s.ready);
            let failing_over = self.failover.as_ref().is_some_and(|f| f.under_way());
            if self.faults.is_some() && self.pending.is_empty() && !busy && !failing_over {
                return Ok(());
            }
        }
    }

    fn hear(&mut self, heard: Heard) -> Result<()> {
        match heard {
            Heard::Drained(name, drain) => {
                self.drained(&name, drain);
                Ok(())
            }
            // What a killed client had written before it died is lost with it.
            Heard::Said(name, _, _) | Heard::Garbage(name, _) | Heard::Flood(name)
                if self.killed.contains(&name) =>
            {
                Ok(())
            }
            Heard::Said(name, said, at) => {
                if let Some(seat) = self.seat(&name) {
                    seat.heard_at = Some(at);
                }
                if let FromClient::Ok { job } | FromClient::Fail { job, .. } = &said
                    && self.killed_as_it_answers(&name, *job)?
                {
                    return Ok(());
                }
                self.said(&name, said)
            }
            Heard::Garbage(name, line) => {
                let line: String = self.masked(&line).chars().take(80).collect();
                Err(failed(format!(
                    "client {name} printed a line that is not a protocol message: {line:?} \
                     (print logs on stderr; stdout is for the protocol)"
                )))
            }
            Heard::Flood(name) => Err(failed(format!(
                "client {name} printed a line longer than {} bytes: it floods its stdout",
                super::protocol::MAX_LINE
            ))),
            Heard::Closed(name) => {
                if self.killed.contains(&name) {
                    return Ok(());
                }
                let none_ready = !self.seats.iter().any(|s| s.ready);
                let Some(seat) = self.seat(&name) else {
                    return Ok(());
                };
                let job = seat.job.map(|(job, _)| job);
                let mut status = None;
                for _ in 0..100 {
                    status = seat.client.exited();
                    if status.is_some() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                let said = seat.client.last_words();
                let said = self.masked(&said);
                let how = match &status {
                    Some(status) => format!("exited ({status})"),
                    None => "closed its stdout, and was still running 1s later".to_string(),
                };
                if job == Some(0) && none_ready {
                    // No client got as far as ready: the program could not start here (a
                    // missing module, a wrong path), so there is nothing to grade.
                    let words = said.clone();
                    // The line that names the error, not Postgres's afterword to it.
                    let lines: Vec<&str> = words.split(" | ").collect();
                    let last = lines
                        .iter()
                        .rev()
                        .find(|line| !postgres_afterword(line))
                        .or(lines.last())
                        .copied()
                        .unwrap_or_default();
                    let last = match last.trim() {
                        "" => "nothing on stderr".to_string(),
                        line if line.starts_with("ModuleNotFoundError") => format!(
                            "its last stderr line: {line} (install it for that python3, or \
                             name a python3 that has it)"
                        ),
                        line => format!("its last stderr line: {line}"),
                    };
                    // Exit status 0 and not a word: a program that does not speak the
                    // protocol, not a machine that lacks something.
                    let missing = ["ModuleNotFoundError", "No such file", "not found"]
                        .iter()
                        .any(|sign| last.contains(sign));
                    let see = if status.as_deref() == Some("exit status: 0")
                        && last == "nothing on stderr"
                    {
                        "a client says `ready` first, and then answers jobs until its stdin \
                         closes (docs/challenge.md)"
                    } else if missing {
                        "see `lockslab doctor`"
                    } else {
                        "an error of the client's own: run it by hand with an `init` line \
                         (docs/challenge.md) to see it whole"
                    };
                    anyhow::bail!(
                        "client {name} {how} before any client said ready, {last}; {see}"
                    );
                }
                let during = match job {
                    Some(0) => " before it said ready".to_string(),
                    Some(job) => format!(" during job {job}"),
                    None => " between jobs".to_string(),
                };
                let last_words = match said {
                    words if words.is_empty() => String::new(),
                    words => format!("; its stderr ended: {words}"),
                };
                let how = match status {
                    Some(status) => format!("exited by itself ({status})"),
                    None => how,
                };
                Err(failed(format!("client {name} {how}{during}{last_words}")))
            }
        }
    }

    fn said(&mut self, name: &str, said: FromClient) -> Result<()> {
        let Some(seat) = self.seat(name) else {
            return Ok(());
        };
        if let FromClient::Ready { notes, lock } = said {
            if seat.ready {
                return Err(failed(format!("client {name} said ready twice")));
            }
            seat.ready = true;
            seat.notes = notes;
            seat.lock = lock;
            seat.job = None;
            return Ok(());
        }
        let job = said.job().unwrap_or_default();
        let holds = seat.job.map(|(held, _)| held);
        if !seat.ready || holds != Some(job) {
            return Err(failed(format!(
                "client {name} spoke of job {job}, and it holds {}",
                holds.map_or("none".into(), |j| format!("job {j}"))
            )));
        }
        let stage = match &said {
            FromClient::Acquired { .. } => Some(Stage::Acquired),
            FromClient::Writing { .. } => Some(Stage::Writing),
            FromClient::Released { .. } => Some(Stage::Released),
            _ => None,
        };
        if let Some(stage) = stage {
            // A note after a later one hides the moment the faults aim at, and the lock the
            // stuck-lock bound is read from: the client is misbehaving.
            let repeats = stage == seat.stage && stage != Stage::Released;
            if stage < seat.stage || (stage == seat.stage && !repeats) {
                let (note, after) = (stage_word(stage), stage_word(seat.stage));
                return Err(failed(format!(
                    "client {name} said `{note}` for job {job} after its `{after}`: a job's \
                     notes come in the order acquired, writing, released (a `writing` may \
                     repeat, for a retried write), each as it happens"
                )));
            }
            seat.stage = stage;
        }
        let heard_at = seat.heard_at.unwrap_or_else(Instant::now);
        match said {
            FromClient::Ready { .. } => unreachable!("handled above"),
            FromClient::Ok { job } => {
                seat.job = None;
                let writes = seat.writes_since_note;
                if writes > 0 {
                    self.writes_most_ok = self.writes_most_ok.max(Some(writes));
                }
                self.answered(name, job, true, heard_at);
                self.acknowledged.insert(job);
                let answer = ChallengeJob {
                    job,
                    ok: Some(true),
                    ..ChallengeJob::default()
                };
                self.note(name, What::JobAnswered(answer), format!("ok: job {job}"));
            }
            FromClient::Fail { job, reason } => {
                seat.job = None;
                self.answered(name, job, false, heard_at);
                let text = format!(
                    "fail: job {job} ({})",
                    reason.as_deref().unwrap_or("no reason")
                );
                let answer = ChallengeJob {
                    job,
                    ok: Some(false),
                    reason,
                    ..ChallengeJob::default()
                };
                self.note(name, What::JobAnswered(answer), text);
                let held = self
                    .strikes
                    .iter_mut()
                    .filter(|s| s.client == name && !s.answered);
                for strike in held.filter(|s| s.job == Some(job)) {
                    strike.refused = true;
                }
                // A client that gave up waiting for a lock a faulted client holds was right
                // to: that try is the nemesis's, not one of the job's (a fault held to its
                // bound outlasts a lock_timeout of a few TTLs, five times over).
                let record = self.spec(job).record.clone();
                let held_by_a_fault = self.outlasting.iter().any(|o| o.record() == record);
                if let Some(tries) = self.tries.get_mut(&job).filter(|_| held_by_a_fault) {
                    *tries = tries.saturating_sub(1);
                }
                self.give_again(job);
            }
            FromClient::Acquired { job, token } => {
                self.moment(name, job, Moment::Acquired);
                self.came_for_a_held_commit(name, job, "acquired");
                self.snapshot_keys(name, job, true);
                let at_us = self.db_us(heard_at);
                let delivery = (self.deliveries.iter_mut().rev())
                    .find(|d| d.client == name && d.job == job && d.answered_us.is_none());
                if let (Some(delivery), Some(token)) = (delivery, token) {
                    delivery.token.get_or_insert(token);
                    delivery.token_us.get_or_insert(at_us);
                }
                let facts = Acquired {
                    token,
                    ..Acquired::default()
                };
                let text = match token {
                    Some(token) => format!("took the lock for job {job}, token {token}"),
                    None => format!("took the lock for job {job}"),
                };
                self.note(name, What::Acquired(facts), text);
            }
            FromClient::Writing { job } => {
                seat.writes_since_note = 0;
                self.note(name, What::Working, format!("writes job {job}"));
                self.came_for_a_held_commit(name, job, "writing");
                self.writing = Some((name.to_string(), job));
            }
            FromClient::Released { job } => {
                self.moment(name, job, Moment::Released);
                let text = format!("released the lock of job {job}");
                self.note(name, What::Released(Released::default()), text);
            }
        }
        Ok(())
    }

    /// A job whose client died or said `fail` goes back to the front of the line.
    fn give_again(&mut self, job: i64) {
        if self.tries.get(&job).copied().unwrap_or(0) >= TRIES {
            self.given_up.insert(job);
        } else {
            self.pending.push_front(job);
        }
    }

    fn hand_out(&mut self) {
        self.records_of_held_writes_first();
        self.spare_for_a_fault_to_come();
        let kept = self.kept_for_the_natural_order();
        while let Some(at) =
            (self.pending.iter()).position(|&j| !kept.contains(&self.spec(j).record))
        {
            let job = self.pending[at];
            if self.faults.is_none() {
                return;
            }
            let Some(index) = self
                .seats
                .iter()
                .position(|s| s.ready && s.job.is_none() && s.client.is_running())
            else {
                return;
            };
            self.pending.remove(at);
            // A second copy does not count as a try; a first delivery of a job to be
            // delivered twice puts its copy first in line.
            let copy = self.copies.remove(&job);
            let tries = self.tries.entry(job).or_default();
            if !copy {
                *tries += 1;
            }
            if *tries == 1 && !copy && self.duplicates.remove(&job) {
                self.copies.insert(job);
                self.pending.push_front(job);
            }
            let resent = (copy || *tries > 1).then_some(true);
            let spec = self.spec(job).clone();
            let sent_us = self.db_us(Instant::now());
            let seat = &mut self.seats[index];
            seat.job = Some((job, Instant::now()));
            seat.last_job = Some(job);
            seat.stage = Stage::Given;
            seat.writes_since_note = 0;
            self.deliveries.push(Delivery {
                job,
                client: seat.client.name.clone(),
                sent_us,
                ..Delivery::default()
            });
            // The keys as they are before the client can take its lock for this job.
            let name = self.seats[index].client.name.clone();
            self.snapshot_keys(&name, job, false);
            let seat = &mut self.seats[index];
            seat.client.send(&ToClient::Job(Job {
                id: job,
                record: spec.record.clone(),
                add: spec.add,
                append: spec.append.clone(),
                work_ms: WORK_MS,
            }));
            let name = seat.client.name.clone();
            let facts = ChallengeJob {
                job,
                record: Some(spec.record.clone()),
                add: Some(spec.add),
                append: Some(spec.append.clone()),
                resent,
                duplicate: copy.then_some(true),
                ..ChallengeJob::default()
            };
            let again = if copy { " (delivered twice)" } else { "" };
            let text = format!(
                "job {job}: add {} and append {} to {}{again}",
                spec.add, spec.append, spec.record
            );
            self.note(&name, What::JobSent(facts), text);
            self.moment(&name, job, Moment::Wants);
        }
    }

    /// `pause`, `delay`: a held write tests something only if a newer holder of its record
    /// comes while it is held, so a job waiting on that record goes first in line (the seed
    /// fixes the jobs, not the order the clients take them in). If none is waiting, and no
    /// other client holds a job on that record, a spare is added ([`Run::spare`]).
    fn records_of_held_writes_first(&mut self) {
        if !matches!(self.setup.challenge, Challenge::Pause | Challenge::Delay) {
            return;
        }
        let paused = self.paused();
        let held: Vec<(String, String)> = (self.seats.iter())
            .filter(|s| self.write_held(&paused, &s.client.name))
            .filter_map(|s| {
                let job = s.job.map(|(job, _)| job).filter(|&job| job > 0)?;
                Some((s.client.name.clone(), self.spec(job).record.clone()))
            })
            .collect();
        let waiting = (self.pending.iter())
            .position(|&job| held.iter().any(|(_, r)| *r == self.spec(job).record));
        if let Some(job) = waiting.and_then(|at| self.pending.remove(at)) {
            self.pending.push_front(job);
            return;
        }
        if let Some((name, record)) = held.into_iter().find(|(_, r)| self.alone_on(r)) {
            self.spare(&name, &record);
        }
    }

    /// `pause`, `delay`: the seed's jobs ran out while a planned fault had not played — it
    /// waited for another's to end (one at a time), or for a note its client had not reached
    /// — its client is free, and no other fault is on: a spare job is added for it to meet
    /// its fault in. Without
    /// one the run ends undecided, whatever the client's design. At most
    /// [`MOST_SPARES_TO_COME`] a run.
    fn spare_for_a_fault_to_come(&mut self) {
        let on = matches!(self.setup.challenge, Challenge::Pause | Challenge::Delay);
        if !on || !self.pending.is_empty() || self.spares_to_come >= MOST_SPARES_TO_COME {
            return;
        }
        let Some(schedule) = &self.schedule else {
            return;
        };
        let mut played = self.played.clone();
        let to_come: Vec<String> = (schedule.steps().iter())
            .filter(|step| {
                let hit = (step.target.clone(), step.fault);
                let at = played.iter().position(|p| *p == hit);
                at.map(|at| played.remove(at)).is_none()
            })
            .map(|step| step.target.clone())
            .collect();
        let free = |s: &Seat| s.ready && s.job.is_none() && s.client.is_running();
        let Some(name) = to_come
            .into_iter()
            .find(|name| self.seats.iter().any(|s| s.client.name == *name && free(s)))
        else {
            return;
        };
        if self.other_fault_on(&name).is_some() || self.retry_held.is_some() {
            // It would wait for that one to end (one at a time): a job now is done before.
            return;
        }
        let id = self.jobs.len() as i64 + 1;
        let records: BTreeSet<&String> = self.setup.jobs.iter().map(|j| &j.record).collect();
        let Some(record) = records.iter().nth(id as usize % records.len().max(1)) else {
            return;
        };
        let job = (self.setup.challenge).spare_job(self.setup.seed, id, record);
        self.jobs.push(job);
        self.pending.push_front(id);
        self.spares_to_come += 1;
        let text =
            format!("the jobs ran out before {name}'s fault played: job {id} is added (a spare)");
        self.note(crate::nemesis::LANE, What::Output, text);
    }

    /// Does only one client hold a job on `record`?
    fn alone_on(&self, record: &str) -> bool {
        let on = |s: &&Seat| {
            s.client.is_running()
                && s.job
                    .is_some_and(|(job, _)| job > 0 && self.spec(job).record == record)
        };
        self.seats.iter().filter(on).count() == 1
    }

    /// A job added for `holder`'s held write: its record has no job left for a newer
    /// holder to come while the write is held — the seed's jobs ran out, most often while
    /// a fault followed a compare-and-set through its retries, and another client did
    /// the rest. Without one, the fault tests nothing and the run could not be decided,
    /// whatever the client's design. Added only when a client is free to take it: no more
    /// spares in all than the pauses and delays played so far (one fault may get two), and
    /// at most [`MOST_SPARES`] a run.
    fn spare(&mut self, holder: &str, record: &str) {
        let free = (self.seats.iter()).any(|s| s.ready && s.job.is_none() && s.client.is_running());
        let strikes = self.strikes.iter().filter(|s| s.fault != "kill").count();
        let spares = self.jobs.len() - self.setup.jobs.len() - self.spares_to_come;
        if !free || spares >= strikes.min(MOST_SPARES) {
            return;
        }
        let id = self.jobs.len() as i64 + 1;
        let job = (self.setup.challenge).spare_job(self.setup.seed, id, record);
        self.jobs.push(job);
        self.pending.push_front(id);
        let held = self.what_is_held(holder);
        let text = format!(
            "no job is left on {record} for a newer holder to come while {held} waits: job \
             {id} is added (a spare)"
        );
        self.note(crate::nemesis::LANE, What::Output, text);
    }

    /// A client that does not say ready, or does not answer its job, within its time.
    fn check_deadlines(&mut self) -> Result<()> {
        let paused = self.paused();
        let none_ready = !self.seats.iter().any(|s| s.ready);
        for seat in &mut self.seats {
            let Some((job, since)) = seat.job else {
                continue;
            };
            if paused.contains(&seat.client.name) || !seat.client.is_running() {
                continue;
            }
            let limit = self.setup.patience;
            let what = if seat.ready {
                format!("answer job {job}")
            } else {
                "say ready after its init".to_string()
            };
            if since.elapsed() > limit && none_ready {
                // Nobody got as far as ready: nothing was run, so nothing is graded.
                anyhow::bail!(
                    "client {} did not say ready within {}, nor did any other: nothing \
                     ran; on a busy machine: --patience {}",
                    seat.client.name,
                    crate::output::human(limit),
                    crate::flags::flag_duration((2 * limit).max(Duration::from_secs(30)))
                );
            }
            if since.elapsed() > limit {
                return Err(failed(format!(
                    "client {} did not {what} within {}: it hangs, or never answers \
                     (answers go to stdout, one JSON object a line, flushed)",
                    seat.client.name,
                    crate::output::human(limit)
                )));
            }
        }
        Ok(())
    }
}
