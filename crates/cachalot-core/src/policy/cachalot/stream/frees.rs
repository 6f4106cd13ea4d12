//! A stream's frees: the block at a pointer found and taken out of its pool,
//! freed at once or, when other streams used it, once events recorded on
//! them have passed (checked at later allocations, or waited for), then
//! kept for reuse or merged back into its heap.

use crate::backend::{capture_marks, Backend, BackendResult, EventId, GraphNode, StreamId};
use crate::backing::Backing;
use crate::error::FreeError;

use super::StreamState;
use crate::policy::cachalot::heap::{BlockId, State};
use crate::policy::cachalot::vm::pages::Pages;

/// A freed block waiting for events on the streams recorded on it.
#[derive(Debug)]
pub(super) struct Pending {
    pool: usize,
    id: BlockId,
    events: Vec<EventId>,
    /// An event could not be recorded nor its stream synchronized: only a
    /// device synchronization (at `empty_cache` or out of memory) frees it.
    wait_device: bool,
    /// Streams whose events are still to be recorded: freed while quiet
    /// ([`Pages::quiet`]), the events are recorded once it is not.
    unrecorded: Vec<StreamId>,
    /// Freed during a capture with [`Pages::capture_reuse`]: the capture's
    /// frontier on each of `unrecorded` then. Once the stream's own frontier
    /// follows them all, the block is free without events.
    marks: Option<Vec<GraphNode>>,
}

fn all_done(backend: &dyn Backend, events: &[EventId]) -> BackendResult<bool> {
    for e in events {
        if !backend.query_event(*e)? {
            return Ok(false);
        }
    }
    Ok(true)
}

impl StreamState {
    /// The pools to look in for `ptr`: with ranges, the large pool's holds
    /// the pointer or the small pool is next.
    fn pool_order(&self, ptr: u64) -> [usize; 2] {
        let large_first = self.pools[1]
            .range()
            .is_some_and(|(b, n)| b <= ptr && ptr < b + n);
        if large_first {
            [1, 0]
        } else {
            [0, 1]
        }
    }

    /// Why `ptr`, in no address index, cannot be freed.
    fn not_live(&self, ptr: u64) -> FreeError {
        let ours = self.pools.iter().any(|p| {
            p.heap
                .regions()
                .any(|r| r.base <= ptr && ptr < r.base + r.size)
        });
        if ours {
            FreeError::DoubleFree
        } else {
            FreeError::Foreign
        }
    }

    /// The pool and block of the live allocation at `ptr`.
    pub(crate) fn find(&self, ptr: u64) -> Result<(usize, BlockId), FreeError> {
        for p in self.pool_order(ptr) {
            let pool = &self.pools[p];
            if let Some(id) = pool.heap.live(ptr) {
                return match pool.heap.block(id).state {
                    State::Allocated => Ok((p, id)),
                    _ => Err(FreeError::DoubleFree),
                };
            }
        }
        Err(self.not_live(ptr))
    }

    /// What lies under the live allocation at `ptr`.
    pub(crate) fn backing(&self, ptr: u64) -> Result<Backing, FreeError> {
        let (p, id) = self.find(ptr)?;
        let pool = &self.pools[p];
        let b = pool.heap.block(id);
        Ok(pool.backing(b.addr, b.end() - b.addr))
    }

    /// Takes the allocated block at `ptr` out of its pool's address index.
    fn take(&mut self, ptr: u64) -> Result<(usize, BlockId), FreeError> {
        for p in self.pool_order(ptr) {
            // A block to be merged leaves the address index now (one lookup);
            // one to be kept stays in it.
            let pool = &mut self.pools[p];
            let found = if pool.keeps_freed() {
                pool.heap.live(ptr)
            } else {
                pool.heap.take_live(ptr)
            };
            let Some(id) = found else { continue };
            if pool.heap.block(id).state == State::Allocated {
                return Ok((p, id));
            }
            if !pool.keeps_freed() {
                pool.heap.restore_live(id);
            }
            return Err(FreeError::DoubleFree);
        }
        Err(self.not_live(ptr))
    }

