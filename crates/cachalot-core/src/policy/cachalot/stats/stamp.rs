//! The stamps that order the streams' journaled changes across threads.
//!
//! A stamp must never put two changes out of the order in which they could
//! be seen to happen: a change that happens after another (on the same
//! thread, or after any synchronization between threads, which the
//! allocator never sees) must get a larger stamp. The machine's clock, read
//! once every earlier instruction is done ([`read_clock`]), gives that: the
//! later change reads a later time. But that read costs 10 to 25 ns, a third
//! of an operation, and most programs that have several streams allocate
//! from one thread at a time (a PyTorch program's Python thread, then its
//! autograd thread in the backward pass).
//!
//! So a thread may **own** a device's stamps. An owner reads the clock once
//! and then *chains*: each of its next stamps is its last one plus one, up
//! to [`CHAIN`] of them, with no clock read and no write to shared memory
//! (a read of the device's owner word, which stays in every reader's cache
//! while nobody takes it over). A thread that finds another owner **takes
//! over**: it writes its own token into the owner word with a locked
//! instruction, then reads the clock, then checks that it still owns the
//! word (the check is ordered after the clock read); if another thread took
//! over meanwhile it tries again. An owner also takes over afresh when its
//! chain is used up.
//!
//! Why that keeps the order (changes X on thread B before Y on thread A,
//! linked by B's and A's synchronization):
//! - *A chained stamp is never ahead of the clock.* It is at most [`CHAIN`]
//!   over a clock read of the same thread made at least that many operations
//!   before, and an operation takes many ticks of a clock that ticks at
//!   least once a nanosecond (chains are off on a slower clock, and with a
//!   clock driven by hand).
//! - *Y read the clock:* after the synchronization, so after X's stamp, which
//!   is a clock read or behind one.
//! - *Y chained:* A owned the word when Y read it. X's thread B wrote its
//!   token there earlier, or read it there, before X; the synchronization
//!   makes Y's read see B's write or a later one, so A took over after it,
//!   and after B's read that saw B (a read that sees an older value was made
//!   before the newer one could be seen). A's takeover read the clock after
//!   its write, and its check (after that read) still found A: any takeover
//!   by another thread between B's stamp and A's write would have shown. So
//!   A's clock read, which Y's stamp is at least, came after X's stamp: X's
//!   own clock read came before A's write landed (or B's later check would
//!   have failed), and X's chained stamp is behind a read of the word made
//!   before A's write landed.
//!
//! Threads that keep taking a device from each other (several allocating
//! at once, each on its own stream) would pass the owner word's cache line
//! around at every operation. A thread that loses a device within [`QUICK`]
//! stamps of taking it, [`QUICK_LOSSES`] times in a row over the device's
//! threads, marks the device **contended**, for good: from then on every
//! stamp is a clock read, as before chains existed, with no write to shared
//! memory. Nobody takes a contended device over, so no chain can start after
//! it, and a stale chain of a thread that has not yet seen the mark stays
//! behind the clock reads of everyone who has.

use std::cell::Cell;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// No thread owns the device's stamps (yet).
const NOBODY: u64 = 0;

/// The device is contended: every stamp is a clock read.
const CONTENDED: u64 = u64::MAX;

/// A thread's token before its first takeover: never an owner word's value.
const UNSET: u64 = u64::MAX - 1;

/// Stamps a thread chains after a clock read before it reads the clock
/// again.
pub(crate) const CHAIN: u32 = 128;

/// Stamps since a thread took a device over within which losing it to
/// another thread is a quick loss.
pub(crate) const QUICK: u32 = 16;

/// Quick losses in a row (over all the device's threads) that mark it
/// contended.
pub(crate) const QUICK_LOSSES: u32 = 8;

/// Reads `clock` for a stamp once every earlier instruction of this thread
/// has completed.
///
/// Reading the time-stamp counter is not a load: the processor may do it
/// ahead of earlier instructions, a load still in flight included. A thread
/// that learned of another thread's change through such a load (the
/// caller's own synchronization) could then stamp its next change with a
/// time before that change's stamp, and the merge would put them in the
/// wrong order: a peak that never was. `lfence` (`isb` on ARM) holds the
/// read back until those instructions are done. The operating system's
/// monotonic clock, `quanta`'s fallback, orders its own read.
#[inline(always)]
fn read_clock(clock: &quanta::Clock) -> u64 {
    wait_for_earlier();
    clock.raw()
}

