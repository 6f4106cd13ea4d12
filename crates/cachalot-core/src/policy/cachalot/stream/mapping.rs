//! A stream's page-mapping engine: physical memory mapped under the cells a
//! placement needs, each from the first source that has a page
//! ([`StreamState::page_for`]), and cached extents unmapped when the stream
//! re-maps them or gives them back.
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

use std::ops::Range;

use crate::backend::{BackendResult, PageHandle};
use crate::policy::cachalot::pool::{Placement, Pool};
use crate::policy::cachalot::vm::pages::Pages;

use super::StreamState;

/// At a new peak of pages in use, the share of that peak by which the
/// stream's mapped pages may exceed it before the other pool's idle pages go
/// back, and the least share of it they must come to (fewer are kept: giving
/// back a page or two would only re-map it later).
const PEAK_TRIM: f64 = 0.02;

/// While the device is more than half full, blocks of fewer bytes than this
/// take pages one by one (Note [Extents]): a handle maps and goes back only
/// whole, and the next small blocks, laid over part of a freed one's, kept
/// all its pages. With handles of up to 10 pages for every block there, the
/// serving recording llama_serve needed a device of 742 MiB, as expandable
/// segments, instead of 714; from 32 MiB, 728, and the random recording of
/// a million events on 24 GiB made 0.98 million driver calls instead of
/// 1.07, new handles then also cut to the budget's room (from 128 MiB: 714,
/// but 1.14 million, and of five million events on 23 GiB 10.3 million
/// against expandable segments' 8.4).
const PRESSED_BLOCK_MIN: u64 = 32 << 20;

/// What a cell is mapped with ([`StreamState::page_for`]).
#[derive(Copy, Clone, Debug)]
enum Source {
    /// Its own page, moved back: the cell is mapped.
    Adopted,
    /// A handle of `n` pages to map from the cell on; `from`: the cell of
    /// the pool it was detached from, which still maps it (see
    /// [`Pool::detach`]).
    Handle {
        handle: PageHandle,
        n: u32,
        from: Option<u32>,
    },
}

impl Source {
    /// A handle of one page, ours and mapped nowhere.
    fn new(handle: PageHandle) -> Source {
        Source::Handle {
            handle,
            n: 1,
            from: None,
        }
    }

    /// A page detached from cell `from`, which still maps it.
    fn moved(handle: PageHandle, from: u32) -> Source {
        Source::Handle {
            handle,
            n: 1,
            from: Some(from),
        }
    }
}

