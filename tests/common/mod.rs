//! What every integration test shares: real servers started once per test binary, the
//! lockslab binary, and a check of the process table.
//!
//! The servers come from `lockslab __serve`, which keeps private Redis, etcd and Postgres
//! on free loopback ports for as long as its stdin is open. The pipe's write end lives in
//! a static, so it closes when the test binary exits — however it exits — and the servers
//! are stopped and deleted with it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub use lockslab::events::{Event, Kind, What, facts};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_lockslab");

/// A short fenced gc-pause run: enough to start and use Redis and Postgres.
pub const QUICK_LAB: [&str; 7] = [
    "gc-pause",
    "--ttl",
    "300ms",
    "--pause",
    "600ms",
    "--fencing",
    "on",
];

pub struct Servers {
    pub redis: String,
    pub etcd: String,
    pub postgres: String,
    /// The superuser, which no lab is given: for tests that play the instructor.
    pub postgres_admin: String,
    keeper: Mutex<Option<(Child, ChildStdin)>>,
}

/// Runs when the test binary exits: closes the keeper's stdin, so that it stops and deletes
/// the servers, and waits for it. Without this wait the keeper would outlive the tests and
/// linger as a zombie until init reaped it.
extern "C" fn stop_servers_at_exit() {
    if let Some(servers) = SERVERS.get() {
        let taken = servers
            .keeper
            .lock()
            .ok()
            .and_then(|mut keeper| keeper.take());
        if let Some((mut child, stdin)) = taken {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

static SERVERS: OnceLock<Servers> = OnceLock::new();

/// Starts a `lockslab __serve` of its own: private Redis, etcd and Postgres that live until
/// the returned stdin closes. Returns the keeper, its stdin, and the JSON line of URLs (and
/// pids) it printed.
pub fn start_serve() -> (Child, ChildStdin, Value) {
    start_serve_with(&[])
}

/// [`start_serve`] with these variables added to the keeper's environment.
pub fn start_serve_with(env: &[(&str, &std::path::Path)]) -> (Child, ChildStdin, Value) {
    let mut keeper = Command::new(BIN)
        .arg("__serve")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting `lockslab __serve`");
    let stdin = keeper.stdin.take().unwrap();
    let mut line = String::new();
    BufReader::new(keeper.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("reading the server URLs");
    let urls: Value = serde_json::from_str(&line)
        .unwrap_or_else(|e| panic!("`lockslab __serve` said {line:?}: {e}"));
    (keeper, stdin, urls)
}

/// The servers of this test binary, started on first use.
pub fn servers() -> &'static Servers {
    SERVERS.get_or_init(|| {
        let (keeper, stdin, urls) = start_serve();
        let url = |name: &str| {
            urls[name]
                .as_str()
                .unwrap_or_else(|| panic!("no {name} URL in {urls}"))
                .to_string()
        };
        // SAFETY: registers a plain `extern "C" fn` that takes no arguments, as atexit expects.
        unsafe {
            nix::libc::atexit(stop_servers_at_exit);
        }
        Servers {
            redis: url("redis"),
            etcd: url("etcd"),
            postgres: url("postgres"),
            postgres_admin: url("postgres_admin"),
            keeper: Mutex::new(Some((keeper, stdin))),
        }
    })
}

/// A client of an etcd lockslab started, made as the labs make one: every etcd lockslab
/// starts has auth on, and its URL carries the root user.
pub async fn etcd_client_of(url: &str) -> etcd_client::Client {
    lockslab::connect::etcd(url).await.unwrap()
}

/// A lockslab command that uses this binary's servers and nothing from the environment.
pub fn lockslab(args: &[&str]) -> Command {
    let servers = servers();
    lockslab_on(args, [&servers.redis, &servers.etcd, &servers.postgres])
}

/// A lockslab command for a test that expects its command line to be refused before any
/// server is reached: it starts no servers for the test binary, and its URLs name a port
/// nothing listens on (port 1 wants root), so a refusal that came only after trying a
/// server shows that server's error and fails the test.
pub fn lockslab_offline(args: &[&str]) -> Command {
    lockslab_on(
        args,
        [
            "redis://default:offline@127.0.0.1:1",
            "http://root:offline@127.0.0.1:1",
            "postgres://lockslab:offline@127.0.0.1:1/lockslab",
        ],
    )
}

/// A lockslab command given these Redis, etcd and Postgres URLs and nothing else from the
/// environment.
fn lockslab_on(args: &[&str], [redis, etcd, postgres]: [&str; 3]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("LOCKSLAB_REDIS_URL", redis)
        .env("LOCKSLAB_ETCD_URL", etcd)
        .env("LOCKSLAB_POSTGRES_URL", postgres)
        .env("NO_COLOR", "1")
        // Lines as the labs compose them, unwrapped, for the tests that read them word by
        // word; tests/width.rs sets 80 to check what a projector shows.
        .env("COLUMNS", "1000")
        .env_remove("LOCKSLAB_PRIVATE_SERVERS");
    command
}

/// One line of `--json`: an event of the typed history, or None for the run's closing
/// verdict (verdicts are not typed: tests read them as JSON).
pub fn event_line(line: &str) -> Option<Event> {
    let value: Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
    if value["kind"] == "verdict" {
        return None;
    }
    Some(
        lockslab::events::read_line(value)
            .unwrap_or_else(|e| panic!("not an event of the typed history ({e}): {line}")),
    )
}

/// A whole `--json` output: its events, typed, and the verdict that must close it.
pub fn events_and_verdict(stdout: &str) -> (Vec<Event>, Value) {
    let mut lines: Vec<&str> = stdout.lines().collect();
    let last = lines.pop().expect("no output");
    let verdict: Value =
        serde_json::from_str(last).unwrap_or_else(|e| panic!("not JSON ({e}): {last}"));
    assert_eq!(
        verdict["kind"], "verdict",
        "the last line must be the verdict: {verdict}"
    );
    let events = lines
        .iter()
        .map(|line| event_line(line).unwrap_or_else(|| panic!("a verdict before the end: {line}")))
        .collect();
    (events, verdict)
}

/// Runs a lab with `--json` and returns its events and its final verdict object.
pub fn run_json(args: &[&str]) -> (Vec<Event>, Value, Output) {
    run_json_tagged(args, "")
}

/// [`run_json`] with `tag` in the lab's environment as `LOCKSLAB_TEST_TAG`: its workers
/// inherit it, so [`processes_tagged`] finds what this run left behind and nothing that a
/// test running beside it started.
pub fn run_json_tagged(args: &[&str], tag: &str) -> (Vec<Event>, Value, Output) {
    let mut all = args.to_vec();
    all.push("--json");
    let output = lockslab(&all)
        .env("LOCKSLAB_TEST_TAG", tag)
        .output()
        .expect("running lockslab");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "lockslab {all:?} failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let (events, verdict) = events_and_verdict(&stdout);
    (events, verdict, output)
}

/// One process, as `/proc/<pid>/stat` and `cmdline` describe it.
#[derive(Clone, Debug)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    /// The state letter: `R`, `S`, `T` (stopped), `Z` (zombie)…
    pub state: char,
    /// Start time in clock ticks since boot: with the pid, it tells a process from a later
    /// one that got the same pid.
    pub start: u64,
    /// The command name (`comm`, as in the parentheses of `stat`).
    pub name: String,
    /// The command line, arguments joined by spaces.
    pub cmdline: String,
}

/// Every process on the machine, read from `/proc` (one that exits meanwhile is left out).
pub fn process_table() -> Vec<Proc> {
    let mut table = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        // After the command name: state (field 3), ppid (4), … starttime (22).
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let (Some(state), Some(ppid), Some(start)) = (
            fields.first().and_then(|f| f.chars().next()),
            fields.get(1).and_then(|f| f.parse().ok()),
            fields.get(19).and_then(|f| f.parse().ok()),
        ) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        table.push(Proc {
            pid,
            ppid,
            state,
            start,
            name: stat[open + 1..close].to_string(),
            cmdline: String::from_utf8_lossy(&cmdline).replace('\0', " "),
        });
    }
    table
}

/// `roots` and every process below them in `table` (children, grandchildren…). Parents are
/// listed before their children often but not always: grown to a fixpoint.
pub fn family_in(table: &[Proc], roots: &mut std::collections::HashSet<i32>) {
    loop {
        let before = roots.len();
        for proc in table {
            if roots.contains(&proc.ppid) {
                roots.insert(proc.pid);
            }
        }
        if roots.len() == before {
            return;
        }
    }
}

/// The direct children of `pid`: (pid, state letter, command name).
pub fn children_of(pid: u32) -> Vec<(u32, char, String)> {
    process_table()
        .into_iter()
        .filter(|p| p.ppid == pid as i32)
        .map(|p| (p.pid as u32, p.state, p.name))
        .collect()
}

/// Every process whose command line mentions `needle`, with its state letter.
pub fn processes_mentioning(needle: &str) -> Vec<(u32, char, String)> {
    process_table()
        .into_iter()
        .filter(|p| p.cmdline.contains(needle))
        .map(|p| (p.pid as u32, p.state, p.cmdline))
        .collect()
}

/// A tag no other run of this test binary uses, for [`run_json_tagged`].
pub fn fresh_tag() -> String {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

/// Every process whose environment carries `LOCKSLAB_TEST_TAG=tag`.
pub fn processes_tagged(tag: &str) -> Vec<Proc> {
    let wanted = format!("LOCKSLAB_TEST_TAG={tag}");
    process_table()
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{}/environ", p.pid))
                .unwrap_or_default()
                .split(|b| *b == 0)
                .any(|var| var == wanted.as_bytes())
        })
        .collect()
}

