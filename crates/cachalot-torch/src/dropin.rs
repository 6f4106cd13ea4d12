//! The C entry points of the drop-in allocator: the C++ subclass of PyTorch's
//! `CUDAAllocator` (`python/cachalot_torch/csrc/cachalot_allocator.cpp`) answers
//! every method through these.
//!
//! Unlike the callbacks of [`crate::ffi`], each function here returns a status
//! and hands its failure's message to the caller (`*message`, freed with
//! `cachalot_string_free`): see [`crate::reply`].

use std::ffi::{c_char, c_double, c_int, c_void};
use std::ptr;

use cachalot::error::OomBreakdown;
use cachalot::event::Action;
use cachalot::history::HistoryConfig;
use cachalot::{Error, MemoryStats};

use crate::error::PluginError;
use crate::global::registry;
use crate::reply::{put, reply};
pub use crate::reply::{ERROR, OK, OOM};
use crate::rows::{shown_as, BlockRow, SegmentRow, TraceRow};

/// How many numbers [`cachalot_device_stats`] writes: nine arrays of three
/// statistics (all, small pool, large pool) of four numbers (current, peak,
/// allocated, freed), two single statistics of four, five counters and the
/// split limit.
pub const STATS_LEN: usize = 9 * 3 * 4 + 2 * 4 + 5 + 1;

/// Where `allocated_bytes.all.current` sits among [`cachalot_device_stats`]'s
/// numbers (the fifth array, its first statistic, its first number).
pub const STATS_ALLOCATED_NOW: usize = 4 * 12;

/// Where `reserved_bytes.all.current` sits (the sixth array).
pub const STATS_RESERVED_NOW: usize = 5 * 12;

/// What an out-of-memory failure tells PyTorch's out-of-memory observers.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct OomInfo {
    /// The device ordinal.
    pub device: i64,
    /// Bytes in allocated blocks.
    pub allocated: u64,
    /// The device's total memory.
    pub device_total: u64,
    /// The device's free memory.
    pub device_free: u64,
}

/// Allocates `size` bytes on `device` for use on `stream` (a `cudaStream_t`) and
/// writes the address to `*out` (NULL for 0 bytes). On out of memory returns
/// [`OOM`], with PyTorch's message and cachalot's breakdown in `*message` and
/// the observers' figures in `*oom`.
///
/// # Safety
/// `out` must point to a writable pointer; `message` and `oom` must be NULL or
/// point to writable values of their types.
#[no_mangle]
pub unsafe extern "C" fn cachalot_malloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
    out: *mut *mut c_void,
    message: *mut *mut c_char,
    oom: *mut OomInfo,
) -> c_int {
    reply(message, || {
        let registry = registry()?;
        let size = i64::try_from(size).unwrap_or(i64::MAX);
        let stream = cachalot::StreamId(stream.addr() as u64);
        match registry.malloc(size, i64::from(device), stream) {
            Ok(addr) => {
                put(out, ptr::without_provenance_mut(addr as usize));
                Ok(())
            }
            Err(e) => {
                if let PluginError::Allocator {
                    source: Error::OutOfMemory(report),
                    ..
                } = &e
                {
                    put(oom, oom_info(report));
                }
                Err(oom_message(e))
            }
        }
    })
}

fn oom_info(report: &cachalot::error::OomReport) -> OomInfo {
    OomInfo {
        device: report.device as i64,
        allocated: report.allocated,
        device_total: report.capacity,
        device_free: report.device_free,
    }
}

/// PyTorch's sentence for a request of 1 EiB or more.
pub const TOO_LARGE: &str = "CUDA out of memory. Tried to allocate more than 1EB memory.";

/// An out-of-memory error with the whole description (PyTorch's sentence, the
/// breakdown, the advice), a request of 1 EiB or more with PyTorch's sentence
/// for it; other errors as they are.
fn oom_message(error: PluginError) -> PluginError {
    match error {
        PluginError::Allocator {
            device,
            source: Error::OutOfMemory(report),
        } => PluginError::OutOfMemory {
            device,
            description: cachalot::report::oom::describe(&report),
        },
        PluginError::Allocator {
            device,
            source: Error::TooLarge { .. },
        } => PluginError::OutOfMemory {
            device,
            description: TOO_LARGE.to_string(),
        },
        other => other,
    }
}

/// Frees `ptr`, whichever device handed it out. NULL is a no-op.
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_free_any(ptr: *mut c_void, message: *mut *mut c_char) -> c_int {
    reply(message, || registry()?.free_any(ptr.addr() as u64))
}

