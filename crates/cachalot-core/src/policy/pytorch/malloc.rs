//! `malloc`: the cache, then new memory, then the retry chain, then out-of-memory.

use crate::backend::{DevicePtr, StreamId};
use crate::config::PolicyKind;
use crate::error::{check_request, Error, FailedRequest, OomReport, Result};
use crate::private_pool::PoolOptions;

use super::block::BlockId;
use super::placement::{allocation_size, is_small};
use super::state::{Request, State};

impl State {
    /// Allocates `size` bytes for `stream`, following PyTorch's order: reclaim
    /// completed cross-stream frees (during a capture, the frees the graph has
    /// ordered before this stream's next work); best fit from the cache; garbage collection;
    /// a new segment; release cached oversize segments and retry; synchronize and
    /// release every cached segment and retry; out-of-memory.
    pub(crate) fn malloc(&mut self, size: u64, stream: StreamId) -> Result<DevicePtr> {
        if size == 0 {
            return Ok(0);
        }
        check_request(size)?;
        if self.book.routing() {
            self.reuse_captured_frees(stream)?;
        } else {
            self.process_events()?;
        }
        let rounded = self.placement.round_size(size);
        let (pool, options) = self.route(stream);
        self.refuse_paused(pool, size)?;
        if pool != 0 {
            self.note_capture_into(pool, stream);
        }
        let req = Request {
            size: rounded,
            requested: size,
            small: is_small(rounded),
            stream,
            alloc_size: allocation_size(rounded),
            pool,
            expandable: self.placement.expandable && self.book.source(pool).is_none(),
        };
        let found = match self.get_free_block(&req) {
            Some(id) => Some((id, options)),
            None => self.obtain(&req, options)?,
        };
        let Some((id, options)) = found else {
            return Err(self.out_of_memory(&req));
        };
        let b = &self.blocks[id];
        let expandable = req.expandable && b.pool == req.pool;
        let split = !options.no_split
            && self
                .placement
                .should_split(req.small, expandable, b.size, req.size);
        Ok(self.alloc_found_block(id, &req, split))
    }

    /// The retry chain after a cache miss: the block found and the options of
    /// the pool it came from. The last step (release every cached segment)
    /// is skipped while a route is open, as PyTorch skips it during a capture.
    fn obtain(
        &mut self,
        req: &Request,
        options: PoolOptions,
    ) -> Result<Option<(BlockId, PoolOptions)>> {
        if self.gc_enabled() {
            self.garbage_collect()?;
        }
        if let Some(id) = self.alloc_block(req, false)? {
            return Ok(Some((id, options)));
        }
        if req.pool == 0 {
            if let Some(found) = self.borrow_for_oom(req) {
                return Ok(Some(found));
            }
        }
        if self.release_available_cached_blocks(req)? {
            if let Some(id) = self.alloc_block(req, false)? {
                return Ok(Some((id, options)));
            }
        }
        if self.book.routing() {
            return Ok(None);
        }
        self.release_cached_blocks()?;
        Ok(self.alloc_block(req, true)?.map(|id| (id, options)))
    }

    /// Counts and reports an out-of-memory failure.
    fn out_of_memory(&mut self, req: &Request) -> Error {
        let failed = FailedRequest {
            requested: req.requested,
            alloc_size: req.alloc_size,
            stream: req.stream,
        };
        let report = OomReport::of(
            failed,
            self.backend.as_ref(),
            &self.ledger.stats,
            self.allowed,
            &self.config_source,
            PolicyKind::Pytorch,
        );
        self.ledger
            .out_of_memory(req.requested, report.device_free, req.stream);
        Error::OutOfMemory(Box::new(report))
    }
}
