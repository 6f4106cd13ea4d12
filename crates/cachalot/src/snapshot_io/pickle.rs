//! Writes a [`SnapshotDump`] as PyTorch's snapshot pickle (what
//! `torch.cuda.memory._dump_snapshot` writes), so `python3 -m
//! torch.cuda._memory_viz stats|trace|trace_plot|segment_plot` and
//! pytorch.org/memory_viz read it.
//!
//! The top-level dict has `segments`, `device_traces` (one list per device up to
//! ours), `allocator_settings` and an empty `external_annotations`. The pickle
//! is protocol 3, which every Python 3 and the memory_viz page read. Reading
//! PyTorch's pickles back is the trace readers' job.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde_pickle::{HashableValue, SerOptions, Value};

use super::{write_path, SnapshotDump, SnapshotIoError};
use crate::config::{AllocatorConfig, ROUNDUP_BUCKETS};
use crate::event::Action;
use crate::history::Frame;
use crate::snapshot::{BlockInfo, SegmentInfo};

/// Writes `dump` to `path` (gzip-compressed when the name ends in `.gz`;
/// `_memory_viz` itself wants the plain file).
///
/// # Errors
/// I/O errors, or a value too large for a Python int of the writer.
pub fn write_file(dump: &SnapshotDump, path: &Path) -> Result<(), SnapshotIoError> {
    write_path(path, |out| write(dump, out))
}

/// Writes `dump` as a pickle to `out`.
///
/// # Errors
/// I/O errors from `out`.
pub fn write(dump: &SnapshotDump, out: &mut dyn Write) -> Result<(), SnapshotIoError> {
    serde_pickle::value_to_writer(&mut { out }, &to_value(dump), SerOptions::new())?;
    Ok(())
}

/// The dump as the Python object PyTorch's `_snapshot()` returns.
pub fn to_value(dump: &SnapshotDump) -> Value {
    let segments = dump
        .snapshot
        .segments
        .iter()
        .map(|s| segment(s, dump))
        .collect();
    let mut device_traces: Vec<Value> = (0..dump.device).map(|_| Value::List(Vec::new())).collect();
    device_traces.push(Value::List(
        dump.trace
            .iter()
            .map(|r| trace_entry(r.event, &r.frames))
            .collect(),
    ));
    dict(vec![
        ("segments", Value::List(segments)),
        ("device_traces", Value::List(device_traces)),
        ("allocator_settings", settings(&dump.config)),
        ("external_annotations", Value::List(Vec::new())),
    ])
}

fn dict(entries: Vec<(&str, Value)>) -> Value {
    let map: BTreeMap<HashableValue, Value> = entries
        .into_iter()
        .map(|(k, v)| (HashableValue::String(k.to_string()), v))
        .collect();
    Value::Dict(map)
}

fn string(s: &str) -> Value {
    Value::String(s.to_string())
}

/// A Python int. Values above `i64::MAX` (never real addresses or sizes) are
/// written as big ints.
fn int(v: u64) -> Value {
    match i64::try_from(v) {
        Ok(v) => Value::I64(v),
        Err(_) => Value::Int(v.into()),
    }
}

fn frames(frames: &[Frame]) -> Value {
    Value::List(
        frames
            .iter()
            .map(|f| {
                dict(vec![
                    ("filename", string(&f.filename)),
                    ("line", int(f.line.into())),
                    ("name", string(&f.name)),
                ])
            })
            .collect(),
    )
}

fn segment(s: &SegmentInfo, dump: &SnapshotDump) -> Value {
    let requested = s.requested_size();
    let blocks = s.blocks.iter().map(|b| block(b, dump)).collect();
    dict(vec![
        ("device", int(s.device as u64)),
        ("address", int(s.address)),
        ("total_size", int(s.total_size)),
        ("allocated_size", int(s.allocated_size())),
        ("active_size", int(s.active_size())),
        ("requested_size", int(requested)),
        ("stream", int(s.stream.0)),
        (
            "segment_type",
            string(if s.is_small { "small" } else { "large" }),
        ),
        (
            "segment_pool_id",
            Value::Tuple(vec![int(s.pool_id.0), int(s.pool_id.1)]),
        ),
        ("is_expandable", Value::Bool(s.is_expandable)),
        ("frames", Value::List(Vec::new())),
        ("blocks", Value::List(blocks)),
    ])
}

fn block(b: &BlockInfo, dump: &SnapshotDump) -> Value {
    dict(vec![
        ("address", int(b.address)),
        ("size", int(b.size)),
        ("requested_size", int(b.requested_size)),
        ("state", string(b.state.name())),
        ("frames", frames(dump.frames_of(b.address))),
    ])
}

