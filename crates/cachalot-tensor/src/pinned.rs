//! A caching allocator for pinned (page-locked) host memory, like PyTorch's
//! `CachingHostAllocator`: blocks are rounded up to a power of two, kept when
//! freed, and handed out again only after every copy that read or wrote them
//! has finished (each copy records an event on the block).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::context::DeviceContext;
use crate::engine::Engine;
use crate::error::Result;

/// Whether the work that used a block has finished.
pub(crate) type Pending = Box<dyn Fn() -> bool + Send>;

/// Host memory that copies may read asynchronously.
pub(crate) enum PinnedMem {
    /// Plain host memory (for simulated devices, where copies run at once).
    Host(Box<[u8]>),
    /// Memory from `cuMemHostAlloc`, freed through the context that made it.
    Cuda {
        ptr: *mut u8,
        cap: usize,
        ctx: Arc<DeviceContext>,
    },
}

// SAFETY: the pointer is owned by this value alone (no aliasing copies exist), and the
// memory it points to is plain host memory usable from any thread.
unsafe impl Send for PinnedMem {}
// SAFETY: shared access only reads through `as_slice`; writes need `&mut`.
unsafe impl Sync for PinnedMem {}

impl PinnedMem {
    fn cap(&self) -> usize {
        match self {
            PinnedMem::Host(b) => b.len(),
            PinnedMem::Cuda { cap, .. } => *cap,
        }
    }

    fn slice(&self, len: usize) -> &[u8] {
        match self {
            PinnedMem::Host(b) => &b[..len],
            // SAFETY: ptr holds cap >= len bytes, initialised when the block was made
            // (see PinnedCache::allocate), and lives as long as self.
            PinnedMem::Cuda { ptr, .. } => unsafe { std::slice::from_raw_parts(*ptr, len) },
        }
    }

    fn slice_mut(&mut self, len: usize) -> &mut [u8] {
        match self {
            PinnedMem::Host(b) => &mut b[..len],
            // SAFETY: as in slice(); &mut self makes this the only reference.
            PinnedMem::Cuda { ptr, .. } => unsafe { std::slice::from_raw_parts_mut(*ptr, len) },
        }
    }
}

impl Drop for PinnedMem {
    fn drop(&mut self) {
        if let PinnedMem::Cuda { ptr, ctx, .. } = self {
            if let Engine::Cuda(e) = &ctx.engine {
                // SAFETY: ptr came from alloc_pinned and is freed once, here; a PinnedMem
                // is dropped only from the free list, after its copies finished.
                unsafe { e.free_pinned(*ptr) };
            }
        }
    }
}

impl fmt::Debug for PinnedMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedMem({} bytes)", self.cap())
    }
}

/// Counters of the pinned-host cache.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PinnedStats {
    /// Bytes of pinned memory obtained (sum of block capacities).
    pub reserved_bytes: u64,
    /// Bytes in blocks held by tensors or awaiting their copies.
    pub allocated_bytes: u64,
    /// Blocks obtained from the driver so far.
    pub host_allocs: u64,
    /// Requests served from the cache.
    pub reuses: u64,
}

#[derive(Default)]
struct State {
    free: BTreeMap<usize, Vec<PinnedMem>>,
    pending: Vec<(PinnedMem, Vec<Pending>)>,
    stats: PinnedStats,
}

/// The cache. One per registry.
#[derive(Default)]
pub(crate) struct PinnedCache {
    state: Mutex<State>,
}

impl fmt::Debug for PinnedCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PinnedCache({:?})", self.lock().stats)
    }
}

impl PinnedCache {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A block of at least `len` bytes; `ctx` pins through CUDA, `None` uses plain memory.
    pub(crate) fn allocate(
        self: &Arc<Self>,
        len: usize,
        ctx: Option<&Arc<DeviceContext>>,
    ) -> Result<PinnedBlock> {
        let cap = len.max(1).next_power_of_two();
        let mut st = self.lock();
        Self::collect_finished(&mut st);
        let reused = st.free.get_mut(&cap).and_then(Vec::pop);
        let mem = match reused {
            Some(m) => {
                st.stats.reuses += 1;
                m
            }
            None => {
                drop(st);
                let m = Self::obtain(cap, ctx)?;
                st = self.lock();
                st.stats.host_allocs += 1;
                st.stats.reserved_bytes += cap as u64;
                m
            }
        };
        st.stats.allocated_bytes += cap as u64;
        Ok(PinnedBlock {
            mem: Some(mem),
            len,
            pending: Vec::new(),
            cache: self.clone(),
        })
    }

