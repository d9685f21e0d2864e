//! What a picture is made of: parts, lanes, lock bars, spans, marks and the verdict under
//! them. [`super::model`] builds them from a run's events (and [`super::masters`] Redlock's
//! master lanes); [`super::svg`] and [`super::html`] draw them. Nothing here reads an event.

/// A whole drawing.
#[derive(Debug)]
pub struct Picture {
    pub title: String,
    pub settings: Vec<String>,
    pub parts: Vec<Part>,
    /// The longest part, in ms: every part is drawn on this one scale.
    pub span_ms: u64,
    pub verdict: Verdict,
    pub event_count: usize,
    /// Said above the drawing when lockslab itself was paused during the run.
    pub disturbed: Option<String>,
}

/// One run of the lab (`fencing=false`, `scenario=kill`…): a band of lanes on its own clock.
#[derive(Debug)]
pub struct Part {
    pub label: String,
    /// The first and last event's `t_ms`: the part is drawn from `start`.
    pub start: u64,
    pub end: u64,
    pub lanes: Vec<Lane>,
    /// How the part came out, as the checker's findings on its store say it (a late write
    /// taken or refused, the tables' jobs each done once or not), or a queue's order and
    /// cost: drawn beside the part's heading.
    pub outcome: Option<(String, Tone)>,
    /// Faults that cut hosts from hosts or stall a server: drawn as bands over the part.
    pub bands: Vec<Band>,
}

/// A fault on the network or a server, over a stretch of a part: which hosts were cut from
/// which (a partition), or which server stood still (a leader's stall), from when to when.
#[derive(Debug, Clone, PartialEq)]
pub struct Band {
    pub from: u64,
    pub to: u64,
    /// Not healed when the part ended.
    pub open: bool,
    /// What it was, in words: `partition: a cut off from m4, m5`.
    pub text: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneKind {
    /// A backend's lock (bars, one row per holder) and the backend's own events.
    Lock,
    Worker,
    /// The lab, the store, anything else.
    Other,
}

#[derive(Debug)]
pub struct Lane {
    pub name: String,
    pub kind: LaneKind,
    /// Lock lanes: one row per holder (or held job).
    pub rows: Vec<String>,
    pub bars: Vec<Bar>,
    pub overlaps: Vec<Overlap>,
    pub freezes: Vec<Span>,
    /// Worker lanes: where a proxy held the worker's bytes (`net_fault` to `net_healed`).
    pub held: Vec<Span>,
    pub marks: Vec<Mark>,
    /// Worker lanes in a queue: whom it waited on, and when each watch woke it (lab 10).
    pub waits: Vec<super::waits::Wait>,
}

/// A lock held, as the backend says (`from`..`held_to`), and believed held after that
/// (`held_to`..`believed_to`).
#[derive(Debug, Clone)]
pub struct Bar {
    pub row: usize,
    pub holder: String,
    pub label: String,
    pub from: u64,
    pub held_to: u64,
    pub believed_to: u64,
    /// No end was seen before the part ended: still held at the end.
    pub open: bool,
    /// What ended it, in words, for the hover text.
    pub ended_by: String,
    pub color: usize,
}

/// Two holders at once on one lock, as the run's verdict found them, drawn where both acted
/// as its holder, each from its grant to its release or death — lab 1's "two holders at
/// once". [`overlaps_where`] offers the places; the verdict decides which are drawn.
#[derive(Debug, Clone)]
pub struct Overlap {
    pub from: u64,
    pub to: u64,
    pub holders: Vec<String>,
    /// The holders whose lock the backend had already ended when the overlap began: they
    /// only believed they held it. Empty: the backend's own grants overlapped (a lock
    /// service that granted twice: a Redis restarted empty, a failover).
    pub believing: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Span {
    pub from: u64,
    pub to: u64,
    pub open: bool,
    /// What the span was, in words, where a lane's spans differ (a proxy's cut, hold or
    /// lost reply); empty for a freeze.
    pub what: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Write,
    Kill,
    Freeze,
    Resume,
    Expire,
    Grant,
    Release,
    Tick,
}

/// How a mark should strike the eye (the terminal's colour meanings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tone {
    Plain,
    /// Red in the terminal: a stale write taken, a kill, two holders.
    Bad,
    /// Green in the terminal: a stale write refused.
    Good,
    Warn,
    Cold,
}

/// One event, drawn.
#[derive(Debug, Clone)]
pub struct Mark {
    /// Its position in the run's events: one mark per event.
    pub index: usize,
    pub t: u64,
    pub kind: String,
    pub shape: Shape,
    pub tone: Tone,
    pub label: Option<String>,
    pub tip: String,
}

/// The verdict under the drawing.
#[derive(Debug)]
pub enum Verdict {
    Table {
        header: Vec<String>,
        rows: Vec<Vec<String>>,
    },
    Text(Vec<String>),
    /// A challenge's: PASS or FAIL and its findings as the terminal prints them, then the
    /// database's log of changes, those a finding names marked.
    Findings {
        lines: Vec<String>,
        header: Vec<String>,
        rows: Vec<Vec<String>>,
        named: Vec<bool>,
    },
    Missing,
}

impl Lane {
    pub(super) fn new(name: &str, kind: LaneKind) -> Lane {
        Lane {
            name: name.to_string(),
            kind,
            rows: Vec::new(),
            bars: Vec::new(),
            overlaps: Vec::new(),
            freezes: Vec::new(),
            held: Vec::new(),
            marks: Vec::new(),
            waits: Vec::new(),
        }
    }
}

/// The most pairs of bars [`overlaps_where`] compares on one lane: far above any lab run's, a bound
/// for files that were not written by one.
const MOST_PAIRS: usize = 1_000_000;

/// Where two holders of one lock act at once, each from its grant to its release or death,
/// for bars of which `same_lock(i, j)` says which are on one lock. Bars are compared in order
/// of grant, each only with those granted before it let go.
pub(super) fn overlaps_where(
    bars: &[Bar],
    same_lock: impl Fn(usize, usize) -> bool,
) -> Vec<Overlap> {
    let mut by_from: Vec<usize> = (0..bars.len()).collect();
    by_from.sort_by_key(|&i| (bars[i].from, i));
    let mut found: Vec<(usize, usize, Overlap)> = Vec::new();
    let mut budget = MOST_PAIRS;
    for (k, &i) in by_from.iter().enumerate() {
        for &j in &by_from[k + 1..] {
            let (a, b) = (&bars[i], &bars[j]);
            if b.from >= a.believed_to || budget == 0 {
                break;
            }
            budget -= 1;
            if !same_lock(i, j) || a.holder == b.holder {
                continue;
            }
            let from = a.from.max(b.from);
            let to = a.believed_to.min(b.believed_to);
            if to > from {
                let mut holders = vec![a.holder.clone(), b.holder.clone()];
                holders.sort();
                let believing = [a, b]
                    .iter()
                    .filter(|bar| !bar.open && bar.held_to <= from)
                    .map(|bar| bar.holder.clone())
                    .collect();
                let overlap = Overlap {
                    from,
                    to,
                    holders,
                    believing,
                };
                found.push((i.min(j), i.max(j), overlap));
            }
        }
    }
    found.sort_by_key(|(i, j, _)| (*i, *j));
    found.into_iter().map(|(_, _, overlap)| overlap).collect()
}
