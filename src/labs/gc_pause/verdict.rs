//! Lab 1's verdict: what each run shows, decided by [`crate::check::gc_pause`] from Redis's
//! answers and the store's record, and the table and sentences that say it.

use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value};

use super::Plan;
use crate::check::gc_pause::{self as checks, Evidence, Findings};
use crate::check::report::{self, Report};
use crate::check::{Finding, LateWrite};
use crate::events::{Event, Kind, What};
use crate::labs::Conclusion;
use crate::labs::replay::{self, Replayed};
use crate::labs::runner;
use crate::labs::words::Words;
use crate::lock::redis::Release;
use crate::output::human;
use crate::store::{Outcome, ReadBack};
use crate::worker::holder::release_of;

/// Every run of the lab, and the plan they are read against.
pub struct Verdict {
    pub runs: Vec<RunVerdict>,
    pub(crate) plan: Plan,
}

impl runner::Verdict for Verdict {
    fn fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("ttl_ms".into(), (self.plan.ttl.as_millis() as u64).into());
        fields.insert(
            "pause_ms".into(),
            (self.plan.pause.as_millis() as u64).into(),
        );
        fields.insert(
            "freeze".into(),
            serde_json::to_value(self.plan.freeze).unwrap_or_default(),
        );
        fields.insert("token_restart".into(), self.plan.token_restart.into());
        fields.insert(
            "runs".into(),
            serde_json::to_value(&self.runs).unwrap_or_default(),
        );
        fields
    }

    fn words(&self) -> Words {
        verdict_words(&self.runs, self.plan.ttl, self.plan.pause)
    }

    fn checkpoint(&self) -> Option<&'static crate::labs::step::Checkpoint> {
        Some(&crate::labs::step::gc_pause::VERDICT)
    }

    fn headline(&self) -> String {
        let runs: Vec<String> = self
            .runs
            .iter()
            .map(|run| {
                format!(
                    "{}: {}",
                    if run.fencing { "fenced" } else { "unfenced" },
                    crate::room::stale_write_word(
                        run.stale_write_attempted,
                        run.stale_write_accepted
                    )
                )
            })
            .collect();
        runs.join(" · ")
    }
}

/// How a run was set up: the facts of its verdict that no server decides.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    /// The store's rule for fenced writes (`not_lower`, `higher_or_same_holder`); None unfenced.
    pub store_rule: Option<&'static str>,
    /// Where the tokens came from (`redis_incr`, `postgres_sequence`); None unfenced.
    pub token_source: Option<&'static str>,
    /// Redis was crashed and restarted while A was frozen.
    pub token_restart: bool,
}

/// What the servers answered the workers, as their events in one run's history report it.
#[derive(Clone, Debug)]
pub struct Heard {
    /// What A's compare-and-delete found.
    pub a_release: Release,
    /// The owner value Redis granted B.
    pub b_owner: Option<String>,
    /// What B's compare-and-delete found.
    pub b_release: Option<Release>,
    /// What the store answered A's write (a lost answer is unknown).
    pub a_heard: Option<Outcome>,
    /// Redis expired A's key, or the lab crashed the Redis holding it, before A's write was
    /// reported.
    pub a_key_gone_before_write: bool,
    /// Lab clock (ms): A's PX ran at least until then (PTTL read before the crash).
    pub a_lease_until_ms: Option<u64>,
    /// Lab clock (ms): B's grant had been reported by then.
    pub b_granted_by_ms: Option<u64>,
}

impl Heard {
    /// The checkers' findings from what the servers answered and the store's record; an
    /// error when the store's record disagrees with itself (no verdict is read from it).
    pub fn judged(&self, read: &ReadBack) -> Result<Findings> {
        checks::judge(&Evidence {
            a_release: &self.a_release,
            b_owner: self.b_owner.as_deref(),
            b_release: self.b_release.as_ref(),
            attempts: &read.attempts,
            final_writer: read.final_writer.as_deref(),
            a_key_gone_before_write: self.a_key_gone_before_write,
            a_lease_until_ms: self.a_lease_until_ms,
            b_granted_by_ms: self.b_granted_by_ms,
        })
        .map_err(|wrong| {
            anyhow!(
                "the store's record disagrees with itself: its final writer is {:?} but its \
                 last accepted attempt is not",
                wrong.final_writer
            )
        })
    }
}

