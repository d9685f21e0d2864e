//! Private servers and `lockslab up` under interruption: signals while `initdb` runs, SIGKILL
//! of lockslab, a server of `up` that died, a server that fails to start, root with a private
//! runtime directory. Every test has its own temp root (TMPDIR) and state directory, so it can
//! check that nothing of its own is left — no `lockslab-*` directory, no process, no SysV
//! shared-memory segment created by its servers — without seeing other runs.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::{BIN, QUICK_LAB, eventually, process_table};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// One test's world: a temp root for TMPDIR, a state directory for `up`/`down`, and a cache
/// directory of its own, empty: its first private Postgres runs `initdb` (the step these
/// tests interrupt) rather than copying the template an earlier run kept.
struct World {
    tmp: tempfile::TempDir,
    state: PathBuf,
    cache: tempfile::TempDir,
    /// Keeps the state directory's parent alive.
    _state_parent: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        let tmp = tempfile::tempdir().unwrap();
        // The private Postgres runs as another user when the tests run as root.
        std::fs::set_permissions(tmp.path(), PermissionsExt::from_mode(0o711)).unwrap();
        let parent = tempfile::tempdir().unwrap();
        std::fs::set_permissions(parent.path(), PermissionsExt::from_mode(0o711)).unwrap();
        World {
            state: parent.path().join("state"),
            tmp,
            cache: tempfile::tempdir().unwrap(),
            _state_parent: parent,
        }
    }

    fn tmp(&self) -> &Path {
        self.tmp.path()
    }

    /// A lockslab command with no server configured, this world's TMPDIR and state dir.
    fn lockslab(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env_remove("LOCKSLAB_REDIS_URL")
            .env_remove("LOCKSLAB_ETCD_URL")
            .env_remove("LOCKSLAB_POSTGRES_URL")
            .env_remove("LOCKSLAB_PRIVATE_SERVERS")
            .env("LOCKSLAB_STATE_DIR", &self.state)
            .env("TMPDIR", self.tmp())
            .env("XDG_CACHE_HOME", self.cache.path())
            .env("NO_COLOR", "1");
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        self.lockslab(args).output().unwrap()
    }

    /// `lockslab-*` directories left in this world's temp root.
    fn leftover_dirs(&self) -> Vec<String> {
        lockslab_dirs(self.tmp())
    }

    /// Live processes of this world's servers (in its temp root or state directory).
    fn processes(&self) -> Vec<(i32, String)> {
        [self.tmp(), self.state.as_path()]
            .iter()
            .flat_map(|dir| processes_in(dir))
            .collect()
    }
}

impl Drop for World {
    /// Whatever a test started goes, even when it failed: `down`, then SIGKILL to every
    /// process of this world that is still there.
    fn drop(&mut self) {
        let _ = self
            .lockslab(&["down"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        for (pid, _) in self.processes() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

fn lockslab_dirs(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("lockslab-"))
                .collect()
        })
        .unwrap_or_default()
}

/// Processes (not zombies) whose command line or working directory is inside `dir`.
fn processes_in(dir: &Path) -> Vec<(i32, String)> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for proc in process_table() {
        if proc.state == 'Z' {
            continue;
        }
        let cwd = std::fs::read_link(format!("/proc/{}/cwd", proc.pid)).unwrap_or_default();
        if proc.cmdline.contains(&needle) || cwd.starts_with(dir) {
            found.push((proc.pid, proc.cmdline));
        }
    }
    found
}

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Every process that was ever a descendant of a process while it ran.
///
/// A process is known by its pid *and* its start time: on a busy machine a pid is reused
/// within minutes, and a later process with a family member's pid (another test's Postgres)
/// is no member, nor are its children, nor the shared memory it maps.
struct Family {
    members: Arc<std::sync::Mutex<HashMap<i32, u64>>>,
    segments: Arc<std::sync::Mutex<HashSet<PathBuf>>>,
    done: Arc<AtomicBool>,
    watcher: Option<thread::JoinHandle<()>>,
    since: u64,
}

