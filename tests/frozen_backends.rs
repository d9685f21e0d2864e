//! Servers that freeze or die mid-run: every lab must end within seconds, with one line that
//! names the server — and a worker the lab froze on purpose must not be mistaken for one.
//!
//! Each test freezes (SIGSTOP) or kills (SIGKILL) servers of its own, started by its own
//! `lockslab __serve`, never the test binary's shared ones. A frozen Postgres is the
//! postmaster and every backend: backends call setsid(), so the postmaster's process group
//! is not enough. Whatever a test froze is resumed by a guard, even when the test fails.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::BIN;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// The promise: a lab whose server froze or died exits within this long after the strike.
const BOUND: Duration = Duration::from_secs(15);

/// Private servers for one test, stopped when the test ends (their stdin closes).
struct OwnServers {
    urls: Value,
    keeper: Option<(Child, ChildStdin)>,
}

impl OwnServers {
    fn start() -> OwnServers {
        let (keeper, stdin, urls) = common::start_serve();
        OwnServers {
            urls,
            keeper: Some((keeper, stdin)),
        }
    }

    fn url(&self, backend: &str) -> String {
        self.urls[backend].as_str().unwrap().to_string()
    }

    /// The server's processes: for Postgres, the postmaster and its children.
    fn processes(&self, backend: &str) -> Vec<i32> {
        let main = self.urls["pids"][backend]
            .as_i64()
            .expect("__serve prints pids") as i32;
        let mut pids = vec![main];
        if backend == "postgres" {
            pids.extend(common::children_of(main as u32).iter().map(|c| c.0 as i32));
        }
        pids
    }

    /// A lab run against these servers only.
    fn lab(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env("LOCKSLAB_REDIS_URL", self.url("redis"))
            .env("LOCKSLAB_ETCD_URL", self.url("etcd"))
            .env("LOCKSLAB_POSTGRES_URL", self.url("postgres"))
            .env("NO_COLOR", "1")
            .env_remove("LOCKSLAB_PRIVATE_SERVERS");
        command
    }
}

impl Drop for OwnServers {
    fn drop(&mut self) {
        if let Some((mut child, stdin)) = self.keeper.take() {
            drop(stdin);
            let _ = child.wait();
        }
    }
}

/// Processes this test stopped: resumed when the guard goes, whatever happened meanwhile.
struct Stopped(Vec<i32>);

impl Stopped {
    fn freeze(pids: Vec<i32>) -> Stopped {
        // The postmaster first: once it is stopped it forks no new backend.
        for &pid in &pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        }
        Stopped(pids)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
        }
    }
}

enum Strike {
    Freeze,
    Kill,
}

/// What a lab did after its server was struck.
struct Outcome {
    status: Option<i32>,
    after_strike: Duration,
    stderr: String,
}

impl Outcome {
    fn error_lines(&self) -> Vec<String> {
        common::error_messages(&self.stderr)
    }

    /// Exit 4 (could not run) within the bound, and one line on stderr that says `what` about `server`.
    fn assert_one_line(&self, server: &str, what: &str) {
        assert!(
            self.after_strike < BOUND,
            "took {:?} after the strike (bound {BOUND:?}); stderr:\n{}",
            self.after_strike,
            self.stderr
        );
        assert_eq!(self.status, Some(4), "stderr:\n{}", self.stderr);
        let lines = self.error_lines();
        assert_eq!(lines.len(), 1, "one line, not:\n{}", self.stderr);
        assert!(
            lines[0].contains(&format!("{server} at ")) && lines[0].contains(what),
            "the line must say that {server} {what}: {}",
            lines[0]
        );
    }
}

