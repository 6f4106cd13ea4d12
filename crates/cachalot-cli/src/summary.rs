//! `cachalot summary RUN`: the memory summary table of a run replayed on a
//! simulated device, and optionally its snapshot as a PyTorch pickle or
//! cachalot JSON.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use cachalot::event::Observer;
use cachalot::history::{History, HistoryConfig};
use cachalot::snapshot_io::{self, SnapshotDump, SnapshotIoError};
use cachalot::summary::memory_summary_with;

use crate::input::{self, ReplayArgs};
use crate::output::{is_stdout, Output};
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
    /// snapshot pickle (for `python3 -m torch.cuda._memory_viz`); `-` writes
    /// it to standard output (and the table to standard error).
    #[arg(long, value_name = "FILE")]
    pickle: Option<PathBuf>,
    /// Also write them as cachalot JSON (`docs/snapshot-schema.md`); `-` as
    /// for `--pickle`.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// The most events the snapshot files keep (the most recent ones, as
    /// PyTorch's `max_entries`); the table counts every event.
    #[arg(long, default_value_t = 1 << 22, value_name = "N")]
    max_events: usize,
    #[command(flatten)]
    replay: ReplayArgs,
}

/// Runs the subcommand.
pub(crate) fn run(args: &Args, out: &mut Output) -> Result<ExitCode, CliError> {
    let files = args.pickle.is_some() || args.json.is_some();
    let piped = [&args.pickle, &args.json]
        .into_iter()
        .filter(|p| p.as_deref().is_some_and(is_stdout))
        .count();
    if piped > 1 {
        return Err(CliError::Usage(
            "only one of --pickle and --json can go to standard output",
        ));
    }
    let history = files.then(|| {
        Arc::new(History::new(HistoryConfig {
            capacity: args.max_events,
            ..HistoryConfig::default()
        }))
    });
    let observer = history.clone().map(|h| h as Arc<dyn Observer>);
    let run =
        input::replay(&args.input, &args.replay, observer).map_err(CliError::input(&args.input))?;
    let device = run.allocator.backend().capabilities().device;
    let table = format!(
        "{}\n{}",
        run.describe(),
        memory_summary_with(&run.allocator.stats(), device, args.abbreviated)
    );
    if piped == 0 {
        out.text(&table)?;
    } else {
        eprint!("{table}");
    }
    let Some(history) = history else {
        return Ok(ExitCode::SUCCESS);
    };
    let dump = SnapshotDump::capture(run.allocator.as_ref(), Some(&history));
    if history.dropped() > 0 {
        eprintln!(
            "note: the snapshot files keep the last {} of {} events (--max-events)",
            dump.trace.len(),
            dump.trace.len() as u64 + history.dropped()
        );
    }
    if let Some(path) = &args.pickle {
        write(out, path, |o| snapshot_io::pickle::write(&dump, o))?;
    }
    if let Some(path) = &args.json {
        write(out, path, |o| snapshot_io::json::write(&dump, o))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes a snapshot file with `write`: to `path` (gzip when it ends in
/// `.gz`), or to standard output for `-`.
fn write(
    out: &mut Output,
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> Result<(), SnapshotIoError>,
) -> Result<(), CliError> {
    if is_stdout(path) {
        return match write(out.writer()) {
            Err(SnapshotIoError::Io(e)) => Err(CliError::Output(e.into())),
            other => other.map_err(write_failed(path)),
        };
    }
    snapshot_io::write_path(path, write).map_err(write_failed(path))
}

/// Wraps a failure to write the snapshot file `path`.
fn write_failed(path: &Path) -> impl FnOnce(SnapshotIoError) -> CliError + '_ {
    move |source| CliError::WriteSnapshot {
        path: path.to_path_buf(),
        source,
    }
}
