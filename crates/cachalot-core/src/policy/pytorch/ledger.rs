//! The one place where statistics change and events are emitted: each method is a
//! block or segment state transition, named for it in the past tense
//! (`allocated`, `segment_freed`, `out_of_memory`, ...) with the same names as
//! the cachalot policy's ledger; the per-pool statistics move as the shared
//! [`Transition`]s say ([`MemoryStats::apply`]), and this ledger adds what only
//! this policy counts (oversize blocks, paused bytes, driver calls).

use std::sync::Arc;
use std::time::Instant;

use crate::backend::{DevicePtr, StreamId};
use crate::event::{Action, EventSink, Observer};
use crate::stats::MemoryStats;
use crate::transition::Transition;

use super::block::Block;

/// Pages of an expandable segment mapped (`bytes` > 0) or unmapped, or a
/// paused segment's pages given back or taken again: reserved bytes move,
/// the segment count does not.
fn reserved(small: bool, bytes: i64) -> Transition {
    Transition::Reserved {
        small,
        bytes,
        segments: 0,
    }
}

/// Statistics plus the observer that hears about every transition.
pub(crate) struct Ledger {
    /// PyTorch's statistics.
    pub(crate) stats: MemoryStats,
    events: EventSink,
    max_split_size: u64,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("events", &self.events)
            .finish_non_exhaustive()
    }
}

impl Ledger {
    /// Fresh statistics for a split limit of `max_split_size` (`u64::MAX` = none).
    pub(crate) fn new(max_split_size: u64) -> Ledger {
        let limit = (max_split_size != u64::MAX).then_some(max_split_size);
        Ledger {
            stats: MemoryStats::new(limit),
            events: EventSink::new(Instant::now()),
            max_split_size,
        }
    }

    /// A new split limit (`u64::MAX` = none), with the oversize allocations
    /// and segments counted under it.
    pub(crate) fn set_max_split_size(&mut self, limit: u64, allocations: i64, segments: i64) {
        self.max_split_size = limit;
        self.stats.max_split_size = if limit == u64::MAX { -1 } else { limit as i64 };
        let s = &mut self.stats;
        s.oversize_allocations
            .update(allocations - s.oversize_allocations.current);
        s.oversize_segments
            .update(segments - s.oversize_segments.current);
    }

    /// Installs or removes the observer.
    pub(crate) fn set_observer(&mut self, observer: Option<Arc<dyn Observer>>) {
        self.events.set(observer);
    }

    fn emit(&self, action: Action, addr: DevicePtr, size: u64, stream: StreamId) {
        self.events.emit(action, addr, size, stream);
    }

    fn oversize(&self, size: u64) -> bool {
        size >= self.max_split_size
    }

    /// A device allocation became a segment.
    pub(crate) fn segment_allocated(
        &mut self,
        addr: DevicePtr,
        size: u64,
        small: bool,
        stream: StreamId,
    ) {
        self.stats.apply(Transition::Reserved {
            small,
            bytes: size as i64,
            segments: 1,
        });
        let s = &mut self.stats;
        if size >= self.max_split_size {
            s.oversize_segments.increase(1);
        }
        s.num_device_alloc += 1;
        self.emit(Action::SegmentAlloc, addr, size, stream);
    }

    /// A segment went back to the device.
    pub(crate) fn segment_freed(
        &mut self,
        addr: DevicePtr,
        size: u64,
        small: bool,
        stream: StreamId,
    ) {
        self.stats.apply(Transition::Reserved {
            small,
            bytes: -(size as i64),
            segments: -1,
        });
        let s = &mut self.stats;
        if size >= self.max_split_size {
            s.oversize_segments.decrease(1);
        }
        s.num_device_free += 1;
        self.emit(Action::SegmentFree, addr, size, stream);
    }

    /// Pages were mapped into an expandable segment (no new `segment`).
    pub(crate) fn mapped(&mut self, addr: DevicePtr, size: u64, small: bool, stream: StreamId) {
        self.stats.apply(reserved(small, size as i64));
        self.stats.num_device_alloc += 1;
        self.emit(Action::SegmentMap, addr, size, stream);
    }

    /// Pages were unmapped from an expandable segment.
    pub(crate) fn unmapped(&mut self, addr: DevicePtr, size: u64, small: bool, stream: StreamId) {
        self.stats.apply(reserved(small, -(size as i64)));
        self.stats.num_device_free += 1;
        self.emit(Action::SegmentUnmap, addr, size, stream);
    }

    /// A tag's segment gave its pages back to the device (it stays a segment).
    pub(crate) fn paused(&mut self, addr: DevicePtr, size: u64, small: bool, stream: StreamId) {
        self.stats.apply(reserved(small, -(size as i64)));
        self.stats.paused_bytes.increase(size);
        self.stats.num_device_free += 1;
        self.emit(Action::SegmentPause, addr, size, stream);
    }

