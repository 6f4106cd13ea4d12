//! The tensor API on simulated devices, each test in a registry of its own.

use cachalot::AllocatorConfig;
use cachalot_tensor::{
    device_guard, memory, DType, Device, LeakCheck, MemoryMode, Options, Registry, RegistryGuard,
    Stream, Tensor, TensorError,
};
use half::bf16;

const CUDA: Device = Device::Cuda(0);

fn sim() -> RegistryGuard {
    let reg = Registry::new(Options::sim(AllocatorConfig::default()))
        .expect("simulated devices always exist");
    reg.enter()
}

#[test]
fn handles_cross_threads_and_current_streams_are_per_thread() -> Result<(), TensorError> {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tensor>();
    send_sync::<Stream>();
    send_sync::<cachalot_tensor::Event>();
    let reg = Registry::new(Options::sim(AllocatorConfig::default()))?;
    let _r = reg.enter();
    let side = Stream::new(0)?;
    let _g = side.enter();
    let t = Tensor::ones(&[16], DType::F32, CUDA)?;
    let other = std::thread::spawn(move || -> Result<bool, TensorError> {
        let _r = reg.enter();
        let doubled = t.mul_scalar(2.0)?;
        Ok(Stream::current(0)? == Stream::default_stream(0)?
            && doubled.to_vec::<f32>()? == vec![2.0; 16])
    });
    assert_eq!(
        other.join().ok(),
        Some(Ok(true)),
        "the spawned thread starts on the default stream"
    );
    assert_eq!(Stream::current(0)?, side);
    Ok(())
}

#[test]
fn data_round_trips_through_the_device() -> Result<(), TensorError> {
    let _r = sim();
    let t = Tensor::from_vec(vec![1.5f32, -2.0, 3.25, 4.0, 5.0, 6.0], &[2, 3], CUDA)?;
    assert_eq!(t.sizes(), &[2, 3]);
    assert_eq!(t.to_vec::<f32>()?, vec![1.5, -2.0, 3.25, 4.0, 5.0, 6.0]);
    let i = Tensor::arange(5, DType::I64, CUDA)?;
    assert_eq!(i.to_vec::<i64>()?, vec![0, 1, 2, 3, 4]);
    let b = Tensor::from_vec(vec![bf16::from_f32(0.5), bf16::from_f32(2.0)], &[2], CUDA)?
        .mul_scalar(3.0)?;
    assert_eq!(
        b.to_vec::<bf16>()?,
        vec![bf16::from_f32(1.5), bf16::from_f32(6.0)]
    );
    assert_eq!(
        t.to_vec::<f64>(),
        Err(TensorError::DTypeMismatch(DType::F32, DType::F64))
    );
    let bad = Tensor::from_vec(vec![1u8; 5], &[2, 3], Device::Cpu)
        .expect_err("5 elements do not fill 2x3");
    assert_eq!(
        bad.to_string(),
        "shape '[2, 3]' is invalid for input of size 5"
    );
    Ok(())
}

#[test]
fn storage_is_shared_and_returned_when_the_last_reference_drops() -> Result<(), TensorError> {
    let _r = sim();
    let a = Tensor::ones(&[1024, 1024], DType::F32, CUDA)?;
    assert_eq!(memory::memory_allocated(0), 4 << 20);
    let view = a.t()?;
    let same = a.to(CUDA)?;
    assert!(view.shares_storage(&a) && same.shares_storage(&a));
    drop(a);
    drop(same);
    assert_eq!(
        memory::memory_allocated(0),
        4 << 20,
        "the view still holds the storage"
    );
    drop(view);
    assert_eq!(memory::memory_allocated(0), 0);
    assert_eq!(
        memory::memory_reserved(0),
        20 << 20,
        "the segment stays cached"
    );
    memory::empty_cache(0)?;
    assert_eq!(memory::memory_reserved(0), 0);
    Ok(())
}

