//! `lockslab chaos` and `lockslab matrix`: random fault schedules from a seed against a
//! lock design on real servers, a checker over every history, the smallest schedule that
//! still breaks the design, and every design against every kind of fault.
//!
//! ```text
//! seed ──> nemesis::generate::draw ──> Schedule ──> play (clients + Player) ──> history
//!                                                         └──> read back ──> check::chaos
//! a failing schedule ──> shrink (fewer faults, shorter, fewer clients; replayed) ──> replay line
//! ```

mod clock;
pub mod cluster;
pub mod failover;
pub mod given;
mod lag;
mod net;
pub mod play;
pub mod reach;
mod redlock_lane;
mod replay;
mod rows;
pub mod shard;
pub mod show;
mod shrink;
pub mod side_by_side;
mod unplayed;

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde_json::json;

use crate::check::chaos::Judgement;
use crate::connect::Backend;
use crate::designs::Design;
use crate::exit::Exit;
use crate::nemesis::generate::{self, FaultKind};
use crate::servers::{self, ServerArgs, Servers};

pub use play::{Lane, Setup, Trial};
pub use replay::replay;

/// The longest `--time`: a day of schedules is already more than the 100000 `--schedules`
/// allows at a second or two each.
const LONGEST_HUNT: Duration = Duration::from_secs(24 * 60 * 60);

/// How many schedules play side by side unless told: on 2 cores, 4 histories of 3 clients
/// keep them busy without starving the clients past their leases.
pub const DEFAULT_PARALLEL: u32 = 4;

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab chaos --design redis-lock    10 schedules; the first violation
                                        shrunk, with its replay command
  lockslab chaos --design redis-fenced --schedules 50 --seed 7
  lockslab chaos --design etcd-lease --faults pause --time 2m
  lockslab chaos --design redis-lock --faults delay,lost-reply
  lockslab chaos --design etcd-lease --faults cut
  lockslab chaos --design redlock --faults clock
  lockslab chaos --design redis-fenced --faults failover
  lockslab chaos --design redis-lock --html broke.html
                                        the shrunk counterexample, drawn
  lockslab chaos --design redis-lock --schedule FILE
                                        replay a schedule: a JSON list of
                                        {at_ms, after, fault, target,
                                        duration_ms}, in FILE or inline

