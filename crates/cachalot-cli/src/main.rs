//! The `cachalot` command.

mod parity;

use std::process::ExitCode;

use clap::Parser;

/// cachalot: a caching GPU memory manager, its parity checks and its memory reports.
#[derive(Debug, Parser)]
#[command(version, about)]
enum Cli {
    /// Replay PyTorch golden scenarios through the `pytorch` policy on a simulated
    /// H100 and compare every statistic after every step.
    Parity(parity::Args),
}

fn main() -> ExitCode {
    match Cli::parse() {
        Cli::Parity(args) => parity::run(&args),
    }
}
