//! Conformance checks of private pools (CUDA graph pools, `MemPool`), each a
//! function of a fresh allocator.

use std::sync::{Arc, Mutex};

use cachalot::backend::{Backend, BackendResult, DevicePtr};
use cachalot::private_pool::{PoolAllocation, PoolId, PoolOptions, RouteFilter, SegmentSource};
use cachalot::snapshot::BlockState;
use cachalot::{DeviceAllocator, Error, PolicyKind, StreamId};

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId::DEFAULT;
const GRAPH: PoolId = PoolId(1, 0);
const MEMPOOL: PoolId = PoolId(0, 1);

/// The side stream (one of the device's own on a real GPU).
fn s1() -> StreamId {
    crate::conformance::side_stream()
}

fn valid(a: &dyn DeviceAllocator) {
    if let Err(e) = a.validate() {
        panic!("{e}");
    }
}

fn only(stream: StreamId) -> RouteFilter {
    Arc::new(move |s| s == stream)
}

/// The pool id of the segment holding `ptr`.
fn pool_of(a: &dyn DeviceAllocator, ptr: u64) -> PoolId {
    a.snapshot()
        .segments
        .iter()
        .find(|s| s.address <= ptr && ptr < s.address + s.total_size)
        .map(|s| s.pool_id)
        .expect("a live allocation lies in a segment")
}

/// A route sends only the streams its filter accepts to the pool; the pool's
/// freed blocks serve neither the default pools nor another pool, and its
/// memory outlives `empty_cache` until the last use is released.
pub fn private_pool_serves_only_its_routes(a: &dyn DeviceAllocator) {
    a.begin_allocate_to_pool(GRAPH, only(s1())).unwrap();
    let in_pool = a.malloc(30 * MIB, s1()).unwrap();
    let small_in_pool = a.malloc(1000, s1()).unwrap();
    let outside = a.malloc(30 * MIB, S0).unwrap();
    valid(a);
    assert_eq!(pool_of(a, in_pool), GRAPH);
    assert_eq!(pool_of(a, small_in_pool), GRAPH);
    assert_eq!(pool_of(a, outside), PoolId::DEFAULT);
    let live: Vec<u64> = a
        .pool_allocations(GRAPH)
        .unwrap()
        .iter()
        .map(|x| x.ptr)
        .collect();
    assert_eq!(live, {
        let mut v = vec![in_pool, small_in_pool];
        v.sort_unstable();
        v
    });
    a.free(in_pool).unwrap();
    a.free(small_in_pool).unwrap();
    a.end_allocate_to_pool(GRAPH).unwrap();
    assert!(a.pool_allocations(GRAPH).unwrap().is_empty());
    // The pool's cached block is not the default pools' to take.
    let after = a.malloc(30 * MIB, s1()).unwrap();
    assert_eq!(pool_of(a, after), PoolId::DEFAULT);
    a.free(after).unwrap();
    a.free(outside).unwrap();
    a.empty_cache().unwrap();
    valid(a);
    let kept = a.memory_reserved();
    assert!(
        kept >= 30 * MIB,
        "the graph's pool keeps its memory: {kept}"
    );
    assert!(a.snapshot().segments.iter().all(|s| s.pool_id == GRAPH));
    assert_eq!(a.pool_use_count(GRAPH), 1);
    a.release_pool(GRAPH).unwrap();
    assert_eq!(a.pool_use_count(GRAPH), 0);
    a.empty_cache().unwrap();
    valid(a);
    assert_eq!(a.memory_reserved(), 0);
    assert!(a.snapshot().segments.is_empty());
    assert!(
        a.release_pool(GRAPH).is_err(),
        "a forgotten pool cannot be released"
    );
}

