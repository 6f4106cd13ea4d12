//! Memory statistics with PyTorch's key names and meanings.
//!
//! A [`Stat`] is a gauge with its peak and two monotonic totals; a [`StatArray`]
//! holds one per [`StatPool`] (`all`, `small_pool`, `large_pool`). [`MemoryStats`]
//! declares every family once, in the lists of one macro (`memory_stats!`), so the
//! key names, resets and map export cannot drift apart. Besides PyTorch's
//! families it keeps statistics of cachalot's own (`paused_bytes`), in the map
//! under their names and left out of [`MemoryStats::to_numbers`] (PyTorch's
//! `DeviceStats`).
//!
//! Policies change statistics in one place each: on block state transitions.
//! Nothing else writes them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One statistic: a current value, its peak since the last peak reset, and the
/// cumulative increases (`allocated`) and decreases (`freed`) since the last
/// accumulated reset.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// The gauge.
    pub current: i64,
    /// The highest `current` since the last [`Stat::reset_peak`].
    pub peak: i64,
    /// Sum of all increases.
    pub allocated: i64,
    /// Sum of all decreases.
    pub freed: i64,
}

impl Stat {
    /// Adds `amount` to the gauge (a negative amount decreases it).
    #[inline]
    pub fn update(&mut self, amount: i64) {
        if amount > 0 {
            self.increase(amount.unsigned_abs());
        } else {
            self.decrease(amount.unsigned_abs());
        }
    }

    /// Adds `amount` ([`Stat::update`] without the sign test).
    #[inline]
    pub fn increase(&mut self, amount: u64) {
        self.current += amount as i64;
        self.allocated += amount as i64;
        self.peak = self.peak.max(self.current);
    }

    /// Subtracts `amount` ([`Stat::update`] without the sign test).
    #[inline]
    pub fn decrease(&mut self, amount: u64) {
        self.current -= amount as i64;
        debug_assert!(self.current >= 0, "stat went negative: {self:?}");
        self.freed += amount as i64;
    }

    /// Current, peak, allocated and freed, in that order.
    pub fn numbers(&self) -> [i64; 4] {
        [self.current, self.peak, self.allocated, self.freed]
    }

    /// Sets the peak to the current value.
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// Adds each number of `other` to this one's, the peak too (so the peak
    /// is the sum of peaks, which bounds the peak of the sum from above).
    pub(crate) fn add(&mut self, other: &Stat) {
        let Stat {
            current,
            peak,
            allocated,
            freed,
        } = *other;
        self.current += current;
        self.peak += peak;
        self.allocated += allocated;
        self.freed += freed;
    }

    /// Zeroes the cumulative totals.
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }

    fn export(&self, prefix: &str, out: &mut BTreeMap<String, i64>) {
        out.insert(format!("{prefix}.current"), self.current);
        out.insert(format!("{prefix}.peak"), self.peak);
        out.insert(format!("{prefix}.allocated"), self.allocated);
        out.insert(format!("{prefix}.freed"), self.freed);
    }
}

/// Which pool a statistic counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum StatPool {
    /// Both pools together.
    All,
    /// Requests of 1 MiB or less.
    Small,
    /// Larger requests.
    Large,
}

impl StatPool {
    /// PyTorch's name for the pool in stat keys.
    pub fn key(self) -> &'static str {
        match self {
            StatPool::All => "all",
            StatPool::Small => "small_pool",
            StatPool::Large => "large_pool",
        }
    }

    /// The specific pool for a small (`true`) or large block.
    pub fn of(small: bool) -> StatPool {
        if small {
            StatPool::Small
        } else {
            StatPool::Large
        }
    }
}

/// One [`Stat`] per pool.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatArray {
    /// Both pools.
    pub all: Stat,
    /// The small pool.
    pub small_pool: Stat,
    /// The large pool.
    pub large_pool: Stat,
}

impl StatArray {
    /// Updates `all` and the given specific pool by `amount`.
    #[inline]
    pub fn update(&mut self, small: bool, amount: i64) {
        self.all.update(amount);
        if small {
            self.small_pool.update(amount);
        } else {
            self.large_pool.update(amount);
        }
    }

    /// Adds `amount` to `all` and the given specific pool.
    #[inline]
    pub fn increase(&mut self, small: bool, amount: u64) {
        self.all.increase(amount);
        self.pool_mut(small).increase(amount);
    }

    /// Subtracts `amount` from `all` and the given specific pool.
    #[inline]
    pub fn decrease(&mut self, small: bool, amount: u64) {
        self.all.decrease(amount);
        self.pool_mut(small).decrease(amount);
    }

    /// The specific pool's stat, chosen without a branch (small and large
    /// requests alternate unpredictably on the hot path).
    #[inline]
    fn pool_mut(&mut self, small: bool) -> &mut Stat {
        let [small_pool, large_pool] = [&mut self.small_pool, &mut self.large_pool];
        [large_pool, small_pool][usize::from(small)]
    }

