//! A room's results: every attendee's finished lab run, recorded on the room's Postgres, and
//! `lockslab results`, the instructor's view of them all — who ran what, and how each
//! outcome fell across the room (how often lab 1's stale write got in, how lab 6's
//! restart fell).
//!
//! A seat may add rows and read none: its role is granted `INSERT` on the results table's
//! data columns only (in the labs' database, where a seat creates nothing), and the seat column defaults to `current_user`, so nobody can record
//! a run under another seat's name. The labs' role (the instructor's) reads them.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use colored::Colorize;
use serde_json::Value;

use crate::connect;
use crate::servers::UpState;

use crate::servers::ROOM_RESULTS as TABLE;

/// The seat a Postgres URL logs in as, when it is a room's seat (`seat07`).
pub fn seat_of(postgres_url: &str) -> Option<String> {
    let user = postgres_url
        .split_once("://")?
        .1
        .split(['@', ':', '/'])
        .next()?;
    let number = user.strip_prefix("seat")?;
    (!number.is_empty() && number.bytes().all(|b| b.is_ascii_digit())).then(|| user.to_string())
}

/// Whether this shell is a room's seat: it has a namespace or a seat's URL (the lines
/// `lockslab seat N` prints). A seat never starts the room, so an error that would say
/// "start one" sends it to the instructor instead.
fn is_a_seat() -> bool {
    std::env::var_os("LOCKSLAB_NAMESPACE").is_some_and(|ns| !ns.is_empty())
        || [
            "LOCKSLAB_POSTGRES_URL",
            "LOCKSLAB_REDIS_URL",
            "LOCKSLAB_ETCD_URL",
        ]
        .iter()
        .any(|var| std::env::var(var).is_ok_and(|url| seat_of(&url).is_some()))
}

/// Records a finished run on the room's Postgres when this lab ran as one of its seats;
/// says so on stderr if it could not (the lab's own verdict stands either way). A seat's
/// URL names its own database; the results are in the labs' one, where the seat may add
/// rows and nothing else.
pub fn record(postgres_url: Option<&str>, lab: &str, headline: &str, verdict: &Value) {
    let Some(url) = postgres_url else { return };
    if seat_of(url).is_none() {
        return;
    }
    let url = &crate::servers::on_database(url, crate::servers::PG_ROLE);
    let run_id = verdict["run_id"].as_str().unwrap_or_default();
    let recorded = connect::postgres(url).and_then(|mut client| {
        client
            .execute(
                &format!(
                    "INSERT INTO {TABLE} (lab, run_id, headline, verdict) \
                     VALUES ($1, $2, $3, $4::text::jsonb)"
                ),
                &[&lab, &run_id, &headline, &verdict.to_string()],
            )
            .map_err(anyhow::Error::from)
    });
    if let Err(err) = recorded {
        crate::errln!(
            "lockslab: this run is not in the room's results ({}); the verdict above stands",
            connect::explain(err)
        );
    }
}

/// A stale write's fate in a headline's words.
pub fn stale_write_word(attempted: bool, accepted: Option<bool>) -> &'static str {
    match (attempted, accepted) {
        (false, _) => "no stale write",
        (true, Some(true)) => "stale write ACCEPTED",
        (true, Some(false)) => "stale write refused",
        (true, None) => "stale write unknown",
    }
}

/// Whether a backend granted one lock twice, in a headline's words.
pub fn holders_word(two_holders: Option<bool>) -> &'static str {
    match two_holders {
        Some(true) => "two holders",
        Some(false) => "one holder",
        None => "holders unknown",
    }
}

/// A late write's fate (a [`LateWrite`](crate::check::LateWrite)) in a headline's words.
pub fn late_write_word(late: crate::check::LateWrite) -> &'static str {
    use crate::check::LateWrite;
    match late {
        LateWrite::None => "no stale write",
        LateWrite::Accepted => "stale write ACCEPTED",
        LateWrite::Rejected => "stale write refused",
    }
}

