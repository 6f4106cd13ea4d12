//! `cachalot compare TRACE... [--passes N]`: each recording replayed under
//! PyTorch's native allocator, PyTorch with expandable segments, and the
//! cachalot policy, side by side; with `--passes`, pass after pass (as
//! `cachalot replay --passes` does), with the pass each one settled from.

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use cachalot::error::format_bytes;
use cachalot::replay::{Device, ReplayReport};
use cachalot::AllocatorConfig;
use serde::Serialize;

use crate::input::load;
use crate::output::{Output, OutputError};
use crate::replay::{parse_passes, replay_passes};
use crate::{report_error, CliError};

/// The configurations compared: a label and a configuration string.
const CONFIGS: [(&str, &str); 3] = [
    ("pytorch native", ""),
    ("pytorch expandable_segments", "expandable_segments:True"),
    ("cachalot", "policy:cachalot"),
];

/// Arguments of `cachalot compare`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Trace CSVs or snapshot pickles, plain or gzip.
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Simulated device size, 2 MiB to 256 TiB: bytes or a number with a unit
    /// (80GiB, 24GB); default: each recording's device.
    #[arg(long, value_parser = crate::capacity::parse)]
    capacity: Option<u64>,
    /// Print a JSON array of rows instead of a table.
    #[arg(long)]
    json: bool,
    /// Of snapshots of several devices, the device to replay.
    #[arg(long, value_name = "N")]
    snapshot_device: Option<usize>,
    /// Run each recording this many times in a row on one allocator (1 to
    /// 10000), as `cachalot replay --passes` does.
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_passes)]
    passes: NonZeroUsize,
}

/// One row: a recording under one configuration.
#[derive(Debug, Serialize)]
struct Row {
    trace: String,
    config: String,
    #[serde(flatten)]
    result: Outcome,
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Outcome {
    Replayed(Box<ReplayReport>),
    Failed { error: String },
}

/// Runs the subcommand.
pub(crate) fn run(args: &Args, out: &mut Output) -> Result<ExitCode, CliError> {
    let mut rows = Vec::new();
    let mut ok = true;
    for path in &args.traces {
        let name = path.file_name().map_or_else(
            || crate::output::shown(path),
            |n| crate::output::printable(&n.to_string_lossy()),
        );
        let loaded = load(path, args.snapshot_device).and_then(|loaded| {
            // Compare runs fixed configurations: only the device can be unknown.
            loaded.note_defaults(args.capacity.is_some(), true);
            let capacity = args
                .capacity
                .map_or_else(|| loaded.recorded_capacity(), Ok)?;
            Ok((loaded, capacity))
        });
        let (loaded, capacity) = match loaded {
            Ok(l) => l,
            Err(e) => {
                report_error(&CliError::input(path)(e));
                ok = false;
                continue;
            }
        };
        for (label, conf) in CONFIGS {
            let result = AllocatorConfig::parse(conf)
                .map_err(Into::into)
                .and_then(|config| {
                    let device = Device::Simulated { capacity };
                    replay_passes(&loaded, config, device, args.passes, label)
                });
            let result = match result {
                Ok(r) => Outcome::Replayed(Box::new(r)),
                Err(e) => Outcome::Failed {
                    error: e.to_string(),
                },
            };
            rows.push(Row {
                trace: name.clone(),
                config: label.to_string(),
                result,
            });
        }
    }
    if args.json {
        out.json(&rows)?;
    } else {
        print_table(out, &rows, args.passes.get() > 1)?;
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The table; with `passes`, a last column says from which pass each replay
/// made no driver call.
fn print_table(out: &mut Output, rows: &[Row], passes: bool) -> Result<(), OutputError> {
    let mut header = vec![
        "trace",
        "config",
        "peak requested",
        "peak reserved",
        "ratio",
        "segment allocs",
        "driver calls",
        "ooms",
    ];
    if passes {
        header.push("settled from pass");
    }
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|s| s.to_string()).collect()];
    let mut errors = Vec::new();
    for row in rows {
        let mut line = vec![row.trace.clone(), row.config.clone()];
        match &row.result {
            Outcome::Replayed(r) => {
                line.extend([
                    format_bytes(r.peak_requested_bytes),
                    format_bytes(r.peak_reserved_bytes),
                    format!("{:.4}", r.fragmentation()),
                    r.segment_allocs.to_string(),
                    r.driver_calls.to_string(),
                    r.ooms.to_string(),
                ]);
                if passes {
                    line.push(
                        r.settled_at()
                            .map_or("never".into(), |k| (k + 1).to_string()),
                    );
                }
            }
            Outcome::Failed { error } => errors.push((cells.len(), format!("n/a: {error}"))),
        }
        cells.push(line);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            cells
                .iter()
                .filter_map(|l| l.get(c))
                .map(String::len)
                .max()
                .unwrap_or(0)
        })
        .collect();
    for (i, line) in cells.iter().enumerate() {
        let mut text: Vec<String> = line
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                if c < 2 {
                    format!("{cell:<w$}", w = widths[c])
                } else {
                    format!("{cell:>w$}", w = widths[c])
                }
            })
            .collect();
        if let Some((_, error)) = errors.iter().find(|(at, _)| *at == i) {
            text.push(error.clone());
        }
        out.line(text.join("  ").trim_end())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachalot::PolicyKind;

    #[test]
    fn the_compared_configurations_parse() {
        let policies: Vec<_> = CONFIGS
            .iter()
            .map(|(_, c)| AllocatorConfig::parse(c).ok().map(|c| c.policy))
            .collect();
        assert_eq!(
            policies,
            [
                Some(PolicyKind::Pytorch),
                Some(PolicyKind::Pytorch),
                Some(PolicyKind::Cachalot)
            ]
        );
    }
}
