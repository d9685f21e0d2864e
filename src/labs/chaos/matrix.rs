//! `lockslab matrix`: every design against every kind of fault, K schedules a cell.

use std::process::ExitCode;

use anyhow::Result;
use colored::Colorize;
use serde_json::json;

use super::{Ground, chaos_exit_help, show, side_by_side, space};
use crate::check::chaos::Judgement;
use crate::nemesis::generate::{self, FaultKind};
use crate::output::{Style, json_line};
use crate::servers::ServerArgs;
use crate::worker::chaos_client::Design;

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab matrix                          every design × pause, kill, restart
  lockslab matrix --schedules 10 --seed 3  more schedules a cell
  lockslab matrix --design redis-lock --design optimistic --faults pause

A cell is SAFE (n schedules, no violation), UNSAFE (the first violation's kind;
its replay command below the table) or INCONCLUSIVE (some history could not
be decided). A cell stops at its first violation. `restart` crashes chaos's
own Redis: designs without Redis show `-` there.

Walkthrough: labs/12-chaos.md.

", chaos_exit_help!()))]
pub struct MatrixArgs {
    /// The designs (rows), repeatable [default: every design]
    #[arg(long, value_enum)]
    pub design: Vec<Design>,
    /// The kinds of fault (columns), comma-separated [default: every kind]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<FaultKind>,
    /// How many schedules each cell plays (it stops at its first violation)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub schedules: u32,
    /// Draw every cell's schedules from this seed (printed when not given)
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// How many clients do jobs through the design at once
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub clients: u32,
    /// Schedules played side by side, each in its own namespace (one that restarts a
    /// server plays alone)
    #[arg(long, default_value_t = super::DEFAULT_PARALLEL, value_name = "P",
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub parallel: u32,
    /// JSON Lines: one object per cell, then the verdict
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub servers: ServerArgs,
}

pub fn run(args: &MatrixArgs) -> Result<ExitCode> {
    let designs = if args.design.is_empty() {
        Design::ALL.to_vec()
    } else {
        args.design.clone()
    };
    let kinds = if args.faults.is_empty() {
        FaultKind::ALL.to_vec()
    } else {
        args.faults.clone()
    };
    let seed = args.seed.unwrap_or_else(crate::seed::fresh);
    let style = Style::detect(args.json);
    super::could_not_run((|| {
        let mut ground = Ground::start(&args.servers, &designs, args.parallel)?;
        if !style.json {
            crate::prose!(
                "Matrix: {} designs × {} faults, {} schedules a cell, seed {seed}.",
                designs.len(),
                kinds.len(),
                args.schedules
            );
            let head: String = kinds.iter().map(|k| format!("{:<20}", k.name())).collect();
            crate::outln!("{:<18}{}", "design", head.trim_end());
        }
        let mut replays = Vec::new();
        let (mut any_unsafe, mut any_unknown) = (false, false);
        let mut cells = Vec::new();
        for design in &designs {
            let setup = ground.setup(*design);
            let mut row = format!("{:<18}", design.name());
            for kind in &kinds {
                let space = space(&setup, args.clients, &[*kind]);
                let cell = if *kind == FaultKind::Restart && space.restartable.is_empty() {
                    ("-".to_string(), None)
                } else {
                    let next = |index: u64| {
                        let seed = generate::nth_seed(seed, index);
                        (index < u64::from(args.schedules)).then(|| side_by_side::Job {
                            index,
                            seed,
                            schedule: generate::draw(seed, &space),
                            clients: args.clients,
                        })
                    };
                    let played = side_by_side::play(&setup, args.parallel, true, next, |_| {})?;
                    let unknown = played
                        .iter()
                        .filter(|p| p.trial.report.judgement() == Judgement::Inconclusive)
                        .count();
                    let found = played
                        .iter()
                        .filter(|p| p.trial.report.judgement() == Judgement::Unsafe)
                        .min_by_key(|p| p.done)
                        .map(|p| (&p.job.schedule, &p.trial));
                    let played = played.len();
                    match found {
                        Some((schedule, trial)) => {
                            any_unsafe = true;
                            let kind_word = trial.report.violations[0].kind();
                            let replay = show::replay_command(*design, args.clients, schedule);
                            replays.push((design.name(), kind.name(), replay.clone()));
                            (format!("UNSAFE {kind_word}"), Some(replay))
                        }
                        None if unknown > 0 => {
                            any_unknown = true;
                            (format!("INCONCLUSIVE {unknown}/{played}"), None)
                        }
                        None => (format!("SAFE ({played})"), None),
                    }
                };
                cells.push(json!({
                    "kind": "cell", "design": design.name(), "fault": kind.name(),
                    "result": cell.0, "replay": cell.1,
                    "labs_call_it_safe": design.labs_call_it_safe(),
                }));
                if style.json {
                    json_line(cells.last().expect("just pushed"));
                }
                row.push_str(&paint(&cell.0));
            }
            ground.give_back(setup);
            if !style.json {
                crate::outln!("{}", row.trim_end());
            }
        }
        if style.json {
            json_line(&json!({
                "kind": "verdict", "json_version": crate::labs::JSON_VERSION, "lab": "matrix",
                "run_id": ground.run_id, "seed": seed, "schedules_per_cell": args.schedules,
                "unsafe": any_unsafe, "inconclusive": any_unknown,
            }));
        } else {
            for (design, kind, replay) in &replays {
                crate::outln!();
                crate::outln!("{design} × {kind}:");
                crate::outln!("  {replay}");
            }
        }
        let code = if any_unsafe {
            super::EXIT_VIOLATION
        } else if any_unknown {
            super::EXIT_ONLY_UNKNOWNS
        } else {
            crate::exit::EXIT_OK
        };
        Ok(ExitCode::from(code))
    })())
}

/// A cell's word in colour (padding counts the visible characters only).
fn paint(cell: &str) -> String {
    let padded = format!("{cell:<19} ");
    if cell.starts_with("UNSAFE") {
        padded.red().to_string()
    } else if cell.starts_with("SAFE") {
        padded.green().to_string()
    } else if cell.starts_with("INCONCLUSIVE") {
        padded.yellow().to_string()
    } else {
        padded
    }
}
