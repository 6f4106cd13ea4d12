//! `cachalot summary`: the table, and the snapshot files it writes, read back by
//! cachalot (JSON) and checked against PyTorch's snapshot schema (pickle).

use cachalot_testkit::cli::{repo, succeeds};
use std::process::Command;

/// The table without the first line (which says how the run was made).
fn table(stdout: &str) -> String {
    stdout.lines().skip(1).collect::<Vec<_>>().join("\n")
}

#[test]
fn summary_writes_snapshots_that_read_back() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let trace = repo().join("data/traces/seed004.native.trace.csv.gz");
    let pickle = dir.path().join("seed004.pickle");
    let json = dir.path().join("seed004.json.gz");
    let out = succeeds(&[
        "summary",
        trace.to_str().expect("utf-8 path"),
        "--pickle",
        pickle.to_str().expect("utf-8 path"),
        "--json",
        json.to_str().expect("utf-8 path"),
    ]);
    assert!(
        out.contains("cachalot memory summary, device ID 0"),
        "{out}"
    );
    assert!(out.contains("| Allocated memory      |"), "{out}");
    assert_eq!(table(&out).lines().count(), 6 + 9 * 4 + 2 * 2 + 1, "{out}");

    // The JSON holds the replay's events: replaying them again gives the same table.
    let again = succeeds(&["summary", json.to_str().expect("utf-8 path")]);
    assert_eq!(table(&again), table(&out));

    let python = Command::new("python3").arg("--version").output();
    if python.is_err() {
        eprintln!("SKIPPED: no python3; the pickle was not checked");
        return;
    }
    let script = repo().join("scripts/check_snapshot_viz.py");
    let check = Command::new("python3")
        .arg(script)
        .arg(&pickle)
        .output()
        .expect("python3 runs");
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(
        check.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&check.stderr)
    );
    assert!(said.contains("follow PyTorch's snapshot schema"), "{said}");
}

#[test]
fn unreadable_input_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"format\":\"cachalot-snapshot\",\"version\":9}").expect("writes");
    let out = cachalot_testkit::cli::cachalot()
        .arg("view")
        .arg(&bad)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("version 9 is not supported"), "{err}");
}
