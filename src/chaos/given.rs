//! What a learner hands chaos by hand: a schedule, inline or in a file.

use std::path::Path;

use anyhow::Result;

use super::lab_names::{self, CLIENT_EVENTS};
use super::play::run_ms_of;
use super::{clock, failover, net, play};
use crate::designs::Design;
use crate::nemesis::generate;
use crate::nemesis::schedule::Schedule;

/// A file's text, at most `limit` bytes, read through `take(limit + 1)`: a device such as
/// /dev/zero, or a pipe that never ends, is refused once past the limit rather than read
/// until the memory is full, while a pipe within it (`<(…)`) reads whole. Over the limit:
/// an error of kind [`std::io::ErrorKind::FileTooLarge`], for the caller to say why.
pub fn read_small_file(path: &Path, limit: u64) -> std::io::Result<String> {
    use std::io::{Error, ErrorKind, Read};
    let file = std::fs::File::open(path)?;
    let too_big = || Error::new(ErrorKind::FileTooLarge, format!("over {limit} bytes"));
    // A regular file says its size: refused before a byte is read (a pipe or a device
    // says 0, and is held to the limit as it is read).
    if file.metadata()?.len() > limit {
        return Err(too_big());
    }
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(too_big());
    }
    String::from_utf8(bytes).map_err(|err| Error::new(ErrorKind::InvalidData, err))
}

