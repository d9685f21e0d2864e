//! The stage every lab plays on: it spawns worker processes, collects their events on one
//! clock, shows them on the timeline, and hands the nemesis its victims.

use std::collections::HashSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};

use super::{step, worker_failed};
use crate::events::facts::{Part, StoreRecord, Warning};
use crate::events::{self, Event, Incoming, Kind, What};
use crate::nemesis::schedule::Schedule;
use crate::output::{Style, Timeline};
use crate::procs::{self, StopPlan};
use crate::watchdog::{OWN_PAUSE_COUNT, at_ms, own_pauses, watch_own_pauses};
use crate::worker::WorkerSpec;

mod handle;
pub use handle::WorkerHandle;

/// The orchestrator's side of a lab run: workers, their events, the timeline.
pub struct Stage {
    start: Instant,
    tx: Sender<Incoming>,
    rx: Receiver<Incoming>,
    pub timeline: Timeline,
    /// Every event shown so far, in order: what verdicts and tests look at.
    pub log: Vec<Event>,
    /// The workers whose event stream has ended, by pid (names repeat across a lab's modes).
    closed: HashSet<i32>,
    /// While `run_until` holds back an event: its stamp, the latest a lab event may carry.
    observed_before: Option<u64>,
    /// The workers started on this stage: (name, pid), in order.
    spawned: Vec<(String, i32)>,
    /// Facts added to every event from here on (which run of a lab it belongs to).
    tags: Part,
    /// How many of the lab's own pauses are on this stage's timeline already.
    pauses_shown: usize,
    /// The run's history, when a runner keeps one.
    history: Option<History>,
    /// Shows nothing on the timeline (chaos plays many histories and prints few).
    quiet: bool,
    /// Worker events taken off the channel before the lab asked for them, because a lab
    /// event was recorded while they waited there: still to be handed to the lab.
    early: std::collections::VecDeque<Early>,
    /// The lab is summing its workers' events up (`next_silent`), not showing them.
    silent: bool,
    /// In `run_until`'s `tick`: what it records is stamped no later than what has arrived.
    ticking: bool,
    /// Each queue key a waiter took (key, waiter), to name it in the lines that mention it.
    queue_keys: Vec<(String, String)>,
}

/// A line the lab states on the timeline from its checker's conclusion — the store took a
/// stale write, or refused it; two majorities at once — for the learner watching. Words,
/// not an event: the history keeps the observations it was concluded from (the store's
/// read-back, the masters' answers), and `lockslab check` concludes it again from those.
pub struct Conclusion {
    /// The lane it is said on (`store`, `masters`).
    pub lane: &'static str,
    pub text: String,
    /// A safety property broken (red), or a defence that held (green).
    pub broken: bool,
}

/// A worker event that arrived before a lab event was recorded.
enum Early {
    /// Shown and logged before the lab event (it was said before it).
    Shown(Box<Event>),
    /// Held back while a `tick` recorded what it saw; shown once the tick is over.
    Held(Incoming),
}

/// A run's typed history: every event its stages showed, in order, for the pictures drawn
/// once the lab has its verdict — and every schedule its stages played, for `--json`.
/// Shared by the run's stages (a lab may play several).
#[derive(Clone, Debug, Default)]
pub struct History {
    events: std::sync::Arc<std::sync::Mutex<Vec<Event>>>,
    /// By play (its number), the schedule as it last stood.
    schedules: std::sync::Arc<std::sync::Mutex<Vec<(u64, Schedule)>>>,
}

impl History {
    fn push(&self, event: &Event) {
        if let Ok(mut events) = self.events.lock() {
            events.push(event.clone());
        }
    }

    /// The events so far, taken out.
    pub fn take(&self) -> Vec<Event> {
        self.events
            .lock()
            .map(|mut events| std::mem::take(&mut *events))
            .unwrap_or_default()
    }

    /// Moves `part`'s events and schedules to the end of this history: a lab that plays
    /// its parts side by side keeps each part's history apart, and appends them in order.
    pub fn append(&self, part: &History) {
        let events = part.take();
        if let Ok(mut all) = self.events.lock() {
            all.extend(events);
        }
        let schedules = part
            .schedules
            .lock()
            .map(|mut kept| std::mem::take(&mut *kept))
            .unwrap_or_default();
        for (play, schedule) in schedules {
            self.played(play, &schedule);
        }
    }

