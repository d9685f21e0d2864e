//! Lab 9's verdict: the matrix of guards against faults, each cell decided by
//! [`crate::check::lease_guard`] from Redis's answers and the store's record, and the
//! sentences that follow from the same cells.

use anyhow::{Context, Result, anyhow, bail};
use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{LeaseFault, Plan};
use crate::check::lease_guard::{self as checks, Evidence, Found, Outcome};
use crate::check::report::{self, Report};
use crate::check::{Finding, LateWrite};
use crate::events::facts::GuardDecided;
use crate::events::{Event, Kind, What};
use crate::labs::Conclusion;
use crate::labs::replay::{self, Replayed};
use crate::labs::runner;
use crate::labs::words::Words;
use crate::lock::lease_guard::Guard;
use crate::lock::redis::Release;
use crate::output::human;
use crate::store::{Attempt, ReadBack};
use crate::worker::holder::release_of;

/// Below this, the time B was kept out is B's polling, not a guard's cost.
const IDLE_WORTH_SAYING_MS: u64 = 100;

pub struct Verdict {
    pub cells: Vec<CellVerdict>,
    pub(crate) plan: Plan,
}

/// One cell: a guard against a fault. Every field comes from a backend's answer or the
/// store's record, except what the guard believed (`believed_left_ms`), which is A's.
#[derive(Serialize, Debug, Clone)]
pub struct CellVerdict {
    pub fault: LeaseFault,
    pub guard: Guard,
    pub outcome: Outcome,
    /// A's write in the store's decision order against B's accepted one.
    pub late_write: LateWrite,
    /// Redis granted B the lock while A still believed it held it; null when the answers
    /// cannot order it.
    pub two_holders: Option<bool>,
    /// The guard let A write.
    pub guard_wrote: bool,
    /// What the guard believed was left of the lease (ms); null for a guard that does not
    /// count.
    pub believed_left_ms: Option<i64>,
    /// Redis, just after the decision: the key still A's, and its PTTL.
    pub key_ours_at_check: Option<bool>,
    pub pttl_at_check_ms: Option<i64>,
    /// The guard gave up work that was safe: Redis still had A's key with time left.
    pub needless_abort: Option<bool>,
    /// The window the stale write went through: from the check to the write (A's clock).
    pub window_ms: Option<u64>,
    /// How long A was stopped in all (the pause faults and the stall).
    pub paused_ms: Option<u64>,
    /// The stall: how many times the nemesis stopped A, and the longest stop.
    pub stops: Option<u64>,
    pub longest_stop_ms: Option<u64>,
    /// A cost: how long the lock stood unavailable between the end of A's lease and B's
    /// grant ([`crate::check::lease_guard::unavailable_ms`]); null when unknown.
    pub unavailable_ms: Option<u64>,
    /// The widest gap pause detection saw between two clock samples (pause-detect only).
    pub gap_ms: Option<u64>,
    /// How far A's wall clock had moved against its monotonic clock since the grant, at
    /// the decision (A's own measure of a clock fault; negative: behind).
    pub wall_skew_ms: Option<i64>,
    pub final_writer: Option<String>,
    pub attempts: Vec<Attempt>,
}

/// What decides a cell, read from its history: A's guard's decision, the store's record,
/// what A's release found, and the checkers' findings from them. The verdict's table
/// ([`CellVerdict::from_history`]) and the report ([`check`]) both start here.
struct Judged {
    decision: GuardDecided,
    read: ReadBack,
    a_release: Release,
    found: Found,
}

