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
//! The traps this file handles, each commented where it happens:
//! - a lock call can return *after* the caller's lease expired: it is not a lock;
//! - the lease's TTL reads in whole seconds rounded down: a live lease can read 0;
//! - a lock call cancelled and called again can have its key deleted under it;
//! - the heartbeat can get `TTL 0` back (the lock is gone, say so), or a late answer
//!   (not yet a loss: keep trying until the lease would have run out);
//! - the lock response carries two revisions, and only one of them is a safe token.
//!
//! etcd-client is async; [`EtcdLock`] owns a small single-threaded tokio runtime and offers
//! blocking methods, so the lab's code reads like the Redis and Postgres locks beside it.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, LockOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use tokio::runtime::Runtime;

use crate::connect;

/// What the heartbeat reports.
#[derive(Clone, Debug)]
pub enum Beat {
    /// etcd renewed the lease for another `ttl` seconds.
    Renewed { ttl: i64 },
    /// A keepalive failed while the lease may still be alive: the first failure after one
    /// that got through (not each retry). `timed_out`: no answer in time, rather than an
    /// error (a reset, a refused connection). The first moment the holder could know.
    Failed { timed_out: bool, why: String },
    /// The lease cannot be vouched for any more: etcd answered that it has expired, or no
    /// renewal got through before the last one ran out. Whatever this client locked with it
    /// is gone.
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

    /// Why the heartbeat gave the lease up, once it has.
    pub fn lost_why(&self) -> Option<String> {
        self.heartbeat.why.lock().ok().and_then(|why| why.clone())
    }

