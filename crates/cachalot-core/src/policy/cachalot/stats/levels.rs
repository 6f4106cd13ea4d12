//! The value of every statistic that has a peak, in one flat array: what the
//! device's peaks are computed from.
//!
//! PyTorch keeps nine families of per-pool statistics (allocation, segment,
//! active, ...), each with a small pool, a large pool and `all`, their sum.
//! A peak is the highest value a statistic reached, so each of the 27 has
//! its own; `all`'s peak is the peak of the sum, not the sum of the peaks.
//! [`Levels`] holds one number per statistic: current values (kept with
//! `all` as the pools' sum), or the highest values over some time (where
//! `all` is the highest sum, which may be below the sum of the pools'
//! highest values).

use crate::stats::MemoryStats;

use super::tally::Family;
use crate::stats::family::{ACTIVE, ACTIVE_BYTES, ALLOCATED_BYTES, ALLOCATION, REQUESTED_BYTES};
use crate::transition::Transition;

/// Families, in [`MemoryStats`]'s order.
const FAMILIES: usize = MemoryStats::FAMILIES;

/// Per family: the small pool, the large pool, `all`.
const ALL: usize = 2;

/// See the module docs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Levels([[i64; 3]; FAMILIES]);

impl Levels {
    /// The current values of `s`.
    pub(crate) fn current(s: &MemoryStats) -> Levels {
        Levels::read(s, |stat| stat.current)
    }

    /// The peaks of `s`.
    pub(crate) fn peaks(s: &MemoryStats) -> Levels {
        Levels::read(s, |stat| stat.peak)
    }

    fn read(s: &MemoryStats, value: impl Fn(&crate::stats::Stat) -> i64) -> Levels {
        let mut out = Levels::default();
        for (row, (_, a)) in out.0.iter_mut().zip(s.arrays()) {
            *row = [value(&a.small_pool), value(&a.large_pool), value(&a.all)];
        }
        out
    }

    /// Sets a family the tally keeps (see `tally`): small pool, large pool,
    /// `all`.
    pub(crate) fn set(&mut self, family: Family, row: [i64; 3]) {
        let f = match family {
            Family::Allocation => ALLOCATION,
            Family::AllocatedBytes => ALLOCATED_BYTES,
            Family::Active => ACTIVE,
            Family::ActiveBytes => ACTIVE_BYTES,
            Family::RequestedBytes => REQUESTED_BYTES,
        };
        self.0[f] = row;
    }

    /// Writes these as the peaks of `s`.
    pub(crate) fn write_peaks(&self, s: &mut MemoryStats) {
        for (a, row) in s.arrays_mut().into_iter().zip(&self.0) {
            a.small_pool.peak = row[0];
            a.large_pool.peak = row[1];
            a.all.peak = row[ALL];
        }
    }

    /// Adds `amount` to a family's pool and to its `all`.
    #[inline(always)]
    fn add(&mut self, family: usize, small: bool, amount: i64) {
        let row = &mut self.0[family];
        row[usize::from(!small)] += amount;
        row[ALL] += amount;
    }

    /// Current values after `change`.
    #[inline(always)]
    pub(crate) fn shift(&mut self, change: Transition) {
        change.moves(|family, small, amount| self.add(family, small, amount));
    }

    /// Current values after `change`, raising `peaks` where a value it moved
    /// up passes them (no other can: where these were at most `peaks`
    /// before, they are after).
    #[inline(always)]
    pub(crate) fn shift_raising(&mut self, change: Transition, peaks: &mut Levels) {
        change.moves(|family, small, amount| {
            self.add(family, small, amount);
            if amount > 0 {
                for p in [usize::from(!small), ALL] {
                    let peak = &mut peaks.0[family][p];
                    *peak = (*peak).max(self.0[family][p]);
                }
            }
        });
    }

    /// Each statistic's value here plus `other`'s.
    #[inline]
    pub(crate) fn plus(mut self, other: &Levels) -> Levels {
        self.each(other, |a, b| *a += b);
        self
    }

    /// Each statistic's value here less `other`'s.
    #[inline]
    pub(crate) fn minus(mut self, other: &Levels) -> Levels {
        self.each(other, |a, b| *a -= b);
        self
    }

    /// Raises each statistic to `other`'s value where that is higher.
    #[inline]
    pub(crate) fn raise(&mut self, other: &Levels) {
        self.each(other, |a, b| *a = (*a).max(b));
    }

