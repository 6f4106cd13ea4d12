//! `cachalot replay TRACE [--policy P] [--conf CONF] [--capacity BYTES]
//! [--device sim|cuda:N] [--json]`: replays a recorded trace or snapshot on a
//! simulated device (or a GPU) and reports peaks, device segments and driver
//! calls (a table, or one JSON object).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use cachalot::error::format_size;
use cachalot::replay::{self, Device, ReplayReport};
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
}

/// Replays `loaded` under `config` on `device`, with a progress bar.
pub(crate) fn replay_one(
    loaded: &Loaded,
    config: AllocatorConfig,
    device: Device,
    label: &str,
) -> Result<ReplayReport, InputError> {
    let bar = progress::bar(loaded.plan.ops.len() as u64, label);
    let replayed = replay::replay_on(&loaded.plan, config, device, None, &mut |done| {
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
    replay_one(&loaded, config, device, "replay")
}

fn print_table(out: &mut Output, trace: &Path, r: &ReplayReport) -> Result<(), OutputError> {
    let conf = if r.conf.is_empty() {
        "(default)"
    } else {
        r.conf.as_str()
    };
    let bytes = |n: u64| format!("{} ({n} bytes)", format_size(n));
    let rows: Vec<(&str, String)> = vec![
        ("trace", trace.display().to_string()),
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
