//! Faults aimed at lockslab itself and at its servers (issue 20): the lab process stopped
//! mid-run, a Redis that evicts keys, a dead run's leftovers on shared servers.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use lockslab::events::{Event, Kind, What};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// Plays a quick gc-pause (fenced), stopping the lab process itself with SIGSTOP for
/// `stop` right after it froze A, when `stop` is given. Returns stdout's lines and stderr.
fn gc_pause_stopping_the_lab(stop: Option<Duration>, extra: &[&str]) -> (Vec<String>, String) {
    let mut args = common::QUICK_LAB.to_vec();
    args.extend_from_slice(extra);
    let mut child = common::lockslab(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lab = Pid::from_raw(child.id() as i32);
    let mut lines = Vec::new();
    let mut stopped = false;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        // A `--json` line is an event of the typed history; the others are the screen's.
        let froze_a = serde_json::from_str::<Event>(&line).is_ok_and(|e| e.kind() == Kind::Frozen)
            || line.contains("frozen mid-work for")
            || line.contains("sees A (pid");
        if let Some(stop) = stop.filter(|_| froze_a && !stopped) {
            // The lab itself, not its workers (they are in process groups of their own).
            kill(lab, Signal::SIGSTOP).unwrap();
            std::thread::sleep(stop);
            kill(lab, Signal::SIGCONT).unwrap();
            stopped = true;
        }
        lines.push(line);
    }
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {stderr}\n{}", lines.join("\n"));
    assert!(
        stop.is_none() || stopped,
        "never saw A frozen:\n{}",
        lines.join("\n")
    );
    (lines, stderr)
}

fn parsed(lines: &[String]) -> (Vec<Event>, Value) {
    common::events_and_verdict(&lines.join("\n"))
}

