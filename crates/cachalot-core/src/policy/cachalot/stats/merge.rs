//! The device's peaks with several streams, exact, computed from the streams'
//! journals without a device lock on the hot path.
//!
//! A merge locks every stream at once (a **cut**: no change is under way, and
//! the streams' values add up to the device's), takes each journal's changes
//! since the last cut as a [`Run`], and lets the streams go on. It then sweeps
//! the runs' chunks in time order, keeping an upper bound of the device's
//! values: the sum, over the streams, of the highest values of the chunk each
//! is in (or of its values between chunks). While that bound is at most the
//! device's peaks, no change in the stretch can have raised a peak, and the
//! changes are not looked at. Where it rises above them, the sweep replays the
//! changes of every stream one by one in time order from there (each stream's
//! values brought there from the start of its chunk), raising the peaks
//! exactly, until the bound falls back. Each chunk's highest values count
//! from its start, so the bound holds at every point of the replay order.
//!
//! The stamp order with ties broken by the streams' order in the cut (and
//! each stream's own changes in the order made) is the one order used
//! throughout, so the peaks are those of one sequence in which the changes
//! could have happened one by one, as under PyTorch's device lock.
//!
//! The streams' currents and totals add up at a cut and are read from them;
//! the device keeps only its peaks. The peaks of two cuts do not depend on
//! each other, so a thread whose journal filled takes a cut under the merge
//! state's lock and, after letting go of it, hands it to the settler threads
//! (`settler`), which settle cuts off the allocating threads; a reader of
//! the statistics (or a reset of the peaks) waits until every cut taken is
//! settled, then takes and settles its own.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::InvariantViolation;

use super::journal::{Figures, Journal, Run};
use super::levels::Levels;
use super::settler::{Settle, Settler};
use super::stamp::Stamper;
use crate::transition::Transition;

/// The device's side: the stamps the streams take (`stamp`), the merge state and
/// the settler threads.
#[derive(Debug)]
pub(crate) struct DeviceJournal {
    stamps: Arc<Stamper>,
    state: Arc<MergeState>,
    /// Whether a cut is being taken: read by every stream whose journal is
    /// full, so that they do not all take turns at the lock's cache line.
    merging: AtomicBool,
    /// Whether the device has had several streams (streams journal).
    several: AtomicBool,
    settler: Settler<Cut>,
}

impl DeviceJournal {
    /// Nothing journaled yet.
    pub(crate) fn new() -> DeviceJournal {
        DeviceJournal {
            stamps: Arc::new(Stamper::new(quanta::Clock::new())),
            state: Arc::default(),
            merging: AtomicBool::new(false),
            several: AtomicBool::new(false),
            settler: Settler::default(),
        }
    }

    /// Waits, the merge state locked, until every cut taken is settled
    /// (waking the settler threads from their naps first).
    pub(crate) fn wait_idle<'a>(
        &self,
        mut guard: MutexGuard<'a, Option<Merged>>,
    ) -> MutexGuard<'a, Option<Merged>> {
        if let Some(m) = guard.as_mut() {
            m.own();
            if !m.idle() {
                self.settler.hurry();
            }
        }
        self.state.wait_idle(guard)
    }

    /// Once the device has had several streams, an operation's stamp, made
    /// before its stream's lock is taken (`journal`, `stamp`).
    #[inline(always)]
    pub(crate) fn early_stamp(&self) -> Option<u64> {
        self.several
            .load(Ordering::Relaxed)
            .then(|| self.stamps.stamp())
    }

    /// Settles a cut taken and let go of, on a settler thread where it
    /// can (`settler`).
    pub(crate) fn settle_apart(&self, cut: Cut) {
        self.settler.hand(cut, &self.state);
    }

    /// The merge state: `None` while the device has had one stream.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Merged>> {
        self.state.lock()
    }

    /// The merge state, unless another thread holds it.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, Option<Merged>>> {
        self.state.try_lock()
    }

    /// Whether a cut is being taken.
    pub(crate) fn busy(&self) -> bool {
        self.merging.load(Ordering::Relaxed)
    }

    /// Marks a cut as being taken or taken.
    pub(crate) fn set_busy(&self, busy: bool) {
        self.merging.store(busy, Ordering::Relaxed);
    }

    /// A journal whose stamps are `clock`'s readings, never chained (tests
    /// drive it by hand).
    #[cfg(test)]
    pub(crate) fn with_clock(clock: quanta::Clock) -> DeviceJournal {
        DeviceJournal {
            stamps: Arc::new(Stamper::with_chains(clock, false)),
            ..DeviceJournal::new()
        }
    }

    /// Starts merging, from the figures of the device's only stream (which
    /// are the device's), whose journal is returned. Called with the merge
    /// state locked and the stream locked.
    pub(crate) fn start(&self, merged: &mut Option<Merged>, only: &mut Figures) -> Journal {
        *merged = Some(Merged {
            peaks: only.tops(),
            pid: std::process::id(),
            ..Merged::default()
        });
        self.several.store(true, Ordering::Relaxed);
        self.journal(only)
    }

    /// A new, empty journal from `figures`' values.
    pub(crate) fn journal(&self, figures: &mut Figures) -> Journal {
        Journal::new(self.stamps.clone(), figures)
    }
}

