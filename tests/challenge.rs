//! `lockslab challenge` against real servers, with real client programs: the reference
//! clients (examples/challenge/reference.py) are graded as they should be, from the
//! database's log; a client that prints garbage, crashes, hangs, never answers or floods
//! is named; nothing is left running, after a normal run or a real SIGINT.
//!
//! The Python references need python3-redis and python3-psycopg2 (scripts/setup).

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

const PYTHON: &str = "/usr/bin/python3";

/// The Python reference client, as a copy every user may read: as root, lockslab runs the
/// clients as a user of their own, who may not enter the directory a clone lives in.
fn reference_py() -> &'static str {
    static COPY: OnceLock<String> = OnceLock::new();
    COPY.get_or_init(|| {
        readable_copy(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/challenge/reference.py"
        ))
    })
}

/// A copy of `file` in a directory of this test process's that every user may enter, with
/// its mode bits for others set as for its owner (read, and run if it runs); deleted when
/// the tests end.
fn readable_copy(file: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    extern "C" fn remove_dir_at_exit() {
        if let Some(dir) = DIR.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    let dir = DIR.get_or_init(|| {
        let dir =
            std::env::temp_dir().join(format!("lockslab-test-clients-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        // SAFETY: registers a plain `extern "C" fn` that takes no arguments, as atexit expects.
        unsafe {
            nix::libc::atexit(remove_dir_at_exit);
        }
        dir
    });
    let from = std::path::Path::new(file);
    let to = dir.join(from.file_name().unwrap());
    std::fs::copy(from, &to).unwrap();
    let mode = std::fs::metadata(from).unwrap().permissions().mode();
    let mode = 0o644 | if mode & 0o100 != 0 { 0o111 } else { 0 };
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
    to.to_str().unwrap().to_string()
}

fn python_ready() {
    let ok = std::process::Command::new(PYTHON)
        .args(["-c", "import redis, psycopg2"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{PYTHON} lacks redis or psycopg2: run scripts/setup");
}

/// Runs a challenge with `--json`; returns its exit code and verdict.
fn challenge(name: &str, seed: u64, extra: &[&str], program: &[&str]) -> (i32, Value, Output) {
    let seed = seed.to_string();
    let mut args = vec!["challenge", name, "--json", "--seed", &seed];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(program);
    let output = lockslab(&args).output().expect("running lockslab");
    let verdict = verdict_in(&output);
    let code = output.status.code().unwrap_or(-1);
    if matches!(code, 0 | 1 | 3) {
        graded_again_offline(&output, &verdict);
    }
    (code, verdict, output)
}

/// Every graded run's `--json`, given to `lockslab check`, grades again to the same
/// verdict — grade, problems, unknowns, faults that bit — from the history and the
/// evidence the verdict carries, with no server.
fn graded_again_offline(output: &Output, verdict: &Value) {
    let run = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(run.path(), &output.stdout).unwrap();
    let path = run.path().to_str().unwrap();
    let check = lockslab(&["check", path]).output().unwrap();
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success() && said.contains("Reproduced"),
        "lockslab check graded the run otherwise than it was ({}):\n{said}\n{}",
        verdict["grade"],
        String::from_utf8_lossy(&check.stderr)
    );
}

/// The verdict line of a challenge run with `--json`.
fn verdict_in(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|v| v["kind"] == "verdict")
        .unwrap_or_else(|| {
            panic!(
                "no verdict:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
}

/// The reference clients: the same modes in two languages, graded alike.
#[derive(Clone, Copy, Debug)]
enum Reference {
    Python,
    /// Built by `cargo test` beside lockslab (or by `cargo build --example challenge`).
    Rust,
}

impl Reference {
    const BOTH: [Reference; 2] = [Reference::Python, Reference::Rust];

    /// The command line that runs `mode`.
    fn program(self, mode: &str) -> Vec<&str> {
        match self {
            Reference::Python => {
                python_ready();
                vec![PYTHON, reference_py(), mode]
            }
            Reference::Rust => vec![reference_rs(), mode],
        }
    }

    /// One run of `mode` under challenge `name`: its exit code, verdict and output.
    fn run(self, name: &str, seed: u64, mode: &str) -> (i32, Value, Output) {
        challenge(name, seed, &[], &self.program(mode))
    }

    /// One run of `mode` under challenge `name`: its exit code and verdict.
    fn graded(self, name: &str, seed: u64, mode: &str) -> (i32, Value) {
        let (code, verdict, _) = self.run(name, seed, mode);
        (code, verdict)
    }

    /// The failing `mode` is caught on one of the first `seeds` seeds: that run's verdict.
    fn caught_within(self, name: &str, mode: &str, kind: &str, seeds: u64) -> Value {
        for seed in 1..=seeds {
            let (code, verdict) = self.graded(name, seed, mode);
            if code == 1 {
                assert!(kinds(&verdict).iter().any(|k| k == kind), "{verdict}");
                assert_eq!(verdict["grade"], "fail");
                return verdict;
            }
        }
        panic!("{self:?} {mode} passed {name} on {seeds} seeds");
    }
}

/// The Rust reference, as a copy every user may read (see [`reference_py`]).
fn reference_rs() -> &'static str {
    static COPY: OnceLock<String> = OnceLock::new();
    COPY.get_or_init(|| {
        let built = std::path::Path::new(BIN)
            .with_file_name("examples")
            .join("challenge");
        assert!(
            built.exists(),
            "{} is missing: run `cargo build --example challenge`",
            built.display()
        );
        readable_copy(built.to_str().unwrap())
    })
}

fn reference(name: &str, seed: u64, mode: &str) -> (i32, Value) {
    Reference::Python.graded(name, seed, mode)
}

fn kinds(verdict: &Value) -> Vec<String> {
    verdict["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kind"].as_str().unwrap().to_string())
        .collect()
}

/// The failing Python reference is caught on one of the first `seeds` seeds: that run's
/// verdict.
fn caught_within(name: &str, mode: &str, kind: &str, seeds: u64) -> Value {
    Reference::Python.caught_within(name, mode, kind, seeds)
}

/// The verdict's findings of `kind`.
fn findings<'a>(verdict: &'a Value, kind: &str) -> Vec<&'a Value> {
    verdict["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == kind)
        .collect()
}

/// A token checked only at the write fails, and the history shows the order that broke it.
fn caught_at_the_worst_order(name: &str) {
    python_ready();
    for seed in 1..=3 {
        let (code, verdict, output) =
            challenge(name, seed, &[], &[PYTHON, reference_py(), "checked"]);
        if code != 1 {
            continue;
        }
        assert!(kinds(&verdict).iter().any(|k| k == "lost"), "{verdict}");
        let history = String::from_utf8_lossy(&output.stdout);
        // The held one goes first: a write, or a commit (the fault aimed at the commit).
        let first = history.contains("write first") || history.contains("commit first");
        assert!(
            history.contains("after its read of r") && first,
            "the held newer holder is in the history: {history}"
        );
        return;
    }
    panic!("checked passed {name} on 3 seeds");
}

fn passes(name: &str, mode: &str, seed: u64) {
    let (code, verdict) = reference(name, seed, mode);
    assert_passed(code, &verdict);
}

fn assert_passed(code: i32, verdict: &Value) {
    assert_eq!(code, 0, "{verdict}");
    assert_eq!(verdict["grade"], "pass");
    assert_eq!(verdict["acknowledged"], verdict["jobs"]);
    every_fault_played_and_bit(verdict);
}

/// Every fault of the schedule played, and every fault that played bit — a fault that
/// follows its job to a retried write plays too, so there may be more than were planned.
fn every_fault_played_and_bit(verdict: &Value) {
    let (planned, played) = (&verdict["faults_planned"], &verdict["faults_played"]);
    assert!(played.as_u64() >= planned.as_u64(), "{verdict}");
    assert_eq!(verdict["faults_bit"], *played, "{verdict}");
}

/// The Rust references: the claim passes `pause` where the lock alone, or a token checked
/// at the write only, fails it; recording the job as done passes `exactly-once` where the
/// fenced lock doubles a job, and fails `crash` with a lease ten times too long; that lease
/// does not outlast `pause` either, held with a plain lock (`outlast`). (The three
/// that must never pass are graded beside their Python twins, below.)
#[test]
fn the_rust_references_are_graded_as_the_python_ones() {
    for (name, mode, grade) in [
        ("pause", "setnx", 1),
        ("pause", "checked", 1),
        ("pause", "claimed", 0),
        ("crash", "long", 1),
        ("pause", "outlast", 1),
        ("exactly-once", "fenced", 1),
        ("exactly-once", "once", 0),
        ("pause", "for-update", 0),
        ("delay", "advisory", 0),
        ("crash", "optimistic", 0),
    ] {
        // A failing reference is caught on one of three seeds, as the Python ones are; a
        // passing one never fails, and passes on one of three (a fault lockslab played late
        // on a busy machine is undecided, said so).
        let graded = (1..=3).map(|seed| Reference::Rust.graded(name, seed, mode));
        let mut codes = vec![];
        for (code, verdict) in graded {
            codes.push(code);
            if code == grade {
                break;
            }
            assert!(grade == 1 || code == 3, "{name} {mode}: {verdict}");
        }
        assert_eq!(codes.last(), Some(&grade), "{name} {mode}: {codes:?}");
    }
}

/// Each job appends its entry to its record's items: a lost update erases entries, named at
/// the write that erased them, and the jobs answered ok whose entries are gone are lost —
/// read from the items the trigger logged and the record holds.
#[test]
fn counter_without_a_lock_loses_updates_and_with_a_fenced_lock_does_not() {
    let verdict = caught_within("counter", "none", "stale-write", 3);
    let erasing: Vec<i64> = findings(&verdict, "stale-write")
        .iter()
        .filter(|p| !p["erased"].as_array().unwrap().is_empty())
        .map(|p| p["seq"].as_i64().unwrap())
        .collect();
    assert!(
        !erasing.is_empty(),
        "no stale write erased an entry: {verdict}"
    );
    let lost = findings(&verdict, "lost");
    assert!(
        lost.iter()
            .any(|p| erasing.contains(&p["gone"]["erased_by"].as_i64().unwrap_or(0))),
        "no lost job names a stale write that erased it: {verdict}"
    );
    // A change as its job meant leaves the items before it with the job's entry at the end.
    let change = verdict["changes"][0].clone();
    let mut meant = change["old_items"].as_array().unwrap().clone();
    meant.push(format!("j{}", change["job"]).into());
    assert_eq!(change["new_items"].as_array().unwrap(), &meant, "{change}");
    // Not `setnx`: on a busy machine a client stalled past the TTL makes it fail (rightly).
    passes("counter", "fenced", 1);
}

/// `fenced` holds its row lock across the pause: nobody writes the row before its held
/// write lands, so the pause tested nothing (unknown, never a pass); `claimed` holds no
/// row lock, a newer holder claims the row, and the held write is refused: it bit.
/// `checked` checks its token at the write only: lockslab holds the newer holder just
/// after its read and lets the frozen write go first, and both writes are taken.
#[test]
fn pause_catches_an_unfenced_lock_and_passes_a_claimed_write_only() {
    caught_within("pause", "setnx", "stale-write", 3);
    caught_at_the_worst_order("pause");
    // `fenced` keeps its row lock across the work: nobody writes the row while it is frozen,
    // and the next holder waits behind it (pg_blocking_pids) — the lock held it off.
    passes("pause", "fenced", 1);
    // A claim (an update of `fence` alone) before the read is not a write: not logged.
    // Its `writing` note is read before its write goes by (the proxy's gate), however late
    // lockslab reads it: never unknown for a note that lost the race to its write.
    passes("pause", "claimed", 2);
}

/// No client stops: the proxy holds one write in the network past the TTL, and it lands
/// over a newer holder's write unless the resource checks the token.
#[test]
fn delay_catches_an_unfenced_write_that_arrives_late_and_passes_a_claimed_one() {
    caught_within("delay", "setnx", "stale-write", 3);
    caught_at_the_worst_order("delay");
    passes("delay", "claimed", 1);
}

/// A lock let go after the write but before its commit (`pg_advisory_unlock`, or the Redis
/// key deleted, before `COMMIT`): the next holder reads the record without the write, which
/// is not committed yet, and its own write lands on it computed from that stale read. One
/// fault of each run holds the commit, and stretches that window (`play::aim`).
#[test]
fn pause_and_delay_catch_a_lock_let_go_before_the_commit() {
    for name in ["pause", "delay"] {
        for mode in ["unlock-early", "del-early"] {
            let verdict = caught_within(name, mode, "stale-write", 3);
            let lost = kinds(&verdict).iter().any(|k| k == "lost");
            assert!(lost, "the stale write erased an ok job's entry: {verdict}");
        }
    }
}

/// A client that says `writing` only after its write committed (a lie, or a bug): the
/// pause or delay aimed at the write after that note finds none — the client is done with
/// the job — and plays there, with the job's write already in the database's log, so it
/// missed. Before the grader read when the write landed, this client passed both. Under
/// `pause` the third pause lands in the middle of a job's work whatever the notes say, and
/// may catch its lock (`late` is `setnx`) when it lands after a read: then it fails.
#[test]
fn faults_that_miss_because_the_writing_note_came_after_the_commit_never_pass() {
    python_ready();
    for name in ["pause", "delay"] {
        let (code, verdict, output) = challenge(name, 1, &[], &[PYTHON, reference_py(), "late"]);
        let history = String::from_utf8_lossy(&output.stdout);
        assert!(
            history.contains("no write"),
            "the timeline says no write came: {history}"
        );
        assert!(code == 1 || code == 3, "{verdict}");
        // The two aimed at writes played (the pause in the work may wait for them and come
        // too late); only the pause in the work can bite: the two found no write.
        assert!(verdict["faults_played"].as_u64() >= Some(2), "{verdict}");
        let most_bit = if name == "pause" { 1 } else { 0 };
        assert!(
            verdict["faults_bit"].as_u64() <= Some(most_bit),
            "{verdict}"
        );
        // Missed either way: the note came after the write, or — on a busy machine, where
        // the note's and the database's clocks are within a millisecond — lockslab was late.
        let said = verdict["unknown"].to_string();
        assert!(
            said.contains("came after its write") || said.contains("lockslab was late"),
            "{said}"
        );
    }
}

/// The other lie: `writing` said before the read. A fault aimed there lands before
/// anything was read, and the worst order holds a newer holder that has not read yet: the
/// grader sees it in the items the writes carry. It fails or is unknown, never a pass.
#[test]
fn a_writing_note_sent_before_the_read_never_passes() {
    for name in ["pause", "delay"] {
        for seed in [1, 2] {
            let (code, verdict) = reference(name, seed, "early");
            assert!(code == 1 || code == 3, "{name} {seed}: {verdict}");
            if code == 3 {
                let said = verdict["unknown"].to_string();
                assert!(
                    said.contains("had not read") || said.contains("before its read"),
                    "{said}"
                );
            }
        }
    }
}

/// `liar` answers `fail` for a job that took longer than it liked, though its write
/// committed: it passed `pause` and `delay` when a `fail` counted as a refusal ("2 bit").
/// The log decides: the change the client said did not happen is named, and fails the run —
/// in Python and in Rust.
#[test]
fn a_fail_answered_for_a_write_that_committed_fails_with_the_change() {
    for (reference, name) in Reference::BOTH
        .into_iter()
        .flat_map(|reference| [(reference, "pause"), (reference, "delay")])
    {
        let verdict = reference.caught_within(name, "liar", "failed-but-written", 3);
        let lie = findings(&verdict, "failed-but-written")[0].clone();
        let seq = lie["seq"].as_i64().unwrap();
        let change = verdict["changes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["seq"].as_i64() == Some(seq))
            .unwrap_or_else(|| panic!("no change #{seq}: {verdict}"));
        assert_eq!(change["job"], lie["job"], "{verdict}");
    }
}

/// `shuffled` says `acquired` and `writing` only after `released`, with a lease of ten
/// lease_ms: honest notes fail it at `crash` (stuck lock), and shuffled ones passed. A note
/// out of order is the client misbehaving, named — in Python and in Rust.
#[test]
fn notes_out_of_order_are_the_client_misbehaving() {
    for reference in Reference::BOTH {
        let (code, verdict) = reference.graded("crash", 1, "shuffled");
        assert_eq!(code, 1, "{reference:?}: {verdict}");
        let said = verdict["client_failure"].as_str().unwrap_or_default();
        assert!(
            said.contains("said `acquired` for job") && said.contains("after its `released`"),
            "{reference:?}: {verdict}"
        );
    }
}

/// A lock that is Postgres's own — the row's (`SELECT … FOR UPDATE`) or an advisory lock —
/// held across the work: while its holder is frozen or its write held, nobody can write
/// the record, and the next client waits behind it. lockslab reads that wait from
/// pg_blocking_pids: the fault bit, and the lock held. (Both were undecided: "nobody wrote
/// r0 meanwhile".)
#[test]
fn a_lock_held_in_postgres_passes_pause_and_delay_on_the_waits_it_caused() {
    for (name, mode) in [
        ("pause", "for-update"),
        ("delay", "for-update"),
        ("pause", "advisory"),
        // Gives up after 3 TTLs and answers fail, against a fault held to 12: the tries
        // given up on meanwhile do not count against the job (it failed never-done).
        ("pause", "advisory-timeout"),
    ] {
        let verdict = passes_within(name, mode, 3);
        assert!(
            verdict["notes"]
                .to_string()
                .contains("the lock held it off"),
            "{verdict}"
        );
    }
}

/// `claimed-retry` claims the row with its token before the read, and when fenced out takes
/// the lock again and retries within the job (a new `writing` note). Under `pause` every
/// retry held past its lease loses the record to another client, so the fault followed the
/// job to its bound and the run was unknown on half the seeds; a job whose retry after a
/// read was held and refused has its retry tested, and the bound is lifted.
#[test]
fn a_claim_that_retries_within_its_job_passes_pause_and_delay() {
    for name in ["pause", "delay"] {
        passes_within(name, "claimed-retry", 3);
    }
}

/// A lockless client that leaves the refusal to the database's isolation: read, work and
/// write in one REPEATABLE READ or SERIALIZABLE transaction, retried from a fresh read on a
/// serialization failure. Its refused writes leave nothing in the statement log (the
/// transaction rolls back), so every fault was followed to its bound and the run was
/// undecided on every seed. The client's proxy sees the server abort the transaction
/// (SQLSTATE 40001), and that is the refusal.
#[test]
fn a_write_the_database_refuses_for_a_stale_snapshot_is_a_refusal() {
    for (name, mode) in [("pause", "serializable"), ("delay", "repeatable-read")] {
        let passed = (1..=3).find_map(|seed| {
            let (code, verdict, output) = Reference::Python.run(name, seed, mode);
            assert_ne!(code, 1, "{name} {mode} --seed {seed}: {verdict}");
            (code == 0).then_some((verdict, output))
        });
        let (verdict, output) = passed.unwrap_or_else(|| panic!("{mode} never passed {name}"));
        every_fault_played_and_bit(&verdict);
        let history = String::from_utf8_lossy(&output.stdout);
        assert!(
            history.contains(r#""kind":"pg_aborted""#) && history.contains("40001"),
            "no aborted transaction in the history:\n{history}"
        );
    }
}

/// A Postgres lock taken without waiting inside Postgres — `pg_try_advisory_xact_lock` or
/// `FOR UPDATE NOWAIT`, asked again every 20ms — puts nobody in pg_blocking_pids: both were
/// undecided ("nobody wrote r0 meanwhile"). lockslab now reads the lock itself from
/// pg_locks while the fault lasts, and the others asking; the lock held them off.
#[test]
fn a_postgres_lock_taken_without_waiting_passes_pause_and_delay() {
    for (name, mode) in [("pause", "try-advisory"), ("delay", "nowait")] {
        let verdict = passes_within(name, mode, 3);
        assert!(
            verdict["notes"].to_string().contains("kept asking"),
            "{verdict}"
        );
    }
}

/// `gives-up` asks for a Postgres advisory lock without waiting in Postgres, and after 6 ×
/// lease_ms of asking writes without it: a pause of 2–3 TTLs saw the lock hold every
/// waiter off, and passed a lock that a long enough pause breaks (a hostile tester's, 8 of
/// 8). Held off in Postgres, the fault now lasts to its bound (12 TTLs), the waiter gives up
/// meanwhile, and its write — or the frozen holder's, after it — is stale.
#[test]
fn a_waiter_that_gives_up_on_a_postgres_lock_is_caught_by_a_fault_held_to_its_bound() {
    let history = dodger_caught("gives-up", "pause", &["stale-write", "lost"]);
    assert!(history.contains("lasts to its bound"), "{history}");
}

/// `advisory-decoy` holds an advisory lock no other client ever asks for, and keeps its
/// Postgres session busy while it waits for its (unfenced) Redis lock: a frozen holder is
/// seen holding a Postgres lock while the others ask. But the others are not held off —
/// the newer Redis holder writes the record while the fault lasts — and the stale write
/// is caught.
#[test]
fn a_decoy_advisory_lock_holds_nobody_off() {
    for name in ["pause", "delay"] {
        dodger_caught("advisory-decoy", name, &["stale-write"]);
    }
}

/// `outlast` asks for a lease ten times lease_ms, hoping each fault ends before its key
/// does: it was unknown ("nobody wrote r0 meanwhile"), rewarded for the long lease. The
/// pause (or the hold) now lasts until the key is gone and a newer holder has read, and the
/// held write is stale. A lease past the bound (30 × lease_ms) is unknown, the bound named
/// in the verdict and the wait on the timeline.
#[test]
fn a_long_lease_is_waited_out_and_an_unfenced_write_caught_or_the_bound_named() {
    for name in ["pause", "delay"] {
        caught_within(name, "outlast", "stale-write", 2);
    }
    python_ready();
    let (code, verdict, output) =
        challenge("pause", 1, &[], &[PYTHON, reference_py(), "outlast", "30"]);
    assert_eq!(code, 3, "{verdict}");
    let said = verdict["unknown"].to_string();
    assert!(said.contains("the fault ended at its bound"), "{said}");
    let history = String::from_utf8_lossy(&output.stdout);
    assert!(
        history.contains("still has") && history.contains("the pause lasts until it is gone"),
        "{history}"
    );
}

/// `long` takes the same long lease with a fenced read (`SELECT … FOR UPDATE`, held across
/// the work): once the key is gone, the next holder waits on the frozen (or held) client's
/// row, and the fault bit — the lock held it off. It was unknown, the fault over while the
/// key still stood.
#[test]
fn a_fenced_client_with_a_long_lease_still_passes_pause_and_delay() {
    for name in ["pause", "delay"] {
        let verdict = passes_within(name, "long", 2);
        let said = verdict["notes"].to_string();
        assert!(said.contains("the lock held it off"), "{verdict}");
    }
}

/// A compare-and-set with retry holds no lock: a fault between its read and its write
/// makes its compare match nothing, and it reads again. The statement log shows that
/// refused UPDATE, so the fault bit and its retry is no note sent before a read (it was
/// undecided, "its `writing` note came before its read"). (Answering `fail` on a lost
/// compare instead is as safe, but a job can lose five tries in a row: never done, on most
/// seeds — measured, not asserted.) It passes crash and exactly-once as a lockless client: its kills
/// aim at its `writing` and its answer, and no stuck lock is asked of it.
///
#[test]
fn a_compare_and_set_with_retry_passes_as_a_lockless_client() {
    for (name, mode, seeds) in [
        ("pause", "optimistic", 3),
        ("delay", "optimistic", 3),
        ("crash", "optimistic", 3),
        ("exactly-once", "optimistic", 3),
    ] {
        passes_within(name, mode, seeds);
    }
}

/// A fault follows a compare-and-set through its retries (`challenge::play::aim`), and
/// while a newer holder's write is held at its proxy, each retry goes at once, in the same
/// worst order: held until the newer holder's wait ran out, the retry lost to that write
/// every round, until the fault stopped following ("the most it follows"). And a held
/// write whose record has no job left for a newer holder gets a spare: the seed's jobs
/// ran out while a chain of retries played, and the next fault found nobody to overtake
/// it ("nobody wrote r1 meanwhile"). Seed 3 ended undecided both ways before (pause and
/// delay, measured on the commit before); neither reason may come back.
#[test]
fn a_compare_and_set_followed_through_its_retries_is_neither_starved_nor_left_alone() {
    for name in ["pause", "delay"] {
        let (code, verdict) = Reference::Rust.graded(name, 3, "optimistic");
        assert_ne!(code, 1, "{name} optimistic --seed 3: {verdict}");
        let said = verdict.to_string();
        for reason in ["the most it follows", "nobody wrote"] {
            assert!(
                !said.contains(reason),
                "{name} --seed 3: {reason}: {verdict}"
            );
        }
    }
}

/// `blind-retry` reads the version by touching the row, compares it at its write, and,
/// refused, reads again and writes with no compare. When a fault follows its job to that
/// retry while a newer holder's write waits at its proxy, the retry is held until the newer
/// holder's write has landed, and then erases it (a lost update the data shows). Let go
/// first, as lockslab did for a while, the blind retry never met a newer write, and the
/// client passed pause and delay on every seed tried (11 of 11, by a hostile tester).
#[test]
fn a_blind_retry_after_a_refused_compare_never_passes_pause_or_delay() {
    for name in ["pause", "delay"] {
        let (code, verdict) = Reference::Rust.graded(name, 1, "blind-retry");
        assert_ne!(code, 0, "{name} blind-retry --seed 1 passed: {verdict}");
    }
}

/// The clients of tests/fixtures/worst_order_dodgers.py, each built to slip a broken design
/// past the worst order.
const DODGERS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/worst_order_dodgers.py"
);

/// Runs the dodger `mode` under challenge `name` on seeds 1 to 3 until it fails, with a
/// problem of one of `kinds`; it must pass on none of them (a run may be unknown: a fault
/// that found nobody coming for the record tested nothing). Returns the failed run's
/// timeline.
fn dodger_caught(mode: &str, name: &str, kinds_any: &[&str]) -> String {
    python_ready();
    let program = [PYTHON, &readable_copy(DODGERS), mode];
    for seed in 1..=3 {
        let (code, verdict, output) = challenge(name, seed, &[], &program);
        assert!(
            code == 1 || code == 3,
            "{name} {mode} --seed {seed}: {verdict}"
        );
        if code == 1 {
            assert!(
                kinds(&verdict)
                    .iter()
                    .any(|k| kinds_any.contains(&k.as_str())),
                "{name} {mode}, not {kinds_any:?}: {verdict}"
            );
            return String::from_utf8_lossy(&output.stdout).into_owned();
        }
    }
    panic!("{name} {mode} was caught on none of seeds 1 to 3")
}

/// `newer-blind` writes blind after a compare the database always refuses. As the newer
/// holder of a worst order it wrote that blind write where no fault held it, and passed
/// `pause` and `delay` on some seeds (2 of 6 each, by a hostile tester). Now the fault
/// follows the newer holder's job to its next write, and the next holder to read the record
/// writes first: the blind write erases it.
#[test]
fn a_blind_write_after_a_refused_compare_as_the_newer_holder_never_passes() {
    python_ready();
    let program = [PYTHON, &readable_copy(DODGERS), "newer-blind"];
    for name in ["pause", "delay"] {
        for seed in 1..=2 {
            let (code, verdict, _) = challenge(name, seed, &[], &program);
            assert_ne!(
                code, 0,
                "{name} newer-blind --seed {seed} passed: {verdict}"
            );
        }
    }
}

/// `ok-first` answers `ok` right after a compare the database always refuses, and does the
/// job's real write (read, work, blind UPDATE) after its answer, on a second connection,
/// where no fault follows the job any more: it passed pause and delay on every seed a
/// hostile tester tried (12 of 12). The log shows each such write committed after its `ok`.
#[test]
fn a_write_that_commits_after_its_ok_fails_the_run() {
    for name in ["pause", "delay"] {
        dodger_caught("ok-first", name, &["written-after-ok"]);
    }
}

/// `value-lease` keeps its lease as a deadline in its Redis key's value, where Redis sees
/// no expiry: lockslab ended each pause on its own time with the lease still running, and
/// counted the others' wait as the lock holding them off — a pass on 5 of 6 seeds for a
/// lock with no fence (a hostile tester's). Waited out as any lease, it is taken over and
/// the frozen holder's late write lands stale.
#[test]
fn a_lease_kept_in_the_keys_value_is_waited_out_as_any_lease() {
    dodger_caught("value-lease", "pause", &["stale-write"]);
}

/// `early-noop` checks its token only at the write (the design the worst order fails),
/// says `writing` before its read, and sends an UPDATE that matches nothing after the note;
/// `early-read` also reads, and throws that read away, before its note. Held at their note,
/// they read after the older write, and the no-op was taken for a refused compare-and-set:
/// both passed `pause` and `delay` on every seed tried. Held at their write, they wrote from
/// a read the older write made stale, and the data shows it.
#[test]
fn a_writing_note_before_the_read_does_not_dodge_the_worst_order() {
    let runs = [
        ("early-noop", "pause"),
        ("early-noop", "delay"),
        ("early-read", "pause"),
    ];
    for (mode, name) in runs {
        dodger_caught(mode, name, &["stale-write"]);
    }
}

/// A correct client passes on one of the first `seeds` seeds and fails on none: on a busy
/// machine lockslab may play a fault late (undecided, said so), never a false fail.
fn passes_within(name: &str, mode: &str, seeds: u64) -> Value {
    for seed in 1..=seeds {
        let (code, verdict) = reference(name, seed, mode);
        assert_ne!(code, 1, "{name} {mode} --seed {seed}: {verdict}");
        if code == 0 {
            every_fault_played_and_bit(&verdict);
            return verdict;
        }
    }
    panic!("{mode} never passed {name} on {seeds} seeds");
}

/// `lastcheck` asks "still mine, PTTL > 50?" after its work, just before its write, and
/// answers `fail` when not; `lastcheck-select` sends a `SELECT 1` before that check. Aimed
/// at the `writing` note, a pause froze the client before its check, and a delay held the
/// `SELECT 1` in the write's place: the check then saw the lock gone, and the run was
/// undecided (a refusal the database never saw) — lastcheck passed pause on every seed
/// before that. Aimed at the write itself, both faults land after the check, and the stale
/// write they let through is caught; on no seed does the guard pass. `lastcheck-decoy`
/// sends a write that matches nothing before its check: the fault is aimed at the write
/// that changed the record in the `ok` jobs (its second), and lands after the check
/// all the same. Each is run until caught, on at most three seeds (none passed on 50
/// seeds: `examples/challenge/measure.sh`).
#[test]
fn a_check_just_before_the_write_is_caught_by_a_fault_aimed_at_the_write() {
    for (reference, name, mode) in Reference::BOTH.into_iter().flat_map(|reference| {
        [
            (reference, "pause", "lastcheck"),
            (reference, "delay", "lastcheck"),
            (reference, "delay", "lastcheck-select"),
            (reference, "pause", "lastcheck-decoy"),
            (reference, "delay", "lastcheck-decoy"),
        ]
    }) {
        let mut caught = false;
        for seed in 1..=3 {
            if caught {
                break;
            }
            let (code, verdict, output) = reference.run(name, seed, mode);
            assert_ne!(
                code, 0,
                "{reference:?} {name} {mode} --seed {seed}: {verdict}"
            );
            let history = String::from_utf8_lossy(&output.stdout);
            let aimed = match name {
                "pause" => "at its write, held in its proxy",
                _ => "write by",
            };
            assert!(history.contains(aimed), "{name} {mode}: {history}");
            // Its decoys, tried, matched nothing: let by, not aimed at.
            let let_by = "changed nothing: let by";
            assert!(
                mode != "lastcheck-decoy" || history.contains(let_by),
                "{name} {mode}: {history}"
            );
            caught |= code == 1 && kinds(&verdict).iter().any(|k| k == "stale-write");
        }
        assert!(caught, "{name} {mode}: never caught on 3 seeds");
    }
}

/// Two hostile tester's clients around which write a fault holds. `deadline-decoy` sends,
/// ahead of a blind write, claims (a new `fence`, no effect) that the database's clock
/// refuses once late: a fault that held the first write changing a row landed on one, and
/// the client answered `fail` as if fenced out. A fault now holds the write carrying the
/// job's effect, and the blind write is caught. `lateclaim` claims the row after its read:
/// once claims went by, the worst order let the older write go only at the newer holder's
/// effect write, after its claim had refused it, and it passed every seed; the newer holder
/// is now held at its claim, the older write lands before it and is erased.
#[test]
fn a_claim_sent_ahead_of_the_write_neither_takes_the_fault_nor_dodges_the_worst_order() {
    for (name, mode, seed) in [
        ("pause", "deadline-decoy", 1),
        ("delay", "deadline-decoy", 2),
        ("delay", "lateclaim", 2),
        ("pause", "lateclaim", 3),
    ] {
        let (code, verdict, _) = Reference::Python.run(name, seed, mode);
        assert_eq!(code, 1, "{name} {mode} --seed {seed}: {verdict}");
        assert!(
            kinds(&verdict).iter().any(|k| k == "stale-write"),
            "{name} {mode} --seed {seed}: {verdict}"
        );
    }
}

/// The hostile tester's escalating decoys that tell the try from the real run: an unfenced
/// Redis lock sends, after its work, one more `UPDATE … SET job = job` than any job before
/// it, each matching the row only while tried (`now()` is the try's `BEGIN`, not the
/// statement's start), then checks "still mine, PTTL > 50?" and writes. Tried, a decoy
/// changes the records, so the fault held it; for real it matched nothing, a refusal the
/// database saw — and the real write came after the check, untouched: it passed pause and
/// delay (seed 1 and 2). The fault now follows its job to the next write, and the next,
/// until the job is answered: the real write is held too, and never passes.
#[test]
fn a_decoy_that_tells_the_try_from_the_real_run_does_not_keep_the_fault_off_the_real_write() {
    python_ready();
    let decoys = r#"
import json, sys, time, uuid, psycopg2, redis
def say(**m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"]); db.autocommit = True
r = redis.Redis.from_url(init["redis_url"])
table, prefix, lease = init["table"], init["key_prefix"], 4 * init["lease_ms"]
say(type="ready", notes=True)
for line in sys.stdin:
    job = json.loads(line)
    key, cur, first = f"{prefix}lock:{job['record']}", db.cursor(), True
    while True:
        owner = str(uuid.uuid4())
        while not r.set(key, owner, nx=True, px=lease):
            time.sleep(0.02)
        if first: say(type="acquired", job=job["id"])
        cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
        value, items = cur.fetchone()
        say(type="writing", job=job["id"])
        if first: time.sleep(job["work_ms"] / 1000)
        first = False
        for _ in range(r.incr(prefix + "decoys")):
            cur.execute(f"UPDATE {table} SET job = job WHERE record = %s "
                        "AND now() <> statement_timestamp()", (job["record"],))
        if r.get(key) == owner.encode() and r.pttl(key) > 50:
            cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s WHERE record = %s",
                        (value + job["add"], items + [job["append"]], job["id"], job["record"]))
            r.eval(RELEASE, 1, key, owner)
            say(type="released", job=job["id"]); say(type="ok", job=job["id"]); break
"#;
    for name in ["pause", "delay"] {
        for seed in 1..=2 {
            let (code, verdict, output) = challenge(name, seed, &[], &[PYTHON, "-c", decoys]);
            assert_ne!(code, 0, "{name} --seed {seed}: {verdict}");
            let history = String::from_utf8_lossy(&output.stdout);
            assert!(
                history.contains("the fault follows its job"),
                "{name} --seed {seed}: {history}"
            );
        }
    }
}

/// The hostile tester's way around the proxy: the server's port is `inet_server_port()`
/// of the proxied session, and the run's role and password work there too. Its real
/// writes went straight to the server, where no fault reaches; a decoy that tells the try
/// from the real run went through the proxy, took the fault and matched nothing — a
/// refusal, and the run passed `delay`. The proxies now read the sessions they open, and a
/// change made in any other session leaves the run unknown, never a pass.
#[test]
fn writes_sent_around_the_fault_proxy_leave_the_run_unknown() {
    python_ready();
    let around = r#"
import json, sys, re, psycopg2
def say(**m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
init = json.loads(sys.stdin.readline())
proxied = psycopg2.connect(init["postgres_url"]); proxied.autocommit = True
cur = proxied.cursor(); cur.execute("SELECT inet_server_port()"); port = cur.fetchone()[0]
user, password, db = re.match(r"postgres://([^:]+):([^@]+)@[^/]+/(\w+)", init["postgres_url"]).groups()
direct = psycopg2.connect(host="127.0.0.1", port=port, user=user, password=password, dbname=db)
direct.autocommit = True
table = init["table"]
say(type="ready", notes=True, lock=False)
for line in sys.stdin:
    job = json.loads(line)
    say(type="writing", job=job["id"])
    cur.execute(f"UPDATE {table} SET job = job WHERE record = %s "
                "AND now() <> statement_timestamp()", (job["record"],))
    direct.cursor().execute(
        f"UPDATE {table} SET value = value + %s, items = array_append(items, %s), job = %s "
        "WHERE record = %s", (job["add"], job["append"], job["id"], job["record"]))
    say(type="ok", job=job["id"])
"#;
    let (code, verdict, _) = challenge("delay", 1, &[], &[PYTHON, "-c", around]);
    assert_eq!(code, 3, "{verdict}");
    assert!(
        verdict
            .to_string()
            .contains("which no client's fault proxy opened"),
        "{verdict}"
    );
}

/// A correct lockless compare-and-set client (its Postgres connection through its proxy as
/// `db` and `cur`) that does `{first}` before it says `ready`.
const CAS_AFTER: &str = r#"
import json, sys, re, time, psycopg2
def say(**m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"]); db.autocommit = True
cur = db.cursor()
{first}
table = init["table"]
say(type="ready", notes=True, lock=False)
for line in sys.stdin:
    job = json.loads(line)
    while True:
        cur.execute(f"SELECT value, items FROM {table} WHERE record = %s", (job["record"],))
        value, items = cur.fetchone()
        say(type="writing", job=job["id"])
        time.sleep(job["work_ms"] / 1000)
        cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s "
                    "WHERE record = %s AND value = %s AND items = %s",
                    (value + job["add"], items + [job["append"]], job["id"], job["record"],
                     value, items))
        if cur.rowcount == 1:
            break
    say(type="ok", job=job["id"])
"#;

/// A session of a client's login that no proxy opened: the hostile tester's helper kept one
/// open to write a table of its own that cancelled a held write. On a Postgres lockslab
/// starts, the proxy signs in for its client with the login's real password, and the one
/// the client was given opens the proxy only: Postgres itself refuses the session around
/// it. Here a correct compare-and-set tries one and says what the server answered.
#[test]
fn a_session_around_the_fault_proxy_is_refused_by_postgres() {
    python_ready();
    let around = CAS_AFTER.replace(
        "{first}",
        r#"cur.execute("SELECT inet_server_port()"); port = cur.fetchone()[0]
user, password, name = re.match(r"postgres://([^:]+):([^@]+)@[^/]+/(\w+)", init["postgres_url"]).groups()
try:
    psycopg2.connect(host="127.0.0.1", port=port, user=user, password=password, dbname=name)
    sys.exit("a session around the proxy was let in")
except psycopg2.OperationalError as refused:
    if "password authentication failed" not in str(refused):
        sys.exit("refused, but not for its password: %s" % refused)"#,
    );
    // Private servers: a Postgres of lockslab's own, where each client logs in as its own
    // login (on a given one whose role cannot make roles, the clients share it).
    let output = lockslab(&["challenge", "pause", "--seed", "1", "--", PYTHON])
        .args(["-c", &around])
        .env_remove("LOCKSLAB_POSTGRES_URL")
        .env("LOCKSLAB_PRIVATE_SERVERS", "1")
        .output()
        .unwrap();
    // A client let in, or refused for anything but its password, exits before `ready`.
    let said = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{said}");
    assert!(said.contains("PASS  challenge pause"), "{said}");
}

/// A login may change its own password: back to itself (`SET ROLE NONE`), then `ALTER ROLE
/// CURRENT_USER PASSWORD …` through its proxy — and sessions around the proxy with the new
/// one are let in, too brief to be seen between two readings. The password only lockslab
/// knew no longer signs in after the run: the run is unknown, and `check` says so again.
#[test]
fn a_client_that_changes_its_logins_password_leaves_the_run_unknown() {
    python_ready();
    let changer = CAS_AFTER.replace(
        "{first}",
        r#"cur.execute("SET ROLE NONE"); cur.execute("ALTER ROLE CURRENT_USER PASSWORD 'mine'")
cur.execute("RESET ROLE"); cur.execute("SELECT inet_server_port()"); port = cur.fetchone()[0]
user, name = re.match(r"postgres://([^:]+):[^@]+@[^/]+/(\w+)", init["postgres_url"]).groups()
psycopg2.connect(host="127.0.0.1", port=port, user=user, password="mine", dbname=name).close()"#,
    );
    let output = lockslab(&["challenge", "pause", "--json", "--seed", "1", "--", PYTHON])
        .args(["-c", &changer])
        .env_remove("LOCKSLAB_POSTGRES_URL")
        .env("LOCKSLAB_PRIVATE_SERVERS", "1")
        .output()
        .unwrap();
    let verdict = verdict_in(&output);
    assert_eq!(output.status.code(), Some(3), "{verdict}");
    assert!(
        verdict.to_string().contains("its password changed"),
        "{verdict}"
    );
    graded_again_offline(&output, &verdict);
}

/// A pause waits for its client's write a lease past the job's work at most: a client that
/// works longer (here a row lock held across a slow job) is frozen then, where it is, and
/// the timeline says that no write came.
#[test]
fn a_pause_whose_write_does_not_come_lands_after_its_patience() {
    python_ready();
    let slow = r#"
import json, sys, time, psycopg2
def say(**m):
    sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
init = json.loads(sys.stdin.readline())
db, table = psycopg2.connect(init["postgres_url"]), init["table"]
say(type="ready", notes=True)
for line in sys.stdin:
    job = json.loads(line)
    with db, db.cursor() as cur:
        cur.execute(f"SELECT value, items FROM {table} WHERE record = %s FOR UPDATE",
                    (job["record"],))
        value, items = cur.fetchone()
        say(type="acquired", job=job["id"])
        say(type="writing", job=job["id"])
        time.sleep((job["work_ms"] + init["lease_ms"]) / 1000 + 0.3)
        cur.execute(f"UPDATE {table} SET value = %s, items = %s, job = %s WHERE record = %s",
                    (value + job["add"], items + [job["append"]], job["id"], job["record"]))
    say(type="released", job=job["id"])
    say(type="ok", job=job["id"])
"#;
    let (code, verdict, output) = challenge("pause", 1, &[], &[PYTHON, "-c", slow]);
    let history = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        history.matches("no write within 600ms").count(),
        2,
        "{history}"
    );
    assert_eq!(verdict["faults_played"], verdict["faults_planned"]);
    assert_ne!(code, 1, "{verdict}");
}

/// The statement log, like the change log, is lockslab's: the clients' role can neither
/// read it, forge a refusal into it, nor empty it.
#[test]
fn a_client_cannot_forge_or_erase_the_statement_log() {
    python_ready();
    let tamper = r#"
import json, sys, psycopg2
init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"]); db.autocommit = True
said = []
for sql in ["INSERT INTO {s}.statements (pid, rows) VALUES (1, 0)", "SELECT * FROM {s}.statements",
            "TRUNCATE {s}.statements", "DELETE FROM {s}.statements",
            "ALTER TABLE {s}.records DISABLE TRIGGER log_statement"]:
    try:
        db.cursor().execute(sql.format(s=init["schema"])); said.append("FORGED")
    except psycopg2.Error:
        said.append("DENIED")
print("-".join(said), flush=True)
"#;
    let output = lockslab(&[
        "challenge",
        "counter",
        "--json",
        "--seed",
        "1",
        "--",
        PYTHON,
        "-c",
        tamper,
    ])
    .env_remove("LOCKSLAB_POSTGRES_URL")
    .env("LOCKSLAB_PRIVATE_SERVERS", "1")
    .output()
    .unwrap();
    let verdict = verdict_in(&output);
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    assert!(
        failure.contains("DENIED-DENIED-DENIED-DENIED-DENIED"),
        "{failure}"
    );
}

/// A client that sends no notes is killed as its answer comes (the answer dies with it):
/// the resent job is done twice, and the fenced client without notes fails crash as the
/// one with notes does.
#[test]
fn crash_kills_a_client_without_notes_as_its_answer_comes() {
    let (code, verdict) = reference("crash", 1, "quiet");
    assert_eq!(code, 1, "{verdict}");
    assert!(!findings(&verdict, "doubled").is_empty(), "{verdict}");
    assert!(
        verdict["unknown"].to_string().contains("sends none"),
        "{verdict}"
    );
}

/// A third of the jobs delivered twice, and clients killed: a fenced lock applies a
/// delivered-again job again; recording the job as done with its effect does not.
#[test]
fn exactly_once_catches_a_job_applied_twice_and_passes_a_job_recorded_once() {
    let verdict = caught_within("exactly-once", "fenced", "doubled", 3);
    // Done twice, its entry is twice in its record's items.
    assert!(
        findings(&verdict, "doubled")
            .iter()
            .any(|p| p["in_items"].as_u64() > Some(1)),
        "{verdict}"
    );
    passes_within("exactly-once", "once", 3);
}

/// `--html` draws the run from its typed history: the held write is on the page.
#[test]
fn html_draws_the_run_with_its_network_faults() {
    python_ready();
    let page = std::env::temp_dir().join(format!("challenge-{}.html", std::process::id()));
    let path = page.to_str().unwrap();
    let (code, verdict, _) = challenge(
        "delay",
        2,
        &["--html", path],
        &[PYTHON, reference_py(), "setnx"],
    );
    let html = std::fs::read_to_string(&page).expect("the page was written");
    let _ = std::fs::remove_file(&page);
    assert_eq!(code, 1, "{verdict}");
    let run_id = verdict["run_id"].as_str().unwrap();
    assert!(html.contains(&format!("run {run_id}")), "names the run");
    assert!(html.contains("net_fault") && html.contains("net_healed"));
    assert!(
        html.contains("stale"),
        "the verdict's problems are on the page"
    );
}

#[test]
fn crash_catches_a_resent_job_done_twice_and_passes_a_job_recorded_once() {
    caught_within("crash", "fenced", "doubled", 3);
    // A Redis lock is not fair: a client kept off it for most of the run may take too few
    // jobs to reach the note its kill waits for (CI at fe42193: c1 given 3 jobs, its kill
    // at its 4th `released`), and the run is unknown — the schedule's miss. Never a fail.
    passes_within("crash", "once", 3);
}

/// Five clients share the 24 jobs, so each gets a few: every kill is aimed at a note its
/// client reaches, and a right client passes — never fails. One exception, named: a client
/// the others kept off the lock for most of the run (a Redis lock is not fair) may take too
/// few jobs to reach the note its kill waits for; the run is then unknown, and says it is
/// the schedule's miss, not the client's.
#[test]
fn crash_with_five_clients_kills_each_at_a_note_it_reaches() {
    python_ready();
    let mut passed = 0;
    for seed in 1..=3 {
        let (code, verdict, _) = challenge(
            "crash",
            seed,
            &["--clients", "5"],
            &[PYTHON, reference_py(), "once"],
        );
        if code == 3 {
            let reasons = verdict["unknown"].as_array().unwrap();
            let missed = |r: &Value| {
                let r = r.as_str().unwrap_or_default();
                r.contains("faults never played")
                    || r.contains("the schedule's miss, not the client's")
            };
            assert!(reasons.iter().all(missed), "seed {seed}: {verdict}");
            continue;
        }
        assert_eq!(code, 0, "seed {seed}: {verdict}");
        assert_eq!(verdict["faults_played"], verdict["faults_planned"]);
        passed += 1;
    }
    assert!(passed > 0, "no seed of three reached every note");
}

/// A TTL of ten lease_ms: a holder killed holding its lock keeps the next client waiting
/// past the bound (two TTLs and a second).
#[test]
fn crash_catches_a_lock_left_stuck_by_its_dead_holder() {
    caught_within("crash", "long", "stuck-lock", 8);
}

/// The Redis primary dies behind its replica mid-run, and Sentinel promotes the replica:
/// tokens counted there by INCR start again below those already written, and the fence
/// check that lets an equal token through lets one token write twice (caught); tokens from
/// a Postgres sequence never go back (passes). Either way no server of the run's Sentinel
/// cluster, nor any client, is left running.
#[test]
fn failover_catches_tokens_counted_in_redis_and_passes_tokens_from_a_postgres_sequence() {
    python_ready();
    for (mode, want) in [("sentinel", 1), ("sequence", 0)] {
        let tag = fresh_tag();
        let output = lockslab(&[
            "challenge",
            "failover",
            "--json",
            "--seed",
            "1",
            "--",
            PYTHON,
            reference_py(),
            mode,
        ])
        .env("LOCKSLAB_TEST_TAG", &tag)
        .output()
        .expect("running lockslab");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let lines: Vec<Value> = stdout
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect();
        let verdict = lines
            .iter()
            .find(|v| v["kind"] == "verdict")
            .unwrap_or_else(|| {
                panic!(
                    "no verdict:\n{stdout}\n{}",
                    String::from_utf8_lossy(&output.stderr)
                )
            });
        assert_eq!(output.status.code(), Some(want), "{mode}: {verdict}");
        let said = |words: &str| {
            lines
                .iter()
                .any(|e| e["text"].as_str().is_some_and(|t| t.contains(words)))
        };
        assert!(
            said("kills Redis primary") && said("Sentinel promoted"),
            "{stdout}"
        );
        assert_eq!(verdict["faults_played"], 1, "{verdict}");
        // The nemesis's one player plays the failover, as steps added to the run's schedule
        // when their moment came: the replica made to lag (frozen, its link cut), the
        // primary killed, the replica thawed — all in the schedule `--json` carries.
        let steps: Vec<String> = (verdict["schedule"].as_array())
            .unwrap_or_else(|| panic!("no schedule: {verdict}"))
            .iter()
            .map(|step| {
                let lag = if step["cut_link"] == true { "+cut" } else { "" };
                format!("{} {}{lag}", step["fault"], step["target"]).replace('"', "")
            })
            .collect();
        assert_eq!(
            steps,
            ["pause replica+cut", "kill primary", "resume replica"],
            "{verdict}"
        );
        if want == 1 {
            let problems = verdict["problems"].as_array().unwrap();
            let token = problems
                .iter()
                .find(|p| p["kind"] == "token-reused" || p["kind"] == "token-went-back")
                .unwrap_or_else(|| panic!("no token finding: {verdict}"));
            assert!(
                token["fence"].as_i64() <= token["earlier_fence"].as_i64(),
                "{token}"
            );
            assert!(
                token["earlier_seq"].as_i64() < token["seq"].as_i64(),
                "{token}"
            );
        } else {
            assert_eq!(verdict["grade"], "pass", "{verdict}");
            assert_eq!(verdict["acknowledged"], verdict["jobs"]);
        }
        // Redis overwrites its environment with its process title: its servers are found
        // by the ports the run named (`primary :p, replica :r, Sentinels :s :t :u`).
        let cluster = lines
            .iter()
            .filter_map(|e| e["text"].as_str())
            .find(|t| t.starts_with("primary :"))
            .unwrap_or_else(|| panic!("the cluster's ports are not named: {stdout}"));
        let ports: Vec<String> = cluster
            .split(':')
            .skip(1)
            .map(|p| p.chars().take_while(char::is_ascii_digit).collect())
            .collect();
        assert_eq!(ports.len(), 5, "{cluster}");
        let left = || {
            let mut left: Vec<String> = ports
                .iter()
                .flat_map(|port| processes_mentioning(&format!("127.0.0.1:{port}")))
                .map(|(_, _, cmdline)| cmdline)
                .collect();
            left.extend(processes_tagged(&tag).into_iter().map(|p| p.cmdline));
            left
        };
        let gone = eventually(Duration::from_secs(5), || left().is_empty());
        assert!(gone, "left running: {:?}", left());
    }
}

/// A client that writes no fence, and whose data is right, passes failover: there are no
/// tokens to grade, and the verdict says so (it failed "unfenced" on every change).
#[test]
fn failover_grades_tokens_only_where_there_are_tokens() {
    let verdict = passes_within("failover", "optimistic", 3);
    assert!(
        verdict["notes"].to_string().contains("no tokens to grade"),
        "{verdict}"
    );
}

/// Runs a misbehaving client (a shell line carrying `marker`), expects a failure that
/// names what it did, and no process of it left.
fn misbehaves(script: &str, says: &str) {
    // One marker per call: tests run at once, and one must not count another's lockslab.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let marker = format!("lockslab-challenge-test-{}-{call}-end", std::process::id());
    let script = format!("{script} # {marker}");
    let (code, verdict, output) =
        challenge("counter", 1, &["--patience", "2s"], &["sh", "-c", &script]);
    assert_eq!(code, 1, "{verdict}");
    // The replay line is the command run: its --patience, and the script one quoted word.
    let replay = verdict["replay"].as_str().unwrap_or_default();
    let quoted = format!("'{}'", script.replace('\'', "'\\''"));
    assert_eq!(
        replay,
        format!("lockslab challenge counter --seed 1 --patience 2s -- sh -c {quoted}")
    );
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    assert!(failure.contains(says), "{failure:?} should say {says:?}");
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("panicked"),
        "no panic"
    );
    let left = processes_mentioning(&marker);
    assert!(left.is_empty(), "left running: {left:?}");
}

/// A client that cannot start (every client exits before it says ready): the run could not
/// be graded (exit 4), and lockslab says only the cause, from the client's last stderr line.
fn cannot_start(script: &str, says: &str) -> String {
    // Fresh per call: the tests that use it run side by side in one test process.
    let marker = format!("lockslab-cannot-start-test-{}", fresh_tag());
    let script = format!("{script} # {marker}");
    let output = lockslab(&[
        "challenge",
        "counter",
        "--seed",
        "1",
        "--",
        "sh",
        "-c",
        &script,
    ])
    // As a projector shows it: the error wraps at 80 columns, like the verdict.
    .env("COLUMNS", "80")
    .output()
    .expect("running lockslab");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(4), "{stdout}\n{stderr}");
    let wide = too_wide(&stderr, 80);
    assert!(wide.is_empty(), "error lines over 80 columns: {wide:?}");
    let flat = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains(says), "{stderr:?} should say {says:?}");
    assert!(
        flat.contains("lockslab doctor") || flat.contains("an error of the client's own"),
        "{stderr}"
    );
    assert!(!stdout.contains("never"), "no never-done list:\n{stdout}");
    let left = processes_mentioning(&marker);
    assert!(left.is_empty(), "left running: {left:?}");
    stderr.into_owned()
}

#[test]
fn a_client_that_cannot_start_is_said_as_its_last_stderr_line() {
    let missing = cannot_start(
        "read l; echo 'Traceback (most recent call last):' >&2; \
         echo \"ModuleNotFoundError: No module named 'psycopg2'\" >&2; exit 1",
        "its last stderr line: ModuleNotFoundError: No module named 'psycopg2' (install \
         it for that python3, or name a python3 that has it)",
    );
    assert!(missing.contains("lockslab doctor"), "{missing}");
    // An error of the client's own, from Postgres: its message, not the CONTEXT line
    // Postgres adds after it, and no pointer to the doctor.
    let own = cannot_start(
        "read l; echo 'psycopg2.errors.UndefinedTable: relation \"jobs\" does not exist' \
         >&2; echo 'CONTEXT:  SQL statement in line 1' >&2; exit 1",
        "its last stderr line: psycopg2.errors.UndefinedTable",
    );
    assert!(!own.contains("lockslab doctor"), "{own}");
}

/// A Rust client that panics: its last line is Rust's hint to set RUST_BACKTRACE, which a
/// client's scrubbed environment would not pass on; the panic's message is quoted instead.
#[test]
fn a_rust_client_that_panics_is_said_by_its_message_not_the_backtrace_hint() {
    let stderr = cannot_start(
        "read l; echo \"thread 'main' panicked at src/main.rs:9:5:\" >&2; \
         echo 'no record named r9' >&2; \
         echo 'note: run with `RUST_BACKTRACE=1` environment variable to display a \
         backtrace' >&2; exit 101",
        "its last stderr line: no record named r9",
    );
    assert!(!stderr.contains("RUST_BACKTRACE"), "{stderr}");
}

/// A client that never says ready (a slow start on a loaded machine): nothing ran, so the
/// run is not graded (exit 4, no never-done list), and lockslab says how to give it longer.
#[test]
fn a_run_in_which_no_client_said_ready_could_not_run() {
    let marker = format!("lockslab-unready-test-{}", std::process::id());
    let script = format!("read l; sleep 30 # {marker}");
    let output = lockslab(&[
        "challenge",
        "counter",
        "--seed",
        "1",
        "--patience",
        "2s",
        "--",
        "sh",
        "-c",
        &script,
    ])
    .output()
    .expect("running lockslab");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(output.status.code(), Some(4), "{stdout}\n{stderr}");
    let flat = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("--patience 30s"), "{stderr}");
    assert!(!stdout.contains("never"), "no never-done list:\n{stdout}");
    let left = processes_mentioning(&marker);
    assert!(left.is_empty(), "left running: {left:?}");
}

