//! Snapshot files: an allocator's segments and blocks plus its recorded events,
//! written where other tools can read them.
//!
//! * [`pickle`]: PyTorch's `_dump_snapshot` schema, for
//!   `python3 -m torch.cuda._memory_viz` and pytorch.org/memory_viz.
//! * [`json`]: cachalot's own versioned JSON (`docs/snapshot-schema.md`),
//!   written and read back.
//!
//! Both take a [`SnapshotDump`], built from a live allocator with
//! [`SnapshotDump::capture`] or assembled by hand (replays, tests).

pub mod json;
pub mod pickle;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use thiserror::Error;

use cachalot_core::allocator::DeviceAllocator;
use cachalot_core::backend::DevicePtr;
use cachalot_core::config::{AllocatorConfig, ConfigError};
use cachalot_core::event::TraceEvent;
use cachalot_core::history::{Frame, History};
use cachalot_core::snapshot::{BlockState, MemorySnapshot};

/// A snapshot file could not be written or read.
#[derive(Debug, Error)]
pub enum SnapshotIoError {
    /// The file could not be opened, read or written.
    #[error("snapshot file: {0}")]
    Io(#[from] std::io::Error),
    /// The JSON is malformed or does not follow the schema.
    #[error("snapshot JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The pickle could not be written.
    #[error("snapshot pickle: {0}")]
    Pickle(#[from] serde_pickle::Error),
    /// The file names a schema version this build does not know.
    #[error(
        "snapshot schema version {found} is not supported (this build reads version {supported})"
    )]
    UnsupportedVersion {
        /// The version in the file.
        found: u64,
        /// The version this build reads.
        supported: u64,
    },
    /// The file is readable but its content breaks the schema.
    #[error("not a cachalot snapshot: {0}")]
    Invalid(String),
    /// The recorded allocator settings do not parse.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// One recorded event with the stack it happened at (empty when not recorded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceRecord {
    /// The event.
    pub event: TraceEvent,
    /// Innermost frame first.
    pub frames: Vec<Frame>,
}

/// What a snapshot file holds: PyTorch's `_snapshot()` for one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SnapshotDump {
    /// The device ordinal.
    pub device: usize,
    /// Every segment and block.
    pub snapshot: MemorySnapshot,
    /// Stacks of active blocks, by block address (from history recording).
    pub block_frames: BTreeMap<DevicePtr, Vec<Frame>>,
    /// The recorded events, oldest first.
    pub trace: Vec<TraceRecord>,
    /// The allocator's configuration.
    pub config: AllocatorConfig,
}

impl SnapshotDump {
    /// Takes a snapshot of `allocator` with the events and stacks `history`
    /// recorded, if any.
    pub fn capture(allocator: &dyn DeviceAllocator, history: Option<&History>) -> SnapshotDump {
        let snapshot = allocator.snapshot();
        let mut dump = SnapshotDump {
            device: allocator.backend().capabilities().device,
            config: allocator.config().clone(),
            ..SnapshotDump::default()
        };
        if let Some(history) = history {
            dump.add_history(history, &snapshot);
        }
        dump.snapshot = snapshot;
        dump
    }

    fn add_history(&mut self, history: &History, snapshot: &MemorySnapshot) {
        let active = snapshot
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .filter(|b| b.state != BlockState::Inactive);
        for block in active {
            if let Some(stack) = history.stack_of(block.address) {
                self.block_frames
                    .insert(block.address, stack.frames().to_vec());
            }
        }
        self.trace = history
            .events()
            .into_iter()
            .map(|r| TraceRecord {
                event: r.event,
                frames: r.stack.map(|s| s.frames().to_vec()).unwrap_or_default(),
            })
            .collect();
    }

    /// The stack of the block at `addr`, empty when unknown.
    pub fn frames_of(&self, addr: DevicePtr) -> &[Frame] {
        self.block_frames.get(&addr).map_or(&[], Vec::as_slice)
    }

    /// The recorded events without their stacks.
    pub fn events(&self) -> Vec<TraceEvent> {
        self.trace.iter().map(|r| r.event).collect()
    }
}

