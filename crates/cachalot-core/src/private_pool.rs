//! Private pools: memory that serves only the allocations routed to it.
//!
//! PyTorch routes allocations into a private pool while a CUDA graph is
//! captured (the graph's addresses are baked in, so its memory must stay its
//! own until the graph dies) and inside `torch.cuda.use_mem_pool(pool)`. A
//! private pool is named by a [`PoolId`] (PyTorch's `MempoolId_t`), has a use
//! count (each graph or `MemPool` holding it), and its cached memory goes back
//! to the device only once the count is zero: then the pool is *freeable*, its
//! cached blocks are released by the next `empty_cache`, and it is forgotten
//! once it holds no segment.
//!
//! A **route** sends the requests whose stream a filter accepts to a pool, from
//! [`PrivatePools::begin_allocate_to_pool`](crate::PrivatePools::begin_allocate_to_pool)
//! to the matching `end_allocate_to_pool`; the newest route that accepts a
//! stream wins. A capture's filter accepts the capturing stream; `use_mem_pool`'s
//! accepts any stream used from the calling thread.
//!
//! `PoolBook` is the bookkeeping both policies share: routes, use counts,
//! options and which pools are freeable. Each policy keeps the memory.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use crate::backend::{DevicePtr, StreamId};
use crate::error::{Error, Result};

pub use crate::pool_id::PoolId;
pub use crate::segment_source::SegmentSource;

/// How a private pool serves requests (`torch.cuda.MemPool`'s flags).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolOptions {
    /// When the default pools have no room, a request may take a free block of
    /// this pool before cached memory is released (`use_on_oom`).
    pub use_on_oom: bool,
    /// Blocks of this pool are never split (`no_split`).
    pub no_split: bool,
}

/// A live allocation of a private pool: what a checkpoint of the pool holds
/// (cudagraph trees checkpoint a pool after each recording and may restore it).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PoolAllocation {
    /// Its address.
    pub ptr: DevicePtr,
    /// Its block's size.
    pub size: u64,
    /// What its caller asked for.
    pub requested: u64,
    /// Its stream.
    pub stream: StreamId,
}

/// Which streams' requests a route takes: called with the request's stream,
/// on the requesting thread.
pub type RouteFilter = Arc<dyn Fn(StreamId) -> bool + Send + Sync>;

/// One private pool's bookkeeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PoolRecord {
    /// Holders: graphs, `MemPool`s and open routes.
    pub(crate) use_count: u32,
    /// Its flags.
    pub(crate) options: PoolOptions,
    /// The policy's index for the pool's memory (never 0: that is the default).
    pub(crate) slot: u32,
}

/// Routes, use counts and options of one device's private pools.
#[derive(Default)]
pub(crate) struct PoolBook {
    records: HashMap<PoolId, PoolRecord>,
    routes: Vec<(PoolId, RouteFilter)>,
    /// The segment sources of pools that have one, by slot.
    sources: HashMap<u32, Arc<dyn SegmentSource>>,
    free_slots: Vec<u32>,
    next_slot: u32,
}

