//! The 1 GiB experiment: PyTorch's caching in twelve steps. Prints
//! `memory_allocated` and `memory_reserved` after each step, the checkpoints of
//! PyTorch's own run (data/traces/seed002.*.stats.json.gz).
//!
//! Run: `cargo run -p cachalot-tensor --example one_gib` (a GPU if present, else a
//! simulated one; `CACHALOT_DEVICE=sim` forces the simulation;
//! `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` switches the allocator mode).

mod support;

use cachalot_tensor::{memory, DType, Device, Tensor};
use support::{checkpoint, print_device};

/// 256 x 1024 x 1024 f32 = 1 GiB.
const GIB: [usize; 3] = [256, 1024, 1024];

fn main() -> Result<(), cachalot_tensor::TensorError> {
    let cuda = Device::Cuda(0);
    let zeros = |device| Tensor::zeros(&GIB, DType::F32, device);
    print_device()?;

    let a = zeros(cuda)?;
    checkpoint("a=zeros cuda");
    let mut b = zeros(cuda)?;
    checkpoint("b=zeros cuda");
    b = b.to(Device::Cpu)?;
    checkpoint("b=b.to(cpu)");
    let mut c = zeros(cuda)?;
    checkpoint("c=zeros cuda");
    // `c = torch.zeros(...)` again: the new c exists before the old one is dropped.
    let old_c = std::mem::replace(&mut c, zeros(cuda)?);
    drop(old_c);
    checkpoint("c=zeros cuda again");
    let d = zeros(cuda)?;
    checkpoint("d=zeros cuda");
    drop(d);
    checkpoint("del d");
    let mut e = zeros(Device::Cpu)?;
    checkpoint("e=zeros cpu");
    e = e.to(cuda)?;
    checkpoint("e=e.to(cuda)");
    memory::empty_cache(0)?;
    checkpoint("empty_cache");
    drop((a, b, c, e));
    checkpoint("del all");
    memory::empty_cache(0)?;
    checkpoint("empty_cache 2");
    Ok(())
}
