//! Instructor and workshop mode: the lab menu, `doctor`, completions and the man page,
//! `--step` driven through a pseudo-terminal, and a room's servers on a second loopback
//! address.

use crate::common;

use std::process::Command;

use common::*;

/// Every line of `text` fits a projector's 80 columns (counted in characters).
fn assert_fits_80(text: &str) {
    for line in text.lines() {
        assert!(
            line.chars().count() <= 80,
            "wider than 80 columns ({}): {line}",
            line.chars().count()
        );
    }
}

#[test]
fn the_menu_lists_the_labs_plainly_when_piped() {
    for args in [&[][..], &["list"][..]] {
        let output = Command::new(BIN).args(args).output().unwrap();
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8(output.stdout).unwrap();
        assert!(!text.contains('\u{1b}'), "no colours in a pipe:\n{text}");
        assert_fits_80(&text);
        for (number, command, walkthrough, needs) in [
            ("1", "gc-pause", "labs/01-gc-pause.md", "Redis, Postgres"),
            ("2", "naive", "labs/02-naive.md", "Redis"),
            ("3", "skip-locked", "labs/03-skip-locked.md", "Postgres"),
            (
                "4",
                "etcd-vs-redis",
                "labs/04-etcd-vs-redis.md",
                "Redis, etcd, Postgres",
            ),
        ] {
            let row = text
                .lines()
                .position(|l| l.split_whitespace().take(2).eq([number, command]))
                .unwrap_or_else(|| panic!("no row for lab {number} {command}:\n{text}"));
            let details = text.lines().nth(row + 1).unwrap();
            assert!(
                details.contains(walkthrough) && details.contains(needs) && details.contains('~'),
                "lab {number}'s time, servers and walkthrough: {details}"
            );
            assert!(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(walkthrough)
                    .is_file()
            );
        }
        assert!(text.contains("Type first:  lockslab gc-pause"), "{text}");
    }
    // The bare menu is a newcomer's first screen: it fits 45 rows, and names `list` for
    // the columns it leaves out.
    let output = Command::new(BIN).output().unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.lines().count() <= 45, "{text}");
    assert!(text.contains("  lockslab list "), "{text}");
    // `lockslab list` adds each lab's session, its --step stops and its by-hand tools.
    let output = Command::new(BIN).arg("list").output().unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    for lab in lockslab::menu::available() {
        let row = text
            .lines()
            .position(|l| l.split_whitespace().nth(1) == Some(lab.command))
            .unwrap();
        let more = text
            .lines()
            .skip(row + 2)
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            more.contains(&format!("session {} min", lab.session))
                && more.contains(&format!("--step: {} stops", lab.stops))
                && more.contains("by hand: "),
            "{}: {more}",
            lab.command
        );
    }
}

/// Issue 45: one estimate per lab — a run's time, its `--step` slot and its stops — the
/// same in `lockslab list` (the lab's row), its walkthrough and the README's table.
#[test]
fn each_labs_times_are_the_same_in_list_its_walkthrough_and_the_readme() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for lab in lockslab::menu::available() {
        let walkthrough = std::fs::read_to_string(root.join(lab.walkthrough)).unwrap();
        let time = walkthrough
            .lines()
            .find(|line| line.starts_with("**Time:**"))
            .unwrap_or_else(|| panic!("{}: no **Time:** line", lab.walkthrough));
        let said = format!(
            "a run takes ~{}; with `--step` in a room, a {}-minute slot",
            lab.takes, lab.session
        );
        assert!(
            time.contains(&said),
            "{}: {time}\nwants: {said}",
            lab.walkthrough
        );
        let row = format!(
            "| {} `{}` | ~{} | {} min | {} |",
            lab.number, lab.command, lab.takes, lab.session, lab.stops
        );
        assert!(readme.contains(&row), "README has no row {row}");
        assert!(lab.stops <= 15, "{}: {} stops", lab.command, lab.stops);
    }
}

/// Lab 12's one estimate, its Step 4 matrix: the same in `lockslab list`, the walkthrough's
/// **Time:** line and the README (it said "about 5 minutes" for a run measured at 8½).
#[test]
fn the_matrixs_time_is_the_same_in_list_lab_12_and_the_readme() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let takes = format!("~{}", lockslab::menu::MATRIX_TAKES);
    let list = Command::new(BIN)
        .arg("list")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    let matrix = list
        .lines()
        .find(|l| l.contains("lockslab matrix"))
        .unwrap();
    assert!(matrix.contains(&format!("({takes})")), "{matrix}");
    assert_fits_80(&list);
    let walkthrough = std::fs::read_to_string(root.join("labs/12-chaos.md")).unwrap();
    let time = walkthrough.split("**Time:**").nth(1).unwrap();
    let time = &time[..time.find("**Needs:**").unwrap()].replace('\n', " ");
    assert!(
        time.contains(&format!("Step 4's full matrix {takes}")),
        "{time}"
    );
    let readme = std::fs::read_to_string(root.join("README.md"))
        .unwrap()
        .replace('\n', " ");
    assert!(
        readme.contains(&format!(
            "lab 12's Step 4, twelve schedules a cell: {takes}"
        )),
        "README"
    );
}

#[test]
fn doctor_says_ok_for_working_servers_and_counts_free_connections() {
    let output = lockslab(&["doctor"]).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_fits_80(&text);
    for tool in ["redis-server", "etcd", "postgres", "initdb"] {
        assert!(
            text.lines()
                .any(|l| l.trim_start().starts_with("OK") && l.contains(tool)),
            "{tool}:\n{text}"
        );
    }
    assert!(
        text.contains("private Redis, etcd, Postgres started in"),
        "{text}"
    );
    // Lab 9's clock faults preload libfaketime: doctor looks for it.
    assert!(text.contains("libfaketime"), "{text}");
    // Lab numbers right-aligned: `10 queue` under ` 9 lease-guard`.
    let column = |command: &str| {
        text.lines()
            .find(|l| l.contains("has what it needs") && l.contains(&format!(" {command} ")))
            .and_then(|l| l.find(command))
    };
    assert_eq!(column("lease-guard"), column("queue"), "{text}");
    // The test binary's Postgres is shared here: doctor reads its free connections.
    assert!(text.contains("connections free"), "{text}");
    for lab in ["gc-pause", "naive", "skip-locked", "etcd-vs-redis"] {
        assert!(
            text.lines()
                .any(|l| l.contains(lab) && l.contains("has what it needs")),
            "{lab}:\n{text}"
        );
    }
}

#[test]
fn doctor_exits_4_and_says_what_to_do_when_a_server_does_not_answer() {
    let output = lockslab(&["doctor"])
        .env("LOCKSLAB_REDIS_URL", "redis://127.0.0.1:1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let errors = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{text}\n{errors}");
    assert_fits_80(&text);
    assert!(
        text.lines()
            .any(|l| l.contains("FIX") && l.contains("Redis") && l.contains("127.0.0.1:1")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("FIX") && l.contains("gc-pause")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("OK") && l.contains("skip-locked")),
        "lab 3 needs no Redis: {text}"
    );
    assert!(errors.contains("could not run here"), "{errors}");
}

#[test]
fn completions_and_man_pages_come_from_the_command_tree() {
    for shell in ["bash", "zsh", "fish"] {
        let output = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = String::from_utf8(output.stdout).unwrap();
        for command in ["gc-pause", "etcd-vs-redis", "doctor", "fencing"] {
            assert!(script.contains(command), "{shell} lacks {command}");
        }
        assert!(
            !script.contains("__serve") && !script.contains("'__worker"),
            "{shell} offers an internal command"
        );
    }
    let wrong = Command::new(BIN)
        .args(["completions", "powershell"])
        .output()
        .unwrap();
    assert_eq!(wrong.status.code(), Some(2));

    let page = Command::new(BIN).arg("man").output().unwrap();
    let page = String::from_utf8(page.stdout).unwrap();
    assert!(
        page.contains(".TH lockslab 1") && page.contains("gc\\-pause"),
        "{page}"
    );
    let dir = tempfile::tempdir().unwrap();
    let written = Command::new(BIN)
        .args(["man", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(written.status.success(), "{written:?}");
    for page in ["lockslab.1", "lockslab-gc-pause.1", "lockslab-doctor.1"] {
        assert!(dir.path().join(page).is_file(), "no {page}");
    }
    assert!(!dir.path().join("lockslab-__worker.1").exists());
}

// ── --step, driven through a pseudo-terminal ──

/// The rows each part of a stepped run takes on an 80-column terminal: from just after one
/// Enter to the last line of the next checkpoint, so that the question and the lines it asks
/// about are on the screen together. A line takes as many rows as its display width needs
/// (`⌛` is two columns wide).
fn rows_per_part(text: &str) -> Vec<(String, usize)> {
    let mut parts = vec![("the heading".to_string(), 0)];
    let mut stop = String::new();
    for line in text.lines() {
        let width = textwrap::core::display_width(line);
        parts.last_mut().unwrap().1 += width.div_ceil(80).max(1);
        if let Some(name) = line.trim_start().strip_prefix("⏸ ") {
            stop = name.to_string();
        }
        if line.contains("Enter: go on") {
            parts.push((stop.clone(), 0));
        }
    }
    parts
}

/// `--step` with Enter typed at every stop, stdout and stderr on one file in the order the
/// lab wrote them, at 80 columns: each part fits one 45-row screen — a timed part longer
/// than that shows its first screen live and the rest a screen at a time once it has played
/// — and no line is wider than 80 columns (a stepped run prints every line of the default
/// run and its questions besides: tests/width.rs plays only the labs not stepped here).
/// Every lab but naive (its parts are short), each with its longest parts, each its own
/// test so that they play side by side.
fn each_part_fits_one_45_row_screen(lab: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("screen.txt");
    let file = std::fs::File::create(&path).unwrap();
    let mut args = lab.to_vec();
    args.push("--step");
    let mut child = lockslab(&args)
        .env("COLUMNS", "80")
        .stdin(std::process::Stdio::piped())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut enter = child.stdin.take().unwrap();
        // One Enter a stop, more than any lab has; read as they are needed.
        let _ = enter.write_all(&[b'\n'; 200]);
    }
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(status.success(), "{lab:?}: {status}\n{text}");
    assert!(text.lines().count() > 10, "{lab:?} printed little:\n{text}");
    let wide = too_wide(&text, 80);
    assert!(
        wide.is_empty(),
        "{lab:?}: lines over 80 columns:\n{}",
        wide.join("\n")
    );
    let parts = rows_per_part(&text);
    assert!(parts.len() >= 3, "{lab:?} did not stop:\n{text}");
    for (name, rows) in &parts {
        assert!(
            *rows <= 45,
            "{lab:?}: the part after '{name}' takes {rows} rows at 80 columns:\n{text}"
        );
    }
    // Never a stop under a lone heading: a part's `── … ──` goes with what it heads.
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("⏸ ") {
            let above = lines[..i].iter().rev().find(|l| !l.trim().is_empty());
            assert!(
                !above.is_some_and(|l| l.trim_end().ends_with("──") && !l.contains("───")),
                "{lab:?}: a stop under a lone heading ({above:?}):\n{text}"
            );
        }
    }
    text
}

/// Issue 45: a lab's `--step` takes at most 15 stops, and its last stop asks the lab's
/// own question (its verdict's, asked again when the verdict takes a second screen), never
/// only that a screen is full.
fn ends_on_its_question_within_15_stops(lab: &[&str], text: &str) {
    let stops: Vec<&str> = text
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("⏸ "))
        .collect();
    assert!(
        stops.len() <= 15,
        "{lab:?}: {} stops:\n{stops:#?}",
        stops.len()
    );
    let last = stops.last().copied().unwrap_or_default();
    assert!(
        !last.starts_with("more of"),
        "{lab:?} ends on '{last}', not on its question"
    );
}

#[test]
fn each_part_of_stepped_gc_pause_fits_one_screen() {
    let text = each_part_fits_one_45_row_screen(&LAB1);
    ends_on_its_question_within_15_stops(&LAB1, &text);
}

#[test]
fn each_part_of_stepped_skip_locked_fits_one_screen() {
    let text = each_part_fits_one_45_row_screen(&["skip-locked"]);
    ends_on_its_question_within_15_stops(&["skip-locked"], &text);
}

#[test]
fn each_part_of_stepped_etcd_vs_redis_fits_one_screen() {
    let text = each_part_fits_one_45_row_screen(&["etcd-vs-redis"]);
    ends_on_its_question_within_15_stops(&["etcd-vs-redis"], &text);
}

#[test]
fn each_part_of_stepped_failover_fits_one_screen() {
    let text = each_part_fits_one_45_row_screen(&["failover"]);
    ends_on_its_question_within_15_stops(&["failover"], &text);
}

