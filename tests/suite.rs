//! Every integration test in one binary: one link instead of one per file, and libtest
//! runs tests of different files side by side (most of them wait on servers and timers,
//! not on the CPU). Every file reaches the one `common` below (`use crate::common;`), and
//! so one set of servers for the whole binary, started by the first test that needs it:
//! a file that froze, killed or restarted those servers would disturb the others, so the
//! files that do (frozen_backends, faults, server_faults) start private ones for those
//! tests. Run one file's tests with `cargo test --test suite network::`.

mod common;

#[path = "challenge.rs"]
mod challenge;
#[path = "chaos.rs"]
mod chaos;
#[path = "check.rs"]
mod check;
mod check_reports_more;
mod check_reports_servers;
#[path = "corrections.rs"]
mod corrections;
#[path = "etcd_lock_hosts.rs"]
mod etcd_lock_hosts;
#[path = "etcd_vs_redis.rs"]
mod etcd_vs_redis;
#[path = "failover.rs"]
mod failover;
#[path = "failover_hosts.rs"]
mod failover_hosts;
#[path = "faults.rs"]
mod faults;
#[path = "frozen_backends.rs"]
mod frozen_backends;
#[path = "gc_pause.rs"]
mod gc_pause;
#[path = "history.rs"]
mod history;
#[path = "hosts.rs"]
mod hosts;
#[path = "instructor.rs"]
mod instructor;
#[path = "lease_guard.rs"]
mod lease_guard;
#[path = "naive.rs"]
mod naive;
#[path = "network.rs"]
mod network;
#[path = "no_lock.rs"]
mod no_lock;
#[path = "picture.rs"]
mod picture;
mod proxy_try;
#[path = "queue.rs"]
mod queue;
#[path = "redlock.rs"]
mod redlock;
#[path = "redlock_hosts.rs"]
mod redlock_hosts;
#[path = "secrets_and_input.rs"]
mod secrets_and_input;
#[path = "server_faults.rs"]
mod server_faults;
#[path = "server_lifecycle.rs"]
mod server_lifecycle;
#[path = "servers.rs"]
mod servers;
#[path = "setup.rs"]
mod setup;
#[path = "signals.rs"]
mod signals;
#[path = "skip_locked.rs"]
mod skip_locked;
#[path = "split_brain.rs"]
mod split_brain;
#[path = "store.rs"]
mod store;
#[path = "structure.rs"]
mod structure;
#[path = "width.rs"]
mod width;