/// Use counts: each creation, share and route adds a use, each release takes
/// one; misuse is a typed error that changes nothing.
pub fn pool_use_counts_and_misuse(a: &dyn DeviceAllocator) {
    assert!(matches!(
        a.create_pool(PoolId::DEFAULT),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        a.end_allocate_to_pool(MEMPOOL),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        a.release_pool(MEMPOOL),
        Err(Error::InvalidArgument(_))
    ));
    assert!(a.pool_allocations(MEMPOOL).is_err());
    assert!(a.empty_pool_cache(MEMPOOL).is_err());
    assert_eq!(a.pool_use_count(MEMPOOL), 0);
    // A pool that never held memory, released: freeable until empty_cache.
    a.create_pool(GRAPH).unwrap();
    a.release_pool(GRAPH).unwrap();
    valid(a);
    a.empty_cache().unwrap();
    assert!(a.release_pool(GRAPH).is_err(), "forgotten at empty_cache");
    a.create_pool(MEMPOOL).unwrap();
    assert_eq!(a.pool_use_count(MEMPOOL), 1);
    a.begin_allocate_to_pool(MEMPOOL, Arc::new(|_| true))
        .unwrap();
    assert_eq!(a.pool_use_count(MEMPOOL), 2);
    let p = a.malloc(3 * MIB, S0).unwrap();
    a.end_allocate_to_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    assert_eq!(a.pool_use_count(MEMPOOL), 1);
    a.release_pool(MEMPOOL).unwrap();
    assert_eq!(a.pool_use_count(MEMPOOL), 0);
    // Freeable, but a live allocation keeps it.
    a.empty_cache().unwrap();
    assert_eq!(pool_of(a, p), MEMPOOL);
    valid(a);
    a.free(p).unwrap();
    a.empty_pool_cache(MEMPOOL).unwrap();
    valid(a);
    assert_eq!(a.memory_reserved(), 0);
    assert_eq!(a.pool_use_count(MEMPOOL), 0);
    assert!(a.release_pool(MEMPOOL).is_err());
}

/// A block used on another stream and freed while a route is open stays
/// active until the route closes and the next allocation (or `empty_cache`)
/// completes it.
pub fn frees_during_capture_wait_for_its_end(a: &dyn DeviceAllocator) {
    a.begin_allocate_to_pool(GRAPH, only(s1())).unwrap();
    let p = a.malloc(4 * MIB, s1()).unwrap();
    a.record_stream(p, S0).unwrap();
    a.free(p).unwrap();
    let q = a.malloc(4 * MIB, s1()).unwrap();
    assert_ne!(q, p, "a block awaiting its streams is not reused");
    assert!(a.stats().active_bytes.all.current >= 8 * MIB as i64);
    valid(a);
    a.free(q).unwrap();
    a.end_allocate_to_pool(GRAPH).unwrap();
    a.empty_cache().unwrap();
    valid(a);
    assert_eq!(a.stats().active_bytes.all.current, 0);
    a.release_pool(GRAPH).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    valid(a);
}

/// `use_on_oom`: when the default pools have no room, a request takes a free
/// block of such a pool; without the option it runs out of memory. Under the
/// pytorch policy with expandable segments, as in PyTorch 2.11, only blocks
/// of plain segments are lent, and the pool has none.
pub fn use_on_oom_pools_lend_free_blocks(a: &dyn DeviceAllocator) {
    let total = a.backend().capabilities().total_memory;
    a.create_pool(MEMPOOL).unwrap();
    a.begin_allocate_to_pool(MEMPOOL, Arc::new(|_| true))
        .unwrap();
    let p = a.malloc(40 * MIB, S0).unwrap();
    a.free(p).unwrap();
    a.end_allocate_to_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    a.set_memory_fraction((a.memory_reserved() + 10 * MIB) as f64 / total as f64)
        .unwrap();
    assert!(matches!(a.malloc(30 * MIB, S0), Err(Error::OutOfMemory(_))));
    valid(a);
    let lend = PoolOptions {
        use_on_oom: true,
        no_split: false,
    };
    a.set_pool_options(MEMPOOL, lend).unwrap();
    let expandable = a.config().expandable_segments && a.backend().capabilities().virtual_memory;
    if a.policy() == PolicyKind::Pytorch && expandable {
        // PyTorch's fallback looks for blocks of plain segments only.
        assert!(matches!(a.malloc(30 * MIB, S0), Err(Error::OutOfMemory(_))));
    } else {
        let q = a.malloc(30 * MIB, S0).unwrap();
        assert_eq!(pool_of(a, q), MEMPOOL, "borrowed from the pool");
        valid(a);
        a.free(q).unwrap();
    }
    a.set_memory_fraction(1.0).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    valid(a);
}

