//! Issue 11: what labs 1–4 taught too broadly, corrected and played against real servers.
//!
//! - Lab 4 plays a renewed Redis lock (owner-checked PEXPIRE on a heartbeat) beside the plain
//!   one: it hands over after a kill about as fast as etcd, fails during a freeze the way etcd
//!   does, and survives work longer than the plain TTL, which lab 4 now plays (overrun).
//! - Issue 41: the labs' own Redis lock retries with the owner value drawn for the
//!   acquisition, the pattern lab 8 marks ✅, and knows its own key after a lost reply.
//!
//! Timings are generous bounds only: the machine is shared.

use crate::common;

use std::time::Duration;

use common::*;
use lockslab::lock::redis::{Held, RedisLock, Renewal};
use serde_json::Value;

fn cell<'a>(verdict: &'a Value, backend: &str, scenario: &str) -> &'a Value {
    verdict["cells"]
        .as_array()
        .expect("cells array")
        .iter()
        .find(|c| c["backend"] == backend && c["scenario"] == scenario)
        .unwrap_or_else(|| panic!("no {backend}/{scenario} cell in {verdict}"))
}

fn handover(cell: &Value) -> u64 {
    cell["handover_ms"]
        .as_u64()
        .unwrap_or_else(|| panic!("nobody got the lock: {cell}"))
}

fn redis_lock(key: &str, ttl: Duration) -> RedisLock {
    RedisLock::new(
        lockslab::connect::redis(&servers().redis).unwrap(),
        key,
        ttl,
    )
}

/// The renewal re-arms only our own key: a PEXPIRE that did not check the owner would
/// stretch the next holder's lock on our schedule.
#[test]
fn renew_extends_our_key_and_never_someone_elses() {
    let key = format!("lockslab:test-corrections:{}:renew", std::process::id());
    let mut lock = redis_lock(&key, Duration::from_millis(800));
    let held = lock.try_acquire().unwrap().expect("a fresh key");
    std::thread::sleep(Duration::from_millis(300));
    assert!(lock.renew(&held).unwrap(), "our key, renewed");
    assert!(lock.pttl().unwrap() > 700, "back to a full TTL");

    let stranger = Held {
        owner: "someone-else".into(),
        ..held.clone()
    };
    assert!(!lock.renew(&stranger).unwrap(), "not ours: not renewed");
    assert!(lock.release(&held).unwrap());
    assert!(!lock.renew(&held).unwrap(), "no key: nothing to renew");
    assert_eq!(
        lock.pttl().unwrap(),
        -2,
        "and the renewal did not recreate it"
    );
}

/// Lab 8's lost reply, on the labs' own lock: every try of one acquisition sends the value
/// drawn for it, so a retry after a `SET` whose answer was lost finds its own key — the lock
/// is its, re-armed for a full TTL — instead of waiting a whole TTL behind itself, as a
/// retry with a new value does (lab 8 marks that one ❌). With a token, the retry draws a
/// new one, higher than the lost answer's.
#[test]
fn a_retry_after_a_lost_reply_finds_its_own_key_by_its_owner_value() {
    let key = format!(
        "lockslab:test-corrections:{}:lost-reply",
        std::process::id()
    );
    let counter = format!("{key}:token");
    let ttl = Duration::from_millis(1000);
    let mut lock = redis_lock(&key, ttl);
    let owner = lockslab::lock::random_owner();
    // Redis applies the first try; its answer is lost on the way back (dropped here).
    drop(lock.try_acquire_as(&owner).unwrap().expect("a fresh key"));
    std::thread::sleep(Duration::from_millis(300));
    let held = lock
        .try_acquire_as(&owner)
        .unwrap()
        .expect("the retry finds its own key");
    assert_eq!(held.owner, owner);
    assert!(lock.pttl().unwrap() > 800, "re-armed from the retry");
    // Another value — another client, or a retry with a new value — is refused.
    assert!(redis_lock(&key, ttl).try_acquire().unwrap().is_none());
    assert!(lock.release(&held).unwrap());

    let lost = lock
        .try_acquire_fenced_as(&counter, &owner)
        .unwrap()
        .expect("a fresh key");
    let again = lock
        .try_acquire_fenced_as(&counter, &owner)
        .unwrap()
        .expect("the retry finds its own key");
    assert!(again.token > lost.token, "{again:?} after {lost:?}");
    assert!(
        redis_lock(&key, ttl)
            .try_acquire_fenced(&counter)
            .unwrap()
            .is_none()
    );
    assert!(lock.release(&again).unwrap());
    let _: () = redis::cmd("DEL")
        .arg(&counter)
        .query(&mut *lockslab::connect::redis(&servers().redis).unwrap())
        .unwrap();
}