/// Holds back later instructions until the earlier ones are done.
#[inline(always)]
fn wait_for_earlier() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lfence` needs SSE2, which every x86_64 processor has; it only
    // waits for the instructions before it and changes no state.
    unsafe {
        core::arch::x86_64::_mm_lfence();
    }
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `isb` only waits for the instructions before it; it reads and
    // writes nothing (left as a compiler barrier too, so the clock's read is
    // not moved above it).
    unsafe {
        core::arch::asm!("isb", options(nostack, preserves_flags));
    }
}

/// Holds back later instructions until this thread's stores can be seen by
/// every other thread (a takeover's write must land before its clock read).
/// On x86_64 a locked instruction's store is seen once it completes, which
/// the fence before the clock read waits for.
#[inline(always)]
fn wait_for_stores() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dsb ish` only waits for this thread's memory accesses to
    // complete; it reads and writes nothing.
    unsafe {
        core::arch::asm!("dsb ish", options(nostack, preserves_flags));
    }
}

/// What a thread knows of its own stamps (over every device), a cell per
/// field: each is read and written on its own (a copy of the whole would
/// read back fields just written narrower, and stall).
struct Mine {
    /// Its token (`UNSET` until its first takeover).
    token: Cell<u64>,
    /// Its last stamp.
    last: Cell<u64>,
    /// Stamps chained since its last clock read.
    chain: Cell<u32>,
    /// Stamps since it last took a device over from another thread
    /// (saturating).
    held: Cell<u32>,
}

thread_local! {
    static MINE: Mine = const {
        Mine {
            token: Cell::new(UNSET),
            last: Cell::new(0),
            chain: Cell::new(0),
            held: Cell::new(u32::MAX),
        }
    };
}

/// The next thread's token.
static TOKENS: AtomicU64 = AtomicU64::new(1);

/// A stamp made outside [`Stamper::stamp`] but by this thread: its next
/// chained stamps stay above it.
#[inline(always)]
pub(crate) fn saw(stamp: u64) {
    MINE.with(|m| m.last.set(m.last.get().max(stamp)));
}

/// A device's stamps: its clock, and who owns them (module docs).
#[derive(Debug)]
pub(crate) struct Stamper {
    clock: quanta::Clock,
    /// `NOBODY`, `CONTENDED`, or the owner's token.
    owner: AtomicU64,
    /// Quick losses in a row.
    quick: AtomicU32,
    /// Whether threads may chain (a clock that ticks at least once a
    /// nanosecond, not driven by hand).
    chains: bool,
}

impl Stamper {
    /// Stamps from `clock`; chained ones only where it ticks at least once a
    /// nanosecond.
    pub(crate) fn new(clock: quanta::Clock) -> Stamper {
        let chains = clock.delta_as_nanos(0, 1 << 20) <= 1 << 20;
        Stamper::with_chains(clock, chains)
    }

    /// Stamps from `clock`, chained or not.
    pub(crate) fn with_chains(clock: quanta::Clock, chains: bool) -> Stamper {
        Stamper {
            clock,
            owner: AtomicU64::new(NOBODY),
            quick: AtomicU32::new(0),
            chains,
        }
    }

    /// Whether the device is contended (every stamp a clock read).
    #[cfg(test)]
    fn contended(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == CONTENDED
    }

    /// A stamp for an operation of this thread (module docs).
    #[inline(always)]
    pub(crate) fn stamp(&self) -> u64 {
        let owner = self.owner.load(Ordering::Relaxed);
        if owner == CONTENDED || !self.chains {
            return read_clock(&self.clock);
        }
        MINE.with(|m| {
            let chain = m.chain.get();
            let stamp = if owner == m.token.get() && chain < CHAIN {
                m.chain.set(chain + 1);
                m.last.get() + 1
            } else {
                self.take_over(m, owner)
            };
            m.last.set(stamp);
            m.held.set(m.held.get().saturating_add(1));
            stamp
        })
    }

    /// A stamp that reads the clock, for a change made outside an operation
    /// (several may follow each other within a tick: none is chained).
    pub(crate) fn fresh(&self) -> u64 {
        let owner = self.owner.load(Ordering::Relaxed);
        if owner == CONTENDED || !self.chains {
            return read_clock(&self.clock);
        }
        MINE.with(|m| {
            let stamp = self.take_over(m, owner);
            m.last.set(stamp);
            stamp
        })
    }

