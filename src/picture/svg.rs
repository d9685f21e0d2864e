//! The drawing, as SVG: one band per part on one time scale, lanes inside each band.
//!
//! Colours follow the terminal's meanings on a light background, from the Okabe–Ito
//! palette (told apart with the common colour-vision deficiencies): vermillion for what went
//! wrong (a stale write taken, a kill, two holders), bluish green for a stale write refused,
//! blue hatching for a freeze, orange for an expiry.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::drawing::{Bar, Lane, LaneKind, Mark, Part, Picture, Shape, Tone, Verdict};
use super::escape;
use super::scale::{GAP_PX, SIDE_BY_SIDE_PX, Scale, short_duration, tick_label};

pub const WIDTH: f64 = 1280.0;
const X0: f64 = 150.0;
const X1: f64 = 1230.0;
const LANE: f64 = 17.0;
const ROW: f64 = 13.0;
const PART_HEAD: f64 = 20.0;
/// The row under a part's heading that holds its own time axis.
const AXIS_ROW: f64 = 13.0;
/// About how wide an 11px label is per character.
const LABEL_CHAR: f64 = 6.3;
/// The same for a bold 11px label (measured in Chromium with DejaVu Sans: about 7.3).
const BOLD_LABEL_CHAR: f64 = 7.4;
const MONO_CHAR: f64 = 6.6;

const BAD: &str = "#D55E00";
const GOOD: &str = "#009E73";
const WARN: &str = "#E69F00";
const COLD: &str = "#0072B2";
const INK: &str = "#222222";
/// One colour per holder, in the order workers appear; the text colour that reads on it.
/// Blue is the freeze's, vermillion, green and orange the verdict's: holders get the rest.
const HOLDERS: [(&str, &str); 5] = [
    ("#332288", "#ffffff"),
    ("#CC79A7", "#000000"),
    ("#666666", "#ffffff"),
    ("#F0E442", "#000000"),
    ("#882255", "#ffffff"),
];

fn seconds(ms: u64) -> String {
    format!("{:.3}s", ms as f64 / 1000.0)
}

/// The standalone SVG document, with the verdict table under the drawing.
pub fn document(picture: &Picture) -> String {
    let (body, height) = drawing(picture, true);
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n{}",
        wrap(&body, height, picture)
    )
}

/// The `<svg>` element for a page (the page shows the verdict as an HTML table).
pub fn inline(picture: &Picture) -> String {
    let (body, height) = drawing(picture, false);
    wrap(&body, height, picture)
}

fn wrap(body: &str, height: f64, picture: &Picture) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {WIDTH} {height:.0}\" role=\"img\" aria-label=\"{}\" \
         font-family=\"DejaVu Sans, Liberation Sans, Arial, Helvetica, sans-serif\">\n\
         <title>{}</title>\n{}{body}</svg>\n",
        escape(&picture.title),
        escape(&picture.title),
        defs(),
    )
}

fn defs() -> String {
    let mut out = String::from("<defs>\n<style>\n");
    out.push_str(
        ".lbl{font-size:11px;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}\n\
         .ev{cursor:default}\n.ev:hover{filter:drop-shadow(0 0 2px #000)}\n\
         .lane-name{font-size:12px;font-weight:bold}\n.axis{font-size:11px;fill:#444}\n\
         .mono{font-family:DejaVu Sans Mono, Liberation Mono, Consolas, monospace;font-size:11px}\n",
    );
    out.push_str("</style>\n");
    for (i, (color, _)) in HOLDERS.iter().enumerate() {
        let _ = writeln!(
            out,
            "<pattern id=\"believed{i}\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" \
             patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#ffffff\"/>\
             <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"{color}\" stroke-width=\"2.5\"/></pattern>"
        );
    }
    let _ = writeln!(
        out,
        "<pattern id=\"freeze\" patternUnits=\"userSpaceOnUse\" width=\"7\" height=\"7\" \
         patternTransform=\"rotate(-45)\"><rect width=\"7\" height=\"7\" fill=\"#d6ebf8\"/>\
         <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"7\" stroke=\"#56B4E9\" stroke-width=\"2\"/>\
         <line x1=\"0\" y1=\"0\" x2=\"7\" y2=\"0\" stroke=\"#56B4E9\" stroke-width=\"2\"/></pattern>"
    );
    let _ = writeln!(
        out,
        "<pattern id=\"held\" patternUnits=\"userSpaceOnUse\" width=\"6\" height=\"6\" \
         patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#fbe8c4\"/>\
         <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"{WARN}\" stroke-width=\"2\"/></pattern>"
    );
    out.push_str("</defs>\n");
    out
}

fn lane_height(lane: &Lane) -> f64 {
    match lane.kind {
        LaneKind::Lock => 8.0 + ROW * lane.rows.len().max(1) as f64,
        _ => LANE,
    }
}

/// The drawing's body and its height.
fn drawing(picture: &Picture, with_verdict: bool) -> (String, f64) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<rect width=\"{WIDTH}\" height=\"100%\" fill=\"#ffffff\"/>\n\
         <text x=\"12\" y=\"26\" font-size=\"20\" font-weight=\"bold\" fill=\"{INK}\">{}</text>",
        escape(&picture.title)
    );
    let mut y = 46.0;
    for line in &picture.settings {
        // A long command line (a chaos schedule's JSON) is cut to the drawing's width; the
        // page's title and the hover keep nothing from it, the terminal has it whole.
        let room = ((WIDTH - 24.0) / 6.7) as usize;
        let line = &match line.chars().count() > room {
            true => line.chars().take(room - 1).collect::<String>() + "…",
            false => line.clone(),
        };
        let _ = writeln!(
            out,
            "<text x=\"12\" y=\"{y}\" font-size=\"12\" fill=\"#333\" class=\"settings\">{}</text>",
            escape(line)
        );
        y += 16.0;
    }
    if let Some(disturbed) = &picture.disturbed {
        let _ = writeln!(
            out,
            "<text x=\"12\" y=\"{y}\" font-size=\"12\" font-weight=\"bold\" fill=\"{}\" class=\"disturbed\">{}</text>",
            tone_color(Tone::Bad),
            escape(disturbed)
        );
        y += 16.0;
    }
    let outcomes: Vec<(&Part, &(String, Tone))> = picture
        .parts
        .iter()
        .filter_map(|part| part.outcome.as_ref().map(|o| (part, o)))
        .collect();
    if let Some(grid) = Grid::of(picture) {
        // Lab 9's full run: one cell per guard and fault, instead of a line per part.
        y = draw_grid(&mut out, &grid, picture, y);
    } else if !outcomes.is_empty() {
        // What each part came to, first, where a projector shows it without scrolling; as
        // many lines as the parts need.
        let mut used = 0.0;
        for (i, (part, (text, tone))) in outcomes.iter().enumerate() {
            let verdict = text.split(" — ").next().unwrap_or(text);
            let name = match part.label.is_empty() {
                true => "the run".to_string(),
                false => part_title(&part.label),
            };
            let wide = (name.chars().count() + verdict.chars().count() + 5) as f64 * 7.8;
            let first_on_line = i == 0 || used + wide > WIDTH - 24.0;
            if first_on_line {
                if i > 0 {
                    out.push_str("</text>\n");
                    y += 18.0;
                }
                let _ = write!(
                    out,
                    "<text x=\"12\" y=\"{y}\" font-size=\"13\" class=\"outcomes\" fill=\"{INK}\">"
                );
                used = 0.0;
            }
            used += wide;
            let _ = write!(
                out,
                "{}<tspan font-weight=\"bold\">{}:</tspan> <tspan fill=\"{}\" font-weight=\"bold\">{}</tspan>",
                if first_on_line { "" } else { " · " },
                escape(&name),
                tone_color(*tone),
                escape(verdict)
            );
        }
        out.push_str("</text>\n");
        y += 18.0;
    }
    y += 4.0;
    let (legend, lines) = legend(y, picture);
    out.push_str(&legend);
    y += 8.0 + 18.0 * lines as f64;
    for (i, part) in picture.parts.iter().enumerate() {
        y = draw_part(&mut out, part, i, y);
        y += 8.0;
    }
    y += 14.0;
    if with_verdict {
        y = draw_verdict(&mut out, &picture.verdict, y + 10.0);
    }
    (out, y + 12.0)
}

