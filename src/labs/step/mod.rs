//! `--step`: a lab stops at named checkpoints before each reveal, asks the room the
//! walkthrough's question for that moment, and waits for Enter.
//!
//! Stepping must never change what is measured. A checkpoint is placed only where no timer
//! of the story is running — before the workers take their locks, between scenarios,
//! before the verdict — never while a worker holds a lease or lies frozen: waiting for a
//! person there would stretch the pause the lab measures. Without `--step` a checkpoint
//! does nothing at all.
//!
//! The questions go to stderr, so that `--json --step` keeps stdout pure JSON Lines.
//! At a checkpoint, `q` ends the run the way Ctrl-C does: workers stopped, the run's keys
//! and rows removed, private servers stopped, exit status 130.

use std::io::{BufRead, IsTerminal};
use std::sync::atomic::{AtomicBool, Ordering};

use colored::Colorize;

/// A stop before a reveal: what is about to happen, and what to ask the room.
#[derive(Clone, Copy, Debug)]
pub struct Checkpoint {
    pub name: &'static str,
    pub question: &'static str,
}

static STEPPING: AtomicBool = AtomicBool::new(false);

/// Turns stepping on for this run (`--step`).
pub fn enable(on: bool) {
    STEPPING.store(on, Ordering::SeqCst);
}

static CLEAR: AtomicBool = AtomicBool::new(false);

/// `--clear`: each Enter at a checkpoint clears the terminal, so that the part that follows
/// starts at the top of one screen (nothing happens when stderr is not a terminal).
pub fn clear_screens(on: bool) {
    CLEAR.store(on, Ordering::SeqCst);
}

pub fn stepping() -> bool {
    STEPPING.load(Ordering::SeqCst)
}

/// Shows the checkpoint and waits for Enter; `q` (then Enter) ends the run cleanly. When
/// stdin ends (nobody to answer), the questions are still shown but no longer waited for.
pub fn checkpoint(at: &Checkpoint) {
    stop(at.name, at.question);
}

/// A checkpoint that repeats (before each approach, each way): its name says which one
/// comes next, `⏸ before the next approach: optimistic`.
pub fn checkpoint_before(at: &Checkpoint, next: &str) {
    stop(&format!("{}: {next}", at.name), at.question);
}

/// The last stop's name and question: the part a held screen belongs to.
static PART: std::sync::Mutex<(String, String)> =
    std::sync::Mutex::new((String::new(), String::new()));

fn stop(name: &str, question: &str) {
    if !stepping() || crate::procs::interrupted() {
        return;
    }
    show_held();
    if !stepping() {
        return;
    }
    ask(name, question);
    *PART.lock().unwrap_or_else(|p| p.into_inner()) = (name.to_string(), question.to_string());
}

/// Shows the lines a part held back while it played (see [`crate::output::screens`]), a
/// screen at a time, with a stop before each: the screen above it is full. Such a stop
/// asks its part's question again, the one the room is answering from these screens, so
/// that a lab ends on its own question even when its verdict takes two screens. Every
/// stop shows them first; the runner calls it once more after the verdict.
pub fn show_held() {
    use crate::output::screens;
    while screens::holding() && !crate::procs::interrupted() {
        if stepping() {
            let (part, question) = PART.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let (name, question) = if part.is_empty() {
                ("more of the heading".to_string(), HEADING_FULL.to_string())
            } else {
                (format!("{part}, continued"), question)
            };
            ask(&name, &question);
        }
        screens::show_next();
    }
}

const HEADING_FULL: &str = "The screen is full. Before you read on: what do you expect next?";

fn ask(name: &str, question: &str) {
    crate::errln!("");
    crate::errln!("{}", format!("⏸ {name}").bright_blue().bold());
    for line in crate::output::wrap(question, 76) {
        crate::errln!("  {}", line.bold());
    }
    let on_terminal = std::io::stdin().is_terminal();
    crate::errln!(
        "  {}",
        "Enter: go on · q then Enter: stop the lab (cleans up)".dimmed()
    );
    let mut answer = String::new();
    let began = std::time::Instant::now();
    let read = std::io::stdin().lock().read_line(&mut answer);
    crate::run_clock::waited_since(began);
    match read {
        Ok(0) | Err(_) => {
            if on_terminal {
                crate::errln!("  (no input: carrying on without stopping)");
            }
            enable(false);
            crate::output::screens::page(false);
        }
        Ok(_) if answer.trim().eq_ignore_ascii_case("q") => {
            use nix::sys::signal::Signal;
            crate::procs::shut_down(
                crate::exit::Exit::Signalled(Signal::SIGINT as i32),
                Some(format!(
                    "lockslab: stopped at '{name}'; workers stopped, the run's keys and rows removed"
                )),
            )
        }
        Ok(_) => {
            crate::output::screens::new_screen();
            if CLEAR.load(Ordering::SeqCst) && std::io::stderr().is_terminal() {
                // ESC[2J clears the screen, ESC[3J its scrollback, ESC[H goes home.
                crate::errln!("\x1b[2J\x1b[3J\x1b[H{}", format!("▶ {name}").dimmed());
            }
        }
    }
}

mod network_etcd;
mod questions;
mod verdict_halves;
pub use questions::*;

#[cfg(test)]
mod tests {

    #[test]
    fn questions_wrap_at_spaces_within_the_width() {
        let lines = crate::output::wrap("one two three four five six seven", 10);
        assert_eq!(lines, ["one two", "three four", "five six", "seven"]);
        assert!(lines.iter().all(|l| l.chars().count() <= 10));
    }
}
