//! Lab 10's verdict on the parts where waiters leave: the churn (waiters that give up or
//! are killed from the middle of the line) and the election (a leader frozen past its
//! lease). Decided by [`crate::check::queue`] from etcd's history and the store.

use anyhow::Result;
use colored::Colorize;
use serde::Serialize;

use crate::check::LateWrite;
use crate::check::queue::{
    ChurnFacts, ChurnHistory, ElectionFacts, Grant, Waiter, Wake, churn_facts, election_facts,
};
use crate::events::{Event, Kind, What};
use crate::labs::replay::read_back;
use crate::labs::words::Words;
use crate::nemesis::schedule::Schedule;
use crate::store::ReadBack;

/// The churn part, read back: the checker's facts and the store's record.
#[derive(Clone, Debug, Serialize)]
pub struct ChurnVerdict {
    #[serde(flatten)]
    pub facts: ChurnFacts,
    pub store: ReadBack,
    /// The faults the part played (its schedule), when it was played live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
}

impl ChurnVerdict {
    /// Reads the churn part from its events (the waiters' reports, the nemesis's kills,
    /// etcd's history of the keys) and the store's read-back.
    pub fn from_log(log: &[Event], store: ReadBack) -> ChurnVerdict {
        let history = churn_history(log);
        ChurnVerdict {
            facts: churn_facts(&history, &store.attempts),
            store,
            schedule: None,
        }
    }
}

impl ChurnVerdict {
    /// Judges the churn from its history, the store's read-back in it included. The live
    /// run and `lockslab check` both judge this way.
    pub fn from_history(log: &[Event]) -> Result<ChurnVerdict> {
        Ok(ChurnVerdict::from_log(log, read_back(log)?))
    }
}

/// The churn part's evidence, out of its events.
pub fn churn_history(log: &[Event]) -> ChurnHistory {
    let departed = |name: &str| {
        log.iter().any(|e| match &e.what {
            What::GaveUp(_) => e.worker == name,
            What::Killed(fault) => fault.target.as_deref() == Some(name),
            _ => false,
        })
    };
    let mut history = ChurnHistory {
        waiters: Vec::new(),
        grants: Vec::new(),
        wakes: Vec::new(),
        keys: Err("etcd's history of the keys was not read".into()),
    };
    for event in log {
        let name = event.worker.clone();
        match &event.what {
            What::Queued(q) => history.waiters.push(Waiter {
                departed: departed(&name),
                key: q.key.clone().unwrap_or_default(),
                name,
            }),
            What::Acquired(got) => history.grants.push(Grant {
                waiter: name,
                token: got.token.unwrap_or_default(),
                seen_at: got.seen_at,
            }),
            What::Woke(woke) => history.wakes.push(Wake {
                waiter: name,
                gone: woke.gone.clone().unwrap_or_default(),
                ahead: woke.ahead.clone(),
            }),
            What::QueueKeys(keys) => {
                history.keys = match &keys.unreadable {
                    Some(why) => Err(why.clone()),
                    None => Ok(keys.keys.clone()),
                }
            }
            _ => {}
        }
    }
    history
}

/// The election part, read back.
#[derive(Clone, Debug, Serialize)]
pub struct ElectionVerdict {
    #[serde(flatten)]
    pub facts: ElectionFacts,
    pub store: ReadBack,
    /// The faults the part played (its schedule), when it was played live.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
}

impl ElectionVerdict {
    /// Reads the election from its events (the candidates' reports, etcd's history of
    /// their keys), the store's read-back and its decision on L1's late write.
    pub fn from_log(log: &[Event], late: LateWrite, store: ReadBack) -> ElectionVerdict {
        let resumed = log.iter().position(|e| match &e.what {
            What::Resumed(fault) => fault.target.as_deref() == Some("L1"),
            _ => false,
        });
        // L1 acted as leader after its pause: a write of its own after its resume.
        let acted = resumed.is_some_and(|at| log[at..].iter().any(|e| e.is("L1", Kind::Wrote)));
        let learned = log.iter().any(|e| e.is("L1", Kind::Lost));
        ElectionVerdict {
            facts: election_facts(&churn_history(log), acted, learned, late),
            store,
            schedule: None,
        }
    }
}

impl ElectionVerdict {
    /// Judges the election from its history, the store's read-back in it included (L1's
    /// late write against L2's). The live run and `lockslab check` both judge this way.
    pub fn from_history(log: &[Event]) -> Result<ElectionVerdict> {
        let read = read_back(log)?;
        let late = crate::check::late_write(&read.attempts, "L1", "L2");
        Ok(ElectionVerdict::from_log(log, late, read))
    }
}