/// A run's processes as a [`Family`] saw them, and when it watched them (Unix seconds).
///
/// A pid names a process only while it lives. With pid_max at 32768 a busy machine reuses
/// every pid within minutes, and machines that run Postgres tests collect stale segments of
/// other runs: a segment whose creator pid is in `pids` is this run's only if it was also
/// created while the run was watched.
#[derive(Clone, Default)]
struct Run {
    pids: HashSet<i32>,
    /// POSIX segments (`/dev/shm/PostgreSQL.*`) a process of the run had mapped.
    segments: HashSet<PathBuf>,
    from: u64,
    until: u64,
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Adds to `members` (pid → start time) every process in `table` whose parent is a member
/// that still lives as the same process; returns the members alive in `table`.
fn live_family(table: &[common::Proc], members: &mut HashMap<i32, u64>) -> Vec<i32> {
    // Each pid's start time in this table, read once: the watcher runs every 3ms.
    let started: HashMap<i32, u64> = table.iter().map(|p| (p.pid, p.start)).collect();
    let same = |members: &HashMap<i32, u64>, pid: i32| {
        started
            .get(&pid)
            .is_some_and(|start| members.get(&pid) == Some(start))
    };
    loop {
        let joining: Vec<(i32, u64)> = table
            .iter()
            .filter(|p| !same(members, p.pid) && same(members, p.ppid))
            .map(|p| (p.pid, p.start))
            .collect();
        if joining.is_empty() {
            break;
        }
        members.extend(joining);
    }
    table
        .iter()
        .filter(|p| members.get(&p.pid) == Some(&p.start))
        .map(|p| p.pid)
        .collect()
}

impl Family {
    fn watch(root: i32) -> Family {
        let start = process_table()
            .into_iter()
            .find(|p| p.pid == root)
            .map(|p| p.start)
            .expect("the watched process is running");
        let members = Arc::new(std::sync::Mutex::new(HashMap::from([(root, start)])));
        let done = Arc::new(AtomicBool::new(false));
        let segments = Arc::new(std::sync::Mutex::new(HashSet::new()));
        let (m, d, s) = (members.clone(), done.clone(), segments.clone());
        let watcher = thread::spawn(move || {
            while !d.load(Ordering::SeqCst) {
                let table = process_table();
                let live = live_family(&table, &mut m.lock().unwrap());
                let mapped = live
                    .into_iter()
                    .flat_map(lockslab::procs::postgres_segments_mapped_by);
                s.lock().unwrap().extend(mapped);
                thread::sleep(Duration::from_millis(3));
            }
        });
        Family {
            members,
            segments,
            done,
            watcher: Some(watcher),
            since: unix_now(),
        }
    }

    /// Is a process named `name` among the live descendants now?
    fn has_live(&self, name: &str) -> bool {
        let members = self.members.lock().unwrap().clone();
        process_table()
            .iter()
            .any(|p| members.get(&p.pid) == Some(&p.start) && p.name == name && p.state != 'Z')
    }

    fn stop(&mut self) -> Run {
        self.done.store(true, Ordering::SeqCst);
        if let Some(watcher) = self.watcher.take() {
            let _ = watcher.join();
        }
        Run {
            pids: self.members.lock().unwrap().keys().copied().collect(),
            segments: self.segments.lock().unwrap().clone(),
            from: self.since,
            until: unix_now(),
        }
    }
}

impl Drop for Family {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SysV segments a run created (see [`shm_created_by`]) and the POSIX segments its processes
/// mapped that are still in `/dev/shm`: what a Postgres leaves there when SIGKILL ends it.
fn shared_memory_left_by(runs: &[Run]) -> Vec<String> {
    let mut left = shm_created_by(runs);
    for run in runs {
        left.extend(
            run.segments
                .iter()
                .filter(|path| path.exists())
                .map(|path| path.display().to_string()),
        );
    }
    left
}

/// SysV shared-memory segments (shmid) that a process of one of `runs` created while that
/// run was watched, from /proc/sysvipc/shm (creator pid in column 5, creation time in 14;
/// a second's slack either side, as times are whole seconds).
fn shm_created_by(runs: &[Run]) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/sysvipc/shm").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let shmid = fields.get(1)?.parse::<i64>().ok()?;
            let cpid = fields.get(4)?.parse::<i32>().ok()?;
            let created = fields.get(13)?.parse::<u64>().ok()?;
            runs.iter()
                .any(|run| {
                    run.pids.contains(&cpid)
                        && (run.from.saturating_sub(1)..=run.until + 1).contains(&created)
                })
                .then(|| format!("shmid {shmid} (creator {cpid})"))
        })
        .collect()
}