/// The legend: only what this picture draws (a challenge has no "two holders" band).
/// The legend, and how many lines it takes (it wraps at the drawing's width).
fn legend(y: f64, picture: &Picture) -> (String, usize) {
    let lanes = || picture.parts.iter().flat_map(|part| &part.lanes);
    let bars = || lanes().flat_map(|lane| &lane.bars);
    let marks = || lanes().flat_map(|lane| &lane.marks);
    let has = |shape: Shape| marks().any(|m| m.shape == shape);
    let writes = |tone: Tone| {
        marks().any(|m| m.shape == Shape::Write && m.tone == tone && m.label.is_some())
    };
    let mut out = format!("<g class=\"legend\" transform=\"translate(12,{y})\" font-size=\"11\">");
    let (mut x, mut line) = (0.0, 0);
    let mut item = |shown: bool, swatch: String, text: &str| {
        if !shown {
            return;
        }
        let wide = 30.0 + text.chars().count() as f64 * 6.0;
        if x + wide > WIDTH - 24.0 {
            (x, line) = (0.0, line + 1);
        }
        let _ = write!(
            out,
            "<g transform=\"translate({x},{})\">{swatch}<text x=\"22\" y=\"10\" fill=\"{INK}\">{}</text></g>",
            line * 18,
            escape(text)
        );
        x += wide;
    };
    let mark = |shape: Shape, tone: Tone, big: bool| {
        format!(
            "<g transform=\"translate(9,6)\">{}</g>",
            shape_svg(shape, tone, big)
        )
    };
    item(
        bars().next().is_some(),
        format!(
            "<rect y=\"1\" width=\"18\" height=\"10\" fill=\"{}\"/>",
            HOLDERS[0].0
        ),
        "lock held (the backend says)",
    );
    item(
        bars().any(|bar| bar.believed_to > bar.held_to),
        format!(
            "<rect y=\"1\" width=\"18\" height=\"10\" fill=\"url(#believed0)\" stroke=\"{}\" stroke-dasharray=\"2 1\"/>",
            HOLDERS[0].0
        ),
        "still believes it holds it",
    );
    item(
        lanes().any(|lane| !lane.overlaps.is_empty()),
        format!(
            "<rect y=\"0\" width=\"18\" height=\"12\" fill=\"{BAD}\" fill-opacity=\"0.25\" stroke=\"{BAD}\"/>"
        ),
        "two holders at once",
    );
    item(
        lanes().any(|lane| !lane.freezes.is_empty()),
        format!(
            "<rect y=\"1\" width=\"18\" height=\"10\" fill=\"url(#freeze)\" stroke=\"{COLD}\"/>"
        ),
        "frozen (SIGSTOP)",
    );
    item(
        lanes().any(|lane| !lane.held.is_empty()),
        format!("<rect y=\"1\" width=\"18\" height=\"10\" fill=\"url(#held)\" stroke=\"{WARN}\"/>"),
        "proxy fault on a path (held, cut, reply lost)",
    );
    item(
        picture.parts.iter().any(|part| !part.bands.is_empty()),
        format!(
            "<rect y=\"1\" width=\"18\" height=\"10\" fill=\"{BAD}\" fill-opacity=\"0.18\" stroke=\"{BAD}\" stroke-dasharray=\"5 3\"/>"
        ),
        "hosts cut apart, or a leader stalled",
    );
    item(
        has(Shape::Grant),
        mark(Shape::Grant, Tone::Plain, false),
        "granted",
    );
    item(
        has(Shape::Release),
        mark(Shape::Release, Tone::Plain, false),
        "released",
    );
    item(
        has(Shape::Kill),
        mark(Shape::Kill, Tone::Bad, false),
        "killed",
    );
    item(
        has(Shape::Expire),
        mark(Shape::Expire, Tone::Warn, false),
        "expired",
    );
    item(
        writes(Tone::Plain),
        mark(Shape::Write, Tone::Plain, false),
        "write",
    );
    let challenge = matches!(picture.verdict, Verdict::Findings { .. });
    let (taken, refused) = match challenge {
        true => ("write a finding names", ""),
        false => ("stale write taken", "stale write refused"),
    };
    item(
        writes(Tone::Bad),
        mark(Shape::Write, Tone::Bad, true),
        taken,
    );
    item(
        writes(Tone::Good) && !challenge,
        mark(Shape::Write, Tone::Good, true),
        refused,
    );
    out.push_str("</g>\n");
    (out, line + 1)
}

/// Every moment a part draws something at: its marks, its bars' and spans' ends.
fn moments(part: &Part) -> Vec<u64> {
    let mut at = Vec::new();
    for lane in &part.lanes {
        at.extend(lane.marks.iter().map(|m| m.t));
        for bar in &lane.bars {
            at.extend([bar.from, bar.held_to, bar.believed_to]);
        }
        for span in lane.freezes.iter().chain(&lane.held) {
            at.extend([span.from, span.to]);
        }
        for wait in &lane.waits {
            at.extend([wait.from, wait.to]);
        }
    }
    for band in &part.bands {
        at.extend([band.from, band.to]);
    }
    at
}

/// The part's own axis, in the row under its heading: ticks in time since the part began,
/// and each squeezed stretch marked as a break with its length.
fn part_axis(out: &mut String, scale: &Scale, part: &Part, y: f64, bottom: f64) {
    out.push_str("<g class=\"axis\">");
    // A tick's label must not run into a squeezed stretch's "≈12s".
    let breaks: Vec<f64> = scale.gaps().map(|gap| (gap.x0 + gap.x1) / 2.0).collect();
    let ticks = scale.ticks(part.start, 62.0);
    let ticks = ticks
        .into_iter()
        .filter(|(x, _)| breaks.iter().all(|mid| (x - mid).abs() >= 48.0));
    for (x, ms) in ticks {
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{bottom:.1}\" stroke=\"#e3e3e3\"/>\
             <text class=\"tick\" x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"middle\">{}</text>",
            y + 3.0,
            tick_label(ms)
        );
    }
    for gap in scale.gaps() {
        let mid = (gap.x0 + gap.x1) / 2.0;
        let long = gap.to_ms - gap.from_ms;
        // A broken axis: the stretch is drawn GAP_PX wide whatever its length.
        let _ = write!(
            out,
            "<g class=\"gap\" data-ms=\"{long}\"><title>{} with nothing new (+{} to +{}), drawn {GAP_PX}px wide</title>\
             <text class=\"gap-label\" x=\"{mid:.1}\" y=\"{y:.1}\" text-anchor=\"middle\" font-size=\"9\" fill=\"#444\">≈{}</text></g>",
            seconds(long),
            seconds(gap.from_ms - part.start),
            seconds(gap.to_ms - part.start),
            short_duration(long),
        );
    }
    out.push_str("</g>\n");
}

/// How many marks one lane draws at each moment where it draws more than one: they are
/// drawn side by side ([`mark_xs`]), and the axis keeps room for them.
fn side_by_side(part: &Part) -> BTreeMap<u64, usize> {
    let mut most: BTreeMap<u64, usize> = BTreeMap::new();
    for lane in &part.lanes {
        let mut here: BTreeMap<u64, usize> = BTreeMap::new();
        for mark in &lane.marks {
            *here.entry(mark.t).or_default() += 1;
        }
        for (t, n) in here.into_iter().filter(|(_, n)| *n > 1) {
            let at = most.entry(t).or_default();
            *at = (*at).max(n);
        }
    }
    most
}

