//! One stream's state: its small and large pools, statistics, blocks waiting
//! for other streams, and how its pages are mapped: created, or re-mapped
//! from its cache once it holds its page budget (`budget`, which also says
//! whether the stream churns).
//!
//! An allocation that takes the stream to a new peak of pages in use sets,
//! where the stream's memory is concerned, its peak reserved: the pages it
//! maps then are mapped at the worst moment. If they would take the stream
//! past [`PEAK_TRIM`] over that peak, and the *other* pool holds idle pages
//! of at least that share of the peak, those go back to the device first,
//! coldest first, until the stream fits or none is left: they cannot serve
//! this pool without a re-map anyway. gpt2_generate's small pool holds 27
//! idle MiB from an earlier prompt when its longest prompt's prefill peaks;
//! giving them back there takes its peak reserved from 1.092 to 1.043 times
//! its peak requested, for 24 more driver calls in its first pass. No
//! training trace's small pool idles that much at a peak.
//!
//! A churning stream (`budget`) also keeps its last [`RECENT`] freed large
//! blocks unmerged for the next request of exactly their size (its layout
//! never repeats, but within a step sizes do: 80% of bert_dynamic's large
//! requests are such hits, each skipping a best-fit search, a split and a
//! merge). Their pages do not count as in use (the budget is unchanged) and
//! they go back into the heap before any page is mapped.
//! `cachalot_churn_slack` 0 turns both this and the raised budget off.
//!
//! Everything here runs under the stream's own lock; the only shared thing it
//! touches is [`Pages`], and only when a page or segment must come from (or go
//! back to) the device.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use crate::backend::{BackendError, BackendResult, CallKind, EventId, PageHandle, StreamId};
use crate::snapshot::SegmentInfo;

use super::budget::{Budget, WASTE_SLACK};
#[cfg(doc)]
use super::pool::RECENT;
use super::pool::{Placement, Pool, SMALL_MAX};
use super::settings::StreamConfig;
use super::stats::ledger::Ledger;
use super::vm::pages::Pages;
use super::vm::ranges::RangeTable;

mod frees;
use frees::Pending;

/// At a new peak of pages in use, the share of that peak by which the
/// stream's mapped pages may exceed it before the other pool's idle pages go
/// back, and the least share of it they must come to (fewer are kept: giving
/// back a page or two would only re-map it later).
const PEAK_TRIM: f64 = 0.02;

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
    /// A lane of a private pool: its pages are never re-mapped (a graph
    /// replays at the addresses it captured, freed blocks included).
    private: bool,
}

fn pool_of(size: u64) -> usize {
    usize::from(size > SMALL_MAX)
}

