//! The per-device caching allocator interface, shared by every policy.
//!
//! A [`DeviceAllocator`] serves one device through one [`Backend`]. Each policy
//! implements it and keeps its own locking (the `pytorch` policy one lock per
//! device, as PyTorch does; the `cachalot` policy per-stream state), so every
//! method takes `&self` and is callable from any thread.

use std::fmt;
use std::sync::Arc;

use crate::backend::{Backend, DevicePtr, MemInfo, StreamId};
use crate::backing::Backing;
use crate::config::{AllocatorConfig, PlacementSettings, PolicyKind};
use crate::error::{InvariantViolation, OomBreakdown, Result};
use crate::event::Observer;
use crate::private_pool::{PoolAllocation, PoolId, PoolOptions, RouteFilter, SegmentSource};
use crate::sleep::{Backup, SleepReport, TagState, WhenBusy};
use crate::snapshot::MemorySnapshot;
use crate::stats::MemoryStats;

/// A caching allocator for one device: allocation, frees, statistics,
/// snapshots; its private pools ([`PrivatePools`]) and tags ([`Tags`]) are
/// extension traits it requires, in scope where their methods are called.
pub trait DeviceAllocator: PrivatePools + Tags + Send + Sync + fmt::Debug {
    /// The policy this allocator implements.
    fn policy(&self) -> PolicyKind;

    /// Its configuration when it was created.
    fn config(&self) -> &AllocatorConfig;

    /// Puts the settings a program changes while it runs in force from the
    /// next call on, as PyTorch reads its settings at each call
    /// (`torch.cuda.memory._set_allocator_settings`). Blocks and segments
    /// already made keep their sizes. The default takes them and uses none:
    /// the cachalot policy has no such rules (it always maps pages).
    fn set_placement_settings(&self, settings: &PlacementSettings) {
        let _ = settings;
    }

    /// The backend it draws memory from.
    fn backend(&self) -> &Arc<dyn Backend>;

    /// Allocates at least `size` bytes for use on `stream`. A size of 0 returns the
    /// null address 0 and changes nothing, as PyTorch does.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when even a flushed cache
    /// leaves no room; [`Error::TooLarge`](crate::Error::TooLarge) at 1 EiB
    /// or more; [`Error::Backend`](crate::Error::Backend) when the device fails.
    fn malloc(&self, size: u64, stream: StreamId) -> Result<DevicePtr>;

    /// Frees an allocation. Freeing the null address is a no-op. The block becomes
    /// reusable once every stream recorded with [`DeviceAllocator::record_stream`]
    /// has passed this point.
    ///
    /// # Errors
    /// [`Error::InvalidFree`](crate::Error::InvalidFree) for a double or foreign free
    /// (nothing changes).
    fn free(&self, ptr: DevicePtr) -> Result<()>;

    /// Marks an allocation as used by `stream` (PyTorch's `record_stream`), so a free
    /// waits for the work queued there.
    ///
    /// # Errors
    /// [`Error::InvalidFree`](crate::Error::InvalidFree) when `ptr` is not a live
    /// allocation.
    fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<()>;

    /// Returns every cached, unused segment (or page) to the device.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when the device fails.
    fn empty_cache(&self) -> Result<()>;

    /// Limits the memory this allocator may reserve to `fraction` of the device.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) outside `[0, 1]`.
    fn set_memory_fraction(&self, fraction: f64) -> Result<()>;

    /// A copy of the statistics (cheap: no walk).
    fn stats(&self) -> MemoryStats;

    /// Sets every peak statistic to its current value.
    fn reset_peak_stats(&self);

    /// Zeroes every cumulative statistic.
    fn reset_accumulated_stats(&self);

    /// Every segment and block (walks all state).
    fn snapshot(&self) -> MemorySnapshot;

    /// Where the memory is now (walks all state): right after an out-of-memory
    /// error, the breakdown to attach to its report with
    /// [`OomReport::with_breakdown`](crate::OomReport::with_breakdown).
    fn oom_breakdown(&self) -> OomBreakdown {
        OomBreakdown::from_snapshot(&self.snapshot())
    }

