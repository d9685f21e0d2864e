//! Lab 5's verdict: one row per scenario, decided by the checkers of
//! [`crate::check::failover`] from the servers' answers and the store's record, and the
//! sentences that say why.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::check::failover::{self as checks, LateWriteSeen, TokenOrder};
use crate::check::report::{self, Report};
use crate::check::{self, Finding, LateWrite};
use crate::events::What;
use crate::events::{Event, Kind};
use crate::labs::replay::{self, Replayed};
use crate::labs::words::Words;
use crate::labs::{Conclusion, runner};
use crate::output::human;
use crate::store::ReadBack;
use crate::worker::sentinel_client::Rule;

/// How two writes of one scenario were decided, and what that says.
#[derive(Serialize, Debug, Clone, Copy)]
pub struct StaleWrite {
    /// A's write was decided after B's accepted write.
    pub attempted: bool,
    /// Whether the store took it; null when there was none.
    pub accepted: Option<bool>,
}

/// One row of the verdict. Every field is read back from a server or from the store.
#[derive(Serialize, Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub backend: &'static str,
    /// Two clients held the lock at once, per the servers' answers.
    pub two_holders: Option<bool>,
    /// B's token was not higher than A's (the source handed a number out again); null
    /// without tokens.
    pub token_reissued: Option<bool>,
    pub stale_write: StaleWrite,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub election_ms: Option<u64>,
    /// The fencing rule the store applied (`not_lower`, `higher_or_same_holder`), if any.
    pub store_rule: Option<Rule>,
    pub a_token: Option<i64>,
    pub b_token: Option<i64>,
    pub final_writer: Option<String>,
    /// `redis-wait`: what the primary answered A's `WAIT 1` (replicas that had its key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replicas_confirmed: Option<i64>,
    /// etcd with its majority gone: what the client was told.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// `redis-min-replicas`: the primary's answer to A's `SET NX` (`NOREPLICAS …`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// etcd on hosts: what this run saw that the table has no column for (a stalled
    /// leader's effect on a lease), as read back from the members.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<String>,
    pub attempts: Vec<crate::store::Attempt>,
    /// A's write in the store's decision order (the JSON carries it as `stale_write`).
    #[serde(skip)]
    pub(super) late: LateWrite,
    /// The store has an attempt of A's.
    #[serde(skip)]
    pub(super) a_wrote: bool,
}

impl Scenario {
    /// A row read from the store's record, with the lock service's answer on two holders.
    pub(super) fn from_store(
        name: &str,
        backend: &'static str,
        two_holders: Finding,
        rule: Option<Rule>,
        read: ReadBack,
        a: &str,
        b: &str,
    ) -> Result<Scenario> {
        let Ok(writes) = checks::writes(
            two_holders,
            &read.attempts,
            read.final_writer.as_deref(),
            a,
            b,
        ) else {
            bail!("the store's record for {name} disagrees with itself");
        };
        Ok(Scenario {
            two_holders: writes.two_holders.as_option(),
            token_reissued: writes.tokens.map(TokenOrder::reissued),
            stale_write: StaleWrite {
                attempted: writes.late.attempted(),
                accepted: writes.late.accepted(),
            },
            store_rule: rule,
            a_token: writes.a_token,
            b_token: writes.b_token,
            final_writer: read.final_writer,
            attempts: read.attempts,
            late: writes.late,
            a_wrote: writes.a_wrote,
            ..Scenario::nothing_granted(name, backend)
        })
    }

    /// A row where the lock service granted nothing: no holder, no token, no write.
    pub(super) fn nothing_granted(name: &str, backend: &'static str) -> Scenario {
        Scenario {
            name: name.into(),
            backend,
            two_holders: Some(false),
            token_reissued: None,
            stale_write: StaleWrite {
                attempted: false,
                accepted: None,
            },
            failover_ms: None,
            election_ms: None,
            store_rule: None,
            a_token: None,
            b_token: None,
            final_writer: None,
            replicas_confirmed: None,
            unavailable: None,
            refused: None,
            observed: None,
            attempts: Vec::new(),
            late: LateWrite::None,
            a_wrote: false,
        }
    }

