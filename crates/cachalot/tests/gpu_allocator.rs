//! Both policies on a real GPU: PyTorch's golden statistics reproduced on the
//! device, and a memory-integrity stress that fills every live allocation with its
//! own pattern and checks it before each free, with frees while another stream
//! still has work queued on the block. Each test prints "skipped: no GPU (...)" and
//! passes where no GPU is present.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cachalot::backend::cuda::CudaBackend;
use cachalot::backend::{Backend, StreamId};
use cachalot::{allocator, golden, AllocatorConfig, PolicyKind};
use cachalot_testkit::lcg::Lcg;

fn gpu() -> Option<Arc<CudaBackend>> {
    match CudaBackend::new(0) {
        Ok(gpu) => Some(Arc::new(gpu)),
        Err(e) => {
            eprintln!("skipped: no GPU ({e})");
            None
        }
    }
}

/// data/golden, found from the working directory (scripts/gpu.sh runs from the
/// repository root) or from this crate's source folder.
fn golden_dir() -> Option<PathBuf> {
    let here = PathBuf::from("data/golden");
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/golden");
    [here, source].into_iter().find(|p| p.is_dir())
}

#[test]
fn golden_parity_on_the_gpu() {
    let Some(gpu) = gpu() else { return };
    let Some(dir) = golden_dir() else {
        panic!("data/golden not found")
    };
    let total = gpu.capabilities().total_memory;
    drop(gpu);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("golden folder")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".json.gz"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    let (mut passed, mut failed, mut skipped, mut differ) = (0, 0, 0, 0);
    for file in files {
        for entry in golden::load(&file).expect("golden file") {
            if entry.ops.is_none() && entry.total_memory != Some(total) {
                eprintln!(
                    "{}: skipped (recorded on a device of {:?} bytes, this one has {total})",
                    entry.name, entry.total_memory
                );
                skipped += 1;
                continue;
            }
            let gpu = Arc::new(CudaBackend::new(0).expect("GPU"));
            let streams = [0; 2].map(|_| gpu.create_stream().expect("a stream"));
            let backend: Arc<dyn Backend> = gpu.clone();
            let outcome = golden::check_on(&entry, backend, &streams);
            for s in streams {
                gpu.destroy_stream(s).expect("stream destroyed");
            }
            let simulated = golden::check(&entry, total);
            if format!("{:?}", outcome.mismatches) != format!("{:?}", simulated.mismatches) {
                differ += 1;
                eprintln!("{}: the GPU and the simulator disagree", outcome.name);
            }
            if outcome.passed() {
                passed += 1;
            } else {
                failed += 1;
                let first = outcome.mismatches.first();
                eprintln!("{} {}: FAILED {first:?}", file.display(), outcome.name);
            }
        }
    }
    eprintln!("golden parity on the GPU: {passed} passed, {failed} failed, {skipped} skipped; {differ} differ from the simulator");
    assert_eq!(differ, 0, "the backend changed an outcome");
    assert_eq!(failed, 0);
    assert!(passed > 0);
}

struct Live {
    ptr: u64,
    size: u64,
    stream: StreamId,
    pattern: u32,
}

/// The words to check of an allocation: all of it up to 192 KiB, else 64 KiB at
/// the start, the middle and the end.
fn spans(size: u64) -> Vec<(u64, u64)> {
    let words = size / 4 * 4;
    let chunk = 64 << 10;
    if words <= 3 * chunk {
        return vec![(0, words)];
    }
    let mid = (words / 2) / 4 * 4;
    vec![(0, chunk), (mid, chunk), (words - chunk, chunk)]
}

fn verify(gpu: &CudaBackend, a: &Live) -> Result<(), String> {
    // Everything queued anywhere (delayed writes on other streams too) lands first.
    gpu.synchronize_device().map_err(|e| e.to_string())?;
    for (offset, len) in spans(a.size) {
        let mut host = vec![0u8; len as usize];
        gpu.copy_to_host(a.ptr + offset, &mut host, a.stream)
            .map_err(|e| e.to_string())?;
        if let Some(i) = host
            .chunks_exact(4)
            .position(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) != a.pattern)
        {
            return Err(format!(
                "allocation at {:#x} ({} bytes) overwritten at byte {}",
                a.ptr,
                a.size,
                offset + 4 * i as u64
            ));
        }
    }
    Ok(())
}

fn fill(gpu: &CudaBackend, a: &Live, value: u32, stream: StreamId) {
    let words = a.size / 4;
    if words > 0 {
        gpu.fill_u32(a.ptr, value, words, stream).expect("fill");
    }
}

fn no_overlap(live: &BTreeMap<u64, Live>, ptr: u64, size: u64) -> bool {
    let before = live
        .range(..ptr)
        .next_back()
        .is_none_or(|(p, a)| p + a.size <= ptr);
    let after = live
        .range(ptr..)
        .next()
        .is_none_or(|(p, _)| *p >= ptr + size);
    before && after
}

