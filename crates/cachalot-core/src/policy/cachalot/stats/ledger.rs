//! A stream's statistics and events, changed in one place: every block and
//! page transition of the policy goes through one method here, which applies
//! a [`Transition`] to the stream's [`Figures`] (and, with several streams, writes
//! it to the stream's [`Journal`] for the device's figures) and tells the
//! observer. Methods are named for their
//! transition in the past tense (`allocated`, `segment_freed`,
//! `out_of_memory`, ...), with the same names as the pytorch policy's ledger.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::{DevicePtr, StreamId};
use crate::event::{Action, EventSink, Observer};
use crate::stats::MemoryStats;

use super::journal::{Figures, Journal, Run};
use super::merge::{DeviceJournal, Merged};
use crate::transition::Transition;

/// Pages mapped or unmapped one after another at contiguous addresses, reported
/// as one range (one event and one device call count), as PyTorch reports a map
/// of several pages.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Batch {
    action: Action,
    addr: DevicePtr,
    bytes: u64,
}

/// See the module docs.
pub(crate) struct Ledger {
    figures: Figures,
    /// With several streams on the device: this stream's changes since the
    /// last merge.
    journal: Option<Journal>,
    events: EventSink,
    stream: StreamId,
    batch: Option<Batch>,
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("stream", &self.stream)
            .field("events", &self.events)
            .finish()
    }
}

impl Ledger {
    /// Fresh statistics for `stream`; event times count from `start`.
    pub(crate) fn new(stats: MemoryStats, stream: StreamId, start: Instant) -> Ledger {
        Ledger {
            figures: Figures::new(stats),
            journal: None,
            events: EventSink::new(start),
            stream,
            batch: None,
        }
    }

    /// Records events for `stream` from now on (the state was taken over,
    /// see `StreamState::recycle`).
    pub(crate) fn set_stream(&mut self, stream: StreamId) {
        self.stream = stream;
    }

    /// The statistics of this stream's pools.
    pub(crate) fn stats(&self) -> MemoryStats {
        self.figures.stats()
    }

    /// Bytes this stream has allocated now.
    pub(crate) fn allocated_bytes(&self) -> u64 {
        self.figures.allocated_bytes()
    }

    /// Sets every peak to its current value.
    pub(crate) fn reset_peak(&mut self) {
        self.figures.reset_peak();
    }

    /// Zeroes every total and event counter.
    pub(crate) fn reset_accumulated(&mut self) {
        self.figures.reset_accumulated();
    }

    /// Journals every change from now on, for `device`'s merges.
    pub(crate) fn keep_journal(&mut self, device: &DeviceJournal) {
        self.journal = Some(device.journal(&mut self.figures));
    }

    /// Starts `device`'s merges from this stream's figures (the device's
    /// only stream until now), and journals every change from now on.
    pub(crate) fn start_merging(&mut self, device: &DeviceJournal, merged: &mut Option<Merged>) {
        self.journal = Some(device.start(merged, &mut self.figures));
    }

    /// The changes of one operation (under one hold of the stream's lock)
    /// from now until [`Ledger::end_op`] share one journal stamp, `early`
    /// where the clock was read as the operation began.
    #[inline(always)]
    pub(crate) fn begin_op(&mut self, early: Option<u64>) {
        if let Some(journal) = &mut self.journal {
            journal.begin_op(early);
        }
    }

    /// Ends what [`Ledger::begin_op`] began.
    #[inline(always)]
    pub(crate) fn end_op(&mut self) {
        if let Some(journal) = &mut self.journal {
            journal.end_op();
        }
    }

    /// The journal, once the device has several streams.
    pub(crate) fn journal(&self) -> Option<&Journal> {
        self.journal.as_ref()
    }

    /// The changes journaled since the last call, as a run (the journal goes
    /// on in `spare`); `None` (and `spare` dropped) without a journal.
    pub(crate) fn take_run(&mut self, spare: Run) -> Option<Run> {
        let journal = self.journal.as_mut()?;
        Some(journal.take(&mut self.figures, spare))
    }