impl StreamState {
    /// An empty stream.
    pub(crate) fn new(
        stream: StreamId,
        ledger: Ledger,
        config: StreamConfig,
        ranges: Arc<RangeTable>,
        private: bool,
    ) -> StreamState {
        StreamState {
            stream,
            pools: [
                Pool::new(true, config.range_size > 0 && config.threshold.is_none()),
                Pool::new(false, false),
            ],
            ledger,
            recorded: HashMap::new(),
            pending: Vec::new(),
            unrecorded: 0,
            spare_events: Vec::new(),
            budget: Budget::new(&config),
            unsynced: false,
            config,
            ranges,
            private,
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

    /// Allocates a block of `size` (rounded) bytes for `requested`. The
    /// error is boxed so that the result fits in two registers: returned
    /// through memory, the caller read it back with loads wider than the
    /// stores that wrote it, a stall on every allocation (the warm replays
    /// of the bundled traces on the simulated device take 5% to 10% less
    /// time per operation this way).
    pub(crate) fn malloc(
        &mut self,
        pages: &Pages,
        size: u64,
        requested: u64,
    ) -> Result<u64, Box<BackendError>> {
        let result = self.malloc_inner(pages, size, requested);
        self.ledger.flush();
        result.map_err(Box::new)
    }

    fn malloc_inner(&mut self, pages: &Pages, size: u64, requested: u64) -> BackendResult<u64> {
        if !pages.quiet() {
            self.process_events(pages)?;
        }
        let p = pool_of(size);
        if pages.granularity() > 0 {
            self.malloc_mapped(pages, p, size, requested)
        } else {
            self.malloc_segmented(pages, p, size, requested)
        }
    }

    fn malloc_mapped(
        &mut self,
        pages: &Pages,
        p: usize,
        size: u64,
        requested: u64,
    ) -> BackendResult<u64> {
        if self.pools[p].range().is_none() {
            self.reserve_range(pages, p)?;
        }
        self.budget.allocated();
        if let Some(addr) = self.pools[p].reuse(size, requested) {
            self.ledger.allocated(p == 0, addr, size, requested);
            return Ok(addr);
        }
        match self.pools[p].place(size) {
            Some(place) if place.unmapped == 0 => {
                let cells = self.pools[p].cells.as_mut().expect("a range has cells");
                cells.acquire_mapped(cells.span(place.at, size));
                self.note_in_use(size);
                Ok(self.carve(p, place, size, requested))
            }
            first => self.malloc_mapping(pages, p, first, size, requested),
        }
    }

    /// Reserves pool `p`'s range (its first allocation) and publishes it.
    #[cold]
    #[inline(never)]
    fn reserve_range(&mut self, pages: &Pages, p: usize) -> BackendResult<()> {
        self.pools[p].ensure_range(pages, self.config.range_size)?;
        self.ranges.publish(p, self.pools[p].range());
        Ok(())
    }

    /// [`StreamState::malloc_mapped`] when the placement found (`first`)
    /// needs pages: kept blocks give their pages back, then the placement's
    /// missing pages are mapped (out of the hot path's way).
    #[cold]
    #[inline(never)]
    fn malloc_mapping(
        &mut self,
        pages: &Pages,
        p: usize,
        first: Option<Placement>,
        size: u64,
        requested: u64,
    ) -> BackendResult<u64> {
        let none = || BackendError::OutOfMemory {
            call: CallKind::ReserveRange,
            requested: size,
        };
        let mut place = first.ok_or_else(none)?;
        if place.unmapped > 0 && self.pools[p].release_kept_for(size) {
            // One kept block large enough gives its mapped pages back.
            place = self.pools[p].place(size).ok_or_else(none)?;
        }
        if place.unmapped > 0 && self.pools.iter().any(|p| p.kept_count() > 0) {
            // Kept blocks give their pages back before any is mapped.
            self.pools.iter_mut().for_each(Pool::release_kept);
            place = self.pools[p].place(size).ok_or_else(none)?;
        }
        let cells = self.pools[p].cells.as_mut().expect("a range has cells");
        let span = cells.span(place.at, size);
        if place.unmapped == 0 {
            cells.acquire_mapped(span.clone());
        } else {
            cells.acquire(span.clone());
        }
        let peaked = self.note_in_use(size);
        if place.unmapped > 0 {
            if let Err(e) = self.map_missing(pages, p, &place, size, peaked) {
                self.pools[p]
                    .cells
                    .as_mut()
                    .expect("checked above")
                    .release(span.clone());
                // Give back what this attempt mapped; the map's error is the news.
                if self.quiesce(pages).is_ok() {
                    let _ = self.pools[p].release_idle_in(pages, &mut self.ledger, span);
                }
                return Err(e);
            }
        }
        Ok(self.carve(p, place, size, requested))
    }

    /// Allocates exactly `[at, at + size)` for `requested` out of free mapped
    /// memory (restoring a private pool's checkpoint). Nothing changes on
    /// failure: the range is not free, or not all mapped.
    pub(crate) fn allocate_at(&mut self, at: u64, size: u64, requested: u64) -> Result<(), String> {
        self.pools.iter_mut().for_each(Pool::release_kept);
        let found = (0..2).find_map(|p| {
            let mut fits = self.pools[p].heap.fits(size);
            let hit = fits.find(|(_, b)| b.addr <= at && at + size <= b.end());
            hit.map(|(id, _)| (p, id))
        });
        let Some((p, id)) = found else {
            return Err(format!("{size} bytes at {at:#x} are not free in the pool"));
        };
        let pool = &mut self.pools[p];
        if let Some(cells) = pool.cells.as_mut() {
            if !cells.all_mapped(at, size) {
                return Err(format!("{size} bytes at {at:#x} are not all mapped"));
            }
            cells.acquire_mapped(cells.span(at, size));
        }
        let before = pool.heap.split_free();
        pool.heap.carve(id, at, size, requested);
        if pool.cells.is_none() {
            self.ledger
                .splits_changed(p == 0, before, self.pools[p].heap.split_free());
        }
        self.note_in_use(size);
        self.ledger.allocated(p == 0, at, size, requested);
        self.ledger.flush();
        Ok(())
    }

    /// Hands out `size` bytes of pool `p` at `place` for `requested`.
    fn carve(&mut self, p: usize, place: Placement, size: u64, requested: u64) -> u64 {
        self.pools[p]
            .heap
            .carve(place.id, place.at, size, requested);
        self.ledger.allocated(p == 0, place.at, size, requested);
        place.at
    }

    /// Records a new peak of pages in use, if this is one once a block of
    /// `size` bytes is placed (and restarts the churn counts); returns
    /// whether it was.
    fn note_in_use(&mut self, size: u64) -> bool {
        let in_use = self.in_use();
        let ledger = &self.ledger;
        self.budget
            .note_in_use(in_use, || ledger.allocated_bytes() + size)
    }

    /// Maps the pages missing under `place` (`size` bytes of pool `p`), once
    /// the other pool's idle pages went back if the stream `peaked`.
    fn map_missing(
        &mut self,
        pages: &Pages,
        p: usize,
        place: &Placement,
        size: u64,
        peaked: bool,
    ) -> BackendResult<()> {
        if peaked && self.may_steal(pages) {
            self.trim_other_pool(pages, p, place.unmapped)?;
        }
        self.map_span(pages, p, place.at, size, peaked)
    }

    /// At a new peak of pages in use, before `n` pages of pool `p` are
    /// mapped: gives the other pool's idle pages back, coldest first, while
    /// the stream would pass [`PEAK_TRIM`] over its peak, if they come to at
    /// least that share of it (see the module docs).
    fn trim_other_pool(&mut self, pages: &Pages, p: usize, n: u64) -> BackendResult<()> {
        let q = 1 - p;
        let peak = self.budget.peak_in_use();
        let share = (PEAK_TRIM * peak as f64).ceil() as u64;
        let idle = self.pools[q].cells.as_ref().map_or(0, |c| c.cached());
        if idle < share.max(1) {
            return Ok(());
        }
        while self.mapped() + n > peak + share {
            let Some((handle, k)) = self.unmap_coldest_in(pages, q, &(0..0), 1)? else {
                break;
            };
            pages.release_pages(handle, k)?;
        }
        Ok(())
    }

    fn malloc_segmented(
        &mut self,
        pages: &Pages,
        p: usize,
        size: u64,
        requested: u64,
    ) -> BackendResult<u64> {
        let place = match self.pools[p].place(size) {
            Some(place) => place,
            None => {
                // A private pool's idle segments stay: a graph may replay there.
                let may_release = !self.private && !pages.quiet();
                if may_release && self.over_budget(size) {
                    self.release_cached(pages, 0)?;
                }
                if let Err(e) = self.pools[p].grow(pages, &mut self.ledger, size) {
                    if !e.is_out_of_memory() || !may_release {
                        return Err(e);
                    }
                    self.release_cached(pages, 0)?;
                    self.pools[p].grow(pages, &mut self.ledger, size)?;
                }
                let none = BackendError::OutOfMemory {
                    call: CallKind::SegmentAlloc,
                    requested: size,
                };
                self.pools[p].place(size).ok_or(none)?
            }
        };
        let pool = &mut self.pools[p];
        let before = pool.heap.split_free();
        pool.heap.carve(place.id, place.at, size, requested);
        self.ledger
            .splits_changed(p == 0, before, pool.heap.split_free());
        self.ledger.allocated(p == 0, place.at, size, requested);
        Ok(place.at)
    }

    /// Without virtual memory: whether growing by `size` bytes would take the
    /// reserved bytes past the budget over the peak of active bytes, so idle
    /// segments (which cannot fit the request) should go back first.
    fn over_budget(&self, size: u64) -> bool {
        let s = self.ledger.stats();
        let active = (s.active_bytes.all.current as u64 + size).max(s.active_bytes.all.peak as u64);
        (s.reserved_bytes.all.current as u64 + size) as f64 > (1.0 + WASTE_SLACK) * active as f64
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

    /// Maps physical memory under every unmapped cell of the block at `at`
    /// of `size` bytes (whose users are taken). The cells the block holds
    /// alone get one new handle per aligned group of `cachalot_extent` cells
    /// while the stream may grow by that much (see the module docs); other
    /// cells get a page each, a cached one re-mapped once the stream holds
    /// its budget. A stream growing for the first time (at a new peak, never
    /// re-mapped) maps the part of the block past its last mapped cell, its
    /// shared end cell included, in handles of up to `cachalot_extent` cells
    /// from there, within its budget: the next block, laid out after it,
    /// finds that end cell mapped (the first pass of vit_train_bf16 makes 548
    /// driver calls instead of 1,102).
    fn map_span(
        &mut self,
        pages: &Pages,
        p: usize,
        at: u64,
        size: u64,
        peaked: bool,
    ) -> BackendResult<()> {
        let cells = self.pools[p]
            .cells
            .as_ref()
            .expect("mapped pools have cells");
        let (span, g) = (cells.span(at, size), cells.granularity());
        // An end cell the block may share with a neighbour (its end is not
        // page-aligned) would keep the block's handle mapped after it goes.
        let own = span.start + u32::from(!at.is_multiple_of(g))
            ..span.end - u32::from(!(at + size).is_multiple_of(g));
        let group_len = self.config.extent_pages;
        let growing = peaked && !self.budget.remapped() && !self.budget.churning() && group_len > 1;
        let mut cell = span.start;
        while cell < span.end {
            let cells = self.pools[p].cells.as_ref().expect("checked above");
            if cells.is_mapped(cell) {
                cell += 1;
                continue;
            }
            // Past the last mapped cell of a growing stream, the rest of the
            // block; else unmapped cells the block holds alone, up to the end
            // of their aligned group; one cell for a shared end cell, or in a
            // churning stream (whose layout keeps changing).
            let end = own.end.min((cell / group_len + 1) * group_len);
            let frontier = growing && cells.none_mapped_from(cell);
            let run = if frontier {
                self.frontier_run(pages, span.end - cell)
            } else if own.contains(&cell) && !self.budget.churning() {
                let (pool, adopting) = (&self.pools[p], self.adopts(pages));
                let stop = |c: &u32| {
                    cells.is_mapped(*c) || adopting && pool.adoptable(*c, &span).is_some()
                };
                (cell..end).find(stop).unwrap_or(end) - cell
            } else {
                1
            };
            if self.adopt(pages, p, cell, &span) {
                cell += 1;
                continue;
            }
            if let Some(handle) = self.new_extent(pages, p, run, &span)? {
                self.map_new(pages, p, cell, run, (handle, None))?;
                cell += run;
                continue;
            }
            let page = self.obtain_page(pages, p, &span)?;
            self.map_new(pages, p, cell, 1, page)?;
            cell += 1;
        }
        Ok(())
    }

    /// Maps `handle`, ours and `n` pages long, from `cell` on (after a wait
    /// for the stream when aliases there must be unmapped). `from`: the cell
    /// of pool `p` it was detached from, which still maps it (see
    /// [`Pool::detach`]); if mapping fails, the handle goes back there, or
    /// to the device when it came from none.
    fn map_new(
        &mut self,
        pages: &Pages,
        p: usize,
        cell: u32,
        n: u32,
        (handle, from): (PageHandle, Option<u32>),
    ) -> BackendResult<()> {
        let waited = match self.pools[p].has_aliases_in(cell..cell + n) {
            true => self.quiesce(pages),
            false => Ok(()),
        };
        let mapped = waited.and_then(|()| {
            let pool = &mut self.pools[p];
            pool.map_extent(pages, &mut self.ledger, cell, n, handle)
        });
        match (&mapped, from) {
            (Ok(()), Some(from)) => self.pools[p].moved(handle, from, cell),
            (Ok(()), None) => {}
            // The page is still mapped where it was: it goes back there.
            (Err(_), Some(from)) => self.pools[p].reattach(&mut self.ledger, handle, from),
            // A failed release leaves nothing better to do than report the
            // map's error.
            (Err(_), None) => {
                let _ = pages.release_pages(handle, n);
            }
        }
        mapped
    }

    /// Maps `cell` of pool `p` by moving back the page it still maps, when
    /// that page is cached at its owner outside `keep`: no call (see
    /// [`Pool::adopt`]). Whether it did. Not in a churning stream: its raised
    /// budget is there for its layout to settle on mapped pages, and pages
    /// moving about kept bert_dynamic's from settling (18 to 447 driver calls
    /// a pass from the third to the ninth, instead of none from the seventh).
    fn adopt(&mut self, pages: &Pages, p: usize, cell: u32, keep: &Range<u32>) -> bool {
        if !self.adopts(pages) {
            return false;
        }
        self.note_remaps();
        let adopted = self.pools[p].adopt(&mut self.ledger, cell, keep);
        self.budget.count_remaps(u64::from(adopted));
        adopted
    }

    /// Whether the stream moves pages back to their aliases (see
    /// [`StreamState::adopt`]).
    fn adopts(&self, pages: &Pages) -> bool {
        !self.budget.churning() && self.may_steal(pages)
    }

    /// The cells of a handle for the `left` cells of a block past the
    /// stream's last mapped cell: at most `cachalot_extent` of them, and
    /// while the stream re-maps cached pages, no more than its budget leaves
    /// room for (at least one: the page is then obtained as any other).
    fn frontier_run(&self, pages: &Pages, left: u32) -> u32 {
        let run = left.min(self.config.extent_pages);
        match self.may_steal(pages) {
            true => run
                .min(u32::try_from(self.room()).unwrap_or(u32::MAX))
                .max(1),
            false => run,
        }
    }

    /// One new handle of `n` (more than one) pages for cells of pool `p`
    /// (those of `keep` stay mapped), when the stream may grow by that many
    /// within its budget, if need be once a cached extent went back, and the
    /// device has them; `None` otherwise (the pages are then obtained one by
    /// one).
    fn new_extent(
        &mut self,
        pages: &Pages,
        p: usize,
        n: u32,
        keep: &Range<u32>,
    ) -> BackendResult<Option<PageHandle>> {
        if n < 2 || (self.may_steal(pages) && !self.make_room(pages, p, u64::from(n), keep)?) {
            return Ok(None);
        }
        match pages.create_pages(n) {
            Ok(handle) => Ok(Some(handle)),
            Err(e) if e.is_out_of_memory() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Pages the stream may still map within its budget.
    fn room(&self) -> u64 {
        let g = self.pools.iter().map(Pool::granularity).max().unwrap_or(1);
        self.budget.pages(g).saturating_sub(self.mapped())
    }

    /// Whether this stream re-maps its cached pages to keep within its
    /// budget: not a private pool's lane (a graph replays at the addresses
    /// it captured), nor while a route to a private pool is open (re-mapping
    /// waits for the stream).
    fn may_steal(&self, pages: &Pages) -> bool {
        !self.private && !pages.quiet()
    }

    /// Whether the stream may grow by `n` pages within its budget, once the
    /// coldest cached extent of several pages (outside `keep`) went back to
    /// the device if it could not before. A handle maps only whole, so such
    /// an extent would go back anyway to re-map one of its pages: giving it
    /// back for a new handle of `n` pages instead spares a call per page.
    /// One extent at most, so the pages of a cached layout are not given
    /// back for a handle that would still not fit (see the module docs).
    fn make_room(
        &mut self,
        pages: &Pages,
        p: usize,
        n: u64,
        keep: &Range<u32>,
    ) -> BackendResult<bool> {
        if n <= self.room() {
            return Ok(true);
        }
        let Some((handle, k)) = self.unmap_coldest(pages, p, keep, 2)? else {
            return Ok(false);
        };
        pages.release_pages(handle, k)?;
        let room = n <= self.room();
        if room {
            // As many pages re-mapped as page by page (see `obtain_page`).
            self.budget.count_remaps(u64::from(k).min(n));
        }
        Ok(room)
    }

    /// A page to map: a cached one re-mapped when this stream already holds its
    /// budget (or the device is full), else a new one; with the cell of pool
    /// `p` it was detached from, if it was.
    fn obtain_page(
        &mut self,
        pages: &Pages,
        p: usize,
        keep: &Range<u32>,
    ) -> BackendResult<(PageHandle, Option<u32>)> {
        self.note_remaps();
        let may_steal = self.may_steal(pages);
        if may_steal && self.room() == 0 {
            if let Some(page) = self.steal(pages, p, keep)? {
                self.budget.count_remaps(1);
                return Ok(page);
            }
        }
        match pages.create_pages(1) {
            Ok(page) => Ok((page, None)),
            Err(e) if e.is_out_of_memory() && may_steal => self.steal(pages, p, keep)?.ok_or(e),
            Err(e) => Err(e),
        }
    }

    /// Starts churning once the stream re-mapped enough pages (`budget`):
    /// the budget rises, and recently freed large blocks are kept for
    /// exact-size reuse (see the module docs), until
    /// [`StreamState::start_afresh`].
    fn note_remaps(&mut self) {
        if self.budget.starts_churning(self.mapped())
            && self.config.threshold.is_none()
            && self.config.churn_slack > 0.0
        {
            self.pools[1].start_keeping();
        }
    }

    /// Forgets the page history (peak, churn) once the large pool gave its
    /// range back: what comes next is laid out anew, and is judged anew. A
    /// stream that stayed churning kept its large blocks from the first
    /// allocation on, a layout that never settled (bert_dynamic after
    /// `empty_cache`: 16 to 404 driver calls a pass instead of none).
    fn start_afresh(&mut self) {
        let bytes = self.ledger.allocated_bytes();
        self.budget.start_afresh(self.in_use(), bytes);
        self.pools[1].stop_keeping();
    }

    /// The coldest cached extent of this stream outside `keep`, for a page:
    /// a one-page handle of pool `p` detached from its cell (which keeps
    /// mapping it: no call), one of the other pool's unmapped, or (a handle
    /// maps only whole) a new page once a larger extent went back to the
    /// device; with the cell the page was detached from.
    fn steal(
        &mut self,
        pages: &Pages,
        p: usize,
        keep: &Range<u32>,
    ) -> BackendResult<Option<(PageHandle, Option<u32>)>> {
        let head = self.pools[p]
            .cells
            .as_mut()
            .and_then(|c| c.coldest(keep, 1));
        if let Some(head) = head {
            if let Some(page) = self.pools[p].detach(&mut self.ledger, head) {
                return Ok(Some((page, Some(head))));
            }
        }
        let found = match head {
            Some(head) => Some(self.unmap_head(pages, p, head)?),
            None => self.unmap_coldest_in(pages, 1 - p, &(0..0), 1)?,
        };
        match found {
            Some((handle, 1)) => Ok(Some((handle, None))),
            Some((handle, n)) => {
                pages.release_pages(handle, n)?;
                pages.create_pages(1).map(|h| Some((h, None)))
            }
            None => Ok(None),
        }
    }

    /// Unmaps the coldest cached extent of at least `min` pages of this
    /// stream (pool `p`'s outside `keep` first, then the other pool's): its
    /// handle and length in pages.
    fn unmap_coldest(
        &mut self,
        pages: &Pages,
        p: usize,
        keep: &Range<u32>,
        min: u32,
    ) -> BackendResult<Option<(PageHandle, u32)>> {
        match self.unmap_coldest_in(pages, p, keep, min)? {
            Some(found) => Ok(Some(found)),
            None => self.unmap_coldest_in(pages, 1 - p, &(0..0), min),
        }
    }

    /// Unmaps the coldest cached extent of at least `min` pages of pool `q`
    /// outside `keep`: its handle and length in pages.
    fn unmap_coldest_in(
        &mut self,
        pages: &Pages,
        q: usize,
        keep: &Range<u32>,
        min: u32,
    ) -> BackendResult<Option<(PageHandle, u32)>> {
        let head = self.pools[q]
            .cells
            .as_mut()
            .and_then(|s| s.coldest(keep, min));
        match head {
            Some(head) => self.unmap_head(pages, q, head).map(Some),
            None => Ok(None),
        }
    }

    /// Unmaps pool `q`'s cached extent starting at `head`, once the stream's
    /// queued work is done: its handle and length in pages.
    fn unmap_head(
        &mut self,
        pages: &Pages,
        q: usize,
        head: u32,
    ) -> BackendResult<(PageHandle, u32)> {
        self.quiesce(pages)?;
        self.pools[q].unmap_extent(pages, &mut self.ledger, head)
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
        if self.pools[1].range().is_none() {
            self.start_afresh();
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
        self.pools.iter().map(|p| p.recount_reserved().0).sum()
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
        super::validate::validate_totals(&stats)
    }
}
