//! The command line: the labs' subcommands (from `labs`'s one table), plus the hands-on
//! worker and server helpers.

use anyhow::Result;
use clap::{Parser, Subcommand};
use colored::Colorize;

use crate::hands_on::{self, HandsOnArgs};
use crate::servers;
use crate::worker;

pub use crate::exit::{Exit, UsageError};

#[derive(Parser, Debug)]
#[command(
    max_term_width = 80,
    name = "lockslab",
    version,
    about = "Learn distributed locks by breaking them: real workers, real Redis/etcd/Postgres, real SIGSTOP.",
    after_help = concat!("\
Servers: each lab finds Redis, etcd and Postgres by
--redis-url/--etcd-url/--postgres-url (or LOCKSLAB_REDIS_URL…), then `lockslab
up`'s servers, then the docker-compose.yml defaults; if none answers it starts
private servers from local binaries and removes them afterwards.

", crate::exit_status_table!(), "

Examples:
  lockslab                      the lab menu (also `lockslab list`)
  lockslab gc-pause             lab 1: a frozen holder's stale write, without
                                and with fencing
  lockslab naive                lab 2: four bugs of the naive Redis lock, each
                                beside its fix
  lockslab skip-locked          lab 3: a Postgres job queue; kill and freeze a
                                worker
  lockslab etcd-vs-redis        lab 4: who hands the lock over how fast, and who
                                can fence
  lockslab failover             lab 5: a Redis failover hands the lock out
                                twice; etcd does not
  lockslab redlock              lab 6: five Redis masters, a quorum, and where
                                it breaks
  lockslab no-lock              lab 7: the same job without a lock service,
                                freeze and kill
  lockslab network              lab 8: no pause at all: the network delays a
                                checked write past its lease
  lockslab lease-guard          lab 9: guards short of fencing, and the gap each
                                leaves
  lockslab queue                lab 10: etcd's queue recipe: no herd, fair
                                order, expired sessions
  lockslab chaos --design D     random faults against one lock design; the
                                smallest schedule that breaks it
  lockslab matrix               every design against every kind of fault
  lockslab challenge list       bring your own lock client; graded under faults
  lockslab check run.jsonl      a saved run's verdict judged again from its
                                history, offline
  lockslab doctor               check this machine the day before a session
  lockslab up                   keep servers running for the hands-on exercises
  lockslab worker               take the lock by hand and freeze yourself with
                                kill -STOP
  lockslab <lab> --help         options and examples of one lab

Walkthroughs: labs/01-gc-pause.md … labs/10-queue.md in the repository.")
)]
pub struct Cli {
    /// None: `lockslab` alone shows the lab menu.
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    // The labs, first and in the course's order: `labs`'s table is their only registration.
    #[command(flatten)]
    Lab(crate::labs::Lab),
    /// Random fault schedules from a seed against one lock design; the smallest that breaks it
    Chaos(crate::chaos::ChaosArgs),
    /// Every lock design against every kind of fault: SAFE, UNSAFE or UNKNOWN
    Matrix(crate::matrix::MatrixArgs),
    /// Your own lock client, in any language, run under pauses, kills and network delays
    /// and graded from the data (`lockslab challenge list`)
    Challenge(crate::challenge::ChallengeArgs),
    /// The labs: what each shows, how long it takes, what it needs, where its walkthrough is,
    /// its workshop session, its `--step` stops and the tools its by-hand part needs
    List,
    /// Check this machine before a session: tools, servers, free connections, each lab
    Doctor(crate::doctor::DoctorArgs),
    /// The questions to answer before shipping a distributed lock, each with the lab that
    /// shows what goes wrong without it (`--markdown` for a design review)
    Checklist(crate::checklist::ChecklistArgs),
    /// Print a shell's completion script: `lockslab completions bash > ~/.local/share/bash-completion/completions/lockslab`
    Completions {
        #[arg(value_enum)]
        shell: CompletionShell,
    },
    /// Print the JSON Schema of the event lines `--json` prints (docs/json.md):
    /// `lockslab schema > event.schema.json`, then validate a run with any validator
    Schema,
    /// Print the manual page (roff): `lockslab man | man -l -`; `--dir DIR` writes one page
    /// per command there
    Man {
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
    /// Hands-on: take the lock, print the PID to freeze, work, write to the store, release
    #[command(after_help = "\
Example, in two terminals (after `lockslab up` and its export lines):
  1$ lockslab worker --fencing            # takes the lock, prints its PID
  2$ kill -STOP <pid>                     # freeze it; wait past the TTL (10s)
  2$ lockslab worker --fencing --work 2s  # takes the lock, writes (accepted), releases
  2$ kill -CONT <pid>                     # the first worker wakes and writes: REJECTED
Without --fencing on both, the late write is ACCEPTED and overwrites the second one's.")]
    Worker(HandsOnArgs),
    /// Hands-on: a fault proxy in front of your own worker; faults from another terminal
    Proxy(crate::labs::network::by_hand::ProxyArgs),
    /// Start private Redis, etcd and Postgres and keep them running between commands
    #[command(after_help = "\
Examples:
  lockslab up                      servers on 127.0.0.1 for this machine's
                                   terminals
  lockslab up --room 192.168.1.20  servers a room shares, passwords on, 30 seats
  lockslab up --room 192.168.1.20 --seats 12
                                   12 seats: pairs share one, 24 attendees
  lockslab seat 1                  the lines seat 1 pastes (seat01's only)

A room's servers listen on ADDR only, each with a generated password (Redis
requirepass, Postgres SCRAM, etcd auth with user root) that stays the
instructor's. Each seat has a Redis and an etcd of its own (a busy script, a
SCAN, or a compaction or lease made with its lines reaches no other seat) and
a Postgres role owning a database of its own, with its own password. A seat's
etcd also demands a client certificate that seat's own authority signed (its
lines carry it in LOCKSLAB_ETCD_TLS): etcd 3.4 asks no password to compact or
for leases, a certificate it cannot skip. Postgres, the CPU, memory and disk
stay shared. As root, each seat's Redis and etcd run as a
uid of the seat's own. `lockslab down` stops them all.")]
    Up(UpArgs),
    /// Print the export lines of one seat of the room `lockslab up --room` started
    #[command(after_help = "\
