//! Readers for recorded PyTorch workloads.
//!
//! Three formats, each plain or gzip-compressed (detected by the gzip magic bytes,
//! never by the file name):
//!
//! * the **trace CSV** (`time_us,action,addr,size,stream`), read as a stream of
//!   [`TraceEvent`]s by [`csv::CsvReader`];
//! * the **snapshot pickle** that `torch.cuda.memory._dump_snapshot` writes
//!   (`segments`, `device_traces`, `allocator_settings`), read whole by
//!   [`pickle::read_snapshot`] after a guard pass ([`guard`]) has bounded its depth
//!   and expanded size;
//! * the **stats JSON** of a recorded run (`conf`, `total_memory`, the final
//!   `memory_stats`, `checkpoints`), read by [`stats::read_stats`].
//!
//! Bad input (corrupt, truncated or hostile) is a [`TraceError`] naming the line,
//! byte offset or field where reading stopped; no reader panics, and every reader
//! works in memory bounded by [`ReadLimits`].

pub mod csv;
pub mod guard;
pub mod pickle;
pub mod stats;

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use flate2::bufread::MultiGzDecoder;
use thiserror::Error;

use crate::event::TraceEvent;
use crate::snapshot::SegmentInfo;

/// The first two bytes of every gzip stream.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The pickle `PROTO` opcode, the first byte of every protocol 2+ pickle.
const PICKLE_PROTO: u8 = 0x80;

/// Why a recording could not be read. Remedy in every case: fix or replace the
/// file; the message says where it went wrong.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be read (missing, unreadable, corrupt gzip stream).
    #[error("cannot read {what}: {source}")]
    Io {
        /// What was being read.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The (decompressed) input is larger than [`ReadLimits`] allows.
    #[error("input exceeds the {limit}-byte limit on {what}")]
    TooLarge {
        /// Which limit.
        what: &'static str,
        /// The limit.
        limit: u64,
    },
    /// A line of a trace CSV is malformed.
    #[error("trace CSV line {line}: {reason}")]
    Csv {
        /// The 1-based line number.
        line: u64,
        /// What is wrong.
        reason: String,
    },
    /// A pickle stream is malformed, unsupported or hostile.
    #[error("pickle at byte {offset}: {reason}")]
    Pickle {
        /// Byte offset into the decompressed pickle.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
    /// A JSON document (a cachalot JSON snapshot, or a stats file), which is
    /// none of the formats read here.
    #[error("a JSON document, not a trace CSV or snapshot pickle")]
    Json,
    /// A snapshot with events on several devices, read without choosing one,
    /// or a device chosen that has none. Remedy: choose one of `devices`.
    #[error(
        "{reason}; the devices with events are {}: choose one with --snapshot-device",
        list(devices)
    )]
    Device {
        /// What is wrong.
        reason: String,
        /// The devices that have events.
        devices: Vec<usize>,
    },
    /// A well-formed file whose content does not have the expected shape.
    #[error("{path}: {reason}")]
    Schema {
        /// Where in the document (`device_traces[0][12].size`).
        path: String,
        /// What is wrong.
        reason: String,
    },
}

/// `0, 1 and 3`, or `none`.
fn list(devices: &[usize]) -> String {
    match devices {
        [] => "none".to_string(),
        [one] => one.to_string(),
        [rest @ .., last] => {
            let rest: Vec<String> = rest.iter().map(usize::to_string).collect();
            format!("{} and {last}", rest.join(", "))
        }
    }
}

impl TraceError {
    pub(crate) fn schema(path: impl Into<String>, reason: impl Into<String>) -> TraceError {
        TraceError::Schema {
            path: path.into(),
            reason: reason.into(),
        }
    }
}

/// Bounds on what a reader accepts, so hostile input cannot exhaust memory or stack.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// Most bytes read after decompression. Default: 2 GiB.
    pub max_input_bytes: u64,
    /// Longest CSV line in bytes. Default: 4 KiB.
    pub max_line_bytes: usize,
    /// Deepest nesting of pickle containers. Default: 64 (real snapshots nest 7 deep).
    pub max_depth: u32,
    /// Most values a pickle may expand to once shared references are copied out.
    /// Default: 64 million.
    pub max_values: u64,
    /// Which device's events to read from a snapshot pickle. Default (`None`):
    /// the one device with events; a snapshot with events on several is refused.
    pub device: Option<usize>,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            max_input_bytes: 2 << 30,
            max_line_bytes: 4096,
            max_depth: 64,
            max_values: 64 << 20,
            device: None,
        }
    }
}

