//! Lab 8's verdict: what each run shows, decided by [`crate::check::network`] from Redis's
//! answers, the proxy's record and the store's, and the table and sentences that say it.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::check::LateWrite;
use crate::check::network::{
    self as checks, CutTiming, Evidence, FencedRetryFound, LATE, NEXT, PaymentFound, ReplyFound,
};
use crate::check::report::{self, Report};
use crate::events::facts::Fault;
use crate::events::{Event, Kind, What};
use crate::labs::Conclusion;
use crate::labs::replay::{self, Replayed};
use crate::labs::runner;
use crate::labs::words::Words;
use crate::lock::redis::Release;
use crate::output::human;
use crate::store::{Attempt, ReadBack};
use crate::worker::holder::release_of;

/// Every run of the lab.
pub struct Verdict {
    pub runs: Vec<RunVerdict>,
    /// The lost reply: one `SET NX PX` per client policy, and one `COMMIT` without and
    /// with an idempotency key.
    pub lost_set: Vec<ReplyFound>,
    pub lost_commit: Vec<PaymentFound>,
    /// The fenced write whose answer was lost, retried with the same token.
    pub lost_fenced_retry: Option<FencedRetryFound>,
    /// The lost answer to etcd's lock call: one per retry policy, and the queued call.
    pub lost_lock: Vec<ReplyFound>,
    pub lost_lock_queued: Option<checks::QueuedFound>,
    pub ttl: Duration,
}

impl runner::Verdict for Verdict {
    /// Each run's late write as the store decided it, then what each lost answer left:
    /// `delayed-write fenced: stale write refused · lost SET same-owner: A knows`.
    fn headline(&self) -> String {
        let mut parts: Vec<String> = self
            .runs
            .iter()
            .map(|run| {
                let fencing = if run.fencing { "fenced" } else { "unfenced" };
                let late = crate::room::late_write_word(run.late_write);
                format!("{} {fencing}: {late}", run.scenario)
            })
            .collect();
        let lost = |what: &str, found: &ReplyFound| {
            let outcome = if found.orphaned {
                "lock orphaned until it expired"
            } else if found.a_knows {
                "A knows whose lock it is"
            } else {
                "A mistaken about the lock"
            };
            format!("{what} {}: {outcome}", found.policy.as_str())
        };
        parts.extend(self.lost_set.iter().map(|f| lost("lost SET", f)));
        parts.extend(self.lost_commit.iter().map(|found| {
            let key = if found.idempotency_key {
                "with key"
            } else {
                "no key"
            };
            let paid = if found.doubled {
                "paid twice"
            } else {
                "paid once"
            };
            format!("lost COMMIT {key}: {paid}")
        }));
        if let Some(found) = &self.lost_fenced_retry {
            let done = if found.doubled {
                "done twice"
            } else {
                "done once"
            };
            parts.push(format!("lost fenced COMMIT: {done}"));
        }
        parts.extend(self.lost_lock.iter().map(|f| lost("lost etcd lock", f)));
        parts.join(" · ")
    }

    fn fields(&self) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("ttl_ms".into(), (self.ttl.as_millis() as u64).into());
        fields.insert(
            "runs".into(),
            serde_json::to_value(&self.runs).unwrap_or_default(),
        );
        if !self.lost_set.is_empty() {
            fields.insert(
                "lost_set".into(),
                serde_json::to_value(&self.lost_set).unwrap_or_default(),
            );
            fields.insert(
                "lost_commit".into(),
                serde_json::to_value(&self.lost_commit).unwrap_or_default(),
            );
            fields.insert(
                "lost_fenced_retry".into(),
                serde_json::to_value(&self.lost_fenced_retry).unwrap_or_default(),
            );
            fields.insert(
                "lost_lock".into(),
                serde_json::to_value(&self.lost_lock).unwrap_or_default(),
            );
            fields.insert(
                "lost_lock_queued".into(),
                serde_json::to_value(&self.lost_lock_queued).unwrap_or_default(),
            );
        }
        fields
    }

    fn words(&self) -> Words {
        let mut words = Words::new();
        say_verdicts(&mut words, &self.runs);
        let lost = !self.lost_set.is_empty() || !self.lost_commit.is_empty();
        if !self.runs.is_empty() && (lost || !self.lost_lock.is_empty()) {
            words.stop(&crate::labs::step::network::VERDICT_LOST_REPLIES);
        }
        super::lost_reply::say(&mut words, &self.lost_set, &self.lost_commit);
        if let Some(found) = &self.lost_fenced_retry {
            super::lost_fenced::say(&mut words, found);
        }
        let queued = self.lost_lock_queued.as_ref();
        super::lost_lock_words::say(&mut words, &self.lost_lock, queued);
        words
    }

    fn checkpoint(&self) -> Option<&'static crate::labs::step::Checkpoint> {
        Some(&crate::labs::step::network::VERDICT)
    }
}

