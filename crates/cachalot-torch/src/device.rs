//! Opening a device for PyTorch: the CUDA backend on the device's primary context
//! (the context the CUDA runtime, and so PyTorch, uses) with the configured policy.
//! Segments come from the runtime's `cudaMalloc` when the configuration's
//! `segments` route says so (by default: when a preloaded library, such as
//! torch_memory_saver's preload mode, intercepts `cudaMalloc`, as it would
//! PyTorch's own allocator's), else from the driver.

use std::sync::Arc;

use cachalot::backend::cuda::{self, CudaBackend};
use cachalot::AllocatorConfig;

use crate::registry::OpenedDevice;

/// Whether devices opened with `config` take their segments from the CUDA
/// runtime's `cudaMalloc` (else from the driver).
pub fn runtime_segments(config: &AllocatorConfig) -> bool {
    config.segments.runtime(cuda::runtime_malloc_interposed)
}

/// Opens CUDA device `device` with `config`.
///
/// # Errors
/// [`cachalot::Error::Backend`] when there is no driver or no such GPU; the
/// policy's error for a configuration it cannot run.
pub fn open_cuda(device: usize, config: &AllocatorConfig) -> cachalot::Result<OpenedDevice> {
    let backend = Arc::new(if runtime_segments(config) {
        CudaBackend::with_runtime_segments(device)?
    } else {
        CudaBackend::new(device)?
    });
    let allocator = cachalot::allocator::create(backend.clone(), config.clone())?;
    let register_stream = move |stream| {
        // SAFETY: the registry registers only streams PyTorch handed it for this
        // device: the current stream of an allocation made with this device
        // current, or a stream recorded on one of this device's allocations. They
        // are streams of this device's primary context. PyTorch keeps its pool
        // streams alive for the process; a stream the program destroys while a
        // block still records it is the same error with PyTorch's own allocator.
        unsafe { backend.register_stream(stream) }
    };
    Ok(OpenedDevice {
        allocator,
        register_stream: Some(Box::new(register_stream)),
    })
}
