//! `lockslab matrix`: every design against every kind of fault, K schedules a cell.

use anyhow::Result;
use serde_json::json;

mod cells;
mod merge;
mod pool;
mod table;

use cells::exit_code;
pub use table::Cell;
use table::{footer, header, in_table_order, notes, row_line};

use crate::chaos::play::space;
use crate::chaos::shard::{Shard, parse_shard};
use crate::chaos::side_by_side::Played;
use crate::chaos::{Ground, show};
use crate::check::chaos::Judgement;
use crate::designs::Design;
use crate::exit::Exit;
use crate::nemesis::generate::FaultKind;
use crate::output::{Style, count, json_line};
use crate::servers::ServerArgs;

#[derive(clap::Args, Debug)]
#[command(after_help = concat!("\
Examples:
  lockslab matrix                          every design × pause, kill, restart,
                                           restart-aof, delay, lost-reply,
                                           cut, leader-kill, clock, failover
  lockslab matrix --hosts                  and partition, leader-stall too
  lockslab matrix --faults partition,leader-stall
                                           only the faults on hosts and a
                                           cluster
  lockslab matrix --schedules 40 --seed 3  more schedules a cell
  lockslab matrix --design redis-lock,optimistic --faults pause,kill
  lockslab matrix --shard 1/2 --json > a.jsonl    (and 2/2 > b.jsonl elsewhere)
  lockslab matrix --merge a.jsonl b.jsonl         one table of both parts
  lockslab matrix --faults pause --strict  exit 1 on any violation, ❌ included

