//! wrong-release: A's lease runs out while it works, B takes the lock, A releases, C tries
//! once. Releasing by DEL removes B's live lock and lets C in beside B; compare-and-delete
//! leaves it alone. Who held the lock together, and why, is read off the holders list (see
//! [`crate::check::naive::overlaps`]).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::verdict::{self, Evidence, OverlapSeen, Tally, WrongReleaseEvidence};
use super::{Play, RedisStep, Scenario, pttl_text, whose};
use crate::check::Finding;
use crate::check::naive as checks;
use crate::connect::RedisConn;
use crate::events::What;
use crate::events::facts::Expired;
use crate::events::facts::Observed;
use crate::events::{Event, Kind};
use crate::labs::Stage;
use crate::lock::redis::owner_and_pttl;
use crate::output::human;
use crate::redis_health::KeyWatch;
use crate::worker::racer::{Acquire, Holder, Release};

impl Play<'_> {
    /// A's lease runs out while it works; B takes the lock; A releases; C tries once.
    pub(super) fn wrong_release(&self, fixed: bool) -> Result<Tally> {
        let args = self.plan;
        let scenario = Scenario::WrongRelease;
        let mut stage = self.stage(scenario, fixed);
        let release = if fixed {
            Release::CompareAndDelete
        } else {
            Release::Del
        };
        let key = self.key(scenario, fixed, "lock");
        let holders = self.key(scenario, fixed, "holders");
        let url = self.redis_url.as_str();
        let mut redis = self.redis()?;
        let long = args.ttl + Duration::from_secs(10);
        let holder = self.holder(scenario, fixed, Acquire::SetNxPx, release);
        let spec = |name: &str, wait: Duration| {
            self.spec(
                name,
                Holder {
                    wait_ms: wait.as_millis() as u64,
                    ..holder.clone()
                },
            )
        };

        // A key deleted, flushed or evicted must not pass for one that lapsed.
        let mut key_watch = KeyWatch::start(url)?;
        let mut a = stage.spawn("A", &spec("A", args.wait))?;
        let a_took = stage.wait_for(long, "A to take the lock", |e| e.is("A", Kind::Acquired))?;
        let a_owner = a_took.owner().map(String::from);

        // A works on; watch its key in Redis until the lease runs out.
        self.watch_the_lease_run_out(&mut stage, &mut redis, &mut key_watch, &key, &a_owner)?;

        let mut b = stage.spawn("B", &spec("B", args.wait))?;
        let b_took = stage.wait_for(long, "B to take the lock", |e| e.is("B", Kind::Acquired))?;
        let b_owner = b_took.owner().map(String::from);

        a.tell("finish")?;
        stage.wait_for(long, "A to release", |e| e.is("A", Kind::Released))?;
        read_the_lock_after_a_release(&mut stage, &mut redis, &key, url, &a_owner, &b_owner)?;

        // C tries once, as any newcomer would.
        let mut c = stage.spawn("C", &spec("C", Duration::ZERO))?;
        let c_result = stage.wait_for(long, "C to try the lock", |e| {
            e.worker == "C" && (e.kind() == Kind::Acquired || e.kind() == Kind::GaveUp)
        })?;
        if c_result.kind() == Kind::Acquired {
            say_if_c_holds_beside_b(&mut stage, &mut redis, &key, url, c_result.owner())?;
        }

        b.tell("finish")?;
        stage.wait_for(long, "B to release", |e| e.is("B", Kind::Released))?;
        if c_result.kind() == Kind::Acquired {
            c.tell("finish")?;
            stage.wait_for(long, "C to release", |e| e.is("C", Kind::Released))?;
        }
        for worker in [&mut a, &mut b, &mut c] {
            worker.finish(Duration::from_secs(5));
        }
        stage.drain();

        let (violations, overlaps, list) =
            count_the_holders(&mut stage, &mut redis, &holders, url, args.ttl)?;
        let evidence = WrongReleaseEvidence {
            holders_list: list,
            overlaps,
            c_got_lock: c_result.kind() == Kind::Acquired,
        };
        Ok(Tally::new(violations, 1, Evidence::WrongRelease(evidence)))
    }

    /// A works on while the lab watches its key in Redis (a bar of its PTTL on a terminal)
    /// until the lease runs out; a key deleted, flushed or evicted stops the lab instead.
    fn watch_the_lease_run_out(
        &self,
        stage: &mut Stage,
        redis: &mut RedisConn,
        key_watch: &mut KeyWatch,
        key: &str,
        a_owner: &Option<String>,
    ) -> Result<()> {
        let args = self.plan;
        let url = self.redis_url.as_str();
        let long = args.ttl + Duration::from_secs(10);
        let bar = self
            .style
            .progress(args.ttl.as_millis() as u64, "  {msg} [{bar:30}]");
        stage.timeline.attach_bar(bar);
        let deadline = Instant::now() + long;
        let lapsed = (|| loop {
            stage.next(Duration::from_millis(10));
            let asked_at = Instant::now();
            let (owner, pttl) =
                owner_and_pttl(redis, key).step(url, "watching A's key in Redis while A works")?;
            if owner != *a_owner {
                return Ok(asked_at);
            }
            key_watch.present(asked_at, pttl);
            if Instant::now() > deadline {
                bail!("A's key did not expire within {}", human(long));
            }
            if let Some(bar) = stage.timeline.bar() {
                bar.set_position(args.ttl.as_millis() as u64 - pttl.max(0) as u64);
                bar.set_message(format!("A works; its key: PTTL {}", pttl_text(pttl)));
            }
        })();
        stage.timeline.clear_bar();
        let gone_at = lapsed?;
        if let Some(vanished) = key_watch.gone(gone_at)? {
            return Err(vanished.stop_the_lab(stage, "A"));
        }
        stage.record(Event::new(
            "redis",
            Expired {
                ..Expired::default()
            },
            format!(
                "A's key expired (TTL {}) while A still works: for Redis the lock is free",
                human(args.ttl)
            ),
        ));
        Ok(())
    }
}