#[test]
fn each_part_of_stepped_redlock_fits_one_screen() {
    let text = each_part_fits_one_45_row_screen(&["redlock"]);
    ends_on_its_question_within_15_stops(&["redlock"], &text);
}

#[test]
fn each_part_of_stepped_no_lock_fits_one_screen() {
    let text = each_part_fits_one_45_row_screen(&["no-lock"]);
    ends_on_its_question_within_15_stops(&["no-lock"], &text);
}

#[test]
fn each_part_of_stepped_lease_guard_fits_one_screen() {
    let lab = [
        "lease-guard",
        "--fault",
        "stall",
        "--fault",
        "pause-after-check",
    ];
    let text = each_part_fits_one_45_row_screen(&lab);
    ends_on_its_question_within_15_stops(&lab, &text);
}

#[test]
fn each_part_of_stepped_network_fits_one_screen() {
    // Every story: each part on one screen (more than 15 stops: a session of its own).
    each_part_fits_one_45_row_screen(&["network", "--scenario", "all"]);
}

#[test]
fn stepped_network_plays_its_slot_within_15_stops() {
    let text = each_part_fits_one_45_row_screen(&["network"]);
    ends_on_its_question_within_15_stops(&["network"], &text);
    assert!(text.contains("--step plays the delayed write and the cut from Redis"));
}

#[test]
fn each_part_of_stepped_queue_fits_one_screen() {
    let text = each_part_fits_one_45_row_screen(&["queue", "--waiters", "6"]);
    ends_on_its_question_within_15_stops(&["queue", "--waiters", "6"], &text);
}

/// A lab run with `--step --json`: its stdin and stderr on a pseudo-terminal (where the
/// questions appear and Enter is typed), its stdout (JSON Lines) on a pipe.
struct Stepped {
    child: std::process::Child,
    master: std::fs::File,
    screen: std::sync::Arc<std::sync::Mutex<String>>,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
}

