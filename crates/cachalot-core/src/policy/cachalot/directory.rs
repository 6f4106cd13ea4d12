//! The streams of one allocator, found without a lock: a table of entries
//! that grows in chunks (no bound on the number of streams), and the
//! reserved ranges of each stream published in atomics so a free finds its
//! stream by address without touching the others.
//!
//! An entry is never freed, but it is *recycled*: a stream (or a private
//! pool's lane) that holds nothing (no block, no page, no segment, no free
//! waiting for another stream) is taken over by the next new stream or
//! lane, so a program that goes through many streams over its life (a
//! server's per-request streams, a CUDA graph's private pool per capture)
//! has as many entries as it has streams holding memory at once. An entry's
//! key may thus change under a reader that found it without a lock: what
//! holds it is the state's own key, read under the state's lock
//! ([`StreamState::is`]).
//!
//! A few streams are found by a scan of the table (a handful of loads);
//! past [`SCANNED`] entries, by an index of keys and one of ranges
//! ([`Spans`]), and a new stream looks for an idle entry to take over among
//! at most [`PROBES`] of them, from where the last search stopped: a process
//! with a hundred thousand streams holding memory at once makes each new one
//! in constant time, not in time growing with the table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};

use spin::mutex::{SpinMutex, SpinMutexGuard};
use spin::relax::Yield;

use crate::backend::{DevicePtr, StreamId};
use crate::private_pool::SegmentSource;

use super::stream::StreamState;
use super::vm::ranges::{RangeTable, Spans};

thread_local! {
    /// (directory address, entry index) of the stream this thread's last
    /// `owner_of` found: a hint, checked before use.
    static LAST_OWNER: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// Entries in the table's first chunk; each next chunk holds twice as many
/// as the one before.
const FIRST_CHUNK: usize = 8;

/// Chunks at most: `FIRST_CHUNK << CHUNKS` entries, more than any process
/// could hold.
const CHUNKS: usize = 48;

/// Entries found by a scan of the table; past them, through the indexes.
const SCANNED: usize = 16;

/// Entries a new stream looks at for one to take over.
const PROBES: usize = 64;

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
    /// The stream, as last published (see the module docs).
    stream: AtomicU64,
    /// The private pool's slot (0: the default pools), as last published.
    pool: AtomicU32,
    /// Where its pools' ranges are.
    pub(crate) ranges: Arc<RangeTable>,
    state: Isolated<StreamLock>,
}

