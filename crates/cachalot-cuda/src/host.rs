//! Pinned host memory (`cuMemHostAlloc`) and batches of copies between it and
//! the device, queued back to back on the backend's copy stream with one wait
//! at the end.

use std::ffi::c_void;
use std::fmt;
use std::ptr::NonNull;

use cudarc::driver::sys;

use super::driver::{check, Context};
use super::{stream_handle, CudaBackend};
use cachalot_core::backend::host::{HostMemory, ToDevice, ToHost};
use cachalot_core::backend::{BackendError, BackendResult, CallKind, StreamId};

/// Page-locked host memory of one device's context, freed on drop.
pub(super) struct PinnedHost {
    ptr: NonNull<u8>,
    len: usize,
    /// Retained so the context outlives the memory, whoever drops it when.
    ctx: Context,
}

// SAFETY: the memory is plain host memory owned by this value alone; the
// context handle may be used from any thread.
unsafe impl Send for PinnedHost {}
// SAFETY: shared access only reads the bytes.
unsafe impl Sync for PinnedHost {}

impl fmt::Debug for PinnedHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedHost")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

impl PinnedHost {
    /// `size` bytes pinned in device `ordinal`'s primary context.
    pub(super) fn allocate(ordinal: usize, size: u64) -> BackendResult<PinnedHost> {
        let call = CallKind::AllocateHost;
        if size == 0 {
            let reason = "zero-size host memory".to_string();
            return Err(BackendError::InvalidArgument { call, reason });
        }
        let len = usize::try_from(size).map_err(|_| BackendError::OutOfMemory {
            call,
            requested: size,
        })?;
        let ctx = Context::retain(ordinal)?;
        ctx.bind(call)?;
        let mut raw: *mut c_void = std::ptr::null_mut();
        // SAFETY: the context is current; `raw` is a valid out-pointer; flags 0
        // asks for plain page-locked memory.
        check(call, size, || unsafe {
            sys::cuMemHostAlloc(&mut raw, len, 0)
        })?;
        let ptr = NonNull::new(raw.cast::<u8>()).ok_or(BackendError::Device {
            call,
            message: "cuMemHostAlloc returned NULL".to_string(),
        })?;
        // SAFETY: `ptr` points to `len` writable bytes just allocated; zeroing
        // them once makes every byte initialised before any slice is made.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        Ok(PinnedHost { ptr, len, ctx })
    }
}

impl HostMemory for PinnedHost {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `len` initialised bytes (zeroed when
        // allocated) that this value owns until drop.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; `&mut self` makes this the only borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if self.ctx.bind(CallKind::AllocateHost).is_ok() {
            // SAFETY: `ptr` came from cuMemHostAlloc in this context, which
            // `ctx` keeps alive, and is freed once, here.
            let _ = check(CallKind::AllocateHost, 0, || unsafe {
                sys::cuMemFreeHost(self.ptr.as_ptr().cast::<c_void>())
            });
        }
    }
}

impl CudaBackend {
    /// The stream copies run on: made on first use, destroyed with the backend.
    fn copy_stream(&self) -> BackendResult<StreamId> {
        let mut stream = self.copy_stream.lock().unwrap_or_else(|e| e.into_inner());
        match *stream {
            Some(s) => Ok(s),
            None => {
                let s = self.create_stream()?;
                *stream = Some(s);
                Ok(s)
            }
        }
    }

    /// Queues each copy of `copies` (`queue` makes one driver call for one)
    /// on the copy stream after checking every device range, then waits for
    /// the stream, also when a call failed: no copy outlives this call.
    fn copy_batch<C>(
        &self,
        call: CallKind,
        copies: &mut [C],
        range: impl Fn(&C) -> (u64, u64),
        queue: impl Fn(&mut C, sys::CUstream) -> sys::CUresult,
    ) -> BackendResult<()> {
        let stream = stream_handle(self.copy_stream()?);
        let reg = self.read();
        for c in copies.iter() {
            let (ptr, len) = range(c);
            reg.check_accessible(call, ptr, len)?;
        }
        self.ctx.bind(call)?;
        let mut queued = Ok(());
        for c in copies.iter_mut() {
            queued = check(call, 0, || queue(c, stream));
            if queued.is_err() {
                break;
            }
        }
        // SAFETY: the copy stream is this backend's own and live.
        let waited = check(call, 0, || unsafe { sys::cuStreamSynchronize(stream) });
        queued.and(waited)
    }

    /// [`Backend::download`](cachalot_core::backend::Backend::download).
    pub(super) fn download_batch(&self, copies: &mut [ToHost<'_>]) -> BackendResult<()> {
        let range = |c: &ToHost<'_>| (c.src, c.dst.len() as u64);
        self.copy_batch(CallKind::Download, copies, range, |c, s| {
            // SAFETY: the source lies in live device memory (checked; the read
            // lock keeps it live); `dst` is writable host memory of exactly
            // that length, borrowed until `copy_batch` has waited for the
            // stream.
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    c.dst.as_mut_ptr().cast::<c_void>(),
                    c.src,
                    c.dst.len(),
                    s,
                )
            }
        })
    }

    /// [`Backend::upload`](cachalot_core::backend::Backend::upload).
    pub(super) fn upload_batch(&self, copies: &[ToDevice<'_>]) -> BackendResult<()> {
        let mut copies = copies.to_vec();
        let range = |c: &ToDevice<'_>| (c.dst, c.src.len() as u64);
        self.copy_batch(CallKind::Upload, &mut copies, range, |c, s| {
            // SAFETY: the destination lies in live device memory (checked;
            // kept live by the read lock); `src` is borrowed until
            // `copy_batch` has waited for the stream.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(c.dst, c.src.as_ptr().cast::<c_void>(), c.src.len(), s)
            }
        })
    }
}
