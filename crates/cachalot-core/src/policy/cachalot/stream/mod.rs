//! One stream's state: its small and large pools, statistics, blocks waiting
//! for other streams, and how its pages are mapped: created, or re-mapped
//! from its cache once it holds its page budget (`budget`, which also says
//! whether the stream churns).
//!
//! A churning stream (`budget`) has a raised budget
//! (`cachalot_churn_slack`; 0 turns it off); its freed large blocks merge
//! back as any other's (kept unmerged for exact-size reuse, they held pages
//! the next layout needed elsewhere).
//!
//! Everything here runs under the stream's own lock; the only shared thing it
//! touches is [`Pages`], and only when a page or segment must come from (or go
//! back to) the device.

use std::collections::HashMap;
use std::sync::Arc;

use crate::backend::{BackendResult, EventId, StreamId};
use crate::private_pool::SegmentSource;
use crate::snapshot::SegmentInfo;

use super::budget::Budget;
use super::pool::Pool;
use super::settings::StreamConfig;
use super::stats::ledger::Ledger;
use super::vm::pages::Pages;
use super::vm::ranges::RangeTable;

mod frees;
mod malloc;
mod mapping;

use frees::Pending;

/// See the module docs.
#[derive(Debug)]
pub(crate) struct StreamState {
    stream: StreamId,
    pools: [Pool; 2],
    /// Statistics and events.
    pub(crate) ledger: Ledger,
    recorded: HashMap<u64, Vec<StreamId>>,
    pending: Vec<Pending>,
    /// How many of `pending` were freed while quiet, their events unrecorded.
    unrecorded: usize,
    spare_events: Vec<EventId>,
    /// Its page budget; until it first re-maps a page, a block at its
    /// frontier is mapped in handles of its own (see
    /// [`StreamState::map_span`]).
    budget: Budget,
    /// Whether blocks were freed since the stream was last synchronized: work
    /// queued on the stream may still use their pages, so none may be unmapped
    /// before the stream is (see [`StreamState::quiesce`]).
    unsynced: bool,
    config: StreamConfig,
    ranges: Arc<RangeTable>,
    /// A private pool's own allocator (`MemPool(allocator=...)`): the lane
    /// carves its blocks from segments it gives, never pages.
    source: Option<Arc<dyn SegmentSource>>,
    /// The private pool's slot (0: the default pools). A lane of a private
    /// pool never re-maps its pages (a graph replays at the addresses it
    /// captured, freed blocks included).
    slot: u32,
}

impl StreamState {
    /// An empty stream.
    pub(crate) fn new(
        stream: StreamId,
        ledger: Ledger,
        config: StreamConfig,
        ranges: Arc<RangeTable>,
        slot: u32,
        source: Option<Arc<dyn SegmentSource>>,
    ) -> StreamState {
        let keeps = config.range_size(1) > 0 && config.threshold.is_none() && source.is_none();
        let mut pools = [Pool::new(true, keeps), Pool::new(false, false)];
        for p in &mut pools {
            p.set_source(source.clone());
        }
        StreamState {
            stream,
            pools,
            ledger,
            recorded: HashMap::new(),
            pending: Vec::new(),
            unrecorded: 0,
            spare_events: Vec::new(),
            budget: Budget::new(&config),
            unsynced: false,
            config,
            ranges,
            source,
            slot,
        }
    }

    /// Whether this is the state of `stream` in pool slot `slot`.
    #[inline(always)]
    pub(crate) fn is(&self, stream: StreamId, slot: u32) -> bool {
        self.stream == stream && self.slot == slot
    }

    /// The stream.
    pub(crate) fn stream(&self) -> StreamId {
        self.stream
    }

