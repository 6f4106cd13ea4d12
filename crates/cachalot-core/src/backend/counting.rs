//! A backend wrapper that counts the calls made through it, by kind: how a
//! replay or a benchmark reports driver calls on any backend, simulated or real.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::adaptor::{adaptor, Hooks};
use super::{Backend, BackendResult, CallKind};

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

    /// The calls made since `earlier` (counts taken from the same counter).
    pub fn since(&self, earlier: &CallCounts) -> CallCounts {
        let calls = self
            .calls
            .iter()
            .map(|(k, n)| (*k, n.saturating_sub(earlier.count(*k))))
            .filter(|(_, n)| *n > 0)
            .collect();
        CallCounts { calls }
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
}

impl<B: ?Sized> Hooks for Counting<B> {
    fn before(&self, kind: CallKind, _bytes: u64) -> BackendResult<()> {
        self.calls[kind as usize].fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

adaptor!(Counting);

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
            counting.inner().counters().peak_used,
            2 << 20,
            "the calls reached the wrapped backend"
        );
    }
}
