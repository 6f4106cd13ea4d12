//! Blocks and segments, addressed by id.
//!
//! A segment is tiled by blocks linked through `prev`/`next` ids in address order.
//! A plain segment is one device allocation; an expandable segment is a reserved
//! virtual range whose unmapped stretches are blocks with `mapped == false`.

use std::sync::Arc;

use super::arena::{arena_id, Arena};
use crate::backend::{DevicePtr, EventId, StreamId};
use crate::private_pool::SegmentSource;

use super::expandable::ExpandableSegment;

arena_id!(
    /// A block in the allocator's arena.
    BlockId
);
arena_id!(
    /// A segment in the allocator's arena.
    SegmentId
);

/// A contiguous sub-range of a segment.
#[derive(Debug, Clone)]
pub(crate) struct Block {
    /// The stream it was allocated for (and whose pool it returns to).
    pub(crate) stream: StreamId,
    /// Start address.
    pub(crate) addr: DevicePtr,
    /// Size in bytes.
    pub(crate) size: u64,
    /// What the caller asked for (meaningful while active).
    pub(crate) requested: u64,
    /// Whether it belongs to the small pool.
    pub(crate) small: bool,
    /// The private pool it belongs to (0: the default pools).
    pub(crate) pool: u32,
    /// Handed to a caller.
    pub(crate) allocated: bool,
    /// Backed by device memory (false only for unmapped stretches of an
    /// expandable segment).
    pub(crate) mapped: bool,
    /// The neighbour at lower addresses in the same segment.
    pub(crate) prev: Option<BlockId>,
    /// The neighbour at higher addresses in the same segment.
    pub(crate) next: Option<BlockId>,
    /// Outstanding cross-stream events; the block is active while this is non-zero.
    pub(crate) event_count: u32,
    /// Other streams that used the block (`record_stream`), until its free.
    pub(crate) stream_uses: Vec<StreamId>,
    /// The streams recorded while a route was open. A free deferred past the
    /// route drops them: work captured on them has not run yet.
    pub(crate) capture_uses: Vec<StreamId>,
    /// The pool's GC clock when the block entered the pool.
    pub(crate) gc_base: i64,
    /// The owning segment.
    pub(crate) segment: SegmentId,
    /// Whether the owning segment is expandable.
    pub(crate) expandable: bool,
}

impl Block {
    /// Whether the block shares its segment with other blocks.
    pub(crate) fn is_split(&self) -> bool {
        self.prev.is_some() || self.next.is_some()
    }

    /// Allocated, or freed but awaiting a stream (its events, or, freed during
    /// a capture, the recording of its events).
    pub(crate) fn is_active(&self) -> bool {
        self.allocated || self.event_count > 0 || !self.stream_uses.is_empty()
    }

    /// A copy of this block's fields for a new block of `size` bytes at the same
    /// address followed by `next`, with no stream uses (no clone of the list).
    pub(crate) fn front_piece(&self, size: u64, next: BlockId) -> Block {
        Block {
            stream: self.stream,
            addr: self.addr,
            size,
            requested: self.requested,
            small: self.small,
            pool: self.pool,
            allocated: self.allocated,
            mapped: self.mapped,
            prev: self.prev,
            next: Some(next),
            event_count: self.event_count,
            stream_uses: Vec::new(),
            capture_uses: Vec::new(),
            gc_base: self.gc_base,
            segment: self.segment,
            expandable: self.expandable,
        }
    }

    /// Free and reusable: not active and not claimed by a stream.
    pub(crate) fn is_reusable(&self) -> bool {
        !self.allocated && self.event_count == 0 && self.stream_uses.is_empty()
    }
}

/// One segment: a device allocation, or an expandable virtual range.
#[derive(Debug)]
pub(crate) struct Segment {
    /// Base address.
    pub(crate) base: DevicePtr,
    /// Bytes: the allocation size, or the reserved range for an expandable segment.
    pub(crate) size: u64,
    /// The stream it serves.
    pub(crate) stream: StreamId,
    /// Small or large pool.
    pub(crate) small: bool,
    /// The private pool it belongs to (0: the default pools).
    pub(crate) pool: u32,
    /// The block at `base`.
    pub(crate) head: BlockId,
    /// Page bookkeeping, for expandable segments.
    pub(crate) expandable: Option<ExpandableSegment>,
    /// Where it came from, when not from the device (its pool's source).
    pub(crate) source: Option<Arc<dyn SegmentSource>>,
    /// A paused tag's segment: its pages are given back, its blocks kept.
    pub(crate) paused: bool,
}

/// Blocks by id.
pub(crate) type Blocks = Arena<BlockId, Block>;
/// Segments by id.
pub(crate) type Segments = Arena<SegmentId, Segment>;

/// An event awaiting completion for a block freed while other streams used it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PendingEvent {
    /// The backend event.
    pub(crate) event: EventId,
    /// The block it holds back.
    pub(crate) block: BlockId,
}
