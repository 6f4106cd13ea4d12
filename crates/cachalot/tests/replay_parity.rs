//! Parity with reality: every bundled recording, replayed with the `pytorch` policy
//! under its recorded configuration on a device of its recorded size, gives
//! PyTorch's recorded peak reserved and peak requested bytes, its number of device
//! allocations, and the same device segment sizes in the same order.

use std::path::Path;

use cachalot::replay::{plan, replay, ReplayReport, Workload};
use cachalot::trace::ReadLimits;
use cachalot::AllocatorConfig;
use cachalot_testkit::recordings::recordings;

/// Replays one recording and returns every mismatch with PyTorch's numbers.
fn mismatches(path: &Path) -> Vec<String> {
    let name = path
        .file_name()
        .expect("a file")
        .to_string_lossy()
        .to_string();
    let workload = Workload::open(path, &ReadLimits::default()).expect("recording reads");
    let stats = workload
        .stats
        .clone()
        .expect("stats file beside the recording");
    let device = workload.recorded_device().expect("recorded conf parses");
    let plan = plan(&workload.recording.events, &device).expect("recording is consistent");
    let config = AllocatorConfig::parse(&stats.conf).expect("conf parses");
    let report: ReplayReport =
        replay(&plan, config, stats.total_memory, &mut |_| {}).expect("replay runs");
    let expect = |key: &str| stats.stat(key).expect("recorded stat") as u64;
    let mut out = Vec::new();
    let mut check = |what: &str, want: u64, got: u64| {
        if want != got {
            out.push(format!("{name}: {what}: PyTorch {want}, replay {got}"));
        }
    };
    check(
        "peak reserved",
        expect("reserved_bytes.all.peak"),
        report.peak_reserved_bytes,
    );
    check(
        "peak requested",
        expect("requested_bytes.all.peak"),
        report.peak_requested_bytes,
    );
    check(
        "device allocations",
        expect("num_device_alloc"),
        report.segment_allocs,
    );
    check("ooms", 0, report.ooms);
    if plan.recorded_segment_sizes != report.segment_sizes {
        let first = plan
            .recorded_segment_sizes
            .iter()
            .zip(&report.segment_sizes)
            .position(|(a, b)| a != b)
            .unwrap_or(
                plan.recorded_segment_sizes
                    .len()
                    .min(report.segment_sizes.len()),
            );
        out.push(format!(
            "{name}: segment sizes differ first at #{first}: PyTorch {:?}, replay {:?}",
            plan.recorded_segment_sizes.get(first),
            report.segment_sizes.get(first)
        ));
    }
    out
}

#[test]
fn every_trace_replays_to_pytorchs_numbers() {
    let traces = recordings(".trace.csv.gz");
    assert!(traces.len() >= 11);
    let failures: Vec<String> = traces.iter().flat_map(|p| mismatches(p)).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn every_snapshot_replays_to_pytorchs_numbers() {
    let snapshots = recordings(".snapshot.pickle.gz");
    assert_eq!(snapshots.len(), 2);
    let failures: Vec<String> = snapshots.iter().flat_map(|p| mismatches(p)).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
