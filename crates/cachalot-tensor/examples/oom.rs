//! Out of memory, and recovery: with the allocator capped at 1% of the device,
//! 64 MiB tensors are created until one fails. The typed error prints PyTorch's
//! message; after freeing half of the tensors the same request succeeds.

use cachalot_tensor::{memory, DType, Device, Tensor, TensorError};

/// 16 x 1024 x 1024 f32 = 64 MiB.
const SIZE: [usize; 3] = [16, 1024, 1024];

fn main() -> Result<(), TensorError> {
    let cuda = Device::Cuda(0);
    memory::set_per_process_memory_fraction(0.01, 0)?;
    let mut held = Vec::new();
    let err = loop {
        match Tensor::zeros(&SIZE, DType::F32, cuda) {
            Ok(t) => held.push(t),
            Err(e) => break e,
        }
        if held.len() > 10_000 {
            return Err(TensorError::Unsupported("no OOM under a 1% cap".into()));
        }
    };
    println!("allocs_before_oom\t{}", held.len());
    println!("is_out_of_memory\t{}", err.is_out_of_memory());
    println!("error\t{err}");
    println!(
        "after_oom\t{}\t{}",
        memory::memory_allocated(0),
        memory::memory_reserved(0)
    );
    if let Some(n) = memory::memory_stats(0).get("num_ooms") {
        println!("num_ooms\t{n}");
    }

    held.truncate(held.len() / 2);
    let retry = Tensor::zeros(&SIZE, DType::F32, cuda)?;
    held.push(retry);
    println!(
        "recovered\t{}\t{}\t{}",
        held.len(),
        memory::memory_allocated(0),
        memory::memory_reserved(0)
    );
    Ok(())
}