A cell reads SAFE n (n schedules, no violation), UNSAFE#k (a violation: its kind
and replay command in note k below the table) or UNKNOWN n (n of its histories
could not be decided, or none of their faults played; never a pass), and `-`
where the fault cannot reach the design. A cell stops at its first violation.
Past seven columns (every kind), each design takes two lines: a client's faults
(pause, kill, delay, lost-reply, cut, and with --hosts partition) over a
server's (restart, restart-aof, leader-kill, clock, failover, and leader-stall),
headed rest-aof, leader, partitn and ldr-stl; the notes are numbered in that
order. With four columns or fewer, the cells read SAFE (n), UNSAFE [k] and
UNKNOWN n/K (n of K schedules unknown); with seven, UNS#k.
`restart` crashes chaos's own Redis, which comes back empty; `restart-aof`
crashes it running with its append-only file, and it comes back with its data:
what Redis wrote to the file survives a crash of the process (the kernel still
has it); with `appendfsync always`, which it runs with, every write is written
and fsynced before Redis answers it (`everysec` may put the write off up to 2 s
while still answering); the fsync matters for a power loss or kernel crash,
which chaos does not play. Designs without Redis show `-` there.
`delay` holds a client's next write to the store in a fault proxy, its process
running; with `lost-reply` (lost-rep) the answer to a client's next request to
its lock server (the store, for the Postgres designs) is lost after the request
was applied (lab 8); `cut` cuts a client off from its lock server and the store
for 1.25 to 3 leases, what it sends meanwhile going out when the cut heals.
Neither for Redlock, whose masters are not behind the proxy.
`leader-kill` (leader) runs the etcd designs against a cluster of three members
and kills its leader; once the other two have elected a new one, it starts again
as a follower (lab 5). Designs without etcd show `-` there.
`clock` jumps the clock of the server a lock expires on a lease ahead, just
after a client took it: SIMULATED, the run's lock keys' TTL cut there
(redis-server does not run under libfaketime), on Redis or on one to three of
Redlock's masters. etcd (leases timed on its leader's monotonic clock; in 3.4 a
step back there only delays revocations, etcd#12291) and Postgres (no TTL) show
`-`; a client's wall clock is not stepped: chaos's clients time their leases on
the monotonic clock, which a step does not move (lab 9 shows what it breaks in a
client that reads the wall clock).
`failover` runs the Redis designs against a primary and its replica under three
Sentinels; the replica lags 200-700ms (frozen, its link cut), then the primary
is killed; the Sentinels promote the replica, the clients ask them where to go.
Replication is asynchronous: what the primary acknowledged in the lag is gone
(lab 5). Designs without Redis, or on a given Redis, show `-` there.
`partition` (with --hosts, or named in --faults) puts each client, and each
server it talks to, on a host of its own (a network namespace) and cuts one
client's host off from its lock server and the store for 1.25 to 3 leases
(Redlock's: from every server, or from two or three of its masters): the kernel
drops the packets both ways, the connections hang and resume when it heals.
Where this machine cannot make hosts, the column is `-` and one line says why.
`leader-stall` freezes the etcd cluster's leader 1 to 3 s, past its election
timeout, then thaws it: it wakes up deposed (lab 5). Designs without etcd show
`-` there.

Walkthrough: labs/12-chaos.md.

", crate::exit_status_help!(
    done: "no cell the labs expect safe broke or is unknown — only a ✅ design's cells \
count, each under the faults the labs say it survives; a ❌ design's cells (broken, or \
unknown as a lost reply leaves them) are the lesson and are named below the table",
    violation: "such a cell broke (--strict: any violation)",
    undecided: "no such cell broke, but one is unknown, never a pass (--strict: any unknown \
cell)"
), " A ❌ cell that did not break is named below the table, not in the status: schedules \
that miss its window prove nothing."))]
pub struct MatrixArgs {
    /// The designs (rows), repeated or comma-separated [default: every design]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub design: Vec<Design>,
    /// The kinds of fault (columns), repeated or comma-separated [default: every kind]
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<FaultKind>,
    /// Add the partition and leader-stall columns (hosts of their own, an etcd cluster):
    /// about a minute more on two cores, so not in the default table
    #[arg(long)]
    pub hosts: bool,
    /// How many schedules each cell plays (it stops at its first violation); the default
    /// plays every cell in about 5 minutes on two cores
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub schedules: u32,
    /// Draw every cell's schedules from this seed (printed when not given)
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// How many clients do jobs through the design at once
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=8))]
    pub clients: u32,
    /// Schedules played side by side, each in its own namespace (one that restarts a
    /// server plays alone)
    #[arg(long, default_value_t = crate::chaos::DEFAULT_PARALLEL, value_name = "P",
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub parallel: u32,
    /// Play only the K-th of N parts of the cells (e.g. 2/4, on another machine); merge
    /// the parts' --json with --merge
    #[arg(long, value_name = "K/N", value_parser = parse_shard)]
    pub shard: Option<Shard>,
    /// Print one table from the --json files of a sharded matrix's parts, or of runs of
    /// other columns (plays nothing)
    #[arg(long, value_name = "FILE", num_args = 1..,
          conflicts_with_all = ["shard", "design", "faults", "seed", "json", "schedules",
                                "clients", "parallel", "hosts"])]
    pub merge: Vec<std::path::PathBuf>,
    /// JSON Lines: one object per cell, then the verdict
    #[arg(long)]
    pub json: bool,
    /// Exit 1 on any violation and 3 on any unknown cell, the ❌ designs' included (by
    /// default only the ✅ designs' cells the labs expect safe count: see Exit status)
    #[arg(long)]
    pub strict: bool,
    #[command(flatten)]
    pub servers: ServerArgs,
}

