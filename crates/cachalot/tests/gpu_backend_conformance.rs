//! The backend contract (`backend/mod.rs`, checked by
//! `cachalot_testkit::backend`) on every backend and adaptor stack: the
//! simulated device with and without virtual memory, each adaptor over it
//! with nothing armed, a stack of all of them, and the CUDA backend, which
//! prints "skipped: no GPU (...)" and checks the simulated device instead
//! where no GPU is present (named `gpu_*` so that the GPU script runs it).
//! The CUDA backend with segments from the runtime's `cudaMalloc` has a test
//! program of its own (`gpu_runtime_conformance.rs`): the suite checks the
//! device's free memory, which two CUDA backends of one process would move
//! under each other's checks.

use std::sync::Arc;

use cachalot::backend::counting::Counting;
use cachalot::backend::cuda::CudaBackend;
use cachalot::backend::faults::Faults;
use cachalot::backend::limit::Limit;
use cachalot::backend::sim::SimBackend;
use cachalot::backend::Backend;
use cachalot_testkit::backend_suite;

fn sim(virtual_memory: bool) -> Arc<SimBackend> {
    Arc::new(SimBackend::with_options(8 << 30, virtual_memory))
}

backend_suite!(sim_vm, || -> Arc<dyn Backend> { sim(true) });
backend_suite!(sim_novm, || -> Arc<dyn Backend> { sim(false) });
backend_suite!(counting, || -> Arc<dyn Backend> {
    Arc::new(Counting::new(sim(true)))
});
backend_suite!(faults_unarmed, || -> Arc<dyn Backend> {
    Arc::new(Faults::new(sim(true)))
});
backend_suite!(limit_roomy, || -> Arc<dyn Backend> {
    Arc::new(Limit::new(sim(true), Some(4 << 30)))
});
backend_suite!(stack_novm, || -> Arc<dyn Backend> {
    Arc::new(Counting::new(Arc::new(Limit::new(
        Arc::new(Faults::new(sim(false))),
        Some(4 << 30),
    ))))
});
backend_suite!(cuda, || -> Arc<dyn Backend> {
    match CudaBackend::new(0) {
        Ok(gpu) => Arc::new(gpu),
        Err(e) => {
            eprintln!("skipped: no GPU ({e}); checked on the simulated device instead");
            sim(true)
        }
    }
});
