//! The cachalot policy end to end on the simulated device: a seeded randomized
//! test against a simple model with `validate()` after every step, fault
//! injection, out-of-memory, cross-stream frees and a multi-threaded stress test.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cachalot::backend::faults::Fault;
use cachalot::backend::sim::SimBackend;
use cachalot::backend::CallKind;
use cachalot::policy::cachalot::CachalotAllocator;
use cachalot::{AllocatorConfig, DeviceAllocator, Error, PrivatePools, StreamId};

use cachalot_testkit::device::TestDevice;

const MIB: u64 = 1 << 20;

/// xorshift64*: a seeded generator with no dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn size(&mut self) -> u64 {
        match self.below(10) {
            0..=5 => 1 + self.below(MIB),
            6..=8 => MIB + self.below(24 * MIB),
            _ => 1 + self.below(80 * MIB),
        }
    }
}

/// Bytes allocated and requested by seeded traffic, now and at their
/// peaks: the device's figures, where the traffic's operations happen one at
/// a time.
#[derive(Clone, Copy, Default)]
struct Usage {
    allocated: i64,
    requested: i64,
    peak_allocated: i64,
    peak_requested: i64,
}

/// One step of seeded traffic: while fewer than `most` blocks are `live`
/// (address, rounded size, size), an even chance of a new block (up to an
/// eighth of [`Rng::size`], on the stream `stream` draws), else a live one
/// freed; `usage` follows.
fn random_step(
    alloc: &CachalotAllocator,
    rng: &mut Rng,
    live: &mut Vec<(u64, i64, i64)>,
    most: usize,
    stream: impl FnOnce(&mut Rng) -> StreamId,
    usage: &mut Usage,
) {
    if live.len() < most && rng.below(2) == 0 {
        let size = rng.size() / 8 + 1;
        let p = alloc.malloc(size, stream(rng)).expect("fits");
        let rounded = size.div_ceil(512) as i64 * 512;
        live.push((p, rounded, size as i64));
        usage.allocated += rounded;
        usage.requested += size as i64;
        usage.peak_allocated = usage.peak_allocated.max(usage.allocated);
        usage.peak_requested = usage.peak_requested.max(usage.requested);
    } else if !live.is_empty() {
        let (p, rounded, size) = live.swap_remove(rng.below(live.len() as u64) as usize);
        alloc.free(p).unwrap();
        usage.allocated -= rounded;
        usage.requested -= size;
    }
}

fn allocator(dev: &TestDevice, conf: &str) -> CachalotAllocator {
    CachalotAllocator::new(dev.backend(), AllocatorConfig::parse(conf).expect("valid"))
        .expect("allocator")
}

/// Live allocations: address -> (requested, rounded size).
type Model = BTreeMap<u64, (u64, u64)>;

fn check_model(alloc: &CachalotAllocator, model: &Model) {
    alloc.validate().expect("invariants hold");
    let mut end = 0;
    for (addr, (_, size)) in model {
        assert!(*addr >= end, "allocations overlap at {addr:#x}");
        end = addr + size;
    }
    let allocated: u64 = model.values().map(|(_, s)| s).sum();
    assert_eq!(alloc.stats().allocated_bytes.all.current as u64, allocated);
}

fn inject(dev: &TestDevice, rng: &mut Rng) {
    let kinds = [
        CallKind::Map,
        CallKind::CreatePage,
        CallKind::Unmap,
        CallKind::SegmentAlloc,
        CallKind::CreateEvent,
    ];
    let kind = kinds[rng.below(kinds.len() as u64) as usize];
    let fault = if rng.below(2) == 0 {
        Fault::DeviceError
    } else {
        Fault::OutOfMemory
    };
    dev.faults.fail_nth(kind, 1 + rng.below(3), fault);
}

