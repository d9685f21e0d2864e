//! Everything a lab prints: the live timeline, progress bars, verdict tables and `--json`.
//!
//! The output style is decided once, here: colours and progress bars only when stdout is a
//! terminal and `NO_COLOR` is not set; with `--json`, stdout carries JSON Lines and nothing
//! else, and the human-readable timeline is not printed at all.
//!
//! Every line lockslab prints goes through [`outln!`](crate::outln) (stdout) or
//! [`errln!`](crate::errln) (stderr), never `println!`/`eprintln!` (clippy refuses them):
//! those panic when the write fails, and a write fails exactly when things go wrong — the
//! terminal window was closed, `| head` stopped reading, stderr is `/dev/full`. A failed
//! stdout ends the lab cleanly (see [`line()`]); a failed stderr is ignored.

use std::io::{self, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use colored::{Color, Colorize};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use crate::events::{Event, Kind};

#[derive(Clone, Copy, Debug)]
pub struct Style {
    /// `--json`: stdout is JSON Lines only.
    pub json: bool,
    /// Colours and progress bars: a terminal, and no `NO_COLOR`.
    pub fancy: bool,
}

impl Style {
    pub fn detect(json: bool) -> Style {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        let fancy = !json && !no_color && io::stdout().is_terminal();
        colored::control::set_override(fancy);
        Style { json, fancy }
    }

    /// The one place a progress bar is made: hidden unless the style is fancy. However
    /// its lab ends (its part done, an error, a `?`), the bar is wiped when dropped: a bar
    /// left drawn stays frozen on the screen under what follows.
    pub fn progress(&self, len: u64, template: &str) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(
            Some(len),
            if self.fancy {
                ProgressDrawTarget::stderr()
            } else {
                ProgressDrawTarget::hidden()
            },
        );
        if let Ok(style) = ProgressStyle::with_template(template) {
            bar.set_style(style.progress_chars("█▓░"));
        }
        bar.with_finish(indicatif::ProgressFinish::AndClear)
    }
}

/// Lane colours, in the order lanes appear.
const LANE_COLORS: [Color; 6] = [
    Color::Cyan,
    Color::Magenta,
    Color::Yellow,
    Color::Blue,
    Color::Green,
    Color::BrightRed,
];

/// The live timeline: one line per event, one coloured lane per worker.
pub struct Timeline {
    pub style: Style,
    lanes: Vec<String>,
    bar: Option<ProgressBar>,
    lane_width: usize,
}

impl Timeline {
    pub fn new(style: Style) -> Timeline {
        Timeline {
            style,
            lanes: Vec::new(),
            bar: None,
            lane_width: 7,
        }
    }

    /// Widens the lane column, for labs whose lane names are longer than the default 7.
    pub fn set_lane_width(&mut self, width: usize) {
        self.lane_width = width;
    }

    /// Shows a progress bar; timeline lines are printed above it while it lives.
    pub fn attach_bar(&mut self, bar: ProgressBar) {
        self.bar = Some(bar);
    }

    pub fn bar(&self) -> Option<&ProgressBar> {
        self.bar.as_ref()
    }

    pub fn clear_bar(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }

    fn lane_color(&mut self, worker: &str) -> Color {
        let index = match self.lanes.iter().position(|lane| lane == worker) {
            Some(index) => index,
            None => {
                self.lanes.push(worker.to_string());
                self.lanes.len() - 1
            }
        };
        LANE_COLORS[index % LANE_COLORS.len()]
    }

    /// Prints one event: a JSON line with `--json`, a timeline line otherwise.
    pub fn show(&mut self, event: &Event) {
        if self.style.json {
            json_line(event);
            return;
        }
        let text = format!("{}{}", symbol(event.kind()), event.text);
        self.timeline_line(event.t_ms, &event.worker, &text, |piece| {
            paint(event, piece)
        });
    }

    /// Prints a conclusion the lab draws from its checker as a timeline line (red where a
    /// safety property broke, green where a defence held): words, not an event, so there
    /// is nothing to print with `--json`, whose verdict says it.
    pub fn conclude(&mut self, t_ms: u64, lane: &str, text: &str, broken: bool) {
        if self.style.json {
            return;
        }
        self.timeline_line(t_ms, lane, text, |piece| match broken {
            true => piece.red().bold().to_string(),
            false => piece.green().bold().to_string(),
        });
    }

