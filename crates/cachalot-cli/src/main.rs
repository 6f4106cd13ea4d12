//! The `cachalot` command.

mod capacity;
mod compare;
mod input;
mod output;
mod parity;
mod progress;
mod replay;
mod summary;
mod synth;
mod target;
mod tune;
mod view;

use std::fmt::Display;
use std::path::PathBuf;
use std::process::ExitCode;

use cachalot::snapshot_io::SnapshotIoError;
use clap::Parser;
use thiserror::Error;

use crate::input::InputError;
use crate::output::{Output, OutputError};

/// cachalot: a caching GPU memory manager, its parity checks and its memory reports.
#[derive(Debug, Parser)]
#[command(name = "cachalot", version, about)]
enum Cli {
    /// Replay PyTorch golden scenarios through the `pytorch` policy on a simulated
    /// H100 and compare every statistic after every step.
    Parity(parity::Args),
    /// Replay a recorded PyTorch trace or snapshot on a simulated device (or a GPU)
    /// and report peak memory, device segments and driver calls.
    Replay(replay::Args),
    /// Replay recordings under PyTorch native, PyTorch expandable segments and the
    /// cachalot policy, side by side.
    Compare(compare::Args),
    /// Print the memory summary table of a run (and optionally write its snapshot).
    Summary(summary::Args),
    /// Write a self-contained HTML page of a run's memory over time.
    View(view::Args),
    /// Replay a recording under many allocator settings, rank them, say the
    /// smallest device each leader needs, and print the setting to use.
    Tune(tune::Args),
    /// Write a seeded random recording of any size (a trace CSV or a snapshot
    /// pickle), for tests and benchmarks.
    Synth(synth::Args),
}

/// Why a subcommand stopped.
#[derive(Debug, Error)]
pub(crate) enum CliError {
    /// Its results could not be written to standard output.
    #[error(transparent)]
    Output(#[from] OutputError),
    /// An input did not load or replay.
    #[error("{path}: {source}")]
    Input {
        /// The input file.
        path: PathBuf,
        /// Why.
        source: InputError,
    },
    /// A snapshot file it was asked for could not be written.
    #[error("{path}: {source}")]
    WriteSnapshot {
        /// The output file.
        path: PathBuf,
        /// Why.
        source: SnapshotIoError,
    },
    /// Options that do not go together.
    #[error("{0}")]
    Usage(&'static str),
    /// A file it was asked for (a page, a recording) could not be written.
    #[error("{path}: {source}")]
    WriteFile {
        /// The output file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

impl CliError {
    /// Wraps an input error with the file it came from.
    pub(crate) fn input(path: &std::path::Path) -> impl FnOnce(InputError) -> CliError + '_ {
        move |source| CliError::Input {
            path: path.to_path_buf(),
            source,
        }
    }
}

fn main() -> ExitCode {
    let mut out = Output::stdout();
    let result = match Cli::parse() {
        Cli::Parity(args) => parity::run(&args, &mut out),
        Cli::Replay(args) => replay::run(&args, &mut out),
        Cli::Compare(args) => compare::run(&args, &mut out),
        Cli::Summary(args) => summary::run(&args, &mut out),
        Cli::View(args) => view::run(&args, &mut out),
        Cli::Tune(args) => tune::run(&args, &mut out),
        Cli::Synth(args) => synth::run(&args, &mut out),
    };
    let flushed = out.flush().map_err(CliError::from);
    match result.and_then(|code| flushed.map(|()| code)) {
        Ok(code) => code,
        Err(CliError::Output(OutputError::Closed)) => ExitCode::SUCCESS,
        Err(e) => {
            report_error(&e);
            ExitCode::FAILURE
        }
    }
}

/// Prints an error on stderr, with the prefix every subcommand uses.
pub(crate) fn report_error(e: &dyn Display) {
    eprintln!("error: {}", output::printable(&e.to_string()));
}