    /// The table's "late write" cell, as the checker reads it.
    fn late_write_seen(&self) -> LateWriteSeen {
        let a_checked = self.replicas_confirmed.is_some() || self.refused.is_some();
        checks::late_write_seen(self.late, a_checked, self.a_wrote)
    }

    fn meaning(&self) -> String {
        let tokens = match (
            checks::token_order(self.a_token, self.b_token),
            self.a_token,
            self.b_token,
        ) {
            (Some(TokenOrder::Lower), Some(a), Some(b)) => {
                format!("B's token {b} is lower than A's {a}")
            }
            (Some(TokenOrder::Again), Some(a), _) => format!("B drew A's token {a} again"),
            (Some(TokenOrder::Higher), Some(a), Some(b)) => {
                format!("B's token {b} is higher than A's {a}")
            }
            _ => "no tokens".into(),
        };
        if let Some(answer) = &self.refused {
            return format!(
                "the primary refused A's SET ({answer}): no replica in reach, so no lock \
                 was granted for the failover to lose"
            );
        }
        if let Some(observed) = &self.observed {
            return observed.clone();
        }
        if let Some(error) = &self.unavailable {
            return format!(
                "no majority: etcd granted nothing ({error}) — unavailable, not unsafe"
            );
        }
        if let Some(confirmed) = self.replicas_confirmed {
            let holders = if self.two_holders == Some(true) {
                "two holders all the same"
            } else {
                "one holder"
            };
            let a = if self.a_wrote {
                "A wrote anyway"
            } else {
                "A wrote nothing"
            };
            let b = match self.final_writer.as_deref() {
                Some(writer) => format!("{writer}'s result stands"),
                None => "the store holds nothing".into(),
            };
            return format!("{holders}; A's WAIT 1 answered {confirmed}, {a}; {b}");
        }
        let store = match self.late {
            LateWrite::Accepted => "A's late write ACCEPTED, B's result lost",
            LateWrite::Rejected => "A's late write rejected",
            LateWrite::None => "no late write",
        };
        let holders = match self.two_holders {
            Some(true) => "two holders",
            Some(false) => "one holder at a time",
            None => "holders unknown",
        };
        format!("{holders}; {tokens}; {store}")
    }
}

/// Every row of the run, and the lock TTL they were played with.
pub struct Verdict {
    pub ttl: Duration,
    pub scenarios: Vec<Scenario>,
    /// The split brain's rounds (`--scenario split-brain`), decided from the history.
    pub split_brain: Vec<super::split_check::SplitRow>,
}

impl runner::Verdict for Verdict {
    fn fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("ttl_ms".into(), (self.ttl.as_millis() as u64).into());
        fields.insert(
            "scenarios".into(),
            serde_json::to_value(&self.scenarios).unwrap_or_default(),
        );
        if !self.split_brain.is_empty() {
            fields.insert(
                "split_brain".into(),
                serde_json::to_value(&self.split_brain).unwrap_or_default(),
            );
        }
        fields
    }

    fn words(&self) -> Words {
        let mut words = if self.scenarios.is_empty() {
            Words::new()
        } else {
            verdict_words(&self.scenarios)
        };
        if !self.split_brain.is_empty() {
            super::split_check::words(&mut words, &self.split_brain);
        }
        words
    }

    fn checkpoint(&self) -> Option<&'static crate::labs::step::Checkpoint> {
        Some(&crate::labs::step::failover::VERDICT)
    }

    fn headline(&self) -> String {
        let scenarios: Vec<String> = self
            .scenarios
            .iter()
            .map(|s| {
                format!(
                    "{}: {}, {}",
                    s.name,
                    crate::room::holders_word(s.two_holders),
                    crate::room::stale_write_word(s.stale_write.attempted, s.stale_write.accepted)
                )
            })
            .chain(self.split_brain.iter().map(super::split_check::headline))
            .collect();
        scenarios.join(" · ")
    }
}

