//! # lockslab — learn distributed locks by breaking them
//!
//! Every lab follows the same path through these modules:
//!
//! ```text
//! cli ──> labs::<lab> ──> labs::Stage (spawn, SIGSTOP, SIGCONT, SIGKILL, one clock) ──> worker processes
//!              │                                                                        (worker::*)
//!              │<──────────── events: one typed Kind per line, stamped on one clock ───────┘
//!              ├──> check (pure checkers: the verdict's facts from the backends' answers)
//!              ├──> output (live timeline, progress, verdict table, --json)
//!              └──> store (the fenced resource in Postgres; the verdict is read back from it)
//! ```
//!
//! - [`cli`] parses the command line and turns every outcome into an exit code.
//! - [`labs`] holds one file per lab: the scenario an orchestrator plays — what to start,
//!   when to freeze, kill or resume, which checkers decide — and [`labs::Stage`], the stage
//!   every lab plays on.
//! - [`worker`] holds the scripts worker processes run, by behaviour (a lock holder, a
//!   racer, a queue consumer), none of them knowing the labs. A worker is this same binary
//!   re-executed in a hidden mode, so that it is a real OS process that can be frozen with
//!   SIGSTOP the way a GC pause freezes a real client.
//! - [`events`] is the vocabulary workers and labs report in; [`check`] turns a run's
//!   evidence into the facts a verdict states; [`output`] renders both, and [`picture`]
//!   draws a run as an SVG or HTML timeline (`--html`, `--svg`, `lockslab render`).
//! - [`lock`] holds the locks themselves, the broken variants beside the correct ones.
//!   [`lock::redlock`] is the one lock spread over N Redis masters (lab 6).
//! - [`store`] is the protected resource: a Postgres table that enforces fencing tokens in
//!   the database itself, records every write attempt and numbers its decisions.
//! - [`queue`] is lab 3's job queue: its tables and the three ways to claim a job.
//! - [`invoices`] is lab 7's job (invoice once, add to the balance once) done eight ways.
//! - [`procs`] owns every child process and guarantees none is left running, stopped or
//!   zombie, including after Ctrl-C.
//! - [`servers`] finds Redis, etcd and Postgres, or starts private throwaway ones.
//! - [`connect`] opens connections with bounded timeouts and errors that say what to do;
//!   [`deadline`] bounds Postgres and Redis calls on the client side, where a frozen server
//!   cannot; [`redis_health`] refuses a Redis that evicts keys, and a verdict after one lost
//!   keys without their TTL (an eviction, a flush, a restart looks like an expiry).
//! - [`doctor`] checks a machine before a session.
//! - [`menu`] is the lab menu (`lockslab`, `lockslab list`): one table row per lab.
//! - [`flags`] reads duration flags; [`hands_on`] is `lockslab worker`, for the exercises
//!   done by hand.
//!
//! Adding a lab: a file in `labs/` (its flags, its scenario, its verdict), one line in
//! [`cli`]'s command enum, and — only if no script in [`worker`] does what its workers do —
//! one script there.

// Every line goes through `outln!`/`errln!` (see `output`): `println!` and `eprintln!` panic
// when the terminal hangs up or the pipe closes, and a lab must clean up whatever happens.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod check;
pub mod cli;
pub mod cluster;
pub mod connect;
pub mod deadline;
pub mod doctor;
pub mod events;
pub mod exit;
pub mod flags;
pub mod hands_on;
pub mod invoices;
pub mod labs;
pub mod lock;
pub mod menu;
pub mod nemesis;
pub mod output;
pub mod picture;
pub mod procs;
pub mod proxy;
pub mod queue;
pub mod redis_health;
pub mod seed;
pub mod servers;
pub mod store;
pub mod watchdog;
pub mod worker;