/// A patience shorter than 3 TTLs and the longest wait behind the faults (two pauses of up
/// to 12 TTLs each, back to back on one record) would blame a client that waits rightly for
/// a frozen holder's lock: refused before any server starts, with the minimum.
#[test]
fn a_patience_too_short_for_the_ttl_is_refused_with_the_minimum() {
    let output = lockslab_offline(&[
        "challenge",
        "pause",
        "--ttl",
        "10s",
        "--patience",
        "20s",
        "--",
        "sh",
        "-c",
        "exit 0",
    ])
    .output()
    .expect("running lockslab");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--patience: at least 270s here"),
        "{stderr}"
    );
    assert!(!stderr.contains("starting"), "{stderr}");
}

/// The command lines lockslab suggests run the Python the docs name, the one scripts/setup
/// gives the modules: a bare `python3` may be another (pyenv, a virtualenv) without them.
#[test]
fn the_suggested_command_lines_run_the_python_the_docs_name() {
    let usage = lockslab_offline(&["challenge", "counter"])
        .output()
        .unwrap();
    for output in [
        lockslab_offline(&["challenge", "list"])
            .output()
            .unwrap()
            .stdout,
        lockslab_offline(&["challenge", "--help"])
            .output()
            .unwrap()
            .stdout,
        usage.stderr,
    ] {
        let said = String::from_utf8_lossy(&output);
        assert!(said.contains("-- /usr/bin/python3 "), "{said}");
        assert!(!said.contains("-- python3 "), "{said}");
    }
}

