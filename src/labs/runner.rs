//! The runner: what every lab does the same way, done once.
//!
//! A lab is a plan (its flags, checked once when the plan is built), the scenarios it plays
//! and its words. Everything around that is here: finding or starting the servers, the run
//! id that namespaces the run's keys and rows, the heading and the server lines, removing
//! what the run left (at the end and on Ctrl-C), the `--step` stop before the verdict, and
//! the verdict itself — one `"kind": "verdict"` JSON object under `--json`, the lab's own
//! table otherwise.
//!
//! ```text
//! cli ──> Plan::from(args)? ──> runner::run(plan) ──> servers, run id, heading, leftovers
//!                                     └──> plan.play(&mut run) ──> Verdict ──> JSON | table
//! ```

use std::time::Instant;

use anyhow::Result;
use colored::Colorize;
use serde_json::{Map, Value};

use super::OutputArgs;
use super::leftovers::Leftovers;
use super::stage::{History, Stage};
use super::step::Checkpoint;
use super::words::Words;
use crate::connect::{self, Backend};
use crate::events::envelope;
use crate::nemesis::schedule::Schedule;
use crate::output::{Style, Timeline, json_line, run_heading, stamp_verdict};
use crate::picture::Recording;
use crate::servers::{self, ServerArgs, Servers};

/// What the runner needs to know of a lab.
pub trait Lab {
    /// The verdict this lab's play returns.
    type Verdict: Verdict;

    /// The subcommand (`gc-pause`): the heading's and the JSON's name for the lab.
    fn name(&self) -> &'static str;

    /// The servers it needs from [`servers::provide`] (a lab that starts its own cluster
    /// needs none of them).
    fn needs(&self) -> Vec<Backend>;

    /// The lines under the heading: what is about to happen, in a sentence or two.
    fn intro(&self, run: &Run) -> Vec<String>;

    /// What the run writes on the servers, to be removed when it ends however it ends.
    fn leftovers(&self, run: &Run, leftovers: Leftovers) -> Leftovers {
        let _ = run;
        leftovers
    }

    /// The faults the lab plays, as data ([`super::faults`]): `--step` shows them under the
    /// intro and `--json` carries them in the verdict (`schedule`).
    fn schedule(&self) -> Option<Schedule> {
        None
    }

    /// Plays the lab's scenarios and decides the verdict from what the servers answered.
    fn play(&mut self, run: &mut Run) -> Result<Self::Verdict>;
}

/// A lab's verdict: what `--json` carries and what the terminal shows.
pub trait Verdict {
    /// The verdict's own fields; the runner puts them in the [`envelope`].
    fn fields(&self) -> Map<String, Value>;
    /// The verdict table and its sentences, as data: the runner exports them to the
    /// terminal, to `--json`'s `text` and to the picture ([`super::words`]).
    fn words(&self) -> Words;
    /// The `--step` stop before the verdict is shown, if the lab has one.
    fn checkpoint(&self) -> Option<&'static Checkpoint> {
        None
    }
    /// The outcome in one line, as a room's results count it across seats (`lockslab
    /// results`): short, and the same words for the same outcome.
    fn headline(&self) -> String {
        "ran to its verdict".into()
    }
}

/// One run of a lab: what the runner set up for it.
pub struct Run {
    /// The run id every key, row and counter of the run carries.
    pub id: String,
    pub style: Style,
    pub servers: Servers,
    /// The run's clock: every stage of the run stamps its events from here.
    pub started: Instant,
    /// The lines before the first scenario (the heading, the servers, the intro).
    pub intro: Timeline,
    /// Every event the run's stages showed, for its pictures.
    pub history: History,
}

impl Run {
    pub fn url(&self, backend: Backend) -> &str {
        self.servers.url(backend)
    }

    /// A stage on the run's clock, keeping its events in the run's history.
    pub fn stage(&self) -> Stage {
        Stage::on_clock(self.style, self.started).recorded_in(&self.history)
    }

