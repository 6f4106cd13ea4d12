//! Golden scenarios: PyTorch 2.11's `memory_stats()` recorded after each step of
//! small allocation programs, and the check that replays them through the
//! `pytorch` policy on a simulated device.
//!
//! A golden file (`scenarios.<conf>.json.gz`) is a list of entries
//! `{name, conf, ops, after}`: `ops[i]` is `[op, id, size]` with op `alloc`, `free`
//! or `empty_cache`, and `after[i]` the recorded statistics after op `i`. The
//! entry named `oom_fraction_0.01` has no ops: it allocates 64 MiB blocks under a
//! 1% memory fraction until out-of-memory, and records `allocs_before_oom`, the
//! error message and the statistics after the failure.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::Arc;

use flate2::read::GzDecoder;
use serde::Deserialize;
use thiserror::Error;

use crate::allocator::DeviceAllocator;
use crate::backend::sim::SimBackend;
use crate::backend::{Backend, StreamId};
use crate::config::{AllocatorConfig, MIB};
use crate::error::{format_size, Error, OomReport};
use crate::policy::PytorchAllocator;

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

/// One step: `[op, id, size]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct Op(pub String, pub u64, pub u64);

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
pub fn check(entry: &GoldenEntry, capacity: u64) -> Outcome {
    let capacity = entry
        .total_memory
        .filter(|_| entry.ops.is_none())
        .unwrap_or(capacity);
    check_on(entry, Arc::new(SimBackend::new(capacity)))
}

/// Replays one entry through a fresh `pytorch` allocator on `backend` (a real GPU,
/// say). The out-of-memory entry needs a device of the entry's `total_memory`
/// bytes to reproduce PyTorch's figures.
pub fn check_on(entry: &GoldenEntry, backend: Arc<dyn Backend>) -> Outcome {
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
        Some(ops) => replay(&alloc, ops, entry, &mut out),
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

fn replay(alloc: &PytorchAllocator, ops: &[Op], entry: &GoldenEntry, out: &mut Outcome) {
    let mut live = HashMap::new();
    for (i, Op(op, id, size)) in ops.iter().enumerate() {
        let done = match op.as_str() {
            "alloc" => alloc.malloc(*size, StreamId::DEFAULT).map(|p| {
                live.insert(*id, p);
            }),
            "free" => match live.remove(id) {
                Some(p) => alloc.free(p),
                None => Err(Error::InvalidArgument(format!("free of unknown id {id}"))),
            },
            "empty_cache" => alloc.empty_cache(),
            other => Err(Error::InvalidArgument(format!("unknown op {other}"))),
        };
        out.ops += 1;
        if let Err(e) = done {
            let m = Mismatch {
                op: Some(i),
                key: format!("{op} {id} {size}"),
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
