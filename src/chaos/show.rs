//! What chaos prints: a line per schedule, the smallest failing schedule with its replay
//! command and timeline, the summary — or JSON Lines of the same.

use std::time::Duration;

use colored::Colorize;
use serde_json::{Value, json};

use super::args::ChaosArgs;
use super::ground::Ground;
use super::play::Trial;
use super::step_words::step_words;
use crate::check::chaos::Judgement;
use crate::designs::Design;
use crate::events::{Event, What};
use crate::nemesis::schedule::Schedule;
use crate::output::{Style, Timeline, json_line};

pub fn heading(ground: &Ground, args: &ChaosArgs, seed: u64) {
    crate::outln!(
        "{}",
        crate::output::run_heading("chaos", &ground.run_id).bold()
    );
    crate::output::details(ground.servers.describe());
    crate::output::details(lanes_words(ground));
    let how_many = match args.time {
        Some(time) => format!("for {}", crate::output::human(time)),
        None => crate::output::count(args.schedules, "schedule", "schedules"),
    };
    if args.schedule.is_some() {
        crate::prose!(
            "Replaying the given schedule against {} with {}, {} (timing varies: \
             it may break the design in some plays and not others).",
            args.design.name().bold(),
            crate::output::count(args.clients, "client", "clients"),
            match args.time {
                Some(time) => format!("for {}", crate::output::human(time)),
                None => crate::output::count(args.schedules, "time", "times"),
            }
        );
        return;
    }
    crate::prose!(
        "Attacking {} with {}, {how_many}, seed {seed} (--seed {seed} draws the same schedules).",
        args.design.name().bold(),
        crate::output::count(args.clients, "client", "clients")
    );
}

/// What the run's Redis is: chaos's own, one per lane, or the given one it never restarts.
pub fn lanes_words(ground: &Ground) -> Vec<String> {
    let own: Vec<String> = ground
        .lanes
        .iter()
        .filter(|lane| lane.redis.is_some())
        .filter_map(|lane| lane.redis_url.as_deref().map(crate::connect::redact))
        .collect();
    if ground
        .lanes
        .iter()
        .any(|lane| !lane.masters.urls.is_empty())
    {
        let given = if ground.redis_given {
            "; --redis-url is not used by Redlock"
        } else {
            ""
        };
        vec![format!(
            "redis    {} masters per lane, chaos's own (m1–m{}){given}",
            super::redlock_lane::MASTERS,
            super::redlock_lane::MASTERS
        )]
    } else if ground.redis_given {
        vec![
            "redis given: client faults, and clock jumps on the run's own keys; no restart \
             or failover (chaos kills only servers it started)"
                .into(),
        ]
    } else if own.len() == 1 {
        vec![format!(
            "redis    {} (private: chaos may restart it)",
            own[0]
        )]
    } else if !own.is_empty() {
        vec![format!(
            "redis    {} private, one per lane (chaos may restart each): {}…",
            own.len(),
            own[0]
        )]
    } else {
        Vec::new()
    }
    .into_iter()
    .chain(ground.sentinel_ring.as_ref().map(|_| {
        "redis    a primary, its replica, 3 Sentinels: the failovers' (one at a time)".into()
    }))
    .collect()
}

/// The tag a history's events carry under `--json`, to tell the histories of one hunt apart.
pub fn history_tag(index: u64) -> String {
    format!("schedule-{index}")
}