Examples:
  lockslab seat 1        seat01's lines, to hand to one pair of attendees
  lockslab seat seat01   the same

All seats' lines are also in the file `lockslab up --room` names (mode 0600).")]
    Seat {
        /// The seat: its number or its name
        #[arg(value_name = "SEAT")]
        seat: String,
    },
    /// Stop the servers `lockslab up` started and delete their data
    Down,
    /// Clear one name's hands-on state: its lock, fencing counter and store row
    #[command(after_help = "\
Examples:
  lockslab reset                    clear lock 'demo' (LOCKSLAB_NAME's, if set)
  LOCKSLAB_NAME=ana lockslab reset  clear Ana's 'ana/demo' only; nobody
                                    else's")]
    Reset(crate::hands_on::ResetArgs),
    /// Show the servers `lockslab up` started and whether they answer
    Status,
    /// A room's results: every seat's finished runs, lab by lab, and how each outcome fell
    /// (the same as `lockslab room results`)
    Results(crate::room::ResultsArgs),
    /// The room the servers of `lockslab up --room` serve: `lockslab room results`
    #[command(subcommand)]
    Room(crate::room::RoomCommand),
    /// Reproduce a saved run's verdict offline: judge its history again with the lab's own
    /// checkers and compare, field by field (`lockslab check RUN.jsonl`, `-` for stdin)
    Check(crate::reproduce::CheckArgs),
    /// Draw a saved run (`<lab> --json > RUN.jsonl`) as a self-contained HTML page or SVG
    #[command(after_help = "\
Examples:
  lockslab gc-pause --json > run.jsonl       record a run (before a workshop)
  lockslab render run.jsonl -o run.html      the picture, to open in any browser
                                             offline
  lockslab render run.jsonl -o run.svg       the same drawing as an image

Every lab also takes --html FILE and --svg FILE to draw the run it just played.")]
    Render(RenderArgs),
    /// A lab's worker process (started by the labs themselves); its script is the first
    /// line on stdin, never an argument, since it holds the servers' passwords
    #[command(name = "__worker", hide = true)]
    InternalWorker,
    /// Private servers for as long as stdin stays open: prints their URLs as one JSON line
    /// (used by the test suite, which must never depend on fixed ports)
    #[command(name = "__serve", hide = true)]
    Serve,
    /// A room's guard (started by `lockslab up --room`): each door is PROTOCOL:FD:SERVER, a
    /// listening socket it inherited and the loopback server behind it
    #[command(name = "__guard", hide = true)]
    Guard { doors: Vec<String> },
}

