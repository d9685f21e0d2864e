//! The lost reply's Postgres half: A pays in a transaction, its `COMMIT` reaches Postgres
//! and commits, and the proxy loses the answer. Retried as it was, the payment is made
//! twice; retried with an idempotency key that a unique index guards, once.

use anyhow::Result;
use postgres::types::ToSql;

use super::lost_reply::{lose_the_answer, open, run_line};
use crate::check::network::{self as checks, PaymentEvidence, PaymentFound};
use crate::connect::{self, Backend, PgClient};
use crate::events::facts::{Observed, Wrote};
use crate::events::{Event, What};
use crate::labs::faults::Hand;
use crate::labs::runner::Run;
use crate::labs::{Stage, step};
use crate::lock::random_owner;
use crate::proxy::{self, Proxy};
use crate::store::Outcome;

/// The payments of the Postgres half: one row per payment made; a key, when the client
/// sends one, is unique per run, so the same payment cannot be made twice.
const PAYMENTS: &str = "
    CREATE TABLE IF NOT EXISTS lockslab_network_payment (
        run_id          text NOT NULL,
        payment         text NOT NULL,
        amount          bigint NOT NULL,
        idempotency_key text,
        UNIQUE (run_id, idempotency_key)
    )";

/// Removes a run's payments (the table may not exist on a server that never ran this).
pub(super) fn forget(run_id: &str) -> String {
    format!(
        "DO $$ BEGIN IF to_regclass('lockslab_network_payment') IS NOT NULL THEN
             DELETE FROM lockslab_network_payment WHERE run_id = '{run_id}';
         END IF; END $$"
    )
}

/// ❌ The retry as it was: a second INSERT, a second payment.
const PAY: &str = "INSERT INTO lockslab_network_payment (run_id, payment, amount, idempotency_key)
    VALUES ($1, $2, $3, $4)";

/// ✅ The retry with an idempotency key: the key was in the first insert, so if that one
/// committed, this one does nothing (and says so: no row returned).
const PAY_ONCE: &str =
    "INSERT INTO lockslab_network_payment (run_id, payment, amount, idempotency_key)
    VALUES ($1, $2, $3, $4) ON CONFLICT (run_id, idempotency_key) DO NOTHING RETURNING 1";
/// One Postgres payment whose `COMMIT` answer is lost, retried without or with a key.
pub(super) fn play(run: &Run, keyed: bool) -> Result<PaymentFound> {
    let store_url = run.url(Backend::Postgres);
    let label = if keyed { "with-key" } else { "no-key" };
    let heading = if keyed {
        "a lost reply to COMMIT, retried with an idempotency key"
    } else {
        "a lost reply to COMMIT, retried as it was"
    };
    let mut stage = open(
        run,
        heading,
        label,
        step::network::before_lost_commit(keyed),
    );
    // The lane `postgres` is 8 wide: the column fits it, so wrapped lines align.
    stage.timeline.set_lane_width(8);
    let mut lab = connect::postgres(store_url)?;
    lab.batch_execute(PAYMENTS)?;
    let payment = format!("network-lost-commit-{label}");
    let path = Proxy::start("A→postgres", proxy::upstream_of(store_url)?)?;
    let through = proxy::through(store_url, path.addr())?;
    stage.record(run_line(
        run,
        None,
        format!("A pays into the table lockslab_network_payment; its path to Postgres, A→postgres, goes through the fault proxy on {}", path.addr()),
    ));
    let pay = Payment {
        run_id: &run.id,
        key: keyed.then(|| format!("{}:{payment}", random_owner())),
        payment,
    };
    let mut hand = Hand::new(&stage).on_path(&path);
    pay_and_lose_the_answer(&mut stage, &mut hand, &path, &through, &pay)?;
    let (after_loss, _) = pay.count(&mut lab)?;
    stage.record(Event::new(
        "postgres",
        What::Output,
        format!(
            "read back on the lab's own connection: {} — the COMMIT {}",
            rows_of(after_loss),
            if after_loss > 0 {
                "happened"
            } else {
                "did not happen"
            }
        ),
    ));
    retry(&mut stage, &through, &pay)?;
    let (rows_now, total) = pay.count(&mut lab)?;
    let found = checks::lost_commit(&PaymentEvidence {
        keyed,
        after_loss,
        rows: rows_now,
        total,
    });
    stage.record(paid(&found, rows_now, total));
    stage.drain();
    Ok(found)
}

