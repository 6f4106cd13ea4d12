//! The stats JSON of a recorded run (`*.stats.json`, plain or gzip): the
//! configuration, the device's memory, PyTorch's final `memory_stats()` (peaks
//! included) and labelled checkpoints.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{decompressed, io_error, ReadLimits, TraceError};

/// One checkpoint: a label, then allocated and reserved bytes at that moment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint(pub String, pub u64, pub u64);

/// The facts of one recorded run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunStats {
    /// The workload's name (`resnet50`, ...).
    #[serde(default)]
    pub workload: String,
    /// The configuration's label (`native`, `expandable`, ...).
    #[serde(default)]
    pub label: String,
    /// The `PYTORCH_CUDA_ALLOC_CONF` string in force.
    pub conf: String,
    /// The GPU's name.
    #[serde(default)]
    pub gpu: String,
    /// The device's total memory in bytes.
    pub total_memory: u64,
    /// Events recorded.
    #[serde(default)]
    pub events: u64,
    /// Checkpoints in order.
    #[serde(default)]
    pub checkpoints: Vec<Checkpoint>,
    /// PyTorch's `memory_stats()` at the end of the run.
    pub memory_stats: BTreeMap<String, i64>,
}

impl RunStats {
    /// One `memory_stats` key (`reserved_bytes.all.peak`, ...).
    pub fn stat(&self, key: &str) -> Option<i64> {
        self.memory_stats.get(key).copied()
    }
}

/// Reads a stats JSON (plain or gzip).
///
/// # Errors
/// [`TraceError::Schema`] (with line and column) for malformed JSON or a missing
/// field; [`TraceError::TooLarge`] past the input limit.
pub fn read_stats<R: BufRead>(input: R, limits: &ReadLimits) -> Result<RunStats, TraceError> {
    let input = decompressed(input, limits)?;
    serde_json::from_reader(input).map_err(|e| {
        if e.is_io() {
            io_error("stats JSON", e.into())
        } else {
            TraceError::schema(
                format!("stats JSON line {} column {}", e.line(), e.column()),
                e.to_string(),
            )
        }
    })
}

/// Reads a stats JSON from a file.
///
/// # Errors
/// [`TraceError::Io`] when the file cannot be opened; otherwise as [`read_stats`].
pub fn read_stats_path(path: &Path, limits: &ReadLimits) -> Result<RunStats, TraceError> {
    let file = File::open(path).map_err(|e| io_error(&path.display().to_string(), e))?;
    read_stats(BufReader::new(file), limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_fields_replay_needs() {
        let text = r#"{"conf": "expandable_segments:True", "total_memory": 85017493504,
            "checkpoints": [["a", 1, 2]], "memory_stats": {"reserved_bytes.all.peak": 42}, "extra": [1]}"#;
        let stats = read_stats(text.as_bytes(), &ReadLimits::default()).unwrap();
        assert_eq!(stats.conf, "expandable_segments:True");
        assert_eq!(stats.stat("reserved_bytes.all.peak"), Some(42));
        assert_eq!(stats.checkpoints[0], Checkpoint("a".into(), 1, 2));
    }

    #[test]
    fn bad_json_is_a_typed_error() {
        let limits = ReadLimits::default();
        assert!(matches!(
            read_stats(&b"{\"conf\": 3}"[..], &limits),
            Err(TraceError::Schema { .. })
        ));
        let deep = "[".repeat(100_000);
        assert!(read_stats(deep.as_bytes(), &limits).is_err());
    }
}
