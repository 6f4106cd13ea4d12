//! Leak checks: record a baseline, run some code, then name every allocation
//! still live that was not there at the baseline: what it holds, its name, its
//! size and the line of the program that created it.

use std::fmt;
use std::sync::Arc;

use cachalot::error::format_size;

use crate::context::{DeviceContext, LiveAllocation};
use crate::error::Result;
use crate::registry;

/// A baseline on one device. Made by [`LeakCheck::start`].
#[derive(Debug)]
pub struct LeakCheck {
    ctx: Arc<DeviceContext>,
    since: u64,
    allocated_at_start: u64,
}

/// One allocation live now that was not live at the baseline.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leak(pub LiveAllocation);

impl fmt::Display for Leak {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = &self.0;
        match &a.name {
            Some(n) => write!(f, "'{n}' {}", a.what)?,
            None => write!(f, "{}", a.what)?,
        }
        write!(
            f,
            " ({}) at {:#x}, created at {}",
            format_size(a.bytes),
            a.ptr,
            a.location
        )
    }
}

/// What a leak check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeakReport {
    /// The device ordinal.
    pub device: usize,
    /// `memory_allocated` at the baseline.
    pub allocated_at_start: u64,
    /// `memory_allocated` now.
    pub allocated_now: u64,
    /// The allocations created since the baseline and still live, oldest first.
    pub leaks: Vec<Leak>,
}

impl LeakReport {
    /// Whether nothing leaked.
    pub fn is_clean(&self) -> bool {
        self.leaks.is_empty()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_clean() {
            return write!(
                f,
                "cuda:{}: no leaks (allocated {})",
                self.device,
                format_size(self.allocated_now)
            );
        }
        let bytes: u64 = self.leaks.iter().map(|l| l.0.bytes).sum();
        writeln!(
            f,
            "cuda:{}: {} allocation(s), {} requested, live now that were not at the baseline (allocated {} -> {}):",
            self.device,
            self.leaks.len(),
            format_size(bytes),
            format_size(self.allocated_at_start),
            format_size(self.allocated_now)
        )?;
        for l in &self.leaks {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

impl LeakCheck {
    /// Records the baseline of device `ordinal` now.
    ///
    /// # Errors
    /// [`crate::TensorError::InvalidDevice`].
    pub fn start(ordinal: usize) -> Result<LeakCheck> {
        let ctx = registry::device(ordinal)?;
        let since = ctx.next_seq();
        let allocated_at_start = ctx.allocator.stats().memory_allocated();
        Ok(LeakCheck {
            ctx,
            since,
            allocated_at_start,
        })
    }

    /// The allocations live now that were not live at the baseline.
    pub fn report(&self) -> LeakReport {
        let leaks = self
            .ctx
            .live_since(self.since)
            .into_iter()
            .filter(|a| !a.internal)
            .map(Leak)
            .collect();
        LeakReport {
            device: self.ctx.ordinal,
            allocated_at_start: self.allocated_at_start,
            allocated_now: self.ctx.allocator.stats().memory_allocated(),
            leaks,
        }
    }
}