    /// Every statistic's current value.
    pub(crate) fn levels(&self) -> super::levels::Levels {
        self.figures.levels()
    }

    /// Applies `change` to the stream's figures and journals it.
    #[inline(always)]
    fn change(&mut self, change: Transition) {
        self.figures.apply(change);
        if let Some(journal) = &mut self.journal {
            journal.note(change, &mut self.figures);
        }
    }

    /// Installs or removes the observer.
    pub(crate) fn set_observer(&mut self, observer: Option<Arc<dyn Observer>>) {
        self.events.set(observer);
    }

    fn emit(&self, action: Action, addr: DevicePtr, size: u64) {
        self.events.emit(action, addr, size, self.stream);
    }

    /// A block of `size` bytes at `addr` was handed out for `requested` bytes.
    #[inline(always)]
    pub(crate) fn allocated(&mut self, small: bool, addr: DevicePtr, size: u64, requested: u64) {
        self.change(Transition::Allocated {
            small,
            size,
            requested,
        });
        self.emit(Action::Alloc, addr, requested);
    }

    /// The caller freed the block; it stays active until its streams pass.
    pub(crate) fn free_requested(
        &mut self,
        small: bool,
        addr: DevicePtr,
        size: u64,
        requested: u64,
    ) {
        self.change(Transition::FreeRequested { small, size });
        self.emit(Action::FreeRequested, addr, requested);
    }

    /// The block became reusable.
    pub(crate) fn free_completed(
        &mut self,
        small: bool,
        addr: DevicePtr,
        size: u64,
        requested: u64,
    ) {
        self.change(Transition::FreeCompleted {
            small,
            size,
            requested,
        });
        self.emit(Action::FreeCompleted, addr, requested);
    }

    /// The caller freed the block and it became reusable at once (no other
    /// stream uses it): [`Ledger::free_requested`] and
    /// [`Ledger::free_completed`] in one.
    #[inline(always)]
    pub(crate) fn freed(&mut self, small: bool, addr: DevicePtr, size: u64, requested: u64) {
        self.change(Transition::Freed {
            small,
            size,
            requested,
        });
        self.emit(Action::FreeRequested, addr, requested);
        self.emit(Action::FreeCompleted, addr, requested);
    }

    /// A page of `bytes` was mapped at `addr`, changing the count of contiguous
    /// mapped runs (segments) by `runs`.
    pub(crate) fn mapped(&mut self, small: bool, addr: DevicePtr, bytes: u64, runs: i64) {
        self.change(Transition::Reserved {
            small,
            bytes: bytes as i64,
            segments: runs,
        });
        self.batch(Action::SegmentMap, addr, bytes);
    }

    /// A page of `bytes` at `addr` was unmapped.
    pub(crate) fn unmapped(&mut self, small: bool, addr: DevicePtr, bytes: u64, runs: i64) {
        self.change(Transition::Reserved {
            small,
            bytes: -(bytes as i64),
            segments: runs,
        });
        self.batch(Action::SegmentUnmap, addr, bytes);
    }

    /// Extends the pending range, or reports it and starts another.
    fn batch(&mut self, action: Action, addr: DevicePtr, bytes: u64) {
        match &mut self.batch {
            Some(b) if b.action == action && b.addr + b.bytes == addr => b.bytes += bytes,
            _ => {
                self.flush();
                self.batch = Some(Batch {
                    action,
                    addr,
                    bytes,
                });
            }
        }
    }

    /// Reports the pending mapped or unmapped range; every operation ends with it.
    pub(crate) fn flush(&mut self) {
        let Some(b) = self.batch.take() else { return };
        if b.action == Action::SegmentMap {
            self.figures.rest.num_device_alloc += 1;
        } else {
            self.figures.rest.num_device_free += 1;
        }
        self.emit(b.action, b.addr, b.bytes);
    }