/// A finding in the verdict's colours: the sentence for yes, for no, for unknown.
fn told(finding: Option<bool>, yes: &str, no: &str, unknown: &str) -> String {
    match finding {
        Some(true) => yes.green().to_string(),
        Some(false) => no.red().to_string(),
        None => unknown.yellow().to_string(),
    }
}

/// The churn part's words: whether the waiters behind a departure looked again, one holder
/// at a time, the order served and the store's writes.
pub fn say_churn(words: &mut Words, churn: &ChurnVerdict) {
    let facts = &churn.facts;
    words.blank().heading(format!(
        "Churn: {} left the line while queued:",
        facts.departed.join(" and ")
    ));
    words.prose(format!(
        "  {}",
        told(
            facts.gaps_rechecked,
            "Each waiter woken by a departure from the middle of the line looked again and \
             found an older key still ahead: none took the delete as its turn.",
            "A waiter woken by a departure did not look again before it held.",
            "No waiter left from the middle of the line with another behind it.",
        )
    ));
    words.prose(format!(
        "  {}",
        told(
            facts.one_holder_at_a_time,
            "etcd's own history of the keys: each holder found no older key at a revision \
             no earlier than every older key's delete. One holder at a time.",
            "etcd's own history of the keys: a waiter held while an older key still lived.",
            "etcd's history of the keys could not be read: one holder at a time is unknown.",
        )
    ));
    let served = format!(
        "Served, in etcd's order of grants: {}.",
        facts.served.join(" ")
    );
    words.prose(format!(
        "  {served} {}",
        told(
            Some(facts.nobody_skipped && facts.nobody_held_twice),
            "Nobody that stayed was skipped, nobody held twice.",
            "A waiter was skipped, served out of line, or held twice.",
            "",
        )
    ));
    let tokens: Vec<String> = churn
        .store
        .attempts
        .iter()
        .map(|a| format!("{} ({})", a.writer, a.token.unwrap_or_default()))
        .collect();
    words.prose(format!(
        "  {}",
        told(
            Some(facts.store_in_order),
            &format!(
                "The store took one write per holder, tokens rising: {}; none from {}.",
                tokens.join(", "),
                facts.departed.join(" or ")
            ),
            &format!(
                "The store's writes do not follow the line: {}.",
                tokens.join(", ")
            ),
            "",
        )
    ));
    for line in &facts.evidence {
        words.prose(format!("  {}", line.red()));
    }
}

/// The election part's words: the leaders in etcd's order, what the deposed leader did,
/// and the store's decision on its late write.
pub fn say_election(words: &mut Words, election: &ElectionVerdict) {
    let facts = &election.facts;
    words
        .blank()
        .heading("Election: the leader frozen past its lease:");
    let elected: Vec<String> = facts
        .leaders
        .iter()
        .zip(&facts.generations)
        .map(|(who, generation)| format!("{who} (generation {generation})"))
        .collect();
    words.prose(format!(
        "  Elected, in etcd's order: {}. {}",
        elected.join(", then "),
        told(
            facts.one_leader_at_a_time,
            "etcd's history of the candidates' keys: etcd named each leader only once every \
             older key was deleted. One leader at a time.",
            "etcd's history of the candidates' keys: a leader was elected while an older \
             key still lived.",
            "etcd's history of the candidates' keys could not be read: one leader at a \
             time is unknown.",
        )
    ));
    if facts.deposed_acted {
        words.prose(format!(
            "  {}",
            "L1, woken, still believed it led: nothing had told it otherwise, and it wrote \
             as leader."
                .yellow()
        ));
    }
    let first = facts.generations.first().copied().unwrap_or_default();
    let last = facts.generations.last().copied().unwrap_or_default();
    let late = match facts.late_write {
        "rejected" => format!(
            "The store refused L1's write with generation {first}, having taken L2's with \
             generation {last}."
        )
        .green()
        .to_string(),
        "accepted" => "The store took L1's late write, after L2's."
            .red()
            .to_string(),
        _ => "L1's write was not decided after L2's."
            .yellow()
            .to_string(),
    };
    words.prose(format!("  {late}"));
    if facts.deposed_learned {
        words.prose("  Then L1 asked etcd who leads, and learned that it no longer did.");
    }
    for line in &facts.evidence {
        words.prose(format!("  {}", line.red()));
    }
}
