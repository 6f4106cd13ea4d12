//! The statistics every allocation and free changes (allocation, allocated
//! bytes, active, active bytes, requested bytes), kept in the form the hot
//! path updates cheapest and turned into PyTorch's [`StatArray`]s on read.
//!
//! A [`StatArray`] keeps `all`, `small_pool` and `large_pool` with a current
//! value, a peak and two totals each: an increase writes six numbers, a
//! decrease four. Here a counted family keeps, per pool, its current value,
//! its peak and everything ever added, plus the peak of the sum of the pools:
//! an increase writes four numbers, a decrease one. The rest follows: `all`'s
//! current value and totals are the pools' sums, what was freed is what was
//! added less what is current, and the totals since the last reset subtract
//! what they were then.
//!
//! Only three families are counted. A block is active from its allocation
//! until it is reusable, which is when its caller frees it unless other
//! streams still use it (it is then pending). So the active blocks are the
//! allocated ones plus the pending ones, everything ever made active is
//! everything ever allocated, and the active peaks can pass the allocated
//! ones only while blocks are pending: [`Tally`] keeps the pending blocks and
//! those peaks, and an allocation with nothing pending, the common case,
//! changes no active number.

use crate::stats::{Stat, StatArray};

/// Peaks per pool (pool 0 is the small pool, 1 the large one) and of the
/// pools' sum.
#[derive(Copy, Clone, Debug, Default)]
struct Peaks {
    pool: [i64; 2],
    all: i64,
}

impl Peaks {
    /// Raises the peaks to the values `now` where these are higher.
    fn raise(&mut self, now: [i64; 2]) {
        for (peak, value) in self.pool.iter_mut().zip(now) {
            *peak = (*peak).max(value);
        }
        self.all = self.all.max(now[0] + now[1]);
    }

    /// Peaks at the values `now`.
    fn at(now: [i64; 2]) -> Peaks {
        Peaks {
            pool: now,
            all: now[0] + now[1],
        }
    }

    /// The higher of two sets of peaks, peak by peak.
    fn max(self, other: Peaks) -> Peaks {
        Peaks {
            pool: [
                self.pool[0].max(other.pool[0]),
                self.pool[1].max(other.pool[1]),
            ],
            all: self.all.max(other.all),
        }
    }
}

/// A family's numbers, per pool.
#[derive(Copy, Clone, Debug, Default)]
struct Gauge {
    current: [i64; 2],
    peaks: Peaks,
    /// Everything ever added, per pool.
    added: [i64; 2],
}

impl Gauge {
    #[inline(always)]
    fn increase(&mut self, p: usize, amount: i64) {
        self.current[p] += amount;
        self.added[p] += amount;
        self.peaks.pool[p] = self.peaks.pool[p].max(self.current[p]);
        self.peaks.all = self.peaks.all.max(self.current[0] + self.current[1]);
    }

    #[inline(always)]
    fn decrease(&mut self, p: usize, amount: i64) {
        self.current[p] -= amount;
        debug_assert!(self.current[p] >= 0, "a statistic went negative");
    }

    /// Sets the peaks to the current values.
    fn reset_peak(&mut self) {
        self.peaks = Peaks::at(self.current);
    }
}

/// What a family's totals were at the last accumulated reset.
#[derive(Copy, Clone, Debug, Default)]
struct Baseline {
    added: [i64; 2],
    current: [i64; 2],
}

/// The five families (see the module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// Allocations handed out and not freed by the caller.
    Allocation,
    /// Their bytes.
    AllocatedBytes,
    /// Blocks handed out and not yet reusable (freed blocks waiting for
    /// other streams count).
    Active,
    /// Their bytes.
    ActiveBytes,
    /// The bytes the callers asked for, of active blocks.
    RequestedBytes,
}

impl Family {
    /// Every family, in order.
    pub(crate) const ALL: [Family; 5] = [
        Family::Allocation,
        Family::AllocatedBytes,
        Family::Active,
        Family::ActiveBytes,
        Family::RequestedBytes,
    ];
}