/// Waits until a descendant named `name` is alive; false after `timeout`.
fn wait_for_child(family: &Family, name: &str, timeout: Duration) -> bool {
    eventually(timeout, || family.has_live(name))
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Starts `args` in `world`, waits until its `initdb` runs, waits `after` more, sends
/// `signal`; returns the exit status and every pid of the run's process tree. The run gets
/// an empty cache directory of its own: a template an earlier run of the world kept would
/// spare it `initdb`.
fn signal_during_initdb(
    world: &World,
    args: &[&str],
    signal: Signal,
    after: Duration,
) -> (std::process::ExitStatus, Run) {
    let empty_cache = tempfile::tempdir().unwrap();
    let mut child = world
        .lockslab(args)
        .env("XDG_CACHE_HOME", empty_cache.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut family = Family::watch(child.id() as i32);
    assert!(
        wait_for_child(&family, "initdb", Duration::from_secs(30)),
        "initdb never ran under lockslab {args:?}"
    );
    thread::sleep(after);
    kill(Pid::from_raw(child.id() as i32), signal).unwrap();
    let status = wait_with_timeout(&mut child, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("lockslab {args:?} did not exit within 60 s of {signal}"));
    // The servers' own children may outlive lockslab by a moment (they see their parent die).
    thread::sleep(Duration::from_millis(300));
    (status, family.stop())
}

// --- item 7: an interrupt while initdb runs ------------------------------------------------

#[test]
fn an_interrupt_while_initdb_runs_leaves_no_directory_process_or_shared_memory() {
    let lab: Vec<&str> = [&QUICK_LAB[..], &["--private-servers"]].concat();
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        for after_ms in [0, 150, 400, 800] {
            let world = World::new();
            let (status, family) =
                signal_during_initdb(&world, &lab, signal, Duration::from_millis(after_ms));
            let case = format!("{signal} {after_ms} ms after initdb started");
            assert_eq!(status.code(), Some(128 + signal as i32), "{case}");
            assert!(
                eventually(Duration::from_secs(10), || world.processes().is_empty()),
                "{case}: left running: {:?}",
                world.processes()
            );
            assert!(
                world.leftover_dirs().is_empty(),
                "{case}: left {:?} in the temp root",
                world.leftover_dirs()
            );
            assert!(
                eventually(Duration::from_secs(5), || shared_memory_left_by(
                    std::slice::from_ref(&family)
                )
                .is_empty()),
                "{case}: left shared memory: {:?}",
                shared_memory_left_by(std::slice::from_ref(&family))
            );
        }
    }
}

/// A second Ctrl-C ("again to quit now") kills initdb's whole process group, its own
/// `postgres` included, which cannot release its shared memory; the removal of the directory
/// that names that memory raced with the exit of the first Ctrl-C's cleanup. Before the fix,
/// 7 of 10 such runs left a segment, and 9 of 10 half a directory without its owner lock.
#[test]
fn a_second_interrupt_while_initdb_runs_leaves_no_directory_or_shared_memory() {
    let lab: Vec<&str> = [&QUICK_LAB[..], &["--private-servers"]].concat();
    for after_ms in [0, 40, 100, 170, 250] {
        let world = World::new();
        let case = format!("two SIGINTs {after_ms} ms after initdb's postgres started");
        let mut child = world
            .lockslab(&lab)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut family = Family::watch(child.id() as i32);
        assert!(
            wait_for_child(&family, "postgres", Duration::from_secs(30)),
            "{case}: initdb never started its postgres"
        );
        thread::sleep(Duration::from_millis(after_ms));
        let pid = Pid::from_raw(child.id() as i32);
        kill(pid, Signal::SIGINT).unwrap();
        thread::sleep(Duration::from_millis(20));
        let _ = kill(pid, Signal::SIGINT);
        let status = wait_with_timeout(&mut child, Duration::from_secs(30));
        thread::sleep(Duration::from_millis(300));
        let run = family.stop();
        assert_eq!(status.and_then(|s| s.code()), Some(130), "{case}");
        assert!(
            eventually(Duration::from_secs(10), || world.processes().is_empty()),
            "{case}: left running: {:?}",
            world.processes()
        );
        assert!(
            eventually(Duration::from_secs(5), || shared_memory_left_by(
                std::slice::from_ref(&run)
            )
            .is_empty()),
            "{case}: left shared memory: {:?}",
            shared_memory_left_by(std::slice::from_ref(&run))
        );
        assert!(
            world.leftover_dirs().is_empty(),
            "{case}: left {:?} in the temp root",
            world.leftover_dirs()
        );
    }
}

// --- item 9: SIGKILL of lockslab -------------------------------------------------------------

#[test]
fn what_a_killed_run_left_is_removed_by_the_next_start_and_nothing_else() {
    let world = World::new();
    // A live run that must survive the sweep: `lockslab __serve` keeps servers until stdin closes.
    let mut live = world
        .lockslab(&["__serve"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(live.stdout.take().unwrap()),
        &mut first_line,
    )
    .unwrap();
    let live_dirs = world.leftover_dirs();
    assert_eq!(live_dirs.len(), 1, "{first_line} {live_dirs:?}");

    // Another user's directory of the same shape, whose owner is not running: not ours to remove.
    let foreign = world.tmp().join("lockslab-foreign");
    std::fs::create_dir(&foreign).unwrap();
    std::fs::write(foreign.join("owner.lock"), "999999\n").unwrap();
    let root = nix::unistd::Uid::effective().is_root();
    if root {
        let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
        for path in [foreign.clone(), foreign.join("owner.lock")] {
            nix::unistd::chown(&path, Some(nobody.uid), Some(nobody.gid)).unwrap();
        }
    }

    // Kill runs: one while initdb runs, two once the lab is under way.
    let lab: Vec<&str> = [&QUICK_LAB[..], &["--private-servers"]].concat();
    let mut families = Vec::new();
    let (status, family) =
        signal_during_initdb(&world, &lab, Signal::SIGKILL, Duration::from_millis(200));
    assert_eq!(status.code(), None, "killed");
    families.push(family);
    for _ in 0..2 {
        let mut child = world
            .lockslab(
                &[
                    &QUICK_LAB[..2],
                    &["10s", "--pause", "12s", "--private-servers"],
                ]
                .concat(),
            )
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut family = Family::watch(child.id() as i32);
        // Worker A frozen: the servers are up and in use.
        let frozen = eventually(Duration::from_secs(40), || {
            common::children_of(child.id())
                .iter()
                .any(|(_, state, name)| name == "lockslab" && *state == 'T')
        });
        assert!(frozen, "the lab never froze its worker");
        child.kill().unwrap();
        child.wait().unwrap();
        thread::sleep(Duration::from_millis(300));
        families.push(family.stop());
    }
    let killed_dirs: Vec<String> = world
        .leftover_dirs()
        .into_iter()
        .filter(|d| !live_dirs.contains(d) && d != "lockslab-foreign")
        .collect();
    let size_kb = Command::new("du")
        .arg("-sk")
        .arg(world.tmp())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    eprintln!(
        "after 3 SIGKILLs: {} dirs ({}) , shared memory {:?}",
        killed_dirs.len(),
        size_kb.split_whitespace().next().unwrap_or("?"),
        shared_memory_left_by(&families)
    );

    // A killed run's servers are stopped by its watchdog, which on a loaded machine can take
    // a moment; the sweep rightly leaves a directory a live process still works in. Dead
    // runs only, then: what is still dying is not yet what the next start must sweep.
    let dying = |dir: &String| !common::processes_mentioning(dir).is_empty();
    assert!(
        eventually(Duration::from_secs(20), || !killed_dirs.iter().any(dying)),
        "a killed run's servers never stopped"
    );

    // The next start sweeps them.
    let next = world.run(&[&QUICK_LAB[..], &["--private-servers"]].concat());
    assert!(next.status.success(), "{}", text(&next));
    let mut left = world.leftover_dirs();
    left.sort();
    let mut expected = live_dirs.clone();
    if root {
        expected.push("lockslab-foreign".to_string());
    }
    expected.sort();
    assert_eq!(
        left, expected,
        "the killed runs' dirs must go, the live and foreign ones stay"
    );
    assert!(
        eventually(Duration::from_secs(5), || shared_memory_left_by(&families)
            .is_empty()),
        "the killed runs' shared memory is still there: {:?}",
        shared_memory_left_by(&families)
    );
    // The live run still works.
    let urls: serde_json::Value = serde_json::from_str(&first_line).unwrap();
    let probe = world
        .lockslab(&QUICK_LAB)
        .env("LOCKSLAB_REDIS_URL", urls["redis"].as_str().unwrap())
        .env("LOCKSLAB_POSTGRES_URL", urls["postgres"].as_str().unwrap())
        .output()
        .unwrap();
    assert!(
        probe.status.success(),
        "the live run's Postgres: {}",
        text(&probe)
    );
    drop(live.stdin.take());
    assert!(wait_with_timeout(&mut live, Duration::from_secs(30)).is_some());
    let _ = std::fs::remove_dir_all(&foreign);
    assert!(
        world.leftover_dirs().is_empty(),
        "{:?}",
        world.leftover_dirs()
    );
}

// --- item 8: `lockslab up` interrupted ------------------------------------------------------

#[test]
fn up_interrupted_at_any_moment_can_be_downed_and_restarted() {
    for (signal, after_ms) in [
        (Signal::SIGINT, 100),
        (Signal::SIGKILL, 100),
        (Signal::SIGKILL, 600),
    ] {
        let world = World::new();
        let case = format!("{signal} {after_ms} ms after initdb started");
        let (status, _) =
            signal_during_initdb(&world, &["up"], signal, Duration::from_millis(after_ms));
        if signal == Signal::SIGINT {
            assert_eq!(status.code(), Some(130), "{case}");
            assert!(
                eventually(Duration::from_secs(10), || world.processes().is_empty()),
                "{case}: an interrupted `up` left {:?}",
                world.processes()
            );
        }
        // `down` stops whatever `up` started.
        let down = world.run(&["down"]);
        assert!(down.status.success(), "{case}: {}", text(&down));
        assert!(
            eventually(Duration::from_secs(10), || world.processes().is_empty()),
            "{case}: left running after `down`: {:?}",
            world.processes()
        );
        assert!(
            !world.state.join("pg").exists(),
            "{case}: `down` left the Postgres directory"
        );
        // And `up` works again, after `down`…
        let up = world.run(&["up"]);
        assert!(
            up.status.success(),
            "{case}: `up` after `down`: {}",
            text(&up)
        );
        assert!(world.run(&["down"]).status.success());
        assert!(
            eventually(Duration::from_secs(10), || world.processes().is_empty()),
            "{case}: {:?}",
            world.processes()
        );
    }
    // …and without `down` in between.
    let world = World::new();
    signal_during_initdb(&world, &["up"], Signal::SIGKILL, Duration::from_millis(100));
    let up = world.run(&["up"]);
    assert!(
        up.status.success(),
        "`up` right after a killed `up`: {}",
        text(&up)
    );
    let status = world.run(&["status"]);
    assert!(status.status.success(), "{}", text(&status));
    assert_eq!(
        world
            .processes()
            .iter()
            .filter(|(pid, _)| comm(*pid) == "redis-server")
            .count(),
        1,
        "the killed `up`'s Redis must be gone: {:?}",
        world.processes()
    );
    assert!(world.run(&["down"]).status.success());
    assert!(
        eventually(Duration::from_secs(10), || world.processes().is_empty()),
        "{:?}",
        world.processes()
    );
}

// --- items 15 and 17: a server of `up` that died --------------------------------------------

#[test]
fn a_dead_server_of_up_is_named_and_never_replaced_silently() {
    let world = World::new();
    let up = world.run(&["up"]);
    assert!(up.status.success(), "{}", text(&up));
    let redis = world
        .processes()
        .into_iter()
        .find(|(pid, _)| comm(*pid) == "redis-server")
        .expect("up's Redis");
    kill(Pid::from_raw(redis.0), Signal::SIGKILL).unwrap();
    assert!(eventually(Duration::from_secs(5), || {
        common::proc_state(redis.0).is_none_or(|s| s == 'Z')
    }));

    let lab = world.run(&QUICK_LAB);
    let stderr = String::from_utf8_lossy(&lab.stderr);
    assert_eq!(lab.status.code(), Some(4), "{}", text(&lab));
    let messages = common::error_messages(&stderr).len();
    assert_eq!(messages, 1, "one message: {stderr}");
    let stderr = common::one_line(&stderr);
    for word in ["Redis", "lockslab up", "lockslab down"] {
        assert!(stderr.contains(word), "{word:?} in {stderr}");
    }

    let status = world.run(&["status"]);
    assert_eq!(status.status.code(), Some(4), "{}", text(&status));
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("not answering"),
        "{}",
        text(&status)
    );

    // `up` restarts it; then everything answers again.
    let up = world.run(&["up"]);
    assert!(up.status.success(), "{}", text(&up));
    let status = world.run(&["status"]);
    assert!(status.status.success(), "{}", text(&status));
    let lab = world.run(&QUICK_LAB);
    assert!(lab.status.success(), "{}", text(&lab));
    assert!(String::from_utf8_lossy(&lab.stdout).contains("from `lockslab up`"));
}

// --- item 16: a server that fails to start ---------------------------------------------------

/// A `redis-server` first on PATH that fails like a lost port race `failures` times, then
/// runs the real one. Returns the directory to put first on PATH and the calls file.
fn flaky_redis(dir: &Path, failures: u32) -> (PathBuf, PathBuf) {
    let real = std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|p| p.join("redis-server"))
        .find(|p| p.is_file())
        .expect("redis-server on PATH");
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let calls = dir.join("calls");
    let script = format!(
        "#!/bin/sh\n\
         echo \"$*\" >> '{calls}'\n\
         n=$(wc -l < '{calls}')\n\
         if [ \"$n\" -le {failures} ]; then\n\
           echo \"Warning: Could not create server TCP listening socket 127.0.0.1:$2: bind: Address already in use (try $n)\"\n\
           exit 1\n\
         fi\n\
         exec '{real}' \"$@\"\n",
        calls = calls.display(),
        real = real.display()
    );
    let wrapper = bin.join("redis-server");
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, PermissionsExt::from_mode(0o755)).unwrap();
    (bin, calls)
}

