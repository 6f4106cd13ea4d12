//! randn, add, matmul (with cuBLAS's 32 MiB workspace from the caching allocator),
//! drops, empty_cache, then 100 host tensors of 4 MiB moved to the GPU. Prints
//! the checkpoints of PyTorch's own run (data/traces/seed004.native.stats.json.gz).

mod support;

use cachalot_tensor::{memory, DType, Device, Tensor};
use support::{checkpoint, print_device};

fn main() -> Result<(), cachalot_tensor::TensorError> {
    let cuda = Device::Cuda(0);
    print_device()?;

    let x = Tensor::randn(&[1000, 1000], DType::F32, cuda)?;
    checkpoint("x=randn(1000,1000)");
    let y = x.add_scalar(1.0)?;
    checkpoint("y=x+1");
    let z = x.matmul(&x.t()?)?;
    checkpoint("z=x@x.T");

    // Spot-check the numbers on the host: y = x + 1 and z[0][1] = row0 . row1.
    let (xv, yv, zv) = (x.to_vec::<f32>()?, y.to_vec::<f32>()?, z.to_vec::<f32>()?);
    let dot: f64 = (0..1000)
        .map(|k| f64::from(xv[k]) * f64::from(xv[1000 + k]))
        .sum();
    println!(
        "check\ty[0]-x[0]={:.4}\tz[0,1]={:.3}\trow0.row1={dot:.3}",
        yv[0] - xv[0],
        zv[1]
    );

    drop(x);
    checkpoint("del x");
    memory::empty_cache(0)?;
    checkpoint("empty_cache");
    drop((y, z));
    memory::empty_cache(0)?;
    checkpoint("del y,z; empty_cache");

    let host: Vec<Tensor> = (0..100)
        .map(|_| Tensor::zeros(&[1 << 20], DType::F32, Device::Cpu))
        .collect::<Result<_, _>>()?;
    let on_gpu: Vec<Tensor> = host.iter().map(|t| t.to(cuda)).collect::<Result<_, _>>()?;
    checkpoint("100 x 4MiB to cuda");
    drop(on_gpu);
    checkpoint("del list");
    Ok(())
}
