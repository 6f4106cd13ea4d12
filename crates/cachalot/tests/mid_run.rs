//! Recordings that start mid-run, as PyTorch users make them: history turned
//! on late, or a ring buffer (`_record_memory_history(max_entries=N)`) that
//! wrapped and kept only the last N events. Every bundled recording and
//! snapshot is cut at ten points; each cut replays, and ends where the whole
//! recording's replay ends.
//!
//! * A snapshot keeps its segments and blocks (taken at the end) and loses
//!   the events before the cut: the replay ends with exactly the whole
//!   replay's allocations (count, requested and allocated bytes).
//! * A trace CSV has no segments: the allocations made before the cut and
//!   never freed are not in it, and the replay ends with the whole replay's
//!   allocations less exactly those.

use std::path::Path;
use std::sync::Arc;

use cachalot::event::{Action, Observer, TraceEvent};
use cachalot::history::{History, HistoryConfig};
use cachalot::replay::{self, Device, Plan, RecordedDevice, Workload};
use cachalot::snapshot_io::{pickle, SnapshotDump};
use cachalot::stats::MemoryStats;
use cachalot::trace::{read_recording, ReadLimits, Recording};
use cachalot_testkit::recordings::recordings;

/// The allocations an allocator holds: (count, requested, allocated bytes).
fn held(stats: &MemoryStats) -> (i64, i64, i64) {
    (
        stats.allocation.all.current,
        stats.requested_bytes.all.current,
        stats.allocated_bytes.all.current,
    )
}

fn plan_of(recording: &Recording, device: &RecordedDevice) -> Plan {
    replay::plan_routed(&recording.events, device, &recording.segments).expect("plans")
}

/// Replays `plan` under the recorded configuration, every event shown to
/// `observer`; returns the allocator's final statistics and the dump of its
/// final state with what `observer` recorded.
fn replay(
    plan: &Plan,
    device: &RecordedDevice,
    history: Option<Arc<History>>,
) -> (MemoryStats, SnapshotDump) {
    let observer = history.clone().map(|h| h as Arc<dyn Observer>);
    let sim = Device::Simulated {
        capacity: device.capacity,
    };
    let replayed = replay::replay_on(plan, device.config.clone(), sim, observer, &mut |_| {})
        .expect("replays");
    let dump = SnapshotDump::capture(replayed.allocator.as_ref(), history.as_deref());
    replayed.allocator.validate().expect("valid at the end");
    (replayed.allocator.stats(), dump)
}

/// Ten cut points: how many of `n` events each cut keeps (the last ones).
fn cuts(n: usize) -> impl Iterator<Item = usize> {
    (1..=10).map(move |k| n * k / 11).filter(|keep| *keep > 0)
}

/// Writes `dump` with only its last `keep` events, as a wrapped ring buffer
/// would, and reads it back.
fn cut_snapshot(dump: &SnapshotDump, keep: usize) -> Recording {
    let mut cut = dump.clone();
    cut.trace.drain(..cut.trace.len() - keep);
    let mut bytes = Vec::new();
    pickle::write(&cut, &mut bytes).expect("writes");
    read_recording(&bytes[..], &ReadLimits::default()).expect("reads back")
}

#[test]
fn snapshots_cut_anywhere_replay_to_the_same_end() {
    let mut checked = 0;
    for path in recordings(".trace.csv.gz")
        .into_iter()
        .chain(recordings(".snapshot.pickle.gz"))
    {
        let workload = Workload::open(&path, &ReadLimits::default()).expect("reads");
        let device = workload.recorded_device().expect("recorded configuration");
        let full_plan = plan_of(&workload.recording, &device);
        // The snapshot PyTorch would write at the end: the replay's segments
        // and every event.
        let history = Arc::new(History::new(HistoryConfig {
            capacity: usize::MAX,
            ..HistoryConfig::default()
        }));
        let (full, dump) = replay(&full_plan, &device, Some(history));
        for keep in cuts(dump.trace.len()) {
            let recording = cut_snapshot(&dump, keep);
            let plan = plan_of(&recording, &device);
            let (end, _) = replay(&plan, &device, None);
            assert_eq!(
                held(&end),
                held(&full),
                "{}: the last {keep} of {} events",
                path.display(),
                dump.trace.len()
            );
            checked += 1;
        }
    }
    assert!(checked >= 100, "{checked} cuts checked");
}

