//! Redlock: one lock on N independent Redis masters, held while a majority agrees.
//!
//! [`super::redis`] is a lock on one Redis, and that Redis is a single point of failure:
//! when it dies, the lock service is gone (or, with a replica promoted, the lock may be
//! handed out twice — lab 5). Redlock's answer is to ask N masters that know nothing of
//! each other — no replication, no shared clock — and to count:
//!
//! 1. pick one random value for this acquisition;
//! 2. for each master in turn, `SET key value NX PX ttl`, waiting for each at most a
//!    **per-instance timeout** much shorter than the TTL, so that a master that is down or
//!    frozen costs little and is simply counted as "no";
//! 3. measure the **elapsed** time of the whole round on a monotonic clock (a wall clock
//!    could jump in the middle);
//! 4. the lock is held if at least **⌊N/2⌋+1** masters said OK ([`quorum`]) and the
//!    **validity** `ttl − elapsed − drift` is still positive ([`validity`]): the keys were set
//!    at different moments during the round, the first one is already `elapsed` older, and
//!    the masters' clocks may run a little faster than ours (`drift`);
//! 5. otherwise, release on **all** masters — those that seemed to say no included: a reply
//!    lost on the way back is a key set on a master that looked silent — with the same
//!    compare-and-delete as the single-instance lock, then wait a **random** delay before
//!    trying again, so that clients that collided do not collide again in lockstep.
//!
//! **One after another, or all at once.** The spec's step 2 asks the masters "sequentially"
//! ([`RoundOrder::Sequential`]); its own sections on retrying and on performance then advise
//! sending the `SET` to all N at the same time (multiplexing), which is what
//! [`RoundOrder::Concurrent`] does, and what `go-redsync` does with one goroutine per master.
//! What that changes: how long a round lasts. One after another, every slow or frozen
//! master adds its whole per-instance timeout to `elapsed`; all at once, the round lasts
//! as long as its slowest master, so more validity is left and the window in which two
//! clients split the masters between them is shorter. What it does not change: the safety
//! argument. It needs only that every key was set after the round began (T1, sampled
//! before the first request) and that the round ended at T2, after the last answer; the
//! first key then outlives `TTL − (T2 − T1) − drift`, in either order. The same majority,
//! the same arithmetic, the same release on every master — and the same assumptions
//! (bounded pauses, bounded delays, clocks that do not jump, masters that do not restart
//! empty), which no order of requests relaxes.
//!
//! What it buys, and what it assumes, is the subject of lab 6 (`lockslab redlock`,
//! labs/06-redlock.md): it survives a minority of masters failing, but its safety rests on
//! bounded pauses, bounded network delays and clocks that do not jump, and its random value
//! is not a fencing token.

use std::sync::LazyLock;
use std::thread;
use std::time::{Duration, Instant};

use redis::Value;
use serde::{Deserialize, Serialize};

use super::random_owner;

/// The same compare-and-delete as the single-instance lock ([`super::redis`]), reporting
/// what it found: 1 deleted; 0 with the value found (another holder's), or 0 and nothing.
const COMPARE_AND_DELETE_REPORTING: &str = r#"
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return {1, false}
end
return {0, current}
"#;

/// The same script, and its SHA1 digest, computed once.
static COMPARE_AND_DELETE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(COMPARE_AND_DELETE_REPORTING));

/// How a round asks the masters. Both are the same algorithm (see the module's text):
/// only the round's length, and so the validity left, differs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RoundOrder {
    /// One master after another, in order, as the spec's text says: each slow master's
    /// wait adds to the round
    #[default]
    Sequential,
    /// Every master at once: the requests are all written before any answer is read, so
    /// the round lasts as long as its slowest master
    Concurrent,
}

/// Masters needed for a majority of `masters`: ⌊N/2⌋+1 (3 of 5, 2 of 3). Two majorities of
/// the same N always share a master — the property the whole algorithm leans on.
pub fn quorum(masters: usize) -> usize {
    masters / 2 + 1
}