/// The merge state and the signal that a cut was settled: shared by the
/// device's side and the settler threads.
#[derive(Debug, Default)]
struct MergeState {
    merged: Mutex<Option<Merged>>,
    /// Signalled when a cut is settled.
    settled: Condvar,
}

impl MergeState {
    /// The merge state: `None` while the device has had one stream.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Merged>> {
        self.merged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The merge state, unless another thread holds it.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, Option<Merged>>> {
        match self.merged.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Waits, the merge state locked, until every cut taken is settled.
    pub(crate) fn wait_idle<'a>(
        &self,
        mut guard: MutexGuard<'a, Option<Merged>>,
    ) -> MutexGuard<'a, Option<Merged>> {
        while guard.as_ref().is_some_and(|m| !m.idle()) {
            guard = self.settled.wait(guard).unwrap_or_else(|e| e.into_inner());
        }
        guard
    }
}

impl Settle for MergeState {
    type Cut = Cut;

    /// Settles `cut` and takes it back into the merge state. A settle that
    /// panics (a bug) still finishes the cut, so that readers never wait for
    /// it forever, and leaves the merge state marked for `validate`.
    fn settle(&self, mut cut: Cut) {
        let panicked = catch_unwind(AssertUnwindSafe(|| cut.settle())).is_err();
        if let Some(m) = self.lock().as_mut() {
            if panicked {
                m.mark_lost();
            }
            m.finish(cut);
        }
        self.settled.notify_all();
    }
}

/// The device's peaks as of the last cut settled, and buffers for the next.
#[derive(Debug, Default)]
pub(crate) struct Merged {
    peaks: Levels,
    /// Emptied runs, for journals to fill again.
    spare: Vec<Run>,
    /// Cuts taken and not yet settled.
    in_flight: usize,
    /// The process whose threads hold the cuts in flight (see
    /// [`Merged::own`]).
    pid: u32,
    /// Why some changes never reached the peaks (which may be low), if any
    /// did not.
    lost: Option<&'static str>,
}

/// One cut's runs (one per stream), settled apart from the merge state: the
/// peaks of separate cuts do not depend on each other, so threads settle the
/// cuts they took at once, and only readers wait for them all.
#[derive(Debug)]
pub(crate) struct Cut {
    runs: Vec<Run>,
    /// The device's peaks when the cut was taken, raised by its changes.
    peaks: Levels,
}

/// A stream entering or leaving a chunk.
#[derive(Copy, Clone, Debug)]
struct Event {
    stamp: u64,
    run: u32,
    chunk: u32,
    enter: bool,
}

impl Merged {
    /// An empty run for a journal to go on in.
    pub(crate) fn spare(&mut self) -> Run {
        self.spare.pop().unwrap_or_default()
    }

    /// Starts a cut (the streams' runs are added to it, then it is settled
    /// and finished).
    pub(crate) fn begin(&mut self) -> Cut {
        self.own();
        self.in_flight += 1;
        Cut {
            runs: Vec::new(),
            peaks: self.peaks,
        }
    }

    /// Takes a settled cut's peaks and keeps its buffers.
    pub(crate) fn finish(&mut self, cut: Cut) {
        self.peaks.raise(&cut.peaks);
        self.in_flight -= 1;
        self.spare.extend(cut.runs.into_iter().map(Run::emptied));
    }

