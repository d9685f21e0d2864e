//! Chaos's network faults (lab 8's, drawn from a seed): a client's path to a server goes
//! through a fault proxy of its own ([`crate::proxy`]) when its schedule aims a fault at
//! that path, and the fault is played from the live history like the others.
//!
//! ```text
//!  client A ──▶ proxy "A→store" ──▶ Postgres     delay: A's next write arrives late
//!  client A ──▶ proxy "A→redis" ──▶ Redis        lost reply: A's next lock request is
//!                                                 applied, its answer thrown away
//!  client A ──▶ proxy "A→redis" ──▶ Redis        cut: for 1.25 to 3 leases nothing A
//!           └─▶ proxy "A→store" ──▶ Postgres          sends gets through; it goes out,
//!                                                     in order, when the cut heals
//! ```
//!
//! A cut is a partition between client A and every server it talks to. Its proxies hold
//! what A sends rather than reset A's connections: a partition shorter than TCP's
//! patience loses no byte, the kernel resends them once it heals — so A's write, sent
//! under a lease that ran out meanwhile, still lands, late. Cutting A from its lock server
//! alone would show less: A's write would reach the store at once, inside its lease, and
//! only its release and its renewals would fail (liveness, not safety).
//!
//! Only the paths a schedule aims at get a proxy: the other clients, and the other
//! schedules, talk to their servers directly, at the speed they always do.

use std::collections::HashMap;

use anyhow::{Result, bail};

use crate::designs::Design;
use crate::labs::{Feed, Stage};
use crate::nemesis::generate::{self, PATH_ARROW, STORE};
use crate::nemesis::schedule::{Schedule, Step};
use crate::nemesis::{Fault, Nemesis};
use crate::proxy::{self, Direction, NetFault, Proxy, Seen};

/// The longest delay chaos plays, as for a pause.
const LONGEST_DELAY_MS: u64 = 60_000;

/// The server a design's client asks for its lock: a lost reply is aimed at that path. The
/// designs whose lock, or check, is in Postgres ask the store. Redlock's five masters are
/// not proxied: chaos draws no lost reply for its designs (the matrix shows `-`).
pub fn lock_server(design: Design) -> &'static str {
    if design.uses_redis() {
        "redis"
    } else if design.uses_etcd() {
        "etcd"
    } else {
        STORE
    }
}

fn is_network(step: &Step) -> bool {
    matches!(step.fault, Fault::Delay | Fault::DropReply | Fault::Cut)
}

/// The schedule's steps the nemesis plays on processes and servers ([`crate::labs::faults`]),
/// and those it plays on the proxy's paths.
pub fn split(schedule: &Schedule) -> (Schedule, Schedule) {
    let (net, rest): (Vec<Step>, Vec<Step>) =
        schedule.steps().iter().cloned().partition(is_network);
    (Schedule::new(rest), Schedule::new(net))
}

/// The schedule without `client`: the steps aimed at it, timed from its events, or aimed
/// at one of its paths (shrinking's "a client fewer").
pub fn without_client(schedule: &Schedule, client: &str) -> Schedule {
    let rest = schedule.without_worker(client);
    let kept = rest
        .steps()
        .iter()
        .filter(|step| client_of(&step.target) != client);
    Schedule::new(kept.cloned().collect())
}

