//! The lost reply on etcd: A calls etcd's lock with its lease, etcd puts A's key
//! `<name>/<lease>` and, the lock being free, answers at once — and the proxy swallows the
//! answer. A's call times out; its connection is closed. What is in etcd, and what does each
//! retry make of it?
//!
//! - ✅ the **same lease** again: etcd's lock puts A's key only if it does not exist, so the
//!   retry finds the key the lost call made and returns it: the lock is A's since then;
//! - ❌ a **new lease**: a second key, queued behind A's first one, which holds the lock
//!   until its lease runs out (here nothing keeps it alive; a client library's session,
//!   whose keepalive goes on, would keep A waiting on itself for as long as it runs);
//! - ❌ **give up**: the key holds the lock, nobody working under it, until the lease ends.
//!
//! And one more: the lock is *not* free — the lab holds it — so A's call waits in etcd's
//! queue when its client gives up and closes the connection. etcd's lock service means to
//! delete a waiter's key when its call is cancelled, but it sends that delete without the
//! caller's user, and with auth on (the lab's own etcd always has it) etcd refuses it
//! ("auth: user name is empty", etcd-io/etcd#13330): A's waiter key stays queued, and when
//! the lab lets go etcd hands the lock to it, for a client that has gone, until its lease
//! ends. Without auth the key is deleted. Either way the cleanup is best-effort: a client
//! whose lock call failed revokes its own lease.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use etcd_client::{Client, GetOptions, LockOptions, SortOrder, SortTarget};
use tokio::runtime::Runtime;

use super::Plan;
use super::lost_reply::{Retried, open, run_line};
use crate::check::network::{self as checks, Policy, QueuedFound, ReplyEvidence, ReplyFound};
use crate::connect::{self, Backend};
use crate::events::Event;
use crate::events::facts::{Acquired, Expired, GaveUp, HolderNow};
use crate::labs::Stage;
use crate::labs::faults::Hand;
use crate::labs::runner::Run;
use crate::labs::step;
use crate::nemesis::Fault;
use crate::nemesis::schedule::How;
use crate::output::human;
use crate::proxy::{self, Direction, NetFault, Proxy};

/// The three retries, then the queued call.
pub(super) fn play(plan: &Plan, run: &Run) -> Result<(Vec<ReplyFound>, Option<QueuedFound>)> {
    let runtime = connect::etcd_runtime()?;
    let mut found = Vec::new();
    for policy in [Policy::SameOwner, Policy::NewOwner, Policy::GiveUp] {
        found.push(lost_lock(plan, run, &runtime, policy)?);
    }
    let queued = queued(plan, run, &runtime)?;
    Ok((found, Some(queued)))
}

/// One part's lock name, proxy, and A's and the lab's clients.
struct Part {
    name: String,
    path: Proxy,
    through: String,
    lab: Client,
}

fn part(run: &Run, runtime: &Runtime, stage: &mut Stage, label: &str) -> Result<Part> {
    let url = run.url(Backend::Etcd);
    let name = format!("lockslab:{}:network:lost-lock:{label}", run.id);
    let path = Proxy::start("A→etcd", proxy::upstream_of(url)?)?;
    let through = proxy::through(url, path.addr())?;
    stage.record(run_line(
        run,
        Some(&name),
        format!(
            "the lock is etcd's lock named {name}; A's path to etcd, A→etcd, goes through the fault proxy on {}",
            path.addr()
        ),
    ));
    let lab = runtime.block_on(connect::etcd(url))?;
    Ok(Part {
        name,
        path,
        through,
        lab,
    })
}

/// How long A waits for an answer before it gives the call up.
const PATIENCE: Duration = Duration::from_millis(500);

/// A's lease, in etcd's whole seconds: the lab's TTL rounded up, plus two, so that it
/// outlives A's patience by well over a second and the retries have something to find.
fn lease_seconds(plan: &Plan) -> i64 {
    plan.ttl.as_secs_f64().ceil().max(1.0) as i64 + 2
}

/// The key holding the lock (the lowest create revision under the name), and its revision.
fn holder(runtime: &Runtime, lab: &mut Client, name: &str) -> Result<Option<(String, i64)>> {
    let options = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend);
    let found = runtime.block_on(lab.get(format!("{name}/"), Some(options)))?;
    Ok(found.kvs().first().map(|kv| {
        (
            String::from_utf8_lossy(kv.key()).into_owned(),
            kv.create_revision(),
        )
    }))
}

/// Whether `key` exists under the lock's name.
fn exists(runtime: &Runtime, lab: &mut Client, key: &str) -> Result<bool> {
    Ok(!runtime.block_on(lab.get(key, None))?.kvs().is_empty())
}