/// Issue 41's corrections that a learner reads in `--help`: `renew-third` stops writing
/// once a renewal is *refused* or its heartbeat gives up (a failed renewal alone stops
/// nothing: the heartbeat retries until its lease would run out); and etcd 3.4 times a
/// lease on its leader's monotonic clock but queues expiries by wall clock, so a step back
/// only delays revocations.
#[test]
fn help_says_when_renewal_stops_and_what_a_clock_step_does_to_etcd() {
    let help = |args: &[&str]| {
        let out = lockslab(args).env_remove("COLUMNS").output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let guard = help(&["lease-guard", "--help"]);
    assert!(
        guard.contains("no write once a renewal is refused or the heartbeat gives up"),
        "{guard}"
    );
    assert!(!guard.contains("once a renewal fails"), "{guard}");
    let matrix = help(&["matrix", "--help"]);
    assert!(
        matrix.contains("step back there only delays revocations, etcd#12291"),
        "{matrix}"
    );
}

/// The heartbeat keeps a short key alive well past its TTL while the process runs, and
/// stops when told, after which the key lapses on its own.
#[test]
fn the_heartbeat_keeps_the_key_past_its_ttl_and_lets_it_lapse_when_stopped() {
    let key = format!("lockslab:test-corrections:{}:heartbeat", std::process::id());
    let ttl = Duration::from_millis(600);
    let mut lock = redis_lock(&key, ttl);
    let held = lock.try_acquire().unwrap().expect("a fresh key");
    let lost = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let said = lost.clone();
    let renewal = Renewal::start(
        redis_lock(&key, ttl),
        held.clone(),
        Box::new(move |why| *said.lock().unwrap() = Some(why)),
    );
    std::thread::sleep(Duration::from_millis(1800));
    let (owner, pttl) = lock.owner_and_pttl().unwrap();
    assert_eq!(owner.as_deref(), Some(held.owner.as_str()), "three TTLs on");
    assert!(pttl > 0, "{pttl}");
    assert!(lost.lock().unwrap().is_none());

    renewal.stop();
    assert!(
        eventually(Duration::from_secs(5), || lock.pttl().unwrap() == -2),
        "the key outlived its heartbeat"
    );
}

#[test]
fn after_a_kill_the_renewed_redis_lock_hands_over_like_etcd_not_like_the_plain_one() {
    let (lines, verdict, _) = run_json(&[
        "etcd-vs-redis",
        "--kill",
        "--redis-ttl",
        "5s",
        "--lease",
        "1s",
        "--work",
        "600ms",
    ]);
    let renewed = cell(&verdict, "redis-renewed", "kill");
    let plain = handover(cell(&verdict, "redis", "kill"));
    let etcd = handover(cell(&verdict, "etcd", "kill"));
    let fast = handover(renewed);
    assert_eq!(renewed["two_holders"], false, "{renewed}");
    assert_eq!(
        renewed["fencing_token"], false,
        "a random owner value: {renewed}"
    );
    // Never before ⅔ of its 1s TTL after the kill (the heartbeat's last renewal), and the
    // plain lock never before its 5s TTL: the safety side. How soon after (about ⅔–1 TTL,
    // and etcd within its 1s lease) is a timing: `cargo bench --bench etcd_vs_redis`.
    assert!(
        fast >= 600,
        "the renewed lock handed over {fast}ms after the kill"
    );
    assert!(plain >= 4000, "the plain 5s TTL ran out first: {plain}ms");
    let _ = etcd;
    assert_eq!(
        renewed["expected_why"], "⅔–1 TTL after the last renewal",
        "{renewed}"
    );
    let took = &events(&lines, "redis-renewed:waiter", Kind::Acquired)[0];
    assert!(took.text.contains("renewed every 333ms"), "{took:?}");
    assert_gone(&worker_pids(&lines));
}

#[test]
fn a_frozen_holders_heartbeat_freezes_too_so_the_renewed_lock_fails_like_etcds() {
    let (lines, verdict, _) = run_json(&[
        "etcd-vs-redis",
        "--freeze",
        "--redis-ttl",
        "1500ms",
        "--lease",
        "1s",
        "--work",
        "600ms",
        "--pause",
        "3s",
    ]);
    let renewed = cell(&verdict, "redis-renewed", "freeze");
    assert_eq!(renewed["two_holders"], true, "{renewed}");
    assert_eq!(
        renewed["stale_write_accepted"], true,
        "renewal is no fence: {renewed}"
    );
    assert!(handover(renewed) < 2500, "{renewed}");
    let asked = lines
        .iter()
        .find_map(|e| match &e.what {
            What::HolderNow(h) if e.worker == "redis-renewed" => Some(h),
            _ => None,
        })
        .expect("the lab asked Redis before the resume");
    assert_eq!(asked.holder.as_deref(), Some("waiter"), "{asked:?}");
    let lost = events(&lines, "redis-renewed:holder", Kind::Lost);
    assert!(
        lost.iter().any(|e| e.text.contains("no longer ours")),
        "the woken heartbeat finds the key gone: {lost:?}"
    );
    // etcd fails the same way, and only its token keeps the stale write out.
    let etcd = cell(&verdict, "etcd", "freeze");
    assert_eq!(etcd["two_holders"], true, "{etcd}");
    assert_eq!(etcd["stale_write_accepted"], false, "{etcd}");
    for c in verdict["cells"].as_array().unwrap() {
        let problems = etcd_vs_redis_disagreements(c, &lines);
        assert!(problems.is_empty(), "{problems:?} in {c}");
    }
    assert_gone(&worker_pids(&lines));
}

/// A TTL shorter than the work is no longer a usage error: it is the overrun scenario, the
/// most common Redis lock bug, and the lab plays it.
#[test]
fn a_ttl_shorter_than_the_work_is_played_the_plain_lock_expires_under_a_live_holder() {
    let (lines, verdict, output) = run_json(&[
        "etcd-vs-redis",
        "--redis-ttl",
        "500ms",
        "--work",
        "1500ms",
        "--lease",
        "1s",
    ]);
    assert!(output.status.success());
    let cells = verdict["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4, "only the overrun plays: {verdict}");
    assert!(
        cells.iter().all(|c| c["scenario"] == "overrun"),
        "{verdict}"
    );
    assert!(
        lines
            .iter()
            .all(|e| !matches!(e.kind(), Kind::Frozen | Kind::Killed)),
        "nobody is struck in the overrun"
    );

    let plain = cell(&verdict, "redis", "overrun");
    assert_eq!(plain["two_holders"], true, "{plain}");
    assert_eq!(plain["stale_write_accepted"], true, "{plain}");
    assert!(handover(plain) < 1400, "the key ran out mid-work: {plain}");
    for backend in ["redis-renewed", "etcd", "postgres"] {
        let c = cell(&verdict, backend, "overrun");
        assert_eq!(c["two_holders"], false, "{c}");
        assert_eq!(c["late_write"], "none", "{c}");
        assert!(
            handover(c) >= 1400,
            "{backend} kept the lock for the whole work: {c}"
        );
    }
    for c in cells {
        let problems = etcd_vs_redis_disagreements(c, &lines);
        assert!(problems.is_empty(), "{problems:?} in {c}");
    }
    assert_gone(&worker_pids(&lines));
}

/// The run of `verdict` with this store rule, token source and first writer.
fn run_played<'a>(verdict: &'a Value, rule: &str, source: &str, first: &str) -> &'a Value {
    verdict["runs"]
        .as_array()
        .expect("runs array")
        .iter()
        .find(|run| {
            run["store_rule"] == rule
                && run["token_source"] == source
                && run["first_writer"] == first
        })
        .unwrap_or_else(|| panic!("no run under {rule}, {source}, {first} first in {verdict}"))
}

