//! What `lockslab challenge` prints: the list, a template, the heading, and the verdict
//! (a table for a terminal, one JSON object under `--json`).

use colored::Colorize;
use serde_json::json;

use super::challenges::Challenge;
use super::play::{Played, Setup};
use crate::check::challenge::{Evidence, Grade, Report};
use crate::events::{Event, What};
use crate::nemesis::Record;
use crate::servers::Servers;
use std::time::Instant;

const PYTHON: &str = include_str!("../../examples/challenge/template.py");
const RUST: &str = include_str!("../../examples/challenge/template.rs");

/// The starting client in `language` (checked by clap to be one of these).
pub fn template(language: &str) -> &'static str {
    match language {
        "rust" => RUST,
        _ => PYTHON,
    }
}

/// `lockslab challenge list`.
pub fn list() {
    crate::outln!("{}", "The challenges".bold());
    for challenge in Challenge::ALL {
        let about = challenge.about();
        crate::outln!();
        crate::outln!("  {}", challenge.name().bold());
        crate::outln!("    goal    {}", about.goal);
        crate::outln!("    faults  {}", about.faults);
        crate::outln!("    target  {}", about.target);
    }
    crate::outln!();
    crate::outln!("  lockslab challenge NAME --template python > client.py");
    crate::outln!("  lockslab challenge NAME -- python3 client.py");
}

pub fn heading(setup: &Setup, run_id: &str, servers: &Servers) {
    let challenge = setup.challenge;
    crate::outln!(
        "{} run {run_id} {}",
        format!("lockslab challenge {}", challenge.name()).bold(),
        format!("· --seed {}", setup.seed).dimmed()
    );
    crate::output::details(servers.describe());
    crate::prose!(
        "{} clients of `{}`, {} jobs on 2 records, lock TTL {}ms: {}",
        setup.clients,
        setup.program.join(" "),
        setup.jobs.len(),
        setup.init.lease_ms,
        challenge.about().faults
    );
}

/// The command that replays this run: same challenge, seed and client.
fn replay(setup: &Setup) -> String {
    format!(
        "lockslab challenge {} --seed {} -- {}",
        setup.challenge.name(),
        setup.seed,
        setup.program.join(" ")
    )
}

/// The verdict as `--json` prints it last, and as the `--html` page's table shows it.
pub fn json(
    setup: &Setup,
    run_id: &str,
    played: &Played,
    evidence: &Evidence,
    report: &Report,
    grade: Grade,
) -> serde_json::Value {
    json!({
        "kind": "verdict", "json_version": crate::labs::JSON_VERSION, "lab": "challenge",
        "run_id": run_id, "challenge": setup.challenge.name(), "seed": setup.seed,
        "grade": grade, "problems": report.problems, "undecided": report.undecided,
        "client_failure": played.client_failure,
        "jobs": evidence.jobs.len(), "acknowledged": evidence.acknowledged.len(),
        "changes": evidence.changes, "schedule": played.schedule,
        "faults_planned": played.faults_planned, "faults_played": played.faults_played,
        "faults_bit": report.faults_bit,
        "replay": replay(setup),
    })
}

pub fn show(
    setup: &Setup,
    run_id: &str,
    played: &Played,
    evidence: &Evidence,
    report: &Report,
    grade: Grade,
) {
    if setup.json {
        crate::output::json_line(&json(setup, run_id, played, evidence, report, grade));
        return;
    }
    crate::outln!();
    let word = match grade {
        Grade::Pass => grade.word().green().bold(),
        Grade::Fail => grade.word().red().bold(),
        Grade::Undecided => grade.word().yellow().bold(),
    };
    crate::outln!("{word}  challenge {}", setup.challenge.name());
    if let Some(failure) = &played.client_failure {
        crate::prose!("  {failure}");
    }
    crate::prose!(
        "  {} jobs, {} answered ok; the database logged {} changes, {} as their job meant",
        evidence.jobs.len(),
        evidence.acknowledged.len(),
        evidence.changes.len(),
        report.good_changes
    );
    crate::outln!(
        "  faults: {} planned, {} played, {} bit",
        played.faults_planned,
        played.faults_played,
        report.faults_bit
    );
    let refused = played
        .events
        .iter()
        .filter(|e| matches!(&e.what, What::JobAnswered(a) if a.ok == Some(false)))
        .count();
    if refused > 0 {
        crate::outln!("  {refused} answered fail (refused) and were sent again");
    }
    const SHOWN: usize = 8;
    for problem in report.problems.iter().take(SHOWN) {
        crate::prose!("  - {}", problem.describe());
    }
    if report.problems.len() > SHOWN {
        crate::outln!(
            "  … and {} more (--json has them all)",
            report.problems.len() - SHOWN
        );
    }
    for line in &report.undecided {
        crate::prose!("  ? {line}");
    }
    crate::prose!("  replay: {}", replay(setup));
}

/// The run's history: stamped on the run's clock and, as it comes, shown.
pub struct Tape {
    pub start: Instant,
    pub json: bool,
    pub events: Vec<Event>,
}

impl Record for Tape {
    fn record(&mut self, mut event: Event) {
        event.t_ms = self.start.elapsed().as_millis() as u64;
        if self.json {
            crate::output::json_line(&event);
        } else if !matches!(
            event.what,
            What::JobSent(_)
                | What::JobAnswered(_)
                | What::Acquired(_)
                | What::Working
                | What::Released(_)
                | What::Run(_)
        ) {
            crate::outln!("{:>7}ms  {:<4} {}", event.t_ms, event.worker, event.text);
        }
        self.events.push(event);
    }
}