/// The format of a recording, as detected from its first bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum TraceFormat {
    /// A trace CSV.
    Csv,
    /// A snapshot pickle.
    Pickle,
    /// A JSON document (not read here: see [`TraceError::Json`]).
    Json,
}

/// A reader over the decompressed bytes of a file, that fails with
/// [`TraceError::TooLarge`] (wrapped in an `io::Error`) past its limit rather than
/// stopping silently.
#[derive(Debug)]
pub struct LimitedReader<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> LimitedReader<R> {
    /// Wraps `inner`, allowing `limit` bytes.
    pub fn new(inner: R, limit: u64) -> LimitedReader<R> {
        LimitedReader {
            inner,
            left: limit,
            limit,
        }
    }
}

/// The payload of the `io::Error` a [`LimitedReader`] returns past its limit.
#[derive(Debug, Error)]
#[error("input exceeds the {0}-byte limit")]
struct OverLimit(u64);

impl<R: Read> Read for LimitedReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // Ask for one byte more than allowed, so reaching the limit exactly is fine
        // but going past it is an error.
        let want = buf
            .len()
            .min(usize::try_from(self.left.saturating_add(1)).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n as u64 > self.left {
            return Err(io::Error::other(OverLimit(self.limit)));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// Converts an I/O error into a [`TraceError`], recognising the limit error.
pub(crate) fn io_error(what: &str, e: io::Error) -> TraceError {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<OverLimit>())
    {
        Some(OverLimit(limit)) => TraceError::TooLarge {
            what: "decompressed input",
            limit: *limit,
        },
        None => TraceError::Io {
            what: what.to_string(),
            source: e,
        },
    }
}

/// Decompresses `input` if it starts with the gzip magic, and bounds it by
/// `limits.max_input_bytes`.
///
/// # Errors
/// [`TraceError::Io`] when the first bytes cannot be read.
pub fn decompressed<'a, R: BufRead + 'a>(
    mut input: R,
    limits: &ReadLimits,
) -> Result<Box<dyn BufRead + 'a>, TraceError> {
    let head = input.fill_buf().map_err(|e| io_error("input", e))?;
    let inner: Box<dyn Read + 'a> = if head.starts_with(&GZIP_MAGIC) {
        Box::new(MultiGzDecoder::new(input))
    } else {
        Box::new(input)
    };
    Ok(Box::new(BufReader::with_capacity(
        1 << 16,
        LimitedReader::new(inner, limits.max_input_bytes),
    )))
}

/// Detects the format of decompressed input from its first bytes, without
/// consuming them: the pickle `PROTO` opcode, a JSON object or array (after
/// whitespace), else CSV.
///
/// # Errors
/// [`TraceError::Io`] when the input cannot be read.
pub fn detect(input: &mut dyn BufRead) -> Result<TraceFormat, TraceError> {
    let head = input.fill_buf().map_err(|e| io_error("input", e))?;
    let first_text = head.iter().find(|b| !b.is_ascii_whitespace());
    Ok(if head.first() == Some(&PICKLE_PROTO) {
        TraceFormat::Pickle
    } else if matches!(first_text, Some(b'{' | b'[')) {
        TraceFormat::Json
    } else {
        TraceFormat::Csv
    })
}

/// A recording ready to replay: one device's events, with what is known of the
/// device and configuration it was recorded with.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recording {
    /// The events in recorded order.
    pub events: Vec<TraceEvent>,
    /// For snapshots: the segments when the snapshot was taken (after the events).
    pub segments: Vec<SegmentInfo>,
    /// The allocator configuration string in force, when the file records it.
    pub conf: Option<String>,
    /// Where the events are in the file they were read from.
    pub origin: Origin,
}

/// Where a recording's events are in the file they were read from, to name an
/// event in an error as the file does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Origin {
    /// Not read from a file (or from one with no other way to name an event
    /// than its index).
    #[default]
    Unknown,
    /// A trace CSV: event `i` is on line `i + 2` (the header is line 1), plus
    /// one for each blank line before it.
    Csv {
        /// The blank lines skipped, 1-based, in increasing order.
        blank_lines: Vec<u64>,
    },
    /// A snapshot pickle: event `i` is `device_traces[device][i]`.
    Snapshot {
        /// The device whose events were read.
        device: usize,
    },
}

impl Recording {
    /// An error about event `event` that names its place in the file: the line
    /// of a trace CSV, the entry of a snapshot.
    pub fn event_error(&self, event: usize, reason: impl fmt::Display) -> TraceError {
        let reason = reason.to_string();
        match &self.origin {
            Origin::Csv { blank_lines } => {
                let mut line = event as u64 + 2;
                for blank in blank_lines {
                    if *blank <= line {
                        line += 1;
                    }
                }
                TraceError::Csv { line, reason }
            }
            Origin::Snapshot { device } => {
                TraceError::schema(format!("device_traces[{device}][{event}]"), reason)
            }
            Origin::Unknown => TraceError::schema(format!("event {event}"), reason),
        }
    }
}