/// The allowance for clock drift between the masters and this client: `drift_factor` of
/// the TTL plus 2ms (Redis expires keys with millisecond resolution).
pub fn drift(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.mul_f64(drift_factor.max(0.0)) + Duration::from_millis(2)
}

/// How long the lock may still be trusted, counted from the moment the round *began*:
/// `ttl − elapsed − drift`, in milliseconds (negative when nothing is left). The elapsed
/// time is rounded up: a client that errs here should err towards trusting the lock less.
pub fn validity(ttl: Duration, elapsed: Duration, drift: Duration) -> i64 {
    let elapsed_ms = elapsed.as_micros().div_ceil(1000) as i64;
    ttl.as_millis() as i64 - elapsed_ms - drift.as_millis() as i64
}

/// The Redlock settings: the algorithm's knobs, named.
#[derive(Clone, Debug)]
pub struct Settings {
    pub ttl: Duration,
    /// The fraction of the TTL allowed for clock drift. The algorithm only asks for a small
    /// allowance; 0.01 (plus 2ms) is the reference implementations' choice, not part of it.
    pub drift_factor: f64,
    /// How long one master may take to answer before it counts as "no".
    pub instance_timeout: Duration,
    /// Retries wait a random delay from 0 to this.
    pub retry_delay_max: Duration,
    /// One master after another, or all at once.
    pub round: RoundOrder,
}

/// One master: where it is, and a connection when one is open.
pub struct Master {
    /// `m1`, `m2`… for the timeline.
    pub name: String,
    pub url: String,
    connection: Option<redis::Connection>,
    /// The read and write timeouts the open connection has now: set again only when a
    /// command needs other ones (two system calls saved on every request).
    timeouts: Option<Duration>,
}

impl Master {
    pub fn new(name: &str, url: &str) -> Master {
        Master {
            name: name.to_string(),
            url: url.to_string(),
            connection: None,
            timeouts: None,
        }
    }

    /// The port, which is how the walkthrough and `redis-cli -p` name a master.
    pub fn port(&self) -> &str {
        self.url
            .rsplit(':')
            .next()
            .and_then(|tail| tail.split('/').next())
            .unwrap_or("?")
    }

