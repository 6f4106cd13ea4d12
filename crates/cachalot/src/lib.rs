//! # cachalot: a caching GPU memory manager
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
//!
//! ## Layers (dependencies point downward only)
//!
//! ```text
//!   allocator (DeviceAllocator: malloc, free, record_stream, empty_cache, stats)
//!        policy: pytorch | cachalot        stats, events, snapshot, validate
//!   backend (Backend trait: segments, pages, streams, events, memory info)
//!        sim                              cuda (cudarc)
//! ```
//!
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
pub mod allocator;
pub mod backend;
pub mod config;
pub mod error;
pub mod event;
pub mod golden;
pub mod history;
pub mod policy;
pub mod replay;
pub mod report;
pub mod snapshot;
pub mod snapshot_io;
pub mod stats;
pub mod summary;
#[cfg(test)]
mod test_rng;
pub mod trace;
pub mod tune;
pub mod view;

pub use allocator::DeviceAllocator;
pub use backend::{Backend, DevicePtr, StreamId};
pub use config::{AllocatorConfig, PolicyKind};
pub use error::{Error, OomReport, Result};
pub use policy::PytorchAllocator;
pub use stats::MemoryStats;