/// Marks `ptr` as used on `stream`, so its free waits for the work queued there.
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_record_stream_to(
    ptr: *mut c_void,
    stream: *mut c_void,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        registry()?.record_stream(ptr.addr() as u64, cachalot::StreamId(stream.addr() as u64))
    })
}

/// Returns every device's cached, unused memory to the driver.
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_release_cache(message: *mut *mut c_char) -> c_int {
    reply(message, || registry()?.empty_cache())
}

/// Limits `device` to `fraction` of its memory.
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_limit_fraction(
    fraction: c_double,
    device: c_int,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        registry()?.set_memory_fraction(fraction, i64::from(device))
    })
}

/// Writes `device`'s statistics to `out` ([`STATS_LEN`] numbers, in the order
/// of PyTorch's `DeviceStats`: see [`stats_numbers`]).
///
/// # Safety
/// `out` must point to `len` writable `int64_t`; `message` must be NULL or
/// point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_device_stats(
    device: c_int,
    out: *mut i64,
    len: usize,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        if out.is_null() || len < STATS_LEN {
            return Err(PluginError::InvalidArgument(format!(
                "the statistics need {STATS_LEN} numbers, {len} given"
            )));
        }
        let numbers = stats_numbers(&registry()?.device(i64::from(device))?.stats());
        // SAFETY: `out` holds at least `len >= STATS_LEN` writable numbers.
        unsafe { std::slice::from_raw_parts_mut(out, STATS_LEN) }.copy_from_slice(&numbers);
        Ok(())
    })
}

/// The statistics as [`STATS_LEN`] numbers, in the order of PyTorch's
/// `DeviceStats` ([`MemoryStats::to_numbers`]).
pub fn stats_numbers(stats: &MemoryStats) -> [i64; STATS_LEN] {
    stats.to_numbers().try_into().unwrap_or([0; STATS_LEN])
}

/// Sets every peak of `device` to its current value.
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_reset_peaks(device: c_int, message: *mut *mut c_char) -> c_int {
    reply(message, || {
        registry()?.device(i64::from(device))?.reset_peak_stats();
        Ok(())
    })
}

/// Zeroes every cumulative total and counter of `device`.
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_reset_totals(device: c_int, message: *mut *mut c_char) -> c_int {
    reply(message, || {
        registry()?
            .device(i64::from(device))?
            .reset_accumulated_stats();
        Ok(())
    })
}

/// Writes the size of `device`'s largest free cached block to `*largest`
/// (PyTorch's `cacheInfo`).
///
/// # Safety
/// `largest` must point to a writable `size_t`; `message` must be NULL or
/// point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_largest_free_block(
    device: c_int,
    largest: *mut usize,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        let snapshot = registry()?.device(i64::from(device))?.snapshot();
        let size = OomBreakdown::from_snapshot(&snapshot).largest_free_block;
        put(largest, size as usize);
        Ok(())
    })
}

/// Writes the segment that holds `ptr`: its base address to `*base` and its
/// size to `*size` (PyTorch's `getBaseAllocation`).
///
/// # Safety
/// `base` and `size` must point to writable values; `message` must be NULL or
/// point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_segment_of(
    ptr: *mut c_void,
    base: *mut *mut c_void,
    size: *mut usize,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        let addr = ptr.addr() as u64;
        let found = registry()?.devices().find_map(|(_, allocator)| {
            allocator
                .snapshot()
                .segments
                .into_iter()
                .find(|s| addr >= s.address && addr < s.address + s.total_size)
        });
        let segment = found.ok_or(PluginError::UnknownPointer(addr))?;
        put(base, ptr::without_provenance_mut(segment.address as usize));
        put(size, segment.total_size as usize);
        Ok(())
    })
}

/// Starts (`enabled` non-zero) or stops history recording on every device.
/// `max_entries` bounds each device's events (0: unbounded); `skip` holds
/// `skip_count` names of PyTorch's trace actions not to record (`alloc`,
/// `free_requested`, ..., `oom`; a tag's pause and resume go with
/// `segment_unmap` and `segment_map`); `clear` non-zero forgets the events
/// recorded so far (they are also forgotten when recording starts). An
/// unknown name fails, changing nothing.
///
/// # Safety
/// `skip` must point to `skip_count` NUL-terminated strings (or be NULL when
/// `skip_count` is 0); `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_set_history(
    enabled: c_int,
    max_entries: usize,
    skip: *const *const c_char,
    skip_count: usize,
    clear: c_int,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        // SAFETY: the caller passes `skip_count` valid C strings at `skip`.
        let names = unsafe { c_strings(skip, skip_count) }?;
        let skip = skipped_actions(&names)?;
        let config = (enabled != 0).then_some(HistoryConfig {
            capacity: if max_entries == 0 {
                usize::MAX
            } else {
                max_entries
            },
            backtraces: false,
            skip,
        });
        registry()?.set_history(config, clear != 0);
        Ok(())
    })
}

