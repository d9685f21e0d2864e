//! A lab's schedule played by chaos: what `--json` printed for a lab (its verdict line, or
//! the whole output) picked apart, and the lab's names put on chaos's run.
//!
//! The rule, one for every lab — **each name keeps its role**:
//!
//! - a **client** keeps its name when chaos's run has it (`A`, `B`, `C`…); any other
//!   client name (`w1`, `c2`, `W1`, `L2`…) takes, in the order the schedule first names
//!   them, the first of chaos's client names the schedule does not name itself;
//! - a **path** `X→S` keeps its client side by the rule above; its server side `store`
//!   stays the store, and a lock server (`redis`, `etcd`, `postgres`) becomes the design's
//!   own lock server (lab 8's `A→redis` is `A→etcd` on an etcd design);
//! - a **server** keeps its name when the design has it (`redis`, `redis-aof` on one
//!   Redis, `m1`…`m5` on Redlock's masters, `etcd-leader`); etcd's `etcd` is its leader;
//! - an **event** a step waits for keeps its name when chaos's clients report it; a lab
//!   worker's `freezing` (about to stop, lock in hand, before its write) and `checked`
//!   (its last look before the write) are chaos's `working`, the same point of the job.
//!
//! What has no counterpart — a Redlock master when the design has one Redis, a Redis when
//! it has etcd, more clients than the run has, an event chaos's clients never report — is
//! refused before anything starts, by one line naming the step and what to write instead.
//! Every step the rule changed is said on the run's timeline (and in `--json`'s verdict as
//! `mapped`), so that a replay never passes for another schedule.

use anyhow::Result;
use serde_json::Value;

use super::net;
use crate::designs::Design;
use crate::nemesis::generate::{self, PATH_ARROW, STORE};

/// The events a chaos client reports, which a step's `after` may wait for.
pub const CLIENT_EVENTS: [&str; 5] = ["acquired", "read_record", "working", "wrote", "released"];

/// A lab worker's events that are one of chaos's clients' points of the job.
const SAME_POINT: [(&str, &str); 2] = [("freezing", "working"), ("checked", "working")];

/// The names a server goes by in a lab's schedule or in chaos's (never a client's).
fn is_server(name: &str) -> bool {
    let master = name.strip_prefix('m').is_some_and(|rest| {
        let digits = rest.trim_end_matches("-aof");
        !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit())
    });
    master
        || matches!(
            name,
            "redis" | "redis-aof" | "redis-primary" | "etcd" | "etcd-leader" | "postgres" | STORE
        )
}

/// The schedule `text` holds: a JSON array of steps as it is; a JSON object (a `--json`
/// verdict line) by its `schedule`, `shrunk` (chaos's own) or `schedules` (a lab whose
/// parts played several: `part` picks one, from 1); JSON Lines (a lab's whole `--json`
/// output) by its verdict line's.
pub fn pick(text: &str, part: Option<usize>) -> Result<Value> {
    let whole = serde_json::from_str::<Value>(text);
    let verdict = match whole {
        Ok(Value::Array(steps)) => return Ok(Value::Array(steps)),
        Ok(object @ Value::Object(_)) => object,
        Ok(other) => crate::bail_usage!("--schedule: not a schedule ({other})"),
        Err(err) if text.trim_start().starts_with('[') => {
            crate::bail_usage!("--schedule: not a schedule ({err})")
        }
        Err(err) => {
            let lines = text.lines().filter(|line| !line.trim().is_empty());
            let objects: Vec<Value> = lines.filter_map(|l| serde_json::from_str(l).ok()).collect();
            match objects.into_iter().rfind(|o| o["kind"] == "verdict") {
                Some(verdict) => verdict,
                None => crate::bail_usage!(
                    "--schedule: not a schedule, a verdict line or a lab's --json output ({err})"
                ),
            }
        }
    };
    for field in ["schedule", "shrunk"] {
        if let Some(steps @ Value::Array(_)) = verdict.get(field) {
            return Ok(steps.clone());
        }
    }
    let Some(Value::Array(several)) = verdict.get("schedules") else {
        crate::bail_usage!(
            "--schedule: neither a JSON array of steps nor a verdict line carrying one (a \
             lab's --json verdict has `schedule` or `schedules`)"
        );
    };
    match (part, several.len()) {
        (None, 1) => Ok(several[0].clone()),
        (Some(n), len) if (1..=len).contains(&n) => Ok(several[n - 1].clone()),
        (_, len) => crate::bail_usage!(
            "--schedule: this verdict holds {len} schedules, one per part the lab played: \
             name one after a '#', from 1 to {len} (e.g. --schedule 'FILE#2')"
        ),
    }
}