fn stress(policy: PolicyKind, steps: usize, seed: u64) {
    let Some(gpu) = gpu() else { return };
    let mut config = AllocatorConfig::default();
    config.policy = policy;
    let backend: Arc<dyn Backend> = gpu.clone();
    let alloc = allocator::create(backend, config).expect("allocator");
    let streams = [
        StreamId::DEFAULT,
        gpu.create_stream().expect("stream"),
        gpu.create_stream().expect("stream"),
    ];
    let mut rng = Lcg(seed);
    let mut live: BTreeMap<u64, Live> = BTreeMap::new();
    let mut next_pattern = 0x1000_0001u32;
    let (mut cross, mut checked) = (0, 0);
    for step in 0..steps {
        let free_now = !live.is_empty() && (live.len() > 60 || rng.below(100) < 45);
        if free_now {
            let key = *live
                .keys()
                .nth(rng.below(live.len() as u64) as usize)
                .expect("non-empty");
            let a = live.remove(&key).expect("present");
            verify(&gpu, &a).unwrap_or_else(|e| panic!("{policy:?} step {step}: {e}"));
            checked += 1;
            if rng.below(10) == 0 {
                // Another stream writes the block after a delay, then the caller frees
                // it: the block must not be handed out again until that write is done.
                let other = streams[(streams.iter().position(|s| *s == a.stream).expect("known")
                    + 1)
                    % streams.len()];
                gpu.delay_stream(other, Duration::from_millis(3))
                    .expect("delay");
                fill(&gpu, &a, 0xDEAD_BEEF, other);
                alloc.record_stream(a.ptr, other).expect("record_stream");
                cross += 1;
            }
            alloc.free(a.ptr).expect("free");
        } else {
            let size = match rng.below(10) {
                0..=5 => 4 * (1 + rng.below(64 << 10)),
                6..=8 => (1 << 20) + 4 * rng.below(4 << 20),
                _ => (20 << 20) + 4 * rng.below(8 << 20),
            };
            let stream = streams[rng.below(3) as usize];
            let ptr = alloc.malloc(size, stream).expect("malloc");
            assert!(
                no_overlap(&live, ptr, size),
                "{policy:?} step {step}: {size} bytes at {ptr:#x} overlap a live allocation"
            );
            next_pattern = next_pattern.wrapping_add(0x9E37_79B1) | 1;
            let a = Live {
                ptr,
                size,
                stream,
                pattern: next_pattern,
            };
            fill(&gpu, &a, a.pattern, stream);
            live.insert(ptr, a);
        }
        alloc
            .validate()
            .unwrap_or_else(|e| panic!("{policy:?} step {step}: {e}"));
    }
    for (_, a) in std::mem::take(&mut live) {
        verify(&gpu, &a).expect("final check");
        alloc.free(a.ptr).expect("free");
    }
    gpu.synchronize_device().expect("sync");
    alloc.empty_cache().expect("empty cache");
    alloc.validate().expect("valid at the end");
    assert_eq!(alloc.memory_reserved(), 0, "{policy:?}: cache not emptied");
    drop(alloc);
    for s in &streams[1..] {
        gpu.destroy_stream(*s).expect("destroy stream");
    }
    assert_eq!(gpu.live_bytes(), 0, "{policy:?}: device memory leaked");
    eprintln!("{policy:?}: {steps} steps, {checked} allocations checked, {cross} freed with work pending on another stream");
}

#[test]
fn integrity_stress_pytorch_policy() {
    stress(PolicyKind::Pytorch, 3000, 11);
}

#[test]
fn integrity_stress_cachalot_policy() {
    stress(PolicyKind::Cachalot, 3000, 12);
}

#[test]
fn both_policies_agree_with_the_simulator_on_reserved_bytes() {
    use cachalot::backend::sim::SimBackend;
    let Some(gpu) = gpu() else { return };
    for policy in [PolicyKind::Pytorch, PolicyKind::Cachalot] {
        let mut reserved = Vec::new();
        let backends: [Arc<dyn Backend>; 2] = [
            gpu.clone(),
            Arc::new(SimBackend::new(gpu.capabilities().total_memory)),
        ];
        for backend in backends {
            let mut config = AllocatorConfig::default();
            config.policy = policy;
            let alloc = allocator::create(backend, config).expect("allocator");
            let mut rng = Lcg(99);
            let mut ptrs: HashMap<u64, u64> = HashMap::new();
            for i in 0..4000u64 {
                if !ptrs.is_empty() && rng.below(2) == 0 {
                    let key = *ptrs.keys().min().expect("non-empty");
                    alloc
                        .free(ptrs.remove(&key).expect("present"))
                        .expect("free");
                } else {
                    let limit = if rng.below(4) == 0 { 64 << 20 } else { 1 << 20 };
                    let size = 1 + rng.below(limit);
                    ptrs.insert(i, alloc.malloc(size, StreamId::DEFAULT).expect("malloc"));
                }
            }
            reserved.push((alloc.memory_reserved(), alloc.max_memory_reserved()));
            for (_, p) in ptrs {
                alloc.free(p).expect("free");
            }
            alloc.empty_cache().expect("empty");
        }
        eprintln!(
            "{policy:?}: reserved (current, peak) on the GPU {:?}, simulated {:?}",
            reserved[0], reserved[1]
        );
        assert_eq!(
            reserved[0], reserved[1],
            "{policy:?}: the GPU and the simulator disagree"
        );
    }
}
