//! A recorded run judged again: what each lab's `replay` hands to `lockslab check`.
//!
//! A lab's `--json` is its history (every event, the store's read-back among them) and
//! then its verdict. Each lab's `replay` takes the two apart again: for every part of the
//! verdict it picks that part's events and judges them with the same code the live run
//! used, and returns the fields it reached beside the recorded ones. Comparing them and
//! saying so is [`crate::reproduce`]'s; here are the pieces every lab's replay shares.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Map, Value};

use crate::events::facts::StoreRecord;
use crate::events::{Event, Kind, What};
use crate::store::ReadBack;

/// What a lab's replay reached.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Each part of the verdict judged again, in the verdict's order.
    pub parts: Vec<PartReplayed>,
    /// Parts of the verdict the replay leaves as recorded, each with why.
    pub not_replayed: Vec<String>,
    /// How the replay read the recording, where a reader should know (an older recording's
    /// read-back taken out of its verdict).
    pub notes: Vec<String>,
    /// The store's read-backs an older recording kept in its verdict and not in its
    /// history, as the events a recording of today would hold: with them the lab's checker
    /// can judge that history whole ([`Completion::completed`]).
    pub completions: Vec<Completion>,
}

/// A read-back taken out of the verdict, and where in the history it belongs: after the
/// last event of the part it was read for (at the end, where the part had none).
#[derive(Debug)]
pub struct Completion {
    pub after: Option<Event>,
    pub event: Event,
}

impl Completion {
    /// `events` with each completion's read-back after the event it belongs after, and for
    /// each event of the result its position in `events` (None for a read-back taken out of
    /// the verdict), so that a finding pointing at the result can be told in the file's terms.
    pub fn completed(
        events: &[Event],
        completions: &[Completion],
    ) -> (Vec<Event>, Vec<Option<usize>>) {
        // Where each read-back goes: after the file's event it names (None: at the end).
        let anchors: Vec<Option<usize>> = completions
            .iter()
            .map(|c| {
                c.after
                    .as_ref()
                    .and_then(|after| events.iter().rposition(|e| e == after))
            })
            .collect();
        let taken_after = |at: Option<usize>| {
            completions
                .iter()
                .zip(&anchors)
                .filter(move |(_, anchor)| **anchor == at)
                .map(|(c, _)| (c.event.clone(), None))
        };
        let whole: Vec<(Event, Option<usize>)> = events
            .iter()
            .enumerate()
            .flat_map(|(i, e)| std::iter::once((e.clone(), Some(i))).chain(taken_after(Some(i))))
            .chain(taken_after(None))
            .collect();
        whole.into_iter().unzip()
    }
}

/// One part of a verdict: the recorded object and the one the replay built.
#[derive(Debug)]
pub struct PartReplayed {
    /// How a reader names it: `with fencing`, `redis × freeze`.
    pub name: String,
    pub recorded: Value,
    /// The fields the replay decided. A field the recording does not have is one an older
    /// lockslab did not write; one only the recording has is not decided from the history
    /// (the plan's settings, times measured live): neither is compared.
    pub replayed: Map<String, Value>,
}

impl Replayed {
    /// Adds a part: `replayed` is anything that serializes to an object (a lab's own row).
    pub fn part(
        &mut self,
        name: impl Into<String>,
        recorded: &Value,
        replayed: impl Serialize,
    ) -> &mut PartReplayed {
        let replayed = match serde_json::to_value(replayed) {
            Ok(Value::Object(fields)) => fields,
            _ => Map::new(),
        };
        self.parts.push(PartReplayed {
            name: name.into(),
            recorded: recorded.clone(),
            replayed,
        });
        let last = self.parts.len() - 1;
        &mut self.parts[last]
    }

