//! The reserved ranges of a stream's pools, published in atomics, so that a
//! free finds the stream owning its pointer by address without taking any
//! stream's lock.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::DevicePtr;

/// The reserved ranges of a stream's two pools, as (base, end) pairs; 0, 0 when
/// none. Read by every free and written almost never, so it has its own cache
/// line.
#[derive(Debug, Default)]
#[repr(align(64))]
pub(crate) struct RangeTable([AtomicU64; 4]);

impl RangeTable {
    /// Publishes pool `pool`'s range (`None` when released).
    pub(crate) fn publish(&self, pool: usize, range: Option<(u64, u64)>) {
        let (base, size) = range.unwrap_or((0, 0));
        self.0[2 * pool].store(base, Ordering::Release);
        self.0[2 * pool + 1].store(base + size, Ordering::Release);
    }

    /// Whether `ptr` lies in one of the ranges.
    pub(crate) fn contains(&self, ptr: DevicePtr) -> bool {
        (0..2).any(|p| {
            let base = self.0[2 * p].load(Ordering::Acquire);
            base <= ptr && ptr < self.0[2 * p + 1].load(Ordering::Acquire)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_publish_and_clear() {
        let t = RangeTable::default();
        assert!(!t.contains(0));
        t.publish(1, Some((4096, 8192)));
        assert!(t.contains(4096) && t.contains(12287) && !t.contains(12288));
        t.publish(1, None);
        assert!(!t.contains(4096));
    }
}