    /// Tells the allocator PyTorch's hash of `stream`
    /// (`std::hash<c10::cuda::CUDAStream>`). PyTorch walks its tables of
    /// streams in an order that hash decides; the `pytorch` policy walks its
    /// own in the same order, so that blocks freed after `record_stream` come
    /// back in PyTorch's order. Other policies ignore it.
    fn set_stream_hash(&self, stream: StreamId, hash: u64) {
        let _ = (stream, hash);
    }

    /// What lies under the live allocation at `ptr` (a segment, or mapped
    /// pages), for sharing it with another process (`cachalot_ipc::share`).
    ///
    /// # Errors
    /// [`Error::InvalidFree`](crate::Error::InvalidFree) when `ptr` is not a
    /// live allocation.
    fn backing(&self, ptr: DevicePtr) -> Result<Backing>;

    /// Checks every invariant (walks all state).
    ///
    /// # Errors
    /// The first [`InvariantViolation`] found: always a bug in cachalot.
    fn validate(&self) -> std::result::Result<(), InvariantViolation>;

    /// Installs (or removes) the observer that receives every event.
    fn set_observer(&self, observer: Option<Arc<dyn Observer>>);

    /// The device's free and total memory, as the backend reports it
    /// (`torch.cuda.mem_get_info`).
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) when the device cannot answer.
    fn mem_get_info(&self) -> Result<MemInfo> {
        Ok(self.backend().mem_info()?)
    }

    /// `memory_allocated()`.
    fn memory_allocated(&self) -> u64 {
        self.stats().memory_allocated()
    }

    /// `max_memory_allocated()`.
    fn max_memory_allocated(&self) -> u64 {
        self.stats().max_memory_allocated()
    }

    /// `memory_reserved()`.
    fn memory_reserved(&self) -> u64 {
        self.stats().memory_reserved()
    }

    /// `max_memory_reserved()`.
    fn max_memory_reserved(&self) -> u64 {
        self.stats().max_memory_reserved()
    }
}

/// Private pools (PyTorch's `MemPool` and CUDA-graph pools): a
/// [`DeviceAllocator`]'s requests routed to pools of their own.
pub trait PrivatePools {
    /// Creates private pool `id` with a use count of 1, or adds a use to it
    /// (PyTorch's `createOrIncrefPool`: a `MemPool`, or a second graph sharing
    /// a pool).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for
    /// [`PoolId::DEFAULT`].
    fn create_pool(&self, id: PoolId) -> Result<()>;

    /// Sets private pool `id`'s options (`MemPool`'s `use_on_oom`, `no_split`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an unknown pool.
    fn set_pool_options(&self, id: PoolId, options: PoolOptions) -> Result<()>;

    /// Makes `source` give private pool `id`'s new segments
    /// (`torch.cuda.MemPool(allocator=...)`); its segments never grow by
    /// mapping pages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an unknown
    /// pool, or a tag (whose memory is cachalot's own pages).
    fn set_pool_source(&self, id: PoolId, source: Arc<dyn SegmentSource>) -> Result<()>;

    /// Private pool `id`'s options.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an unknown pool.
    fn pool_options(&self, id: PoolId) -> Result<PoolOptions>;

    /// Sends the requests whose stream `filter` accepts to private pool `id`
    /// (created, or given one more use) until [`PrivatePools::end_allocate_to_pool`].
    /// While any route is open, cross-stream frees wait and the cache is not
    /// flushed on a miss, as during a CUDA graph capture.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for
    /// [`PoolId::DEFAULT`].
    fn begin_allocate_to_pool(&self, id: PoolId, filter: RouteFilter) -> Result<()>;

    /// Closes the newest route to private pool `id` (its use stays until
    /// [`PrivatePools::release_pool`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) when no route
    /// to `id` is open.
    fn end_allocate_to_pool(&self, id: PoolId) -> Result<()>;

