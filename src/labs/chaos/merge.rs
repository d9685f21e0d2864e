//! `lockslab matrix --merge`: one table from the `--json` of several runs — the parts of a
//! `--shard`ed matrix, or runs of different columns — checked to be whole first. A part
//! that did not finish, a part of a split that is missing, or a cell that reads two ways
//! would print a table that claims more than was played.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;

use super::matrix::{Shard, exit_code, parse_shard};
use super::table::{Cell, footer, header, in_table_order, notes, row_line};
use crate::exit::UsageError;
use crate::nemesis::generate::FaultKind;
use crate::output::count;
use crate::worker::chaos_client::Design;

/// What a run's verdict line says of the cells before it.
#[derive(Clone, Debug, PartialEq)]
struct Part {
    seed: u64,
    schedules: u64,
    shard: Shard,
}

/// One `--json` file: its cells, and the verdict of each run in it.
fn read(file: &Path) -> Result<(Vec<Cell>, Vec<Part>)> {
    let at = |n: usize, err: &dyn std::fmt::Display| {
        UsageError(format!("--merge {}:{}: {err}", file.display(), n + 1))
    };
    let text = std::fs::read_to_string(file)
        .map_err(|err| UsageError(format!("--merge {}: {err}", file.display())))?;
    let (mut cells, mut parts) = (Vec::new(), Vec::new());
    for (n, line) in text.lines().enumerate() {
        let value: serde_json::Value = serde_json::from_str(line).map_err(|err| at(n, &err))?;
        if value["kind"] == "cell" {
            cells.push(serde_json::from_value(value).map_err(|err| at(n, &err))?);
        } else if value["kind"] == "verdict" && value["lab"] == "matrix" {
            let shard = value["shard"].as_str().unwrap_or("1/1");
            parts.push(Part {
                seed: value["seed"].as_u64().unwrap_or_default(),
                schedules: value["schedules_per_cell"].as_u64().unwrap_or_default(),
                shard: parse_shard(shard).map_err(|err| at(n, &err))?,
            });
        }
    }
    if !cells.is_empty() && parts.is_empty() {
        return Err(UsageError(format!(
            "--merge {}: its cells have no verdict line after them: that run did not \
             finish (Ctrl-C, or an error), and its last cells are missing; play it again",
            file.display()
        ))
        .into());
    }
    Ok((cells, parts))
}

/// Refuses a split (`--shard K/N` runs of one seed) with a part missing: its cells would
/// be absent from the table, with nothing to say so.
fn every_part_present(parts: &[Part]) -> Result<()> {
    let mut splits: BTreeMap<(u32, u64, u64), BTreeSet<u32>> = BTreeMap::new();
    for part in parts.iter().filter(|p| p.shard.n > 1) {
        (splits
            .entry((part.shard.n, part.seed, part.schedules))
            .or_default())
        .insert(part.shard.k);
    }
    for ((n, seed, schedules), here) in splits {
        let missing: Vec<String> = (1..=n)
            .filter(|k| !here.contains(k))
            .map(|k| format!("{k}/{n}"))
            .collect();
        if let Some(first) = missing.first() {
            crate::bail_usage!(
                "--merge: the matrix split in {n} parts (seed {seed}, {schedules} a cell) lacks \
                 part {}: pass its --json file too, or play it (lockslab matrix --shard {first} \
                 --seed {seed} --schedules {schedules} --json); parts of one split must share \
                 the seed",
                missing.join(", ")
            );
        }
    }
    Ok(())
}

/// `--merge`: the cells of several `--json` runs, as one table.
pub(super) fn merge(files: &[PathBuf]) -> Result<ExitCode> {
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
    Ok(ExitCode::from(exit_code(&cells)))
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
        let err = merge(files).unwrap_err();
        for file in files {
            let _ = std::fs::remove_file(file);
        }
        assert!(err.downcast_ref::<UsageError>().is_some(), "{err:#}");
        format!("{err:#}")
    }

    #[test]
    fn a_merge_of_no_cell_or_of_a_run_that_did_not_finish_is_refused() {
        let empty = file_of("empty", &[verdict(1, "1/1")]);
        assert!(refusal(&[empty]).contains("no cell"));
        let cut_short = file_of("cut", &[cell("redis-lock", "pause")]);
        assert!(refusal(&[cut_short]).contains("did not finish"));
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

    #[test]
    fn a_whole_split_and_runs_of_other_columns_merge() {
        let one = file_of("whole-1", &[cell("redis-lock", "pause"), verdict(1, "1/2")]);
        let two = file_of("whole-2", &[cell("redis-lock", "kill"), verdict(1, "2/2")]);
        let other = file_of(
            "whole-3",
            &[cell("redis-lock", "failover"), verdict(7, "1/1")],
        );
        let files = [one, two, other];
        let merged = merge(&files);
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
            })
            .collect();
        assert_eq!(played_as(&parts), "seeds 1 and 7, 8 schedules a cell");
        assert_eq!(played_as(&parts[..1]), "seed 1, 8 schedules a cell");
    }
}
