//! The queue lock: ZooKeeper's lock recipe, written on etcd — and the herd it avoids.
//!
//! Read it next to [`super::etcd`], which calls etcd's own lock service: that service runs
//! this very recipe inside the server. Here it is done by hand, step by step, so that each
//! step can be seen, counted and broken.
//!
//! ```text
//!  lock/7a3f  rev 41  ◀── holds (lowest create revision)
//!  lock/7a40  rev 42  ──watches 41
//!  lock/7a41  rev 43  ──watches 42        a release deletes one key: one waiter wakes
//!  lock/7a42  rev 44  ──watches 43
//! ```
//!
//! 1. **Join**: put a key of your own under the lock's prefix, attached to your lease (the
//!    lease is the session: if you die or freeze, etcd deletes the key when it runs out).
//! 2. **Your place** is the key's create revision: etcd gives every change the next number
//!    of one total order, so the keys line up in the order their puts were decided.
//! 3. **Wait for your predecessor only**: the key with the highest create revision below
//!    yours. Watch it until it is deleted, then ✅ look again — it may have given up or
//!    expired while someone older still holds. You hold the lock when no older key is left.
//! 4. **The token** is your key's create revision: it grows from holder to holder, since the
//!    holders follow each other in create-revision order.
//!
//! ❌ [`EtcdQueue::herd_acquire`] is the lock most people write first: one key, and every
//! waiter watching it. Each release wakes every waiter; all of them race to create the key,
//! one wins, the rest go back to watching. N waiters cost about N wake-ups and N requests
//! per hand-over, and who wins is a race, not the order they asked in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, SortOrder, SortTarget, Txn,
    TxnOp, WatchOptions,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::runtime::Runtime;

use super::etcd::Lease;
use crate::connect;

/// A waiter's place in the queue: its key and the key's create revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    pub key: String,
    /// The key's create revision: its place in line, and once it holds, its fencing token.
    pub revision: i64,
}

/// One key's life under the queue's prefix, as etcd's own history of changes tells it:
/// the evidence a checker reads the queue's order and its hand-overs from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KeyLife {
    pub key: String,
    /// Its create revision: its place in line, and its token if it held.
    pub created: i64,
    /// The revision of its delete (a release, a waiter leaving, its lease expiring); None
    /// if it was still there when the history was read.
    pub deleted: Option<i64>,
}

/// How a wait for the lock ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Turn {
    /// No older key is left: the lock is ours, with this token.
    Holder {
        token: i64,
        /// The revision etcd answered at when the waiter found no older key: from then on
        /// it holds, in etcd's own order of events.
        at: i64,
    },
    /// Our own key is gone (our lease expired while we were frozen, or someone deleted
    /// it): we are no longer in the queue, and must not act as if we were.
    Gone,
    /// Our lease was lost while we waited (the heartbeat gave it up).
    LeaseLost,
    TimedOut,
    /// Told to give up while it waited (it still has its key: it must delete it).
    Quit,
}

/// One step of the recipe's wait.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Over(Turn),
    /// The key ahead (`gone`) was deleted; looking again, `ahead` is now ahead (or nobody).
    Woke {
        gone: String,
        ahead: Option<String>,
    },
}

/// One client's connection to the queue, counting what it costs.
pub struct EtcdQueue {
    runtime: Runtime,
    client: Client,
    /// The lock's prefix: every waiter's key is `<prefix>/<lease in hex>`.
    pub prefix: String,
    /// Requests this client sent (gets, puts, txns, deletes, watches opened).
    pub requests: u64,
    /// Times this client was woken by a watch event.
    pub wakeups: u64,
    /// What the last look at the queue found, not yet acted on.
    looked: Option<(Option<String>, i64)>,
    /// Set from outside (a waiter told to give up): the wait ends with [`Turn::Quit`].
    /// None for a waiter that is never told: nothing is polled for it (200 waiters each
    /// polling every 10ms would cost the machine more than the queue does).
    pub quit: Option<Arc<AtomicBool>>,
}

impl EtcdQueue {
    pub fn connect(url: &str, prefix: &str) -> Result<EtcdQueue> {
        let runtime = connect::etcd_runtime()?;
        let client = runtime.block_on(connect::etcd(url))?;
        Ok(EtcdQueue {
            runtime,
            client,
            prefix: prefix.to_string(),
            requests: 0,
            wakeups: 0,
            looked: None,
            quit: None,
        })
    }

