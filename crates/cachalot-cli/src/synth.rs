//! `cachalot synth -o FILE`: a seeded random recording of any size (see
//! [`cachalot::trace::synth`]), written as a trace CSV or a PyTorch snapshot
//! pickle (plain or gzip, by the name's ending; `-` is a CSV on standard
//! output).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cachalot::event::TraceEvent;
use cachalot::snapshot_io::{self, pickle, SnapshotDump, TraceRecord};
use cachalot::trace::csv::HEADER;
use cachalot::trace::synth::{synthesize, SynthSpec};

use crate::output::{is_stdout, Output};
use crate::{capacity, CliError};

/// Arguments of `cachalot synth`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Where to write: `NAME.trace.csv[.gz]`, `NAME.snapshot.pickle[.gz]`
    /// (any name ending in `.pickle` or `.pickle.gz` is a snapshot), or `-`
    /// for a CSV on standard output.
    #[arg(short, long)]
    output: PathBuf,
    /// Events to generate (a number, or with k or M: 5M).
    #[arg(long, default_value = "1M", value_parser = parse_count)]
    events: u64,
    /// The seed: the same options, the same recording.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Smallest request.
    #[arg(long, default_value = "16", value_parser = capacity::size)]
    min_size: u64,
    /// Largest request.
    #[arg(long, default_value = "1GiB", value_parser = capacity::size)]
    max_size: u64,
    /// Most bytes live at once.
    #[arg(long, default_value = "21GiB", value_parser = capacity::size)]
    max_live: u64,
    /// Share of allocations held for long (0 to 1).
    #[arg(long, default_value_t = 0.02)]
    held: f64,
    /// Streams used.
    #[arg(long, default_value_t = 4)]
    streams: u64,
}

/// `5000`, `100k`, `5M`.
fn parse_count(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, scale) = match t.char_indices().last() {
        Some((i, 'k' | 'K')) => (&t[..i], 1_000),
        Some((i, 'm' | 'M')) => (&t[..i], 1_000_000),
        _ => (t, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(scale))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("'{text}' is not a positive count (5000, 100k, 5M)"))
}

/// Runs the subcommand.
pub(crate) fn run(args: &Args, out: &mut Output) -> Result<ExitCode, CliError> {
    let spec = SynthSpec {
        events: args.events,
        seed: args.seed,
        min_size: args.min_size,
        max_size: args.max_size,
        max_live: args.max_live,
        held: args.held.clamp(0.0, 1.0),
        streams: args.streams.max(1),
        ..SynthSpec::default()
    };
    let events = synthesize(&spec);
    let written = if is_stdout(&args.output) {
        write_csv(events, out.writer()).map_err(|e| CliError::Output(e.into()))?
    } else {
        write_file(events, &args.output).map_err(|source| CliError::WriteFile {
            path: args.output.clone(),
            source,
        })?
    };
    if !is_stdout(&args.output) {
        out.line(format_args!(
            "wrote {}: {written} events (seed {})",
            crate::output::shown(&args.output),
            spec.seed
        ))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Writes `events` to `path` in the format its name says.
fn write_file(events: impl Iterator<Item = TraceEvent>, path: &Path) -> std::io::Result<u64> {
    let name = path.to_string_lossy();
    let snapshot = name.trim_end_matches(".gz").ends_with(".pickle");
    snapshot_io::write_path(path, |sink| write_events(events, snapshot, sink))
}

/// Writes `events` to `sink` as a snapshot pickle or a trace CSV.
fn write_events(
    events: impl Iterator<Item = TraceEvent>,
    snapshot: bool,
    sink: &mut dyn Write,
) -> std::io::Result<u64> {
    if snapshot {
        let dump = SnapshotDump {
            trace: events
                .map(|event| TraceRecord {
                    event,
                    frames: Vec::new(),
                })
                .collect(),
            ..SnapshotDump::default()
        };
        pickle::write(&dump, sink).map_err(std::io::Error::other)?;
        Ok(dump.trace.len() as u64)
    } else {
        write_csv(events, sink)
    }
}

/// Writes `events` as a trace CSV; returns how many.
fn write_csv(
    events: impl Iterator<Item = TraceEvent>,
    out: &mut dyn Write,
) -> std::io::Result<u64> {
    writeln!(out, "{HEADER}")?;
    let mut n = 0;
    for e in events {
        writeln!(
            out,
            "{},{},{},{},{}",
            e.time_us, e.action, e.addr, e.size, e.stream.0
        )?;
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_take_k_and_m() {
        assert_eq!(parse_count("5M"), Ok(5_000_000));
        assert_eq!(parse_count("100k"), Ok(100_000));
        assert_eq!(parse_count("42"), Ok(42));
        for bad in ["0", "-1", "M", "1.5M", ""] {
            assert!(parse_count(bad).is_err(), "{bad}");
        }
    }
}