impl StreamState {
    /// Maps the pages missing under `place` (`size` bytes of pool `p`), once
    /// the other pool's idle pages went back if the stream `peaked`.
    pub(super) fn map_placement(
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

    /// Maps physical memory under every unmapped cell of the block at `at`
    /// of `size` bytes (whose users are taken). The cells the block holds
    /// alone get one new handle per aligned group of `cachalot_extent` cells
    /// (of at most 10 while the device is more than half full,
    /// [`Pages::extent_cap`], for blocks of [`PRESSED_BLOCK_MIN`] bytes or
    /// more; a churning stream's only then) while the stream may grow by
    /// that much (see the module docs); other cells get a page each, a
    /// cached one re-mapped once the stream holds its budget. Under
    /// pressure, every out-of-memory retry gives every stream's cached pages
    /// back and the streams take them again: 20 MiB at a time, a random
    /// recording of a million events on a 24 GiB device makes 0.95 million
    /// driver calls instead of 5.1 million (expandable segments: 0.97). A
    /// stream growing for the first time (at a new peak, never
    /// re-mapped), or again after `empty_cache` with blocks live
    /// ([`crate::policy::cachalot::budget::Budget::regrow`]), maps the part
    /// of the block past its last mapped cell, its
    /// shared end cell included, in handles of up to `cachalot_extent` cells
    /// from there, within its budget: the next block, laid out after it,
    /// finds that end cell mapped (the first pass of vit_train_bf16 makes 548
    /// driver calls instead of 1,102). While it regrows below its old peak,
    /// the handle also covers cells past the block that it used before, up
    /// to that peak ([`crate::policy::cachalot::budget::Budget::ahead`]):
    /// the blocks that come next find them mapped (seed004, which frees its
    /// memory in every pass, maps its 4 MiB blocks 32 pages at a time: 40
    /// driver calls a pass instead of 400, expandable segments' 76).
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
        let cap = pages.extent_cap(self.config.extent_pages);
        let group_len = match cap < self.config.extent_pages && size < PRESSED_BLOCK_MIN {
            true => 1,
            false => cap,
        };
        let growing = self.budget.grows_anew(peaked) && group_len > 1;
        let mut cell = span.start;
        while cell < span.end {
            let cells = self.pools[p].cells.as_ref().expect("checked above");
            if cells.is_mapped(cell) {
                cell += 1;
                continue;
            }
            // Past the last mapped cell of a growing stream, the rest of the
            // block; else unmapped cells the block holds alone, up to the end
            // of their aligned group (`grouped`); one cell for a shared end
            // cell, or where not grouped. A churning stream's layout keeps
            // changing: its own cells are grouped only while the device is
            // more than half full (asked at each cell: the stream may start
            // churning within the block).
            let grouped = !self.budget.churning() || pages.pressed();
            let end = own.end.min((cell / group_len + 1) * group_len);
            let frontier = growing && cells.none_mapped_from(cell);
            let run = if frontier {
                let known = cells.known().saturating_sub(span.end);
                let ahead = self.budget.ahead(self.mapped()).min(u64::from(known));
                // `ahead` is at most `known`, a u32.
                self.frontier_run(pages, span.end - cell + ahead as u32)
            } else if own.contains(&cell) && grouped {
                let (pool, adopting) = (&self.pools[p], self.adopts(pages));
                let stop = |c: &u32| {
                    cells.is_mapped(*c) || adopting && pool.adoptable(*c, &span).is_some()
                };
                (cell..end).find(stop).unwrap_or(end) - cell
            } else {
                1
            };
            cell += match self.page_for(pages, p, cell, run, &span)? {
                Source::Adopted => 1,
                Source::Handle { handle, n, from } => {
                    self.map_new(pages, p, cell, n, (handle, from))?;
                    n
                }
            };
        }
        Ok(())
    }

    /// What cell `cell` of pool `p` is mapped with (`run`: the cells from
    /// it that may share one new handle; those of `keep` stay mapped): the
    /// first of these sources that has one.
    ///
    /// 1. Its own page, where it moved to and is cached (the cell still
    ///    maps it, as an alias): moved back, no call (not in a churning
    ///    stream, see [`StreamState::adopt`]).
    /// 2. A new handle of up to `run` pages (more than one: as many as the
    ///    device has free) while the stream may grow by `run` within its
    ///    budget, once its coldest cached extent of several pages went back
    ///    if need be ([`StreamState::new_extent`]).
    /// 3. Once the stream holds its budget, a cached page of its own
    ///    ([`StreamState::steal`]: a one-page extent of pool `p` moved, no
    ///    unmap; else its coldest extent unmapped; else the other pool's).
    /// 4. A new page.
    /// 5. Where the device has none left, a cached page of its own, as in 3.
    ///
    /// Past these, the allocation fails here; the device gives the other
    /// streams' cached memory back and tries it once more
    /// (`CachalotAllocator::malloc`).
    fn page_for(
        &mut self,
        pages: &Pages,
        p: usize,
        cell: u32,
        run: u32,
        keep: &Range<u32>,
    ) -> BackendResult<Source> {
        if self.adopt(pages, p, cell, keep) {
            return Ok(Source::Adopted);
        }
        if let Some((handle, n)) = self.new_extent(pages, p, run, keep)? {
            return Ok(Source::Handle {
                handle,
                n,
                from: None,
            });
        }
        self.note_remaps();
        let may_steal = self.may_steal(pages);
        if may_steal && self.room(pages) == 0 {
            if let Some(page) = self.steal(pages, p, keep)? {
                self.budget.count_remaps(1);
                return Ok(page);
            }
        }
        match pages.create_pages(1) {
            Ok(handle) => Ok(Source::new(handle)),
            Err(e) if e.is_out_of_memory() && may_steal => self.steal(pages, p, keep)?.ok_or(e),
            Err(e) => Err(e),
        }
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
        let run = left.min(pages.extent_cap(self.config.extent_pages));
        match self.may_steal(pages) {
            true => run
                .min(u32::try_from(self.room(pages)).unwrap_or(u32::MAX))
                .max(1),
            false => run,
        }
    }

