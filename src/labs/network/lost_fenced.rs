//! The lost reply's last Postgres part: fencing does not make a retry safe. A writes to the
//! store with its fencing token; the store decides the write (`>=`: not lower than the
//! highest token accepted), commits it, and the proxy loses the answer. A retries with the
//! same token — and the store accepts it again, because a token is not lower than itself.
//!
//! A token and an idempotency key answer different questions. With `>=` the store knows
//! only the highest token it accepted, so the token answers "has a newer holder already
//! written here?": it refuses a write once a newer holder's has landed, and it cannot tell
//! a second copy of a write from a new one. The key answers "was this write already
//! applied?" (the `COMMIT` retried with a key, just before). The store's attempt log shows
//! it: two accepted attempts with one token, decided one after the other — the write
//! applied twice. This store's write *sets* a value, so here the second copy set the same
//! value again: harmless for a set, double for an add (`balance + 10` would have added
//! twice). And had a newer holder written in between, the retry would have been refused,
//! and A would have concluded — wrongly — that its first write had failed too.

use anyhow::Result;
use colored::Colorize;

use super::lost_reply::{lose_the_answer, open, run_line};
use crate::check::network::{self as checks, FencedRetryEvidence, FencedRetryFound};
use crate::connect::{self, Backend};
use crate::events::facts::{Observed, Wrote};
use crate::events::{Event, What};
use crate::labs::faults::Hand;
use crate::labs::runner::Run;
use crate::labs::words::Words;
use crate::labs::{Stage, step};
use crate::proxy::{self, Proxy};
use crate::store::{
    FENCED_WRITE_NOT_LOWER, NUMBER_THE_DECISION, Outcome, RECORD_THE_ATTEMPT, Store,
};

/// The resource A writes (its rows carry the run's id, removed with the run's store rows).
const RESOURCE: &str = "network-lost-fenced-write";

/// A's token: any token does; what matters is that the retry carries the same one.
const TOKEN: i64 = 1;

/// The fenced write whose answer is lost, and its retry, as the store's attempt log tells.
pub(super) fn play(run: &Run) -> Result<FencedRetryFound> {
    let store_url = run.url(Backend::Postgres);
    let mut stage = open(
        run,
        "a lost reply to a fenced write, retried with the same token",
        "fenced-retry",
        &step::network::LOST_FENCED_WRITE,
    );
    stage.timeline.set_lane_width(8);
    let mut lab = Store::connect(store_url)?;
    let path = Proxy::start("A→store", proxy::upstream_of(store_url)?)?;
    let through = proxy::through(store_url, path.addr())?;
    stage.record(run_line(
        run,
        None,
        format!(
            "A holds a lock with token {TOKEN} and writes the store's {RESOURCE} (rule: a token not lower than the highest accepted); its path, A→store, goes through the fault proxy on {}",
            path.addr()
        ),
    ));
    let run_id = run.id.as_str();
    let value = "A: balance = 10";
    let mut hand = Hand::new(&stage).on_path(&path);
    write_and_lose_the_answer(
        &mut stage,
        &mut hand,
        (&path, &through),
        &lab,
        (run_id, value),
    )?;
    let (first, _) = accepted_with_token(&mut lab, run_id)?;
    stage.record(Event::new(
        "postgres",
        What::Output,
        format!(
            "the store's attempt log, read on the lab's own connection: {} with token {TOKEN} — the write happened",
            attempts(first)
        ),
    ));
    // A retries, as most clients do after an error, on a new connection.
    let outcome = Store::connect(&through)?.write(run_id, RESOURCE, "A", value, Some(TOKEN));
    stage.record(Event::new(
        "A",
        Wrote {
            value: Some(value.into()),
            token: Some(TOKEN),
            ..Wrote::new(outcome)
        },
        format!(
            "retries with the same token {TOKEN}: {} ({TOKEN} is not lower than {TOKEN})",
            outcome.as_str()
        ),
    ));
    let (twice, decisions) = accepted_with_token(&mut lab, run_id)?;
    let found = checks::lost_fenced_retry(&FencedRetryEvidence {
        token: TOKEN,
        after_loss: first,
        decisions: decisions.clone(),
    });
    stage.record(taken(&found, twice, &decisions));
    stage.drain();
    Ok(found)
}

