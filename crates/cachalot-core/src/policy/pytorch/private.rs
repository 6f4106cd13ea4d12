//! Private pools: routing requests to them, their use counts, and giving their
//! memory back once no graph or `MemPool` holds them.

use std::sync::Arc;

use crate::backend::{DevicePtr, StreamId};
use crate::error::{Error, Result};
use crate::private_pool::{
    PoolAllocation, PoolId, PoolOptions, PoolRecord, RouteFilter, SegmentSource,
};

use super::block::{Block, BlockId};
use super::placement::is_small;
use super::pool::PoolPair;
use super::state::Request;
use super::state::State;

impl State {
    /// The pool a request on `stream` goes to: its slot and options (slot 0 and
    /// no options for the default pools).
    pub(crate) fn route(&self, stream: StreamId) -> (u32, PoolOptions) {
        self.book
            .route(stream)
            .map_or((0, PoolOptions::default()), |r| (r.slot, r.options))
    }

    /// Creates private pool `id` (use count 1) or adds a use to it.
    pub(crate) fn create_or_incref_pool(&mut self, id: PoolId) -> Result<PoolRecord> {
        let (record, _) = self.book.create_or_incref(id)?;
        let slot = record.slot as usize;
        if self.pools.len() <= slot {
            self.pools.resize_with(slot + 1, PoolPair::default);
        }
        Ok(record)
    }

    /// Routes the requests `filter` accepts to pool `id`, creating it or adding
    /// a use to it.
    pub(crate) fn begin_allocate_to_pool(&mut self, id: PoolId, filter: RouteFilter) -> Result<()> {
        self.create_or_incref_pool(id)?;
        self.book.push_route(id, filter)
    }

    /// Closes the newest route to pool `id`.
    pub(crate) fn end_allocate_to_pool(&mut self, id: PoolId) -> Result<()> {
        self.book.end_route(id)
    }

    /// Takes a use off pool `id`; at zero its cached memory goes back at the
    /// next `empty_cache`.
    pub(crate) fn release_pool(&mut self, id: PoolId) -> Result<()> {
        self.book.release(id).map(|_| ())
    }

    /// Returns the cached memory of private pool `id` to the device when the
    /// pool is freeable (and forgets it when it then holds nothing), as
    /// PyTorch's `emptyCache(pool)`; a pool in use keeps its memory.
    pub(crate) fn empty_pool_cache(&mut self, id: PoolId) -> Result<()> {
        let record = self.book.require(id)?;
        if record.use_count > 0 {
            return Ok(());
        }
        self.synchronize_and_free_events(Some(record.slot))?;
        self.release_pool_blocks(record.slot)?;
        self.forget_empty_freeable_pools();
        Ok(())
    }

    /// Releases the cached blocks of every freeable private pool.
    pub(crate) fn release_freeable_pools(&mut self) -> Result<()> {
        for id in self.book.freeable() {
            if let Some(r) = self.book.get(id) {
                self.release_pool_blocks(r.slot)?;
            }
        }
        self.forget_empty_freeable_pools();
        Ok(())
    }

    /// Releases the cached blocks of the pool pair in `slot`, large then small.
    pub(crate) fn release_pool_blocks(&mut self, slot: u32) -> Result<()> {
        self.release_blocks(slot, false)?;
        self.release_blocks(slot, true)
    }

    /// Makes `source` give pool `id`'s new segments
    /// (`MemPool(allocator=...)`); a tag's segments are cachalot's pages.
    pub(crate) fn set_pool_source(
        &mut self,
        id: PoolId,
        source: Arc<dyn SegmentSource>,
    ) -> Result<()> {
        let slot = self.book.require(id)?.slot;
        if self.tags.contains_key(&slot) {
            return Err(Error::InvalidArgument(format!(
                "private pool {id} is a tag: its segments are cachalot's pages, not another allocator's"
            )));
        }
        self.book.set_source(id, source)
    }

    /// Forgets every freeable private pool that holds no segment.
    fn forget_empty_freeable_pools(&mut self) {
        for id in self.book.freeable() {
            let Some(r) = self.book.get(id) else { continue };
            if !self.segments.iter().any(|(_, s)| s.pool == r.slot) {
                self.book.forget(id);
                self.tags.remove(&r.slot);
                self.pools[r.slot as usize] = PoolPair::default();
            }
        }
    }