    /// A device segment was allocated.
    pub(crate) fn segment_allocated(&mut self, small: bool, addr: DevicePtr, size: u64) {
        self.change(Transition::Reserved {
            small,
            bytes: size as i64,
            segments: 1,
        });
        self.figures.rest.num_device_alloc += 1;
        self.emit(Action::SegmentAlloc, addr, size);
    }

    /// A device segment was freed.
    pub(crate) fn segment_freed(&mut self, small: bool, addr: DevicePtr, size: u64) {
        self.change(Transition::Reserved {
            small,
            bytes: -(size as i64),
            segments: -1,
        });
        self.figures.rest.num_device_free += 1;
        self.emit(Action::SegmentFree, addr, size);
    }

    /// The heap's inactive split blocks went from `before` to `after` (count, bytes).
    pub(crate) fn splits_changed(&mut self, small: bool, before: (u64, u64), after: (u64, u64)) {
        if before == after {
            return;
        }
        self.change(Transition::Splits {
            small,
            count: after.0 as i64 - before.0 as i64,
            bytes: after.1 as i64 - before.1 as i64,
        });
    }

    /// An allocation failed for lack of memory, even after a flush.
    pub(crate) fn out_of_memory(&mut self, requested: u64, device_free: u64) {
        self.figures.rest.num_ooms += 1;
        self.emit(Action::Oom, device_free, requested);
    }

    /// Cached memory was flushed to retry an allocation.
    pub(crate) fn retried(&mut self) {
        self.figures.rest.num_alloc_retries += 1;
    }

    /// Pending events were all synchronized.
    pub(crate) fn synced_all(&mut self) {
        self.figures.rest.num_sync_all_streams += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::TraceEvent;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Log(Mutex<Vec<Action>>);
    impl Observer for Log {
        fn on_event(&self, e: &TraceEvent) {
            self.0.lock().unwrap().push(e.action);
        }
    }

    #[test]
    fn transitions_balance() {
        let log = Arc::new(Log::default());
        let mut l = Ledger::new(MemoryStats::new(None), StreamId(3), Instant::now());
        l.set_observer(Some(log.clone()));
        l.mapped(false, 0, 2 << 20, 1);
        l.allocated(false, 0, 4096, 4000);
        assert_eq!(l.stats().requested_bytes.all.current, 4000);
        l.free_requested(false, 0, 4096, 4000);
        assert_eq!(
            (
                l.stats().allocated_bytes.all.current,
                l.stats().active_bytes.all.current
            ),
            (0, 4096)
        );
        l.free_completed(false, 0, 4096, 4000);
        l.unmapped(false, 0, 2 << 20, -1);
        l.flush();
        let s = &l.stats();
        assert_eq!(
            (
                s.active.all.current,
                s.reserved_bytes.large_pool.peak,
                s.segment.all.current
            ),
            (0, 2 << 20, 0)
        );
        assert_eq!((s.num_device_alloc, s.num_device_free), (1, 1));
        assert_eq!(log.0.lock().unwrap().len(), 5);
    }

    #[test]
    fn contiguous_pages_are_one_range() {
        let mut l = Ledger::new(MemoryStats::new(None), StreamId(0), Instant::now());
        for i in 0..3 {
            l.mapped(false, i * (2 << 20), 2 << 20, i64::from(i == 0));
        }
        l.mapped(false, 100 << 20, 2 << 20, 1);
        l.unmapped(false, 100 << 20, 2 << 20, -1);
        let s = &l.stats();
        assert_eq!(
            (s.num_device_alloc, s.num_device_free),
            (2, 0),
            "the unmap is pending"
        );
        l.flush();
        assert_eq!(
            (l.stats().num_device_alloc, l.stats().num_device_free),
            (2, 1)
        );
        assert_eq!(l.stats().reserved_bytes.all.current, 6 << 20);
    }
}
