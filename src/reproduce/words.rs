//! How `lockslab check` says what it found: each part's fields as the replay reached them,
//! each disagreement with both values, and one line of answer.

use colored::Colorize;
use serde_json::Value;

use super::compare::{Compared, Field, PartCompared};
use super::{Judged, Recorded};
use crate::check::report::Outcome;
use crate::labs::replay::Replayed;
use crate::store::Attempt;

pub fn print(name: &str, recorded: &Recorded, replayed: &Replayed, compared: &Compared) {
    let (lab, run_id, version) = recorded.stamp();
    let field = crate::events::envelope::VERSION_FIELD;
    let version = version.map_or(String::new(), |v| format!(", {field} {v}"));
    crate::prose!(
        "{} {name}: lab {lab}, run {run_id}{version}, {} events",
        "lockslab check".bold(),
        recorded.events.len()
    );
    crate::prose!(
        "Each part judged again from its own events — what the workers, the servers and the \
         store answered — by the lab's own checkers, the code the live run judged it with. \
         No server was asked."
    );
    for part in &compared.parts {
        crate::outln!();
        print_part(part);
    }
    crate::outln!();
    for note in &replayed.notes {
        crate::prose!("Note: {note}.");
    }
    for left in &replayed.not_replayed {
        crate::prose!("Not replayed: {left}.");
    }
    let parts = compared.parts.len();
    let fields = compared.count_compared();
    if compared.agrees() {
        crate::prose!(
            "{} every field the history decides agrees with the recorded verdict ({fields} \
             fields in {parts} {}).",
            "Reproduced:".green().bold(),
            plural(parts, "part", "parts")
        );
    } else {
        let wrong = compared.count_disagreeing();
        crate::prose!(
            "{} {wrong} of {fields} {} the history decides {} with the recorded verdict (✗ \
             above). The history and the verdict tell different stories: one of them was \
             changed after the run, or this lockslab judges differently from the one that \
             recorded it.",
            "Not reproduced:".red().bold(),
            plural(fields, "field", "fields"),
            if wrong == 1 { "disagrees" } else { "disagree" }
        );
    }
}

fn print_part(part: &PartCompared) {
    let compared = part.compared().count();
    let wrong = part.disagreeing().count();
    let mark = if wrong == 0 {
        format!(
            "✓ {compared} {}",
            plural(compared, "field agrees", "fields agree")
        )
        .green()
    } else {
        format!("✗ {wrong} of {compared} disagree").red().bold()
    };
    crate::prose!("{}  {mark}", part.name.bold());
    let said = |f: &Field| format!("{} {}", f.name, shown(&f.replayed));
    let agreeing: Vec<String> = part.compared().filter(|f| f.agrees()).map(said).collect();
    if !agreeing.is_empty() {
        crate::prose!("  {}", agreeing.join(" · "));
    }
    let unrecorded: Vec<String> = part
        .fields
        .iter()
        .filter(|f| f.recorded.is_none())
        .map(said)
        .collect();
    if !unrecorded.is_empty() {
        crate::prose!(
            "  {}",
            format!(
                "not in this recording (an older lockslab), so not compared: {}",
                unrecorded.join(" · ")
            )
            .dimmed()
        );
    }
    for field in part.disagreeing() {
        print_disagreement(field);
    }
    if !part.as_recorded.is_empty() {
        crate::prose!(
            "  {}",
            format!(
                "as recorded, not decided from the history: {}",
                part.as_recorded.join(", ")
            )
            .dimmed()
        );
    }
}

fn print_disagreement(field: &Field) {
    let recorded = field.recorded.as_ref().unwrap_or(&Value::Null);
    let mark = "✗".red().bold();
    let name = field.name.bold();
    match (recorded, &field.replayed) {
        // Two lists: where they part, not both whole.
        (Value::Array(was), Value::Array(now)) => {
            crate::prose!(
                "  {mark} {name}: recorded {} {}, replayed {}",
                was.len(),
                if was.len() == 1 { "item" } else { "items" },
                now.len()
            );
            let at = (0..was.len().max(now.len()))
                .find(|&i| was.get(i) != now.get(i))
                .unwrap_or(0);
            let item = |list: &[Value]| list.get(at).map_or("nothing".into(), shown);
            crate::prose!("      item {}: recorded {}", at + 1, item(was));
            crate::prose!("      item {}: replayed {}", at + 1, item(now));
        }
        _ => crate::prose!(
            "  {mark} {name}: recorded {}, replayed {}",
            shown(recorded),
            shown(&field.replayed)
        ),
    }
}

