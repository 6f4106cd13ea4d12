//! The conformance checks, each a function of a fresh allocator.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cachalot::error::{FreeError, MAX_REQUEST};
use cachalot::event::{Action, Observer, TraceEvent};
use cachalot::{DeviceAllocator, Error, StreamId};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

thread_local! {
    /// The side stream of the cross-stream checks. Any id suits the simulated
    /// backend; a real GPU's suite sets one of its own streams before each check.
    static SIDE_STREAM: Cell<StreamId> = const { Cell::new(StreamId(7)) };
}

/// Sets the side stream the checks on this thread use.
pub fn set_side_stream(stream: StreamId) {
    SIDE_STREAM.set(stream);
}

/// The side stream the checks on this thread use.
pub fn side_stream() -> StreamId {
    SIDE_STREAM.get()
}

fn valid(a: &dyn DeviceAllocator) {
    if let Err(e) = a.validate() {
        panic!("{e}");
    }
}

/// Size 0 gives the null address and changes no statistic.
pub fn zero_size_is_null(a: &dyn DeviceAllocator) {
    let before = a.stats();
    assert_eq!(a.malloc(0, S0).unwrap(), 0);
    a.free(0).unwrap();
    assert_eq!(a.stats(), before);
    valid(a);
}

/// Requests of 1 EiB or more are refused with a typed error before any attempt,
/// as PyTorch refuses them; a byte less is an ordinary request, which no
/// device can meet: out of memory.
pub fn absurd_size_is_too_large(a: &dyn DeviceAllocator) {
    for size in [MAX_REQUEST, MAX_REQUEST + 1, u64::MAX] {
        match a.malloc(size, S0) {
            Err(Error::TooLarge { requested, limit }) => {
                assert_eq!((requested, limit), (size, MAX_REQUEST))
            }
            other => panic!("{size} bytes: {other:?}"),
        }
    }
    assert_eq!(a.stats().num_ooms, 0);
    let e = a.malloc(MAX_REQUEST - 1, S0).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory(_)), "{e:?}");
    assert_eq!(a.stats().num_ooms, 1);
    valid(a);
}

/// Live allocations never overlap; freeing everything and emptying the cache
/// returns every byte.
pub fn allocations_are_disjoint_and_returned(a: &dyn DeviceAllocator) {
    let sizes = [
        1,
        511,
        512,
        513,
        4096,
        MIB - 1,
        MIB,
        MIB + 1,
        3 * MIB,
        10 * MIB,
        25 * MIB + 7,
        100 * MIB,
    ];
    let mut live = BTreeMap::new();
    for (i, &s) in sizes.iter().cycle().take(60).enumerate() {
        let stream = StreamId((i % 3) as u64);
        let p = a.malloc(s, stream).unwrap();
        assert_ne!(p, 0);
        if let Some((q, qs)) = live.range(..=p).next_back() {
            assert!(q + qs <= p, "allocation at {p:#x} overlaps {q:#x}");
        }
        if let Some((q, _)) = live.range(p..).next() {
            assert!(p + s <= *q, "allocation at {p:#x} overlaps {q:#x}");
        }
        live.insert(p, s);
        valid(a);
    }
    let st = a.stats();
    assert!(st.memory_allocated() >= sizes.iter().cycle().take(60).sum::<u64>());
    assert!(st.memory_reserved() >= st.memory_allocated());
    for (i, p) in live.keys().enumerate() {
        a.free(*p).unwrap();
        if i % 7 == 0 {
            valid(a);
        }
    }
    valid(a);
    assert_eq!(a.stats().memory_allocated(), 0);
    assert_eq!(a.stats().active_bytes.all.current, 0);
    a.empty_cache().unwrap();
    valid(a);
    assert_eq!(a.memory_reserved(), 0);
    assert!(a.max_memory_reserved() > 0);
}

/// Double and foreign frees are typed errors and leave every statistic as it was.
pub fn invalid_frees_change_nothing(a: &dyn DeviceAllocator) {
    let p = a.malloc(3 * MIB, S0).unwrap();
    let q = a.malloc(1000, S0).unwrap();
    a.free(p).unwrap();
    let before = a.stats();
    match a.free(p) {
        Err(Error::InvalidFree { ptr, reason }) => {
            assert_eq!(ptr, p);
            assert_eq!(reason, FreeError::DoubleFree);
        }
        other => panic!("double free gave {other:?}"),
    }
    assert!(matches!(
        a.free(0xdead_0000),
        Err(Error::InvalidFree {
            reason: FreeError::Foreign,
            ..
        })
    ));
    assert!(
        matches!(a.free(q + 8), Err(Error::InvalidFree { .. })),
        "interior pointer"
    );
    assert!(matches!(
        a.record_stream(p, StreamId(9)),
        Err(Error::InvalidFree { .. })
    ));
    assert_eq!(a.stats(), before);
    valid(a);
    a.free(q).unwrap();
    valid(a);
}

