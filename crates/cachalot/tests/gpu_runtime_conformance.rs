//! The backend contract (`backend/mod.rs`, checked by
//! `cachalot_testkit::backend`) on the CUDA backend whose segments come from
//! the runtime's `cudaMalloc` and `cudaFree` as the process resolves them
//! (`CudaBackend::with_runtime_segments`). Where no GPU or no CUDA runtime is
//! present it prints "skipped: no GPU or CUDA runtime (...)" and checks the
//! simulated device without virtual memory instead. A program of its own:
//! the suite checks the device's free memory, which another CUDA backend of
//! the process would move under its checks.

use std::sync::{Arc, Once};

use cachalot::backend::cuda::CudaBackend;
use cachalot::backend::sim::SimBackend;
use cachalot::backend::Backend;
use cachalot_testkit::backend_suite;

/// The runtime sets itself up on its first `cudaMalloc` and keeps device memory
/// for that: done once, before any check measures free memory.
static RUNTIME_SET_UP: Once = Once::new();

fn runtime_segments() -> Arc<dyn Backend> {
    match CudaBackend::with_runtime_segments(0) {
        Ok(gpu) => {
            RUNTIME_SET_UP.call_once(|| {
                let first = gpu.allocate_segment(2 << 20).expect("a first segment");
                gpu.free_segment(first).expect("freed");
            });
            Arc::new(gpu)
        }
        Err(e) => {
            eprintln!(
                "skipped: no GPU or CUDA runtime ({e}); checked on the simulated device instead"
            );
            Arc::new(SimBackend::with_options(8 << 30, false))
        }
    }
}

backend_suite!(cuda_runtime_segments, runtime_segments);