fn warnings(events: &[Event]) -> Vec<(&Event, &lockslab::events::facts::Warning)> {
    events
        .iter()
        .filter_map(|e| match &e.what {
            What::Warning(w) => Some((e, w)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lab_stopped_itself_marks_its_figures_disturbed() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("run.svg");
    let svg_arg = svg.display().to_string();
    let (lines, stderr) =
        gc_pause_stopping_the_lab(Some(Duration::from_secs(2)), &["--json", "--svg", &svg_arg]);
    let (lines, verdict) = parsed(&lines);
    assert_eq!(verdict["disturbed"], true, "{verdict}");
    let paused = verdict["lab_paused_ms"].as_u64().unwrap();
    assert!(paused >= 1500, "a 2s stop, seen as {paused}ms");
    let gaps = verdict["lab_pauses"].as_array().unwrap();
    assert_eq!(gaps.len(), 1, "{verdict}");
    // On the timeline, where it happened, as a warning of the lab's lane.
    let warnings: Vec<&Event> = warnings(&lines)
        .into_iter()
        .filter(|(_, w)| w.lab_paused_ms.is_some())
        .map(|(e, _)| e)
        .collect();
    assert_eq!(warnings.len(), 1, "{lines:?}");
    assert!(warnings[0].text.contains("disturbed"));
    assert!(
        stderr.contains("disturbed: lockslab itself was not running"),
        "{stderr}"
    );
    // And in the picture.
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.contains("class=\"disturbed\""));
    assert!(drawn.contains("lockslab paused: disturbed"));
}

#[test]
fn a_lab_stopped_itself_says_so_under_its_verdict() {
    let (lines, _) = gc_pause_stopping_the_lab(Some(Duration::from_secs(2)), &[]);
    let text = lines.join("\n");
    // Under the verdict, last: what it says about the figures above.
    let last = lines.iter().rev().find(|l| !l.trim().is_empty()).unwrap();
    assert!(
        last.starts_with("⚠ disturbed: lockslab itself was not running for"),
        "{text}"
    );
    // And on the timeline, where it happened.
    assert!(
        lines
            .iter()
            .any(|l| l.contains("lab") && l.contains("times measured across this gap include it")),
        "{text}"
    );
}

#[test]
fn a_lab_not_stopped_is_not_marked_disturbed() {
    let (lines, stderr) = gc_pause_stopping_the_lab(None, &["--json"]);
    let (lines, verdict) = parsed(&lines);
    assert_eq!(verdict["disturbed"], false, "{verdict}");
    assert_eq!(verdict["lab_paused_ms"], 0);
    assert_eq!(verdict["lab_pauses"], serde_json::json!([]));
    assert!(warnings(&lines).is_empty(), "{lines:?}");
    assert!(!stderr.contains("disturbed"), "{stderr}");
}

/// A redis-server of a test's own, with the settings it is started with; stopped on drop.
struct OwnRedis {
    child: std::process::Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl OwnRedis {
    fn start(settings: &[&str]) -> OwnRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let child = std::process::Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .args(settings)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting redis-server");
        let url = format!("redis://127.0.0.1:{port}");
        let client = redis::Client::open(url.as_str()).unwrap();
        let answered = common::eventually(Duration::from_secs(20), || {
            client
                .get_connection()
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok()
        });
        assert!(answered, "redis-server on port {port} did not answer");
        OwnRedis {
            child,
            url,
            _dir: dir,
        }
    }

    fn command(&self, args: &[&str]) {
        let mut conn = redis::Client::open(self.url.as_str())
            .unwrap()
            .get_connection()
            .unwrap();
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query::<redis::Value>(&mut conn).unwrap();
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_redis_that_evicts_keys_is_refused_before_the_lab_plays() {
    for (policy, lab) in [("allkeys-lru", "gc-pause"), ("volatile-ttl", "naive")] {
        let redis = OwnRedis::start(&["--maxmemory", "3mb", "--maxmemory-policy", policy]);
        let output = common::lockslab(&[lab])
            .env("LOCKSLAB_REDIS_URL", &redis.url)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert_eq!(output.status.code(), Some(4), "{lab}: {stderr}\n{stdout}");
        assert!(
            stderr.contains(&format!("maxmemory-policy {policy}, maxmemory 3145728"))
                && stderr.contains("CONFIG SET maxmemory-policy noeviction"),
            "{lab}: {stderr}"
        );
        assert!(!stdout.contains("took the lock"), "{lab} played: {stdout}");
    }
}

/// Plays a quick gc-pause on `redis`, doing `meanwhile` to it while A is frozen.
fn gc_pause_on(
    redis: &OwnRedis,
    meanwhile: impl FnOnce(&OwnRedis),
) -> (Option<i32>, String, String) {
    gc_pause_with(&common::QUICK_LAB, redis, meanwhile)
}

fn gc_pause_with(
    args: &[&str],
    redis: &OwnRedis,
    meanwhile: impl FnOnce(&OwnRedis),
) -> (Option<i32>, String, String) {
    lab_on(args, "sees A (pid", redis, meanwhile)
}

/// Plays `args` on `redis`, doing `meanwhile` to it once a line containing `when` appears.
fn lab_on(
    args: &[&str],
    when: &str,
    redis: &OwnRedis,
    meanwhile: impl FnOnce(&OwnRedis),
) -> (Option<i32>, String, String) {
    let mut child = common::lockslab(args)
        .env("LOCKSLAB_REDIS_URL", &redis.url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = Vec::new();
    let mut meanwhile = Some(meanwhile);
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if line.contains(when)
            && let Some(act) = meanwhile.take()
        {
            act(redis);
        }
        stdout.push(line);
    }
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let status = child.wait().unwrap();
    assert!(
        meanwhile.is_none(),
        "never saw A frozen: {}",
        stdout.join("\n")
    );
    (status.code(), stdout.join("\n"), stderr)
}

#[test]
fn keys_flushed_during_a_run_are_not_called_an_expiry() {
    let redis = OwnRedis::start(&[]);
    let run = gc_pause_on(&redis, |redis| redis.command(&["FLUSHALL"]));
    assert!(
        !run.1.contains("has expired"),
        "a flush called an expiry: {}",
        run.1
    );
    assert_no_verdict_for_lost_keys(run, "FLUSHALL or FLUSHDB ran 1 time(s)");
}

#[test]
fn a_lock_key_deleted_by_another_client_is_not_called_an_expiry() {
    let redis = OwnRedis::start(&[]);
    let lab = [
        "gc-pause",
        "--ttl",
        "2s",
        "--pause",
        "2500ms",
        "--fencing",
        "on",
    ];
    // Another client deletes A's lock key while A is frozen, well inside its 2 s TTL.
    let run = gc_pause_with(&lab, &redis, |redis| {
        delete_keys_after(
            redis,
            "lockslab:*:gc-pause:*:lock",
            Duration::from_millis(300),
        )
    });
    let (_, stdout, stderr) = &run;
    assert!(
        !stdout.contains("has expired"),
        "a DEL called an expiry: {stdout}"
    );
    assert!(
        stdout.contains("A's key vanished before its TTL (deleted or lost)"),
        "{stdout}"
    );
    assert!(stderr.contains("no key expired meanwhile"), "{stderr}");
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "one line says why: {stderr}"
    );
    assert_no_verdict_for_lost_keys(run, "before its TTL could end");
}

/// Waits `after`, then deletes the one key matching `pattern`, as another client would.
fn delete_keys_after(redis: &OwnRedis, pattern: &str, after: Duration) {
    std::thread::sleep(after);
    let mut conn = redis::Client::open(redis.url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(pattern).query(&mut conn).unwrap();
    assert_eq!(keys.len(), 1, "one lock key: {keys:?}");
    redis::cmd("DEL")
        .arg(&keys[0])
        .query::<i64>(&mut conn)
        .unwrap();
}

#[test]
fn lab_2_does_not_call_a_deleted_or_flushed_lock_key_a_lapse() {
    let lab = ["naive", "wrong-release", "--ttl", "2s", "--work", "3s"];
    let redis = OwnRedis::start(&[]);
    let (code, stdout, stderr) = lab_on(&lab, "A       took the lock", &redis, |redis| {
        delete_keys_after(
            redis,
            "lockslab:*:naive:wrong-release:*:lock",
            Duration::from_millis(300),
        )
    });
    assert_eq!(code, Some(4), "{stderr}\n{stdout}");
    assert!(
        !stdout.contains("A's key expired"),
        "a DEL called an expiry: {stdout}"
    );
    assert!(
        stdout.contains("A's key vanished before its TTL (deleted or lost)"),
        "{stdout}"
    );
    assert!(
        stderr.contains("no verdict: A's lock key went without its TTL"),
        "{stderr}"
    );

    let redis = OwnRedis::start(&[]);
    let (code, stdout, stderr) = lab_on(&lab, "A       took the lock", &redis, |redis| {
        redis.command(&["FLUSHALL"])
    });
    assert_eq!(code, Some(4), "{stderr}\n{stdout}");
    assert!(
        !stdout.contains("A's key expired"),
        "a flush called an expiry: {stdout}"
    );
    assert!(
        stderr.contains("FLUSHALL or FLUSHDB ran 1 time(s)"),
        "{stderr}"
    );
}

/// The lab failed instead of calling a lost key an expiry, and said why: at once, when it saw
/// the key go, or at the end from the server's counters.
fn assert_no_verdict_for_lost_keys(
    (code, stdout, stderr): (Option<i32>, String, String),
    cause: &str,
) {
    assert_eq!(code, Some(4), "{stderr}\n{stdout}");
    assert!(
        (stderr.contains("lost keys during this run without their TTL")
            || stderr.contains("no verdict: A's lock key went without its TTL ending it"))
            && stderr.contains(cause),
        "{stderr}"
    );
    assert!(!stdout.contains("Verdict"), "no verdict: {stdout}");
}

#[test]
fn keys_evicted_during_a_run_are_not_called_an_expiry() {
    // Started without a limit (accepted), then made to evict while A is frozen.
    let redis = OwnRedis::start(&[]);
    let run = gc_pause_on(&redis, |redis| {
        redis.command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-random"]);
        redis.command(&["CONFIG", "SET", "maxmemory", "2mb"]);
        let filler = "x".repeat(100_000);
        for i in 0..60 {
            redis.command(&["SET", &format!("filler:{i}"), &filler]);
        }
    });
    assert_no_verdict_for_lost_keys(run, "INFO stats evicted_keys 0 → ");
}

#[test]
fn a_redis_that_loses_nothing_gives_its_verdict() {
    let redis = OwnRedis::start(&[]);
    let (code, stdout, stderr) = gc_pause_on(&redis, |_| {});
    assert_eq!(code, Some(0), "{stderr}\n{stdout}");
    assert!(stdout.contains("Verdict"), "{stdout}");
}

#[test]
fn a_lock_name_with_control_or_format_characters_is_refused_and_never_echoed_raw() {
    // An escape sequence retitles the terminal; a bidi override turns the rest of the line
    // around; a zero-width space hides itself.
    for (name, escaped) in [
        ("x\u{1b}]0;pwned\u{7}", "x\\u{1b}]0;pwned\\u{7}"),
        ("ab\u{202e}cd", "ab\\u{202e}cd"),
        ("demo\u{200b}", "demo\\u{200b}"),
    ] {
        for command in ["worker", "reset"] {
            let output = common::lockslab_offline(&[command, "--lock", name])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert_eq!(output.status.code(), Some(2), "{command}: {stderr}");
            assert!(output.stdout.is_empty(), "{command}: {output:?}");
            let raw = |c: char| (c.is_control() && c != '\n') || "\u{202e}\u{200b}".contains(c);
            assert!(
                !stderr.contains(raw),
                "{command} printed it raw: {stderr:?}"
            );
            assert!(stderr.contains(escaped), "{command}: {stderr}");
        }
    }
}

#[test]
fn what_a_killed_lab_left_on_shared_servers_is_swept_by_the_next_run() {
    let servers = common::servers();
    // A lab killed mid-run (A frozen, B waiting): no cleanup code of its own runs.
    let mut child = common::lockslab(&[
        "gc-pause",
        "--ttl",
        "1s",
        "--pause",
        "3s",
        "--fencing",
        "on",
        "--json",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let mut run_id = None;
    let mut wrote = false;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let Some(event) = common::event_line(&line.unwrap()) else {
            continue;
        };
        if run_id.is_none() {
            run_id = common::run_id_of(std::slice::from_ref(&event)).map(String::from);
        }
        if event.is("B", Kind::Wrote) {
            wrote = true;
            break; // B wrote (a store row), A is still frozen with its lock key
        }
    }
    assert!(wrote, "B never wrote");
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    let run_id = run_id.expect("a run id");
    let mut redis = redis::Client::open(servers.redis.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys = |redis: &mut redis::Connection| -> Vec<String> {
        redis::cmd("KEYS")
            .arg(format!("lockslab:{run_id}:*"))
            .query(redis)
            .unwrap()
    };
    let mut db = postgres::Client::connect(&servers.postgres, postgres::NoTls).unwrap();
    let rows = |db: &mut postgres::Client| -> i64 {
        db.query_one(
            "SELECT count(*) FROM lockslab_attempt WHERE run_id = $1",
            &[&run_id],
        )
        .unwrap()
        .get(0)
    };
    assert!(!keys(&mut redis).is_empty(), "the killed run left its keys");
    assert!(rows(&mut db) > 0, "the killed run left its rows");
    // The next run on the same servers sweeps them.
    let (_, verdict, _) = common::run_json(&common::QUICK_LAB);
    assert_ne!(verdict["run_id"].as_str(), Some(run_id.as_str()));
    assert_eq!(keys(&mut redis), Vec::<String>::new());
    assert_eq!(rows(&mut db), 0);
}

/// Servers of one test's own, so that no other test's run sweeps what it expects to find.
struct OwnServers {
    redis: String,
    postgres: String,
    keeper: Option<(std::process::Child, std::process::ChildStdin)>,
}

impl OwnServers {
    fn start() -> OwnServers {
        let (keeper, stdin, urls) = common::start_serve();
        let url = |name: &str| urls[name].as_str().unwrap().to_string();
        OwnServers {
            redis: url("redis"),
            postgres: url("postgres"),
            keeper: Some((keeper, stdin)),
        }
    }

    fn lockslab(&self, args: &[&str]) -> std::process::Command {
        let mut command = common::lockslab(args);
        command
            .env("LOCKSLAB_REDIS_URL", &self.redis)
            .env("LOCKSLAB_POSTGRES_URL", &self.postgres);
        command
    }

    /// What a run left here, by its run id: Redis keys, Postgres tables, sequences and
    /// schemas, and its entry in either registry of live runs.
    fn left_by(&self, run_id: &str) -> Vec<String> {
        let mut redis = lockslab::connect::redis(&self.redis).unwrap();
        let mut left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("lockslab:{run_id}:*"))
            .query(&mut *redis)
            .unwrap();
        let registered: bool = redis::cmd("SISMEMBER")
            .arg("lockslab:live-runs")
            .arg(run_id)
            .query(&mut *redis)
            .unwrap();
        if registered {
            left.push("in the Redis set lockslab:live-runs".into());
        }
        let mut db = postgres::Client::connect(&self.postgres, postgres::NoTls).unwrap();
        for row in db
            .query(
                "SELECT relname::text FROM pg_class WHERE relname LIKE $1
                 UNION ALL SELECT nspname::text FROM pg_namespace WHERE nspname LIKE $1
                 UNION ALL SELECT 'row in lockslab_live_run' FROM lockslab_live_run
                     WHERE run_id = $2",
                &[&format!("%{run_id}%"), &run_id],
            )
            .unwrap()
        {
            left.push(row.get(0));
        }
        left
    }

    fn registered_in_postgres(&self, run_id: &str) -> bool {
        let mut db = postgres::Client::connect(&self.postgres, postgres::NoTls).unwrap();
        db.query_one(
            "SELECT count(*) FROM lockslab_live_run WHERE run_id = $1",
            &[&run_id],
        )
        .is_ok_and(|row| row.get::<_, i64>(0) == 1)
    }

    /// Starts `args` (a lab, in human mode: its heading names the run), waits until
    /// `mid_run` holds for its run id, then kills the lab with SIGKILL. Returns the run id,
    /// after checking that the run left something here.
    fn kill_mid_run(&self, args: &[&str], mid_run: impl Fn(&str) -> bool) -> String {
        let mut child = self
            .lockslab(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let heading = lines.next().unwrap().unwrap();
        let run_id = heading
            .split_once(" run ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no run id in {heading:?}"))
            .to_string();
        let drain = std::thread::spawn(move || lines.for_each(drop));
        let reached = common::eventually(Duration::from_secs(60), || mid_run(&run_id));
        kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
        child.wait().unwrap();
        drain.join().unwrap();
        assert!(reached, "{args:?} never got mid-run");
        assert!(
            !self.left_by(&run_id).is_empty(),
            "run {run_id} left nothing"
        );
        run_id
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

#[test]
fn what_killed_labs_left_on_postgres_and_redis_is_swept_by_the_next_run_or_reset() {
    let own = OwnServers::start();
    // Lab 3 writes tables of its own, lab 7 a schema (and Redis keys, with a Redis lock):
    // the next lab on the same Postgres sweeps the dead run before it.
    let skip_locked = own.kill_mid_run(&["skip-locked"], |run_id| {
        own.registered_in_postgres(run_id)
            && own.left_by(run_id).iter().any(|t| t.ends_with("_jobs"))
    });
    let no_lock = own.kill_mid_run(&["no-lock", "redis-lock"], |run_id| {
        own.registered_in_postgres(run_id)
            && own.left_by(run_id).contains(&format!("lockslab_{run_id}"))
    });
    assert_eq!(
        own.left_by(&skip_locked),
        Vec::<String>::new(),
        "lab 3's run"
    );
    // Lab 2 writes to Redis only: killed once a stuck key (no TTL) is there. It knows no
    // Postgres, so lab 7's run is still there after it: `reset` sweeps both.
    let naive = own.kill_mid_run(&["naive"], |run_id| {
        let mut redis = lockslab::connect::redis(&own.redis).unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("lockslab:{run_id}:*"))
            .query(&mut *redis)
            .unwrap();
        keys.iter().any(|key| {
            redis::cmd("PTTL")
                .arg(key)
                .query::<i64>(&mut *redis)
                .is_ok_and(|pttl| pttl == -1)
        })
    });
    assert!(!own.left_by(&no_lock).is_empty(), "lab 7's run {no_lock}");
    let output = own
        .lockslab(&["reset", "--lock", "sweep-test"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{output:?}");
    assert!(
        stdout.contains("swept what 2 killed lab run(s)"),
        "{stdout}"
    );
    for run_id in [no_lock, naive] {
        assert_eq!(own.left_by(&run_id), Vec::<String>::new(), "run {run_id}");
    }
}
