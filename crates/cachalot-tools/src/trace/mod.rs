//! Readers for recorded PyTorch workloads.
//!
//! Three formats, each plain or gzip-compressed (detected by the gzip magic bytes,
//! never by the file name):
//!
//! * the **trace CSV** (`time_us,action,addr,size,stream`), read as a stream of
//!   [`TraceEvent`]s by [`csv::CsvReader`];
//! * the **snapshot pickle** that `torch.cuda.memory._dump_snapshot` writes
//!   (`segments`, `device_traces`, `allocator_settings`), streamed by
//!   `unpickle` in two passes that keep only the events and segments, and
//!   walked by [`pickle`];
//! * the **stats JSON** of a recorded run (`conf`, `total_memory`, the final
//!   `memory_stats`, `checkpoints`), read by [`stats::read_stats`].
//!
//! Bad input (corrupt, truncated or hostile) is a [`TraceError`] naming the line,
//! byte offset or field where reading stopped; no reader panics, and every reader
//! works in memory bounded by what it keeps (the events, a snapshot's segments)
//! and by [`ReadLimits`]. A gzip stream that expands far more than recordings
//! do (a decompression bomb) is refused as it expands.

pub mod csv;
pub mod pickle;
pub mod stats;
pub mod synth;
mod unpickle;

use std::cell::Cell;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;
use std::rc::Rc;

use flate2::bufread::MultiGzDecoder;
use thiserror::Error;

use cachalot_core::event::TraceEvent;
use cachalot_core::snapshot::SegmentInfo;

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
    /// A gzip stream that expands far more than any recording does.
    #[error(
        "a gzip stream that expands more than {ratio} times (past its first {} MiB): \
         not a recording, or a decompression bomb",
        RATIO_GRACE >> 20
    )]
    Expands {
        /// The most decompressed bytes per compressed byte allowed.
        ratio: u64,
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
    /// The stats file beside a recording does not read.
    #[error("the stats file beside it, {path}: {source}")]
    StatsFile {
        /// The stats file.
        path: String,
        /// Why it does not read.
        source: Box<TraceError>,
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

/// Decompressed bytes read before [`ReadLimits::max_ratio`] applies.
pub const RATIO_GRACE: u64 = 64 << 20;

/// Bounds on what a reader accepts, so hostile input cannot exhaust memory or
/// stack. None of them stops a recording PyTorch writes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ReadLimits {
    /// Most bytes read after decompression. Default: 1 TiB.
    pub max_input_bytes: u64,
    /// Most decompressed bytes per compressed byte of a gzip stream, past its
    /// first [`RATIO_GRACE`] bytes. Default: 256 (recordings expand 8 to 20
    /// times; a decompression bomb, a thousand).
    pub max_ratio: u64,
    /// Longest CSV line in bytes. Default: 4 KiB.
    pub max_line_bytes: usize,
    /// Deepest nesting of pickle containers. Default: 64 (real snapshots nest 7 deep).
    pub max_depth: u32,
    /// Most values a pickle keeps besides its trace entries (which become
    /// events) and call stacks (which are dropped): a snapshot's segments and
    /// blocks, about six values each. Default: 64 million.
    pub max_values: u64,
    /// Which device's events to read from a snapshot pickle. Default (`None`):
    /// the one device with events; a snapshot with events on several is refused.
    pub device: Option<usize>,
}

impl Default for ReadLimits {
    fn default() -> Self {
        ReadLimits {
            max_input_bytes: 1 << 40,
            max_ratio: 256,
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
/// stopping silently, and with [`TraceError::Expands`] when it has read more
/// than `ratio` times the compressed bytes consumed (past [`RATIO_GRACE`]).
#[derive(Debug)]
pub struct LimitedReader<R> {
    inner: R,
    left: u64,
    limit: u64,
    /// For a gzip stream: the compressed bytes consumed so far, and the ratio.
    compressed: Option<(Rc<Cell<u64>>, u64)>,
}

impl<R: Read> LimitedReader<R> {
    /// Wraps `inner`, allowing `limit` bytes.
    pub fn new(inner: R, limit: u64) -> LimitedReader<R> {
        LimitedReader {
            inner,
            left: limit,
            limit,
            compressed: None,
        }
    }

    fn over_ratio(&self) -> Option<u64> {
        let (consumed, ratio) = self.compressed.as_ref()?;
        let read = self.limit - self.left;
        (read > RATIO_GRACE && read / consumed.get().max(1) > *ratio).then_some(*ratio)
    }
}

/// The payload of the `io::Error` a [`LimitedReader`] returns past its limit.
#[derive(Debug, Error)]
#[error("input exceeds the {0}-byte limit")]
struct OverLimit(u64);

/// The payload of the `io::Error` a [`LimitedReader`] returns past its ratio.
#[derive(Debug, Error)]
#[error("input expands more than {0} times")]
struct OverRatio(u64);

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
        if let Some(ratio) = self.over_ratio() {
            return Err(io::Error::other(OverRatio(ratio)));
        }
        Ok(n)
    }
}

/// A reader that counts the bytes consumed from it.
struct Counted<R> {
    inner: R,
    consumed: Rc<Cell<u64>>,
}

impl<R: BufRead> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.consumed.set(self.consumed.get() + n as u64);
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Counted<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        self.inner.fill_buf()
    }

    fn consume(&mut self, amt: usize) {
        self.consumed.set(self.consumed.get() + amt as u64);
        self.inner.consume(amt);
    }
}