/// The kinds of a given schedule: its own steps', each once, in the order they come (a
/// run without `--faults` starts only the servers these need).
pub fn kinds(schedule: &Schedule) -> Vec<generate::FaultKind> {
    let mut kinds = Vec::new();
    for kind in schedule.steps().iter().filter_map(generate::FaultKind::of) {
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds
}

/// The faults a given schedule's steps may name.
const CHAOS_PLAYS: &str = "chaos plays pause, resume, kill, restart, delay, drop_reply (also \
     read as lost-reply), cut, clock_step (a lock server's clock jump, simulated), partition \
     (on hosts) and leader_stall (etcd's leader)";

/// A schedule's JSON as a learner may type it: a path's `A->store` read as `A→store`, and
/// an `after.event` that names no event refused with the events there are.
fn tidy(json: &mut serde_json::Value) -> Result<()> {
    use serde_json::Value;
    let Some(steps) = json.as_array_mut() else {
        return Ok(());
    };
    for step in steps {
        if let Some(fault) = step.get("fault")
            && serde_json::from_value::<crate::nemesis::Fault>(fault.clone()).is_err()
        {
            crate::bail_usage!("--schedule: {CHAOS_PLAYS}; not {fault}");
        }
        if let Some(Value::String(target)) = step.get_mut("target") {
            *target = target.replace("->", "→");
        }
        let names = match step.get("after").and_then(|after| after.get("event")) {
            Some(Value::Array(names)) => names.iter().collect(),
            Some(one) => vec![one],
            None => Vec::new(),
        };
        for name in names {
            if serde_json::from_value::<crate::events::Kind>(name.clone()).is_err() {
                crate::bail_usage!(
                    "--schedule: after.event {name} is not an event a client reports: \
                     {} (one, or a list of them)",
                    CLIENT_EVENTS.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// A schedule as `--schedule` gave it, on chaos's names.
#[derive(Debug)]
pub struct Given {
    pub schedule: Schedule,
    /// Each step a lab's names were put on chaos's run for, in words ([`lab_names`]).
    pub mapped: Vec<String>,
}

/// `--schedule`'s text: inline JSON (an array of steps, or a verdict line), or a file
/// holding one or a lab's whole `--json` output; `FILE#N` names the N-th of a verdict's
/// `schedules`.
fn schedule_text(text: &str) -> Result<(String, Option<usize>)> {
    if text.trim_start().starts_with(['[', '{']) {
        return Ok((text.to_string(), None));
    }
    let (path, part) = match text.rsplit_once('#') {
        Some((path, n)) if !Path::new(text).exists() && n.parse::<usize>().is_ok() => {
            (path, n.parse().ok())
        }
        _ => (text, None),
    };
    // A schedule is a few lines, a lab's --json output a few hundred: a megabyte is far
    // more than either.
    match read_small_file(Path::new(path), 1 << 20) {
        Ok(json) => Ok((json, part)),
        Err(_) if !Path::new(path).exists() => crate::bail_usage!(
            "--schedule {text}: neither a JSON array of steps nor a file (e.g. '[{{\"at_ms\": 200, \"fault\": \"pause\", \"target\": \"A\", \"duration_ms\": 900}}]')"
        ),
        Err(err) if err.kind() == std::io::ErrorKind::FileTooLarge => {
            crate::bail_usage!("--schedule {text}: over 1 MiB: a schedule is a few lines")
        }
        Err(err) => crate::bail_usage!("--schedule {text}: {err}"),
    }
}

/// `--schedule`: a JSON array, a lab's verdict line, or a file holding either or a lab's
/// `--json` output; its names put on chaos's ([`lab_names`]), then checked against the
/// clients.
pub fn read_schedule(text: &str, clients: u32, design: Design) -> Result<Given> {
    let run_ms = run_ms_of(design);
    use crate::nemesis::Fault;
    let (json, part) = schedule_text(text)?;
    let mut value = lab_names::pick(&json, part)?;
    tidy(&mut value)?;
    let names = play::client_names(clients);
    let mapped = lab_names::map(&mut value, &names, design)?;
    let schedule: Schedule = match serde_json::from_value(value) {
        Ok(schedule) => schedule,
        Err(err) => crate::bail_usage!("--schedule: not a schedule ({err})"),
    };
    if schedule.is_empty() {
        crate::bail_usage!(
            "--schedule: no fault in it (a run with no fault is a baseline, not a replay: \
             drop --schedule and pass --faults)"
        );
    }
    let checked = net::validate(&schedule, &names, design)
        .and_then(|rest| clock::validate(&rest, &names, design))
        .and_then(|rest| failover::validate(&rest));
    let on_processes = match checked {
        Ok(rest) => rest,
        Err(err) => crate::bail_usage!("--schedule: {err:#}"),
    };
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut servers = lab_names::servers_of(design);
    // A partition's sides may name the hosts of the servers its clients talk to.
    servers.extend(play::partition_hosts(design));
    let servers: Vec<&str> = servers.iter().map(String::as_str).collect();
    if let Some(step) = (schedule.steps().iter())
        .find(|s| s.target == generate::REDIS_PRIMARY && s.fault != Fault::Restart)
    {
        crate::bail_usage!(
            "--schedule: {} aims at redis-primary, which chaos only fails over: \
             {{\"fault\": \"restart\", \"target\": \"redis-primary\"}}",
            step.fault.as_str()
        );
    }
    if let Err(err) = on_processes.validate(&names, &servers) {
        crate::bail_usage!("--schedule: {err:#}");
    }
    let restarts = schedule
        .steps()
        .iter()
        .filter(|s| s.fault == Fault::Restart);
    if restarts.count() > 1 {
        crate::bail_usage!(
            "--schedule: chaos restarts its Redis at most once a schedule (as `redis`, which \
             comes back empty, as `redis-aof`, which comes back with its data, or as \
             `redis-primary`, a failover), and kills etcd's leader at most once (as \
             `etcd-leader`)"
        );
    }
    let failover = schedule
        .steps()
        .iter()
        .any(|s| s.target == generate::REDIS_PRIMARY);
    let on_lock_server = (schedule.steps().iter())
        .find(|s| generate::FaultKind::of(s).is_some_and(|k| k.on_lock_server()));
    if let (true, Some(step)) = (failover, on_lock_server) {
        crate::bail_usage!(
            "--schedule: {} aims at {}, but with a failover the clients reach the Redis \
             primary the Sentinels name, not through the fault proxy: drop one of the two",
            step.fault.as_str(),
            step.target
        );
    }
    // What chaos's clients and nemesis can play, within one run of `run_ms`: a step it
    // could not play would pass for a replay of it.
    const LONGEST_PAUSE_MS: u64 = 60_000;
    for step in schedule.steps() {
        if !matches!(
            step.fault,
            Fault::Pause
                | Fault::Resume
                | Fault::Kill
                | Fault::Restart
                | Fault::Delay
                | Fault::DropReply
                | Fault::Cut
                | Fault::ClockStep
                | Fault::Partition
                | Fault::LeaderStall
        ) {
            crate::bail_usage!("--schedule: {CHAOS_PLAYS}; not {}", step.fault.as_str());
        }
        if matches!(step.fault, Fault::Partition | Fault::LeaderStall)
            && step
                .duration_ms
                .is_none_or(|ms| ms == 0 || ms > LONGEST_PAUSE_MS)
        {
            crate::bail_usage!(
                "--schedule: the {} of {} at {} ms needs a duration_ms of 1 to \
                 {LONGEST_PAUSE_MS} ms (chaos ends it)",
                step.fault.as_str(),
                step.target,
                step.at_ms
            );
        }
        if step.fault == Fault::Pause {
            match step.duration_ms {
                None => crate::bail_usage!(
                    "--schedule: the pause of {} at {} ms needs a duration_ms (chaos resumes it)",
                    step.target,
                    step.at_ms
                ),
                Some(ms) if ms > LONGEST_PAUSE_MS => crate::bail_usage!(
                    "--schedule: a pause of {ms} ms is longer than chaos plays (at most {LONGEST_PAUSE_MS} ms)"
                ),
                Some(0) => crate::bail_usage!(
                    "--schedule: a pause of 0 ms tests nothing (no fault at all): give it a \
                     duration_ms of at least 1"
                ),
                Some(_) => {}
            }
        }
        if step.at_ms > run_ms {
            crate::bail_usage!(
                "--schedule: a step at {} ms comes after the run's {run_ms} ms: it would never be played",
                step.at_ms
            );
        }
    }
    Ok(Given { schedule, mapped })
}

#[cfg(test)]
mod tests {
    use super::*;
    use generate::FaultKind;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_given_schedule_has_its_own_steps_kinds_only() {
        let pauses = r#"[{"at_ms": 100, "fault": "pause", "target": "A", "duration_ms": 900},
            {"at_ms": 300, "fault": "pause", "target": "B", "duration_ms": 90}]"#;
        let schedule = read_schedule(pauses, 2, Design::RedisLock)
            .unwrap()
            .schedule;
        assert_eq!(kinds(&schedule), vec![FaultKind::Pause]);
        let failover = r#"[{"at_ms": 100, "fault": "kill", "target": "A"},
            {"at_ms": 200, "fault": "restart", "target": "redis-primary"}]"#;
        let schedule = read_schedule(failover, 2, Design::RedisLock)
            .unwrap()
            .schedule;
        assert_eq!(kinds(&schedule), vec![FaultKind::Kill, FaultKind::Failover]);
    }

    #[test]
    fn a_path_may_be_typed_in_ascii_and_an_unknown_event_names_the_events() {
        let ascii = r#"[{"at_ms": 100, "fault": "delay", "target": "A->store",
            "duration_ms": 900}]"#;
        let schedule = read_schedule(ascii, 2, Design::RedisLock).unwrap().schedule;
        assert_eq!(schedule.steps()[0].target, "A→store");
        let unknown = r#"[{"at_ms": 5, "after": {"worker": "A", "event": "grabbed"},
            "fault": "pause", "target": "A", "duration_ms": 900}]"#;
        let err = read_schedule(unknown, 2, Design::RedisLock).unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains("\"grabbed\""), "{message}");
        assert!(message.contains(&CLIENT_EVENTS.join(", ")), "{message}");
        let listed = unknown.replace(r#""grabbed""#, r#"["wrote", "grabbed"]"#);
        let err = read_schedule(&listed, 2, Design::RedisLock).unwrap_err();
        assert!(format!("{err:#}").contains("\"grabbed\""));
    }

    /// A pipe (`--schedule <(…)`) reads; /dev/zero, which says it holds 0 bytes, is cut
    /// off at the limit instead of filling the memory.
    #[test]
    fn a_small_file_reads_from_a_pipe_and_dev_zero_stops_at_the_limit() {
        let (reader, mut writer) = std::io::pipe().unwrap();
        writer.write_all(b"[1, 2]").unwrap();
        drop(writer);
        let piped = format!("/dev/fd/{}", reader.as_raw_fd());
        assert_eq!(read_small_file(Path::new(&piped), 64).unwrap(), "[1, 2]");
        let err = read_small_file(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::FileTooLarge, "{err}");
    }

    /// A misspelt field would replay a schedule other than the one written (a pause with
    /// no duration is refused, but a misspelt `after` would fire at the schedule's start).
    #[test]
    fn a_field_a_step_does_not_know_is_refused_and_named() {
        let misspelt = r#"[{"at_ms": 5, "aftr": {"worker": "A", "event": "wrote"},
            "fault": "kill", "target": "A"}]"#;
        let message = format!(
            "{:#}",
            read_schedule(misspelt, 2, Design::RedisLock).unwrap_err()
        );
        assert!(message.contains("unknown field `aftr`"), "{message}");
        let in_anchor = r#"[{"at_ms": 5, "after": {"worker": "A", "event": "wrote", "n": 2},
            "fault": "kill", "target": "A"}]"#;
        let message = format!(
            "{:#}",
            read_schedule(in_anchor, 2, Design::RedisLock).unwrap_err()
        );
        assert!(message.contains("unknown field `n`"), "{message}");
    }
}