/// Checks a given schedule's network steps (`--schedule`): a delay on a client's path to
/// the store, with how long; a lost reply on its path to the design's lock server; at most
/// one of each per path. Returns the other steps, for the usual checks.
pub fn validate(schedule: &Schedule, clients: &[String], design: Design) -> Result<Schedule> {
    let (rest, net) = split(schedule);
    let mut seen = std::collections::HashSet::new();
    let cut = |client: &str| {
        (net.steps().iter()).any(|s| s.fault == Fault::Cut && client_of(&s.target) == client)
    };
    for step in net.steps() {
        let (client, server) = step
            .target
            .split_once(PATH_ARROW)
            .unwrap_or((step.target.as_str(), ""));
        if step.fault != Fault::Cut && cut(client) {
            bail!(
                "{} aims at {}, whom a cut already holds on every path: a client with a cut \
                 takes no other network fault",
                step.fault.as_str(),
                step.target
            );
        }
        if !clients.iter().any(|c| c == client) {
            bail!(
                "{} aims at '{}': a path is a client and a server, e.g. {}",
                step.fault.as_str(),
                step.target,
                generate::path("A", STORE)
            );
        }
        let (wanted, what) = match step.fault {
            Fault::Delay => (STORE, "a delay aims at a client's writes to the store"),
            Fault::Cut => (
                lock_server(design),
                "a cut aims at a client's path to its lock server (its path to the store is \
                 cut with it)",
            ),
            _ => (
                lock_server(design),
                "a lost reply aims at a client's lock requests",
            ),
        };
        if server != wanted {
            bail!(
                "{} aims at '{}': {what}, {} for {}",
                step.fault.as_str(),
                step.target,
                generate::path(client, wanted),
                design.name()
            );
        }
        match (step.fault, step.duration_ms) {
            (Fault::Delay | Fault::Cut, None | Some(0)) => {
                bail!(
                    "the {} on {} needs a duration_ms of at least 1 (0 ms: no fault at all)",
                    step.fault.as_str(),
                    step.target
                )
            }
            (Fault::Delay | Fault::Cut, Some(ms)) if ms > LONGEST_DELAY_MS => {
                bail!(
                    "a {} of {ms} ms is longer than chaos plays (at most {LONGEST_DELAY_MS} ms)",
                    step.fault.as_str()
                )
            }
            (Fault::DropReply, Some(_)) => {
                bail!("a lost reply has no duration (the reply to one request is lost)")
            }
            _ => {}
        }
        if !seen.insert((step.fault, step.target.clone())) {
            bail!("{} aims at {} twice", step.fault.as_str(), step.target);
        }
        if let Some(anchor) = &step.after
            && !clients.contains(&anchor.worker)
        {
            bail!(
                "the schedule times a step after '{}', which is not a client",
                anchor.worker
            );
        }
    }
    Ok(rest)
}

/// The proxies of one history: one per path its schedule aims at.
#[derive(Default)]
pub struct Paths {
    proxies: HashMap<String, Proxy>,
}

impl Paths {
    /// Starts a proxy for every path `net` aims at, in front of `servers` (name, URL);
    /// a cut's client gets one on its path to the store as well.
    pub fn start(net: &Schedule, servers: &[(&str, Option<&str>)]) -> Result<Paths> {
        let mut paths = Paths::default();
        for step in net.steps() {
            let mut targets = vec![step.target.clone()];
            if step.fault == Fault::Cut {
                targets.push(generate::path(client_of(&step.target), STORE));
            }
            for target in targets {
                if paths.proxies.contains_key(&target) {
                    continue;
                }
                let server = target.split(PATH_ARROW).nth(1).unwrap_or_default();
                let Some((_, Some(url))) = servers.iter().find(|(name, _)| *name == server) else {
                    bail!("{target}: this design has no {server} to aim at");
                };
                let proxy = Proxy::start(&target, proxy::upstream_of(url)?)?;
                paths.proxies.insert(target, proxy);
            }
        }
        Ok(paths)
    }

    /// The paths a cut aimed at `target` holds: the client's path to its lock server,
    /// then its path to the store (one path when the store is its lock server).
    fn cut_of(&self, target: &str) -> Vec<(&String, &Proxy)> {
        let store = generate::path(client_of(target), STORE);
        let mut cut: Vec<(&String, &Proxy)> = Vec::new();
        for path in [target, store.as_str()] {
            if let Some(entry) = self.proxies.get_key_value(path)
                && !cut.iter().any(|(p, _)| *p == entry.0)
            {
                cut.push(entry);
            }
        }
        cut
    }

    /// `client`'s URL of `server`: through its proxy when it has one.
    pub fn url(&self, client: &str, server: &str, url: &str) -> Result<String> {
        match self.proxies.get(&generate::path(client, server)) {
            Some(proxy) => proxy::through(url, proxy.addr()),
            None => Ok(url.to_string()),
        }
    }
}

/// The network steps of one history, played on its [`Paths`] from the stage's events (a
/// `tick` of [`Stage::play_ticking`]); the nemesis records each fault's start, and its end
/// once the proxy says what happened.
pub struct NetPlay<'p> {
    paths: &'p Paths,
    steps: Vec<Step>,
    feed: Feed,
    /// The steps put on a path (by their place), and whether the proxy saw them through.
    armed: Vec<(usize, bool)>,
    /// The steps that came due and could not be put on, and why.
    skipped: Vec<(usize, String)>,
    /// The cuts on (by their step's place), with when they heal (ms of the play).
    cuts: Vec<(usize, u64)>,
    nemesis: Nemesis,
}

