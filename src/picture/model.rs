//! From a run's events to what the picture draws: parts, lanes, lock bars, freezes, marks.
//!
//! Everything here reads the events' facts (`kind`, `worker`, `backend`, `target`, `pid`,
//! `released`, `outcome`, `token`…), never their sentences. A lock bar is cut by the
//! backends' answers:
//!
//! - it starts at the holder's `acquired` (the backend granted it), or `between` (SETNX
//!   answered 1), or a row-locking `claimed` (a transaction holds the job's row);
//! - it ends at the first of: the holder's release that deleted its own lock (`released` or
//!   `deleted` true); an `expired` the lab saw in that backend; another holder's grant on
//!   the same lock (the backend grants an exclusive lock only once the previous one is
//!   gone); a release that found the lock gone; a `lost` lock; the commit of a claimed job;
//!   a kill, for Postgres (the session, and its lock, die with the process);
//! - while the holder still acts on a lock the backend had ended — until its release or its
//!   death — the bar goes on as a hatched "still believes it holds" tail.
//!
//! Each lock is a lane of its own: two lock names on one server (lab 5's five pairs) are
//! two lanes, and a backend none of whose locks was granted in a part has no lock lane.
//! Redlock's masters get a lane each ([`super::masters`]); a part the store read back (lab
//! 7) carries its outcome.
//!
//! Nothing here decides a finding. The bars are stamped on arrival, and two events from two
//! processes can arrive in either order ([`crate::check`] says why that misleads at the
//! edges), so "two holders", "stale write" and a part's outcome are the findings of the
//! run's checker, its [`crate::check::report::Report`] ([`super::found`]): a "two holders"
//! band is drawn where an invalid exclusion finding points at one of those two holders
//! (over the span where their bars overlap), a write is marked stale where a stale-write
//! finding is about it, and a part says what broke where a finding on its store is invalid.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use super::Recording;
use super::drawing::{
    Band, Bar, Lane, LaneKind, Mark, Overlap, Part, Picture, Shape, Span, Tone, Verdict,
    overlaps_where,
};
use super::found::Found;
use crate::check::challenge::{Grade, Problem};
use crate::events::facts::{Fault, FaultFacts};
use crate::events::{Event, Kind, What};

/// The kinds only a worker reports: a lane with one of them is a worker's lane.
const WORKER_KINDS: &[Kind] = &[
    Kind::Waiting,
    Kind::Acquired,
    Kind::GaveUp,
    Kind::Freezing,
    Kind::Working,
    Kind::Finished,
    Kind::Wrote,
    Kind::Released,
    Kind::Lost,
    Kind::Between,
    Kind::Ready,
    Kind::Trial,
    Kind::Claimed,
    Kind::Committed,
    Kind::FinishFailed,
    Kind::Error,
    Kind::Output,
    // Lab 10: a waiter that joined a queue and one a watch woke are workers too (a waiter
    // killed in line says nothing else).
    Kind::Queued,
    Kind::Woke,
];

/// Which lock a hold is on: the backend, the job (a queue's row), and the lock's name as the
/// backend knows it (a key, an etcd lock name). Grants of two different names are two locks,
/// even on one server.
type LockId = (String, Option<i64>, Option<String>);

/// The backend of a challenge's locks: the client's own, on the record of its job.
const RECORD: &str = "record";

/// The client a proxy fault or heal was on: its path is named `c1→postgres` (lab 11).
fn held_client(event: &Event) -> Option<&str> {
    match &event.what {
        What::NetFault(f) | What::NetHealed(f) => f.target.as_deref()?.split('→').next(),
        _ => None,
    }
}

/// The backend a lane name stands for (`pg` is lab 3's Postgres lane).
fn backend_of_lane(name: &str) -> Option<&'static str> {
    match name {
        "redis" => Some("redis"),
        "etcd" => Some("etcd"),
        "postgres" | "pg" => Some("postgres"),
        _ => None,
    }
}

fn t_of(event: &Event) -> u64 {
    event.t_ms
}

fn str_of<'a>(value: &'a Value, key: &str) -> Option<&'a str> {
    value.get(key).and_then(Value::as_str)
}

fn lane_of(event: &Event) -> &str {
    &event.worker
}

/// Which part an event belongs to: its `part` label, else the label of the tags older
/// streams carried without one.
pub(super) fn part_of(event: &Event) -> String {
    match &event.part.part {
        Some(part) => part.clone(),
        None => event.part.label(),
    }
}

impl Picture {
    pub fn of(recording: &Recording) -> Picture {
        let mut order: Vec<String> = Vec::new();
        let mut by_part: BTreeMap<String, Vec<(usize, &Event)>> = BTreeMap::new();
        // Events that belong to no part (a run's opening lines) go with the part before
        // them, or the first one: never a part of their own with nothing in it.
        let first_named = recording
            .events
            .iter()
            .map(part_of)
            .find(|label| !label.is_empty());
        let mut last_named = first_named.clone();
        for (index, event) in recording.events.iter().enumerate() {
            let mut part = part_of(event);
            if part.is_empty() {
                part = last_named.clone().unwrap_or_default();
            } else {
                last_named = Some(part.clone());
            }
            if !by_part.contains_key(&part) {
                order.push(part.clone());
            }
            by_part.entry(part).or_default().push((index, event));
        }
        // One colour per worker across all parts: A is A everywhere.
        let mut everyone: Vec<String> = Vec::new();
        for event in &recording.events {
            let lane = lane_of(event);
            if WORKER_KINDS.contains(&event.kind()) && !everyone.iter().any(|w| w == lane) {
                everyone.push(lane.to_string());
            }
        }
        // A challenge's findings name jobs: their writes are drawn as the wrong ones.
        let named = challenge_jobs_named(recording);
        let mut parts: Vec<Part> = order
            .iter()
            .map(|label| {
                let events = &by_part[label];
                let found = Found::of(recording.report.as_ref(), events);
                Part::build(label, events, &everyone, &named, &found)
            })
            .collect();
        if (recording.verdict.as_ref()).is_some_and(|v| str_of(v, "lab") == Some("challenge")) {
            label_challenge_pauses(&mut parts, recording);
        }
        let span_ms = parts
            .iter()
            .map(|p| p.end - p.start)
            .max()
            .unwrap_or(0)
            .max(1000);
        Picture {
            title: title(recording),
            settings: settings(recording),
            parts,
            span_ms,
            verdict: Verdict::of(recording),
            event_count: recording.events.len(),
            disturbed: disturbed(recording),
        }
    }
}

/// The lab's own pauses (its verdict's `lab_paused_ms`, or its warnings' when there is no
/// JSON verdict), in a sentence.
fn disturbed(recording: &Recording) -> Option<String> {
    let from_verdict = recording
        .verdict
        .as_ref()
        .filter(|v| v.get("disturbed").and_then(Value::as_bool) == Some(true))
        .and_then(|v| v.get("lab_paused_ms").and_then(Value::as_u64));
    let from_events = || {
        let gaps: Vec<u64> = recording
            .events
            .iter()
            .filter_map(Event::lab_paused_ms)
            .collect();
        (!gaps.is_empty()).then(|| gaps.iter().sum())
    };
    let total = from_verdict.or_else(from_events)?;
    Some(format!(
        "DISTURBED: lockslab itself was not running for {:.3}s during this run; every time \
         measured across that gap includes it",
        total as f64 / 1000.0
    ))
}

fn title(recording: &Recording) -> String {
    let verdict = recording.verdict.as_ref();
    let lab = verdict
        .and_then(|v| str_of(v, "lab"))
        .map(String::from)
        .or_else(|| {
            recording.command.as_ref().and_then(|c| {
                c.split_whitespace()
                    .nth(1)
                    .filter(|word| !word.starts_with('-'))
                    .map(String::from)
            })
        });
    let run_id = verdict
        .and_then(|v| str_of(v, "run_id"))
        .or_else(|| recording.events.iter().find_map(Event::run_id));
    let mut title = format!("lockslab {}", lab.as_deref().unwrap_or("run"));
    if let Some(run_id) = run_id {
        title.push_str(&format!(" — run {run_id}"));
    }
    title
}

