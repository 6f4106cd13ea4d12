//! `cachalot view RUN -o page.html`: the memory page of a run, replayed on a
//! simulated device with history recording on.

use std::path::PathBuf;

use cachalot::view::{self, PageInfo, Timeline};
use thiserror::Error;

use crate::input::{self, InputError, ReplayArgs};

/// Arguments of `cachalot view`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A trace CSV, a PyTorch snapshot pickle or a cachalot JSON snapshot (plain or gzip).
    input: PathBuf,
    /// Where to write the page.
    #[arg(short, long, default_value = "memory.html")]
    output: PathBuf,
    #[command(flatten)]
    replay: ReplayArgs,
}

/// `cachalot view` failed.
#[derive(Debug, Error)]
pub(crate) enum ViewError {
    /// The input did not load or replay.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The page could not be written.
    #[error("{path}: {source}")]
    Write {
        /// The output file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

pub(crate) fn run(args: &Args) -> Result<(), ViewError> {
    let run = input::load(&args.input, &args.replay)?;
    let timeline = Timeline::from_records(
        run.dump
            .trace
            .iter()
            .map(|r| (&r.event, r.frames.as_slice())),
    );
    let title = args.input.file_name().map_or_else(
        || "memory".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let info = PageInfo {
        title,
        subtitle: run.describe(),
    };
    let html = view::render(&timeline, &info);
    std::fs::write(&args.output, html).map_err(|source| ViewError::Write {
        path: args.output.clone(),
        source,
    })?;
    println!(
        "wrote {}: {} events, {} allocations, peak active {} bytes at event {}, peak reserved {} bytes",
        args.output.display(),
        timeline.times_us.len(),
        timeline.allocs.len(),
        timeline.peak_bytes,
        timeline.peak_index,
        timeline.peak_reserved(),
    );
    Ok(())
}
