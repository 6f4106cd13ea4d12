//! The block and segment transitions that move PyTorch's per-pool statistics,
//! and what each moves: the one contract both policies' ledgers keep.
//! [`MemoryStats::apply`] is its definition; the pytorch policy's ledger
//! applies transitions to its statistics through it, and the cachalot
//! policy's ledger applies them to a stream's figures (a faster layout of the
//! same numbers) and journals them for the device's peaks, tested against
//! [`MemoryStats::apply`]. What only one policy counts (oversize blocks, paused
//! bytes, driver calls, events) its ledger adds beside.

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

impl MemoryStats {
    /// Moves the statistics `transition` moves, in its pool and in `all`.
    pub(crate) fn apply(&mut self, transition: Transition) {
        match transition {
            Transition::Allocated {
                small,
                size,
                requested,
            } => {
                self.allocation.update(small, 1);
                self.allocated_bytes.update(small, size as i64);
                self.active.update(small, 1);
                self.active_bytes.update(small, size as i64);
                self.requested_bytes.update(small, requested as i64);
            }
            Transition::FreeRequested { small, size } => {
                self.allocation.update(small, -1);
                self.allocated_bytes.update(small, -(size as i64));
            }
            Transition::FreeCompleted {
                small,
                size,
                requested,
            } => {
                self.active.update(small, -1);
                self.active_bytes.update(small, -(size as i64));
                self.requested_bytes.update(small, -(requested as i64));
            }
            Transition::Freed {
                small,
                size,
                requested,
            } => {
                self.apply(Transition::FreeRequested { small, size });
                self.apply(Transition::FreeCompleted {
                    small,
                    size,
                    requested,
                });
            }
            Transition::Reserved {
                small,
                bytes,
                segments,
            } => {
                self.reserved_bytes.update(small, bytes);
                self.segment.update(small, segments);
            }
            Transition::Splits {
                small,
                count,
                bytes,
            } => {
                self.inactive_split.update(small, count);
                self.inactive_split_bytes.update(small, bytes);
            }
        }
    }
}
