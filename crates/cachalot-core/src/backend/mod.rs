//! The backend trait: what provides segments, pages, streams and events.
//!
//! An allocator policy never talks to a GPU directly; it asks a [`Backend`]. Two
//! backends exist: [`sim`] (a simulated device, deterministic
//! and strict, the default wherever no GPU is present) and `cuda` (a real GPU through
//! cudarc, in the `cachalot-cuda` crate, reached as `cachalot::backend::cuda`). Concerns that cut across backends (a memory limit, latency, fault
//! injection, call counting) are wrappers implementing this same trait, never
//! `if`s inside `malloc`, and they compose over any backend:
//! [`counting::Counting`] counts calls by kind, [`faults::Faults`] makes chosen
//! calls fail, [`limit::Limit`] caps the memory held, and
//! [`recorded::RecordedAddresses`] hands out a recording's segment addresses.
//! [`adaptor`] holds what they share; [`host`] the host memory that device
//! bytes are copied to and from.
//!
//! # Contracts every backend keeps
//!
//! * **Segments.** [`Backend::allocate_segment`] returns the base address of `size`
//!   bytes of device memory that no other live segment or mapped range overlaps.
//!   [`Backend::free_segment`] takes exactly such a base address, once. Freeing an
//!   address that is not the base of a live segment is
//!   [`BackendError::InvalidAddress`]; the backend's state does not change.
//! * **Virtual memory** (only where [`Capabilities::virtual_memory`] is true; the others
//!   answer [`BackendError::Unsupported`]): [`Backend::reserve_range`] reserves
//!   address space without memory; [`Backend::create_page`] creates a physical page of
//!   a multiple of [`Capabilities::granularity`] bytes; [`Backend::map`] maps one page at
//!   a granularity-aligned address inside a reserved range and makes it accessible
//!   from the device; [`Backend::unmap`] unmaps whole pages; a page may be released
//!   only when no mapping of it is left; a range may be released only when nothing
//!   is mapped in it.
//! * **Copies**: [`Backend::download`] and [`Backend::upload`] copy between live
//!   device memory (a segment, or mapped pages) and host memory, every copy of
//!   a call done when it returns; they are ordered after no other work, so the
//!   caller synchronizes first. The simulated device keeps the bytes written to
//!   it (unwritten bytes read as zero), so tests see what a copy moved.
//! * **Streams and events.** Stream ids are opaque: 0 is the device's default stream,
//!   and the simulated backend accepts any stream id the caller hands it. On CUDA a
//!   stream id is the raw `CUstream`, so the cuda backend accepts only the default
//!   stream, streams it created and streams registered with it (an unknown id is an
//!   error, never a handle passed to the driver). An event recorded on a stream completes once the work queued on the
//!   stream before it has finished. `query_event` never blocks; `synchronize_*` blocks.
//! * **Captures.** While a stream is being captured into a CUDA graph,
//!   [`Backend::capture_frontier`] names the graph nodes its next work will
//!   depend on and [`Backend::capture_follows`] whether that work runs after
//!   given nodes (the graph's edges, stream order and waits on events alike);
//!   a stream that is not capturing has no frontier and follows nothing.
//! * **Memory info** reports the device's free and total bytes as the driver sees them.
//! * Every method is callable from any thread (`Send + Sync`).
//! * No method panics on bad input: misuse is an error value.

pub mod adaptor;
pub mod counting;
pub mod faults;
pub mod host;
pub mod limit;
pub mod recorded;
pub mod sim;

use std::fmt;
use std::os::fd::{BorrowedFd, OwnedFd};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use self::host::{HostMemory, ToDevice, ToHost};

/// An address in the device's address space (`CUdeviceptr` on CUDA).
pub type DevicePtr = u64;

/// A stream, by its opaque id. `StreamId(0)` is the default stream.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The device's default (legacy) stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {:#x}", self.0)
    }
}

/// An event created by a backend.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EventId(pub u64);

/// A node of the CUDA graph a stream capture is building (`CUgraphNode`),
/// opaque, valid while that capture lasts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GraphNode(pub u64);

/// A physical page created by [`Backend::create_page`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageHandle(pub u64);

/// What a backend can do, fixed for its lifetime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Human-readable device name, for reports.
    pub name: String,
    /// The device's ordinal.
    pub device: usize,
    /// Total device memory in bytes.
    pub total_memory: u64,
    /// Whether reserve/create/map/unmap are available.
    pub virtual_memory: bool,
    /// The page size for [`Backend::create_page`] and the alignment of mappings
    /// (2 MiB on current NVIDIA GPUs); 0 without virtual memory.
    pub granularity: u64,
}

/// The device's free and total bytes, as the driver reports them.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes the device could still hand out.
    pub free: u64,
    /// Bytes the device has in all.
    pub total: u64,
}

