//! `lockslab chaos`'s command line: what to attack, how many schedules, which faults.

use std::time::Duration;

use crate::designs::Design;
use crate::nemesis::generate::FaultKind;
use crate::servers::ServerArgs;

use super::shard;

/// The longest `--time`: a day of schedules is already more than the 100000 `--schedules`
/// allows at a second or two each.
const LONGEST_HUNT: Duration = Duration::from_secs(24 * 60 * 60);

/// How many schedules play side by side unless told. A schedule mostly waits (on leases,
/// pauses, its clients' start-up), so on 2 cores 8 histories of 3 clients keep the cores
/// busy without starving the clients past their leases; 4 left them half idle
/// (`cargo bench --bench speed` measures both).
pub const DEFAULT_PARALLEL: u32 = 8;

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
  lockslab chaos --design redlock --faults partition
  lockslab chaos --design etcd-fenced --faults leader-stall
  lockslab chaos --design redis-lock --html broke.html
                                        the shrunk counterexample, drawn
  lockslab chaos --design redis-lock --schedule FILE
                                        replay a schedule: a JSON list of
                                        {at_ms, after, fault, target,
                                        duration_ms}, in FILE or inline
  lockslab gc-pause --json > lab1.jsonl
  lockslab chaos --design etcd-lease --schedule lab1.jsonl
                                        replay a lab's faults on a design:
                                        its --json output (or its verdict
                                        line) as it is; FILE#N for the N-th
                                        of a verdict's `schedules`

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
`partition` (issue 44): each client, and each server it talks to, on a host of
its own (a network namespace, no root needed); one client's host is cut off
from its lock server and the store for 1.25 to 3 leases (Redlock's: from every
server, or from two or three of its five masters) — the kernel drops every
packet between them, both ways, nobody is told; its connections hang, and
resume when the partition heals, what it sent meanwhile landing late. Where
this machine cannot make hosts, no partition is drawn, and one line says why.
`leader-stall`, for the etcd designs: the cluster of three members whose
leader is frozen (SIGSTOP) 1 to 3 s, past its election timeout, then thawed:
the other two elect a new leader, and the old one wakes up deposed.
Redlock's designs run on five Redis masters of chaos's own per lane (m1 to
m5); their restart is one master's.
The store's rows are then read back and checked: stale write accepted, lost
update, duplicated effect, two holders (by the lock service's answers).
A lab's schedule plays on chaos's names, each keeping its role: a client chaos
has (A, B, C…) keeps its name, another (w1, c2…) takes the next one the
schedule leaves free, in the order first named; a path's lock server is the
design's (A→redis is A→etcd on etcd); a server keeps its name if the design
has it (etcd is etcd-leader); a lab worker's `freezing` or `checked` is
chaos's `working`. Each step changed is said before the first play; one with
no counterpart (a Redlock master on one Redis, lab 8's hold and heal, a
fourth client among three) is refused, naming the step and what to write.
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
    /// Play this schedule (a JSON array, a lab's --json verdict line, or a file holding
    /// either or a lab's whole --json output) instead of drawing: its steps are the
    /// faults, so no --faults or --seed
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
