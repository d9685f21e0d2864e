//! A picture of a run: the timeline as an SVG drawing or a self-contained HTML page.
//!
//! Drawn from the same objects `--json` prints — the events and the verdict — whether they
//! come from the run that just ended (`--html FILE`, `--svg FILE`: the runner hands over
//! the run's typed history, [`crate::labs::History`]) or from a saved stream
//! (`lockslab render RUN.jsonl`).
//!
//! What the picture shows comes from the backends' answers, not from what a worker believed
//! ([`model`] says how each bar is cut): a lock's bar starts when the backend granted it and
//! ends when the backend said it was gone — the holder's own release deleting it, an expiry
//! the lab saw, another holder's grant (an exclusive lock is only granted once the previous
//! key, lease or session is gone), a killed Postgres session. Past that end, while the old
//! holder still acts as if it held the lock, the bar goes on hatched. The findings are the
//! run's checker's, its [`Report`] over the same history, never the picture's own: where an
//! invalid finding says two held the lock at once, the lane is marked "two holders" where
//! their bars overlap; the write a stale-write finding is about is highlighted with the
//! store's answer; each part's outcome is its findings on the store.
//!
//! [`Report`]: crate::check::report::Report
//!
//! Both files are self-contained: no network, no external fonts, scripts or styles.

mod drawing;
mod found;
mod html;
mod masters;
mod model;
mod scale;
mod svg;
mod waits;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::events::Event;

pub use drawing::{Lane, LaneKind, Mark, Part, Picture, Shape, Tone};

/// The largest file `render` reads: a lab run's `--json` is a few hundred KB at most.
pub const MOST_BYTES: u64 = 32 << 20;
/// The most events, lanes, parts and held jobs a picture draws.
pub const MOST_EVENTS: usize = 100_000;
pub const MOST_LANES: usize = 64;
pub const MOST_PARTS: usize = 200;
pub const MOST_ROWS: usize = 1_000;
pub const MOST_VERDICT_COLUMNS: usize = 200;
pub const MOST_VERDICT_ROWS: usize = 1_000;
/// What the check before a lab plays writes beside the picture (a picture is some 25 KB).
const PROBE_BYTES: usize = 16 * 1024;

/// The latest `t_ms` a picture draws: a day, far past any lab run.
pub const LATEST_T_MS: u64 = 24 * 3_600_000;

/// A saved stream that holds more than one run: well-formed, yet not one picture.
#[derive(Debug)]
pub struct TwoRuns(String);

impl std::fmt::Display for TwoRuns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TwoRuns {}

/// A run as the picture sees it.
#[derive(Debug, Default, Clone)]
pub struct Recording {
    /// Every event of the typed history, in the order the lab showed them.
    pub events: Vec<Event>,
    /// The `"kind": "verdict"` object, when there was one.
    pub verdict: Option<Value>,
    /// Without a JSON verdict: the lines the lab printed after its last event (its table).
    pub verdict_text: Vec<String>,
    /// The command line of a live run (`lockslab gc-pause --html run.html`).
    pub command: Option<String>,
    /// The run's checker's [`Report`] on `events` (its findings point at them by index):
    /// what the picture marks — two holders, the late write, failures, each part's outcome.
    /// Set by whoever knows the run's checker — the lab runner, `lockslab render` — since
    /// the picture decides nothing itself (and does not know the labs). None: a run no
    /// lab's checker judges, drawn without findings.
    ///
    /// [`Report`]: crate::check::report::Report
    pub report: Option<crate::check::report::Report>,
}

