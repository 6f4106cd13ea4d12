//! The cells of a reserved virtual range (its page-sized, page-aligned pieces):
//! which hold physical memory, how many live blocks touch each, and which
//! mapped cells no live block touches (the cached pages). A stream that must
//! re-map a cached page takes the next one after a rotating hand (a clock
//! sweep), so the hot path keeps no queue.
//!
//! Physical memory comes in **extents**: one handle of one or more pages,
//! mapped whole over as many consecutive cells (growth in bulk makes one
//! handle instead of one per page, and the driver's cost is per handle). The
//! driver maps a handle only whole, at its start, so an extent is unmapped,
//! re-mapped or released whole too, and only once no live block touches any
//! of its cells.
//!
//! Bookkeeping only: the caller makes the backend calls and reports them here.

use std::ops::Range;

use crate::backend::PageHandle;

/// See the module docs.
///
/// Parallel arrays over the known cells (the range's first cells up to the
/// highest one ever used): the page of each cell, a bitmap of the mapped ones
/// (so counting the unmapped cells of a span is a few popcounts), and its
/// users. A span's interior cells belong to its block alone, so they are not
/// counted one by one: a second bitmap marks them, and the counts hold the
/// blocks that start or end in a cell. Taking or dropping a block changes
/// its two end cells' counts and sets or clears a run of bits (a word or
/// two, without a loop per cell).
#[derive(Debug)]
pub(crate) struct Cells {
    base: u64,
    /// log2 of the cell size.
    shift: u32,
    pages: Vec<Option<PageHandle>>,
    /// At an extent's first cell, its length in cells; 0 elsewhere.
    heads: Vec<u32>,
    /// Live blocks that start or end in each cell.
    users: Vec<u32>,
    bits: Vec<u64>,
    /// Cells inside a live block (neither its first nor its last).
    inner: Vec<u64>,
    /// Where the next sweep for a cached page starts.
    hand: u32,
    /// Mapped cells.
    mapped: u64,
    /// Cells with at least one user.
    in_use: u64,
    /// Mapped cells without users.
    cached: u64,
    /// Maximal runs of contiguous mapped cells (the snapshot's segments).
    runs: u64,
}

impl Cells {
    /// The cells of a range starting at `base`, `granularity` bytes each (a
    /// power of two).
    pub(crate) fn new(base: u64, granularity: u64) -> Cells {
        debug_assert!(granularity.is_power_of_two());
        Cells {
            base,
            shift: granularity.trailing_zeros(),
            pages: Vec::new(),
            heads: Vec::new(),
            users: Vec::new(),
            bits: Vec::new(),
            inner: Vec::new(),
            hand: 0,
            mapped: 0,
            in_use: 0,
            cached: 0,
            runs: 0,
        }
    }

    /// The cell size in bytes.
    pub(crate) fn granularity(&self) -> u64 {
        1 << self.shift
    }

    /// The cells `[addr, addr + size)` touches.
    pub(crate) fn span(&self, addr: u64, size: u64) -> Range<u32> {
        let first = (addr - self.base) >> self.shift;
        let last = (addr + size.max(1) - 1 - self.base) >> self.shift;
        first as u32..last as u32 + 1
    }

    /// The address of a cell.
    pub(crate) fn addr(&self, cell: u32) -> u64 {
        self.base + (u64::from(cell) << self.shift)
    }

    /// The handle mapped over `cell`, if any (an extent's, at each of its
    /// cells).
    pub(crate) fn page(&self, cell: u32) -> Option<PageHandle> {
        self.pages.get(cell as usize).copied().flatten()
    }

    /// Makes the first `n` cells known.
    fn grow(&mut self, n: usize) {
        if n > self.pages.len() {
            self.pages.resize(n, None);
            self.heads.resize(n, 0);
            self.users.resize(n, 0);
            self.bits.resize(n.div_ceil(64), 0);
            self.inner.resize(n.div_ceil(64), 0);
        }
    }

