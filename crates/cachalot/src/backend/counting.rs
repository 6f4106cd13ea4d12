//! A backend wrapper that counts the calls made through it, by kind: how a
//! replay or a benchmark reports driver calls on any backend, simulated or real.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{
    Backend, BackendResult, CallKind, Capabilities, DevicePtr, EventId, MemInfo, PageHandle,
    StreamId,
};

/// Calls by kind, failed ones included.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Calls of each kind made at least once.
    pub calls: BTreeMap<CallKind, u64>,
}

impl CallCounts {
    /// Calls of one kind.
    pub fn count(&self, kind: CallKind) -> u64 {
        self.calls.get(&kind).copied().unwrap_or(0)
    }

    /// Counts one more call of `kind`; returns how many there have been.
    pub(crate) fn add(&mut self, kind: CallKind) -> u64 {
        let n = self.calls.entry(kind).or_default();
        *n += 1;
        *n
    }

    /// Costly memory calls (see [`CallKind::is_memory_call`]).
    pub fn memory_calls(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(k, _)| k.is_memory_call())
            .map(|(_, n)| n)
            .sum()
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Counting<B: ?Sized> {
    inner: Arc<B>,
    /// Calls by kind (index: the kind's position in [`CallKind::ALL`]).
    calls: [AtomicU64; CallKind::ALL.len()],
}

impl<B: Backend + ?Sized> Counting<B> {
    /// Wraps `inner`, with every count at zero.
    pub fn new(inner: Arc<B>) -> Counting<B> {
        Counting {
            inner,
            calls: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &Arc<B> {
        &self.inner
    }

    /// The calls made so far.
    pub fn counts(&self) -> CallCounts {
        let calls = CallKind::ALL
            .iter()
            .map(|&k| (k, self.calls[k as usize].load(Ordering::Relaxed)))
            .filter(|&(_, n)| n > 0)
            .collect();
        CallCounts { calls }
    }

    fn count(&self, kind: CallKind) {
        self.calls[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl<B: Backend + ?Sized> Backend for Counting<B> {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }

    fn mem_info(&self) -> BackendResult<MemInfo> {
        self.count(CallKind::MemInfo);
        self.inner.mem_info()
    }

    fn allocate_segment(&self, size: u64) -> BackendResult<DevicePtr> {
        self.count(CallKind::SegmentAlloc);
        self.inner.allocate_segment(size)
    }

    fn free_segment(&self, ptr: DevicePtr) -> BackendResult<()> {
        self.count(CallKind::SegmentFree);
        self.inner.free_segment(ptr)
    }

    fn reserve_range(&self, size: u64) -> BackendResult<DevicePtr> {
        self.count(CallKind::ReserveRange);
        self.inner.reserve_range(size)
    }

    fn release_range(&self, base: DevicePtr, size: u64) -> BackendResult<()> {
        self.count(CallKind::ReleaseRange);
        self.inner.release_range(base, size)
    }

    fn create_page(&self, size: u64) -> BackendResult<PageHandle> {
        self.count(CallKind::CreatePage);
        self.inner.create_page(size)
    }

    fn release_page(&self, page: PageHandle) -> BackendResult<()> {
        self.count(CallKind::ReleasePage);
        self.inner.release_page(page)
    }

    fn map(&self, addr: DevicePtr, page: PageHandle) -> BackendResult<()> {
        self.count(CallKind::Map);
        self.inner.map(addr, page)
    }

    fn unmap(&self, addr: DevicePtr, size: u64) -> BackendResult<()> {
        self.count(CallKind::Unmap);
        self.inner.unmap(addr, size)
    }

    fn create_event(&self) -> BackendResult<EventId> {
        self.count(CallKind::CreateEvent);
        self.inner.create_event()
    }

    fn destroy_event(&self, event: EventId) -> BackendResult<()> {
        self.count(CallKind::DestroyEvent);
        self.inner.destroy_event(event)
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> BackendResult<()> {
        self.count(CallKind::RecordEvent);
        self.inner.record_event(event, stream)
    }

    fn query_event(&self, event: EventId) -> BackendResult<bool> {
        self.count(CallKind::QueryEvent);
        self.inner.query_event(event)
    }

    fn synchronize_event(&self, event: EventId) -> BackendResult<()> {
        self.count(CallKind::SynchronizeEvent);
        self.inner.synchronize_event(event)
    }

    fn synchronize_stream(&self, stream: StreamId) -> BackendResult<()> {
        self.count(CallKind::SynchronizeStream);
        self.inner.synchronize_stream(stream)
    }

    fn synchronize_device(&self) -> BackendResult<()> {
        self.count(CallKind::SynchronizeDevice);
        self.inner.synchronize_device()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;

    #[test]
    fn counts_every_call_through_it_failed_ones_too() {
        let counting = Counting::new(Arc::new(SimBackend::new(64 << 20)));
        let a = counting.allocate_segment(2 << 20).expect("room");
        assert!(counting.allocate_segment(1 << 40).is_err(), "too large");
        counting.free_segment(a).expect("live");
        counting.mem_info().expect("answers");
        let counts = counting.counts();
        assert_eq!(counts.count(CallKind::SegmentAlloc), 2);
        assert_eq!(counts.count(CallKind::SegmentFree), 1);
        assert_eq!(counts.count(CallKind::Map), 0);
        assert_eq!(counts.memory_calls(), 3, "mem_info is not a memory call");
        assert_eq!(counts.calls.len(), 3, "kinds never called are left out");
        assert_eq!(
            counting
                .inner()
                .counters()
                .calls
                .count(CallKind::SegmentAlloc),
            2,
            "the calls reached the wrapped backend"
        );
    }
}
