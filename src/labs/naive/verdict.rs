//! Lab 2's verdict: per scenario, the broken and the fixed run counted from Redis's evidence
//! (see [`crate::check::naive`]), the table and one sentence each.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value, json};

use super::example::Example;

use super::{Plan, Scenario, pttl_text, short};
use crate::check::Finding;
use crate::check::naive as checks;
use crate::check::report::{self, Report};
use crate::events::Event;
use crate::events::What;
use crate::events::facts::Observed;
use crate::labs::replay::{self, Replayed};
use crate::labs::runner;
use crate::labs::words::Words;
use crate::output::human;

/// One run (broken or fixed) of a scenario, counted from the evidence.
#[derive(Serialize, Debug, Clone)]
pub struct Tally {
    pub violations: u32,
    pub trials: u32,
    /// The evidence behind the count, in the scenario's own terms.
    #[serde(flatten)]
    pub evidence: Evidence,
}

/// What a scenario's run measured besides its count.
#[derive(Serialize, Debug, Clone)]
#[serde(untagged)]
pub enum Evidence {
    Race(RaceEvidence),
    Stuck(StuckEvidence),
    WrongRelease(WrongReleaseEvidence),
}

/// The race: how often, how many at once, and the clocks' view beside Redis's.
#[derive(Serialize, Debug, Clone)]
pub struct RaceEvidence {
    /// Trials broken per trial, to three decimals.
    pub rate: f64,
    /// Trials in which the workers' CLOCK_MONOTONIC stamps overlap.
    pub clock_overlaps: u32,
    /// The most workers that believed they held the lock in one trial.
    pub most_at_once: usize,
    /// Workers, over all trials, that believed they held the lock.
    pub believers: u32,
    pub took_ms: u64,
}

/// A holder died: did its lock ever come free?
#[derive(Serialize, Debug, Clone)]
pub struct StuckEvidence {
    pub next_holder_got_lock: bool,
    /// How long B asked before it got the lock or gave up.
    pub waited_ms: u64,
    /// From A's kill to B's grant (none: B never got it, or a run recorded before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted_after_kill_ms: Option<u64>,
    /// The key's PTTL after the wait: -1 no expiry, -2 gone.
    pub pttl_ms_after_wait: i64,
    pub ttl_ms: u64,
}

/// A release that deletes whatever is in the key.
#[derive(Serialize, Debug, Clone)]
pub struct WrongReleaseEvidence {
    /// Redis's holders list, in the order it granted.
    pub holders_list: Vec<String>,
    pub overlaps: Vec<OverlapSeen>,
    pub c_got_lock: bool,
}

/// Two workers in the lock at once, and why the second could get in.
#[derive(Serialize, Debug, Clone)]
pub struct OverlapSeen {
    pub holders: [String; 2],
    #[serde(skip_serializing_if = "Option::is_none")]
    pub second_entered_after_ms: Option<u64>,
    pub cause: &'static str,
}

/// Wrong-release's pairs of holders, from Redis's holders list and the workers' grant
/// stamps in the history: each pair that held the lock at once, and why. The live run and
/// `lockslab check` count wrong-release this way.
pub fn overlaps_seen(list: &[String], log: &[Event], ttl: Duration) -> (u32, Vec<OverlapSeen>) {
    let pairs = checks::replay(list).pairs;
    let entered: HashMap<String, u64> = log
        .iter()
        .filter_map(|e| match &e.what {
            What::Acquired(got) => Some((e.worker.clone(), got.enter_ns?)),
            _ => None,
        })
        .collect();
    let found = checks::overlaps(&pairs, &entered, ttl);
    let seen = found
        .iter()
        .map(|o| OverlapSeen {
            holders: [o.first.clone(), o.second.clone()],
            second_entered_after_ms: o.gap.map(|g| g.as_millis() as u64),
            cause: o.cause.as_str(),
        })
        .collect();
    (checks::deleted_live_locks(&found), seen)
}