    /// One timeline line: the time, the lane, and `text` painted by `paint`.
    fn timeline_line(&mut self, t_ms: u64, lane: &str, text: &str, paint: impl Fn(&str) -> String) {
        let color = self.lane_color(lane);
        let seconds = t_ms as f64 / 1000.0;
        // Long texts wrap under their own column, so the time and lane columns stay clear.
        let indent = 9 + 2 + self.lane_width.max(visible_width(lane)) + 1;
        // A text of several lines (a round's answer from each server) keeps its lines and
        // their indentation, each under the text's column.
        let mut pieces = Vec::new();
        for paragraph in text.split('\n') {
            let body = paragraph.trim_start_matches(' ');
            let inner = " ".repeat(paragraph.len() - body.len());
            let room = width().saturating_sub(indent + inner.len()).max(20);
            for piece in wrap(body, room) {
                pieces.push(format!("{inner}{piece}"));
            }
        }
        let _one_block = screens::block();
        for (i, piece) in pieces.iter().enumerate() {
            let line = if i == 0 {
                format!(
                    "{:>9}  {:<width$} {}",
                    format!("+{seconds:.3}s").dimmed(),
                    lane.color(color).bold(),
                    paint(piece),
                    width = self.lane_width,
                )
            } else {
                format!("{}{}", " ".repeat(indent), paint(piece))
            };
            self.println(&line);
        }
    }

    /// Prints prose (a heading, a note, a table) in human mode, each line wrapped to the
    /// terminal's width ([`fitted`]); nothing with `--json`.
    pub fn say(&self, text: &str) {
        if !self.style.json {
            let _one_block = screens::block();
            let plain = without_colors(text);
            if plain.trim_start().starts_with("── ") && plain.trim_end().ends_with("──") {
                screens::block_is_a_heading();
            }
            for line in fitted(text) {
                self.println(&line);
            }
        }
    }

    fn println(&self, text: &str) {
        match &self.bar {
            _ if crate::procs::interrupted() => {}
            Some(bar) if !bar.is_hidden() => {
                if !screens::held(text) {
                    bar.println(text)
                }
            }
            _ => line(text),
        }
    }
}

/// The mark before the events a learner must not miss.
fn symbol(kind: Kind) -> &'static str {
    match kind {
        Kind::Frozen | Kind::Freezing => "❄ ",
        Kind::Resumed => "▶ ",
        Kind::Killed => "✖ ",
        Kind::Expired => "⌛ ",
        _ => "",
    }
}

/// Colours the events a learner must not miss: the same colour means the same thing in
/// every lab (red: a safety property broken; green: fencing held; blue: a freeze).
fn paint(event: &Event, text: &str) -> String {
    match event.kind() {
        Kind::Frozen | Kind::Freezing => text.bright_blue().bold().to_string(),
        Kind::Resumed => text.bright_blue().to_string(),
        Kind::Killed => text.red().bold().to_string(),
        Kind::Expired => text.yellow().to_string(),
        // What the tables counted back: red where a job was processed twice or never.
        Kind::TablesRead if event.observed().is_some_and(|o| o.counted_wrong() > 0) => {
            text.red().bold().to_string()
        }
        // Lab 2's read-back: red where Redis's answer itself counts a failure (trials with
        // two holders, the dead holder's value still in the key).
        Kind::RedisRead
            if event
                .observed()
                .is_some_and(|o| o.violations.unwrap_or(0) > 0 || o.dead_owner == Some(true)) =>
        {
            text.red().bold().to_string()
        }
        Kind::Error | Kind::Vanished => text.red().to_string(),
        _ => text.to_string(),
    }
}

/// `println!` for lab output: stops cleanly when stdout is closed (see [`line()`]).
#[macro_export]
macro_rules! outln {
    () => { $crate::output::line("") };
    ($($arg:tt)*) => { $crate::output::line(&format!($($arg)*)) };
}

/// `outln!` for prose: each line fitted to the terminal's width (see [`fitted`]).
#[macro_export]
macro_rules! prose {
    ($($arg:tt)*) => { $crate::output::prose(&format!($($arg)*)) };
}

/// `eprintln!` that cannot panic (see [`err_line`]).
#[macro_export]
macro_rules! errln {
    ($($arg:tt)*) => { $crate::output::err_line(&format!($($arg)*)) };
}

/// Whether stdout was a terminal when lockslab started. Asked again after the terminal hung
/// up, the descriptor no longer answers `isatty`, yet a failed write to it means just that.
static STDOUT_WAS_TERMINAL: AtomicBool = AtomicBool::new(false);

/// Notes what stdout is, before anything is printed: `main` calls it first.
pub fn init() {
    STDOUT_WAS_TERMINAL.store(io::stdout().is_terminal(), Ordering::Relaxed);
}

/// Prints one line on stdout.
///
/// When stdout can no longer be written, there is no one left to show the lab to: stop
/// every worker and server, and exit with a status that says why, instead of panicking
/// (what `println!` does) or carrying on unseen.
pub fn line(text: &str) {
    if kept_back(text) {
        return;
    }
    if !screens::held(text) {
        write_line(text);
    }
}

