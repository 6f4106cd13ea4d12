//! `validate()` for the cachalot policy: recounts a pool's blocks, pages and
//! segments and compares them with the heap's indexes and the statistics.

use std::collections::HashMap;

use crate::stats::{MemoryStats, StatArray};

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
    let pick = |a: &StatArray| {
        if small {
            a.small_pool.current
        } else {
            a.large_pool.current
        }
    };
    let (reserved, segments) = pool.recount_reserved();
    let split = if pool.cells.is_some() {
        (0, 0)
    } else {
        pool.heap.split_free()
    };
    let checks = [
        ("allocation", pick(&stats.allocation), sums.allocated.0),
        (
            "allocated_bytes",
            pick(&stats.allocated_bytes),
            sums.allocated.1,
        ),
        ("active", pick(&stats.active), sums.active.0),
        ("active_bytes", pick(&stats.active_bytes), sums.active.1),
        (
            "requested_bytes",
            pick(&stats.requested_bytes),
            sums.requested,
        ),
        (
            "reserved_bytes",
            pick(&stats.reserved_bytes),
            reserved as i64,
        ),
        ("segment", pick(&stats.segment), segments as i64),
        (
            "inactive_split",
            pick(&stats.inactive_split),
            split.0 as i64,
        ),
        (
            "inactive_split_bytes",
            pick(&stats.inactive_split_bytes),
            split.1 as i64,
        ),
    ];
    for (name, stat, actual) in checks {
        if stat != actual {
            return Err(format!(
                "{name} of the {} pool is {stat}, blocks say {actual}",
                pool_name(small)
            ));
        }
    }
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

/// Checks that every `all` statistic is the sum of its pools and no peak is
/// below its current value.
pub(crate) fn validate_totals(stats: &MemoryStats) -> Result<(), String> {
    for (name, a) in stats.arrays() {
        if a.all.current != a.small_pool.current + a.large_pool.current {
            return Err(format!("{name}.all is not the sum of its pools"));
        }
        for s in [&a.all, &a.small_pool, &a.large_pool] {
            if s.peak < s.current || s.current < 0 {
                return Err(format!(
                    "{name}: current {} outside [0, peak {}]",
                    s.current, s.peak
                ));
            }
        }
    }
    Ok(())
}
