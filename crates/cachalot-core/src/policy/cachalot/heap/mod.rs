//! The block heap of one pool of one stream: blocks tiling its regions (one
//! reserved virtual range, or a list of device segments), with a best-fit index
//! of the free blocks and an address index of the others.
//!
//! Pure placement: the heap never calls the backend and knows nothing of pages.
//! Blocks live in a vector addressed by id (freed entries are reused) and link
//! to their neighbours in the same region, so a free finds its free neighbours
//! at once; each merge costs an index removal (a size class found by a bitmap,
//! then a search of its short vector). The vector is plain, not the pytorch
//! policy's arena, whose check of the entry at every access cost this policy
//! 7 to 8% per operation on three of the four bundled traces
//! (`benches/policies.rs`).

use std::collections::BTreeMap;

mod block;
mod index;
mod live;
pub(crate) mod reuse;

pub(crate) use block::{Block, BlockId, State};
use index::{Entry, FreeIndex};
use live::LiveIndex;

/// A range of addresses the heap places blocks in.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Region {
    /// Base address.
    pub(crate) base: u64,
    /// Size in bytes.
    pub(crate) size: u64,
    first: BlockId,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Heap {
    blocks: Vec<Block>,
    spare: Vec<BlockId>,
    free: FreeIndex,
    live: LiveIndex,
    regions: BTreeMap<u64, Region>,
    split_free: (u64, u64),
    /// Whether `split_free` goes uncounted (see [`Heap::skip_split_counts`]).
    skips_splits: bool,
}

impl Heap {
    /// Indexes live blocks in a table (see `live`): every live block will be
    /// at least `1 << shift` bytes and at or above `base`. Before any block.
    pub(crate) fn index_live_directly(&mut self, base: u64, shift: u32) {
        debug_assert_eq!(self.live.len(), 0);
        self.live = LiveIndex::direct(base, shift);
    }

    /// Stops counting free split blocks (a range's heap: its statistics count
    /// mapped pages, not split blocks), which spares the hot path a branch and
    /// two writes per free-index change; [`Heap::split_free`] is then (0, 0).
    /// While the heap has no region (before any block, or once a stream's
    /// entry is reused after its regions went back).
    pub(crate) fn skip_split_counts(&mut self) {
        debug_assert!(self.regions.is_empty() && self.split_free == (0, 0));
        self.skips_splits = true;
    }

    /// Adds a region, all of it one free block.
    pub(crate) fn add_region(&mut self, base: u64, size: u64) {
        let id = self.new_block(Block {
            addr: base,
            size,
            requested: 0,
            state: State::Free,
            prev: None,
            next: None,
        });
        self.insert_free(id);
        self.regions.insert(
            base,
            Region {
                base,
                size,
                first: id,
            },
        );
    }

    /// Removes the region at `base` if it holds nothing but one free block;
    /// returns its size.
    pub(crate) fn remove_region(&mut self, base: u64) -> Option<u64> {
        let region = *self.regions.get(&base)?;
        let b = &self.blocks[region.first as usize];
        if b.state != State::Free || b.size != region.size {
            return None;
        }
        self.remove_free(region.first);
        self.spare.push(region.first);
        self.regions.remove(&base);
        Some(region.size)
    }

    /// The regions (base, size) that hold nothing but one free block.
    pub(crate) fn idle_regions(&self) -> Vec<(u64, u64)> {
        let idle = |r: &&Region| {
            let b = &self.blocks[r.first as usize];
            b.state == State::Free && b.size == r.size
        };
        self.regions
            .values()
            .filter(idle)
            .map(|r| (r.base, r.size))
            .collect()
    }

    /// Every region, by address.
    pub(crate) fn regions(&self) -> impl Iterator<Item = &Region> {
        self.regions.values()
    }

    /// The blocks of a region, by address.
    pub(crate) fn blocks_of(&self, region: &Region) -> impl Iterator<Item = (BlockId, &Block)> {
        let mut cursor = Some(region.first);
        std::iter::from_fn(move || {
            let id = cursor?;
            let b = &self.blocks[id as usize];
            cursor = b.next;
            Some((id, b))
        })
    }

    /// Free blocks of at least `size` bytes, smallest first (ties by address).
    pub(crate) fn fits(&self, size: u64) -> impl Iterator<Item = (BlockId, &Block)> {
        self.free
            .fits(size)
            .map(|e| (e.id, &self.blocks[e.id as usize]))
    }

    /// The best fit for `size` bytes: the first of [`Heap::fits`].
    pub(crate) fn best_fit(&self, size: u64) -> Option<(BlockId, &Block)> {
        self.free
            .best(size)
            .map(|e| (e.id, &self.blocks[e.id as usize]))
    }

    /// The block with this id.
    pub(crate) fn block(&self, id: BlockId) -> &Block {
        &self.blocks[id as usize]
    }

