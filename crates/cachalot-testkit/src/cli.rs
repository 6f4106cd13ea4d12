//! Running the `cachalot` command in the command-line crate's tests: the
//! binary cargo built beside the running test, and the repository it reads
//! its recordings from.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A `cachalot` command to run: the binary of the test's own build (cargo
/// builds a package's binaries for its integration tests, into the folder
/// above the test's `deps/`).
pub fn cachalot() -> Command {
    let test = std::env::current_exe().expect("the test knows its path");
    let dir = test
        .parent()
        .and_then(Path::parent)
        .expect("a test runs from target/<profile>/deps");
    let bin = dir.join(format!("cachalot{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is not built: run the command-line crate's tests with cargo test -p cachalot-cli",
        bin.display()
    );
    Command::new(bin)
}

/// Runs `cachalot args`.
pub fn run(args: &[&str]) -> Output {
    cachalot().args(args).output().expect("cachalot runs")
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
