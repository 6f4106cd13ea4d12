//! Snapshots: one entry per plain segment, and one per contiguous mapped range of
//! an expandable segment, as PyTorch reports them. A paused tag's segments are
//! left out, as unmapped pages are: no memory lies under them.

use crate::private_pool::PoolId;
use crate::snapshot::{BlockInfo, BlockState, MemorySnapshot, SegmentInfo};

use super::block::{Block, Segment};
use super::state::State;

impl State {
    /// Every segment and block, by address.
    pub(crate) fn snapshot(&self) -> MemorySnapshot {
        let mut segments = Vec::new();
        for (_, seg) in self.segments.iter().filter(|(_, s)| !s.paused) {
            let pool_id = self.book.id_of(seg.pool);
            let mut open: Option<SegmentInfo> = None;
            let mut cur = Some(seg.head);
            while let Some(b) = cur.and_then(|id| self.blocks.get(id)) {
                if b.mapped {
                    open.get_or_insert_with(|| empty_segment(self.device, seg, b, pool_id))
                        .blocks
                        .push(block_info(b));
                } else if let Some(done) = open.take() {
                    segments.push(done);
                }
                cur = b.next;
            }
            segments.extend(open);
        }
        for s in &mut segments {
            s.total_size = s.blocks.iter().map(|b| b.size).sum();
        }
        segments.sort_by_key(|s| s.address);
        MemorySnapshot { segments }
    }
}

fn empty_segment(device: usize, seg: &Segment, first: &Block, pool_id: PoolId) -> SegmentInfo {
    SegmentInfo {
        device,
        address: first.addr,
        total_size: 0,
        stream: seg.stream,
        is_small: seg.small,
        is_expandable: seg.expandable.is_some(),
        pool_id,
        blocks: Vec::new(),
    }
}

fn block_info(b: &Block) -> BlockInfo {
    let state = if b.allocated {
        BlockState::ActiveAllocated
    } else if b.event_count > 0 || !b.stream_uses.is_empty() {
        // Waiting for its events, or freed during a capture and waiting for
        // them to be recorded (PyTorch counts both as active).
        BlockState::ActivePendingFree
    } else {
        BlockState::Inactive
    };
    let requested_size = if b.is_active() { b.requested } else { 0 };
    BlockInfo {
        address: b.addr,
        size: b.size,
        requested_size,
        state,
    }
}
