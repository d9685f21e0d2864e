//! A Redlock client's script: take the lock on N masters, draw a fencing token from an
//! ordered source, stop dead (SIGSTOP) as a paused client does, then wake, write to the
//! fenced store and release everywhere. Lab 6 (`redlock`) plays it in its client-pause
//! scenario, where only a separate process can be frozen the way a pause freezes a client.
//!
//! After it wakes, the client writes the same result three times, to three resources of
//! the store, each fenced differently: not at all; by its random lock value read as a
//! number (❌ Redlock's value has no order); by a token drawn from a Postgres sequence
//! (✅ ordered and durable). The lab's verdict reads the three back.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::connect;
use crate::events::{Emitter, Kind};
use crate::lock::redlock::{self, Master, Redlock, Settings};
use crate::output::human;
use crate::store::Store;

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
    /// How long to keep trying for the lock.
    pub wait_ms: u64,
    pub store_url: String,
    pub run_id: String,
    /// The Postgres sequence the fencing token is drawn from.
    pub token_sequence: String,
    pub resources: Resources,
}

/// The three resources the client writes after it wakes, one per way of fencing.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Resources {
    pub unfenced: String,
    pub random_value: String,
    pub sequence: String,
}

/// Draws a fencing token from `sequence` in the store's database: ordered (every draw is
/// higher than the one before) and durable (a sequence survives a restart of Postgres).
pub fn draw_token(store_url: &str, sequence: &str) -> Result<i64> {
    let mut db = connect::postgres(store_url)?;
    let row = db
        .query_one("SELECT nextval($1::text::regclass)", &[&sequence])
        .context("drawing a fencing token from the Postgres sequence")?;
    Ok(row.get(0))
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
    };
    let mut lock = Redlock::new(masters, &script.key, settings);
    me.send(
        me.event(
            Kind::Waiting,
            format!(
                "asks {} masters for the lock (SET NX PX {})",
                script.masters.len(),
                script.ttl_ms
            ),
        )
        .with("pid", std::process::id()),
    );

    let rounds = lock.acquire_within(Duration::from_millis(script.wait_ms));
    let attempt = rounds.last().cloned().context("no round was played")?;
    if !attempt.held {
        me.send(
            me.event(Kind::GaveUp, round_text("gives up", &attempt))
                .with("attempt", serde_json::to_value(&attempt)?),
        );
        return Ok(());
    }
    // The token is drawn after the grant, so it is only good if the lock was still valid
    // once it was drawn: a client paused between the two could draw after the next holder.
    let token = draw_token(&script.store_url, &script.token_sequence)?;
    if attempt
        .valid_until()
        .is_none_or(|end| Instant::now() >= end)
    {
        lock.release(&attempt.value);
        bail!("its validity ran out before it drew its fencing token");
    }
    me.send(
        me.event(Kind::Acquired, round_text("holds the lock", &attempt))
            .with("owner", attempt.value.clone())
            .with("token", token)
            .with("validity_ms", attempt.validity_ms)
            .with("attempt", serde_json::to_value(&attempt)?),
    );

    me.say(
        Kind::Freezing,
        format!("token {token} from the sequence; starts its work… and stops dead (SIGSTOP)"),
    );
    let frozen_at = Instant::now();
    nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP).context("raising SIGSTOP")?;
    let gap = frozen_at.elapsed();
    me.send(
        me.event(
            Kind::Resumed,
            format!(
                "wakes after {}; its validity was {}ms: it still believes it holds the lock",
                human(gap),
                attempt.validity_ms
            ),
        )
        .with("paused_ms", gap.as_millis() as u64),
    );

    let value = format!("{}'s result", script.name);
    let writes = [
        ("unfenced", &script.resources.unfenced, None),
        (
            "random value as token",
            &script.resources.random_value,
            Some(redlock::as_number(&attempt.value)),
        ),
        ("sequence token", &script.resources.sequence, Some(token)),
    ];
    for (how, resource, write_token) in writes {
        let outcome = store.write(&script.run_id, resource, &script.name, &value, write_token);
        let shown = write_token
            .map(|t| format!(" {}", short_token(t)))
            .unwrap_or_default();
        me.send(
            me.event(
                Kind::Wrote,
                format!(
                    "writes '{value}' ({how}{shown}): the store says {}",
                    outcome.as_str()
                ),
            )
            .with("resource", resource.as_str())
            .with("outcome", outcome.as_str())
            .with("token", write_token)
            .with("value", value.as_str()),
        );
    }

    let released = lock.release(&attempt.value);
    let kept = released
        .iter()
        .filter(|a| a.reply == redlock::Reply::Deleted)
        .count();
    let lines: Vec<String> = released.iter().map(redlock::answer_line).collect();
    me.send(
        me.event(
            Kind::Released,
            format!(
                "releases on all {} masters ({kept} still held its value):\n{}",
                released.len(),
                indent(&lines)
            ),
        )
        .with("released", kept > 0)
        .with("answers", serde_json::to_value(&released)?),
    );
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

/// A token for the timeline: a random value read as a number has 18 or 19 digits, shown
/// as `1.044e18` so that two of them still compare at a glance.
pub fn short_token(token: i64) -> String {
    if token > 99_999_999 {
        format!("{:.3e}", token as f64)
    } else {
        token.to_string()
    }
}
