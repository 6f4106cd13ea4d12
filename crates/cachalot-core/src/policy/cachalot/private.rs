//! Private pools: each is a set of *lanes*, one per stream that allocated into
//! it, each lane a stream state of its own (its own reserved ranges over the
//! device's shared page supply). A lane never re-maps its pages: a CUDA graph
//! replays at the addresses it captured, freed blocks included. Its cached
//! memory goes back only once the pool is freeable.
//!
//! Locks: the pool book is taken before any stream's lock, never after.

use std::collections::HashSet;
use std::sync::MutexGuard;

use crate::backend::{DevicePtr, StreamId};
use crate::device_allocator::DeviceAllocator;
use crate::error::{Error, Result};
use crate::private_pool::{PoolAllocation, PoolBook, PoolId};
use crate::snapshot::BlockState;

use super::pool::ROUNDING;
use super::CachalotAllocator;

/// What a `no_split` pool rounds requests to without virtual memory: the
/// small pool's segment size, so each allocation has segments of its own.
const NO_SPLIT_UNIT: u64 = 2 << 20;

impl CachalotAllocator {
    /// The pool book, locked.
    pub(super) fn book(&self) -> MutexGuard<'_, PoolBook> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pool slot a request on `stream` goes to, and the unit its size is
    /// rounded to: a page (at least 2 MiB) in a `no_split` pool, so that no
    /// two allocations share a page.
    pub(super) fn route(&self, stream: StreamId) -> (u32, u64) {
        match self.book().route(stream) {
            Some(r) if r.options.no_split => (r.slot, self.pages.granularity().max(NO_SPLIT_UNIT)),
            Some(r) => (r.slot, ROUNDING),
            None => (0, ROUNDING),
        }
    }

    /// Slots of the private pools some graph or `MemPool` still holds.
    pub(super) fn live_pool_slots(&self) -> HashSet<u32> {
        self.book()
            .iter()
            .filter(|(_, r)| r.use_count > 0)
            .map(|(_, r)| r.slot)
            .collect()
    }

    /// Forgets every freeable private pool whose lanes hold no memory.
    pub(super) fn forget_empty_freeable_pools(&self) {
        let mut book = self.book();
        for id in book.freeable() {
            let Some(r) = book.get(id) else { continue };
            let holds = self.streams.iter().any(|e| {
                let st = e.lock();
                st.slot() == r.slot && st.reserved() > 0
            });
            if !holds {
                book.forget(id);
                self.streams.retire_slot(r.slot);
            }
        }
    }

    /// After a default lane of `stream` ran out of memory: the request served
    /// by the lane of `stream` of a pool that lends on out-of-memory, if any
    /// has room.
    pub(super) fn borrow_for_oom(
        &self,
        stream: StreamId,
        rounded: u64,
        size: u64,
    ) -> Result<Option<DevicePtr>> {
        let lenders = self.book().use_on_oom();
        for r in lenders {
            match self.on_existing(stream, r.slot, |st| st.malloc(&self.pages, rounded, size)) {
                Some(Ok(ptr)) => return Ok(Some(ptr)),
                Some(Err(e)) if !e.is_out_of_memory() => return Err((*e).into()),
                _ => {}
            }
        }
        Ok(None)
    }

    /// Returns private pool `id`'s cached memory to the device when it is
    /// freeable (not while quiet), and forgets the pool when it is then empty.
    pub(super) fn empty_private_pool(&self, id: PoolId) -> Result<()> {
        let record = self.book().require(id)?;
        if record.use_count > 0 || self.pages.quiet() {
            return Ok(());
        }
        let slot = record.slot;
        for entry in self.streams.iter().filter(|e| e.slot() == slot) {
            self.journaled(entry, |st| match st.slot() == slot {
                true => st.empty_cache(&self.pages),
                false => Ok(()),
            })?;
        }
        self.forget_empty_freeable_pools();
        Ok(self.pages.retry_orphans()?)
    }

    /// Frees every live allocation of pool `id`, then allocates each of `live`
    /// at its address again, in the lane of its stream. Returns the addresses
    /// freed.
    pub(super) fn restore_private_pool(
        &self,
        id: PoolId,
        live: &[PoolAllocation],
    ) -> Result<Vec<DevicePtr>> {
        let slot = self.book().require(id)?.slot;
        let freed: Vec<DevicePtr> = self
            .private_allocations(id)?
            .iter()
            .map(|a| a.ptr)
            .collect();
        for ptr in &freed {
            self.free(*ptr)?;
        }
        for a in live {
            let restored = self
                .on_existing(a.stream, slot, |st| {
                    st.allocate_at(a.ptr, a.size, a.requested)
                })
                .unwrap_or_else(|| Err(format!("the pool has no memory of stream {}", a.stream)));
            restored.map_err(|why| {
                Error::InvalidArgument(format!("cannot restore the pool's allocation: {why}"))
            })?;
        }
        Ok(freed)
    }

    /// The live allocations of private pool `id`, by address.
    pub(super) fn private_allocations(&self, id: PoolId) -> Result<Vec<PoolAllocation>> {
        let slot = self.book().require(id)?.slot;
        let device = self.backend.capabilities().device;
        let mut live: Vec<PoolAllocation> = self
            .streams
            .iter()
            .flat_map(|e| {
                let st = e.lock();
                match st.slot() == slot {
                    true => st.snapshot(device),
                    false => Vec::new(),
                }
            })
            .flat_map(|s| {
                let stream = s.stream;
                s.blocks.into_iter().map(move |b| (stream, b))
            })
            .filter(|(_, b)| b.state == BlockState::ActiveAllocated)
            .map(|(stream, b)| PoolAllocation {
                ptr: b.address,
                size: b.size,
                requested: b.requested_size,
                stream,
            })
            .collect();
        live.sort_unstable();
        Ok(live)
    }
}
