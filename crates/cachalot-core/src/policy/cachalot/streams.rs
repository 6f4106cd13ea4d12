//! Finding a stream's state: by stream and pool for an allocation (made at
//! the stream's first one), by address for a free; and running an operation
//! under the stream's lock, its changes journaled for the device's peaks.

use std::sync::atomic::Ordering;

use crate::backend::{DevicePtr, StreamId};
use crate::error::{Error, FreeError, Result};
use crate::stats::MemoryStats;

use super::directory::StreamEntry;
use super::stats::journal::Fill;
use super::stats::ledger::Ledger;
use super::stream::StreamState;
use super::CachalotAllocator;

impl CachalotAllocator {
    /// Runs `f` under the lock of the state of `stream` in pool slot
    /// `pool` (made at the stream's first use), journaled. An entry found
    /// for it that was taken over by another stream meanwhile (`directory`)
    /// is looked for again.
    #[inline(always)]
    pub(super) fn on_stream<T>(
        &self,
        stream: StreamId,
        pool: u32,
        mut f: impl FnMut(&mut StreamState) -> T,
    ) -> T {
        loop {
            let entry = match self.streams.get(stream, pool) {
                Some(entry) => entry,
                None => self.new_entry(stream, pool),
            };
            if let Some(out) = self.journaled(entry, |st| st.is(stream, pool).then(|| f(st))) {
                return out;
            }
        }
    }

    /// [`CachalotAllocator::on_stream`] when the state of `stream` in pool
    /// slot `pool` exists; `None` (and `f` not run) otherwise.
    pub(super) fn on_existing<T>(
        &self,
        stream: StreamId,
        pool: u32,
        f: impl FnOnce(&mut StreamState) -> T,
    ) -> Option<T> {
        let entry = self.streams.get(stream, pool)?;
        self.journaled(entry, |st| st.is(stream, pool).then(|| f(st)))
    }

    /// The entry of a stream seen for the first time: an idle one taken
    /// over, or a new one (built out of the hot path's way: a stream's
    /// state is kilobytes).
    #[cold]
    #[inline(never)]
    fn new_entry(&self, stream: StreamId, pool: u32) -> &StreamEntry {
        let source = if pool == 0 {
            None
        } else {
            self.book().source(pool)
        };
        if source.is_some() {
            self.sourced_lanes.store(true, Ordering::Relaxed);
        }
        // Streams are created one at a time, under the merge state's lock.
        let mut merged = self.journal.lock();
        let make = |ranges| {
            // A second entry: the device's peaks are merged from now on.
            if merged.is_none() {
                if let Some(only) = self.streams.iter().next() {
                    only.lock().ledger.start_merging(&self.journal, &mut merged);
                }
            }
            let mut ledger = Ledger::new(
                MemoryStats::new(self.config.max_split_size),
                stream,
                self.start,
            );
            ledger.set_observer(
                self.observer
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone(),
            );
            if merged.is_some() {
                ledger.keep_journal(&self.journal);
            }
            StreamState::new(
                stream,
                ledger,
                self.stream_config,
                ranges,
                pool,
                source.clone(),
            )
        };
        self.streams.get_or_create(stream, pool, &source, make)
    }

    /// Runs `f` under the lock of the stream owning `ptr`: the stream whose
    /// range holds it, else (for segments) each in turn until one knows it.
    pub(super) fn with_owner<T>(
        &self,
        ptr: DevicePtr,
        f: impl FnMut(&mut StreamState) -> std::result::Result<T, FreeError>,
    ) -> Result<T> {
        match self.streams.owner_of(ptr) {
            Some(entry) => self
                .journaled(entry, f)
                .map_err(|reason| Error::InvalidFree { ptr, reason }),
            None => self.ask_every_stream(ptr, f),
        }
    }