/// `--step`'s screens: a part must fit one screen with the question that ends it. A part
/// that plays on without a place to stop (a timed scenario) shows its first screen live;
/// the lines after it are held while it plays, and shown a screen at a time once it has
/// ended, with a stop between screens (see `labs::step`). Without `--step`, nothing is held.
pub mod screens {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    /// The rows of a part's lines on one screen, leaving room on a 45-row terminal for the
    /// stop that ends it: a blank line, its name, a question of up to five lines, the Enter
    /// line, and the "more follows" note.
    pub const ROWS: usize = 36;

    /// What a screen holds: whole blocks. A block is what must never be split across two
    /// screens — an event and its wrapped lines, a round's answers from each server, a
    /// table, a paragraph; a verdict, when it fits one screen. A heading is kept with the
    /// block it heads, so that no screen ends on one.
    struct Pager {
        on: bool,
        /// The rows shown since the last Enter.
        rows: usize,
        /// Blocks held back since the screen filled, in order.
        held: VecDeque<Vec<String>>,
        /// How many [`block`]s are open: their lines are gathered, not yet placed.
        depth: usize,
        /// The outermost open block's pieces: each inner block, or a lone line.
        pieces: Vec<Vec<String>>,
        /// The inner block being gathered.
        piece: Vec<String>,
        /// The inner block is a heading: it goes with the piece after it.
        piece_heads: bool,
        /// The open group is a heading ([`block_is_a_heading`]).
        group_heads: bool,
        /// A heading waiting for the block it heads.
        heading: Vec<String>,
        /// The next line is a heading ([`heading_follows`]).
        heading_next: bool,
    }

    impl Pager {
        const OFF: Pager = Pager {
            on: false,
            rows: 0,
            held: VecDeque::new(),
            depth: 0,
            pieces: Vec::new(),
            piece: Vec::new(),
            piece_heads: false,
            group_heads: false,
            heading: Vec::new(),
            heading_next: false,
        };

        /// Takes `text` into the open block, or places it as a block of its own; true when
        /// the pager keeps it (to print later, or held), false when it is to be printed now.
        fn take(&mut self, text: &str) -> (bool, Vec<String>) {
            if !self.on {
                return (false, Vec::new());
            }
            let is_heading = std::mem::take(&mut self.heading_next) || looks_like_heading(text);
            match self.depth {
                0 => {
                    let now = self.place(vec![text.to_string()], is_heading);
                    (true, now)
                }
                1 => {
                    self.pieces.push(vec![text.to_string()]);
                    if is_heading {
                        self.pieces.push(Vec::new()); // an empty piece marks "heads the next"
                    }
                    (true, Vec::new())
                }
                _ => {
                    self.piece.push(text.to_string());
                    self.piece_heads |= is_heading;
                    (true, Vec::new())
                }
            }
        }

        fn open(&mut self) {
            self.depth += 1;
        }

        /// Closes a block; when it was the outermost, places it and returns the lines to
        /// print now.
        fn close(&mut self) -> Vec<String> {
            self.depth = self.depth.saturating_sub(1);
            match self.depth {
                0 => {
                    let pieces = std::mem::take(&mut self.pieces);
                    self.place_group(pieces)
                }
                1 => {
                    let piece = std::mem::take(&mut self.piece);
                    if !piece.is_empty() {
                        self.pieces.push(piece);
                    }
                    if std::mem::take(&mut self.piece_heads) {
                        self.pieces.push(Vec::new());
                    }
                    Vec::new()
                }
                _ => Vec::new(),
            }
        }

        /// A group of pieces: whole on one screen when it fits one, else piece by piece.
        fn place_group(&mut self, pieces: Vec<Vec<String>>) -> Vec<String> {
            // Join each heading to the piece after it (an empty piece follows a heading).
            let mut joined: Vec<Vec<String>> = Vec::new();
            let mut glue = false;
            for piece in pieces {
                if piece.is_empty() {
                    glue = true;
                    continue;
                }
                match joined.last_mut() {
                    Some(last) if glue => last.extend(piece),
                    _ => joined.push(piece),
                }
                glue = false;
            }
            if !self.on {
                return joined.concat();
            }
            // A group that ends on a heading (a part's `── … ──` said alone) waits, whole,
            // for the block it heads.
            let heads = glue || std::mem::take(&mut self.group_heads);
            let total: usize = joined.iter().map(|p| rows_of_all(p)).sum();
            if total <= ROWS {
                return self.place(joined.concat(), heads);
            }
            let last = joined.len().saturating_sub(1);
            let mut now = Vec::new();
            for (i, piece) in joined.into_iter().enumerate() {
                now.extend(self.place(piece, heads && i == last));
            }
            now
        }

