//! Tags: pausing a private pool's memory and resuming it at the same
//! addresses ([`crate::sleep`]). The blocks never change; a paused segment
//! keeps them and only its pages come and go, with the statistics and events
//! of each.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::backend::{BackendError, CallKind, DevicePtr, StreamId};
use crate::error::Result;
use crate::private_pool::PoolId;
use crate::sleep::{Backup, PageSource, SleepError, SleepReport, Tag, TagState, WhenBusy};

use super::block::SegmentId;
use super::state::State;

impl State {
    /// Whether the pool in `slot` is a paused tag.
    pub(crate) fn is_paused(&self, slot: u32) -> bool {
        self.tags.get(&slot).is_some_and(|t| t.paused)
    }

    /// Makes pool `id` a tag with `backup` (again: nothing to do).
    pub(crate) fn make_tag(&mut self, id: PoolId, backup: Backup) -> Result<()> {
        let slot = self.book.require(id)?.slot;
        if let Some(tag) = self.tags.get(&slot) {
            if tag.backup == backup {
                return Ok(());
            }
            let kept = tag.backup;
            return Err(SleepError::OtherBackup {
                pool: id,
                kept,
                asked: backup,
            }
            .into());
        }
        if !self.backend.capabilities().virtual_memory {
            return Err(SleepError::NoVirtualMemory.into());
        }
        if self.book.source(slot).is_some() {
            return Err(SleepError::OwnAllocator { pool: id }.into());
        }
        let segments = self.segments_of(slot).len();
        if segments > 0 {
            return Err(SleepError::HoldsMemory { pool: id, segments }.into());
        }
        let tag = Tag {
            source: Arc::new(PageSource::new(self.backend.clone())),
            backup,
            paused: false,
            captured: false,
        };
        self.book.set_source(id, tag.source.clone())?;
        self.tags.insert(slot, tag);
        Ok(())
    }

    /// Pauses tag `id` (see [`crate::device_allocator::Tags::pause_tag`]).
    pub(crate) fn pause_tag(&mut self, id: PoolId, when_busy: WhenBusy) -> Result<SleepReport> {
        let (slot, tag) = self.tag_of(id)?;
        if tag.paused {
            return Err(SleepError::AlreadyPaused { pool: id }.into());
        }
        if self.book.routes_to(id) {
            return Err(SleepError::RouteOpen { pool: id }.into());
        }
        self.quiesce(id, slot, when_busy)?;
        let before = self.reserved();
        if !tag.captured {
            self.release_pool_blocks(slot)?;
        }
        let released = before - self.reserved();
        let segments = self.segments_of(slot);
        let copied = match tag.backup {
            Backup::Host => tag.source.back_up(&self.live_ranges(&segments))?,
            Backup::None => 0,
        };
        self.set_paused(slot, true);
        let mut report = SleepReport {
            copied,
            released,
            ..SleepReport::default()
        };
        for (done, sid) in segments.iter().enumerate() {
            let seg = &self.segments[*sid];
            if let Err(cause) = tag.source.release(seg.base) {
                let left = segments.len() - done;
                return Err(partial("pause", id, done, left, cause));
            }
            self.segment_paused(*sid, true);
            report.segments += 1;
            report.bytes += self.segments[*sid].size;
        }
        Ok(report)
    }

    /// Resumes paused tag `id` (see [`crate::device_allocator::Tags::resume_tag`]).
    pub(crate) fn resume_tag(&mut self, id: PoolId) -> Result<SleepReport> {
        let (slot, tag) = self.tag_of(id)?;
        if !tag.paused {
            return Err(SleepError::NotPaused { pool: id }.into());
        }
        let paused: Vec<SegmentId> = self
            .segments_of(slot)
            .into_iter()
            .filter(|sid| self.segments[*sid].paused)
            .collect();
        let mut report = SleepReport::default();
        let mut failure = None;
        for (done, sid) in paused.iter().enumerate() {
            if let Err(cause) = self.restore_segment(&tag.source, *sid) {
                failure = Some(partial("resume", id, done, paused.len() - done, cause));
                break;
            }
            report.segments += 1;
            report.bytes += self.segments[*sid].size;
        }
        let awake: Vec<DevicePtr> = self
            .segments_of(slot)
            .into_iter()
            .filter(|sid| !self.segments[*sid].paused)
            .map(|sid| self.segments[sid].base)
            .collect();
        report.copied = tag.source.restore_bytes(&awake)?;
        if let Some(e) = failure {
            return Err(e);
        }
        self.set_paused(slot, false);
        Ok(report)
    }

    /// Where tag `id` stands.
    pub(crate) fn tag_state(&self, id: PoolId) -> Result<TagState> {
        let (slot, tag) = self.tag_of(id)?;
        let mut state = TagState {
            backup: tag.backup,
            paused: tag.paused,
            host_bytes: tag.source.host_bytes(),
            ..TagState::default()
        };
        for sid in self.segments_of(slot) {
            let seg = &self.segments[sid];
            state.segments += 1;
            state.bytes += seg.size;
            if seg.paused {
                state.paused_bytes += seg.size;
            }
        }
        Ok(state)
    }

    /// Notes that `stream`, routed to the pool in `slot`, allocates there
    /// during a capture, if that pool is a tag (see [`Tag::captured`]).
    pub(crate) fn note_capture_into(&mut self, slot: u32, stream: StreamId) {
        let backend = &self.backend;
        if let Some(tag) = self.tags.get_mut(&slot).filter(|t| !t.captured) {
            tag.captured = matches!(backend.capture_frontier(stream), Ok(Some(_)));
        }
    }