/// Where each of a lane's marks is drawn: at its time, and a mark at the same millisecond
/// as an earlier one of its lane (a grant, then the kill of its holder) beside it, to its
/// right, in the order they happened — not on top of it.
fn mark_xs(lane: &Lane, scale: &Scale) -> Vec<f64> {
    let mut earlier: BTreeMap<u64, usize> = BTreeMap::new();
    lane.marks
        .iter()
        .map(|mark| {
            let before = earlier.entry(mark.t).or_default();
            let x = scale.x(mark.t) + SIDE_BY_SIDE_PX * *before as f64;
            *before += 1;
            x
        })
        .collect()
}

fn draw_part(out: &mut String, part: &Part, index: usize, top: f64) -> f64 {
    let scale = &Scale::of_crowded(
        &moments(part),
        &side_by_side(part),
        part.start,
        part.end,
        X0,
        X1,
    );
    let layouts: Vec<Labels> = part
        .lanes
        .iter()
        .map(|lane| lay_out_labels(lane, scale))
        .collect();
    let lanes_height: f64 = part
        .lanes
        .iter()
        .zip(&layouts)
        .map(|(lane, labels)| lane_height(lane) + labels.extra_height())
        .sum();
    let heading = if part.label.is_empty() {
        "the run".to_string()
    } else {
        part_title(&part.label)
    };
    // The outcome after the heading and its times, wrapped to the drawing's width.
    let outcome_x = 12.0 + heading.chars().count() as f64 * 8.4 + 24.0 + 40.0 * LABEL_CHAR;
    let room = ((WIDTH - 16.0 - outcome_x) / 7.6).max(8.0) as usize;
    let outcome_lines = part
        .outcome
        .as_ref()
        .map(|(text, _)| wrap_words(text, room))
        .unwrap_or_default();
    let head = PART_HEAD + outcome_lines.len().saturating_sub(1) as f64 * 15.0 + AXIS_ROW;
    let bands_height = bands_height(part);
    let bottom = top + head + bands_height + lanes_height;
    let _ = writeln!(
        out,
        "<g class=\"part\" id=\"part-{index}\" data-part=\"{}\">\n<rect x=\"6\" y=\"{top}\" width=\"{}\" height=\"{:.1}\" fill=\"none\" stroke=\"#bbbbbb\" rx=\"4\"/>",
        escape(&part.label),
        WIDTH - 12.0,
        bottom - top + 4.0
    );
    let _ = writeln!(
        out,
        "<text x=\"12\" y=\"{:.1}\" font-size=\"13\" font-weight=\"bold\" fill=\"{INK}\">{}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#555\">from +{} of the run, {} long</text>",
        top + 15.0,
        escape(&heading),
        12.0 + heading.chars().count() as f64 * 8.4 + 12.0,
        top + 15.0,
        seconds(part.start),
        seconds(part.end - part.start)
    );
    if let Some((text, tone)) = &part.outcome {
        let _ = write!(
            out,
            "<text class=\"outcome\" y=\"{:.1}\" font-size=\"13\" font-weight=\"bold\" fill=\"{}\"><title>{}</title>",
            top + 15.0,
            tone_color(*tone),
            escape(text),
        );
        for (i, line) in outcome_lines.iter().enumerate() {
            let _ = write!(
                out,
                "<tspan x=\"{outcome_x:.1}\" dy=\"{}\">{}</tspan>",
                if i == 0 { 0.0 } else { 15.0 },
                escape(line)
            );
        }
        out.push_str("</text>\n");
    }
    part_axis(out, scale, part, top + head - 3.0, bottom);
    let mut y = top + head + bands_height;
    for (i, (lane, labels)) in part.lanes.iter().zip(&layouts).enumerate() {
        let height = lane_height(lane) + labels.extra_height();
        let at = LaneAt {
            y,
            height,
            index: i,
        };
        draw_lane(out, part, lane, at, scale, labels);
        y += height;
    }
    draw_bands(out, part, scale, top + head, bottom);
    draw_breaks(out, scale, top + head, bottom);
    out.push_str("</g>\n");
    bottom
}

/// The height of one row of fault bands (partitions, stalls).
const BAND_ROW: f64 = 16.0;

/// The rows a part's bands take: one per band that overlaps an earlier one in time.
fn band_rows(part: &Part) -> Vec<usize> {
    let mut ends: Vec<u64> = Vec::new();
    part.bands
        .iter()
        .map(|band| match ends.iter().position(|&end| end <= band.from) {
            Some(row) => {
                ends[row] = band.to;
                row
            }
            None => {
                ends.push(band.to);
                ends.len() - 1
            }
        })
        .collect()
}

fn bands_height(part: &Part) -> f64 {
    let rows = band_rows(part).into_iter().max().map_or(0, |r| r + 1);
    rows as f64 * BAND_ROW
}

/// The partitions and stalls: a band in the rows above the lanes, saying which hosts were
/// cut from which (or which leader stood still), and its stretch shaded down the part.
fn draw_bands(out: &mut String, part: &Part, scale: &Scale, top: f64, bottom: f64) {
    for (band, row) in part.bands.iter().zip(band_rows(part)) {
        let x = scale.x(band.from);
        let w = (scale.x(band.to) - x).max(MIN_BAR);
        let y = top + row as f64 * BAND_ROW;
        let text = format!(
            "{}, {}{}",
            band.text,
            seconds(band.to - band.from),
            if band.open { " (not healed)" } else { "" }
        );
        let width = text.chars().count() as f64 * LABEL_CHAR;
        // Inside the band where it fits, else beside it (to its left near the right edge).
        let label_x = if width + 8.0 <= w {
            x + 4.0
        } else if x + w + 4.0 + width <= WIDTH - 12.0 {
            x + w + 4.0
        } else {
            (x - 4.0 - width).max(12.0)
        };
        let _ = writeln!(
            out,
            "<g class=\"band\" data-from=\"{}\" data-to=\"{}\"><title>{} from +{} to +{}</title>\
             <rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{BAD}\" fill-opacity=\"0.06\" stroke=\"{BAD}\" stroke-dasharray=\"5 3\"/>\
             <rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{BAD}\" fill-opacity=\"0.18\"/>\
             <text class=\"lbl band-label\" x=\"{label_x:.1}\" y=\"{:.1}\" fill=\"#8a2b00\" font-weight=\"bold\">{}</text></g>",
            band.from,
            band.to,
            escape(&band.text),
            seconds(band.from - part.start),
            seconds(band.to - part.start),
            y + 1.0,
            bottom - y - 1.0,
            y + 1.0,
            BAND_ROW - 3.0,
            y + 11.5,
            escape(&text),
        );
    }
}

/// Over each squeezed stretch, drawn last: a veil (light: a label drawn across the
/// stretch stays readable), and the axis's break marks at its top and bottom.
fn draw_breaks(out: &mut String, scale: &Scale, top: f64, bottom: f64) {
    for gap in scale.gaps() {
        let mid = (gap.x0 + gap.x1) / 2.0;
        let _ = writeln!(
            out,
            "<g class=\"break\"><rect x=\"{:.1}\" y=\"{top:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"#ffffff\" fill-opacity=\"0.35\"/>\
             <path d=\"M{:.1},{:.1}l5,-9M{:.1},{:.1}l5,-9M{:.1},{:.1}l5,-9M{:.1},{:.1}l5,-9\" stroke=\"#555\" stroke-width=\"1.4\"/></g>",
            gap.x0 + 3.0,
            gap.x1 - gap.x0 - 6.0,
            bottom - top,
            mid - 6.0,
            top + 9.0,
            mid,
            top + 9.0,
            mid - 6.0,
            bottom,
            mid,
            bottom,
        );
    }
}