/// Lab 1's token-restart variation: Redis restarts empty while A is frozen, B draws A's
/// token again. `>=` takes A's stale write; refusing an equal token from another holder
/// refuses whoever writes second — A when B wrote first, B (granted after A) when A
/// did; tokens from the store's Postgres sequence keep B's result in both orders. Every
/// fact is read back from the store.
#[test]
fn a_reissued_token_defeats_every_store_rule_and_a_sequence_token_does_not() {
    let (lines, verdict, _) = run_json(&[
        "gc-pause",
        "--token-restart",
        "--ttl",
        "1s",
        "--pause",
        "1500ms",
    ]);
    assert_eq!(verdict["token_restart"], true, "{verdict}");
    // B is no stale writer in any order: its compare-and-delete, after its write, found
    // its own key — B's lease still ran when the store decided B's write.
    let b_releases = events(&lines, "B", Kind::Released);
    assert_eq!(b_releases.len(), 5, "one B per run");
    for release in b_releases {
        assert_eq!(
            release.released(),
            Some(true),
            "B's key was gone: {release:?}"
        );
    }
    // Redis granted B while A's PX still ran, by the lab's own bounds (B's grant reported
    // before the end of A's lease as Redis's PTTL before the crash put it); and A, whose
    // key was gone before it wrote, is the stale writer in every run.
    for run in verdict["runs"].as_array().unwrap() {
        let (granted, until) = (
            run["b_granted_by_ms"].as_u64(),
            run["a_lease_until_ms"].as_u64(),
        );
        assert!(
            granted.is_some() && until.is_some() && granted < until,
            "{run}"
        );
        assert_eq!(run["two_holders"], true, "{run}");
        assert!(run["a_stale_write_accepted"].is_boolean(), "{run}");
    }
    let not_lower = run_played(&verdict, "not_lower", "redis_incr", "B");
    let same_b_first = run_played(&verdict, "higher_or_same_holder", "redis_incr", "B");
    let same_a_first = run_played(&verdict, "higher_or_same_holder", "redis_incr", "A");
    let seq_b_first = run_played(&verdict, "not_lower", "postgres_sequence", "B");
    let seq_a_first = run_played(&verdict, "not_lower", "postgres_sequence", "A");
    for run in [not_lower, same_b_first, same_a_first] {
        assert_eq!(run["fencing"], true, "{run}");
        assert_eq!(run["token_restart"], true, "{run}");
        assert_eq!(
            run["stale_token"], run["newer_token"],
            "B drew A's token again: {run}"
        );
    }
    // A first: A's stale write is taken, then B's refused.
    assert_eq!(
        same_a_first["a_stale_write_accepted"], true,
        "{same_a_first}"
    );
    assert_eq!(not_lower["stale_write_accepted"], true, "{not_lower}");
    assert_eq!(not_lower["final_writer"], "A", "{not_lower}");
    assert_eq!(
        same_b_first["stale_write_accepted"], false,
        "{same_b_first}"
    );
    assert_eq!(same_b_first["final_writer"], "B", "{same_b_first}");
    // The stale holder first: the holder granted after it is the one refused.
    assert_eq!(same_a_first["b_write_accepted"], false, "{same_a_first}");
    assert_eq!(same_a_first["final_writer"], "A", "{same_a_first}");

    for run in [seq_b_first, seq_a_first] {
        let (a, b) = (run["stale_token"].as_i64(), run["newer_token"].as_i64());
        assert!(a.is_some() && b > a, "the sequence never reissues: {run}");
        assert_eq!(run["b_write_accepted"], true, "{run}");
        assert_eq!(run["final_writer"], "B", "{run}");
    }
    assert_eq!(seq_b_first["stale_write_accepted"], false, "{seq_b_first}");

    // The lab says it crashed a Redis of its own once per run.
    let crashes = lines.iter().filter(|e| e.is("lab", Kind::Killed)).count();
    assert_eq!(crashes, 5, "one restart per run");
    assert_gone(&worker_pids(&lines));
}

