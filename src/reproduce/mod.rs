//! `lockslab check RUN.jsonl`: a run's verdict reproduced offline, from its `--json` alone.
//!
//! A run's `--json` is its history — what every worker, backend and fault said, and the
//! store's read-back — and then its verdict. This reads the two back, recognises the lab from
//! the verdict's `lab`, and hands both to the lab's own `replay` (`labs::replay` finds it by
//! that name), which cuts the history into the verdict's parts and judges each with the code
//! the live run judged it with. Then it sets what the replay reached beside what the run
//! recorded, field by field.
//!
//! ```text
//! RUN.jsonl ──> events + verdict ──> labs::<lab>::replay (the lab's own checkers) ──> fields
//!                                                   └──> compare with the recorded fields ──> 0 | 1 | 4
//! ```
//!
//! No server is asked anything: the history is the evidence.

pub mod challenge;
pub mod compare;
mod words;

use std::io::Read;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::check::report::Report;
use crate::events::{Event, envelope};
use crate::exit::Exit;
use crate::labs::replay::{Completion, Replayed};

/// What `check` replays, as verdicts name it: every lab, then the tools that keep their
/// histories (`challenge`, `chaos`).
pub fn supported() -> String {
    let labs = crate::labs::LABS.iter().map(|lab| lab.command);
    labs.chain(["challenge", "chaos"])
        .collect::<Vec<_>>()
        .join(", ")
}

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab gc-pause --json > run.jsonl   record a run
  lockslab check run.jsonl               judge it again, offline: does the
                                         history give the verdict it recorded?
  lockslab network --json | lockslab check -
                                         the same, straight from a live run

It reads the run's history (every event, and the store's read-back the
verdict was judged from), judges each part again with the lab's own checkers
— the code the live run used — and lists each field of the verdict it reached
beside the recorded one. No server is asked anything. Then the run's checker
(the lab's, or a chaos hunt's on each history) reports on the whole history:
valid, invalid or unknown, and each finding with the events (their place in the
file and their time) that prove it.

Replays: the ten labs (gc-pause … queue), `lockslab challenge` runs and
`lockslab chaos` hunts (each history it printed, and the hunt's counts).

", crate::exit_status_help!(
    done: "reproduced (every field the history decides agrees)",
    violation: "some field disagrees (both values are listed)"
), " A file cut short, not a run's --json, or of a lab it does not replay could not be \
replayed (4); a line says what to do."))]
pub struct CheckArgs {
    /// A run's `--json` output (`lockslab <lab> --json > RUN.jsonl`); `-` reads stdin
    #[arg(value_name = "RUN.jsonl")]
    pub input: String,
}

/// A run's `--json`, read back: its history, its verdict, and any summary lines of a tool
/// that plays many histories (`chaos`'s `schedule`, `matrix`'s `cell`).
#[derive(Debug, Default)]
pub struct Recorded {
    pub events: Vec<Event>,
    pub verdict: Option<Value>,
    /// The summary lines of a tool that plays many histories (`chaos`'s `schedule` lines).
    pub summaries: Vec<Value>,
}

/// `lockslab check`: reads, replays, compares, and says so; the exit status is the answer.
pub fn run(args: &CheckArgs) -> Result<Exit> {
    let name = if args.input == "-" {
        "stdin".to_string()
    } else {
        args.input.clone()
    };
    let outcome = read(&args.input)
        .and_then(|text| Recorded::from_jsonl(&text))
        .and_then(|recorded| {
            let replayed = replay(&recorded)?;
            Ok((recorded, replayed))
        });
    let (recorded, replayed) = match outcome {
        Ok(both) => both,
        Err(err) if err.is::<crate::exit::UsageError>() => return Err(err),
        Err(err) => {
            crate::output::err_prose(&format!("lockslab check: {name}: {err:#}"));
            return Ok(Exit::CouldNotRun);
        }
    };
    let compared = compare::compare(&replayed);
    if compared.count_compared() == 0 {
        crate::output::err_prose(&format!(
            "lockslab check: {name}: the replay reached no field this recording has, so there \
             is nothing to compare: was it written by a much older lockslab? Record the run \
             again with this one (`lockslab <lab> --json > run.jsonl`)"
        ));
        return Ok(Exit::CouldNotRun);
    }
    words::print(&name, &recorded, &replayed, &compared);
    words::print_report(&judge(&recorded, &replayed));
    // The replay reached the recorded verdict (0), or some field disagrees (1).
    Ok(if compared.agrees() {
        Exit::Done
    } else {
        Exit::Violation
    })
}

