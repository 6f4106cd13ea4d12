//! The PyTorch trace CSV: a header `time_us,action,addr,size,stream`, then one
//! event per line. Read as a stream, one line at a time, in bounded memory.

use std::io::{BufRead, Read};
use std::num::{IntErrorKind, ParseIntError};

use super::{io_error, ReadLimits, TraceError};
use cachalot_core::backend::StreamId;
use cachalot_core::error::{is_too_large, MAX_REQUEST};
use cachalot_core::event::{Action, TraceEvent};

/// The header every trace CSV starts with.
pub const HEADER: &str = "time_us,action,addr,size,stream";

/// An iterator over the events of a trace CSV. It yields an error for the first bad
/// line (or a missing header) and then stops.
#[derive(Debug)]
pub struct CsvReader<R> {
    input: R,
    line: u64,
    buf: Vec<u8>,
    max_line: usize,
    done: bool,
    /// Events read so far.
    events: u64,
    /// The line of the last event read.
    last_event_line: u64,
    /// Where an event is not on the line after the one before it (blank
    /// lines between): `(event index, line)`.
    jumps: Vec<(u64, u64)>,
}

impl<R: BufRead> CsvReader<R> {
    /// Reads from already decompressed input (see [`super::decompressed`]).
    pub fn new(input: R, limits: &ReadLimits) -> CsvReader<R> {
        CsvReader {
            input,
            line: 0,
            buf: Vec::with_capacity(128),
            max_line: limits.max_line_bytes,
            done: false,
            events: 0,
            last_event_line: 1,
            jumps: Vec::new(),
        }
    }

    /// Where events are not on the line after the one before them: `(event
    /// index, line)`, in increasing order, which tell an event's line from its
    /// index (see [`super::Origin::Csv`]). One entry per run of blank lines
    /// before an event, at most.
    pub fn into_line_jumps(self) -> Vec<(u64, u64)> {
        self.jumps
    }

    /// The number of lines read so far (the header included).
    pub fn line(&self) -> u64 {
        self.line
    }

    /// Reads the next line into `self.buf` without its terminator; `false` at the end.
    fn next_line(&mut self) -> Result<bool, TraceError> {
        self.buf.clear();
        let cap = self.max_line as u64 + 1;
        let n = (&mut self.input)
            .take(cap)
            .read_until(b'\n', &mut self.buf)
            .map_err(|e| match io_error("", e) {
                TraceError::Io { source, .. } => self.error(format!("read failed: {source}")),
                other => other,
            })?;
        if n == 0 {
            return Ok(false);
        }
        self.line += 1;
        if self.buf.last() == Some(&b'\n') {
            self.buf.pop();
        } else if n as u64 == cap {
            return Err(self.error(format!("longer than {} bytes", self.max_line)));
        }
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        Ok(true)
    }

    fn error(&self, reason: String) -> TraceError {
        TraceError::Csv {
            line: self.line.max(1),
            reason,
        }
    }

    fn read_header(&mut self) -> Result<(), TraceError> {
        if !self.next_line()? {
            return Err(self.error("empty file: expected the header".into()));
        }
        let text = self.buf.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&self.buf);
        if text != HEADER.as_bytes() {
            return Err(self.error(format!("expected the header '{HEADER}'")));
        }
        Ok(())
    }

    fn next_event(&mut self) -> Result<Option<TraceEvent>, TraceError> {
        if self.line == 0 {
            self.read_header()?;
        }
        loop {
            if !self.next_line()? {
                return Ok(None);
            }
            if self.buf.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let event = parse_line(&self.buf).map_err(|reason| self.error(reason))?;
            if self.line != self.last_event_line + 1 {
                self.jumps.push((self.events, self.line));
            }
            self.last_event_line = self.line;
            self.events += 1;
            return Ok(Some(event));
        }
    }
}

impl<R: BufRead> Iterator for CsvReader<R> {
    type Item = Result<TraceEvent, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        let item = self.next_event().transpose();
        if !matches!(item, Some(Ok(_))) {
            self.done = true;
        }
        item
    }
}

/// Parses one data line.
fn parse_line(line: &[u8]) -> Result<TraceEvent, String> {
    let text = std::str::from_utf8(line).map_err(|_| "not UTF-8".to_string())?;
    let mut fields = text.split(',');
    let mut field = |name: &str| {
        fields
            .next()
            .ok_or_else(|| format!("missing field '{name}'"))
    };
    let time_us = number(field("time_us")?, "time_us")?;
    let action_text = field("action")?;
    let action: Action = action_text.trim().parse()?;
    let addr = number(field("addr")?, "addr")?;
    let size = request_size(field("size")?)?;
    let stream = number(field("stream")?, "stream")?;
    if fields.next().is_some() {
        return Err("more than 5 fields".into());
    }
    Ok(TraceEvent {
        time_us,
        action,
        addr,
        size,
        stream: StreamId(stream),
    })
}