/// After A's release, whose value the key holds: A's DEL removed B's live lock (a
/// violation), or its compare-and-delete left it alone.
fn read_the_lock_after_a_release(
    stage: &mut Stage,
    redis: &mut RedisConn,
    key: &str,
    url: &str,
    a_owner: &Option<String>,
    b_owner: &Option<String>,
) -> Result<()> {
    let owner: Option<String> = redis::cmd("GET")
        .arg(key)
        .query(redis)
        .step(url, "reading the lock after A's release")?;
    let b_lost_lock = checks::lock_lost_under(owner.as_deref(), b_owner.as_deref()) == Finding::Yes;
    let read = whose(owner.as_deref(), &[("A", a_owner), ("B", b_owner)]);
    stage.record(Event::new(
        "redis",
        What::RedisRead(Observed {
            key_owner: owner.clone(),
            ..Observed::default()
        }),
        if b_lost_lock {
            format!("GET → {read}: A's DEL removed B's lock, and B is still working")
        } else {
            format!("GET → {read}: A's release left B's lock alone; B keeps it")
        },
    ));
    Ok(())
}

/// C took the lock: whether the key now holds C's value while B still works, believing it
/// holds the lock — two holders.
fn say_if_c_holds_beside_b(
    stage: &mut Stage,
    redis: &mut RedisConn,
    key: &str,
    url: &str,
    c_owner: Option<&str>,
) -> Result<()> {
    let owner: Option<String> = redis::cmd("GET")
        .arg(key)
        .query(redis)
        .step(url, "reading the lock after C took it")?;
    if checks::newcomer_holds(owner.as_deref(), c_owner) {
        let read = What::RedisRead(Observed {
            key_owner: owner,
            ..Observed::default()
        });
        stage.record(Event::new(
            "redis",
            read,
            "GET → C's value while B still works and believes it holds the lock: two holders, \
             B and C",
        ));
    }
    Ok(())
}

/// The verdict's count: who held the lock together, from the holders list, and the line
/// the lab records of it. Returns the violations, the overlaps and the list.
fn count_the_holders(
    stage: &mut Stage,
    redis: &mut RedisConn,
    holders: &str,
    url: &str,
    ttl: Duration,
) -> Result<(u32, Vec<OverlapSeen>, Vec<String>)> {
    // The verdict: who held the lock together, from the entries the workers wrote to
    // Redis, in Redis's order; and, by the workers' monotonic stamps, whether the earlier holder's lease had run out by then. A pair
    // whose first lease had run out is lab 1's problem (the TTL), the same in both runs;
    // a pair whose first lease still ran means someone deleted a live lock.
    let list: Vec<String> = redis::cmd("LRANGE")
        .arg(holders)
        .arg(0)
        .arg(-1)
        .query(redis)
        .step(url, "reading the holders list back from Redis")?;
    let (violations, overlaps) = verdict::overlaps_seen(&list, &stage.log, ttl);
    let pairs_text = overlaps
        .iter()
        .map(|o| format!("{} and {} ({})", o.holders[0], o.holders[1], o.cause))
        .collect::<Vec<_>>()
        .join("; ");
    stage.record(Event::new(
        "redis",
        What::RedisRead(Observed {
            holders: Some(list.clone()),
            violations: Some(violations.into()),
            ..Observed::default()
        }),
        format!(
            "holders list [{}]: held at the same time: {pairs_text}",
            list.join(" ")
        ),
    ));
    Ok((violations, overlaps, list))
}
