//! Lab 5 against real clusters: a Redis primary + replica + 3 Sentinels and a 3-member etcd
//! cluster that lockslab starts itself, the shared test Postgres as the store.

use crate::common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use lockslab::events::facts::HolderNow;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The `lockslab-*` directories in `dir`.
fn run_dirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("lockslab-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn alive(pid: i32) -> bool {
    proc_state(pid).is_some_and(|s| s != 'Z')
}

/// `lockslab failover --json` with its temporary directories in `tmp`, stdout piped.
fn failover_in(tmp: &Path, extra: &[&str]) -> std::process::Child {
    let mut args = vec!["failover", "--json"];
    args.extend_from_slice(extra);
    lockslab(&args)
        .env("TMPDIR", tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting lockslab failover")
}

/// Reads events until one matches; returns every line read so far.
fn read_until(
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
    seen: &mut Vec<Event>,
    matches: impl Fn(&Event) -> bool,
) {
    for line in lines.by_ref() {
        let Some(event) = event_line(&line.unwrap()) else {
            continue;
        };
        let done = matches(&event);
        seen.push(event);
        if done {
            return;
        }
    }
    panic!("the lab ended before the awaited event: {seen:?}");
}

/// Lab 5's read-back of a cluster, if `event` is one.
fn holder_now(event: &Event) -> Option<&HolderNow> {
    match &event.what {
        What::HolderNow(h) => Some(h),
        _ => None,
    }
}

/// The first read-back from `worker` that `has` picks.
fn read_back<'a>(
    events: &'a [Event],
    worker: &str,
    has: impl Fn(&HolderNow) -> bool,
) -> Option<&'a HolderNow> {
    events
        .iter()
        .filter(|e| e.worker == worker)
        .filter_map(holder_now)
        .find(|h| has(h))
}

/// Any local user can reach a loopback port: each node of both clusters must refuse a
/// client that does not give the cluster's password, and the password must sit in files
/// only this user can read.
fn refuses_clients_without_the_password(
    redis: &lockslab::cluster::SentinelCluster,
    etcd: &lockslab::cluster::EtcdCluster,
) {
    use std::os::unix::fs::PermissionsExt;
    for node in [&redis.primary, &redis.replica]
        .into_iter()
        .chain(&redis.sentinels)
    {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", node.port)).unwrap();
        let mut connection = client.get_connection().unwrap();
        let answer: redis::RedisResult<String> = redis::cmd("PING").query(&mut connection);
        let err = answer.expect_err(&format!("the {} answered without a password", node.role));
        assert!(
            err.to_string().contains("NOAUTH"),
            "the {} refused for another reason: {err}",
            node.role
        );
        let answer: redis::RedisResult<String> = redis::cmd("AUTH")
            .arg("default")
            .arg("not-the-password")
            .query(&mut connection);
        assert!(answer.is_err(), "the {} took a wrong password", node.role);
    }
    let private = redis.dir().join("private");
    assert_eq!(
        std::fs::metadata(&private).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let runtime = lockslab::connect::etcd_runtime().unwrap();
    for member in &etcd.members {
        runtime.block_on(async {
            let mut client = etcd_client::Client::connect([member.client_url.as_str()], None)
                .await
                .unwrap();
            let put = client.put("lockslab-probe", "x", None).await;
            assert!(
                put.is_err(),
                "{} took a write without a password",
                member.name
            );
            let get = client.get("lockslab-probe", None).await;
            assert!(
                get.is_err(),
                "{} answered a read without a password",
                member.name
            );
        });
    }
    // With the password, a member serves the lab's clients.
    runtime.block_on(async {
        let mut client = lockslab::connect::etcd(&etcd.members[0].url())
            .await
            .unwrap();
        client.put("lockslab-probe", "x", None).await.unwrap();
    });
}

/// Every descendant of `root` now.
fn family_of(root: i32) -> HashSet<i32> {
    let mut family = HashSet::from([root]);
    family_in(&process_table(), &mut family);
    family.remove(&root);
    family
}

#[test]
fn clusters_start_and_stop_leaving_nothing_behind() {
    let (redis, etcd) = lockslab::cluster::start_both().expect("starting both clusters");
    let dirs = [redis.dir().to_path_buf(), etcd.dir().to_path_buf()];
    let mut pids = Vec::new();
    assert_eq!(
        lockslab::cluster::role_of(&redis.primary.url()).as_deref(),
        Some("master")
    );
    assert_eq!(
        lockslab::cluster::role_of(&redis.replica.url()).as_deref(),
        Some("slave")
    );
    for sentinel in &redis.sentinels {
        assert_eq!(
            lockslab::cluster::role_of(&sentinel.url()).as_deref(),
            Some("sentinel")
        );
        assert_eq!(
            lockslab::cluster::master_addr_from(&sentinel.url(), lockslab::cluster::MASTER_NAME),
            Some(redis.primary.addr())
        );
    }
    pids.extend(
        [&redis.primary, &redis.replica]
            .into_iter()
            .chain(&redis.sentinels)
            .map(|n| n.pid.unwrap()),
    );
    let (leader, _) = etcd.leader().expect("the members agree on a leader");
    assert!(leader < 3);
    for member in &etcd.members {
        let status = lockslab::cluster::etcd_status(&member.client_url).unwrap();
        assert_eq!(status.member_id, member.id);
        assert_eq!(status.leader, etcd.members[leader].id);
        pids.push(member.pid.unwrap());
    }
    assert!(pids.iter().all(|&pid| alive(pid)));
    assert!(dirs.iter().all(|d| d.is_dir()));
    refuses_clients_without_the_password(&redis, &etcd);
    drop(redis);
    drop(etcd);
    for pid in pids {
        assert!(!alive(pid), "server {pid} is still there");
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} is still there", dir.display());
    }
}

