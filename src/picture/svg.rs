//! The drawing, as SVG: one band per part on one time scale, lanes inside each band.
//!
//! Colours follow the terminal's meanings on a light background, from the Okabe–Ito
//! palette (told apart with the common colour-vision deficiencies): vermillion for what went
//! wrong (a stale write taken, a kill, two holders), bluish green for a stale write refused,
//! blue hatching for a freeze, orange for an expiry.

use std::fmt::Write;

use super::drawing::{Bar, Lane, LaneKind, Mark, Part, Picture, Shape, Tone, Verdict};
use super::escape;

pub const WIDTH: f64 = 1280.0;
const X0: f64 = 150.0;
const X1: f64 = 1230.0;
const LANE: f64 = 17.0;
const ROW: f64 = 13.0;
const PART_HEAD: f64 = 20.0;
/// About how wide an 11px label is per character.
const LABEL_CHAR: f64 = 6.3;
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

struct Scale {
    per_ms: f64,
}

impl Scale {
    fn x(&self, part: &Part, t: u64) -> f64 {
        X0 + (t.saturating_sub(part.start)) as f64 * self.per_ms
    }
}

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
    let scale = Scale {
        per_ms: (X1 - X0) / picture.span_ms as f64,
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<rect width=\"{WIDTH}\" height=\"100%\" fill=\"#ffffff\"/>\n\
         <text x=\"12\" y=\"26\" font-size=\"20\" font-weight=\"bold\" fill=\"{INK}\">{}</text>",
        escape(&picture.title)
    );
    let mut y = 46.0;
    for line in &picture.settings {
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
    if !outcomes.is_empty() {
        // What each part came to, first, where a projector shows it without scrolling; as
        // many lines as the parts need (lab 9 has two dozen).
        let names: Vec<String> = outcomes
            .iter()
            .map(|(part, _)| short_part_name(&part.label))
            .collect();
        let mut used = 0.0;
        for (i, (part, (text, tone))) in outcomes.iter().enumerate() {
            let verdict = text.split(" — ").next().unwrap_or(text);
            // Parts one word cannot tell apart (lab 10's three `herd` queues) get every value.
            let name = if names.iter().filter(|n| **n == names[i]).count() > 1 {
                part_values(&part.label)
            } else {
                names[i].clone()
            };
            let wide = (name.chars().count() + verdict.chars().count() + 4) as f64 * 7.8;
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
                "{}<tspan font-weight=\"bold\">{}</tspan> <tspan fill=\"{}\" font-weight=\"bold\">{}</tspan>",
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
    out.push_str(&legend(y, picture));
    y += 26.0;
    let step = tick_step(picture.span_ms, scale.per_ms);
    out.push_str(&axis(y, picture.span_ms, step, &scale));
    y += 8.0;
    for part in &picture.parts {
        y = draw_part(&mut out, part, y, &scale, step, picture.span_ms);
        y += 8.0;
    }
    out.push_str(&axis(y + 10.0, picture.span_ms, step, &scale));
    y += 24.0;
    if with_verdict {
        y = draw_verdict(&mut out, &picture.verdict, y + 10.0);
    }
    (out, y + 12.0)
}

/// The legend: only what this picture draws (a challenge has no "two holders" band).
fn legend(y: f64, picture: &Picture) -> String {
    let lanes = || picture.parts.iter().flat_map(|part| &part.lanes);
    let bars = || lanes().flat_map(|lane| &lane.bars);
    let marks = || lanes().flat_map(|lane| &lane.marks);
    let has = |shape: Shape| marks().any(|m| m.shape == shape);
    let writes = |tone: Tone| {
        marks().any(|m| m.shape == Shape::Write && m.tone == tone && m.label.is_some())
    };
    let mut out = format!("<g class=\"legend\" transform=\"translate(12,{y})\" font-size=\"11\">");
    let mut x = 0.0;
    let mut item = |shown: bool, swatch: String, text: &str| {
        if !shown {
            return;
        }
        let _ = write!(
            out,
            "<g transform=\"translate({x},0)\">{swatch}<text x=\"22\" y=\"10\" fill=\"{INK}\">{}</text></g>",
            escape(text)
        );
        x += 30.0 + text.chars().count() as f64 * 6.0;
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
        "bytes held by the proxy",
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
    out
}

/// Seconds between ticks: the first round step that leaves 70px between labels.
fn tick_step(span_ms: u64, per_ms: f64) -> u64 {
    let steps = [
        100, 200, 250, 500, 1000, 2000, 5000, 10_000, 15_000, 30_000, 60_000, 300_000, 900_000,
        3_600_000,
    ];
    steps
        .iter()
        .copied()
        .find(|step| *step as f64 * per_ms >= 70.0)
        .unwrap_or_else(|| span_ms.max(1))
}

fn axis(y: f64, span_ms: u64, step: u64, scale: &Scale) -> String {
    let mut out = format!(
        "<g class=\"axis\"><text x=\"{}\" y=\"{y}\" text-anchor=\"end\">time in each part</text>",
        X0 - 24.0
    );
    let mut t = 0;
    while t <= span_ms + step / 2 {
        let x = X0 + t as f64 * scale.per_ms;
        let label = if step.is_multiple_of(1000) {
            format!("+{}s", t / 1000)
        } else {
            format!("+{:.1}s", t as f64 / 1000.0)
        };
        let _ = write!(
            out,
            "<text x=\"{x:.1}\" y=\"{y}\" text-anchor=\"middle\">{label}</text>"
        );
        t += step;
    }
    out.push_str("</g>\n");
    out
}

fn draw_part(
    out: &mut String,
    part: &Part,
    top: f64,
    scale: &Scale,
    step: u64,
    span_ms: u64,
) -> f64 {
    let layouts: Vec<Labels> = part
        .lanes
        .iter()
        .map(|lane| lay_out_labels(part, lane, scale))
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
        part.label.replace('=', ": ")
    };
    // The outcome after the heading and its times, wrapped to the drawing's width.
    let outcome_x = 12.0 + heading.chars().count() as f64 * 8.4 + 24.0 + 40.0 * LABEL_CHAR;
    let room = ((WIDTH - 16.0 - outcome_x) / 7.6).max(8.0) as usize;
    let outcome_lines = part
        .outcome
        .as_ref()
        .map(|(text, _)| wrap_words(text, room))
        .unwrap_or_default();
    let head = PART_HEAD + outcome_lines.len().saturating_sub(1) as f64 * 15.0;
    let bottom = top + head + lanes_height;
    let _ = writeln!(
        out,
        "<g class=\"part\" data-part=\"{}\">\n<rect x=\"6\" y=\"{top}\" width=\"{}\" height=\"{:.1}\" fill=\"none\" stroke=\"#bbbbbb\" rx=\"4\"/>",
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
    // Grid.
    let mut t = 0;
    while t <= span_ms {
        let x = X0 + t as f64 * scale.per_ms;
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{bottom:.1}\" stroke=\"#e3e3e3\"/>",
            top + head
        );
        t += step;
    }
    out.push('\n');
    let mut y = top + head;
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
    out.push_str("</g>\n");
    bottom
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
        let x = scale.x(part, overlap.from);
        let w = (scale.x(part, overlap.to) - x).max(2.0);
        let mut text = overlap_label(overlap);
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
            escape(&overlap_label(overlap)),
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
    // Labels drawn outside their bars, by row: one must not cover another.
    let mut outside: Vec<(usize, f64, f64)> = Vec::new();
    let clear_of = |outside: &[(usize, f64, f64)], row: usize, from: f64, to: f64| {
        outside
            .iter()
            .all(|(r, a, b)| *r != row || to <= *a || from >= *b)
    };
    for bar in &lane.bars {
        let (color, ink) = HOLDERS[bar.color % HOLDERS.len()];
        let pattern = bar.color % HOLDERS.len();
        let by = y + 4.0 + ROW * bar.row as f64;
        let x = scale.x(part, bar.from);
        let w = (scale.x(part, bar.held_to) - x).max(2.0);
        let _ = writeln!(
            out,
            "<g class=\"bar\" data-holder=\"{}\" data-from=\"{}\" data-to=\"{}\"><title>{} held the {} lock from +{} to +{}: {}</title>\
             <rect class=\"held\" x=\"{x:.1}\" y=\"{by:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{color}\" rx=\"2\"/>",
            escape(&bar.holder),
            bar.from,
            bar.held_to,
            escape(&bar.holder),
            escape(&lane.name),
            seconds(bar.from - part.start),
            seconds(bar.held_to - part.start),
            escape(&bar.ended_by),
            ROW - 3.0,
        );
        let label_width = bar.label.chars().count() as f64 * 6.2;
        if label_width + 6.0 < w {
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"{ink}\">{}</text>",
                x + 3.0,
                by + 9.0,
                escape(&bar.label)
            );
        } else if x - 3.0 - label_width > X0 - 4.0
            && free_between(lane, bar, x - 3.0 - label_width, x, part, scale)
            && clear_of(&outside, bar.row, x - 3.0 - label_width, x)
        {
            outside.push((bar.row, x - 3.0 - label_width, x));
            let _ = writeln!(
                out,
                "<text class=\"lbl\" x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\" fill=\"{INK}\">{}</text>",
                x - 3.0,
                by + 9.0,
                escape(&bar.label)
            );
        } else if let after = scale.x(part, bar.believed_to).max(x + w) + 4.0
            && free_between(lane, bar, after, after + label_width, part, scale)
            && clear_of(&outside, bar.row, after, after + label_width)
        {
            outside.push((bar.row, after, after + label_width));
            // No room left of it without running into the lane's name: after its end.
            let _ = writeln!(
                out,
                "<text class=\"lbl\" x=\"{after:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"{INK}\">{}</text>",
                by + 9.0,
                escape(&bar.label)
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
            let tw = (scale.x(part, bar.believed_to) - tx).max(1.0);
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
    for freeze in &lane.freezes {
        let x = scale.x(part, freeze.from);
        let w = (scale.x(part, freeze.to) - x).max(2.0);
        let text = format!(
            "frozen {}{}",
            seconds(freeze.to - freeze.from),
            if freeze.open {
                " (still at the end)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "<g class=\"freeze\"><title>{} {} (SIGSTOP → SIGCONT)</title>\
             <rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"url(#freeze)\" stroke=\"{COLD}\"/>\
             <text class=\"lbl\" x=\"{:.1}\" y=\"{:.1}\" fill=\"{COLD}\" font-size=\"10\">{}</text></g>",
            escape(&lane.name),
            escape(&text),
            y + 3.0,
            height - 6.0,
            x + 10.0,
            y + 12.5,
            escape(&text),
        );
    }
    for span in &lane.held {
        let x = scale.x(part, span.from);
        let w = (scale.x(part, span.to) - x).max(2.0);
        let text = format!(
            "bytes held {}{}",
            seconds(span.to - span.from),
            if span.open { " (still at the end)" } else { "" }
        );
        let _ = writeln!(
            out,
            "<g class=\"held\"><title>{}: the proxy held its bytes to the server from +{} to +{} ({})</title>\
             <rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"url(#held)\" stroke=\"{WARN}\"/>\
             <text class=\"lbl\" x=\"{:.1}\" y=\"{:.1}\" fill=\"#7a4f00\" font-size=\"10\">{}</text></g>",
            escape(&lane.name),
            seconds(span.from - part.start),
            seconds(span.to - part.start),
            escape(&text),
            y + 3.0,
            height - 6.0,
            x + 10.0,
            y + 12.5,
            escape(&text),
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
    for mark in &lane.marks {
        draw_mark(out, part, mark, mid, scale, None);
    }
    for (mark, place) in lane.marks.iter().zip(&labels.places) {
        let dy = match place {
            Some((_, 0)) => 4.0,
            Some((_, row)) => first_extra + (row - 1) as f64 * LABEL_ROW,
            None => continue,
        };
        draw_mark(out, part, mark, mid, scale, place.map(|(x, _)| (x, dy)));
    }
    out.push_str("</g>\n");
}

/// The height of one more row of labels.
const LABEL_ROW: f64 = 12.0;
/// Rows of labels a lane may take; a label that fits in none keeps only its hover text.
const LABEL_ROWS: usize = 4;

/// Where each mark's label goes on its lane: its x and its row (0: beside the mark).
struct Labels {
    places: Vec<Option<(f64, usize)>>,
    rows: usize,
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
/// kind of overlap the band is).
fn overlap_label(overlap: &super::drawing::Overlap) -> String {
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
fn lay_out_labels(part: &Part, lane: &Lane, scale: &Scale) -> Labels {
    let mut taken: Vec<Vec<(f64, f64)>> = vec![Vec::new(); LABEL_ROWS];
    for span in lane.freezes.iter().chain(&lane.held) {
        let x = scale.x(part, span.from) + 10.0;
        taken[0].push((x, x + 18.0 * LABEL_CHAR));
    }
    // A lock lane's "two holders" labels take the row under its bars.
    let mut rows = 1;
    for overlap in &lane.overlaps {
        let end = scale
            .x(part, overlap.to)
            .max(scale.x(part, overlap.from) + 2.0);
        taken[1].push(overlap_label_span(end, &overlap_label(overlap)));
        rows = 2;
    }
    // A label beside its mark must not cover another mark.
    for mark in &lane.marks {
        let x = scale.x(part, mark.t);
        taken[0].push((x - 6.0, x + 6.0));
    }
    // Nor a wait's name (lab 10), drawn under the lane's start of waiting.
    // (The waits' line runs along the lane's foot: whichever row is lowest.)
    for (from, to) in wait_labels(part, lane, scale).into_iter().flatten() {
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
        let x = scale.x(part, mark.t);
        let width = label.chars().count() as f64 * LABEL_CHAR;
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
    Labels { places, rows }
}

/// A part's label as the outcomes' line names it: `approach=redis-lock workers=10` is
/// `redis-lock`.
fn short_part_name(label: &str) -> String {
    let first = label.split_whitespace().next().unwrap_or(label);
    match first.split_once('=') {
        // `fencing=false` alone says nothing: `fencing false`.
        Some((key, value @ ("true" | "false"))) => format!("{key} {value}"),
        Some((_, value)) => value.to_string(),
        None => first.to_string(),
    }
}

/// Every value of a part's label: `scenario=herd variant=redis_spin` is `herd redis_spin`.
fn part_values(label: &str) -> String {
    label
        .split_whitespace()
        .map(|word| word.split_once('=').map_or(word, |(_, value)| value))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A queue's waits on a worker's lane (lab 10): a dashed line under the lane for each span
/// of waiting, named by whom it waited on; each ends where a watch woke the waiter.
fn draw_waits(out: &mut String, part: &Part, lane: &Lane, line_y: f64, scale: &Scale) {
    let places = wait_labels(part, lane, scale);
    for (wait, place) in lane.waits.iter().zip(places) {
        let x = scale.x(part, wait.from);
        let to = scale.x(part, wait.to).max(x + 2.0);
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
             <text class=\"lbl\" x=\"{:.1}\" y=\"{:.1}\" fill=\"{COLD}\" font-size=\"8\">{}</text></g>",
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
fn wait_labels(part: &Part, lane: &Lane, scale: &Scale) -> Vec<Option<(f64, f64)>> {
    let spans: Vec<(f64, f64)> = lane
        .freezes
        .iter()
        .chain(&lane.held)
        .map(|span| {
            let x = scale.x(part, span.from);
            (x - 2.0, x + 10.0 + 18.0 * LABEL_CHAR)
        })
        .collect();
    let mut placed: Vec<(f64, f64)> = Vec::new();
    lane.waits
        .iter()
        .map(|wait| {
            let x = scale.x(part, wait.from);
            let to = scale.x(part, wait.to).max(x + 2.0);
            let width = wait_name(wait).chars().count() as f64 * 4.8;
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

/// Is the stretch `from..to` of `bar`'s row clear of the row's other bars? (A bar's label
/// drawn outside it must not cover the next one; without room it keeps its hover text.)
fn free_between(lane: &Lane, bar: &Bar, from: f64, to: f64, part: &Part, scale: &Scale) -> bool {
    lane.bars
        .iter()
        .filter(|other| other.row == bar.row && other.from != bar.from)
        .all(|other| {
            let a = scale.x(part, other.from);
            let b = scale.x(part, other.believed_to).max(a + 2.0);
            to <= a || from >= b
        })
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

fn draw_mark(
    out: &mut String,
    part: &Part,
    mark: &Mark,
    y: f64,
    scale: &Scale,
    label_at: Option<(f64, f64)>,
) {
    let x = scale.x(part, mark.t);
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