    /// One new handle of up to `n` (more than one) pages for cells of pool
    /// `p` (those of `keep` stay mapped), with its length: when the stream
    /// may grow by `n` pages within its budget, if need be once a cached
    /// extent went back, as many of them as the device has free. `None`
    /// otherwise, or where that is less than two pages (they are then
    /// obtained one by one). Near the device's limit, every out-of-memory
    /// retry gives the cached pages back and they come again: a handle of
    /// what is left, rather than pages one by one, takes a random recording
    /// of five million events on 23 GiB from 11.2 million driver calls to
    /// 8.2 million (expandable segments: 8.4). Cut to the budget's room as
    /// well, bert_dynamic's first pass under the tight budget made 4,136
    /// driver calls instead of 2,445.
    fn new_extent(
        &mut self,
        pages: &Pages,
        p: usize,
        n: u32,
        keep: &Range<u32>,
    ) -> BackendResult<Option<(PageHandle, u32)>> {
        if n < 2
            || pages.extent_cap(n) < n
            || (self.may_steal(pages) && !self.make_room(pages, p, u64::from(n), keep)?)
        {
            return Ok(None);
        }
        let n = n.min(u32::try_from(pages.free_pages()).unwrap_or(u32::MAX));
        if n < 2 {
            return Ok(None);
        }
        match pages.create_pages(n) {
            Ok(handle) => Ok(Some((handle, n))),
            Err(e) if e.is_out_of_memory() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Pages the stream may still map within its budget (the tight one
    /// while the device is more than half full).
    fn room(&self, pages: &Pages) -> u64 {
        let g = self.pools.iter().map(Pool::granularity).max().unwrap_or(1);
        let budget = self.budget.pages(g, pages.pressed());
        budget.saturating_sub(self.mapped())
    }

    /// Whether this stream re-maps its cached pages to keep within its
    /// budget: not a private pool's lane (a graph replays at the addresses
    /// it captured), nor while a route to a private pool is open (re-mapping
    /// waits for the stream).
    fn may_steal(&self, pages: &Pages) -> bool {
        !self.private() && !pages.quiet()
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
        if n <= self.room(pages) {
            return Ok(true);
        }
        let Some((handle, k)) = self.unmap_coldest(pages, p, keep, 2)? else {
            return Ok(false);
        };
        pages.release_pages(handle, k)?;
        let room = n <= self.room(pages);
        if room {
            // As many pages re-mapped as page by page (see [`StreamState::page_for`]).
            self.budget.count_remaps(u64::from(k).min(n));
        }
        Ok(room)
    }

    /// Starts churning once the stream re-mapped enough pages: its budget
    /// rises (see [`crate::policy::cachalot::budget`]), until
    /// [`StreamState::start_afresh`].
    fn note_remaps(&mut self) {
        self.budget.starts_churning(self.mapped());
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
    ) -> BackendResult<Option<Source>> {
        let head = self.pools[p]
            .cells
            .as_mut()
            .and_then(|c| c.coldest(keep, 1));
        if let Some(head) = head {
            if let Some(handle) = self.pools[p].detach(&mut self.ledger, head) {
                return Ok(Some(Source::moved(handle, head)));
            }
        }
        let found = match head {
            Some(head) => Some(self.unmap_head(pages, p, head)?),
            None => self.unmap_coldest_in(pages, 1 - p, &(0..0), 1)?,
        };
        match found {
            Some((handle, 1)) => Ok(Some(Source::new(handle))),
            Some((handle, n)) => {
                pages.release_pages(handle, n)?;
                pages.create_pages(1).map(|h| Some(Source::new(h)))
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
}