fn randomized(seed: u64, virtual_memory: bool, conf: &str) {
    let dev = TestDevice::new(SimBackend::with_options(512 * MIB, virtual_memory));
    dev.sim.set_manual_events(true);
    let alloc = allocator(&dev, conf);
    let mut rng = Rng(seed | 1);
    let mut model = Model::new();
    for _ in 0..2500 {
        let stream = StreamId(rng.below(3));
        match rng.below(100) {
            0..=44 => {
                let size = rng.size();
                match alloc.malloc(size, stream) {
                    Ok(ptr) => {
                        assert_eq!(ptr % 512, 0);
                        model.insert(ptr, (size, size.div_ceil(512) * 512));
                    }
                    Err(Error::OutOfMemory(report)) => assert!(report.requested == size),
                    Err(Error::Backend(_)) => {}
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            45..=84 if !model.is_empty() => {
                let addr = *model
                    .keys()
                    .nth(rng.below(model.len() as u64) as usize)
                    .expect("non-empty");
                // A failed event record falls back to a stream sync; either way the free happened.
                let _ = alloc.free(addr);
                model.remove(&addr);
                assert!(
                    matches!(alloc.free(addr), Err(Error::InvalidFree { .. })),
                    "double free refused"
                );
            }
            85..=90 if !model.is_empty() => {
                let addr = *model
                    .keys()
                    .nth(rng.below(model.len() as u64) as usize)
                    .expect("non-empty");
                alloc
                    .record_stream(addr, StreamId(10 + rng.below(2)))
                    .expect("live allocation");
            }
            91..=94 => dev.sim.complete_stream(StreamId(10 + rng.below(2))),
            95..=96 => {
                let _ = alloc.empty_cache();
            }
            _ => inject(&dev, &mut rng),
        }
        check_model(&alloc, &model);
    }
    dev.sim.complete_all();
    for addr in std::mem::take(&mut model).into_keys() {
        let _ = alloc.free(addr);
    }
    // Faults may still be armed: flush until the device is empty.
    for _ in 0..8 {
        if alloc.empty_cache().is_ok() && dev.sim.live_objects() == 0 {
            break;
        }
    }
    check_model(&alloc, &model);
    assert_eq!(dev.sim.live_objects(), 0, "nothing leaked");
    assert_eq!(alloc.stats().reserved_bytes.all.current, 0);
}

#[test]
fn randomized_with_virtual_memory() {
    for seed in [1, 2, 3] {
        randomized(seed, true, "policy:cachalot");
    }
    randomized(
        4,
        true,
        "policy:cachalot,cachalot_reuse_slack:0,cachalot_reuse_min_mb:0,cachalot_release_threshold_mb:8",
    );
    // Page by page with no slack: pages move between cells and leave aliases.
    for seed in [7, 8] {
        randomized(
            seed,
            true,
            "policy:cachalot,cachalot_reuse_slack:0,cachalot_reuse_min_mb:0,cachalot_extent_mb:2",
        );
    }
}

#[test]
fn randomized_with_segments() {
    for seed in [5, 6] {
        randomized(seed, false, "policy:cachalot");
    }
}

#[test]
fn zero_and_absurd_sizes_and_foreign_frees() {
    let dev = TestDevice::new(SimBackend::new(64 * MIB));
    let alloc = allocator(&dev, "");
    assert_eq!(alloc.malloc(0, StreamId(0)).unwrap(), 0);
    alloc.free(0).unwrap();
    assert!(matches!(
        alloc.malloc(u64::MAX, StreamId(0)),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(alloc.free(12345), Err(Error::InvalidFree { .. })));
    assert!(matches!(
        alloc.record_stream(12345, StreamId(1)),
        Err(Error::InvalidFree { .. })
    ));
    assert!(alloc.set_memory_fraction(1.5).is_err());
    alloc.validate().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
}

#[test]
fn freed_blocks_wait_for_recorded_streams() {
    let dev = TestDevice::new(SimBackend::new(64 * MIB));
    dev.sim.set_manual_events(true);
    let alloc = allocator(&dev, "");
    let a = alloc.malloc(4096, StreamId(0)).unwrap();
    alloc.record_stream(a, StreamId(7)).unwrap();
    alloc.free(a).unwrap();
    let s = alloc.stats();
    assert_eq!(
        (s.allocated_bytes.all.current, s.active_bytes.all.current),
        (0, 4096)
    );
    let b = alloc.malloc(4096, StreamId(0)).unwrap();
    assert_ne!(a, b, "the block still pending on stream 7 is not reused");
    dev.sim.complete_stream(StreamId(7));
    alloc.free(b).unwrap();
    let c = alloc.malloc(4096, StreamId(0)).unwrap();
    assert_eq!(
        alloc.stats().active_bytes.all.current,
        4096,
        "the pending free completed"
    );
    alloc.free(c).unwrap();
    alloc.validate().unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
}

#[test]
fn steady_reuse_makes_no_driver_calls() {
    let dev = TestDevice::new(SimBackend::new(1 << 30));
    let alloc = allocator(&dev, "");
    let sizes = [3 * MIB, 512, 40 * MIB, 70_000, 9 * MIB];
    let round = || {
        let ptrs: Vec<u64> = sizes
            .iter()
            .map(|s| alloc.malloc(*s, StreamId(0)).unwrap())
            .collect();
        ptrs.into_iter().for_each(|p| alloc.free(p).unwrap());
    };
    round();
    let calls = dev.calls.counts().memory_calls();
    for _ in 0..10 {
        round();
    }
    assert_eq!(dev.calls.counts().memory_calls(), calls);
    alloc.empty_cache().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
}

#[test]
fn out_of_memory_flushes_other_streams_then_reports() {
    let dev = TestDevice::new(SimBackend::new(64 * MIB));
    let alloc = allocator(&dev, "");
    let a = alloc.malloc(40 * MIB, StreamId(1)).unwrap();
    alloc.free(a).unwrap();
    assert_eq!(alloc.memory_reserved(), 40 * MIB, "cached on stream 1");
    let b = alloc
        .malloc(40 * MIB, StreamId(2))
        .expect("stream 1's cache is flushed for it");
    assert_eq!(alloc.stats().num_alloc_retries, 1);
    let err = alloc.malloc(40 * MIB, StreamId(2)).unwrap_err();
    let Error::OutOfMemory(report) = err else {
        panic!("expected OOM, got {err}")
    };
    assert_eq!(
        (report.requested, report.allocated, report.stream),
        (40 * MIB, 40 * MIB, StreamId(2))
    );
    assert!(report.to_string().contains("CUDA out of memory"));
    assert_eq!(alloc.stats().num_ooms, 1);
    alloc.free(b).unwrap();
    alloc.validate().unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
}

/// Every call the device served since `before`.
fn calls_since(dev: &TestDevice, before: &cachalot::backend::counting::CallCounts) -> u64 {
    dev.calls.counts().since(before).calls.values().sum()
}

/// A request the device could never hold (more than its memory, or than
/// the memory fraction allows) fails at once with PyTorch's message, at
/// most 2 driver calls (here one: the device's free memory, for the
/// message), where PyTorch native makes two `cudaMalloc` calls; what other
/// streams cache stays. Before, the policy mapped the whole device first
/// (15 calls).
#[test]
fn a_request_that_never_fits_fails_at_once() {
    for (virtual_memory, conf, size) in [
        (true, "", 1025 * MIB),
        (true, "cachalot_extent_mb:2", 1025 * MIB),
        (true, "per_process_memory_fraction:0.5", 513 * MIB),
        (false, "", 1025 * MIB),
    ] {
        let dev = TestDevice::new(SimBackend::with_options(1 << 30, virtual_memory));
        let alloc = allocator(&dev, conf);
        let cached = alloc.malloc(300 * MIB, StreamId(1)).unwrap();
        alloc.free(cached).unwrap();
        let reserved = alloc.memory_reserved();
        let before = dev.calls.counts();
        let err = alloc.malloc(size, StreamId(0)).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("CUDA out of memory. Tried to allocate"),
            "{conf}: {err}"
        );
        let calls = calls_since(&dev, &before);
        assert!(calls <= 2, "{conf}: {calls} driver calls");
        assert_eq!(alloc.memory_reserved(), reserved, "{conf}: the cache stays");
        assert_eq!(alloc.stats().num_ooms, 1);
        alloc.validate().unwrap();
    }
    // PyTorch native makes two memory calls for such a request (and asks
    // for the device's free memory).
    let dev = TestDevice::new(SimBackend::new(1 << 30));
    let native = cachalot::PytorchAllocator::new(dev.backend(), AllocatorConfig::default())
        .expect("allocator");
    native.malloc(1025 * MIB, StreamId(0)).unwrap_err();
    assert_eq!(dev.calls.counts().memory_calls(), 2);
}

/// No fixed limit on streams: 1000 streams and 300 private pools, each
/// holding a block at once, all allocate, free and validate, and the
/// device's statistics add up. Before, the 257th stream or lane was
/// refused.
#[test]
fn streams_and_private_pools_have_no_fixed_limit() {
    use cachalot::private_pool::PoolId;
    let dev = TestDevice::new(SimBackend::new(64 << 30));
    let alloc = allocator(&dev, "");
    let mut live = Vec::new();
    for s in 0..1000 {
        live.push(alloc.malloc(MIB + 512, StreamId(s)).unwrap());
    }
    for k in 0..300 {
        let pool = PoolId(1, k);
        alloc
            .begin_allocate_to_pool(pool, Arc::new(|_| true))
            .unwrap();
        live.push(alloc.malloc(3 * MIB, StreamId(k)).unwrap());
        alloc.end_allocate_to_pool(pool).unwrap();
    }
    alloc.validate().unwrap();
    let st = alloc.stats();
    let allocated = 1000 * (MIB + 512) + 300 * 3 * MIB;
    assert_eq!(st.allocated_bytes.all.current as u64, allocated);
    assert_eq!(st.allocated_bytes.all.peak as u64, allocated);
    for p in live {
        alloc.free(p).unwrap();
    }
    for k in 0..300 {
        alloc.release_pool(PoolId(1, k)).unwrap();
    }
    alloc.empty_cache().unwrap();
    alloc.validate().unwrap();
    assert_eq!(alloc.memory_reserved(), 0);
    assert_eq!(dev.sim.live_objects(), 0);
}

/// Address space is not a stream limit either: on a device of an H200's
/// size, each stream's two ranges (four and two times the device's memory)
/// would take all 128 TiB of it by the 153rd stream. 400 streams each
/// holding a large and a small block all allocate, in smaller ranges past
/// the first, and the ranges leave half the address space to the rest of
/// the process.
#[test]
fn address_space_is_shared_out_between_many_streams() {
    use cachalot::Backend;
    let dev = TestDevice::new(SimBackend::new(140 << 30));
    let alloc = allocator(&dev, "");
    let mut live = Vec::new();
    for s in 0..400 {
        live.push(alloc.malloc(4 * MIB, StreamId(s)).unwrap());
        live.push(alloc.malloc(4096, StreamId(s)).unwrap());
    }
    alloc.validate().unwrap();
    let rest = dev.sim.reserve_range(60 << 40).expect("address space left");
    dev.sim.release_range(rest, 60 << 40).unwrap();
    let big = alloc
        .malloc(100 << 30, StreamId(0))
        .expect("the first stream's range");
    alloc.free(big).unwrap();
    for p in live {
        alloc.free(p).unwrap();
    }
    alloc.empty_cache().unwrap();
    alloc.validate().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
}

/// Tens of thousands of streams each keeping a cached page (a server's
/// per-request streams, none idle to take over): found through the stream
/// table's indexes, and the device's exact peaks merged over all their
/// journals, each in time that does not grow with the table (the scans
/// before made 20,000 such streams take about 60 seconds; now about one).
#[test]
fn twenty_thousand_streams_keep_their_pages_at_once() {
    let dev = TestDevice::new(SimBackend::new(80 << 30));
    let alloc = allocator(&dev, "");
    for s in 0..20_000 {
        let p = alloc.malloc(512, StreamId(s + 1)).unwrap();
        alloc.free(p).unwrap();
    }
    let st = alloc.stats();
    assert_eq!(st.requested_bytes.all.peak, 512, "one block at a time");
    assert_eq!(st.reserved_bytes.all.current as u64, 20_000 * 2 * MIB);
    alloc.validate().unwrap();
    let p = alloc.malloc(512, StreamId(7)).unwrap();
    alloc.free(p).unwrap();
    alloc.empty_cache().unwrap();
    alloc.validate().unwrap();
    assert_eq!(alloc.memory_reserved(), 0);
    assert_eq!(dev.sim.live_objects(), 0);
}

#[test]
fn memory_fraction_limits_reserved_bytes() {
    let dev = TestDevice::new(SimBackend::new(100 * MIB));
    let alloc = allocator(&dev, "per_process_memory_fraction:0.5");
    assert!(
        matches!(alloc.malloc(60 * MIB, StreamId(0)), Err(Error::OutOfMemory(r)) if r.allowed == Some(50 * MIB))
    );
    alloc.set_memory_fraction(1.0).unwrap();
    let a = alloc.malloc(60 * MIB, StreamId(0)).unwrap();
    alloc.free(a).unwrap();
    alloc.empty_cache().unwrap();
    alloc.validate().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
}

#[test]
fn faults_end_in_typed_errors_with_nothing_leaked() {
    let cases = [
        (CallKind::Map, Fault::DeviceError, true),
        (CallKind::CreatePage, Fault::OutOfMemory, true),
        (CallKind::ReserveRange, Fault::DeviceError, true),
        (CallKind::SegmentAlloc, Fault::DeviceError, false),
        (CallKind::SegmentAlloc, Fault::OutOfMemory, false),
    ];
    for (kind, fault, vm) in cases {
        let dev = TestDevice::new(SimBackend::with_options(256 * MIB, vm));
        let alloc = allocator(&dev, "");
        let keep = alloc.malloc(4096, StreamId(0)).unwrap();
        // Fail the call a few pages into a 20 MiB allocation (always the first
        // call for kinds made once per allocation).
        dev.faults.fail_nth(kind, 3, fault);
        dev.faults.fail_nth(kind, 1, fault);
        let result = alloc.malloc(20 * MIB, StreamId(0));
        assert!(dev.faults.injected() >= 1, "{kind}: the fault fired");
        match (fault, &result) {
            (Fault::DeviceError, Err(Error::Backend(_))) => {}
            // Out of memory is retried after a flush, which may succeed.
            (Fault::OutOfMemory, Err(Error::OutOfMemory(_)) | Ok(_)) => {}
            other => panic!("{kind}: unexpected {other:?}"),
        }
        if let Ok(p) = result {
            alloc.free(p).unwrap();
        }
        alloc.validate().unwrap_or_else(|e| panic!("{kind}: {e}"));
        let _ = alloc.malloc(20 * MIB, StreamId(0)).map(|p| alloc.free(p));
        alloc.free(keep).unwrap();
        alloc.empty_cache().unwrap();
        alloc.validate().unwrap();
        assert_eq!(dev.sim.live_objects(), 0, "{kind}: leaked");
    }
}

#[test]
fn watermark_reached_mid_allocation_is_an_oom() {
    let dev = TestDevice::new(SimBackend::new(256 * MIB));
    let alloc = allocator(&dev, "");
    dev.limit.set(Some(10 * MIB));
    let err = alloc.malloc(20 * MIB, StreamId(0)).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory(_)), "{err}");
    alloc.validate().unwrap();
    dev.limit.set(None);
    let a = alloc.malloc(20 * MIB, StreamId(0)).unwrap();
    alloc.free(a).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
}

