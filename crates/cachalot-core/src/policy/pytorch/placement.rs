//! The placement rules of PyTorch's allocator, as pure functions of sizes and
//! settings: rounding, pool choice, segment size, the oversize fit rules and the
//! split rule. Nothing here touches a backend or allocator state.

use crate::config::{AllocatorConfig, MIB};

/// Every block size is a multiple of this (and at least this).
pub(crate) const MIN_BLOCK_SIZE: u64 = 512;
/// The largest request served by the small pool.
pub(crate) const SMALL_SIZE: u64 = MIB;
/// Small-pool segment size (and small expandable page size).
pub(crate) const SMALL_BUFFER: u64 = 2 * MIB;
/// Large-pool segment size for requests under [`MIN_LARGE_ALLOC`] (and the large
/// expandable page size).
pub(crate) const LARGE_BUFFER: u64 = 20 * MIB;
/// Requests from here on get a segment of their own size.
pub(crate) const MIN_LARGE_ALLOC: u64 = 10 * MIB;
/// Large segments are rounded to this.
pub(crate) const ROUND_LARGE: u64 = 2 * MIB;

/// The settings placement depends on, read once from the configuration.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Placement {
    /// Blocks of at least this size are oversize (`u64::MAX` = none).
    pub(crate) max_split_size: u64,
    /// How much larger than an oversize request a cached block may be.
    pub(crate) max_non_split_rounding: u64,
    /// `roundup_power2_divisions` per bucket.
    pub(crate) divisions: [u64; crate::config::ROUNDUP_BUCKETS],
    /// Whether segments grow by mapping pages.
    pub(crate) expandable: bool,
}

impl Placement {
    /// The placement settings of `config`; `virtual_memory` says whether the
    /// backend can map pages (expandable segments stay off otherwise, as in
    /// PyTorch on platforms without the driver API).
    pub(crate) fn new(config: &AllocatorConfig, virtual_memory: bool) -> Placement {
        Placement {
            max_split_size: config.max_split_size.unwrap_or(u64::MAX),
            max_non_split_rounding: config.max_non_split_rounding,
            divisions: config.roundup_power2_divisions,
            expandable: config.expandable_segments && virtual_memory,
        }
    }

    /// The block size for a request of `size` bytes (`size >= 1`).
    pub(crate) fn round_size(&self, size: u64) -> u64 {
        if size < MIN_BLOCK_SIZE {
            return MIN_BLOCK_SIZE;
        }
        let divisions = self.divisions_for(size);
        if divisions > 1 && size > MIN_BLOCK_SIZE * divisions {
            next_division(size, divisions)
        } else {
            size.div_ceil(MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE
        }
    }

    fn divisions_for(&self, size: u64) -> u64 {
        let log = u64::from(63 - size.leading_zeros());
        let start = u64::from(MIB.trailing_zeros());
        let index = log
            .saturating_sub(start)
            .min(self.divisions.len() as u64 - 1);
        self.divisions[index as usize]
    }

    /// Whether a cached block of `candidate` bytes may serve a request of `size`
    /// bytes under the oversize rules (only the best-fit candidate is tried).
    pub(crate) fn oversize_allows(&self, size: u64, candidate: u64) -> bool {
        if size < self.max_split_size && candidate >= self.max_split_size {
            return false;
        }
        !(size >= self.max_split_size
            && candidate >= size.saturating_add(self.max_non_split_rounding))
    }

    /// Whether a block of `block` bytes serving `size` bytes leaves a remainder
    /// worth splitting off (`expandable`: under expandable segments' rule).
    pub(crate) fn should_split(
        &self,
        small: bool,
        expandable: bool,
        block: u64,
        size: u64,
    ) -> bool {
        let remaining = block - size;
        if small || expandable {
            remaining >= MIN_BLOCK_SIZE
        } else {
            size < self.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// Whether a block or segment of `size` bytes counts as oversize.
    pub(crate) fn is_oversize(&self, size: u64) -> bool {
        size >= self.max_split_size
    }
}

/// Whether a rounded size belongs to the small pool.
pub(crate) fn is_small(rounded: u64) -> bool {
    rounded <= SMALL_SIZE
}

/// The size of a new segment for a block of `rounded` bytes.
pub(crate) fn allocation_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_BUFFER
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_BUFFER
    } else {
        rounded.div_ceil(ROUND_LARGE) * ROUND_LARGE
    }
}

/// The page size of an expandable segment of the given pool.
pub(crate) fn page_size(small: bool) -> u64 {
    if small {
        SMALL_BUFFER
    } else {
        LARGE_BUFFER
    }
}

/// Rounds `size` up to the next of `divisions` equal steps between the powers of
/// two around it; powers of two stay as they are.
fn next_division(size: u64, divisions: u64) -> u64 {
    if size.is_power_of_two() {
        return size;
    }
    let floor = 1u64 << (63 - size.leading_zeros());
    let step = floor >> (63 - divisions.leading_zeros());
    if step == 0 {
        return floor << 1;
    }
    let down = size & !(step - 1);
    if down == size {
        size
    } else {
        down + step
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placement(conf: &str) -> Placement {
        Placement::new(
            &AllocatorConfig::parse(conf).expect("valid test conf"),
            true,
        )
    }

    #[test]
    fn rounding_follows_pytorch() {
        let p = placement("");
        assert_eq!(p.round_size(1), 512);
        assert_eq!(p.round_size(512), 512);
        assert_eq!(p.round_size(513), 1024);
        let p4 = placement("roundup_power2_divisions:4");
        assert_eq!(
            p4.round_size(1200),
            1536,
            "at most 512 * divisions: plain rounding"
        );
        assert_eq!(p4.round_size(2500), 2560);
        assert_eq!(p4.round_size(2048), 2048);
        assert_eq!(p4.round_size(1_048_575), 1_048_576);
        assert_eq!(p4.round_size(5 * MIB + 1), 6 * MIB);
        assert_eq!(
            p4.round_size(1000),
            1024,
            "below 512 * divisions: plain rounding"
        );
    }

    #[test]
    fn segment_sizes_and_pools() {
        assert_eq!(allocation_size(1024), SMALL_BUFFER);
        assert_eq!(allocation_size(5 * MIB), LARGE_BUFFER);
        assert_eq!(allocation_size(10 * MIB), 10 * MIB);
        assert_eq!(allocation_size(15 * MIB), 16 * MIB);
        assert!(is_small(MIB));
        assert!(!is_small(MIB + 512));
    }

    #[test]
    fn split_and_oversize_rules() {
        let p = placement("");
        assert!(p.should_split(true, false, 2 * MIB, 2 * MIB - 512));
        assert!(
            !p.should_split(false, false, 16 * MIB, 15 * MIB),
            "1 MiB remainder is not split"
        );
        assert!(p.should_split(false, false, 20 * MIB, 5 * MIB));
        let m = placement("max_split_size_mb:64");
        assert!(
            !m.should_split(false, false, 200 * MIB, 100 * MIB),
            "oversize requests never split"
        );
        assert!(!m.oversize_allows(30 * MIB, 100 * MIB));
        assert!(m.oversize_allows(100 * MIB, 110 * MIB));
        assert!(!m.oversize_allows(100 * MIB, 120 * MIB));
        assert!(p.should_split(false, true, 20 * MIB, 20 * MIB - 512));
    }
}
