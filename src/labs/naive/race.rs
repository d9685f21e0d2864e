//! Lab 2's race: GET-then-SET against SET NX, trial after trial on the same worker
//! processes, each trial counted from its holders list in Redis (see
//! [`crate::check::naive::race`]).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;

use super::example::{Example, print_example, race_example};
use super::verdict::{self, Evidence, RaceEvidence, ScenarioVerdict, Tally};
use super::{Play, RedisStep, SLACK, Scenario, short};
use crate::check::naive::{self as checks, RaceCount, RaceReport, RaceTrial};
use crate::events::What;
use crate::events::facts::{Observed, Trial, Warning, Workers};
use crate::events::{Event, Kind};
use crate::labs::{Stage, WorkerHandle};
use crate::output::human;
use crate::worker::WorkerSpec;
use crate::worker::racer::{Role, Script, variant_name};

struct RaceRun {
    tally: Tally,
    example: Option<Example>,
}

impl Play<'_> {
    /// Both runs of the race on the same worker processes, then the verdict.
    pub(super) fn race(&self) -> Result<ScenarioVerdict> {
        let args = self.plan;
        // One stage, one clock for both runs. The start-up below is the broken run's
        // (it comes first); `race_run` switches the tag when the fixed run begins.
        let mut stage = Stage::on_clock(self.style, self.started).recorded_in(&self.history);
        stage.tags().scenario = Some(Scenario::Race.name().into());
        stage.tags().variant = Some(variant_name(false).into());
        stage.timeline.say("");
        stage.timeline.say(&format!(
            "{}",
            "── race: GET-then-SET (broken) vs SET NX (fixed) ──".bold()
        ));
        let prefix = self.race_prefix();
        let mut workers = Vec::new();
        for i in 1..=args.workers {
            let name = format!("W{i}");
            let role = Role {
                name: name.clone(),
                redis_url: self.redis_url.clone(),
                script: Script::Racer {
                    prefix: prefix.clone(),
                    spread_us: args.spread.as_micros() as u64,
                    window_us: args.window.as_micros() as u64,
                    work_ms: args.work.as_millis() as u64,
                    ttl_ms: args.ttl.as_millis() as u64,
                },
            };
            workers.push(stage.spawn(&name, &WorkerSpec::Racer(role))?);
        }
        let mut pids = Vec::new();
        collect(&mut stage, &workers, Kind::Ready, SLACK, |event| {
            pids.push(event.pid().unwrap_or(0));
            Ok(())
        })?;
        stage.record(Event::new(
            "lab",
            Workers {
                pids: pids.clone(),
                ..Workers::default()
            },
            format!(
                "starts {} worker processes; in every trial each tries once for a fresh lock, \
                     arriving within {} (window {}, work {})",
                args.workers,
                short(args.spread),
                short(args.window),
                short(args.work)
            ),
        ));

        let broken = self.race_run(&mut stage, &mut workers, false)?;
        let fixed = self.race_run(&mut stage, &mut workers, true)?;
        for worker in &mut workers {
            let _ = worker.tell("quit");
        }
        for worker in &mut workers {
            worker.finish(Duration::from_secs(5));
        }
        stage.drain();

        if let Some(example) = &broken.example {
            print_example(&stage, example);
        }
        let mut verdict = verdict::scenario(Scenario::Race, broken.tally, fixed.tally, self.plan);
        verdict.example = broken.example;
        Ok(verdict)
    }

    fn race_run(
        &self,
        stage: &mut Stage,
        workers: &mut [WorkerHandle],
        fixed: bool,
    ) -> Result<RaceRun> {
        let args = self.plan;
        let variant = variant_name(fixed);
        stage.tags().variant = Some(variant.into());
        let bar = self.style.progress(
            args.trials as u64,
            &format!("  {variant:>6} trials [{{bar:30}}] {{pos}}/{{len}}"),
        );
        stage.timeline.attach_bar(bar);
        // A trial lasts at most the latest arrival, the window and the work, plus a few
        // Redis round trips; the slack lets a worker whose Redis stopped answering report
        // that itself (its commands time out after COMMAND_TIMEOUT).
        let (reports, took) = self.play_trials(stage, workers, variant);
        let reports = reports?;

        let lists = self.holders_lists(variant)?;

        let evidence: Vec<RaceTrial> = lists
            .into_iter()
            .zip(&reports)
            .map(|(holders, these)| RaceTrial {
                holders,
                reports: these.iter().map(report_of).collect(),
            })
            .collect();
        let RaceCount {
            violations,
            clock_overlaps,
            disagreements,
            overwritten,
            believers: believers_total,
            most_at_once,
            holders_per_trial,
            first_broken,
        } = checks::race(&evidence);
        let example = first_broken.map(|(trial, pairs)| {
            race_example(trial, &evidence[trial as usize - 1].reports, &pairs)
        });
        let trials = args.trials;
        let rate = violations as f64 / trials as f64;
        let count = RaceCounted {
            trials,
            violations,
            most_at_once,
            overwritten,
            clock_overlaps,
            holders_per_trial: &holders_per_trial,
            disagreements: &disagreements,
        };
        record_count(stage, &count, fixed, took);
        let evidence = RaceEvidence {
            rate: (rate * 1000.0).round() / 1000.0,
            clock_overlaps,
            most_at_once,
            believers: believers_total,
            took_ms: took.as_millis() as u64,
        };
        let tally = Tally::new(violations, trials, Evidence::Race(evidence));
        Ok(RaceRun { tally, example })
    }

    /// The trials, one after another: each worker told the trial's number, and each one's
    /// report collected. The reports (or what stopped them) and how long the trials took.
    fn play_trials(
        &self,
        stage: &mut Stage,
        workers: &mut [WorkerHandle],
        variant: &str,
    ) -> (Result<Vec<Vec<Event>>>, Duration) {
        let args = self.plan;
        let trial_timeout = args.spread + args.window + args.work + SLACK;
        let started = Instant::now();
        let reports = (|| -> Result<Vec<Vec<Event>>> {
            let mut reports = Vec::with_capacity(args.trials as usize);
            for trial in 1..=args.trials {
                for worker in workers.iter_mut() {
                    worker.tell(&format!("trial {trial} {variant}"))?;
                }
                let mut these = Vec::with_capacity(workers.len());
                collect(stage, workers, Kind::Trial, trial_timeout, |event| {
                    if !matches!(&event.what, What::Trial(t) if t.trial == trial) {
                        bail!("worker {} answered for the wrong trial", event.worker);
                    }
                    these.push(event.clone());
                    Ok(())
                })?;
                reports.push(these);
                if let Some(bar) = stage.timeline.bar() {
                    bar.inc(1);
                }
            }
            Ok(reports)
        })();
        // Cleared on the error path too, so the error is not printed under a stale bar.
        stage.timeline.clear_bar();
        (reports, started.elapsed())
    }

    /// Each trial's holders list, the entries the workers wrote to Redis, read back in
    /// Redis's order: the evidence the verdict counts from.
    fn holders_lists(&self, variant: &str) -> Result<Vec<Vec<String>>> {
        let args = self.plan;
        let mut redis = self.redis()?;
        let mut pipe = redis::pipe();
        for trial in 1..=args.trials {
            pipe.cmd("LRANGE")
                .arg(format!("{}:{variant}:{trial}:holders", self.race_prefix()))
                .arg(0)
                .arg(-1);
        }
        pipe.query(&mut redis)
            .step(&self.redis_url, "reading the holders lists back from Redis")
    }

    fn race_prefix(&self) -> String {
        format!("lockslab:{}:naive:race", self.run_id)
    }
}

