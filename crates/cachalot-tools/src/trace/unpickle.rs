//! A streaming reader of plain-data pickles, in memory bounded by what is kept.
//!
//! A memory snapshot of millions of events decodes, with a general pickle
//! library, to billions of values: every event a dict, every call stack a list
//! of dicts. This reader runs the pickle's stack machine itself, in two passes
//! over the same (decompressed) input:
//!
//! 1. [`fetched_memo_ids`] notes which memo entries the pickle ever fetches
//!    again (`BINGET`/`LONG_BINGET`). Python's pickler memoizes every string,
//!    list and dict; only the few it refers to again (dict keys, shared call
//!    frames) need keeping.
//! 2. [`decode`] builds the value, keeping only those memo entries, dropping
//!    every `frames` value as soon as it is set in its dict, and turning each
//!    trace entry (a dict with an `action`) into a [`TraceEvent`] as it is
//!    appended to its list. What stays in memory is the events and the
//!    snapshot's segments.
//!
//! Values are shared, never copied out, so a few bytes of references cannot
//! expand to billions of values. A container is sealed once it is placed in
//! another, and a sealed one cannot change: that rules out cycles, and makes
//! each container's nesting height final, so nesting past
//! [`ReadLimits::max_depth`] is refused where it happens. Only the opcodes
//! Python's pickler emits for plain data (dicts, lists, tuples, sets,
//! strings, bytes, numbers, booleans, `None`), protocols 2 to 5, are read;
//! anything else (globals, object construction, persistent ids) is refused.

use std::cell::{Cell, RefCell};
use std::io::BufRead;
use std::rc::Rc;

use super::{io_error, ReadLimits, TraceError};
use cachalot_core::backend::StreamId;
use cachalot_core::error::{is_too_large, MAX_REQUEST};
use cachalot_core::event::{Action, TraceEvent};

mod op {
    pub(super) const PROTO: u8 = 0x80;
    pub(super) const FRAME: u8 = 0x95;
    pub(super) const STOP: u8 = b'.';
    pub(super) const MARK: u8 = b'(';
    pub(super) const POP: u8 = b'0';
    pub(super) const POP_MARK: u8 = b'1';
    pub(super) const MEMOIZE: u8 = 0x94;
    pub(super) const BINPUT: u8 = b'q';
    pub(super) const LONG_BINPUT: u8 = b'r';
    pub(super) const BINGET: u8 = b'h';
    pub(super) const LONG_BINGET: u8 = b'j';
    pub(super) const NONE: u8 = b'N';
    pub(super) const NEWTRUE: u8 = 0x88;
    pub(super) const NEWFALSE: u8 = 0x89;
    pub(super) const BININT: u8 = b'J';
    pub(super) const BININT1: u8 = b'K';
    pub(super) const BININT2: u8 = b'M';
    pub(super) const LONG1: u8 = 0x8a;
    pub(super) const LONG4: u8 = 0x8b;
    pub(super) const BINFLOAT: u8 = b'G';
    pub(super) const SHORT_BINUNICODE: u8 = 0x8c;
    pub(super) const BINUNICODE: u8 = b'X';
    pub(super) const BINUNICODE8: u8 = 0x8d;
    pub(super) const SHORT_BINBYTES: u8 = b'C';
    pub(super) const BINBYTES: u8 = b'B';
    pub(super) const BINBYTES8: u8 = 0x8e;
    pub(super) const EMPTY_TUPLE: u8 = b')';
    pub(super) const TUPLE1: u8 = 0x85;
    pub(super) const TUPLE2: u8 = 0x86;
    pub(super) const TUPLE3: u8 = 0x87;
    pub(super) const TUPLE: u8 = b't';
    pub(super) const EMPTY_LIST: u8 = b']';
    pub(super) const LIST: u8 = b'l';
    pub(super) const APPEND: u8 = b'a';
    pub(super) const APPENDS: u8 = b'e';
    pub(super) const EMPTY_DICT: u8 = b'}';
    pub(super) const DICT: u8 = b'd';
    pub(super) const SETITEM: u8 = b's';
    pub(super) const SETITEMS: u8 = b'u';
    pub(super) const EMPTY_SET: u8 = 0x8f;
    pub(super) const ADDITEMS: u8 = 0x90;
    pub(super) const FROZENSET: u8 = 0x91;
}

/// Longest integer accepted, in bytes (`LONG1`/`LONG4`).
const MAX_INT_BYTES: u64 = 32;

/// Longest string or bytes value accepted.
const MAX_TEXT_BYTES: u64 = 64 << 20;

