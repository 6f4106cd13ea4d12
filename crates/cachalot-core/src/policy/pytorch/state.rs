//! The allocator's state and its block transitions: best-fit lookup, handing a
//! block out (with its split), and taking a freed block back (with its merges).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use crate::addr_map::AddrMap;
use crate::backend::{Backend, DevicePtr, EventId, GraphNode, StreamId};
use crate::config::AllocatorConfig;

use super::block::{BlockId, Blocks, SegmentId, Segments};
use super::event_queues::{EventQueues, StreamHashes};
use super::expandable::Orphan;
use super::ledger::Ledger;
use super::placement::Placement;
use super::pool::PoolPair;
use crate::private_pool::PoolBook;
use crate::sleep::Tag;

/// One request, after rounding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request {
    /// The rounded block size.
    pub(crate) size: u64,
    /// What the caller asked for.
    pub(crate) requested: u64,
    /// Small pool or large.
    pub(crate) small: bool,
    /// The stream.
    pub(crate) stream: StreamId,
    /// The size of a new segment for it.
    pub(crate) alloc_size: u64,
    /// The private pool it goes to (0: the default pools).
    pub(crate) pool: u32,
    /// Expandable segments serve it: on for the device and the pool has no
    /// allocator of its own (PyTorch's `is_expandable_segments_active`); off
    /// for a block borrowed from another pool.
    pub(crate) expandable: bool,
}

/// Everything behind the allocator's lock.
pub(crate) struct State {
    /// Where segments, pages and events come from.
    pub(crate) backend: Arc<dyn Backend>,
    /// The placement rules in force.
    pub(crate) placement: Placement,
    /// Device memory, in bytes.
    pub(crate) total_memory: u64,
    /// The device ordinal.
    pub(crate) device: usize,
    /// `garbage_collection_threshold` (0 = off).
    pub(crate) gc_threshold: f64,
    /// The memory fraction limit in bytes, if any.
    pub(crate) allowed: Option<u64>,
    /// The configuration string, for error reports.
    pub(crate) config_source: String,
    /// All blocks.
    pub(crate) blocks: Blocks,
    /// All segments.
    pub(crate) segments: Segments,
    /// The cached blocks of each pool pair by slot: the default pools at 0,
    /// then private pools (an unused slot is an empty pair).
    pub(crate) pools: Vec<PoolPair>,
    /// Private pools: routes, use counts, options.
    pub(crate) book: PoolBook,
    /// The private pools that are tags ([`crate::sleep`]), by pool slot.
    pub(crate) tags: HashMap<u32, Tag>,
    /// Blocks freed after `record_stream` while a route was open: their events
    /// are recorded once no route is open (PyTorch queries no event during a
    /// capture).
    pub(crate) deferred: VecDeque<BlockId>,
    /// `graph_capture_record_stream_reuse`: deferred blocks may be reused
    /// during the capture (`capture_reuse.rs`).
    pub(crate) capture_reuse: bool,
    /// The free marks of deferred blocks that may be reused during the
    /// capture: the capture's nodes their other streams' uses end at.
    pub(crate) free_marks: HashMap<BlockId, Vec<GraphNode>>,
    /// Allocated blocks by address.
    pub(crate) allocated: AddrMap<BlockId>,
    /// Outstanding cross-stream events, per stream, oldest first.
    pub(crate) pending: EventQueues,
    /// Each stream's hash in PyTorch's tables (their iteration order).
    pub(crate) hashes: StreamHashes,
    /// Events ready for reuse.
    pub(crate) spare_events: Vec<EventId>,
    /// Statistics and the observer.
    pub(crate) ledger: Ledger,
    /// Pages whose unmap or release failed, retried at `empty_cache`.
    pub(crate) orphan_pages: Vec<Orphan>,
    /// Ranges emptied but not yet released (a release failed).
    pub(crate) orphan_ranges: Vec<(DevicePtr, u64)>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("blocks", &self.blocks.len())
            .field("segments", &self.segments.len())
            .field("allocated", &self.allocated.len())
            .finish_non_exhaustive()
    }
}

