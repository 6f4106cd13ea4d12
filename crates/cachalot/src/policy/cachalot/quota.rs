//! Allowances: exact device peaks with several streams and no stamp, while
//! the device stays below its peaks.
//!
//! Journaling (`journal`, `merge`) costs each operation a stamp and a push;
//! with several threads at once, a stamp is a fenced read of the clock (20
//! to 26 ns on the H100 host), a third of an operation. Yet in a steady
//! state the device's values stay below the peaks its first pass set, and
//! then no order of the changes can raise a peak: only where the streams'
//! values could add up to more than a peak does their order matter.
//!
//! So at a cut (every stream locked, every earlier cut settled: the peaks
//! `P` and every stream's values `v` are exact), the device may put the
//! headroom `P - sum(v)` of each of the 27 statistics in a **reserve** `R`
//! (an atomic per statistic) and let the streams spend it: each stream
//! holds an **allowance** `a` per statistic, from nothing. A stream then
//! keeps no journal and stamps nothing: a change takes its increases from
//! the allowance and gives its decreases back (`v + a` stays what it was).
//! An allowance that runs short takes what it lacks from the reserve, with
//! a share of what is left there (one atomic operation, now and then); one
//! far above what it last took puts the excess back. So `sum(v + a) + R <=
//! P` at every moment, statistic by statistic: while no allowance is
//! overdrawn, the streams' values add up to at most `P` in whatever order
//! their changes happened, and the peaks stand.
//!
//! A change the reserve cannot cover **trips** its stream: the stream
//! starts a journal from its values before that change (stamped as any, see
//! `stamp`), and the operation, once it has let go of the stream's lock,
//! takes a cut. Until that cut nothing else is done on the stream (an
//! operation that finds it tripped waits for the cut), and the operation
//! has not returned to its caller, so nothing that happens anywhere can
//! depend on it: it may be taken as happening at the cut, after every
//! other stream's changes. The cut settles the tripped streams' journals
//! against the other streams' values there (`merge`: a stream with no
//! journal is a run with no change), exactly, and fills the reserve again.
//!
//! Where trips come close together (a device still growing, or peaks just
//! reset), cuts cost more than stamps, so the device journals again for a
//! while ([`Mode`]).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use super::journal::Change;
use super::levels::Levels;
use super::stamp::Stamper;

/// Changes a window of allowances must last, per stream, for the device to
/// keep handing them out after a trip.
pub(crate) const WINDOW: u64 = 128;

/// Changes between two returns of an allowance's excess to the reserve.
const RETURN_EVERY: u64 = 64;

/// Changes per trip to the reserve below which a stream churns.
const CHURN: u64 = 64;

/// Full journals (cuts) the device waits, at most, before trying
/// allowances again after a window that tripped too soon.
const MAX_BACKOFF: u32 = 8;

/// The headroom a cut kept back, per statistic: a stream short of allowance
/// takes from it before tripping, and one with far more than it was given
/// puts the excess back. Only a stream's lock holder touches it (a cut,
/// holding every stream, sees it still).
#[derive(Debug, Default)]
pub(crate) struct Reserve([AtomicI64; Levels::LEN]);

impl Reserve {
    /// What the reserve holds.
    pub(crate) fn load(&self) -> Levels {
        let mut out = Levels::default();
        for (i, cell) in self.0.iter().enumerate() {
            out.set_at(i, cell.load(Ordering::Relaxed));
        }
        out
    }

    /// Keeps `kept` (called at a cut).
    fn store(&self, kept: &Levels) {
        for (i, cell) in self.0.iter().enumerate() {
            cell.store(kept.get(i), Ordering::Relaxed);
        }
    }

    /// Takes `need` of statistic `i` and a share of what is left for
    /// `streams` streams; `None` where the reserve holds less than `need`.
    fn take(&self, i: usize, need: i64, streams: i64) -> Option<i64> {
        let cell = &self.0[i];
        let mut now = cell.load(Ordering::Relaxed);
        loop {
            if now < need {
                return None;
            }
            let take = (need + now / (2 * streams)).min(now);
            match cell.compare_exchange_weak(now, now - take, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(take),
                Err(seen) => now = seen,
            }
        }
    }

