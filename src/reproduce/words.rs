//! How `lockslab check` says what it found: each part's fields as the replay reached them,
//! each disagreement with both values, and one line of answer.

use colored::Colorize;
use serde_json::Value;

use super::Recorded;
use super::compare::{Compared, Field, PartCompared};
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

fn plural(n: usize, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}
