//! The C entry points of private pools: CUDA graph capture
//! (`beginAllocateToPool` with a filter on the capturing stream),
//! `torch.cuda.MemPool` (`createOrIncrefPool`, `setUseOnOOM`, `setNoSplit`,
//! `use_mem_pool`'s per-thread filter), `releasePool`, `getPoolUseCount`,
//! `emptyCache(pool)` and `checkPoolLiveAllocations`. A pool is named by
//! PyTorch's `MempoolId_t`, passed as its two integers.
//!
//! A route's filter stays in C++: the library calls it back through
//! [`RouteAccepts`] with the request's stream, on the requesting thread, and
//! releases it through [`RouteDrop`] when the route closes. So does a pool's
//! own allocator (`MemPool(allocator=...)`): the library asks it for the
//! pool's segments through [`SourceAllocate`] and gives them back through
//! [`SourceFree`].

use std::ffi::{c_char, c_int, c_void};
use std::sync::Arc;

use cachalot::backend::{BackendError, BackendResult, CallKind};
use cachalot::private_pool::{PoolAllocation, PoolId, PoolOptions, SegmentSource};
use cachalot::{DeviceAllocator, StreamId};

use crate::error::{PluginError, PluginResult};
use crate::global::registry;
use crate::reply::{put, reply};

/// Whether a route takes requests of `stream` (a `cudaStream_t`): non-zero
/// for yes. Must not unwind and must be callable from any thread.
pub type RouteAccepts = unsafe extern "C" fn(ctx: *mut c_void, stream: *mut c_void) -> c_int;

/// Releases a route's `ctx`. Must not unwind.
pub type RouteDrop = unsafe extern "C" fn(ctx: *mut c_void);

/// A filter owned by C++.
struct CFilter {
    accepts: RouteAccepts,
    drop: RouteDrop,
    ctx: *mut c_void,
}

// SAFETY: by `cachalot_pool_begin`'s contract, `accepts` may be called with
// `ctx` from any thread and `drop` once from any thread.
unsafe impl Send for CFilter {}
// SAFETY: as above; `accepts` only reads `ctx`.
unsafe impl Sync for CFilter {}

impl CFilter {
    fn accepts(&self, stream: StreamId) -> bool {
        let stream = std::ptr::without_provenance_mut(stream.0 as usize);
        // SAFETY: `ctx` lives until `drop` (called when this filter drops), and
        // `accepts` does not unwind (the contract).
        unsafe { (self.accepts)(self.ctx, stream) != 0 }
    }
}

impl Drop for CFilter {
    fn drop(&mut self) {
        // SAFETY: called once, when the library drops the route.
        unsafe { (self.drop)(self.ctx) }
    }
}

/// A pool's own allocator: `size` bytes, or NULL when it has none. Must not
/// unwind and must be callable from any thread.
pub type SourceAllocate = unsafe extern "C" fn(ctx: *mut c_void, size: usize) -> *mut c_void;

/// Gives `size` bytes at `ptr` back to a pool's own allocator: 0 for done.
/// Must not unwind and must be callable from any thread.
pub type SourceFree =
    unsafe extern "C" fn(ctx: *mut c_void, ptr: *mut c_void, size: usize) -> c_int;

/// A pool's own allocator, owned by C++ (`ctx`, released through `drop` once
/// the pool and its last segment are gone).
struct CSource {
    allocate: SourceAllocate,
    free: SourceFree,
    drop: RouteDrop,
    ctx: *mut c_void,
}

// SAFETY: by `cachalot_pool_set_source`'s contract, `allocate` and `free` may
// be called with `ctx` from any thread, and `drop` once from any thread.
unsafe impl Send for CSource {}
// SAFETY: as above; the callbacks do their own locking.
unsafe impl Sync for CSource {}

impl std::fmt::Debug for CSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CSource").field("ctx", &self.ctx).finish()
    }
}

impl SegmentSource for CSource {
    fn allocate(&self, size: u64) -> BackendResult<u64> {
        let none = || BackendError::OutOfMemory {
            call: CallKind::SegmentAlloc,
            requested: size,
        };
        let bytes = usize::try_from(size).map_err(|_| none())?;
        // SAFETY: `ctx` lives until `drop` (when this source drops); the
        // callback does not unwind (the contract).
        let ptr = unsafe { (self.allocate)(self.ctx, bytes) };
        if ptr.is_null() {
            return Err(none());
        }
        Ok(ptr.addr() as u64)
    }

    fn free(&self, ptr: u64, size: u64) -> BackendResult<()> {
        let bytes = usize::try_from(size).unwrap_or(usize::MAX);
        let at = std::ptr::without_provenance_mut(ptr as usize);
        // SAFETY: as in `allocate`; `ptr` is a segment `allocate` gave.
        match unsafe { (self.free)(self.ctx, at, bytes) } {
            0 => Ok(()),
            code => Err(BackendError::Device {
                call: CallKind::SegmentFree,
                message: format!("the pool's own allocator failed to free a segment ({code})"),
            }),
        }
    }
}

