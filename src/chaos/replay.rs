//! `lockslab check` of a `lockslab chaos` run: every history it printed judged again by
//! [`super::rows::judge`] — the checker over what the clients heard and the store's
//! read-back in the history, and what leaves a history unknown — beside the line chaos
//! printed for it; then the hunt's counts again. [`check`] gives the same judgements as one
//! Report, each finding placed on the events of its history.

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::show::history_tag;
use super::unplayed::Unplayed;
use crate::check::chaos::{self, Judgement};
use crate::check::report::Report;
use crate::designs::Design;
use crate::events::Event;
use crate::labs::replay::{self, Replayed};
use crate::nemesis::schedule::Schedule;

/// `lines`: the run's `schedule` lines, one per history, each after its history's events.
pub fn replay(events: &[Event], lines: &[Value], verdict: &Value) -> Result<Replayed> {
    let (design, judged) = judge_each(events, lines, verdict)?;
    let mut replayed = Replayed::default();
    let (mut unsafe_, mut unknown, mut schedules) = (0, 0, 0);
    for Judged {
        index,
        line,
        report,
        ..
    } in judged
    {
        match report.judgement() {
            Judgement::Unsafe => unsafe_ += 1,
            Judgement::Unknown => unknown += 1,
            Judgement::Safe => {}
        }
        schedules += 1;
        let found = json!({
            "result": report.judgement(),
            "violations": report.violations,
            "unknowns": report.unknowns,
            "accepted": report.accepted,
            "attempts": report.attempts,
        });
        replayed.part(format!("schedule {index}"), line, found);
    }
    let counts = json!({ "schedules": schedules, "unsafe": unsafe_, "unknown": unknown });
    replayed.part(format!("the hunt on {}", design.name()), verdict, counts);
    if verdict.get("shrunk").is_some() {
        replayed.not_replayed.push(
            "the counterexample the hunt reports (`shrunk`, `violations`): shrinking plays \
             its histories without printing them"
                .into(),
        );
    }
    Ok(replayed)
}

/// The hunt's checker over its whole `--json`: each history judged again (as [`replay`]
/// judges it) and its findings placed on its events ([`super::findings::placed`]), named by
/// their schedule: one [`Report`] whose findings point into `events`.
pub fn check(events: &[Event], lines: &[Value], verdict: &Value) -> Result<Report> {
    let (_, judged) = judge_each(events, lines, verdict)?;
    Ok(Report::compose(judged.into_iter().map(|j| {
        super::findings::placed(&j.history, &j.report)
            .placed(&j.positions)
            .about(&format!("schedule {}", j.index))
    })))
}

/// One history of the hunt, judged again.
struct Judged<'a> {
    index: u64,
    /// Its `schedule` line.
    line: &'a Value,
    /// Its events, and where each stands in the run's.
    history: Vec<Event>,
    positions: Vec<usize>,
    report: chaos::Report,
}

/// Every history of the hunt judged again by [`super::rows::judge`], and the design.
fn judge_each<'a>(
    events: &[Event],
    lines: &'a [Value],
    verdict: &Value,
) -> Result<(Design, Vec<Judged<'a>>)> {
    let design: Design = serde_json::from_value(verdict["design"].clone())
        .context("the verdict names no design this lockslab knows")?;
    let given = verdict["given"].as_bool().unwrap_or(false);
    let mut judged = Vec::new();
    for line in lines.iter().filter(|l| l["kind"] == "schedule") {
        let index = replay::number(line, "index")?;
        let tag = history_tag(index);
        let (positions, history) =
            replay::part_with_positions(events, |e| e.part.scenario.as_deref() == Some(&tag));
        if history.is_empty() {
            bail!(
                "schedule {index}'s history is not in the file: it was recorded by a lockslab \
                 whose chaos printed one summary line per history and not the history; record \
                 the hunt again with this one (`lockslab chaos … --json > run.jsonl`)"
            );
        }
        let schedule: Schedule = serde_json::from_value(line["schedule"].clone())
            .with_context(|| format!("schedule {index}: its schedule does not read"))?;
        let unplayed: Vec<Unplayed> = match line.get("unplayed_steps") {
            Some(steps) => serde_json::from_value(steps.clone())
                .with_context(|| format!("schedule {index}: its unplayed steps do not read"))?,
            None => Vec::new(),
        };
        let report = super::rows::judge(&history, design, &unplayed, schedule.steps().len(), given);
        judged.push(Judged {
            index,
            line,
            history,
            positions,
            report,
        });
    }
    Ok((design, judged))
}
