//! The bundled recordings in `data/traces`, for the tests that read or replay
//! every one of them.

use std::path::PathBuf;

use crate::trace::traces_dir;

/// The files of `data/traces` whose names end in `suffix`, sorted by path.
pub fn recordings(suffix: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(traces_dir())
        .expect("data/traces exists")
        .map(|e| e.expect("readable directory").path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    out.sort();
    out
}

/// Every bundled recording, trace CSVs and snapshot pickles, sorted by path.
pub fn every_recording() -> Vec<PathBuf> {
    let mut paths = recordings(".trace.csv.gz");
    paths.extend(recordings(".snapshot.pickle.gz"));
    paths.sort();
    assert!(
        paths.len() >= 10,
        "the bundled recordings are there: {paths:?}"
    );
    paths
}
