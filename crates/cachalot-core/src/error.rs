//! Errors, grouped by what the caller should do about them.
//!
//! * [`Error::OutOfMemory`]: transient. Free memory (drop allocations, or call
//!   `empty_cache` in another allocator sharing the device) and retry.
//! * [`Error::TooLarge`]: the request can never be met. Ask for less.
//! * [`Error::InvalidFree`] / [`Error::InvalidArgument`] / [`Error::Config`]: a bug
//!   in the caller. Fix the call; the allocator's state is unchanged.
//! * [`Error::Backend`]: the device failed. Treat it as lost.
//! * [`Error::Sleep`]: a pause, resume or tag call that cannot be done now;
//!   each [`SleepError`] says what to do.
//!
//! A broken internal invariant is not an error variant: it is what
//! `validate()` reports, as an [`InvariantViolation`].

use std::fmt;

use thiserror::Error;

use crate::backend::{Backend, BackendError, DevicePtr, StreamId};
use crate::config::{ConfigError, PolicyKind};
use crate::sleep::SleepError;
use crate::stats::MemoryStats;
pub use crate::units::format_size;

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The bound on a request: one exbibyte. A request of this many bytes or more is
/// refused outright, as PyTorch 2.11's `allocate` refuses it (it accepts
/// `size < one_exa_bytes`, 2^60); see [`is_too_large`].
pub const MAX_REQUEST: u64 = 1 << 60;

/// Whether a request of `size` bytes is refused outright: at least
/// [`MAX_REQUEST`]. The one test both policies and both trace readers apply.
pub const fn is_too_large(size: u64) -> bool {
    size >= MAX_REQUEST
}

/// [`Error::TooLarge`] for a request of `size` bytes when [`is_too_large`] holds.
pub(crate) fn check_request(size: u64) -> Result<()> {
    if is_too_large(size) {
        return Err(Error::TooLarge {
            requested: size,
            limit: MAX_REQUEST,
        });
    }
    Ok(())
}

/// Everything an allocator call can fail with.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum Error {
    /// The device has no room for the request even after freeing every cached
    /// block. Remedy: free memory and retry.
    #[error("{0}")]
    OutOfMemory(Box<OomReport>),
    /// The request is at least one exbibyte, more than any device could hold.
    /// Remedy: ask for less.
    #[error("out of memory: tried to allocate {requested} bytes; a request must be under {limit} bytes (1 EiB)")]
    TooLarge {
        /// Bytes asked for.
        requested: u64,
        /// The bound every request must be under ([`MAX_REQUEST`]).
        limit: u64,
    },
    /// A free (or record_stream) of an address this allocator did not hand out,
    /// or already took back. Remedy: fix the caller.
    #[error("invalid free of {ptr:#x}: {reason}")]
    InvalidFree {
        /// The address passed.
        ptr: DevicePtr,
        /// Why it is invalid.
        reason: FreeError,
    },
    /// An argument outside its contract (a memory fraction above 1, say).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A malformed configuration string.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The device failed in a way the allocator cannot recover from.
    #[error("device failure: {0}")]
    Backend(#[from] BackendError),
    /// A tag call refused ([`crate::sleep`]): the message says what to do.
    #[error(transparent)]
    Sleep(#[from] SleepError),
}

/// Why a free was refused.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FreeError {
    /// The address was handed out once but is already freed.
    DoubleFree,
    /// The address was never handed out by this allocator.
    Foreign,
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FreeError::DoubleFree => "already freed (double free)",
            FreeError::Foreign => "not allocated by this allocator",
        })
    }
}

/// The numbers behind an out-of-memory error. Its `Display` follows PyTorch's
/// message, so logs read the same; [`crate::report::oom::describe`] adds the
/// breakdown and advice.
///
/// Policies fill the figures they keep as counters, so a failure costs no walk of
/// their state (a program that retries after out-of-memory errors pays nothing
/// per failure). Whoever shows the report attaches the breakdown, a walk of
/// every block, with [`OomReport::with_breakdown`] and
/// [`DeviceAllocator::oom_breakdown`](crate::DeviceAllocator::oom_breakdown).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct OomReport {
    /// The device ordinal.
    pub device: usize,
    /// The caller's request, in bytes.
    pub requested: u64,
    /// The device allocation that failed (a segment or mapping size), in bytes.
    /// PyTorch reports this figure as "Tried to allocate".
    pub alloc_size: u64,
    /// The device's total memory.
    pub capacity: u64,
    /// The device's free memory as the backend reported it.
    pub device_free: u64,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// Bytes in segments.
    pub reserved: u64,
    /// The memory fraction limit in bytes, when one is set.
    pub allowed: Option<u64>,
    /// The stream the request came on.
    pub stream: StreamId,
    /// The allocator configuration string in force.
    pub config: String,
    /// The policy that ran out (the configuration string may not name it).
    pub policy: PolicyKind,
    /// Where the memory is: live allocations by size, free blocks. `None` until
    /// attached with [`OomReport::with_breakdown`].
    pub breakdown: Option<OomBreakdown>,
}

