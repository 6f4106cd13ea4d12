//! The reserved ranges of a stream's pools, published in atomics, so that a
//! free finds the stream owning its pointer by address without taking any
//! stream's lock; and, for tables of many streams, every stream's ranges by
//! base address ([`Spans`]), so that the search does not visit them all.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::backend::DevicePtr;

/// The reserved ranges of a stream's two pools, as (base, end) pairs; 0, 0 when
/// none. Read by every free and written almost never, so it has its own cache
/// line. Each change is also written to the allocator's [`Spans`] under the
/// table's entry index.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct RangeTable {
    bounds: [AtomicU64; 4],
    spans: Arc<Spans>,
    entry: usize,
}

impl RangeTable {
    /// The ranges of entry `entry` of the stream table, none yet.
    pub(crate) fn new(spans: Arc<Spans>, entry: usize) -> RangeTable {
        RangeTable {
            bounds: Default::default(),
            spans,
            entry,
        }
    }

    /// Publishes pool `pool`'s range (`None` when released).
    pub(crate) fn publish(&self, pool: usize, range: Option<(u64, u64)>) {
        let (base, size) = range.unwrap_or((0, 0));
        let old = self.bounds[2 * pool].swap(base, Ordering::AcqRel);
        self.bounds[2 * pool + 1].store(base + size, Ordering::Release);
        self.spans.moved(old, range, self.entry);
    }

    /// Whether `ptr` lies in one of the ranges.
    pub(crate) fn contains(&self, ptr: DevicePtr) -> bool {
        (0..2).any(|p| {
            let base = self.bounds[2 * p].load(Ordering::Acquire);
            base <= ptr && ptr < self.bounds[2 * p + 1].load(Ordering::Acquire)
        })
    }
}

/// Every stream's reserved ranges by base address: (end, entry index). A
/// range is in it before any block of it is handed out and leaves it only
/// once the range holds nothing, so a free of a live block always finds it.
#[derive(Debug, Default)]
pub(crate) struct Spans(RwLock<BTreeMap<u64, (u64, usize)>>);

impl Spans {
    /// A range of entry `entry` that was at `old` (0: none) is now `range`.
    fn moved(&self, old: u64, range: Option<(u64, u64)>, entry: usize) {
        let mut map = self.0.write().unwrap_or_else(|e| e.into_inner());
        if old != 0 {
            map.remove(&old);
        }
        if let Some((base, size)) = range {
            map.insert(base, (base + size, entry));
        }
    }

    /// The entry index whose range holds `ptr`, if any.
    pub(crate) fn find(&self, ptr: DevicePtr) -> Option<usize> {
        let map = self.0.read().unwrap_or_else(|e| e.into_inner());
        let (_, &(end, entry)) = map.range(..=ptr).next_back()?;
        (ptr < end).then_some(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_publish_and_clear() {
        let spans = Arc::new(Spans::default());
        let t = RangeTable::new(spans.clone(), 3);
        assert!(!t.contains(0));
        t.publish(1, Some((4096, 8192)));
        assert!(t.contains(4096) && t.contains(12287) && !t.contains(12288));
        assert_eq!((spans.find(4096), spans.find(12287)), (Some(3), Some(3)));
        assert_eq!((spans.find(4095), spans.find(12288)), (None, None));
        t.publish(1, None);
        assert!(!t.contains(4096));
        assert_eq!(spans.find(4096), None);
    }

    #[test]
    fn spans_tell_many_streams_apart() {
        let spans = Arc::new(Spans::default());
        let tables: Vec<RangeTable> = (0..100)
            .map(|i| RangeTable::new(spans.clone(), i))
            .collect();
        for (i, t) in tables.iter().enumerate() {
            let base = (i as u64 + 1) << 30;
            t.publish(i % 2, Some((base, 1 << 29)));
        }
        for i in 0..100u64 {
            let base = (i + 1) << 30;
            assert_eq!(spans.find(base + 5), Some(i as usize));
            assert_eq!(spans.find(base + (1 << 29)), None, "past the range's end");
        }
    }
}
