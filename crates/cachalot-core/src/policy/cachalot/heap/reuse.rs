//! The small pool's exact-size reuse lists: freed small blocks kept unmerged,
//! by size, and handed out again to the next request of exactly that size.
//!
//! Small requests (1 MiB or less) are a third to a half of a training step's
//! allocations, and a step asks for the same small sizes again and again. A
//! hit costs a hash lookup and a pop instead of a best-fit search, a split and
//! a merge. The lists hold the small pool's pages in use, so they are emptied
//! (the blocks merged back into the heap) whenever a page would otherwise be
//! mapped, and on `empty_cache` and out-of-memory flushes; the small pool is
//! a few percent of a workload's memory, so what they keep is small.

use super::block::BlockId;

/// log2 of the size step (blocks are 512-byte multiples).
const STEP_SHIFT: u32 = 9;

/// The blocks of one size.
#[derive(Debug, Default)]
struct List {
    ids: Vec<BlockId>,
    /// Whether the size is in `Reuse::sizes`.
    listed: bool,
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Reuse {
    /// Blocks by exact size (one list per 512-byte multiple, grown to the
    /// largest size kept), most recently freed last. Emptied lists stay, so a
    /// steady loop allocates nothing here.
    lists: Vec<List>,
    /// The sizes whose lists may be non-empty (what a drain visits).
    sizes: Vec<u64>,
    count: usize,
}

fn list_index(size: u64) -> usize {
    (size >> STEP_SHIFT) as usize
}

impl Reuse {
    /// Keeps block `id` of `size` bytes (a 512-byte multiple of the small
    /// pool, so the lists stay a few thousand).
    pub(crate) fn push(&mut self, size: u64, id: BlockId) {
        let i = list_index(size);
        if i >= self.lists.len() {
            self.lists.resize_with(i + 1, List::default);
        }
        let list = &mut self.lists[i];
        if !list.listed {
            list.listed = true;
            self.sizes.push(size);
        }
        list.ids.push(id);
        self.count += 1;
    }

    /// The most recently kept block of exactly `size` bytes, taken out.
    pub(crate) fn pop(&mut self, size: u64) -> Option<BlockId> {
        if self.count == 0 {
            return None;
        }
        let id = self.lists.get_mut(list_index(size))?.ids.pop()?;
        self.count -= 1;
        Some(id)
    }

    /// The most recently kept block of the largest kept size, if that is at
    /// least `size` bytes, taken out with its size (merged back, the largest
    /// frees the most room).
    pub(crate) fn pop_at_least(&mut self, size: u64) -> Option<(u64, BlockId)> {
        let lists = &self.lists;
        let fit = self
            .sizes
            .iter()
            .copied()
            .filter(|s| *s >= size && !lists[list_index(*s)].ids.is_empty())
            .max()?;
        self.pop(fit).map(|id| (fit, id))
    }

    /// Takes every kept block out, as (size, id).
    pub(crate) fn drain(&mut self) -> Vec<(u64, BlockId)> {
        let mut out = Vec::with_capacity(self.count);
        for size in self.sizes.drain(..) {
            if let Some(list) = self.lists.get_mut(list_index(size)) {
                list.listed = false;
                out.extend(list.ids.drain(..).map(|id| (size, id)));
            }
        }
        self.count = 0;
        out
    }

    /// Number of kept blocks.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Whether block `id` of `size` bytes is kept exactly once.
    pub(crate) fn holds_once(&self, size: u64, id: BlockId) -> bool {
        self.lists
            .get(list_index(size))
            .is_some_and(|l| l.ids.iter().filter(|i| **i == id).count() == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_the_latest_of_the_exact_size_and_drains_all() {
        let mut r = Reuse::default();
        assert_eq!(r.pop(512), None);
        r.push(512, 1);
        r.push(1024, 2);
        r.push(512, 3);
        assert_eq!(r.len(), 3);
        assert!(r.holds_once(512, 1) && !r.holds_once(1024, 1));
        assert_eq!(r.pop(512), Some(3));
        assert_eq!(r.pop(1536), None);
        let mut all = r.drain();
        all.sort_unstable();
        assert_eq!(all, vec![(512, 1), (1024, 2)]);
        assert_eq!((r.len(), r.pop(512)), (0, None));
        r.push(512, 4);
        assert_eq!(r.drain(), vec![(512, 4)], "a drained size is listed again");
    }

    #[test]
    fn pop_at_least_takes_the_largest_size() {
        let mut lists = Reuse::default();
        for (size, id) in [(1024, 1), (4096, 2), (2048, 3)] {
            lists.push(size, id);
        }
        assert_eq!(lists.pop_at_least(8192), None);
        assert_eq!(lists.pop_at_least(1536), Some((4096, 2)));
        assert_eq!(lists.pop_at_least(1536), Some((2048, 3)));
        assert_eq!(lists.pop_at_least(1536), None);
    }
}
