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
use crate::lock::redlock::{Answer, Attempt, Master, Redlock, Reply, RoundOrder};
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
            meaning: cut_meaning(&a, &cut_off, self.settings.instance_timeout),
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
    /// the release of whichever round held (a failed round has sent its release to every
    /// master already: the algorithm's own step).
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
            prevented_by: landing.prevented_by(),
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

    /// What keeps the two clients from holding at once, when the split lands so. The
    /// release of a failed round is not it: it frees keys sooner (availability), and the
    /// masters it reaches are the ones B cannot.
    fn prevented_by(self) -> &'static str {
        match self {
            Landing::BeforeQuorum => "a quorum — a round cut short of its quorum holds nothing",
            Landing::AfterQuorum => {
                "a quorum — one formed before the cut keeps a master on the other side, and \
                 any two majorities share a master"
            }
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
        listed(&masters)
    };
    let short_of_quorum = || {
        let deleted = masters_where(&a.released, |reply| *reply == Reply::Deleted);
        let a_on_b_side: Vec<&str> = masters_where(&a.answers, |reply| *reply == Reply::Granted)
            .into_iter()
            .filter(|master| b_side.iter().any(|m| m == master))
            .collect();
        let b_granted = masters_where(&b.answers, |reply| *reply == Reply::Granted);
        let what_b_found = if a_on_b_side.is_empty() {
            format!(
                "Nothing of A's stood on the masters B can reach: A's requests to {} never \
                 arrived while the split lasted, so B found {} free.",
                b_side.join(", "),
                listed(&b_granted)
            )
        } else {
            format!(
                "A's key stayed on {}, on B's side, out of its release's reach.",
                a_on_b_side.join(", ")
            )
        };
        format!(
            "A's round fell short of a quorum, so it released on all {n} masters; the release \
             deleted its key on {} (the masters it still reached, which B cannot). {what_b_found} \
             The release helps availability (those keys need not wait out their TTL); safety \
             comes from A never reaching a quorum.",
            listed(&deleted)
        )
    };
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
            "Both held a majority's grant at once.".to_string()
        } else if a.held {
            "B's side is the network's majority, yet a master of it had granted A before the \
             cut: B cannot reach a quorum while A's key lives there."
                .to_string()
        } else {
            short_of_quorum()
        }
    )
}

/// The masters whose reply in `answers` is one `wanted` accepts, in order.
fn masters_where(answers: &[Answer], wanted: impl Fn(&Reply) -> bool) -> Vec<&str> {
    (answers.iter())
        .filter(|answer| wanted(&answer.reply))
        .map(|answer| answer.master.as_str())
        .collect()
}

/// Master names joined for a sentence, or "none".
fn listed(masters: &[&str]) -> String {
    match masters.is_empty() {
        true => "none".to_string(),
        false => masters.join(", "),
    }
}