        /// Places one block: shown now when it fits the screen and nothing is held before
        /// it, else held (a block taller than a screen is cut into screens).
        fn place(&mut self, block: Vec<String>, is_heading: bool) -> Vec<String> {
            if is_heading {
                self.heading.extend(block);
                return Vec::new();
            }
            let mut block = block;
            if !self.heading.is_empty() {
                let mut with_heading = std::mem::take(&mut self.heading);
                with_heading.append(&mut block);
                block = with_heading;
            }
            let rows = rows_of_all(&block);
            if self.held.is_empty() && self.rows + rows <= ROWS {
                self.rows += rows;
                return block;
            }
            if rows <= ROWS {
                self.held.push_back(block);
                return Vec::new();
            }
            // Taller than a screen, it is cut anyway: it starts on the screen in view, so
            // that no stop follows a screen left half empty.
            let mut now = Vec::new();
            let mut lines = block.into_iter().peekable();
            while self.held.is_empty() {
                match lines.peek() {
                    Some(line) if self.rows + rows_of(line) <= ROWS => {
                        self.rows += rows_of(line);
                        now.extend(lines.next());
                    }
                    _ => break,
                }
            }
            let mut screen = Vec::new();
            let mut screen_rows = 0;
            for line in lines {
                let line_rows = rows_of(&line);
                if !screen.is_empty() && screen_rows + line_rows > ROWS {
                    self.held.push_back(std::mem::take(&mut screen));
                    screen_rows = 0;
                }
                screen_rows += line_rows;
                screen.push(line);
            }
            if !screen.is_empty() {
                self.held.push_back(screen);
            }
            now
        }

        /// The next screen of held blocks, counted as shown.
        fn next_screen(&mut self) -> Vec<String> {
            let mut screen = Vec::new();
            let mut rows = 0;
            while let Some(block) = self.held.front() {
                let block_rows = rows_of_all(block);
                if !screen.is_empty() && rows + block_rows > ROWS {
                    break;
                }
                rows += block_rows;
                screen.extend(self.held.pop_front().unwrap_or_default());
            }
            self.rows = rows;
            screen
        }

        /// A heading still waiting when the part ends: shown as it is.
        fn flush_heading(&mut self) -> Vec<String> {
            let heading = std::mem::take(&mut self.heading);
            if heading.is_empty() {
                return heading;
            }
            self.place(heading, false)
        }
    }

    /// A part's or a scenario's heading (`── without fencing ──`): it belongs to what
    /// follows it.
    fn looks_like_heading(text: &str) -> bool {
        let plain = super::without_colors(text);
        plain.trim_start().starts_with("── ") && !plain.contains('\n')
    }

    static PAGER: Mutex<Pager> = Mutex::new(Pager::OFF);

    fn pager() -> std::sync::MutexGuard<'static, Pager> {
        PAGER
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Turns screens on (`--step` without `--json`) or off (nobody answers any more).
    pub fn page(on: bool) {
        pager().on = on;
    }

    /// Enter was pressed at a stop: a new screen begins.
    pub fn new_screen() {
        pager().rows = 0;
    }

    /// The rows `text` takes on the terminal (a longer line wraps; a text may hold several).
    fn rows_of(text: &str) -> usize {
        text.split('\n')
            .map(|line| super::visible_width(line).div_ceil(super::width()).max(1))
            .sum()
    }

    fn rows_of_all(lines: &[String]) -> usize {
        lines.iter().map(|line| rows_of(line)).sum()
    }

    /// While the returned guard lives, the lines printed form one block, never split across
    /// two screens (blocks nest: a verdict of tables and sentences is placed whole when it
    /// fits one screen, else table by table).
    pub fn block() -> Block {
        pager().open();
        Block
    }

    /// An open block: placed when dropped.
    pub struct Block;

    impl Drop for Block {
        fn drop(&mut self) {
            let now = pager().close();
            for text in &now {
                super::write_line(text);
            }
        }
    }

    /// The open block is a heading (`── kill: … ──` over two lines): kept, whole, with the
    /// block after it.
    pub fn block_is_a_heading() {
        let mut pager = pager();
        if pager.depth > 0 {
            pager.group_heads = true;
        }
    }

    /// The next line printed is a heading: kept with the block after it.
    pub fn heading_follows() {
        pager().heading_next = true;
    }

    /// Counts `text` on the screen, prints it, or keeps it (in an open block, or held when
    /// the screen is full); true when the pager took it. The first line held says so, on
    /// stderr: the part goes on playing unseen.
    pub fn held(text: &str) -> bool {
        let mut pager = pager();
        let nothing_held = pager.held.is_empty();
        let (taken, now) = pager.take(text);
        let started_holding = nothing_held && !pager.held.is_empty();
        drop(pager);
        if started_holding {
            use colored::Colorize;
            super::err_line(&format!(
                "  {}",
                "… more follows once this part has played: a screen at each Enter".dimmed()
            ));
        }
        for text in &now {
            super::write_line(text);
        }
        taken
    }

    /// Whether lines are held, waiting for a stop to show them.
    pub fn holding() -> bool {
        !pager().held.is_empty()
    }

    /// Prints the next screen of held lines.
    pub fn show_next() {
        let screen = pager().next_screen();
        for text in &screen {
            super::write_line(text);
        }
    }