/// A freed block serves the next request of its size on its stream without new
/// device memory.
pub fn freed_memory_is_reused(a: &dyn DeviceAllocator) {
    let p = a.malloc(40 * MIB, S0).unwrap();
    let reserved = a.memory_reserved();
    a.free(p).unwrap();
    let q = a.malloc(40 * MIB, S0).unwrap();
    assert_eq!(q, p);
    assert_eq!(a.memory_reserved(), reserved);
    let small = a.malloc(1000, S0).unwrap();
    a.free(small).unwrap();
    assert_eq!(a.malloc(1000, S0).unwrap(), small);
    valid(a);
}

/// A block freed after use on another stream stays active until that stream's
/// work completes, and is reclaimed by the next allocation or `empty_cache`.
pub fn cross_stream_free_waits(a: &dyn DeviceAllocator) {
    let p = a.malloc(5 * MIB, S0).unwrap();
    a.record_stream(p, SIDE_STREAM.get()).unwrap();
    a.record_stream(p, S0).unwrap();
    a.free(p).unwrap();
    valid(a);
    let st = a.stats();
    assert_eq!(st.memory_allocated(), 0);
    assert!(
        st.active_bytes.all.current > 0,
        "still active until the event is seen"
    );
    a.empty_cache().unwrap();
    valid(a);
    assert_eq!(a.stats().active_bytes.all.current, 0);
    assert_eq!(a.memory_reserved(), 0);
}

/// A memory fraction caps reserved memory; an out-of-memory error carries the
/// numbers, and the allocator works again once memory is freed.
pub fn memory_fraction_limits_and_recovers(a: &dyn DeviceAllocator) {
    assert!(matches!(
        a.set_memory_fraction(1.5),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        a.set_memory_fraction(-0.1),
        Err(Error::InvalidArgument(_))
    ));
    let total = a.backend().capabilities().total_memory;
    let fraction = (200 * MIB) as f64 / total as f64;
    a.set_memory_fraction(fraction).unwrap();
    let mut live = Vec::new();
    let report = loop {
        match a.malloc(64 * MIB, S0) {
            Ok(p) => live.push(p),
            Err(Error::OutOfMemory(r)) => break r,
            Err(e) => panic!("{e}"),
        }
        assert!(live.len() < 100, "the fraction is not enforced");
    };
    valid(a);
    assert!(
        (2..=3).contains(&live.len()),
        "{} allocations fit",
        live.len()
    );
    assert!(a.memory_reserved() <= 200 * MIB);
    assert_eq!(report.allocated, live.len() as u64 * 64 * MIB);
    assert_eq!(
        report.allowed,
        Some((fraction * total as f64).round() as u64)
    );
    assert!(
        report.to_string().contains("Tried to allocate 64.00 MiB"),
        "{report}"
    );
    assert_eq!(a.stats().num_ooms, 1);
    a.free(live.pop().unwrap()).unwrap();
    live.push(a.malloc(64 * MIB, S0).unwrap());
    for p in live {
        a.free(p).unwrap();
    }
    a.set_memory_fraction(1.0).unwrap();
    a.empty_cache().unwrap();
    valid(a);
}

/// Peak and cumulative resets.
pub fn stat_resets(a: &dyn DeviceAllocator) {
    let p = a.malloc(32 * MIB, S0).unwrap();
    let q = a.malloc(32 * MIB, S0).unwrap();
    a.free(q).unwrap();
    assert!(a.max_memory_allocated() > a.memory_allocated());
    a.reset_peak_stats();
    assert_eq!(a.max_memory_allocated(), a.memory_allocated());
    a.reset_accumulated_stats();
    let st = a.stats();
    assert_eq!(
        (
            st.allocated_bytes.all.allocated,
            st.allocated_bytes.all.freed
        ),
        (0, 0)
    );
    assert_eq!(st.num_device_alloc, 0);
    a.free(p).unwrap();
    assert_eq!(a.stats().allocated_bytes.all.freed, (32 * MIB) as i64);
    valid(a);
}

