//! A Redlock client's script: take the lock on N masters, draw a fencing token from an
//! ordered source, stop dead (SIGSTOP) as a paused client does, then wake, write to the
//! fenced store and release everywhere. Lab 6 (`redlock`) plays it in its client-pause
//! scenario, where only a separate process can be frozen the way a pause freezes a client.
//!
//! After it wakes, the client writes the same result to four resources of the store, each
//! guarded differently: not at all; by its random lock value, compare-and-set at the
//! resource (antirez's counter), with the claim made at the grant; the same, with the claim
//! made only after the pause (the reply: a claim has no order, and the late claim displaces
//! the new holder's);
//! by a token drawn from a Postgres sequence (✅ ordered and durable). The lab's verdict
//! reads the four back.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::events::facts::{self, FaultFacts, GaveUp, Waiting, Wrote};
use crate::events::{Emitter, What};
use crate::lock::redlock::{self, Master, Redlock, RoundOrder, Settings};
use crate::output::human;
use crate::store::{Outcome, Store};

/// One Redlock client's script.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct RedlockClientScript {
    pub name: String,
    /// The masters, in the order the algorithm asks them: (name, URL).
    pub masters: Vec<(String, String)>,
    pub key: String,
    pub ttl_ms: u64,
    pub drift_factor: f64,
    pub instance_timeout_ms: u64,
    pub retry_delay_max_ms: u64,
    /// One master after another, or all at once.
    #[serde(default)]
    pub round: RoundOrder,
    /// How long to keep trying for the lock.
    pub wait_ms: u64,
    pub store_url: String,
    pub run_id: String,
    /// The Postgres sequence the fencing token is drawn from.
    pub token_sequence: String,
    pub resources: Resources,
}

/// The four resources the client writes after it wakes, one per way of guarding them.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Resources {
    pub unfenced: String,
    /// Claimed with the random value right after the grant, before the pause.
    pub claimed: String,
    /// Claimed with the random value only after the pause: a delayed claim.
    pub late_claim: String,
    pub sequence: String,
}

impl Resources {
    /// Each resource with what guards a write to it, for a client holding `value` and
    /// `token`. A client writes all four the same way; only the guards differ.
    pub fn guarded<'a>(&'a self, value: &'a str, token: i64) -> [(&'a str, Guard<'a>); 4] {
        [
            (&self.unfenced, Guard::Unfenced),
            (&self.claimed, Guard::Claim { value, late: false }),
            (&self.late_claim, Guard::Claim { value, late: true }),
            (&self.sequence, Guard::Token(token)),
        ]
    }
}

/// What guards one write.
#[derive(Clone, Copy, Debug)]
pub enum Guard<'a> {
    /// ❌ Nothing: the write always lands.
    Unfenced,
    /// ❌ antirez's compare-and-set by random value: the write lands only while the
    /// resource's claim is `value`. Refuses a holder whose claim was replaced; a claim made
    /// `late` (after the pause) replaces the new holder's, and then the stale write lands.
    Claim { value: &'a str, late: bool },
    /// ✅ A token from the store's Postgres sequence, under the store's rule (`>=`).
    Token(i64),
}

impl Guard<'_> {
    pub fn write(
        self,
        store: &mut Store,
        run_id: &str,
        resource: &str,
        writer: &str,
        result: &str,
    ) -> Outcome {
        match self {
            Guard::Unfenced => store.write(run_id, resource, writer, result, None),
            Guard::Claim { value, .. } => {
                store.write_if_claimed(run_id, resource, writer, result, value)
            }
            Guard::Token(token) => store.write(run_id, resource, writer, result, Some(token)),
        }
    }

    pub fn token(self) -> Option<i64> {
        match self {
            Guard::Token(token) => Some(token),
            _ => None,
        }
    }

    /// How the write is guarded, for the timeline.
    pub fn how(self) -> String {
        match self {
            Guard::Unfenced => "unfenced".into(),
            Guard::Claim { late: false, .. } => "its value, claimed at the grant".into(),
            Guard::Claim { late: true, .. } => "its value, claimed after the pause".into(),
            Guard::Token(token) => format!("sequence token {token}"),
        }
    }
}