fn path_with(first: &Path) -> std::ffi::OsString {
    let mut paths = vec![first.to_path_buf()];
    paths.extend(std::env::split_paths(&std::env::var_os("PATH").unwrap()));
    std::env::join_paths(paths).unwrap()
}

#[test]
fn a_server_that_loses_its_port_is_retried_on_another() {
    let world = World::new();
    let scratch = tempfile::tempdir().unwrap();
    let (bin, calls) = flaky_redis(scratch.path(), 1);
    let output = world
        .lockslab(&[&QUICK_LAB[..], &["--private-servers"]].concat())
        .env("PATH", path_with(&bin))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
    let calls = std::fs::read_to_string(&calls).unwrap();
    let ports: HashSet<&str> = calls
        .lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| *w == "--port")?;
            words.get(at + 1).copied()
        })
        .collect();
    assert_eq!(calls.lines().count(), 2, "{calls}");
    assert_eq!(ports.len(), 2, "a new port for the second try: {calls}");
    assert!(
        world.leftover_dirs().is_empty(),
        "{:?}",
        world.leftover_dirs()
    );
}

#[test]
fn a_server_that_never_starts_shows_the_end_of_its_log() {
    let world = World::new();
    let scratch = tempfile::tempdir().unwrap();
    let (bin, calls) = flaky_redis(scratch.path(), 100);
    let started = Instant::now();
    let output = world
        .lockslab(&[&QUICK_LAB[..], &["--private-servers"]].concat())
        .env("PATH", path_with(&bin))
        .output()
        .unwrap();
    let stderr = common::one_line(&String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(4), "{}", text(&output));
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "took {:?}",
        started.elapsed()
    );
    assert!(stderr.contains("Redis"), "{stderr}");
    assert!(
        stderr.contains("Address already in use"),
        "the log's last lines: {stderr}"
    );
    let tries = std::fs::read_to_string(&calls).unwrap().lines().count();
    assert!(
        (2..=5).contains(&tries),
        "a bounded number of tries: {tries}"
    );
    assert!(
        world.leftover_dirs().is_empty(),
        "{:?}",
        world.leftover_dirs()
    );
    assert!(
        eventually(Duration::from_secs(10), || world.processes().is_empty()),
        "{:?}",
        world.processes()
    );
}

