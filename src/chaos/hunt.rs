//! `lockslab chaos`: the hunt. Schedules drawn from a seed (or the one given) played side
//! by side, the first failing one shrunk, the verdict line and the exit status.

use std::time::Instant;

use serde_json::json;

use super::args::ChaosArgs;
use super::ground::Ground;
use super::shard::Shard;
use super::{cluster, failover, given, play, reach, show, shrink, side_by_side};
use crate::check::chaos::Judgement;
use crate::connect::Backend;
use crate::exit::Exit;
use crate::nemesis::generate::{self, FaultKind};

use anyhow::Result;

/// `lockslab chaos`.
pub fn run(args: &ChaosArgs) -> Result<Exit> {
    let (given, mapped) = match &args.schedule {
        Some(text) => {
            let given = given::read_schedule(text, args.clients, args.design)?;
            (Some(given.schedule), given.mapped)
        }
        None => (None, Vec::new()),
    };
    let kinds = match &given {
        Some(schedule) => given::kinds(schedule),
        None if args.faults.is_empty() => FaultKind::ALL.to_vec(),
        _ => once_each(&args.faults),
    };
    let shard = args.shard.unwrap_or(Shard { k: 1, n: 1 });
    if args.time.is_none() {
        let schedules = ("schedule", "schedules");
        shard.every_part_plays(args.schedules.into(), schedules, "more --schedules")?;
    }
    let seed = args.seed.unwrap_or_else(crate::seed::fresh);
    let style = crate::output::Style::detect(args.json);
    let picture = crate::picture::Target::html_page(args.html.as_deref())?;
    // Checked before any server starts: a restart needs a Redis of chaos's own.
    let restarts: Vec<FaultKind> = match &given {
        Some(schedule) => schedule
            .steps()
            .iter()
            .filter_map(FaultKind::of)
            .filter(|k| k.kills_redis())
            .collect(),
        None if kinds.iter().all(|k| k.kills_redis()) => kinds.clone(),
        None => Vec::new(),
    };
    if let Some(kind) = restarts.first()
        && args.design.uses_redis()
        && args.servers.given(Backend::Redis).is_some()
    {
        crate::bail_usage!(
            "{}: chaos kills and restarts only servers it started itself, and this Redis was given \
             (--redis-url or LOCKSLAB_REDIS_URL); unset it and chaos starts its own",
            kind.name()
        );
    }
    let meets = |kind: &FaultKind| reach::reaches(args.design, *kind);
    if given.is_none() && !kinds.iter().any(meets) {
        let reaching: Vec<&str> = (FaultKind::ALL.iter())
            .filter(|k| meets(k))
            .map(|k| k.name())
            .collect();
        crate::bail_usage!(
            "--faults {}: none of these can reach {}: {}; choose among those that do: {}",
            kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
            args.design.name(),
            reach::unreached_kinds(args.design, &kinds).join("; "),
            reaching.join(", ")
        );
    }
    let mut ground = Ground::start(&args.servers, &[args.design], args.parallel)?;
    ground.etcd_ring = cluster::ring_for(&[args.design], &kinds)?;
    // A given schedule's failover needs the cluster, whatever --faults says.
    let with_given: Vec<FaultKind> = (kinds.iter().copied())
        .chain(
            given
                .iter()
                .flat_map(|s| s.steps().iter().filter_map(FaultKind::of)),
        )
        .collect();
    ground.sentinel_ring = failover::ring_for(&[args.design], &with_given, ground.redis_given)?;
    let no_hosts = (given.is_none() && reach::reaches(args.design, FaultKind::Partition))
        .then(|| ground.allow_partitions(&kinds))
        .flatten();
    if !args.json {
        show::heading(&ground, args, seed);
        // A lab's names on chaos's run: said before the first play, so that its lines
        // read as the schedule they are.
        for line in &mapped {
            crate::output::details([line.clone()]);
        }
    }
    // Asked for and left out: said, not dropped silently (stdout is JSON under --json).
    match reach::unreached(args.design, &once_each(&args.faults)) {
        Some(line) if given.is_none() && args.json => crate::output::err_prose(&line),
        Some(line) if given.is_none() => crate::output::prose(&line),
        _ => {}
    }
    if let Some(line) = no_hosts {
        crate::output::err_prose(&line);
    }
    let setup = ground.setup(args.design, given.is_some());
    let space = play::space(&setup, args.clients, &kinds);
    let started = Instant::now();
    let next = |nth: u64| {
        let index = nth * u64::from(shard.n) + u64::from(shard.k - 1);
        let enough = match args.time {
            // At least one schedule, however short the time: none played is no answer.
            Some(time) => nth > 0 && started.elapsed() >= time,
            None => index >= u64::from(args.schedules),
        };
        let seed = generate::nth_seed(seed, index);
        let schedule = match &given {
            Some(schedule) => schedule.clone(),
            None => generate::draw(seed, &space),
        };
        (!enough).then_some(side_by_side::Job {
            index,
            seed,
            schedule,
            clients: args.clients,
        })
    };
    // A replay plays the given schedule every time asked, to count how often it breaks
    // the design; a hunt stops at its first violation.
    let played = side_by_side::play(&setup, args.parallel, given.is_none(), next, |p| {
        show::schedule_line(style, p.job.index, p.job.seed, &p.job.schedule, &p.trial)
    })?;
    let count = |j: Judgement| {
        played
            .iter()
            .filter(move |p| p.trial.report.judgement() == j)
    };
    let (unsafe_, unknown) = (
        count(Judgement::Unsafe).count(),
        count(Judgement::Unknown).count(),
    );
    let first_failure = count(Judgement::Unsafe)
        .min_by_key(|p| p.done)
        .map(|p| p.job.index);
    let played_n = played.len() as u64;
    let in_part = side_by_side::in_part(&played);
    let first_failure = first_failure.and_then(|index| {
        let p = played.into_iter().find(|p| p.job.index == index)?;
        Some((p.job.schedule, p.trial, p.done - started))
    });
    let played = played_n;
    let hunted = started.elapsed();
    let fields = json!({
        "design": args.design.name(), "seed": seed,
        "schedules": played, "unsafe": unsafe_, "unknown": unknown,
        "played_in_part": in_part, "shard": format!("{}/{}", shard.k, shard.n),
        "given": given.is_some(), "mapped": mapped,
        "seconds": hunted.as_secs_f64(),
    });
    let mut verdict = crate::events::envelope::verdict_of("chaos", &ground.run_id, fields);
    let code = if let Some((schedule, trial, found_after)) = first_failure {
        let shrinking = !args.no_shrink && given.is_none();
        let (small, clients, small_trial) = if !shrinking {
            (schedule, args.clients, trial)
        } else {
            shrink::shrink(
                &setup,
                style,
                &schedule,
                args.clients,
                seed,
                args.replays,
                args.parallel,
                trial,
            )?
        };
        let replay = show::replay_command(args.design, clients, &small);
        let lines = show::replay_lines(args.design, clients, &small);
        show::failure(style, &small, &small_trial, &lines, found_after, shrinking);
        verdict["shrunk"] = serde_json::to_value(&small)?;
        verdict["clients"] = clients.into();
        verdict["replay"] = replay.into();
        verdict["violations"] = serde_json::to_value(&small_trial.report.violations)?;
        verdict["first_violation_after_s"] = found_after.as_secs_f64().into();
        if let Some(target) = &picture {
            let mut recording = crate::picture::Recording::of_run(
                small_trial.history.clone(),
                Some(verdict.clone()),
                Vec::new(),
            );
            // The checker's findings on the history, for the picture to draw.
            recording.report = Some(super::findings::placed(
                &small_trial.history,
                &small_trial.report,
            ));
            crate::picture::draw(std::slice::from_ref(target), &recording, style.json)?;
        }
        Exit::Violation
    } else if unknown > 0 {
        Exit::Undecided
    } else {
        Exit::Done
    };
    if code != Exit::Violation {
        let why = "no violation (--html draws a failing schedule's history)";
        crate::picture::not_drawn(picture.as_slice(), why, style.json);
    }
    ground.give_back(setup);
    show::summary(style, &verdict, played, hunted, started.elapsed() - hunted);
    // Printed: an interrupt from here on has nothing more to keep.
    crate::procs::say_if_interrupted(None);
    Ok(code)
}

/// Each item once, in the order first asked: `--design a,a` is one row, played once (a
/// second would repeat the first's namespace), and `--faults pause,pause` draws as `pause`.
pub fn once_each<T: PartialEq + Copy>(asked: &[T]) -> Vec<T> {
    let mut once = Vec::new();
    for item in asked {
        if !once.contains(item) {
            once.push(*item);
        }
    }
    once
}
