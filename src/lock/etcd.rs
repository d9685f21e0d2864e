//! The etcd lock: a lease per client, a heartbeat that keeps it alive, and a lock key whose
//! revision is a fencing token.
//!
//! Read it next to [`super::redis`]. Both are leases — the lock goes away on its own when
//! its time runs out — but they run out differently:
//!
//! - Redis counts down one TTL per acquisition, fixed when the key is set. The holder must
//!   pick it long enough for the work, and a crashed holder blocks everyone until it ends.
//! - etcd counts down a **lease** that the holder renews with a heartbeat (every TTL/3
//!   here). The TTL can be short because a live holder keeps renewing it; a dead or frozen
//!   one stops, and the lock goes about one TTL later, whatever the length of the work.
//!
//! And etcd gives something Redis's lock does not: every change in etcd gets the next
//! revision of its one, totally ordered history, and the lock key's create revision is a
//! number that grows from holder to holder — a fencing token for free.
//!
//! Three traps this file handles, each commented where it happens:
//! - a lock call can return *after* the caller's lease expired: it is not a lock;
//! - the heartbeat can fail or get `TTL 0` back: the lock is gone, say so;
//! - the lock response carries two revisions, and only one of them is a safe token.
//!
//! etcd-client is async; [`EtcdLock`] owns a small single-threaded tokio runtime and offers
//! blocking methods, so the lab's code reads like the Redis and Postgres locks beside it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use etcd_client::{Client, GetOptions, LockOptions, SortOrder, SortTarget};
use tokio::runtime::Runtime;

use crate::connect;

/// How long one lock call may wait before we re-check the clock and call again. It stays
/// below the client's request timeout ([`connect::COMMAND_TIMEOUT`]), which would otherwise
/// end a long wait with an error.
const LOCK_CALL_LIMIT: Duration = Duration::from_secs(4);

/// What the heartbeat reports.
#[derive(Clone, Debug)]
pub enum Beat {
    /// etcd renewed the lease for another `ttl` seconds.
    Renewed { ttl: i64 },
    /// The lease cannot be vouched for any more: it expired (etcd answered TTL 0), or the
    /// heartbeat got no answer, or an error. Whatever this client locked with it is gone.
    Lost { why: String },
}

/// A lease this client owns, kept alive by a heartbeat thread until dropped or revoked.
pub struct Lease {
    pub id: i64,
    /// The TTL etcd granted, which may be longer than asked: etcd rounds up to its own
    /// minimum (derived from its election timeout), so read it back rather than assume.
    pub ttl: Duration,
    heartbeat: Heartbeat,
}

impl Lease {
    /// False once the heartbeat has reported the lease lost.
    pub fn alive(&self) -> bool {
        !self.heartbeat.lost.load(Ordering::SeqCst)
    }
}

/// One acquisition of the lock.
#[derive(Clone, Debug)]
pub struct Held {
    /// The lock key etcd created for us: `<name>/<lease id in hex>`.
    pub key: String,
    /// The key's create revision: the fencing token (see [`EtcdLock::acquire_within`]).
    pub token: i64,
    /// How long the lease had left when we checked it, right after the lock call.
    pub ttl_left: Duration,
}

/// How a lock attempt ended.
#[derive(Debug)]
pub enum Acquired {
    Held(Held),
    /// Nobody released the lock within the wait.
    TimedOut,
    /// The lock call returned, but our lease had expired by then: the key it would have
    /// held is gone, and someone else may hold the lock. Not a lock.
    LeaseExpired,
}

pub struct EtcdLock {
    runtime: Runtime,
    client: Client,
    url: String,
    /// The lock's name; etcd puts each contender's key under `<name>/`.
    pub name: String,
}

impl EtcdLock {
    pub fn connect(url: &str, name: &str) -> Result<EtcdLock> {
        let runtime = connect::etcd_runtime()?;
        let client = runtime.block_on(connect::etcd(url))?;
        Ok(EtcdLock {
            runtime,
            client,
            url: url.to_string(),
            name: name.to_string(),
        })
    }