    /// A paused segment's pages came back.
    pub(crate) fn resumed(&mut self, addr: DevicePtr, size: u64, small: bool, stream: StreamId) {
        self.stats.paused_bytes.decrease(size);
        self.stats.apply(reserved(small, size as i64));
        self.stats.num_device_alloc += 1;
        self.emit(Action::SegmentResume, addr, size, stream);
    }

    /// A block was handed to a caller.
    pub(crate) fn allocated(&mut self, b: &Block) {
        self.stats.apply(Transition::Allocated {
            small: b.small,
            size: b.size,
            requested: b.requested,
        });
        if self.oversize(b.size) {
            self.stats.oversize_allocations.increase(1);
        }
        self.emit(Action::Alloc, b.addr, b.requested, b.stream);
    }

    /// The caller freed a block (it may still be active on other streams).
    pub(crate) fn free_requested(&mut self, b: &Block) {
        self.stats.apply(Transition::FreeRequested {
            small: b.small,
            size: b.size,
        });
        if self.oversize(b.size) {
            self.stats.oversize_allocations.decrease(1);
        }
        self.emit(Action::FreeRequested, b.addr, b.requested, b.stream);
    }

    /// A freed block of `size` bytes at `addr` became reusable.
    pub(crate) fn free_completed(
        &mut self,
        addr: DevicePtr,
        size: u64,
        requested: u64,
        small: bool,
        stream: StreamId,
    ) {
        self.stats.apply(Transition::FreeCompleted {
            small,
            size,
            requested,
        });
        self.emit(Action::FreeCompleted, addr, requested, stream);
    }

    /// Inactive split blocks changed by `blocks` and `bytes`.
    pub(crate) fn splits_changed(&mut self, small: bool, blocks: i64, bytes: i64) {
        self.stats.apply(Transition::Splits {
            small,
            count: blocks,
            bytes,
        });
    }

    /// The last-resort retry ran.
    pub(crate) fn retried(&mut self) {
        self.stats.num_alloc_retries += 1;
    }

    /// Every outstanding event was synchronized.
    pub(crate) fn synced_all(&mut self) {
        self.stats.num_sync_all_streams += 1;
    }

    /// An allocation failed for lack of memory.
    pub(crate) fn out_of_memory(&mut self, requested: u64, device_free: u64, stream: StreamId) {
        self.stats.num_ooms += 1;
        self.emit(Action::Oom, device_free, requested, stream);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::event::TraceEvent;

    #[derive(Default)]
    struct Log {
        events: Mutex<Vec<TraceEvent>>,
        timed: bool,
        only: Option<Action>,
    }

    impl Observer for Log {
        fn on_event(&self, event: &TraceEvent) {
            self.events.lock().unwrap().push(*event);
        }
        fn wants_time(&self) -> bool {
            self.timed
        }
        fn wants(&self, action: Action) -> bool {
            self.only.is_none_or(|a| a == action)
        }
    }

    #[test]
    fn an_observer_that_wants_no_time_gets_events_stamped_zero() {
        let mut ledger = Ledger::new(u64::MAX);
        ledger.events.epoch -= std::time::Duration::from_secs(5);
        for timed in [false, true] {
            let log = Arc::new(Log {
                timed,
                ..Log::default()
            });
            ledger.set_observer(Some(log.clone()));
            ledger.segment_allocated(0x1000, 2 << 20, true, StreamId::DEFAULT);
            let events = log.events.lock().unwrap().clone();
            assert_eq!(events.len(), 1);
            assert_eq!(events[0].action, Action::SegmentAlloc);
            let stamped = events[0].time_us >= 5_000_000;
            assert_eq!(stamped, timed, "{:?}", events[0]);
        }
    }

    #[test]
    fn an_observer_hears_only_the_actions_it_wants() {
        let mut ledger = Ledger::new(u64::MAX);
        let log = Arc::new(Log {
            only: Some(Action::SegmentFree),
            ..Log::default()
        });
        ledger.set_observer(Some(log.clone()));
        ledger.segment_allocated(0x1000, 2 << 20, true, StreamId::DEFAULT);
        ledger.segment_freed(0x1000, 2 << 20, true, StreamId::DEFAULT);
        let events = log.events.lock().unwrap().clone();
        let actions: Vec<Action> = events.iter().map(|e| e.action).collect();
        assert_eq!(actions, [Action::SegmentFree]);
        assert_eq!(ledger.stats.num_device_alloc, 1, "stats change regardless");
    }
}