    /// Puts `amount` of statistic `i` back.
    fn give(&self, i: usize, amount: i64) {
        self.0[i].fetch_add(amount, Ordering::Relaxed);
    }
}

/// The device's side of allowances: the stamps a trip's journal takes, and
/// the reserve.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) stamps: Arc<Stamper>,
    pub(crate) reserve: Reserve,
}

impl Shared {
    /// Nothing in reserve.
    pub(crate) fn new(stamps: Arc<Stamper>) -> Shared {
        Shared {
            stamps,
            reserve: Reserve::default(),
        }
    }
}

/// A stream's allowance while the device hands them out (module docs).
#[derive(Debug)]
pub(crate) struct Quota {
    allowance: Levels,
    /// The most it was given at once, per statistic (at the cut, or taken
    /// from the reserve): it keeps up to twice that.
    granted: Levels,
    /// Streams sharing the reserve.
    streams: i64,
    /// Changes made since the allowance was handed out.
    changes: u64,
    /// Times it took from or gave back to the reserve since.
    trips_to_reserve: u64,
    shared: Arc<Shared>,
}

impl Quota {
    /// Nothing yet, for one of `streams` streams taking from `shared`'s
    /// reserve.
    pub(crate) fn new(streams: usize, shared: Arc<Shared>) -> Quota {
        Quota {
            allowance: Levels::default(),
            granted: Levels::default(),
            streams: streams.max(1) as i64,
            changes: 0,
            trips_to_reserve: 0,
            shared,
        }
    }

    /// Takes `change`'s increases from the allowance (from the reserve
    /// where it runs short) and gives its decreases back (every
    /// [`RETURN_EVERY`] changes, what is over twice the most taken at once
    /// goes back to the reserve); whether some statistic is now overdrawn
    /// (the stream trips).
    #[inline(always)]
    pub(crate) fn spend(&mut self, change: Change) -> bool {
        self.changes += 1;
        if self.allowance.spend(change) {
            return !self.refill();
        }
        if self.changes.is_multiple_of(RETURN_EVERY) {
            self.give_back();
        }
        false
    }

    /// Takes what each overdrawn statistic lacks from the reserve, with a
    /// share of what is left there; whether the reserve had it all (and the
    /// stream does not [churn](Quota::churned)).
    #[cold]
    #[inline(never)]
    fn refill(&mut self) -> bool {
        self.trips_to_reserve += 1;
        if self.churned() {
            return false;
        }
        let mut all = true;
        for i in 0..Levels::LEN {
            let left = self.allowance.get(i);
            if left >= 0 {
                continue;
            }
            match self.shared.reserve.take(i, -left, self.streams) {
                Some(took) => {
                    self.allowance.set_at(i, left + took);
                    self.granted.set_at(i, self.granted.get(i).max(took));
                }
                None => all = false,
            }
        }
        all
    }

    /// Puts back in the reserve what each statistic holds beyond what it
    /// was granted, where it holds more than twice that.
    #[cold]
    #[inline(never)]
    fn give_back(&mut self) {
        for i in 0..Levels::LEN {
            let (left, granted) = (self.allowance.get(i), self.granted.get(i));
            if left > 2 * granted + 1 {
                self.trips_to_reserve += 1;
                self.allowance.set_at(i, granted);
                self.shared.reserve.give(i, left - granted);
            }
        }
    }

    /// What is left.
    pub(crate) fn allowance(&self) -> &Levels {
        &self.allowance
    }

    /// Changes made since the allowance was handed out.
    pub(crate) fn changes(&self) -> u64 {
        self.changes
    }

    /// Whether the stream goes to the reserve more than once per
    /// [`CHURN`] changes (over at least [`WINDOW`]): the headroom is too
    /// tight for the streams' swings, and every trip to the reserve passes
    /// its cache line between the threads. Its next refill trips it.
    pub(crate) fn churned(&self) -> bool {
        self.changes >= WINDOW && self.trips_to_reserve * CHURN > self.changes
    }

