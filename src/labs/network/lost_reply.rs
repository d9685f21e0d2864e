//! Lab 8's third story: a reply that never came. A's request reaches the server and is
//! applied; the proxy loses the answer and resets A's connection. A cannot tell "not done"
//! from "done, answer lost" — only the server can, so the lab reads it back on a connection
//! of its own, then shows what each client policy makes of the same loss:
//!
//! - Redis `SET key owner NX PX ttl`, then A ✅ retries with the **same** owner value (the
//!   key holds it: the lock is A's, since the first try), ❌ retries with a **new** one (the
//!   key holds A's first value, so A waits a whole TTL behind itself), or ❌ **gives up**
//!   (the key holds a lock nobody works under until it expires);
//! - a Postgres `COMMIT`: ❌ retried as it was, the payment is made twice; ✅ retried with an
//!   idempotency key (a unique column), the second insert finds the first and does nothing;
//! - ❌ a fenced write to the store, retried with the same token: accepted twice, since a
//!   token is not lower than itself ([`super::lost_fenced`]).
//!
//! A is a client in the lab's own process here: the story needs no pause and no second
//! worker, only A's connection through the proxy and the lab's direct one.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use colored::Colorize;

use super::Plan;
use crate::check::network::{self as checks, Policy, ReplyEvidence};
use crate::connect::{self, Backend};
use crate::events::Event;
use crate::events::facts::{Acquired, Expired, GaveUp, HolderNow, RunFacts};
use crate::labs::faults::Hand;
use crate::labs::runner::Run;
use crate::labs::words::Words;
use crate::labs::{Stage, step};
use crate::lock::random_owner;
use crate::lock::redis::{RETRY_EVERY, owner_and_pttl};
use crate::nemesis::Fault;
use crate::nemesis::schedule::How;
use crate::output::human;
use crate::proxy::{self, Proxy, Seen};

use crate::check::network::{PaymentFound, ReplyFound};

/// The story's Redis half: the three policies, one after the other. (The lab then plays
/// its Postgres halves, [`super::lost_commit`] and [`super::lost_fenced`], and its etcd
/// half, [`super::lost_lock`], each a part opened with [`open`].)
pub(super) fn play(plan: &Plan, run: &Run) -> Result<Vec<ReplyFound>> {
    let mut redis = Vec::new();
    for policy in [Policy::SameOwner, Policy::NewOwner, Policy::GiveUp] {
        redis.push(lost_set(plan, run, policy)?);
    }
    Ok(redis)
}

/// A stage for one part of the story, its heading and tags set, stopped at its checkpoint.
pub(super) fn open(run: &Run, heading: &str, part: &str, at: &step::Checkpoint) -> Stage {
    let mut stage = run.stage();
    stage.timeline.say("");
    stage
        .timeline
        .say(&format!("── {heading} ──").yellow().bold().to_string());
    stage.tags().scenario = Some(format!("lost-reply:{part}"));
    stage.checkpoint(at);
    stage
}

/// The part's first line: the run, its lock, its proxy.
pub(super) fn run_line(run: &Run, lock_key: Option<&str>, text: String) -> Event {
    let facts = RunFacts {
        run_id: Some(run.id.clone()),
        lock_key: lock_key.map(String::from),
        ..RunFacts::default()
    };
    Event::new("lab", facts, format!("run {}: {text}", run.id))
}

