//! Shared test support: the conformance suite every backend and policy must pass.
//!
//! Add a backend or policy with one line in `tests/conformance.rs`:
//! `conformance_suite!(name, || -> Arc<dyn DeviceAllocator> { ... });`

#![allow(dead_code)]

pub mod conformance;
pub mod pools;

/// Generates the conformance tests for allocators built by `$make` (a closure
/// returning `Arc<dyn DeviceAllocator>`, a fresh one per call).
#[macro_export]
macro_rules! conformance_suite {
    ($name:ident, $make:expr) => {
        mod $name {
            use super::*;

            fn make() -> std::sync::Arc<dyn cachalot::DeviceAllocator> {
                ($make)()
            }

            #[test]
            fn zero_size_is_null() {
                common::conformance::zero_size_is_null(&*make());
            }
            #[test]
            fn absurd_size_is_too_large() {
                common::conformance::absurd_size_is_too_large(&*make());
            }
            #[test]
            fn allocations_are_disjoint_and_returned() {
                common::conformance::allocations_are_disjoint_and_returned(&*make());
            }
            #[test]
            fn invalid_frees_change_nothing() {
                common::conformance::invalid_frees_change_nothing(&*make());
            }
            #[test]
            fn freed_memory_is_reused() {
                common::conformance::freed_memory_is_reused(&*make());
            }
            #[test]
            fn cross_stream_free_waits() {
                common::conformance::cross_stream_free_waits(&*make());
            }
            #[test]
            fn memory_fraction_limits_and_recovers() {
                common::conformance::memory_fraction_limits_and_recovers(&*make());
            }
            #[test]
            fn backing_covers_each_allocation() {
                common::conformance::backing_covers_each_allocation(&*make());
            }
            #[test]
            fn stat_resets() {
                common::conformance::stat_resets(&*make());
            }
            #[test]
            fn snapshot_matches_stats() {
                common::conformance::snapshot_matches_stats(&*make());
            }
            #[test]
            fn observer_sees_every_transition() {
                common::conformance::observer_sees_every_transition(&*make());
            }
            #[test]
            fn private_pool_serves_only_its_routes() {
                common::pools::private_pool_serves_only_its_routes(&*make());
            }
            #[test]
            fn pool_use_counts_and_misuse() {
                common::pools::pool_use_counts_and_misuse(&*make());
            }
            #[test]
            fn frees_during_capture_wait_for_its_end() {
                common::pools::frees_during_capture_wait_for_its_end(&*make());
            }
            #[test]
            fn use_on_oom_pools_lend_free_blocks() {
                common::pools::use_on_oom_pools_lend_free_blocks(&*make());
            }
            #[test]
            fn restore_pool_puts_allocations_back() {
                common::pools::restore_pool_puts_allocations_back(&*make());
            }
            #[test]
            fn no_split_pools_keep_allocations_apart() {
                common::pools::no_split_pools_keep_allocations_apart(&*make());
            }
        }
    };
}
