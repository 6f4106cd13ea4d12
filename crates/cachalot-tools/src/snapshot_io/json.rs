//! cachalot's own snapshot format: versioned JSON, documented in
//! `docs/snapshot-schema.md`. Written and read back without loss.
//!
//! The reader accepts exactly the versions it knows ([`VERSION`]) and refuses
//! others with [`SnapshotIoError::UnsupportedVersion`], so a file from a newer
//! cachalot fails clearly instead of being half-read.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{read_all, write_path, SnapshotDump, SnapshotIoError, TraceRecord};
use cachalot_core::backend::{DevicePtr, StreamId};
use cachalot_core::config::AllocatorConfig;
use cachalot_core::event::{Action, TraceEvent};
use cachalot_core::history::Frame;
use cachalot_core::private_pool::PoolId;
use cachalot_core::snapshot::{BlockInfo, BlockState, SegmentInfo};

/// The schema version written.
pub const VERSION: u64 = 1;

/// The value of the `format` field.
pub const FORMAT: &str = "cachalot-snapshot";

#[derive(Serialize, Deserialize)]
struct Document {
    format: String,
    version: u64,
    device: usize,
    allocator_settings: String,
    segments: Vec<Segment>,
    trace: Vec<Event>,
}

#[derive(Serialize, Deserialize)]
struct Segment {
    address: DevicePtr,
    total_size: u64,
    stream: u64,
    pool: Pool,
    is_expandable: bool,
    /// `segment_pool_id`; absent (the default pools) in older documents.
    #[serde(default)]
    pool_id: (u64, u64),
    blocks: Vec<Block>,
}

#[derive(Copy, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Pool {
    Small,
    Large,
}

#[derive(Serialize, Deserialize)]
struct Block {
    address: DevicePtr,
    size: u64,
    requested_size: u64,
    state: BlockState,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    frames: Vec<Frame>,
}

#[derive(Serialize, Deserialize)]
struct Event {
    time_us: u64,
    action: Action,
    addr: DevicePtr,
    size: u64,
    stream: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    frames: Vec<Frame>,
}

/// Only `format` and `version`, read first so an unknown version is reported
/// as such rather than as a schema error.
#[derive(Deserialize)]
struct Header {
    format: String,
    version: u64,
}

/// Writes `dump` to `path` (gzip-compressed when the name ends in `.gz`).
///
/// # Errors
/// I/O errors.
pub fn write_file(dump: &SnapshotDump, path: &Path) -> Result<(), SnapshotIoError> {
    write_path(path, |out| write(dump, out))
}

/// Writes `dump` as JSON to `out`.
///
/// # Errors
/// I/O errors from `out`.
pub fn write(dump: &SnapshotDump, out: &mut dyn Write) -> Result<(), SnapshotIoError> {
    serde_json::to_writer(out, &to_document(dump))?;
    Ok(())
}

/// Reads a snapshot written by [`write_file`] (plain or gzip).
///
/// # Errors
/// I/O errors, malformed JSON, another format or an unknown version.
pub fn read_file(path: &Path) -> Result<SnapshotDump, SnapshotIoError> {
    read(&read_all(path)?)
}

/// Reads a snapshot from JSON bytes.
///
/// # Errors
/// Malformed JSON, another format, an unknown version, blocks that do not
/// tile their segment, or settings that do not parse.
pub fn read(bytes: &[u8]) -> Result<SnapshotDump, SnapshotIoError> {
    let header: Header = serde_json::from_slice(bytes)?;
    if header.format != FORMAT {
        return Err(SnapshotIoError::Invalid(format!(
            "format is '{}', expected '{FORMAT}'",
            header.format
        )));
    }
    if header.version != VERSION {
        return Err(SnapshotIoError::UnsupportedVersion {
            found: header.version,
            supported: VERSION,
        });
    }
    from_document(serde_json::from_slice(bytes)?)
}

fn to_document(dump: &SnapshotDump) -> Document {
    let segment = |s: &SegmentInfo| Segment {
        address: s.address,
        total_size: s.total_size,
        stream: s.stream.0,
        pool: if s.is_small { Pool::Small } else { Pool::Large },
        is_expandable: s.is_expandable,
        pool_id: (s.pool_id.0, s.pool_id.1),
        blocks: s
            .blocks
            .iter()
            .map(|b| Block {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                state: b.state,
                frames: dump.frames_of(b.address).to_vec(),
            })
            .collect(),
    };
    let event = |r: &TraceRecord| Event {
        time_us: r.event.time_us,
        action: r.event.action,
        addr: r.event.addr,
        size: r.event.size,
        stream: r.event.stream.0,
        frames: r.frames.clone(),
    };
    Document {
        format: FORMAT.to_string(),
        version: VERSION,
        device: dump.device,
        allocator_settings: dump.config.source.clone(),
        segments: dump.snapshot.segments.iter().map(segment).collect(),
        trace: dump.trace.iter().map(event).collect(),
    }
}

