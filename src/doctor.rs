//! `lockslab doctor`: the day-before check. What is installed, whether private servers
//! start and how fast, which servers the labs would use and whether they answer, and how
//! many connections a shared Postgres has left — one line each, OK or what to do.
//!
//! It exits 4 (could not run, in [`crate::exit::Exit`]'s words) when any lab could not run
//! here, so that `lockslab doctor && …` means the session can start.

use std::process::Command;
use std::time::Instant;

use anyhow::{Result, bail};
use colored::Colorize;

use crate::connect::{self, Backend};
use crate::menu;
use crate::output::{Style, human};
use crate::servers::{
    self, ALL, Lifetime, PG_CONNECTIONS_AT_DEFAULTS, PG_CONNECTIONS_PER_LAB, PrivateServers,
    ServerArgs, UpState,
};

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  lockslab doctor                       what this machine's labs would use
  lockslab doctor --postgres-url URL    check a shared Postgres (its free
                                        connections too)
  lockslab doctor --private-servers     only the private servers

Exit status: 0 every lab can run here · 2 bad command line · 4 at least one
could not run here (each line says what to do)")]
pub struct DoctorArgs {
    #[command(flatten)]
    pub servers: ServerArgs,
}

/// One finding: fine, to be fixed, or for information.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    Ok,
    Fix,
    Note,
}

fn say(mark: Mark, text: &str) {
    let tag = match mark {
        Mark::Ok => "OK ".green().bold(),
        Mark::Fix => "FIX".red().bold(),
        Mark::Note => " · ".dimmed(),
    };
    for (i, line) in crate::output::wrap(text, 80 - 7).iter().enumerate() {
        if i == 0 {
            crate::outln!("  {tag}  {line}");
        } else {
            crate::outln!("         {line}");
        }
    }
}

/// Advice on the line below a finding, indented under its text.
fn advise(text: &str) {
    for (i, line) in crate::output::wrap(text, 80 - 9).iter().enumerate() {
        let arrow = if i == 0 { "→" } else { " " };
        crate::outln!("       {}", format!("{arrow} {line}").yellow());
    }
}

/// The first line a tool prints for `--version`, or why there is none.
fn version_of(program: &std::path::Path) -> Result<String> {
    let output = Command::new(program).arg("--version").output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let first = text.lines().next().unwrap_or_default().trim().to_string();
    if !output.status.success() || first.is_empty() {
        bail!("`{} --version` failed", program.display());
    }
    Ok(first)
}

