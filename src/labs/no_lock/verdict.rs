//! Lab 7's verdict: what `--json` carries and the tables and sentences a terminal shows.
//! Every figure in them was decided by [`crate::check::no_lock`] from the tables.

use std::time::Duration;

use anyhow::{Context, Result};
use colored::Colorize;
use serde_json::{Map, Value, json};

use super::points::WATCHED;
use super::{Fault, SWEEP};
pub use crate::check::no_lock::PointVerdict;
use crate::check::no_lock::{self as checks, Strike};
use crate::check::report::{self, Report};
use crate::events::{Event, Kind};
use crate::invoices::Moment;
use crate::labs::replay::{self, Replayed};
use crate::labs::runner;
use crate::labs::step::{self, Checkpoint};
use crate::labs::words::Words;
use crate::output::{count, human};

/// One approach's verdict: the `--json` verdict's `approaches` entries.
#[derive(serde::Serialize, Clone, Debug)]
pub struct ApproachVerdict {
    pub name: &'static str,
    pub workers: u32,
    /// Jobs with two invoices or more.
    pub duplicates: i64,
    /// Customers whose balance is not the sum of their invoices.
    pub lost_updates: i64,
    /// Jobs with no invoice.
    pub lost_jobs: i64,
    /// The lab marks it ✅: right whatever point of a job a freeze lands on.
    pub safe: bool,
    /// From the first invoice to the moment the last job got its first one, on the
    /// database's clock. Under a fault this is the time to finish, freezes included.
    pub finished_in_s: f64,
    /// Jobs over `finished_in_s`: a throughput only when no fault was played.
    pub jobs_per_s: Option<f64>,
    /// Attempts that did nothing: version conflicts, ON CONFLICT no-ops, refused tokens,
    /// and lock spins (`lock_retries`).
    pub retries: u64,
    pub conflicts: u64,
    pub no_ops: u64,
    pub rejected: u64,
    /// Redis lock attempts that found the lock taken (waiting, not wasted writes).
    pub lock_retries: u64,
    /// Releases that found the lease already ended by Redis.
    pub leases_lost: u64,
    /// Requests to Postgres and Redis per job, over the workers that finished.
    pub round_trips_per_job: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Every frozen worker's job came out right (null: no freeze).
    pub correct_under_freeze: Option<bool>,
    /// Each freeze, by the point of the job it landed on.
    pub freezes: Vec<PointVerdict>,
    /// The killed job came out right and no job was lost (null: no kill).
    pub correct_under_kill: Option<bool>,
    /// w1's job (frozen after its read).
    pub frozen_job: Option<i32>,
    pub killed_job: Option<i32>,
    /// Jobs whose first invoice came only after the first frozen worker was resumed.
    pub waited_for_the_freeze: Option<i64>,
    pub needs: &'static str,
}

/// `lockslab check`: each approach judged again from its own events (picked by its
/// `approach` tag) — the freezes and the kill the nemesis recorded, each freeze's SIGCONT
/// saying whether another worker met the frozen one, and the tables' line the lab read back
/// — by the lab's checkers.
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let jobs = replay::number(verdict, "jobs")? as i64;
    let mut replayed = Replayed::default();
    for recorded in replay::list(verdict, "approaches")? {
        let name = replay::text(recorded, "name")?;
        let log = replay::part_of(events, |e| e.part.approach.as_deref() == Some(name));
        let judged = judge_approach(name, &log, jobs)?;
        let (tables, points, killed, frozen) = (
            &judged.tables,
            &judged.points,
            &judged.killed,
            &judged.frozen,
        );
        let found = json!({
            "duplicates": tables.duplicates,
            "lost_jobs": tables.lost_jobs,
            "lost_updates": tables.lost_updates,
            "correct_under_freeze": checks::correct_under_freeze(points),
            "freezes": points,
            "correct_under_kill": checks::correct_under_kill(killed.as_ref(), tables),
            "frozen_job": frozen.iter().find(|f| f.worker == WATCHED).map(|f| f.job),
            "killed_job": killed.as_ref().map(|k| k.job),
        });
        replayed.part(format!("approach {name}"), recorded, found);
    }
    Ok(replayed)
}

