//! The boundary of the status-returning entry points ([`crate::dropin`],
//! pools, IPC, settings): a status for C, and the failure's message handed to
//! the caller, so the C++ side raises the right PyTorch exception on the
//! calling thread: [`OOM`] becomes `torch.cuda.OutOfMemoryError`, [`ERROR`] a
//! `RuntimeError`.

use std::ffi::{c_char, c_int};

use cachalot::Error;

use crate::error::{c_string, PluginError, PluginResult};
use crate::guard::guard;

/// The call succeeded.
pub const OK: c_int = 0;
/// The device ran out of memory; `*message` holds PyTorch's message with
/// cachalot's breakdown.
pub const OOM: c_int = 1;
/// Any other failure; `*message` says what.
pub const ERROR: c_int = 2;

/// Runs `body` at the C boundary: the status, with `*message` set on failure.
pub(crate) fn reply(message: *mut *mut c_char, body: impl FnOnce() -> PluginResult<()>) -> c_int {
    let mut failure = None;
    let status = guard(ERROR, || match body() {
        Ok(()) => Ok(OK),
        Err(e) => {
            let code = if is_oom(&e) { OOM } else { ERROR };
            failure = Some(e.to_string());
            Ok(code)
        }
    });
    let text = failure.or_else(|| (status != OK).then(|| crate::error::last().unwrap_or_default()));
    if let Some(text) = text.filter(|_| !message.is_null()) {
        // SAFETY: `message` is non-null and, by every caller's contract, points to
        // a writable `char*`.
        unsafe { *message = c_string(text).into_raw() };
    }
    status
}

pub(crate) fn is_oom(error: &PluginError) -> bool {
    matches!(
        error,
        PluginError::OutOfMemory { .. }
            | PluginError::Allocator {
                source: Error::OutOfMemory(_) | Error::TooLarge { .. },
                ..
            }
    )
}

/// Writes through `out` when the caller gave somewhere to write.
pub(crate) fn put<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: `out` is non-null and, by every caller's contract, points to a
        // writable `T`.
        unsafe { *out = value };
    }
}