    /// The stat of one pool.
    pub fn get(&self, pool: StatPool) -> &Stat {
        match pool {
            StatPool::All => &self.all,
            StatPool::Small => &self.small_pool,
            StatPool::Large => &self.large_pool,
        }
    }

    fn each_mut(&mut self) -> [&mut Stat; 3] {
        [&mut self.all, &mut self.small_pool, &mut self.large_pool]
    }

    /// Adds `other`'s statistics pool by pool ([`Stat::add`]).
    fn add(&mut self, other: &StatArray) {
        let StatArray {
            all,
            small_pool,
            large_pool,
        } = other;
        self.all.add(all);
        self.small_pool.add(small_pool);
        self.large_pool.add(large_pool);
    }

    fn export(&self, name: &str, out: &mut BTreeMap<String, i64>) {
        for pool in [StatPool::All, StatPool::Small, StatPool::Large] {
            self.get(pool)
                .export(&format!("{name}.{}", pool.key()), out);
        }
    }
}

/// Whether `a` and `b` are the same string (for constants).
const fn same_str(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Checks that `stat`'s current value lies in `[0, peak]`.
fn within_peak(name: &str, stat: &Stat) -> Result<(), String> {
    if stat.current < 0 || stat.current > stat.peak {
        return Err(format!(
            "{name}: current {} outside [0, peak {}]",
            stat.current, stat.peak
        ));
    }
    Ok(())
}

macro_rules! memory_stats {
    (
        arrays { $($(#[$adoc:meta])* $array:ident,)* }
        singles { $($(#[$sdoc:meta])* $single:ident,)* }
        counters { $($(#[$cdoc:meta])* $counter:ident,)* }
        own { $($(#[$odoc:meta])* $own:ident,)* }
    ) => {
        /// A device allocator's statistics: PyTorch's `memory_stats()` families.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct MemoryStats {
            $($(#[$adoc])* pub $array: StatArray,)*
            $($(#[$sdoc])* pub $single: Stat,)*
            $($(#[$cdoc])* pub $counter: i64,)*
            $($(#[$odoc])* pub $own: Stat,)*
            /// The configured split limit in bytes; -1 when unlimited (PyTorch's
            /// `SIZE_MAX` seen as a signed integer).
            pub max_split_size: i64,
        }

        impl MemoryStats {
            /// Sets every peak to its current value (`reset_peak_memory_stats`).
            pub fn reset_peak(&mut self) {
                $(for s in self.$array.each_mut() { s.reset_peak(); })*
                $(self.$single.reset_peak();)*
                $(self.$own.reset_peak();)*
            }

            /// Zeroes every cumulative total and event counter
            /// (`reset_accumulated_memory_stats`).
            pub fn reset_accumulated(&mut self) {
                $(for s in self.$array.each_mut() { s.reset_accumulated(); })*
                $(self.$single.reset_accumulated();)*
                $(self.$own.reset_accumulated();)*
                $(self.$counter = 0;)*
            }

            /// Adds `other`'s statistics and counters to these, number by
            /// number ([`Stat::add`]: peaks add up too); `max_split_size`, a
            /// setting, stays. Generated from the lists that declare the
            /// fields, so a statistic added to them is summed too.
            pub(crate) fn add(&mut self, other: &MemoryStats) {
                $(self.$array.add(&other.$array);)*
                $(self.$single.add(&other.$single);)*
                $(self.$counter += other.$counter;)*
                $(self.$own.add(&other.$own);)*
            }

            /// How many families of per-pool statistics there are.
            pub(crate) const FAMILIES: usize = Self::FAMILY_NAMES.len();

            /// The families of per-pool statistics by key name, in
            /// declaration order (the order of [`MemoryStats::arrays`]).
            const FAMILY_NAMES: &'static [&'static str] = &[$(stringify!($array)),*];

            /// The place of family `name` in declaration order, found when
            /// the program is compiled: a name that is no family does not
            /// compile where it is used in a constant.
            pub(crate) const fn family(name: &str) -> usize {
                let mut i = 0;
                while i < Self::FAMILY_NAMES.len() {
                    if same_str(Self::FAMILY_NAMES[i], name) {
                        return i;
                    }
                    i += 1;
                }
                panic!("no such family of statistics")
            }

            /// Every family of per-pool statistics with its key name, in
            /// declaration order.
            pub(crate) fn arrays(&self) -> [(&'static str, &StatArray); Self::FAMILIES] {
                [$((stringify!($array), &self.$array)),*]
            }

            /// Checks that every per-pool family's `all` figure is the sum of
            /// its pools and that no statistic's current value lies below zero
            /// or above its peak (the half of `validate()`'s recount that needs
            /// no blocks: [`crate::recount`]).
            ///
            /// # Errors
            /// The first statistic that does not hold, named.
            pub(crate) fn check_levels(&self) -> Result<(), String> {
                for (name, a) in self.arrays() {
                    if a.all.current != a.small_pool.current + a.large_pool.current {
                        return Err(format!("{name}.all is not the sum of its pools"));
                    }
                    for pool in [StatPool::All, StatPool::Small, StatPool::Large] {
                        within_peak(&format!("{name}.{}", pool.key()), a.get(pool))?;
                    }
                }
                $(within_peak(stringify!($single), &self.$single)?;)*
                $(within_peak(stringify!($own), &self.$own)?;)*
                Ok(())
            }

            /// Every family of per-pool statistics, in declaration order, to
            /// change.
            pub(crate) fn arrays_mut(&mut self) -> [&mut StatArray; Self::FAMILIES] {
                [$(&mut self.$array),*]
            }

            /// Every statistic under PyTorch's flattened key name
            /// (`allocated_bytes.all.current`, `num_ooms`, ...).
            pub fn to_map(&self) -> BTreeMap<String, i64> {
                let mut out = BTreeMap::new();
                $(self.$array.export(stringify!($array), &mut out);)*
                $(self.$single.export(stringify!($single), &mut out);)*
                $(out.insert(stringify!($counter).to_string(), self.$counter);)*
                $(self.$own.export(stringify!($own), &mut out);)*
                out.insert("max_split_size".to_string(), self.max_split_size);
                out
            }

            /// Every number in declaration order, which is the order of PyTorch's
            /// `DeviceStats`: each array as all, small pool, large pool, each
            /// statistic as current, peak, allocated, freed; then the single
            /// statistics the same way, the counters, and `max_split_size`.
            /// cachalot's own statistics, which PyTorch has not, are left out.
            pub fn to_numbers(&self) -> Vec<i64> {
                let mut out = Vec::new();
                $(for s in [&self.$array.all, &self.$array.small_pool, &self.$array.large_pool] {
                    out.extend(s.numbers());
                })*
                $(out.extend(self.$single.numbers());)*
                $(out.push(self.$counter);)*
                out.push(self.max_split_size);
                out
            }
        }
    };
}

memory_stats! {
    arrays {
        /// COUNT of allocations handed out (drops when the caller frees).
        allocation,
        /// COUNT of segments obtained from the device.
        segment,
        /// COUNT of active blocks (allocated, or freed but still in use by a stream).
        active,
        /// COUNT of inactive split blocks (free blocks in segments holding active ones).
        inactive_split,
        /// SUM of allocated block sizes (rounded).
        allocated_bytes,
        /// SUM of segment sizes (reserved memory).
        reserved_bytes,
        /// SUM of active block sizes.
        active_bytes,
        /// SUM of inactive split block sizes.
        inactive_split_bytes,
        /// SUM of the sizes callers asked for, over active blocks.
        requested_bytes,
    }
    singles {
        /// COUNT of live allocations whose block is at least `max_split_size`.
        oversize_allocations,
        /// COUNT of segments of at least `max_split_size`.
        oversize_segments,
    }
    counters {
        /// Times the allocator freed all cached blocks and retried an allocation.
        num_alloc_retries,
        /// Out-of-memory errors returned.
        num_ooms,
        /// Times every outstanding stream event was synchronized.
        num_sync_all_streams,
        /// Device allocations and page maps.
        num_device_alloc,
        /// Device frees and page unmaps.
        num_device_free,
    }
    own {
        /// SUM of the sizes of the segments of paused tags, whose pages are
        /// given back to the device ([`crate::sleep`]); reserved bytes leave
        /// them out. cachalot's own: PyTorch has no such statistic.
        paused_bytes,
    }
}

/// Each per-pool family's place in [`MemoryStats::arrays`], found by its
/// name in the list above when the program is compiled: what code that
/// keeps the families in arrays of its own indexes them by.
pub(crate) mod family {
    use super::MemoryStats;

    pub(crate) const ALLOCATION: usize = MemoryStats::family("allocation");
    pub(crate) const SEGMENT: usize = MemoryStats::family("segment");
    pub(crate) const ACTIVE: usize = MemoryStats::family("active");
    pub(crate) const INACTIVE_SPLIT: usize = MemoryStats::family("inactive_split");
    pub(crate) const ALLOCATED_BYTES: usize = MemoryStats::family("allocated_bytes");
    pub(crate) const RESERVED_BYTES: usize = MemoryStats::family("reserved_bytes");
    pub(crate) const ACTIVE_BYTES: usize = MemoryStats::family("active_bytes");
    pub(crate) const INACTIVE_SPLIT_BYTES: usize = MemoryStats::family("inactive_split_bytes");
    pub(crate) const REQUESTED_BYTES: usize = MemoryStats::family("requested_bytes");
}

impl MemoryStats {
    /// Fresh statistics for an allocator whose split limit is `max_split_size`
    /// (`None` = unlimited).
    pub fn new(max_split_size: Option<u64>) -> MemoryStats {
        MemoryStats {
            max_split_size: max_split_size.map_or(-1, |v| v as i64),
            ..MemoryStats::default()
        }
    }

    /// `memory_allocated()`: bytes in allocated blocks.
    pub fn memory_allocated(&self) -> u64 {
        self.allocated_bytes.all.current as u64
    }

    /// `max_memory_allocated()`.
    pub fn max_memory_allocated(&self) -> u64 {
        self.allocated_bytes.all.peak as u64
    }

    /// `memory_reserved()`: bytes in segments.
    pub fn memory_reserved(&self) -> u64 {
        self.reserved_bytes.all.current as u64
    }

    /// `max_memory_reserved()`.
    pub fn max_memory_reserved(&self) -> u64 {
        self.reserved_bytes.all.peak as u64
    }

    /// One statistic by PyTorch's key name, if it exists.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.to_map().get(key).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn a_family_is_found_where_the_statistics_declare_it() {
        for (i, (name, _)) in MemoryStats::default().arrays().iter().enumerate() {
            assert_eq!(MemoryStats::family(name), i, "{name}");
        }
        assert_eq!(MemoryStats::family("segment"), 1);
    }

    #[test]
    fn stat_tracks_peak_and_totals() {
        let mut s = Stat::default();
        s.increase(10);
        s.decrease(4);
        s.increase(2);
        assert_eq!(
            s,
            Stat {
                current: 8,
                peak: 10,
                allocated: 12,
                freed: 4
            }
        );
        s.reset_peak();
        assert_eq!(s.peak, 8);
        s.reset_accumulated();
        assert_eq!((s.allocated, s.freed), (0, 0));
    }

    #[test]
    fn map_has_pytorch_keys() {
        let mut m = MemoryStats::new(None);
        m.allocated_bytes.update(true, 512);
        m.num_ooms = 2;
        let map = m.to_map();
        assert_eq!(map["allocated_bytes.all.current"], 512);
        assert_eq!(map["allocated_bytes.small_pool.peak"], 512);
        assert_eq!(map["allocated_bytes.large_pool.current"], 0);
        assert_eq!(map["num_ooms"], 2);
        assert_eq!(map["max_split_size"], -1);
        assert_eq!(map["oversize_segments.peak"], 0);
        // 9 families x 3 pools x 4 + 2 singles x 4 + 5 counters + max_split_size,
        // and paused_bytes x 4, cachalot's own
        assert_eq!(map.len(), 9 * 12 + 8 + 5 + 1 + 4);
        assert_eq!(m.to_numbers().len(), 9 * 12 + 8 + 5 + 1);
        assert_eq!(m.arrays().len(), 9);
        for (name, array) in m.arrays() {
            assert_eq!(
                map[&format!("{name}.small_pool.peak")],
                array.small_pool.peak
            );
        }
    }

    /// The numbers of a serialized [`MemoryStats`], which holds every field
    /// whether or not the macro's lists declare it, with their paths.
    fn leaves<'a>(value: &'a mut Value, path: &str, out: &mut Vec<(String, &'a mut Value)>) {
        match value {
            Value::Object(fields) => {
                for (name, field) in fields.iter_mut() {
                    leaves(field, &format!("{path}.{name}"), out);
                }
            }
            number => out.push((path.to_string(), number)),
        }
    }

    #[test]
    fn add_sums_every_number_but_the_split_limit() {
        let mut value = serde_json::to_value(MemoryStats::default()).unwrap();
        let mut numbers = Vec::new();
        leaves(&mut value, "", &mut numbers);
        for (i, (_, number)) in numbers.into_iter().enumerate() {
            *number = Value::from(i + 1);
        }
        let one: MemoryStats = serde_json::from_value(value).unwrap();
        let mut two = one.clone();
        two.add(&one);
        let declared = one.to_numbers().len() + one.paused_bytes.numbers().len();
        let (mut one, mut two) = (
            serde_json::to_value(one).unwrap(),
            serde_json::to_value(two).unwrap(),
        );
        let (mut ones, mut twos) = (Vec::new(), Vec::new());
        leaves(&mut one, "", &mut ones);
        leaves(&mut two, "", &mut twos);
        assert_eq!(ones.len(), declared);
        for ((path, x), (_, sum)) in ones.iter().zip(&twos) {
            let x = x.as_i64().unwrap();
            let want = if path == ".max_split_size" { x } else { 2 * x };
            assert_eq!(sum.as_i64(), Some(want), "{path}");
        }
    }
}
