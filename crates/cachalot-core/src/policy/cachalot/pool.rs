//! One pool (small or large) of one stream: its block heap and, with virtual
//! memory, its reserved range and cells; without, its device segments.
//!
//! Placement is mapping-aware best fit: the smallest free block whose pages are
//! already mapped wins, so the common case is a free-list hit with no driver
//! call; only when none fits does it pick the lowest window needing the fewest
//! new pages.

use std::ops::Range;
use std::sync::Arc;

use crate::backend::{BackendError, BackendResult, CallKind, PageHandle};
use crate::backing::Backing;
use crate::private_pool::{PoolId, SegmentSource};
use crate::snapshot::{BlockInfo, BlockState, SegmentInfo};

use super::heap::reuse::Reuse;
use super::heap::{BlockId, Heap, State};
use super::stats::ledger::Ledger;
use super::vm::aliases::Aliases;
use super::vm::cells::Cells;
use super::vm::pages::{Pages, SEGMENT_UNIT};

/// Requests of at most this many bytes go to the small pool.
pub(crate) const SMALL_MAX: u64 = 1 << 20;

/// Every block size is a multiple of this.
pub(crate) const ROUNDING: u64 = 512;

/// With this many kept blocks or more, a request that finds no mapped space
/// first merges back just one kept block large enough (the largest kept size
/// in the small pool), not all of them: vit_train_bf16 used to merge back
/// about 150 kept small blocks 10 times a pass, then miss the reuse lists
/// (840 instructions per operation, 660 since). With fewer, all go back, as
/// merging a few costs little; doing it with fewer takes bert_dynamic to 1.0501
/// times its peak requested bytes.
const KEPT_MANY: usize = 64;

/// How many free blocks beyond the best fit placement looks at for one whose
/// pages are already mapped.
const SCAN: usize = 16;

/// A block whose size is a whole number of pages, of at least this many
/// bytes (the size from which PyTorch's native allocator gives a request a
/// segment of its own), may move to a page boundary ([`straddles`]).
const OWN_PAGES_MIN: u64 = 10 << 20;

/// Whether a block of `size` bytes placed at `at`, needing `unmapped` new
/// pages of `g` bytes, straddles a page needlessly: a page-multiple block of
/// at least [`OWN_PAGES_MIN`] bytes, more than two thirds of a page into a
/// page it shares with the block below, all its other pages new.
/// [`Pool::place_mapping`] then takes the next page boundary where that
/// needs no more new pages. The boundary leaves a hole of less than a third
/// of a page for as long as the block below lives; the shared page would
/// keep more than two thirds of a page idle once the block below goes first
/// (even odds: half of that is more than the hole). seed004 (three blocks of
/// 4,000,000 bytes, then one of 32 MiB that outlives them, then a hundred of
/// 4 MiB) then runs on 432 MiB, as under PyTorch's native allocator, instead
/// of 434; no other bundled recording changes (Note [Placement]).
fn straddles(at: u64, size: u64, unmapped: u64, g: u64) -> bool {
    size >= OWN_PAGES_MIN && size.is_multiple_of(g) && unmapped * g == size && at % g > 2 * g / 3
}

/// Where an allocation goes.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Placement {
    /// The free block it is carved from.
    pub(crate) id: BlockId,
    /// Its address.
    pub(crate) at: u64,
    /// Pages still to map under it.
    pub(crate) unmapped: u64,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Pool {
    /// Whether this is the small pool.
    pub(crate) small: bool,
    /// Its blocks.
    pub(crate) heap: Heap,
    /// The cells of the reserved range (virtual memory only, once reserved).
    pub(crate) cells: Option<Cells>,
    /// The mappings moved pages left behind in that range.
    pub(crate) aliases: Aliases,
    range: Option<(u64, u64)>,
    /// Freed blocks kept for exact-size reuse (see [`Pool::keeps_freed`]).
    kept: Reuse,
    keeps: bool,
    /// A private pool's own allocator (`MemPool(allocator=...)`): its
    /// segments come from there, never pages.
    source: Option<Arc<dyn SegmentSource>>,
}

