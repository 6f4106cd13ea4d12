//! The memory API of a device, with PyTorch's names (`torch.cuda.memory_*`).
//! Functions that only read statistics return 0 for a device never used, as
//! PyTorch does, without initialising it.

use std::collections::BTreeMap;

use cachalot::backend::MemInfo;

use crate::error::Result;
use crate::pinned::PinnedStats;
use crate::registry;

fn stats_of(ordinal: usize) -> Option<cachalot::MemoryStats> {
    registry::active()
        .initialized(ordinal)
        .map(|c| c.allocator.stats())
}

/// Bytes in allocated blocks (`torch.cuda.memory_allocated`).
pub fn memory_allocated(ordinal: usize) -> u64 {
    stats_of(ordinal).map_or(0, |s| s.memory_allocated())
}

/// Peak of [`memory_allocated`] since the last reset (`torch.cuda.max_memory_allocated`).
pub fn max_memory_allocated(ordinal: usize) -> u64 {
    stats_of(ordinal).map_or(0, |s| s.max_memory_allocated())
}

/// Bytes in segments (`torch.cuda.memory_reserved`).
pub fn memory_reserved(ordinal: usize) -> u64 {
    stats_of(ordinal).map_or(0, |s| s.memory_reserved())
}

/// Peak of [`memory_reserved`] since the last reset (`torch.cuda.max_memory_reserved`).
pub fn max_memory_reserved(ordinal: usize) -> u64 {
    stats_of(ordinal).map_or(0, |s| s.max_memory_reserved())
}

/// Every statistic under PyTorch's key names (`torch.cuda.memory_stats`); empty for
/// a device never used.
pub fn memory_stats(ordinal: usize) -> BTreeMap<String, i64> {
    stats_of(ordinal).map(|s| s.to_map()).unwrap_or_default()
}

/// Sets every peak statistic to its current value (`torch.cuda.reset_peak_memory_stats`).
pub fn reset_peak_memory_stats(ordinal: usize) {
    if let Some(c) = registry::active().initialized(ordinal) {
        c.allocator.reset_peak_stats();
    }
}

/// Returns every unused cached segment to the device (`torch.cuda.empty_cache`), and
/// the pinned host blocks whose copies have finished.
///
/// # Errors
/// [`TensorError::Allocator`] when the device fails.
pub fn empty_cache(ordinal: usize) -> Result<()> {
    let reg = registry::active();
    reg.pinned.empty_cache();
    match reg.initialized(ordinal) {
        Some(c) => c.empty_cache(),
        None => Ok(()),
    }
}

/// The device's free and total bytes (`torch.cuda.mem_get_info`).
///
/// # Errors
/// [`TensorError::InvalidDevice`]; driver failures.
pub fn mem_get_info(ordinal: usize) -> Result<MemInfo> {
    registry::device(ordinal)?.mem_get_info()
}

/// Caps what the device's allocator may reserve at `fraction` of its memory
/// (`torch.cuda.set_per_process_memory_fraction`).
///
/// # Errors
/// [`TensorError::Allocator`] for a fraction outside `[0, 1]`; [`TensorError::InvalidDevice`].
pub fn set_per_process_memory_fraction(fraction: f64, ordinal: usize) -> Result<()> {
    let ctx = registry::device(ordinal)?;
    ctx.allocator.set_memory_fraction(fraction)?;
    Ok(())
}

/// Blocks until all work on the device has finished (`torch.cuda.synchronize`).
///
/// # Errors
/// [`TensorError::InvalidDevice`]; driver failures.
pub fn synchronize(ordinal: usize) -> Result<()> {
    registry::device(ordinal)?.engine.synchronize()
}

/// Counters of the pinned host memory cache.
pub fn pinned_memory_stats() -> PinnedStats {
    registry::active().pinned.stats()
}

/// Bytes of host memory a simulated device holds for written allocations (its
/// unwritten allocations take none); 0 for a real or unused device.
pub fn simulated_host_bytes(ordinal: usize) -> usize {
    match registry::active()
        .initialized(ordinal)
        .as_deref()
        .map(|c| &c.engine)
    {
        Some(crate::engine::Engine::Sim(e)) => e.host_bytes(),
        _ => 0,
    }
}

/// Whether device `ordinal` is simulated (host memory standing in for a GPU).
///
/// # Errors
/// [`TensorError::InvalidDevice`].
pub fn is_simulated(ordinal: usize) -> Result<bool> {
    Ok(registry::device(ordinal)?.engine.is_sim())
}