/// Reads one run's history (its events only) for what the servers answered the workers.
pub fn heard(log: &[Event]) -> Result<Heard> {
    let saw = |worker: &str, kind: Kind| log.iter().find(|e| e.is(worker, kind));
    let a_heard = saw("A", Kind::Wrote).map(|wrote| match &wrote.what {
        What::Wrote(facts) => facts.outcome,
        _ => Outcome::Unknown,
    });
    let a_wrote_at = log.iter().position(|e| e.is("A", Kind::Wrote));
    let a_key_gone_at = log.iter().position(|e| {
        e.is("redis", Kind::Expired) || (e.is("lab", Kind::Killed) && e.text.contains("Redis"))
    });
    let a_key_gone_before_write = match (a_key_gone_at, a_wrote_at) {
        (Some(gone), Some(wrote)) => gone < wrote,
        _ => false,
    };
    Ok(Heard {
        a_key_gone_before_write,
        a_lease_until_ms: log
            .iter()
            .find(|e| e.is("redis", Kind::Pttl))
            .and_then(|e| match &e.what {
                What::Pttl(pttl) => pttl.lease_lives_until_ms,
                _ => None,
            }),
        b_granted_by_ms: saw("B", Kind::Acquired).map(|e| e.t_ms),
        a_release: saw("A", Kind::Released)
            .and_then(release_of)
            .context("A's release did not say what Redis answered")?,
        b_owner: saw("B", Kind::Acquired)
            .and_then(|e| e.owner())
            .map(String::from),
        b_release: saw("B", Kind::Released).and_then(release_of),
        a_heard,
    })
}

/// The store's line on the timeline when A's write was decided after B's: taken or refused,
/// and whose result the resource holds (the checker's conclusion, said, not recorded).
pub fn store_line(verdict: &RunVerdict) -> Option<Conclusion> {
    let holds = verdict.final_writer.as_deref().unwrap_or("nobody");
    let (broken, text) = match verdict.late_write {
        LateWrite::Accepted => (
            true,
            format!(
                "decided A's stale write after B's and took it: it holds {holds}'s result, B's is lost"
            ),
        ),
        LateWrite::Rejected => (
            false,
            format!("decided A's stale write after B's and refused it: it holds {holds}'s result"),
        ),
        LateWrite::None => return None,
    };
    Some(Conclusion {
        lane: "store",
        text,
        broken,
    })
}

