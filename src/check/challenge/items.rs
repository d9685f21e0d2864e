//! The items half of a challenge's grade. Every job appends an entry of its own (`j7`) to
//! its record's items, so what a lost update or a doubled effect did shows in the data
//! itself — an entry erased, an entry twice — not only in the log's arithmetic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Change, Final, JobSpec};

/// What `change` did to its record's items where that is not the items before with
/// `append` at the end: the entries before that it dropped (erased), and those after that
/// were not before (added). None: the items are as the job meant.
pub(super) fn fault(change: &Change, append: &str) -> Option<(Vec<String>, Vec<String>)> {
    let (old, new) = (&change.old_items, &change.new_items);
    let meant = new.len() == old.len() + 1
        && new.starts_with(old)
        && new.last().is_some_and(|last| last == append);
    (!meant).then(|| (minus(old, new), minus(new, old)))
}

/// The entries of `a` that `b` does not match, each as many times as `a` holds it more
/// often than `b` (in `a`'s order).
fn minus(a: &[String], b: &[String]) -> Vec<String> {
    let mut left: BTreeMap<&str, usize> = BTreeMap::new();
    for entry in b {
        *left.entry(entry).or_default() += 1;
    }
    a.iter()
        .filter(|entry| match left.get_mut(entry.as_str()) {
            Some(n) if *n > 0 => {
                *n -= 1;
                false
            }
            _ => true,
        })
        .cloned()
        .collect()
}

/// What a stale write did to `whose` items, as a verb phrase ("erased j1, j4 from r0's
/// items"); empty when neither an entry was dropped nor a wrong one added (the items were
/// only reordered, or were right: the caller knows which).
pub(super) fn fault_words(
    append: &str,
    erased: &[String],
    added: &[String],
    whose: &str,
) -> String {
    if !erased.is_empty() {
        format!("erased {} from {whose}", erased.join(", "))
    } else if added.is_empty() {
        format!("did not append {append} to {whose}")
    } else if added != [append] {
        format!(
            "added {} to {whose}, where it appends {append}",
            added.join(", ")
        )
    } else {
        String::new()
    }
}

/// Items as the findings print them: `[j1, j4]`.
pub(super) fn list(items: &[String]) -> String {
    format!("[{}]", items.join(", "))
}

/// How many times `record`'s final items hold `entry`.
pub(super) fn held(finals: &[Final], record: &str, entry: &str) -> usize {
    finals
        .iter()
        .filter(|f| f.record == record)
        .flat_map(|f| &f.items)
        .filter(|item| *item == entry)
        .count()
}

/// A doubled effect in words: the log's count and the items' count.
pub(super) fn doubled_words(
    job: i64,
    times: usize,
    record: &str,
    append: &str,
    in_items: usize,
) -> String {
    let changed = format!("job {job} changed its record {times} times");
    if append.is_empty() {
        // A verdict recorded before jobs appended.
        return format!("doubled effect: {changed}");
    }
    let held = match in_items {
        0 => format!("{record}'s items do not hold {append}"),
        1 => format!("{record}'s items hold {append} once"),
        n => format!("{record}'s items hold {append} {n} times"),
    };
    match times {
        0 => format!("doubled effect: {held}, and no change of job {job} is in the log"),
        1 => format!("doubled effect: {held}, though job {job} changed it once"),
        _ => format!("doubled effect: {changed}; {held}"),
    }
}

/// An acknowledged job whose entry is not in its record's final items, and where in the
/// log it went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gone {
    pub record: String,
    pub entry: String,
    /// The last change of the record whose items before held the entry and after did not.
    pub erased_by: Option<i64>,
    /// The last change of the record whose items after held it (none: no change put it
    /// there).
    pub last_held: Option<i64>,
}

impl Gone {
    /// Where `job`'s entry went, read from the log (`changes` in its order).
    pub(super) fn of(job: &JobSpec, changes: &[Change]) -> Gone {
        let entry = job.append.as_str();
        let mut gone = Gone {
            record: job.record.clone(),
            entry: entry.to_string(),
            erased_by: None,
            last_held: None,
        };
        for change in changes.iter().filter(|c| c.record == job.record) {
            let holds = |items: &[String]| items.iter().any(|item| item == entry);
            if holds(&change.new_items) {
                gone.last_held = Some(change.seq);
            } else if holds(&change.old_items) {
                gone.erased_by = Some(change.seq);
            }
        }
        gone
    }