/// The counted families' indices in [`Tally::counted`]; blocks and bytes
/// also index [`Tally::pending`] and [`Tally::pending_peaks`].
const BLOCKS: usize = 0;
const BYTES: usize = 1;
const REQUESTED: usize = 2;

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    /// Allocation, allocated bytes, requested bytes.
    counted: [Gauge; 3],
    /// Blocks and bytes freed by their callers and waiting for other
    /// streams, per pool.
    pending: [[i64; 2]; 2],
    /// The peaks of active blocks and bytes reached while blocks were
    /// pending; the active peaks are these or the allocated ones, whichever
    /// are higher.
    pending_peaks: [Peaks; 2],
    baselines: [Baseline; 5],
}

fn pool(small: bool) -> usize {
    usize::from(!small)
}

impl Tally {
    /// A block of `size` bytes was handed out for `requested`.
    #[inline(always)]
    pub(crate) fn allocated(&mut self, small: bool, size: u64, requested: u64) {
        let p = pool(small);
        self.counted[BLOCKS].increase(p, 1);
        self.counted[BYTES].increase(p, size as i64);
        self.counted[REQUESTED].increase(p, requested as i64);
        if self.pending[BLOCKS] != [0, 0] {
            self.note_pending_peaks();
        }
    }

    /// With blocks pending, the active numbers may have reached new peaks.
    #[cold]
    #[inline(never)]
    fn note_pending_peaks(&mut self) {
        for k in [BLOCKS, BYTES] {
            let active = self.active_current(k);
            self.pending_peaks[k].raise(active);
        }
    }

    /// The caller freed a block of `size` bytes; it stays active (pending)
    /// until other streams are done with it.
    pub(crate) fn free_requested(&mut self, small: bool, size: u64) {
        let p = pool(small);
        self.counted[BLOCKS].decrease(p, 1);
        self.counted[BYTES].decrease(p, size as i64);
        self.pending[BLOCKS][p] += 1;
        self.pending[BYTES][p] += size as i64;
    }

    /// A pending block of `size` bytes handed out for `requested` became
    /// reusable.
    pub(crate) fn free_completed(&mut self, small: bool, size: u64, requested: u64) {
        let p = pool(small);
        self.pending[BLOCKS][p] -= 1;
        self.pending[BYTES][p] -= size as i64;
        debug_assert!(self.pending[BYTES][p] >= 0, "pending bytes went negative");
        self.counted[REQUESTED].decrease(p, requested as i64);
    }

    /// The caller freed a block of `size` bytes handed out for `requested`,
    /// and it became reusable at once.
    #[inline(always)]
    pub(crate) fn freed(&mut self, small: bool, size: u64, requested: u64) {
        let p = pool(small);
        self.counted[BLOCKS].decrease(p, 1);
        self.counted[BYTES].decrease(p, size as i64);
        self.counted[REQUESTED].decrease(p, requested as i64);
    }

    /// Active blocks (`k` = [`BLOCKS`]) or bytes ([`BYTES`]) per pool.
    fn active_current(&self, k: usize) -> [i64; 2] {
        let (allocated, pending) = (&self.counted[k].current, &self.pending[k]);
        [allocated[0] + pending[0], allocated[1] + pending[1]]
    }

    /// `family`'s numbers, the active families' derived (see the module docs).
    fn gauge(&self, family: Family) -> Gauge {
        let active = |k: usize| Gauge {
            current: self.active_current(k),
            peaks: self.counted[k].peaks.max(self.pending_peaks[k]),
            added: self.counted[k].added,
        };
        match family {
            Family::Allocation => self.counted[BLOCKS],
            Family::AllocatedBytes => self.counted[BYTES],
            Family::Active => active(BLOCKS),
            Family::ActiveBytes => active(BYTES),
            Family::RequestedBytes => self.counted[REQUESTED],
        }
    }

    /// `family`'s current values: small pool, large pool, `all`.
    pub(crate) fn current(&self, family: Family) -> [i64; 3] {
        let c = self.gauge(family).current;
        [c[0], c[1], c[0] + c[1]]
    }

    /// `family`'s peaks: small pool, large pool, `all`.
    pub(crate) fn peaks(&self, family: Family) -> [i64; 3] {
        let p = self.gauge(family).peaks;
        [p.pool[0], p.pool[1], p.all]
    }