/// A's lock call with its answer swallowed: the proxy's down direction is a black hole
/// while A calls, A's call times out after `patience`, A closes its connection, the path
/// heals. Returns the key A's call asked etcd for.
fn call_unanswered(
    runtime: &Runtime,
    stage: &mut Stage,
    (part, hand): (&Part, &mut Hand),
    lease: i64,
    patience: Duration,
) -> Result<String> {
    let mut a = runtime.block_on(connect::etcd(&part.through))?;
    // The connection is up and idle before the fault: only the lock call's answer is lost.
    // The read names a key of the run's own (beside the lock's, not under it): a room
    // seat's etcd user may touch nothing else.
    runtime.block_on(a.get(format!("{}:warm-up", part.name), None))?;
    let answers = How {
        proxy: Some(NetFault::BlackHole),
        direction: Some(Direction::Down),
        ..How::default()
    };
    let path = part.path.path();
    hand.net(
        stage,
        (Fault::Cut, path, answers.clone()),
        "the proxy on A→etcd lets A's requests through and swallows everything etcd answers",
    )?;
    let name = part.name.clone();
    let call = a.lock(name.as_str(), Some(LockOptions::new().with_lease(lease)));
    let answered = runtime.block_on(async { tokio::time::timeout(patience, call).await });
    if let Ok(answer) = answered {
        bail!("A's lock call was answered through a black hole: {answer:?}");
    }
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(3);
    while part.path.connections() > 0 {
        if Instant::now() > deadline {
            bail!("A's connection through the proxy did not close");
        }
        // The client's connection task runs on this runtime: let it see the drop.
        runtime.block_on(async { tokio::time::sleep(Duration::from_millis(10)).await });
    }
    let that_way = How {
        direction: answers.direction,
        ..How::default()
    };
    hand.net(
        stage,
        (Fault::Heal, path, that_way),
        format!(
            "no answer within {}: A's client gives the call up and closes its connection (the proxy saw it close); the path heals",
            human(patience)
        ),
    )?;
    Ok(format!("{name}/{lease:x}"))
}

/// One retry policy after a lost answer to a free lock.
fn lost_lock(plan: &Plan, run: &Run, runtime: &Runtime, policy: Policy) -> Result<ReplyFound> {
    let (label, says) = match policy {
        Policy::SameOwner => ("same-lease", "A retries with the same lease"),
        Policy::NewOwner => ("new-lease", "A retries with a new lease"),
        Policy::GiveUp => ("give-up", "A gives up"),
    };
    let mut stage = open(
        run,
        &format!("a lost reply to etcd's lock: {says}"),
        &format!("etcd-{label}"),
        step::network::before_lost_lock(policy.as_str()),
    );
    let mut part = part(run, runtime, &mut stage, label)?;
    let mut hand = Hand::new(&stage).on_path(&part.path);
    let seconds = lease_seconds(plan);
    let mut a = runtime.block_on(connect::etcd(&part.through))?;
    let granted = runtime.block_on(a.lease_grant(seconds, None))?;
    let (lease, lease_ttl) = (granted.id(), Duration::from_secs(granted.ttl() as u64));
    drop(a);
    let sent = Instant::now();
    let key = call_unanswered(runtime, &mut stage, (&part, &mut hand), lease, PATIENCE)?;
    let lab = (&mut part.lab, part.name.as_str());
    let after_loss = read_after_loss(runtime, &mut stage, lab, &key, lease_ttl)?;
    let mut a = runtime.block_on(connect::etcd(&part.through))?;
    let wait = lease_ttl * 2 + Duration::from_secs(5);
    let retry = Retry {
        runtime,
        name: &part.name,
        wait,
    };
    let (retried, new_lease) = match policy {
        Policy::SameOwner => (retry.same_lease(&mut stage, &mut a, (lease, &key))?, None),
        Policy::NewOwner => {
            let (retried, new) = retry.new_lease(&mut stage, &mut a, seconds, sent)?;
            (retried, Some(new))
        }
        Policy::GiveUp => (retry.give_up(&mut stage, &mut part.lab, &key, sent)?, None),
    };
    let held_by = holder(runtime, &mut part.lab, &part.name)?.map(|(k, _)| k);
    for lease in std::iter::once(lease).chain(new_lease) {
        let _ = runtime.block_on(part.lab.lease_revoke(lease));
    }
    let _ = runtime.block_on(part.lab.delete(
        format!("{}/", part.name),
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    ));
    stage.drain();
    Ok(checks::lost_set(&ReplyEvidence {
        policy,
        sent_owner: &key,
        after_loss: after_loss.as_ref().map(|(k, _)| k.as_str()),
        believed: retried.believed.as_deref(),
        held_by: held_by.as_deref(),
        waited_ms: retried.waited_ms,
        first_key_ms: retried.first_key_ms,
    }))
}

