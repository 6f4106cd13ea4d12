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
