//! The race's example: one broken trial, step by step, as the verdict shows it.

use colored::Colorize;
use serde::Serialize;

use crate::check::naive::{self as checks, RaceReport};
use crate::labs::Stage;

/// One broken trial of the race, as `--json` carries it in the verdict.
#[derive(Serialize, Debug, Clone)]
pub struct Example {
    pub trial: u32,
    /// How many workers held the lock together in it.
    pub holders: usize,
    /// The worker whose SET Redis ran last (its value survived).
    pub survivor: Option<String>,
    /// A worker whose SET is stamped after the survivor's, though Redis ran it before.
    pub overwritten_though_stamped_later: Option<String>,
    pub steps: Vec<ExampleStep>,
}

#[derive(Serialize, Debug, Clone)]
pub struct ExampleStep {
    /// Microseconds from the first step, on the workers' CLOCK_MONOTONIC.
    pub t_us: i64,
    pub worker: String,
    /// `get`, `set` or `done`.
    pub step: &'static str,
    pub text: &'static str,
}

/// One broken trial, step by step, from the workers' monotonic stamps: the first (up to)
/// three workers that held the lock together.
///
/// The stamps are client-side: a SET's stamp is when its answer *arrived*, not when Redis
/// ran it, so two SETs a few microseconds apart can be stamped in the opposite order. The
/// order Redis ran them in is told by what each release found — a value still in the key
/// had no SET run over it; a value gone had — and each step says that, so no line draws a
/// conclusion from the stamps that Redis's own answer contradicts.
pub(super) fn race_example(
    trial: u32,
    reports: &[RaceReport],
    pairs: &[(String, String)],
) -> Example {
    // Only asked "is this worker in it?", so repeats do no harm.
    let together: Vec<&str> = pairs
        .iter()
        .flat_map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    let mut by_entry: Vec<&RaceReport> = reports
        .iter()
        .filter(|r| together.contains(&r.worker.as_str()))
        .collect();
    by_entry.sort_by_key(|r| r.answer_ns);
    let holders = by_entry.len();
    let shown = &by_entry[..holders.min(3)];
    let mut steps: Vec<(i64, String, &str, &str)> = Vec::new();
    for report in shown {
        let worker = report.worker.clone();
        if let Some(t) = report.start_ns {
            steps.push((
                t,
                worker.clone(),
                "get",
                "GET: no holder, the lock looks free",
            ));
        }
        if let Some(t) = report.answer_ns {
            let text = match report.released {
                Some(true) => {
                    "SET → OK: believes it holds the lock (Redis ran no other SET over it: \
                     its value was still in the key at its release)"
                }
                Some(false) => {
                    "SET → OK: believes it holds the lock (Redis later ran another SET over it)"
                }
                None => "SET → OK: believes it holds the lock",
            };
            steps.push((t, worker.clone(), "set", text));
        }
        if let Some(t) = report.leave_ns {
            let text = if report.released == Some(true) {
                "done: compare-and-delete finds its own value and deletes the key"
            } else {
                // The key then holds another worker's value, or none if that worker has
                // already released: either way, this worker's own value is gone.
                "done: compare-and-delete finds its own value gone (another worker's SET overwrote it): deletes nothing"
            };
            steps.push((t, worker, "done", text));
        }
    }
    steps.sort_by_key(|s| s.0);
    let origin = steps.first().map(|s| s.0).unwrap_or(0);
    // Redis ran the surviving SET after the overwritten ones; say so when the stamps put it first.
    let order = checks::set_order(shown);
    Example {
        trial,
        holders,
        survivor: order.survivor,
        overwritten_though_stamped_later: order.overwritten_though_stamped_later,
        steps: steps
            .into_iter()
            .map(|(t, worker, step, text)| ExampleStep {
                t_us: (t - origin) / 1000,
                worker,
                step,
                text,
            })
            .collect(),
    }
}

pub(super) fn print_example(stage: &Stage, example: &Example) {
    let timeline = &stage.timeline;
    timeline.say("");
    timeline.say(&format!(
        "  One trial that broke (#{}), on the workers' CLOCK_MONOTONIC stamps (client-side: \
         when each answer arrived, not when Redis ran the command):",
        example.trial
    ));
    for step in &example.steps {
        let ms = step.t_us as f64 / 1000.0;
        timeline.say(&format!(
            "  {:>10}  {:<4} {}",
            format!("{ms:.3}ms").dimmed(),
            step.worker.bold(),
            step.text
        ));
    }
    if let (Some(kept), Some(other)) =
        (&example.survivor, &example.overwritten_though_stamped_later)
    {
        timeline.say(&format!(
            "  {}",
            format!(
                "By the stamps {kept}'s SET came before {other}'s, yet Redis ran a SET over \
                 {other}'s value and none over {kept}'s: stamps time the answers, Redis's \
                 answers tell what it ran."
            )
            .dimmed()
        ));
    }
    let holders = example.holders;
    if holders > 3 {
        timeline.say(&format!(
            "  {}",
            format!(
                "…and {} more workers held the lock in this trial at the same time",
                holders - 3
            )
            .dimmed()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn racer(name: &str, set_stamp: i64, kept_its_value: bool) -> RaceReport {
        RaceReport {
            worker: name.into(),
            acquired: true,
            start_ns: Some(set_stamp - 1_000),
            answer_ns: Some(set_stamp),
            enter_ns: Some(set_stamp + 500),
            leave_ns: Some(set_stamp + 5_000_000),
            released: Some(kept_its_value),
        }
    }

    /// Issue 10, item 3: W2's SET is stamped first, yet its value is the one Redis kept
    /// (Redis ran W1's SET before it). The example must not read as if W2's came first in
    /// Redis: each SET says what Redis's answers prove, and the contradiction is named.
    #[test]
    fn the_example_follows_redis_not_the_client_stamps() {
        let reports = [racer("W1", 2_000_000, false), racer("W2", 1_000_000, true)];
        let pairs = [("W1".to_string(), "W2".to_string())];
        let example = race_example(7, &reports, &pairs);
        assert_eq!(example.survivor.as_deref(), Some("W2"), "{example:?}");
        assert_eq!(
            example.overwritten_though_stamped_later.as_deref(),
            Some("W1"),
            "{example:?}"
        );
        let set_of = |worker: &str| {
            example
                .steps
                .iter()
                .find(|s| s.worker == worker && s.step == "set")
                .map(|s| s.text)
                .unwrap()
        };
        assert!(set_of("W2").contains("no other SET over it"), "{example:?}");
        assert!(set_of("W1").contains("another SET over it"), "{example:?}");
    }
}
