//! The labs, one folder each, the one table that registers them, and the stage they all
//! play on.
//!
//! A lab is an orchestrator: it starts worker processes, freezes or kills them at the
//! moments the story needs, watches the lock in its backend, and finally reads the verdict
//! back from the store. [`Stage`] is what every lab uses for that: it spawns workers,
//! collects their events on one clock, and shows them on the timeline.

pub mod etcd_vs_redis;
pub mod failover;
pub mod faults;
pub mod gc_pause;
pub mod lease_guard;
pub mod leftovers;
pub mod naive;
pub mod network;
pub mod no_lock;
pub mod queue;
pub mod redlock;
pub mod replay;
pub mod runner;
pub mod skip_locked;
mod stage;
pub mod step;
pub mod words;

pub use stage::{Conclusion, History, Stage, WorkerHandle};

/// Registers the labs from one table: a row `Variant => module::Args` makes the lab's
/// subcommand (its `--help` is its `Args`'s doc comment and attributes), runs it
/// (`module::run`), replays its saved runs for `lockslab check` (`module::replay`) and shows
/// it in the menu (`module::MENU`). Nothing else in the crate names a lab's module (but
/// `lockslab proxy`, lab 8's tool for the by-hand part), so a new lab is its own folder, its
/// `pub mod` line above, and one row in [`lab_table!`]'s call below: the structure test
/// `a_lab_is_its_folder_and_one_row_of_the_lab_table` holds the crate to that.
macro_rules! lab_table {
    ($($variant:ident => $module:ident::$args:ident,)*) => {
        /// The labs' subcommands, in the course's order (flattened into the command line's
        /// own list, where they come first).
        #[derive(clap::Subcommand, Debug)]
        pub enum Lab {
            $($variant($module::$args),)*
        }

        impl Lab {
            /// The options every lab shares.
            pub fn output(&self) -> &OutputArgs {
                match self {
                    $(Lab::$variant(args) => &args.output,)*
                }
            }

            /// Plays the lab.
            pub fn run(&self) -> Result<()> {
                match self {
                    $(Lab::$variant(args) => $module::run(args),)*
                }
            }
        }

        /// Every lab's row in the menu, in the course's order.
        pub const LABS: &[LabRow] = &[$($module::MENU,)*];

        /// Judges a saved run of the lab named `command` again from its history; `None` when
        /// no lab has that name.
        pub fn replay(
            command: &str,
            events: &[crate::events::Event],
            verdict: &serde_json::Value,
        ) -> Option<Result<replay::Replayed>> {
            $(if command == $module::MENU.command {
                return Some($module::replay(events, verdict));
            })*
            None
        }

        /// The checker of the lab named `command` over a whole history: its [`Report`],
        /// each finding pointing at the events that prove it; `None` when no lab has that
        /// name.
        ///
        /// [`Report`]: crate::check::report::Report
        pub fn check(
            command: &str,
            history: &[crate::events::Event],
        ) -> Option<crate::check::report::Report> {
            $(if command == $module::MENU.command {
                return Some($module::check(history));
            })*
            None
        }
    };
}

lab_table! {
    GcPause => gc_pause::GcPauseArgs,
    Naive => naive::NaiveArgs,
    SkipLocked => skip_locked::SkipLockedArgs,
    EtcdVsRedis => etcd_vs_redis::EtcdVsRedisArgs,
    Failover => failover::FailoverArgs,
    Redlock => redlock::RedlockArgs,
    NoLock => no_lock::NoLockArgs,
    Network => network::NetworkArgs,
    LeaseGuard => lease_guard::LeaseGuardArgs,
    Queue => queue::QueueArgs,
}

/// The checker's [`Report`] on a run's history, by the lab its verdict names (`lab`): what a
/// picture of the run draws. None for a run no lab's checker judges (chaos, a challenge).
/// A run of today holds its read-backs in its history; an older recording's may sit in its
/// verdict, which [`crate::reproduce::report_for`] puts back first.
///
/// [`Report`]: crate::check::report::Report
pub fn report_of(
    history: &[crate::events::Event],
    verdict: Option<&serde_json::Value>,
) -> Option<crate::check::report::Report> {
    let lab = verdict?.get("lab")?.as_str()?;
    check(lab, history)
}