#[test]
fn threads_on_their_own_streams_with_cross_frees() {
    let dev = TestDevice::new(SimBackend::new(4 << 30));
    let alloc = Arc::new(allocator(&dev, ""));
    let handoff: Arc<Mutex<Vec<u64>>> = Arc::default();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (alloc, handoff) = (alloc.clone(), handoff.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9e37 + t);
                let mut live = Vec::new();
                for i in 0..4000 {
                    if live.len() < 32 && rng.below(2) == 0 {
                        live.push(alloc.malloc(rng.size() / 4 + 1, StreamId(t)).expect("fits"));
                    } else if let Some(p) = live.pop() {
                        if i % 7 == 0 {
                            handoff.lock().unwrap().push(p);
                        } else {
                            alloc.free(p).expect("live");
                        }
                    }
                    if let Some(p) = (i % 5 == 0)
                        .then(|| handoff.lock().unwrap().pop())
                        .flatten()
                    {
                        alloc.free(p).expect("live, freed by another thread");
                    }
                    if i % 500 == 0 {
                        alloc.validate().expect("invariants hold under concurrency");
                    }
                }
                live.into_iter().for_each(|p| alloc.free(p).expect("live"));
            })
        })
        .collect();
    threads
        .into_iter()
        .for_each(|t| t.join().expect("no panic"));
    for p in handoff.lock().unwrap().drain(..) {
        alloc.free(p).unwrap();
    }
    alloc.validate().unwrap();
    assert_eq!(alloc.stats().active.all.current, 0);
    alloc.empty_cache().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
}