/// Reads a trace CSV or snapshot pickle (plain or gzip) from `input`.
///
/// # Errors
/// Any [`TraceError`] of the format found.
pub fn read_recording<R: BufRead>(input: R, limits: &ReadLimits) -> Result<Recording, TraceError> {
    let mut input = decompressed(input, limits)?;
    match detect(&mut input)? {
        TraceFormat::Csv => {
            let mut reader = csv::CsvReader::new(input, limits);
            let events = reader.by_ref().collect::<Result<Vec<_>, _>>()?;
            Ok(Recording {
                events,
                segments: Vec::new(),
                conf: None,
                origin: Origin::Csv {
                    blank_lines: reader.into_blank_lines(),
                },
            })
        }
        TraceFormat::Pickle => {
            let snapshot = pickle::read_snapshot(input, limits)?;
            snapshot.into_recording(limits.device)
        }
        TraceFormat::Json => Err(TraceError::Json),
    }
}

/// Reads a recording from a file (see [`read_recording`]).
///
/// # Errors
/// [`TraceError::Io`] when the file cannot be opened; otherwise as [`read_recording`].
pub fn read_recording_path(path: &Path, limits: &ReadLimits) -> Result<Recording, TraceError> {
    let file = File::open(path).map_err(|e| io_error(&path.display().to_string(), e))?;
    read_recording(BufReader::new(file), limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use std::io::Write;

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(bytes).expect("in memory");
        enc.finish().expect("in memory")
    }

    #[test]
    fn gzip_is_detected_by_magic_bytes() {
        let text = b"time_us,action,addr,size,stream\n1,alloc,4096,512,0\n";
        for bytes in [text.to_vec(), gzip(text)] {
            let rec = read_recording(&bytes[..], &ReadLimits::default()).unwrap();
            assert_eq!(rec.events.len(), 1);
            assert_eq!(rec.events[0].size, 512);
        }
    }

    #[test]
    fn decompressed_size_is_capped() {
        let text = format!(
            "time_us,action,addr,size,stream\n{}",
            "1,alloc,4096,512,0\n".repeat(1000)
        );
        let limits = ReadLimits {
            max_input_bytes: 1000,
            ..ReadLimits::default()
        };
        let err = read_recording(&gzip(text.as_bytes())[..], &limits).unwrap_err();
        assert!(
            matches!(err, TraceError::TooLarge { limit: 1000, .. }),
            "{err}"
        );
        let exact = ReadLimits {
            max_input_bytes: text.len() as u64,
            ..ReadLimits::default()
        };
        assert_eq!(
            read_recording(text.as_bytes(), &exact)
                .unwrap()
                .events
                .len(),
            1000
        );
    }

    #[test]
    fn json_is_told_apart_from_csv() {
        for text in ["{\"format\": 1}", "\n  [1, 2]"] {
            for bytes in [text.as_bytes().to_vec(), gzip(text.as_bytes())] {
                let err = read_recording(&bytes[..], &ReadLimits::default()).unwrap_err();
                assert!(matches!(err, TraceError::Json), "{err}");
            }
        }
    }

    #[test]
    fn event_errors_name_the_csv_line_as_written() {
        let text = "time_us,action,addr,size,stream\n1,alloc,4096,512,0\n\n \n2,free_completed,4096,512,0\n\n3,alloc,4096,512,0\n";
        let rec = read_recording(text.as_bytes(), &ReadLimits::default()).unwrap();
        assert_eq!(rec.events.len(), 3);
        let line = |event| match rec.event_error(event, "bad") {
            TraceError::Csv { line, .. } => line,
            other => panic!("expected a CSV error, got {other}"),
        };
        assert_eq!([line(0), line(1), line(2)], [2, 5, 7]);
        let err = Recording::default().event_error(3, "bad").to_string();
        assert_eq!(err, "event 3: bad");
    }

    #[test]
    fn truncated_gzip_is_an_error() {
        let text = "time_us,action,addr,size,stream\n1,alloc,4096,512,0\n".repeat(50);
        let z = gzip(text.as_bytes());
        let err = read_recording(&z[..z.len() / 2], &ReadLimits::default()).unwrap_err();
        assert!(
            matches!(err, TraceError::Io { .. } | TraceError::Csv { .. }),
            "{err}"
        );
    }
}
