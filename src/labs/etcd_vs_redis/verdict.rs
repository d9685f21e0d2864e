//! Lab 4's verdict: one cell per lock and scenario, decided from the backends' answers and
//! the store's record (see [`crate::check::etcd_vs_redis`]), and the sentences that say why.

use std::time::Duration;

use anyhow::{Context, Result};
use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value};

use super::{Plan, Scenario, Service};
use crate::check::etcd_vs_redis::{self as checks, Releases, Strike};
use crate::check::report::{self, Report};
use crate::check::{self, LateWrite};
use crate::events::{Event, Kind, What};
use crate::labs::Conclusion;
use crate::labs::replay::{self, Replayed};
use crate::labs::runner;
use crate::labs::words::Words;
use crate::output::human;
use crate::worker::holder::release_of;

/// One cell of the final matrix: one backend in one scenario, as the evidence shows it.
/// Every cell of the printed matrix is a field here, so `--json` can rebuild the matrix.
#[derive(Serialize, Debug, Clone)]
pub struct Cell {
    pub backend: &'static str,
    pub scenario: Scenario,
    /// From the strike (kill or freeze) until the waiter held the lock; in the overrun
    /// scenario, from the holder's grant; null if it never did.
    pub handover_ms: Option<u64>,
    /// The handover the options predict ("≈ 5s", "1.3s–2.5s"), and where that comes from.
    pub expected: String,
    pub expected_why: String,
    /// The backend gave the lock to the waiter while the old holder had not let go of it,
    /// by the backend's own answers; null when they cannot tell.
    pub two_holders: Option<bool>,
    /// The old holder's write, in the store's decision order relative to the waiter's
    /// accepted write: "none", "accepted" or "rejected".
    pub late_write: LateWrite,
    /// Whether the store took a write that came after the waiter's; null when none did.
    pub stale_write_accepted: Option<bool>,
    /// The writes reached the store with a token from the lock.
    pub fencing_token: bool,
    /// The store's record the cell was read from: every write, in decision order.
    pub attempts: Vec<crate::store::Attempt>,
    #[serde(skip)]
    pub(super) detail: Detail,
}

/// What the matrix prints beside the JSON fields.
#[derive(Debug, Clone, Default)]
pub(super) struct Detail {
    pub(super) holder_token: Option<i64>,
    pub(super) waiter_token: Option<i64>,
}

/// Every cell of the run, and the plan they are read against.
pub struct Verdict {
    pub cells: Vec<Cell>,
    pub plan: Plan,
}

impl runner::Verdict for Verdict {
    /// Each cell's late write, as the store decided it: `kill redis: no stale write ·
    /// freeze etcd: stale write refused`.
    fn headline(&self) -> String {
        let cells: Vec<String> = self
            .cells
            .iter()
            .map(|cell| {
                format!(
                    "{} {}: {}",
                    cell.scenario.name(),
                    cell.backend,
                    crate::room::late_write_word(cell.late_write)
                )
            })
            .collect();
        cells.join(" · ")
    }

    fn fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert(
            "cells".into(),
            serde_json::to_value(&self.cells).unwrap_or_default(),
        );
        fields
    }

    fn words(&self) -> Words {
        matrix_words(&self.cells, &self.plan)
    }

    fn checkpoint(&self) -> Option<&'static crate::labs::step::Checkpoint> {
        Some(&crate::labs::step::etcd_vs_redis::VERDICT)
    }
}

/// The store's resource one lane's workers write in a scenario.
pub(super) fn resource_of(kind: Service, scenario: Scenario) -> String {
    format!("etcd-vs-redis-{}-{}", scenario.name(), kind.name())
}