/// Frees a hole too small for the next request: with no slack the stream
/// re-maps the hole's pages instead of creating new ones.
fn reserved_after_a_misfit(conf: &str) -> (u64, u64) {
    let dev = TestDevice::new(SimBackend::new(1 << 30));
    let alloc = allocator(&dev, conf);
    let a = alloc.malloc(8 * MIB, StreamId(0)).unwrap();
    let b = alloc.malloc(8 * MIB, StreamId(0)).unwrap();
    alloc.free(a).unwrap();
    let c = alloc.malloc(12 * MIB, StreamId(0)).unwrap();
    alloc.validate().unwrap();
    let out = (
        alloc.memory_reserved(),
        dev.calls.counts().count(CallKind::CreatePage),
    );
    for p in [b, c] {
        alloc.free(p).unwrap();
    }
    alloc.empty_cache().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
    out
}

/// Handles made for `n` blocks of 5 MiB laid out one after another (each
/// shares an end cell with the next) by a stream that never re-mapped.
fn handles_for_growth(conf: &str, n: usize) -> u64 {
    let dev = TestDevice::new(SimBackend::new(1 << 30));
    let alloc = allocator(&dev, conf);
    let blocks: Vec<u64> = (0..n)
        .map(|_| alloc.malloc(5 * MIB, StreamId(0)).unwrap())
        .collect();
    alloc.validate().unwrap();
    let made = dev.calls.counts().count(CallKind::CreatePage);
    blocks.into_iter().for_each(|p| alloc.free(p).unwrap());
    alloc.empty_cache().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
    made
}