pub fn run(args: &MatrixArgs) -> Result<Exit> {
    if !args.merge.is_empty() {
        return merge::merge(&args.merge, args.strict);
    }
    let designs = if args.design.is_empty() {
        Design::ALL.to_vec()
    } else {
        crate::chaos::once_each(&args.design)
    };
    let mut kinds = if args.faults.is_empty() {
        FaultKind::ALL.to_vec()
    } else {
        args.faults.clone()
    };
    // The default table stays at about 5 minutes on two cores: the columns on hosts and
    // a cluster (6 m 18 s with them, 5 m 12 s without, `matrix --seed 1`) when asked for.
    if args.faults.is_empty() && !args.hosts {
        kinds.retain(|kind| !kind.on_hosts());
    } else if args.hosts {
        kinds.extend([FaultKind::Partition, FaultKind::LeaderStall]);
    }
    in_table_order(&mut kinds);
    some_cell_plays(&designs, &kinds)?;
    let shard = args.shard.unwrap_or(Shard { k: 1, n: 1 });
    let cells = (designs.len() * kinds.len()) as u64;
    shard.every_part_plays(cells, ("cell", "cells"), "more --design or --faults")?;
    let seed = args.seed.unwrap_or_else(crate::seed::fresh);
    let style = Style::detect(args.json);
    let mut ground = Ground::start(&args.servers, &designs, args.parallel)?;
    ground.etcd_ring = crate::chaos::cluster::ring_for(&designs, &kinds)?;
    ground.sentinel_ring = crate::chaos::failover::ring_for(&designs, &kinds, ground.redis_given)?;
    if let Some(line) = ground.allow_partitions(&kinds) {
        crate::output::err_prose(&line);
    }
    if !style.json {
        let part = if shard.n > 1 {
            format!(" Part {} of {} (--shard).", shard.k, shard.n)
        } else {
            String::new()
        };
        crate::prose!(
            "Matrix: {} × {}, {} a cell, seed {seed}.{part}",
            count(designs.len() as u64, "design", "designs"),
            count(kinds.len() as u64, "fault", "faults"),
            count(args.schedules, "schedule", "schedules")
        );
        header(&kinds);
    }
    // Every cell of the table, in order: `Some` where schedules play, `None` for `-` (or
    // a cell another part of a --shard plays).
    let mut to_play: Vec<Option<pool::ToPlay>> = Vec::new();
    let mut owned = Vec::new();
    for (d, design) in designs.iter().enumerate() {
        for (f, kind) in kinds.iter().enumerate() {
            let mine = shard.owns((d * kinds.len() + f) as u64);
            owned.push(mine);
            let mut setup = ground.setup(*design, false);
            // Each cell's histories in their own namespace: the columns draw the same
            // schedule indexes, and one cell's keys must not meet the next cell's clients.
            setup.run_id = format!("{}_{}", setup.run_id, kind.name().replace('-', "_"));
            let space = space(&setup, args.clients, &[*kind]);
            let no_server = (kind.restarts() && space.restartable.is_empty())
                || (*kind == FaultKind::LeaderKill && !space.etcd_cluster)
                || (*kind == FaultKind::Clock && space.jumping.is_empty())
                || (*kind == FaultKind::Failover && !space.redis_failover)
                || (*kind == FaultKind::Partition && space.partitioned.is_empty())
                || (*kind == FaultKind::LeaderStall && space.stall_ms.is_none())
                || !space.kinds.contains(kind);
            to_play.push((mine && !no_server).then_some(pool::ToPlay { setup, space }));
        }
    }
    let plan = pool::Plan {
        cells: &to_play,
        seed,
        schedules: args.schedules,
        clients: args.clients,
        parallel: args.parallel,
    };
    let mut results: Vec<Option<Cell>> = vec![None; to_play.len()];
    for (c, playing) in to_play.iter().enumerate() {
        if playing.is_none() && owned[c] {
            results[c] = Some(cell_of(
                designs[c / kinds.len()],
                kinds[c % kinds.len()],
                &[],
                args.clients,
            ));
        }
    }
    let mut cells: Vec<Cell> = Vec::new();
    let mut rows_shown = 0;
    let mut show_rows = |results: &[Option<Cell>], cells: &mut Vec<Cell>| {
        // A row is shown once each of its cells is in, rows in order.
        while rows_shown < designs.len() {
            let row_at = rows_shown * kinds.len()..(rows_shown + 1) * kinds.len();
            let in_row = row_at.clone().filter(|&c| owned[c]);
            if in_row.clone().any(|c| results[c].is_none()) {
                break;
            }
            let row: Vec<Cell> = in_row.filter_map(|c| results[c].clone()).collect();
            if style.json {
                row.iter().for_each(json_line);
            }
            cells.extend(row.iter().cloned());
            let design = designs[rows_shown];
            if !style.json && !row.is_empty() {
                crate::outln!("{}", row_line(design, &kinds, &row, &notes(cells)));
            }
            rows_shown += 1;
        }
    };
    show_rows(&results, &mut cells);
    // Where the time went: how many schedules played, their own time summed, and the part
    // of it spent starting their clients (the rest: the clients' work and the faults).
    let (mut schedules_played, mut schedule_ms, mut startup_ms) = (0u64, 0u64, 0u64);
    plan.play(|c, played| {
        schedules_played += played.len() as u64;
        schedule_ms += played.iter().map(|p| p.trial.ms).sum::<u64>();
        startup_ms += played.iter().map(|p| p.trial.startup_ms).sum::<u64>();
        let (design, kind) = (designs[c / kinds.len()], kinds[c % kinds.len()]);
        results[c] = Some(cell_of(design, kind, &played, args.clients));
        show_rows(&results, &mut cells);
        Ok(())
    })?;
    if style.json {
        let fields = json!({
            "seed": seed, "schedules_per_cell": args.schedules,
            "shard": format!("{}/{}", shard.k, shard.n),
            // How many cell lines are before it: `--merge` tells a part whose file
            // lost some (or all) of them from a whole one.
            "cells": cells.len(),
            "designs": designs.iter().map(|d| d.name()).collect::<Vec<_>>(),
            "faults": kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
            "clients": args.clients,
            "parallel": args.parallel,
            "schedules_played": schedules_played,
            "schedule_seconds": schedule_ms as f64 / 1000.0,
            "startup_seconds": startup_ms as f64 / 1000.0,
            "unsafe": cells.iter().any(|c| c.result.starts_with("UNSAFE")),
            "unknown": cells.iter().any(|c| c.result.starts_with("UNKNOWN")),
        });
        let run_id = &ground.run_id;
        json_line(&crate::events::envelope::verdict_of(
            "matrix", run_id, fields,
        ));
    } else {
        footer(
            &cells,
            ground.redis_given && kinds.iter().any(|k| k.kills_redis()),
        );
    }
    Ok(exit_code(&cells, args.strict))
}