/// A snapshot's segments and blocks add up to the statistics.
pub fn snapshot_matches_stats(a: &dyn DeviceAllocator) {
    let ps: Vec<u64> = [1000, 2 * MIB, 30 * MIB]
        .iter()
        .map(|s| a.malloc(*s, S0).unwrap())
        .collect();
    a.free(ps[1]).unwrap();
    let snap = a.snapshot();
    let st = a.stats();
    let reserved: u64 = snap.segments.iter().map(|s| s.total_size).sum();
    let allocated: u64 = snap.segments.iter().map(|s| s.allocated_size()).sum();
    assert_eq!(reserved, st.memory_reserved());
    assert_eq!(allocated, st.memory_allocated());
    for s in &snap.segments {
        assert_eq!(s.blocks.iter().map(|b| b.size).sum::<u64>(), s.total_size);
    }
    valid(a);
}

#[derive(Default)]
struct Recorder(Mutex<Vec<TraceEvent>>);

impl Observer for Recorder {
    fn on_event(&self, event: &TraceEvent) {
        self.0.lock().unwrap().push(*event);
    }
}

/// The observer hears every allocation, free and segment change.
pub fn observer_sees_every_transition(a: &dyn DeviceAllocator) {
    let rec = Arc::new(Recorder::default());
    a.set_observer(Some(rec.clone()));
    let p = a.malloc(12 * MIB, S0).unwrap();
    a.free(p).unwrap();
    a.empty_cache().unwrap();
    a.set_observer(None);
    let _ = a.malloc(1000, S0).unwrap();
    let events = rec.0.lock().unwrap().clone();
    let count = |act: Action| events.iter().filter(|e| e.action == act).count();
    assert_eq!(count(Action::Alloc), 1);
    assert_eq!(count(Action::FreeRequested), 1);
    assert_eq!(count(Action::FreeCompleted), 1);
    assert_eq!(count(Action::SegmentAlloc) + count(Action::SegmentMap), 1);
    assert_eq!(count(Action::SegmentFree) + count(Action::SegmentUnmap), 1);
    let alloc = events.iter().find(|e| e.action == Action::Alloc).unwrap();
    assert_eq!((alloc.addr, alloc.size), (p, 12 * MIB));
}

/// `backing` names the segment under each live allocation, or the pages
/// mapped under all of it, and refuses addresses that are not live.
pub fn backing_covers_each_allocation(a: &dyn DeviceAllocator) {
    use cachalot::ipc::Backing;
    let sizes = [1000u64, 3 << 20, 45 << 20];
    let ptrs: Vec<u64> = sizes
        .iter()
        .map(|s| a.malloc(*s, StreamId::DEFAULT).unwrap())
        .collect();
    for (p, size) in ptrs.iter().zip(sizes) {
        match a.backing(*p).unwrap() {
            Backing::Segment { base } => {
                let seg = a
                    .snapshot()
                    .segments
                    .into_iter()
                    .find(|s| s.address == base)
                    .expect("the base is a segment's");
                assert!(base <= *p && p + size <= base + seg.total_size);
            }
            Backing::Pages { base, pages } => {
                let (first, last) = (pages[0].1, pages[pages.len() - 1].1);
                assert!(base <= *p && *p < base + first, "starts in the first page");
                let end = base + pages.iter().map(|(_, bytes)| bytes).sum::<u64>();
                assert!(p + size <= end && end < p + size + last, "ends in the last");
                let mut distinct: Vec<_> = pages.iter().map(|(h, _)| *h).collect();
                distinct.sort_unstable();
                distinct.dedup();
                assert_eq!(distinct.len(), pages.len());
            }
        }
    }
    let e = a.backing(ptrs[0] + 1).unwrap_err();
    assert!(matches!(e, Error::InvalidFree { .. }), "{e}");
    match cachalot::ipc::share(a, ptrs[1]) {
        Ok(shared) => {
            let base = match a.backing(ptrs[1]).unwrap() {
                Backing::Segment { base } | Backing::Pages { base, .. } => base,
            };
            assert_eq!(shared.offset, ptrs[1] - base);
            assert!(cachalot::ipc::handle::Handle::decode(&shared.handle).is_ok());
        }
        // A simulated device has no other process to share with.
        Err(e) => assert!(e.to_string().contains("not supported"), "{e}"),
    }
    for p in ptrs {
        a.free(p).unwrap();
    }
    assert!(a.backing(0x1234).is_err());
    a.validate().unwrap();
}