    /// The run is over: a heading nothing followed is shown, at its place.
    pub fn finish() {
        let now = pager().flush_heading();
        for text in &now {
            super::write_line(text);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn on() -> Pager {
            Pager {
                on: true,
                ..Pager::OFF
            }
        }

        /// Feeds lines into `pager`; returns those printed at once.
        fn feed(pager: &mut Pager, lines: &[String]) -> Vec<String> {
            let mut shown = Vec::new();
            for line in lines {
                let (taken, now) = pager.take(line);
                shown.extend(now);
                if !taken {
                    shown.push(line.clone());
                }
            }
            shown
        }

        fn all_screens(pager: &mut Pager) -> Vec<Vec<String>> {
            let mut screens = Vec::new();
            while !pager.held.is_empty() {
                screens.push(pager.next_screen());
            }
            screens
        }

        #[test]
        fn an_event_and_its_wrapped_lines_stay_on_one_screen() {
            let mut pager = on();
            let mut shown = Vec::new();
            for i in 0..40 {
                pager.open();
                feed(&mut pager, &[format!("+{i}.000s  w1  an event")]);
                feed(&mut pager, &[format!("{:20}its second line", "")]);
                shown.extend(pager.close());
            }
            assert!(shown.len() <= ROWS && shown.len().is_multiple_of(2));
            let screens = all_screens(&mut pager);
            assert!(
                screens
                    .iter()
                    .all(|s| s.len() <= ROWS && s.len().is_multiple_of(2))
            );
            assert_eq!(shown.len() + screens.concat().len(), 80);
        }

        #[test]
        fn a_table_that_does_not_fit_the_rest_of_a_screen_starts_the_next_whole() {
            let mut pager = on();
            let before: Vec<String> = (0..30).map(|i| format!("line {i}")).collect();
            let shown = feed(&mut pager, &before);
            assert_eq!(shown.len(), 30);
            let table: Vec<String> = (0..10).map(|i| format!("row {i}")).collect();
            pager.open();
            feed(&mut pager, &table);
            assert!(
                pager.close().is_empty(),
                "no row of the table on the full screen"
            );
            assert_eq!(all_screens(&mut pager), vec![table]);
        }

        #[test]
        fn a_heading_goes_with_what_it_heads_never_alone_at_a_screens_end() {
            let mut pager = on();
            let before: Vec<String> = (0..ROWS - 1).map(|i| format!("line {i}")).collect();
            feed(&mut pager, &before);
            let shown = feed(&mut pager, &["── with fencing ──".to_string()]);
            assert!(shown.is_empty(), "the heading waits for its block");
            pager.open();
            feed(&mut pager, &["+1.000s  A  took the lock".to_string()]);
            feed(&mut pager, &["           and more".to_string()]);
            assert!(pager.close().is_empty());
            let screens = all_screens(&mut pager);
            assert_eq!(screens[0][0], "── with fencing ──");
            assert_eq!(screens[0].len(), 3);
        }

        #[test]
        fn a_verdict_that_fits_one_screen_is_kept_whole() {
            let mut pager = on();
            let before: Vec<String> = (0..20).map(|i| format!("line {i}")).collect();
            feed(&mut pager, &before);
            pager.open();
            feed(&mut pager, &["Verdict".to_string()]);
            for part in 0..3 {
                pager.open();
                feed(
                    &mut pager,
                    &(0..6).map(|i| format!("{part}.{i}")).collect::<Vec<_>>(),
                );
                pager.close();
            }
            assert!(pager.close().is_empty(), "19 rows do not fit the 16 left");
            let screens = all_screens(&mut pager);
            assert_eq!(screens.len(), 1);
            assert_eq!(screens[0].len(), 19);
        }

        #[test]
        fn nothing_is_held_without_step() {
            let mut pager = Pager::OFF;
            assert!((0..100).all(|i| !pager.take(&format!("line {i}")).0));
        }
    }
}

fn write_line(text: &str) {
    if crate::procs::interrupted() {
        return; // cleaning up after Ctrl-C: what workers say while they die is noise
    }
    if kept_back(text) {
        return;
    }
    let mut out = io::stdout().lock();
    if let Err(err) = writeln!(out, "{text}").and_then(|_| out.flush()) {
        drop(out);
        stdout_failed(&err);
    }
}

/// The exit after stdout failed, decided by what it was:
///
/// - a closed pipe (`lockslab gc-pause | head`): 141, as if SIGPIPE had killed us, which is
///   what the shell expects of the left side of a pipe;
/// - a terminal: it hung up (the window was closed, the ssh link dropped). The kernel marks
///   the terminal hung up *before* it sends SIGHUP, and a shell forwards its own SIGHUP later
///   still, so this write may fail first: it is the same event, and exits 129 like SIGHUP.
///   A write error on a terminal is not a closed pipe;
/// - anything else (`>/dev/full`, a disk error): the lab could not run, exit 4 with a reason.
fn stdout_failed(err: &io::Error) -> ! {
    use crate::exit::Exit;
    use nix::sys::signal::Signal;
    if err.kind() == io::ErrorKind::BrokenPipe {
        crate::procs::shut_down(Exit::Signalled(Signal::SIGPIPE as i32), None)
    } else if STDOUT_WAS_TERMINAL.load(Ordering::Relaxed) {
        crate::procs::shut_down(Exit::Signalled(Signal::SIGHUP as i32), None)
    } else {
        let reason = format!("lockslab: error: writing the lab's output to stdout: {err}");
        crate::procs::shut_down(Exit::CouldNotRun, Some(reason))
    }
}

/// Prints one line on stderr, and carries on if it cannot: stderr may be a closed pipe, a
/// full disk or a terminal that hung up, and no cleanup or exit status may depend on it.
pub fn err_line(text: &str) {
    let _ = writeln!(io::stderr().lock(), "{text}");
}

/// Adds what every verdict carries besides its lab's facts: the run's `seed` (see
/// [`crate::seed`]) and whether lockslab itself was paused during the run.
pub fn stamp_verdict(verdict: &mut serde_json::Value) {
    if let (Some(seed), Some(fields)) = (crate::seed::seed(), verdict.as_object_mut()) {
        fields.insert("seed".into(), seed.into());
    }
    if let Some(fields) = verdict.as_object_mut() {
        crate::watchdog::mark_disturbed(fields);
    }
}

/// Writes one JSON object on its own line to stdout.
///
/// A lab's verdict gets the run's `seed` (see [`crate::seed`]), whichever lab wrote it.
pub fn json_line<T: Serialize>(value: &T) {
    let text = serde_json::to_string(value).unwrap_or_default();
    // Events keep their fields' order; only a verdict is taken apart.
    if !text.contains("\"kind\":\"verdict\"") {
        write_line(&text);
        return;
    }
    let Ok(mut verdict) = serde_json::from_str::<serde_json::Value>(&text) else {
        write_line(&text);
        return;
    };
    stamp_verdict(&mut verdict);
    write_line(&serde_json::to_string(&verdict).unwrap_or_default());
}

thread_local! {
    /// While [`held_back`] runs on this thread: the lines it printed, colours and all.
    static HELD_BACK: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `play` with every line this thread prints kept back, and returns them beside its
/// result, to be printed with [`print_held`]: parts of a lab played side by side, each on
/// its own thread, are shown one whole part after another, in their order, not interleaved.
pub fn held_back<R>(play: impl FnOnce() -> R) -> (R, Vec<String>) {
    HELD_BACK.with(|held| *held.borrow_mut() = Some(Vec::new()));
    let result = play();
    let lines = HELD_BACK.with(|held| held.borrow_mut().take().unwrap_or_default());
    (result, lines)
}

/// Prints the lines [`held_back`] kept, as they would have been printed.
/// Under `--step`, an event's wrapped lines (indented under its text) stay on the
/// screen of its first line.
pub fn print_held(lines: &[String]) {
    let mut event: Option<screens::Block> = None;
    for text in lines {
        if !without_colors(text).starts_with(&" ".repeat(12)) {
            drop(event.take());
            event = Some(screens::block());
        }
        if !screens::held(text) {
            write_line(text);
        }
    }
}

/// Keeps `text` for [`held_back`]; true when it is kept, and so not printed yet.
fn kept_back(text: &str) -> bool {
    HELD_BACK.with(|held| match held.borrow_mut().as_mut() {
        Some(lines) => {
            lines.push(text.to_string());
            true
        }
        None => false,
    })
}

/// The text as shown, without colour escape codes.
pub fn without_colors(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    let mut in_escape = false;
    for c in text.chars() {
        match (in_escape, c) {
            (false, '\u{1b}') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, _) => shown.push(c),
        }
    }
    shown
}

/// A plain table: a header row and body rows, columns padded to fit.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| visible_width(h)).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(visible_width(cell));
        }
    }
    let render = |cells: Vec<&str>| -> String {
        let mut line = String::from(" ");
        for (i, cell) in cells.iter().enumerate() {
            line.push(' ');
            line.push_str(cell);
            line.push_str(&" ".repeat(widths[i].saturating_sub(visible_width(cell))));
            line.push_str("  ");
        }
        line.trim_end().to_string()
    };
    let mut out = vec![
        render(header.iter().map(|h| &**h).collect())
            .bold()
            .to_string(),
    ];
    out.push(
        format!(
            "  {}",
            "─".repeat(widths.iter().map(|w| w + 2).sum::<usize>())
        )
        .dimmed()
        .to_string(),
    );
    for row in rows {
        out.push(render(row.iter().map(String::as_str).collect()));
    }
    if out.iter().any(|line| visible_width(line) > width()) {
        return blocks(header, rows);
    }
    out.join("\n")
}

