//! Loading a run for the report subcommands: a trace, a PyTorch snapshot or a
//! cachalot JSON snapshot, as one event stream with optional stacks.

use std::path::{Path, PathBuf};

use cachalot::snapshot_io::{self, SnapshotDump, SnapshotIoError};
use thiserror::Error;

/// A run could not be loaded.
#[derive(Debug, Error)]
pub(crate) enum InputError {
    /// A cachalot JSON snapshot that does not read.
    #[error("{path}: {source}")]
    Snapshot {
        /// The file.
        path: PathBuf,
        /// Why.
        source: SnapshotIoError,
    },
    /// A file of a format this build cannot read.
    #[error("{0}: not a cachalot JSON snapshot (trace CSV and snapshot pickle input comes with the replay engine)")]
    Unsupported(PathBuf),
}

/// Reads `path`: a cachalot JSON snapshot (plain or gzip).
pub(crate) fn load(path: &Path) -> Result<SnapshotDump, InputError> {
    if !looks_like_json(path) {
        return Err(InputError::Unsupported(path.to_path_buf()));
    }
    snapshot_io::json::read_file(path).map_err(|source| InputError::Snapshot {
        path: path.to_path_buf(),
        source,
    })
}

fn looks_like_json(path: &Path) -> bool {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    name.ends_with(".json") || name.ends_with(".json.gz")
}
