//! What the checkpoint examples share: the lines `tests/examples.rs` and
//! `scripts/gpu-tensor.sh` compare with PyTorch's own runs.

use cachalot_tensor::{memory, TensorError};

/// Prints whether `cuda:0` is the simulated device.
pub fn print_device() -> Result<(), TensorError> {
    println!("device cuda:0 simulated: {}", memory::is_simulated(0)?);
    Ok(())
}

/// Prints `checkpoint\t<label>\t<memory_allocated>\t<memory_reserved>` for `cuda:0`.
pub fn checkpoint(label: &str) {
    println!(
        "checkpoint\t{label}\t{}\t{}",
        memory::memory_allocated(0),
        memory::memory_reserved(0)
    );
}