#[test]
fn a_missing_script_is_refused_before_any_server_starts() {
    let output = lockslab_offline(&["challenge", "counter", "--", "python3", "no/such/client.py"])
        .output()
        .expect("running lockslab");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("no/such/client.py: no such file"),
        "{stderr}"
    );
    assert!(!stderr.contains("starting"), "{stderr}");
}

#[test]
fn a_client_that_misbehaves_is_named_and_nothing_of_it_is_left() {
    misbehaves(
        r#"read l; echo '{"type":"ready"}'; read j; echo hello"#,
        "not a protocol message: \"hello\"",
    );
    misbehaves(
        r#"read l; echo '{"type":"ready"}'; echo oops >&2; exit 3"#,
        "exited by itself",
    );
    misbehaves(
        r#"read l; echo '{"type":"ready"}'; sleep 600"#,
        "did not answer job",
    );
    // One that never says ready, when no other did either: see
    // `a_run_in_which_no_client_said_ready_could_not_run` (exit 4, not graded).
    misbehaves(
        r#"read l; head -c 100000 /dev/zero | tr '\0' x"#,
        "longer than 4096 bytes",
    );
    misbehaves(
        r#"read l; echo '{"type":"ready"}'; read j; echo '{"type":"ok","job":99}'"#,
        "spoke of job 99",
    );
}