/// The store's line on the timeline for a scenario whose A wrote after B.
/// (The checker's conclusion, said on the timeline, not recorded.)
pub(super) fn store_line(scenario: &Scenario) -> Option<Conclusion> {
    let holds = scenario.final_writer.as_deref().unwrap_or("nobody");
    let (broken, decided) = match scenario.late {
        LateWrite::Accepted => (true, "taken"),
        LateWrite::Rejected => (false, "refused"),
        LateWrite::None => return None,
    };
    Some(Conclusion {
        lane: "store",
        text: format!(
            "{}: A's write decided after B's: {decided}; holds {holds}'s result",
            scenario.name
        ),
        broken,
    })
}

/// The scenarios whose two holders wrote to the store, with the label their workers carry
/// (`A:incr`, `B:incr`): both `incr` scenarios share one pair of holders, one write each.
const WRITING_SCENARIOS: [(&str, &str); 7] = [
    ("redis-unfenced", "unfenced"),
    ("redis-incr-not-lower", "incr"),
    ("redis-incr-same-holder", "incr"),
    ("redis-incr-lost", "incr-lost"),
    ("durable-token", "durable"),
    ("redis-wait", "wait"),
    (ETCD_SCENARIO, "etcd"),
];

const ETCD_SCENARIO: &str = "etcd-leader-killed";

/// The label of a scenario's workers; None for a scenario where nothing was granted.
fn label_of(name: &str) -> Option<&'static str> {
    WRITING_SCENARIOS
        .iter()
        .find(|(scenario, _)| *scenario == name)
        .map(|(_, label)| *label)
}

/// etcd queues B behind A: two holders only if A's release found its lock already gone and
/// B was granted it.
fn etcd_two_holders(events: &[Event], a: &str, b: &str) -> Result<Finding> {
    let a_kept = events
        .iter()
        .find(|e| e.is(a, Kind::Released))
        .and_then(Event::released)
        .context("A's release is not in the history")?;
    let b_got = events.iter().any(|e| e.is(b, Kind::Acquired));
    Ok(check::two_holders_queued(a_kept, b_got))
}

/// Lab 5's checker: the whole history, every scenario whose holders wrote, judged as one
/// [`Report`] through [`Scenario::from_store`], the function its verdict's rows are read
/// through. Each scenario whose workers are in the history gives two findings:
///
/// - **mutual exclusion**: did the lock service hand the lock to B while A held it? For
///   etcd, proved by A's release (it found its key still there, or gone) and B's grant. For
///   Redis, by the store deciding A's write after B's accepted one; otherwise the answer is
///   in the PTTLs the lab read live, which the history does not carry: unknown;
/// - **stale write**: did the store take A's write after B's? Proved by the store's
///   read-back of the scenario's resource and the writes (or A's `WAIT` that stopped it).
///
/// A scenario whose read-back is missing is unknown, with the reason, never a pass. The
/// scenarios where nothing was granted (min-replicas, a lost majority) have no write to
/// judge and no finding. Each finding's events are positions in `history`.
pub fn check(history: &[Event]) -> Report {
    let played = WRITING_SCENARIOS.iter().filter(|(_, label)| {
        let a = format!("A:{label}");
        history.iter().any(|e| e.worker == a)
    });
    let crash = played.map(|&(name, label)| {
        check_scenario(history, name, label).about(&format!("scenario {name}"))
    });
    Report::compose(crash.chain([super::split_check::check(history)]))
}

