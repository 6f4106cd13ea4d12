//! A guard pass over a pickle before serde-pickle decodes it.
//!
//! serde-pickle builds its values recursively and copies a memoized value out once
//! per reference, so a hostile pickle could overflow the stack (deep nesting) or
//! exhaust memory (a few bytes of references that expand to billions of values).
//! This pass runs the pickle's stack machine over *shapes* instead of values: each
//! stack item records how many values it holds, how deep it nests, and which memo
//! entries it refers to. At `STOP` it computes the size and depth the decoded value
//! would have with every reference copied out, and refuses the pickle when either
//! exceeds [`ReadLimits`].
//!
//! Only the opcodes Python's pickler emits for plain data (dicts, lists, tuples,
//! sets, strings, bytes, numbers, booleans, `None`), protocols 2 to 5, are
//! accepted; anything else (globals, object construction, `DUP`, persistent ids)
//! is refused, since a memory snapshot never contains it. Memoizing a memo
//! reference is refused too (the pickler never does it, and serde-pickle copies the
//! value there). So is a float in a dict key or a set element: serde-pickle
//! sorts keys and elements with an order that is not total once floats are in
//! it (NaN, or integers past 2^53 that round to the same float), and the sort
//! panics on that (found by `fuzz/`'s `trace_csv`); no snapshot has such a
//! key.

use std::collections::{HashMap, HashSet};

use super::{ReadLimits, TraceError};

mod op {
    pub(super) const PROTO: u8 = 0x80;
    pub(super) const FRAME: u8 = 0x95;
    pub(super) const STOP: u8 = b'.';
    pub(super) const MARK: u8 = b'(';
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

/// Longest integer accepted, in bytes (`LONG1`/`LONG4`): wide enough for any
/// address, size or time, far below what would cost real work to decode.
const MAX_INT_BYTES: usize = 32;

/// What a value will decode to: its own values, its nesting height, and the memo
/// entries it refers to (each with its nesting level inside this value).
#[derive(Debug, Default)]
struct Shape {
    values: u64,
    height: u32,
    refs: Vec<(u32, u32)>,
    /// Whether a float is in it (through memo references too).
    float: bool,
}

impl Shape {
    fn leaf() -> Shape {
        Shape {
            values: 1,
            height: 1,
            refs: Vec::new(),
            float: false,
        }
    }

    fn float() -> Shape {
        Shape {
            float: true,
            ..Shape::leaf()
        }
    }
}

/// A stack item: a value being built, or a reference to a memo entry.
#[derive(Debug)]
enum Item {
    Value(Shape),
    Ref(u32),
}

/// The guard's machine state.
struct Guard<'a> {
    bytes: &'a [u8],
    pos: usize,
    /// Offset of the opcode being run, for errors.
    at: usize,
    limits: &'a ReadLimits,
    stack: Vec<Item>,
    marks: Vec<Vec<Item>>,
    memo: HashMap<u32, Shape>,
}

