//! A stream's allocations: a block placed in its pool (small or large),
//! mapped where it must be, or carved from a device segment without virtual
//! memory. The order in which the stream looks for memory is stated once,
//! at [`StreamState::malloc_mapped`].

use crate::backend::{BackendError, BackendResult, CallKind};
use crate::policy::cachalot::budget::WASTE_SLACK;
use crate::policy::cachalot::pool::{Placement, Pool, SMALL_MAX};
use crate::policy::cachalot::vm::pages::Pages;

use super::StreamState;

fn pool_of(size: u64) -> usize {
    usize::from(size > SMALL_MAX)
}

impl StreamState {
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
        } else if !self.pending.is_empty() {
            self.reuse_captured(pages)?;
        }
        let p = pool_of(size);
        if pages.granularity() > 0 && self.source.is_none() {
            self.malloc_mapped(pages, p, size, requested)
        } else {
            self.malloc_segmented(pages, p, size, requested)
        }
    }

    /// [`StreamState::malloc`] with pages, from the first of:
    ///
    /// 1. a kept block of exactly `size` bytes (the small pool's reuse
    ///    lists);
    /// 2. the best fit whose pages are all mapped (the hot path);
    /// 3. (out of the hot path's way, [`StreamState::malloc_mapping`]) the
    ///    kept blocks merged back, then the best placement, its missing
    ///    pages mapped (`mapping`: at a new peak the other pool's idle pages
    ///    go back first, then each page comes from the first source that
    ///    has one, see [`StreamState::page_for`]);
    ///
    /// then, on the device (`CachalotAllocator::malloc`), every other
    /// stream's cached memory, and out of memory.
    fn malloc_mapped(
        &mut self,
        pages: &Pages,
        p: usize,
        size: u64,
        requested: u64,
    ) -> BackendResult<u64> {
        if self.pools[p].range().is_none() {
            self.reserve_range(pages, p, size)?;
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

    /// Reserves pool `p`'s range (its first allocation, of `size` bytes)
    /// and publishes it.
    #[cold]
    #[inline(never)]
    fn reserve_range(&mut self, pages: &Pages, p: usize, size: u64) -> BackendResult<()> {
        self.pools[p].ensure_range(pages, self.config.range_size(p), size)?;
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
            if let Err(e) = self.map_placement(pages, p, &place, size, peaked) {
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
                let may_release = !self.private() && !pages.quiet();
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
}