    fn obtain(cap: usize, ctx: Option<&Arc<DeviceContext>>) -> Result<PinnedMem> {
        match ctx.map(|c| (c, &c.engine)) {
            Some((c, Engine::Cuda(e))) => {
                let ptr = e.alloc_pinned(cap)?;
                // SAFETY: ptr holds cap bytes just allocated; zeroing them makes every
                // later slice of them initialised.
                unsafe { std::ptr::write_bytes(ptr, 0, cap) };
                Ok(PinnedMem::Cuda {
                    ptr,
                    cap,
                    ctx: c.clone(),
                })
            }
            _ => Ok(PinnedMem::Host(vec![0u8; cap].into_boxed_slice())),
        }
    }

    fn collect_finished(st: &mut State) {
        let pending = std::mem::take(&mut st.pending);
        for (mem, events) in pending {
            if events.iter().all(|done| done()) {
                st.free.entry(mem.cap()).or_default().push(mem);
            } else {
                st.pending.push((mem, events));
            }
        }
    }

    fn give_back(&self, mem: PinnedMem, pending: Vec<Pending>) {
        let mut st = self.lock();
        st.stats.allocated_bytes -= mem.cap() as u64;
        st.pending.push((mem, pending));
        Self::collect_finished(&mut st);
    }

    /// Frees every cached block whose copies have finished.
    pub(crate) fn empty_cache(&self) {
        let freed: Vec<PinnedMem> = {
            let mut st = self.lock();
            Self::collect_finished(&mut st);
            let blocks: Vec<PinnedMem> = std::mem::take(&mut st.free)
                .into_values()
                .flatten()
                .collect();
            st.stats.reserved_bytes -= blocks.iter().map(|m| m.cap() as u64).sum::<u64>();
            blocks
        };
        drop(freed);
    }

    pub(crate) fn stats(&self) -> PinnedStats {
        self.lock().stats
    }
}

/// One pinned block, owned by a host tensor's storage.
pub(crate) struct PinnedBlock {
    mem: Option<PinnedMem>,
    len: usize,
    pending: Vec<Pending>,
    cache: Arc<PinnedCache>,
}

impl PinnedBlock {
    pub(crate) fn as_slice(&self) -> &[u8] {
        self.mem.as_ref().map_or(&[], |m| m.slice(self.len))
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        self.mem.as_mut().map_or(&mut [], |m| m.slice_mut(len))
    }

    /// Keeps the block from reuse until `done` says the copy finished.
    pub(crate) fn add_pending(&mut self, done: Pending) {
        self.pending.push(done);
    }
}

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        if let Some(mem) = self.mem.take() {
            self.cache.give_back(mem, std::mem::take(&mut self.pending));
        }
    }
}

impl fmt::Debug for PinnedBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PinnedBlock({} bytes, {} pending)",
            self.len,
            self.pending.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[test]
    fn blocks_are_reused_only_after_their_copies_finish() {
        let cache = Arc::new(PinnedCache::default());
        let copy_done = Arc::new(AtomicBool::new(false));
        let mut a = cache.allocate(3000, None).expect("host memory");
        assert_eq!(a.as_slice().len(), 3000);
        let flag = copy_done.clone();
        a.add_pending(Box::new(move || flag.load(Ordering::SeqCst)));
        drop(a);
        // The copy is still in flight: a new request of the same size gets a new block.
        let b = cache.allocate(4096, None).expect("host memory");
        assert_eq!(cache.stats().host_allocs, 2);
        drop(b);
        copy_done.store(true, Ordering::SeqCst);
        let _c = cache.allocate(4000, None).expect("host memory");
        let _d = cache.allocate(2049, None).expect("host memory");
        let s = cache.stats();
        assert_eq!((s.host_allocs, s.reuses), (2, 2), "{s:?}");
        assert_eq!(s.reserved_bytes, 8192);
        assert_eq!(s.allocated_bytes, 8192);
    }

    #[test]
    fn empty_cache_frees_only_finished_blocks() {
        let cache = Arc::new(PinnedCache::default());
        let mut a = cache.allocate(100, None).expect("host memory");
        a.add_pending(Box::new(|| false));
        drop(a);
        drop(cache.allocate(1000, None).expect("host memory"));
        cache.empty_cache();
        assert_eq!(cache.stats().reserved_bytes, 128);
    }
}