/// Has the one player put a drop-reply on the proxy, has `request` fail, and has it heal
/// the path with the proxy's account: the request went up, the answer was thrown away.
/// Bails if an answer came back.
pub(super) fn lose_the_answer<T>(
    stage: &mut Stage,
    hand: &mut Hand,
    path: &Proxy,
    what: &str,
    request: impl FnOnce() -> Result<T>,
) -> Result<String> {
    let at = path.path();
    hand.net(
        stage,
        (Fault::DropReply, at, How::default()),
        format!("the proxy on {at} will let A's {what} through and lose the answer"),
    )?;
    let error = match request() {
        Ok(_) => bail!("A's {what} was answered: the proxy did not drop the reply"),
        Err(err) => once(&format!("{err:#}")),
    };
    let seen: Vec<Seen> = path.reports().into_iter().map(|r| r.seen).collect();
    let (Some(up), Some(lost)) = (
        seen.iter().find_map(|s| match s {
            Seen::RequestForwarded { bytes } => Some(*bytes),
            _ => None,
        }),
        seen.iter().find_map(|s| match s {
            Seen::ReplyDropped { bytes } => Some(*bytes),
            _ => None,
        }),
    ) else {
        bail!("A's {what} failed ({error}) but the proxy did not see it through: {seen:?}");
    };
    hand.net(
        stage,
        (Fault::Heal, at, How::default()),
        format!(
            "the proxy sent A's {what} on ({up} bytes), threw the answer away ({lost} bytes) and reset A's connection; A's client says: {error}"
        ),
    )?;
    Ok(error)
}

/// A's `SET key owner NX PX ttl` on the story's key: whether it took the key.
struct SetNx<'k> {
    key: &'k str,
    ttl_ms: u64,
}

impl SetNx<'_> {
    fn send(&self, a: &mut connect::RedisConn, owner: &str) -> Result<bool> {
        let reply: Option<String> = redis::cmd("SET")
            .arg(self.key)
            .arg(owner)
            .arg("NX")
            .arg("PX")
            .arg(self.ttl_ms)
            .query(&mut **a)?;
        Ok(reply.is_some())
    }
}

/// What A believes after its policy, and what the policy cost, as the lab timed it (for
/// Redis's `SET NX` here, and for etcd's lock call in [`super::lost_lock`]).
#[derive(Default)]
pub(super) struct Retried {
    /// The owner value A works under, if it believes it holds the lock.
    pub(super) believed: Option<String>,
    /// How long A's retry waited behind A's own first SET.
    pub(super) waited_ms: Option<u64>,
    /// How long A's first key held the lock (from A's send).
    pub(super) first_key_ms: Option<u64>,
}

/// One Redis policy: A's `SET NX PX` applied, its answer lost, and what A does next.
fn lost_set(plan: &Plan, run: &Run, policy: Policy) -> Result<ReplyFound> {
    let redis_url = run.url(Backend::Redis);
    let mut stage = open(
        run,
        &format!("a lost reply to SET NX: {}", policy.says()),
        policy.as_str(),
        step::network::before_lost_reply(policy.as_str()),
    );
    let key = format!(
        "lockslab:{}:network:lost-reply:{}:lock",
        run.id,
        policy.as_str()
    );
    let path = Proxy::start("A→redis", proxy::upstream_of(redis_url)?)?;
    let through = proxy::through(redis_url, path.addr())?;
    stage.record(run_line(
        run,
        Some(&key),
        format!("the lock is the Redis key {key}; A's path to Redis, A→redis, goes through the fault proxy on {}", path.addr()),
    ));
    let mut hand = Hand::new(&stage).on_path(&path);
    let mut lab = connect::redis(redis_url)?;
    let mut a = connect::redis(&through)?;
    let set = SetNx {
        key: &key,
        ttl_ms: plan.ttl.as_millis() as u64,
    };
    // A's owner value: random, made by A before it sends anything.
    let owner = random_owner();
    let sent = Instant::now();
    lose_the_answer(&mut stage, &mut hand, &path, "SET NX PX", || {
        set.send(&mut a, &owner)
    })?;
    let (after_loss, pttl) = read_after_loss(&mut stage, &mut lab, &key, &owner)?;
    // A's client after the loss: a new connection (the old one was reset).
    let mut a = connect::redis(&through)?;
    let retried = match policy {
        Policy::SameOwner => retry_same_owner(&mut stage, &set, &mut a, &owner)?,
        Policy::NewOwner => retry_new_owner(plan, &mut stage, &set, &mut a, sent)?,
        Policy::GiveUp => give_up(plan, &mut stage, (&mut lab, &key), &owner, (sent, pttl))?,
    };
    // The end, from Redis: whose value is in the key now, and A lets go of what it believes.
    let (held_by, _) = owner_and_pttl(&mut lab, &key)?;
    if let Some(value) = &retried.believed {
        let _: i64 = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
        )
        .key(&key)
        .arg(value)
        .invoke(&mut *a)?;
    }
    let _: i64 = redis::cmd("DEL").arg(&key).query(&mut *lab)?;
    let found = checks::lost_set(&ReplyEvidence {
        policy,
        sent_owner: &owner,
        after_loss: after_loss.as_deref(),
        believed: retried.believed.as_deref(),
        held_by: held_by.as_deref(),
        waited_ms: retried.waited_ms,
        first_key_ms: retried.first_key_ms,
    });
    stage.drain();
    Ok(found)
}

