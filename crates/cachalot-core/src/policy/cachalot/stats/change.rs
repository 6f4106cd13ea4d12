//! One change to a stream's statistics: what its ledger applies to its
//! figures and, with several streams, journals for the device's peaks.

/// One change to a stream's statistics, as its ledger makes it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// A block of `size` bytes was handed out for `requested`.
    Allocated {
        small: bool,
        size: u64,
        requested: u64,
    },
    /// Its caller freed a block that other streams still use.
    FreeRequested { small: bool, size: u64 },
    /// A block freed earlier became reusable.
    FreeCompleted {
        small: bool,
        size: u64,
        requested: u64,
    },
    /// Its caller freed a block that became reusable at once.
    Freed {
        small: bool,
        size: u64,
        requested: u64,
    },
    /// Reserved bytes and segments changed (pages mapped or unmapped,
    /// segments allocated or freed).
    Reserved {
        small: bool,
        bytes: i64,
        segments: i64,
    },
    /// Inactive split blocks changed.
    Splits { small: bool, count: i64, bytes: i64 },
}
