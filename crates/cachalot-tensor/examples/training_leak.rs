//! A training-style loop with a leak check. Each step makes activations, a loss
//! and gradients that should all be freed by the end of the step; one step keeps
//! its activations in a list by mistake. The leak check, baselined after the
//! parameters were made, names exactly that tensor and the line that created it.

use cachalot_tensor::{memory, DType, Device, LeakCheck, Tensor, TensorError};

const BATCH: usize = 64;
const WIDTH: usize = 256;

fn step(weights: &Tensor, input: &Tensor) -> Result<(Tensor, Tensor), TensorError> {
    let activations = input.matmul(weights)?;
    activations.set_name("activations");
    let loss = activations.mul(&activations)?.mul_scalar(0.5)?;
    let grad = input.t()?.matmul(&activations)?;
    drop(loss);
    Ok((activations, grad))
}

fn main() -> Result<(), TensorError> {
    let cuda = Device::Cuda(0);
    let weights = Tensor::randn(&[WIDTH, WIDTH], DType::F32, cuda)?.mul_scalar(0.01)?;
    weights.set_name("weights");
    // Warm up once so lazily made state (cuBLAS workspace) predates the baseline.
    drop(step(
        &weights,
        &Tensor::ones(&[BATCH, WIDTH], DType::F32, cuda)?,
    )?);

    let check = LeakCheck::start(0)?;
    let mut kept = Vec::new();
    for i in 0..5 {
        let input = Tensor::randn(&[BATCH, WIDTH], DType::F32, cuda)?;
        let (activations, grad) = step(&weights, &input)?;
        weights.add_(&grad.mul_scalar(-1e-3)?)?;
        if i == 3 {
            kept.push(activations.clone()); // the bug: kept for "debugging"
        }
        println!("step {i}\tallocated {}", memory::memory_allocated(0));
    }
    let report = check.report();
    println!("{report}");
    for leak in &report.leaks {
        println!(
            "leak\t{}\t{}\t{}",
            leak.0.name.as_deref().unwrap_or("-"),
            leak.0.what,
            leak.0.bytes
        );
    }
    drop(kept);
    println!("after fix: {}", check.report());
    Ok(())
}