/// What the servers and the proxy said in one run, as its history reports it.
#[derive(Clone, Debug, Default)]
pub struct Heard {
    /// A's check before writing: still its own, and the PTTL Redis answered.
    pub a_check: Option<(bool, i64)>,
    /// How long the fault on A's path lasted (the hold of its write, or the cut), and
    /// whether A's process ran meanwhile.
    pub held_ms: Option<u64>,
    pub a_process_ran: Option<bool>,
    /// A freeze or kill of A in the history.
    pub a_struck: bool,
    pub a_release: Option<Release>,
    pub b_owner: Option<String>,
    pub b_release: Option<Release>,
    /// The cut's timing: A's first failed renewal, its give-up, the key gone, B's grant,
    /// A's write answered.
    pub cut: checks::CutTiming,
    /// The holder that stops: when A asked its heartbeat and sent its write, and when and
    /// what it heard asking again before a second write.
    pub a_sent_ms: Option<u64>,
    pub a_asked_again: Option<(u64, bool)>,
}

/// Reads one run's history for the checkers.
pub fn heard(log: &[Event]) -> Result<Heard> {
    let saw = |worker: &str, kind: Kind| log.iter().find(|e| e.is(worker, kind));
    let healed = |path: &str| {
        log.iter().find_map(|e| match &e.what {
            What::NetHealed(facts)
                if facts.target.as_deref().is_some_and(|t| t.starts_with(path)) =>
            {
                Some(facts)
            }
            _ => None,
        })
    };
    // A's path to the store (the delayed write, the held write of the holder that stops),
    // or else to its lock's server (the cut).
    let heal = healed("A→store").or_else(|| healed("A→"));
    let asks: Vec<(u64, bool)> = log
        .iter()
        .filter(|e| e.worker == "A")
        .filter_map(|e| match &e.what {
            What::Checked(c) => Some((e.t_ms, c.heartbeat_lost?)),
            _ => None,
        })
        .collect();
    let a_struck = log.iter().any(|e| match &e.what {
        What::Frozen(f) | What::Killed(f) => f.target.as_deref() == Some("A"),
        _ => false,
    }) || saw("A", Kind::Freezing).is_some();
    Ok(Heard {
        a_check: saw("A", Kind::Checked).and_then(|e| match &e.what {
            What::Checked(c) => Some((c.still_ours?, c.pttl_ms?)),
            _ => None,
        }),
        held_ms: heal.and_then(|f| f.lasted_ms),
        a_process_ran: heal.and_then(|f| f.process_ran),
        a_struck,
        a_release: saw("A", Kind::Released).and_then(release_of),
        b_owner: saw("B", Kind::Acquired)
            .and_then(|e| e.owner())
            .map(String::from),
        b_release: saw("B", Kind::Released).and_then(release_of),
        cut: cut_timing(log),
        a_sent_ms: asks.first().and_then(|&(t, lost)| (!lost).then_some(t)),
        a_asked_again: asks.get(1).copied(),
    })
}

/// A cut's timing read off the run's history (see [`CutTiming`]): the first of each.
pub fn cut_timing(log: &[Event]) -> CutTiming {
    let first = |worker: &str, kind: Kind| log.iter().find(|e| e.is(worker, kind)).map(|e| e.t_ms);
    CutTiming {
        renewal_failed_ms: first(LATE, Kind::RenewalFailed),
        gave_up_ms: first(LATE, Kind::Lost),
        expired_ms: first("redis", Kind::Expired).or_else(|| first("etcd", Kind::Expired)),
        b_granted_ms: first(NEXT, Kind::Acquired),
        a_wrote_ms: first(LATE, Kind::Wrote),
    }
}

/// The stories whose runs are judged from a holder, a waiter and the store.
pub const RUN_SCENARIOS: [&str; 4] = ["delayed-write", "cut-off", "cut-off-stops", "cut-off-etcd"];