Each schedule: CLIENTS clients do read-modify-write jobs (read a counter, add
one, append the job to the record's log) on 2 records through the design,
for 1.5s (2s on etcd), while the schedule's faults land: a pause or a kill
just after a client took its lock, just after its read, inside its write's
transaction, or at a time; a restart of the lock's Redis (chaos's own):
`restart` with no persistence (it comes back empty), `restart-aof` with its
append-only file (it comes back with its data: a killed process loses
nothing it wrote to the file; it runs with `appendfsync always`: every write
is written and fsynced before Redis answers it, where `everysec` may put the
write off up to 2 s while still answering; the fsync is for power loss, which
chaos does not play); `delay`, a
client's next write to the store held in a fault proxy (its process runs on),
and `lost-reply`, the answer to its next request to its lock server (the
store for Postgres designs; none for Redlock) lost once applied (lab 8);
`cut`, a client cut off from its lock server and from the store for 1.25 to
3 leases (a partition, none for Redlock): its lease runs out as nothing it
sends gets through, and what it sent goes out, late, when the cut heals;
`leader-kill`, for the etcd designs: a cluster of three members (lab 5)
whose leader is killed, then started again once the other two have elected
a new one (schedules with one play one at a time); `failover`, for the Redis
designs: a primary and its replica under three Sentinels (lab 5); the
replica lags 200-700ms (frozen, its link cut: what the primary takes
meanwhile it never gets), then the primary is killed and the replica thawed;
the Sentinels promote it, and the clients, which ask them where the primary
is (again after an error), move to it; what the primary took in the lag is
lost (one at a time, never on a given Redis; a given schedule's failover lags
its `duration_ms`, none without one); `clock`, for the designs
whose lock expires on a Redis server's clock: that clock jumps a lease ahead
a few ms after a client took its lock — SIMULATED, as in lab 6 (redis-server
does not run under libfaketime): the TTL of every lock key the run holds
there is cut by the jump, and the history says so; for Redlock, one to three of its five masters' clocks jump
at once. A client's wall clock is not stepped: chaos's clients time their
leases on the monotonic clock, which a step does not move (lab 9 steps one
under a client that reads the wall clock); etcd expires a lease on its
leader's monotonic clock, and Postgres's locks have no TTL: those designs do
not meet it.
Redlock's designs run on five Redis masters of chaos's own per lane (m1 to
m5); their restart is one master's.
The store's rows are then read back and checked: stale write accepted, lost
update, duplicated effect, two holders (by the lock service's answers).
A step that never plays (its moment never came, its target was gone, the
path it was put on carried nothing more) is named under its line, with why.
A play of a given schedule missing one is unknown, never safe; a drawn one
is judged on the faults that played (unknown if none did: it tested none).

Walkthrough: labs/12-chaos.md.

", crate::exit_status_help!(
    done: "no violation found",
    violation: "a violation found",
    undecided: "no violation, but some history could not be decided (unknown, never a pass)"
)))]
pub struct ChaosArgs {
    /// The lock design to attack
    #[arg(long, value_enum)]
    pub design: Design,
    /// Draw the schedules from this seed (printed when not given)
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// How many schedules to try
    #[arg(long, default_value_t = 10, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub schedules: u32,
    /// Try schedules for this long instead (e.g. 2m), 1s to 24h
    #[arg(long, value_parser = crate::flags::duration_in(Duration::from_secs(1), LONGEST_HUNT),
          value_name = "T", conflicts_with = "schedules")]
    pub time: Option<Duration>,
    /// The kinds of fault to draw, comma-separated [default: every kind]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<FaultKind>,
    /// How many clients
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub clients: u32,
    /// Play this schedule (a JSON array, or a file holding one) instead of drawing: its
    /// steps are the faults, so no --faults or --seed
    #[arg(long, value_name = "FILE|JSON", conflicts_with_all = ["faults", "seed"])]
    pub schedule: Option<String>,
    /// Replays of each smaller schedule while shrinking (timing varies: it is kept if
    /// it failed in four of five of them, every one of the default three)
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub replays: u32,
    /// Do not shrink a failing schedule
    #[arg(long)]
    pub no_shrink: bool,
    /// Schedules played side by side, each in its own namespace and lane (a restart hits
    /// only its lane's Redis; one with a leader kill or a failover plays alone)
    #[arg(long, default_value_t = DEFAULT_PARALLEL, value_name = "P",
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub parallel: u32,
    /// JSON Lines on stdout: one object per schedule, then a verdict
    #[arg(long)]
    pub json: bool,
    /// Play only the K-th of N parts of the schedules (every N-th, from the K-th): N runs
    /// with the same seed play the schedules of one
    #[arg(long, value_name = "K/N", value_parser = shard::parse_shard)]
    pub shard: Option<shard::Shard>,
    /// Draw the smallest failing schedule's history into FILE, a self-contained HTML page
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// Servers for a set of designs: the store (Postgres), etcd if one needs it, and Redis —
/// one of chaos's own per lane of schedules played side by side (private: a restart is a
/// fault it may aim at one lane's Redis without touching the others), or the one given by
/// `--redis-url`, which chaos never restarts (server faults only on servers it started).
pub struct Ground {
    pub servers: Servers,
    pub lanes: Vec<Lane>,
    /// The Redis was given: client faults only.
    pub redis_given: bool,
    pub run_id: String,
    /// The etcd cluster of the leader kills (issue 25), when a run may draw one.
    pub etcd_ring: Option<std::sync::Arc<cluster::EtcdRing>>,
    /// The Redis primary and replica under Sentinel of the failovers, when a run may draw
    /// one.
    pub sentinel_ring: Option<std::sync::Arc<failover::SentinelRing>>,
}

impl Ground {
    pub fn start(args: &ServerArgs, designs: &[Design], parallel: u32) -> Result<Ground> {
        let mut needs = vec![Backend::Postgres];
        if designs.iter().any(|d| d.uses_etcd()) {
            needs.push(Backend::Etcd);
        }
        let given = args.given(Backend::Redis).map(String::from);
        let uses_redis = designs.iter().any(|d| d.uses_redis());
        if uses_redis && given.is_some() {
            needs.push(Backend::Redis);
        }
        let servers = servers::provide(args, &needs)?;
        let mut lanes = match (&given, uses_redis) {
            (_, false) => vec![Lane::default()],
            (Some(_), true) => vec![Lane::given(servers.url(Backend::Redis))],
            (None, true) => (0..parallel.max(1))
                .map(|_| Lane::private_redis())
                .collect::<Result<_>>()?,
        };
        if designs.iter().any(|d| d.uses_masters()) {
            redlock_lane::add_masters(&mut lanes, parallel)?;
        }
        let ground = Ground {
            servers,
            lanes,
            redis_given: given.is_some() && uses_redis,
            run_id: crate::labs::new_run_id(),
            etcd_ring: None,
            sentinel_ring: None,
        };
        ground.check_permissions(designs)?;
        Ok(ground)
    }