/// The text of a saved run, or of stdin (`-`).
fn read(input: &str) -> Result<String> {
    if input != "-" {
        return crate::picture::read_saved_run(std::path::Path::new(input));
    }
    let mut bytes = Vec::new();
    std::io::stdin()
        .lock()
        .take(crate::picture::MOST_BYTES + 1)
        .read_to_end(&mut bytes)
        .context("reading stdin")?;
    if bytes.len() as u64 > crate::picture::MOST_BYTES {
        bail!(
            "more than {} MB on stdin: a run's --json is far smaller",
            crate::picture::MOST_BYTES >> 20
        );
    }
    String::from_utf8(bytes).context("stdin is not UTF-8 text")
}

/// Hands the run to its lab's replay.
pub fn replay(recorded: &Recorded) -> Result<Replayed> {
    let Some(verdict) = &recorded.verdict else {
        if recorded.events.is_empty() {
            bail!(
                "nothing to replay in it: expected a run's --json output \
                 (`lockslab <lab> --json > run.jsonl`)"
            );
        }
        bail!(
            "this file has no verdict line: was it cut short? run the lab again with \
             --json > run.jsonl, and let it finish"
        );
    };
    envelope::readable(verdict, "check")?;
    let lab = verdict.get("lab").and_then(Value::as_str).unwrap_or("");
    let events = &recorded.events;
    let replayed = match lab {
        "challenge" => challenge::replay(events, verdict),
        "chaos" => crate::chaos::replay(events, &recorded.summaries, verdict),
        "matrix" => bail!(
            "a `lockslab matrix` run's --json holds one line per cell, not the histories \
             behind it, so there is nothing to judge again; hunt one cell again with \
             `lockslab chaos --design D --faults F --json > run.jsonl` and check that. \
             `check` replays: {}",
            supported()
        ),
        "" => bail!(
            "its verdict line names no lab: was it written by lockslab? `check` replays: {}",
            supported()
        ),
        other => match crate::labs::replay(other, events, verdict) {
            Some(replayed) => replayed,
            None => bail!(
                "`{other}` is not a lab `check` replays (an older or newer lockslab's?); it \
                 replays: {}",
                supported()
            ),
        },
    };
    replayed.with_context(|| {
        format!(
            "could not replay this {lab} run (was the file edited, or written by an older \
             lockslab?)"
        )
    })
}

/// The run's checker on its whole history: the [`Report`], and the history it judged.
#[derive(Debug)]
pub struct Judged {
    pub report: Report,
    /// The file's events, with any read-back an older recording kept in its verdict put
    /// back where a recording of today holds it; the findings point into this.
    pub history: Vec<Event>,
    /// For each event of `history`, its position among the file's events (None for a
    /// read-back taken out of the verdict).
    pub in_file: Vec<Option<usize>>,
}