/// A test that fails midway still ends its lab: Ctrl-C's way (SIGTERM), then SIGKILL.
impl Drop for Stepped {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline
            {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Stepped {
    fn start(args: &[&str]) -> Stepped {
        use std::io::Read;
        use std::sync::{Arc, Mutex};
        let pty = nix::pty::openpty(None, None).expect("openpty");
        // The master side is this test's alone: a lab that inherited it would keep its own
        // terminal open, and a lab left waiting at a checkpoint would wait forever.
        nix::fcntl::fcntl(
            &pty.master,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .expect("FD_CLOEXEC on the pty's master");
        let mut command = lockslab(args);
        command
            .stdin(std::process::Stdio::from(pty.slave.try_clone().unwrap()))
            .stderr(std::process::Stdio::from(pty.slave))
            .stdout(std::process::Stdio::piped());
        let mut child = command.spawn().expect("starting a stepped lab");
        drop(command); // the parent's copies of the slave side: EOF once the lab exits
        let screen = Arc::new(Mutex::new(String::new()));
        let mut master = std::fs::File::from(pty.master);
        let mut reader = master.try_clone().unwrap();
        let shown = screen.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            // EIO once the last slave descriptor closes: the lab has exited.
            while let Ok(n @ 1..) = reader.read(&mut buffer) {
                shown
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        let stdout = Arc::new(Mutex::new(String::new()));
        let mut pipe = child.stdout.take().unwrap();
        let printed = stdout.clone();
        std::thread::spawn(move || {
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = pipe.read(&mut buffer) {
                printed
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        let _ = &mut master;
        Stepped {
            child,
            master,
            screen,
            stdout,
        }
    }

    fn screen(&self) -> String {
        self.screen.lock().unwrap().clone()
    }

    /// The events on stdout so far (a line still being written is left out), and the
    /// verdict once it closed the output.
    fn output(&self) -> (Vec<Event>, Option<serde_json::Value>) {
        let stdout = self.stdout.lock().unwrap().clone();
        let mut events = Vec::new();
        let mut verdict = None;
        for line in stdout.lines() {
            if serde_json::from_str::<serde_json::Value>(line).is_err() {
                continue;
            }
            assert!(verdict.is_none(), "a line after the verdict: {line}");
            match event_line(line) {
                Some(event) => events.push(event),
                None => verdict = Some(serde_json::from_str(line).unwrap()),
            }
        }
        (events, verdict)
    }

    fn events(&self) -> Vec<Event> {
        self.output().0
    }

    /// Waits until the checkpoint named `name` is on the screen; returns its position.
    fn wait_for_checkpoint(&self, name: &str) -> usize {
        let heading = format!("⏸ {name}");
        let found = eventually(std::time::Duration::from_secs(60), || {
            self.screen().contains(&heading)
        });
        assert!(
            found,
            "no checkpoint '{name}' within 60s; the screen:\n{}",
            self.screen()
        );
        self.screen().find(&heading).unwrap()
    }

    fn type_line(&mut self, text: &str) {
        use std::io::Write;
        self.master
            .write_all(format!("{text}\n").as_bytes())
            .unwrap();
    }

    fn finish(
        mut self,
    ) -> (
        std::process::ExitStatus,
        Vec<Event>,
        Option<serde_json::Value>,
        String,
    ) {
        let status = self.child.wait().unwrap();
        // The readers end at EOF; give them a moment to take the last bytes.
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (events, verdict) = self.output();
        (status, events, verdict, self.screen())
    }
}

/// Walks a stepped run through `checkpoints`, asserting that each stops the lab (nothing
/// new on stdout while it waits), in order, and that Enter moves it on.
fn step_through(stepped: &mut Stepped, checkpoints: &[&str]) {
    let mut last = 0;
    for name in checkpoints {
        let at = stepped.wait_for_checkpoint(name);
        assert!(
            at >= last,
            "checkpoint '{name}' out of order:\n{}",
            stepped.screen()
        );
        last = at;
        let lines =
            |(events, verdict): (Vec<Event>, Option<_>)| events.len() + verdict.iter().len();
        let before = lines(stepped.output());
        std::thread::sleep(std::time::Duration::from_millis(700));
        assert_eq!(
            lines(stepped.output()),
            before,
            "the lab went on at '{name}' before Enter"
        );
        stepped.type_line("");
    }
}

/// What a verdict says, without what differs between any two runs (times, pids, owners).
fn gist(runs: &[serde_json::Value], keys: &[&str]) -> Vec<String> {
    runs.iter()
        .map(|run| {
            let mut facts: Vec<String> = keys.iter().map(|k| format!("{k}={}", run[*k])).collect();
            // Tokens by presence only: etcd's revisions grow across runs.
            for attempt in run["attempts"].as_array().into_iter().flatten() {
                let token = if attempt["token"].is_null() {
                    "-"
                } else {
                    "token"
                };
                facts.push(format!(
                    "{}:{token}:{}",
                    attempt["writer"], attempt["accepted"]
                ));
            }
            facts.join(" ")
        })
        .collect()
}

const LAB1: [&str; 5] = ["gc-pause", "--ttl", "600ms", "--pause", "1200ms"];
const LAB1_FACTS: [&str; 6] = [
    "fencing",
    "two_holders",
    "late_write",
    "stale_write_accepted",
    "final_writer",
    "final_token",
];

#[test]
fn stepping_lab_1_stops_at_each_reveal_and_changes_no_verdict() {
    let (_, unstepped, _) = run_json(&LAB1);
    let mut args = LAB1.to_vec();
    args.extend(["--step", "--json"]);
    let mut stepped = Stepped::start(&args);
    let first = stepped.wait_for_checkpoint("before the freeze (without fencing)");
    assert!(
        !stepped
            .events()
            .iter()
            .any(|e| matches!(e.kind(), Kind::Acquired | Kind::Waiting)),
        "no worker starts before the first checkpoint"
    );
    // The question follows the checkpoint's heading on the screen; the reader thread may
    // have taken the heading's bytes before the question's (CI at 3843fa4).
    let asked = eventually(std::time::Duration::from_secs(10), || {
        stepped.screen()[first..].contains("Does B get the lock while A is frozen?")
    });
    assert!(
        asked,
        "the question after the checkpoint:\n{}",
        stepped.screen()
    );
    step_through(
        &mut stepped,
        &[
            "before the freeze (without fencing)",
            "before the fenced run",
            "before the verdict",
        ],
    );
    let (status, lines, verdict, screen) = stepped.finish();
    assert!(status.success(), "{status}:\n{screen}");
    let verdict = &verdict.expect("a verdict");
    let runs = |v: &serde_json::Value| v["runs"].as_array().unwrap().clone();
    assert_eq!(
        gist(&runs(verdict), &LAB1_FACTS),
        gist(&runs(&unstepped), &LAB1_FACTS),
        "a stepped run's verdict must equal an unstepped one's"
    );
    assert_gone(&worker_pids(&lines));
}

#[test]
fn step_clear_starts_each_part_at_the_top_of_the_screen() {
    let mut args = LAB1.to_vec();
    args.extend(["--step", "--clear", "--json"]);
    let mut stepped = Stepped::start(&args);
    stepped.wait_for_checkpoint("before the freeze (without fencing)");
    let clear = "\x1b[2J\x1b[3J\x1b[H";
    assert!(!stepped.screen().contains(clear), "cleared before Enter");
    stepped.type_line("");
    let cleared = eventually(std::time::Duration::from_secs(30), || {
        stepped.screen().contains(clear)
    });
    assert!(cleared, "Enter did not clear:\n{}", stepped.screen());
    let screen = stepped.screen();
    let after = &screen[screen.find(clear).unwrap()..];
    assert!(
        after.contains("▶ before the freeze (without fencing)"),
        "the cleared screen names the part that comes:\n{after}"
    );
    stepped.wait_for_checkpoint("before the fenced run");
    stepped.type_line("q");
    let (status, lines, _, screen) = stepped.finish();
    assert_eq!(status.code(), Some(130), "{screen}");
    assert_gone(&worker_pids(&lines));
}

const LAB4: [&str; 9] = [
    "etcd-vs-redis",
    "--redis-ttl",
    "3s",
    "--lease",
    "2s",
    // Long enough that the waiters are surely queued before the strike at half the work,
    // however busy the machine (at 600ms a loaded machine sometimes was not).
    "--work",
    "2s",
    "--pause",
    "4s",
];
const LAB4_FACTS: [&str; 6] = [
    "backend",
    "scenario",
    "two_holders",
    "late_write",
    "stale_write_accepted",
    "fencing_token",
];

#[test]
fn stepping_lab_4_stops_at_each_reveal_and_changes_no_verdict() {
    let (_, unstepped, _) = run_json(&LAB4);
    let mut args = LAB4.to_vec();
    args.extend(["--step", "--json"]);
    let mut stepped = Stepped::start(&args);
    step_through(
        &mut stepped,
        &[
            "before the kill",
            "before the freeze",
            "before the overrun",
            "before the matrix",
        ],
    );
    let (status, lines, verdict, screen) = stepped.finish();
    assert!(status.success(), "{status}:\n{screen}");
    let verdict = &verdict.expect("a verdict");
    let cells = |v: &serde_json::Value| v["cells"].as_array().unwrap().clone();
    assert_eq!(
        gist(&cells(verdict), &LAB4_FACTS),
        gist(&cells(&unstepped), &LAB4_FACTS),
        "a stepped run's verdict must equal an unstepped one's"
    );
    assert_gone(&worker_pids(&lines));
}

/// The run id in the first lock name an event mentions (`lockslab:<run id>:…`).
fn run_id_in(lines: &[Event]) -> Option<String> {
    let text: String = lines
        .iter()
        .map(|e| serde_json::to_string(e).unwrap())
        .collect();
    text.match_indices("lockslab:").find_map(|(at, _)| {
        let id = text.get(at + 9..at + 17)?;
        let hex = id.chars().all(|c| c.is_ascii_hexdigit());
        (hex && text[at + 17..].starts_with(':')).then(|| id.to_string())
    })
}

/// Keys under `lockslab:<run id>:` in the test binary's etcd.
fn etcd_keys_of(run_id: &str) -> i64 {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut etcd = etcd_client_of(&servers().etcd).await;
        let options = etcd_client::GetOptions::new()
            .with_prefix()
            .with_count_only();
        etcd.get(format!("lockslab:{run_id}:"), Some(options))
            .await
            .unwrap()
            .count()
    })
}

#[test]
fn q_at_a_checkpoint_ends_lab_4_leaving_nothing_behind() {
    let mut args = LAB4.to_vec();
    args.extend(["--step", "--json"]);
    let mut stepped = Stepped::start(&args);
    step_through(&mut stepped, &["before the kill"]);
    stepped.wait_for_checkpoint("before the freeze");
    let lab = stepped.child.id();
    stepped.type_line("q");
    let (status, lines, verdict, screen) = stepped.finish();
    assert_eq!(status.code(), Some(130), "q ends like Ctrl-C:\n{screen}");
    assert!(
        screen.contains("stopped at 'before the freeze'"),
        "{screen}"
    );
    assert!(verdict.is_none(), "no verdict after q");
    let run_id = run_id_in(&lines).expect("the run's id in a lock name");
    // The kill scenario ran: its eight workers (a holder and a waiter on each of plain
    // Redis, renewed Redis, etcd and Postgres) are gone, and so are its keys and rows.
    let pids = worker_pids(&lines);
    assert_eq!(pids.len(), 8, "{lines:?}");
    assert_gone(&pids);
    assert!(children_of(lab).is_empty());
    assert_run_left_nothing(&run_id);
    assert_eq!(etcd_keys_of(&run_id), 0, "etcd keys left behind");
}

// ── A room's servers, on a second loopback address standing in for a LAN one ──

/// `lockslab up --room` in a state directory of its own; `lockslab down` when dropped,
/// whatever the test's outcome.
struct Room {
    state: tempfile::TempDir,
    /// The attendees' own state directory (no `lockslab up` of theirs), removed with the room.
    attendees: tempfile::TempDir,
    exports: Vec<(String, String)>,
    printed: String,
}

impl Room {
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command
            .args(args)
            .env("LOCKSLAB_STATE_DIR", self.state.path())
            .env("NO_COLOR", "1")
            .env_remove("LOCKSLAB_REDIS_URL")
            .env_remove("LOCKSLAB_ETCD_URL")
            .env_remove("LOCKSLAB_POSTGRES_URL")
            .env_remove("LOCKSLAB_PRIVATE_SERVERS")
            .env_remove("LOCKSLAB_NAME");
        command
    }

    fn up(addr: &str) -> Room {
        Room::up_with(&["up", "--room", addr])
    }

    /// `lockslab up` with these arguments; `exports` are then seat 1's lines.
    fn up_with(args: &[&str]) -> Room {
        let mut room = Room {
            state: tempfile::tempdir().unwrap(),
            attendees: tempfile::tempdir().unwrap(),
            exports: Vec::new(),
            printed: String::new(),
        };
        let output = room.command(args).output().unwrap();
        room.printed = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "{}\n{}",
            room.printed,
            String::from_utf8_lossy(&output.stderr)
        );
        room.exports = room.seat(1).1;
        room
    }

    /// What `lockslab seat N` prints, and its export lines as (variable, value).
    fn seat(&self, n: usize) -> (String, Vec<(String, String)>) {
        let output = self.command(&["seat", &n.to_string()]).output().unwrap();
        let printed = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "seat {n}: {printed}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let exports = printed
            .lines()
            .filter_map(|line| line.strip_prefix("export "))
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        (printed, exports)
    }

    /// The instructor's state file, as JSON.
    fn state_file(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(self.state.path().join("servers.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn url(&self, var: &str) -> &str {
        &self
            .exports
            .iter()
            .find(|(k, _)| k == var)
            .unwrap_or_else(|| panic!("no {var} in:\n{}", self.printed))
            .1
    }

    /// A command as seat 1's attendee runs it: the seat's export lines in its environment.
    fn attendee(&self, args: &[&str]) -> Command {
        self.attendee_with(&self.exports, args)
    }

    /// A command run with these export lines (a seat's) in its environment, and no others.
    fn attendee_with(&self, exports: &[(String, String)], args: &[&str]) -> Command {
        let mut command = Command::new(BIN);
        command.args(args).env("NO_COLOR", "1");
        command.env("LOCKSLAB_STATE_DIR", self.attendees.path());
        for var in [
            "LOCKSLAB_REDIS_URL",
            "LOCKSLAB_ETCD_URL",
            "LOCKSLAB_POSTGRES_URL",
            "LOCKSLAB_PRIVATE_SERVERS",
            "LOCKSLAB_NAME",
            "LOCKSLAB_NAMESPACE",
        ] {
            command.env_remove(var);
        }
        for (var, value) in exports {
            command.env(var, value);
        }
        command
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        let _ = self.command(&["down"]).output();
    }
}

/// `host:port` of a URL, without its user and password.
fn host_port(url: &str) -> String {
    let rest = url.split("://").nth(1).unwrap();
    let rest = rest.rsplit('@').next().unwrap();
    rest.split('/').next().unwrap().to_string()
}

#[test]
fn a_rooms_servers_demand_passwords_and_serve_a_lab_from_the_printed_exports() {
    let room = Room::up("127.0.0.2");
    assert_fits_80(&room.printed);
    assert!(
        room.printed.contains(&format!(
            "max_connections {}",
            lockslab::servers::room_pg_connections(30)
        )),
        "{}",
        room.printed
    );
    let redis_url = room.url("LOCKSLAB_REDIS_URL").to_string();
    let etcd_url = room.url("LOCKSLAB_ETCD_URL").to_string();
    let pg_url = room.url("LOCKSLAB_POSTGRES_URL").to_string();
    for url in [&redis_url, &etcd_url, &pg_url] {
        assert!(host_port(url).starts_with("127.0.0.2:"), "{url}");
        assert!(
            url.contains(':') && url.contains('@'),
            "a password in {url}"
        );
    }

    // Without the password, each server refuses.
    let bare = redis::Client::open(format!("redis://{}", host_port(&redis_url))).unwrap();
    let refused = bare
        .get_connection()
        .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
    assert!(refused.is_err(), "Redis answered without a password");
    let mut with_password = redis::Client::open(redis_url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    assert_eq!(
        redis::cmd("PING")
            .query::<String>(&mut with_password)
            .unwrap(),
        "PONG"
    );

    let (host, port) = host_port(&pg_url)
        .split_once(':')
        .map(|(h, p)| (h.to_string(), p.to_string()))
        .unwrap();
    for password in ["", " password=wrong"] {
        let conninfo = format!("host={host} port={port} user=lockslab dbname=postgres{password}");
        assert!(
            postgres::Client::connect(&conninfo, postgres::NoTls).is_err(),
            "Postgres let in {conninfo}"
        );
    }
    let mut db = postgres::Client::connect(&pg_url, postgres::NoTls).unwrap();
    let max: String = db.query_one("SHOW max_connections", &[]).unwrap().get(0);
    // Every seat running the hungriest lab (no-lock --contention) at once, and some to spare.
    assert_eq!(max, lockslab::servers::room_pg_connections(30).to_string());

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let endpoint = format!("http://{}", host_port(&etcd_url));
    runtime.block_on(async {
        let wrote = match etcd_client::Client::connect([endpoint.as_str()], None).await {
            Ok(mut anonymous) => anonymous.put("lockslab:room-test", "x", None).await.is_ok(),
            Err(_) => false,
        };
        assert!(!wrote, "etcd took a write without a user");
    });
    trust_seat_etcd(&room.exports);
    runtime.block_on(async {
        let mut seat = lockslab::connect::etcd(&etcd_url).await.unwrap();
        seat.put("lockslab:seat01_room-test", "x", None)
            .await
            .unwrap();
        seat.delete("lockslab:seat01_room-test", None)
            .await
            .unwrap();
    });

    // An attendee's shell: the exports, nothing else.
    let output = room.attendee(&QUICK_LAB).arg("--json").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let verdict: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    // Fenced: a late write, if the timing made one, is never accepted.
    assert_ne!(
        verdict["runs"][0]["stale_write_accepted"], true,
        "{verdict}"
    );

    // etcd's lock call too runs as the room's user (it once went out without one, and a
    // room's etcd refused it: "user name is empty").
    let output = room
        .attendee(&[
            "etcd-vs-redis",
            "--kill",
            "--work",
            "1s",
            "--lease",
            "1s",
            "--redis-ttl",
            "2s",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let verdict: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let etcd = verdict["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|cell| cell["backend"] == "etcd")
        .unwrap_or_else(|| panic!("no etcd cell: {verdict}"));
    assert_eq!(etcd["fencing_token"], true, "{etcd}");
    assert!(
        etcd["handover_ms"].as_u64().is_some(),
        "the waiter got it: {etcd}"
    );

    let reset = room
        .attendee(&["reset"])
        .env("LOCKSLAB_NAME", "ana")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&reset.stdout);
    assert!(
        reset.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&reset.stderr)
    );
    assert!(said.contains("'ana/demo'"), "{said}");

    // Names cannot meet: `a` with lock `b-demo` is not `a-b` with lock `demo`; and `a` may
    // not reset `b`'s.
    let reset_as = |name: &str, args: &[&str]| {
        let output = room
            .attendee(&[&["reset"], args].concat())
            .env("LOCKSLAB_NAME", name)
            .output()
            .unwrap();
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr),
        )
    };
    let (_, a) = reset_as("a", &["--lock", "b-demo"]);
    let (_, ab) = reset_as("a-b", &["--lock", "demo"]);
    assert!(
        a.contains("'a/b-demo'") && ab.contains("'a-b/demo'"),
        "{a}\n{ab}"
    );
    let (code, said) = reset_as("a", &["--name", "b"]);
    assert_eq!(code, Some(4), "{said}");
    assert!(
        common::one_line(&said).contains("clears only your own lock"),
        "{said}"
    );

    let state_file = room.state.path().join("servers.json");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&state_file).unwrap().permissions(),
    );
    assert_eq!(
        mode & 0o077,
        0,
        "the state file holds the password: {mode:o}"
    );
    let pids: Vec<i32> = {
        let state = std::fs::read_to_string(&state_file).unwrap();
        let state: serde_json::Value = serde_json::from_str(&state).unwrap();
        state["pids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_i64().unwrap() as i32)
            .collect()
    };
    drop(room);
    for pid in pids {
        assert!(
            eventually(std::time::Duration::from_secs(10), || proc_state(pid)
                .is_none_or(|s| s == 'Z')),
            "server {pid} still running after down"
        );
    }
}

/// Labs 5–7 stop at their first checkpoint too, and `q` there ends them like Ctrl-C.
#[test]
fn q_at_the_first_checkpoint_ends_labs_5_to_7() {
    for (lab, first) in [
        (&["failover"][..], "before the Redis failover"),
        (&["redlock", "minority"][..], "before the minority"),
        (
            &["no-lock", "optimistic"][..],
            "before the next approach: optimistic",
        ),
    ] {
        let mut args = lab.to_vec();
        args.push("--step");
        let mut child = lockslab(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"q\n").unwrap();
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(130), "{lab:?}: {stderr}");
        assert!(stderr.contains(&format!("⏸ {first}")), "{lab:?}: {stderr}");
        assert!(stderr.contains("stopped at"), "{lab:?}: {stderr}");
    }
}

/// `--seed` plays the same random choices again: the same seed gives the same owner values
/// (each worker has its own stream), another seed other ones; the verdict carries the seed
/// (and a lab's first line shows it). Timing is not replayed, and need not be: a worker
/// draws one value per acquisition, before its first try, however many tries it takes.
#[test]
fn a_seed_replays_the_random_choices() {
    let owners = |seed: &str| {
        let mut args = QUICK_LAB.to_vec();
        args.extend(["--seed", seed]);
        let (events, verdict, output) = run_json(&args);
        assert!(output.status.success());
        assert_eq!(verdict["seed"].to_string(), seed, "{verdict}");
        // A's grants and B's: A asks first and wins on its first try; B retries every
        // 20ms until A's lease runs out, as many times as the timing makes it, with the
        // one value it drew for this acquisition.
        let owners: Vec<String> = events
            .iter()
            .filter(|e| e.is("A", Kind::Acquired) || e.is("B", Kind::Acquired))
            .map(|e| format!("{}={:?}", e.worker, e.owner()))
            .collect();
        assert!(
            owners.iter().any(|o| o.starts_with("B=")),
            "no grant of B's in {events:?}"
        );
        owners
    };
    let human = run_human(&[&QUICK_LAB[..], &["--seed", "7"]].concat());
    assert!(
        human
            .lines()
            .next()
            .unwrap_or_default()
            .contains("--seed 7"),
        "{human}"
    );
    let first = owners("42");
    assert_eq!(first, owners("42"), "the same seed, the same owner values");
    assert_ne!(first, owners("43"), "another seed, other values");
}

/// A room at work: eight attendees run different labs at the same moment against the room's
/// servers, from the printed exports, and every verdict is the right one.
#[test]
fn eight_attendees_run_different_labs_at_once_on_a_rooms_servers() {
    // Eight seats for eight attendees: a full room's 30 would start 22 more Redis and etcd
    // servers that nobody uses (the full room is a_rooms_servers_demand_passwords…).
    let room = Room::up_with(&["up", "--room", "127.0.0.3", "--seats", "8"]);
    let runs: Vec<(&str, Vec<&str>)> = vec![
        ("ana", QUICK_LAB.to_vec()),
        ("bo", QUICK_LAB.to_vec()),
        (
            "cy",
            vec!["naive", "race", "--trials", "20", "--workers", "4"],
        ),
        (
            "di",
            vec!["skip-locked", "--fault", "kill", "--jobs", "100"],
        ),
        (
            "ed",
            vec![
                "etcd-vs-redis",
                "--kill",
                "--work",
                "2s",
                "--lease",
                "1s",
                "--redis-ttl",
                "3s",
            ],
        ),
        // A generous per-master timeout: eight labs share two cores here, and a master
        // slower than the default 50ms would count as down.
        (
            "flo",
            vec![
                "redlock",
                "minority",
                "--instance-timeout",
                "200ms",
                "--ttl",
                "3s",
            ],
        ),
        ("gus", vec!["no-lock", "optimistic"]),
        ("hal", vec!["no-lock", "idempotency-key"]),
    ];
    let children: Vec<_> = runs
        .iter()
        .enumerate()
        .map(|(seat, (name, args))| {
            let mut args = args.clone();
            args.push("--json");
            let child = room
                .attendee_with(&room.seat(seat + 1).1, &args)
                .env("LOCKSLAB_NAME", name)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            (args[0].to_string(), child)
        })
        .collect();
    for (lab, child) in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{lab}: {stderr}");
        let verdict: serde_json::Value =
            serde_json::from_str(stdout.lines().last().unwrap_or_default())
                .unwrap_or_else(|_| panic!("{lab}: no verdict in\n{stdout}"));
        assert_eq!(verdict["kind"], "verdict", "{lab}");
        let first = |list: &str| verdict[list][0].clone();
        match lab.as_str() {
            // Fenced: a late write, if the timing made one, is never accepted.
            "gc-pause" => assert_ne!(first("runs")["stale_write_accepted"], true, "{verdict}"),
            "naive" => assert_eq!(first("scenarios")["fixed"]["violations"], 0, "{verdict}"),
            "skip-locked" => assert_eq!(first("modes")["duplicates"], 0, "{verdict}"),
            "etcd-vs-redis" => {
                let etcd = verdict["cells"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|cell| cell["backend"] == "etcd")
                    .cloned()
                    .unwrap_or_default();
                assert_eq!(etcd["fencing_token"], true, "{verdict}");
            }
            "redlock" => assert_eq!(first("scenarios")["granted"], true, "{verdict}"),
            "no-lock" => {
                assert_eq!(first("approaches")["duplicates"], 0, "{verdict}");
                assert_eq!(
                    first("approaches")["correct_under_freeze"],
                    true,
                    "{verdict}"
                );
            }
            other => panic!("no check for {other}"),
        }
        assert!(
            !stderr.contains("not in the room's results"),
            "{lab}: {stderr}"
        );
    }
    // The instructor sees every seat's run, lab by lab, read back from the room's Postgres.
    let output = room.command(&["results"]).output().unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{shown}");
    assert!(
        shown.starts_with("The room's results: each seat's latest run of each scenario"),
        "{shown}"
    );
    // Every lab says its outcome, lab 3's and lab 4's included.
    assert!(!shown.contains("ran to its verdict"), "{shown}");
    assert!(shown.contains("skip-locked: each job once 1/1"), "{shown}");
    // `lockslab room results`, as the issue names it, is the same view.
    let by_room = room.command(&["room", "results"]).output().unwrap();
    assert!(by_room.status.success());
    assert_eq!(String::from_utf8_lossy(&by_room.stdout), shown);
    // Each lab's seats counted under its number (two seats ran no-lock).
    let seats: usize = shown
        .lines()
        .filter_map(|line| line.split(" — ").nth(1))
        .filter_map(|count| count.split(' ').next()?.parse::<usize>().ok())
        .sum();
    assert_eq!(seats, 8, "{shown}");
    assert!(shown.contains("7 no-lock — 2 seats"), "{shown}");
    assert!(
        shown.contains("minority-down: granted"),
        "lab 6's headline: {shown}"
    );
    assert!(
        shown.contains("optimistic: safe"),
        "lab 7's headline: {shown}"
    );
    // A seat may record its runs but read nobody's.
    let seat_url = room
        .seat(1)
        .1
        .into_iter()
        .find(|(var, _)| var == "LOCKSLAB_POSTGRES_URL")
        .unwrap()
        .1;
    // Where a seat records its runs: the labs' database (its own database has no results).
    let results_url = format!("{}/lockslab", seat_url.rsplit_once('/').unwrap().0);
    let mut seat = postgres::Client::connect(&results_url, postgres::NoTls).unwrap();
    let read = seat.query("SELECT * FROM public.lockslab_room_results", &[]);
    let refused = format!("{:?}", read.as_ref().unwrap_err());
    assert!(refused.contains("permission denied"), "{refused}");
    let forged = seat.execute(
        "INSERT INTO public.lockslab_room_results (seat, lab, run_id, headline, verdict) \
         VALUES ('seat02', 'x', 'x', 'x', '{}')",
        &[],
    );
    let refused = format!("{:?}", forged.unwrap_err());
    assert!(refused.contains("permission denied"), "{refused}");
    // A headline a seat wrote reaches the instructor's screen without its escapes (hostile
    // finding: it cleared the screen and painted a green PASS).
    seat.execute(
        "INSERT INTO public.lockslab_room_results (lab, run_id, headline, verdict) \
         VALUES (E'gc-pause\\x1b[2J', 'x', E'\\x1b[1;32mPASS everything', '{}')",
        &[],
    )
    .unwrap();
    let output = room.command(&["results"]).output().unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{shown}");
    assert!(shown.contains("PASS everything"), "{shown}");
    assert!(!shown.contains('\u{1b}'), "{shown:?}");
}

/// Issue 45: a room's results are each lab's outcome counted across its seats — one line
/// per scenario (`fenced: stale write refused 2/3`), the labs in their order, the seats that
/// saw something else named — and the projector's page says the same, every word a seat
/// wrote escaped. `up --seats 3` names a seat the room has.
#[test]
fn room_results_count_each_scenario_across_seats_in_the_labs_order() {
    let room = Room::up_with(&["up", "--room", "127.0.0.17", "--seats", "3"]);
    assert!(room.printed.contains("lockslab seat 1"), "{}", room.printed);
    assert!(!room.printed.contains("seat 7"), "{}", room.printed);
    let up_help = room.command(&["up", "--help"]).output().unwrap();
    let up_help = String::from_utf8_lossy(&up_help.stdout);
    assert!(!up_help.contains("seat 7"), "{up_help}");
    // A seat records a finished run the way `room::record` does: one INSERT as its role.
    let record = |seat: usize, lab: &str, headline: &str| {
        let url = room
            .seat(seat)
            .1
            .into_iter()
            .find(|(var, _)| var == "LOCKSLAB_POSTGRES_URL")
            .unwrap()
            .1;
        let results_url = format!("{}/lockslab", url.rsplit_once('/').unwrap().0);
        let mut client = postgres::Client::connect(&results_url, postgres::NoTls).unwrap();
        client
            .execute(
                "INSERT INTO public.lockslab_room_results (lab, run_id, headline, verdict) \
                 VALUES ($1, 'x', $2, '{}')",
                &[&lab, &headline],
            )
            .unwrap();
    };
    let agreed = "unfenced: stale write ACCEPTED · fenced: stale write refused";
    record(1, "redlock", "restart: two holders");
    record(1, "gc-pause", agreed);
    record(2, "gc-pause", agreed);
    record(
        3,
        "gc-pause",
        "unfenced: stale write ACCEPTED · fenced: stale write unknown",
    );
    record(
        3,
        "<script>alert(1)</script>",
        "x: <img src=x onerror=alert(1)>",
    );
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("room.html");
    let output = room
        .command(&["results", "--html", page.to_str().unwrap()])
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{shown}");
    let at = |text: &str| {
        shown
            .lines()
            .position(|line| line == text)
            .unwrap_or_else(|| panic!("no line {text:?} in:\n{shown}"))
    };
    let gc_pause = at("1 gc-pause — 3 seats");
    assert!(
        at("6 redlock — 1 seat") > gc_pause,
        "labs in their order:\n{shown}"
    );
    assert_eq!(at("  unfenced: stale write ACCEPTED 3/3"), gc_pause + 1);
    assert_eq!(
        at("  fenced: stale write refused 2/3 · stale write unknown 1/3 (seat03)"),
        gc_pause + 2
    );
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("stale write refused <b>2/3</b>"), "{html}");
    assert!(html.contains("seat03"), "{html}");
    assert!(
        !html.contains("<script>alert") && !html.contains("<img"),
        "{html}"
    );
    assert!(html.contains("&lt;script&gt;"), "{html}");

