//! The CUDA backend: a real GPU through the CUDA driver API (cudarc's `sys` layer,
//! loaded at run time).
//!
//! * Segments are `cuMemAlloc`/`cuMemFree` (or, from
//!   [`CudaBackend::with_runtime_segments`], the runtime's `cudaMalloc`/`cudaFree`
//!   as the process resolves them, for libraries that intercept those, with no
//!   virtual memory); virtual memory is `cuMemAddressReserve`,
//!   `cuMemCreate`, `cuMemMap` + `cuMemSetAccess`, `cuMemUnmap`, `cuMemRelease`,
//!   `cuMemAddressFree`, with pages of the device's minimum granularity. Pages
//!   are mapped readable and writable by the device and by every GPU that can
//!   reach it as a peer, so several GPUs of one process share tensors.
//! * Each backend serves one device through that device's primary context, made
//!   current on the calling thread before each call (once per thread, remembered).
//!   Several backends, one per device, give several devices.
//! * Stream ids are raw `CUstream` handles. Work may be queued on the default
//!   stream, on streams made by [`CudaBackend::create_stream`], and on streams the
//!   caller registered with [`CudaBackend::register_stream`]; any other id is an
//!   error, never a handle passed to the driver.
//! * Copies between device and host memory ([`Backend::download`],
//!   [`Backend::upload`]) run on a stream of the backend's own, made on first
//!   use; host memory from [`Backend::allocate_host`] is pinned
//!   (`cuMemHostAlloc`), so they run at the link's speed.
//! * Every segment, range, mapping, page and event handed out is remembered, and a
//!   call naming one that is not live is rejected before the driver sees it.
//! * On a machine without the driver or without a GPU, [`CudaBackend::new`] returns
//!   [`BackendError::Unavailable`]; nothing here panics.
//!
//! The inherent helpers beyond the [`Backend`] trait (streams, fills, copies, a
//! stream delay) serve tests, benchmarks and the tensor layer.
//!
//! This crate is cachalot's CUDA backend alone (cudarc and libc); programs
//! reach it as `cachalot::backend::cuda`, beside the core's backends.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(clippy::unwrap_used)]

mod capture;
mod driver;
mod host;
mod registry;
mod runtime;

pub use self::runtime::interposed as runtime_malloc_interposed;

use std::collections::HashSet;
use std::ffi::c_void;
use std::fmt;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use cudarc::driver::sys::{self, CUresult};

use self::driver::{check, Context};
use self::registry::Registry;
use self::runtime::Runtime;
use cachalot_core::backend::host::{HostMemory, ToDevice, ToHost};
use cachalot_core::backend::{
    Backend, BackendError, BackendResult, CallKind, Capabilities, DevicePtr, EventId, GraphNode,
    MemInfo, PageHandle, StreamId, IPC_HANDLE_BYTES,
};

/// One GPU, driven through the CUDA driver. See the module docs.
pub struct CudaBackend {
    caps: Capabilities,
    ctx: Context,
    /// What pages are mapped with: access for the device and its peers.
    access: Vec<sys::CUmemAccessDesc>,
    registry: RwLock<Registry>,
    /// Whether pages are created exportable (cleared when the driver refuses).
    shareable_pages: AtomicBool,
    /// Segments of other processes opened here.
    opened: Mutex<HashSet<DevicePtr>>,
    /// The stream [`Backend::download`] and [`Backend::upload`] queue copies
    /// on, made on first use.
    copy_stream: Mutex<Option<StreamId>>,
    /// Where segments come from: the runtime's `cudaMalloc` as the process
    /// resolves it, or (`None`) the driver's `cuMemAlloc`.
    runtime: Option<Runtime>,
}

impl fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaBackend")
            .field("caps", &self.caps)
            .finish_non_exhaustive()
    }
}

