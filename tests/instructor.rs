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
