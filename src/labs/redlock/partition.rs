//! Scenario `partition` (issue 44): the masters and the clients on hosts of their own
//! (network namespaces), and real partitions between them — packets dropped both ways,
//! nobody told.
//!
//! ```text
//!  cut     A ── m1 m2 m3 ✓      A ╳ m4 m5: A's SETs there get no answer within the
//!                               per-instance timeout; 3 of 5 is a quorum: granted
//!  split   A ── m1 m2 m3   ╳   B ── m4 m5: both ask while it lasts, A then B, each
//!                               reaching its own side's masters only;
//!          A: 3 of 5, granted   B: 2 of 5, refused (and released where it set)
//! ```
//!
//! Redlock's masters never talk to each other, so a partition between masters changes
//! nothing by itself: what it changes is which masters each client reaches. Every verdict
//! is read back from the masters themselves, over their Unix sockets (which no partition
//! cuts): each one's GET and PTTL of the key.

use std::sync::Arc;

use anyhow::{Context, Result};

use super::scene::{READ_TIMEOUT, Scene, name, round};
use super::verdict::ScenarioVerdict;
use crate::check::Finding;
use crate::check::redlock::{self as check, MasterState};
use crate::hosts::{Door, HOSTED_REDIS_PORT, HostedRedis, Hosts};
use crate::labs::faults::Faults;
use crate::lock::redlock::{Master, Redlock};
use crate::nemesis::Fault;
use crate::nemesis::schedule::Schedule;
use crate::output::human;

/// The partition's masters and clients, on their hosts.
struct Net {
    hosts: Arc<Hosts>,
    masters: Vec<HostedRedis>,
    /// Its directory: the masters' files and sockets.
    _dir: crate::cluster::RunDir,
}

impl Scene {
    /// Both parts: a client cut from a minority of the masters, then the masters split
    /// between two clients.
    pub(super) fn play_partition(&mut self) -> Result<Vec<ScenarioVerdict>> {
        let net = self.start_hosts()?;
        let cut = self.client_cut(&net)?;
        let split = self.masters_split(&net)?;
        Ok(vec![cut, split])
    }

    /// A host per master and per client, a Redis on each master's host.
    fn start_hosts(&mut self) -> Result<Net> {
        let masters: Vec<String> = (0..self.n()).map(name).collect();
        let mut names = vec!["a", "b"];
        names.extend(masters.iter().map(String::as_str));
        let hosts = Hosts::new(&names).context(
            "the partition scenario puts each master and each client on a host of its own \
             (a network namespace), which this machine does not allow (`lockslab doctor` \
             says why)",
        )?;
        let dir = crate::cluster::RunDir::new()?;
        let password = crate::seed::os_hex(24);
        let mut started = Vec::new();
        for master in &masters {
            started.push(hosts.start_redis(master, dir.path(), &password)?);
        }
        Ok(Net {
            hosts: Arc::new(hosts),
            masters: started,
            _dir: dir,
        })
    }

    /// A Redlock client on `host`: every master reached through a door from that host.
    fn client_on(&self, net: &Net, host: &str, key: &str) -> Result<(Redlock, Vec<Door>)> {
        let mut doors = Vec::new();
        let mut masters = Vec::new();
        for (i, redis) in net.masters.iter().enumerate() {
            let to = (net.hosts.addr(&redis.host)?, HOSTED_REDIS_PORT).into();
            let door = net.hosts.door(host, to)?;
            let at = format!("@{}:{HOSTED_REDIS_PORT}", net.hosts.addr(&redis.host)?);
            let url = redis.url.replace(&at, &format!("@{}", door.addr()));
            masters.push(Master::new(&name(i), &url));
            doors.push(door);
        }
        Ok((Redlock::new(masters, key, self.settings.clone()), doors))
    }

    /// Plays a partition (or its heal) of `sides` now, as a step of the player's schedule.
    fn cut(&mut self, net: &Net, (fault, sides): (Fault, &str), words: String) -> Result<()> {
        let mut faults = Faults::new(&Schedule::default(), &self.stage).on_hosts(&net.hosts);
        let (stage, nemesis) = (&mut self.stage, &mut self.nemesis);
        stage.play_now(&mut faults, nemesis, &mut [], (fault, sides), words)
    }