    /// Notes that a cut's settle panicked.
    pub(crate) fn mark_lost(&mut self) {
        self.lost = Some("settling a cut panicked");
    }

    /// Makes the cuts in flight this process's. In a child forked while
    /// some were, they stay with threads the child does not have (a cut's
    /// taker, a settler thread): the child forgets them, so that its readers
    /// never wait for them, and `validate` reports the loss. Called under
    /// the merge state's lock before a cut begins or a reader waits.
    pub(crate) fn own(&mut self) {
        let pid = std::process::id();
        if self.pid != pid {
            if self.in_flight > 0 {
                self.lost = Some("cuts in flight when the process forked were lost");
            }
            self.in_flight = 0;
            self.pid = pid;
        }
    }

    /// Whether every cut taken is settled.
    pub(crate) fn idle(&self) -> bool {
        self.in_flight == 0
    }

    /// The device's peaks as of the last cut settled.
    pub(crate) fn peaks(&self) -> &Levels {
        &self.peaks
    }

    /// Sets the peaks to the device's values `now` (with no cut in flight).
    pub(crate) fn reset_peak(&mut self, now: Levels) {
        self.peaks = now;
    }

    /// With every cut settled and the streams still at the last: no peak is
    /// below the device's values `now` (the streams' sum).
    pub(crate) fn validate(&self, now: &Levels) -> Result<(), InvariantViolation> {
        crate::error::ensure_invariant!(
            self.in_flight == 0,
            "{} cuts were never settled",
            self.in_flight
        );
        if let Some(why) = self.lost {
            return Err(InvariantViolation(format!(
                "device peaks may be low: {why}"
            )));
        }
        if let Some((family, pool)) = self.peaks.first_below(now) {
            return Err(InvariantViolation(format!(
                "device peak (family {family}, pool {pool}) is below the streams' current sum"
            )));
        }
        Ok(())
    }
}

impl Cut {
    /// Keeps a stream's run.
    pub(crate) fn add(&mut self, run: Run) {
        self.runs.push(run);
    }

    /// Raises the peaks by the runs' changes (module docs). Returns how many
    /// changes were replayed one by one.
    pub(crate) fn settle(&mut self) -> usize {
        let mut events =
            Vec::with_capacity(2 * self.runs.iter().map(|r| r.chunks.len()).sum::<usize>());
        for (r, run) in self.runs.iter().enumerate() {
            for (c, chunk) in run.chunks.iter().enumerate() {
                for (stamp, enter) in [(chunk.first, true), (chunk.last, false)] {
                    events.push(Event {
                        stamp,
                        run: r as u32,
                        chunk: c as u32,
                        enter,
                    });
                }
            }
        }
        // Stable: ties stay in run order, each run's events in the order made.
        events.sort_by_key(|e| e.stamp);
        let mut sweep = Sweep::new(&self.runs, self.peaks);
        for e in &events {
            sweep.step(&self.runs, e);
        }
        self.peaks = sweep.peaks;
        sweep.replayed
    }
}

/// Where a stream's exact values are: after its changes before `next`.
#[derive(Copy, Clone, Debug)]
struct Cursor {
    level: Levels,
    next: usize,
}

impl Cursor {
    /// Applies run `q`'s changes before `limit` (in the one order), handing
    /// each to `each` too.
    fn advance(&mut self, run: &Run, q: usize, limit: Key, mut each: impl FnMut(Transition)) {
        while let Some(&(t, change)) = run.entries.get(self.next) {
            if (t, q, self.next) >= limit {
                break;
            }
            self.level.shift(change);
            self.next += 1;
            each(change);
        }
    }
}

/// Where a change is in the one order used: stamp, run, index in the run.
type Key = (u64, usize, usize);

