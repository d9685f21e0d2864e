//! `lockslab matrix`'s table: a row per design, a column per fault, as wide as 80 columns
//! allow, and the notes below it (each UNSAFE cell's violation and replay command).

use colored::Colorize;

use serde::{Deserialize, Serialize};

use crate::chaos::show;
use crate::designs::Design;
use crate::nemesis::generate::FaultKind;

/// One cell of the matrix, as `--json` prints it and `--merge` reads it back.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Cell {
    pub kind: String,
    pub design: Design,
    pub fault: FaultKind,
    pub result: String,
    pub replay: Option<String>,
    pub labs_call_it_safe: bool,
    /// An UNKNOWN cell: why its first unknown history could not be decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

const LABEL: usize = 20;

/// A column's width: as wide as 80 columns allow for this many kinds (19 at most).
fn column(kinds: usize) -> usize {
    ((80 - LABEL - 3) / kinds.max(1)).min(19)
}

/// Below this width a column shows its words short (`SAFE 12`, `UNSAFE#1`, `UNKNOWN 7`).
const NARROW: usize = 13;

/// The table's lines for these columns: one while seven fit on it; past seven, two — what
/// happens to a client or its path on the first, what happens to a server on the second,
/// each column wide enough for its words ([`in_table_order`] puts the kinds, and so the
/// notes' numbers, in that order).
fn lines(kinds: &[FaultKind]) -> Vec<Vec<FaultKind>> {
    let (servers, clients): (Vec<FaultKind>, Vec<FaultKind>) =
        kinds.iter().partition(|k| k.on_a_server());
    if kinds.len() <= 7 || servers.is_empty() || clients.is_empty() {
        return vec![kinds.to_vec()];
    }
    vec![clients, servers]
}

/// The columns as the table shows them: a client's faults, then a server's (each group in
/// `FaultKind::ALL`'s order). A note's number follows this order.
pub fn in_table_order(kinds: &mut Vec<FaultKind>) {
    kinds.sort_by_key(|k| (k.on_a_server(), FaultKind::ALL.iter().position(|a| a == k)));
    kinds.dedup();
}

/// The width of every column of a table of these kinds.
fn width_of(kinds: &[FaultKind]) -> usize {
    column(lines(kinds).iter().map(|l| l.len()).max().unwrap_or(1))
}

pub fn header(kinds: &[FaultKind]) {
    let width = width_of(kinds);
    for (n, line) in lines(kinds).iter().enumerate() {
        let head: String = line
            .iter()
            .map(|k| format!("{:<width$}", head_name(*k, width)))
            .collect();
        let label = if n == 0 { "   design" } else { "" };
        crate::outln!("{label:<w$}{}", head.trim_end(), w = LABEL + 3);
    }
}

/// A design's row: ✅ or ❌ as the labs mark it, then its cells (a cell another part of a
/// sharded run played: blank) — on two lines past seven columns. An UNSAFE cell names its
/// note below the table.
pub fn row_line(design: Design, kinds: &[FaultKind], row: &[Cell], notes: &[&Cell]) -> String {
    let mark = if design.labs_call_it_safe() {
        "✅"
    } else {
        "❌"
    };
    let width = width_of(kinds);
    let mut out = Vec::new();
    for (n, line) in lines(kinds).iter().enumerate() {
        let mut text = if n == 0 {
            format!("{mark} {:<LABEL$}", design.name())
        } else {
            " ".repeat(LABEL + 3)
        };
        for kind in line {
            let word = row
                .iter()
                .find(|c| c.fault == *kind)
                .map_or(String::new(), |c| short(c, notes, width));
            text.push_str(&paint(&word, width));
        }
        out.push(text.trim_end().to_string());
    }
    out.join("\n")
}