/// On a Postgres lockslab starts itself, the log belongs to its superuser and the clients
/// get a role of the run's own: a client that tries to switch off the log's trigger, empty,
/// write or read the log, or end the backends of anyone but its fellow clients (lockslab's
/// own, which read the log back), is refused by Postgres. It reports what Postgres said as
/// a line that is not protocol, which the failure quotes.
#[test]
fn a_client_cannot_rewrite_the_log_it_is_graded_from_nor_end_the_graders_connection() {
    python_ready();
    let tamper = r#"
import json, sys, psycopg2
init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"], application_name="tamper"); db.autocommit = True
said = []
for sql in ["ALTER TABLE {s}.changes DISABLE TRIGGER ALL", "TRUNCATE {s}.changes",
            "ALTER TABLE {s}.records DISABLE TRIGGER ALL",
            "INSERT INTO {s}.changes (record, job, old_value, new_value) VALUES ('r0', 1, 0, 1)",
            "SELECT * FROM {s}.changes", "SET ROLE lockslab", "SET ROLE lockslab_admin"]:
    try:
        db.cursor().execute(sql.format(s=init["schema"])); said.append("FORGED")
    except psycopg2.Error:
        said.append("DENIED")
cur = db.cursor()
cur.execute("SELECT pid, usename FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND usesysid IS NOT NULL AND application_name IS DISTINCT FROM 'tamper'")
others = cur.fetchall()
ended = []
for pid, user in others:
    try:
        cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
        if cur.fetchone()[0]:
            ended.append(user)
    except psycopg2.Error:
        pass
said.append("others-%d-ended-%d" % (len(others), len(ended)))
print("-".join(said), flush=True)
"#;
    // Only the Postgres is lockslab's own: Redis and etcd stay the shared ones.
    let output = lockslab(&[
        "challenge",
        "counter",
        "--json",
        "--seed",
        "1",
        "--",
        PYTHON,
        "-c",
        tamper,
    ])
    .env_remove("LOCKSLAB_POSTGRES_URL")
    .env("LOCKSLAB_PRIVATE_SERVERS", "1")
    .output()
    .unwrap();
    let verdict = verdict_in(&output);
    assert_eq!(output.status.code(), Some(1), "{verdict}");
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    assert!(
        failure.contains("DENIED-DENIED-DENIED-DENIED-DENIED-DENIED-DENIED-others-"),
        "{failure}"
    );
    // lockslab's connections were there to be tried, and none of them ended.
    assert!(!failure.contains("-others-0-"), "{failure}");
    assert!(failure.contains("-ended-0"), "{failure}");
}