    /// [`CachalotAllocator::with_owner`] when no stream's range holds `ptr`:
    /// without virtual memory, or once a pool has an allocator of its own
    /// (its segments lie in no range), each stream in turn until one knows it.
    #[cold]
    #[inline(never)]
    fn ask_every_stream<T>(
        &self,
        ptr: DevicePtr,
        mut f: impl FnMut(&mut StreamState) -> std::result::Result<T, FreeError>,
    ) -> Result<T> {
        let mut reason = FreeError::Foreign;
        if self.pages.granularity() == 0 || self.sourced_lanes.load(Ordering::Relaxed) {
            for entry in self.streams.iter() {
                match f(&mut entry.lock()) {
                    Ok(v) => return Ok(v),
                    Err(FreeError::DoubleFree) => reason = FreeError::DoubleFree,
                    Err(FreeError::Foreign) => {}
                }
            }
        }
        Err(Error::InvalidFree { ptr, reason })
    }

    /// Runs `f` under `entry`'s lock, then merges the journals if the
    /// stream's is full.
    #[inline(always)]
    pub(super) fn journaled<T>(
        &self,
        entry: &StreamEntry,
        f: impl FnOnce(&mut StreamState) -> T,
    ) -> T {
        let early = self.journal.early_stamp();
        let (out, fill) = {
            let mut st = entry.lock();
            st.ledger.begin_op(early);
            let out = f(&mut st);
            st.ledger.end_op();
            (out, st.ledger.journal().map_or(Fill::Room, |j| j.fill()))
        };
        if fill != Fill::Room {
            self.merge_when_full(fill);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::backend::sim::SimBackend;
    use crate::config::AllocatorConfig;
    use crate::device_allocator::{DeviceAllocator, PrivatePools};
    use crate::private_pool::PoolId;

    use super::*;

    const MIB: u64 = 1 << 20;

    /// Streams that come and go (a server's per-request streams, a private
    /// pool per capture) take over the entries of those that emptied: the
    /// table holds as many entries as streams hold memory at once.
    #[test]
    fn emptied_streams_and_lanes_are_taken_over() {
        let sim = Arc::new(SimBackend::new(1 << 30));
        let alloc = CachalotAllocator::new(sim.clone(), AllocatorConfig::default()).unwrap();
        let held = alloc.malloc(MIB, StreamId(0)).unwrap();
        for s in 1..2000 {
            let p = alloc.malloc(3 * MIB, StreamId(s)).unwrap();
            alloc.free(p).unwrap();
            alloc.empty_cache().unwrap();
        }
        assert_eq!(alloc.streams.iter().count(), 2, "stream 0 and one other");
        for k in 0..500 {
            let pool = PoolId(1, k);
            alloc
                .begin_allocate_to_pool(pool, Arc::new(|_| true))
                .unwrap();
            let p = alloc.malloc(3 * MIB, StreamId(7)).unwrap();
            alloc.end_allocate_to_pool(pool).unwrap();
            alloc.free(p).unwrap();
            alloc.release_pool(pool).unwrap();
            alloc.empty_cache().unwrap();
        }
        assert_eq!(alloc.streams.iter().count(), 2);
        alloc.validate().unwrap();
        alloc.free(held).unwrap();
        assert_eq!(alloc.stats().allocated_bytes.all.peak as u64, 4 * MIB);
        alloc.empty_cache().unwrap();
        assert_eq!(sim.live_objects(), 0);
    }

    /// An entry taken over by another stream after it was found (without
    /// a lock) is found out under the lock, and the operation goes to the
    /// stream's own state.
    #[test]
    fn an_entry_taken_over_meanwhile_is_looked_for_again() {
        let sim = Arc::new(SimBackend::new(1 << 30));
        let alloc = CachalotAllocator::new(sim, AllocatorConfig::default()).unwrap();
        let (a, b) = (StreamId(1), StreamId(2));
        alloc.on_stream(a, 0, |_| ());
        let stale = alloc.streams.get(a, 0).unwrap();
        let taken = alloc.streams.get_or_create(b, 0, &None, |_| {
            unreachable!("a's empty entry is taken over")
        });
        assert!(std::ptr::eq(taken, stale), "empty: taken over by b");
        let ran = alloc.journaled(stale, |st| st.is(a, 0));
        assert!(!ran, "the stale entry is b's now");
        let on = alloc.on_stream(a, 0, |st| st.stream());
        assert_eq!(on, a);
        alloc.validate().unwrap();
    }
}
