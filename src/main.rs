use std::process::ExitCode;

fn main() -> ExitCode {
    match lockslab::cli::run() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("lockslab: error: {err:#}");
            ExitCode::from(lockslab::cli::EXIT_COULD_NOT_RUN)
        }
    }
}