/// The `n` C strings at `strings`, as text.
///
/// # Safety
/// `strings` must point to `n` NUL-terminated strings, or be NULL when `n` is 0.
unsafe fn c_strings(strings: *const *const c_char, n: usize) -> Result<Vec<String>, PluginError> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if strings.is_null() {
        return Err(PluginError::InvalidArgument(format!(
            "{n} names at a NULL pointer"
        )));
    }
    // SAFETY: the caller guarantees `n` readable pointers at `strings`.
    let pointers = unsafe { std::slice::from_raw_parts(strings, n) };
    pointers
        .iter()
        .map(|p| {
            if p.is_null() {
                return Err(PluginError::InvalidArgument("a NULL name".into()));
            }
            // SAFETY: each non-NULL pointer is a NUL-terminated string (caller).
            let name = unsafe { std::ffi::CStr::from_ptr(*p) };
            Ok(name.to_string_lossy().into_owned())
        })
        .collect()
}

/// The actions not to record, for PyTorch's names of them: a tag's pause
/// and resume go with the unmap and map PyTorch shows them as.
fn skipped_actions(names: &[String]) -> Result<Vec<Action>, PluginError> {
    let pytorchs = || Action::ALL.into_iter().filter(|a| shown_as(*a) == *a);
    let mut skip = Vec::new();
    for name in names {
        let shown: Action = name.parse().map_err(|_| {
            let known: Vec<&str> = pytorchs().map(Action::name).collect();
            PluginError::InvalidArgument(format!(
                "unknown trace action to skip: '{name}' (one of {})",
                known.join(", ")
            ))
        })?;
        if shown_as(shown) != shown {
            return Err(PluginError::InvalidArgument(format!(
                "'{name}' is not one of PyTorch's trace actions"
            )));
        }
        skip.extend(Action::ALL.into_iter().filter(|a| shown_as(*a) == shown));
    }
    Ok(skip)
}

/// Every device's segments, blocks and recorded events, owned by the library
/// until [`cachalot_snapshot_free`].
#[repr(C)]
#[derive(Debug)]
pub struct Snapshot {
    /// The segments, by device then address.
    pub segments: *const SegmentRow,
    /// How many segments.
    pub segment_count: usize,
    /// The blocks of every segment.
    pub blocks: *const BlockRow,
    /// How many blocks.
    pub block_count: usize,
    /// The recorded events, by device, oldest first.
    pub trace: *const TraceRow,
    /// How many events.
    pub trace_count: usize,
}

/// Takes a snapshot of every open device (recording a `snapshot` event where
/// history is on). Free it with [`cachalot_snapshot_free`]; NULL on failure.
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_snapshot_take(message: *mut *mut c_char) -> *mut Snapshot {
    let mut made = ptr::null_mut();
    reply(message, || {
        let (segments, blocks, trace) = crate::report::snapshot_rows(registry()?);
        let segments = Box::leak(segments.into_boxed_slice());
        let blocks = Box::leak(blocks.into_boxed_slice());
        let trace = Box::leak(trace.into_boxed_slice());
        made = Box::into_raw(Box::new(Snapshot {
            segments: segments.as_ptr(),
            segment_count: segments.len(),
            blocks: blocks.as_ptr(),
            block_count: blocks.len(),
            trace: trace.as_ptr(),
            trace_count: trace.len(),
        }));
        Ok(())
    });
    made
}

/// Frees a snapshot. NULL is a no-op.
///
/// # Safety
/// `snapshot` must be NULL or a pointer from [`cachalot_snapshot_take`] not
/// freed yet.
#[no_mangle]
pub unsafe extern "C" fn cachalot_snapshot_free(snapshot: *mut Snapshot) {
    if snapshot.is_null() {
        return;
    }
    // SAFETY: by the contract, `snapshot` came from `Box::into_raw` in
    // `cachalot_snapshot_take`, and each of its arrays from a leaked boxed slice
    // of exactly its count; each is freed once, here.
    unsafe {
        let s = Box::from_raw(snapshot);
        drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
            s.segments.cast_mut(),
            s.segment_count,
        )));
        drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
            s.blocks.cast_mut(),
            s.block_count,
        )));
        drop(Box::from_raw(ptr::slice_from_raw_parts_mut(
            s.trace.cast_mut(),
            s.trace_count,
        )));
    }
}

