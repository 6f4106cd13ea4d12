//! The thin layer between the CUDA backend and the driver: loading it without
//! panicking, turning result codes into [`BackendError`]s, and binding a device's
//! primary context to the calling thread.

use std::cell::Cell;
use std::ffi::{c_char, c_int, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use cudarc::driver::sys::{self, CUresult};

use cachalot_core::backend::{BackendError, BackendResult, CallKind};

/// Runs one driver call, catching a panic from cudarc's loader (a symbol missing
/// from an old driver) and mapping the result code: out-of-memory becomes
/// [`BackendError::OutOfMemory`] for `requested` bytes, any other failure
/// [`BackendError::Device`].
pub(super) fn check(
    call: CallKind,
    requested: u64,
    f: impl FnOnce() -> CUresult,
) -> BackendResult<()> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(CUresult::CUDA_SUCCESS) => Ok(()),
        Ok(CUresult::CUDA_ERROR_OUT_OF_MEMORY) => {
            Err(BackendError::OutOfMemory { call, requested })
        }
        Ok(code) => Err(BackendError::Device {
            call,
            message: error_name(code),
        }),
        Err(_) => Err(BackendError::Device {
            call,
            message: "the CUDA driver lacks this function".to_string(),
        }),
    }
}

/// Like [`check`], but hands back the raw code (for calls where `NOT_READY` is an
/// answer, not a failure).
pub(super) fn raw(call: CallKind, f: impl FnOnce() -> CUresult) -> BackendResult<CUresult> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|_| BackendError::Device {
        call,
        message: "the CUDA driver lacks this function".to_string(),
    })
}

/// The driver's name for a result code, such as `CUDA_ERROR_INVALID_VALUE`.
pub(super) fn error_name(code: CUresult) -> String {
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName only writes a pointer to a static string (or leaves it
    // null) and has no other effect; the driver library is loaded before any call
    // reaches here because every caller passed through `load`.
    let got = catch_unwind(AssertUnwindSafe(|| unsafe {
        sys::cuGetErrorName(code, &mut text)
    }));
    if matches!(got, Ok(CUresult::CUDA_SUCCESS)) && !text.is_null() {
        // SAFETY: on success the driver points `text` at a NUL-terminated static string.
        let name = unsafe { CStr::from_ptr(text) };
        return name.to_string_lossy().into_owned();
    }
    format!("CUDA error {}", code as u32)
}

/// Loads the driver library and initialises it, once per process. Never panics:
/// a missing library or a failed `cuInit` is [`BackendError::Unavailable`].
pub(super) fn load() -> BackendResult<()> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(load_once)
        .clone()
        .map_err(BackendError::Unavailable)
}

fn load_once() -> Result<(), String> {
    // SAFETY: is_culib_present only tries to dlopen the driver library by name and
    // closes it again; it runs no code of ours.
    let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    if !present {
        return Err("no CUDA driver (libcuda.so not found)".to_string());
    }
    // SAFETY: cuInit(0) is the documented first call into the driver; it takes no
    // pointers.
    match catch_unwind(|| unsafe { sys::cuInit(0) }) {
        Ok(CUresult::CUDA_SUCCESS) => Ok(()),
        Ok(CUresult::CUDA_ERROR_NO_DEVICE) => {
            Err("no GPU (the CUDA driver sees no device)".to_string())
        }
        Ok(code) => Err(format!(
            "no CUDA driver (cuInit failed: {})",
            error_name(code)
        )),
        Err(_) => Err("no CUDA driver (the library lacks cuInit)".to_string()),
    }
}