impl Drop for CSource {
    fn drop(&mut self) {
        // SAFETY: called once, when the library drops the source.
        unsafe { (self.drop)(self.ctx) }
    }
}

fn id(a: u64, b: u64) -> PoolId {
    PoolId(a, b)
}

/// Runs `f` on `device`'s allocator, naming the device in its error.
fn on_device<T>(
    device: c_int,
    f: impl FnOnce(&dyn DeviceAllocator) -> cachalot::Result<T>,
) -> PluginResult<T> {
    let (index, allocator) = registry()?.open(i64::from(device))?;
    f(allocator.as_ref()).map_err(|source| PluginError::Allocator {
        device: index,
        source,
    })
}

/// Routes the requests on `device` whose stream `accepts` takes to pool
/// `(a, b)`, creating it or adding a use (PyTorch's `beginAllocateToPool`).
/// On failure `drop(ctx)` has been called.
///
/// # Safety
/// `accepts(ctx, stream)` must be callable from any thread until `drop(ctx)`,
/// which the library calls once; neither may unwind. `message` must be NULL
/// or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_pool_begin(
    device: c_int,
    a: u64,
    b: u64,
    accepts: RouteAccepts,
    drop: RouteDrop,
    ctx: *mut c_void,
    message: *mut *mut c_char,
) -> c_int {
    let filter = CFilter { accepts, drop, ctx };
    reply(message, move || {
        let filter = Arc::new(filter);
        let route = Arc::new(move |s: StreamId| filter.accepts(s));
        on_device(device, |d| d.begin_allocate_to_pool(id(a, b), route))
    })
}

/// Closes the newest route to pool `(a, b)` (`endAllocateToPool`).
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_pool_end(
    device: c_int,
    a: u64,
    b: u64,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        on_device(device, |d| d.end_allocate_to_pool(id(a, b)))
    })
}

/// Creates pool `(a, b)` or adds a use to it (`createOrIncrefPool`).
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_pool_create(
    device: c_int,
    a: u64,
    b: u64,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || on_device(device, |d| d.create_pool(id(a, b))))
}

/// Makes the pool's own allocator (`allocate`, `free` on `ctx`) give pool
/// `(a, b)`'s new segments (`MemPool(allocator=...)`). On failure `drop(ctx)`
/// has been called.
///
/// # Safety
/// `allocate` and `free` must be callable with `ctx` from any thread until
/// `drop(ctx)`, which the library calls once; none may unwind. `message` must
/// be NULL or point to a writable `char*`.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cachalot_pool_set_source(
    device: c_int,
    a: u64,
    b: u64,
    allocate: SourceAllocate,
    free: SourceFree,
    drop: RouteDrop,
    ctx: *mut c_void,
    message: *mut *mut c_char,
) -> c_int {
    let source = CSource {
        allocate,
        free,
        drop,
        ctx,
    };
    reply(message, move || {
        on_device(device, |d| d.set_pool_source(id(a, b), Arc::new(source)))
    })
}

/// Takes a use off pool `(a, b)` (`releasePool`).
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_pool_release(
    device: c_int,
    a: u64,
    b: u64,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || on_device(device, |d| d.release_pool(id(a, b))))
}

/// Writes pool `(a, b)`'s use count to `*count` (0 for an unknown pool).
///
/// # Safety
/// `count` must point to a writable `int`; `message` must be NULL or point to
/// a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_pool_use_count(
    device: c_int,
    a: u64,
    b: u64,
    count: *mut c_int,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        let n = on_device(device, |d| Ok(d.pool_use_count(id(a, b))))?;
        put(count, c_int::try_from(n).unwrap_or(c_int::MAX));
        Ok(())
    })
}

/// Which option [`cachalot_pool_set_option`] sets.
pub const OPTION_USE_ON_OOM: c_int = 0;
/// See [`OPTION_USE_ON_OOM`].
pub const OPTION_NO_SPLIT: c_int = 1;

/// Sets one option of pool `(a, b)` (`setUseOnOOM`, `setNoSplit`).
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_pool_set_option(
    device: c_int,
    a: u64,
    b: u64,
    option: c_int,
    value: c_int,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        if option != OPTION_USE_ON_OOM && option != OPTION_NO_SPLIT {
            return Err(PluginError::InvalidArgument(format!(
                "unknown pool option {option}"
            )));
        }
        on_device(device, |d| {
            let pool = id(a, b);
            let mut options: PoolOptions = d.pool_options(pool)?;
            if option == OPTION_USE_ON_OOM {
                options.use_on_oom = value != 0;
            } else {
                options.no_split = value != 0;
            }
            d.set_pool_options(pool, options)
        })
    })
}

