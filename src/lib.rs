//! # lockslab — learn distributed locks by breaking them
//!
//! Every lab follows the same path through these modules:
//!
//! ```text
//! cli ──> labs::<lab>::Plan (flags checked once) ──> labs::runner (servers, run id, heading,
//!              │                                     leftovers, the verdict's JSON envelope)
//!              ├──> labs::Stage (spawn workers, one clock) ──────────────────> worker processes
//!              │<──────────── events: one typed Kind per line, stamped on one clock ───┘
//!              ├──> nemesis (pause, resume, kill, restart: each fault records itself)
//!              ├──> check::<lab> (pure checkers: the verdict's facts from the backends' answers)
//!              ├──> output (live timeline, progress, verdict table, --json)
//!              └──> store (the fenced resource in Postgres; the verdict is read back from it)
//! ```
//!
//! - [`cli`] parses the command line; [`exit`] holds the exit codes every layer may end with.
//! - [`labs`] holds one folder per lab: its `Plan` (the flags, checked once), its scenarios,
//!   and its verdict's words. [`labs::runner`] does what every lab does the same way, and
//!   [`labs::Stage`] is the stage every lab plays on.
//! - [`nemesis`] is every fault in one place, as data: a pause (SIGSTOP), its end, a kill, a
//!   server's restart — each written into the run's history by the code that did it — and
//!   [`nemesis::schedule`], faults with their times, written by hand or drawn from a seed.
//!   [`proxy`] is the fault relay for the network: delay, hold, cut, a lost reply.
//! - [`worker`] holds the scripts worker processes run, by behaviour (a lock holder, a
//!   racer, a queue consumer), none of them knowing the labs. A worker is this same binary
//!   re-executed in a hidden mode, so that it is a real OS process that can be frozen with
//!   SIGSTOP the way a GC pause freezes a real client.
//! - [`events`] is the vocabulary workers and labs report in; [`check`] turns a run's
//!   evidence into the facts a verdict states, one file per lab, every checker a pure
//!   function with unit tests (and the recorded runs in `tests/fixtures` replay through them
//!   with no servers); [`output`] renders both, and [`picture`] draws a run as an SVG or
//!   HTML timeline (`--html`, `--svg`, `lockslab render`), marking the findings of the
//!   run's checker, never its own.
//! - [`lock`] holds the locks themselves, the broken variants beside the correct ones.
//!   [`lock::redlock`] is the one lock spread over N Redis masters (lab 6);
//!   [`lock::lease_guard`], the checks a holder makes before writing, short of fencing (lab 9).
//! - [`store`] is the protected resource: a Postgres table that enforces fencing tokens in
//!   the database itself, records every write attempt and numbers its decisions.
//! - [`queue`] is lab 3's job queue: its tables and the three ways to claim a job.
//! - [`designs`] holds every lock design once, the broken beside the fixed: lab 7 and
//!   `lockslab chaos` run the same code, each with its own job, tables and points.
//! - [`invoices`] is lab 7's job (invoice once, add to the balance once), its tables, and
//!   the SQL that puts each design's guard on its rows.
//! - [`procs`] owns every child process and guarantees none is left running, stopped or
//!   zombie, including after Ctrl-C; [`watchdog`] notices when lockslab itself was paused,
//!   so that no figure measured across the gap passes for true; [`run_clock`] leaves the
//!   seconds waited at `--step`'s stops out of a run's event times.
//! - [`servers`] finds Redis, etcd and Postgres, or starts private throwaway ones (every one
//!   behind a password); [`cluster`] starts lab 5's Sentinel group and etcd cluster;
//!   [`etcd_tls`] makes a room seat's etcd certificates; [`identities`] draws the uids
//!   that untrusted code (challenge clients, seats' servers) runs as under root.
//! - [`connect`] opens connections with bounded timeouts and errors that say what to do;
//!   [`deadline`] bounds Postgres and Redis calls on the client side, where a frozen server
//!   cannot; [`redis_health`] refuses a Redis that evicts keys, and a verdict after one lost
//!   keys without their TTL (an eviction, a flush, a restart looks like an expiry).
//! - [`chaos`] is `lockslab chaos`: schedules drawn from a seed ([`nemesis::generate`]),
//!   played from the live history, checked by [`check::chaos`], shrunk when one fails;
//!   [`matrix`] is `lockslab matrix`, every design against every kind of fault, one chaos
//!   hunt a cell. Both are tools, not labs: they sit beside [`challenge`], outside `labs`.
//! - [`challenge`] is `lockslab challenge`: a learner's own lock client, in any language,
//!   run as several processes under the nemesis's faults and graded by [`check::challenge`]
//!   from the database's own log of changes.
//! - [`reproduce`] is `lockslab check`: a saved run's verdict judged again offline from its
//!   history, by each lab's `replay` (beside its verdict code, sharing [`labs::replay`]) —
//!   the code the live run judged it with — and compared field by field.
//! - [`doctor`] checks a machine before a session; [`checklist`] is the course's last
//!   page: the questions to answer before shipping a lock.
//! - [`menu`] is the lab menu (`lockslab`, `lockslab list`): one table row per lab.
//! - [`flags`] reads duration flags; [`hands_on`] is `lockslab worker`, for the exercises
//!   done by hand.
//!
//! The modules form layers: none imports one that imports it back, at the top level nor
//! between the files of one folder; and no function in a lab runs past 100 lines
//! (`tests/structure.rs` checks both). Files follow seams, not a line count.
//!
//! Adding a lab: a folder in `labs/` (its `Plan` and `impl runner::Lab`, one file per
//! scenario, its verdict), its checkers in `check/`, one line in [`cli`]'s command enum and
//! one row in [`menu`] — and, only if no script in [`worker`] does what its workers do, one
//! script there.

// Every line goes through `outln!`/`errln!` (see `output`): `println!` and `eprintln!` panic
// when the terminal hangs up or the pipe closes, and a lab must clean up whatever happens.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod challenge;
pub mod chaos;
pub mod check;
pub mod checklist;
pub mod cli;
pub mod cluster;
pub mod connect;
pub mod deadline;
pub mod designs;
pub mod doctor;
pub mod etcd_tls;
pub mod events;
pub mod exit;
pub mod flags;
pub mod freezer;
pub mod hands_on;
pub mod hosts;
pub mod identities;
pub mod invoices;
pub mod labs;
pub mod liveness;
pub mod lock;
pub mod matrix;
pub mod menu;
pub mod nemesis;
pub mod output;
pub mod picture;
pub mod procs;
pub mod proxy;
pub mod queue;
pub mod redis_health;
pub mod reproduce;
pub mod room;
pub mod run_clock;
pub mod seed;
pub mod servers;
pub mod store;
pub mod watchdog;
pub mod worker;
