//! `cachalot summary RUN`: the memory summary table of a run replayed on a
//! simulated device, and optionally its snapshot as a PyTorch pickle or
//! cachalot JSON.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cachalot::snapshot_io::{self, SnapshotIoError};
use cachalot::summary::memory_summary_with;

use crate::input::{self, ReplayArgs};
use crate::output::Output;
use crate::CliError;

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

/// Runs the subcommand.
pub(crate) fn run(args: &Args, out: &mut Output) -> Result<ExitCode, CliError> {
    let run = input::replay(&args.input, &args.replay).map_err(CliError::input(&args.input))?;
    out.line(run.describe())?;
    out.text(&memory_summary_with(
        &run.stats,
        run.dump.device,
        args.abbreviated,
    ))?;
    if let Some(path) = &args.pickle {
        snapshot_io::pickle::write_file(&run.dump, path).map_err(write_failed(path))?;
    }
    if let Some(path) = &args.json {
        snapshot_io::json::write_file(&run.dump, path).map_err(write_failed(path))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Wraps a failure to write the snapshot file `path`.
fn write_failed(path: &Path) -> impl FnOnce(SnapshotIoError) -> CliError + '_ {
    move |source| CliError::WriteSnapshot {
        path: path.to_path_buf(),
        source,
    }
}