/// The run's checker over its whole history, as one [`Report`]: each lab's `check`, a
/// hunt's histories each judged again ([`crate::chaos::check`]), or the challenge's grader
/// ([`challenge::report`]), whose findings point at the events that prove them. `Err` says
/// why a run has none.
pub fn judge(recorded: &Recorded, replayed: &Replayed) -> Result<Judged, &'static str> {
    let lab = recorded
        .verdict
        .as_ref()
        .and_then(|v| v.get("lab"))
        .and_then(Value::as_str)
        .unwrap_or("");
    // A tool's history is its file's events as they are: the report points at them.
    let tool = |report: Report| Judged {
        report,
        history: recorded.events.clone(),
        in_file: (0..recorded.events.len()).map(Some).collect(),
    };
    let verdict = recorded.verdict.as_ref().ok_or("no verdict")?;
    match lab {
        "chaos" => crate::chaos::check(&recorded.events, &recorded.summaries, verdict)
            .map(tool)
            .map_err(|_| "the hunt's histories could not be judged again"),
        "challenge" => challenge::report(&recorded.events, verdict)
            .map(tool)
            .map_err(|_| "the challenge could not be graded again"),
        lab => {
            let (history, in_file) = Completion::completed(&recorded.events, &replayed.completions);
            let report = crate::labs::check(lab, &history).ok_or("no checker knows this run")?;
            Ok(Judged {
                report,
                history,
                in_file,
            })
        }
    }
}

/// The run's [`Report`] for a reader of its events (the picture): [`judge`] on the run,
/// its findings pointing into `events`. A read-back taken out of an older recording's
/// verdict is not one of `events`, so no finding points at it there. A run whose verdict
/// the replay cannot read is judged by its lab's checker on `events` as they are; None for
/// a run no checker judges (no verdict, a challenge recorded before today's grader).
pub fn report_for(events: &[Event], verdict: Option<&Value>) -> Option<Report> {
    let recorded = Recorded {
        events: events.to_vec(),
        verdict: verdict.cloned(),
        summaries: Vec::new(),
    };
    let judged = replay(&recorded)
        .ok()
        .and_then(|replayed| judge(&recorded, &replayed).ok());
    let Some(judged) = judged else {
        return crate::labs::report_of(events, verdict);
    };
    let in_file = |i: usize| judged.in_file.get(i).copied().flatten();
    let mut report = judged.report;
    for finding in &mut report.findings {
        finding.events = finding.events.iter().filter_map(|&i| in_file(i)).collect();
        finding.subject = finding.subject.and_then(in_file);
    }
    Some(report)
}

impl Recorded {
    /// Reads a saved `--json` stream: one JSON object per line, the verdict last.
    pub fn from_jsonl(text: &str) -> Result<Recorded> {
        let mut recorded = Recorded::default();
        let mut verdict_line = None;
        // A byte-order mark or CRLF line ends (a file saved by an editor) change nothing.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (number, line) in text.lines().enumerate() {
            let number = number + 1;
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(line).with_context(|| {
                format!(
                    "line {number} is not JSON: a run's --json is one JSON object per line \
                     (`lockslab <lab> --json > run.jsonl`)"
                )
            })?;
            if !value.is_object() {
                bail!("line {number} is not a JSON object");
            }
            if let Some(seen) = verdict_line {
                bail!(
                    "line {number} follows the verdict of line {seen}: this file holds more than \
                     one run; save each run to a file of its own and check each"
                );
            }
            match value.get("kind").and_then(Value::as_str) {
                Some("verdict") => {
                    recorded.verdict = Some(value);
                    verdict_line = Some(number);
                }
                Some("schedule" | "cell") => recorded.summaries.push(value),
                _ => {
                    let event: Event = crate::events::read_line(value).with_context(|| {
                        format!(
                            "line {number} is not an event lockslab records (docs/json.md): \
                             was it edited, or written by another lockslab?"
                        )
                    })?;
                    recorded.events.push(event);
                }
            }
        }
        Ok(recorded)
    }

    /// The verdict's lab, run id and `--json` shape, for the heading.
    fn stamp(&self) -> (String, String, Option<u64>) {
        let field = |name: &str| {
            self.verdict
                .as_ref()
                .and_then(|v| v.get(name))
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        let version = self.verdict.as_ref().and_then(envelope::version_of);
        (field("lab"), field("run_id"), version)
    }
}