/// One lab, as the menu (`lockslab`, `lockslab list`) and `lockslab doctor` show it; each
/// lab's folder defines its own as `MENU`.
pub struct LabRow {
    pub number: u8,
    /// The subcommand, and the `lab` a saved run's verdict names.
    pub command: &'static str,
    /// What it shows, in one line.
    pub shows: &'static str,
    /// How long a run with the defaults takes, on a laptop, servers already started.
    pub takes: &'static str,
    pub needs: &'static [crate::connect::Backend],
    /// The servers it starts itself even when URLs are given (a room's, a team's), since it
    /// kills and restarts them or needs several; the menu says so, so that an attendee knows
    /// what must be installed on their own machine.
    pub starts_its_own: Option<&'static str>,
    pub walkthrough: &'static str,
    /// Minutes it takes in a workshop, with `--step` and its questions (README's plans).
    pub session: u8,
    /// The stops at a question that `--step` makes in a run with the defaults (counted by
    /// running it); a part longer than one screen adds a stop for each further screen.
    pub stops: u8,
    /// The tools its walkthrough's by-hand part runs, besides lockslab itself.
    pub by_hand: &'static [&'static str],
}

use std::time::Duration;

use anyhow::{Result, anyhow};

/// The exit-status lines every lab's `--help` ends with (a macro, so that `concat!` can
/// join it to each lab's examples at compile time): [`crate::exit::Exit`]'s, in a lab's
/// words.
#[macro_export]
macro_rules! lab_exit_status_help {
    () => {
        concat!(
            "\n\n",
            $crate::exit_status_help!(
                done: "the lab ran and its verdict was read back, whatever it shows (a stale \
                       write is the lesson, not a failure)"
            )
        )
    };
}

/// Options every lab shares.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct OutputArgs {
    /// Print JSON Lines on stdout: one object per event, then one `"kind": "verdict"` object
    #[arg(long)]
    pub json: bool,
    /// Stop before each reveal, print the question to ask the room, wait for Enter (q quits)
    #[arg(long)]
    pub step: bool,
    /// With --step: clear the screen when Enter is pressed, so that each part starts at
    /// the top of the screen
    #[arg(long, requires = "step")]
    pub clear: bool,
    /// Play the random choices (owner values, arrival spreads, retry delays) of the run
    /// that printed this seed. Timing is not replayed (which worker runs first, how long a
    /// server takes to answer); where the faults strike (a lab's freezes and kills, lab 7's
    /// job and moment) follows from its flags, not from the seed
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// After the run, draw it into FILE as a self-contained HTML page (timeline, lock bars,
    /// freezes, writes, verdict; details on hover)
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,
    /// After the run, draw it into FILE as an SVG image (the same drawing, verdict below)
    #[arg(long, value_name = "FILE")]
    pub svg: Option<std::path::PathBuf>,
}

impl OutputArgs {
    /// The pictures asked for, checked before the lab plays (a bad name fails at once).
    pub fn pictures(&self) -> Result<Vec<crate::picture::Target>> {
        let mut targets = Vec::new();
        for (flag, path) in [("--html", &self.html), ("--svg", &self.svg)] {
            let Some(path) = path else { continue };
            let target = crate::picture::Target::by_extension(path, flag)?;
            let fits = matches!(
                (flag, &target),
                ("--html", crate::picture::Target::Html(_))
                    | ("--svg", crate::picture::Target::Svg(_))
            );
            if !fits {
                crate::bail_usage!(
                    "{flag} {}: name the file {}",
                    path.display(),
                    if flag == "--html" { ".html" } else { ".svg" }
                );
            }
            target.check_writable(flag)?;
            targets.push(target);
        }
        Ok(targets)
    }
}

pub use crate::flags::{
    LONGEST_HANDS_ON, LONGEST_LAB_WAIT, LONGEST_STEP, duration_in, parse_duration,
};

