//! A block of a heap: a contiguous sub-range of one of its regions, free or
//! in some stage of use, linked to its neighbours in the region.

/// A block's index in the heap's arena.
pub(crate) type BlockId = u32;

/// Where a block is in its life.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// In the free index, reusable.
    Free,
    /// Handed to a caller.
    Allocated,
    /// Freed by the caller, waiting for streams recorded on it.
    PendingFree,
    /// Freed and kept unmerged for reuse at its exact size (`reuse`).
    Kept,
}

/// A contiguous sub-range of a region.
#[derive(Clone, Debug)]
pub(crate) struct Block {
    /// Start address.
    pub(crate) addr: u64,
    /// Size in bytes (a multiple of the heap's rounding).
    pub(crate) size: u64,
    /// Bytes the caller asked for (0 when free).
    pub(crate) requested: u64,
    /// Its state.
    pub(crate) state: State,
    pub(super) prev: Option<BlockId>,
    pub(super) next: Option<BlockId>,
}

impl Block {
    /// The first address past the block.
    pub(crate) fn end(&self) -> u64 {
        self.addr + self.size
    }

    /// Whether it shares its region with other blocks.
    pub(super) fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }
}