    // `--follow`, the projector's page during the session: it says it keeps going and how
    // to stop, and rewrites the page when a seat's run arrives.
    let follow = room
        .command(&["results", "--html", page.to_str().unwrap(), "--follow"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(std::time::Duration::from_secs(20), || {
        std::fs::read_to_string(&page).is_ok_and(|html| html.contains("http-equiv=\"refresh\""))
    }));
    record(2, "redlock", "restart: two holders");
    assert!(
        eventually(std::time::Duration::from_secs(20), || {
            std::fs::read_to_string(&page).is_ok_and(|html| html.contains("6 redlock — 2 seats"))
        }),
        "the page was not rewritten when seat02's run arrived"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(follow.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let followed = follow.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&followed.stderr);
    assert_fits_80(&said);
    let said = said.replace('\n', " ");
    assert!(
        said.contains("as results arrive") && said.contains("Ctrl-C"),
        "--follow says what it does and how to stop: {said}"
    );
}

/// Issue 20: a room's shared password was the Postgres superuser's; `status` and a plain
/// `up` printed it in clear; `up --room 0.0.0.0` waited 21s, then blamed the machine; a
/// second `up --room` elsewhere silently replaced a running room.
#[test]
fn a_room_keeps_its_secrets_and_is_not_replaced_by_another() {
    // Two seats: what is asked here does not depend on the room's size.
    let room = Room::up_with(&["up", "--room", "127.0.0.4", "--seats", "2"]);
    // The instructor's Redis URL, from the state file: seats get users of their own.
    let redis_url = room.state_file()["redis"].as_str().unwrap().to_string();
    let password = redis_url
        .strip_prefix("redis://default:")
        .and_then(|rest| rest.split_once('@'))
        .map(|(password, _)| password.to_string())
        .unwrap_or_else(|| panic!("not the redis://default:PW@ form: {redis_url}"));
    // No seat uses the instructor's Redis and etcd: they stay off the room's address (etcd
    // 3.4 compacts and renews leases for anyone who reaches it). Postgres is the room's.
    let state = room.state_file();
    for (backend, host) in [
        ("redis", "127.0.0.1:"),
        ("etcd", "127.0.0.1:"),
        ("postgres", "127.0.0.4:"),
    ] {
        let url = state[backend].as_str().unwrap();
        assert!(host_port(url).starts_with(host), "{backend}: {url}");
    }

    // What attendees get is no superuser, and cannot run programs.
    let mut db =
        postgres::Client::connect(room.url("LOCKSLAB_POSTGRES_URL"), postgres::NoTls).unwrap();
    let superuser: bool = db
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(!superuser, "the room's Postgres role is a superuser");
    db.batch_execute("CREATE TEMP TABLE attack (line text)")
        .unwrap();
    let err = db
        .batch_execute("COPY attack FROM PROGRAM 'id'")
        .expect_err("COPY FROM PROGRAM ran as the room's role");
    assert_eq!(
        err.code(),
        Some(&postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{err}"
    );
    // The superuser's password is the instructor's: in the 0600 state file, printed nowhere.
    let state = room.state_file();
    let admin = state["postgres_admin"].as_str().unwrap().to_string();
    let admin_password = admin
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.rsplit_once(':'))
        .unwrap()
        .1
        .to_string();
    assert!(!room.printed.contains(&admin_password), "{}", room.printed);
    assert!(
        !room
            .exports
            .iter()
            .any(|(_, v)| v.contains(&admin_password))
    );

    for args in [&["status"][..], &["up"]] {
        let output = room.command(args).output().unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "{args:?}: {all}");
        assert!(all.contains("127.0.0.4"), "{args:?}: {all}");
        assert!(
            !all.contains(&password),
            "{args:?} shows the password: {all}"
        );
        assert!(!all.contains(&admin_password), "{args:?}: {all}");
    }

    // Every address of the machine, or another room: refused, and the room stays.
    for addr in ["0.0.0.0", "::", "127.0.0.5"] {
        let output = room.command(&["up", "--room", addr]).output().unwrap();
        let said = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(4), "up --room {addr}: {said}");
        let expected = if addr == "127.0.0.5" {
            "a room is already running on 127.0.0.4"
        } else {
            "means every address of this machine"
        };
        assert!(said.contains(expected), "up --room {addr}: {said}");
    }
    // The same room with another number of seats: refused, not silently kept as it was.
    let output = room
        .command(&["up", "--room", "127.0.0.4", "--seats", "3"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(4), "{said}");
    assert!(
        said.contains("is already running on 127.0.0.4, not"),
        "{said}"
    );
    let again = room
        .command(&["up", "--room", "127.0.0.4", "--seats", "2"])
        .output()
        .unwrap();
    assert!(again.status.success());
    assert_eq!(
        room.state_file()["redis"].as_str(),
        Some(redis_url.as_str()),
        "the room's servers were replaced"
    );
}

/// Lab 8 whole, from a seat's lines: its lost reply to etcd's lock warmed A's connection up
/// with a read of `lockslab:network:warm-up`, outside the run's keys, and the seat's etcd
/// user (which reaches `lockslab:<seat>_…` only) answered "permission denied".
#[test]
fn lab_8_runs_whole_on_a_seats_lines() {
    let room = Room::up_with(&["up", "--room", "127.0.0.7", "--seats", "2"]);
    let output = room
        .attendee(&["network", "--ttl", "500ms", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let verdict: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default())
            .unwrap_or_else(|_| panic!("no verdict in\n{stdout}"));
    assert_eq!(verdict["kind"], "verdict", "{verdict}");
    // Every story ran: the fenced and unfenced runs, then the lost replies, etcd's last.
    assert!(!verdict["runs"].as_array().unwrap().is_empty(), "{verdict}");
    let lost_lock = verdict["lost_lock"].as_array().unwrap();
    assert_eq!(lost_lock.len(), 3, "{verdict}");
    assert!(lost_lock.iter().all(|p| p["applied"] == true), "{verdict}");
    assert_eq!(verdict["lost_lock_queued"]["auth"], true, "{verdict}");
}

/// Issue 20: attendees shared one Redis user, one etcd user and one Postgres role, so any
/// of them could read, change or delete anyone's keys and rows. Now each seat has users of
/// its own that reach its namespace only, and the instructor's credentials are in no
/// seat's lines.
#[test]
fn a_seat_reaches_only_its_own_namespace() {
    let room = Room::up_with(&["up", "--room", "127.0.0.6", "--seats", "2"]);
    let sized = lockslab::servers::room_pg_connections(2);
    assert!(
        room.printed.contains(&format!("max_connections {sized}")),
        "{}",
        room.printed
    );
    let (a_printed, a) = room.seat(1);
    let (b_printed, b) = room.seat(2);
    let url = |seat: &[(String, String)], var: &str| {
        seat.iter().find(|(k, _)| k == var).unwrap().1.clone()
    };
    assert_eq!(url(&a, "LOCKSLAB_NAMESPACE"), "seat01");
    assert_eq!(url(&b, "LOCKSLAB_NAMESPACE"), "seat02");

    // The instructor's passwords appear in no seat's lines, nor in the file of all seats.
    let state = room.state_file();
    let password_of = |url: &str| {
        url.rsplit_once('@')
            .and_then(|(userinfo, _)| userinfo.rsplit_once(':'))
            .unwrap()
            .1
            .to_string()
    };
    let admin: Vec<String> = ["redis", "etcd", "postgres", "postgres_admin"]
        .iter()
        .map(|key| password_of(state[key].as_str().unwrap()))
        .collect();
    let file = room.state.path().join("room-seats.txt");
    let all_seats = std::fs::read_to_string(&file).unwrap();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    for text in [&a_printed, &b_printed, &all_seats, &room.printed] {
        for password in &admin {
            assert!(
                !text.contains(password.as_str()),
                "an admin password in:\n{text}"
            );
        }
    }
    assert!(
        all_seats.contains(&url(&a, "LOCKSLAB_REDIS_URL")),
        "{all_seats}"
    );

    // Redis: each seat has a server of its own; seat01's key is not on seat02's, whatever
    // seat02 does there, and everything dangerous is refused.
    let redis_of = |seat: &[(String, String)]| {
        redis::Client::open(url(seat, "LOCKSLAB_REDIS_URL").as_str())
            .unwrap()
            .get_connection()
            .unwrap()
    };
    assert_ne!(
        host_port(&url(&a, "LOCKSLAB_REDIS_URL")),
        host_port(&url(&b, "LOCKSLAB_REDIS_URL")),
        "a Redis per seat"
    );
    let (mut ra, mut rb) = (redis_of(&a), redis_of(&b));
    let key = "lockslab:seat01_test:k";
    redis::cmd("SET")
        .arg(key)
        .arg("a's")
        .query::<()>(&mut ra)
        .unwrap();
    let seen: Option<String> = redis::cmd("GET").arg(key).query(&mut rb).unwrap();
    assert_eq!(seen, None, "seat02 read seat01's key");
    for elsewhere in [
        redis::cmd("SET").arg(key).arg("b's").clone(),
        redis::cmd("DEL").arg(key).clone(),
        redis::cmd("EVAL")
            .arg("return redis.call('DEL', KEYS[1])")
            .arg(1)
            .arg(key)
            .clone(),
    ] {
        // On seat02's own Redis: it changes nothing of seat01's.
        let _ = elsewhere.query::<redis::Value>(&mut rb);
    }
    for refused in [
        redis::cmd("FLUSHALL").clone(),
        redis::cmd("CONFIG").arg("GET").arg("requirepass").clone(),
        redis::cmd("ACL").arg("LIST").clone(),
        redis::cmd("KEYS").arg("*").clone(),
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg("0")
            .clone(),
        redis::cmd("SAVE").clone(),
        redis::cmd("REPLICAOF").arg("127.0.0.1").arg("1").clone(),
        redis::cmd("SHUTDOWN").clone(),
        redis::cmd("MONITOR").clone(),
        redis::cmd("AUTH")
            .arg("default")
            .arg(password_of(&url(&b, "LOCKSLAB_REDIS_URL")))
            .clone(),
    ] {
        let result = refused.query::<redis::Value>(&mut rb);
        assert!(
            result.is_err(),
            "seat02 ran {:?}: {result:?}",
            refused.args_iter().count()
        );
    }
    let still: String = redis::cmd("GET").arg(key).query(&mut ra).unwrap();
    assert_eq!(still, "a's");
    // Its own keys, seat02 may use.
    redis::cmd("SET")
        .arg("lockslab:seat02_test:k")
        .arg("b's")
        .query::<()>(&mut rb)
        .unwrap();

    // Postgres: seat01's tables land in its own schema, which seat02 cannot enter.
    let pg_of = |seat: &[(String, String)]| {
        postgres::Client::connect(&url(seat, "LOCKSLAB_POSTGRES_URL"), postgres::NoTls).unwrap()
    };
    let (mut pa, mut pb) = (pg_of(&a), pg_of(&b));
    pa.batch_execute("CREATE TABLE secrets (v text); INSERT INTO secrets VALUES ('a''s')")
        .unwrap();
    let schema: String = pa.query_one("SELECT current_schema()", &[]).unwrap().get(0);
    assert_eq!(schema, "seat01");
    for attack in [
        "SELECT * FROM seat01.secrets",
        "INSERT INTO seat01.secrets VALUES ('b''s')",
        "DELETE FROM seat01.secrets",
        "DROP TABLE seat01.secrets",
        "CREATE TABLE seat01.planted (v text)",
        "DROP SCHEMA seat01 CASCADE",
        "SET search_path = seat01; SELECT * FROM secrets",
    ] {
        let err = pb
            .batch_execute(attack)
            .expect_err(&format!("seat02 ran {attack}"));
        // Refused, or (in a database of its own, where seat01 has nothing) not even seen.
        use postgres::error::SqlState;
        assert!(
            [
                SqlState::INSUFFICIENT_PRIVILEGE,
                SqlState::UNDEFINED_TABLE,
                SqlState::INVALID_SCHEMA_NAME
            ]
            .iter()
            .any(|code| err.code() == Some(code)),
            "{attack}: {err:?}"
        );
    }
    // seat01's database is closed to seat02, and the labs' one takes nothing of it.
    let into_a = url(&b, "LOCKSLAB_POSTGRES_URL").replace("/seat02", "/seat01");
    assert!(
        postgres::Client::connect(&into_a, postgres::NoTls).is_err(),
        "seat02 entered seat01's database"
    );
    let mut labs = postgres::Client::connect(
        &on_database(&url(&b, "LOCKSLAB_POSTGRES_URL"), "lockslab"),
        postgres::NoTls,
    )
    .unwrap();
    for attack in [
        "CREATE TABLE public.planted (v text)",
        "CREATE SCHEMA seat02",
        "CREATE TABLE lockslab.planted (v text)",
    ] {
        assert!(
            labs.batch_execute(attack).is_err(),
            "seat02 ran {attack} in the labs' database"
        );
    }
    let rows = pa.query("SELECT v FROM secrets", &[]).unwrap();
    assert_eq!(rows.len(), 1);

    // etcd: seat01's keys are out of seat02's reach, and so is the rest of the keyspace.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let etcd_of = |seat: &[(String, String)]| trust_seat_etcd(seat);
        let mut ea = lockslab::connect::etcd(&etcd_of(&a)).await.unwrap();
        let mut eb = lockslab::connect::etcd(&etcd_of(&b)).await.unwrap();
        ea.put(key, "a's", None).await.unwrap();
        assert!(eb.get(key, None).await.is_err(), "seat02 read seat01's key");
        assert!(eb.put(key, "b's", None).await.is_err(), "seat02 wrote it");
        assert!(eb.delete(key, None).await.is_err(), "seat02 deleted it");
        let everything = etcd_client::GetOptions::new().with_prefix();
        assert!(
            eb.get("", Some(everything)).await.is_err(),
            "seat02 listed all keys"
        );
        assert!(eb.put("lockslab:x", "b's", None).await.is_err());
        eb.put("lockslab:seat02_test:k", "b's", None).await.unwrap();
        let got = ea.get(key, None).await.unwrap();
        assert_eq!(got.kvs()[0].value(), b"a's");
    });