/// One cell's facts from its scenario's history: the strike (the nemesis's record of it; in
/// the overrun, the holder's grant), the waiter's grant, what each release found, who the
/// backend said held the lock just before the resume, and the store's read-back of the
/// lane's resource. The live run and `lockslab check` both judge a cell this way; what the
/// options predict (`expected`) is the plan's, and left empty here.
pub fn judge_cell(kind: Service, scenario: Scenario, log: &[Event]) -> Result<Cell> {
    let backend = kind.name();
    let (holder, waiter) = (format!("{backend}:holder"), format!("{backend}:waiter"));
    let saw = |worker: &str, what: Kind| log.iter().find(|e| e.is(worker, what));
    let read = replay::read_back_of(log, Some(&resource_of(kind, scenario)))
        .with_context(|| format!("{backend}: the store's read-back is not in the history"))?;
    let strike_t = match scenario {
        Scenario::Overrun => saw(&holder, Kind::Acquired).map(|e| e.t_ms),
        Scenario::Kill | Scenario::Freeze => log
            .iter()
            .find(|e| {
                matches!(e.kind(), Kind::Killed | Kind::Frozen)
                    && e.fault().and_then(|f| f.target.as_deref()) == Some(holder.as_str())
            })
            .map(|e| e.t_ms),
    }
    .unwrap_or_default();
    let backend_saw = log.iter().find_map(|e| match &e.what {
        What::HolderNow(h) if e.worker == backend => h.holder.as_deref(),
        _ => None,
    });
    let waiter_acquired = saw(&waiter, Kind::Acquired);
    let late_write = check::late_write(&read.attempts, &holder, &waiter);
    let handover_ms = waiter_acquired.map(|e| e.t_ms.saturating_sub(strike_t));
    let release = |worker: &str| saw(worker, Kind::Released);
    let releases = match kind {
        Service::Redis | Service::RedisRenewed => Releases::Redis {
            holder: release(&holder).and_then(release_of),
            waiter_owner: waiter_acquired.and_then(|e| e.owner()),
            waiter: release(&waiter).and_then(release_of),
        },
        // etcd and Postgres queue the waiter in the server, which grants it the lock the
        // moment the holder's key or session goes.
        Service::Etcd | Service::Postgres => Releases::Queued {
            holder_kept: release(&holder).and_then(|e| e.released()).unwrap_or(false),
        },
    };
    let two_holders = checks::two_holders(&checks::Lane {
        strike: match scenario {
            Scenario::Kill => Strike::Kill,
            Scenario::Freeze => Strike::Freeze,
            Scenario::Overrun => Strike::Overrun,
        },
        strike_t,
        waiter_granted_t: waiter_acquired.map(|e| e.t_ms),
        backend_saw,
        releases,
    });
    let fencing_token =
        !read.attempts.is_empty() && read.attempts.iter().all(|a| a.token.is_some());
    Ok(Cell {
        backend,
        scenario,
        handover_ms,
        expected: String::new(),
        expected_why: String::new(),
        two_holders: check::two_holders_given_writes(two_holders, late_write).as_option(),
        late_write,
        stale_write_accepted: late_write.accepted(),
        fencing_token,
        detail: Detail {
            holder_token: read.last_token_of(&holder),
            waiter_token: read.last_token_of(&waiter),
        },
        attempts: read.attempts,
    })
}

/// The store's line on the timeline for a cell whose old holder wrote after the waiter.
/// (The checker's conclusion, said on the timeline, not recorded.)
pub(super) fn store_line(cell: &Cell) -> Option<Conclusion> {
    let (broken, text) = match cell.late_write {
        LateWrite::Accepted => (
            true,
            format!(
                "{}: the store decided the {} holder's write after the waiter's, and took it",
                cell.backend,
                cell.scenario.late_holder()
            ),
        ),
        LateWrite::Rejected => (
            false,
            format!(
                "{}: the store refused the {} holder's token {} (it had accepted {})",
                cell.backend,
                cell.scenario.late_holder(),
                token_text(cell.detail.holder_token),
                token_text(cell.detail.waiter_token)
            ),
        ),
        LateWrite::None => return None,
    };
    Some(Conclusion {
        lane: "store",
        text,
        broken,
    })
}

