//! The C entry points of CUDA IPC, for torch.multiprocessing: `shareIpcHandle`
//! (the handle and offset of a live allocation) and `getIpcDevPtr` (open a
//! handle of another process; closed when PyTorch drops the pointer).
//!
//! A segment's handle is PyTorch 2.11's own, so a receiver on PyTorch's
//! allocator opens it, and this one opens PyTorch's. Pages (the cachalot
//! policy, and expandable segments) travel as file descriptors over a socket:
//! see [`cachalot::ipc`].

use std::ffi::{c_char, c_int, c_void};
use std::sync::OnceLock;

use cachalot::ipc::{self, Imports, Shared};

use crate::error::{PluginError, PluginResult};
use crate::global::registry;
use crate::reply::{put, reply};

/// The handles of other processes open in this one.
fn imports() -> &'static Imports {
    static IMPORTS: OnceLock<Imports> = OnceLock::new();
    IMPORTS.get_or_init(Imports::default)
}

/// Shares the live allocation at `ptr`, on whichever device holds it (the
/// others refuse it as not theirs).
fn share(ptr: u64) -> PluginResult<Shared> {
    let reg = registry()?;
    for (device, allocator) in reg.devices() {
        match ipc::share(allocator.as_ref(), ptr) {
            Err(cachalot::Error::InvalidFree { .. }) => continue,
            other => return other.map_err(|source| PluginError::Allocator { device, source }),
        }
    }
    Err(PluginError::UnknownPointer(ptr))
}

/// Writes the handle of the live allocation at `ptr` to `out` (at most
/// `capacity` bytes), its length to `*len` and the allocation's offset from
/// what the handle opens to `*offset`. A handle longer than `capacity` fails
/// with its length in `*len`.
///
/// # Safety
/// `out` must point to `capacity` writable bytes; `len` and `offset` to
/// writable values; `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_ipc_share(
    ptr: *mut c_void,
    out: *mut u8,
    capacity: usize,
    len: *mut usize,
    offset: *mut u64,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        let shared = share(ptr.addr() as u64)?;
        put(len, shared.handle.len());
        if shared.handle.len() > capacity || out.is_null() {
            return Err(PluginError::InvalidArgument(format!(
                "a handle of {} bytes does not fit in {capacity}",
                shared.handle.len()
            )));
        }
        // SAFETY: `out` holds `capacity >= handle.len()` writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(shared.handle.as_ptr(), out, shared.handle.len()) };
        put(offset, shared.offset);
        Ok(())
    })
}

/// Opens the `len` bytes of another process's handle at `handle` on
/// `device` and writes the base address to `*out`; the allocation lies at the
/// offset the sender reported. A handle already open here gains an opener.
///
/// # Safety
/// `handle` must point to `len` readable bytes; `out` to a writable pointer;
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_ipc_open(
    device: c_int,
    handle: *const u8,
    len: usize,
    out: *mut *mut c_void,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        if handle.is_null() {
            return Err(PluginError::InvalidArgument("a null handle".into()));
        }
        // SAFETY: `handle` holds `len` readable bytes (the contract).
        let bytes = unsafe { std::slice::from_raw_parts(handle, len) };
        let (index, allocator) = registry()?.open(i64::from(device))?;
        let base = imports()
            .open(allocator.backend(), bytes)
            .map_err(|source| PluginError::Allocator {
                device: index,
                source,
            })?;
        put(out, std::ptr::without_provenance_mut(base as usize));
        Ok(())
    })
}

/// Closes one opener of the handle opened at `ptr` by [`cachalot_ipc_open`].
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_ipc_close(ptr: *mut c_void, message: *mut *mut c_char) -> c_int {
    reply(message, || {
        imports()
            .close(ptr.addr() as u64)
            .map_err(|e| PluginError::InvalidArgument(e.to_string()))
    })
}
