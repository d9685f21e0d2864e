//! Lab 6's verdict: one row per scenario, the client-pause's stale write resource by
//! resource, and each scenario's sentences. Every fact in it was decided by
//! [`crate::check::redlock`] from the masters' answers and the store's record.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::{Plan, Scenario};
use crate::check::redlock::{self as check, MasterState, Round, StaleWrite};
use crate::check::report::{self, Report};
use crate::events::{Event, Kind, What};
use crate::labs::replay::{self, Replayed};
use crate::labs::runner;
use crate::labs::step::{self, Checkpoint};
use crate::labs::words::Words;
use crate::lock::redlock::{self, Attempt};
use crate::nemesis::schedule::Schedule;

/// What the paused client's late write came to in one resource of the store (client-pause).
#[derive(Serialize, Debug, Clone)]
pub struct GuardedWrite {
    /// `unfenced`, `claim` (the random value compare-and-set at the resource, claimed at
    /// the grant), `late_claim` (the same, A's claim made after its pause: a claim has no
    /// order) or `sequence` (a token from a Postgres sequence).
    pub guard: &'static str,
    pub resource: String,
    #[serde(flatten)]
    pub stale: StaleWrite,
    /// Whose result the resource holds at the end.
    pub final_writer: Option<String>,
}

/// One client's round, as it goes into the verdict.
#[derive(Serialize, Debug, Clone)]
pub struct ClientRound {
    pub client: String,
    #[serde(flatten)]
    pub attempt: Attempt,
}

/// One scenario's verdict: every field read from the masters' answers or the store.
#[derive(Serialize, Debug, Clone, Default)]
pub struct ScenarioVerdict {
    pub name: &'static str,
    /// The deciding round (B's, or the only client's) was granted.
    pub granted: bool,
    pub quorum: usize,
    /// The deciding round's validity.
    pub validity_ms: i64,
    /// Two clients each held a majority's grant at the same moment (null where only one
    /// client played).
    pub two_holders: Option<bool>,
    /// The paused client's write to the unfenced resource (client-pause only).
    pub stale_write: Option<StaleWrite>,
    /// The paused client's write to each resource of the store, one row per guard
    /// (client-pause only): unfenced, claimed by value, claimed late, sequence token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guarded_writes: Option<Vec<GuardedWrite>>,
    /// Masters that still held the failed round's value after its release (majority-down).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub left_after_release: Option<Vec<String>>,
    /// Frozen masters that set the failed round's key once thawed (majority-down): the
    /// release did not reach it there, and only the TTL removes it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub set_once_thawed: Option<Vec<String>>,
    pub rounds: Vec<ClientRound>,
    /// The masters read back at the scenario's decisive moment.
    pub read_back: Vec<MasterState>,
    /// Set when part of the scenario is simulated, saying which part.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulated: Option<&'static str>,
    pub meaning: String,
    pub prevented_by: &'static str,
    /// The faults the part played, as its schedule (none where it played none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
}

/// Every round of the clients the events of `tag` report, on the run's clock: the event is
/// stamped when the round's answer was in, and the round began its elapsed time before.
pub fn rounds_in(events: &[Event], tag: &str) -> Vec<(String, Round)> {
    rounds_at(events, tag)
        .into_iter()
        .map(|(_, who, round)| (who, round))
        .collect()
}

/// [`rounds_in`], each round with the position of its event in `events`.
pub fn rounds_at(events: &[Event], tag: &str) -> Vec<(usize, String, Round)> {
    (0..events.len())
        .filter(|&i| events[i].part.scenario.as_deref() == Some(tag))
        .filter_map(|i| {
            let e = &events[i];
            let attempt = match &e.what {
                What::Acquired(a) => a.attempt.as_deref(),
                What::GaveUp(g) => g.attempt.as_deref(),
                _ => None,
            }?;
            let elapsed = attempt.elapsed_ms.ceil() as u64;
            let round = Round {
                held: attempt.held,
                began: Duration::from_millis(e.t_ms.saturating_sub(elapsed)),
                ended: Duration::from_millis(e.t_ms),
                validity_ms: attempt.validity_ms,
            };
            Some((i, e.worker.clone(), round))
        })
        .collect()
}