impl RunVerdict {
    /// Judges one run from its history: the servers' and the proxy's answers, and the
    /// store's read-back in it. The live run and `lockslab check` both judge this way.
    pub fn from_history(scenario: &'static str, fenced: bool, log: &[Event]) -> Result<RunVerdict> {
        RunVerdict::judge(scenario, fenced, &heard(log)?, replay::read_back(log)?)
    }
}

/// `lockslab check`: each run of the delayed write and the cuts judged again from its own
/// events (picked by its story and fencing tags).
pub fn replay(events: &[Event], verdict: &Value) -> Result<Replayed> {
    let mut replayed = Replayed::default();
    for run in replay::list(verdict, "runs")? {
        let named = replay::text(run, "scenario")?;
        let scenario = RUN_SCENARIOS
            .into_iter()
            .find(|s| *s == named)
            .with_context(|| format!("an unknown story: {named}"))?;
        let fenced = replay::flag(run, "fencing")?;
        let log = replay::part_of(events, |e| {
            e.part.scenario.as_deref() == Some(scenario) && e.part.fencing == Some(fenced)
        });
        let log = replayed.with_read_back(log, run, None)?;
        let found = RunVerdict::from_history(scenario, fenced, &log)?;
        replayed.part(format!("{scenario} ({})", found.title()), run, &found);
    }
    if verdict.get("lost_set").is_some() {
        replayed.not_replayed.push(
            "the lost replies (`lost_set`, `lost_commit`, `lost_lock`): they rest on \
            read-backs of the key's holder the history does not carry yet"
                .into(),
        );
    }
    Ok(replayed)
}

