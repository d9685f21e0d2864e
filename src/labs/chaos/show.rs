//! What chaos prints: a line per schedule, the smallest failing schedule with its replay
//! command and timeline, the summary — or JSON Lines of the same.

use std::time::Duration;

use colored::Colorize;
use serde_json::{Value, json};

use super::{ChaosArgs, Ground, Trial};
use crate::check::chaos::Judgement;
use crate::nemesis::Fault;
use crate::nemesis::schedule::{Schedule, Step};
use crate::output::{Style, Timeline, json_line};
use crate::worker::chaos_client::Design;

pub fn heading(ground: &Ground, args: &ChaosArgs, seed: u64) {
    crate::outln!(
        "{}",
        crate::output::run_heading("chaos", &ground.run_id).bold()
    );
    crate::output::details(ground.servers.describe());
    crate::output::details(lanes_words(ground));
    let how_many = match args.time {
        Some(time) => format!("for {}", crate::output::human(time)),
        None => format!("{} schedules", args.schedules),
    };
    if args.schedule.is_some() {
        crate::prose!(
            "Replaying the given schedule against {} with {} clients, {} (timing varies: \
             it may break the design in some plays and not others).",
            args.design.name().bold(),
            args.clients,
            match args.time {
                Some(time) => format!("for {}", crate::output::human(time)),
                None => format!("{} times", args.schedules),
            }
        );
        return;
    }
    crate::prose!(
        "Attacking {} with {} clients, {how_many}, seed {seed} (--seed {seed} draws the same schedules).",
        args.design.name().bold(),
        args.clients
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
    if ground.redis_given {
        vec!["redis given: client faults only (chaos restarts only servers it started)".into()]
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
}

/// A step in a few words: `pause B 3ms after read_record#2 for 640ms`.
pub fn step_words(step: &Step) -> String {
    let when = match &step.after {
        None => format!("at +{}ms", step.at_ms),
        Some(anchor) => format!(
            "{}ms after {}'s {}#{}",
            step.at_ms, anchor.worker, anchor.event, anchor.nth
        ),
    };
    let lasting = step
        .duration_ms
        .map_or(String::new(), |ms| format!(" for {ms}ms"));
    let fault = match step.fault {
        Fault::Restart => "restart",
        other => other.as_str(),
    };
    format!("{fault} {} {when}{lasting}", step.target)
}

pub fn schedule_line(style: Style, index: u64, seed: u64, schedule: &Schedule, trial: &Trial) {
    let run_id = &trial.run_id;
    let judgement = trial.report.judgement();
    if style.json {
        json_line(&json!({
            "kind": "schedule", "run_id": run_id, "index": index, "seed": seed, "schedule": schedule,
            "result": judgement, "violations": trial.report.violations,
            "unknowns": trial.report.unknowns, "accepted": trial.report.accepted,
            "attempts": trial.report.attempts, "ms": trial.ms, "unplayed": trial.unplayed,
            "startup_ms": trial.startup_ms,
        }));
        return;
    }
    let word = match judgement {
        Judgement::Safe => "safe".green(),
        Judgement::Unsafe => "UNSAFE".red().bold(),
        Judgement::Inconclusive => "unknown".yellow(),
    };
    let unplayed = match trial.unplayed {
        0 => String::new(),
        n => format!(" ({n} never played: its event never came)"),
    };
    crate::outln!(
        "  #{index:<3} {word:<7} {:>3} writes  {}{unplayed}",
        trial.report.accepted,
        schedule
            .steps()
            .iter()
            .map(step_words)
            .collect::<Vec<_>>()
            .join("; ")
    );
    if let (Judgement::Inconclusive, Some(why)) = (judgement, trial.report.unknowns.first()) {
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

pub fn failure(
    style: Style,
    schedule: &Schedule,
    trial: &Trial,
    replay: &str,
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
    crate::outln!("  {replay}");
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
    crate::prose!(
        "{played} schedule(s) in {} ({per_minute:.0} a minute): {} unsafe, {} unknown.{shrunk}",
        crate::output::human(took),
        verdict["unsafe"],
        verdict["inconclusive"]
    );
}

/// The part of a history a reader needs: every fault, and from the first event of a job a
/// violation is about to the last, those jobs' clients' events.
fn focus(trial: &Trial) -> Vec<&crate::events::Event> {
    let jobs: Vec<i64> = trial
        .report
        .violations
        .iter()
        .flat_map(|v| v.jobs())
        .collect();
    let job_of = |event: &crate::events::Event| match &event.what {
        crate::events::What::ReadRecord(read) => read.job,
        _ => event.job(),
    };
    let involved: Vec<&crate::events::Event> = trial
        .history
        .iter()
        .filter(|e| job_of(e).is_some_and(|job| jobs.contains(&job)))
        .collect();
    let (Some(first), Some(last)) = (involved.first(), involved.last()) else {
        return trial.history.iter().collect();
    };
    let workers: Vec<&str> = involved.iter().map(|e| e.worker.as_str()).collect();
    let (from, to) = (first.t_ms.saturating_sub(60), last.t_ms + 20);
    trial
        .history
        .iter()
        .filter(|e| {
            e.worker == crate::nemesis::LANE
                || (workers.contains(&e.worker.as_str()) && (from..=to).contains(&e.t_ms))
        })
        .collect()
}
