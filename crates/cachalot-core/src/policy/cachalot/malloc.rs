//! `malloc` on the device: the stream's own memory, then a private pool
//! that lends, then every stream's cached memory given back, then out of
//! memory.

use crate::backend::{DevicePtr, StreamId};
use crate::config::PolicyKind;
use crate::error::{check_request, Error, FailedRequest, OomReport, Result};

use super::pool::ROUNDING;
use super::CachalotAllocator;
use crate::device_allocator::DeviceAllocator;

impl CachalotAllocator {
    /// Allocates `size` bytes on `stream`, from the first of:
    ///
    /// 1. the stream's own memory (`StreamState::malloc_mapped`: kept
    ///    blocks, mapped free space, its cached pages, new pages);
    /// 2. the lane of the stream of a private pool that lends on out of
    ///    memory;
    /// 3. (not while a route to a private pool is open) the same, once
    ///    every stream gave its cached memory back to the device;
    ///
    /// then out of memory. A request larger than the device could ever
    /// hold fails at once, before any driver call.
    pub(super) fn allocate(&self, size: u64, stream: StreamId) -> Result<DevicePtr> {
        if size == 0 {
            return Ok(0);
        }
        check_request(size)?;
        let (pool, unit) = if self.pages.quiet() {
            self.route(stream)
        } else {
            (0, ROUNDING)
        };
        let rounded = size.div_ceil(unit) * unit;
        if !self.pages.ever_fits(rounded) {
            return Err(self.out_of_memory(stream, pool, size, rounded));
        }
        let first = self.on_stream(stream, pool, |st| st.malloc(&self.pages, rounded, size));
        match first {
            Ok(ptr) => Ok(ptr),
            Err(e) if !e.is_out_of_memory() => Err((*e).into()),
            Err(_) => self.retry_malloc(stream, pool, rounded, size),
        }
    }

    /// Returns the cached memory of every stream's default pools and of every
    /// freeable private pool to the device (nothing while quiet: that would
    /// wait for streams during a capture).
    pub(super) fn flush_all(&self) -> Result<()> {
        if self.pages.quiet() {
            return Ok(());
        }
        let live = self.live_pool_slots();
        for entry in self.streams.iter() {
            self.journaled(entry, |st| match live.contains(&st.slot()) {
                true => st.finish_frees(&self.pages),
                false => st.empty_cache(&self.pages),
            })?;
        }
        self.forget_empty_freeable_pools();
        Ok(self.pages.retry_orphans()?)
    }

    /// After a first attempt ran out of memory: flush every stream's cache
    /// and try once more (out of the hot path's way).
    #[cold]
    #[inline(never)]
    fn retry_malloc(
        &self,
        stream: StreamId,
        pool: u32,
        rounded: u64,
        size: u64,
    ) -> Result<DevicePtr> {
        if pool == 0 {
            if let Some(ptr) = self.borrow_for_oom(stream, rounded, size)? {
                return Ok(ptr);
            }
        }
        if self.pages.quiet() {
            return Err(self.out_of_memory(stream, pool, size, rounded));
        }
        self.on_stream(stream, pool, |st| st.ledger.retried());
        self.flush_all()?;
        let second = self.on_stream(stream, pool, |st| st.malloc(&self.pages, rounded, size));
        match second {
            Ok(ptr) => Ok(ptr),
            // "Tried to allocate" is the block, as PyTorch reports it.
            Err(e) if e.is_out_of_memory() => Err(self.out_of_memory(stream, pool, size, rounded)),
            Err(e) => Err((*e).into()),
        }
    }

    /// Counts an out-of-memory failure of `stream` in pool slot `pool` and
    /// reports it.
    fn out_of_memory(&self, stream: StreamId, pool: u32, requested: u64, alloc_size: u64) -> Error {
        let failed = FailedRequest {
            requested,
            alloc_size,
            stream,
        };
        let report = OomReport::of(
            failed,
            self.backend.as_ref(),
            &self.stats(),
            self.pages.limit(),
            &self.config.source,
            PolicyKind::Cachalot,
        );
        self.on_stream(stream, pool, |st| {
            st.ledger.out_of_memory(requested, report.device_free);
        });
        Error::OutOfMemory(Box::new(report))
    }
}