#[derive(clap::Args, Debug)]
struct RenderArgs {
    /// The JSON Lines a lab printed with --json
    #[arg(value_name = "RUN.jsonl")]
    input: std::path::PathBuf,
    /// The picture to write: FILE.html (a page, details on hover) or FILE.svg
    #[arg(short, long, value_name = "FILE")]
    output: std::path::PathBuf,
}

impl Command {
    /// The options every lab shares, when this is a lab.
    fn lab_output(&self) -> Option<&crate::labs::OutputArgs> {
        match self {
            Command::Lab(lab) => Some(lab.output()),
            _ => None,
        }
    }
}

/// Parses the command line and runs it; errors are printed once, by `main`.
pub fn run() -> Result<Exit> {
    let cli = Cli::parse();
    let Some(command) = cli.command else {
        crate::menu::print();
        return Ok(Exit::Done);
    };
    if let Command::InternalWorker = &command {
        return Ok(worker::run_internal());
    }
    if let Command::Guard { doors } = &command {
        // Before the interrupt handler: the guard ends at `lockslab down`'s SIGTERM.
        return run_guard(doors);
    }
    crate::procs::install_interrupt_handler()?;
    // Checked once, before anything runs: every run id is drawn from it.
    servers::namespace()?;
    // A picture's file is checked before the lab plays: a bad name fails at once. The
    // runner draws it from the run's history once the lab has its verdict.
    if let Some(output) = command.lab_output() {
        output.pictures()?;
    }
    if let Some(output) = command.lab_output() {
        crate::labs::step::enable(output.step);
        crate::output::screens::page(output.step && !output.json);
        crate::labs::step::clear_screens(output.clear);
        let seed = output.seed.unwrap_or_else(crate::seed::fresh);
        crate::seed::start(seed, "lab");
    }
    match command {
        Command::Chaos(args) => return crate::chaos::run(&args),
        Command::Matrix(args) => return crate::matrix::run(&args),
        Command::Challenge(args) => return crate::challenge::run(&args),
        Command::Check(args) => return crate::reproduce::run(&args),
        Command::List => crate::menu::print_list(),
        Command::Doctor(args) => crate::doctor::run(&args)?,
        Command::Checklist(args) => crate::checklist::run(&args)?,
        Command::Completions { shell } => completions(shell),
        Command::Man { dir } => man_pages(dir.as_deref())?,
        Command::Schema => crate::outln!("{}", crate::events::json_schema()),
        Command::Lab(lab) => lab.run()?,
        Command::Worker(args) => hands_on::hands_on(&args)?,
        Command::Proxy(args) => crate::labs::network::by_hand::run(&args)?,
        Command::Up(args) => match args.room {
            Some(addr) => up_room(addr, usize::from(args.seats))?,
            None => up()?,
        },
        Command::Seat { seat } => print_seat(&seat)?,
        Command::Down => {
            if servers::down()? {
                crate::outln!("stopped the servers `lockslab up` started");
            } else {
                crate::outln!("no servers from `lockslab up` to stop");
            }
        }
        Command::Status => status()?,
        Command::Results(args) | Command::Room(crate::room::RoomCommand::Results(args)) => {
            let order: Vec<(u8, &str)> = crate::labs::LABS
                .iter()
                .map(|lab| (lab.number, lab.command))
                .collect();
            crate::room::results(&args, &order)?
        }
        Command::Reset(args) => crate::hands_on::reset(&args)?,
        Command::Serve => servers::serve_until_stdin_closes()?,
        Command::Render(args) => {
            crate::picture::render(&args.input, &args.output, crate::reproduce::report_for)?
        }
        Command::InternalWorker | Command::Guard { .. } => unreachable!("handled above"),
    }
    Ok(Exit::Done)
}