#[test]
fn a_growing_stream_maps_each_block_past_its_frontier_in_one_handle() {
    // 8 blocks of 2.5 pages: the first takes cells 0-2, the next 2-4 (cell 2
    // already mapped), and so on. Each block's unmapped cells, its end cell
    // shared with the next block included, are one handle.
    assert_eq!(handles_for_growth("", 8), 8);
    // Page by page, the 20 cells are 20 handles.
    assert_eq!(handles_for_growth("cachalot_extent_mb:2", 8), 20);
}

#[test]
fn pages_are_remapped_past_the_reuse_slack() {
    // Page by page (one handle per page), so pages can be counted.
    let (tight, tight_pages) = reserved_after_a_misfit(
        "cachalot_reuse_slack:0,cachalot_reuse_min_mb:0,cachalot_extent_mb:2",
    );
    let (loose, loose_pages) =
        reserved_after_a_misfit("cachalot_reuse_slack:1,cachalot_extent_mb:2");
    assert_eq!(tight, 20 * MIB, "only the pages under b and c stay mapped");
    assert_eq!(tight_pages, 10);
    assert_eq!(loose, 28 * MIB, "a's pages stay cached");
    assert_eq!(loose_pages, 14);
    // With bulk handles, a's 4 pages are one handle. c, past the stream's
    // last mapped cell at a new peak, takes a handle of the 2 pages its
    // budget leaves room for; a's handle goes back whole for its next page,
    // and its last 3 pages are one handle.
    let (bulk, handles) = reserved_after_a_misfit("cachalot_reuse_slack:0,cachalot_reuse_min_mb:0");
    assert_eq!(bulk, 20 * MIB);
    assert_eq!(handles, 5, "a, b, then c in three");
    let (floor, _) = reserved_after_a_misfit("cachalot_reuse_slack:0,cachalot_reuse_min_mb:8");
    assert_eq!(
        floor,
        28 * MIB,
        "the 8 MiB floor keeps a's 4 pages without any slack"
    );
}

/// Reserved bytes after `small` blocks of 512 KiB are freed (idle small
/// pages) and one large block of `large` bytes takes the stream to a new peak.
fn reserved_after_a_peak(small: usize, large: u64) -> u64 {
    let dev = TestDevice::new(SimBackend::new(1 << 30));
    let alloc = allocator(&dev, "");
    let blocks: Vec<u64> = (0..small)
        .map(|_| alloc.malloc(512 * 1024, StreamId(0)).unwrap())
        .collect();
    for p in blocks {
        alloc.free(p).unwrap();
    }
    assert_eq!(alloc.memory_reserved(), small as u64 / 4 * 2 * MIB);
    let big = alloc.malloc(large, StreamId(0)).unwrap();
    alloc.validate().unwrap();
    let reserved = alloc.memory_reserved();
    alloc.free(big).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);
    reserved
}

/// The blocks of the small pool's mapped runs after 1 MiB, 2 KiB and 1 MiB
/// blocks are allocated, then freed with `held` still live.
fn small_blocks_after_frees(held: Option<u64>) -> Vec<usize> {
    let dev = TestDevice::new(SimBackend::new(1 << 30));
    let alloc = allocator(&dev, "");
    let held = held.map(|size| alloc.malloc(size, StreamId(0)).unwrap());
    for p in [MIB, 2048, MIB].map(|size| alloc.malloc(size, StreamId(0)).unwrap()) {
        alloc.free(p).unwrap();
    }
    alloc.validate().unwrap();
    let snapshot = alloc.snapshot();
    let small = snapshot.segments.iter().filter(|s| s.is_small);
    let blocks = small.map(|s| s.blocks.len()).collect();
    held.into_iter().for_each(|p| alloc.free(p).unwrap());
    blocks
}

#[test]
fn an_emptied_stream_merges_its_kept_blocks() {
    // The small pool keeps freed blocks apart for reuse at their sizes
    // while the stream's work goes on (a large block is live)...
    assert_eq!(small_blocks_after_frees(Some(4 * MIB)), [4]);
    // ...and merges them once nothing is live: the next work is laid out
    // from whole free pages, as the first was (llama_train_bf16's second
    // pass mapped a small page its first did not need).
    assert_eq!(small_blocks_after_frees(None), [1]);
}

#[test]
fn a_new_peak_gives_back_the_other_pools_idle_pages() {
    // Ten idle small pages, then a 100 MiB peak: all but one (2% of the
    // peak's 50 pages) go back before the large pool maps its pages (the
    // budget, at least 32 MiB over the peak, would have kept them).
    assert_eq!(reserved_after_a_peak(40, 100 * MIB), 102 * MIB);
    // One idle small page is less than 2% of a 200 MiB peak: it stays.
    assert_eq!(reserved_after_a_peak(4, 200 * MIB), 202 * MIB);
}

