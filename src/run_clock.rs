//! The run's clock under `--step`: the seconds a room spends at a stop are not the lab's.
//!
//! A stop waits for Enter while no timer of the story runs (see [`crate::labs::step`]),
//! so a run's
//! event times leave those seconds out: the first event of a run that waited a minute at
//! its first stop is still at `+0.1s`, and the gaps between events are the ones the
//! servers saw.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Every wait at a stop: when it began and how long it lasted.
static WAITS: Mutex<Vec<(Instant, Duration)>> = Mutex::new(Vec::new());

/// Notes a wait at a stop that began at `began` and has just ended.
pub fn waited_since(began: Instant) {
    WAITS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push((began, began.elapsed()));
}

/// The time since `start`, less the waits at stops that began after it.
pub fn since(start: Instant) -> Duration {
    let waited: Duration = WAITS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(began, _)| *began >= start)
        .map(|(_, lasted)| *lasted)
        .sum();
    start.elapsed().saturating_sub(waited)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_at_a_stop_is_left_out_of_the_runs_time() {
        let start = Instant::now();
        let began = Instant::now();
        std::thread::sleep(Duration::from_millis(50));
        waited_since(began);
        assert!(since(start) < Duration::from_millis(50));
        let later = Instant::now();
        assert!(since(later) < Duration::from_millis(50));
    }
}