/// A's fenced write, in a transaction of the store's own statements through the proxy,
/// which loses the answer to its `COMMIT`.
fn write_and_lose_the_answer(
    stage: &mut Stage,
    hand: &mut Hand,
    (path, through): (&Proxy, &str),
    lab: &Store,
    (run_id, value): (&str, &str),
) -> Result<()> {
    // The store's own statements, prepared before the transaction and kept until after
    // it, so that nothing but the COMMIT goes up while the proxy waits to lose an answer
    // (a statement dropped in between sends its Close first: see lost_commit).
    let mut a = connect::postgres(through)?;
    let write = a.prepare(&lab.sql(FENCED_WRITE_NOT_LOWER))?;
    let number = a.prepare(&lab.sql(NUMBER_THE_DECISION))?;
    let record = a.prepare(&lab.sql(RECORD_THE_ATTEMPT))?;
    let mut tx = a.transaction()?;
    let accepted = tx
        .query_opt(&write, &[&run_id, &RESOURCE, &value, &"A", &TOKEN])?
        .is_some();
    let decided: i64 = tx.query_one(&number, &[&run_id, &RESOURCE])?.get(0);
    tx.execute(
        &record,
        &[
            &run_id, &RESOURCE, &"A", &value, &TOKEN, &true, &accepted, &decided,
        ],
    )?;
    lose_the_answer(stage, hand, path, "COMMIT", || {
        tx.commit()?;
        Ok(())
    })?;
    drop((write, number, record));
    drop(a);
    stage.record(Event::new(
        "A",
        Wrote {
            value: Some(value.into()),
            token: Some(TOKEN),
            ..Wrote::new(Outcome::Unknown)
        },
        format!("writes with token {TOKEN}: no answer to the COMMIT — A cannot tell whether the store took it"),
    ));
    Ok(())
}

/// The store's last word: A's token accepted once, or twice (decided one after the other).
fn taken(found: &FencedRetryFound, twice: u64, decisions: &[i64]) -> Event {
    let facts = Observed {
        once: Some(twice.min(1)),
        duplicates: Some(twice.saturating_sub(1)),
        ..Observed::default()
    };
    let numbers: Vec<String> = decisions.iter().map(i64::to_string).collect();
    let text = format!(
        "the store's attempt log: {} with token {TOKEN} (decisions {})",
        attempts(twice),
        numbers.join(" and ")
    );
    let said = if found.doubled {
        "the same write applied twice: harmless for this set (the same value again), double for an add; the token refuses a write a newer holder's has overtaken, not a second copy"
    } else {
        "taken once"
    };
    Event::new(
        "postgres",
        What::TablesRead(facts),
        format!("{text} — {said}"),
    )
}

/// The verdict's table for the fenced write, and what it means.
pub(super) fn say(words: &mut Words, found: &FencedRetryFound) {
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let token = found.token;
    let accepted = if found.doubled {
        found.accepted.to_string().red().bold().to_string()
    } else {
        found.accepted.to_string()
    };
    let rows = vec![
        vec![
            "write happened (attempt log)".into(),
            yes_no(found.committed),
        ],
        vec![
            format!("accepted with token {token} (attempt log)"),
            accepted,
        ],
    ];
    let header = ["evidence", "retried with the same token"];
    let title = "Verdict: a lost reply to a fenced write";
    words.blank().heading(title).table(&header, rows).blank();
    let committed = if found.committed {
        "The fenced write whose answer was lost had been accepted."
    } else {
        "The fenced write whose answer was lost had not been accepted."
    };
    let then = if found.doubled {
        format!(
            "A's retry with the same token was accepted again ({token} is not lower than {token}): the same write applied twice. A token refuses a write that a newer holder's has overtaken, not a second copy of its own: that takes an idempotency key."
        )
    } else {
        "A's retry made the only write.".to_string()
    };
    words.about("fenced retry", format!("{committed} {then}"));
}

/// The accepted attempts of A's token in the store's log, and their decision numbers.
fn accepted_with_token(lab: &mut Store, run_id: &str) -> Result<(u64, Vec<i64>)> {
    let back = lab.read_back(run_id, RESOURCE)?;
    let decided: Vec<i64> = (back.attempts.iter())
        .filter(|a| a.accepted && a.token == Some(TOKEN))
        .map(|a| a.decided)
        .collect();
    Ok((decided.len() as u64, decided))
}

/// "1 accepted attempt", "2 accepted attempts".
fn attempts(n: u64) -> String {
    format!(
        "{n} accepted {}",
        if n == 1 { "attempt" } else { "attempts" }
    )
}