/// The `size` field: a request PyTorch would take (not [`is_too_large`]).
fn request_size(text: &str) -> Result<u64, String> {
    let size = number(text, "size")?;
    if is_too_large(size) {
        return Err(format!(
            "field 'size': {size} is too large (a request must be under {MAX_REQUEST})"
        ));
    }
    Ok(size)
}

/// A field's value: a non-negative integer that fits 64 bits.
fn number(text: &str, name: &str) -> Result<u64, String> {
    text.trim().parse().map_err(|e: ParseIntError| {
        if *e.kind() == IntErrorKind::PosOverflow {
            format!(
                "field '{name}': {} is too large (at most {})",
                text.trim(),
                u64::MAX
            )
        } else {
            format!("field '{name}': '{text}' is not a non-negative integer")
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<Vec<TraceEvent>, TraceError> {
        CsvReader::new(text.as_bytes(), &ReadLimits::default()).collect()
    }

    fn line_of(err: TraceError) -> u64 {
        match err {
            TraceError::Csv { line, .. } => line,
            other => panic!("expected a CSV error, got {other}"),
        }
    }

    #[test]
    fn reads_events_with_big_addresses() {
        let text = "time_us,action,addr,size,stream\r\n7,segment_alloc,18446744073709551615,2097152,94\r\n\n";
        let events = read(text).unwrap();
        assert_eq!(events.len(), 1);
        let e = events[0];
        assert_eq!(
            (e.time_us, e.action, e.addr, e.size, e.stream),
            (7, Action::SegmentAlloc, u64::MAX, 2 << 20, StreamId(94))
        );
    }

    #[test]
    fn bad_lines_name_their_line() {
        let head = "time_us,action,addr,size,stream\n1,alloc,1,1,0\n";
        assert_eq!(
            line_of(read(&format!("{head}2,explode,1,1,0\n")).unwrap_err()),
            3
        );
        assert_eq!(
            line_of(read(&format!("{head}2,alloc,1,-5,0\n")).unwrap_err()),
            3
        );
        assert_eq!(
            line_of(read(&format!("{head}2,alloc,1,1\n")).unwrap_err()),
            3
        );
        assert_eq!(
            line_of(read(&format!("{head}2,alloc,1,1,0,9\n")).unwrap_err()),
            3
        );
        assert_eq!(
            line_of(read(&format!("{head}2,alloc,1,{},0\n", u64::MAX)).unwrap_err()),
            3
        );
        assert_eq!(
            line_of(read(&format!("{head}2,alloc,1,99999999999999999999999,0\n")).unwrap_err()),
            3
        );
        assert_eq!(line_of(read("time,action\n").unwrap_err()), 1);
        assert_eq!(line_of(read("").unwrap_err()), 1);
    }

    #[test]
    fn values_too_large_say_so_with_the_limit() {
        let head = "time_us,action,addr,size,stream\n";
        let reason = |line: &str| match read(&format!("{head}{line}\n")).unwrap_err() {
            TraceError::Csv { reason, .. } => reason,
            other => panic!("expected a CSV error, got {other}"),
        };
        assert_eq!(
            reason("1,alloc,1,100000000000000000000,0"),
            "field 'size': 100000000000000000000 is too large (at most 18446744073709551615)"
        );
        for size in [MAX_REQUEST, MAX_REQUEST + 1] {
            assert_eq!(
                reason(&format!("1,alloc,1,{size},0")),
                format!(
                    "field 'size': {size} is too large (a request must be under 1152921504606846976)"
                )
            );
        }
        let largest = read(&format!("{head}1,alloc,1,{},0\n", MAX_REQUEST - 1)).unwrap();
        assert_eq!(largest[0].size, MAX_REQUEST - 1);
        assert_eq!(
            reason("1,alloc,18446744073709551616,1,0"),
            "field 'addr': 18446744073709551616 is too large (at most 18446744073709551615)"
        );
        assert!(reason("1,alloc,1,-5,0").contains("not a non-negative integer"));
    }

    #[test]
    fn overlong_lines_are_refused_without_reading_them_whole() {
        let text = format!("time_us,action,addr,size,stream\n{}\n", "9".repeat(1 << 20));
        let limits = ReadLimits {
            max_line_bytes: 64,
            ..ReadLimits::default()
        };
        let err = CsvReader::new(text.as_bytes(), &limits)
            .collect::<Result<Vec<_>, _>>()
            .unwrap_err();
        assert_eq!(line_of(err), 2);
    }

    #[test]
    fn iteration_stops_after_the_first_error() {
        let text = "time_us,action,addr,size,stream\nx\n1,alloc,1,1,0\n";
        let mut reader = CsvReader::new(text.as_bytes(), &ReadLimits::default());
        assert!(reader.next().unwrap().is_err());
        assert!(reader.next().is_none());
    }
}