/// One approach judged from its events: what the tables' line said, each freeze and the
/// kill, and where in `log` the events that decide them are.
struct Judged {
    tables: checks::ReadBack,
    points: Vec<PointVerdict>,
    frozen: Vec<Strike>,
    killed: Option<Strike>,
    /// The tables' line (`tables_read`): the store's figures.
    line_at: usize,
    /// The freezes and the kill, as the nemesis recorded them.
    frozen_at: Vec<usize>,
    killed_at: Option<usize>,
}

/// Judges one approach's events with the checkers its verdict is read from.
fn judge_approach(name: &str, log: &[Event], jobs: i64) -> Result<Judged> {
    let of = |kind: Kind| log.iter().filter(move |e| e.kind() == kind);
    let strike = |e: &Event, at: Option<Moment>| -> Result<Strike> {
        let fault = e.fault().context("a fault without its facts")?;
        let number = |n: Option<i64>, what: &str| {
            n.map(|n| n as i32)
                .with_context(|| format!("a strike that names no {what}"))
        };
        Ok(Strike {
            worker: fault
                .target
                .clone()
                .context("a strike that names no worker")?,
            at: at
                .or(fault.at)
                .context("a freeze that names no point of the job")?,
            job: number(fault.job, "job")?,
            customer: number(fault.customer, "customer")?,
            // A freeze was put to the test if its SIGCONT says so (below); a kill always is.
            exercised: true,
        })
    };
    let mut frozen = Vec::new();
    for event in of(Kind::Frozen) {
        let mut struck = strike(event, None)?;
        struck.exercised = of(Kind::Resumed)
            .filter_map(Event::fault)
            .find(|r| r.target.as_deref() == Some(struck.worker.as_str()))
            .and_then(|r| r.exercised)
            .context("a freeze's SIGCONT does not say whether it was put to the test")?;
        frozen.push(struck);
    }
    let killed = match of(Kind::Killed).next() {
        Some(event) => Some(strike(event, Some(Moment::MidWrite))?),
        None => None,
    };
    let line_at = log
        .iter()
        .position(|e| e.kind() == Kind::TablesRead)
        .with_context(|| format!("{name}: the tables' line is not in the history"))?;
    let said = log[line_at]
        .observed()
        .context("the tables' line without its figures")?;
    let count = |n: Option<u64>| n.unwrap_or(0) as i64;
    let ids =
        |ids: &Option<Vec<i64>>| -> Vec<i32> { ids.iter().flatten().map(|&n| n as i32).collect() };
    let tables = checks::ReadBack {
        jobs,
        duplicates: count(said.duplicates),
        lost_jobs: count(said.lost_jobs),
        lost_updates: count(said.lost_updates),
        bad_jobs: ids(&said.bad_jobs),
        bad_customers: ids(&said.bad_customers),
    };
    let points = checks::freezes(&frozen, &tables);
    let at = |kind: Kind| (0..log.len()).filter(move |&i| log[i].kind() == kind);
    let (frozen_at, killed_at) = (at(Kind::Frozen).collect(), at(Kind::Killed).next());
    Ok(Judged {
        tables,
        points,
        frozen,
        killed,
        line_at,
        frozen_at,
        killed_at,
    })
}

/// Lab 7's checker: the whole history, every approach in it, judged as one [`Report`].
/// Each approach (its events picked by their `approach` tag) gives up to three findings,
/// from the checkers its row is read from:
///
/// - **exactly once**: the tables' line — no job twice, none lost, every balance the sum of
///   its invoices;
/// - **under freeze** (a round with freezes): every frozen worker's job came out right;
///   unknown when a freeze was never put to the test;
/// - **under kill** (a round with a kill): the killed worker's job came out right and no
///   job was lost.
///
/// Each points at the tables' line and, for the faults, at the nemesis's strikes.
pub fn check(history: &[Event]) -> Report {
    let mut approaches: Vec<&str> = Vec::new();
    for event in history {
        if let Some(name) = event.part.approach.as_deref()
            && !approaches.contains(&name)
        {
            approaches.push(name);
        }
    }
    Report::compose(approaches.into_iter().map(|name| {
        let (positions, log) =
            replay::part_with_positions(history, |e| e.part.approach.as_deref() == Some(name));
        // The job count only sizes the tables' figures; no finding depends on it.
        let found = match judge_approach(name, &log, 0) {
            Ok(judged) => approach_findings(&judged),
            Err(why) => Report::evidence_missing(format!("{why:#}")),
        };
        found.placed(&positions).about(&format!("approach {name}"))
    }))
}

