//! Any bytes through the readers of statistics JSON, JSON snapshots and
//! allocator settings (PYTORCH_CUDA_ALLOC_CONF): each must return, never panic.
#![no_main]

use cachalot::snapshot_io::json;
use cachalot::trace::stats::read_stats;
use cachalot::trace::ReadLimits;
use cachalot::AllocatorConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = ReadLimits { max_input_bytes: 1 << 22, max_values: 1 << 20, ..ReadLimits::default() };
    let _ = read_stats(data, &limits);
    let _ = json::read(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = AllocatorConfig::parse(text);
    }
});