    /// One more line under the heading (a lab that starts servers of its own says so).
    pub fn say(&self, line: &str) {
        self.intro.say(line);
    }

    /// One dimmed detail line under the heading, like the server lines.
    pub fn detail(&self, line: &str) {
        self.intro.say(&format!("  {}", line.dimmed()));
    }
}

/// Runs a lab from start to verdict.
pub fn run<L: Lab>(lab: &mut L, output: &OutputArgs, server_args: &ServerArgs) -> Result<()> {
    let style = Style::detect(output.json);
    let servers = servers::provide(server_args, &lab.needs())?;
    let mut run = Run {
        id: super::new_run_id(),
        style,
        servers,
        started: Instant::now(),
        intro: Timeline::new(style),
        history: History::default(),
    };
    run.intro.say(&run_heading(lab.name(), &run.id));
    for line in run.servers.describe() {
        run.detail(&line);
    }
    for line in lab.intro(&run) {
        run.intro.say(&line);
    }
    let schedule = lab.schedule();
    if let Some(schedule) = schedule.as_ref().filter(|_| super::step::stepping()) {
        for line in super::faults::lines(schedule) {
            run.detail(&line);
        }
    }
    let removal = lab
        .leftovers(&run, Leftovers::of_run(&run.id))
        .removed_at_the_end();
    let verdict = lab.play(&mut run).map_err(connect::explain);
    if verdict.is_err() {
        super::step::show_held();
    }
    removal.now(&verdict);
    let verdict = verdict?;
    if let Some(stop) = verdict.checkpoint() {
        super::step::checkpoint(stop);
    }
    let mut fields = verdict.fields();
    schedule_fields(&mut fields, schedule.as_ref(), run.history.schedules())?;
    let mut verdict_json = envelope::verdict(lab.name(), &run.id, fields);
    stamp_verdict(&mut verdict_json);
    let mut words = verdict.words();
    let note = super::disturbed_note();
    if style.json {
        // The verdict's words as a terminal shows them, without colours, so `render` draws
        // the same verdict as a live `--html`.
        if let Some(fields) = verdict_json.as_object_mut() {
            fields.insert("text".into(), words.plain().into());
        }
        json_line(&verdict_json);
        if let Some(note) = &note {
            crate::errln!("lockslab: {note}");
        }
    } else {
        if let Some(note) = note {
            words.prose(note);
        }
        words.print();
        crate::output::screens::finish();
        super::step::show_held();
    }
    crate::room::record(
        server_args.postgres_url.as_deref(),
        lab.name(),
        &verdict.headline(),
        &verdict_json,
    );
    let pictures = output.pictures()?;
    if !pictures.is_empty() {
        // The verdict's object even without --json, and the lab's checker's Report on the
        // history: the picture draws the Report's findings (two holders, the late write),
        // never its own.
        let mut recording =
            Recording::of_run(run.history.take(), Some(verdict_json), words.plain());
        recording.report = super::report_of(&recording.events, recording.verdict.as_ref());
        crate::picture::draw(&pictures, &recording, style.json)?;
    }
    Ok(())
}

/// The faults the run played, for `--json`: the lab's own schedule when it names one (the
/// same in each of its runs), or the one its stages played (`schedule`); a lab whose parts
/// played different schedules carries them all, in the order played (`schedules`). Either
/// replays on a chaos design: `lockslab chaos --design D --schedule FILE`.
fn schedule_fields(
    fields: &mut Map<String, Value>,
    declared: Option<&Schedule>,
    played: Vec<Schedule>,
) -> Result<()> {
    match (declared, played.as_slice()) {
        (Some(schedule), _) | (None, [schedule]) => {
            fields.insert("schedule".into(), serde_json::to_value(schedule)?);
        }
        (None, []) => {}
        (None, several) => {
            fields.insert("schedules".into(), serde_json::to_value(several)?);
        }
    }
    Ok(())
}
