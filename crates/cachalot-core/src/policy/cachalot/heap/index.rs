//! The free index of a heap: free blocks in best-fit order (smallest size
//! first, ties by lowest address), with O(1) size-class lookup.
//!
//! Sizes fall into classes: one per 512-byte multiple below 32 KiB, then 8
//! classes per power of two (sizes in a class differ by under 12.5%), 456
//! classes in all so their vectors' headers stay in the L1 cache. A class
//! keeps its blocks in a short vector sorted by (size, address) from the
//! largest, so its best fit is usually the last one (a pop); a bitmap of
//! non-empty classes (one word per 64 classes, one summary word over the
//! words) finds the next class with a block in a few instructions. Iterating
//! from a size visits exactly the order a sorted map by (size, address) would,
//! so placement decisions do not depend on this structure.

use super::block::BlockId;

/// Sizes below `EXACT << UNIT_SHIFT` bytes have a class each.
const EXACT: u64 = 64;
/// log2 of the size unit (512 bytes).
const UNIT_SHIFT: u32 = 9;
/// log2 of the classes per power of two above the exact ones.
const SUB_BITS: u32 = 3;
/// Octaves above the exact classes: enough for any `u64` size.
const OCTAVES: u64 = 64 - UNIT_SHIFT as u64 - EXACT.trailing_zeros() as u64;
/// Number of classes.
const CLASSES: usize = (EXACT + (OCTAVES << SUB_BITS)) as usize;
/// Words of the class bitmap; the summary word has a bit per word.
const WORDS: usize = CLASSES.div_ceil(64);
const _: () = assert!(WORDS <= 64, "the summary is one word");

/// A free block in the index.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    /// Its size.
    pub(crate) size: u64,
    /// Its address.
    pub(crate) addr: u64,
    /// Its id in the heap.
    pub(crate) id: BlockId,
}

impl Entry {
    fn key(&self) -> (u64, u64) {
        (self.size, self.addr)
    }
}