fn judged(log: &[Event]) -> Result<Judged> {
    let saw = |worker: &str, kind: Kind| log.iter().find(|e| e.is(worker, kind));
    let decision: GuardDecided = match saw("A", Kind::GuardDecided).map(|e| &e.what) {
        Some(What::GuardDecided(decided)) => decided.clone(),
        _ => bail!("A never reported its guard's decision"),
    };
    let read = replay::read_back(log)?;
    let a_release = saw("A", Kind::Released)
        .and_then(release_of)
        .context("A's release did not say what Redis found")?;
    let b_release = saw("B", Kind::Released).and_then(release_of);
    let b_owner = saw("B", Kind::Acquired).and_then(|e| e.owner());
    let a_after_check_ms = match saw("A", Kind::Wrote).map(|e| &e.what) {
        Some(What::Wrote(wrote)) => wrote.after_check_ms,
        _ => None,
    };
    let found = checks::judge(&Evidence {
        decision: decision.decided(),
        a_release: &a_release,
        b_owner,
        b_release: b_release.as_ref(),
        a_after_check_ms,
        attempts: &read.attempts,
        final_writer: read.final_writer.as_deref(),
    })
    .map_err(|_| {
        anyhow!(
            "the store's record disagrees with itself: its final writer is not its last \
             accepted attempt"
        )
    })?;
    Ok(Judged {
        decision,
        read,
        a_release,
        found,
    })
}

impl CellVerdict {
    pub fn new(
        fault: LeaseFault,
        guard: Guard,
        decision: &GuardDecided,
        found: Found,
        paused_ms: Option<u64>,
        read: ReadBack,
    ) -> CellVerdict {
        CellVerdict {
            fault,
            guard,
            outcome: found.outcome,
            late_write: found.late_write,
            two_holders: found.two_holders.as_option(),
            guard_wrote: decision.write,
            believed_left_ms: decision.believed_left_ms,
            key_ours_at_check: decision.key_ours,
            pttl_at_check_ms: decision.pttl_ms,
            needless_abort: match found.needless_abort {
                Finding::Unknown => None,
                other => other.as_option(),
            },
            window_ms: found.window_ms,
            paused_ms,
            stops: None,
            longest_stop_ms: None,
            unavailable_ms: None,
            gap_ms: decision.gap_ms,
            wall_skew_ms: decision.wall_skew_ms,
            final_writer: read.final_writer,
            attempts: read.attempts,
        }
    }

    /// Judges one cell from its history: A's guard's decision, what Redis answered each
    /// release, the nemesis's stops, and the store's read-back in it. The live run and
    /// `lockslab check` both judge this way.
    pub fn from_history(
        fault: LeaseFault,
        guard: Guard,
        ttl_ms: u64,
        log: &[Event],
    ) -> Result<CellVerdict> {
        let Judged {
            decision,
            read,
            a_release,
            found,
        } = judged(log)?;
        let saw = |worker: &str, kind: Kind| log.iter().find(|e| e.is(worker, kind));
        // Every stop the nemesis ended (one for a pause, one per stop of the stall).
        let stops: Vec<u64> = log
            .iter()
            .filter(|e| e.kind() == Kind::Resumed && e.worker == crate::nemesis::LANE)
            .filter_map(|e| e.fault().and_then(|f| f.paused_ms))
            .collect();
        let paused_ms = (!stops.is_empty()).then(|| stops.iter().sum());
        let at = |worker: &str, kind: Kind| saw(worker, kind).map(|e| e.t_ms);
        let unavailable_ms = checks::unavailable_ms(&checks::Handover {
            a_granted_ms: at("A", Kind::Acquired).context("A's grant")?,
            ttl_ms,
            a_renewed: guard == Guard::RenewThird,
            a_deleted_ms: a_release
                .deleted()
                .then(|| at("A", Kind::Released))
                .flatten(),
            b_asked_ms: at("B", Kind::Waiting),
            b_granted_ms: at("B", Kind::Acquired),
        });
        let mut cell = CellVerdict::new(fault, guard, &decision, found, paused_ms, read);
        cell.unavailable_ms = unavailable_ms;
        if fault == LeaseFault::Stall {
            cell.stops = Some(stops.len() as u64);
            cell.longest_stop_ms = stops.iter().copied().max();
        }
        Ok(cell)
    }

