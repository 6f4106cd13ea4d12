//! `validate()`: walks every segment and block and checks every invariant,
//! recomputing each statistic from the blocks.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::ensure_invariant;
use crate::error::InvariantViolation;
use crate::recount::Recount;
use crate::stats::StatPool;

use super::block::{Block, Segment, SegmentId};
use super::pool::BlockPool;
use super::state::State;

type Check = Result<(), InvariantViolation>;

impl State {
    /// Checks every invariant.
    pub(crate) fn validate(&self) -> Check {
        let mut walked = 0;
        for (sid, seg) in self.segments.iter() {
            walked += self.validate_segment(sid, seg)?;
        }
        ensure_invariant!(
            walked == self.blocks.len(),
            "{} blocks, {walked} reachable from segments",
            self.blocks.len()
        );
        self.validate_pools()?;
        self.validate_tags()?;
        self.validate_claims()?;
        self.validate_stats()
    }

    /// Checks that the blocks of `seg` tile it; returns how many there are.
    fn validate_segment(&self, sid: SegmentId, seg: &Segment) -> Result<usize, InvariantViolation> {
        let (mut at, mut prev, mut cur, mut n) = (seg.base, None, Some(seg.head), 0usize);
        let mut last: Option<&Block> = None;
        while let Some(id) = cur {
            let b = self
                .blocks
                .get(id)
                .ok_or_else(|| InvariantViolation(format!("stale block {id:?}")))?;
            ensure_invariant!(
                b.segment == sid && b.prev == prev,
                "block {id:?} is mislinked in segment at {:#x}",
                seg.base
            );
            ensure_invariant!(
                b.addr == at && b.size > 0,
                "block {id:?} at {:#x} breaks the tiling at {at:#x}",
                b.addr
            );
            ensure_invariant!(
                b.stream == seg.stream && b.small == seg.small && b.pool == seg.pool,
                "block {id:?} disagrees with its segment"
            );
            ensure_invariant!(
                b.expandable == seg.expandable.is_some(),
                "block {id:?} expandable flag is wrong"
            );
            if let Some(es) = &seg.expandable {
                let aligned = b.mapped
                    || ((b.addr - seg.base).is_multiple_of(es.page)
                        && b.size.is_multiple_of(es.page));
                ensure_invariant!(aligned, "unmapped block {id:?} is not page-aligned");
                ensure_invariant!(
                    es.pages_are(b.addr - seg.base, b.size, b.mapped),
                    "block {id:?} mapping is wrong"
                );
            } else {
                ensure_invariant!(b.mapped, "block {id:?} of a plain segment is unmapped");
            }
            if let Some(l) = last {
                let mergeable = l.is_reusable() && b.is_reusable() && l.mapped == b.mapped;
                ensure_invariant!(
                    !mergeable,
                    "free neighbours at {:#x} and {:#x} were not merged",
                    l.addr,
                    b.addr
                );
            }
            at += b.size;
            n += 1;
            prev = Some(id);
            last = Some(b);
            cur = b.next;
        }
        ensure_invariant!(
            at == seg.base + seg.size,
            "segment at {:#x} is tiled up to {at:#x} only",
            seg.base
        );
        Ok(n)
    }

    /// Checks that the pools hold exactly the free blocks, under the right keys.
    fn validate_pools(&self) -> Check {
        self.validate_private_pools()?;
        let pairs = self.pools.iter().enumerate();
        for (slot, pool) in pairs.flat_map(|(s, p)| [(s, &p.small), (s, &p.large)]) {
            for (key, id) in pool.blocks.iter() {
                let b = self
                    .blocks
                    .get(id)
                    .ok_or_else(|| InvariantViolation(format!("pool holds stale {id:?}")))?;
                ensure_invariant!(
                    key == BlockPool::key(b) && b.small == pool.small && b.pool as usize == slot,
                    "pool key of {id:?} is wrong"
                );
                ensure_invariant!(
                    b.is_reusable() && b.mapped,
                    "cached block {id:?} is not free and mapped"
                );
            }
            for ((stream, addr), id) in &pool.unmapped {
                let b = self
                    .blocks
                    .get(*id)
                    .ok_or_else(|| InvariantViolation(format!("pool holds stale {id:?}")))?;
                ensure_invariant!(
                    b.stream == *stream && b.addr == *addr && !b.mapped && b.pool as usize == slot,
                    "unmapped entry {id:?} is wrong"
                );
                ensure_invariant!(b.is_reusable(), "unmapped block {id:?} is in use");
            }
        }
        let cached = self
            .blocks
            .iter()
            .filter(|(_, b)| b.is_reusable() && b.mapped)
            .count();
        let listed: usize = self
            .pools
            .iter()
            .map(|p| p.small.blocks.len() + p.large.blocks.len())
            .sum();
        ensure_invariant!(
            cached == listed,
            "{cached} free blocks but {listed} in the pools"
        );
        let unmapped = self.blocks.iter().filter(|(_, b)| !b.mapped).count();
        let listed: usize = self
            .pools
            .iter()
            .map(|p| p.small.unmapped.len() + p.large.unmapped.len())
            .sum();
        ensure_invariant!(
            unmapped == listed,
            "{unmapped} unmapped blocks but {listed} listed"
        );
        Ok(())
    }