/// A cell from its played schedules: `-` when none played, the first violation found (in
/// the order their histories were checked), the unknowns, or SAFE with how many played.
fn cell_of(design: Design, kind: FaultKind, played: &[Played], clients: u32) -> Cell {
    let mut why_unknown = None;
    let unknown = played
        .iter()
        .filter(|p| p.trial.report.judgement() == Judgement::Unknown)
        .count();
    let found = played
        .iter()
        .filter(|p| p.trial.report.judgement() == Judgement::Unsafe)
        .min_by_key(|p| p.done);
    let (result, replay) = match found {
        _ if played.is_empty() => ("-".to_string(), None),
        Some(p) => {
            let kind_word = p.trial.report.violations[0].kind();
            let replay = show::replay_command(design, clients, &p.job.schedule);
            (format!("UNSAFE {kind_word}"), Some(replay))
        }
        None if unknown > 0 => {
            why_unknown = played
                .iter()
                .find_map(|p| p.trial.report.unknowns.first().cloned());
            (format!("UNKNOWN {unknown}/{}", played.len()), None)
        }
        None => (format!("SAFE ({})", played.len()), None),
    };
    Cell {
        kind: "cell".into(),
        design,
        fault: kind,
        result,
        replay,
        labs_call_it_safe: design.labs_call_it_safe_under(kind),
        unknown: why_unknown,
    }
}