    pub(super) fn word(&self) -> String {
        let word = self.outcome_word();
        match self.unavailable_ms {
            Some(ms) if ms >= IDLE_WORTH_SAYING_MS => format!("{word}, B kept out {ms}ms"),
            _ => word,
        }
    }

    /// The outcome in four letters at most, for the numbered matrix.
    fn short_word(&self) -> String {
        match self.outcome {
            Outcome::StaleAccepted => "LOST".red().bold().to_string(),
            Outcome::StaleRefused => "ref".green().to_string(),
            Outcome::Aborted if self.needless_abort == Some(true) => "idle".yellow().to_string(),
            Outcome::Aborted => "stop".to_string(),
            Outcome::NoStaleWrite => "ok".to_string(),
        }
    }

    fn outcome_word(&self) -> String {
        match self.outcome {
            Outcome::StaleAccepted => "STALE WRITE".red().bold().to_string(),
            Outcome::StaleRefused => "refused (store)".green().to_string(),
            Outcome::Aborted if self.needless_abort == Some(true) => {
                "aborted, needlessly".yellow().to_string()
            }
            Outcome::Aborted => "aborted".green().to_string(),
            Outcome::NoStaleWrite => "no stale write".to_string(),
        }
    }
}

/// The store's line on the timeline when A's write was decided after B's (the checker's
/// conclusion, said, not recorded).
pub fn store_line(cell: &CellVerdict) -> Option<Conclusion> {
    let holds = cell.final_writer.clone().unwrap_or("nobody".into());
    let (broken, text) = match cell.outcome {
        Outcome::StaleAccepted => (
            true,
            format!(
                "decided A's stale write after B's and took it: it holds {holds}'s result, B's is lost"
            ),
        ),
        Outcome::StaleRefused => (
            false,
            format!("decided A's stale write after B's and refused it: it holds {holds}'s result"),
        ),
        _ => return None,
    };
    Some(Conclusion {
        lane: "store",
        text,
        broken,
    })
}

/// `lockslab check`: each cell judged again from its own events (picked by its fault and
/// guard tags) by [`CellVerdict::from_history`].
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    use clap::ValueEnum;
    let ttl_ms = replay::number(verdict, "ttl_ms")?;
    let mut replayed = Replayed::default();
    for cell in replay::list(verdict, "cells")? {
        let (fault_name, guard_name) = (replay::text(cell, "fault")?, replay::text(cell, "guard")?);
        let fault = LeaseFault::from_str(fault_name, false)
            .map_err(|_| anyhow!("an unknown fault: {fault_name}"))?;
        let guard: Guard = serde_json::from_value(cell["guard"].clone())
            .with_context(|| format!("an unknown guard: {guard_name}"))?;
        let log = replay::part_of(events, |e| {
            e.part.scenario.as_deref() == Some(fault_name)
                && e.part.variant.as_deref() == Some(guard_name)
        });
        let log = replayed.with_read_back(log, cell, None)?;
        let found = CellVerdict::from_history(fault, guard, ttl_ms, &log)?;
        replayed.part(format!("{guard_name} × {fault_name}"), cell, &found);
    }
    Ok(replayed)
}

