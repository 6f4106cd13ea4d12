//! Helpers shared by the integration tests.

pub mod recordings;
pub mod trace;
