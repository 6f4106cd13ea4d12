//! A copy between two GPUs (peer access where the pair allows it), and a device
//! guard that makes `Device::cuda()` mean the second GPU for a scope. Skips with a
//! message when fewer than two devices are present.

use std::time::Instant;

use cachalot_tensor::{
    can_device_access_peer, device_count, device_guard, memory, DType, Device, Tensor, TensorError,
};

fn main() -> Result<(), TensorError> {
    let n = device_count();
    if n < 2 {
        println!("skipped: a copy between two GPUs needs two devices, this machine has {n}");
        return Ok(());
    }
    println!(
        "devices {n}; simulated: {}; peer access 0->1: {}",
        memory::is_simulated(0)?,
        can_device_access_peer(1, 0)?
    );
    let simulated = memory::is_simulated(0)?;
    let elems = if simulated { 1 << 20 } else { 64 << 20 };

    let x = Tensor::arange(elems, DType::F32, Device::Cuda(0))?;
    memory::synchronize(0)?;
    let start = Instant::now();
    let y = x.to(Device::Cuda(1))?;
    memory::synchronize(1)?;
    let secs = start.elapsed().as_secs_f64();
    println!(
        "copied {} MiB cuda:0 -> cuda:1 in {:.3} ms ({:.1} GB/s)",
        x.nbytes() >> 20,
        secs * 1e3,
        x.nbytes() as f64 / secs / 1e9
    );

    let same = x.to_vec::<f32>()? == y.to_vec::<f32>()?;
    println!("equal\t{same}");
    println!(
        "cuda:0\t{}\t{}",
        memory::memory_allocated(0),
        memory::memory_reserved(0)
    );
    println!(
        "cuda:1\t{}\t{}",
        memory::memory_allocated(1),
        memory::memory_reserved(1)
    );
    {
        let _on_1 = device_guard(1)?;
        let z = Tensor::ones(&[1024], DType::F32, Device::cuda())?;
        println!("under the guard Device::cuda() is {}", z.device());
    }
    println!("after the guard Device::cuda() is {}", Device::cuda());
    if !same {
        return Err(TensorError::Unsupported(
            "the copy between GPUs changed the data".into(),
        ));
    }
    Ok(())
}
