//! The machine has what the build and the labs need, as `scripts/setup --check` sees it:
//! a missing capability fails here with its name, not later in a user's lab.

use std::process::Command;

#[test]
fn setup_check_finds_every_capability() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/setup");
    let output = Command::new(script)
        .arg("--check")
        .output()
        .expect("running scripts/setup --check");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "scripts/setup --check failed:\n{stderr}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("ready"), "{stdout}");
}

#[test]
fn setup_rejects_an_unknown_option() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/setup");
    let output = Command::new(script).arg("--chek").output().unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--chek"));
}