/// Tells `device`'s allocator PyTorch's hash of `stream` (a `cudaStream_t`),
/// which orders PyTorch's tables of streams (see
/// [`cachalot::DeviceAllocator::set_stream_hash`]).
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_stream_hash(
    device: c_int,
    stream: *mut c_void,
    hash: u64,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        let (_, allocator) = registry()?.open(i64::from(device))?;
        allocator.set_stream_hash(cachalot::StreamId(stream.addr() as u64), hash);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_numbers_follow_device_stats_order() {
        let mut stats = MemoryStats::new(Some(64 << 20));
        stats.allocation.large_pool.current = 3;
        stats.requested_bytes.small_pool.freed = 9;
        stats.oversize_segments.peak = 4;
        stats.num_ooms = 2;
        let n = stats_numbers(&stats);
        assert_eq!(n[2 * 4], 3, "allocation.large_pool.current");
        assert_eq!(n[8 * 12 + 4 + 3], 9, "requested_bytes.small_pool.freed");
        assert_eq!(n[108 + 4 + 1], 4, "oversize_segments.peak");
        assert_eq!(n[116 + 1], 2, "num_ooms");
        assert_eq!(n[STATS_LEN - 1], 64 << 20, "max_split_size");
        assert_eq!(
            stats.to_numbers().len(),
            STATS_LEN,
            "every statistic has its place"
        );
    }

    #[test]
    fn the_exported_positions_name_their_statistics() {
        let mut stats = MemoryStats::new(None);
        stats.allocated_bytes.all.current = 11;
        stats.reserved_bytes.all.current = 22;
        let n = stats_numbers(&stats);
        assert_eq!((n[STATS_ALLOCATED_NOW], n[STATS_RESERVED_NOW]), (11, 22));
    }

    #[test]
    fn skipped_actions_go_by_pytorchs_names_with_their_aliases() {
        let names = ["segment_unmap".to_string(), "oom".to_string()];
        let skip = skipped_actions(&names).unwrap();
        assert_eq!(
            skip,
            [Action::SegmentUnmap, Action::SegmentPause, Action::Oom],
            "a tag's pause goes with the unmap PyTorch shows it as"
        );
        for bad in ["segment_pause", "frees", ""] {
            let err = skipped_actions(&[bad.to_string()]).unwrap_err();
            assert!(err.to_string().contains(bad), "{err}");
        }
        // SAFETY: two valid C strings, then none at all.
        let (a, b) = (c"alloc", c"free_requested");
        let names = unsafe { c_strings([a.as_ptr(), b.as_ptr()].as_ptr(), 2) }.unwrap();
        assert_eq!(names, ["alloc", "free_requested"]);
        assert!(unsafe { c_strings(ptr::null(), 0) }.unwrap().is_empty());
        assert!(unsafe { c_strings(ptr::null(), 1) }.is_err());
    }

    #[test]
    fn failures_carry_their_message_and_kind() {
        let mut message = ptr::null_mut();
        let status = reply(&mut message, || Err(PluginError::InvalidDevice(-3)));
        assert_eq!(status, ERROR);
        // SAFETY: `reply` set `message` to a string of this library.
        let text = unsafe { std::ffi::CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: freed once.
        unsafe { crate::ffi::cachalot_string_free(message) };
        assert_eq!(text, "invalid device -3");
        let oom = PluginError::OutOfMemory {
            device: 0,
            description: "CUDA out of memory.".into(),
        };
        assert_eq!(reply(ptr::null_mut(), || Err(oom)), OOM);
        assert_eq!(reply(ptr::null_mut(), || Ok(())), OK);
    }

    #[test]
    fn a_request_of_an_exbibyte_gets_pytorchs_sentence() {
        let too_large = PluginError::Allocator {
            device: 1,
            source: Error::TooLarge {
                requested: 1 << 63,
                limit: 1 << 60,
            },
        };
        let e = oom_message(too_large);
        assert!(crate::reply::is_oom(&e));
        assert_eq!(e.to_string(), TOO_LARGE);
    }
}