#[test]
fn the_failover_verdict_is_true_to_the_store_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let child = failover_in(tmp.path(), &[]);
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "failover failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (lines, verdict) = events_and_verdict(&stdout);
    let verdict = &verdict;
    assert_eq!(verdict["lab"], "failover");
    let scenario = |name: &str| {
        verdict["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap_or_else(|| panic!("no scenario {name} in {verdict}"))
            .clone()
    };
    // The verdict's stale-write fields follow from the attempts it carries.
    for s in verdict["scenarios"].as_array().unwrap() {
        let attempts = s["attempts"].as_array().unwrap();
        let a_last = attempts
            .iter()
            .rev()
            .find(|a| a["writer"].as_str().is_some_and(|w| w.starts_with("A:")));
        let b_ok = attempts.iter().find(|a| {
            a["writer"].as_str().is_some_and(|w| w.starts_with("B:")) && a["accepted"] == true
        });
        let late = match (a_last, b_ok) {
            (Some(a), Some(b)) if a["decided"].as_i64() > b["decided"].as_i64() => {
                Some(a["accepted"].as_bool().unwrap())
            }
            _ => None,
        };
        assert_eq!(s["stale_write"]["attempted"], late.is_some(), "{s}");
        assert_eq!(s["stale_write"]["accepted"], serde_json::json!(late), "{s}");
        if let (Some(a), Some(b)) = (s["a_token"].as_i64(), s["b_token"].as_i64()) {
            assert_eq!(s["token_reissued"], b <= a, "{s}");
        }
        // Every fenced row runs under the store's own rule, `>=`, spelled as lab 1 spells
        // it; the rule that refuses an equal token from another writer is one row's lesson.
        let lesson = s["name"] == "redis-incr-same-holder";
        let expected = if lesson {
            "higher_or_same_holder"
        } else {
            "not_lower"
        };
        assert!(
            s["store_rule"].is_null() || s["store_rule"] == expected,
            "{s}"
        );
    }
    for name in [
        "redis-unfenced",
        "redis-incr-not-lower",
        "redis-incr-same-holder",
        "redis-incr-lost",
        "durable-token",
    ] {
        let s = scenario(name);
        assert_eq!(s["two_holders"], true, "the failover forgot A's lock: {s}");
        assert!(s["failover_ms"].as_u64().unwrap() > 0, "{s}");
        assert_eq!(s["stale_write"]["attempted"], true, "A wrote after B: {s}");
    }
    assert_eq!(scenario("redis-unfenced")["stale_write"]["accepted"], true);
    let not_lower = scenario("redis-incr-not-lower");
    assert_eq!(not_lower["token_reissued"], true);
    assert_eq!(not_lower["a_token"], not_lower["b_token"]);
    assert_eq!(not_lower["stale_write"]["accepted"], true);
    let same_holder = scenario("redis-incr-same-holder");
    assert_eq!(same_holder["stale_write"]["accepted"], false);
    let lost = scenario("redis-incr-lost");
    assert!(
        lost["b_token"].as_i64() < lost["a_token"].as_i64(),
        "{lost}"
    );
    assert_eq!(lost["stale_write"]["accepted"], true, "{lost}");
    let durable = scenario("durable-token");
    assert_eq!(durable["token_reissued"], false, "{durable}");
    assert_eq!(durable["stale_write"]["accepted"], false, "{durable}");

    // The Redis part's faults are a schedule the one player played, carried in --json
    // before the etcd part's: the replica lags (a pause that cuts its link), then the
    // primary dies and the replica is thawed, once the primary refused A:min-replicas.
    let redis_faults: Vec<(&str, &str)> = verdict["schedules"][0]
        .as_array()
        .unwrap_or_else(|| panic!("no schedule of the Redis part: {verdict}"))
        .iter()
        .map(|s| (s["fault"].as_str().unwrap(), s["target"].as_str().unwrap()))
        .collect();
    assert_eq!(
        redis_faults,
        [
            ("pause", "replica"),
            ("kill", "primary"),
            ("resume", "replica")
        ]
    );
    assert_eq!(verdict["schedules"][0][0]["cut_link"], true, "{verdict}");
    let lagged = lines
        .iter()
        .find(|e| e.kind() == Kind::Frozen)
        .and_then(|e| e.fault())
        .unwrap_or_else(|| panic!("the replica's lag is not in the history"));
    assert_eq!(lagged.target.as_deref(), Some("replica"));
    assert!(lagged.links_closed.is_some(), "{lagged:?}");

    // Scenario 2: WAIT answered 0 to A, so A wrote nothing; Redis still granted twice.
    let wait = scenario("redis-wait");
    assert_eq!(wait["two_holders"], true, "{wait}");
    assert_eq!(wait["replicas_confirmed"], 0, "{wait}");
    assert_eq!(wait["stale_write"]["attempted"], false, "{wait}");
    assert!(wait["stale_write"]["accepted"].is_null(), "{wait}");
    let writers: Vec<(&str, bool)> = wait["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["writer"].as_str().unwrap(), a["accepted"] == true))
        .collect();
    assert_eq!(writers, [("B:wait", true)], "only B wrote: {wait}");
    assert_eq!(wait["final_writer"], "B:wait", "{wait}");
    let refusal = lines
        .iter()
        .find_map(|e| match &e.what {
            What::Lost(lost) if e.worker == "A:wait" => Some(lost),
            _ => None,
        })
        .unwrap_or_else(|| panic!("A:wait never said its WAIT came back short"));
    assert_eq!(
        refusal.replicas_confirmed,
        wait["replicas_confirmed"].as_i64()
    );
    assert!(
        !lines.iter().any(|e| e.is("A:wait", Kind::Wrote)),
        "A:wait wrote after refusing"
    );

    let etcd = scenario("etcd-leader-killed");
    assert_eq!(etcd["two_holders"], false, "{etcd}");
    assert!(etcd["election_ms"].as_u64().unwrap() > 0, "{etcd}");
    assert!(
        etcd["b_token"].as_i64() > etcd["a_token"].as_i64(),
        "{etcd}"
    );
    assert_eq!(etcd["stale_write"]["attempted"], false, "{etcd}");
    // The term printed for the new leader is the new term, not the applied entry's old one.
    let elected = read_back(&lines, "etcd", |h| h.election_ms.is_some())
        .unwrap_or_else(|| panic!("no event for the new leader"));
    assert!(
        elected.raft_term > elected.old_raft_term,
        "the new leader's term must be higher than the old one: {elected:?}"
    );
    // A's lease as the new leader counts it: more time left than the leader's reset (TTL +
    // election timeout, from the election) can have left, so a keepalive got through.
    let kept = lines
        .iter()
        .filter_map(holder_now)
        .find(|h| h.a_lease_renewed.is_some())
        .unwrap_or_else(|| panic!("no event for A's lease after the election"));
    assert_eq!(kept.a_lease_renewed, Some(true), "{kept:?}");
    assert_eq!(kept.a_key_held, Some(true), "{kept:?}");
    let lease_ttl_ms = lines
        .iter()
        .filter(|e| e.worker == "A:etcd")
        .find_map(|e| match &e.what {
            What::Waiting(w) => w.lease_ttl_ms,
            _ => None,
        })
        .unwrap_or_else(|| panic!("no event for A's lease"));
    let extension = lease_ttl_ms + lockslab::cluster::ETCD_ELECTION_MS;
    assert!(
        u64::try_from(kept.a_lease_left_s.unwrap()).unwrap() * 1000
            + kept.after_election_ms.unwrap()
            > extension,
        "A's lease was not above the new leader's reset: {kept:?}"
    );
    // B's place in the queue: the revision it queued with against the one it was granted.
    let place = read_back(&lines, "etcd", |h| h.b_token.is_some())
        .unwrap_or_else(|| panic!("no event for B's place in the queue"));
    assert_eq!(place.b_token, etcd["b_token"].as_i64(), "{place:?}");
    assert_eq!(
        place.b_kept_place,
        Some(place.b_token == place.b_queued_revision),
        "{place:?}"
    );

    // min-replicas-to-write 1: the primary refused A's lock, so nothing was granted twice.
    let min_replicas = scenario("redis-min-replicas");
    assert!(
        min_replicas["refused"]
            .as_str()
            .is_some_and(|r| r.starts_with("NOREPLICAS")),
        "{min_replicas}"
    );
    assert_eq!(min_replicas["two_holders"], false, "{min_replicas}");
    assert_eq!(min_replicas["attempts"], serde_json::json!([]));

    let majority = scenario("etcd-majority-lost");
    assert_eq!(majority["two_holders"], false);
    assert!(majority["unavailable"].is_string(), "{majority}");

    assert_one_clock(&lines);
    assert_gone(&worker_pids(&lines));
    assert!(
        run_dirs(tmp.path()).is_empty(),
        "cluster directories left behind"
    );
    assert_run_left_nothing(verdict["run_id"].as_str().unwrap());
}

#[test]
fn ctrl_c_mid_failover_stops_every_cluster_process_and_removes_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = failover_in(tmp.path(), &[]);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    // Mid-run: the primary is dead, the Sentinels are promoting the replica.
    read_until(&mut lines, &mut seen, |e| e.is("lab", Kind::Killed));
    let family = family_of(child.id() as i32);
    let names: Vec<String> = process_table()
        .into_iter()
        .filter(|p| family.contains(&p.pid))
        .map(|p| p.name)
        .collect();
    assert!(
        names
            .iter()
            .filter(|n| n.starts_with("redis-server"))
            .count()
            >= 4
            && names.iter().filter(|n| *n == "etcd").count() == 3,
        "the clusters run as children of the lab: {names:?}"
    );
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "Ctrl-C's exit status");
    for pid in family {
        assert!(!alive(pid), "process {pid} outlived the lab");
    }
    assert!(run_dirs(tmp.path()).is_empty(), "directories left behind");
    let run_id = run_id_of(&seen).unwrap().to_string();
    assert_run_left_nothing(&run_id);
    let mut db = lockslab::connect::postgres(&servers().postgres).unwrap();
    let sequences: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_class WHERE relname = $1",
            &[&format!("lockslab_fence_{run_id}")],
        )
        .unwrap()
        .get(0);
    assert_eq!(sequences, 0, "the token sequence was left behind");
}