/// The run's settings: the verdict's own top-level facts (`ttl_ms`, `pause_ms`…), and the
/// command line of a live run.
fn settings(recording: &Recording) -> Vec<String> {
    let mut settings = Vec::new();
    if let Some(command) = &recording.command {
        settings.push(command.clone());
    }
    if let Some(verdict) = &recording.verdict
        && str_of(verdict, "lab") == Some("chaos")
    {
        settings.extend(chaos_settings(verdict));
        return settings;
    }
    if let Some(verdict) = &recording.verdict
        && str_of(verdict, "lab") == Some("challenge")
    {
        settings.extend(challenge_settings(verdict, &challenge_problems(recording)));
        return settings;
    }
    if let Some(Value::Object(verdict)) = &recording.verdict {
        let facts: Vec<String> = verdict
            .iter()
            .filter(|(key, _)| {
                let about_the_line = crate::events::envelope::FIELDS.contains(&key.as_str());
                !about_the_line && !matches!(key.as_str(), "disturbed" | "lab_paused_ms")
            })
            .filter_map(|(key, value)| {
                // `ttl_ms 10000` reads as `ttl 10000ms`.
                let (key, unit) = match key.strip_suffix("_ms") {
                    Some(key) => (key, "ms"),
                    None => (key.as_str(), ""),
                };
                let key = key.replace('_', " ");
                match value {
                    Value::String(text) => Some(format!("{key} {text}")),
                    Value::Number(_) => Some(format!("{key} {value}{unit}")),
                    Value::Bool(true) => Some(key),
                    Value::Bool(false) => Some(format!("no {key}")),
                    _ => None,
                }
            })
            .collect();
        if !facts.is_empty() {
            settings.push(facts.join(" · "));
        }
    }
    settings
}

/// A chaos hunt's header in words: what was hunted, what broke, and how to play it again.
fn chaos_settings(verdict: &Value) -> Vec<String> {
    let number = |key: &str| verdict.get(key).and_then(Value::as_u64).unwrap_or(0);
    let design = str_of(verdict, "design").unwrap_or("?");
    let mut first = format!(
        "design {design}, seed {}: {} of {} schedules broke it",
        number("seed"),
        number("unsafe"),
        number("schedules")
    );
    if let Some(after) = verdict
        .get("first_violation_after_s")
        .and_then(Value::as_f64)
    {
        first.push_str(&format!(", the first after {after:.1}s of hunting"));
    }
    let steps = verdict
        .get("shrunk")
        .and_then(Value::as_array)
        .map(Vec::len);
    let mut lines = vec![first];
    if let Some(steps) = steps {
        let clients = number("clients");
        lines.push(format!(
            "Drawn: the failing schedule, shrunk to {steps} fault{} with {clients} client{}.",
            if steps == 1 { "" } else { "s" },
            if clients == 1 { "" } else { "s" }
        ));
    }
    if let Some(replay) = str_of(verdict, "replay") {
        lines.push(format!("Replay it: {replay}"));
    }
    lines
}

/// A challenge's pauses labelled by their kind and client ("pause c2"): the faults are what
/// the run is graded under, and a freeze's hatching alone does not say the lab made it.
/// Only the challenge's: lab 7 pauses a dozen workers a part, and a label each would take
/// rows its page has no room for.
fn label_challenge_pauses(parts: &mut [Part], recording: &Recording) {
    for mark in parts
        .iter_mut()
        .flat_map(|part| part.lanes.iter_mut())
        .flat_map(|lane| lane.marks.iter_mut())
    {
        let Some(event) = recording.events.get(mark.index) else {
            continue;
        };
        if let (What::Frozen(_), Some(fault)) = (&event.what, any_fault(event))
            && fault.fault == Some(Fault::Pause)
            && let Some(target) = &fault.target
        {
            mark.label = Some(format!("pause {target}"));
        }
    }
}

/// A challenge's header in words: the grade and what the checker found, counted by kind;
/// then the jobs, the faults and the clients; then how to play it again.
fn challenge_settings(verdict: &Value, problems: &[Problem]) -> Vec<String> {
    let number = |key: &str| verdict.get(key).and_then(Value::as_u64).unwrap_or(0);
    let grade = (verdict.get("grade").cloned())
        .and_then(|g| serde_json::from_value::<Grade>(g).ok())
        .map_or("not graded", grade_words);
    let mut first = format!(
        "challenge {}, seed {}: {grade}",
        str_of(verdict, "challenge").unwrap_or("?"),
        number("seed")
    );
    let found = findings_counted(problems);
    if !found.is_empty() {
        first.push_str(&format!(" — {found}"));
    }
    let faults = match (number("faults_planned"), number("faults_played")) {
        (0, _) => "no faults".to_string(),
        (planned, played) if planned == played => {
            format!("{played} fault{} played", plural(played))
        }
        (planned, played) => format!("{played} of {planned} faults played"),
    };
    let bit = match number("faults_bit") {
        0 => String::new(),
        // A fault bites when the write it held back landed after another client's change
        // (or was refused): otherwise it tested nothing ([`crate::check::challenge`]).
        bit => format!(", {bit} of them put a held write behind another client's"),
    };
    let jobs = number("jobs");
    let mut second = format!(
        "{jobs} job{}, {} answered · {faults}{bit}",
        plural(jobs),
        number("acknowledged")
    );
    if let Some(isolation) = str_of(verdict, "clients_isolated") {
        second.push_str(&format!(
            " · clients {}",
            match isolation {
                "own-user" => "run as a user of their own",
                "sandbox" => "sandboxed",
                _ => "trusted (run as you)",
            }
        ));
    }
    let mut lines = vec![first, second];
    if let Some(replay) = str_of(verdict, "replay") {
        lines.push(format!("Replay it: {replay}"));
    }
    lines
}

fn plural(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// A grade as the picture says it: the client's result, not the lab's.
fn grade_words(grade: Grade) -> &'static str {
    match grade {
        Grade::Pass => "the client passed",
        Grade::Fail => "the client did not pass",
        Grade::Undecided => "undecided: something it set out to test was not tested",
    }
}