/// One scenario's findings; event positions are in `history`.
fn check_scenario(history: &[Event], name: &str, label: &str) -> Report {
    let (a, b) = (format!("A:{label}"), format!("B:{label}"));
    let resource = format!("failover-{name}");
    let evidence = |why: String| Report::evidence_missing(why);
    let Some(read_back_at) = history.iter().rposition(|e| {
        matches!(&e.what, What::ReadBack(r) if r.resource.as_deref() == Some(resource.as_str()))
    }) else {
        return evidence(format!(
            "the store's read-back of {resource} is missing from the history"
        ));
    };
    let read = replay::read_back_of(&history[read_back_at..], Some(&resource))
        .expect("the read-back just found");
    let etcd = name == ETCD_SCENARIO;
    let from_lock = if etcd {
        match etcd_two_holders(history, &a, &b) {
            Ok(found) => found,
            Err(why) => return evidence(format!("{why:#}")),
        }
    } else {
        Finding::Unknown
    };
    let backend = if etcd { "etcd" } else { "redis" };
    let found = match Scenario::from_store(name, backend, from_lock, None, read, &a, &b) {
        Ok(found) => found,
        Err(why) => return evidence(format!("{why:#}")),
    };
    let at = |worker: &str, kind: Kind| history.iter().position(|e| e.is(worker, kind));
    // A worker's write to this scenario's resource (etcd's writes name none).
    let wrote = |worker: &str| {
        history.iter().position(|e| {
            e.is(worker, Kind::Wrote)
                && matches!(&e.what, What::Wrote(w)
                    if w.resource.as_deref().is_none_or(|r| r == resource))
        })
    };
    let mut exclusion = vec![at(&a, Kind::Acquired), at(&b, Kind::Acquired)];
    let exclusion_words = if found.late.attempted() {
        exclusion.push(Some(read_back_at));
        "the store decided A's write after B's accepted one: B was granted the lock before A \
         let go"
    } else if etcd {
        exclusion.push(at(&a, Kind::Released));
        match from_lock {
            Finding::Yes => "A's release found its key gone and B was granted: two holders",
            _ => "A's release found its key still holding the lock: etcd granted B only after",
        }
    } else {
        "the PTTLs that order B's grant against A's lease were read live and are not in the \
         history: Redis's answers here cannot say"
    };
    let mut writes = vec![Some(read_back_at), wrote(&a), wrote(&b)];
    let (outcome, stale_words) = match found.late {
        LateWrite::Accepted | LateWrite::Rejected => late_write_decided(found.late),
        LateWrite::None if !found.a_wrote => {
            writes.push(at(&a, Kind::Lost));
            (
                report::Outcome::Valid,
                "the store has no write of A's: nothing of A's came after B's",
            )
        }
        LateWrite::None => (
            report::Outcome::Valid,
            "the store decided A's write before B's: nothing was lost",
        ),
    };
    Report::exclusion_and_stale_write(
        found.two_holders,
        (exclusion_words, exclusion.into_iter().flatten()),
        (outcome, stale_words, writes.into_iter().flatten()),
        wrote(&a).filter(|_| found.late.attempted()),
    )
}

/// The stale-write finding of a write of A's the store decided after B's: taken (B's
/// result lost) or refused. (`LateWrite::None` is each checker's own to word.)
pub(super) fn late_write_decided(late: LateWrite) -> (report::Outcome, &'static str) {
    match late {
        LateWrite::Accepted => (
            report::Outcome::Invalid,
            "the store decided A's write after B's and took it: B's result is lost",
        ),
        _ => (
            report::Outcome::Valid,
            "the store decided A's write after B's and refused it: B's result stands",
        ),
    }
}

/// `lockslab check`: each scenario whose writes the store decided, judged again from the
/// store's read-back of its resource by [`Scenario::from_store`] — the tokens, the late
/// write, the final writer. etcd's two holders are judged again from the releases and the waiter's
/// grant; Redis's rest on the PTTLs the lab read live, which the history does not carry:
/// that part is taken as recorded and held against the store's order.
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let mut replayed = Replayed::default();
    for recorded in replay::list(verdict, "scenarios")? {
        let name = replay::text(recorded, "name")?;
        // Nothing granted (refused, or no majority): no write to judge.
        let Some(label) = label_of(name) else {
            continue;
        };
        let (a, b) = (format!("A:{label}"), format!("B:{label}"));
        let resource = format!("failover-{name}");
        let read = replayed.read_back_or_recorded(events, Some(&resource), recorded, None)?;
        let etcd = name == ETCD_SCENARIO;
        let from_lock = if etcd {
            etcd_two_holders(events, &a, &b)?
        } else {
            match recorded["two_holders"].as_bool() {
                Some(true) => Finding::Yes,
                Some(false) => Finding::No,
                None => Finding::Unknown,
            }
        };
        let backend = if etcd { "etcd" } else { "redis" };
        let found = Scenario::from_store(name, backend, from_lock, None, read, &a, &b)?;
        replay_part(recorded, &found, &mut replayed);
    }
    if !replay::list(verdict, "scenarios")?.is_empty() {
        replayed.not_replayed.push(
            "the lock service's part of the Redis rows' `two_holders` (the PTTLs the old and \
             the new primary answered, which the history does not carry yet) is taken as \
             recorded, and held against the store's order of the writes"
                .into(),
        );
    }
    // The split brain's rounds, after the crash's rows as the verdict lists them.
    if let Some(Value::Array(rounds)) = verdict.get("split_brain") {
        super::split_check::replay(events, rounds, &mut replayed);
    }
    Ok(replayed)
}