/// Text cut into lines of at most `room` characters, at spaces (a longer word stands alone).
fn wrap_words(text: &str, room: usize) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for word in text.split(' ') {
        match lines.last_mut() {
            Some(line) if line.chars().count() + 1 + word.chars().count() <= room => {
                line.push(' ');
                line.push_str(word);
            }
            _ => lines.push(word.to_string()),
        }
    }
    lines
}

struct LaneAt {
    y: f64,
    height: f64,
    index: usize,
}

fn draw_lane(
    out: &mut String,
    part: &Part,
    lane: &Lane,
    at: LaneAt,
    scale: &Scale,
    labels: &Labels,
) {
    let LaneAt { y, height, index } = at;
    let kind = match lane.kind {
        LaneKind::Lock => "lock",
        LaneKind::Worker => "worker",
        LaneKind::Other => "other",
    };
    let _ = writeln!(
        out,
        "<g class=\"lane lane-{kind}\" data-lane=\"{}\">",
        escape(&lane.name)
    );
    if index % 2 == 0 {
        let _ = writeln!(
            out,
            "<rect x=\"10\" y=\"{y:.1}\" width=\"{}\" height=\"{height:.1}\" fill=\"#f4f4f4\"/>",
            WIDTH - 20.0
        );
    }
    let name = match lane.kind {
        LaneKind::Lock => format!("{} lock", lane.name),
        _ => lane.name.clone(),
    };
    // A long name (a lock's, `redis incr-lost lock`) is drawn smaller, to stay in its column.
    let size = (12.0f64).min((X0 - 16.0) / (name.chars().count() as f64 * 0.62));
    let _ = writeln!(
        out,
        "<text class=\"lane-name\" x=\"{}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"{INK}\" style=\"font-size:{size:.1}px\">{}</text>",
        X0 - 10.0,
        y + 13.0,
        escape(&name)
    );
    let mut overlap_labels: Vec<(f64, f64)> = Vec::new();
    for overlap in &lane.overlaps {
        let x = scale.x(overlap.from);
        let w = (scale.x(overlap.to) - x).max(2.0);
        let mut text = overlap_label(lane, overlap);
        // In its own lane, under the bars, beside the band (where [`lay_out_labels`] kept
        // room for it); one that would cover another's keeps its hover text only.
        let (label_x, label_end) = overlap_label_span(x + w, &text);
        if overlap_labels
            .iter()
            .any(|(a, b)| label_end > *a && label_x < *b)
        {
            text.clear();
        } else {
            overlap_labels.push((label_x, label_end));
        }
        let _ = writeln!(
            out,
            "<g class=\"overlap\"><title>{} at once for {} (+{} to +{}): each from its grant to its release</title>\
             <rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{BAD}\" fill-opacity=\"0.22\" \
             stroke=\"{BAD}\" stroke-width=\"1.5\" stroke-dasharray=\"4 2\"/>\
             <text class=\"lbl\" x=\"{:.1}\" y=\"{:.1}\" fill=\"{BAD}\" font-weight=\"bold\">{}</text></g>",
            escape(&overlap_label(lane, overlap)),
            seconds(overlap.to - overlap.from),
            seconds(overlap.from - part.start),
            seconds(overlap.to - part.start),
            y - 1.0,
            height + 2.0,
            label_x,
            y + lane_height(lane) + 9.0,
            escape(&text),
        );
    }
    for (i, bar) in lane.bars.iter().enumerate() {
        let place = labels.bars.get(i).and_then(Option::as_ref);
        let (color, ink) = HOLDERS[bar.color % HOLDERS.len()];
        let pattern = bar.color % HOLDERS.len();
        let by = y + 4.0 + ROW * bar.row as f64;
        let (x, w) = bar_extent(scale, bar);
        let _ = writeln!(
            out,
            "<g class=\"bar\" data-holder=\"{}\" data-from=\"{}\" data-to=\"{}\"><title>{} held the {} lock from +{} to +{} ({}): {}</title>\
             <rect class=\"held\" x=\"{x:.1}\" y=\"{by:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{color}\" rx=\"2\"/>",
            escape(&bar.holder),
            bar.from,
            bar.held_to,
            escape(&bar.holder),
            escape(&lane.name),
            seconds(bar.from - part.start),
            seconds(bar.held_to - part.start),
            seconds(bar.held_to - bar.from),
            escape(&bar.ended_by),
            ROW - 3.0,
        );
        if let Some(place) = place {
            let (fill, class) = match place.inside {
                true => (ink, ""),
                false => (INK, " class=\"lbl\""),
            };
            let _ = writeln!(
                out,
                "<text{class} x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"{fill}\">{}</text>",
                place.from + if place.inside { 3.0 } else { 0.0 },
                by + 9.0,
                escape(&place.text)
            );
        }
        if bar.open {
            let end = x + w;
            let _ = writeln!(
                out,
                "<path d=\"M{end:.1},{by:.1} l6,{:.1} l-6,{:.1}z\" fill=\"{color}\"/>",
                (ROW - 3.0) / 2.0,
                (ROW - 3.0) / 2.0
            );
        }
        out.push_str("</g>\n");
        if bar.believed_to > bar.held_to {
            let tx = x + w;
            let tw = (scale.x(bar.believed_to) - tx).max(1.0);
            let _ = writeln!(
                out,
                "<g class=\"believed\" data-holder=\"{}\"><title>{} still acted as the holder from +{} to +{}, after the backend had ended its lock</title>\
                 <rect x=\"{tx:.1}\" y=\"{by:.1}\" width=\"{tw:.1}\" height=\"{:.1}\" fill=\"url(#believed{pattern})\" \
                 stroke=\"{color}\" stroke-dasharray=\"3 2\"/></g>",
                escape(&bar.holder),
                escape(&bar.holder),
                seconds(bar.held_to - part.start),
                seconds(bar.believed_to - part.start),
                ROW - 3.0,
            );
        }
    }
    let xs = mark_xs(lane, scale);
    // A freeze's or held span's label where it fits, clear of the other spans and their
    // labels; else it keeps its hover text only (lab 9's stalls: a dozen freezes of 100ms
    // side by side).
    let starts: Vec<f64> = (lane.freezes.iter().chain(&lane.held))
        .map(|span| scale.x(span.from))
        .collect();
    let mut span_labels: Vec<(f64, f64)> = Vec::new();
    let mut span_label = |x: f64, text: &str| -> (f64, String) {
        let from = span_label_from(&xs, x);
        let to = from + text.chars().count() as f64 * LABEL_CHAR;
        let clear = span_labels
            .iter()
            .all(|(a, b)| to + 4.0 <= *a || from >= b + 4.0)
            && starts.iter().all(|start| *start <= x || *start >= to + 2.0);
        if to > WIDTH - 12.0 || !clear {
            return (from, String::new());
        }
        span_labels.push((from, to));
        (from, text.to_string())
    };
    for freeze in &lane.freezes {
        let x = scale.x(freeze.from);
        let w = (scale.x(freeze.to) - x).max(2.0);
        let text = format!(
            "frozen {}{}",
            seconds(freeze.to - freeze.from),
            if freeze.open {
                " (still at the end)"
            } else {
                ""
            }
        );
        let (label_x, shown) = span_label(x, &text);
        let _ = writeln!(
            out,
            "<g class=\"freeze\"><title>{} {} (SIGSTOP → SIGCONT)</title>\
             <rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"url(#freeze)\" stroke=\"{COLD}\"/>\
             <text class=\"lbl\" x=\"{:.1}\" y=\"{:.1}\" fill=\"{COLD}\" font-size=\"10\">{}</text></g>",
            escape(&lane.name),
            escape(&text),
            y + 3.0,
            height - 6.0,
            label_x,
            y + 12.5,
            escape(&shown),
        );
    }
    for span in &lane.held {
        let x = scale.x(span.from);
        let w = (scale.x(span.to) - x).max(2.0);
        let what = if span.what.is_empty() {
            "write held in flight"
        } else {
            span.what.as_str()
        };
        let text = format!(
            "{what} {}{}",
            seconds(span.to - span.from),
            if span.open { " (still at the end)" } else { "" }
        );
        let (label_x, shown) = span_label(x, &text);
        let _ = writeln!(
            out,
            "<g class=\"held\"><title>{}: the proxy's fault on its path from +{} to +{} ({})</title>\
             <rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"url(#held)\" stroke=\"{WARN}\"/>\
             <text class=\"lbl\" x=\"{:.1}\" y=\"{:.1}\" fill=\"#7a4f00\" font-size=\"10\">{}</text></g>",
            escape(&lane.name),
            seconds(span.from - part.start),
            seconds(span.to - part.start),
            escape(&text),
            y + 3.0,
            height - 6.0,
            label_x,
            y + 12.5,
            escape(&shown),
        );
    }
    draw_waits(out, part, lane, y + height - 2.5, scale);
    let mid = match lane.kind {
        LaneKind::Lock => y + 7.5,
        _ => y + LANE / 2.0,
    };
    // Label rows below the first: under a lock lane's bars, under a worker's marks.
    let first_extra = match lane.kind {
        LaneKind::Lock => lane_height(lane) - 7.5 + LABEL_ROW - 3.0,
        _ => LANE / 2.0 + LABEL_ROW - 1.0,
    };
    // Marks first, then their labels: a later mark must not cover an earlier one's label.
    for (mark, x) in lane.marks.iter().zip(&xs) {
        draw_mark(out, mark, (*x, mid), None);
    }
    for ((mark, place), x) in lane.marks.iter().zip(&labels.places).zip(&xs) {
        let dy = match place {
            Some((_, 0)) => 4.0,
            Some((_, row)) => first_extra + (row - 1) as f64 * LABEL_ROW,
            None => continue,
        };
        draw_mark(out, mark, (*x, mid), place.map(|(x, _)| (x, dy)));
    }
    out.push_str("</g>\n");
}

/// Where a freeze's or a held span's label starts: 10px into the span, or after the marks
/// drawn at its start (the pause, the fault, the grant side by side) — not under them.
fn span_label_from(xs: &[f64], span_x: f64) -> f64 {
    (xs.iter().copied())
        .filter(|x| *x >= span_x - 6.0 && *x <= span_x + 80.0)
        .map(|x| x + 8.0)
        .fold(span_x + 10.0, f64::max)
}

/// The height of one more row of labels.
const LABEL_ROW: f64 = 12.0;
/// Rows of labels a lane may take; a label that fits in none keeps only its hover text.
const LABEL_ROWS: usize = 4;

/// Where each mark's label goes on its lane: its x and its row (0: beside the mark).
struct Labels {
    places: Vec<Option<(f64, usize)>>,
    rows: usize,
    /// Where each of a lock lane's bars has its label ([`place_bar_labels`]).
    bars: Vec<Option<BarLabel>>,
}

impl Labels {
    fn extra_height(&self) -> f64 {
        self.rows.saturating_sub(1) as f64 * LABEL_ROW
    }
}

/// Where a "two holders" label goes, from the band's right end: after it, or, where that
/// would leave the drawing, ending at it.
fn overlap_label_span(band_end: f64, text: &str) -> (f64, f64) {
    let width = text.chars().count() as f64 * LABEL_CHAR;
    let from = if band_end + 4.0 + width > WIDTH - 12.0 {
        band_end - 2.0 - width
    } else {
        band_end + 4.0
    };
    (from, from + width)
}

/// "two holders: A (lock ended) and B": which of them the backend had already let go of
/// (chaos's text verdict counts two holders only from the backend's grants; this says which
/// kind of overlap the band is). On Redlock's quorum lane (lab 6) the words are its
/// verdict's: a majority granted twice within validity, or a holder acting past its
/// validity while another held the lock — which are not the same failure.
fn overlap_label(lane: &Lane, overlap: &super::drawing::Overlap) -> String {
    if lane.name == "redlock" {
        let names = overlap.holders.join(" and ");
        return match overlap.believing.as_slice() {
            [] => format!("granted twice within validity: {names}"),
            late => {
                let others: Vec<&str> = (overlap.holders.iter())
                    .filter(|h| !late.contains(h))
                    .map(String::as_str)
                    .collect();
                format!(
                    "{} acted past its validity while {} held it",
                    late.join(" and "),
                    others.join(" and ")
                )
            }
        };
    }
    let named: Vec<String> = (overlap.holders.iter())
        .map(|h| match overlap.believing.contains(h) {
            true => format!("{h} (lock ended)"),
            false => h.clone(),
        })
        .collect();
    format!("two holders: {}", named.join(" and "))
}

/// Lays a lane's labels out beside their marks, none over another: right of the mark, else
/// left of it, else the same on a row below. What strikes the eye (a stale write taken or
/// refused, a kill) is placed first; a label with no room keeps its hover text only.
fn lay_out_labels(lane: &Lane, scale: &Scale) -> Labels {
    let mut taken: Vec<Vec<(f64, f64)>> = vec![Vec::new(); LABEL_ROWS];
    let xs = mark_xs(lane, scale);
    for span in lane.freezes.iter().chain(&lane.held) {
        let x = span_label_from(&xs, scale.x(span.from));
        taken[0].push((x, x + 18.0 * LABEL_CHAR));
    }
    // A lock lane's "two holders" labels take the row under its bars.
    let mut rows = 1;
    for overlap in &lane.overlaps {
        let end = scale.x(overlap.to).max(scale.x(overlap.from) + 2.0);
        taken[1].push(overlap_label_span(end, &overlap_label(lane, overlap)));
        rows = 2;
    }
    // Nor a hold's bar on the lane's first row, nor that bar's label drawn beside it.
    let bar_labels = match lane.kind {
        LaneKind::Lock => place_bar_labels(lane, scale),
        _ => Vec::new(),
    };
    {
        for (bar, place) in lane.bars.iter().zip(&bar_labels) {
            if bar.row != 0 {
                continue;
            }
            let (x, w) = bar_extent(scale, bar);
            taken[0].push((x, scale.x(bar.believed_to).max(x + w)));
            if let Some(place) = place {
                taken[0].push((place.from, place.to));
            }
        }
    }
    // A label beside its mark must not cover another mark.
    for x in &xs {
        taken[0].push((x - 6.0, x + 6.0));
    }
    // Nor a wait's name (lab 10), drawn under the lane's start of waiting.
    // (The waits' line runs along the lane's foot: whichever row is lowest.)
    for (from, to) in wait_labels(lane, scale).into_iter().flatten() {
        for row in &mut taken {
            row.push((from, to));
        }
    }
    let mut order: Vec<usize> = (0..lane.marks.len())
        .filter(|&i| lane.marks[i].label.is_some())
        .collect();
    order.sort_by_key(|&i| {
        let urgent = matches!(lane.marks[i].tone, Tone::Bad | Tone::Good);
        (!urgent, lane.marks[i].t, i)
    });
    let mut places = vec![None; lane.marks.len()];
    for i in order {
        let mark = &lane.marks[i];
        let Some(label) = &mark.label else { continue };
        let x = xs[i];
        // Bold labels (a stale write, a kill) are wider than the plain ones.
        let per_char = match mark.tone {
            Tone::Bad | Tone::Good => BOLD_LABEL_CHAR,
            _ => LABEL_CHAR,
        };
        let width = label.chars().count() as f64 * per_char;
        let free = |from: f64, row: &[(f64, f64)]| {
            let to = from + width;
            from >= X0 - 6.0
                && to <= WIDTH - 12.0
                && row.iter().all(|(a, b)| to <= *a || from >= *b)
        };
        let place = (0..LABEL_ROWS).find_map(|row| {
            [x + 9.0, x - 9.0 - width]
                .into_iter()
                .find(|&from| free(from, &taken[row]))
                .map(|from| (from, row))
        });
        if let Some((from, row)) = place {
            taken[row].push((from, from + width));
            rows = rows.max(row + 1);
            places[i] = Some((from, row));
        }
    }
    Labels {
        places,
        rows,
        bars: bar_labels,
    }
}

/// A part's label as a heading: the scenario and the variant (or approach, mode) first,
/// then the rest in words: `fencing=false scenario=delayed-write` is `delayed-write, no
/// fencing`; `scenario=herd variant=redis_spin` is `herd redis_spin`.
pub(super) fn part_title(label: &str) -> String {
    let pairs: Vec<(&str, &str)> = label
        .split_whitespace()
        .map(|word| word.split_once('=').unwrap_or(("", word)))
        .collect();
    const NAMES: [&str; 5] = ["", "scenario", "variant", "approach", "mode"];
    let mut names: Vec<&str> = Vec::new();
    for key in NAMES {
        names.extend(pairs.iter().filter(|(k, _)| *k == key).map(|(_, v)| *v));
    }
    let rest = pairs
        .iter()
        .filter(|(key, _)| !NAMES.contains(key))
        .map(|(key, value)| match (*key, *value) {
            ("fencing", "true") => "fenced".to_string(),
            ("fencing", "false") => "no fencing".to_string(),
            (key, value) => format!("{} {value}", key.replace('_', " ")),
        });
    let title: Vec<String> = (!names.is_empty())
        .then(|| names.join(" "))
        .into_iter()
        .chain(rest)
        .collect();
    title.join(", ")
}

/// A run whose parts are every guard against every fault (lab 9's full run): drawn as a
/// grid of outcomes, a row per guard (`variant`) and a column per fault (`scenario`).
struct Grid<'a> {
    faults: Vec<&'a str>,
    guards: Vec<&'a str>,
    /// (fault, guard) → the part's index.
    cells: std::collections::HashMap<(&'a str, &'a str), usize>,
}

impl<'a> Grid<'a> {
    fn of(picture: &'a Picture) -> Option<Grid<'a>> {
        let mut faults: Vec<&str> = Vec::new();
        let mut guards: Vec<&str> = Vec::new();
        let mut cells = std::collections::HashMap::new();
        for (i, part) in picture.parts.iter().enumerate() {
            let value = |key: &str| {
                part.label
                    .split_whitespace()
                    .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
            };
            let (fault, guard) = (value("scenario")?, value("variant")?);
            if !faults.contains(&fault) {
                faults.push(fault);
            }
            if !guards.contains(&guard) {
                guards.push(guard);
            }
            cells.insert((fault, guard), i);
        }
        (faults.len() >= 3 && guards.len() >= 3).then_some(Grid {
            faults,
            guards,
            cells,
        })
    }
}

/// The grid's cell height and its row names' column.
const GRID_ROW: f64 = 17.0;
const GRID_NAMES: f64 = 150.0;

/// The grid: each cell the part's outcome in a word or two, coloured as its tone, and a
/// link to the part drawn below.
fn draw_grid(out: &mut String, grid: &Grid, picture: &Picture, top: f64) -> f64 {
    let cell_w = (WIDTH - 24.0 - GRID_NAMES) / grid.faults.len() as f64;
    let _ = write!(
        out,
        "<g class=\"grid\" font-size=\"11\"><text x=\"12\" y=\"{:.1}\" font-weight=\"bold\" fill=\"{INK}\">guard ↓ fault →</text>",
        top + 11.0
    );
    for (column, fault) in grid.faults.iter().enumerate() {
        let x = 12.0 + GRID_NAMES + column as f64 * cell_w;
        let _ = write!(
            out,
            "<text class=\"grid-fault\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-weight=\"bold\" fill=\"{INK}\">{}</text>",
            x + cell_w / 2.0,
            top + 11.0,
            escape(fault)
        );
    }
    for (row, guard) in grid.guards.iter().enumerate() {
        let y = top + GRID_ROW * (row + 1) as f64;
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-weight=\"bold\" fill=\"{INK}\">{}</text>",
            12.0 + GRID_NAMES - 8.0,
            y + 12.0,
            escape(guard)
        );
        for (column, fault) in grid.faults.iter().enumerate() {
            let x = 12.0 + GRID_NAMES + column as f64 * cell_w;
            let Some(&index) = grid.cells.get(&(*fault, *guard)) else {
                continue;
            };
            let part = &picture.parts[index];
            let (word, tone) = match &part.outcome {
                Some((text, tone)) => (text.split(" — ").next().unwrap_or(text), *tone),
                None => ("no late write", Tone::Plain),
            };
            let fill = match tone {
                Tone::Bad => "#f6d0bc",
                Tone::Good => "#c8eadf",
                Tone::Warn => "#fbe8c4",
                Tone::Cold | Tone::Plain => "#eeeeee",
            };
            let _ = write!(
                out,
                "<a href=\"#part-{index}\" class=\"cell\"><title>{}: {}</title>\
                 <rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{fill}\" stroke=\"#ffffff\"/>\
                 <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"{}\">{}</text></a>",
                escape(&part_title(&part.label)),
                escape(
                    part.outcome
                        .as_ref()
                        .map_or("no late write", |(t, _)| t.as_str())
                ),
                x + 1.0,
                cell_w - 2.0,
                GRID_ROW - 2.0,
                x + cell_w / 2.0,
                y + 12.0,
                tone_color(tone),
                escape(word)
            );
        }
    }
    out.push_str("</g>\n");
    top + GRID_ROW * (grid.guards.len() + 1) as f64 + 6.0
}

/// A queue's waits on a worker's lane (lab 10): a dashed line under the lane for each span
/// of waiting, named by whom it waited on; each ends where a watch woke the waiter.
fn draw_waits(out: &mut String, part: &Part, lane: &Lane, line_y: f64, scale: &Scale) {
    let places = wait_labels(lane, scale);
    for (wait, place) in lane.waits.iter().zip(places) {
        let x = scale.x(wait.from);
        let to = scale.x(wait.to).max(x + 2.0);
        let on = wait_name(wait);
        // Where the name has no room of its own, it keeps its hover text only.
        let (label_x, shown) = match place {
            Some((from, _)) => (from, on.as_str()),
            None => (x + 2.0, ""),
        };
        let _ = writeln!(
            out,
            "<g class=\"wait\"><title>{} waits {on} from +{} to +{}{}</title>\
             <line x1=\"{x:.1}\" y1=\"{line_y:.1}\" x2=\"{to:.1}\" y2=\"{line_y:.1}\" stroke=\"{COLD}\" \
             stroke-width=\"1.5\" stroke-dasharray=\"4 2\"/>\
             <text class=\"lbl\" x=\"{:.1}\" y=\"{:.1}\" fill=\"{COLD}\">{}</text></g>",
            escape(&lane.name),
            seconds(wait.from - part.start),
            seconds(wait.to - part.start),
            if wait.open { " (still at the end)" } else { "" },
            label_x,
            line_y - 1.5,
            escape(shown),
        );
    }
}

fn wait_name(wait: &super::waits::Wait) -> String {
    match &wait.on {
        Some(on) => format!("on {on}"),
        None => "on the lock".to_string(),
    }
}

/// Where each wait's name goes: at the wait's start, else just after a freeze's or a held
/// span's label it would run into, if that is still within the wait; else nowhere.
fn wait_labels(lane: &Lane, scale: &Scale) -> Vec<Option<(f64, f64)>> {
    let xs = mark_xs(lane, scale);
    let spans: Vec<(f64, f64)> = lane
        .freezes
        .iter()
        .chain(&lane.held)
        .map(|span| {
            let x = scale.x(span.from);
            (x - 2.0, span_label_from(&xs, x) + 18.0 * LABEL_CHAR)
        })
        .collect();
    let mut placed: Vec<(f64, f64)> = Vec::new();
    lane.waits
        .iter()
        .map(|wait| {
            let x = scale.x(wait.from);
            let to = scale.x(wait.to).max(x + 2.0);
            // Drawn in the labels' size (`.lbl`), so measured with their width per letter,
            // and a few pixels more: a wide letter (`W`) makes "on W1" longer than the
            // estimate.
            let width = wait_name(wait).chars().count() as f64 * LABEL_CHAR + 4.0;
            let clear = |from: f64, taken: &[(f64, f64)]| {
                taken.iter().all(|(a, b)| from + width <= *a || from >= *b)
            };
            let taken: Vec<(f64, f64)> = spans.iter().chain(&placed).copied().collect();
            let mut starts: Vec<f64> = taken
                .iter()
                .map(|(_, b)| b + 4.0)
                .filter(|from| *from > x + 2.0 && from + width <= to)
                .collect();
            starts.sort_by(f64::total_cmp);
            let from = std::iter::once(x + 2.0)
                .chain(starts)
                .find(|&from| clear(from, &taken))?;
            placed.push((from, from + width));
            Some((from, from + width))
        })
        .collect()
}

/// The stretches a lane's bars take, row by row, sorted by their start, with the furthest
/// end so far: whether a stretch is clear of every bar of a row is a binary search, so a
/// lane of 20,000 holds is laid out in a moment.
struct RowBars {
    /// Per row: (start, furthest end of the bars up to this one), by start.
    rows: std::collections::HashMap<usize, Vec<(f64, f64)>>,
}

impl RowBars {
    fn of(lane: &Lane, scale: &Scale) -> RowBars {
        let mut rows: std::collections::HashMap<usize, Vec<(f64, f64)>> = Default::default();
        for bar in &lane.bars {
            let (a, w) = bar_extent(scale, bar);
            let b = scale.x(bar.believed_to).max(a + w);
            rows.entry(bar.row).or_default().push((a, b));
        }
        for spans in rows.values_mut() {
            spans.sort_by(|x, y| x.0.total_cmp(&y.0));
            let mut furthest = f64::MIN;
            for span in spans.iter_mut() {
                furthest = furthest.max(span.1);
                span.1 = furthest;
            }
        }
        RowBars { rows }
    }

    /// Is `from..to` of `row` clear of its bars? (A bar's label drawn outside it must not
    /// cover the next one; without room it keeps its hover text.) The bar the label is for
    /// never counts: its label is left of its start or past its end.
    fn free(&self, row: usize, from: f64, to: f64) -> bool {
        let Some(spans) = self.rows.get(&row) else {
            return true;
        };
        let before = spans.partition_point(|(a, _)| *a < to);
        before == 0 || spans[before - 1].1 <= from
    }
}

/// The narrowest a hold is drawn: a hold of a few milliseconds is still a bar one can
/// see and point at, and its label then says how long it truly was.
pub(super) const MIN_BAR: f64 = 10.0;

/// Where a bar is drawn: its x and width, at least [`MIN_BAR`] wide.
fn bar_extent(scale: &Scale, bar: &Bar) -> (f64, f64) {
    let x = scale.x(bar.from);
    (x, (scale.x(bar.held_to) - x).max(MIN_BAR))
}

/// A bar's label and where it goes: inside the bar, else left of it, else after its end.
#[derive(Debug, Clone)]
pub(super) struct BarLabel {
    pub text: String,
    pub from: f64,
    pub to: f64,
    pub inside: bool,
}

/// Where each bar's label goes, none over another bar or another's label; a bar drawn
/// wider than its time (a few ms held) says its true length in its label.
pub(super) fn place_bar_labels(lane: &Lane, scale: &Scale) -> Vec<Option<BarLabel>> {
    let bars = RowBars::of(lane, scale);
    // Labels already drawn outside their bars, by row: one must not cover another.
    let mut outside: std::collections::HashMap<usize, Vec<(f64, f64)>> = Default::default();
    lane.bars
        .iter()
        .map(|bar| {
            let (x, w) = bar_extent(scale, bar);
            let true_width = scale.x(bar.held_to) - x;
            let text =
                if (true_width < MIN_BAR || scale.widened(bar.from, bar.held_to)) && !bar.open {
                    format!("{} · held {}ms", bar.label, bar.held_to - bar.from)
                } else {
                    bar.label.clone()
                };
            let width = text.chars().count() as f64 * 6.2;
            if width + 6.0 < w {
                return Some(BarLabel {
                    text,
                    from: x,
                    to: x + w,
                    inside: true,
                });
            }
            let left = x - 3.0 - width;
            let after = scale.x(bar.believed_to).max(x + w) + 4.0;
            let row = outside.entry(bar.row).or_default();
            let fits = |from: f64, to: f64, row: &[(f64, f64)]| {
                from > X0 - 4.0
                    && to < WIDTH - 12.0
                    && bars.free(bar.row, from, to)
                    && row.iter().all(|(a, b)| to <= *a || from >= *b)
            };
            // Left of it first, then after its end (after its believed tail).
            let from = [left, after]
                .into_iter()
                .find(|&from| fits(from, from + width, row))?;
            row.push((from, from + width));
            Some(BarLabel {
                text,
                from,
                to: from + width,
                inside: false,
            })
        })
        .collect()
}

fn tone_color(tone: Tone) -> &'static str {
    match tone {
        Tone::Plain => INK,
        Tone::Bad => BAD,
        Tone::Good => GOOD,
        Tone::Warn => WARN,
        Tone::Cold => COLD,
    }
}

