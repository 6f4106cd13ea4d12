//! The one path by which the subcommands write their results to standard
//! output. A reader that stops early (`cachalot parity ... | head -1`) closes
//! the pipe: that is [`OutputError::Closed`], which ends the command quietly
//! with status 0. Any other write failure (a full disk) is
//! [`OutputError::Write`], an error like any other.

use std::fmt::Display;
use std::io::{self, Write};

use serde::Serialize;
use thiserror::Error;

/// `text` with every control character but the newline written as an
/// escape (`\u{1b}`), so a file name or a field of a hostile input cannot
/// drive the terminal it is shown on.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A path as shown to the user: [`printable`].
pub(crate) fn shown(path: &std::path::Path) -> String {
    printable(&path.display().to_string())
}

/// Whether `path` names standard output (`-`).
pub(crate) fn is_stdout(path: &std::path::Path) -> bool {
    path == std::path::Path::new("-")
}

/// The results could not be written.
#[derive(Debug, Error)]
pub(crate) enum OutputError {
    /// The reader closed the pipe: nobody wants the rest. Not a failure.
    #[error("standard output was closed")]
    Closed,
    /// Writing failed otherwise (a full disk, say).
    #[error("cannot write to standard output: {0}")]
    Write(#[source] io::Error),
    /// A result could not be encoded as JSON.
    #[error("cannot encode the result as JSON: {0}")]
    Json(#[source] serde_json::Error),
}

impl From<io::Error> for OutputError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::BrokenPipe {
            OutputError::Closed
        } else {
            OutputError::Write(e)
        }
    }
}

/// Where results go: standard output (line-buffered), or any writer in tests.
pub(crate) struct Output<W = io::Stdout> {
    out: W,
}

impl Output {
    /// Standard output.
    pub(crate) fn stdout() -> Output {
        Output { out: io::stdout() }
    }
}

impl<W: Write> Output<W> {
    /// Writes `text` and a newline.
    pub(crate) fn line(&mut self, text: impl Display) -> Result<(), OutputError> {
        writeln!(self.out, "{text}")?;
        Ok(())
    }

    /// The writer itself, for output written in pieces (a CSV).
    pub(crate) fn writer(&mut self) -> &mut W {
        &mut self.out
    }

    /// Writes `text` as it is.
    pub(crate) fn text(&mut self, text: &str) -> Result<(), OutputError> {
        self.out.write_all(text.as_bytes())?;
        Ok(())
    }

    /// Writes `value` as pretty JSON and a newline.
    pub(crate) fn json(&mut self, value: &impl Serialize) -> Result<(), OutputError> {
        let text = serde_json::to_string_pretty(value).map_err(OutputError::Json)?;
        self.line(text)
    }

    /// Writes out what is buffered.
    pub(crate) fn flush(&mut self) -> Result<(), OutputError> {
        self.out.flush()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that fails every write with `kind`.
    struct Failing(io::ErrorKind);

    impl Write for Failing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(self.0.into())
        }

        fn flush(&mut self) -> io::Result<()> {
            Err(self.0.into())
        }
    }

    #[test]
    fn a_closed_pipe_is_told_apart_from_other_failures() {
        let mut closed = Output {
            out: Failing(io::ErrorKind::BrokenPipe),
        };
        assert!(matches!(closed.line("x"), Err(OutputError::Closed)));
        assert!(matches!(closed.flush(), Err(OutputError::Closed)));
        let mut full = Output {
            out: Failing(io::ErrorKind::StorageFull),
        };
        assert!(matches!(full.text("x"), Err(OutputError::Write(_))));
    }

    #[test]
    fn json_is_pretty_and_ends_its_line() {
        let mut out = Output { out: Vec::new() };
        out.json(&serde_json::json!({"a": 1})).unwrap();
        assert_eq!(String::from_utf8(out.out).unwrap(), "{\n  \"a\": 1\n}\n");
    }
}