/// A column's heading: the kind's name, cut to fit a narrow column (`rest-aof`; with nine
/// columns, `rstrt`, `lost`, `ldr-k`, `fover`).
fn head_name(kind: FaultKind, width: usize) -> String {
    let name = kind.name();
    if name.len() < width {
        return name.to_string();
    }
    let cut: String = match kind {
        FaultKind::RestartAof if width > 8 => "rest-aof".into(),
        FaultKind::LostReply if width > 8 => "lost-rep".into(),
        FaultKind::RestartAof => "r-aof".into(),
        FaultKind::LostReply if width > 7 => "lost-rp".into(),
        FaultKind::LostReply if width > 6 => "lost-r".into(),
        FaultKind::LostReply => "lost".into(),
        FaultKind::Restart if width > 6 => "restrt".into(),
        FaultKind::Restart => "rstrt".into(),
        FaultKind::LeaderKill if width > 6 => "leader".into(),
        FaultKind::LeaderKill => "ldr-k".into(),
        FaultKind::Failover => "fover".into(),
        FaultKind::Partition if width > 7 => "partitn".into(),
        FaultKind::Partition => "part".into(),
        FaultKind::LeaderStall if width > 6 => "ldr-stl".into(),
        FaultKind::LeaderStall => "stall".into(),
        _ => name.into(),
    };
    if cut.len() < width {
        cut
    } else {
        cut.chars().take(width.max(2) - 1).collect()
    }
}

/// A cell's word in its column: `SAFE (12)`, `UNSAFE [1]`, `UNKNOWN 7/12` (that many
/// histories could not be decided), `-`; in a narrow column `SAFE 12`, `UNSAFE#1`,
/// `UNKNOWN 7` (7 of the cell's schedules unknown); narrower still, `UNS#1`, and `SAFE`
/// and `UNKNOWN` without their count where `SAFE 12` or `UNKNOWN 12` would touch the next
/// column. The word is always UNKNOWN, as in `--json`: seven letters fit the narrowest
/// column (seven kinds on one line).
fn short(cell: &Cell, notes: &[&Cell], width: usize) -> String {
    let narrow = width < NARROW;
    if cell.result.starts_with("UNSAFE") {
        let n = notes
            .iter()
            .position(|c| (c.design, c.fault) == (cell.design, cell.fault))
            .map_or(0, |n| n + 1);
        // `UNSAFE#10` fills a column of nine (six kinds a line) to its edge: short there.
        if width < 9 || format!("UNSAFE#{n}").len() >= width {
            format!("UNS#{n}")
        } else if narrow {
            format!("UNSAFE#{n}")
        } else {
            format!("UNSAFE [{n}]")
        }
    } else if let Some(count) = cell.result.strip_prefix("UNKNOWN ") {
        let word = format!("UNKNOWN {}", count.split('/').next().unwrap_or(count));
        if !narrow {
            format!("UNKNOWN {count}")
        } else if word.len() < width {
            word
        } else {
            "UNKNOWN".into()
        }
    } else if narrow && let Some(n) = cell.result.strip_prefix("SAFE (") {
        let word = format!("SAFE {}", n.trim_end_matches(')'));
        if word.len() < width {
            word
        } else {
            "SAFE".into()
        }
    } else {
        cell.result.clone()
    }
}

/// The UNSAFE cells, in the table's order: their notes are numbered so.
pub fn notes(cells: &[Cell]) -> Vec<&Cell> {
    cells
        .iter()
        .filter(|c| c.result.starts_with("UNSAFE"))
        .collect()
}