/// Reads the key back on the lab's own connection once the answer was lost: whose value
/// it holds, and its PTTL.
fn read_after_loss(
    stage: &mut Stage,
    lab: &mut connect::RedisConn,
    key: &str,
    owner: &str,
) -> Result<(Option<String>, i64)> {
    let (after_loss, pttl) = owner_and_pttl(lab, key)?;
    let applied = after_loss.as_deref() == Some(owner);
    stage.record(Event::new(
        "redis",
        HolderNow {
            holder: after_loss.clone(),
            key: Some(key.into()),
            backend: Some("redis".into()),
            ..HolderNow::default()
        },
        match &after_loss {
            Some(found) if applied => format!(
                "read back on the lab's own connection: the key holds A's owner value {}…, PTTL {pttl}ms — the SET was applied, only its answer was lost",
                short(found)
            ),
            Some(found) => format!("read back: the key holds {}…, not A's value", short(found)),
            None => "read back: no key — the SET was not applied".into(),
        },
    ));
    Ok((after_loss, pttl))
}

/// ✅ The same value again. NX refuses (the key exists); GET says whose it is — and only
/// A's first SET can have stored a value A made up itself.
fn retry_same_owner(
    stage: &mut Stage,
    set: &SetNx,
    a: &mut connect::RedisConn,
    owner: &str,
) -> Result<Retried> {
    let took = set.send(a, owner)?;
    let now: Option<String> = redis::cmd("GET").arg(set.key).query(&mut **a)?;
    let ours = took || now.as_deref() == Some(owner);
    let believed = ours.then(|| owner.to_string());
    stage.record(Event::new(
        "A",
        Acquired {
            lock: Some(set.key.into()),
            owner: believed.clone(),
            backend: Some("redis".into()),
            tries: Some(2),
            ..Acquired::default()
        },
        if took {
            "retries SET NX PX with the same owner value: OK — the first one had not landed".to_string()
        } else {
            format!(
                "retries SET NX PX with the same owner value: nil (the key exists); GET answers {}… — A's own value, which only A's first SET can have stored: the lock is A's, and its lease has run since the first try",
                now.as_deref().map_or("nothing".into(), short)
            )
        },
    ));
    Ok(Retried {
        believed,
        ..Retried::default()
    })
}