/// Waits until `check` holds, for at most `timeout`.
pub fn eventually(timeout: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

/// Events of one kind from one worker.
pub fn events<'a>(events: &'a [Event], worker: &str, kind: Kind) -> Vec<&'a Event> {
    events.iter().filter(|e| e.is(worker, kind)).collect()
}

/// Every worker pid a run reported: the pid an event names (a worker's `waiting`, `queued`,
/// `ready`… and the process a fault hit), and the `pids` of a `workers` event, for labs that
/// start many at once.
pub fn worker_pids(events: &[Event]) -> Vec<i32> {
    let mut pids: Vec<i32> = events.iter().filter_map(Event::pid).collect();
    for event in events {
        if let What::Workers(w) = &event.what {
            pids.extend(&w.pids);
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The run id a run announced first (in its `run`, `workers` or `round` event).
pub fn run_id_of(events: &[Event]) -> Option<&str> {
    events.iter().find_map(Event::run_id)
}

/// The facts of a grant, if `event` is one.
pub fn acquired(event: &Event) -> Option<&facts::Acquired> {
    match &event.what {
        What::Acquired(a) => Some(a),
        _ => None,
    }
}

/// The facts of a release, if `event` is one.
pub fn released(event: &Event) -> Option<&facts::Released> {
    match &event.what {
        What::Released(r) => Some(r),
        _ => None,
    }
}

/// What the evidence showed, if `event` is a finding (two holders, a violation, a count,
/// exactly once, a lapse, a kept lock).
pub fn observed(event: &Event) -> Option<&facts::Observed> {
    event.observed()
}

/// No worker of the run is left running, stopped or zombie.
pub fn assert_gone(pids: &[i32]) {
    assert!(!pids.is_empty(), "the run reported no workers");
    for &pid in pids {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("__worker") && proc_state(pid) != Some('Z'),
            "worker {pid} is still there: {:?}",
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
        );
    }
}

/// The one-letter state of a process (`R`, `S`, `T`, `Z`…), or None when it is gone.
pub fn proc_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// `text` with its line breaks and runs of spaces made single spaces: an error wraps at 80
/// columns, as a projector shows it, and a phrase may break across two lines.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The messages lockslab wrote on stderr, each whole: a message wraps at 80 columns, and a
/// line that does not start with `lockslab` continues the one before.
pub fn error_messages(stderr: &str) -> Vec<String> {
    let mut messages: Vec<String> = Vec::new();
    for line in stderr.lines().filter(|l| !l.trim().is_empty()) {
        match messages.last_mut() {
            Some(message) if !line.starts_with("lockslab") => {
                message.push(' ');
                message.push_str(line.trim());
            }
            _ => messages.push(line.to_string()),
        }
    }
    messages
}

/// Runs a lab for a human (no --json), asserts it succeeded, and returns what it printed.
pub fn run_human(args: &[&str]) -> String {
    let output = lockslab(args).output().expect("running lockslab");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "lockslab {args:?} failed:\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !text.contains('\u{1b}'),
        "no colours when NO_COLOR is set or stdout is a pipe"
    );
    text
}

/// Runs a lab with `--json` and returns how long it took, its events and its verdict.
pub fn timed_json(args: &[&str]) -> (Duration, Vec<Event>, Value) {
    let started = Instant::now();
    let (events, verdict, _) = run_json(args);
    (started.elapsed(), events, verdict)
}

/// Prints min, median and max of a benchmark's samples, in milliseconds.
pub fn report(what: &str, samples: &mut [Duration]) {
    samples.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{what:<36} min {:>8.1}ms  median {:>8.1}ms  max {:>8.1}ms",
        ms(samples[0]),
        ms(samples[samples.len() / 2]),
        ms(samples[samples.len() - 1])
    );
}

