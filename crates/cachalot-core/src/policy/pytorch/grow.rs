//! Obtaining new memory: a new segment from the device, or, with expandable
//! segments, pages mapped at the lowest address of the stream's segment that has
//! room (creating the segment when none has).

use crate::backend::BackendError;
use crate::error::Result;

use super::block::{Block, BlockId, Segment};
use super::expandable::ExpandableSegment;
use super::placement::page_size;
use super::state::{Request, State};

impl State {
    /// A new block for `req` (not in any pool), or `None` when the device or the
    /// memory fraction has no room. `retry` marks the last-resort attempt.
    pub(crate) fn alloc_block(&mut self, req: &Request, retry: bool) -> Result<Option<BlockId>> {
        if retry {
            self.ledger.retried();
        }
        if self
            .allowed
            .is_some_and(|max| self.reserved() + req.alloc_size > max)
        {
            return Ok(None);
        }
        let source = self.book.source(req.pool);
        if req.expandable {
            return self.alloc_expandable(req);
        }
        let allocated = match &source {
            Some(s) => s.allocate(req.alloc_size),
            None => self.backend.allocate_segment(req.alloc_size),
        };
        let addr = match allocated {
            Ok(addr) => addr,
            Err(e) => return out_of_memory_is_none(e),
        };
        let segment = self.segments.insert(Segment {
            base: addr,
            size: req.alloc_size,
            stream: req.stream,
            small: req.small,
            pool: req.pool,
            head: placeholder(),
            expandable: None,
            source,
            paused: false,
        });
        let id = self
            .blocks
            .insert(new_block(req, addr, req.alloc_size, segment, false));
        self.segments[segment].head = id;
        self.ledger
            .segment_allocated(addr, req.alloc_size, req.small, req.stream);
        Ok(Some(id))
    }

    /// Maps enough pages for `req` and returns the free block covering them.
    fn alloc_expandable(&mut self, req: &Request) -> Result<Option<BlockId>> {
        let Some(mut c) = self.find_expandable_block(req)? else {
            return Ok(None);
        };
        if !self.blocks[c].mapped {
            let len = self.blocks[c].size.min(req.size);
            if !self.map_block(c, len)? {
                return Ok(None);
            }
        }
        while self.blocks[c].size < req.size {
            let Some(next) = self.blocks[c].next else {
                return Ok(None);
            };
            let len = (req.size - self.blocks[c].size).min(self.blocks[next].size);
            if !self.map_block(next, len)? {
                return Ok(None);
            }
            c = next;
        }
        self.uncache(c);
        Ok(Some(c))
    }

    /// The lowest-addressed run of free and unmapped blocks of the stream's
    /// segments with `req.size` bytes of room, or a new segment's unmapped block.
    fn find_expandable_block(&mut self, req: &Request) -> Result<Option<BlockId>> {
        let pool = self.pools[req.pool as usize].of(req.small);
        for id in pool.unmapped_of(req.stream) {
            let mut c = id;
            if let Some(p) = self.blocks[c]
                .prev
                .filter(|p| self.blocks[*p].is_reusable())
            {
                c = p;
            }
            if self.has_room(c, req.size) {
                return Ok(Some(c));
            }
        }
        let page = page_size(req.small);
        let (base, size, es) =
            match ExpandableSegment::reserve(self.backend.as_ref(), self.total_memory, page) {
                Ok(r) => r,
                Err(e) => return out_of_memory_is_none(e),
            };
        if size < req.size {
            self.backend.release_range(base, size)?;
            return Ok(None);
        }
        let segment = self.segments.insert(Segment {
            base,
            size,
            stream: req.stream,
            small: req.small,
            pool: req.pool,
            head: placeholder(),
            expandable: Some(es),
            source: None,
            paused: false,
        });
        let mut b = new_block(req, base, size, segment, true);
        b.mapped = false;
        let id = self.blocks.insert(b);
        self.segments[segment].head = id;
        self.pools[req.pool as usize]
            .of_mut(req.small)
            .insert_unmapped(id, &self.blocks[id]);
        Ok(Some(id))
    }

    fn has_room(&self, mut id: BlockId, size: u64) -> bool {
        let mut bytes = 0;
        loop {
            let b = &self.blocks[id];
            if !b.is_reusable() {
                return false;
            }
            bytes += b.size;
            match b.next {
                Some(n) if bytes < size => id = n,
                _ => return bytes >= size,
            }
        }
    }

    /// Maps the pages under the first `len` bytes of unmapped block `id`, which
    /// becomes a cached free block (merged with free neighbours). `Ok(false)`
    /// when the device has no memory.
    fn map_block(&mut self, id: BlockId, len: u64) -> Result<bool> {
        let b = self.blocks[id].clone();
        let seg = &mut self.segments[b.segment];
        let (base, stream, small) = (seg.base, seg.stream, seg.small);
        let Some(es) = seg.expandable.as_mut() else {
            return Ok(false);
        };
        let Some((off, mapped)) = es.map(
            self.backend.as_ref(),
            base,
            b.addr - base,
            len,
            &mut self.orphan_pages,
        )?
        else {
            return Ok(false);
        };
        self.pools[b.pool as usize]
            .of_mut(b.small)
            .remove_unmapped(&b);
        self.blocks[id].mapped = true;
        if mapped < b.size {
            let rest = Block {
                addr: b.addr + mapped,
                size: b.size - mapped,
                prev: Some(id),
                next: b.next,
                mapped: false,
                ..b.clone()
            };
            let rest_id = self.blocks.insert(rest);
            if let Some(n) = b.next {
                self.blocks[n].prev = Some(rest_id);
            }
            self.blocks[id].next = Some(rest_id);
            self.blocks[id].size = mapped;
            self.pools[b.pool as usize]
                .of_mut(b.small)
                .insert_unmapped(rest_id, &self.blocks[rest_id]);
        }
        let (prev, next) = (self.blocks[id].prev, self.blocks[id].next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.cache(id);
        self.ledger.mapped(base + off, mapped, small, stream);
        Ok(true)
    }
}

/// A fresh free block of a new segment.
fn new_block(
    req: &Request,
    addr: u64,
    size: u64,
    segment: super::block::SegmentId,
    expandable: bool,
) -> Block {
    Block {
        stream: req.stream,
        addr,
        size,
        requested: 0,
        small: req.small,
        pool: req.pool,
        allocated: false,
        mapped: true,
        prev: None,
        next: None,
        event_count: 0,
        stream_uses: Vec::new(),
        capture_uses: Vec::new(),
        gc_base: 0,
        segment,
        expandable,
    }
}

/// A head id to be replaced as soon as the head block exists.
fn placeholder() -> BlockId {
    <BlockId as super::arena::ArenaId>::from_index(0)
}

fn out_of_memory_is_none<T>(e: BackendError) -> Result<Option<T>> {
    if e.is_out_of_memory() {
        Ok(None)
    } else {
        Err(e.into())
    }
}
