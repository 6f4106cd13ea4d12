//! `cachalot replay TRACE [--policy P] [--conf CONF] [--capacity BYTES]
//! [--device sim|cuda:N] [--passes N] [--json]`: replays a recorded trace or
//! snapshot on a simulated device (or a GPU) and reports peaks, device segments
//! and driver calls (a table, or one JSON object). With `--passes`, the
//! recording runs again and again on the one allocator, as a training loop or
//! a server repeats it, and the report says what each pass cost and from which
//! pass on the driver was no longer called.

use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cachalot::error::format_bytes;
use cachalot::replay::{self, Device, PassReport, ReplayReport};
use cachalot::{AllocatorConfig, PolicyKind};

use crate::input::{load, InputError, Loaded};
use crate::output::{Output, OutputError};
use crate::target::{self, Target};
use crate::{capacity, progress, CliError};

/// Arguments of `cachalot replay`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A trace CSV or snapshot pickle, plain or gzip.
    trace: PathBuf,
    /// The policy to replay with (default: the configuration's, else `pytorch`).
    #[arg(long)]
    policy: Option<PolicyKind>,
    /// The allocator configuration (`PYTORCH_CUDA_ALLOC_CONF` syntax); default: the
    /// recorded one.
    #[arg(long)]
    conf: Option<String>,
    /// Simulated device size, 2 MiB to 256 TiB: bytes or a number with a unit
    /// (80GiB, 24GB); default: the recorded device's (an H100 80GB when unknown).
    #[arg(long, value_parser = capacity::parse)]
    capacity: Option<u64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Where to replay: `sim` (a simulated device) or `cuda:N` (GPU N, through
    /// the CUDA driver; the recording's memory is really allocated, never touched).
    #[arg(long, default_value = "sim", value_parser = target::parse)]
    device: Target,
    /// Of a snapshot of several devices, the device to replay.
    #[arg(long, value_name = "N")]
    snapshot_device: Option<usize>,
    /// Run the recording this many times in a row on one allocator (1 to
    /// 10000), freeing what each pass leaves allocated before the next, as a
    /// training loop or a server repeats its work.
    #[arg(long, value_name = "N", default_value = "1", value_parser = parse_passes)]
    passes: NonZeroUsize,
}

/// The most passes `--passes` accepts.
const MAX_PASSES: usize = 10_000;

/// `--passes`: a count from 1 to [`MAX_PASSES`].
pub(crate) fn parse_passes(text: &str) -> Result<NonZeroUsize, String> {
    text.parse::<usize>()
        .ok()
        .and_then(NonZeroUsize::new)
        .filter(|n| n.get() <= MAX_PASSES)
        .ok_or_else(|| format!("'{text}' is not a number of passes from 1 to {MAX_PASSES}"))
}

/// Replays `loaded` under `config` on `device` `passes` times in a row, with
/// a progress bar.
pub(crate) fn replay_passes(
    loaded: &Loaded,
    config: AllocatorConfig,
    device: Device,
    passes: NonZeroUsize,
    label: &str,
) -> Result<ReplayReport, InputError> {
    let ops = loaded.plan.ops.len() as u64 * passes.get() as u64;
    let bar = progress::bar(ops, label);
    let plan = &loaded.plan;
    let replayed = replay::replay_passes_on(plan, config, device, passes, None, &mut |done| {
        bar.set_position(done as u64)
    });
    bar.finish_and_clear();
    Ok(replayed?.report)
}

/// Runs the subcommand.
pub(crate) fn run(args: &Args, out: &mut Output) -> Result<ExitCode, CliError> {
    let report = report(args).map_err(CliError::input(&args.trace))?;
    if args.json {
        out.json(&report)?;
    } else {
        print_table(out, &args.trace, &report)?;
    }
    crate::input::print_first_oom(&report);
    Ok(ExitCode::SUCCESS)
}

fn report(args: &Args) -> Result<ReplayReport, InputError> {
    let mut loaded = load(&args.trace, args.snapshot_device)?;
    let gpu = matches!(args.device, Target::Cuda(_));
    loaded.note_defaults(args.capacity.is_some() || gpu, args.conf.is_some());
    let config = loaded.config(args.conf.as_deref(), args.policy)?;
    let device = match args.device {
        Target::Sim => Device::Simulated {
            capacity: args
                .capacity
                .map_or_else(|| loaded.recorded_capacity(), Ok)?,
        },
        Target::Cuda(_) if args.capacity.is_some() => return Err(InputError::CapacityOnGpu),
        Target::Cuda(ordinal) => target::open_cuda(ordinal, &mut loaded.plan)?,
    };
    replay_passes(&loaded, config, device, args.passes, "replay")
}