    /// Part 1: A cut off from the last n − q masters; its round.
    fn client_cut(&mut self, net: &Net) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        self.heading(
            "partition-cut",
            &format!(
                "5. A client cut from {} of {n} masters (a real partition)",
                n - q
            ),
        );
        let cut_off: Vec<String> = (q..n).map(name).collect();
        let sides = format!("a|{}", cut_off.join(","));
        let key = self.key("partition-cut");
        let (mut lock, _doors) = self.client_on(net, "a", &key)?;
        let words = format!("cuts A's host off from {}", cut_off.join(" and "));
        self.cut(net, (Fault::Partition, &sides), words)?;
        let a = self.acquire("A", &mut lock);
        let read = self.hosted_read_back(net, &key, "the masters, right after A's round");
        if a.held {
            self.release("A", &mut lock, &a);
        }
        let words = format!("heals: A reaches {} again", cut_off.join(" and "));
        self.cut(net, (Fault::Heal, &sides), words)?;
        Ok(ScenarioVerdict {
            name: "partition-cut",
            granted: a.held,
            quorum: q,
            validity_ms: a.validity_ms,
            meaning: format!(
                "A reached {} of {n} masters; {} gave no answer within the {} per-instance \
                 timeout (nothing refused: the packets vanished), and {} of {n} set the \
                 key: {}, validity {}ms",
                n - cut_off.len(),
                cut_off.join(" and "),
                human(self.settings.instance_timeout),
                a.granted,
                if a.held { "granted" } else { "refused" },
                a.validity_ms
            ),
            rounds: vec![round("A", &a)],
            read_back: read,
            prevented_by: "nothing to prevent: a quorum is what lets a round survive a \
                           minority it cannot reach",
            ..Default::default()
        })
    }

    /// Part 2: the masters split q / n − q, A with the first side, B with the second;
    /// both ask while the split lasts (A, then B) — each reaches only its own side.
    fn masters_split(&mut self, net: &Net) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        self.heading(
            "partition-split",
            &format!("6. The masters split {q}/{}: a client on each side", n - q),
        );
        let (left, right): (Vec<String>, Vec<String>) =
            ((0..q).map(name).collect(), (q..n).map(name).collect());
        let sides = format!("a,{}|b,{}", left.join(","), right.join(","));
        let key = self.key("partition-split");
        let (mut a_lock, _a_doors) = self.client_on(net, "a", &key)?;
        let (mut b_lock, _b_doors) = self.client_on(net, "b", &key)?;
        let words = format!(
            "splits the masters: A with {}, B with {}",
            left.join(", "),
            right.join(", ")
        );
        self.cut(net, (Fault::Partition, &sides), words)?;
        let a = self.acquire("A", &mut a_lock);
        let b = self.acquire("B", &mut b_lock);
        let read = self.hosted_read_back(net, &key, "the masters, right after both rounds");
        let two = check::two_holders(&self.round(&a), &self.round(&b)) == Finding::Yes;
        // A round that failed has released everywhere already (the algorithm's own step).
        for (client, lock, attempt) in [("A", &mut a_lock, &a), ("B", &mut b_lock, &b)] {
            if attempt.held {
                self.release(client, lock, attempt);
            }
        }
        self.cut(net, (Fault::Heal, &sides), "heals the split".into())?;
        Ok(ScenarioVerdict {
            name: "partition-split",
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: Some(two),
            meaning: format!(
                "A's side set the key on {} of {n}: {}; B's side on {} of {n}: {}. {}",
                a.granted,
                if a.held { "granted" } else { "refused" },
                b.granted,
                if b.held { "granted" } else { "refused" },
                if two {
                    "Both held a majority's grant at once."
                } else {
                    "Only the side with a majority of the masters can be granted: never both."
                }
            ),
            rounds: vec![round("A", &a), round("B", &b)],
            read_back: read,
            prevented_by: "a quorum of the masters: two sides cannot both hold a majority",
            ..Default::default()
        })
    }

    /// GET and PTTL of `key` on every hosted master, asked over its socket; recorded as the
    /// masters' answers.
    fn hosted_read_back(&mut self, net: &Net, key: &str, heading: &str) -> Vec<MasterState> {
        let mut states = Vec::new();
        for (i, redis) in net.masters.iter().enumerate() {
            let mut master = Master::new(&name(i), &redis.control_url());
            let port = net.hosts.addr(&redis.host).map_or_else(
                |_| HOSTED_REDIS_PORT.to_string(),
                |addr| format!("{addr}:{HOSTED_REDIS_PORT}"),
            );
            states.push(self.state_of(&name(i), port, master.read(key, READ_TIMEOUT)));
        }
        self.record_masters(key, heading, &states);
        states
    }
}
