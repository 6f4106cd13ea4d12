//! Golden scenarios: PyTorch 2.11's `memory_stats()` recorded after each step of
//! small allocation programs, and the check that replays them through the
//! `pytorch` policy on a simulated device.
//!
//! A golden file (`scenarios.<conf>.json.gz`, `pools.<conf>.json.gz`) is a list
//! of entries `{name, conf, ops, after}`: `ops[i]` is `[op, args...]` and
//! `after[i]` the recorded statistics after op `i`. The operations (every
//! argument an integer; a pool is named by its two id integers `a b`):
//! - `alloc id size [stream]` (stream index, default 0), `free id`,
//!   `record id stream` (`record_stream`), `empty_cache`, `reset_peak`;
//! - `pool_new a b use_on_oom no_split` (a `torch.cuda.MemPool`), `pool_enter
//!   a b` / `pool_exit a b` (`use_mem_pool`: every stream of the thread),
//!   `pool_del a b` (the MemPool's destructor);
//! - `capture_begin a b stream` / `capture_end a b` (a CUDA graph capture on
//!   that stream into pool `a b`), `graph_del a b` (the graph's destructor).
//!
//! The entry named `oom_fraction_0.01` has no ops: it allocates 64 MiB blocks
//! under a 1% memory fraction until out-of-memory, and records
//! `allocs_before_oom`, the error message and the statistics after the failure.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use flate2::read::GzDecoder;
use serde::Deserialize;
use thiserror::Error;

use cachalot_core::allocator::{DeviceAllocator, PrivatePools};
use cachalot_core::backend::sim::{AddressOrder, SimBackend};
use cachalot_core::backend::{Backend, DevicePtr, StreamId};
use cachalot_core::config::{AllocatorConfig, MIB};
use cachalot_core::error::{format_size, Error, OomReport};
use cachalot_core::policy::pytorch::c10_stream_hash;
use cachalot_core::policy::PytorchAllocator;
use cachalot_core::private_pool::{PoolId, PoolOptions};

/// The device size the goldens were recorded on (an H100 80GB, as PyTorch saw it).
pub const H100_BYTES: u64 = 85_017_493_504;

/// Why a golden file could not be read.
#[derive(Debug, Error)]
pub enum GoldenError {
    /// The file could not be opened or decompressed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The failure.
        source: std::io::Error,
    },
    /// The file is not a list of golden entries.
    #[error("{path}: not a golden scenario file: {source}")]
    Format {
        /// The file.
        path: String,
        /// The failure.
        source: serde_json::Error,
    },
}

/// One step: `[op, args...]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(try_from = "Vec<serde_json::Value>")]
pub struct Op {
    /// The operation's name.
    pub name: String,
    /// Its integer arguments.
    pub args: Vec<u64>,
}

impl TryFrom<Vec<serde_json::Value>> for Op {
    type Error = String;

    fn try_from(v: Vec<serde_json::Value>) -> std::result::Result<Op, String> {
        let (name, rest) = v.split_first().ok_or("an empty operation")?;
        let name = name
            .as_str()
            .ok_or("an operation without a name")?
            .to_string();
        let args = rest
            .iter()
            .map(|a| {
                a.as_u64()
                    .ok_or_else(|| format!("{name}: argument {a} is not an integer"))
            })
            .collect::<std::result::Result<_, _>>()?;
        Ok(Op { name, args })
    }
}

impl Op {
    /// Argument `i`, or 0 where the operation has fewer.
    fn arg(&self, i: usize) -> u64 {
        self.args.get(i).copied().unwrap_or(0)
    }

    /// The pool named by arguments `i` and `i + 1`.
    fn pool(&self, i: usize) -> PoolId {
        PoolId(self.arg(i), self.arg(i + 1))
    }
}

/// One recorded scenario.
#[derive(Clone, Debug, Deserialize)]
pub struct GoldenEntry {
    /// Scenario name.
    pub name: String,
    /// The `PYTORCH_CUDA_ALLOC_CONF` it ran under.
    pub conf: String,
    /// Its steps (absent for the out-of-memory entry).
    #[serde(default)]
    pub ops: Option<Vec<Op>>,
    /// Statistics after each step.
    pub after: Vec<BTreeMap<String, i64>>,
    /// Device size (out-of-memory entry).
    #[serde(default)]
    pub total_memory: Option<u64>,
    /// 64 MiB allocations that succeeded before out-of-memory.
    #[serde(default)]
    pub allocs_before_oom: Option<u64>,
    /// PyTorch's out-of-memory message.
    #[serde(default)]
    pub message: Option<String>,
}

