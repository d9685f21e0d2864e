//! Duration flags: how every lab and the hands-on worker read `1500ms`, `2s`, `1m`, and
//! the bounds that keep a typo from becoming an eleven-year lease.

use std::time::Duration;

/// Parses `1500ms`, `2s`, `1m`… for duration flags; clap adds the flag's name to errors.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if !text.is_empty() && text.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(format!(
            "'{text}' has no unit: write e.g. {text}s or {text}ms"
        ));
    }
    humantime::parse_duration(text).map_err(|err| format!("{err} (examples: 1500ms, 2s, 1m30s)"))
}

/// A duration written as a duration flag takes it (`2s`, or `1500ms`): what a command that
/// replays a run puts on its line, and what [`parse_duration`] reads back to the same value.
pub fn flag_duration(duration: Duration) -> String {
    match duration.as_millis() {
        ms if ms % 1000 == 0 => format!("{}s", ms / 1000),
        ms => format!("{ms}ms"),
    }
}

/// The longest pause, TTL, lease or timeout a lab takes. A lab is a demonstration that
/// someone watches: beyond this, a value is a typo — and an unbounded one overflows the
/// arithmetic on it, or leaves an eleven-year lease in a shared etcd.
pub const LONGEST_LAB_WAIT: Duration = Duration::from_secs(10 * 60);

/// The longest step a lab repeats many times (a job's work, a race's spread or window).
pub const LONGEST_STEP: Duration = Duration::from_secs(60);

/// The longest TTL, work or wait of the hands-on worker: a person at a keyboard is slow,
/// but an hour is still plenty.
pub const LONGEST_HANDS_ON: Duration = Duration::from_secs(60 * 60);

/// A duration flag's value parser that also checks bounds, at parse time: a value out of
/// range is a bad command line (exit status 2, the flag named by clap) before any server is
/// touched. Each flag's help states its bounds.
pub fn duration_in(
    min: Duration,
    max: Duration,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |text| {
        let value = parse_duration(text)?;
        if value < min {
            return Err(format!("use at least {}", humantime::format_duration(min)));
        }
        if value > max {
            return Err(format!("use at most {}", humantime::format_duration(max)));
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_written_for_a_flag_reads_back_the_same() {
        for ms in [0, 1, 500, 1000, 1500, 61_500, 120_000] {
            let duration = Duration::from_millis(ms);
            assert_eq!(parse_duration(&flag_duration(duration)), Ok(duration));
        }
        assert_eq!(flag_duration(Duration::from_secs(2)), "2s");
        assert_eq!(flag_duration(Duration::from_millis(1500)), "1500ms");
    }
}
