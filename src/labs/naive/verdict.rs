//! Lab 2's verdict: per scenario, the broken and the fixed run counted from Redis's evidence
//! (see [`crate::check::naive`]), the table and one sentence each.

use std::time::Duration;

use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{Plan, Scenario, pttl_text, short};
use crate::labs::runner;
use crate::output::{human, table};

/// One run (broken or fixed) of a scenario, counted from the evidence.
#[derive(Serialize, Debug, Clone)]
pub struct Tally {
    pub violations: u32,
    pub trials: u32,
    /// The evidence behind the count (holders lists, PTTL, waits…).
    #[serde(flatten)]
    pub details: Map<String, Value>,
}

impl Tally {
    pub(super) fn new(violations: u32, trials: u32) -> Tally {
        Tally {
            violations,
            trials,
            details: Map::new(),
        }
    }

    pub(super) fn with(mut self, key: &str, value: impl Into<Value>) -> Tally {
        self.details.insert(key.into(), value.into());
        self
    }

    fn detail_u64(&self, key: &str) -> Option<u64> {
        self.details.get(key).and_then(Value::as_u64)
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
    pub example: Option<Value>,
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

    fn print(&self) {
        print_verdicts(&self.scenarios);
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
    let waited = |t: &Tally| {
        t.detail_u64("waited_ms")
            .map(|ms| human(Duration::from_millis(ms)))
            .unwrap_or_default()
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
                    broken.detail_u64("most_at_once").unwrap_or(0)
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
                    broken
                        .details
                        .get("pttl_ms_after_wait")
                        .and_then(Value::as_i64)
                        .map(pttl_text)
                        .unwrap_or_default()
                )
            } else {
                format!("{how}, yet the lock came free, which the bug should not allow")
            };
            let tail = if fixed_ok {
                format!(
                    "with SET NX PX the lock lapsed with its TTL ({}) and B got it after {}",
                    human(plan.ttl),
                    waited(fixed)
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

fn print_verdicts(verdicts: &[ScenarioVerdict]) {
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
    crate::outln!();
    crate::prose!("{}", "Verdict (from Redis: the holder entries the workers wrote, in Redis's order; GET and PTTL)".bold());
    crate::prose!(
        "{}",
        table(
            &[
                "scenario",
                "violation counted",
                "broken lock",
                "count",
                "fixed lock",
                "count"
            ],
            &rows
        )
    );
    crate::outln!();
    for verdict in verdicts {
        crate::prose!(
            "  {} {}",
            format!("{}:", verdict.name).bold(),
            verdict.meaning
        );
    }
}