/// Converts an I/O error into a [`TraceError`], recognising the limit error.
pub(crate) fn io_error(what: &str, e: io::Error) -> TraceError {
    let inner = e.get_ref();
    if let Some(OverLimit(limit)) = inner.and_then(|i| i.downcast_ref::<OverLimit>()) {
        return TraceError::TooLarge {
            what: "decompressed input",
            limit: *limit,
        };
    }
    if let Some(OverRatio(ratio)) = inner.and_then(|i| i.downcast_ref::<OverRatio>()) {
        return TraceError::Expands { ratio: *ratio };
    }
    TraceError::Io {
        what: what.to_string(),
        source: e,
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
    if !head.starts_with(&GZIP_MAGIC) {
        let plain = LimitedReader::new(input, limits.max_input_bytes);
        return Ok(Box::new(BufReader::with_capacity(1 << 16, plain)));
    }
    let consumed = Rc::new(Cell::new(0));
    let counted = Counted {
        inner: input,
        consumed: Rc::clone(&consumed),
    };
    let mut limited = LimitedReader::new(MultiGzDecoder::new(counted), limits.max_input_bytes);
    limited.compressed = Some((consumed, limits.max_ratio));
    Ok(Box::new(BufReader::with_capacity(1 << 16, limited)))
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
    /// the blank lines before it.
    Csv {
        /// Where an event is not on the line after the one before it: `(event
        /// index, line)`, in increasing order (see
        /// [`csv::CsvReader::into_line_jumps`]).
        line_jumps: Vec<(u64, u64)>,
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
            Origin::Csv { line_jumps } => {
                let event = event as u64;
                let at = line_jumps.partition_point(|(i, _)| *i <= event);
                let line = match at.checked_sub(1).map(|k| line_jumps[k]) {
                    Some((i, line)) => line + (event - i),
                    None => event + 2,
                };
                TraceError::Csv { line, reason }
            }
            Origin::Snapshot { device } => {
                TraceError::schema(format!("device_traces[{device}][{event}]"), reason)
            }
            Origin::Unknown => TraceError::schema(format!("event {event}"), reason),
        }
    }
}

/// Reads a trace CSV or snapshot pickle (plain or gzip) from `input`. A
/// snapshot pickle is held in memory decompressed (bounded by
/// [`ReadLimits::max_input_bytes`]) and read in two passes;
/// [`read_recording_path`] streams it from the file instead.
///
/// # Errors
/// Any [`TraceError`] of the format found.
pub fn read_recording<R: BufRead>(input: R, limits: &ReadLimits) -> Result<Recording, TraceError> {
    let mut input = decompressed(input, limits)?;
    match detect(&mut input)? {
        TraceFormat::Pickle => {
            let mut bytes = Vec::new();
            input
                .read_to_end(&mut bytes)
                .map_err(|e| match io_error("snapshot pickle", e) {
                    TraceError::Io { source, .. } => TraceError::Pickle {
                        offset: bytes.len() as u64,
                        reason: format!("read failed: {source}"),
                    },
                    other => other,
                })?;
            pickle::read_snapshot(&&bytes[..], limits)?.into_recording(limits.device)
        }
        format => read_other(input, format, limits),
    }
}

/// Reads a trace CSV (or refuses JSON).
fn read_other(
    input: Box<dyn BufRead + '_>,
    format: TraceFormat,
    limits: &ReadLimits,
) -> Result<Recording, TraceError> {
    match format {
        TraceFormat::Csv => {
            let mut reader = csv::CsvReader::new(input, limits);
            let events = reader.by_ref().collect::<Result<Vec<_>, _>>()?;
            Ok(Recording {
                events,
                segments: Vec::new(),
                conf: None,
                origin: Origin::Csv {
                    line_jumps: reader.into_line_jumps(),
                },
            })
        }
        TraceFormat::Json | TraceFormat::Pickle => Err(TraceError::Json),
    }
}