/// A table too wide for the terminal, as one block per row: the first cell as the block's
/// heading, then each other cell under its column's name.
fn blocks(header: &[&str], rows: &[Vec<String>]) -> String {
    let label_width = header.iter().skip(1).map(|h| visible_width(h)).max();
    let mut out = Vec::new();
    for row in rows {
        let mut cells = row.iter();
        if let Some(first) = cells.next() {
            out.push(format!("  {}", first.bold()));
        }
        for (name, cell) in header.iter().skip(1).zip(cells) {
            let pad = label_width.unwrap_or(0) - visible_width(name);
            out.push(format!(
                "      {}{}  {cell}",
                name.dimmed(),
                " ".repeat(pad)
            ));
        }
    }
    out.join("\n")
}

/// The width output is fitted to: `COLUMNS` when set, else the terminal's, else 80 (a
/// projector's terminal, and what pasted walkthrough output is checked against).
pub fn width() -> usize {
    static WIDTH: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *WIDTH.get_or_init(|| {
        let columns = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.trim().parse::<usize>().ok())
            .or_else(terminal_width)
            .unwrap_or(80);
        columns.clamp(40, 1000)
    })
}

fn terminal_width() -> Option<usize> {
    use nix::libc;
    if !io::stdout().is_terminal() {
        return None;
    }
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ fills the winsize struct we pass and touches nothing else.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut size) };
    (rc == 0 && size.ws_col > 0).then_some(size.ws_col as usize)
}

