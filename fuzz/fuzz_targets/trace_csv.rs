//! Any bytes through the recording reader (gzip detection, CSV or pickle), then
//! through the replay planner: each must return, never panic, in bounded memory.
#![no_main]

use cachalot::replay::{plan, RecordedDevice, H100_CAPACITY};
use cachalot::trace::{read_recording, ReadLimits};
use cachalot::AllocatorConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = ReadLimits { max_input_bytes: 1 << 22, max_values: 1 << 20, ..ReadLimits::default() };
    if let Ok(recording) = read_recording(data, &limits) {
        let device = RecordedDevice::new(H100_CAPACITY, AllocatorConfig::default());
        let _ = plan(&recording.events, &device);
    }
});
