//! The steps of a schedule that never played in a history, and what that makes of it.
//!
//! A step may not play: its event never came (a pause aimed at a client's fifth read, in a
//! run where it read four times), its time came after the run, its victim had already
//! exited or been killed, or a network fault was put on a path nothing went through again.
//!
//! - A **given** schedule (`--schedule`) is a question about those faults: a play in which
//!   one of them did not happen did not test the schedule asked, so it is unknown, never
//!   safe (a violation found in it is still one).
//! - A **drawn** schedule aims at moments that may not come, by design: its history is
//!   judged on the faults that played, and says which did not. One in which none played
//!   tested no fault at all: unknown, so that no count of safe histories includes it.

use serde::Serialize;

use super::step_words::step_words;
use crate::nemesis::schedule::{Schedule, Step};

/// A step that did not play in a history, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Unplayed {
    /// Its place in the schedule as written (1: the first step).
    pub nth: usize,
    pub step: Step,
    pub why: String,
}

/// Each step of `left` (as the player names it, with why) found at its
/// place in `schedule`; a step written twice takes each of its places once.
pub fn place(schedule: &Schedule, left: Vec<(Step, String)>) -> Vec<Unplayed> {
    let mut taken = vec![false; schedule.steps().len()];
    let mut out: Vec<Unplayed> = left
        .into_iter()
        .filter_map(|(step, why)| {
            let at = (0..taken.len()).find(|&i| !taken[i] && schedule.steps()[i] == step)?;
            taken[at] = true;
            Some(Unplayed {
                nth: at + 1,
                step,
                why,
            })
        })
        .collect();
    out.sort_by_key(|u| u.nth);
    out
}

/// Why a history whose steps did not all play is unknown, if it is: a given schedule's
/// unplayed step, or a drawn one that played none of its `steps`.
pub fn unknown(unplayed: &[Unplayed], steps: usize, given: bool) -> Option<String> {
    let places: Vec<String> = unplayed.iter().map(|u| u.nth.to_string()).collect();
    if given && !unplayed.is_empty() {
        let s = if places.len() == 1 { "" } else { "s" };
        Some(format!(
            "step{s} {} of the given schedule never played: the schedule asked was not tested",
            places.join(", ")
        ))
    } else if !unplayed.is_empty() && unplayed.len() >= steps {
        Some("none of its faults played: a history with no fault tests nothing here".into())
    } else {
        None
    }
}

/// One line per step that did not play: its place, the step, and why.
pub fn lines(unplayed: &[Unplayed]) -> Vec<String> {
    unplayed
        .iter()
        .map(|u| {
            format!(
                "step {} never played ({}): {}",
                u.nth,
                step_words(&u.step),
                u.why
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nemesis::Fault;

    fn kill(target: &str, at_ms: u64) -> Step {
        Step {
            at_ms,
            after: None,
            fault: Fault::Kill,
            target: target.into(),
            duration_ms: None,
        }
    }

    #[test]
    fn an_unplayed_step_is_found_at_its_place_as_written() {
        // Written out of time order, and one step twice: each keeps its own place.
        let schedule: Schedule = serde_json::from_value(serde_json::json!([
            kill("B", 900),
            kill("A", 10),
            kill("B", 900)
        ]))
        .unwrap();
        let placed = place(
            &schedule,
            vec![
                (kill("B", 900), "first".into()),
                (kill("A", 10), "second".into()),
                (kill("B", 900), "third".into()),
                (kill("Z", 1), "not in it".into()),
            ],
        );
        let places: Vec<(usize, &str)> = placed.iter().map(|u| (u.nth, u.why.as_str())).collect();
        assert_eq!(places, vec![(1, "first"), (2, "second"), (3, "third")]);
        assert_eq!(
            lines(&placed[1..2]),
            vec!["step 2 never played (kill A at +10ms): second"]
        );
    }

    /// A given schedule's unplayed step makes its history unknown; a drawn one's only when
    /// none of its faults played.
    #[test]
    fn an_unplayed_step_is_unknown_for_a_given_schedule_and_for_a_drawn_one_with_no_fault() {
        let one = Unplayed {
            nth: 2,
            step: kill("A", 10),
            why: "A had already exited".into(),
        };
        let said = unknown(std::slice::from_ref(&one), 2, true).unwrap();
        assert!(
            said.starts_with("step 2 of the given schedule never played"),
            "{said}"
        );
        let two = [
            Unplayed {
                nth: 1,
                ..one.clone()
            },
            one.clone(),
        ];
        assert!(unknown(&two, 2, true).unwrap().starts_with("steps 1, 2 of"));
        assert_eq!(unknown(&[], 2, true), None);
        assert_eq!(
            unknown(std::slice::from_ref(&one), 2, false),
            None,
            "a drawn step may miss"
        );
        assert!(
            unknown(&two, 2, false)
                .unwrap()
                .starts_with("none of its faults played")
        );
        assert_eq!(unknown(&[], 0, false), None);
    }
}
