//! Segments through the CUDA runtime's `cudaMalloc` and `cudaFree` as the
//! process resolves those names, instead of the driver's `cuMemAlloc`.
//!
//! A library preloaded to intercept `cudaMalloc` (torch_memory_saver's preload
//! mode, memory trackers) sees PyTorch's own allocator's segments because
//! PyTorch calls the runtime by name. It sees cachalot's only when cachalot
//! calls the runtime the same way: looked up in the process's global scope,
//! where a preloaded definition comes before the runtime library's own.
//! [`interposed`] says whether such a definition is there.
//!
//! The runtime allocates on the context current to the thread, which the
//! backend binds (the device's primary context, the runtime's own) before
//! each call. A failed `cudaMalloc` leaves the runtime's per-thread "last
//! error" set, which PyTorch checks after its kernels: it is cleared here, as
//! PyTorch's own allocator clears it after an out-of-memory.

use std::ffi::{c_int, c_void, CStr};

use cachalot_core::backend::{BackendError, BackendResult, CallKind, DevicePtr};

/// `cudaErrorMemoryAllocation`.
const MEMORY_ALLOCATION: c_int = 2;

type Malloc = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
type Free = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetLastError = unsafe extern "C" fn() -> c_int;

/// The runtime's names the backend calls, in the order it needs them.
const NAMES: [&CStr; 3] = [c"cudaMalloc", c"cudaFree", c"cudaGetLastError"];

/// The runtime libraries tried, newest first, when the process has none in
/// its global scope (a Rust program that never loaded the runtime).
const LIBRARIES: [&CStr; 3] = [c"libcudart.so.13", c"libcudart.so.12", c"libcudart.so"];

/// `cudaMalloc`, `cudaFree` and `cudaGetLastError` as the process resolves them.
#[derive(Clone, Copy, Debug)]
pub(super) struct Runtime {
    malloc: Malloc,
    free: Free,
    last_error: GetLastError,
}

impl Runtime {
    /// The process's definitions, from its global scope, else from the first
    /// runtime library of [`LIBRARIES`] that loads.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when neither has them.
    pub(super) fn find() -> BackendResult<Runtime> {
        if let Some(found) = Self::from_handle(libc::RTLD_DEFAULT) {
            return Ok(found);
        }
        for name in LIBRARIES {
            // SAFETY: `name` is a NUL-terminated string; loading the CUDA
            // runtime runs only its own initialisers. The handle is kept for
            // the process (never closed), so the functions stay valid.
            let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if let Some(found) = (!handle.is_null())
                .then(|| Self::from_handle(handle))
                .flatten()
            {
                return Ok(found);
            }
        }
        Err(BackendError::Unavailable(
            "no CUDA runtime (cudaMalloc) in the process or as libcudart.so".into(),
        ))
    }

    fn from_handle(handle: *mut c_void) -> Option<Runtime> {
        let [malloc, free, last_error] = NAMES.map(|name| symbol(handle, name));
        // SAFETY: each symbol is the CUDA runtime's function of that name (or
        // an interposer's, which keeps its signature), whose C signature is
        // the type it is turned into.
        unsafe {
            Some(Runtime {
                malloc: std::mem::transmute::<*mut c_void, Malloc>(malloc?),
                free: std::mem::transmute::<*mut c_void, Free>(free?),
                last_error: std::mem::transmute::<*mut c_void, GetLastError>(last_error?),
            })
        }
    }

    /// `cudaMalloc` of `bytes` on the current context.
    pub(super) fn malloc(&self, bytes: usize, requested: u64) -> BackendResult<DevicePtr> {
        let call = CallKind::SegmentAlloc;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out-pointer; the caller bound the context.
        let code = unsafe { (self.malloc)(&mut ptr, bytes) };
        match code {
            0 => Ok(ptr as DevicePtr),
            MEMORY_ALLOCATION => {
                self.clear_error();
                Err(BackendError::OutOfMemory { call, requested })
            }
            code => {
                self.clear_error();
                Err(failed(call, "cudaMalloc", code))
            }
        }
    }

    /// `cudaFree` of a segment [`Runtime::malloc`] gave.
    pub(super) fn free(&self, ptr: DevicePtr) -> BackendResult<()> {
        // SAFETY: `ptr` is a live segment from `cudaMalloc`; the caller bound
        // the context.
        match unsafe { (self.free)(ptr as *mut c_void) } {
            0 => Ok(()),
            code => {
                self.clear_error();
                Err(failed(CallKind::SegmentFree, "cudaFree", code))
            }
        }
    }

    fn clear_error(&self) {
        // SAFETY: takes no arguments; resets the calling thread's last error.
        unsafe { (self.last_error)() };
    }
}

fn failed(call: CallKind, name: &str, code: c_int) -> BackendError {
    BackendError::Device {
        call,
        message: format!("{name} returned cudaError {code}"),
    }
}

fn symbol(handle: *mut c_void, name: &CStr) -> Option<*mut c_void> {
    // SAFETY: `handle` is RTLD_DEFAULT or a handle from dlopen; `name` is
    // NUL-terminated.
    let found = unsafe { libc::dlsym(handle, name.as_ptr()) };
    (!found.is_null()).then_some(found)
}

/// Whether the process's global `cudaMalloc` is defined outside the CUDA
/// runtime library (an interposer preloaded before it); `false` when the
/// process has no `cudaMalloc` at all.
pub fn interposed() -> bool {
    let Some(found) = symbol(libc::RTLD_DEFAULT, NAMES[0]) else {
        return false;
    };
    // SAFETY: `info` is a valid out-parameter, filled by dladdr on success;
    // `dli_fname` is then a NUL-terminated path owned by the loader.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(found, &mut info) == 0 || info.dli_fname.is_null() {
            return false;
        }
        let path = CStr::from_ptr(info.dli_fname).to_string_lossy();
        !is_runtime_library(&path)
    }
}

/// Whether `path` names the CUDA runtime library itself.
fn is_runtime_library(path: &str) -> bool {
    let file = path.rsplit('/').next().unwrap_or(path);
    file.starts_with("libcudart.so")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_library_is_known_by_its_file_name() {
        assert!(is_runtime_library("/usr/lib/libcudart.so.13"));
        assert!(is_runtime_library("libcudart.so"));
        assert!(!is_runtime_library(
            "/site/torch_memory_saver_hook_mode_preload.abi3.so"
        ));
        assert!(!is_runtime_library("/opt/libcudart/hook.so"));
    }

    #[test]
    fn a_process_without_the_runtime_has_no_interposer() {
        // The test binary links no CUDA runtime.
        assert!(!interposed());
    }
}