/// `lockslab __guard`: the room's guard, until it is killed.
fn run_guard(doors: &[String]) -> Result<Exit> {
    crate::proxy::guard::take_process_name();
    let doors = doors
        .iter()
        // SAFETY: `lockslab up --room` passes each listening socket to this process alone
        // (see `servers::PrivateServers::start_guard`).
        .map(|door| unsafe { crate::proxy::guard::Door::from_argument(door) })
        .collect::<Result<Vec<_>>>()?;
    crate::proxy::guard::run(doors)?;
    Ok(Exit::Done)
}

/// The shells `lockslab completions` writes for.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CompletionShell {
    Bash,
    Zsh,
    Fish,
}

/// The command tree as people see it: the hidden internal commands left out, which a
/// completion script would otherwise offer.
fn documented_command() -> clap::Command {
    use clap::CommandFactory;
    let full = Cli::command();
    let visible: Vec<clap::Command> = full
        .get_subcommands()
        .filter(|command| !command.is_hide_set())
        .cloned()
        .collect();
    let mut command = clap::Command::new("lockslab")
        .version(env!("CARGO_PKG_VERSION"))
        .subcommands(visible);
    if let Some(about) = full.get_about() {
        command = command.about(about.clone());
    }
    if let Some(after) = full.get_after_help() {
        command = command.after_help(after.clone());
    }
    command
}

/// Completions generated from this very command tree, so they never drift from it.
fn completions(shell: CompletionShell) {
    let shell = match shell {
        CompletionShell::Bash => clap_complete::Shell::Bash,
        CompletionShell::Zsh => clap_complete::Shell::Zsh,
        CompletionShell::Fish => clap_complete::Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut documented_command(), "lockslab", &mut script);
    crate::output::line(String::from_utf8_lossy(&script).trim_end());
}

/// The manual pages, from the same command tree as `--help`: the main page on stdout, or
/// one page per command (`lockslab-gc-pause.1`…) in `dir`.
fn man_pages(dir: Option<&std::path::Path>) -> Result<()> {
    use anyhow::Context;
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        clap_mangen::generate_to(documented_command(), dir)
            .with_context(|| format!("writing manual pages to {}", dir.display()))?;
        crate::outln!("manual pages written to {}", dir.display());
        return Ok(());
    }
    let mut page = Vec::new();
    clap_mangen::Man::new(documented_command()).render(&mut page)?;
    crate::output::line(String::from_utf8_lossy(&page).trim_end());
    Ok(())
}

/// Options of `lockslab up`.
#[derive(clap::Args, Debug)]
struct UpArgs {
    /// Listen on ADDR (an address of this machine the room can reach), with authentication
    /// on, sized for a room of 30
    #[arg(long, value_name = "ADDR")]
    room: Option<std::net::IpAddr>,
    /// How many attendee seats the room has, each with its own users and namespace
    #[arg(long, value_name = "N", requires = "room",
          default_value_t = servers::ROOM_ATTENDEES as u16,
          value_parser = clap::value_parser!(u16).range(1..=servers::MAX_SEATS as i64))]
    seats: u16,
}