    /// The recipe's key for `lease`, as etcd's own lock names it.
    pub fn key_of(&self, lease: i64) -> String {
        format!("{}/{lease:x}", self.prefix)
    }

    /// ✅ Step 1 and 2: joins the queue with a key of our own on `lease`, and reads our place.
    ///
    /// The put is a transaction "create it if it does not exist": a retry after a lost
    /// answer must not move a key that is already queued (a put on an existing key keeps
    /// its create revision anyway, but the transaction says so without relying on it).
    pub fn join(&mut self, lease: &Lease) -> Result<Place> {
        let key = self.key_of(lease.id);
        let create = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                "",
                Some(PutOptions::new().with_lease(lease.id)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        self.requests += 1;
        let answer = self
            .runtime
            .block_on(self.client.txn(create))
            .context("etcd: joining the queue")?;
        let revision = if answer.succeeded() {
            // A created key's create revision is the transaction's own revision.
            answer.header().map(|h| h.revision()).unwrap_or_default()
        } else {
            match answer.op_responses().first() {
                Some(etcd_client::TxnOpResponse::Get(found)) => found
                    .kvs()
                    .first()
                    .map(|kv| kv.create_revision())
                    .unwrap_or_default(),
                _ => 0,
            }
        };
        if revision <= 0 {
            return Err(anyhow!(
                "etcd: joined the queue but read no create revision"
            ));
        }
        Ok(Place { key, revision })
    }

    /// The waiter just ahead of `place`: the key under the prefix with the highest create
    /// revision below ours, and the revision etcd answered at.
    fn predecessor(&mut self, place: &Place) -> Result<(Option<String>, i64)> {
        let options = GetOptions::new()
            .with_prefix()
            .with_max_create_revision(place.revision - 1)
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(1)
            .with_keys_only();
        self.requests += 1;
        let found = self
            .runtime
            .block_on(self.client.get(format!("{}/", self.prefix), Some(options)))
            .context("etcd: looking for the waiter ahead")?;
        let at = found.header().map(|h| h.revision()).unwrap_or_default();
        let key = found
            .kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned());
        Ok((key, at))
    }

    /// Is `place` still in the queue, with our lease on it? What a waiter asks when it
    /// wakes from a pause, before it acts on anything it believed before.
    pub fn still_queued(&mut self, place: &Place, lease: i64) -> Result<bool> {
        self.requests += 1;
        let found = self
            .runtime
            .block_on(self.client.get(place.key.as_str(), None))
            .context("etcd: reading back our queue key")?;
        Ok(found
            .kvs()
            .first()
            .is_some_and(|kv| kv.lease() == lease && kv.create_revision() == place.revision))
    }

    /// ✅ Step 3: waits until no older key is left, watching only the one just ahead.
    ///
    /// Woken by its predecessor's delete, a waiter ✅ looks again rather than assume it
    /// holds: the predecessor may have been a waiter that gave up, was killed or expired
    /// while an older key still holds. ❌ Taking the delete as "my turn" makes two holders.
    /// Before it answers Holder, it ✅ reads its own key back: a waiter frozen past its
    /// lease finds no older key — and no key of its own either.
    pub fn wait_turn(&mut self, place: &Place, lease: &Lease, wait: Duration) -> Result<Turn> {
        let give_up = tokio::time::Instant::now() + wait;
        loop {
            if let Step::Over(turn) = self.wait_step(place, lease, give_up)? {
                return Ok(turn);
            }
        }
    }

