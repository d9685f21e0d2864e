//! Keys a Redis loses without their TTL, which a lock cannot tell from an expiry.
//!
//! A Redis lock's key may go in ways that are not its TTL running out: Redis evicts it when
//! it is over `maxmemory` and its `maxmemory-policy` is an evicting one (`allkeys-*` evicts
//! any key, `volatile-*` only keys with a TTL — a lock key always has one); a `FLUSHALL` or
//! `FLUSHDB` wipes it; a restart without persistence forgets it. To every client the lock
//! is then simply free, as after an expiry, and the next one takes it. A lab that called
//! that an expiry would state a false verdict, so a lab asks [`KeyLoss::watch`] before it
//! plays (which refuses a Redis that evicts) and [`KeyLoss::check`] before its verdict
//! (which refuses to give one when keys went missing meanwhile, and says how).

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::connect;
use crate::events::{Event, What};
use crate::nemesis::Record;
use crate::output::human;

/// What a Redis says about how it loses keys, before and after a run.
#[derive(Clone, Debug, Default)]
struct Counters {
    /// `evicted_keys` (INFO stats): keys evicted since the server started.
    evicted: Option<u64>,
    /// `FLUSHALL` and `FLUSHDB` calls since the server started (INFO commandstats).
    flushes: Option<u64>,
    /// `run_id` (INFO server): a new one means the server restarted.
    run_id: Option<String>,
    /// `expired_keys` (INFO stats): keys removed because their TTL ran out, whether Redis's
    /// expiry cycle found them or a command touched them after their time.
    expired: Option<u64>,
}

/// A Redis watched for keys lost without their TTL during a lab run.
pub struct KeyLoss {
    url: Option<String>,
    before: Counters,
}

impl KeyLoss {
    /// Refuses a Redis that evicts keys, and notes how many it has lost so far.
    pub fn watch(url: &str) -> Result<KeyLoss> {
        let mut conn = connect::redis(url)?;
        refuse_evicting(&mut conn, url)?;
        Ok(KeyLoss {
            url: Some(url.to_string()),
            before: counters(&mut conn),
        })
    }

    /// No watch: for a Redis the lab restarts on purpose (its own private one).
    pub fn off() -> KeyLoss {
        KeyLoss {
            url: None,
            before: Counters::default(),
        }
    }

    /// Fails, naming the cause, when the Redis lost keys during the run without their TTL:
    /// any "expired" the lab saw may have been that, and its verdict would be false.
    pub fn check(&self) -> Result<()> {
        let Some(url) = &self.url else {
            return Ok(());
        };
        let after = counters(&mut connect::redis(url)?);
        let before = &self.before;
        let mut causes = Vec::new();
        if let (Some(was), Some(now)) = (before.evicted, after.evicted)
            && now > was
        {
            causes.push(format!(
                "it evicted {} key(s) to stay under maxmemory (INFO stats evicted_keys {was} → {now})",
                now - was
            ));
        }
        let restarted =
            matches!((&before.run_id, &after.run_id), (Some(was), Some(now)) if was != now);
        if restarted {
            causes.push(
                "it restarted (INFO server run_id changed): what it had not saved is gone".into(),
            );
        } else if let (Some(was), Some(now)) = (before.flushes, after.flushes)
            && now > was
        {
            causes.push(format!(
                "FLUSHALL or FLUSHDB ran {} time(s) (INFO commandstats)",
                now - was
            ));
        }
        if causes.is_empty() {
            return Ok(());
        }
        bail!(
            "Redis {} lost keys during this run without their TTL: {}. A lock key lost that way \
             looks exactly like an expired lease, so an \"expired\" above may not have been one; \
             the lab gives no verdict. Run it again on a Redis that nothing else fills, flushes \
             or restarts meanwhile (`lockslab up` starts one).",
            connect::redact(url),
            causes.join("; ")
        )
    }
}

