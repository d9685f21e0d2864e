//! What `lockslab challenge` prints: the list, a template, the heading, and the verdict
//! (a table for a terminal, one JSON object under `--json`).

use colored::Colorize;
use serde_json::json;

use super::challenges::Challenge;
use super::play::{Played, Setup};
use crate::check::challenge::{Evidence, Grade, Report};
use crate::events::What;
use crate::flags::flag_duration;
use crate::output::shell_word;
use crate::servers::Servers;
use std::time::Duration;

const PYTHON: &str = include_str!("../../examples/challenge/template.py");
const RUST: &str = include_str!("../../examples/challenge/template.rs");

/// The starting client in `language` (checked by clap to be one of these).
pub fn template(language: &str) -> &'static str {
    let text = match language {
        "rust" => RUST,
        _ => PYTHON,
    };
    // Printed as a line: its own last newline would leave a blank one.
    text.strip_suffix('\n').unwrap_or(text)
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
    crate::outln!("  lockslab challenge NAME -- /usr/bin/python3 client.py");
}

pub fn heading(
    setup: &Setup,
    run_id: &str,
    servers: &Servers,
    shared_role: bool,
    unguarded_role: bool,
    shared_logins: bool,
) {
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
        setup
            .program
            .iter()
            .map(|word| shell_word(word))
            .collect::<Vec<_>>()
            .join(" "),
        setup.jobs.len(),
        setup.init.lease_ms,
        challenge.about().faults
    );
    // Who the clients run as: said on every run, plainly when they are not isolated.
    let isolation = setup.isolation.describe();
    if setup.isolation.is_isolated() {
        crate::prose!("  {}", isolation.dimmed());
    } else {
        crate::prose!("  {}", isolation.yellow());
    }
    if shared_role {
        crate::prose!(
            "  {}",
            "the clients share lockslab's Postgres role (it may not create one for them): \
             they could rewrite the log, or end the grader's connections"
                .dimmed()
        );
    }
    if unguarded_role {
        crate::prose!(
            "  {}",
            "the clients' Postgres role may create views, rules, functions and triggers \
            (refusing them takes an event trigger, which only a superuser makes): a write \
            hidden in one is a write no fault can hold"
                .dimmed()
        );
    }
    if shared_logins {
        crate::prose!(
            "  {}",
            "the clients share lockslab's Redis or etcd login (the server given may not make \
             users for them): they could reach keys beyond this run's"
                .dimmed()
        );
    }
}

/// The command that replays this run, one shell word each: the challenge, the seed, every
/// option that shapes the run (`--clients`, `--ttl`, and `--patience` when it was given),
/// and the client, each word quoted for a POSIX shell. Where the servers are and how the
/// run is shown (`--json`, `--html`) do not change it, and a URL carries a password.
pub fn replay_words(
    challenge: Challenge,
    seed: u64,
    clients: u32,
    ttl: Duration,
    patience: Option<Duration>,
    program: &[String],
) -> Vec<String> {
    let mut words: Vec<String> = ["lockslab", "challenge", challenge.name(), "--seed"]
        .map(String::from)
        .into();
    words.push(seed.to_string());
    if clients != DEFAULT_CLIENTS {
        words.extend(["--clients".into(), clients.to_string()]);
    }
    if ttl != DEFAULT_TTL {
        words.extend(["--ttl".into(), flag_duration(ttl)]);
    }
    if let Some(patience) = patience {
        words.extend(["--patience".into(), flag_duration(patience)]);
    }
    words.push("--".into());
    words.extend(program.iter().map(|word| shell_word(word)));
    words
}

/// What `--clients` and `--ttl` are when not given (clap's defaults, in `ChallengeArgs`).
pub const DEFAULT_CLIENTS: u32 = 3;
pub const DEFAULT_TTL: Duration = Duration::from_millis(500);

/// The replay command for a terminal: broken between words into lines of at most `width`
/// columns, each but the last ending in ` \`, so that it pastes as one command. A word
/// longer than a line is not broken.
fn replay_lines(words: &[String], width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::from("  replay:");
    for word in words {
        if crate::output::visible_width(&line) + 1 + crate::output::visible_width(word) + 2 > width
            && line.trim_start().contains(' ')
        {
            lines.push(format!("{line} \\"));
            line = String::from("   ");
        }
        line.push(' ');
        line.push_str(word);
    }
    lines.push(line);
    lines
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
    let fields = json!({
        "challenge": setup.challenge.name(), "seed": setup.seed,
        "grade": grade, "problems": report.problems, "unknown": report.undecided,
        "notes": report.notes,
        "client_failure": played.client_failure,
        "jobs": evidence.jobs.len(), "acknowledged": evidence.acknowledged.len(),
        "changes": evidence.changes, "schedule": played.schedule,
        "faults_planned": played.faults_planned, "faults_played": played.faults_played,
        "faults_bit": report.faults_bit,
        "replay": setup.replay.join(" "),
        "clients_isolated": setup.isolation.kind(),
        // Everything the grade weighed, so `lockslab check` grades the run again offline.
        "evidence": evidence,
    });
    crate::events::envelope::verdict_of("challenge", run_id, fields)
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
    // What the clients said, not what the log shows: a `fail` is a claim (a write that
    // committed all the same is a problem of its own), so not called a refusal here.
    let failed = played
        .events
        .iter()
        .filter(|e| matches!(&e.what, What::JobAnswered(a) if a.ok == Some(false)))
        .count();
    match failed {
        0 => {}
        1 => crate::outln!("  1 job answered fail and was sent again"),
        n => crate::outln!("  {n} jobs answered fail and were sent again"),
    }
    const SHOWN: usize = 8;
    for problem in report.problems.iter().take(SHOWN) {
        crate::prose!("  - {}", problem.describe());
    }
    if report.problems.len() > SHOWN {
        crate::outln!(
            "  … and {} more (a run with --json lists every one)",
            report.problems.len() - SHOWN
        );
    }
    for line in &report.undecided {
        crate::prose!("  ? {line}");
    }
    for line in &report.notes {
        crate::prose!("  · {line}");
    }
    for line in replay_lines(&setup.replay, 80) {
        crate::output::line(&line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_replay_names_every_option_that_shapes_the_run() {
        let program = ["python3".to_string(), "my client.py".into(), "".into()];
        let words = replay_words(
            Challenge::Pause,
            7,
            5,
            Duration::from_secs(10),
            Some(Duration::from_millis(61_500)),
            &program,
        );
        assert_eq!(
            words.join(" "),
            "lockslab challenge pause --seed 7 --clients 5 --ttl 10s --patience 61500ms \
             -- python3 'my client.py' ''"
        );
        let plain = replay_words(Challenge::Crash, 1, 3, DEFAULT_TTL, None, &program[..1]);
        assert_eq!(
            plain.join(" "),
            "lockslab challenge crash --seed 1 -- python3"
        );
    }

    #[test]
    fn a_long_replay_is_broken_between_words_with_continuations() {
        let program: Vec<String> = (0..12).map(|i| format!("argument-{i}")).collect();
        let words = replay_words(Challenge::Delay, 3, 4, DEFAULT_TTL, None, &program);
        let lines = replay_lines(&words, 80);
        assert!(lines.len() > 1, "{lines:?}");
        for line in &lines {
            assert!(line.len() <= 80, "{line:?}");
        }
        for line in &lines[..lines.len() - 1] {
            assert!(line.ends_with(" \\"), "{line:?}");
        }
        let joined = lines.join("\n").replace(" \\\n", " ");
        let words_back: Vec<&str> = joined.split_whitespace().skip(1).collect();
        assert_eq!(words_back, words);
    }
}