#[test]
fn pytorchs_own_snapshots_cut_anywhere_replay_to_the_same_end() {
    let mut checked = 0;
    for path in recordings(".snapshot.pickle.gz") {
        let workload = Workload::open(&path, &ReadLimits::default()).expect("reads");
        let device = workload.recorded_device().expect("recorded configuration");
        let events = &workload.recording.events;
        let (full, _) = replay(&plan_of(&workload.recording, &device), &device, None);
        for keep in cuts(events.len()) {
            let recording = Recording {
                events: events[events.len() - keep..].to_vec(),
                ..workload.recording.clone()
            };
            let (end, _) = replay(&plan_of(&recording, &device), &device, None);
            assert_eq!(held(&end), held(&full), "{}: last {keep}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked} cuts checked");
}

/// Requested bytes of the allocations `events` leaves live that were made
/// before event `from`, and their count.
fn unseen(events: &[TraceEvent], from: usize) -> (i64, i64) {
    let mut live = std::collections::HashMap::new();
    for (i, e) in events.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                live.insert(e.addr, (i, e.size));
            }
            Action::FreeRequested | Action::FreeCompleted => {
                live.remove(&e.addr);
            }
            _ => {}
        }
    }
    live.values()
        .filter(|(i, _)| *i < from)
        .fold((0, 0), |(n, bytes), (_, size)| {
            (n + 1, bytes + *size as i64)
        })
}

#[test]
fn traces_cut_anywhere_replay_to_the_same_end_less_what_they_cannot_show() {
    let mut checked = 0;
    for path in recordings(".trace.csv.gz") {
        let workload = Workload::open(&path, &ReadLimits::default()).expect("reads");
        let device = workload.recorded_device().expect("recorded configuration");
        let events = &workload.recording.events;
        let (full, _) = replay(&plan_of(&workload.recording, &device), &device, None);
        for keep in cuts(events.len()) {
            let from = events.len() - keep;
            let recording = Recording {
                events: events[from..].to_vec(),
                ..workload.recording.clone()
            };
            let plan = plan_of(&recording, &device);
            let (end, _) = replay(&plan, &device, None);
            let (count, bytes) = unseen(events, from);
            let (n, requested, _) = held(&end);
            let (full_n, full_requested, _) = held(&full);
            assert_eq!(
                (n, requested),
                (full_n - count, full_requested - bytes),
                "{}: from event {from}",
                path.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 100, "{checked} cuts checked");
}

#[test]
fn a_snapshot_without_history_holds_its_blocks() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/traces/bert_dynamic.native.snapshot.pickle.gz");
    let workload = Workload::open(&path, &ReadLimits::default()).expect("reads");
    let device = workload.recorded_device().expect("recorded configuration");
    let recording = Recording {
        events: Vec::new(),
        ..workload.recording.clone()
    };
    let plan = plan_of(&recording, &device);
    let (end, _) = replay(&plan, &device, None);
    let (segments, reserved, active) = recording
        .segments
        .iter()
        .fold((0, 0, 0), |(n, reserved, active), s| {
            (n + 1, reserved + s.total_size, active + s.allocated_size())
        });
    assert!(segments > 0);
    assert_eq!(plan.inferred.segments, segments);
    assert_eq!(plan.inferred.segment_bytes, reserved);
    assert_eq!(end.allocated_bytes.all.current as u64, active);
    assert!(end.reserved_bytes.all.peak as u64 >= reserved);
}