/// Lab 9's checker: the whole history, every cell in it, judged as one [`Report`].
///
/// A cell's events are the ones tagged with its fault (`scenario`) and guard (`variant`),
/// taken in the order the cells were played. Each cell gives two findings, read through
/// [`judged`], the function its row of the verdict's matrix is read through:
///
/// - **mutual exclusion**: did Redis grant B the lock while A still believed it held it?
///   Proved by A's release (it found B's key, or its own), B's release where A's key had
///   expired, or the store deciding A's write after B's accepted one;
/// - **stale write**: did the store take A's write after B's? Proved by the store's
///   read-back (its decision order) with the writes, or A's guard giving up.
///
/// A guard that kept B's result is a valid stale-write finding even where two workers held
/// the lock at once: that is the lesson (only the write matters), not a contradiction. A
/// cell whose history lacks what decides (the guard's decision, A's release, the store's
/// read-back) is unknown, with the reason, never a pass. Each finding's events are
/// positions in `history`.
pub fn check(history: &[Event]) -> Report {
    let mut cells: Vec<(&str, &str)> = Vec::new();
    for event in history {
        if let (Some(fault), Some(guard)) = (
            event.part.scenario.as_deref(),
            event.part.variant.as_deref(),
        ) && !cells.contains(&(fault, guard))
        {
            cells.push((fault, guard));
        }
    }
    Report::compose(cells.into_iter().map(|(fault, guard)| {
        let (positions, log) = replay::part_with_positions(history, |e| {
            e.part.scenario.as_deref() == Some(fault) && e.part.variant.as_deref() == Some(guard)
        });
        // Positions in the cell's own events, moved to positions in the whole history.
        check_cell(&log)
            .placed(&positions)
            .about(&format!("{guard} × {fault}"))
    }))
}

/// One cell's two findings; event positions are in `log`.
fn check_cell(log: &[Event]) -> Report {
    let cell = match judged(log) {
        Ok(cell) => cell,
        Err(why) => {
            return Report::evidence_missing(format!("{why:#}"));
        }
    };
    let at = |worker: &str, kind: Kind| log.iter().position(|e| e.is(worker, kind));
    let read_back_at = log.iter().rposition(|e| e.kind() == Kind::ReadBack);
    Report::of([
        cell_exclusion(&cell, &at, read_back_at),
        cell_stale_write(&cell, &at, read_back_at),
    ])
}

/// Whether Redis granted B the lock while A still believed it held it.
fn cell_exclusion(
    cell: &Judged,
    at: &dyn Fn(&str, Kind) -> Option<usize>,
    read_back_at: Option<usize>,
) -> report::Finding {
    let mut events = vec![at("A", Kind::Released), at("B", Kind::Acquired)];
    let words = if cell.found.late_write.attempted() {
        events.push(read_back_at);
        "the store decided A's write after B's accepted one: Redis had granted B the lock \
         before A let go"
    } else {
        match (&cell.a_release, cell.found.two_holders) {
            (Release::HeldBy(_), _) => {
                "A's release found another owner's key: Redis had granted it the lock while A \
                 still believed it held it"
            }
            (Release::Deleted, _) => "A's release found its own key: nobody else held the lock",
            (Release::Gone, Finding::No) => {
                events.push(at("B", Kind::Released));
                "A's key had expired when it let go and B's lived until B let go: B was granted \
                 the lock only after A's key was gone"
            }
            (Release::Gone, _) => {
                events.push(at("B", Kind::Released));
                "A's and B's keys had both expired when they let go: Redis's answers cannot \
                 order B's grant against A's release"
            }
        }
    };
    report::Finding::new(
        "mutual exclusion",
        report::Outcome::broken_if(cell.found.two_holders),
        words,
        events.into_iter().flatten(),
    )
}

