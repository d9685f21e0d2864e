//! `lockslab` with no arguments, and `lockslab list`: the lab menu.
//!
//! The rows come from [`LABS`], which `labs`'s one table builds from each lab's own
//! `MENU`: a lab's subcommand and its row are registered together, so a row never
//! advertises a command that is not there.

use colored::Colorize;

use crate::connect::Backend;
use crate::output::Style;

pub use crate::labs::{LABS, LabRow};

/// How long lab 12's Step 4 takes — `lockslab matrix --seed 1 --schedules 12`, every design
/// against every fault, twelve schedules a cell — measured on a busy two-core machine
/// (8 min 24 s). Lab 12's **Time:** line and the README say the same (a test checks).
pub const MATRIX_TAKES: &str = "9 min";

/// The labs, in order (the cli's tests check that each row names a subcommand it has).
pub fn available() -> Vec<&'static LabRow> {
    LABS.iter().collect()
}

/// The menu, fitted to 80 columns: a lab takes two lines (three for `lockslab list`:
/// its workshop session, its `--step` stops and the tools of its by-hand part).
///
/// The bare menu keeps to two lines a lab on purpose: it is a newcomer's first screen and
/// fits one 45-row terminal, which `list`'s extra line a lab does not (48 rows for ten
/// labs). It names `lockslab list` for what it leaves out.
pub fn print() {
    print_labs(false);
}

/// `lockslab list`: the menu with each lab's session, stops and by-hand tools.
pub fn print_list() {
    print_labs(true);
}

fn print_labs(detailed: bool) {
    Style::detect(false); // colours only on a terminal without NO_COLOR
    crate::outln!(
        "{} — learn distributed locks by breaking them",
        "lockslab".bold()
    );
    crate::outln!();
    for lab in available() {
        let own = lab.starts_its_own;
        let needs: Vec<&str> = lab
            .needs
            .iter()
            .filter(|b| own.is_none() || **b == Backend::Postgres)
            .map(|b| b.name())
            .collect();
        let needs = match own {
            Some(own) => format!("{own} · {}", needs.join(", ")),
            None => needs.join(", "),
        };
        // Padded before it is coloured: escape codes would count as width.
        let command = format!("{:<14}", lab.command);
        crate::outln!(
            "  {:>2}  {} {}",
            lab.number,
            command.cyan().bold(),
            lab.shows
        );
        crate::outln!(
            "      {:<14} {}",
            "",
            format!("~{} · {} · {}", lab.takes, needs, lab.walkthrough).dimmed()
        );
        if detailed {
            let by_hand = match lab.by_hand {
                [] => "lockslab only".to_string(),
                tools => tools.join(", "),
            };
            let session = format!("session {} min · --step: {} stops", lab.session, lab.stops);
            let by_hand = format!("by hand: {by_hand}");
            // One line when it fits in 80 columns, else the tools on a line of their own.
            let lines = if 21 + session.chars().count() + 3 + by_hand.chars().count() <= 80 {
                vec![format!("{session} · {by_hand}")]
            } else {
                vec![session, by_hand]
            };
            for line in lines {
                crate::outln!("      {:<14} {}", "", line.dimmed());
            }
        }
    }
    crate::outln!();
    crate::outln!("Type first:  {}", "lockslab gc-pause".bold());
    crate::outln!("Then read its walkthrough, labs/01-gc-pause.md: predict, run, read.");
    crate::outln!();
    crate::outln!(
        "{}",
        "  own: the lab starts those servers itself, even in a room (it kills them)".dimmed()
    );
    crate::outln!();
    crate::outln!("  lockslab <lab> --help   options and examples of one lab");
    crate::outln!("  lockslab <lab> --step   stop before each reveal, to ask the room");
    if !detailed {
        crate::outln!("  lockslab list           each lab's session, --step stops, by-hand tools");
    }
    crate::outln!("  lockslab chaos          random faults against a lock design (--help)");
    crate::outln!(
        "  lockslab matrix         every design against every kind of fault (~{MATRIX_TAKES})"
    );
    crate::outln!("  lockslab challenge      your own lock client, graded under faults");
    crate::outln!("  lockslab doctor         check this machine before a session");
    crate::outln!("  lockslab up             servers for the exercises by hand");
    crate::outln!("  lockslab --help         every command");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_has_a_walkthrough_path_and_a_unique_number() {
        for (i, lab) in LABS.iter().enumerate() {
            assert_eq!(
                usize::from(lab.number),
                i + 1,
                "numbered in the course's order"
            );
            assert!(
                lab.walkthrough
                    .starts_with(&format!("labs/{:02}-{}", lab.number, lab.command))
            );
        }
    }

    #[test]
    fn every_rows_by_hand_tools_are_the_ones_its_walkthrough_runs() {
        for lab in LABS {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(lab.walkthrough);
            let text = std::fs::read_to_string(&path).unwrap();
            for tool in ["redis-server", "redis-cli", "psql", "etcdctl", "jq"] {
                assert_eq!(
                    lab.by_hand.contains(&tool),
                    text.contains(tool),
                    "{}: {tool}",
                    lab.command
                );
            }
            assert!(lab.session > 0 && lab.stops > 0, "{}", lab.command);
        }
    }

    #[test]
    fn every_row_names_a_subcommand_the_cli_has() {
        use clap::CommandFactory;
        let cli = crate::cli::Cli::command();
        for lab in available() {
            assert!(
                cli.find_subcommand(lab.command).is_some(),
                "{}",
                lab.command
            );
        }
    }
}