    /// Refuses a request of `size` bytes routed to the pool in `slot` while
    /// it is a paused tag.
    pub(crate) fn refuse_paused(&self, slot: u32, size: u64) -> Result<()> {
        if !self.is_paused(slot) {
            return Ok(());
        }
        Err(SleepError::Paused {
            pool: self.book.id_of(slot),
            requested: size,
        }
        .into())
    }

    /// The slot and tag of pool `id`.
    fn tag_of(&self, id: PoolId) -> Result<(u32, Tag)> {
        let slot = self.book.require(id)?.slot;
        match self.tags.get(&slot) {
            Some(tag) => Ok((slot, tag.clone())),
            None => Err(SleepError::NotATag { pool: id }.into()),
        }
    }

    /// The segments of the pool in `slot`, by address.
    pub(crate) fn segments_of(&self, slot: u32) -> Vec<SegmentId> {
        let mut ids: Vec<(DevicePtr, SegmentId)> = self
            .segments
            .iter()
            .filter(|(_, s)| s.pool == slot)
            .map(|(id, s)| (s.base, id))
            .collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, id)| id).collect()
    }

    /// Each segment of `segments` with its allocated blocks' ranges.
    fn live_ranges(&self, segments: &[SegmentId]) -> Vec<(DevicePtr, Vec<(DevicePtr, u64)>)> {
        segments
            .iter()
            .map(|sid| {
                let seg = &self.segments[*sid];
                let mut live = Vec::new();
                let mut cur = Some(seg.head);
                while let Some(b) = cur.map(|id| &self.blocks[id]) {
                    if b.allocated {
                        live.push((b.addr, b.size));
                    }
                    cur = b.next;
                }
                (seg.base, live)
            })
            .collect()
    }

    /// Makes sure no queued work uses the memory of tag `id` (in `slot`):
    /// waits for the device, or refuses while a stream that used it is busy.
    /// Either way its blocks' completed cross-stream frees are reclaimed.
    fn quiesce(&mut self, id: PoolId, slot: u32, when_busy: WhenBusy) -> Result<()> {
        if when_busy == WhenBusy::Synchronize {
            self.backend.synchronize_device()?;
            return self.synchronize_and_free_events(Some(slot));
        }
        if !self.book.routing() {
            self.process_events()?;
        }
        let waiting = self.pending.events().map(|e| e.block);
        let waiting = waiting.chain(self.deferred.iter().copied());
        if let Some(b) = waiting.map(|b| &self.blocks[b]).find(|b| b.pool == slot) {
            let stream = b.stream;
            return Err(SleepError::Busy { pool: id, stream }.into());
        }
        for stream in self.streams_of(slot) {
            if !self.stream_idle(stream)? {
                return Err(SleepError::Busy { pool: id, stream }.into());
            }
        }
        Ok(())
    }

    /// Every stream that used memory of the pool in `slot`: its segments'
    /// streams and those recorded on its allocations.
    fn streams_of(&self, slot: u32) -> BTreeSet<StreamId> {
        let blocks = self
            .blocks
            .iter()
            .map(|(_, b)| b)
            .filter(|b| b.pool == slot);
        blocks
            .flat_map(|b| std::iter::once(b.stream).chain(b.stream_uses.iter().copied()))
            .collect()
    }

    /// Whether the work queued on `stream` so far has finished (an event
    /// recorded now and queried).
    fn stream_idle(&mut self, stream: StreamId) -> Result<bool> {
        let event = match self.spare_events.pop() {
            Some(e) => e,
            None => self.backend.create_event()?,
        };
        let idle = self
            .backend
            .record_event(event, stream)
            .and_then(|()| self.backend.query_event(event));
        self.spare_events.push(event);
        Ok(idle?)
    }

    /// Maps new pages under paused segment `sid`, releasing the cache of the
    /// default pools and trying again when the device has no room.
    fn restore_segment(
        &mut self,
        source: &PageSource,
        sid: SegmentId,
    ) -> std::result::Result<(), BackendError> {
        let size = self.segments[sid].size;
        if self
            .allowed
            .is_some_and(|max| self.reserved().saturating_add(size) > max)
        {
            return Err(BackendError::OutOfMemory {
                call: CallKind::CreatePage,
                requested: size,
            });
        }
        let base = self.segments[sid].base;
        let mut restored = source.restore(base);
        let no_room = restored.as_ref().is_err_and(|e| e.is_out_of_memory());
        if no_room && !self.book.routing() && self.release_cached_blocks().is_ok() {
            restored = source.restore(base);
        }
        restored?;
        self.segment_paused(sid, false);
        Ok(())
    }

    /// Marks the tag in `slot` paused or not.
    fn set_paused(&mut self, slot: u32, paused: bool) {
        if let Some(tag) = self.tags.get_mut(&slot) {
            tag.paused = paused;
        }
    }

    /// Records that segment `sid`'s pages went (`paused`) or came back.
    fn segment_paused(&mut self, sid: SegmentId, paused: bool) {
        let seg = &mut self.segments[sid];
        seg.paused = paused;
        let (base, size, small, stream) = (seg.base, seg.size, seg.small, seg.stream);
        if paused {
            self.ledger.paused(base, size, small, stream);
        } else {
            self.ledger.resumed(base, size, small, stream);
        }
    }
}

/// The error of a pause or resume that stopped after `done` segments.
fn partial(
    what: &'static str,
    pool: PoolId,
    done: usize,
    left: usize,
    cause: BackendError,
) -> crate::error::Error {
    SleepError::Partial {
        what,
        pool,
        done,
        left,
        cause,
    }
    .into()
}
