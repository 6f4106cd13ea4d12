//! Exact device-wide statistics with several streams, without a device lock
//! on the hot path.
//!
//! Each stream keeps its own [`Figures`] under its own lock. Their currents
//! and totals add up to the device's, but their peaks do not: 100 MiB
//! allocated and freed on one stream, then 100 MiB on another, peaks at
//! 100 MiB on the device, not 200. PyTorch defines a peak as the highest value
//! a statistic reached, so the device needs the order of every change across
//! streams.
//!
//! While a device has one stream, its figures are the device's. From the
//! second stream on, every change a stream's ledger makes is also written to
//! the stream's **journal**, stamped with the machine's clock read under the
//! stream's lock (the processor's time-stamp counter through `quanta`, which
//! falls back to the operating system's monotonic clock where that counter is
//! not invariant and synchronized across cores). The clock is one for the
//! whole machine: a change that happens after another (on the same stream,
//! or after any synchronization between threads) reads a later time, so ordering the changes by time, ties
//! in any order, is an order in which they could have happened one by one
//! (what PyTorch's device lock makes them do). [`Merged`] replays the
//! journals in that order into the device's own figures. A merge takes a
//! **horizon** (the time it starts), drains every journal and applies every
//! change stamped before the horizon: a change stamped earlier was made under
//! its stream's lock before the merge began, so it is in a journal by the
//! time the merge takes that lock. Later changes wait for the next merge.
//! One runs whenever a stream's journal reaches [`JOURNAL_LIMIT`] changes and
//! whenever statistics are read, so the figures read are the device's at one
//! moment, peaks included, with any number of streams and threads. The hot
//! path pays a counter read and a push, and threads share nothing: an atomic
//! counter shared by every stream instead cost two thirds of the throughput
//! of two threads on two cores, and the operating system's clock a third
//! (`cargo bench --bench policies -- threads`).
//!
//! Lock order: the merge state, then stream locks (one at a time, or all in
//! table order by `validate`); a stream's lock is never held while the merge
//! state is taken.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::error::InvariantViolation;
use crate::stats::MemoryStats;

use super::tally::{Family, Tally};

/// Changes a journal holds before its stream asks for a merge.
pub(crate) const JOURNAL_LIMIT: usize = 1024;

/// Journals this many times the limit make their stream wait for a merge.
const OVERFULL: usize = 16;

/// How full a journal is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fill {
    /// Below the limit.
    Room,
    /// At the limit: a merge is due, unless one is under way.
    Full,
    /// Far past it: the stream waits for a merge.
    Overfull,
}

/// One change to a stream's statistics, as its ledger makes it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// A block of `size` bytes was handed out for `requested`.
    Allocated {
        small: bool,
        size: u64,
        requested: u64,
    },
    /// Its caller freed a block that other streams still use.
    FreeRequested { small: bool, size: u64 },
    /// A block freed earlier became reusable.
    FreeCompleted {
        small: bool,
        size: u64,
        requested: u64,
    },
    /// Its caller freed a block that became reusable at once.
    Freed {
        small: bool,
        size: u64,
        requested: u64,
    },
    /// Reserved bytes and segments changed (pages mapped or unmapped,
    /// segments allocated or freed).
    Reserved {
        small: bool,
        bytes: i64,
        segments: i64,
    },
    /// Inactive split blocks changed.
    Splits { small: bool, count: i64, bytes: i64 },
}

/// Statistics that [`Change`]s are applied to: a stream's or a device's.
#[derive(Clone, Debug)]
pub(crate) struct Figures {
    /// Every family but the tally's (whose stay zero here), and the counters.
    pub(crate) rest: MemoryStats,
    tally: Tally,
}

impl Figures {
    /// Fresh figures (`rest` carries the settings).
    pub(crate) fn new(rest: MemoryStats) -> Figures {
        Figures {
            rest,
            tally: Tally::default(),
        }
    }

    /// Applies one change.
    #[inline(always)]
    pub(crate) fn apply(&mut self, change: Change) {
        match change {
            Change::Allocated {
                small,
                size,
                requested,
            } => self.tally.allocated(small, size, requested),
            Change::FreeRequested { small, size } => self.tally.free_requested(small, size),
            Change::FreeCompleted {
                small,
                size,
                requested,
            } => self.tally.free_completed(small, size, requested),
            Change::Freed {
                small,
                size,
                requested,
            } => self.tally.freed(small, size, requested),
            Change::Reserved {
                small,
                bytes,
                segments,
            } => {
                self.rest.reserved_bytes.update(small, bytes);
                self.rest.segment.update(small, segments);
            }
            Change::Splits {
                small,
                count,
                bytes,
            } => {
                self.rest.inactive_split.update(small, count);
                self.rest.inactive_split_bytes.update(small, bytes);
            }
        }
    }