/// Where a device's memory was when an allocation failed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OomBreakdown {
    /// Live allocations by block size, smallest bucket first.
    pub live_by_size: Vec<SizeBucket>,
    /// The largest free (inactive) block in any segment, in bytes.
    pub largest_free_block: u64,
    /// Free bytes inside segments that also hold active blocks (cannot be
    /// returned to the device).
    pub inactive_split_bytes: u64,
    /// Segments held.
    pub segments: usize,
}

/// Live allocations whose block size is at most `max_size` (and above the
/// previous bucket's).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SizeBucket {
    /// Upper bound of the bucket in bytes (`u64::MAX` for the last).
    pub max_size: u64,
    /// Allocations in it.
    pub count: u64,
    /// Their allocated bytes.
    pub bytes: u64,
}

/// A request that could not be met: what the caller asked for, the device
/// allocation it needed, and its stream.
#[derive(Clone, Copy, Debug)]
pub(crate) struct FailedRequest {
    pub(crate) requested: u64,
    pub(crate) alloc_size: u64,
    pub(crate) stream: StreamId,
}

impl OomReport {
    /// The report every policy gives of `failed`: the device's ordinal and
    /// capacity from `backend` and its free memory asked of it now (0 when it
    /// cannot say), the allocator's allocated and reserved bytes from `stats`,
    /// its memory fraction limit, configuration string and policy.
    pub(crate) fn of(
        failed: FailedRequest,
        backend: &dyn Backend,
        stats: &MemoryStats,
        allowed: Option<u64>,
        config: &str,
        policy: PolicyKind,
    ) -> OomReport {
        let caps = backend.capabilities();
        OomReport {
            device: caps.device,
            requested: failed.requested,
            alloc_size: failed.alloc_size,
            capacity: caps.total_memory,
            device_free: backend.mem_info().map_or(0, |m| m.free),
            allocated: stats.memory_allocated(),
            reserved: stats.memory_reserved(),
            allowed,
            stream: failed.stream,
            config: config.to_string(),
            policy,
            breakdown: None,
        }
    }

    /// The report with `breakdown` attached.
    pub fn with_breakdown(mut self, breakdown: OomBreakdown) -> OomReport {
        self.breakdown = Some(breakdown);
        self
    }

    /// Reserved bytes that no allocation uses (fragmentation and cache).
    pub fn reserved_unallocated(&self) -> u64 {
        self.reserved.saturating_sub(self.allocated)
    }
}

impl fmt::Display for OomReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} is free. ",
            format_size(self.alloc_size),
            self.device,
            format_size(self.capacity),
            format_size(self.device_free),
        )?;
        if let Some(allowed) = self.allowed {
            write!(f, "{} allowed; ", format_size(allowed))?;
        }
        write!(
            f,
            "Of the allocated memory {} is allocated by cachalot, and {} is reserved by cachalot but unallocated.",
            format_size(self.allocated),
            format_size(self.reserved_unallocated()),
        )?;
        // PyTorch's hint; the cachalot policy is what it suggests.
        if self.policy == PolicyKind::Pytorch {
            f.write_str(
                " If reserved but unallocated memory is large try setting \
                 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or policy:cachalot) to avoid \
                 fragmentation.",
            )?;
        }
        Ok(())
    }
}

/// Formats a byte count for reports: as [`format_size`] up to 1 TiB, then
/// two decimals of TiB or PiB (PyTorch's messages stop at GiB, and 256 TiB
/// would read "262144.00 GiB").
pub fn format_bytes(bytes: u64) -> String {
    const TIB: u64 = 1 << 40;
    const PIB: u64 = 1 << 50;
    if bytes <= TIB {
        format_size(bytes)
    } else if bytes <= PIB {
        format!("{:.2} TiB", bytes as f64 / TIB as f64)
    } else {
        format!("{:.2} PiB", bytes as f64 / PIB as f64)
    }
}

/// A broken allocator invariant, found by `validate()`. Never expected: each one is
/// a bug in cachalot.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("invariant violated: {0}")]
pub struct InvariantViolation(pub String);

/// Returns `Err(InvariantViolation)` with a formatted message unless `cond` holds.
macro_rules! ensure_invariant {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::error::InvariantViolation(format!($($msg)+)));
        }
    };
}

/// For `validate()` (`crate::error::ensure_invariant!`).
pub(crate) use ensure_invariant;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_format_like_pytorch() {
        assert_eq!(format_size(0), "0 bytes");
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(64 << 20), "64.00 MiB");
        assert_eq!(format_size(85017493504), "79.18 GiB");
        assert_eq!(format_size(850174935), "810.79 MiB");
    }

    #[test]
    fn reports_go_past_gib() {
        assert_eq!(format_bytes(80 << 30), "80.00 GiB");
        assert_eq!(format_bytes(1 << 48), "256.00 TiB");
        assert_eq!(format_bytes(3 << 50), "3.00 PiB");
    }
}
