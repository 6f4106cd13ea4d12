//! What a backend adaptor adds around each call, and the one forwarding
//! implementation every adaptor shares.
//!
//! An adaptor holds `inner: Arc<B>` and implements [`Hooks`]: `before` sees each
//! call (its kind and the bytes it asks for) and may refuse it; `after` sees each
//! memory grant and return that succeeded. [`adaptor!`](crate::backend::adaptor)
//! then writes the [`Backend`](super::Backend) implementation that calls the hooks
//! and forwards to `inner`, so no adaptor repeats the trait's methods.

use super::{BackendResult, CallKind};

/// A grant or return of device memory that the inner backend carried out.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A segment (key: its address) or a page (key: its handle) of `bytes` was made.
    Took {
        /// [`CallKind::SegmentAlloc`] or [`CallKind::CreatePage`].
        kind: CallKind,
        /// The segment's address or the page's handle.
        key: u64,
        /// Its size.
        bytes: u64,
    },
    /// The segment or page with this key went back.
    Gave {
        /// [`CallKind::SegmentFree`] or [`CallKind::ReleasePage`].
        kind: CallKind,
        /// The segment's address or the page's handle.
        key: u64,
    },
}

/// What an adaptor does around the calls it forwards.
pub trait Hooks {
    /// Runs before each call; an error is returned in place of the call's.
    /// `bytes` is the size asked for (segments, ranges, pages, unmaps, host
    /// memory, the bytes of a batch of copies), else 0.
    fn before(&self, kind: CallKind, bytes: u64) -> BackendResult<()> {
        let _ = (kind, bytes);
        Ok(())
    }

    /// Runs after a segment or page was made or given back successfully.
    fn after(&self, change: Change) {
        let _ = change;
    }
}

