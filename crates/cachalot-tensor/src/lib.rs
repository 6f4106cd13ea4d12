//! # cachalot-tensor: tensors, devices and streams on the cachalot allocator
//!
//! PyTorch's CUDA memory workflow as a Rust API: tensors on `cpu` or `cuda:N`
//! whose device memory comes from cachalot's caching allocator (one per device,
//! created on first use), moved with `to`, computed on with NVRTC kernels and
//! cuBLAS, ordered with streams and events, and watched through PyTorch's
//! memory functions ([`memory`]) and leak checks ([`LeakCheck`]).
//!
//! With no GPU present, `cuda:N` is a simulated device: the `sim` backend hands
//! out addresses and this crate keeps the bytes in host memory, so the same
//! programs run, and report the same memory statistics, anywhere.
//!
//! ```
//! use cachalot_tensor::{memory, DType, Device, Tensor};
//! # let reg = cachalot_tensor::Registry::new(cachalot_tensor::Options::sim(Default::default()))?;
//! # let _g = reg.enter();
//! let x = Tensor::ones(&[1000, 1000], DType::F32, Device::Cuda(0))?;
//! let y = x.add_scalar(1.0)?;
//! assert_eq!(memory::memory_allocated(0), 2 * 4_000_256);
//! assert_eq!(y.to_vec::<f32>()?[0], 2.0);
//! # Ok::<(), cachalot_tensor::TensorError>(())
//! ```
//!
//! Glossary: see the `cachalot` crate (segment, block, allocation, pool,
//! requested/allocated/reserved bytes). A tensor's *storage* is one allocation.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(clippy::unwrap_used)]

mod context;
pub mod device;
pub mod dtype;
mod engine;
pub mod error;
mod host_ops;
pub mod layout;
pub mod leak;
pub mod memory;
mod ops;
mod pinned;
mod place;
pub mod registry;
mod storage;
pub mod stream;
mod tensor;
mod transfer;

pub use context::LiveAllocation;
pub use device::{
    can_device_access_peer, current_device, device_count, device_guard, set_device, Device,
    DeviceGuard,
};
pub use dtype::{DType, Element};
pub use error::{Result, TensorError};
pub use host_ops::BinaryOp;
pub use leak::{Leak, LeakCheck, LeakReport};
pub use pinned::PinnedStats;
pub use registry::{configure, BackendChoice, MemoryMode, Options, Registry, RegistryGuard};
pub use stream::{Event, Stream, StreamGuard};
pub use tensor::Tensor;