    // A lab run as seat02, from its lines alone: its run id is in its namespace.
    let output = room
        .attendee_with(&b, &QUICK_LAB)
        .arg("--json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("lockslab:seat02_"), "{stdout}");

    // A namespace that could be a pattern is refused before anything runs.
    let output = room
        .attendee_with(&b, &QUICK_LAB)
        .env("LOCKSLAB_NAMESPACE", "seat0*")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("LOCKSLAB_NAMESPACE"));
}

/// `url` with its database replaced by `database`.
fn on_database(url: &str, database: &str) -> String {
    let (server, _) = url.rsplit_once('/').unwrap();
    format!("{server}/{database}")
}

impl Room {
    /// seat `n`'s Postgres URL, from its export lines.
    fn seat_postgres(&self, n: usize) -> String {
        self.seat(n)
            .1
            .into_iter()
            .find(|(var, _)| var == "LOCKSLAB_POSTGRES_URL")
            .unwrap()
            .1
    }

    /// The room's superuser on the labs' database, from the instructor's state file.
    fn admin_postgres(&self) -> String {
        let admin = self.state_file()["postgres_admin"]
            .as_str()
            .unwrap()
            .to_string();
        on_database(&admin, "lockslab")
    }

    /// Runs `sql` as seat `n` on its own database and on the labs' one (where a seat's
    /// tables once lived), one statement at a time, as a hostile attendee would: whatever
    /// is refused is skipped. Returns what went through.
    fn seat_tries(&self, n: usize, sql: &[String]) -> Vec<String> {
        let own = self.seat_postgres(n);
        let mut through = Vec::new();
        for url in [own.clone(), on_database(&own, "lockslab")] {
            let Ok(mut db) = postgres::Client::connect(&url, postgres::NoTls) else {
                continue;
            };
            for statement in sql {
                if db.batch_execute(statement).is_ok() {
                    through.push(format!("{url}: {statement}"));
                }
            }
        }
        through
    }

