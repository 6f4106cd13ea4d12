//! A tiny reader and replayer of recorded PyTorch trace CSVs, for the policy's
//! trace tests and benches (the full replay engine lives elsewhere).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use cachalot::backend::counting::Counting;
use cachalot::backend::sim::SimBackend;
use cachalot::{DeviceAllocator, StreamId};

/// One replayed operation: an allocation of `size` bytes known by its recorded
/// address, or the free of that address.
#[derive(Copy, Clone, Debug)]
pub struct Op {
    pub alloc: bool,
    pub addr: u64,
    pub size: u64,
}

/// The bundled training and inference traces.
pub const TRACES: [&str; 5] = [
    "resnet50",
    "vit_train_bf16",
    "gpt2_train",
    "bert_dynamic",
    "llama_train_bf16",
];

/// `data/traces` of the repository.
pub fn traces_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/traces")
}

fn gunzip(path: &Path) -> String {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut text = String::new();
    flate2::read::GzDecoder::new(file)
        .read_to_string(&mut text)
        .expect("a gzip text file");
    text
}

/// The allocs and completed frees of `data/traces/<name>.native.trace.csv.gz`.
pub fn load(name: &str) -> Vec<Op> {
    let text = gunzip(&traces_dir().join(format!("{name}.native.trace.csv.gz")));
    let mut ops = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let alloc = match f[1] {
            "alloc" => true,
            "free_completed" => false,
            _ => continue,
        };
        ops.push(Op {
            alloc,
            addr: f[2].parse().expect("address"),
            size: f[3].parse().expect("size"),
        });
    }
    ops
}

/// PyTorch expandable_segments' peak reserved / peak requested on this trace.
pub fn expandable_ratio(name: &str) -> f64 {
    let text = gunzip(&traces_dir().join(format!("{name}.expandable.stats.json.gz")));
    let v: serde_json::Value = serde_json::from_str(&text).expect("stats json");
    let m = &v["memory_stats"];
    m["reserved_bytes.all.peak"].as_f64().expect("reserved")
        / m["requested_bytes.all.peak"].as_f64().expect("requested")
}

/// The op index where the training loop is steady: the loop is the earliest
/// start from which the sequence of allocation sizes repeats with some period of
/// at least 100 allocations, for at least two periods; it is steady after its
/// first iteration (setup, the first step and the first loop iteration, which
/// may still grow memory, come before). `None` for traces without such a loop.
pub fn steady_start(ops: &[Op]) -> Option<usize> {
    let sizes: Vec<u64> = ops.iter().filter(|o| o.alloc).map(|o| o.size).collect();
    let n = sizes.len();
    let mut best: Option<(usize, usize)> = None;
    for p in 100..n / 2 {
        let mut s = n - p;
        while s > 0 && sizes[s - 1] == sizes[s - 1 + p] {
            s -= 1;
        }
        if n - s >= 2 * p && best.is_none_or(|(b, _)| s < b) {
            best = Some((s, p));
        }
    }
    let (start, period) = best?;
    let start_alloc = start + period;
    let mut allocs = 0;
    ops.iter().position(|o| {
        allocs += usize::from(o.alloc);
        o.alloc && allocs > start_alloc
    })
}

/// What one replay measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub peak_requested: u64,
    pub peak_reserved: u64,
    pub memory_calls: u64,
    pub steady_ops: u64,
    pub steady_calls: u64,
}

impl Outcome {
    pub fn ratio(&self) -> f64 {
        self.peak_reserved as f64 / self.peak_requested as f64
    }
}

/// Replays `ops` on stream 0, validating every `validate_every` ops (0 = never).
pub fn replay(
    alloc: &dyn DeviceAllocator,
    sim: &Counting<SimBackend>,
    ops: &[Op],
    validate_every: usize,
) -> Outcome {
    let steady = steady_start(ops);
    let mut live: HashMap<u64, u64> = HashMap::new();
    let mut at_steady = None;
    for (i, op) in ops.iter().enumerate() {
        if Some(i) == steady {
            at_steady = Some(sim.counts().memory_calls());
        }
        if op.alloc {
            let ptr = alloc
                .malloc(op.size, StreamId(0))
                .expect("the trace fits the device");
            live.insert(op.addr, ptr);
        } else if let Some(ptr) = live.remove(&op.addr) {
            alloc.free(ptr).expect("a live allocation");
        }
        if validate_every > 0 && i % validate_every == 0 {
            alloc.validate().expect("invariants hold");
        }
    }
    let stats = alloc.stats();
    let calls = sim.counts().memory_calls();
    Outcome {
        peak_requested: stats.requested_bytes.all.peak as u64,
        peak_reserved: stats.reserved_bytes.all.peak as u64,
        memory_calls: calls,
        steady_ops: steady.map_or(0, |s| (ops.len() - s) as u64),
        steady_calls: at_steady.map_or(0, |c| calls - c),
    }
}