/// Reads the lock back on the lab's own connection once the answer was lost: the key that
/// holds it, and its create revision.
fn read_after_loss(
    runtime: &Runtime,
    stage: &mut Stage,
    (lab, name): (&mut Client, &str),
    key: &str,
    lease_ttl: Duration,
) -> Result<Option<(String, i64)>> {
    let after_loss = holder(runtime, lab, name)?;
    let applied = after_loss.as_ref().is_some_and(|(k, _)| k == key);
    stage.record(Event::new(
        "etcd",
        HolderNow {
            holder: after_loss.as_ref().map(|(k, _)| k.clone()),
            key: Some(key.into()),
            backend: Some("etcd".into()),
            ..HolderNow::default()
        },
        match &after_loss {
            Some((_, revision)) if applied => format!(
                "read back on the lab's own connection: A's key {} holds the lock (create revision {revision}), on A's lease of {} that nothing keeps alive — the lock call was applied, only its answer was lost",
                tail(key),
                human(lease_ttl)
            ),
            Some((other, _)) => format!("read back: the lock is held by {}, not A's key", tail(other)),
            None => "read back: no key under the lock's name — the call was not applied".into(),
        },
    ));
    Ok(after_loss)
}

/// What A does after the lost answer, on etcd's lock named `name`, waiting at most `wait`.
struct Retry<'r> {
    runtime: &'r Runtime,
    name: &'r str,
    wait: Duration,
}