/// One approach's findings; positions are in its own events.
fn approach_findings(judged: &Judged) -> Report {
    let outcome = |right: Option<bool>| match right {
        Some(true) => report::Outcome::Valid,
        Some(false) => report::Outcome::Invalid,
        None => report::Outcome::Unknown,
    };
    let tables = &judged.tables;
    let mut report = Report::of([report::Finding::new(
        "exactly once",
        outcome(Some(tables.correct())),
        format!(
            "the tables: {} job(s) twice, {} lost, {} balance(s) not the sum of their invoices",
            tables.duplicates, tables.lost_jobs, tables.lost_updates
        ),
        [judged.line_at],
    )]);
    if !judged.frozen.is_empty() {
        report.push(report::Finding::new(
            "under freeze",
            outcome(checks::correct_under_freeze(&judged.points)),
            "every frozen worker's job, by the tables",
            judged.frozen_at.iter().copied().chain([judged.line_at]),
        ));
    }
    if let Some(right) = checks::correct_under_kill(judged.killed.as_ref(), tables) {
        report.push(report::Finding::new(
            "under kill",
            outcome(Some(right)),
            "the killed worker's job, and no job lost, by the tables",
            judged.killed_at.into_iter().chain([judged.line_at]),
        ));
    }
    report
}

/// The whole run's verdict: the plan's facts, then each approach's.
pub struct Verdict {
    pub jobs: u32,
    pub keys: u32,
    pub fault: Fault,
    pub pause: Duration,
    pub ttl: Duration,
    pub contention: bool,
    pub approaches: Vec<ApproachVerdict>,
}

impl runner::Verdict for Verdict {
    fn fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("jobs".into(), self.jobs.into());
        fields.insert("keys".into(), self.keys.into());
        fields.insert(
            "fault".into(),
            serde_json::to_value(self.fault).unwrap_or_default(),
        );
        fields.insert("pause_ms".into(), (self.pause.as_millis() as u64).into());
        fields.insert("ttl_ms".into(), (self.ttl.as_millis() as u64).into());
        fields.insert("contention".into(), self.contention.into());
        fields.insert(
            "approaches".into(),
            serde_json::to_value(&self.approaches).unwrap_or_default(),
        );
        fields
    }

    fn words(&self) -> Words {
        let mut words = Words::new();
        if self.contention {
            say_sweep(&mut words, &self.approaches);
        } else {
            say_verdict(&mut words, self);
        }
        words
    }

    fn headline(&self) -> String {
        let approaches: Vec<String> = self
            .approaches
            .iter()
            // The unsafe approaches are the lab's lessons: said as what happened, not as a
            // failure of the run.
            .map(|a| {
                let outcome = if a.safe {
                    "safe"
                } else {
                    "let a late write in"
                };
                format!("{}: {outcome}", a.name)
            })
            .collect();
        approaches.join(" · ")
    }

    fn checkpoint(&self) -> Option<&'static Checkpoint> {
        Some(&step::no_lock::VERDICT)
    }
}