/// ❌ A fresh value: the key holds A's first one, so NX refuses until it expires.
fn retry_new_owner(
    plan: &Plan,
    stage: &mut Stage,
    set: &SetNx,
    a: &mut connect::RedisConn,
    sent: Instant,
) -> Result<Retried> {
    let fresh = random_owner();
    let (mut tries, deadline) = (0u64, Instant::now() + plan.ttl * 2 + Duration::from_secs(5));
    let started = Instant::now();
    while !set.send(a, &fresh)? {
        tries += 1;
        if Instant::now() > deadline {
            bail!("A's retry never got the lock back");
        }
        thread::sleep(RETRY_EVERY);
    }
    let waited = started.elapsed();
    let waited_ms = Some(waited.as_millis() as u64);
    // NX set the new value only once A's first one was gone: that first key held the lock
    // until now, while A, waiting behind it, worked under nothing.
    let first_key_ms = Some(sent.elapsed().as_millis() as u64);
    stage.record(Event::new(
        "A",
        Acquired {
            lock: Some(set.key.into()),
            owner: Some(fresh.clone()),
            backend: Some("redis".into()),
            tries: Some(tries + 1),
            waited_ms,
            ..Acquired::default()
        },
        format!(
            "retried SET NX PX with a new owner value {}… {} times: refused until its own first SET expired — it waited {} behind itself",
            short(&fresh),
            tries + 1,
            human(waited)
        ),
    ));
    Ok(Retried {
        believed: Some(fresh),
        waited_ms,
        first_key_ms,
    })
}

/// ❌ "No answer: not mine." The key says otherwise until it expires: the lab watches it
/// go, on its own connection.
fn give_up(
    plan: &Plan,
    stage: &mut Stage,
    (lab, key): (&mut connect::RedisConn, &str),
    owner: &str,
    (sent, pttl): (Instant, i64),
) -> Result<Retried> {
    stage.record(Event::new(
        "A",
        GaveUp {
            why: Some(
                "no answer to SET NX PX: A treats the lock as not taken and goes away".into(),
            ),
            owner: Some(owner.into()),
            ..GaveUp::default()
        },
        "gives up: no answer, so A believes it does not hold the lock, and goes away",
    ));
    let deadline = Instant::now() + plan.ttl * 2 + Duration::from_secs(5);
    let mut last = pttl;
    loop {
        let (now, left) = owner_and_pttl(lab, key)?;
        if now.as_deref() != Some(owner) {
            break;
        }
        last = left;
        if Instant::now() > deadline {
            bail!("A's abandoned key did not expire");
        }
        thread::sleep(Duration::from_millis(10));
    }
    let orphaned = sent.elapsed();
    stage.record(Event::new(
        "redis",
        Expired {
            lock: Some(key.into()),
            pttl_before_ms: Some(last),
            ..Expired::default()
        },
        format!(
            "A's abandoned key expired, {} after A sent its SET: all that time the lock was taken and nobody worked under it",
            human(orphaned)
        ),
    ));
    Ok(Retried {
        first_key_ms: Some(orphaned.as_millis() as u64),
        ..Retried::default()
    })
}

/// A client error whose cause repeats its message (`eof: eof`) said once.
fn once(error: &str) -> String {
    match error.split_once(": ") {
        Some((head, tail)) if head == tail => head.to_string(),
        _ => error.to_string(),
    }
}

fn short(owner: &str) -> String {
    owner.chars().take(8).collect()
}

/// The story's two tables and what they mean.
/// The evidence of a lost reply to a lock request, a column per retry policy: whether the
/// server applied it, whether A's belief matched the server's holder at the end, and what the
/// retry cost. Redis's `SET NX` and etcd's lock call share it; `applied_and_belief` names
/// the first two rows for the backend.
pub(super) fn say_reply_table(
    words: &mut Words,
    title: &str,
    applied_and_belief: [&str; 2],
    columns: &[&str],
    found: &[ReplyFound],
) {
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let took = |ms: Option<u64>| ms.map_or("-".into(), |ms| human(Duration::from_millis(ms)));
    let header: Vec<&str> = std::iter::once("evidence")
        .chain(columns.iter().copied())
        .collect();
    let row = |name: &str, cell: &dyn Fn(&ReplyFound) -> String| {
        std::iter::once(name.to_string())
            .chain(found.iter().map(cell))
            .collect::<Vec<_>>()
    };
    let [applied, belief] = applied_and_belief;
    let rows = vec![
        row(applied, &|s| yes_no(s.applied)),
        row(belief, &|s| yes_no(s.a_knows)),
        row("A waited behind itself", &|s| {
            if s.waited_behind_itself {
                took(s.waited_ms).red().to_string()
            } else {
                "no".into()
            }
        }),
        row("lock held, nobody working", &|s| {
            if s.orphaned {
                took(s.orphaned_ms).red().to_string()
            } else {
                "no".into()
            }
        }),
    ];
    words.blank().heading(title).table(&header, rows);
}

