//! The page slots of a reserved virtual range: which 2 MiB slots have a physical
//! page mapped, how many live blocks touch each, and which mapped slots no live
//! block touches (the cached pages). A stream that must re-map a cached page
//! takes the next one after a rotating hand (a clock sweep), so the hot path
//! keeps no queue.
//!
//! Bookkeeping only: the caller makes the backend calls and reports them here.

use std::ops::Range;

use crate::backend::PageHandle;

#[derive(Copy, Clone, Debug, Default)]
struct Slot {
    page: Option<PageHandle>,
    users: u32,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Slots {
    base: u64,
    granularity: u64,
    slots: Vec<Slot>,
    /// Where the next sweep for a cached page starts.
    hand: u32,
    /// Mapped slots.
    mapped: u64,
    /// Slots with at least one user.
    in_use: u64,
    /// Mapped slots without users.
    cached: u64,
    /// Maximal runs of contiguous mapped slots (the snapshot's segments).
    runs: u64,
}

impl Slots {
    /// The slots of a range starting at `base`, `granularity` bytes each.
    pub(crate) fn new(base: u64, granularity: u64) -> Slots {
        Slots {
            base,
            granularity,
            slots: Vec::new(),
            hand: 0,
            mapped: 0,
            in_use: 0,
            cached: 0,
            runs: 0,
        }
    }

    /// The slot size in bytes.
    pub(crate) fn granularity(&self) -> u64 {
        self.granularity
    }

    /// The slots `[addr, addr + size)` touches.
    pub(crate) fn span(&self, addr: u64, size: u64) -> Range<u32> {
        let first = (addr - self.base) / self.granularity;
        let last = (addr + size.max(1) - 1 - self.base) / self.granularity;
        first as u32..last as u32 + 1
    }

    /// The address of a slot.
    pub(crate) fn addr(&self, slot: u32) -> u64 {
        self.base + u64::from(slot) * self.granularity
    }

    fn get(&self, slot: u32) -> Slot {
        self.slots.get(slot as usize).copied().unwrap_or_default()
    }

    fn get_mut(&mut self, slot: u32) -> &mut Slot {
        let i = slot as usize;
        if i >= self.slots.len() {
            self.slots.resize(i + 1, Slot::default());
        }
        &mut self.slots[i]
    }

    /// Whether `slot` holds a page.
    pub(crate) fn is_mapped(&self, slot: u32) -> bool {
        self.get(slot).page.is_some()
    }

    /// Slots in `span` without a page.
    pub(crate) fn unmapped_in(&self, span: Range<u32>) -> u64 {
        let (start, end) = (span.start as usize, span.end as usize);
        let known = &self.slots[start.min(self.slots.len())..end.min(self.slots.len())];
        let beyond = end.saturating_sub(self.slots.len().max(start));
        (known.iter().filter(|s| s.page.is_none()).count() + beyond) as u64
    }

    /// The page-aligned start in `[lo, hi - size]` whose `size` bytes need the
    /// fewest new pages, with that count; the lowest such start on ties. Only
    /// starts whose window begins among the known slots are looked at.
    pub(crate) fn best_window(&self, lo: u64, hi: u64, size: u64) -> Option<(u64, u64)> {
        let g = self.granularity;
        let first = (lo - self.base).div_ceil(g);
        let last = hi.checked_sub(size)?.checked_sub(self.base)? / g;
        let last = last.min(self.slots.len() as u64);
        if first > last {
            return None;
        }
        let k = size.div_ceil(g);
        let unmapped = |s: u64| u64::from(self.get(s as u32).page.is_none());
        let mut count: u64 = (first..first + k).map(unmapped).sum();
        let mut best = (first, count);
        for s in first + 1..=last {
            count = count + unmapped(s + k - 1) - unmapped(s - 1);
            if count < best.1 {
                best = (s, count);
                if count == 0 {
                    break;
                }
            }
        }
        Some((self.base + best.0 * g, best.1))
    }

    /// Adds a user to every slot of `span` (mapped or not).
    pub(crate) fn acquire(&mut self, span: Range<u32>) {
        if span.end as usize > self.slots.len() {
            self.slots.resize(span.end as usize, Slot::default());
        }
        for slot in &mut self.slots[span.start as usize..span.end as usize] {
            slot.users += 1;
            if slot.users == 1 {
                let mapped = slot.page.is_some();
                self.in_use += 1;
                self.cached -= u64::from(mapped);
            }
        }
    }

    /// Removes a user from every slot of `span`.
    pub(crate) fn release(&mut self, span: Range<u32>) {
        for slot in &mut self.slots[span.start as usize..span.end as usize] {
            slot.users -= 1;
            if slot.users == 0 {
                let mapped = slot.page.is_some();
                self.in_use -= 1;
                self.cached += u64::from(mapped);
            }
        }
    }