/// The verdict's first table: each approach, each freeze point, and the kill.
fn say_points(
    words: &mut Words,
    rows: &[(&str, &[PointVerdict], Option<bool>)],
    pause: Duration,
    ttl: Duration,
) {
    let mark = |finding: Option<bool>| match finding {
        Some(true) => "ok".green().to_string(),
        Some(false) => "FAILED".red().bold().to_string(),
        None => "-".to_string(),
    };
    let cell = |point: Option<&PointVerdict>| match point {
        Some(p) if p.finding().is_none() => "untested".yellow().to_string(),
        Some(p) => mark(p.finding()),
        None => mark(None),
    };
    let mut header = vec!["approach"];
    header.extend(Moment::ALL.iter().map(|m| m.column()));
    header.push("kill");
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|(name, points, kill)| {
            let mut row = vec![name.to_string()];
            row.extend(
                Moment::ALL
                    .iter()
                    .map(|m| cell(points.iter().find(|p| p.at == *m))),
            );
            row.push(mark(*kill));
            row
        })
        .collect();
    let against = if pause > ttl { "past" } else { "within" };
    words
        .heading(format!(
            "Frozen {} ({against} the {} TTL) at each point of a job; killed mid-write",
            human(pause),
            human(ttl)
        ))
        .table(&header, body);
    if rows
        .iter()
        .any(|(_, points, _)| points.iter().any(|p| p.finding().is_none()))
    {
        words
            .aside("untested: no other worker waited on the frozen one or did its job before its")
            .aside("SIGCONT, so a right result there proves nothing");
    }
}

pub(super) fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn ms(value: Option<f64>) -> String {
    value.map_or("-".into(), |v| {
        if v >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.1}")
        }
    })
}

/// The verdict's words: the freezes' table, the costs' table, then a sentence per approach
/// (after a `--step` stop) and the lesson.
fn say_verdict(words: &mut Words, run: &Verdict) {
    let verdicts = &run.approaches;
    words
        .blank()
        .heading("Verdict (read back from the invoices and balances)");
    let rows: Vec<(&str, &[PointVerdict], Option<bool>)> = verdicts
        .iter()
        .map(|v| (v.name, v.freezes.as_slice(), v.correct_under_kill))
        .collect();
    say_points(words, &rows, run.pause, run.ttl);
    words.blank();
    let header = [
        "approach",
        "done in",
        "trips",
        "retries",
        "of them spins",
        "p50/p99 ms",
    ];
    let rows: Vec<Vec<String>> = verdicts
        .iter()
        .map(|v| {
            vec![
                v.name.to_string(),
                format!("{:.2}s", v.finished_in_s),
                v.round_trips_per_job
                    .map_or("-".into(), |r| format!("{r:.1}")),
                v.retries.to_string(),
                v.lock_retries.to_string(),
                format!("{}/{}", ms(v.p50_ms), ms(v.p99_ms)),
            ]
        })
        .collect();
    words
        .table(&header, rows)
        .aside("done in: first invoice to the last job's first invoice, freezes included (the")
        .aside("time to finish, not a throughput); trips: requests per job; retries: attempts")
        .aside("that did nothing: conflicts, no-ops, refused tokens, and lock spins")
        .stop(&step::no_lock::VERDICT_REASONS)
        .blank();
    // Wrapped here to 76 columns two in, as the walkthrough shows them.
    for v in verdicts {
        let text = format!("{}: {}", v.name, meaning(run, v));
        let wrapped = crate::output::wrap(&text, 76).join("\n");
        let (first, rest) = wrapped.split_at(v.name.len() + 1);
        words.prose(format!("  {}{}", first.bold(), rest.replace('\n', "\n  ")));
    }
    words.blank().prose(
        "  A lock for efficiency keeps workers from doing the same work twice; when it\n  \
         fails, work is wasted. A lock for correctness must never fail — and a lease\n  \
         fails whenever a holder pauses past its TTL. Correctness belongs in the data\n  \
         itself, checked where the read happens and not only at the write: a version, a\n  \
         unique key, a row claimed with a token, or a single owner.",
    );
}

