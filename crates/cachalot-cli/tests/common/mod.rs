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
