//! Loading a run for the report subcommands: a trace CSV, a PyTorch snapshot
//! pickle or a cachalot JSON snapshot is replayed on a simulated device through
//! a policy, with a [`History`] recording every event, so the reports show
//! what that policy and configuration would do.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cachalot::backend::sim::SimBackend;
use cachalot::history::{History, HistoryConfig};
use cachalot::policy::PytorchAllocator;
use cachalot::replay::{self, RecordedDevice, ReplayError, ReplayReport, H100_CAPACITY};
use cachalot::snapshot_io::{self, SnapshotDump, SnapshotIoError};
use cachalot::trace::{self, ReadLimits, Recording, TraceError};
use cachalot::{AllocatorConfig, DeviceAllocator, MemoryStats, PolicyKind};
use thiserror::Error;

/// A run could not be loaded or replayed.
#[derive(Debug, Error)]
pub(crate) enum InputError {
    /// A trace or PyTorch snapshot that does not read.
    #[error("{path}: {source}")]
    Trace {
        /// The file.
        path: PathBuf,
        /// Why.
        source: TraceError,
    },
    /// A cachalot JSON snapshot that does not read.
    #[error("{path}: {source}")]
    Snapshot {
        /// The file.
        path: PathBuf,
        /// Why.
        source: SnapshotIoError,
    },
    /// A configuration string that does not parse.
    #[error(transparent)]
    Config(#[from] cachalot::config::ConfigError),
    /// The allocator could not be built (a policy this build lacks, say).
    #[error("cannot build the allocator: {0}")]
    Allocator(#[from] cachalot::Error),
    /// The replay stopped.
    #[error("replay failed: {0}")]
    Replay(#[from] ReplayError),
}

/// How to replay a run.
#[derive(Debug, clap::Args)]
pub(crate) struct ReplayArgs {
    /// Allocator configuration (`PYTORCH_CUDA_ALLOC_CONF` syntax); default: the
    /// one recorded in the file, if any.
    #[arg(long)]
    conf: Option<String>,
    /// Simulated device size in bytes.
    #[arg(long, default_value_t = H100_CAPACITY)]
    capacity: u64,
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

/// Reads `path` and replays it.
pub(crate) fn load(path: &Path, args: &ReplayArgs) -> Result<Run, InputError> {
    let recording = read(path)?;
    let conf = args.conf.clone().or(recording.conf).unwrap_or_default();
    let config = AllocatorConfig::parse(&conf)?;
    let device = RecordedDevice {
        capacity: args.capacity,
        config: config.clone(),
    };
    let plan = replay::plan(&recording.events, &device).map_err(ReplayError::from)?;
    let sim = Arc::new(SimBackend::new(args.capacity));
    let allocator = allocator(sim.clone(), config)?;
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
    if let Some(oom) = &report.first_oom {
        eprintln!(
            "the replay ran out of memory {} times (those allocations were skipped); the first time:\n{}",
            report.ooms,
            cachalot::report::oom::describe(oom)
        );
    }
    Ok(Run {
        dump: SnapshotDump::capture(allocator.as_ref(), Some(&history)),
        stats: allocator.stats(),
        report,
    })
}

fn allocator(
    sim: Arc<SimBackend>,
    config: AllocatorConfig,
) -> Result<Box<dyn DeviceAllocator>, InputError> {
    match config.policy {
        PolicyKind::Pytorch => Ok(Box::new(PytorchAllocator::new(sim, config)?)),
        PolicyKind::Cachalot => Err(InputError::Allocator(cachalot::Error::InvalidArgument(
            "the cachalot policy is not in this build".to_string(),
        ))),
    }
}

/// The recording in `path`: a cachalot JSON snapshot's events, or whatever the
/// trace readers find (CSV or pickle, plain or gzip).
fn read(path: &Path) -> Result<Recording, InputError> {
    if is_json(path) {
        let dump = snapshot_io::json::read_file(path).map_err(|source| InputError::Snapshot {
            path: path.to_path_buf(),
            source,
        })?;
        let conf = Some(dump.config.source.clone());
        return Ok(Recording {
            events: dump.events(),
            segments: dump.snapshot.segments,
            conf,
        });
    }
    trace::read_recording_path(path, &ReadLimits::default()).map_err(|source| InputError::Trace {
        path: path.to_path_buf(),
        source,
    })
}

fn is_json(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    name.ends_with(".json") || name.ends_with(".json.gz")
}
