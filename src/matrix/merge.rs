//! `lockslab matrix --merge`: one table from the `--json` of several runs — the parts of a
//! `--shard`ed matrix, or runs of different columns — checked to be whole first. A part
//! that did not finish, a part of a split that is missing, or a cell that reads two ways
//! would print a table that claims more than was played.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Result;

use super::cells::exit_code;
use super::table::{Cell, footer, header, in_table_order, notes, row_line};
use crate::chaos::shard::{Shard, parse_shard};
use crate::designs::Design;
use crate::exit::UsageError;
use crate::nemesis::generate::FaultKind;
use crate::output::count;

/// What a run's verdict line says of the cells before it.
#[derive(Clone, Debug, PartialEq)]
struct Part {
    seed: u64,
    schedules: u64,
    shard: Shard,
    /// The cells the part played (None in a file from before they were recorded).
    cells: Option<u64>,
    /// The rows, columns and clients asked for: the parts of one split asked the same
    /// (`null null null` in a file from before they were recorded).
    asked: String,
}

/// A `--json` file is at most this big: a whole matrix's is a few tens of kilobytes. A
/// pipe or a device is held to it as it is read (it says it holds 0 bytes).
const LARGEST_FILE: u64 = 64 << 20;

/// One `--json` file: its cells, and the verdict of each run in it. Refused: a file that is
/// no matrix's `--json`, a verdict that lacks what it must say, a cell a matrix of the
/// verdict's schedules a cell cannot write ([`super::cells::check`]), a part with fewer or
/// more cells than its verdict says it played, and cells after the last verdict (a run that
/// did not finish).
fn read(file: &Path) -> Result<(Vec<Cell>, Vec<Part>)> {
    let at = |n: usize, err: &dyn std::fmt::Display| {
        UsageError(format!("--merge {}:{}: {err}", file.display(), n + 1))
    };
    let text = match crate::chaos::given::read_small_file(file, LARGEST_FILE) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::FileTooLarge => crate::bail_usage!(
            "--merge {}: more than any matrix's --json (at most {} MiB)",
            file.display(),
            LARGEST_FILE >> 20
        ),
        Err(err) => crate::bail_usage!("--merge {}: {err}", file.display()),
    };
    let (mut cells, mut parts) = (Vec::new(), Vec::new());
    // The cells since the last verdict, with their line: the verdict after them says the
    // schedules a cell they are held to, and how many there are.
    let mut since_verdict: Vec<(usize, Cell)> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: serde_json::Value = serde_json::from_str(line).map_err(|err| at(n, &err))?;
        if value["kind"] == "cell" {
            let cell: Cell = serde_json::from_value(value).map_err(|err| at(n, &err))?;
            since_verdict.push((n, cell));
        } else if value["kind"] == "verdict" && value["lab"] == "matrix" {
            let part = part_of(&value).map_err(|err| at(n, &err))?;
            for (n, cell) in &since_verdict {
                super::cells::check(cell, part.schedules).map_err(|err| at(*n, &err))?;
            }
            // A verdict from before `cells` was recorded: its count cannot be checked.
            if let Some(played) = part.cells
                && played != since_verdict.len() as u64
            {
                let why = format!(
                    "the verdict says its part played {}, and {} before it: \
                     the file lacks some of its cells (cut, or edited); play that part again",
                    count(played, "cell", "cells"),
                    since_verdict.len()
                );
                return Err(at(n, &why).into());
            }
            cells.extend(since_verdict.drain(..).map(|(_, cell)| cell));
            parts.push(part);
        }
    }
    if !since_verdict.is_empty() {
        crate::bail_usage!(
            "--merge {}: its last {} have no verdict line after them: that run did not \
             finish (Ctrl-C, or an error), and its last cells are missing; play it again",
            file.display(),
            count(since_verdict.len() as u64, "cell", "cells")
        );
    }
    if cells.is_empty() && parts.is_empty() {
        crate::bail_usage!(
            "--merge {}: no matrix cell and no matrix verdict in it: pass the --json output \
             of `lockslab matrix` (chaos's --json has schedules, not cells)",
            file.display()
        );
    }
    Ok((cells, parts))
}

