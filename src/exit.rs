//! How lockslab ends: its exit codes, and the error that means "the command line is wrong".
//! Every layer may say so, so this sits below all of them (the [`crate::cli`] re-exports it).

/// A bad value or combination of flags found after parsing: reported like clap's own
/// errors, with exit status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// `bail!` for a command-line mistake: returns a [`UsageError`] (exit status 2).
#[macro_export]
macro_rules! bail_usage {
    ($($arg:tt)*) => {
        return Err($crate::exit::UsageError(format!($($arg)*)).into())
    };
}

/// Bad command line: an unknown flag, a malformed value, flags that do not fit together.
pub const EXIT_USAGE: u8 = 2;

/// The lab ran and its verdict was read back (a stale write is the lesson, not a failure).
pub const EXIT_OK: u8 = 0;
/// The lab could not run: a backend did not answer, a server would not start, a worker failed.
pub const EXIT_COULD_NOT_RUN: u8 = 1;
