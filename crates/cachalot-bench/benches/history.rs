//! What history recording costs the allocator: the same malloc/free pattern on
//! the `pytorch` policy over a simulated device with no observer (recording off),
//! with a `History` (on), and with a `History` capturing backtraces.
//!
//! Each iteration is 64 mallocs of mixed sizes then their 64 frees: 128 ops, so
//! criterion's element throughput is ops per second.

use std::hint::black_box;
use std::sync::Arc;

use cachalot::backend::sim::SimBackend;
use cachalot::event::Observer;
use cachalot::history::{History, HistoryConfig};
use cachalot::policy::PytorchAllocator;
use cachalot::{AllocatorConfig, DeviceAllocator, StreamId};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const OPS_PER_ITER: u64 = 128;

fn sizes() -> Vec<u64> {
    (0..64u64)
        .map(|i| 512 + (i * 7919 % 97) * 4096 + if i % 8 == 0 { 6 << 20 } else { 0 })
        .collect()
}

fn allocator(observer: Option<Arc<dyn Observer>>) -> PytorchAllocator {
    let sim = Arc::new(SimBackend::h100());
    let alloc = PytorchAllocator::new(sim, AllocatorConfig::default())
        .expect("the default config is valid");
    alloc.set_observer(observer);
    alloc
}

fn churn(alloc: &PytorchAllocator, sizes: &[u64], ptrs: &mut Vec<u64>) {
    ptrs.clear();
    for &s in sizes {
        ptrs.push(
            alloc
                .malloc(black_box(s), StreamId::DEFAULT)
                .expect("the device is large enough"),
        );
    }
    for &p in ptrs.iter().rev() {
        alloc.free(p).expect("allocated above");
    }
}

fn bench(c: &mut Criterion) {
    let sizes = sizes();
    let mut group = c.benchmark_group("history");
    group.throughput(Throughput::Elements(OPS_PER_ITER));
    let cases: [(&str, Option<HistoryConfig>); 3] = [
        ("off", None),
        (
            "on",
            Some(HistoryConfig {
                capacity: 1 << 16,
                ..HistoryConfig::default()
            }),
        ),
        (
            "on_backtraces",
            Some(HistoryConfig {
                capacity: 1 << 16,
                backtraces: true,
                ..HistoryConfig::default()
            }),
        ),
    ];
    for (name, config) in cases {
        let observer = config.map(|c| Arc::new(History::new(c)) as Arc<dyn Observer>);
        let alloc = allocator(observer);
        let mut ptrs = Vec::with_capacity(sizes.len());
        churn(&alloc, &sizes, &mut ptrs); // warm the cache: segments exist from here on
        if name == "on_backtraces" {
            group.sample_size(10);
        }
        group.bench_function(name, |b| b.iter(|| churn(&alloc, &sizes, &mut ptrs)));
    }
    group.finish();
}

/// The recorder alone: one allocation's three events (alloc, free_requested,
/// free_completed) per iteration.
fn on_event(c: &mut Criterion) {
    use cachalot::event::{Action, TraceEvent};
    let history = History::new(HistoryConfig {
        capacity: 1 << 16,
        ..HistoryConfig::default()
    });
    let mut group = c.benchmark_group("history_on_event");
    group.throughput(Throughput::Elements(3));
    let mut addr = 0x7f00_0000_0000u64;
    group.bench_function("three_events", |b| {
        b.iter(|| {
            addr = addr.wrapping_add(512);
            for action in [Action::Alloc, Action::FreeRequested, Action::FreeCompleted] {
                let e = TraceEvent {
                    time_us: 0,
                    action,
                    addr,
                    size: 512,
                    stream: StreamId::DEFAULT,
                };
                history.on_event(black_box(&e));
            }
        })
    });
    group.finish();
}

criterion_group!(benches, bench, on_event);
criterion_main!(benches);