    /// Keeps the schedule of play `play` as it stands now (a play whose schedule grows as
    /// it plays says so again).
    fn played(&self, play: u64, schedule: &Schedule) {
        if let Ok(mut schedules) = self.schedules.lock() {
            match schedules.iter_mut().find(|(id, _)| *id == play) {
                Some((_, kept)) => *kept = schedule.clone(),
                None => schedules.push((play, schedule.clone())),
            }
        }
    }

    /// The distinct schedules the run played, in the order they were first played: a lab
    /// that plays the same faults in several runs (the broken one and its fix) played one.
    pub fn schedules(&self) -> Vec<Schedule> {
        let mut distinct: Vec<Schedule> = Vec::new();
        if let Ok(schedules) = self.schedules.lock() {
            for (_, schedule) in schedules.iter() {
                if !schedule.is_empty() && !distinct.contains(schedule) {
                    distinct.push(schedule.clone());
                }
            }
        }
        distinct
    }
}

impl Stage {
    /// Records every event this stage shows into the run's history as well.
    pub fn recorded_in(mut self, history: &History) -> Stage {
        self.history = Some(history.clone());
        self
    }

    pub fn new(style: Style) -> Stage {
        Stage::on_clock(style, Instant::now())
    }

    /// A stage whose events are stamped from `start`: the scenarios of one lab run share
    /// one clock, so their `t_ms` never restart at 0.
    pub fn on_clock(style: Style, start: Instant) -> Stage {
        watch_own_pauses(start);
        let (tx, rx) = mpsc::channel();
        Stage {
            start,
            tx,
            rx,
            timeline: Timeline::new(style),
            log: Vec::new(),
            closed: HashSet::new(),
            observed_before: None,
            tags: Part::default(),
            spawned: Vec::new(),
            pauses_shown: OWN_PAUSE_COUNT.load(std::sync::atomic::Ordering::Acquire),
            history: None,
            quiet: false,
            early: Default::default(),
            silent: false,
            ticking: false,
            queue_keys: Vec::new(),
        }
    }

    /// A stage that logs its events and shows none of them.
    pub fn quiet(mut self) -> Stage {
        self.quiet = true;
        self
    }

    /// Puts the lab's own pauses caught since the last look on the timeline, as warnings
    /// where they happened: what is measured across them is disturbed.
    fn notice_own_pauses(&mut self) {
        if OWN_PAUSE_COUNT.load(std::sync::atomic::Ordering::Acquire) == self.pauses_shown {
            return;
        }
        let pauses = own_pauses();
        for pause in pauses.iter().skip(self.pauses_shown) {
            let gap_ms = pause.gap.as_millis() as u64;
            let event = Event::new(
                "lab",
                Warning {
                    lab_paused_ms: Some(gap_ms),
                    at_ms: Some(at_ms(pause)),
                    ..Warning::default()
                },
                format!(
                    "lockslab itself was not running for {} (stopped or starved): times \
                     measured across this gap include it — they are disturbed",
                    crate::output::human(pause.gap)
                ),
            );
            self.pauses_shown += 1;
            self.record(event);
        }
        self.pauses_shown = pauses.len();
    }

    /// The run's time, less the waits at `--step`'s stops ([`crate::run_clock`]).
    pub fn elapsed(&self) -> Duration {
        crate::run_clock::since(self.start)
    }

    /// Starts a worker process: this binary, re-executed as `lockslab __worker`, with the
    /// worker's script as the first line on its stdin.
    ///
    /// Not in its argv: the script holds the servers' URLs, passwords included, and any user
    /// on the machine can read any process's command line (`ps`, `/proc/<pid>/cmdline`) — on
    /// a workshop's shared machine, every attendee would see every password. A pipe is
    /// readable by this process and the worker only.
    pub fn spawn(&mut self, name: &str, spec: &WorkerSpec) -> Result<WorkerHandle> {
        self.spawn_with_env(name, spec, &[])
    }

