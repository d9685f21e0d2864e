//! Instructor and workshop mode: the lab menu, `doctor`, completions and the man page,
//! `--step` driven through a pseudo-terminal, and a room's servers on a second loopback
//! address.

mod common;

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
    // The test binary's Postgres is shared here: doctor reads its free connections.
    assert!(text.contains("connections free"), "{text}");
    for lab in ["gc-pause", "naive", "skip-locked", "etcd-vs-redis"] {
        assert!(
            text.lines().any(|l| l.contains(lab) && l.contains("runs")),
            "{lab}:\n{text}"
        );
    }
}

#[test]
fn doctor_exits_1_and_says_what_to_do_when_a_server_does_not_answer() {
    let output = lockslab(&["doctor"])
        .env("LOCKSLAB_REDIS_URL", "redis://127.0.0.1:1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let errors = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{text}\n{errors}");
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
