//! The `pytorch` policy: PyTorch 2.11's native CUDA caching allocator, reproduced
//! exactly, statistics included.
//!
//! * Requests are rounded to 512 bytes (or to `roundup_power2_divisions` steps);
//!   requests of 1 MiB or less use the small pool, which carves 2 MiB segments;
//!   larger ones use the large pool: 20 MiB segments for requests under 10 MiB,
//!   segments of the request's size rounded to 2 MiB above.
//! * A request takes the best-fit cached block of its stream, ordered by (stream,
//!   size, segment age, address); blocks at least `max_split_size` serve only
//!   requests within `max_non_split_rounding` of their size and are never split.
//! * On a miss: garbage collection (with a memory fraction and a threshold), a new
//!   segment, then release of cached oversize segments and a retry, then
//!   synchronization of every event, release of every cached segment and a last
//!   retry, then out-of-memory.
//! * With `expandable_segments` (on backends with virtual memory) each (stream,
//!   pool) grows one reserved range by mapping pages instead.
//! * A block freed after `record_stream` returns to its pool when events recorded
//!   on the other streams complete; they are polled at each `malloc`.
//!   Freed while a route (a capture) is open, it waits for the route's end;
//!   with `graph_capture_record_stream_reuse`, only until the capture's graph
//!   orders the stream's next work after the other streams' uses
//!   (`capture_reuse.rs`).
//! * A private pool may be a tag ([`crate::sleep`]): its segments are pages of
//!   cachalot's own, which a pause gives back and a resume brings back at the
//!   same addresses, the blocks unchanged (not PyTorch's: cachalot's own).
//!
//! One mutex guards the state, as in PyTorch.

mod arena;
mod block;
mod capture_reuse;
mod event_queues;
mod expandable;
mod grow;
mod hash_order;

pub use hash_order::c10_stream_hash;
mod ledger;
mod malloc;
mod order;
mod placement;
mod pool;
mod private;
mod release;
mod share;
mod sleep;
mod snapshot;
mod state;
mod streams;
mod validate;

use std::sync::{Arc, Mutex, MutexGuard};

use crate::backend::{Backend, DevicePtr, StreamId};
use crate::backing::Backing;
use crate::config::{AllocatorConfig, PlacementSettings, PolicyKind};
use crate::device_allocator::{DeviceAllocator, PrivatePools, Tags};
use crate::error::{Error, InvariantViolation, Result};
use crate::event::Observer;
use crate::private_pool::{PoolAllocation, PoolId, PoolOptions, RouteFilter, SegmentSource};
use crate::sleep::{Backup, SleepReport, TagState, WhenBusy};
use crate::snapshot::MemorySnapshot;
use crate::stats::MemoryStats;

use state::State;

/// PyTorch's caching allocator for one device. See the module docs.
#[derive(Debug)]
pub struct PytorchAllocator {
    backend: Arc<dyn Backend>,
    config: AllocatorConfig,
    state: Mutex<State>,
}

impl PytorchAllocator {
    /// An allocator serving `backend` under `config`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `config` names another policy or holds a
    /// memory fraction outside `[0, 1]`.
    pub fn new(backend: Arc<dyn Backend>, config: AllocatorConfig) -> Result<Self> {
        if config.policy != PolicyKind::Pytorch {
            return Err(Error::InvalidArgument(format!(
                "the pytorch allocator cannot run policy {}",
                config.policy
            )));
        }
        check_fraction(config.per_process_memory_fraction)?;
        let state = Mutex::new(State::new(backend.clone(), &config));
        Ok(PytorchAllocator {
            backend,
            config,
            state,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every state change completes before the lock is released or fails as a
        // whole, so a poisoned lock still guards consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn check_fraction(fraction: f64) -> Result<()> {
    if (0.0..=1.0).contains(&fraction) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "memory fraction {fraction} is outside [0, 1]"
        )))
    }
}

impl Drop for PytorchAllocator {
    fn drop(&mut self) {
        self.lock().destroy_events();
    }
}

