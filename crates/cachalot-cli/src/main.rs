//! The `cachalot` command.

mod compare;
mod input;
mod parity;
mod progress;
mod replay;
mod summary;
mod view;

use std::process::ExitCode;

use clap::Parser;

/// cachalot: a caching GPU memory manager, its parity checks and its memory reports.
#[derive(Debug, Parser)]
#[command(version, about)]
enum Cli {
    /// Replay PyTorch golden scenarios through the `pytorch` policy on a simulated
    /// H100 and compare every statistic after every step.
    Parity(parity::Args),
    /// Replay a recorded PyTorch trace or snapshot on a simulated device and report
    /// peak memory, device segments and driver calls.
    Replay(replay::Args),
    /// Replay recordings under PyTorch native, PyTorch expandable segments and the
    /// cachalot policy, side by side.
    Compare(compare::Args),
    /// Print the memory summary table of a run (and optionally write its snapshot).
    Summary(summary::Args),
    /// Write a self-contained HTML page of a run's memory over time.
    View(view::Args),
}

fn main() -> ExitCode {
    match Cli::parse() {
        Cli::Parity(args) => parity::run(&args),
        Cli::Replay(args) => replay::run(&args),
        Cli::Compare(args) => compare::run(&args),
        Cli::Summary(args) => exit_code(summary::run(&args)),
        Cli::View(args) => exit_code(view::run(&args)),
    }
}

/// Prints an error, if any, and turns the result into the exit status.
fn exit_code<E: std::fmt::Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cachalot: {e}");
            ExitCode::FAILURE
        }
    }
}
