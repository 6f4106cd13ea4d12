//! What the plug-in reports over its registry: PyTorch's memory summary, history
//! recording, and snapshot pickles that PyTorch's memory tools read.

use std::fs::File;
use std::io::{BufWriter, Write};

use cachalot::event::Action;
use cachalot::history::HistoryConfig;
use cachalot::snapshot::BlockState;
use cachalot::snapshot_io::{pickle, SnapshotDump};
use serde_pickle::{HashableValue, SerOptions, Value};

use crate::dropin::{BlockRow, SegmentRow, TraceRow};
use crate::error::{PluginError, PluginResult};
use crate::registry::Registry;

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
    let mut merged: Option<Value> = None;
    for (device, allocator) in registry.devices() {
        let history = registry.history(device);
        let dump = SnapshotDump::capture(allocator.as_ref(), history.as_deref());
        let value = pickle::to_value(&dump);
        merged = Some(match merged {
            None => value,
            Some(into) => merge(into, value),
        });
    }
    let value = merged.unwrap_or_else(|| {
        pickle::to_value(&SnapshotDump {
            config: registry.config(),
            ..SnapshotDump::default()
        })
    });
    let io = |source| PluginError::Io {
        path: path.to_string(),
        source,
    };
    let mut out = BufWriter::new(File::create(path).map_err(io)?);
    serde_pickle::value_to_writer(&mut out, &value, SerOptions::new())
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    out.flush().map_err(io)
}

/// Every open device's segments, blocks and recorded events as the rows of the
/// drop-in allocator's snapshot (`cachalot_snapshot_take`). Event times become
/// microseconds since the Unix epoch.
pub fn snapshot_rows(registry: &Registry) -> (Vec<SegmentRow>, Vec<BlockRow>, Vec<TraceRow>) {
    let (mut segments, mut blocks, mut trace) = (Vec::new(), Vec::new(), Vec::new());
    for (device, allocator) in registry.devices() {
        for segment in allocator.snapshot().segments {
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
                block_count: segment.blocks.len(),
                pool_id: [segment.pool_id.0, segment.pool_id.1],
            });
            blocks.extend(segment.blocks.iter().map(|b| BlockRow {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                allocated: u8::from(b.state == BlockState::ActiveAllocated),
                active: u8::from(b.state != BlockState::Inactive),
            }));
        }
        let (Some(history), Some(opened)) =
            (registry.history(device), registry.opened_unix_us(device))
        else {
            continue;
        };
        trace.extend(history.events().into_iter().map(|r| {
            TraceRow {
                device: device as i64,
                action: Action::ALL
                    .iter()
                    .position(|&a| a == r.event.action)
                    .unwrap_or(0) as u32,
                addr: r.event.addr,
                size: r.event.size,
                stream: r.event.stream.0,
                time_unix_us: opened.saturating_add(r.event.time_us),
                tag: r.tag,
            }
        }));
    }
    (segments, blocks, trace)
}

/// Adds a later device's snapshot to `into`: its segments are appended and its
/// trace list takes its device's place in `device_traces`.
fn merge(mut into: Value, from: Value) -> Value {
    let (Value::Dict(target), Value::Dict(mut source)) = (&mut into, from) else {
        return into;
    };
    for key in ["segments", "device_traces"] {
        let name = HashableValue::String(key.to_string());
        let (Some(Value::List(to)), Some(Value::List(add))) =
            (target.get_mut(&name), source.remove(&name))
        else {
            continue;
        };
        if key == "segments" {
            to.extend(add);
            continue;
        }
        // A device's list is the last of its `device_traces`; earlier ones are empty.
        let device = add.len().saturating_sub(1);
        if let Some(trace) = add.into_iter().next_back() {
            to.resize_with(to.len().max(device + 1), || Value::List(Vec::new()));
            to[device] = trace;
        }
    }
    into
}
