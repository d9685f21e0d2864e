//! Finding and starting servers, `lockslab up`/`down`/`status`, and what is left afterwards.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// A lockslab command with no server configured at all, and its own state directory.
fn bare(args: &[&str], state_dir: &std::path::Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("LOCKSLAB_REDIS_URL")
        .env_remove("LOCKSLAB_ETCD_URL")
        .env_remove("LOCKSLAB_POSTGRES_URL")
        .env("LOCKSLAB_STATE_DIR", state_dir)
        .env("NO_COLOR", "1");
    command
}

/// Server processes that mention `dir` and are still alive (a zombie whose parent is init is
/// init's to reap, and counts as gone).
fn servers_in(dir: &str) -> Vec<(u32, char, String)> {
    processes_mentioning(dir)
        .into_iter()
        .filter(|(_, state, _)| *state != 'Z')
        .collect()
}

#[test]
fn private_servers_are_started_for_a_run_and_removed_after_it() {
    let state = tempfile::tempdir().unwrap();
    // The servers' data goes under a TMPDIR of this test's own, so we can see it removed.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        tmp.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let output = bare(
        &[&QUICK_LAB[..], &["--private-servers"]].concat(),
        state.path(),
    )
    .env("TMPDIR", tmp.path())
    .output()
    .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        text.contains("Redis    redis://127.0.0.1:") && text.contains("(private, started in"),
        "{text}"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        left.is_empty(),
        "the private servers' data was not removed: {left:?}"
    );
    let port = text
        .split("redis://127.0.0.1:")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert!(
        eventually(Duration::from_secs(5), || servers_in(&format!(
            "127.0.0.1:{port}"
        ))
        .is_empty()),
        "the private Redis on {port} is still running: {:?}",
        servers_in(&format!("127.0.0.1:{port}"))
    );
}

#[test]
fn up_status_down_keep_servers_between_commands() {
    let state = tempfile::tempdir().unwrap();
    let state_path = state.path().to_str().unwrap().to_string();
    let up = bare(&["up"], state.path()).output().unwrap();
    let up_text = String::from_utf8_lossy(&up.stdout);
    assert!(
        up.status.success(),
        "{up_text}\n{}",
        String::from_utf8_lossy(&up.stderr)
    );
    assert!(
        up_text.contains("export LOCKSLAB_REDIS_URL=redis://127.0.0.1:"),
        "{up_text}"
    );
    assert!(
        up_text.contains("export LOCKSLAB_POSTGRES_URL=postgres://"),
        "{up_text}"
    );
    assert!(
        !servers_in(&state_path).is_empty(),
        "servers run after `up` exits"
    );

    let status = bare(&["status"], state.path()).output().unwrap();
    let status_text = String::from_utf8_lossy(&status.stdout);
    assert_eq!(status_text.matches(" up").count(), 3, "{status_text}");

    // A lab with nothing configured finds `up`'s servers.
    let lab = bare(&QUICK_LAB, state.path()).output().unwrap();
    let lab_text = String::from_utf8_lossy(&lab.stdout);
    assert!(lab.status.success(), "{lab_text}");
    assert!(lab_text.contains("from `lockslab up`"), "{lab_text}");

    let down = bare(&["down"], state.path()).output().unwrap();
    assert!(down.status.success());
    assert!(
        eventually(Duration::from_secs(10), || servers_in(&state_path)
            .is_empty()),
        "left running after `down`: {:?}",
        servers_in(&state_path)
    );
    let status = bare(&["status"], state.path()).output().unwrap();
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("no servers"),
        "status after down"
    );
}

#[test]
fn the_hands_on_worker_without_shared_servers_says_how_to_get_them() {
    let state = tempfile::tempdir().unwrap();
    let output = bare(&["worker", "--private-servers"], state.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("lockslab up"), "{stderr}");
}

#[test]
fn sigterm_and_a_second_ctrl_c_clean_up_too() {
    for signals in [
        &[Signal::SIGTERM][..],
        &[Signal::SIGINT, Signal::SIGINT][..],
        &[Signal::SIGHUP][..],
    ] {
        let state = tempfile::tempdir().unwrap();
        let mut lab = bare(
            &["gc-pause", "--private-servers", "--ttl", "10s"],
            state.path(),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
        let lab_pid = lab.id();
        // Wait until worker A exists and is frozen (private servers first: initdb is slow on
        // a busy machine).
        let frozen = eventually(Duration::from_secs(60), || {
            children_of(lab_pid)
                .iter()
                .any(|(_, state, name)| name == "lockslab" && *state == 'T')
        });
        assert!(frozen, "A never froze: {:?}", children_of(lab_pid));
        let children: Vec<u32> = children_of(lab_pid)
            .iter()
            .map(|(pid, _, _)| *pid)
            .collect();
        for signal in signals {
            kill(Pid::from_raw(lab_pid as i32), *signal).unwrap();
            std::thread::sleep(Duration::from_millis(30));
        }
        let status = lab.wait().unwrap();
        assert_eq!(status.code(), Some(128 + signals[0] as i32), "{signals:?}");
        for pid in children {
            assert!(
                eventually(Duration::from_secs(5), || {
                    let stat =
                        std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                    stat.is_empty() || stat.contains(") Z")
                }),
                "child {pid} outlived lockslab after {signals:?}"
            );
        }
    }
}
