//! Replay throughput on the bundled recordings: each is read and planned once,
//! outside the timed loop; one iteration builds a fresh allocator on a fresh
//! simulated device and replays the whole plan under the recorded configuration.

use std::path::PathBuf;

use cachalot::replay::{plan, replay, Plan, Workload};
use cachalot::trace::ReadLimits;
use cachalot::AllocatorConfig;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

struct Case {
    name: String,
    plan: Plan,
    config: AllocatorConfig,
    capacity: u64,
}

fn cases() -> Vec<Case> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/traces");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("data/traces exists")
        .map(|e| e.expect("readable directory").path())
        .filter(|p| p.to_string_lossy().ends_with(".trace.csv.gz"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let workload = Workload::open(&path, &ReadLimits::default()).expect("recording reads");
            let device = workload.recorded_device().expect("recorded conf parses");
            let plan = plan(&workload.recording.events, &device).expect("recording is consistent");
            let name = path
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .replace(".trace.csv.gz", "");
            Case {
                name,
                plan,
                config: device.config,
                capacity: device.capacity,
            }
        })
        .collect()
}

fn bench_replay(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    for case in cases() {
        group.throughput(Throughput::Elements(case.plan.events as u64));
        group.bench_function(&case.name, |b| {
            b.iter(|| {
                replay(&case.plan, case.config.clone(), case.capacity, &mut |_| {})
                    .expect("replay runs")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_replay);
criterion_main!(benches);
