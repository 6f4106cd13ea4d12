//! Allocation policies.

pub mod cachalot;