// --- item 18: root with a private runtime directory -------------------------------------------

#[test]
fn up_as_root_works_with_a_private_runtime_dir() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipped: only root runs Postgres as another user");
        return;
    }
    let world = World::new();
    let runtime = tempfile::tempdir().unwrap();
    // Mode 0700, like a real XDG_RUNTIME_DIR (/run/user/0).
    std::fs::set_permissions(runtime.path(), PermissionsExt::from_mode(0o700)).unwrap();
    let run = |args: &[&str]| {
        world
            .lockslab(args)
            .env_remove("LOCKSLAB_STATE_DIR")
            .env("XDG_RUNTIME_DIR", runtime.path())
            .output()
            .unwrap()
    };
    let guard = |args: &[&str]| run(args);
    let up = run(&["up"]);
    let ok = up.status.success();
    let alive: Vec<_> = [runtime.path(), world.tmp()]
        .iter()
        .flat_map(|d| processes_in(d))
        .collect();
    let down = guard(&["down"]);
    assert!(ok, "{}", text(&up));
    assert!(down.status.success(), "{}", text(&down));
    assert!(!alive.is_empty(), "servers ran after `up`");
    assert!(
        eventually(Duration::from_secs(10), || [runtime.path(), world.tmp()]
            .iter()
            .all(|d| processes_in(d).is_empty())),
        "left running after `down`"
    );
    assert!(
        world.leftover_dirs().is_empty(),
        "{:?}",
        world.leftover_dirs()
    );
    assert!(
        lockslab_dirs(runtime.path()).is_empty() || {
            let dir = runtime
                .path()
                .join(lockslab_dirs(runtime.path())[0].clone());
            std::fs::read_dir(dir).unwrap().next().is_none()
        }
    );
}