/// The checker's findings counted by kind, in words: "2 stale writes, 2 jobs lost".
fn findings_counted(problems: &[Problem]) -> String {
    let mut counted: Vec<(&str, u64)> = Vec::new();
    for problem in problems {
        match counted.iter_mut().find(|(kind, _)| *kind == problem.kind()) {
            Some((_, n)) => *n += 1,
            None => counted.push((problem.kind(), 1)),
        }
    }
    counted
        .iter()
        .map(|(kind, n)| {
            let s = plural(*n);
            match *kind {
                "stale-write" => format!("{n} stale write{s}"),
                "lost" => format!("{n} job{s} lost"),
                "doubled" => format!("{n} job{s} done twice"),
                "never-done" => format!("{n} job{s} never done"),
                "untagged" => format!("{n} write{s} naming no job"),
                "stuck-lock" => format!("{n} lock{s} left held"),
                "failed-but-written" => format!("{n} job{s} said failed but written"),
                "written-after-ok" => format!("{n} job{s} answered ok before written"),
                other => format!("{n} × {}", other.replace('-', " ")),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A chaos hunt's verdict: its checker's findings on the drawn history, in its words.
fn chaos_findings(recording: &Recording) -> Option<Verdict> {
    let verdict = recording.verdict.as_ref()?;
    if str_of(verdict, "lab") != Some("chaos") {
        return None;
    }
    let report = recording.report.as_ref()?;
    let lines: Vec<String> = report
        .findings
        .iter()
        .map(|finding| {
            let word = match finding.outcome {
                crate::check::report::Outcome::Invalid => "broken",
                crate::check::report::Outcome::Unknown => "unknown",
                crate::check::report::Outcome::Valid => "held",
            };
            format!("{word}: {} — {}", finding.name, finding.words)
        })
        .collect();
    Some(Verdict::Text(lines))
}

/// A hold on a lock while the part is being read.
#[derive(Debug, Clone)]
struct Hold {
    holder: String,
    /// Which lock: the backend, and for a claimed job its number.
    lock: LockId,
    from: u64,
    token: Option<i64>,
    held_to: Option<u64>,
    believed_to: Option<u64>,
    ended_by: String,
}

impl Part {
    fn build(
        label: &str,
        events: &[(usize, &Event)],
        everyone: &[String],
        named: &BTreeSet<i64>,
        found: &Found,
    ) -> Part {
        let start = events.iter().map(|(_, e)| t_of(e)).min().unwrap_or(0);
        let end = events.iter().map(|(_, e)| t_of(e)).max().unwrap_or(start);

        // Who is a worker, which pid is whose.
        let mut workers: Vec<String> = Vec::new();
        let mut pids: BTreeMap<i32, String> = BTreeMap::new();
        for (_, event) in events {
            let lane = lane_of(event);
            if WORKER_KINDS.contains(&event.kind()) && !workers.iter().any(|w| w == lane) {
                workers.push(lane.to_string());
            }
        }
        for (_, event) in events {
            if workers.iter().any(|w| w == lane_of(event))
                && let Some(pid) = event.pid()
            {
                pids.insert(pid, lane_of(event).to_string());
            }
        }
        // Redlock's masters (lab 6): each a lane of its own, so that a quorum and two
        // majorities can be seen master by master.
        let masters = super::masters::names(events);
        let target_of = |event: &Event| -> Option<String> {
            if workers.iter().any(|w| w == lane_of(event)) {
                return None;
            }
            if let Some(target) = event.fault().and_then(|f| f.target.as_deref())
                && (workers.iter().any(|w| w == target) || masters.iter().any(|m| m == target))
            {
                return Some(target.to_string());
            }
            if let Some(client) = held_client(event)
                && workers.iter().any(|w| w == client)
            {
                return Some(client.to_string());
            }
            if let Some(master) = super::masters::master_of(event)
                && masters.contains(&master)
            {
                return Some(master);
            }
            let pid = event.pid()?;
            pids.get(&pid).cloned()
        };

        // The backends whose locks appear.
        let mut backends: Vec<String> = Vec::new();
        for (_, event) in events {
            let backend = event
                .backend()
                .filter(|_| matches!(event.kind(), Kind::Acquired | Kind::Between | Kind::Claimed))
                .or_else(|| backend_of_lane(lane_of(event)));
            if let Some(backend) = backend
                && !backends.iter().any(|b| b == backend)
            {
                backends.push(backend.to_string());
            }
        }
        let only_backend = (backends.len() == 1).then(|| backends[0].clone());

        // Freezes and holds, event by event.
        let mut freezes: BTreeMap<String, Vec<Span>> = BTreeMap::new();
        let mut frozen_now: BTreeMap<String, u64> = BTreeMap::new();
        let mut holds = Holds::default();
        // A challenge's client locks the record of the job it was last sent (lab 11).
        let mut record_of: HashMap<&str, &str> = HashMap::new();
        let mut held: BTreeMap<String, Vec<Span>> = BTreeMap::new();
        let mut held_now: BTreeMap<String, (u64, String)> = BTreeMap::new();
        // Partitions and stalls open now, by target: since when, and in words.
        let mut bands: Vec<Band> = Vec::new();
        let mut bands_now: BTreeMap<String, (u64, String)> = BTreeMap::new();
        // The client whose reply a proxy threw away last (lab 8's lost reply): the lock the
        // server then shows is that client's, abandoned.
        let mut lost_reply_of: Option<String> = None;
        let end_frozen = |frozen_now: &mut BTreeMap<String, u64>,
                          freezes: &mut BTreeMap<String, Vec<Span>>,
                          worker: &str,
                          t: u64| {
            if let Some(from) = frozen_now.remove(worker) {
                freezes.entry(worker.to_string()).or_default().push(Span {
                    from,
                    to: t,
                    open: false,
                    what: String::new(),
                });
            }
        };
        for (_, event) in events {
            let t = t_of(event);
            let kind = event.kind();
            let lane = lane_of(event);
            let is_worker = workers.iter().any(|w| w == lane);
            let target = target_of(event);
            if let What::JobSent(job) = &event.what
                && let Some(record) = job.record.as_deref()
            {
                record_of.insert(lane, record);
            }
            if let (Some(client), Some(client_lane)) = (held_client(event), &target)
                && client == client_lane
            {
                match &event.what {
                    What::NetFault(fault) => {
                        if fault.fault == Some(Fault::DropReply) {
                            lost_reply_of = Some(client.to_string());
                        }
                        let what = proxy_fault_words(fault.fault).to_string();
                        held_now.entry(client.to_string()).or_insert((t, what));
                    }
                    What::NetHealed(_) => {
                        if let Some((from, what)) = held_now.remove(client) {
                            let span = Span {
                                from,
                                to: t,
                                open: false,
                                what,
                            };
                            held.entry(client.to_string()).or_default().push(span);
                        }
                    }
                    _ => {}
                }
            }
            if let Some(fault) = any_fault(event)
                && let Some(target) = fault.target.as_deref()
            {
                match (fault.fault, fault.phase) {
                    (Some(Fault::Partition | Fault::LeaderStall), _) => {
                        bands_now.insert(target.to_string(), (t, band_words(fault)));
                    }
                    (Some(Fault::Heal | Fault::Resume), _) => {
                        if let Some((from, text)) = bands_now.remove(target) {
                            bands.push(Band {
                                from,
                                to: t,
                                open: false,
                                text,
                            });
                        }
                    }
                    _ => {}
                }
            }
            if let What::HolderNow(now) = &event.what
                && let (Some(client), Some(_), Some(key)) =
                    (lost_reply_of.take(), &now.holder, &now.key)
            {
                // The server holds a lock its client never heard it got: drawn on a row of
                // its own, until the backend ends it (an expiry, the next grant).
                let backend = now
                    .backend
                    .clone()
                    .or_else(|| backend_of_lane(lane).map(String::from))
                    .unwrap_or_else(|| lane.to_string());
                holds.push(Hold {
                    holder: format!("{client}, reply lost"),
                    lock: (backend, None, Some(key.clone())),
                    from: t,
                    token: None,
                    held_to: None,
                    believed_to: Some(t),
                    ended_by: String::new(),
                });
            }
            match (kind, is_worker) {
                (Kind::Freezing, true) => {
                    frozen_now.entry(lane.to_string()).or_insert(t);
                }
                (Kind::Frozen, false) => {
                    if let Some(target) = &target {
                        frozen_now.entry(target.clone()).or_insert(t);
                    }
                }
                (Kind::Resumed, true) => end_frozen(&mut frozen_now, &mut freezes, lane, t),
                (Kind::Resumed, false) => {
                    // A resume that does not name its worker resumes the one frozen one.
                    let who = target.clone().or_else(|| {
                        (frozen_now.len() == 1).then(|| frozen_now.keys().next().cloned())?
                    });
                    if let Some(who) = who {
                        end_frozen(&mut frozen_now, &mut freezes, &who, t);
                    }
                }
                (Kind::Killed, false)
                    if target.is_none()
                        && let Some(port) = event.fault().and_then(|f| f.port) =>
                {
                    // A Redis server killed (lab 5's primary): the locks it held are gone with
                    // it, whatever a replica promoted later holds; their holders only
                    // believe from here on.
                    let on_redis: Vec<usize> = holds
                        .unended_by_backend
                        .get("redis")
                        .map(|held| held.iter().map(|&(_, i)| i).collect())
                        .unwrap_or_default();
                    for i in on_redis {
                        holds.end(i, t, format!("its server (:{port}) was killed"));
                    }
                }
                (Kind::Killed, false) => {
                    if let Some(target) = &target {
                        end_frozen(&mut frozen_now, &mut freezes, target, t);
                        for i in holds.stop_believing(target, None) {
                            holds.list[i].believed_to = Some(t);
                            if holds.list[i].lock.0 == "postgres" {
                                holds.end(i, t, "killed: its session ended with it".into());
                            }
                        }
                    }
                }
                (Kind::Acquired | Kind::Between | Kind::Claimed, true) => {
                    let backend = event
                        .backend()
                        .map(String::from)
                        .or_else(|| (kind != Kind::Claimed).then(|| only_backend.clone())?);
                    // A challenge's client names no backend: its lock is its job's record's.
                    let record = record_of.get(lane).filter(|_| backend.is_none());
                    let lock = match (backend, record) {
                        (Some(backend), _) => {
                            (backend, event.job(), event.lock().map(String::from))
                        }
                        (None, Some(record)) => {
                            (RECORD.to_string(), None, Some(record.to_string()))
                        }
                        (None, None) => continue,
                    };
                    if holds.believes(lane, &lock) {
                        continue;
                    }
                    // An exclusive lock granted: every other hold on it had ended by now.
                    for i in holds.unended_by_lock.remove(&lock).unwrap_or_default() {
                        holds.end(i, t, format!("ended no later than {lane}'s grant"));
                    }
                    holds.push(Hold {
                        holder: lane.to_string(),
                        lock,
                        from: t,
                        token: event.token(),
                        held_to: None,
                        believed_to: None,
                        ended_by: String::new(),
                    });
                }
                (Kind::Released | Kind::Committed | Kind::FinishFailed | Kind::Lost, true) => {
                    let deleted_own = match &event.what {
                        What::Released(r) => r.released == Some(true) || r.deleted == Some(true),
                        What::Committed(_) => true,
                        _ => false,
                    };
                    let job = event.job();
                    let why: String = match kind {
                        Kind::Lost => "its heartbeat or session learned it was lost".into(),
                        Kind::Committed => "committed: the row lock went".into(),
                        _ if deleted_own => "released by its holder".into(),
                        _ => "its release found it gone".into(),
                    };
                    if kind == Kind::Lost {
                        // Lost, yet still believed held until its release or death.
                        for i in holds.take_unended_believed(lane, job) {
                            holds.end(i, t, why.clone());
                        }
                    } else {
                        for i in holds.stop_believing(lane, job) {
                            holds.end(i, t, why.clone());
                            holds.list[i].believed_to = Some(t);
                        }
                    }
                }
                (Kind::Expired, false) => {
                    let backend = backend_of_lane(lane)
                        .map(String::from)
                        .or_else(|| only_backend.clone());
                    // An expiry that names its lock ends that lock's oldest hold; one that
                    // does not, the backend's oldest.
                    let oldest = match event.lock() {
                        Some(name) => holds
                            .unended_by_lock
                            .iter()
                            .filter(|(lock, _)| lock.2.as_deref() == Some(name))
                            .flat_map(|(_, held)| held.iter().copied())
                            .filter(|&i| holds.list[i].held_to.is_none())
                            .min_by_key(|&i| holds.list[i].from),
                        None => backend
                            .and_then(|b| holds.unended_by_backend.get(&b))
                            .and_then(|unended| unended.first())
                            .map(|&(_, i)| i),
                    };
                    if let Some(i) = oldest {
                        holds.end(i, t, format!("{lane} said it expired"));
                    }
                }
                _ => {}
            }
        }
        let stale = found.late_writes();
        let broken = found.broken();
        // Writers that write to more than one resource: their write labels name it.
        let mut resources: HashMap<&str, BTreeSet<&str>> = HashMap::new();
        for (_, event) in events {
            if let What::Wrote(wrote) = &event.what
                && let Some(resource) = wrote.resource.as_deref()
            {
                resources
                    .entry(lane_of(event))
                    .or_default()
                    .insert(resource);
            }
        }
        let writes_many: BTreeSet<String> = resources
            .into_iter()
            .filter(|(_, written)| written.len() > 1)
            .map(|(writer, _)| writer.to_string())
            .collect();
        let holds = holds.list;
        for (worker, from) in frozen_now {
            freezes.entry(worker).or_default().push(Span {
                from,
                to: end,
                open: true,
                what: String::new(),
            });
        }
        for (worker, (from, what)) in held_now {
            held.entry(worker).or_default().push(Span {
                from,
                to: end,
                open: true,
                what,
            });
        }
        for (_, (from, text)) in bands_now {
            bands.push(Band {
                from,
                to: end,
                open: true,
                text,
            });
        }

        // Lanes: locks first (one lane per lock: two locks on one server are two lanes),
        // then workers, then the rest in order of appearance. A backend none of whose locks
        // was granted here gets no lock lane: its events go on a plain lane of its name.
        let mut lanes: Vec<Lane> = Vec::new();
        let mut locks: Vec<(String, Option<String>)> = Vec::new();
        for hold in &holds {
            let lock = (hold.lock.0.clone(), hold.lock.2.clone());
            if !locks.contains(&lock) {
                locks.push(lock);
            }
        }
        locks.sort_by_key(|(backend, _)| backends.iter().position(|b| b == backend));
        for (backend, lock_name) in &locks {
            let backend_lane = events
                .iter()
                .map(|(_, e)| lane_of(e))
                .find(|lane| backend_of_lane(lane) == Some(backend.as_str()))
                .unwrap_or(backend)
                .to_string();
            let names_on_backend = locks.iter().filter(|(b, _)| b == backend).count();
            let name = match lock_name {
                // A challenge's lock goes by its record: `r0 lock`.
                Some(record) if backend == RECORD => record.clone(),
                Some(lock_name) if names_on_backend > 1 => {
                    let short = short_lock_name(lock_name);
                    // `redis-renewed` names its backend already; `unfenced` does not.
                    if short.starts_with(backend.as_str()) || short.starts_with(&backend_lane) {
                        short
                    } else {
                        format!("{backend_lane} {short}")
                    }
                }
                _ => backend_lane,
            };
            let mut lane = Lane::new(&name, LaneKind::Lock);
            let mine: Vec<&Hold> = holds
                .iter()
                .filter(|h| &h.lock.0 == backend && &h.lock.2 == lock_name)
                .collect();
            let mut row_of: HashMap<String, usize> = HashMap::new();
            for hold in &mine {
                let row_name = match hold.lock.1 {
                    Some(job) => format!("{} job {job}", hold.holder),
                    None => hold.holder.clone(),
                };
                let row = *row_of.entry(row_name.clone()).or_insert_with(|| {
                    lane.rows.push(row_name);
                    lane.rows.len() - 1
                });
                let color = everyone.iter().position(|w| w == &hold.holder).unwrap_or(0);
                let open = hold.held_to.is_none();
                let held_to = hold.held_to.unwrap_or(end);
                let believed_to = hold.believed_to.unwrap_or(end).max(held_to);
                let mut label = hold.holder.clone();
                if let Some(job) = hold.lock.1 {
                    label.push_str(&format!(" job {job}"));
                }
                if let Some(token) = hold.token {
                    label.push_str(&format!(" · token {token}"));
                }
                lane.bars.push(Bar {
                    row,
                    holder: hold.holder.clone(),
                    label,
                    from: hold.from,
                    held_to,
                    believed_to,
                    open,
                    ended_by: if open {
                        "still held when the run ended".into()
                    } else {
                        hold.ended_by.clone()
                    },
                    color,
                });
            }
            lane.overlaps = overlaps(&lane.bars, &mine);
            lanes.push(lane);
        }
        let quorum_and_masters =
            super::masters::lanes(events, &masters, end, everyone, &mut freezes);
        lanes.extend(quorum_and_masters);
        // "Two holders" is the checker's finding, not the spans': a band is drawn only where
        // the run's Report found these two holding the lock at once.
        for lane in &mut lanes {
            lane.overlaps.retain(|overlap| {
                let holders: Vec<&str> = overlap.holders.iter().map(String::as_str).collect();
                found.two_holders(&holders)
            });
        }
        for worker in &workers {
            let mut lane = Lane::new(worker, LaneKind::Worker);
            lane.freezes = freezes.remove(worker).unwrap_or_default();
            lane.held = held.remove(worker).unwrap_or_default();
            lane.waits = super::waits::of(events, worker);
            lanes.push(lane);
        }
        let mut job_of: HashMap<&str, i64> = HashMap::new();
        for (index, event) in events {
            if let What::JobSent(job) = &event.what {
                job_of.insert(lane_of(event), job.job);
            }
            let lane_name = target_of(event).unwrap_or_else(|| lane_of(event).to_string());
            let position = lanes.iter().position(|lane| lane.name == lane_name);
            let lane = match position {
                Some(position) => &mut lanes[position],
                None => {
                    lanes.push(Lane::new(&lane_name, LaneKind::Other));
                    lanes.last_mut().expect("just pushed")
                }
            };
            let proof = Proof {
                stale: stale.contains_key(index),
                broken: broken.contains(index),
            };
            let mut drawn = mark(*index, event, proof, &writes_many);
            if event.kind() == Kind::Working
                && let Some(&job) = job_of.get(lane_of(event))
            {
                challenge_write(&mut drawn, job, named);
            }
            lane.marks.push(drawn);
        }
        // Lab 10's herd queues: the lab reports each waiter's turn once it is over.
        let mut start = start;
        for (_, event) in events {
            if let What::Handovers(queue) = &event.what
                && let Some(lane) = turns_lane(queue, t_of(event), everyone.len())
            {
                start = start.min(lane.bars.iter().map(|b| b.from).min().unwrap_or(start));
                lanes.insert(0, lane);
            }
        }
        Part {
            label: label.to_string(),
            start,
            end,
            lanes,
            outcome: found.outcome().or_else(|| queue_outcome_of(events)),
            bands,
        }
    }
}

/// The fault facts of a process fault or a network one.
fn any_fault(event: &Event) -> Option<&FaultFacts> {
    match &event.what {
        What::NetFault(f) | What::NetHealed(f) => Some(f),
        _ => event.fault(),
    }
}

/// What a proxy did to a client's path, as the span on its lane says it.
fn proxy_fault_words(fault: Option<Fault>) -> &'static str {
    match fault {
        Some(Fault::Cut) => "cut off",
        Some(Fault::DropReply) => "reply lost",
        Some(Fault::Delay) => "bytes delayed",
        _ => "write held in flight",
    }
}

/// A partition or a stall in words, from its target: `m2` alone (cut off from the rest),
/// `a|m4,m5` (one side cut from the other), `a,m1|b,m4` (a split in two).
fn band_words(fault: &FaultFacts) -> String {
    let target = fault.target.as_deref().unwrap_or("?");
    let list = |side: &str| side.split(',').collect::<Vec<_>>().join(", ");
    if fault.fault == Some(Fault::LeaderStall) {
        return format!("leader {} stalled (SIGSTOP)", list(target));
    }
    match target.split_once('|') {
        Some((one, other)) if one.contains(',') && other.contains(',') => {
            format!("partition: {} | {} (split in two)", list(one), list(other))
        }
        Some((one, other)) => format!("partition: {} cut off from {}", list(one), list(other)),
        None => format!("partition: {} cut off from the rest", list(target)),
    }
}

/// A herd queue's turns (lab 10) as one lock lane: each waiter's bar from its grant to its
/// release, one after the other. The turns are stamped on the machine's monotonic clock;
/// the last release is put at the stamp of the report that carried them (`at`), which the
/// lab wrote just after it, so each bar's length and the gaps between them are as measured.
fn turns_lane(queue: &crate::events::facts::Handovers, at: u64, colors: usize) -> Option<Lane> {
    let last = queue.turns.iter().map(|turn| turn.leave_ns).max()?;
    let t = |ns: u64| at.saturating_sub(last.saturating_sub(ns) / 1_000_000);
    let backend = if queue.way.starts_with("redis") {
        "redis"
    } else {
        "etcd"
    };
    let mut lane = Lane::new(backend, LaneKind::Lock);
    lane.rows.push("served in turn".to_string());
    let mut turns: Vec<&crate::check::queue::Turn> = queue.turns.iter().collect();
    turns.sort_by_key(|turn| turn.enter_ns);
    for (i, turn) in turns.iter().enumerate() {
        // Served i-th, it had asked at place `asked`: the label says both, so that the lane
        // reads as asking order against serving order.
        let label = if turn.asked as usize == i + 1 {
            format!("#{}", turn.asked)
        } else {
            format!("#{} (served {})", turn.asked, i + 1)
        };
        lane.bars.push(Bar {
            row: 0,
            holder: turn.waiter.clone(),
            label,
            from: t(turn.enter_ns),
            held_to: t(turn.leave_ns),
            believed_to: t(turn.leave_ns),
            open: false,
            ended_by: format!(
                "released; it had asked at place {} in the queue, was woken {} times and sent {} requests",
                turn.asked, turn.wakeups, turn.requests
            ),
            color: colors + i,
        });
    }
    Some(lane)
}

/// A queue part's outcome (lab 10's waiting parts), from the waiters' turns it reported.
fn queue_outcome_of(events: &[(usize, &Event)]) -> Option<(String, Tone)> {
    events
        .iter()
        .rev()
        .find_map(|(_, event)| match &event.what {
            What::Handovers(queue) => Some(queue_outcome(&queue.turns)),
            _ => None,
        })
}

/// A queue's outcome (lab 10's waiting parts), from its waiters' own turns: served in the
/// order they asked or not, and what each hand-over cost in requests and wake-ups.
fn queue_outcome(turns: &[crate::check::queue::Turn]) -> (String, Tone) {
    let facts = crate::check::queue::queue_facts(turns);
    let order = if facts.fair {
        "served in order".to_string()
    } else {
        format!("served out of order ({} overtakes)", facts.overtakes)
    };
    let per = |figure: Option<f64>| figure.map_or("?".to_string(), |f| format!("{f:.1}"));
    // Who asked at which place, in the order they were served: 1 2 3 … when fair.
    let mut served: Vec<&crate::check::queue::Turn> = turns.iter().collect();
    served.sort_by_key(|turn| turn.enter_ns);
    let places: Vec<String> = served.iter().map(|t| t.asked.to_string()).collect();
    let text = format!(
        "{order} — {} waiters; per hand-over: {} requests, {} wake-ups; the places they had \
         asked at, in the order they were served: {}",
        facts.waiters,
        per(facts.client_requests_per_handover),
        per(facts.wakeups_per_handover),
        places.join(" "),
    );
    let herd = facts.wakeups_per_handover.is_some_and(|w| w > 1.5);
    let tone = match (facts.fair, herd) {
        (true, false) => Tone::Good,
        (false, _) => Tone::Bad,
        (true, true) => Tone::Warn,
    };
    (text, tone)
}

/// A challenge client's `working` (it writes its job's record, lab 11) drawn as a write; a
/// job a finding names is drawn as the wrong write.
fn challenge_write(mark: &mut Mark, job: i64, named: &BTreeSet<i64>) {
    mark.shape = Shape::Write;
    if named.contains(&job) {
        mark.tone = Tone::Bad;
        mark.label = Some(format!("write job {job}: see the findings"));
    } else {
        mark.label = Some(format!("write job {job}"));
    }
}

/// The jobs a challenge's findings name: those whose events (sent, answered) an invalid
/// finding of the run's Report points at; for a run without one (recorded before today's
/// grader could judge it again), the jobs its recorded problems name.
fn challenge_jobs_named(recording: &Recording) -> BTreeSet<i64> {
    let Some(report) = &recording.report else {
        return challenge_problems(recording)
            .iter()
            .filter_map(Problem::job)
            .collect();
    };
    report
        .with(crate::check::report::Outcome::Invalid)
        .flat_map(|finding| &finding.events)
        .filter_map(|&i| match &recording.events.get(i)?.what {
            What::JobSent(job) | What::JobAnswered(job) => Some(job.job),
            _ => None,
        })
        .collect()
}

/// The findings of a challenge's verdict (`lab` `challenge`), as the checker made them.
fn challenge_problems(recording: &Recording) -> Vec<Problem> {
    recording
        .verdict
        .as_ref()
        .filter(|v| str_of(v, "lab") == Some("challenge"))
        .and_then(|v| v.get("problems"))
        .and_then(|p| serde_json::from_value(p.clone()).ok())
        .unwrap_or_default()
}

/// A worker's tally, where the database turned attempts away: "3 refused · 12 no-ops".
fn tally_label(event: &Event) -> Option<String> {
    let value = serde_json::to_value(event).ok()?;
    let tally = value.get("tally")?;
    let count = |key: &str| tally.get(key).and_then(Value::as_u64).unwrap_or(0);
    let said: Vec<String> = [
        ("rejected", "refused"),
        ("no_ops", "no-ops"),
        ("conflicts", "conflicts"),
    ]
    .iter()
    .filter(|(key, _)| count(key) > 0)
    .map(|(key, word)| format!("{} {word}", count(key)))
    .collect();
    (!said.is_empty()).then(|| said.join(" · "))
}

/// A lock's name as its lane says it: the last part of the key, without the run's
/// namespace (`lockslab:5c2487d1:failover:unfenced:lock` is `unfenced`,
/// `lockslab:cbc458a2:etcd-vs-redis:kill:redis-renewed` is `redis-renewed`).
fn short_lock_name(name: &str) -> String {
    let name = name.strip_suffix(":lock").unwrap_or(name);
    name.rsplit(':').next().unwrap_or(name).to_string()
}

/// Where two holders of one lock act at once: each from its grant to its release or death.
/// Bars are compared in order of grant, each only with those granted before it let go.
fn overlaps(bars: &[Bar], holds: &[&Hold]) -> Vec<Overlap> {
    overlaps_where(bars, |i, j| holds[i].lock == holds[j].lock)
}

/// The holds read so far, with the indexes that keep reading a run linear in its events.
#[derive(Default)]
struct Holds {
    list: Vec<Hold>,
    /// Holds the backend had not ended when they were filed, by lock (ended ones are skipped).
    unended_by_lock: HashMap<LockId, Vec<usize>>,
    /// Holds the backend has not ended, by backend, oldest grant first: an expiry ends it.
    unended_by_backend: HashMap<String, BTreeSet<(u64, usize)>>,
    /// Holds their holder still acts on, by holder and job.
    believed: HashMap<String, BTreeMap<Option<i64>, Vec<usize>>>,
    /// Holds believed and not ended when they were filed, by holder and job (for `lost`).
    unended_believed: HashMap<String, BTreeMap<Option<i64>, Vec<usize>>>,
}

impl Holds {
    fn push(&mut self, hold: Hold) {
        let i = self.list.len();
        let (holder, lock) = (hold.holder.clone(), hold.lock.clone());
        self.unended_by_lock
            .entry(lock.clone())
            .or_default()
            .push(i);
        self.unended_by_backend
            .entry(lock.0.clone())
            .or_default()
            .insert((hold.from, i));
        for index in [&mut self.believed, &mut self.unended_believed] {
            index
                .entry(holder.clone())
                .or_default()
                .entry(lock.1)
                .or_default()
                .push(i);
        }
        self.list.push(hold);
    }

    /// The backend ended hold `i` at `t` (unless it had already).
    fn end(&mut self, i: usize, t: u64, why: String) {
        let hold = &mut self.list[i];
        if hold.held_to.is_none() {
            hold.held_to = Some(t);
            hold.ended_by = why;
            if let Some(unended) = self.unended_by_backend.get_mut(&hold.lock.0) {
                unended.remove(&(hold.from, i));
            }
        }
    }

    /// Does `holder` still act on `lock`?
    fn believes(&self, holder: &str, lock: &LockId) -> bool {
        self.believed
            .get(holder)
            .and_then(|jobs| jobs.get(&lock.1))
            .is_some_and(|held| held.iter().any(|&i| self.list[i].lock == *lock))
    }

    /// The holds `holder` acts on (of one job, or all), which it stops acting on now.
    fn stop_believing(&mut self, holder: &str, job: Option<i64>) -> Vec<usize> {
        let Some(jobs) = self.believed.get_mut(holder) else {
            return Vec::new();
        };
        match job {
            Some(job) => jobs.remove(&Some(job)).unwrap_or_default(),
            None => std::mem::take(jobs).into_values().flatten().collect(),
        }
    }

    /// The holds `holder` acts on that the backend had not ended (of one job, or all).
    fn take_unended_believed(&mut self, holder: &str, job: Option<i64>) -> Vec<usize> {
        let Some(jobs) = self.unended_believed.get_mut(holder) else {
            return Vec::new();
        };
        let taken: Vec<usize> = match job {
            Some(job) => jobs.remove(&Some(job)).unwrap_or_default(),
            None => std::mem::take(jobs).into_values().flatten().collect(),
        };
        taken
            .into_iter()
            .filter(|&i| self.list[i].believed_to.is_none())
            .collect()
    }
}

/// What the run's checkers said of one event: a write they found late, an answer that
/// proves a property broken.
#[derive(Clone, Copy, Default)]
struct Proof {
    stale: bool,
    broken: bool,
}

fn mark(index: usize, event: &Event, proof: Proof, writes_many: &BTreeSet<String>) -> Mark {
    let Proof { stale, broken } = proof;
    let t = t_of(event);
    let kind = event.kind().to_string();
    let lane = lane_of(event);
    let (mut shape, mut tone, mut label) = match event.kind() {
        Kind::Killed => (Shape::Kill, Tone::Bad, Some("killed".to_string())),
        Kind::Frozen | Kind::Freezing => (Shape::Freeze, Tone::Cold, None),
        Kind::Resumed => (Shape::Resume, Tone::Cold, None),
        Kind::Expired => (Shape::Expire, Tone::Warn, Some(kind.clone())),
        // A read-back (lab 2's Redis answers, the tables' counts, a killed worker's job's
        // row): a failure where an invalid finding of the checker points at it; else lab 2's
        // lapse, where Redis's key no longer held the dead holder's value.
        Kind::RedisRead | Kind::TablesRead if broken => {
            (Shape::Tick, Tone::Bad, Some("violation".to_string()))
        }
        Kind::JobRead if broken => (Shape::Tick, Tone::Warn, Some("job lost".to_string())),
        Kind::RedisRead
            if event
                .observed()
                .is_some_and(|o| o.dead_owner == Some(false)) =>
        {
            (Shape::Expire, Tone::Warn, Some("lapsed".to_string()))
        }
        Kind::Acquired | Kind::Between | Kind::Claimed => (Shape::Grant, Tone::Plain, None),
        Kind::Released | Kind::Committed => (Shape::Release, Tone::Plain, None),
        Kind::Lost | Kind::GaveUp | Kind::Error => {
            (Shape::Tick, Tone::Warn, Some(kind.replace('_', " ")))
        }
        Kind::Woke => (Shape::Tick, Tone::Cold, Some("woke".to_string())),
        Kind::Finished => match tally_label(event) {
            Some(label) => (Shape::Tick, Tone::Good, Some(label)),
            None => (Shape::Tick, Tone::Plain, None),
        },
        _ => (Shape::Tick, Tone::Plain, None),
    };
    if let Some(words) = fault_label(event) {
        label = Some(words);
    }
    if let What::HolderNow(now) = &event.what {
        // Lab 5: the server side's answer to the fault — a replica promoted, a leader elected.
        let after = match (now.failover_ms, now.election_ms) {
            (Some(ms), _) => Some(format!(
                "replica promoted to primary ({ms}ms after the kill)"
            )),
            (None, Some(ms)) => Some(format!("new leader elected ({ms}ms after the kill)")),
            _ => None,
        };
        if let Some(words) = after {
            (shape, tone, label) = (Shape::Grant, Tone::Warn, Some(words));
        }
    }
    if let What::GuardDecided(decided) = &event.what {
        // Lab 9: the guard's check, what it believed was left, and its decision.
        let left = decided
            .believed_left_ms
            .map(|ms| format!(", {ms}ms left"))
            .unwrap_or_default();
        let (tone_now, verb) = match decided.write {
            true => (Tone::Plain, "writes"),
            false => (Tone::Warn, "gives up"),
        };
        tone = tone_now;
        label = Some(format!("{} check{left}: {verb}", decided.guard.as_str()));
    }
    if event.lab_paused_ms().is_some() {
        tone = Tone::Bad;
        label = Some("lockslab paused: disturbed".to_string());
    }
    if let What::Wrote(wrote) = &event.what {
        shape = Shape::Write;
        let outcome = wrote.outcome.as_str();
        let token = match event.token() {
            Some(token) => format!("token {token}"),
            None => "no token".to_string(),
        };
        // Stale: the run's checkers found this write late (decided after the next holder's).
        tone = match (stale, outcome) {
            (true, "accepted") => Tone::Bad,
            (true, "rejected") => Tone::Good,
            (true, _) => Tone::Warn,
            _ => Tone::Plain,
        };
        let to = match &wrote.resource {
            Some(resource) if writes_many.contains(lane) => format!(" to {resource}"),
            _ => String::new(),
        };
        label = Some(if stale {
            format!("STALE write{to}, {token}: {}", outcome.to_uppercase())
        } else {
            format!("write{to}, {token}: {outcome}")
        });
    }
    Mark {
        index,
        t,
        tip: tip(event),
        kind,
        shape,
        tone,
        label,
    }
}

/// A fault's mark in words, by its kind: `kill m4`, `cut A→redis`, `leader m1 stalled`.
fn fault_label(event: &Event) -> Option<String> {
    let fault = any_fault(event)?;
    let target = fault.target.as_deref();
    let words = match (&event.what, fault.fault, target) {
        (What::Killed(_), Some(Fault::Restart), Some(target)) => {
            format!("crash {target} (restarted)")
        }
        (What::Killed(_), _, Some(target)) => format!("kill {target}"),
        (What::Killed(_), _, None) => {
            // A server the lab names only in its sentence (lab 5's primary, etcd's leader):
            // its first clause, which says which.
            let said = event.text.split(';').next().unwrap_or("").trim();
            match said.strip_prefix("SIGKILLs ") {
                Some(whom) if whom.chars().count() <= 40 => format!("kill: {whom}"),
                _ => "killed".to_string(),
            }
        }
        (What::Resumed(_), Some(Fault::Restart), Some(target)) => match fault.restart_ms {
            Some(ms) => format!("{target} back, empty ({ms}ms)"),
            None => format!("{target} back"),
        },
        (What::Frozen(_), Some(Fault::LeaderStall), Some(target)) => {
            format!("stall leader {target}")
        }
        (What::Frozen(_), Some(Fault::Pause), Some(target))
            if super::masters::master_of(event).is_some() =>
        {
            format!("pause {target}")
        }
        (What::NetFault(_), Some(Fault::Partition), _) => "partition".to_string(),
        (What::NetFault(_), Some(kind), Some(path)) => {
            let verb = match kind {
                Fault::Cut => "cut",
                Fault::DropReply => "drop the reply on",
                Fault::Delay => "delay",
                _ => "hold",
            };
            format!("{verb} {path}")
        }
        (What::NetHealed(_), Some(Fault::Heal), _) => "heal".to_string(),
        (What::ClockStepped(_), _, _) => match (fault.clock_step_ms, fault.clock_rate_percent) {
            (Some(ms), _) => format!(
                "wall clock {}{:.1}s",
                if ms < 0 { "−" } else { "+" },
                ms.abs() as f64 / 1000.0
            ),
            (None, Some(rate)) => format!("wall clock at {rate}% speed"),
            _ => return None,
        },
        _ => return None,
    };
    Some(words)
}

/// The hover text: time, lane, kind, sentence, then every fact, as `--json` writes them.
fn tip(event: &Event) -> String {
    let t = t_of(event);
    let mut lines = vec![format!(
        "+{:.3}s  {}  {}",
        t as f64 / 1000.0,
        lane_of(event),
        event.kind()
    )];
    if !event.text.is_empty() {
        lines.push(event.text.clone());
    }
    if let Ok(Value::Object(facts)) = serde_json::to_value(event) {
        for (key, value) in facts {
            if matches!(key.as_str(), "t_ms" | "worker" | "kind" | "text" | "part") {
                continue;
            }
            let mut shown = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            if shown.chars().count() > 120 {
                shown = shown.chars().take(117).collect::<String>() + "…";
            }
            lines.push(format!("{key}: {shown}"));
        }
    }
    lines.join("\n")
}

impl Verdict {
    fn of(recording: &Recording) -> Verdict {
        // The lab's own words first; a verdict without them (an older lockslab's) as a table.
        if !recording.verdict_text.is_empty() {
            return Verdict::Text(recording.verdict_text.clone());
        }
        if let Some(findings) = findings(recording).or_else(|| chaos_findings(recording)) {
            return findings;
        }
        match &recording.verdict {
            Some(Value::Object(verdict)) => {
                let columns = verdict.values().find_map(|value| match value {
                    Value::Array(items)
                        if items.iter().all(Value::is_object) && !items.is_empty() =>
                    {
                        Some(items)
                    }
                    _ => None,
                });
                match columns {
                    Some(items) => table(items),
                    None => Verdict::Table {
                        header: vec!["verdict".into(), String::new()],
                        rows: verdict
                            .iter()
                            .filter(|(key, _)| key.as_str() != "kind")
                            .map(|(key, value)| vec![key.clone(), cell(value)])
                            .collect(),
                    },
                }
            }
            _ if !recording.verdict_text.is_empty() => {
                Verdict::Text(recording.verdict_text.clone())
            }
            _ => Verdict::Missing,
        }
    }
}

/// A challenge's verdict: its grade and findings in the checker's own words
/// ([`Problem::describe`]), and the change log with the changes a finding names marked.
fn findings(recording: &Recording) -> Option<Verdict> {
    let verdict = recording.verdict.as_ref()?;
    if str_of(verdict, "lab") != Some("challenge") {
        return None;
    }
    let grade: Grade = serde_json::from_value(verdict.get("grade")?.clone()).ok()?;
    let problems = challenge_problems(recording);
    let challenge = str_of(verdict, "challenge").unwrap_or("?");
    let mut lines = vec![format!(
        "challenge {challenge}: {}",
        match findings_counted(&problems) {
            found if found.is_empty() => grade_words(grade).to_string(),
            found => format!("{} — {found}", grade_words(grade)),
        }
    )];
    if let Some(failure) = str_of(verdict, "client_failure") {
        lines.push(format!("  {failure}"));
    }
    lines.extend(problems.iter().map(|p| format!("  - {}", p.describe())));
    // Version 3 of the JSON called the list `undecided`.
    let unknown = verdict.get("unknown").or_else(|| verdict.get("undecided"));
    if let Some(Value::Array(undecided)) = unknown {
        lines.extend(
            undecided
                .iter()
                .filter_map(Value::as_str)
                .map(|l| format!("  ? {l}")),
        );
    }
    if let Some(replay) = str_of(verdict, "replay") {
        lines.push(format!("  replay: {replay}"));
    }
    let header: Vec<String> = ["change", "record", "job", "old", "new", "finding"]
        .map(String::from)
        .to_vec();
    let mut rows = Vec::new();
    let mut named = Vec::new();
    for change in verdict
        .get("changes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let number = |key: &str| change.get(key).and_then(Value::as_i64);
        let (seq, job) = (number("seq"), number("job"));
        let kinds: Vec<&str> = problems
            .iter()
            .filter(|p| p.names_change(seq, job))
            .map(Problem::kind)
            .collect();
        let shown = |n: Option<i64>| n.map_or("—".to_string(), |n| n.to_string());
        rows.push(vec![
            format!("#{}", shown(seq)),
            str_of(change, "record").unwrap_or("?").to_string(),
            shown(job),
            shown(number("old_value")),
            shown(number("new_value")),
            kinds.join(", "),
        ]);
        named.push(!kinds.is_empty());
    }
    Some(Verdict::Findings {
        lines,
        header,
        rows,
        named,
    })
}

/// The verdict's table as [`Verdict::of`] would draw it: (columns, rows).
pub(super) fn verdict_table_size(recording: &Recording) -> (usize, usize) {
    let Some(Value::Object(verdict)) = &recording.verdict else {
        return (0, 0);
    };
    let items = verdict.values().find_map(|value| match value {
        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
            Some(items)
        }
        _ => None,
    });
    match items {
        Some(items) => {
            let keys: BTreeSet<String> =
                items.iter().flat_map(flatten).map(|(key, _)| key).collect();
            (items.len(), keys.len())
        }
        None => (1, verdict.len()),
    }
}

/// One column per run (or cell, scenario, mode), one row per fact, as the labs' tables.
fn table(items: &[Value]) -> Verdict {
    let flat: Vec<Vec<(String, String)>> = items.iter().map(flatten).collect();
    let mut keys: Vec<String> = Vec::new();
    let mut seen = BTreeSet::new();
    for item in &flat {
        for (key, _) in item {
            if seen.insert(key.clone()) {
                keys.push(key.clone());
            }
        }
    }
    // The facts that name a column go first.
    const NAMES: &[&str] = &["name", "scenario", "mode", "backend", "fencing", "variant"];
    keys.sort_by_key(|key| NAMES.iter().position(|n| n == key).unwrap_or(NAMES.len()));
    let header = std::iter::once("evidence".to_string())
        .chain(flat.iter().enumerate().map(|(i, item)| {
            let names: Vec<String> = item
                .iter()
                .filter(|(key, _)| NAMES.contains(&key.as_str()))
                .map(|(key, value)| match key.as_str() {
                    "fencing" if value == "yes" => "fenced".to_string(),
                    "fencing" => "no fencing".to_string(),
                    _ => value.clone(),
                })
                .collect();
            if names.is_empty() {
                format!("#{}", i + 1)
            } else {
                names.join(" · ")
            }
        }))
        .collect();
    // The first value of each key, as a search from the front would find it.
    let lookup: Vec<HashMap<&str, &str>> = flat
        .iter()
        .map(|item| {
            let mut first = HashMap::new();
            for (key, value) in item {
                first.entry(key.as_str()).or_insert(value.as_str());
            }
            first
        })
        .collect();
    let rows = keys
        .iter()
        .map(|key| {
            std::iter::once(key.clone())
                .chain(lookup.iter().map(|item| {
                    item.get(key.as_str())
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "—".into())
                }))
                .collect()
        })
        .collect();
    Verdict::Table { header, rows }
}

fn flatten(item: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if let Value::Object(facts) = item {
        for (key, value) in facts {
            match value {
                Value::Object(inner) if inner.values().all(|v| !v.is_object()) => {
                    for (inner_key, inner_value) in inner {
                        out.push((format!("{key}.{inner_key}"), cell(inner_value)));
                    }
                }
                other => out.push((key.clone(), cell(other))),
            }
        }
    }
    out
}

/// A fact in a table cell: attempts as `writer:token→ok`, other lists of records counted,
/// yes and no rather than
/// `true` and `false`, a dash for nothing, anything long shortened.
fn cell(value: &Value) -> String {
    let text = match value {
        Value::Null => "—".to_string(),
        Value::Bool(true) => "yes".to_string(),
        Value::Bool(false) => "no".to_string(),
        Value::String(text) => text.clone(),
        Value::Array(items)
            if items.iter().all(|i| i.get("writer").is_some()) && !items.is_empty() =>
        {
            items
                .iter()
                .map(|attempt| {
                    let token = attempt
                        .get("token")
                        .and_then(Value::as_i64)
                        .map_or("-".to_string(), |t| t.to_string());
                    let ok = attempt.get("accepted").and_then(Value::as_bool) == Some(true);
                    format!(
                        "{}:{token}→{}",
                        str_of(attempt, "writer").unwrap_or("?"),
                        if ok { "ok" } else { "no" }
                    )
                })
                .collect::<Vec<_>>()
                .join(" ")
        }
        // A list of records (Redlock's read-back of every master) does not fit a cell as
        // JSON: it is counted, and read in the run's JSON.
        Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
            format!("{} entries, in the JSON", items.len())
        }
        other => other.to_string(),
    };
    if text.chars().count() > 90 {
        text.chars().take(87).collect::<String>() + "…"
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::facts::Acquired;

    #[test]
    fn a_guards_check_is_drawn_with_what_it_believed_and_decided() {
        let decided = |write: bool, left: Option<i64>| {
            let event = Event::new(
                "A",
                crate::events::facts::GuardDecided {
                    guard: crate::lock::lease_guard::Guard::MonotonicDeadline,
                    write,
                    believed_left_ms: left,
                    key_ours: None,
                    pttl_ms: None,
                    since_send_ms: 0,
                    wall_clock_ms: None,
                    gap_ms: None,
                    wall_skew_ms: None,
                },
                "decided",
            );
            mark(0, &event, Proof::default(), &BTreeSet::new())
        };
        let gave_up = decided(false, Some(-212));
        assert_eq!(
            gave_up.label.as_deref(),
            Some("monotonic-deadline check, -212ms left: gives up")
        );
        assert_eq!(gave_up.tone, Tone::Warn);
        let wrote = decided(true, None);
        assert_eq!(
            wrote.label.as_deref(),
            Some("monotonic-deadline check: writes")
        );
    }

    fn grant(t_ms: u64, worker: &str, lock: &str) -> Event {
        let mut event = Event::new(
            worker,
            Acquired {
                lock: Some(lock.into()),
                backend: Some("redis".into()),
                ..Acquired::default()
            },
            "took it",
        );
        event.t_ms = t_ms;
        event
    }

    /// The "two holders" bands drawn, under a Report that found the lock held by two at
    /// once, pointing at every event.
    fn two_holders(events: Vec<Event>) -> Vec<Vec<String>> {
        use crate::check::report::{Finding, Outcome, Report};
        let every = 0..events.len();
        let recording = Recording {
            events,
            report: Some(Report::of([Finding::new(
                "mutual exclusion",
                Outcome::Invalid,
                "two at once",
                every,
            )])),
            ..Recording::default()
        };
        Picture::of(&recording)
            .parts
            .iter()
            .flat_map(|part| &part.lanes)
            .flat_map(|lane| &lane.overlaps)
            .map(|overlap| overlap.holders.clone())
            .collect()
    }

    #[test]
    fn two_grants_of_one_lock_are_two_holders_but_two_locks_on_one_server_are_not() {
        // Lab 5: A:unfenced and A:wait hold two different keys on the same Redis at once.
        let mut later = Event::new("A", What::Working, "still at it");
        later.t_ms = 50;
        let apart = two_holders(vec![
            grant(0, "A:unfenced", "k:unfenced"),
            grant(10, "A:wait", "k:wait"),
            later.clone(),
        ]);
        assert!(
            apart.is_empty(),
            "different locks drawn as two holders: {apart:?}"
        );
        // The same key granted to B while A still acts on it: two holders.
        let same = two_holders(vec![grant(0, "A", "k"), grant(10, "B", "k"), later]);
        assert_eq!(same, vec![vec!["A".to_string(), "B".to_string()]]);
    }

    #[test]
    fn lab_2s_read_back_is_a_failure_only_where_the_checker_points_at_it() {
        use crate::events::facts::Observed;
        let read = |dead_owner: bool| {
            Event::new(
                "redis",
                What::RedisRead(Observed {
                    dead_owner: Some(dead_owner),
                    pttl_ms: Some(-1),
                    ..Observed::default()
                }),
                "GET, PTTL",
            )
        };
        let broken = Proof {
            broken: true,
            ..Proof::default()
        };
        let drawn = mark(0, &read(true), broken, &BTreeSet::new());
        assert_eq!(
            (drawn.tone, drawn.label.as_deref()),
            (Tone::Bad, Some("violation"))
        );
        // The same answer, no finding pointing at it: not a failure.
        let drawn = mark(0, &read(true), Proof::default(), &BTreeSet::new());
        assert_ne!(drawn.tone, Tone::Bad);
        // The key no longer held the dead holder's value: its lock lapsed.
        let drawn = mark(0, &read(false), Proof::default(), &BTreeSet::new());
        assert_eq!(
            (drawn.shape, drawn.label.as_deref()),
            (Shape::Expire, Some("lapsed"))
        );
    }
}