/// A write the proxy cannot see is a write no fault can be aimed at: on a Postgres lockslab
/// starts itself, the clients' role may make tables, sequences and indexes of its own, but
/// Postgres refuses it a view, a rule or a function (each could write the records under
/// another name), and refuses any write to the records from inside a DO block. A plain
/// statement that names the records still runs.
#[test]
fn a_client_may_not_hide_a_write_to_the_records_behind_a_view_a_rule_a_function_or_a_do() {
    python_ready();
    let hider = r#"
import json, sys, psycopg2
init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"]); db.autocommit = True
said = []
for sql in ["CREATE TABLE {s}.done_{c} (job bigint PRIMARY KEY)", "CREATE SEQUENCE {s}.n_{c}",
            "CREATE VIEW {s}.v_{c} AS SELECT * FROM {t}",
            "CREATE TEMP VIEW tv AS SELECT * FROM {t}",
            "CREATE FUNCTION {s}.f_{c}() RETURNS int LANGUAGE sql AS "
            "'UPDATE {t} SET value = value WHERE false RETURNING 1'",
            "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
            "CREATE RULE r_{c} AS ON INSERT TO {s}.done_{c} DO ALSO UPDATE {t} SET value = 0",
            "DO $$ BEGIN UPDATE {t} SET value = value WHERE false; END $$",
            "UPDATE {t} SET value = value WHERE false"]:
    try:
        # Each client its own names: the three run at once, and a table another made
        # first would be refused as existing, not as forbidden.
        sql = sql.format(s=init["schema"], t=init["table"], c=init["client"])
        db.cursor().execute(sql); said.append("RAN")
    except psycopg2.Error:
        said.append("REFUSED")
print("-".join(said), flush=True)
"#;
    let output = lockslab(&[
        "challenge",
        "counter",
        "--json",
        "--seed",
        "1",
        "--",
        PYTHON,
        "-c",
        hider,
    ])
    .env_remove("LOCKSLAB_POSTGRES_URL")
    .env("LOCKSLAB_PRIVATE_SERVERS", "1")
    .output()
    .unwrap();
    let verdict = verdict_in(&output);
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    assert!(
        failure.contains("RAN-RAN-REFUSED-REFUSED-REFUSED-REFUSED-REFUSED-REFUSED-RAN"),
        "{failure}"
    );
}

