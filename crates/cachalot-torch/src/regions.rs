//! The C entry points behind `cachalot_torch.region`, `pause` and `resume`:
//! each reads its arguments and calls the process's [`TagBook`].

use std::ffi::{c_char, c_int, CStr};

use cachalot::private_pool::PoolId;
use cachalot::sleep::{Backup, WhenBusy};
use serde::Serialize;

use crate::error::{PluginError, PluginResult};
use crate::ffi::keeping_context;
use crate::global::{registry, tags};
use crate::guard::{status, string};
#[cfg(doc)]
use crate::sleep::TagBook;

/// The backup a C caller names: 0 none, 1 host.
fn backup(code: c_int) -> PluginResult<Backup> {
    match code {
        0 => Ok(Backup::None),
        1 => Ok(Backup::Host),
        other => Err(PluginError::InvalidArgument(format!(
            "unknown backup {other} (0: none, 1: host)"
        ))),
    }
}

/// A C string argument; NULL is `None`.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
unsafe fn name_arg<'a>(name: *const c_char) -> PluginResult<Option<&'a str>> {
    if name.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated by the contract.
    let text = unsafe { CStr::from_ptr(name) };
    text.to_str()
        .map(Some)
        .map_err(|_| PluginError::InvalidArgument("a tag's name must be UTF-8".into()))
}

fn json<T: Serialize>(value: &T) -> PluginResult<String> {
    serde_json::to_string(value).map_err(|e| PluginError::InvalidArgument(e.to_string()))
}

/// Makes pool `(a, b)` of `device` a tag named `name` with `backup` (0 none,
/// 1 host). Returns 0, or -1 with the reason in `cachalot_last_error`.
///
/// # Safety
/// `name` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cachalot_tag_add(
    name: *const c_char,
    device: c_int,
    a: u64,
    b: u64,
    backup_code: c_int,
) -> c_int {
    status(|| {
        // SAFETY: by this function's contract.
        let name = unsafe { name_arg(name) }?
            .ok_or_else(|| PluginError::InvalidArgument("a tag needs a name".into()))?;
        let backup = backup(backup_code)?;
        keeping_context(|r| tags().add(r, name, i64::from(device), PoolId(a, b), backup))
    })
}

/// Pauses tag `name` (every tag: NULL), first waiting for the device when
/// `synchronize` is non-zero (else refusing while work may use the memory).
/// Returns what was done as JSON (`pools`, `segments`, `bytes`, `copied`,
/// `released`), freed with `cachalot_string_free`; NULL with the reason in
/// `cachalot_last_error`.
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cachalot_tag_pause(
    name: *const c_char,
    synchronize: c_int,
) -> *mut c_char {
    string(|| {
        // SAFETY: by this function's contract.
        let name = unsafe { name_arg(name) }?;
        let when_busy = if synchronize != 0 {
            WhenBusy::Synchronize
        } else {
            WhenBusy::Refuse
        };
        json(&keeping_context(|r| tags().pause(r, name, when_busy))?)
    })
}

/// Resumes tag `name` (every paused tag: NULL), as [`cachalot_tag_pause`].
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cachalot_tag_resume(name: *const c_char) -> *mut c_char {
    string(|| {
        // SAFETY: by this function's contract.
        let name = unsafe { name_arg(name) }?;
        json(&keeping_context(|r| tags().resume(r, name))?)
    })
}

/// Every tag's pools and where each stands, as a JSON list, freed with
/// `cachalot_string_free`; NULL with the reason in `cachalot_last_error`.
#[no_mangle]
pub extern "C" fn cachalot_tags() -> *mut c_char {
    string(|| json(&tags().states(registry()?)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_backup_code_is_refused_with_the_codes_known() {
        assert_eq!(backup(0).unwrap(), Backup::None);
        assert_eq!(backup(1).unwrap(), Backup::Host);
        let e = backup(2).unwrap_err();
        assert!(e.to_string().contains("0: none, 1: host"), "{e}");
    }
}