    /// As PyTorch's statistics.
    pub(crate) fn stats(&self) -> MemoryStats {
        let mut s = self.rest.clone();
        let t = &self.tally;
        s.allocation = t.array(Family::Allocation);
        s.allocated_bytes = t.array(Family::AllocatedBytes);
        s.active = t.array(Family::Active);
        s.active_bytes = t.array(Family::ActiveBytes);
        s.requested_bytes = t.array(Family::RequestedBytes);
        s
    }

    /// Sets every peak to its current value.
    pub(crate) fn reset_peak(&mut self) {
        self.rest.reset_peak();
        self.tally.reset_peak();
    }

    /// Zeroes every total and event counter.
    pub(crate) fn reset_accumulated(&mut self) {
        self.rest.reset_accumulated();
        self.tally.reset_accumulated();
    }
}

/// A stream's changes since the last merge, stamped with the clock's raw
/// reading.
#[derive(Debug)]
pub(crate) struct Journal {
    clock: quanta::Clock,
    entries: Vec<(u64, Change)>,
}

impl Journal {
    /// Stamps `change` and keeps it.
    #[inline(always)]
    pub(crate) fn note(&mut self, change: Change) {
        let stamp = self.clock.raw();
        self.entries.push((stamp, change));
    }

    /// Whether the stream should ask for a merge ([`Fill::Full`]), or wait
    /// for one ([`Fill::Overfull`]: other streams outpace the merges).
    pub(crate) fn fill(&self) -> Fill {
        match self.entries.len() {
            n if n >= OVERFULL * JOURNAL_LIMIT => Fill::Overfull,
            n if n >= JOURNAL_LIMIT => Fill::Full,
            _ => Fill::Room,
        }
    }
}

/// The device's side: its clock and the merge state.
#[derive(Debug)]
pub(crate) struct DeviceJournal {
    clock: quanta::Clock,
    merged: Mutex<Option<Merged>>,
    /// Whether a merge is under way: read by every stream whose journal is
    /// full, so that they do not all take turns at the lock's cache line.
    merging: AtomicBool,
}

/// The device's figures, as of every change stamped before `horizon`.
#[derive(Debug)]
pub(crate) struct Merged {
    figures: Figures,
    horizon: u64,
    /// Changes drained and not yet applied: runs in time order (each a
    /// journal, or what an earlier merge left).
    waiting: Vec<Vec<(u64, Change)>>,
    /// Emptied journals, for streams to fill again.
    spare: Vec<Vec<(u64, Change)>>,
    /// Changes that arrived stamped before the horizon they should have
    /// been applied by (the clock's promise broken); `validate` reports them.
    late: u64,
}

impl DeviceJournal {
    /// Nothing journaled yet.
    pub(crate) fn new() -> DeviceJournal {
        DeviceJournal {
            clock: quanta::Clock::new(),
            merged: Mutex::new(None),
            merging: AtomicBool::new(false),
        }
    }

    /// The merge state: `None` while the device has had one stream.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Option<Merged>> {
        self.merged.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a merge is under way.
    pub(crate) fn busy(&self) -> bool {
        self.merging.load(Ordering::Relaxed)
    }

    /// Marks a merge as under way or done.
    pub(crate) fn set_busy(&self, busy: bool) {
        self.merging.store(busy, Ordering::Relaxed);
    }

    /// The merge state, unless another thread holds it.
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, Option<Merged>>> {
        match self.merged.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Starts journaling, from the figures of the device's only stream (which
    /// are the device's), whose journal is returned. Called with the merge
    /// state locked and the stream locked.
    pub(crate) fn start(&self, merged: &mut Option<Merged>, only: &Figures) -> Journal {
        *merged = Some(Merged {
            figures: only.clone(),
            horizon: self.now(),
            waiting: Vec::new(),
            spare: Vec::new(),
            late: 0,
        });
        self.journal()
    }

    /// A new, empty journal.
    pub(crate) fn journal(&self) -> Journal {
        Journal {
            clock: self.clock.clone(),
            entries: Vec::with_capacity(JOURNAL_LIMIT),
        }
    }

    /// The device clock now: the horizon of a merge starting now.
    pub(crate) fn now(&self) -> u64 {
        self.clock.raw()
    }
}

impl Merged {
    /// Takes one journal's changes, leaving it an empty buffer (no copy: a
    /// stream's lock is held meanwhile).
    pub(crate) fn drain(&mut self, journal: &mut Journal) {
        if journal.entries.is_empty() {
            return;
        }
        let empty = self
            .spare
            .pop()
            .unwrap_or_else(|| Vec::with_capacity(JOURNAL_LIMIT));
        self.waiting
            .push(std::mem::replace(&mut journal.entries, empty));
    }

