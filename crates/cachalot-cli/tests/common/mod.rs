//! What the command-line tests share: the repository, and running `cachalot`.
// Each test file is its own crate and uses only some of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `cachalot args`.
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cachalot"))
        .args(args)
        .output()
        .expect("cachalot runs")
}

/// Runs `cachalot args`, which must succeed; its standard output.
pub fn succeeds(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "cachalot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// The bundled recordings: every trace CSV and snapshot pickle in data/traces.
pub fn recordings() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(repo().join("data/traces"))
        .expect("data/traces exists")
        .map(|e| e.expect("readable directory").path())
        .filter(|p| {
            let name = p.to_string_lossy();
            name.ends_with(".trace.csv.gz") || name.ends_with(".snapshot.pickle.gz")
        })
        .collect();
    paths.sort();
    assert!(
        paths.len() >= 10,
        "the bundled recordings are there: {paths:?}"
    );
    paths
}
