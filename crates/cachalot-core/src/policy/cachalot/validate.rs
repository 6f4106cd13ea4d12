//! `validate()` for the cachalot policy: recounts a pool's blocks, pages and
//! segments and compares them with the heap's indexes and the statistics.

use std::collections::HashMap;

use crate::recount::Recount;
use crate::stats::{MemoryStats, StatPool};

use super::heap::State;
use super::pool::Pool;

/// Sums over a pool's blocks.
#[derive(Default)]
struct Sums {
    allocated: (i64, i64),
    active: (i64, i64),
    requested: i64,
    pending: usize,
    free: usize,
    kept: usize,
}

/// Checks one pool against its indexes and `stats`; returns its pending blocks.
pub(crate) fn validate_pool(
    pool: &Pool,
    stats: &MemoryStats,
    small: bool,
) -> Result<usize, String> {
    let sums = validate_blocks(pool)?;
    let (reserved, segments) = pool.recount_reserved();
    let split = if pool.cells.is_some() {
        (0, 0)
    } else {
        pool.heap.split_free()
    };
    let mut recount = Recount::default();
    recount.allocated(small, sums.allocated.0 as u64, sums.allocated.1 as u64);
    recount.active(
        small,
        sums.active.0 as u64,
        sums.active.1 as u64,
        sums.requested as u64,
    );
    recount.inactive_split(small, split.0, split.1);
    recount.reserved(small, segments, reserved);
    recount
        .check(stats, StatPool::of(small))
        .map_err(|e| format!("the {} pool: {e}", pool_name(small)))?;
    if sums.kept != pool.kept_count() {
        return Err(format!(
            "{} kept blocks but {} in the reuse lists",
            sums.kept,
            pool.kept_count()
        ));
    }
    if sums.free != pool.heap.free_count() {
        return Err(format!(
            "{} free blocks but {} indexed",
            sums.free,
            pool.heap.free_count()
        ));
    }
    if sums.active.0 as usize + sums.kept != pool.heap.live_count() {
        return Err(format!(
            "{} active and {} kept blocks but {} in the address index",
            sums.active.0,
            sums.kept,
            pool.heap.live_count()
        ));
    }
    Ok(sums.pending)
}

fn pool_name(small: bool) -> &'static str {
    if small {
        "small"
    } else {
        "large"
    }
}

/// Walks every region: blocks tile it, free ones are indexed and merged, live
/// ones are addressable, and (with pages) every live block's cells are mapped
/// and counted.
fn validate_blocks(pool: &Pool) -> Result<Sums, String> {
    let mut sums = Sums::default();
    let mut users: HashMap<u32, u32> = HashMap::new();
    for region in pool.heap.regions() {
        let (mut at, mut last_free) = (region.base, false);
        for (id, b) in pool.heap.blocks_of(region) {
            if b.addr != at || b.size == 0 {
                return Err(format!(
                    "block at {:#x} does not follow {at:#x} in its region",
                    b.addr
                ));
            }
            at = b.end();
            let free = b.state == State::Free;
            if free && last_free {
                return Err(format!(
                    "free block at {:#x} was not merged with its neighbour",
                    b.addr
                ));
            }
            last_free = free;
            if free {
                sums.free += 1;
                if !pool.heap.indexed(id) {
                    return Err(format!(
                        "free block at {:#x} is not in the free index",
                        b.addr
                    ));
                }
                continue;
            }
            if b.state == State::Kept {
                sums.kept += 1;
                if !pool.is_kept(id) || pool.heap.live(b.addr) != Some(id) {
                    return Err(format!("kept block at {:#x} is misfiled", b.addr));
                }
                if let Some(cells) = &pool.cells {
                    if !cells.all_mapped(b.addr, b.size) {
                        return Err(format!("kept block at {:#x} lost a page", b.addr));
                    }
                    for s in cells.span(b.addr, b.size) {
                        *users.entry(s).or_default() += 1;
                    }
                }
                continue;
            }
            if pool.heap.live(b.addr) != Some(id) {
                return Err(format!(
                    "live block at {:#x} is not in the address index",
                    b.addr
                ));
            }
            if let Some(cells) = &pool.cells {
                for s in cells.span(b.addr, b.size) {
                    *users.entry(s).or_default() += 1;
                }
            }
            sums.active.0 += 1;
            sums.active.1 += b.size as i64;
            sums.requested += b.requested as i64;
            if b.state == State::Allocated {
                sums.allocated.0 += 1;
                sums.allocated.1 += b.size as i64;
            } else {
                sums.pending += 1;
            }
        }
        if at != region.base + region.size {
            return Err(format!(
                "blocks of region {:#x} end at {at:#x}, not at its end",
                region.base
            ));
        }
    }
    if let Some(cells) = &pool.cells {
        cells.check(|s| users.get(&s).copied().unwrap_or(0))?;
        pool.aliases.check(cells)?;
    }
    Ok(sums)
}
