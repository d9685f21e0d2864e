//! What a cell of `matrix --json` may say, as `matrix --merge` reads it back: only a result
//! a matrix writes, its counts within the run's schedules a cell, `-` where the fault
//! cannot reach the design, and a replay command under every UNSAFE. A file that says
//! otherwise was edited, or is no matrix's, and a table from it would claim what was never
//! played. And what the cells, read or played, make of the exit status ([`exit_code`]).

use super::table::Cell;
use crate::chaos::reach;
use crate::check::chaos::Violation;
use crate::exit::Exit;

/// Refuses, with why, a cell that a matrix of `schedules` schedules a cell cannot write.
pub(super) fn check(cell: &Cell, schedules: u64) -> Result<(), String> {
    let (design, fault) = (cell.design.name(), cell.fault.name());
    if !written(&cell.result, schedules) {
        return Err(format!(
            "{design} × {fault} reads {:?}, not a result a matrix prints: SAFE (n), UNSAFE \
             <{}>, UNKNOWN u/n (u ≤ n) or -, with n at most its run's {schedules} \
             schedules a cell",
            cell.result,
            Violation::KINDS.join("|")
        ));
    }
    let unreached = reach::unreached_kinds(cell.design, &[cell.fault]);
    if let (false, Some(why)) = (cell.result == "-", unreached.first()) {
        return Err(format!(
            "{design} × {fault} reads {}, but {why} cannot reach it: a matrix prints `-` there",
            cell.result
        ));
    }
    let no_replay = (cell.replay.as_deref()).is_none_or(|replay| replay.trim().is_empty());
    if cell.result.starts_with("UNSAFE ") && no_replay {
        return Err(format!(
            "{design} × {fault} reads {} with no replay command: a matrix writes the one \
             that replays it",
            cell.result
        ));
    }
    Ok(())
}

/// Is `result` exactly as `matrix` writes a cell of at most `schedules` schedules (see
/// `matrix::run`): `SAFE (n)`, `UNSAFE <violation's kind>`, `UNKNOWN u/n` or `-`?
fn written(result: &str, schedules: u64) -> bool {
    // A count as a matrix writes it: no sign, no leading zero, 1 to the schedules a cell.
    let count = |text: &str| {
        (text.parse::<u64>().ok()).filter(|n| n.to_string() == text && (1..=schedules).contains(n))
    };
    if let Some(kind) = result.strip_prefix("UNSAFE ") {
        return Violation::KINDS.contains(&kind);
    }
    if let Some(n) = (result.strip_prefix("SAFE (")).and_then(|r| r.strip_suffix(')')) {
        return count(n).is_some();
    }
    if let Some((u, n)) = (result.strip_prefix("UNKNOWN ")).and_then(|r| r.split_once('/')) {
        return matches!((count(u), count(n)), (Some(u), Some(n)) if u <= n);
    }
    result == "-"
}

/// The matrix's exit status. Only a ✅ design's cells count, under the faults the labs say
/// it survives ([`Design::labs_call_it_safe_under`], not what a merged file says): UNSAFE
/// there is 1, UNKNOWN 3 (never a pass). A ❌ design's cells never count: breaking is the
/// lesson, and a lock-only design's lost-reply, restart-aof and leader-kill cells read
/// UNKNOWN by nature (a release that got no answer), which would make every full matrix
/// exit 3; the footer names them. `strict` counts every cell.
pub fn exit_code(cells: &[Cell], strict: bool) -> Exit {
    let counted = |c: &&Cell| {
        strict || (c.design.labs_call_it_safe() && c.design.labs_call_it_safe_under(c.fault))
    };
    let any = |word: &str| {
        cells
            .iter()
            .filter(counted)
            .any(|c| c.result.starts_with(word))
    };
    if any("UNSAFE") {
        Exit::Violation
    } else if any("UNKNOWN") {
        Exit::Undecided
    } else {
        Exit::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::designs::Design;
    use crate::nemesis::generate::FaultKind;

    fn cell(design: Design, fault: FaultKind, result: &str, replay: Option<&str>) -> Cell {
        Cell {
            kind: "cell".into(),
            design,
            fault,
            result: result.into(),
            replay: replay.map(String::from),
            labs_call_it_safe: design.labs_call_it_safe_under(fault),
            unknown: None,
        }
    }

    #[test]
    fn only_the_results_a_matrix_writes_within_its_schedules_pass() {
        for good in ["SAFE (8)", "SAFE (1)", "UNKNOWN 3/8", "UNKNOWN 8/8", "-"] {
            assert!(written(good, 8), "{good}");
        }
        for kind in Violation::KINDS {
            assert!(written(&format!("UNSAFE {kind}"), 8), "{kind}");
        }
        for bad in [
            "SAFE banana",
            "SAFE (9)",
            "SAFE (0)",
            "SAFE (08)",
            "SAFE (+8)",
            "SAFE 8",
            "SAFE (8) ",
            "UNSAFEXX",
            "UNSAFE",
            "UNSAFE banana",
            "UNSAFE stale-write ",
            "UNKNOWN 9/8",
            "UNKNOWN 4/3",
            "UNKNOWN 0/8",
            "UNKNOWN 3",
            "UNKNOWN 3/8/8",
            "--",
            "",
        ] {
            assert!(!written(bad, 8), "{bad:?}");
        }
    }

    #[test]
    fn a_fault_that_cannot_reach_the_design_reads_dash_and_an_unsafe_cell_its_replay() {
        let no_redis = cell(Design::Optimistic, FaultKind::Restart, "SAFE (8)", None);
        let message = check(&no_redis, 8).unwrap_err();
        assert!(message.contains("optimistic has no Redis"), "{message}");
        assert!(check(&cell(Design::Optimistic, FaultKind::Restart, "-", None), 8).is_ok());
        // `-` where the fault reaches: a given Redis, which chaos does not restart.
        assert!(check(&cell(Design::RedisLock, FaultKind::Restart, "-", None), 8).is_ok());
        let found = "UNSAFE stale-write";
        for replay in [None, Some(""), Some("  ")] {
            let bare = cell(Design::RedisLock, FaultKind::Pause, found, replay);
            let message = check(&bare, 8).unwrap_err();
            assert!(message.contains("no replay command"), "{message}");
        }
        let replayed = Some("lockslab chaos --design redis-lock --schedule '[]'");
        let whole = cell(Design::RedisLock, FaultKind::Pause, found, replayed);
        assert!(check(&whole, 8).is_ok());
    }
}
