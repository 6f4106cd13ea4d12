//! Writes a [`SnapshotDump`] as PyTorch's snapshot pickle (what
//! `torch.cuda.memory._dump_snapshot` writes), so `python3 -m
//! torch.cuda._memory_viz stats|trace|trace_plot|segment_plot` and
//! pytorch.org/memory_viz read it.
//!
//! The top-level dict has `segments`, `device_traces` (one list per device up to
//! ours), `allocator_settings` and an empty `external_annotations`. The pickle
//! is protocol 3, which every Python 3 and the memory_viz page read. Reading
//! PyTorch's pickles back is the trace readers' job.

use std::io::Write;
use std::path::Path;

use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::Serialize;
use serde_pickle::SerOptions;

use super::{write_path, SnapshotDump, SnapshotIoError};
use cachalot_core::config::{AllocatorConfig, ROUNDUP_BUCKETS};
use cachalot_core::event::{Action, TraceEvent};
use cachalot_core::history::Frame;
use cachalot_core::snapshot::{BlockInfo, SegmentInfo};

/// Writes `dump` to `path` (gzip-compressed when the name ends in `.gz`;
/// `_memory_viz` itself wants the plain file).
///
/// # Errors
/// I/O errors, or a value too large for a Python int of the writer.
pub fn write_file(dump: &SnapshotDump, path: &Path) -> Result<(), SnapshotIoError> {
    write_path(path, |out| write(dump, out))
}

/// Writes `dump` as a pickle to `out`, as it goes: nothing but the dump is
/// held in memory, however many events it has.
///
/// # Errors
/// I/O errors from `out`.
pub fn write(dump: &SnapshotDump, out: &mut dyn Write) -> Result<(), SnapshotIoError> {
    write_devices(std::slice::from_ref(dump), &dump.config, out)
}

/// Writes the dumps of several devices as one pickle (every device's
/// segments; `device_traces[d]` holds device `d`'s events), as
/// `torch.cuda.memory._dump_snapshot` does for a process, with `config` as
/// its `allocator_settings`.
///
/// # Errors
/// I/O errors from `out`.
pub fn write_devices(
    dumps: &[SnapshotDump],
    config: &AllocatorConfig,
    out: &mut dyn Write,
) -> Result<(), SnapshotIoError> {
    serde_pickle::to_writer(&mut { out }, &Top { dumps, config }, SerOptions::new())?;
    Ok(())
}

/// The dumps as the Python object PyTorch's `_snapshot()` returns.
struct Top<'a> {
    dumps: &'a [SnapshotDump],
    config: &'a AllocatorConfig,
}

impl Serialize for Top<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        let mut m = out.serialize_map(Some(4))?;
        m.serialize_entry("segments", &Segments(self.dumps))?;
        let devices = self.dumps.iter().map(|d| d.device + 1).max().unwrap_or(0);
        let traces: Vec<Trace<'_>> = (0..devices)
            .map(|d| Trace(self.dumps.iter().find(|dump| dump.device == d)))
            .collect();
        m.serialize_entry("device_traces", &traces)?;
        m.serialize_entry("allocator_settings", &Settings(self.config))?;
        m.serialize_entry("external_annotations", &[(); 0])?;
        m.end()
    }
}

/// Every dump's segments, in one list.
struct Segments<'a>(&'a [SnapshotDump]);

impl Serialize for Segments<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        let count = self.0.iter().map(|d| d.snapshot.segments.len()).sum();
        let mut seq = out.serialize_seq(Some(count))?;
        for dump in self.0 {
            for s in &dump.snapshot.segments {
                seq.serialize_element(&Segment(s, dump))?;
            }
        }
        seq.end()
    }
}

/// A slice written as a list, each item through `F`.
struct Each<'a, T, F>(&'a [T], F);

/// `items` written as a list, each item through `f`.
fn each<'a, T, R: Serialize, F: Fn(&'a T) -> R>(items: &'a [T], f: F) -> Each<'a, T, F> {
    Each(items, f)
}

impl<'a, T, R: Serialize, F: Fn(&'a T) -> R> Serialize for Each<'a, T, F> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        let mut seq = out.serialize_seq(Some(self.0.len()))?;
        for item in self.0 {
            seq.serialize_element(&(self.1)(item))?;
        }
        seq.end()
    }
}

/// One device's trace: the dump's events, or an empty list for a device
/// below it.
struct Trace<'a>(Option<&'a SnapshotDump>);

impl Serialize for Trace<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        let trace = self.0.map_or(&[][..], |d| &d.trace[..]);
        each(trace, |r| Entry(r.event, &r.frames)).serialize(out)
    }
}

/// A call stack: a list of `{filename, line, name}`.
struct Frames<'a>(&'a [Frame]);

impl Serialize for Frames<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        each(self.0, |f| {
            let mut m = std::collections::BTreeMap::new();
            m.insert("filename", Field::Text(&f.filename));
            m.insert("line", Field::Int(f.line.into()));
            m.insert("name", Field::Text(&f.name));
            m
        })
        .serialize(out)
    }
}

/// A value of a dict written field by field.
enum Field<'a> {
    Int(u64),
    Text(&'a str),
}

impl Serialize for Field<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        match self {
            Field::Int(n) => out.serialize_u64(*n),
            Field::Text(t) => out.serialize_str(t),
        }
    }
}

