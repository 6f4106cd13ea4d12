//! Cross-stream use: `record_stream`, frees that wait for events recorded on the
//! streams that used a block, and the polling (at each malloc) or synchronizing
//! (at `empty_cache`) of those events.

use std::collections::VecDeque;

use crate::backend::{DevicePtr, EventId, StreamId};
use crate::error::{Error, FreeError, Result};

use super::block::{BlockId, PendingEvent};
use super::state::State;

impl State {
    /// The allocated block at `ptr`, or the reason there is none.
    pub(crate) fn live_block(&self, ptr: DevicePtr) -> Result<BlockId> {
        match self.allocated.get(&ptr) {
            Some(id) => Ok(*id),
            None => Err(self.invalid_free(ptr)),
        }
    }

    /// Why `ptr`, not an allocated address, cannot be freed.
    fn invalid_free(&self, ptr: DevicePtr) -> Error {
        let known = self
            .blocks
            .iter()
            .any(|(_, b)| b.addr == ptr && !b.allocated);
        let reason = if known {
            FreeError::DoubleFree
        } else {
            FreeError::Foreign
        };
        Error::InvalidFree { ptr, reason }
    }

    /// Marks the allocation at `ptr` as used by `stream`.
    pub(crate) fn record_stream(&mut self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        let id = self.live_block(ptr)?;
        let routing = self.book.routing();
        let b = &mut self.blocks[id];
        if stream == b.stream {
            return Ok(());
        }
        if !b.stream_uses.contains(&stream) {
            b.stream_uses.push(stream);
        }
        if routing && !b.capture_uses.contains(&stream) {
            b.capture_uses.push(stream);
        }
        Ok(())
    }

    /// Frees the allocation at `ptr`. With other streams recorded, the block stays
    /// active until events recorded on them now have completed.
    pub(crate) fn free(&mut self, ptr: DevicePtr) -> Result<()> {
        let Some(id) = self.allocated.remove(&ptr) else {
            return Err(self.invalid_free(ptr));
        };
        if self.book.routing() && !self.blocks[id].stream_uses.is_empty() {
            self.blocks[id].allocated = false;
            self.ledger.free_requested(&self.blocks[id]);
            self.mark_capture_free(id);
            self.deferred.push_back(id);
            return Ok(());
        }
        let events = if self.blocks[id].stream_uses.is_empty() {
            Vec::new()
        } else {
            let uses = self.hashes.set_order(&self.blocks[id].stream_uses);
            match self.record_events(&uses) {
                Ok(events) => events,
                Err(e) => {
                    // The allocation stays as it was.
                    self.allocated.insert(ptr, id);
                    return Err(e);
                }
            }
        };
        self.blocks[id].allocated = false;
        self.ledger.free_requested(&self.blocks[id]);
        self.await_events(id, events);
        Ok(())
    }

    /// Makes freed block `id` wait for `events` (or returns it to its pool when
    /// there are none).
    fn await_events(&mut self, id: BlockId, events: Vec<(StreamId, EventId)>) {
        let b = &mut self.blocks[id];
        b.stream_uses.clear();
        b.event_count = events.len() as u32;
        if events.is_empty() {
            self.free_block(id);
        }
        for (stream, event) in events {
            let hash = self.hashes.of(stream);
            self.pending
                .push(stream, hash, PendingEvent { event, block: id });
        }
    }

    /// Records the events of the blocks freed while a route was open, on the
    /// streams recorded before the route only (as PyTorch: what was captured
    /// on the others has not run, and runs only when its graph replays).
    pub(crate) fn insert_deferred_events(&mut self) -> Result<()> {
        while let Some(&id) = self.deferred.front() {
            let b = &self.blocks[id];
            let (all, captured) = (b.stream_uses.clone(), b.capture_uses.clone());
            let kept: Vec<StreamId> = self
                .hashes
                .set_order(&all)
                .into_iter()
                .filter(|s| !captured.contains(s))
                .collect();
            let uses = self.hashes.set_order(&kept);
            let events = self.record_events(&uses)?;
            self.deferred.pop_front();
            self.free_marks.remove(&id);
            self.blocks[id].capture_uses.clear();
            self.await_events(id, events);
        }
        Ok(())
    }

    /// Records one event on each stream; on failure nothing stays recorded.
    fn record_events(&mut self, streams: &[StreamId]) -> Result<Vec<(StreamId, EventId)>> {
        let mut out: Vec<(StreamId, EventId)> = Vec::with_capacity(streams.len());
        for s in streams {
            let created = match self.spare_events.pop() {
                Some(e) => Ok(e),
                None => self.backend.create_event(),
            };
            let recorded = created.and_then(|e| {
                self.backend
                    .record_event(e, *s)
                    .map(|()| e)
                    .inspect_err(|_| self.spare_events.push(e))
            });
            match recorded {
                Ok(e) => out.push((*s, e)),
                Err(err) => {
                    self.spare_events.extend(out.iter().map(|(_, e)| *e));
                    return Err(err.into());
                }
            }
        }
        Ok(out)
    }

    /// Reclaims blocks whose events have all completed (non-blocking).
    pub(crate) fn process_events(&mut self) -> Result<()> {
        if !self.deferred.is_empty() {
            self.insert_deferred_events()?;
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        let walked = self.pending.walk(&self.hashes);
        for (s, _) in &walked {
            while let Some(front) = self.pending.front(*s) {
                if !self.backend.query_event(front.event)? {
                    break;
                }
                self.complete(*s, front);
            }
        }
        self.pending.drop_emptied(&walked);
        Ok(())
    }

    /// Waits for the outstanding events (of the blocks of private pool slot
    /// `only`, or of every block) and reclaims their blocks; blocks freed while
    /// a route was open get their events first.
    pub(crate) fn synchronize_and_free_events(&mut self, only: Option<u32>) -> Result<()> {
        self.ledger.synced_all();
        if !self.book.routing() {
            self.insert_deferred_events()?;
        }
        let walked = self.pending.walk(&self.hashes);
        for (s, _) in &walked {
            let queue = self.pending.take(*s);
            let mut kept = VecDeque::new();
            let mut rest = queue.into_iter();
            while let Some(p) = rest.next() {
                if only.is_some_and(|slot| self.blocks[p.block].pool != slot) {
                    kept.push_back(p);
                    continue;
                }
                if let Err(e) = self.backend.synchronize_event(p.event) {
                    kept.push_back(p);
                    kept.extend(rest);
                    self.pending.put(*s, kept);
                    self.pending.drop_emptied(&walked);
                    return Err(e.into());
                }
                self.reclaim(p);
            }
            self.pending.put(*s, kept);
        }
        self.pending.drop_emptied(&walked);
        Ok(())
    }

    fn complete(&mut self, stream: StreamId, done: PendingEvent) {
        self.pending.pop_front(stream);
        self.reclaim(done);
    }

    /// Counts the completed event `done` off its block, freeing the block at
    /// its last.
    fn reclaim(&mut self, done: PendingEvent) {
        self.spare_events.push(done.event);
        let b = &mut self.blocks[done.block];
        b.event_count -= 1;
        if b.event_count == 0 {
            self.free_block(done.block);
        }
    }

    /// Destroys every event this allocator created, spare or outstanding (best
    /// effort, when the allocator is dropped).
    pub(crate) fn destroy_events(&mut self) {
        let outstanding = self.pending.drain().into_iter().map(|e| e.event);
        let events: Vec<EventId> = self.spare_events.drain(..).chain(outstanding).collect();
        for e in events {
            let _ = self.backend.destroy_event(e);
        }
    }
}