/// The attempts must carry decision numbers 1, 2, … in the order they are listed.
fn decision_order_problem(attempts: &[Value]) -> Option<String> {
    let decided: Vec<i64> = attempts
        .iter()
        .filter_map(|a| a["decided"].as_i64())
        .collect();
    (decided != (1..=attempts.len() as i64).collect::<Vec<_>>())
        .then(|| format!("decision numbers are not 1..n in order: {decided:?}"))
}

/// What the store's record says of `late`'s write against `next`'s accepted one, worked out
/// here independently of the lab: "accepted"/"rejected" when decided after it, else "none".
fn late_write_in(attempts: &[Value], late: &str, next: &str) -> &'static str {
    let next_accepted = attempts
        .iter()
        .find(|a| a["writer"] == next && a["accepted"] == true);
    let late_last = attempts.iter().rev().find(|a| a["writer"] == late);
    match (late_last, next_accepted) {
        (Some(l), Some(n)) if l["decided"].as_i64() > n["decided"].as_i64() => {
            if l["accepted"] == true {
                "accepted"
            } else {
                "rejected"
            }
        }
        _ => "none",
    }
}

/// Every way one run of a lab 1 verdict could contradict the store's record it carries (the
/// attempts in decision order). Empty when the verdict is true to its evidence.
pub fn gc_pause_disagreements(run: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let attempts = run["attempts"].as_array().cloned().unwrap_or_default();
    problems.extend(decision_order_problem(&attempts));
    let last_accepted = attempts.iter().rev().find(|a| a["accepted"] == true);
    if last_accepted.map(|a| &a["writer"]) != Some(&run["final_writer"])
        && !(last_accepted.is_none() && run["final_writer"].is_null())
    {
        problems.push("the final writer is not the last accepted attempt".into());
    }
    let expected = late_write_in(&attempts, "A", "B");
    if run["late_write"] != expected {
        problems.push(format!(
            "late_write says {} but the attempts say {expected}",
            run["late_write"]
        ));
    }
    // A's write decided after B's means B held the lock before A let go.
    if matches!(expected, "accepted" | "rejected") && run["two_holders"] == false {
        problems.push("A wrote after B, yet the verdict says no two holders".into());
    }
    problems
}