    /// The stamps a trip's journal uses.
    pub(crate) fn stamps(&self) -> Arc<Stamper> {
        self.shared.stamps.clone()
    }
}

/// Puts `headroom` (the peaks less the streams' summed values) in the
/// reserve at a cut; the streams' allowances start from nothing.
pub(crate) fn hand_out(headroom: &Levels, reserve: &Reserve) {
    let mut kept = Levels::default();
    for i in 0..Levels::LEN {
        kept.set_at(i, headroom.get(i).max(0));
    }
    reserve.store(&kept);
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
    /// allowances, after a window of allowances that a stream `tripped` or
    /// not, `quick` (too soon, or churning) or not (both ignored while
    /// journaling).
    pub(crate) fn next(&mut self, tripped: bool, quick: bool) -> bool {
        if !self.quota {
            self.quota = self.backoff == 0;
        } else if tripped && quick {
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
    use crate::policy::cachalot::journal::Change;

    /// `bytes` more (or, negative, fewer) reserved in the large pool.
    fn reserve(bytes: i64) -> Change {
        Change::Reserved {
            small: false,
            bytes,
            segments: 0,
        }
    }

    /// Index of the large pool's reserved bytes in a `Levels`.
    const LARGE_BYTES: usize = 5 * 3 + 1;

    /// An allowance takes from the reserve as it runs short, puts back what
    /// it holds beyond twice what it took, and trips where the reserve
    /// cannot cover it; what it and the reserve hold never grows.
    #[test]
    fn allowances_take_from_the_reserve_and_give_back() {
        let shared = Arc::new(Shared::new(Arc::new(Stamper::new(quanta::Clock::new()))));
        let mut headroom = Levels::default();
        for i in 0..Levels::LEN {
            headroom.set_at(i, 1000);
        }
        hand_out(&headroom, &shared.reserve);
        let mut q = Quota::new(2, shared.clone());
        let held =
            |q: &Quota| q.allowance().get(LARGE_BYTES) + shared.reserve.load().get(LARGE_BYTES);
        assert!(!q.spend(reserve(100)));
        // Took 100 and a quarter (two streams: 1 / 4) of the 1000 there.
        assert_eq!(q.allowance().get(LARGE_BYTES), 250);
        assert_eq!(held(&q), 900);
        assert!(!q.spend(reserve(-100)));
        assert_eq!(held(&q), 1000);
        for _ in 0..4 * RETURN_EVERY {
            assert!(!q.spend(reserve(0)));
        }
        assert_eq!(
            q.allowance().get(LARGE_BYTES),
            350,
            "at most twice the 350 taken: kept"
        );
        assert!(!q.spend(reserve(-400)));
        // Enough changes that three trips to the reserve are no churn.
        for _ in 0..4 * RETURN_EVERY {
            assert!(!q.spend(reserve(0)));
        }
        assert_eq!(
            q.allowance().get(LARGE_BYTES),
            350,
            "over twice: the excess went back"
        );
        assert_eq!(held(&q), 1400);
        assert!(!q.spend(reserve(400)));
        assert_eq!(held(&q), 1000);
        assert!(
            q.spend(reserve(1001)),
            "more than the device's headroom trips"
        );
        assert!(q.allowance().get(LARGE_BYTES) < 0);
        assert!(shared.reserve.load().get(LARGE_BYTES) >= 0);
    }

    /// A window that trips too soon goes back to journals for longer and
    /// longer; a long one resets the wait.
    #[test]
    fn quick_trips_back_off() {
        let mut m = Mode::default();
        assert!(m.next(false, false));
        assert!(!m.next(true, true));
        assert!(!m.try_quota() && m.try_quota());
        assert!(m.next(false, false));
        assert!(!m.next(true, true));
        assert!(!m.try_quota() && !m.try_quota() && m.try_quota());
        assert!(m.next(false, false));
        assert!(m.next(true, false));
        assert!(!m.next(true, true));
        assert!(!m.try_quota() && m.try_quota());
    }
}
