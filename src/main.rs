use std::process::ExitCode;

fn main() -> ExitCode {
    let result = lockslab::cli::run();
    if lockslab::procs::interrupted() {
        // Ctrl-C (or SIGTERM, SIGHUP, a closed stdout) arrived: whatever the lab was doing
        // failed because its workers were being stopped. The cleanup decides the exit.
        lockslab::procs::wait_for_cleanup();
    }
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("lockslab: error: {err:#}");
            ExitCode::from(lockslab::cli::EXIT_COULD_NOT_RUN)
        }
    }
}