    /// The allocated, pending or kept block starting at `addr`.
    pub(crate) fn live(&self, addr: u64) -> Option<BlockId> {
        self.live.get(addr)
    }

    /// Number of blocks in the address index (allocated, pending, kept).
    pub(crate) fn live_count(&self) -> usize {
        self.live.len()
    }

    /// Number of free blocks.
    pub(crate) fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Count and bytes of free blocks that share their region with other
    /// blocks ((0, 0) once [`Heap::skip_split_counts`] was called).
    pub(crate) fn split_free(&self) -> (u64, u64) {
        self.split_free
    }

    /// Whether the free index holds exactly this block.
    pub(crate) fn indexed(&self, id: BlockId) -> bool {
        let b = &self.blocks[id as usize];
        self.free.get(b.size, b.addr).is_some_and(|e| e.id == id)
    }

    /// Allocates `[at, at + size)` out of free block `id`, which must contain it;
    /// the rest of `id` stays free. Returns the allocated block.
    pub(crate) fn carve(&mut self, id: BlockId, at: u64, size: u64, requested: u64) -> BlockId {
        self.remove_free(id);
        let (start, end) = (
            self.blocks[id as usize].addr,
            self.blocks[id as usize].end(),
        );
        debug_assert!(start <= at && at + size <= end, "carve outside its block");
        if at > start {
            let left = self.split_off_front(id, at - start);
            self.insert_free(left);
        }
        if at + size < end {
            let right = self.split_off_back(id, size);
            self.insert_free(right);
        }
        let b = &mut self.blocks[id as usize];
        b.state = State::Allocated;
        b.requested = requested;
        self.live.insert(at, id);
        id
    }

    /// Takes the block at `addr` out of the address index (a free's one
    /// lookup when the block will be merged); [`Heap::release`] or
    /// [`Heap::restore_live`] follows.
    pub(crate) fn take_live(&mut self, addr: u64) -> Option<BlockId> {
        self.live.remove(addr)
    }

    /// Puts a block taken by [`Heap::take_live`] back in the address index.
    pub(crate) fn restore_live(&mut self, id: BlockId) {
        self.live.insert(self.blocks[id as usize].addr, id);
    }

    /// Marks an allocated block as waiting for streams.
    pub(crate) fn set_pending(&mut self, id: BlockId) {
        self.blocks[id as usize].state = State::PendingFree;
    }

    /// Keeps a freed block (still in the address index, so a second free of
    /// it is caught) out of the free index, for reuse at its exact size.
    pub(crate) fn keep(&mut self, id: BlockId) {
        let b = &mut self.blocks[id as usize];
        b.state = State::Kept;
        b.requested = 0;
    }

    /// Hands a kept block out again.
    pub(crate) fn reuse(&mut self, id: BlockId, requested: u64) {
        let b = &mut self.blocks[id as usize];
        b.state = State::Allocated;
        b.requested = requested;
    }

    /// Frees a block taken by [`Heap::take_live`] and merges it with free
    /// neighbours; returns the id of the resulting free block.
    pub(crate) fn release(&mut self, id: BlockId) -> BlockId {
        let b = &mut self.blocks[id as usize];
        debug_assert!(self.live.get(b.addr).is_none(), "release of a live block");
        b.state = State::Free;
        b.requested = 0;
        let mut id = id;
        if let Some(next) = self.blocks[id as usize]
            .next
            .filter(|n| self.blocks[*n as usize].state == State::Free)
        {
            self.remove_free(next);
            self.absorb_next(id);
        }
        if let Some(prev) = self.blocks[id as usize]
            .prev
            .filter(|p| self.blocks[*p as usize].state == State::Free)
        {
            self.remove_free(prev);
            self.absorb_next(prev);
            id = prev;
        }
        self.insert_free(id);
        id
    }

    fn new_block(&mut self, block: Block) -> BlockId {
        if let Some(id) = self.spare.pop() {
            self.blocks[id as usize] = block;
            return id;
        }
        self.blocks.push(block);
        BlockId::try_from(self.blocks.len() - 1).expect("fewer than 2^32 blocks per heap")
    }

    /// Splits `bytes` off the front of `id` into a new block, returned.
    fn split_off_front(&mut self, id: BlockId, bytes: u64) -> BlockId {
        let b = self.blocks[id as usize].clone();
        let front = Block {
            addr: b.addr,
            size: bytes,
            requested: 0,
            state: State::Free,
            prev: b.prev,
            next: Some(id),
        };
        let front = self.new_block(front);
        if let Some(p) = b.prev {
            self.blocks[p as usize].next = Some(front);
        } else {
            self.regions
                .get_mut(&b.addr)
                .expect("a first block starts its region")
                .first = front;
        }
        let b = &mut self.blocks[id as usize];
        b.prev = Some(front);
        b.addr += bytes;
        b.size -= bytes;
        front
    }

