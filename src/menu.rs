//! `lockslab` with no arguments, and `lockslab list`: the lab menu.
//!
//! One table, [`LABS`], one row per lab. A row shows only when its subcommand exists in
//! the command line's definition, so a lab written on another branch appears in the menu
//! the moment its subcommand is merged, and a row never advertises a command that is not
//! there.

use colored::Colorize;

use crate::connect::Backend;
use crate::output::Style;

/// One lab, as the menu shows it.
pub struct LabRow {
    pub number: u8,
    /// The subcommand.
    pub command: &'static str,
    /// What it shows, in one line.
    pub shows: &'static str,
    /// How long a run with the defaults takes, on a laptop, servers already started.
    pub takes: &'static str,
    pub needs: &'static [Backend],
    pub walkthrough: &'static str,
    /// Minutes it takes in a workshop, with `--step` and its questions (README's plans).
    pub session: u8,
    /// The stops at a question that `--step` makes in a run with the defaults (counted by
    /// running it); a part longer than one screen adds a stop for each further screen.
    pub stops: u8,
    /// The tools its walkthrough's by-hand part runs, besides lockslab itself.
    pub by_hand: &'static [&'static str],
}

use Backend::{Etcd, Postgres, Redis};

/// Every lab, in the order of the course. Times are measured with defaults against running
/// servers (`lockslab <lab>` with `lockslab up`'s servers); private servers add a few seconds.
pub const LABS: &[LabRow] = &[
    LabRow {
        number: 1,
        command: "gc-pause",
        shows: "frozen past its TTL, A writes late: fencing refuses it",
        takes: "6s",
        needs: &[Redis, Postgres],
        walkthrough: "labs/01-gc-pause.md",
        session: 15,
        stops: 3,
        by_hand: &["redis-cli", "jq"],
    },
    LabRow {
        number: 2,
        command: "naive",
        shows: "the naive Redis lock broken four ways, each beside its fix",
        takes: "17s",
        needs: &[Redis],
        walkthrough: "labs/02-naive.md",
        session: 10,
        stops: 5,
        by_hand: &["redis-cli", "jq"],
    },
    LabRow {
        number: 3,
        command: "skip-locked",
        shows: "a Postgres job queue: kill and freeze a worker",
        takes: "3s",
        needs: &[Postgres],
        walkthrough: "labs/03-skip-locked.md",
        session: 10,
        stops: 2,
        by_hand: &["psql", "jq"],
    },
    LabRow {
        number: 4,
        command: "etcd-vs-redis",
        shows: "kill or freeze the holder: who hands over, who fences",
        takes: "15s",
        needs: &[Redis, Etcd, Postgres],
        walkthrough: "labs/04-etcd-vs-redis.md",
        session: 15,
        stops: 4,
        by_hand: &["psql", "jq"],
    },
    LabRow {
        number: 5,
        command: "failover",
        shows: "Redis failover hands the lock out twice; etcd does not",
        takes: "16s",
        needs: &[Redis, Etcd, Postgres],
        walkthrough: "labs/05-failover.md",
        session: 15,
        stops: 3,
        by_hand: &["redis-server", "redis-cli", "etcdctl", "jq"],
    },
    LabRow {
        number: 6,
        command: "redlock",
        shows: "Redlock on five masters: quorum, validity, no fencing",
        takes: "8s",
        needs: &[Redis, Postgres],
        walkthrough: "labs/06-redlock.md",
        session: 15,
        stops: 5,
        by_hand: &["redis-server", "redis-cli"],
    },
    LabRow {
        number: 7,
        command: "no-lock",
        shows: "the same job with no lock: optimistic writes, idempotency",
        takes: "26s",
        needs: &[Redis, Postgres],
        walkthrough: "labs/07-no-lock.md",
        session: 15,
        stops: 10,
        by_hand: &["psql"],
    },
    LabRow {
        number: 8,
        command: "network",
        shows: "no pause: a checked write held in flight past the lease",
        takes: "25s",
        needs: &[Redis, Etcd, Postgres],
        walkthrough: "labs/08-network.md",
        session: 15,
        stops: 19,
        by_hand: &[],
    },
    LabRow {
        number: 9,
        command: "lease-guard",
        shows: "lease guards short of fencing, and the gap each leaves",
        takes: "80s",
        needs: &[Redis, Postgres],
        walkthrough: "labs/09-lease-guard.md",
        session: 15,
        stops: 9,
        by_hand: &["redis-server"],
    },
    LabRow {
        number: 10,
        command: "queue",
        shows: "etcd's queue recipe: no herd, fair order, churn, election",
        takes: "20s",
        needs: &[Redis, Etcd, Postgres],
        walkthrough: "labs/10-queue.md",
        session: 10,
        stops: 8,
        by_hand: &["jq"],
    },
];

/// Labs that start servers of their own even when URLs are given (a room's, a team's):
/// they kill and restart them, or need several. The menu says so, so that an attendee
/// knows what must be installed on their own machine.
pub const STARTS_ITS_OWN: &[(&str, &str)] =
    &[("failover", "own Redis+etcd"), ("redlock", "own 5 Redis")];

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
        let own = STARTS_ITS_OWN
            .iter()
            .find(|(command, _)| *command == lab.command)
            .map(|(_, own)| *own);
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
    crate::outln!("  lockslab matrix         every design against every kind of fault");
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
    fn every_lab_that_starts_its_own_servers_is_a_row() {
        for (command, _) in STARTS_ITS_OWN {
            assert!(LABS.iter().any(|lab| lab.command == *command), "{command}");
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
