//! Every subcommand writes its results through one path: a reader that closes
//! the pipe early (`| head -1`) ends the command quietly with status 0, and a
//! full disk is an error message and status 1, never a panic.

use cachalot_testkit::cli::repo;
use std::fs::File;
use std::path::Path;
use std::process::{Output, Stdio};

fn data(name: &str) -> String {
    repo().join("data").join(name).display().to_string()
}

/// Each subcommand, with arguments that make it write to stdout.
fn commands(dir: &Path) -> Vec<Vec<String>> {
    let trace = data("traces/seed004.native.trace.csv.gz");
    let page = dir.join("page.html").display().to_string();
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        words(&["parity", &data("golden/scenarios.native.json.gz")]),
        words(&["replay", &trace]),
        words(&["replay", &trace, "--json"]),
        words(&["compare", &trace]),
        words(&["compare", &trace, "--json"]),
        words(&["summary", &trace]),
        words(&["view", &trace, "-o", &page]),
    ]
}

fn run(args: &[String], stdout: Stdio) -> Output {
    let mut child = cachalot_testkit::cli::cachalot()
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("cachalot starts");
    // Close the reading end before the command writes anything.
    drop(child.stdout.take());
    child.wait_with_output().expect("cachalot runs")
}

#[test]
fn a_closed_pipe_ends_every_subcommand_quietly() {
    let dir = tempfile::tempdir().expect("a temp dir");
    for args in commands(dir.path()) {
        let out = run(&args, Stdio::piped());
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "cachalot {args:?}: {err}");
        assert!(err.is_empty(), "cachalot {args:?} wrote to stderr: {err}");
    }
}

#[test]
fn a_full_disk_is_an_error_not_a_panic() {
    let Ok(full) = File::options().write(true).open("/dev/full") else {
        eprintln!("SKIPPED: no /dev/full on this system");
        return;
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    for args in commands(dir.path()) {
        let stdout = Stdio::from(full.try_clone().expect("a second handle"));
        let out = run(&args, stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "cachalot {args:?}: {err}");
        assert!(
            err.starts_with("error: cannot write to standard output: ")
                && err.contains("No space left on device")
                && !err.contains("panicked"),
            "cachalot {args:?}: {err}"
        );
    }
}