#[test]
fn the_release_threshold_bounds_cached_pages() {
    // Page by page, 4 MiB of pages stay cached; with bulk handles (one per
    // 16 MiB block) a whole handle goes back, so none stays.
    for (conf, left) in [(",cachalot_extent_mb:2", 4 * MIB), ("", 0)] {
        let dev = TestDevice::new(SimBackend::new(1 << 30));
        let alloc = allocator(&dev, &format!("cachalot_release_threshold_mb:4{conf}"));
        let ptrs: Vec<u64> = (0..4)
            .map(|_| alloc.malloc(16 * MIB, StreamId(0)).unwrap())
            .collect();
        for p in ptrs {
            alloc.free(p).unwrap();
            alloc.validate().unwrap();
            assert!(alloc.memory_reserved() - alloc.memory_allocated() <= 4 * MIB);
        }
        assert_eq!(alloc.memory_reserved(), left, "{conf}");
        alloc.empty_cache().unwrap();
        assert_eq!(dev.sim.live_objects(), 0);
    }
}

#[test]
fn a_failed_allocation_leaves_no_partial_mapping() {
    // Page by page, the fourth page fails; with bulk handles, the second
    // handle (an 80 MiB block takes one of 32 pages, then one of 8).
    for (conf, size, nth) in [("cachalot_extent_mb:2", 20 * MIB, 4), ("", 80 * MIB, 2)] {
        let dev = TestDevice::new(SimBackend::new(1 << 30));
        let alloc = allocator(&dev, conf);
        dev.faults.fail_nth(CallKind::Map, nth, Fault::DeviceError);
        assert!(matches!(
            alloc.malloc(size, StreamId(0)),
            Err(Error::Backend(_))
        ));
        alloc.validate().unwrap();
        assert_eq!(
            alloc.memory_reserved(),
            0,
            "{conf}: what was mapped before the failure went back"
        );
        assert_eq!(dev.sim.counters().used, 0);
        alloc.empty_cache().unwrap();
        assert_eq!(dev.sim.live_objects(), 0);
    }
}

/// A page re-mapped from a freed block is unmapped only after the stream's
/// queued work is done: on a GPU, a kernel still reading the freed block would
/// fault on a page unmapped under it (found on an H100 with the tightest
/// re-mapping settings). A failed synchronization leaves the page mapped.
#[test]
fn freed_pages_are_unmapped_only_after_the_stream_is_synchronized() {
    let tight = "policy:cachalot,cachalot_reuse_slack:0,cachalot_reuse_min_mb:0";
    let dev = TestDevice::new(SimBackend::new(1 << 30));
    let alloc = allocator(&dev, tight);
    // A freed, B live, C placed past B: C takes A's pages.
    let remap = |alloc: &CachalotAllocator| {
        let a = alloc.malloc(8 * MIB, StreamId(0)).unwrap();
        let b = alloc.malloc(8 * MIB, StreamId(0)).unwrap();
        alloc.free(a).unwrap();
        (b, alloc.malloc(10 * MIB, StreamId(0)))
    };
    let (b, c) = remap(&alloc);
    let count = |kind| dev.calls.counts().count(kind);
    assert!(
        count(CallKind::Unmap) > 0,
        "the third block re-maps the first's pages"
    );
    assert_eq!(count(CallKind::SynchronizeStream), 1);
    alloc.free(b).unwrap();
    alloc.free(c.unwrap()).unwrap();
    alloc.empty_cache().unwrap();
    assert_eq!(dev.sim.live_objects(), 0);

    let dev = TestDevice::new(SimBackend::new(1 << 30));
    let alloc = allocator(&dev, tight);
    for n in 1..=8 {
        dev.faults
            .fail_nth(CallKind::SynchronizeStream, n, Fault::DeviceError);
        dev.faults
            .fail_nth(CallKind::SynchronizeDevice, n, Fault::DeviceError);
    }
    let (b, c) = remap(&alloc);
    assert!(matches!(c, Err(Error::Backend(_))), "{c:?}");
    assert_eq!(dev.calls.counts().count(CallKind::Unmap), 0);
    alloc.validate().unwrap();
    alloc.free(b).unwrap();
    // Once the device answers again, everything goes back.
    let emptied = (0..10).any(|_| alloc.empty_cache().is_ok());
    assert!(emptied);
    assert_eq!(dev.sim.live_objects(), 0);
}

/// Every statistic with a peak, as (family, pool) names and numbers.
fn gauges(s: &cachalot::MemoryStats) -> Vec<(String, i64, i64)> {
    s.to_map()
        .into_iter()
        .filter_map(|(key, current)| {
            let family = key.strip_suffix(".current")?;
            let peak = s.to_map()[&format!("{family}.peak")];
            Some((family.to_string(), current, peak))
        })
        .collect()
}