    /// Before any schedule plays: the clients' own commands, on a key named like theirs
    /// (`lockslab:<run id>:chaos:…`), on a given Redis and on etcd, as the users their URLs
    /// name. A user that may not send them — a room seat's outside its namespace, an ACL
    /// without `EVAL` — would otherwise fail every client's every write, each recorded as
    /// an unknown outcome: "0 writes", exit 3, and the server's refusal never shown. Here
    /// it stops the run (exit 4) with the refusal in its words.
    fn check_permissions(&self, designs: &[Design]) -> Result<()> {
        let key = format!("lockslab:{}:chaos:permissions", self.run_id);
        if self.redis_given {
            let url = self.servers.url(Backend::Redis);
            let counter = format!("{key}:token");
            let checked = crate::connect::redis(url).and_then(|conn| {
                let mut lock =
                    crate::lock::redis::RedisLock::new(conn, &key, Duration::from_secs(10));
                let held = lock.acquire_within(Duration::ZERO, Some(&counter))?;
                if let Some(held) = held {
                    lock.release(&held)?;
                }
                Ok(())
            });
            if let Err(err) = checked {
                bail!(
                    "the Redis at {} refused the commands chaos's clients send (SET NX PX, \
                     INCR, EVALSHA, SCRIPT LOAD) on {key}: {}. Its user needs them on keys \
                     lockslab:<run id>:* (a room seat's lines give that on the seat's own \
                     Redis)",
                    crate::connect::redact(url),
                    crate::connect::explain(err).root_cause()
                );
            }
            if let Ok(mut conn) = crate::connect::redis(url) {
                let _ = redis::cmd("DEL").arg(&counter).query::<i64>(&mut *conn);
            }
        }
        if designs.iter().any(|d| d.uses_etcd()) {
            let url = self.servers.url(Backend::Etcd);
            let checked = crate::connect::etcd_runtime().and_then(|runtime| {
                runtime.block_on(async {
                    let mut client = crate::connect::etcd(url).await?;
                    client.put(key.as_str(), "chaos", None).await?;
                    client.delete(key.as_str(), None).await?;
                    anyhow::Ok(())
                })
            });
            if let Err(err) = checked {
                bail!(
                    "etcd at {} refused chaos's clients a write and a delete of {key}: {}. \
                     Its user needs read and write on the keys under lockslab:<run id>: (a \
                     room seat's has them under lockslab:<seat>_)",
                    crate::connect::redact(url),
                    crate::connect::explain(err).root_cause()
                );
            }
        }
        Ok(())
    }

    /// A setup for one design, borrowing the lanes' Redis servers for its restarts;
    /// `given`: its schedules are the one given (see [`Setup::given`]).
    pub fn setup(&mut self, design: Design, given: bool) -> Setup {
        let etcd_url = design
            .uses_etcd()
            .then(|| self.servers.url(Backend::Etcd).to_string());
        Setup {
            design,
            run_id: format!("{}_{}", self.run_id, design.name().replace('-', "_")),
            store_url: self.servers.url(Backend::Postgres).to_string(),
            lanes: std::mem::take(&mut self.lanes),
            etcd_url,
            etcd_ring: self.etcd_ring.clone().filter(|_| design.uses_etcd()),
            sentinel_ring: self.sentinel_ring.clone().filter(|_| design.uses_redis()),
            records: 2,
            run_ms: run_ms_of(design),
            work_ms: 20,
            lease_ms: Setup::lease_for(design),
            given,
        }
    }

    /// Takes the lanes back from a setup.
    pub fn give_back(&mut self, setup: Setup) {
        self.lanes = setup.lanes;
    }
}

/// `lockslab chaos`.
pub fn run(args: &ChaosArgs) -> Result<Exit> {
    let given = match &args.schedule {
        Some(text) => Some(given::read_schedule(text, args.clients, args.design)?),
        None => None,
    };
    let kinds = match &given {
        Some(schedule) => given::kinds(schedule),
        None if args.faults.is_empty() => FaultKind::ALL.to_vec(),
        _ => once_each(&args.faults),
    };
    let shard = args.shard.unwrap_or(shard::Shard { k: 1, n: 1 });
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
    if !args.json {
        show::heading(&ground, args, seed);
    }
    // Asked for and left out: said, not dropped silently (stdout is JSON under --json).
    match reach::unreached(args.design, &once_each(&args.faults)) {
        Some(line) if given.is_none() && args.json => crate::output::err_prose(&line),
        Some(line) if given.is_none() => crate::output::prose(&line),
        _ => {}
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
    let in_part = unplayed::in_part(&played);
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
        "given": given.is_some(),
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
            let recording = crate::picture::Recording::of_run(
                small_trial.history.clone(),
                Some(verdict.clone()),
                Vec::new(),
            );
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
pub(crate) fn once_each<T: PartialEq + Copy>(asked: &[T]) -> Vec<T> {
    let mut once = Vec::new();
    for item in asked {
        if !once.contains(item) {
            once.push(*item);
        }
    }
    once
}

/// How long one schedule's clients work: etcd's sessions take longer to start.
pub(crate) fn run_ms_of(design: Design) -> u64 {
    if design.uses_etcd() { 2000 } else { 1500 }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    /// A given schedule's steps are its faults: a --faults or --seed beside it would be
    /// taken and ignored, so clap refuses the pair (exit 2).
    #[test]
    fn a_given_schedule_takes_no_faults_and_no_seed() {
        let schedule = r#"[{"at_ms": 100, "fault": "kill", "target": "A"}]"#;
        for (flag, value) in [("--faults", "pause"), ("--seed", "9")] {
            let argv = ["lockslab", "chaos", "--design", "redis-lock"];
            let argv = argv
                .into_iter()
                .chain(["--schedule", schedule, flag, value]);
            let err = crate::cli::Cli::try_parse_from(argv).unwrap_err();
            assert_eq!(
                err.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{err}"
            );
        }
    }
}