/// The `user:password` of the first `postgres://lockslab_client_…` URL in `text`.
fn client_login_in(text: &str) -> String {
    let from = text
        .find("postgres://lockslab_client_")
        .map(|at| at + "postgres://".len());
    let rest = from.map(|at| &text[at..]).unwrap_or_default();
    rest.split('@').next().unwrap_or_default().to_string()
}

/// `counter` on seed 1 with the Python client `code`, on a Postgres where lockslab may
/// create roles (the test servers' labs role may not: there the clients share it, and the
/// heading says so). Returns the run's output and that Postgres's superuser URL.
fn counter_where_roles_are_made(code: &str) -> (Output, String) {
    python_ready();
    let (server, _) = servers().postgres_admin.rsplit_once('/').unwrap();
    let superuser = format!("{server}/lockslab");
    let args = [
        "challenge",
        "counter",
        "--json",
        "--seed",
        "1",
        "--",
        PYTHON,
        "-c",
        code,
    ];
    let output = lockslab(&args)
        .env("LOCKSLAB_POSTGRES_URL", &superuser)
        .output()
        .unwrap();
    (output, superuser)
}

/// Each client logs in as its own login of the run's role: it may not read another
/// session's statement or state in `pg_stat_activity` (a hostile client watched there for
/// the try lockslab runs in a frozen client's session, and had the others behave only
/// then), nor end another client's session.
#[test]
fn a_client_cannot_read_or_end_another_clients_session() {
    python_ready();
    let snoop = r#"
import json, sys, time, psycopg2
init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"]); db.autocommit = True; cur = db.cursor()
print(json.dumps({"type": "ready", "notes": False}), flush=True)
time.sleep(1)  # the other clients are connected by now
cur.execute("SELECT count(*) FILTER (WHERE query_start IS NOT NULL), count(*) FROM pg_stat_activity"
            " WHERE pid <> pg_backend_pid() AND datname = current_database()")
seen, sessions = cur.fetchone()
cur.execute("SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid()"
            " AND datname = current_database() AND usename LIKE 'lockslab_client%'")
ended = 0
for (pid,) in cur.fetchall():
    try:
        cur.execute("SELECT pg_terminate_backend(%s)", (pid,))
        ended += cur.fetchone()[0]
    except psycopg2.Error:
        pass  # refused: not its session
sys.stderr.write("SNOOP-%s-saw-%s-of-%s-ended-%s\n" % (init["client"], seen, sessions, ended))
sys.exit(1)
"#;
    let (output, _) = counter_where_roles_are_made(snoop);
    let verdict = verdict_in(&output);
    assert_eq!(output.status.code(), Some(1), "{verdict}");
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    let said = failure.split("SNOOP-").nth(1).unwrap_or_default();
    let parts: Vec<&str> = said.split('-').collect();
    assert!(
        parts.len() >= 7 && parts[2] == "0" && parts[6].starts_with('0'),
        "a client read or ended another's session: {failure}"
    );
    assert!(
        parts[4].parse::<u32>().unwrap_or(0) >= 1,
        "it saw no other session at all: {failure}"
    );
}

