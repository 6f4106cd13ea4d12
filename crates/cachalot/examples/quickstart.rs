//! The library in a few lines: a caching allocator over the simulated device
//! (`CudaBackend::new(0)` instead gives a real GPU), PyTorch's statistics, a
//! summary table, and a typed out-of-memory error.
//!
//! `cargo run --release -p cachalot --example quickstart`

use std::sync::Arc;

use cachalot::backend::sim::SimBackend;
use cachalot::{allocator, summary, AllocatorConfig, Error, StreamId};

fn main() -> Result<(), Error> {
    let device = Arc::new(SimBackend::new(8 << 30)); // an 8 GiB simulated GPU
    let config = AllocatorConfig::parse("policy:cachalot")?;
    let alloc = allocator::create(device, config)?;

    let stream = StreamId::DEFAULT;
    let a = alloc.malloc(300 << 20, stream)?; // 300 MiB
    let b = alloc.malloc(4096, stream)?;
    alloc.free(a)?;
    let c = alloc.malloc(200 << 20, stream)?; // served from the cache: no driver call
    println!(
        "allocated {} bytes, reserved {} bytes",
        alloc.memory_allocated(),
        alloc.memory_reserved()
    );
    println!("{}", summary::memory_summary(&alloc.stats(), 0));

    match alloc.malloc(64 << 30, stream) {
        Err(Error::OutOfMemory(report)) => println!("as expected: {report}"),
        other => println!("unexpected: {other:?}"),
    }
    alloc.free(b)?;
    alloc.free(c)?;
    alloc.empty_cache()?;
    alloc
        .validate()
        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
    println!(
        "after empty_cache: reserved {} bytes",
        alloc.memory_reserved()
    );
    Ok(())
}