    /// Counts the rows of `table` wherever seat `n` can read it (its database, the labs').
    fn seat_counts(&self, n: usize, table: &str) -> i64 {
        let own = self.seat_postgres(n);
        [own.clone(), on_database(&own, "lockslab")]
            .iter()
            .filter_map(|url| postgres::Client::connect(url, postgres::NoTls).ok())
            .filter_map(|mut db| {
                db.query_one(&format!("SELECT count(*) FROM {table}"), &[])
                    .ok()
            })
            .map(|row| row.get::<_, i64>(0))
            .sum()
    }
}

/// A trigger function in `schema` that notes who fired it in `schema.fired`, then does
/// `also` (as whoever fired it).
fn planted_trigger(schema: &str, also: &str) -> Vec<String> {
    vec![
        format!("CREATE TABLE {schema}.fired (who text)"),
        format!("GRANT USAGE, CREATE ON SCHEMA {schema} TO PUBLIC"),
        format!("GRANT ALL ON ALL TABLES IN SCHEMA {schema} TO PUBLIC"),
        format!("GRANT ALL ON ALL SEQUENCES IN SCHEMA {schema} TO PUBLIC"),
        format!(
            "CREATE FUNCTION {schema}.planted() RETURNS trigger LANGUAGE plpgsql AS $$ \
             BEGIN INSERT INTO {schema}.fired VALUES (current_user); {also} RETURN NEW; END $$"
        ),
    ]
}

/// Issue 40, row 1: a seat made itself superuser. It created a schema named after the
/// admin role, with a table named like the registry's and a trigger on it; the admin's
/// default search_path ("$user", public) found it, and the instructor's next challenge run
/// fired the trigger as superuser. Now a seat creates nothing outside its own database,
/// the admin's search_path is fixed on the role, and the registry names its schema.
#[test]
fn a_seat_cannot_plant_a_trigger_that_the_admin_fires() {
    let room = Room::up_with(&["up", "--room", "127.0.0.11", "--seats", "2"]);
    let mut attack = vec!["CREATE SCHEMA lockslab_admin".to_string()];
    attack.push(
        "CREATE TABLE lockslab_admin.lockslab_live_run (run_id text PRIMARY KEY, \
         started timestamptz NOT NULL DEFAULT now())"
            .to_string(),
    );
    attack.extend(planted_trigger(
        "lockslab_admin",
        "ALTER ROLE seat01 SUPERUSER;",
    ));
    attack.push(
        "CREATE TRIGGER planted BEFORE INSERT OR DELETE ON lockslab_admin.lockslab_live_run \
         FOR EACH ROW EXECUTE FUNCTION lockslab_admin.planted()"
            .to_string(),
    );
    let through = room.seat_tries(1, &attack);
    // The instructor grades a client on the room's Postgres: lockslab's admin at work.
    let output = room
        .command(&[
            "challenge",
            "counter",
            "--patience",
            "2s",
            "--",
            "sh",
            "-c",
            "read l; exit 1",
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("client"), "the challenge ran: {said}");
    let mut seat = postgres::Client::connect(&room.seat_postgres(1), postgres::NoTls).unwrap();
    let superuser: bool = seat
        .query_one(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(!superuser, "seat01 became superuser; it ran: {through:#?}");
    assert_eq!(
        room.seat_counts(1, "lockslab_admin.fired"),
        0,
        "the planted trigger fired; the seat ran: {through:#?}"
    );
    // The admin's registry is its own, in a schema of its own (or the run above could not
    // have registered, and a dead run of it would never be swept).
    let mut admin = postgres::Client::connect(&room.admin_postgres(), postgres::NoTls).unwrap();
    let owner: Option<String> = admin
        .query_one(
            "SELECT (SELECT relowner::regrole::text FROM pg_class \
             WHERE oid = to_regclass('lockslab_admin.lockslab_live_run'))",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(owner.as_deref(), Some("lockslab_admin"));
    // Nothing a seat may run in the labs' database creates anything there.
    let mut labs = postgres::Client::connect(
        &on_database(&room.seat_postgres(1), "lockslab"),
        postgres::NoTls,
    )
    .unwrap();
    for attempt in [
        "CREATE SCHEMA lockslab_admin",
        "CREATE SCHEMA lockslab",
        "CREATE SCHEMA public2",
        "CREATE TABLE public.lockslab_live_run (run_id text)",
        "CREATE FUNCTION public.now() RETURNS timestamptz LANGUAGE sql AS 'SELECT NULL'",
    ] {
        assert!(
            labs.batch_execute(attempt).is_err(),
            "seat01 ran {attempt} in the labs' database"
        );
    }
}

/// Issue 40, row 2: the same trick on the labs' role. A seat made a schema `lockslab`
/// (the labs' role's "$user") with copies of the store's tables and a trigger that flipped
/// verdicts; the instructor's runs wrote through it. Now the labs' role's search_path is
/// fixed on the role to a schema it owns, and the store names its schema.
#[test]
fn a_seat_cannot_steer_the_instructors_store() {
    let room = Room::up_with(&["up", "--room", "127.0.0.12", "--seats", "2"]);
    let mut attack = vec![
        "CREATE SCHEMA lockslab".to_string(),
        "CREATE TABLE lockslab.lockslab_resource (run_id text NOT NULL, resource text NOT NULL, \
         value text NOT NULL, writer text NOT NULL, token bigint, \
         decisions bigint NOT NULL DEFAULT 0, PRIMARY KEY (run_id, resource))"
            .to_string(),
        "CREATE TABLE lockslab.lockslab_attempt (id bigserial PRIMARY KEY, run_id text NOT NULL, \
         resource text NOT NULL, writer text NOT NULL, value text NOT NULL, token bigint, \
         fenced boolean NOT NULL, accepted boolean NOT NULL, decided bigint, \
         at timestamptz NOT NULL DEFAULT clock_timestamp())"
            .to_string(),
        "CREATE TABLE lockslab.lockslab_claim (run_id text NOT NULL, resource text NOT NULL, \
         claim text, claimer text, decisions bigint NOT NULL DEFAULT 0, \
         PRIMARY KEY (run_id, resource))"
            .to_string(),
        "CREATE TABLE lockslab.lockslab_live_run (run_id text PRIMARY KEY, \
         started timestamptz NOT NULL DEFAULT now())"
            .to_string(),
    ];
    attack.extend(planted_trigger("lockslab", "NEW.accepted := true;"));
    attack.push(
        "CREATE TRIGGER planted BEFORE INSERT ON lockslab.lockslab_attempt \
         FOR EACH ROW EXECUTE FUNCTION lockslab.planted()"
            .to_string(),
    );
    let through = room.seat_tries(1, &attack);
    // The instructor runs a fenced lab on the room's servers, as the labs' role.
    let output = room.command(&QUICK_LAB).arg("--json").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        room.seat_counts(1, "lockslab.fired"),
        0,
        "the planted trigger fired; the seat ran: {through:#?}"
    );
    let verdict: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_ne!(
        verdict["runs"][0]["stale_write_accepted"], true,
        "{verdict}"
    );
    // Every role lockslab uses has its search_path on the role, and none starts with a
    // schema a seat could make.
    let mut admin = postgres::Client::connect(&room.admin_postgres(), postgres::NoTls).unwrap();
    for (role, path) in [
        ("lockslab_admin", "search_path=pg_catalog, pg_temp"),
        ("lockslab", "search_path=lockslab, pg_catalog, pg_temp"),
    ] {
        let set: Vec<String> = admin
            .query_one(
                "SELECT coalesce(rolconfig, '{}') FROM pg_roles WHERE rolname = $1",
                &[&role],
            )
            .unwrap()
            .get(0);
        assert!(set.iter().any(|s| s == path), "{role}: {set:?}");
    }
    let owner: String = admin
        .query_one(
            "SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'lockslab'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(owner, "lockslab");
}

/// Issue 40, row 4: a challenge client kept a backend holding `LOCK TABLE` on a table of
/// its own past the run; the schema's drop timed out, the run left the registry anyway,
/// and its schema and LOGIN role (whose password the client knew) stayed for good. Now
/// the client role's sessions are ended before the drop.
#[test]
fn a_client_holding_a_lock_past_the_run_leaves_no_role_nor_schema() {
    let room = Room::up_with(&["up", "--room", "127.0.0.13", "--seats", "2"]);
    // Two clients start; each makes a table in the run's schema, then one holds it
    // locked from a session that sleeps (it never reads its socket again, so its end
    // goes unnoticed), and they leave.
    let client = lock_holding_client("echo locked-and-gone\nexit 1");
    let output = room
        .command(&[
            "challenge",
            "counter",
            "--json",
            "--patience",
            "10s",
            "--",
            "sh",
            "-c",
            &client,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let verdict: serde_json::Value = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|v| v["kind"] == "verdict")
        .unwrap_or_else(|| {
            panic!(
                "no verdict:\n{stdout}\n{}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    let failure = verdict["client_failure"].as_str().unwrap_or_default();
    assert!(failure.contains("locked-and-gone"), "{verdict}");
    let run_id = verdict["run_id"].as_str().unwrap();
    let role = format!("lockslab_client_{run_id}");
    let schema = format!("lockslab_challenge_{run_id}");
    let mut admin = postgres::Client::connect(&room.admin_postgres(), postgres::NoTls).unwrap();
    let left: (i64, i64, i64) = {
        let row = admin
            .query_one(
                "SELECT (SELECT count(*) FROM pg_roles \
                          WHERE rolname = $1 OR starts_with(rolname, $1 || '_')), \
                        (SELECT count(*) FROM pg_namespace WHERE nspname = $2), \
                        (SELECT count(*) FROM pg_stat_activity \
                          WHERE usename = $1 OR starts_with(usename, $1 || '_'))",
                &[&role, &schema],
            )
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    assert_eq!(
        left,
        (0, 0, 0),
        "(role, schema, sessions) of the run left; lockslab said: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A challenge client for the room tests: makes a table in the run's schema, holds it
/// locked from a session busy in `pg_sleep` (which never notices its client is gone), ends
/// the `psql` that sent it, then does `then`.
fn lock_holding_client(then: &str) -> String {
    format!(
        r#"
read l
field() {{ printf '%s' "$l" | sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\1/p"; }}
url=$(field postgres_url); schema=$(field schema)
psql -q "$url" -c "CREATE TABLE IF NOT EXISTS $schema.mine (v int)" 2>/dev/null
psql -q "$url" -c "BEGIN; LOCK TABLE $schema.mine; SELECT pg_sleep(600)" >/dev/null 2>&1 &
until psql -tA "$url" -c "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
    WHERE c.relname = 'mine' AND l.granted AND l.mode = 'AccessExclusiveLock'" | grep -q 1
do sleep 0.2; done
kill $!
{then}
"#
    )
}

/// Issue 40, row 4, the sweep: a challenge run killed (SIGKILL) while its client's session
/// holds a lock in its schema never cleans up; the next run finds it dead and must get
/// past that lock to drop its schema and its LOGIN role.
#[test]
fn a_killed_challenge_runs_client_role_is_swept_by_the_next_run_past_a_held_lock() {
    let room = Room::up_with(&["up", "--room", "127.0.0.15", "--seats", "1"]);
    let marker = format!("60{}", std::process::id());
    let mut run = room
        .command(&[
            "challenge",
            "counter",
            "--patience",
            "30s",
            "--",
            "sh",
            "-c",
            &lock_holding_client(&format!("exec sleep {marker}")),
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut admin = postgres::Client::connect(&room.admin_postgres(), postgres::NoTls).unwrap();
    let holder = |admin: &mut postgres::Client| -> Option<String> {
        admin
            .query_opt(
                "SELECT a.usename::text FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                 JOIN pg_stat_activity a ON a.pid = l.pid \
                 WHERE c.relname = 'mine' AND l.granted AND l.mode = 'AccessExclusiveLock'",
                &[],
            )
            .unwrap()
            .map(|row| row.get(0))
    };
    let mut role = None;
    assert!(
        eventually(std::time::Duration::from_secs(60), || {
            role = holder(&mut admin);
            role.is_some()
        }),
        "the client never held its lock"
    );
    let role = role.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    run.wait().unwrap();
    assert!(
        eventually(std::time::Duration::from_secs(10), || {
            processes_mentioning(&format!("sleep {marker}")).is_empty()
        }),
        "the client outlived lockslab"
    );
    // The session's login is the client's own (`lockslab_client_<run>_c1`).
    let run_id = (role.strip_prefix("lockslab_client_").unwrap())
        .split('_')
        .next()
        .unwrap()
        .to_string();
    let role = format!("lockslab_client_{run_id}");
    let schema = format!("lockslab_challenge_{run_id}");
    let left = |admin: &mut postgres::Client| -> (i64, i64, i64) {
        let row = admin
            .query_one(
                "SELECT (SELECT count(*) FROM pg_roles \
                          WHERE rolname = $1 OR starts_with(rolname, $1 || '_')), \
                        (SELECT count(*) FROM pg_namespace WHERE nspname = $2), \
                        (SELECT count(*) FROM pg_stat_activity \
                          WHERE usename = $1 OR starts_with(usename, $1 || '_'))",
                &[&role, &schema],
            )
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    };
    // Killed: nothing cleaned up, and the lock still held.
    assert!(left(&mut admin).0 >= 1, "the killed run's roles are there");
    assert!(holder(&mut admin).is_some());
    // The next run of the instructor's sweeps the dead one before it starts.
    let output = room
        .command(&[
            "challenge",
            "counter",
            "--patience",
            "2s",
            "--",
            "sh",
            "-c",
            "read l; exit 1",
        ])
        .output()
        .unwrap();
    assert_eq!(
        left(&mut admin),
        (0, 0, 0),
        "(role, schema, sessions) of the killed run left; the next run said: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Issue 40, row 5 (Postgres): one seat opened every connection the room's Postgres had,
/// and every other seat and the labs' role were refused. Now a seat has a connection
/// limit: one lab run's worth.
#[test]
fn one_seat_cannot_take_every_postgres_connection() {
    let room = Room::up_with(&["up", "--room", "127.0.0.14", "--seats", "2"]);
    let hog = room.seat_postgres(1);
    let mut held = Vec::new();
    for _ in 0..145 {
        match postgres::Client::connect(&hog, postgres::NoTls) {
            Ok(client) => held.push(client),
            Err(_) => break,
        }
    }
    let took = held.len() as i64;
    for (who, url) in [
        ("seat02", room.seat_postgres(2)),
        (
            "the labs' role",
            room.state_file()["postgres"].as_str().unwrap().to_string(),
        ),
    ] {
        let mut db = postgres::Client::connect(&url, postgres::NoTls)
            .unwrap_or_else(|err| panic!("{who} refused while seat01 holds {took}: {err}"));
        db.batch_execute("SELECT 1").unwrap();
    }
    assert!(
        took <= lockslab::servers::PG_CONNECTIONS_PER_LAB,
        "seat01 opened {took} connections"
    );
    // Still enough for the hungriest lab.
    assert!(
        took >= lockslab::servers::PG_CONNECTIONS_PER_LAB - 1,
        "seat01 opened only {took} connections"
    );
}

/// Issue 40, rows 5, 6 and 8: on one Redis the room shared, a seat's
/// `EVAL "while true do end" 0` answered `BUSY` to every seat until the instructor's
/// `SCRIPT KILL`; `SCAN` listed every seat's key names; and `chaos`, whose keys fell outside
/// a seat's namespace, wrote nothing (NOPERM) and exited 3. Now each seat has a Redis of its
/// own and chaos keys its records under its run id.
#[test]
fn a_seat_neither_stalls_nor_lists_another_and_chaos_runs_on_a_seats_lines() {
    use std::time::Duration;

    let room = Room::up_with(&["up", "--room", "127.0.0.9", "--seats", "2"]);
    let (_, a) = room.seat(1);
    let (_, b) = room.seat(2);
    let redis_url = |seat: &[(String, String)]| {
        seat.iter()
            .find(|(k, _)| k == "LOCKSLAB_REDIS_URL")
            .unwrap()
            .1
            .clone()
    };
    let redis_of = |seat: &[(String, String)]| {
        redis::Client::open(redis_url(seat).as_str())
            .unwrap()
            .get_connection()
            .unwrap()
    };

    // Row 8: seat01's SCAN lists none of seat02's key names.
    let mut rb = redis_of(&b);
    redis::cmd("SET")
        .arg("lockslab:seat02_secret:k")
        .arg("b's")
        .query::<()>(&mut rb)
        .unwrap();
    let mut ra = redis_of(&a);
    let (_, listed): (String, Vec<String>) = redis::cmd("SCAN")
        .arg(0)
        .arg("COUNT")
        .arg(10_000)
        .query(&mut ra)
        .unwrap();
    assert!(
        !listed.iter().any(|key| key.contains("seat02")),
        "seat01 listed seat02's keys: {listed:?}"
    );

    // Row 5: seat01 runs a script that never ends…
    let hostile = {
        let url = redis_url(&a);
        std::thread::spawn(move || {
            let mut conn = redis::Client::open(url.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            redis::cmd("EVAL")
                .arg("while true do end")
                .arg(0)
                .query::<redis::Value>(&mut conn)
        })
    };
    // …and it runs: seat01's own Redis answers BUSY once past its script time limit.
    let busy = eventually(Duration::from_secs(60), || {
        let ping = redis::cmd("PING").query::<String>(&mut ra);
        matches!(&ping, Err(err) if err.to_string().contains("BUSY"))
    });
    assert!(busy, "seat01's script never made its Redis busy");
    // Meanwhile seat02's Redis answers, and seat02's lab runs to its verdict.
    let pong: String = redis::cmd("PING").query(&mut rb).unwrap();
    assert_eq!(pong, "PONG");
    let output = room
        .attendee_with(&b, &QUICK_LAB)
        .arg("--json")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "seat02's lab while seat01's script runs: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // seat01 ends its own script; its Redis answers again.
    let killed: String = redis::cmd("SCRIPT").arg("KILL").query(&mut ra).unwrap();
    assert_eq!(killed, "OK");
    let ended = hostile.join().unwrap();
    assert!(ended.is_err(), "the script was killed: {ended:?}");
    let pong: String = redis::cmd("PING").query(&mut ra).unwrap();
    assert_eq!(pong, "PONG");

    // Row 6: chaos on a seat's lines alone writes real values on Redis and on etcd, inside
    // the seat's namespace: no NOPERM, no "unknown". Seed 5 draws one kill for both designs,
    // a fault that always decides (seed 7 drew a partition, which a busy machine may leave
    // undecided for reasons that are not the seat's).
    for design in ["redis-lock", "etcd-lease"] {
        let args = [
            "chaos",
            "--design",
            design,
            "--schedules",
            "1",
            "--seed",
            "5",
            "--no-shrink",
            "--json",
        ];
        let output = room.attendee_with(&a, &args).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("NOPERM"), "{design}: {stderr}");
        let schedules: Vec<serde_json::Value> = stdout
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .filter(|line: &serde_json::Value| line["kind"] == "schedule")
            .collect();
        assert_eq!(schedules.len(), 1, "{design}: {stdout}\n{stderr}");
        let accepted = schedules[0]["accepted"].as_u64().unwrap_or(0);
        assert!(accepted > 0, "{design}: no write landed: {}", schedules[0]);
        // 0 or 1 (the unfenced design may well break). 3, "nothing could be decided", only
        // for what a busy machine does to any run (CI at b98ad9d: a worker slowed past its
        // lease, so its release found the lock gone), never for what the seat was refused.
        let unknowns = schedules[0]["unknowns"].to_string();
        let undecided_by_load = ["expired before it let go", "none of its faults played"]
            .iter()
            .any(|why| unknowns.contains(why));
        assert!(
            matches!(output.status.code(), Some(0 | 1))
                || (output.status.code() == Some(3) && undecided_by_load),
            "{design}: {:?}\n{stdout}\n{stderr}",
            output.status
        );
    }

    // `lockslab down` stops every seat's Redis with the room's servers.
    let pids: Vec<i32> = room.state_file()["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_i64().unwrap() as i32)
        .collect();
    assert!(
        pids.len() >= 5,
        "three servers and a Redis per seat: {pids:?}"
    );
    drop(room);
    for pid in pids {
        assert!(
            eventually(Duration::from_secs(10), || proc_state(pid)
                .is_none_or(|s| s == 'Z')),
            "server {pid} still running after down"
        );
    }
}

/// The export value of `var` in a seat's lines.
fn export_of(seat: &[(String, String)], var: &str) -> String {
    seat.iter()
        .find(|(k, _)| k == var)
        .unwrap_or_else(|| panic!("no {var} in {seat:?}"))
        .1
        .clone()
}

/// Issue 40, the re-attack: all seats shared one etcd, where a seat's user, limited to its
/// key prefix, could still compact the whole history (every other seat's watch from an
/// older revision was cancelled) and, etcd 3.4 being what it is (CVE-2023-32082), list
/// every lease, read the keys on another seat's, and keep it alive. Each seat now has an
/// etcd of its own. (Sent to another seat's etcd port with no password at all, etcd 3.4
/// still takes all of these: see `PrivateServers::start_seat_servers`.)
#[test]
fn a_seats_compaction_and_leases_on_its_own_lines_reach_no_other_seat() {
    use etcd_client::{LeaseTimeToLiveOptions, WatchOptions};

    let room = Room::up_with(&["up", "--room", "127.0.0.11", "--seats", "2"]);
    let (_, a) = room.seat(1);
    let (_, b) = room.seat(2);
    lockslab::connect::etcd_runtime().unwrap().block_on(async {
        let etcd_of = |seat: &[(String, String)]| trust_seat_etcd(seat);
        let mut ea = lockslab::connect::etcd(&etcd_of(&a)).await.unwrap();
        let mut eb = lockslab::connect::etcd(&etcd_of(&b)).await.unwrap();

        // seat02 writes a key under a lease, as a lock holder does, and remembers the
        // revision to watch from, as a waiter does.
        let lease = eb.lease_grant(60, None).await.unwrap().id();
        let key = "lockslab:seat02_run:lock";
        let put = etcd_client::PutOptions::new().with_lease(lease);
        let written = eb.put(key, "b's", Some(put)).await.unwrap();
        let revision = written.header().unwrap().revision();
        eb.put(key, "b's again", None).await.unwrap();

        // seat01 compacts everything it can.
        let own = ea.put("lockslab:seat01_run:x", "a's", None).await.unwrap();
        let newest = own.header().unwrap().revision();
        ea.compact(newest, None).await.unwrap();

        // seat02's watch from its revision still sees its own history.
        let from = WatchOptions::new().with_start_revision(revision);
        let mut watch = eb.watch(key, Some(from)).await.unwrap();
        let seen = tokio::time::timeout(std::time::Duration::from_secs(20), async {
            loop {
                let response = watch.message().await.unwrap().expect("the watch ended");
                if response.canceled() || !response.events().is_empty() {
                    return response;
                }
            }
        })
        .await
        .expect("no event and no cancel on seat02's watch");
        assert!(
            !seen.canceled(),
            "seat01's compaction cancelled seat02's watch (compacted to {})",
            seen.compact_revision()
        );
        assert_eq!(seen.events().len(), 2, "{seen:?}");

        // seat01 sees its own leases only…
        let listed: Vec<i64> = ea
            .leases()
            .await
            .unwrap()
            .leases()
            .iter()
            .map(|l| l.id())
            .collect();
        assert!(!listed.contains(&lease), "seat01 listed seat02's lease");
        // …learns nothing of seat02's…
        let peek = ea
            .lease_time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
            .await;
        if let Ok(peek) = &peek {
            assert!(
                peek.keys().is_empty() && peek.ttl() <= 0,
                "seat01 read seat02's lease: ttl {} keys {:?}",
                peek.ttl(),
                peek.keys()
            );
        }
        // …and cannot keep it alive: the client sends one keep-alive and reads its answer,
        // a TTL of 0 for a lease the server does not have.
        let renewed = ea.lease_keep_alive(lease).await;
        assert!(
            renewed.is_err(),
            "seat01 kept seat02's lease alive: {renewed:?}"
        );
    });
}

/// A seat's etcd URL, once this test process reaches it with the seat's certificate (its
/// `LOCKSLAB_ETCD_TLS`), as the attendee's lockslab does.
fn trust_seat_etcd(seat: &[(String, String)]) -> String {
    let url = export_of(seat, "LOCKSLAB_ETCD_URL");
    lockslab::etcd_tls::trust(&host_port(&url), &export_of(seat, "LOCKSLAB_ETCD_TLS"));
    url
}

/// What a client with `tls` (none: plain text) and no password gets done on the etcd at
/// `host_port`: each of a compaction, a lease grant and a lease list that etcd took.
async fn calls_without_a_password(
    host_port: &str,
    tls: Option<etcd_client::TlsOptions>,
) -> Vec<&'static str> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(std::time::Duration::from_secs(5))
        .with_timeout(std::time::Duration::from_secs(5));
    if let Some(tls) = tls {
        options = options.with_tls(tls);
    }
    let endpoint = format!("{scheme}://{host_port}");
    let Ok(mut client) = etcd_client::Client::connect([endpoint], Some(options)).await else {
        return Vec::new();
    };
    let mut taken = Vec::new();
    if client.compact(1, None).await.is_ok() {
        taken.push("compaction");
    }
    if client.lease_grant(60, None).await.is_ok() {
        taken.push("lease grant");
    }
    if client.leases().await.is_ok() {
        taken.push("lease list");
    }
    taken
}

/// etcd 3.4 asks no password for a compaction or a lease call: whoever reached a seat's etcd
/// port could cancel the seat's watches and keep its locks alive, and, with enough lease
/// grants to raise `NOSPACE`, turn its auth off. Each seat's etcd now demands a client
/// certificate signed by that seat's own authority: without one, and with another seat's,
/// nothing gets through. The seat's own certificate, without its password, logs in as the
/// seat (etcd 3.4 takes the certificate's name) and reaches no further than the seat's
/// user does.
#[test]
fn a_seats_etcd_lets_in_no_one_without_its_own_certificate() {
    use lockslab::etcd_tls::Bundle;

    let room = Room::up_with(&["up", "--room", "127.0.0.12", "--seats", "2"]);
    let (_, a) = room.seat(1);
    let (_, b) = room.seat(2);
    let b_at = host_port(&export_of(&b, "LOCKSLAB_ETCD_URL"));
    lockslab::connect::etcd_runtime().unwrap().block_on(async {
        // No certificate at all: in plain text…
        let taken = calls_without_a_password(&b_at, None).await;
        assert!(
            taken.is_empty(),
            "seat02's etcd took, in plain text: {taken:?}"
        );
        let a_bundle = Bundle::decode(&export_of(&a, "LOCKSLAB_ETCD_TLS")).unwrap();
        let b_bundle = Bundle::decode(&export_of(&b, "LOCKSLAB_ETCD_TLS")).unwrap();
        // …or over TLS, trusting seat02's authority but showing no certificate.
        let server_only = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&b_bundle.ca))
            .domain_name(lockslab::etcd_tls::SERVER_NAME);
        let taken = calls_without_a_password(&b_at, Some(server_only.clone())).await;
        assert!(
            taken.is_empty(),
            "seat02's etcd took, with no certificate: {taken:?}"
        );

        // seat01's certificate, offered to seat02's etcd.
        let a_at_b = server_only.identity(etcd_client::Identity::from_pem(
            &a_bundle.cert,
            &a_bundle.key,
        ));
        let taken = calls_without_a_password(&b_at, Some(a_at_b)).await;
        assert!(
            taken.is_empty(),
            "seat02's etcd took seat01's certificate: {taken:?}"
        );

        // seat02's own certificate with no password is seat02, and no more.
        let options = etcd_client::ConnectOptions::new().with_tls(b_bundle.client_options());
        let mut own = etcd_client::Client::connect([format!("https://{b_at}")], Some(options))
            .await
            .unwrap();
        own.put("lockslab:seat02_cert", "b's", None).await.unwrap();
        assert!(
            own.put("elsewhere", "b's", None).await.is_err(),
            "outside its prefix"
        );
        assert!(own.user_list().await.is_err(), "listed the users");
        assert!(own.auth_disable().await.is_err(), "turned auth off");
    });
}

/// The uid a process runs as, from `/proc/<pid>/status`.
fn uid_of(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The process listening on TCP `port` (IPv4), found through its socket's inode.
/// The process listening on `at` (an IPv4 `host:port`): the address counts too, since a
/// port number free on one loopback address may be taken on another.
fn listener_on(at: &str) -> Option<i32> {
    let addr: std::net::SocketAddrV4 = at.parse().ok()?;
    // /proc/net/tcp writes an address as its four bytes in the machine's order, in hex.
    let [a, b, c, d] = addr.ip().octets();
    let ip = format!("{d:02X}{c:02X}{b:02X}{a:02X}");
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let inode = table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local_ip, local_port) = fields.get(1)?.split_once(':')?;
        let listening = fields.get(3) == Some(&"0A");
        let here = local_ip == ip || local_ip == "00000000";
        (listening && here && u16::from_str_radix(local_port, 16).ok()? == addr.port())
            .then(|| fields.get(9).map(|inode| inode.to_string()))?
    })?;
    let wanted = std::path::PathBuf::from(format!("socket:[{inode}]"));
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .filter_map(|entry| entry.file_name().to_string_lossy().parse::<i32>().ok())
        .find(|pid| {
            std::fs::read_dir(format!("/proc/{pid}/fd")).is_ok_and(|fds| {
                fds.flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|to| to == wanted))
            })
        })
}

/// Every file and directory under `dir` (itself included), with its owner and mode.
fn tree(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).unwrap();
    let mut found = vec![(dir.to_path_buf(), meta.uid(), meta.mode() & 0o7777)];
    if meta.is_dir() {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            found.extend(tree(&entry.path()));
        }
    }
    found
}

/// Issue 40, the re-attack: as root (CI, this machine), a seat's Redis ran as root. Now each
/// seat's Redis and etcd run as a user of the seat's own — not root, not Postgres's user,
/// not another seat's — that owns the seat's files, private to it; as anyone else they run
/// as that user, as before. `lockslab down` leaves none of them, and no file.
#[test]
fn a_seats_servers_run_as_a_user_of_its_own_and_down_leaves_none() {
    use std::os::unix::fs::MetadataExt;

    let room = Room::up_with(&["up", "--room", "127.0.0.12", "--seats", "2"]);
    let state = room.state_file();
    let home = state["pg_home"]
        .as_str()
        .map_or_else(|| room.state.path().to_path_buf(), std::path::PathBuf::from);
    let me = nix::unistd::Uid::effective();
    let postgres_uid = state["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pid| pid.as_i64().unwrap() as i32)
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "postgres")
        })
        .and_then(uid_of)
        .expect("the room's Postgres");

    let mut seen_uids = Vec::new();
    let mut all_servers = Vec::new();
    let mut guards = Vec::new();
    for n in [1, 2] {
        let (_, seat) = room.seat(n);
        // The servers behind the seat's own lines, found by the ports they listen on: its
        // etcd's, and the guard's in front of its Redis (which listens on loopback, working
        // in the seat's directory, one above its etcd's).
        let [redis_door, etcd] = ["LOCKSLAB_REDIS_URL", "LOCKSLAB_ETCD_URL"].map(|var| {
            let at = host_port(&export_of(&seat, var));
            listener_on(&at).unwrap_or_else(|| panic!("nothing listens on {at}"))
        });
        let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
        assert_eq!(comm(redis_door).trim(), "lockslab-guard");
        guards.push(redis_door);
        let etcd_dir = std::fs::read_link(format!("/proc/{etcd}/cwd")).unwrap();
        let redis = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
            .find(|pid| {
                std::fs::read_link(format!("/proc/{pid}/cwd"))
                    .is_ok_and(|cwd| Some(cwd.as_path()) == etcd_dir.parent())
                    && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .is_ok_and(|c| c.trim() == "redis-server")
            })
            .unwrap_or_else(|| panic!("no Redis of seat {n} beside its etcd"));
        let servers = vec![redis, etcd];
        let uids: Vec<u32> = servers.iter().filter_map(|pid| uid_of(*pid)).collect();
        assert_eq!(uids.len(), 2);
        assert_eq!(uids[0], uids[1], "seat {n}: its Redis and etcd as one user");
        let uid = uids[0];
        if me.is_root() {
            assert_ne!(uid, 0, "seat {n}'s servers run as root");
            assert_ne!(
                uid, postgres_uid,
                "seat {n}'s servers run as Postgres's user"
            );
            assert!(!seen_uids.contains(&uid), "two seats share uid {uid}");
        } else {
            assert_eq!(
                uid,
                me.as_raw(),
                "not root: the seat's servers run as lockslab's user"
            );
        }
        seen_uids.push(uid);
        // Their directory (the Redis works in it, the etcd below): the seat user's, private
        // to it; its config holds passwords.
        let dir = std::fs::read_link(format!("/proc/{}/cwd", servers[0])).unwrap();
        assert!(dir.starts_with(&home), "{} is not up's", dir.display());
        assert!(etcd_dir.starts_with(&dir), "{}", etcd_dir.display());
        for (path, owner, mode) in tree(&dir) {
            assert_eq!(owner, uid, "{} is not seat {n}'s", path.display());
            assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", path.display());
        }
        // None of those files holds the room's password, the instructor's on every server
        // (Redis's `default`, etcd's `root`, Postgres's labs role): a seat that took over
        // its server would hold them (a hostile re-attack read it in the seat's redis.conf).
        let instructor = state["redis"].as_str().unwrap();
        let room_password = instructor
            .strip_prefix("redis://default:")
            .and_then(|rest| rest.split_once('@'))
            .map(|(password, _)| password.as_bytes())
            .unwrap();
        for (path, _, _) in tree(&dir) {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            assert!(
                !bytes
                    .windows(room_password.len())
                    .any(|w| w == room_password),
                "seat {n}'s {} holds the room's password",
                path.display()
            );
        }
        all_servers.extend(servers);
    }
    // The state directory stays lockslab's.
    assert_eq!(
        std::fs::metadata(room.state.path()).unwrap().uid(),
        me.as_raw()
    );

    let state_dir = room.state.path().to_path_buf();
    drop(room);
    for pid in all_servers.into_iter().chain(guards) {
        assert!(
            eventually(std::time::Duration::from_secs(10), || proc_state(pid)
                .is_none_or(|s| s == 'Z')),
            "seat server or guard {pid} still running after down"
        );
    }
    if home != state_dir {
        assert!(!home.exists(), "{} is still there", home.display());
    }
    let left: Vec<_> = std::fs::read_dir(&state_dir)
        .map(|dir| dir.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "down left {left:?}");
}

/// A TCP connection to `to` from the source address `from` (any of 127.0.0.0/8 on Linux):
/// what an attendee at another machine of the room would open.
fn connect_from(from: [u8; 4], to: &str) -> std::io::Result<std::net::TcpStream> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None)?;
    socket.bind(&std::net::SocketAddr::from((from, 0)).into())?;
    let to: std::net::SocketAddr = to.parse().unwrap();
    socket.connect(&to.into())?;
    Ok(socket.into())
}

/// A Postgres startup packet for `user` on database `user`, the first thing a client sends.
fn pg_startup(user: &str) -> Vec<u8> {
    let body = [
        &3u32.wrapping_shl(16).to_be_bytes()[..],
        format!("user\0{user}\0database\0{user}\0\0").as_bytes(),
    ]
    .concat();
    [&(body.len() as u32 + 4).to_be_bytes()[..], &body].concat()
}

/// Whether the other side closes `stream` before `until`: reads (and drops) whatever comes
/// until the end of the stream, a reset, or `until`.
fn closed_before(stream: &mut std::net::TcpStream, until: std::time::Instant) -> bool {
    use std::io::Read;
    let mut buffer = [0u8; 1024];
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        let _ = stream.set_read_timeout(Some(left.max(std::time::Duration::from_millis(50))));
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// Issue 40, the hostile re-attack: from the room's network, with no password, anyone could
/// hold the room's connections in the middle of logging in — Postgres counts each against
/// `max_connections` until its `authentication_timeout` (a minute), a seat's Redis against
/// its `maxclients` for ever — and 200 of them locked every seat and the instructor out of
/// Postgres. Now the room's address is the guard's, which lets one address log in eight at
/// a time and gives every connection a few seconds to log in.
#[test]
fn a_flood_of_unfinished_logins_from_one_address_locks_no_one_else_out() {
    const FLOOD_FROM: [u8; 4] = [127, 0, 0, 17];
    let room = Room::up_with(&["up", "--room", "127.0.0.16", "--seats", "2"]);
    let (_, seat) = room.seat(1);
    let seat_pg = export_of(&seat, "LOCKSLAB_POSTGRES_URL");
    let seat_redis = export_of(&seat, "LOCKSLAB_REDIS_URL");
    // Logged in before the flood, used after it: the deadline is for logins only.
    let mut early_pg = postgres::Client::connect(&seat_pg, postgres::NoTls).unwrap();
    let mut early_redis = redis::Client::open(seat_redis.as_str())
        .unwrap()
        .get_connection()
        .unwrap();

    // The flood: a startup packet for a real role and never its password (Postgres then
    // waits for the password, holding a connection slot), and bare sockets on the seat's
    // Redis. What the guard refuses at once is refused; the rest is held.
    let startup = pg_startup("seat02");
    let mut flood = Vec::new();
    for (at, first) in [
        (host_port(&seat_pg), startup.as_slice()),
        (host_port(&seat_redis), b"".as_slice()),
    ] {
        for _ in 0..220 {
            if let Ok(mut stream) = connect_from(FLOOD_FROM, &at) {
                use std::io::Write;
                let _ = stream.write_all(first);
                flood.push(stream);
            }
        }
    }
    assert!(
        flood.len() >= 220,
        "only {} flood connections opened",
        flood.len()
    );

    // Meanwhile, from another address: both seats, the labs' role, the superuser.
    let (_, other) = room.seat(2);
    for (who, url) in [
        ("seat01", seat_pg.clone()),
        ("seat02", export_of(&other, "LOCKSLAB_POSTGRES_URL")),
        (
            "the labs' role",
            room.state_file()["postgres"].as_str().unwrap().to_string(),
        ),
        ("the superuser", room.admin_postgres()),
    ] {
        let mut db = postgres::Client::connect(&url, postgres::NoTls)
            .unwrap_or_else(|err| panic!("{who} refused during the flood: {err}"));
        db.batch_execute("SELECT 1").unwrap();
    }
    let mut redis = redis::Client::open(seat_redis.as_str())
        .unwrap()
        .get_connection()
        .unwrap_or_else(|err| panic!("seat01's Redis refused during the flood: {err}"));
    assert_eq!(
        redis::cmd("PING").query::<String>(&mut redis).unwrap(),
        "PONG"
    );

    // Every flood connection is closed, well before Postgres's own minute.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let open = flood
        .iter_mut()
        .map(|stream| closed_before(stream, until))
        .filter(|closed| !closed)
        .count();
    assert_eq!(open, 0, "flood connections still open");

    // The connections that logged in before the flood outlived the login deadline.
    early_pg.batch_execute("SELECT 1").unwrap();
    assert_eq!(
        redis::cmd("PING")
            .query::<String>(&mut early_redis)
            .unwrap(),
        "PONG"
    );
}