/// The sweep over one cut's runs (module docs).
struct Sweep {
    peaks: Levels,
    /// The sum of `upper`.
    bound: Levels,
    /// Per run: the highest values of the chunk it is in, else its values.
    upper: Vec<Levels>,
    /// Per run: exact values, at the sweep while replaying, else at the start
    /// of the chunk it is in (or at the sweep, between chunks).
    cursors: Vec<Cursor>,
    /// The runs inside a chunk (entered, not yet left).
    open: Members,
    /// The sum of the cursors of the runs between chunks: their exact values
    /// (a run's changes all lie in its chunks, so a run between two has none
    /// before the sweep left to replay).
    closed: Levels,
    /// While replaying: the device's exact values (the cursors' sum).
    exact: Option<Levels>,
    /// While replaying: runs with changes left, by their next change's stamp
    /// (ties to the lower run); `queued` says which are in.
    heads: BinaryHeap<Reverse<(u64, usize)>>,
    queued: Members,
    /// Changes replayed one by one.
    replayed: usize,
}

/// A set of run indexes with constant-time insertion, removal and test.
struct Members {
    at: Vec<usize>,
    list: Vec<usize>,
}

impl Members {
    const OUT: usize = usize::MAX;

    fn new(n: usize) -> Members {
        Members {
            at: vec![Self::OUT; n],
            list: Vec::new(),
        }
    }

    fn contains(&self, r: usize) -> bool {
        self.at[r] != Self::OUT
    }

    fn insert(&mut self, r: usize) {
        if !self.contains(r) {
            self.at[r] = self.list.len();
            self.list.push(r);
        }
    }

    fn remove(&mut self, r: usize) {
        let i = std::mem::replace(&mut self.at[r], Self::OUT);
        if i != Self::OUT {
            self.list.swap_remove(i);
            if let Some(&moved) = self.list.get(i) {
                self.at[moved] = i;
            }
        }
    }

    fn clear(&mut self) {
        for r in self.list.drain(..) {
            self.at[r] = Self::OUT;
        }
    }
}

impl Sweep {
    fn new(runs: &[Run], peaks: Levels) -> Sweep {
        let upper: Vec<Levels> = runs.iter().map(|r| r.start).collect();
        let bound = upper.iter().fold(Levels::default(), |s, l| s.plus(l));
        Sweep {
            peaks,
            bound,
            cursors: upper
                .iter()
                .map(|&level| Cursor { level, next: 0 })
                .collect(),
            open: Members::new(upper.len()),
            closed: bound,
            heads: BinaryHeap::new(),
            queued: Members::new(upper.len()),
            upper,
            exact: None,
            replayed: 0,
        }
    }

    fn step(&mut self, runs: &[Run], e: &Event) {
        let (r, c) = (e.run as usize, e.chunk as usize);
        let chunk = &runs[r].chunks[c];
        if e.enter {
            let first = c.checked_sub(1).map_or(0, |p| runs[r].chunks[p].end);
            let key = (e.stamp, r, first);
            if self.exact.is_some() {
                self.replay_before(runs, key);
            }
            self.closed = self.closed.minus(&self.cursors[r].level);
            self.open.insert(r);
            if self.exact.is_some() {
                self.queue(runs, r);
            }
            self.set_upper(r, chunk.top);
            if self.exact.is_none() && self.bound.exceeds(&self.peaks) {
                self.start_replay(runs, key);
            }
        } else {
            if self.exact.is_some() {
                self.replay_before(runs, (e.stamp, r, chunk.end));
            }
            self.set_upper(r, chunk.level);
            if self.exact.is_none() {
                self.cursors[r] = Cursor {
                    level: chunk.level,
                    next: chunk.end,
                };
            }
            self.open.remove(r);
            self.closed = self.closed.plus(&self.cursors[r].level);
            if self.exact.is_some() && !self.bound.exceeds(&self.peaks) {
                self.exact = None;
                self.heads.clear();
                self.queued.clear();
            }
        }
    }

    /// Run `r`'s bound becomes `upper`.
    fn set_upper(&mut self, r: usize, upper: Levels) {
        self.bound = self.bound.minus(&self.upper[r]).plus(&upper);
        self.upper[r] = upper;
    }

    /// Puts run `r` among the heads, if it has changes left and is not there.
    fn queue(&mut self, runs: &[Run], r: usize) {
        if self.queued.contains(r) {
            return;
        }
        if let Some(&(t, _)) = runs[r].entries.get(self.cursors[r].next) {
            self.heads.push(Reverse((t, r)));
            self.queued.insert(r);
        }
    }

