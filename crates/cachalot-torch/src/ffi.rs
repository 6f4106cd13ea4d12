//! The C entry points of the callback shape (PyTorch's stock pluggable
//! allocator, and C programs).
//!
//! Every function here is `extern "C"`, never unwinds (each body runs inside
//! [`guard`](crate::guard::guard)) and reports failure the C way: a null pointer, a
//! status of -1, or nothing at all for the hooks PyTorch declares `void`; the
//! reason is then fetched with [`cachalot_last_error`]. Strings handed out are
//! owned by the caller, who frees them with [`cachalot_string_free`].
//! They work on the process's one registry ([`crate::global`]).

use std::ffi::{c_char, c_double, c_int, c_void, CStr};
use std::sync::Arc;

use cachalot::{DeviceAllocator, StreamId};

use crate::context::ContextRestore;
use crate::device;
use crate::error::{self, PluginError, PluginResult};
use crate::global::registry;
use crate::guard::{guard, status, string};
use crate::registry::Registry;
use crate::report;

/// Saves the caller's CUDA context around calls that may reach a device other
/// than the current one (frees, record_stream, empty_cache, memory fractions).
/// Only with two devices or more open can such a call switch the thread to a
/// context PyTorch uses for another device; with one, the only context the
/// backend ever makes current is the one PyTorch uses for it.
fn keep_context(registry: &Registry) -> Option<ContextRestore> {
    (registry.open_count() > 1)
        .then(ContextRestore::save)
        .flatten()
}

/// Runs `f` on the registry with the caller's CUDA context kept (see [`keep_context`]).
pub(crate) fn keeping_context<T>(f: impl FnOnce(&Registry) -> PluginResult<T>) -> PluginResult<T> {
    let registry = registry()?;
    let _context = keep_context(registry);
    f(registry)
}

/// `device`'s allocator, opened on first use.
fn allocator(device: c_int) -> PluginResult<&'static Arc<dyn DeviceAllocator>> {
    registry()?.device(i64::from(device))
}

fn stream_id(stream: *mut c_void) -> StreamId {
    StreamId(stream.addr() as u64)
}

/// Creates the registry now (it is otherwise created by the first allocation), so
/// that a bad `CACHALOT_ALLOC_CONF` is reported before PyTorch starts. Returns 0,
/// or -1 with the reason in [`cachalot_last_error`].
#[no_mangle]
pub extern "C" fn cachalot_init() -> c_int {
    status(|| registry().map(|_| ()))
}

/// PyTorch's allocation callback: `size` bytes on `device` for use on `stream`
/// (a `cudaStream_t`). Returns the device address, or NULL for a zero size or a
/// failure (the reason is in [`cachalot_last_error`]).
#[no_mangle]
pub extern "C" fn cachalot_alloc(size: isize, device: c_int, stream: *mut c_void) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let ptr = registry()?.malloc(size as i64, i64::from(device), stream_id(stream))?;
        Ok(std::ptr::without_provenance_mut(ptr as usize))
    })
}

/// PyTorch's free callback. PyTorch passes back the size, device and stream of the
/// allocation; the allocator knows the size and stream itself, and uses `device`
/// to find its allocator. Freeing NULL does nothing; a bad free is recorded in
/// [`cachalot_last_error`] and changes nothing.
#[no_mangle]
pub extern "C" fn cachalot_free(ptr: *mut c_void, size: isize, device: c_int, stream: *mut c_void) {
    let _ = (size, stream);
    guard((), || {
        keeping_context(|registry| registry.free(ptr.addr() as u64, i64::from(device)))
    });
}

/// PyTorch's record-stream hook (`set_record_stream_fn`): `ptr` is used on
/// `stream`, so its free must wait for the work queued there.
#[no_mangle]
pub extern "C" fn cachalot_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    guard((), || {
        keeping_context(|registry| registry.record_stream(ptr.addr() as u64, stream_id(stream)))
    });
}

/// PyTorch's `empty_cache` hook (`set_reset_fn`): returns every device's cached,
/// unused memory to the driver.
#[no_mangle]
pub extern "C" fn cachalot_empty_cache() {
    guard((), || keeping_context(Registry::empty_cache));
}

/// PyTorch's memory-fraction hook (`set_memory_fraction_fn`).
#[no_mangle]
pub extern "C" fn cachalot_set_memory_fraction(fraction: c_double, device: c_int) {
    // Opening the device (on first use) makes its context current: the saved
    // context is only there when another device was open before.
    guard((), || {
        keeping_context(|registry| registry.set_memory_fraction(fraction, i64::from(device)))
    });
}

