//! A stream's statistics and, once its device has several streams, the
//! journal of their changes that the device's peaks are computed from
//! (`merge`).
//!
//! Each stream keeps its own [`Figures`] under its own lock. Their currents
//! and totals add up to the device's, but their peaks do not: 100 MiB
//! allocated and freed on one stream, then 100 MiB on another, peaks at
//! 100 MiB on the device, not 200. PyTorch defines a peak as the highest value
//! a statistic reached, so the device needs the order of the changes across
//! streams.
//!
//! From the second stream on, every change a stream's ledger makes is also
//! written to the stream's [`Journal`], stamped within the operation that
//! made it (`stamp`): by the machine's clock (the processor's time-stamp
//! counter through `quanta`, which falls back to the operating system's
//! monotonic clock where that counter is not invariant and synchronized
//! across cores, read only once every earlier instruction of the thread is
//! done), or, while one thread keeps the device to itself, by that thread's
//! last stamp plus one. A stamp is made once per operation, as it begins
//! (before the stream's lock is taken, so that a clock read overlaps the
//! wait for the lock: on the H100 host a read costs about 20 ns), or at its
//! first change where the device had one stream when it began: the changes
//! an allocation or a free makes under one hold of the lock share that
//! stamp, as if the operation had made them all at that instant, which falls
//! within it. A change that happens after another (on the same stream, or
//! after any synchronization between threads) gets a larger stamp, so
//! ordering the changes by stamp, ties in any order, is an order in which
//! they could have happened one by one (what PyTorch's device lock makes
//! them do).
//!
//! The journal cuts its changes into **chunks** of [`CHUNK`] changes and
//! writes down, for each, the highest value every statistic reached in it
//! (the stream's own peaks, reset at each chunk: no work on the hot path
//! beyond a stamp and a push) and the values at its end. The merge uses
//! these to skip, without looking at their changes, the stretches of time in
//! which the streams' highest values add up to no more than the device's
//! peaks, which is nearly all of them.

use crate::error::InvariantViolation;
use crate::stats::MemoryStats;

use std::sync::Arc;

use super::levels::Levels;
use super::stamp::{self, Stamper};
use super::tally::{Family, Tally};
use crate::transition::Transition;

/// Changes a journal holds before its stream asks for a merge.
pub(crate) const JOURNAL_LIMIT: usize = 4096;

/// Journals this many times the limit make their stream wait for a merge.
const OVERFULL: usize = 16;

/// Changes per chunk.
pub(crate) const CHUNK: usize = 128;

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