fn shape_svg(shape: Shape, tone: Tone, big: bool) -> String {
    let color = tone_color(tone);
    match shape {
        Shape::Write if big => format!(
            "<path d=\"M0,-7L7,0L0,7L-7,0Z\" fill=\"{color}\" stroke=\"#000\" stroke-width=\"1.2\"/>"
        ),
        Shape::Write => format!("<path d=\"M0,-5L5,0L0,5L-5,0Z\" fill=\"{color}\"/>"),
        Shape::Kill => format!(
            "<path d=\"M-5,-5L5,5M5,-5L-5,5\" stroke=\"{color}\" stroke-width=\"2.8\" stroke-linecap=\"round\"/>"
        ),
        Shape::Freeze => format!(
            "<rect x=\"-3.5\" y=\"-3.5\" width=\"7\" height=\"7\" fill=\"#56B4E9\" stroke=\"{color}\"/>"
        ),
        Shape::Resume => format!("<path d=\"M-3,-5L4,0L-3,5Z\" fill=\"{color}\"/>"),
        Shape::Expire => format!(
            "<path d=\"M-4,-5H4L-4,5H4Z\" fill=\"{color}\" stroke=\"#7a4f00\" stroke-width=\"0.8\"/>"
        ),
        Shape::Grant => format!("<path d=\"M-4,4L0,-4L4,4Z\" fill=\"{color}\"/>"),
        Shape::Release => format!(
            "<path d=\"M-4,-4L0,4L4,-4Z\" fill=\"#fff\" stroke=\"{color}\" stroke-width=\"1.2\"/>"
        ),
        Shape::Tick => format!("<circle r=\"3\" fill=\"{color}\"/>"),
    }
}