/// What one approach's numbers mean, in sentences drawn from the same fields as the tables.
fn meaning(run: &Verdict, v: &ApproachVerdict) -> String {
    let mut parts = Vec::new();
    if v.duplicates == 0 && v.lost_updates == 0 && v.lost_jobs == 0 {
        parts.push("every job invoiced once, every balance right.".to_string());
    } else {
        parts.push(format!(
            "{} invoiced twice or more, {} with a wrong balance, {} never invoiced.",
            count(v.duplicates, "job", "jobs"),
            count(v.lost_updates, "customer", "customers"),
            count(v.lost_jobs, "job", "jobs"),
        ));
    }
    let failed: Vec<&str> = v
        .freezes
        .iter()
        .filter(|p| !p.correct)
        .map(|p| p.at.label())
        .collect();
    if !failed.is_empty() {
        let lesson = if v.name == "fenced-write-only" {
            "the token fenced the write, not the read: the next holder read before the \
             sleeper's COMMIT, waited on its row, and its higher token let it write"
        } else {
            "the sleeper, or the holder after it, wrote what it had read before the freeze"
        };
        parts.push(format!(
            "Frozen {} on a {} lease, it failed {}: {lesson}.",
            human(run.pause),
            human(run.ttl),
            failed.join(", ")
        ));
    }
    match v.name {
        "optimistic" if v.conflicts > 0 => parts.push(format!(
            "{} version conflicts, each a re-read.",
            v.conflicts
        )),
        "serializable" if v.conflicts > 0 => parts.push(format!(
            "{} rolled back by Postgres (SQLSTATE 40001 or 40P01), each tried again from a \
             fresh read.",
            count(v.conflicts as i64, "transaction", "transactions")
        )),
        "idempotency-key" if v.no_ops > 0 => parts.push(format!(
            "{} found the invoice there and did nothing.",
            count(v.no_ops as i64, "insert", "inserts")
        )),
        "redis-fenced" | "fenced-write-only" if v.rejected > 0 => parts.push(format!(
            "{} by the row's token check.",
            count(
                v.rejected as i64,
                "stale holder refused",
                "stale holders refused"
            )
        )),
        _ => {}
    }
    if let Some(waited) = v.waited_for_the_freeze
        && waited > 0
    {
        parts.push(format!(
            "{} got their first invoice only after the first SIGCONT.",
            count(waited, "job", "jobs")
        ));
    }
    parts.push(format!("Needs: {}.", v.needs));
    parts.join(" ")
}

/// `--contention`'s words: the retries and the jobs per second as the workers grow, then
/// the runs that came out wrong.
fn say_sweep(words: &mut Words, verdicts: &[ApproachVerdict]) {
    let mut names: Vec<&str> = Vec::new();
    for v in verdicts {
        if !names.contains(&v.name) {
            names.push(v.name);
        }
    }
    let columns: Vec<String> = SWEEP.iter().map(|w| format!("{w} w")).collect();
    let header: Vec<&str> = std::iter::once("approach")
        .chain(columns.iter().map(String::as_str))
        .collect();
    let grid = |cell: &dyn Fn(&ApproachVerdict) -> String| -> Vec<Vec<String>> {
        names
            .iter()
            .map(|name| {
                std::iter::once(name.to_string())
                    .chain(SWEEP.iter().map(|&w| {
                        verdicts
                            .iter()
                            .find(|v| v.workers == w && v.name == *name)
                            .map_or("-".into(), cell)
                    }))
                    .collect()
            })
            .collect()
    };
    words
        .blank()
        .heading("Retries (attempts that wrote nothing) as the workers grow")
        .table(&header, grid(&|v| v.retries.to_string()))
        .blank()
        .heading("Jobs per second")
        .table(
            &header,
            grid(&|v| v.jobs_per_s.map_or("-".into(), |r| format!("{r:.0}"))),
        );
    let wrong: Vec<&ApproachVerdict> = verdicts
        .iter()
        .filter(|v| v.duplicates + v.lost_updates + v.lost_jobs > 0)
        .collect();
    words.blank();
    if wrong.is_empty() {
        words.prose("  Every run invoiced every job once, with every balance right.");
    } else {
        for v in wrong {
            words.prose(format!(
                "  {} with {} workers: {} duplicates, {} wrong balances, {} lost jobs.",
                v.name, v.workers, v.duplicates, v.lost_updates, v.lost_jobs
            ));
        }
    }
}
