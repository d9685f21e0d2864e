//! The herd part: N waiters queue for one lock, one way at a time.
//!
//! The first waiter takes the lock and keeps it until every other has asked, one after
//! the other (each is started once the one before it has made its first try), so that the
//! order of asking is known. Then it lets go, and each holder after it holds for `--hold`.
//! The waiters' hundreds of events are summed up, not shown: one line per way, and the
//! servers' counters read before and after.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;
use indicatif::ProgressBar;

use super::counters::{self, ETCD_SOURCE, REDIS_SOURCE};
use super::verdict::QueueVerdict;
use super::{Plan, lock_name};
use crate::check::queue::queue_facts;
use crate::connect::Backend;
use crate::events::facts::{Handovers, ServerCount, Turn};
use crate::events::{Event, Kind, What};
use crate::labs::runner::Run;
use crate::labs::{Stage, WorkerHandle, worker_failed};
use crate::worker::WorkerSpec;
use crate::worker::queuer::{QueuerScript, Way};

/// The heading of one way on the timeline.
fn heading(way: Way) -> String {
    match way {
        Way::RedisSpin => "── ❌ spin: every waiter retries SET NX every 10ms (Redis) ──"
            .red()
            .bold(),
        Way::EtcdHerd => "── ❌ the herd: every waiter watches the one lock key (etcd) ──"
            .red()
            .bold(),
        Way::EtcdRecipe => {
            "── ✅ the recipe: a key each, by create revision, each watching the one ahead (etcd) ──"
                .green()
                .bold()
        }
    }
    .to_string()
}

pub(super) fn play(plan: &Plan, run: &Run, way: Way) -> Result<QueueVerdict> {
    let mut stage = run.stage();
    stage.timeline.say("");
    stage.timeline.say(&heading(way));
    stage.checkpoint(crate::labs::step::queue::before_way(way.as_str()));
    stage.tags().scenario = Some("herd".into());
    stage.tags().variant = Some(way.as_str().into());
    let (url, source) = match way {
        Way::RedisSpin => (run.url(Backend::Redis), REDIS_SOURCE),
        _ => (run.url(Backend::Etcd), ETCD_SOURCE),
    };
    let read = || match way {
        Way::RedisSpin => counters::redis(url),
        _ => counters::etcd(url),
    };
    let n = plan.waiters as usize;
    // Room for every holder ahead, and for starting them all.
    let patience = (plan.hold + Duration::from_secs(1)) * plan.waiters + Duration::from_secs(30);
    let script = |name: &str, hold: Option<Duration>| {
        queuer_script(
            name,
            hold,
            way,
            url,
            &lock_name(&run.id, way.as_str()),
            patience,
        )
    };
    let names: Vec<String> = (1..=n).map(|i| format!("w{i:02}")).collect();
    let before = read().ok();
    let bar = run
        .style
        .progress(2 * n as u64, "  {msg} [{bar:30}] {pos}/{len}");
    bar.set_message("waiters asking, then served");
    // Lines said while the bar lives go above it, not through it.
    stage.timeline.attach_bar(bar.clone());
    let mut seen = Vec::new();
    let mut workers: Vec<WorkerHandle> = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let hold = (i > 0).then_some(plan.hold);
        workers.push(stage.spawn(name, &WorkerSpec::Queuer(script(name, hold)))?);
        let what = format!("{name} to ask for the lock");
        collect(&mut stage, &mut seen, patience, &what, |e| {
            e.is(name, Kind::Queued)
        })?;
        bar.inc(1);
    }
    stage.timeline.say(&format!(
        "  {n} waiters asked, one after the other: {} … {}; {} holds, and lets go now",
        names[0],
        names[n - 1],
        names[0]
    ));
    workers[0].tell("release")?;
    serve_the_queue(&mut stage, &mut seen, &mut workers, patience, &bar)?;
    stage.timeline.clear_bar();
    for worker in &mut workers {
        worker.finish(Duration::from_secs(5));
    }
    let after = read().ok();
    let server = match (before, after) {
        (Some(before), Some(after)) => before.until(after, source),
        _ => ServerCount {
            source: format!("{source} — unreadable on this server"),
            ..ServerCount::default()
        },
    };
    let turns = record_handovers(&mut stage, way, &names, &seen, &server);
    stage.drain();
    Ok(QueueVerdict::new(way.as_str(), &turns, server))
}