    /// [`Stage::spawn`], with more environment for the worker (lab 9's libfaketime clock).
    pub fn spawn_with_env(
        &mut self,
        name: &str,
        spec: &WorkerSpec,
        env: &[(String, String)],
    ) -> Result<WorkerHandle> {
        let exe =
            std::env::current_exe().context("finding the lockslab binary to start a worker")?;
        let mut script = serde_json::to_string(spec)?;
        script.push('\n');
        let mut command = Command::new(exe);
        if let Some(seed) = crate::seed::seed() {
            // Its own stream, named by its place among the run's workers: two processes
            // must never draw the same owner value (a lab reuses names from run to run).
            static SPAWNED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let nth = SPAWNED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            command.env(crate::seed::WORKER_SEED, format!("{seed}/{nth}:{name}"));
        }
        // A faked clock or a preloaded library in lockslab's own environment is not the
        // worker's to inherit: only what the lab gives it (lab 9's libfaketime for A).
        for inherited in [
            "LD_PRELOAD",
            "FAKETIME",
            "FAKETIME_TIMESTAMP_FILE",
            "FAKETIME_NO_CACHE",
            "FAKETIME_DONT_FAKE_MONOTONIC",
            "FAKETIME_SKIP_CMDS",
            "FAKETIME_ONLY_CMDS",
        ] {
            command.env_remove(inherited);
        }
        command.envs(env.iter().map(|(key, value)| (key, value)));
        command
            .arg("__worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = procs::spawn_registered(&mut command, StopPlan::kill())
            .with_context(|| format!("starting worker {name}"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("worker {name} has no stdout"))?;
        let pid = child.id() as i32;
        events::forward(name.to_string(), pid, stdout, self.start, self.tx.clone());
        self.spawned.push((name.to_string(), pid));
        let mut worker = WorkerHandle {
            name: name.to_string(),
            pid: child.id() as i32,
            stdin: child.stdin.take(),
            reaped: false,
            exited_by_itself: false,
        };
        // One line of JSON, far below a pipe's buffer: this never waits for the worker.
        worker
            .stdin
            .as_mut()
            .ok_or_else(|| anyhow!("worker {name} has no stdin"))?
            .write_all(script.as_bytes())
            .with_context(|| format!("giving worker {name} its script"))?;
        Ok(worker)
    }

    /// With `--step`: stops here, asks the room `at`'s question and waits for Enter (see
    /// [`step`]). Call it only where no timer of the story runs — never while a worker holds
    /// a lease or lies frozen — so that stepping cannot change what the lab measures.
    pub fn checkpoint(&self, at: &step::Checkpoint) {
        step::checkpoint(at);
    }

    /// The tags stamped on every event shown from now on, so that `--json` readers can tell
    /// the parts of one lab run apart (`"fencing": true`): `stage.tags().fencing = Some(true)`.
    pub fn tags(&mut self) -> &mut Part {
        &mut self.tags
    }

    /// The event with the stage's tags where it has none of its own, and the tags as one
    /// label (`part`: `scenario=race variant=broken`), which a picture draws as a band.
    fn with_tags(&self, mut event: Event) -> Event {
        if !self.tags.is_empty() {
            let label = self.tags.label();
            event.part = event.part.or(&self.tags);
            event.part.part = Some(label);
        }
        event
    }

    /// Records an event of the lab's own (a freeze, an expiry seen in Redis) on the timeline.
    ///
    /// Worker lines are stamped when they arrive, and a lab event must not show above one
    /// that arrived before it (`+0.131s lab ❄ SIGSTOP` above `+0.129s w2`, as if a frozen
    /// worker spoke). So the lines that have arrived are shown first (the lab still gets
    /// them from `next`) — except in a `tick`, which looks at the world before a line is
    /// shown so that an effect never shows above its cause: there they wait, and what the
    /// tick records is stamped no later than the first of them.
    pub fn record(&mut self, event: Event) {
        self.record_shown(event, true);
    }

    /// Says a conclusion the lab drew from its checker on the timeline, after the lines that
    /// arrived before it: words for the learner watching, not an event of the history
    /// (nothing with `--json`, whose verdict says it, nor in a quiet stage).
    pub fn conclude(&mut self, conclusion: Conclusion) {
        if !self.silent && !self.ticking {
            self.show_arrived();
        }
        if !self.quiet {
            let t_ms = self.start.elapsed().as_millis() as u64;
            let Conclusion { lane, text, broken } = conclusion;
            self.timeline.conclude(t_ms, lane, &text, broken);
        }
    }

    /// Records the store's read-back of `resource` in the run's history, where the part's
    /// verdict is judged from, so that `lockslab check` can judge it again from `--json`
    /// alone. A terminal does not show it on the timeline: the verdict's table says it.
    pub fn record_read_back(&mut self, resource: &str, read: &crate::store::ReadBack) {
        let record = StoreRecord::of(resource, read);
        let text = format!(
            "read back {resource}: {} in decision order; it holds {}'s write",
            if read.attempts.is_empty() {
                "no attempt".to_string()
            } else {
                crate::store::Attempt::words(&read.attempts)
            },
            read.final_writer.as_deref().unwrap_or("nobody")
        );
        self.record_shown(Event::new("store", record, text), false);
    }

    /// Records an event of the lab's own in the run's history (`--json`, the checkers, the
    /// picture) without a line on the terminal's timeline: one of many alike (a client's
    /// hundred writes), which the lines the lab does show sum up.
    pub fn record_off_terminal(&mut self, event: Event) {
        self.record_shown(event, false);
    }

    fn record_shown(&mut self, mut event: Event, on_terminal: bool) {
        if !matches!(&event.what, What::Warning(w) if w.lab_paused_ms.is_some()) {
            self.notice_own_pauses();
        }
        let mut bound = self.observed_before;
        if self.ticking {
            let arrived: Vec<Early> = self.rx.try_iter().map(Early::Held).collect();
            self.early.extend(arrived);
            let first_held = self
                .early
                .iter()
                .filter_map(|early| match early {
                    Early::Held(Incoming::Event(event)) => Some(event.t_ms),
                    _ => None,
                })
                .min();
            bound = bound.into_iter().chain(first_held).min();
        } else if !self.silent {
            self.show_arrived();
        }
        let now = self.elapsed().as_millis() as u64;
        event.t_ms = bound.map_or(now, |bound| now.min(bound));
        let event = self.with_tags(event);
        if on_terminal || self.timeline.style.json {
            self.show(&event);
        } else if let Some(history) = &self.history {
            history.push(&event);
        }
        self.log.push(event);
    }

    /// Shows and logs, in the order they were stamped, the worker events that have arrived
    /// and not been shown yet; `next` hands them to the lab later.
    fn show_arrived(&mut self) {
        let mut shown = std::collections::VecDeque::new();
        let mut arrived = Vec::new();
        for waiting in std::mem::take(&mut self.early) {
            match waiting {
                Early::Shown(event) => shown.push_back(Early::Shown(event)),
                Early::Held(incoming) => arrived.push(incoming),
            }
        }
        arrived.extend(self.rx.try_iter());
        arrived.sort_by_key(|incoming| match incoming {
            Incoming::Event(event) => event.t_ms,
            Incoming::Closed { .. } => u64::MAX,
        });
        for incoming in arrived {
            if let Some(event) = self.accept(incoming) {
                shown.push_back(Early::Shown(Box::new(event)));
            }
        }
        self.early = shown;
    }

    /// Takes the next worker event, waiting at most `timeout`; shows and logs it.
    pub fn next(&mut self, timeout: Duration) -> Option<Event> {
        self.silent = false;
        self.notice_own_pauses();
        let incoming = match self.early.pop_front() {
            Some(Early::Shown(event)) => return Some(*event),
            Some(Early::Held(incoming)) => incoming,
            None => self.rx.recv_timeout(timeout).ok()?,
        };
        self.accept(incoming)
    }

    /// Shows an event on the timeline and keeps it in the run's history.
    fn show(&mut self, event: &Event) {
        if let What::Queued(queued) = &event.what
            && let Some(key) = &queued.key
        {
            self.queue_keys.push((key.clone(), event.worker.clone()));
        }
        if !self.quiet {
            self.timeline.show(&self.keys_named(event));
        }
        if let Some(history) = &self.history {
            history.push(event);
        }
    }

    /// The event as the terminal shows it: a queue key another waiter's line mentions
    /// (`woken: lockslab:…:churn/3bc2a2339227 is gone`) named after its waiter (`W2's
    /// key`). The log, the history and `--json` keep the keys.
    fn keys_named(&self, event: &Event) -> Event {
        let mut shown = event.clone();
        if self.timeline.style.json || matches!(event.what, What::Queued(_)) {
            return shown;
        }
        for (key, waiter) in &self.queue_keys {
            if shown.text.contains(key.as_str()) {
                shown.text = shown.text.replace(key.as_str(), &format!("{waiter}'s key"));
            }
        }
        shown
    }

    fn accept(&mut self, incoming: Incoming) -> Option<Event> {
        match incoming {
            Incoming::Event(event) => {
                let event = self.with_tags(*event);
                self.show(&event);
                self.log.push(event.clone());
                Some(event)
            }
            Incoming::Closed { pid, .. } => {
                self.closed.insert(pid);
                None
            }
        }
    }

    /// Takes the next worker event without showing or logging it, waiting at most `timeout`:
    /// for labs whose workers report hundreds of trials, which the lab sums up instead.
    pub fn next_silent(&mut self, timeout: Duration) -> Option<Event> {
        self.silent = true;
        self.notice_own_pauses();
        let incoming = match self.early.pop_front() {
            Some(Early::Shown(event)) => return Some(*event),
            Some(Early::Held(incoming)) => incoming,
            None => self.rx.recv_timeout(timeout).ok()?,
        };
        match incoming {
            Incoming::Event(event) => Some(*event),
            Incoming::Closed { pid, .. } => {
                self.closed.insert(pid);
                None
            }
        }
    }

    /// Takes events until one matches, failing after `timeout` with `what` in the message.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        what: &str,
        matches: impl Fn(&Event) -> bool,
    ) -> Result<Event> {
        if let Some(seen) = self.log.iter().find(|e| matches(e)) {
            return Ok(seen.clone());
        }
        // A worker that failed while the lab looked elsewhere (`run_until`) will not do
        // what we wait for: say why now rather than after the timeout.
        if let Some(failed) = self.log.iter().find(|e| e.kind() == Kind::Error) {
            return Err(worker_failed(&failed.worker, &failed.text));
        }
        let deadline = Instant::now() + timeout;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            if let Some(event) = self.next(left.min(Duration::from_millis(50))) {
                if event.kind() == Kind::Error {
                    return Err(worker_failed(&event.worker, &event.text));
                }
                if matches(&event) {
                    return Ok(event);
                }
            } else if !self.spawned.is_empty()
                && self
                    .spawned
                    .iter()
                    .all(|(_, pid)| self.closed.contains(pid))
            {
                // No worker is left to say it: waiting longer would only hide the failure.
                bail!("every worker had exited before {what}");
            }
        }
        bail!(
            "timed out after {} waiting for {what}",
            crate::output::human(timeout)
        )
    }

