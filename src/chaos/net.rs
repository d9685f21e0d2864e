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
use crate::nemesis::Fault;
use crate::nemesis::generate::{self, PATH_ARROW, STORE};
use crate::nemesis::play::{Cue, Faults, NetEnd};
use crate::nemesis::schedule::{Schedule, Step};
use crate::proxy::{self, Proxy, Seen};

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

/// The schedule without `client`: the steps aimed at it, timed from its events, aimed at
/// one of its paths, or cutting its host off (shrinking's "a client fewer").
pub fn without_client(schedule: &Schedule, client: &str) -> Schedule {
    let rest = schedule.without_worker(client);
    let names_client = |step: &&Step| {
        step.fault == Fault::Partition
            && (step.target.parse::<crate::hosts::Sides>())
                .is_ok_and(|sides| sides.named().any(|host| host == client))
    };
    let kept = (rest.steps().iter())
        .filter(|step| client_of(&step.target) != client)
        .filter(|step| !names_client(step));
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

    /// `faults` playing on these paths: a network fault aimed at a path is put on its
    /// proxy, a cut of a client's path to its lock server holds its path to the store too
    /// (one path when the store is its lock server), and a delay or a lost reply ends when
    /// the proxy has seen it through.
    pub fn on<'w>(&'w self, mut faults: Faults<'w>) -> Faults<'w> {
        for (path, proxy) in &self.proxies {
            faults = faults.on_path(proxy);
            let store = generate::path(client_of(path), STORE);
            if *path != store && self.proxies.contains_key(&store) {
                faults = faults.cut_spreads(path, &store);
            }
        }
        faults.ending_when_seen()
    }

    /// `client`'s URL of `server`: through its proxy when it has one.
    pub fn url(&self, client: &str, server: &str, url: &str) -> Result<String> {
        match self.proxies.get(&generate::path(client, server)) {
            Some(proxy) => proxy::through(url, proxy.addr()),
            None => Ok(url.to_string()),
        }
    }
}

/// The history's words for a network fault of chaos's (None: not one of a path's).
pub fn words(cue: &Cue, schedule: &Schedule) -> Option<String> {
    let net = cue.net.as_ref()?;
    let path = net.path;
    let target = &cue.action.target;
    let client = client_of(path);
    let ms = (cue.action.step)
        .and_then(|i| schedule.steps().get(i)?.duration_ms)
        .unwrap_or_default();
    Some(match (&net.end, cue.action.fault) {
        (None, Fault::Cut) => format!(
            "cuts {client} off on {path} for {ms}ms (a partition): what {client} sends there \
             waits in the proxy; {client} runs on"
        ),
        (None, Fault::Delay) => format!(
            "delays what {client} sends the store next by {ms}ms (the proxy on {target}): \
             {client} runs on"
        ),
        (None, _) => {
            format!("will lose the answer to {client}'s next request (the proxy on {target})")
        }
        (Some(NetEnd::Timed), _) => {
            format!("the cut on {path} heals: what {client} sent meanwhile goes out, in order")
        }
        (Some(NetEnd::Seen(Seen::DelayedSent { late_ms })), _) => {
            format!("the proxy on {path} lets {client}'s request go, {late_ms}ms late")
        }
        (Some(NetEnd::Seen(Seen::ReplyDropped { bytes })), _) => format!(
            "the proxy on {path} threw the answer away ({bytes} bytes) and reset {client}'s \
             connection: whether its request took effect, {client} does not know"
        ),
        (Some(NetEnd::RunOver(Fault::Cut)), _) => format!(
            "the cut on {path} heals as the clients' time is up: what {client} sent meanwhile \
             goes out"
        ),
        (Some(_), _) => format!("the run ended before {client} sent anything more on {path}"),
    })
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
