//! Finding a stream's state: by stream and pool for an allocation (made at
//! the stream's first one), by address for a free; and running an operation
//! under the stream's lock, its changes journaled for the device's peaks.

use crate::backend::{DevicePtr, StreamId};
use crate::error::{Error, FreeError, Result};
use crate::stats::MemoryStats;

use super::directory::{StreamEntry, MAX_STREAMS};
use super::stats::journal::Fill;
use super::stats::ledger::Ledger;
use super::stream::StreamState;
use super::CachalotAllocator;

impl CachalotAllocator {
    pub(super) fn entry(&self, stream: StreamId, pool: u32) -> Result<&StreamEntry> {
        match self.streams.get(stream, pool) {
            Some(entry) => Ok(entry),
            None => self.new_entry(stream, pool),
        }
    }

    /// The entry of a stream seen for the first time (built out of the hot
    /// path's way: a stream's state is kilobytes).
    #[cold]
    #[inline(never)]
    fn new_entry(&self, stream: StreamId, pool: u32) -> Result<&StreamEntry> {
        // Streams are created one at a time, under the merge state's lock.
        let mut merged = self.journal.lock();
        if let Some(entry) = self.streams.get(stream, pool) {
            return Ok(entry);
        }
        if merged.is_none() {
            if let Some(only) = self.streams.iter().next() {
                only.lock().ledger.start_merging(&self.journal, &mut merged);
            }
        }
        let several = merged.is_some();
        let make = |ranges| {
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
            if several {
                ledger.keep_journal(&self.journal);
            }
            StreamState::new(stream, ledger, self.stream_config, ranges, pool != 0)
        };
        self.streams
            .get_or_create(stream, pool, make)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                "more than {MAX_STREAMS} streams (counting each private pool's apart) on one device"
            ))
            })
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
    /// without virtual memory, each stream in turn until one knows it.
    #[cold]
    #[inline(never)]
    fn ask_every_stream<T>(
        &self,
        ptr: DevicePtr,
        mut f: impl FnMut(&mut StreamState) -> std::result::Result<T, FreeError>,
    ) -> Result<T> {
        let mut reason = FreeError::Foreign;
        if self.pages.granularity() == 0 {
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
