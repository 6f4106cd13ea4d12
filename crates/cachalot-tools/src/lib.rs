//! # cachalot-tools: recordings, replay, tuning and the memory page
//!
//! What cachalot does with recorded PyTorch workloads, over any allocator of
//! `cachalot-core`: read recordings (PyTorch's trace CSV, its snapshot pickle,
//! its stats JSON) and make random ones ([`trace`]), replay them through either
//! policy on a simulated device or a real one ([`replay`]), rank allocator
//! settings for them ([`tune`]), draw them as one HTML page ([`view`]), write
//! snapshots as PyTorch's tools read them ([`snapshot_io`]) and check the
//! pytorch policy against PyTorch's recorded statistics ([`golden`]). The
//! `cachalot` crate re-exports each module at `cachalot::<module>`.
//!
//! ## Layers (dependencies point downward only)
//!
//! Checked by `crates/cachalot/tests/imports.rs`, as for the core:
//!
//! ```text
//!   trace  replay  tune  view      recordings in, replays, tuning, the page
//!   golden  snapshot_io            services over any allocator
//!   (cachalot-core)                the allocator, the simulated device
//! ```

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(clippy::unwrap_used)]

pub mod golden;
pub mod replay;
pub mod snapshot_io;
pub mod trace;
pub mod tune;
pub mod view;
