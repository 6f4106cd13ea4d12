//! The `cachalot` command.

use clap::Parser;

/// cachalot: a caching GPU memory manager, its parity checks and its memory reports.
#[derive(Debug, Parser)]
#[command(version, about)]
enum Cli {}

fn main() {
    let _ = Cli::parse();
}