    /// Resolves once the heartbeat has given the lease up: raced against a lock call, so
    /// that a waiter whose lease is gone stops waiting at once.
    pub(crate) async fn lost(&self) {
        while self.alive() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// One acquisition of the lock.
#[derive(Clone, Debug)]
pub struct Held {
    /// The lock key etcd created for us: `<name>/<lease id in hex>`.
    pub key: String,
    /// The key's create revision: the fencing token (see [`EtcdLock::acquire_within`]).
    pub token: i64,
}

/// How a lock attempt ended.
#[derive(Debug)]
pub enum Acquired {
    Held(Held),
    /// Nobody released the lock within the wait.
    TimedOut,
    /// Our lease was lost while we waited (the heartbeat gave it up): our queued key went
    /// with it, so waiting on is pointless. `why` is the heartbeat's reason.
    LeaseLost {
        why: String,
    },
    /// The lock call returned, but the read-back did not find our key with our lease on it:
    /// the lease expired meanwhile, and someone else may hold the lock. Not a lock.
    NotALock {
        why: String,
    },
}

pub struct EtcdLock {
    runtime: Runtime,
    client: Client,
    url: String,
    /// The lock's name; etcd puts each contender's key under `<name>/`.
    pub name: String,
    /// etcd's words for each lock call the cluster dropped and [`EtcdLock::acquire_within`]
    /// asked again, oldest first: shared, so that a lab (or a test) can say what the
    /// election did to a call still waiting.
    dropped: Arc<Mutex<Vec<String>>>,
}

/// The errors etcd answers a request it neither did nor refused: the cluster lost or
/// changed its leader while the request was in flight. `leader changed`: a new leader
/// was elected under it. `request timed out` (also `…, possibly due to previous leader
/// failure` and `…, possibly due to connection lost`): its proposal was not committed
/// within the member's request timeout — a member cut off from its majority, or a leader
/// frozen past its election, says this; the proposal may still be committed later.
/// `raft proposal dropped` and `no leader`: a member that knows of no leader (mid-election)
/// turned it away. None of them means "no": each means "ask again once there is a leader".
pub fn dropped_by_the_cluster(err: &etcd_client::Error) -> bool {
    let words = err.to_string();
    [
        "leader changed",
        "request timed out",
        "proposal dropped",
        "no leader",
    ]
    .iter()
    .any(|said| words.contains(said))
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
            dropped: Arc::default(),
        })
    }

    /// etcd's words for each lock call the cluster dropped and this lock asked again (see
    /// [`dropped_by_the_cluster`]), shared: it fills as a call waits.
    pub fn dropped_calls(&self) -> Arc<Mutex<Vec<String>>> {
        Arc::clone(&self.dropped)
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
        let heartbeat = Heartbeat::start(self.url.clone(), granted.id(), ttl, on_beat);
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
    /// ✅ **One lock call per wait.** The call goes out on a client of its own whose request
    /// timeout covers the whole wait. ❌ Cancelling a waiting call and calling again is a
    /// trap: etcd (3.4) deletes the cancelled call's key in the background — and a new call
    /// with the same lease uses the *same key name*, so that late delete can remove the key
    /// the retry is queued (or already holding the lock) with. Each retry also goes to the
    /// back of the queue. The one call that is asked again is one the cluster dropped (a
    /// leader change, or a proposal not committed in time: [`dropped_by_the_cluster`]),
    /// within the same wait; see the comment where that happens: it too loses its place.
    /// Each is kept, in etcd's words, in [`EtcdLock::dropped_calls`].
    ///
    /// ✅ **The call is raced against the heartbeat.** If the lease is lost while we wait,
    /// our key is gone with it and the call can only end badly: we stop at once and say why.
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
    /// Only the key's presence, with our lease on it, says that we hold the lock — and it
    /// also says the lease was alive when we read it, since etcd deletes a lease's keys
    /// together with the lease. etcd 3.4's lock service does not look: its `Lock`
    /// (`clientv3/concurrency/mutex.go`) returns once every older key is gone. Jepsen's
    /// etcd 3.4.3 analysis (<https://jepsen.io/analyses/etcd-3.4.3>, etcd-io/etcd#11456)
    /// caught it granting the lock to a client whose lease had expired while it waited;
    /// etcd 3.5.0 reads the key back itself (`ErrSessionExpired`). ❌ Asking for the lease's TTL instead is a trap of its own:
    /// etcd answers in whole seconds, rounded *down*, so a live 2s lease reads "1", then "0"
    /// for its last second; only -1 means expired.
    pub fn acquire_within(&mut self, lease: &Lease, wait: Duration) -> Result<Acquired> {
        if let Some(why) = lease.lost_why() {
            return Ok(Acquired::LeaseLost { why });
        }
        let name = self.name.clone();
        let url = self.url.clone();
        let dropped = Arc::clone(&self.dropped);
        let waited = self.runtime.block_on(async {
            // A client for this one call: its requests may last the whole wait, not the usual
            // few seconds, since the call waits, by design, as long as the holder holds the
            // lock — plus room for connecting, so the client never ends the call first.
            let mut waiting = connect::etcd_within(&url, wait + connect::COMMAND_TIMEOUT).await?;
            let give_up = tokio::time::Instant::now() + wait;
            loop {
                let call =
                    waiting.lock(name.as_str(), Some(LockOptions::new().with_lease(lease.id)));
                let answer = tokio::select! {
                    result = call => result,
                    () = lease.lost() => return anyhow::Ok(Waited::LeaseLost),
                    () = tokio::time::sleep_until(give_up) => return Ok(Waited::TimedOut),
                };
                match answer {
                    // The cluster elected a new leader while we queued, or could not commit
                    // our key in time (a member cut off from its majority, a leader frozen
                    // past its election: "request timed out"): the call was dropped, not
                    // refused — and etcd's lock, failing, deletes (or tries to delete) the
                    // key it queued for us. Our place in the queue is gone: asking again puts
                    // a new key at the back (a higher revision, behind whoever queued since).
                    // ❌ Returning the error would give up a wait that still had time: the
                    // caller would see a failure where etcd only said "not now".
                    Err(err) if dropped_by_the_cluster(&err) => {
                        dropped
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push(err.to_string());
                        let ours = format!("{name}/{:x}", lease.id);
                        // etcd's lock tries that delete before it answers; if the delete
                        // failed too (no leader yet) the key is still there, and if it timed
                        // out it may yet be committed. ❌ Asking again at once can queue on
                        // the old key and lose it to that late delete. ✅ Delete the key
                        // ourselves, and ask again only once etcd has answered: the old key
                        // is gone, and the next call queues a new one at the back. (Should a
                        // late delete still remove the new key, the read-back below says so.)
                        loop {
                            let delete = waiting.delete(ours.as_str(), None);
                            tokio::select! {
                                deleted = delete => if deleted.is_ok() { break },
                                () = lease.lost() => return Ok(Waited::LeaseLost),
                                () = tokio::time::sleep_until(give_up) => return Ok(Waited::TimedOut),
                            }
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    answer => return Ok(Waited::Answer(answer.context("etcd: lock")?)),
                }
            }
        })?;
        let response = match waited {
            Waited::Answer(response) => response,
            Waited::TimedOut => return Ok(Acquired::TimedOut),
            Waited::LeaseLost => {
                let why = lease
                    .lost_why()
                    .unwrap_or_else(|| "the lease was lost".into());
                return Ok(Acquired::LeaseLost { why });
            }
        };
        let key = String::from_utf8_lossy(response.key()).into_owned();
        match self.read_back(&key, lease.id)? {
            Some(token) => Ok(Acquired::Held(Held { key, token })),
            None => {
                let why = match self.lease_ttl(lease.id)? {
                    ttl if ttl < 0 => "etcd has expired its lease, and deleted its key with it",
                    _ => "its key is gone although the lease lives (someone deleted it)",
                };
                Ok(Acquired::NotALock { why: why.into() })
            }
        }
    }

    /// Our key's create revision — the token — if the key exists with our lease on it.
    fn read_back(&mut self, key: &str, lease: i64) -> Result<Option<i64>> {
        let found = self
            .runtime
            .block_on(self.client.get(key, None))
            .context("etcd: reading back the lock key")?;
        Ok(found
            .kvs()
            .first()
            .filter(|kv| kv.lease() == lease)
            .map(|kv| kv.create_revision()))
    }

    /// The lease's remaining TTL as etcd reports it: whole seconds, rounded **down** (a live
    /// lease with 0.9s left reads 0); -1 once it has expired or does not exist.
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
        if self
            .runtime
            .block_on(self.client.unlock(held.key.as_str()))
            .is_err()
        {
            // The network cut this client's connection while it held the lock (lab 8), and
            // the first request after a cut fails: ask again on a new connection. Unlock
            // deletes our own key, so asking twice is safe.
            self.client = self.runtime.block_on(connect::etcd(&self.url))?;
            self.runtime
                .block_on(self.client.unlock(held.key.as_str()))
                .context("etcd: unlock")?;
        }
        Ok(self.runtime.block_on(self.client.lease_revoke(id)).is_ok())
    }

    /// Who holds the lock `name` now, as etcd says: the key under `<name>/` with the lowest
    /// create revision, and that revision. What a bystander (the lab) looks at.
    pub fn holder_of(&mut self, name: &str) -> Result<Option<(String, i64)>> {
        let options = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let found = self
            .runtime
            .block_on(self.client.get(format!("{name}/"), Some(options)))
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

    /// ✅ Fencing inside the lock service: puts `value` at `key` only if `held`'s lock key
    /// still exists with the create revision it had when we got the lock — the compare and
    /// the write in **one** etcd transaction (`Txn(If(mutex.IsOwner()), Then(put))` in Go,
    /// where `IsOwner` is exactly `CreateRevision(myKey) = myRev`,
    /// `clientv3/concurrency/mutex.go`). etcd applies a transaction atomically at one
    /// revision: no other write lands between the compare and the put, so a holder whose
    /// lease ran out (its key deleted with the lease) is refused, however late it wakes. A
    /// key made again gets a new create revision, so a passing compare proves the key lived
    /// without a break from the grant to the put — which protects what the holder read
    /// after the grant too, not only the write (unlike lab 7's `fenced-write-only`).
    ///
    /// Its limits, even inside etcd: (a) the compare proves only "my key still exists";
    /// that is ownership only once the lock call has returned — a key still waiting in the
    /// queue passes it too. (b) Only guarded writers are protected: a plain put on `key`
    /// goes through. (c) A guarded put whose answer is lost, retried while the lease lives,
    /// passes twice and is applied twice: the compare is no idempotency key.
    ///
    /// What it costs: nothing in requests (the compare rides on the write), but the
    /// resource must be a key in the *same* etcd — every protected write becomes an etcd
    /// write, under etcd's request and database size limits. What it cannot protect: any
    /// resource outside etcd. A Postgres row or a file cannot join an etcd transaction; for
    /// those the token (`held.token`) has to travel with the write and the resource has to
    /// check it itself (labs 1 and 7). Returns whether etcd took the write.
    pub fn put_if_owner(&mut self, held: &Held, key: &str, value: &str) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                held.key.as_str(),
                CompareOp::Equal,
                held.token,
            )])
            .and_then([TxnOp::put(key, value, None)]);
        let answer = self
            .runtime
            .block_on(self.client.txn(txn))
            .context("etcd: a put guarded by the lock key")?;
        Ok(answer.succeeded())
    }

    /// A key's value and the revision that last changed it, as etcd has them now.
    pub fn value_of(&mut self, key: &str) -> Result<Option<(String, i64)>> {
        let found = self
            .runtime
            .block_on(self.client.get(key, None))
            .context("etcd: reading a key")?;
        Ok(found.kvs().first().map(|kv| {
            (
                String::from_utf8_lossy(kv.value()).into_owned(),
                kv.mod_revision(),
            )
        }))
    }
}