    /// Grants this client its own lease and starts its heartbeat: a keepalive every TTL/3.
    ///
    /// One lease per client, never shared: the lease *is* the client's liveness, as etcd
    /// sees it. `on_beat` hears every renewal and the loss, from the heartbeat's thread.
    pub fn grant_lease(
        &mut self,
        ttl: Duration,
        on_beat: impl FnMut(Beat) + Send + 'static,
    ) -> Result<Lease> {
        let seconds = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let granted = self
            .runtime
            .block_on(self.client.lease_grant(seconds, None))
            .context("etcd: granting a lease")?;
        if !granted.error().is_empty() {
            return Err(anyhow!("etcd: granting a lease: {}", granted.error()));
        }
        let ttl = Duration::from_secs(granted.ttl().max(1) as u64);
        let heartbeat = Heartbeat::start(self.url.clone(), granted.id(), ttl / 3, on_beat);
        Ok(Lease {
            id: granted.id(),
            ttl,
            heartbeat,
        })
    }

    /// Takes the lock with `lease`, waiting at most `wait` for the current holder to go.
    ///
    /// etcd's lock puts a key `<name>/<lease>` attached to our lease, then waits until every
    /// key under `<name>/` created before ours is gone. The holder is the key with the
    /// lowest create revision.
    ///
    /// ✅ **The token is the key's create revision**, read back from the key itself. Holders
    /// follow each other in create-revision order (the next holder is always the oldest
    /// remaining key), so it only grows from holder to holder, and it names this acquisition
    /// for as long as it lasts. ❌ The response header's revision looks just as good but is
    /// not: it is merely etcd's revision when the answer was sent. A client whose lease
    /// expired while it waited still gets an answer, stamped later than the real holder's
    /// acquisition — a *higher* number in the hands of someone who holds nothing.
    ///
    /// ✅ **A returned lock call is checked before it is trusted.** If our lease expired
    /// while we waited (we were frozen, the heartbeat lost its connection), etcd deleted our
    /// key, yet the waiting call may still return success once the older keys are gone.
    /// Only the key's presence, with our lease on it, says that we hold the lock.
    pub fn acquire_within(&mut self, lease: &Lease, wait: Duration) -> Result<Acquired> {
        let deadline = Instant::now() + wait;
        loop {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return Ok(Acquired::TimedOut);
            };
            if !lease.alive() {
                return Ok(Acquired::LeaseExpired);
            }
            let call = self.client.lock(
                self.name.as_str(),
                Some(LockOptions::new().with_lease(lease.id)),
            );
            let answer = self
                .runtime
                .block_on(async { tokio::time::timeout(left.min(LOCK_CALL_LIMIT), call).await });
            let key = match answer {
                // Still waiting: drop the call (etcd deletes the waiting key) and call again.
                Err(_elapsed) => continue,
                Ok(result) => {
                    let response = result.context("etcd: lock")?;
                    String::from_utf8_lossy(response.key()).into_owned()
                }
            };
            match self.check(&key, lease.id)? {
                Some(held) => return Ok(Acquired::Held(held)),
                None if self.lease_ttl(lease.id)? <= 0 => return Ok(Acquired::LeaseExpired),
                // Our key went missing while the lease lives on (a cancelled call's clean-up
                // can delete the key a retry reused): not a lock, but we may try again.
                None => continue,
            }
        }
    }

    /// The lock is ours if our key exists with our lease on it; its create revision is the token.
    fn check(&mut self, key: &str, lease: i64) -> Result<Option<Held>> {
        let found = self
            .runtime
            .block_on(self.client.get(key, None))
            .context("etcd: reading back the lock key")?;
        let Some(kv) = found.kvs().first().filter(|kv| kv.lease() == lease) else {
            return Ok(None);
        };
        let token = kv.create_revision();
        let ttl = self.lease_ttl(lease)?;
        if ttl <= 0 {
            return Ok(None);
        }
        Ok(Some(Held {
            key: key.to_string(),
            token,
            ttl_left: Duration::from_secs(ttl as u64),
        }))
    }

    /// The lease's remaining TTL in seconds as etcd sees it; -1 once it has expired.
    pub fn lease_ttl(&mut self, lease: i64) -> Result<i64> {
        let answer = self
            .runtime
            .block_on(self.client.lease_time_to_live(lease, None))
            .context("etcd: lease time-to-live")?;
        Ok(answer.ttl())
    }

    /// Releases: deletes our lock key, then revokes the lease (stopping its heartbeat).
    ///
    /// The key's name contains our lease id, so no other client can own the same key: a
    /// plain delete cannot remove someone else's lock, which is the bug Redis needs a
    /// compare-and-delete script for. Returns false when the lease had already expired,
    /// i.e. the lock was gone before we let go of it.
    pub fn release(&mut self, lease: Lease, held: &Held) -> Result<bool> {
        let Lease { id, heartbeat, .. } = lease;
        heartbeat.stop();
        self.runtime
            .block_on(self.client.unlock(held.key.as_str()))
            .context("etcd: unlock")?;
        Ok(self.runtime.block_on(self.client.lease_revoke(id)).is_ok())
    }

    /// Who holds the lock now, as etcd says: the key under `<name>/` with the lowest create
    /// revision, and that revision. What a bystander (the lab) looks at.
    pub fn current_holder(&mut self) -> Result<Option<(String, i64)>> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let found = self
            .runtime
            .block_on(self.client.get(format!("{}/", self.name), Some(options)))
            .context("etcd: reading the lock's keys")?;
        Ok(found.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.key()).into_owned(),
                kv.create_revision(),
            )
        }))
    }

    /// Revokes a lease that holds no lock (a waiter that gave up).
    pub fn revoke(&mut self, lease: Lease) -> Result<bool> {
        let Lease { id, heartbeat, .. } = lease;
        heartbeat.stop();
        Ok(self.runtime.block_on(self.client.lease_revoke(id)).is_ok())
    }
}

