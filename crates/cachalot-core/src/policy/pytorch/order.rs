//! An ordered map from `u128` keys to block ids, kept as a sorted vector while it
//! is small and as a B-tree once it grows.
//!
//! A pool of one stream holds tens to a few hundred cached blocks in the recorded
//! workloads; at that size a binary search and a short memmove beat a B-tree's
//! node walk and rebalancing several times over. Past [`FLAT_MAX`] entries the map
//! becomes a `BTreeMap` for good, so no workload pays more than logarithmic cost.

use std::collections::BTreeMap;

use super::block::BlockId;

/// The most entries kept in the sorted vector.
pub(crate) const FLAT_MAX: usize = 512;

/// See the module docs.
#[derive(Debug)]
pub(crate) enum OrderedMap {
    /// Sorted by key, keys unique.
    Flat(Vec<(u128, BlockId)>),
    /// Once more than [`FLAT_MAX`] entries were held.
    Tree(BTreeMap<u128, BlockId>),
}

impl Default for OrderedMap {
    fn default() -> Self {
        OrderedMap::Flat(Vec::new())
    }
}

/// One of two iterators yielding the same items.
pub(crate) enum Either<A, B> {
    /// The flat map's iterator.
    Flat(A),
    /// The tree's iterator.
    Tree(B),
}

impl<T, A: Iterator<Item = T>, B: Iterator<Item = T>> Iterator for Either<A, B> {
    type Item = T;
    fn next(&mut self) -> Option<T> {
        match self {
            Either::Flat(a) => a.next(),
            Either::Tree(b) => b.next(),
        }
    }
}

fn copied((k, v): &(u128, BlockId)) -> (u128, BlockId) {
    (*k, *v)
}

fn copied_pair((k, v): (&u128, &BlockId)) -> (u128, BlockId) {
    (*k, *v)
}

impl OrderedMap {
    /// Inserts `id` under `key`; returns the id it replaced.
    pub(crate) fn insert(&mut self, key: u128, id: BlockId) -> Option<BlockId> {
        match self {
            OrderedMap::Flat(v) => match v.binary_search_by_key(&key, |(k, _)| *k) {
                Ok(i) => Some(std::mem::replace(&mut v[i].1, id)),
                Err(i) if v.len() < FLAT_MAX => {
                    v.insert(i, (key, id));
                    None
                }
                Err(_) => {
                    let mut tree: BTreeMap<u128, BlockId> = v.drain(..).collect();
                    tree.insert(key, id);
                    *self = OrderedMap::Tree(tree);
                    None
                }
            },
            OrderedMap::Tree(t) => t.insert(key, id),
        }
    }

    /// Removes the entry under `key`; returns its id.
    pub(crate) fn remove(&mut self, key: u128) -> Option<BlockId> {
        match self {
            OrderedMap::Flat(v) => {
                let i = v.binary_search_by_key(&key, |(k, _)| *k).ok()?;
                Some(v.remove(i).1)
            }
            OrderedMap::Tree(t) => t.remove(&key),
        }
    }

    /// Every entry, lowest key first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u128, BlockId)> + '_ {
        match self {
            OrderedMap::Flat(v) => Either::Flat(v.iter().map(copied)),
            OrderedMap::Tree(t) => Either::Tree(t.iter().map(copied_pair)),
        }
    }

    /// Entries with a key of at least `from`, lowest first.
    pub(crate) fn from(&self, from: u128) -> impl Iterator<Item = (u128, BlockId)> + '_ {
        match self {
            OrderedMap::Flat(v) => {
                let at = v.partition_point(|(k, _)| *k < from);
                Either::Flat(v[at..].iter().map(copied))
            }
            OrderedMap::Tree(t) => Either::Tree(t.range(from..).map(copied_pair)),
        }
    }

    /// Entries with a key below `to`, highest first.
    pub(crate) fn below(&self, to: u128) -> impl Iterator<Item = (u128, BlockId)> + '_ {
        match self {
            OrderedMap::Flat(v) => {
                let at = v.partition_point(|(k, _)| *k < to);
                Either::Flat(v[..at].iter().rev().map(copied))
            }
            OrderedMap::Tree(t) => Either::Tree(t.range(..to).rev().map(copied_pair)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pytorch::arena::ArenaId;
    use crate::test_rng::XorShift;

    /// The flat and the tree form answer every query alike, across the switch.
    #[test]
    fn flat_and_tree_agree_with_a_btree() {
        let mut map = OrderedMap::default();
        let mut reference = BTreeMap::new();
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        for step in 0..4 * FLAT_MAX {
            let x = rng.draw();
            let key = u128::from(x % 2048) << 64 | u128::from(x >> 40);
            let id = BlockId::from_index(step);
            if x.is_multiple_of(5) {
                assert_eq!(map.remove(key), reference.remove(&key));
            } else {
                assert_eq!(map.insert(key, id), reference.insert(key, id));
            }
            if step.is_multiple_of(97) {
                let probe = u128::from(x % 2048) << 64;
                let want: Vec<_> = reference.range(probe..).map(copied_pair).collect();
                assert_eq!(map.from(probe).collect::<Vec<_>>(), want);
                let want: Vec<_> = reference.range(..probe).rev().map(copied_pair).collect();
                assert_eq!(map.below(probe).collect::<Vec<_>>(), want);
            }
        }
        assert!(matches!(map, OrderedMap::Tree(_)), "grew past FLAT_MAX");
        let want: Vec<_> = reference.iter().map(copied_pair).collect();
        assert_eq!(map.iter().collect::<Vec<_>>(), want);
    }
}
