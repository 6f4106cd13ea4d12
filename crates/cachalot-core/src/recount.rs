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

use crate::stats::{MemoryStats, StatArray, StatPool};

/// The families a policy's blocks and segments determine, for one pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Levels {
    allocation: i64,
    allocated_bytes: i64,
    active: i64,
    active_bytes: i64,
    requested_bytes: i64,
    inactive_split: i64,
    inactive_split_bytes: i64,
    segment: i64,
    reserved_bytes: i64,
}

impl Levels {
    fn plus(self, other: Levels) -> Levels {
        Levels {
            allocation: self.allocation + other.allocation,
            allocated_bytes: self.allocated_bytes + other.allocated_bytes,
            active: self.active + other.active,
            active_bytes: self.active_bytes + other.active_bytes,
            requested_bytes: self.requested_bytes + other.requested_bytes,
            inactive_split: self.inactive_split + other.inactive_split,
            inactive_split_bytes: self.inactive_split_bytes + other.inactive_split_bytes,
            segment: self.segment + other.segment,
            reserved_bytes: self.reserved_bytes + other.reserved_bytes,
        }
    }

    /// Each family's name, its figure in `stats`, and what was counted.
    fn against<'a>(&self, stats: &'a MemoryStats) -> [(&'static str, &'a StatArray, i64); 9] {
        [
            ("allocation", &stats.allocation, self.allocation),
            (
                "allocated_bytes",
                &stats.allocated_bytes,
                self.allocated_bytes,
            ),
            ("active", &stats.active, self.active),
            ("active_bytes", &stats.active_bytes, self.active_bytes),
            (
                "requested_bytes",
                &stats.requested_bytes,
                self.requested_bytes,
            ),
            ("inactive_split", &stats.inactive_split, self.inactive_split),
            (
                "inactive_split_bytes",
                &stats.inactive_split_bytes,
                self.inactive_split_bytes,
            ),
            ("segment", &stats.segment, self.segment),
            ("reserved_bytes", &stats.reserved_bytes, self.reserved_bytes),
        ]
    }
}

/// What blocks and segments say, per pool, counted as a policy walks them.
#[derive(Clone, Debug, Default)]
pub(crate) struct Recount {
    small: Levels,
    large: Levels,
}

impl Recount {
    fn levels(&mut self, small: bool) -> &mut Levels {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    /// `count` allocated blocks of `bytes` in all.
    pub(crate) fn allocated(&mut self, small: bool, count: u64, bytes: u64) {
        let l = self.levels(small);
        l.allocation += count as i64;
        l.allocated_bytes += bytes as i64;
    }

    /// `count` active blocks of `bytes` in all, asked for as `requested` bytes.
    pub(crate) fn active(&mut self, small: bool, count: u64, bytes: u64, requested: u64) {
        let l = self.levels(small);
        l.active += count as i64;
        l.active_bytes += bytes as i64;
        l.requested_bytes += requested as i64;
    }

    /// `count` inactive split blocks of `bytes` in all.
    pub(crate) fn inactive_split(&mut self, small: bool, count: u64, bytes: u64) {
        let l = self.levels(small);
        l.inactive_split += count as i64;
        l.inactive_split_bytes += bytes as i64;
    }

    /// `count` segments holding `bytes` of reserved memory in all (an
    /// expandable segment's mapped bytes may count with no segment).
    pub(crate) fn reserved(&mut self, small: bool, count: u64, bytes: u64) {
        let l = self.levels(small);
        l.segment += count as i64;
        l.reserved_bytes += bytes as i64;
    }

    /// Checks `stats`' current values of `pool` (`All`: both pools' counts
    /// together) against the counts.
    ///
    /// # Errors
    /// The first family whose figure differs, as "active_bytes.large_pool is
    /// 4096, blocks say 0".
    pub(crate) fn check(&self, stats: &MemoryStats, pool: StatPool) -> Result<(), String> {
        let levels = match pool {
            StatPool::All => self.small.plus(self.large),
            StatPool::Small => self.small,
            StatPool::Large => self.large,
        };
        for (name, array, counted) in levels.against(stats) {
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
