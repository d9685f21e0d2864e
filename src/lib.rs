//! # lockslab — learn distributed locks by breaking them
//!
//! Every lab follows the same path through these modules:
//!
//! ```text
//! cli ──> labs::<lab> ──> procs (spawn, SIGSTOP, SIGCONT, SIGKILL, reap) ──> worker processes
//!              │                                                                 │
//!              │<────────────── events (one JSON object per line) ───────────────┘
//!              ├──> output (live timeline, progress, verdict table, --json)
//!              └──> store (the fenced resource in Postgres; the verdict is read back from it)
//! ```
//!
//! - [`cli`] parses the command line and turns every outcome into an exit code.
//! - [`labs`] holds one file per lab: the scenario an orchestrator plays, and the script its
//!   workers run. A worker is this same binary re-executed in a hidden mode, so that it is a
//!   real OS process that can be frozen with SIGSTOP the way a GC pause freezes a real client.
//! - [`lock`] holds the locks themselves, the broken variants beside the correct ones.
//! - [`store`] is the protected resource: a Postgres table that enforces fencing tokens in
//!   the database itself and records every write attempt.
//! - [`procs`] owns every child process and guarantees none is left running, stopped or
//!   zombie, including after Ctrl-C.
//! - [`servers`] finds Redis, etcd and Postgres, or starts private throwaway ones.
//! - [`connect`] opens connections with bounded timeouts and errors that say what to do;
//!   [`deadline`] bounds Postgres calls on the client side, where a frozen server cannot.
//! - [`events`] is the worker-to-orchestrator protocol; [`output`] renders it.

// Every line goes through `outln!`/`errln!` (see `output`): `println!` and `eprintln!` panic
// when the terminal hangs up or the pipe closes, and a lab must clean up whatever happens.
#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod cli;
pub mod connect;
pub mod deadline;
pub mod events;
pub mod labs;
pub mod lock;
pub mod output;
pub mod procs;
pub mod servers;
pub mod store;
pub mod worker;