/// The parts where two clients ask while the masters are split, in the order they play: at
/// once, and in the middle of A's round (before its quorum, after it).
const SPLIT_PARTS: [&str; 3] = [
    "partition-split",
    "partition-split-before-quorum",
    "partition-split-after-quorum",
];

/// The masters that still held the value of a client whose round failed (`rounds`: each
/// client and whether its round held), as `read` answered: what its release left behind.
pub fn left_by_failed(rounds: &[(&str, bool)], read: &[MasterState]) -> Vec<String> {
    let failed: Vec<&str> = (rounds.iter())
        .filter(|(_, held)| !held)
        .map(|(who, _)| *who)
        .collect();
    (read.iter())
        .filter(|s| s.answered && s.holder.as_deref().is_some_and(|h| failed.contains(&h)))
        .map(|s| s.master.clone())
        .collect()
}

/// Every read-back of the masters for scenario `name`'s key, in the order the lab made them.
pub fn reads_in(events: &[Event], name: &str) -> Vec<Vec<MasterState>> {
    reads_at(events, name)
        .into_iter()
        .map(|(_, read)| read)
        .collect()
}

/// [`reads_in`], each read-back with the position of its event in `events`.
pub fn reads_at(events: &[Event], name: &str) -> Vec<(usize, Vec<MasterState>)> {
    let suffix = format!(":{name}");
    (0..events.len())
        .filter_map(|i| match &events[i].what {
            What::HolderNow(h) if h.key.as_deref().is_some_and(|k| k.ends_with(&suffix)) => {
                Some((i, h.masters.clone()?))
            }
            _ => None,
        })
        .collect()
}

/// The client pause judged from its history: was the lock granted twice within A's
/// validity? Answers with the positions in `events` of A's grant and B's granted round
/// (None: B was never granted, so not twice).
pub fn judge_client_pause(
    events: &[Event],
    name: &str,
) -> Result<(usize, Option<usize>, crate::check::Finding)> {
    let a_at = (0..events.len())
        .find(|&i| {
            events[i].part.scenario.as_deref() == Some(name) && events[i].is("A", Kind::Acquired)
        })
        .with_context(|| format!("{name}: A's grant is not in the history"))?;
    let a_seen = &events[a_at];
    let validity_ms = match &a_seen.what {
        What::Acquired(a) => a.validity_ms.context("A's grant without its validity")?,
        _ => unreachable!("found as a grant"),
    };
    let rounds = rounds_at(events, name);
    let Some((b_at, _, b)) = rounds.iter().find(|(_, who, r)| who == "B" && r.held) else {
        return Ok((a_at, None, crate::check::Finding::No));
    };
    let twice =
        check::granted_twice_after_pause(Duration::from_millis(a_seen.t_ms), validity_ms, b.began);
    Ok((a_at, Some(*b_at), twice))
}