/// What A's round across the cut came to, counted from its answers: the masters that
/// granted it, the cut ones that said nothing, and any master on A's side of the cut that
/// missed the per-instance timeout too — nothing cut it, it was slow (a busy machine), and
/// an answer after the timeout counts as none.
fn cut_meaning(a: &Attempt, cut_off: &[String], timeout: std::time::Duration) -> String {
    let n = a.answers.len();
    let is_cut = |master: &str| cut_off.iter().any(|m| m == master);
    let silent = masters_where(&a.answers, |reply| matches!(reply, Reply::NoAnswer { .. }));
    let (silent_cut, silent_on_a_side): (Vec<&str>, Vec<&str>) =
        silent.into_iter().partition(|master| is_cut(master));
    let mut words = format!(
        "A was cut from {}: {} gave no answer within the {} per-instance timeout (nothing \
         refused: the packets vanished).",
        cut_off.join(" and "),
        match silent_cut.len() == cut_off.len() {
            true => "they".to_string(),
            false => listed(&silent_cut),
        },
        human(timeout)
    );
    if !silent_on_a_side.is_empty() {
        words += &format!(
            " {} on A's side of the cut did not answer in time either: nothing cut it, it \
             was too slow (a busy machine), and a late answer counts as none.",
            silent_on_a_side.join(", ")
        );
    }
    let refused = masters_where(&a.answers, |reply| *reply == Reply::Refused);
    if !refused.is_empty() {
        words += &format!(" {} answered nil (the key taken).", refused.join(", "));
    }
    let granted = masters_where(&a.answers, |reply| *reply == Reply::Granted);
    words
        + &format!(
            " {} of {n} granted ({}), quorum {}: {}",
            granted.len(),
            listed(&granted),
            a.quorum,
            if a.held {
                format!("granted, validity {}ms", a.validity_ms)
            } else {
                "refused".to_string()
            }
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The round of the first `kind` event (`acquired`, `gave_up`) of part `scenario` in
    /// a recorded run (`run`: the fixture's lines).
    fn recorded_round(run: &str, kind: &str, scenario: &str) -> Attempt {
        let event = (run.lines())
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .find(|e| e["kind"] == kind && e["scenario"] == scenario)
            .unwrap_or_else(|| panic!("no {kind} event in part {scenario}"));
        serde_json::from_value(event["attempt"].clone()).unwrap()
    }

    /// A's round in the partition-cut part of a recorded run (m4 and m5 cut off).
    fn recorded_cut_round() -> Attempt {
        let run = include_str!("../../../tests/fixtures/redlock-partition.jsonl");
        recorded_round(run, "acquired", "partition-cut")
    }

    const CUT_OFF: [&str; 2] = ["m4", "m5"];

    fn meaning(a: &Attempt) -> String {
        let cut_off = CUT_OFF.map(String::from);
        cut_meaning(a, &cut_off, std::time::Duration::from_millis(50))
    }

    #[test]
    fn the_cut_verdict_counts_the_masters_that_granted() {
        let words = meaning(&recorded_cut_round());
        assert!(words.contains("3 of 5 granted (m1, m2, m3)"), "{words}");
        assert!(!words.contains("A's side of the cut"), "{words}");
    }

    /// On a busy machine m2, which nothing cut, missed the per-instance timeout: A had 2
    /// of 5 and was refused, and the verdict must not say A reached 3.
    #[test]
    fn a_master_on_a_side_that_missed_the_timeout_is_named_and_not_counted() {
        let mut a = recorded_cut_round();
        a.answers[1].reply = Reply::NoAnswer {
            why: "no answer in time".into(),
        };
        (a.granted, a.held) = (2, false);
        let words = meaning(&a);
        assert!(words.contains("2 of 5 granted (m1, m3)"), "{words}");
        assert!(words.contains("refused"), "{words}");
        assert!(
            words.contains("m2 on A's side of the cut did not answer in time"),
            "{words}"
        );
        assert!(!words.contains("3 of 5"), "{words}");
    }

    /// Part 7 of a recorded run: the split lands with A one grant short of its quorum.
    #[test]
    fn a_round_cut_short_holds_nothing_where_b_asks() {
        let run = include_str!("../../../tests/fixtures/redlock-partition-mid-round.jsonl");
        let round = |kind| recorded_round(run, kind, "partition-split-before-quorum");
        let (a, b) = (round("gave_up"), round("acquired"));
        let sides = (
            ["m1", "m2"].map(String::from),
            ["m3", "m4", "m5"].map(String::from),
        );
        let words = mid_round_meaning(&a, &b, &[], (&sides.0, &sides.1), false);
        for said in [
            "deleted its key on m1, m2",
            "Nothing of A's stood on the masters B can reach",
            "B found m3, m4, m5 free",
            "safety comes from A never reaching a quorum",
        ] {
            assert!(words.contains(said), "{said:?} not in: {words}");
        }
    }
}