/// Below the table: every red cell's violation and replay command, and where the matrix
/// and the labs disagree — either way.
pub fn footer(cells: &[Cell], restart_refused: bool) {
    if restart_refused {
        crate::outln!();
        crate::prose!(
            "restart, restart-aof, failover: not played — the Redis was given (--redis-url \
             or LOCKSLAB_REDIS_URL), and chaos kills and restarts only servers it started \
             itself."
        );
    }
    for (n, cell) in notes(cells).iter().enumerate() {
        crate::outln!();
        let violation = cell.result.trim_start_matches("UNSAFE ");
        crate::outln!(
            "[{}] {} × {}: {violation}. Replay it:",
            n + 1,
            cell.design.name(),
            cell.fault.name()
        );
        if let Some(replay) = &cell.replay {
            for line in replay_lines_of(replay) {
                crate::outln!("  {line}");
            }
        }
    }
    let against: Vec<String> = cells
        .iter()
        .filter(|c| c.labs_call_it_safe && c.result.starts_with("UNSAFE"))
        .map(|c| format!("{} × {}", c.design.name(), c.fault.name()))
        .collect();
    let missed = expected_to_break(cells, "SAFE");
    let unknown = expected_to_break(cells, "UNKNOWN");
    crate::outln!();
    if against.is_empty() {
        crate::prose!("{}", none_against(cells));
    } else {
        crate::prose!(
            "{} {}: the labs expect these safe.{}",
            "Disagrees with the labs:".red().bold(),
            against.join(", "),
            unknown_safe(cells).map_or(String::new(), |u| format!(" {u}"))
        );
    }
    if !missed.is_empty() {
        crate::prose!(
            "{} {} the labs expect to break {} not broken in these schedules: absence of \
             evidence, not agreement (the schedules missed the window; more --schedules, or chaos \
             --design D --faults F, hunt longer): {}.",
            missed.len(),
            if missed.len() == 1 { "cell" } else { "cells" },
            if missed.len() == 1 { "was" } else { "were" },
            missed.join(", ")
        );
    }
    if !unknown.is_empty() {
        crate::prose!(
            "Expected to break, unknown (the checker could not decide that many of their \
             histories, and found no violation in the others): {}.",
            unknown.join(", ")
        );
    }
}

/// No cell the labs expect safe broke — and those of them the checker could not decide are
/// named: an UNKNOWN is not a pass.
fn none_against(cells: &[Cell]) -> String {
    let said = "No cell the labs expect safe showed a violation.";
    match unknown_safe(cells) {
        Some(unknown) => format!("{said} {unknown}"),
        None => said.to_string(),
    }
}

/// The cells the labs expect safe that came out UNKNOWN, in a sentence; None if none did.
fn unknown_safe(cells: &[Cell]) -> Option<String> {
    let unknown: Vec<String> = (cells.iter())
        .filter(|c| c.labs_call_it_safe && c.result.starts_with("UNKNOWN"))
        .map(|c| format!("{} × {}", c.design.name(), c.fault.name()))
        .collect();
    (!unknown.is_empty()).then(|| {
        format!(
            "Expected safe, unknown, never a pass: {}.",
            unknown.join(", ")
        )
    })
}

/// The cells the labs expect to break whose result starts with `word` (`SAFE`: no
/// violation found; `UNKNOWN`: histories the checker could not decide).
fn expected_to_break(cells: &[Cell], word: &str) -> Vec<String> {
    cells
        .iter()
        .filter(|c| !c.labs_call_it_safe && c.result.starts_with(word))
        .map(|c| format!("{} × {}", c.design.name(), c.fault.name()))
        .collect()
}

/// A replay command of a cell (one line in `--json`), as [`show::replay_lines`] prints it.
fn replay_lines_of(replay: &str) -> Vec<String> {
    let parsed = replay.split_once(" --schedule '").and_then(|(head, json)| {
        let design = head.split_whitespace().nth(3)?;
        let design = <Design as clap::ValueEnum>::from_str(design, false).ok()?;
        let clients = head
            .split_once("--clients ")
            .and_then(|(_, n)| n.split_whitespace().next()?.parse().ok())
            .unwrap_or(3);
        let schedule = serde_json::from_str(json.strip_suffix('\'')?).ok()?;
        Some(show::replay_lines(design, clients, &schedule))
    });
    parsed.unwrap_or_else(|| vec![replay.to_string()])
}