/// Lab 4's checker: the whole history, every cell in it (a backend in a scenario), judged
/// as one [`Report`] through [`judge_cell`], the function the matrix is read through.
///
/// A cell is a scenario whose events (tagged with it) include the backend's holder, in the
/// order the scenarios were played. Each cell gives two findings:
///
/// - **mutual exclusion**: did the backend grant the waiter the lock before the holder let
///   go? Proved by the strike and the waiter's grant (kill), who the backend said held the
///   lock before the resume (freeze), the releases, or the store deciding the holder's
///   write after the waiter's;
/// - **stale write**: did the store take the holder's write after the waiter's? Proved by
///   the store's read-back of the cell's resource and the two writes.
///
/// A cell whose history lacks its read-back is unknown, with the reason, never a pass.
/// Each finding's events are positions in `history`.
pub fn check(history: &[Event]) -> Report {
    let mut scenarios: Vec<Scenario> = Vec::new();
    for event in history {
        let named = event.part.scenario.as_deref().and_then(|name| {
            [Scenario::Kill, Scenario::Freeze, Scenario::Overrun]
                .into_iter()
                .find(|s| s.name() == name)
        });
        if let Some(scenario) = named
            && !scenarios.contains(&scenario)
        {
            scenarios.push(scenario);
        }
    }
    Report::compose(scenarios.into_iter().flat_map(|scenario| {
        let (positions, log) = replay::part_with_positions(history, |e| {
            e.part.scenario.as_deref() == Some(scenario.name())
        });
        let played: Vec<Service> = Service::ALL
            .into_iter()
            .filter(|kind| {
                let holder = format!("{}:holder", kind.name());
                log.iter().any(|e| e.worker == holder)
            })
            .collect();
        played.into_iter().map(move |kind| {
            // Positions in the scenario's own events, moved to positions in the history.
            check_cell(kind, scenario, &log)
                .placed(&positions)
                .about(&format!("{} × {}", kind.name(), scenario.name()))
        })
    }))
}

/// One cell's two findings; event positions are in `log`.
fn check_cell(kind: Service, scenario: Scenario, log: &[Event]) -> Report {
    let cell = match judge_cell(kind, scenario, log) {
        Ok(cell) => cell,
        Err(why) => {
            return Report::evidence_missing(format!("{why:#}"));
        }
    };
    let backend = kind.name();
    let (holder, waiter) = (format!("{backend}:holder"), format!("{backend}:waiter"));
    let at = |worker: &str, what: Kind| log.iter().position(|e| e.is(worker, what));
    let resource = resource_of(kind, scenario);
    let read_back_at = log.iter().rposition(|e| {
        matches!(&e.what, What::ReadBack(r) if r.resource.as_deref() == Some(resource.as_str()))
    });
    let strike_at = log.iter().position(|e| {
        matches!(e.kind(), Kind::Killed | Kind::Frozen)
            && e.fault().and_then(|f| f.target.as_deref()) == Some(holder.as_str())
    });
    let backend_saw_at = log
        .iter()
        .position(|e| e.worker == backend && e.kind() == Kind::HolderNow);
    let mut exclusion = vec![at(&waiter, Kind::Acquired)];
    let exclusion_words = match (cell.two_holders, cell.late_write.attempted(), scenario) {
        (_, true, _) => {
            exclusion.push(read_back_at);
            "the store decided the holder's write after the waiter's accepted one: the waiter \
             was granted the lock before the holder let go"
        }
        (Some(false), _, Scenario::Kill) => {
            exclusion.push(strike_at);
            "the waiter was granted the lock only after the holder was killed"
        }
        (Some(true), _, Scenario::Freeze) if backend_saw_at.is_some() => {
            exclusion.push(backend_saw_at);
            "asked before the resume, the backend named the waiter as holder: two holders"
        }
        (two, ..) => {
            exclusion.push(at(&holder, Kind::Released));
            exclusion.push(at(&waiter, Kind::Released));
            match two {
                Some(true) => "the releases show the waiter granted before the holder let go",
                Some(false) => "the releases show the holder kept the lock until it let go",
                None => "the releases cannot order the waiter's grant against the holder's",
            }
        }
    };
    let (outcome, stale_words) = match cell.late_write {
        LateWrite::Accepted => (
            report::Outcome::Invalid,
            "the store decided the holder's write after the waiter's and took it: the \
             waiter's result is lost",
        ),
        LateWrite::Rejected => (
            report::Outcome::Valid,
            "the store decided the holder's write after the waiter's and refused it",
        ),
        LateWrite::None => (
            report::Outcome::Valid,
            "no write of the holder's was decided after the waiter's",
        ),
    };
    let writes = [
        read_back_at,
        at(&holder, Kind::Wrote),
        at(&waiter, Kind::Wrote),
    ];
    let late = at(&holder, Kind::Wrote).filter(|_| cell.late_write.attempted());
    Report::exclusion_and_stale_write(
        cell.two_holders,
        (exclusion_words, exclusion.into_iter().flatten()),
        (outcome, stale_words, writes.into_iter().flatten()),
        late,
    )
}