    pub fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        if !self.notes.contains(&note) {
            self.notes.push(note);
        }
    }

    /// `log` with the store's read-back in it: the one the history holds, or for a
    /// recording made before the read-back was an event, the one its verdict carries (the
    /// part's `attempts` and `final_*`, or `store` where `store_field` names it).
    pub fn with_read_back(
        &mut self,
        mut log: Vec<Event>,
        recorded: &Value,
        store_field: Option<&str>,
    ) -> Result<Vec<Event>> {
        if read_back_in(&log).is_none() {
            self.read_back_or_recorded(&log, None, recorded, store_field)?;
            if let Some(taken) = self.completions.last() {
                log.push(taken.event.clone());
            }
        }
        Ok(log)
    }

    /// The store's read-back of `resource` (any, if None) the history holds, or the one the
    /// verdict carries, for a recording made before the read-back was an event.
    pub fn read_back_or_recorded(
        &mut self,
        log: &[Event],
        resource: Option<&str>,
        recorded: &Value,
        store_field: Option<&str>,
    ) -> Result<ReadBack> {
        if let Some(read) = read_back_of(log, resource) {
            return Ok(read);
        }
        let carried = match store_field {
            Some(field) => &recorded[field],
            None => recorded,
        };
        let read: ReadBack = serde_json::from_value(carried.clone())
            .context("the history has no read_back and the verdict carries no store record")?;
        let mut event = Event::new(
            "store",
            StoreRecord::of(resource.unwrap_or(""), &read),
            "read back (kept in the verdict)",
        );
        if let Some(last) = log.last() {
            event.part = last.part.clone();
            event.t_ms = last.t_ms;
        }
        self.completions.push(Completion {
            after: log.last().cloned(),
            event,
        });
        self.note(
            "recorded before the store's read-back was an event of the history: the read-back \
             is taken from the verdict, where that lockslab kept it",
        );
        Ok(read)
    }
}

/// The store's last read-back of `resource` (of any resource, if None) in `log`.
pub fn read_back_of(log: &[Event], resource: Option<&str>) -> Option<ReadBack> {
    log.iter().rev().find_map(|e| match &e.what {
        What::ReadBack(record)
            if resource.is_none_or(|r| record.resource.as_deref() == Some(r)) =>
        {
            Some(record.read_back())
        }
        _ => None,
    })
}

/// The store's read-back a part's history holds (its last, if it read back twice).
pub fn read_back_in(log: &[Event]) -> Option<ReadBack> {
    read_back_of(log, None)
}

/// [`read_back_in`], or why there is none.
pub fn read_back(log: &[Event]) -> Result<ReadBack> {
    read_back_in(log).context("the store's read-back is missing from this part's history")
}

/// The verdict's list `field` (its runs, cells, scenarios…).
pub fn list<'a>(verdict: &'a Value, field: &str) -> Result<&'a Vec<Value>> {
    match verdict.get(field).and_then(Value::as_array) {
        Some(list) => Ok(list),
        None => bail!("the verdict has no `{field}` list, which this lab's verdict always has"),
    }
}

/// A text field of a recorded object.
pub fn text<'a>(object: &'a Value, field: &str) -> Result<&'a str> {
    object
        .get(field)
        .and_then(Value::as_str)
        .with_context(|| format!("`{field}` is missing from {}", short(object)))
}

/// A yes/no field of a recorded object.
pub fn flag(object: &Value, field: &str) -> Result<bool> {
    object
        .get(field)
        .and_then(Value::as_bool)
        .with_context(|| format!("`{field}` is missing from {}", short(object)))
}

/// A whole-number field of a recorded object.
pub fn number(object: &Value, field: &str) -> Result<u64> {
    object
        .get(field)
        .and_then(Value::as_u64)
        .with_context(|| format!("`{field}` is missing from {}", short(object)))
}

/// The events `belongs` picks, in order.
pub fn part_of(events: &[Event], belongs: impl Fn(&Event) -> bool) -> Vec<Event> {
    events.iter().filter(|e| belongs(e)).cloned().collect()
}

/// The events `belongs` picks, in order, and where each stands in `events`: a checker that
/// judges the part points its findings back into the whole history.
pub fn part_with_positions(
    events: &[Event],
    belongs: impl Fn(&Event) -> bool,
) -> (Vec<usize>, Vec<Event>) {
    (0..events.len())
        .filter(|&i| belongs(&events[i]))
        .map(|i| (i, events[i].clone()))
        .unzip()
}

/// The history cut where the lab announced each run (its `run` events): one piece per run,
/// in order, the events before the first left out. None when `runs` runs were not announced.
pub fn cut_at_runs(events: &[Event], runs: usize) -> Option<Vec<Vec<Event>>> {
    let starts: Vec<usize> = (0..events.len())
        .filter(|&i| events[i].is("lab", Kind::Run))
        .collect();
    if starts.len() != runs {
        return None;
    }
    Some(
        starts
            .iter()
            .enumerate()
            .map(|(n, &from)| {
                let to = starts.get(n + 1).copied().unwrap_or(events.len());
                events[from..to].to_vec()
            })
            .collect(),
    )
}

/// An object, short enough to name in an error.
fn short(object: &Value) -> String {
    let text = object.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}