/// One disagreement with the recording.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mismatch {
    /// The step after which it was seen (`None` for whole-scenario facts).
    pub op: Option<usize>,
    /// The statistic or fact.
    pub key: String,
    /// The recorded value.
    pub expected: String,
    /// cachalot's value.
    pub got: String,
}

/// The result of replaying one scenario.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Scenario name.
    pub name: String,
    /// Steps replayed.
    pub ops: usize,
    /// Values compared.
    pub checked: usize,
    /// Disagreements, in order.
    pub mismatches: Vec<Mismatch>,
    /// What was deliberately not compared, and why.
    pub note: Option<String>,
}

impl Outcome {
    /// Whether every compared value agreed.
    pub fn passed(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// Reads a golden file (gzip or plain JSON).
///
/// # Errors
/// [`GoldenError`] when the file cannot be read or parsed.
pub fn load(path: &Path) -> Result<Vec<GoldenEntry>, GoldenError> {
    let shown = path.display().to_string();
    let io = |source| GoldenError::Io {
        path: shown.clone(),
        source,
    };
    let mut raw = Vec::new();
    BufReader::new(File::open(path).map_err(io)?)
        .read_to_end(&mut raw)
        .map_err(io)?;
    let text = if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(io)?;
        out
    } else {
        raw
    };
    serde_json::from_slice(&text).map_err(|source| GoldenError::Format {
        path: shown.clone(),
        source,
    })
}

/// Replays one entry through a fresh `pytorch` allocator on a simulated device of
/// `capacity` bytes (the entry's `total_memory` for the out-of-memory entry).
///
/// PyTorch breaks ties between equal-size cached blocks by address, and the
/// recording's addresses came from the CUDA driver, which handed out each new
/// segment below the previous ones; the simulated device does the same
/// ([`AddressOrder::Descending`]).
pub fn check(entry: &GoldenEntry, capacity: u64) -> Outcome {
    let capacity = entry
        .total_memory
        .filter(|_| entry.ops.is_none())
        .unwrap_or(capacity);
    let sim = SimBackend::new(capacity).with_address_order(AddressOrder::Descending);
    check_on(entry, Arc::new(sim), &SIM_STREAMS)
}

/// The streams a program's stream indices 1 and 2 stand for on the
/// simulated device (which knows every stream id).
const SIM_STREAMS: [StreamId; 2] = [StreamId(0x5001), StreamId(0x5002)];

/// Replays one entry through a fresh `pytorch` allocator on `backend` (a real GPU,
/// say), a program's stream index `i` (from 1) standing for `streams[i - 1]`
/// (streams of that backend; index 0 is the default stream). The
/// out-of-memory entry needs a device of the entry's `total_memory` bytes to
/// reproduce PyTorch's figures.
pub fn check_on(entry: &GoldenEntry, backend: Arc<dyn Backend>, streams: &[StreamId]) -> Outcome {
    let mut out = Outcome {
        name: entry.name.clone(),
        ..Outcome::default()
    };
    let config = match AllocatorConfig::parse(&entry.conf) {
        Ok(c) => c,
        Err(e) => return failed(out, "conf", &entry.conf, &e.to_string()),
    };
    let alloc = match PytorchAllocator::new(backend, config) {
        Ok(a) => a,
        Err(e) => return failed(out, "allocator", "created", &e.to_string()),
    };
    match &entry.ops {
        Some(ops) => replay(&alloc, ops, entry, streams, &mut out),
        None => check_oom(&alloc, entry, &mut out),
    }
    out
}

fn failed(mut out: Outcome, key: &str, expected: &str, got: &str) -> Outcome {
    out.mismatches.push(Mismatch {
        op: None,
        key: key.into(),
        expected: expected.into(),
        got: got.into(),
    });
    out
}

/// What a replayed program holds besides the allocator's state.
#[derive(Default)]
struct Held {
    /// Live tensors by id.
    live: HashMap<u64, DevicePtr>,
    /// Live CUDA graphs.
    graphs: usize,
    /// The RNG's two 8-byte tensors (seed, offset) that PyTorch allocates on
    /// the capturing stream when the first live graph begins its capture, and
    /// frees when the last live graph is destroyed.
    rng: Option<(DevicePtr, DevicePtr)>,
    /// The streams of stream indices 1, 2, ...
    streams: Vec<StreamId>,
}

/// The c10 ids of the recording's streams: the default stream, then the
/// first two `torch.cuda.Stream()`s of the process.
const C10_STREAM_IDS: [u64; 3] = [0, 3, 35];

fn replay(
    alloc: &PytorchAllocator,
    ops: &[Op],
    entry: &GoldenEntry,
    streams: &[StreamId],
    out: &mut Outcome,
) {
    let mut held = Held {
        streams: streams.to_vec(),
        ..Held::default()
    };
    for (i, id) in C10_STREAM_IDS.iter().enumerate() {
        if let Ok(s) = stream(streams, i as u64) {
            alloc.set_stream_hash(s, c10_stream_hash(0, *id));
        }
    }
    for (i, op) in ops.iter().enumerate() {
        out.ops += 1;
        if let Err(e) = step(alloc, op, &mut held) {
            let m = Mismatch {
                op: Some(i),
                key: format!("{} {:?}", op.name, op.args),
                expected: "ok".into(),
                got: e.to_string(),
            };
            out.mismatches.push(m);
            return;
        }
        if let Some(want) = entry.after.get(i) {
            compare(&alloc.stats().to_map(), want, Some(i), |_| true, out);
        }
    }
}

/// The stream of a program's stream index (0: the default stream; `i`:
/// `streams[i - 1]`).
fn stream(streams: &[StreamId], index: u64) -> Result<StreamId, Error> {
    match index {
        0 => Ok(StreamId::DEFAULT),
        i => streams.get(i as usize - 1).copied().ok_or_else(|| {
            Error::InvalidArgument(format!("stream index {i} past the replay's streams"))
        }),
    }
}

fn step(alloc: &PytorchAllocator, op: &Op, held: &mut Held) -> Result<(), Error> {
    let (live, streams) = (&mut held.live, &held.streams);
    let tensor = |id: u64| {
        live.get(&id)
            .copied()
            .ok_or_else(|| Error::InvalidArgument(format!("unknown tensor id {id}")))
    };
    match op.name.as_str() {
        "alloc" => {
            let p = alloc.malloc(op.arg(1), stream(streams, op.arg(2))?)?;
            live.insert(op.arg(0), p);
            Ok(())
        }
        "free" => {
            let p = tensor(op.arg(0))?;
            live.remove(&op.arg(0));
            alloc.free(p)
        }
        "record" => alloc.record_stream(tensor(op.arg(0))?, stream(streams, op.arg(1))?),
        "empty_cache" => alloc.empty_cache(),
        "reset_peak" => {
            alloc.reset_peak_stats();
            Ok(())
        }
        "pool_new" => {
            let pool = op.pool(0);
            alloc.create_pool(pool)?;
            let options = PoolOptions {
                use_on_oom: op.arg(2) != 0,
                no_split: op.arg(3) != 0,
            };
            alloc.set_pool_options(pool, options)
        }
        "pool_enter" => alloc.begin_allocate_to_pool(op.pool(0), Arc::new(|_| true)),
        "pool_exit" | "capture_end" => {
            alloc.end_allocate_to_pool(op.pool(0))?;
            if op.name == "pool_exit" {
                alloc.release_pool(op.pool(0))?;
            }
            Ok(())
        }
        "pool_del" => {
            // As PyTorch's ~MemPool: no longer borrowed from, released, emptied.
            let pool = op.pool(0);
            let options = PoolOptions {
                use_on_oom: false,
                ..alloc.pool_options(pool)?
            };
            alloc.set_pool_options(pool, options)?;
            alloc.release_pool(pool)?;
            alloc.empty_pool_cache(pool)
        }
        "capture_begin" => {
            let on = stream(streams, op.arg(2))?;
            if held.graphs == 0 {
                held.rng = Some((alloc.malloc(8, on)?, alloc.malloc(8, on)?));
            }
            held.graphs += 1;
            alloc.begin_allocate_to_pool(op.pool(0), Arc::new(move |s| s == on))
        }
        "graph_del" => {
            alloc.release_pool(op.pool(0))?;
            held.graphs = held.graphs.saturating_sub(1);
            match held.rng.take() {
                Some((seed, offset)) if held.graphs == 0 => {
                    alloc.free(seed)?;
                    alloc.free(offset)
                }
                kept => {
                    held.rng = kept;
                    Ok(())
                }
            }
        }
        other => Err(Error::InvalidArgument(format!("unknown op {other}"))),
    }
}

fn compare(
    have: &BTreeMap<String, i64>,
    want: &BTreeMap<String, i64>,
    op: Option<usize>,
    pick: impl Fn(&str) -> bool,
    out: &mut Outcome,
) {
    for (key, expected) in want.iter().filter(|(k, _)| pick(k)) {
        out.checked += 1;
        let got = have.get(key);
        if got != Some(expected) {
            let got = got.map_or_else(|| "missing".to_string(), |g| g.to_string());
            out.mismatches.push(Mismatch {
                op,
                key: key.clone(),
                expected: expected.to_string(),
                got,
            });
        }
    }
}

/// The recorded cumulative counters and peaks of this entry include work the
/// recording process did before it, which the file does not describe.
const OOM_NOTE: &str =
    "compared .current keys, num_alloc_retries, num_ooms and the message figures; \
     the recorded peaks and num_device_alloc/num_device_free include the recorder's earlier work, \
     which the file does not describe, so they are not compared";

fn check_oom(alloc: &PytorchAllocator, entry: &GoldenEntry, out: &mut Outcome) {
    out.note = Some(OOM_NOTE.into());
    if let Err(e) = alloc.set_memory_fraction(0.01) {
        out.mismatches.push(Mismatch {
            op: None,
            key: "fraction".into(),
            expected: "ok".into(),
            got: e.to_string(),
        });
        return;
    }
    let mut count = 0u64;
    let report = loop {
        match alloc.malloc(64 * MIB, StreamId::DEFAULT) {
            Ok(_) if count < 1_000_000 => count += 1,
            Ok(_) => break None,
            Err(Error::OutOfMemory(r)) => break Some(r),
            Err(e) => {
                let m = Mismatch {
                    op: None,
                    key: "malloc".into(),
                    expected: "ok or OOM".into(),
                    got: e.to_string(),
                };
                out.mismatches.push(m);
                return;
            }
        }
    };
    out.ops = count as usize + 1;
    if let Some(want) = entry.allocs_before_oom {
        out.checked += 1;
        if want != count {
            let m = Mismatch {
                op: None,
                key: "allocs_before_oom".into(),
                expected: want.to_string(),
                got: count.to_string(),
            };
            out.mismatches.push(m);
        }
    }
    if let Some(want) = entry.after.first() {
        let pick = |k: &str| k.ends_with(".current") || k == "num_alloc_retries" || k == "num_ooms";
        compare(&alloc.stats().to_map(), want, None, pick, out);
    }
    match (report, &entry.message) {
        (Some(r), Some(msg)) => compare_message(&r, msg, out),
        (None, _) => out.mismatches.push(Mismatch {
            op: None,
            key: "oom".into(),
            expected: "out of memory".into(),
            got: "no failure".into(),
        }),
        (Some(_), None) => {}
    }
}

/// Compares the allocator-dependent figures of PyTorch's message with ours.
fn compare_message(report: &OomReport, msg: &str, out: &mut Outcome) {
    let ours = [
        ("tried to allocate", Some(format_size(report.alloc_size))),
        ("allowed", report.allowed.map(format_size)),
        ("allocated", Some(format_size(report.allocated))),
        (
            "reserved but unallocated",
            Some(format_size(report.reserved_unallocated())),
        ),
    ];
    for ((key, got), expected) in ours.into_iter().zip(message_figures(msg)) {
        out.checked += 1;
        let got = got.unwrap_or_else(|| "none".into());
        let expected = expected.unwrap_or_else(|| "unreadable".into());
        if got != expected {
            out.mismatches.push(Mismatch {
                op: None,
                key: format!("message: {key}"),
                expected,
                got,
            });
        }
    }
}

/// The figures of a PyTorch out-of-memory message: tried to allocate, allowed,
/// allocated, reserved but unallocated.
fn message_figures(msg: &str) -> [Option<String>; 4] {
    let between = |text: &str, start: &str, end: &str| -> Option<String> {
        let from = text.find(start)? + start.len();
        let len = text[from..].find(end)?;
        Some(text[from..from + len].to_string())
    };
    let allowed = msg.find(" allowed; ").map(|at| {
        let head = &msg[..at];
        head.rfind(". ")
            .map_or(head, |p| &head[p + 2..])
            .to_string()
    });
    let tail = msg.find(" is allocated by").map_or("", |at| &msg[at..]);
    [
        between(msg, "Tried to allocate ", ". GPU"),
        allowed,
        between(msg, "Of the allocated memory ", " is allocated by"),
        between(tail, ", and ", " is reserved by"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_message_figures() {
        let msg = "CUDA out of memory. Tried to allocate 64.00 MiB. GPU 0 has a total capacity of 79.18 GiB of \
                   which 76.02 GiB is free. Process 428 has 1.88 GiB memory in use. 810.79 MiB allowed; Of the \
                   allocated memory 768.00 MiB is allocated by PyTorch, and 12.00 MiB is reserved by PyTorch but \
                   unallocated. If reserved";
        let f = message_figures(msg);
        assert_eq!(f[0].as_deref(), Some("64.00 MiB"));
        assert_eq!(f[1].as_deref(), Some("810.79 MiB"));
        assert_eq!(f[2].as_deref(), Some("768.00 MiB"));
        assert_eq!(f[3].as_deref(), Some("12.00 MiB"));
    }
}
