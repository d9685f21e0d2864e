//! Each part's own time axis, with its quiet stretches squeezed: where nothing happens for
//! a long while (a worker frozen for seconds, a lease running out), that stretch is drawn
//! a few pixels wide behind a broken-axis mark that says how long it was, and the width
//! it would have taken goes to the moments where events crowd — a grant, a write and a
//! late write a few milliseconds apart are then drawn apart, not in the last pixels of a
//! part that waited thirty seconds first.
//!
//! The mapping from time to x is monotone and continuous: a bar that spans a squeezed
//! stretch is drawn through it, and each stretch that is not squeezed is drawn to scale
//! (its own scale: the ticks say the time at every point).
//!
//! Moments only a millisecond or two apart are kept a mark's width and more apart, even
//! where that stretches a millisecond wider than its neighbours: the grant, the kill and
//! the retry of a naive lab are three marks, not one blot.

use std::collections::BTreeMap;

/// The width a squeezed stretch takes, between its two broken-axis marks.
pub const GAP_PX: f64 = 34.0;
/// A stretch without events shorter than this is never squeezed.
const QUIET_MS: u64 = 250;
/// A stretch is squeezed when it is at least this share of the part's time still drawn to
/// scale (so squeezing one makes the next biggest eligible).
const QUIET_SHARE: f64 = 0.2;
/// At most this many stretches are squeezed in one part.
const MOST_GAPS: usize = 4;
/// Each stretch drawn to scale gets at least this share of the time drawn to scale, so that
/// a burst of events between two squeezed stretches is not one pixel wide.
const FLOOR_SHARE: f64 = 0.12;

/// Two moments (times something is drawn at) are at least this far apart, when the part
/// has the room: closer, a grant and the kill that follows it 1ms later, or a write and a
/// late write, read as one mark — each mark is ~9px wide and its label starts beside it.
pub const MOMENT_APART_PX: f64 = 36.0;
/// At most this share of a stretch drawn to scale goes to keeping moments apart; the rest
/// stays proportional to time (a herd of 80 hand-overs keeps its rhythm).
const APART_SHARE: f64 = 0.5;
/// Marks of one lane at the same millisecond (a grant and the kill in the same ms) are
/// drawn side by side, in the order they happened, this far apart — a mark's width and as
/// much again, so that each reads as its own ([`Scale::of_crowded`]
/// keeps the room for them before the next moment).
pub const SIDE_BY_SIDE_PX: f64 = 18.0;

/// A piece of the axis: `from_ms..to_ms` drawn from `x0` to `x1`, either to scale or
/// squeezed (`gap`).
#[derive(Debug, Clone, PartialEq)]
pub struct Piece {
    pub from_ms: u64,
    pub to_ms: u64,
    pub x0: f64,
    pub x1: f64,
    pub gap: bool,
    /// Drawn wider than its time at the part's scale, to keep two moments apart.
    pub widened: bool,
}

/// One part's time axis.
#[derive(Debug, Clone)]
pub struct Scale {
    pub pieces: Vec<Piece>,
}

impl Scale {
    /// The axis for a part from `start` to `end` whose events (and bars' ends) fall at
    /// `times`, drawn from `x0` to `x1`.
    #[cfg(test)]
    pub fn of(times: &[u64], start: u64, end: u64, x0: f64, x1: f64) -> Scale {
        Scale::of_crowded(times, &BTreeMap::new(), start, end, x0, x1)
    }