impl Pool {
    /// An empty pool; `keeps` as [`Pool::keeps_freed`] (with pages only).
    pub(crate) fn new(small: bool, keeps: bool) -> Pool {
        Pool {
            small,
            heap: Heap::default(),
            cells: None,
            aliases: Aliases::default(),
            range: None,
            kept: Reuse::default(),
            keeps,
            source: None,
        }
    }

    /// Sets where the pool's segments come from (`None`: the device).
    pub(crate) fn set_source(&mut self, source: Option<Arc<dyn SegmentSource>>) {
        self.source = source;
    }

    /// Whether freed blocks are kept for exact-size reuse, staying in the
    /// address index: the small pool with pages and no release threshold.
    /// (A large pool that kept its recent blocks while its stream churned
    /// held pages the next layout needed elsewhere: bert_dynamic replayed
    /// pass after pass made 38 driver calls in its third pass, none since.)
    pub(crate) fn keeps_freed(&self) -> bool {
        self.keeps
    }

    /// Keeps a freed block for reuse at its exact size; it keeps its pages.
    pub(crate) fn keep(&mut self, id: BlockId) {
        self.heap.keep(id);
        self.kept.push(self.heap.block(id).size, id);
    }

    /// A kept block of exactly `size` bytes handed out for `requested`.
    pub(crate) fn reuse(&mut self, size: u64, requested: u64) -> Option<u64> {
        if !self.keeps {
            return None;
        }
        let id = self.kept.pop(size)?;
        self.heap.reuse(id, requested);
        Some(self.heap.block(id).addr)
    }

    /// Merges every kept block back into the heap and releases its cells.
    pub(crate) fn release_kept(&mut self) {
        if self.kept.len() == 0 {
            return;
        }
        for (size, id) in self.kept.drain() {
            self.merge_kept(size, id);
        }
    }

    /// Merges one kept block of at least `size` bytes back into the heap, so
    /// that a request of `size` bytes fits on its mapped pages; false when
    /// there is none.
    pub(crate) fn release_kept_for(&mut self, size: u64) -> bool {
        if self.kept.len() < KEPT_MANY {
            return false;
        }
        match self.kept.pop_at_least(size) {
            Some((size, id)) => {
                self.merge_kept(size, id);
                true
            }
            None => false,
        }
    }

    /// Merges a block taken out of the kept ones back into the heap.
    fn merge_kept(&mut self, size: u64, id: BlockId) {
        let addr = self.heap.block(id).addr;
        if let Some(cells) = self.cells.as_mut() {
            cells.release_mapped(cells.span(addr, size));
        }
        self.heap.take_live(addr);
        self.heap.release(id);
    }

    /// Pages live blocks touch (the small pool's kept blocks count as live).
    pub(crate) fn in_use(&self) -> u64 {
        self.cells.as_ref().map_or(0, Cells::in_use)
    }

    /// Number of kept blocks.
    pub(crate) fn kept_count(&self) -> usize {
        self.kept.len()
    }

    /// Whether block `id` is in the kept lists exactly once.
    pub(crate) fn is_kept(&self, id: BlockId) -> bool {
        self.kept.holds_once(self.heap.block(id).size, id)
    }

    /// The reserved range (base, size), if any.
    pub(crate) fn range(&self) -> Option<(u64, u64)> {
        self.range
    }

    /// Reserves the virtual range on first use: `size` bytes, or less where
    /// address space is short, down to what a first block of `first` bytes
    /// needs ([`Pages::reserve_range`]).
    pub(crate) fn ensure_range(
        &mut self,
        pages: &Pages,
        size: u64,
        first: u64,
    ) -> BackendResult<()> {
        if self.range.is_some() {
            return Ok(());
        }
        let (base, size) = pages.reserve_range(size, first)?;
        if !self.small {
            // Its live blocks are over `SMALL_MAX` bytes: at most one starts
            // in each `SMALL_MAX` bytes of the range.
            self.heap
                .index_live_directly(base, SMALL_MAX.trailing_zeros());
        }
        self.heap.skip_split_counts();
        self.heap.add_region(base, size);
        self.cells = Some(Cells::new(base, pages.granularity()));
        self.range = Some((base, size));
        Ok(())
    }