/// Under `pause` and `delay` a held write is tried in the client's own session and rolled
/// back. Every place a client could read that try off — a session's activity, lock and
/// transaction state, the tables' update counters (a rolled-back update counts), the
/// snapshot's running transactions — is refused to it, its default role dropped or not
/// (the expert's find: `pg_stat_get_backend_activity` and `n_tup_upd` were still open).
#[test]
fn every_statistic_a_client_could_read_a_try_off_is_refused() {
    python_ready();
    let probe = r#"
import json, sys, psycopg2
init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"]); db.autocommit = True; cur = db.cursor()
print(json.dumps({"type": "ready", "notes": False}), flush=True)
cur.execute("RESET ROLE")
probes = {
    "backend_activity": "SELECT pg_stat_get_backend_activity(s) FROM pg_stat_get_backend_idset() s",
    "backend_xact_start": "SELECT pg_stat_get_backend_xact_start(1)",
    "stat_activity": "SELECT query FROM pg_stat_activity",
    "locks": "SELECT * FROM pg_locks",
    "lock_status": "SELECT * FROM pg_lock_status()",
    "tuples_updated": "SELECT n_tup_upd FROM pg_stat_user_tables",
    "xact_tuples_updated": "SELECT n_tup_upd FROM pg_stat_xact_all_tables",
    "dead_tuples": "SELECT pg_stat_get_dead_tuples('pg_class'::regclass)",
    "database_rollbacks": "SELECT xact_rollback FROM pg_stat_database",
    "snapshot": "SELECT pg_current_snapshot()",
    "txid_snapshot": "SELECT txid_current_snapshot()",
    "txid_status": "SELECT txid_status(3)",
    "xact_status": "SELECT pg_xact_status('3'::xid8)",
    "sql_from_text": "SELECT query_to_xml('SELECT 1', false, false, '')",
    "ts_stat": "SELECT * FROM ts_stat('SELECT to_tsvector(''a'')')",
}
allowed = []
for name, sql in probes.items():
    try:
        cur.execute(sql)
        allowed.append(name)
    except psycopg2.Error:
        pass
cur.execute("SELECT 1")  # the session itself still works
sys.stderr.write("PROBE-allowed:%s-end\\n" % ",".join(allowed))
sys.exit(1)
"#;
    let output = lockslab(&[
        "challenge",
        "pause",
        "--private-servers",
        "--json",
        "--seed",
        "1",
        "--",
        PYTHON,
        "-c",
        probe,
    ])
    // Servers of its own: the revokes are made only on a Postgres lockslab started.
    .env_remove("LOCKSLAB_REDIS_URL")
    .env_remove("LOCKSLAB_ETCD_URL")
    .env_remove("LOCKSLAB_POSTGRES_URL")
    .output()
    .unwrap();
    let verdict = verdict_in(&output);
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    let allowed = failure
        .split("PROBE-allowed:")
        .nth(1)
        .and_then(|rest| rest.split("-end").next())
        .unwrap_or_else(|| panic!("the probe did not report: {verdict}"));
    assert_eq!(allowed, "", "a client may read these: {allowed}");
}

/// On a Postgres whose role may create roles, the clients connect as a role made for the
/// run — not the grader's — and it is gone when the run ends.
#[test]
fn the_clients_role_is_the_runs_own_and_is_dropped_at_the_end() {
    python_ready();
    let whoami = r#"
import json, sys, psycopg2
init = json.loads(sys.stdin.readline())
db = psycopg2.connect(init["postgres_url"]); cur = db.cursor()
cur.execute("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")
said = "connected-as-%s-super-%s" % cur.fetchone()
# What the role may own or be granted outside the run's schema: dropped with the role.
cur.execute("SELECT lo_create(0)")
cur.execute("ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO PUBLIC")
db.commit()
print(said, flush=True)
"#;
    let (output, superuser) = counter_where_roles_are_made(whoami);
    let verdict = verdict_in(&output);
    let run_id = verdict["run_id"].as_str().unwrap();
    let role = format!("lockslab_client_{run_id}");
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    assert!(
        failure.contains(&format!("connected-as-{role}-super-False")),
        "{failure}"
    );
    let mut db = postgres::Client::connect(&superuser, postgres::NoTls).unwrap();
    let left: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_roles WHERE rolname = $1 OR starts_with(rolname, $1 || '_')",
            &[&role],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the run's role {role} was not dropped");
    let objects: i64 = db
        .query_one("SELECT count(*) FROM pg_largeobject_metadata", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        objects, 0,
        "the large object the client made outlived its role"
    );
}

#[test]
fn the_last_words_of_a_crashing_client_are_quoted() {
    misbehaves(
        r#"read l; echo '{"type":"ready"}'; echo 'Traceback: boom' >&2; exit 1"#,
        "Traceback: boom",
    );
    // ...without the servers' password, when it logs the URLs it was given.
    let password = servers()
        .postgres
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.rsplit_once(':'))
        .map(|(_, password)| password.to_string())
        .expect("a password in the test's Postgres URL");
    let said = cannot_start(
        r#"read l; echo "connecting to $l" >&2; exit 1"#,
        "postgres_url",
    );
    assert!(said.contains("***") && !said.contains(&password), "{said}");
    let (_, verdict, _) = challenge(
        "counter",
        1,
        &["--patience", "2s"],
        &[
            "sh",
            "-c",
            r#"read l; echo "connecting to $l" >&2; echo "$l"; exit 1"#,
        ],
    );
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    assert!(failure.contains("***"), "{failure}");
    assert!(!failure.contains(&password), "{failure}");
    // ...nor the password of its own Postgres login, where it has one.
    let (output, _) = counter_where_roles_are_made(
        "import sys; init = sys.stdin.readline(); print('{\"type\": \"ready\"}', flush=True)\n\
         sys.stderr.write('connecting to ' + init); sys.exit(1)",
    );
    let verdict = verdict_in(&output);
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    let login = client_login_in(failure);
    assert!(login.ends_with(":***"), "{failure}");
}

/// Starts the pause challenge on the unfenced reference, tagged with `marker`, and stops
/// reading once the first client is frozen. Returns lockslab and the run's id.
fn started_until_the_first_pause(marker: &str) -> (std::process::Child, String) {
    started_until_the_first_pause_of(marker, &[PYTHON, reference_py(), "setnx", marker])
}

fn started_until_the_first_pause_of(
    marker: &str,
    program: &[&str],
) -> (std::process::Child, String) {
    python_ready();
    let mut args = vec!["challenge", "pause", "--json", "--seed", "3", "--"];
    args.extend_from_slice(program);
    let mut child = lockslab(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut run_id = None;
    // Until the first pause: clients are then running, one of them stopped.
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(event) = event_line(&line) {
            if let What::Run(facts) = &event.what {
                run_id = facts.run_id.clone();
            }
            if event.kind() == Kind::Frozen {
                break;
            }
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    let run_id = run_id.expect("a run event first");
    assert!(!processes_mentioning(marker).is_empty(), "clients running");
    (child, run_id)
}

fn schema_of(run_id: &str) -> Option<String> {
    let mut db = postgres::Client::connect(&servers().postgres, postgres::NoTls).unwrap();
    db.query_one(
        "SELECT to_regnamespace($1)::text",
        &[&format!("lockslab_challenge_{run_id}")],
    )
    .unwrap()
    .get(0)
}

#[test]
fn sigint_mid_challenge_leaves_no_client_schema_or_key() {
    let marker = format!("sigint-{}", std::process::id());
    let (mut child, run_id) = started_until_the_first_pause(&marker);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    let started = Instant::now();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(started.elapsed() < Duration::from_secs(20));
    let left = processes_mentioning(&marker);
    assert!(left.is_empty(), "left after Ctrl-C: {left:?}");
    assert_eq!(schema_of(&run_id), None, "the run's schema was dropped");
    let mut redis = redis::Client::open(servers().redis.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("lockslab:{run_id}:*"))
        .query(&mut redis)
        .unwrap();
    assert!(keys.is_empty(), "keys left: {keys:?}");
}

/// SIGKILL gives lockslab no time to clean up: the kernel kills its clients (the frozen one
/// too), and the next run on the same Postgres drops the dead run's schema.
#[test]
fn a_sigkilled_challenge_leaves_no_client_and_its_schema_is_swept_next_run() {
    let marker = format!("sigkill-{}", std::process::id());
    let (mut child, run_id) = started_until_the_first_pause(&marker);
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert!(
        common::eventually(Duration::from_secs(10), || processes_mentioning(&marker)
            .is_empty()),
        "clients left after SIGKILL: {:?}",
        processes_mentioning(&marker)
    );
    assert!(
        schema_of(&run_id).is_some(),
        "a SIGKILLed run left its schema"
    );
    passes("counter", "fenced", 1);
    assert_eq!(
        schema_of(&run_id),
        None,
        "the next run swept the dead run's schema"
    );
}

/// A client that starts a process in a session of its own (`setsid`): out of its process
/// group, out of the kernel's reach when lockslab dies, yet it carries the client's mark
/// in its environment.
fn escaping(marker: &str) -> String {
    format!(
        "setsid {PYTHON} -c 'import time; time.sleep(600)' {marker}-escaped & \
         exec {PYTHON} {} setnx {marker}",
        reference_py()
    )
}

#[test]
fn what_a_client_started_in_a_session_of_its_own_ends_with_the_run() {
    let marker = format!("setsid-end-{}", std::process::id());
    let (code, verdict, _) = challenge("counter", 1, &[], &["sh", "-c", &escaping(&marker)]);
    assert!(code == 0 || code == 1, "{verdict}");
    let left = processes_mentioning(&marker);
    assert!(left.is_empty(), "left after the run: {left:?}");
}

/// A challenge of clients run by `sh -c script`, once its first pause began and the process
/// the script set loose (`{marker}-escaped`) is running.
fn started_with_its_escapee(marker: &str, script: &str) -> std::process::Child {
    let (child, _) = started_until_the_first_pause_of(marker, &["sh", "-c", script]);
    assert!(
        !processes_mentioning(&format!("{marker}-escaped")).is_empty(),
        "it escaped"
    );
    child
}

#[test]
fn what_a_client_started_in_a_session_of_its_own_dies_when_the_run_is_sigkilled() {
    let marker = format!("setsid-kill-{}", std::process::id());
    let mut child = started_with_its_escapee(&marker, &escaping(&marker));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL).unwrap();
    child.wait().unwrap();
    assert!(
        common::eventually(Duration::from_secs(10), || processes_mentioning(&marker)
            .is_empty()),
        "left after SIGKILL: {:?}",
        processes_mentioning(&marker)
    );
    // Killed in the middle of a pause: the watchdog thawed the clients' freezer cgroups
    // (a frozen process does not die until thawed) and removed them.
    let cgroups = format!("lockslab-{}-", child.id());
    let left = || {
        (std::fs::read_dir("/sys/fs/cgroup/freezer")
            .into_iter()
            .flatten()
            .flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&cgroups))
        .count()
    };
    assert!(
        common::eventually(Duration::from_secs(10), || left() == 0),
        "{} freezer cgroups left",
        left()
    );
}

/// A client that double-forks a process into a session of its own with an empty
/// environment: no process group, no parent, no mark leads to it — but lockslab is the
/// clients' subreaper, so it comes to lockslab, which kills it with the run.
fn escaping_without_its_mark(marker: &str) -> String {
    format!(
        "( env -i setsid sh -c 'sleep 300; true' {marker}-escaped & ); \
         exec {PYTHON} {} setnx {marker}",
        reference_py()
    )
}

#[test]
fn what_a_client_double_forked_with_no_environment_ends_with_the_run() {
    let marker = format!("env-i-end-{}", std::process::id());
    let mut child = started_with_its_escapee(&marker, &escaping_without_its_mark(&marker));
    child.wait().unwrap();
    let left = processes_mentioning(&marker);
    assert!(left.is_empty(), "left after the run: {left:?}");
}

#[test]
fn what_a_client_double_forked_with_no_environment_ends_on_ctrl_c() {
    let marker = format!("env-i-sigint-{}", std::process::id());
    let mut child = started_with_its_escapee(&marker, &escaping_without_its_mark(&marker));
    kill(Pid::from_raw(child.id() as i32), Signal::SIGINT).unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(130));
    let left = processes_mentioning(&marker);
    assert!(left.is_empty(), "left after Ctrl-C: {left:?}");
}

/// A recorded `pause` run of the unfenced reference, replayed through the checker with no
/// servers by `lockslab check`'s replay: the jobs and the `ok`s from the typed events, the
/// log from the verdict, each record's final value and items from its last change, give
/// the recorded problems again. (tests/fixtures/challenge.jsonl, recorded before jobs
/// appended, is the picture's: a verdict of then still draws, but today's grader cannot
/// judge it again, and says so.)
#[test]
fn a_recorded_run_replays_through_the_checker_to_the_same_problems() {
    let (events, verdict) = events_and_verdict(include_str!("fixtures/challenge-items.jsonl"));
    let replayed = lockslab::reproduce::challenge::replay(&events, &verdict).unwrap();
    assert_replays(&replayed);
    let [part] = &replayed.parts[..] else {
        panic!("one part: {replayed:?}")
    };
    assert_eq!(part.replayed["problems"], verdict["problems"]);
    assert_eq!(part.replayed["grade"], "fail");
    assert_eq!(verdict["grade"], "fail");

    let (events, verdict) = events_and_verdict(include_str!("fixtures/challenge.jsonl"));
    let err = lockslab::reproduce::challenge::replay(&events, &verdict).unwrap_err();
    assert!(
        err.to_string()
            .contains("before a challenge's jobs appended"),
        "{err}"
    );
}

