//! # cachalot: a caching GPU memory manager
//!
//! cachalot hands out device memory from a cache instead of calling the driver per
//! buffer, keeps PyTorch's memory statistics, and can reproduce PyTorch 2.11's
//! native caching allocator exactly (the `pytorch` policy) or place memory its own
//! lower-fragmentation way (the `cachalot` policy). It runs on a real GPU (the
//! `cuda` backend) or on a simulated device (the `sim` backend), which is how
//! recorded PyTorch workloads are replayed on any machine.
//!
//! This crate gathers cachalot's crates at one set of paths: everything of
//! [`cachalot_core`] (the allocator, the simulated device, the policies,
//! statistics, snapshots, sleep and wake: its crate documentation has the
//! glossary, the layers and the invariants), the tools over recordings of
//! `cachalot_tools` ([`trace`], [`replay`], [`tune`], [`view`],
//! [`snapshot_io`], [`golden`]), sharing with other processes of
//! `cachalot_ipc` as [`ipc`], and the CUDA backend of `cachalot_cuda` as
//! [`backend::cuda`]. A program that needs neither a GPU driver nor the
//! tools may depend on `cachalot-core` alone.
//!
//! ```
//! use std::sync::Arc;
//! use cachalot::backend::sim::SimBackend;
//! use cachalot::{allocator, AllocatorConfig, StreamId};
//!
//! let device = Arc::new(SimBackend::new(1 << 30));
//! let alloc = allocator::create(device, AllocatorConfig::default()).unwrap();
//! let block = alloc.malloc(4096, StreamId::DEFAULT).unwrap();
//! alloc.free(block).unwrap();
//! alloc.validate().unwrap();
//! ```

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(clippy::unwrap_used)]

pub use cachalot_core::*;
pub use cachalot_ipc as ipc;
pub use cachalot_tools::{golden, replay, snapshot_io, trace, tune, view};

/// What provides segments, pages, streams and events: the core's backends
/// and adaptors ([`cachalot_core::backend`]) and the CUDA backend.
pub mod backend {
    pub use cachalot_core::backend::*;
    pub use cachalot_cuda as cuda;
}