fn print_table(out: &mut Output, trace: &Path, r: &ReplayReport) -> Result<(), OutputError> {
    let conf = if r.conf.is_empty() {
        "(default)"
    } else {
        r.conf.as_str()
    };
    let bytes = |n: u64| format!("{} ({n} bytes)", format_bytes(n));
    let mut rows: Vec<(&str, String)> = vec![
        ("trace", crate::output::shown(trace)),
        ("policy", r.policy.clone()),
        ("conf", conf.to_string()),
        ("device", r.device.clone()),
        ("capacity", bytes(r.capacity)),
        ("events", r.events.to_string()),
        ("allocs", r.allocs.to_string()),
        ("frees", r.frees.to_string()),
        ("empty_cache calls", r.empty_caches.to_string()),
        ("peak requested", bytes(r.peak_requested_bytes)),
        ("peak allocated", bytes(r.peak_allocated_bytes)),
        ("peak reserved", bytes(r.peak_reserved_bytes)),
        ("reserved / requested", format!("{:.3}", r.fragmentation())),
        ("segment allocs", r.segment_allocs.to_string()),
        ("driver calls", r.driver_calls.to_string()),
        ("ooms", r.ooms.to_string()),
        ("ns per event", format!("{:.1}", r.ns_per_event)),
    ];
    if let Some(note) = r.inferred.describe() {
        rows.push(("inferred", note));
    }
    if r.passes.len() > 1 {
        rows.extend(pass_rows(&r.passes, r.settled_at()));
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (key, value) in rows {
        out.line(format_args!("{key:<width$}  {value}"))?;
    }
    let calls: Vec<String> = r
        .device_calls
        .iter()
        .map(|(k, n)| format!("{k}={n}"))
        .collect();
    out.line(format_args!(
        "{:<width$}  {}",
        "device calls",
        calls.join(" ")
    ))
}

/// The table's rows for several passes: their count, each one's driver calls
/// and reserved bytes at its end, and whether the workload settled.
fn pass_rows(passes: &[PassReport], settled: Option<usize>) -> Vec<(&'static str, String)> {
    let calls: Vec<u64> = passes.iter().map(|p| p.driver_calls).collect();
    let reserved: Vec<u64> = passes.iter().map(|p| p.reserved_bytes).collect();
    let settled = match settled {
        Some(0) => "from the first pass: no driver call".to_string(),
        Some(k) => format!("from pass {} on, no driver call", k + 1),
        None => format!(
            "no: the last pass made {} driver calls",
            calls[calls.len() - 1]
        ),
    };
    vec![
        ("passes", passes.len().to_string()),
        ("driver calls by pass", in_runs(&calls, |n| n.to_string())),
        ("reserved by pass", in_runs(&reserved, format_bytes)),
        ("settled", settled),
    ]
}

/// `values` in order, each run of three or more equal ones written once with
/// its length ("228, 22, 0 x18").
fn in_runs(values: &[u64], show: impl Fn(u64) -> String) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < values.len() {
        let run = values[i..].iter().take_while(|v| **v == values[i]).count();
        if run >= 3 {
            parts.push(format!("{} x{run}", show(values[i])));
        } else {
            parts.extend(values[i..i + run].iter().map(|v| show(*v)));
        }
        i += run;
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_three_or_more_are_written_once() {
        let n = |v: u64| v.to_string();
        assert_eq!(in_runs(&[228, 22, 0, 0, 0], n), "228, 22, 0 x3");
        assert_eq!(in_runs(&[5, 5, 1, 1, 1, 1, 2], n), "5, 5, 1 x4, 2");
        assert_eq!(in_runs(&[], n), "");
    }

    #[test]
    fn passes_are_a_count_from_one_to_the_limit() {
        assert_eq!(parse_passes("20").map(NonZeroUsize::get), Ok(20));
        for bad in ["0", "-1", "x", "10001", ""] {
            let err = parse_passes(bad).unwrap_err();
            assert!(err.contains("from 1 to 10000"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_pass_rows_say_where_the_workload_settled() {
        let pass = |driver_calls, reserved_bytes| PassReport {
            driver_calls,
            reserved_bytes,
            peak_reserved_bytes: reserved_bytes,
        };
        let passes = [
            pass(228, 426 << 20),
            pass(22, 448 << 20),
            pass(0, 448 << 20),
        ];
        let rows = pass_rows(&passes, Some(2));
        assert_eq!(rows[1].1, "228, 22, 0");
        assert_eq!(rows[3].1, "from pass 3 on, no driver call");
        let rows = pass_rows(&passes[..2], None);
        assert_eq!(rows[3].1, "no: the last pass made 22 driver calls");
    }
}
