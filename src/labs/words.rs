//! A verdict's words as data: what a lab says after its run, built once by the lab's
//! verdict and exported by one exporter per output.
//!
//! A lab used to *print* its verdict, and `--json` obtained the same words by capturing that
//! print. Now the verdict returns [`Words`] — a heading, a table of rows, sentences — and
//! each output renders them itself:
//!
//! ```text
//! Verdict::words() ──> Words ──┬──> print()  the terminal: colours, fitted to the width
//!                              └──> plain()  `--json`'s `text` and the picture: no colours
//! ```
//!
//! Both exporters lay the words out the same way (a table as [`output::table`] draws it,
//! prose fitted to [`output::width`]), so the JSON's `text` is the terminal's verdict
//! without its colours, line for line — what `lockslab check` and `render` compare.

use colored::Colorize;

use super::step::{self, Checkpoint};
use crate::output::{self, fitted, table};

/// One piece of a verdict's words, in the order they are said.
pub enum Said {
    /// An empty line between the parts.
    Blank,
    /// The title over a table (`Verdict (from the backends and the store)`), in bold.
    Heading(String),
    /// A table: a header and one row per run, mode or cell. A cell may carry its own tone
    /// (`ACCEPTED` in red); the plain export drops it.
    Table {
        header: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    /// A sentence about one thing the table shows: `  fenced: A's write was refused…`, the
    /// thing in bold.
    About { thing: String, sentence: String },
    /// Prose as the lab wrote it: each of its lines fitted to the width.
    Prose(String),
    /// A line of a caveat beside the verdict: dimmed, two columns in, and kept as written
    /// (its lines were broken by hand).
    Aside(String),
    /// A `--step` stop between the words: a terminal stops there, a JSON text has none.
    Stop(&'static Checkpoint),
}

/// A verdict's words, in order.
#[derive(Default)]
pub struct Words {
    said: Vec<Said>,
}

impl Words {
    pub fn new() -> Words {
        Words::default()
    }

    /// The shape most verdicts open with: a blank line, the title, the table, a blank line;
    /// the sentences about its rows follow.
    pub fn titled_table<H: AsRef<str>>(
        title: impl Into<String>,
        header: &[H],
        rows: Vec<Vec<String>>,
    ) -> Words {
        let mut words = Words::new();
        words.blank().heading(title).table(header, rows).blank();
        words
    }

    pub fn blank(&mut self) -> &mut Self {
        self.say(Said::Blank)
    }

    pub fn heading(&mut self, title: impl Into<String>) -> &mut Self {
        self.say(Said::Heading(title.into()))
    }

    pub fn table<H: AsRef<str>>(&mut self, header: &[H], rows: Vec<Vec<String>>) -> &mut Self {
        let header = header.iter().map(|h| h.as_ref().to_string()).collect();
        self.say(Said::Table { header, rows })
    }

    pub fn about(&mut self, thing: impl Into<String>, sentence: impl Into<String>) -> &mut Self {
        self.say(Said::About {
            thing: thing.into(),
            sentence: sentence.into(),
        })
    }

    pub fn prose(&mut self, text: impl Into<String>) -> &mut Self {
        self.say(Said::Prose(text.into()))
    }

    pub fn aside(&mut self, line: impl Into<String>) -> &mut Self {
        self.say(Said::Aside(line.into()))
    }

    pub fn stop(&mut self, at: &'static Checkpoint) -> &mut Self {
        self.say(Said::Stop(at))
    }

    pub fn say(&mut self, said: Said) -> &mut Self {
        self.said.push(said);
        self
    }

    /// The terminal's exporter: prints the words on stdout, coloured when the terminal
    /// takes colours, and stops at each `--step` stop.
    ///
    /// Under `--step`, the words between two stops are one block of the screens: shown on
    /// one screen when they fit one, else split only between their tables and sentences,
    /// a title kept with its table (see [`output::screens`]).
    pub fn print(&self) {
        let mut verdict = Some(output::screens::block());
        for said in &self.said {
            match said {
                Said::Stop(at) => {
                    drop(verdict.take());
                    step::checkpoint(at);
                    verdict = Some(output::screens::block());
                }
                data => {
                    let _one_block = output::screens::block();
                    if matches!(data, Said::Heading(_)) {
                        output::screens::heading_follows();
                    }
                    for line in lines(data) {
                        output::line(&line);
                    }
                }
            }
        }
    }

    /// The plain exporter: the lines a terminal shows, without colours and without the
    /// blank lines around them — `--json`'s `text`, and the verdict under a picture.
    pub fn plain(&self) -> Vec<String> {
        let mut plain = Vec::new();
        for said in &self.said {
            match said {
                Said::Stop(_) => {}
                data => plain.extend(lines(data).iter().map(|l| output::without_colors(l))),
            }
        }
        crate::picture::trim_blank(plain)
    }
}

/// The lines one piece of words takes, as a terminal shows them (each one written with
/// one `output::line`).
fn lines(said: &Said) -> Vec<String> {
    match said {
        Said::Blank => vec![String::new()],
        Said::Heading(title) => fitted(&title.bold().to_string()),
        Said::Table { header, rows } => {
            let header: Vec<&str> = header.iter().map(String::as_str).collect();
            fitted(&table(&header, rows))
        }
        Said::About { thing, sentence } => {
            fitted(&format!("  {} {sentence}", format!("{thing}:").bold()))
        }
        Said::Prose(text) => fitted(text),
        Said::Aside(line) => vec![format!("  {}", line.dimmed())],
        Said::Stop(_) => Vec::new(),
    }
}