/// The servers a step may restart: the design's own (a design with neither Redis nor etcd
/// has none, and a restart aimed at one would never play).
pub fn servers_of(design: Design) -> Vec<String> {
    if design.uses_masters() {
        super::redlock_lane::restart_targets()
    } else if design.uses_etcd() {
        vec![generate::ETCD_LEADER.to_string()]
    } else if design.uses_redis() {
        let primary = generate::REDIS_PRIMARY.to_string();
        vec!["redis".to_string(), "redis-aof".to_string(), primary]
    } else {
        Vec::new()
    }
}

/// A step in a few words, as a refusal and the timeline name it: `pause w1 after w1's
/// freezing`.
fn words(step: &Value) -> String {
    let field = |name: &str| step.get(name).and_then(Value::as_str).unwrap_or("?");
    let mut words = format!("{} {}", field("fault"), field("target"));
    if let Some(after) = step.get("after") {
        let worker = after.get("worker").and_then(Value::as_str).unwrap_or("?");
        words += &format!(" after {worker}'s {}", after["event"]).replace('"', "");
    }
    words
}

/// Why a step has no counterpart on chaos's run: one line, naming the step.
fn refusal(n: usize, step: &str, why: &str) -> anyhow::Error {
    crate::exit::UsageError(format!("--schedule: step {} ({step}): {why}", n + 1)).into()
}

/// The clients an entry names, in the order it names them: its target's (or its path's
/// client side), then its anchor's workers.
fn clients_named(entry: &Value) -> Vec<&str> {
    let mut named = Vec::new();
    if let Some(target) = entry.get("target").and_then(Value::as_str) {
        match target.split_once(PATH_ARROW) {
            Some((client, _)) => named.push(client),
            // A partition's sides: every host in them that is not a server's.
            None => named.extend(
                (target.split(SIDE_MARKS).map(str::trim))
                    .filter(|host| !host.is_empty() && !is_server(host)),
            ),
        }
    }
    if let Some(after) = entry.get("after") {
        let more = ["and", "or"].into_iter().filter_map(|list| after.get(list));
        let points = more.filter_map(Value::as_array).flatten();
        for point in std::iter::once(after).chain(points) {
            named.extend(point.get("worker").and_then(Value::as_str));
        }
    }
    named
}

/// Each client name of a lab's schedule with its name on chaos's run (the module's rule):
/// chaos's own names first, kept; then the others, in the order first named, on the
/// names left. Too many: the first step that names one too many, refused.
fn client_names(entries: &[Value], clients: &[String]) -> Result<Vec<(String, String)>> {
    let mut taken: Vec<(String, String)> = Vec::new();
    for entry in entries {
        for name in clients_named(entry) {
            if clients.iter().any(|c| c == name) && !taken.iter().any(|(lab, _)| lab == name) {
                taken.push((name.to_string(), name.to_string()));
            }
        }
    }
    for (n, entry) in entries.iter().enumerate() {
        for name in clients_named(entry) {
            if taken.iter().any(|(lab, _)| lab == name) {
                continue;
            }
            let free = (clients.iter()).find(|c| !taken.iter().any(|(_, t)| t == *c));
            let Some(free) = free else {
                let why = format!(
                    "{name} is one client more than chaos's run has ({}): pass --clients {}",
                    clients.len(),
                    taken.len() + 1
                );
                return Err(refusal(n, &words(entry), &why));
            };
            taken.push((name.to_string(), free.clone()));
        }
    }
    Ok(taken)
}

