//! `pgbench` for the benches that compare a lab with Postgres itself: where it is, and how
//! to run it against a server URL without putting the password on its command line (where
//! `ps` shows it to every user of the machine): it travels in `PGPASSWORD`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// pgbench on PATH, or the newest under /usr/lib/postgresql/*/bin.
pub fn find() -> Option<PathBuf> {
    if Command::new("pgbench").arg("--version").output().is_ok() {
        return Some("pgbench".into());
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .map(|dir| dir.path().join("bin/pgbench"))
        .filter(|path| path.exists())
        .collect();
    found.sort();
    found.pop()
}

/// `pgbench <args> <url without its password>`, the password in `PGPASSWORD`.
pub fn command(pgbench: &Path, url: &str, args: &[&str]) -> Command {
    let (url, password) = without_password(url);
    let mut command = Command::new(pgbench);
    command.args(args).arg(url);
    if let Some(password) = password {
        command.env("PGPASSWORD", password);
    }
    command
}

/// Runs `command` (which must succeed) and returns the `tps = …` figure it printed.
pub fn tps(command: &mut Command) -> f64 {
    let output = command.output().expect("running pgbench");
    let out = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    out.lines()
        .find_map(|line| {
            let rest = line.trim().strip_prefix("tps = ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no tps in pgbench's output:\n{out}"))
}

/// `postgres://user:secret@host/db` → (`postgres://user@host/db`, `secret`). The servers'
/// passwords are hex, so no percent-decoding is needed.
fn without_password(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return (url.to_string(), None);
    };
    match userinfo.split_once(':') {
        Some((user, password)) => (
            format!("{scheme}://{user}@{host}"),
            Some(password.to_string()),
        ),
        None => (url.to_string(), None),
    }
}