    /// Brings the cursors of the runs inside a chunk to `key` (no peak can be
    /// there: the bound held; the others are at the sweep) and starts
    /// replaying.
    #[cold]
    fn start_replay(&mut self, runs: &[Run], key: Key) {
        let mut sum = self.closed;
        for i in 0..self.open.list.len() {
            let q = self.open.list[i];
            self.cursors[q].advance(&runs[q], q, key, |_| {});
            sum = sum.plus(&self.cursors[q].level);
            self.queue(runs, q);
        }
        self.exact = Some(sum);
    }

    /// Replays every change before `key` in order, raising the peaks: the
    /// run with the earliest next change gives changes until another run's
    /// next one, or `key`, comes first.
    fn replay_before(&mut self, runs: &[Run], key: Key) {
        let Some(exact) = self.exact.as_mut() else {
            return;
        };
        let cursors = &mut self.cursors;
        while let Some(&Reverse((t, q))) = self.heads.peek() {
            if (t, q, cursors[q].next) >= key {
                return;
            }
            self.heads.pop();
            let limit = match self.heads.peek() {
                Some(&Reverse((t2, o))) => key.min((t2, o, cursors[o].next)),
                None => key,
            };
            let (peaks, replayed) = (&mut self.peaks, &mut self.replayed);
            let before = cursors[q].level;
            cursors[q].advance(&runs[q], q, limit, |change| {
                exact.shift_raising(change, peaks);
                *replayed += 1;
            });
            if !self.open.contains(q) {
                // Only a run inside a chunk has changes before the sweep.
                self.closed = self.closed.minus(&before).plus(&cursors[q].level);
            }
            match runs[q].entries.get(cursors[q].next) {
                Some(&(t, _)) => self.heads.push(Reverse((t, q))),
                None => self.queued.remove(q),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::cachalot::stats::journal::Figures;
    use crate::stats::MemoryStats;
    use crate::test_rng::XorShift;
    use std::sync::Arc;

    fn alloc(size: u64) -> Transition {
        Transition::Allocated {
            small: false,
            size,
            requested: size,
        }
    }

    fn free(size: u64) -> Transition {
        Transition::Freed {
            small: false,
            size,
            requested: size,
        }
    }

    /// A stream: its figures and journal, stamping with a clock that a
    /// nanosecond passes on before each change.
    struct Stream {
        figures: Figures,
        journal: Journal,
        clock: Arc<quanta::Mock>,
    }

    impl Stream {
        fn note(&mut self, change: Transition) {
            self.clock.increment(1);
            self.figures.apply(change);
            self.journal.note(change, &mut self.figures);
        }
    }

    fn streams(n: usize) -> (Option<Merged>, Vec<Stream>) {
        let (clock, mock) = quanta::Clock::mock();
        let device = DeviceJournal::with_clock(clock);
        let mut merged = None;
        let mut first = Figures::new(MemoryStats::new(None));
        let journal = device.start(&mut merged, &mut first);
        let mut out = vec![Stream {
            figures: first,
            journal,
            clock: mock.clone(),
        }];
        for _ in 1..n {
            let mut figures = Figures::new(MemoryStats::new(None));
            let journal = device.journal(&mut figures);
            let clock = mock.clone();
            out.push(Stream {
                figures,
                journal,
                clock,
            });
        }
        (merged, out)
    }

    /// Takes every stream's run (each checked) into a cut, not yet settled.
    fn take_cut(merged: &mut Merged, streams: &mut [Stream]) -> Cut {
        let mut cut = merged.begin();
        for s in streams.iter_mut() {
            let spare = merged.spare();
            let run = s.journal.take(&mut s.figures, spare);
            run.validate().expect("a consistent run");
            cut.add(run);
        }
        cut
    }

    /// Takes every stream's run and settles them; returns the changes replayed.
    fn cut(merged: &mut Merged, streams: &mut [Stream]) -> usize {
        let mut cut = take_cut(merged, streams);
        let replayed = cut.settle();
        merged.finish(cut);
        let now = streams
            .iter()
            .fold(Levels::default(), |sum, s| sum.plus(&s.figures.levels()));
        merged.validate(&now).expect("peaks at least the values");
        replayed
    }

    #[test]
    fn a_peak_on_one_stream_then_another_is_not_added_up() {
        let (mut merged, mut s) = streams(2);
        let m = merged.as_mut().expect("started");
        s[0].note(alloc(100));
        s[0].note(free(100));
        s[1].note(alloc(100));
        cut(m, &mut s);
        let mut stats = MemoryStats::new(None);
        m.peaks().write_peaks(&mut stats);
        assert_eq!(stats.allocated_bytes.all.peak, 100);
        s[0].note(alloc(50));
        cut(m, &mut s);
        m.peaks().write_peaks(&mut stats);
        assert_eq!(stats.allocated_bytes.all.peak, 150);
        assert_eq!(stats.allocated_bytes.large_pool.peak, 150);
    }

    /// An operation's changes share the stamp of its first, so they stay
    /// together in the one order: here 100 bytes allocated and freed within
    /// one operation, while another stream allocates 100 bytes between the
    /// two changes, then 20 more after the operation: the peak is 120 (the
    /// operation happened at its first change), not 200.
    #[test]
    fn an_operations_changes_share_one_stamp() {
        let (mut merged, mut s) = streams(2);
        let m = merged.as_mut().expect("started");
        s[0].journal.begin_op(None);
        s[0].note(alloc(100));
        s[1].note(alloc(100));
        s[0].note(free(100));
        s[0].journal.end_op();
        s[0].note(alloc(20));
        let mut cut = take_cut(m, &mut s);
        let stamps: Vec<u64> = cut.runs[0].entries.iter().map(|e| e.0).collect();
        assert_eq!(stamps, [1, 1, 4], "the operation's changes at its first");
        cut.settle();
        m.finish(cut);
        let mut stats = MemoryStats::new(None);
        m.peaks().write_peaks(&mut stats);
        assert_eq!(stats.allocated_bytes.all.peak, 120);
    }

    /// A cut in flight when the process forked stays with the parent's
    /// threads: the child forgets it (its readers do not wait for it) and
    /// `validate` says its peaks may be low; the parent keeps waiting for it.
    #[test]
    fn cuts_in_flight_at_a_fork_are_forgotten_and_reported() {
        let mut merged = Merged::default();
        let cut = merged.begin();
        merged.own();
        assert!(!merged.idle(), "in the same process the cut is awaited");
        merged.pid = merged.pid.wrapping_add(1);
        merged.own();
        assert!(merged.idle(), "a forked child does not wait for it");
        let err = merged.validate(&Levels::default()).unwrap_err();
        assert!(err.0.contains("forked"), "{}", err.0);
        drop(cut);
    }

    /// A stamp read as an operation began, before its stream's lock, may be
    /// older than a change another thread made on that stream meanwhile:
    /// the operation takes the later stamp, so stamps never go back.
    #[test]
    fn an_early_stamp_never_goes_back() {
        let (mut merged, mut s) = streams(2);
        let m = merged.as_mut().expect("started");
        s[0].note(alloc(10));
        s[0].note(alloc(10));
        s[0].journal.begin_op(Some(1));
        s[0].note(alloc(10));
        s[0].journal.end_op();
        s[0].journal.begin_op(Some(7));
        s[0].note(free(10));
        s[0].journal.end_op();
        let mut cut = take_cut(m, &mut s);
        let stamps: Vec<u64> = cut.runs[0].entries.iter().map(|e| e.0).collect();
        assert_eq!(stamps, [1, 2, 2, 7]);
        cut.settle();
        m.finish(cut);
    }

    /// The device's peaks from seeded interleavings of several streams'
    /// changes (random walks, which keep reaching new peaks), cut at random
    /// points, against replaying every change one by one in the order they
    /// were made.
    #[test]
    fn peaks_match_the_changes_replayed_one_by_one() {
        let mut rng = XorShift(0x5851_f42d);
        for round in 0..48 {
            // A few streams, and (every eighth round) many, most of them
            // between chunks while a few change.
            let n = if round % 8 == 7 { 300 } else { 2 + round % 5 };
            let (mut merged, mut s) = streams(n);
            let m = merged.as_mut().expect("started");
            let (mut model, mut peaks) = (Levels::default(), Levels::default());
            let mut live = vec![Blocks::default(); n];
            let mut q = 0;
            for step in 0..4_000 {
                let x = rng.draw();
                // Streams take turns in bursts, as threads on cores do.
                if x.is_multiple_of(8) {
                    q = (x >> 3) as usize % n;
                }
                let Some(change) = random_change(x, &mut live[q]) else {
                    continue;
                };
                s[q].note(change);
                model.shift(change);
                peaks.raise(&model);
                if (x >> 40).is_multiple_of(400) {
                    cut(m, &mut s);
                    assert_eq!(*m.peaks(), peaks, "round {round}, step {step}");
                }
            }
            cut(m, &mut s);
            assert_eq!(*m.peaks(), peaks, "round {round}, the end");
        }
    }

    /// Streams repeating one training step each, out of phase: after the
    /// first steps, the peaks are exact and nearly no change is replayed.
    #[test]
    fn repeated_steps_are_merged_without_replaying_them() {
        let mut rng = XorShift(0x2f6b_1a3d);
        let mut blocks = Blocks::default();
        let mut step: Vec<Transition> = std::iter::from_fn(|| Some(rng.draw()))
            .filter_map(|x| random_change(x, &mut blocks))
            .take(3_000)
            .collect();
        // The step ends where it began: everything freed and unmapped.
        for (small, size, pending) in blocks.live {
            let requested = size - 7;
            step.push(match pending {
                true => Transition::FreeCompleted {
                    small,
                    size,
                    requested,
                },
                false => Transition::Freed {
                    small,
                    size,
                    requested,
                },
            });
        }
        for (p, &pages) in blocks.pages.iter().enumerate() {
            step.extend((0..pages).map(|_| Transition::Reserved {
                small: p == 1,
                bytes: -(2 << 20),
                segments: -1,
            }));
        }
        let n = 6;
        let (mut merged, mut s) = streams(n);
        let m = merged.as_mut().expect("started");
        let (mut model, mut peaks) = (Levels::default(), Levels::default());
        let mut at = vec![0; n];
        let (mut total, mut replayed) = (0, 0);
        for i in 0..600_000 {
            let x = rng.draw();
            // Stream q starts once the others are q / n of a step in.
            let q = (x % n as u64) as usize;
            if at[q] == 0 && i < q * step.len() / n {
                continue;
            }
            let change = step[at[q] % step.len()];
            at[q] += 1;
            s[q].note(change);
            model.shift(change);
            peaks.raise(&model);
            if i % 20_000 == 19_999 {
                let r = cut(m, &mut s);
                assert_eq!(*m.peaks(), peaks, "at change {i}");
                if i >= 100_000 {
                    (total, replayed) = (total + 20_000, replayed + r);
                }
            }
        }
        assert!(
            replayed * 3 < total,
            "{replayed} of {total} changes replayed one by one"
        );
    }

    /// A stream's live blocks (small, size, pending) and mapped pages.
    #[derive(Clone, Default)]
    struct Blocks {
        live: Vec<(bool, u64, bool)>,
        pages: [i64; 2],
    }

    /// A seeded change to a stream with `blocks`, kept up to date; `None`
    /// where the draw has nothing to free or unmap.
    fn random_change(x: u64, blocks: &mut Blocks) -> Option<Transition> {
        let small = (x >> 12).is_multiple_of(3);
        let size = 512 * ((x >> 16) % 64 + 1);
        let live = &mut blocks.live;
        let pages = &mut blocks.pages[usize::from(small)];
        let k = (x >> 32) as usize % live.len().max(1);
        Some(match (x >> 24) % 10 {
            0..=3 => {
                live.push((small, size, false));
                Transition::Allocated {
                    small,
                    size,
                    requested: size - 7,
                }
            }
            4..=6 if !live.is_empty() => {
                let (small, size, pending) = live.swap_remove(k);
                let requested = size - 7;
                if pending {
                    Transition::FreeCompleted {
                        small,
                        size,
                        requested,
                    }
                } else {
                    Transition::Freed {
                        small,
                        size,
                        requested,
                    }
                }
            }
            7 if live.get(k).is_some_and(|b| !b.2) => {
                live[k].2 = true;
                Transition::FreeRequested {
                    small: live[k].0,
                    size: live[k].1,
                }
            }
            8 => {
                *pages += 1;
                Transition::Reserved {
                    small,
                    bytes: 2 << 20,
                    segments: 1,
                }
            }
            9 if *pages > 0 => {
                *pages -= 1;
                Transition::Reserved {
                    small,
                    bytes: -(2 << 20),
                    segments: -1,
                }
            }
            _ => return None,
        })
    }
}
