//! Chaos's clock faults: the lock server's clock jumping forward a lease, a few milliseconds
//! after a client took its lock — SIMULATED, as lab 6 does it: redis-server hangs at start
//! under libfaketime, and Redis keeps each key's expiry as a time on its own wall clock, so a
//! jump of `J` ms is each key's TTL cut by `J` ([`crate::nemesis::clock`]).
//!
//! ```text
//!  A: acquired r1 ──3ms──▶ nemesis: PTTL of A's key on m3: 795ms; records "m3's clock
//!                          jumps 800ms ahead under A's lock of r1 — simulated: the key's
//!                          TTL cut, as if the server's clock jumped"; A's key, and the
//!                          run's other lock keys there, expire
//! ```
//!
//! The jump is aimed at a grant: it lands just after its client took its lock, and plays
//! only if that key is still there (else the step did not play, and says why). Then, as a
//! real jump expires every key on the server, it cuts the lock each of the run's clients
//! last reported taking there — the key of another record expires with it — but no key of
//! another run (a real jump would expire those too): it may play on a Redis given with
//! `--redis-url`.
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

use std::collections::HashMap;

use anyhow::{Result, bail};

use super::lane::Lane;
use super::redlock_lane;
use crate::connect::RedisConn;
use crate::designs::Design;
use crate::events::Kind;
use crate::events::What;
use crate::events::facts::FaultFacts;
use crate::labs::{Feed, Stage};
use crate::nemesis::clock::Jump;
use crate::nemesis::schedule::{Kinds, Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note};

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

/// One grant of a lock, as its `acquired` told it.
#[derive(Clone, Debug)]
struct Grant {
    key: String,
    /// The value its holder wrote into the key: whose the key still is.
    owner: Option<String>,
    /// When, on the stage's clock.
    t_ms: u64,
    /// Its client's how-manieth.
    nth: u32,
}

/// The clock steps of one history, played from the stage's events (a `tick` of
/// [`Stage::play_ticking`]): at each, the server's clock jumps under a client's lock.
pub struct ClockPlay {
    steps: Vec<Step>,
    feed: Feed,
    /// Each server a step aims at, by name (`redis`, `m3`): its URL, and a connection made
    /// before the clients start (making one takes tens of milliseconds on a busy machine,
    /// long enough for a client to let go of the lock the jump is aimed at).
    servers: HashMap<String, (String, Option<RedisConn>)>,
    /// Each grant, by its client and number (`A`'s 2nd): the one a step aimed at it cuts.
    grants: HashMap<(String, u32), Grant>,
    /// Each client's last grant: the run's other locks, which a jump cuts too.
    last: HashMap<String, Grant>,
    /// Each lock key a jump expired, by server: the step that did (its place).
    expired_by: HashMap<(String, String), usize>,
    /// How far a clock jumps: the lease, so that every key it finds expires.
    by_ms: u64,
    skipped: Vec<(usize, String)>,
    nemesis: Nemesis,
}

/// The record a lock key is for (`…:r1`: `r1`).
fn record_of(key: &str) -> &str {
    key.rsplit(':').next().unwrap_or(key)
}

/// What else a jump expired, by record: ` (and r0's lock with it)`.
fn with_it(keys: &[String], pttl_before_ms: &[i64]) -> String {
    let others: Vec<&str> = (keys.iter().zip(pttl_before_ms).skip(1))
        .filter(|(_, left)| **left >= 0)
        .map(|(key, _)| record_of(key))
        .collect();
    match others.as_slice() {
        [] => String::new(),
        [one] => format!(" (and {one}'s lock with it)"),
        many => format!(" (and the locks of {} with it)", many.join(", ")),
    }
}

impl ClockPlay {
    pub fn new(clock: &Schedule, lane: &Lane, by_ms: u64, stage: &Stage) -> Result<ClockPlay> {
        let mut urls: HashMap<String, &String> = (lane.masters.urls.iter().enumerate())
            .map(|(i, url)| (redlock_lane::name(i), url))
            .collect();
        if let Some(url) = &lane.redis_url {
            urls.insert("redis".into(), url);
        }
        let mut servers = HashMap::new();
        for step in clock.steps() {
            let Some(url) = urls.get(&step.target) else {
                bail!("{}: this run has no such server", step.target);
            };
            if !servers.contains_key(&step.target) {
                let server = crate::connect::redis(url)?;
                servers.insert(step.target.clone(), (url.to_string(), Some(server)));
            }
        }
        Ok(ClockPlay {
            steps: clock.steps().to_vec(),
            feed: Feed::new(clock, stage),
            servers,
            grants: HashMap::new(),
            last: HashMap::new(),
            expired_by: HashMap::new(),
            by_ms,
            skipped: Vec::new(),
            nemesis: Nemesis::new(),
        })
    }