/// Refuses a table of `-` only: no asked-for kind reaches any asked-for design.
fn some_cell_plays(designs: &[Design], kinds: &[FaultKind]) -> Result<()> {
    let plays = |d: &Design| kinds.iter().any(|k| crate::chaos::reach::reaches(*d, *k));
    if !designs.iter().any(plays) {
        let why: Vec<String> = (designs.iter())
            .flat_map(|d| crate::chaos::reach::unreached_kinds(*d, kinds))
            .collect();
        crate::bail_usage!(
            "no cell would play, every one `-`: {}; choose other --faults or --design",
            why.join("; ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `matrix --help` names the words the default table (every kind) prints, and its
    /// prose is filled to 80 columns: no line a word short that the next line starts
    /// with (a new paragraph starts with a `name` of a fault, or after an empty line).
    #[test]
    fn the_help_names_the_tables_words_and_fills_its_lines() {
        use clap::CommandFactory;
        let command = crate::cli::Cli::command();
        let matrix = command.find_subcommand("matrix").unwrap();
        let help = matrix.get_after_help().unwrap().to_string();
        let prose = &help[help.find("A cell ").unwrap()..help.find("Walkthrough").unwrap()];
        // The default table: every kind but the two on hosts (`--hosts`).
        let mut kinds = FaultKind::ALL.to_vec();
        kinds.retain(|kind| !kind.on_hosts());
        in_table_order(&mut kinds);
        let result = |kind: FaultKind| match kind {
            FaultKind::Pause => "SAFE (8)",
            FaultKind::Kill => "UNSAFE stale-write",
            FaultKind::Delay => "UNKNOWN 7/8",
            _ => "-",
        };
        let row: Vec<Cell> = (kinds.iter())
            .map(|kind| Cell {
                kind: "cell".into(),
                design: Design::RedisLock,
                fault: *kind,
                result: result(*kind).into(),
                replay: None,
                labs_call_it_safe: false,
                unknown: None,
            })
            .collect();
        colored::control::set_override(false);
        let table = row_line(Design::RedisLock, &kinds, &row, &notes(&row));
        let first = prose.split(" A cell stops").next().unwrap();
        for (shown, named) in [
            ("SAFE 8", "SAFE n"),
            ("UNSAFE#1", "UNSAFE#k"),
            ("UNKNOWN 7", "UNKNOWN n"),
        ] {
            assert!(table.contains(shown), "{table}");
            assert!(first.contains(named), "{first}");
        }
        let lines: Vec<&str> = prose.lines().collect();
        for pair in lines.windows(2) {
            assert!(pair[0].chars().count() <= 80, "{}", pair[0]);
            let Some(word) = pair[1].split(' ').next().filter(|w| !w.starts_with('`')) else {
                continue;
            };
            if !pair[0].is_empty() && !word.is_empty() {
                let joined = pair[0].chars().count() + 1 + word.chars().count();
                assert!(joined > 80, "{:?} fits after {:?}", word, pair[0]);
            }
        }
    }

    #[test]
    fn a_table_of_dashes_only_is_refused() {
        let net = [FaultKind::LostReply, FaultKind::Cut];
        let err = some_cell_plays(&[Design::Redlock], &net).unwrap_err();
        assert!(err.downcast_ref::<crate::exit::UsageError>().is_some());
        assert!(format!("{err:#}").contains("lost-reply"), "{err:#}");
        let both = [Design::Redlock, Design::RedisLock];
        assert!(some_cell_plays(&both, &net).is_ok());
    }

    /// A Redis that restarts empty reissues `redis-fenced`'s tokens; the store's strict claim
    /// turns that into refused claims, not two holders. The same restart takes the locks of
    /// the designs that trust them, and a kill or a restart with the data breaks none.
    #[test]
    fn the_expectation_of_each_cell_follows_the_fault_not_only_the_design() {
        for kind in FaultKind::ALL {
            assert!(Design::RedisFenced.labs_call_it_safe_under(kind));
            assert!(Design::RedisDurableToken.labs_call_it_safe_under(kind));
            assert!(Design::RedlockFenced.labs_call_it_safe_under(kind));
        }
        // Lab 6: a client paused past its validity writes late; a master back empty under
        // a bare majority grants the lock twice.
        assert!(!Design::Redlock.labs_call_it_safe_under(FaultKind::Pause));
        assert!(!Design::Redlock.labs_call_it_safe_under(FaultKind::Restart));
        assert!(!Design::RedisLock.labs_call_it_safe_under(FaultKind::Pause));
        assert!(!Design::RedisLock.labs_call_it_safe_under(FaultKind::Restart));
        assert!(!Design::FencedWriteOnly.labs_call_it_safe_under(FaultKind::Restart));
        // Lab 5: the promoted replica lacks what the primary had not sent on, as a Redis
        // restarted empty does; a design without Redis does not meet a failover.
        for design in Design::ALL {
            assert_eq!(
                design.labs_call_it_safe_under(FaultKind::Failover),
                design.labs_call_it_safe_under(FaultKind::Restart) || !design.uses_redis(),
                "{design:?}"
            );
        }
        // A delay of the write (no process paused) breaks what lets its lock run out under
        // a write in flight, and not a lock its running process keeps renewing.
        assert!(!Design::RedisLock.labs_call_it_safe_under(FaultKind::Delay));
        assert!(!Design::FencedWriteOnly.labs_call_it_safe_under(FaultKind::Delay));
        assert!(Design::RedisRenewed.labs_call_it_safe_under(FaultKind::Delay));
        assert!(Design::EtcdLease.labs_call_it_safe_under(FaultKind::Delay));
        for design in Design::ALL {
            assert!(
                design.labs_call_it_safe_under(FaultKind::LostReply),
                "{design:?}"
            );
            assert!(
                design.labs_call_it_safe_under(FaultKind::Kill),
                "{design:?}"
            );
            assert!(
                design.labs_call_it_safe_under(FaultKind::RestartAof),
                "{design:?}"
            );
        }
    }
}
