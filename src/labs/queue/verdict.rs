//! Lab 10's verdict: per way of queueing, what the servers counted and in which order the
//! waiters were served; for the expiries, what the frozen workers learned and what the
//! store took. Decided by [`crate::check::queue`] and [`crate::check::late_write`].

use std::time::Duration;

use anyhow::{Context, Result};
use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value};

use super::Plan;
use super::verdict_churn::{ChurnVerdict, ElectionVerdict, say_churn, say_election};
use crate::check::queue::{
    QueueFacts, Woken, per_handover, queue_facts, skipped_the_gap, woken_waiter,
};
use crate::check::{Finding, LateWrite};
use crate::events::facts::{ServerCount, Turn};
use crate::events::{Event, Kind, What};
use crate::labs::replay::{self, Replayed};
use crate::labs::runner;
use crate::labs::words::Words;
use crate::nemesis::schedule::Schedule;
use crate::output::human;
use crate::store::ReadBack;

pub struct Verdict {
    pub(crate) plan: Plan,
    pub queues: Vec<QueueVerdict>,
    pub churn: Option<ChurnVerdict>,
    pub expiry: Option<ExpiryVerdict>,
    pub election: Option<ElectionVerdict>,
    pub owner_txn: Option<super::owner_txn::OwnerTxnFound>,
}

/// One way of queueing, read back.
#[derive(Clone, Debug, Serialize)]
pub struct QueueVerdict {
    pub way: String,
    #[serde(flatten)]
    pub facts: QueueFacts,
    pub server: ServerCount,
    /// The server's request count for the whole queue, per hand-over.
    pub server_requests_per_handover: Option<f64>,
    /// etcd's watch events sent, per hand-over.
    pub watch_events_per_handover: Option<f64>,
}

impl QueueVerdict {
    /// Reads one way's queue: `way` as `--json` names it (`etcd_recipe`).
    pub fn new(way: &str, turns: &[Turn], server: ServerCount) -> QueueVerdict {
        let facts = queue_facts(turns);
        QueueVerdict {
            way: way.into(),
            server_requests_per_handover: per_handover(server.requests, facts.handovers),
            watch_events_per_handover: per_handover(server.watch_events, facts.handovers),
            facts,
            server,
        }
    }
}

/// The expiry part, read back.
#[derive(Clone, Debug, Serialize)]
pub struct ExpiryVerdict {
    pub lease_ms: u64,
    pub freeze_ms: u64,
    /// The queued waiter frozen past its lease: what it said when it woke.
    pub frozen_waiter: Woken,
    /// The waiter behind it, woken by its key's delete, looked again and waited on the
    /// holder; it took the lock only after the holder's key was gone.
    pub skipped_the_gap: Option<bool>,
    pub holder_token: i64,
    pub next_token: Option<i64>,
    /// The woken holder's write, decided after the next holder's: refused, taken or none.
    pub late_write: &'static str,
    /// The woken holder reported that its key was gone before it let go.
    pub holder_learned: bool,
    pub store: ReadBack,
    /// The faults the part played (its schedule), when it was played live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
}

impl ExpiryVerdict {
    /// Reads the expiry part from its events and the store's read-back.
    pub fn from_log(
        log: &[Event],
        late: LateWrite,
        store: ReadBack,
        lease: Duration,
        freeze: Duration,
    ) -> ExpiryVerdict {
        let saw = |worker: &str, kind: Kind| log.iter().any(|e| e.is(worker, kind));
        let h_key = log.iter().find_map(|e| match &e.what {
            What::Queued(q) if e.worker == "H" => q.key.clone(),
            _ => None,
        });
        let woke_behind_holder = log.iter().any(|e| match &e.what {
            What::Woke(w) if e.worker == "W2" => w.ahead.is_some() && w.ahead == h_key,
            _ => false,
        });
        let token_of = |worker: &str| {
            log.iter()
                .find(|e| e.is(worker, Kind::Acquired))
                .and_then(Event::token)
        };
        let holder_token = token_of("H").unwrap_or_default();
        let next_token = token_of("W2");
        ExpiryVerdict {
            lease_ms: lease.as_millis() as u64,
            freeze_ms: freeze.as_millis() as u64,
            frozen_waiter: woken_waiter(saw("W1", Kind::Lost), saw("W1", Kind::Acquired)),
            skipped_the_gap: skipped_the_gap(woke_behind_holder, next_token, holder_token)
                .as_option(),
            holder_token,
            next_token,
            late_write: late.as_str(),
            holder_learned: saw("H", Kind::Lost),
            store,
            schedule: None,
        }
    }
}

impl ExpiryVerdict {
    /// Judges the expiry part from its history, the store's read-back in it included. The
    /// live run and `lockslab check` both judge this way.
    pub fn from_history(log: &[Event], lease: Duration, freeze: Duration) -> Result<ExpiryVerdict> {
        let read = replay::read_back(log)?;
        let late = crate::check::late_write(&read.attempts, "H", "W2");
        Ok(ExpiryVerdict::from_log(log, late, read, lease, freeze))
    }
}