/// Whether the store took a write A made after B's, by the store's decision order.
fn cell_stale_write(
    cell: &Judged,
    at: &dyn Fn(&str, Kind) -> Option<usize>,
    read_back_at: Option<usize>,
) -> report::Finding {
    let mut events = vec![read_back_at, at("A", Kind::Wrote), at("B", Kind::Wrote)];
    // What the finding is about: A's late write, taken or refused, or its guard's decision
    // that held it back.
    let subject = match cell.found.outcome {
        Outcome::StaleAccepted | Outcome::StaleRefused => at("A", Kind::Wrote),
        Outcome::Aborted => at("A", Kind::GuardDecided),
        Outcome::NoStaleWrite => None,
    };
    let (outcome, words) = match cell.found.outcome {
        Outcome::StaleAccepted => (
            report::Outcome::Invalid,
            "the store decided A's write after B's and took it: B's result is lost",
        ),
        Outcome::StaleRefused => (
            report::Outcome::Valid,
            "the store decided A's write after B's and refused it: B's result stands",
        ),
        Outcome::Aborted => {
            events.push(at("A", Kind::GuardDecided));
            (
                report::Outcome::Valid,
                "A's guard stopped the write: the store holds no write of A's",
            )
        }
        Outcome::NoStaleWrite => (
            report::Outcome::Valid,
            "the store decided A's write before B's: nothing was lost",
        ),
    };
    report::Finding::new("stale write", outcome, words, events.into_iter().flatten())
        .about_event(subject)
}

impl runner::Verdict for Verdict {
    /// Per guard, the faults under which B's result was lost: `check-owner: B's result
    /// lost under pause-after-check, stall · fencing: B's result kept`.
    fn headline(&self) -> String {
        let mut guards: Vec<(&'static str, Vec<&'static str>)> = Vec::new();
        for cell in &self.cells {
            let guard = cell.guard.as_str();
            let at = match guards.iter().position(|(g, _)| *g == guard) {
                Some(at) => at,
                None => {
                    guards.push((guard, Vec::new()));
                    guards.len() - 1
                }
            };
            if !cell.outcome.safe() {
                guards[at].1.push(cell.fault.as_str());
            }
        }
        let parts: Vec<String> = guards
            .into_iter()
            .map(|(guard, lost)| match lost.as_slice() {
                [] => format!("{guard}: B's result kept"),
                faults => format!("{guard}: B's result lost under {}", faults.join(", ")),
            })
            .collect();
        parts.join(" · ")
    }

    fn fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("ttl_ms".into(), (self.plan.ttl.as_millis() as u64).into());
        fields.insert(
            "margin_ms".into(),
            (self.plan.margin.as_millis() as u64).into(),
        );
        fields.insert(
            "clock_step_ms".into(),
            (self.plan.clock_step.as_millis() as u64).into(),
        );
        fields.insert(
            "overrun_ms".into(),
            (self.plan.overrun.as_millis() as u64).into(),
        );
        fields.insert(
            "pause_ms".into(),
            self.plan.pause.map(|pause| pause.as_millis() as u64).into(),
        );
        fields.insert(
            "stall_stop_ms".into(),
            (self.plan.stall_stop.as_millis() as u64).into(),
        );
        fields.insert(
            "lock_delay_ms".into(),
            (self.plan.lock_delay.as_millis() as u64).into(),
        );
        fields.insert(
            "guards_that_held".into(),
            serde_json::to_value(self.guards_that_held()).unwrap_or_default(),
        );
        fields.insert(
            "cells".into(),
            serde_json::to_value(&self.cells).unwrap_or_default(),
        );
        fields
    }

    fn checkpoint(&self) -> Option<&'static crate::labs::step::Checkpoint> {
        Some(&crate::labs::step::lease_guard::VERDICT)
    }

    fn words(&self) -> Words {
        if self.plan.faults.len() > 3 {
            return self.words_numbered();
        }
        let faults = &self.plan.faults;
        let header: Vec<&str> = std::iter::once("guard ↓  fault →")
            .chain(faults.iter().map(|f| f.as_str()))
            .collect();
        let rows = self.matrix_rows(CellVerdict::word);
        // No blank line above the heading, as this lab has always printed it (its old
        // `prose!("")` printed nothing: an empty text has no line to fit).
        let mut words = Words::new();
        words
            .heading("Verdict — read back from the store")
            .table(&header, rows);
        for line in self.sentences() {
            words.prose(line);
        }
        words
    }
}

