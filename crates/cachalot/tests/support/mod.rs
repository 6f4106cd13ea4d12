//! Helpers shared by the integration tests.

pub mod device;
pub mod lcg;
pub mod recordings;
pub mod trace;