    /// Gives the range back once nothing is mapped or live in it.
    pub(crate) fn release_range_if_empty(&mut self, pages: &Pages) -> BackendResult<()> {
        let Some((base, size)) = self.range else {
            return Ok(());
        };
        let mapped = self.cells.as_ref().map_or(0, Cells::mapped);
        if mapped > 0 || self.heap.live_count() > 0 {
            return Ok(());
        }
        pages.release_range(base, size)?;
        *self = Pool::new(self.small, self.keeps);
        Ok(())
    }

    /// Chooses where `size` bytes go, or `None` when no free block is that large.
    pub(crate) fn place(&self, size: u64) -> Option<Placement> {
        let Some(cells) = &self.cells else {
            let (id, b) = self.heap.best_fit(size)?;
            return Some(Placement {
                id,
                at: b.addr,
                unmapped: 0,
            });
        };
        // The usual case: the best fit lies on mapped pages.
        let (id, b) = self.heap.best_fit(size)?;
        if cells.all_mapped(b.addr, size) {
            return Some(Placement {
                id,
                at: b.addr,
                unmapped: 0,
            });
        }
        self.place_mapping(cells, size)
    }

    /// Placement when the best fit's first pages are not all mapped: a near fit
    /// on mapped pages, else the placement needing the fewest new pages.
    fn place_mapping(&self, cells: &Cells, size: u64) -> Option<Placement> {
        let mut best: Option<Placement> = None;
        for (k, (id, b)) in self.heap.fits(size).enumerate() {
            if k >= SCAN && best.is_some() {
                break;
            }
            for at in [b.addr, b.end() - size] {
                let unmapped = cells.unmapped_in(cells.span(at, size));
                if best.is_none_or(|p| unmapped < p.unmapped) {
                    best = Some(Placement { id, at, unmapped });
                }
                if unmapped == 0 {
                    break;
                }
            }
            if best.is_some_and(|p| p.unmapped == 0) {
                return best;
            }
        }
        // Every near fit needs new pages: look through all free blocks, inside
        // them too, first for a window on mapped pages (a fast bitmap scan),
        // then for the placement needing the fewest new pages (each a remap).
        for (id, b) in self.heap.fits(size) {
            if let Some(at) = cells.mapped_window(b.addr, b.end(), size) {
                return Some(Placement {
                    id,
                    at,
                    unmapped: 0,
                });
            }
        }
        // Ties go to a start that does not straddle a page needlessly
        // ([`straddles`]), then to the lowest address: with ties in best-fit
        // order, the pages of a stream whose layout keeps changing crept up
        // its range (bert_dynamic's by 12 pages at every pass, for good; its
        // cells and live table grew with them, and so did the cost per
        // operation).
        let g = cells.granularity();
        let key = |at: u64, unmapped: u64| (unmapped, straddles(at, size, unmapped, g), at);
        for (id, b) in self.heap.fits(size) {
            let Some((at, unmapped)) = cells.best_window(b.addr, b.end(), size) else {
                continue;
            };
            if best.is_none_or(|p| key(at, unmapped) < key(p.at, p.unmapped)) {
                best = Some(Placement { id, at, unmapped });
                if unmapped == 0 {
                    break;
                }
            }
        }
        best
    }

    /// Without virtual memory: adds a device segment that fits `size` bytes.
    pub(crate) fn grow(
        &mut self,
        pages: &Pages,
        ledger: &mut Ledger,
        size: u64,
    ) -> BackendResult<()> {
        let bytes = if self.small {
            SEGMENT_UNIT
        } else {
            size.div_ceil(SEGMENT_UNIT) * SEGMENT_UNIT
        };
        let base = pages.allocate_segment(self.source.as_deref(), bytes)?;
        let before = self.heap.split_free();
        self.heap.add_region(base, bytes);
        ledger.segment_allocated(self.small, base, bytes);
        ledger.splits_changed(self.small, before, self.heap.split_free());
        Ok(())
    }

    /// Maps `page`, `n` pages long, from `cell` on, once the aliases there
    /// are unmapped (the caller waited for its stream); the caller keeps the
    /// handle on failure.
    pub(crate) fn map_extent(
        &mut self,
        pages: &Pages,
        ledger: &mut Ledger,
        cell: u32,
        n: u32,
        page: PageHandle,
    ) -> BackendResult<()> {
        let unsupported = BackendError::Unsupported {
            call: CallKind::Map,
            backend: "segments",
        };
        let cells = self.cells.as_ref().ok_or(unsupported)?;
        let addr = cells.addr(cell);
        for c in cell..cell + n {
            if self.aliases.at(c).is_some() {
                self.unmap_alias(pages, c)?;
            }
        }
        pages.backend().map(addr, page)?;
        self.install(ledger, cell, n, page);
        Ok(())
    }

