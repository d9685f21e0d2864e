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
//!  mid-round, the same split A ── m1 m2  ╳  B ── m3 m4 m5, landing during A's round,
//!  timed from A's grant event:
//!    once m2 has granted A   A: 2 of 5, refused; its release deletes m1's and m2's keys
//!                            B: m3 m4 m5, granted
//!    once m3 has granted A   A: 3 of 5, granted; B: m3 answers nil (A's key), refused
//! ```
//!
//! Redlock's masters never talk to each other, so a partition between masters changes
//! nothing by itself: what it changes is which masters each client reaches. Every verdict
//! is read back from the masters themselves, over their Unix sockets (which no partition
//! cuts): each one's GET and PTTL of the key.

use std::sync::Arc;

use anyhow::{Context, Result, bail};

use super::scene::{READ_TIMEOUT, Scene, name, round};
use super::verdict::{ScenarioVerdict, left_by_failed};
use crate::check::Finding;
use crate::check::redlock::{self as check, MasterState};
use crate::events::{Kind, What};
use crate::hosts::{Door, HOSTED_REDIS_PORT, HostedRedis, Hosts};
use crate::labs::faults::Faults;
use crate::lock::redlock::{Attempt, Master, Redlock, Reply, RoundOrder};
use crate::nemesis::Fault;
use crate::nemesis::schedule::{Anchor, Schedule, Step};
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
        let before = self.split_mid_round(&net, Landing::BeforeQuorum)?;
        let after = self.split_mid_round(&net, Landing::AfterQuorum)?;
        Ok(vec![cut, split, before, after])
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
        let (b, read, two) = self.b_asks_while_split(net, (&mut a_lock, &a), &mut b_lock);
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

    /// B's round once A's is over, the split still in place; the masters read back right
    /// after it, over their sockets; whether both held a majority's grant at once; then
    /// the release of whichever round held (a failed round has released everywhere
    /// already: the algorithm's own step).
    fn b_asks_while_split(
        &mut self,
        net: &Net,
        (a_lock, a): (&mut Redlock, &Attempt),
        b_lock: &mut Redlock,
    ) -> (Attempt, Vec<MasterState>, bool) {
        let b = self.acquire("B", b_lock);
        let key = b_lock.key.clone();
        let read = self.hosted_read_back(net, &key, "the masters, right after both rounds");
        let two = check::two_holders(&self.round(a), &self.round(&b)) == Finding::Yes;
        for (client, lock, attempt) in [("A", a_lock, a), ("B", b_lock, &b)] {
            if attempt.held {
                self.release(client, lock, attempt);
            }
        }
        (b, read, two)
    }

    /// Parts 3 and 4: the masters split while A's round is under way. The same split both
    /// times — A's side m1…m(q−1), B's side the other n − q + 1, a majority — landing once
    /// A has q − 1 grants (it cannot reach a quorum any more), then once it has q (it has
    /// its quorum already, one of it on B's side). The split is a step of the part's
    /// schedule timed from A's grant event, played by the player between two of A's
    /// requests; B asks once A's round is over, the masters are read back over their
    /// sockets while the split lasts, the holder releases, and the split heals.
    fn split_mid_round(&mut self, net: &Net, landing: Landing) -> Result<ScenarioVerdict> {
        let (n, q) = (self.n(), self.q());
        let grants = landing.grants_before_cut(q);
        let (a_side, b_side): (Vec<String>, Vec<String>) = (
            (0..q - 1).map(name).collect(),
            (q - 1..n).map(name).collect(),
        );
        let title = format!(
            "{}. The masters split {}/{} during A's round, A on the {}: once {} has granted it \
             ({})",
            landing.number(),
            b_side.len(),
            a_side.len(),
            a_side.len(),
            name(grants - 1),
            landing.said()
        );
        self.heading(landing.scenario(), &title);
        let sides = format!("a,{}|b,{}", a_side.join(","), b_side.join(","));
        let key = self.key(landing.scenario());
        let (mut a_lock, _a_doors) = self.client_on(net, "a", &key)?;
        let (mut b_lock, _b_doors) = self.client_on(net, "b", &key)?;
        connect_ahead(&mut a_lock)?;
        connect_ahead(&mut b_lock)?;
        // Asked all at once, A's requests would all be out before its first answer came.
        a_lock.settings.round = RoundOrder::Sequential;
        if self.settings.round != RoundOrder::Sequential {
            self.note(
                "A asks one master after another in this part (whatever --round says): the \
                 split lands between two of its requests",
            );
        }
        let schedule = Schedule::new(vec![Step {
            at_ms: 0,
            after: Some(Anchor::on("A", Kind::Granted, grants as u32)),
            fault: Fault::Partition,
            target: sides.clone(),
            duration_ms: None,
        }]);
        crate::labs::faults::show(&self.stage, &schedule);
        let words = format!(
            "splits the masters in the middle of A's round: A with {}, B with {}",
            a_side.join(", "),
            b_side.join(", ")
        );
        let mut faults = Faults::new(&schedule, &self.stage)
            .on_hosts(&net.hosts)
            .saying(move |_| words.clone().into());
        let a = self.acquire_playing("A", &mut a_lock, &mut faults)?;
        if !faults.acted(Fault::Partition, &sides) {
            bail!(
                "{}: A's round ended with {} grants, before the {grants} the split waited for",
                landing.scenario(),
                a.granted
            );
        }
        let landed = self.landed_after();
        let (b, read, two) = self.b_asks_while_split(net, (&mut a_lock, &a), &mut b_lock);
        let (stage, nemesis) = (&mut self.stage, &mut self.nemesis);
        let heal = (Fault::Heal, sides.as_str());
        stage.play_now(&mut faults, nemesis, &mut [], heal, "heals the split")?;
        let left = left_by_failed(&[("A", a.held), ("B", b.held)], &read);
        let meaning = mid_round_meaning(&a, &b, &read, (&a_side, &b_side), two);
        let meaning = format!("The split landed {landed}: {meaning}");
        Ok(ScenarioVerdict {
            name: landing.scenario(),
            granted: b.held,
            quorum: q,
            validity_ms: b.validity_ms,
            two_holders: Some(two),
            left_after_release: Some(left),
            meaning,
            rounds: vec![round("A", &a), round("B", &b)],
            read_back: read,
            prevented_by: "a quorum, and the release on every master: a round cut short of \
                           its quorum takes back what it got, and a quorum formed before the \
                           cut keeps a master on the other side",
            schedule: Some(faults.schedule().clone()),
            ..Default::default()
        })
    }

    /// When the split landed, by the part's history: after the last of A's grants recorded
    /// before the partition ("once m2 had granted A (2 of 5 so far)").
    fn landed_after(&self) -> String {
        let log = &self.stage.log;
        let cut = log.iter().position(|e| e.kind() == Kind::NetFault);
        let grant = cut.and_then(|at| {
            log[..at].iter().rev().find_map(|e| match &e.what {
                What::Granted(g) => Some(g),
                _ => None,
            })
        });
        match grant {
            Some(g) => format!(
                "once {} had granted A ({} of {} so far)",
                g.answer.master, g.granted, g.masters
            ),
            None => "after A's round, not during it".to_string(),
        }
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

/// Opens `lock`'s connection to every master (a PING through its door) before its round:
/// no request of the round then waits on a connection being made into a host, which on a
/// busy machine can outlast the per-instance timeout. A connection open when the split
/// lands hangs, as an established connection does when its packets vanish.
fn connect_ahead(lock: &mut Redlock) -> Result<()> {
    for master in &mut lock.masters {
        master
            .command::<String>(&redis::cmd("PING"), CONNECT_AHEAD)
            .map_err(|why| anyhow::anyhow!("{} did not answer PING: {why}", master.name))?;
    }
    Ok(())
}

/// How long a master may take to answer the PING that opens a connection ahead.
const CONNECT_AHEAD: std::time::Duration = std::time::Duration::from_secs(5);

/// When the split lands in A's round: one grant short of its quorum, or with it.
#[derive(Clone, Copy)]
enum Landing {
    BeforeQuorum,
    AfterQuorum,
}

impl Landing {
    fn scenario(self) -> &'static str {
        match self {
            Landing::BeforeQuorum => "partition-split-before-quorum",
            Landing::AfterQuorum => "partition-split-after-quorum",
        }
    }

    /// The grants A has when the split lands (quorum `q`).
    fn grants_before_cut(self, q: usize) -> usize {
        match self {
            Landing::BeforeQuorum => q - 1,
            Landing::AfterQuorum => q,
        }
    }

    fn number(self) -> u8 {
        match self {
            Landing::BeforeQuorum => 7,
            Landing::AfterQuorum => 8,
        }
    }

    fn said(self) -> &'static str {
        match self {
            Landing::BeforeQuorum => "one short of its quorum",
            Landing::AfterQuorum => "its quorum already",
        }
    }
}