/// How the one lock call of a wait ended.
enum Waited {
    Answer(etcd_client::LockResponse),
    LeaseLost,
    TimedOut,
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
    why: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    fn start(
        url: String,
        lease: i64,
        ttl: Duration,
        mut on_beat: impl FnMut(Beat) + Send + 'static,
    ) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(AtomicBool::new(false));
        let why = Arc::new(Mutex::new(None));
        let (stop_flag, lost_flag, why_slot) = (stop.clone(), lost.clone(), why.clone());
        let thread = thread::spawn(move || {
            let why = match keep_alive(&url, lease, ttl, &stop_flag, &mut on_beat) {
                Ok(None) => return,
                Ok(Some(why)) => why,
                Err(err) => format!("{err:#}"),
            };
            if let Ok(mut slot) = why_slot.lock() {
                *slot = Some(why.clone());
            }
            lost_flag.store(true, Ordering::SeqCst);
            on_beat(Beat::Lost { why });
        });
        Heartbeat {
            stop,
            lost,
            why,
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

/// After a failed renewal, how soon the heartbeat tries again.
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// Renews `lease` every TTL/3 until told to stop (Ok(None)) or the lease is lost (the reason).
///
/// ✅ **One late or failed keepalive is not a loss.** etcd keeps the lease for a full TTL
/// after the last renewal it granted, so the heartbeat keeps trying — reopening the stream
/// if it broke — until then, less a small margin, and only then gives the lock up. ❌ Giving
/// up at the first slow answer throws a healthy lock away; trying on past the deadline
/// claims a lock that etcd may already have deleted. One answer ends it at once: etcd's
/// own word that the lease has expired (TTL 0).
fn keep_alive(
    url: &str,
    lease: i64,
    ttl: Duration,
    stop: &AtomicBool,
    on_beat: &mut impl FnMut(Beat),
) -> Result<Option<String>> {
    let every = ttl / 3;
    let margin = (ttl / 10).max(Duration::from_millis(100));
    // Counted from just after the grant: a little late, which the margin covers.
    let mut renewed = Instant::now();
    let runtime = connect::etcd_runtime()?;
    runtime.block_on(async {
        // Connected at the first renewal, not before: a heartbeat that cannot reach etcd
        // yet (its thread started late, or the network failed first) has failed a renewal,
        // and retries like any other until the lease's vouched time runs out.
        let mut client: Option<Client> = None;
        let mut stream = None;
        let mut last_try = Instant::now();
        let mut failing: Option<String> = None;
        loop {
            let vouched_until = renewed + ttl - margin;
            let due = last_try.elapsed()
                >= if failing.is_some() {
                    RETRY_AFTER
                } else {
                    every
                };
            // Told to stop while a renewal is due (the process was just paused), the
            // heartbeat makes that one last renewal first: its answer says whether the lease
            // was still alive, and a loss must not go unreported because a release came first.
            if stop.load(Ordering::SeqCst) && !due {
                return Ok(None);
            }
            if !due {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            last_try = Instant::now();
            // Within the vouched time, an attempt may not run past it; after it (we were
            // frozen), only etcd's answer can tell, so give that answer a fair chance.
            let limit = match vouched_until.checked_duration_since(last_try) {
                Some(left) => left.min(every).max(Duration::from_millis(20)),
                None => every,
            };
            let attempt = async {
                if client.is_none() {
                    client = Some(connect::etcd(url).await?);
                }
                let client = client.as_mut().expect("connected just above");
                renew(client, &mut stream, lease, ttl.as_secs() as i64).await
            };
            let (outcome, timed_out) = match tokio::time::timeout(limit, attempt).await {
                Ok(outcome) => (outcome, false),
                Err(_) => {
                    let late = anyhow!("no keepalive answer within {}ms", limit.as_millis());
                    (Err(late), true)
                }
            };
            match outcome {
                Ok(Renewal::Renewed(seconds)) => {
                    renewed = last_try;
                    failing = None;
                    on_beat(Beat::Renewed { ttl: seconds });
                }
                // ❗ An "empty" answer is not a renewal: TTL 0 means etcd has expired the
                // lease, and every key attached to it — our lock — is already deleted.
                Ok(Renewal::Expired) => {
                    return Ok(Some(
                        "etcd answered the keepalive with TTL 0: the lease has expired".into(),
                    ));
                }
                Err(err) => {
                    stream = None;
                    // Said at the first failure, not at the give-up: the retries that
                    // follow may outlast the lease that etcd is counting down meanwhile.
                    if failing.is_none() && !stop.load(Ordering::SeqCst) {
                        let why = super::causes(&err);
                        on_beat(Beat::Failed { timed_out, why });
                    }
                    if Instant::now() >= vouched_until {
                        return Ok(Some(format!(
                            "no renewal for {}ms, close to the {}s lease TTL (last try: {})",
                            renewed.elapsed().as_millis(),
                            ttl.as_secs(),
                            super::causes(&err)
                        )));
                    }
                    if stop.load(Ordering::SeqCst) {
                        return Ok(None);
                    }
                    failing = Some(format!("{err:#}"));
                }
            }
        }
    })
}

enum Renewal {
    Renewed(i64),
    Expired,
}

/// One keepalive: on the open stream, or on a new one if there is none (opening a stream
/// sends a keepalive and reads its answer).
async fn renew(
    client: &mut Client,
    stream: &mut Option<(etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream)>,
    lease: i64,
    granted: i64,
) -> Result<Renewal> {
    let Some((keeper, answers)) = stream.as_mut() else {
        return match client.lease_keep_alive(lease).await {
            Ok(opened) => {
                *stream = Some(opened);
                Ok(Renewal::Renewed(granted))
            }
            Err(etcd_client::Error::LeaseKeepAliveError(why)) if why.contains("not found") => {
                Ok(Renewal::Expired)
            }
            Err(err) => Err(err).context("etcd: opening the keepalive stream"),
        };
    };
    keeper
        .keep_alive()
        .await
        .context("etcd: sending a keepalive")?;
    match answers
        .message()
        .await
        .context("etcd: the keepalive answer")?
    {
        Some(answer) if answer.ttl() > 0 => Ok(Renewal::Renewed(answer.ttl())),
        Some(_) => Ok(Renewal::Expired),
        None => Err(anyhow!("the keepalive stream was closed")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A heartbeat whose thread reaches etcd only after the network failed (on a busy
    /// machine its first renewal comes late) has failed a renewal, said so, and retried
    /// until the lease's vouched time ran out: a loss with no failure before it hides the
    /// moment the holder could have known. Here etcd is a port nothing listens on.
    #[test]
    fn a_heartbeat_that_cannot_reach_etcd_says_its_renewal_failed_before_the_loss() {
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://127.0.0.1:{}", closed.local_addr().unwrap().port());
        drop(closed);
        let stop = AtomicBool::new(false);
        let mut beats = Vec::new();
        let ttl = Duration::from_millis(600);
        let lost = keep_alive(&url, 1, ttl, &stop, &mut |beat| beats.push(beat));
        assert!(matches!(lost, Ok(Some(_))), "{lost:?}");
        assert!(
            matches!(beats.first(), Some(Beat::Failed { .. })),
            "{beats:?}"
        );
    }
}