impl Recording {
    /// Reads a saved `--json` stream: one JSON object per line, the verdict last. Lines that
    /// are not JSON objects are refused with their line number: a picture of half a file
    /// would mislead. So is a file holding two runs (a second verdict, an event after the
    /// verdict, two run ids): one picture of two runs would mix their clocks.
    pub fn from_jsonl(text: &str) -> Result<Recording> {
        let mut recording = Recording::default();
        let mut verdict_line = None;
        let mut run_id: Option<(String, usize)> = None;
        // A byte-order mark or CRLF line ends (a file saved by an editor) change nothing.
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        for (number, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(line)
                .with_context(|| format!("line {} is not JSON", number + 1))?;
            if !value.is_object() {
                bail!("line {} is not a JSON object", number + 1);
            }
            if matches!(
                value.get("kind").and_then(Value::as_str),
                Some("schedule" | "cell")
            ) {
                bail!(
                    "line {} is a summary of `lockslab chaos` or `lockslab matrix`, which play many \
                     runs: there is no one timeline to draw",
                    number + 1
                );
            }
            if let Some(seen) = verdict_line {
                return Err(TwoRuns(format!(
                    "line {} follows the verdict of line {seen}: this file holds more than one \
                     run; save each run to a file of its own (one `lockslab <lab> --json > FILE` each)",
                    number + 1
                ))
                .into());
            }
            if let Some(id) = value.get("run_id").and_then(Value::as_str) {
                match &run_id {
                    Some((first, at)) if first != id => {
                        return Err(TwoRuns(format!(
                            "line {} belongs to run {id}, line {at} to run {first}: this file \
                             holds more than one run; save each run to a file of its own",
                            number + 1
                        ))
                        .into());
                    }
                    Some(_) => {}
                    None => run_id = Some((id.to_string(), number + 1)),
                }
            }
            if value.get("kind").and_then(Value::as_str) == Some("verdict") {
                // The verdict's words as the terminal showed them (`text`, since lockslab
                // wrote it): drawn as a live `--html` draws them.
                recording.verdict_text = value
                    .get("text")
                    .and_then(Value::as_array)
                    .map(|lines| {
                        lines
                            .iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                recording.verdict = Some(value);
                verdict_line = Some(number + 1);
            } else {
                let nth = recording.events.len() + 1;
                if let Some(t_ms) = value.get("t_ms")
                    && t_ms.as_u64().is_none()
                {
                    bail!(
                        "event {nth} is stamped t_ms {t_ms}: a lab stamps whole milliseconds \
                         from 0"
                    );
                }
                let event: Event = crate::events::read_line(value).with_context(|| {
                    format!(
                        "line {} is not an event lockslab records (docs/json.md)",
                        number + 1
                    )
                })?;
                recording.events.push(event);
            }
        }
        if recording.events.is_empty() && recording.verdict.is_none() {
            bail!("no events in it: expected the output of a lab run with --json");
        }
        Ok(recording)
    }

    /// Refuses a run no picture can show, before any drawing starts: one written by a newer
    /// lockslab, more events, lanes, parts or lock rows than a page can hold, a time no lab
    /// run reaches. A lab's own run is far inside every bound; what is outside them is a
    /// file that was not written by a lab run, or not by this lockslab.
    pub fn drawable(&self) -> Result<()> {
        if let Some(verdict) = &self.verdict {
            crate::events::envelope::readable(verdict, "render")?;
        }
        if self.events.len() > MOST_EVENTS {
            bail!(
                "{} events: a picture draws at most {MOST_EVENTS} (a lab run has a few hundred)",
                self.events.len()
            );
        }
        let mut lanes = std::collections::HashSet::new();
        let mut parts = std::collections::HashSet::new();
        let mut rows = std::collections::HashSet::new();
        for (number, event) in self.events.iter().enumerate() {
            let t_ms = event.t_ms;
            if t_ms > LATEST_T_MS {
                bail!(
                    "event {} is stamped t_ms {t_ms}, more than {} hours into its run: no lab \
                     runs that long, and no picture could show it",
                    number + 1,
                    LATEST_T_MS / 3_600_000
                );
            }
            lanes.insert(event.worker.as_str());
            if let Some(backend) = event.backend() {
                lanes.insert(backend);
            }
            parts.insert(model::part_of(event));
            if let Some(job) = event.job() {
                rows.insert((event.worker.as_str(), job));
            }
        }
        let (columns, facts) = model::verdict_table_size(self);
        for (count, most, what) in [
            (
                columns,
                MOST_VERDICT_COLUMNS,
                "columns in the verdict's table",
            ),
            (facts, MOST_VERDICT_ROWS, "facts in the verdict's table"),
            (lanes.len(), MOST_LANES, "lanes (workers and backends)"),
            (parts.len(), MOST_PARTS, "parts (runs of the lab)"),
            (rows.len(), MOST_ROWS, "held jobs"),
        ] {
            if count > most {
                bail!("{count} {what}: a picture draws at most {most}");
            }
        }
        Ok(())
    }

    /// The run that just ended, as the runner kept it: its typed history, its verdict (the
    /// JSON object under `--json`, else the lines the verdict printed).
    pub fn of_run(
        events: Vec<Event>,
        verdict: Option<Value>,
        verdict_text: Vec<String>,
    ) -> Recording {
        let command = std::iter::once("lockslab".to_string())
            .chain(
                std::env::args()
                    .skip(1)
                    .map(|arg| crate::connect::redact(&arg)),
            )
            .collect::<Vec<_>>()
            .join(" ");
        Recording {
            events,
            verdict,
            verdict_text: trim_blank(verdict_text),
            command: Some(command),
            report: None,
        }
    }
}

/// Writes a run's pictures (`--html`, `--svg`) and says where, on stderr under `--json`
/// (whose stdout is JSON Lines only).
pub fn draw(targets: &[Target], recording: &Recording, json: bool) -> Result<()> {
    for target in targets {
        let bytes = target.write(recording)?;
        let line = format!(
            "picture: {} ({} KB)",
            target.path().display(),
            bytes.div_ceil(1024)
        );
        if json {
            crate::errln!("{line}");
        } else {
            crate::outln!("{line}");
        }
    }
    Ok(())
}

/// Says that a picture asked for was not drawn, and why (`--html FILE` of a chaos run
/// that found no violation to draw), where [`draw`] would have said it was.
pub fn not_drawn(targets: &[Target], why: &str, json: bool) {
    for target in targets {
        let line = format!("picture: {} not drawn: {why}", target.path().display());
        if json {
            crate::output::err_prose(&line);
        } else {
            crate::output::prose(&line);
        }
    }
}

/// The lines without the blank ones above and below them.
pub fn trim_blank(mut lines: Vec<String>) -> Vec<String> {
    while lines.first().is_some_and(|l| l.trim().is_empty()) {
        lines.remove(0);
    }
    while lines.last().is_some_and(|l| l.trim().is_empty()) {
        lines.pop();
    }
    lines
}

/// The standalone SVG: drawing, then the verdict table.
pub fn svg(recording: &Recording) -> String {
    svg::document(&Picture::of(recording))
}

/// The HTML page: the drawing inline, the verdict as a table, details on hover.
pub fn html(recording: &Recording) -> String {
    html::page(&Picture::of(recording))
}

/// Which file a picture goes to, and in which format (by its name's ending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Html(PathBuf),
    Svg(PathBuf),
}

impl Target {
    /// `FILE.html`/`.htm` or `FILE.svg`; anything else is a usage error naming the flag.
    pub fn by_extension(path: &Path, flag: &str) -> Result<Target> {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match extension.as_deref() {
            Some("html" | "htm") => Ok(Target::Html(path.into())),
            Some("svg") => Ok(Target::Svg(path.into())),
            _ => crate::bail_usage!(
                "{flag} {}: name the file .html or .svg (the format follows the name)",
                path.display()
            ),
        }
    }