/// A matrix verdict's seed, schedules, part and what was asked; each must be there.
fn part_of(verdict: &serde_json::Value) -> Result<Part, String> {
    let number = |field: &str| {
        verdict[field]
            .as_u64()
            .ok_or_else(|| format!("the verdict has no number `{field}`"))
    };
    let shard = verdict["shard"]
        .as_str()
        .ok_or("the verdict has no `shard` (\"K/N\")")?;
    Ok(Part {
        seed: number("seed")?,
        schedules: number("schedules_per_cell")?,
        shard: parse_shard(shard)?,
        cells: match &verdict["cells"] {
            serde_json::Value::Null => None,
            cells => Some(
                cells
                    .as_u64()
                    .ok_or("the verdict's `cells` is not a number")?,
            ),
        },
        asked: [&verdict["designs"], &verdict["faults"], &verdict["clients"]]
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join(" "),
    })
}

/// Refuses a split (`--shard K/N` runs of one seed) with a part missing: its cells would
/// be absent from the table, with nothing to say so.
fn every_part_present(parts: &[Part]) -> Result<()> {
    type Split<'a> = (u32, u64, u64, &'a str);
    let mut splits: BTreeMap<Split, BTreeSet<u32>> = BTreeMap::new();
    for part in parts.iter().filter(|p| p.shard.n > 1) {
        let split = (part.shard.n, part.seed, part.schedules, part.asked.as_str());
        splits.entry(split).or_default().insert(part.shard.k);
    }
    for ((n, seed, schedules, _), here) in splits {
        // The first few only: a file may claim a split in 4294967295 parts.
        const NAMED: usize = 5;
        let mut missing: Vec<String> = (1..=n)
            .filter(|k| !here.contains(k))
            .take(NAMED)
            .map(|k| format!("{k}/{n}"))
            .collect();
        let Some(first) = missing.first().cloned() else {
            continue;
        };
        let lacking = u64::from(n) - here.len() as u64;
        if lacking > NAMED as u64 {
            missing.push(format!("… ({lacking} in all)"));
        }
        crate::bail_usage!(
            "--merge: the matrix split in {n} parts (seed {seed}, {schedules} a cell) lacks \
             part {}: pass its --json file too, or play it (lockslab matrix --shard {first} \
             --seed {seed} --schedules {schedules} --json); parts of one split share the \
             seed, the designs, the faults and the clients",
            missing.join(", ")
        );
    }
    Ok(())
}