impl Verdict {
    /// The matrix of more than three faults: a fault's name would make its column too wide
    /// for 80, so the columns are numbered, each cell a word of four letters, and a legend
    /// says both — one table on one screen, where a table of a block per guard took two.
    fn words_numbered(&self) -> Words {
        let faults = &self.plan.faults;
        let numbers: Vec<String> = (1..=faults.len()).map(|n| n.to_string()).collect();
        let header: Vec<&str> = std::iter::once("guard ↓  fault →")
            .chain(numbers.iter().map(String::as_str))
            .collect();
        let rows = self.matrix_rows(CellVerdict::short_word);
        let legend: Vec<String> = faults
            .iter()
            .enumerate()
            .map(|(i, fault)| format!("{} {}", i + 1, fault.as_str()))
            .collect();
        let mut words = Words::new();
        words
            .heading("Verdict — read back from the store")
            .table(&header, rows)
            .prose(format!("  faults: {}", legend.join(" · ")))
            .prose(
                "  LOST: A's stale write taken, B's result lost · stop: the guard stopped A · \
                 idle: stopped A needlessly (Redis still had its key) · ref: the store \
                 refused it · ok: no stale write"
                    .to_string(),
            );
        for line in self.sentences() {
            words.prose(line);
        }
        words
    }

    /// The matrix's rows: a guard's name, then its cell against each fault in `word`s.
    fn matrix_rows(&self, word: fn(&CellVerdict) -> String) -> Vec<Vec<String>> {
        let faults = &self.plan.faults;
        self.plan
            .guards
            .iter()
            .map(|&guard| {
                std::iter::once(guard.as_str().to_string())
                    .chain(
                        faults
                            .iter()
                            .map(|&fault| self.cell(guard, fault).map(word).unwrap_or_default()),
                    )
                    .collect()
            })
            .collect()
    }

    fn cell(&self, guard: Guard, fault: LeaseFault) -> Option<&CellVerdict> {
        self.cells
            .iter()
            .find(|c| c.guard == guard && c.fault == fault)
    }

    /// The guards with no stale write accepted in any cell played.
    pub fn guards_that_held(&self) -> Vec<Guard> {
        self.plan
            .guards
            .iter()
            .copied()
            .filter(|&guard| {
                self.cells
                    .iter()
                    .filter(|c| c.guard == guard)
                    .all(|c| c.outcome.safe())
            })
            .collect()
    }

    /// What the matrix says, each sentence drawn from its cells.
    fn sentences(&self) -> Vec<String> {
        let mut lines = self.what_got_through();
        lines.extend(self.what_the_guards_believed());
        lines.push(self.which_guards_held());
        lines.extend(self.what_the_guards_cost());
        lines.extend(self.what_lock_delay_does());
        lines.extend(self.what_the_clock_speeds_did());
        lines.extend(self.stall_sentences());
        lines.extend(self.gaps_no_fault_made());
        if self.plan.faults.contains(&LeaseFault::ClockBack) {
            lines.push(format!(
                "clock-back moved A's wall clock only, {} back, with libfaketime; Redis's clock and every monotonic clock stayed true.",
                human(self.plan.clock_step)
            ));
        }
        lines
    }

    /// Pause detection that gave up under a fault that stops nobody before the check: the
    /// gap it saw was the machine's — a sampler left waiting for a CPU looks exactly like a
    /// stopped process. Such a cell is this machine's, not the guard's lesson, and the
    /// verdict says so rather than let the table differ from the walkthrough silently.
    fn gaps_no_fault_made(&self) -> Vec<String> {
        (self.cells.iter())
            .filter(|c| {
                c.guard == Guard::PauseDetect
                    && c.outcome == Outcome::Aborted
                    && !matches!(c.fault, LeaseFault::PauseBeforeCheck | LeaseFault::Stall)
            })
            .map(|c| {
                let gap = c.gap_ms.map_or(String::new(), |ms| format!(" of {ms}ms"));
                format!(
                    "pause-detect under {}: gave up on a gap{gap} that no fault made — nothing \
                     stopped A before its check; this machine left A's sampler waiting for a \
                     CPU longer than the margin. A busy machine, not the lesson: pause \
                     detection cannot tell a stop from a wait for the CPU (run it again when \
                     the machine is quieter).",
                    c.fault.as_str()
                )
            })
            .collect()
    }