    /// One step of [`EtcdQueue::wait_turn`]: look who is ahead; if nobody, the wait is
    /// over; else watch that key until it is deleted, then look again and say what we saw.
    pub fn wait_step(
        &mut self,
        place: &Place,
        lease: &Lease,
        give_up: tokio::time::Instant,
    ) -> Result<Step> {
        if !lease.alive() {
            return Ok(Step::Over(Turn::LeaseLost));
        }
        let (ahead, at) = match self.looked.take() {
            Some(looked) => looked,
            None => self.predecessor(place)?,
        };
        let Some(ahead) = ahead else {
            return Ok(Step::Over(if self.still_queued(place, lease.id)? {
                Turn::Holder {
                    token: place.revision,
                    at,
                }
            } else {
                Turn::Gone
            }));
        };
        match self.until_deleted(&ahead, at, lease, give_up)? {
            Watched::Deleted => {
                let looked = self.predecessor(place)?;
                let next = looked.0.clone();
                self.looked = Some(looked);
                Ok(Step::Woke {
                    gone: ahead,
                    ahead: next,
                })
            }
            Watched::LeaseLost => Ok(Step::Over(Turn::LeaseLost)),
            Watched::TimedOut => Ok(Step::Over(Turn::TimedOut)),
            Watched::Quit => Ok(Step::Over(Turn::Quit)),
        }
    }