/// A row judged again (`found`) beside the recorded one: the fields the store's record
/// decides.
pub(super) fn replay_part(recorded: &Value, found: &Scenario, replayed: &mut Replayed) {
    let row = json!({
        "two_holders": found.two_holders,
        "token_reissued": found.token_reissued,
        "stale_write": found.stale_write,
        "a_token": found.a_token,
        "b_token": found.b_token,
        "final_writer": found.final_writer,
        "attempts": found.attempts,
    });
    replayed.part(found.name.as_str(), recorded, row);
}

/// The verdict's words: a row per scenario, a sentence on each, and the caveats of the
/// scenarios that used WAIT or min-replicas-to-write.
fn verdict_words(scenarios: &[Scenario]) -> Words {
    let yes_no = |v: Option<bool>| match v {
        Some(true) => "YES".red().bold().to_string(),
        Some(false) => "no".green().to_string(),
        None => "-".to_string(),
    };
    let rows: Vec<Vec<String>> = scenarios
        .iter()
        .map(|s| {
            let stale = match s.late_write_seen() {
                LateWriteSeen::Accepted => "ACCEPTED".red().bold().to_string(),
                LateWriteSeen::Rejected => "rejected".green().to_string(),
                LateWriteSeen::NotMade => "not made".green().to_string(),
                LateWriteSeen::None => "none".to_string(),
            };
            let tokens = match (
                checks::token_order(s.a_token, s.b_token),
                s.a_token,
                s.b_token,
            ) {
                (Some(order), Some(a), Some(b)) => match order {
                    TokenOrder::Again => format!("{a}→{b} {}", "again".red().bold()),
                    TokenOrder::Lower => format!("{a}→{b} {}", "lower".red().bold()),
                    TokenOrder::Higher => format!("{a}→{b}"),
                },
                _ => "-".into(),
            };
            let time = s
                .failover_ms
                .map(|ms| format!("{} failover", human(Duration::from_millis(ms))))
                .or(s
                    .election_ms
                    .map(|ms| format!("{} election", human(Duration::from_millis(ms)))))
                .unwrap_or_else(|| "unavailable".into());
            vec![s.name.clone(), yes_no(s.two_holders), tokens, stale, time]
        })
        .collect();
    let header = ["scenario", "2 holders", "tokens A→B", "late write", "time"];
    let mut words = Words::titled_table("Verdict", &header, rows);
    for scenario in scenarios {
        words.about(scenario.name.clone(), scenario.meaning());
    }
    if scenarios.iter().any(|s| s.replicas_confirmed == Some(0)) {
        words.blank();
        for line in [
            "WAIT buys detection: A learned that its lock lived on the primary only",
            "and wrote nothing. It is not consensus: the primary had granted the",
            "lock anyway (two holders) and WAIT rolls nothing back. An answer of 1",
            "makes the lock's survival more likely, not certain: Sentinel may",
            "promote a replica that never acknowledged and pass over the one that",
            "did. Nor does it order writes: it hands out no token.",
        ] {
            words.aside(line);
        }
    }
    if scenarios.iter().any(|s| s.refused.is_some()) {
        words.blank();
        for line in [
            "min-replicas-to-write 1 turns the lost lock into a refused one, and",
            "leaves two gaps. A replica counts as good until its last",
            "acknowledgement is over min-replicas-max-lag seconds old (10 by default):",
            "a lock granted inside that window can still die with the primary. And",
            "an old primary cut off from the Sentinels, but not from the clients",
            "beside it, keeps granting locks for that long after it loses its",
            "replica, while the Sentinels promote another. Set on every node, it",
            "also refuses writes on a promoted replica that has no replica yet.",
        ] {
            words.aside(line);
        }
    }
    words
}