    /// Fault by fault, the guards under which the stale write got through, and how long
    /// after a check that passed the write went out.
    fn what_got_through(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for &fault in &self.plan.faults {
            let through: Vec<Guard> = self
                .cells
                .iter()
                .filter(|c| c.fault == fault && c.outcome == Outcome::StaleAccepted)
                .map(|c| c.guard)
                .collect();
            if !through.is_empty() {
                let window = self
                    .cells
                    .iter()
                    .filter(|c| c.fault == fault)
                    .filter_map(|c| c.window_ms)
                    .max()
                    .filter(|&ms| ms > 0);
                let window = window
                    .map(|ms| {
                        format!(" (the write went out up to {ms}ms after a check that passed)")
                    })
                    .unwrap_or_default();
                lines.push(format!(
                    "{}: the stale write got through under {}{window}.",
                    fault.as_str(),
                    guard_names(&through)
                ));
            }
        }
        lines
    }

    /// The cells whose guard believed time was left on a lease Redis had already ended.
    fn what_the_guards_believed(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for cell in &self.cells {
            if let (Outcome::StaleAccepted, Some(false), Some(left)) =
                (cell.outcome, cell.key_ours_at_check, cell.believed_left_ms)
                && left > 0
            {
                lines.push(format!(
                    "{} under {}: the guard believed {left}ms of the lease were left while Redis had already let A's key go.",
                    cell.guard.as_str(),
                    cell.fault.as_str()
                ));
            }
        }
        lines
    }

    /// The guards that kept B's result in every cell, if any.
    fn which_guards_held(&self) -> String {
        let held = self.guards_that_held();
        if held.is_empty() {
            "No guard kept B's result in every cell.".to_string()
        } else if held == [Guard::Fencing] && self.plan.guards.len() > 1 {
            "Only fencing kept B's result in every cell: the store refused what every guess let through.".to_string()
        } else {
            format!(
                "Kept B's result in every cell played: {}.",
                guard_names(&held)
            )
        }
    }

    /// What the guards cost, cell by cell ("guard under fault (what it cost)"): safe work
    /// thrown away, and B kept out after A's lease ran out.
    fn what_the_guards_cost(&self) -> Vec<String> {
        let costs = |what: &str, cost: &dyn Fn(&CellVerdict) -> Option<String>| {
            let cells: Vec<String> = self
                .cells
                .iter()
                .filter_map(|c| {
                    cost(c).map(|cost| {
                        format!("{} under {} ({cost})", c.guard.as_str(), c.fault.as_str())
                    })
                })
                .collect();
            (!cells.is_empty()).then(|| format!("{what}: {}.", cells.join("; ")))
        };
        let mut lines = Vec::new();
        lines.extend(costs(
            "Work thrown away that was safe (Redis still had A's key)",
            &|c| {
                (c.needless_abort == Some(true))
                    .then(|| format!("PTTL {}ms", c.pttl_at_check_ms.unwrap_or_default()))
            },
        ));
        lines.extend(costs(
            "B was kept out after A's lease ran out (A may still have been working, believing it held the lock; nobody else could take it)",
            &|c| {
                c.unavailable_ms
                    .filter(|&ms| ms >= IDLE_WORTH_SAYING_MS)
                    .map(|ms| format!("{ms}ms"))
            },
        ));
        lines
    }