/// `lockslab check`: each scenario's two runs counted again from their own events —
/// Redis's answers the lab recorded (the key read back after the wait, the holders lists)
/// and the workers' grants — by the lab's checkers.
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let mut replayed = Replayed::default();
    // The lease the fixed runs played with: the stuck scenarios state it, a PTTL read shows it.
    let ttl_ms = replay::list(verdict, "scenarios")?
        .iter()
        .find_map(|s| s["fixed"]["ttl_ms"].as_u64())
        .or_else(|| lease_read(events));
    for scenario in replay::list(verdict, "scenarios")? {
        let name = replay::text(scenario, "name")?;
        for variant in ["broken", "fixed"] {
            let log = part_log(events, name, variant);
            let Some(found) = judge_part(name, &log, ttl_ms)? else {
                replayed.not_replayed.push(format!("{name}: {NO_LEASE}"));
                continue;
            };
            replayed.part(format!("{name} ({variant})"), &scenario[variant], found.row);
        }
    }
    Ok(replayed)
}

/// Why wrong-release cannot be judged without the lease.
const NO_LEASE: &str = "the recording does not state the lease (played without the stuck \
                        scenarios), which tells a lease that ran out from a lock deleted";

/// The lease the fixed runs played with, as a PTTL read in the history shows it.
fn lease_read(events: &[Event]) -> Option<u64> {
    events.iter().find_map(|e| match &e.what {
        What::Pttl(p) if e.part.variant.as_deref() == Some("fixed") => {
            (p.pttl_ms > 0).then_some(p.pttl_ms as u64)
        }
        _ => None,
    })
}

/// The events of one scenario's broken or fixed run.
fn part_log(events: &[Event], name: &str, variant: &str) -> Vec<Event> {
    replay::part_of(events, |e| {
        e.part.scenario.as_deref() == Some(name) && e.part.variant.as_deref() == Some(variant)
    })
}

/// One scenario's run judged from its events: the verdict's row, its count of violations,
/// and where in `log` Redis's answer that decided it is.
struct PartFound {
    row: Value,
    violations: u64,
    proof: usize,
}

/// Judges one scenario's run (broken or fixed) from Redis's answers in its events; None for
/// wrong-release when the lease is not known.
fn judge_part(name: &str, log: &[Event], ttl_ms: Option<u64>) -> Result<Option<PartFound>> {
    let said = |pick: fn(&Observed) -> bool| {
        log.iter().enumerate().find_map(|(at, e)| {
            let observed = e.observed().filter(|o| e.worker == "redis" && pick(o))?;
            Some((at, observed))
        })
    };
    let (proof, row, violations) = match name {
        "no-ttl" | "setnx-expire" => {
            let (at, key) = said(|o| o.dead_owner.is_some())
                .context("the key read back after B's wait is not in the history")?;
            let a_owner = log
                .iter()
                .filter(|e| e.worker == "A")
                .find_map(Event::owner);
            let dead = checks::dead_owner(key.key_owner.as_deref(), a_owner);
            let violations = u32::from(dead == Finding::Yes);
            (at, json!({ "violations": violations }), violations as u64)
        }
        "wrong-release" => {
            let Some(ttl_ms) = ttl_ms else {
                return Ok(None);
            };
            let (at, list) = said(|o| o.holders.is_some())
                .and_then(|(at, o)| Some((at, o.holders.clone()?)))
                .context("Redis's holders list is not in the history")?;
            let (violations, overlaps) = overlaps_seen(&list, log, Duration::from_millis(ttl_ms));
            let row =
                json!({ "violations": violations, "holders_list": list, "overlaps": overlaps });
            (at, row, violations as u64)
        }
        "race" => {
            let (at, per_trial) = said(|o| o.holders_per_trial.is_some())
                .and_then(|(at, o)| Some((at, o.holders_per_trial.clone()?)))
                .context("the race's holders per trial are not in the history")?;
            let violations = per_trial.iter().filter(|&&h| h >= 2).count();
            let row = json!({
                "violations": violations,
                "most_at_once": per_trial.iter().max(),
                "trials": per_trial.len(),
            });
            (at, row, violations as u64)
        }
        other => bail!("an unknown scenario: {other}"),
    };
    Ok(Some(PartFound {
        row,
        violations,
        proof,
    }))
}

