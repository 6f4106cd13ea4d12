//! cachalot's side of the GPU benchmark (scripts/gpu.sh runs it on a GPU machine,
//! next to the native contenders in scripts/gpu/native_bench.py).
//!
//! For each op list and each policy (pytorch, cachalot) on the CUDA backend: ns per
//! operation of the first pass and the median of the later passes (timed over the
//! whole pass), the allocator's reserved bytes after the first pass, the device
//! memory it took (cuMemGetInfo before and after the first pass), and what the
//! simulator predicts for the same replay. Then the threaded pattern with 1, 2, 4
//! and 8 threads, each on its own stream, after an untimed warm-up of `--steps`
//! steps per thread (steady state, as for the passes): every thread runs until
//! the window (`--window-ms`) closes, and the figure is the operations all of
//! them did over the time until the last stopped, in operations per
//! microsecond, with the driver memory calls made while timed. A thread the
//! host holds up does fewer operations instead of keeping the others' time
//! running. The thread counts take turns, round after round (nine rounds),
//! so that the host's drifts reach every count alike; each count's figure is
//! its median over the rounds, and each round's 8 / 1 is kept too. Then the
//! same on the simulated device, the allocator alone without the driver; then
//! the cachalot policy with an allocator per thread on the simulated device
//! (nothing shared: the machine's own scaling). Last, what one read of the
//! clock the cachalot policy's journals stamp with costs on this host (each
//! operation reads it once while a device has several streams).
//!
//! Usage: gpu --ops DIR --out FILE.json [--passes N] [--steps N] [--window-ms N] [--threads 1,2,4,8]
//! Without a GPU it prints "skipped: no GPU (...)" and runs only the cachalot
//! policy's thread scaling on the simulated device (shared, and an allocator
//! per thread), writing those two tables to `--out`.

mod ops;

use std::collections::BTreeMap;
use std::error::Error;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use cachalot::backend::counting::Counting;
use cachalot::backend::cuda::CudaBackend;
use cachalot::backend::sim::{AddressOrder, SimBackend};
use cachalot::backend::{Backend, StreamId};
use cachalot::{allocator, AllocatorConfig, DeviceAllocator, PolicyKind};
use serde_json::{json, Value};

use cachalot_testkit::lcg::Lcg;
use ops::{Op, OpList, PATTERN_SIZES, PATTERN_SLOTS};

type BoxResult<T> = Result<T, Box<dyn Error>>;

struct Args {
    ops: PathBuf,
    out: PathBuf,
    passes: usize,
    steps: u64,
    window: Duration,
    threads: Vec<usize>,
}

/// Rounds of the threaded pattern, each running every thread count once.
const ROUNDS: usize = 9;

/// Steps a thread runs between looks at whether the window has closed.
const BATCH: u64 = 512;