/// Lab 8's checker: the whole history, every run of the delayed write and the cuts in it,
/// judged as one [`Report`].
///
/// Each run (its events picked by their story and fencing tags, as [`replay`] picks them)
/// is judged by [`RunVerdict::from_history`], the function the live run judges with, and
/// gives two findings, three for the holder that stops:
///
/// - **mutual exclusion**: did the lock server grant B the lock while A still believed it
///   held it? Proved by A's release (it found its key gone or B's), B's grant, and the
///   store deciding A's write after B's;
/// - **stale write**: did the store take A's write once B had written? Proved by the
///   store's read-back (its decision order) and the two writes;
/// - **next write stopped** (`cut-off-stops`): A, told by its heartbeat that the lock was
///   given up, sent no second write. Proved by A's asks and the read-back.
///
/// A run whose history lacks its read-back is unknown, with the reason, never a pass. The
/// lost replies rest on read-backs of the key's holder the history does not carry: one
/// unknown finding says so. Each finding's events are positions in `history`.
pub fn check(history: &[Event]) -> Report {
    let mut runs: Vec<(&'static str, bool)> = Vec::new();
    for event in history {
        let scenario = event.part.scenario.as_deref();
        if let (Some(scenario), Some(fenced)) = (
            RUN_SCENARIOS.into_iter().find(|s| Some(*s) == scenario),
            event.part.fencing,
        ) && !runs.contains(&(scenario, fenced))
        {
            runs.push((scenario, fenced));
        }
    }
    let mut report = Report::compose(runs.into_iter().map(|(scenario, fenced)| {
        let (positions, log) = replay::part_with_positions(history, |e| {
            e.part.scenario.as_deref() == Some(scenario) && e.part.fencing == Some(fenced)
        });
        check_run(scenario, fenced, &log)
            .placed(&positions)
            .about(&format!("{scenario}, fencing={fenced}"))
    }));
    let lost_replies = history.iter().any(|e| {
        e.part
            .scenario
            .as_deref()
            .is_some_and(|s| s.starts_with("lost-reply"))
    });
    if lost_replies {
        report.push(report::Finding::new(
            "lost replies",
            report::Outcome::Unknown,
            "the lost replies rest on read-backs of the key's holder the history does not \
             carry yet: not judged from it",
            [],
        ));
    }
    report
}

/// One run's findings; event positions are in `log`.
fn check_run(scenario: &'static str, fenced: bool, log: &[Event]) -> Report {
    let found = match RunVerdict::from_history(scenario, fenced, log) {
        Ok(found) => found,
        Err(why) => return Report::evidence_missing(format!("{why:#}")),
    };
    let at = |worker: &str, kind: Kind| log.iter().position(|e| e.is(worker, kind));
    let read_back_at = log.iter().rposition(|e| e.kind() == Kind::ReadBack);
    let (exclusion, exclusion_words) = match found.two_holders {
        Some(true) => (
            report::Outcome::Invalid,
            "the lock server granted B the lock while A still believed it held it: two \
             holders at once",
        ),
        Some(false) => (
            report::Outcome::Valid,
            "B was granted the lock only after A let go",
        ),
        None => (
            report::Outcome::Unknown,
            "the answers cannot order B's grant against A's release",
        ),
    };
    let (stale, stale_words) = match found.late_write {
        LateWrite::Accepted => (
            report::Outcome::Invalid,
            "the store decided A's write after B's and took it: B's result is lost",
        ),
        LateWrite::Rejected => (
            report::Outcome::Valid,
            "the store decided A's write after B's and refused its lower token",
        ),
        LateWrite::None => (
            report::Outcome::Valid,
            "the store decided A's write before B's: no stale write",
        ),
    };
    let writes = [at(LATE, Kind::Wrote), at(NEXT, Kind::Wrote), read_back_at];
    let mut report = Report::of([
        report::Finding::new(
            "mutual exclusion",
            exclusion,
            exclusion_words,
            [
                at(LATE, Kind::Released),
                at(NEXT, Kind::Acquired),
                read_back_at,
            ]
            .into_iter()
            .flatten(),
        ),
        report::Finding::new(
            "stale write",
            stale,
            stale_words,
            writes.into_iter().flatten(),
        )
        .about_event(
            // A's last write: the one the store decided after B's.
            log.iter()
                .rposition(|e| e.is(LATE, Kind::Wrote))
                .filter(|_| found.late_write.attempted()),
        ),
    ]);
    if scenario == "cut-off-stops" {
        let asks = (0..log.len()).filter(|&i| log[i].is(LATE, Kind::Checked));
        let (outcome, words) = match found.a_next_write_stopped {
            Some(true) => (
                report::Outcome::Valid,
                "told its heartbeat had given the lock up, A sent no second write",
            ),
            Some(false) => (
                report::Outcome::Invalid,
                "A sent a second write: its heartbeat had not given up when A asked",
            ),
            None => (
                report::Outcome::Unknown,
                "A did not ask its heartbeat again, or the store does not say",
            ),
        };
        report.push(report::Finding::new(
            "next write stopped",
            outcome,
            words,
            asks.chain(read_back_at),
        ));
    }
    report
}

/// The store's line on the timeline when A's write was decided after B's (the checker's
/// conclusion, said, not recorded).
pub fn store_line(verdict: &RunVerdict) -> Option<Conclusion> {
    let holds = verdict.final_writer.clone().unwrap_or("nobody".into());
    let (broken, text) = match verdict.late_write {
        LateWrite::Accepted => (
            true,
            format!(
                "decided A's late write after B's and took it: it holds {holds}'s result, B's is lost"
            ),
        ),
        LateWrite::Rejected => (
            false,
            format!(
                "decided A's late write after B's and refused its lower token: it holds {holds}'s result"
            ),
        ),
        LateWrite::None => return None,
    };
    Some(Conclusion {
        lane: "store",
        text,
        broken,
    })
}

/// The network faults of a history, for a reader who wants to check the hold was the only
/// one: (fault, path) in the order recorded.
pub fn net_faults(log: &[Event]) -> Vec<(Fault, String)> {
    log.iter()
        .filter_map(|e| match &e.what {
            What::NetFault(f) | What::NetHealed(f) => {
                Some((f.fault?, f.target.clone().unwrap_or_default()))
            }
            _ => None,
        })
        .collect()
}

/// What one run found; every field from Redis's answers, the proxy's record or the store's.
#[derive(Serialize, Debug, Clone)]
pub struct RunVerdict {
    /// `delayed-write`, `cut-off` (from Redis), `cut-off-stops` or `cut-off-etcd`.
    pub scenario: &'static str,
    pub fencing: bool,
    /// A checked just before writing: its owner value in the key, with PTTL left.
    pub a_checked_ours: Option<bool>,
    /// The PTTL Redis answered A's check.
    pub a_check_pttl_ms: Option<i64>,
    /// How long the hold on A's path to the store lasted (A's write, sent after its check,
    /// waited in it until the end).
    pub held_ms: Option<u64>,
    /// A was never paused (no freeze in the history; its process seen running throughout).
    pub a_never_paused: Option<bool>,
    /// The cut's timing on the lab's clock (ms; null where the scenario has none): A's
    /// first renewal failed, its heartbeat gave the lock up, the lab saw A's key gone from
    /// Redis, B's grant, A's write.
    pub a_renewal_failed_ms: Option<u64>,
    pub a_renewal_lost_ms: Option<u64>,
    pub a_key_expired_ms: Option<u64>,
    pub b_granted_ms: Option<u64>,
    pub a_wrote_ms: Option<u64>,
    /// The cuts: A's first renewal failed no later than its give-up and before B's grant.
    pub a_failed_first: Option<bool>,
    /// The holder that stops (`cut-off-stops`; null otherwise): when A, its heartbeat
    /// still holding the lock, sent its first write; when A asked again before a second
    /// write; and whether that second write was stopped (A's heartbeat had given up, and
    /// the store holds one write of A's).
    pub a_write_sent_ms: Option<u64>,
    pub a_asked_again_ms: Option<u64>,
    pub a_next_write_stopped: Option<bool>,
    /// Redis granted B the lock while A still believed it held it.
    pub two_holders: Option<bool>,
    /// A's write in the store's decision order relative to B's accepted write.
    pub late_write: LateWrite,
    pub final_value: Option<String>,
    pub final_writer: Option<String>,
    pub final_token: Option<i64>,
    /// Every write attempt, in the order the database decided them.
    pub attempts: Vec<Attempt>,
}

impl RunVerdict {
    pub fn judge(
        scenario: &'static str,
        fenced: bool,
        heard: &Heard,
        read: ReadBack,
    ) -> Result<RunVerdict> {
        let Ok(found) = checks::judge(&Evidence {
            a_check: heard.a_check,
            a_process_ran: heard.a_process_ran,
            a_struck: heard.a_struck,
            a_release: heard.a_release.as_ref(),
            b_owner: heard.b_owner.as_deref(),
            b_release: heard.b_release.as_ref(),
            attempts: &read.attempts,
            final_writer: read.final_writer.as_deref(),
            a_asked_again_lost: heard.a_asked_again.map(|(_, lost)| lost),
        }) else {
            bail!(
                "the store's record disagrees with itself: its final writer is {:?} but its last accepted attempt is not",
                read.final_writer
            );
        };
        let (cut, timing) = (scenario.starts_with("cut-off"), &heard.cut);
        Ok(RunVerdict {
            scenario,
            fencing: fenced,
            a_renewal_failed_ms: timing.renewal_failed_ms,
            a_renewal_lost_ms: timing.gave_up_ms,
            a_key_expired_ms: timing.expired_ms,
            b_granted_ms: cut.then_some(timing.b_granted_ms).flatten(),
            a_wrote_ms: cut.then_some(timing.a_wrote_ms).flatten(),
            a_failed_first: cut.then(|| timing.failed_first().as_option()).flatten(),
            a_write_sent_ms: heard.a_sent_ms,
            a_asked_again_ms: heard.a_asked_again.map(|(t, _)| t),
            a_next_write_stopped: found.a_next_write_stopped.as_option(),
            a_checked_ours: found.a_checked_ours.as_option(),
            a_check_pttl_ms: heard.a_check.map(|(_, pttl)| pttl),
            held_ms: heard.held_ms,
            a_never_paused: found.a_never_paused.as_option(),
            two_holders: found.two_holders.as_option(),
            late_write: found.late_write,
            final_value: read.final_value,
            final_writer: read.final_writer,
            final_token: read.final_token,
            attempts: read.attempts,
        })
    }

    fn title(&self) -> &'static str {
        if self.fencing {
            "with fencing"
        } else {
            "without fencing"
        }
    }

    fn token_of(&self, writer: &str) -> String {
        self.attempts
            .iter()
            .rev()
            .find(|a| a.writer == writer)
            .and_then(|a| a.token)
            .map_or("?".into(), |t| t.to_string())
    }

    /// What the run shows, in sentences drawn from the same fields as the table.
    fn meaning(&self) -> String {
        let at =
            |ms: Option<u64>| ms.map_or("?".into(), |ms| format!("+{:.3}s", ms as f64 / 1000.0));
        let story = if self.scenario == "cut-off" {
            format!(
                "Cut off from Redis, A's first renewal failed at {} and its heartbeat gave the lock up at {}; the lab saw A's key gone from Redis at {} and B was granted the lock at {}. A, which nothing told to stop, wrote at {}.",
                at(self.a_renewal_failed_ms),
                at(self.a_renewal_lost_ms),
                at(self.a_key_expired_ms),
                at(self.b_granted_ms),
                at(self.a_wrote_ms)
            )
        } else if self.scenario == "cut-off-stops" {
            let next = match self.a_next_write_stopped {
                Some(true) => format!(
                    "asked its heartbeat again at {} before a second write, heard it had given the lock up, and stopped: the store holds no second write of A's.",
                    at(self.a_asked_again_ms)
                ),
                Some(false) => {
                    "sent a second write as well: its heartbeat had not given up when A asked."
                        .to_string()
                }
                None => "did not ask its heartbeat again, or the store does not say.".to_string(),
            };
            format!(
                "A asked its heartbeat, which still held the lock, and sent its write at {} into a hold on its path to the store; then the cut. A's first renewal failed at {} and its heartbeat gave the lock up at {}; the lab saw A's key gone from Redis at {} and B was granted the lock at {}. The held write was answered at {}: stopping could not call it back. A then {next}",
                at(self.a_write_sent_ms),
                at(self.a_renewal_failed_ms),
                at(self.a_renewal_lost_ms),
                at(self.a_key_expired_ms),
                at(self.b_granted_ms),
                at(self.a_wrote_ms)
            )
        } else if self.scenario == "cut-off-etcd" {
            format!(
                "Cut off from etcd, A's first keepalive failed at {} and A gave the lease up at {}; the lab saw A's lock key gone from etcd (its lease expired) at {} and etcd granted B the lock at {}. A, which nothing told to stop, wrote at {}.",
                at(self.a_renewal_failed_ms),
                at(self.a_renewal_lost_ms),
                at(self.a_key_expired_ms),
                at(self.b_granted_ms),
                at(self.a_wrote_ms)
            )
        } else {
            match (self.a_checked_ours, self.a_check_pttl_ms, self.held_ms) {
                (Some(true), Some(pttl), Some(held)) => format!(
                    "A checked its lock just before writing ({pttl}ms left) and sent its write into a hold on its path to the store that lasted {}.",
                    human(Duration::from_millis(held))
                ),
                _ => "A's check or the hold was not recorded.".to_string(),
            }
        };
        let paused = match self.a_never_paused {
            Some(true) => " A was never paused: its process ran throughout.",
            Some(false) => {
                " A was paused at some point, so this run does not show a pause-free stale write."
            }
            None => "",
        };
        let store = match self.late_write {
            LateWrite::Accepted => {
                "The store decided A's write after B's and took it: B's result is lost.".to_string()
            }
            LateWrite::Rejected => format!(
                "The store refused A's token {} when the write arrived, because it had accepted B's token {}: B's result stands.",
                self.token_of("A"),
                self.token_of("B")
            ),
            LateWrite::None => {
                "The store decided A's write before B's: no stale write this time.".to_string()
            }
        };
        format!("{story}{paused} {store}")
    }
}

