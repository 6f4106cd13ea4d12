//! Snapshots: every segment with its blocks and their states, at one moment.

use serde::{Deserialize, Serialize};

use crate::backend::{DevicePtr, StreamId};
use crate::private_pool::PoolId;

/// The state of a block in a snapshot (PyTorch's strings).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed to a caller.
    ActiveAllocated,
    /// Freed by the caller, still in use by a stream.
    ActivePendingFree,
    /// Free.
    Inactive,
}

impl BlockState {
    /// PyTorch's name for the state.
    pub fn name(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockInfo {
    /// Start address.
    pub address: DevicePtr,
    /// Block size in bytes.
    pub size: u64,
    /// Bytes the caller asked for (0 when free).
    pub requested_size: u64,
    /// Its state.
    pub state: BlockState,
}

/// One segment (for expandable segments: one contiguous mapped range).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentInfo {
    /// Device ordinal.
    pub device: usize,
    /// Base address.
    pub address: DevicePtr,
    /// Size in bytes.
    pub total_size: u64,
    /// The stream it serves.
    pub stream: StreamId,
    /// Whether it belongs to the small pool.
    pub is_small: bool,
    /// Whether it is an expandable (mapped) range.
    pub is_expandable: bool,
    /// The private pool it belongs to ([`PoolId::DEFAULT`] for the default
    /// pools): PyTorch's `segment_pool_id`.
    pub pool_id: PoolId,
    /// Its blocks, by address; they tile the segment.
    pub blocks: Vec<BlockInfo>,
}

impl SegmentInfo {
    /// Bytes in blocks handed to callers.
    pub fn allocated_size(&self) -> u64 {
        self.sum(|b| b.state == BlockState::ActiveAllocated)
    }

    /// Bytes the callers of its blocks asked for.
    pub fn requested_size(&self) -> u64 {
        self.blocks.iter().map(|b| b.requested_size).sum()
    }

    /// Bytes in active blocks (allocated or pending free).
    pub fn active_size(&self) -> u64 {
        self.sum(|b| b.state != BlockState::Inactive)
    }

    fn sum(&self, pick: impl Fn(&BlockInfo) -> bool) -> u64 {
        self.blocks.iter().filter(|b| pick(b)).map(|b| b.size).sum()
    }
}

/// Every segment of one device allocator.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemorySnapshot {
    /// Segments by address.
    pub segments: Vec<SegmentInfo>,
}