pub fn schedule_line(style: Style, index: u64, seed: u64, schedule: &Schedule, trial: &Trial) {
    let run_id = &trial.run_id;
    let judgement = trial.report.judgement();
    if style.json {
        // The history first — what the clients, the servers and the faults said, and the
        // store's read-back — so that `lockslab check` can judge it again; then its line.
        for event in &trial.history {
            let mut event = event.clone();
            event.part.scenario = Some(history_tag(index));
            event.part.part = Some(event.part.label());
            json_line(&event);
        }
        json_line(&json!({
            "kind": "schedule", "run_id": run_id, "index": index, "seed": seed, "schedule": schedule,
            "result": judgement, "violations": trial.report.violations,
            "unknowns": trial.report.unknowns, "accepted": trial.report.accepted,
            "attempts": trial.report.attempts, "ms": trial.ms,
            "unplayed": trial.unplayed.len(), "unplayed_steps": trial.unplayed,
            "startup_ms": trial.startup_ms,
        }));
        return;
    }
    let word = match judgement {
        Judgement::Safe => "safe".green(),
        Judgement::Unsafe => "UNSAFE".red().bold(),
        Judgement::Unknown => "unknown".yellow(),
    };
    let head = format!(
        "  #{index:<3} {word:<7} {:>3} writes  ",
        trial.report.accepted
    );
    // The steps wrap under the first (colours do not count: the head's width is fixed).
    const INDENT: usize = 27;
    let words: Vec<String> = schedule.steps().iter().map(step_words).collect();
    let pieces: Vec<String> = words
        .iter()
        .enumerate()
        .map(|(n, step)| match n + 1 < words.len() {
            true => format!("{step};"),
            false => step.clone(),
        })
        .collect();
    let mut lines = vec![String::new()];
    for piece in pieces {
        let line = lines.last_mut().expect("one line at least");
        if !line.is_empty() && INDENT + line.len() + 1 + piece.len() > 80 {
            lines.push(piece);
        } else {
            if !line.is_empty() {
                line.push(' ');
            }
            line.push_str(&piece);
        }
    }
    for (n, line) in lines.iter().enumerate() {
        if n == 0 {
            crate::outln!("{head}{line}");
        } else {
            crate::outln!("{:INDENT$}{line}", "");
        }
    }
    for line in super::unplayed::lines(&trial.unplayed) {
        crate::prose!("        {line}");
    }
    if let (Judgement::Unknown, Some(why)) = (judgement, trial.report.unknowns.first()) {
        crate::prose!("        {} {why}", "unknown:".yellow());
    }
}

pub fn replay_command(design: Design, clients: u32, schedule: &Schedule) -> String {
    let json = serde_json::to_string(schedule).unwrap_or_default();
    let clients = if clients == 3 {
        String::new()
    } else {
        format!(" --clients {clients}")
    };
    format!(
        "lockslab chaos --design {}{clients} --schedule '{json}'",
        design.name()
    )
}

/// The replay command as a reader copies it: the command on its first line, then the
/// schedule's JSON broken between its fields, each line under 76 columns (JSON allows the
/// whitespace, and a single-quoted shell word keeps the line breaks).
pub fn replay_lines(design: Design, clients: u32, schedule: &Schedule) -> Vec<String> {
    const WIDTH: usize = 74;
    let command = replay_command(design, clients, schedule);
    let head = command
        .split_once(" '")
        .map_or(command.as_str(), |(head, _)| head);
    let mut lines = vec![format!("{head} '[")];
    let steps = schedule.steps();
    for (n, step) in steps.iter().enumerate() {
        let fields = fields_of(&serde_json::to_string(step).unwrap_or_default());
        let mut line = String::from("  {");
        for (f, field) in fields.iter().enumerate() {
            let piece = if f + 1 < fields.len() {
                format!("{field},")
            } else {
                format!("{field}}}")
            };
            if line.len() + piece.len() > WIDTH && line.len() > 3 {
                lines.push(std::mem::replace(&mut line, String::from("   ")));
            }
            line.push_str(&piece);
        }
        if n + 1 < steps.len() {
            line.push(',');
        }
        lines.push(line);
    }
    lines.push("]'".into());
    lines
}