impl DeviceAllocator for PytorchAllocator {
    fn policy(&self) -> PolicyKind {
        PolicyKind::Pytorch
    }

    fn config(&self) -> &AllocatorConfig {
        &self.config
    }

    fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    fn set_placement_settings(&self, settings: &PlacementSettings) {
        self.lock()
            .set_placement(&self.config.with_placement_settings(settings));
    }

    fn malloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr> {
        self.lock().malloc(size, stream)
    }

    fn free(&self, ptr: DevicePtr) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        self.lock().free(ptr)
    }

    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<()> {
        self.lock().record_stream(ptr, stream)
    }

    fn empty_cache(&self) -> Result<()> {
        self.lock().release_cached_blocks()
    }

    fn set_memory_fraction(&self, fraction: f64) -> Result<()> {
        check_fraction(fraction)?;
        self.lock().set_fraction(fraction);
        Ok(())
    }

    fn stats(&self) -> MemoryStats {
        self.lock().ledger.stats.clone()
    }

    fn reset_peak_stats(&self) {
        self.lock().ledger.stats.reset_peak();
    }

    fn reset_accumulated_stats(&self) {
        self.lock().ledger.stats.reset_accumulated();
    }

    fn snapshot(&self) -> MemorySnapshot {
        self.lock().snapshot()
    }

    fn set_stream_hash(&self, stream: StreamId, hash: u64) {
        self.lock().hashes.set(stream, hash);
    }

    fn backing(&self, ptr: DevicePtr) -> Result<Backing> {
        self.lock().backing(ptr)
    }

    fn validate(&self) -> std::result::Result<(), InvariantViolation> {
        self.lock().validate()
    }

    fn set_observer(&self, observer: Option<Arc<dyn Observer>>) {
        self.lock().ledger.set_observer(observer);
    }
}

impl PrivatePools for PytorchAllocator {
    fn create_pool(&self, id: PoolId) -> Result<()> {
        self.lock().create_or_incref_pool(id).map(|_| ())
    }

    fn set_pool_options(&self, id: PoolId, options: PoolOptions) -> Result<()> {
        self.lock().book.set_options(id, options)
    }

    fn set_pool_source(&self, id: PoolId, source: Arc<dyn SegmentSource>) -> Result<()> {
        self.lock().set_pool_source(id, source)
    }

    fn pool_options(&self, id: PoolId) -> Result<PoolOptions> {
        Ok(self.lock().book.require(id)?.options)
    }

    fn begin_allocate_to_pool(&self, id: PoolId, filter: RouteFilter) -> Result<()> {
        self.lock().begin_allocate_to_pool(id, filter)
    }

    fn end_allocate_to_pool(&self, id: PoolId) -> Result<()> {
        self.lock().end_allocate_to_pool(id)
    }

    fn release_pool(&self, id: PoolId) -> Result<()> {
        self.lock().release_pool(id)
    }

    fn pool_use_count(&self, id: PoolId) -> u32 {
        self.lock().book.use_count(id)
    }

    fn empty_pool_cache(&self, id: PoolId) -> Result<()> {
        self.lock().empty_pool_cache(id)
    }

    fn pool_allocations(&self, id: PoolId) -> Result<Vec<PoolAllocation>> {
        self.lock().pool_allocations(id)
    }

    fn restore_pool(&self, id: PoolId, live: &[PoolAllocation]) -> Result<Vec<DevicePtr>> {
        self.lock().restore_pool(id, live)
    }
}

impl Tags for PytorchAllocator {
    fn make_tag(&self, id: PoolId, backup: Backup) -> Result<()> {
        self.lock().make_tag(id, backup)
    }

    fn pause_tag(&self, id: PoolId, when_busy: WhenBusy) -> Result<SleepReport> {
        self.lock().pause_tag(id, when_busy)
    }

    fn resume_tag(&self, id: PoolId) -> Result<SleepReport> {
        self.lock().resume_tag(id)
    }

    fn tag_state(&self, id: PoolId) -> Result<TagState> {
        self.lock().tag_state(id)
    }
}
