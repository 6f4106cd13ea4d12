//! What the plug-in reports over its registry: PyTorch's memory summary, history
//! recording, and snapshot pickles that PyTorch's memory tools read.

use std::fs::File;
use std::io::{BufWriter, Write};

use cachalot::config::PolicyKind;
use cachalot::history::HistoryConfig;
use cachalot::snapshot::{BlockInfo, BlockState};
use cachalot::snapshot_io::{pickle, SnapshotDump};

use crate::error::{PluginError, PluginResult};
use crate::registry::Registry;
use crate::rows::{pytorch_action, BlockRow, SegmentRow, TraceRow};

/// PyTorch's `memory_summary(device, abbreviated)` table for `device`.
///
/// # Errors
/// The device cannot be opened.
pub fn summary(registry: &Registry, device: i64, abbreviated: bool) -> PluginResult<String> {
    let (ordinal, allocator) = registry.open(device)?;
    Ok(cachalot::summary::memory_summary_with(
        &allocator.stats(),
        ordinal,
        abbreviated,
    ))
}

/// Starts or stops history recording on every device. `max_entries` bounds each
/// device's ring of events (0: unbounded, PyTorch's default).
pub fn record_history(registry: &Registry, enabled: bool, max_entries: usize) {
    let capacity = if max_entries == 0 {
        usize::MAX
    } else {
        max_entries
    };
    let config = enabled.then(|| HistoryConfig {
        capacity,
        ..HistoryConfig::default()
    });
    registry.set_history(config, false);
}

/// Writes every open device's segments, blocks and recorded history to `path` as
/// one PyTorch snapshot pickle (segments of all devices; `device_traces[d]` holds
/// device `d`'s events), as `torch.cuda.memory._dump_snapshot` does.
///
/// # Errors
/// [`PluginError::Io`] when the file cannot be written.
pub fn dump_snapshot(registry: &Registry, path: &str) -> PluginResult<()> {
    let dumps: Vec<SnapshotDump> = registry
        .devices()
        .map(|(device, allocator)| {
            let history = registry.history(device);
            SnapshotDump::capture(allocator.as_ref(), history.as_deref())
        })
        .collect();
    let io = |source| PluginError::Io {
        path: path.to_string(),
        source,
    };
    let mut out = BufWriter::new(File::create(path).map_err(io)?);
    pickle::write_devices(&dumps, &registry.config(), &mut out)
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    out.flush().map_err(io)
}

/// Every open device's segments, blocks and recorded events as the rows of the
/// drop-in allocator's snapshot (`cachalot_snapshot_take`). Event times become
/// microseconds since the Unix epoch.
pub fn snapshot_rows(registry: &Registry) -> (Vec<SegmentRow>, Vec<BlockRow>, Vec<TraceRow>) {
    let (mut segments, mut blocks, mut trace) = (Vec::new(), Vec::new(), Vec::new());
    for (device, allocator) in registry.devices() {
        let merge = allocator.policy() == PolicyKind::Cachalot;
        for segment in allocator.snapshot().segments {
            let rows = block_rows(&segment.blocks, merge);
            segments.push(SegmentRow {
                device: device as i64,
                address: segment.address,
                total_size: segment.total_size,
                requested_size: segment.requested_size(),
                allocated_size: segment.allocated_size(),
                active_size: segment.active_size(),
                stream: segment.stream.0,
                is_large: u8::from(!segment.is_small),
                is_expandable: u8::from(segment.is_expandable),
                first_block: blocks.len(),
                block_count: rows.len(),
                pool_id: [segment.pool_id.0, segment.pool_id.1],
            });
            blocks.extend(rows);
        }
        let (Some(history), Some(opened)) =
            (registry.history(device), registry.opened_unix_us(device))
        else {
            continue;
        };
        trace.extend(history.events().into_iter().map(|r| TraceRow {
            device: device as i64,
            action: pytorch_action(r.event.action),
            addr: r.event.addr,
            size: r.event.size,
            stream: r.event.stream.0,
            time_unix_us: opened.saturating_add(r.event.time_us),
            tag: r.tag,
        }));
    }
    (segments, blocks, trace)
}

/// A segment's blocks as rows, with each run of adjacent free blocks as one
/// when `merge_free`: the cachalot policy's heap may keep a free stretch in
/// pieces (frees not merged yet, blocks kept for reuse at their size), which
/// PyTorch's tools, and checkpoints of graph pools, read as one free block.
fn block_rows(blocks: &[BlockInfo], merge_free: bool) -> Vec<BlockRow> {
    let mut rows: Vec<BlockRow> = Vec::with_capacity(blocks.len());
    for b in blocks {
        let row = BlockRow {
            address: b.address,
            size: b.size,
            requested_size: b.requested_size,
            allocated: u8::from(b.state == BlockState::ActiveAllocated),
            active: u8::from(b.state != BlockState::Inactive),
        };
        match rows.last_mut() {
            Some(last)
                if merge_free
                    && last.active == 0
                    && row.active == 0
                    && last.address + last.size == row.address =>
            {
                last.size += row.size;
            }
            _ => rows.push(row),
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adjacent_free_blocks_become_one_row_when_asked() {
        let block = |address, size, state| BlockInfo {
            address,
            size,
            requested_size: size,
            state,
        };
        let blocks = [
            block(0, 512, BlockState::Inactive),
            block(512, 512, BlockState::Inactive),
            block(1024, 512, BlockState::ActiveAllocated),
            block(1536, 512, BlockState::Inactive),
            block(4096, 512, BlockState::Inactive),
        ];
        let spans = |rows: Vec<BlockRow>| -> Vec<(u64, u64)> {
            rows.iter().map(|r| (r.address, r.size)).collect()
        };
        assert_eq!(
            spans(block_rows(&blocks, true)),
            [(0, 1024), (1024, 512), (1536, 512), (4096, 512)]
        );
        assert_eq!(block_rows(&blocks, false).len(), 5);
    }
}
