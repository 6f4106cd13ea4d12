//! The process-wide registry reads its settings from the environment; a malformed
//! setting makes every device call fail with the parse error instead of panicking.
//! (Its own test binary: it sets environment variables for the whole process.)

use cachalot_tensor::{device_count, memory, DType, Device, Options, Tensor, TensorError};

#[test]
fn a_malformed_environment_is_a_typed_error_on_first_use() {
    std::env::set_var("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:Maybe");
    std::env::set_var("CACHALOT_DEVICE", "sim");
    let parsed = Options::from_env().expect_err("`Maybe` is not a boolean");
    assert!(
        parsed.to_string().contains("expandable_segments"),
        "{parsed}"
    );
    let e = Tensor::zeros(&[4], DType::F32, Device::Cuda(0))
        .expect_err("the registry could not be configured");
    assert_eq!(e, parsed);
    assert_eq!(device_count(), 0);
    assert_eq!(memory::memory_allocated(0), 0);
    assert!(matches!(
        memory::mem_get_info(0),
        Err(TensorError::Allocator(_))
    ));
    // Host tensors need no device.
    assert_eq!(
        Tensor::ones(&[2], DType::I32, Device::Cpu).and_then(|t| t.to_vec::<i32>()),
        Ok(vec![1, 1])
    );
}