    /// Applies, in time order, every change drained so far and stamped before
    /// `horizon`; the rest wait.
    pub(crate) fn settle(&mut self, horizon: u64) {
        self.apply_due(horizon);
        self.horizon = self.horizon.max(horizon);
    }

    /// Applies every change drained so far: with every stream locked, no
    /// change is under way, and none to come is stamped before these.
    pub(crate) fn settle_all(&mut self) {
        let last = self
            .waiting
            .iter()
            .filter_map(|run| run.last())
            .map(|e| e.0)
            .max();
        if let Some(last) = last {
            self.apply_due(u64::MAX);
            self.horizon = self.horizon.max(last);
        }
    }

    /// Merges the runs, applying each change stamped before `horizon` in time
    /// order (a run's own changes in the order made); the rest wait, as one
    /// run.
    fn apply_due(&mut self, horizon: u64) {
        let mut all = self.spare.pop().unwrap_or_default();
        for mut run in self.waiting.drain(..) {
            all.append(&mut run);
            self.spare.push(run);
        }
        // A stable sort, which finds the runs and merges them.
        all.sort_by_key(|&(stamp, _)| stamp);
        let due = all.partition_point(|&(stamp, _)| stamp < horizon);
        for &(stamp, change) in &all[..due] {
            self.late += u64::from(stamp < self.horizon);
            self.figures.apply(change);
        }
        all.drain(..due);
        if all.is_empty() {
            self.spare.push(all);
        } else {
            self.waiting.push(all);
        }
    }

    /// The device's figures as of the last horizon.
    pub(crate) fn figures(&mut self) -> &mut Figures {
        &mut self.figures
    }
}

/// With every stream locked, its journal drained and everything settled:
/// no change waits or came late, and the device's currents and totals are
/// the streams' sums (`sum`).
pub(crate) fn validate(merged: &Merged, sum: &MemoryStats) -> Result<(), InvariantViolation> {
    let waiting: usize = merged.waiting.iter().map(Vec::len).sum();
    crate::ensure_invariant!(
        waiting == 0 && merged.late == 0,
        "{waiting} changes wait and {} came after their horizon",
        merged.late
    );
    let device = merged.figures.stats();
    for ((name, mine), (_, theirs)) in device.arrays().into_iter().zip(sum.arrays()) {
        let totals = |s: &crate::stats::Stat| (s.current, s.allocated, s.freed);
        crate::ensure_invariant!(
            totals(&mine.all) == totals(&theirs.all),
            "device {name} {:?} but the streams' add up to {:?}",
            totals(&mine.all),
            totals(&theirs.all)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(size: u64) -> Change {
        Change::Allocated {
            small: false,
            size,
            requested: size,
        }
    }

    fn free(size: u64) -> Change {
        Change::Freed {
            small: false,
            size,
            requested: size,
        }
    }

    #[test]
    fn changes_apply_in_time_order_up_to_the_horizon() {
        let device = DeviceJournal::new();
        let mut merged = None;
        let first = Figures::new(MemoryStats::new(None));
        let mut a = device.start(&mut merged, &first);
        let mut b = device.journal();
        let merged = merged.as_mut().expect("started");
        // 100 on a, freed; then 100 on b: the device peaks at 100, not 200.
        a.note(alloc(100));
        a.note(free(100));
        b.note(alloc(100));
        let after_b = device.now() + 1;
        std::thread::sleep(std::time::Duration::from_micros(50));
        b.note(alloc(7));
        // b's journal drained first: its changes still go after a's.
        merged.drain(&mut b);
        merged.drain(&mut a);
        merged.settle(after_b);
        let s = merged.figures().stats();
        assert_eq!(
            s.allocated_bytes.all.current, 100,
            "the 7 is past the horizon"
        );
        assert_eq!(s.allocated_bytes.all.peak, 100);
        assert_eq!(s.allocation.all.allocated, 2);
        merged.settle_all();
        assert_eq!(merged.figures().stats().allocated_bytes.all.current, 107);
        validate(merged, &merged.figures.stats()).expect("nothing waits");
    }

    #[test]
    fn a_journal_asks_for_a_merge_when_full() {
        let device = DeviceJournal::new();
        let mut j = device.journal();
        for _ in 1..JOURNAL_LIMIT {
            j.note(alloc(512));
        }
        assert_eq!(j.fill(), Fill::Room);
        j.note(alloc(512));
        assert_eq!(j.fill(), Fill::Full);
        for _ in JOURNAL_LIMIT..OVERFULL * JOURNAL_LIMIT {
            j.note(alloc(512));
        }
        assert_eq!(j.fill(), Fill::Overfull);
    }
}