/// Lab 2's checker: the whole history judged as one [`Report`], one finding per scenario and
/// run (broken or fixed): **mutual exclusion**, invalid when Redis's own answers (a dead
/// owner's key still there, a holders list with overlaps, two holders in one race trial)
/// show the lock broken, each pointing at that answer. A part whose answer is missing, or
/// wrong-release without a known lease, is unknown. Positions are in `history`.
pub fn check(history: &[Event]) -> Report {
    let ttl_ms = lease_read(history);
    let mut parts: Vec<(&str, &str)> = Vec::new();
    for event in history {
        if let (Some(name), Some(variant)) = (
            event.part.scenario.as_deref(),
            event.part.variant.as_deref(),
        ) && !parts.contains(&(name, variant))
        {
            parts.push((name, variant));
        }
    }
    Report::of(parts.into_iter().map(|(name, variant)| {
        let (positions, log) = replay::part_with_positions(history, |e| {
            e.part.scenario.as_deref() == Some(name) && e.part.variant.as_deref() == Some(variant)
        });
        let title = format!("mutual exclusion ({name}, {variant})");
        let (outcome, words, events) = match judge_part(name, &log, ttl_ms) {
            Ok(Some(found)) if found.violations > 0 => (
                report::Outcome::Invalid,
                format!(
                    "Redis's answers show the lock broken {} time(s)",
                    found.violations
                ),
                vec![positions[found.proof]],
            ),
            Ok(Some(found)) => (
                report::Outcome::Valid,
                "Redis's answers show no second holder".to_string(),
                vec![positions[found.proof]],
            ),
            Ok(None) => (report::Outcome::Unknown, NO_LEASE.to_string(), Vec::new()),
            Err(why) => (report::Outcome::Unknown, format!("{why:#}"), Vec::new()),
        };
        report::Finding::new(title, outcome, words, events)
    }))
}

impl Tally {
    pub(super) fn new(violations: u32, trials: u32, evidence: Evidence) -> Tally {
        Tally {
            violations,
            trials,
            evidence,
        }
    }
}

#[derive(Serialize, Debug, Clone)]
pub struct ScenarioVerdict {
    #[serde(skip)]
    pub scenario: Scenario,
    pub name: &'static str,
    pub broken: Tally,
    pub fixed: Tally,
    /// One sentence on what the two runs show.
    pub meaning: String,
    /// race: one broken trial, step by step, from the workers' monotonic stamps.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub example: Option<Example>,
}

/// Every scenario the run played, in order.
pub struct Verdict {
    pub scenarios: Vec<ScenarioVerdict>,
}

impl runner::Verdict for Verdict {
    fn fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert(
            "scenarios".into(),
            serde_json::to_value(&self.scenarios).unwrap_or_default(),
        );
        fields
    }

    fn words(&self) -> Words {
        verdict_words(&self.scenarios)
    }

    fn headline(&self) -> String {
        let broke = |t: &Tally| if t.violations > 0 { "broke" } else { "held" };
        let scenarios: Vec<String> = self
            .scenarios
            .iter()
            .map(|s| {
                format!(
                    "{}: bug {}, fix {}",
                    s.name,
                    broke(&s.broken),
                    broke(&s.fixed)
                )
            })
            .collect();
        scenarios.join(" · ")
    }

    fn checkpoint(&self) -> Option<&'static crate::labs::step::Checkpoint> {
        Some(&crate::labs::step::naive::VERDICT)
    }
}

/// A scenario's verdict from its two runs' tallies.
pub(super) fn scenario(
    scenario: Scenario,
    broken: Tally,
    fixed: Tally,
    plan: &Plan,
) -> ScenarioVerdict {
    let meaning = meaning(scenario, &broken, &fixed, plan);
    ScenarioVerdict {
        scenario,
        name: scenario.name(),
        broken,
        fixed,
        meaning,
        example: None,
    }
}