/// The class of a size: non-decreasing in the size.
fn class(size: u64) -> usize {
    let units = size >> UNIT_SHIFT;
    if units < EXACT {
        return units as usize;
    }
    let octave = u64::from(units.ilog2()) - u64::from(EXACT.trailing_zeros());
    let sub = (units >> (units.ilog2() - SUB_BITS)) & ((1 << SUB_BITS) - 1);
    (EXACT + (octave << SUB_BITS) + sub) as usize
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct FreeIndex {
    /// One sorted vector per class (empty until the first insert).
    classes: Vec<Vec<Entry>>,
    words: [u64; WORDS],
    summary: u64,
    len: usize,
}

impl Default for FreeIndex {
    fn default() -> Self {
        FreeIndex {
            classes: Vec::new(),
            words: [0; WORDS],
            summary: 0,
            len: 0,
        }
    }
}

impl FreeIndex {
    /// Number of blocks indexed.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Adds a free block.
    #[inline(always)]
    pub(crate) fn insert(&mut self, entry: Entry) {
        let c = class(entry.size);
        let Some(list) = self.classes.get_mut(c) else {
            return self.insert_first(entry);
        };
        // Blocks mostly go in at the end (the smallest of their class) or
        // into an empty class: a push, without a call to shift the rest.
        match list.last() {
            Some(last) if last.key() < entry.key() => insert_sorted(list, entry),
            _ => list.push(entry),
        }
        self.words[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
        self.len += 1;
    }

    /// [`FreeIndex::insert`] into an index that has no classes yet.
    #[cold]
    #[inline(never)]
    fn insert_first(&mut self, entry: Entry) {
        self.classes.resize_with(CLASSES, Vec::new);
        self.insert(entry);
    }

    /// Removes the block of this size at this address; whether it was there.
    #[inline(always)]
    pub(crate) fn remove(&mut self, size: u64, addr: u64) -> bool {
        let c = class(size);
        let Some(list) = self.classes.get_mut(c) else {
            return false;
        };
        match list.last() {
            Some(e) if e.key() == (size, addr) => {
                list.pop();
            }
            _ => {
                if !remove_sorted(list, (size, addr)) {
                    return false;
                }
            }
        }
        if list.is_empty() {
            self.words[c / 64] &= !(1 << (c % 64));
            if self.words[c / 64] == 0 {
                self.summary &= !(1 << (c / 64));
            }
        }
        self.len -= 1;
        true
    }

    /// The entry of the block of this size at this address, if indexed.
    pub(crate) fn get(&self, size: u64, addr: u64) -> Option<Entry> {
        let list = self.classes.get(class(size))?;
        let at = list.binary_search_by(|e| (size, addr).cmp(&e.key())).ok()?;
        Some(list[at])
    }

    /// The first non-empty class at or after `c`.
    fn next_class(&self, c: usize) -> Option<usize> {
        let w = c / 64;
        if w >= WORDS {
            return None;
        }
        let here = self.words[w] & (u64::MAX << (c % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let later = self.summary & u64::MAX.checked_shl(w as u32 + 1).unwrap_or(0);
        if later == 0 {
            return None;
        }
        let w = later.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }

    /// The best fit for `size` bytes: the first of [`FreeIndex::fits`],
    /// without the iterator (placement's common case).
    pub(crate) fn best(&self, size: u64) -> Option<Entry> {
        let first = class(size);
        let c = self.next_class(first)?;
        let list = &self.classes[c];
        if c != first {
            return list.last().copied();
        }
        // The class's smallest block mostly fits: its last.
        match list.last() {
            Some(e) if e.size >= size => Some(*e),
            _ => match list.partition_point(|e| e.size >= size) {
                0 => self
                    .next_class(c + 1)
                    .and_then(|c| self.classes[c].last().copied()),
                n => Some(list[n - 1]),
            },
        }
    }

    /// Free blocks of at least `size` bytes in best-fit order.
    pub(crate) fn fits(&self, size: u64) -> Fits<'_> {
        let first = class(size);
        let class = self.next_class(first);
        let left = match class {
            // Blocks of the first class that fit come first in its vector.
            Some(c) if c == first => self.classes[c].partition_point(|e| e.size >= size),
            Some(c) => self.classes[c].len(),
            None => 0,
        };
        Fits {
            index: self,
            class,
            left,
        }
    }
}

/// Inserts `entry` inside a class's vector, in its sorted place (the rare
/// case: not the class's smallest).
#[cold]
#[inline(never)]
fn insert_sorted(list: &mut Vec<Entry>, entry: Entry) {
    let at = list.partition_point(|e| e.key() > entry.key());
    list.insert(at, entry);
}

/// Removes the entry with this key from inside a class's vector; whether it
/// was there (the rare case: not the class's smallest).
#[cold]
#[inline(never)]
fn remove_sorted(list: &mut Vec<Entry>, key: (u64, u64)) -> bool {
    match list.binary_search_by(|e| key.cmp(&e.key())) {
        Ok(at) => {
            list.remove(at);
            true
        }
        Err(_) => false,
    }
}

/// Iterator of [`FreeIndex::fits`]: walks each class's vector from its end.
pub(crate) struct Fits<'a> {
    index: &'a FreeIndex,
    class: Option<usize>,
    /// Entries of the current class still to visit (from the end).
    left: usize,
}

impl Iterator for Fits<'_> {
    type Item = Entry;

    fn next(&mut self) -> Option<Entry> {
        loop {
            let c = self.class?;
            if self.left > 0 {
                self.left -= 1;
                return Some(self.index.classes[c][self.left]);
            }
            self.class = self.index.next_class(c + 1);
            self.left = self.class.map_or(0, |c| self.index.classes[c].len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::XorShift;
    use std::collections::BTreeMap;

    #[test]
    fn classes_grow_with_size_and_cover_u64() {
        let mut last = 0;
        let mut size = 512;
        while size < u64::MAX / 3 {
            let c = class(size);
            assert!(c < CLASSES);
            assert!(c >= last, "class of {size} went down");
            last = c;
            size = size / 8 * 9 / 512 * 512 + 512;
        }
        assert!(class(u64::MAX) < CLASSES);
        assert_eq!(class(512 * (EXACT - 1)), EXACT as usize - 1);
        assert_eq!(class(512 * EXACT), EXACT as usize);
        assert_eq!(class(512 * EXACT * 2), EXACT as usize + (1 << SUB_BITS));
    }

    /// The index against a sorted map, on a seeded mix of sizes.
    #[test]
    fn fits_in_the_order_of_a_sorted_map() {
        let mut index = FreeIndex::default();
        let mut model = BTreeMap::new();
        let mut rng = XorShift(0x9e37_79b9);
        let mut next = || rng.draw();
        for i in 0..4000u32 {
            let size = match next() % 3 {
                0 => (next() % 64 + 1) * 512,
                1 => (next() % (1 << 20) + 1) * 512,
                _ => (next() % (1 << 30) + 1) * 512,
            };
            let addr = (next() % (1 << 40)) & !511;
            if next() % 4 == 0 && !model.is_empty() {
                let (&(s, a), _) = model.iter().nth(next() as usize % model.len()).unwrap();
                model.remove(&(s, a));
                assert!(index.remove(s, a));
                assert!(!index.remove(s, a), "removed twice");
            } else if model.insert((size, addr), i).is_none() {
                index.insert(Entry { size, addr, id: i });
            }
            assert_eq!(index.len(), model.len());
            if i % 97 == 0 {
                let want = (next() % (1 << 21) + 1) * 512;
                let got: Vec<_> = index.fits(want).map(|e| (e.size, e.addr, e.id)).collect();
                let expect: Vec<_> = model
                    .range((want, 0)..)
                    .map(|(k, v)| (k.0, k.1, *v))
                    .collect();
                assert_eq!(got, expect, "fits({want})");
                assert_eq!(index.best(want), index.fits(want).next(), "best({want})");
            }
        }
        let (&(s, a), &id) = model.iter().next().unwrap();
        assert_eq!(
            index.get(s, a),
            Some(Entry {
                size: s,
                addr: a,
                id
            })
        );
        assert_eq!(index.get(s, a + 512), None);
    }

    #[test]
    fn empty_index_fits_nothing() {
        let index = FreeIndex::default();
        assert_eq!(index.fits(512).next(), None);
        assert_eq!(index.get(512, 0), None);
    }
}