/// A run SIGKILLed a few milliseconds in, between making its directory and writing its
/// pid, leaves an empty directory or an empty `owner.lock`: the next start removes them once
/// they are a minute old (a live run writes both within microseconds), and nothing younger.
#[test]
fn a_run_killed_at_birth_is_swept_too() {
    let world = World::new();
    let old = |path: &Path| {
        let status = Command::new("touch")
            .arg("-d")
            .arg("2 minutes ago")
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success());
    };
    let empty = world.tmp().join("lockslab-killedatbirth1");
    std::fs::create_dir(&empty).unwrap();
    old(&empty);
    let unwritten = world.tmp().join("lockslab-killedatbirth2");
    std::fs::create_dir(&unwritten).unwrap();
    std::fs::write(unwritten.join("owner.lock"), "").unwrap();
    old(&unwritten.join("owner.lock"));
    let young = world.tmp().join("lockslab-justborn");
    std::fs::create_dir(&young).unwrap();
    std::fs::write(young.join("owner.lock"), "").unwrap();

    let run = world.run(&[&QUICK_LAB[..], &["--private-servers"]].concat());
    assert!(run.status.success(), "{}", text(&run));
    assert!(!empty.exists(), "an empty run directory a minute old stays");
    assert!(
        !unwritten.exists(),
        "a run directory with an empty owner.lock stays"
    );
    assert!(young.exists(), "a directory just made was taken for dead");
}

