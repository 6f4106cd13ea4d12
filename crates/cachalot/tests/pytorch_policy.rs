//! Behaviours of the `pytorch` policy that the goldens do not exercise:
//! garbage collection, expandable-segment snapshots and unmapping, the oversize
//! release step, and cross-stream frees with manual events.

use std::sync::Arc;

use cachalot::backend::counting::Counting;
use cachalot::backend::sim::SimBackend;
use cachalot::backend::CallKind;
use cachalot::{AllocatorConfig, DeviceAllocator, PrivatePools, PytorchAllocator, StreamId};
use cachalot_testkit::pools::OwnAllocator;

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;

fn make(conf: &str, capacity: u64) -> (Arc<Counting<SimBackend>>, PytorchAllocator) {
    let sim = Arc::new(Counting::new(Arc::new(SimBackend::new(capacity))));
    let a = PytorchAllocator::new(sim.clone(), AllocatorConfig::parse(conf).unwrap()).unwrap();
    (sim, a)
}

#[test]
fn garbage_collection_frees_old_cached_segments_without_a_retry() {
    let (_, a) = make("garbage_collection_threshold:0.5", 1 << 30);
    a.set_memory_fraction(0.5).unwrap();
    let blocks: Vec<u64> = (0..6).map(|_| a.malloc(50 * MIB, S0).unwrap()).collect();
    for p in blocks {
        a.free(p).unwrap();
    }
    assert_eq!(a.memory_reserved(), 300 * MIB);
    let big = a.malloc(100 * MIB, S0).unwrap();
    let st = a.stats();
    assert!(st.num_device_free > 0, "GC released cached segments");
    assert_eq!(st.num_alloc_retries, 0);
    assert!(a.memory_reserved() < 300 * MIB + 100 * MIB);
    a.free(big).unwrap();
    a.validate().unwrap();
}

#[test]
fn expandable_segments_map_pages_and_unmap_free_ones() {
    let (sim, a) = make("expandable_segments:True", 8 << 30);
    let p = a.malloc(30 * MIB, S0).unwrap();
    let q = a.malloc(30 * MIB, S0).unwrap();
    let st = a.stats();
    assert_eq!(st.segment.all.current, 0, "maps do not count as segments");
    assert_eq!(st.memory_reserved(), 60 * MIB, "three 20 MiB pages");
    assert_eq!(st.num_device_alloc, 2);
    assert_eq!(q, p + 30 * MIB, "one growing segment");
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert!(snap.segments[0].is_expandable);
    a.free(p).unwrap();
    assert_eq!(
        a.stats().inactive_split.all.current,
        0,
        "expandable blocks are not inactive splits"
    );
    a.empty_cache().unwrap();
    a.validate().unwrap();
    assert_eq!(
        a.memory_reserved(),
        40 * MIB,
        "the first page is unmapped; the second holds q"
    );
    let snap = a.snapshot();
    assert_eq!(snap.segments.len(), 1);
    assert_eq!(snap.segments[0].address, p + 20 * MIB);
    assert!(sim.counts().count(CallKind::Unmap) >= 1);
    a.free(q).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(sim.inner().live_objects(), 0);
}

#[test]
fn oversize_blocks_are_released_before_the_final_retry() {
    let (_, a) = make("max_split_size_mb:64", 1 << 30);
    a.set_memory_fraction(0.5).unwrap();
    let big: Vec<u64> = (0..4).map(|_| a.malloc(100 * MIB, S0).unwrap()).collect();
    for p in &big {
        a.free(*p).unwrap();
    }
    let p = a.malloc(300 * MIB, S0).unwrap();
    let st = a.stats();
    assert_eq!(
        st.num_alloc_retries, 0,
        "releasing cached oversize segments sufficed"
    );
    assert_eq!(st.num_sync_all_streams, 0);
    assert_eq!(
        st.oversize_segments.current, 2,
        "one cached 100 MiB segment was kept"
    );
    assert_eq!(a.memory_reserved(), 400 * MIB);
    a.free(p).unwrap();
    a.validate().unwrap();
}