/// A mark drawn at `(x, y)`; with `label_at` (the label's x and its row below), only its
/// label.
fn draw_mark(out: &mut String, mark: &Mark, (x, y): (f64, f64), label_at: Option<(f64, f64)>) {
    let big =
        mark.shape == Shape::Write && matches!(mark.tone, Tone::Bad | Tone::Good | Tone::Warn);
    if label_at.is_none() {
        let _ = write!(
            out,
            "<g class=\"ev k-{}\" data-i=\"{}\" data-t=\"{}\" transform=\"translate({x:.1},{y:.1})\"><title>{}</title>{}",
            escape(&mark.kind),
            mark.index,
            mark.t,
            escape(&mark.tip),
            shape_svg(mark.shape, mark.tone, big)
        );
    } else {
        let _ = write!(
            out,
            "<g class=\"mark-label\" data-i=\"{}\" transform=\"translate({x:.1},{y:.1})\">",
            mark.index
        );
    }
    if let (Some(label), Some((start, dy))) = (&mark.label, label_at) {
        let weight = if matches!(mark.tone, Tone::Bad | Tone::Good) {
            " font-weight=\"bold\""
        } else {
            ""
        };
        let _ = write!(
            out,
            "<text class=\"lbl\" x=\"{:.1}\" y=\"{dy:.1}\" fill=\"{}\"{weight}>{}</text>",
            start - x,
            tone_color(mark.tone),
            escape(label)
        );
    }
    out.push_str("</g>\n");
}