/// An evicting `maxmemory-policy` under a `maxmemory` limit is refused before the lab plays.
/// With `maxmemory 0` (no limit, the default on 64-bit systems) nothing is evicted whatever
/// the policy; a limit set during the run is still caught by [`KeyLoss::check`]. A server
/// that will not answer CONFIG GET (a managed Redis, a room's restricted user) is let
/// through: the counters after the run still tell.
fn refuse_evicting(conn: &mut connect::RedisConn, url: &str) -> Result<()> {
    let setting = |conn: &mut connect::RedisConn, name: &str| -> Option<String> {
        let pair: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query(&mut **conn)
            .ok()?;
        pair.get(1).cloned()
    };
    let Some(policy) = setting(conn, "maxmemory-policy") else {
        return Ok(());
    };
    let limit = setting(conn, "maxmemory").and_then(|m| m.parse::<u64>().ok());
    if policy == "noeviction" || limit == Some(0) {
        return Ok(());
    }
    bail!(
        "Redis {} evicts keys when it is full (maxmemory-policy {policy}, maxmemory {}): a lock \
         key it evicts would look like an expired lease, and the lab's verdict would be false. \
         Use a Redis that never evicts: `CONFIG SET maxmemory-policy noeviction` (or \
         `maxmemory-policy noeviction` in redis.conf), or no memory limit (`maxmemory 0`); \
         `lockslab up` starts one.",
        connect::redact(url),
        limit.map_or_else(|| "unknown".to_string(), |bytes| bytes.to_string())
    )
}

/// The counters that move when keys go without their TTL; `None` where the server would
/// not say.
fn counters(conn: &mut connect::RedisConn) -> Counters {
    let mut info = |section: &str| -> String {
        redis::cmd("INFO")
            .arg(section)
            .query::<String>(&mut **conn)
            .unwrap_or_default()
    };
    let (stats, server, commands) = (info("stats"), info("server"), info("commandstats"));
    let field = |text: &str, name: &str| -> Option<String> {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(|value| value.trim().to_string())
    };
    // `cmdstat_flushall:calls=2,usec=…`; a command never called has no line (0 calls).
    let calls = |name: &str| -> u64 {
        field(&commands, name)
            .and_then(|v| v.strip_prefix("calls=")?.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    Counters {
        evicted: field(&stats, "evicted_keys").and_then(|v| v.parse().ok()),
        flushes: (!commands.is_empty())
            .then(|| calls("cmdstat_flushall") + calls("cmdstat_flushdb")),
        run_id: field(&server, "run_id"),
        expired: field(&stats, "expired_keys").and_then(|v| v.parse().ok()),
    }
}

/// How long before the end of its TTL a key may go unnoticed as early: Redis never removes a
/// key before its time by its own clock — but that clock is the machine's wall clock, which
/// time synchronisation may step by a fraction of a second, while the lab times the key on
/// the monotonic clock. This absorbs such a step (a CI run saw a key expire 145 ms before
/// its PTTL said, with Redis counting it as expired), the millisecond rounding of PTTL and
/// the two clocks' rates; a `DEL` or a flush long before the TTL still shows.
pub const EARLY_MARGIN: Duration = Duration::from_millis(250);

/// One lock key watched while it should live, so that when it goes the lab can tell an
/// expiry from a key that vanished another way (a `DEL` from another client, a flush, an
/// eviction, a restart). Feed it every PTTL Redis answered ([`KeyWatch::present`]); when the
/// key is gone, [`KeyWatch::gone`] says whether its TTL can have ended it.
pub struct KeyWatch {
    url: String,
    /// When the last look that found the key was sent, and the PTTL Redis answered.
    last: Option<(Instant, i64)>,
    before: Counters,
}

impl KeyWatch {
    /// Notes the server's counters now, before the key can go.
    pub fn start(url: &str) -> Result<KeyWatch> {
        Ok(KeyWatch {
            url: url.to_string(),
            last: None,
            before: counters(&mut connect::redis(url)?),
        })
    }

    /// A look sent at `asked_at` found the key with `pttl_ms` to live.
    pub fn present(&mut self, asked_at: Instant, pttl_ms: i64) {
        self.last = Some((asked_at, pttl_ms));
    }

    /// A look sent at `asked_at` found the key gone. None: an expiry fits every answer;
    /// Some: it did not expire, and [`Vanished`] says what Redis's answers prove.
    pub fn gone(&self, asked_at: Instant) -> Result<Option<Vanished>> {
        let after = counters(&mut connect::redis(&self.url)?);
        Ok(not_an_expiry(self.last, asked_at, &self.before, &after))
    }
}

/// A key that went without its TTL ending it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vanished {
    /// Redis's own PTTL proves it went well before its TTL could end it.
    pub early: bool,
    /// What Redis's answers prove, in words.
    pub why: String,
}

impl Vanished {
    /// The timeline's line for `whose` key ("A's key").
    pub fn line(&self, whose: &str) -> String {
        if self.early {
            format!(
                "{whose} vanished before its TTL (deleted or lost): {}",
                self.why
            )
        } else {
            format!(
                "{whose} is gone, but not by its TTL (deleted or lost): {}",
                self.why
            )
        }
    }

    /// The lab's one line when it gives no verdict because `whose` key vanished.
    pub fn no_verdict(&self, whose: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "no verdict: {whose} went without its TTL ending it ({}), so something other than \
             an expiry freed the lock (another client's DEL, a flush, an eviction, a restart)",
            self.why
        )
    }

    /// Says on the timeline (Redis's lane) that `holder`'s key vanished, and returns the
    /// error that ends the lab with no verdict.
    pub fn stop_the_lab(&self, history: &mut impl Record, holder: &str) -> anyhow::Error {
        history.record(Event::new(
            "redis",
            What::Vanished,
            self.line(&format!("{holder}'s key")),
        ));
        self.no_verdict(&format!("{holder}'s lock key"))
    }
}