pub fn run(script: &RedlockClientScript) -> Result<()> {
    let me = Emitter::new(&script.name);
    let mut store = Store::connect(&script.store_url)?;
    let masters = script
        .masters
        .iter()
        .map(|(name, url)| Master::new(name, url))
        .collect();
    let settings = Settings {
        ttl: Duration::from_millis(script.ttl_ms),
        drift_factor: script.drift_factor,
        instance_timeout: Duration::from_millis(script.instance_timeout_ms),
        retry_delay_max: Duration::from_millis(script.retry_delay_max_ms),
        round: script.round,
    };
    let mut lock = Redlock::new(masters, &script.key, settings);
    me.send(me.event(
        Waiting {
            pid: Some(std::process::id() as i32),
            ..Waiting::default()
        },
        format!(
            "asks {} masters for the lock (SET NX PX {})",
            script.masters.len(),
            script.ttl_ms
        ),
    ));

    let rounds = lock.acquire_within(Duration::from_millis(script.wait_ms));
    let attempt = rounds.last().cloned().context("no round was played")?;
    if !attempt.held {
        me.send(me.event(
            GaveUp {
                attempt: Some(Box::new(attempt.clone())),
                ..GaveUp::default()
            },
            round_text("gives up", &attempt),
        ));
        return Ok(());
    }
    // The token is drawn after the grant, so it is only good if the lock was still valid
    // once it was drawn: a client paused between the two could draw after the next holder.
    let token = store.next_token(&script.token_sequence)?;
    if attempt
        .valid_until()
        .is_none_or(|end| Instant::now() >= end)
    {
        lock.release(&attempt.value);
        bail!("its validity ran out before it drew its fencing token");
    }
    me.send(me.event(
        facts::Acquired {
            lock: Some(script.key.clone()),
            owner: Some(attempt.value.clone()),
            token: Some(token),
            validity_ms: Some(attempt.validity_ms),
            attempt: Some(Box::new(attempt.clone())),
            ..Default::default()
        },
        round_text("holds the lock", &attempt),
    ));

    let claimed = store.claim(
        &script.run_id,
        &script.resources.claimed,
        &script.name,
        &attempt.value,
    );
    me.say(
        What::Freezing,
        format!(
            "token {token} from the sequence; {} {} with its value; starts its work… and stops dead (SIGSTOP) before claiming {}",
            if claimed { "claimed" } else { "could not claim" },
            script.resources.claimed,
            script.resources.late_claim
        ),
    );
    let frozen_at = Instant::now();
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP).context("raising SIGSTOP")?;
    let gap = frozen_at.elapsed();
    me.send(me.event(
        What::Resumed(FaultFacts::paused_for(gap)),
        format!(
            "wakes after {}; its validity was {}ms: it still believes it holds the lock",
            human(gap),
            attempt.validity_ms
        ),
    ));

    let late = store.claim(
        &script.run_id,
        &script.resources.late_claim,
        &script.name,
        &attempt.value,
    );
    me.say(
        What::Working,
        format!(
            "{} {} with its value, late: the claim carries no order",
            if late { "claims" } else { "could not claim" },
            script.resources.late_claim
        ),
    );
    let value = format!("{}'s result", script.name);
    for (resource, guard) in script.resources.guarded(&attempt.value, token) {
        let outcome = guard.write(&mut store, &script.run_id, resource, &script.name, &value);
        me.send(me.event(
            Wrote {
                resource: Some(resource.to_string()),
                token: guard.token(),
                value: Some(value.clone()),
                ..Wrote::new(outcome)
            },
            format!(
                "writes '{value}' to {resource} ({}): the store says {}",
                guard.how(),
                outcome.as_str()
            ),
        ));
    }

    let released = lock.release(&attempt.value);
    let deleted = released
        .iter()
        .filter(|a| a.reply == redlock::Reply::Deleted)
        .count();
    let lines: Vec<String> = released.iter().map(redlock::answer_line).collect();
    me.send(me.event(
        facts::Released {
            released: Some(deleted > 0),
            answers: Some(released.clone()),
            ..Default::default()
        },
        format!(
            "releases on all {} masters (deleted on {deleted}):\n{}",
            released.len(),
            indent(&lines)
        ),
    ));
    Ok(())
}

/// A round as one timeline event: what the client concluded, then every master's answer
/// and the validity arithmetic, one per line.
pub fn round_text(conclusion: &str, attempt: &redlock::Attempt) -> String {
    format!("{conclusion}:\n{}", indent(&attempt.lines()))
}

/// Lines of one timeline event after its first: the timeline puts each under the event's
/// text column; two more spaces set them off from the first.
pub fn indent(lines: &[String]) -> String {
    lines
        .iter()
        .map(|line| format!("  {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}