/// The variation never restarts a server it did not start: the test binary's shared Redis
/// keeps its process and its data through the run.
#[test]
fn the_token_restart_crashes_only_its_own_private_redis() {
    let mut shared = lockslab::connect::redis(&servers().redis).unwrap();
    let marker = format!("lockslab:test-corrections:{}:marker", std::process::id());
    let _: () = redis::cmd("SET")
        .arg(&marker)
        .arg("still here")
        .query(&mut *shared)
        .unwrap();
    let before: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut *shared)
        .unwrap();
    let run_id = |info: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|s| s.trim().to_string())
    };
    let text = run_human(&[
        "gc-pause",
        "--token-restart",
        "--ttl",
        "300ms",
        "--pause",
        "600ms",
    ]);
    assert!(
        text.contains("never restarts a server it did not start"),
        "{text}"
    );
    let mut shared = lockslab::connect::redis(&servers().redis).unwrap();
    let after: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut *shared)
        .unwrap();
    assert_eq!(
        run_id(&before),
        run_id(&after),
        "the shared Redis restarted"
    );
    let kept: Option<String> = redis::cmd("GET").arg(&marker).query(&mut *shared).unwrap();
    assert_eq!(kept.as_deref(), Some("still here"));
    let _: () = redis::cmd("DEL").arg(&marker).query(&mut *shared).unwrap();
}