struct Segment<'a>(&'a SegmentInfo, &'a SnapshotDump);

impl Serialize for Segment<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        let (s, dump) = (self.0, self.1);
        let mut m = out.serialize_map(Some(12))?;
        m.serialize_entry("device", &(s.device as u64))?;
        m.serialize_entry("address", &s.address)?;
        m.serialize_entry("total_size", &s.total_size)?;
        m.serialize_entry("allocated_size", &s.allocated_size())?;
        m.serialize_entry("active_size", &s.active_size())?;
        m.serialize_entry("requested_size", &s.requested_size())?;
        m.serialize_entry("stream", &s.stream.0)?;
        let kind = if s.is_small { "small" } else { "large" };
        m.serialize_entry("segment_type", kind)?;
        m.serialize_entry("segment_pool_id", &(s.pool_id.0, s.pool_id.1))?;
        m.serialize_entry("is_expandable", &s.is_expandable)?;
        m.serialize_entry("frames", &Frames(&[]))?;
        let blocks = each(&s.blocks, |b| Block(b, dump));
        m.serialize_entry("blocks", &blocks)?;
        m.end()
    }
}

struct Block<'a>(&'a BlockInfo, &'a SnapshotDump);

impl Serialize for Block<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        let b = self.0;
        let mut m = out.serialize_map(Some(5))?;
        m.serialize_entry("address", &b.address)?;
        m.serialize_entry("size", &b.size)?;
        m.serialize_entry("requested_size", &b.requested_size)?;
        m.serialize_entry("state", b.state.name())?;
        m.serialize_entry("frames", &Frames(self.1.frames_of(b.address)))?;
        m.end()
    }
}

struct Entry<'a>(TraceEvent, &'a [Frame]);

impl Serialize for Entry<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        let e = self.0;
        // For `oom` PyTorch names the address slot `device_free`.
        let addr_key = if e.action == Action::Oom {
            "device_free"
        } else {
            "addr"
        };
        let mut m = out.serialize_map(Some(8))?;
        m.serialize_entry("action", e.action.name())?;
        m.serialize_entry(addr_key, &e.addr)?;
        m.serialize_entry("size", &e.size)?;
        m.serialize_entry("stream", &e.stream.0)?;
        m.serialize_entry("time_us", &e.time_us)?;
        m.serialize_entry("frames", &Frames(self.1))?;
        m.serialize_entry("compile_context", "N/A")?;
        m.serialize_entry("user_metadata", "")?;
        m.end()
    }
}

/// PyTorch's `allocator_settings` dict.
struct Settings<'a>(&'a AllocatorConfig);

impl Serialize for Settings<'_> {
    fn serialize<S: Serializer>(&self, out: S) -> Result<S::Ok, S::Error> {
        let c = self.0;
        let divisions: std::collections::BTreeMap<String, u64> = (0..ROUNDUP_BUCKETS)
            .map(|i| ((1u64 << i).to_string(), c.roundup_power2_divisions[i]))
            .collect();
        let mut m = out.serialize_map(Some(10))?;
        m.serialize_entry("PYTORCH_CUDA_ALLOC_CONF", &c.source)?;
        match c.max_split_size {
            Some(size) => m.serialize_entry("max_split_size", &size)?,
            None => m.serialize_entry("max_split_size", &-1i64)?,
        }
        m.serialize_entry(
            "garbage_collection_threshold",
            &c.garbage_collection_threshold,
        )?;
        m.serialize_entry("expandable_segments", &c.expandable_segments)?;
        m.serialize_entry(
            "pinned_num_register_threads",
            &c.pinned_num_register_threads,
        )?;
        m.serialize_entry("release_lock_on_cudamalloc", &c.release_lock_on_cudamalloc)?;
        m.serialize_entry(
            "pinned_use_cuda_host_register",
            &c.pinned_use_cuda_host_register,
        )?;
        m.serialize_entry(
            "graph_capture_record_stream_reuse",
            &c.graph_capture_record_stream_reuse,
        )?;
        m.serialize_entry("roundup_power2_divisions", &divisions)?;
        m.serialize_entry("policy", c.policy.name())?;
        m.end()
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures;
    use super::*;
    use serde_pickle::{HashableValue, Value};

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

    fn string(s: &str) -> Value {
        Value::String(s.to_string())
    }

    #[test]
    fn pickle_follows_pytorch_schema() {
        let dump = fixtures::dump();
        let mut bytes = Vec::new();
        write(&dump, &mut bytes).expect("writes to memory");
        let back = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new())
            .expect("valid pickle");

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
    fn what_is_written_reads_back_as_a_recording() {
        let dump = fixtures::dump();
        let mut bytes = Vec::new();
        write(&dump, &mut bytes).expect("writes to memory");
        let recording =
            crate::trace::read_recording(&bytes[..], &crate::trace::ReadLimits::default())
                .expect("reads back");
        assert_eq!(recording.events, dump.events());
        assert_eq!(recording.segments, dump.snapshot.segments);
    }

    #[test]
    fn huge_values_become_big_ints() {
        let mut bytes = Vec::new();
        serde_pickle::to_writer(&mut bytes, &u64::MAX, SerOptions::new()).expect("writes");
        let back = serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new())
            .expect("valid pickle");
        assert_eq!(back, Value::Int(u64::MAX.into()));
    }
}
