//! The readers on every bundled recording: each file reads, and a snapshot's events
//! are exactly those of the trace CSV recorded in the same run.

use std::path::PathBuf;

use cachalot::trace::{read_recording_path, stats::read_stats_path, ReadLimits};
use cachalot_testkit::recordings::recordings;

#[test]
fn every_trace_and_stats_file_reads() {
    let limits = ReadLimits::default();
    let traces = recordings(".trace.csv.gz");
    assert!(traces.len() >= 11, "bundled traces missing");
    for trace in traces {
        let rec = read_recording_path(&trace, &limits)
            .unwrap_or_else(|e| panic!("{}: {e}", trace.display()));
        let stats_path = PathBuf::from(
            trace
                .to_string_lossy()
                .replace(".trace.csv.gz", ".stats.json.gz"),
        );
        let stats = read_stats_path(&stats_path, &limits)
            .unwrap_or_else(|e| panic!("{}: {e}", stats_path.display()));
        assert_eq!(rec.events.len() as u64, stats.events, "{}", trace.display());
        assert!(stats.stat("reserved_bytes.all.peak").is_some());
    }
}

#[test]
fn snapshots_hold_the_same_events_as_their_csv() {
    let limits = ReadLimits::default();
    let snapshots = recordings(".snapshot.pickle.gz");
    assert_eq!(snapshots.len(), 2);
    for snap in snapshots {
        let rec = read_recording_path(&snap, &limits)
            .unwrap_or_else(|e| panic!("{}: {e}", snap.display()));
        let csv_path = PathBuf::from(
            snap.to_string_lossy()
                .replace(".snapshot.pickle.gz", ".trace.csv.gz"),
        );
        let csv = read_recording_path(&csv_path, &limits).expect("csv reads");
        assert_eq!(rec.events, csv.events, "{}", snap.display());
        assert_eq!(rec.conf.as_deref(), Some(""));
    }
}