/// Breaks `text` into lines of at most `width` terminal columns at spaces (a word longer
/// than the width keeps its own line). A text that fits is left alone, and a wrapped one
/// keeps its runs of spaces, so aligned columns stay aligned. Colour codes take no width;
/// a wide character (`⌛`, `✅`) takes the two columns a terminal draws it in.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    if visible_width(text) <= width {
        return vec![text.to_string()];
    }
    let options = textwrap::Options::new(width)
        .word_separator(textwrap::WordSeparator::AsciiSpace)
        .word_splitter(textwrap::WordSplitter::NoHyphenation)
        .break_words(false);
    textwrap::wrap(text, options)
        .into_iter()
        .map(|line| line.into_owned())
        .collect()
}

/// Each line of `text` fitted to [`width`]: a longer one wraps at spaces, its continuation
/// indented like the line itself (two more under a list item).
pub fn fitted(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if visible_width(line) <= width() {
            out.push(line.to_string());
            continue;
        }
        let body = line.trim_start_matches(' ');
        let mut indent = line.len() - body.len();
        let first_indent = indent;
        if body.starts_with("- ") || body.starts_with("• ") || body.starts_with("* ") {
            indent += 2;
        }
        for (i, piece) in wrap(body, width().saturating_sub(indent).max(20))
            .into_iter()
            .enumerate()
        {
            let pad = if i == 0 { first_indent } else { indent };
            out.push(format!("{}{piece}", " ".repeat(pad)));
        }
    }
    out
}

/// A heading's detail lines (its servers, its lanes), dimmed and two columns in, fitted
/// as prose is: the same lines a lab's heading prints through `Run::detail`.
pub fn details(lines: impl IntoIterator<Item = String>) {
    for text in lines {
        prose(&format!("  {}", text.dimmed()));
    }
}

/// Prints prose on stdout fitted to the terminal's width (see [`fitted`]).
pub fn prose(text: &str) {
    let _one_block = screens::block();
    for line in fitted(text) {
        self::line(&line);
    }
}

/// Prints an error on stderr fitted as prose is (see [`fitted`]): a long one — a client's
/// last stderr line, a flag's minimum and why — wraps at spaces like the verdict's lines.
pub fn err_prose(text: &str) {
    for line in fitted(text) {
        err_line(&line);
    }
}

/// The columns a terminal draws `text` in: colour codes take none, wide characters two.
pub fn visible_width(text: &str) -> usize {
    textwrap::core::display_width(text)
}

/// A lab's first line: its name, the run id, and the seed to replay its random choices.
pub fn run_heading(lab: &str, run_id: &str) -> String {
    let seed = crate::seed::seed()
        .map(|seed| format!(" · --seed {seed}").dimmed().to_string())
        .unwrap_or_default();
    format!("{} run {run_id}{seed}", format!("lockslab {lab}").bold())
}

/// `1.234s` or `850ms`, for durations a learner reads.
pub fn human(duration: Duration) -> String {
    let ms = duration.as_millis();
    if ms < 1000 {
        format!("{ms}ms")
    } else {
        // Whole milliseconds, like the `_ms` fields of `--json`: the timeline and the
        // verdict never disagree by a rounding.
        format!("{}.{:03}s", ms / 1000, ms % 1000)
    }
}