/// Most items on the machine's stack at once (a pickler batches appends by
/// a thousand).
const MAX_STACK: usize = 1 << 22;

/// A decoded value. Containers are shared, never copied.
#[derive(Clone, Debug)]
pub(crate) enum Value {
    None,
    Bool(bool),
    /// An integer in `i64`.
    Int(i64),
    /// An integer above `i64::MAX` that fits `u64` (addresses, stream handles).
    UInt(u64),
    /// An integer outside `i64::MIN..=u64::MAX`.
    BigInt,
    /// A float (its value is never read).
    Float,
    Str(Rc<str>),
    Bytes,
    /// A list, tuple or set.
    List(Rc<Container>),
    Dict(Rc<Container>),
}

impl Value {
    /// What kind of value this is, for errors.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) | Value::UInt(_) | Value::BigInt => "an integer",
            Value::Float => "a float",
            Value::Str(_) => "a string",
            Value::Bytes => "bytes",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
        }
    }

    fn container(&self) -> Option<&Rc<Container>> {
        match self {
            Value::List(c) | Value::Dict(c) => Some(c),
            _ => None,
        }
    }

    /// An integer of `bytes` bytes, little-endian two's complement.
    fn int(bytes: &[u8]) -> Value {
        if bytes.len() > 16 {
            let sign = if bytes.last().is_some_and(|b| b & 0x80 != 0) {
                0xff
            } else {
                0
            };
            if bytes[16..].iter().any(|b| *b != sign) {
                return Value::BigInt;
            }
        }
        let mut wide = [0u8; 16];
        let n = bytes.len().min(16);
        wide[..n].copy_from_slice(&bytes[..n]);
        if bytes.last().is_some_and(|b| b & 0x80 != 0) {
            wide[n..].fill(0xff);
        }
        Value::from_i128(i128::from_le_bytes(wide))
    }

    fn from_i128(n: i128) -> Value {
        if let Ok(small) = i64::try_from(n) {
            Value::Int(small)
        } else if let Ok(big) = u64::try_from(n) {
            Value::UInt(big)
        } else {
            Value::BigInt
        }
    }
}

/// A list, tuple, set or dict (a dict's items alternate keys and values), and
/// for a list of trace entries the events they were turned into.
#[derive(Debug, Default)]
pub(crate) struct Container {
    items: RefCell<Vec<Value>>,
    events: RefCell<Events>,
    /// Nesting height (1 for a container of scalars).
    height: Cell<u32>,
    /// Placed in another container: it can no longer change.
    sealed: Cell<bool>,
}

/// The trace entries appended to a list, as events.
#[derive(Debug, Default)]
pub(crate) struct Events {
    /// The entries replayed, in order.
    pub(crate) events: Vec<TraceEvent>,
    /// Entries read but not replayed (`annotate`).
    pub(crate) skipped: usize,
    /// The first entry that did not read: its index in the list, the field,
    /// and what is wrong.
    pub(crate) error: Option<(usize, String, String)>,
}

impl Container {
    fn new(items: Vec<Value>) -> Rc<Container> {
        Rc::new(Container {
            items: RefCell::new(items),
            height: Cell::new(1),
            ..Container::default()
        })
    }

    /// The items (for a dict, keys and values alternating).
    pub(crate) fn items(&self) -> std::cell::Ref<'_, Vec<Value>> {
        self.items.borrow()
    }

    /// The trace entries' events, taken out (the container keeps none).
    pub(crate) fn take_events(&self) -> Events {
        std::mem::take(&mut *self.events.borrow_mut())
    }

    /// The value of a dict's string key `key`.
    pub(crate) fn get(&self, key: &str) -> Option<Value> {
        let items = self.items.borrow();
        items
            .chunks_exact(2)
            .find(|kv| matches!(&kv[0], Value::Str(k) if &**k == key))
            .map(|kv| kv[1].clone())
    }
}

/// The decompressed input, read once per pass.
pub(crate) trait Source {
    /// The input from its first byte.
    fn open(&self) -> Result<Box<dyn BufRead + '_>, TraceError>;
}

impl Source for &[u8] {
    fn open(&self) -> Result<Box<dyn BufRead + '_>, TraceError> {
        Ok(Box::new(*self))
    }
}

/// A reader of opcodes and their arguments, counting its offset. It keeps
/// its own window of the input, so reading an opcode is a slice access.
struct Reader<'r> {
    input: Box<dyn BufRead + 'r>,
    /// The window: `window[start..end]` is read and not yet consumed.
    window: Vec<u8>,
    start: usize,
    end: usize,
    pos: u64,
    /// Offset of the opcode being run, for errors.
    at: u64,
    buf: Vec<u8>,
}