/// `memory_stats(device)` as a JSON object with PyTorch's flattened key names;
/// NULL on failure. Free it with [`cachalot_string_free`].
#[no_mangle]
pub extern "C" fn cachalot_memory_stats(device: c_int) -> *mut c_char {
    string(|| registry()?.stats_json(i64::from(device)))
}

/// `memory_summary(device, abbreviated)`: PyTorch's table; NULL on failure. Free it
/// with [`cachalot_string_free`].
#[no_mangle]
pub extern "C" fn cachalot_memory_summary(device: c_int, abbreviated: c_int) -> *mut c_char {
    string(|| report::summary(registry()?, i64::from(device), abbreviated != 0))
}

/// The configuration in force, as JSON: `{"policy": ..., "conf": ...,
/// "segments": ...}` (`conf`: PyTorch's settings, then cachalot's; `segments`:
/// `driver` or `runtime`, where devices take their segments from); NULL on
/// failure. Free it with [`cachalot_string_free`].
#[no_mangle]
pub extern "C" fn cachalot_config() -> *mut c_char {
    string(|| {
        let config = registry()?.config();
        let segments = if device::runtime_segments(&config) {
            "runtime"
        } else {
            "driver"
        };
        Ok(serde_json::json!({
            "policy": config.policy.name(),
            "conf": config.source,
            "segments": segments,
        })
        .to_string())
    })
}

/// `reset_peak_memory_stats(device)`. Returns 0, or -1 on failure.
#[no_mangle]
pub extern "C" fn cachalot_reset_peak_stats(device: c_int) -> c_int {
    status(|| allocator(device).map(|a| a.reset_peak_stats()))
}

/// `reset_accumulated_memory_stats(device)`. Returns 0, or -1 on failure.
#[no_mangle]
pub extern "C" fn cachalot_reset_accumulated_stats(device: c_int) -> c_int {
    status(|| allocator(device).map(|a| a.reset_accumulated_stats()))
}

/// Checks every invariant of `device`'s allocator. Returns 0, or -1 with the
/// violation in [`cachalot_last_error`].
#[no_mangle]
pub extern "C" fn cachalot_validate(device: c_int) -> c_int {
    status(|| Ok(allocator(device)?.validate()?))
}

/// Starts (`enabled` non-zero) or stops history recording on every device, keeping
/// at most `max_entries` events per device (0: unlimited). Returns 0, or -1.
#[no_mangle]
pub extern "C" fn cachalot_record_history(enabled: c_int, max_entries: usize) -> c_int {
    status(|| {
        report::record_history(registry()?, enabled != 0, max_entries);
        Ok(())
    })
}

/// Writes a snapshot of every device (segments, blocks and recorded history) to
/// `path` as a PyTorch snapshot pickle, which `torch.cuda._memory_viz` reads.
/// Returns 0, or -1.
///
/// # Safety
/// `path` must be NULL or point to a NUL-terminated string that stays valid for
/// the call.
#[no_mangle]
pub unsafe extern "C" fn cachalot_dump_snapshot(path: *const c_char) -> c_int {
    status(|| {
        if path.is_null() {
            return Err(PluginError::InvalidArgument("snapshot path is NULL".into()));
        }
        // SAFETY: `path` is non-null and, by this function's contract, a valid
        // NUL-terminated string for the duration of the call.
        let path = unsafe { CStr::from_ptr(path) }
            .to_string_lossy()
            .into_owned();
        report::dump_snapshot(registry()?, &path)
    })
}

/// The message of the last failure in any thread, or NULL when there was none
/// since [`cachalot_clear_last_error`]. Free it with [`cachalot_string_free`].
#[no_mangle]
pub extern "C" fn cachalot_last_error() -> *mut c_char {
    guard(std::ptr::null_mut(), || {
        Ok(error::last().map_or(std::ptr::null_mut(), |m| error::c_string(m).into_raw()))
    })
}

/// Forgets the last failure.
#[no_mangle]
pub extern "C" fn cachalot_clear_last_error() {
    guard((), || {
        error::clear();
        Ok(())
    });
}

/// Frees a string returned by this library. NULL is a no-op.
///
/// # Safety
/// `s` must be NULL or a pointer returned by one of this library's functions that
/// has not been freed yet.
#[no_mangle]
pub unsafe extern "C" fn cachalot_string_free(s: *mut c_char) {
    if s.is_null() {
        return;
    }
    // SAFETY: by this function's contract `s` came from `CString::into_raw` in this
    // library and is freed only once.
    drop(unsafe { std::ffi::CString::from_raw(s) });
}
