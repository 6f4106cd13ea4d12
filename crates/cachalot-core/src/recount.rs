//! The recount both policies' `validate()` make: what their blocks and
//! segments say each per-pool statistic's current value must be, checked
//! against the ledger's [`MemoryStats`] in one place. The two policies keep
//! their blocks differently, but the contract is one: an allocated block
//! counts in `allocation` and `allocated_bytes`; an active block (allocated,
//! or freed and still used by a stream) in `active`, `active_bytes` and
//! `requested_bytes`; a free block in a segment that also holds active ones
//! in `inactive_split`; a segment in `segment` and its mapped bytes in
//! `reserved_bytes`. [`MemoryStats::check_levels`] is the other half: every
//! `all` figure the sum of its pools, no current value below zero or above its
//! peak.

use crate::stats::family::{
    ACTIVE, ACTIVE_BYTES, ALLOCATED_BYTES, ALLOCATION, INACTIVE_SPLIT, INACTIVE_SPLIT_BYTES,
    REQUESTED_BYTES, RESERVED_BYTES, SEGMENT,
};
use crate::stats::{MemoryStats, StatPool};

/// What blocks and segments say, counted as a policy walks them: per family
/// (its place in [`MemoryStats::arrays`]), the small pool's and the large
/// pool's figure.
#[derive(Clone, Debug, Default)]
pub(crate) struct Recount {
    counts: [[i64; 2]; MemoryStats::FAMILIES],
}

impl Recount {
    fn add(&mut self, family: usize, small: bool, amount: u64) {
        self.counts[family][usize::from(!small)] += amount as i64;
    }

    /// `count` allocated blocks of `bytes` in all.
    pub(crate) fn allocated(&mut self, small: bool, count: u64, bytes: u64) {
        self.add(ALLOCATION, small, count);
        self.add(ALLOCATED_BYTES, small, bytes);
    }

    /// `count` active blocks of `bytes` in all, asked for as `requested` bytes.
    pub(crate) fn active(&mut self, small: bool, count: u64, bytes: u64, requested: u64) {
        self.add(ACTIVE, small, count);
        self.add(ACTIVE_BYTES, small, bytes);
        self.add(REQUESTED_BYTES, small, requested);
    }

    /// `count` inactive split blocks of `bytes` in all.
    pub(crate) fn inactive_split(&mut self, small: bool, count: u64, bytes: u64) {
        self.add(INACTIVE_SPLIT, small, count);
        self.add(INACTIVE_SPLIT_BYTES, small, bytes);
    }

    /// `count` segments holding `bytes` of reserved memory in all (an
    /// expandable segment's mapped bytes may count with no segment).
    pub(crate) fn reserved(&mut self, small: bool, count: u64, bytes: u64) {
        self.add(SEGMENT, small, count);
        self.add(RESERVED_BYTES, small, bytes);
    }

    /// Checks `stats`' current values of `pool` (`All`: both pools' counts
    /// together) against the counts, every family (one the walk never
    /// counted must be 0).
    ///
    /// # Errors
    /// The first family whose figure differs, as "active_bytes.large_pool is
    /// 4096, blocks say 0".
    pub(crate) fn check(&self, stats: &MemoryStats, pool: StatPool) -> Result<(), String> {
        for ((name, array), [small, large]) in stats.arrays().into_iter().zip(self.counts) {
            let counted = match pool {
                StatPool::All => small + large,
                StatPool::Small => small,
                StatPool::Large => large,
            };
            let have = array.get(pool).current;
            if have != counted {
                return Err(format!(
                    "{name}.{} is {have}, blocks say {counted}",
                    pool.key()
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_that_differs_is_named_with_its_pool() {
        let mut stats = MemoryStats::default();
        let mut recount = Recount::default();
        recount.allocated(false, 1, 4096);
        recount.active(false, 1, 4096, 4000);
        recount.reserved(false, 1, 2 << 20);
        assert_eq!(
            recount.check(&stats, StatPool::Large),
            Err("allocation.large_pool is 0, blocks say 1".into())
        );
        for array in [&mut stats.allocation, &mut stats.active, &mut stats.segment] {
            array.large_pool.current = 1;
            array.all.current = 1;
        }
        stats.allocated_bytes.large_pool.current = 4096;
        stats.active_bytes.large_pool.current = 4096;
        stats.requested_bytes.large_pool.current = 4000;
        stats.reserved_bytes.large_pool.current = 2 << 20;
        assert_eq!(recount.check(&stats, StatPool::Large), Ok(()));
        assert_eq!(recount.check(&stats, StatPool::Small), Ok(()));
        assert_eq!(
            recount.check(&stats, StatPool::All),
            Err("allocated_bytes.all is 0, blocks say 4096".into())
        );
    }
}