/// A short random id that namespaces a run's keys, counters and rows, so that one shared
/// server can host a whole workshop without runs seeing each other: 8 hex digits, after
/// `<namespace>_` when `LOCKSLAB_NAMESPACE` names one (a room seat's, whose users reach
/// `lockslab:<namespace>_*` only). Lowercase letters, digits and `_` only: a run id goes
/// into key patterns and Postgres identifiers.
pub fn new_run_id() -> String {
    let hex = crate::seed::os_hex(8);
    // Checked by the command line before any lab starts (`servers::namespace`).
    match crate::servers::namespace().ok().flatten() {
        Some(namespace) => format!("{namespace}_{hex}"),
        None => hex,
    }
}

/// The check every lab with `--workers` and `--fault` makes when its plan is built: enough
/// workers for the fault's roles (`why` names them), and no more than 50.
pub fn enough_workers(workers: u32, fault: &str, needed: u32, why: &str) -> Result<()> {
    if workers < needed {
        crate::bail_usage!("--workers {workers}: --fault {fault} needs at least {needed} ({why})");
    }
    if workers > 50 {
        crate::bail_usage!("--workers {workers}: at most 50");
    }
    Ok(())
}

/// A worker's failure, as the orchestrator reports it. When a server froze or went away,
/// that is the cause and leads the line (and the orchestrator gives up on that server
/// too, so that its cleanup does not wait for it); anything else is the worker's own.
pub fn worker_failed(worker: &str, text: &str) -> anyhow::Error {
    if let Some(failure) = crate::connect::note_reported(text) {
        anyhow!("{failure} (worker {worker} saw it first)")
    } else {
        anyhow!("worker {worker} failed: {text}")
    }
}

use crate::watchdog::at_ms;
pub use crate::watchdog::{OwnPause, own_pauses};

/// After a lab: if it was paused itself, one sentence that says its figures are disturbed.
/// The runner says it after the verdict's words (so that a picture shows it too), or on
/// stderr with `--json`, whose verdict carries `disturbed`.
pub fn disturbed_note() -> Option<String> {
    let pauses = own_pauses();
    if pauses.is_empty() {
        return None;
    }
    let total: Duration = pauses.iter().map(|p| p.gap).sum();
    let text = format!(
        "⚠ disturbed: lockslab itself was not running for {} in all ({}): it was stopped or \
         starved of CPU, so every time above measured across that gap includes it. Run the lab \
         again for true figures.",
        crate::output::human(total),
        pauses
            .iter()
            .map(|p| format!(
                "{} from +{}",
                crate::output::human(p.gap),
                crate::output::human(Duration::from_millis(at_ms(p)))
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Some(text)
}

/// Keeps the first of each repeated flag value (`--guard none --guard fencing --guard none`,
/// `--way`…): a cell played twice would read back the first one's writes in its store row.
pub(crate) fn first_of_each<T: PartialEq + Clone>(values: &mut Vec<T>) {
    let mut kept: Vec<T> = Vec::new();
    for value in values.drain(..) {
        if !kept.contains(&value) {
            kept.push(value);
        }
    }
    *values = kept;
}

/// `--fencing off|on|both`: a lab's runs without fencing, with it, or one of each.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fencing {
    Off,
    On,
    Both,
}

impl Fencing {
    /// Whether each run is fenced, in the order they play.
    pub fn runs(self) -> Vec<bool> {
        match self {
            Fencing::Off => vec![false],
            Fencing::On => vec![true],
            Fencing::Both => vec![false, true],
        }
    }
}

#[cfg(test)]
mod tests {
    /// A row's variant names the subcommand, its folder's `MENU` names the menu row and the
    /// `lab` of `check`'s replay: the two must be one name, in one order.
    #[test]
    fn each_labs_subcommand_is_named_as_its_menu_row() {
        use clap::Subcommand;
        let labs = super::Lab::augment_subcommands(clap::Command::new("labs"));
        let subcommands: Vec<&str> = labs.get_subcommands().map(|c| c.get_name()).collect();
        let rows: Vec<&str> = super::LABS.iter().map(|lab| lab.command).collect();
        assert_eq!(subcommands, rows);
    }
}