/// The hostile client of tests/fixtures: it says ready, then looks for every way past its
/// seat and reports what it reached as its last stderr line (see the file's doc).
const HOSTILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/hostile_client.py"
);

/// A state directory as `lockslab up` leaves one: its URLs, the admin's among them, in a
/// 0600 file in a 0700 directory of `owner`'s.
fn state_dir_of(owner: Option<u32>) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let file = state.path().join("servers.json");
    let urls = serde_json::json!({
        "postgres": servers().postgres,
        "postgres_admin": servers().postgres_admin,
    });
    std::fs::write(&file, urls.to_string()).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    if let Some(uid) = owner {
        let id = Some(nix::unistd::Uid::from_raw(uid));
        let group = Some(nix::unistd::Gid::from_raw(uid));
        nix::unistd::chown(state.path(), id, group).unwrap();
        nix::unistd::chown(&file, id, group).unwrap();
    }
    state
}

/// Runs `lockslab` (a `Command` made by [`lockslab`] or [`lockslab_as_a_plain_user`]) as a
/// person's shell would: the session leader of a terminal of its own (a pty), that terminal
/// its stdin. Returns its output and whatever reached the terminal's input — keystrokes a
/// client pushed with TIOCSTI.
fn on_a_terminal(mut command: std::process::Command) -> (Output, Vec<u8>) {
    use nix::sys::termios;
    use std::os::unix::process::CommandExt;
    let pty = nix::pty::openpty(None, None).unwrap();
    // Raw: a pushed keystroke is there to read at once, without a newline after it.
    let mut modes = termios::tcgetattr(&pty.slave).unwrap();
    termios::cfmakeraw(&mut modes);
    termios::tcsetattr(&pty.slave, termios::SetArg::TCSANOW, &modes).unwrap();
    let terminal = std::fs::File::from(pty.slave.try_clone().unwrap());
    command
        .stdin(terminal)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid and ioctl are plain system calls, allowed between fork and exec.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = command.output().expect("running lockslab on a terminal");
    let slave = &pty.slave;
    nix::fcntl::fcntl(
        slave,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .unwrap();
    let mut typed = vec![0u8; 256];
    let n = nix::unistd::read(slave, &mut typed).unwrap_or(0);
    typed.truncate(n);
    drop(pty.master);
    (output, typed)
}

/// What the hostile client said it reached, and its uid; and that nothing it wrote to paint
/// the screen (an escape sequence that clears it and prints a green PASS) got through.
fn hostile_report(output: &Output) -> (String, u32) {
    let verdict = verdict_in(output);
    assert_eq!(output.status.code(), Some(1), "{verdict}");
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    assert!(failure.contains("PAINTED"), "{failure:?}");
    assert!(
        !failure.chars().any(|c| c.is_control()),
        "a control character got through: {failure:?}"
    );
    let report = failure
        .split("hostile ")
        .nth(1)
        .unwrap_or_else(|| panic!("no report: {failure}"));
    let uid = report
        .strip_prefix("uid=")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|u| u.parse().ok())
        .unwrap_or_else(|| panic!("no uid: {report}"));
    let found = report.split("found=").nth(1).unwrap_or_default();
    (
        found
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string(),
        uid,
    )
}

/// Issue 40, rows 3 and 10, as root (as CI runs): a client under grading reads no
/// credential but the URL init hands it — not lockslab's environment (where the admin's URL
/// was given), nor its `/proc` entry (environ, memory, terminal), nor `up`'s state file,
/// nor a private Postgres's pg_hba.conf — and has no terminal to push keystrokes into: it
/// runs as a user of the run's own, in a session of its own.
#[test]
fn a_hostile_client_run_by_root_reaches_nothing_of_lockslabs_nor_its_terminal() {
    python_ready();
    let state = state_dir_of(None);
    let hostile = readable_copy(HOSTILE);
    let mut command = lockslab(&[
        "challenge",
        "counter",
        "--json",
        "--seed",
        "1",
        "--patience",
        "20s",
        "--",
        PYTHON,
        &hostile,
        state.path().to_str().unwrap(),
    ]);
    command
        .env("LOCKSLAB_POSTGRES_URL", admin_on_the_labs_database())
        .env("LOCKSLAB_STATE_DIR", state.path());
    let (output, typed) = on_a_terminal(command);
    let (found, uid) = hostile_report(&output);
    assert_eq!(found, "nothing", "the client reached: {found}");
    assert!(
        typed.is_empty(),
        "keystrokes reached the terminal: {typed:?}"
    );
    if nix::unistd::Uid::effective().is_root() {
        let postgres = ["postgres", "nobody"]
            .iter()
            .find_map(|name| nix::unistd::User::from_name(name).ok().flatten())
            .map(|user| user.uid.as_raw());
        assert_ne!(uid, 0, "the client ran as root");
        assert_ne!(
            Some(uid),
            postgres,
            "the client ran as the private Postgres's user"
        );
        let verdict = verdict_in(&output);
        assert_eq!(verdict["clients_isolated"], "own-user", "{verdict}");
    }
}

/// The superuser's URL on the labs' database (the one a run's client role may connect to),
/// as an instructor might give it to lockslab.
fn admin_on_the_labs_database() -> String {
    let (server, _) = servers().postgres_admin.rsplit_once('/').unwrap();
    format!("{server}/lockslab")
}

/// A copy of lockslab that a plain user may run, and the command that runs it as `nobody`
/// with this binary's servers (given in the environment, the admin's for Postgres).
fn lockslab_as_a_plain_user(args: &[&str]) -> std::process::Command {
    static COPY: OnceLock<String> = OnceLock::new();
    let bin = COPY.get_or_init(|| readable_copy(BIN));
    let servers = servers();
    let mut command = std::process::Command::new("/usr/bin/setpriv");
    let admin = admin_on_the_labs_database();
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(bin)
        .args(args)
        .env("LOCKSLAB_REDIS_URL", &servers.redis)
        .env("LOCKSLAB_ETCD_URL", &servers.etcd)
        .env("LOCKSLAB_POSTGRES_URL", &admin)
        .env("NO_COLOR", "1")
        .env("COLUMNS", "1000")
        .env("HOME", "/nonexistent")
        .env("TMPDIR", "/tmp")
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("LOCKSLAB_PRIVATE_SERVERS")
        .current_dir("/");
    command
}

/// The same attacks from a client of lockslab run by a plain user (`nobody`), whose clients
/// are the same user: a bwrap sandbox (user, PID and mount namespaces) hides lockslab's
/// environment, `/proc` entry, state and temp directories, and the session of its own
/// leaves it no terminal. A reference client still plays `pause` there and passes: the
/// nemesis freezes and resumes the sandbox's processes as any client's.
#[test]
fn a_hostile_client_run_by_a_plain_user_is_sandboxed_and_a_reference_still_passes() {
    python_ready();
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: only root can run lockslab as another user here");
        return;
    }
    assert!(
        lockslab::challenge::isolation::sandbox().is_ok(),
        "bwrap cannot make a sandbox here: run scripts/setup (it installs bubblewrap)"
    );
    let state = state_dir_of(Some(65534));
    let hostile = readable_copy(HOSTILE);
    let mut command = lockslab_as_a_plain_user(&[
        "challenge",
        "counter",
        "--json",
        "--seed",
        "1",
        "--patience",
        "20s",
        "--isolated",
        "--",
        PYTHON,
        &hostile,
        state.path().to_str().unwrap(),
    ]);
    command.env("LOCKSLAB_STATE_DIR", state.path());
    let (output, typed) = on_a_terminal(command);
    let (found, uid) = hostile_report(&output);
    assert_eq!(found, "nothing", "the client reached: {found}");
    assert!(
        typed.is_empty(),
        "keystrokes reached the terminal: {typed:?}"
    );
    assert_eq!(uid, 65534);
    assert_eq!(verdict_in(&output)["clients_isolated"], "sandbox");
    let reference = reference_py();
    let output = lockslab_as_a_plain_user(&[
        "challenge",
        "pause",
        "--json",
        "--seed",
        "2",
        "--",
        PYTHON,
        reference,
        "claimed",
    ])
    .output()
    .unwrap();
    let verdict = verdict_in(&output);
    assert_eq!(output.status.code(), Some(0), "{verdict}");
    every_fault_played_and_bit(&verdict);
}

/// A plain user with no `bwrap` on its PATH: the clients run as that user, the verdict says
/// they were trusted, and `--isolated` refuses to run (exit 4) before any server starts,
/// saying what to install.
#[test]
fn without_root_or_bwrap_the_clients_are_trusted_and_isolated_refuses_to_run() {
    use std::os::unix::fs::PermissionsExt;
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: only root can run lockslab as another user here");
        return;
    }
    // A PATH with a shell (the watchdog's) and nothing else: no bwrap.
    let bin = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("/bin/sh", bin.path().join("sh")).unwrap();
    let path = bin.path().to_str().unwrap();
    let output = lockslab_as_a_plain_user(&[
        "challenge",
        "counter",
        "--isolated",
        "--",
        "/bin/sh",
        "-c",
        "exit 0",
    ])
    .env("PATH", path)
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{stderr}");
    let flat = stderr.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(flat.contains("bwrap is not installed"), "{stderr}");
    assert!(flat.contains("apt-get install bubblewrap"), "{stderr}");
    assert!(!flat.contains("starting"), "{stderr}");
    let script = r#"read l; echo '{"type":"ready"}'; read j; exit 3"#;
    let output = lockslab_as_a_plain_user(&[
        "challenge",
        "counter",
        "--json",
        "--seed",
        "1",
        "--",
        "/bin/sh",
        "-c",
        script,
    ])
    .env("PATH", path)
    .output()
    .unwrap();
    let verdict = verdict_in(&output);
    assert_eq!(verdict["clients_isolated"], "trusted", "{verdict}");
}

/// As root, a client in a directory the run's own user cannot enter (root's home, a
/// private temp dir) is refused before any server starts (exit 4), and the advice copies
/// that client — the script alone, or its directory when more modules sit beside it — not
/// the directory lockslab runs in, and gives the line that runs it from the new place.
#[test]
fn a_client_its_user_cannot_read_is_refused_with_the_copy_and_the_line_to_run() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: only as root are the clients a user of their own");
        return;
    }
    let private = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        private.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let dir = private.path().to_str().unwrap();
    let client = format!("{dir}/client.py");
    std::fs::write(&client, "print('never run')\n").unwrap();
    let refused = |expected_copy: &str| {
        let output = lockslab(&["challenge", "counter", "--seed", "3", "--", PYTHON, &client])
            .current_dir("/")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(4),
            "{said}{}",
            String::from_utf8_lossy(&output.stdout)
        );
        assert!(said.contains(expected_copy), "{said}");
        assert!(!said.contains("cp -r . "), "{said}");
        assert!(
            said.contains(
                "cd /srv/client && lockslab challenge counter --seed 3 -- \
                 /usr/bin/python3 /srv/client/client.py"
            ),
            "{said}"
        );
    };
    refused(&format!("cp {client} /srv/client/"));
    std::fs::write(format!("{dir}/helpers.py"), "X = 1\n").unwrap();
    refused(&format!("cp -r {dir}/. /srv/client"));
}