/// `lockslab check`: each cell judged again from its scenario's events by [`judge_cell`].
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let mut replayed = Replayed::default();
    for recorded in replay::list(verdict, "cells")? {
        let kind: Service = serde_json::from_value(recorded["backend"].clone())
            .context("a cell of an unknown backend")?;
        let scenario: Scenario = serde_json::from_value(recorded["scenario"].clone())
            .context("a cell of an unknown scenario")?;
        let mut log = replay::part_of(events, |e| {
            e.part.scenario.as_deref() == Some(scenario.name())
        });
        let resource = resource_of(kind, scenario);
        if replay::read_back_of(&log, Some(&resource)).is_none() {
            replayed.read_back_or_recorded(&log, Some(&resource), recorded, None)?;
            if let Some(taken) = replayed.completions.last() {
                log.push(taken.event.clone());
            }
        }
        let found = judge_cell(kind, scenario, &log)?;
        let mut row = serde_json::to_value(&found)?;
        if let Some(fields) = row.as_object_mut() {
            // What the options predict is the plan's, not the history's.
            fields.remove("expected");
            fields.remove("expected_why");
        }
        replayed.part(
            format!("{} × {}", kind.name(), scenario.name()),
            recorded,
            row,
        );
    }
    Ok(replayed)
}

impl Cell {
    /// One sentence on what the cell shows, from its evidence.
    fn meaning(&self, plan: &Plan) -> String {
        let handover = self
            .handover_ms
            .map(|ms| human(Duration::from_millis(ms)))
            .unwrap_or("never".into());
        let expected = format!(" (expected {}: {})", self.expected, self.expected_why);
        let renewed_every = human(plan.lease / 3);
        let why_handover = match (self.backend, self.scenario) {
            ("redis", _) => "Redis gave the lock away only when the key's TTL ran out".to_string(),
            ("redis-renewed", scenario) => format!(
                "the heartbeat (a PEXPIRE every {renewed_every}) {} with the process, and the short TTL ran out",
                if scenario == Scenario::Kill { "died" } else { "froze" }
            ),
            ("etcd", _) => {
                "the heartbeat stopped and etcd expired the lease, deleting the lock key".into()
            }
            ("postgres", Scenario::Kill) => {
                "the dead process's socket closed, the server ended its session, and the queued waiter got the lock at once".into()
            }
            ("postgres", _) if plan.pg_timeout.is_some() => {
                "idle_session_timeout ended the frozen client's session, and its lock with it".into()
            }
            _ => "the frozen client's session stayed open, so it kept the lock for the whole pause".into(),
        };
        let carried = if self.fencing_token {
            format!(
                "its write carried token {}.",
                token_text(self.detail.waiter_token)
            )
        } else {
            "its write carried no token.".into()
        };
        match self.scenario {
            Scenario::Kill if self.two_holders == Some(true) => format!(
                "the key's TTL ran out before the kill, under a live holder: the waiter held the lock first — two holders. {}",
                late_write_sentence(self)
            ),
            Scenario::Kill => format!(
                "{why_handover}: the waiter held it {handover} after the kill{expected}; {carried}"
            ),
            Scenario::Overrun if self.two_holders == Some(true) => format!(
                "the key's TTL ({}, set once) ran out while its holder was still working ({}), \
                 live and never paused: the waiter got the lock {handover} after the holder's \
                 grant{expected} — two holders. {}",
                human(plan.overrun_ttl),
                human(plan.work),
                late_write_sentence(self)
            ),
            Scenario::Overrun => {
                let kept = match self.backend {
                    "redis" => "the key's TTL outlived the work".to_string(),
                    "redis-renewed" => format!(
                        "the heartbeat re-armed the key every {renewed_every} while the holder worked"
                    ),
                    "etcd" => "the heartbeat renewed the lease while the holder worked".into(),
                    _ => "the session stayed open while the holder worked".into(),
                };
                format!(
                    "{kept}: the waiter got the lock {handover} after the holder's grant{expected}, \
                     once the holder had finished and let go — no second holder."
                )
            }
            Scenario::Freeze if self.two_holders.is_none() => format!(
                "{why_handover}; the waiter got the lock after {handover}{expected}, but both keys \
                 had expired by the time their holders let go, so Redis's answers cannot tell \
                 whether it did before the holder let go. {}",
                late_write_sentence(self)
            ),
            Scenario::Freeze if self.two_holders == Some(false) => {
                let why_not = match self.backend {
                    "redis" => format!(
                        "the {} pause ended before the key's TTL ran out, so the holder woke still holding the lock",
                        human(plan.pause)
                    ),
                    "redis-renewed" => format!(
                        "the {} pause ended before the key, renewed until the freeze, ran out",
                        human(plan.pause)
                    ),
                    "etcd" => format!(
                        "the {} pause ended before etcd expired the lease",
                        human(plan.pause)
                    ),
                    _ if plan.pg_timeout.is_some() => format!(
                        "the {} pause ended before idle_session_timeout ended the session",
                        human(plan.pause)
                    ),
                    _ => why_handover.clone(),
                };
                format!(
                    "{why_not}: no second holder (safe), but no progress either — the waiter got the lock after {handover}{expected}, only once the holder woke and let go."
                )
            }
            Scenario::Freeze => format!(
                "{why_handover}; after {handover}{expected} the waiter held it before the holder \
                 (frozen, or just woken) had let go — two holders. {}",
                late_write_sentence(self)
            ),
        }
    }
}

