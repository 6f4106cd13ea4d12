//! Loading a run for the report subcommands: a trace CSV, a PyTorch snapshot
//! pickle or a cachalot JSON snapshot is replayed on a simulated device through
//! a policy, with a [`History`] recording every event, so the reports show
//! what that policy and configuration would do.

use std::path::Path;
use std::sync::Arc;

use cachalot::allocator;
use cachalot::backend::sim::SimBackend;
use cachalot::history::{History, HistoryConfig};
use cachalot::replay::{
    self, RecordedAddresses, RecordedDevice, ReplayError, ReplayReport, Workload, H100_CAPACITY,
};
use cachalot::snapshot_io::{self, SnapshotDump, SnapshotIoError};
use cachalot::trace::{ReadLimits, Recording, TraceError};
use cachalot::{AllocatorConfig, MemoryStats};
use thiserror::Error;

use crate::capacity::{self, CapacityError};

/// A run could not be loaded or replayed.
#[derive(Debug, Error)]
pub(crate) enum InputError {
    /// A trace or PyTorch snapshot that does not read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A cachalot JSON snapshot that does not read.
    #[error(transparent)]
    Snapshot(#[from] SnapshotIoError),
    /// A configuration string that does not parse.
    #[error(transparent)]
    Config(#[from] cachalot::config::ConfigError),
    /// The allocator could not be built (a policy this build lacks, say).
    #[error("cannot build the allocator: {0}")]
    Allocator(#[from] cachalot::Error),
    /// The replay stopped.
    #[error("replay failed: {0}")]
    Replay(#[from] ReplayError),
    /// The recorded device is one a replay cannot simulate.
    #[error("the recorded device: {0}; choose one with --capacity")]
    RecordedCapacity(CapacityError),
}

/// How to replay a run.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// Allocator configuration (`PYTORCH_CUDA_ALLOC_CONF` syntax); default: the
    /// one recorded (in the stats file beside a trace, or in the snapshot).
    #[arg(long)]
    conf: Option<String>,
    /// Simulated device size, 2 MiB to 256 TiB: bytes or a number with a unit
    /// (80GiB, 24GB); default: the recorded device's (an H100 80GB when unknown).
    #[arg(long, value_parser = capacity::parse)]
    capacity: Option<u64>,
    /// Events the history keeps (the most recent ones).
    #[arg(long, default_value_t = 1 << 22)]
    max_events: usize,
}

/// A replayed run.
pub(crate) struct Run {
    /// The allocator's final state and every recorded event.
    pub(crate) dump: SnapshotDump,
    /// Its statistics at the end.
    pub(crate) stats: MemoryStats,
    /// What the replay measured.
    pub(crate) report: ReplayReport,
}

impl Run {
    /// One line on how the run was made.
    pub(crate) fn describe(&self) -> String {
        let conf = if self.report.conf.is_empty() {
            "default configuration"
        } else {
            self.report.conf.as_str()
        };
        format!(
            "replayed {} events through the {} policy ({conf}) on a simulated {}-byte device",
            self.report.events, self.report.policy, self.report.capacity
        )
    }
}

/// What a file recorded: its events and the device and configuration they
/// were recorded with.
struct Recorded {
    recording: Recording,
    conf: String,
    capacity: u64,
}

/// Reads `path` and replays it.
pub(crate) fn load(path: &Path, args: &ReplayArgs) -> Result<Run, InputError> {
    let recorded = read(path)?;
    let device = RecordedDevice::new(recorded.capacity, AllocatorConfig::parse(&recorded.conf)?);
    let plan = replay::plan(&recorded.recording.events, &device).map_err(ReplayError::from)?;
    let config = AllocatorConfig::parse(args.conf.as_deref().unwrap_or(&recorded.conf))?;
    let capacity = match args.capacity {
        Some(bytes) => bytes,
        None => capacity::check(recorded.capacity).map_err(InputError::RecordedCapacity)?,
    };
    let sim = Arc::new(SimBackend::new(capacity));
    // Hand out the recorded segment addresses, so the replay places blocks as
    // the recording did and the page shows the recorded addresses.
    let backend = Arc::new(RecordedAddresses::new(
        sim.clone(),
        plan.recorded_segment_allocs.clone(),
    ));
    let allocator = allocator::create(backend, config)?;
    let history = Arc::new(History::new(HistoryConfig {
        capacity: args.max_events,
        ..HistoryConfig::default()
    }));
    let report = replay::run_observed(
        &plan,
        allocator.as_ref(),
        &sim,
        &mut |_| {},
        Some(history.clone()),
    )?;
    print_first_oom(&report);
    Ok(Run {
        dump: SnapshotDump::capture(allocator.as_ref(), Some(&history)),
        stats: allocator.stats(),
        report,
    })
}

/// Prints, on stderr, how often a replay ran out of memory and the first
/// out-of-memory report with its breakdown and advice.
pub(crate) fn print_first_oom(report: &ReplayReport) {
    if let Some(oom) = &report.first_oom {
        eprintln!(
            "the replay ran out of memory {} times (those allocations were skipped); the first time:\n{}",
            report.ooms,
            cachalot::report::oom::describe(oom)
        );
    }
}

/// The recording in `path`: a cachalot JSON snapshot's events, or a trace CSV
/// or snapshot pickle (plain or gzip) with the stats file beside it, if any.
fn read(path: &Path) -> Result<Recorded, InputError> {
    if is_json(path) {
        let dump = snapshot_io::json::read_file(path)?;
        let conf = dump.config.source.clone();
        let recording = Recording {
            events: dump.events(),
            segments: dump.snapshot.segments,
            conf: Some(conf.clone()),
        };
        return Ok(Recorded {
            recording,
            conf,
            capacity: H100_CAPACITY,
        });
    }
    let workload = Workload::open(path, &ReadLimits::default())?;
    Ok(Recorded {
        conf: workload.recorded_conf().to_string(),
        capacity: workload.recorded_capacity(),
        recording: workload.recording,
    })
}

fn is_json(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    name.ends_with(".json") || name.ends_with(".json.gz")
}
