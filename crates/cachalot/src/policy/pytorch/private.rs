//! Private pools: routing requests to them, their use counts, and giving their
//! memory back once no graph or `MemPool` holds them.

use crate::backend::{DevicePtr, StreamId};
use crate::error::Result;
use crate::private_pool::{PoolId, PoolOptions, PoolRecord, RouteFilter};

use super::block::BlockId;
use super::pool::PoolPair;
use super::state::State;

impl State {
    /// The pool a request on `stream` goes to: its slot and options (slot 0 and
    /// no options for the default pools).
    pub(crate) fn route(&self, stream: StreamId) -> (u32, PoolOptions) {
        if !self.book.routing() {
            return (0, PoolOptions::default());
        }
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

    /// Returns the cached memory of private pool `id` to the device (and forgets
    /// the pool when it is freeable and holds nothing).
    pub(crate) fn empty_pool_cache(&mut self, id: PoolId) -> Result<()> {
        let record = self.book.require(id)?;
        self.synchronize_and_free_events()?;
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

    /// Forgets every freeable private pool that holds no segment.
    fn forget_empty_freeable_pools(&mut self) {
        for id in self.book.freeable() {
            let Some(r) = self.book.get(id) else { continue };
            if !self.segments.iter().any(|(_, s)| s.pool == r.slot) {
                self.book.forget(id);
                self.pools[r.slot as usize] = PoolPair::default();
            }
        }
    }

    /// The addresses of the live allocations of private pool `id`.
    pub(crate) fn pool_allocations(&self, id: PoolId) -> Result<Vec<DevicePtr>> {
        let slot = self.book.require(id)?.slot;
        let mut ptrs: Vec<DevicePtr> = self
            .allocated
            .iter()
            .filter(|(_, b)| self.blocks[**b].pool == slot)
            .map(|(addr, _)| *addr)
            .collect();
        ptrs.sort_unstable();
        Ok(ptrs)
    }

    /// On a miss in the default pools: the best-fit free block of a pool whose
    /// options allow borrowing, taken out of that pool.
    pub(crate) fn borrow_for_oom(
        &mut self,
        req: &super::state::Request,
    ) -> Option<(BlockId, PoolOptions)> {
        for r in self.book.use_on_oom() {
            let borrowed = super::state::Request {
                pool: r.slot,
                ..*req
            };
            if let Some(id) = self.get_free_block(&borrowed) {
                return Some((id, r.options));
            }
        }
        None
    }
}