/// What a split in the middle of A's round came to, from both rounds and the masters read
/// back while it lasted.
fn mid_round_meaning(
    a: &Attempt,
    b: &Attempt,
    read: &[MasterState],
    (a_side, b_side): (&[String], &[String]),
    two: bool,
) -> String {
    let n = a.answers.len();
    let outcome = |attempt: &Attempt| {
        if attempt.held {
            format!("granted, validity {}ms", attempt.validity_ms)
        } else {
            "refused".to_string()
        }
    };
    let held_by = |client: &str| {
        let masters: Vec<&str> = (read.iter())
            .filter(|s| s.holder.as_deref() == Some(client))
            .map(|s| s.master.as_str())
            .collect();
        match masters.is_empty() {
            true => "none".to_string(),
            false => masters.join(", "),
        }
    };
    let deleted: Vec<&str> = (a.released.iter())
        .filter(|answer| answer.reply == Reply::Deleted)
        .map(|answer| answer.master.as_str())
        .collect();
    let short_of_quorum = format!(
        "A's round fell short of a quorum, so it released on all {n} masters at once; the \
         release deleted its key on {} (the masters it still reached), and B, on the \
         majority's side, was granted.",
        if deleted.is_empty() {
            "none".to_string()
        } else {
            deleted.join(", ")
        }
    );
    format!(
        "A with {} and B with {}. A set the key on {} of {n} in a round of \
         {}ms: {}. B set it on {} of {n}: {}. Read back while the split lasted, A's value \
         was on {}, B's on {}. {}",
        a_side.join(", "),
        b_side.join(", "),
        a.granted,
        a.elapsed_whole_ms(),
        outcome(a),
        b.granted,
        outcome(b),
        held_by("A"),
        held_by("B"),
        if two {
            "Both held a majority's grant at once."
        } else if a.held {
            "B's side is the network's majority, yet a master of it had granted A before the \
             cut: B cannot reach a quorum while A's key lives there."
        } else {
            &short_of_quorum
        }
    )
}
