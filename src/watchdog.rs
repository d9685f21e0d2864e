//! The lab's own pause watchdog: lockslab notices when *it* was not running (stopped, a
//! closed laptop lid, a paused VM, a starved CPU), so that no figure measured across the
//! gap is printed as true.

use std::time::{Duration, Instant};

/// A gap in the lab's own clock: from `from`, the lab was not scheduled for `gap`.
#[derive(Clone, Copy, Debug)]
pub struct OwnPause {
    pub from: Instant,
    pub gap: Duration,
}

/// How often the pause watchdog looks at the clock.
const WATCH_EVERY: Duration = Duration::from_millis(20);
/// A gap between two looks this much longer than [`WATCH_EVERY`] means the lab itself was not
/// running: stopped (SIGSTOP, a closed laptop lid, a paused VM) or starved of CPU.
const OWN_PAUSE: Duration = Duration::from_millis(500);

static OWN_PAUSES: std::sync::Mutex<Vec<OwnPause>> = std::sync::Mutex::new(Vec::new());
/// How many pauses were seen so far (read without the lock, on every stage call).
pub static OWN_PAUSE_COUNT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
/// Where the run's clock starts (the first stage's): what `at_ms` is measured from.
static RUN_CLOCK: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Starts, once per process, the watchdog that catches the lab's own pauses.
///
/// The same detection lab 9 teaches a lock holder: a thread that wakes every 20ms and looks
/// at the monotonic clock. The clock runs on while the process is stopped; the thread does
/// not. A gap well over its period is time the lab did not see: every duration it measured
/// across that gap (a holder's pause, an election, a hand-over) includes it, and the lab
/// says so instead of printing skewed figures as true.
pub fn watch_own_pauses(clock: Instant) {
    if RUN_CLOCK.set(clock).is_err() {
        return;
    }
    std::thread::spawn(|| {
        let mut last = Instant::now();
        loop {
            std::thread::sleep(WATCH_EVERY);
            let now = Instant::now();
            let gap = now - last;
            if gap > OWN_PAUSE
                && let Ok(mut pauses) = OWN_PAUSES.lock()
            {
                pauses.push(OwnPause { from: last, gap });
                OWN_PAUSE_COUNT.store(pauses.len(), std::sync::atomic::Ordering::Release);
            }
            last = now;
        }
    });
}

/// The lab's own pauses so far (see [`watch_own_pauses`]).
pub fn own_pauses() -> Vec<OwnPause> {
    OWN_PAUSES.lock().map(|p| p.clone()).unwrap_or_default()
}

/// `at_ms` of a pause: on the run's clock, like every event's `t_ms`.
pub fn at_ms(pause: &OwnPause) -> u64 {
    RUN_CLOCK.get().map_or(0, |start| {
        pause.from.saturating_duration_since(*start).as_millis() as u64
    })
}

/// Marks a verdict: `disturbed` (the lab itself was paused during the run, so its timings
/// include the gap), `lab_paused_ms` in all, and each gap as `[at_ms, paused_ms]`.
pub fn mark_disturbed(verdict: &mut serde_json::Map<String, serde_json::Value>) {
    if RUN_CLOCK.get().is_none() {
        return; // no stage ran: nothing was watched
    }
    let pauses = own_pauses();
    let total: u128 = pauses.iter().map(|p| p.gap.as_millis()).sum();
    verdict.insert("disturbed".into(), (!pauses.is_empty()).into());
    verdict.insert("lab_paused_ms".into(), (total as u64).into());
    let gaps: Vec<serde_json::Value> = pauses
        .iter()
        .map(|p| serde_json::json!([at_ms(p), p.gap.as_millis() as u64]))
        .collect();
    verdict.insert("lab_pauses".into(), gaps.into());
}
