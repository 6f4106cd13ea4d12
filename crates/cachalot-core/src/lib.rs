//! # cachalot-core: the allocator, without a GPU driver
//!
//! The part of cachalot a Rust program needs to allocate: the backend trait,
//! the simulated device and the adaptors, both policies, statistics, snapshots,
//! sleep and wake, out-of-memory reports and sharing between processes, with
//! no CUDA library and none of the tools' dependencies. The CUDA backend is the
//! `cachalot-cuda` crate, the tools over recordings (readers, replay, tuning,
//! the memory page, snapshot files) `cachalot-tools`; the `cachalot` crate
//! gathers them at the paths users know (`cachalot::backend::cuda::CudaBackend`,
//! `cachalot::allocator::create`, `cachalot::replay`).
//!
//! cachalot hands out device memory from a cache instead of calling the driver per
//! buffer, keeps PyTorch's memory statistics, and can reproduce PyTorch 2.11's
//! native caching allocator exactly (the `pytorch` policy) or place memory its own
//! lower-fragmentation way (the `cachalot` policy). It runs on a real GPU (the
//! `cuda` backend) or on a simulated device (the `sim` backend), which is how
//! recorded PyTorch workloads are replayed on any machine.
//!
//! ## Glossary (these words, and only these)
//!
//! * **segment**: one allocation obtained from the device (a `cuMemAlloc`, or one
//!   mapped virtual range). **Reserved bytes** = the sum of segment sizes.
//! * **page**: a physical chunk of device memory (2 MiB on current GPUs) that can be
//!   mapped into a virtual range.
//! * **block**: a contiguous sub-range of a segment, free or allocated.
//! * **allocation**: a block handed to a caller. **Requested bytes** = what the
//!   caller asked for; **allocated bytes** = the rounded block sizes.
//! * **active**: allocated, or freed by the caller but still in use by a stream.
//! * **inactive split**: a free block inside a segment that also holds active blocks.
//! * **pool**: the small pool (requests of 1 MiB or less) or the large pool.
//! * **policy**: the rules that pick block and segment sizes, split, merge and
//!   release: `pytorch` or `cachalot`.
//! * **backend**: what provides segments, pages, streams and events: `sim` or `cuda`.
//! * **adaptor**: a backend over another that adds one concern: counting calls,
//!   injecting faults, capping memory, recorded addresses.
//! * **private pool**: small and large pools that serve only the requests
//!   routed to them (a CUDA graph's capture, `torch.cuda.MemPool`), named by a
//!   [`private_pool::PoolId`]; the *default pools* serve every other request.
//!   A **route** sends the requests whose stream a filter accepts to one;
//!   while any route is open, cross-stream frees wait and caches are not
//!   flushed, as during a capture. A private pool keeps its memory until no
//!   graph or `MemPool` uses it (then it is *freeable*).
//! * **backing**, **handle**: what lies under an allocation (its segment, or
//!   its mapped pages), and the bytes another process opens it with
//!   (the `cachalot-ipc` crate): PyTorch's own CUDA IPC handle for a segment, file descriptors
//!   handed over a Unix socket for pages.
//! * **tag**: a private pool whose memory can sleep ([`sleep`]): its segments'
//!   pages go back to the device at a *pause* and come back at the same
//!   addresses at a *resume*, with their bytes copied to host memory and back
//!   when the tag keeps a *backup*; a tag is *paused* in between.
//! * **slot**: a replay plan's number for one recorded allocation:
//!   `Op::Alloc { slot, .. }` allocates for it, `Op::Free { slot }` frees it, so
//!   a plan names allocations without their recorded addresses.
//!
//! The `cachalot` policy adds these:
//!
//! * **heap**: the blocks of one pool of one stream, tiling the pool's regions,
//!   with a best-fit index of the free ones and an address index of the others
//!   (allocated, pending or kept).
//! * **region**: a range of addresses a heap places blocks in: with virtual
//!   memory, the pool's one reserved virtual range (four times the device's memory for
//!   the large pool, twice for the small);
//!   without, each of the pool's device segments.
//! * **cell**: a page-sized, page-aligned piece of a reserved range, where one
//!   page can be mapped; *cached* when it holds a page that no live block
//!   touches.
//! * **run**: a maximal stretch of contiguous mapped cells. Each run counts as
//!   one `segment` in the statistics and the snapshot, as PyTorch's snapshot
//!   reports expandable segments.
//! * **kept**: a freed block held unmerged, still in the address index, for the
//!   next request of exactly its size: every freed block of the small pool with
//!   virtual memory, and the last 16 freed large blocks of a churning stream
//!   (neither with a release threshold; the second not with a churn slack of
//!   0). Kept blocks merge back into the heap before any page is mapped, on
//!   `empty_cache` and on out of memory.
//! * **budget**: what a stream may reserve before it reuses what it holds
//!   instead of asking the device for more. With virtual memory, mapped pages:
//!   `1 + cachalot_reuse_slack` times the most pages the stream ever had in use
//!   (plus `cachalot_churn_slack` while it churns), and at least that peak plus
//!   `cachalot_reuse_min_mb`; at its budget a stream re-maps a cached page
//!   instead of creating one. Without, reserved bytes up to 5% past the peak of
//!   active bytes; beyond, idle segments go back before a new one is allocated.
//! * **churn**: a stream churns when, since its peak of pages in use last grew,
//!   it has re-mapped at least twice as many pages as it has mapped, over at
//!   least 8 allocations per mapped page and at least one re-mapped page per
//!   1000 allocations (its layout never repeats). Its budget then rises by
//!   `cachalot_churn_slack` and its large pool keeps freed blocks, until that
//!   pool gives its range back on `empty_cache`.
//! * **lane**: a stream's pools within one private pool: a stream state of
//!   its own, whose pages are never re-mapped (a graph replays at the
//!   addresses it captured).
//! * **journal**: with several streams on a device, a stream's changes to its
//!   statistics since the last **merge**, stamped in an order they could have
//!   happened in (the machine's clock, or one thread's own count), in
//!   **chunks** that note the highest value of each statistic in them; a
//!   merge takes every journal at one moment (a **cut**) and raises the
//!   device's peaks, replaying changes one by one in time order only where
//!   the chunks' highest values add up to more than the peaks, so the peaks
//!   are those of the device, not the sum of the streams'.
//!
//! ## Layers (dependencies point downward only)
//!
//! Checked by `tests/imports.rs` (no import circle, no import of a layer
//! above): a module imports its own layer or those below it.
//!
//! ```text
//!   report                             services over any allocator
//!   policy: pytorch | cachalot         the two policies, and create()
//!   device_allocator                   DeviceAllocator (malloc, free, stats, ...);
//!                                      PrivatePools, Tags: its extension traits
//!   history  private_pool  sleep  pool_id  snapshot  summary  event  error
//!   segment_source  backing  recount  transition  stats  config  units
//!                                      the allocator's parts
//!   backend (Backend trait: segments, pages, streams, events; sim, adaptors)
//! ```
//!
//! Users reach the trait and the factory together as `cachalot::allocator`
//! (`allocator::create`, `allocator::DeviceAllocator`): a module of this file
//! that re-exports `device_allocator` and `policy::create`, so that no module
//! of a layer imports one above it.

