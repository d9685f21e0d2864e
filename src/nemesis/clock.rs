//! A worker's wall clock, set wrong on purpose — that worker's only.
//!
//! libfaketime (Debian's `faketime` package) is preloaded into the worker and reads the
//! offset it applies from a file on every call, so the nemesis can step the clock of a
//! running process by writing that file. The monotonic clock is left real
//! (`FAKETIME_DONT_FAKE_MONOTONIC=1`): a step moves what `SystemTime::now()` answers and
//! nothing else, the way an NTP step or an operator's `date -s` moves a machine's wall
//! clock while its monotonic clock runs on.
//!
//! Servers keep their true clocks: libfaketime hangs `redis-server` at start (recursive `clock_gettime()` calls; the port never opens), so a lab
//! that needs a server's clock to jump simulates it (lab 6 shortens the key's PTTL) and
//! says so. [`Nemesis::jump_server_clock`] is that simulation for any lab: Redis stores a
//! key's expiry as an absolute time on its own wall clock, so a jump of `J` ms forward
//! leaves each key `J` ms less to live — which is what cutting every key's TTL by `J` does.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use super::{Fault, Nemesis, Note, Record, Victim, fault_event};

/// Where Debian and Ubuntu install the preload library, by architecture.
const LIBRARY: [&str; 3] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

/// The preload library, if this machine has one.
pub fn library() -> Option<&'static str> {
    LIBRARY.into_iter().find(|path| Path::new(path).exists())
}

/// One worker's wall clock: the file its libfaketime reads the offset from.
pub struct WorkerClock {
    file: PathBuf,
    library: &'static str,
    /// Keeps the file's directory until the run ends.
    _dir: tempfile::TempDir,
}

/// Every clock's directory is named after the lockslab process that made it, so that one
/// left behind by a lab that was killed (SIGKILL runs no cleanup) can be told from one a
/// running lab still uses, and removed by the next lab that sets a clock.
const PREFIX: &str = "lockslab-clock-";

/// Removes the clock directories in `parent` whose lockslab process is gone.
fn sweep_leftovers(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if crate::procs::process_state(pid).is_none_or(|state| state == 'Z') {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// libfaketime shares a little state between a process and its children in POSIX shared
/// memory named after the process (`/dev/shm/faketime_shm_<pid>` and its semaphore
/// `sem.faketime_sem_<pid>`), removed when the process exits — but a worker killed with
/// SIGKILL, as the labs kill them, runs no exit code, and the pair stays. This version of
/// the library has no switch to turn the sharing off, so the segments of processes that are
/// gone are removed here: only this user's, only libfaketime's names, only for a pid that
/// no longer runs (a live one may still be using its segment).
fn sweep_preload_memory() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    let me = nix::unistd::Uid::effective().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| {
                name.strip_prefix("faketime_shm_")
                    .or_else(|| name.strip_prefix("sem.faketime_sem_"))
            })
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        let mine = entry.metadata().is_ok_and(|meta| {
            use std::os::unix::fs::MetadataExt;
            meta.uid() == me
        });
        if mine && crate::procs::process_state(pid).is_none_or(|state| state == 'Z') {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

impl Drop for WorkerClock {
    /// The run's workers are gone by now: what their preload library left goes too.
    fn drop(&mut self) {
        sweep_preload_memory();
    }
}

impl WorkerClock {
    /// A clock that starts true (offset `+0`).
    pub fn new() -> Result<WorkerClock> {
        let Some(library) = library() else {
            bail!(
                "a worker's wall clock can only be stepped with libfaketime, which this machine lacks: install it (apt-get install faketime), or leave out the clock fault"
            );
        };
        let parent = std::env::temp_dir();
        sweep_leftovers(&parent);
        sweep_preload_memory();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{PREFIX}{}-", std::process::id()))
            .tempdir_in(&parent)
            .context("making a directory for a worker's clock")?;
        let file = dir.path().join("offset");
        std::fs::write(&file, "+0\n").context("writing a worker's clock offset")?;
        Ok(WorkerClock {
            file,
            library,
            _dir: dir,
        })
    }

    /// The environment that gives a worker this clock.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("LD_PRELOAD", self.library.to_string()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.display().to_string()),
            // Read the file on every call: a step lands at once, not after a cache period.
            ("FAKETIME_NO_CACHE", "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
        ]
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect()
    }
}

impl Nemesis {
    /// Steps the victim's wall clock by `by_ms` (negative: back) from the true time, and
    /// records it. The step is written before it is recorded as done: libfaketime reads the
    /// file on the worker's next clock call.
    pub fn step_clock(
        &mut self,
        history: &mut impl Record,
        victim: &dyn Victim,
        clock: &WorkerClock,
        by_ms: i64,
        note: impl Into<Note>,
    ) -> Result<()> {
        let mut note = note.into();
        note.facts.clock_step_ms = Some(by_ms);
        let offset = if by_ms < 0 {
            format!("-{}\n", seconds(-by_ms))
        } else {
            format!("+{}\n", seconds(by_ms))
        };
        set_clock(history, victim, clock, Fault::ClockStep, note, &offset)
    }

    /// Sets the victim's wall clock running at `percent` of true time (libfaketime's speed
    /// factor, `+0 x0.5`), and records it.
    ///
    /// libfaketime scales from a start time of its own, not from the moment the file
    /// changes, so the change may step the clock a little as well; the lab checks at A's
    /// decision that it moved the way it should. It scales the worker's *sleeps* by the
    /// same factor, as measured on the fake clock (on this project's machine `sleep 1`
    /// took 2.2s of true time at half speed, 0.4s at three times): the lock code's 10ms
    /// polls become 20ms or about 3ms. The monotonic clock and timeouts set on a socket
    /// (`SO_RCVTIMEO`) are not touched.
    pub fn set_clock_rate(
        &mut self,
        history: &mut impl Record,
        victim: &dyn Victim,
        clock: &WorkerClock,
        percent: u32,
        note: impl Into<Note>,
    ) -> Result<()> {
        let mut note = note.into();
        note.facts.clock_rate_percent = Some(percent);
        let rate = format!("+0 x{}.{:02}\n", percent / 100, percent % 100);
        set_clock(history, victim, clock, Fault::ClockRate, note, &rate)
    }
}

/// Cuts each key's TTL by `ARGV[1]` ms, as a forward jump of the server's clock would: a key
/// with less left than that expires (is deleted) at once; one without a TTL is left alone.
/// In one script, so that no client's command lands between two keys' cuts — and, when
/// `ARGV[2]` names the first key's owner, only while that key is still theirs.
const JUMP: &str = r"
if ARGV[2] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[2] then return 0 end
for _, key in ipairs(KEYS) do
  local left = redis.call('PTTL', key)
  if left >= 0 then
    left = left - tonumber(ARGV[1])
    if left > 0 then redis.call('PEXPIRE', key, left) else redis.call('DEL', key) end
  end
end
return 1";

/// What a simulated jump found: each key's PTTL just before it (ms; -2 none, -1 no TTL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Jump {
    pub pttl_before_ms: Vec<i64>,
    /// The first key held the owner it was aimed at (or none was named).
    pub owned: bool,
}

