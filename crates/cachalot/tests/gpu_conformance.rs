//! The conformance suite on a real GPU, for the pytorch policy under each
//! configuration. Where no GPU is present each check
//! prints "skipped: no GPU (...)" and runs on the simulated device instead, so CI
//! still compiles and exercises this file.

use std::sync::Arc;

use cachalot::allocator::create;
use cachalot::backend::cuda::CudaBackend;
use cachalot::backend::sim::SimBackend;
use cachalot::backend::Backend;
use cachalot::{AllocatorConfig, DeviceAllocator};
use cachalot_testkit::conformance_suite;

fn gpu(conf: &str) -> Arc<dyn DeviceAllocator> {
    let config = AllocatorConfig::parse(conf).expect("conf");
    let backend: Arc<dyn Backend> = match CudaBackend::new(0) {
        Ok(gpu) => {
            let side = gpu.create_stream().expect("stream");
            cachalot_testkit::conformance::set_side_stream(side);
            Arc::new(gpu)
        }
        Err(e) => {
            eprintln!("skipped: no GPU ({e}); checked on the simulated device instead");
            Arc::new(SimBackend::new(8 << 30))
        }
    };
    create(backend, config).expect("allocator")
}

conformance_suite!(cuda_pytorch_native, || gpu(""));
conformance_suite!(cuda_pytorch_expandable, || gpu("expandable_segments:True"));
conformance_suite!(cuda_pytorch_max_split_64, || gpu("max_split_size_mb:64"));
conformance_suite!(cuda_pytorch_roundup_4, || gpu("roundup_power2_divisions:4"));
conformance_suite!(cuda_cachalot, || gpu("policy:cachalot"));