    /// Runs one command with the whole exchange (connecting included) bounded by `timeout`:
    /// the labs' own reads and probes.
    fn ask<T: redis::FromRedisValue>(
        &mut self,
        timeout: Duration,
        query: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T, String> {
        let started = Instant::now();
        self.connect(timeout)?;
        self.bound(timeout.saturating_sub(started.elapsed()))?;
        let connection = self.connection.as_mut().expect("connected above");
        query(connection).map_err(|err| {
            self.disconnect();
            describe_failure(&err)
        })
    }

    /// Opens the connection if there is none, within `timeout`. No `CLIENT SETINFO` after
    /// connecting: its two replies would each wait a full timeout on a frozen master,
    /// doubling what "no answer" costs the round.
    fn connect(&mut self, timeout: Duration) -> Result<(), String> {
        if self.connection.is_some() {
            return Ok(());
        }
        let info = redis::IntoConnectionInfo::into_connection_info(self.url.as_str())
            .map_err(|e| e.to_string())?;
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let client =
            redis::Client::open(info.set_redis_settings(settings)).map_err(|e| e.to_string())?;
        let connection = client
            .get_connection_with_timeout(timeout)
            .map_err(|e| describe_failure(&e))?;
        self.connection = Some(connection);
        self.timeouts = None;
        Ok(())
    }

    /// One request and its answer, the whole exchange (connecting included) bounded by
    /// `timeout`: one master's part of a round.
    fn exchange(&mut self, request: &Request, timeout: Duration) -> Result<Value, String> {
        let started = Instant::now();
        self.connect(timeout)?;
        let left = || timeout.saturating_sub(started.elapsed());
        self.send(&request.packed, left())?;
        let answer = self.receive(left())?;
        self.unless_unknown_script(request, answer, started + timeout)
    }

    /// Gives the next read and write on the connection at most `left`. The socket's
    /// timeouts are changed only when the ones it has are shorter than `left`, or a
    /// millisecond or more longer: a master may be waited on up to a millisecond past its
    /// per-instance timeout (the round's `elapsed` is measured all the same). They are set
    /// in whole milliseconds, rounded up, so that the next request, whose `left` is the
    /// whole timeout less a few microseconds, finds them good enough: two system calls
    /// saved on every request of a steady run, where an exact `left` would be set again
    /// every time the previous one happened to be a microsecond shorter.
    fn bound(&mut self, left: Duration) -> Result<(), String> {
        let left = left.max(Duration::from_millis(1));
        if self
            .timeouts
            .is_some_and(|set| set >= left && set <= left + Duration::from_millis(1))
        {
            return Ok(());
        }
        let whole_ms = Duration::from_millis(left.as_micros().div_ceil(1000) as u64);
        let connection = self.connection.as_mut().ok_or("not connected")?;
        let set = connection
            .set_read_timeout(Some(whole_ms))
            .and_then(|_| connection.set_write_timeout(Some(whole_ms)));
        self.timeouts = Some(whole_ms);
        set.map_err(|err| {
            self.disconnect();
            describe_failure(&err)
        })
    }

    /// Writes `request` (packed) without waiting for its answer: the first half of an
    /// exchange. Only on an open connection; [`Master::receive`] reads the answer.
    fn send(&mut self, request: &[u8], left: Duration) -> Result<(), String> {
        self.bound(left)?;
        let connection = self.connection.as_mut().ok_or("not connected")?;
        connection.send_packed_command(request).map_err(|err| {
            self.disconnect();
            describe_failure(&err)
        })
    }

    /// Reads the answer to what [`Master::send`] wrote, waiting at most `left`. After any
    /// failure the connection is dropped: a reply that arrives late would otherwise be read
    /// as the answer to the next request.
    fn receive(&mut self, left: Duration) -> Result<Value, String> {
        self.bound(left)?;
        let connection = self.connection.as_mut().ok_or("not connected")?;
        connection.recv_response().map_err(|err| {
            self.disconnect();
            describe_failure(&err)
        })
    }

    /// The release is sent as `EVALSHA` (the script's digest, not its text); a master that
    /// does not know the script yet (restarted empty, or never asked) answers `NOSCRIPT`,
    /// and is sent the script itself (`EVAL`), which it then keeps. Before `deadline`.
    fn unless_unknown_script(
        &mut self,
        request: &Request,
        answer: Value,
        deadline: Instant,
    ) -> Result<Value, String> {
        match (&request.script, &answer) {
            (Some(script), Value::ServerError(error)) if error.code() == "NOSCRIPT" => {
                let left = || deadline.saturating_duration_since(Instant::now());
                self.send(script, left())?;
                self.receive(left())
            }
            _ => Ok(answer),
        }
    }

    /// What this master holds under `key` now: its value and PTTL (-2: no key), in one
    /// MULTI/EXEC so both describe the same moment. For the labs' read-backs.
    pub fn read(&mut self, key: &str, timeout: Duration) -> Result<(Option<String>, i64), String> {
        self.ask(timeout, |c| {
            redis::pipe()
                .atomic()
                .cmd("GET")
                .arg(key)
                .cmd("PTTL")
                .arg(key)
                .query(c)
        })
    }

    /// Runs any command on this master, bounded like the others (the labs' own probes).
    pub fn command<T: redis::FromRedisValue>(
        &mut self,
        command: &redis::Cmd,
        timeout: Duration,
    ) -> Result<T, String> {
        self.ask(timeout, |c| command.query(c))
    }

    /// Forgets the connection (after the lab killed or restarted the server).
    pub fn disconnect(&mut self) {
        self.connection = None;
        self.timeouts = None;
    }
}

/// "timed out" for a master that accepted the bytes and said nothing; the client
/// library's words otherwise (connection refused…).
fn describe_failure(err: &redis::RedisError) -> String {
    if err.is_timeout() {
        "no answer in time".to_string()
    } else if err.is_connection_refusal() {
        "connection refused".to_string()
    } else if err.is_connection_dropped() || err.is_unrecoverable_error() {
        "connection lost".to_string()
    } else {
        err.to_string()
    }
}

/// What one master answered to one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// `SET NX PX` answered OK: the key is ours on this master.
    Granted,
    /// `SET NX PX` answered nil: the key exists there (someone else's).
    Refused,
    /// Release: our key was there and is deleted.
    Deleted,
    /// Release: the key held another value (`found`), or nothing.
    NotOurs { found: Option<String> },
    /// Down, frozen or too slow: no answer within the per-instance timeout.
    NoAnswer { why: String },
}