/// Why a key found gone at `gone_asked_at` cannot have expired, from the last PTTL Redis
/// answered for it (sent at `last.0`; the key then lived at least until `last.0 + PTTL`)
/// and the server's counters before and after; None when an expiry fits them all.
fn not_an_expiry(
    last: Option<(Instant, i64)>,
    gone_asked_at: Instant,
    before: &Counters,
    after: &Counters,
) -> Option<Vanished> {
    let mut causes = Vec::new();
    let mut early = false;
    if let Some((asked_at, pttl)) = last
        && pttl >= 0
    {
        let lives_until = asked_at + Duration::from_millis(pttl as u64);
        if gone_asked_at + EARLY_MARGIN < lives_until {
            early = true;
            causes.push(format!(
                "Redis answered PTTL {pttl}ms {} before it was gone, {} before its TTL could end",
                human(gone_asked_at.saturating_duration_since(asked_at)),
                human(lives_until - gone_asked_at)
            ));
        }
    }
    if let (Some(was), Some(now)) = (before.evicted, after.evicted)
        && now > was
    {
        causes.push(format!(
            "Redis evicted {} key(s) meanwhile (INFO stats evicted_keys {was} → {now})",
            now - was
        ));
    }
    if matches!((&before.run_id, &after.run_id), (Some(was), Some(now)) if was != now) {
        causes.push("Redis restarted meanwhile (INFO server run_id changed)".into());
    } else if let (Some(was), Some(now)) = (before.flushes, after.flushes)
        && now > was
    {
        causes.push(format!(
            "FLUSHALL or FLUSHDB ran {} time(s) meanwhile (INFO commandstats)",
            now - was
        ));
    }
    // An expiry, lazy or active, is counted; a DEL is not.
    if let (Some(was), Some(now)) = (before.expired, after.expired)
        && now == was
    {
        causes.push(format!(
            "no key expired meanwhile (INFO stats expired_keys stayed at {now})"
        ));
    }
    (!causes.is_empty()).then(|| Vanished {
        early,
        why: causes.join("; "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(expired: u64, flushes: u64) -> Counters {
        Counters {
            evicted: Some(0),
            flushes: Some(flushes),
            run_id: Some("r".into()),
            expired: Some(expired),
        }
    }

    #[test]
    fn a_key_gone_when_its_pttl_ran_out_and_counted_as_expired_is_an_expiry() {
        let t = Instant::now();
        let last = Some((t, 150));
        let gone = t + Duration::from_millis(160);
        assert_eq!(
            not_an_expiry(last, gone, &counters(3, 0), &counters(4, 0)),
            None
        );
    }

    #[test]
    fn a_key_gone_well_before_its_pttl_vanished() {
        let t = Instant::now();
        let why = not_an_expiry(
            Some((t, 1700)),
            t + Duration::from_millis(50),
            &counters(3, 0),
            &counters(4, 0),
        )
        .expect("1.7 s early is no expiry");
        assert!(why.early && why.line("A's key").contains("vanished before its TTL"));
    }

    #[test]
    fn a_flush_or_no_expiry_at_all_is_no_expiry_even_at_the_ttl() {
        let t = Instant::now();
        let at_ttl = t + Duration::from_millis(100);
        let flushed = not_an_expiry(Some((t, 100)), at_ttl, &counters(3, 0), &counters(4, 1));
        let flushed = flushed.unwrap();
        assert!(flushed.why.contains("FLUSHALL") && !flushed.line("A's key").contains("expired"));
        let uncounted = not_an_expiry(Some((t, 100)), at_ttl, &counters(3, 0), &counters(3, 0));
        assert!(uncounted.unwrap().why.contains("expired_keys"));
    }
}