impl Jump {
    /// Did the jump find the key it was aimed at (the first), still its owner's, with a
    /// TTL to cut?
    pub fn found_its_key(&self) -> bool {
        self.owned && self.pttl_before_ms.first().is_some_and(|ms| *ms >= 0)
    }
}

impl Nemesis {
    /// SIMULATES a Redis server's wall clock jumping `by_ms` forward (redis-server does not
    /// run under libfaketime): reads `keys`' PTTL, records the fault with `note(jump)` (say
    /// "simulated" in its words), then cuts each key's TTL by `by_ms` on `server` — or,
    /// when the first key, the one the jump is aimed at, has no TTL there or no longer
    /// holds `owner`, records nothing and cuts nothing: the jump came too late (the caller
    /// says why it did not play).
    #[allow(clippy::too_many_arguments)]
    pub fn jump_server_clock(
        &mut self,
        history: &mut impl Record,
        server: &mut redis::Connection,
        target: &str,
        keys: &[String],
        owner: Option<&str>,
        by_ms: u64,
        note: impl FnOnce(&Jump) -> Note,
    ) -> Result<Jump> {
        let mut pipe = redis::pipe();
        pipe.cmd("GET").arg(&keys[0]);
        for key in keys {
            pipe.cmd("PTTL").arg(key);
        }
        let (held_by, pttl_before_ms): (Option<String>, Vec<i64>) = {
            let mut replies: Vec<redis::Value> =
                pipe.query(server).context("reading the keys' PTTL")?;
            let held_by = redis::from_redis_value(replies.remove(0))?;
            let pttls = (replies.into_iter().map(redis::from_redis_value))
                .collect::<Result<Vec<i64>, _>>()?;
            (held_by, pttls)
        };
        let owned = owner.is_none_or(|owner| held_by.as_deref() == Some(owner));
        let jump = Jump {
            pttl_before_ms,
            owned,
        };
        if !jump.found_its_key() {
            return Ok(jump);
        }
        let mut note = note(&jump);
        note.facts.clock_step_ms = Some(by_ms as i64);
        let mut event = fault_event(Fault::ClockStep, target, 0, note);
        if let Some(facts) = event.fault_mut() {
            // A server's process is not what the jump touches (and may be another's).
            facts.pid = None;
        }
        history.record(event);
        redis::Script::new(JUMP)
            .key(keys)
            .arg(by_ms)
            .arg(owner.unwrap_or_default())
            .invoke::<i64>(server)
            .context("cutting the keys' TTL")?;
        Ok(jump)
    }
}

