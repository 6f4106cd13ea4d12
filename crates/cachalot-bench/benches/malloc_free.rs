//! ns per malloc+free for the `pytorch` policy on the simulated device (cache
//! hits in steady state), a reference for later policy work.

use std::hint::black_box;
use std::sync::Arc;

use cachalot::backend::sim::SimBackend;
use cachalot::{AllocatorConfig, DeviceAllocator, PytorchAllocator, StreamId};
use criterion::{criterion_group, criterion_main, Criterion};

fn allocator(conf: &str) -> PytorchAllocator {
    let backend = Arc::new(SimBackend::h100());
    PytorchAllocator::new(
        backend,
        AllocatorConfig::parse(conf).expect("valid bench conf"),
    )
    .expect("allocator")
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("pytorch_malloc_free");
    for (name, conf) in [("native", ""), ("expandable", "expandable_segments:True")] {
        for (label, size) in [("4KiB", 4096u64), ("8MiB", 8 << 20), ("64MiB", 64 << 20)] {
            let a = allocator(conf);
            group.bench_function(format!("{name}/{label}"), |b| {
                b.iter(|| {
                    let p = a
                        .malloc(black_box(size), StreamId::DEFAULT)
                        .expect("malloc");
                    a.free(black_box(p)).expect("free");
                })
            });
        }
        // A mixed working set: 64 live allocations of varied sizes, one replaced per iteration.
        let a = allocator(conf);
        let sizes: Vec<u64> = (0..64u64)
            .map(|i| 512 + (i * 7919 % 97) * ((i % 5) * 300_000 + 1000))
            .collect();
        let mut live: Vec<u64> = sizes
            .iter()
            .map(|s| a.malloc(*s, StreamId::DEFAULT).expect("malloc"))
            .collect();
        let mut i = 0usize;
        group.bench_function(format!("{name}/mixed"), |b| {
            b.iter(|| {
                let k = i % live.len();
                a.free(live[k]).expect("free");
                live[k] = a
                    .malloc(
                        black_box(sizes[(k * 13 + i) % sizes.len()]),
                        StreamId::DEFAULT,
                    )
                    .expect("malloc");
                i += 1;
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
