//! Sleep and wake: memory given back to the device while the program does
//! not need it, and brought back at the same addresses.
//!
//! Reinforcement-learning trainers and inference engines share a GPU in
//! turns: while one side runs, the other's weights, optimizer state, KV cache
//! and CUDA-graph pools are released, then brought back at the same virtual
//! addresses, so its tensors and captured graphs stay valid.
//!
//! * A **tag** is a private pool ([`PoolId`](crate::private_pool::PoolId))
//!   made one by
//!   [`Tags::make_tag`](crate::Tags::make_tag) before its
//!   first allocation. Its segments then come from pages cachalot maps itself:
//!   each segment is a reserved virtual range with one page of its size
//!   mapped, so giving a segment's memory back is one unmap and one release
//!   whatever its size. The range stays reserved until the segment is freed.
//! * [`Tags::pause_tag`](crate::Tags::pause_tag) first
//!   makes sure no queued work still uses the tag's memory ([`WhenBusy`]),
//!   gives the tag's wholly free cached segments back (not those of a tag a
//!   CUDA graph was captured into: the graph replays in its free blocks),
//!   copies its allocations to host memory when the tag has a
//!   [`Backup::Host`] (memory kept and reused by the next pause), then unmaps
//!   and releases every page of the tag's segments. The tag is then **paused**: its allocations keep their
//!   addresses and sizes, and the allocator's blocks do not change.
//! * [`Tags::resume_tag`](crate::Tags::resume_tag) maps
//!   new pages at the same addresses and copies the backups back. Without a
//!   backup the bytes are gone (a KV cache, weights reloaded anyway).
//!
//! While a tag is paused, reserved bytes leave out its segments (the
//! statistics' `paused_bytes` count them), a snapshot leaves them out as it
//! leaves out unmapped pages, the history records a `segment_pause` per
//! segment (a `segment_resume` when it comes back), and a request routed to
//! the tag is refused. Every misuse (pause twice, resume without a pause, a
//! pool that is not a tag, work still queued) is a [`SleepError`] that says
//! what to do.

mod error;
mod pages;

pub use error::SleepError;
pub(crate) use pages::PageSource;

use std::sync::Arc;

use serde::Serialize;

/// Where a tag's bytes go while it is paused.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Backup {
    /// Nowhere: after a resume the tag's memory holds whatever the new pages
    /// hold (a KV cache to be refilled, weights to be reloaded).
    #[default]
    None,
    /// To host memory (pinned on CUDA), kept and reused by the next pause;
    /// every allocation's bytes are back after the resume.
    Host,
}

/// What a pause does about work queued on the device that may still use the
/// tag's memory.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum WhenBusy {
    /// Waits for the whole device first (a kernel on any stream may read the
    /// tag's memory).
    #[default]
    Synchronize,
    /// Waits for nothing: refuses with [`SleepError::Busy`] while work queued
    /// on a stream that used the tag's memory has not finished.
    Refuse,
}

/// What a pause or a resume did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SleepReport {
    /// Segments whose pages went back (pause) or came back (resume).
    pub segments: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes copied to host memory (pause) or back (resume).
    pub copied: u64,
    /// Wholly free cached segments given back for good before the pause.
    pub released: u64,
}

/// Where a tag stands.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TagState {
    /// Where its bytes go while paused.
    pub backup: Backup,
    /// Whether it is paused (also after a pause or resume that stopped
    /// part-way: resume it).
    pub paused: bool,
    /// Its segments.
    pub segments: usize,
    /// Their bytes.
    pub bytes: u64,
    /// The bytes of those whose pages are given back now.
    pub paused_bytes: u64,
    /// Host memory kept for its backups.
    pub host_bytes: u64,
}

/// A tag's bookkeeping in its pool's book.
#[derive(Clone, Debug)]
pub(crate) struct Tag {
    /// Where its segments come from.
    pub(crate) source: Arc<PageSource>,
    /// Where its bytes go while paused.
    pub(crate) backup: Backup,
    /// Paused (from the start of a pause to the end of a whole resume).
    pub(crate) paused: bool,
    /// A CUDA graph was captured into it: its free blocks hold the graph's
    /// intermediates (the graph replays there), so a pause keeps every
    /// segment, pausing the free ones too, where it would give them back.
    pub(crate) captured: bool,
}