/// Every way one cell of a lab 4 verdict could contradict the store's record it carries or
/// the releases the workers reported.
pub fn etcd_vs_redis_disagreements(cell: &Value, events: &[Event]) -> Vec<String> {
    let mut problems = Vec::new();
    let backend = cell["backend"].as_str().unwrap_or("?");
    let (holder, waiter) = (format!("{backend}:holder"), format!("{backend}:waiter"));
    let attempts = cell["attempts"].as_array().cloned().unwrap_or_default();
    problems.extend(decision_order_problem(&attempts));
    let expected = late_write_in(&attempts, &holder, &waiter);
    if cell["late_write"] != expected {
        problems.push(format!(
            "late_write says {} but the attempts say {expected}",
            cell["late_write"]
        ));
    }
    if expected != "none" && cell["two_holders"] != true {
        problems.push("the holder wrote after the waiter, yet not two holders".into());
    }
    let wanted_accepted = match expected {
        "accepted" => Value::Bool(true),
        "rejected" => Value::Bool(false),
        _ => Value::Null,
    };
    if cell["stale_write_accepted"] != wanted_accepted {
        problems.push("stale_write_accepted disagrees with late_write".into());
    }
    // etcd and Postgres queue the waiter: a holder whose release found its lock gone while
    // the waiter got the lock had a second holder beside it.
    let released = |worker: &str| {
        events
            .iter()
            .find(|e| e.is(worker, Kind::Released))
            .map(|e| e.released())
    };
    let waiter_got_it = events.iter().any(|e| e.is(&waiter, Kind::Acquired));
    if cell["scenario"] == "freeze"
        && !backend.starts_with("redis")
        && released(&holder) == Some(Some(false))
        && waiter_got_it
        && cell["two_holders"] != true
    {
        problems.push("the holder's release found its lock gone, yet not two holders".into());
    }
    problems
}