    /// ❌ The herd: every waiter on one key. Create it if nobody has it; otherwise watch it
    /// and try again when it is deleted — along with every other waiter.
    ///
    /// The key's create revision is still a valid token (the key is created anew by each
    /// holder, later than the last), but the order of holders is whoever's transaction
    /// etcd decided first after the delete: a race that the oldest waiter can lose.
    /// `asked` is called after each try (the first one is the waiter's place in the order
    /// of asking).
    pub fn herd_acquire(
        &mut self,
        lease: &Lease,
        wait: Duration,
        mut asked: impl FnMut(),
    ) -> Result<Turn> {
        let key = format!("{}/lock", self.prefix);
        let give_up = tokio::time::Instant::now() + wait;
        loop {
            if !lease.alive() {
                return Ok(Turn::LeaseLost);
            }
            let take = Txn::new()
                .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.as_str(),
                    format!("{:x}", lease.id),
                    Some(PutOptions::new().with_lease(lease.id)),
                )]);
            self.requests += 1;
            let answer = self
                .runtime
                .block_on(self.client.txn(take))
                .context("etcd: trying the lock key")?;
            let at = answer.header().map(|h| h.revision()).unwrap_or_default();
            asked();
            if answer.succeeded() {
                return Ok(Turn::Holder { token: at, at });
            }
            match self.until_deleted(&key, at, lease, give_up)? {
                Watched::Deleted => continue,
                Watched::LeaseLost => return Ok(Turn::LeaseLost),
                Watched::TimedOut => return Ok(Turn::TimedOut),
                Watched::Quit => return Ok(Turn::Quit),
            }
        }
    }

    /// The herd's release: deletes the lock key if it is still ours (a transaction on its
    /// value, our lease id), so a holder whose lease expired cannot delete its successor's.
    pub fn herd_release(&mut self, lease: i64) -> Result<bool> {
        let key = format!("{}/lock", self.prefix);
        let ours = Txn::new()
            .when([Compare::value(
                key.as_str(),
                CompareOp::Equal,
                format!("{lease:x}"),
            )])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        self.requests += 1;
        let answer = self
            .runtime
            .block_on(self.client.txn(ours))
            .context("etcd: releasing the lock key")?;
        Ok(answer.succeeded())
    }

    /// Leaves the queue: deletes our key (which holds or waits). Our key's name carries our
    /// lease id, so no other waiter owns it; true if it was still there.
    pub fn leave(&mut self, place: &Place) -> Result<bool> {
        self.requests += 1;
        let answer = self
            .runtime
            .block_on(self.client.delete(place.key.as_str(), None))
            .context("etcd: leaving the queue")?;
        Ok(answer.deleted() > 0)
    }

    /// The store's revision now: where a history of the queue begins.
    pub fn revision_now(&mut self) -> Result<i64> {
        let options = GetOptions::new().with_prefix().with_count_only();
        let found = self
            .runtime
            .block_on(self.client.get(format!("{}/", self.prefix), Some(options)))
            .context("etcd: reading the current revision")?;
        Ok(found.header().map(|h| h.revision()).unwrap_or_default())
    }

    /// Every key that lived under the prefix since revision `from`, with the revisions of
    /// its creation and deletion, read from etcd's own history of changes: a watch that
    /// starts in the past replays every put and delete in the order etcd decided them.
    ///
    /// The replay ends at a marker key put now (and deleted after): the last event is known.
    /// A history compacted past `from` cannot be replayed: an error says so.
    pub fn key_lives(&mut self, from: i64) -> Result<Vec<KeyLife>> {
        let marker = format!("{}/~end", self.prefix);
        let put = self
            .runtime
            .block_on(self.client.put(marker.as_str(), "", None))
            .context("etcd: marking the end of the queue's history")?;
        let end = put.header().map(|h| h.revision()).unwrap_or_default();
        let prefix = format!("{}/", self.prefix);
        let client = &mut self.client;
        let lives = self.runtime.block_on(async {
            let options = WatchOptions::new().with_prefix().with_start_revision(from);
            let mut stream = client
                .watch(prefix.as_str(), Some(options))
                .await
                .context("etcd: replaying the queue's history")?;
            let mut lives: Vec<KeyLife> = Vec::new();
            loop {
                let message = tokio::time::timeout(Duration::from_secs(5), stream.message())
                    .await
                    .map_err(|_| anyhow!("etcd: the history's replay stalled"))?
                    .context("etcd: the history's replay")?
                    .ok_or_else(|| anyhow!("etcd closed the history's replay"))?;
                if message.compact_revision() > 0 || message.canceled() {
                    return Err(anyhow!(
                        "etcd compacted its history up to revision {} (the queue began at {from})",
                        message.compact_revision()
                    ));
                }
                for event in message.events() {
                    let Some(kv) = event.kv() else { continue };
                    let key = String::from_utf8_lossy(kv.key()).into_owned();
                    if key == marker {
                        continue;
                    }
                    match event.event_type() {
                        EventType::Put if kv.version() == 1 => lives.push(KeyLife {
                            key,
                            created: kv.create_revision(),
                            deleted: None,
                        }),
                        EventType::Delete => {
                            if let Some(life) = lives
                                .iter_mut()
                                .rev()
                                .find(|l| l.key == key && l.deleted.is_none())
                            {
                                life.deleted = Some(kv.mod_revision());
                            }
                        }
                        EventType::Put => {}
                    }
                }
                if message
                    .events()
                    .iter()
                    .any(|e| e.kv().is_some_and(|kv| kv.mod_revision() >= end))
                {
                    return Ok(lives);
                }
            }
        });
        let _ = self
            .runtime
            .block_on(self.client.delete(marker.as_str(), None));
        lives
    }

    /// Watches `key` from just after revision `at` until a delete of it arrives.
    ///
    /// Starting at `at + 1` matters: the key may be deleted between our read and the watch,
    /// and a watch from "now" would miss that delete and wait forever.
    fn until_deleted(
        &mut self,
        key: &str,
        at: i64,
        lease: &Lease,
        give_up: tokio::time::Instant,
    ) -> Result<Watched> {
        self.requests += 1;
        let client = &mut self.client;
        let wakeups = &mut self.wakeups;
        let quit = self.quit.clone();
        let told_to_quit = async move {
            match quit {
                Some(quit) => {
                    while !quit.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
                None => std::future::pending::<()>().await,
            }
        };
        self.runtime.block_on(async {
            tokio::pin!(told_to_quit);
            let options = WatchOptions::new().with_start_revision(at + 1);
            let mut stream = client
                .watch(key, Some(options))
                .await
                .context("etcd: watching the key ahead")?;
            loop {
                let message = tokio::select! {
                    message = stream.message() => message.context("etcd: the watch")?,
                    () = lease.lost() => return Ok(Watched::LeaseLost),
                    () = tokio::time::sleep_until(give_up) => return Ok(Watched::TimedOut),
                    () = &mut told_to_quit => return Ok(Watched::Quit),
                };
                let Some(message) = message else {
                    return Err(anyhow!("etcd closed the watch"));
                };
                if message.canceled() {
                    return Err(anyhow!(
                        "etcd cancelled the watch: {}",
                        message.cancel_reason()
                    ));
                }
                if message.events().is_empty() {
                    continue;
                }
                *wakeups += 1;
                if message
                    .events()
                    .iter()
                    .any(|event| event.event_type() == EventType::Delete)
                {
                    return Ok(Watched::Deleted);
                }
            }
        })
    }
}

enum Watched {
    Deleted,
    LeaseLost,
    TimedOut,
    Quit,
}
