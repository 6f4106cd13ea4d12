//! The block and segment transitions that move PyTorch's per-pool statistics,
//! and what each moves: the one contract both policies' ledgers keep.
//! [`Transition::moves`] is its definition, [`MemoryStats::apply`] applies
//! it; the pytorch policy's ledger applies transitions to its statistics
//! through it, the cachalot policy's levels shift by it, and the cachalot
//! policy's ledger applies them to a stream's figures (a faster layout of the
//! same numbers) and journals them for the device's peaks, tested against
//! [`MemoryStats::apply`]. What only one policy counts (oversize blocks, paused
//! bytes, driver calls, events) its ledger adds beside.

use crate::stats::family::{
    ACTIVE, ACTIVE_BYTES, ALLOCATED_BYTES, ALLOCATION, INACTIVE_SPLIT, INACTIVE_SPLIT_BYTES,
    REQUESTED_BYTES, RESERVED_BYTES, SEGMENT,
};
use crate::stats::MemoryStats;

/// One transition of blocks or segments, as a ledger records it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    /// A block of `size` bytes was handed out for `requested`.
    Allocated {
        small: bool,
        size: u64,
        requested: u64,
    },
    /// Its caller freed a block that other streams still use.
    FreeRequested { small: bool, size: u64 },
    /// A block freed earlier became reusable.
    FreeCompleted {
        small: bool,
        size: u64,
        requested: u64,
    },
    /// Its caller freed a block that became reusable at once.
    Freed {
        small: bool,
        size: u64,
        requested: u64,
    },
    /// Reserved bytes and segments changed (pages mapped or unmapped,
    /// segments allocated or freed).
    Reserved {
        small: bool,
        bytes: i64,
        segments: i64,
    },
    /// Inactive split blocks changed.
    Splits { small: bool, count: i64, bytes: i64 },
}

impl Transition {
    /// What the transition adds to each statistic it moves: `add(family,
    /// small, amount)` for the family's place in [`MemoryStats::arrays`]
    /// ([`crate::stats::family`]), in the pool (small or large) and in its `all`.
    #[inline(always)]
    pub(crate) fn moves(self, mut add: impl FnMut(usize, bool, i64)) {
        match self {
            Transition::Allocated {
                small,
                size,
                requested,
            } => {
                let size = size as i64;
                add(ALLOCATION, small, 1);
                add(ALLOCATED_BYTES, small, size);
                add(ACTIVE, small, 1);
                add(ACTIVE_BYTES, small, size);
                add(REQUESTED_BYTES, small, requested as i64);
            }
            Transition::FreeRequested { small, size } => {
                add(ALLOCATION, small, -1);
                add(ALLOCATED_BYTES, small, -(size as i64));
            }
            Transition::FreeCompleted {
                small,
                size,
                requested,
            } => {
                add(ACTIVE, small, -1);
                add(ACTIVE_BYTES, small, -(size as i64));
                add(REQUESTED_BYTES, small, -(requested as i64));
            }
            Transition::Freed {
                small,
                size,
                requested,
            } => {
                let size = size as i64;
                add(ALLOCATION, small, -1);
                add(ALLOCATED_BYTES, small, -size);
                add(ACTIVE, small, -1);
                add(ACTIVE_BYTES, small, -size);
                add(REQUESTED_BYTES, small, -(requested as i64));
            }
            Transition::Reserved {
                small,
                bytes,
                segments,
            } => {
                add(RESERVED_BYTES, small, bytes);
                add(SEGMENT, small, segments);
            }
            Transition::Splits {
                small,
                count,
                bytes,
            } => {
                add(INACTIVE_SPLIT, small, count);
                add(INACTIVE_SPLIT_BYTES, small, bytes);
            }
        }
    }
}

impl MemoryStats {
    /// Moves the statistics `transition` moves, in its pool and in `all`.
    pub(crate) fn apply(&mut self, transition: Transition) {
        transition.moves(|f, small, amount| self.arrays_mut()[f].update(small, amount));
    }
}
