//! How lockslab ends: its exit statuses ([`Exit`]), and the error that means "the command
//! line is wrong".
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

/// The table of [`Exit`], as `lockslab --help` shows it and the type's doc holds it:
/// written here once (a macro, so that `concat!` and `#[doc]` can take it).
#[macro_export]
macro_rules! exit_status_table {
    () => {
        "Exit status, the same for every command:
  0    done: a lab ran to its verdict (whatever it shows: a stale write is the
       lesson); chaos or matrix found no violation; a challenge passed; check
       reproduced the recorded verdict
  1    a violation: chaos or matrix found one, a challenge failed, check's
       replay disagrees (a lab never exits 1)
  2    bad command line (an unknown flag, a malformed duration or URL, flags
       that clash)
  3    undecided: no violation, but some history could not be decided
       (chaos, matrix, a challenge; unknown is never a pass)
  4    could not run (a backend did not answer, a worker failed, a file
       could not be read or replayed)
  130  interrupted by Ctrl-C (143 SIGTERM, 129 SIGHUP or the terminal closed);
       workers and servers were stopped
  141  stdout was closed early (`lockslab gc-pause | head`); workers and
       servers were stopped"
    };
}

/// The "Exit status:" paragraph of one command's `--help`: the command says what its 0
/// (and a tool its 1, and 3) mean in its own terms; 2, 4 and the signals read the same
/// for every command, from [`Exit`].
#[macro_export]
macro_rules! exit_status_help {
    (done: $done:literal) => {
        concat!(
            "Exit status: 0 ", $done, " · 2 bad command line",
            $crate::exit_status_help!(@rest)
        )
    };
    (done: $done:literal, violation: $violation:literal) => {
        concat!(
            "Exit status: 0 ", $done, " · 1 ", $violation, " · 2 bad command line",
            $crate::exit_status_help!(@rest)
        )
    };
    (done: $done:literal, violation: $violation:literal, undecided: $undecided:literal) => {
        concat!(
            "Exit status: 0 ", $done, " · 1 ", $violation, " · 2 bad command line · 3 ",
            $undecided, $crate::exit_status_help!(@rest)
        )
    };
    (@rest) => {
        " · 4 it could not run (a server did not answer or refused, a worker failed, a file \
         could not be read) · 130 Ctrl-C (143 SIGTERM, 129 SIGHUP or the terminal closed) · \
         141 stdout closed early (| head); workers and servers are stopped either way."
    };
}

/// How every command ends, written once: the labs, `chaos`, `matrix`, `challenge` and
/// `check` end through it, and so does every other command and every early shutdown (an
/// interrupt, a closed stdout, `q` at a `--step` stop).
///
/// One number means one thing whichever command says it. A lab has no violation to report:
/// a stale write is the lesson it came to show, so a lab that reached its verdict ends
/// [`Exit::Done`] whatever the verdict says, and never 1 or 3. The tools keep Maelstrom's
/// convention (1 a violation, 3 undecided), which scripts and CI already read. "Could not
/// run" is any failure that is not the command line's; the other commands (`up`,
/// `status`, `doctor`, `render`…) end 0, 2 or 4 in the same sense.
///
/// ```text
#[doc = exit_status_table!()]
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It ran to its answer, and the answer is no violation (for a lab: any verdict).
    Done,
    /// A violation was found (chaos, matrix), a challenge failed, or `check`'s replay
    /// disagrees with the recorded verdict.
    Violation,
    /// Bad command line: an unknown flag, a malformed value, flags that do not fit together.
    Usage,
    /// No violation, but something could not be decided: unknown, never a pass.
    Undecided,
    /// It could not run: a backend did not answer, a server would not start, a worker
    /// failed, a file could not be read or replayed.
    CouldNotRun,
    /// Ended by signal `n` (or as if by it, for a closed stdout): the shell's 128 + n.
    Signalled(i32),
}

impl Exit {
    /// The process's exit status.
    pub fn code(self) -> i32 {
        match self {
            Exit::Done => 0,
            Exit::Violation => 1,
            Exit::Usage => 2,
            Exit::Undecided => 3,
            Exit::CouldNotRun => 4,
            Exit::Signalled(signal) => 128 + signal,
        }
    }

    /// How an error ends a command: the command line's mistake, or a run that could not go on.
    pub fn of_error(err: &anyhow::Error) -> Exit {
        if err.downcast_ref::<UsageError>().is_some() {
            Exit::Usage
        } else {
            Exit::CouldNotRun
        }
    }
}

impl From<Exit> for std::process::ExitCode {
    fn from(exit: Exit) -> Self {
        // Every code above fits a byte (signals go up to 64, and 128 + 64 < 256).
        std::process::ExitCode::from(exit.code() as u8)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes scripts read: tools' 1 violation, 3 undecided, 4 could not run; 2 usage.
    #[test]
    fn each_code_means_one_thing() {
        let all = [
            Exit::Done,
            Exit::Violation,
            Exit::Usage,
            Exit::Undecided,
            Exit::CouldNotRun,
        ];
        let codes: Vec<i32> = all.iter().map(|e| e.code()).collect();
        assert_eq!(codes, [0, 1, 2, 3, 4]);
        assert_eq!(Exit::Signalled(2).code(), 130);
        assert_eq!(Exit::Signalled(13).code(), 141);
        let usage = anyhow::Error::new(UsageError("--ttl 2: no unit".into()));
        assert_eq!(Exit::of_error(&usage), Exit::Usage);
        assert_eq!(
            Exit::of_error(&anyhow::anyhow!("refused")),
            Exit::CouldNotRun
        );
    }
}