/// Bytes read from the input at a time.
const WINDOW: usize = 1 << 18;

/// An opcode's argument.
enum Arg {
    None,
    /// A memo id, protocol number or frame length.
    Id(u64),
    Int(Value),
    Float,
    /// String or bytes; the bytes are in the reader's buffer.
    Text,
}

impl<'r> Reader<'r> {
    fn fail<T>(&self, reason: impl Into<String>) -> Result<T, TraceError> {
        Err(TraceError::Pickle {
            offset: self.at,
            reason: reason.into(),
        })
    }

    fn new(input: Box<dyn BufRead + 'r>) -> Reader<'r> {
        Reader {
            input,
            window: vec![0; WINDOW],
            start: 0,
            end: 0,
            pos: 0,
            at: 0,
            buf: Vec::new(),
        }
    }

    /// Refills the window; `false` at the end of the input.
    fn refill(&mut self) -> Result<bool, TraceError> {
        loop {
            match std::io::Read::read(&mut self.input, &mut self.window) {
                Ok(n) => {
                    self.start = 0;
                    self.end = n;
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(match io_error("snapshot pickle", e) {
                        TraceError::Io { source, .. } => TraceError::Pickle {
                            offset: self.pos,
                            reason: format!("read failed: {source}"),
                        },
                        other => other,
                    })
                }
            }
        }
    }

    /// Reads the next `n` bytes into `self.buf`.
    fn read_into_buf(&mut self, n: u64) -> Result<(), TraceError> {
        self.buf.clear();
        let mut left = n;
        while left > 0 {
            if self.start == self.end && !self.refill()? {
                let read = n - left;
                return self.fail(format!("truncated: needs {n} bytes, {read} left"));
            }
            let avail = self.end - self.start;
            let take = avail.min(usize::try_from(left).unwrap_or(usize::MAX));
            self.buf
                .extend_from_slice(&self.window[self.start..self.start + take]);
            self.start += take;
            self.pos += take as u64;
            left -= take as u64;
        }
        Ok(())
    }

    /// The next byte.
    #[inline]
    fn byte(&mut self) -> Result<u8, TraceError> {
        if self.start == self.end && !self.refill()? {
            return self.fail("truncated: needs 1 byte, 0 left");
        }
        let b = self.window[self.start];
        self.start += 1;
        self.pos += 1;
        Ok(b)
    }

    /// A little-endian unsigned integer of `width` bytes (at most 8).
    fn uint(&mut self, width: u64) -> Result<u64, TraceError> {
        let mut n = 0u64;
        for i in 0..width {
            n |= u64::from(self.byte()?) << (8 * i);
        }
        Ok(n)
    }

    /// The next opcode, or a truncation error at the end.
    fn opcode(&mut self) -> Result<u8, TraceError> {
        self.at = self.pos;
        self.byte()
    }

    /// The argument of `code`, read from the input.
    fn arg(&mut self, code: u8) -> Result<Arg, TraceError> {
        Ok(match code {
            op::PROTO | op::BINPUT | op::BINGET => Arg::Id(self.uint(1)?),
            op::LONG_BINPUT | op::LONG_BINGET => Arg::Id(self.uint(4)?),
            op::FRAME => Arg::Id(self.uint(8)?),
            op::BININT => Arg::Int(Value::Int(i64::from(self.uint(4)? as u32 as i32))),
            op::BININT1 => Arg::Int(Value::Int(self.uint(1)? as i64)),
            op::BININT2 => Arg::Int(Value::Int(self.uint(2)? as i64)),
            op::LONG1 | op::LONG4 => {
                let n = self.uint(if code == op::LONG1 { 1 } else { 4 })?;
                if n > MAX_INT_BYTES {
                    return self.fail(format!(
                        "integer of {n} bytes (at most {MAX_INT_BYTES} are read)"
                    ));
                }
                self.read_into_buf(n)?;
                Arg::Int(Value::int(&self.buf))
            }
            op::BINFLOAT => {
                self.read_into_buf(8)?;
                Arg::Float
            }
            op::SHORT_BINUNICODE | op::SHORT_BINBYTES => self.text(1)?,
            op::BINUNICODE | op::BINBYTES => self.text(4)?,
            op::BINUNICODE8 | op::BINBYTES8 => self.text(8)?,
            op::STOP
            | op::MARK
            | op::POP
            | op::POP_MARK
            | op::MEMOIZE
            | op::NONE
            | op::NEWTRUE
            | op::NEWFALSE
            | op::EMPTY_TUPLE
            | op::TUPLE1
            | op::TUPLE2
            | op::TUPLE3
            | op::TUPLE
            | op::EMPTY_LIST
            | op::LIST
            | op::APPEND
            | op::APPENDS
            | op::EMPTY_DICT
            | op::DICT
            | op::SETITEM
            | op::SETITEMS
            | op::EMPTY_SET
            | op::ADDITEMS
            | op::FROZENSET => Arg::None,
            other => {
                return self.fail(format!(
                    "opcode {other:#04x} is not plain data and is not read"
                ))
            }
        })
    }

    fn text(&mut self, width: u64) -> Result<Arg, TraceError> {
        let n = self.uint(width)?;
        if n > MAX_TEXT_BYTES {
            return self.fail(format!(
                "a string of {n} bytes (at most {MAX_TEXT_BYTES} are read)"
            ));
        }
        self.read_into_buf(n)?;
        Ok(Arg::Text)
    }
}

/// Memo ids as the pickler hands them out: `MEMOIZE` takes the next one, a
/// `PUT` names the next one or one already given.
#[derive(Default)]
struct MemoIds {
    len: u64,
}

impl MemoIds {
    /// The id a memo opcode `code` with argument `arg` stores under.
    fn put(&mut self, reader: &Reader<'_>, code: u8, arg: &Arg) -> Result<u64, TraceError> {
        let id = match (code, arg) {
            (op::MEMOIZE, _) => self.len,
            (_, Arg::Id(id)) => *id,
            _ => return reader.fail("a memo opcode with no id"),
        };
        if id > self.len {
            return reader.fail(format!(
                "memo id {id} skips ahead of the {} entries stored",
                self.len
            ));
        }
        if id == self.len {
            self.len += 1;
        }
        Ok(id)
    }

