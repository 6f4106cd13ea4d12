//! What a stream needs of the allocator's configuration, worked out once
//! for the device.

use crate::backend::Capabilities;
use crate::config::AllocatorConfig;

/// Settings a stream needs.
#[derive(Copy, Clone, Debug)]
pub(crate) struct StreamConfig {
    /// `cachalot_reuse_slack`.
    pub(crate) slack: f64,
    /// `cachalot_churn_slack`.
    pub(crate) churn_slack: f64,
    /// `cachalot_reuse_min`, in pages.
    pub(crate) min_pages: u64,
    /// `cachalot_extent`, in pages (at least one).
    pub(crate) extent_pages: u32,
    /// `cachalot_release_threshold`.
    pub(crate) threshold: Option<u64>,
    /// Bytes of address space reserved per pool (virtual memory only).
    pub(crate) range_size: u64,
}

impl StreamConfig {
    /// The settings of `config` on a device of `caps`: each pool's range
    /// twice the device's memory, in whole pages.
    pub(crate) fn new(config: &AllocatorConfig, caps: &Capabilities) -> StreamConfig {
        let in_pages = |bytes: u64| match caps.granularity {
            0 => 0,
            g => bytes.div_ceil(g),
        };
        StreamConfig {
            slack: config.cachalot_reuse_slack,
            churn_slack: config.cachalot_churn_slack,
            min_pages: in_pages(config.cachalot_reuse_min),
            extent_pages: match caps.granularity {
                0 => 1,
                g => u32::try_from(config.cachalot_extent / g)
                    .unwrap_or(u32::MAX)
                    .max(1),
            },
            threshold: config.cachalot_release_threshold,
            range_size: in_pages(caps.total_memory.saturating_mul(2)).max(1) * caps.granularity,
        }
    }
}