    /// Unmaps the extent starting at `head`, which no live block touches,
    /// and the aliases of its handle; returns its handle and length in
    /// pages.
    pub(crate) fn unmap_extent(
        &mut self,
        pages: &Pages,
        ledger: &mut Ledger,
        head: u32,
    ) -> BackendResult<(PageHandle, u32)> {
        let cells = self.cells.as_ref().ok_or(BackendError::Unsupported {
            call: CallKind::Unmap,
            backend: "segments",
        })?;
        let addr = cells.addr(head);
        let not_idle = || BackendError::InvalidArgument {
            call: CallKind::Unmap,
            reason: format!("no unused extent starts at {addr:#x}"),
        };
        let extent = cells
            .extent(head)
            .filter(|e| e.start == head && cells.is_cached_extent(head))
            .ok_or_else(not_idle)?;
        let n = extent.len() as u32;
        if let Some(page) = cells.page(head) {
            while let Some(c) = self.aliases.first_of(page) {
                self.unmap_alias(pages, c)?;
            }
        }
        let bytes = u64::from(n) * self.granularity();
        pages.backend().unmap(addr, bytes)?;
        self.uninstall(ledger, head).ok_or_else(not_idle)
    }

    /// Takes the cached one-page extent at `head` off its cell without a
    /// call: the cell keeps mapping it, as an alias once the caller maps the
    /// page elsewhere ([`Pool::moved`]). Its handle, or `None` when `head`
    /// is not such an extent.
    pub(crate) fn detach(&mut self, ledger: &mut Ledger, head: u32) -> Option<PageHandle> {
        let cells = self.cells.as_ref()?;
        if cells.extent(head) != Some(head..head + 1) {
            return None;
        }
        self.uninstall(ledger, head).map(|(page, _)| page)
    }

    /// Records that `page`, detached from `from`, is now mapped at `to`.
    pub(crate) fn moved(&mut self, page: PageHandle, from: u32, to: u32) {
        self.aliases.moved(page, from, to);
    }

    /// Puts a detached `page` back at `from`, which still maps it (mapping
    /// it elsewhere failed).
    pub(crate) fn reattach(&mut self, ledger: &mut Ledger, page: PageHandle, from: u32) {
        self.install(ledger, from, 1, page);
    }

    /// Maps `cell`, an alias whose page is cached at its owner (outside
    /// `keep`), by moving the page back: no call. Whether it did.
    pub(crate) fn adopt(&mut self, ledger: &mut Ledger, cell: u32, keep: &Range<u32>) -> bool {
        let Some((page, owner)) = self.adoptable(cell, keep) else {
            return false;
        };
        self.uninstall(ledger, owner);
        self.install(ledger, cell, 1, page);
        self.aliases.moved(page, owner, cell);
        true
    }

    /// The page and owner of `cell` when it is an alias whose page is cached
    /// at its owner, outside `keep` (see [`Pool::adopt`]).
    pub(crate) fn adoptable(&self, cell: u32, keep: &Range<u32>) -> Option<(PageHandle, u32)> {
        let page = self.aliases.at(cell)?;
        let owner = self.aliases.owner(page)?;
        let cached = self.cells.as_ref()?.is_cached_extent(owner);
        (cached && !keep.contains(&owner)).then_some((page, owner))
    }

    /// Whether a cell of `span` is an alias (mapping it unmaps the alias).
    pub(crate) fn has_aliases_in(&self, span: Range<u32>) -> bool {
        self.aliases.any_in(span)
    }

    /// Unmaps the alias at `cell`.
    fn unmap_alias(&mut self, pages: &Pages, cell: u32) -> BackendResult<()> {
        let addr = self.cells.as_ref().map_or(0, |c| c.addr(cell));
        pages.backend().unmap(addr, self.granularity())?;
        self.aliases.forget(cell);
        Ok(())
    }