/// A value as a reader says it: yes/no, `none` for null, a list of store attempts as
/// `writer:token→ok`, anything else as its JSON, cut short.
fn shown(value: &Value) -> String {
    match value {
        Value::Null => "none".into(),
        Value::Bool(true) => "yes".into(),
        Value::Bool(false) => "no".into(),
        Value::String(text) => text.clone(),
        Value::Array(items)
            if !items.is_empty() && items.iter().all(|i| i.get("writer").is_some()) =>
        {
            match serde_json::from_value::<Vec<Attempt>>(value.clone()) {
                Ok(attempts) => format!("[{}]", Attempt::words(&attempts)),
                Err(_) => value.to_string(),
            }
        }
        other => {
            let text = other.to_string();
            match text.char_indices().nth(120) {
                Some((at, _)) => format!("{}…", &text[..at]),
                None => text,
            }
        }
    }
}

/// How many of a finding's events its line names; the rest are counted.
const EVENTS_NAMED: usize = 4;

fn plural(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// The checker's report on the whole history: its outcome, then each finding with its
/// outcome, its sentence and the events that prove it — each by its number among the
/// file's events (from 1) and the time the lab stamped it, so a reader can go and look.
/// `Err` says why the run has no such report.
pub fn print_report(judged: &Result<Judged, &'static str>) {
    crate::outln!();
    let judged = match judged {
        Ok(judged) => judged,
        Err(why) => {
            crate::prose!("{} none of the checker's kind: {why}.", "Report:".bold());
            return;
        }
    };
    let report = &judged.report;
    let count = |outcome| report.with(outcome).count();
    crate::prose!(
        "{} {} — the run's checker on the whole history: {} invalid, {} unknown, {} valid \
         {}.",
        "Report:".bold(),
        coloured(report.outcome),
        count(Outcome::Invalid),
        count(Outcome::Unknown),
        count(Outcome::Valid),
        plural(report.findings.len(), "finding", "findings")
    );
    for finding in &report.findings {
        let mark = match finding.outcome {
            Outcome::Valid => "✓".green(),
            Outcome::Unknown => "?".yellow(),
            Outcome::Invalid => "✗".red().bold(),
        };
        crate::prose!(
            "  {mark} {} {}: {}.{}",
            finding.name.bold(),
            coloured(finding.outcome),
            finding.words,
            proof(judged, &finding.events)
        );
    }
}

/// An outcome's word in its colour.
fn coloured(outcome: Outcome) -> colored::ColoredString {
    match outcome {
        Outcome::Valid => outcome.as_str().green(),
        Outcome::Unknown => outcome.as_str().yellow(),
        Outcome::Invalid => outcome.as_str().red().bold(),
    }
}

/// ` Events: #12 B acquired at 1203 ms, …`: the events a finding points at — the first
/// few and the last (often the store's read-back, the proof that closes the case).
fn proof(judged: &Judged, at: &[usize]) -> String {
    let Some(&last) = at.last() else {
        return " No event decides it.".into();
    };
    let name = |i: usize| {
        let Some(e) = judged.history.get(i) else {
            return format!("(no event {i})");
        };
        let number = match judged.in_file.get(i).copied().flatten() {
            Some(n) => format!("#{}", n + 1),
            None => "(kept in the verdict)".into(),
        };
        format!("{number} {} {} at {} ms", e.worker, e.kind(), e.t_ms)
    };
    if at.len() <= EVENTS_NAMED {
        let named: Vec<String> = at.iter().map(|&i| name(i)).collect();
        return format!(" Events: {}.", named.join(", "));
    }
    let first: Vec<String> = at[..EVENTS_NAMED - 1].iter().map(|&i| name(i)).collect();
    let skipped = at.len() - EVENTS_NAMED;
    format!(
        " Events: {}, {skipped} more, and {}.",
        first.join(", "),
        name(last)
    )
}