impl Retry<'_> {
    /// A's word that it holds the lock under `key`.
    fn acquired(&self, key: &str) -> Acquired {
        Acquired {
            lock: Some(self.name.into()),
            owner: Some(key.into()),
            backend: Some("etcd".into()),
            ..Acquired::default()
        }
    }

    /// A's call to etcd's lock with `lease`, answered within the wait: the key it got.
    fn lock_with(&self, a: &mut Client, lease: i64) -> Result<String> {
        let call = a.lock(self.name, Some(LockOptions::new().with_lease(lease)));
        let wait = self.wait;
        let answer =
            (self.runtime).block_on(async { tokio::time::timeout(wait, call).await })??;
        Ok(String::from_utf8_lossy(answer.key()).into_owned())
    }

    /// ✅ The same lease again: etcd finds the key the lost call made and returns it.
    fn same_lease(
        &self,
        stage: &mut Stage,
        a: &mut Client,
        (lease, key): (i64, &str),
    ) -> Result<Retried> {
        let got = self.lock_with(a, lease)?;
        stage.record(Event::new(
            "A",
            Acquired {
                tries: Some(2),
                ..self.acquired(&got)
            },
            if got == key {
                format!(
                    "retries lock with the same lease: etcd answers at once with the key {} — the one the lost call made; the lock is A's, and its lease has run since then",
                    tail(&got)
                )
            } else {
                format!("retries lock with the same lease: etcd answers with the key {}", tail(&got))
            },
        ));
        Ok(Retried {
            believed: Some(got),
            ..Retried::default()
        })
    }

    /// ❌ A new lease: a second key, queued behind A's first one until its lease runs out.
    /// Returns the new lease too, for the lab to revoke.
    fn new_lease(
        &self,
        stage: &mut Stage,
        a: &mut Client,
        seconds: i64,
        sent: Instant,
    ) -> Result<(Retried, i64)> {
        // A lease that outlives the wait, so that only the first one can end it.
        let granted = self
            .runtime
            .block_on(a.lease_grant(seconds * 3 + 5, None))?;
        let started = Instant::now();
        let got = self.lock_with(a, granted.id())?;
        let waited = started.elapsed();
        let waited_ms = Some(waited.as_millis() as u64);
        stage.record(Event::new(
            "A",
            Acquired {
                waited_ms,
                ..self.acquired(&got)
            },
            format!(
                "retried lock with a new lease: its new key {} queued behind its first key and got the lock after {}, once the first lease ran out (nothing kept it alive; a session's keepalive would have kept A waiting on itself as long as it ran)",
                tail(&got),
                human(waited)
            ),
        ));
        // etcd answered once A's first key was gone: that key held the lock until now,
        // while A, queued behind it, worked under nothing.
        let retried = Retried {
            believed: Some(got),
            waited_ms,
            first_key_ms: Some(sent.elapsed().as_millis() as u64),
        };
        Ok((retried, granted.id()))
    }

    /// ❌ Give up: the key holds the lock, nobody working under it, until the lease ends.
    fn give_up(
        &self,
        stage: &mut Stage,
        lab: &mut Client,
        key: &str,
        sent: Instant,
    ) -> Result<Retried> {
        stage.record(Event::new(
            "A",
            GaveUp {
                why: Some("no answer to lock: A treats the lock as not taken and goes away".into()),
                owner: Some(key.into()),
                ..GaveUp::default()
            },
            "gives up: no answer, so A believes it does not hold the lock, and goes away",
        ));
        let deadline = Instant::now() + self.wait;
        while exists(self.runtime, lab, key)? {
            if Instant::now() > deadline {
                bail!("A's abandoned lock key did not go");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let orphaned = sent.elapsed();
        stage.record(Event::new(
            "etcd",
            Expired {
                lock: Some(self.name.into()),
                ..Expired::default()
            },
            format!(
                "A's lease expired and etcd deleted A's key with it, {} after A's call: all that time the lock was taken and nobody worked under it",
                human(orphaned)
            ),
        ));
        Ok(Retried {
            first_key_ms: Some(orphaned.as_millis() as u64),
            ..Retried::default()
        })
    }
}

/// A's lock call queued behind the lab's lock when its answer (none yet) and connection go.
fn queued(plan: &Plan, run: &Run, runtime: &Runtime) -> Result<QueuedFound> {
    let mut stage = open(
        run,
        "a lost lock call while A waits in etcd's queue",
        "etcd-queued",
        step::network::before_lost_lock("queued"),
    );
    let mut part = part(run, runtime, &mut stage, "queued")?;
    let mut hand = Hand::new(&stage).on_path(&part.path);
    let seconds = lease_seconds(plan);
    let lab_lease = runtime
        .block_on(part.lab.lease_grant(seconds * 3 + 5, None))?
        .id();
    let name = part.name.clone();
    let held = runtime.block_on(part.lab.lock(
        name.as_str(),
        Some(LockOptions::new().with_lease(lab_lease)),
    ))?;
    let lab_key = String::from_utf8_lossy(held.key()).into_owned();
    stage.record(Event::new(
        "lab",
        Acquired {
            lock: Some(name.clone()),
            owner: Some(lab_key.clone()),
            backend: Some("etcd".into()),
            ..Acquired::default()
        },
        format!("takes the lock first, with the key {}", tail(&lab_key)),
    ));
    let mut a = runtime.block_on(connect::etcd(&part.through))?;
    let lease = runtime.block_on(a.lease_grant(seconds * 3 + 5, None))?.id();
    drop(a);
    let key = call_unanswered(runtime, &mut stage, (&part, &mut hand), lease, PATIENCE)?;
    // The server may take a moment to see the connection gone.
    std::thread::sleep(Duration::from_millis(300));
    let key_left = exists(runtime, &mut part.lab, &key)?;
    let auth = connect::etcd_credentials(run.url(Backend::Etcd))
        .1
        .is_some();
    let why = if auth {
        " (auth is on, and etcd refuses the delete its lock service sends without a user: etcd-io/etcd#13330)"
    } else {
        ""
    };
    stage.record(Event::new(
        "etcd",
        HolderNow {
            holder: Some(lab_key.clone()),
            key: Some(key.clone()),
            backend: Some("etcd".into()),
            ..HolderNow::default()
        },
        if key_left {
            format!(
                "read back: A's waiter key {} is still in the queue behind the lab's, though A's call and connection are gone{why}",
                tail(&key)
            )
        } else {
            format!(
                "read back: A's waiter key {} is gone — etcd deleted it when A's call went away (its lease lives on)",
                tail(&key)
            )
        },
    ));
    runtime.block_on(part.lab.unlock(lab_key.as_str()))?;
    std::thread::sleep(Duration::from_millis(100));
    let now = holder(runtime, &mut part.lab, &name)?.map(|(k, _)| k);
    let handed_to_a = now.as_deref() == Some(key.as_str());
    stage.record(Event::new(
        "etcd",
        HolderNow {
            holder: now.clone(),
            key: Some(name.clone()),
            backend: Some("etcd".into()),
            ..HolderNow::default()
        },
        if handed_to_a {
            "the lab lets go: the lock passes to A's key, held for a client that has gone, until its lease ends".to_string()
        } else {
            format!(
                "the lab lets go: the lock is held by {}",
                now.as_deref().map_or("nobody".into(), tail)
            )
        },
    ));
    let _ = runtime.block_on(part.lab.lease_revoke(lease));
    let _ = runtime.block_on(part.lab.lease_revoke(lab_lease));
    stage.drain();
    Ok(QueuedFound {
        auth,
        key_left,
        handed_to_a,
    })
}

/// `…/<lease>` of a lock key, for the timeline.
fn tail(key: &str) -> String {
    key.rsplit_once('/')
        .map_or(key.to_string(), |(_, lease)| format!("…/{lease}"))
}
