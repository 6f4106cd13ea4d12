//! Loading the recordings every subcommand but `parity` replays: a trace CSV,
//! a PyTorch snapshot pickle or a cachalot JSON snapshot (the one `cachalot
//! summary --json` writes), told apart by content, read and planned
//! ([`load`]); for the report subcommands, replayed on a simulated device
//! through a policy with an observer of every event ([`replay`]), so the
//! reports show what that policy and configuration would do.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cachalot::allocator::DeviceAllocator;
use cachalot::event::Observer;
use cachalot::replay::{
    self, Device, Plan, PlanError, RecordedDevice, ReplayError, ReplayReport, Workload,
    H100_CAPACITY,
};
use cachalot::snapshot_io::{self, SnapshotIoError};
use cachalot::trace::{Origin, ReadLimits, Recording, TraceError};
use cachalot::{AllocatorConfig, PolicyKind};
use thiserror::Error;

use crate::capacity::{self, CapacityError};

/// A run could not be loaded or replayed.
#[derive(Debug, Error)]
pub(crate) enum InputError {
    /// A trace or PyTorch snapshot that does not read.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// A cachalot JSON snapshot of a version this build does not read.
    #[error(transparent)]
    Snapshot(SnapshotIoError),
    /// A JSON file that is not a cachalot JSON snapshot (a stats file, say).
    #[error(
        "a JSON file that is not a cachalot JSON snapshot ({0}); the inputs are trace CSVs, \
         snapshot pickles (plain or gzip) and the JSON snapshots `cachalot summary --json` writes"
    )]
    NotASnapshot(SnapshotIoError),
    /// A configuration string that does not parse.
    #[error(transparent)]
    Config(#[from] cachalot::config::ConfigError),
    /// The allocator could not be built (a policy this build lacks, say).
    #[error("cannot build the allocator: {0}")]
    Allocator(#[from] cachalot::Error),
    /// The replay stopped.
    #[error("replay failed: {0}")]
    Replay(#[from] ReplayError),
    /// The recorded configuration does not fit the policy chosen.
    #[error("the recorded configuration '{conf}': {source}; give one with --conf")]
    RecordedConfig {
        /// The recorded configuration string.
        conf: String,
        /// Why it does not fit.
        source: cachalot::config::ConfigError,
    },
    /// A tuning could not run.
    #[error(transparent)]
    Tune(Box<cachalot::tune::TuneError>),
    /// A GPU to replay on that could not be opened.
    #[error(transparent)]
    Target(#[from] crate::target::TargetError),
    /// `--capacity` with a GPU.
    #[error("--capacity sizes the simulated device; a GPU replay uses the GPU's own memory")]
    CapacityOnGpu,
    /// The recorded device is one a replay cannot simulate.
    #[error("the recorded device: {0}; choose one with --capacity")]
    RecordedCapacity(CapacityError),
}

impl From<cachalot::tune::TuneError> for InputError {
    fn from(e: cachalot::tune::TuneError) -> InputError {
        InputError::Tune(Box::new(e))
    }
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
    /// Of a snapshot of several devices, the device to replay.
    #[arg(long, value_name = "N")]
    snapshot_device: Option<usize>,
}

/// A replayed run.
pub(crate) struct Run {
    /// The allocator, in its state at the end.
    pub(crate) allocator: Arc<dyn DeviceAllocator>,
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
            "replayed {} events through the {} policy ({conf}) on a simulated device of {} \
             ({} bytes)",
            self.report.events,
            self.report.policy,
            cachalot::error::format_bytes(self.report.capacity),
            self.report.capacity
        )
    }
}

/// A recording read and planned, with what is known of the device and
/// configuration it was recorded with.
pub(crate) struct Loaded {
    /// The replay's allocator calls.
    pub(crate) plan: Plan,
    /// The recorded device and configuration.
    pub(crate) device: RecordedDevice,
    /// Whether defaults stand in for the recorded (device, configuration).
    unknowns: (bool, bool),
    /// The file it was read from.
    path: PathBuf,
}

impl Loaded {
    /// The configuration string recorded (empty for the default).
    pub(crate) fn conf(&self) -> &str {
        &self.device.config.source
    }

    /// The configuration to replay: `conf` when given, else the recorded one,
    /// under `policy` when given; its keys must apply to its policy.
    pub(crate) fn config(
        &self,
        conf: Option<&str>,
        policy: Option<PolicyKind>,
    ) -> Result<AllocatorConfig, InputError> {
        let mut config = AllocatorConfig::parse(conf.unwrap_or(self.conf()))?;
        if let Some(policy) = policy {
            config.policy = policy;
        }
        config.check_keys().map_err(|source| match conf {
            Some(_) => InputError::Config(source),
            None => InputError::RecordedConfig {
                conf: self.conf().to_string(),
                source,
            },
        })?;
        Ok(config)
    }

    /// Says on stderr which defaults stand in for what the recording does not
    /// tell, unless the command line gives it (`capacity`, `conf`).
    pub(crate) fn note_defaults(&self, capacity: bool, conf: bool) {
        let device = self.unknowns.0 && !capacity;
        let config = self.unknowns.1 && !conf;
        let what = match (device, config) {
            (false, false) => return,
            (true, false) => {
                "the recorded device is not known: an H100 80GB stands in (give \
                              --capacity)"
            }
            (false, true) => {
                "the recorded configuration is not known: the default stands in \
                              (give --conf)"
            }
            (true, true) => {
                "the recorded device and configuration are not known: an H100 80GB \
                             and the default configuration stand in (give --capacity and --conf)"
            }
        };
        eprintln!(
            "note: {}: no stats file (NAME.stats.json.gz) beside it; {what}",
            crate::output::shown(&self.path)
        );
    }

    /// The recorded device's capacity, when a replay can simulate it.
    pub(crate) fn recorded_capacity(&self) -> Result<u64, InputError> {
        capacity::check(self.device.capacity).map_err(InputError::RecordedCapacity)
    }
}

/// Reads the recording at `path` and plans its replay. It may be a trace CSV
/// or snapshot pickle (plain or gzip, with the stats file beside it, if any)
/// or a cachalot JSON snapshot, told apart by their content; of a snapshot of
/// several devices, `device`'s events (see [`ReadLimits::device`]).
pub(crate) fn load(path: &Path, device: Option<usize>) -> Result<Loaded, InputError> {
    let limits = ReadLimits {
        device,
        ..ReadLimits::default()
    };
    let mut unknowns = (true, false);
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    let bar = crate::progress::reading(size, &crate::output::shown(path));
    let opened = Workload::open_with(path, &limits, &|read| bar.set_position(read));
    bar.finish_and_clear();
    let (recording, device) = match opened {
        Ok(workload) => {
            let device = workload.recorded_device()?;
            unknowns = workload.unknowns();
            (workload.recording, device)
        }
        Err(TraceError::Json) => read_json(path)?,
        Err(e) => return Err(e.into()),
    };
    let plan = replay::plan_routed(&recording.events, &device, &recording.segments).map_err(
        |e| match e {
            PlanError::Inconsistent { event, problem } => {
                InputError::Trace(recording.event_error(event, problem))
            }
            other => InputError::Replay(other.into()),
        },
    )?;
    if let Some(note) = plan.inferred.describe() {
        eprintln!(
            "note: {}: {}",
            crate::output::shown(path),
            crate::output::printable(&note)
        );
    }
    Ok(Loaded {
        plan,
        device,
        unknowns,
        path: path.to_path_buf(),
    })
}

/// The events of a cachalot JSON snapshot, recorded on an H100 (the file does
/// not say which device).
fn read_json(path: &Path) -> Result<(Recording, RecordedDevice), InputError> {
    let dump = snapshot_io::json::read_file(path).map_err(|e| match e {
        SnapshotIoError::UnsupportedVersion { .. } => InputError::Snapshot(e),
        other => InputError::NotASnapshot(other),
    })?;
    let recording = Recording {
        events: dump.events(),
        segments: dump.snapshot.segments,
        conf: Some(dump.config.source.clone()),
        origin: Origin::Unknown,
    };
    Ok((recording, RecordedDevice::new(H100_CAPACITY, dump.config)))
}

/// Reads `path` and replays it as `args` say, showing every event to
/// `observer`, if any.
pub(crate) fn replay(
    path: &Path,
    args: &ReplayArgs,
    observer: Option<Arc<dyn Observer>>,
) -> Result<Run, InputError> {
    let loaded = load(path, args.snapshot_device)?;
    loaded.note_defaults(args.capacity.is_some(), args.conf.is_some());
    let config = loaded.config(args.conf.as_deref(), None)?;
    let capacity = args
        .capacity
        .map_or_else(|| loaded.recorded_capacity(), Ok)?;
    let device = Device::Simulated { capacity };
    let bar = crate::progress::bar(loaded.plan.ops.len() as u64, "replay");
    let replayed = replay::replay_on(&loaded.plan, config, device, observer, &mut |done| {
        bar.set_position(done as u64)
    });
    bar.finish_and_clear();
    let replayed = replayed?;
    print_first_oom(&replayed.report);
    Ok(Run {
        allocator: replayed.allocator,
        report: replayed.report,
    })
}

/// Prints, on stderr, how often a replay ran out of memory and the first
/// out-of-memory report with its breakdown and advice.
pub(crate) fn print_first_oom(report: &ReplayReport) {
    if let Some(oom) = &report.first_oom {
        let (times, skipped) = match report.ooms {
            1 => ("1 time".to_string(), "that allocation was"),
            n => (format!("{n} times"), "those allocations were"),
        };
        eprintln!(
            "the replay ran out of memory {times} ({skipped} skipped); the first time:\n{}",
            cachalot::report::oom::describe(oom)
        );
    }
}
