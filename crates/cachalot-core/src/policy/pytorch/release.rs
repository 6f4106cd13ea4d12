//! Giving memory back: whole cached segments, free pages of expandable segments,
//! oversize blocks to make room, and garbage collection of old cached blocks.

use crate::error::Result;

use super::block::{Block, BlockId};
use super::state::{Request, State};

impl State {
    /// Returns the whole-segment cached block `id` to the device.
    pub(crate) fn release_block(&mut self, id: BlockId) -> Result<()> {
        let b = &self.blocks[id];
        let (addr, size, small, stream, segment) = (b.addr, b.size, b.small, b.stream, b.segment);
        match &self.segments[segment].source {
            Some(source) => source.free(addr, size)?,
            None => self.backend.free_segment(addr)?,
        }
        self.uncache(id);
        self.blocks.remove(id);
        self.segments.remove(segment);
        self.ledger.segment_freed(addr, size, small, stream);
        Ok(())
    }

    /// Unmaps the whole pages inside cached expandable block `id`; the pages
    /// become an unmapped block, the partial pages around them stay cached.
    pub(crate) fn unmap_block(&mut self, id: BlockId) -> Result<()> {
        let b = self.blocks[id].clone();
        let seg = &mut self.segments[b.segment];
        let (base, stream) = (seg.base, seg.stream);
        let Some(es) = seg.expandable.as_mut() else {
            return Ok(());
        };
        let out = es.unmap(self.backend.as_ref(), base, b.addr - base, b.size, stream);
        self.orphan_pages.extend(out.orphans);
        if let Some((off, len)) = out.span {
            self.carve_unmapped(id, &b, base + off, len);
            self.ledger.unmapped(base + off, len, b.small, b.stream);
        }
        match out.error {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Turns `[start, start + len)` of cached block `id` (a copy of which is `b`)
    /// into an unmapped block, keeping the bytes before and after as cached blocks.
    fn carve_unmapped(&mut self, id: BlockId, b: &Block, start: u64, len: u64) {
        self.uncache(id);
        let before = start - b.addr;
        let after = b.size - before - len;
        if before > 0 {
            let piece = Block {
                size: before,
                next: Some(id),
                ..b.clone()
            };
            let pid = self.blocks.insert(piece);
            self.link_after(b.prev, pid, b.segment);
            self.blocks[id].prev = Some(pid);
            self.cache(pid);
        }
        if after > 0 {
            let piece = Block {
                addr: start + len,
                size: after,
                prev: Some(id),
                ..b.clone()
            };
            let pid = self.blocks.insert(piece);
            if let Some(n) = b.next {
                self.blocks[n].prev = Some(pid);
            }
            self.blocks[id].next = Some(pid);
            self.cache(pid);
        }
        let blk = &mut self.blocks[id];
        blk.addr = start;
        blk.size = len;
        blk.mapped = false;
        let (prev, next) = (blk.prev, blk.next);
        self.try_merge(id, prev);
        self.try_merge(id, next);
        self.pools[b.pool as usize]
            .of_mut(b.small)
            .insert_unmapped(id, &self.blocks[id]);
    }

    /// Releases an expandable segment that is one unmapped block `id`.
    fn release_expandable_segment(&mut self, id: BlockId) -> Result<()> {
        let Some(b) = self.blocks.remove(id) else {
            return Ok(());
        };
        self.pools[b.pool as usize]
            .of_mut(b.small)
            .remove_unmapped(&b);
        if let Some(seg) = self.segments.remove(b.segment) {
            if let Err(e) = self.backend.release_range(seg.base, seg.size) {
                self.orphan_ranges.push((seg.base, seg.size));
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// Frees every unsplit cached segment of a pool (of the pool pair in
    /// `slot`) and unmaps every free page of its expandable segments. A paused
    /// tag's segments stay until it is resumed (their pages are gone already).
    pub(crate) fn release_blocks(&mut self, slot: u32, small: bool) -> Result<()> {
        let pool = self.pools[slot as usize].of(small);
        let cached: Vec<BlockId> = pool.blocks.values().collect();
        let mut to_unmap = Vec::new();
        for id in cached {
            let b = &self.blocks[id];
            if b.expandable {
                to_unmap.push(id);
            } else if !b.is_split() && !self.segments[b.segment].paused {
                self.release_block(id)?;
            }
        }
        for id in to_unmap {
            if self.blocks.get(id).is_none_or(|b| !b.mapped || b.allocated) {
                continue;
            }
            self.unmap_block(id)?;
            if self
                .blocks
                .get(id)
                .is_some_and(|b| !b.is_split() && !b.mapped)
            {
                self.release_expandable_segment(id)?;
            }
        }
        Ok(())
    }

    /// `empty_cache`: waits for every outstanding event, then releases every
    /// cached segment and free page of the default pools and of every freeable
    /// private pool (only the latter while a route is open).
    pub(crate) fn release_cached_blocks(&mut self) -> Result<()> {
        if self.book.routing() {
            // As PyTorch during a capture: only the freeable private pools.
            self.release_freeable_pools()?;
            return Ok(());
        }
        self.synchronize_and_free_events(None)?;
        self.release_pool_blocks(0)?;
        self.release_freeable_pools()?;
        self.retry_orphans();
        Ok(())
    }

    /// Retries releases that failed earlier.
    fn retry_orphans(&mut self) {
        let backend = self.backend.clone();
        self.orphan_pages.retain_mut(|o| !o.retry(backend.as_ref()));
        self.orphan_ranges
            .retain(|(base, size)| backend.release_range(*base, *size).is_err());
    }

    /// With a split limit set, frees one cached oversize segment large enough for
    /// `req`, or else oversize segments largest first until enough was freed.
    /// Returns whether enough was freed.
    pub(crate) fn release_available_cached_blocks(&mut self, req: &Request) -> Result<bool> {
        let limit = self.placement.max_split_size;
        if limit == u64::MAX {
            return Ok(false);
        }
        let key = req.size.max(limit);
        let pool = self.pools[req.pool as usize].of(req.small);
        let single = pool.fits(req.stream, key).next().map(|(_, id)| id);
        if let Some(id) = single.filter(|id| !self.blocks[*id].expandable) {
            self.release_block(id)?;
            return Ok(true);
        }
        let candidates: Vec<BlockId> = pool
            .smaller(req.stream, key)
            .take_while(|(k, _)| k.1 >= limit)
            .map(|(_, id)| id)
            .collect();
        let mut released = 0;
        for id in candidates {
            if released >= key {
                break;
            }
            if !self.blocks[id].expandable {
                released += self.blocks[id].size;
                self.release_block(id)?;
            }
        }
        Ok(released >= key)
    }

    /// Frees unsplit large cached segments older than the average (in pool
    /// lookups) until reserved memory is under the GC threshold.
    pub(crate) fn garbage_collect(&mut self) -> Result<()> {
        let Some(allowed) = self.allowed else {
            return Ok(());
        };
        let threshold = (self.gc_threshold * allowed as f64) as u64;
        let reserved = self.reserved();
        if reserved <= threshold {
            return Ok(());
        }
        let target = reserved - threshold;
        let clock = self.pools[0].large.lookups;
        let age = |b: &Block| (clock - b.gc_base) as u64;
        let (mut total_age, mut count) = (0u64, 0u64);
        for id in self.pools[0].large.blocks.values() {
            let b = &self.blocks[id];
            if !b.is_split() {
                total_age += age(b);
                count += 1;
            }
        }
        let (mut reclaimed, mut freed) = (0u64, true);
        while reclaimed < target && freed && count > 0 {
            let threshold_age = total_age as f64 / count as f64;
            freed = false;
            let cached: Vec<BlockId> = self.pools[0].large.blocks.values().collect();
            for id in cached {
                let b = &self.blocks[id];
                let a = age(b);
                if !b.is_split() && !b.expandable && a as f64 >= threshold_age {
                    freed = true;
                    reclaimed += b.size;
                    total_age -= a;
                    count -= 1;
                    self.release_block(id)?;
                }
            }
        }
        Ok(())
    }
}