/// Implements [`Backend`](super::Backend) for an adaptor `$name<B>` with a field
/// `inner: Arc<B>` and an implementation of [`Hooks`]. An adaptor that makes
/// and frees segments itself (handing out other addresses) names its own
/// methods for them: `adaptor!(Name, segments: alloc_method, free_method)`;
/// every other call still forwards to `inner`.
macro_rules! adaptor {
    ($name:ident) => {
        $crate::backend::adaptor::adaptor!(@impl $name, inner.allocate_segment, inner.free_segment);
    };
    ($name:ident, segments: $alloc:ident, $free:ident) => {
        $crate::backend::adaptor::adaptor!(@impl $name, $alloc, $free);
    };
    (@impl $name:ident, $($alloc:ident).+, $($free:ident).+) => {
        impl<B: $crate::backend::Backend + ?Sized> $crate::backend::Backend for $name<B> {
            fn capabilities(&self) -> &$crate::backend::Capabilities {
                self.inner.capabilities()
            }

            fn mem_info(&self) -> $crate::backend::BackendResult<$crate::backend::MemInfo> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::MemInfo,
                    0,
                )?;
                self.inner.mem_info()
            }

            fn allocate_segment(
                &self,
                size: u64,
            ) -> $crate::backend::BackendResult<$crate::backend::DevicePtr> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::SegmentAlloc,
                    size,
                )?;
                let ptr = self.$($alloc).+(size)?;
                $crate::backend::adaptor::Hooks::after(
                    self,
                    $crate::backend::adaptor::Change::Took {
                        kind: $crate::backend::CallKind::SegmentAlloc,
                        key: ptr,
                        bytes: size,
                    },
                );
                Ok(ptr)
            }

            fn free_segment(
                &self,
                ptr: $crate::backend::DevicePtr,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::SegmentFree,
                    0,
                )?;
                self.$($free).+(ptr)?;
                $crate::backend::adaptor::Hooks::after(
                    self,
                    $crate::backend::adaptor::Change::Gave {
                        kind: $crate::backend::CallKind::SegmentFree,
                        key: ptr,
                    },
                );
                Ok(())
            }

            fn export_segment(
                &self,
                base: $crate::backend::DevicePtr,
            ) -> $crate::backend::BackendResult<[u8; $crate::backend::IPC_HANDLE_BYTES]> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::ExportSegment,
                    0,
                )?;
                self.inner.export_segment(base)
            }

            fn open_segment(
                &self,
                handle: &[u8; $crate::backend::IPC_HANDLE_BYTES],
            ) -> $crate::backend::BackendResult<$crate::backend::DevicePtr> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::OpenSegment,
                    0,
                )?;
                self.inner.open_segment(handle)
            }

            fn close_segment(
                &self,
                ptr: $crate::backend::DevicePtr,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::CloseSegment,
                    0,
                )?;
                self.inner.close_segment(ptr)
            }

            fn export_page(
                &self,
                page: $crate::backend::PageHandle,
            ) -> $crate::backend::BackendResult<std::os::fd::OwnedFd> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::ExportPage,
                    0,
                )?;
                self.inner.export_page(page)
            }

            fn import_page(
                &self,
                fd: std::os::fd::BorrowedFd<'_>,
                size: u64,
            ) -> $crate::backend::BackendResult<$crate::backend::PageHandle> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::ImportPage,
                    size,
                )?;
                self.inner.import_page(fd, size)
            }

            fn reserve_range(
                &self,
                size: u64,
            ) -> $crate::backend::BackendResult<$crate::backend::DevicePtr> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::ReserveRange,
                    size,
                )?;
                self.inner.reserve_range(size)
            }

            fn release_range(
                &self,
                base: $crate::backend::DevicePtr,
                size: u64,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::ReleaseRange,
                    size,
                )?;
                self.inner.release_range(base, size)
            }

            fn create_page(
                &self,
                size: u64,
            ) -> $crate::backend::BackendResult<$crate::backend::PageHandle> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::CreatePage,
                    size,
                )?;
                let page = self.inner.create_page(size)?;
                $crate::backend::adaptor::Hooks::after(
                    self,
                    $crate::backend::adaptor::Change::Took {
                        kind: $crate::backend::CallKind::CreatePage,
                        key: page.0,
                        bytes: size,
                    },
                );
                Ok(page)
            }

            fn release_page(
                &self,
                page: $crate::backend::PageHandle,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::ReleasePage,
                    0,
                )?;
                self.inner.release_page(page)?;
                $crate::backend::adaptor::Hooks::after(
                    self,
                    $crate::backend::adaptor::Change::Gave {
                        kind: $crate::backend::CallKind::ReleasePage,
                        key: page.0,
                    },
                );
                Ok(())
            }

            fn map(
                &self,
                addr: $crate::backend::DevicePtr,
                page: $crate::backend::PageHandle,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(self, $crate::backend::CallKind::Map, 0)?;
                self.inner.map(addr, page)
            }

            fn unmap(
                &self,
                addr: $crate::backend::DevicePtr,
                size: u64,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::Unmap,
                    size,
                )?;
                self.inner.unmap(addr, size)
            }

            fn create_event(&self) -> $crate::backend::BackendResult<$crate::backend::EventId> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::CreateEvent,
                    0,
                )?;
                self.inner.create_event()
            }

            fn destroy_event(
                &self,
                event: $crate::backend::EventId,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::DestroyEvent,
                    0,
                )?;
                self.inner.destroy_event(event)
            }

            fn record_event(
                &self,
                event: $crate::backend::EventId,
                stream: $crate::backend::StreamId,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::RecordEvent,
                    0,
                )?;
                self.inner.record_event(event, stream)
            }

            fn query_event(
                &self,
                event: $crate::backend::EventId,
            ) -> $crate::backend::BackendResult<bool> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::QueryEvent,
                    0,
                )?;
                self.inner.query_event(event)
            }

            fn synchronize_event(
                &self,
                event: $crate::backend::EventId,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::SynchronizeEvent,
                    0,
                )?;
                self.inner.synchronize_event(event)
            }

            fn synchronize_stream(
                &self,
                stream: $crate::backend::StreamId,
            ) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::SynchronizeStream,
                    0,
                )?;
                self.inner.synchronize_stream(stream)
            }

            fn synchronize_device(&self) -> $crate::backend::BackendResult<()> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::SynchronizeDevice,
                    0,
                )?;
                self.inner.synchronize_device()
            }

            fn allocate_host(
                &self,
                size: u64,
            ) -> $crate::backend::BackendResult<Box<dyn $crate::backend::host::HostMemory>> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::AllocateHost,
                    size,
                )?;
                self.inner.allocate_host(size)
            }

            fn download(
                &self,
                copies: &mut [$crate::backend::host::ToHost<'_>],
            ) -> $crate::backend::BackendResult<()> {
                let bytes = copies.iter().map(|c| c.dst.len() as u64).sum();
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::Download,
                    bytes,
                )?;
                self.inner.download(copies)
            }

            fn upload(
                &self,
                copies: &[$crate::backend::host::ToDevice<'_>],
            ) -> $crate::backend::BackendResult<()> {
                let bytes = copies.iter().map(|c| c.src.len() as u64).sum();
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::Upload,
                    bytes,
                )?;
                self.inner.upload(copies)
            }

            fn capture_frontier(
                &self,
                stream: $crate::backend::StreamId,
            ) -> $crate::backend::BackendResult<Option<Vec<$crate::backend::GraphNode>>> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::CaptureInfo,
                    0,
                )?;
                self.inner.capture_frontier(stream)
            }

            fn capture_follows(
                &self,
                stream: $crate::backend::StreamId,
                marks: &[$crate::backend::GraphNode],
            ) -> $crate::backend::BackendResult<bool> {
                $crate::backend::adaptor::Hooks::before(
                    self,
                    $crate::backend::CallKind::CaptureInfo,
                    0,
                )?;
                self.inner.capture_follows(stream, marks)
            }
        }
    };
}

pub(crate) use adaptor;
