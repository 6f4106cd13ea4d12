//! Every subcommand takes a recording that starts mid-run, as a wrapped ring
//! buffer leaves it: each bundled recording is replayed with its snapshot
//! keeping only its last N events (`summary --max-events N --pickle`), at ten
//! cut points, and `replay`, `compare`, `summary`, `view` and `tune` all run
//! on each cut, replay ending with the allocations the whole recording ends
//! with (the library's tests/mid_run.rs checks every cut of every recording
//! against the full replay in detail).

use cachalot_testkit::cli::{run, succeeds};
use cachalot_testkit::recordings::every_recording as recordings;

/// The live allocations at the end of `path`'s replay: (count, requested bytes).
fn end_state(path: &str) -> (u64, u64) {
    let report: serde_json::Value =
        serde_json::from_str(&succeeds(&["replay", path, "--json"])).expect("JSON");
    let stats = &report["final_stats"];
    let n = |key: &str| stats[key].as_u64().expect("a count");
    (
        n("allocation.all.current"),
        n("requested_bytes.all.current"),
    )
}

#[test]
fn every_subcommand_takes_every_cut_of_every_recording() {
    let recordings = recordings();
    // The recordings shared out over two threads, for CI's two cores.
    std::thread::scope(|s| {
        for half in recordings.chunks(recordings.len().div_ceil(2)) {
            s.spawn(move || half.iter().for_each(|r| check_cuts(r)));
        }
    });
}

/// Every subcommand on ten cuts of `recording`.
fn check_cuts(recording: &std::path::Path) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = recording.to_str().expect("utf-8 path");
    let full = end_state(path);
    let events: serde_json::Value =
        serde_json::from_str(&succeeds(&["replay", path, "--json"])).expect("JSON");
    let events = events["events"].as_u64().expect("events");
    for k in 1..=10u64 {
        let keep = (events * k / 11).max(1);
        let cut = dir.path().join(format!("cut{k}.pickle"));
        let cut = cut.to_str().expect("utf-8 path");
        let keep_text = keep.to_string();
        succeeds(&["summary", path, "--max-events", &keep_text, "--pickle", cut]);
        assert_eq!(end_state(cut), full, "{path}: the last {keep} events");
        succeeds(&["compare", cut]);
        succeeds(&["summary", cut]);
        succeeds(&["view", cut, "-o", "-"]);
        if k % 4 == 1 {
            let out = run(&["tune", cut, "--json"]);
            assert!(
                out.status.success(),
                "{path}: tune on the last {keep}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
