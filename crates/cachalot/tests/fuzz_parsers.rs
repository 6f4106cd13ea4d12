//! Randomized robustness of the readers, run in every test suite (the `fuzz/`
//! crate runs the trace readers under libFuzzer): random bytes, and real
//! recordings, statistics, snapshots, allocator settings and tuner spaces with
//! random bytes changed, inserted or cut, must give a value or a typed error,
//! never a panic.

use std::io::Read;
use std::path::PathBuf;

use cachalot::replay::{plan, RecordedDevice, H100_CAPACITY};
use std::sync::Arc;

use cachalot::backend::sim::SimBackend;
use cachalot::policy::PytorchAllocator;
use cachalot::snapshot_io::{json, SnapshotDump};
use cachalot::trace::pickle::snapshot_from_slice;
use cachalot::trace::stats::read_stats;
use cachalot::trace::{read_recording, ReadLimits};
use cachalot::tune::Space;
use cachalot::{AllocatorConfig, DeviceAllocator, StreamId};
use proptest::prelude::*;

fn limits() -> ReadLimits {
    ReadLimits {
        max_input_bytes: 1 << 22,
        max_values: 1 << 20,
        ..ReadLimits::default()
    }
}

fn data(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/traces")
        .join(name);
    let mut out = Vec::new();
    let file = std::fs::File::open(&path).expect("bundled recording");
    flate2::read::GzDecoder::new(file)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}

/// Reads `bytes` both ways and plans whatever reads.
fn exercise(bytes: &[u8]) {
    if let Ok(recording) = read_recording(bytes, &limits()) {
        let device = RecordedDevice::new(H100_CAPACITY, AllocatorConfig::default());
        let _ = plan(&recording.events, &device);
    }
    let _ = snapshot_from_slice(bytes, &limits());
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(usize, u8),
    Insert(usize, Vec<u8>),
    Cut(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<usize>(), 1usize..64).prop_map(|(i, n)| Mutation::Cut(i, n)),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = bytes.len().max(1);
        match m {
            Mutation::Set(i, b) => {
                if let Some(x) = bytes.get_mut(i % len) {
                    *x = *b;
                }
            }
            Mutation::Insert(i, v) => {
                let at = i % (bytes.len() + 1);
                bytes.splice(at..at, v.iter().copied());
            }
            Mutation::Cut(i, n) => {
                let at = i % len;
                let end = (at + n).min(bytes.len());
                if at < end {
                    bytes.drain(at..end);
                }
            }
        }
    }
    bytes
}

/// A JSON snapshot of a small allocator's state (three blocks, one freed).
fn json_snapshot() -> Vec<u8> {
    let alloc = PytorchAllocator::new(
        Arc::new(SimBackend::new(1 << 30)),
        AllocatorConfig::default(),
    )
    .expect("the default config is valid");
    let ptrs: Vec<u64> = [512, 3 << 20, 30 << 20]
        .iter()
        .map(|size| alloc.malloc(*size, StreamId::DEFAULT).expect("room"))
        .collect();
    alloc.free(ptrs[1]).expect("live");
    let mut bytes = Vec::new();
    json::write(&SnapshotDump::capture(&alloc, None), &mut bytes).expect("writes");
    bytes
}

/// Settings as PYTORCH_CUDA_ALLOC_CONF spells them, valid, to mutate.
const SETTINGS: &str = "expandable_segments:True,max_split_size_mb:256,\
garbage_collection_threshold:0.8,roundup_power2_divisions:[256:1,512:2,>:4]";

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mutated_stats_never_panic(mutations in proptest::collection::vec(mutation(), 1..8)) {
        let bytes = mutate(data("resnet50.native.stats.json.gz"), &mutations);
        let _ = read_stats(&bytes[..], &limits());
    }

    #[test]
    fn mutated_json_snapshots_never_panic(mutations in proptest::collection::vec(mutation(), 1..8)) {
        let _ = json::read(&mutate(json_snapshot(), &mutations));
    }

    #[test]
    fn mutated_settings_never_panic(mutations in proptest::collection::vec(mutation(), 1..6)) {
        let bytes = mutate(SETTINGS.as_bytes().to_vec(), &mutations);
        let text = String::from_utf8_lossy(&bytes);
        let _ = AllocatorConfig::parse(&text);
        let _ = Space::from_specs(&[text.replace(':', "=")]);
    }

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        exercise(&bytes);
    }

    #[test]
    fn random_pickle_opcodes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut bytes = vec![0x80, 4];
        bytes.extend(body);
        bytes.push(b'.');
        exercise(&bytes);
    }

    #[test]
    fn mutated_snapshots_never_panic(mutations in proptest::collection::vec(mutation(), 1..8)) {
        exercise(&mutate(data("seed002.native.snapshot.pickle.gz"), &mutations));
    }

    #[test]
    fn mutated_traces_never_panic(mutations in proptest::collection::vec(mutation(), 1..8)) {
        exercise(&mutate(data("seed002.native.trace.csv.gz"), &mutations));
    }
}

#[test]
fn every_pickle_protocol_reads_the_same_snapshot() {
    let reference = snapshot_from_slice(&data("seed002.native.snapshot.pickle.gz"), &limits())
        .expect("protocol 4");
    assert_eq!(reference.device_traces[0].len(), 24);
    for proto in [2, 3, 5] {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/data/seed002.p{proto}.pickle"));
        let bytes = std::fs::read(path).expect("fixture");
        let snap = snapshot_from_slice(&bytes, &limits())
            .unwrap_or_else(|e| panic!("protocol {proto}: {e}"));
        assert_eq!(snap, reference, "protocol {proto}");
    }
}

/// The input libFuzzer's `trace_csv` found: a frozenset of NaN floats, whose
/// sort inside serde-pickle panicked when it decoded snapshots; the reader of
/// our own never sorts, and a set is not a snapshot.
#[test]
fn a_set_of_floats_is_an_error_not_a_panic() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/fuzz-frozenset-of-floats.pickle");
    let bytes = std::fs::read(path).expect("fixture");
    let err = read_recording(&bytes[..], &limits()).expect_err("refused");
    assert!(
        err.to_string().contains("snapshot: expected a dict"),
        "{err}"
    );
    exercise(&bytes);
}

#[test]
fn every_truncation_of_a_snapshot_is_an_error() {
    let bytes = data("seed002.native.snapshot.pickle.gz");
    for cut in 0..bytes.len() {
        assert!(
            snapshot_from_slice(&bytes[..cut], &limits()).is_err(),
            "cut at {cut}"
        );
    }
}

/// The inputs the mutation tests start from read as they are.
#[test]
fn the_unmutated_inputs_read() {
    read_stats(&data("resnet50.native.stats.json.gz")[..], &limits()).expect("stats");
    json::read(&json_snapshot()).expect("snapshot");
    AllocatorConfig::parse(SETTINGS).expect("settings");
}