/// `no_split`: no two allocations of the pool share a segment's page.
pub fn no_split_pools_keep_allocations_apart(a: &dyn DeviceAllocator) {
    a.create_pool(MEMPOOL).unwrap();
    let apart = PoolOptions {
        use_on_oom: false,
        no_split: true,
    };
    a.set_pool_options(MEMPOOL, apart).unwrap();
    a.begin_allocate_to_pool(MEMPOOL, Arc::new(|_| true))
        .unwrap();
    let ptrs: Vec<u64> = (0..3).map(|_| a.malloc(1000, S0).unwrap()).collect();
    valid(a);
    for (i, p) in ptrs.iter().enumerate() {
        for q in &ptrs[i + 1..] {
            assert!(p.abs_diff(*q) >= 2 * MIB, "{p:#x} and {q:#x} share a page");
        }
    }
    let snapshot = a.snapshot();
    let blocks = snapshot.segments.iter().flat_map(|s| &s.blocks);
    assert!(blocks
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .all(|b| b.size >= 2 * MIB));
    for p in ptrs {
        a.free(p).unwrap();
    }
    a.end_allocate_to_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    valid(a);
}

/// A pool's own allocator (`MemPool(allocator=...)`) over the device's
/// segments, keeping the segments it gave.
#[derive(Debug)]
pub struct OwnAllocator {
    backend: Arc<dyn Backend>,
    /// The segments given and not yet taken back: (address, size).
    pub live: Mutex<Vec<(DevicePtr, u64)>>,
}

impl OwnAllocator {
    /// An allocator of `backend`'s segments.
    pub fn new(backend: Arc<dyn Backend>) -> OwnAllocator {
        OwnAllocator {
            backend,
            live: Mutex::new(Vec::new()),
        }
    }

    /// Whether `ptr` lies in a segment it gave and has not taken back.
    pub fn holds(&self, ptr: DevicePtr) -> bool {
        let live = self.live.lock().expect("not poisoned");
        live.iter().any(|(at, n)| *at <= ptr && ptr < at + n)
    }
}

impl SegmentSource for OwnAllocator {
    fn allocate(&self, size: u64) -> BackendResult<DevicePtr> {
        let at = self.backend.allocate_segment(size)?;
        self.live.lock().expect("not poisoned").push((at, size));
        Ok(at)
    }

    fn free(&self, ptr: DevicePtr, size: u64) -> BackendResult<()> {
        self.backend.free_segment(ptr)?;
        let mut live = self.live.lock().expect("not poisoned");
        live.retain(|s| *s != (ptr, size));
        Ok(())
    }
}