/// The kinds of backend calls, for counting and fault injection.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[allow(missing_docs)]
pub enum CallKind {
    SegmentAlloc,
    SegmentFree,
    ReserveRange,
    ReleaseRange,
    CreatePage,
    ReleasePage,
    Map,
    Unmap,
    CreateEvent,
    DestroyEvent,
    RecordEvent,
    QueryEvent,
    SynchronizeEvent,
    SynchronizeStream,
    SynchronizeDevice,
    MemInfo,
    ExportSegment,
    OpenSegment,
    CloseSegment,
    ExportPage,
    ImportPage,
    AllocateHost,
    Download,
    Upload,
    CaptureInfo,
}

impl CallKind {
    /// Every kind, in declaration order.
    pub const ALL: [CallKind; 25] = [
        CallKind::SegmentAlloc,
        CallKind::SegmentFree,
        CallKind::ReserveRange,
        CallKind::ReleaseRange,
        CallKind::CreatePage,
        CallKind::ReleasePage,
        CallKind::Map,
        CallKind::Unmap,
        CallKind::CreateEvent,
        CallKind::DestroyEvent,
        CallKind::RecordEvent,
        CallKind::QueryEvent,
        CallKind::SynchronizeEvent,
        CallKind::SynchronizeStream,
        CallKind::SynchronizeDevice,
        CallKind::MemInfo,
        CallKind::ExportSegment,
        CallKind::OpenSegment,
        CallKind::CloseSegment,
        CallKind::ExportPage,
        CallKind::ImportPage,
        CallKind::AllocateHost,
        CallKind::Download,
        CallKind::Upload,
        CallKind::CaptureInfo,
    ];

    /// A stable snake_case name (used in JSON reports).
    pub fn name(self) -> &'static str {
        match self {
            CallKind::SegmentAlloc => "segment_alloc",
            CallKind::SegmentFree => "segment_free",
            CallKind::ReserveRange => "reserve_range",
            CallKind::ReleaseRange => "release_range",
            CallKind::CreatePage => "create_page",
            CallKind::ReleasePage => "release_page",
            CallKind::Map => "map",
            CallKind::Unmap => "unmap",
            CallKind::CreateEvent => "create_event",
            CallKind::DestroyEvent => "destroy_event",
            CallKind::RecordEvent => "record_event",
            CallKind::QueryEvent => "query_event",
            CallKind::SynchronizeEvent => "synchronize_event",
            CallKind::SynchronizeStream => "synchronize_stream",
            CallKind::SynchronizeDevice => "synchronize_device",
            CallKind::MemInfo => "mem_info",
            CallKind::ExportSegment => "export_segment",
            CallKind::OpenSegment => "open_segment",
            CallKind::CloseSegment => "close_segment",
            CallKind::ExportPage => "export_page",
            CallKind::ImportPage => "import_page",
            CallKind::AllocateHost => "allocate_host",
            CallKind::Download => "download",
            CallKind::Upload => "upload",
            CallKind::CaptureInfo => "capture_info",
        }
    }

    /// Whether this kind is a costly driver memory call (allocation, free, reserve,
    /// page creation, map or unmap), as counted in reports.
    pub fn is_memory_call(self) -> bool {
        matches!(
            self,
            CallKind::SegmentAlloc
                | CallKind::SegmentFree
                | CallKind::ReserveRange
                | CallKind::ReleaseRange
                | CallKind::CreatePage
                | CallKind::ReleasePage
                | CallKind::Map
                | CallKind::Unmap
        )
    }
}

impl fmt::Display for CallKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A backend call that failed, grouped by what the caller should do.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum BackendError {
    /// The device has no memory for this request now. Remedy: free cached memory
    /// and retry, or report out-of-memory.
    #[error("device out of memory: {call} of {requested} bytes")]
    OutOfMemory {
        /// The call that failed.
        call: CallKind,
        /// Bytes asked for.
        requested: u64,
    },
    /// The backend cannot do this at all (for example virtual memory on a backend
    /// without it). Remedy: take another path.
    #[error("{call} is not supported by the {backend} backend")]
    Unsupported {
        /// The call asked for.
        call: CallKind,
        /// The backend's name.
        backend: &'static str,
    },
    /// The caller passed an address, page, range or event the backend does not
    /// know, or no longer knows (a double free). Remedy: fix the caller.
    #[error("{call}: {what} {value:#x} is not live on this device")]
    InvalidAddress {
        /// The call made.
        call: CallKind,
        /// What kind of handle was wrong ("segment", "page", "range", "event", ...).
        what: &'static str,
        /// The offending value.
        value: u64,
    },
    /// The arguments break the call's contract (misaligned, zero size, a range
    /// still mapped). Remedy: fix the caller.
    #[error("{call}: {reason}")]
    InvalidArgument {
        /// The call made.
        call: CallKind,
        /// What is wrong.
        reason: String,
    },
    /// No driver or no device is present. Remedy: use the simulated backend.
    #[error("no GPU available: {0}")]
    Unavailable(String),
    /// The driver reported an error, or a fault was injected. Remedy: treat the
    /// device as failed.
    #[error("{call} failed: {message}")]
    Device {
        /// The call made.
        call: CallKind,
        /// The driver's (or the fault injector's) message.
        message: String,
    },
}