    /// Keeps the first `keep` bytes in `id`; the rest becomes a new block, returned.
    fn split_off_back(&mut self, id: BlockId, keep: u64) -> BlockId {
        let b = self.blocks[id as usize].clone();
        let back = Block {
            addr: b.addr + keep,
            size: b.size - keep,
            requested: 0,
            state: State::Free,
            prev: Some(id),
            next: b.next,
        };
        let back = self.new_block(back);
        if let Some(n) = b.next {
            self.blocks[n as usize].prev = Some(back);
        }
        let b = &mut self.blocks[id as usize];
        b.next = Some(back);
        b.size = keep;
        back
    }

    /// Merges `id`'s next block into `id`.
    fn absorb_next(&mut self, id: BlockId) {
        let Some(next) = self.blocks[id as usize].next else {
            return;
        };
        let n = self.blocks[next as usize].clone();
        if let Some(after) = n.next {
            self.blocks[after as usize].prev = Some(id);
        }
        let b = &mut self.blocks[id as usize];
        b.size += n.size;
        b.next = n.next;
        self.spare.push(next);
    }

    fn insert_free(&mut self, id: BlockId) {
        let b = &self.blocks[id as usize];
        if !self.skips_splits && b.is_split() {
            self.split_free.0 += 1;
            self.split_free.1 += b.size;
        }
        self.free.insert(Entry {
            size: b.size,
            addr: b.addr,
            id,
        });
    }

    fn remove_free(&mut self, id: BlockId) {
        let b = &self.blocks[id as usize];
        if !self.skips_splits && b.is_split() {
            self.split_free.0 -= 1;
            self.split_free.1 -= b.size;
        }
        self.free.remove(b.size, b.addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiles(h: &Heap) -> bool {
        h.regions().all(|r| {
            let mut at = r.base;
            for (_, b) in h.blocks_of(r) {
                if b.addr != at {
                    return false;
                }
                at = b.end();
            }
            at == r.base + r.size
        })
    }

    #[test]
    fn a_range_heap_skips_split_counts_and_places_alike() {
        let (mut counted, mut skipping) = (Heap::default(), Heap::default());
        skipping.skip_split_counts();
        for h in [&mut counted, &mut skipping] {
            h.add_region(0x1000_0000, 1 << 20);
            let (id, _) = h.fits(4096).next().unwrap();
            h.carve(id, 0x1000_0000 + 8192, 4096, 4000);
        }
        assert_eq!(counted.split_free(), (2, (1 << 20) - 4096));
        assert_eq!(skipping.split_free(), (0, 0));
        let fits = |h: &Heap| h.fits(1).map(|(_, b)| (b.addr, b.size)).collect::<Vec<_>>();
        assert_eq!(fits(&counted), fits(&skipping));
    }

    #[test]
    fn carve_splits_and_release_merges() {
        let mut h = Heap::default();
        h.add_region(0x1000_0000, 1 << 20);
        let (id, _) = h.fits(4096).next().unwrap();
        let a = h.carve(id, 0x1000_0000 + 8192, 4096, 4000);
        assert!(tiles(&h));
        assert_eq!(h.free_count(), 2);
        assert_eq!(h.split_free(), (2, (1 << 20) - 4096));
        assert_eq!(h.live(0x1000_2000), Some(a));
        assert_eq!(h.block(a).requested, 4000);
        assert_eq!(h.take_live(0x1000_2000), Some(a));
        let merged = h.release(a);
        assert_eq!(h.free_count(), 1);
        assert_eq!(h.block(merged).size, 1 << 20);
        assert_eq!(h.split_free(), (0, 0));
        assert!(tiles(&h));
        assert_eq!(h.remove_region(0x1000_0000), Some(1 << 20));
        assert_eq!(h.regions().count(), 0);
    }

    #[test]
    fn best_fit_takes_the_smallest_fitting_block() {
        let mut h = Heap::default();
        h.add_region(0, 1 << 20);
        h.add_region(1 << 30, 64 << 10);
        let (id, b) = h.fits(4096).next().unwrap();
        assert_eq!(b.addr, 1 << 30);
        let x = h.carve(id, 1 << 30, 4096, 1);
        assert_eq!(h.remove_region(1 << 30), None, "region in use");
        assert_eq!(h.idle_regions(), vec![(0, 1 << 20)]);
        assert_eq!(h.take_live(1 << 30), Some(x));
        h.restore_live(x);
        h.set_pending(x);
        assert_eq!(h.block(x).state, State::PendingFree);
        assert_eq!(h.take_live(1 << 30), Some(x));
        h.release(x);
        assert_eq!(h.idle_regions(), vec![(0, 1 << 20), (1 << 30, 64 << 10)]);
        assert!(h.indexed(h.fits(64 << 10).next().unwrap().0));
    }
}
