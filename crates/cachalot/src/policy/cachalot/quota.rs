//! Quotas: exact device peaks with several streams and no stamp at all,
//! while the device stays below its peaks.
//!
//! Journaling (`journal`, `merge`) costs each operation a stamp and a push;
//! with several threads at once, a stamp is a fenced read of the clock (20
//! to 26 ns on the H100 host), a third of an operation. Yet in a steady
//! state the device's values stay below the peaks its first pass set, and
//! then no order of the changes can raise a peak: only where the streams'
//! values could add up to more than a peak does their order matter.
//!
//! So at a cut (every stream locked, every earlier cut settled: the peaks
//! `P` and every stream's values `v` are exact), the device may hand each
//! stream an **allowance** `a` per statistic, with `sum(v + a) <= P` for
//! every one of the 27. A stream then keeps no journal and stamps nothing:
//! each change only takes its increase from the allowance and gives its
//! decrease back (`v + a` stays what it was), a few additions. While every
//! allowance is non-negative, the streams' values add up to at most `P`
//! in whatever order their changes happened, so the peaks stand.
//!
//! A change that would take more than a stream has **trips** it: the stream
//! starts a journal from its values before that change (stamped as any, see
//! `stamp`), and the operation, once it has let go of the stream's lock,
//! takes a cut. Until that cut nothing else is done on the stream (an
//! operation that finds it tripped waits for the cut), and the operation
//! has not returned to its caller, so nothing that happens anywhere can
//! depend on it: it may be taken as happening at the cut, after every
//! other stream's changes. The cut settles the tripped streams' journals
//! against the other streams' values there (`merge`: a stream with no
//! journal is a run with no change), exactly, and hands out new allowances.
//!
//! How the headroom `P - sum(v)` is shared ([`share`]): first each stream's
//! shortfall, how far it is below its own highest value since the mode
//! began (a stream at the low point of its cycle gets back up to its
//! high), then the rest evenly. Where trips come close together (a device
//! still growing, or peaks just reset), cuts cost more than stamps, so the
//! device journals again for a while ([`Mode`]).

use std::sync::Arc;

use super::journal::Change;
use super::levels::Levels;
use super::stamp::Stamper;

/// Changes a window of allowances must last, per stream, for the device to
/// keep handing them out after a trip.
pub(crate) const WINDOW: u64 = 512;

/// Full journals (cuts) the device waits, at most, before trying
/// allowances again after a window that tripped too soon.
const MAX_BACKOFF: u32 = 64;

/// A stream's allowance while the device hands them out (module docs).
#[derive(Debug)]
pub(crate) struct Quota {
    allowance: Levels,
    /// Changes made since the allowance was handed out.
    changes: u64,
    /// The device's stamps, for a journal started by a trip.
    stamps: Arc<Stamper>,
}

impl Quota {
    /// `allowance`, to be spent; `stamps` for a trip's journal.
    pub(crate) fn new(allowance: Levels, stamps: Arc<Stamper>) -> Quota {
        Quota {
            allowance,
            changes: 0,
            stamps,
        }
    }

    /// Takes `change`'s increases from the allowance and gives its decreases
    /// back; whether some statistic is now overdrawn (the stream trips).
    #[inline(always)]
    pub(crate) fn spend(&mut self, change: Change) -> bool {
        self.changes += 1;
        self.allowance.spend(change)
    }

    /// What is left.
    pub(crate) fn allowance(&self) -> &Levels {
        &self.allowance
    }

    /// Changes made since the allowance was handed out.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// The stamps a trip's journal uses.
    pub(crate) fn stamps(self) -> Arc<Stamper> {
        self.stamps
    }
}

