// No `println!`/`eprintln!` here either: see the note in lib.rs.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

fn main() -> ExitCode {
    lockslab::output::init();
    let result = lockslab::cli::run();
    if lockslab::procs::interrupted() {
        // Ctrl-C (or SIGTERM, SIGHUP, a closed stdout) arrived: whatever the lab was doing
        // failed because its workers were being stopped. The cleanup decides the exit.
        lockslab::procs::wait_for_cleanup();
    }
    match result {
        Ok(code) => code,
        Err(err) => {
            lockslab::errln!("lockslab: error: {err:#}");
            if err.downcast_ref::<lockslab::cli::UsageError>().is_some() {
                lockslab::errln!("\nFor more information, try '--help'.");
                ExitCode::from(lockslab::cli::EXIT_USAGE)
            } else {
                ExitCode::from(lockslab::cli::EXIT_COULD_NOT_RUN)
            }
        }
    }
}