/// A file, decompressed, read from its start at each [`unpickle::Source::open`],
/// telling `progress` the bytes read from the file so far (over every pass).
struct FileSource<'a> {
    path: &'a Path,
    limits: &'a ReadLimits,
    read: Rc<Cell<u64>>,
    progress: &'a dyn Fn(u64),
}

impl unpickle::Source for FileSource<'_> {
    fn open(&self) -> Result<Box<dyn BufRead + '_>, TraceError> {
        let file =
            File::open(self.path).map_err(|e| io_error(&self.path.display().to_string(), e))?;
        let watched = Watched {
            inner: file,
            read: Rc::clone(&self.read),
            progress: self.progress,
        };
        decompressed(BufReader::new(watched), self.limits)
    }
}

/// A reader that tells `progress` the bytes read so far.
struct Watched<'a, R> {
    inner: R,
    read: Rc<Cell<u64>>,
    progress: &'a dyn Fn(u64),
}

impl<R: Read> Read for Watched<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        (self.progress)(self.read.get());
        Ok(n)
    }
}

/// Reads a recording from a file (see [`read_recording`]); a snapshot pickle
/// streams from the file, twice, in memory bounded by the events and
/// segments it holds.
///
/// # Errors
/// [`TraceError::Io`] when the file cannot be opened; otherwise as [`read_recording`].
pub fn read_recording_path(path: &Path, limits: &ReadLimits) -> Result<Recording, TraceError> {
    read_recording_path_with(path, limits, &|_| {})
}

/// [`read_recording_path`], telling `progress` how many bytes of the file
/// it has read so far, counted over every pass (a snapshot pickle is read
/// twice), as it goes.
///
/// # Errors
/// As [`read_recording_path`].
pub fn read_recording_path_with(
    path: &Path,
    limits: &ReadLimits,
    progress: &dyn Fn(u64),
) -> Result<Recording, TraceError> {
    let source = FileSource {
        path,
        limits,
        read: Rc::new(Cell::new(0)),
        progress,
    };
    let mut input = unpickle::Source::open(&source)?;
    match detect(&mut input)? {
        TraceFormat::Pickle => {
            drop(input);
            pickle::read_snapshot(&source, limits)?.into_recording(limits.device)
        }
        format => read_other(input, format, limits),
    }
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

    /// Writes `n` copies of `chunk` through a gzip encoder without holding
    /// them: a small file that expands to `n * chunk.len()` bytes.
    fn gzip_of_repeats(head: &[u8], chunk: &[u8], n: usize) -> Vec<u8> {
        let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(head).expect("in memory");
        for _ in 0..n {
            enc.write_all(chunk).expect("in memory");
        }
        enc.finish().expect("in memory")
    }

    #[test]
    fn a_gzip_bomb_is_refused_as_it_expands() {
        // A header, then 256 MiB of newlines in a quarter of a megabyte.
        let header = b"time_us,action,addr,size,stream\n";
        let bomb = gzip_of_repeats(header, &b"\n".repeat(1 << 20), 256);
        assert!(bomb.len() < 1 << 20, "{}", bomb.len());
        let err = read_recording(&bomb[..], &ReadLimits::default()).unwrap_err();
        assert!(matches!(err, TraceError::Expands { ratio: 256 }), "{err}");
        // Zeros after a pickle's first bytes: refused at the first opcode.
        let bomb = gzip_of_repeats(&[0x80, 4], &[0u8; 1 << 20], 256);
        let err = read_recording(&bomb[..], &ReadLimits::default()).unwrap_err();
        assert!(
            matches!(
                err,
                TraceError::Pickle { offset: 2, .. } | TraceError::Expands { .. }
            ),
            "{err}"
        );
    }

    #[test]
    fn blank_lines_cost_nothing_to_remember() {
        let mut text = b"time_us,action,addr,size,stream\n".to_vec();
        text.extend(b"\n".repeat(10_000_000));
        text.extend(b"1,alloc,4096,512,0\n\n2,alloc,8192,512,0\n");
        let rec = read_recording(&text[..], &ReadLimits::default()).unwrap();
        let Origin::Csv { line_jumps } = &rec.origin else {
            panic!("a CSV")
        };
        assert_eq!(line_jumps.len(), 2, "one entry per run of blank lines");
        let line = |event| match rec.event_error(event, "bad") {
            TraceError::Csv { line, .. } => line,
            other => panic!("expected a CSV error, got {other}"),
        };
        assert_eq!([line(0), line(1)], [10_000_002, 10_000_004]);
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
