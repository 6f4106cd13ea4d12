//! The address index of a heap's live blocks (allocated, pending, kept): a
//! hash map, or, where every live block is at least `1 << shift` bytes (the
//! large pool over a reserved range), a table with one entry per `1 << shift`
//! bytes of the range, since no two live blocks can start in the same one.
//! The table costs a shift and a compare where the map hashes and probes.

use super::block::BlockId;
use crate::addr_map::AddrMap;

/// See the module docs.
#[derive(Debug)]
pub(crate) enum LiveIndex {
    /// Any block sizes.
    Hashed(AddrMap<BlockId>),
    /// Blocks of at least `1 << shift` bytes in a range.
    Direct(Table),
}

/// The table form of [`LiveIndex`].
#[derive(Debug)]
pub(crate) struct Table {
    /// The range's base address.
    base: u64,
    /// log2 of the smallest live block.
    shift: u32,
    /// The block starting in each `1 << shift` bytes, grown to the highest
    /// one used: see [`Table::pack`] (8 bytes an entry, so twice as many
    /// share a cache line as with an address and an id).
    starts: Vec<u64>,
    /// Entries set.
    len: usize,
}

impl Default for LiveIndex {
    fn default() -> Self {
        LiveIndex::Hashed(AddrMap::default())
    }
}

impl LiveIndex {
    /// A table for blocks of at least `1 << shift` bytes at or above `base`.
    pub(crate) fn direct(base: u64, shift: u32) -> LiveIndex {
        LiveIndex::Direct(Table {
            base,
            shift,
            starts: Vec::new(),
            len: 0,
        })
    }

    /// The block starting at `addr`.
    pub(crate) fn get(&self, addr: u64) -> Option<BlockId> {
        match self {
            LiveIndex::Hashed(map) => map.get(&addr).copied(),
            LiveIndex::Direct(t) => t.get(addr),
        }
    }

    /// Indexes block `id` at `addr` (no block is indexed there).
    #[inline(always)]
    pub(crate) fn insert(&mut self, addr: u64, id: BlockId) {
        match self {
            LiveIndex::Hashed(map) => {
                map.insert(addr, id);
            }
            LiveIndex::Direct(t) => t.insert(addr, id),
        }
    }

    /// Takes the block starting at `addr` out of the index.
    pub(crate) fn remove(&mut self, addr: u64) -> Option<BlockId> {
        match self {
            LiveIndex::Hashed(map) => map.remove(&addr),
            LiveIndex::Direct(t) => t.remove(addr),
        }
    }

    /// Number of blocks indexed.
    pub(crate) fn len(&self) -> usize {
        match self {
            LiveIndex::Hashed(map) => map.len(),
            LiveIndex::Direct(t) => t.len,
        }
    }
}

impl Table {
    /// The entry `addr` falls in, if at or above the base.
    fn entry(&self, addr: u64) -> Option<usize> {
        usize::try_from(addr.checked_sub(self.base)? >> self.shift).ok()
    }

    /// An entry: the block's id above its offset in its `1 << shift` bytes
    /// plus one (so 0 is an empty entry; the offset is under `2^32`).
    fn pack(&self, addr: u64, id: BlockId) -> u64 {
        let offset = (addr - self.base) & ((1 << self.shift) - 1);
        (u64::from(id) << 32) | (offset + 1)
    }

    /// The entry holding the block that starts at `addr`, and the block (an
    /// empty entry never matches: a packed entry is never 0).
    fn find(&self, addr: u64) -> Option<(usize, BlockId)> {
        let i = self.entry(addr)?;
        let packed = *self.starts.get(i)?;
        let id = (packed >> 32) as BlockId;
        (packed == self.pack(addr, id)).then_some((i, id))
    }

    /// The block starting at `addr`.
    fn get(&self, addr: u64) -> Option<BlockId> {
        self.find(addr).map(|(_, id)| id)
    }

    #[inline(always)]
    fn insert(&mut self, addr: u64, id: BlockId) {
        let i = self.entry(addr).expect("a live block lies in the range");
        if i >= self.starts.len() {
            self.grow(i + 1);
        }
        debug_assert_eq!(self.starts[i], 0, "two live blocks start at {addr:#x}");
        self.starts[i] = self.pack(addr, id);
        self.len += 1;
    }

    /// Makes room for `n` entries (out of the hot path's way).
    #[cold]
    #[inline(never)]
    fn grow(&mut self, n: usize) {
        self.starts.resize(n, 0);
    }

    fn remove(&mut self, addr: u64) -> Option<BlockId> {
        let (i, id) = self.find(addr)?;
        self.starts[i] = 0;
        self.len -= 1;
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_find_only_exact_starts() {
        let base = 1 << 40;
        for mut live in [LiveIndex::default(), LiveIndex::direct(base, 20)] {
            live.insert(base + (3 << 20) + 512, 7);
            live.insert(base, 8);
            assert_eq!(live.get(base + (3 << 20) + 512), Some(7));
            assert_eq!(
                live.get(base + (3 << 20)),
                None,
                "same granule, other address"
            );
            assert_eq!(live.get(base - 512), None);
            assert_eq!(live.get(base + (99 << 20)), None);
            assert_eq!(live.len(), 2);
            assert_eq!(live.remove(base + (3 << 20)), None);
            assert_eq!(live.remove(base + (3 << 20) + 512), Some(7));
            assert_eq!((live.remove(base + (3 << 20) + 512), live.len()), (None, 1));
        }
    }
}