/// `lockslab room …`: what the room's servers keep for everyone.
#[derive(clap::Subcommand, Debug)]
pub enum RoomCommand {
    /// Every lab's outcome counted across the seats, scenario by scenario (terminal, or
    /// `--html FILE` for the projector)
    Results(ResultsArgs),
}

/// One recorded run, as `results` reads it (oldest first).
struct Row {
    seat: String,
    lab: String,
    headline: String,
}

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
Examples:
  lockslab room results                   each lab's outcome, counted across seats
  lockslab room results --html room.html  the same as a page to project
  lockslab room results --html room.html --follow
                                          the page rewritten as results arrive
                                          (it reloads itself every 5 s)

A seat's latest run of a scenario counts. Each line is one scenario of the lab, with
the outcome most seats saw, as seats/seats-that-ran-it; the seats that saw
something else are named. `lockslab results` is the same command.")]
pub struct ResultsArgs {
    /// Also write the results as a self-contained HTML page
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,
    /// Keep reading the results, every 2 s, and rewrite the page (and the terminal's view)
    /// when they change, until Ctrl-C
    #[arg(long, requires = "html")]
    pub follow: bool,
}

/// The longest headline `results` reads of a seat's row: a seat writes what it likes, and
/// one row must not fill the projector.
const LONGEST_HEADLINE: usize = 2_000;