    /// Whether `cell` holds a page.
    pub(crate) fn is_mapped(&self, cell: u32) -> bool {
        let i = cell as usize;
        self.bits
            .get(i / 64)
            .is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    /// Mapped cells among the known cells of `span`.
    fn mapped_count(&self, span: Range<u32>) -> u64 {
        let end = (span.end as usize).min(self.pages.len());
        word_masks(span.start as usize..end)
            .map(|(w, mask)| u64::from((self.bits[w] & mask).count_ones()))
            .sum()
    }

    /// Whether every cell under `[addr, addr + size)` holds a page.
    pub(crate) fn all_mapped(&self, addr: u64, size: u64) -> bool {
        let span = self.span(addr, size);
        if self.mapped == self.pages.len() as u64 {
            // No known cell lacks a page (a steady loop's usual state): only
            // cells past the known ones can.
            return span.end as usize <= self.pages.len();
        }
        if span.end - span.start == 1 {
            return self.is_mapped(span.start);
        }
        self.unmapped_in(span) == 0
    }

    /// Cells in `span` without a page.
    pub(crate) fn unmapped_in(&self, span: Range<u32>) -> u64 {
        if span.end - span.start == 1 {
            return u64::from(!self.is_mapped(span.start));
        }
        u64::from(span.end - span.start) - self.mapped_count(span)
    }

    /// The page-aligned start in `[lo, hi - size]` whose `size` bytes need the
    /// fewest new pages, with that count; the lowest such start on ties. Only
    /// starts whose window begins among the known cells are looked at.
    pub(crate) fn best_window(&self, lo: u64, hi: u64, size: u64) -> Option<(u64, u64)> {
        let g = self.granularity();
        let first = (lo - self.base).div_ceil(g);
        let last = hi.checked_sub(size)?.checked_sub(self.base)? / g;
        let last = last.min(self.pages.len() as u64);
        if first > last {
            return None;
        }
        let k = size.div_ceil(g);
        let unmapped = |s: u64| u64::from(!self.is_mapped(s as u32));
        let window = |s: u64| self.unmapped_in(s as u32..(s + k) as u32);
        let mut count = window(first);
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

    /// The lowest page-aligned start in `[lo, hi - size]` whose `size` bytes
    /// lie on mapped pages only: [`Cells::best_window`]'s answer when it is
    /// zero, found a word of the bitmap at a time.
    pub(crate) fn mapped_window(&self, lo: u64, hi: u64, size: u64) -> Option<u64> {
        let g = self.granularity();
        let first = (lo - self.base).div_ceil(g);
        let last = hi.checked_sub(size)?.checked_sub(self.base)? / g;
        let k = size.div_ceil(g);
        let end = (last + k).min(self.pages.len() as u64);
        let (mut s, mut run_start) = (first, first);
        while s < end && run_start <= last {
            let (w, bit) = ((s / 64) as usize, s % 64);
            let word = self.bits[w] >> bit;
            let avail = (64 - bit).min(end - s);
            let ones = u64::from((!word).trailing_zeros()).min(avail);
            s += ones;
            if s - run_start >= k {
                return Some(self.base + run_start * g);
            }
            if ones < avail {
                // `s` is unmapped: skip it and the unmapped cells after it.
                let zeros = u64::from((word >> ones).trailing_zeros()).min(avail - ones);
                s += zeros;
                run_start = s;
            }
        }
        None
    }

    /// The known cells: up to the highest one ever used.
    pub(crate) fn known(&self) -> u32 {
        self.pages.len() as u32
    }

    /// Whether no cell from `cell` on holds a page: `cell` lies past the last
    /// mapped one.
    pub(crate) fn none_mapped_from(&self, cell: u32) -> bool {
        let known = self.pages.len() as u32;
        cell >= known || self.mapped_count(cell..known) == 0
    }

    /// Adds a user to every cell of `span` (mapped or not).
    pub(crate) fn acquire(&mut self, span: Range<u32>) {
        self.grow(span.end as usize);
        self.change_users(span, true, false);
    }

    /// [`Cells::acquire`] for a span whose cells all hold pages (known, so
    /// the bitmap is not read).
    #[inline(always)]
    pub(crate) fn acquire_mapped(&mut self, span: Range<u32>) {
        debug_assert_eq!(self.unmapped_in(span.clone()), 0);
        self.change_users(span, true, true);
    }

    /// Removes a user from every cell of `span`.
    pub(crate) fn release(&mut self, span: Range<u32>) {
        self.change_users(span, false, false);
    }

    /// [`Cells::release`] for a span whose cells all hold pages (a live or
    /// kept block's: blocks lie on mapped pages).
    #[inline(always)]
    pub(crate) fn release_mapped(&mut self, span: Range<u32>) {
        debug_assert_eq!(self.unmapped_in(span.clone()), 0);
        self.change_users(span, false, true);
    }

    /// Adds (`add`) or removes one user on every cell of a block's `span`: the
    /// two end cells one by one; the cells between belong to the block alone,
    /// so they go from no user to one (or back) all at once. `mapped`: every
    /// cell of the span is known to hold a page.
    #[inline(always)]
    fn change_users(&mut self, span: Range<u32>, add: bool, mapped: bool) {
        let (first, last) = (span.start, span.end - 1);
        self.change_user(first, add, mapped);
        if last > first {
            self.change_user(last, add, mapped);
        }
        if last > first + 1 {
            let inner = first + 1..last;
            self.mark_inner(inner.clone(), add);
            let n = u64::from(inner.end - inner.start);
            let with_pages = if mapped { n } else { self.mapped_count(inner) };
            self.count_users(add, n, with_pages);
        }
    }

    /// Adds or removes one user of `cell` (`mapped`: known to hold a page).
    #[inline(always)]
    fn change_user(&mut self, cell: u32, add: bool, mapped: bool) {
        let users = &mut self.users[cell as usize];
        if add {
            *users += 1;
        } else {
            *users -= 1;
        }
        // The cell just gained its first user or lost its last.
        if *users == u32::from(add) {
            let with_page = u64::from(mapped || self.is_mapped(cell));
            self.count_users(add, 1, with_page);
        }
    }

    /// Sets (`on`) or clears the inner bits of `span`, which are all the
    /// other way and have no users.
    #[inline(always)]
    fn mark_inner(&mut self, span: Range<u32>, on: bool) {
        for (w, mask) in word_masks(span.start as usize..span.end as usize) {
            debug_assert_eq!(self.inner[w] & mask, if on { 0 } else { mask });
            if on {
                self.inner[w] |= mask;
            } else {
                self.inner[w] &= !mask;
            }
        }
    }

    /// Whether a live block touches `cell`.
    fn is_used(&self, cell: u32) -> bool {
        let i = cell as usize;
        self.users[i] > 0 || self.inner[i / 64] & (1 << (i % 64)) != 0
    }

    /// `n` cells, `mapped` of them with a page, gained their first user
    /// (`add`) or lost their last.
    #[inline(always)]
    fn count_users(&mut self, add: bool, n: u64, mapped: u64) {
        if add {
            self.in_use += n;
            self.cached -= mapped;
        } else {
            self.in_use -= n;
            self.cached += mapped;
        }
    }

    /// Records that `page`, `n` cells long, is now mapped from cell `first`.
    pub(crate) fn install(&mut self, first: u32, n: u32, page: PageHandle) {
        debug_assert!(n > 0);
        let end = first + n;
        self.grow(end as usize);
        debug_assert_eq!(
            self.unmapped_in(first..end),
            u64::from(n),
            "cell mapped twice"
        );
        let joins =
            u64::from(first > 0 && self.is_mapped(first - 1)) + u64::from(self.is_mapped(end));
        self.pages[first as usize..end as usize].fill(Some(page));
        self.heads[first as usize] = n;
        for (w, mask) in word_masks(first as usize..end as usize) {
            self.bits[w] |= mask;
        }
        self.mapped += u64::from(n);
        self.runs = self.runs + 1 - joins;
        self.cached += (first..end).filter(|c| !self.is_used(*c)).count() as u64;
    }

    /// The cells of the extent mapped over `cell`, if one is.
    pub(crate) fn extent(&self, cell: u32) -> Option<Range<u32>> {
        if !self.is_mapped(cell) {
            return None;
        }
        let head = (0..=cell).rev().find(|c| self.heads[*c as usize] > 0)?;
        Some(head..head + self.heads[head as usize])
    }

    /// Records that the extent starting at `head`, whose cells have no
    /// users, was unmapped; returns its handle and length in cells.
    pub(crate) fn uninstall(&mut self, head: u32) -> Option<(PageHandle, u32)> {
        let n = *self.heads.get(head as usize)?;
        let end = head + n;
        if n == 0 || (head..end).any(|c| self.is_used(c)) {
            return None;
        }
        let page = self.pages[head as usize]?;
        self.pages[head as usize..end as usize].fill(None);
        self.heads[head as usize] = 0;
        for (w, mask) in word_masks(head as usize..end as usize) {
            self.bits[w] &= !mask;
        }
        let joins =
            u64::from(head > 0 && self.is_mapped(head - 1)) + u64::from(self.is_mapped(end));
        self.mapped -= u64::from(n);
        self.cached -= u64::from(n);
        self.runs = self.runs + joins - 1;
        Some((page, n))
    }

    fn is_cached(&self, cell: u32) -> bool {
        self.is_mapped(cell) && !self.is_used(cell)
    }

    /// Whether an extent starts at `head` and no live block touches it.
    pub(crate) fn is_cached_extent(&self, head: u32) -> bool {
        let n = self.heads[head as usize];
        n > 0 && (head..head + n).all(|c| self.is_cached(c))
    }

    /// The first cell of the next extent of at least `min` pages without
    /// users after the hand, outside `keep`.
    pub(crate) fn coldest(&mut self, keep: &Range<u32>, min: u32) -> Option<u32> {
        // A full heap (the out-of-memory path) answers without a scan.
        if self.cached < u64::from(min.max(1)) {
            return None;
        }
        let n = self.pages.len() as u32;
        let outside = |h: u32| h + self.heads[h as usize] <= keep.start || keep.end <= h;
        let fits = |h: u32| self.heads[h as usize] >= min && self.is_cached_extent(h);
        let found = (0..n)
            .map(|i| (self.hand + i) % n)
            .find(|h| fits(*h) && outside(*h))?;
        self.hand = (found + 1) % n;
        Some(found)
    }

    /// The first cell of every extent without users, by address.
    pub(crate) fn cached_extents(&self) -> Vec<u32> {
        if self.cached == 0 {
            return Vec::new();
        }
        (0..self.pages.len() as u32)
            .filter(|h| self.is_cached_extent(*h))
            .collect()
    }

    /// Mapped cells.
    pub(crate) fn mapped(&self) -> u64 {
        self.mapped
    }

    /// Cells with users.
    pub(crate) fn in_use(&self) -> u64 {
        self.in_use
    }

    /// Mapped cells without users.
    pub(crate) fn cached(&self) -> u64 {
        self.cached
    }

    /// Runs of contiguous mapped cells.
    pub(crate) fn runs(&self) -> u64 {
        self.runs
    }

    /// Runs of contiguous mapped cells as (address, bytes), by address.
    pub(crate) fn mapped_runs(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for s in 0..self.pages.len() as u32 {
            if !self.is_mapped(s) {
                continue;
            }
            match out.last_mut() {
                Some((a, n)) if *a + *n == self.addr(s) => *n += self.granularity(),
                _ => out.push((self.addr(s), self.granularity())),
            }
        }
        out
    }

    /// Recounts everything from the cells and compares with the counters.
    pub(crate) fn check(&self, users_of: impl Fn(u32) -> u32) -> Result<(), String> {
        self.check_extents()?;
        let mut mapped = 0;
        let (mut in_use, mut cached) = (0, 0);
        for (i, (ends, page)) in self.users.iter().zip(&self.pages).enumerate() {
            let inside = self.inner[i / 64] & (1 << (i % 64)) != 0;
            if inside && *ends > 0 {
                return Err(format!("cell {i} is inside a block and ends {ends} others"));
            }
            let (users, expect) = (ends + u32::from(inside), users_of(i as u32));
            if users != expect {
                return Err(format!("cell {i} has {users} users, blocks say {expect}"));
            }
            if page.is_some() != self.is_mapped(i as u32) {
                return Err(format!("cell {i}: page and mapped bit disagree"));
            }
            if users > 0 && page.is_none() {
                return Err(format!("cell {i} is used but not mapped"));
            }
            mapped += u64::from(page.is_some());
            in_use += u64::from(users > 0);
            cached += u64::from(users == 0 && page.is_some());
        }
        let runs = self.mapped_runs().len() as u64;
        let got = (self.mapped, self.in_use, self.cached, self.runs);
        if got != (mapped, in_use, cached, runs) {
            return Err(format!(
                "cell counters {got:?} != recount {:?}",
                (mapped, in_use, cached, runs)
            ));
        }
        Ok(())
    }
}

impl Cells {
    /// Each mapped cell lies in exactly one extent, whose cells all hold its
    /// handle; only an extent's first cell records a length.
    fn check_extents(&self) -> Result<(), String> {
        let (mut left, mut handle) = (0u32, None);
        for (i, (page, n)) in self.pages.iter().zip(&self.heads).enumerate() {
            if *n > 0 {
                if left > 0 || page.is_none() {
                    return Err(format!(
                        "cell {i} starts an extent of {n} where none can start"
                    ));
                }
                (left, handle) = (*n, *page);
            }
            if left == 0 {
                if page.is_some() {
                    return Err(format!("mapped cell {i} lies in no extent"));
                }
                continue;
            }
            if *page != handle {
                return Err(format!("cell {i} holds another handle than its extent's"));
            }
            left -= 1;
        }
        match left {
            0 => Ok(()),
            _ => Err(format!("an extent runs {left} cells past the known ones")),
        }
    }
}

/// The bitmap words a run of bits spans: each word's index and the mask of
/// the run's bits in it.
#[inline(always)]
fn word_masks(bits: Range<usize>) -> impl Iterator<Item = (usize, u64)> {
    let (mut i, end) = (bits.start, bits.end);
    std::iter::from_fn(move || {
        (i < end).then(|| {
            let (w, bit) = (i / 64, i % 64);
            let take = (64 - bit).min(end - i);
            i += take;
            (w, u64::MAX >> (64 - take) << bit)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::XorShift;

    const G: u64 = 2 << 20;

    #[test]
    fn counts_users_pages_and_runs() {
        let mut s = Cells::new(1 << 40, G);
        let span = s.span((1 << 40) + G - 512, 1024);
        assert_eq!(span, 0..2);
        assert_eq!(s.unmapped_in(span.clone()), 2);
        s.acquire(span.clone());
        s.install(0, 1, PageHandle(1));
        s.install(1, 1, PageHandle(2));
        assert_eq!((s.mapped(), s.in_use(), s.cached(), s.runs()), (2, 2, 0, 1));
        assert_eq!(s.coldest(&(0..0), 1), None, "all in use");
        s.release(span.clone());
        assert_eq!((s.cached(), s.in_use()), (2, 0));
        assert_eq!(s.coldest(&(0..1), 1), Some(1), "cell 0 is kept");
        assert_eq!(s.uninstall(1), Some((PageHandle(2), 1)));
        assert_eq!((s.mapped(), s.cached(), s.runs()), (1, 1, 1));
        assert_eq!(s.mapped_runs(), vec![(1 << 40, G)]);
        s.check(|_| 0).unwrap();
        assert!(s.check(|_| 1).is_err());
    }

    #[test]
    fn a_block_over_many_cells_marks_its_inside() {
        let base = 1 << 40;
        let mut s = Cells::new(base, G);
        for cell in 0..70 {
            s.install(cell, 1, PageHandle(u64::from(cell) + 1));
        }
        // A block from the middle of cell 1 to the middle of cell 68, and a
        // small one sharing cell 68 with it.
        let big = s.span(base + G + 4096, 67 * G);
        let small = s.span(base + 68 * G + G / 2 + 4096, 4096);
        assert_eq!((big.clone(), small.clone()), (1..69, 68..69));
        s.acquire_mapped(big.clone());
        s.acquire_mapped(small.clone());
        assert_eq!((s.in_use(), s.cached()), (68, 2));
        let users = |cell: u32| u32::from(big.contains(&cell)) + u32::from(small.contains(&cell));
        s.check(users).unwrap();
        assert_eq!(s.cached_extents(), vec![0, 69]);
        assert_eq!(s.uninstall(30), None, "cell 30 is inside the block");
        s.release_mapped(big.clone());
        assert_eq!((s.in_use(), s.cached()), (1, 69));
        s.check(|cell| u32::from(small.contains(&cell))).unwrap();
        assert_eq!(s.uninstall(30), Some((PageHandle(31), 1)));
    }

    /// `mapped_window` is `best_window` when that finds a window on mapped
    /// pages, on a seeded random bitmap.
    #[test]
    fn mapped_window_agrees_with_best_window() {
        let mut s = Cells::new(0, G);
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        for cell in 0..300u32 {
            let x = rng.draw();
            if !x.is_multiple_of(5) {
                s.install(cell, 1, PageHandle(u64::from(cell) + 1));
            }
        }
        for _ in 0..2000 {
            let x = rng.draw();
            let lo = (x % 280) * G + (x >> 40) % 3 * 512;
            let size = ((x >> 20) % 12 + 1) * G - (x >> 50) % 2 * 4096;
            let hi = lo + size + (x >> 30) % 90 * G;
            let want = s
                .best_window(lo, hi, size)
                .filter(|(_, n)| *n == 0)
                .map(|(at, _)| at);
            assert_eq!(
                s.mapped_window(lo, hi, size),
                want,
                "lo {lo} hi {hi} size {size}"
            );
        }
    }

    #[test]
    fn all_mapped_agrees_with_the_bitmap_with_and_without_holes() {
        let mut s = Cells::new(0, G);
        for cell in 0..40u32 {
            s.install(cell, 1, PageHandle(u64::from(cell) + 1));
        }
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        for round in 0..2 {
            for _ in 0..500 {
                let x = rng.draw();
                let (addr, size) = ((x % 45) * G + (x >> 40) % 4 * 512, (x >> 8) % (6 * G) + 1);
                let span = s.span(addr, size);
                let bitmap = span.end as usize <= 40 && s.unmapped_in(span) == 0;
                assert_eq!(
                    s.all_mapped(addr, size),
                    bitmap,
                    "round {round}, {addr:#x}+{size:#x}"
                );
            }
            s.uninstall(17);
        }
    }

    #[test]
    fn runs_split_and_join() {
        let mut s = Cells::new(0, G);
        for (i, p) in [0u32, 2, 1].iter().zip(1..) {
            s.install(*i, 1, PageHandle(p));
        }
        assert_eq!(s.runs(), 1);
        s.uninstall(1);
        assert_eq!(s.runs(), 2);
        assert_eq!(s.cached_extents(), vec![0, 2]);
        s.check(|_| 0).unwrap();
    }

    #[test]
    fn the_frontier_lies_past_the_last_mapped_cell() {
        let mut cells = Cells::new(1 << 40, 2 << 20);
        assert!(cells.none_mapped_from(0));
        cells.install(3, 2, PageHandle(1));
        cells.acquire(7..8);
        assert!(!cells.none_mapped_from(0) && !cells.none_mapped_from(4));
        // Cell 7 is known (a block touches it) but holds no page.
        assert!(cells.none_mapped_from(5) && cells.none_mapped_from(7));
        assert!(cells.none_mapped_from(100));
    }

    #[test]
    fn an_extent_goes_whole_once_no_block_touches_it() {
        let mut s = Cells::new(0, G);
        s.install(2, 4, PageHandle(7));
        s.install(6, 1, PageHandle(8));
        assert_eq!((s.mapped(), s.runs(), s.cached()), (5, 1, 5));
        assert_eq!(s.extent(4), Some(2..6));
        assert_eq!(s.extent(6), Some(6..7));
        assert_eq!(s.extent(1), None);
        let block = s.span(5 * G, G);
        s.acquire_mapped(block.clone());
        assert_eq!(s.cached_extents(), vec![6], "cell 5 holds the extent");
        assert_eq!(s.uninstall(2), None);
        assert_eq!(s.uninstall(3), None, "not an extent's first cell");
        assert_eq!(s.coldest(&(0..0), 1), Some(6));
        assert_eq!(s.coldest(&(6..7), 1), None, "the other extent is in use");
        s.check(|c| u32::from(block.contains(&c))).unwrap();
        s.release_mapped(block);
        assert_eq!(s.coldest(&(6..7), 1), Some(2));
        assert_eq!(
            s.coldest(&(0..0), 2),
            Some(2),
            "cell 6's extent is one page"
        );
        assert_eq!(s.coldest(&(0..0), 5), None, "no extent of five pages");
        assert_eq!(s.uninstall(2), Some((PageHandle(7), 4)));
        assert_eq!((s.mapped(), s.runs(), s.cached()), (1, 1, 1));
        s.check(|_| 0).unwrap();
        s.heads[6] = 2;
        assert!(s.check(|_| 0).is_err(), "an extent past the known cells");
    }
}