/// Records the fault, then writes what libfaketime reads on the worker's next clock call.
fn set_clock(
    history: &mut impl Record,
    victim: &dyn Victim,
    clock: &WorkerClock,
    fault: Fault,
    note: Note,
    contents: &str,
) -> Result<()> {
    let pid = victim.pid().unwrap_or_default();
    history.record(fault_event(fault, &victim.label(), pid, note));
    std::fs::write(&clock.file, contents).context("changing a worker's clock")
}

/// libfaketime's offsets are in seconds, with a fraction.
fn seconds(ms: i64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, What};

    #[derive(Default)]
    struct History(Vec<Event>);

    impl Record for History {
        fn record(&mut self, event: Event) {
            self.0.push(event);
        }
    }

    struct Worker;

    impl Victim for Worker {
        fn label(&self) -> String {
            "A".into()
        }
        fn pid(&self) -> Option<i32> {
            Some(4242)
        }
        fn kill_now(&mut self) {}
    }

    /// A lab killed with SIGKILL leaves its clock's offset file behind; the next sweep
    /// removes it, and leaves alone the directory of a lockslab still running (this one).
    #[test]
    fn a_killed_labs_clock_is_swept_and_a_running_ones_is_kept() {
        let parent = tempfile::tempdir().unwrap();
        let mut gone = std::process::Command::new("true").spawn().unwrap();
        let dead_pid = gone.id();
        gone.wait().unwrap();
        let dead = parent.path().join(format!("{PREFIX}{dead_pid}-abc123"));
        let live = parent
            .path()
            .join(format!("{PREFIX}{}-def456", std::process::id()));
        let other = parent.path().join("someone-elses");
        for dir in [&dead, &live, &other] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join("offset"), "-30.000\n").unwrap();
        }
        sweep_leftovers(parent.path());
        assert!(!dead.exists(), "the killed lab's clock is swept");
        assert!(
            live.join("offset").exists(),
            "a running lab's clock is kept"
        );
        assert!(
            other.exists(),
            "only lockslab's own directories are touched"
        );
    }

    #[test]
    fn a_rate_is_written_as_libfaketimes_speed_factor() {
        let dir = tempfile::tempdir().unwrap();
        let clock = WorkerClock {
            file: dir.path().join("offset"),
            library: "/nonexistent/libfaketime.so.1",
            _dir: dir,
        };
        let mut history = History::default();
        let mut nemesis = Nemesis::new();
        for (percent, written) in [(50, "+0 x0.50\n"), (300, "+0 x3.00\n")] {
            nemesis
                .set_clock_rate(&mut history, &Worker, &clock, percent, "rate")
                .unwrap();
            assert_eq!(std::fs::read_to_string(&clock.file).unwrap(), written);
        }
        let What::ClockStepped(facts) = &history.0[0].what else {
            panic!("{:?}", history.0)
        };
        assert_eq!(facts.fault, Some(Fault::ClockRate));
        assert_eq!(facts.clock_rate_percent, Some(50));
    }

    #[test]
    fn offsets_are_libfaketimes_seconds_with_a_fraction() {
        assert_eq!(seconds(30_000), "30.000");
        assert_eq!(seconds(1_500), "1.500");
        assert_eq!(seconds(7), "0.007");
    }

    /// The step is recorded as a fault of its own, and written where the worker's
    /// libfaketime reads it (a clock built by hand: no library is needed to check this).
    #[test]
    fn a_step_is_recorded_and_written_to_the_workers_offset_file() {
        let dir = tempfile::tempdir().unwrap();
        let clock = WorkerClock {
            file: dir.path().join("offset"),
            library: "/nonexistent/libfaketime.so.1",
            _dir: dir,
        };
        let mut history = History::default();
        let mut nemesis = Nemesis::new();
        nemesis
            .step_clock(
                &mut history,
                &Worker,
                &clock,
                -30_000,
                "steps A's clock back",
            )
            .unwrap();
        assert_eq!(std::fs::read_to_string(&clock.file).unwrap(), "-30.000\n");
        let [event] = history.0.as_slice() else {
            panic!("one event: {:?}", history.0)
        };
        let What::ClockStepped(facts) = &event.what else {
            panic!("{event:?}")
        };
        assert_eq!(facts.fault, Some(Fault::ClockStep));
        assert_eq!(facts.target.as_deref(), Some("A"));
        assert_eq!(facts.clock_step_ms, Some(-30_000));
        let env = clock.env();
        assert!(
            env.iter()
                .any(|(k, v)| k == "FAKETIME_DONT_FAKE_MONOTONIC" && v == "1")
        );
    }
}
