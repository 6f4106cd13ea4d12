//! The iteration order of PyTorch's stream hash tables, modelled.
//!
//! PyTorch keeps a block's `record_stream` streams in a `ska::flat_hash_set`
//! and the events of freed blocks in a `ska::flat_hash_map` keyed by stream;
//! it records events, and reclaims blocks, in those tables' iteration order.
//! That order is not insertion order: it is slot order in an open-addressing
//! table with Fibonacci hashing, linear Robin Hood probing into a few overflow
//! slots past the end, backward-shift erasure, and growth that doubles the
//! slots (never shrinking). So it depends on each stream's hash and on the
//! table's history. [`HashOrder`] replays that history over the hashes alone
//! (`docs/pytorch-event-order.md` has the facts).
//!
//! Invariants: every key is in exactly one slot, at or after its home slot by
//! its recorded distance; no probe is longer than the table's lookup limit.

/// `2^64 / φ`, the multiplier of Fibonacci hashing.
const FIBONACCI: u64 = 11_400_714_819_323_198_485;
/// The shortest lookup limit a table has.
const MIN_LOOKUPS: i8 = 4;

/// See the module docs. Keys are the tables' hashes (a stream's packed id).
#[derive(Clone, Debug, Default)]
pub(crate) struct HashOrder {
    /// `(key, distance from its home slot)`; `buckets + lookups - 1` slots.
    slots: Vec<Option<(u64, i8)>>,
    buckets: usize,
    lookups: i8,
    len: usize,
}

impl HashOrder {
    /// The keys in iteration order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = u64> + '_ {
        self.slots.iter().flatten().map(|(k, _)| *k)
    }

    /// Whether `key` is held.
    pub(crate) fn contains(&self, key: u64) -> bool {
        self.iter().any(|k| k == key)
    }

    fn home(&self, key: u64) -> usize {
        let shift = 64 - self.buckets.trailing_zeros();
        (key.wrapping_mul(FIBONACCI) >> shift) as usize
    }

    /// Inserts `key` (nothing when held).
    pub(crate) fn insert(&mut self, key: u64) {
        if self.contains(key) {
            return;
        }
        loop {
            if self.buckets == 0 || (self.len + 1) * 2 > self.buckets {
                self.grow();
                continue;
            }
            if self.place(key) {
                self.len += 1;
                return;
            }
            self.grow();
        }
    }

    /// Robin Hood placement; false (and the table unchanged) when a probe
    /// would pass the lookup limit, which makes the table grow.
    fn place(&mut self, key: u64) -> bool {
        self.robin_hood(key, false) && self.robin_hood(key, true)
    }

    /// Walks `key`'s Robin Hood placement, writing it when `write`: whether
    /// it ends in an empty slot within the lookup limit. The walk only moves
    /// forward and writes only slots behind it, so a walk that writes reads
    /// what one that does not read.
    fn robin_hood(&mut self, key: u64, write: bool) -> bool {
        let (mut at, mut moving, mut dist) = (self.home(key), key, 0i8);
        loop {
            if dist == self.lookups || at >= self.slots.len() {
                return false;
            }
            match self.slots[at] {
                None => {
                    if write {
                        self.slots[at] = Some((moving, dist));
                    }
                    return true;
                }
                Some((k, d)) if d < dist => {
                    if write {
                        self.slots[at] = Some((moving, dist));
                    }
                    (moving, dist) = (k, d);
                }
                Some(_) => {}
            }
            at += 1;
            dist += 1;
        }
    }

    /// Doubles the buckets (4 at first) and re-inserts every key in slot order.
    fn grow(&mut self) {
        let buckets = (2 * self.buckets).max(4);
        let old = std::mem::take(&mut self.slots);
        self.buckets = buckets;
        self.lookups = MIN_LOOKUPS.max(buckets.trailing_zeros() as i8);
        self.slots = vec![None; buckets + self.lookups as usize - 1];
        self.len = 0;
        for (k, _) in old.into_iter().flatten() {
            self.insert(k);
        }
    }

    /// Removes `key`, shifting the keys after it back toward their homes.
    pub(crate) fn erase(&mut self, key: u64) {
        let Some(mut at) = self
            .slots
            .iter()
            .position(|s| s.is_some_and(|(k, _)| k == key))
        else {
            return;
        };
        self.slots[at] = None;
        self.len -= 1;
        while let Some(Some((k, d))) = self.slots.get(at + 1).copied() {
            if d == 0 {
                break;
            }
            self.slots[at] = Some((k, d - 1));
            self.slots[at + 1] = None;
            at += 1;
        }
    }

    /// Removes every key; the table keeps its size.
    pub(crate) fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.len = 0;
    }

    /// `keys` in the order a fresh table holding them (inserted in this order)
    /// iterates them.
    pub(crate) fn order_of(keys: impl IntoIterator<Item = u64>) -> Vec<u64> {
        let mut t = HashOrder::default();
        keys.into_iter().for_each(|k| t.insert(k));
        t.iter().collect()
    }

    /// Checks the invariants (see the module docs).
    pub(crate) fn check(&self) -> Result<(), String> {
        let held: Vec<(usize, u64, i8)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.map(|(k, d)| (i, k, d)))
            .collect();
        if held.len() != self.len {
            return Err(format!("{} keys held, {} counted", held.len(), self.len));
        }
        for (i, k, d) in held {
            if d < 0 || d >= self.lookups || self.home(k) + d as usize != i {
                return Err(format!("key {k:#x} at slot {i} with distance {d}"));
            }
        }
        Ok(())
    }
}

/// The hash PyTorch's tables give a CUDA stream of c10 id `id` on `device`:
/// the stream packed with its device and device type (CUDA, 1).
pub fn c10_stream_hash(device: u64, id: u64) -> u64 {
    (1 << 56) | (device << 48) | (id & ((1 << 48) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(id: u64) -> u64 {
        c10_stream_hash(0, id)
    }

    #[test]
    fn the_documented_example() {
        // docs/pytorch-event-order.md: the default stream and the first two
        // torch.cuda.Stream()s (ids 0, 3, 35); with 8 slots the walk visits the
        // default stream, then 35, then 3; with 4 slots 35 before 3.
        assert_eq!(HashOrder::order_of([s(3), s(35)]), vec![s(35), s(3)]);
        let three = HashOrder::order_of([s(0), s(3), s(35)]);
        assert_eq!(three, vec![s(0), s(35), s(3)]);
    }

    #[test]
    fn erasure_and_growth_keep_the_invariants_and_the_size() {
        let mut t = HashOrder::default();
        let ids: Vec<u64> = (0..40).map(|i| s(32 * i + 3)).collect();
        for (n, k) in ids.iter().enumerate() {
            t.insert(*k);
            t.check().unwrap();
            assert_eq!(t.iter().count(), n + 1);
        }
        for k in ids.iter().step_by(3) {
            t.erase(*k);
            t.check().unwrap();
            assert!(!t.contains(*k));
        }
        let slots = t.slots.len();
        t.clear();
        assert_eq!(t.iter().count(), 0);
        assert_eq!(t.slots.len(), slots, "a table never shrinks");
        t.insert(s(3));
        t.check().unwrap();
    }
}