fn trace_entry(e: crate::event::TraceEvent, stack: &[Frame]) -> Value {
    // For `oom` PyTorch names the address slot `device_free`.
    let addr_key = if e.action == Action::Oom {
        "device_free"
    } else {
        "addr"
    };
    dict(vec![
        ("action", string(e.action.name())),
        (addr_key, int(e.addr)),
        ("size", int(e.size)),
        ("stream", int(e.stream.0)),
        ("time_us", int(e.time_us)),
        ("frames", frames(stack)),
        ("compile_context", string("N/A")),
        ("user_metadata", string("")),
    ])
}

/// PyTorch's `allocator_settings` dict.
fn settings(c: &AllocatorConfig) -> Value {
    let divisions: BTreeMap<HashableValue, Value> = (0..ROUNDUP_BUCKETS)
        .map(|i| {
            (
                HashableValue::String((1u64 << i).to_string()),
                int(c.roundup_power2_divisions[i]),
            )
        })
        .collect();
    let max_split = c.max_split_size.map_or(Value::I64(-1), int);
    dict(vec![
        ("PYTORCH_CUDA_ALLOC_CONF", string(&c.source)),
        ("max_split_size", max_split),
        (
            "garbage_collection_threshold",
            Value::F64(c.garbage_collection_threshold),
        ),
        ("expandable_segments", Value::Bool(c.expandable_segments)),
        (
            "pinned_num_register_threads",
            int(c.pinned_num_register_threads),
        ),
        (
            "release_lock_on_cudamalloc",
            Value::Bool(c.release_lock_on_cudamalloc),
        ),
        (
            "pinned_use_cuda_host_register",
            Value::Bool(c.pinned_use_cuda_host_register),
        ),
        (
            "graph_capture_record_stream_reuse",
            Value::Bool(c.graph_capture_record_stream_reuse),
        ),
        ("roundup_power2_divisions", Value::Dict(divisions)),
        ("policy", string(c.policy.name())),
    ])
}

#[cfg(test)]
mod tests {
    use super::super::fixtures;
    use super::*;

    fn get<'a>(v: &'a Value, key: &str) -> &'a Value {
        match v {
            Value::Dict(m) => m
                .get(&HashableValue::String(key.to_string()))
                .expect("key present"),
            other => panic!("not a dict: {other:?}"),
        }
    }

    fn list(v: &Value) -> &[Value] {
        match v {
            Value::List(l) => l,
            other => panic!("not a list: {other:?}"),
        }
    }

    #[test]
    fn pickle_follows_pytorch_schema_and_round_trips_through_the_format() {
        let dump = fixtures::dump();
        let mut bytes = Vec::new();
        write(&dump, &mut bytes).expect("writes to memory");
        let back = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new())
            .expect("valid pickle");
        assert_eq!(back, to_value(&dump));

        let segments = list(get(&back, "segments"));
        assert_eq!(segments.len(), 2);
        let small = &segments[0];
        assert_eq!(get(small, "segment_type"), &string("small"));
        assert_eq!(get(small, "allocated_size"), &Value::I64(512));
        assert_eq!(get(small, "active_size"), &Value::I64(1024));
        assert_eq!(get(small, "requested_size"), &Value::I64(1012));
        assert_eq!(
            get(small, "segment_pool_id"),
            &Value::Tuple(vec![Value::I64(0), Value::I64(0)])
        );
        let block = &list(get(small, "blocks"))[1];
        assert_eq!(get(block, "state"), &string("active_pending_free"));
        let first_frames = list(get(&list(get(small, "blocks"))[0], "frames"));
        assert_eq!(get(&first_frames[0], "line"), &Value::I64(12));
        assert_eq!(get(&segments[1], "is_expandable"), &Value::Bool(true));
        assert_eq!(get(&segments[1], "stream"), &Value::I64(0x55));

        let traces = list(get(&back, "device_traces"));
        assert_eq!(traces.len(), 2, "one list per device up to device 1");
        assert!(list(&traces[0]).is_empty());
        let events = list(&traces[1]);
        assert_eq!(get(&events[1], "action"), &string("alloc"));
        assert_eq!(get(&events[1], "size"), &Value::I64(500));
        assert_eq!(get(&events[2], "device_free"), &Value::I64(1 << 20));

        let settings = get(&back, "allocator_settings");
        assert_eq!(get(settings, "expandable_segments"), &Value::Bool(true));
        assert_eq!(get(settings, "max_split_size"), &Value::I64(64 << 20));
        assert_eq!(
            get(get(settings, "roundup_power2_divisions"), "32768"),
            &Value::I64(0)
        );
    }

    #[test]
    fn huge_values_become_big_ints() {
        assert_eq!(int(u64::MAX), Value::Int(u64::MAX.into()));
        assert_eq!(int(7), Value::I64(7));
    }
}
