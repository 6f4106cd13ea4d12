//! Replay throughput on the bundled recordings: each is read and planned once,
//! outside the timed loop; one iteration builds a fresh allocator on a fresh
//! simulated device and replays the whole plan under the recorded configuration.
//!
//! Two synthetic plans time the paths a recording can make hot, under both
//! policies: 100,000 out-of-memory failures (never-freed 1 MiB allocations past a
//! full 64 MiB device) and 100,000 streams (each used for one allocation).

use std::path::PathBuf;

use cachalot::replay::{plan, replay, Op, Plan, Workload};
use cachalot::trace::ReadLimits;
use cachalot::{AllocatorConfig, StreamId};
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

const MIB: u64 = 1 << 20;
const MANY: u32 = 100_000;

/// `MANY` allocations past what a 64 MiB device holds, none freed.
fn ooms() -> Plan {
    let ops = (0..MANY + 64)
        .map(|slot| Op::Alloc {
            slot,
            size: MIB,
            stream: StreamId::DEFAULT,
        })
        .collect();
    synthetic(ops, MANY as usize + 64)
}

/// `MANY` streams, each allocating and freeing once.
fn streams() -> Plan {
    let ops = (0..MANY)
        .flat_map(|slot| {
            let stream = StreamId(u64::from(slot) + 1);
            [
                Op::Alloc {
                    slot,
                    size: 512,
                    stream,
                },
                Op::Free { slot },
            ]
        })
        .collect();
    synthetic(ops, MANY as usize)
}

fn synthetic(ops: Vec<Op>, slots: usize) -> Plan {
    Plan {
        events: ops.len(),
        ops,
        slots,
        ..Plan::default()
    }
}

fn bench_synthetic(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay_synthetic");
    group.sample_size(10);
    let cases = [
        ("oom_100k", ooms(), 64 * MIB),
        ("streams_100k", streams(), 80 << 30),
    ];
    for (name, plan, capacity) in cases {
        for policy in ["pytorch", "cachalot"] {
            let config = AllocatorConfig::parse(&format!("policy:{policy}")).expect("parses");
            group.bench_function(format!("{name}/{policy}"), |b| {
                b.iter(|| {
                    replay(&plan, config.clone(), capacity, &mut |_| {}).expect("replay runs")
                })
            });
        }
    }
    group.finish();
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

criterion_group!(benches, bench_replay, bench_synthetic);
criterion_main!(benches);