/// One master's answer, and when it came.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Answer {
    pub master: String,
    pub port: String,
    #[serde(flatten)]
    pub reply: Reply,
    /// When the request was sent, counted from the start of the round (ms, fractional).
    pub sent_ms: f64,
    /// How long this master took to answer (or to be given up on).
    pub took_ms: f64,
}

/// One round of the algorithm: every master's answer, and the arithmetic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Attempt {
    /// The random value written to every master.
    pub value: String,
    pub answers: Vec<Answer>,
    pub granted: usize,
    pub quorum: usize,
    pub ttl_ms: u64,
    /// The whole round, on the monotonic clock.
    pub elapsed_ms: f64,
    pub drift_ms: u64,
    /// `ttl − elapsed − drift`, in whole milliseconds.
    pub validity_ms: i64,
    /// A majority granted and validity is left: the client holds the lock.
    pub held: bool,
    /// On failure: what the release-everywhere found, master by master.
    pub released: Vec<Answer>,
    /// When the round began (this process's monotonic clock): the validity counts from here.
    #[serde(skip)]
    pub started: Option<Instant>,
}

impl Attempt {
    /// When the validity ends, on this process's monotonic clock.
    pub fn valid_until(&self) -> Option<Instant> {
        let started = self.started?;
        (self.validity_ms > 0).then(|| started + Duration::from_millis(self.validity_ms as u64))
    }

    /// The round's elapsed time in whole milliseconds, rounded up as [`validity`] rounds
    /// it: every sentence that names the round's length uses this number.
    pub fn elapsed_whole_ms(&self) -> i64 {
        self.elapsed_ms.ceil() as i64
    }

    /// The validity arithmetic in one line, with every number named.
    pub fn arithmetic(&self) -> String {
        format!(
            "validity = TTL {} − elapsed {} − drift {} = {}ms; {} of {} granted, quorum {}: {}",
            self.ttl_ms,
            self.elapsed_whole_ms(),
            self.drift_ms,
            self.validity_ms,
            self.granted,
            self.answers.len(),
            self.quorum,
            if self.held {
                "HELD"
            } else if self.granted >= self.quorum {
                "NOT held (no validity left)"
            } else {
                "NOT held (no majority)"
            }
        )
    }

    /// The round as the timeline shows it: one line per master, then the arithmetic.
    pub fn lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.answers.iter().map(answer_line).collect();
        lines.extend(self.arithmetic().split("; ").map(String::from));
        if !self.released.is_empty() {
            let released: Vec<String> = self
                .released
                .iter()
                .map(|a| {
                    let reply = match &a.reply {
                        Reply::NoAnswer { .. } => "✗".to_string(),
                        Reply::NotOurs { found: Some(_) } => "not ours".to_string(),
                        other => short_reply(other),
                    };
                    format!("{} {reply}", a.master)
                })
                .collect();
            lines.push(format!(
                "released on all {}: {}",
                self.released.len(),
                released.join(", ")
            ));
        }
        lines
    }
}