/// The version number (`7.0.15`) in a tool's version line, as (major, minor).
fn major_minor(line: &str) -> Option<(u32, u32)> {
    line.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|word| word.contains('.') && word.starts_with(|c: char| c.is_ascii_digit()))
        .and_then(|word| {
            let mut parts = word.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
}

/// A server binary, its version against the oldest the labs work with.
fn check_tool(name: &str, backend: Backend, oldest: (u32, u32), package: &str) -> bool {
    let found = servers::find_binary(name, backend).and_then(|path| {
        let line = version_of(&path)?;
        Ok((path, line))
    });
    match found {
        Ok((path, line)) => {
            let version = major_minor(&line);
            let shown = version.map_or(line.clone(), |(a, b)| format!("{a}.{b}"));
            if version.is_some_and(|v| v < oldest) {
                say(
                    Mark::Fix,
                    &format!("{name:<13} {shown} is older than {}.{}", oldest.0, oldest.1),
                );
                advise(&format!(
                    "install a newer {package}, or give {} a newer server",
                    backend.flag()
                ));
                false
            } else {
                say(
                    Mark::Ok,
                    &format!("{name:<13} {shown:<8} {}", path.display()),
                );
                true
            }
        }
        Err(_) => {
            say(Mark::Fix, &format!("{name:<13} not installed"));
            advise(&format!(
                "`sudo apt-get install {package}` (or scripts/setup); without it, labs need {}",
                backend.flag()
            ));
            false
        }
    }
}

/// The clients the walkthroughs' by-hand steps type (`redis-cli GET …`, `psql -c …`,
/// `etcdctl get …`, `… | jq`): the labs run without them, a reader following along does not.
fn check_hand_tools() {
    for (name, backend, package) in [
        ("redis-cli", Backend::Redis, "redis-tools"),
        ("psql", Backend::Postgres, "postgresql-client"),
        ("etcdctl", Backend::Etcd, "etcd-client"),
        ("jq", Backend::Redis, "jq"),
    ] {
        match servers::find_binary(name, backend) {
            Ok(path) => say(
                Mark::Ok,
                &format!("{name:<13} {:<8} {}", "by hand", path.display()),
            ),
            Err(_) => {
                say(
                    Mark::Note,
                    &format!("{name:<13} not found: the walkthroughs' by-hand steps use it"),
                );
                advise(&format!(
                    "`sudo apt-get install {package}` (or scripts/setup)"
                ));
            }
        }
    }
}

/// `lockslab challenge`'s Python templates and reference clients: the Debian python3 with
/// its redis and psycopg2 modules (a pyenv or venv python3 earlier on PATH has its own).
fn check_challenge_python() {
    let has_modules = |python: &str| {
        std::process::Command::new(python)
            .args(["-c", "import redis, psycopg2"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if has_modules("/usr/bin/python3") {
        say(
            Mark::Ok,
            "python3       by hand  /usr/bin/python3 with redis, psycopg2 (challenge)",
        );
        if !has_modules("python3") {
            say(
                Mark::Note,
                "python3       the python3 on your PATH lacks redis or psycopg2",
            );
            advise(
                "run clients with `/usr/bin/python3`, as labs/11-challenge.md does, not `python3`",
            );
        }
    } else {
        say(
            Mark::Note,
            "python3       without redis or psycopg2: lockslab challenge's references use them",
        );
        advise("`sudo apt-get install python3-redis python3-psycopg2` (or scripts/setup)");
    }
}

/// How `lockslab challenge` would keep a learner's client from lockslab's own secrets and
/// terminal: as root, a user of the run's own; else a bwrap sandbox; else not at all (the
/// clients are trusted, and `challenge --isolated` refuses to run).
fn check_challenge_isolation() {
    if nix::unistd::Uid::effective().is_root() {
        say(
            Mark::Ok,
            "isolation     as root  challenge clients run each as a user of its own",
        );
        if crate::freezer::available() {
            say(
                Mark::Ok,
                "freezer       cgroup   a pause freezes each client's own cgroup",
            );
        } else {
            say(
                Mark::Note,
                "freezer       none     no cgroup v1 freezer at /sys/fs/cgroup/freezer: a pause \
                 is SIGSTOP, which a client that sends itself SIGCONT can undo",
            );
        }
        return;
    }
    match crate::challenge::isolation::sandbox() {
        Ok(bwrap) => say(
            Mark::Ok,
            &format!(
                "bwrap         sandbox  {} (challenge clients run sandboxed)",
                bwrap.display()
            ),
        ),
        Err(why) => {
            say(
                Mark::Note,
                &format!("bwrap         {why}: challenge clients would run as you, trusted"),
            );
            advise(
                "`sudo apt-get install bubblewrap` (or scripts/setup) to sandbox them; \
                 `challenge --isolated` refuses to run without",
            );
        }
    }
}

/// Can this machine partition lockslab's own hosts (src/hosts)? Doctor makes two hosts
/// and their link, and lets them go: nothing else tells whether the kernel allows it.
fn check_partitions() {
    match crate::hosts::Hosts::unavailable() {
        None => say(
            Mark::Ok,
            "partitions    can      hosts of lockslab's own, without root",
        ),
        Some(why) => {
            say(Mark::Note, &format!("partitions    cannot   {why}"));
            advise(
                "the partition faults need user namespaces (sysctl \
                 kernel.unprivileged_userns_clone=1 on older Debian) and iproute2",
            );
        }
    }
}

/// A lab's name in doctor's list: its number right-aligned, so that `10 queue` lines up
/// under ` 9 lease-guard`.
fn lab_line(number: u8, command: &str) -> String {
    format!("{number:>2} {command:<14}")
}

/// libfaketime, which lab 9's clock faults preload into a worker: found, or how to get it.
/// True when found.
fn check_faketime() -> bool {
    match crate::nemesis::clock::library() {
        Some(path) => {
            say(
                Mark::Ok,
                &format!("{:<13} {:<8} {path}", "libfaketime", "lab 9"),
            );
            true
        }
        None => {
            say(
                Mark::Fix,
                "libfaketime   lab 9    not found: its clock faults (clock-back, \
                 clock-slow, clock-fast) cannot run",
            );
            advise("apt-get install faketime (Debian, Ubuntu)");
            false
        }
    }
}

/// Where the labs would find one backend, as far as doctor could tell.
enum Source {
    /// A server that answers, and where it came from.
    Found { url: String, from: &'static str },
    /// A server that was named (flag, environment, `lockslab up`) and does not answer.
    Broken(String),
    /// Nothing named or answering: a private server would be started.
    Private,
}

fn locate(args: &ServerArgs, backend: Backend, up: Option<&UpState>) -> Source {
    if let Some(url) = args.given(backend) {
        return match connect::probe(backend, url) {
            Ok(()) => Source::Found {
                url: url.to_string(),
                from: "given",
            },
            Err(err) => Source::Broken(format!("{err:#}")),
        };
    }
    if args.private_servers {
        return Source::Private;
    }
    if let Some(state) = up {
        return match state.answering_url(backend) {
            Ok(url) => Source::Found {
                url,
                from: "from `lockslab up`",
            },
            Err(err) => Source::Broken(format!("{err:#}")),
        };
    }
    let default = servers::compose_default(backend);
    if servers::answers_quickly(backend, default) {
        Source::Found {
            url: default.to_string(),
            from: "found on its default port",
        }
    } else {
        Source::Private
    }
}

/// Free client connections on a Postgres: max_connections less the superuser reserve and
/// the clients connected now. (max, in use, free)
fn pg_connections(url: &str) -> Result<(i64, i64, i64)> {
    let mut client = connect::postgres(url)?;
    let row = client.query_one(
        "SELECT current_setting('max_connections')::bigint,
                current_setting('superuser_reserved_connections')::bigint,
                (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')",
        &[],
    )?;
    let (max, reserved, used): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    Ok((max, used, max - reserved - used))
}

/// `lockslab doctor`.
pub fn run(args: &DoctorArgs) -> Result<()> {
    Style::detect(false);
    crate::outln!(
        "{} — can this machine run the labs?",
        "lockslab doctor".bold()
    );
    crate::outln!();
    crate::outln!("{}", "Tools".bold());
    let mut installed = Vec::new();
    for (name, backend, oldest, package) in [
        ("redis-server", Backend::Redis, (7, 0), "redis-server"),
        ("etcd", Backend::Etcd, (3, 3), "etcd-server"),
        ("postgres", Backend::Postgres, (14, 0), "postgresql"),
    ] {
        let mut ok = check_tool(name, backend, oldest, package);
        if backend == Backend::Postgres && ok {
            ok = check_tool("initdb", backend, oldest, package);
        }
        if ok {
            installed.push(backend);
        }
    }
    match version_of(std::path::Path::new("protoc")) {
        Ok(line) => say(
            Mark::Ok,
            &format!(
                "{:<13} {:<8} (only to build lockslab)",
                "protoc",
                major_minor(&line).map_or(line.clone(), |(a, b)| format!("{a}.{b}"))
            ),
        ),
        Err(_) => say(
            Mark::Note,
            "protoc        not found: needed only to build lockslab",
        ),
    }
    check_hand_tools();
    let faketime = check_faketime();
    check_challenge_python();
    check_challenge_isolation();
    check_partitions();

    crate::outln!();
    crate::outln!("{}", "Servers the labs would use".bold());
    let up = if args.servers.private_servers {
        None
    } else {
        UpState::load().ok().flatten()
    };
    let sources: Vec<(Backend, Source)> = ALL
        .iter()
        .map(|&backend| (backend, locate(&args.servers, backend, up.as_ref())))
        .collect();
    for (backend, source) in &sources {
        match source {
            Source::Found { url, from } => say(
                Mark::Ok,
                &format!("{:<9} {} ({from})", backend.name(), connect::redact(url)),
            ),
            Source::Broken(why) => {
                say(Mark::Fix, &format!("{:<9} {why}", backend.name()));
            }
            Source::Private => say(
                Mark::Note,
                &format!("{:<9} none set up: a private one each run", backend.name()),
            ),
        }
    }

    // Private servers: every lab with nothing configured starts them, and so do the tests.
    let startable: Vec<Backend> = ALL
        .iter()
        .copied()
        .filter(|b| installed.contains(b))
        .collect();
    let mut private_ok = Vec::new();
    if !startable.is_empty() {
        let names: Vec<&str> = startable.iter().map(|b| b.name()).collect();
        let started = Instant::now();
        match PrivateServers::start(&startable, Lifetime::ThisRun) {
            Ok(private) => {
                say(
                    Mark::Ok,
                    &format!(
                        "private {} started in {}",
                        names.join(", "),
                        human(started.elapsed())
                    ),
                );
                private_ok = startable.clone();
                drop(private);
            }
            Err(err) => {
                say(
                    Mark::Fix,
                    &format!("private {} did not start", names.join(", ")),
                );
                advise(&format!("{err:#}"));
            }
        }
    }

    if let Some((_, Source::Found { url, .. })) = sources
        .iter()
        .find(|(b, s)| *b == Backend::Postgres && matches!(s, Source::Found { .. }))
    {
        crate::outln!();
        crate::outln!("{}", "Shared Postgres".bold());
        match pg_connections(url) {
            Ok((max, used, free)) => {
                let runs = free / PG_CONNECTIONS_AT_DEFAULTS;
                let line = format!(
                    "{free} of {max} connections free ({used} in use): {runs} lab runs at once"
                );
                if runs >= 1 {
                    say(Mark::Ok, &line);
                } else {
                    say(Mark::Fix, &line);
                }
                advise(&format!(
                    "a lab run at its defaults holds up to {PG_CONNECTIONS_AT_DEFAULTS}, \
                     `no-lock --contention` up to {PG_CONNECTIONS_PER_LAB}; a room of 30 \
                     running any lab at once needs {} (`lockslab up --room` sets \
                     max_connections so)",
                    servers::room_pg_connections(30)
                ));
            }
            Err(err) => say(Mark::Fix, &format!("{err:#}")),
        }
    }

    crate::outln!();
    crate::outln!("{}", "Labs".bold());
    let usable = |backend: Backend| -> Result<(), String> {
        match sources.iter().find(|(b, _)| *b == backend).map(|(_, s)| s) {
            Some(Source::Found { .. }) => Ok(()),
            Some(Source::Broken(_)) => Err(format!("{} does not answer", backend.name())),
            _ if private_ok.contains(&backend) => Ok(()),
            _ => Err(format!("no {} to start", backend.name())),
        }
    };
    let mut cannot = Vec::new();
    for lab in menu::available() {
        let mut problems: Vec<String> = lab.needs.iter().filter_map(|b| usable(*b).err()).collect();
        if lab.command == "lease-guard" && !faketime {
            problems.push("no libfaketime for its clock faults".into());
        }
        let line = lab_line(lab.number, lab.command);
        if problems.is_empty() {
            // Doctor checked what the lab needs; it did not run it.
            say(
                Mark::Ok,
                &format!("{line} has what it needs (a run takes ~{})", lab.takes),
            );
        } else {
            say(Mark::Fix, &format!("{line} {}", problems.join("; ")));
            cannot.push(lab.command);
        }
    }
    if !cannot.is_empty() {
        bail!(
            "{} could not run here: fix the lines marked FIX above",
            cannot.join(", ")
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{lab_line, major_minor};

    #[test]
    fn lab_numbers_line_up_past_nine() {
        assert_eq!(lab_line(9, "lease-guard").find("lease-guard"), Some(3));
        assert_eq!(lab_line(10, "queue").find("queue"), Some(3));
    }

    #[test]
    fn versions_are_read_from_each_tools_own_line() {
        assert_eq!(
            major_minor("Redis server v=7.0.15 sha=00000000:0"),
            Some((7, 0))
        );
        assert_eq!(major_minor("etcd Version: 3.4.23"), Some((3, 4)));
        assert_eq!(
            major_minor("postgres (PostgreSQL) 15.18 (Debian 15.18-0+deb12u1)"),
            Some((15, 18))
        );
        assert_eq!(major_minor("libprotoc 3.21.12"), Some((3, 21)));
        assert_eq!(major_minor("no version here"), None);
    }
}
