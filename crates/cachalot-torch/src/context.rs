//! Keeping the caller's CUDA context: PyTorch's current device must not change
//! behind its back.
//!
//! The CUDA backend makes its device's primary context current before its driver
//! calls and leaves it so. On the allocation path that never changes anything:
//! PyTorch allocates on its current device, whose context is already current. A
//! free, a `record_stream` or an `empty_cache` can arrive while another device is
//! current (a GPU-1 tensor dropped while GPU 0 is current), and the backend would
//! then leave GPU 1 current, which PyTorch's next `cudaGetDevice` would report.
//! [`ContextRestore`] puts the caller's context back after such calls.

use std::panic::{catch_unwind, AssertUnwindSafe};

use cachalot::backend::cuda::CudaBackend;
use cudarc::driver::sys::{self, CUresult};

/// The calling thread's current context, restored on drop if a call changed it.
#[derive(Debug)]
pub struct ContextRestore {
    previous: sys::CUcontext,
}

fn current() -> Option<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; cuCtxGetCurrent only reads the calling
    // thread's current context. A missing driver symbol panics inside cudarc's
    // loader, which catch_unwind stops here.
    let status = catch_unwind(AssertUnwindSafe(|| unsafe {
        sys::cuCtxGetCurrent(&mut ctx)
    }));
    matches!(status, Ok(CUresult::CUDA_SUCCESS)).then_some(ctx)
}

impl ContextRestore {
    /// Remembers the current context. Call it only once a device is open (the
    /// driver is then loaded); `None` when the driver cannot answer.
    pub fn save() -> Option<ContextRestore> {
        current().map(|previous| ContextRestore { previous })
    }
}

impl Drop for ContextRestore {
    fn drop(&mut self) {
        if current().is_none_or(|now| now == self.previous) {
            return;
        }
        // SAFETY: `previous` was the thread's current context when saved (possibly
        // null: no context), and the caller (PyTorch) still holds it: primary
        // contexts live as long as the process uses the device.
        let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
            sys::cuCtxSetCurrent(self.previous)
        }));
        // The backend remembers which context it last bound on this thread.
        CudaBackend::forget_context_binding();
    }
}