/// The Redis and Postgres tables of the lost reply, and what each column means.
pub(super) fn say(words: &mut Words, sets: &[ReplyFound], commits: &[PaymentFound]) {
    if sets.is_empty() && commits.is_empty() {
        return;
    }
    let columns: Vec<&str> = sets.iter().map(|s| s.policy.as_str()).collect();
    say_reply_table(
        words,
        "Verdict: a lost reply to SET NX",
        [
            "SET applied (Redis read back)",
            "A's belief = Redis's key at end",
        ],
        &columns,
        sets,
    );
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let header = ["evidence", "retried as it was", "with idempotency key"];
    let cell = |keyed: bool, f: &dyn Fn(&PaymentFound) -> String| {
        commits
            .iter()
            .find(|c| c.idempotency_key == keyed)
            .map_or("-".into(), f)
    };
    let line = |name: &str, f: &dyn Fn(&PaymentFound) -> String| {
        vec![name.to_string(), cell(false, f), cell(true, f)]
    };
    let rows = vec![
        line("COMMIT happened (read back)", &|c| yes_no(c.committed)),
        line("payment rows (read back)", &|c| c.rows.to_string()),
        line("paid in all (read back)", &|c| {
            if c.doubled {
                c.total.to_string().red().bold().to_string()
            } else {
                c.total.to_string()
            }
        }),
    ];
    let title = "Verdict: a lost reply to COMMIT";
    words.blank().heading(title).table(&header, rows).blank();
    for set in sets {
        words.about(set.policy.as_str(), set_meaning(set));
    }
    for commit in commits {
        let title = if commit.idempotency_key {
            "with a key"
        } else {
            "without a key"
        };
        words.about(title, commit_meaning(commit));
    }
}

fn set_meaning(found: &ReplyFound) -> String {
    let applied = if found.applied {
        "Redis had applied the SET whose answer was lost."
    } else {
        "Redis had not applied the SET: this run does not show a lost reply."
    };
    let then = match found.policy {
        Policy::SameOwner => "Retrying with the value it had sent, A found that value in the key: the lock was its own, with the lease counted from the first try.".to_string(),
        Policy::NewOwner if found.waited_behind_itself => format!(
            "Retrying with a new value, A waited {} for its own first lock to expire; the lock stayed taken by that first value, with nobody working under it, for {}.",
            found.waited_ms.map_or("?".into(), |ms| human(Duration::from_millis(ms))),
            found.orphaned_ms.map_or("?".into(), |ms| human(Duration::from_millis(ms)))
        ),
        Policy::NewOwner => "A's retry with a new value did not have to wait for itself.".into(),
        Policy::GiveUp if found.orphaned => format!(
            "A gave up; the lock stayed taken, with nobody working under it, for {}.",
            found.orphaned_ms.map_or("?".into(), |ms| human(Duration::from_millis(ms)))
        ),
        Policy::GiveUp => "A gave up and nothing was left behind.".into(),
    };
    format!("{applied} {then}")
}

fn commit_meaning(found: &PaymentFound) -> String {
    let committed = if found.committed {
        "The COMMIT whose answer was lost had committed."
    } else {
        "The COMMIT whose answer was lost had not committed."
    };
    let then = if found.doubled {
        format!(
            "A's retry paid again: {} rows, {} in all.",
            found.rows, found.total
        )
    } else if found.idempotency_key && found.committed {
        "A's retry carried the same key, found the payment there, and inserted nothing: paid once."
            .to_string()
    } else {
        "A's retry made the only payment.".to_string()
    };
    format!("{committed} {then}")
}