/// `lockslab check`: each way of queueing counted again from its `handovers` event (the
/// waiters' turns and the server's counts), and the churn, expiry and election parts judged
/// again from their own events and the store's read-back.
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let mut replayed = Replayed::default();
    let recorded_queues = verdict.get("queues").and_then(Value::as_array);
    for event in events {
        let What::Handovers(h) = &event.what else {
            continue;
        };
        let recorded = recorded_queues
            .and_then(|queues| queues.iter().find(|q| q["way"] == h.way.as_str()))
            .with_context(|| format!("the verdict has no queue {}", h.way))?;
        let found = QueueVerdict::new(&h.way, &h.turns, h.server.clone());
        replayed.part(format!("queue {}", h.way), recorded, &found);
    }
    let part = |name: &str| replay::part_of(events, |e| e.part.scenario.as_deref() == Some(name));
    if let Some(recorded) = verdict.get("churn") {
        let log = replayed.with_read_back(part("churn"), recorded, Some("store"))?;
        replayed.part("churn", recorded, ChurnVerdict::from_history(&log)?);
    }
    if let Some(recorded) = verdict.get("expiry") {
        let log = replayed.with_read_back(part("expiry"), recorded, Some("store"))?;
        let ms = |field: &str| replay::number(recorded, field).map(Duration::from_millis);
        let found = ExpiryVerdict::from_history(&log, ms("lease_ms")?, ms("freeze_ms")?)?;
        replayed.part("expiry", recorded, found);
    }
    if let Some(recorded) = verdict.get("election") {
        let log = replayed.with_read_back(part("election"), recorded, Some("store"))?;
        replayed.part("election", recorded, ElectionVerdict::from_history(&log)?);
    }
    if verdict.get("owner_txn").is_some() {
        replayed.not_replayed.push(
            "the owner transaction (`owner_txn`): its answers are not in the history yet".into(),
        );
    }
    Ok(replayed)
}

impl runner::Verdict for Verdict {
    /// Each way of queueing's order, then the churn, the expiry and the election:
    /// `etcd-recipe: first come, first served · expiry: stale write refused`.
    fn headline(&self) -> String {
        let mut parts: Vec<String> = self
            .queues
            .iter()
            .map(|q| {
                let order = if q.facts.fair {
                    "first come, first served"
                } else {
                    "served out of order"
                };
                let tokens = if q.facts.tokens_grow {
                    ""
                } else {
                    ", a token reused"
                };
                format!("{}: {order}{tokens}", q.way.replace('_', "-"))
            })
            .collect();
        if let Some(churn) = &self.churn {
            let f = &churn.facts;
            let kept = f.nobody_held_twice && f.nobody_skipped && f.store_in_order;
            let outcome = if kept { "line kept" } else { "line broken" };
            parts.push(format!("churn: {outcome}"));
        }
        let late = |word: &str| match word {
            "accepted" => "stale write ACCEPTED",
            "rejected" => "stale write refused",
            _ => "no stale write",
        };
        if let Some(expiry) = &self.expiry {
            parts.push(format!("expiry: {}", late(expiry.late_write)));
        }
        if let Some(election) = &self.election {
            parts.push(format!("election: {}", late(election.facts.late_write)));
        }
        parts.join(" · ")
    }

    fn fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("waiters".into(), self.plan.waiters.into());
        fields.insert("hold_ms".into(), (self.plan.hold.as_millis() as u64).into());
        fields.insert(
            "queues".into(),
            serde_json::to_value(&self.queues).unwrap_or_default(),
        );
        if let Some(churn) = &self.churn {
            fields.insert(
                "churn".into(),
                serde_json::to_value(churn).unwrap_or_default(),
            );
        }
        if let Some(expiry) = &self.expiry {
            fields.insert(
                "expiry".into(),
                serde_json::to_value(expiry).unwrap_or_default(),
            );
        }
        if let Some(election) = &self.election {
            fields.insert(
                "election".into(),
                serde_json::to_value(election).unwrap_or_default(),
            );
        }
        if let Some(found) = &self.owner_txn {
            fields.insert(
                "owner_txn".into(),
                serde_json::to_value(found).unwrap_or_default(),
            );
        }
        fields
    }

    fn words(&self) -> Words {
        let mut words = Words::new();
        if !self.queues.is_empty() {
            say_queues(&mut words, &self.queues, self.plan.waiters);
            if self.churn.is_some() || self.expiry.is_some() || self.election.is_some() {
                words.stop(&crate::labs::step::queue::VERDICT_FAULTS);
            }
        }
        if let Some(churn) = &self.churn {
            say_churn(&mut words, churn);
        }
        if let Some(expiry) = &self.expiry {
            say_expiry(&mut words, expiry);
        }
        if let Some(election) = &self.election {
            say_election(&mut words, election);
        }
        if let Some(found) = &self.owner_txn {
            found.say(&mut words);
        }
        words
    }

    fn checkpoint(&self) -> Option<&'static crate::labs::step::Checkpoint> {
        Some(&crate::labs::step::queue::VERDICT)
    }
}