/// `size` checked against the call's contract (positive, a multiple of
/// `granularity` when one is given) and as the driver's `size_t`; a size the host
/// cannot even express is out of memory.
fn request_bytes(call: CallKind, size: u64, granularity: u64) -> BackendResult<usize> {
    Registry::check_size(call, size, granularity)?;
    usize::try_from(size).map_err(|_| BackendError::OutOfMemory {
        call,
        requested: size,
    })
}

fn stream_handle(stream: StreamId) -> sys::CUstream {
    stream.0 as usize as sys::CUstream
}

fn event_handle(event: EventId) -> sys::CUevent {
    event.0 as usize as sys::CUevent
}

impl CudaBackend {
    /// Opens device `ordinal`.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] when the driver library is missing, sees no GPU
    /// or no device of that ordinal; [`BackendError::Device`] when it fails.
    pub fn new(ordinal: usize) -> BackendResult<CudaBackend> {
        CudaBackend::open(ordinal, None)
    }

    /// Opens device `ordinal` with segments from the CUDA runtime's `cudaMalloc`
    /// and `cudaFree` as the process resolves them, so that a library preloaded
    /// to intercept them (torch_memory_saver's preload mode) sees every segment,
    /// as it sees PyTorch's own allocator's. Such a library cannot see pages
    /// the driver maps, so this backend has no virtual memory: the policies use
    /// segments only.
    ///
    /// # Errors
    /// As [`CudaBackend::new`]; [`BackendError::Unavailable`] also when the
    /// process has no CUDA runtime and none can be loaded.
    pub fn with_runtime_segments(ordinal: usize) -> BackendResult<CudaBackend> {
        CudaBackend::open(ordinal, Some(Runtime::find()?))
    }

    fn open(ordinal: usize, runtime: Option<Runtime>) -> BackendResult<CudaBackend> {
        let ctx = Context::retain(ordinal)?;
        ctx.bind(CallKind::MemInfo)?;
        let device = ctx.device();
        let virtual_memory = runtime.is_none() && driver::supports_virtual_memory(device)?;
        let caps = Capabilities {
            name: driver::device_name(device)?,
            device: ordinal,
            total_memory: driver::total_memory(device)?,
            virtual_memory,
            granularity: if virtual_memory {
                driver::granularity(device)?
            } else {
                0
            },
        };
        let access = if virtual_memory {
            driver::access_descriptors(device)?
        } else {
            Vec::new()
        };
        Ok(CudaBackend {
            caps,
            ctx,
            access,
            registry: RwLock::new(Registry::default()),
            shareable_pages: AtomicBool::new(true),
            opened: Mutex::new(HashSet::new()),
            copy_stream: Mutex::new(None),
            runtime,
        })
    }

    /// The number of GPUs the driver sees.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] without a driver.
    pub fn device_count() -> BackendResult<usize> {
        driver::device_count()
    }

    /// The CUDA version the driver supports, as `(major, minor)`.
    ///
    /// # Errors
    /// [`BackendError::Unavailable`] without a driver.
    pub fn driver_version() -> BackendResult<(u32, u32)> {
        driver::driver_version()
    }

    /// Makes the next call on this thread bind the device's context again: call it
    /// after code outside cachalot changed the thread's current context.
    pub fn forget_context_binding() {
        Context::forget_binding();
    }