    /// Records `page`, `n` pages long, as mapped from `cell` on.
    fn install(&mut self, ledger: &mut Ledger, cell: u32, n: u32, page: PageHandle) {
        let cells = self.cells.as_mut().expect("mapped pools have cells");
        let runs = cells.runs();
        cells.install(cell, n, page);
        let bytes = u64::from(n) * cells.granularity();
        let joined = cells.runs() as i64 - runs as i64;
        ledger.mapped(self.small, cells.addr(cell), bytes, joined);
    }

    /// Records the unused extent at `head` as unmapped: its handle and
    /// length.
    fn uninstall(&mut self, ledger: &mut Ledger, head: u32) -> Option<(PageHandle, u32)> {
        let cells = self.cells.as_mut()?;
        let runs = cells.runs();
        let (page, n) = cells.uninstall(head)?;
        let bytes = u64::from(n) * cells.granularity();
        let split = cells.runs() as i64 - runs as i64;
        ledger.unmapped(self.small, cells.addr(head), bytes, split);
        Some((page, n))
    }

    /// The cell size (with pages; 1 without).
    pub(crate) fn granularity(&self) -> u64 {
        self.cells.as_ref().map_or(1, Cells::granularity)
    }

    /// Unmaps and releases the unused extents that meet `span` (after a
    /// failed allocation, so it leaves no partial mapping behind).
    pub(crate) fn release_idle_in(
        &mut self,
        pages: &Pages,
        ledger: &mut Ledger,
        span: std::ops::Range<u32>,
    ) -> BackendResult<()> {
        let Some(cells) = &self.cells else {
            return Ok(());
        };
        let idle: Vec<u32> = cells
            .cached_extents()
            .into_iter()
            .filter(|h| {
                cells
                    .extent(*h)
                    .is_some_and(|e| e.start < span.end && span.start < e.end)
            })
            .collect();
        for head in idle {
            let (page, n) = self.unmap_extent(pages, ledger, head)?;
            pages.release_pages(page, n)?;
        }
        Ok(())
    }

    /// Bytes mapped but unused (virtual memory) or in idle segments.
    pub(crate) fn cached_bytes(&self) -> u64 {
        match &self.cells {
            Some(s) => s.cached() * s.granularity(),
            None => self.heap.idle_regions().iter().map(|(_, size)| size).sum(),
        }
    }

    /// Gives cached memory back to the device, coldest first, until at most
    /// `keep` bytes stay cached.
    pub(crate) fn release_cached(
        &mut self,
        pages: &Pages,
        ledger: &mut Ledger,
        keep: u64,
    ) -> BackendResult<()> {
        if self.cells.is_none() {
            for (base, size) in self.heap.idle_regions() {
                let before = self.heap.split_free();
                self.heap.remove_region(base);
                pages
                    .free_segment(self.source.as_deref(), base, size)
                    .inspect_err(|_| self.heap.add_region(base, size))?;
                ledger.segment_freed(self.small, base, size);
                ledger.splits_changed(self.small, before, self.heap.split_free());
            }
            return Ok(());
        }
        self.release_kept();
        let cold = self
            .cells
            .as_ref()
            .map(Cells::cached_extents)
            .unwrap_or_default();
        for head in cold {
            if self.cached_bytes() <= keep {
                break;
            }
            let (page, n) = self.unmap_extent(pages, ledger, head)?;
            pages.release_pages(page, n)?;
        }
        Ok(())
    }

    /// Reserved bytes and segment count, recounted from the pool's state.
    pub(crate) fn recount_reserved(&self) -> (u64, u64) {
        match &self.cells {
            Some(s) => (self.reserved(), s.runs()),
            None => (self.reserved(), self.heap.regions().count() as u64),
        }
    }

    /// Bytes held in mapped pages or device segments.
    pub(crate) fn reserved(&self) -> u64 {
        match &self.cells {
            Some(s) => s.mapped() * s.granularity(),
            None => self.heap.regions().map(|r| r.size).sum(),
        }
    }