    /// The live allocations of private pool `id`, by address. As PyTorch's
    /// checkpoint, it first records the events of frees deferred by a route
    /// that has closed.
    pub(crate) fn pool_allocations(&mut self, id: PoolId) -> Result<Vec<PoolAllocation>> {
        let slot = self.book.require(id)?.slot;
        if !self.book.routing() {
            self.insert_deferred_events()?;
        }
        let mut live: Vec<PoolAllocation> = self
            .allocated
            .values()
            .map(|b| &self.blocks[*b])
            .filter(|b| b.pool == slot)
            .map(|b| PoolAllocation {
                ptr: b.addr,
                size: b.size,
                requested: b.requested,
                stream: b.stream,
            })
            .collect();
        live.sort_unstable();
        Ok(live)
    }

    /// Frees every live allocation of pool `id`, then allocates each of `live`
    /// at its address again. Returns the addresses freed.
    pub(crate) fn restore_pool(
        &mut self,
        id: PoolId,
        live: &[PoolAllocation],
    ) -> Result<Vec<DevicePtr>> {
        let slot = self.book.require(id)?.slot;
        self.refuse_paused(slot, live.iter().map(|a| a.requested).sum())?;
        let freed: Vec<DevicePtr> = self.pool_allocations(id)?.iter().map(|a| a.ptr).collect();
        for ptr in &freed {
            self.free(*ptr)?;
        }
        for a in live {
            self.allocate_at(slot, a)?;
        }
        Ok(freed)
    }

    /// Allocates `a` exactly: carves its range out of the free block of pool
    /// `slot` that holds it.
    fn allocate_at(&mut self, slot: u32, a: &PoolAllocation) -> Result<()> {
        let small = is_small(a.size);
        let inside = |b: &Block| {
            b.stream == a.stream && b.addr <= a.ptr && a.ptr + a.size <= b.addr + b.size
        };
        let found = self.pools[slot as usize]
            .of(small)
            .blocks
            .values()
            .find(|id| inside(&self.blocks[*id]));
        let Some(mut id) = found else {
            return Err(Error::InvalidArgument(format!(
                "cannot restore the pool's allocation at {:#x} ({} bytes): that memory is not free in the pool",
                a.ptr, a.size
            )));
        };
        if self.blocks[id].addr < a.ptr {
            id = self.split_front(id, a.ptr - self.blocks[id].addr);
        }
        let req = Request {
            size: a.size,
            requested: a.requested,
            small,
            stream: a.stream,
            alloc_size: a.size,
            pool: slot,
            expandable: false,
        };
        self.uncache(id);
        let split = self.blocks[id].size > a.size;
        self.alloc_found_block(id, &req, split);
        Ok(())
    }

    /// Splits cached block `id` after its first `len` bytes; both pieces stay
    /// cached. Returns the back piece.
    fn split_front(&mut self, id: BlockId, len: u64) -> BlockId {
        self.uncache(id);
        let b = &self.blocks[id];
        let (was_split, small, expandable, total) = (b.is_split(), b.small, b.expandable, b.size);
        let front = Block {
            size: len,
            next: Some(id),
            stream_uses: Vec::new(),
            capture_uses: Vec::new(),
            ..b.clone()
        };
        let prev = b.prev;
        let segment = b.segment;
        let front_id = self.blocks.insert(front);
        self.link_after(prev, front_id, segment);
        let back = &mut self.blocks[id];
        back.prev = Some(front_id);
        back.addr += len;
        back.size -= len;
        self.cache(front_id);
        self.cache(id);
        if !expandable {
            let (blocks, bytes) = if was_split { (1, 0) } else { (2, total as i64) };
            self.ledger.splits_changed(small, blocks, bytes);
        }
        id
    }

    /// On a miss in the default pools: the best-fit free block of a pool whose
    /// options allow borrowing, taken out of that pool (a paused tag lends
    /// nothing: its memory is gone).
    pub(crate) fn borrow_for_oom(
        &mut self,
        req: &super::state::Request,
    ) -> Option<(BlockId, PoolOptions)> {
        for r in self.book.use_on_oom() {
            if self.is_paused(r.slot) {
                continue;
            }
            let borrowed = super::state::Request {
                pool: r.slot,
                expandable: false,
                ..*req
            };
            if let Some(id) = self.get_free_block(&borrowed) {
                return Some((id, r.options));
            }
        }
        None
    }
}