/// Shares `headroom` (the peaks less the streams' summed values, none
/// negative) among streams at `levels` whose highest values since the mode
/// began are `tops`: each statistic's shortfalls first (scaled down where
/// they add up to more than the headroom), then the rest evenly, the
/// remainder to the first streams. The shares add up to at most the
/// headroom, statistic by statistic.
pub(crate) fn share(headroom: &Levels, levels: &[Levels], tops: &[Levels]) -> Vec<Levels> {
    let n = levels.len() as i64;
    let mut out = vec![Levels::default(); levels.len()];
    if n == 0 {
        return out;
    }
    for i in 0..Levels::LEN {
        let room = headroom.get(i).max(0);
        let short: Vec<i64> = levels
            .iter()
            .zip(tops)
            .map(|(l, t)| (t.get(i) - l.get(i)).max(0))
            .collect();
        let total: i64 = short.iter().sum();
        let given: Vec<i64> = if total <= room {
            let (each, extra) = ((room - total) / n, (room - total) % n);
            let evenly = |s: usize| each + i64::from((s as i64) < extra);
            short
                .iter()
                .enumerate()
                .map(|(s, &x)| x + evenly(s))
                .collect()
        } else {
            let scale = |x: i64| (i128::from(x) * i128::from(room) / i128::from(total)) as i64;
            short.iter().map(|&x| scale(x)).collect()
        };
        for (o, g) in out.iter_mut().zip(given) {
            o.set_at(i, g);
        }
    }
    out
}

/// How the device keeps its peaks with several streams: journals, or
/// allowances (module docs).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mode {
    /// Allowances are out (no stream journals unless it tripped).
    pub(crate) quota: bool,
    /// Full journals to wait before trying allowances.
    backoff: u32,
    /// The wait after the next window that trips too soon.
    next_backoff: u32,
}

impl Default for Mode {
    fn default() -> Mode {
        Mode {
            quota: false,
            backoff: 0,
            next_backoff: 1,
        }
    }
}

impl Mode {
    /// Journals, trying allowances again at the next full journal (peaks
    /// just reset).
    pub(crate) fn journals() -> Mode {
        Mode::default()
    }

    /// A full journal while journaling: whether to try allowances now
    /// (counting down the wait otherwise).
    pub(crate) fn try_quota(&mut self) -> bool {
        if self.backoff == 0 {
            return true;
        }
        self.backoff -= 1;
        false
    }

    /// Whether a cut now (every earlier one settled) should hand out
    /// allowances, after a window of allowances over `streams` streams that
    /// made `changes` changes and `tripped` or not (ignored while
    /// journaling).
    pub(crate) fn next(&mut self, tripped: bool, changes: u64, streams: usize) -> bool {
        if !self.quota {
            self.quota = self.backoff == 0;
        } else if tripped && changes < WINDOW * streams as u64 {
            self.quota = false;
            self.backoff = self.next_backoff;
            self.next_backoff = (self.next_backoff * 2).min(MAX_BACKOFF);
        } else if tripped {
            self.next_backoff = 1;
        }
        self.quota
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn levels(values: &[(usize, i64)]) -> Levels {
        let mut l = Levels::default();
        for &(i, v) in values {
            l.set_at(i, v);
        }
        l
    }

    /// Shortfalls come first, the rest evenly with the remainder to the
    /// first streams; nothing more than the headroom is given.
    #[test]
    fn shortfalls_first_then_evenly() {
        let now = [levels(&[(0, 31)]), levels(&[(0, 32)]), levels(&[(0, 10)])];
        let tops = [levels(&[(0, 32)]), levels(&[(0, 32)]), levels(&[(0, 20)])];
        let got = share(&levels(&[(0, 13)]), &now, &tops);
        assert_eq!(
            got.iter().map(|l| l.get(0)).collect::<Vec<_>>(),
            vec![2, 1, 10]
        );
        let got = share(&levels(&[(0, 5)]), &now, &tops);
        let given: Vec<i64> = got.iter().map(|l| l.get(0)).collect();
        assert_eq!(given, vec![0, 0, 4]); // 1*5/11 and 10*5/11, floored
        assert!(given.iter().sum::<i64>() <= 5);
        assert!(got.iter().all(|l| l.get(1) == 0));
    }

    /// A window that trips too soon goes back to journals for longer and
    /// longer; a long one resets the wait.
    #[test]
    fn quick_trips_back_off() {
        let mut m = Mode::default();
        assert!(m.next(false, 0, 2));
        assert!(!m.next(true, 10, 2));
        assert!(!m.try_quota() && m.try_quota());
        assert!(m.next(false, 0, 2));
        assert!(!m.next(true, 10, 2));
        assert!(!m.try_quota() && !m.try_quota() && m.try_quota());
        assert!(m.next(false, 0, 2));
        assert!(m.next(true, 2 * WINDOW, 2));
        assert!(!m.next(true, 10, 2));
        assert!(!m.try_quota() && m.try_quota());
    }
}
