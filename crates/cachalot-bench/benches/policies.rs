//! Allocator cost per operation, both policies in one run: every bundled trace
//! replayed on a warm allocator over the simulated device (an H100's capacity),
//! and the cachalot policy's throughput with 1 and 2 threads on their own streams.
//!
//! `cargo bench -p cachalot-bench --bench policies`. It prints, in order:
//! - a table of the two policies taking turns on each trace (a turn: one
//!   warm-up pass and three timed ones), with the median ns per operation and
//!   the median of the turns' ratios, then the threads' best rounds;
//! - criterion's `replay/<policy>/<trace>` (ns per operation = 1e3 / the
//!   reported Melem/s) and `threads/<policy>/<threads>`;
//! - criterion's `ratio/cachalot-over-pytorch/<trace>`: cachalot's time over
//!   the pytorch policy's, turn by turn.
//!
//! The machines here slow down by up to 2x for a second or more at a time:
//! each of criterion's time benchmarks runs alone, so one of them can land in
//! a slow spell; the turns and the ratios cannot favour either policy.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cachalot::allocator::create;
use cachalot::backend::sim::SimBackend;
use cachalot::{AllocatorConfig, DeviceAllocator, StreamId};
use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, Criterion, SamplingMode, Throughput};

use cachalot_testkit::trace;

/// A trace with recorded addresses turned into slot indices, so the replay loop
/// costs an index, not a hash lookup.
struct Script {
    ops: Vec<(bool, usize, u64)>,
    slots: usize,
}

fn script(name: &str) -> Script {
    let mut index = std::collections::HashMap::new();
    let mut ops = Vec::new();
    for op in trace::load(name) {
        let next = index.len();
        let slot = *index.entry(op.addr).or_insert(next);
        ops.push((op.alloc, slot, op.size));
    }
    Script {
        ops,
        slots: index.len(),
    }
}

/// Replays the script once and frees what it left live.
fn replay(alloc: &dyn DeviceAllocator, script: &Script, ptrs: &mut [u64], stream: StreamId) {
    for &(is_alloc, slot, size) in &script.ops {
        if is_alloc {
            ptrs[slot] = alloc.malloc(size, stream).expect("fits");
        } else if ptrs[slot] != 0 {
            alloc.free(std::mem::take(&mut ptrs[slot])).expect("live");
        }
    }
    for p in ptrs.iter_mut().filter(|p| **p != 0) {
        alloc.free(std::mem::take(p)).expect("live");
    }
}

fn allocator(policy: &str) -> Arc<dyn DeviceAllocator> {
    let config = AllocatorConfig::parse(&format!("policy:{policy}")).expect("valid");
    create(Arc::new(SimBackend::h100()), config).expect("allocator")
}

fn policies(c: &mut Criterion) {
    let mut group = c.benchmark_group("replay");
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);
    for name in trace::TRACES {
        let script = script(name);
        group.throughput(Throughput::Elements(script.ops.len() as u64));
        for policy in ["pytorch", "cachalot"] {
            let alloc = allocator(policy);
            let mut ptrs = vec![0; script.slots];
            replay(alloc.as_ref(), &script, &mut ptrs, StreamId(0));
            group.bench_function(format!("{policy}/{name}"), |b| {
                b.iter(|| replay(alloc.as_ref(), &script, &mut ptrs, StreamId(0)))
            });
        }
    }
    group.finish();
}

/// `threads` threads, each replaying the trace on its own stream, `iters`
/// times: the span from the first thread's start to the last one's end (each
/// thread reads the clock itself, since on two cores the spawning thread may
/// run only after the others are done).
fn run_threads(
    alloc: &Arc<dyn DeviceAllocator>,
    script: &Arc<Script>,
    threads: u64,
    iters: u64,
) -> Duration {
    let barrier = Arc::new(std::sync::Barrier::new(threads as usize));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (alloc, script, barrier) = (alloc.clone(), script.clone(), barrier.clone());
            std::thread::spawn(move || {
                let mut ptrs = vec![0; script.slots];
                barrier.wait();
                let start = Instant::now();
                for _ in 0..iters {
                    replay(alloc.as_ref(), &script, &mut ptrs, StreamId(t + 1));
                }
                (start, Instant::now())
            })
        })
        .collect();
    let spans: Vec<(Instant, Instant)> = handles
        .into_iter()
        .map(|h| h.join().expect("no panic"))
        .collect();
    let first = spans.iter().map(|s| s.0).min().expect("a thread");
    let last = spans.iter().map(|s| s.1).max().expect("a thread");
    last - first
}

fn threads(c: &mut Criterion) {
    let script = Arc::new(script("resnet50"));
    let mut group = c.benchmark_group("threads");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);
    for policy in ["pytorch", "cachalot"] {
        for threads in [1u64, 2] {
            let alloc = allocator(policy);
            run_threads(&alloc, &script, threads, 1);
            group.throughput(Throughput::Elements(script.ops.len() as u64 * threads));
            group.bench_function(format!("{policy}/{threads}"), |b| {
                b.iter_custom(|iters| run_threads(&alloc, &script, threads, iters))
            });
        }
    }
    group.finish();
}

/// Best of `passes` runs of `f`, in seconds.
fn best_of(passes: usize, mut f: impl FnMut() -> Duration) -> f64 {
    (0..passes)
        .map(|_| f().as_secs_f64())
        .fold(f64::MAX, f64::min)
}

