//! `lockslab chaos`: random fault schedules from a seed against a lock design on real
//! servers, a checker over every history, and the smallest schedule that still breaks the
//! design. `lockslab matrix` ([`crate::matrix`]) plays it for every design and fault.
//!
//! ```text
//! seed ──> nemesis::generate::draw ──> Schedule ──> play (clients + Player) ──> history
//!                                                         └──> read back ──> check::chaos
//! a failing schedule ──> shrink (fewer faults, shorter, fewer clients; replayed) ──> replay line
//! ```

mod args;
mod clock;
pub mod cluster;
pub mod failover;
pub mod findings;
pub mod given;
mod ground;
mod hunt;
mod keeper;
mod lab_names;
pub mod lane;
mod net;
pub mod partition;
pub mod play;
pub mod reach;
mod redlock_lane;
mod replay;
mod rows;
pub mod shard;
pub mod show;
mod shrink;
pub mod side_by_side;
mod step_words;
mod unplayed;

// The files form layers: none uses a sibling that uses it back, and none reaches back here
// for an item of this file (which only names them).
pub use args::{ChaosArgs, DEFAULT_PARALLEL};
pub use ground::Ground;
pub use hunt::{once_each, run};
pub use lane::Lane;
pub use play::{Setup, Trial};
pub use replay::{check, replay};