/// Threads on streams of their own pass one block's worth of memory around
/// a ring: each waits for its turn, allocates, frees and hands over, while
/// the others churn small blocks below the peak. The device never holds two
/// of the large blocks at once, so its peak is one large block plus what the
/// churning threads can hold, however many changes the journals hold when
/// read, and every read in between agrees.
#[test]
fn threads_handing_memory_over_peak_as_one_device() {
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 400;
    const MOST: i64 = (64 * MIB + THREADS * 512) as i64;
    let dev = TestDevice::new(SimBackend::with_options(8 << 30, true));
    let alloc = Arc::new(allocator(&dev, ""));
    let turn = Arc::new((Mutex::new(0u64), std::sync::Condvar::new()));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (alloc, turn) = (alloc.clone(), turn.clone());
            std::thread::spawn(move || {
                let stream = StreamId(t + 1);
                for round in 0..ROUNDS {
                    let mine = round * THREADS + t;
                    let (lock, cv) = &*turn;
                    let mut at = lock.lock().unwrap();
                    while *at != mine {
                        // Small churn while waiting: at most one 512-byte
                        // block per thread at a time; the peak read meanwhile
                        // (while other threads settle the cuts they took)
                        // never counts two large blocks.
                        drop(at);
                        for _ in 0..64 {
                            let p = alloc.malloc(512, stream).unwrap();
                            alloc.free(p).unwrap();
                        }
                        let peak = alloc.stats().allocated_bytes.all.peak;
                        assert!(peak <= MOST, "peak {peak} while running");
                        at = lock.lock().unwrap();
                        if *at != mine {
                            at = cv
                                .wait_timeout(at, std::time::Duration::from_micros(50))
                                .unwrap()
                                .0;
                        }
                    }
                    let big = alloc.malloc(64 * MIB, stream).unwrap();
                    alloc.free(big).unwrap();
                    *at += 1;
                    cv.notify_all();
                }
            })
        })
        .collect();
    handles.into_iter().for_each(|h| h.join().unwrap());
    let peak = alloc.stats().allocated_bytes.all.peak;
    assert!(
        (64 * MIB as i64..=MOST).contains(&peak),
        "peak {peak}: more than one large block at once, or less than one"
    );
    alloc.validate().unwrap();
}