/// Checks that `bytes` is a plain-data pickle whose decoded value stays within
/// `limits`.
///
/// # Errors
/// [`TraceError::Pickle`] naming the byte offset of the offending opcode.
pub fn check(bytes: &[u8], limits: &ReadLimits) -> Result<(), TraceError> {
    let mut guard = Guard {
        bytes,
        pos: 0,
        at: 0,
        limits,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    let root = guard.run()?;
    guard.check_expanded(&root)
}

impl Guard<'_> {
    fn fail<T>(&self, reason: impl Into<String>) -> Result<T, TraceError> {
        Err(TraceError::Pickle {
            offset: self.at as u64,
            reason: reason.into(),
        })
    }

    fn take(&mut self, n: u64) -> Result<&[u8], TraceError> {
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left {
            return self.fail(format!("truncated: needs {n} bytes, {left} left"));
        }
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.bytes[start..self.pos])
    }

    fn uint(&mut self, width: usize) -> Result<u64, TraceError> {
        let raw = self.take(width as u64)?;
        Ok(raw
            .iter()
            .rev()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn run(&mut self) -> Result<Item, TraceError> {
        loop {
            self.at = self.pos;
            let code = self.uint(1)? as u8;
            if code == op::STOP {
                return self.pop();
            }
            self.step(code)?;
        }
    }

    fn step(&mut self, code: u8) -> Result<(), TraceError> {
        match code {
            op::PROTO => {
                let version = self.uint(1)?;
                if !(2..=5).contains(&version) {
                    return self.fail(format!("pickle protocol {version} (2 to 5 are read)"));
                }
            }
            op::FRAME => {
                self.uint(8)?;
            }
            op::MARK => self.marks.push(std::mem::take(&mut self.stack)),
            op::MEMOIZE => self.memoize(self.memo.len() as u32)?,
            op::BINPUT => {
                let id = self.uint(1)? as u32;
                self.memoize(id)?;
            }
            op::LONG_BINPUT => {
                let id = self.uint(4)? as u32;
                self.memoize(id)?;
            }
            op::BINGET => {
                let id = self.uint(1)? as u32;
                self.get(id)?;
            }
            op::LONG_BINGET => {
                let id = self.uint(4)? as u32;
                self.get(id)?;
            }
            op::NONE
            | op::NEWTRUE
            | op::NEWFALSE
            | op::EMPTY_TUPLE
            | op::EMPTY_LIST
            | op::EMPTY_DICT
            | op::EMPTY_SET => {
                self.stack.push(Item::Value(Shape::leaf()));
            }
            op::BININT | op::BININT1 | op::BININT2 => {
                let width = match code {
                    op::BININT => 4,
                    op::BININT1 => 1,
                    _ => 2,
                };
                self.take(width)?;
                self.stack.push(Item::Value(Shape::leaf()));
            }
            op::BINFLOAT => {
                self.take(8)?;
                self.stack.push(Item::Value(Shape::float()));
            }
            op::LONG1 | op::LONG4 => self.long(code)?,
            op::SHORT_BINUNICODE | op::SHORT_BINBYTES => self.prefixed(1)?,
            op::BINUNICODE | op::BINBYTES => self.prefixed(4)?,
            op::BINUNICODE8 | op::BINBYTES8 => self.prefixed(8)?,
            op::TUPLE1 | op::TUPLE2 | op::TUPLE3 => {
                let n = usize::from(code - op::TUPLE1) + 1;
                if self.stack.len() < n {
                    return self.fail("stack underflow");
                }
                let items = self.stack.split_off(self.stack.len() - n);
                let shape = self.build(Shape::leaf(), items)?;
                self.stack.push(Item::Value(shape));
            }
            op::TUPLE | op::LIST | op::DICT | op::FROZENSET => {
                let items = self.pop_mark()?;
                self.check_keys(code, &items)?;
                let shape = self.build(Shape::leaf(), items)?;
                self.stack.push(Item::Value(shape));
            }
            op::APPEND => {
                let item = self.pop()?;
                self.extend_top(vec![item])?;
            }
            op::SETITEM => {
                let value = self.pop()?;
                let key = self.pop()?;
                let items = vec![key, value];
                self.check_keys(code, &items)?;
                self.extend_top(items)?;
            }
            op::APPENDS | op::SETITEMS | op::ADDITEMS => {
                let items = self.pop_mark()?;
                self.check_keys(code, &items)?;
                self.extend_top(items)?;
            }
            other => {
                return self.fail(format!(
                    "opcode {other:#04x} is not plain data and is not read"
                ))
            }
        }
        Ok(())
    }

    fn long(&mut self, code: u8) -> Result<(), TraceError> {
        let n = if code == op::LONG1 {
            self.uint(1)?
        } else {
            self.uint(4)?
        };
        if n > MAX_INT_BYTES as u64 {
            return self.fail(format!(
                "integer of {n} bytes (at most {MAX_INT_BYTES} are read)"
            ));
        }
        self.take(n)?;
        self.stack.push(Item::Value(Shape::leaf()));
        Ok(())
    }

    fn prefixed(&mut self, width: usize) -> Result<(), TraceError> {
        let n = self.uint(width)?;
        self.take(n)?;
        self.stack.push(Item::Value(Shape::leaf()));
        Ok(())
    }

    fn pop(&mut self) -> Result<Item, TraceError> {
        match self.stack.pop() {
            Some(item) => Ok(item),
            None => self.fail("stack underflow"),
        }
    }

    fn pop_mark(&mut self) -> Result<Vec<Item>, TraceError> {
        match self.marks.pop() {
            Some(outer) => Ok(std::mem::replace(&mut self.stack, outer)),
            None => self.fail("no mark to pop to"),
        }
    }

    fn memoize(&mut self, id: u32) -> Result<(), TraceError> {
        match self.pop()? {
            Item::Value(shape) => {
                self.memo.insert(id, shape);
                self.stack.push(Item::Ref(id));
                Ok(())
            }
            Item::Ref(_) => self.fail("memoizing a memo reference"),
        }
    }

    fn get(&mut self, id: u32) -> Result<(), TraceError> {
        if !self.memo.contains_key(&id) {
            return self.fail(format!("memo entry {id} does not exist"));
        }
        self.stack.push(Item::Ref(id));
        Ok(())
    }

    /// Whether `item` holds a float.
    fn has_float(&self, item: &Item) -> bool {
        match item {
            Item::Value(shape) => shape.float,
            Item::Ref(id) => self.memo.get(id).is_some_and(|s| s.float),
        }
    }

    /// Refuses a float among the keys of `items`, which opcode `code` puts
    /// in a dict (keys alternate with values) or a set (every item is an
    /// element); the items of other opcodes are not keys.
    fn check_keys(&self, code: u8, items: &[Item]) -> Result<(), TraceError> {
        let step = match code {
            op::DICT | op::SETITEM | op::SETITEMS => 2,
            op::FROZENSET | op::ADDITEMS => 1,
            _ => return Ok(()),
        };
        if items.iter().step_by(step).any(|i| self.has_float(i)) {
            return self.fail("a float in a dict key or set element (its order is not total)");
        }
        Ok(())
    }

    /// Adds `items` as children of `shape`.
    fn build(&self, mut shape: Shape, items: Vec<Item>) -> Result<Shape, TraceError> {
        for item in items {
            shape.float |= self.has_float(&item);
            match item {
                Item::Ref(id) => shape.refs.push((id, 1)),
                Item::Value(child) => {
                    shape.values = shape.values.saturating_add(child.values);
                    shape.height = shape.height.max(child.height + 1);
                    shape
                        .refs
                        .extend(child.refs.into_iter().map(|(id, level)| (id, level + 1)));
                }
            }
        }
        if shape.height > self.limits.max_depth {
            return self.fail(format!(
                "nested deeper than {} levels",
                self.limits.max_depth
            ));
        }
        Ok(shape)
    }

    /// Adds `items` to the container on top of the stack (through a memo reference
    /// if that is what the top is, as serde-pickle does).
    fn extend_top(&mut self, items: Vec<Item>) -> Result<(), TraceError> {
        let shape = match self.stack.last_mut() {
            None => return self.fail("stack underflow"),
            Some(Item::Value(shape)) => std::mem::take(shape),
            Some(Item::Ref(id)) => {
                let id = *id;
                match self.memo.get_mut(&id) {
                    Some(shape) => std::mem::take(shape),
                    None => return self.fail(format!("memo entry {id} does not exist")),
                }
            }
        };
        let built = self.build(shape, items)?;
        match self.stack.last_mut() {
            Some(Item::Value(shape)) => *shape = built,
            Some(Item::Ref(id)) => {
                let id = *id;
                self.memo.insert(id, built);
            }
            None => return self.fail("stack underflow"),
        }
        Ok(())
    }

    /// Computes the size and height of the decoded root with every reference copied
    /// out, refusing cycles and anything over the limits.
    fn check_expanded(&self, root: &Item) -> Result<(), TraceError> {
        let leaf;
        let root_shape = match root {
            Item::Value(shape) => shape,
            Item::Ref(id) => {
                leaf = Shape {
                    values: 0,
                    height: 0,
                    refs: vec![(*id, 0)],
                    float: false,
                };
                &leaf
            }
        };
        let mut done: HashMap<u32, (u64, u32)> = HashMap::new();
        for &(id, _) in &root_shape.refs {
            self.expand(id, &mut done)?;
        }
        self.total(root_shape, &done).map(|_| ())
    }

    /// The expanded (values, height) of `shape`, given its references' expansions.
    fn total(
        &self,
        shape: &Shape,
        done: &HashMap<u32, (u64, u32)>,
    ) -> Result<(u64, u32), TraceError> {
        let (mut values, mut height) = (shape.values, shape.height);
        for (id, level) in &shape.refs {
            let Some(&(v, h)) = done.get(id) else {
                return self.fail(format!("memo entry {id} does not exist"));
            };
            values = values.saturating_add(v);
            height = height.max(level.saturating_add(h));
        }
        if height > self.limits.max_depth {
            return self.fail(format!(
                "nested deeper than {} levels once references are resolved",
                self.limits.max_depth
            ));
        }
        if values > self.limits.max_values {
            return self.fail(format!(
                "expands to more than {} values",
                self.limits.max_values
            ));
        }
        Ok((values, height))
    }

    /// Expands memo entry `start` and everything it refers to, without recursion.
    fn expand(&self, start: u32, done: &mut HashMap<u32, (u64, u32)>) -> Result<(), TraceError> {
        if done.contains_key(&start) {
            return Ok(());
        }
        let mut path: Vec<(u32, usize)> = vec![(start, 0)];
        let mut on_path: HashSet<u32> = HashSet::from([start]);
        while let Some(&mut (id, ref mut next)) = path.last_mut() {
            let Some(shape) = self.memo.get(&id) else {
                return self.fail(format!("memo entry {id} does not exist"));
            };
            if let Some(&(child, _)) = shape.refs.get(*next) {
                *next += 1;
                if done.contains_key(&child) {
                    continue;
                }
                if !on_path.insert(child) {
                    return self.fail("recursive structure");
                }
                path.push((child, 0));
                continue;
            }
            let total = self.total(shape, done)?;
            done.insert(id, total);
            on_path.remove(&id);
            path.pop();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(bytes: &[u8]) -> Result<(), TraceError> {
        check(bytes, &ReadLimits::default())
    }

    #[test]
    fn plain_data_passes() {
        // {'a': [1, 2], 'b': 'x'} at protocol 4, as Python writes it.
        let bytes = b"\x80\x04\x95\x17\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01K\x02e\x8c\x01b\x94\x8c\x01x\x94u.";
        run(bytes).unwrap();
        let v = serde_pickle::value_from_slice(bytes, serde_pickle::DeOptions::new()).unwrap();
        assert!(matches!(v, serde_pickle::Value::Dict(_)));
    }

    /// A pickle of protocol 4 whose body is `body`, then STOP.
    fn pickle(body: &[u8]) -> Vec<u8> {
        let mut bytes = b"\x80\x04".to_vec();
        bytes.extend_from_slice(body);
        bytes.push(op::STOP);
        bytes
    }

    #[test]
    fn floats_as_keys_or_set_elements_are_refused() {
        let nan = [&[op::BINFLOAT][..], &f64::NAN.to_be_bytes()].concat();
        let one = [&[op::BINFLOAT][..], &1.0f64.to_be_bytes()].concat();
        let refused = [
            // frozenset({nan, nan})
            [&[op::MARK][..], &nan, &nan, &[op::FROZENSET]].concat(),
            // s = set(); s.update({1.0})
            [&[op::EMPTY_SET, op::MARK][..], &one, &[op::ADDITEMS]].concat(),
            // {1.0: None}, one item and several
            [&[op::EMPTY_DICT][..], &one, &[op::NONE, op::SETITEM]].concat(),
            [
                &[op::EMPTY_DICT, op::MARK][..],
                &one,
                &[op::NONE, op::SETITEMS],
            ]
            .concat(),
            // {(1, 1.0): None}, built by DICT
            [
                &[op::MARK, op::BININT1, 1][..],
                &one,
                &[op::TUPLE2, op::NONE, op::DICT],
            ]
            .concat(),
            // {x: None}, x = 1.0 through the memo
            [
                &[op::EMPTY_DICT][..],
                &one,
                &[op::MEMOIZE, op::NONE, op::SETITEM],
            ]
            .concat(),
        ];
        for (i, body) in refused.iter().enumerate() {
            let err = run(&pickle(body)).unwrap_err();
            assert!(
                err.to_string().contains("float in a dict key"),
                "case {i}: {err}"
            );
        }
        // Floats as values and in lists still read: {'a': [nan, 1.0]}.
        let body = [
            &[op::EMPTY_DICT, op::SHORT_BINUNICODE, 1, b'a', op::MARK][..],
            &nan,
            &one,
            &[op::LIST, op::SETITEM],
        ]
        .concat();
        let bytes = pickle(&body);
        run(&bytes).unwrap();
        serde_pickle::value_from_slice(&bytes, serde_pickle::DeOptions::new()).unwrap();
    }

    #[test]
    fn deep_nesting_is_refused() {
        let mut bytes = b"\x80\x04".to_vec();
        bytes.extend(std::iter::repeat_n(op::EMPTY_LIST, 100_000));
        bytes.extend(std::iter::repeat_n(op::APPEND, 99_999));
        bytes.push(op::STOP);
        let err = run(&bytes).unwrap_err();
        assert!(err.to_string().contains("deeper"), "{err}");
    }

    #[test]
    fn exponential_references_are_refused() {
        // l0 = [0]; l(n+1) = [l(n), l(n)]: 40 levels expand to 2^40 values.
        let mut bytes = b"\x80\x04]\x94K\x00a".to_vec();
        for level in 0u32..40 {
            bytes.push(op::EMPTY_LIST);
            bytes.push(op::MEMOIZE);
            bytes.push(op::MARK);
            for _ in 0..2 {
                bytes.push(op::LONG_BINGET);
                bytes.extend_from_slice(&level.to_le_bytes());
            }
            bytes.push(op::APPENDS);
        }
        bytes.push(op::STOP);
        let err = run(&bytes).unwrap_err();
        assert!(err.to_string().contains("expands"), "{err}");
    }

    #[test]
    fn cycles_and_unsupported_opcodes_are_refused() {
        // l = []; l.append(l)
        let cyclic = b"\x80\x04]\x94h\x00a.";
        assert!(run(cyclic).unwrap_err().to_string().contains("recursive"));
        // GLOBAL os.system
        let global = b"\x80\x02cos\nsystem\n.";
        assert!(run(global).is_err());
        assert!(run(b"\x80\x04]2.").is_err(), "DUP");
        assert!(run(b"\x80\x09N.").is_err(), "protocol 9");
        assert!(
            run(b"\x80\x04X\xff\xff\xff\xff").is_err(),
            "length past the end"
        );
        assert!(
            run(b"\x80\x04\x8b\x00\x00\x00\x40").is_err(),
            "1 GiB integer"
        );
        assert!(run(b"\x80\x04").is_err(), "no STOP");
        assert!(run(b"\x80\x04h\x05.").is_err(), "missing memo");
    }

    #[test]
    fn errors_name_the_offset() {
        match run(b"\x80\x04]\x94Kx\x00") {
            Err(TraceError::Pickle { offset, .. }) => assert_eq!(offset, 6),
            other => panic!("{other:?}"),
        }
    }
}
