//! A picture of a run: the timeline as an SVG drawing or a self-contained HTML page.
//!
//! Drawn from the same objects `--json` prints — the events and the verdict — whether they
//! come from the run that just ended (`--html FILE`, `--svg FILE`, kept by
//! [`crate::output::keep_history`]) or from a saved stream (`lockslab render RUN.jsonl`).
//!
//! What the picture shows comes from the backends' answers, not from what a worker believed
//! ([`model`] says how each bar is cut): a lock's bar starts when the backend granted it and
//! ends when the backend said it was gone — the holder's own release deleting it, an expiry
//! the lab saw, another holder's grant (an exclusive lock is only granted once the previous
//! key, lease or session is gone), a killed Postgres session. Past that end, while the old
//! holder still acts as if it held the lock, the bar goes on hatched; where two holders'
//! spans overlap, the lane is marked "two holders". A write made after its writer's lock had
//! ended is the stale write, and is highlighted with the store's answer.
//!
//! Both files are self-contained: no network, no external fonts, scripts or styles.

mod html;
mod model;
mod svg;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

pub use model::{Lane, LaneKind, Part, Picture};

/// A run as the picture sees it.
#[derive(Debug, Default, Clone)]
pub struct Recording {
    /// Every event, as `--json` prints it, in the order the lab showed them.
    pub events: Vec<Value>,
    /// The `"kind": "verdict"` object, when there was one.
    pub verdict: Option<Value>,
    /// Without a JSON verdict: the lines the lab printed after its last event (its table).
    pub verdict_text: Vec<String>,
    /// The command line of a live run (`lockslab gc-pause --html run.html`).
    pub command: Option<String>,
}

impl Recording {
    /// Reads a saved `--json` stream: one JSON object per line, the verdict last. Lines that
    /// are not JSON objects are refused with their line number: a picture of half a file
    /// would mislead.
    pub fn from_jsonl(text: &str) -> Result<Recording> {
        let mut recording = Recording::default();
        for (number, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(line)
                .with_context(|| format!("line {} is not JSON", number + 1))?;
            if !value.is_object() {
                bail!("line {} is not a JSON object", number + 1);
            }
            if value.get("kind").and_then(Value::as_str) == Some("verdict") {
                recording.verdict = Some(value);
            } else {
                recording.events.push(value);
            }
        }
        if recording.events.is_empty() && recording.verdict.is_none() {
            bail!("no events in it: expected the output of a lab run with --json");
        }
        Ok(recording)
    }

    /// The run kept while the lab played (see [`crate::output::History`]).
    pub fn from_history(history: crate::output::History, command: String) -> Recording {
        let verdict_text = if history.verdict.is_some() {
            Vec::new()
        } else {
            trim_blank(history.printed_after)
        };
        Recording {
            events: history.events,
            verdict: history.verdict,
            verdict_text,
            command: Some(command),
        }
    }
}

fn trim_blank(mut lines: Vec<String>) -> Vec<String> {
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

    pub fn path(&self) -> &Path {
        match self {
            Target::Html(path) | Target::Svg(path) => path,
        }
    }

    /// Fails early (before a lab plays for half a minute) when the file cannot be written
    /// where it is asked for.
    pub fn check_writable(&self, flag: &str) -> Result<()> {
        let path = self.path();
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
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
        Ok(())
    }

    pub fn write(&self, recording: &Recording) -> Result<usize> {
        let text = match self {
            Target::Html(_) => html(recording),
            Target::Svg(_) => svg(recording),
        };
        std::fs::write(self.path(), &text)
            .with_context(|| format!("writing the picture to {}", self.path().display()))?;
        Ok(text.len())
    }
}

/// `lockslab render RUN.jsonl -o FILE`: the picture of a saved run.
pub fn render(input: &Path, output: &Path) -> Result<()> {
    let target = Target::by_extension(output, "-o")?;
    target.check_writable("-o")?;
    let text = match std::fs::read_to_string(input) {
        Ok(text) => text,
        Err(err) => crate::bail_usage!("cannot read {}: {err}", input.display()),
    };
    let recording = match Recording::from_jsonl(&text) {
        Ok(recording) => recording,
        Err(err) => crate::bail_usage!("{}: {err:#}", input.display()),
    };
    let bytes = target.write(&recording)?;
    crate::outln!(
        "wrote {} ({} events, {} KB)",
        target.path().display(),
        recording.events.len(),
        bytes.div_ceil(1024)
    );
    Ok(())
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
            // Control characters are not allowed in XML 1.0 at all.
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}
