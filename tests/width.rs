//! Projector-fit output: every lab's default run, and every `--help`, fits 80 columns.
//!
//! An instructor's terminal on a projector is often 80 columns wide. Lines that run past it
//! wrap mid-word and break the timeline's columns, so each lab wraps its own prose and
//! events, and turns a table that would not fit into one block per row.
//!
//! The labs stepped in tests/instructor.rs (skip-locked, etcd-vs-redis, failover, redlock,
//! no-lock, lease-guard, network, queue, and gc-pause at a short TTL) are held to 80
//! columns there: a stepped run prints every line of the default run, and its questions
//! besides. Here: the two labs not stepped at their defaults.

use crate::common;

use common::lockslab;

const WIDTH: usize = 80;

/// The lines wider than the width ([`common::too_wide`]).
fn too_wide(text: &str) -> Vec<String> {
    common::too_wide(text, WIDTH)
}

#[test]
fn an_emoji_counts_two_columns() {
    let line = format!("{} ✅", "x".repeat(78));
    assert_eq!(line.chars().count(), 80);
    assert_eq!(too_wide(&line).len(), 1);
}

fn default_run_fits(lab: &str) {
    let output = lockslab(&[lab])
        .env("COLUMNS", WIDTH.to_string())
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{lab}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.lines().count() > 10,
        "{lab} printed little:\n{stdout}"
    );
    let wide = too_wide(&stdout);
    assert!(
        wide.is_empty(),
        "{lab}: lines over {WIDTH}:\n{}",
        wide.join("\n")
    );
}

#[test]
fn gc_pause_fits_80_columns() {
    default_run_fits("gc-pause");
}

#[test]
fn naive_fits_80_columns() {
    default_run_fits("naive");
}

#[test]
fn every_help_fits_80_columns_even_when_piped() {
    for command in helps() {
        let mut args: Vec<&str> = command.split_whitespace().collect();
        args.push("--help");
        let output = lockslab(&args).env_remove("COLUMNS").output().unwrap();
        let wide = too_wide(&String::from_utf8_lossy(&output.stdout));
        assert!(
            wide.is_empty(),
            "lockslab {command} --help:\n{}",
            wide.join("\n")
        );
    }
}

/// Every `--help` a learner reads: the top level, every lab of the menu, the tools.
fn helps() -> Vec<String> {
    let tools = [
        "", "worker", "up", "reset", "doctor", "render", "check", "list", "chaos", "matrix",
    ];
    let labs = lockslab::menu::available()
        .into_iter()
        .map(|lab| lab.command);
    let challenge = ["challenge"];
    tools
        .into_iter()
        .chain(challenge)
        .chain(labs)
        .map(String::from)
        .collect()
}

/// An example's description that runs past 80 columns must continue under its own column:
/// clap re-wraps it at the line's indentation instead, under the command (`  etcd`).
#[test]
fn every_help_keeps_its_examples_in_two_columns() {
    // `worker` and `list` show their examples elsewhere (after_help prose, the menu).
    for command in helps().into_iter().filter(|c| c != "worker" && c != "list") {
        let mut args: Vec<&str> = command.split_whitespace().collect();
        args.push("--help");
        let output = lockslab(&args).env_remove("COLUMNS").output().unwrap();
        let help = String::from_utf8_lossy(&output.stdout).to_string();
        let examples: Vec<&str> = help
            .lines()
            .skip_while(|line| *line != "Examples:")
            .skip(1)
            .take_while(|line| !line.is_empty())
            .collect();
        assert!(
            !examples.is_empty(),
            "lockslab {command} --help has examples"
        );
        let broken: Vec<&&str> = examples
            .iter()
            .filter(|line| {
                let starts_a_command = line.starts_with("  lockslab")
                    || line.trim_start().split('=').next().is_some_and(|name| {
                        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    });
                line.starts_with("  ") && !line.starts_with("   ") && !starts_a_command
            })
            .collect();
        assert!(
            broken.is_empty(),
            "lockslab {command} --help wraps an example under its command:\n{}",
            broken
                .iter()
                .map(|l| l.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

/// Issue 45: the hands-on worker's lines are fitted to the terminal, broken at spaces,
/// however narrow (a projector's terminal broke its long lines mid-word).
#[test]
fn the_hands_on_workers_lines_fit_a_narrow_terminal() {
    let lock = format!("width-{}", std::process::id());
    let output = lockslab(&[
        "worker", "--lock", &lock, "--ttl", "300ms", "--work", "400ms",
    ])
    .env("COLUMNS", "60")
    .env("NO_COLOR", "1")
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    // --work not shorter than --ttl: the worker's long note is among its lines.
    assert!(stdout.contains("note:"), "{stdout}");
    let wide = common::too_wide(&stdout, 60);
    assert!(wide.is_empty(), "lines over 60:\n{}", wide.join("\n"));
}