/// A worker's report of one trial, as the checkers read it.
fn report_of(event: &Event) -> RaceReport {
    let trial = match &event.what {
        What::Trial(trial) => trial.clone(),
        _ => Trial::default(),
    };
    let ns = |stamp: u64| Some(stamp as i64);
    RaceReport {
        worker: event.worker.clone(),
        acquired: trial.acquired,
        start_ns: ns(trial.start_ns),
        answer_ns: ns(trial.answer_ns),
        enter_ns: trial.enter_ns.and_then(ns),
        leave_ns: trial.leave_ns.and_then(ns),
        released: trial.released,
    }
}

/// Takes one unshown event of `kind` from every worker, failing with a clear message
/// if a worker fails, exits, or stays silent for `timeout`.
fn collect(
    stage: &mut Stage,
    workers: &[WorkerHandle],
    kind: Kind,
    timeout: Duration,
    mut take: impl FnMut(&Event) -> Result<()>,
) -> Result<()> {
    let mut waiting: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        if let Some(event) = stage.next_silent(Duration::from_millis(100)) {
            if event.kind() == Kind::Error {
                return Err(crate::labs::worker_failed(&event.worker, &event.text));
            }
            if event.kind() == kind {
                waiting.retain(|w| *w != event.worker);
                take(&event)?;
            }
        }
        if let Some(gone) = waiting.iter().find(|w| stage.has_exited(w)) {
            bail!("worker {gone} exited before reporting `{kind}`");
        }
        if Instant::now() > deadline {
            bail!(
                "no `{kind}` from {} within {}",
                waiting.join(", "),
                human(timeout)
            );
        }
    }
    Ok(())
}

