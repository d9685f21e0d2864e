//! Chaos's clock faults: the lock server's clock jumping forward a lease, a few milliseconds
//! after a client took its lock — SIMULATED, as lab 6 does it: redis-server hangs at start
//! under libfaketime, and Redis keeps each key's expiry as a time on its own wall clock, so a
//! jump of `J` ms is each key's TTL cut by `J` ([`crate::nemesis::clock`]).
//!
//! The nemesis's player jumps it ([`crate::nemesis::server_clock`]), aimed at a grant: just
//! after its client took its lock, only if that key is still there, cutting with it the
//! lock each of the run's clients last reported taking there but no key of another run —
//! so it may play on a Redis given with `--redis-url`.
//!
//! Only a lock server's clock. A client's wall clock is not chaos's to step: its clients
//! time their leases, waits and Redlock's validity on the monotonic clock (`Instant`),
//! which a step of the wall clock does not move — lab 9 steps one under a client that
//! reads the wall clock, and shows what that breaks. Only where a lock expires on a
//! server's wall clock: Redis's keys (the Redis designs, Redlock's masters). etcd expires
//! a lease on its leader's monotonic clock (`time.Until` of a `time.Now()`-based expiry,
//! `refresh` and `Remaining` in etcd 3.4's lease/lessor.go; its expiry queue is keyed by
//! wall-clock nanoseconds, so a backward step there delays revocations, never hastens
//! one — etcd-io/etcd#12291, fixed in 3.5), and Postgres's locks have no TTL: nothing to
//! jump (`-`).

use anyhow::{Result, bail};

use super::lane::Lane;
use super::redlock_lane;
use crate::designs::Design;
use crate::events::Kind;
use crate::nemesis::Fault;
use crate::nemesis::play::Faults;
use crate::nemesis::schedule::{Kinds, Schedule, Step};

/// The servers whose clock a clock fault may jump for `design`: the ones its lock keys
/// expire on (none: the design meets no clock fault).
pub fn servers(design: Design) -> Vec<String> {
    if design.uses_redis() {
        vec!["redis".into()]
    } else if design.uses_masters() {
        (0..redlock_lane::MASTERS).map(redlock_lane::name).collect()
    } else {
        Vec::new()
    }
}

fn is_clock(step: &Step) -> bool {
    matches!(step.fault, Fault::ClockStep | Fault::ClockRate)
}

/// `faults` jumping the clock of each server a clock step of `schedule` aims at, by
/// `by_ms` (the lease: every key it finds expires); each connection is made now, before
/// the clients work ([`crate::nemesis::server_clock`]).
pub fn on<'w>(
    faults: Faults<'w>,
    schedule: &Schedule,
    lane: &Lane,
    by_ms: u64,
) -> Result<Faults<'w>> {
    let (_, clock) = split(schedule);
    let mut faults = faults;
    let mut jumped: Vec<&str> = Vec::new();
    for step in clock.steps() {
        let target = step.target.as_str();
        if jumped.contains(&target) {
            continue;
        }
        let url = match target {
            "redis" => lane.redis_url.as_ref(),
            _ => (lane.masters.urls.iter().enumerate())
                .find(|(i, _)| redlock_lane::name(*i) == target)
                .map(|(_, url)| url),
        };
        let Some(url) = url else {
            bail!("{target}: this run has no such server");
        };
        let connection = crate::connect::redis(url)?;
        faults = faults.on_server_clock(target, url, connection, by_ms);
        jumped.push(target);
    }
    Ok(faults)
}

/// The schedule's other steps, and its clock steps.
pub fn split(schedule: &Schedule) -> (Schedule, Schedule) {
    let (clock, rest): (Vec<Step>, Vec<Step>) =
        schedule.steps().iter().cloned().partition(is_clock);
    (Schedule::new(rest), Schedule::new(clock))
}

/// The schedule without each jump of several masters' clocks (the steps aimed at one
/// grant), one jump at a time, while another fault stays: shrinking drops a jump that did
/// not matter in one try rather than master by master.
pub fn without_each_jump(schedule: &Schedule) -> impl Iterator<Item = Schedule> + '_ {
    let steps = schedule.steps();
    let mut grants: Vec<&Step> = Vec::new();
    for step in steps.iter().filter(|s| s.fault == Fault::ClockStep) {
        let shared = steps
            .iter()
            .filter(|s| s.fault == step.fault && s.after == step.after);
        if shared.count() > 1 && !grants.iter().any(|g| g.after == step.after) {
            grants.push(step);
        }
    }
    grants.into_iter().filter_map(move |grant| {
        let rest: Vec<Step> = (steps.iter())
            .filter(|s| !(s.fault == Fault::ClockStep && s.after == grant.after))
            .cloned()
            .collect();
        (!rest.is_empty()).then(|| Schedule::new(rest))
    })
}