/// Runs a lab (`--json`), strikes `backend` once the lab has shown `after` events, and
/// waits for the lab to exit (killing it after twice the bound, so that a hang fails the
/// test instead of hanging it).
fn strike_mid_run(backend: &str, strike: Strike, lab_args: &[&str], after: usize) -> Outcome {
    let servers = OwnServers::start();
    let mut args = lab_args.to_vec();
    args.push("--json");
    let mut lab = servers
        .lab(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting the lab");
    let stdout = lab.stdout.take().unwrap();
    let mut stderr = lab.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let errors = thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    for seen in 0..after {
        rx.recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the lab showed only {seen} events"));
    }
    let pids = servers.processes(backend);
    let _stopped = match strike {
        Strike::Freeze => Some(Stopped::freeze(pids)),
        Strike::Kill => {
            for &pid in &pids {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            None
        }
    };
    let struck = Instant::now();
    let status = loop {
        if let Some(status) = lab.try_wait().unwrap() {
            break status.code();
        }
        if struck.elapsed() > BOUND * 2 {
            let _ = lab.kill();
            let _ = lab.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let after_strike = struck.elapsed();
    let stderr = errors.join().unwrap();
    Outcome {
        status,
        after_strike,
        stderr,
    }
}

#[test]
fn gc_pause_ends_when_postgres_freezes() {
    // Six events in: A froze itself and B is trying; A's write will meet the frozen store.
    strike_mid_run("postgres", Strike::Freeze, &["gc-pause"], 6).assert_one_line(
        "Postgres",
        "did not answer within 5s (frozen or overloaded?)",
    );
}

#[test]
fn skip_locked_ends_when_postgres_freezes() {
    strike_mid_run("postgres", Strike::Freeze, &["skip-locked"], 3).assert_one_line(
        "Postgres",
        "did not answer within 5s (frozen or overloaded?)",
    );
}

#[test]
fn etcd_vs_redis_ends_when_postgres_freezes() {
    // Depending on the moment, a worker meets the frozen server while connecting ("no
    // answer within 3s") or mid-call ("within 5s").
    strike_mid_run("postgres", Strike::Freeze, &["etcd-vs-redis"], 8)
        .assert_one_line("Postgres", "did not answer");
}

#[test]
fn gc_pause_ends_when_redis_freezes() {
    let outcome = strike_mid_run("redis", Strike::Freeze, &["gc-pause"], 6);
    outcome.assert_one_line("Redis", "did not answer within 5s (frozen or overloaded?)");
    assert!(
        !outcome.stderr.contains("os error 11"),
        "{}",
        outcome.stderr
    );
}

#[test]
fn naive_ends_when_redis_freezes() {
    strike_mid_run("redis", Strike::Freeze, &["naive"], 2)
        .assert_one_line("Redis", "did not answer within 5s (frozen or overloaded?)");
}

#[test]
fn etcd_vs_redis_ends_when_etcd_freezes() {
    strike_mid_run("etcd", Strike::Freeze, &["etcd-vs-redis"], 8).assert_one_line("etcd", "");
}

#[test]
fn gc_pause_names_a_killed_postgres() {
    strike_mid_run("postgres", Strike::Kill, &["gc-pause"], 6)
        .assert_one_line("Postgres", "closed the connection");
}

#[test]
fn skip_locked_names_a_killed_postgres() {
    strike_mid_run("postgres", Strike::Kill, &["skip-locked"], 3)
        .assert_one_line("Postgres", "closed the connection");
}

#[test]
fn gc_pause_names_a_killed_redis() {
    strike_mid_run("redis", Strike::Kill, &["gc-pause"], 6)
        .assert_one_line("Redis", "closed the connection");
}

#[test]
fn etcd_vs_redis_names_a_killed_etcd() {
    strike_mid_run("etcd", Strike::Kill, &["etcd-vs-redis"], 8).assert_one_line("etcd", "");
}

/// A test's name as this binary's libtest knows it: `stopped_client` when this file is a
/// binary of its own, `frozen_backends::stopped_client` inside tests/suite.rs.
fn this_binarys_name_of(test: &str) -> String {
    match module_path!().split_once("::") {
        Some((_crate, module)) => format!("{module}::{test}"),
        None => test.to_string(),
    }
}

/// The other side of the bound: a client process stopped *while its own call is in flight*,
/// for longer than the bound, gets its answer when it resumes. The server answered during
/// the stop; a watchdog that read the clock would see 8s gone and shut the connection.
///
/// The client is this test binary re-run as [`stopped_client`], so that stopping it stops
/// nothing else.
#[test]
fn a_client_stopped_mid_call_keeps_its_answer() {
    let servers = OwnServers::start();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &this_binarys_name_of("stopped_client"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env("FROZEN_BACKENDS_CLIENT_URL", servers.url("postgres"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting the client");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut output = Vec::new();
    loop {
        let line = lines.next().expect("the client ended early").unwrap();
        output.push(line.clone());
        if line.ends_with("calling") {
            break;
        }
    }
    // The call (pg_sleep(1)) is in flight: stop the client past the 5s bound and beyond.
    thread::sleep(Duration::from_millis(300));
    {
        let _stopped = Stopped::freeze(vec![child.id() as i32]);
        thread::sleep(Duration::from_secs(8));
    }
    output.extend(lines.map_while(Result::ok));
    let status = child.wait().unwrap();
    assert!(status.success(), "the client failed: {output:?}");
    assert!(
        output.iter().any(|l| l.ends_with("answered")),
        "the call must return its answer: {output:?}"
    );
}

/// Runs only inside [`a_client_stopped_mid_call_keeps_its_answer`].
#[test]
fn stopped_client() {
    let Ok(url) = std::env::var("FROZEN_BACKENDS_CLIENT_URL") else {
        return;
    };
    let mut db = lockslab::connect::postgres(&url).expect("connecting");
    // Let the guard start watching, then make a call that the test stops midway.
    thread::sleep(Duration::from_millis(300));
    println!("calling");
    let row = db
        .query_one("SELECT pg_sleep(1)::text || 'done'", &[])
        .unwrap_or_else(|e| panic!("the call failed: {}", lockslab::connect::pg_failure(&e)));
    assert_eq!(row.get::<_, String>(0), "done");
    // And the connection still works afterwards.
    db.query_one("SELECT 1", &[])
        .expect("the connection survived");
    println!("answered");
}

/// Under load, etcd-vs-redis's waiter may not be waiting yet when the holder's work ends:
/// a fact about the machine, not the command line (exit 4, not 2). Stopping the waiter as
/// soon as it starts plays that load.
#[test]
fn a_slow_waiter_is_not_a_usage_error() {
    let servers = OwnServers::start();
    for _attempt in 0..3 {
        let mut lab = servers
            .lab(&["etcd-vs-redis", "--work", "1s"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let mut stopped = Vec::new();
        // The lab starts its four holders at once and each lane's waiter only once that
        // holder has the lock: every worker after the first four is a waiter. Each is
        // stopped as soon as it is seen (a busy machine lets some say "waiting" first; one
        // caught in time is enough). Pids grow: a waiter seen in the same look as the
        // holders sorts after them.
        let mut workers_seen: Vec<u32> = Vec::new();
        while started.elapsed() < Duration::from_secs(20) {
            if lab.try_wait().unwrap().is_some() {
                break;
            }
            let mut new: Vec<u32> = common::children_of(lab.id())
                .into_iter()
                .filter(|(pid, _, name)| name == "lockslab" && !workers_seen.contains(pid))
                .map(|(pid, _, _)| pid)
                .collect();
            new.sort_unstable();
            for pid in new {
                if workers_seen.len() >= 4 {
                    stopped.push(Stopped::freeze(vec![pid as i32]));
                }
                workers_seen.push(pid);
            }
            if workers_seen.len() >= 8 {
                break;
            }
            thread::sleep(Duration::from_millis(1));
        }
        let output = lab.wait_with_output().unwrap();
        drop(stopped);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !stderr.contains("was still starting") {
            continue; // the waiter said "waiting" before we caught it: try again
        }
        assert_eq!(output.status.code(), Some(4), "{stderr}");
        assert!(
            !stderr.contains("For more information, try '--help'"),
            "{stderr}"
        );
        return;
    }
    panic!("could not catch the waiter before it was waiting, in 3 attempts");
}

/// "Leave out --redis-url" is advice for a URL that came from that flag; a URL from the
/// environment is unset instead.
#[test]
fn the_advice_fits_where_the_url_came_from() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = format!("redis://127.0.0.1:{port}");
    let run = |flag: bool| {
        let mut command = Command::new(BIN);
        command.arg("gc-pause").env("NO_COLOR", "1");
        if flag {
            command.args(["--redis-url", &dead]);
            command.env_remove("LOCKSLAB_REDIS_URL");
        } else {
            command.env("LOCKSLAB_REDIS_URL", &dead);
        }
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(4));
        String::from_utf8_lossy(&output.stderr).into_owned()
    };
    let from_flag = run(true);
    assert!(from_flag.contains("leave out --redis-url"), "{from_flag}");
    let from_env = run(false);
    assert!(from_env.contains("unset LOCKSLAB_REDIS_URL"), "{from_env}");
    assert!(!from_env.contains("leave out --redis-url"), "{from_env}");
}