/// One sentence on what a scenario's two runs show.
fn meaning(scenario: Scenario, broken: &Tally, fixed: &Tally, plan: &Plan) -> String {
    let waited = |t: &Tally| match &t.evidence {
        Evidence::Stuck(stuck) => human(Duration::from_millis(stuck.waited_ms)),
        _ => String::new(),
    };
    let granted = |t: &Tally| match &t.evidence {
        Evidence::Stuck(StuckEvidence {
            granted_after_kill_ms: Some(ms),
            ..
        }) => format!("{} after A's kill", human(Duration::from_millis(*ms))),
        _ => format!("after asking for {}", waited(t)),
    };
    let fixed_ok = fixed.violations == 0;
    match scenario {
        Scenario::Race => {
            let head = if broken.violations == 0 {
                format!(
                    "GET-then-SET got lucky this time: no trial broke (try a --window above {})",
                    short(plan.window)
                )
            } else {
                format!(
                    "GET-then-SET let two or more workers hold the lock at once in {} of {} trials (up to {} together)",
                    broken.violations,
                    broken.trials,
                    match &broken.evidence {
                        Evidence::Race(race) => race.most_at_once,
                        _ => 0,
                    }
                )
            };
            let tail = if fixed_ok {
                "SET NX let exactly one in, every time"
            } else {
                "SET NX broke too, which it should not: look at the holders lists"
            };
            format!("{head}; {tail}.")
        }
        Scenario::NoTtl | Scenario::SetnxExpire => {
            let how = if scenario == Scenario::NoTtl {
                "A died holding a key with no TTL"
            } else {
                "A died between SETNX and PEXPIRE"
            };
            let head = if broken.violations > 0 {
                format!(
                    "{how}: after {} the key still named it, with PTTL {}: no expiry will ever remove it (only a DEL, a FLUSHALL, eviction under an allkeys-* policy, or a restart without persistence)",
                    human(plan.wait),
                    match &broken.evidence {
                        Evidence::Stuck(stuck) => pttl_text(stuck.pttl_ms_after_wait),
                        _ => String::new(),
                    }
                )
            } else {
                format!("{how}, yet the lock came free, which the bug should not allow")
            };
            let tail = if fixed_ok {
                format!(
                    "with SET NX PX the lock lapsed with its TTL ({}) and B got it {}",
                    human(plan.ttl),
                    granted(fixed)
                )
            } else {
                "with SET NX PX, B still did not get the lock: look at the timeline".into()
            };
            format!("{head}; {tail}.")
        }
        Scenario::WrongRelease => {
            let head = if broken.violations > 0 {
                "A's DEL removed B's live lock and C took it while B still worked: two holders"
            } else {
                "A's DEL did not let anyone in this time"
            };
            let tail = if fixed_ok {
                "with compare-and-delete A's release deleted nothing (the script returned 0), B kept the lock and C was turned away"
            } else {
                "compare-and-delete still let someone in: look at the holders list"
            };
            format!("{head}; {tail}.")
        }
    }
}

/// The verdict's words: a row per scenario, then a sentence on each.
fn verdict_words(verdicts: &[ScenarioVerdict]) -> Words {
    let count = |t: &Tally, broken: bool| {
        let text = if t.trials > 1 {
            format!(
                "{}/{} ({:.1}%)",
                t.violations,
                t.trials,
                t.violations as f64 * 100.0 / t.trials as f64
            )
        } else {
            format!("{}/{}", t.violations, t.trials)
        };
        match (t.violations > 0, broken) {
            (true, _) => text.red().bold().to_string(),
            (false, false) => text.green().bold().to_string(),
            (false, true) => text,
        }
    };
    let rows: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            let (broken, fix) = v.scenario.broken_and_fix();
            vec![
                v.name.to_string(),
                v.scenario.counted().to_string(),
                broken.to_string(),
                count(&v.broken, true),
                fix.to_string(),
                count(&v.fixed, false),
            ]
        })
        .collect();
    let header = [
        "scenario",
        "violation counted",
        "broken lock",
        "count",
        "fixed lock",
        "count",
    ];
    let mut words = Words::titled_table(
        "Verdict (from Redis: the holder entries the workers wrote, in Redis's order; GET and PTTL)",
        &header,
        rows,
    );
    for verdict in verdicts {
        words.about(verdict.name, verdict.meaning.clone());
    }
    words
}