/// `lockslab check`: the facts of each scenario the masters' answers decide, judged again
/// from the history — the read-backs of the majority-down key, A's and B's rounds in the
/// restarts and the clock jump, and the client pause's grant against A's validity.
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let mut replayed = Replayed::default();
    let mut pairs = rounds_in(events, "restart");
    pairs.extend(rounds_in(events, "clock-jump"));
    for name in SPLIT_PARTS {
        pairs.extend(rounds_in(events, name));
    }
    let mut pairs = pairs
        .chunks(2)
        .map(|pair| pair.to_vec())
        .collect::<Vec<_>>()
        .into_iter();
    for recorded in replay::list(verdict, "scenarios")? {
        let name = replay::text(recorded, "name")?;
        let found = match name {
            "majority-down" => {
                let [after, woke] = &reads_in(events, name)[..] else {
                    bail!("majority-down: the history does not hold its two read-backs");
                };
                json!({
                    "left_after_release": check::holding(after),
                    "set_once_thawed": check::holding(woke),
                })
            }
            "partition-cut" => {
                let [(_, a)] = &rounds_in(events, name)[..] else {
                    bail!("{name}: the history does not hold A's one round");
                };
                json!({ "granted": a.held })
            }
            "restart-empty"
            | "restart-delayed"
            | "clock-jump"
            | "partition-split"
            | "partition-split-before-quorum"
            | "partition-split-after-quorum" => {
                let Some([(a_who, a), (b_who, b)]) = pairs
                    .next()
                    .as_deref()
                    .map(|p| p.to_vec())
                    .and_then(|p| <[(String, Round); 2]>::try_from(p).ok())
                else {
                    bail!("{name}: the history does not hold A's and B's rounds");
                };
                if (a_who.as_str(), b_who.as_str()) != ("A", "B") {
                    bail!("{name}: the rounds are {a_who}'s and {b_who}'s, not A's and B's");
                }
                let mut found = json!({
                    "granted": b.held,
                    "two_holders": check::two_holders(&a, &b).as_option(),
                });
                if name.starts_with("partition-split-") {
                    let [read] = &reads_in(events, name)[..] else {
                        bail!("{name}: the history does not hold its one read-back");
                    };
                    let failed = [("A", &a), ("B", &b)].map(|(who, r)| (who, r.held));
                    found["left_after_release"] = json!(left_by_failed(&failed, read));
                }
                found
            }
            "client-pause" => {
                let (_, b_at, twice) = judge_client_pause(events, name)?;
                json!({ "granted": b_at.is_some(), "two_holders": twice.as_option() })
            }
            _ => continue,
        };
        replayed.part(name, recorded, found);
    }
    Ok(replayed)
}

/// Lab 6's checker: the whole history judged as one [`Report`], from the same functions
/// [`replay`] and the live run judge with:
///
/// - **mutual exclusion** (the restarts, the clock jump, the client pause): did two clients
///   each hold a majority's grant at once? Proved by A's and B's rounds (and, where the lab
///   read them, the masters right after B's);
/// - **released everywhere** (majority-down): did the failed round's release reach every
///   master? Proved by the masters read back once the frozen ones woke;
/// - **stale write** (client-pause): unknown, since the store's read-back of the resources
///   is not an event of the history.
///
/// A scenario whose rounds or read-backs are missing is unknown, with the reason. Each
/// finding's events are positions in `history`.
pub fn check(history: &[Event]) -> Report {
    let mut report = Report::default();
    let reads = reads_at(history, "majority-down");
    if let [_, (woke_at, woke)] = &reads[..] {
        let (outcome, words) = match check::released_everywhere(woke) {
            crate::check::Finding::Yes => (
                report::Outcome::Valid,
                "once the frozen masters woke, none held the failed round's key".to_string(),
            ),
            crate::check::Finding::No => (
                report::Outcome::Invalid,
                format!(
                    "once the frozen masters woke, {} held the failed round's key: its \
                     release did not reach them",
                    check::holding(woke).join(", ")
                ),
            ),
            crate::check::Finding::Unknown => (
                report::Outcome::Unknown,
                "a master did not answer the read-back once the others woke".to_string(),
            ),
        };
        let name = "released everywhere (majority-down)";
        report.push(report::Finding::new(name, outcome, words, [*woke_at]));
    } else if !reads.is_empty() {
        report.push(report::Finding::new(
            "evidence (majority-down)",
            report::Outcome::Unknown,
            "the history does not hold the majority-down key's two read-backs",
            [],
        ));
    }
    let mut rounds = rounds_at(history, "restart");
    rounds.extend(rounds_at(history, "clock-jump"));
    for name in SPLIT_PARTS {
        rounds.extend(rounds_at(history, name));
    }
    for pair in rounds.chunks(2) {
        report.push(pair_exclusion(history, pair));
    }
    for name in &SPLIT_PARTS[1..] {
        if let Some(finding) = failed_round_released(history, name) {
            report.push(finding);
        }
    }
    if history
        .iter()
        .any(|e| e.part.scenario.as_deref() == Some("client-pause"))
    {
        for finding in client_pause_findings(history) {
            report.push(finding);
        }
    }
    report
}