/// The verdict under the drawing: the lab's table (from the JSON) or its printed lines.
fn draw_verdict(out: &mut String, verdict: &Verdict, top: f64) -> f64 {
    let _ = writeln!(
        out,
        "<text x=\"12\" y=\"{top:.1}\" font-size=\"14\" font-weight=\"bold\" fill=\"{INK}\">Verdict</text>"
    );
    let mut y = top + 18.0;
    let lines: Vec<String> = match verdict {
        Verdict::Table { header, rows } => text_table(header, rows),
        Verdict::Text(lines) => lines.clone(),
        Verdict::Findings {
            lines,
            header,
            rows,
            named,
        } => {
            let marked: Vec<Vec<String>> = rows
                .iter()
                .zip(named)
                .map(|(row, named)| {
                    let mut row = row.clone();
                    if *named {
                        row[0] = format!("▶ {}", row[0]);
                    }
                    row
                })
                .collect();
            let mut all = lines.clone();
            all.push(String::new());
            all.extend(text_table(header, &marked));
            all
        }
        Verdict::Missing => vec!["(no verdict: the run did not finish)".to_string()],
    };
    let _ = writeln!(out, "<g class=\"verdict mono\" fill=\"{INK}\">");
    for line in lines {
        let _ = writeln!(
            out,
            "<text x=\"12\" y=\"{y:.1}\" xml:space=\"preserve\">{}</text>",
            escape(&line)
        );
        y += 14.0;
    }
    out.push_str("</g>\n");
    y
}