    fn check_get(&self, reader: &Reader<'_>, id: u64) -> Result<(), TraceError> {
        if id >= self.len {
            return reader.fail(format!("memo entry {id} does not exist"));
        }
        Ok(())
    }
}

/// The memo ids a pickle fetches again, one bit each.
pub(crate) struct Fetched(Vec<u64>);

impl Fetched {
    fn contains(&self, id: u64) -> bool {
        let word = (id / 64) as usize;
        self.0.get(word).is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    fn insert(&mut self, id: u64) {
        let word = (id / 64) as usize;
        if self.0.len() <= word {
            self.0.resize(word + 1, 0);
        }
        self.0[word] |= 1 << (id % 64);
    }
}

/// Pass 1: the memo entries `source`'s pickle fetches again.
///
/// # Errors
/// [`TraceError::Pickle`] for an opcode that is not plain data, a truncated
/// input, or a fetch of a memo entry not stored.
pub(crate) fn fetched_memo_ids(source: &dyn Source) -> Result<Fetched, TraceError> {
    let mut reader = Reader::new(source.open()?);
    let mut ids = MemoIds::default();
    let mut fetched = Fetched(Vec::new());
    loop {
        let code = reader.opcode()?;
        let arg = reader.arg(code)?;
        match code {
            op::STOP => return Ok(fetched),
            op::MEMOIZE | op::BINPUT | op::LONG_BINPUT => {
                ids.put(&reader, code, &arg)?;
            }
            op::BINGET | op::LONG_BINGET => {
                let Arg::Id(id) = arg else {
                    return reader.fail("a memo opcode with no id");
                };
                ids.check_get(&reader, id)?;
                fetched.insert(id);
            }
            _ => {}
        }
    }
}

/// The machine of pass 2.
struct Machine<'r, 'l> {
    reader: Reader<'r>,
    limits: &'l ReadLimits,
    stack: Vec<Value>,
    /// Stack lengths at each open `MARK`.
    marks: Vec<usize>,
    ids: MemoIds,
    fetched: Fetched,
    memo: std::collections::HashMap<u64, Value>,
    /// Items held in containers (trace entries and dropped frames aside).
    kept: u64,
}

/// Pass 2: decodes `source`'s pickle, keeping the memo entries of `fetched`
/// (from pass 1).
///
/// # Errors
/// [`TraceError::Pickle`] for a malformed or hostile pickle (with the byte
/// offset of the opcode), [`TraceError::TooLarge`] past the input limit.
pub(crate) fn decode(
    source: &dyn Source,
    fetched: Fetched,
    limits: &ReadLimits,
) -> Result<Value, TraceError> {
    let mut machine = Machine {
        reader: Reader::new(source.open()?),
        limits,
        stack: Vec::new(),
        marks: Vec::new(),
        ids: MemoIds::default(),
        fetched,
        memo: std::collections::HashMap::new(),
        kept: 0,
    };
    machine.run()
}

/// Both passes over `source`.
///
/// # Errors
/// As [`fetched_memo_ids`] and [`decode`].
pub(crate) fn read(source: &dyn Source, limits: &ReadLimits) -> Result<Value, TraceError> {
    let fetched = fetched_memo_ids(source)?;
    decode(source, fetched, limits)
}

impl Machine<'_, '_> {
    fn fail<T>(&self, reason: impl Into<String>) -> Result<T, TraceError> {
        self.reader.fail(reason)
    }