/// Two clients' rounds in a restart or the clock jump: were both granted at once? Named
/// after the scenario whose key the lab read back right after B's round.
fn pair_exclusion(history: &[Event], pair: &[(usize, String, Round)]) -> report::Finding {
    let [(a_at, a_who, a), (b_at, b_who, b)] = pair else {
        return report::Finding::new(
            "evidence",
            report::Outcome::Unknown,
            "a client's round without its partner's",
            pair.iter().map(|(at, _, _)| *at),
        );
    };
    let read_at = (*b_at..history.len()).find(|&i| history[i].kind() == Kind::HolderNow);
    let scenario = read_at
        .and_then(|i| match &history[i].what {
            What::HolderNow(h) => h.key.as_deref()?.rsplit(':').next(),
            _ => None,
        })
        .unwrap_or("restart");
    let name = format!("mutual exclusion ({scenario})");
    if (a_who.as_str(), b_who.as_str()) != ("A", "B") {
        let words = format!("the rounds are {a_who}'s and {b_who}'s, not A's and B's");
        return report::Finding::new(name, report::Outcome::Unknown, words, [*a_at, *b_at]);
    }
    let two = check::two_holders(a, b);
    let words = match two {
        crate::check::Finding::Yes => "B's round was granted before A's validity ended",
        _ => "B was not granted while A's validity ran",
    };
    let events = [Some(*a_at), Some(*b_at), read_at].into_iter().flatten();
    report::Finding::new(name, report::Outcome::broken_if(two), words, events)
}

/// A split in the middle of A's round: did the round that failed (A's short of its quorum,
/// or B's) leave its value on no master? Decided by the masters' own answers read back
/// while the split lasted; unknown where a master did not answer. None when the part is not
/// in the history, or no round failed.
fn failed_round_released(history: &[Event], name: &str) -> Option<report::Finding> {
    let rounds = rounds_at(history, name);
    let reads = reads_at(history, name);
    if rounds.is_empty() && reads.is_empty() {
        return None;
    }
    let title = format!("failed round released ({name})");
    let ([(a_at, a_who, a), (b_at, b_who, b)], [(read_at, read)]) = (&rounds[..], &reads[..])
    else {
        let words = "the history does not hold both rounds and the one read-back";
        let at = rounds.iter().map(|(at, _, _)| *at);
        return Some(report::Finding::new(
            title,
            report::Outcome::Unknown,
            words,
            at,
        ));
    };
    let (failed_at, who) = match (a.held, b.held) {
        (false, _) => (*a_at, a_who),
        (_, false) => (*b_at, b_who),
        _ => return None,
    };
    let held = [(a_who.as_str(), a.held), (b_who.as_str(), b.held)];
    let left = left_by_failed(&held, read);
    let events = [failed_at, *read_at];
    let (outcome, words) = if !left.is_empty() {
        let words = format!(
            "{who}'s value was still on {}: its release missed them",
            left.join(", ")
        );
        (report::Outcome::Invalid, words)
    } else if read.iter().all(|s| s.answered) {
        let words = format!("no master held {who}'s value once its failed round had released");
        (report::Outcome::Valid, words)
    } else {
        let words = "a master did not answer the read-back".to_string();
        (report::Outcome::Unknown, words)
    };
    Some(report::Finding::new(title, outcome, words, events))
}

