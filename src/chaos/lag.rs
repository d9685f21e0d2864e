//! A failover in one history, played from the stage (a `tick` of [`Stage::play_ticking`])
//! as lab 5 and the failover challenge play it: the replica lags, the primary dies, the
//! replica takes over.
//!
//! ```text
//!  at_ms               + duration_ms (the lag)          + the Sentinels' time
//!  ❄ replica frozen,   ✗ primary killed (SIGKILL),       ▶ replica promoted: how far
//!    its link cut        replica thawed                    behind it was, in bytes
//!  ───────────── the primary alone takes the writes ──▶ gone with it
//! ```
//!
//! Played beside the schedule's other steps, not among them: the stage keeps taking the
//! clients' events all through the lag and the promotion. Its three faults — the lag (a
//! pause of the replica that cuts its link), the primary's kill (a restart's start: the
//! Sentinels bring the replica in its place) and the replica's thaw — are each done by
//! the nemesis's player as they come; the promotion, when the servers say so, ends it.

use std::cell::Cell;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::failover::{self, Primary, REDIS_REPLICA, Replica, SentinelRing};
use crate::events::facts::FaultFacts;
use crate::labs::faults::{Cue, Faults};
use crate::labs::{Feed, Stage};
use crate::nemesis::generate::{FaultKind, REDIS_PRIMARY};
use crate::nemesis::schedule::{How, Schedule, Step};
use crate::nemesis::{Fault, Nemesis, Note, Victim, restarted_event};

/// The schedule's other steps, and its failover (a restart of `redis-primary`).
pub fn split(schedule: &Schedule) -> (Schedule, Schedule) {
    let (failover, rest): (Vec<Step>, Vec<Step>) = (schedule.steps().iter().cloned())
        .partition(|step| FaultKind::of(step) == Some(FaultKind::Failover));
    (Schedule::new(rest), Schedule::new(failover))
}

/// Checks a given schedule's failovers (`--schedule`): a lag (`duration_ms`) under the
/// Sentinels' down-after. Returns the schedule for the usual checks, its failovers' lags
/// left out (only a pause has a duration there).
pub fn validate(schedule: &Schedule) -> Result<Schedule> {
    let (rest, failover) = split(schedule);
    let longest = failover::LONGEST_LAG.as_millis() as u64;
    if let Some(ms) =
        (failover.steps().iter()).find_map(|s| s.duration_ms.filter(|ms| *ms > longest))
    {
        bail!(
            "a failover's replica lags {ms} ms: at most {longest} ms, under the Sentinels' \
             down-after ({} ms) — they call a replica silent that long down, and pass over \
             a replica they hold down when they promote one",
            failover::DOWN_AFTER.as_millis()
        );
    }
    let no_lag = (failover.steps().iter()).map(|step| Step {
        duration_ms: None,
        ..step.clone()
    });
    Ok(Schedule::new(
        rest.steps().iter().cloned().chain(no_lag).collect(),
    ))
}

/// The longest lag of a schedule's failover steps (0: none, or its replica in sync).
pub fn lag_ms(failover: &Schedule) -> u64 {
    let lags = failover.steps().iter().filter_map(|step| step.duration_ms);
    lags.max().unwrap_or(0)
}

/// Where the failover under way is.
enum UnderWay {
    /// The replica frozen and cut off; the primary dies at `kill_at`.
    Lagging { kill_at: Instant, lag_ms: u64 },
    /// The primary killed `at`, having written `written` bytes of its stream.
    Promoting {
        at: Instant,
        written: Option<u64>,
        asked: Option<Instant>,
    },
}

/// The failover steps of one history (a schedule holds one at most).
pub struct LagPlay<'a> {
    ring: Option<&'a SentinelRing>,
    steps: Vec<Step>,
    feed: Feed,
    under_way: Option<UnderWay>,
    /// True while a failover is under way: the play must not end before it does.
    busy: &'a Cell<bool>,
    skipped: Vec<(usize, String)>,
    /// The nemesis's player, which does each fault of a failover as it comes.
    faults: Faults<'a>,
    nemesis: Nemesis,
}

