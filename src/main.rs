// No `println!`/`eprintln!` here either: see the note in lib.rs.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use lockslab::exit::Exit;

fn main() -> ExitCode {
    lockslab::output::init();
    let result = lockslab::cli::run();
    if lockslab::procs::interrupted() {
        // Ctrl-C (or SIGTERM, SIGHUP, a closed stdout) arrived: whatever the lab was doing
        // failed because its workers were being stopped. The cleanup decides the exit.
        lockslab::procs::wait_for_cleanup();
    }
    let exit = match result {
        Ok(exit) => exit,
        Err(err) => {
            // A server that froze or went away is said in its own one line, whichever
            // command met it (the first such failure: the others are its echoes).
            let err = lockslab::connect::explain(err);
            // Wrapped to the terminal (80 columns when piped), as a projector shows it.
            lockslab::output::err_prose(&format!("lockslab: error: {err:#}"));
            let exit = Exit::of_error(&err);
            if exit == Exit::Usage {
                lockslab::errln!("\nFor more information, try '--help'.");
            }
            exit
        }
    };
    exit.into()
}