/// `m3 :40123  +0.8ms  OK  (0.3ms)`.
pub fn answer_line(answer: &Answer) -> String {
    format!(
        "{:<3} :{:<5} sent +{:>5.1}ms  {:<22} ({:.1}ms)",
        answer.master,
        answer.port,
        answer.sent_ms,
        short_reply(&answer.reply),
        answer.took_ms
    )
}

fn short_reply(reply: &Reply) -> String {
    match reply {
        Reply::Granted => "OK".to_string(),
        Reply::Refused => "nil (key taken)".to_string(),
        Reply::Deleted => "deleted".to_string(),
        Reply::NotOurs { found: Some(v) } => format!("not ours ({}…)", &v[..v.len().min(6)]),
        Reply::NotOurs { found: None } => "no key".to_string(),
        Reply::NoAnswer { why } => format!("✗ {why}"),
    }
}

/// The lock over N masters.
pub struct Redlock {
    pub masters: Vec<Master>,
    pub key: String,
    pub settings: Settings,
}

impl Redlock {
    pub fn new(masters: Vec<Master>, key: &str, settings: Settings) -> Redlock {
        Redlock {
            masters,
            key: key.to_string(),
            settings,
        }
    }

    /// ✅ One round of the algorithm. Returns the round whether or not it got the lock; a
    /// failed round has already been released everywhere.
    pub fn try_acquire(&mut self) -> Attempt {
        self.try_acquire_seen(|_| {})
    }