    /// The same, where `side_by_side` says how many marks one lane draws at a moment
    /// (absent: one): such a moment keeps room for them all before the next.
    pub fn of_crowded(
        times: &[u64],
        side_by_side: &BTreeMap<u64, usize>,
        start: u64,
        end: u64,
        x0: f64,
        x1: f64,
    ) -> Scale {
        let end = end.max(start + 1);
        let mut at: Vec<u64> = times
            .iter()
            .copied()
            .filter(|t| (start..=end).contains(t))
            .chain([start, end])
            .collect();
        at.sort_unstable();
        at.dedup();
        // The stretches between consecutive moments, biggest first, squeezed while each is
        // a large share of what is still drawn to scale.
        let mut stretches: Vec<(u64, u64)> = at.windows(2).map(|w| (w[0], w[1])).collect();
        stretches.sort_by_key(|(a, b)| std::cmp::Reverse(b - a));
        let mut to_scale = end - start;
        let mut gaps: Vec<(u64, u64)> = Vec::new();
        for (a, b) in stretches {
            let long = b - a;
            // Never the whole part: something must be left to draw to scale.
            if gaps.len() == MOST_GAPS
                || long >= to_scale
                || long < QUIET_MS
                || (long as f64) < QUIET_SHARE * to_scale as f64
            {
                break;
            }
            gaps.push((a, b));
            to_scale -= long;
        }
        gaps.sort_unstable();
        // The pieces in order: to scale, gap, to scale, …
        let mut spans: Vec<(u64, u64, bool)> = Vec::new();
        let mut from = start;
        for (a, b) in &gaps {
            spans.push((from, *a, false));
            spans.push((*a, *b, true));
            from = *b;
        }
        spans.push((from, end, false));
        let floor = (FLOOR_SHARE * to_scale as f64).max(1.0);
        // A single moment between two squeezed stretches (or at an end) needs room for its
        // marks, not a share of the time.
        let weight = |(a, b, _): &(u64, u64, bool)| match b - a {
            0 => floor / 4.0,
            long => (long as f64).max(floor),
        };
        let total: f64 = spans.iter().filter(|s| !s.2).map(weight).sum();
        let room = (x1 - x0 - GAP_PX * gaps.len() as f64).max(0.0);
        let mut x = x0;
        let mut pieces = Vec::new();
        for span in &spans {
            if span.2 {
                pieces.push(Piece {
                    from_ms: span.0,
                    to_ms: span.1,
                    x0: x,
                    x1: x + GAP_PX,
                    gap: true,
                    widened: false,
                });
                x += GAP_PX;
                continue;
            }
            let width = room * weight(span) / total;
            let inside: Vec<u64> = (at.iter().copied())
                .filter(|t| (span.0..=span.1).contains(t))
                .collect();
            for (from_ms, to_ms, wide, widened) in kept_apart(&inside, side_by_side, width) {
                pieces.push(Piece {
                    from_ms,
                    to_ms,
                    x0: x,
                    x1: x + wide,
                    gap: false,
                    widened,
                });
                x += wide;
            }
        }
        Scale { pieces }
    }

    /// Where time `t` is drawn.
    pub fn x(&self, t: u64) -> f64 {
        let first = &self.pieces[0];
        if t <= first.from_ms {
            return first.x0;
        }
        for piece in &self.pieces {
            if t <= piece.to_ms {
                let long = (piece.to_ms - piece.from_ms).max(1) as f64;
                return piece.x0 + (piece.x1 - piece.x0) * (t - piece.from_ms) as f64 / long;
            }
        }
        self.pieces.last().map_or(first.x0, |p| p.x1)
    }

    /// Whether some of `from..to` is drawn wider than its time, to keep moments apart: a
    /// bar there looks longer than it was, and says how long it was.
    pub fn widened(&self, from: u64, to: u64) -> bool {
        (self.pieces.iter()).any(|p| p.widened && p.from_ms < to && p.to_ms > from)
    }

    /// The squeezed stretches: where, and how long each was.
    pub fn gaps(&self) -> impl Iterator<Item = &Piece> {
        self.pieces.iter().filter(|p| p.gap)
    }

