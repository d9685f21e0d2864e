//! Redlock's masters (lab 6), drawn one lane each, with the quorum's lane above them.
//!
//! A round's answers (`attempt.answers`: each master's reply) say which masters granted the
//! key: on each, the holder's bar runs from its grant to the first of its release, the
//! master's kill (a master without persistence loses its keys with it), an expiry the lab
//! made on that master (the simulated clock jump), or the key's TTL. The quorum's lane has
//! one bar per round that held a majority: held for the validity the algorithm computed
//! (or until the release), believed held until the release — so that a client that paused
//! past its validity shows its hatched tail, as a single lock's lane does. Two majorities at
//! once are marked "two holders" only where the lab's verdict found them
//! ([`super::model`] keeps the bands the verdict found).

use serde_json::Value;

use super::drawing::{Bar, Lane, LaneKind, Span, overlaps_where};
use crate::events::{Event, Kind};
use std::collections::BTreeMap;

/// The masters a round's answers name, in order (`m1`…`m5`).
pub(super) fn names(events: &[(usize, &Event)]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (_, event) in events {
        for (master, _) in answers(event, "attempt") {
            if !names.contains(&master) {
                names.push(master);
            }
        }
    }
    names.sort_by_key(|name| (name.len(), name.clone()));
    names
}

/// The one master an event names (`"master": "m3"`), if it names one.
pub(super) fn master_of(event: &Event) -> Option<String> {
    let value = serde_json::to_value(event).ok()?;
    value.get("master")?.as_str().map(str::to_string)
}

/// Each master's reply in a round (`attempt.answers`) or a release (`answers`).
fn answers(event: &Event, under: &str) -> Vec<(String, String)> {
    if !matches!(event.kind(), Kind::Acquired | Kind::GaveUp | Kind::Released) {
        return Vec::new();
    }
    let Ok(value) = serde_json::to_value(event) else {
        return Vec::new();
    };
    let list = match under {
        "attempt" => value.get("attempt").and_then(|a| a.get("answers")),
        _ => value.get("answers"),
    };
    list.and_then(Value::as_array)
        .map(|answers| {
            answers
                .iter()
                .filter_map(|answer| {
                    Some((
                        answer.get("master")?.as_str()?.to_string(),
                        answer.get("reply")?.as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn attempt_number(event: &Event, key: &str) -> Option<i64> {
    let value = serde_json::to_value(event).ok()?;
    value.get("attempt")?.get(key)?.as_i64()
}

/// The quorum's lane and one lane per master; empty when no round named a master.
pub(super) fn lanes(
    events: &[(usize, &Event)],
    masters: &[String],
    end: u64,
    everyone: &[String],
    freezes: &mut BTreeMap<String, Vec<Span>>,
) -> Vec<Lane> {
    if masters.is_empty() {
        return Vec::new();
    }
    let color = |holder: &str| everyone.iter().position(|w| w == holder).unwrap_or(0);
    // The holder's release after `t`: when, and what each master answered.
    let release_after = |holder: &str, t: u64| {
        events.iter().find_map(|(_, e)| {
            (e.kind() == Kind::Released && e.worker == holder && e.t_ms >= t)
                .then(|| (e.t_ms, answers(e, "answers")))
        })
    };
    let fault_after = |master: &str, t: u64, kinds: &[Kind]| {
        events.iter().find_map(|(_, e)| {
            let named = e.fault().and_then(|f| f.target.as_deref()) == Some(master)
                || (e.kind() == Kind::Expired && master_of(e).as_deref() == Some(master));
            (named && kinds.contains(&e.kind()) && e.t_ms >= t).then_some(e.t_ms)
        })
    };
    let mut quorum = Lane::new("redlock", LaneKind::Lock);
    let mut per_master: Vec<Lane> = masters
        .iter()
        .map(|m| Lane::new(m, LaneKind::Lock))
        .collect();
    for (_, event) in events {
        if event.kind() != Kind::Acquired {
            continue;
        }
        let granted: Vec<String> = answers(event, "attempt")
            .into_iter()
            .filter(|(_, reply)| reply == "granted")
            .map(|(master, _)| master)
            .collect();
        if granted.is_empty() {
            continue;
        }
        let t = event.t_ms;
        let holder = event.worker.clone();
        let release = release_after(&holder, t);
        let released_at = release.as_ref().map(|(at, _)| *at);
        let ttl = attempt_number(event, "ttl_ms").unwrap_or(0).max(0) as u64;
        let validity = attempt_number(event, "validity_ms").unwrap_or(0).max(0) as u64;
        let valid_to = t + validity;
        let (held_to, ended_by) = match released_at {
            Some(at) if at <= valid_to => (at, "released by its holder".to_string()),
            _ => (
                valid_to.min(end),
                format!("its validity ({validity}ms) ran out"),
            ),
        };
        let row = row_of(&mut quorum, &holder);
        quorum.bars.push(Bar {
            row,
            holder: holder.clone(),
            label: format!("{holder} · {} of {}", granted.len(), masters.len()),
            from: t,
            held_to,
            believed_to: released_at.unwrap_or(end).max(held_to),
            open: released_at.is_none() && valid_to > end,
            ended_by,
            color: color(&holder),
        });
        for master in &granted {
            let Some(lane) = per_master.iter_mut().find(|l| &l.name == master) else {
                continue;
            };
            let mut ends: Vec<(u64, String)> = Vec::new();
            if let Some((at, _)) = &release {
                ends.push((*at, "released by its holder".into()));
            }
            if let Some(at) = fault_after(master, t, &[Kind::Killed]) {
                ends.push((
                    at,
                    "killed: a master without persistence loses its keys".into(),
                ));
            }
            if let Some(at) = fault_after(master, t, &[Kind::Expired]) {
                ends.push((at, "the lab expired it on this master".into()));
            }
            if ttl > 0 {
                ends.push((t + ttl, "its TTL ran out".into()));
            }
            let (to, why) = ends
                .into_iter()
                .min_by_key(|(at, _)| *at)
                .unwrap_or((end, String::new()));
            let open = to > end;
            let row = row_of(lane, &holder);
            lane.bars.push(Bar {
                row,
                holder: holder.clone(),
                label: holder.clone(),
                from: t,
                held_to: to.min(end),
                believed_to: to.min(end),
                open,
                ended_by: why,
                color: color(&holder),
            });
        }
    }
    quorum.overlaps = overlaps_where(&quorum.bars, |_, _| true);
    for lane in &mut per_master {
        lane.freezes = freezes.remove(&lane.name).unwrap_or_default();
    }
    std::iter::once(quorum).chain(per_master).collect()
}

fn row_of(lane: &mut Lane, holder: &str) -> usize {
    match lane.rows.iter().position(|r| r == holder) {
        Some(row) => row,
        None => {
            lane.rows.push(holder.to_string());
            lane.rows.len() - 1
        }
    }
}
