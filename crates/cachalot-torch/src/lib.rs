//! # cachalot-torch: cachalot as PyTorch's CUDA allocator
//!
//! The C ABI behind `python/cachalot_torch`: a C++ subclass of PyTorch's
//! `CUDAAllocator` (compiled against the user's torch) answers every method of
//! PyTorch's allocator interface through [`dropin`]: allocation and frees,
//! `DeviceStats`, resets, `empty_cache`, `cacheInfo`, history recording and
//! snapshots with PyTorch's segment, block and trace fields, and out-of-memory
//! failures told apart from other errors so that PyTorch raises
//! `torch.cuda.OutOfMemoryError`. [`ffi`] keeps the callback shape of PyTorch's
//! stock pluggable allocator and JSON statistics for C programs.
//! `docs/torch-plugin.md` lists every method and what cachalot does for it.
//!
//! ## Layers
//!
//! Top first; a module imports its own layer or those below (checked by
//! `crates/cachalot/tests/imports.rs`).
//!
//! ```text
//!   dropin   extern "C" entry points of the C++ allocator: status + message
//!   ffi      extern "C" callbacks for C
//!   ipc      CUDA IPC: handles of live allocations, handles of other processes
//!   pools    private pools (MemPool, CUDA graphs) and their segment sources
//!   regions  extern "C" region, pause and resume of tags by name
//!   settings PyTorch's run-time settings (`_set_allocator_settings`)
//!   ------
//!   reply    the status and message of the status-returning entry points
//!   report   summaries, history recording, snapshot pickles over the registry
//!   global   the process's one Registry (OnceLock), from the environment
//!   ------
//!   device   opens a device: CUDA backend + the configured policy
//!   sleep    tags by name: the pools of each and their pause and resume
//!   ------
//!   registry one DeviceAllocator per device, created on first use
//!   guard    catch_unwind at every entry point; errors become the last error
//!   ------
//!   rows     the snapshot rows C reads
//!   error    the plug-in's errors
//!   context  the caller's CUDA context, put back after frees and hooks
//!   streams  PyTorch's streams made known to the backend before use
//!   tags     recorded events tagged with the C++ side's call ids
//! ```

//! ## Rules at the boundary
//!
//! * Nothing unwinds into C: every entry point runs its body under
//!   `catch_unwind`; a panic is reported like an error.
//! * A failure returns NULL or -1 (or nothing, for PyTorch's `void` hooks) and
//!   leaves its message for `cachalot_last_error()`.
//! * Process-global state lives here, never in the `cachalot` library.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(clippy::unwrap_used)]

pub mod context;
pub mod device;
pub mod dropin;
pub mod error;
pub mod ffi;
pub mod global;
pub mod guard;
pub mod ipc;
pub mod pools;
pub mod regions;
pub mod registry;
pub mod reply;
pub mod report;
pub mod rows;
pub mod settings;
pub mod sleep;
pub mod streams;
pub mod tags;

pub use error::{PluginError, PluginResult};
pub use registry::Registry;
