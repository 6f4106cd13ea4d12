//! A prefetching loader: while batch i computes on the default stream, batch i+1
//! is copied from pinned host memory on a side stream. Timed with and without
//! prefetching (on a GPU; the simulated device runs every copy at once, so it
//! shows the mechanics, not the overlap). Then batches are pinned one by one
//! through the caching pinned-host allocator, whose blocks are reused once their
//! copies have finished.

use std::time::Instant;

use cachalot_tensor::{memory, DType, Device, Stream, Tensor, TensorError};

struct Plan {
    batches: usize,
    rows: usize,
    cols: usize,
}

/// One step of "training": a product that takes about as long as the batch's copy.
fn compute(batch: &Tensor, weights: &Tensor) -> Result<(), TensorError> {
    batch.matmul(weights).map(drop)
}

fn run(prefetch: bool, host: &[Tensor], weights: &Tensor) -> Result<f64, TensorError> {
    let cuda = Device::Cuda(0);
    let main = Stream::current(0)?;
    let side = Stream::new(0)?;
    memory::synchronize(0)?;
    let start = Instant::now();
    if prefetch {
        let load = |t: &Tensor| -> Result<Tensor, TensorError> {
            let _on_side = side.enter();
            t.to_non_blocking(cuda)
        };
        let mut next = Some(load(&host[0])?);
        for i in 0..host.len() {
            main.wait_stream(&side)?;
            let Some(current) = next.take() else { break };
            // Allocated for the side stream, used on the main stream.
            current.record_stream(&main)?;
            if i + 1 < host.len() {
                next = Some(load(&host[i + 1])?);
            }
            compute(&current, weights)?;
        }
    } else {
        for batch in host {
            let current = batch.to_non_blocking(cuda)?;
            compute(&current, weights)?;
        }
    }
    memory::synchronize(0)?;
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

fn main() -> Result<(), TensorError> {
    let simulated = memory::is_simulated(0)?;
    let plan = if simulated {
        Plan {
            batches: 8,
            rows: 64,
            cols: 64,
        }
    } else {
        Plan {
            batches: 12,
            rows: 4096,
            cols: 4096,
        }
    };
    let weights = Tensor::randn(&[plan.cols, plan.cols], DType::F32, Device::Cuda(0))?;
    let host: Vec<Tensor> = (0..plan.batches)
        .map(|_| Tensor::randn(&[plan.rows, plan.cols], DType::F32, Device::Cpu)?.pin_memory())
        .collect::<Result<_, _>>()?;
    println!(
        "simulated {simulated}; {} batches of {} KiB, pinned: {}",
        plan.batches,
        host[0].nbytes() >> 10,
        host.iter().all(Tensor::is_pinned)
    );

    run(true, &host, &weights)?; // warm-up: kernels, cuBLAS, cached blocks
    let serial = run(false, &host, &weights)?;
    let overlapped = run(true, &host, &weights)?;
    println!("without prefetch\t{serial:.3} ms");
    println!("with prefetch\t{overlapped:.3} ms");
    println!("speedup\t{:.2}x", serial / overlapped.max(1e-9));

    drop(host);
    let before = memory::pinned_memory_stats();
    let source = Tensor::randn(&[plan.rows, plan.cols], DType::F32, Device::Cpu)?;
    for _ in 0..plan.batches {
        let pinned = source.pin_memory()?;
        let on_gpu = pinned.to_non_blocking(Device::Cuda(0))?;
        drop(pinned); // back to the cache, reusable once the copy has finished
        compute(&on_gpu, &weights)?;
    }
    memory::synchronize(0)?;
    let after = memory::pinned_memory_stats();
    println!(
        "pinned per batch\thost_allocs {}\treuses {}",
        after.host_allocs - before.host_allocs,
        after.reuses - before.reuses
    );
    Ok(())
}