impl fmt::Debug for PoolBook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBook")
            .field("records", &self.records)
            .field(
                "routes",
                &self.routes.iter().map(|r| r.0).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

fn not_default(id: PoolId) -> Result<()> {
    if id.is_default() {
        Err(Error::InvalidArgument(
            "pool id (0, 0) names the default pools, not a private pool".into(),
        ))
    } else {
        Ok(())
    }
}

fn unknown(id: PoolId) -> Error {
    Error::InvalidArgument(format!("no private pool {id} on this device"))
}

impl PoolBook {
    /// Creates pool `id` with a use count of 1, or adds one to its count.
    /// Returns its record and whether it is new.
    pub(crate) fn create_or_incref(&mut self, id: PoolId) -> Result<(PoolRecord, bool)> {
        not_default(id)?;
        if let Some(r) = self.records.get_mut(&id) {
            r.use_count += 1;
            return Ok((*r, false));
        }
        let slot = match self.free_slots.pop() {
            Some(s) => s,
            None => {
                self.next_slot += 1;
                self.next_slot
            }
        };
        let record = PoolRecord {
            use_count: 1,
            options: PoolOptions::default(),
            slot,
        };
        self.records.insert(id, record);
        Ok((record, true))
    }

    /// Takes one use off pool `id`; returns its record after.
    pub(crate) fn release(&mut self, id: PoolId) -> Result<PoolRecord> {
        not_default(id)?;
        let r = self.records.get_mut(&id).ok_or_else(|| unknown(id))?;
        if r.use_count == 0 {
            return Err(Error::InvalidArgument(format!(
                "private pool {id} was released more times than it was created or shared"
            )));
        }
        r.use_count -= 1;
        Ok(*r)
    }

    /// Forgets pool `id` (freeable and holding no memory); its slot is reused.
    pub(crate) fn forget(&mut self, id: PoolId) {
        if let Some(r) = self.records.remove(&id) {
            self.sources.remove(&r.slot);
            self.free_slots.push(r.slot);
        }
    }

    /// Pool `id`'s record.
    pub(crate) fn get(&self, id: PoolId) -> Option<PoolRecord> {
        self.records.get(&id).copied()
    }

    /// Pool `id`'s use count (0 for a pool this book does not know).
    pub(crate) fn use_count(&self, id: PoolId) -> u32 {
        self.get(id).map_or(0, |r| r.use_count)
    }

    /// Pool `id`'s record, or the error naming it unknown.
    pub(crate) fn require(&self, id: PoolId) -> Result<PoolRecord> {
        not_default(id)?;
        self.get(id).ok_or_else(|| unknown(id))
    }

    /// Sets pool `id`'s options.
    pub(crate) fn set_options(&mut self, id: PoolId, options: PoolOptions) -> Result<()> {
        not_default(id)?;
        let r = self.records.get_mut(&id).ok_or_else(|| unknown(id))?;
        r.options = options;
        Ok(())
    }

    /// Every pool with its record.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (PoolId, PoolRecord)> + '_ {
        self.records.iter().map(|(id, r)| (*id, *r))
    }

    /// Pools whose use count is zero.
    pub(crate) fn freeable(&self) -> Vec<PoolId> {
        let mut ids: Vec<PoolId> = self
            .iter()
            .filter(|(_, r)| r.use_count == 0)
            .map(|(id, _)| id)
            .collect();
        ids.sort();
        ids
    }

    /// Makes `source` give pool `id`'s new segments.
    pub(crate) fn set_source(&mut self, id: PoolId, source: Arc<dyn SegmentSource>) -> Result<()> {
        let slot = self.require(id)?.slot;
        self.sources.insert(slot, source);
        Ok(())
    }

    /// Whether a route to pool `id` is open.
    pub(crate) fn routes_to(&self, id: PoolId) -> bool {
        self.routes.iter().any(|(r, _)| *r == id)
    }

    /// The segment source of the pool in `slot`, if it has one.
    pub(crate) fn source(&self, slot: u32) -> Option<Arc<dyn SegmentSource>> {
        self.sources.get(&slot).cloned()
    }

    /// Opens a route to pool `id` (which must exist).
    pub(crate) fn push_route(&mut self, id: PoolId, filter: RouteFilter) -> Result<()> {
        self.require(id)?;
        self.routes.push((id, filter));
        Ok(())
    }

    /// Closes the newest route to pool `id`.
    pub(crate) fn end_route(&mut self, id: PoolId) -> Result<()> {
        not_default(id)?;
        match self.routes.iter().rposition(|(r, _)| *r == id) {
            Some(at) => {
                self.routes.remove(at);
                Ok(())
            }
            None => Err(Error::InvalidArgument(format!(
                "no allocation into private pool {id} is under way"
            ))),
        }
    }

    /// Whether any route is open.
    pub(crate) fn routing(&self) -> bool {
        !self.routes.is_empty()
    }

    /// The pool a request on `stream` goes to: the newest route accepting it.
    pub(crate) fn route(&self, stream: StreamId) -> Option<PoolRecord> {
        let (id, _) = self.routes.iter().rev().find(|(_, f)| f(stream))?;
        self.get(*id)
    }

    /// The pools whose options let a default request borrow their free
    /// blocks, in id order.
    pub(crate) fn use_on_oom(&self) -> Vec<PoolRecord> {
        let mut pools: Vec<(PoolId, PoolRecord)> =
            self.iter().filter(|(_, r)| r.options.use_on_oom).collect();
        pools.sort_by_key(|(id, _)| *id);
        pools.into_iter().map(|(_, r)| r).collect()
    }

    /// The pool whose memory sits in `slot`.
    pub(crate) fn id_of(&self, slot: u32) -> PoolId {
        self.records
            .iter()
            .find(|(_, r)| r.slot == slot)
            .map_or(PoolId::DEFAULT, |(id, _)| *id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any() -> RouteFilter {
        Arc::new(|_| true)
    }

    #[test]
    fn use_counts_and_slots() {
        let mut book = PoolBook::default();
        let a = PoolId(0, 1);
        let (r, new) = book.create_or_incref(a).unwrap();
        assert!(new);
        assert_eq!((r.use_count, r.slot), (1, 1));
        let (r, new) = book.create_or_incref(a).unwrap();
        assert!(!new);
        assert_eq!(r.use_count, 2);
        assert_eq!(book.release(a).unwrap().use_count, 1);
        assert!(book.freeable().is_empty());
        assert_eq!(book.release(a).unwrap().use_count, 0);
        assert_eq!(book.freeable(), vec![a]);
        assert!(book.release(a).is_err());
        book.forget(a);
        assert!(book.get(a).is_none());
        let (r, _) = book.create_or_incref(PoolId(4, 0)).unwrap();
        assert_eq!(r.slot, 1, "a forgotten pool's slot is reused");
        assert!(book.create_or_incref(PoolId::DEFAULT).is_err());
        assert!(book.release(PoolId(9, 9)).is_err());
    }

    #[test]
    fn the_newest_accepting_route_wins() {
        let mut book = PoolBook::default();
        let (a, b) = (PoolId(1, 0), PoolId(2, 0));
        book.create_or_incref(a).unwrap();
        book.create_or_incref(b).unwrap();
        assert!(book.push_route(PoolId(3, 0), any()).is_err());
        book.push_route(a, any()).unwrap();
        book.push_route(b, Arc::new(|s| s == StreamId(7))).unwrap();
        assert!(book.routing());
        assert_eq!(book.route(StreamId(7)).map(|r| r.slot), Some(2));
        assert_eq!(book.route(StreamId(1)).map(|r| r.slot), Some(1));
        book.end_route(b).unwrap();
        assert!(book.end_route(b).is_err());
        assert_eq!(book.route(StreamId(7)).map(|r| r.slot), Some(1));
        book.end_route(a).unwrap();
        assert!(!book.routing());
        assert!(book.route(StreamId(7)).is_none());
    }

    #[test]
    fn options_and_oom_borrowing() {
        let mut book = PoolBook::default();
        let (a, b) = (PoolId(0, 2), PoolId(0, 1));
        book.create_or_incref(a).unwrap();
        book.create_or_incref(b).unwrap();
        let on = PoolOptions {
            use_on_oom: true,
            no_split: false,
        };
        book.set_options(a, on).unwrap();
        book.set_options(b, on).unwrap();
        let slots: Vec<u32> = book.use_on_oom().iter().map(|r| r.slot).collect();
        assert_eq!(slots, vec![2, 1], "in id order");
        assert_eq!(book.id_of(1), a);
        assert_eq!(book.id_of(0), PoolId::DEFAULT);
        assert!(book.set_options(PoolId(5, 5), on).is_err());
    }
}