/// Puts a lab's names on chaos's run of `design` with `clients` (the module's rule), in
/// place; returns a line for each step it changed, for the timeline.
pub fn map(steps: &mut Value, clients: &[String], design: Design) -> Result<Vec<String>> {
    let Some(entries) = steps.as_array_mut() else {
        return Ok(Vec::new());
    };
    let names = client_names(entries, clients)?;
    let client = |lab: &str| match names.iter().find(|(name, _)| name == lab) {
        Some((_, chaos)) => chaos.clone(),
        None => lab.to_string(),
    };
    let servers = servers_of(design);
    let mut notes = Vec::new();
    for (n, entry) in entries.iter_mut().enumerate() {
        // A probe asks a backend a question; only the fault steps are chaos's to map.
        if entry.get("probe").is_some() {
            continue;
        }
        let before = words(entry);
        if let Some(why) = no_counterpart(entry) {
            return Err(refusal(n, &before, why));
        }
        if let Some(Value::String(target)) = entry.get_mut("target") {
            *target = match target.split_once(PATH_ARROW) {
                Some((lab, server)) => {
                    let server = match server {
                        "redis" | "etcd" | "postgres" => net::lock_server(design),
                        other => other,
                    };
                    format!("{}{PATH_ARROW}{server}", client(lab))
                }
                None if is_server(target) => {
                    server(target, design, &servers).map_err(|why| refusal(n, &before, &why))?
                }
                // A partition's sides: each client's host on its name on chaos's run.
                None if target.contains(SIDE_MARKS) => sides(target, &client),
                None => client(target),
            };
        }
        if let Some(after) = entry.get_mut("after") {
            map_point(after, &client).map_err(|why| refusal(n, &before, &why))?;
            for list in ["and", "or"] {
                for point in after
                    .get_mut(list)
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    map_point(point, &client).map_err(|why| refusal(n, &before, &why))?;
                }
            }
        }
        let now = words(entry);
        if now != before {
            notes.push(format!("step {}: {before} plays as {now}", n + 1));
        }
    }
    Ok(notes)
}

/// What splits a partition's sides (`|`) and the hosts of a side (`,`).
const SIDE_MARKS: [char; 2] = ['|', ','];

/// A partition's sides with each client's host named as on chaos's run (`w1|m1,m2` →
/// `A|m1,m2`); a server's host keeps its name.
fn sides(target: &str, client: &impl Fn(&str) -> String) -> String {
    let side = |side: &str| {
        let hosts: Vec<String> = (side.split(',').map(str::trim))
            .map(|host| match is_server(host) {
                true => host.to_string(),
                false => client(host),
            })
            .collect();
        hosts.join(",")
    };
    target.split('|').map(side).collect::<Vec<_>>().join("|")
}

/// Why a lab's fault has no counterpart among chaos's, and what to write instead: lab 8
/// holds a path until an event heals it, where chaos holds it for a time.
fn no_counterpart(entry: &Value) -> Option<&'static str> {
    match entry.get("fault").and_then(Value::as_str)? {
        "hold" => Some(
            "chaos holds a path for a time, not until an event: write \"fault\": \"delay\" \
             with a \"duration_ms\" instead (a client's path to the store), and drop its heal",
        ),
        "heal" => Some(
            "chaos heals a delay or a cut itself, after its duration_ms: drop the step, and \
             give the delay or the cut it ends a duration_ms",
        ),
        _ => None,
    }
}

/// An anchor's point on chaos's run: its worker as a client, its events as chaos's
/// clients'; or why it has none.
fn map_point(point: &mut Value, client: &impl Fn(&str) -> String) -> Result<(), String> {
    if let Some(Value::String(worker)) = point.get_mut("worker") {
        *worker = client(worker);
    }
    let events: Vec<&mut Value> = match point.get_mut("event") {
        Some(Value::Array(list)) => list.iter_mut().collect(),
        Some(one) => vec![one],
        None => Vec::new(),
    };
    for event in events {
        let Value::String(name) = event else { continue };
        if let Some((_, chaos)) = SAME_POINT.iter().find(|(lab, _)| lab == name) {
            *name = chaos.to_string();
        } else if !CLIENT_EVENTS.contains(&name.as_str()) {
            return Err(format!(
                "chaos's clients never report {name}: wait for one of {} instead",
                CLIENT_EVENTS.join(", ")
            ));
        }
    }
    Ok(())
}