/// A count and its noun, the singular for one: `1 schedule`, `2 schedules`, `1 time`. Any
/// integer a lab counts in (a row count read from Postgres is an `i64`).
pub fn count(n: impl Into<i128>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// `word` as one word of a POSIX shell's command line: as it is when it holds nothing the
/// shell reads specially; otherwise between single quotes, inside which only `'` itself
/// needs care (closed, escaped, reopened: `'\''`). The empty word is `''`.
pub fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./:=@%+,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// `text` as it may reach a terminal: escape sequences (colours, cursor moves, a cleared
/// screen, a window title) removed whole, other control characters and Unicode format
/// characters (a bidi override turns the rest of a line around) dropped, a tab made a
/// space. A client's words, or a room seat's results, are shown on someone else's screen:
/// they must not be able to paint a verdict of their own there.
pub fn printable(text: &str) -> String {
    use unicode_properties::{GeneralCategory, UnicodeGeneralCategory};
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            // CSI: ESC [ (or the one-character U+009B), parameters, then a final byte.
            '\u{1b}' if chars.peek() == Some(&'[') => {
                chars.next();
                skip_csi(&mut chars);
            }
            '\u{9b}' => skip_csi(&mut chars),
            // OSC, DCS, SOS, PM, APC: a string, ended by BEL or ST (ESC and a backslash).
            '\u{1b}' if matches!(chars.peek(), Some(']' | 'P' | 'X' | '^' | '_')) => {
                chars.next();
                skip_string(&mut chars);
            }
            '\u{90}' | '\u{98}' | '\u{9d}' | '\u{9e}' | '\u{9f}' => skip_string(&mut chars),
            // Any other escape: ESC, its intermediate bytes (`ESC ( B` picks a character
            // set), and the character that ends it.
            '\u{1b}' => {
                while chars
                    .next_if(|c| ('\u{20}'..='\u{2f}').contains(c))
                    .is_some()
                {}
                chars.next();
            }
            '\t' => out.push(' '),
            c if c.is_control() || c.general_category() == GeneralCategory::Format => {}
            c => out.push(c),
        }
    }
    out
}

fn skip_csi(chars: &mut std::iter::Peekable<std::str::Chars>) {
    for c in chars.by_ref() {
        if ('\u{40}'..='\u{7e}').contains(&c) {
            return;
        }
    }
}

fn skip_string(chars: &mut std::iter::Peekable<std::str::Chars>) {
    while let Some(c) = chars.next() {
        match c {
            '\u{7}' | '\u{9c}' => return,
            '\u{1b}' if chars.peek() == Some(&'\\') => {
                chars.next();
                return;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shell_word_is_quoted_only_when_the_shell_would_read_it_otherwise() {
        assert_eq!(shell_word("client.py"), "client.py");
        assert_eq!(shell_word("--fast=1"), "--fast=1");
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("my client.py"), "'my client.py'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(shell_word("$HOME"), "'$HOME'");
        assert_eq!(shell_word("a\"b`c`"), "'a\"b`c`'");
        assert_eq!(shell_word("*"), "'*'");
    }

    /// Each word goes through a real shell and comes back as it was.
    #[test]
    fn a_quoted_program_comes_back_from_sh_word_for_word() {
        let words = [
            "",
            "two words",
            "it's",
            "$HOME `id`",
            "a\"b",
            "back\\slash",
            "\n",
        ];
        let line: Vec<String> = words.iter().map(|w| shell_word(w)).collect();
        let script = format!("for w in {}; do printf '<%s>' \"$w\"; done", line.join(" "));
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        let expected: String = words.iter().map(|w| format!("<{w}>")).collect();
        assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    }

    #[test]
    fn a_count_of_one_takes_the_singular() {
        assert_eq!(count(1u32, "time", "times"), "1 time");
        assert_eq!(count(2u64, "design", "designs"), "2 designs");
        assert_eq!(count(0u32, "file", "files"), "0 files");
    }

    #[test]
    fn a_line_that_fits_keeps_its_columns() {
        let row = "m5 :46467   sent +  55.4ms   ✗ no answer in time";
        assert_eq!(wrap(row, 80), vec![row.to_string()]);
    }

    #[test]
    fn a_wrapped_line_keeps_its_runs_of_spaces() {
        let row = "m1 :40001   sent +   0.2ms   ✓ OK   m2 :40002   sent +   0.4ms   ✓ OK";
        let lines = wrap(row, 40);
        assert!(lines.len() > 1, "{lines:?}");
        assert!(lines[0].contains(":40001   sent +   0.2ms"), "{lines:?}");
        assert!(lines.iter().all(|l| visible_width(l) <= 40), "{lines:?}");
    }

    #[test]
    fn wide_characters_and_colours_are_measured_as_drawn() {
        assert_eq!(visible_width("⌛ wait"), 7);
        assert_eq!(visible_width(&"red".red().to_string()), 3);
        // Four hourglasses fill 8 columns: they no longer fit in 7.
        assert_eq!(wrap("⌛⌛⌛⌛ x", 7).len(), 2);
    }
}