/// The number of devices the driver sees.
pub(super) fn device_count() -> BackendResult<usize> {
    load()?;
    let mut n: c_int = 0;
    // SAFETY: the driver is initialised (load) and `n` is a valid out-pointer.
    check(CallKind::MemInfo, 0, || unsafe {
        sys::cuDeviceGetCount(&mut n)
    })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The driver's CUDA version as `(major, minor)`, such as `(13, 0)`.
pub(super) fn driver_version() -> BackendResult<(u32, u32)> {
    load()?;
    let mut v: c_int = 0;
    // SAFETY: the driver is initialised (load) and `v` is a valid out-pointer.
    check(CallKind::MemInfo, 0, || unsafe {
        sys::cuDriverGetVersion(&mut v)
    })?;
    let v = u32::try_from(v).unwrap_or(0);
    Ok((v / 1000, (v % 1000) / 10))
}

thread_local! {
    /// The id of the [`Context`] last made current on this thread (0: none).
    static BOUND: Cell<u64> = const { Cell::new(0) };
}

static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A device's primary context, retained for the lifetime of this value.
#[derive(Debug)]
pub(super) struct Context {
    raw: sys::CUcontext,
    device: sys::CUdevice,
    /// Unique per value, so a thread's cache never confuses two contexts that the
    /// driver happened to place at the same address.
    id: u64,
}

// SAFETY: a CUDA context handle may be used from any thread; the driver serialises
// what needs serialising. We never dereference `raw`.
unsafe impl Send for Context {}
// SAFETY: as above; `&Context` only hands the handle to the driver.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of device `ordinal`.
    pub(super) fn retain(ordinal: usize) -> BackendResult<Context> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(BackendError::Unavailable(format!(
                "no GPU {ordinal} (the driver sees {count})"
            )));
        }
        let index = c_int::try_from(ordinal)
            .map_err(|_| BackendError::Unavailable(format!("no GPU {ordinal}")))?;
        let mut device: sys::CUdevice = 0;
        // SAFETY: the driver is initialised and `index` is below the device count.
        check(CallKind::MemInfo, 0, || unsafe {
            sys::cuDeviceGet(&mut device, index)
        })?;
        let mut raw: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `device` came from cuDeviceGet; `raw` is a valid out-pointer. The
        // matching release is in Drop.
        check(CallKind::MemInfo, 0, || unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut raw, device)
        })?;
        Ok(Context {
            raw,
            device,
            id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// The driver's device handle.
    pub(super) fn device(&self) -> sys::CUdevice {
        self.device
    }

    /// Makes this context current on the calling thread, unless this thread already
    /// did so last (one thread-local read on the fast path). Code outside cachalot
    /// that switches contexts on the same thread must call [`Context::forget_binding`].
    pub(super) fn bind(&self, call: CallKind) -> BackendResult<()> {
        if BOUND.get() == self.id {
            return Ok(());
        }
        // SAFETY: `raw` is a primary context we retained and have not released.
        check(call, 0, || unsafe { sys::cuCtxSetCurrent(self.raw) })?;
        BOUND.set(self.id);
        Ok(())
    }

    /// Forgets which context this thread has current, so the next call binds again.
    pub(super) fn forget_binding() {
        BOUND.set(0);
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if BOUND.get() == self.id {
            BOUND.set(0);
        }
        // SAFETY: we retained this device's primary context in `retain` and release
        // it exactly once; the error, if any, cannot be acted upon in drop.
        let _ = check(CallKind::SynchronizeDevice, 0, || unsafe {
            sys::cuDevicePrimaryCtxRelease_v2(self.device)
        });
    }
}

/// The device's name, as the driver reports it.
pub(super) fn device_name(device: sys::CUdevice) -> BackendResult<String> {
    let mut buf = [0 as c_char; 256];
    let len = c_int::try_from(buf.len()).unwrap_or(0);
    // SAFETY: the buffer is 256 bytes and we pass its length; the driver writes a
    // NUL-terminated name into it.
    check(CallKind::MemInfo, 0, || unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), len, device)
    })?;
    // SAFETY: the driver NUL-terminated the name within the buffer (the last byte
    // stays 0 because the buffer started zeroed and the driver writes at most len).
    let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

/// The device's total memory in bytes.
pub(super) fn total_memory(device: sys::CUdevice) -> BackendResult<u64> {
    let mut bytes: usize = 0;
    // SAFETY: `bytes` is a valid out-pointer and `device` a handle from cuDeviceGet.
    check(CallKind::MemInfo, 0, || unsafe {
        sys::cuDeviceTotalMem_v2(&mut bytes, device)
    })?;
    Ok(bytes as u64)
}

/// Whether the device supports virtual memory management.
pub(super) fn supports_virtual_memory(device: sys::CUdevice) -> BackendResult<bool> {
    let mut value: c_int = 0;
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    // SAFETY: `value` is a valid out-pointer and `device` a handle from cuDeviceGet.
    check(CallKind::MemInfo, 0, || unsafe {
        sys::cuDeviceGetAttribute(&mut value, attr, device)
    })?;
    Ok(value != 0)
}

/// The properties of a page of pinned device memory on `device`; a
/// `shareable` one can be exported as a POSIX file descriptor.
pub(super) fn page_properties(device: sys::CUdevice, shareable: bool) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: if shareable {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        } else {
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE
        },
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// Read/write access to a mapping for `device`.
fn access_descriptor(device: sys::CUdevice) -> sys::CUmemAccessDesc {
    sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    }
}

/// The access descriptors that pages of `device` are mapped with: read and
/// write for `device` itself and for every device that can reach it as a peer
/// (`cuDeviceCanAccessPeer`), so that a kernel or copy of another GPU of the
/// process can use them, as with memory from `cuMemAlloc` once peer access is
/// enabled.
pub(super) fn access_descriptors(
    device: sys::CUdevice,
) -> BackendResult<Vec<sys::CUmemAccessDesc>> {
    let mut out = vec![access_descriptor(device)];
    for index in 0..c_int::try_from(device_count()?).unwrap_or(c_int::MAX) {
        let mut peer: sys::CUdevice = 0;
        // SAFETY: the driver is initialised and `index` is below the device count.
        check(CallKind::MemInfo, 0, || unsafe {
            sys::cuDeviceGet(&mut peer, index)
        })?;
        let mut can: c_int = 0;
        // SAFETY: `can` is a valid out-pointer; both handles came from cuDeviceGet.
        check(CallKind::MemInfo, 0, || unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, peer, device)
        })?;
        if peer != device && can != 0 {
            out.push(access_descriptor(peer));
        }
    }
    Ok(out)
}

/// The minimum page size (and mapping alignment) for `device`.
pub(super) fn granularity(device: sys::CUdevice) -> BackendResult<u64> {
    let prop = page_properties(device, false);
    let mut g: usize = 0;
    let flag = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: `prop` is a fully initialised property struct on our stack and `g` a
    // valid out-pointer.
    check(CallKind::CreatePage, 0, || unsafe {
        sys::cuMemGetAllocationGranularity(&mut g, &prop, flag)
    })?;
    Ok(g as u64)
}
