//! Pools of cached free blocks, ordered for best fit by (stream, size, address)
//! as in PyTorch, and the address-ordered set of unmapped stretches; a pair of
//! them (small and large) for the default pools and for each private pool.

use std::collections::BTreeMap;

use crate::backend::{DevicePtr, StreamId};

use super::block::{Block, BlockId};
use super::order::OrderedMap;

/// The best-fit ordering of a cached block.
pub(crate) type FitKey = (StreamId, u64, DevicePtr);

/// Cached blocks in best-fit order, (stream, size, address): one ordered map per
/// stream, keyed by size and address packed into one `u128` (one comparison
/// instead of three on the hot path), streams in ascending order. Finding a
/// stream's map is logarithmic in the number of streams, so a workload of
/// thousands of streams costs no more per call than one of a few.
#[derive(Debug, Default)]
pub(crate) struct FitMap {
    streams: BTreeMap<StreamId, OrderedMap>,
    len: usize,
}

/// `(size, addr)` packed so that integer order is the tuple's order.
fn pack(size: u64, addr: DevicePtr) -> u128 {
    (u128::from(size) << 64) | u128::from(addr)
}

fn unpack(stream: StreamId, key: u128) -> FitKey {
    (stream, (key >> 64) as u64, key as u64)
}

impl FitMap {
    fn of(&self, stream: StreamId) -> Option<&OrderedMap> {
        self.streams.get(&stream)
    }

    /// Adds a block under `key`.
    pub(crate) fn insert(&mut self, key: FitKey, id: BlockId) {
        let map = self.streams.entry(key.0).or_default();
        if map.insert(pack(key.1, key.2), id).is_none() {
            self.len += 1;
        }
    }

    /// Removes the block under `key`, if any.
    pub(crate) fn remove(&mut self, key: &FitKey) -> Option<BlockId> {
        let map = self.streams.get_mut(&key.0)?;
        let id = map.remove(pack(key.1, key.2))?;
        self.len -= 1;
        Some(id)
    }

    /// How many blocks are cached.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Every cached block with its key, best fit order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (FitKey, BlockId)> + '_ {
        self.streams
            .iter()
            .flat_map(|(s, m)| m.iter().map(|(k, id)| (unpack(*s, k), id)))
    }

    /// Every cached block, best fit order.
    pub(crate) fn values(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.iter().map(|(_, id)| id)
    }
}

/// The small or the large pool.
#[derive(Debug, Default)]
pub(crate) struct BlockPool {
    /// Whether this is the small pool.
    pub(crate) small: bool,
    /// Free mapped blocks, best fit first.
    pub(crate) blocks: FitMap,
    /// Unmapped stretches of expandable segments, by (stream, address).
    pub(crate) unmapped: BTreeMap<(StreamId, DevicePtr), BlockId>,
    /// The GC clock: lookups made while garbage collection is on.
    pub(crate) lookups: i64,
}

impl BlockPool {
    /// An empty pool.
    pub(crate) fn new(small: bool) -> BlockPool {
        BlockPool {
            small,
            ..BlockPool::default()
        }
    }

    /// The fit key of `b`.
    pub(crate) fn key(b: &Block) -> FitKey {
        (b.stream, b.size, b.addr)
    }

    /// Caches a free block (stamping its GC age).
    pub(crate) fn insert(&mut self, id: BlockId, b: &mut Block) {
        b.gc_base = self.lookups;
        self.blocks.insert(Self::key(b), id);
    }

    /// Removes a cached block; returns whether it was there.
    pub(crate) fn remove(&mut self, b: &Block) -> bool {
        self.blocks.remove(&Self::key(b)).is_some()
    }

    /// Records an unmapped stretch.
    pub(crate) fn insert_unmapped(&mut self, id: BlockId, b: &Block) {
        self.unmapped.insert((b.stream, b.addr), id);
    }

    /// Forgets an unmapped stretch; returns whether it was there.
    pub(crate) fn remove_unmapped(&mut self, b: &Block) -> bool {
        self.unmapped.remove(&(b.stream, b.addr)).is_some()
    }