#[test]
fn a_sigkilled_lab_leaves_no_server_and_its_directories_are_swept_next_time() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = failover_in(tmp.path(), &[]);
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    read_until(&mut lines, &mut seen, |e| e.kind() == Kind::Run);
    let family = family_of(child.id() as i32);
    assert!(family.len() >= 8, "clusters and workers: {family:?}");
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || family
            .iter()
            .all(|&pid| !alive(pid))),
        "a cluster process outlived the SIGKILLed lab"
    );
    let left = run_dirs(tmp.path());
    assert_eq!(left.len(), 2, "a SIGKILL leaves its two directories");
    // The next start of private servers sweeps them.
    let mut keeper = Command::new(BIN)
        .arg("__serve")
        .env("TMPDIR", tmp.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(keeper.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    for dir in &left {
        assert!(!dir.exists(), "{} was not swept", dir.display());
    }
    drop(keeper.stdin.take());
    keeper.wait().unwrap();
}

#[test]
fn own_clusters_are_refused_with_a_clear_usage_error() {
    let output = lockslab_offline(&["failover", "--sentinel-url", "redis://10.0.0.1:26379"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--sentinel-url"), "{stderr}");
    assert!(stderr.contains("SIGKILL"), "{stderr}");
}

/// A recorded run (`lockslab failover --json`, tests/fixtures/failover.jsonl) replayed
/// through the lab's checkers with no servers, by the lab's own replay (what `lockslab
/// check` runs): every verdict field the store's record and the backends' answers decide
/// follows from the evidence the recording carries.
#[test]
fn a_recorded_run_replays_through_the_checkers() {
    use lockslab::check::LateWrite;
    use lockslab::check::failover::{self as checks, TokenOrder};

    let (lines, verdict) = events_and_verdict(include_str!("fixtures/failover.jsonl"));
    let verdict = &verdict;
    let scenarios = verdict["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 9);
    let replayed = lockslab::labs::failover::replay(&lines, verdict).unwrap();
    assert_replays(&replayed);
    // Every row with writes, judged from the store's record: its tokens, its late write,
    // its final writer; etcd's two holders from the releases and the waiter's grant.
    assert_eq!(
        replayed.parts.len(),
        7,
        "the two rows that granted nothing have no writes"
    );
    for part in &replayed.parts {
        for field in [
            "token_reissued",
            "stale_write",
            "a_token",
            "b_token",
            "final_writer",
        ] {
            assert_eq!(
                part.replayed.get(field),
                part.recorded.get(field),
                "{}",
                part.name
            );
        }
    }
    let etcd = replayed
        .parts
        .iter()
        .find(|p| p.name == "etcd-leader-killed")
        .unwrap();
    assert_eq!(etcd.replayed["two_holders"], false);
    for part in &replayed.parts {
        assert_eq!(
            part.replayed["two_holders"], part.recorded["two_holders"],
            "{}",
            part.name
        );
    }
    // The stories the recording tells, as the checkers read them.
    let row = |name: &str| scenarios.iter().find(|s| s["name"] == name).unwrap();
    let not_lower = row("redis-incr-not-lower");
    assert_eq!(
        checks::token_order(not_lower["a_token"].as_i64(), not_lower["b_token"].as_i64()),
        Some(TokenOrder::Again)
    );
    let lost = row("redis-incr-lost");
    assert_eq!(
        checks::token_order(lost["a_token"].as_i64(), lost["b_token"].as_i64()),
        Some(TokenOrder::Lower)
    );
    let wait = row("redis-wait");
    assert_eq!(
        checks::late_write_seen(LateWrite::None, wait["replicas_confirmed"].is_i64(), false),
        checks::LateWriteSeen::NotMade
    );
    let elected = read_back(&lines, "etcd", |h| h.election_ms.is_some()).unwrap();
    assert!(elected.raft_term > elected.old_raft_term, "{elected:?}");
    let place = read_back(&lines, "etcd", |h| h.b_token.is_some()).unwrap();
    assert_eq!(
        place.b_kept_place,
        Some(checks::kept_place(
            place.b_queued_revision.unwrap(),
            place.b_token.unwrap()
        ))
    );
}