    pub(super) fn describe(&self, job: i64) -> String {
        let Gone { record, entry, .. } = self;
        let how = match (self.erased_by, self.last_held) {
            (Some(seq), held) if held.is_none_or(|held| held < seq) => {
                format!("change #{seq} erased it")
            }
            (_, Some(seq)) => format!(
                "the log still holds it after change #{seq}: the record changed outside the log"
            ),
            (_, None) => format!("no change of {record} put it there"),
        };
        format!(
            "lost: job {job} was answered ok, and {record}'s final items lack its {entry}: {how}"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{change, clean_run, evidence};
    use super::super::{Grade, check};
    use super::fault_words;

    fn items(entries: &[&str]) -> Vec<String> {
        entries.iter().map(|e| e.to_string()).collect()
    }

    fn kinds(run: &super::super::Evidence) -> Vec<&'static str> {
        check(run).problems.iter().map(|p| p.kind()).collect()
    }

    /// Job 2 added its 5 right (the value was read in the write), but wrote the items it
    /// had read before job 1's: j1 is gone from the data, though the values add up.
    #[test]
    fn items_written_from_a_stale_read_are_a_stale_write_that_names_what_it_erased() {
        let mut run = clean_run();
        assert_eq!(check(&run).grade(), Grade::Pass);
        run.changes[1].new_items = items(&["j2"]);
        run.finals[0].items = items(&["j2"]);
        assert_eq!(kinds(&run), vec!["stale-write", "lost"]);
        let report = check(&run);
        assert_eq!(report.good_changes, 2);
        assert_eq!(
            report.problems[0].describe(),
            "stale write: job 2 erased j1 from r0's items (change #2)"
        );
        assert_eq!(
            report.problems[1].describe(),
            "lost: job 1 was answered ok, and r0's final items lack its j1: change #2 \
             erased it"
        );
        let json = serde_json::to_value(&report.problems[0]).unwrap();
        assert_eq!(
            (json["append"].as_str(), json["erased"][0].as_str()),
            (Some("j2"), Some("j1"))
        );
        // Its value stale too: one finding for the change, with both.
        run.changes[1].new_value = 5;
        run.finals[0].value = 5;
        let line = check(&run).problems[0].describe();
        assert!(
            line.contains("computed from a read of 0")
                && line.ends_with("; it erased j1 from the items"),
            "{line}"
        );
    }

    /// A write that leaves the items alone (a client of the protocol before `append`).
    #[test]
    fn a_write_that_does_not_append_its_entry_is_a_stale_write_and_its_job_lost() {
        let mut run = clean_run();
        run.changes[2].new_items = vec![];
        run.finals[1].items = vec![];
        assert_eq!(kinds(&run), vec!["stale-write", "lost"]);
        let report = check(&run);
        assert_eq!(
            report.problems[0].describe(),
            "stale write: job 3 did not append j3 to r1's items (change #3)"
        );
        assert!(
            report.problems[1]
                .describe()
                .ends_with("no change of r1 put it there"),
            "{report:?}"
        );
    }

    /// Job 2's write put j1 in again: j1 twice in r0's items, though job 1 changed r0 once.
    #[test]
    fn an_entry_put_first_says_so() {
        let mut run = clean_run();
        run.changes[1].new_items = items(&["j2", "j1"]);
        run.finals[0].items = items(&["j2", "j1"]);
        assert_eq!(
            check(&run).problems[0].describe(),
            "stale write: job 2 put j2 elsewhere than at the end of r0's items (change #2)"
        );
        assert_eq!(
            fault_words("j2", &[], &[], "r0's items"),
            "did not append j2 to r0's items"
        );
    }

    #[test]
    fn an_entry_twice_in_the_final_items_is_doubled() {
        let mut run = clean_run();
        run.changes[1].new_items = items(&["j1", "j1", "j2"]);
        run.finals[0].items = items(&["j1", "j1", "j2"]);
        assert_eq!(kinds(&run), vec!["stale-write", "doubled"]);
        let report = check(&run);
        assert_eq!(
            report.problems[0].describe(),
            "stale write: job 2 added j1, j2 to r0's items, where it appends j2 (change #2)"
        );
        assert_eq!(
            report.problems[1].describe(),
            "doubled effect: r0's items hold j1 2 times, though job 1 changed it once"
        );
        assert!(report.problems[1].names_change(Some(1), Some(1)));
        // A job whose change is in the log twice: both counts said.
        let twice = evidence(
            vec![
                change(1, "r0", Some(1), 0, 3),
                change(2, "r0", Some(1), 3, 6),
                change(3, "r0", Some(2), 6, 11),
                change(4, "r1", Some(3), 0, 2),
            ],
            &[1, 2, 3],
            &[("r0", 11), ("r1", 2)],
        );
        assert_eq!(kinds(&twice), vec!["doubled"]);
        assert_eq!(
            check(&twice).problems[0].describe(),
            "doubled effect: job 1 changed its record 2 times; r0's items hold j1 2 times"
        );
    }

    #[test]
    fn final_items_the_log_does_not_end_at_disagree_with_it() {
        let mut run = clean_run();
        run.finals[0].items.push("x".into());
        assert_eq!(kinds(&run), vec!["log-disagrees"]);
        assert_eq!(
            check(&run).problems[0].describe(),
            "r0's items are [j1, j2, x], its log ends at [j1, j2]: they changed outside the log"
        );
        // An entry erased outside the log: its job is lost, and the log still holds it.
        run.finals[0].items = items(&["j2"]);
        assert_eq!(kinds(&run), vec!["lost", "log-disagrees"]);
        assert!(check(&run).problems[0].describe().ends_with(
            "the log still holds it after change #2: the record changed outside the log"
        ));
    }
}
