//! The fence at the C boundary: no panic crosses it, every error becomes a value.

use std::any::Any;
use std::ffi::{c_char, c_int};
use std::panic::{self, AssertUnwindSafe};

use crate::error::{self, PluginError, PluginResult};

/// Status an entry point returns on success.
pub const OK: c_int = 0;
/// Status an entry point returns on failure (the message is the last error).
pub const FAILED: c_int = -1;

/// Runs `body`; on an error or a panic, records the message as the last error and
/// returns `fallback` instead. Nothing unwinds out of this function.
pub fn guard<T>(fallback: T, body: impl FnOnce() -> PluginResult<T>) -> T {
    match panic::catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(value)) => value,
        Ok(Err(e)) => {
            error::record(&e);
            fallback
        }
        Err(payload) => {
            error::record(&PluginError::Panic(panic_message(payload.as_ref())));
            fallback
        }
    }
}

/// [`guard`] for entry points that return a status: [`OK`] or [`FAILED`].
pub fn status(body: impl FnOnce() -> PluginResult<()>) -> c_int {
    guard(FAILED, || body().map(|()| OK))
}

/// [`guard`] for entry points that return a string the caller frees with
/// `cachalot_string_free`; NULL on failure.
pub fn string(body: impl FnOnce() -> PluginResult<String>) -> *mut c_char {
    guard(std::ptr::null_mut(), || {
        body().map(|s| error::c_string(s).into_raw())
    })
}

/// The text a panic was raised with, when it has one.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_the_fallback() {
        let hook = panic::take_hook();
        panic::set_hook(Box::new(|_| {}));
        let value = guard(7, || -> PluginResult<i32> { panic!("boom {}", 1) });
        panic::set_hook(hook);
        assert_eq!(value, 7);
        assert_eq!(panic_message(&"static"), "static");
        assert_eq!(panic_message(&String::from("owned")), "owned");
        assert_eq!(panic_message(&3u8), "a panic without a message");
    }

    #[test]
    fn errors_become_the_fallback_and_successes_pass() {
        assert_eq!(guard(0, || Err(PluginError::InvalidDevice(-1))), 0);
        assert_eq!(guard(0, || Ok(5)), 5);
        assert_eq!(status(|| Ok(())), OK);
        assert_eq!(status(|| Err(PluginError::InvalidDevice(99))), FAILED);
    }
}