impl StreamEntry {
    /// Locks the stream's state. (A spin lock is not poisoned: a panic in
    /// another thread cannot leave the state half-changed in a way `validate`
    /// would not report.)
    pub(crate) fn lock(&self) -> SpinMutexGuard<'_, StreamState> {
        self.state.0.lock()
    }

    /// Whether the entry was last published for `stream` in slot `pool` (a
    /// hint: [`StreamState::is`] holds under the lock).
    #[inline(always)]
    fn keyed(&self, stream: StreamId, pool: u32) -> bool {
        self.stream.load(Ordering::Acquire) == stream.0 && self.pool.load(Ordering::Acquire) == pool
    }

    /// The private pool slot the entry was last published for (0: the
    /// default pools); a hint, as [`StreamEntry::keyed`].
    pub(crate) fn slot(&self) -> u32 {
        self.pool.load(Ordering::Acquire)
    }

    fn publish(&self, stream: StreamId, pool: u32) {
        self.stream.store(stream.0, Ordering::Release);
        self.pool.store(pool, Ordering::Release);
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Directory {
    /// Chunk `k` holds entries `FIRST_CHUNK * (2^k - 1)` on, `FIRST_CHUNK
    /// << k` of them.
    chunks: [OnceLock<Box<[OnceLock<StreamEntry>]>>; CHUNKS],
    len: AtomicUsize,
    grow: Mutex<()>,
    /// Each entry's published key, to its index (written under `grow`).
    keys: RwLock<HashMap<(u64, u32), usize>>,
    /// Every entry's ranges.
    spans: Arc<Spans>,
    /// Where the next search for an idle entry starts.
    cursor: AtomicUsize,
}

impl Default for Directory {
    fn default() -> Self {
        Directory {
            chunks: std::array::from_fn(|_| OnceLock::new()),
            len: AtomicUsize::new(0),
            grow: Mutex::new(()),
            keys: RwLock::default(),
            spans: Arc::default(),
            cursor: AtomicUsize::new(0),
        }
    }
}

/// The chunk of entry `i` and its index there.
fn locate(i: usize) -> (usize, usize) {
    let k = (i / FIRST_CHUNK + 1).ilog2() as usize;
    (k, i - FIRST_CHUNK * ((1 << k) - 1))
}

impl Directory {
    /// Every stream entry, in creation order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &StreamEntry> {
        let len = self.len.load(Ordering::Acquire);
        self.chunks
            .iter()
            .map_while(OnceLock::get)
            .flat_map(|chunk| chunk.iter())
            .take(len)
            .filter_map(OnceLock::get)
    }

    /// Entry `i`, if it exists.
    fn at(&self, i: usize) -> Option<&StreamEntry> {
        let (k, j) = locate(i);
        self.chunks.get(k)?.get()?.get(j)?.get()
    }

    /// The entry last published for `stream` in pool slot `pool`, if any
    /// (see the module docs).
    #[inline(always)]
    pub(crate) fn get(&self, stream: StreamId, pool: u32) -> Option<&StreamEntry> {
        if self.len.load(Ordering::Acquire) <= SCANNED {
            return self.iter().find(|e| e.keyed(stream, pool));
        }
        self.get_indexed(stream, pool)
    }

    /// [`Directory::get`] through the index of keys.
    #[cold]
    #[inline(never)]
    fn get_indexed(&self, stream: StreamId, pool: u32) -> Option<&StreamEntry> {
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        let i = *keys.get(&(stream.0, pool))?;
        self.at(i).filter(|e| e.keyed(stream, pool))
    }

    /// Publishes entry `i` for `stream` in slot `pool` (under `grow`), in the
    /// entry and in the index of keys.
    fn publish(&self, i: usize, e: &StreamEntry, stream: StreamId, pool: u32) {
        let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
        let old = (
            e.stream.load(Ordering::Acquire),
            e.pool.load(Ordering::Acquire),
        );
        if keys.get(&old) == Some(&i) {
            keys.remove(&old);
        }
        e.publish(stream, pool);
        keys.insert((stream.0, pool), i);
    }

    /// An idle entry taken over for `stream` in slot `pool` (under `grow`):
    /// one of at most [`PROBES`] entries from where the last search stopped.
    fn take_over(
        &self,
        stream: StreamId,
        pool: u32,
        source: &Option<Arc<dyn SegmentSource>>,
    ) -> Option<&StreamEntry> {
        let len = self.len.load(Ordering::Acquire);
        let start = self.cursor.load(Ordering::Relaxed) % len.max(1);
        for k in 0..len.min(PROBES) {
            let i = (start + k) % len;
            let Some(e) = self.at(i) else { continue };
            if e.lock().recycle(stream, pool, source) {
                self.cursor.store(i + 1, Ordering::Relaxed);
                self.publish(i, e, stream, pool);
                return Some(e);
            }
        }
        self.cursor
            .store(start + len.min(PROBES), Ordering::Relaxed);
        None
    }

    /// The entry of `stream` in pool slot `pool`: the one published for
    /// it; else an idle entry taken over ([`StreamState::recycle`], for a
    /// pool whose segments come from `source`); else a new one, made with
    /// `make`.
    pub(crate) fn get_or_create(
        &self,
        stream: StreamId,
        pool: u32,
        source: &Option<Arc<dyn SegmentSource>>,
        make: impl FnOnce(Arc<RangeTable>) -> StreamState,
    ) -> &StreamEntry {
        let _guard = self.freeze();
        if let Some(e) = self.get(stream, pool) {
            return e;
        }
        if let Some(e) = self.take_over(stream, pool, source) {
            return e;
        }
        let n = self.len.load(Ordering::Acquire);
        let (k, j) = locate(n);
        let chunk =
            self.chunks[k].get_or_init(|| (0..FIRST_CHUNK << k).map(|_| OnceLock::new()).collect());
        let ranges = Arc::new(RangeTable::new(self.spans.clone(), n));
        let state = Isolated(StreamLock::new(make(ranges.clone())));
        let entry = chunk[j].get_or_init(|| StreamEntry {
            stream: AtomicU64::new(stream.0),
            pool: AtomicU32::new(pool),
            ranges,
            state,
        });
        self.keys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert((stream.0, pool), n);
        self.len.store(n + 1, Ordering::Release);
        entry
    }

    /// Takes the entries of pool slot `slot` out of lookups: the pool was
    /// forgotten (its lanes hold nothing) and its slot may go to a new pool,
    /// whose lanes must not find these, made for another pool (another
    /// allocator of its own, or none). They wait to be taken over
    /// ([`StreamState::recycle`]).
    pub(crate) fn retire_slot(&self, slot: u32) {
        let _guard = self.freeze();
        let retired: Vec<usize> = (0..self.len.load(Ordering::Acquire))
            .filter(|i| self.at(*i).is_some_and(|e| e.slot() == slot))
            .collect();
        for i in retired {
            let Some(e) = self.at(i) else { continue };
            e.lock().retire();
            self.publish(i, e, StreamId(u64::MAX), u32::MAX);
        }
    }

    /// Holds off new streams (and the recycling of entries) while the
    /// guard lives.
    pub(crate) fn freeze(&self) -> MutexGuard<'_, ()> {
        self.grow.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stream whose reserved range holds `ptr`, if any. With several
    /// streams, the one this thread found last is tried first (threads mostly
    /// free what they allocated on their own stream), then the others in
    /// table order.
    pub(crate) fn owner_of(&self, ptr: DevicePtr) -> Option<&StreamEntry> {
        let len = self.len.load(Ordering::Acquire);
        if len == 1 {
            // One stream (the common case): no hint to read (a thread-local
            // costs a call in a shared library, as in the PyTorch plug-in).
            return self.at(0).filter(|e| e.ranges.contains(ptr));
        }
        let me = self as *const Directory as usize;
        let (dir, hint) = LAST_OWNER.get();
        if dir == me && hint < len {
            if let Some(e) = self.at(hint).filter(|e| e.ranges.contains(ptr)) {
                return Some(e);
            }
        }
        let (i, e) = if len <= SCANNED {
            self.iter()
                .enumerate()
                .find(|(_, e)| e.ranges.contains(ptr))?
        } else {
            let i = self.spans.find(ptr)?;
            (i, self.at(i).filter(|e| e.ranges.contains(ptr))?)
        };
        LAST_OWNER.set((me, i));
        Some(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_double_and_cover_every_index() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(FIRST_CHUNK - 1), (0, FIRST_CHUNK - 1));
        assert_eq!(locate(FIRST_CHUNK), (1, 0));
        assert_eq!(locate(3 * FIRST_CHUNK - 1), (1, 2 * FIRST_CHUNK - 1));
        assert_eq!(locate(3 * FIRST_CHUNK), (2, 0));
        let mut next = (0, 0);
        for i in 0..100_000 {
            let (k, j) = locate(i);
            assert!(j < FIRST_CHUNK << k);
            assert!((k, j) == next || (k, j) == (next.0 + 1, 0), "{i}");
            next = (k, j + 1);
        }
    }
}
