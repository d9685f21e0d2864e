//! The check inside the lock service: etcd can fence a write itself, when the resource is
//! a key in the same etcd. A takes the lock and writes the key with a put guarded by its
//! lock key's create revision — one transaction, `If(create revision = token)
//! Then(put)`, the Go client's `Txn(If(mutex.IsOwner()), Then(put))`
//! ([`crate::lock::etcd::EtcdLock::put_if_owner`]). A's lease then ends (the lab revokes
//! it, as its expiry would end it for a holder frozen past it), etcd deletes A's key with
//! it, and B takes the lock and writes the same way. A, late, tries once more: etcd refuses
//! the transaction, since A's key no longer has that create revision (a missing key's is
//! 0). The key's value, read back, is B's.
//!
//! ```text
//!  A  lock (token a) · Txn(If(rev(A's key) = a), Then(put)) ✓ · lease ends ─ · · late Txn ✗
//!  B                                              lock (token b) · Txn(If(rev = b), put) ✓
//! ```
//!
//! The compare and the put are one step, applied by etcd at one revision: nothing lands in
//! between, the window every check made *before* a write leaves open. It costs no extra
//! request (the compare rides on the write) — but it reaches only etcd's own keys. A
//! Postgres row, a file, an email cannot join an etcd transaction: for those the token
//! must travel with the write and the resource must check it (labs 1 and 7).

use std::time::Duration;

use anyhow::{Result, bail};
use colored::Colorize;
use serde::Serialize;

use super::{Plan, lock_name};
use crate::connect::Backend;
use crate::events::facts::{Acquired, RunFacts, Wrote};
use crate::events::{Event, What};
use crate::labs::runner::Run;
use crate::labs::words::Words;
use crate::lock::etcd::{Acquired as Got, EtcdLock, Held};
use crate::store::Outcome;

/// What etcd answered, read back: the part's verdict (`owner_txn` in `--json`).
#[derive(Clone, Debug, Serialize)]
pub struct OwnerTxnFound {
    /// A's and B's tokens: their lock keys' create revisions.
    pub a_token: i64,
    pub b_token: i64,
    /// Whether etcd took A's guarded put while A held the lock, B's after it, and A's late
    /// one once A's lease had ended.
    pub a_while_holding: bool,
    pub b: bool,
    pub a_late: bool,
    /// The key's value and its last change's revision, read back at the end.
    pub value: Option<String>,
    pub mod_revision: Option<i64>,
}

impl OwnerTxnFound {
    /// Refused late, and the key holds B's write.
    pub fn fenced(&self) -> bool {
        self.a_while_holding && self.b && !self.a_late && self.value.as_deref() == Some("B")
    }

    /// The part's words: what etcd answered each guarded put, the key read back, and what
    /// it means.
    pub fn say(&self, words: &mut Words) {
        let yes = |b: bool| if b { "taken" } else { "refused" };
        words
            .blank()
            .heading("Verdict: the check inside etcd")
            .prose(format!(
                "  A's put, holding the lock (token {}): {}",
                self.a_token,
                yes(self.a_while_holding)
            ))
            .prose(format!(
                "  B's put, holding the lock (token {}): {}",
                self.b_token,
                yes(self.b)
            ))
            .prose(format!(
                "  A's put, its lease gone:              {}",
                yes(self.a_late)
            ))
            .prose(format!(
                "  the key, read back:                   {}",
                self.value.as_deref().unwrap_or("(missing)")
            ))
            .prose(if self.fenced() {
                "etcd compared A's lock key and wrote in one transaction, and refused A once \
                 its key was gone: the check and the write were one step. It reaches only \
                 keys in this etcd; a resource outside it needs the token carried to it."
            } else {
                "etcd did not refuse A's late put: the guard did not hold."
            });
    }
}

