//! `cachalot summary RUN`: the memory summary table of a run.

use std::path::PathBuf;

use thiserror::Error;

use crate::input::{self, InputError};

/// Arguments of `cachalot summary`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A trace CSV, a PyTorch snapshot pickle or a cachalot JSON snapshot (plain or gzip).
    input: PathBuf,
    /// Leave out the per-pool rows.
    #[arg(long)]
    abbreviated: bool,
}

/// `cachalot summary` failed.
#[derive(Debug, Error)]
pub(crate) enum SummaryError {
    /// The input did not load.
    #[error(transparent)]
    Input(#[from] InputError),
}

pub(crate) fn run(args: &Args) -> Result<(), SummaryError> {
    let dump = input::load(&args.input)?;
    let _ = (dump, args.abbreviated);
    Ok(())
}