    /// Frees the allocation at `ptr`. A device error cannot fail it: it only
    /// defers the block's reuse.
    pub(crate) fn free(&mut self, pages: &Pages, ptr: u64) -> Result<(), FreeError> {
        let (p, id) = self.take(ptr)?;
        self.free_inner(pages, p, id);
        self.ledger.flush();
        Ok(())
    }

    fn free_inner(&mut self, pages: &Pages, p: usize, id: BlockId) {
        let b = self.pools[p].heap.block(id);
        let (addr, size, requested) = (b.addr, b.size, b.requested);
        if !self.recorded.is_empty() {
            if let Some(streams) = self.recorded.remove(&addr) {
                self.defer_free(pages, p, id, streams);
                return;
            }
        }
        self.ledger.freed(p == 0, addr, size, requested);
        self.reclaim(pages, p, id);
    }

    /// Frees block `id`, used on `streams` too, once their work queued so far
    /// is done: events recorded now are checked at later allocations.
    #[cold]
    #[inline(never)]
    fn defer_free(&mut self, pages: &Pages, p: usize, id: BlockId, streams: Vec<StreamId>) {
        let b = self.pools[p].heap.block(id);
        let (addr, size, requested) = (b.addr, b.size, b.requested);
        self.ledger.free_requested(p == 0, addr, size, requested);
        let pool = &mut self.pools[p];
        if !pool.keeps_freed() {
            pool.heap.restore_live(id);
        }
        pool.heap.set_pending(id);
        let mut pending = Pending {
            pool: p,
            id,
            events: Vec::new(),
            wait_device: false,
            marks: None,
            unrecorded: streams,
        };
        if pages.quiet() && pages.capture_reuse() && self.private() {
            pending.marks = capture_marks(pages.backend().as_ref(), &pending.unrecorded);
        }
        if pages.quiet() {
            self.unrecorded += 1;
        } else {
            self.record_pending(pages, &mut pending);
        }
        self.pending.push(pending);
    }

    /// Records the events a pending free still lacks.
    fn record_pending(&mut self, pages: &Pages, pending: &mut Pending) {
        let backend = pages.backend().as_ref();
        for s in std::mem::take(&mut pending.unrecorded) {
            match self.record_on(backend, s) {
                Ok(e) => pending.events.push(e),
                // Without an event, wait for the stream now instead; failing
                // that, for the whole device later.
                Err(_) => pending.wait_device |= backend.synchronize_stream(s).is_err(),
            }
        }
    }

    /// Records the events of the frees made while quiet.
    fn record_deferred(&mut self, pages: &Pages) {
        if self.unrecorded == 0 {
            return;
        }
        self.unrecorded = 0;
        let mut pending = std::mem::take(&mut self.pending);
        for waiting in pending.iter_mut().filter(|w| !w.unrecorded.is_empty()) {
            self.record_pending(pages, waiting);
        }
        self.pending = pending;
    }

    fn record_on(&mut self, backend: &dyn Backend, stream: StreamId) -> BackendResult<EventId> {
        let event = match self.spare_events.pop() {
            Some(e) => e,
            None => backend.create_event()?,
        };
        backend
            .record_event(event, stream)
            .inspect_err(|_| self.spare_events.push(event))?;
        Ok(event)
    }

    /// Completes a pending free whose streams have passed.
    fn complete_pending(&mut self, pages: &Pages, done: Pending) {
        self.spare_events.extend(done.events);
        let pool = &mut self.pools[done.pool];
        if !pool.keeps_freed() {
            let addr = pool.heap.block(done.id).addr;
            pool.heap.take_live(addr);
        }
        self.complete(pages, done.pool, done.id);
    }

    /// Makes a freed block reusable (it is in the address index if and only
    /// if its pool keeps freed blocks).
    fn complete(&mut self, pages: &Pages, p: usize, id: BlockId) {
        let b = self.pools[p].heap.block(id);
        let (addr, size, requested) = (b.addr, b.size, b.requested);
        self.ledger.free_completed(p == 0, addr, size, requested);
        self.reclaim(pages, p, id);
    }

    /// [`StreamState::complete`] after the statistics: the block is kept for
    /// reuse or merged back into its heap.
    fn reclaim(&mut self, pages: &Pages, p: usize, id: BlockId) {
        self.unsynced = true;
        if self.pools[p].keeps_freed() {
            self.pools[p].keep(id);
        } else {
            self.merge_freed(pages, p, id);
        }
        self.release_kept_if_empty();
    }

