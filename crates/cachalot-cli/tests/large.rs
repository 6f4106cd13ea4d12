//! A recording of ten million events, as training runs of large models write
//! them: a snapshot pickle that replays, summarizes and views in memory
//! bounded by what the figures need (at most 2 GiB, however large the file
//! decompresses to).

use cachalot_testkit::cli::succeeds;
use nix::sys::resource::{getrusage, UsageWho};

/// The largest peak resident memory of the commands this test process has
/// run so far, in bytes.
fn children_peak_bytes() -> u64 {
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).expect("getrusage");
    // Linux gives kilobytes.
    u64::try_from(usage.max_rss()).unwrap_or(0) * 1024
}

#[test]
fn ten_million_events_replay_summarize_and_view_in_two_gib() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let snapshot = dir.path().join("large.snapshot.pickle.gz");
    let snapshot = snapshot.to_str().expect("utf-8 path");
    succeeds(&["synth", "-o", snapshot, "--events", "10M", "--seed", "3"]);
    let page = dir.path().join("large.html");
    let page = page.to_str().expect("utf-8 path");
    // The three at once, each in its own process.
    std::thread::scope(|s| {
        s.spawn(|| {
            let report: serde_json::Value =
                serde_json::from_str(&succeeds(&["replay", snapshot, "--json"])).expect("JSON");
            assert!(report["events"].as_u64() >= Some(9_999_998), "{report}");
            assert_eq!(report["ooms"], 0);
        });
        s.spawn(|| {
            let table = succeeds(&["summary", snapshot]);
            assert!(table.contains("memory summary"), "{table}");
        });
        s.spawn(|| {
            let line = succeeds(&["view", snapshot, "-o", page]);
            assert!(line.starts_with("wrote "), "{line}");
        });
    });
    let peak = children_peak_bytes();
    assert!(peak < 2 << 30, "the commands peaked at {peak} bytes");
}