fn up_room(addr: std::net::IpAddr, seats: usize) -> Result<()> {
    use crate::proxy::guard;
    let state = servers::up_room(addr, seats)?;
    let seats = state.seats.len() as i64;
    let redact = |url: Option<&str>| crate::connect::redact(url.unwrap_or("-"));
    crate::outln!(
        "{}",
        format!("Room servers on {addr}, passwords on (until `lockslab down`):").bold()
    );
    crate::outln!("  Redis     {}", redact(state.redis.as_deref()));
    crate::outln!("            the instructor's, on loopback; each seat has its own:");
    crate::outln!(
        "            on a port of its own, {} MB of data, no eviction",
        servers::SEAT_REDIS_MAXMEMORY_MB
    );
    crate::outln!("  etcd      {}", redact(state.etcd.as_deref()));
    crate::outln!("            the instructor's, on loopback; each seat has its own:");
    crate::outln!(
        "            keys under lockslab:<seat>_, its own leases and history, {} MB,",
        servers::SEAT_ETCD_QUOTA_BYTES / (1024 * 1024)
    );
    crate::outln!("            TLS with a client certificate only that seat's lines hold");
    crate::outln!("  Postgres  {}", redact(state.postgres.as_deref()));
    crate::outln!("            a role per seat, owning a database named like it; SCRAM");
    crate::outln!(
        "            max_connections {} = {seats} seats × {} per lab run + {} + {}",
        servers::room_pg_connections(seats),
        servers::PG_CONNECTIONS_PER_LAB,
        servers::ROOM_PG_INSTRUCTOR_CONNECTIONS,
        guard::LOGINS_PER_SERVER
    );
    crate::outln!(
        "            (each seat's limit: {}; yours: {}; logins at once: {})",
        servers::PG_CONNECTIONS_PER_LAB,
        servers::ROOM_PG_INSTRUCTOR_CONNECTIONS,
        guard::LOGINS_PER_SERVER
    );
    match state.seats.first().and_then(|seat| seat.uid) {
        Some(uid) => crate::outln!(
            "Each seat's Redis and etcd run as a uid of its own ({uid}…), not as root."
        ),
        None => crate::outln!("The seats' Redis and etcd run as you: passwords keep them apart."),
    }
    crate::outln!("Shared by every seat: Postgres, and this machine's CPU, memory and disk.");
    crate::outln!("On the room's address, Postgres and the seats' Redis sit behind a guard:");
    crate::outln!(
        "  per source address {} logins at once, {} unfinished in all; {} s to log in",
        guard::LOGINS_PER_ADDRESS,
        guard::UNPROVEN_PER_ADDRESS,
        guard::LOGIN_DEADLINE.as_secs()
    );
    crate::outln!(
        "  (Postgres's own authentication_timeout: {} s). A flood from many addresses",
        servers::ROOM_PG_AUTHENTICATION_TIMEOUT_S
    );
    crate::outln!("  still slows or blocks logins; each seat's etcd wants its certificate.");
    crate::outln!();
    crate::outln!(
        "{seats} seat{}, seat01 to {}, each with its own password. Hand each attendee",
        if seats == 1 { "" } else { "s" },
        state.seats.last().map_or("-", |seat| seat.name.as_str())
    );
    crate::outln!("one seat's lines (pairs share one); the passwords above stay yours.");
    // A seat that exists in every room (`--seats` is at least 1).
    crate::outln!("  one seat:  lockslab seat 1");
    crate::outln!(
        "  every seat: {} (mode 0600)",
        servers::state_dir().join(servers::SEATS_FILE).display()
    );
    Ok(())
}

/// `lockslab seat N`: one attendee's export lines.
fn print_seat(which: &str) -> Result<()> {
    let Some(state) = servers::UpState::load()? else {
        anyhow::bail!("no room is running: `lockslab up --room ADDR` starts one");
    };
    if state.room.is_none() {
        anyhow::bail!(
            "`lockslab up` started servers for this machine, not a room: seats come with \
             `lockslab up --room ADDR`"
        );
    }
    let seat = state.seat(which)?;
    crate::outln!("# {} (paste into your shell)", seat.name);
    for line in state.seat_exports(seat) {
        crate::outln!("{line}");
    }
    Ok(())
}

fn up() -> Result<()> {
    let state = servers::up()?;
    if let Some(room) = &state.room {
        // A room's password is the instructor's to hand out: a plain `up` (projected on the
        // wall, perhaps) does not show it.
        crate::outln!(
            "{}",
            format!("A room's servers are running on {room} (until `lockslab down`):").bold()
        );
        print_redacted(&state);
        crate::outln!("`lockslab up --room {room}` prints the lines attendees paste.");
        return Ok(());
    }
    crate::outln!(
        "{}",
        "Private servers are running (until `lockslab down`):".bold()
    );
    crate::outln!("  Redis     {}", state.redis.as_deref().unwrap_or("-"));
    crate::outln!("  etcd      {}", state.etcd.as_deref().unwrap_or("-"));
    crate::outln!("  Postgres  {}", state.postgres.as_deref().unwrap_or("-"));
    // Two lines: at a projector's 80 columns one would wrap mid-sentence (only the
    // lines with a URL, copied whole, may be wider).
    crate::outln!("Labs here find them by themselves. In another terminal, or for");
    crate::outln!("redis-cli/psql, paste:");
    for line in state.exports() {
        crate::outln!("  {line}");
    }
    Ok(())
}

