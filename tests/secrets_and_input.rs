//! Secrets and input (issue 9, items 10–14 and the interrupt cleanup of 17): no password in
//! any command line or any message; bad ports, absurd durations and empty variables are
//! told apart from real failures at parse time; an interrupted `etcd-vs-redis` leaves
//! nothing of its run on shared servers.

use crate::common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A password with a `/` in it: the kind the old redaction missed.
const PASSWORD: &str = "S3cret/PW";
/// What must never appear, whichever part of the password a message would cut out.
const NEEDLE: &str = "S3cret";

/// A lockslab command that finds no server anywhere: a run that gets past its parsing
/// fails with exit status 4 (could not run), not 2.
fn lockslab_without_servers(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("LOCKSLAB_REDIS_URL", "redis://127.0.0.1:1")
        .env("LOCKSLAB_ETCD_URL", "http://127.0.0.1:1")
        .env(
            "LOCKSLAB_POSTGRES_URL",
            "postgres://lockslab@127.0.0.1:1/postgres",
        )
        .env("NO_COLOR", "1")
        .env_remove("LOCKSLAB_PRIVATE_SERVERS");
    command
}

/// Everything a finished command printed, both streams.
fn printed(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The test Postgres's URL for a role that logs in with `PASSWORD`, a password holding a
/// URL delimiter, which travels everywhere the URL does. Made by the server's superuser
/// (the labs' role may create no role); its sessions act as the labs' role, so that the
/// tables it makes stay the labs' role's.
fn postgres_url_with_password() -> String {
    let servers = servers();
    let mut db = postgres::Client::connect(&servers.postgres_admin, postgres::NoTls).unwrap();
    db.batch_execute(&format!(
        "DO $$ BEGIN
             CREATE ROLE lockslab_pw LOGIN PASSWORD '{PASSWORD}' IN ROLE lockslab;
             ALTER ROLE lockslab_pw SET role = 'lockslab';
         EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
         END $$"
    ))
    .unwrap();
    let (_, at) = servers.postgres.rsplit_once('@').unwrap();
    let url = format!("postgres://lockslab_pw:{PASSWORD}@{at}");
    assert!(url.contains(PASSWORD), "{url}");
    url
}

/// Every process below `root` (children, grandchildren…), with its command line.
fn descendants(root: u32) -> Vec<(u32, String)> {
    let table = process_table();
    let mut family = HashSet::from([root as i32]);
    family_in(&table, &mut family);
    table
        .into_iter()
        .filter(|proc| proc.pid != root as i32 && family.contains(&proc.pid))
        .map(|proc| (proc.pid as u32, proc.cmdline))
        .collect()
}

#[test]
fn no_command_line_of_a_lab_holds_the_password() {
    let url = postgres_url_with_password();
    let mut lab = lockslab(&["gc-pause", "--ttl", "300ms", "--json"])
        .env("LOCKSLAB_POSTGRES_URL", &url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let root = lab.id();
    let reader = |stream: Box<dyn std::io::Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut BufReader::new(stream), &mut text);
            text
        })
    };
    let stdout = reader(Box::new(lab.stdout.take().unwrap()));
    let stderr = reader(Box::new(lab.stderr.take().unwrap()));

    // What `ps` would show another user, sampled for as long as the lab runs.
    let mut workers_seen = HashSet::new();
    let started = Instant::now();
    while lab.try_wait().unwrap().is_none() {
        for (pid, cmdline) in descendants(root) {
            assert!(
                !cmdline.contains(NEEDLE),
                "process {pid} shows the password in its command line: {cmdline}"
            );
            if cmdline.contains("__worker") {
                workers_seen.insert(pid);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the lab did not end"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = lab.wait().unwrap();
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    assert!(status.success(), "{status}\n{stdout}\n{stderr}");
    // The sampling saw the workers, so it could have seen the password in them.
    assert!(
        workers_seen.len() >= 2,
        "saw {} workers: {workers_seen:?}",
        workers_seen.len()
    );
    assert!(
        !stdout.contains(NEEDLE) && !stderr.contains(NEEDLE),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn no_error_shows_the_password() {
    let pw = "S3cretPW";
    // (flag or variable, value, exit status, what the message must name)
    let cases: &[(&str, String, i32, &str)] = &[
        (
            "--redis-url",
            format!("mysql://u:{pw}@h/db"),
            2,
            "--redis-url",
        ),
        ("--redis-url", format!("http://:{pw}@h"), 2, "--redis-url"),
        (
            "--postgres-url",
            format!("postgresql:/u:{pw}@h/db"),
            2,
            "--postgres-url",
        ),
        (
            "--postgres-url",
            format!("host=h password={pw}"),
            2,
            "--postgres-url",
        ),
        (
            "LOCKSLAB_REDIS_URL",
            format!("mysql://u:{pw}@h/db"),
            2,
            "LOCKSLAB_REDIS_URL",
        ),
        (
            "LOCKSLAB_POSTGRES_URL",
            format!("host=h password={pw} user=u"),
            2,
            "LOCKSLAB_POSTGRES_URL",
        ),
        (
            "LOCKSLAB_POSTGRES_URL",
            format!("postgres://u:{PASSWORD}@127.0.0.1:notaport/db"),
            2,
            "LOCKSLAB_POSTGRES_URL",
        ),
        // Well-formed, but nobody listens: the "did not answer" line, exit 4.
        (
            "--postgres-url",
            format!("postgres://u:{PASSWORD}@127.0.0.1:1/db"),
            4,
            "Postgres",
        ),
        (
            "LOCKSLAB_POSTGRES_URL",
            format!("postgres://u@127.0.0.1:1/db?sslmode=disable&password={pw}"),
            4,
            "Postgres",
        ),
        (
            "--redis-url",
            format!("redis://u:{PASSWORD}@127.0.0.1:1"),
            4,
            "Redis",
        ),
    ];
    for (source, value, code, names) in cases {
        // The test's servers for everything else, so that the one bad URL is what fails.
        let mut command = lockslab(&["gc-pause"]);
        if source.starts_with("--") {
            command.args([source, value.as_str()]);
        } else {
            command.env(source, value);
        }
        let output = command.output().unwrap();
        let text = printed(&output);
        assert_eq!(
            output.status.code(),
            Some(*code),
            "{source} {value}: {text}"
        );
        assert!(text.contains(names), "{source} {value}: {text}");
        assert!(
            !text.contains(pw) && !text.contains(NEEDLE),
            "{source} {value} shows the password: {text}"
        );
    }

    // etcd's client has its own errors: they must not repeat the URL either.
    let output = lockslab(&["etcd-vs-redis", "--kill"])
        .args(["--etcd-url", &format!("http://u:{PASSWORD}@127.0.0.1:1")])
        .output()
        .unwrap();
    let text = printed(&output);
    assert_eq!(output.status.code(), Some(4), "{text}");
    assert!(text.contains("etcd") && !text.contains(NEEDLE), "{text}");

    // --help shows what the variables hold, unless told not to.
    let output = lockslab(&["gc-pause", "--help"])
        .env("LOCKSLAB_POSTGRES_URL", postgres_url_with_password())
        .output()
        .unwrap();
    let text = printed(&output);
    assert!(output.status.success(), "{text}");
    assert!(!text.contains(NEEDLE), "--help shows the password: {text}");
}

#[test]
fn bad_ports_are_bad_command_lines() {
    for (source, value) in [
        ("--redis-url", "redis://127.0.0.1:notaport"),
        ("--redis-url", "redis://127.0.0.1:99999"),
        ("--redis-url", "redis://127.0.0.1:0"),
        ("--postgres-url", "postgres://u@127.0.0.1:notaport/db"),
        ("--etcd-url", "http://127.0.0.1:notaport"),
        ("LOCKSLAB_ETCD_URL", "http://127.0.0.1:notaport"),
        ("LOCKSLAB_REDIS_URL", "redis://127.0.0.1:99999"),
    ] {
        let mut command = lockslab_without_servers(&["etcd-vs-redis"]);
        if source.starts_with("--") {
            command.args([source, value]);
        } else {
            command.env(source, value);
        }
        let started = Instant::now();
        let output = command.output().unwrap();
        let text = printed(&output);
        assert_eq!(output.status.code(), Some(2), "{source} {value}: {text}");
        assert!(
            text.contains(source) && text.contains("port"),
            "{source} {value}: {text}"
        );
        assert!(started.elapsed() < Duration::from_secs(15), "{text}");
    }
}

#[test]
fn absurd_durations_are_refused_before_anything_starts() {
    let huge = "18446744073709551615s";
    for (args, flag, says) in [
        (&["gc-pause", "--pause", huge][..], "--pause", "at most 10m"),
        (&["gc-pause", "--ttl", huge], "--ttl", "at most 10m"),
        (&["gc-pause", "--pause", "0s"], "--pause", "at least 100ms"),
        (&["naive", "--ttl", huge], "--ttl", "at most 10m"),
        (&["naive", "--wait", "99999h"], "--wait", "at most 10m"),
        (&["naive", "--work", "2h"], "--work", "at most 1m"),
        (
            &["skip-locked", "--pause", "99999h"],
            "--pause",
            "at most 10m",
        ),
        (
            &["skip-locked", "--pause", "0s"],
            "--pause",
            "at least 100ms",
        ),
        (&["skip-locked", "--work", huge], "--work", "at most 1m"),
        (
            &["skip-locked", "--idle-timeout", huge],
            "--idle-timeout",
            "at most 10m",
        ),
        (
            &["etcd-vs-redis", "--lease", huge],
            "--lease",
            "at most 10m",
        ),
        (
            &["etcd-vs-redis", "--lease", "99999h"],
            "--lease",
            "at most 10m",
        ),
        (
            &["etcd-vs-redis", "--redis-ttl", huge],
            "--redis-ttl",
            "at most 10m",
        ),
        (&["etcd-vs-redis", "--work", huge], "--work", "at most 10m"),
        (
            &["etcd-vs-redis", "--pause", huge],
            "--pause",
            "at most 10m",
        ),
        (
            &["etcd-vs-redis", "--pg-timeout", huge],
            "--pg-timeout",
            "at most 10m",
        ),
        (&["worker", "--ttl", huge], "--ttl", "at most 1h"),
        (&["worker", "--ttl", "0s"], "--ttl", "at least 100ms"),
        (&["worker", "--wait", huge], "--wait", "at most 1h"),
        (&["worker", "--work", huge], "--work", "at most 1h"),
    ] {
        // No server answers here: had the lab started, it would exit 4, not 2.
        let started = Instant::now();
        let output = lockslab_without_servers(args).output().unwrap();
        let text = common::one_line(&printed(&output));
        assert_eq!(output.status.code(), Some(2), "{args:?}: {text}");
        assert!(
            text.contains(flag) && text.contains(says),
            "{args:?}: {text}"
        );
        assert!(!text.contains("panicked"), "{args:?}: {text}");
        assert!(started.elapsed() < Duration::from_secs(10), "{args:?}");
    }

    // Each flag's help says its bound.
    let output = lockslab(&["etcd-vs-redis", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(help.contains("1s to 10m"), "{help}");

    // On real servers too: the 11-year lease is refused, and none is granted.
    let output = lockslab(&["etcd-vs-redis", "--lease", "99999h"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", printed(&output));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let longest = runtime.block_on(async {
        let mut etcd = etcd_client_of(&servers().etcd).await;
        let mut longest = 0;
        for lease in etcd.leases().await.unwrap().leases() {
            if let Ok(left) = etcd.lease_time_to_live(lease.id(), None).await {
                longest = longest.max(left.granted_ttl());
            }
        }
        longest
    });
    assert!(longest <= 600, "a lease of {longest}s is in etcd");
}

/// The fault proxy's and chaos's flags that make no sense are refused (exit status 2)
/// before a server, a port or a proxy starts: no server answers here, so a run that got
/// past its checks would exit 4.
#[test]
fn proxy_and_chaos_refuse_senseless_flags_before_anything_starts() {
    for (args, says) in [
        (
            &["chaos", "--design", "redis-lock", "--time", "0s"][..],
            "at least 1s",
        ),
        (
            &["chaos", "--design", "redis-lock", "--time", "100d"],
            "at most 1day",
        ),
        (
            &["chaos", "--design", "redis-lock", "--faults", "restart-aof"],
            "only servers it started itself",
        ),
        (
            &["proxy", "--to", "redis", "--listen", "0.0.0.0:0"],
            "every address of this machine",
        ),
        (
            &["proxy", "--to", "redis", "--listen", "[::]:0"],
            "every address of this machine",
        ),
        (
            &["proxy", "--to", "redis", "--listen", "192.0.2.1:0"],
            "add --expose",
        ),
        (
            &["proxy", "fault", "1", "heal", "--for", "5s"],
            "only delay and delay-next take it",
        ),
    ] {
        let output = lockslab_without_servers(args).output().unwrap();
        let text = common::one_line(&printed(&output));
        assert_eq!(output.status.code(), Some(2), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(!text.contains("starting"), "{args:?}: {text}");
    }
}

#[test]
fn empty_variables_mean_not_set() {
    let output = lockslab(&["gc-pause", "--ttl", "300ms", "--fencing", "on"])
        .env("LOCKSLAB_ETCD_URL", "")
        .env("LOCKSLAB_PRIVATE_SERVERS", "")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", printed(&output));

    // The variables' usual words still count.
    let output = lockslab_without_servers(&["gc-pause"])
        .env("LOCKSLAB_PRIVATE_SERVERS", "maybe")
        .output()
        .unwrap();
    let text = printed(&output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains("--private-servers"), "{text}");
}

/// What a run of `run_id` left on the test servers: store rows, Redis keys, etcd keys.
fn leftovers(run_id: &str) -> (i64, usize, i64) {
    let servers = servers();
    let mut db = postgres::Client::connect(&servers.postgres, postgres::NoTls).unwrap();
    // A run stopped before it first touched the store left no table to count rows in.
    let store_made: bool = db
        .query_one("SELECT to_regclass('lockslab_attempt') IS NOT NULL", &[])
        .unwrap()
        .get(0);
    let rows: i64 = if store_made {
        db.query_one(
            "SELECT (SELECT count(*) FROM lockslab_resource WHERE run_id = $1)
                  + (SELECT count(*) FROM lockslab_attempt WHERE run_id = $1)",
            &[&run_id],
        )
        .unwrap()
        .get(0)
    } else {
        0
    };
    let mut redis = redis::Client::open(servers.redis.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::Commands::scan_match(&mut redis, format!("lockslab:{run_id}:*"))
        .unwrap()
        .filter_map(Result::ok)
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let etcd_keys = runtime.block_on(async {
        let mut etcd = etcd_client_of(&servers.etcd).await;
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        etcd.get(format!("lockslab:{run_id}:"), Some(options))
            .await
            .unwrap()
            .count()
    });
    (rows, keys.len(), etcd_keys)
}

#[test]
fn ctrl_c_during_etcd_vs_redis_leaves_none_of_its_rows_or_keys() {
    // The moments the issue named: at 1s a Redis key was left, at 3, 6 and 10s store rows.
    // Four labs side by side, each interrupted at its moment: each run has its own run id,
    // keys and rows, and the checks look at its own alone.
    let interrupted_at = |at: u64| {
        let started = Instant::now();
        let mut lab = lockslab(&["etcd-vs-redis"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(lab.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let run_id = first
            .strip_prefix("lockslab etcd-vs-redis run ")
            .unwrap_or_else(|| panic!("no run id in {first:?}"))
            .trim()
            .to_string();
        // Keep reading, so that the lab never blocks on a full pipe.
        let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
        std::thread::sleep(Duration::from_secs(at).saturating_sub(started.elapsed()));
        let pids: Vec<i32> = children_of(lab.id()).iter().map(|c| c.0 as i32).collect();
        kill(Pid::from_raw(lab.id() as i32), Signal::SIGINT).unwrap();
        let status = lab.wait().unwrap();
        let shown = rest.join().unwrap();
        assert_eq!(status.code(), Some(130), "at {at}s: {shown:?}");
        for pid in pids {
            assert!(
                proc_state(pid).is_none(),
                "at {at}s: child {pid} is still there"
            );
        }
        assert_eq!(
            leftovers(&run_id),
            (0, 0, 0),
            "Ctrl-C at {at}s left (store rows, Redis keys, etcd keys) of run {run_id}"
        );
    };
    std::thread::scope(|scope| {
        for at in [1, 3, 6, 10] {
            scope.spawn(move || interrupted_at(at));
        }
    });
}