    /// What lock-delay did, when it was played: where the late write landed before B was
    /// let in, and where a fault outlasted the delay.
    fn what_lock_delay_does(&self) -> Option<String> {
        let delayed: Vec<&CellVerdict> = self
            .cells
            .iter()
            .filter(|c| c.guard == Guard::LockDelay)
            .collect();
        if delayed.is_empty() {
            return None;
        }
        let (kept, lost): (Vec<&CellVerdict>, Vec<&CellVerdict>) = delayed.iter().partition(|c| {
            c.outcome.safe()
                && c.unavailable_ms
                    .is_some_and(|ms| ms >= IDLE_WORTH_SAYING_MS)
        });
        // Only the cells where the delay held B out, and those it did not.
        let lost: Vec<&CellVerdict> = lost
            .into_iter()
            .filter(|c| c.outcome == Outcome::StaleAccepted)
            .collect();
        let faults = |cells: &[&CellVerdict]| {
            cells
                .iter()
                .map(|c| c.fault.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut line = format!(
            "lock-delay ({} here) only moves the window out: ",
            human(self.plan.lock_delay)
        );
        if !kept.is_empty() {
            line.push_str(&format!(
                "A's late write landed before B was let in under {}",
                faults(&kept)
            ));
        }
        if !lost.is_empty() {
            line.push_str(&format!(
                "{}a fault that outlasted the lease by more than the delay got through ({})",
                if kept.is_empty() { "" } else { "; " },
                faults(&lost)
            ));
        }
        line.push_str(". A holder that vanished keeps everyone out for the whole delay.");
        Some(line)
    }

    /// What a slow and a fast wall clock did to the wall deadline.
    fn what_the_clock_speeds_did(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self
            .cell(Guard::WallDeadline, LeaseFault::ClockSlow)
            .is_some_and(|c| c.outcome == Outcome::StaleAccepted)
        {
            lines.push(
                "clock-slow: at half speed, A's wall clock made the wall deadline believe its lease longer than Redis kept it: two holders."
                    .into(),
            );
        }
        if self
            .cell(Guard::WallDeadline, LeaseFault::ClockFast)
            .is_some_and(|c| c.needless_abort == Some(true))
        {
            lines.push(
                "clock-fast: three times too fast, A's wall clock made the wall deadline give up early: work lost, not a write."
                    .into(),
            );
        }
        lines
    }

    /// What the stall did to pause detection and to the heartbeat, from their cells.
    fn stall_sentences(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let stop = human(self.plan.stall_stop);
        if let Some(cell) = self.cell(Guard::PauseDetect, LeaseFault::Stall)
            && cell.outcome == Outcome::StaleAccepted
        {
            lines.push(format!(
                "stall: {} stops of {stop}, each under pause detection's {} margin (the widest gap it saw: {}ms): it saw no pause, though A was stopped {}ms in all and its lease ran out.",
                cell.stops.unwrap_or_default(),
                human(self.plan.margin),
                cell.gap_ms.unwrap_or_default(),
                cell.paused_ms.unwrap_or_default()
            ));
        }
        if let Some(cell) = self.cell(Guard::RenewThird, LeaseFault::Stall) {
            if cell.outcome == Outcome::NoStaleWrite && cell.key_ours_at_check == Some(true) {
                lines.push(format!(
                    "stall: A's heartbeat renewed in the {} runs between stops of {stop} and kept the lock (B kept out): a heartbeat starves only when the time between two renewals that reach Redis (stops, scheduling and the round trip) outlasts what the last one left, at most the TTL.",
                    human(super::STALL_RUN)
                ));
            } else if cell.key_ours_at_check == Some(false) {
                lines.push(format!(
                    "stall: A's longest stop, {}ms, outlasted what A's last renewal left: its heartbeat starved while A was stopped, and Redis gave B the lock.",
                    cell.longest_stop_ms.unwrap_or_default()
                ));
            }
        }
        lines
    }
}

/// Guards by name, in the order given: `none, wall-deadline`.
fn guard_names(guards: &[Guard]) -> String {
    guards
        .iter()
        .map(|g| g.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