    fn run(&mut self) -> Result<Value, TraceError> {
        loop {
            let code = self.reader.opcode()?;
            let arg = self.reader.arg(code)?;
            if code == op::STOP {
                return self.pop();
            }
            self.step(code, arg)?;
            if self.stack.len() > MAX_STACK {
                return self.fail(format!("more than {MAX_STACK} values on the stack"));
            }
        }
    }

    fn step(&mut self, code: u8, arg: Arg) -> Result<(), TraceError> {
        match code {
            op::PROTO => match arg {
                Arg::Id(2..=5) => {}
                Arg::Id(v) => return self.fail(format!("pickle protocol {v} (2 to 5 are read)")),
                _ => return self.fail("no protocol number"),
            },
            op::FRAME => {}
            op::MARK => self.marks.push(self.stack.len()),
            op::POP => {
                self.pop()?;
            }
            op::POP_MARK => {
                self.pop_mark()?;
            }
            op::MEMOIZE | op::BINPUT | op::LONG_BINPUT => {
                let id = self.ids.put(&self.reader, code, &arg)?;
                let top = self.top()?.clone();
                if self.fetched.contains(id) {
                    self.memo.insert(id, top);
                }
            }
            op::BINGET | op::LONG_BINGET => {
                let Arg::Id(id) = arg else {
                    return self.fail("a memo opcode with no id");
                };
                let Some(value) = self.memo.get(&id).cloned() else {
                    return self.fail(format!("memo entry {id} does not exist"));
                };
                self.stack.push(value);
            }
            _ => self.build(code, arg)?,
        }
        Ok(())
    }

    /// Runs an opcode that pushes a value or fills a container.
    fn build(&mut self, code: u8, arg: Arg) -> Result<(), TraceError> {
        let value = match (code, arg) {
            (op::NONE, _) => Value::None,
            (op::NEWTRUE, _) => Value::Bool(true),
            (op::NEWFALSE, _) => Value::Bool(false),
            (_, Arg::Int(v)) => v,
            (_, Arg::Float) => Value::Float,
            (op::SHORT_BINUNICODE | op::BINUNICODE | op::BINUNICODE8, Arg::Text) => {
                match std::str::from_utf8(&self.reader.buf) {
                    Ok(s) => Value::Str(Rc::from(s)),
                    Err(_) => return self.fail("a string that is not UTF-8"),
                }
            }
            (op::SHORT_BINBYTES | op::BINBYTES | op::BINBYTES8, Arg::Text) => Value::Bytes,
            (op::EMPTY_TUPLE | op::EMPTY_LIST | op::EMPTY_SET, _) => {
                Value::List(Container::new(Vec::new()))
            }
            (op::EMPTY_DICT, _) => Value::Dict(Container::new(Vec::new())),
            (op::TUPLE1 | op::TUPLE2 | op::TUPLE3, _) => {
                let n = usize::from(code - op::TUPLE1) + 1;
                if self.stack.len() < n {
                    return self.fail("stack underflow");
                }
                let items = self.stack.split_off(self.stack.len() - n);
                Value::List(self.filled(items)?)
            }
            (op::TUPLE | op::LIST | op::FROZENSET, _) => {
                let items = self.pop_mark()?;
                Value::List(self.filled(items)?)
            }
            (op::DICT, _) => {
                let items = self.pop_mark()?;
                if items.len() % 2 != 0 {
                    return self.fail("a dict with a key and no value");
                }
                Value::Dict(self.filled(items)?)
            }
            (op::APPEND, _) => {
                let item = self.pop()?;
                return self.extend_top(vec![item], false);
            }
            (op::APPENDS | op::ADDITEMS, _) => {
                let items = self.pop_mark()?;
                return self.extend_top(items, false);
            }
            (op::SETITEM, _) => {
                let value = self.pop()?;
                let key = self.pop()?;
                return self.extend_top(vec![key, value], true);
            }
            (op::SETITEMS, _) => {
                let items = self.pop_mark()?;
                if items.len() % 2 != 0 {
                    return self.fail("SETITEMS with a key and no value");
                }
                return self.extend_top(items, true);
            }
            _ => return self.fail(format!("opcode {code:#04x} without its argument")),
        };
        self.stack.push(value);
        Ok(())
    }