    /// Cached blocks of `stream` of at least `size` bytes, best fit first.
    pub(crate) fn fits(
        &self,
        stream: StreamId,
        size: u64,
    ) -> impl Iterator<Item = (FitKey, BlockId)> + '_ {
        self.blocks
            .of(stream)
            .into_iter()
            .flat_map(move |m| m.from(pack(size, 0)))
            .map(move |(k, id)| (unpack(stream, k), id))
    }

    /// Cached blocks of `stream` smaller than `size`, largest first.
    pub(crate) fn smaller(
        &self,
        stream: StreamId,
        size: u64,
    ) -> impl Iterator<Item = (FitKey, BlockId)> + '_ {
        self.blocks
            .of(stream)
            .into_iter()
            .flat_map(move |m| m.below(pack(size, 0)))
            .map(move |(k, id)| (unpack(stream, k), id))
    }

    /// Unmapped stretches of `stream`, lowest address first.
    pub(crate) fn unmapped_of(&self, stream: StreamId) -> impl Iterator<Item = BlockId> + '_ {
        self.unmapped
            .range((stream, 0)..)
            .take_while(move |(k, _)| k.0 == stream)
            .map(|(_, id)| *id)
    }
}

/// The small and the large pool of the default pools or of one private pool.
#[derive(Debug)]
pub(crate) struct PoolPair {
    /// Cached blocks of 1 MiB or less.
    pub(crate) small: BlockPool,
    /// Cached larger blocks.
    pub(crate) large: BlockPool,
}

impl Default for PoolPair {
    fn default() -> Self {
        PoolPair {
            small: BlockPool::new(true),
            large: BlockPool::new(false),
        }
    }
}

impl PoolPair {
    /// The small or the large pool.
    pub(crate) fn of(&self, small: bool) -> &BlockPool {
        if small {
            &self.small
        } else {
            &self.large
        }
    }

    /// The small or the large pool, to change.
    pub(crate) fn of_mut(&mut self, small: bool) -> &mut BlockPool {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    /// Whether neither pool holds a block.
    pub(crate) fn is_empty(&self) -> bool {
        [&self.small, &self.large]
            .iter()
            .all(|p| p.blocks.len() == 0 && p.unmapped.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::pytorch::arena::ArenaId;

    fn id(n: usize) -> BlockId {
        BlockId::from_index(n)
    }

    #[test]
    fn fit_map_keeps_stream_size_address_order() {
        let keys: Vec<FitKey> = vec![
            (StreamId(7), 4096, 0x9000),
            (StreamId(0), 1 << 40, 0x1000),
            (StreamId(7), 512, u64::MAX - 511),
            (StreamId(0), 4096, 0x2000),
            (StreamId(3), 4096, 0x1000),
            (StreamId(0), 4096, 0x1000),
        ];
        let mut map = FitMap::default();
        for (n, k) in keys.iter().enumerate() {
            map.insert(*k, id(n));
        }
        let mut sorted = keys.clone();
        sorted.sort();
        let got: Vec<FitKey> = map.iter().map(|(k, _)| k).collect();
        assert_eq!(got, sorted);
        assert_eq!(map.len(), keys.len());
        assert_eq!(map.remove(&(StreamId(3), 4096, 0x1000)), Some(id(4)));
        assert_eq!(map.remove(&(StreamId(3), 4096, 0x1000)), None);
        assert_eq!(map.remove(&(StreamId(9), 4096, 0x1000)), None);
        assert_eq!(map.len(), keys.len() - 1);
    }

    #[test]
    fn fits_and_smaller_stay_within_the_stream() {
        let mut pool = BlockPool::new(false);
        pool.blocks.insert((StreamId(0), 8192, 0x1000), id(0));
        pool.blocks.insert((StreamId(1), 4096, 0x5000), id(1));
        pool.blocks.insert((StreamId(1), 4096, 0x3000), id(2));
        pool.blocks.insert((StreamId(1), 1024, 0x8000), id(3));
        pool.blocks.insert((StreamId(2), 2048, 0x9000), id(4));
        let fits: Vec<BlockId> = pool.fits(StreamId(1), 2048).map(|(_, i)| i).collect();
        assert_eq!(fits, [id(2), id(1)]);
        let smaller: Vec<BlockId> = pool.smaller(StreamId(1), 4096).map(|(_, i)| i).collect();
        assert_eq!(smaller, [id(3)]);
        assert_eq!(pool.fits(StreamId(0), 8193).count(), 0);
        assert_eq!(pool.fits(StreamId(5), 0).count(), 0);
    }
}
