//! What lies under a live allocation, as a policy reports it for sharing
//! with another process (the `cachalot-ipc` crate): a device segment, or physical pages
//! mapped one after another.

use crate::backend::{DevicePtr, PageHandle};

/// What lies under a live allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A device segment starting at `base`.
    Segment {
        /// The segment's base address.
        base: DevicePtr,
    },
    /// Physical handles mapped one after another from `base`.
    Pages {
        /// Where the first handle is mapped.
        base: DevicePtr,
        /// The handles and their bytes, in address order.
        pages: Vec<(PageHandle, u64)>,
    },
}