    fn top(&self) -> Result<&Value, TraceError> {
        match self.stack.last() {
            Some(v) => Ok(v),
            None => self.fail("stack underflow"),
        }
    }

    fn pop(&mut self) -> Result<Value, TraceError> {
        match self.stack.pop() {
            Some(v) => Ok(v),
            None => self.fail("stack underflow"),
        }
    }

    fn pop_mark(&mut self) -> Result<Vec<Value>, TraceError> {
        match self.marks.pop() {
            Some(at) if at <= self.stack.len() => Ok(self.stack.split_off(at)),
            _ => self.fail("no mark to pop to"),
        }
    }

    /// A new container of `items`.
    fn filled(&mut self, items: Vec<Value>) -> Result<Rc<Container>, TraceError> {
        let container = Container::new(Vec::new());
        self.add(&container, items, false)?;
        Ok(container)
    }

    /// Adds `items` to the container on top of the stack (`pairs`: a dict's
    /// keys and values).
    fn extend_top(&mut self, items: Vec<Value>, pairs: bool) -> Result<(), TraceError> {
        let Some(target) = self.top()?.container().cloned() else {
            let kind = self.top()?.kind();
            return self.fail(format!("adding items to {kind}"));
        };
        if target.sealed.get() {
            return self.fail("a container changed after it was placed in another");
        }
        self.add(&target, items, pairs)
    }

    /// Adds `items` to `target`: seals the containers among them, raises
    /// `target`'s height, drops `frames` values (of a dict's pairs), and turns
    /// trace entries appended to a list into events.
    fn add(
        &mut self,
        target: &Rc<Container>,
        items: Vec<Value>,
        pairs: bool,
    ) -> Result<(), TraceError> {
        let mut kept = Vec::with_capacity(items.len());
        let mut items = items.into_iter();
        while let Some(item) = items.next() {
            if pairs {
                let value = items.next().unwrap_or(Value::None);
                let value = if matches!(&item, Value::Str(k) if &**k == "frames") {
                    self.drop_value(value);
                    Value::None
                } else {
                    value
                };
                self.seal(target, &item)?;
                self.seal(target, &value)?;
                kept.extend([item, value]);
                continue;
            }
            if let Value::Dict(d) = &item {
                if d.get("action").is_some() {
                    let converted = trace_entry(d);
                    self.drop_value(item);
                    let mut events = target.events.borrow_mut();
                    let index = events.events.len() + events.skipped;
                    match converted {
                        Ok(Some(e)) => events.events.push(e),
                        Ok(None) => events.skipped += 1,
                        Err((field, reason)) => {
                            events.error.get_or_insert((index, field, reason));
                        }
                    }
                    continue;
                }
            }
            self.seal(target, &item)?;
            kept.push(item);
        }
        self.kept += kept.len() as u64;
        if self.kept > self.limits.max_values {
            return self.fail(format!(
                "more than {} values besides trace entries",
                self.limits.max_values
            ));
        }
        target.items.borrow_mut().extend(kept);
        Ok(())
    }

    /// Drops `value`, no longer counting its items when nothing else holds it.
    fn drop_value(&mut self, value: Value) {
        if let Some(c) = value.container() {
            if Rc::strong_count(c) == 1 {
                self.kept = self.kept.saturating_sub(c.items().len() as u64);
            }
        }
    }