    /// Shows incoming events until `deadline`, calling `tick` about every 10ms.
    ///
    /// `tick` looks at the world (a key in Redis) *before* an event that just arrived is
    /// shown, so that an effect (B took the lock) never appears above its cause (A's key
    /// expired); what `tick` records is stamped no later than that event.
    pub fn run_until(
        &mut self,
        deadline: Instant,
        mut tick: impl FnMut(&mut Stage) -> Result<()>,
    ) -> Result<()> {
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            self.pump(left.min(Duration::from_millis(10)), &mut tick)?;
        }
        Ok(())
    }

    /// One turn of [`Stage::run_until`]: waits at most `wait` for an event, calls `tick`,
    /// then shows and logs the event.
    pub(super) fn pump(
        &mut self,
        wait: Duration,
        tick: &mut dyn FnMut(&mut Stage) -> Result<()>,
    ) -> Result<()> {
        self.notice_own_pauses();
        let incoming = match self.early.pop_front() {
            // Shown already, above a lab event that came after it.
            Some(Early::Shown(_)) => None,
            Some(Early::Held(incoming)) => Some(incoming),
            None => self.rx.recv_timeout(wait).ok(),
        };
        self.observed_before = match &incoming {
            Some(Incoming::Event(event)) => Some(event.t_ms),
            _ => None,
        };
        self.ticking = true;
        let ticked = tick(self);
        self.ticking = false;
        self.observed_before = None;
        if let Some(incoming) = incoming {
            self.accept(incoming);
        }
        ticked
    }

    /// True once the named worker's event stream has ended (it exited or was killed).
    pub fn has_exited(&self, worker: &str) -> bool {
        self.spawned
            .iter()
            .rev()
            .find(|(name, _)| name == worker)
            .is_some_and(|(_, pid)| self.closed.contains(pid))
    }

    /// Reads everything already sent, so the timeline is complete before the verdict.
    pub fn drain(&mut self) {
        while self.next(Duration::from_millis(20)).is_some() {}
    }

    /// Was there an event of this kind from this worker?
    pub fn saw(&self, worker: &str, kind: Kind) -> Option<&Event> {
        self.log.iter().find(|e| e.is(worker, kind))
    }
}

impl crate::nemesis::Record for Stage {
    fn record(&mut self, event: Event) {
        Stage::record(self, event);
    }
}

/// The floor the nemesis's player plays on: the stage's log and its clock.
impl crate::nemesis::play::Floor for Stage {
    fn events(&self) -> &[Event] {
        &self.log
    }

    fn now_ms(&self) -> u64 {
        self.elapsed().as_millis() as u64
    }

    fn playing(&mut self, play: u64, schedule: &Schedule) {
        if let Some(history) = &self.history {
            history.played(play, schedule);
        }
    }
}

#[cfg(test)]
mod tests;