/// The top-level `"key":value` pieces of a JSON object written on one line.
fn fields_of(object: &str) -> Vec<String> {
    let inner = object
        .strip_prefix('{')
        .and_then(|o| o.strip_suffix('}'))
        .unwrap_or(object);
    let (mut fields, mut field) = (Vec::new(), String::new());
    let (mut depth, mut in_string, mut escaped) = (0, false, false);
    for c in inner.chars() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            '{' | '[' if !in_string => depth += 1,
            '}' | ']' if !in_string => depth -= 1,
            ',' if !in_string && depth == 0 => {
                fields.push(std::mem::take(&mut field));
                continue;
            }
            _ => {}
        }
        field.push(c);
    }
    if !field.is_empty() {
        fields.push(field);
    }
    fields
}

pub fn failure(
    style: Style,
    schedule: &Schedule,
    trial: &Trial,
    replay: &[String],
    after: Duration,
    shrunk: bool,
) {
    if style.json {
        return;
    }
    crate::outln!();
    crate::prose!(
        "{} found after {}. {}",
        "A violation".red().bold(),
        crate::output::human(after),
        if shrunk {
            "The smallest schedule that still broke it:"
        } else {
            "The schedule that broke it:"
        }
    );
    for step in schedule.steps() {
        crate::outln!("  · {}", step_words(step));
    }
    // It broke without them: the violation is the other steps' doing.
    for line in super::unplayed::lines(&trial.unplayed) {
        crate::prose!("  {line}; it broke without it");
    }
    crate::outln!();
    crate::outln!("Its timeline (the faults, and the jobs the violation is about):");
    let mut timeline = Timeline::new(style);
    for event in focus(trial) {
        timeline.show(event);
    }
    crate::outln!();
    crate::outln!("What the store's rows show:");
    for violation in &trial.report.violations {
        crate::prose!("  ✗ {}", violation.describe());
    }
    crate::outln!();
    crate::outln!("Replay it:");
    for line in replay {
        crate::outln!("  {line}");
    }
}

/// `took`: the hunt (the schedules played); `shrinking`: the replays after it.
pub fn summary(style: Style, verdict: &Value, played: u64, took: Duration, shrinking: Duration) {
    if style.json {
        json_line(verdict);
        return;
    }
    let per_minute = if took.as_secs_f64() > 0.0 {
        played as f64 * 60.0 / took.as_secs_f64()
    } else {
        0.0
    };
    crate::outln!();
    let shrunk = if shrinking > Duration::from_millis(500) {
        format!(" Shrinking took {}.", crate::output::human(shrinking))
    } else {
        String::new()
    };
    let in_part = match verdict["played_in_part"].as_u64().unwrap_or(0) {
        0 => String::new(),
        n => format!(" {n} with a step that never played (named above)."),
    };
    crate::prose!(
        "{} in {} ({per_minute:.0} a minute): {} unsafe, {} unknown.{in_part}\
         {shrunk}",
        crate::output::count(played, "schedule", "schedules"),
        crate::output::human(took),
        verdict["unsafe"],
        verdict["unknown"]
    );
}

/// The part of a history a reader needs: the jobs a violation is about, whole (from the
/// lock taken to the lock let go), and the faults aimed at their clients or at a server —
/// not the other jobs of those clients, nor the faults of clients not involved.
fn focus(trial: &Trial) -> Vec<&Event> {
    let jobs: Vec<i64> = trial
        .report
        .violations
        .iter()
        .flat_map(|v| v.jobs())
        .collect();
    let kept = involved_jobs(&trial.history, &jobs);
    if kept.is_empty() {
        return trial.history.iter().collect();
    }
    let clients: Vec<&str> = kept
        .iter()
        .map(|&i| trial.history[i].worker.as_str())
        .collect();
    let everyone: Vec<&str> = trial
        .history
        .iter()
        .filter(|e| e.worker != crate::nemesis::LANE)
        .map(|e| e.worker.as_str())
        .collect();
    let (from, to) = (
        trial.history[kept[0]].t_ms.saturating_sub(60),
        trial.history[kept[kept.len() - 1]].t_ms + 20,
    );
    trial
        .history
        .iter()
        .enumerate()
        .filter(|(i, e)| {
            if e.worker != crate::nemesis::LANE {
                return kept.contains(i);
            }
            match fault_target(e) {
                // A fault aimed at a client: only at one of the jobs' clients.
                Some(target) if everyone.contains(&target) => clients.contains(&target),
                // At a server, or the lab's own word: within the jobs' time.
                _ => (from..=to).contains(&e.t_ms),
            }
        })
        .map(|(_, e)| e)
        .collect()
}

