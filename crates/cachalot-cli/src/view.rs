//! `cachalot view RUN -o page.html`: the memory page of a run, replayed on a
//! simulated device with history recording on.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use cachalot::view::{self, PageInfo, TimelineRecorder};

use crate::input::{self, ReplayArgs};
use crate::output::{is_stdout, Output};
use crate::CliError;
use cachalot::error::format_bytes;

/// Arguments of `cachalot view`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A trace CSV, a PyTorch snapshot pickle or a cachalot JSON snapshot (plain or gzip).
    input: PathBuf,
    /// Where to write the page (`-`: standard output).
    #[arg(short, long, default_value = "memory.html")]
    output: PathBuf,
    #[command(flatten)]
    replay: ReplayArgs,
}

/// Runs the subcommand.
pub(crate) fn run(args: &Args, out: &mut Output) -> Result<ExitCode, CliError> {
    let recorder = Arc::new(TimelineRecorder::new());
    let run = input::replay(&args.input, &args.replay, Some(recorder.clone()))
        .map_err(CliError::input(&args.input))?;
    let timeline = recorder.finish();
    let title = args.input.file_name().map_or_else(
        || "memory".to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let info = PageInfo {
        title,
        subtitle: run.describe(),
    };
    let html = view::render(&timeline, &info);
    let line = format!(
        "wrote {}: {} recorded events replayed ({} allocator events drawn), {} allocations, \
         peak active {} ({} bytes) at event {}, peak reserved {} ({} bytes)",
        crate::output::shown(&args.output),
        run.report.events,
        timeline.times_us.len(),
        timeline.allocs.len(),
        format_bytes(timeline.peak_bytes),
        timeline.peak_bytes,
        timeline.peak_index,
        format_bytes(timeline.peak_reserved()),
        timeline.peak_reserved(),
    );
    if is_stdout(&args.output) {
        out.text(&html)?;
        eprintln!("{line}");
    } else {
        std::fs::write(&args.output, html).map_err(|source| CliError::WriteFile {
            path: args.output.clone(),
            source,
        })?;
        out.line(line)?;
    }
    Ok(ExitCode::SUCCESS)
}
