//! Where a private pool's segments come from when not from the device: a
//! program's own allocator (`torch.cuda.MemPool(allocator=...)`), or a tag's
//! pages (`sleep`). Public as [`crate::private_pool::SegmentSource`].

use std::fmt;

use crate::backend::{BackendResult, DevicePtr};

/// Where a private pool's segments come from when not from the device
/// (`torch.cuda.MemPool(allocator=...)`: the blocks of such a pool are carved
/// out of memory the program's own allocator hands over, as in PyTorch).
pub trait SegmentSource: Send + Sync + fmt::Debug {
    /// `size` bytes for a new segment.
    ///
    /// # Errors
    /// [`BackendError::OutOfMemory`](crate::backend::BackendError::OutOfMemory)
    /// when the source has none to give.
    fn allocate(&self, size: u64) -> BackendResult<DevicePtr>;

    /// Takes back a segment of `size` bytes that [`SegmentSource::allocate`] gave.
    ///
    /// # Errors
    /// The source's failure; the segment stays the allocator's.
    fn free(&self, ptr: DevicePtr, size: u64) -> BackendResult<()>;
}