    /// The ticks: (x, ms since `start`), at round steps in each piece drawn to scale, at
    /// least `apart` pixels from each other.
    pub fn ticks(&self, start: u64, apart: f64) -> Vec<(f64, u64)> {
        const STEPS: [u64; 19] = [
            1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000,
            60_000, 300_000,
        ];
        let mut ticks: Vec<(f64, u64)> = Vec::new();
        for piece in self.pieces.iter().filter(|p| !p.gap) {
            let long = (piece.to_ms - piece.from_ms).max(1) as f64;
            let per_ms = (piece.x1 - piece.x0) / long;
            let step = STEPS
                .iter()
                .copied()
                .find(|s| *s as f64 * per_ms >= apart)
                .unwrap_or(300_000);
            let first = (piece.from_ms - start).div_ceil(step) * step;
            let mut t = first;
            while start + t <= piece.to_ms {
                let x = self.x(start + t);
                if ticks.last().is_none_or(|(last, _)| x - last >= apart) {
                    ticks.push((x, t));
                }
                t += step;
            }
        }
        ticks
    }
}

/// A stretch drawn to scale, `width` px for the moments `at` (its ends included), cut into
/// pieces so that consecutive moments are [`MOMENT_APART_PX`] apart (more after a moment
/// with marks side by side): the stretches that would be narrower get that much, the rest
/// share what is left in proportion to their time. Consecutive stretches that keep the
/// common scale are one piece. Returns (from, to, width, widened) per piece.
fn kept_apart(
    at: &[u64],
    side_by_side: &BTreeMap<u64, usize>,
    width: f64,
) -> Vec<(u64, u64, f64, bool)> {
    if at.len() < 2 {
        let t = at.first().copied().unwrap_or_default();
        return vec![(t, t, width, false)];
    }
    let stretches: Vec<(u64, u64)> = at.windows(2).map(|w| (w[0], w[1])).collect();
    let mut least: Vec<f64> = (stretches.iter())
        .map(|(a, _)| {
            let beside = side_by_side.get(a).copied().unwrap_or(1).max(1) - 1;
            MOMENT_APART_PX + SIDE_BY_SIDE_PX * beside as f64
        })
        .collect();
    let wanted: f64 = least.iter().sum();
    if wanted > APART_SHARE * width {
        let shrink = APART_SHARE * width / wanted;
        least.iter_mut().for_each(|l| *l *= shrink);
    }
    // Which stretches are held at their least width: start with none, give the others
    // the common scale, hold those it leaves too narrow, and again until none is added.
    let mut held = vec![false; stretches.len()];
    let px_per_ms = loop {
        let fixed: f64 = (0..stretches.len())
            .filter(|&i| held[i])
            .map(|i| least[i])
            .sum();
        let free_ms: u64 = (0..stretches.len())
            .filter(|&i| !held[i])
            .map(|i| stretches[i].1 - stretches[i].0)
            .sum();
        let px_per_ms = (width - fixed).max(0.0) / free_ms.max(1) as f64;
        let mut more = false;
        for (i, (a, b)) in stretches.iter().enumerate() {
            if !held[i] && ((b - a) as f64 * px_per_ms) < least[i] {
                held[i] = true;
                more = true;
            }
        }
        if !more {
            break px_per_ms;
        }
    };
    let mut pieces: Vec<(u64, u64, f64, bool)> = Vec::new();
    for (i, (a, b)) in stretches.iter().enumerate() {
        let wide = match held[i] {
            true => least[i],
            false => (b - a) as f64 * px_per_ms,
        };
        match pieces.last_mut() {
            Some(last) if !held[i] && !last.3 => {
                last.1 = *b;
                last.2 += wide;
            }
            _ => pieces.push((*a, *b, wide, held[i])),
        }
    }
    pieces
}

/// A tick's time: `+2s`, `+1.5s`, `+0.125s`, with as many decimals as its step needs.
pub fn tick_label(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("+{}s", ms / 1000)
    } else if ms.is_multiple_of(100) {
        format!("+{:.1}s", ms as f64 / 1000.0)
    } else if ms.is_multiple_of(10) {
        format!("+{:.2}s", ms as f64 / 1000.0)
    } else {
        format!("+{:.3}s", ms as f64 / 1000.0)
    }
}

