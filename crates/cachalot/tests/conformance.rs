//! The conformance suite, run against every backend and policy configuration.

use std::sync::Arc;

use cachalot::allocator::create;
use cachalot::backend::sim::SimBackend;
use cachalot::{AllocatorConfig, DeviceAllocator};
use cachalot_testkit::conformance_suite;

fn sim(virtual_memory: bool, conf: &str) -> Arc<dyn DeviceAllocator> {
    let backend = Arc::new(SimBackend::with_options(8 << 30, virtual_memory));
    create(backend, AllocatorConfig::parse(conf).unwrap()).unwrap()
}

conformance_suite!(sim_vm_pytorch_native, || sim(true, ""));
conformance_suite!(sim_vm_pytorch_expandable, || sim(
    true,
    "expandable_segments:True"
));
conformance_suite!(sim_vm_pytorch_max_split_64, || sim(
    true,
    "max_split_size_mb:64"
));
conformance_suite!(sim_vm_pytorch_roundup_4, || sim(
    true,
    "roundup_power2_divisions:4"
));
conformance_suite!(sim_novm_pytorch_native, || sim(false, ""));
conformance_suite!(sim_novm_pytorch_expandable, || sim(
    false,
    "expandable_segments:True"
));
conformance_suite!(sim_novm_pytorch_max_split_64, || sim(
    false,
    "max_split_size_mb:64"
));
conformance_suite!(sim_novm_pytorch_roundup_4, || sim(
    false,
    "roundup_power2_divisions:4"
));
conformance_suite!(sim_vm_cachalot, || sim(true, "policy:cachalot"));
conformance_suite!(sim_vm_cachalot_tight, || sim(
    true,
    "policy:cachalot,cachalot_reuse_slack:0,cachalot_reuse_min_mb:0"
));
conformance_suite!(sim_novm_cachalot, || sim(false, "policy:cachalot"));