    /// Seals `child` (a container placed in `target`) and raises `target`'s
    /// height to hold it.
    fn seal(&self, target: &Rc<Container>, child: &Value) -> Result<(), TraceError> {
        let Some(child) = child.container() else {
            return Ok(());
        };
        if Rc::ptr_eq(target, child) {
            return self.fail("a container placed in itself");
        }
        child.sealed.set(true);
        let height = target.height.get().max(child.height.get() + 1);
        if height > self.limits.max_depth {
            return self.fail(format!(
                "nested deeper than {} levels",
                self.limits.max_depth
            ));
        }
        target.height.set(height);
        Ok(())
    }
}

/// The event of a trace entry `d`: `None` for an entry that is not replayed
/// (`annotate`); on error, the field and what is wrong with it.
fn trace_entry(d: &Container) -> Result<Option<TraceEvent>, (String, String)> {
    let action = match d.get("action") {
        Some(Value::Str(s)) => s,
        Some(other) => {
            return Err((
                "action".into(),
                format!("expected a string, found {}", other.kind()),
            ))
        }
        None => return Err(("action".into(), "missing".into())),
    };
    if &*action == "annotate" {
        return Ok(None);
    }
    let action: Action = action.parse().map_err(|e| ("action".to_string(), e))?;
    // An out-of-memory entry names the device's free bytes instead of an address.
    let addr_key = if action == Action::Oom && d.get("addr").is_none() {
        "device_free"
    } else {
        "addr"
    };
    let num = |key: &str| match d.get(key) {
        Some(v) => uint(&v).map_err(|reason| (key.to_string(), reason)),
        None => Err((key.to_string(), "missing".to_string())),
    };
    let size = num("size")?;
    if is_too_large(size) {
        return Err((
            "size".into(),
            format!("size {size} is too large (a request must be under {MAX_REQUEST})"),
        ));
    }
    Ok(Some(TraceEvent {
        time_us: num("time_us")?,
        action,
        addr: num(addr_key)?,
        size,
        stream: StreamId(num("stream")?),
    }))
}

/// `value` as an integer in `0..2^64`.
pub(crate) fn uint(value: &Value) -> Result<u64, String> {
    match value {
        Value::Int(i) => u64::try_from(*i).map_err(|_| "integer outside 0..2^64".to_string()),
        Value::UInt(u) => Ok(*u),
        Value::BigInt => Err("integer outside 0..2^64".to_string()),
        other => Err(format!("expected an integer, found {}", other.kind())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_bytes(bytes: &[u8]) -> Result<Value, TraceError> {
        read(&bytes, &ReadLimits::default())
    }

    /// A protocol-4 pickle of `body`, ending in STOP.
    fn pickle(body: &[u8]) -> Vec<u8> {
        let mut p = vec![op::PROTO, 4];
        p.extend_from_slice(body);
        p.push(op::STOP);
        p
    }

    fn offset(err: TraceError) -> u64 {
        match err {
            TraceError::Pickle { offset, .. } => offset,
            other => panic!("expected a pickle error, got {other}"),
        }
    }

    #[test]
    fn what_pythons_pickler_writes_reads_back() {
        let value = serde_pickle::Value::Dict(std::collections::BTreeMap::from([(
            serde_pickle::HashableValue::String("k".into()),
            serde_pickle::Value::List(vec![
                serde_pickle::Value::I64(-5),
                serde_pickle::Value::Int((u64::MAX).into()),
                serde_pickle::Value::String("text".into()),
                serde_pickle::Value::F64(1.5),
                serde_pickle::Value::Tuple(vec![serde_pickle::Value::Bool(true)]),
            ]),
        )]));
        let bytes =
            serde_pickle::value_to_vec(&value, serde_pickle::SerOptions::new()).expect("pickles");
        let Value::Dict(d) = read_bytes(&bytes).expect("reads") else {
            panic!("a dict")
        };
        let Some(Value::List(l)) = d.get("k") else {
            panic!("a list")
        };
        let items = l.items();
        assert!(matches!(items[0], Value::Int(-5)));
        assert!(matches!(items[1], Value::UInt(u64::MAX)));
        assert!(matches!(&items[2], Value::Str(s) if &**s == "text"));
        assert!(matches!(items[3], Value::Float));
        assert!(matches!(&items[4], Value::List(t) if t.items().len() == 1));
    }

    #[test]
    fn integers_of_any_width_read_or_are_out_of_range() {
        assert!(matches!(Value::int(&[0xff]), Value::Int(-1)));
        assert!(matches!(Value::int(&[]), Value::Int(0)));
        assert!(matches!(
            Value::int(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0]),
            Value::UInt(u64::MAX)
        ));
        let mut big = vec![0u8; 17];
        big[16] = 1;
        assert!(matches!(Value::int(&big), Value::BigInt));
        let mut minus_one = vec![0xffu8; 20];
        minus_one[0] = 0xff;
        assert!(matches!(Value::int(&minus_one), Value::Int(-1)));
    }

    #[test]
    fn deep_nesting_is_refused_where_it_happens() {
        // Lists nested 100 deep: ] ] ] ... a a a
        let mut body = vec![op::EMPTY_LIST; 100];
        body.extend(vec![op::APPEND; 99]);
        let err = read_bytes(&pickle(&body)).unwrap_err();
        assert!(err.to_string().contains("nested deeper than 64"), "{err}");
        let mut body = vec![op::EMPTY_LIST; 30];
        body.extend(vec![op::APPEND; 29]);
        assert!(read_bytes(&pickle(&body)).is_ok());
    }

    #[test]
    fn shared_references_are_not_copied_and_cycles_are_refused() {
        // A list memoized, then placed in a new list 100k times by reference:
        // one value, shared.
        let mut body = vec![op::EMPTY_LIST, op::MEMOIZE, op::EMPTY_LIST, op::MARK];
        for _ in 0..100_000 {
            body.extend([op::BINGET, 0]);
        }
        body.push(op::APPENDS);
        assert!(read_bytes(&pickle(&body)).is_ok());
        // A list appended to itself.
        let cycle = pickle(&[op::EMPTY_LIST, op::MEMOIZE, op::BINGET, 0, op::APPEND]);
        let err = read_bytes(&cycle).unwrap_err().to_string();
        assert!(err.contains("placed in itself"), "{err}");
        // A list changed after it was placed in another (the way to a cycle
        // through two lists).
        let later = pickle(&[
            op::EMPTY_LIST,
            op::MEMOIZE,
            op::EMPTY_LIST,
            op::BINGET,
            0,
            op::APPEND,
            op::BINGET,
            0,
            op::NONE,
            op::APPEND,
        ]);
        let err = read_bytes(&later).unwrap_err().to_string();
        assert!(err.contains("changed after it was placed"), "{err}");
    }

    #[test]
    fn unsupported_opcodes_and_bad_memo_use_name_the_offset() {
        // GLOBAL ('c') at offset 2.
        let err = read_bytes(&pickle(b"cos\nsystem\n")).unwrap_err();
        assert_eq!(offset(err), 2);
        // A fetch of an entry never stored, at offset 3.
        let err = read_bytes(&pickle(&[op::NONE, op::BINGET, 7])).unwrap_err();
        assert_eq!(offset(err), 3);
        // A PUT that skips ahead.
        let err = read_bytes(&pickle(&[op::NONE, op::BINPUT, 9])).unwrap_err();
        assert!(err.to_string().contains("skips ahead"), "{err}");
        // Truncated.
        let err = read_bytes(&[op::PROTO, 4, op::SHORT_BINUNICODE, 10, b'a']).unwrap_err();
        assert!(err.to_string().contains("truncated"), "{err}");
        let err = read_bytes(&pickle(&[op::LONG4, 0, 0, 0, 1])).unwrap_err();
        assert!(err.to_string().contains("integer of"), "{err}");
        let err = read_bytes(&[op::PROTO, 9, op::NONE, op::STOP]).unwrap_err();
        assert!(err.to_string().contains("protocol 9"), "{err}");
    }

    #[test]
    fn values_besides_trace_entries_are_bounded() {
        let mut body = vec![op::EMPTY_LIST, op::MARK];
        body.extend(vec![op::NONE; 1000]);
        body.push(op::APPENDS);
        let limits = ReadLimits {
            max_values: 999,
            ..ReadLimits::default()
        };
        let err = read(&&pickle(&body)[..], &limits).unwrap_err();
        assert!(err.to_string().contains("more than 999 values"), "{err}");
    }

    #[test]
    fn frames_are_dropped_and_trace_entries_become_events() {
        let entry = |action: &str, extra: Vec<(&str, serde_pickle::Value)>| {
            let mut d = std::collections::BTreeMap::new();
            let key = |k: &str| serde_pickle::HashableValue::String(k.into());
            d.insert(key("action"), serde_pickle::Value::String(action.into()));
            for k in ["size", "stream", "time_us"] {
                d.insert(key(k), serde_pickle::Value::I64(8));
            }
            d.insert(
                key("frames"),
                serde_pickle::Value::List(vec![serde_pickle::Value::None; 10]),
            );
            for (k, v) in extra {
                d.insert(key(k), v);
            }
            serde_pickle::Value::Dict(d)
        };
        let list = serde_pickle::Value::List(vec![
            entry("alloc", vec![("addr", serde_pickle::Value::I64(4096))]),
            entry("annotate", vec![]),
            entry("oom", vec![("device_free", serde_pickle::Value::I64(77))]),
            entry(
                "alloc",
                vec![("addr", serde_pickle::Value::String("x".into()))],
            ),
        ]);
        let bytes =
            serde_pickle::value_to_vec(&list, serde_pickle::SerOptions::new()).expect("pickles");
        let Value::List(l) = read_bytes(&bytes).expect("reads") else {
            panic!("a list")
        };
        assert!(l.items().is_empty());
        let events = l.take_events();
        assert_eq!(events.events.len(), 2);
        assert_eq!(events.skipped, 1);
        assert_eq!(events.events[0].addr, 4096);
        assert_eq!(
            (events.events[1].action, events.events[1].addr),
            (Action::Oom, 77)
        );
        let (index, field, reason) = events.error.expect("the bad entry");
        assert_eq!((index, field.as_str()), (3, "addr"));
        assert!(reason.contains("expected an integer"), "{reason}");
    }
}