    /// Records that `page` is now mapped at `slot`.
    pub(crate) fn install(&mut self, slot: u32, page: PageHandle) {
        let joins =
            u64::from(slot > 0 && self.is_mapped(slot - 1)) + u64::from(self.is_mapped(slot + 1));
        let s = self.get_mut(slot);
        debug_assert!(s.page.is_none(), "slot mapped twice");
        s.page = Some(page);
        let idle = s.users == 0;
        self.mapped += 1;
        self.runs = self.runs + 1 - joins;
        self.cached += u64::from(idle);
    }

    /// Records that the page at an unused `slot` was unmapped; returns it.
    pub(crate) fn uninstall(&mut self, slot: u32) -> Option<PageHandle> {
        let s = self.get_mut(slot);
        if s.users > 0 {
            return None;
        }
        let page = s.page.take()?;
        let joins =
            u64::from(slot > 0 && self.is_mapped(slot - 1)) + u64::from(self.is_mapped(slot + 1));
        self.mapped -= 1;
        self.cached -= 1;
        self.runs = self.runs + joins - 1;
        Some(page)
    }

    /// The next mapped slot without users after the hand, outside `keep`.
    pub(crate) fn coldest(&mut self, keep: &Range<u32>) -> Option<u32> {
        let n = self.slots.len() as u32;
        let found = (0..n).map(|i| (self.hand + i) % n).find(|s| {
            let slot = self.slots[*s as usize];
            slot.page.is_some() && slot.users == 0 && !keep.contains(s)
        })?;
        self.hand = (found + 1) % n;
        Some(found)
    }

    /// Every mapped slot without users, by address.
    pub(crate) fn cached_slots(&self) -> Vec<u32> {
        (0..self.slots.len() as u32)
            .filter(|s| self.is_mapped(*s) && self.get(*s).users == 0)
            .collect()
    }

    /// Mapped slots.
    pub(crate) fn mapped(&self) -> u64 {
        self.mapped
    }

    /// Slots with users.
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Mapped slots without users.
    pub(crate) fn cached(&self) -> u64 {
        self.cached
    }

    /// Runs of contiguous mapped slots.
    pub(crate) fn runs(&self) -> u64 {
        self.runs
    }

    /// Runs of contiguous mapped slots as (address, bytes), by address.
    pub(crate) fn mapped_runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for s in 0..self.slots.len() as u32 {
            if !self.is_mapped(s) {
                continue;
            }
            match out.last_mut() {
                Some((a, n)) if *a + *n == self.addr(s) => *n += self.granularity,
                _ => out.push((self.addr(s), self.granularity)),
            }
        }
        out
    }

    /// Recounts everything from the slots and compares with the counters.
    pub(crate) fn check(&self, users_of: impl Fn(u32) -> u32) -> Result<(), String> {
        let mut mapped = 0;
        let (mut in_use, mut cached) = (0, 0);
        for (i, s) in self.slots.iter().enumerate() {
            let expect = users_of(i as u32);
            if s.users != expect {
                return Err(format!(
                    "slot {i} has {} users, blocks say {expect}",
                    s.users
                ));
            }
            if s.users > 0 && s.page.is_none() {
                return Err(format!("slot {i} is used but not mapped"));
            }
            mapped += u64::from(s.page.is_some());
            in_use += u64::from(s.users > 0);
            cached += u64::from(s.users == 0 && s.page.is_some());
        }
        let runs = self.mapped_runs().len() as u64;
        let got = (self.mapped, self.in_use, self.cached, self.runs);
        if got != (mapped, in_use, cached, runs) {
            return Err(format!(
                "slot counters {got:?} != recount {:?}",
                (mapped, in_use, cached, runs)
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    #[test]
    fn counts_users_pages_and_runs() {
        let mut s = Slots::new(1 << 40, G);
        let span = s.span((1 << 40) + G - 512, 1024);
        assert_eq!(span, 0..2);
        assert_eq!(s.unmapped_in(span.clone()), 2);
        s.acquire(span.clone());
        s.install(0, PageHandle(1));
        s.install(1, PageHandle(2));
        assert_eq!((s.mapped(), s.in_use(), s.cached(), s.runs()), (2, 2, 0, 1));
        assert_eq!(s.coldest(&(0..0)), None, "all in use");
        s.release(span.clone());
        assert_eq!((s.cached(), s.in_use()), (2, 0));
        assert_eq!(s.coldest(&(0..1)), Some(1), "slot 0 is kept");
        assert_eq!(s.uninstall(1), Some(PageHandle(2)));
        assert_eq!((s.mapped(), s.cached(), s.runs()), (1, 1, 1));
        assert_eq!(s.mapped_runs(), vec![(1 << 40, G)]);
        s.check(|_| 0).unwrap();
        assert!(s.check(|_| 1).is_err());
    }

    #[test]
    fn runs_split_and_join() {
        let mut s = Slots::new(0, G);
        for (i, p) in [0u32, 2, 1].iter().zip(1..) {
            s.install(*i, PageHandle(p));
        }
        assert_eq!(s.runs(), 1);
        s.uninstall(1);
        assert_eq!(s.runs(), 2);
        assert_eq!(s.cached_slots(), vec![0, 2]);
        s.check(|_| 0).unwrap();
    }
}