fn from_document(doc: Document) -> Result<SnapshotDump, SnapshotIoError> {
    let mut dump = SnapshotDump {
        device: doc.device,
        config: AllocatorConfig::parse(&doc.allocator_settings)?,
        ..SnapshotDump::default()
    };
    for s in doc.segments {
        check_tiling(&s)?;
        let mut blocks = Vec::with_capacity(s.blocks.len());
        for b in s.blocks {
            if !b.frames.is_empty() {
                dump.block_frames.insert(b.address, b.frames);
            }
            blocks.push(BlockInfo {
                address: b.address,
                size: b.size,
                requested_size: b.requested_size,
                state: b.state,
            });
        }
        dump.snapshot.segments.push(SegmentInfo {
            device: doc.device,
            address: s.address,
            total_size: s.total_size,
            stream: StreamId(s.stream),
            is_small: s.pool == Pool::Small,
            is_expandable: s.is_expandable,
            pool_id: PoolId(s.pool_id.0, s.pool_id.1),
            blocks,
        });
    }
    dump.trace = doc
        .trace
        .into_iter()
        .map(|e| TraceRecord {
            event: TraceEvent {
                time_us: e.time_us,
                action: e.action,
                addr: e.addr,
                size: e.size,
                stream: StreamId(e.stream),
            },
            frames: e.frames,
        })
        .collect();
    Ok(dump)
}

/// Blocks must start at the segment's address and follow each other without
/// gaps or overlaps to its end.
fn check_tiling(s: &Segment) -> Result<(), SnapshotIoError> {
    let mut next = s.address;
    for b in &s.blocks {
        if b.address != next || b.size == 0 {
            return Err(SnapshotIoError::Invalid(format!(
                "segment {:#x}: block at {:#x} (size {}) does not follow the previous block, which ends at {next:#x}",
                s.address, b.address, b.size
            )));
        }
        next = next.checked_add(b.size).ok_or_else(|| {
            SnapshotIoError::Invalid(format!("block at {:#x} overflows", b.address))
        })?;
    }
    if next - s.address != s.total_size {
        return Err(SnapshotIoError::Invalid(format!(
            "segment {:#x}: blocks cover {} bytes of {}",
            s.address,
            next - s.address,
            s.total_size
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fixtures;
    use super::*;

    fn to_bytes(dump: &SnapshotDump) -> Vec<u8> {
        let mut out = Vec::new();
        write(dump, &mut out).expect("writes to memory");
        out
    }

    #[test]
    fn round_trips_without_loss() {
        let dump = fixtures::dump();
        let back = read(&to_bytes(&dump)).expect("reads its own output");
        assert_eq!(back, dump);
    }

    #[test]
    fn round_trips_through_a_gzip_file() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("snap.json.gz");
        write_file(&fixtures::dump(), &path).expect("writes");
        let raw = std::fs::read(&path).expect("exists");
        assert_eq!(&raw[..2], &[0x1f, 0x8b], "gzip-compressed");
        assert_eq!(read_file(&path).expect("reads"), fixtures::dump());
    }

    #[test]
    fn has_version_and_format_fields() {
        let value: serde_json::Value =
            serde_json::from_slice(&to_bytes(&fixtures::dump())).expect("json");
        assert_eq!(value["version"], 1);
        assert_eq!(value["format"], "cachalot-snapshot");
        assert_eq!(
            value["segments"][0]["blocks"][0]["state"],
            "active_allocated"
        );
        assert_eq!(value["segments"][0]["pool"], "small");
        assert_eq!(value["trace"][2]["action"], "oom");
    }

    #[test]
    fn the_documented_example_reads() {
        let doc = include_str!("../../../../docs/snapshot-schema.md");
        let example = doc
            .split("```json")
            .nth(1)
            .and_then(|s| s.split("```").next())
            .expect("the doc has an example");
        let dump = read(example.as_bytes()).expect("the example follows the schema");
        assert!(dump.config.expandable_segments);
        assert_eq!(dump.snapshot.segments[0].blocks[0].requested_size, 500);
        assert_eq!(dump.frames_of(139872384237568)[0].line, 42);
        assert_eq!(dump.trace[1].event.action, Action::Alloc);
    }

    #[test]
    fn refuses_other_versions_and_broken_files() {
        let mut value: serde_json::Value =
            serde_json::from_slice(&to_bytes(&fixtures::dump())).expect("json");
        value["version"] = 2.into();
        let err = read(value.to_string().as_bytes()).expect_err("version 2 is unknown");
        assert!(
            matches!(
                err,
                SnapshotIoError::UnsupportedVersion {
                    found: 2,
                    supported: 1
                }
            ),
            "{err}"
        );

        value["version"] = 1.into();
        value["segments"][0]["blocks"][1]["size"] = 100.into();
        let err = read(value.to_string().as_bytes()).expect_err("blocks no longer tile");
        assert!(matches!(err, SnapshotIoError::Invalid(_)), "{err}");

        assert!(matches!(
            read(b"{\"format\":\"other\",\"version\":1}"),
            Err(SnapshotIoError::Invalid(_))
        ));
        assert!(matches!(read(b"not json"), Err(SnapshotIoError::Json(_))));
        assert!(matches!(read(b""), Err(SnapshotIoError::Json(_))));
    }
}