/// `up`'s servers, passwords hidden.
fn print_redacted(state: &servers::UpState) {
    for backend in servers::ALL {
        crate::outln!(
            "  {:<9} {}",
            backend.name(),
            crate::connect::redact(state.url(backend).unwrap_or("-"))
        );
    }
}

/// Lists the servers the environment names (`LOCKSLAB_*_URL`, which labs use first: a
/// seat's room, say), then `up`'s; exits 4 (with one line saying what to do) when one does
/// not answer, so that scripts can rely on `lockslab status && …`.
fn status() -> Result<()> {
    let given: Vec<(crate::connect::Backend, String)> = servers::ALL
        .iter()
        .filter_map(|backend| {
            let url = std::env::var(backend.env_var()).ok()?;
            (!url.is_empty()).then_some((*backend, url))
        })
        .collect();
    let mut silent = Vec::new();
    if !given.is_empty() {
        crate::outln!("from the environment (labs use these first):");
        for (backend, url) in &given {
            let answers = crate::connect::probe(*backend, url).is_ok();
            if !answers {
                silent.push(backend.env_var());
            }
            // Passwords hidden: `status` is what gets shown to a room.
            crate::outln!(
                "  {:<9} {}  {}",
                backend.name(),
                crate::connect::redact(url),
                up_mark(answers)
            );
        }
    }
    let silent_env = || {
        (!silent.is_empty()).then(|| {
            let (servers, are, it) = if silent.len() == 1 {
                ("server", "is", "it")
            } else {
                ("servers", "are", "them")
            };
            anyhow::anyhow!(
                "the {servers} in {} {are} not answering: check the URLs you exported, or ask \
                 whoever started {it}",
                silent.join(" and ")
            )
        })
    };
    let Some((state, health)) = servers::status()? else {
        if given.is_empty() {
            crate::prose!(
                "no servers from `lockslab up`; labs will use docker-compose defaults or private servers"
            );
        } else if given.len() < servers::ALL.len() {
            crate::prose!(
                "no servers from `lockslab up`; for the others labs will use docker-compose \
                 defaults or private servers"
            );
        }
        return silent_env().map_or(Ok(()), Err);
    };
    if !given.is_empty() {
        crate::outln!("from `lockslab up` on this machine:");
    }
    for (backend, answers) in &health {
        // Passwords hidden: `status` is what gets shown to a room.
        let url = crate::connect::redact(state.url(*backend).unwrap_or("-"));
        crate::outln!("  {:<9} {url}  {}", backend.name(), up_mark(*answers));
    }
    match &state.room {
        Some(room) => {
            crate::outln!("  a room on {room}: `lockslab up --room {room}` prints its export lines")
        }
        None => crate::outln!("  `lockslab up` prints the export lines, passwords included"),
    }
    if state.starting {
        anyhow::bail!(
            "`lockslab up` has not finished starting its servers (still running, or interrupted): \
             run `lockslab up` again, or `lockslab down`"
        );
    }
    let down: Vec<&str> = health
        .iter()
        .filter(|(_, answers)| !answers)
        .map(|(backend, _)| backend.name())
        .collect();
    if !down.is_empty() {
        anyhow::bail!(
            "{} of `lockslab up` not answering: run `lockslab up` to restart, or `lockslab down`",
            down.join(" and ")
        );
    }
    silent_env().map_or(Ok(()), Err)
}

/// A server's state in `status`'s words.
fn up_mark(answers: bool) -> colored::ColoredString {
    if answers {
        "up".green().bold()
    } else {
        "not answering".red().bold()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_lab_in_the_menu_is_a_subcommand() {
        use clap::CommandFactory;
        let cli = super::Cli::command();
        for lab in crate::menu::available() {
            assert!(
                cli.find_subcommand(lab.command).is_some(),
                "{}",
                lab.command
            );
        }
    }
}