/// `--merge`: the cells of several `--json` runs, as one table.
pub(super) fn merge(files: &[PathBuf], strict: bool) -> Result<crate::exit::Exit> {
    let mut cells: Vec<Cell> = Vec::new();
    let mut parts: Vec<Part> = Vec::new();
    for file in files {
        let (file_cells, file_parts) = read(file)?;
        for cell in file_cells {
            // A cell twice (a shard run again) must say the same both times: keeping
            // either would hide the other, and an UNSAFE one is never hidden.
            let same = |c: &&Cell| (c.design, c.fault) == (cell.design, cell.fault);
            match cells.iter().find(same) {
                Some(seen) if seen.result != cell.result => crate::bail_usage!(
                    "--merge {}: {} × {} reads {} here and {} in an earlier file: merge \
                     the parts of one run (each cell once)",
                    file.display(),
                    cell.design.name(),
                    cell.fault.name(),
                    cell.result,
                    seen.result
                ),
                Some(_) => {}
                None => cells.push(cell),
            }
        }
        parts.extend(file_parts);
    }
    if cells.is_empty() {
        crate::bail_usage!(
            "--merge: no cell in {} (a cell is a line with \"kind\": \"cell\" of \
             `lockslab matrix --json`; pass the --json output of each --shard part)",
            files
                .iter()
                .map(|f| f.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    every_part_present(&parts)?;
    let mut designs: Vec<Design> = cells.iter().map(|c| c.design).collect();
    designs.sort_by_key(|d| Design::ALL.iter().position(|a| a == d));
    designs.dedup();
    let mut kinds: Vec<FaultKind> = cells.iter().map(|c| c.fault).collect();
    in_table_order(&mut kinds);
    crate::prose!(
        "Matrix merged from {} ({}): {}.",
        count(files.len() as u64, "file", "files"),
        played_as(&parts),
        count(cells.len() as u64, "cell", "cells")
    );
    header(&kinds);
    cells.sort_by_key(|c| {
        (
            Design::ALL.iter().position(|d| *d == c.design),
            kinds.iter().position(|k| *k == c.fault),
        )
    });
    for design in &designs {
        let row: Vec<Cell> = (cells.iter().filter(|c| c.design == *design).cloned()).collect();
        crate::outln!("{}", row_line(*design, &kinds, &row, &notes(&cells)));
    }
    footer(&cells, false);
    Ok(exit_code(&cells, strict))
}

/// "seed 1, 8 schedules a cell", or "seeds 1 and 7, 8 and 12 schedules a cell".
fn played_as(parts: &[Part]) -> String {
    let listed = |mut values: Vec<u64>| {
        values.sort_unstable();
        values.dedup();
        let words: Vec<String> = values.iter().map(u64::to_string).collect();
        match words.split_last() {
            Some((last, rest)) if !rest.is_empty() => (rest.join(", ") + " and " + last, true),
            _ => (words.concat(), false),
        }
    };
    let (seeds, several) = listed(parts.iter().map(|p| p.seed).collect());
    let (schedules, _) = listed(parts.iter().map(|p| p.schedules).collect());
    let seed_word = if several { "seeds" } else { "seed" };
    format!("{seed_word} {seeds}, {schedules} schedules a cell")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(name: &str, lines: &[String]) -> PathBuf {
        let file =
            std::env::temp_dir().join(format!("lockslab-merge-{name}-{}", std::process::id()));
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        file
    }

    fn cell(design: &str, fault: &str) -> String {
        format!(
            r#"{{"kind": "cell", "design": "{design}", "fault": "{fault}", "result": "SAFE (8)", "replay": null, "labs_call_it_safe": true}}"#
        )
    }

    fn verdict(seed: u64, shard: &str) -> String {
        format!(
            r#"{{"kind": "verdict", "lab": "matrix", "seed": {seed}, "schedules_per_cell": 8, "shard": "{shard}"}}"#
        )
    }

    fn refusal(files: &[PathBuf]) -> String {
        let err = merge(files, false).unwrap_err();
        for file in files {
            let _ = std::fs::remove_file(file);
        }
        assert!(err.downcast_ref::<UsageError>().is_some(), "{err:#}");
        format!("{err:#}")
    }

    /// /dev/zero says it holds 0 bytes and never ends: refused at the limit, not read until
    /// the memory is full.
    #[test]
    fn a_file_that_never_ends_is_refused_at_the_limit() {
        // Not `refusal`, which removes its files.
        let err = merge(&[PathBuf::from("/dev/zero")], false).unwrap_err();
        assert!(err.downcast_ref::<UsageError>().is_some(), "{err:#}");
        assert!(format!("{err}").contains("at most 64 MiB"), "{err}");
    }

    #[test]
    fn a_merge_of_no_cell_or_of_a_run_that_did_not_finish_is_refused() {
        let empty = file_of("empty", &[verdict(1, "1/1")]);
        assert!(refusal(&[empty]).contains("no cell"));
        let cut_short = file_of("cut", &[cell("redis-lock", "pause")]);
        assert!(refusal(&[cut_short]).contains("did not finish"));
    }

    #[test]
    fn cells_after_the_last_verdict_a_chaos_file_and_a_verdict_that_lacks_its_seed_are_refused() {
        let cells_after = file_of(
            "after",
            &[
                cell("redis-lock", "pause"),
                verdict(1, "1/1"),
                cell("redis-lock", "kill"),
            ],
        );
        assert!(refusal(&[cells_after]).contains("its last 1 cell have no verdict"));
        let chaos = file_of("chaos", &[r#"{"kind": "verdict", "lab": "chaos"}"#.into()]);
        assert!(refusal(&[chaos]).contains("no matrix cell and no matrix verdict"));
        let no_seed = file_of(
            "no-seed",
            &[
                cell("redis-lock", "pause"),
                verdict(1, "1/1").replace("\"seed\": 1, ", ""),
            ],
        );
        assert!(refusal(&[no_seed]).contains("no number `seed`"));
        let banana = file_of(
            "banana",
            &[
                cell("redis-lock", "pause").replace("SAFE (8)", "banana"),
                verdict(1, "1/1"),
            ],
        );
        assert!(refusal(&[banana]).contains("not a result a matrix prints"));
    }

    /// A cell is held to the schedules a cell of the verdict after it, and a part to the
    /// count of cells its verdict says it played (none said: a file from before it was).
    #[test]
    fn a_cell_past_its_schedules_or_a_part_short_of_its_cells_is_refused() {
        let nine = file_of(
            "nine",
            &[
                cell("redis-lock", "pause").replace("SAFE (8)", "SAFE (9)"),
                verdict(1, "1/1"),
            ],
        );
        let message = refusal(&[nine]);
        assert!(
            message.contains("at most its run's 8 schedules"),
            "{message}"
        );
        let counted =
            |cells: u64| verdict(1, "1/1").replace("{", &format!("{{\"cells\": {cells}, "));
        let bare = file_of("bare", &[counted(2)]);
        let message = refusal(&[bare]);
        assert!(
            message.contains("played 2 cells, and 0 before it"),
            "{message}"
        );
        let short = file_of("short", &[cell("redis-lock", "pause"), counted(2)]);
        let message = refusal(&[short]);
        assert!(
            message.contains("played 2 cells, and 1 before it"),
            "{message}"
        );
        let whole = file_of(
            "whole",
            &[
                cell("redis-lock", "pause"),
                cell("redis-lock", "kill"),
                counted(2),
            ],
        );
        let merged = merge(std::slice::from_ref(&whole), false);
        std::fs::remove_file(&whole).unwrap();
        assert!(merged.is_ok(), "{merged:?}");
    }

    /// Two runs that asked for other rows are not two parts of one split, whatever their
    /// --shard says: together they would leave cells out with nothing to say so.
    #[test]
    fn parts_of_runs_that_asked_for_other_designs_are_not_one_split() {
        let asked = |design: &str, shard: &str| {
            verdict(1, shard).replace("{", &format!("{{\"designs\": [\"{design}\"], "))
        };
        let one = file_of(
            "asked-1",
            &[cell("optimistic", "kill"), asked("optimistic", "1/2")],
        );
        let two = file_of(
            "asked-2",
            &[cell("redis-lock", "pause"), asked("redis-lock", "2/2")],
        );
        let message = refusal(&[one, two]);
        assert!(message.contains("lacks part"), "{message}");
    }

    #[test]
    fn a_split_with_a_part_missing_or_from_another_seed_is_refused() {
        let one = file_of("one", &[cell("redis-lock", "pause"), verdict(1, "1/3")]);
        let three = file_of("three", &[cell("redis-lock", "delay"), verdict(1, "3/3")]);
        let message = refusal(&[one, three]);
        assert!(message.contains("lacks part 2/3"), "{message}");
        let one = file_of("one-b", &[cell("redis-lock", "pause"), verdict(1, "1/2")]);
        let two = file_of("two-b", &[cell("redis-lock", "kill"), verdict(7, "2/2")]);
        let message = refusal(&[one, two]);
        assert!(
            message.contains("seed 1") && message.contains("2/2"),
            "{message}"
        );
    }

    /// A verdict may claim any split: its missing parts are named a few, not all listed.
    #[test]
    fn a_split_claimed_in_four_billion_parts_names_a_few_missing() {
        let huge = file_of(
            "huge",
            &[cell("redis-lock", "pause"), verdict(1, "1/4294967295")],
        );
        let message = refusal(&[huge]);
        assert!(
            message.contains("lacks part 2/4294967295, 3/4294967295")
                && message.contains("… (4294967294 in all)"),
            "{message}"
        );
    }

    #[test]
    fn a_whole_split_and_runs_of_other_columns_merge() {
        let one = file_of("whole-1", &[cell("redis-lock", "pause"), verdict(1, "1/2")]);
        let two = file_of("whole-2", &[cell("redis-lock", "kill"), verdict(1, "2/2")]);
        let other = file_of(
            "whole-3",
            &[cell("redis-lock", "failover"), verdict(7, "1/1")],
        );
        let files = [one, two, other];
        let merged = merge(&files, false);
        for file in &files {
            std::fs::remove_file(file).unwrap();
        }
        assert!(merged.is_ok(), "{merged:?}");
        let parts: Vec<Part> = [1, 7, 7]
            .iter()
            .map(|seed| Part {
                seed: *seed,
                schedules: 8,
                shard: Shard { k: 1, n: 1 },
                cells: None,
                asked: String::new(),
            })
            .collect();
        assert_eq!(played_as(&parts), "seeds 1 and 7, 8 schedules a cell");
        assert_eq!(played_as(&parts[..1]), "seed 1, 8 schedules a cell");
    }
}