impl<'p> NetPlay<'p> {
    pub fn new(net: &Schedule, paths: &'p Paths, stage: &Stage) -> NetPlay<'p> {
        NetPlay {
            paths,
            steps: net.steps().to_vec(),
            feed: Feed::new(net, stage),
            armed: Vec::new(),
            skipped: Vec::new(),
            cuts: Vec::new(),
            nemesis: Nemesis::new(),
        }
    }

    /// Shows the player what the stage logged, puts on the faults that fall due, and ends
    /// those the proxy has seen through.
    pub fn tick(&mut self, stage: &mut Stage) -> Result<()> {
        let (due, now) = self.feed.due(stage, |_| {});
        for action in due {
            let Some((index, step)) = action.step.and_then(|i| Some((i, self.steps.get(i)?)))
            else {
                continue;
            };
            let Some(proxy) = self.paths.proxies.get(&action.target) else {
                let why = format!("no proxy stood on {}", action.target);
                self.skipped.push((index, why));
                continue;
            };
            let client = client_of(&action.target);
            if step.fault == Fault::Cut {
                let ms = step.duration_ms.unwrap_or_default();
                self.armed.push((index, false));
                self.cuts.push((index, now + ms));
                for (path, proxy) in self.paths.cut_of(&action.target) {
                    let words = format!(
                        "cuts {client} off on {path} for {ms}ms (a partition): what {client} \
                         sends there waits in the proxy; {client} runs on"
                    );
                    let fault = (NetFault::Hold, Fault::Cut);
                    (self.nemesis).net_as(stage, proxy, Direction::Up, fault, words.as_str());
                }
                continue;
            }
            self.armed.push((index, false));
            let (fault, words) = match step.fault {
                Fault::Delay => {
                    let ms = step.duration_ms.unwrap_or_default();
                    (
                        NetFault::DelayNext { ms },
                        format!(
                            "delays what {client} sends the store next by {ms}ms (the proxy on \
                             {}): {client} runs on",
                            action.target
                        ),
                    )
                }
                _ => (
                    NetFault::DropReply,
                    format!(
                        "will lose the answer to {client}'s next request (the proxy on {})",
                        action.target
                    ),
                ),
            };
            self.nemesis
                .net(stage, proxy, Direction::Up, fault, words.as_str());
        }
        self.heal_what_was_seen(stage);
        self.heal_cuts(stage, Some(now));
        Ok(())
    }

    /// Heals the cuts whose time is up (all of them: `now` None), the lock server's path
    /// first: what the client sent during the cut goes out, in order.
    fn heal_cuts(&mut self, stage: &mut Stage, now: Option<u64>) {
        let is_due = |until: u64| now.is_none_or(|now| now >= until);
        let due: Vec<usize> = (self.cuts.iter())
            .filter(|(_, until)| is_due(*until))
            .map(|(index, _)| *index)
            .collect();
        self.cuts.retain(|(_, until)| !is_due(*until));
        for index in due {
            let target = &self.steps[index].target;
            let client = client_of(target);
            for (path, proxy) in self.paths.cut_of(target) {
                let words = match now {
                    Some(_) => format!(
                        "the cut on {path} heals: what {client} sent meanwhile goes out, in order"
                    ),
                    None => format!(
                        "the cut on {path} heals as the clients' time is up: what {client} \
                         sent meanwhile goes out"
                    ),
                };
                self.nemesis
                    .heal_net(stage, proxy, Direction::Up, words.as_str());
            }
            for (armed, done) in &mut self.armed {
                *done |= *armed == index;
            }
        }
    }

    /// Ends each fault the proxy has seen through, with what it saw.
    fn heal_what_was_seen(&mut self, stage: &mut Stage) {
        for (path, proxy) in &self.paths.proxies {
            let client = client_of(path);
            for report in proxy.reports() {
                let through = match report.seen {
                    Seen::DelayedSent { .. } => Some(Fault::Delay),
                    Seen::ReplyDropped { .. } => Some(Fault::DropReply),
                    _ => None,
                };
                for (index, done) in &mut self.armed {
                    let step = &self.steps[*index];
                    *done |= Some(step.fault) == through && step.target == *path;
                }
                let words = match report.seen {
                    Seen::DelayedSent { late_ms } => {
                        format!("the proxy on {path} lets {client}'s request go, {late_ms}ms late")
                    }
                    Seen::ReplyDropped { bytes } => format!(
                        "the proxy on {path} threw the answer away ({bytes} bytes) and reset \
                         {client}'s connection: whether its request took effect, {client} \
                         does not know"
                    ),
                    Seen::RequestForwarded { .. }
                    | Seen::ConnectionReset
                    | Seen::WriteHeld
                    | Seen::WriteGated { .. } => {
                        continue;
                    }
                };
                if self.nemesis.faulty_paths().contains(path) {
                    self.nemesis
                        .heal_net(stage, proxy, Direction::Up, words.as_str());
                }
            }
        }
    }

    /// After the clients are done: ends the faults nothing went through (recorded as such);
    /// returns the steps that never played, and why: their event or time never came, or
    /// they were put on a path that nothing went through before the run ended.
    pub fn finish(mut self, stage: &mut Stage) -> Vec<(Step, String)> {
        self.heal_what_was_seen(stage);
        self.heal_cuts(stage, None);
        for path in self.nemesis.faulty_paths() {
            if let Some(proxy) = self.paths.proxies.get(&path) {
                let words = format!(
                    "the run ended before {} sent anything more on {path}",
                    client_of(&path)
                );
                self.nemesis
                    .heal_net(stage, proxy, Direction::Up, words.as_str());
            }
        }
        let mut left = std::mem::take(&mut self.skipped);
        for &(index, done) in &self.armed {
            let path = &self.steps[index].target;
            if !done {
                let why = format!(
                    "it was put on {path}, and {} sent nothing more on it before the run ended",
                    client_of(path)
                );
                left.push((index, why));
            }
        }
        self.feed.unplayed(&self.steps, left)
    }
}

fn client_of(path: &str) -> &str {
    path.split(PATH_ARROW).next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(fault: Fault, target: &str, duration_ms: Option<u64>) -> Step {
        Step {
            at_ms: 10,
            after: None,
            fault,
            target: target.into(),
            duration_ms,
        }
    }

    #[test]
    fn a_schedule_splits_into_the_nemesis_steps_and_the_proxy_steps() {
        let schedule = Schedule::new(vec![
            step(Fault::Pause, "A", Some(900)),
            step(Fault::Delay, "B→store", Some(900)),
            step(Fault::DropReply, "C→redis", None),
        ]);
        let (rest, net) = split(&schedule);
        assert_eq!(rest.steps().len(), 1);
        assert_eq!(net.steps().len(), 2);
    }

    #[test]
    fn a_given_network_step_is_checked_against_the_clients_and_the_design() {
        let clients: Vec<String> = vec!["A".into(), "B".into()];
        let ok = |steps: Vec<Step>, design| validate(&Schedule::new(steps), &clients, design);
        assert!(
            ok(
                vec![step(Fault::Delay, "A→store", Some(900))],
                Design::RedisLock
            )
            .is_ok()
        );
        assert!(
            ok(
                vec![step(Fault::DropReply, "B→etcd", None)],
                Design::EtcdLease
            )
            .is_ok()
        );
        assert!(
            ok(
                vec![step(Fault::DropReply, "B→store", None)],
                Design::Optimistic
            )
            .is_ok()
        );
        assert!(
            ok(
                vec![step(Fault::Cut, "A→redis", Some(2000))],
                Design::RedisLock
            )
            .is_ok()
        );
        for (bad, design) in [
            (step(Fault::Cut, "A→redis", None), Design::RedisLock),
            (step(Fault::Cut, "A→store", Some(2000)), Design::RedisLock),
            (step(Fault::Cut, "A→redis", Some(90_000)), Design::RedisLock),
            (step(Fault::Delay, "A→store", None), Design::RedisLock),
            (step(Fault::Delay, "A→redis", Some(900)), Design::RedisLock),
            (step(Fault::Delay, "Z→store", Some(900)), Design::RedisLock),
            (step(Fault::DropReply, "A→redis", None), Design::EtcdLease),
            (
                step(Fault::DropReply, "A→redis", Some(5)),
                Design::RedisLock,
            ),
            (step(Fault::Delay, "A", Some(900)), Design::RedisLock),
        ] {
            assert!(ok(vec![bad.clone()], design).is_err(), "{bad:?}");
        }
        // A cut holds every path of its client: no other network fault for that client.
        let cut = step(Fault::Cut, "A→redis", Some(2000));
        let delay = |target| step(Fault::Delay, target, Some(900));
        let both = ok(vec![cut.clone(), delay("A→store")], Design::RedisLock);
        assert!(both.is_err(), "{both:?}");
        assert!(ok(vec![cut, delay("B→store")], Design::RedisLock).is_ok());
    }
}