    /// An `--html FILE` flag of a tool that draws only pages (chaos, challenge): checked
    /// once, before anything plays — an HTML name, in a directory it can be written to.
    pub fn html_page(path: Option<&Path>) -> Result<Option<Target>> {
        let Some(path) = path else { return Ok(None) };
        let target = Target::by_extension(path, "--html")?;
        if !matches!(target, Target::Html(_)) {
            crate::bail_usage!("--html {}: name the file .html", path.display());
        }
        target.check_writable("--html")?;
        Ok(Some(target))
    }

    pub fn path(&self) -> &Path {
        match self {
            Target::Html(path) | Target::Svg(path) => path,
        }
    }

    /// The directory the file goes in (`.` for a bare name).
    fn dir(&self) -> &Path {
        match self.path().parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        }
    }

    /// Fails early (before a lab plays for half a minute) when the file cannot be written
    /// where it is asked for.
    pub fn check_writable(&self, flag: &str) -> Result<()> {
        let path = self.path();
        let dir = self.dir();
        if !dir.is_dir() {
            crate::bail_usage!(
                "{flag} {}: there is no directory {} to write it in",
                path.display(),
                dir.display()
            );
        }
        if path.is_dir() {
            crate::bail_usage!("{flag} {}: that is a directory", path.display());
        }
        // Test-open a file beside it, as the write will: a read-only directory or one this
        // user may not write in fails now, not after the lab has played.
        let probe = tempfile::Builder::new()
            .prefix(".lockslab-picture-")
            .tempfile_in(dir);
        let mut probe = match probe {
            Ok(probe) => probe,
            Err(err) => crate::bail_usage!(
                "{flag} {}: cannot write in {}: {err}",
                path.display(),
                dir.display()
            ),
        };
        // And write a block: a full disk fails now too (an empty file needs no free block).
        let block = vec![0u8; PROBE_BYTES];
        let written =
            std::io::Write::write_all(&mut probe, &block).and_then(|()| probe.as_file().sync_all());
        if let Err(err) = written {
            bail!(
                "{flag} {}: cannot write {} KB in {}: {err}",
                path.display(),
                PROBE_BYTES / 1024,
                dir.display()
            );
        }
        Ok(())
    }