    /// Shows the player what the stage logged, and jumps the clocks that fall due.
    pub fn tick(&mut self, stage: &mut Stage) -> Result<()> {
        if self.steps.is_empty() {
            return Ok(());
        }
        let (grants, last) = (&mut self.grants, &mut self.last);
        let (due, _) = self.feed.due(stage, |event| {
            if let What::Acquired(acquired) = &event.what
                && let Some(key) = &acquired.lock
            {
                let grant = Grant {
                    key: key.clone(),
                    owner: acquired.owner.clone(),
                    t_ms: event.t_ms,
                    nth: last.get(&event.worker).map_or(0, |g| g.nth) + 1,
                };
                grants.insert((event.worker.clone(), grant.nth), grant.clone());
                last.insert(event.worker.clone(), grant);
            }
        });
        for action in due {
            let Some(index) = action.step else { continue };
            if let Err(why) = self.jump(stage, index) {
                self.skipped.push((index, why));
            }
        }
        Ok(())
    }

    /// Jumps the clock of step `index`'s server; Err: why it did not play.
    fn jump(&mut self, stage: &mut Stage, index: usize) -> Result<(), String> {
        let step = &self.steps[index];
        let target = step.target.clone();
        let (holder, nth) = step
            .after
            .as_ref()
            .map_or(("", 0), |a| (a.worker.as_str(), a.nth));
        let grant = (self.grants.get(&(holder.to_string(), nth)))
            .ok_or_else(|| format!("{holder}'s grant #{nth} was never seen"))?
            .clone();
        let late = (stage.elapsed().as_millis() as u64).saturating_sub(grant.t_ms);
        let record = record_of(&grant.key).to_string();
        // The grant's key first (the step's own), then the run's other lock keys: a jump of
        // the server's clock expires every key there, not just the one it was aimed at.
        let mut keys = vec![grant.key.clone()];
        for other in self.last.values() {
            if !keys.contains(&other.key) {
                keys.push(other.key.clone());
            }
        }
        let by_ms = self.by_ms;
        let words = |jump: &Jump| {
            let left = jump.pttl_before_ms[0].max(0) as u64;
            let after = match left.checked_sub(by_ms) {
                Some(ms) if ms > 0 => format!("{ms}ms"),
                _ => "expired".into(),
            };
            Note::new(
                format!(
                    "{target}'s clock jumps {by_ms}ms ahead under {holder}'s lock of {record} \
                     — simulated: the key's TTL cut, as if the server's clock jumped: \
                     {left}ms left → {after}{}",
                    with_it(&keys, &jump.pttl_before_ms)
                ),
                FaultFacts {
                    backend: Some("redis".into()),
                    master: target.starts_with('m').then(|| target.to_string()),
                    ..FaultFacts::default()
                },
            )
        };
        let (url, connected) =
            (self.servers.get_mut(&target)).ok_or_else(|| format!("this run has no {target}"))?;
        // Taken: a connection that fails is made again for the next jump (a restart).
        let mut server = match connected.take() {
            Some(server) => server,
            None => crate::connect::redis(url)
                .map_err(|err| format!("{target} did not answer ({})", err.root_cause()))?,
        };
        let owner = grant.owner.as_deref();
        let jump = (self.nemesis)
            .jump_server_clock(stage, &mut server, &target, &keys, owner, by_ms, words)
            .map_err(|err| format!("{target} did not answer ({})", err.root_cause()))?;
        if let Some((_, connected)) = self.servers.get_mut(&target) {
            *connected = Some(server);
        }
        if jump.found_its_key() {
            for (key, left) in keys.iter().zip(&jump.pttl_before_ms) {
                if *left >= 0 && *left as u64 <= by_ms {
                    self.expired_by.insert((target.clone(), key.clone()), index);
                }
            }
            return Ok(());
        }
        let why = match self.expired_by.get(&(target.clone(), grant.key.clone())) {
            _ if jump.pttl_before_ms[0] >= 0 => {
                "another client had taken it since (let go, or expired)".to_string()
            }
            Some(earlier) if *earlier != index => {
                format!("step {}'s jump had expired it already", earlier + 1)
            }
            _ if target.starts_with('m') => {
                "let go, expired, or never granted there (Redlock needs only a majority)".into()
            }
            _ => "let go, or expired".into(),
        };
        Err(format!(
            "{holder}'s lock of {record} (grant #{nth}) was not on {target} when its clock was \
             to jump, {late}ms after the grant — {why}: nothing to expire"
        ))
    }

    /// After the clients are done: the steps that never played, and why.
    pub fn finish(self) -> Vec<(Step, String)> {
        self.feed.unplayed(&self.steps, self.skipped)
    }
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
