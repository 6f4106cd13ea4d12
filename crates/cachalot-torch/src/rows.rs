//! The rows of a drop-in snapshot (`cachalot_snapshot_take`), as C reads
//! them: plain data, laid out for C.

use cachalot::event::Action;

/// The action PyTorch's traces show for `action`: its own, and for
/// cachalot's own PyTorch's nearest (a tag's pause as `segment_unmap`, its
/// resume as `segment_map`).
pub fn shown_as(action: Action) -> Action {
    match action {
        Action::SegmentPause => Action::SegmentUnmap,
        Action::SegmentResume => Action::SegmentMap,
        other => other,
    }
}

/// The index of `action` in PyTorch's `TraceEntry::Action`, the order of
/// [`Action::ALL`]'s first nine, as PyTorch shows it ([`shown_as`]).
pub fn pytorch_action(action: Action) -> u32 {
    let shown = shown_as(action);
    Action::ALL.iter().position(|a| *a == shown).unwrap_or(0) as u32
}

/// One segment of a [`Snapshot`](crate::dropin::Snapshot); its blocks are `blocks[first_block ..
/// first_block + block_count]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SegmentRow {
    /// Device ordinal.
    pub device: i64,
    /// Base address.
    pub address: u64,
    /// Size in bytes.
    pub total_size: u64,
    /// Bytes asked for by the callers of its active blocks.
    pub requested_size: u64,
    /// Bytes in allocated blocks.
    pub allocated_size: u64,
    /// Bytes in active blocks.
    pub active_size: u64,
    /// The stream it serves (a `cudaStream_t`).
    pub stream: u64,
    /// 1 for the large pool.
    pub is_large: u8,
    /// 1 for a mapped (expandable) range.
    pub is_expandable: u8,
    /// Index of its first block.
    pub first_block: usize,
    /// How many blocks it has.
    pub block_count: usize,
    /// The private pool it belongs to (`segment_pool_id`; 0, 0 for the
    /// default pools).
    pub pool_id: [u64; 2],
}

/// One block of a [`Snapshot`](crate::dropin::Snapshot).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct BlockRow {
    /// Start address.
    pub address: u64,
    /// Size in bytes.
    pub size: u64,
    /// Bytes the caller asked for.
    pub requested_size: u64,
    /// 1 when handed to a caller.
    pub allocated: u8,
    /// 1 when allocated or pending free.
    pub active: u8,
}

/// One recorded event of a [`Snapshot`](crate::dropin::Snapshot).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct TraceRow {
    /// Device ordinal.
    pub device: i64,
    /// The action's index in PyTorch's `TraceEntry::Action` ([`pytorch_action`]).
    pub action: u32,
    /// Address (for `oom`: the device's free bytes).
    pub addr: u64,
    /// Size in bytes.
    pub size: u64,
    /// The stream (a `cudaStream_t`).
    pub stream: u64,
    /// Microseconds since the Unix epoch.
    pub time_unix_us: u64,
    /// The tag of the call that caused it (`cachalot_set_event_tag`; 0: none).
    pub tag: u64,
}