/// The keepalive loop, on its own thread with its own runtime and connection.
///
/// Its own thread, because the worker's main thread is busy with the work (or blocked in a
/// lock call) and a single-threaded runtime only runs while someone drives it. When the
/// whole process is frozen this thread is frozen too — which is the point of the lab: a
/// heartbeat cannot outlive the pause of the process it speaks for.
struct Heartbeat {
    stop: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    fn start(
        url: String,
        lease: i64,
        every: Duration,
        mut on_beat: impl FnMut(Beat) + Send + 'static,
    ) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicBool::new(false));
        let (stop_flag, lost_flag) = (stop.clone(), lost.clone());
        let thread = thread::spawn(move || {
            let why = match keep_alive(&url, lease, every, &stop_flag, &mut on_beat) {
                Ok(None) => return,
                Ok(Some(why)) => why,
                Err(err) => format!("{err:#}"),
            };
            lost_flag.store(true, Ordering::SeqCst);
            on_beat(Beat::Lost { why });
        });
        Heartbeat {
            stop,
            lost,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Renews `lease` every `every` until told to stop (Ok(None)) or the lease is lost (the reason).
fn keep_alive(
    url: &str,
    lease: i64,
    every: Duration,
    stop: &AtomicBool,
    on_beat: &mut impl FnMut(Beat),
) -> Result<Option<String>> {
    let runtime = connect::etcd_runtime()?;
    runtime.block_on(async {
        let mut client = connect::etcd(url).await?;
        // Opening the stream sends the first keepalive; it fails if the lease is gone.
        let (mut keeper, mut answers) = client
            .lease_keep_alive(lease)
            .await
            .context("etcd: opening the keepalive stream")?;
        let mut last = Instant::now();
        loop {
            // Told to stop while a renewal is overdue (the process was just paused), the
            // heartbeat makes that one last renewal first: its answer says whether the lease
            // was still alive, and a loss must not go unreported because a release came first.
            let overdue = last.elapsed() >= every;
            if stop.load(Ordering::SeqCst) && !overdue {
                return Ok(None);
            }
            if !overdue {
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            last = Instant::now();
            keeper
                .keep_alive()
                .await
                .context("etcd: sending a keepalive")?;
            match tokio::time::timeout(every, answers.message()).await {
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => {
                    on_beat(Beat::Renewed { ttl: answer.ttl() })
                }
                // ❗ An "empty" answer is not a renewal: TTL 0 means etcd has expired the
                // lease, and every key attached to it — our lock — is already deleted.
                Ok(Ok(Some(_))) => {
                    return Ok(Some(
                        "etcd answered the keepalive with TTL 0: the lease has expired".into(),
                    ));
                }
                Ok(Ok(None)) => return Ok(Some("the keepalive stream was closed".into())),
                Ok(Err(err)) => return Ok(Some(format!("the keepalive failed: {err}"))),
                Err(_) => {
                    return Ok(Some(format!(
                        "no keepalive answer within {}ms: the lease may expire unseen",
                        every.as_millis()
                    )));
                }
            }
        }
    })
}