    /// [`Redlock::try_acquire`], showing `seen` each master's answer to the `SET` as soon as
    /// it is in: asked one after another, before the next master is asked (what a lab does
    /// there — a fault that lands between two requests — is part of the round and of its
    /// elapsed time); all at once, after the last answer, in the masters' order.
    pub fn try_acquire_seen(&mut self, seen: impl FnMut(&Answer)) -> Attempt {
        let ttl = self.settings.ttl;
        let value = random_owner();
        let mut set = redis::cmd("SET");
        set.arg(&self.key)
            .arg(&value)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64);
        let set = Request {
            packed: set.get_packed_command(),
            script: None,
        };
        let started = Instant::now();
        let judge = |answer| match answer {
            Ok(Value::Okay) => Reply::Granted,
            Ok(Value::Nil) => Reply::Refused,
            Ok(other) => Reply::NoAnswer {
                why: format!("unexpected reply {other:?}"),
            },
            Err(why) => Reply::NoAnswer { why },
        };
        let answers = self.ask_every_master(started, &set, judge, seen);
        let elapsed = started.elapsed();
        let granted = answers.iter().filter(|a| a.reply == Reply::Granted).count();
        let quorum = quorum(self.masters.len());
        let drift = drift(ttl, self.settings.drift_factor);
        let validity_ms = validity(ttl, elapsed, drift);
        let mut attempt = Attempt {
            value,
            answers,
            granted,
            quorum,
            ttl_ms: ttl.as_millis() as u64,
            elapsed_ms: ms(elapsed),
            drift_ms: drift.as_millis() as u64,
            validity_ms,
            held: granted >= quorum && validity_ms > 0,
            released: Vec::new(),
            started: Some(started),
        };
        if !attempt.held {
            attempt.released = self.release(&attempt.value);
        }
        attempt
    }

    /// Sends `request` to every master, one after another or all at once as
    /// [`Settings::round`] says, and returns what `judge` makes of each answer, in the
    /// masters' order, each timed from `started`: when its request was sent, and how long
    /// until its answer was read (or given up on).
    ///
    /// All at once, as the spec's section on performance describes it: the request is
    /// written to every open connection first, and the answers read after, each within its
    /// own per-instance timeout counted from its own send. A master with no connection yet
    /// (the first round, or after a failure) connects and asks on a thread of its own, so
    /// that a frozen one, which accepts the connection and never answers, costs the round
    /// one timeout however many are frozen. Answers are read in the masters' order: one read
    /// after a silent master's wait shows the time it was read, not when it arrived.
    ///
    /// `seen` is shown each answer as it is in (one after another), or all of them once the
    /// last is (all at once).
    fn ask_every_master(
        &mut self,
        started: Instant,
        request: &Request,
        judge: impl Fn(Result<Value, String>) -> Reply + Sync,
        mut seen: impl FnMut(&Answer),
    ) -> Vec<Answer> {
        let timeout = self.settings.instance_timeout;
        let answer = |master: &Master, reply, sent: Duration| Answer {
            master: master.name.clone(),
            port: master.port().to_string(),
            reply,
            sent_ms: ms(sent),
            took_ms: ms(started.elapsed() - sent),
        };
        let ask = |master: &mut Master| {
            let sent = started.elapsed();
            let reply = judge(master.exchange(request, timeout));
            answer(master, reply, sent)
        };
        match self.settings.round {
            RoundOrder::Sequential => (self.masters.iter_mut())
                .map(|master| {
                    let answer = ask(master);
                    seen(&answer);
                    answer
                })
                .collect(),
            RoundOrder::Concurrent => thread::scope(|scope| {
                let mut connecting = Vec::new();
                let mut waiting = Vec::new();
                let mut answers: Vec<Option<Answer>> = vec![None; self.masters.len()];
                for (i, master) in self.masters.iter_mut().enumerate() {
                    if master.connection.is_none() {
                        let thread = thread::Builder::new()
                            .spawn_scoped(scope, || ask(master))
                            .expect("starting a thread to ask a master");
                        connecting.push((i, thread));
                        continue;
                    }
                    let sent = started.elapsed();
                    match master.send(&request.packed, timeout) {
                        Ok(()) => waiting.push((i, master, sent)),
                        Err(why) => answers[i] = Some(answer(master, judge(Err(why)), sent)),
                    }
                }
                for (i, master, sent) in waiting {
                    let deadline = started + sent + timeout;
                    let reply = master
                        .receive(deadline.saturating_duration_since(Instant::now()))
                        .and_then(|value| master.unless_unknown_script(request, value, deadline));
                    answers[i] = Some(answer(master, judge(reply), sent));
                }
                for (i, thread) in connecting {
                    answers[i] = Some(thread.join().expect("a thread asking a master panicked"));
                }
                let answers: Vec<Answer> = answers.into_iter().flatten().collect();
                answers.iter().for_each(&mut seen);
                answers
            }),
        }
    }

    /// ✅ Rounds until one holds the lock or `wait` has passed, each failed round followed
    /// by a random delay. Returns every round, the last one deciding.
    pub fn acquire_within(&mut self, wait: Duration) -> Vec<Attempt> {
        let deadline = Instant::now() + wait;
        let mut rounds = Vec::new();
        loop {
            let attempt = self.try_acquire();
            let held = attempt.held;
            rounds.push(attempt);
            if held || Instant::now() >= deadline {
                return rounds;
            }
            thread::sleep(random_delay(self.settings.retry_delay_max));
        }
    }

    /// ✅ Compare-and-delete on **every** master, whatever it answered to the SET.
    pub fn release(&mut self, value: &str) -> Vec<Answer> {
        let script = &*COMPARE_AND_DELETE;
        let mut by_digest = redis::cmd("EVALSHA");
        by_digest
            .arg(script.get_hash())
            .arg(1)
            .arg(&self.key)
            .arg(value);
        let mut by_text = redis::cmd("EVAL");
        by_text
            .arg(COMPARE_AND_DELETE_REPORTING)
            .arg(1)
            .arg(&self.key)
            .arg(value);
        let request = Request {
            packed: by_digest.get_packed_command(),
            script: Some(by_text.get_packed_command()),
        };
        let judge = |answer: Result<Value, String>| match answer
            .and_then(|v| redis::from_redis_value(v).map_err(|e| e.to_string()))
        {
            Ok((1, _)) => Reply::Deleted,
            Ok((_, found)) => Reply::NotOurs { found },
            Err(why) => Reply::NoAnswer { why },
        };
        self.ask_every_master(Instant::now(), &request, judge, |_| {})
    }
}