/// One table per scenario, in the order they ran.
/// Each story's table and sentences, in the order the stories were played.
fn say_verdicts(words: &mut Words, verdicts: &[RunVerdict]) {
    let mut scenarios: Vec<&str> = verdicts.iter().map(|v| v.scenario).collect();
    scenarios.dedup();
    for scenario in scenarios {
        let runs: Vec<&RunVerdict> = verdicts.iter().filter(|v| v.scenario == scenario).collect();
        say_scenario(words, scenario, &runs);
    }
}

fn say_scenario(words: &mut Words, scenario: &str, verdicts: &[&RunVerdict]) {
    let yes_no = |b: Option<bool>| match b {
        Some(true) => "yes".to_string(),
        Some(false) => "no".to_string(),
        None => "unknown".yellow().to_string(),
    };
    let at = |ms: Option<u64>| ms.map_or("-".into(), |ms| format!("+{:.3}s", ms as f64 / 1000.0));
    let header: Vec<&str> = std::iter::once("evidence")
        .chain(verdicts.iter().map(|v| v.title()))
        .collect();
    let row = |name: &str, cell: &dyn Fn(&RunVerdict) -> String| {
        std::iter::once(name.to_string())
            .chain(verdicts.iter().map(|v| cell(v)))
            .collect::<Vec<_>>()
    };
    let mut rows = if scenario.starts_with("cut-off") {
        let (etcd, stops) = (scenario == "cut-off-etcd", scenario == "cut-off-stops");
        let pick = |etcd_word, redis_word| if etcd { etcd_word } else { redis_word };
        let (beat, server) = (pick("keepalive", "heartbeat"), pick("etcd", "Redis"));
        let gone = pick("A's lease expired, key gone (etcd)", "A's key gone (Redis)");
        let failed = format!("A's first {} failed (A)", pick("keepalive", "renewal"));
        let wrote = match stops {
            true => "A's held write answered (store)",
            false => "A wrote (store's answer)",
        };
        let mut rows = Vec::new();
        if stops {
            rows.push(row(
                "A sent its write, held (A)",
                &|v| at(v.a_write_sent_ms),
            ));
        }
        rows.extend([
            row(&failed, &|v| at(v.a_renewal_failed_ms)),
            row(&format!("A's {beat} gave up (A)"), &|v| {
                at(v.a_renewal_lost_ms)
            }),
            row(gone, &|v| at(v.a_key_expired_ms)),
            row(&format!("B granted ({server})"), &|v| at(v.b_granted_ms)),
            row(wrote, &|v| at(v.a_wrote_ms)),
        ]);
        if stops {
            let stopped = |v: &RunVerdict| yes_no(v.a_next_write_stopped);
            rows.push(row("A's second write stopped (store)", &stopped));
        }
        rows
    } else {
        vec![
            row("A checked its lock before writing", &|v| match (
                v.a_checked_ours,
                v.a_check_pttl_ms,
            ) {
                (Some(true), Some(pttl)) => format!("ours, PTTL {pttl}ms"),
                (ours, _) => yes_no(ours),
            }),
            row("hold on A→store (proxy)", &|v| {
                v.held_ms
                    .map_or("none".into(), |ms| human(Duration::from_millis(ms)))
            }),
        ]
    };
    rows.extend([
        row("A never paused (/proc, history)", &|v| {
            yes_no(v.a_never_paused)
        }),
        row("A still acting at B's grant", &|v| yes_no(v.two_holders)),
        row("A's late write (store)", &|v| match v.late_write {
            LateWrite::Accepted => "ACCEPTED after B's".red().bold().to_string(),
            LateWrite::Rejected => "refused after B's".green().bold().to_string(),
            LateWrite::None => "none".to_string(),
        }),
        row("last accepted writer (store)", &|v| {
            v.final_writer.clone().unwrap_or("nobody".into())
        }),
        row("attempts in decision order", &|v| {
            Attempt::words(&v.attempts)
        }),
    ]);
    let title = if scenario == "cut-off" {
        "Verdict: cut off from Redis"
    } else if scenario == "cut-off-stops" {
        "Verdict: cut off from Redis, a holder that stops"
    } else if scenario == "cut-off-etcd" {
        "Verdict: cut off from etcd"
    } else {
        "Verdict: the delayed write"
    };
    words.blank().heading(title).table(&header, rows).blank();
    for verdict in verdicts {
        words.about(verdict.title(), verdict.meaning());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Finding;
    use crate::events::facts::{self, Expired};

    fn at(t_ms: u64, worker: &str, what: impl Into<crate::events::What>) -> Event {
        Event {
            t_ms,
            ..Event::new(worker, what, "")
        }
    }

    fn failed(t_ms: u64) -> Event {
        let facts = facts::RenewalFailed {
            error: facts::RenewalError::Cut,
            why: "Connection reset by peer".into(),
        };
        at(t_ms, "A", facts)
    }

    #[test]
    fn a_cut_is_timed_from_the_first_failed_renewal() {
        let log = [
            failed(1_200),
            failed(1_300),
            at(1_900, "A", facts::Lost::because("no renewal")),
            at(2_000, "redis", Expired::default()),
            at(2_050, "B", facts::Acquired::default()),
        ];
        let timing = cut_timing(&log);
        assert_eq!(
            timing.renewal_failed_ms,
            Some(1_200),
            "the first, not a retry"
        );
        assert_eq!(timing.gave_up_ms, Some(1_900));
        assert_eq!(timing.expired_ms, Some(2_000));
        assert_eq!(timing.b_granted_ms, Some(2_050));
        assert_eq!(timing.failed_first(), Finding::Yes);
        assert_eq!(cut_timing(&[]).failed_first(), Finding::Unknown);
    }
}