/// Checks a given schedule's clock steps (`--schedule`): a `clock_step` on a server the
/// design's lock keys expire on, timed from a client's `acquired`, no duration, each
/// server once per grant. Returns the other steps, for the usual checks.
pub fn validate(schedule: &Schedule, clients: &[String], design: Design) -> Result<Schedule> {
    let (rest, clock) = split(schedule);
    let servers = servers(design);
    let mut seen = Vec::new();
    for step in clock.steps() {
        let target = step.target.as_str();
        if step.fault == Fault::ClockRate {
            bail!("chaos plays no clock rate (lab 9 does: lockslab lease-guard)");
        }
        if clients.iter().any(|c| c == target) {
            bail!(
                "clock_step aims at client {target}: chaos does not step a client's wall clock \
                 — its clients time their leases on the monotonic clock, which a wall-clock \
                 step does not move (lab 9, lockslab lease-guard, steps one under a client \
                 that reads the wall clock); a clock_step jumps the lock server's clock"
            );
        }
        if servers.is_empty() {
            bail!(
                "clock_step: {} has no lock that expires on a server's clock (etcd expires \
                 a lease on its leader's monotonic clock; Postgres's locks have no TTL)",
                design.name()
            );
        }
        if !servers.iter().any(|s| s == target) {
            bail!(
                "clock_step aims at '{target}': a clock jump aims at a server {}'s lock keys \
                 expire on ({})",
                design.name(),
                servers.join(", ")
            );
        }
        let anchor = step
            .after
            .as_ref()
            .filter(|a| a.event == Kinds::One(Kind::Acquired) && clients.contains(&a.worker));
        let Some(anchor) = anchor else {
            bail!(
                "the clock_step on {target} is aimed at a client's held lock: give it \
                 \"after\": {{\"worker\": \"A\", \"event\": \"acquired\", \"nth\": 1}}"
            );
        };
        if step.duration_ms.is_some() {
            bail!("a clock_step has no duration: the clock jumps a lease at once");
        }
        if seen.contains(&(target, anchor)) {
            bail!("clock_step aims at {target} twice after the same grant");
        }
        seen.push((target, anchor));
    }
    Ok(rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nemesis::schedule::Anchor;

    fn jump(target: &str, after: Option<Anchor>) -> Step {
        Step {
            at_ms: 2,
            after,
            fault: Fault::ClockStep,
            target: target.into(),
            duration_ms: None,
        }
    }

    #[test]
    fn a_given_clock_jump_is_checked_against_the_design_and_its_clients() {
        let clients: Vec<String> = vec!["A".into(), "B".into()];
        let check = |steps: Vec<Step>, design| validate(&Schedule::new(steps), &clients, design);
        let granted = || Some(Anchor::on("A", Kind::Acquired, 1));
        let ok = check(vec![jump("redis", granted())], Design::RedisLock).unwrap();
        assert!(ok.is_empty(), "the clock steps are split off");
        let three: Vec<Step> = ["m1", "m2", "m3"].map(|m| jump(m, granted())).into();
        assert!(check(three, Design::Redlock).is_ok());
        for (bad, design, says) in [
            (jump("A", granted()), Design::RedisLock, "monotonic clock"),
            (
                jump("redis", granted()),
                Design::EtcdLease,
                "leader's monotonic",
            ),
            (jump("redis", granted()), Design::Optimistic, "no TTL"),
            (jump("m1", granted()), Design::RedisLock, "(redis)"),
            (jump("redis", None), Design::RedisLock, "\"acquired\""),
            (
                jump("redis", Some(Anchor::on("A", Kind::ReadRecord, 1))),
                Design::RedisLock,
                "\"acquired\"",
            ),
            (
                jump("redis", Some(Anchor::on("Z", Kind::Acquired, 1))),
                Design::RedisLock,
                "\"acquired\"",
            ),
            (
                Step {
                    duration_ms: Some(5),
                    ..jump("redis", granted())
                },
                Design::RedisLock,
                "no duration",
            ),
        ] {
            let err = check(vec![bad.clone()], design).unwrap_err().to_string();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
        let twice = vec![jump("redis", granted()), jump("redis", granted())];
        assert!(check(twice, Design::RedisLock).is_err());
    }

    #[test]
    fn shrinking_drops_a_jump_of_several_masters_at_once_never_the_last_fault() {
        let on = |client: &str| Some(Anchor::on(client, Kind::Acquired, 1));
        let mut steps: Vec<Step> = ["m1", "m2", "m3"].map(|m| jump(m, on("A"))).into();
        steps.push(jump("m4", on("B")));
        let schedule = Schedule::new(steps.clone());
        let smaller: Vec<Schedule> = without_each_jump(&schedule).collect();
        assert_eq!(smaller, [Schedule::new(vec![jump("m4", on("B"))])]);
        let alone = Schedule::new(steps[..3].to_vec());
        assert_eq!(
            without_each_jump(&alone).count(),
            0,
            "never down to no fault"
        );
    }

    #[test]
    fn only_designs_whose_locks_expire_on_a_redis_clock_have_servers_to_jump() {
        assert_eq!(servers(Design::RedisFenced), ["redis"]);
        assert_eq!(servers(Design::RedlockFenced).len(), 5);
        for design in [
            Design::EtcdLease,
            Design::AdvisorySession,
            Design::Partitioned,
        ] {
            assert!(servers(design).is_empty(), "{design:?}");
        }
    }
}