/// A stream's statistics, which [`Transition`]s are applied to.
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

    /// Bytes allocated now.
    pub(crate) fn allocated_bytes(&self) -> u64 {
        self.tally.current(Family::AllocatedBytes)[2] as u64
    }

    /// Applies one change.
    #[inline(always)]
    pub(crate) fn apply(&mut self, change: Transition) {
        match change {
            Transition::Allocated {
                small,
                size,
                requested,
            } => self.tally.allocated(small, size, requested),
            Transition::FreeRequested { small, size } => self.tally.free_requested(small, size),
            Transition::FreeCompleted {
                small,
                size,
                requested,
            } => self.tally.free_completed(small, size, requested),
            Transition::Freed {
                small,
                size,
                requested,
            } => self.tally.freed(small, size, requested),
            Transition::Reserved {
                small,
                bytes,
                segments,
            } => {
                self.rest.reserved_bytes.update(small, bytes);
                self.rest.segment.update(small, segments);
            }
            Transition::Splits {
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

    /// Every statistic's current value.
    pub(crate) fn levels(&self) -> Levels {
        self.read(Levels::current, Tally::current)
    }

    /// Every statistic's peak.
    pub(crate) fn tops(&self) -> Levels {
        self.read(Levels::peaks, Tally::peaks)
    }

    /// One value of every statistic: `rest`'s families read by `of_rest`,
    /// the tally's by `of_tally`.
    fn read(
        &self,
        of_rest: fn(&MemoryStats) -> Levels,
        of_tally: fn(&Tally, Family) -> [i64; 3],
    ) -> Levels {
        let mut l = of_rest(&self.rest);
        for f in Family::ALL {
            l.set(f, of_tally(&self.tally, f));
        }
        l
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

/// A stretch of a stream's changes: the highest value each statistic reached
/// from its start to its end, and the values at its end.
#[derive(Clone, Debug)]
pub(crate) struct Chunk {
    /// The stamps of its first and last changes.
    pub(crate) first: u64,
    pub(crate) last: u64,
    /// Its changes end at this index of the run's.
    pub(crate) end: usize,
    /// The highest values, from the values before its first change on.
    pub(crate) top: Levels,
    /// The values after its last change.
    pub(crate) level: Levels,
}

/// A stream's changes between two merges, in chunks.
#[derive(Clone, Debug, Default)]
pub(crate) struct Run {
    /// The values before the first change.
    pub(crate) start: Levels,
    /// The changes, stamped, in the order made.
    pub(crate) entries: Vec<(u64, Transition)>,
    /// Every change is in exactly one chunk, in order.
    pub(crate) chunks: Vec<Chunk>,
}

impl Run {
    /// The run emptied, its buffers kept.
    pub(crate) fn emptied(mut self) -> Run {
        self.entries.clear();
        self.chunks.clear();
        self
    }

    /// Stamps never go back, the chunks cover the changes in order, and
    /// replaying the changes from the start reaches each chunk's values,
    /// never above its highest ones.
    pub(crate) fn validate(&self) -> Result<(), InvariantViolation> {
        let mut level = self.start;
        let (mut begin, mut stamp) = (0, 0);
        for (i, c) in self.chunks.iter().enumerate() {
            let changes = self.entries.get(begin..c.end).unwrap_or_default();
            crate::error::ensure_invariant!(
                !changes.is_empty()
                    && changes[0].0 == c.first
                    && changes[changes.len() - 1].0 == c.last,
                "journal chunk {i} does not match its changes {begin}..{}",
                c.end
            );
            let mut top = level;
            for &(t, change) in changes {
                crate::error::ensure_invariant!(t >= stamp, "journal stamps go back at {t}");
                stamp = t;
                level.shift(change);
                top.raise(&level);
            }
            crate::error::ensure_invariant!(
                level == c.level && c.top.first_below(&top).is_none(),
                "journal chunk {i}: its values or highest values are not its changes'"
            );
            begin = c.end;
        }
        crate::error::ensure_invariant!(
            begin == self.entries.len(),
            "{} journaled changes are in no chunk",
            self.entries.len() - begin
        );
        Ok(())
    }
}

/// A stream's changes since the last merge.
#[derive(Debug)]
pub(crate) struct Journal {
    stamps: Arc<Stamper>,
    run: Run,
    /// The first change of the chunk being written.
    open: usize,
    /// Within an operation: its stamp, once its first change read the clock.
    op: Option<Option<u64>>,
}

impl Journal {
    /// An empty journal starting from `figures`' values, whose peaks are
    /// reset (from now on they are the open chunk's).
    pub(crate) fn new(stamps: Arc<Stamper>, figures: &mut Figures) -> Journal {
        figures.reset_peak();
        Journal {
            stamps,
            run: Run {
                start: figures.levels(),
                entries: Vec::with_capacity(JOURNAL_LIMIT),
                chunks: Vec::with_capacity(JOURNAL_LIMIT / CHUNK + 1),
            },
            open: 0,
            op: None,
        }
    }

    /// Changes from now until [`Journal::end_op`] share one stamp: `early`,
    /// read when the operation began, or the clock at the first change. A
    /// stamp is never below the journal's last (another thread's operation
    /// on this stream may have read the clock later and taken the lock
    /// first), so it stays within the operation.
    #[inline(always)]
    pub(crate) fn begin_op(&mut self, early: Option<u64>) {
        self.op = Some(early.map(|t| self.not_below_last(t)));
    }

    /// Each change from now on reads the clock.
    #[inline(always)]
    pub(crate) fn end_op(&mut self) {
        self.op = None;
    }

    /// Stamps `change` (already applied to `figures`) and keeps it.
    #[inline(always)]
    pub(crate) fn note(&mut self, change: Transition, figures: &mut Figures) {
        let stamp = match self.op {
            Some(Some(t)) => t,
            Some(None) => {
                let t = self.not_below_last(self.stamps.stamp());
                self.op = Some(Some(t));
                t
            }
            None => self.not_below_last(self.stamps.fresh()),
        };
        self.run.entries.push((stamp, change));
        if self.run.entries.len() - self.open >= CHUNK {
            self.close(figures);
        }
    }

    /// `stamp`, or the journal's last stamp where that is later (another
    /// thread's operation on this stream), which this thread's next stamps
    /// then stay above.
    #[inline(always)]
    fn not_below_last(&self, stamp: u64) -> u64 {
        let last = self.run.entries.last().map_or(0, |e| e.0);
        if stamp < last {
            stamp::saw(last);
        }
        stamp.max(last)
    }

    /// Ends the open chunk (`figures` hold its highest values).
    #[cold]
    #[inline(never)]
    fn close(&mut self, figures: &mut Figures) {
        let entries = &self.run.entries;
        let (Some(first), Some(last)) = (entries.get(self.open), entries.last()) else {
            return;
        };
        self.run.chunks.push(Chunk {
            first: first.0,
            last: last.0,
            end: entries.len(),
            top: figures.tops(),
            level: figures.levels(),
        });
        self.open = entries.len();
        figures.reset_peak();
    }

    /// The changes so far, as a run; the journal goes on from `figures`'
    /// values in `spare`'s buffers.
    pub(crate) fn take(&mut self, figures: &mut Figures, mut spare: Run) -> Run {
        self.close(figures);
        spare.start = figures.levels();
        self.open = 0;
        std::mem::replace(&mut self.run, spare)
    }

    /// Whether the stream should ask for a merge ([`Fill::Full`]), or wait
    /// for one ([`Fill::Overfull`]: other streams outpace the merges).
    pub(crate) fn fill(&self) -> Fill {
        match self.run.entries.len() {
            n if n >= OVERFULL * JOURNAL_LIMIT => Fill::Overfull,
            n if n >= JOURNAL_LIMIT => Fill::Full,
            _ => Fill::Room,
        }
    }
}