#[test]
fn cross_stream_free_waits_for_the_other_stream() {
    let (sim, a) = make("", 1 << 30);
    sim.inner().set_manual_events(true);
    let p = a.malloc(4 * MIB, S0).unwrap();
    a.record_stream(p, StreamId(5)).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(4 * MIB, S0).unwrap();
    assert_ne!(q, p, "the block is still in use by stream 5");
    a.validate().unwrap();
    sim.inner().complete_stream(StreamId(5));
    let r = a.malloc(4 * MIB, S0).unwrap();
    assert_eq!(r, p, "reclaimed at the next malloc");
    assert_eq!(a.snapshot().segments.len(), 1);
    for x in [q, r] {
        a.free(x).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(sim.inner().live_objects(), 0);
}

/// As PyTorch 2.11: a block freed while a route is open waits, once the route
/// closes, only for the streams recorded before the route; streams recorded
/// during it carry captured work that has not run.
#[test]
fn frees_deferred_by_a_route_drop_the_streams_recorded_during_it() {
    use cachalot::private_pool::PoolId;
    let (sim, a) = make("", 1 << 30);
    sim.inner().set_manual_events(true);
    let (before, during) = (StreamId(5), StreamId(6));
    let p = a.malloc(4 * MIB, S0).unwrap();
    let q = a.malloc(4 * MIB, S0).unwrap();
    a.record_stream(p, before).unwrap();
    a.begin_allocate_to_pool(PoolId(1, 0), Arc::new(move |s| s == during))
        .unwrap();
    a.record_stream(p, during).unwrap();
    a.record_stream(q, during).unwrap();
    a.free(p).unwrap();
    a.free(q).unwrap();
    assert_eq!(
        a.stats().active.all.current,
        2,
        "both wait for the route to close"
    );
    a.end_allocate_to_pool(PoolId(1, 0)).unwrap();
    a.release_pool(PoolId(1, 0)).unwrap();
    let r = a.malloc(4 * MIB, S0).unwrap();
    assert_eq!(r, q, "q waited only for the captured stream: freed at once");
    sim.inner().complete_stream(during);
    let t = a.malloc(4 * MIB, S0).unwrap();
    assert_ne!(
        t, p,
        "p still waits for the stream recorded before the route"
    );
    sim.inner().complete_stream(before);
    a.free(r).unwrap();
    a.free(t).unwrap();
    a.empty_cache().unwrap();
    a.validate().unwrap();
    assert_eq!(a.memory_reserved(), 0);
}

/// As PyTorch 2.11's `emptyCache(pool)` (a MemPool's destructor): it waits
/// for the events of that pool's blocks only; other blocks stay pending.
#[test]
fn emptying_one_pool_waits_only_for_its_blocks() {
    use cachalot::private_pool::PoolId;
    let (sim, a) = make("", 1 << 30);
    sim.inner().set_manual_events(true);
    let pool = PoolId(0, 1);
    let side = StreamId(7);
    a.create_pool(pool).unwrap();
    a.begin_allocate_to_pool(pool, Arc::new(|_| true)).unwrap();
    let in_pool = a.malloc(4 * MIB, S0).unwrap();
    a.end_allocate_to_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    let outside = a.malloc(4 * MIB, S0).unwrap();
    for p in [in_pool, outside] {
        a.record_stream(p, side).unwrap();
        a.free(p).unwrap();
    }
    a.release_pool(pool).unwrap();
    a.empty_pool_cache(pool).unwrap();
    let st = a.stats();
    assert_eq!(
        st.active.all.current, 1,
        "the default pool's block still waits"
    );
    assert_eq!(st.num_sync_all_streams, 1);
    assert_eq!(
        a.memory_reserved(),
        20 * MIB,
        "the pool's segment went back"
    );
    sim.inner().complete_stream(side);
    a.empty_cache().unwrap();
    a.validate().unwrap();
    assert_eq!(a.memory_reserved(), 0);
}

#[test]
fn settings_changed_at_run_time_apply_from_the_next_call() {
    let (_, a) = make("", 8 << 30);
    let allocated = |a: &PytorchAllocator| a.stats().allocated_bytes.all.current as u64;
    let x = a.malloc(84 * MIB, S0).unwrap();
    assert_eq!(allocated(&a), 84 * MIB);
    let mut settings = a.config().placement_settings();
    settings.roundup_power2_divisions = [4; 16];
    a.set_placement_settings(&settings);
    let y = a.malloc(84 * MIB, S0).unwrap();
    assert_eq!(
        allocated(&a),
        84 * MIB + 96 * MIB,
        "64 MiB to 128 MiB in steps of 16"
    );
    settings.expandable_segments = true;
    settings.max_split_size = Some(40 * MIB);
    a.set_placement_settings(&settings);
    let z = a.malloc(30 * MIB, S0).unwrap();
    let snap = a.snapshot();
    assert_eq!(snap.segments.iter().filter(|s| s.is_expandable).count(), 1);
    assert_eq!(snap.segments.iter().filter(|s| !s.is_expandable).count(), 2);
    let st = a.stats();
    assert_eq!(st.max_split_size, 40 * MIB as i64);
    assert_eq!(
        st.oversize_allocations.current, 2,
        "x and y, counted under the new limit"
    );
    a.validate().unwrap();
    settings = AllocatorConfig::default().placement_settings();
    a.set_placement_settings(&settings);
    for p in [x, y, z] {
        a.free(p).unwrap();
    }
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(a.stats().max_split_size, -1);
    a.validate().unwrap();
}

#[test]
fn a_pool_with_an_allocator_of_its_own_takes_its_segments_from_it() {
    use cachalot::private_pool::PoolId;
    let (sim, a) = make("expandable_segments:True", 8 << 30);
    let own = Arc::new(OwnAllocator::new(sim.clone()));
    let pool = PoolId(0, 7);
    a.create_pool(pool).unwrap();
    a.set_pool_source(pool, own.clone()).unwrap();
    a.begin_allocate_to_pool(pool, Arc::new(|_| true)).unwrap();
    let x = a.malloc(MIB, S0).unwrap();
    let y = a.malloc(MIB, S0).unwrap();
    let z = a.malloc(MIB, S0).unwrap();
    let before = a.stats().allocated_bytes.all.current;
    let w = a.malloc(19 * MIB + MIB / 2, S0).unwrap();
    assert_eq!(
        a.stats().allocated_bytes.all.current - before,
        20 * MIB as i64,
        "plain segments' split rule: a 512 KiB remainder stays with the block"
    );
    a.end_allocate_to_pool(pool).unwrap();
    assert_eq!(
        own.live.lock().unwrap().len(),
        3,
        "two small segments of 2 MiB and one of 20 MiB"
    );
    assert!(own.holds(x) && y == x + MIB && own.holds(z));
    let outside = a.malloc(MIB, S0).unwrap();
    let snap = a.snapshot();
    assert_eq!(
        snap.segments.iter().filter(|s| s.is_expandable).count(),
        1,
        "the default pool maps pages"
    );
    assert_eq!(snap.segments.iter().filter(|s| !s.is_expandable).count(), 3);
    for p in [x, y, z, w, outside] {
        a.free(p).unwrap();
    }
    a.release_pool(pool).unwrap();
    a.release_pool(pool).unwrap();
    a.empty_cache().unwrap();
    assert!(
        own.live.lock().unwrap().is_empty(),
        "given back to the pool's allocator"
    );
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(sim.inner().live_objects(), 0);
    a.validate().unwrap();
}
