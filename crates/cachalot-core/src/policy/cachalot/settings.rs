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
    /// Bytes of address space each pool reserves, small then large (virtual
    /// memory only; [`StreamConfig::range_size`]).
    pub(crate) ranges: [u64; 2],
}

impl StreamConfig {
    /// The settings of `config` on a device of `caps`: the small pool's
    /// range twice the device's memory, the large pool's four times, in
    /// whole pages.
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
            ranges: [2, 4]
                .map(|k| in_pages(caps.total_memory.saturating_mul(k)).max(1) * caps.granularity),
        }
    }

    /// Bytes of address space pool `p` reserves (1: the large pool). A
    /// block needs a free window of its size in its pool's range, and blocks
    /// of every size that come and go near the device's limit scatter the
    /// large pool's: at twice the device's memory, a random recording of a
    /// million events (tests/pressure.rs, seed 1) found no window for a
    /// 958 MiB block on a 22.6 GiB device with 1.7 GiB free (the largest
    /// free block 45 MiB), and seed 3 needed a device of 25.8 GiB where
    /// expandable segments ran on 22.6 GiB. The small pool's blocks are at
    /// most 1 MiB: twice the device's memory. Address space is not free
    /// (an H200's driver grants 128 TiB in all): past a budget, ranges are
    /// halved ([`crate::policy::cachalot::vm::pages::Pages::reserve_range`]).
    pub(crate) fn range_size(&self, p: usize) -> u64 {
        self.ranges[p]
    }
}