    /// Merges freed block `id` back into pool `p`'s heap, then gives cached
    /// memory back down to the release threshold, if one is set.
    fn merge_freed(&mut self, pages: &Pages, p: usize, id: BlockId) {
        let pool = &mut self.pools[p];
        let b = pool.heap.block(id);
        let (addr, size) = (b.addr, b.size);
        if let Some(cells) = pool.cells.as_mut() {
            cells.release_mapped(cells.span(addr, size));
        }
        let segments = pool.cells.is_none().then(|| pool.heap.split_free());
        pool.heap.release(id);
        if let Some(before) = segments {
            self.ledger
                .splits_changed(p == 0, before, pool.heap.split_free());
        }
        if let Some(keep) = self
            .config
            .threshold
            .filter(|_| !self.private() && !pages.quiet())
        {
            self.keep_under(pages, p, keep);
        }
    }

    /// Once nothing is allocated or pending on the stream, the small pool's
    /// kept blocks (which hold their places only for the layout of the work
    /// under way) merge back, so that the next work is laid out from whole
    /// free space. A churning large pool keeps its own: they carry its layout
    /// from one pass to the next (bert_dynamic's later passes settle on them).
    fn release_kept_if_empty(&mut self) {
        if self
            .pools
            .iter()
            .all(|q| q.heap.live_count() == q.kept_count())
        {
            self.pools[0].release_kept();
        }
    }

    /// Gives pool `p`'s cached memory back down to the release threshold
    /// `keep`, if it is over.
    #[cold]
    #[inline(never)]
    fn keep_under(&mut self, pages: &Pages, p: usize, keep: u64) {
        if self.pools[p].cached_bytes() > keep {
            // Best effort: what fails to go back stays cached and is retried at
            // the next free, `empty_cache` or out-of-memory flush.
            if self.quiesce(pages).is_ok() {
                let _ = self.pools[p].release_cached(pages, &mut self.ledger, keep);
            }
        }
    }

    /// Marks the allocation at `ptr` as used by `stream` too.
    pub(crate) fn record_stream(&mut self, ptr: u64, stream: StreamId) -> Result<(), FreeError> {
        self.find(ptr)?;
        if stream != self.stream {
            let list = self.recorded.entry(ptr).or_default();
            if !list.contains(&stream) {
                list.push(stream);
            }
        }
        Ok(())
    }

    /// Completes the frees whose events have all passed.
    pub(super) fn process_events(&mut self, pages: &Pages) -> BackendResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.record_deferred(pages);
        let mut i = 0;
        while i < self.pending.len() {
            let waiting = &self.pending[i];
            if waiting.wait_device || !all_done(pages.backend().as_ref(), &waiting.events)? {
                i += 1;
                continue;
            }
            let done = self.pending.swap_remove(i);
            self.complete_pending(pages, done);
        }
        Ok(())
    }

    /// During a capture: completes the frees whose marks the stream's next
    /// captured work follows (`graph_capture_record_stream_reuse`).
    pub(super) fn reuse_captured(&mut self, pages: &Pages) -> BackendResult<()> {
        let mut i = 0;
        while i < self.pending.len() {
            let follows = match &self.pending[i].marks {
                Some(marks) => pages.backend().capture_follows(self.stream, marks)?,
                None => false,
            };
            if !follows {
                i += 1;
                continue;
            }
            let done = self.pending.swap_remove(i);
            self.unrecorded = self.unrecorded.saturating_sub(1);
            self.complete_pending(pages, done);
        }
        Ok(())
    }

    /// Waits for every pending free and completes it.
    pub(super) fn sync_pending(&mut self, pages: &Pages) -> BackendResult<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.record_deferred(pages);
        if self.pending.iter().any(|p| p.wait_device) {
            pages.backend().synchronize_device()?;
        }
        for p in &self.pending {
            for e in &p.events {
                pages.backend().synchronize_event(*e)?;
            }
        }
        self.ledger.synced_all();
        for done in std::mem::take(&mut self.pending) {
            self.complete_pending(pages, done);
        }
        Ok(())
    }
}