/// A cell's word in colour (padding counts the visible characters only).
fn paint(cell: &str, width: usize) -> String {
    let padded = format!("{cell:<w$} ", w = width - 1);
    if cell.starts_with("UNS") {
        padded.red().to_string()
    } else if cell.starts_with("SAFE") {
        padded.green().to_string()
    } else if cell.starts_with("UNKNOWN") {
        padded.yellow().to_string()
    } else {
        padded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_fits_80_columns_and_an_unsafe_cell_points_at_its_note() {
        let cell = |design, fault, result: &str| Cell {
            kind: "cell".into(),
            design,
            fault,
            result: result.into(),
            replay: None,
            labs_call_it_safe: design.labs_call_it_safe_under(fault),
            unknown: None,
        };
        let row = vec![
            cell(Design::RedisDurableToken, FaultKind::Pause, "UNKNOWN 12/12"),
            cell(
                Design::RedisDurableToken,
                FaultKind::Kill,
                "UNSAFE stale-write",
            ),
            cell(Design::RedisDurableToken, FaultKind::Restart, "SAFE (12)"),
            cell(
                Design::RedisDurableToken,
                FaultKind::RestartAof,
                "SAFE (12)",
            ),
        ];
        colored::control::set_override(false);
        // The UNKNOWN cell the labs call safe is named under the table: never a pass.
        let safe_only: Vec<Cell> = row
            .iter()
            .filter(|c| c.fault != FaultKind::Kill)
            .cloned()
            .collect();
        assert_eq!(
            none_against(&safe_only),
            "No cell the labs expect safe showed a violation. Expected safe, unknown, \
             never a pass: redis-durable-token × pause."
        );
        let four = &FaultKind::ALL[..4];
        let line = row_line(Design::RedisDurableToken, four, &row, &notes(&row));
        assert!(line.chars().count() < 80, "{line}");
        assert!(
            line.contains("UNSAFE [1]") && line.contains("UNKNOWN 12/12 "),
            "{line}"
        );
        // Six columns: the short words, still under 80.
        let mut six = row.clone();
        for fault in [FaultKind::Delay, FaultKind::LostReply] {
            six.push(cell(Design::RedisDurableToken, fault, "UNKNOWN 12/12"));
        }
        let line = row_line(
            Design::RedisDurableToken,
            &FaultKind::ALL[..6],
            &six,
            &notes(&six),
        );
        assert!(line.chars().count() < 80, "{line}");
        assert!(
            line.contains("UNSAFE#1") && line.contains("UNKNOWN ") && line.contains("SAFE 12"),
            "{line}"
        );
        // Seven: one line still, the shortest words.
        let mut seven = six.clone();
        seven.push(cell(Design::RedisDurableToken, FaultKind::Cut, "SAFE (12)"));
        let line = row_line(
            Design::RedisDurableToken,
            &FaultKind::ALL[..7],
            &seven,
            &notes(&seven),
        );
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(line.chars().count() < 80, "{line}");
        assert!(
            line.contains("UNS#1 ") && line.contains("UNKNOWN "),
            "{line}"
        );
        let mut eight = seven.clone();
        eight.push(cell(Design::RedisDurableToken, FaultKind::LeaderKill, "-"));
        // Ten (every kind): two lines, a client's faults over a server's, each column wide
        // enough for its count again; the notes numbered in that order.
        let mut ten = eight.clone();
        ten.push(cell(
            Design::RedisDurableToken,
            FaultKind::Clock,
            "UNSAFE stale-write",
        ));
        ten.push(cell(
            Design::RedisDurableToken,
            FaultKind::Failover,
            "UNKNOWN 12/12",
        ));
        // The ten kinds before the hosts' two (issue 44): five a line.
        let mut kinds = FaultKind::ALL[..10].to_vec();
        in_table_order(&mut kinds);
        assert_eq!(kinds[..5].iter().filter(|k| k.on_a_server()).count(), 0);
        ten.sort_by_key(|c| kinds.iter().position(|k| *k == c.fault));
        let row = row_line(Design::RedisDurableToken, &kinds, &ten, &notes(&ten));
        let lines: Vec<&str> = row.lines().collect();
        assert_eq!(lines.len(), 2, "{row}");
        for line in &lines {
            assert!(line.chars().count() < 80, "{line}");
        }
        // pause kill delay lost-reply cut | restart restart-aof leader-kill clock failover
        assert!(lines[0].starts_with("✅ redis-durable-token"), "{row}");
        assert!(
            lines[0].contains("UNSAFE#1 ") && lines[0].contains("UNKNOWN 12 "),
            "{row}"
        );
        assert!(lines[1].starts_with(&" ".repeat(LABEL + 3)), "{row}");
        assert!(
            lines[1].contains("SAFE 12 ") && lines[1].contains(" -"),
            "{row}"
        );
        assert!(
            lines[1].contains("UNSAFE#2 ") && lines[1].ends_with(" UNKNOWN 12"),
            "{row}"
        );
        // Twelve (every kind, the hosts' two too): six a line, nine columns wide, where a
        // note of two digits goes short (`UNSAFE#10` would touch the next word).
        let mut twelve = ten.clone();
        twelve.push(cell(
            Design::RedisDurableToken,
            FaultKind::Partition,
            "SAFE (12)",
        ));
        twelve.push(cell(Design::RedisDurableToken, FaultKind::LeaderStall, "-"));
        let mut all = FaultKind::ALL.to_vec();
        in_table_order(&mut all);
        twelve.sort_by_key(|c| all.iter().position(|k| *k == c.fault));
        let many: Vec<Cell> = (0..9)
            .map(|_| cell(Design::RedisLock, FaultKind::Pause, "UNSAFE stale-write"))
            .collect();
        let mut noted: Vec<&Cell> = many.iter().collect();
        noted.extend(notes(&twelve));
        let row = row_line(Design::RedisDurableToken, &all, &twelve, &noted);
        let lines: Vec<&str> = row.lines().collect();
        assert_eq!(lines.len(), 2, "{row}");
        assert!(
            lines[0].contains("UNS#10 ") && lines[0].ends_with(" SAFE 12"),
            "{row}"
        );
        assert!(lines[1].contains("UNS#11 "), "{row}");
        for kinds in [&FaultKind::ALL[..7], &kinds[..], &all[..]] {
            let width = width_of(kinds);
            let heads: Vec<String> = kinds.iter().map(|k| head_name(*k, width)).collect();
            assert!(heads.iter().all(|h| h.len() < width), "{heads:?}");
        }
    }

    #[test]
    fn an_unknown_cell_expected_to_break_is_unknown_not_missed() {
        let cell = |fault, result: &str| Cell {
            kind: "cell".into(),
            design: Design::RedisLock,
            fault,
            result: result.into(),
            replay: None,
            labs_call_it_safe: false,
            unknown: None,
        };
        let cells = [
            cell(FaultKind::Kill, "SAFE (6)"),
            cell(FaultKind::Restart, "UNKNOWN 6/6"),
        ];
        assert_eq!(expected_to_break(&cells, "SAFE"), ["redis-lock × kill"]);
        assert_eq!(
            expected_to_break(&cells, "UNKNOWN"),
            ["redis-lock × restart"]
        );
    }

    #[test]
    fn a_cells_replay_command_prints_on_lines_under_80_columns_and_reads_back_the_same() {
        let schedule: crate::nemesis::schedule::Schedule = serde_json::from_str(
            r#"[{"at_ms":3,"after":{"worker":"C","event":"working","nth":2},"fault":"pause",
                 "target":"C","duration_ms":1368},{"at_ms":864,"fault":"restart","target":"redis"}]"#,
        )
        .unwrap();
        let replay = show::replay_command(Design::RedisLock, 2, &schedule);
        assert!(replay.len() > 80);
        let lines = replay_lines_of(&replay);
        assert!(lines.len() > 2);
        for line in &lines {
            assert!(line.len() + 2 <= 80, "{line}");
        }
        let joined = lines.join("\n");
        let json = joined.split_once('\'').unwrap().1.trim_end_matches('\'');
        let back: crate::nemesis::schedule::Schedule = serde_json::from_str(json).unwrap();
        assert_eq!(back, schedule);
        assert!(lines[0].starts_with("lockslab chaos --design redis-lock --clients 2"));
    }
}