    /// What lies under the live block at `addr`: the extents its cells lie
    /// in, or its device segment.
    pub(crate) fn backing(&self, addr: u64, size: u64) -> Backing {
        match &self.cells {
            Some(cells) => {
                let span = cells.span(addr, size);
                let mut extents = Vec::new();
                let mut cell = span.start;
                while let Some(e) = cells.extent(cell).filter(|_| cell < span.end) {
                    let page = cells.page(e.start).expect("an extent's cells are mapped");
                    extents.push((
                        e.start,
                        page,
                        u64::from(e.end - e.start) * cells.granularity(),
                    ));
                    cell = e.end;
                }
                Backing::Pages {
                    base: extents
                        .first()
                        .map_or(addr, |(head, _, _)| cells.addr(*head)),
                    pages: extents
                        .into_iter()
                        .map(|(_, p, bytes)| (p, bytes))
                        .collect(),
                }
            }
            None => Backing::Segment {
                base: self
                    .heap
                    .regions()
                    .find(|r| r.base <= addr && addr < r.base + r.size)
                    .map_or(addr, |r| r.base),
            },
        }
    }

    /// The pool as snapshot segments: one per mapped run or device segment.
    pub(crate) fn snapshot(
        &self,
        device: usize,
        stream: crate::backend::StreamId,
    ) -> Vec<SegmentInfo> {
        let spans: Vec<(u64, u64)> = match &self.cells {
            Some(s) => s.mapped_runs(),
            None => self.heap.regions().map(|r| (r.base, r.size)).collect(),
        };
        let blocks: Vec<_> = self
            .heap
            .regions()
            .flat_map(|r| self.heap.blocks_of(r))
            .map(|(_, b)| b)
            .collect();
        let mut out = Vec::with_capacity(spans.len());
        for (base, size) in spans {
            let clipped = blocks
                .iter()
                .filter(|b| b.addr < base + size && b.end() > base)
                .map(|b| {
                    let (start, end) = (b.addr.max(base), b.end().min(base + size));
                    let state = match b.state {
                        State::Free | State::Kept => BlockState::Inactive,
                        State::Allocated => BlockState::ActiveAllocated,
                        State::PendingFree => BlockState::ActivePendingFree,
                    };
                    BlockInfo {
                        address: start,
                        size: end - start,
                        requested_size: b.requested,
                        state,
                    }
                });
            out.push(SegmentInfo {
                device,
                address: base,
                total_size: size,
                stream,
                is_small: self.small,
                is_expandable: self.cells.is_some(),
                pool_id: PoolId::DEFAULT,
                blocks: clipped.collect(),
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    const G: u64 = 2 << 20;

    /// A fresh stream's ledger.
    fn ledger() -> Ledger {
        Ledger::new(
            crate::stats::MemoryStats::new(None),
            crate::backend::StreamId(0),
            std::time::Instant::now(),
        )
    }

    #[test]
    fn placement_prefers_mapped_pages() {
        let mut pool = Pool::new(false, false);
        let base = 1 << 40;
        pool.heap.add_region(base, 64 * G);
        let mut cells = Cells::new(base, G);
        let (id, _) = pool.heap.fits(G).next().unwrap();
        // Two blocks of 4 MiB, one 8 MiB: free the second 4 MiB only after mapping it.
        let a = pool.heap.carve(id, base, 4 * G, 1);
        cells.install(0, 1, PageHandle(1));
        cells.install(1, 1, PageHandle(2));
        pool.heap.take_live(base);
        pool.heap.release(a);
        pool.cells = Some(cells);
        let p = pool.place(G).unwrap();
        assert_eq!((p.at, p.unmapped), (base, 0));
        let p = pool.place(3 * G).unwrap();
        assert_eq!(p.unmapped, 1, "one page short of the two mapped ones");
    }

    #[test]
    fn a_large_page_multiple_block_does_not_straddle_a_page_needlessly() {
        let base = 1 << 40;
        // A live block of `below` bytes from the range's start, its pages
        // mapped; then where a block of `size` bytes goes.
        let place = |below: u64, size: u64| {
            let mut pool = Pool::new(false, false);
            pool.heap.add_region(base, 64 * G);
            let (id, _) = pool.heap.fits(below).next().unwrap();
            pool.heap.carve(id, base, below, below);
            let mut cells = Cells::new(base, G);
            cells.install(0, below.div_ceil(G) as u32, PageHandle(1));
            pool.cells = Some(cells);
            let p = pool.place(size).unwrap();
            (p.at - base, p.unmapped)
        };
        // seed004's: 72% of a page in, it would share a page.
        assert_eq!(place(12_000_768, 32 << 20), (6 * G, 16));
        // Less than two thirds of a page in, or not a whole number of pages,
        // or small: the lowest start.
        assert_eq!(place(11_000_320, 32 << 20), (11_000_320, 16));
        assert_eq!(place(11_744_256, 32 << 20), (11_744_256, 16));
        assert_eq!(place(12_000_768, (32 << 20) + 512), (12_000_768, 16));
        assert_eq!(place(12_000_768, 4 << 20), (12_000_768, 2));
    }

    #[test]
    fn a_moved_page_leaves_an_alias_and_comes_back_without_a_call() {
        use crate::backend::counting::Counting;
        let sim = Arc::new(crate::backend::sim::SimBackend::with_options(1 << 30, true));
        let counted = Arc::new(Counting::new(sim.clone()));
        let pages = Pages::new(counted.clone());
        let mut ledger = ledger();
        let mut pool = Pool::new(false, false);
        pool.ensure_range(&pages, 64 * G, G).unwrap();
        for cell in [0, 1] {
            let page = pages.create_pages(1).unwrap();
            pool.map_extent(&pages, &mut ledger, cell, 1, page).unwrap();
        }
        let calls = |kind| counted.counts().count(kind);
        let check = |pool: &Pool| pool.aliases.check(pool.cells.as_ref().unwrap());
        // Cell 0's page moves to cell 5: one map, no unmap.
        let page = pool.detach(&mut ledger, 0).unwrap();
        pool.map_extent(&pages, &mut ledger, 5, 1, page).unwrap();
        pool.moved(page, 0, 5);
        assert_eq!((calls(CallKind::Map), calls(CallKind::Unmap)), (3, 0));
        assert_eq!(pool.aliases.at(0), Some(page));
        check(&pool).unwrap();
        // Back to cell 0 while cached at cell 5: no call; 5 is the alias now.
        assert!(pool.adoptable(0, &(5..6)).is_none(), "its owner is kept");
        assert!(pool.adopt(&mut ledger, 0, &(0..1)));
        assert_eq!((calls(CallKind::Map), calls(CallKind::Unmap)), (3, 0));
        assert_eq!(pool.cells.as_ref().unwrap().page(0), Some(page));
        assert_eq!(pool.aliases.at(5), Some(page));
        assert_eq!(pool.aliases.at(0), None);
        check(&pool).unwrap();
        assert_eq!(ledger.stats().reserved_bytes.all.current, 2 * G as i64);
        // Another page over the alias unmaps it first.
        let other = pages.create_pages(1).unwrap();
        pool.map_extent(&pages, &mut ledger, 5, 1, other).unwrap();
        assert_eq!(calls(CallKind::Unmap), 1);
        assert_eq!(pool.aliases.at(5), None);
        check(&pool).unwrap();
        // Giving everything back unmaps the aliases too: nothing is left.
        let page = pool.detach(&mut ledger, 1).unwrap();
        pool.map_extent(&pages, &mut ledger, 9, 1, page).unwrap();
        pool.moved(page, 1, 9);
        pool.release_cached(&pages, &mut ledger, 0).unwrap();
        pool.release_range_if_empty(&pages).unwrap();
        assert_eq!(sim.live_objects(), 0);
        assert_eq!(ledger.stats().reserved_bytes.all.current, 0);
    }

    #[test]
    fn segments_grow_and_go_back() {
        let sim = Arc::new(crate::backend::sim::SimBackend::with_options(
            1 << 30,
            false,
        ));
        let pages = Pages::new(sim.clone());
        let mut ledger = ledger();
        let mut pool = Pool::new(false, false);
        assert!(pool.place(5 << 20).is_none());
        pool.grow(&pages, &mut ledger, 5 << 20).unwrap();
        assert_eq!(pool.recount_reserved(), (6 << 20, 1));
        assert_eq!(pool.cached_bytes(), 6 << 20);
        pool.release_cached(&pages, &mut ledger, 0).unwrap();
        assert_eq!((pool.recount_reserved(), sim.live_objects()), ((0, 0), 0));
        assert_eq!(ledger.stats().reserved_bytes.all.current, 0);
    }
}