    /// Takes one use off private pool `id`. At zero the pool is freeable: its
    /// cached memory goes back at the next `empty_cache`, and the pool is
    /// forgotten once it holds none.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an unknown
    /// pool or one with no use left.
    fn release_pool(&self, id: PoolId) -> Result<()>;

    /// Private pool `id`'s use count (0 for a pool this device does not know).
    fn pool_use_count(&self, id: PoolId) -> u32;

    /// Returns private pool `id`'s cached memory to the device if the pool is
    /// freeable (PyTorch's `emptyCache(pool)`); a pool in use keeps it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an unknown
    /// pool; [`Error::Backend`](crate::Error::Backend) when the device fails.
    fn empty_pool_cache(&self, id: PoolId) -> Result<()>;

    /// Private pool `id`'s live allocations, by address. Frees deferred by a
    /// route that has closed get their events first (as PyTorch's
    /// `getCheckpointState`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an unknown pool.
    fn pool_allocations(&self, id: PoolId) -> Result<Vec<PoolAllocation>>;

    /// Puts private pool `id` back as a checkpoint found it: frees every live
    /// allocation of the pool, then allocates each of `live` again at its
    /// address (PyTorch's `setCheckpointPoolState`). Returns the addresses
    /// freed.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an unknown
    /// pool, or when an allocation of `live` is not free memory of the pool
    /// once its allocations are freed (the frees stay done).
    fn restore_pool(&self, id: PoolId, live: &[PoolAllocation]) -> Result<Vec<DevicePtr>>;
}

/// Tags ([`crate::sleep`]): private pools whose memory sleeps and wakes.
pub trait Tags {
    /// Makes private pool `id` a tag ([`crate::sleep`]): its segments come
    /// from pages cachalot maps, which [`Tags::pause_tag`] gives
    /// back and [`Tags::resume_tag`] brings back at the same
    /// addresses, its allocations' bytes copied to host memory and back with
    /// [`Backup::Host`]. Making a tag again with the same backup does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an unknown
    /// pool; [`Error::Sleep`](crate::Error::Sleep) for a pool holding memory
    /// already, one with an allocator of its own, a tag with another backup,
    /// a device without virtual memory, or a policy that cannot pause
    /// ([`crate::sleep::SleepError::Unsupported`]).
    fn make_tag(&self, id: PoolId, backup: Backup) -> Result<()>;

    /// Pauses tag `id`: after making sure no queued work uses its memory
    /// (`when_busy`), gives its wholly free cached segments back for good,
    /// copies its allocations to host memory if it keeps a backup, then gives
    /// the pages of every segment back to the device. Its allocations keep
    /// their addresses; a request routed to it is refused until
    /// [`Tags::resume_tag`].
    ///
    /// # Errors
    /// [`Error::Sleep`](crate::Error::Sleep): not a tag, paused already, a
    /// route into it open, work still queued ([`WhenBusy::Refuse`]), or the
    /// device failing part-way ([`crate::sleep::SleepError::Partial`]: resume it);
    /// [`Error::Backend`](crate::Error::Backend) when the device fails before
    /// anything was given back.
    fn pause_tag(&self, id: PoolId, when_busy: WhenBusy) -> Result<SleepReport>;

    /// Resumes paused tag `id`: new pages at the same addresses, the backup
    /// copied back. When the device has no room it releases the cache of the
    /// default pools and tries again.
    ///
    /// # Errors
    /// [`Error::Sleep`](crate::Error::Sleep): not a tag, not paused, or the
    /// device failing part-way ([`crate::sleep::SleepError::Partial`], out of memory
    /// included: free memory and resume again).
    fn resume_tag(&self, id: PoolId) -> Result<SleepReport>;

    /// Where tag `id` stands.
    ///
    /// # Errors
    /// As [`Tags::pause_tag`] for a pool that is not a tag.
    fn tag_state(&self, id: PoolId) -> Result<TagState>;
}