/// Passes each policy takes in a turn: the first warms the caches and the
/// branch predictors up after the other policy's turn, the rest are timed.
const TURN_PASSES: usize = 4;

/// Both policies' allocators on one trace, taking turns, so a slow spell of
/// a shared machine (they last a second or more) touches both alike.
struct Turns {
    allocs: [Arc<dyn DeviceAllocator>; 2],
    ptrs: [Vec<u64>; 2],
}

impl Turns {
    fn new(script: &Script) -> Turns {
        Turns {
            allocs: ["pytorch", "cachalot"].map(allocator),
            ptrs: [vec![0; script.slots], vec![0; script.slots]],
        }
    }

    /// One turn of each policy: the seconds of their timed passes.
    fn turn(&mut self, script: &Script) -> [f64; 2] {
        let mut secs = [0.0; 2];
        for (i, alloc) in self.allocs.iter().enumerate() {
            replay(alloc.as_ref(), script, &mut self.ptrs[i], StreamId(0));
            let start = Instant::now();
            for _ in 1..TURN_PASSES {
                replay(alloc.as_ref(), script, &mut self.ptrs[i], StreamId(0));
            }
            secs[i] = start.elapsed().as_secs_f64();
        }
        secs
    }
}

/// A criterion measurement that is a ratio, not a time: each sample sums the
/// cachalot policy's time over the pytorch policy's, turn by turn
/// (`iter_custom` only), so the estimate is the mean of the turns' ratios.
struct Ratio;

impl Measurement for Ratio {
    type Intermediate = ();
    type Value = f64;

    fn start(&self) {}

    /// Unused: the ratio benchmarks return their values from `iter_custom`.
    fn end(&self, (): ()) -> f64 {
        0.0
    }

    fn add(&self, a: &f64, b: &f64) -> f64 {
        a + b
    }

    fn zero(&self) -> f64 {
        0.0
    }

    fn to_f64(&self, value: &f64) -> f64 {
        *value
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &RatioFormatter
    }
}

/// Shows a [`Ratio`] as it is, against the pytorch policy.
struct RatioFormatter;

impl ValueFormatter for RatioFormatter {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "x pytorch"
    }

    fn scale_throughputs(
        &self,
        _typical: f64,
        _: &Throughput,
        _values: &mut [f64],
    ) -> &'static str {
        "x pytorch"
    }

    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ratio"
    }
}

/// cachalot's time over the pytorch policy's on every trace, the policies
/// taking turns (criterion's estimate is the mean ratio of a turn).
fn ratios(c: &mut Criterion<Ratio>) {
    let mut group = c.benchmark_group("ratio");
    // Flat: every sample takes the same number of turns (a turn of
    // bert_dynamic is 16 ms, too long for criterion's growing samples).
    group
        .sampling_mode(SamplingMode::Flat)
        .measurement_time(Duration::from_secs(4))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);
    for name in trace::TRACES {
        let script = script(name);
        let mut turns = Turns::new(&script);
        group.bench_function(format!("cachalot-over-pytorch/{name}"), |b| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let [pytorch, cachalot] = turns.turn(&script);
                        cachalot / pytorch
                    })
                    .sum::<f64>()
            })
        });
    }
    group.finish();
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// The tables printed ahead of criterion's measurements.
fn summary() {
    turns_table();
    threads_table();
}

/// 30 turns of each policy per trace: the medians of their passes and of the
/// turns' ratios.
fn turns_table() {
    const TURNS: usize = 30;
    println!(
        "{TURNS} turns of {} timed passes each, policies in turn (warm allocator, one stream):",
        TURN_PASSES - 1
    );
    println!(
        "  trace             pytorch ns/op  cachalot ns/op  cachalot/pytorch (median; worst turn)"
    );
    for name in trace::TRACES {
        let script = script(name);
        let mut turns = Turns::new(&script);
        let per_op = |secs: f64| secs * 1e9 / ((TURN_PASSES - 1) * script.ops.len()) as f64;
        let runs: Vec<[f64; 2]> = (0..TURNS).map(|_| turns.turn(&script)).collect();
        let ratios: Vec<f64> = runs.iter().map(|[p, c]| c / p).collect();
        let worst = ratios.iter().copied().fold(0.0, f64::max);
        println!(
            "  {name:16}  {:13.1}  {:14.1}  {:.3}; {worst:.3}",
            per_op(median(runs.iter().map(|r| r[0]).collect())),
            per_op(median(runs.iter().map(|r| r[1]).collect())),
            median(ratios),
        );
    }
}

/// The best of 10 rounds of 1 and 2 threads on their own streams, per policy.
fn threads_table() {
    let script = Arc::new(script("resnet50"));
    println!("threads on their own streams, resnet50, best of 10, ops per microsecond:");
    for policy in ["pytorch", "cachalot"] {
        let mut line = format!("  {policy:9}");
        for threads in [1u64, 2] {
            let alloc = allocator(policy);
            let secs = best_of(10, || run_threads(&alloc, &script, threads, 5));
            let ops = (script.ops.len() as u64 * threads * 5) as f64;
            line += &format!("  {threads} thread(s) {:5.2}", ops / secs / 1e6);
        }
        println!("{line}");
    }
}

criterion_group!(benches, policies, threads);
criterion_group! {
    name = paired;
    config = Criterion::default().with_measurement(Ratio);
    targets = ratios
}

fn main() {
    summary();
    benches();
    paired();
    Criterion::default().configure_from_args().final_summary();
}
