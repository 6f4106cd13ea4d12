//! The streams of one allocator, found without a lock: a fixed table of entries
//! filled once each, and the reserved ranges of each stream published in
//! atomics so a free finds its stream by address without touching the others.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

use spin::mutex::{SpinMutex, SpinMutexGuard};
use spin::relax::Yield;

use crate::backend::{DevicePtr, StreamId};

use super::stream::StreamState;
use super::vm::ranges::RangeTable;

thread_local! {
    /// (directory address, entry index) of the stream this thread's last
    /// `owner_of` found: a hint, checked before use.
    static LAST_OWNER: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// Streams one allocator serves at most.
pub(crate) const MAX_STREAMS: usize = 256;

/// A stream's state on cache lines of its own, so that the stream's writes
/// (its lock, its statistics) never share a line with what other threads read
/// to find their own streams (false sharing).
#[derive(Debug)]
#[repr(align(128))]
struct Isolated<T>(T);

/// A stream's lock: held for well under a microsecond on the hot path, so
/// a spin lock (one atomic exchange to take, a plain store to give back)
/// beats a futex mutex, whose release is a second atomic exchange. A waiter
/// yields its time slice while it spins, so a long hold (a driver call on a
/// slow path) does not burn a core.
type StreamLock = SpinMutex<StreamState, Yield>;

/// One stream's state behind its own lock: a stream's default pools, or its
/// pools of one private pool (a *lane* of that private pool).
#[derive(Debug)]
pub(crate) struct StreamEntry {
    /// The stream.
    pub(crate) stream: StreamId,
    /// The private pool's slot (0: the default pools).
    pub(crate) pool: u32,
    /// Where its pools' ranges are.
    pub(crate) ranges: std::sync::Arc<RangeTable>,
    state: Isolated<StreamLock>,
}

impl StreamEntry {
    /// Locks the stream's state. (A spin lock is not poisoned: a panic in
    /// another thread cannot leave the state half-changed in a way `validate`
    /// would not report.)
    pub(crate) fn lock(&self) -> SpinMutexGuard<'_, StreamState> {
        self.state.0.lock()
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Directory {
    entries: Box<[OnceLock<StreamEntry>]>,
    len: AtomicUsize,
    grow: Mutex<()>,
}

impl Default for Directory {
    fn default() -> Self {
        Directory {
            entries: (0..MAX_STREAMS).map(|_| OnceLock::new()).collect(),
            len: AtomicUsize::new(0),
            grow: Mutex::new(()),
        }
    }
}

impl Directory {
    /// Every stream entry, in creation order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &StreamEntry> {
        self.entries[..self.len.load(Ordering::Acquire)]
            .iter()
            .filter_map(OnceLock::get)
    }

    /// The entry of `stream` in pool slot `pool`, if it exists.
    pub(crate) fn get(&self, stream: StreamId, pool: u32) -> Option<&StreamEntry> {
        self.iter().find(|e| e.stream == stream && e.pool == pool)
    }

    /// The entry of `stream` in pool slot `pool`, created with `make` when
    /// new; `None` when the table is full.
    pub(crate) fn get_or_create(
        &self,
        stream: StreamId,
        pool: u32,
        make: impl FnOnce(std::sync::Arc<RangeTable>) -> StreamState,
    ) -> Option<&StreamEntry> {
        if let Some(e) = self.get(stream, pool) {
            return Some(e);
        }
        let _guard = self.grow.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = self.get(stream, pool) {
            return Some(e);
        }
        let n = self.len.load(Ordering::Acquire);
        let next = self.entries.get(n)?;
        let ranges = std::sync::Arc::new(RangeTable::default());
        let state = Isolated(StreamLock::new(make(ranges.clone())));
        let entry = next.get_or_init(|| StreamEntry {
            stream,
            pool,
            ranges,
            state,
        });
        self.len.store(n + 1, Ordering::Release);
        Some(entry)
    }

    /// Holds off new streams while the guard lives.
    pub(crate) fn freeze(&self) -> MutexGuard<'_, ()> {
        self.grow.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stream whose reserved range holds `ptr`, if any. With several
    /// streams, the one this thread found last is tried first (threads mostly
    /// free what they allocated on their own stream), then the others in
    /// table order.
    pub(crate) fn owner_of(&self, ptr: DevicePtr) -> Option<&StreamEntry> {
        let entries = &self.entries[..self.len.load(Ordering::Acquire)];
        if let [only] = entries {
            // One stream (the common case): no hint to read (a thread-local
            // costs a call in a shared library, as in the PyTorch plug-in).
            return only.get().filter(|e| e.ranges.contains(ptr));
        }
        let me = self as *const Directory as usize;
        let (dir, hint) = LAST_OWNER.get();
        if dir == me {
            let hinted = entries.get(hint).and_then(OnceLock::get);
            if let Some(e) = hinted.filter(|e| e.ranges.contains(ptr)) {
                return Some(e);
            }
        }
        let (i, e) = entries
            .iter()
            .enumerate()
            .find_map(|(i, e)| e.get().filter(|e| e.ranges.contains(ptr)).map(|e| (i, e)))?;
        LAST_OWNER.set((me, i));
        Some(e)
    }
}