    /// Whether some statistic here is above `other`'s.
    #[inline]
    pub(crate) fn exceeds(&self, other: &Levels) -> bool {
        self.0
            .iter()
            .flatten()
            .zip(other.0.iter().flatten())
            .fold(false, |any, (a, b)| any | (a > b))
    }

    fn each(&mut self, other: &Levels, f: impl Fn(&mut i64, i64)) {
        for (a, &b) in self.0.iter_mut().flatten().zip(other.0.iter().flatten()) {
            f(a, b);
        }
    }

    /// The first statistic (family, pool) here below `other`'s, if any.
    pub(crate) fn first_below(&self, other: &Levels) -> Option<(usize, usize)> {
        (0..FAMILIES)
            .flat_map(|f| (0..3).map(move |p| (f, p)))
            .find(|&(f, p)| self.0[f][p] < other.0[f][p])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::cachalot::stats::journal::Figures;
    use crate::test_rng::XorShift;

    /// `shift` moves every current value as applying the change to a stream's
    /// figures does, over a seeded mix of every kind of change; `shift_raising`
    /// moves them alike and keeps the highest values as raising every one
    /// after the change does; and the figures move every statistic (current,
    /// peak, allocated, freed) as the shared contract, [`MemoryStats::apply`],
    /// moves it.
    #[test]
    fn shift_follows_the_figures() {
        let mut figures = Figures::new(MemoryStats::new(None));
        let mut contract = MemoryStats::new(None);
        let (mut levels, mut tops) = (Levels::default(), Levels::default());
        let mut rng = XorShift(0x9e37_79b9);
        let (mut live, mut pending) = (Vec::new(), Vec::new());
        for _ in 0..5_000 {
            let x = rng.draw();
            let small = x.is_multiple_of(2);
            let size = (x >> 8) % 4096 + 1;
            let change = match (x >> 20) % 8 {
                0..=2 => {
                    live.push((small, size));
                    Transition::Allocated {
                        small,
                        size,
                        requested: size - 1,
                    }
                }
                3 if !live.is_empty() => {
                    let (small, size) = live.swap_remove(x as usize % live.len());
                    Transition::Freed {
                        small,
                        size,
                        requested: size - 1,
                    }
                }
                4 if !live.is_empty() => {
                    let (small, size) = live.swap_remove(x as usize % live.len());
                    pending.push((small, size));
                    Transition::FreeRequested { small, size }
                }
                5 if !pending.is_empty() => {
                    let (small, size) = pending.swap_remove(x as usize % pending.len());
                    Transition::FreeCompleted {
                        small,
                        size,
                        requested: size - 1,
                    }
                }
                6 => Transition::Reserved {
                    small,
                    bytes: size as i64 - 2048,
                    segments: (x >> 40) as i64 % 3 - 1,
                },
                _ => Transition::Splits {
                    small,
                    count: (x >> 40) as i64 % 3 - 1,
                    bytes: size as i64 - 2048,
                },
            };
            let mut next = levels;
            next.shift(change);
            if next.first_below(&Levels::default()).is_some() {
                continue; // nothing goes negative
            }
            figures.apply(change);
            contract.apply(change);
            assert_eq!(figures.stats(), contract, "after {change:?}");
            let (mut raised, mut peaks) = (levels, tops);
            raised.shift_raising(change, &mut peaks);
            levels = next;
            tops.raise(&levels);
            assert_eq!(levels, figures.levels());
            assert_eq!(
                (raised, peaks),
                (levels, tops),
                "shift_raising after {change:?}"
            );
        }
    }

    #[test]
    fn all_peaks_at_the_highest_sum() {
        let mut s = MemoryStats::new(None);
        s.allocated_bytes.increase(true, 10);
        s.allocated_bytes.decrease(true, 10);
        s.allocated_bytes.increase(false, 5);
        let peaks = Levels::peaks(&s);
        assert_eq!(peaks.0[ALLOCATED_BYTES], [10, 5, 10]);
        let mut out = MemoryStats::new(None);
        peaks.write_peaks(&mut out);
        assert_eq!(out.allocated_bytes.all.peak, 10);
        assert_eq!(Levels::current(&s).0[ALLOCATED_BYTES], [0, 5, 5]);
    }
}
