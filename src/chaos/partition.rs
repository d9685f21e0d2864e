//! Chaos's partitions (issue 44): each client of a schedule that holds one on a host of its
//! own ([`crate::hosts`]), each server it talks to at the address of a host of its own, so
//! that the one player cuts a client off from them with real dropped packets.
//!
//! ```text
//!  client A ──▶ door (host A) ══ A–redis ══▶ relay (host redis) ──▶ chaos's Redis
//!           └─▶ door (host A) ══ A–store ══▶ relay (host store) ──▶ Postgres
//!  client B ──▶ door (host B) ══ B–redis ══▶ …
//!
//!  partition "A": the links A–redis and A–store drop every packet, both ways, silently
//! ```
//!
//! The servers are the ones every schedule uses (a lane's Redis, etcd, the store, Redlock's
//! masters): a relay gives each an address on a host, and a door lets each client's
//! connections leave from its own host. Nothing is restarted or re-addressed, so a
//! partition costs a schedule only its hosts (a few namespaces, made and gone with it).
//!
//! Unlike `cut` (the fault proxy, which holds what a client sends in userspace), nobody
//! holds anything here: the kernel drops the packets, the client's TCP retransmits them,
//! and once the partition heals the same connections carry on — what the client sent
//! meanwhile lands late, as after a real network's outage. A new connection made during
//! the partition is not refused either: it times out.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Result;

use crate::hosts::{Door, Hosts, Relay, Sides};
use crate::nemesis::Fault;
use crate::nemesis::play::Cue;
use crate::nemesis::schedule::Schedule;
use crate::proxy;

/// Does this schedule cut a client off (and so play on hosts)?
pub fn wanted_by(schedule: &Schedule) -> bool {
    (schedule.steps().iter()).any(|step| step.fault == Fault::Partition)
}

/// One schedule's hosts: a host per client and per server, a relay into each server's host,
/// a door out of each client's host to each server.
pub struct Network {
    hosts: Arc<Hosts>,
    /// Where each server's relay listens (by the server's host name).
    at: HashMap<String, SocketAddr>,
    /// Each client's door to each server, by (client, server).
    doors: HashMap<(String, String), Door>,
    /// Dropped after the doors (fields drop in order): no door is left carrying into a
    /// relay already closed.
    _relays: Vec<Relay>,
}

impl Network {
    /// Hosts for `clients` and for `servers` (each a name and the URL lockslab reaches it
    /// at), every client able to reach every server across their link.
    pub fn start(clients: &[String], servers: &[(String, String)]) -> Result<Network> {
        let names: Vec<&str> = (clients.iter().map(String::as_str))
            .chain(servers.iter().map(|(name, _)| name.as_str()))
            .collect();
        let hosts = Arc::new(Hosts::new(&names)?);
        let mut at = HashMap::new();
        let mut relays = Vec::new();
        for (server, url) in servers {
            let to = proxy::upstream_of(url)?;
            relays.push(hosts.relay(server, to.port(), to)?);
            at.insert(
                server.clone(),
                SocketAddr::new(hosts.addr(server)?.into(), to.port()),
            );
        }
        let mut doors = HashMap::new();
        for client in clients {
            for (server, addr) in &at {
                let door = hosts.door_ready(client, *addr)?;
                doors.insert((client.clone(), server.clone()), door);
            }
        }
        Ok(Network {
            hosts,
            at,
            doors,
            _relays: relays,
        })
    }

    /// The hosts, for the player's partitions.
    pub fn hosts(&self) -> &Hosts {
        &self.hosts
    }

    /// `client`'s URL of `server` (found at `url`): through its door, from its own host.
    pub fn url(&self, client: &str, server: &str, url: &str) -> Result<String> {
        match self.doors.get(&(client.to_string(), server.to_string())) {
            Some(door) => proxy::through(url, door.addr()),
            None => Ok(url.to_string()),
        }
    }

    /// The servers' hosts.
    pub fn servers(&self) -> Vec<&str> {
        self.at.keys().map(String::as_str).collect()
    }
}

/// The history's words for a partition of chaos's, or its heal (None: not one).
pub fn words(cue: &Cue) -> Option<String> {
    let target = &cue.action.target;
    let sides: Sides = target.parse().ok()?;
    let mut named = sides.named();
    let client = named.next()?.to_string();
    let rest: Vec<&str> = named.collect();
    let from = if rest.is_empty() {
        "every server it talks to".to_string()
    } else {
        rest.join(", ")
    };
    match cue.action.fault {
        Fault::Partition => Some(format!(
            "cuts {client}'s host off from {from} (a partition, network namespaces): every \
             packet between them dropped, both ways; {client} runs on, its connections hang"
        )),
        Fault::Heal => Some(format!(
            "the partition heals ({target}): {client}'s connections resume, and what it sent \
             meanwhile goes out"
        )),
        _ => None,
    }
}