pub(super) fn play(plan: &Plan, run: &Run) -> Result<OwnerTxnFound> {
    let url = run.url(Backend::Etcd);
    let mut stage = run.stage();
    stage.timeline.say("");
    stage.timeline.say(
        &"── the check inside etcd: a put guarded by the lock key ──"
            .bold()
            .to_string(),
    );
    stage.checkpoint(&crate::labs::step::queue::OWNER_TXN);
    stage.tags().scenario = Some("owner-txn".into());
    let name = lock_name(&run.id, "owner-txn");
    let resource = format!("{name}:resource");
    stage.record(Event::new(
        "lab",
        RunFacts {
            run_id: Some(run.id.clone()),
            lock_key: Some(name.clone()),
            ..RunFacts::default()
        },
        format!(
            "run {}: the lock is etcd's lock named {name}; A and B write the etcd key {resource}",
            run.id
        ),
    ));
    let wait = plan.lease * 4 + Duration::from_secs(10);
    let mut a = EtcdLock::connect(url, &name)?;
    let a_lease = a.grant_lease(plan.lease, |_| {})?;
    let a_held = take(&mut a, &a_lease, wait, "A")?;
    stage.record(acquired("A", &a_held));
    let a_while_holding = a.put_if_owner(&a_held, &resource, "A")?;
    stage.record(put("A", &a_held, a_while_holding, "holding the lock"));
    // A's lease ends as it would for a holder frozen past it: etcd deletes A's key with it.
    let revoked = a.revoke(a_lease)?;
    stage.record(Event::new(
        "lab",
        What::Output,
        format!(
            "revokes A's lease ({}), as its expiry would: etcd deletes A's lock key with it",
            if revoked {
                "done"
            } else {
                "it was gone already"
            }
        ),
    ));
    let mut b = EtcdLock::connect(url, &name)?;
    let b_lease = b.grant_lease(plan.lease, |_| {})?;
    let b_held = take(&mut b, &b_lease, wait, "B")?;
    stage.record(acquired("B", &b_held));
    let b_took = b.put_if_owner(&b_held, &resource, "B")?;
    stage.record(put("B", &b_held, b_took, "holding the lock"));
    let a_late = a.put_if_owner(&a_held, &resource, "A")?;
    stage.record(put("A", &a_held, a_late, "late: its lease is gone"));
    let back = b.value_of(&resource)?;
    stage.record(Event::new(
        "etcd",
        What::Output,
        match &back {
            Some((value, rev)) => {
                format!("read back: {resource} = {value:?}, last changed at revision {rev}")
            }
            None => format!("read back: {resource} is missing"),
        },
    ));
    b.release(b_lease, &b_held)?;
    stage.drain();
    Ok(OwnerTxnFound {
        a_token: a_held.token,
        b_token: b_held.token,
        a_while_holding,
        b: b_took,
        a_late,
        value: back.as_ref().map(|(v, _)| v.clone()),
        mod_revision: back.map(|(_, rev)| rev),
    })
}

fn take(
    lock: &mut EtcdLock,
    lease: &crate::lock::etcd::Lease,
    wait: Duration,
    who: &str,
) -> Result<Held> {
    match lock.acquire_within(lease, wait)? {
        Got::Held(held) => Ok(held),
        other => bail!("{who} did not get the lock within {wait:?}: {other:?}"),
    }
}

fn acquired(who: &str, held: &Held) -> Event {
    Event::new(
        who,
        Acquired {
            lock: Some(held.key.clone()),
            token: Some(held.token),
            backend: Some("etcd".into()),
            ..Acquired::default()
        },
        format!(
            "holds the lock: its key {} has create revision {} (its token)",
            held.key, held.token
        ),
    )
}

fn put(who: &str, held: &Held, taken: bool, when: &str) -> Event {
    let outcome = if taken {
        Outcome::Accepted
    } else {
        Outcome::Rejected
    };
    Event::new(
        who,
        Wrote {
            token: Some(held.token),
            value: Some(who.into()),
            ..Wrote::new(outcome)
        },
        format!(
            "Txn(If(create revision of its key = {}), Then(put)), {when}: {}",
            held.token,
            if taken {
                "etcd took it"
            } else {
                "etcd refused it — the key is not there with that revision"
            }
        ),
    )
}