/// A's payment: its run, its name, and its idempotency key when A sends one.
struct Payment<'r> {
    run_id: &'r str,
    payment: String,
    key: Option<String>,
}

impl Payment<'_> {
    /// The payment's rows and what they paid in all, read back on `lab`'s connection.
    fn count(&self, lab: &mut PgClient) -> Result<(u64, i64)> {
        let row = lab.query_one(
            "SELECT count(*), coalesce(sum(amount), 0)::bigint FROM lockslab_network_payment WHERE run_id = $1 AND payment = $2",
            &[&self.run_id, &self.payment],
        )?;
        Ok((row.get::<_, i64>(0) as u64, row.get(1)))
    }
}

/// A pays 10 in a transaction through the proxy, which loses the answer to its `COMMIT`.
fn pay_and_lose_the_answer(
    stage: &mut Stage,
    hand: &mut Hand,
    path: &Proxy,
    through: &str,
    pay: &Payment,
) -> Result<()> {
    let mut a = connect::postgres(through)?;
    let values: [&(dyn ToSql + Sync); 4] = [&pay.run_id, &pay.payment, &10i64, &pay.key];
    // Prepared before the transaction and kept until after it: a statement dropped in
    // between would send its Close ahead of the COMMIT, and the proxy would lose the answer
    // to that Close instead of the COMMIT's.
    let insert = a.prepare(PAY)?;
    let mut tx = a.transaction()?;
    tx.execute(&insert, &values)?;
    lose_the_answer(stage, hand, path, "COMMIT", || {
        tx.commit()?;
        Ok(())
    })?;
    drop(insert);
    drop(a);
    stage.record(Event::new(
        "A",
        Wrote {
            value: Some(pay.payment.clone()),
            ..Wrote::new(Outcome::Unknown)
        },
        "pays 10 (INSERT, COMMIT): no answer to the COMMIT — A cannot tell whether it paid",
    ));
    Ok(())
}

/// A retries, as most clients do after an error, on a new connection: as it was, or with
/// its idempotency key.
fn retry(stage: &mut Stage, through: &str, pay: &Payment) -> Result<()> {
    let mut a = connect::postgres(through)?;
    let values: [&(dyn ToSql + Sync); 4] = [&pay.run_id, &pay.payment, &10i64, &pay.key];
    let keyed = pay.key.is_some();
    let rows = if keyed {
        a.query(PAY_ONCE, &values)?.len() as u64
    } else {
        a.execute(PAY, &values)?
    };
    stage.record(Event::new(
        "A",
        Wrote {
            value: Some(pay.payment.clone()),
            ..Wrote::new(Outcome::Accepted)
        },
        match (keyed, rows) {
            (true, 0) => "retries with the same idempotency key: INSERT … ON CONFLICT DO NOTHING inserted 0 rows — the key was there: the first payment had committed".to_string(),
            (true, _) => format!("retries with the same idempotency key: INSERT … ON CONFLICT DO NOTHING inserted {} — the key was not there: the first payment had not committed", rows_of(rows)),
            (false, _) => format!("retries the payment as it was: INSERT inserted {}", rows_of(rows)),
        },
    ));
    Ok(())
}

/// The store's last word: the payment's rows read back, paid once or twice.
fn paid(found: &PaymentFound, rows_now: u64, total: i64) -> Event {
    let facts = Observed {
        once: Some(rows_now.min(1)),
        duplicates: Some(rows_now.saturating_sub(1)),
        ..Observed::default()
    };
    let text = format!(
        "read back: {} for this payment, {total} paid in all",
        rows_of(rows_now)
    );
    let said = if found.doubled {
        "the retry paid twice"
    } else {
        "paid once"
    };
    Event::new(
        "postgres",
        What::TablesRead(facts),
        format!("{text} — {said}"),
    )
}

/// "1 row", "2 rows".
fn rows_of(n: u64) -> String {
    format!("{n} {}", if n == 1 { "row" } else { "rows" })
}