/// The client pause: was the lock granted twice within A's validity (the judgment the live
/// run made), and the stale write the history cannot decide.
fn client_pause_findings(history: &[Event]) -> Vec<report::Finding> {
    let name = "client-pause";
    let exclusion = match judge_client_pause(history, name) {
        Ok((a_at, b_at, twice)) => {
            let words = match (b_at, twice) {
                (None, _) => "B was never granted the lock",
                (_, crate::check::Finding::No) => "B asked after A's validity had ended",
                _ => {
                    "B asked before A's validity could have ended: the lab's clock cannot \
                      order them"
                }
            };
            let events = [Some(a_at), b_at].into_iter().flatten();
            report::Finding::new(
                "mutual exclusion (client-pause)",
                report::Outcome::broken_if(twice),
                words,
                events,
            )
        }
        Err(why) => report::Finding::new(
            "evidence (client-pause)",
            report::Outcome::Unknown,
            format!("{why:#}"),
            [],
        ),
    };
    let stale = report::Finding::new(
        "stale write (client-pause)",
        report::Outcome::Unknown,
        "the store's read-back of the resources is not an event of the history: what it \
         took of A's late writes is not judged from it",
        [],
    );
    vec![exclusion, stale]
}

/// The run's verdict: the plan it played and each scenario's verdict.
pub struct Verdict {
    pub(super) plan: Plan,
    pub(super) scenarios: Vec<ScenarioVerdict>,
}

impl runner::Verdict for Verdict {
    fn fields(&self) -> Map<String, Value> {
        let settings = &self.plan.settings;
        let skipped: Vec<Value> = self
            .plan
            .skipped
            .iter()
            .map(|s| {
                serde_json::json!({
                    "name": s.command_name(),
                    "why": "needs masters lockslab starts itself (it kills, freezes and restarts them)",
                })
            })
            .collect();
        let mut fields = Map::new();
        let mut put = |key: &str, value: Value| {
            fields.insert(key.into(), value);
        };
        put("masters", self.plan.n.into());
        put("masters_given", (!self.plan.given.is_empty()).into());
        put("quorum", redlock::quorum(self.plan.n).into());
        put("ttl_ms", (settings.ttl.as_millis() as u64).into());
        put("drift_factor", settings.drift_factor.into());
        put(
            "drift_ms",
            (redlock::drift(settings.ttl, settings.drift_factor).as_millis() as u64).into(),
        );
        put(
            "instance_timeout_ms",
            (settings.instance_timeout.as_millis() as u64).into(),
        );
        put(
            "retry_ms",
            (settings.retry_delay_max.as_millis() as u64).into(),
        );
        put(
            "scenarios",
            serde_json::to_value(&self.scenarios).unwrap_or_default(),
        );
        put("skipped", Value::Array(skipped));
        fields
    }

    fn words(&self) -> Words {
        verdict_words(&self.scenarios, &self.plan.skipped)
    }

    fn headline(&self) -> String {
        let scenarios: Vec<String> = self
            .scenarios
            .iter()
            .map(|s| match &s.stale_write {
                Some(write) => format!(
                    "{}: {}",
                    s.name,
                    crate::room::stale_write_word(write.attempted, write.accepted)
                ),
                None if s.two_holders.is_some() => {
                    format!("{}: {}", s.name, crate::room::holders_word(s.two_holders))
                }
                None if s.granted => format!("{}: granted", s.name),
                None => format!("{}: not granted", s.name),
            })
            .collect();
        scenarios.join(" · ")
    }

    fn checkpoint(&self) -> Option<&'static Checkpoint> {
        let only_the_pause = self
            .plan
            .scenarios
            .iter()
            .all(|s| *s == super::Scenario::ClientPause);
        Some(if only_the_pause {
            &step::redlock::VERDICT_CLIENT_PAUSE
        } else {
            &step::redlock::VERDICT
        })
    }
}

/// A guard's row label in the verdict and the store's lines.
pub(super) fn guard_label(guard: &str) -> &'static str {
    match guard {
        "unfenced" => "unfenced",
        "claim" => "value claimed at the grant (CAS on the value)",
        "late_claim" => "value claimed after the pause (no order)",
        _ => "token from a Postgres sequence",
    }
}