/// One request of a round, packed once for every master: the same bytes to each. For the
/// release, `packed` names the script by its digest (`EVALSHA`) and `script` carries its
/// text (`EVAL`), for a master that answers that it does not know the digest.
struct Request {
    packed: Vec<u8>,
    script: Option<Vec<u8>>,
}

// ❌ What Redlock is not: a fencing token.
//
// The value is random so that a release deletes only our own key; it has no order. Can it
// still guard the data? antirez's answer ("Is Redlock safe?", http://antirez.com/news/101,
// a reply to Kleppmann's "How to do distributed locking",
// https://martin.kleppmann.com/2016/02/08/how-to-do-distributed-locking.html): let the
// resource compare-and-set it — the holder first claims the resource with its value, then
// every write goes through only while the resource's claim is still that value, so an old
// holder whose claim was replaced is refused. The reply to that: a claim carries no order
// either. If the old holder pauses between its grant and its claim (or its claim is
// delayed in the network), the claim lands after the new holder's and displaces it, and
// the old holder's writes go through. Lab 6 plays both (the store's `claim` and
// `write_if_claimed`) beside a token from an ordered, durable source.

/// A random delay from 0 to `max` (from the run's seed, see [`crate::seed`]).
pub fn random_delay(max: Duration) -> Duration {
    let mut bytes = [0u8; 8];
    if crate::seed::fill(&mut bytes).is_err() {
        return max / 2;
    }
    let fraction = u64::from_le_bytes(bytes) as f64 / u64::MAX as f64;
    max.mul_f64(fraction)
}

fn ms(duration: Duration) -> f64 {
    duration.as_micros() as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_is_floor_half_plus_one() {
        assert_eq!(quorum(3), 2);
        assert_eq!(quorum(5), 3);
        assert_eq!(quorum(7), 4);
        // Two majorities of five share at least one master: 3 + 3 > 5.
        assert!(2 * quorum(5) > 5);
    }

    #[test]
    fn drift_is_a_fraction_of_the_ttl_plus_two_milliseconds() {
        assert_eq!(
            drift(Duration::from_secs(10), 0.01),
            Duration::from_millis(102)
        );
        assert_eq!(
            drift(Duration::from_secs(2), 0.01),
            Duration::from_millis(22)
        );
        assert_eq!(drift(Duration::from_secs(2), 0.0), Duration::from_millis(2));
    }

    #[test]
    fn validity_is_ttl_minus_elapsed_minus_drift() {
        let ttl = Duration::from_secs(2);
        let d = drift(ttl, 0.01);
        assert_eq!(validity(ttl, Duration::from_millis(3), d), 2000 - 3 - 22);
        // Two frozen masters at 50ms each eat 100ms of it.
        assert_eq!(validity(ttl, Duration::from_millis(103), d), 1875);
        // A round slower than the TTL leaves nothing, majority or not.
        assert!(validity(ttl, Duration::from_millis(1990), d) < 0);
    }

    #[test]
    fn the_arithmetic_names_every_number() {
        let attempt = Attempt {
            value: "ab".repeat(16),
            answers: Vec::new(),
            granted: 3,
            quorum: 3,
            ttl_ms: 2000,
            elapsed_ms: 101.2,
            drift_ms: 22,
            validity_ms: 1877,
            held: true,
            released: Vec::new(),
            started: None,
        };
        let line = attempt.arithmetic();
        for part in [
            "TTL 2000",
            "elapsed 102",
            "drift 22",
            "= 1877ms",
            "quorum 3",
            "HELD",
        ] {
            assert!(line.contains(part), "{part:?} missing from {line:?}");
        }
    }

    #[test]
    fn random_delays_stay_within_their_bound() {
        for _ in 0..100 {
            assert!(random_delay(Duration::from_millis(200)) <= Duration::from_millis(200));
        }
    }
}
