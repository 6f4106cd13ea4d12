//! A recorded workload on disk: its recording, and the stats file recorded beside
//! it (`NAME.stats.json.gz` next to `NAME.trace.csv.gz` or
//! `NAME.snapshot.pickle.gz`), which tells the device and configuration.

use std::path::{Path, PathBuf};

use super::plan::RecordedDevice;
use super::H100_CAPACITY;
use crate::trace::stats::{read_stats_path, RunStats};
use crate::trace::{read_recording_path_with, ReadLimits, Recording, TraceError};
use cachalot_core::config::{AllocatorConfig, ConfigError};

/// The file-name endings of recordings that may have a stats file beside them.
const RECORDING_SUFFIXES: [&str; 4] = [
    ".trace.csv.gz",
    ".trace.csv",
    ".snapshot.pickle.gz",
    ".snapshot.pickle",
];

/// A recording with what is known of how it was made.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The events (and, for snapshots, the final segments).
    pub recording: Recording,
    /// The stats file recorded with it, when there is one.
    pub stats: Option<RunStats>,
}

impl Workload {
    /// Reads the recording at `path` and the stats file beside it, if any.
    ///
    /// # Errors
    /// A [`TraceError`] from either file (a stats file that is absent is fine; one
    /// that is present must read).
    pub fn open(path: &Path, limits: &ReadLimits) -> Result<Workload, TraceError> {
        Workload::open_with(path, limits, &|_| {})
    }

    /// [`Workload::open`], telling `progress` the bytes of the recording read
    /// so far (see [`read_recording_path_with`]).
    ///
    /// # Errors
    /// As [`Workload::open`].
    pub fn open_with(
        path: &Path,
        limits: &ReadLimits,
        progress: &dyn Fn(u64),
    ) -> Result<Workload, TraceError> {
        let recording = read_recording_path_with(path, limits, progress)?;
        let stats = match stats_path_for(path).filter(|p| p.is_file()) {
            Some(p) => Some(
                read_stats_path(&p, limits).map_err(|e| TraceError::StatsFile {
                    path: p.display().to_string(),
                    source: Box::new(e),
                })?,
            ),
            None => None,
        };
        Ok(Workload { recording, stats })
    }

    /// The configuration string it was recorded with: the stats file's, else the
    /// snapshot's, else the default (empty).
    pub fn recorded_conf(&self) -> &str {
        match (&self.stats, &self.recording.conf) {
            (Some(stats), _) => &stats.conf,
            (None, Some(conf)) => conf,
            (None, None) => "",
        }
    }

    /// What the recording does not say of how it was made: (the device,
    /// the configuration), each `true` when defaults stand in for it (no
    /// stats file beside the recording, no settings in it).
    pub fn unknowns(&self) -> (bool, bool) {
        let no_stats = self.stats.is_none();
        (no_stats, no_stats && self.recording.conf.is_none())
    }

    /// The device's memory: the stats file's, else an H100 80GB's.
    pub fn recorded_capacity(&self) -> u64 {
        self.stats
            .as_ref()
            .map_or(H100_CAPACITY, |s| s.total_memory)
    }

    /// The recorded device and configuration, for planning.
    ///
    /// # Errors
    /// [`ConfigError`] when the recorded configuration string does not parse.
    pub fn recorded_device(&self) -> Result<RecordedDevice, ConfigError> {
        let config = AllocatorConfig::parse(self.recorded_conf())?;
        let mut device = RecordedDevice::new(self.recorded_capacity(), config);
        if let Some(stats) = &self.stats {
            let never = |key: &str| stats.stat(key) == Some(0);
            let settings_release = device.config.max_split_size.is_some()
                || device.config.garbage_collection_threshold > 0.0;
            device.program_releases_only =
                never("num_alloc_retries") && never("num_ooms") && !settings_release;
        }
        Ok(device)
    }
}

/// Where the stats file of the recording at `path` would be.
pub fn stats_path_for(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let stem = RECORDING_SUFFIXES
        .iter()
        .find_map(|s| name.strip_suffix(s))?;
    Some(path.with_file_name(format!("{stem}.stats.json.gz")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_live_beside_traces_and_snapshots() {
        let p = stats_path_for(Path::new("/d/gpt2.native.trace.csv.gz")).unwrap();
        assert_eq!(p, Path::new("/d/gpt2.native.stats.json.gz"));
        let p = stats_path_for(Path::new("x.snapshot.pickle")).unwrap();
        assert_eq!(p, Path::new("x.stats.json.gz"));
        assert_eq!(stats_path_for(Path::new("notes.txt")), None);
    }
}