/// The table as monospace lines that fit the drawing's width: long cells are shortened.
fn text_table(header: &[String], rows: &[Vec<String>]) -> Vec<String> {
    let budget = ((WIDTH - 24.0) / MONO_CHAR) as usize;
    let columns = header.len();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate().take(columns) {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    if columns > 1 {
        let fixed = widths[0] + 2;
        let each = budget.saturating_sub(fixed) / (columns - 1);
        for width in widths.iter_mut().skip(1) {
            *width = (*width).min(each.saturating_sub(2)).max(4);
        }
    }
    let fit = |text: &str, width: usize| -> String {
        let count = text.chars().count();
        if count > width {
            text.chars()
                .take(width.saturating_sub(1))
                .collect::<String>()
                + "…"
        } else {
            format!("{text}{}", " ".repeat(width - count))
        }
    };
    let render = |cells: &[String]| -> String {
        cells
            .iter()
            .enumerate()
            .map(|(i, cell)| fit(cell, widths[i]))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut lines = vec![render(header)];
    lines.push("─".repeat(widths.iter().sum::<usize>() + 2 * (columns.saturating_sub(1))));
    for row in rows {
        lines.push(render(row));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::picture::drawing::{Lane, LaneKind, Mark, Shape, Tone};

    fn bar(holder: &str, from: u64, to: u64) -> Bar {
        Bar {
            row: 0,
            holder: holder.into(),
            label: holder.into(),
            from,
            held_to: to,
            believed_to: to,
            open: false,
            ended_by: String::new(),
            color: 0,
        }
    }

    fn mark(t: u64, label: &str) -> Mark {
        Mark {
            index: 0,
            t,
            kind: "expired".into(),
            shape: Shape::Expire,
            tone: Tone::Warn,
            label: Some(label.into()),
            tip: String::new(),
        }
    }

    /// Lab 8's B: a hold of 3ms in a part of 10s was a 3px sliver; it is drawn at least
    /// MIN_BAR wide, and its label says how long it truly was.
    #[test]
    fn a_hold_of_a_few_ms_is_drawn_wide_enough_and_says_its_length() {
        // Events every second: nothing to squeeze, one scale of 0.108px per ms.
        let times: Vec<u64> = (0..=10).map(|s| s * 1000).chain([5_003]).collect();
        let scale = Scale::of(&times, 0, 10_000, X0, X1);
        let mut lane = Lane::new("redis", LaneKind::Lock);
        lane.rows.push("B".into());
        lane.bars.push(bar("B", 5_000, 5_003));
        let (_, width) = bar_extent(&scale, &lane.bars[0]);
        assert!(width >= MIN_BAR, "drawn {width:.1}px wide");
        let label = place_bar_labels(&lane, &scale)[0].clone().expect("a label");
        assert!(label.text.contains("held 3ms"), "{label:?}");
    }

    /// Lab 2: A's grant and A's kill in the same millisecond were drawn on the same spot.
    #[test]
    fn marks_of_one_lane_at_one_millisecond_are_side_by_side_in_their_order() {
        let mut lane = Lane::new("A", LaneKind::Worker);
        lane.marks
            .extend([mark(5, "granted"), mark(5, "kill A"), mark(900, "gave up")]);
        let scale = Scale::of(&[0, 5, 900, 1000], 0, 1000, X0, X1);
        let xs = mark_xs(&lane, &scale);
        // A mark is ~9px wide: the second must not cover the first.
        assert!(xs[1] - xs[0] >= 9.0, "{xs:?}");
        assert_eq!(xs[2], scale.x(900));
    }

    /// A backend's mark on a lock lane (an expiry) is labelled beside it: the label must not
    /// be drawn over the bar on the lane's first row, nor over that bar's own label.
    #[test]
    fn a_marks_label_on_a_lock_lane_keeps_off_the_bars_and_their_labels() {
        let times: Vec<u64> = (0..=10).map(|i| i * 100).collect();
        let scale = Scale::of(&times, 0, 1_000, X0, X1);
        let mut lane = Lane::new("redis", LaneKind::Lock);
        lane.rows.push("A".into());
        lane.bars.push(bar("A", 100, 600));
        lane.marks.push(mark(350, "the key expired on the server"));
        let labels = lay_out_labels(&lane, &scale);
        let (from, row) = labels.places[0].expect("the label is placed");
        let to = from + "the key expired on the server".chars().count() as f64 * LABEL_CHAR;
        let (x, w) = bar_extent(&scale, &lane.bars[0]);
        let on_bar = row == 0 && from < x + w && to > x;
        assert!(
            !on_bar,
            "label {from:.0}..{to:.0} on row {row} covers the bar {x:.0}..{:.0}",
            x + w
        );
        for place in place_bar_labels(&lane, &scale).into_iter().flatten() {
            let covers = row == 0 && from < place.to && to > place.from;
            assert!(!covers, "covers the bar's label {place:?}");
        }
    }

    #[test]
    fn a_parts_heading_reads_as_words() {
        assert_eq!(
            part_title("fencing=false scenario=delayed-write"),
            "delayed-write, no fencing"
        );
        assert_eq!(
            part_title("scenario=herd variant=redis_spin"),
            "herd redis_spin"
        );
        assert_eq!(
            part_title("approach=redis-lock workers=10"),
            "redis-lock, workers 10"
        );
    }
}
