//! Pools of cached free blocks, ordered for best fit by (stream, size, segment
//! registration, address), and the address-ordered set of unmapped stretches.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::backend::{DevicePtr, StreamId};

use super::block::{Block, BlockId};

/// The best-fit ordering of a cached block.
pub(crate) type FitKey = (StreamId, u64, u64, DevicePtr);

/// The small or the large pool.
#[derive(Debug, Default)]
pub(crate) struct BlockPool {
    /// Whether this is the small pool.
    pub(crate) small: bool,
    /// Free mapped blocks, best fit first.
    pub(crate) blocks: BTreeMap<FitKey, BlockId>,
    /// Unmapped stretches of expandable segments, by (stream, address).
    pub(crate) unmapped: BTreeMap<(StreamId, DevicePtr), BlockId>,
    /// The GC clock: lookups made while garbage collection is on.
    pub(crate) lookups: i64,
}

impl BlockPool {
    /// An empty pool.
    pub(crate) fn new(small: bool) -> BlockPool {
        BlockPool {
            small,
            ..BlockPool::default()
        }
    }

    /// The fit key of `b`.
    pub(crate) fn key(b: &Block) -> FitKey {
        (b.stream, b.size, b.registration, b.addr)
    }

    /// Caches a free block (stamping its GC age).
    pub(crate) fn insert(&mut self, id: BlockId, b: &mut Block) {
        b.gc_base = self.lookups;
        self.blocks.insert(Self::key(b), id);
    }

    /// Removes a cached block; returns whether it was there.
    pub(crate) fn remove(&mut self, b: &Block) -> bool {
        self.blocks.remove(&Self::key(b)).is_some()
    }

    /// Records an unmapped stretch.
    pub(crate) fn insert_unmapped(&mut self, id: BlockId, b: &Block) {
        self.unmapped.insert((b.stream, b.addr), id);
    }

    /// Forgets an unmapped stretch; returns whether it was there.
    pub(crate) fn remove_unmapped(&mut self, b: &Block) -> bool {
        self.unmapped.remove(&(b.stream, b.addr)).is_some()
    }

    /// Cached blocks of `stream` of at least `size` bytes, best fit first.
    pub(crate) fn fits(
        &self,
        stream: StreamId,
        size: u64,
    ) -> impl Iterator<Item = (&FitKey, &BlockId)> {
        let from = (stream, size, 0, 0);
        self.blocks
            .range((Bound::Included(from), Bound::Unbounded))
            .take_while(move |(k, _)| k.0 == stream)
    }

    /// Cached blocks of `stream` smaller than `size`, largest first.
    pub(crate) fn smaller(
        &self,
        stream: StreamId,
        size: u64,
    ) -> impl Iterator<Item = (&FitKey, &BlockId)> {
        let to = (stream, size, 0, 0);
        self.blocks
            .range(..to)
            .rev()
            .take_while(move |(k, _)| k.0 == stream)
    }

    /// Unmapped stretches of `stream`, lowest address first.
    pub(crate) fn unmapped_of(&self, stream: StreamId) -> impl Iterator<Item = BlockId> + '_ {
        self.unmapped
            .range((stream, 0)..)
            .take_while(move |(k, _)| k.0 == stream)
            .map(|(_, id)| *id)
    }
}