    /// Makes this thread the owner and reads the clock (module docs), or,
    /// once the device is contended, only reads the clock; `seen` is the
    /// owner word as last read.
    #[inline(never)]
    fn take_over(&self, mine: &Mine, mut seen: u64) -> u64 {
        if mine.token.get() == UNSET {
            mine.token.set(TOKENS.fetch_add(1, Ordering::Relaxed));
        }
        let token = mine.token.get();
        let from_other = seen != token;
        if from_other && seen != NOBODY {
            self.lost(mine.held.get());
        }
        loop {
            if seen == CONTENDED {
                return read_clock(&self.clock).max(mine.last.get() + 1);
            }
            match self
                .owner
                .compare_exchange(seen, token, Ordering::SeqCst, Ordering::Relaxed)
            {
                Err(now) => seen = now,
                Ok(_) => {
                    wait_for_stores();
                    let t = read_clock(&self.clock);
                    wait_for_earlier();
                    seen = self.owner.load(Ordering::Relaxed);
                    if seen == token {
                        mine.chain.set(0);
                        if from_other {
                            mine.held.set(0);
                        }
                        return t.max(mine.last.get() + 1);
                    }
                    self.lost(0);
                }
            }
        }
    }

    /// Counts a loss of the device to another thread `held` stamps after
    /// taking it: quick ones in a row mark the device contended, a slow one
    /// starts the count again.
    fn lost(&self, held: u32) {
        if held >= QUICK {
            if self.quick.load(Ordering::Relaxed) != 0 {
                self.quick.store(0, Ordering::Relaxed);
            }
            return;
        }
        if self.quick.fetch_add(1, Ordering::Relaxed) + 1 >= QUICK_LOSSES {
            self.owner.swap(CONTENDED, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// A stamper on the real clock, as the allocator makes it.
    fn real() -> Arc<Stamper> {
        Arc::new(Stamper::new(quanta::Clock::new()))
    }

    #[test]
    fn one_thread_chains_between_clock_reads_and_never_goes_back() {
        let s = real();
        let stamps: Vec<u64> = (0..10 * CHAIN as usize).map(|_| s.stamp()).collect();
        assert!(stamps.windows(2).all(|w| w[0] < w[1]), "{stamps:?}");
        if s.chains {
            let chained = stamps.windows(2).filter(|w| w[1] == w[0] + 1).count();
            assert!(chained >= 9 * CHAIN as usize, "{chained} chained stamps");
        }
        assert!(!s.contended());
        // Behind the clock.
        assert!(*stamps.last().unwrap() <= read_clock(&s.clock));
    }

    /// Tests that drive the clock by hand turn chains off: each stamp is the
    /// clock's time.
    #[test]
    fn without_chains_every_stamp_reads_the_clock() {
        let (clock, mock) = quanta::Clock::mock();
        let s = Stamper::with_chains(clock, false);
        mock.increment(5);
        assert_eq!((s.stamp(), s.stamp(), s.fresh()), (5, 5, 5));
        mock.increment(1);
        assert_eq!(s.stamp(), 6);
    }

    /// Two threads hand a turn back and forth through one atomic (release
    /// and acquire, nothing the allocator sees), each chaining a few stamps
    /// per turn: every stamp after a handover is above every stamp before
    /// it. Long turns keep the device uncontended; turns of one stamp mark
    /// it contended, and the order still holds.
    #[test]
    fn stamps_follow_handovers_between_threads() {
        for (per_turn, contended) in [(40, false), (1, true)] {
            let s = real();
            let turn = Arc::new(AtomicU64::new(0));
            let last = Arc::new(AtomicU64::new(0));
            let bad = Arc::new(AtomicBool::new(false));
            let handles: Vec<_> = (0..2u64)
                .map(|me| {
                    let (s, turn, last, bad) = (s.clone(), turn.clone(), last.clone(), bad.clone());
                    std::thread::spawn(move || {
                        for round in 0..300u64 {
                            let mine = 2 * round + me;
                            while turn.load(Ordering::Acquire) != mine {
                                std::hint::spin_loop();
                            }
                            let before = last.load(Ordering::Relaxed);
                            let mut prev = 0;
                            for _ in 0..per_turn {
                                let t = s.stamp();
                                if t <= before || t <= prev {
                                    bad.store(true, Ordering::Relaxed);
                                }
                                prev = t;
                            }
                            last.store(prev, Ordering::Relaxed);
                            turn.store(mine + 1, Ordering::Release);
                        }
                    })
                })
                .collect();
            handles.into_iter().for_each(|h| h.join().unwrap());
            assert!(
                !bad.load(Ordering::Relaxed),
                "a stamp went back across a handover"
            );
            if s.chains {
                assert_eq!(s.contended(), contended, "{per_turn} stamps a turn");
            }
        }
    }

    #[test]
    fn a_contended_device_stays_contended() {
        let s = real();
        s.owner.store(CONTENDED, Ordering::Relaxed);
        let a = s.stamp();
        let b = s.stamp();
        assert!(a < b && s.contended());
    }
}
