//! `cachalot summary RUN`: the memory summary table of a run replayed on a
//! simulated device, and optionally its snapshot as a PyTorch pickle or
//! cachalot JSON.

use std::path::PathBuf;

use cachalot::snapshot_io::{self, SnapshotIoError};
use cachalot::summary::memory_summary_with;
use thiserror::Error;

use crate::input::{self, InputError, ReplayArgs};

/// Arguments of `cachalot summary`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A trace CSV, a PyTorch snapshot pickle or a cachalot JSON snapshot (plain or gzip).
    input: PathBuf,
    /// Leave out the per-pool rows.
    #[arg(long)]
    abbreviated: bool,
    /// Also write the final snapshot and the recorded events as a PyTorch
    /// snapshot pickle (for `python3 -m torch.cuda._memory_viz`).
    #[arg(long, value_name = "FILE")]
    pickle: Option<PathBuf>,
    /// Also write them as cachalot JSON (`docs/snapshot-schema.md`).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    #[command(flatten)]
    replay: ReplayArgs,
}

/// `cachalot summary` failed.
#[derive(Debug, Error)]
pub(crate) enum SummaryError {
    /// The input did not load or replay.
    #[error(transparent)]
    Input(#[from] InputError),
    /// A snapshot file could not be written.
    #[error("{path}: {source}")]
    Write {
        /// The output file.
        path: PathBuf,
        /// Why.
        source: SnapshotIoError,
    },
}

pub(crate) fn run(args: &Args) -> Result<(), SummaryError> {
    let run = input::load(&args.input, &args.replay)?;
    println!("{}", run.describe());
    print!(
        "{}",
        memory_summary_with(&run.stats, run.dump.device, args.abbreviated)
    );
    if let Some(path) = &args.pickle {
        snapshot_io::pickle::write_file(&run.dump, path).map_err(|source| SummaryError::Write {
            path: path.clone(),
            source,
        })?;
    }
    if let Some(path) = &args.json {
        snapshot_io::json::write_file(&run.dump, path).map_err(|source| SummaryError::Write {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}