/// Creates `path` and fills it with `write`, gzip-compressed when its name ends
/// in `.gz` (the writes buffered before the compressor, which is slow on
/// small ones, and the gzip stream finished with its errors reported).
///
/// # Errors
/// I/O errors, and whatever `write` returns.
pub fn write_path<T, E: From<std::io::Error>>(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> Result<T, E>,
) -> Result<T, E> {
    let mut file = File::create(path)?;
    let written = if path.extension().is_some_and(|e| e == "gz") {
        let mut zipped = GzEncoder::new(BufWriter::new(&mut file), Compression::fast());
        let written = {
            let mut buffered = BufWriter::with_capacity(1 << 16, &mut zipped);
            let written = write(&mut buffered)?;
            buffered.flush()?;
            written
        };
        zipped.finish()?.flush()?;
        written
    } else {
        let mut buffered = BufWriter::with_capacity(1 << 16, &mut file);
        let written = write(&mut buffered)?;
        buffered.flush()?;
        written
    };
    file.sync_data().or_else(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::Unsupported => Ok(()),
        _ => Err(e),
    })?;
    Ok(written)
}

/// Reads all of `path`, decompressing gzip (recognised by its magic bytes).
fn read_all(path: &Path) -> Result<Vec<u8>, SnapshotIoError> {
    let mut raw = Vec::new();
    BufReader::new(File::open(path)?).read_to_end(&mut raw)?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        MultiGzDecoder::new(raw.as_slice()).read_to_end(&mut out)?;
        return Ok(out);
    }
    Ok(raw)
}

#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use cachalot_core::backend::StreamId;
    use cachalot_core::event::Action;
    use cachalot_core::snapshot::{BlockInfo, SegmentInfo};

    /// A dump with one small and one expandable large segment, three events
    /// and one stack.
    pub(crate) fn dump() -> SnapshotDump {
        let small = SegmentInfo {
            device: 1,
            address: 0x7f00_0000_0000,
            total_size: 2 << 20,
            stream: StreamId(0),
            is_small: true,
            is_expandable: false,
            pool_id: cachalot_core::private_pool::PoolId::DEFAULT,
            blocks: vec![
                BlockInfo {
                    address: 0x7f00_0000_0000,
                    size: 512,
                    requested_size: 500,
                    state: BlockState::ActiveAllocated,
                },
                BlockInfo {
                    address: 0x7f00_0000_0200,
                    size: 512,
                    requested_size: 512,
                    state: BlockState::ActivePendingFree,
                },
                BlockInfo {
                    address: 0x7f00_0000_0400,
                    size: (2 << 20) - 1024,
                    requested_size: 0,
                    state: BlockState::Inactive,
                },
            ],
        };
        let large = SegmentInfo {
            device: 1,
            address: 0x7f00_1000_0000,
            total_size: 4 << 20,
            stream: StreamId(0x55),
            is_small: false,
            is_expandable: true,
            pool_id: cachalot_core::private_pool::PoolId::DEFAULT,
            blocks: vec![BlockInfo {
                address: 0x7f00_1000_0000,
                size: 4 << 20,
                requested_size: 0,
                state: BlockState::Inactive,
            }],
        };
        let ev = |time_us, action, addr, size| TraceEvent {
            time_us,
            action,
            addr,
            size,
            stream: StreamId(0),
        };
        let frame = Frame {
            name: "train_step".into(),
            filename: "src/main.rs".into(),
            line: 12,
        };
        SnapshotDump {
            device: 1,
            snapshot: MemorySnapshot {
                segments: vec![small, large],
            },
            block_frames: BTreeMap::from([(0x7f00_0000_0000, vec![frame.clone()])]),
            trace: vec![
                TraceRecord {
                    event: ev(10, Action::SegmentAlloc, 0x7f00_0000_0000, 2 << 20),
                    frames: vec![],
                },
                TraceRecord {
                    event: ev(11, Action::Alloc, 0x7f00_0000_0000, 500),
                    frames: vec![frame],
                },
                TraceRecord {
                    event: ev(12, Action::Oom, 1 << 20, 1 << 40),
                    frames: vec![],
                },
            ],
            config: AllocatorConfig::parse("expandable_segments:True,max_split_size_mb:64")
                .expect("a valid config"),
        }
    }
}