impl BackendError {
    /// Whether this is an out-of-memory condition (retryable after freeing memory).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, BackendError::OutOfMemory { .. })
    }
}

/// Result of a backend call.
pub type BackendResult<T> = Result<T, BackendError>;

/// A provider of device memory, streams and events. See the module docs for the
/// contracts.
pub trait Backend: Send + Sync + fmt::Debug {
    /// What this backend can do.
    fn capabilities(&self) -> &Capabilities;

    /// The device's free and total bytes.
    ///
    /// # Errors
    /// [`BackendError::Device`] when the driver cannot answer.
    fn mem_info(&self) -> BackendResult<MemInfo>;

    /// Allocates a segment of `size` bytes (`cuMemAlloc`).
    ///
    /// # Errors
    /// [`BackendError::OutOfMemory`] when the device lacks the memory;
    /// [`BackendError::InvalidArgument`] for a zero size.
    fn allocate_segment(&self, size: u64) -> BackendResult<DevicePtr>;

    /// Frees a segment by its base address (`cuMemFree`).
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] when `ptr` is not a live segment's base.
    fn free_segment(&self, ptr: DevicePtr) -> BackendResult<()>;

    /// Reserves `size` bytes of address space, aligned to the granularity
    /// (`cuMemAddressReserve`).
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] without virtual memory;
    /// [`BackendError::InvalidArgument`] for a size that is zero or not a multiple
    /// of the granularity.
    fn reserve_range(&self, size: u64) -> BackendResult<DevicePtr>;

    /// Releases a reserved range with nothing mapped in it (`cuMemAddressFree`).
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] for an unknown base;
    /// [`BackendError::InvalidArgument`] while pages are still mapped in it.
    fn release_range(&self, base: DevicePtr, size: u64) -> BackendResult<()>;

    /// Creates a physical page of `size` bytes, a multiple of the granularity
    /// (`cuMemCreate`).
    ///
    /// # Errors
    /// [`BackendError::OutOfMemory`] when the device lacks the memory.
    fn create_page(&self, size: u64) -> BackendResult<PageHandle>;

    /// Releases a page that is no longer mapped anywhere (`cuMemRelease`).
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] for an unknown page;
    /// [`BackendError::InvalidArgument`] while it is still mapped.
    fn release_page(&self, page: PageHandle) -> BackendResult<()>;

    /// Maps a whole page at `addr` inside a reserved range and grants the device
    /// read/write access (`cuMemMap` + `cuMemSetAccess`).
    ///
    /// # Errors
    /// [`BackendError::InvalidArgument`] when `addr` is misaligned, outside every
    /// reserved range or overlaps a mapping.
    fn map(&self, addr: DevicePtr, page: PageHandle) -> BackendResult<()>;

    /// Unmaps `size` bytes of whole pages starting at `addr` (`cuMemUnmap`).
    ///
    /// # Errors
    /// [`BackendError::InvalidArgument`] when the range does not cover whole mapped
    /// pages.
    fn unmap(&self, addr: DevicePtr, size: u64) -> BackendResult<()>;

    /// Creates an event (timing disabled).
    ///
    /// # Errors
    /// [`BackendError::Device`] on driver failure.
    fn create_event(&self) -> BackendResult<EventId>;

    /// Destroys an event.
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] for an unknown event.
    fn destroy_event(&self, event: EventId) -> BackendResult<()>;

    /// Records `event` on `stream`.
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] for an unknown event.
    fn record_event(&self, event: EventId, stream: StreamId) -> BackendResult<()>;

    /// Whether the work before the event's last record has finished. Never blocks.
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] for an unknown event.
    fn query_event(&self, event: EventId) -> BackendResult<bool>;

    /// Blocks until the event has completed.
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] for an unknown event.
    fn synchronize_event(&self, event: EventId) -> BackendResult<()>;

    /// Blocks until all work queued on `stream` has finished.
    ///
    /// # Errors
    /// [`BackendError::Device`] on driver failure.
    fn synchronize_stream(&self, stream: StreamId) -> BackendResult<()>;

    /// Blocks until all work on the device has finished.
    ///
    /// # Errors
    /// [`BackendError::Device`] on driver failure.
    fn synchronize_device(&self) -> BackendResult<()>;

    /// The nodes of the graph being captured on `stream` that the next work
    /// queued on it will depend on (its capture's frontier), or `None` when
    /// `stream` is not capturing.
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] for an unknown stream;
    /// [`BackendError::Device`] on driver failure.
    fn capture_frontier(&self, stream: StreamId) -> BackendResult<Option<Vec<GraphNode>>>;

    /// Whether the next work queued on capturing `stream` will run after every
    /// node of `marks` (each is in its frontier or an ancestor of a node
    /// there). False when `stream` is not capturing.
    ///
    /// # Errors
    /// As [`Backend::capture_frontier`].
    fn capture_follows(&self, stream: StreamId, marks: &[GraphNode]) -> BackendResult<bool>;

    /// The handle another process opens segment `base` with
    /// (`cuIpcGetMemHandle`).
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] on a backend without processes to share
    /// with; [`BackendError::InvalidAddress`] when `base` is not a live
    /// segment's base.
    fn export_segment(&self, base: DevicePtr) -> BackendResult<[u8; IPC_HANDLE_BYTES]> {
        let _ = base;
        Err(ipc_unsupported(CallKind::ExportSegment))
    }

    /// Opens another process's segment in this one (`cuIpcOpenMemHandle`).
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] as [`Backend::export_segment`];
    /// [`BackendError::Device`] when the driver refuses the handle.
    fn open_segment(&self, handle: &[u8; IPC_HANDLE_BYTES]) -> BackendResult<DevicePtr> {
        let _ = handle;
        Err(ipc_unsupported(CallKind::OpenSegment))
    }

    /// Closes a segment opened by [`Backend::open_segment`]
    /// (`cuIpcCloseMemHandle`).
    ///
    /// # Errors
    /// [`BackendError::InvalidAddress`] when `ptr` was not opened here.
    fn close_segment(&self, ptr: DevicePtr) -> BackendResult<()> {
        let _ = ptr;
        Err(ipc_unsupported(CallKind::CloseSegment))
    }

    /// A file descriptor another process imports `page` with
    /// (`cuMemExportToShareableHandle`); the caller owns it.
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] without shareable pages;
    /// [`BackendError::InvalidAddress`] for an unknown page.
    fn export_page(&self, page: PageHandle) -> BackendResult<OwnedFd> {
        let _ = page;
        Err(ipc_unsupported(CallKind::ExportPage))
    }

    /// Imports another process's page of `size` bytes from a file descriptor
    /// (`cuMemImportFromShareableHandle`). The page is then this backend's, to
    /// map and release as one it created.
    ///
    /// # Errors
    /// [`BackendError::Unsupported`] as [`Backend::export_page`];
    /// [`BackendError::Device`] when the driver refuses the descriptor.
    fn import_page(&self, fd: BorrowedFd<'_>, size: u64) -> BackendResult<PageHandle> {
        let _ = (fd, size);
        Err(ipc_unsupported(CallKind::ImportPage))
    }

    /// `size` bytes of host memory that [`Backend::download`] and
    /// [`Backend::upload`] reach at the link's speed (pinned memory:
    /// `cuMemHostAlloc`). Slow to make: callers keep it and reuse it.
    ///
    /// # Errors
    /// [`BackendError::OutOfMemory`] when the host has none to give;
    /// [`BackendError::InvalidArgument`] for a zero size.
    fn allocate_host(&self, size: u64) -> BackendResult<Box<dyn HostMemory>>;

    /// Copies each device range of `copies` into its host memory: queued back
    /// to back on a stream of the backend's own, done when this returns (also
    /// when it fails). Not ordered after other work: synchronize first.
    ///
    /// # Errors
    /// [`BackendError::InvalidArgument`] when a range is not inside live device
    /// memory (nothing is copied); [`BackendError::Device`] when the driver
    /// fails.
    fn download(&self, copies: &mut [ToHost<'_>]) -> BackendResult<()>;

    /// Copies each host range of `copies` to its device address, as
    /// [`Backend::download`] copies the other way.
    ///
    /// # Errors
    /// As [`Backend::download`].
    fn upload(&self, copies: &[ToDevice<'_>]) -> BackendResult<()>;
}

/// The error of an IPC call a backend without other processes does not offer.
/// The union of the capture frontiers of `streams`: the free marks of a block
/// they used during a capture. `None` when one of them is not capturing or
/// its query fails (the block then waits for the capture's end).
pub(crate) fn capture_marks(backend: &dyn Backend, streams: &[StreamId]) -> Option<Vec<GraphNode>> {
    let mut marks = Vec::new();
    for s in streams {
        marks.extend(backend.capture_frontier(*s).ok()??);
    }
    Some(marks)
}

fn ipc_unsupported(call: CallKind) -> BackendError {
    BackendError::Unsupported {
        call,
        backend: "simulated",
    }
}

/// Bytes of a CUDA IPC memory handle (`CU_IPC_HANDLE_SIZE`).
pub const IPC_HANDLE_BYTES: usize = 64;