    /// Checks that every private pool has a pair of pools of its own and every
    /// segment a known pool.
    fn validate_private_pools(&self) -> Check {
        let mut slots = vec![false; self.pools.len()];
        slots[0] = true;
        for (id, r) in self.book.iter() {
            let slot = r.slot as usize;
            ensure_invariant!(
                slot < self.pools.len() && !slots[slot],
                "private pool {id} has a bad slot {slot}"
            );
            slots[slot] = true;
        }
        for (slot, pair) in self.pools.iter().enumerate() {
            ensure_invariant!(
                slots[slot] || pair.is_empty(),
                "unused pool slot {slot} holds blocks"
            );
        }
        for (_, seg) in self.segments.iter() {
            ensure_invariant!(
                slots.get(seg.pool as usize).copied().unwrap_or(false),
                "segment at {:#x} belongs to no pool",
                seg.base
            );
        }
        for id in &self.deferred {
            let b = self.blocks.get(*id);
            ensure_invariant!(
                b.is_some_and(|b| !b.allocated && b.event_count == 0 && !b.stream_uses.is_empty()),
                "deferred block {id:?} is not a freed block awaiting its events"
            );
        }
        for id in self.free_marks.keys() {
            ensure_invariant!(
                self.deferred.contains(id),
                "block {id:?} has free marks but is not deferred"
            );
        }
        Ok(())
    }

    /// Checks that every segment of a tag comes from its source, which knows
    /// it paused exactly when the segment is, that a tag's source holds no
    /// other segment, and that only a paused tag has paused segments.
    fn validate_tags(&self) -> Check {
        for (_, seg) in self.segments.iter() {
            let Some(tag) = self.tags.get(&seg.pool) else {
                ensure_invariant!(
                    !seg.paused,
                    "segment at {:#x} of no tag is paused",
                    seg.base
                );
                continue;
            };
            let from_tag = seg
                .source
                .as_ref()
                .is_some_and(|s| std::ptr::addr_eq(Arc::as_ptr(s), Arc::as_ptr(&tag.source)));
            ensure_invariant!(
                from_tag,
                "segment at {:#x} of a tag is not its source's",
                seg.base
            );
            ensure_invariant!(
                tag.source.paused(seg.base) == Some(seg.paused),
                "segment at {:#x}: its source says paused {:?}, the allocator {}",
                seg.base,
                tag.source.paused(seg.base),
                seg.paused
            );
            ensure_invariant!(
                tag.paused || !seg.paused,
                "segment at {:#x} is paused in a tag that is not",
                seg.base
            );
        }
        for (&slot, tag) in &self.tags {
            let held = self.segments.iter().filter(|(_, s)| s.pool == slot).count();
            ensure_invariant!(
                tag.source.len() == held,
                "the tag in slot {slot} holds {held} segments, its source {}",
                tag.source.len()
            );
        }
        Ok(())
    }

    /// Checks the allocated map and the outstanding events.
    fn validate_claims(&self) -> Check {
        for (addr, id) in &self.allocated {
            let ok = self
                .blocks
                .get(*id)
                .is_some_and(|b| b.allocated && b.addr == *addr && b.event_count == 0);
            ensure_invariant!(
                ok,
                "allocation at {addr:#x} does not name an allocated block"
            );
        }
        let allocated = self.blocks.iter().filter(|(_, b)| b.allocated).count();
        ensure_invariant!(
            allocated == self.allocated.len(),
            "{allocated} allocated blocks, {} listed",
            self.allocated.len()
        );
        if let Err(e) = self.pending.check(&self.hashes) {
            return Err(InvariantViolation(format!("event queues: {e}")));
        }
        let mut waits: BTreeMap<_, u32> = BTreeMap::new();
        for e in self.pending.events() {
            *waits.entry(e.block).or_default() += 1;
        }
        for (id, b) in self.blocks.iter() {
            let n = waits.get(&id).copied().unwrap_or(0);
            ensure_invariant!(
                b.event_count == n,
                "block {id:?} counts {} events, {n} outstanding",
                b.event_count
            );
            ensure_invariant!(
                n == 0 || !b.allocated,
                "block {id:?} is allocated and awaiting events"
            );
        }
        Ok(())
    }

    /// Recomputes every statistic's current value from blocks and segments
    /// ([`Recount`], the contract both policies check), then the figures
    /// only this policy keeps: paused bytes and oversize counts.
    fn validate_stats(&self) -> Check {
        let mut recount = Recount::default();
        for (_, b) in self.blocks.iter() {
            if b.allocated {
                recount.allocated(b.small, 1, b.size);
            }
            if b.is_active() {
                recount.active(b.small, 1, b.size, b.requested);
            }
            if b.is_reusable() && b.mapped && b.is_split() && !b.expandable {
                recount.inactive_split(b.small, 1, b.size);
            }
        }
        let mut paused = 0;
        for (_, seg) in self.segments.iter() {
            match &seg.expandable {
                Some(es) => recount.reserved(seg.small, 0, es.mapped_bytes()),
                None if seg.paused => {
                    recount.reserved(seg.small, 1, 0);
                    paused += seg.size as i64;
                }
                None => recount.reserved(seg.small, 1, seg.size),
            }
        }
        let stats = &self.ledger.stats;
        for pool in [StatPool::All, StatPool::Small, StatPool::Large] {
            recount.check(stats, pool).map_err(InvariantViolation)?;
        }
        let (over_alloc, over_seg) = self.oversize_counts();
        for (name, have, counted) in [
            ("paused_bytes", stats.paused_bytes.current, paused),
            (
                "oversize_allocations",
                stats.oversize_allocations.current,
                over_alloc,
            ),
            (
                "oversize_segments",
                stats.oversize_segments.current,
                over_seg,
            ),
        ] {
            ensure_invariant!(have == counted, "{name} is {have}, blocks say {counted}");
        }
        stats.check_levels().map_err(InvariantViolation)
    }
}
