//! A room's results: every attendee's finished lab run, recorded on the room's Postgres, and
//! `lockslab results`, the instructor's view of them all — who ran what, and how each
//! outcome fell across the room (how often lab 1's stale write got in, how lab 6's
//! restart fell).
//!
//! A seat may add rows and read none: its role is granted `INSERT` on the results table's
//! data columns only (in the labs' database, where a seat creates nothing), and the seat column defaults to `current_user`, so nobody can record
//! a run under another seat's name. The labs' role (the instructor's) reads them.

use std::collections::BTreeMap;
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

/// `lockslab room …`: what the room's servers keep for everyone.
#[derive(clap::Subcommand, Debug)]
pub enum RoomCommand {
    /// Every seat's finished runs, lab by lab, and how each outcome fell (terminal, or
    /// `--html FILE` for the projector)
    Results(ResultsArgs),
}

/// One recorded run, as `results` reads it.
struct Row {
    seat: String,
    lab: String,
    at: String,
    headline: String,
}

#[derive(clap::Args, Debug, Clone)]
#[command(after_help = "\
Examples:
  lockslab room results                   every seat's runs, lab by lab
  lockslab room results --html room.html  the same as a page to project

`lockslab results` is the same command.")]
pub struct ResultsArgs {
    /// Also write the results as a self-contained HTML page
    #[arg(long, value_name = "FILE")]
    pub html: Option<std::path::PathBuf>,
}

/// `lockslab results`: the room's runs, from the room `lockslab up --room` started.
pub fn results(args: &ResultsArgs) -> Result<()> {
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
    let rows: Vec<Row> = client
        .query(
            &format!(
                "SELECT seat::text, lab, to_char(at, 'HH24:MI:SS'), headline \
                 FROM {TABLE} ORDER BY lab, at"
            ),
            &[],
        )
        .context("reading the room's results")?
        .iter()
        .map(|row| Row {
            seat: row.get(0),
            // A seat wrote these: they reach the instructor's screen without its escapes.
            lab: crate::output::printable(row.get(1)),
            at: row.get(2),
            headline: crate::output::printable(row.get(3)),
        })
        .collect();
    print(&rows);
    if let Some(path) = &args.html {
        write_html(path, &rows)?;
        crate::errln!("wrote {}", path.display());
    }
    Ok(())
}

/// Runs grouped by lab, and within a lab by outcome: how the room's runs fell.
fn by_lab(rows: &[Row]) -> BTreeMap<&str, BTreeMap<&str, Vec<&Row>>> {
    let mut labs: BTreeMap<&str, BTreeMap<&str, Vec<&Row>>> = BTreeMap::new();
    for row in rows {
        labs.entry(&row.lab)
            .or_default()
            .entry(&row.headline)
            .or_default()
            .push(row);
    }
    labs
}

fn print(rows: &[Row]) {
    if rows.is_empty() {
        crate::outln!("No results yet: a seat's run is recorded when its lab finishes.");
        return;
    }
    let seats: std::collections::BTreeSet<&str> = rows.iter().map(|r| r.seat.as_str()).collect();
    let s = |n: usize| if n == 1 { "" } else { "s" };
    crate::outln!(
        "{} run{} by {} seat{}",
        rows.len(),
        s(rows.len()),
        seats.len(),
        s(seats.len())
    );
    for (lab, outcomes) in by_lab(rows) {
        let runs: usize = outcomes.values().map(Vec::len).sum();
        crate::outln!();
        crate::outln!(
            "{} — {runs} run{}",
            lab.bold(),
            if runs == 1 { "" } else { "s" }
        );
        for (headline, runs) in outcomes {
            let who: Vec<&str> = runs.iter().map(|r| r.seat.as_str()).collect();
            crate::output::prose(&format!("  {:>3}×  {headline}", runs.len()));
            crate::output::prose(&format!("        {}", who.join(" ").dimmed()));
        }
    }
}

fn write_html(path: &Path, rows: &[Row]) -> Result<()> {
    let escape = |text: &str| {
        text.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
            .replace('"', "&quot;")
    };
    let mut page = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>lockslab: the room's results</title><style>\
         body{font:18px/1.4 sans-serif;margin:2em}td,th{padding:.3em .8em;text-align:left;\
         vertical-align:top}th{border-bottom:1px solid #888}.n{text-align:right}\
         .who{color:#666;font-size:80%}</style></head><body>\n\
         <h1>The room's results</h1>\n",
    );
    for (lab, outcomes) in by_lab(rows) {
        let _ = write!(
            page,
            "<h2>{}</h2>\n<table><tr><th class=\"n\">runs</th><th>outcome</th><th>seats</th></tr>\n",
            escape(lab)
        );
        for (headline, runs) in outcomes {
            let who: Vec<String> = runs
                .iter()
                .map(|r| format!("{} {}", r.seat, r.at))
                .collect();
            let _ = writeln!(
                page,
                "<tr><td class=\"n\">{}</td><td>{}</td><td class=\"who\">{}</td></tr>",
                runs.len(),
                escape(headline),
                escape(&who.join(", "))
            );
        }
        page.push_str("</table>\n");
    }
    page.push_str("</body></html>\n");
    std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))
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

    #[test]
    fn runs_are_grouped_by_lab_then_outcome() {
        let row = |seat: &str, lab: &str, headline: &str| Row {
            seat: seat.into(),
            lab: lab.into(),
            at: "10:00:00".into(),
            headline: headline.into(),
        };
        let rows = [
            row("seat01", "redlock", "restart: two holders"),
            row("seat02", "redlock", "restart: one holder"),
            row("seat03", "redlock", "restart: two holders"),
            row("seat01", "gc-pause", "unfenced: accepted"),
        ];
        let labs = by_lab(&rows);
        assert_eq!(labs.len(), 2);
        assert_eq!(labs["redlock"]["restart: two holders"].len(), 2);
        assert_eq!(labs["redlock"]["restart: one holder"].len(), 1);
    }
}