pub(super) fn state_line(state: &MasterState) -> String {
    let what = match (&state.holder, state.pttl_ms, state.answered) {
        (_, _, false) => format!("✗ {}", state.why.as_deref().unwrap_or("no answer")),
        (Some(holder), Some(pttl), _) => format!("{holder}'s value, PTTL {pttl}ms"),
        (None, _, _) => "no key".to_string(),
        (Some(holder), None, _) => format!("{holder}'s value"),
    };
    format!("{:<3} :{:<5} {what}", state.master, state.port)
}

/// The verdict as data: the table of scenarios, client-pause's resources, then a sentence
/// per scenario with what prevents its failure, and the scenarios skipped.
fn verdict_words(verdicts: &[ScenarioVerdict], skipped: &[Scenario]) -> Words {
    let rows: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            let granted = v
                .rounds
                .last()
                .map(|r| format!("{}/{}", r.attempt.granted, r.attempt.answers.len()))
                .unwrap_or_default();
            vec![
                v.name.to_string(),
                format!("{} {granted}", if v.granted { "yes" } else { "no" }),
                yes_no(v.two_holders),
                stale_word(v.stale_write.as_ref()),
            ]
        })
        .chain(skipped.iter().map(|s| {
            let mut row = vec![s.command_name().to_string(), "skipped".to_string()];
            row.extend(std::iter::repeat_n("–".to_string(), 2));
            row
        }))
        .collect();
    let header = [
        "scenario",
        "granted",
        "granted twice within validity",
        "stale write",
    ];
    let mut words = Words::titled_table("Verdict", &header, rows);
    for verdict in verdicts {
        let Some(guarded) = &verdict.guarded_writes else {
            continue;
        };
        let rows: Vec<Vec<String>> = guarded
            .iter()
            .map(|g| {
                vec![
                    guard_label(g.guard).to_string(),
                    stale_word(Some(&g.stale)),
                    g.final_writer.clone().unwrap_or("nobody".into()),
                ]
            })
            .collect();
        words
            .prose(format!(
                "  {}: A's stale write, resource by resource (read back from the store)",
                verdict.name
            ))
            .table(&["guard", "A's late write", "result kept"], rows)
            .blank();
    }
    // Wrapped here, as the walkthrough shows them: the meaning to 76 columns two in, what
    // prevents it to 74 four in, dimmed.
    let indented = |text: &str, width: usize| {
        let lines: Vec<String> = (crate::output::wrap(text, width).iter())
            .map(|line| format!("  {line}"))
            .collect();
        lines.join("\n")
    };
    for verdict in verdicts {
        words.prose(indented(
            &format!("{}: {}", verdict.name, verdict.meaning),
            76,
        ));
        for line in crate::output::wrap(&format!("prevented by: {}", verdict.prevented_by), 74) {
            words.aside(format!("  {line}"));
        }
    }
    for scenario in skipped {
        words.prose(indented(
            &format!(
                "{}: skipped. It needs masters lockslab starts itself (it kills, freezes and \
                 restarts them); run it without --master.",
                scenario.command_name()
            ),
            76,
        ));
    }
    words
}

/// The table's word for "granted twice within validity".
fn yes_no(twice: Option<bool>) -> String {
    match twice {
        Some(true) => "YES".red().bold().to_string(),
        Some(false) => "no".to_string(),
        None => "–".to_string(),
    }
}

/// The table's word for a stale write: taken, refused, or none.
fn stale_word(stale: Option<&StaleWrite>) -> String {
    match stale {
        None => "–".to_string(),
        Some(s) => match s.accepted {
            Some(true) => "ACCEPTED".red().bold().to_string(),
            Some(false) => "rejected".green().bold().to_string(),
            None => "none".to_string(),
        },
    }
}