impl State {
    /// Empty state for `config` on `backend`.
    pub(crate) fn new(backend: Arc<dyn Backend>, config: &AllocatorConfig) -> State {
        let caps = backend.capabilities().clone();
        let placement = Placement::new(config, caps.virtual_memory);
        let mut st = State {
            backend,
            ledger: Ledger::new(placement.max_split_size),
            placement,
            total_memory: caps.total_memory,
            device: caps.device,
            gc_threshold: config.garbage_collection_threshold,
            allowed: None,
            config_source: config.source.clone(),
            blocks: Blocks::default(),
            segments: Segments::default(),
            pools: vec![PoolPair::default()],
            book: PoolBook::default(),
            tags: HashMap::new(),
            deferred: VecDeque::new(),
            capture_reuse: config.graph_capture_record_stream_reuse,
            free_marks: HashMap::new(),
            allocated: AddrMap::default(),
            pending: EventQueues::default(),
            hashes: StreamHashes::new(caps.device),
            spare_events: Vec::new(),
            orphan_pages: Vec::new(),
            orphan_ranges: Vec::new(),
        };
        st.set_fraction(config.per_process_memory_fraction);
        st
    }

    /// Puts `config`'s placement settings in force. Oversize counts follow the
    /// new split limit at once (PyTorch's drift, counted up under one limit
    /// and down under another, would break the statistics' invariants).
    pub(crate) fn set_placement(&mut self, config: &AllocatorConfig) {
        let virtual_memory = self.backend.capabilities().virtual_memory;
        self.placement = Placement::new(config, virtual_memory);
        self.gc_threshold = config.garbage_collection_threshold;
        self.capture_reuse = config.graph_capture_record_stream_reuse;
        let (allocations, segments) = self.oversize_counts();
        self.ledger
            .set_max_split_size(self.placement.max_split_size, allocations, segments);
    }

    /// Allocated blocks and plain segments at or above the split limit.
    pub(crate) fn oversize_counts(&self) -> (i64, i64) {
        let allocations = self
            .blocks
            .iter()
            .filter(|(_, b)| b.allocated && self.placement.is_oversize(b.size))
            .count();
        let segments = self
            .segments
            .iter()
            .filter(|(_, s)| s.expandable.is_none() && self.placement.is_oversize(s.size))
            .count();
        (allocations as i64, segments as i64)
    }

    /// Sets the memory fraction (already checked to lie in `[0, 1]`).
    pub(crate) fn set_fraction(&mut self, fraction: f64) {
        self.allowed =
            (fraction < 1.0).then(|| (fraction * self.total_memory as f64).round() as u64);
    }

    /// Bytes reserved from the device.
    pub(crate) fn reserved(&self) -> u64 {
        self.ledger.stats.reserved_bytes.all.current as u64
    }

    /// Whether garbage collection of cached blocks is on.
    pub(crate) fn gc_enabled(&self) -> bool {
        self.allowed.is_some() && self.gc_threshold > 0.0
    }

    /// Puts a free mapped block into its pool.
    pub(crate) fn cache(&mut self, id: BlockId) {
        let b = &mut self.blocks[id];
        self.pools[b.pool as usize].of_mut(b.small).insert(id, b);
    }

    /// Takes a block out of its pool.
    pub(crate) fn uncache(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        self.pools[b.pool as usize].of_mut(b.small).remove(b);
    }

    /// Links `id` after `prev` (or as its segment's head).
    pub(crate) fn link_after(&mut self, prev: Option<BlockId>, id: BlockId, segment: SegmentId) {
        match prev {
            Some(p) => self.blocks[p].next = Some(id),
            None => self.segments[segment].head = id,
        }
    }

    /// Merges `src`, a neighbour of `dst`, into `dst` when `src` is free, unclaimed
    /// and equally mapped. Returns the bytes absorbed (0 when not merged).
    pub(crate) fn try_merge(&mut self, dst: BlockId, src: Option<BlockId>) -> u64 {
        let Some(src) = src else { return 0 };
        let (s, d) = (&self.blocks[src], &self.blocks[dst]);
        if !s.is_reusable() || s.mapped != d.mapped {
            return 0;
        }
        let pool = self.pools[s.pool as usize].of_mut(s.small);
        if s.mapped {
            pool.remove(s);
        } else {
            pool.remove_unmapped(s);
        }
        let Some(s) = self.blocks.remove(src) else {
            return 0;
        };
        let segment = s.segment;
        if self.blocks[dst].prev == Some(src) {
            self.blocks[dst].addr = s.addr;
            self.blocks[dst].prev = s.prev;
            self.link_after(s.prev, dst, segment);
        } else {
            self.blocks[dst].next = s.next;
            if let Some(n) = s.next {
                self.blocks[n].prev = Some(dst);
            }
        }
        self.blocks[dst].size += s.size;
        s.size
    }