pub(super) fn token_text(token: Option<i64>) -> String {
    token.map(|t| t.to_string()).unwrap_or("none".into())
}

/// What the store did with the old holder's write, from its decision order.
fn late_write_sentence(cell: &Cell) -> String {
    let who = cell.scenario.late_holder();
    match cell.late_write {
        LateWrite::Accepted if !cell.fencing_token => format!(
            "The {who} holder, with no token to check, had its stale write accepted over the waiter's."
        ),
        LateWrite::Accepted => format!("The store took the {who} holder's stale write."),
        LateWrite::Rejected => format!(
            "The store refused the {who} holder's token {} because it had accepted the waiter's {}.",
            token_text(cell.detail.holder_token),
            token_text(cell.detail.waiter_token)
        ),
        LateWrite::None => format!(
            "The {who} holder's write was decided before the waiter's, so it destroyed nothing — \
             by luck, not by design."
        ),
    }
}

/// The verdict's words: per scenario, a row per lock and a sentence on each; then what the
/// matrix says. A table per scenario fits 80 columns (one table of all the cells, with
/// its scenario column, does not), and a page of `--step` can end between two scenarios.
fn matrix_words(cells: &[Cell], plan: &Plan) -> Words {
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let header = [
        "lock",
        "handover",
        "expected",
        "2 holders",
        "late write",
        "token",
    ];
    let row = |cell: &Cell| {
        let two = match cell.two_holders {
            Some(true) => "YES".red().bold().to_string(),
            Some(false) => "no".to_string(),
            None => "unknown".yellow().to_string(),
        };
        let stale = match cell.late_write {
            LateWrite::Accepted => "ACCEPTED".red().bold().to_string(),
            LateWrite::Rejected => "rejected".green().bold().to_string(),
            other => other.as_str().to_string(),
        };
        vec![
            cell.backend.to_string(),
            cell.handover_ms
                .map(|ms| human(Duration::from_millis(ms)))
                .unwrap_or("nobody".into()),
            cell.expected.clone(),
            two,
            stale,
            yes_no(cell.fencing_token),
        ]
    };
    let mut scenarios: Vec<Scenario> = Vec::new();
    for cell in cells {
        if !scenarios.contains(&cell.scenario) {
            scenarios.push(cell.scenario);
        }
    }
    let mut words = Words::new();
    words
        .blank()
        .heading("Verdict (from the backends and the store)");
    for scenario in scenarios {
        let of_scenario: Vec<&Cell> = cells.iter().filter(|c| c.scenario == scenario).collect();
        words
            .blank()
            .heading(format!(
                "{}: handover = until the waiter held the lock",
                scenario.name()
            ))
            .table(&header, of_scenario.iter().map(|c| row(c)).collect());
        for cell in of_scenario {
            words.about(cell.backend, cell.meaning(plan));
        }
    }
    words.blank().about(
        "In short",
        "a short renewed TTL (Redis or etcd) or a session gets the next holder \
         in fast after a crash, and lasts as long as the work; a TTL set once must \
         choose between the two. None of them keeps a paused holder out: only a token \
         the store checks keeps its write out. etcd's revision is such a token, and \
         Raft keeps what etcd acknowledged through a failover; a Redis owner value is \
         random, and Redis replicates asynchronously (lab 5).",
    );
    words
}