/// A duration in words short enough for a squeezed stretch's mark: `12.3s`, `850ms`.
pub fn short_duration(ms: u64) -> String {
    if ms >= 10_000 {
        format!("{:.0}s", ms as f64 / 1000.0)
    } else if ms >= 1000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_after_a_long_quiet_stretch_gets_most_of_the_width() {
        // Lab 5's shape: a grant, thirty quiet seconds, then the kill, the promotion and two
        // writes within 40ms. On one linear scale the burst is 1.3px wide (0.13%).
        let times = [0, 30_000, 30_010, 30_020, 30_040];
        let scale = Scale::of(&times, 0, 30_040, 150.0, 1230.0);
        let burst = scale.x(30_040) - scale.x(30_000);
        assert!(
            burst > 0.5 * 1080.0,
            "the burst is {burst:.1}px of 1080px: {scale:?}"
        );
        // The quiet stretch is still there, drawn as a gap that says how long it was.
        let gaps: Vec<&Piece> = scale.gaps().collect();
        assert_eq!(gaps.len(), 1);
        assert_eq!((gaps[0].from_ms, gaps[0].to_ms), (0, 30_000));
        // And the order of events is kept.
        assert!(times.windows(2).all(|w| scale.x(w[0]) < scale.x(w[1])));
    }

    #[test]
    fn a_part_with_nothing_between_its_ends_is_drawn_to_scale_not_squeezed_away() {
        let scale = Scale::of(&[0, 1000], 0, 1000, 0.0, 1000.0);
        assert_eq!(scale.gaps().count(), 0);
        assert!((scale.x(250) - 250.0).abs() < 1e-9);
    }

    #[test]
    fn a_part_with_events_spread_evenly_is_drawn_to_one_scale() {
        let times: Vec<u64> = (0..=10).map(|i| i * 100).collect();
        let scale = Scale::of(&times, 0, 1000, 0.0, 1000.0);
        assert_eq!(scale.gaps().count(), 0);
        assert!((scale.x(500) - 500.0).abs() < 1e-9);
    }

    /// Lab 2's no-ttl part: A is granted at 0, killed at 1ms, B tries at 36ms and gives up
    /// at 200ms. To one scale the grant and the kill were 1px apart, one blot.
    #[test]
    fn moments_a_millisecond_apart_are_drawn_a_marks_width_apart() {
        let times = [0, 1, 36, 200];
        let crowd = BTreeMap::from([(1, 2)]);
        let scale = Scale::of_crowded(&times, &crowd, 0, 200, 150.0, 1230.0);
        assert!(
            times
                .windows(2)
                .all(|w| scale.x(w[1]) - scale.x(w[0]) >= MOMENT_APART_PX)
        );
        // The moment with two marks of one lane keeps room for the second one.
        assert!(scale.x(36) - scale.x(1) >= MOMENT_APART_PX + SIDE_BY_SIDE_PX);
        // The millisecond drawn wider than its time says so; the rest keeps one scale.
        assert!(scale.widened(0, 1) && !scale.widened(36, 200));
        let per_ms = (scale.x(200) - scale.x(36)) / 164.0;
        assert!((scale.x(100) - scale.x(36) - 64.0 * per_ms).abs() < 1e-6);
    }

    #[test]
    fn ticks_keep_apart_and_say_the_time_since_the_parts_start() {
        let scale = Scale::of(&[1000, 31_000, 31_050], 1000, 31_050, 150.0, 1230.0);
        let ticks = scale.ticks(1000, 60.0);
        assert!(ticks.windows(2).all(|w| w[1].0 - w[0].0 >= 60.0));
        assert!(ticks.iter().any(|(_, ms)| *ms >= 30_000));
        assert_eq!(tick_label(30_010), "+30.01s");
        assert_eq!(tick_label(1500), "+1.5s");
    }
}