/// Runs `turn` `turns` times on each of `threads` threads, thread `t` on
/// stream `t + 1` with the state `start(t)` made, one thread at a time in
/// round-robin order, handing over through an atomic (release and acquire:
/// nothing the allocator sees); returns each thread's state.
fn in_turns<S: Send + 'static>(
    threads: u64,
    turns: u64,
    start: impl Fn(u64) -> S + Send + Sync + 'static,
    turn: impl Fn(StreamId, &mut S) + Send + Sync + 'static,
) -> Vec<S> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let now = Arc::new(AtomicU64::new(0));
    let (start, turn) = (Arc::new(start), Arc::new(turn));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (now, start, turn) = (now.clone(), start.clone(), turn.clone());
            std::thread::spawn(move || {
                let mut state = start(t);
                for round in 0..turns {
                    let mine = round * threads + t;
                    while now.load(Ordering::Acquire) != mine {
                        std::hint::spin_loop();
                    }
                    turn(StreamId(t + 1), &mut state);
                    now.store(mine + 1, Ordering::Release);
                }
                state
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Threads on streams of their own take long turns (`in_turns`): in its
/// turn a thread allocates a large block, churns small ones and frees the
/// large block. One thread at a time keeps the device to itself, so its
/// stamps chain without reading the clock (`stamp`); the next thread's first
/// stamp must still come after the last one's free, or the device would hold
/// two large blocks at once.
#[test]
fn threads_taking_long_turns_peak_as_one_device() {
    let dev = TestDevice::new(SimBackend::with_options(8 << 30, true));
    let alloc = Arc::new(allocator(&dev, ""));
    let a = alloc.clone();
    in_turns(
        3,
        300,
        |_| (),
        move |stream, _| {
            let big = a.malloc(64 * MIB, stream).unwrap();
            for _ in 0..40 {
                let p = a.malloc(512, stream).unwrap();
                a.free(p).unwrap();
            }
            a.free(big).unwrap();
        },
    );
    let peak = alloc.stats().allocated_bytes.all.peak;
    assert_eq!(
        peak,
        (64 * MIB + 512) as i64,
        "one large block and one small at most"
    );
    alloc.validate().unwrap();
}

/// Threads on streams of their own take turns of random length (1 to 60
/// operations: short turns make the device contended, long ones let a thread
/// chain its stamps; `in_turns`), each allocating and freeing blocks of its
/// own. The turns put every operation in one order, so a model replayed in
/// that order has the device's exact peaks.
#[test]
fn threads_taking_turns_of_random_length_peak_as_the_model_says() {
    use std::sync::atomic::{AtomicI64, Ordering};
    let dev = TestDevice::new(SimBackend::with_options(16 << 30, true));
    let alloc = Arc::new(allocator(&dev, ""));
    // Allocated and requested bytes now and at their peaks, in turn order.
    let model: Arc<[AtomicI64; 4]> = Arc::new(Default::default());
    let (a, m) = (alloc.clone(), model.clone());
    let start = |t: u64| (Rng(0x7a11 + 977 * t), Vec::<(u64, i64, i64)>::new());
    let states = in_turns(3, 200, start, move |stream, (rng, live)| {
        let load = |i: usize| m[i].load(Ordering::Relaxed);
        let mut usage = Usage {
            allocated: load(0),
            requested: load(1),
            peak_allocated: load(2),
            peak_requested: load(3),
        };
        for _ in 0..1 + rng.below(60) {
            random_step(&a, rng, live, 8, |_| stream, &mut usage);
        }
        let Usage {
            allocated,
            requested,
            peak_allocated,
            peak_requested,
        } = usage;
        for (cell, v) in m
            .iter()
            .zip([allocated, requested, peak_allocated, peak_requested])
        {
            cell.store(v, Ordering::Relaxed);
        }
    });
    let stats = alloc.stats();
    let model: Vec<i64> = model.iter().map(|v| v.load(Ordering::Relaxed)).collect();
    assert_eq!(stats.allocated_bytes.all.current, model[0]);
    assert_eq!(stats.allocated_bytes.all.peak, model[2], "peak allocated");
    assert_eq!(stats.requested_bytes.all.peak, model[3], "peak requested");
    alloc.validate().unwrap();
    for (_, live) in states {
        live.into_iter()
            .for_each(|(p, _, _)| alloc.free(p).unwrap());
    }
}

/// With several streams the device's peaks are those of the device's
/// figures over time (the highest current value seen after any operation),
/// not the sum of each stream's peak: 100 MiB on one stream, freed, then
/// 100 MiB on another peak at 100 MiB. A seeded mix on four streams, with
/// frees pending on recorded streams, resets of the peaks and both kinds of
/// memory (pages and segments), checked after every operation.
#[test]
fn several_streams_peak_as_one_device() {
    for virtual_memory in [true, false] {
        // Room for every block: an operation that runs out of memory flushes
        // the caches within it, a peak no model between operations sees.
        let dev = TestDevice::new(SimBackend::with_options(8 << 30, virtual_memory));
        dev.sim.set_manual_events(true);
        let alloc = allocator(&dev, "");
        let a = alloc.malloc(100 * MIB, StreamId(0)).unwrap();
        alloc.free(a).unwrap();
        let b = alloc.malloc(100 * MIB, StreamId(1)).unwrap();
        assert_eq!(
            alloc.stats().allocated_bytes.all.peak,
            100 * MIB as i64,
            "one 100 MiB block at a time"
        );
        alloc.free(b).unwrap();
        alloc.reset_peak_stats();

        let mut model: BTreeMap<String, i64> = BTreeMap::new();
        for (name, current, _) in gauges(&alloc.stats()) {
            model.insert(name, current);
        }
        let mut rng = Rng(0x5eed ^ u64::from(virtual_memory));
        let mut live: Vec<u64> = Vec::new();
        let mut allocated = 0i64;
        let mut sizes = BTreeMap::new();
        for step in 0..3000 {
            match rng.below(100) {
                0..=49 if live.len() < 64 => {
                    let size = rng.size() / 2 + 1;
                    let p = alloc.malloc(size, StreamId(rng.below(4))).expect("fits");
                    allocated += size.div_ceil(512) as i64 * 512;
                    sizes.insert(p, size.div_ceil(512) * 512);
                    live.push(p);
                }
                0..=89 if !live.is_empty() => {
                    let p = live.swap_remove(rng.below(live.len() as u64) as usize);
                    if rng.below(4) == 0 {
                        alloc.record_stream(p, StreamId(10)).unwrap();
                    }
                    alloc.free(p).unwrap();
                    allocated -= sizes.remove(&p).unwrap() as i64;
                }
                90..=94 => dev.sim.complete_stream(StreamId(10)),
                95 => {
                    alloc.reset_peak_stats();
                    for (name, current, _) in gauges(&alloc.stats()) {
                        model.insert(name, current);
                    }
                }
                96 => alloc.empty_cache().unwrap(),
                _ => {}
            }
            let stats = alloc.stats();
            assert_eq!(stats.allocated_bytes.all.current, allocated);
            for (name, current, peak) in gauges(&stats) {
                let seen = model.entry(name.clone()).or_default();
                *seen = (*seen).max(current);
                if name.starts_with("segment.") || name.starts_with("inactive_split") {
                    // Runs of pages and split blocks split and merge within
                    // one operation (an unmap in a run, then a map that
                    // joins two; a segment freed, then one allocated), so
                    // the peak may be above every value seen between them.
                    assert!(peak >= *seen, "{name} at step {step}: {peak} < {seen}");
                    *seen = peak;
                } else if name.starts_with("reserved_bytes") {
                    // A stream that maps pages up to its budget, then takes a
                    // cached handle of several pages back to the device for
                    // one more page, held more within the operation than
                    // after it: by less than one handle of the default size.
                    assert!(
                        peak >= *seen && peak - *seen < 64 << 20,
                        "{name} at step {step}: peak {peak}, {seen} seen"
                    );
                    *seen = peak;
                } else {
                    assert_eq!(peak, *seen, "{name} at step {step} (vm {virtual_memory})");
                }
            }
        }
        alloc.validate().unwrap();
        dev.sim.complete_all();
        live.into_iter().for_each(|p| alloc.free(p).unwrap());
        alloc.empty_cache().unwrap();
        assert_eq!(dev.sim.live_objects(), 0);
    }
}

/// Many operations on several streams with no read between them: the
/// journals fill again and again, and the cuts they ask for are settled on
/// the allocator's settler thread while this thread goes on. The peaks read
/// at the end are the model's (one thread, so one order), and reading them
/// waits for every cut handed over.
#[test]
fn cuts_settled_apart_give_the_exact_peaks() {
    let dev = TestDevice::new(SimBackend::with_options(64 << 30, true));
    let alloc = allocator(&dev, "");
    let mut rng = Rng(0xc0ff_ee11);
    let mut live: Vec<(u64, i64, i64)> = Vec::new();
    let mut usage = Usage::default();
    for _ in 0..60_000 {
        let stream = |rng: &mut Rng| StreamId(rng.below(6));
        random_step(&alloc, &mut rng, &mut live, 48, stream, &mut usage);
    }
    let stats = alloc.stats();
    assert_eq!(stats.allocated_bytes.all.current, usage.allocated);
    assert_eq!(stats.allocated_bytes.all.peak, usage.peak_allocated);
    assert_eq!(stats.requested_bytes.all.peak, usage.peak_requested);
    alloc.validate().unwrap();
    live.into_iter()
        .for_each(|(p, _, _)| alloc.free(p).unwrap());
    alloc.empty_cache().unwrap();
    drop(alloc);
    assert_eq!(dev.sim.live_objects(), 0);
}