    fn read(&self) -> RwLockReadGuard<'_, Registry> {
        // The registry is only changed after a driver call succeeded, in one step,
        // so a panic elsewhere cannot leave it half-updated: recover the guard.
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|e| e.into_inner())
    }

    /// `cuMemCreate` of `bytes`, exportable while the driver allows it: a
    /// refusal of the exportable kind (no POSIX descriptors here) falls back
    /// to plain pages for good.
    fn create_handle(
        &self,
        call: CallKind,
        size: u64,
        bytes: usize,
    ) -> BackendResult<sys::CUmemGenericAllocationHandle> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        if self.shareable_pages.load(Ordering::Relaxed) {
            let prop = driver::page_properties(self.ctx.device(), true);
            // SAFETY: the context is current; `prop` is fully initialised on our
            // stack; `handle` is a valid out-pointer; the size is a granularity
            // multiple.
            let code = driver::raw(call, || unsafe {
                sys::cuMemCreate(&mut handle, bytes, &prop, 0)
            })?;
            match code {
                CUresult::CUDA_SUCCESS => return Ok(handle),
                CUresult::CUDA_ERROR_NOT_SUPPORTED | CUresult::CUDA_ERROR_INVALID_VALUE => {
                    self.shareable_pages.store(false, Ordering::Relaxed);
                }
                _ => check(call, size, || code)?,
            }
        }
        let prop = driver::page_properties(self.ctx.device(), false);
        // SAFETY: as above.
        check(call, size, || unsafe {
            sys::cuMemCreate(&mut handle, bytes, &prop, 0)
        })?;
        Ok(handle)
    }

    /// Gives segment `ptr` back the way it came: `cudaFree` or `cuMemFree`.
    fn release_segment(&self, ptr: DevicePtr) -> BackendResult<()> {
        match &self.runtime {
            Some(runtime) => runtime.free(ptr),
            // SAFETY: `ptr` is the base of a live segment this backend
            // allocated with cuMemAlloc; the caller bound the context.
            None => check(CallKind::SegmentFree, 0, || unsafe {
                sys::cuMemFree_v2(ptr)
            }),
        }
    }

    fn opened(&self) -> std::sync::MutexGuard<'_, HashSet<DevicePtr>> {
        self.opened.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes in live segments and pages obtained through this backend.
    pub fn live_bytes(&self) -> u64 {
        self.read().live_bytes()
    }

    /// Creates a stream that does not synchronise with the default stream.
    ///
    /// # Errors
    /// [`BackendError::Device`] on driver failure.
    pub fn create_stream(&self) -> BackendResult<StreamId> {
        let call = CallKind::SynchronizeStream;
        let mut reg = self.write();
        self.ctx.bind(call)?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the context is current and `raw` is a valid out-pointer.
        check(call, 0, || unsafe { sys::cuStreamCreate(&mut raw, flags) })?;
        let stream = StreamId(raw as usize as u64);
        reg.add_stream(stream, true);
        Ok(stream)
    }

    /// Destroys a stream made by [`CudaBackend::create_stream`] (queued work still
    /// completes).
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] for a stream this backend did not create.
    pub fn destroy_stream(&self, stream: StreamId) -> BackendResult<()> {
        let call = CallKind::SynchronizeStream;
        let mut reg = self.write();
        reg.take_own_stream(stream)?;
        self.ctx.bind(call)?;
        // SAFETY: the stream was created by this backend and was live until the line
        // above forgot it; nothing else destroys it.
        check(call, 0, || unsafe {
            sys::cuStreamDestroy_v2(stream_handle(stream))
        })
    }

    /// Lets work be queued on a stream created outside this backend (by PyTorch, say).
    ///
    /// # Safety
    /// `stream` must be a live `CUstream` of this device's primary context, and stay
    /// live until [`CudaBackend::unregister_stream`] or the backend's drop.
    pub unsafe fn register_stream(&self, stream: StreamId) {
        self.write().add_stream(stream, false);
    }

    /// Forgets a stream registered with [`CudaBackend::register_stream`]; whether it
    /// was registered.
    pub fn unregister_stream(&self, stream: StreamId) -> bool {
        self.write().remove_foreign_stream(stream)
    }

    /// Queues a fill of `count` 32-bit words of `value` from `ptr` on `stream`.
    ///
    /// # Errors
    /// [`BackendError::InvalidArgument`] when the words are not all inside live
    /// device memory of this backend or `ptr` is not 4-byte aligned;
    /// [`BackendError::InvalidAddress`] for an unknown stream.
    pub fn fill_u32(
        &self,
        ptr: DevicePtr,
        value: u32,
        count: u64,
        stream: StreamId,
    ) -> BackendResult<()> {
        let call = CallKind::SynchronizeStream;
        let reg = self.read();
        if !ptr.is_multiple_of(4) {
            return Err(BackendError::InvalidArgument {
                call,
                reason: format!("{ptr:#x} is not 4-byte aligned"),
            });
        }
        reg.check_accessible(call, ptr, count.saturating_mul(4))?;
        reg.check_stream(call, stream)?;
        self.ctx.bind(call)?;
        let n = usize::try_from(count).map_err(|_| BackendError::InvalidArgument {
            call,
            reason: "too many words".into(),
        })?;
        // SAFETY: the words lie inside live memory of this context (checked above, and
        // the read lock keeps it live while the fill is queued); the stream is known.
        check(call, 0, || unsafe {
            sys::cuMemsetD32Async(ptr, value, n, stream_handle(stream))
        })
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst`, ordered after the
    /// work queued on `stream`, and waits for the copy.
    ///
    /// # Errors
    /// As for [`CudaBackend::fill_u32`].
    pub fn copy_to_host(
        &self,
        src: DevicePtr,
        dst: &mut [u8],
        stream: StreamId,
    ) -> BackendResult<()> {
        let call = CallKind::SynchronizeStream;
        let reg = self.read();
        reg.check_accessible(call, src, dst.len() as u64)?;
        reg.check_stream(call, stream)?;
        self.ctx.bind(call)?;
        let s = stream_handle(stream);
        // SAFETY: the source lies inside live device memory (checked, and kept live by
        // the read lock); `dst` is a writable host buffer of exactly that length that
        // outlives the copy, because we synchronise the stream before returning.
        check(call, 0, || unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast::<c_void>(), src, dst.len(), s)
        })?;
        // SAFETY: the stream is known to this backend.
        check(call, 0, || unsafe { sys::cuStreamSynchronize(s) })
    }

    /// Copies `src` to device address `dst`, ordered after the work queued on
    /// `stream`, and waits for the copy.
    ///
    /// # Errors
    /// As for [`CudaBackend::fill_u32`].
    pub fn copy_from_host(
        &self,
        src: &[u8],
        dst: DevicePtr,
        stream: StreamId,
    ) -> BackendResult<()> {
        let call = CallKind::SynchronizeStream;
        let reg = self.read();
        reg.check_accessible(call, dst, src.len() as u64)?;
        reg.check_stream(call, stream)?;
        self.ctx.bind(call)?;
        let s = stream_handle(stream);
        // SAFETY: the destination lies inside live device memory (checked, kept live by
        // the read lock); `src` outlives the copy because we synchronise before return.
        check(call, 0, || unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.as_ptr().cast::<c_void>(), src.len(), s)
        })?;
        // SAFETY: the stream is known to this backend.
        check(call, 0, || unsafe { sys::cuStreamSynchronize(s) })
    }

    /// Holds `stream` busy for `delay` (at most about 71 minutes): work queued on it
    /// afterwards starts only once the delay has passed. For tests of frees with work
    /// still running on another stream.
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] for an unknown stream.
    pub fn delay_stream(&self, stream: StreamId, delay: Duration) -> BackendResult<()> {
        let call = CallKind::SynchronizeStream;
        let reg = self.read();
        reg.check_stream(call, stream)?;
        self.ctx.bind(call)?;
        let micros = usize::try_from(delay.as_micros()).unwrap_or(usize::MAX);
        // SAFETY: `sleep_host` is a plain function that calls no CUDA function; its
        // argument is a number smuggled in the pointer, never dereferenced. The
        // stream is known to this backend.
        check(call, 0, || unsafe {
            sys::cuLaunchHostFunc(
                stream_handle(stream),
                Some(sleep_host),
                micros as *mut c_void,
            )
        })
    }
}

/// Host function queued by [`CudaBackend::delay_stream`]: sleeps for the number of
/// microseconds carried in `micros`.
unsafe extern "C" fn sleep_host(micros: *mut c_void) {
    std::thread::sleep(Duration::from_micros(micros as usize as u64));
}

impl Backend for CudaBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn mem_info(&self) -> BackendResult<MemInfo> {
        let call = CallKind::MemInfo;
        self.ctx.bind(call)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: the context is current; both are valid out-pointers.
        check(call, 0, || unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn allocate_segment(&self, size: u64) -> BackendResult<DevicePtr> {
        let call = CallKind::SegmentAlloc;
        let bytes = request_bytes(call, size, 0)?;
        let mut reg = self.write();
        self.ctx.bind(call)?;
        let ptr = match &self.runtime {
            Some(runtime) => runtime.malloc(bytes, size)?,
            None => {
                let mut ptr: sys::CUdeviceptr = 0;
                // SAFETY: the context is current and `ptr` is a valid out-pointer.
                check(call, size, || unsafe {
                    sys::cuMemAlloc_v2(&mut ptr, bytes)
                })?;
                ptr
            }
        };
        reg.add_segment(ptr, size);
        Ok(ptr)
    }

    fn free_segment(&self, ptr: DevicePtr) -> BackendResult<()> {
        let call = CallKind::SegmentFree;
        let mut reg = self.write();
        reg.check_segment(ptr)?;
        self.ctx.bind(call)?;
        self.release_segment(ptr)?;
        reg.remove_segment(ptr);
        Ok(())
    }

    fn reserve_range(&self, size: u64) -> BackendResult<DevicePtr> {
        let call = CallKind::ReserveRange;
        self.require_virtual_memory(call)?;
        let bytes = request_bytes(call, size, self.caps.granularity)?;
        let align = self.caps.granularity as usize;
        let mut reg = self.write();
        self.ctx.bind(call)?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: the context is current; `base` is a valid out-pointer; no fixed
        // address is asked for (0) and no flags.
        check(call, size, || unsafe {
            sys::cuMemAddressReserve(&mut base, bytes, align, 0, 0)
        })?;
        reg.add_range(base, size);
        Ok(base)
    }

    fn release_range(&self, base: DevicePtr, size: u64) -> BackendResult<()> {
        let call = CallKind::ReleaseRange;
        self.require_virtual_memory(call)?;
        let mut reg = self.write();
        reg.check_range_release(base, size)?;
        self.ctx.bind(call)?;
        // SAFETY: `base`/`size` is exactly a live reserved range with nothing mapped.
        check(call, 0, || unsafe {
            sys::cuMemAddressFree(base, size as usize)
        })?;
        reg.remove_range(base);
        Ok(())
    }

    fn create_page(&self, size: u64) -> BackendResult<PageHandle> {
        let call = CallKind::CreatePage;
        self.require_virtual_memory(call)?;
        let bytes = request_bytes(call, size, self.caps.granularity)?;
        let mut reg = self.write();
        self.ctx.bind(call)?;
        let handle = self.create_handle(call, size, bytes)?;
        reg.add_page(PageHandle(handle), size);
        Ok(PageHandle(handle))
    }

    fn release_page(&self, page: PageHandle) -> BackendResult<()> {
        let call = CallKind::ReleasePage;
        self.require_virtual_memory(call)?;
        let mut reg = self.write();
        reg.check_page_release(page)?;
        self.ctx.bind(call)?;
        // SAFETY: the page is live and mapped nowhere.
        check(call, 0, || unsafe { sys::cuMemRelease(page.0) })?;
        reg.remove_page(page);
        Ok(())
    }

    fn map(&self, addr: DevicePtr, page: PageHandle) -> BackendResult<()> {
        let call = CallKind::Map;
        self.require_virtual_memory(call)?;
        let mut reg = self.write();
        let size = reg.check_map(addr, page, self.caps.granularity)?;
        self.ctx.bind(call)?;
        let bytes = size as usize;
        // SAFETY: the whole page fits at an aligned address inside a reserved range
        // with no mapping there (checked); the page is live.
        check(call, 0, || unsafe {
            sys::cuMemMap(addr, bytes, 0, page.0, 0)
        })?;
        let access = &self.access;
        // SAFETY: `addr`/`bytes` is exactly the mapping made above; `access`
        // holds `access.len()` initialised descriptors.
        if let Err(e) = check(call, 0, || unsafe {
            sys::cuMemSetAccess(addr, bytes, access.as_ptr(), access.len())
        }) {
            // SAFETY: undoes the mapping made above, which nothing else knows of.
            let _ = check(CallKind::Unmap, 0, || unsafe {
                sys::cuMemUnmap(addr, bytes)
            });
            return Err(e);
        }
        reg.add_mapping(addr, page, size);
        Ok(())
    }

    fn unmap(&self, addr: DevicePtr, size: u64) -> BackendResult<()> {
        let call = CallKind::Unmap;
        self.require_virtual_memory(call)?;
        let mut reg = self.write();
        let mappings = reg.check_unmap(addr, size)?;
        self.ctx.bind(call)?;
        for m in mappings {
            // SAFETY: `m` is one live mapping of a whole page, as recorded by `map`.
            check(call, 0, || unsafe {
                sys::cuMemUnmap(m.addr, m.size as usize)
            })?;
            reg.remove_mapping(m);
        }
        Ok(())
    }

    fn create_event(&self) -> BackendResult<EventId> {
        let call = CallKind::CreateEvent;
        let mut reg = self.write();
        self.ctx.bind(call)?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: the context is current and `raw` is a valid out-pointer.
        check(call, 0, || unsafe { sys::cuEventCreate(&mut raw, flags) })?;
        let event = EventId(raw as usize as u64);
        reg.add_event(event);
        Ok(event)
    }

    fn destroy_event(&self, event: EventId) -> BackendResult<()> {
        let call = CallKind::DestroyEvent;
        let mut reg = self.write();
        reg.check_event(call, event)?;
        self.ctx.bind(call)?;
        // SAFETY: the event is live and created by this backend.
        check(call, 0, || unsafe {
            sys::cuEventDestroy_v2(event_handle(event))
        })?;
        reg.remove_event(event);
        Ok(())
    }

    fn record_event(&self, event: EventId, stream: StreamId) -> BackendResult<()> {
        let call = CallKind::RecordEvent;
        let reg = self.read();
        reg.check_event(call, event)?;
        reg.check_stream(call, stream)?;
        self.ctx.bind(call)?;
        // SAFETY: event and stream are live and belong to this context; the read lock
        // keeps them so during the call.
        check(call, 0, || unsafe {
            sys::cuEventRecord(event_handle(event), stream_handle(stream))
        })
    }

    fn query_event(&self, event: EventId) -> BackendResult<bool> {
        let call = CallKind::QueryEvent;
        let reg = self.read();
        reg.check_event(call, event)?;
        self.ctx.bind(call)?;
        // SAFETY: the event is live (checked; kept so by the read lock).
        match driver::raw(call, || unsafe { sys::cuEventQuery(event_handle(event)) })? {
            CUresult::CUDA_SUCCESS => Ok(true),
            CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(BackendError::Device {
                call,
                message: driver::error_name(code),
            }),
        }
    }

    fn synchronize_event(&self, event: EventId) -> BackendResult<()> {
        let call = CallKind::SynchronizeEvent;
        let reg = self.read();
        reg.check_event(call, event)?;
        self.ctx.bind(call)?;
        // SAFETY: the event is live (checked; the read lock keeps it so while we wait).
        check(call, 0, || unsafe {
            sys::cuEventSynchronize(event_handle(event))
        })
    }

    fn synchronize_stream(&self, stream: StreamId) -> BackendResult<()> {
        let call = CallKind::SynchronizeStream;
        let reg = self.read();
        reg.check_stream(call, stream)?;
        self.ctx.bind(call)?;
        // SAFETY: the stream is known (checked; the read lock keeps it so while we wait).
        check(call, 0, || unsafe {
            sys::cuStreamSynchronize(stream_handle(stream))
        })
    }

    fn synchronize_device(&self) -> BackendResult<()> {
        let call = CallKind::SynchronizeDevice;
        self.ctx.bind(call)?;
        // SAFETY: the context is current; the call takes no arguments.
        check(call, 0, || unsafe { sys::cuCtxSynchronize() })
    }

    fn capture_frontier(&self, stream: StreamId) -> BackendResult<Option<Vec<GraphNode>>> {
        let call = CallKind::CaptureInfo;
        let reg = self.read();
        reg.check_stream(call, stream)?;
        self.ctx.bind(call)?;
        // SAFETY: the stream is known (checked; kept so by the read lock).
        let nodes = unsafe { capture::frontier(stream_handle(stream))? };
        Ok(nodes.map(|v| {
            v.into_iter()
                .map(|n| GraphNode(n as usize as u64))
                .collect()
        }))
    }

    fn capture_follows(&self, stream: StreamId, marks: &[GraphNode]) -> BackendResult<bool> {
        let call = CallKind::CaptureInfo;
        let reg = self.read();
        reg.check_stream(call, stream)?;
        self.ctx.bind(call)?;
        // SAFETY: the stream is known (checked; kept so by the read lock).
        let Some(start) = (unsafe { capture::frontier(stream_handle(stream))? }) else {
            return Ok(false);
        };
        // SAFETY: `start` is the frontier of a capture in progress on this
        // thread's stream; its graph lives while the capture does.
        unsafe { capture::reaches(start, marks) }
    }

    fn export_segment(&self, base: DevicePtr) -> BackendResult<[u8; IPC_HANDLE_BYTES]> {
        let call = CallKind::ExportSegment;
        self.read().check_segment(base)?;
        self.ctx.bind(call)?;
        let mut handle = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: the context is current; `base` is a live segment's base; `handle`
        // is a valid out-pointer.
        check(call, 0, || unsafe {
            sys::cuIpcGetMemHandle(&mut handle, base)
        })?;
        // `c_char` is `i8` on x86_64 and `u8` on aarch64: the bytes as they are.
        Ok(handle.reserved.map(|b| b.to_ne_bytes()[0]))
    }

    fn open_segment(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> BackendResult<DevicePtr> {
        let call = CallKind::OpenSegment;
        self.ctx.bind(call)?;
        let handle = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the context is current; `ptr` is a valid out-pointer; the driver
        // checks the handle's bytes.
        check(call, 0, || unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut ptr, handle, flags)
        })?;
        self.opened().insert(ptr);
        Ok(ptr)
    }

    fn close_segment(&self, ptr: DevicePtr) -> BackendResult<()> {
        let call = CallKind::CloseSegment;
        let mut opened = self.opened();
        if !opened.contains(&ptr) {
            return Err(BackendError::InvalidAddress {
                call,
                what: "opened segment",
                value: ptr,
            });
        }
        self.ctx.bind(call)?;
        // SAFETY: `ptr` came from cuIpcOpenMemHandle here and is not closed yet.
        check(call, 0, || unsafe { sys::cuIpcCloseMemHandle(ptr) })?;
        opened.remove(&ptr);
        Ok(())
    }

    fn export_page(&self, page: PageHandle) -> BackendResult<OwnedFd> {
        let call = CallKind::ExportPage;
        if !self.read().has_page(page) {
            return Err(BackendError::InvalidAddress {
                call,
                what: "page",
                value: page.0,
            });
        }
        self.ctx.bind(call)?;
        let mut fd: std::ffi::c_int = -1;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: the page is live; for POSIX descriptors the driver writes one
        // int through the pointer, which points at `fd` on our stack.
        check(call, 0, || unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast::<c_void>(),
                page.0,
                kind,
                0,
            )
        })?;
        // SAFETY: on success the driver opened `fd` for us; nothing else owns it.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn allocate_host(&self, size: u64) -> BackendResult<Box<dyn HostMemory>> {
        Ok(Box::new(host::PinnedHost::allocate(
            self.caps.device,
            size,
        )?))
    }

    fn download(&self, copies: &mut [ToHost<'_>]) -> BackendResult<()> {
        self.download_batch(copies)
    }

    fn upload(&self, copies: &[ToDevice<'_>]) -> BackendResult<()> {
        self.upload_batch(copies)
    }

    fn import_page(&self, fd: BorrowedFd<'_>, size: u64) -> BackendResult<PageHandle> {
        let call = CallKind::ImportPage;
        self.require_virtual_memory(call)?;
        Registry::check_size(call, size, self.caps.granularity)?;
        let mut reg = self.write();
        self.ctx.bind(call)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        let kind = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for POSIX descriptors the driver takes the descriptor's value in
        // the pointer argument and only reads it; `handle` is a valid out-pointer.
        check(call, size, || unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as usize as *mut c_void,
                kind,
            )
        })?;
        reg.add_page(PageHandle(handle), size);
        Ok(PageHandle(handle))
    }
}

impl CudaBackend {
    fn require_virtual_memory(&self, call: CallKind) -> BackendResult<()> {
        if self.caps.virtual_memory {
            Ok(())
        } else {
            Err(BackendError::Unsupported {
                call,
                backend: "cuda",
            })
        }
    }
}

impl Drop for CudaBackend {
    /// Waits for the device, then returns whatever is still live to the driver, so a
    /// dropped backend leaks nothing. Errors cannot be reported from here.
    fn drop(&mut self) {
        if self.ctx.bind(CallKind::SynchronizeDevice).is_err() {
            return;
        }
        let _ = self.synchronize_device();
        let left = self.write().drain();
        // SAFETY (each call below): every handle comes from the registry, so it is
        // live and was made by this backend in this context, and each is released
        // once, mappings before pages and ranges, as the driver requires.
        for m in left.mappings {
            let _ = check(CallKind::Unmap, 0, || unsafe {
                sys::cuMemUnmap(m.addr, m.size as usize)
            });
        }
        for page in left.pages {
            let _ = check(CallKind::ReleasePage, 0, || unsafe {
                sys::cuMemRelease(page.0)
            });
        }
        for (base, size) in left.ranges {
            let _ = check(CallKind::ReleaseRange, 0, || unsafe {
                sys::cuMemAddressFree(base, size as usize)
            });
        }
        for ptr in left.segments {
            let _ = self.release_segment(ptr);
        }
        for event in left.events {
            let _ = check(CallKind::DestroyEvent, 0, || unsafe {
                sys::cuEventDestroy_v2(event_handle(event))
            });
        }
        for stream in left.streams {
            let _ = check(CallKind::SynchronizeStream, 0, || unsafe {
                sys::cuStreamDestroy_v2(stream_handle(stream))
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_kinds_index_the_counters() {
        for (i, kind) in CallKind::ALL.iter().enumerate() {
            assert_eq!(*kind as usize, i);
        }
    }

    #[test]
    fn new_never_panics_and_reports_unavailability() {
        match CudaBackend::new(0) {
            Ok(gpu) => {
                assert!(gpu.capabilities().total_memory > 0);
                assert!(matches!(
                    gpu.free_segment(0x1234),
                    Err(BackendError::InvalidAddress { .. })
                ));
            }
            Err(e) => assert!(
                matches!(e, BackendError::Unavailable(_)),
                "unexpected error: {e}"
            ),
        }
        assert!(CudaBackend::new(usize::MAX).is_err());
    }
}