impl Setup {
    /// The setup a recorded run states. A recording older than these fields was played
    /// without `--token-restart`: fenced with Redis `INCR` tokens and the store's `>=`.
    pub fn recorded(run: &Value, verdict: &Value) -> Result<Setup> {
        let fenced = replay::flag(run, "fencing")?;
        let named = |field: &str, known: &[&'static str], default: &'static str| match run
            .get(field)
            .and_then(Value::as_str)
        {
            Some(word) => known
                .iter()
                .find(|k| **k == word)
                .copied()
                .with_context(|| format!("an unknown {field}: {word}")),
            None => Ok(default),
        };
        let store_rule = named(
            "store_rule",
            &["not_lower", "higher_or_same_holder"],
            "not_lower",
        )?;
        let token_source = named(
            "token_source",
            &["redis_incr", "postgres_sequence"],
            "redis_incr",
        )?;
        let token_restart = run
            .get("token_restart")
            .or_else(|| verdict.get("token_restart"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        Ok(Setup {
            store_rule: fenced.then_some(store_rule),
            token_source: fenced.then_some(token_source),
            token_restart,
        })
    }
}

/// `lockslab check`: each recorded run judged again from its own events (cut where the lab
/// announced each run) by [`RunVerdict::from_history`].
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let runs = replay::list(verdict, "runs")?;
    let pieces = match replay::cut_at_runs(events, runs.len()) {
        Some(pieces) => pieces,
        None => runs
            .iter()
            .map(|run| {
                let fenced = run.get("fencing").and_then(Value::as_bool);
                replay::part_of(events, |e| e.part.fencing == fenced)
            })
            .collect(),
    };
    let mut replayed = Replayed::default();
    for (run, log) in runs.iter().zip(pieces) {
        let log = replayed.with_read_back(log, run, None)?;
        let setup = Setup::recorded(run, verdict)?;
        let found = RunVerdict::from_history(setup, &log)?;
        replayed.part(found.title(), run, &found);
    }
    Ok(replayed)
}

/// Lab 1's checker: the whole history, every run in it, judged as one [`Report`].
///
/// The history is cut where the lab announced each run (its `run` events; a history without
/// them is one run), and each run gives two findings, both from the same checkers the
/// verdict's table is read from ([`checks::judge`]):
///
/// - **mutual exclusion**: did Redis grant B the lock while A still held it? Proved by A's
///   release (it found B's key), B's grant reported before A's lease could end (the PTTL
///   answered before a crash), or the store deciding A's write after B's;
/// - **stale write**: did the store take a write A made once its lease was over? Proved by
///   the store's read-back (its decision order) and the two writes.
///
/// A run whose history lacks what decides (A's release, the read-back) is unknown, with the
/// reason, never a pass. Each finding's events are positions in `history`.
pub fn check(history: &[Event]) -> Report {
    let starts: Vec<usize> = (0..history.len())
        .filter(|&i| history[i].is("lab", Kind::Run))
        .collect();
    let starts = if starts.is_empty() { vec![0] } else { starts };
    Report::compose(starts.iter().enumerate().map(|(n, &from)| {
        let to = starts.get(n + 1).copied().unwrap_or(history.len());
        let run = &history[from..to];
        let label = run.first().map(|e| e.part.label()).unwrap_or_default();
        check_run(run)
            .shifted(from)
            .about(&format!("run {}: {label}", n + 1))
    }))
}

/// One run's two findings; event positions are in `log`.
fn check_run(log: &[Event]) -> Report {
    let (heard, read) = match (heard(log), replay::read_back(log)) {
        (Ok(heard), Ok(read)) => (heard, read),
        (Err(why), _) | (_, Err(why)) => return Report::evidence_missing(format!("{why:#}")),
    };
    let found = match heard.judged(&read) {
        Ok(found) => found,
        Err(why) => return Report::evidence_missing(format!("{why:#}")),
    };
    let at = |worker: &str, kind: Kind| log.iter().position(|e| e.is(worker, kind));
    let read_back_at = log.iter().rposition(|e| e.kind() == Kind::ReadBack);
    Report::of([
        mutual_exclusion(&found, &heard, &at, read_back_at),
        stale_write(&found, &at, read_back_at),
    ])
}

/// Whether Redis handed the lock to B while A still held it, and the answers that say so.
fn mutual_exclusion(
    found: &Findings,
    heard: &Heard,
    at: &dyn Fn(&str, Kind) -> Option<usize>,
    read_back_at: Option<usize>,
) -> report::Finding {
    // A's release and B's grant always; then whichever answer settled it.
    let mut events: Vec<Option<usize>> = vec![at("A", Kind::Released), at("B", Kind::Acquired)];
    let words = match found.two_holders {
        Finding::Yes if found.b_granted_within_a_lease == Finding::Yes => {
            events.push(at("redis", Kind::Pttl));
            "Redis granted B the lock before A's lease could have ended (by the PTTL it \
             answered): two holders at once"
        }
        Finding::Yes if matches!(heard.a_release, Release::HeldBy(_)) => {
            "A's release found B's key: Redis had granted B the lock while A still held it"
        }
        Finding::Yes => {
            events.push(read_back_at);
            "the store decided A's write after B's accepted one: B held the lock before A \
             let go"
        }
        Finding::No if heard.b_owner.is_none() => "Redis never granted B the lock",
        Finding::No if heard.a_release.deleted() => {
            "A's release deleted its own key: A held the lock until it let go"
        }
        Finding::No => {
            events.push(at("B", Kind::Released));
            "A's key was gone when it let go and B's lived until B's release: Redis granted B \
             only after A let go"
        }
        Finding::Unknown => {
            events.push(at("B", Kind::Released));
            "A's and B's keys had both expired before they let go: Redis's answers cannot \
             order B's grant against A's release"
        }
    };
    report::Finding::new(
        "mutual exclusion",
        report::Outcome::broken_if(found.two_holders),
        words,
        events.into_iter().flatten(),
    )
}

/// Whether the store took a write A made after its lease was over, by the store's
/// decision order.
fn stale_write(
    found: &Findings,
    at: &dyn Fn(&str, Kind) -> Option<usize>,
    read_back_at: Option<usize>,
) -> report::Finding {
    let (outcome, words) = match (found.late_write, found.a_stale_write_accepted) {
        (LateWrite::Accepted, _) => (
            report::Outcome::Invalid,
            "the store decided A's write after B's and took it: B's result is lost",
        ),
        (_, Some(true)) => (
            report::Outcome::Invalid,
            "the store took A's write, made after A's key was gone",
        ),
        (LateWrite::Rejected, _) => (
            report::Outcome::Valid,
            "the store decided A's write after B's and refused it: B's result stands",
        ),
        (LateWrite::None, Some(false)) => (
            report::Outcome::Valid,
            "the store refused A's write, made after A's key was gone",
        ),
        (LateWrite::None, _) if !found.a_write_recorded => (
            report::Outcome::Valid,
            "the store has no record of A's write: it took no effect",
        ),
        (LateWrite::None, _) => (
            report::Outcome::Valid,
            "the store decided A's write before B's, while it was not stale",
        ),
    };
    let events = [read_back_at, at("A", Kind::Wrote), at("B", Kind::Wrote)];
    // A's write is what the finding is about where it was stale: decided after B's, or
    // made after A's key was gone.
    let stale = found.late_write.attempted() || found.a_stale_write_accepted.is_some();
    report::Finding::new("stale write", outcome, words, events.into_iter().flatten())
        .about_event(at("A", Kind::Wrote).filter(|_| stale))
}

/// What one run found. Every field comes from a backend's answer: Redis's (who held the
/// lock when) or the store's (which write it decided last, and what it decided).
#[derive(Serialize, Debug, Clone)]
pub struct RunVerdict {
    pub fencing: bool,
    /// The store's rule for fenced writes: `not_lower` (`>=`, its own) or
    /// `higher_or_same_holder` (a lesson: an equal token from another writer refused); null
    /// unfenced.
    pub store_rule: Option<&'static str>,
    /// Where the tokens came from: `redis_incr` (drawn with the lock, on the Redis that
    /// restarts) or `postgres_sequence` (the store's own database); null unfenced.
    pub token_source: Option<&'static str>,
    /// Who the store decided first (`A` or `B`), from its attempts.
    pub first_writer: Option<String>,
    /// Whether the store took B's write (B was granted after A); null when B did not write.
    pub b_write_accepted: Option<bool>,
    /// Redis was crashed and restarted empty between A's and B's acquisitions.
    pub token_restart: bool,
    /// Redis granted B the lock while A still believed it held it (A's release found B's
    /// key, or A's write was decided after B's); null when the evidence cannot order B's grant.
    pub two_holders: Option<bool>,
    /// A's write, in the store's decision order relative to B's accepted write.
    pub late_write: LateWrite,
    /// Lab clock (ms): A's PX would have run at least until then, by the PTTL Redis
    /// answered before the crash (`--token-restart`; null otherwise).
    pub a_lease_until_ms: Option<u64>,
    /// Lab clock (ms): B's grant had reached the lab by then (an upper bound on the grant).
    pub b_granted_by_ms: Option<u64>,
    /// What the store decided for A's write, made after A's key was gone (expired or lost in
    /// the crash), in whichever order; null when A's key outlived its pause.
    pub a_stale_write_accepted: Option<bool>,
    /// A's write was decided after B's (the write that can destroy B's result).
    pub stale_write_attempted: bool,
    /// Whether the store took that stale write; null when there was none.
    pub stale_write_accepted: Option<bool>,
    /// A's compare-and-delete found its key gone or taken: Redis had ended A's lease before
    /// A let go.
    pub a_lease_ran_out: bool,
    /// What A heard back for its write; a lost answer is "unknown" and the store decides.
    pub a_heard: Option<Outcome>,
    pub final_value: Option<String>,
    pub final_writer: Option<String>,
    pub final_token: Option<i64>,
    pub stale_token: Option<i64>,
    pub newer_token: Option<i64>,
    /// Every write attempt, in the order the database decided them.
    pub attempts: Vec<crate::store::Attempt>,
    /// A and B wrote with one token: its source issued it twice.
    #[serde(skip)]
    pub token_reissued: bool,
    /// The store has a record of A's write.
    #[serde(skip)]
    pub a_write_recorded: bool,
}

impl RunVerdict {
    /// The run's column in the table.
    fn title(&self) -> String {
        if !self.token_restart {
            return if self.fencing {
                "with fencing"
            } else {
                "without fencing"
            }
            .into();
        }
        let first = self.first_writer.as_deref().unwrap_or("?");
        match (self.token_source, self.store_rule) {
            (Some("postgres_sequence"), _) => format!("sequence, {first} first"),
            (_, Some("higher_or_same_holder")) => format!("same holder, {first} first"),
            _ => format!(">=, {first} first"),
        }
    }

    /// Judges one run from its history: what Redis and the store answered the workers, and
    /// the store's read-back in it. The live run and `lockslab check` both judge this way.
    pub fn from_history(setup: Setup, log: &[Event]) -> Result<RunVerdict> {
        RunVerdict::judge(setup, &heard(log)?, replay::read_back(log)?)
    }

    /// Judges the run from Redis's answers and the store's record (the checkers decide;
    /// this only lays their findings out for the table and `--json`).
    pub fn judge(setup: Setup, heard: &Heard, read: ReadBack) -> Result<RunVerdict> {
        let found = heard.judged(&read)?;
        Ok(RunVerdict {
            fencing: setup.store_rule.is_some(),
            store_rule: setup.store_rule,
            token_source: setup.token_source,
            first_writer: found.first_writer,
            b_write_accepted: found.b_write_accepted,
            token_restart: setup.token_restart,
            two_holders: found.two_holders.as_option(),
            late_write: found.late_write,
            a_lease_until_ms: heard.a_lease_until_ms,
            b_granted_by_ms: heard.b_granted_by_ms,
            a_stale_write_accepted: found.a_stale_write_accepted,
            stale_write_attempted: found.late_write.attempted(),
            stale_write_accepted: found.late_write.accepted(),
            a_lease_ran_out: found.a_lease_ran_out,
            a_heard: heard.a_heard,
            stale_token: found.stale_token,
            newer_token: found.newer_token,
            token_reissued: found.token_reissued,
            a_write_recorded: found.a_write_recorded,
            final_value: read.final_value,
            final_writer: read.final_writer,
            final_token: read.final_token,
            attempts: read.attempts,
        })
    }

    /// What the run shows, in sentences drawn from the same fields as the table: first who
    /// held the lock, then what the store did with A's write.
    fn meaning(&self, ttl: Duration, pause: Duration) -> String {
        if self.token_restart {
            let (a, b) = (token_text(self.stale_token), token_text(self.newer_token));
            return format!(
                "{}{} {}",
                self.who_held_across_the_restart(&a, &b),
                self.grants_within_a_lease(),
                self.what_the_store_did_after_the_restart(&a, &b)
            );
        }
        format!(
            "{} {}",
            self.who_held(ttl, pause),
            self.what_the_store_did()
        )
    }

    /// Under `--token-restart`: Redis restarted while A was frozen, and where B's token came
    /// from.
    fn who_held_across_the_restart(&self, a: &str, b: &str) -> String {
        if self.token_reissued {
            format!(
                "Redis restarted empty while A was frozen: A's key and the token counter were \
                 gone, so B took the lock at once and drew token {b} — A's token, issued twice."
            )
        } else if self.token_source == Some("postgres_sequence") {
            format!(
                "Redis restarted empty while A was frozen and B took the lock at once, but the \
                 tokens came from the store's sequence, which no Redis restart resets: A {a}, \
                 B {b}."
            )
        } else {
            format!("Redis restarted while A was frozen; A holds token {a}, B drew token {b}.")
        }
    }

    /// Under `--token-restart`: when Redis granted B inside A's lease, by the PTTL it had
    /// answered before the crash.
    fn grants_within_a_lease(&self) -> String {
        match (
            self.two_holders,
            self.b_granted_by_ms,
            self.a_lease_until_ms,
        ) {
            (Some(true), Some(granted), Some(until)) if granted < until => format!(
                " Redis granted B by +{:.3}s, while A's PX — by the PTTL Redis answered \
                 before the crash — ran until at least +{:.3}s: Redis handed the lock out \
                 twice within A's lease.",
                granted as f64 / 1000.0,
                until as f64 / 1000.0
            ),
            _ => String::new(),
        }
    }

    /// Under `--token-restart`: what the store's rule made of two writes after the restart.
    fn what_the_store_did_after_the_restart(&self, a: &str, b: &str) -> String {
        match (self.late_write, self.store_rule, self.b_write_accepted) {
            (LateWrite::Accepted, Some("not_lower"), _) => format!(
                "The store's rule, not lower than the highest (>=), took A's token {a} after \
                 B's {b}: B's result is lost, fencing and all (a lesson: the source reissued)."
            ),
            (LateWrite::Rejected, Some("higher_or_same_holder"), _) => format!(
                "Refusing an equal token from another holder refused A's {a}, because B's \
                 came first (a lesson: see the run where A writes first)."
            ),
            (LateWrite::None, Some("higher_or_same_holder"), Some(false)) => format!(
                "A, the stale holder, wrote after its key was gone and, first, was accepted; \
                 B, granted the lock after A and still inside its own lease, came second with \
                 the same token {b} and was refused: A's result stands. No rule at the store \
                 can tell two holders of one token apart (a lesson)."
            ),
            (LateWrite::Rejected, _, _) => {
                format!("The store refused A's token {a} after B's {b}: B's result stands.")
            }
            (LateWrite::None, _, Some(true)) if self.final_writer.as_deref() == Some("B") => {
                format!(
                    "A's write was decided first; B's token {b} came after it and was \
                     accepted: B's result stands."
                )
            }
            (LateWrite::Accepted, _, _) => "The store took A's stale write.".to_string(),
            (LateWrite::None, _, _) => "The store decided A's write before B's: no stale \
                                        write this time."
                .to_string(),
        }
    }

    /// Who held the lock while A was paused, by Redis's answers.
    fn who_held(&self, ttl: Duration, pause: Duration) -> String {
        match (self.two_holders, self.a_lease_ran_out) {
            (Some(true), _) => format!(
                "A's {} lease ran out during its {} pause and Redis gave the lock to B while A still \
                 believed it held it (A's release found B's key).",
                human(ttl),
                human(pause)
            ),
            (Some(false), true) => format!(
                "A's {} lease ran out during its {} pause, but Redis granted B the lock only after \
                 A let go.",
                human(ttl),
                human(pause)
            ),
            (Some(false), false) => format!(
                "A's key outlived its {} pause: A still held the lock when it let go, and B waited.",
                human(pause)
            ),
            (None, _) => "A's lease ran out, and B's key had expired too by the time B let go, \
                          so Redis's answers cannot tell whether B got the lock before A let go."
                .to_string(),
        }
    }

    /// What the store did with A's write.
    fn what_the_store_did(&self) -> String {
        match self.late_write {
            LateWrite::Accepted => "The store decided A's write after B's and took it: B's result \
                                    is lost, although both workers used a correct lock."
                .to_string(),
            LateWrite::Rejected => format!(
                "The store refused A's token {} because it had accepted token {}: B's result stands.",
                token_text(self.stale_token),
                token_text(self.newer_token),
            ),
            LateWrite::None if !self.a_write_recorded => {
                "A's write never took effect: the store has no record of it.".to_string()
            }
            LateWrite::None if self.a_lease_ran_out => {
                "The store decided A's write before any write of B's: no stale write this time — \
                 by luck, not by design."
                    .to_string()
            }
            LateWrite::None => "No stale write: the lock did its job.".to_string(),
        }
    }
}

/// A fencing token as the sentences name it, `?` when the run has none.
fn token_text(token: Option<i64>) -> String {
    token.map(|t| t.to_string()).unwrap_or("?".into())
}

/// The verdict's words: a table with a column per run, then a sentence on each run.
fn verdict_words(verdicts: &[RunVerdict], ttl: Duration, pause: Duration) -> Words {
    let yes_no = |b: bool| {
        if b {
            "yes".to_string()
        } else {
            "no".to_string()
        }
    };
    let titles: Vec<String> = verdicts.iter().map(|v| v.title()).collect();
    let header: Vec<&str> = std::iter::once("evidence")
        .chain(titles.iter().map(String::as_str))
        .collect();
    // A's write made after its key was gone, whichever order the store decided it in.
    let stale = |v: &RunVerdict| match (v.a_stale_write_accepted, v.late_write) {
        (_, LateWrite::Accepted) => "ACCEPTED after B's".red().bold().to_string(),
        (_, LateWrite::Rejected) => "refused after B's".green().bold().to_string(),
        (Some(true), _) => match v.b_write_accepted {
            Some(false) => format!(
                "{}, then B's {}",
                "ACCEPTED".red().bold(),
                "REFUSED".red().bold()
            ),
            Some(true) => format!("{}, then B's accepted", "ACCEPTED".red().bold()),
            None => "ACCEPTED".red().bold().to_string(),
        },
        (Some(false), _) => "refused".green().bold().to_string(),
        (None, _) => "none".to_string(),
    };
    let row = |name: &str, cell: &dyn Fn(&RunVerdict) -> String| {
        std::iter::once(name.to_string())
            .chain(verdicts.iter().map(cell))
            .collect::<Vec<_>>()
    };
    let mut rows = vec![
        row(
            "two holders at once (Redis's answers)",
            &|v| match v.two_holders {
                Some(b) => yes_no(b),
                None => "unknown".yellow().to_string(),
            },
        ),
        row("A's stale write (store)", &stale),
        row("last accepted writer (store)", &|v| {
            v.final_writer.clone().unwrap_or("nobody".into())
        }),
        row("final value (store)", &|v| {
            v.final_value
                .clone()
                .map(|s| format!("'{s}'"))
                .unwrap_or("none".into())
        }),
        row("highest token accepted (store)", &|v| {
            v.final_token
                .map(|t| t.to_string())
                .unwrap_or("none".into())
        }),
        row("attempts in decision order", &|v| {
            crate::store::Attempt::words(&v.attempts)
        }),
    ];
    if verdicts.iter().any(|v| v.token_restart) {
        rows.insert(
            2,
            row("B's write (store)", &|v| match v.b_write_accepted {
                Some(true) => "accepted".to_string(),
                Some(false) => "REFUSED".red().bold().to_string(),
                None => "none".to_string(),
            }),
        );
    }
    let mut words = Words::titled_table("Verdict", &header, rows);
    for verdict in verdicts {
        words.about(verdict.title(), verdict.meaning(ttl, pause));
    }
    words
}