/// `lockslab results`: the room's runs, from the room `lockslab up --room` started.
///
/// `labs` is the menu's order, (number, subcommand): the results follow it.
pub fn results(args: &ResultsArgs, labs: &[(u8, &str)]) -> Result<()> {
    let Some(state) = UpState::load()? else {
        if is_a_seat() {
            bail!(
                "a room's results are read on the instructor's machine, where `lockslab up --room` \
                 runs (the projector's view); a seat records its runs and reads none"
            );
        }
        bail!("no room is running: `lockslab up --room ADDR` starts one");
    };
    if state.room.is_none() {
        bail!(
            "`lockslab up` started servers for this machine, not a room: results come with `lockslab up --room ADDR`"
        );
    }
    let url = state
        .postgres
        .as_deref()
        .context("the room has no Postgres to keep results in")?;
    let mut client = connect::postgres(url)?;
    if let (true, Some(path)) = (args.follow, &args.html) {
        // Said once, before the first table: nothing else tells the room the command is
        // still working while no result arrives.
        crate::output::err_prose(&format!(
            "following: {} is rewritten as results arrive (read every 2 s; the page reloads \
             itself every 5 s); Ctrl-C stops",
            path.display()
        ));
    }
    let mut shown: Option<Vec<LabResults>> = None;
    loop {
        let counted = tally(&read_rows(&mut client)?, labs);
        if shown.as_ref() != Some(&counted) {
            print(&counted);
            if let Some(path) = &args.html {
                write_html(path, &counted, args.follow)?;
                crate::errln!("wrote {}", path.display());
            }
            shown = Some(counted);
        }
        if !args.follow {
            return Ok(());
        }
        for _ in 0..20 {
            if crate::procs::interrupted() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

fn read_rows(client: &mut postgres::Client) -> Result<Vec<Row>> {
    Ok(client
        .query(
            &format!(
                "SELECT seat::text, lab, left(headline, {LONGEST_HEADLINE}) \
                 FROM {TABLE} ORDER BY at"
            ),
            &[],
        )
        .context("reading the room's results")?
        .iter()
        .map(|row| Row {
            seat: crate::output::printable(row.get(0)),
            // A seat wrote these: they reach the instructor's screen without its escapes.
            lab: crate::output::printable(row.get(1)),
            headline: crate::output::printable(row.get(2)),
        })
        .collect())
}

/// One lab across the room: each scenario's outcomes, with the seats that saw each.
#[derive(Debug, PartialEq)]
struct LabResults {
    /// The lab's number in the menu (`None`: a name no lab has, which a seat wrote).
    number: Option<u32>,
    lab: String,
    seats: usize,
    scenarios: Vec<Scenario>,
}

/// One scenario of a lab (`fenced`), its outcomes most frequent first.
#[derive(Debug, PartialEq)]
struct Scenario {
    name: String,
    /// (outcome, the seats that saw it), the most seats first.
    outcomes: Vec<(String, Vec<String>)>,
}

impl Scenario {
    fn seats(&self) -> usize {
        self.outcomes.iter().map(|(_, seats)| seats.len()).sum()
    }

    /// The line the terminal shows: `fenced: stale write refused 24/25 · stale write
    /// ACCEPTED 1/25 seat07`.
    fn line(&self) -> String {
        let of = self.seats();
        let mut parts = Vec::new();
        for (i, (outcome, seats)) in self.outcomes.iter().enumerate() {
            let mut part = format!("{outcome} {}/{of}", seats.len());
            if i > 0 {
                part.push_str(&format!(" ({})", seats.join(" ")));
            }
            parts.push(part);
        }
        let outcomes = parts.join(" · ");
        if self.name.is_empty() {
            outcomes
        } else {
            format!("{}: {outcomes}", self.name)
        }
    }
}

/// A headline's scenarios: `fenced: stale write refused · unfenced: …` read as
/// (`fenced`, `stale write refused`), …; a part without a name is the lab's one outcome.
fn scenarios_of(headline: &str) -> Vec<(String, String)> {
    headline
        .split(" · ")
        .filter(|part| !part.trim().is_empty())
        .map(|part| match part.split_once(": ") {
            Some((name, outcome)) => (name.trim().to_string(), outcome.trim().to_string()),
            None => (String::new(), part.trim().to_string()),
        })
        .collect()
}

/// The room's runs counted: each seat's latest outcome of each scenario, each scenario's
/// outcomes across the seats, the labs in the menu's order.
///
/// A seat's later run replaces only the scenarios it played: the plan runs lab 10 twice
/// (`queue --only herd`, then `--only election`), and the herd's outcome must still count.
fn tally(rows: &[Row], order: &[(u8, &str)]) -> Vec<LabResults> {
    /// A lab's seats, and its scenarios in the order first played, each with every seat's
    /// latest outcome (by seat name, so that the seats that differ are named in order).
    type Played<'r> = (BTreeSet<&'r str>, Vec<(String, BTreeMap<&'r str, String>)>);
    let mut labs: BTreeMap<&str, Played> = BTreeMap::new();
    // Rows come oldest first: a later outcome of the same seat and scenario replaces it.
    for row in rows {
        let (seats, scenarios) = labs.entry(row.lab.as_str()).or_default();
        seats.insert(row.seat.as_str());
        for (name, outcome) in scenarios_of(&row.headline) {
            let at = match scenarios.iter().position(|(n, _)| *n == name) {
                Some(at) => at,
                None => {
                    scenarios.push((name, BTreeMap::new()));
                    scenarios.len() - 1
                }
            };
            scenarios[at].1.insert(row.seat.as_str(), outcome);
        }
    }
    let mut results: Vec<LabResults> = labs
        .into_iter()
        .map(|(lab, (seats, played))| {
            let scenarios = played
                .into_iter()
                .map(|(name, by_seat)| {
                    let mut outcomes: Vec<(String, Vec<String>)> = Vec::new();
                    for (seat, outcome) in by_seat {
                        match outcomes.iter_mut().find(|(o, _)| *o == outcome) {
                            Some((_, seats)) => seats.push(seat.to_string()),
                            None => outcomes.push((outcome, vec![seat.to_string()])),
                        }
                    }
                    // The outcome most seats saw first; a stable sort keeps the first seen
                    // ahead.
                    outcomes.sort_by_key(|(_, seats)| std::cmp::Reverse(seats.len()));
                    Scenario { name, outcomes }
                })
                .collect();
            LabResults {
                number: order
                    .iter()
                    .find(|(_, command)| *command == lab)
                    .map(|(number, _)| u32::from(*number)),
                lab: lab.to_string(),
                seats: seats.len(),
                scenarios,
            }
        })
        .collect();
    results.sort_by_key(|lab| (lab.number.unwrap_or(u32::MAX), lab.lab.clone()));
    results
}

/// The lab's heading line: `1 gc-pause — 25 seats`.
fn lab_title(lab: &LabResults) -> String {
    let number = lab.number.map(|n| format!("{n} ")).unwrap_or_default();
    let s = if lab.seats == 1 { "" } else { "s" };
    format!("{number}{} — {} seat{s}", lab.lab, lab.seats)
}

fn print(labs: &[LabResults]) {
    if labs.is_empty() {
        crate::outln!("No results yet: a seat's run is recorded when its lab finishes.");
        return;
    }
    crate::outln!("The room's results: each seat's latest run of each scenario");
    for lab in labs {
        crate::outln!();
        crate::outln!("{}", lab_title(lab).bold());
        for scenario in &lab.scenarios {
            crate::output::prose(&format!("  {}", scenario.line()));
        }
    }
}

/// Text a seat wrote, safe inside an HTML element or attribute.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

/// The projector's page: one table per lab, one row per scenario. With `--follow` it
/// reloads itself, and `results` rewrites it whenever a result arrives.
fn html(labs: &[LabResults], reloads: bool) -> String {
    let mut page =
        String::from("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n");
    if reloads {
        page.push_str("<meta http-equiv=\"refresh\" content=\"5\">\n");
    }
    // Three columns, the type scaled with the window's width: all ten labs of a session fit
    // one 1280×720 projector screen (checked in headless Chromium, two seats agreeing; two
    // columns at 20 px took 1,230 px), and any 16:9 screen lays out the same; two columns
    // on a narrow window. Seats that disagree add lines, and then the page scrolls.
    page.push_str(
        "<title>lockslab: the room's results</title><style>\
         body{font:max(14px,1.17vw)/1.2 sans-serif;margin:.5em 1.2em;background:#fff;color:#111}\
         h1{font-size:130%;margin:.2em 0}h2{font-size:105%;margin:0 0 .2em}\
         main{column-count:3;column-gap:2em}@media (max-width:900px){main{column-count:2}}\
         section{break-inside:avoid;margin-bottom:.6em}\
         table{border-collapse:collapse}td{padding:.05em .6em;vertical-align:top}\
         .split{background:#fde7c2;padding:0 .2em}\
         .who{color:#555;font-size:85%}</style></head><body>\n\
         <h1>The room's results</h1>\n<main>\n",
    );
    if labs.is_empty() {
        page.push_str("<p>No results yet: a seat's run is recorded when its lab finishes.</p>\n");
    }
    for lab in labs {
        let _ = writeln!(
            page,
            "<section><h2>{}</h2>\n<table>",
            escape(&lab_title(lab))
        );
        for scenario in &lab.scenarios {
            let of = scenario.seats();
            let mut cells = Vec::new();
            for (i, (outcome, seats)) in scenario.outcomes.iter().enumerate() {
                // The seats split: marked, so that the room looks at what differed.
                let class = if seats.len() == of { "all" } else { "split" };
                let who = if i > 0 {
                    format!(" <span class=\"who\">{}</span>", escape(&seats.join(" ")))
                } else {
                    String::new()
                };
                cells.push(format!(
                    "<span class=\"{class}\">{} <b>{}/{of}</b></span>{who}",
                    escape(outcome),
                    seats.len()
                ));
            }
            let _ = writeln!(
                page,
                "<tr><td>{}</td><td>{}</td></tr>",
                escape(&scenario.name),
                cells.join(" · ")
            );
        }
        page.push_str("</table></section>\n");
    }
    page.push_str("</main></body></html>\n");
    page
}

/// Writes the page whole, then moves it into place: a browser reloading it never reads
/// half a page.
fn write_html(path: &Path, labs: &[LabResults], reloads: bool) -> Result<()> {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    std::fs::write(&partial, html(labs, reloads))
        .and_then(|()| std::fs::rename(&partial, path))
        .with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_seats_url_is_a_seat() {
        assert_eq!(
            seat_of("postgres://seat07:pw@10.0.0.2:5432/lockslab").as_deref(),
            Some("seat07")
        );
        assert_eq!(seat_of("postgres://lockslab:pw@127.0.0.1/lockslab"), None);
        assert_eq!(seat_of("postgres://seat:pw@h/db"), None);
        assert_eq!(seat_of("postgres://seatx1:pw@h/db"), None);
    }

    const ORDER: &[(u8, &str)] = &[(1, "gc-pause"), (6, "redlock")];

    fn row(seat: &str, lab: &str, headline: &str) -> Row {
        Row {
            seat: seat.into(),
            lab: lab.into(),
            headline: headline.into(),
        }
    }

    #[test]
    fn each_scenario_is_counted_across_seats_and_the_seats_that_differ_are_named() {
        let fenced = "unfenced: stale write ACCEPTED · fenced: stale write refused";
        let rows = [
            row("seat01", "redlock", "restart: two holders"),
            row("seat01", "gc-pause", fenced),
            row("seat02", "gc-pause", fenced),
            row(
                "seat03",
                "gc-pause",
                "unfenced: stale write ACCEPTED · fenced: stale write unknown",
            ),
        ];
        let labs = tally(&rows, ORDER);
        assert_eq!(labs[0].lab, "gc-pause", "labs in the menu's order");
        assert_eq!(labs[1].lab, "redlock");
        let lines: Vec<String> = labs[0].scenarios.iter().map(Scenario::line).collect();
        assert_eq!(
            lines,
            [
                "unfenced: stale write ACCEPTED 3/3",
                "fenced: stale write refused 2/3 · stale write unknown 1/3 (seat03)"
            ]
        );
        assert_eq!(lab_title(&labs[0]), "1 gc-pause — 3 seats");
    }

    #[test]
    fn a_seats_latest_run_of_a_lab_is_the_one_counted() {
        let rows = [
            row("seat01", "redlock", "restart: two holders"),
            row("seat01", "redlock", "restart: one holder"),
        ];
        let labs = tally(&rows, ORDER);
        assert_eq!(labs[0].seats, 1);
        assert_eq!(labs[0].scenarios[0].line(), "restart: one holder 1/1");
    }

    /// The plan runs lab 10 in two parts (`--only herd`, then `--only election`): the
    /// second run replaces the scenarios it played, not the herd's.
    #[test]
    fn a_later_run_of_some_scenarios_leaves_the_others_counted() {
        let rows = [
            row("seat01", "redlock", "restart: two holders · pause: granted"),
            row("seat02", "redlock", "restart: two holders"),
            row("seat01", "redlock", "clock: two holders"),
            row("seat01", "redlock", "restart: one holder"),
        ];
        let labs = tally(&rows, ORDER);
        let lines: Vec<String> = labs[0].scenarios.iter().map(Scenario::line).collect();
        assert_eq!(
            lines,
            [
                "restart: one holder 1/2 · two holders 1/2 (seat02)",
                "pause: granted 1/1",
                "clock: two holders 1/1"
            ]
        );
        assert_eq!(lab_title(&labs[0]), "6 redlock — 2 seats");
    }

    #[test]
    fn what_a_seat_wrote_reaches_the_page_as_text() {
        let rows = [row(
            "seat01",
            "<script>alert(1)</script>",
            "x: <img src=x onerror=alert(1)> · 'q': \"&\"",
        )];
        let page = html(&tally(&rows, ORDER), true);
        assert!(
            !page.contains("<script>alert") && !page.contains("<img"),
            "{page}"
        );
        assert!(
            page.contains("&lt;script&gt;") && page.contains("&#39;q&#39;"),
            "{page}"
        );
        assert!(page.contains("http-equiv=\"refresh\""));
    }
}