    /// The private pool's slot (0: the default pools).
    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }

    /// Whether this is a lane of a private pool.
    fn private(&self) -> bool {
        self.slot != 0
    }

    /// Takes the state over for `stream` in pool slot `slot` if it holds
    /// nothing: no block (allocated, waiting or kept), no page or segment,
    /// no free waiting for another stream. Its reserved ranges (empty) stay
    /// and serve the new stream; its statistics go on (the device's figures
    /// are sums over states), its page history starts afresh. A lane whose
    /// segments come from a pool's own allocator serves only another such
    /// lane (it has no ranges), with the new pool's `source`. Whether it was
    /// taken over.
    pub(crate) fn recycle(
        &mut self,
        stream: StreamId,
        slot: u32,
        source: &Option<Arc<dyn SegmentSource>>,
    ) -> bool {
        let holds = self.reserved() > 0
            || !self.pending.is_empty()
            || self.pools.iter().any(|p| p.heap.live_count() > 0);
        if holds || self.source.is_some() != source.is_some() {
            return false;
        }
        self.source.clone_from(source);
        for p in &mut self.pools {
            p.set_source(source.clone());
        }
        self.stream = stream;
        self.slot = slot;
        self.recorded.clear();
        self.unsynced = false;
        self.ledger.set_stream(stream);
        self.start_afresh();
        true
    }

    /// Drops the pool's own allocator, if any, as the lane's pool is
    /// forgotten (it holds nothing from it).
    pub(crate) fn retire(&mut self) {
        self.source = None;
        for p in &mut self.pools {
            p.set_source(None);
        }
    }

    /// Waits for the work queued on the stream when blocks were freed since it
    /// last did. Unmapping, unlike freeing a segment, is not ordered after that
    /// work: a page unmapped under a kernel still reading a freed block faults.
    /// A stream the backend no longer knows (destroyed by its owner) is
    /// waited for through the whole device.
    fn quiesce(&mut self, pages: &Pages) -> BackendResult<()> {
        if self.unsynced {
            let backend = pages.backend();
            backend
                .synchronize_stream(self.stream)
                .or_else(|_| backend.synchronize_device())?;
            self.unsynced = false;
        }
        Ok(())
    }

    fn in_use(&self) -> u64 {
        self.pools.iter().map(Pool::in_use).sum()
    }

    fn mapped(&self) -> u64 {
        self.pools
            .iter()
            .filter_map(|p| p.cells.as_ref())
            .map(|s| s.mapped())
            .sum()
    }

    /// Forgets the page history (peak, churn) once the large pool gave its
    /// range back: what comes next is laid out anew, and is judged anew.
    fn start_afresh(&mut self) {
        let bytes = self.ledger.allocated_bytes();
        self.budget.start_afresh(self.in_use(), bytes);
    }

    /// Gives back cached memory down to `keep` bytes per pool.
    fn release_cached(&mut self, pages: &Pages, keep: u64) -> BackendResult<()> {
        self.quiesce(pages)?;
        for p in 0..2 {
            self.pools[p].release_cached(pages, &mut self.ledger, keep)?;
        }
        Ok(())
    }

    /// Waits for every pending free and completes it, keeping the memory
    /// (a live private pool's lane at `empty_cache`).
    pub(crate) fn finish_frees(&mut self, pages: &Pages) -> BackendResult<()> {
        let result = self.sync_pending(pages);
        self.ledger.flush();
        result
    }

    /// Returns every cached page, segment, range and spare event to the device.
    pub(crate) fn empty_cache(&mut self, pages: &Pages) -> BackendResult<()> {
        let result = self.empty_cache_inner(pages);
        self.ledger.flush();
        result
    }

    fn empty_cache_inner(&mut self, pages: &Pages) -> BackendResult<()> {
        self.sync_pending(pages)?;
        self.release_cached(pages, 0)?;
        for p in 0..2 {
            self.pools[p].release_range_if_empty(pages)?;
            self.ranges.publish(p, self.pools[p].range());
        }
        match self.pools[1].range() {
            None => self.start_afresh(),
            Some(_) => self.budget.regrow(),
        }
        while let Some(e) = self.spare_events.pop() {
            pages
                .backend()
                .destroy_event(e)
                .inspect_err(|_| self.spare_events.push(e))?;
        }
        Ok(())
    }

    /// The stream's segments.
    pub(crate) fn snapshot(&self, device: usize) -> Vec<SegmentInfo> {
        self.pools
            .iter()
            .flat_map(|p| p.snapshot(device, self.stream))
            .collect()
    }

    /// Bytes held in pages and segments by this stream.
    pub(crate) fn reserved(&self) -> u64 {
        self.pools.iter().map(Pool::reserved).sum()
    }

    /// Checks this stream's invariants.
    pub(crate) fn validate(&self) -> Result<(), String> {
        let stats = self.ledger.stats();
        let mut pending_blocks = 0;
        for (p, pool) in self.pools.iter().enumerate() {
            pending_blocks += super::validate::validate_pool(pool, &stats, p == 0)?;
        }
        if pending_blocks != self.pending.len() {
            return Err(format!(
                "{pending_blocks} pending blocks but {} pending frees",
                self.pending.len()
            ));
        }
        for ptr in self.recorded.keys() {
            self.find(*ptr)
                .map_err(|e| format!("record_stream entry {ptr:#x}: {e}"))?;
        }
        stats.check_levels()
    }
}