    /// `family` as PyTorch's statistics.
    pub(crate) fn array(&self, family: Family) -> StatArray {
        let (g, b) = (self.gauge(family), &self.baselines[family as usize]);
        let stat = |p: usize| Stat {
            current: g.current[p],
            peak: g.peaks.pool[p],
            allocated: g.added[p] - b.added[p],
            freed: (g.added[p] - g.current[p]) - (b.added[p] - b.current[p]),
        };
        let (small_pool, large_pool) = (stat(0), stat(1));
        StatArray {
            all: Stat {
                current: small_pool.current + large_pool.current,
                peak: g.peaks.all,
                allocated: small_pool.allocated + large_pool.allocated,
                freed: small_pool.freed + large_pool.freed,
            },
            small_pool,
            large_pool,
        }
    }

    /// Sets every peak to its current value.
    pub(crate) fn reset_peak(&mut self) {
        self.counted.iter_mut().for_each(Gauge::reset_peak);
        for k in [BLOCKS, BYTES] {
            self.pending_peaks[k] = Peaks::at(self.active_current(k));
        }
    }

    /// Zeroes every total (current values stay).
    pub(crate) fn reset_accumulated(&mut self) {
        for family in Family::ALL {
            let g = self.gauge(family);
            self.baselines[family as usize] = Baseline {
                added: g.added,
                current: g.current,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::XorShift;

    /// The five families as [`StatArray`]s updated one by one, each event
    /// changing the families it changes in PyTorch's allocator.
    #[derive(Default)]
    struct Model([StatArray; 5]);

    impl Model {
        fn change(&mut self, families: &[Family], small: bool, (size, req): (u64, u64), add: bool) {
            for &f in families {
                let amount = match f {
                    Family::Allocation | Family::Active => 1,
                    Family::AllocatedBytes | Family::ActiveBytes => size,
                    Family::RequestedBytes => req,
                };
                let a = &mut self.0[f as usize];
                if add {
                    a.increase(small, amount);
                } else {
                    a.decrease(small, amount);
                }
            }
        }

        fn stats(&mut self) -> impl Iterator<Item = &mut Stat> {
            self.0
                .iter_mut()
                .flat_map(|a| [&mut a.all, &mut a.small_pool, &mut a.large_pool])
        }
    }

    const ALLOCATED: [Family; 2] = [Family::Allocation, Family::AllocatedBytes];
    const ACTIVE: [Family; 3] = [Family::Active, Family::ActiveBytes, Family::RequestedBytes];

    /// The tally against the model on a seeded mix of allocations, frees
    /// (immediate, and pending then completed, in both pools) and resets.
    #[test]
    fn reads_as_stat_arrays_updated_one_by_one_would() {
        let (mut tally, mut model) = (Tally::default(), Model::default());
        let (mut live, mut pending) = (Vec::new(), Vec::new());
        let mut rng = XorShift(0x2545_f491);
        for i in 0..20_000 {
            let x = rng.draw();
            match (x >> 20) % 16 {
                0..=6 => {
                    let (small, size) = (x.is_multiple_of(2), (x >> 8) % 4096 + 1);
                    let block = (small, (size, size - (x >> 30) % size));
                    tally.allocated(block.0, block.1 .0, block.1 .1);
                    model.change(&Family::ALL, block.0, block.1, true);
                    live.push(block);
                }
                7..=9 if !live.is_empty() => {
                    let (small, sr) = live.swap_remove(x as usize % live.len());
                    tally.freed(small, sr.0, sr.1);
                    model.change(&Family::ALL, small, sr, false);
                }
                10..=12 if !live.is_empty() => {
                    let (small, sr) = live.swap_remove(x as usize % live.len());
                    tally.free_requested(small, sr.0);
                    model.change(&ALLOCATED, small, sr, false);
                    pending.push((small, sr));
                }
                13 | 14 if !pending.is_empty() => {
                    let (small, sr) = pending.swap_remove(x as usize % pending.len());
                    tally.free_completed(small, sr.0, sr.1);
                    model.change(&ACTIVE, small, sr, false);
                }
                15 if i % 2 == 0 => {
                    tally.reset_peak();
                    model.stats().for_each(Stat::reset_peak);
                }
                15 => {
                    tally.reset_accumulated();
                    model.stats().for_each(Stat::reset_accumulated);
                }
                _ => {}
            }
            for f in Family::ALL {
                assert_eq!(tally.array(f), model.0[f as usize], "{f:?} at step {i}");
            }
        }
        assert!(
            !pending.is_empty() && !live.is_empty(),
            "the mix exercised both"
        );
    }
}
