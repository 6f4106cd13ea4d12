//! History, snapshots, leak checks and OOM reports on a real allocator (the
//! `pytorch` policy over a simulated device).

use std::sync::Arc;

use cachalot::backend::sim::SimBackend;
use cachalot::event::{Action, Observer};
use cachalot::history::{History, HistoryConfig};
use cachalot::policy::PytorchAllocator;
use cachalot::report::leak::LeakCheck;
use cachalot::report::oom::{advice, describe, Advice};
use cachalot::snapshot_io::{json, pickle, SnapshotDump};
use cachalot::{AllocatorConfig, DeviceAllocator, Error, StreamId};

const MIB: u64 = 1 << 20;

fn allocator(capacity: u64, history: &Arc<History>) -> PytorchAllocator {
    let alloc = PytorchAllocator::new(
        Arc::new(SimBackend::new(capacity)),
        AllocatorConfig::default(),
    )
    .expect("the default config is valid");
    alloc.set_observer(Some(history.clone() as Arc<dyn Observer>));
    alloc
}

#[inline(never)]
fn leaky_layer(alloc: &PytorchAllocator) -> u64 {
    alloc.malloc(3 * MIB, StreamId::DEFAULT).expect("room")
}

#[test]
fn history_records_the_allocator_and_leaks_group_by_stack() {
    let history = Arc::new(History::new(HistoryConfig {
        backtraces: true,
        ..HistoryConfig::default()
    }));
    let alloc = allocator(1 << 30, &history);
    let kept = alloc.malloc(512, StreamId::DEFAULT).expect("room");
    let check = LeakCheck::from_history(&history);

    let temp = alloc.malloc(MIB, StreamId::DEFAULT).expect("room");
    alloc.free(temp).expect("live");
    let leaked: Vec<u64> = (0..2).map(|_| leaky_layer(&alloc)).collect();
    alloc.validate().expect("invariants hold");

    let actions: Vec<Action> = history.events().iter().map(|r| r.event.action).collect();
    assert!(actions.contains(&Action::SegmentAlloc));
    assert_eq!(actions.iter().filter(|a| **a == Action::Alloc).count(), 4);
    assert!(actions.contains(&Action::FreeCompleted));

    let report = check.finish_history(&history);
    let mut addrs: Vec<u64> = report.leaks.iter().map(|l| l.addr).collect();
    addrs.sort_unstable();
    let mut expected = leaked.clone();
    expected.sort_unstable();
    assert_eq!(
        addrs, expected,
        "only the allocations made in the scope and kept"
    );
    assert_eq!(report.groups.len(), 1);
    assert!(
        report.groups[0]
            .frames
            .iter()
            .any(|f| f.name.contains("leaky_layer")),
        "{report}"
    );

    // The same scope checked through snapshots finds the same blocks.
    let dump = SnapshotDump::capture(&alloc, Some(&history));
    assert!(dump
        .frames_of(leaked[0])
        .iter()
        .any(|f| f.name.contains("leaky_layer")));
    assert!(dump
        .frames_of(kept)
        .iter()
        .any(|f| f.name.contains("history_records_the_allocator")));

    // JSON round trip keeps everything, stacks included.
    let mut bytes = Vec::new();
    json::write(&dump, &mut bytes).expect("writes");
    assert_eq!(json::read(&bytes).expect("reads"), dump);
    let mut pickled = Vec::new();
    pickle::write(&dump, &mut pickled).expect("writes");
    assert_eq!(&pickled[..2], &[0x80, 3], "pickle protocol 3");
}

#[test]
fn out_of_memory_carries_a_breakdown_and_advice() {
    let history = Arc::new(History::new(HistoryConfig::default()));
    let alloc = allocator(64 * MIB, &history);
    // Three 20 MiB segments, each filled with three 6 MiB blocks; freeing the
    // middle block of each leaves 6 MiB holes that an 8 MiB request cannot use,
    // and the device has no room for a fourth segment.
    let blocks: Vec<u64> = (0..9)
        .map(|_| alloc.malloc(6 * MIB, StreamId::DEFAULT).expect("room"))
        .collect();
    for middle in [1, 4, 7] {
        alloc.free(blocks[middle]).expect("live");
    }
    let err = alloc
        .malloc(8 * MIB, StreamId::DEFAULT)
        .expect_err("no 8 MiB hole and no room for a segment");
    let Error::OutOfMemory(report) = err else {
        panic!("expected out of memory, got {err}")
    };
    assert_eq!(
        report.breakdown, None,
        "a policy attaches no walk of its state"
    );
    let report = report.with_breakdown(alloc.oom_breakdown());
    let b = report.breakdown.as_ref().expect("attached");
    assert!(b.segments > 0);
    assert_eq!((b.segments, b.largest_free_block), (3, 6 * MIB), "{b:?}");
    assert_eq!(b.live_by_size.len(), 1, "{b:?}");
    assert_eq!(
        (b.live_by_size[0].count, b.live_by_size[0].bytes),
        (6, 36 * MIB),
        "{b:?}"
    );
    assert_eq!(report.reserved_unallocated(), 24 * MIB);
    assert!(history
        .events()
        .iter()
        .any(|r| r.event.action == Action::Oom));
    let text = describe(&report);
    assert!(text.contains("largest free block"), "{text}");
    assert!(text.contains("live allocations by size"), "{text}");
    let tips = advice(&report);
    assert_eq!(
        tips.first(),
        Some(&Advice::Fragmentation {
            reserved_unallocated: 24 * MIB,
            largest_free_block: Some(6 * MIB)
        }),
        "{tips:?}"
    );
}