/// The events of one lab run are stamped on one clock: `t_ms` never restarts, across the
/// runs and scenarios of one command too. (Each worker's events are stamped by their own
/// reader thread as they arrive, and the lab prints them when it next reads its channel: on a
/// loaded machine a stamp can land tens of milliseconds behind one the lab stamped itself.
/// A step back under a second is arrival order; a restart drops by more, towards 0.)
pub fn assert_one_clock(events: &[Event]) {
    let stamps: Vec<u64> = events.iter().map(|e| e.t_ms).collect();
    let mut latest = 0;
    for &t in &stamps {
        assert!(
            t + 1_000 >= latest,
            "one clock for the whole run, but {t} came after {latest}: {stamps:?}"
        );
        latest = latest.max(t);
    }
}

/// A run's keys (Redis, `lockslab:<run id>:*`) and store rows are gone from the test servers.
pub fn assert_run_left_nothing(run_id: &str) {
    let mut redis = lockslab::connect::redis(&servers().redis).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("lockslab:{run_id}:*"))
        .query(&mut redis)
        .unwrap();
    assert!(keys.is_empty(), "keys left behind: {keys:?}");
    let mut db = lockslab::connect::postgres(&servers().postgres).unwrap();
    let rows: i64 = db
        .query_one(
            "SELECT count(*) FROM lockslab_attempt WHERE run_id = $1",
            &[&run_id],
        )
        .unwrap()
        .get(0);
    assert_eq!(rows, 0, "rows left behind for run {run_id}");
}

/// Every field of every part of the recorded verdict, reached again by the lab's replay
/// (nothing taken as recorded, nothing left out).
pub fn assert_every_recorded_field_replayed(replayed: &lockslab::labs::replay::Replayed) {
    for part in &replayed.parts {
        for (field, value) in part.recorded.as_object().unwrap() {
            assert_eq!(
                part.replayed.get(field),
                Some(value),
                "{}: {field}",
                part.name
            );
        }
    }
}

/// A lab's replay of a recorded run (what `lockslab check` runs) reached every field of the
/// recorded verdict it decides, and decided at least one in every part.
pub fn assert_replays(replayed: &lockslab::labs::replay::Replayed) {
    use lockslab::reproduce::compare::compare;
    let compared = compare(replayed);
    for part in &compared.parts {
        let wrong: Vec<String> = part
            .disagreeing()
            .map(|f| {
                format!(
                    "{}: recorded {:?}, replayed {}",
                    f.name, f.recorded, f.replayed
                )
            })
            .collect();
        assert!(wrong.is_empty(), "{}: {wrong:?}", part.name);
        assert!(
            part.compared().count() > 0,
            "{}: nothing compared",
            part.name
        );
    }
    assert!(!compared.parts.is_empty(), "no part replayed");
}

/// The store's attempts a verdict carries (`"attempts": [...]`), typed again.
pub fn attempts_from(attempts: &Value) -> Vec<lockslab::store::Attempt> {
    serde_json::from_value(attempts.clone()).unwrap_or_else(|err| panic!("{err}: {attempts}"))
}

/// The lines of `text` wider than `width`, each with its width in front, not counting one
/// that is a single unbreakable token (a URL) after its indentation. Width is display
/// columns, as a terminal counts them: an emoji such as ✅ takes two.
pub fn too_wide(text: &str, width: usize) -> Vec<String> {
    use textwrap::core::display_width;
    text.lines()
        .filter(|line| display_width(line) > width && line.trim_start().contains(' '))
        .map(|line| format!("{:>3} {line}", display_width(line)))
        .collect()
}

/// Runs its closure when dropped, however the test ends: a test that fails between a
/// `lockslab up` and its own `down` must not leave `up`'s servers running.
pub struct OnDrop<F: FnMut()>(pub F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}
