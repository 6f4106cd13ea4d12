//! Op lists: the alloc/free sequences every contender of the GPU benchmark replays
//! (written by scripts/trace-to-ops.py; format in that script's docs).

use std::fs;
use std::path::Path;

/// One step of an op list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes for allocation `id` on stream index `stream`.
    Alloc { id: usize, size: u64, stream: usize },
    /// Free allocation `id`.
    Free { id: usize },
}

/// A named op list.
#[derive(Debug)]
pub struct OpList {
    pub name: String,
    pub ops: Vec<Op>,
    /// One more than the largest id.
    pub ids: usize,
    /// One more than the largest stream index.
    pub streams: usize,
}

impl OpList {
    /// Reads an op list, rejecting malformed lines and frees of ids never allocated.
    pub fn read(path: &Path) -> Result<OpList, String> {
        let text = fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let name = path
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let (mut ops, mut ids, mut streams) = (Vec::new(), 0, 1);
        let mut allocated = Vec::new();
        for (n, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        {
            let bad = || format!("{}:{}: bad op line {line:?}", path.display(), n + 1);
            let fields: Vec<u64> = line[1..]
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| bad())?;
            let op = match (line.as_bytes()[0], fields.as_slice()) {
                (b'a', [id, size, stream]) if *size > 0 => Op::Alloc {
                    id: *id as usize,
                    size: *size,
                    stream: *stream as usize,
                },
                (b'f', [id]) => Op::Free { id: *id as usize },
                _ => return Err(bad()),
            };
            match op {
                Op::Alloc { id, stream, .. } => {
                    ids = ids.max(id + 1);
                    streams = streams.max(stream + 1);
                    allocated.resize(ids, false);
                    allocated[id] = true;
                }
                Op::Free { id } if allocated.get(id).copied().unwrap_or(false) => {}
                Op::Free { .. } => return Err(bad()),
            }
            ops.push(op);
        }
        Ok(OpList {
            name,
            ops,
            ids,
            streams,
        })
    }

    /// Requested bytes over one pass.
    pub fn requested_bytes(&self) -> u64 {
        self.ops
            .iter()
            .map(|op| {
                if let Op::Alloc { size, .. } = op {
                    *size
                } else {
                    0
                }
            })
            .sum()
    }
}

/// The threaded pattern, identical to the C++ one in scripts/gpu/native_alloc.cpp:
/// 32 slots; each step draws from the tests' LCG (`cachalot_testkit::lcg`, the
/// same as the C++ one), frees the slot's allocation if any and
/// allocates a size from a fixed mix of small and large sizes.
pub const PATTERN_SIZES: [u64; 8] = [
    512, 4096, 32768, 262144, 1048576, 2097152, 6291456, 20971520,
];
/// Slots per thread in the threaded pattern.
pub const PATTERN_SLOTS: u64 = 32;