//! ## Invariants (checked by every allocator's `validate()`)
//!
//! * The blocks of a segment tile it exactly: no gaps, no overlaps.
//! * A block is in a free list if and only if it is free and not awaiting a
//!   stream; each free block is in exactly one list.
//! * Every statistic's `current` equals the sum over blocks and segments it
//!   describes, and `peak >= current`.
//! * After all allocations are freed and `empty_cache` has run, the backend holds
//!   no segment and no page.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(clippy::unwrap_used)]

mod addr_map;
pub mod backend;
pub mod backing;
pub mod config;
mod device_allocator;
pub mod error;
pub mod event;
pub mod history;
pub mod policy;
pub mod pool_id;
pub mod private_pool;
mod recount;
pub mod report;
mod segment_source;
pub mod sleep;
pub mod snapshot;
pub mod stats;
pub mod summary;
#[cfg(test)]
mod test_rng;
mod transition;
pub mod units;

/// The per-device allocator: the interface every policy implements
/// ([`DeviceAllocator`] and its extensions), and [`create`](allocator::create),
/// which picks the policy a configuration names.
pub mod allocator {
    pub use crate::device_allocator::*;
    pub use crate::policy::create;
}

pub use allocator::{DeviceAllocator, PrivatePools, Tags};
pub use backend::{Backend, DevicePtr, StreamId};
pub use config::{AllocatorConfig, PolicyKind, SegmentRoute};
pub use error::{Error, OomReport, Result};
pub use policy::PytorchAllocator;
pub use stats::MemoryStats;
