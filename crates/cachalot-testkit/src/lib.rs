//! What the `cachalot` crate's integration tests and benches share, in one
//! place: the conformance suite every backend and policy must pass
//! ([`conformance`], [`pools`], [`conformance_suite!`]), the backend
//! contract every backend and adaptor stack keeps ([`backend`],
//! [`backend_suite!`]), test devices with
//! counting, fault and limit adaptors ([`device`]), seeded generators
//! ([`lcg`], [`splitmix`]), the bundled recordings ([`recordings`]), a small reader
//! and replayer of recorded traces ([`trace`]), and the `cachalot` command as the
//! command-line tests run it ([`cli`]).
//!
//! A crate of its own (a dev-dependency) rather than a module every test
//! binary compiles, so that no test needs to allow dead code.
//!
//! Add a backend or policy to the conformance suite with one line in
//! `tests/conformance.rs`:
//! `conformance_suite!(name, || -> Arc<dyn DeviceAllocator> { ... });`

pub mod backend;
pub mod cli;
pub mod conformance;
pub mod device;
pub mod lcg;
pub mod pools;
pub mod recordings;
pub mod splitmix;
pub mod trace;

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
                $crate::conformance::zero_size_is_null(&*make());
            }
            #[test]
            fn absurd_size_is_too_large() {
                $crate::conformance::absurd_size_is_too_large(&*make());
            }
            #[test]
            fn allocations_are_disjoint_and_returned() {
                $crate::conformance::allocations_are_disjoint_and_returned(&*make());
            }
            #[test]
            fn invalid_frees_change_nothing() {
                $crate::conformance::invalid_frees_change_nothing(&*make());
            }
            #[test]
            fn freed_memory_is_reused() {
                $crate::conformance::freed_memory_is_reused(&*make());
            }
            #[test]
            fn cross_stream_free_waits() {
                $crate::conformance::cross_stream_free_waits(&*make());
            }
            #[test]
            fn memory_fraction_limits_and_recovers() {
                $crate::conformance::memory_fraction_limits_and_recovers(&*make());
            }
            #[test]
            fn backing_covers_each_allocation() {
                $crate::conformance::backing_covers_each_allocation(&*make());
            }
            #[test]
            fn stat_resets() {
                $crate::conformance::stat_resets(&*make());
            }
            #[test]
            fn snapshot_matches_stats() {
                $crate::conformance::snapshot_matches_stats(&*make());
            }
            #[test]
            fn observer_sees_every_transition() {
                $crate::conformance::observer_sees_every_transition(&*make());
            }
            #[test]
            fn private_pool_serves_only_its_routes() {
                $crate::pools::private_pool_serves_only_its_routes(&*make());
            }
            #[test]
            fn pool_use_counts_and_misuse() {
                $crate::pools::pool_use_counts_and_misuse(&*make());
            }
            #[test]
            fn frees_during_capture_wait_for_its_end() {
                $crate::pools::frees_during_capture_wait_for_its_end(&*make());
            }
            #[test]
            fn use_on_oom_pools_lend_free_blocks() {
                $crate::pools::use_on_oom_pools_lend_free_blocks(&*make());
            }
            #[test]
            fn restore_pool_puts_allocations_back() {
                $crate::pools::restore_pool_puts_allocations_back(&*make());
            }
            #[test]
            fn own_allocator_pools_take_segments_from_it() {
                $crate::pools::own_allocator_pools_take_segments_from_it(&*make());
            }
            #[test]
            fn no_split_pools_keep_allocations_apart() {
                $crate::pools::no_split_pools_keep_allocations_apart(&*make());
            }
        }
    };
}