fn parse_args() -> BoxResult<Args> {
    let mut args = Args {
        ops: PathBuf::new(),
        out: PathBuf::new(),
        passes: 20,
        steps: 50_000,
        window: Duration::from_millis(100),
        threads: vec![1, 2, 4, 8],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--bench" {
            continue; // cargo bench passes this
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--ops" => args.ops = value.into(),
            "--out" => args.out = value.into(),
            "--passes" => args.passes = value.parse()?,
            "--steps" => args.steps = value.parse()?,
            "--window-ms" => args.window = Duration::from_millis(value.parse()?),
            "--threads" => {
                args.threads = value.split(',').map(str::parse).collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    if args.ops.as_os_str().is_empty() || args.out.as_os_str().is_empty() || args.passes == 0 {
        return Err(
            "usage: gpu --ops DIR --out FILE.json [--passes N] [--steps N] [--window-ms N] [--threads 1,2,4,8]"
                .into(),
        );
    }
    Ok(args)
}

fn config(policy: PolicyKind) -> AllocatorConfig {
    let mut config = AllocatorConfig::default();
    config.policy = policy;
    config
}

/// One pass over the op list; returns its duration (the timed region is the loop).
fn pass(
    alloc: &dyn DeviceAllocator,
    list: &OpList,
    streams: &[StreamId],
    ptrs: &mut [u64],
) -> BoxResult<Duration> {
    let start = Instant::now();
    for op in &list.ops {
        match *op {
            Op::Alloc { id, size, stream } => ptrs[id] = alloc.malloc(size, streams[stream])?,
            Op::Free { id } => alloc.free(ptrs[id])?,
        }
    }
    Ok(start.elapsed())
}

/// What the simulator predicts: reserved bytes after one pass on a simulated H100
/// that places segments as the CUDA driver does.
fn simulated_reserved(list: &OpList, policy: PolicyKind) -> BoxResult<u64> {
    let sim = Arc::new(SimBackend::h100().with_address_order(AddressOrder::Descending));
    let alloc = allocator::create(sim, config(policy))?;
    let streams: Vec<StreamId> = (0..list.streams as u64)
        .map(|s| StreamId(s * 0x100))
        .collect();
    let mut ptrs = vec![0; list.ids];
    pass(alloc.as_ref(), list, &streams, &mut ptrs)?;
    Ok(alloc.memory_reserved())
}

/// Memory calls (segments, pages, ranges, maps) and event calls the backend served
/// so far.
fn driver_calls(counting: &Counting<CudaBackend>) -> (u64, u64) {
    let counts = counting.counts();
    let memory = counts.memory_calls();
    let all: u64 = counts.calls.values().sum();
    (memory, all - memory)
}

/// Replays `list` `passes` times on one allocator; with `side`, a stream of
/// its own holds a block throughout (the device has several streams from
/// the start, so the cachalot policy journals every operation, as for a
/// program with a side stream).
fn replay(
    gpu: &Arc<CudaBackend>,
    list: &OpList,
    policy: PolicyKind,
    passes: usize,
    sim_reserved: u64,
    side: bool,
) -> BoxResult<Value> {
    let mut streams = vec![StreamId::DEFAULT];
    for _ in 1..list.streams {
        streams.push(gpu.create_stream()?);
    }
    let counting = Arc::new(Counting::new(gpu.clone()));
    let backend: Arc<dyn Backend> = counting.clone();
    let alloc = allocator::create(backend, config(policy))?;
    let side = match side {
        true => {
            let stream = gpu.create_stream()?;
            Some((stream, alloc.malloc(1 << 20, stream)?))
        }
        false => None,
    };
    let mut ptrs = vec![0; list.ids];
    let free_before = gpu.mem_info()?.free;
    let (mut ns, mut reserved_first, mut used_first) = (Vec::new(), 0, 0);
    let start_calls = driver_calls(&counting);
    let mut first_calls = start_calls;
    for i in 0..passes {
        let took = pass(alloc.as_ref(), list, &streams, &mut ptrs)?;
        ns.push(took.as_nanos() as f64 / list.ops.len() as f64);
        gpu.synchronize_device()?;
        if i == 0 {
            reserved_first = alloc.memory_reserved();
            used_first = free_before.saturating_sub(gpu.mem_info()?.free);
            first_calls = driver_calls(&counting);
        }
    }
    let end_calls = driver_calls(&counting);
    let later_passes = (passes.max(2) - 1) as f64;
    if let Some((stream, block)) = side {
        alloc.free(block)?;
        streams.push(stream);
    }
    alloc.validate()?;
    let reserved_peak = alloc.max_memory_reserved();
    alloc.empty_cache()?;
    drop(alloc);
    for s in streams.into_iter().skip(1) {
        gpu.destroy_stream(s)?;
    }
    let mut later = ns[1.min(ns.len() - 1)..].to_vec();
    later.sort_by(f64::total_cmp);
    Ok(json!({
        "ops": list.ops.len(),
        "requested_bytes_per_pass": list.requested_bytes(),
        "ns_per_op": ns,
        "ns_first": ns[0],
        "ns_steady": later[later.len() / 2],
        "reserved_after_first": reserved_first,
        "reserved_peak": reserved_peak,
        "device_used_after_first": used_first,
        "sim_reserved": sim_reserved,
        "memory_calls_first": first_calls.0 - start_calls.0,
        "memory_calls_per_later_pass": (end_calls.0 - first_calls.0) as f64 / later_passes,
        // Less the bench's own synchronize after each pass.
        "other_calls_per_later_pass": (end_calls.1 - first_calls.1) as f64 / later_passes - 1.0,
    }))
}

/// Runs `steps` steps of the threaded pattern on one thread's stream;
/// returns operations done.
fn run_pattern(
    alloc: &dyn DeviceAllocator,
    stream: StreamId,
    lcg: &mut Lcg,
    steps: u64,
    live: &mut [u64],
) -> BoxResult<u64> {
    let mut done = 0;
    for _ in 0..steps {
        let r = lcg.draw();
        let slot = (r % PATTERN_SLOTS) as usize;
        if live[slot] != 0 {
            alloc.free(live[slot])?;
            done += 1;
        }
        live[slot] = alloc.malloc(
            PATTERN_SIZES[((r >> 8) % PATTERN_SIZES.len() as u64) as usize],
            stream,
        )?;
        done += 1;
    }
    Ok(done)
}

/// Where the threaded pattern runs: on the GPU (each thread on a stream of its
/// own), or on the simulated device (the allocator alone, no driver).
#[derive(Clone, Copy)]
enum Device<'a> {
    Gpu(&'a Arc<CudaBackend>),
    Sim,
}

/// One thread's stream, made and given back by the thread.
fn thread_stream(device: Option<&Arc<CudaBackend>>, t: usize) -> Result<StreamId, String> {
    match device {
        Some(gpu) => gpu.create_stream().map_err(|e| e.to_string()),
        None => Ok(StreamId(t as u64 + 1)),
    }
}

fn end_stream(device: Option<&Arc<CudaBackend>>, stream: StreamId) -> Result<(), String> {
    match device {
        Some(gpu) => gpu
            .synchronize_stream(stream)
            .and_then(|()| gpu.destroy_stream(stream))
            .map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// How the threads of the threaded pattern share allocators.
#[derive(Clone, Copy, PartialEq)]
enum Sharing {
    /// One allocator, each thread on a stream of its own.
    One,
    /// An allocator (and simulated device) per thread: nothing shared, the
    /// machine's own scaling, for comparison.
    PerThread,
}

/// Runs the threaded pattern in batches until `stop` is set; returns
/// operations done.
fn run_until(
    alloc: &dyn DeviceAllocator,
    stream: StreamId,
    lcg: &mut Lcg,
    stop: &AtomicBool,
    live: &mut [u64],
) -> BoxResult<u64> {
    let mut done = 0;
    while !stop.load(Ordering::Relaxed) {
        done += run_pattern(alloc, stream, lcg, BATCH, live)?;
    }
    Ok(done)
}

/// The threaded pattern with `threads` threads (module docs): total
/// operations per microsecond, and the driver memory calls made while it was
/// timed.
fn scaling(
    device: Device<'_>,
    policy: PolicyKind,
    threads: usize,
    args: &Args,
    sharing: Sharing,
) -> BoxResult<(f64, u64)> {
    let make = || -> BoxResult<_> {
        let inner: Arc<dyn Backend> = match device {
            Device::Gpu(gpu) => gpu.clone(),
            Device::Sim => Arc::new(SimBackend::h100()),
        };
        let counted = Arc::new(Counting::new(inner));
        let backend: Arc<dyn Backend> = counted.clone();
        Ok((allocator::create(backend, config(policy))?, counted))
    };
    let allocs = match sharing {
        Sharing::One => vec![make()?],
        Sharing::PerThread => (0..threads).map(|_| make()).collect::<BoxResult<_>>()?,
    };
    let calls_now = || -> u64 { allocs.iter().map(|(_, c)| c.counts().memory_calls()).sum() };
    let barrier = Arc::new(Barrier::new(threads + 1));
    let stop = Arc::new(AtomicBool::new(false));
    let steps = args.steps;
    let gpu = match device {
        Device::Gpu(gpu) => Some(gpu.clone()),
        Device::Sim => None,
    };
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let alloc = allocs[t % allocs.len()].0.clone();
            let (gpu, barrier, stop) = (gpu.clone(), barrier.clone(), stop.clone());
            std::thread::spawn(move || -> Result<(u64, Instant), String> {
                let stream = thread_stream(gpu.as_ref(), t)?;
                let mut live = vec![0u64; PATTERN_SLOTS as usize];
                let mut lcg = Lcg(t as u64 + 1);
                let warm = run_pattern(alloc.as_ref(), stream, &mut lcg, steps, &mut live);
                barrier.wait();
                let done = warm
                    .and_then(|_| run_until(alloc.as_ref(), stream, &mut lcg, &stop, &mut live));
                let end = Instant::now();
                for p in live.into_iter().filter(|p| *p != 0) {
                    alloc.free(p).map_err(|e| e.to_string())?;
                }
                end_stream(gpu.as_ref(), stream)?;
                Ok((done.map_err(|e| e.to_string())?, end))
            })
        })
        .collect();
    barrier.wait();
    let start = Instant::now();
    let calls_before = calls_now();
    std::thread::sleep(args.window);
    stop.store(true, Ordering::Relaxed);
    let (mut total, mut last) = (0u64, start);
    for h in handles {
        let (done, end) = h.join().map_err(|_| "a bench thread panicked")??;
        total += done;
        last = last.max(end);
    }
    let calls = calls_now() - calls_before;
    for (alloc, _) in &allocs {
        alloc.validate()?;
        alloc.empty_cache()?;
    }
    Ok((total as f64 / (last - start).as_secs_f64() / 1e6, calls))
}

/// [`scaling`] for every thread count, round after round (module docs);
/// prints and returns each count's median and each round's 8 / 1.
fn scaling_table(
    device: Device<'_>,
    key: &str,
    policy: PolicyKind,
    args: &Args,
    sharing: Sharing,
) -> BoxResult<Value> {
    let place = match (device, sharing) {
        (Device::Gpu(_), _) => "",
        (Device::Sim, Sharing::One) => " (simulated device)",
        (Device::Sim, Sharing::PerThread) => " (simulated device, an allocator per thread)",
    };
    let mut rounds = vec![Vec::new(); args.threads.len()];
    for _ in 0..ROUNDS {
        for (i, &threads) in args.threads.iter().enumerate() {
            rounds[i].push(scaling(device, policy, threads, args, sharing)?);
        }
    }
    let mut by = BTreeMap::new();
    let count = |n: usize| args.threads.iter().position(|&t| t == n);
    if let (Some(one), Some(eight)) = (count(1), count(8)) {
        let ratios: Vec<f64> = (0..ROUNDS)
            .map(|r| rounds[eight][r].0 / rounds[one][r].0)
            .collect();
        let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "scaling {key:18} 8 / 1 thread{place} by round: {}",
            shown.join(", ")
        );
        by.insert("ratios_8_1".to_string(), json!(ratios));
    }
    for (&threads, mut runs) in args.threads.iter().zip(rounds) {
        let shown: Vec<String> = runs.iter().map(|r| format!("{:.2}", r.0)).collect();
        runs.sort_by(|a, b| a.0.total_cmp(&b.0));
        let (rate, calls) = runs[ROUNDS / 2];
        println!(
            "scaling {key:18} {threads} threads{place}: {rate:.2} ops/us (median of {}), {calls} driver memory calls while timed",
            shown.join(", ")
        );
        by.insert(
            threads.to_string(),
            json!({ "ops_per_us": rate, "memory_calls": calls }),
        );
    }
    Ok(json!(by))
}

/// The machine's own scaling: the cachalot policy on the simulated device,
/// an allocator per thread (nothing shared).
fn scaling_apart(args: &Args) -> BoxResult<Value> {
    scaling_table(
        Device::Sim,
        "cachalot:cachalot",
        PolicyKind::Cachalot,
        args,
        Sharing::PerThread,
    )
}

/// Nanoseconds per read of the clock the cachalot policy's journals stamp
/// with (`quanta`'s: the time-stamp counter where it is usable), the median
/// of five loops of a million reads; printed and returned for the JSON.
fn clock_read_ns() -> f64 {
    const READS: u32 = 1_000_000;
    let clock = quanta::Clock::new();
    let mut loops: Vec<f64> = (0..5)
        .map(|_| {
            let start = Instant::now();
            let mut sum = 0u64;
            for _ in 0..READS {
                sum = sum.wrapping_add(clock.raw());
            }
            std::hint::black_box(sum);
            start.elapsed().as_nanos() as f64 / f64::from(READS)
        })
        .collect();
    loops.sort_by(f64::total_cmp);
    let ns = loops[loops.len() / 2];
    println!("clock read (the journals' stamp): {ns:.1} ns");
    ns
}

fn print_replay(name: &str, key: &str, r: &Value) {
    println!(
        "{name:16} {key:22} first {:8.0} ns/op  steady {:8.0} ns/op  reserved {}  device used {}  simulated {}",
        r["ns_first"].as_f64().unwrap_or(0.0), r["ns_steady"].as_f64().unwrap_or(0.0),
        r["reserved_after_first"], r["device_used_after_first"], r["sim_reserved"]
    );
}

/// Without a GPU: the threaded pattern on the simulated device, one allocator
/// shared and one per thread, written to `--out` as the GPU run writes its
/// `scaling_sim` and `scaling_sim_apart`, with the clock's cost.
fn simulated_scaling_only(args: &Args) -> BoxResult<()> {
    let key = "cachalot:cachalot";
    let shared = scaling_table(Device::Sim, key, PolicyKind::Cachalot, args, Sharing::One)?;
    let out = json!({
        "scaling_sim": { key: shared }, "scaling_sim_apart": scaling_apart(args)?,
        "clock_read_ns": clock_read_ns(),
    });
    std::fs::write(&args.out, serde_json::to_string_pretty(&out)?)?;
    Ok(())
}

fn main() -> BoxResult<()> {
    let args = parse_args()?;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&args.ops)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "ops"))
        .collect();
    paths.sort();
    let policies = [
        ("cachalot:pytorch", PolicyKind::Pytorch),
        ("cachalot:cachalot", PolicyKind::Cachalot),
    ];
    // The simulator's predictions first: they need no GPU.
    let mut lists = Vec::new();
    for path in &paths {
        let list = OpList::read(path)?;
        let mut predicted = Vec::new();
        for (key, policy) in policies {
            let reserved = simulated_reserved(&list, policy)?;
            println!(
                "{:16} {key:18} simulator predicts {reserved} bytes reserved",
                list.name
            );
            predicted.push(reserved);
        }
        lists.push((list, predicted));
    }
    let gpu = match CudaBackend::new(0) {
        Ok(gpu) => Arc::new(gpu),
        Err(e) => {
            println!("skipped: no GPU ({e}); the simulated device's thread scaling runs alone");
            return simulated_scaling_only(&args);
        }
    };
    let mut replays = BTreeMap::new();
    for (list, predicted) in &lists {
        let mut by = BTreeMap::new();
        for ((key, policy), sim_reserved) in policies.into_iter().zip(predicted) {
            let r = replay(&gpu, list, policy, args.passes, *sim_reserved, false)?;
            print_replay(&list.name, key, &r);
            by.insert(key.to_string(), r);
        }
        // The cachalot policy again with a side stream holding a block.
        let key = "cachalot:cachalot+side";
        let r = replay(
            &gpu,
            list,
            PolicyKind::Cachalot,
            args.passes,
            predicted[1],
            true,
        )?;
        print_replay(&list.name, key, &r);
        by.insert(key.to_string(), r);
        replays.insert(list.name.clone(), by);
    }
    let mut scalings = BTreeMap::new();
    let mut sim_scalings = BTreeMap::new();
    for (key, policy) in policies {
        let gpu = Device::Gpu(&gpu);
        scalings.insert(key, scaling_table(gpu, key, policy, &args, Sharing::One)?);
        let sim = scaling_table(Device::Sim, key, policy, &args, Sharing::One)?;
        sim_scalings.insert(key, sim);
    }
    let apart = scaling_apart(&args)?;
    let caps = gpu.capabilities();
    let out = json!({
        "gpu": caps.name, "replay": replays, "scaling": scalings, "scaling_sim": sim_scalings,
        "scaling_sim_apart": apart, "clock_read_ns": clock_read_ns(),
    });
    std::fs::write(&args.out, serde_json::to_string_pretty(&out)?)?;
    Ok(())
}