    /// The best-fit cached block for `req`, taken out of its pool, if the
    /// oversize rules allow it.
    pub(crate) fn get_free_block(&mut self, req: &Request) -> Option<BlockId> {
        let gc = self.gc_enabled();
        let pool = self.pools[req.pool as usize].of_mut(req.small);
        if gc {
            pool.lookups += 1;
        }
        let pool = &*pool;
        let best = {
            let blocks = &self.blocks;
            let mut fits = pool.fits(req.stream, req.size).map(|(_, id)| id);
            let mut best = fits.next()?;
            if blocks[best].expandable {
                if req.expandable {
                    let grown = |id: BlockId| {
                        let b = &blocks[id];
                        b.size
                            + b.next
                                .filter(|n| !blocks[*n].mapped)
                                .map_or(0, |n| blocks[n].size)
                    };
                    for next in fits {
                        if !blocks[best].expandable || grown(next) >= grown(best) {
                            break;
                        }
                        best = next;
                    }
                } else {
                    best = fits.find(|id| !blocks[*id].expandable)?;
                }
            }
            best
        };
        if !self
            .placement
            .oversize_allows(req.size, self.blocks[best].size)
        {
            return None;
        }
        self.uncache(best);
        Some(best)
    }

    /// Hands block `id` (out of its pool) to the caller, splitting off the
    /// remainder when `split`. Returns the allocated block's address.
    pub(crate) fn alloc_found_block(
        &mut self,
        id: BlockId,
        req: &Request,
        split: bool,
    ) -> DevicePtr {
        let b = &self.blocks[id];
        let (prev, segment, small, expandable) = (b.prev, b.segment, b.small, b.expandable);
        let (size, already_split) = (b.size, b.is_split());
        let mut chosen = id;
        if split {
            let piece = b.front_piece(req.size, id);
            let new_id = self.blocks.insert(piece);
            self.link_after(prev, new_id, segment);
            let rem = &mut self.blocks[id];
            rem.prev = Some(new_id);
            rem.addr += req.size;
            rem.size -= req.size;
            let rem_size = rem.size;
            self.cache(id);
            if !expandable {
                if already_split {
                    self.ledger.splits_changed(small, 0, -(req.size as i64));
                } else {
                    self.ledger.splits_changed(small, 1, rem_size as i64);
                }
            }
            chosen = new_id;
        } else if already_split && !expandable {
            self.ledger.splits_changed(small, -1, -(size as i64));
        }
        let blk = &mut self.blocks[chosen];
        blk.allocated = true;
        blk.requested = req.requested;
        let addr = blk.addr;
        self.allocated.insert(addr, chosen);
        self.ledger.allocated(&self.blocks[chosen]);
        addr
    }

    /// Returns a freed, unclaimed block to its pool, merging it with free
    /// neighbours.
    pub(crate) fn free_block(&mut self, id: BlockId) {
        let b = &self.blocks[id];
        let (prev, next, small, expandable) = (b.prev, b.next, b.small, b.expandable);
        let (addr, size, requested, stream) = (b.addr, b.size, b.requested, b.stream);
        let (mut net_blocks, mut net_bytes) = (0i64, 0i64);
        for neighbour in [prev, next] {
            let absorbed = self.try_merge(id, neighbour);
            if absorbed > 0 {
                net_blocks -= 1;
                net_bytes -= absorbed as i64;
            }
        }
        self.cache(id);
        let merged = &self.blocks[id];
        if merged.is_split() {
            net_blocks += 1;
            net_bytes += merged.size as i64;
        }
        if !expandable {
            self.ledger.splits_changed(small, net_blocks, net_bytes);
        }
        self.ledger
            .free_completed(addr, size, requested, small, stream);
    }
}
