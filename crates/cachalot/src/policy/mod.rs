//! Allocation policies: the rules that pick block and segment sizes, split, merge
//! and release.
//!
//! * [`pytorch`]: PyTorch 2.11's native caching allocator, reproduced exactly.

pub(crate) mod arena;
pub mod pytorch;

pub use pytorch::PytorchAllocator;