/// Takes the waiters' events silently, keeping them, until one matches.
fn collect(
    stage: &mut Stage,
    seen: &mut Vec<Event>,
    timeout: Duration,
    what: &str,
    matches: impl Fn(&Event) -> bool,
) -> Result<Event> {
    let deadline = Instant::now() + timeout;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        let Some(event) = stage.next_silent(left.min(Duration::from_millis(50))) else {
            continue;
        };
        if event.kind() == Kind::Error {
            return Err(worker_failed(&event.worker, &event.text));
        }
        seen.push(event.clone());
        if matches(&event) {
            return Ok(event);
        }
    }
    bail!("timed out waiting for {what}")
}

/// Each waiter's turn, in the order they asked, from its own reports.
pub(super) fn turns(names: &[String], seen: &[Event]) -> Vec<Turn> {
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut turn = Turn {
                waiter: name.clone(),
                asked: i as u32 + 1,
                ..Turn::default()
            };
            for event in seen.iter().filter(|e| &e.worker == name) {
                match &event.what {
                    What::Acquired(got) => {
                        turn.token = got.token;
                        turn.wakeups = got.wakeups.unwrap_or_default();
                        turn.requests = got.tries.unwrap_or_default();
                        turn.enter_ns = got.enter_ns.unwrap_or_default();
                    }
                    What::Released(released) => {
                        turn.leave_ns = released.leave_ns.unwrap_or_default();
                        turn.requests = released.requests.unwrap_or(turn.requests);
                    }
                    _ => {}
                }
            }
            turn
        })
        .collect()
}

/// What each waiter runs: ask for the lock, hold it for `hold` when given (the first holds
/// until told to let go), and wait at most `patience`.
fn queuer_script(
    name: &str,
    hold: Option<Duration>,
    way: Way,
    url: &str,
    lock: &str,
    patience: Duration,
) -> QueuerScript {
    QueuerScript {
        name: name.into(),
        way,
        url: url.into(),
        lock: lock.into(),
        ttl_ms: match way {
            // Longer than the whole queue: the spinning waiters' key must not expire.
            Way::RedisSpin => patience.as_millis() as u64,
            _ => 10_000,
        },
        hold_ms: hold.map(|hold| hold.as_millis() as u64),
        wait_ms: patience.as_millis() as u64,
        report_wakes: false,
        store: None,
        give_up_when_told: false,
        election: false,
    }
}

/// The queue served: every waiter lets go in turn, each reaped as it exits (200 would pile
/// up as zombies meanwhile), all within `patience`.
fn serve_the_queue(
    stage: &mut Stage,
    seen: &mut Vec<Event>,
    workers: &mut [WorkerHandle],
    patience: Duration,
    bar: &ProgressBar,
) -> Result<()> {
    let n = workers.len();
    let mut done = 0;
    let deadline = Instant::now() + patience;
    while done < n {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!("timed out waiting for the queue to be served ({done} of {n} let go)");
        }
        collect(stage, seen, left, "a waiter to let go", |e| {
            matches!(e.kind(), Kind::Released | Kind::GaveUp | Kind::Lost)
        })?;
        done += 1;
        bar.inc(1);
        // A waiter that let go has exited: reap it now, not at the end (200 would pile up
        // as zombies meanwhile).
        for worker in workers.iter_mut() {
            if stage.has_exited(&worker.name) {
                worker.finish(Duration::ZERO);
            }
        }
    }
    Ok(())
}

/// Who was served in which turn, recorded as the run's handovers beside the server's own
/// count.
fn record_handovers(
    stage: &mut Stage,
    way: Way,
    names: &[String],
    seen: &[Event],
    server: &ServerCount,
) -> Vec<Turn> {
    let turns = turns(names, seen);
    let facts = queue_facts(&turns);
    let served: Vec<String> = facts
        .order_got
        .iter()
        .map(|asked| asked.to_string())
        .collect();
    stage.record(Event::new(
        "lab",
        Handovers {
            way: way.as_str().into(),
            turns: turns.clone(),
            server: server.clone(),
        },
        format!(
            "served, by token (the place each had asked in): {}",
            served.join(" ")
        ),
    ));
    turns
}