    /// Writes the picture to a temporary file beside the target, then renames it over the
    /// target: a full disk or a crash mid-write leaves the old file (or none), never half a
    /// picture.
    pub fn write(&self, recording: &Recording) -> Result<usize> {
        let text = match self {
            Target::Html(_) => html(recording),
            Target::Svg(_) => svg(recording),
        };
        let path = self.path();
        let dir = self.dir();
        let failed = || format!("writing the picture to {}", path.display());
        let mut file = tempfile::Builder::new()
            .prefix(".lockslab-picture-")
            .tempfile_in(dir)
            .with_context(failed)?;
        std::io::Write::write_all(&mut file, text.as_bytes()).with_context(failed)?;
        file.as_file().sync_all().with_context(failed)?;
        // A picture is for anyone to open, as `fs::write` would have made it.
        let _ = std::fs::set_permissions(
            file.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        );
        file.persist(path)
            .map_err(|err| err.error)
            .with_context(failed)?;
        Ok(text.len())
    }
}

/// `lockslab render RUN.jsonl -o FILE`: the picture of a saved run; `report` gives its
/// checker's Report on its events (see [`Recording::report`]).
pub fn render(
    input: &Path,
    output: &Path,
    report: fn(&[Event], Option<&Value>) -> Option<crate::check::report::Report>,
) -> Result<()> {
    let target = Target::by_extension(output, "-o")?;
    target.check_writable("-o")?;
    let text = read_saved_run(input)?;
    let mut recording = match Recording::from_jsonl(&text) {
        Ok(recording) => recording,
        Err(err) if err.is::<TwoRuns>() => bail!("{}: {err}", input.display()),
        Err(err) => bail!("{}: {err:#}", input.display()),
    };
    recording
        .drawable()
        .with_context(|| format!("{} cannot be drawn", input.display()))?;
    recording.report = report(&recording.events, recording.verdict.as_ref());
    let bytes = target.write(&recording)?;
    crate::outln!(
        "wrote {} ({} events, {} KB)",
        target.path().display(),
        recording.events.len(),
        bytes.div_ceil(1024)
    );
    Ok(())
}

/// The text of a saved run: a regular file of at most [`MOST_BYTES`], read without waiting
/// (a FIFO or a device like /dev/zero is refused before a byte is read).
pub(crate) fn read_saved_run(input: &Path) -> Result<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(input);
    let file = match file {
        Ok(file) => file,
        Err(err) => crate::bail_usage!("cannot read {}: {err}", input.display()),
    };
    let metadata = file
        .metadata()
        .with_context(|| format!("reading {}", input.display()))?;
    if !metadata.is_file() {
        bail!(
            "{} is not a regular file: render reads a saved run (`lockslab <lab> --json > run.jsonl`)",
            input.display()
        );
    }
    let too_big = |size: u64| {
        anyhow::anyhow!(
            "{} is {} MB: a lab run's --json is far smaller, and render reads at most {} MB",
            input.display(),
            size.div_ceil(1 << 20),
            MOST_BYTES >> 20
        )
    };
    if metadata.len() > MOST_BYTES {
        return Err(too_big(metadata.len()));
    }
    let mut bytes = Vec::new();
    file.take(MOST_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", input.display()))?;
    if bytes.len() as u64 > MOST_BYTES {
        return Err(too_big(bytes.len() as u64)); // it grew while we read
    }
    match String::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(err) => crate::bail_usage!(
            "cannot read {}: it is not UTF-8 text ({err})",
            input.display()
        ),
    }
}

/// Escapes text for XML and HTML (element text and quoted attributes alike).
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0 at all, nor are U+FFFE and U+FFFF.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            '\u{FFFE}' | '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}