/// `MemPool(allocator=...)`: the pool's blocks lie in segments of its own
/// allocator, blocks outside the pool do not, and the segments go back to it
/// once the pool is released and the cache emptied.
pub fn own_allocator_pools_take_segments_from_it(a: &dyn DeviceAllocator) {
    let own = Arc::new(OwnAllocator::new(a.backend().clone()));
    a.create_pool(MEMPOOL).unwrap();
    a.set_pool_source(MEMPOOL, own.clone()).unwrap();
    a.begin_allocate_to_pool(MEMPOOL, Arc::new(|_| true))
        .unwrap();
    let inside: Vec<u64> = [MIB, 5 * MIB, 700, 30 * MIB]
        .iter()
        .map(|n| a.malloc(*n, S0).unwrap())
        .collect();
    a.end_allocate_to_pool(MEMPOOL).unwrap();
    let outside = a.malloc(MIB, S0).unwrap();
    valid(a);
    for p in &inside {
        assert!(
            own.holds(*p),
            "{p:#x} lies in a segment of the pool's allocator"
        );
        assert_eq!(pool_of(a, *p), MEMPOOL);
    }
    assert!(
        !own.holds(outside),
        "the default pool's memory is the device's"
    );
    for p in inside.into_iter().chain([outside]) {
        a.free(p).unwrap();
    }
    valid(a);
    a.release_pool(MEMPOOL).unwrap();
    a.release_pool(MEMPOOL).unwrap();
    a.empty_cache().unwrap();
    assert!(
        own.live.lock().unwrap().is_empty(),
        "given back to the pool's allocator"
    );
    assert_eq!(a.memory_reserved(), 0);
    valid(a);
    // The next pools (which may take the forgotten pool's place) get their
    // memory from their own allocator, or the device, never from the first.
    let other = Arc::new(OwnAllocator::new(a.backend().clone()));
    for (id, source) in [(PoolId(0, 2), Some(other.clone())), (PoolId(0, 3), None)] {
        a.create_pool(id).unwrap();
        if let Some(s) = source {
            a.set_pool_source(id, s).unwrap();
        }
        a.begin_allocate_to_pool(id, Arc::new(|_| true)).unwrap();
        let p = a.malloc(MIB, S0).unwrap();
        a.end_allocate_to_pool(id).unwrap();
        assert!(!own.holds(p), "{id}: not the first pool's allocator");
        assert_eq!(
            other.holds(p),
            id == PoolId(0, 2),
            "{id}: its own allocator"
        );
        a.free(p).unwrap();
        a.release_pool(id).unwrap();
        a.release_pool(id).unwrap();
        a.empty_cache().unwrap();
        valid(a);
    }
    assert!(other.live.lock().unwrap().is_empty());
    assert_eq!(a.memory_reserved(), 0);
}

/// A checkpoint of a pool's live allocations, restored after the pool's
/// layout changed, gives the same allocations at the same addresses and
/// frees the others.
pub fn restore_pool_puts_allocations_back(a: &dyn DeviceAllocator) {
    a.begin_allocate_to_pool(GRAPH, only(s1())).unwrap();
    let x = a.malloc(3 * MIB, s1()).unwrap();
    let y = a.malloc(700, s1()).unwrap();
    let z = a.malloc(5 * MIB, s1()).unwrap();
    let checkpoint: Vec<PoolAllocation> = a.pool_allocations(GRAPH).unwrap();
    a.free(x).unwrap();
    a.free(z).unwrap();
    let w = a.malloc(8 * MIB, s1()).unwrap();
    a.end_allocate_to_pool(GRAPH).unwrap();
    let mut freed = a.restore_pool(GRAPH, &checkpoint).unwrap();
    freed.sort_unstable();
    let mut want = vec![y, w];
    want.sort_unstable();
    assert_eq!(freed, want);
    valid(a);
    assert_eq!(a.pool_allocations(GRAPH).unwrap(), checkpoint);
    assert_eq!(
        a.stats().requested_bytes.all.current as u64,
        checkpoint.iter().map(|c| c.requested).sum::<u64>()
    );
    // Memory the pool does not hold free cannot be restored.
    let taken = checkpoint[0];
    assert!(matches!(
        a.restore_pool(GRAPH, &[taken, taken]),
        Err(Error::InvalidArgument(_))
    ));
    valid(a);
    for c in a.pool_allocations(GRAPH).unwrap() {
        a.free(c.ptr).unwrap();
    }
    valid(a);
    a.release_pool(GRAPH).unwrap();
    a.empty_cache().unwrap();
    assert_eq!(a.memory_reserved(), 0);
    valid(a);
}