fn ratio(value: Option<f64>) -> String {
    value.map_or("?".into(), |v| format!("{v:.1}"))
}

/// A hand-over time: microseconds below a millisecond, else milliseconds with one decimal.
fn micros(value: Option<u64>) -> String {
    match value {
        None => "?".into(),
        Some(us) if us < 1000 => format!("{us}µs"),
        Some(us) => format!("{:.1}ms", us as f64 / 1000.0),
    }
}

/// The herd part's words: the table of the ways of queueing, then a sentence per way.
fn say_queues(words: &mut Words, queues: &[QueueVerdict], waiters: u32) {
    let header = [
        "way",
        "wake-ups/handover",
        "server requests/handover",
        "watch events/handover",
        "handover p50",
        "p99",
        "served in asking order",
    ];
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            vec![
                q.way.to_string(),
                ratio(q.facts.wakeups_per_handover),
                ratio(q.server_requests_per_handover),
                ratio(q.watch_events_per_handover).replace('?', "—"),
                micros(q.facts.handover_p50_us),
                micros(q.facts.handover_p99_us),
                if q.facts.fair {
                    "yes".green().to_string()
                } else {
                    format!("no, {} overtakes", q.facts.overtakes)
                        .red()
                        .to_string()
                },
            ]
        })
        .collect();
    words
        .blank()
        .heading(format!("The queue, {waiters} waiters:"));
    if queues.iter().any(|q| !q.facts.fair) {
        words.prose("  (an overtake: a waiter served before one that had asked earlier)");
    }
    words.table(&header, rows);
    for q in queues {
        let total = q
            .server
            .requests
            .map_or("an unknown number of".into(), |n| n.to_string());
        let line = format!(
            "{}: the server counted {total} requests for the whole queue ({}). Served, by \
             token, in this order of asking: {}.{}{}",
            q.way,
            q.server.source,
            q.facts
                .order_got
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(" "),
            if q.facts.tokens_grow {
                ""
            } else {
                " A token did not grow from one holder to the next."
            },
            if q.facts.never_served > 0 {
                format!(" {} waiters were never served.", q.facts.never_served)
            } else {
                String::new()
            },
        );
        words.prose(format!("  {line}"));
    }
    words.prose(
        "  A hand-over is timed from the moment the holder sent its release to the moment \
         the next holder's grant returned to it, on the machine's monotonic clock.",
    );
}

/// The expiry part's words: what the frozen waiter, the waiter behind it and the frozen
/// holder each found.
fn say_expiry(words: &mut Words, expiry: &ExpiryVerdict) {
    words.blank().heading(format!(
        "Expiry: {} leases, each freeze {}:",
        human(Duration::from_millis(expiry.lease_ms)),
        human(Duration::from_millis(expiry.freeze_ms))
    ));
    let w1 = match expiry.frozen_waiter {
        Woken::LearnedItWasGone => "W1, frozen while queued, woke to find its key gone and \
                                    left the queue without ever holding the lock."
            .green()
            .to_string(),
        Woken::Held => "W1, frozen while queued, took the lock when it woke."
            .red()
            .to_string(),
        Woken::Silent => "W1, frozen while queued, said nothing of its place when it woke."
            .yellow()
            .to_string(),
    };
    words.prose(format!("  {w1}"));
    let gap = match expiry.skipped_the_gap.map_or(Finding::Unknown, |yes| {
        if yes { Finding::Yes } else { Finding::No }
    }) {
        Finding::Yes => format!(
            "W2, woken by W1's delete, looked again, found H still ahead and waited on it; \
             it took the lock once H's key was gone, with token {} (H's was {}).",
            expiry.next_token.unwrap_or_default(),
            expiry.holder_token
        )
        .green()
        .to_string(),
        Finding::No => "W2 did not wait on H after W1's key went."
            .red()
            .to_string(),
        Finding::Unknown => "W2 looked again after W1's key went, but never held the lock."
            .yellow()
            .to_string(),
    };
    words.prose(format!("  {gap}"));
    let late = match expiry.late_write {
        "rejected" => format!(
            "H, frozen while holding, woke and wrote with token {}: the store refused it, \
             having taken W2's write with token {}.",
            expiry.holder_token,
            expiry.next_token.unwrap_or_default()
        )
        .green()
        .to_string(),
        "accepted" => "H's late write was taken, after W2's.".red().to_string(),
        _ => "H's write was not decided after W2's.".yellow().to_string(),
    };
    words.prose(format!("  {late}"));
    if expiry.holder_learned {
        words.prose("  Then H read its key back and found it gone: it was no longer the holder.");
    }
}