/// Issue 20, section 5: `XDG_RUNTIME_DIR=/nonexistent lockslab up` created
/// `/nonexistent/lockslab-0`; an existing 0700 state directory was loosened to 0711.
#[test]
fn up_creates_nothing_outside_an_existing_directory_and_keeps_modes_it_did_not_set() {
    let world = World::new();
    let missing = world.tmp().join("nonexistent");
    let with_missing_runtime_dir = |command: &str| {
        world
            .lockslab(&[command])
            .env_remove("LOCKSLAB_STATE_DIR")
            .env("XDG_RUNTIME_DIR", &missing)
            .output()
            .unwrap()
    };
    let up = with_missing_runtime_dir("up");
    let uid = nix::unistd::Uid::effective();
    let fallback = world.tmp().join(format!("lockslab-{uid}"));
    let down = with_missing_runtime_dir("down");
    assert!(up.status.success(), "{}", text(&up));
    assert!(down.status.success(), "{}", text(&down));
    assert!(!missing.exists(), "`up` created {}", missing.display());
    assert!(!fallback.exists(), "`down` left {}", fallback.display());

    // LOCKSLAB_STATE_DIR inside a directory that does not exist: refused, nothing made.
    let deep = world.tmp().join("no/such/place");
    let refused = world
        .lockslab(&["up"])
        .env("LOCKSLAB_STATE_DIR", &deep)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(4), "{}", text(&refused));
    assert!(
        text(&refused).contains("does not exist"),
        "{}",
        text(&refused)
    );
    assert!(!world.tmp().join("no").exists());

    // An existing private state directory keeps its mode while `up`'s servers run in it.
    std::fs::create_dir(&world.state).unwrap();
    std::fs::set_permissions(&world.state, PermissionsExt::from_mode(0o700)).unwrap();
    let up = world.run(&["up"]);
    let mode = std::fs::metadata(&world.state)
        .map(|meta| PermissionsExt::mode(&meta.permissions()) & 0o777)
        .unwrap_or(0);
    let down = world.run(&["down"]);
    assert!(up.status.success(), "{}", text(&up));
    assert!(down.status.success(), "{}", text(&down));
    assert_eq!(mode, 0o700, "the state directory's mode became {mode:o}");
    // `down` empties a directory the user made and keeps it.
    assert!(
        world.state.is_dir(),
        "`down` removed {}",
        world.state.display()
    );
    let left: Vec<_> = std::fs::read_dir(&world.state).unwrap().collect();
    assert!(left.is_empty(), "`down` left {left:?}");
}

/// A small tmpfs mounted for one test, unmounted when dropped; None when this user may not
/// mount (the test then checks nothing, and says so).
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount(size: &str) -> Option<SmallDisk> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0711"),
                "tmpfs",
            ])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        mounted.then(|| SmallDisk(dir))
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// Issue 20, section 5: on a full disk, initdb's failure said "the end of its log: (empty)",
/// since its log sat on that disk too.
#[test]
fn a_full_disk_is_named_as_the_cause() {
    let Some(disk) = SmallDisk::mount("8M") else {
        eprintln!("skipped: cannot mount a tmpfs here (not root?)");
        return;
    };
    let world = World::new();
    let output = world
        .lockslab(&[&QUICK_LAB[..], &["--private-servers"]].concat())
        .env("TMPDIR", disk.0.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(4), "{}", text(&output));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains("No space left on device") || said.contains("no space left on"),
        "{said}"
    );
    assert!(!said.contains("(empty)"), "{said}");
    let left: Vec<_> = std::fs::read_dir(disk.0.path())
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "left on the disk: {left:?}");
}