/// `lockslab up` after one of its servers died restarts all three on new ports: it must say
/// so loudly, naming the dead one, since every pasted export line is now wrong.
#[test]
fn up_says_loudly_when_a_dead_server_makes_it_restart_on_new_ports() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let run = |args: &[&str]| {
        std::process::Command::new(BIN)
            .args(args)
            .env_remove("LOCKSLAB_REDIS_URL")
            .env_remove("LOCKSLAB_ETCD_URL")
            .env_remove("LOCKSLAB_POSTGRES_URL")
            .env_remove("LOCKSLAB_PRIVATE_SERVERS")
            .env("LOCKSLAB_STATE_DIR", &state)
            .env("TMPDIR", tmp.path())
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    };
    let _down = OnDrop(|| drop(run(&["down"])));
    let first = run(&["up"]);
    assert!(first.status.success(), "{first:?}");
    let first_out = String::from_utf8_lossy(&first.stdout).into_owned();
    // At 80 columns, only the lines with a URL (copied whole) may be wider.
    for line in first_out.lines().filter(|l| !l.contains("://")) {
        assert!(line.chars().count() <= 80, "wider than 80 columns: {line}");
    }
    let redis_url = first_out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Redis"))
        .map(|u| u.trim().to_string())
        .expect("up names its Redis");
    // Redis says its own pid.
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query(&mut *lockslab::connect::redis(&redis_url).unwrap())
        .unwrap();
    let pid: i32 = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .expect("process_id in INFO");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    assert!(eventually(Duration::from_secs(5), || proc_state(pid)
        .is_none_or(|s| s == 'Z')));

    let again = run(&["up"]);
    let down = run(&["down"]);
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success(), "{again:?}");
    assert!(down.status.success(), "{down:?}");
    assert!(stderr.contains("redis"), "names the dead server: {stderr}");
    assert!(
        stderr.contains("NEW ports") && stderr.contains("export lines"),
        "{stderr}"
    );
}