/// A server's name on the design's run, or why it has none (and what to write instead).
fn server(name: &str, design: Design, servers: &[String]) -> Result<String, String> {
    if servers.iter().any(|s| s == name) {
        return Ok(name.to_string());
    }
    if name == "etcd" && design.uses_etcd() {
        return Ok(generate::ETCD_LEADER.to_string());
    }
    let what = match name {
        "redis" | "redis-aof" | "redis-primary" => "a Redis",
        "etcd" | "etcd-leader" => "etcd",
        "postgres" | STORE => "the store",
        _ => "a Redlock master",
    };
    let instead = match servers {
        [] => "chaos restarts no server of it: drop the step".to_string(),
        [one, two, three] => {
            format!("write \"target\": \"{one}\", \"{two}\" or \"{three}\" instead")
        }
        [one] => format!("write \"target\": \"{one}\" instead"),
        [first, .., last] => {
            format!("write \"target\": one of \"{first}\" … \"{last}\" instead")
        }
    };
    Err(format!(
        "{name} is {what}, which {} does not have; {instead}",
        design.name()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chaos_clients() -> Vec<String> {
        super::super::play::client_names(3)
    }

    /// Lab 1's schedule with a token restart: A paused once it says it is freezing, and
    /// Redis restarted then. A keeps its name; `freezing` is chaos's `working`.
    #[test]
    fn a_lab_client_keeps_a_name_chaos_has_and_freezing_is_working() {
        let mut steps = json!([
            {"after": {"event": "freezing", "nth": 1, "worker": "A"}, "at_ms": 0,
             "duration_ms": 3000, "fault": "pause", "target": "A"},
            {"after": {"event": "freezing", "nth": 1, "worker": "A"}, "at_ms": 0,
             "fault": "restart", "target": "redis"}]);
        let notes = map(&mut steps, &chaos_clients(), Design::RedisLock).unwrap();
        assert_eq!(steps[0]["after"]["event"], "working");
        assert_eq!(steps[1]["target"], "redis");
        assert_eq!(
            notes[0],
            "step 1: pause A after A's freezing plays as pause A after A's working"
        );
    }

    /// Other names take chaos's free names in the order first named (B is the lab's own
    /// and stays B); a path's lock server is the design's.
    #[test]
    fn other_clients_take_the_free_names_and_a_path_its_designs_lock_server() {
        let mut steps = json!([
            {"at_ms": 0, "after": {"worker": "B", "event": "acquired"}, "fault": "cut",
             "target": "w2→redis", "duration_ms": 900},
            {"at_ms": 9, "fault": "kill", "target": "w1"}]);
        map(&mut steps, &chaos_clients(), Design::EtcdLease).unwrap();
        assert_eq!(steps[0]["target"], "A→etcd");
        assert_eq!(steps[0]["after"]["worker"], "B");
        assert_eq!(steps[1]["target"], "C");
    }

    #[test]
    fn what_chaos_lacks_is_refused_by_its_step_with_what_to_write() {
        let held = json!([{"at_ms": 0, "fault": "hold", "target": "A→store"}]);
        let err = map(&mut held.clone(), &chaos_clients(), Design::RedisLock).unwrap_err();
        assert!(
            format!("{err:#}").contains("step 1 (hold A→store): chaos holds"),
            "{err:#}"
        );
        let master = json!([{"at_ms": 0, "fault": "kill", "target": "A"},
                            {"at_ms": 5, "fault": "restart", "target": "m3"}]);
        let err = map(&mut master.clone(), &chaos_clients(), Design::RedisLock).unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains("step 2 (restart m3)"), "{message}");
        assert!(message.contains(r#"write "target": "redis""#), "{message}");
        let four = json!([{"at_ms": 0, "fault": "kill", "target": "w4"},
            {"at_ms": 0, "fault": "kill", "target": "w1"},
            {"at_ms": 0, "fault": "kill", "target": "w2"},
            {"at_ms": 0, "fault": "kill", "target": "w3"}]);
        let err = map(&mut four.clone(), &chaos_clients(), Design::RedisLock).unwrap_err();
        assert!(format!("{err:#}").contains("step 4 (kill w3)"), "{err:#}");
        assert!(format!("{err:#}").contains("--clients 4"), "{err:#}");
        let queued = json!([{"at_ms": 0, "after": {"worker": "W2", "event": "queued"},
            "fault": "kill", "target": "W2"}]);
        let err = map(&mut queued.clone(), &chaos_clients(), Design::EtcdLease).unwrap_err();
        assert!(
            format!("{err:#}").contains("never report queued"),
            "{err:#}"
        );
    }

    /// A verdict line's schedule, a lab's whole output's, and one of several by its part.
    #[test]
    fn a_verdict_line_or_a_labs_output_gives_its_schedule() {
        let step = json!({"at_ms": 1, "fault": "kill", "target": "A"});
        let one = json!({"kind": "verdict", "schedule": [step]}).to_string();
        assert_eq!(pick(&one, None).unwrap(), json!([step]));
        let output = format!("{}\n{one}\n", json!({"kind": "event"}));
        assert_eq!(pick(&output, None).unwrap(), json!([step]));
        let several = json!({"kind": "verdict", "schedules": [[], [step]]}).to_string();
        assert_eq!(pick(&several, Some(2)).unwrap(), json!([step]));
        let err = pick(&several, None).unwrap_err();
        assert!(format!("{err:#}").contains("holds 2 schedules"), "{err:#}");
    }
}