impl<'a> LagPlay<'a> {
    pub fn new(
        failover: &Schedule,
        ring: Option<&'a SentinelRing>,
        busy: &'a Cell<bool>,
        stage: &Stage,
    ) -> LagPlay<'a> {
        LagPlay {
            ring,
            steps: failover.steps().to_vec(),
            feed: Feed::new(failover, stage),
            under_way: None,
            busy,
            skipped: Vec::new(),
            faults: match ring {
                Some(ring) => Faults::new(&Schedule::default(), stage)
                    .on_replica(REDIS_REPLICA, move || ring.primary_url()),
                None => Faults::new(&Schedule::default(), stage),
            },
            nemesis: Nemesis::new(),
        }
    }

    /// Has the player do `fault` to `target` now, done as `how` says, in `words`.
    fn play_now(
        &mut self,
        stage: &mut Stage,
        ring: &'a SentinelRing,
        (fault, target, how): (Fault, &str, How),
        words: impl FnOnce(&Cue) -> Note + 'a,
    ) -> Result<()> {
        self.faults.now_done_so(stage, (fault, target, how), words);
        let (mut replica, mut primary) = (Replica(ring), Primary(ring));
        let cast: &mut [&mut dyn Victim] = &mut [&mut replica, &mut primary];
        let skipped = self.faults.skipped().len();
        while let Some(due) = self.faults.next_due() {
            self.faults.act(due, stage, &mut self.nemesis, cast)?;
        }
        // A failover's node gone (not running) ends the history: nothing would fail over.
        if let Some((_, why)) = self.faults.skipped().get(skipped) {
            bail!("the failover could not {} {target}: {why}", fault.as_str());
        }
        Ok(())
    }

    /// Shows the player what the stage logged, starts a failover that falls due and moves
    /// the one under way on.
    pub fn tick(&mut self, stage: &mut Stage) -> Result<()> {
        if self.steps.is_empty() {
            return Ok(());
        }
        let (due, _) = self.feed.due(stage, |_| {});
        for action in due {
            let Some(index) = action.step else { continue };
            let lag_ms = self.steps[index].duration_ms.unwrap_or(0);
            match (self.ring, &self.under_way) {
                (None, _) => {
                    let why = format!("this run has no {REDIS_PRIMARY} under Sentinel");
                    self.skipped.push((index, why));
                }
                (Some(_), Some(_)) => {
                    let why = "another failover was under way".to_string();
                    self.skipped.push((index, why));
                }
                (Some(ring), None) => {
                    if lag_ms > 0 {
                        ring.see_unasked();
                        let port = ring.ports().1;
                        let lag = How {
                            cut_link: true,
                            ..How::default()
                        };
                        let words = move |cue: &Cue| {
                            let words = failover::lag_words(port, cue.links_closed, lag_ms);
                            Note::new(words, failover::on_port(port))
                        };
                        self.play_now(stage, ring, (Fault::Pause, REDIS_REPLICA, lag), words)?;
                    }
                    let kill_at = Instant::now() + Duration::from_millis(lag_ms);
                    self.under_way = Some(UnderWay::Lagging { kill_at, lag_ms });
                    self.busy.set(true);
                }
            }
        }
        let Some(ring) = self.ring else {
            return Ok(());
        };
        match self.under_way {
            Some(UnderWay::Lagging { kill_at, lag_ms }) if Instant::now() >= kill_at => {
                let written = ring.written_before_kill(lag_ms);
                let (primary, replica) = ring.ports();
                let kill = Note::new(failover::kill_words(lag_ms), failover::on_port(primary));
                let crash = (Fault::Restart, REDIS_PRIMARY, How::default());
                self.play_now(stage, ring, crash, move |_| kill)?;
                if lag_ms > 0 {
                    let thaw = Note::new(failover::thaw_words(replica), failover::on_port(replica));
                    let resume = (Fault::Resume, REDIS_REPLICA, How::default());
                    self.play_now(stage, ring, resume, move |_| thaw)?;
                }
                self.under_way = Some(UnderWay::Promoting {
                    at: Instant::now(),
                    written,
                    asked: None,
                });
            }
            Some(UnderWay::Promoting {
                at,
                written,
                ref mut asked,
            }) => {
                // The Sentinels and the replica asked every 20ms, not at every tick.
                if asked.is_some_and(|asked| asked.elapsed() < Duration::from_millis(20)) {
                    return Ok(());
                }
                *asked = Some(Instant::now());
                if let Some(behind) = ring.took_over(written) {
                    let took = at.elapsed();
                    let words = failover::promoted_words(took, behind);
                    let note = Note::new(words, FaultFacts::default());
                    let pid = ring.primary_pid().unwrap_or_default();
                    stage.record(restarted_event(REDIS_PRIMARY, pid, took, note));
                    self.under_way = None;
                    self.busy.set(false);
                } else if at.elapsed() > failover::WITHIN {
                    bail!(
                        "the Sentinels did not promote the replica within {}s of the \
                         primary's kill (a busy machine? run again)",
                        failover::WITHIN.as_secs()
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// After the clients are done: the steps that never played, and why.
    pub fn finish(self) -> Vec<(Step, String)> {
        self.feed.unplayed(&self.steps, self.skipped)
    }
}