/// What one variant's trials counted, for the line the lab records.
struct RaceCounted<'a> {
    trials: u32,
    violations: u32,
    most_at_once: usize,
    overwritten: u32,
    clock_overlaps: u32,
    holders_per_trial: &'a [usize],
    disagreements: &'a [u32],
}

/// The count, as Redis's holders lists show it: a violation when two workers held the lock
/// at once in any trial; and a warning where the clocks and the lists disagree.
fn record_count(stage: &mut Stage, count: &RaceCounted, fixed: bool, took: Duration) {
    let RaceCounted {
        trials,
        violations,
        most_at_once,
        overwritten,
        clock_overlaps,
        holders_per_trial,
        disagreements,
    } = *count;
    let rate = violations as f64 / trials as f64;
    let lock = if fixed { "SET NX" } else { "GET-then-SET" };
    let mut text = if violations == 0 {
        format!(
            "{trials} trials with {lock} in {}: never two holders at once",
            human(took)
        )
    } else {
        format!(
            "{trials} trials with {lock} in {}: two or more holders at once in {violations} ({:.1}%), up to {most_at_once} together",
            human(took),
            rate * 100.0
        )
    };
    if overwritten > 0 {
        text.push_str(&format!(
            "; in {overwritten} a worker's compare-and-delete found its own value gone"
        ));
    }
    let count = Observed {
        violations: Some(violations.into()),
        trials: Some(trials.into()),
        clock_overlaps: Some(clock_overlaps as u64),
        overwritten_trials: Some(overwritten as u64),
        holders_per_trial: Some(holders_per_trial.iter().map(|&h| h as u64).collect()),
        ..Observed::default()
    };
    stage.record(Event::new("redis", What::RedisRead(count), text));
    if !disagreements.is_empty() {
        let shown: Vec<String> = disagreements.iter().take(5).map(u32::to_string).collect();
        stage.record(
            Event::new("lab", Warning { disagreeing_trials: Some(disagreements.iter().map(|&t| t.into()).collect()), ..Warning::default() }, format!(
                    "in {} trial(s) (#{}{}) the CLOCK_MONOTONIC stamps and the holders list disagree on \
                     whether two workers held the lock at once; the count follows the holders list",
                    disagreements.len(),
                    shown.join(", #"),
                    if disagreements.len() > 5 { ", …" } else { "" }
                )),
        );
    }
}