#[test]
fn arithmetic_and_views() -> Result<(), TensorError> {
    let _r = sim();
    let a = Tensor::from_vec(vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], CUDA)?;
    let b = Tensor::full(&[2, 3], 2.0, DType::F64, CUDA)?;
    assert_eq!(
        a.add(&b)?.to_vec::<f64>()?,
        vec![3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    );
    assert_eq!(
        a.mul(&b)?.add_scalar(-1.0)?.to_vec::<f64>()?,
        vec![1.0, 3.0, 5.0, 7.0, 9.0, 11.0]
    );
    let at = a.t()?;
    assert!(!at.is_contiguous());
    assert_eq!(at.to_vec::<f64>()?, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    assert_eq!(
        a.matmul(&at)?.to_vec::<f64>()?,
        vec![14.0, 32.0, 32.0, 77.0]
    );
    assert_eq!(at.matmul(&a)?.to_vec::<f64>()?[0], 17.0);
    assert_eq!(at.contiguous()?.to_vec::<f64>()?, at.to_vec::<f64>()?);
    a.add_(&b)?;
    assert_eq!(a.to_vec::<f64>()?[0], 3.0);
    let copy = a.deep_copy()?;
    assert!(!copy.shares_storage(&a));
    assert_eq!(copy.to_vec::<f64>()?, a.to_vec::<f64>()?);
    Ok(())
}

#[test]
fn mismatches_are_typed_errors_in_pytorchs_words() -> Result<(), TensorError> {
    let _r = sim();
    let gpu = Tensor::ones(&[2, 3], DType::F32, CUDA)?;
    let cpu = Tensor::ones(&[2, 3], DType::F32, Device::Cpu)?;
    let e = gpu.add(&cpu).expect_err("devices differ");
    assert_eq!(e.to_string(), "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!");
    let e = gpu
        .add(&Tensor::ones(&[2, 4], DType::F32, CUDA)?)
        .expect_err("shapes differ");
    assert_eq!(e, TensorError::ShapeMismatch { a: 3, b: 4, dim: 1 });
    let e = gpu.matmul(&gpu).expect_err("inner dimensions differ");
    assert_eq!(
        e.to_string(),
        "mat1 and mat2 shapes cannot be multiplied (2x3 and 2x3)"
    );
    let e = gpu
        .add(&Tensor::ones(&[2, 3], DType::F64, CUDA)?)
        .expect_err("dtypes differ");
    assert_eq!(e, TensorError::DTypeMismatch(DType::F32, DType::F64));
    assert!(matches!(
        gpu.transpose(0, 2),
        Err(TensorError::DimOutOfRange { dim: 2, rank: 2 })
    ));
    assert!(matches!(
        Tensor::zeros(&[1], DType::F32, Device::Cuda(7)),
        Err(TensorError::InvalidDevice { ordinal: 7, .. })
    ));
    assert!(matches!(
        Tensor::randn(&[1], DType::I32, CUDA),
        Err(TensorError::Unsupported(_))
    ));
    Ok(())
}

#[test]
fn device_guard_switches_the_current_device_for_a_scope() -> Result<(), TensorError> {
    let _r = sim();
    assert_eq!(Device::cuda(), Device::Cuda(0));
    {
        let _g = device_guard(1)?;
        let t = Tensor::zeros(&[8], DType::U8, Device::cuda())?;
        assert_eq!(t.device(), Device::Cuda(1));
        assert_eq!(memory::memory_allocated(1), 512);
        let back = t.to(Device::Cuda(0))?;
        assert_eq!(back.to_vec::<u8>()?, vec![0; 8]);
    }
    assert_eq!(Device::cuda(), Device::Cuda(0));
    assert!(device_guard(2).is_err());
    Ok(())
}

#[test]
fn streams_guards_events_and_record_stream() -> Result<(), TensorError> {
    let _r = sim();
    let default = Stream::default_stream(0)?;
    let side = Stream::new(0)?;
    assert_ne!(side, default);
    let pool: Vec<Stream> = (0..32).map(|_| Stream::new(0)).collect::<Result<_, _>>()?;
    assert_eq!(
        pool[31], side,
        "32 side streams per device, then round-robin"
    );
    assert!(pool[..31].iter().all(|s| *s != side));
    assert_eq!(Stream::current(0)?, default);
    let t = {
        let _g = side.enter();
        assert_eq!(Stream::current(0)?, side);
        Tensor::ones(&[256], DType::F32, CUDA)?
    };
    assert_eq!(Stream::current(0)?, default);
    default.wait_stream(&side)?;
    t.record_stream(&default)?;
    let start = default.record_event()?;
    let end = default.record_event()?;
    end.synchronize()?;
    assert!(end.query() && start.elapsed_ms(&end)? >= 0.0);
    drop(t);
    assert_eq!(memory::memory_allocated(0), 0);
    // The block was allocated for the side stream: a default-stream request gets a new segment.
    let _u = Tensor::ones(&[256], DType::F32, CUDA)?;
    assert_eq!(memory::memory_stats(0)["segment.all.current"], 2);
    Ok(())
}

#[test]
fn pinned_copies_and_lazy_host_memory() -> Result<(), TensorError> {
    let _r = sim();
    let host = Tensor::arange(1000, DType::F32, Device::Cpu)?.pin_memory()?;
    assert!(host.is_pinned());
    let side = Stream::new(0)?;
    let dev = {
        let _g = side.enter();
        host.to_non_blocking(CUDA)?
    };
    side.synchronize()?;
    assert_eq!(dev.to_vec::<f32>()?[999], 999.0);
    drop(host);
    let again = Tensor::zeros(&[1000], DType::F32, Device::Cpu)?.pin_memory()?;
    assert_eq!(memory::pinned_memory_stats().reuses, 1);
    drop(again);

    let big = Tensor::zeros(&[256, 1024, 1024], DType::F32, CUDA)?;
    assert_eq!(
        memory::simulated_host_bytes(0),
        4000,
        "a 1 GiB zeros takes no host memory until written"
    );
    let small = Tensor::ones(&[1024], DType::F32, CUDA)?;
    assert_eq!(memory::simulated_host_bytes(0), 4000 + 4096);
    drop((big, small));
    Ok(())
}

#[test]
fn memory_api_and_peak_stats() -> Result<(), TensorError> {
    let _r = sim();
    assert_eq!(
        memory::memory_allocated(1),
        0,
        "an unused device reads as zero"
    );
    let a = Tensor::zeros(&[3 << 20], DType::F32, CUDA)?;
    drop(a);
    assert_eq!(memory::max_memory_allocated(0), 12 << 20);
    memory::reset_peak_memory_stats(0);
    assert_eq!(memory::max_memory_allocated(0), 0);
    assert_eq!(memory::max_memory_reserved(0), memory::memory_reserved(0));
    let info = memory::mem_get_info(0)?;
    assert_eq!(info.total, 85_017_493_504);
    assert!(info.free < info.total);
    assert!(memory::set_per_process_memory_fraction(1.5, 0).is_err());
    Ok(())
}

#[test]
fn preallocate_mode_reserves_up_front() -> Result<(), TensorError> {
    let opts = Options {
        mode: MemoryMode::Preallocate(0.05),
        sim_capacity: 1 << 30,
        ..Options::sim(AllocatorConfig::default())
    };
    let _r = Registry::new(opts)?.enter();
    let t = Tensor::zeros(&[4 << 20], DType::F32, CUDA)?;
    let reserved = memory::memory_reserved(0);
    assert_eq!(
        reserved,
        50 << 20,
        "5% of 1 GiB (51.2 MiB), down to whole 2 MiB pages"
    );
    let u = Tensor::zeros(&[4 << 20], DType::F32, CUDA)?;
    assert_eq!(
        memory::memory_reserved(0),
        reserved,
        "served from the preallocated segment"
    );
    let e = Tensor::zeros(&[16 << 20], DType::F32, CUDA).expect_err("beyond the cap");
    assert!(e.is_out_of_memory(), "{e}");
    drop((t, u));
    Ok(())
}

#[test]
fn leak_check_names_tensors_made_since_the_baseline() -> Result<(), TensorError> {
    let _r = sim();
    let before = Tensor::ones(&[10], DType::F32, CUDA)?;
    let check = LeakCheck::start(0)?;
    let temp = Tensor::ones(&[10], DType::F32, CUDA)?;
    drop(temp);
    let kept = Tensor::ones(&[64], DType::F32, CUDA)?;
    kept.set_name("kept");
    let report = check.report();
    assert_eq!(report.leaks.len(), 1, "{report}");
    assert_eq!(report.leaks[0].0.name.as_deref(), Some("kept"));
    assert_eq!(report.leaks[0].0.what, "float32[64]");
    assert!(report.to_string().contains("tests/api.rs"), "{report}");
    drop((before, kept));
    assert!(check.report().is_clean());
    Ok(())
}