/// The indexes of the events of `jobs`: each client's events cut into jobs — from the event
/// after its last lock let go (or given up) to the next — and the jobs kept whose events
/// name one of `jobs`.
fn involved_jobs(history: &[Event], jobs: &[i64]) -> Vec<usize> {
    let mut open: std::collections::HashMap<&str, (Vec<usize>, Option<i64>)> =
        std::collections::HashMap::new();
    let mut kept = Vec::new();
    let close = |(events, job): (Vec<usize>, Option<i64>), kept: &mut Vec<usize>| {
        if job.is_some_and(|job| jobs.contains(&job)) {
            kept.extend(events);
        }
    };
    for (i, event) in history.iter().enumerate() {
        if event.worker == crate::nemesis::LANE {
            continue;
        }
        let job = job_of(event);
        let segment = open.entry(event.worker.as_str()).or_default();
        if let (Some(was), Some(now)) = (segment.1, job)
            && was != now
        {
            // A design with no lock to let go: a new job number starts a new job.
            close(std::mem::take(segment), &mut kept);
        }
        segment.0.push(i);
        segment.1 = job.or(segment.1);
        if matches!(event.what, What::Released(_) | What::GaveUp(_)) {
            let done = open.remove(event.worker.as_str()).unwrap_or_default();
            close(done, &mut kept);
        }
    }
    for (_, segment) in open {
        close(segment, &mut kept);
    }
    kept.sort_unstable();
    kept
}

fn job_of(event: &Event) -> Option<i64> {
    match &event.what {
        What::ReadRecord(read) => read.job,
        _ => event.job(),
    }
}

/// Whom a fault of the lab's lane was aimed at.
fn fault_target(event: &Event) -> Option<&str> {
    match &event.what {
        What::Frozen(f) | What::Resumed(f) | What::Killed(f) => f.target.as_deref(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::facts::{Acquired, RecordRead, Released};

    fn event(worker: &str, what: What) -> Event {
        Event::new(worker, what, "")
    }

    fn read(job: i64) -> What {
        What::ReadRecord(RecordRead {
            job: Some(job),
            ..RecordRead::default()
        })
    }

    /// A stale write of A's job 1003 over B's job 2001: A's first job (1001) and C's are
    /// not part of its story, and neither is the lock A took for 1003 before its read.
    #[test]
    fn the_timeline_keeps_the_violations_jobs_whole_and_nothing_else() {
        let acquired = || What::Acquired(Acquired::default());
        let released = || What::Released(Released::default());
        let history = vec![
            event("B", acquired()),    // 0: B's 2001
            event("B", read(2001)),    // 1
            event("A", acquired()),    // 2: A's 1001
            event("A", read(1001)),    // 3
            event("A", released()),    // 4
            event("A", acquired()),    // 5: A's 1003
            event("A", read(1003)),    // 6
            event("B", released()),    // 7
            event("C", acquired()),    // 8: C's 3001
            event("C", read(3001)),    // 9
            event("A", What::Working), // 10
            event("A", released()),    // 11
        ];
        assert_eq!(
            involved_jobs(&history, &[1003, 2001]),
            vec![0, 1, 5, 6, 7, 10, 11]
        );
        // A design with no lock to let go: a new job number starts a new job.
        let lockless = vec![
            event("A", read(1001)),
            event("A", What::Working),
            event("A", read(1002)),
            event("A", What::Working),
        ];
        assert_eq!(involved_jobs(&lockless, &[1002]), vec![2, 3]);
    }
}
