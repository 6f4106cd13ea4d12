//! Allocation policies: the rules that pick block and segment sizes, split, merge
//! and release.
//!
//! * [`pytorch`]: PyTorch 2.11's native caching allocator, reproduced exactly.
//! * [`cachalot`]: cachalot's own policy: pages mapped under live blocks only,
//!   per-stream state, near-zero fragmentation.

pub mod cachalot;
pub mod pytorch;

pub use self::cachalot::CachalotAllocator;
pub use pytorch::PytorchAllocator;

use std::sync::Arc;

use crate::backend::Backend;
use crate::config::{AllocatorConfig, PolicyKind};
use crate::device_allocator::DeviceAllocator;
use crate::error::Result;

/// Builds the allocator for `config.policy` on `backend`.
///
/// # Errors
/// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a configuration
/// the policy cannot run.
pub fn create(
    backend: Arc<dyn Backend>,
    config: AllocatorConfig,
) -> Result<Arc<dyn DeviceAllocator>> {
    match config.policy {
        PolicyKind::Pytorch => Ok(Arc::new(PytorchAllocator::new(backend, config)?)),
        PolicyKind::Cachalot => Ok(Arc::new(CachalotAllocator::new(backend, config)?)),
    }
}
