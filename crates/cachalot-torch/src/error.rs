//! The plug-in's errors, and the last-error slot that carries them across the C ABI.
//!
//! A C entry point cannot return a Rust error, and PyTorch's callbacks return nothing
//! or a bare pointer. So every failure is turned into a message kept in one
//! process-wide slot, [`record`]; C callers fetch it with `cachalot_last_error()`.
//! The slot is process-wide rather than per thread because PyTorch calls the
//! allocator from its autograd threads too, while the caller that wants to know why
//! an allocation failed is the Python thread.

use std::ffi::CString;
use std::sync::{Mutex, PoisonError};

use cachalot::config::ConfigError;
use thiserror::Error;

/// Why a call into the plug-in failed.
#[derive(Debug, Error)]
pub enum PluginError {
    /// The settings (`PYTORCH_ALLOC_CONF`, `PYTORCH_CUDA_ALLOC_CONF`,
    /// `CACHALOT_ALLOC_CONF`) could not be parsed. Remedy: fix the variable.
    #[error("allocator settings: {0}")]
    Config(#[from] ConfigError),
    /// A device ordinal outside `0..MAX_DEVICES`.
    #[error("invalid device {0}")]
    InvalidDevice(i64),
    /// A negative size, or a memory fraction outside `[0, 1]`.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The device's allocator refused the call (out of memory, a bad free, a
    /// failed device).
    #[error("device {device}: {source}")]
    Allocator {
        /// The device ordinal.
        device: usize,
        /// What the allocator said.
        #[source]
        source: cachalot::Error,
    },
    /// The device ran out of memory: PyTorch's message, cachalot's breakdown and
    /// advice. Remedy: free memory, or change the configuration the advice names.
    #[error("{description}")]
    OutOfMemory {
        /// The device ordinal.
        device: usize,
        /// The whole description.
        description: String,
    },
    /// A tag name that no `region` made. Remedy: allocate in a region of that
    /// name first, or check the spelling.
    #[error("no tag named {name:?} (tags: {known}): allocate inside cachalot_torch.region({name:?}) first")]
    UnknownTag {
        /// The name asked for.
        name: String,
        /// The names there are, comma-separated.
        known: String,
    },
    /// An address that no device's allocator handed out.
    #[error("{0:#x} was not allocated by cachalot on any device")]
    UnknownPointer(u64),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// An allocator invariant is broken: always a bug in cachalot.
    #[error(transparent)]
    Invariant(#[from] cachalot::error::InvariantViolation),
    /// Code inside cachalot panicked; the panic was stopped at the C boundary.
    #[error("internal error (panic) in cachalot: {0}")]
    Panic(String),
}

impl PluginError {
    /// Wraps an allocator error with the device it came from.
    pub fn allocator(device: usize) -> impl FnOnce(cachalot::Error) -> PluginError {
        move |source| PluginError::Allocator { device, source }
    }
}

/// The plug-in's result type.
pub type PluginResult<T> = Result<T, PluginError>;

static LAST_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Keeps `error`'s message as the last error.
pub fn record(error: &PluginError) {
    let message = error.to_string();
    *LAST_ERROR.lock().unwrap_or_else(PoisonError::into_inner) = Some(message);
}

/// The last error's message, if any failure happened since the last [`clear`].
pub fn last() -> Option<String> {
    LAST_ERROR
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Forgets the last error.
pub fn clear() {
    *LAST_ERROR.lock().unwrap_or_else(PoisonError::into_inner) = None;
}

/// A C string for `text`, with any interior NUL replaced so that nothing is lost
/// silently.
pub fn c_string(text: String) -> CString {
    CString::new(text).unwrap_or_else(|e| {
        let cleaned: Vec<u8> = e
            .into_vec()
            .into_iter()
            .map(|b| if b == 0 { b'?' } else { b })
            .collect();
        CString::new(cleaned).expect("every NUL byte was just replaced")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_string_keeps_text_around_nul() {
        assert_eq!(c_string("a\0b".into()).to_str().unwrap(), "a?b");
        assert_eq!(c_string("plain".into()).to_str().unwrap(), "plain");
    }
}
