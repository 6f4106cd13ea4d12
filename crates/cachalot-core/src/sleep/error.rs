//! Why a tag call was refused, each with what to do about it.

use thiserror::Error;

use crate::backend::{BackendError, StreamId};
use crate::config::PolicyKind;
use crate::pool_id::PoolId;
use crate::units::format_size;

use super::Backup;

/// A tag call that cannot be done now. Nothing changed unless the variant
/// says so.
#[derive(Clone, Debug, Error, PartialEq)]
pub enum SleepError {
    /// The policy cannot pause memory. Remedy: the pytorch policy.
    #[error(
        "the {policy} policy cannot pause memory yet: run with policy:pytorch \
         (CACHALOT_ALLOC_CONF=policy:pytorch)"
    )]
    Unsupported {
        /// The policy in force.
        policy: PolicyKind,
    },
    /// The device has no virtual memory management, which keeps addresses
    /// while pages come and go. Remedy: none on this device.
    #[error("pausing memory needs virtual memory management (cuMemMap), which this device lacks")]
    NoVirtualMemory,
    /// The pool is not a tag. Remedy: make it one before its first allocation.
    #[error(
        "private pool {pool} is not a tag: make it one (make_tag, or allocate inside \
         cachalot_torch.region) before its first allocation"
    )]
    NotATag {
        /// The pool.
        pool: PoolId,
    },
    /// The pool holds memory already, from before it was made a tag. Remedy:
    /// make the tag before allocating in it.
    #[error(
        "private pool {pool} holds {segments} segment(s) already: make it a tag before its \
         first allocation"
    )]
    HoldsMemory {
        /// The pool.
        pool: PoolId,
        /// Its segments.
        segments: usize,
    },
    /// The pool's segments come from an allocator of its own
    /// (`MemPool(allocator=...)`). Remedy: a tag's pool without one.
    #[error(
        "private pool {pool} takes its segments from an allocator of its own \
         (MemPool(allocator=...)): a tag's memory must be cachalot's; use a pool without one"
    )]
    OwnAllocator {
        /// The pool.
        pool: PoolId,
    },
    /// The pool is a tag with another backup already. Remedy: one backup per
    /// tag (use another tag for the other).
    #[error("tag {pool} keeps backup {kept:?}; it cannot take backup {asked:?} (use another tag)")]
    OtherBackup {
        /// The pool.
        pool: PoolId,
        /// Its backup.
        kept: Backup,
        /// The one asked for.
        asked: Backup,
    },
    /// Pause of a paused tag. Remedy: resume it first (or leave it paused).
    #[error("tag {pool} is paused already: resume it before pausing it again")]
    AlreadyPaused {
        /// The pool.
        pool: PoolId,
    },
    /// Resume of a tag that is not paused. Remedy: nothing to do.
    #[error("tag {pool} is not paused: there is nothing to resume")]
    NotPaused {
        /// The pool.
        pool: PoolId,
    },
    /// A request routed to a paused tag. Remedy: resume it first.
    #[error(
        "cannot allocate {} in tag {pool}: it is paused (its memory is given back); resume it first",
        format_size(*.requested)
    )]
    Paused {
        /// The pool.
        pool: PoolId,
        /// Bytes asked for.
        requested: u64,
    },
    /// Requests are being routed into the tag (its region or a CUDA graph
    /// capture into it is open). Remedy: close it before pausing.
    #[error(
        "allocations are being routed into tag {pool} (its region, or a CUDA graph capture into \
         it, is open): leave it before pausing"
    )]
    RouteOpen {
        /// The pool.
        pool: PoolId,
    },
    /// Work queued on a stream that used the tag's memory has not finished.
    /// Remedy: synchronize, or pause with [`WhenBusy::Synchronize`](super::WhenBusy).
    #[error(
        "work queued on {stream} may still use tag {pool}'s memory: synchronize it \
         (torch.cuda.synchronize()) or pause with synchronization"
    )]
    Busy {
        /// The pool.
        pool: PoolId,
        /// A stream with unfinished work.
        stream: StreamId,
    },
    /// A pause or resume stopped part-way on a device failure: `done`
    /// segments went (or came back), `left` did not. The tag stays paused.
    /// Remedy: resume it (again) once memory is free; out of memory means
    /// another tag or the cache holds it.
    #[error(
        "{what} of tag {pool} stopped after {done} of {} segment(s): {cause}; {}",
        .done + .left,
        if cause.is_out_of_memory() {
            "free memory (pause another tag, empty the cache, drop tensors) and resume it again"
        } else {
            "resume it to bring back what was paused"
        }
    )]
    Partial {
        /// `"pause"` or `"resume"`.
        what: &'static str,
        /// The pool.
        pool: PoolId,
        /// Segments done.
        done: usize,
        /// Segments not done.
        left: usize,
        /// The device's failure.
        cause: BackendError,
    },
}
