//! # cachalot-torch: cachalot as PyTorch's CUDA allocator
//!
//! A C ABI for `torch.cuda.memory.CUDAPluggableAllocator`: PyTorch calls
//! [`cachalot_alloc`](ffi::cachalot_alloc) and [`cachalot_free`](ffi::cachalot_free)
//! for every CUDA tensor, and the hooks [`cachalot_record_stream`](ffi::cachalot_record_stream),
//! [`cachalot_empty_cache`](ffi::cachalot_empty_cache) and
//! [`cachalot_set_memory_fraction`](ffi::cachalot_set_memory_fraction) for
//! `Tensor.record_stream`, `torch.cuda.empty_cache` and
//! `torch.cuda.set_per_process_memory_fraction`. The rest of the ABI gives back what
//! PyTorch no longer can with a pluggable allocator: `memory_stats` with PyTorch's
//! keys, `memory_summary`, history recording and snapshot pickles.
//! `python/cachalot_torch.py` wraps it all with ctypes; `docs/torch-plugin.md`
//! describes what PyTorch does and does not tell a pluggable allocator.
//!
//! ## Layers
//!
//! ```text
//!   ffi      extern "C" entry points, the process's one Registry (OnceLock)
//!   guard    catch_unwind at every entry point; errors become the last error
//!   report   summaries, history recording, snapshot pickles over the registry
//!   registry one DeviceAllocator per device, created on first use
//!   context  the caller's CUDA context, put back after frees and hooks
//!   streams  PyTorch's streams made known to the backend before use
//!   device   opens a device: CUDA backend + the configured policy
//! ```
//!
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
pub mod guard;
pub mod registry;
pub mod report;
pub mod streams;

pub use error::{PluginError, PluginResult};
pub use registry::Registry;
