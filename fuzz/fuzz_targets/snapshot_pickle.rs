//! Any bytes through the snapshot pickle reader (guard pass, serde-pickle, schema
//! walk): each must return, never panic, in bounded memory.
#![no_main]

use cachalot::trace::pickle::snapshot_from_slice;
use cachalot::trace::ReadLimits;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = ReadLimits { max_input_bytes: 1 << 22, max_values: 1 << 20, ..ReadLimits::default() };
    let _ = snapshot_from_slice(data, &limits);
});