/// Returns pool `(a, b)`'s cached memory to the device, on every device that
/// knows the pool (`emptyCache(pool)`, which a MemPool's destructor calls
/// whichever device is current); a pool no device knows is nothing to do, as
/// in PyTorch.
///
/// # Safety
/// `message` must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_pool_empty(a: u64, b: u64, message: *mut *mut c_char) -> c_int {
    reply(message, || {
        let pool = id(a, b);
        for (device, allocator) in registry()?.devices() {
            if allocator.pool_options(pool).is_err() {
                continue;
            }
            allocator
                .empty_pool_cache(pool)
                .map_err(|source| PluginError::Allocator { device, source })?;
        }
        Ok(())
    })
}

/// One live allocation of a pool.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PoolAllocationRow {
    /// Its address.
    pub ptr: u64,
    /// Its block's size.
    pub size: u64,
    /// What its caller asked for.
    pub requested: u64,
    /// Its stream (a `cudaStream_t`).
    pub stream: u64,
}

impl From<PoolAllocation> for PoolAllocationRow {
    fn from(a: PoolAllocation) -> Self {
        PoolAllocationRow {
            ptr: a.ptr,
            size: a.size,
            requested: a.requested,
            stream: a.stream.0,
        }
    }
}

impl From<PoolAllocationRow> for PoolAllocation {
    fn from(r: PoolAllocationRow) -> Self {
        PoolAllocation {
            ptr: r.ptr,
            size: r.size,
            requested: r.requested,
            stream: StreamId(r.stream),
        }
    }
}

/// Writes how many live allocations pool `(a, b)` has to `*count` and the
/// first `capacity` of them, by address, to `out`.
///
/// # Safety
/// `out` must point to `capacity` writable rows (or be NULL with `capacity`
/// 0); `count` must point to a writable `size_t`; `message` must be NULL or
/// point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_pool_allocations(
    device: c_int,
    a: u64,
    b: u64,
    out: *mut PoolAllocationRow,
    capacity: usize,
    count: *mut usize,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        let live = on_device(device, |d| d.pool_allocations(id(a, b)))?;
        put(count, live.len());
        let n = live.len().min(capacity);
        if n > 0 && !out.is_null() {
            // SAFETY: `out` holds `capacity >= n` writable rows.
            let rows = unsafe { std::slice::from_raw_parts_mut(out, n) };
            for (row, a) in rows.iter_mut().zip(live) {
                *row = a.into();
            }
        }
        Ok(())
    })
}

/// Frees every live allocation of pool `(a, b)` and allocates `rows[..n]` at
/// their addresses again (`setCheckpointPoolState`).
///
/// # Safety
/// `rows` must point to `n` readable rows (or be NULL with `n` 0); `message`
/// must be NULL or point to a writable `char*`.
#[no_mangle]
pub unsafe extern "C" fn cachalot_pool_restore(
    device: c_int,
    a: u64,
    b: u64,
    rows: *const PoolAllocationRow,
    n: usize,
    message: *mut *mut c_char,
) -> c_int {
    reply(message, || {
        let live: Vec<PoolAllocation> = if n == 0 || rows.is_null() {
            Vec::new()
        } else {
            // SAFETY: `rows` holds `n` readable rows (the contract).
            unsafe { std::slice::from_raw_parts(rows, n) }
                .iter()
                .map(|r| (*r).into())
                .collect()
        };
        on_device(device, |d| d.restore_pool(id(a, b), &live)).map(|_| ())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// What the test allocator saw: bytes handed out, frees, drops.
    static GIVEN: AtomicUsize = AtomicUsize::new(0);
    static FREED: AtomicUsize = AtomicUsize::new(0);
    static DROPPED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn give(_: *mut c_void, size: usize) -> *mut c_void {
        if size > 1 << 30 {
            return std::ptr::null_mut();
        }
        GIVEN.fetch_add(size, Ordering::SeqCst);
        std::ptr::without_provenance_mut(0x1000)
    }

    unsafe extern "C" fn take_back(_: *mut c_void, ptr: *mut c_void, _: usize) -> c_int {
        FREED.fetch_add(1, Ordering::SeqCst);
        c_int::from(ptr.addr() != 0x1000)
    }

    unsafe extern "C" fn forget(_: *mut c_void) {
        DROPPED.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn a_c_allocator_serves_a_pools_segments() {
        let source = CSource {
            allocate: give,
            free: take_back,
            drop: forget,
            ctx: std::ptr::null_mut(),
        };
        assert_eq!(source.allocate(2 << 20).unwrap(), 0x1000);
        assert!(source.allocate(2 << 30).unwrap_err().is_out_of_memory());
        source.free(0x1000, 2 << 20).unwrap();
        assert!(source.free(0x2000, 2 << 20).is_err());
        drop(source);
        assert_eq!(GIVEN.load(Ordering::SeqCst), 2 << 20);
        assert_eq!(FREED.load(Ordering::SeqCst), 2);
        assert_eq!(DROPPED.load(Ordering::SeqCst), 1);
    }
}
